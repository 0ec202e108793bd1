// Package cloudinit reads the NoCloud seed KubeVirt gives a VM (meta-data
// and user-data, as the Cluster API kubeadm bootstrap provider renders
// them for a Machine) and turns it into what Cozy's worker image does on
// first boot: the files to write and the commands to run, in cloud-init's
// order (bootcmd, write_files, runcmd).
//
// Only the part of cloud-config that the kubeadm bootstrap provider
// writes for a node is understood. Keys that would leave the node other
// than asked if skipped (disks, file systems, mounts) are refused;
// keys that do not change how the node joins (ntp, users) are reported
// as ignored. User-data that starts with "## template: jinja" may use
// the variables cloud-init's jinja templates give ({{ ds.meta_data.KEY }},
// {{ v1.local_hostname }}, {{ v1.instance_id }}); any other jinja is
// refused rather than written out unrendered.
package cloudinit

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// MetaData is the seed's meta-data file.
type MetaData struct {
	// InstanceID names this instance; KubeVirt sets it from the VMI.
	InstanceID string
	// LocalHostname is the machine's host name (the Machine's name under
	// Cluster API).
	LocalHostname string
	// All holds every key, for {{ ds.meta_data.KEY }}.
	All map[string]string
}

// ParseMetaData reads a meta-data file: YAML (or JSON) with string values.
func ParseMetaData(data []byte) (MetaData, error) {
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return MetaData{}, fmt.Errorf("meta-data: %w", err)
	}
	md := MetaData{All: map[string]string{}}
	for k, v := range raw {
		switch v := v.(type) {
		case string:
			md.All[k] = v
		case float64, bool:
			md.All[k] = fmt.Sprint(v)
		case nil:
		default:
			// Nested values (public-keys, network-interfaces) are not
			// jinja variables a node's config uses.
			continue
		}
	}
	md.InstanceID = first(md.All, "instance-id", "instance_id")
	md.LocalHostname = first(md.All, "local-hostname", "local_hostname", "hostname")
	if md.InstanceID == "" {
		return MetaData{}, errors.New("meta-data: no instance-id")
	}
	if err := checkHostname(md.LocalHostname); err != nil {
		return MetaData{}, fmt.Errorf("meta-data: %w", err)
	}
	return md, nil
}

func first(m map[string]string, keys ...string) string {
	for _, k := range keys {
		if v := m[k]; v != "" {
			return v
		}
	}
	return ""
}

var hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

// checkHostname accepts an empty name (the image keeps its own) or a DNS
// name: the kubelet registers the Node under it.
func checkHostname(h string) error {
	if h == "" || (len(h) <= 253 && hostnameRE.MatchString(h)) {
		return nil
	}
	return fmt.Errorf("local-hostname %q is not a lower-case DNS name", h)
}

// Config is what a user-data's cloud-config asks of the node.
type Config struct {
	// BootCmd and RunCmd are shell command lines, run in order with
	// /bin/sh -c: bootcmd before the files are written, runcmd after.
	BootCmd []string
	RunCmd  []string
	// Files are write_files' entries, decoded.
	Files []File
	// Ignored names keys that were read and deliberately not applied.
	Ignored []string
}

// File is one write_files entry.
type File struct {
	Path    string
	Content []byte
	Mode    fs.FileMode
	// UID and GID are the owner's; the worker image knows root only, so
	// an owner other than root (or 0) is refused.
	UID, GID int
	Append   bool
}

// refused are cloud-config keys the worker image cannot apply, and
// skipping them would leave the node other than asked.
var refused = map[string]string{
	"disk_setup": "partitioning disks",
	"fs_setup":   "making file systems",
	"mounts":     "mounting file systems",
	"packages":   "installing packages",
}

// ignored are keys that change nothing in how the node joins: the image
// has no SSH server, and its clock is the VM's.
var ignored = []string{"ntp", "users", "ssh_authorized_keys", "package_update", "package_upgrade", "final_message", "output"}

// jinjaHeader starts user-data that cloud-init renders with jinja.
const jinjaHeader = "## template: jinja"

// Parse reads user-data for the machine md describes: an optional jinja
// header, then "#cloud-config" and its YAML.
func Parse(userData []byte, md MetaData) (*Config, error) {
	text := string(userData)
	if rest, ok := strings.CutPrefix(text, jinjaHeader); ok {
		rest = strings.TrimLeft(rest, " \t")
		rest, ok = strings.CutPrefix(rest, "\n")
		if !ok {
			return nil, errors.New("user-data: the jinja header must be a line of its own")
		}
		rendered, err := renderJinja(rest, md)
		if err != nil {
			return nil, fmt.Errorf("user-data: %w", err)
		}
		text = rendered
	}
	if !strings.HasPrefix(text, "#cloud-config") {
		line, _, _ := strings.Cut(text, "\n")
		return nil, fmt.Errorf("user-data: not a cloud-config (first line %.40q; scripts and MIME multipart are not supported)", line)
	}
	var raw map[string]any
	if err := yaml.Unmarshal([]byte(text), &raw); err != nil {
		return nil, fmt.Errorf("user-data: %w", err)
	}
	c := &Config{}
	var errs []error
	for key, v := range raw {
		var err error
		switch {
		case key == "write_files":
			c.Files, err = parseFiles(v)
		case key == "runcmd":
			c.RunCmd, err = parseCommands(v)
		case key == "bootcmd":
			c.BootCmd, err = parseCommands(v)
		case refused[key] != "":
			err = fmt.Errorf("the worker image does not support %s (%s)", refused[key], key)
		case slices.Contains(ignored, key):
			c.Ignored = append(c.Ignored, key)
		default:
			err = errors.New("unknown key")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("user-data: %w", err)
	}
	return c, nil
}

// jinjaRE finds jinja's expressions, statements and comments.
var jinjaRE = regexp.MustCompile(`\{\{-?\s*(.*?)\s*-?\}\}|\{%.*?%\}|\{#.*?#\}`)

// renderJinja replaces the variables cloud-init's templates offer and
// refuses any other jinja.
func renderJinja(text string, md MetaData) (string, error) {
	var errs []error
	out := jinjaRE.ReplaceAllStringFunc(text, func(m string) string {
		sub := jinjaRE.FindStringSubmatch(m)
		if !strings.HasPrefix(m, "{{") {
			errs = append(errs, fmt.Errorf("jinja %q: only variables are supported", m))
			return m
		}
		v, err := jinjaVar(sub[1], md)
		if err != nil {
			errs = append(errs, err)
			return m
		}
		return v
	})
	return out, errors.Join(errs...)
}

func jinjaVar(name string, md MetaData) (string, error) {
	switch name {
	case "v1.local_hostname", "ds.meta_data.local_hostname", "ds.meta_data['local-hostname']":
		return md.LocalHostname, nil
	case "v1.instance_id", "ds.meta_data.instance_id", "ds.meta_data['instance-id']":
		return md.InstanceID, nil
	}
	if key, ok := strings.CutPrefix(name, "ds.meta_data."); ok {
		if v, ok := md.All[key]; ok {
			return v, nil
		}
		return "", fmt.Errorf("jinja {{ %s }}: meta-data has no %q", name, key)
	}
	return "", fmt.Errorf("jinja {{ %s }}: not a variable the worker image knows (v1.local_hostname, v1.instance_id, ds.meta_data.KEY)", name)
}

func parseCommands(v any) ([]string, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("a list of commands, not %T", v)
	}
	var cmds []string
	for i, c := range list {
		switch c := c.(type) {
		case string:
			cmds = append(cmds, c)
		case []any:
			// A list is argv: cloud-init runs it without a shell;
			// quoting each word gives /bin/sh -c the same argv.
			words := make([]string, len(c))
			for j, w := range c {
				s, ok := w.(string)
				if !ok {
					return nil, fmt.Errorf("command %d: word %d is %T, not a string", i, j, w)
				}
				words[j] = shellQuote(s)
			}
			if len(words) == 0 {
				return nil, fmt.Errorf("command %d is empty", i)
			}
			cmds = append(cmds, strings.Join(words, " "))
		default:
			return nil, fmt.Errorf("command %d is %T, not a string or a list", i, c)
		}
	}
	return cmds, nil
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func parseFiles(v any) ([]File, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("a list of files, not %T", v)
	}
	var files []File
	for i, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("entry %d is %T, not a map", i, e)
		}
		f, err := parseFile(m)
		if err != nil {
			return nil, fmt.Errorf("entry %d (%v): %w", i, m["path"], err)
		}
		files = append(files, f)
	}
	return files, nil
}

func parseFile(m map[string]any) (File, error) {
	str := func(k string) (string, error) {
		switch v := m[k].(type) {
		case nil:
			return "", nil
		case string:
			return v, nil
		case float64:
			return strconv.FormatFloat(v, 'f', -1, 64), nil
		default:
			return "", fmt.Errorf("%s is %T, not a string", k, v)
		}
	}
	f := File{Mode: 0o644}
	var errs []error
	for k := range m {
		switch k {
		case "path", "content", "encoding", "owner", "permissions", "append", "defer":
		default:
			errs = append(errs, fmt.Errorf("unknown key %q", k))
		}
	}
	p, err := str("path")
	errs = append(errs, err)
	if p == "" || !path.IsAbs(p) || path.Clean(p) != p {
		errs = append(errs, fmt.Errorf("path %q is not absolute and clean", p))
	}
	f.Path = p
	content, err := str("content")
	errs = append(errs, err)
	encoding, err := str("encoding")
	errs = append(errs, err)
	f.Content, err = decode(content, encoding)
	errs = append(errs, err)
	if perm, err := str("permissions"); err != nil {
		errs = append(errs, err)
	} else if perm != "" {
		n, err := strconv.ParseUint(strings.TrimPrefix(perm, "0o"), 8, 32)
		if err != nil || n > 0o7777 {
			errs = append(errs, fmt.Errorf("permissions %q are not octal", perm))
		}
		f.Mode = fs.FileMode(n & 0o777)
		if n&0o4000 != 0 {
			f.Mode |= fs.ModeSetuid
		}
		if n&0o2000 != 0 {
			f.Mode |= fs.ModeSetgid
		}
		if n&0o1000 != 0 {
			f.Mode |= fs.ModeSticky
		}
	}
	if owner, err := str("owner"); err != nil {
		errs = append(errs, err)
	} else if owner != "" && owner != "root" && owner != "root:root" && owner != "0:0" && owner != "0" {
		errs = append(errs, fmt.Errorf("owner %q: the worker image has root only", owner))
	}
	for _, k := range []string{"append", "defer"} {
		switch v := m[k].(type) {
		case nil:
		case bool:
			if k == "append" {
				f.Append = v
			}
		default:
			errs = append(errs, fmt.Errorf("%s is %T, not true or false", k, v))
		}
	}
	return f, errors.Join(errs...)
}

// decode undoes write_files' encodings.
func decode(content, encoding string) ([]byte, error) {
	switch strings.ToLower(encoding) {
	case "", "text/plain":
		return []byte(content), nil
	case "b64", "base64":
		return base64.StdEncoding.DecodeString(strings.TrimSpace(content))
	case "gz", "gzip":
		return gunzip([]byte(content))
	case "gz+b64", "gzip+base64", "gz+base64", "gzip+b64":
		data, err := base64.StdEncoding.DecodeString(strings.TrimSpace(content))
		if err != nil {
			return nil, err
		}
		return gunzip(data)
	}
	return nil, fmt.Errorf("encoding %q is not one of b64, gz, gz+b64", encoding)
}

func gunzip(data []byte) ([]byte, error) {
	r, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	// A bootstrap file is small: 16 MiB bounds a gzip bomb.
	out, err := io.ReadAll(io.LimitReader(r, 16<<20+1))
	if err != nil {
		return nil, err
	}
	if len(out) > 16<<20 {
		return nil, errors.New("content larger than 16 MiB")
	}
	return out, nil
}

// configDrive is where an OpenStack config drive keeps the newest
// metadata: KubeVirt writes meta_data.json and user_data there.
const configDrive = "openstack/latest"

// ReadSeed reads the cloud-init disk KubeVirt attaches, mounted at dir:
// a NoCloud seed (meta-data and user-data; volume label cidata) or a
// config drive (openstack/latest/meta_data.json and user_data; label
// config-2), which is what CAPK gives its VMs. From a config drive, as
// cloud-init reads one, the host name is meta_data.json's hostname and
// the instance ID its uuid. A seed without user-data asks for nothing.
func ReadSeed(dir string) (MetaData, *Config, error) {
	kind, mdFile, udFile := "NoCloud seed", "meta-data", "user-data"
	if _, err := os.Stat(filepath.Join(dir, configDrive)); err == nil {
		kind, mdFile, udFile = "config drive", configDrive+"/meta_data.json", configDrive+"/user_data"
	}
	mdData, err := os.ReadFile(filepath.Join(dir, mdFile))
	if err != nil {
		return MetaData{}, nil, fmt.Errorf("%s: %w", kind, err)
	}
	md, err := ParseMetaData(mdData)
	if err != nil {
		return MetaData{}, nil, fmt.Errorf("%s: %w", kind, err)
	}
	if uuid := md.All["uuid"]; kind == "config drive" && uuid != "" && md.All["instance-id"] == "" {
		md.InstanceID = uuid
	}
	ud, err := os.ReadFile(filepath.Join(dir, udFile))
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(bytes.TrimSpace(ud)) == 0) {
		return md, &Config{}, nil
	}
	if err != nil {
		return MetaData{}, nil, fmt.Errorf("%s: %w", kind, err)
	}
	c, err := Parse(ud, md)
	if err != nil {
		return MetaData{}, nil, fmt.Errorf("%s: %w", kind, err)
	}
	return md, c, nil
}

// Write writes f under root ("/" on the node), creating its parent
// directories (0755) as cloud-init does. A new file is written beside
// its path and renamed into place, so a crash leaves the old file or the
// new one; append adds to what is there.
func Write(root string, f File) error {
	p := filepath.Join(root, filepath.FromSlash(f.Path))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if f.Append {
		fh, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, f.Mode.Perm())
		if err != nil {
			return err
		}
		_, err = fh.Write(f.Content)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(f.Content); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(f.Mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}
