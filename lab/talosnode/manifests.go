package talosnode

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/siderolabs/talos/pkg/machinery/config/config"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

//go:embed manifests.yaml.tmpl
var manifestsTemplateText string

var manifestsTemplate = template.Must(template.New("manifests").Funcs(template.FuncMap{
	"indent": func(n int, s string) string {
		pad := strings.Repeat(" ", n)
		return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
	},
	"quote": strconv.Quote,
}).Parse(manifestsTemplateText))

// flannelVersion is the flannel Talos v1.13.0 deploys (its machinery's
// constants.FlannelVersion), from Talos's own mirror of the image.
const flannelImage = "ghcr.io/siderolabs/flannel:v0.28.4"

// manifestData is what the bootstrap manifests are rendered from.
type manifestData struct {
	TokenID, TokenSecret string
	Server               string
	KubePrismHost        string
	KubePrismPort        int

	Flannel          bool
	FlannelImage     string
	FlannelNetConf   string
	FlannelExtraArgs []string

	Proxy      bool
	ProxyImage string
	ProxyArgs  []string

	CoreDNS           bool
	CoreDNSImage      string
	DNSDomain         string
	DNSServiceIPs     []string
	DNSIPFamilies     []string
	DNSIPFamilyPolicy string
}

// renderManifests renders the bootstrap manifests of a control plane's
// config, as YAML documents in Talos's order.
func renderManifests(mc config.Config) ([]byte, error) {
	cl := mc.Cluster()
	tok := cl.Token()
	if tok == nil || tok.ID() == "" {
		return nil, errors.New("the config has no cluster.token")
	}
	d := manifestData{
		TokenID: tok.ID(), TokenSecret: tok.Secret(),
		Server:    cl.Endpoint().String(),
		DNSDomain: cl.Network().DNSDomain(),
	}
	if kp := mc.Machine().Features().KubePrism(); kp != nil && kp.Enabled() {
		d.Server = "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(kp.Port()))
		d.KubePrismHost, d.KubePrismPort = "127.0.0.1", kp.Port()
	}
	if cni := cl.Network().CNI(); cni != nil && cni.Name() == "flannel" {
		d.Flannel, d.FlannelImage = true, flannelImage
		d.FlannelExtraArgs = cni.Flannel().ExtraArgs()
		netConf, err := flannelNetConf(cl.Network().PodCIDRs())
		if err != nil {
			return nil, err
		}
		d.FlannelNetConf = netConf
	}
	if p := cl.Proxy(); p != nil && p.Enabled() {
		d.Proxy, d.ProxyImage = true, p.Image()
		mode := p.Mode()
		if mode == "" {
			mode = "nftables"
		}
		args := map[string][]string{
			"cluster-cidr":           {strings.Join(cl.Network().PodCIDRs(), ",")},
			"conntrack-max-per-core": {"0"},
			"hostname-override":      {"$(NODE_NAME)"},
			"kubeconfig":             {"/etc/kubernetes/kubeconfig"},
			"proxy-mode":             {mode},
		}
		if err := mergeArgs(args, p.ExtraArgs(), "cluster.proxy.extraArgs", nil, []string{"kubeconfig"}); err != nil {
			return nil, err
		}
		d.ProxyArgs = flagList(args)
	}
	if dns := cl.CoreDNS(); dns != nil && dns.Enabled() {
		d.CoreDNS, d.CoreDNSImage = true, dns.Image()
		ips, err := cl.Network().DNSServiceIPs()
		if err != nil || len(ips) == 0 {
			return nil, fmt.Errorf("CoreDNS service address: %v", err)
		}
		var v4, v6 string
		for _, ip := range ips {
			if ip.Is4() && v4 == "" {
				v4 = ip.String()
			} else if ip.Is6() && v6 == "" {
				v6 = ip.String()
			}
		}
		for _, fam := range []struct{ ip, name string }{{v4, "IPv4"}, {v6, "IPv6"}} {
			if fam.ip != "" {
				d.DNSServiceIPs = append(d.DNSServiceIPs, fam.ip)
				d.DNSIPFamilies = append(d.DNSIPFamilies, fam.name)
			}
		}
		d.DNSIPFamilyPolicy = "SingleStack"
		if len(d.DNSServiceIPs) == 2 {
			d.DNSIPFamilyPolicy = "RequireDualStack"
		}
	}
	var out bytes.Buffer
	if err := manifestsTemplate.Execute(&out, d); err != nil {
		return nil, err
	}
	for _, m := range cl.InlineManifests() {
		fmt.Fprintf(&out, "---\n# 99-%s\n%s\n", m.Name(), strings.TrimSpace(m.Contents()))
	}
	return out.Bytes(), nil
}

// flannelNetConf is flannel's net-conf.json for the pod subnets, as Talos
// writes it: vxlan on port 4789.
func flannelNetConf(podCIDRs []string) (string, error) {
	type backend struct {
		Type string
		Port int
	}
	var conf struct {
		Network     string  `json:",omitempty"`
		IPv6Network string  `json:",omitempty"`
		EnableIPv6  bool    `json:",omitempty"`
		EnableIPv4  *bool   `json:",omitempty"`
		Backend     backend `json:"Backend"`
	}
	for _, c := range podCIDRs {
		if strings.Contains(c, ".") {
			conf.Network = c
		} else {
			conf.IPv6Network, conf.EnableIPv6 = c, true
		}
	}
	if conf.Network == "" {
		conf.EnableIPv4 = new(false)
	}
	conf.Backend = backend{"vxlan", 4789}
	b, err := json.MarshalIndent(conf, "", "  ")
	return string(b), err
}

// manifestObjects decodes rendered manifests: Namespaces first, then
// CRDs, then the rest in order, as Talos applies them.
func manifestObjects(rendered []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(rendered), 4096)
	var objs []*unstructured.Unstructured
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("bootstrap manifests: %w", err)
		}
		if len(u.Object) == 0 {
			continue
		}
		objs = append(objs, &u)
	}
	rank := func(u *unstructured.Unstructured) int {
		switch u.GetObjectKind().GroupVersionKind().GroupKind() {
		case schema.GroupKind{Kind: "Namespace"}:
			return 0
		case schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int { return rank(a) - rank(b) })
	return objs, nil
}

// applyManifests creates every object that does not exist yet and leaves
// the others alone: Talos's bootstrap manifests are create-only, so a
// cluster's operators may change them. It returns how many it created.
func applyManifests(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured) (int, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return 0, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return 0, err
	}
	created := 0
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return created, fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := o.GetNamespace()
			if ns == "" {
				ns = metav1.NamespaceDefault
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		if _, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{}); err == nil {
			continue
		} else if !apierrors.IsNotFound(err) {
			return created, fmt.Errorf("get %s %s: %w", gvk.Kind, o.GetName(), err)
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldManager: "talos"}); err != nil && !apierrors.IsAlreadyExists(err) {
			return created, fmt.Errorf("create %s %s: %w", gvk.Kind, o.GetName(), err)
		}
		created++
	}
	return created, nil
}
