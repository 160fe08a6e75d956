#!/usr/bin/env bash
# Builds kubelet, kube-apiserver, kube-scheduler, etcd and fakecri from the Go module
# proxy (module test/e2e/k8s) into a cache directory keyed by version. Idempotent: skips the build
# when every binary is already cached. Prints the binary directory on stdout.
#
#   EPHEMERA_E2E_CACHE     cache base (default /var/cache/ephemera-e2e)
#   EPHEMERA_E2E_REBUILD=1 forces a rebuild
#
# Concurrent calls for the same cache directory build once: the others wait on
# $out.lock (flock) and then find the binaries cached.
set -euo pipefail

K8S_VERSION=v1.34.4
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${EPHEMERA_E2E_CACHE:-/var/cache/ephemera-e2e}"
# The key includes a hash of the module files so a change of pins (or of the
# commands tools.go pins) rebuilds.
modhash="$(cat "$here/k8s/go.mod" "$here/k8s/go.sum" "$here/k8s/tools.go" "$here/k8s/cmd/"*/*.go | sha256sum | cut -c1-12)"
out="$cache/k8s-${K8S_VERSION}-${modhash}"
bins=(kubelet kube-apiserver kube-scheduler etcd fakecri)

have_all() {
	local b
	for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || return 1; done
}

if [[ "${EPHEMERA_E2E_REBUILD:-0}" != 1 ]] && have_all; then
	echo "build-k8s: cached in $out" >&2
	echo "$out"
	exit 0
fi

mkdir -p "$cache"
# One build per cache directory at a time: make test starts this script in the
# background at its beginning, and make e2e's call then waits here for it.
exec 9>"$out.lock"
if ! flock -n 9; then
	echo "build-k8s: another build-k8s.sh is building $out; waiting for it" >&2
	wait_start=$(date +%s)
	flock 9
	echo "build-k8s: waited $(( $(date +%s) - wait_start ))s" >&2
	if [[ "${EPHEMERA_E2E_REBUILD:-0}" != 1 ]] && have_all; then
		echo "$out"
		exit 0
	fi
fi
tmp="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 143' TERM INT

minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION}"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"

echo "build-k8s: building ${bins[*]} ${K8S_VERSION} into $out (cold: 11-20 min on 2 cores)" >&2
start=$(date +%s)
(
	cd "$here/k8s"
	# One go build shares the package graph between all binaries.
	GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
		k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
		./cmd/etcd ./cmd/fakecri
)
for b in "${bins[@]}"; do [[ -x "$tmp/$b" ]] || { echo "build-k8s: $b missing" >&2; exit 1; }; done
chmod 755 "$tmp"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build-k8s: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
