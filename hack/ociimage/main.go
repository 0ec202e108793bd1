// Command ociimage packs a static binary into an OCI image archive (see
// internal/ociimage); `make image` runs it for cozy-operator.
package main

import (
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"cozy.dev/cozy/internal/ociimage"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

type labels map[string]string

func (l labels) String() string { return fmt.Sprint(map[string]string(l)) }

func (l labels) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("label %q: want KEY=VALUE", s)
	}
	l[k] = v
	return nil
}

func run() error {
	im := ociimage.Image{Config: ocispec.ImageConfig{Labels: labels{}}}
	out := flag.String("o", "", "archive to write")
	binary := flag.String("binary", "", "static binary to pack")
	binPath := flag.String("path", "", "its path in the image, and the entrypoint")
	flag.StringVar(&im.Config.User, "user", "65532:65532", "UID:GID the entrypoint runs as")
	flag.StringVar(&im.Arch, "arch", "amd64", "the binary's GOARCH")
	flag.StringVar(&im.Ref, "tag", "", "the image's tag (or full reference) in the archive")
	flag.Var(labels(im.Config.Labels), "label", "KEY=VALUE label of the image (repeatable)")
	flag.Parse()
	if *out == "" || *binary == "" || *binPath == "" || flag.NArg() > 0 {
		flag.Usage()
		return fmt.Errorf("want -o FILE -binary FILE -path PATH and no arguments")
	}
	if err := checkStatic(*binary); err != nil {
		return err
	}
	im.Config.Entrypoint = []string{*binPath}
	im.Layers = []ociimage.Layer{{
		Files:     []ociimage.File{{Path: *binPath, Mode: 0o755, Source: *binary}},
		CreatedBy: "hack/ociimage: " + *binPath,
	}}
	// Reproducible builds: the date comes from SOURCE_DATE_EPOCH (the
	// Makefile passes the commit's date), not the clock.
	im.Created = time.Unix(0, 0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		im.Created = time.Unix(sec, 0)
	}
	f, err := os.CreateTemp(filepath.Dir(*out), ".ociimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := ociimage.Write(f, im); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), *out)
}

// checkStatic makes sure the binary is an ELF executable that needs no
// loader: the image holds nothing else.
func checkStatic(file string) error {
	f, err := elf.Open(file)
	if err != nil {
		return fmt.Errorf("%s: want a static ELF binary: %w", file, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: build it static (CGO_ENABLED=0)", file)
		}
	}
	return nil
}
