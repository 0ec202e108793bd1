// Package clustertest checks, for tests, that a Kubernetes cluster really
// runs workloads: a pod on every node from the registry mirror, DNS,
// Services, pod-to-pod traffic across nodes, and kubectl's logs, exec and
// port-forward (kubelet's server, reached through the API server). The process-tier
// cluster of lab/talosnode and the QEMU lab both use it, through kubectl.
package clustertest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/poll"
)

// Busybox is the image of the probe pods: Debian's busybox-static under
// busybox's upstream name (hack/lab-images.sh builds it).
const Busybox = "docker.io/library/busybox:1.35.0"

// Kubectl runs kubectl with args against the cluster under test and
// returns its standard output.
type Kubectl func(args ...string) (string, error)

// probeDaemonSet runs one busybox pod on every node, control planes
// included, each serving its node's name over HTTP on port 8080.
const probeDaemonSet = `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: probe
  namespace: default
spec:
  selector:
    matchLabels: {app: probe}
  template:
    metadata:
      labels: {app: probe}
    spec:
      tolerations:
      - {operator: Exists, effect: NoSchedule}
      containers:
      - name: probe
        image: ` + Busybox + `
        env:
        - name: NODE
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        command: [sh, -c, 'mkdir -p /www && echo "probe on $NODE" > /www/index.html && echo "probe up on $NODE" && exec httpd -f -p 8080 -h /www']
        ports:
        - containerPort: 8080
`

// Pod is a probe pod.
type Pod struct {
	Name, Node, IP string
}

// RunProbes starts a probe pod on each of nodes and waits until all run.
func RunProbes(t testing.TB, kubectl Kubectl, nodes []string, timeout time.Duration) []Pod {
	t.Helper()
	f := filepath.Join(t.TempDir(), "probe.yaml")
	if err := os.WriteFile(f, []byte(probeDaemonSet), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("apply", "-f", f); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var pods []Pod
	poll.Within(t, timeout, time.Second, "a running probe pod on every node", func() error {
		out, err := kubectl("get", "pods", "-l", "app=probe", "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.status.phase}{"\n"}{end}`)
		if err != nil {
			return err
		}
		pods = nil
		running := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 4 && f[3] == "Running" {
				pods = append(pods, Pod{Name: f[0], Node: f[1], IP: f[2]})
				running[f[1]] = true
			}
		}
		for _, n := range nodes {
			if !running[n] {
				return fmt.Errorf("no running probe on %s: %s", n, out)
			}
		}
		return nil
	})
	return pods
}

// CheckWorkloads checks, from the probe pods, what a user's workloads
// need: CoreDNS resolves the API's Service name (through the Service's
// cluster IP, so kube-proxy runs), the API server answers through its
// Service, each pod reaches a pod on another node (the CNI routes across
// nodes), and kubectl logs and exec reach every kubelet.
func CheckWorkloads(t *testing.T, kubectl Kubectl, pods []Pod, domain string) {
	t.Helper()
	if len(pods) < 2 {
		t.Fatalf("want probe pods on two nodes at least, have %v", pods)
	}
	svc := "kubernetes.default.svc." + domain
	for i, p := range pods {
		peer := pods[(i+1)%len(pods)]
		t.Run("from "+p.Node, func(t *testing.T) {
			poll.Within(t, 2*time.Minute, time.Second, "logs", func() error {
				out, err := kubectl("logs", p.Name)
				if err != nil {
					return err
				}
				if !strings.Contains(out, "probe up on "+p.Node) {
					return fmt.Errorf("logs of %s: %q", p.Name, out)
				}
				return nil
			})
			poll.Within(t, 2*time.Minute, time.Second, "DNS", func() error {
				out, err := kubectl("exec", p.Name, "--", "nslookup", svc)
				if err != nil {
					return err
				}
				if !strings.Contains(out, "Address") || !strings.Contains(out, svc) {
					return fmt.Errorf("nslookup %s: %q", svc, out)
				}
				return nil
			})
			poll.Within(t, time.Minute, time.Second, "the API through its Service", func() error {
				// Plain HTTP to the HTTPS port gets Go's own answer, which
				// only the API server gives there (busybox has no TLS
				// client that talks to it).
				out, err := kubectl("exec", p.Name, "--", "sh", "-c", `printf 'GET /version HTTP/1.0\r\n\r\n' | nc -w 5 `+svc+` 443`)
				if err != nil {
					return err
				}
				if !strings.Contains(out, "Client sent an HTTP request to an HTTPS server") {
					return fmt.Errorf("the API's Service answered %q", out)
				}
				return nil
			})
			poll.Within(t, time.Minute, time.Second, "a pod on "+peer.Node, func() error {
				// nc, not wget: Debian's static busybox wget crashes in
				// glibc's resolver without its NSS modules.
				out, err := kubectl("exec", p.Name, "--", "sh", "-c", `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 `+peer.IP+` 8080`)
				if err != nil {
					return err
				}
				if !strings.Contains(out, "probe on "+peer.Node) {
					return fmt.Errorf("got %q", out)
				}
				return nil
			})
		})
	}
}

// crashPod's container exits 1 on its first run and stays up on the
// next, counting its runs in an emptyDir that outlives the container.
// One restart, not a crash loop: in a loop the kubelet removes each
// dead container as the next one starts, and the Pod's lastState can
// name one already removed while its status catches up (a cold CI run
// hit that: "unable to retrieve container logs" for a minute).
const crashPod = `apiVersion: v1
kind: Pod
metadata:
  name: crasher
  namespace: default
spec:
  nodeName: %s
  tolerations:
  - {operator: Exists, effect: NoSchedule}
  volumes:
  - {name: runs, emptyDir: {}}
  containers:
  - name: crasher
    image: ` + Busybox + `
    volumeMounts:
    - {name: runs, mountPath: /runs}
    command: [sh, -c, 'n=$(($(cat /runs/n 2>/dev/null || echo 0) + 1)); echo $n > /runs/n; echo "crasher run $n"; [ $n -gt 1 ] && exec sleep 3600; exit 1']
`

// CheckPreviousLogs checks what an operator reads first when a container
// restarts: kubectl logs --previous answers with the log of the run that
// exited, on node.
func CheckPreviousLogs(t *testing.T, kubectl Kubectl, node string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "crasher.yaml")
	if err := os.WriteFile(f, []byte(fmt.Sprintf(crashPod, node)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("apply", "-f", f); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	poll.Within(t, 3*time.Minute, time.Second, "the crasher restarted and running", func() error {
		out, err := kubectl("get", "pod", "crasher", "-o", `jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].lastState.terminated.exitCode} {.status.containerStatuses[0].ready}`)
		if err != nil {
			return err
		}
		if f := strings.Fields(out); len(f) != 3 || f[0] != "1" || f[1] != "1" || f[2] != "true" {
			return fmt.Errorf("restarts, last exit code, ready: %q", out)
		}
		return nil
	})
	poll.Within(t, time.Minute, time.Second, "the log of its previous run", func() error {
		out, err := kubectl("logs", "--previous", "crasher")
		if err != nil {
			return err
		}
		if !strings.Contains(out, "crasher run 1") {
			return fmt.Errorf("logs --previous: %q", out)
		}
		return nil
	})
}
