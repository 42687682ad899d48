#!/usr/bin/env bash
# Fetches NVIDIA's NCCL <version> (library and headers) from the nvidia-nccl-cu12 wheel on PyPI
# into the cache, once, and prints the folder that holds lib/ and include/.
#   gen/fetch-nccl.sh 2.27.7   ->   ~/.cache/ncclshim/nccl-2.27.7/nvidia/nccl
set -euo pipefail
version=${1:?usage: fetch-nccl.sh <version>}
cache=${NCCLSHIM_CACHE:-$HOME/.cache/ncclshim}
dest=$cache/nccl-$version
if [ ! -f "$dest/nvidia/nccl/include/nccl.h" ]; then
  mkdir -p "$cache/wheels"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "fetch-nccl: installing pip (python3-pip)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null
  fi
  wheel=$(ls "$cache"/wheels/nvidia_nccl_cu12-"$version"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ]; then
    echo "fetch-nccl: downloading nvidia-nccl-cu12==$version" >&2
    python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_27_x86_64 --platform manylinux_2_18_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 \
      -d "$cache/wheels" "nvidia-nccl-cu12==$version" >&2
    wheel=$(ls "$cache"/wheels/nvidia_nccl_cu12-"$version"-*.whl | head -1)
  fi
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  python3 - "$wheel" "$dest.tmp" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    wheel.extractall(sys.argv[2], [n for n in wheel.namelist() if n.startswith("nvidia/nccl/")])
PY
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
fi
echo "$dest/nvidia/nccl"
