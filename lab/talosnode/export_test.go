package talosnode

import (
	"bytes"
	"strings"
)

// TenantFlannel is Talos's flannel (its 05-flannel manifests, the lab
// images' flannel) for a cluster of podCIDR whose API flannel reaches at
// host:port directly, as a tenant without kube-proxy needs: the process
// tier's tests give a Kamaji tenant's workers a CNI with it.
func TenantFlannel(podCIDR, host string, port int) ([]byte, error) {
	netConf, err := flannelNetConf([]string{podCIDR})
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := manifestsTemplate.Execute(&out, manifestData{
		Flannel: true, FlannelImage: flannelImage, FlannelNetConf: netConf,
		KubePrismHost: host, KubePrismPort: port,
	}); err != nil {
		return nil, err
	}
	var docs []string
	for _, d := range strings.Split(out.String(), "\n---\n") {
		if strings.HasPrefix(strings.TrimSpace(d), "# 05-flannel") {
			docs = append(docs, d)
		}
	}
	return []byte(strings.Join(docs, "\n---\n") + "\n"), nil
}
