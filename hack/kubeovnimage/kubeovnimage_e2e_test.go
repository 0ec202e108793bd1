//go:build integration && e2e

package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/runc"
	"cozy.dev/cozy/internal/testing/testenv"
)

const (
	kubeOVNRef     = "docker.io/kubeovn/kube-ovn:v1.15.4"
	kubeOVNModule  = "github.com/kubeovn/kube-ovn"
	kubeOVNVersion = "v1.15.4"
	// The node the test's OVN central and controller stand for; an
	// address of TEST-NET-1, to which nothing is sent.
	nodeName = "node1"
	nodeIP   = "192.0.2.10"
	// podUser is the user the chart runs Kube-OVN's containers as
	// (kubeovn.runAsUser without IPsec).
	podUser = 65534
)

// TestKubeOVNImage runs Kube-OVN's control plane from the image
// hack/kube-ovn.sh builds, as its chart runs it, against a real API
// server: the ovn-central container (start-db.sh: Debian's OVN
// databases, clustered, and ovn-northd, then Kube-OVN's leader checker)
// and the controller (start-controller.sh), both with the host's
// network as their pods have, both reaching the API server as pods do
// (a ServiceAccount's token, KUBERNETES_SERVICE_HOST). The controller
// must program Debian's OVN — Kube-OVN's OVN is its own patched build —
// and northd must compile it: the default VPC's router, the default and
// join subnets as logical switches, the node's port on the join switch
// and its address on the Node, datapaths in the southbound database.
//
// Not here: ovs-ovn and kube-ovn-cni, whose datapath is the kernel's
// openvswitch module, which this machine's kernel does not have.
//
// OVN's ports are fixed (6641 to 6644 on 127.0.0.1, as start-db.sh and
// start-controller.sh use them); the test fails if another process holds
// one.
func TestKubeOVNImage(t *testing.T) {
	dir := testenv.BuiltDir(t, "COZY_KUBE_OVN_IMAGE", "hack/kube-ovn.sh", ocispec.ImageIndexFile)
	for _, bin := range []string{"skopeo", "umoci", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			prereq.Missing(t, "%s is not installed (see hack/install-deps.sh)", bin)
		}
	}
	if os.Geteuid() != 0 {
		prereq.Missing(t, "runc runs the image as root only")
	}
	for _, port := range []string{"6641", "6642", "6643", "6644"} {
		l, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err != nil {
			t.Fatalf("OVN's port %s on 127.0.0.1 is taken (%v): start-db.sh cannot choose another", port, err)
		}
		l.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	config := runc.Config(t, dir, kubeOVNRef)
	if c := config.Config; strings.Join(c.Entrypoint, " ") != "/usr/bin/dumb-init --" || c.WorkingDir != "/kube-ovn" || config.Architecture != "amd64" {
		t.Errorf("config %+v, want dumb-init as the entrypoint in /kube-ovn, as upstream's", c)
	}
	// skopeo copy checks every blob against its digest.
	runc.CheckBlobs(t, dir, kubeOVNRef)

	env := testenv.Start(t, testenv.Options{CRDs: []testenv.CRDSource{
		{Module: kubeOVNModule, Version: kubeOVNVersion, Dir: "charts/kube-ovn/templates/kube-ovn-crd.yaml"},
	}})
	c := env.Client
	sa := serviceAccount(t, ctx, env)
	for _, obj := range []client.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"kube-ovn/role": "master", "kubernetes.io/os": "linux"}}},
		// The pods whose labels the leader checker writes.
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ovn-central-0", Namespace: "kube-system", Labels: map[string]string{"app": "ovn-central"}},
			Spec: corev1.PodSpec{NodeName: nodeName, HostNetwork: true, Containers: []corev1.Container{{Name: "ovn-central", Image: kubeOVNRef}}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP}}
	if err := c.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}

	bundle := runc.Unpack(t, dir, kubeOVNRef)
	podEnv := slices.Concat(sa.env, []string{
		"POD_IP=127.0.0.1", "POD_IPS=127.0.0.1", "POD_NAMESPACE=kube-system", "KUBE_NAMESPACE=kube-system", "KUBE_NODE_NAME=" + nodeName})
	// ovn-central's pod: start-db.sh as podUser, NET_BIND_SERVICE and
	// SYS_NICE added, the host's OVN directories mounted, and
	// central-deploy.yaml's environment with the chart's defaults (one
	// database member, this host); the controller's pod adds NET_RAW and
	// mounts its log directory. Both run here in one container, on the
	// same image, network and user.
	central := startContainer(t, bundle, pod{
		user: podUser,
		caps: []string{"CAP_NET_BIND_SERVICE", "CAP_SYS_NICE", "CAP_NET_RAW"},
		volumes: map[string]string{
			"/var/run/ovn": volume(t), "/etc/ovn": volume(t), "/var/log/ovn": volume(t),
			"/var/log/kube-ovn": volume(t), "/var/run/secrets/kubernetes.io/serviceaccount": sa.dir,
		},
	}, []string{"bash", "/kube-ovn/start-db.sh"}, slices.Concat(podEnv, []string{
		"POD_NAME=ovn-central-0", "ENABLE_SSL=false", "NODE_IPS=127.0.0.1", "ENABLE_BIND_LOCAL_IP=true",
		"PROBE_INTERVAL=180000", "OVN_NORTHD_PROBE_INTERVAL=5000", "OVN_LEADER_PROBE_INTERVAL=5", "OVN_NORTHD_N_THREADS=1", "ENABLE_COMPACT=false"}))
	nbctl := func(args ...string) (string, error) {
		return central.Exec(asPod, append([]string{"ovn-nbctl", "--db=tcp:[127.0.0.1]:6641", "--timeout=10"}, args...)...)
	}
	sbctl := func(args ...string) (string, error) {
		return central.Exec(asPod, append([]string{"ovn-sbctl", "--db=tcp:[127.0.0.1]:6642", "--timeout=10"}, args...)...)
	}
	t.Cleanup(func() {
		if t.Failed() {
			controller, _ := central.Exec(asPod, "tail", "-50", "/var/log/kube-ovn/kube-ovn-controller.log")
			t.Logf("ovn-central:\n%s\nthe controller's log, its end:\n%s", central.Log(), controller)
		}
	})
	poll.Until(t, ctx, 2*time.Second, "OVN's northbound database", func() error {
		if central.Stopped() {
			t.Fatal("ovn-central's start-db.sh ended")
		}
		_, err := nbctl("get-connection")
		return err
	})

	// controller-deploy.yaml's arguments with the chart's defaults, but
	// load balancers and network policies off, as Cozy's values set them.
	controllerEnv := slices.Concat(podEnv, []string{"POD_NAME=kube-ovn-controller-0", "OVN_DB_IPS=127.0.0.1"})
	central.ExecDetached(t, slices.Concat(asPod, envOptions(controllerEnv)), "/kube-ovn/start-controller.sh",
		"--default-ls=ovn-default", "--default-cidr=10.16.0.0/16", "--default-gateway=10.16.0.1",
		"--cluster-router=ovn-cluster", "--node-switch=join", "--node-switch-cidr=100.64.0.0/16",
		"--service-cluster-ip-range=10.96.0.0/12", "--network-type=geneve", "--enable-lb=false", "--enable-np=false",
		"--logtostderr=false", "--alsologtostderr=true", "--log_file=/var/log/kube-ovn/kube-ovn-controller.log")

	// The node's port on the join switch, and its address on the Node.
	var joinIP string
	poll.Until(t, ctx, 2*time.Second, "the node's join address", func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
			return err
		}
		if joinIP = node.Annotations["ovn.kubernetes.io/ip_address"]; joinIP == "" {
			return fmt.Errorf("node %s has no ovn.kubernetes.io/ip_address", nodeName)
		}
		return nil
	})
	if !strings.HasPrefix(joinIP, "100.64.") || node.Annotations["ovn.kubernetes.io/logical_switch"] != "join" {
		t.Errorf("node annotations %v, want an address of the join subnet 100.64.0.0/16", node.Annotations)
	}
	for _, check := range []struct {
		what string
		run  func() (string, error)
		want []string
	}{
		{"logical switches", func() (string, error) { return nbctl("ls-list") }, []string{"(ovn-default)", "(join)"}},
		{"logical routers", func() (string, error) { return nbctl("lr-list") }, []string{"(ovn-cluster)"}},
		{"the join switch's ports", func() (string, error) { return nbctl("lsp-list", "join") }, []string{"(node-" + nodeName + ")", "(join-ovn-cluster)"}},
		{"the node port's address", func() (string, error) { return nbctl("lsp-get-addresses", "node-"+nodeName) }, []string{joinIP}},
		// northd compiled the northbound database into datapaths.
		{"southbound datapaths", func() (string, error) {
			return sbctl("--columns=external_ids", "list", "Datapath_Binding")
		}, []string{"name=ovn-default", "name=join", "name=ovn-cluster"}},
	} {
		poll.Until(t, ctx, 2*time.Second, check.what, func() error {
			out, err := check.run()
			if err != nil {
				return err
			}
			for _, w := range check.want {
				if !strings.Contains(out, w) {
					return fmt.Errorf("%q has no %q", out, w)
				}
			}
			return nil
		})
	}
	for _, name := range []string{"ovn-default", "join"} {
		subnet := &unstructured.Unstructured{}
		subnet.SetAPIVersion("kubeovn.io/v1")
		subnet.SetKind("Subnet")
		if err := c.Get(ctx, client.ObjectKey{Name: name}, subnet); err != nil {
			t.Errorf("Subnet %s: %v", name, err)
		}
	}
	// The leader checker marked the one member as the leader of both.
	pod := &corev1.Pod{}
	poll.Until(t, ctx, 2*time.Second, "the leader labels on ovn-central-0", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "ovn-central-0"}, pod); err != nil {
			return err
		}
		if pod.Labels["ovn-nb-leader"] != "true" || pod.Labels["ovn-sb-leader"] != "true" {
			return fmt.Errorf("labels %v", pod.Labels)
		}
		return nil
	})
}

// podIdentity is what a pod gets to reach the API server: a
// ServiceAccount's token and the cluster's CA in a directory to mount at
// /var/run/secrets/kubernetes.io/serviceaccount, and the environment
// that names the server.
type podIdentity struct {
	dir string
	env []string
}

// serviceAccount makes kube-system/kube-ovn, with the rights the chart's
// ClusterRole gives (cluster-admin here: the test checks Kube-OVN, not
// its RBAC), and a token for it.
func serviceAccount(t *testing.T, ctx context.Context, env *testenv.Env) podIdentity {
	t.Helper()
	c := env.Client
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "kube-ovn", Namespace: "kube-system"}}
	if err := c.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-ovn"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "kube-system", Name: "kube-ovn"}},
	}); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "kube-ovn",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": env.Config.CAData, "namespace": []byte("kube-system")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
		// Readable by the pod's user only, as the kubelet's projected
		// volume with the pod's fsGroup would be.
		if err := os.Chown(filepath.Join(dir, name), podUser, podUser); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(dir, podUser, podUser); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	return podIdentity{dir: dir, env: []string{"KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port()}}
}

// pod is how the chart runs a container: its user, the capabilities
// it adds, its volumes (path in the container: directory here).
type pod struct {
	user    uint32
	caps    []string
	volumes map[string]string
}

// containerdCaps are the capabilities containerd gives a container
// unless told otherwise.
var containerdCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
	"CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}

// startContainer runs args in a container of the bundle as the kubelet
// runs the pod p on the host's network (ovn-central's and the
// controller's pods are hostNetwork): as p's user, with containerd's
// capabilities and p's, no_new_privs off (so the image's file
// capabilities count, as allowPrivilegeEscalation's default lets them).
// It is deleted when the test ends.
func startContainer(t *testing.T, bundle string, p pod, args, env []string) *runc.Container {
	t.Helper()
	runc.EditSpec(t, bundle, func(spec *rspec.Spec) {
		spec.Process.Args = args
		spec.Process.Env = append(spec.Process.Env, env...)
		spec.Process.Terminal = false
		spec.Process.User = rspec.User{UID: p.user, GID: p.user}
		spec.Process.NoNewPrivileges = false
		caps := slices.Concat(containerdCaps, p.caps)
		spec.Process.Capabilities = &rspec.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
		spec.Linux.Namespaces = slices.DeleteFunc(spec.Linux.Namespaces, func(ns rspec.LinuxNamespace) bool { return ns.Type == rspec.NetworkNamespace })
		for dst, src := range p.volumes {
			spec.Mounts = append(spec.Mounts, rspec.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "rw"}})
		}
	})
	c := runc.Create(t, bundle)
	c.Start(t)
	return c
}

// asPod are runc exec's options for a command run as the pods' user.
var asPod = []string{"--user", fmt.Sprintf("%d:%d", podUser, podUser)}

// envOptions are runc exec's options that set env.
func envOptions(env []string) []string {
	var opts []string
	for _, e := range env {
		opts = append(opts, "--env", e)
	}
	return opts
}

// volume is an empty directory for a pod's volume, owned by podUser, as the
// chart's hostpath-init containers leave the host's directories.
func volume(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chown(dir, podUser, podUser); err != nil {
		t.Fatal(err)
	}
	return dir
}
