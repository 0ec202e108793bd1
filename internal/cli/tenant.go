package cli

import (
	"cmp"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/internal/output"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

func newTenantCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "List tenant clusters, fetch their kubeconfigs, build their worker images",
	}
	cmd.AddCommand(newTenantListCommand(g), newTenantKubeconfigCommand(g), newTenantImageCommand(g))
	return cmd
}

// tenantClient is a client for TenantClusters and Secrets, and the
// namespace of the kubeconfig's context (default "default").
func (g *Globals) tenantClient() (client.Client, string, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	if err := v1.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	c, err := g.Client(scheme)
	if err != nil {
		return nil, "", err
	}
	ns, _, err := g.clientConfig().Namespace()
	if err != nil || ns == "" {
		ns = "default"
	}
	return c, ns, nil
}

// tenantTable is `kubectl get tc` with the namespace.
type tenantTable struct {
	Items []v1.TenantCluster `json:"items"`
	now   time.Time
}

func (t tenantTable) Header() []string {
	return []string{"NAMESPACE", "NAME", "VERSION", "PHASE", "WORKERS", "ENDPOINT", "WAITING", "AGE"}
}

// waiting is what a cluster that is not ready waits on: the first of its
// conditions that is not true, as CONDITION/Reason ("-" when none). The
// condition's message (-o json, kubectl describe) says what to do.
func waiting(tc v1.TenantCluster) string {
	for _, typ := range []string{v1.ConditionControlPlaneReady, v1.ConditionWorkersReady, v1.ConditionAddonsReady} {
		if c := apimeta.FindStatusCondition(tc.Status.Conditions, typ); c != nil && c.Status != metav1.ConditionTrue {
			return typ + "/" + c.Reason
		}
	}
	return "-"
}

func (t tenantTable) Rows() [][]string {
	var rows [][]string
	for _, tc := range t.Items {
		rows = append(rows, []string{
			tc.Namespace, tc.Name, tc.Spec.Version, cmp.Or(string(tc.Status.Phase), "-"),
			cmp.Or(tc.Status.Workers, "-"), cmp.Or(tc.Status.Endpoint, "-"), waiting(tc),
			duration.HumanDuration(t.now.Sub(tc.CreationTimestamp.Time)),
		})
	}
	return rows
}

var _ output.Tabular = tenantTable{}

func newTenantListCommand(g *Globals) *cobra.Command {
	var namespace string
	var all bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List TenantClusters: version, phase, workers ready/desired, endpoint",
		Example: `  cozyctl tenant list -n tenant-acme
  cozyctl tenant list -A -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ns, err := g.tenantClient()
			if err != nil {
				return err
			}
			var opts []client.ListOption
			if !all {
				opts = append(opts, client.InNamespace(cmp.Or(namespace, ns)))
			}
			var list v1.TenantClusterList
			if err := c.List(cmd.Context(), &list, opts...); err != nil {
				return fmt.Errorf("list TenantClusters: %w (is the cozy-operator chart, with its CRD, installed?)", err)
			}
			return g.Print(tenantTable{Items: list.Items, now: time.Now()})
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "the tenants' namespace (default: the kubeconfig context's)")
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "list tenants in every namespace")
	return cmd
}

func newTenantKubeconfigCommand(g *Globals) *cobra.Command {
	var namespace string
	cmd := &cobra.Command{
		Use:   "kubeconfig NAME",
		Short: "Print a tenant cluster's admin kubeconfig",
		Long: `Print the admin kubeconfig of the TenantCluster NAME to stdout, from the
Secret its status names (Cluster API's <name>-kubeconfig until it says
otherwise). It is a credential: write it to a file only you can read.`,
		Example: `  (umask 077; cozyctl tenant kubeconfig acme -n tenant-acme > acme.kubeconfig)`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, err := g.tenantClient()
			if err != nil {
				return err
			}
			ns = cmp.Or(namespace, ns)
			ctx := cmd.Context()
			var tc v1.TenantCluster
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: args[0]}, &tc); err != nil {
				if apierrors.IsNotFound(err) {
					return fmt.Errorf("no TenantCluster %s in namespace %s (cozyctl tenant list -A shows them all)", args[0], ns)
				}
				return err
			}
			name := tc.Name + "-kubeconfig"
			if ref := tc.Status.KubeconfigSecretRef; ref != nil && ref.Name != "" {
				name = ref.Name
			}
			var s corev1.Secret
			err = c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s)
			switch {
			case apierrors.IsNotFound(err):
				return fmt.Errorf("TenantCluster %s/%s has no kubeconfig yet (phase %s): the Secret %s appears once its control plane is up", ns, tc.Name, cmp.Or(string(tc.Status.Phase), "unknown"), name)
			case err != nil:
				return err
			}
			data := s.Data["value"]
			if len(data) == 0 {
				return fmt.Errorf("the Secret %s/%s has no key \"value\"", ns, name)
			}
			_, err = cmd.OutOrStdout().Write(data)
			return err
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "the tenant's namespace (default: the kubeconfig context's)")
	return cmd
}
