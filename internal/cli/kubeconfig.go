package cli

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig loads the cluster connection the way kubectl does: --kubeconfig
// if given, else $KUBECONFIG (a list of files), else ~/.kube/config, using the
// current context.
func (g *Globals) RESTConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = g.Kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		where := g.Kubeconfig
		if where == "" {
			where = "$KUBECONFIG or ~/.kube/config"
		}
		return nil, fmt.Errorf("load kubeconfig from %s: %w (pass --kubeconfig)", where, err)
	}
	return cfg, nil
}
