package talosnode

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"text/template"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// Values Talos gives the kubelet (its machinery's constants).
const (
	kubeletPort                 = 10250
	kubeletOOMScoreAdj          = -450
	kubeletShutdownGrace        = 30 * time.Second
	kubeletShutdownGraceCrit    = 10 * time.Second
	controlPlaneTaint           = "node-role.kubernetes.io/control-plane"
	kubeletSystemReservedCPU    = "50m"
	kubeletSystemReservedPID    = "100"
	kubeletSystemReservedDisk   = "256Mi"
	kubeletReservedMemoryCP     = "512Mi"
	kubeletReservedMemoryWorker = "384Mi"
)

// kubeletConfiguration is the kubelet's config file, built from the
// machine config as Talos builds it: machine.kubelet.extraConfig first,
// then the fields Talos always sets, then defaults for what extraConfig
// left out. On the container platform the kubelet shares the kernel with
// other nodes, so it does not check the kernel's defaults, and puts its
// pods under cgroupRoot rather than the root cgroup.
func kubeletConfiguration(mc config.Config, p Platform, cgroupRoot string) (*kubeletv1beta1.KubeletConfiguration, error) {
	kl := mc.Machine().Kubelet()
	var c kubeletv1beta1.KubeletConfiguration
	if extra := kl.ExtraConfig(); len(extra) > 0 {
		for _, field := range []string{"authentication", "authorization", "cgroupRoot", "kubeletCgroups", "port", "rotateCertificates", "staticPodPath", "systemCgroups"} {
			if _, ok := extra[field]; ok {
				return nil, fmt.Errorf("machine.kubelet.extraConfig: field %q can't be overridden", field)
			}
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(extra, &c, true); err != nil {
			return nil, fmt.Errorf("machine.kubelet.extraConfig: %w", err)
		}
	}
	c.TypeMeta = metav1.TypeMeta{APIVersion: kubeletv1beta1.SchemeGroupVersion.String(), Kind: "KubeletConfiguration"}
	if !kl.DisableManifestsDirectory() {
		c.StaticPodPath = staticPodDir
	}
	c.Port = kubeletPort
	c.Authentication = kubeletv1beta1.KubeletAuthentication{
		X509:      kubeletv1beta1.KubeletX509Authentication{ClientCAFile: kubernetesCACert},
		Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: new(true)},
		Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: new(false)},
	}
	c.Authorization = kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook}
	c.CgroupRoot = "/"
	c.RotateCertificates = true
	c.ProtectKernelDefaults = true
	c.ContainerRuntimeEndpoint = "unix://" + containerdSocket
	if kl.DefaultRuntimeSeccompProfileEnabled() {
		c.SeccompDefault = new(true)
	}
	if kl.SkipNodeRegistration() {
		c.Authentication.Webhook.Enabled = new(false)
		c.Authorization.Mode = kubeletv1beta1.KubeletAuthorizationModeAlwaysAllow
	} else if mc.Machine().Type().IsControlPlane() && !mc.Cluster().ScheduleOnControlPlanes() &&
		!slices.ContainsFunc(c.RegisterWithTaints, func(t corev1.Taint) bool { return t.Key == controlPlaneTaint }) &&
		len(kl.ExtraArgs()["register-with-taints"]) == 0 {
		c.RegisterWithTaints = append(c.RegisterWithTaints, corev1.Taint{Key: controlPlaneTaint, Effect: corev1.TaintEffectNoSchedule})
	}
	if c.Address == "" {
		c.Address = "0.0.0.0"
	}
	if c.OOMScoreAdj == nil {
		c.OOMScoreAdj = new(int32(kubeletOOMScoreAdj))
	}
	if c.ClusterDomain == "" {
		c.ClusterDomain = mc.Cluster().Network().DNSDomain()
	}
	if len(c.ClusterDNS) == 0 {
		dns, err := clusterDNS(mc)
		if err != nil {
			return nil, err
		}
		c.ClusterDNS = dns
	}
	if c.SerializeImagePulls == nil {
		c.SerializeImagePulls = new(false)
	}
	if c.FailSwapOn == nil {
		c.FailSwapOn = new(false)
	}
	if len(c.SystemReserved) == 0 {
		c.SystemReserved = map[string]string{
			"cpu": kubeletSystemReservedCPU, "pid": kubeletSystemReservedPID, "ephemeral-storage": kubeletSystemReservedDisk,
			"memory": kubeletReservedMemoryWorker,
		}
		if mc.Machine().Type().IsControlPlane() {
			c.SystemReserved["memory"] = kubeletReservedMemoryCP
		}
	}
	if c.Logging.Format == "" {
		c.Logging.Format = "json"
	}
	if _, ok := kl.ExtraConfig()["shutdownGracePeriod"]; !ok && c.ShutdownGracePeriod.Duration == 0 {
		c.ShutdownGracePeriod = metav1.Duration{Duration: kubeletShutdownGrace}
	}
	if _, ok := kl.ExtraConfig()["shutdownGracePeriodCriticalPods"]; !ok && c.ShutdownGracePeriodCriticalPods.Duration == 0 {
		c.ShutdownGracePeriodCriticalPods = metav1.Duration{Duration: kubeletShutdownGraceCrit}
	}
	if c.StreamingConnectionIdleTimeout.Duration == 0 {
		c.StreamingConnectionIdleTimeout = metav1.Duration{Duration: 5 * time.Minute}
	}
	if c.TLSMinVersion == "" {
		c.TLSMinVersion = "VersionTLS13"
	}
	c.ResolverConfig = new(podResolvConf)
	if p == PlatformContainer {
		// Talos in a container does not enforce the kernel's defaults
		// either. Nodes sharing a host share its cgroups, which may be
		// v1 (as on the machines Cozy is tested on).
		c.ProtectKernelDefaults = false
		c.CgroupRoot = cgroupRoot
		c.FailCgroupV1 = new(false)
	}
	return &c, nil
}

// hostCgroupRoot is the cgroup under which the kubelet of a node on the
// container platform puts its pods.
func hostCgroupRoot(nodeName string) string { return "/cozy-node-" + nodeName }

// clusterDNS is the kubelet's DNS server: machine.kubelet.clusterDNS, else
// the tenth address of each service subnet, where CoreDNS's Service is.
func clusterDNS(mc config.Config) ([]string, error) {
	if dns := mc.Machine().Kubelet().ClusterDNS(); len(dns) > 0 {
		return dns, nil
	}
	ips, err := mc.Cluster().Network().DNSServiceIPs()
	if err != nil {
		return nil, fmt.Errorf("cluster DNS address: %w", err)
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out, nil
}

// kubeletArgs are the kubelet's flags: Talos's, with
// machine.kubelet.extraArgs merged over them except where Talos forbids
// it. nodeIP is the node's address that kubelet registers.
func kubeletArgs(mc config.Config, nodeName string, nodeIP netip.Addr) ([]string, error) {
	kl := mc.Machine().Kubelet()
	args := map[string][]string{
		"config":            {kubeletConfigFile},
		"cert-dir":          {kubeletPKIDir},
		"hostname-override": {nodeName},
	}
	if !kl.SkipNodeRegistration() {
		args["bootstrap-kubeconfig"] = []string{kubeletBootstrapKC}
		args["kubeconfig"] = []string{kubeletKubeconfig}
	}
	if mc.Cluster().ExternalCloudProvider().Enabled() {
		args["cloud-provider"] = []string{"external"}
	}
	extra := kl.ExtraArgs()
	if _, ok := extra["node-ip"]; !ok {
		args["node-ip"] = []string{nodeIP.String()}
	}
	denied := []string{"bootstrap-kubeconfig", "kubeconfig", "container-runtime", "container-runtime-endpoint", "config", "cert-dir"}
	for k, v := range extra {
		if slices.Contains(denied, k) {
			return nil, fmt.Errorf("machine.kubelet.extraArgs: %q can't be overridden", k)
		}
		args[k] = v
	}
	return flagList(args), nil
}

// flagList turns flags into --name=value arguments, sorted by name; a flag
// with several values is repeated.
func flagList(args map[string][]string) []string {
	names := make([]string, 0, len(args))
	for k := range args {
		names = append(names, k)
	}
	sort.Strings(names)
	var out []string
	for _, k := range names {
		for _, v := range args[k] {
			out = append(out, "--"+k+"="+v)
		}
	}
	return out
}

// kubeletNodeIP is the address kubelet registers: the node's, which must
// be in machine.kubelet.nodeIP.validSubnets when they are set.
func kubeletNodeIP(mc config.Config, addr netip.Addr) (netip.Addr, error) {
	subnets := mc.Machine().Kubelet().NodeIP().ValidSubnets()
	if len(subnets) == 0 {
		return addr, nil
	}
	matched := false
	for _, s := range subnets {
		neg := strings.HasPrefix(s, "!")
		p, err := parseSubnet(strings.TrimPrefix(s, "!"))
		if err != nil {
			return netip.Addr{}, fmt.Errorf("machine.kubelet.nodeIP.validSubnets: %q is not a subnet", s)
		}
		switch {
		case neg && p.Contains(addr):
			return netip.Addr{}, fmt.Errorf("the node's address %s is excluded by machine.kubelet.nodeIP.validSubnets %q", addr, s)
		case !neg && p.Contains(addr):
			matched = true
		}
	}
	if matched {
		return addr, nil
	}
	return netip.Addr{}, fmt.Errorf("the node's address %s is not in machine.kubelet.nodeIP.validSubnets %v", addr, subnets)
}

var bootstrapKubeconfigTemplate = template.Must(template.New("bootstrap").Parse(`apiVersion: v1
kind: Config
clusters:
- name: {{ .Cluster }}
  cluster:
    server: {{ .Server }}
    certificate-authority-data: {{ .CA }}
users:
- name: kubelet
  user:
    token: {{ .Token }}
contexts:
- context:
    cluster: {{ .Cluster }}
    user: kubelet
  name: kubelet@{{ .Cluster }}
current-context: kubelet@{{ .Cluster }}
`))

// bootstrapKubeconfig is the kubelet's first credential: the cluster's
// bootstrap token (cluster.token, id.secret), which lets it ask for its
// client certificate through a CertificateSigningRequest.
func bootstrapKubeconfig(mc config.Config) ([]byte, error) {
	cl := mc.Cluster()
	tok := cl.Token()
	if tok == nil || tok.ID() == "" || tok.Secret() == "" {
		return nil, errors.New("the config has no cluster.token")
	}
	ca := cl.IssuingCA()
	if ca == nil || len(ca.Crt) == 0 {
		return nil, errors.New("the config has no cluster.ca")
	}
	var out bytes.Buffer
	err := bootstrapKubeconfigTemplate.Execute(&out, map[string]string{
		"Cluster": cl.Name(),
		"Server":  localAPIEndpoint(mc),
		"CA":      base64.StdEncoding.EncodeToString(clusterCAs(cl)),
		"Token":   tok.ID() + "." + tok.Secret(),
	})
	return out.Bytes(), err
}

// clusterCAs are the CAs a client of the cluster trusts: cluster.ca and
// cluster.acceptedCAs.
func clusterCAs(cl config.ClusterConfig) []byte {
	cas := bytes.Clone(cl.IssuingCA().Crt)
	for _, a := range cl.AcceptedCAs() {
		cas = append(cas, a.Crt...)
	}
	return cas
}

// kubeletConfigYAML marshals the kubelet's config file.
func kubeletConfigYAML(c *kubeletv1beta1.KubeletConfiguration) ([]byte, error) {
	return yaml.Marshal(c)
}

// parseSubnet reads a CIDR, or an address as a one-address subnet.
func parseSubnet(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
