#!/usr/bin/env bash
# Runs fusejit's GPU work under NVIDIA compute-sanitizer, on the GPU machine: the Gpu* gtest suite
# and each seed chain (`fusejit run SPEC --check --reps 0`, one launch of every kernel, checked
# against the CPU reference), under each tool asked for (default: memcheck racecheck synccheck
# initcheck). Any sanitizer error fails the run.
#
# It runs the programs bundled into .gpu/ (see ../shared/gpu/README.md); on this machine:
#   cmake --build build --target unit_tests fusejit_cli
#   ../shared/gpu/bundle .gpu build/tests/unit_tests build/tools/fusejit
# and then on the GPU machine (the device tool's run, carry [".gpu"]), e.g. in two calls of under
# 10 minutes each:
#   bash scripts/gpu-sanitize.sh memcheck initcheck
#   bash scripts/gpu-sanitize.sh racecheck synccheck
#
# Logs: $OUT/gpu-sanitize/<tool>.<step>.log (the full sanitizer output of each step) and
# $OUT/gpu-sanitize/summary.txt (one line per step: the tool's ERROR SUMMARY, the exit status).
#
# Environment:
#   FUSEJIT_SANITIZE_BATCH    batch size the seed chains run with under the sanitizers (default 2:
#                             the same kernels, strategies and code paths at a fraction of the
#                             time; racecheck and initcheck slow kernels down 10-100x); "full"
#                             keeps each seed's own batch
#   FUSEJIT_SANITIZE_TIMEOUT  seconds per step (default 240); a step that runs out is reported
#                             as TIMEOUT and counts as a failure
#   FUSEJIT_GTEST_FILTER      the gtest filter of the suite step (default 'Gpu*' less
#                             GpuJit.ErrorsAreStatusesNotCrashes, whose driver errors are the test)
#   COMPUTE_SANITIZER         the tool's path (default: PATH, else /usr/local/cuda/bin)
set -uo pipefail
cd "$(dirname "$0")/.."
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck synccheck initcheck)
out="${OUT:-$PWD/out}/gpu-sanitize"
mkdir -p "$out"
summary="$out/summary.txt"
batch="${FUSEJIT_SANITIZE_BATCH:-2}"
limit="${FUSEJIT_SANITIZE_TIMEOUT:-240}"
filter="${FUSEJIT_GTEST_FILTER:-Gpu*:-GpuJit.ErrorsAreStatusesNotCrashes}"
run=.gpu/run
[ -x "$run" ] || { echo "gpu-sanitize: $run is missing: bundle the programs first (see above)" >&2; exit 2; }
sanitizer="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
[ -x "$sanitizer" ] || { echo "gpu-sanitize: compute-sanitizer not found ($sanitizer)" >&2; exit 2; }
export FUSEJIT_CACHE_DIR="$(mktemp -d)/fusejit-cache"  # every kernel compiled fresh, with -lineinfo

# The seed specs, with the batch size replaced unless "full".
mapfile -t seeds < <("$run" fusejit seeds --list)
if [ ${#seeds[@]} -eq 0 ]; then echo "gpu-sanitize: fusejit seeds --list printed nothing" >&2; exit 2; fi
if [ "$batch" != full ]; then
  for i in "${!seeds[@]}"; do seeds[$i]=$(sed -E "s/^x:([a-z0-9]+)\[[0-9]+,/x:\1[$batch,/" <<<"${seeds[$i]}"); done
fi

{
  echo "# compute-sanitizer $("$sanitizer" --version | tail -1)"
  echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "# tools: ${tools[*]}; seeds with batch $batch; gtest filter $filter; $limit s per step"
} | tee "$summary"

failures=0
step() {  # step TOOL NAME COMMAND...
  local tool=$1 name=$2; shift 2
  local log="$out/$tool.$name.log"
  local extra=()
  case $tool in
    memcheck) extra=(--leak-check full) ;;
    racecheck) extra=(--racecheck-report all) ;;
  esac
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$sanitizer" --tool "$tool" "${extra[@]}" \
    --target-processes all --error-exitcode 99 --print-limit 50 "$@" >"$log" 2>&1
  local rc=$?
  local errors
  errors=$(grep -Eo '(ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards?)' "$log" | tail -1)
  [ -n "$errors" ] || errors="no ERROR SUMMARY"
  local verdict=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then verdict=TIMEOUT
  elif [ $rc -eq 99 ]; then verdict=ERRORS
  elif [ $rc -ne 0 ]; then verdict="FAILED (exit $rc)"
  fi
  [ "$verdict" = ok ] || failures=$((failures + 1))
  printf '%-9s %-10s %-6s %-22s %4ss  %s\n' "$tool" "$name" "$verdict" "$errors" \
    $((SECONDS - start)) "$log" | tee -a "$summary"
}

for tool in "${tools[@]}"; do
  step "$tool" gtest "$run" unit_tests --gtest_filter="$filter" --gtest_brief=1
  for i in "${!seeds[@]}"; do
    step "$tool" "seed$i" "$run" fusejit run "${seeds[$i]}" --check --reps 0
  done
done
for i in "${!seeds[@]}"; do echo "# seed$i: ${seeds[$i]}"; done | tee -a "$summary"
echo "# $failures failing steps" | tee -a "$summary"
[ $failures -eq 0 ]
