#!/usr/bin/env bash
# Kernel-cache timings for the four seed chains, in fresh processes (issue 3):
#   cold      empty cache: plan + codegen + NVRTC + publish, then the module load
#   warm disk a new process, entry on disk: plan + codegen + cache read, then the module load
#   hit       in-process: Compile() of the same chain again (memory cache), mean of 100000
# Usage: bench/cache_timings.sh FUSEJIT...   e.g. bench/cache_timings.sh .gpu/run fusejit
# On a machine without a GPU, pass --arch sm_90 through FUSEJIT_COMPILE_FLAGS instead of --load.
set -euo pipefail
fusejit=("$@")
flags=${FUSEJIT_COMPILE_FLAGS:---load}
export FUSEJIT_CACHE_DIR=$(mktemp -d)/cache
specs=(
  "x:f32[128,3,16,32,32] | conv_transpose3d(out=16,k=3,stride=2,padding=1) | swish | group_norm(groups=4,eps=1e-5) | hardswish"
  "x:f32[1024,3,16,32,32] | conv3d(out=16,k=4) | hardswish | group_norm(groups=4,eps=1e-5) | mean(dims=[2,3,4])"
  "x:f32[16,64,32,32,32] | conv_transpose3d(out=128,k=3,bias=false) | relu | group_norm(groups=8,eps=1e-5)"
  "x:f32[128,3,24,32,32] | conv3d(out=24,k=3) | group_norm(groups=8,eps=1e-5) | mean(dims=[1,2,3,4])"
)
field() { grep -E "^$1" | head -1 | sed -E 's/^[^:]+: *([0-9.]+).*/\1/'; }
printf '| id | cold compile+load ms | (NVRTC ms) | warm-disk compile+load ms | (module load ms) | in-process hit us |\n|---|---|---|---|---|---|\n'
id=1
for spec in "${specs[@]}"; do
  cold=$("${fusejit[@]}" compile "$spec" $flags)
  warm=$("${fusejit[@]}" compile "$spec" $flags --hits 100000)
  echo "$warm" | grep -q "cache:     hit" || { echo "W$id: second process missed the cache" >&2; exit 1; }
  total_field=total
  [ "$flags" = "--load" ] && total_field="compile\+load"
  printf '| W%d | %s | %s | %s | %s | %s |\n' "$id" \
    "$(echo "$cold" | field "$total_field")" "$(echo "$cold" | field NVRTC)" \
    "$(echo "$warm" | field "$total_field")" "$(echo "$warm" | field load || true)" \
    "$(echo "$warm" | field "memory hit")"
  id=$((id + 1))
done
