package cli

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// RESTConfig loads the cluster connection the way kubectl does: --kubeconfig
// if given, else $KUBECONFIG (a list of files), else ~/.kube/config, using the
// current context.
func (g *Globals) RESTConfig() (*rest.Config, error) {
	cfg, err := g.clientConfig().ClientConfig()
	if err != nil {
		where := g.Kubeconfig
		if where == "" {
			where = "$KUBECONFIG or ~/.kube/config"
		}
		return nil, fmt.Errorf("load kubeconfig from %s: %w (pass --kubeconfig)", where, err)
	}
	return cfg, nil
}

func (g *Globals) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = g.Kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
}

// Client connects to the kubeconfig's cluster; scheme nil means client-go's
// built-in types (unstructured objects work either way).
func (g *Globals) Client(scheme *runtime.Scheme) (client.Client, error) {
	cfg, err := g.RESTConfig()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", cfg.Host, err)
	}
	return c, nil
}
