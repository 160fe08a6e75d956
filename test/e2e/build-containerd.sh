#!/usr/bin/env bash
# Builds containerd 2, containerd-shim-runc-v2 and ctr from the Go module proxy (module
# test/e2e/containerd) into a cache directory keyed by version and a hash of the module
# files, like build-k8s.sh. Idempotent: skips the build when every binary is already
# cached. Prints the binary directory on stdout. runc stays Debian's (install-deps.sh).
#
#   EPHEMERA_E2E_CACHE     cache base (default /var/cache/ephemera-e2e)
#   EPHEMERA_E2E_REBUILD=1 forces a rebuild
#
# Concurrent calls for the same cache directory build once: the others wait on
# $out.lock (flock) and then find the binaries cached.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${EPHEMERA_E2E_CACHE:-/var/cache/ephemera-e2e}"
mod="$here/containerd"
version="$(awk '{ if ($1 == "require") $0 = substr($0, 9) } $1 == "github.com/containerd/containerd/v2" && $2 ~ /^v2\./ { print $2; exit }' "$mod/go.mod")"
[[ -n "$version" ]] || { echo "build-containerd: no github.com/containerd/containerd/v2 in $mod/go.mod" >&2; exit 1; }

modhash="$(cat "$mod/go.mod" "$mod/go.sum" "$mod/tools.go" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
out="$cache/containerd-${version}-${modhash}"
bins=(containerd containerd-shim-runc-v2 ctr)

have_all() {
	local b
	for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || return 1; done
}

if [[ "${EPHEMERA_E2E_REBUILD:-0}" != 1 ]] && have_all; then
	echo "build-containerd: cached in $out" >&2
	echo "$out"
	exit 0
fi

mkdir -p "$cache"
# One build per cache directory at a time: make test starts this script in the
# background beside build-k8s.sh, and make e2e's call then waits here for it.
exec 9>"$out.lock"
if ! flock -n 9; then
	echo "build-containerd: another build-containerd.sh is building $out; waiting for it" >&2
	wait_start=$(date +%s)
	flock 9
	echo "build-containerd: waited $(( $(date +%s) - wait_start ))s" >&2
	if [[ "${EPHEMERA_E2E_REBUILD:-0}" != 1 ]] && have_all; then
		echo "$out"
		exit 0
	fi
fi
tmp="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 143' TERM INT

pkg=github.com/containerd/containerd/v2
ldflags="-s -w -X $pkg/version.Version=${version} -X $pkg/version.Revision=module-proxy -X $pkg/version.Package=github.com/containerd/containerd"
# CGO off, as upstream builds the shim: the btrfs snapshotter needs cgo and the
# harness's config disables it with devmapper and zfs, so their plugins are left out
# (upstream's build tags no_btrfs, no_devmapper, no_zfs); urfave_cli_no_docs as
# upstream's Makefile sets it.
tags="urfave_cli_no_docs no_btrfs no_devmapper no_zfs"

echo "build-containerd: building ${bins[*]} ${version} into $out (cold: 2-6 min on 2 cores, depending on the load)" >&2
start=$(date +%s)
(
	cd "$mod"
	# One go build shares the package graph between the three binaries.
	GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/" \
		$pkg/cmd/containerd $pkg/cmd/containerd-shim-runc-v2 $pkg/cmd/ctr
)
for b in "${bins[@]}"; do [[ -x "$tmp/$b" ]] || { echo "build-containerd: $b missing" >&2; exit 1; }; done
chmod 755 "$tmp"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build-containerd: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
