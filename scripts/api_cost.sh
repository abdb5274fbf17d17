#!/usr/bin/env bash
# Instructions per task submit and per task read of the tree in the current directory,
# counted by callgrind (deterministic: the figure does not move with the machine's load).
#
#   cd TREE && BERTH_DATABASE_URL=postgresql://... /path/to/scripts/api_cost.sh [N]
#
# Prints "submit <M instructions> read <M instructions>" per request; N requests each (300).
# With BATCHES=B (0), also "batch <M instructions>" per task of B batches of 1,000 specs.
# Needs valgrind and a C compiler (for callgrind's client requests).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
n="${1:-300}"
batches="${BATCHES:-0}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat > "$work/cg.c" <<'C'
#include <valgrind/callgrind.h>
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *s) { CALLGRIND_DUMP_STATS_AT(s); }
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
C
cc -O2 -shared -fPIC -o "$work/cg.so" "$work/cg.c"
PYTHONPATH="$PWD" valgrind --tool=callgrind --instr-atstart=no \
  --callgrind-out-file="$work/out.%p" "$(python -c "import sys; print(sys.executable)")" \
  "$here/api_cost.py" \
  --callgrind "$work/cg.so" --n "$n" --warmup 100 --batches "$batches" > "$work/log" 2>&1 \
  || { cat "$work/log"; exit 1; }
phases="submit read"
[ "$batches" -gt 0 ] && phases="$phases batch"
for phase in $phases; do
  file="$(grep -l "^desc: Trigger: Client Request: $phase" "$work"/out.* | head -1)"
  per="$n"
  [ "$phase" = batch ] && per=$((batches * 1000))
  awk -v n="$per" -v p="$phase" '/^totals:/ {printf "%s %.3f M  ", p, $2 / n / 1e6}' "$file"
  [ -n "${KEEP:-}" ] && cp "$file" "$KEEP.$phase"
done
echo
