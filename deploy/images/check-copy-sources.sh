#!/usr/bin/env bash
# Checks that every COPY/ADD source of the given Dockerfiles exists in the build
# context (the repository root), so that `docker build` would find it. Sources
# copied from another stage (--from=) are skipped. No container engine needed.
set -euo pipefail
ctx=${CONTEXT:-.}
rc=0
for df in "$@"; do
  n=0
  # Join continuation lines, then take COPY/ADD instructions.
  while read -r instr rest; do
    case "${instr^^}" in COPY|ADD) ;; *) continue ;; esac
    read -r -a words <<<"$rest"
    srcs=()
    for w in "${words[@]}"; do
      case "$w" in --from=*) srcs=(); continue 2 ;; --*) continue ;; esac
      srcs+=("$w")
    done
    unset 'srcs[${#srcs[@]}-1]' # the last word is the destination
    for s in "${srcs[@]}"; do
      n=$((n+1))
      if compgen -G "$ctx/$s" >/dev/null; then
        echo "ok   $df: $s"
      else
        echo "MISSING $df: $s (run make build-static / make build-windows first)" >&2
        rc=1
      fi
    done
  done < <(sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' "$df")
  if [ "$n" -eq 0 ]; then echo "$df: no COPY/ADD source found" >&2; rc=1; fi
done
exit $rc
