#!/usr/bin/env bash
# Installs the Debian packages make test needs: the container runtime of the e2e
# tests in containerd mode (containerd + runc), the OCI registry the e2e pushes the
# image to (docker-registry: distribution 2.8), mkfs for the loop backend's tests
# (e2fsprogs, xfsprogs), losetup (util-linux) and protoc (protobuf-compiler: make
# verify regenerates the plugin protocol's Go), and for the user-namespace
# scenarios (TestUserNamespaces) what build-runc.sh needs to build runc >= 1.2
# (gcc, pkg-config, libseccomp-dev) and their pod network's CNI plugins
# (containernetworking-plugins: bridge, host-local, loopback), and dbus-daemon for
# the private system bus of the graceful node shutdown scenario (TestGracefulNodeShutdown,
# test/e2e/logind). Idempotent: does nothing when all are present.
set -euo pipefail
missing=()
for pair in containerd:containerd runc:runc ctr:containerd docker-registry:docker-registry mkfs.ext4:e2fsprogs \
	mkfs.xfs:xfsprogs losetup:util-linux protoc:protobuf-compiler gcc:gcc pkg-config:pkg-config dbus-daemon:dbus-daemon; do
	command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
for pair in /usr/include/seccomp.h:libseccomp-dev /usr/lib/cni/bridge:containernetworking-plugins; do
	[[ -e "${pair%%:*}" ]] || missing+=("${pair#*:}")
done
if [[ ${#missing[@]} == 0 ]]; then
	echo "install-deps: containerd $(containerd --version | awk '{print $3}'), $(runc --version | head -1), docker-registry, mkfs, losetup, protoc, gcc, libseccomp-dev, the CNI plugins and dbus-daemon already installed" >&2
	exit 0
fi
sudo=""
[[ $(id -u) == 0 ]] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u)
$sudo modprobe loop 2>/dev/null || true
# The harness runs its own private containerd and registry; the system services are not needed.
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
	$sudo systemctl disable --now containerd docker-registry >/dev/null 2>&1 || true
fi
echo "install-deps: installed $(containerd --version) / $(runc --version | head -1)" >&2
