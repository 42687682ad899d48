#!/usr/bin/env bash
# Fetches NVIDIA's NVRTC from the nvidia-cuda-nvrtc-cu12 wheel on PyPI into the cache, once, and
# prints the path of libnvrtc.so.12 (the CPU tests compile the core's kernels with it).
set -euo pipefail
version=${1:-12.9.86}
cache=${NCCLSHIM_CACHE:-$HOME/.cache/ncclshim}
dest=$cache/nvrtc-$version
lib=$dest/nvidia/cuda_nvrtc/lib/libnvrtc.so.12
if [ ! -f "$lib" ]; then
  mkdir -p "$cache/wheels"
  python3 -m pip --version >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null; }
  wheel=$(ls "$cache"/wheels/nvidia_cuda_nvrtc_cu12-"$version"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    echo "fetch-nvrtc: downloading nvidia-cuda-nvrtc-cu12==$version" >&2
    python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_12_x86_64 \
      --platform manylinux2010_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$cache/wheels" "nvidia-cuda-nvrtc-cu12==$version" >&2
    wheel=$(ls "$cache"/wheels/nvidia_cuda_nvrtc_cu12-"$version"-*.whl | head -1)
  fi
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  python3 - "$wheel" "$dest.tmp" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    wheel.extractall(sys.argv[2], [n for n in wheel.namelist() if n.startswith("nvidia/cuda_nvrtc/lib/")])
PY
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
fi
echo "$lib"
