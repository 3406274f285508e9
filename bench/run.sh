#!/usr/bin/env bash
# bench/run.sh — trnflow side by side with graphile-worker and pg-boss, on this machine and
# one private PostgreSQL 15 (its own data directory and port, default settings: fsync and
# synchronous_commit on). Builds what it needs, installs the peers from the npm registry into
# bench/.peers (git-ignored), runs every workload for each system in turn, REPS times, and
# writes bench/results/DATE.md (min / median / max, ratios, where the time goes) and
# bench/results/latest.json (the medians, for scripts).
#
#   bench/run.sh                 # the full run (about 20 minutes on 2 cores)
#   BENCH_QUICK=1 bench/run.sh   # small sizes, one repetition: a smoke test of the harness
#
# Environment: BENCH_REPS (3), BENCH_PORT (25440: below Linux's ephemeral ports, which a
# client socket of another server may hold), BENCH_PGDIR (/tmp/trnflow-bench-pg),
# BENCH_BUILD (build). Each workload is also its own program (build/bench/*_bench,
# bench/peers/*.mjs) for profiling; bench/README.md says how to run one alone.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
reps=${BENCH_REPS:-3}
port=${BENCH_PORT:-25440}
pgdir=${BENCH_PGDIR:-/tmp/trnflow-bench-pg}
build=${BENCH_BUILD:-build}
drain_jobs=200000 pickup_jobs=1000 submit_jobs=10000 dag_stages=10000 report_big=10000000
if [ -n "${BENCH_QUICK:-}" ]; then
  reps=1 drain_jobs=20000 pickup_jobs=200 report_big=1000000
fi
date=$(date -u +%F)
mkdir -p bench/results
raw=bench/results/$date.jsonl
: > "$raw"
log() { echo "== $(date -u +%T) $*" >&2; }

if [ ! -f "$build/build.ninja" ]; then
  log "no build yet: ops/setup.sh installs the toolchain and libraries and builds"
  ops/setup.sh >&2
fi
if ! command -v npm >/dev/null; then
  log "installing Node.js and npm (Debian's; the peers get a newer Node from npm)"
  apt-get install -y nodejs npm >&2
fi
log "building the benchmark programs"
cmake --build "$build" --target trnflow drain_bench dag_bench pickup_bench submit_bench \
  report_bench claim_bench >/dev/null

log "starting a private PostgreSQL in $pgdir on port $port"
url=$(bench/pg.sh start "$pgdir" "$port")
trap 'bench/pg.sh stop "$pgdir" || true' EXIT
export TRNFLOW_TEST_ADMIN_URL=${url%/*}/postgres  # the bench role creates a database per run

log "installing graphile-worker and pg-boss"
node=$(bench/peers/install.sh)
export BENCH_NODE=$node

# One measurement: its JSON line, tagged with the repetition, goes to the raw file.
failures=0
measure() {
  local line
  if ! line=$("$@" 2>>bench/results/$date.log | tail -n 1) || [ -z "$line" ]; then
    echo "bench/run.sh: failed: $* (see bench/results/$date.log); going on" >&2
    failures=$((failures + 1))
    return 0
  fi
  echo "${line%\}},\"rep\":$rep}" >> "$raw"
  echo "   $line" >&2
}
peer() { measure "$node" "bench/peers/$1.mjs" --db "$url" "${@:2}"; }

for rep in $(seq 1 "$reps"); do
  log "repetition $rep of $reps: drain $drain_jobs"
  for p in 1 2 4; do
    measure "$build/bench/drain_bench" --stages "$drain_jobs" --workers "$p"
    case $p in
      1) peer drain --peer graphile_worker --jobs "$drain_jobs" ;;
      2) peer drain --peer graphile_worker --jobs "$drain_jobs" --processes 2 ;;
      4) peer drain --peer pg_boss --jobs "$drain_jobs" ;;
    esac
  done
  log "repetition $rep: pickup latency ($pickup_jobs at 100/s)"
  measure "$build/bench/pickup_bench" --stages "$pickup_jobs"
  peer pickup --peer graphile_worker --jobs "$pickup_jobs"
  peer pickup --peer pg_boss --jobs "$pickup_jobs"
  log "repetition $rep: submit $submit_jobs"
  measure "$build/bench/submit_bench" --trnflow "$build/trnflow" --stages "$submit_jobs"
  peer enqueue --peer graphile_worker --jobs "$submit_jobs"
  peer enqueue --peer pg_boss --jobs "$submit_jobs"
  log "repetition $rep: DAGs of $dag_stages"
  measure "$build/bench/dag_bench" --shape fan --stages "$dag_stages"
  measure "$build/bench/dag_bench" --shape chains --stages "$dag_stages"
done
rep=1
log "spend reports over 1M and $report_big attempt rows"
measure "$build/bench/report_bench" 1000000 20 --json
measure "$build/bench/report_bench" "$report_big" 5 --json
log "claim latency with $report_big finished stages in history"
measure "$build/bench/claim_bench" "$report_big" 20000 64 --json

python3 bench/report.py "$raw" "bench/results/$date.md" bench/results/latest.json
log "wrote bench/results/$date.md and bench/results/latest.json"
if [ "$failures" -gt 0 ]; then
  echo "bench/run.sh: $failures measurement(s) failed; the results file lacks them" >&2
  exit 1
fi
