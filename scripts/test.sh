#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test with ctest. GPU tests (Gpu*) skip with a
# message where no CUDA driver is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
ctest --output-on-failure --parallel "$(nproc)" "$@"
