package talosnode

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// serviceID is what a service's log may be called: its file is
// <state-dir>/logs/<id>.log, so no path may sneak in.
var serviceID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// followPoll is how often a followed log is read again once at its end.
const followPoll = 500 * time.Millisecond

// Logs streams a service's log, as `talosctl logs SERVICE [-f] [--tail N]`
// reads it from Talos: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, containerd and kubelet each log to a file of the node's
// disk. Pods' logs (talosctl logs -k) are the kubelet's to serve:
// kubectl logs.
func (s *configuredServer) Logs(req *machine.LogsRequest, stream grpc.ServerStreamingServer[common.Data]) error {
	if req.GetDriver() == common.ContainerDriver_CRI || req.GetNamespace() == "k8s.io" {
		return status.Error(codes.Unimplemented, "the emulated node serves its own services' logs only; read a pod's with kubectl logs")
	}
	id := req.GetId()
	if !serviceID.MatchString(id) {
		return status.Errorf(codes.InvalidArgument, "service %q: not a service name", id)
	}
	dir := filepath.Join(s.node.cfg.StateDir, LogDir)
	f, err := os.Open(filepath.Join(dir, id+".log"))
	if errors.Is(err, fs.ErrNotExist) {
		return status.Errorf(codes.NotFound, "service %q has no log on this node (logs: %s)", id, strings.Join(serviceLogs(dir), ", "))
	}
	if err != nil {
		return status.Errorf(codes.Internal, "open the log of %s: %v", id, err)
	}
	defer f.Close()
	if n := req.GetTailLines(); n >= 0 {
		off, err := tailOffset(f, int(n))
		if err != nil {
			return status.Errorf(codes.Internal, "read the log of %s: %v", id, err)
		}
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return status.Errorf(codes.Internal, "read the log of %s: %v", id, err)
		}
	}
	buf := make([]byte, 32<<10)
	for {
		k, err := f.Read(buf)
		if k > 0 {
			if err := stream.Send(&common.Data{Bytes: slices.Clone(buf[:k])}); err != nil {
				return err
			}
		}
		switch {
		case errors.Is(err, io.EOF):
			if !req.GetFollow() {
				return nil
			}
			select {
			case <-stream.Context().Done():
				return nil
			case <-time.After(followPoll):
			}
		case err != nil:
			return status.Errorf(codes.Internal, "read the log of %s: %v", id, err)
		}
	}
}

// serviceLogs names the services with a log in dir.
func serviceLogs(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var ids []string
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".log"); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// tailOffset is where the last n lines of f start (a last line without
// its newline counts), reading backwards a block at a time.
func tailOffset(f *os.File, n int) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	end := fi.Size()
	if n == 0 {
		return end, nil
	}
	const block = 8 << 10
	buf := make([]byte, block)
	pos := end
	lines := 0
	for pos > 0 {
		size := min(block, pos)
		pos -= size
		if _, err := f.ReadAt(buf[:size], pos); err != nil {
			return 0, err
		}
		chunk := buf[:size]
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] != '\n' || pos+int64(i) == end-1 {
				continue // the file's own trailing newline ends the last line
			}
			lines++
			if lines == n {
				return pos + int64(i) + 1, nil
			}
		}
	}
	return 0, nil
}
