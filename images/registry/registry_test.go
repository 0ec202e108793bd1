package registry

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sirupsen/logrus"

	"cozy.dev/cozy/internal/testing/syncbuf"
)

func TestMain(m *testing.M) {
	logrus.SetOutput(io.Discard) // distribution's request log
	os.Exit(m.Run())
}

// serve runs a registry on dir until the returned stop is called; stop
// returns what Serve returned.
func serve(t *testing.T, dir string, log *slog.Logger) (addr string, stop func() error) {
	t.Helper()
	s, err := Listen("127.0.0.1:0", dir, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(DrainTimeout + 5*time.Second):
			t.Fatal("Serve did not return after its context ended")
			return nil
		}
	}
	t.Cleanup(func() { _ = stop() })
	return s.Addr().String(), stop
}

// An image pushed is pulled back with its digest, and is still there
// after the registry restarts on the same directory; a stop is clean and
// logged.
func TestServeKeepsImagesAndStops(t *testing.T) {
	dir := t.TempDir()
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	addr, stop := serve(t, dir, log)

	img, err := random.Image(1024, 3)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	ref, err := name.ParseReference(addr+"/registry.k8s.io/pause:3.10.1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	for _, l := range []string{"registry serving", "storage=" + dir, "registry stopping", "registry stopped"} {
		if !strings.Contains(logs.String(), l) {
			t.Errorf("log lacks %q:\n%s", l, logs.String())
		}
	}
	if _, err := http.Get("http://" + addr + "/v2/"); err == nil {
		t.Error("the stopped registry still answers")
	}

	addr, _ = serve(t, dir, log)
	ref, _ = name.ParseReference(addr+"/registry.k8s.io/pause:3.10.1", name.Insecure)
	desc, err := remote.Get(ref)
	if err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if desc.Digest != want {
		t.Errorf("after a restart: digest %s, want %s", desc.Digest, want)
	}
	got, err := desc.Image()
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := got.Layers()
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatalf("layer: %v", err)
		}
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			t.Fatalf("layer: %v", err)
		}
	}
}

func TestListenErrors(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	if _, err := Listen("127.0.0.1:0", "", log); err == nil || !strings.Contains(err.Error(), "no storage directory") {
		t.Errorf("no dir: %v", err)
	}
	if _, err := Listen("127.0.0.1:notaport", dir, log); err == nil {
		t.Error("a bad address was accepted")
	}
	file := dir + "/file"
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("127.0.0.1:0", file+"/sub", log); err == nil || !strings.Contains(err.Error(), "registry storage") {
		t.Errorf("storage under a file: %v", err)
	}
}
