#!/usr/bin/env bash
# The CPU test suite built with clang and AddressSanitizer + UndefinedBehaviorSanitizer, in its own
# build folder (build-asan), then run. Any sanitizer report fails the run: UBSan does not recover
# (-fno-sanitize-recover=undefined), float-to-integer casts of out-of-range values included
# (float-cast-overflow), and ASan aborts on the first error. CI runs this (.ci/run, through
# scripts/test.sh with FUSEJIT_CI=1); run it alone as `bash scripts/test-sanitizers.sh [ctest args]`.
#
# Only unit_tests and what it runs (the fusejit CLI, the cache worker) and the C ABI's capi_tests
# (with libfusejit.so) are built. GPU tests (Gpu*) are excluded: they skip without a driver
# anyway, and compute-sanitizer is their tool (scripts/gpu-sanitize.sh). python_tests is excluded:
# an instrumented libfusejit.so does not load into an uninstrumented Python (the plain build's
# ctest runs them). Every other test runs, the NVRTC compile sweeps included (NVRTC itself
# is not instrumented, so they cost about what they cost unsanitized). Budget on CI's 2 cores:
# about 12 minutes to build from scratch, 4 to run.
#
# Environment: FUSEJIT_ASAN_BUILD_DIR (default build-asan); CXX_LAUNCHER (default ccache when
# installed).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
build="${FUSEJIT_ASAN_BUILD_DIR:-build-asan}"
start=$(date +%s)

command -v clang++ >/dev/null || scripts/install-deps.sh --sanitizers
launcher=()
if [ -n "${CXX_LAUNCHER:-}" ]; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$CXX_LAUNCHER")
elif command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

sanitize="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=undefined"
sanitize+=" -fno-omit-frame-pointer"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" -DFUSEJIT_SANITIZE=ON \
  -DCMAKE_CXX_FLAGS="$sanitize" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target unit_tests fusejit_cli fusejit_cache_worker capi_tests
built=$(date +%s)
echo "test-sanitizers: built in $((built - start)) s"

# halt_on_error/abort: a report fails the test that caused it. Leaks are checked, except inside
# NVRTC and the CUDA driver (not ours, not instrumented): scripts/sanitizer-suppressions.txt.
export ASAN_OPTIONS="abort_on_error=1:halt_on_error=1:detect_leaks=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/sanitizer-suppressions.txt:print_suppressions=0"
# The kernel cache of the tests stays out of the user's home.
export FUSEJIT_CACHE_DIR="${FUSEJIT_CACHE_DIR:-$(mktemp -d)/fusejit-cache}"
cd "$build"
ctest --output-on-failure --parallel "$(nproc)" -E '^Gpu|^python_tests$' "$@"
echo "test-sanitizers: passed; build $((built - start)) s, tests $(( $(date +%s) - built )) s"
