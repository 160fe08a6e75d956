#!/usr/bin/env bash
# Installs the container runtime used by the e2e tests in containerd mode
# (containerd + runc from Debian). Idempotent: does nothing when both are present.
set -euo pipefail
if command -v containerd >/dev/null && command -v runc >/dev/null && command -v ctr >/dev/null; then
	echo "install-deps: containerd $(containerd --version | awk '{print $3}') and $(runc --version | head -1) already installed" >&2
	exit 0
fi
sudo=""
[[ $(id -u) == 0 ]] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends containerd runc
# The harness runs its own private containerd instance; the system service is not needed.
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
	$sudo systemctl disable --now containerd >/dev/null 2>&1 || true
fi
echo "install-deps: installed $(containerd --version) / $(runc --version | head -1)" >&2
