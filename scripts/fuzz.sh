#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan, in build-fuzz), replays every
# saved regression input, then fuzzes each target for a bounded time from its seed corpus. CI runs
# this (.ci/run, through scripts/test.sh with FUSEJIT_CI=1).
#
#   bash scripts/fuzz.sh                 # every target, FUSEJIT_FUZZ_SECONDS (default 50) each
#   bash scripts/fuzz.sh spec npy        # some targets
#
# Targets: spec, manifest, npy, cache_entry, tuning_record (tests/fuzz/CMakeLists.txt says what
# each checks). Seeds: tests/fuzz/corpus/<target>/ (read-only here: new corpus entries go to a
# temporary folder). A crash, leak, sanitizer report or timeout fails the run; its input is copied
# to tests/fuzz/regressions/<target>/ so that it is replayed on every later run: commit it with
# the fix. The executions of each target are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
build="${FUSEJIT_FUZZ_BUILD_DIR:-build-fuzz}"
seconds="${FUSEJIT_FUZZ_SECONDS:-50}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(spec manifest npy cache_entry tuning_record)

command -v clang++ >/dev/null || scripts/install-deps.sh --sanitizers
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
flags="-fsanitize=fuzzer-no-link,address,undefined,float-cast-overflow"
flags+=" -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSEJIT_FUZZ=ON \
  -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/sanitizer-suppressions.txt:print_suppressions=0"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
summary=()
for t in "${targets[@]}"; do
  bin="$build/tests/fuzz/fuzz_$t"
  regressions="tests/fuzz/regressions/$t"
  mkdir -p "$regressions" "$work/$t/corpus" "$work/$t/artifacts"
  # 1. Every input that once failed must pass now.
  mapfile -t saved < <(find "$regressions" -type f ! -name '.keep' | sort)
  if [ ${#saved[@]} -gt 0 ]; then
    if ! "$bin" -runs=0 "${saved[@]}" >"$work/$t/replay.log" 2>&1; then
      echo "fuzz: $t: a regression input fails again:"; tail -40 "$work/$t/replay.log"
      status=1
      summary+=("$t: REGRESSION")
      continue
    fi
  fi
  # 2. Fuzz, from the seeds (merged into a temporary corpus; the repository is not written).
  set +e
  "$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=8192 \
    -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" \
    "$work/$t/corpus" "tests/fuzz/corpus/$t" >"$work/$t/fuzz.log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t/fuzz.log" | grep -o '[0-9]*$' || true)
  if [ $rc -ne 0 ]; then
    echo "fuzz: $t failed (exit $rc):"; tail -60 "$work/$t/fuzz.log"
    for a in "$work/$t/artifacts"/*; do
      [ -f "$a" ] || continue
      cp "$a" "$regressions/"
      echo "fuzz: $t: kept $regressions/$(basename "$a") as a regression input (commit it with the fix)"
    done
    status=1
    summary+=("$t: FAILED after ${runs:-?} executions")
  else
    summary+=("$t: ok, ${runs:-?} executions in ${seconds} s")
  fi
done
printf 'fuzz: %s\n' "${summary[@]}"
exit $status
