// Command ociimage packs a static binary into an OCI image archive (see
// internal/ociimage); `make image` runs it for cozy-operator.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

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
	im := ociimage.Image{Labels: labels{}}
	out := flag.String("o", "", "archive to write")
	flag.StringVar(&im.Binary, "binary", "", "static binary to pack")
	flag.StringVar(&im.Path, "path", "", "its path in the image, and the entrypoint")
	flag.StringVar(&im.User, "user", "65532:65532", "UID:GID the entrypoint runs as")
	flag.StringVar(&im.Arch, "arch", "amd64", "the binary's GOARCH")
	flag.StringVar(&im.Tag, "tag", "", "the image's tag")
	flag.Var(labels(im.Labels), "label", "KEY=VALUE label of the image (repeatable)")
	flag.Parse()
	if *out == "" || im.Binary == "" || flag.NArg() > 0 {
		flag.Usage()
		return fmt.Errorf("want -o FILE -binary FILE and no arguments")
	}
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
