#!/usr/bin/env bash
# The main job: install what is missing, build, then run the four seed chains. On a machine with
# an NVIDIA GPU they are compiled, run, timed and checked against the CPU reference; without one
# they are compiled for sm_90 with compile times.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/tools/fusejit seeds "$@"
