//go:build integration

package powercut_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cozy.dev/cozy/internal/testing/powercut"
)

// TestCutLosesWhatWasNotFlushed: the disk keeps what was fsynced and loses
// what was only written, so the tests built on it can fail.
func TestCutLosesWhatWasNotFlushed(t *testing.T) {
	d := powercut.New(t)
	synced := bytes.Repeat([]byte("synced "), 3000)
	written := bytes.Repeat([]byte("written "), 3000)

	f, err := os.Create(filepath.Join(d.Dir, "synced"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(synced); err != nil {
		t.Fatal(err)
	}
	flushes := d.Flushes()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if d.Flushes() == flushes {
		t.Fatalf("fsync reached the disk without a flush: the loop device does not pass flushes on")
	}
	if err := syncDir(d.Dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Dir, "written"), written, 0o644); err != nil {
		t.Fatal(err)
	}
	before := d.Cut(t)

	// The same, after the file system is synced as a whole.
	if err := syncFS(d.Dir); err != nil {
		t.Fatal(err)
	}
	after := d.Cut(t)

	before.Mount(t, func(dir string) {
		if got, err := os.ReadFile(filepath.Join(dir, "synced")); err != nil || !bytes.Equal(got, synced) {
			t.Errorf("the fsynced file did not survive the cut: %d bytes, %v", len(got), err)
		}
		if got, err := os.ReadFile(filepath.Join(dir, "written")); err == nil && bytes.Equal(got, written) {
			t.Errorf("a file written but never synced survived the cut whole: the disk keeps what a power loss would lose")
		}
	})
	after.Mount(t, func(dir string) {
		if got, err := os.ReadFile(filepath.Join(dir, "written")); err != nil || !bytes.Equal(got, written) {
			t.Errorf("after syncfs the file did not survive the cut: %d bytes, %v", len(got), err)
		}
	})
}

// TestMountIsNotHeldByOtherNamespaces: a mount namespace made while an
// image is mounted (a test's node, a container, `ip netns exec`) must not
// keep that image's file system alive after Mount unmounts it, or its
// journal stays unreplayed and e2fsck finds it damaged. The image is
// written to while another process makes a namespace of its own; Mount
// fails if the file system still needs recovery after the unmount.
func TestMountIsNotHeldByOtherNamespaces(t *testing.T) {
	d := powercut.New(t)
	if err := os.WriteFile(filepath.Join(d.Dir, "before"), []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syncFS(d.Dir); err != nil {
		t.Fatal(err)
	}
	img := d.Cut(t)
	var other *exec.Cmd
	img.Mount(t, func(dir string) {
		other = exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "60")
		if err := other.Start(); err != nil {
			t.Fatalf("unshare: %v", err)
		}
		t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
		// Until sleep runs in its namespace: the copy of the mounts is made.
		ours, _ := os.Readlink("/proc/self/ns/mnt")
		for {
			theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", other.Process.Pid))
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", other.Process.Pid))
			if err == nil && theirs != ours && string(comm) == "sleep\n" {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := os.WriteFile(filepath.Join(dir, "after"), bytes.Repeat([]byte("after "), 5000), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := syncFS(dir); err != nil {
			t.Fatal(err)
		}
	})
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func syncFS(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Syncfs(int(d.Fd()))
}
