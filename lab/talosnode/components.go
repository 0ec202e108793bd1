package talosnode

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"text/template"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
	"sigs.k8s.io/yaml"
)

// The controller-manager and the scheduler run on every control plane,
// where Talos runs them as static pods: with Talos's flags, leader
// election among the control planes, and kubeconfigs with client
// certificates from cluster.ca pointing at the node's local API endpoint
// (KubePrism). Their files are issued again on every boot.

// componentKubeconfigTemplate is the kubeconfig Talos writes for a
// control-plane component.
var componentKubeconfigTemplate = template.Must(template.New("component").Parse(`apiVersion: v1
kind: Config
clusters:
- name: {{ .Cluster }}
  cluster:
    server: {{ .Server }}
    certificate-authority-data: {{ .CA }}
users:
- name: {{ .User }}@{{ .Cluster }}
  user:
    client-certificate-data: {{ .Crt }}
    client-key-data: {{ .Key }}
contexts:
- context:
    cluster: {{ .Cluster }}
    namespace: default
    user: {{ .User }}@{{ .Cluster }}
  name: default@{{ .Cluster }}
current-context: default@{{ .Cluster }}
`))

// componentKubeconfig issues a client certificate with CN and O user from
// cluster.ca and returns a kubeconfig for server.
func componentKubeconfig(mc config.Config, user, server string) ([]byte, error) {
	cl := mc.Cluster()
	kp, err := clusterClientCert(cl, user, user, certLifetime)
	if err != nil {
		return nil, fmt.Errorf("%s certificate: %w", user, err)
	}
	b64 := base64.StdEncoding.EncodeToString
	var out bytes.Buffer
	err = componentKubeconfigTemplate.Execute(&out, map[string]string{
		"Cluster": cl.Name(), "Server": server, "User": user,
		"CA": b64(clusterCAs(cl)), "Crt": b64(kp.CrtPEM), "Key": b64(kp.KeyPEM),
	})
	return out.Bytes(), err
}

// component is one control-plane program and its files.
type component struct {
	name  string
	bin   string
	args  []string
	files map[string][]byte
}

// controllerManager is kube-controller-manager as Talos runs it, with
// machine config's extra args merged over Talos's flags.
func controllerManager(c Config, mc config.Config, pki controlPlaneFiles) (component, error) {
	cl := mc.Cluster()
	dir := filepath.Join(pki.dir, "kube-controller-manager")
	ca := cl.IssuingCA()
	if !canIssue(ca) {
		return component{}, errors.New("the config has no cluster.ca with a key")
	}
	kc, err := componentKubeconfig(mc, "system:kube-controller-manager", localAPIEndpoint(mc))
	if err != nil {
		return component{}, err
	}
	p := func(n string) string { return filepath.Join(dir, n) }
	args := map[string][]string{
		"allocate-node-cidrs":              {"true"},
		"authentication-kubeconfig":        {p("kubeconfig")},
		"authorization-kubeconfig":         {p("kubeconfig")},
		"bind-address":                     {"127.0.0.1"},
		"cluster-cidr":                     {strings.Join(cl.Network().PodCIDRs(), ",")},
		"cluster-signing-cert-file":        {p("ca.crt")},
		"cluster-signing-key-file":         {p("ca.key")},
		"configure-cloud-routes":           {"false"},
		"controllers":                      {"*,tokencleaner"},
		"kubeconfig":                       {p("kubeconfig")},
		"leader-elect":                     {"true"},
		"profiling":                        {"false"},
		"root-ca-file":                     {p("ca.crt")},
		"service-account-private-key-file": {p("service-account.key")},
		"service-cluster-ip-range":         {strings.Join(cl.Network().ServiceCIDRs(), ",")},
		"tls-min-version":                  {"VersionTLS13"},
	}
	if err := mergeArgs(args, cl.ControllerManager().ExtraArgs(), "cluster.controllerManager.extraArgs",
		[]string{"service-cluster-ip-range", "controllers"},
		[]string{"cluster-signing-cert-file", "cluster-signing-key-file", "authentication-kubeconfig", "authorization-kubeconfig", "root-ca-file", "service-account-private-key-file"}); err != nil {
		return component{}, err
	}
	return component{
		name: "kube-controller-manager",
		bin:  c.kubeBinary("kube-controller-manager", cl.ControllerManager().Image()),
		args: append([]string{"--use-service-account-credentials"}, flagList(args)...),
		files: map[string][]byte{
			p("ca.crt"): ca.Crt, p("ca.key"): ca.Key,
			p("service-account.key"): cl.ServiceAccount().Key,
			p("kubeconfig"):          kc,
		},
	}, nil
}

// scheduler is kube-scheduler as Talos runs it: its kubeconfig is named
// in its config file, merged over cluster.scheduler.config.
func scheduler(c Config, mc config.Config, pki controlPlaneFiles) (component, error) {
	cl := mc.Cluster()
	dir := filepath.Join(pki.dir, "kube-scheduler")
	p := func(n string) string { return filepath.Join(dir, n) }
	kc, err := componentKubeconfig(mc, "system:kube-scheduler", localAPIEndpoint(mc))
	if err != nil {
		return component{}, err
	}
	conf, err := schedulerConfig(cl.Scheduler().Config(), p("kubeconfig"))
	if err != nil {
		return component{}, err
	}
	args := map[string][]string{
		"authentication-kubeconfig":              {p("kubeconfig")},
		"authentication-tolerate-lookup-failure": {"false"},
		"authorization-kubeconfig":               {p("kubeconfig")},
		"bind-address":                           {"127.0.0.1"},
		"config":                                 {p("scheduler-config.yaml")},
		"leader-elect":                           {"true"},
		"profiling":                              {"false"},
		"tls-min-version":                        {"VersionTLS13"},
	}
	if err := mergeArgs(args, cl.Scheduler().ExtraArgs(), "cluster.scheduler.extraArgs", nil,
		[]string{"kubeconfig", "authentication-kubeconfig", "authorization-kubeconfig", "config"}); err != nil {
		return component{}, err
	}
	return component{
		name:  "kube-scheduler",
		bin:   c.kubeBinary("kube-scheduler", cl.Scheduler().Image()),
		args:  flagList(args),
		files: map[string][]byte{p("kubeconfig"): kc, p("scheduler-config.yaml"): conf},
	}, nil
}

// schedulerConfig is cluster.scheduler.config with Talos's forced fields.
func schedulerConfig(user map[string]any, kubeconfig string) ([]byte, error) {
	cfg := map[string]any{}
	for k, v := range user {
		cfg[k] = v
	}
	cfg["apiVersion"] = "kubescheduler.config.k8s.io/v1"
	cfg["kind"] = "KubeSchedulerConfiguration"
	conn, _ := cfg["clientConnection"].(map[string]any)
	if conn == nil {
		conn = map[string]any{}
	}
	conn["kubeconfig"] = kubeconfig
	cfg["clientConnection"] = conn
	return yaml.Marshal(cfg)
}

// mergeArgs merges a component's extra args from the machine config over
// Talos's flags: additive ones join Talos's values with a comma, denied
// ones are refused, the rest replace Talos's value.
func mergeArgs(args, extra map[string][]string, field string, additive, denied []string) error {
	for k, v := range extra {
		switch {
		case slices.Contains(denied, k):
			return fmt.Errorf("%s: extra arg %q is not allowed", field, k)
		case slices.Contains(additive, k):
			var vals []string
			for _, s := range append(slices.Clone(args[k]), v...) {
				for _, part := range strings.Split(s, ",") {
					if part = strings.TrimSpace(part); part != "" && !slices.Contains(vals, part) {
						vals = append(vals, part)
					}
				}
			}
			args[k] = []string{strings.Join(vals, ",")}
		default:
			args[k] = v
		}
	}
	return nil
}
