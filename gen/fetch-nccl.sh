#!/usr/bin/env bash
# Fetches NVIDIA's NCCL <version> from the nvidia-nccl-cu12 wheel on PyPI into the cache, once,
# and prints the folder that holds include/ (and lib/): the library and headers, or with
# `headers` only the headers (what a build needs: a few hundred kilobytes of a 300 MB wheel).
#   gen/fetch-nccl.sh 2.27.7           ->   ~/.cache/ncclshim/nccl-2.27.7/nvidia/nccl
#   gen/fetch-nccl.sh 2.27.7 headers   ->   ~/.cache/ncclshim/nccl-headers-2.27.7/nvidia/nccl
set -euo pipefail
version=${1:?usage: fetch-nccl.sh <version> [headers]}
cache=${NCCLSHIM_CACHE:-$HOME/.cache/ncclshim}
platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_18_x86_64 manylinux_2_17_x86_64
  manylinux2014_x86_64)
whole=$cache/nccl-$version
if [ "${2:-}" = headers ] && [ ! -f "$whole/nvidia/nccl/include/nccl.h" ]; then
  dest=$cache/nccl-headers-$version
  [ -f "$dest/nvidia/nccl/include/nccl.h" ] ||
    "$(dirname "$0")/fetch-wheel.sh" nvidia-nccl-cu12 "$version" nvidia/nccl/include/ "$dest" "${platforms[@]}"
  echo "$dest/nvidia/nccl"
  exit 0
fi
[ -f "$whole/nvidia/nccl/include/nccl.h" ] ||
  "$(dirname "$0")/fetch-wheel.sh" nvidia-nccl-cu12 "$version" nvidia/nccl/ "$whole" "${platforms[@]}"
echo "$whole/nvidia/nccl"
