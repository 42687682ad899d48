#!/usr/bin/env bash
# Fetches NVIDIA's NCCL <version> (library and headers) from the nvidia-nccl-cu12 wheel on PyPI
# into the cache, once, and prints the folder that holds lib/ and include/.
#   gen/fetch-nccl.sh 2.27.7   ->   ~/.cache/ncclshim/nccl-2.27.7/nvidia/nccl
set -euo pipefail
version=${1:?usage: fetch-nccl.sh <version>}
dest=${NCCLSHIM_CACHE:-$HOME/.cache/ncclshim}/nccl-$version
if [ ! -f "$dest/nvidia/nccl/include/nccl.h" ]; then
  "$(dirname "$0")/fetch-wheel.sh" nvidia-nccl-cu12 "$version" nvidia/nccl/ "$dest" \
    manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_18_x86_64 manylinux_2_17_x86_64 \
    manylinux2014_x86_64
fi
echo "$dest/nvidia/nccl"
