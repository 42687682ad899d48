#!/usr/bin/env bash
# Fetches NVIDIA's NVRTC from the nvidia-cuda-nvrtc-cu12 wheel on PyPI into the cache, once, and
# prints the path of libnvrtc.so.12: the build compiles the core's kernels with it, ahead of time. CUDA
# 12's newest NVRTC: what it compiles loads on drivers of CUDA 12 and 13 alike.
set -euo pipefail
version=${1:-12.9.86}
dest=${NCCLSHIM_CACHE:-$HOME/.cache/ncclshim}/nvrtc-$version
lib=$dest/nvidia/cuda_nvrtc/lib/libnvrtc.so.12
if [ ! -f "$lib" ]; then
  # The library and its builtins (not the wheel's .alt copies, which the build does not load).
  "$(dirname "$0")/fetch-wheel.sh" nvidia-cuda-nvrtc-cu12 "$version" \
    'nvidia/cuda_nvrtc/lib/libnvrtc(-builtins)?\.so' "$dest" \
    manylinux_2_12_"$(uname -m)" manylinux2010_"$(uname -m)" manylinux_2_17_"$(uname -m)" \
    manylinux2014_"$(uname -m)"
fi
echo "$lib"
