#!/usr/bin/env bash
# Everything ops/setup.sh does, then the whole test suite (ctest). Exits non-zero on any
# failure. .ci/run calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
ops/setup.sh
# The tests' catalogs on tmpfs (tests/README.md).
ops/postgres.sh test-tablespace
echo "== running the tests"
# TRNFLOW_TEST_JOBS: tests run at once (default 4: they mostly wait; tests/README.md).
ctest --test-dir build --output-on-failure --timeout 600 -j "${TRNFLOW_TEST_JOBS:-4}"
ops/fuzz.sh "${TRNFLOW_FUZZ_SECONDS:-60}"
