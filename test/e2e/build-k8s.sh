#!/usr/bin/env bash
# Builds kubelet, kube-apiserver, kube-scheduler, kube-controller-manager, etcd and fakecri
# from the Go module proxy (module test/e2e/k8s) into a cache directory keyed by version.
# Idempotent: skips the build when every binary is already cached. Prints the binary
# directory on stdout.
#
#   K8S_VERSION            the Kubernetes release (default: the one k8s/go.mod pins); each
#                          supported minor has its module file: k8s/go.mod for the default,
#                          k8s/v1.MINOR.mod (+ v1.MINOR.sum) for the others, used with -modfile
#   EPHEMERA_E2E_CACHE     cache base (default /var/cache/ephemera-e2e)
#   EPHEMERA_E2E_REBUILD=1 forces a rebuild
#
# With --check it only checks K8S_VERSION (exit 2 with the supported list if unsupported).
#
# Concurrent calls for the same cache directory build once: the others wait on
# $out.lock (flock) and then find the binaries cached.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${EPHEMERA_E2E_CACHE:-/var/cache/ephemera-e2e}"
pinned_in() { awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ { print $2; exit }' "$1"; }
minor_of() { local m="${1#v1.}"; echo "${m%%.*}"; }
default_version="$(pinned_in "$here/k8s/go.mod")"
K8S_VERSION="${K8S_VERSION:-$default_version}"

# The module file of K8S_VERSION's minor, which must pin exactly K8S_VERSION: the
# binaries are what the module file pins, so another patch release needs its file edited.
minor="$(minor_of "$K8S_VERSION")"
modfile="$here/k8s/v1.${minor}.mod"
[[ "$minor" == "$(minor_of "$default_version")" ]] && modfile="$here/k8s/go.mod"
supported() {
	local f v
	for f in "$here/k8s/"v1.*.mod "$here/k8s/go.mod"; do
		[[ -f "$f" ]] || continue
		printf ' %s' "$(pinned_in "$f")"
	done
}
pinned=
[[ -f "$modfile" ]] && pinned="$(pinned_in "$modfile")"
if [[ ! "$K8S_VERSION" =~ ^v1\.[0-9]+\.[0-9]+$ || "$pinned" != "$K8S_VERSION" ]]; then
	echo "build-k8s: K8S_VERSION=$K8S_VERSION is not supported; supported:$(supported)" >&2
	[[ -n "$pinned" ]] && echo "build-k8s: ${modfile#"$here/"} pins $pinned (edit it and its .sum to move v1.$minor)" >&2
	exit 2
fi
sumfile="${modfile%.mod}.sum"
[[ "${1:-}" == --check ]] && exit 0

# The key includes a hash of the module files so a change of pins (or of the
# commands tools.go pins) rebuilds. kube-controller-manager, added later, is pinned
# in tools_controller_manager.go, outside the key: its code is k8s.io/kubernetes at
# the module file's pin, which the key covers, and a cache entry of the others
# built before it stays valid (it gets kube-controller-manager added, below).
modhash="$(cat "$modfile" "$sumfile" "$here/k8s/tools.go" "$here/k8s/cmd/"*/*.go | sha256sum | cut -c1-12)"
out="$cache/k8s-${K8S_VERSION}-${modhash}"
bins=(kubelet kube-apiserver kube-scheduler kube-controller-manager etcd fakecri)
pkgs=(k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler
	k8s.io/kubernetes/cmd/kube-controller-manager ./cmd/etcd ./cmd/fakecri)

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

# An entry with every binary but kube-controller-manager (built before it was
# added) gets only that one, moved in beside the others: the entry stays in place
# for a run that uses it meanwhile.
build=("${bins[@]}")
if [[ "${EPHEMERA_E2E_REBUILD:-0}" != 1 && -d "$out" ]]; then
	build=(kube-controller-manager)
	for b in "${bins[@]}"; do
		[[ "$b" == kube-controller-manager || -x "$out/$b" ]] || build=("${bins[@]}")
	done
	[[ "${#build[@]}" == 1 ]] && pkgs=(k8s.io/kubernetes/cmd/kube-controller-manager)
fi

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION}"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"

echo "build-k8s: building ${build[*]} ${K8S_VERSION} into $out (cold: 7-25 min on 2 cores, depending on the load)" >&2
start=$(date +%s)
(
	cd "$here/k8s"
	# One go build shares the package graph between all binaries.
	GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -modfile="$modfile" -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}"
)
for b in "${build[@]}"; do [[ -x "$tmp/$b" ]] || { echo "build-k8s: $b missing" >&2; exit 1; }; done
if [[ "${#build[@]}" == 1 ]]; then
	mv "$tmp/kube-controller-manager" "$out/"
else
	chmod 755 "$tmp"
	rm -rf "$out"
	mv "$tmp" "$out"
	trap - EXIT
fi
echo "build-k8s: built ${build[*]} in $(( $(date +%s) - start ))s" >&2
echo "$out"
