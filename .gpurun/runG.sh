#!/usr/bin/env bash
# Where an eager group's host time goes: group_cost, shim against NCCL, 4 and 8 calls.
set -u
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=WARN
b=$PWD/.bundle o=$OUT/g; mkdir -p $o
real=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
nvcc -O2 -std=c++17 -arch=native -I$b -I$(dirname $(dirname $real))/include $b/group_cost.cu -o /tmp/gc -ldl > $o/build.log 2>&1 || cat $o/build.log
for c in 4 8; do for m in "" --one-process; do
  echo "=== calls $c $m"
  timeout 60 /tmp/gc --shim $(readlink -f $b/shim/lib/libnccl.so.2) --real $real --ngpus 2 --calls $c --groups 2000 --rounds 3 --sizes 8,2K,32K $m 2>&1 | grep -v '^# shim\|^# nccl' | tail -20
done; done
