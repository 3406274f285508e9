#!/usr/bin/env bash
# bench/scale.sh — a year of a busy lab's history (bench/scale_bench.cpp), then every read a
# person or a scraper makes, timed at each size of the ledger, with the growth. One private
# PostgreSQL 15 (bench/pg.sh: its own data directory and port, default settings). Writes
# bench/results/scale-DATE.md (the table) and scale-DATE.jsonl (one JSON line per size).
#
#   bench/scale.sh                                  # 100k, 1M and 10M attempts
#   BENCH_SIZES=100000,1000000 bench/scale.sh       # without the 10M (the load takes longest)
#
# Environment: BENCH_SIZES, BENCH_REPS (5), BENCH_PORT (25441), BENCH_PGDIR
# (/tmp/trnflow-scale-pg), BENCH_BUILD (build).
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${BENCH_SIZES:-100000,1000000,10000000}
reps=${BENCH_REPS:-5}
port=${BENCH_PORT:-25441}
pgdir=${BENCH_PGDIR:-/tmp/trnflow-scale-pg}
build=${BENCH_BUILD:-build}
date=$(date -u +%F)
mkdir -p bench/results
log() { echo "== $(date -u +%T) $*" >&2; }

log "building trnflow and scale_bench"
cmake --build "$build" --target trnflow scale_bench >/dev/null
log "starting a private PostgreSQL in $pgdir on port $port"
url=$(bench/pg.sh start "$pgdir" "$port")
trap 'bench/pg.sh stop "$pgdir" || true' EXIT
export TRNFLOW_TEST_ADMIN_URL=${url%/*}/postgres

out=bench/results/scale-$date
log "sizes $sizes, $reps repetitions of each read (p50 printed)"
"$build/bench/scale_bench" --sizes "$sizes" --reps "$reps" --json 1 >"$out.jsonl" 2>"$out.log"
{
  echo "# Scale benchmark, $date"
  echo
  echo "\`bench/scale.sh\` (sizes $sizes; p50 of $reps after a warm-up; CLI reads are the"
  echo "binary as a person runs it, connection and schema check included; HTTP reads are"
  echo "\`trnflow serve\` answers). Machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB;"
  echo "PostgreSQL 15 with default settings."
  echo
  grep -v '^scale_bench\|^  ' "$out.log" | sed -n '/^| read/,$p'
  echo
  echo "Load:"
  echo
  grep '^scale_bench' "$out.log" | sed 's/^/    /'
} >"$out.md"
log "wrote $out.md"
cat "$out.md"
