package tenantcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// writer sends children to the API server the way that costs it least
// (TestBenchRequestCosts measures each choice):
//   - the body as JSON, built from our own types;
//   - fieldValidation=Ignore, so the server decodes the body once, not a
//     second time in strict mode: the builders only produce typed
//     fields, and TestServerAcceptsChildren checks every child strictly;
//   - only the object's metadata back (as=PartialObjectMetadata, in
//     protobuf), since the operator reads nothing else from a reply; the
//     server encodes less and the operator decodes less.
//
// controller-runtime's client can do none of the last two.
type writer struct {
	rest   rest.Interface
	mapper apimeta.RESTMapper
	// collections caches each kind's collection path and scope: the
	// mapper takes a lock and walks its lists on every call, a cost
	// the operator's profile showed on each of a cluster's writes.
	collections sync.Map // schema.GroupVersionKind → collection
}

// collection is where a kind's objects live: /apis/GROUP/VERSION (or
// /api/VERSION), [namespaces/NS/,] RESOURCE.
type collection struct {
	prefix, resource string
	namespaced       bool
}

// metadataOnly asks for the reply as PartialObjectMetadata, protobuf
// first (it is a built-in type even for custom resources).
const metadataOnly = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1," +
	"application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"

// newWriter makes a writer that shares httpClient (and so its
// connection to the API server) with the manager's clients.
func newWriter(cfg *rest.Config, httpClient *http.Client, mapper apimeta.RESTMapper) (*writer, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.AcceptContentTypes = metadataOnly
	cfg.ContentType = "application/json"
	// Decodes PartialObjectMetadata and Status (the errors).
	cfg.NegotiatedSerializer = metainternalversionscheme.Codecs.WithoutConversion()
	// Every request names its full path; these are never used.
	cfg.GroupVersion = &schema.GroupVersion{}
	cfg.APIPath = "/"
	rc, err := rest.RESTClientForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("client for children: %w", err)
	}
	return &writer{rest: rc, mapper: mapper}, nil
}

// create POSTs u and returns its generation.
func (w *writer) create(ctx context.Context, u *unstructured.Unstructured) (int64, error) {
	return w.send(ctx, u, false, func(path string) *rest.Request {
		return w.rest.Post().AbsPath(path).SetHeader("Content-Type", "application/json")
	})
}

// apply server-side applies u as FieldOwner, taking over conflicting
// fields, and returns its generation.
func (w *writer) apply(ctx context.Context, u *unstructured.Unstructured) (int64, error) {
	return w.send(ctx, u, true, func(path string) *rest.Request {
		return w.rest.Patch(types.ApplyPatchType).AbsPath(path).Param("force", "true")
	})
}

// send sends u as the body of the request that req makes for u's path
// (its own with named, else its collection's), as FieldOwner, and
// returns the generation in the reply.
func (w *writer) send(ctx context.Context, u *unstructured.Unstructured, named bool, req func(path string) *rest.Request) (int64, error) {
	path, err := w.path(u, named)
	if err != nil {
		return 0, err
	}
	body, err := json.Marshal(u.Object)
	if err != nil {
		return 0, err
	}
	out := &metav1.PartialObjectMetadata{}
	err = req(path).
		Param("fieldManager", FieldOwner).
		Param("fieldValidation", metav1.FieldValidationIgnore).
		Body(body).Do(ctx).Into(out)
	return out.Generation, err
}

// path is u's collection URL, or u's own with named.
func (w *writer) path(u *unstructured.Unstructured, named bool) (string, error) {
	c, err := w.collection(u.GroupVersionKind())
	if err != nil {
		return "", err
	}
	p := c.prefix
	if c.namespaced {
		p += "/namespaces/" + u.GetNamespace()
	}
	p += "/" + c.resource
	if named {
		p += "/" + u.GetName()
	}
	return p, nil
}

// collection maps a kind once; a kind the mapper does not know is asked
// again next time (its CRD may come later).
func (w *writer) collection(gvk schema.GroupVersionKind) (collection, error) {
	if c, ok := w.collections.Load(gvk); ok {
		return c.(collection), nil
	}
	m, err := w.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return collection{}, err
	}
	c := collection{
		prefix:     "/apis/" + gvk.Group + "/" + gvk.Version,
		resource:   m.Resource.Resource,
		namespaced: m.Scope.Name() == apimeta.RESTScopeNameNamespace,
	}
	if gvk.Group == "" {
		c.prefix = "/api/" + gvk.Version
	}
	w.collections.Store(gvk, c)
	return c, nil
}
