package lab

import (
	"context"
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// lab status names the pods whose image cannot be pulled (an unreachable
// mirror, an image it lacks), with the image and the kubelet's reason.
func TestImagePullProblems(t *testing.T) {
	waiting := func(reason, msg string) corev1.ContainerState {
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
	}
	cs := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns-1"}, Status: corev1.PodStatus{
			ContainerStatuses: []corev1.ContainerStatus{{Image: "registry.k8s.io/coredns/coredns:v1.14.2",
				State: waiting("ImagePullBackOff", `Back-off pulling image "registry.k8s.io/coredns/coredns:v1.14.2"`)}},
		}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-flannel-x"}, Status: corev1.PodStatus{
			InitContainerStatuses: []corev1.ContainerStatus{{Image: "ghcr.io/siderolabs/flannel:v0.28.4",
				State: waiting("ErrImagePull", "dial tcp 192.168.77.1:5000: connect: connection refused")}},
		}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fine"}, Status: corev1.PodStatus{
			ContainerStatuses: []corev1.ContainerStatus{{Image: "docker.io/library/busybox:1.35.0",
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}},
		}},
	)
	got := imagePullProblems(context.Background(), cs)
	if len(got) != 2 {
		t.Fatalf("problems %q, want the two pods that cannot pull", got)
	}
	joined := strings.Join(got, "\n")
	for _, want := range []string{"kube-system/coredns-1: ImagePullBackOff registry.k8s.io/coredns/coredns:v1.14.2", "kube-system/kube-flannel-x: ErrImagePull ghcr.io/siderolabs/flannel:v0.28.4", "connection refused"} {
		if !strings.Contains(joined, want) {
			t.Errorf("problems %q lack %q", got, want)
		}
	}
}

func TestObserve(t *testing.T) {
	ready := func(name string, ok corev1.ConditionStatus) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ok}}}}
	}
	cs := fake.NewClientset(ready("cp1", corev1.ConditionTrue), ready("w1", corev1.ConditionFalse),
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns"}, Status: appsv1.DeploymentStatus{
			AvailableReplicas: 1, Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}}})
	s := observe(context.Background(), cs)
	if strings.Join(s.ready, ",") != "cp1" || strings.Join(s.notReady, ",") != "w1" || !s.coreDNS {
		t.Errorf("observed %s", s)
	}
}

// When CoreDNS never gets available, lab up's error says where its pods
// are (a bench run had both Pending, unscheduled, for 15 minutes), and
// when the API does not answer it says so instead of listing no nodes.
func TestObserveExplains(t *testing.T) {
	cs := fake.NewClientset(
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns-b", Labels: map[string]string{"k8s-app": "kube-dns"}},
			Status: corev1.PodStatus{Phase: corev1.PodPending}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns-a", Labels: map[string]string{"k8s-app": "kube-dns"}},
			Spec: corev1.PodSpec{NodeName: "w1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy-x", Labels: map[string]string{"k8s-app": "kube-proxy"}}},
	)
	got := observe(context.Background(), cs).String()
	if want := "CoreDNS available false (pods: [coredns-a Running on w1 coredns-b Pending on unscheduled])"; !strings.Contains(got, want) {
		t.Errorf("observed %q, want it to contain %q", got, want)
	}
	cs.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("TLS handshake timeout")
	})
	if got := observe(context.Background(), cs).String(); got != "the API did not answer: TLS handshake timeout" {
		t.Errorf("observed %q with the API down", got)
	}
}
