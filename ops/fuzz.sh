#!/usr/bin/env bash
# Builds the libFuzzer target with clang (ASan + UBSan) into build-fuzz/ and fuzzes the
# pipeline parser and validator for SECONDS (default 60), seeded with the examples and the
# broken pipelines in tests/. Exits non-zero on a crash, leak or hang (>5 s per input).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRNFLOW_FUZZ=ON \
  -DTRNFLOW_TESTS=OFF -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-fuzz --target fuzz_pipeline -j "$(nproc)"
corpus=$(mktemp -d)
seeds=$(mktemp -d)
trap 'rm -rf "$corpus" "$seeds"' EXIT
for f in examples/*/*.yaml tests/broken/*.yaml; do  # unique names: examples share one
  cp "$f" "$seeds/$(echo "$f" | tr / _)"
done
echo "== fuzzing the pipeline parser for ${seconds}s"
build-fuzz/fuzz_pipeline -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 \
  -max_len=65536 -dict=tests/fuzz/pipeline.dict -print_final_stats=1 \
  -artifact_prefix=build-fuzz/ "$corpus" "$seeds" 2>&1 | tail -n 20
echo "fuzz: no crash, leak or hang in ${seconds}s"
