#!/usr/bin/env bash
# make bench: every benchmark, ours and its peer side by side, each ending
# in verdict lines (internal/testing/verdict); then one table of all verdicts,
# dated, with the commit. A failing benchmark does not stop the others;
# the script fails at the end if any did. The log is kept in bin/bench.log.
# --no-lab leaves out the lab's benchmarks (27 of the 46 minutes of the
# first whole run, 2026-12-07), and the table says so.
set -uo pipefail
lab=1
case "${1:-}" in
--no-lab) lab=0 ;;
"") ;;
*) echo "usage: hack/bench.sh [--no-lab]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
log=bin/bench.log
mkdir -p bin
: >"$log"
status=0
# -p 1: one package's benchmarks at a time. go test otherwise runs two
# packages' test binaries at once on 2 cores: the DHCP ladder shared
# the machine with the bootstrap's benchmarks, the operator's with the
# mirror's, and their figures depended on what ran beside them.
go_test() {
	"${GO:-go}" test -p 1 -count=1 -v "$@" 2>&1 | grep --line-buffered -v -e '^=== RUN' -e '^--- PASS' | tee -a "$log"
	[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

hack/install-deps.sh bench || exit 1
KUBEBUILDER_ASSETS="$(hack/envtest-assets.sh)" || exit 1
export KUBEBUILDER_ASSETS
COZY_LAB_IMAGES="$(hack/lab-images.sh)" || exit 1
export COZY_LAB_IMAGES
go_test -tags 'integration bench' -timeout 30m -run 'Bench' ./pxe/ ./bootstrap/ ./operators/tenantcluster/ ./images/
# A tenant: Kamaji on the process tier's nodes, a worker VM of Cozy's
# image under TCG (the Kubernetes version Kamaji v1.0.0 serves, from make).
COZY_NODE_ASSETS="$(hack/node-assets.sh)" COZY_KAMAJI="$(hack/kamaji.sh)" COZY_CAPI_BIN="$(hack/capi-controllers.sh)" \
	COZY_KAMAJI_WORKER_IMAGE="$(hack/worker-image.sh "${KAMAJI_K8S:?set by make bench}")" \
	go_test -tags 'integration bench' -timeout 30m -run 'TestBenchKamajiTenant$' ./lab/talosnode/
if [ "$lab" = 1 ]; then
	COZY_BOOT_ASSETS="$(hack/boot-assets.sh)" COZY_NODE_ASSETS="$(hack/node-assets.sh)" \
		COZY_NODE_BINARY="$PWD/bin/cozy-talos-node" \
		go_test -tags 'integration lab bench' -timeout 100m -run 'TestBenchLab' ./lab/
fi

echo
echo "## make bench, $(date -u +%Y-%m-%d) at $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with local changes)'), $(nproc) cores$([ "$lab" = 1 ] || echo ', without the lab (--no-lab)')"
echo
echo "| benchmark | measured | goal | verdict |"
echo "|---|---|---|---|"
grep '^verdict | ' "$log" | sed 's/^verdict | /| /; s/$/ |/'
if ! grep -q '^verdict | ' "$log"; then
	echo "no benchmark reached its verdict"
	status=1
fi
exit $status
