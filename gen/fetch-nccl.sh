#!/usr/bin/env bash
# Fetches NVIDIA's NCCL <version> from the nvidia-nccl-cu12 wheel on PyPI into the cache, once,
# and prints the folder that holds include/ (and lib/): the library and headers; with `headers`
# only the headers (what a build needs: a few hundred kilobytes of a 300 MB wheel); with `host`
# the library without its GPU code (holes in the file, gen/host-only.py: about 25 MB on disk
# instead of 400), for the CPU tests, or the whole one where the cache has it already.
#   gen/fetch-nccl.sh 2.27.7           ->   ~/.cache/ncclshim/nccl-2.27.7/nvidia/nccl
#   gen/fetch-nccl.sh 2.27.7 headers   ->   ~/.cache/ncclshim/nccl-headers-2.27.7/nvidia/nccl
#   gen/fetch-nccl.sh 2.27.7 host      ->   ~/.cache/ncclshim/nccl-host-2.27.7/nvidia/nccl
set -euo pipefail
version=${1:?usage: fetch-nccl.sh <version> [headers|host]}
cache=${NCCLSHIM_CACHE:-$HOME/.cache/ncclshim}
# The wheel for this machine's processor (x86_64 or aarch64): its library is loaded by the tests.
arch=$(uname -m)
platforms=(manylinux_2_28_$arch manylinux_2_27_$arch manylinux_2_18_$arch manylinux_2_17_$arch
  manylinux2014_$arch)
whole=$cache/nccl-$version
if [ "${2:-}" = headers ] && [ ! -f "$whole/nvidia/nccl/include/nccl.h" ]; then
  dest=$cache/nccl-headers-$version
  [ -f "$dest/nvidia/nccl/include/nccl.h" ] ||
    "$(dirname "$0")/fetch-wheel.sh" nvidia-nccl-cu12 "$version" nvidia/nccl/include/ "$dest" "${platforms[@]}"
  echo "$dest/nvidia/nccl"
  exit 0
fi
if [ "${2:-}" = host ] && [ ! -f "$whole/nvidia/nccl/include/nccl.h" ]; then
  dest=$cache/nccl-host-$version
  if [ ! -f "$dest/host-only" ]; then
    rm -rf "$dest"
    "$(dirname "$0")/fetch-wheel.sh" nvidia-nccl-cu12 "$version" nvidia/nccl/ "$dest" "${platforms[@]}"
    python3 "$(dirname "$0")/host-only.py" "$dest/nvidia/nccl/lib/libnccl.so.2" >&2
    touch "$dest/host-only"
  fi
  echo "$dest/nvidia/nccl"
  exit 0
fi
[ -f "$whole/nvidia/nccl/include/nccl.h" ] ||
  "$(dirname "$0")/fetch-wheel.sh" nvidia-nccl-cu12 "$version" nvidia/nccl/ "$whole" "${platforms[@]}"
echo "$whole/nvidia/nccl"
