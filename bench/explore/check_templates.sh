#!/bin/bash
# Each explore template must compile on its own (default instantiations under #ifndef FJ_GENERATED).
set -e
cd "$(dirname "$0")/../../templates"
for f in moments_util.cuh direct_conv_moments.cuh moments_mean.cuh convt_group_norm.cuh; do
  nvcc -std=c++17 -arch=sm_90 -O3 -x cu -c "$f" -o /tmp/fj_check_$$.o -Xptxas -v 2>&1 |
    grep -E "error|warning|spill stores" | sed "s|^|$f: |" || true
  echo "$f: ok"
done
rm -f /tmp/fj_check_$$.o
