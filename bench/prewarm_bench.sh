#!/usr/bin/env bash
# bench/prewarm_bench.sh: chains per second of `fusejit prewarm` for --jobs 1, 2 and all cores,
# each run into an empty cache directory, then the second (idempotent) run over a filled cache.
# Prints a Markdown table (BENCHMARKS.md, "Prewarm (issue 6)"): medians of REPS runs (default 3),
# with the range. KEEP=DIR keeps every run's stdout/stderr there.
#
#   bash bench/prewarm_bench.sh [BUILD_DIR [ARCH [MANIFEST]]]
#   # defaults: build, sm_90, bench/prewarm_manifest.txt
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
arch=${2:-sm_90}
manifest=${3:-$here/prewarm_manifest.txt}
reps=${REPS:-3}
cli=$build/tools/fusejit
[ -x "$cli" ] || { echo "no $cli: build first (cmake --build $build)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cores=$(nproc)
jobs_list="1 2"
[ "$cores" -gt 2 ] && jobs_list="$jobs_list $cores"

field() {  # field FILE REGEX: the first capture group of REGEX in FILE
  sed -nE "s/$2/\1/p" "$1" | head -n 1
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
range() { tr ' ' '\n' | grep . | sort -g | awk 'NR==1{lo=$1} {hi=$1} END {print lo "-" hi}'; }

busy() {  # CPU seconds the whole machine has been busy (all cores; /proc/stat)
  awk -v hz="$(getconf CLK_TCK)" '/^cpu / {print ($2 + $3 + $4 + $7 + $8 + $9) / hz}' /proc/stat
}

# run TAG JOBS CACHE_DIR: one prewarm; sets wall (its summary), proc (the whole process, s),
# others (cores used by other processes during it, on average), out
run() {
  local t0 t1 b0 b1 cpu
  b0=$(busy)
  t0=$(date +%s.%N)
  TIMEFORMAT='%U %S'
  { time "$cli" prewarm "$manifest" --arch "$arch" --jobs "$2" --cache-dir "$3" \
      > "$work/$1.out" 2> "$work/$1.err" ; } 2> "$work/$1.time" ||
    { cat "$work/$1.out" "$work/$1.err" >&2; exit 1; }
  t1=$(date +%s.%N)
  b1=$(busy)
  out=$work/$1.out
  wall=$(field "$out" '^  wall time +([0-9.]+) s.*')
  proc=$(echo "$t1 - $t0" | bc -l)
  cpu=$(awk '{print $1 + $2}' "$work/$1.time")
  others=$(echo "o = ($b1 - $b0 - $cpu) / $proc; if (o < 0) o = 0; o" | bc -l)
}

echo "| run | --jobs | compiled | already cached | wall s (median, range of $reps) | chains/s | compile time per chain, mean / max | process s | other processes' CPU use during the runs, cores |"
echo "|---|---|---|---|---|---|---|---|---|"
for j in $jobs_list; do
  walls="" procs="" loads=""
  for r in $(seq "$reps"); do
    run "j$j-r$r" "$j" "$work/cache-j$j-r$r"
    walls="$walls $wall" procs="$procs $proc" loads="$loads $(printf %.2f "$others")"
  done
  chains=$(( $(field "$out" '^  compiled +([0-9]+)$') + $(field "$out" '^  already cached +([0-9]+)$') ))
  w=$(echo "$walls" | median)
  mean=$(field "$out" '^  compile time +mean ([0-9.]+ m?s), max.*')
  max=$(field "$out" '^  compile time +mean [0-9.]+ m?s, max ([0-9.]+ m?s) per chain.*')
  printf "| empty cache | %s%s | %s | %s | %.2f (%s) | %.2f | %s / %s (last run) | %.2f | %s |\n" \
    "$j" "$([ "$j" = "$cores" ] && echo " (all cores)")" \
    "$(field "$out" '^  compiled +([0-9]+)$')" "$(field "$out" '^  already cached +([0-9]+)$')" \
    "$w" "$(echo "$walls" | range)" "$(echo "$chains / $w" | bc -l)" "$mean" "$max" \
    "$(echo "$procs" | median)" "$(echo "$loads" | xargs)"
done
walls="" procs="" loads=""
for r in $(seq "$reps"); do  # over the last empty-cache run's (now full) cache
  run "again-r$r" "$cores" "$work/cache-j$j-r$reps"
  walls="$walls $wall" procs="$procs $proc" loads="$loads $(printf %.2f "$others")"
done
printf "| second run (all cached) | %s (all cores) | %s | %s | %.3f (%s) | %.0f | - | %.2f | %s |\n" \
  "$cores" "$(field "$out" '^  compiled +([0-9]+)$')" "$(field "$out" '^  already cached +([0-9]+)$')" \
  "$(echo "$walls" | median)" "$(echo "$walls" | range)" "$(echo "$chains / $(echo "$walls" | median)" | bc -l)" \
  "$(echo "$procs" | median)" "$(echo "$loads" | xargs)"
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/*.out "$work"/*.err "$work"/*.time "$KEEP"/; fi
