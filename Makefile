# Cozy's build. `make help` lists the targets.
#
# Tools built for tests (envtest's kube-apiserver and etcd, Flux's
# controllers, Cluster API's core manager, staticcheck) are cached outside
# the clone, in $(COZY_CACHE_DIR), keyed by version.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export GOTOOLCHAIN := local
export COZY_CACHE_DIR ?= $(HOME)/.cache/cozy

GO          ?= go
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT      ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS     := -X cozy.dev/cozy/internal/version.Version=$(VERSION) -X cozy.dev/cozy/internal/version.Commit=$(COMMIT)
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(COZY_CACHE_DIR)/tools/staticcheck-$(STATICCHECK_VERSION)/staticcheck
TEST_FLAGS  ?= -count=1 -timeout=20m
# Every build, test, go vet and staticcheck here compiles static and
# -trimpath, and so do the binaries the tests build (cozyctl, the node
# image's cozy-talos-node, the operator image's binary): a cold CI then
# compiles the module's dependencies once instead of once per set of flags.
GO_ENV := CGO_ENABLED=0 GOFLAGS='-trimpath $(GOFLAGS)'
# The Kubernetes version `make e2e` upgrades from (a second build of
# hack/envtest-assets.sh): one minor below the default build.
K8S_PREVIOUS ?= v1.35.4
# The Kubernetes version `make worker-image` builds the tenant worker image for.
K8S_VERSION ?= v1.36.3
# The Kubernetes version of the tenant Kamaji runs in `make e2e`: the newest
# Kamaji v1.0.0 serves (hack/kamaji.sh).
KAMAJI_K8S := v1.30.2

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / { printf "  %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/cozyctl, bin/cozy-operator and bin/cozy-talos-node (static, stripped: the lab's node image carries it)
	$(GO_ENV) $(GO) build -ldflags '$(LDFLAGS)' -o bin/cozyctl ./cmd/cozyctl
	$(GO_ENV) $(GO) build -ldflags '$(LDFLAGS)' -o bin/cozy-operator ./cmd/cozy-operator
	$(GO_ENV) $(GO) build -ldflags '-s -w $(LDFLAGS)' -o bin/cozy-talos-node ./cmd/cozy-talos-node

# The operator image's name: the chart's image.repository and appVersion,
# which the chart's Deployment pulls by default; `cozyctl images mirror
# --from bin/cozy-operator-image.tar` pushes it under that name.
IMAGE_REPOSITORY ?= $(shell awk '/^image:/ {i=1} i && $$1 == "repository:" {print $$2; exit}' charts/cozy-operator/values.yaml)
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/cozy-operator/Chart.yaml)

.PHONY: image
image: ## Build the cozy-operator image as an OCI archive, bin/cozy-operator-image.tar (docs/tenants.md#the-operator-image)
	$(GO_ENV) GOOS=linux GOARCH=amd64 $(GO) build -ldflags '-s -w $(LDFLAGS)' -o bin/linux-amd64/cozy-operator ./cmd/cozy-operator
	SOURCE_DATE_EPOCH="$$(git log -1 --format=%ct 2>/dev/null || echo 0)" $(GO) run ./hack/ociimage \
		-o bin/cozy-operator-image.tar -binary bin/linux-amd64/cozy-operator -path /cozy-operator -tag $(IMAGE_REPOSITORY):$(IMAGE_TAG) \
		-label org.opencontainers.image.title=cozy-operator -label org.opencontainers.image.version=$(VERSION) \
		-label org.opencontainers.image.revision=$(COMMIT)

.PHONY: deps
deps: ## Install the Debian packages the tests need (as root), or say which are missing
	hack/install-deps.sh

.PHONY: envtest
envtest: ## Build (once, cached) the kube-apiserver and etcd used by integration tests
	hack/envtest-assets.sh >/dev/null

.PHONY: flux
flux: ## Build (once, cached) Flux's source, kustomize and helm controllers for the platform's reconcile test
	hack/flux-controllers.sh >/dev/null

.PHONY: capi
capi: ## Build (once, cached) the Cluster API core and kubeadm bootstrap managers for the tenant integration tests
	hack/capi-controllers.sh >/dev/null

.PHONY: kamaji
kamaji: ## Build (once, cached) Kamaji v1.0.0, the Kamaji control-plane provider ported to it, its DataStore's etcd, and the images of those, of Cluster API's managers and of its tenants' control planes (Kubernetes v1.30.2, Konnectivity), for make e2e and make bench
	hack/kamaji.sh >/dev/null

.PHONY: kube-ovn
kube-ovn: ## Build (once, cached) Kube-OVN's image from its module with Debian 13's Open vSwitch and OVN, for make e2e
	hack/kube-ovn.sh >/dev/null

.PHONY: unit
unit: ## Unit tests: fast, no root, no API server
	$(GO_ENV) $(GO) test $(TEST_FLAGS) ./...

.PHONY: node
node: envtest ## Build (once, cached) containerd, the CNI plugins, the images the nodes pull (pause, CoreDNS, flannel, kube-proxy, busybox) and the platform's (Flux, MetalLB)
	hack/node-assets.sh >/dev/null
	hack/lab-images.sh >/dev/null
	hack/platform-images.sh >/dev/null

# What the tests that run nodes need, built and cached by the hack scripts.
NODE_ENV = KUBEBUILDER_ASSETS="$$(hack/envtest-assets.sh)" COZY_BOOT_ASSETS="$$(hack/boot-assets.sh)" \
	COZY_NODE_ASSETS="$$(hack/node-assets.sh)" COZY_LAB_IMAGES="$$(hack/lab-images.sh)" \
	COZY_PLATFORM_IMAGES="$$(hack/platform-images.sh)"

.PHONY: test
test: envtest flux capi node ## Unit and integration tests: real kube-apiserver + etcd, Flux and Cluster API controllers, a cluster of emulated nodes in namespaces, QEMU netboot (root)
	$(NODE_ENV) COZY_BOOT_ASSETS_ARM64="$$(hack/boot-assets.sh arm64)" \
		COZY_FLUX_BIN="$$(hack/flux-controllers.sh)" COZY_CAPI_BIN="$$(hack/capi-controllers.sh)" \
		$(GO_ENV) $(GO) test -tags integration $(TEST_FLAGS) ./...

.PHONY: lab
lab: deps build ## Run the lab: 3 QEMU VMs netbooted and bootstrapped into a Kubernetes cluster (root; installs its Debian packages, builds what it runs the first time)
	bin/cozyctl lab up $(LAB_FLAGS)

.PHONY: lab-test
lab-test: build envtest node ## The lab end to end: 3 VMs (BIOS and UEFI) netbooted and bootstrapped under TCG, node services off, checked phase by phase (root)
	$(NODE_ENV) COZY_NODE_BINARY="$$PWD/bin/cozy-talos-node" \
		$(GO_ENV) $(GO) test -tags 'integration lab' -count=1 -timeout 35m -run 'TestLab$$' -v ./lab/

.PHONY: worker-image
worker-image: ## Build Cozy's tenant worker image (KubeVirt containerDisk) for Kubernetes $(K8S_VERSION) and print its OCI layout (hack/worker-image.sh)
	hack/worker-image.sh $(K8S_VERSION)

.PHONY: e2e
e2e: build image envtest flux capi node kamaji kube-ovn ## Beyond CI's time: the lab with real nodes under TCG (2 VMs to Ready Nodes, CoreDNS, probe pods across them), the lab's platform (1 VM, Flux installs MetalLB, a LoadBalancer Service answers on the bridge), Kube-OVN's control plane from the image Cozy builds (Debian's OVN, programmed by Kube-OVN's controller against a real API server), a Kubernetes upgrade across two builds (1.35.4 to 1.36.3), and Kamaji serving a tenant control plane on the process tier's nodes from cozy-operator's objects through Cluster API, the Kamaji provider and CAPK, which a worker VM of Cozy's image joins and runs pods on, pulling through the mirror, its logs and exec through Konnectivity, then cozy-operator, deployed from its chart and image as a pod, bringing a TenantCluster to Ready (root)
	$(NODE_ENV) COZY_NODE_BINARY="$$PWD/bin/cozy-talos-node" \
		$(GO_ENV) $(GO) test -tags 'integration lab' -count=1 -timeout 65m -run 'TestLabNodes$$' -v ./lab/
	$(NODE_ENV) COZY_NODE_BINARY="$$PWD/bin/cozy-talos-node" COZY_FLUX_BIN="$$(hack/flux-controllers.sh)" \
		$(GO_ENV) $(GO) test -tags 'integration lab' -count=1 -timeout 90m -run 'TestLabPlatform$$' -v ./lab/
	KUBEBUILDER_ASSETS="$$(hack/envtest-assets.sh)" COZY_KUBE_OVN_IMAGE="$$(hack/kube-ovn.sh)" \
		$(GO_ENV) $(GO) test -tags 'integration e2e' -count=1 -timeout 10m -run 'TestKubeOVNImage$$' -v ./hack/kubeovnimage/
	$(NODE_ENV) COZY_K8S_PREVIOUS="$$(hack/envtest-assets.sh $(K8S_PREVIOUS))" \
		$(GO_ENV) $(GO) test -tags 'integration e2e' -count=1 -timeout 20m -run 'TestKubernetesUpgradeVersions$$' -v ./bootstrap/
	$(NODE_ENV) COZY_KAMAJI="$$(hack/kamaji.sh)" COZY_CAPI_BIN="$$(hack/capi-controllers.sh)" \
		COZY_KAMAJI_WORKER_IMAGE="$$(hack/worker-image.sh $(KAMAJI_K8S))" COZY_TENANT_WORKER_IMAGE="$$(hack/worker-image.sh $(K8S_VERSION))" \
		COZY_OPERATOR_IMAGE="$$PWD/bin/cozy-operator-image.tar" \
		$(GO_ENV) $(GO) test -tags 'integration e2e' -count=1 -timeout 30m -run 'TestKamajiServesATenant$$' -v ./lab/talosnode/

.PHONY: bench
bench: build envtest capi node kamaji ## Benchmarks, ours and peers side by side in one run, each with its goal and verdict, then a table of all verdicts (root; installs the peers)
	GO=$(GO) KAMAJI_K8S=$(KAMAJI_K8S) hack/bench.sh

.PHONY: microbench
microbench: ## Go microbenchmarks of the netboot server's hot paths (diagnostics for profiling, no goals)
	$(GO) test -run '^$$' -bench . -benchmem ./pxe/...

.PHONY: generate
generate: ## Regenerate the TenantCluster API's deepcopy code and CRD (controller-gen, cached)
	hack/generate.sh

.PHONY: fmt
fmt: ## Check formatting (gofmt) and that go.mod/go.sum are tidy
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; \
	if [[ -n "$$out" ]]; then echo "gofmt needed (run: gofmt -w $$out)" >&2; exit 1; fi
	$(GO) mod tidy -diff

$(STATICCHECK):
	GOBIN="$(dir $@)" GOFLAGS= $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

.PHONY: lint
# Every build tag in the tree is positive (integration, lab, bench, e2e), so
# one pass with all of them reads every file.
lint: $(STATICCHECK) ## go vet and staticcheck over every file (all build tags); generated files up to date
	hack/generate.sh --check
	$(GO_ENV) $(GO) vet -tags 'integration lab bench e2e' ./...
	$(GO_ENV) $(STATICCHECK) -tags 'integration lab bench e2e' ./...

.PHONY: check
check: deps fmt lint test lab-test ## Everything CI runs: the README's test command
