#!/usr/bin/env bash
# Installs what fusejit needs to build, from Debian's packages, when it is missing. Run as root.
# redis-server is for the remote-cache tests (they start their own on a loopback port).
# The CUDA toolkit (nvcc, NVRTC, cuda.h) is used from /usr/local/cuda when present, else from
# Debian's nvidia-cuda-toolkit package. With --sanitizers (or FUSEJIT_CI=1) also clang and its
# sanitizer and libFuzzer runtimes, for scripts/test-sanitizers.sh and scripts/fuzz.sh.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libabsl-dev libfmt-dev libgtest-dev libxxhash-dev
  libhiredis-dev redis-server
  # the Python package's tests: Debian's PyTorch (CPU) for /usr/bin/python3, pytest, pip
  python3-torch python3-numpy python3-pytest python3-pip python3-setuptools python3-wheel)
if [ "${1:-}" = --sanitizers ] || [ "${FUSEJIT_CI:-0}" = 1 ]; then
  packages+=(clang libclang-rt-14-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  missing+=(nvidia-cuda-toolkit)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
