#!/bin/bash
# Builds the explore harness here (no GPU needed); resource report -> bin/ptxas.txt
set -e
cd "$(dirname "$0")"
mkdir -p bin
nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo -I../../templates -cudart static -Xptxas -v "$@" \
  harness.cu -o bin/harness 2> bin/ptxas.txt || { cat bin/ptxas.txt; exit 1; }
grep -E "error|warning" bin/ptxas.txt || true
python3 - <<'PY'
import re
txt=open('bin/ptxas.txt').read()
for m in re.finditer(r"Compiling entry function '(\S+)'.*?\n(?:.*\n)*?.*?(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads\n.*?Used (\d+) registers", txt):
    print(f"{m.group(5):>4} regs  stack {m.group(2):>4}  spill st {m.group(3):>4} ld {m.group(4):>4}  {m.group(1)[:150]}")
PY
