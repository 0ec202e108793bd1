package tenantcluster

import (
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

func statusCluster() *v1.TenantCluster {
	return &v1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "acme", Namespace: "tenant-acme", Generation: 3},
		Spec: v1.TenantClusterSpec{
			Version: "v1.37.0",
			// As the API server defaults it.
			ControlPlane: v1.ControlPlane{Expose: v1.Expose{Type: v1.ExposeLoadBalancer}},
			NodeGroups: []v1.NodeGroup{
				{Name: "md0", Replicas: ptr.To[int32](3)},
				{Name: "auto", MinReplicas: ptr.To[int32](1), MaxReplicas: ptr.To[int32](5)},
			},
			// Only the add-ons that run as HelmReleases, to keep the table short.
			Addons: v1.Addons{
				CloudControllerManager: v1.Addon{Enabled: ptr.To(false)},
				KubevirtCSI:            v1.Addon{Enabled: ptr.To(false)},
				ClusterAutoscaler:      v1.Addon{Enabled: ptr.To(false)},
			},
		},
	}
}

func readyMD(version string, ready, replicas int32) *clusterv1.MachineDeployment {
	m := md(version, "settled")
	m.Spec.Replicas = ptr.To(replicas)
	m.Status.Replicas, m.Status.UpToDateReplicas, m.Status.ReadyReplicas = ptr.To(replicas), ptr.To(replicas), ptr.To(ready)
	return m
}

func readyHR(ready bool, reason, msg string) *helmv2.HelmRelease {
	s := metav1.ConditionTrue
	if !ready {
		s = metav1.ConditionFalse
	}
	return &helmv2.HelmRelease{
		ObjectMeta: metav1.ObjectMeta{Generation: 1},
		Status: helmv2.HelmReleaseStatus{Conditions: []metav1.Condition{
			{Type: "Ready", Status: s, Reason: reason, Message: msg, ObservedGeneration: 1},
		}},
	}
}

func healthy() Observed {
	return Observed{
		Cluster:      &clusterv1.Cluster{Spec: clusterv1.ClusterSpec{ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "10.0.0.9", Port: 6443}}},
		ControlPlane: kcp("v1.37.0", "v1.37.0", true),
		MachineDeployments: map[string]*clusterv1.MachineDeployment{
			"md0": readyMD("v1.37.0", 3, 3), "auto": readyMD("v1.37.0", 2, 2),
		},
		Kubeconfig:   "acme-kubeconfig",
		HelmReleases: map[string]*helmv2.HelmRelease{AddonCilium: readyHR(true, "InstallSucceeded", ""), AddonMetricsServer: readyHR(true, "InstallSucceeded", "")},
	}
}

// midUpgrade is healthy at v1.36.2, asked for v1.37.0.
func midUpgrade() Observed {
	o := healthy()
	o.ControlPlane = kcp("v1.37.0", "v1.36.2", true)
	o.MachineDeployments["md0"] = readyMD("v1.36.2", 3, 3)
	o.MachineDeployments["auto"] = readyMD("v1.36.2", 2, 2)
	return o
}

// withoutAuto is healthy but for group auto, not created yet.
func withoutAuto() Observed {
	o := healthy()
	delete(o.MachineDeployments, "auto")
	return o
}

// withMD0 is healthy but for group md0's MachineDeployment.
func withMD0(md *clusterv1.MachineDeployment) func() Observed {
	return func() Observed {
		o := healthy()
		o.MachineDeployments["md0"] = md
		return o
	}
}

// refused is u with the Kamaji provider's TenantControlPlaneCreated
// condition False at u's generation, as the provider (v0.20.0's
// TrackConditionType) sets it when it cannot write the TenantControlPlane.
func refused(u *unstructured.Unstructured, msg string) *unstructured.Unstructured {
	u.SetGeneration(2)
	status, _, _ := unstructured.NestedMap(u.Object, "status")
	if status == nil {
		status = map[string]any{}
	}
	status["conditions"] = []any{
		map[string]any{"type": "Available", "status": "False", "reason": "NotAvailable", "message": "", "observedGeneration": int64(2)},
		map[string]any{"type": "TenantControlPlaneCreated", "status": "False", "reason": "Pending", "message": msg, "observedGeneration": int64(2)},
	}
	u.Object["status"] = status
	return u
}

// refusedIn is o with its control plane refused with msg.
func refusedIn(o func() Observed, msg string) func() Observed {
	return func() Observed {
		obs := o()
		obs.ControlPlane = refused(obs.ControlPlane, msg)
		return obs
	}
}

func TestComputeStatus(t *testing.T) {
	type want struct {
		phase                       v1.Phase
		workers                     string
		controlPlane, workersC, add string // "Status/Reason" and, after a colon, part of the message
		ready                       string
	}
	for _, tt := range []struct {
		name  string
		prior v1.Phase
		o     func() Observed
		held  map[string]hold
		noLB  bool
		// cpMissing: what the registry mirror lacks of the control plane.
		cpMissing string
		edit      func(*v1.TenantCluster)
		want      want
	}{
		{name: "new group waits for its image", o: withoutAuto, held: map[string]hold{"auto": {ReasonWorkerImageMissing, "node group auto waits for its worker image"}}, want: want{
			phase: v1.PhaseProvisioning, workers: "3/4", controlPlane: "True/Available",
			workersC: "False/WorkerImageMissing: node group auto waits for its worker image",
			add:      "True/Available", ready: "False/NotReady: WorkersReady: node group auto waits",
		}},
		{name: "no load balancer", noLB: true, o: func() Observed { return Observed{} }, want: want{
			phase: v1.PhaseProvisioning, workers: "0/4",
			controlPlane: "False/NoLoadBalancer: the API server is exposed as a LoadBalancer Service (the default), and the platform has no load-balancer pool",
			workersC:     "False/Scaling", add: "False/WaitingForKubeconfig", ready: "False/NotReady: ControlPlaneReady: the API server is exposed as a LoadBalancer",
		}},
		{name: "no load balancer, exposed as ClusterIP", noLB: true, o: func() Observed { return Observed{} },
			edit: func(tc *v1.TenantCluster) { tc.Spec.ControlPlane.Expose.Type = v1.ExposeClusterIP }, want: want{
				phase: v1.PhaseProvisioning, workers: "0/4", controlPlane: "False/Provisioning: waiting for the Kamaji control plane",
				workersC: "False/Scaling", add: "False/WaitingForKubeconfig", ready: "False/NotReady",
			}},
		{name: "no load balancer, initialised", noLB: true, o: healthy, want: want{
			phase: v1.PhaseReady, workers: "5/5", controlPlane: "True/Available", workersC: "True/Available", add: "True/Available", ready: "True/Available",
		}},
		{name: "GPU not permitted", o: withoutAuto, held: map[string]hold{"auto": {ReasonGPUNotPermitted, "node group auto asks for GPU x"}}, want: want{
			phase: v1.PhaseProvisioning, workers: "3/4", controlPlane: "True/Available",
			workersC: "False/GPUNotPermitted: node group auto asks for GPU x",
			add:      "True/Available", ready: "False/NotReady",
		}},
		{name: "upgrade waits for the new image", prior: v1.PhaseReady, o: withMD0(readyMD("v1.36.2", 3, 3)), held: map[string]hold{"md0": {ReasonWorkerImageMissing, "node group md0 waits for its worker image"}}, want: want{
			phase: v1.PhaseUpgrading, workers: "5/5", controlPlane: "True/Available",
			workersC: "False/WorkerImageMissing: node group md0 waits for its worker image",
			add:      "True/Available", ready: "False/NotReady",
		}},
		{name: "nothing yet", o: func() Observed { return Observed{} }, want: want{
			phase: v1.PhaseProvisioning, workers: "0/4",
			controlPlane: "False/Provisioning: waiting for the Kamaji control plane",
			workersC:     "False/Scaling: md0 (not created), auto (not created)",
			add:          "False/WaitingForKubeconfig", ready: "False/NotReady: ControlPlaneReady",
		}},
		{name: "ready", o: healthy, want: want{
			phase: v1.PhaseReady, workers: "5/5", controlPlane: "True/Available: the control plane runs v1.37.0",
			workersC: "True/Available: 5/5", add: "True/Available: add-ons ready: cilium, metrics-server", ready: "True/Available",
		}},
		{name: "control plane upgrading", prior: v1.PhaseReady, o: midUpgrade, want: want{
			phase: v1.PhaseUpgrading, workers: "5/5",
			controlPlane: "False/Upgrading: the control plane is upgrading from v1.36.2 to v1.37.0",
			workersC:     "False/Upgrading: node groups not yet at v1.37.0: md0 (at v1.36.2), auto (at v1.36.2)",
			add:          "True/Available", ready: "False/NotReady",
		}},
		// As the Kamaji provider reports Kamaji's webhook refusing the
		// TenantControlPlane of a DataStore that does not exist
		// (TestKamajiServesATenant reads the same condition).
		{name: "DataStore does not exist", o: func() Observed {
			return Observed{ControlPlane: refused(kcp("v1.37.0", "", false),
				"cannot create or update TenantControlPlane: admission webhook \"vtenantcontrolplane.kb.io\" denied the request: gone DataStore does not exist")}
		}, want: want{
			phase: v1.PhaseProvisioning, workers: "0/4",
			controlPlane: "False/ProviderError: the Kamaji control-plane provider reports TenantControlPlaneCreated False: cannot create or update TenantControlPlane: admission webhook \"vtenantcontrolplane.kb.io\" denied the request: gone DataStore does not exist",
			workersC:     "False/Scaling", add: "False/WaitingForKubeconfig", ready: "False/NotReady: ControlPlaneReady: the Kamaji control-plane provider reports",
		}},
		// The mirror lacks the control plane's images: said, not "waiting".
		{name: "control-plane images missing", o: func() Observed { return Observed{ControlPlane: kcp("v1.37.0", "", false)} },
			cpMissing: "the control plane at v1.37.0 waits for registry.k8s.io/kube-apiserver:v1.37.0", want: want{
				phase: v1.PhaseProvisioning, workers: "0/4",
				controlPlane: "False/ControlPlaneImageMissing: the control plane at v1.37.0 waits for registry.k8s.io/kube-apiserver:v1.37.0",
				workersC:     "False/Scaling", add: "False/WaitingForKubeconfig", ready: "False/NotReady: ControlPlaneReady: the control plane at v1.37.0 waits",
			}},
		// ... and during an upgrade, which would otherwise say "upgrading"
		// for ever.
		{name: "upgrade waits for the control-plane images", prior: v1.PhaseReady, o: midUpgrade,
			cpMissing: "the control plane at v1.37.0 waits for registry.k8s.io/kube-scheduler:v1.37.0", want: want{
				phase: v1.PhaseUpgrading, workers: "5/5",
				controlPlane: "False/ControlPlaneImageMissing: the control plane at v1.37.0 waits for registry.k8s.io/kube-scheduler:v1.37.0",
				workersC:     "False/Upgrading", add: "True/Available", ready: "False/NotReady",
			}},
		// An upgrade Kamaji refuses is not shown as one under way.
		{name: "upgrade refused", prior: v1.PhaseReady, o: refusedIn(midUpgrade, "version v1.37.0 is not supported\nsecond line"), want: want{
			phase: v1.PhaseUpgrading, workers: "5/5",
			controlPlane: "False/ProviderError: the Kamaji control-plane provider reports TenantControlPlaneCreated False: version v1.37.0 is not supported",
			workersC:     "False/Upgrading", add: "True/Available", ready: "False/NotReady",
		}},
		// A running control plane stays Available when a later change to it
		// is refused (the tenant still serves).
		{name: "ready, a change refused", prior: v1.PhaseReady, o: refusedIn(healthy, "spec.network.advertiseAddress is not supported"), want: want{
			phase: v1.PhaseReady, workers: "5/5", controlPlane: "True/Available", workersC: "True/Available", add: "True/Available", ready: "True/Available",
		}},
		// A refusal of an earlier spec says nothing of the current one.
		{name: "refused at an earlier generation", o: func() Observed {
			u := refused(kcp("v1.37.0", "", false), "gone DataStore does not exist")
			u.SetGeneration(3)
			return Observed{ControlPlane: u}
		}, want: want{
			phase: v1.PhaseProvisioning, workers: "0/4", controlPlane: "False/Provisioning: waiting for the Kamaji control plane",
			workersC: "False/Scaling", add: "False/WaitingForKubeconfig", ready: "False/NotReady",
		}},
		{name: "a worker lost after being ready", prior: v1.PhaseReady, o: withMD0(readyMD("v1.37.0", 2, 3)), want: want{
			phase: v1.PhaseDegraded, workers: "4/5", controlPlane: "True/Available",
			workersC: "False/Scaling: 4/5 workers ready; waiting for md0 (2/3 ready)", add: "True/Available", ready: "False/NotReady: WorkersReady",
		}},
		{name: "autoscaled below min counts min", o: func() Observed {
			o := healthy()
			o.MachineDeployments["auto"] = readyMD("v1.37.0", 0, 0)
			return o
		}, want: want{
			phase: v1.PhaseProvisioning, workers: "3/4", controlPlane: "True/Available",
			workersC: "False/Scaling: 3/4 workers ready; waiting for auto (0/1 ready)", add: "True/Available", ready: "False/NotReady",
		}},
		{name: "add-on failed", prior: v1.PhaseReady, o: func() Observed {
			o := healthy()
			o.HelmReleases[AddonCilium] = readyHR(false, "InstallFailed", "timed out waiting for the condition\nand more")
			return o
		}, want: want{
			phase: v1.PhaseDegraded, workers: "5/5", controlPlane: "True/Available", workersC: "True/Available",
			add: "False/AddonFailed: cilium: timed out waiting for the condition", ready: "False/NotReady: AddonsReady",
		}},
		{name: "add-on installing", o: func() Observed {
			o := healthy()
			o.HelmReleases[AddonCilium] = readyHR(false, "Progressing", "installing")
			delete(o.HelmReleases, AddonMetricsServer)
			return o
		}, want: want{
			phase: v1.PhaseProvisioning, workers: "5/5", controlPlane: "True/Available", workersC: "True/Available",
			add: "False/Installing: waiting for cilium, metrics-server (not created)", ready: "False/NotReady",
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := statusCluster()
			tc.Status.Phase = tt.prior
			if tt.edit != nil {
				tt.edit(tc)
			}
			o := tt.o()
			st := computeStatus(tc, o, plan(tc.Spec.Version, readControlPlane(o.ControlPlane), o.MachineDeployments), EnabledAddons(tc), platformFacts{Held: tt.held, NoLoadBalancer: tt.noLB, ControlPlaneImagesMissing: tt.cpMissing})
			if st.Phase != tt.want.phase || st.Workers != tt.want.workers || st.ObservedGeneration != 3 {
				t.Errorf("phase %s workers %s generation %d; want %s %s 3", st.Phase, st.Workers, st.ObservedGeneration, tt.want.phase, tt.want.workers)
			}
			for typ, w := range map[string]string{
				v1.ConditionControlPlaneReady: tt.want.controlPlane, v1.ConditionWorkersReady: tt.want.workersC,
				v1.ConditionAddonsReady: tt.want.add, v1.ConditionReady: tt.want.ready,
			} {
				c := apimeta.FindStatusCondition(st.Conditions, typ)
				if c == nil {
					t.Errorf("no %s condition", typ)
					continue
				}
				got := string(c.Status) + "/" + c.Reason + ": " + c.Message
				prefix, msg, _ := strings.Cut(w, ": ")
				if !strings.HasPrefix(got, prefix) || !strings.Contains(c.Message, msg) {
					t.Errorf("%s = %q, want %q", typ, got, w)
				}
				if c.ObservedGeneration != 3 {
					t.Errorf("%s observedGeneration %d", typ, c.ObservedGeneration)
				}
			}
		})
	}
}

// TestComputeStatusKeepsTransitionTimes: an unchanged verdict keeps its
// time, so a converged cluster's status is written once.
func TestComputeStatusKeepsTransitionTimes(t *testing.T) {
	tc := statusCluster()
	o := healthy()
	v := plan(tc.Spec.Version, readControlPlane(o.ControlPlane), o.MachineDeployments)
	tc.Status = computeStatus(tc, o, v, EnabledAddons(tc), platformFacts{})
	for i := range tc.Status.Conditions {
		tc.Status.Conditions[i].LastTransitionTime = metav1.NewTime(time.Unix(1000, 0))
	}
	again := computeStatus(tc, o, v, EnabledAddons(tc), platformFacts{})
	for _, c := range again.Conditions {
		if !c.LastTransitionTime.Equal(&metav1.Time{Time: time.Unix(1000, 0)}) {
			t.Errorf("%s: transition time moved to %v", c.Type, c.LastTransitionTime)
		}
	}
	if tc.Status.KubeconfigSecretRef == nil || tc.Status.Endpoint != "https://10.0.0.9:6443" || tc.Status.Version != "v1.37.0" {
		t.Errorf("status %+v", tc.Status)
	}
}

// A Deployment counts once it is available at its current generation.
func TestDeploymentAvailable(t *testing.T) {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: 2}}
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: 2, UpdatedReplicas: 1,
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}}
	if !deploymentAvailable(d) {
		t.Error("available Deployment not counted")
	}
	d.Status.ObservedGeneration = 1
	if deploymentAvailable(d) {
		t.Error("Deployment of an older generation counted")
	}
}
