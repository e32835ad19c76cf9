#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test with ctest. GPU tests (Gpu*) skip with a
# message where no CUDA driver is present.
# With FUSEJIT_CI=1 (CI sets it), then also the test suite under ASan+UBSan
# (scripts/test-sanitizers.sh) and every fuzzer for a bounded time (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
(cd build && ctest --output-on-failure --parallel "$(nproc)" "$@")
if [ "${FUSEJIT_CI:-0}" = 1 ]; then
  scripts/test-sanitizers.sh
  scripts/fuzz.sh
fi
