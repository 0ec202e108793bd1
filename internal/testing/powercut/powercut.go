// Package powercut gives tests a file system whose power can be cut: ext4
// on a loop device whose disk keeps every write in a volatile cache until
// the kernel flushes it, as a disk with a write cache does. Cut returns the
// disk as a power loss at that moment would leave it: everything flushed,
// plus an arbitrary subset of what was written but not flushed.
//
// kill -9 cannot show that a program's data is durable: the kernel's page
// cache outlives the process. Losing power loses all the kernel had not
// flushed, and only that shows whether the fsyncs are in the right places.
//
// The disk is one file served over FUSE by the test process (go-fuse). The
// loop driver turns ext4's writes into FUSE writes and its flushes into
// FUSE fsyncs; FUSE here runs without a writeback cache, so a write reaches
// this package before the loop device completes it. The kernel the tests
// run on has no device mapper, so dm-log-writes and dm-flakey are not an
// option; a QEMU VM per test would be slower by far without KVM.
package powercut

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"cozy.dev/cozy/internal/testing/prereq"
)

// blockSize is the unit in which unflushed writes survive or are lost:
// ext4's block size here, so a block is never half written.
const blockSize = 4096

// Size is the disk's size: a small ext4 with room for a lease journal of
// 150 000 leases and its compacted copy beside it.
const Size = 64 << 20

// Disk is an ext4 file system mounted at Dir whose power can be cut.
type Disk struct {
	// Dir is where the file system is mounted.
	Dir     string
	dev     *device
	rng     *rand.Rand // which unflushed blocks a cut keeps
	testRng *rand.Rand // Rand, for the test
	base    string
	mu      sync.Mutex
	n       int
}

// Rand is a source of randomness for the test (when to cut, say), from
// the seed New logged.
func (d *Disk) Rand() *rand.Rand { return d.testRng }

// Cut is one power cut in CutWhile: the disk it left, and how far the
// writes had got.
type Cut struct {
	Image
	// Done is the last write that had returned before the cut: it must
	// be on the image. Started is the last one begun by the end of the
	// cut: none later can be.
	Done, Started int64
}

// CutWhile calls write(1), write(2), … over and over until it has cut
// the power n times at random moments 5 to 50 ms apart; a write that
// fails fails the test.
func (d *Disk) CutWhile(t testing.TB, n int, write func(i int64) error) []Cut {
	t.Helper()
	var started, done atomic.Int64
	stop := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		for i := int64(1); ; i++ {
			select {
			case <-stop:
				errs <- nil
				return
			default:
			}
			started.Store(i)
			if err := write(i); err != nil {
				errs <- err
				return
			}
			done.Store(i)
		}
	}()
	var cuts []Cut
	for range n {
		time.Sleep(time.Duration(5+d.testRng.IntN(45)) * time.Millisecond)
		c := Cut{Done: done.Load()} // read first: durable before the cut starts
		c.Image = d.Cut(t)
		c.Started = started.Load()
		cuts = append(cuts, c)
	}
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	return cuts
}

// Image is the disk as found after one power cut.
type Image struct {
	// Path is a file holding the image.
	Path string
	// Unflushed is how many blocks had been written but not flushed at
	// the cut; Kept is how many of them the image keeps anyway.
	Unflushed, Kept int
}

// prefix starts the name of every directory this package makes under the
// system's temporary directory; the PID after it tells whose it is.
const prefix = "cozy-powercut-"

var sweep sync.Once

// New makes a disk, puts a fresh ext4 on it and mounts it; all of it is
// taken down when the test ends. Which unflushed blocks survive a cut,
// and Rand, follow a seed the test logs.
func New(t testing.TB) *Disk {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	t.Logf("power-cut disk, seed %d", seed)
	if os.Geteuid() != 0 {
		prereq.Missing(t, "a power-cut disk needs root (FUSE, loop devices, mount)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		prereq.Missing(t, "a power-cut disk needs /dev/fuse: %v", err)
	}
	for _, tool := range []string{"losetup", "mkfs.ext4", "e2fsck", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			prereq.Missing(t, "%s is not installed (Debian util-linux, e2fsprogs, mount)", tool)
		}
	}
	sweep.Do(sweepOrphans)

	base, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", prefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	d := &Disk{Dir: filepath.Join(base, "mnt"), dev: newDevice(Size), rng: rand.New(rand.NewPCG(seed, seed)), base: base,
		testRng: rand.New(rand.NewPCG(seed, 1))}
	devDir := filepath.Join(base, "dev")
	for _, dir := range []string{devDir, d.Dir, filepath.Join(base, "cuts")} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.RemoveAll(base) })

	server, err := mountDevice(devDir, d.dev)
	if err != nil {
		t.Fatalf("mount the FUSE disk: %v", err)
	}
	t.Cleanup(func() {
		if err := server.Unmount(); err != nil {
			_ = unix.Unmount(devDir, unix.MNT_DETACH)
		}
	})

	loop := strings.TrimSpace(run(t, "losetup", "--find", "--show", filepath.Join(devDir, "disk")))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })
	// Everything initialised now, not by ext4 in the background later.
	run(t, "mkfs.ext4", "-q", "-F", "-b", strconv.Itoa(blockSize), "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", loop)
	run(t, "mount", "-t", "ext4", loop, d.Dir)
	t.Cleanup(func() { unmount(t, d.Dir) })
	return d
}

// Cut returns the disk as a power loss now would leave it, and leaves the
// running disk alone: the test goes on and may cut again.
func (d *Disk) Cut(t testing.TB) Image {
	t.Helper()
	d.mu.Lock()
	data, unflushed, kept := d.dev.cut(d.rng)
	d.n++
	path := filepath.Join(d.base, "cuts", fmt.Sprintf("%03d.img", d.n))
	d.mu.Unlock()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return Image{Path: path, Unflushed: unflushed, Kept: kept}
}

// Flushes is how many flushes the disk has had.
func (d *Disk) Flushes() int {
	d.dev.mu.Lock()
	defer d.dev.mu.Unlock()
	return d.dev.flushes
}

// Mount mounts the image as the machine would after power came back (ext4
// replays its journal), runs check on it, unmounts it, and then has e2fsck
// confirm the file system itself came through whole.
//
// The mount lives in a mount namespace of its own (privateMount): in the
// host's, any process that made a mount namespace meanwhile (a test's
// node, a container) would hold a copy of it, keeping the file system
// alive after the unmount, so e2fsck would find its journal unreplayed
// and call it damaged.
func (img Image) Mount(t testing.TB, check func(dir string)) {
	t.Helper()
	dir := strings.TrimSuffix(img.Path, ".img")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// losetup, not mount -o loop: libmount's -o loop looks at every loop
	// device, and one backed by a dead FUSE disk would hang it.
	loop := strings.TrimSpace(run(t, "losetup", "--find", "--show", img.Path))
	func() {
		defer func() { _ = exec.Command("losetup", "-d", loop).Run() }()
		root, unmount, err := privateMount(loop, dir)
		if err != nil {
			t.Fatalf("mount %s: %v", filepath.Base(img.Path), err)
		}
		defer func() {
			if err := unmount(); err != nil {
				t.Errorf("unmount %s: %v", filepath.Base(img.Path), err)
			}
		}()
		check(root)
	}()
	out, err := exec.Command("e2fsck", "-fn", img.Path).CombinedOutput()
	switch {
	case bytes.Contains(out, []byte("skipping journal recovery")):
		// Unmounted, but not shut down: e2fsck -n would judge a file
		// system whose journal is still to be replayed.
		t.Errorf("%s: the file system still needed recovery after its unmount: something held it\n%s", filepath.Base(img.Path), out)
	case err != nil:
		t.Errorf("%s: the file system is damaged after the cut: %v\n%s", filepath.Base(img.Path), err, out)
	}
}

// privateMount mounts the ext4 on dev at dir in a new mount namespace
// that only one locked OS thread of this process is in, and returns the
// path through which every thread sees that mount
// (/proc/PID/task/TID/root/DIR) and a function that unmounts it and ends
// the namespace. Nothing outside the namespace can copy the mount, so
// once unmounted the file system is shut down cleanly.
func privateMount(dev, dir string) (root string, unmount func() error, err error) {
	type mounted struct {
		tid int
		err error
	}
	ready := make(chan mounted)
	done := make(chan struct{})
	result := make(chan error)
	go func() {
		// Never unlocked: the thread ends with the goroutine, and the
		// namespace with it.
		runtime.LockOSThread()
		err := unix.Unshare(unix.CLONE_NEWNS)
		if err == nil {
			// Nothing mounted here may propagate back to the host.
			err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
		}
		if err == nil {
			err = unix.Mount(dev, dir, "ext4", 0, "")
		}
		ready <- mounted{unix.Gettid(), err}
		if err != nil {
			return
		}
		<-done
		result <- unmountBusy(dir)
	}()
	m := <-ready
	if m.err != nil {
		return "", nil, m.err
	}
	return fmt.Sprintf("/proc/%d/task/%d/root%s", os.Getpid(), m.tid, dir), func() error {
		close(done)
		return <-result
	}, nil
}

var errStillBusy = errors.New("still busy after 5 s")

// unmountBusy unmounts dir, waiting out a moment's EBUSY (a process of
// the test still closing files).
func unmountBusy(dir string) error {
	for range 50 {
		err := unix.Unmount(dir, 0)
		if err != unix.EBUSY {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errStillBusy
}

// mountDevice serves dev as the file "disk" in dir over FUSE. go-fuse
// opens /dev/fuse without O_CLOEXEC; every program the test runs would
// inherit it and keep the connection alive after the test process dies,
// hanging whatever touches the disk's loop device then. So the
// descriptor is made close-on-exec while no fork can happen.
func mountDevice(dir string, dev *device) (*fuse.Server, error) {
	syscall.ForkLock.Lock()
	defer syscall.ForkLock.Unlock()
	before := fuseFDs()
	root := &fs.Inode{}
	server, err := fs.Mount(dir, root, &fs.Options{
		MountOptions: fuse.MountOptions{DirectMountStrict: true, FsName: "cozy-powercut", Name: "cozy-powercut"},
		OnAdd: func(ctx context.Context) {
			root.AddChild("disk", root.NewPersistentInode(ctx, dev, fs.StableAttr{Mode: syscall.S_IFREG}), false)
		},
	})
	if err != nil {
		return nil, err
	}
	for fd := range fuseFDs() {
		if !before[fd] {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
				_ = server.Unmount()
				return nil, err
			}
		}
	}
	return server, nil
}

// fuseFDs is the set of this process's descriptors open on /dev/fuse.
func fuseFDs() map[int]bool {
	fds := map[int]bool{}
	entries, _ := os.ReadDir("/proc/self/fd")
	for _, e := range entries {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == "/dev/fuse" {
			fd, _ := strconv.Atoi(e.Name())
			fds[fd] = true
		}
	}
	return fds
}

// device is the disk: durable is what survives a power cut, pending the
// blocks written since the last flush.
type device struct {
	fs.Inode
	mu      sync.Mutex
	durable []byte
	pending map[int64][]byte
	flushes int
}

var (
	_ fs.NodeOpener    = (*device)(nil)
	_ fs.NodeGetattrer = (*device)(nil)
	_ fs.NodeReader    = (*device)(nil)
	_ fs.NodeWriter    = (*device)(nil)
	_ fs.NodeFsyncer   = (*device)(nil)
)

func newDevice(size int) *device {
	return &device{durable: make([]byte, size), pending: map[int64][]byte{}}
}

func (v *device) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, 0, 0
}

func (v *device) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o600
	out.Size = uint64(len(v.durable))
	return 0
}

func (v *device) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	v.mu.Lock()
	defer v.mu.Unlock()
	end := min(off+int64(len(dest)), int64(len(v.durable)))
	for pos := off; pos < end; {
		b, in := pos/blockSize, pos%blockSize
		n := min(blockSize-in, end-pos)
		copy(dest[pos-off:pos-off+n], v.block(b)[in:in+n])
		pos += n
	}
	return fuse.ReadResultData(dest[:max(end-off, 0)]), 0
}

func (v *device) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	v.mu.Lock()
	defer v.mu.Unlock()
	end := off + int64(len(data))
	if off < 0 || end > int64(len(v.durable)) {
		return 0, syscall.ENOSPC
	}
	for pos := off; pos < end; {
		b, in := pos/blockSize, pos%blockSize
		n := min(blockSize-in, end-pos)
		blk, ok := v.pending[b]
		if !ok {
			blk = bytes.Clone(v.block(b))
			v.pending[b] = blk
		}
		copy(blk[in:in+n], data[pos-off:pos-off+n])
		pos += n
	}
	return uint32(len(data)), 0
}

// Fsync is the loop device passing on a flush: what was written is now
// durable.
func (v *device) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	v.mu.Lock()
	defer v.mu.Unlock()
	for b, blk := range v.pending {
		copy(v.durable[b*blockSize:], blk)
	}
	clear(v.pending)
	v.flushes++
	return 0
}

// block is block b as the disk would read it now.
func (v *device) block(b int64) []byte {
	if blk, ok := v.pending[b]; ok {
		return blk
	}
	return v.durable[b*blockSize : (b+1)*blockSize]
}

// cut copies what survives a power loss: the durable blocks, and each
// unflushed block with even odds, in whatever order the disk wrote them.
func (v *device) cut(rng *rand.Rand) (data []byte, unflushed, kept int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	data = bytes.Clone(v.durable)
	blocks := make([]int64, 0, len(v.pending))
	for b := range v.pending {
		blocks = append(blocks, b)
	}
	slices.Sort(blocks) // so that a seed repeats the same choice
	for _, b := range blocks {
		if rng.IntN(2) == 0 {
			copy(data[b*blockSize:], v.pending[b])
			kept++
		}
	}
	return data, len(blocks), kept
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// unmount unmounts dir, waiting out a moment's EBUSY (a process of the
// test still closing files) before detaching it lazily.
func unmount(t testing.TB, dir string) {
	switch err := unmountBusy(dir); {
	case err == nil || err == unix.EINVAL:
	case err == errStillBusy:
		t.Errorf("unmount %s: %v; detached lazily", dir, err)
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	default:
		t.Errorf("unmount %s: %v", dir, err)
	}
}

// sweepOrphans takes down what test processes that died without cleaning
// up (SIGKILL, a crash) left: their loop devices first (detached now, or
// as soon as their file system is unmounted), then their mounts and
// directories.
func sweepOrphans() {
	dead := func(path string) bool {
		_, rest, ok := strings.Cut(path, "/"+prefix)
		if !ok {
			return false
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		return err == nil && pid != os.Getpid() && unix.Kill(pid, 0) != nil
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if data, err := os.ReadFile(f); err == nil && dead(strings.TrimSpace(string(data))) {
			_ = exec.Command("losetup", "-d", "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f)))).Run()
		}
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && dead(f[4]) {
			mounts = append(mounts, f[4])
		}
	}
	// The disk's file system (BASE/mnt) before the FUSE disk under it
	// (BASE/dev): reverse order of their paths.
	slices.SortFunc(mounts, func(a, b string) int { return strings.Compare(b, a) })
	for _, m := range mounts {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	bases, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, b := range bases {
		if dead(b) {
			os.RemoveAll(b)
		}
	}
}
