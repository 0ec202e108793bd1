#!/usr/bin/env bash
# Generates the TenantCluster API's deepcopy functions and its CRD (into
# charts/cozy-operator/crds, where Helm and Flux install it from) with
# controller-gen, built once from the Go module proxy and cached.
#
#   hack/generate.sh          write the generated files
#   hack/generate.sh --check  fail if they are not what the types generate
set -euo pipefail
cd "$(dirname "$0")/.."

version=v0.23.0
cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
bin="$cache_root/tools/controller-gen-$version/controller-gen"
if ! [[ -x $bin ]]; then
	echo "generate: building controller-gen $version" >&2
	GOFLAGS= GOTOOLCHAIN=local GOBIN="$(dirname "$bin")" go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$version"
fi

crds=charts/cozy-operator/crds
out="$crds"
if [[ ${1:-} == --check ]]; then
	out="$(mktemp -d)"
	trap 'rm -rf "$out"' EXIT
	cp operators/api/v1alpha1/zz_generated.deepcopy.go "$out/deepcopy.go.orig"
fi
"$bin" object paths=./operators/api/... crd:crdVersions=v1 output:crd:dir="$out"
if [[ ${1:-} == --check ]]; then
	status=0
	if [[ "$(cd "$out" && ls ./*.yaml)" != "$(cd "$crds" && ls ./*.yaml)" ]]; then
		echo "generate: $crds does not hold exactly the generated CRDs" >&2
		status=1
	fi
	for f in "$out"/*.yaml; do
		if ! diff -u "$crds/$(basename "$f")" "$f"; then status=1; fi
	done
	if ! diff -u "$out/deepcopy.go.orig" operators/api/v1alpha1/zz_generated.deepcopy.go; then
		cp "$out/deepcopy.go.orig" operators/api/v1alpha1/zz_generated.deepcopy.go
		status=1
	fi
	if ((status)); then
		echo "generate: generated files are stale; run hack/generate.sh (make generate) and commit" >&2
	fi
	exit $status
fi
