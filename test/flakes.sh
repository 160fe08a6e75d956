#!/usr/bin/env bash
# make test-flakes: runs the timing-sensitive packages FLAKE_COUNT times in a row under
# -race beside a busy loop on every core, so that a test that waits on time instead of a
# condition fails here, not in a CI run (issue 48). Not part of make test. Root (the
# packages mount tmpfs and loop devices).
#
#   FLAKE_COUNT  runs of each test (go test -count; default 20)
#   FLAKE_PKGS   packages (default: framework, framework/internal/..., framework/drivertest,
#                test/security, kubectl-ephemera)
#   FLAKE_RUN    a -run pattern to narrow it to the tests under suspicion
#   FLAKE_LOAD   busy loops beside the tests (default: one per core; 0: none)
#   GOTESTFLAGS  more go test flags (e.g. -v)
#
# Every package runs to the end (no -failfast: go test would skip the packages after
# the first failure), so a failing test shows how often it fails; the exit code is go
# test's.
set -euo pipefail
cd "$(dirname "$0")/.."

count="${FLAKE_COUNT:-20}"
pkgs="${FLAKE_PKGS:-./framework/ ./framework/internal/... ./framework/drivertest/ ./test/security/ ./drivers/scratch/cmd/kubectl-ephemera/}"
load="${FLAKE_LOAD:-$(nproc)}"

busy=()
stop_load() {
	for p in "${busy[@]}"; do kill "$p" 2>/dev/null || true; done
	wait "${busy[@]}" 2>/dev/null || true
}
trap stop_load EXIT
for _ in $(seq 1 "$load"); do
	( trap 'exit 0' TERM; while :; do :; done ) &
	busy+=("$!")
done

echo "test-flakes: -race -count=$count${FLAKE_RUN:+ -run $FLAKE_RUN} beside $load busy loop(s) on $(nproc) core(s): $pkgs"
start=$(date +%s)
rc=0
# shellcheck disable=SC2086 # word splitting of the package list and flags is wanted
go test -race -count="$count" -timeout 180m -tags "${EPHEMERA_GOTAGS:-grpcnotrace}" \
	${FLAKE_RUN:+-run "$FLAKE_RUN"} ${GOTESTFLAGS:-} $pkgs || rc=$?
echo "test-flakes: $(( $(date +%s) - start ))s, exit $rc"
exit "$rc"
