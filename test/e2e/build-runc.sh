#!/usr/bin/env bash
# Builds runc from the Go module proxy (module test/e2e/runc) into a cache
# directory keyed by version and a hash of the module files, like
# build-containerd.sh. Only the user-namespace scenarios (TestUserNamespaces) run
# it, through the containerd runtime handler "runc-userns" and the RuntimeClass of
# the same name: Debian 12's runc 1.1.5, which every other scenario runs, cannot
# make the ID-mapped mounts a pod with hostUsers: false needs (runc >= 1.2).
# Idempotent: skips the build when the binary is cached. Prints the binary
# directory on stdout.
#
#   EPHEMERA_E2E_CACHE     cache base (default /var/cache/ephemera-e2e)
#   EPHEMERA_E2E_REBUILD=1 forces a rebuild
#
# Needs cgo (runc's nsenter is C) and Debian's libseccomp-dev with pkg-config
# (install-deps.sh): built with upstream's tags seccomp and urfave_cli_no_docs,
# without libpathrs (a Rust library Debian 12 does not ship; runc then uses its
# Go fallback, pathrs-lite).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${EPHEMERA_E2E_CACHE:-/var/cache/ephemera-e2e}"
mod="$here/runc"
version="$(awk '{ if ($1 == "require") $0 = substr($0, 9) } $1 == "github.com/opencontainers/runc" && $2 ~ /^v1\./ { print $2; exit }' "$mod/go.mod")"
[[ -n "$version" ]] || { echo "build-runc: no github.com/opencontainers/runc in $mod/go.mod" >&2; exit 1; }

modhash="$(cat "$mod/go.mod" "$mod/go.sum" "$mod/tools.go" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
out="$cache/runc-${version}-${modhash}"

if [[ "${EPHEMERA_E2E_REBUILD:-0}" != 1 ]] && [[ -x "$out/runc" ]]; then
	echo "build-runc: cached in $out" >&2
	echo "$out"
	exit 0
fi
if ! pkg-config --exists libseccomp 2>/dev/null; then
	echo "build-runc: libseccomp's headers are missing (pkg-config libseccomp): run test/e2e/install-deps.sh (Debian's libseccomp-dev, pkg-config)" >&2
	exit 1
fi

mkdir -p "$cache"
# One build per cache directory at a time (a second caller waits, then finds it).
exec 9>"$out.lock"
if ! flock -n 9; then
	echo "build-runc: another build-runc.sh is building $out; waiting for it" >&2
	flock 9
	if [[ "${EPHEMERA_E2E_REBUILD:-0}" != 1 ]] && [[ -x "$out/runc" ]]; then
		echo "$out"
		exit 0
	fi
fi
tmp="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 143' TERM INT

echo "build-runc: building runc ${version} into $out (cold: about 1 min on 2 cores)" >&2
start=$(date +%s)
(
	cd "$mod"
	# The version comes from runc's embedded VERSION file; gitCommit names the source.
	GOFLAGS=-mod=readonly CGO_ENABLED=1 go build -trimpath -buildmode=pie \
		-tags "seccomp urfave_cli_no_docs" \
		-ldflags "-s -w -X main.gitCommit=module-proxy-${version}" \
		-o "$tmp/runc" github.com/opencontainers/runc
)
"$tmp/runc" --version >&2
chmod 755 "$tmp"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build-runc: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
