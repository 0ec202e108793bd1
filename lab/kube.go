package lab

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"cozy.dev/cozy/bootstrap"
	"cozy.dev/cozy/internal/netns"
)

// clusterState is how far the lab's cluster has come once bootstrapped.
type clusterState struct {
	ready    []string // Nodes whose Ready condition is True
	notReady []string
	coreDNS  bool     // the CoreDNS Deployment is Available
	dnsPods  []string // CoreDNS's pods: name, phase and node
	err      error    // the API's answer when it gave none of the above
}

func (s clusterState) String() string {
	if s.err != nil {
		return fmt.Sprintf("the API did not answer: %v", s.err)
	}
	return fmt.Sprintf("Ready nodes %v, not ready %v, CoreDNS available %v (pods: %v)", s.ready, s.notReady, s.coreDNS, s.dnsPods)
}

// waitKubernetes polls the lab's cluster, from inside its namespace,
// until all its machines are Ready Nodes and CoreDNS is Available, and
// reports when each happened (counted from start).
func (c *Config) waitKubernetes(ctx context.Context, kubeconfig string, start time.Time, timeout time.Duration) ([]Milestone, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.Dial = netns.Dialer(Namespace(c.Name))
	rc.Timeout = 15 * time.Second
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = 20 * time.Minute
	}
	want := len(c.Machines())
	var ms []Milestone
	var nodesAt, dnsAt time.Duration
	deadline := time.Now().Add(timeout)
	var last clusterState
	for {
		last = observe(ctx, cs)
		if nodesAt == 0 && len(last.ready) == want {
			nodesAt = time.Since(start)
			ms = append(ms, Milestone{"all nodes Ready", nodesAt.Round(100 * time.Millisecond)})
		}
		if dnsAt == 0 && last.coreDNS {
			dnsAt = time.Since(start)
			ms = append(ms, Milestone{"CoreDNS available", dnsAt.Round(100 * time.Millisecond)})
		}
		if nodesAt > 0 && dnsAt > 0 {
			return ms, nil
		}
		if time.Now().After(deadline) {
			return ms, fmt.Errorf("after %s: %s", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ms, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

func observe(ctx context.Context, cs kubernetes.Interface) clusterState {
	var s clusterState
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		s.err = err
		return s
	}
	for _, n := range nodes.Items {
		if nodeReady(n) {
			s.ready = append(s.ready, n.Name)
		} else {
			s.notReady = append(s.notReady, n.Name)
		}
	}
	slices.Sort(s.ready)
	slices.Sort(s.notReady)
	if d, err := cs.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{}); err == nil {
		s.coreDNS = deploymentAvailable(d)
	}
	// Where CoreDNS's pods are, for the error when it never gets
	// available: not scheduled, not running, or running but not ready.
	if pods, err := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"}); err == nil {
		for _, p := range pods.Items {
			node := p.Spec.NodeName
			if node == "" {
				node = "unscheduled"
			}
			s.dnsPods = append(s.dnsPods, fmt.Sprintf("%s %s on %s", p.Name, p.Status.Phase, node))
		}
		slices.Sort(s.dnsPods)
	}
	return s
}

func nodeReady(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func deploymentAvailable(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == corev1.ConditionTrue && d.Status.AvailableReplicas > 0
		}
	}
	return false
}

// imagePullProblems lists the pods of the lab's cluster that cannot get
// their image, with the image and the kubelet's reason: what `lab
// status` shows when the mirror is unreachable or lacks an image.
func imagePullProblems(ctx context.Context, cs kubernetes.Interface) []string {
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range pods.Items {
		for _, st := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			if w := st.State.Waiting; w != nil && (w.Reason == "ImagePullBackOff" || w.Reason == "ErrImagePull") {
				msg := w.Message
				if len(msg) > 200 {
					msg = msg[:200] + "…"
				}
				out = append(out, fmt.Sprintf("%s/%s: %s %s (%s)", p.Namespace, p.Name, w.Reason, st.Image, msg))
			}
		}
	}
	return out
}

// ImageProblems lists the lab's pods that cannot get their image, naming
// the image and the kubelet's reason; nil when the cluster cannot be
// asked (not bootstrapped yet, or down).
func ImageProblems(ctx context.Context, c *Config) []string {
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(c.Dir, StateDir, bootstrap.KubeconfigFile))
	if err != nil {
		return nil
	}
	rc.Dial = netns.Dialer(Namespace(c.Name))
	rc.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil
	}
	return imagePullProblems(ctx, cs)
}
