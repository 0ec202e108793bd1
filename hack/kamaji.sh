#!/usr/bin/env bash
# Builds Kamaji from the Go module proxy, and the images it and its
# tenant control planes run, and prints a directory holding
#
#   etcd      etcd v3.6.10 for its DataStore (hack/envtest-assets.sh's)
#   images/   an OCI image layout (as hack/platform-images.sh writes) for
#             `cozyctl images mirror --from`:
#               docker.io/clastix/kamaji:v1.0.0 (the manager, with three
#                 fixes below; CGO_ENABLED=0)
#               registry.k8s.io/kube-apiserver:v1.30.2
#               registry.k8s.io/kube-controller-manager:v1.30.2
#               registry.k8s.io/kube-scheduler:v1.30.2
#               and the same three at v1.36.3 (below)
#               registry.k8s.io/cluster-api/cluster-api-controller:v1.14.2
#               registry.k8s.io/cluster-api/kubeadm-bootstrap-controller:v1.14.2
#                 (hack/capi-controllers.sh's managers)
#               docker.io/clastix/cluster-api-control-plane-provider-kamaji:v0.20.0
#                 (the provider below)
#               registry.k8s.io/kas-network-proxy/proxy-server:V
#               registry.k8s.io/kas-network-proxy/proxy-agent:V
#                 (Konnectivity at cozy-operator's KonnectivityVersion V)
#               quay.io/capk/capk-manager:v0.11.2 (the Cluster API
#                 KubeVirt provider, at the platform's pin)
#
#   hack/kamaji.sh
#
# v1.0.0 is the only Kamaji the module proxy serves (docs/images.md: the
# edge releases the platform pins are refused). Its tenants run at most
# the Kubernetes of its kubeadm library, v1.30.2 (its webhook refuses a
# newer one), so the control-plane images are of that version, built by
# hack/envtest-assets.sh v1.30.2 (one wrapper module, one build cache, as
# for every Kubernetes version Cozy builds).
# Kamaji is built in a wrapper module that requires it and carries its
# go.mod's replace lines (the staging modules at v0.30.2).
#
# A TenantCluster runs v1.34 or newer, past v1.0.0's ceiling, and the
# platform's Kamaji that serves those cannot be built here. So that
# make e2e can show cozy-operator's controller driving a TenantCluster to
# Ready, this build also admits tenants up to tenant_version, with the
# control-plane images of that version (hack/envtest-assets.sh's
# binaries): Kamaji v1.0.0 run past its supported range, as a stand-in
# for the platform's, said so wherever a test relies on it.
#
# The Kamaji control-plane provider v0.20.0 (the version Cozy's CRDs and
# cozy-operator's objects are of) requires a Kamaji pseudo-version the
# proxy refuses; it is built against v1.0.0 (this script's copy) with
# hack/kamajiprovider/kamaji-v1.0.0.patch, which takes out what v1.0.0's
# TenantControlPlane has no field for and makes the provider refuse a
# KamajiControlPlane that sets it (the patch's header lists them).
#
# Cached in $COZY_CACHE_DIR/kamaji/<key>, the key naming both versions,
# ca-certificates' version and a hash of the Go version and of the code
# that builds and packs; built in a temporary directory and renamed into
# place, so an interrupted build never leaves a half-written one.
# Measured on 2 cores (2026-12-06): Kamaji 2 min 39 s with the module
# cache cold for it; Kubernetes v1.30.2 9 min 30 s with its module
# downloaded and the build cache cold; the provider (2026-12-07) 2 min
# 53 s with Kamaji's dependencies cached; Konnectivity v0.34.0 53 s, its
# modules downloaded then, most of its dependencies already built; CAPK
# v0.11.2 1 min 41 s with its modules downloaded (2026-12-07).
#
# Only the directory goes to stdout; progress goes to stderr.
set -euo pipefail

version=v1.0.0
module=github.com/clastix/kamaji
provider_version=v0.20.0
capi_version=v1.14.2 # hack/capi-controllers.sh's, checked below
provider_module=github.com/clastix/cluster-api-control-plane-provider-kamaji
k8s_version=v1.30.2 # Kamaji's upgrade.KubeadmVersion, checked below
etcd_version=v3.6.10  # hack/envtest-assets.sh's default, so that hack/worker-image.sh v1.30.2 shares this build; the tests' DataStore runs it
tenant_version=v1.36.3 # hack/envtest-assets.sh's default Kubernetes: the TenantClusters of make e2e run it
konnectivity_module=sigs.k8s.io/apiserver-network-proxy
capk_version=v0.11.2 # charts/platform's kubevirtInfrastructureProvider, checked below
capk_module=sigs.k8s.io/cluster-api-provider-kubevirt

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -f "$repo/hack/kamajiimages/main.go" ]] || { echo "kamaji: run it from a Cozy source tree" >&2; exit 1; }
# shellcheck source=hack/debroot.sh
source "$repo/hack/debroot.sh"
cache_root="${COZY_CACHE_DIR:-${HOME:-/root}/.cache/cozy}"
(($# == 0)) || { echo "usage: hack/kamaji.sh (prints the directory)" >&2; exit 2; }
log() { echo "kamaji: $*" >&2; }
die() { log "$*"; exit 1; }
for tool in go jq apt-get apt-cache dpkg-deb sha256sum patch; do
	command -v "$tool" >/dev/null || die "$tool is not installed (see hack/install-deps.sh)"
done

ca_deb="$(apt-cache policy ca-certificates | awk '/^  Candidate:/ { print $2 }')"
[[ -n $ca_deb && $ca_deb != "(none)" ]] || die "no candidate for ca-certificates: run apt-get update"
# The Konnectivity version every tenant gets: cozy-operator's, read from
# its source so that the images and the operator cannot disagree.
konnectivity_version="$(sed -n 's/^[[:space:]]*KonnectivityVersion[[:space:]]*= "\(v[0-9.]*\)"$/\1/p' "$repo/operators/tenantcluster/desired.go")"
[[ $konnectivity_version == v* ]] || die "no KonnectivityVersion in operators/tenantcluster/desired.go"
pinned_capk="$(sed -n 's/^[[:space:]]*kubevirtInfrastructureProvider:[[:space:]]*\(v[0-9.]*\)$/\1/p' "$repo/charts/platform/values.yaml")"
[[ $pinned_capk == "$capk_version" ]] || die "charts/platform/values.yaml pins CAPK '$pinned_capk', not $capk_version: update capk_version"
build_hash="$(cd "$repo" && {
	go env GOVERSION
	cat hack/kamaji.sh hack/capi-controllers.sh hack/debroot.sh hack/kamajiimages/main.go hack/kamajiprovider/kamaji-v1.0.0.patch
	ls internal/ociimage/*.go | grep -v _test.go | xargs cat
} | sha256sum | cut -c1-12)"
out="$cache_root/kamaji/${version}_provider-${provider_version}_capi-${capi_version}_k8s-${k8s_version}_konnectivity-${konnectivity_version}_capk-${capk_version}_tenant-${tenant_version}_ca-${ca_deb//[:~+]/_}_build-${build_hash}"
if [[ -x $out/etcd && -f $out/images/index.json ]]; then
	echo "$out"
	exit 0
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
kube="$("$repo/hack/envtest-assets.sh" "$k8s_version" "$etcd_version")"
kube_tenant="$("$repo/hack/envtest-assets.sh" "$tenant_version")"
capi="$("$repo/hack/capi-controllers.sh")"
[[ $(basename "$capi") == "$capi_version" ]] || die "hack/capi-controllers.sh builds $(basename "$capi"), not $capi_version: update capi_version"
mkdir -p "$cache_root/kamaji"
work="$(mktemp -d "$cache_root/kamaji/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log "building Kamaji $version (about 3 minutes cold on 2 cores)"
mod="$work/kamaji"
mkdir -p "$mod"
moddir="$(cd "$mod" && printf 'module x\n' >go.mod && go mod download -json "$module@$version" | jq -r .Dir)"
[[ -d $moddir ]] || die "cannot download $module@$version"
supported="$(sed -n 's/^[[:space:]]*KubeadmVersion = "\(v[0-9.]*\)"$/\1/p' "$moddir/internal/upgrade/kubeadm_version.go")"
[[ $supported == "$k8s_version" ]] || die "Kamaji $version supports Kubernetes '$supported', not $k8s_version: update k8s_version"
# Two defects of v1.0.0 that upstream fixed after it, fixed here in the
# module's copy (each edit must apply, or the build stops):
# - security: each tenant's etcd role was granted the keys from its
#   prefix to "\0", which runs past the prefix, so a tenant's API server
#   could read and write every tenant's keys that sort after its own
#   (TestKamajiServesATenant read a neighbour's Secret that way). The
#   range becomes the prefix's own (etcd's GetPrefixRangeEnd), as in
#   upstream's 1731e8c (2024-08-12); a migration copies the prefix alone.
# - the DataStore Secret's finalizer was removed with an Update that
#   loses to the garbage collector's once the TenantControlPlane is gone
#   (a conflict), and nothing retries: the Secret stayed forever, in 1 of
#   3 runs of that test. A merge patch cannot conflict (upstream retries
#   on conflict instead, #631, 2024-11-12).
# - security: a Secret a DataStore names (its CA, its root client
#   certificate) could be deleted under running tenants. Kamaji's webhook
#   for Secrets is registered for DELETE only, but its handler checks on
#   UPDATE and lets every deletion through (v1.0.0, and upstream's main
#   in 2026 still). Deletions now get that check: refused while a
#   DataStore names the Secret.
src="$work/src"
cp -r "$moddir" "$src"
chmod -R u+w "$src"
fix() { # FILE OLD NEW: the one line of FILE that is OLD becomes NEW
	[[ $(grep -cxF -- "$2" "$src/$1") == 1 ]] || die "$1: no single line '$2': the fix does not apply to $version"
	OLD="$2" NEW="$3" perl -pi -e 'chomp(my $l = $_); $_ = $ENV{NEW} . "\n" if $l eq $ENV{OLD}' "$src/$1"
	[[ $(grep -cxF -- "$3" "$src/$1") == 1 ]] || die "$1: the fix did not apply"
}
fix internal/datastore/etcd.go \
	$'\tif _, err := e.Client.RoleGrantPermission(ctx, user, key, rangeEnd, permission); err != nil {' \
	$'\tif _, err := e.Client.RoleGrantPermission(ctx, user, key, etcdclient.GetPrefixRangeEnd(key), permission); err != nil {'
fix internal/datastore/etcd.go \
	$'\tresponse, err := e.Client.Get(ctx, e.buildKey(fmt.Sprintf("%s_%s", tcp.GetNamespace(), tcp.GetName())), etcdclient.WithRange(rangeEnd))' \
	$'\tresponse, err := e.Client.Get(ctx, e.buildKey(fmt.Sprintf("%s_%s", tcp.GetNamespace(), tcp.GetName())), etcdclient.WithPrefix())'
# One line, so that fix can apply it: OnDelete runs OnUpdate's check,
# and the no-op it was keeps a name nothing calls.
fix internal/webhook/handlers/ds_secrets.go \
	'func (d DataStoreSecretValidation) OnDelete(runtime.Object) AdmissionResponse {' \
	'func (d DataStoreSecretValidation) OnDelete(object runtime.Object) AdmissionResponse { return d.OnUpdate(object, nil) }; func (DataStoreSecretValidation) noDeleteCheck(runtime.Object) AdmissionResponse {'
fix internal/resources/datastore/datastore_storage_config.go \
	$'\tif err := r.Client.Update(ctx, secret); err != nil {' \
	$'\tif err := r.Client.Patch(ctx, secret, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {'
# Not a fix: the ceiling the webhook holds a TenantControlPlane's version
# to (both checks, create and update) becomes tenant_version (above), a
# constant of its own beside KubeadmVersion, which the upgrade code keeps.
[[ $(grep -c 'upgrade.KubeadmVersion' "$src/internal/webhook/handlers/tcp_version.go") == 2 ]] ||
	die "internal/webhook/handlers/tcp_version.go: not two version ceilings: the change does not apply to $version"
printf '\n// TenantCeiling: cozy hack/kamaji.sh admits tenants up to this version.\nconst TenantCeiling = "%s"\n' "$tenant_version" >>"$src/internal/upgrade/kubeadm_version.go"
perl -pi -e 's/upgrade\.KubeadmVersion/upgrade.TenantCeiling/g' "$src/internal/webhook/handlers/tcp_version.go"
[[ $(grep -c 'upgrade.TenantCeiling' "$src/internal/webhook/handlers/tcp_version.go") == 2 ]] ||
	die "internal/webhook/handlers/tcp_version.go: the ceiling did not change"
{
	printf 'module cozy.dev/tools/kamaji\n\ngo 1.26\n\nrequire %s %s\n\nreplace %s %s => ../src\n\n' "$module" "$version" "$module" "$version"
	go mod edit -json "$moddir/go.mod" |
		jq -r '.Replace[]? | select(.New.Version != null) |
			"replace \(.Old.Path)\(if .Old.Version then " " + .Old.Version else "" end) => \(.New.Path) \(.New.Version)"'
} >"$mod/go.mod"
# Upstream's Dockerfile: the version in internal.GitTag.
(cd "$mod" && go build -trimpath -ldflags "-s -w -X $module/internal.GitTag=$version -X $module/internal.GitDirty=" \
	-o "$work/kamaji.bin" "$module" >&2)
"$work/kamaji.bin" manager --help >/dev/null 2>&1 || die "the built Kamaji does not run"

log "building the Kamaji control-plane provider $provider_version against Kamaji $version (about 3 minutes cold)"
pmod="$work/provider"
mkdir -p "$pmod"
pdir="$(cd "$pmod" && printf 'module x\n' >go.mod && go mod download -json "$provider_module@$provider_version" | jq -r .Dir)"
[[ -d $pdir ]] || die "cannot download $provider_module@$provider_version"
cp -r "$pdir" "$work/provider-src"
chmod -R u+w "$work/provider-src"
patch -s -p1 -d "$work/provider-src" <"$repo/hack/kamajiprovider/kamaji-v1.0.0.patch" >&2 ||
	die "hack/kamajiprovider/kamaji-v1.0.0.patch does not apply to $provider_module $provider_version"
# The provider's own replace lines, and Kamaji at this script's copy of
# v1.0.0 in place of the pseudo-version the proxy refuses.
{
	printf 'module cozy.dev/tools/kamaji-provider\n\ngo 1.26\n\nrequire %s %s\n\n' "$provider_module" "$provider_version"
	printf 'replace %s %s => ../provider-src\n\nreplace %s => ../src\n\n' "$provider_module" "$provider_version" "$module"
	go mod edit -json "$pdir/go.mod" |
		jq -r '.Replace[]? | select(.New.Version != null) |
			"replace \(.Old.Path)\(if .Old.Version then " " + .Old.Version else "" end) => \(.New.Path) \(.New.Version)"'
} >"$pmod/go.mod"
(cd "$pmod" && go build -trimpath -ldflags "-s -w" -o "$work/provider.bin" "$provider_module" >&2)
"$work/provider.bin" --help >/dev/null 2>&1 || die "the built Kamaji control-plane provider does not run"

log "building Konnectivity $konnectivity_version (about a minute cold)"
# Its server and agent, from the module's cmd/server and cmd/agent as its
# Dockerfiles build them (CGO_ENABLED=0), with its konnectivity-client at
# the same tag: upstream builds it from the same tree (a replace line).
kmod="$work/konnectivity"
mkdir -p "$kmod"
printf 'module cozy.dev/tools/konnectivity\n\ngo 1.26\n\nrequire (\n\t%s %s\n\t%s/konnectivity-client %s\n)\n' \
	"$konnectivity_module" "$konnectivity_version" "$konnectivity_module" "$konnectivity_version" >"$kmod/go.mod"
mkdir -p "$work/konnectivity-bin"
for cmd in server agent; do
	(cd "$kmod" && go build -trimpath -ldflags "-s -w" -o "$work/konnectivity-bin/proxy-$cmd" "$konnectivity_module/cmd/$cmd" >&2)
	"$work/konnectivity-bin/proxy-$cmd" --help >/dev/null 2>&1 || die "the built proxy-$cmd does not run"
done

log "building CAPK $capk_version (about 2 minutes cold)"
# Its main package at the module's root, as its Dockerfile builds it
# (CGO_ENABLED=0); its go.mod has no replace lines.
cmod="$work/capk"
mkdir -p "$cmod"
printf 'module cozy.dev/tools/capk\n\ngo 1.26\n\nrequire %s %s\n' "$capk_module" "$capk_version" >"$cmod/go.mod"
(cd "$cmod" && go build -trimpath -ldflags "-s -w" -o "$work/capk.bin" "$capk_module" >&2)
"$work/capk.bin" --help >/dev/null 2>&1 || die "the built CAPK does not run"

log "Debian ca-certificates $ca_deb"
debroot "$work" "ca-certificates=$ca_deb"

log "packing the images"
(cd "$repo" && GOFLAGS= go build -o "$work/kamajiimages" ./hack/kamajiimages)
mkdir -p "$work/out"
"$work/kamajiimages" -o "$work/out/images" -debs "$work/debroot" -kamaji "$work/kamaji.bin" -kamaji-tag "$version" \
	-kubernetes "$kube" -kubernetes-version "$k8s_version" -more-kubernetes "$tenant_version=$kube_tenant" \
	-capi "$capi" -capi-version "$capi_version" -provider "$work/provider.bin" -provider-tag "$provider_version" \
	-konnectivity "$work/konnectivity-bin" -konnectivity-version "$konnectivity_version" \
	-capk "$work/capk.bin" -capk-version "$capk_version"
install -m 0755 "$kube/etcd" "$work/out/etcd"
chmod 0755 "$work/out" "$work/out/images"
mv -T "$work/out" "$out" 2>/dev/null || [[ -f "$out/images/index.json" ]] || die "cannot move the build to $out"
echo "$out"
