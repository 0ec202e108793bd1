package cli

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"cozy.dev/cozy/images"
	"cozy.dev/cozy/internal/testing/cozyctl"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/syncbuf"
)

// registryProc is one run of `cozyctl registry serve` as its own process.
type registryProc struct {
	cmd    *exec.Cmd
	addr   string
	stderr *syncbuf.Buffer
	exited chan error
	done   bool
}

var servingAddr = regexp.MustCompile(`msg="registry serving" addr=(127\.0\.0\.1:\d+)`)

// serveRegistry starts `cozyctl registry serve` on a random loopback port
// storing under dir, and waits until it answers.
func serveRegistry(t *testing.T, dir string) *registryProc {
	t.Helper()
	p := &registryProc{stderr: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(cozyctl.Path(t), "registry", "serve", "--listen", "127.0.0.1:0", "--dir", dir)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() { p.stop(t) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := servingAddr.FindStringSubmatch(p.stderr.String()); m != nil {
			p.addr = m[1]
			if resp, err := http.Get("http://" + p.addr + "/v2/"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return p
				}
			}
		}
		select {
		case err := <-p.exited:
			t.Fatalf("registry serve exited: %v\n%s", err, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry serve not answering after 30s\n%s", p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and requires a clean exit that says so.
func (p *registryProc) stop(t *testing.T) {
	t.Helper()
	if p.done {
		return
	}
	p.done = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		if err != nil || !strings.Contains(p.stderr.String(), "registry stopped") {
			t.Errorf("registry serve did not stop cleanly on SIGTERM: %v\n%s", err, p.stderr)
		}
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		t.Errorf("registry serve ignored SIGTERM for 20s\n%s", p.stderr)
	}
}

// exampleRackFile writes `cozyctl rack init`'s rack into dir.
func exampleRackFile(t *testing.T, dir string) string {
	t.Helper()
	ex, _, code := run("rack", "init")
	if code != 0 {
		t.Fatal("rack init failed")
	}
	f := filepath.Join(dir, "rack.yaml")
	if err := os.WriteFile(f, []byte(ex), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestImagesList(t *testing.T) {
	rackFile := exampleRackFile(t, t.TempDir())
	out, stderr, code := run("images", "list", "--rack", rackFile, "-o", "json", "--module-proxy", "off")
	var list []images.Image
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) < 10 {
		t.Fatalf("images list -o json: exit %d, %s\n%s", code, out, stderr)
	}
	var refs []string
	for _, img := range list {
		refs = append(refs, img.Ref)
		if len(img.NeededBy) == 0 {
			t.Errorf("%s: needed by nobody", img.Ref)
		}
	}
	table, stderr, code := run("images", "list", "--module-proxy", "off")
	if code != 0 || table != strings.Join(refs, "\n")+"\n" {
		t.Errorf("images list (table, no --rack): exit %d, one reference per line expected:\n%s\nwant the references of -o json:\n%s", code, table, strings.Join(refs, "\n"))
	}
	for _, want := range []string{"no --rack: using the example rack", `source="tenant add-on cilium: chart cilium`} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

// --tenant-version adds each version's tenant control-plane images and
// names its worker image, which Cozy builds, in a warning; a version no
// TenantCluster accepts fails before anything is listed.
func TestImagesListTenantVersions(t *testing.T) {
	rackFile := exampleRackFile(t, t.TempDir())
	out, stderr, code := run("images", "list", "--rack", rackFile, "--module-proxy", "off", "--tenant-version", "v1.35.4,v1.36.3")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"registry.k8s.io/kube-apiserver:v1.35.4", "registry.k8s.io/kube-controller-manager:v1.35.4",
		"registry.k8s.io/kube-scheduler:v1.36.3"} {
		if !slices.Contains(strings.Split(out, "\n"), want) {
			t.Errorf("no %s in\n%s", want, out)
		}
	}
	if want := `source="tenant workers v1.36.3: cozy.dev/tenant-worker:v1.36.3 (Cozy's own: hack/worker-image.sh v1.36.3, then images mirror --from)"`; !strings.Contains(stderr, want) {
		t.Errorf("stderr lacks %s:\n%s", want, stderr)
	}
	out, stderr, code = run("images", "list", "--rack", rackFile, "--module-proxy", "off", "--tenant-version", "v1.30.2")
	if code == 0 || out != "" || !strings.Contains(stderr, `tenant version "v1.30.2" must be a supported Kubernetes release, v1.34.x to v1.37.x`) {
		t.Errorf("--tenant-version v1.30.2: exit %d, stdout %q, stderr:\n%s", code, out, stderr)
	}
}

// images mirror from an OCI layout into `cozyctl registry serve`: every
// image pulls back with its digest; a second run copies nothing; the
// registry keeps them across a restart; plain HTTP needs --insecure.
func TestImagesMirrorIntoRegistryServe(t *testing.T) {
	skopeo, err := exec.LookPath("skopeo")
	if err != nil {
		prereq.Missing(t, "skopeo is not installed: run hack/install-deps.sh (Debian package skopeo)")
	}
	dir := t.TempDir()
	rackFile := exampleRackFile(t, dir)
	out, _, code := run("images", "list", "--rack", rackFile, "-o", "json", "--module-proxy", "off")
	var list []images.Image
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("images list: exit %d, %s", code, out)
	}

	lay := filepath.Join(dir, "layout")
	digests := randomLayout(t, lay, list)

	store := filepath.Join(dir, "registry")
	reg := serveRegistry(t, store)
	mirror := func(extra ...string) ([]images.Result, string, int) {
		t.Helper()
		args := append([]string{"images", "mirror", "--rack", rackFile, "--from", lay, "--to", reg.addr, "-o", "json", "--module-proxy", "off"}, extra...)
		out, stderr, code := run(args...)
		var rs []images.Result
		if err := json.Unmarshal([]byte(out), &rs); err != nil && code == 0 {
			t.Fatalf("images mirror -o json: %v\n%s", err, out)
		}
		return rs, stderr, code
	}

	rs, stderr, code := mirror("--insecure")
	if code != 0 || len(rs) != len(list) {
		t.Fatalf("first mirror: exit %d, %d results for %d images\n%s", code, len(rs), len(list), stderr)
	}
	for _, r := range rs {
		if r.Status != images.StatusCopied || r.Target != reg.addr+"/"+r.Image {
			t.Errorf("first mirror: %+v", r)
		}
		ref, _ := name.ParseReference(r.Target, name.Insecure)
		desc, err := remote.Get(ref)
		if err != nil || desc.Digest != digests[r.Image] {
			t.Errorf("pull %s: %v, %v; want digest %s", r.Target, desc, err, digests[r.Image])
		}
		// An independent client reads the same bytes: skopeo's raw
		// manifest hashes to the digest.
		raw, err := exec.Command(skopeo, "inspect", "--raw", "--tls-verify=false", "docker://"+r.Target).Output()
		if got := fmt.Sprintf("sha256:%x", sha256.Sum256(raw)); err != nil || got != digests[r.Image].String() {
			t.Errorf("skopeo inspect --raw %s: %v, manifest digest %s, want %s", r.Target, err, got, digests[r.Image])
		}
		if !strings.Contains(stderr, `msg=copying image=`+r.Image) {
			t.Errorf("no progress line for %s on stderr", r.Image)
		}
	}
	if want := "copied=" + itoa(len(list)) + " alreadyThere=0 failed=0"; !strings.Contains(stderr, want) {
		t.Errorf("first mirror's summary lacks %q:\n%s", want, stderr)
	}

	rs, stderr, code = mirror("--insecure")
	for _, r := range rs {
		if r.Status != images.StatusPresent {
			t.Errorf("second mirror: %+v, want present", r)
		}
	}
	if want := "copied=0 alreadyThere=" + itoa(len(list)) + " failed=0"; code != 0 || !strings.Contains(stderr, want) {
		t.Errorf("second mirror: exit %d, summary lacks %q:\n%s", code, want, stderr)
	}

	reg.stop(t)
	reg = serveRegistry(t, store)
	rs, _, code = mirror("--insecure")
	if code != 0 || len(rs) != len(list) || rs[0].Status != images.StatusPresent {
		t.Errorf("after a restart on the same --dir: exit %d, %+v; want everything present", code, rs)
	}

	// Without --rack: every image of the layout, one that the rack does
	// not need too, in a table of what went where.
	const extra = "docker.io/library/extra:1"
	if p, err := layout.FromPath(lay); err != nil {
		t.Fatal(err)
	} else if im, err := random.Image(256, 1); err != nil {
		t.Fatal(err)
	} else if err := p.AppendImage(im, layout.WithAnnotations(map[string]string{images.AnnotationRefName: extra})); err != nil {
		t.Fatal(err)
	}
	table, stderr, code := run("images", "mirror", "--from", lay, "--to", reg.addr, "--insecure")
	rows := map[string]string{}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) == 3 && f[1] == reg.addr+"/"+f[0] {
			rows[f[0]] = f[2]
		}
	}
	wantRows := map[string]string{extra: images.StatusCopied}
	for _, img := range list {
		wantRows[img.Ref] = images.StatusPresent
	}
	if code != 0 || strings.Join(strings.Fields(lines[0]), " ") != "IMAGE OR CHART IN THE REGISTRY STATUS" || len(lines) != len(wantRows)+1 || !maps.Equal(rows, wantRows) {
		t.Errorf("images mirror without --rack: exit %d, table:\n%s\nwant a header and a row for each of %v\n%s", code, table, wantRows, stderr)
	}

	// From an OCI archive (the layout in a tar file, as `make image`
	// writes cozy-operator's) into an empty registry: every image, with
	// its digest.
	var tarred bytes.Buffer
	tw := tar.NewWriter(&tarred)
	if err := tw.AddFS(os.DirFS(lay)); err != nil || tw.Close() != nil {
		t.Fatalf("tar the layout: %v", err)
	}
	archive := filepath.Join(dir, "images.tar")
	if err := os.WriteFile(archive, tarred.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := serveRegistry(t, filepath.Join(dir, "registry2"))
	out, stderr, code = run("images", "mirror", "--from", archive, "--to", fresh.addr, "--insecure", "-o", "json")
	var fromArchive []images.Result
	if err := json.Unmarshal([]byte(out), &fromArchive); err != nil || code != 0 || len(fromArchive) != len(list)+1 {
		t.Fatalf("images mirror --from ARCHIVE: exit %d, %v, %d results for %d images\n%s", code, err, len(fromArchive), len(list)+1, stderr)
	}
	for _, r := range fromArchive {
		ref, _ := name.ParseReference(r.Target, name.Insecure)
		desc, err := remote.Head(ref)
		if r.Status != images.StatusCopied || err != nil || (digests[r.Image] != v1.Hash{} && desc.Digest != digests[r.Image]) {
			t.Errorf("from the archive: %+v, in the registry %v %v", r, desc, err)
		}
	}
	if !strings.Contains(stderr, `from="OCI archive `+archive+`"`) {
		t.Errorf("the log does not name the archive:\n%s", stderr)
	}

	_, stderr, code = mirror()
	if code != 1 || !strings.Contains(stderr, "plain HTTP to "+reg.addr+" refused") {
		t.Errorf("without --insecure: exit %d\n%s", code, stderr)
	}
}

// randomLayout writes an OCI layout at dir holding a random image under
// each listed reference, as hack/lab-images.sh writes one (the pause
// image as a two-platform index), and returns each one's digest.
func randomLayout(t *testing.T, dir string, list []images.Image) map[string]v1.Hash {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	digests := map[string]v1.Hash{}
	for _, img := range list {
		ann := layout.WithAnnotations(map[string]string{images.AnnotationRefName: img.Ref, images.AnnotationContainerdName: img.Ref})
		var err error
		if strings.HasPrefix(img.Ref, "registry.k8s.io/pause:") {
			var idx v1.ImageIndex
			if idx, err = random.Index(256, 1, 2); err == nil {
				digests[img.Ref], _ = idx.Digest()
				err = p.AppendIndex(idx, ann)
			}
		} else {
			var im v1.Image
			if im, err = random.Image(256, 1); err == nil {
				digests[img.Ref], _ = im.Digest()
				err = p.AppendImage(im, ann)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return digests
}

func TestImagesMirrorFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"images", "mirror", "--to", "127.0.0.1:1"}, "give one source"},
		{[]string{"images", "mirror", "--to", "127.0.0.1:1", "--from", "x", "--from-upstream"}, "give one source"},
		{[]string{"images", "mirror", "--to", "http://127.0.0.1:1", "--from-upstream"}, "HOST[:PORT]"},
		{[]string{"images", "mirror", "--to", "127.0.0.1:1", "--from", "/nonexistent"}, "OCI layout or archive /nonexistent: "},
		{[]string{"images", "mirror", "--from-upstream"}, `required flag(s) "to" not set`},
		{[]string{"registry", "serve", "--dir", "x"}, `required flag(s) "listen" not set`},
	}
	for _, tt := range tests {
		_, stderr, code := run(tt.args...)
		if code != 1 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", tt.args, code, stderr, tt.want)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
