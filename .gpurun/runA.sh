#!/usr/bin/env bash
# 4 GPUs: the NR=4 kernels' correctness (collectives quick) and PyTorch on 4 ranks.
set -u
cd .bundle
nvidia-smi -L
nvidia-smi topo -m | head -6
export QUICK=1 STEP_TIMEOUT=110
o=$OUT/a
mkdir -p $o
GPU_COUNTS=4 COLLECTIVE_RUNS="procs-quick group-split threads-split initall nonblocking-group-split procs-graph group-graph-memalloc control" \
  timeout 290 ./run.sh $o/c4 collectives > $o/c4.out 2>&1
cat $o/c4/summary.txt
GPU_COUNTS=4 timeout 230 ./run.sh $o/t4 torch > $o/t4.out 2>&1
cat $o/t4/summary.txt
cd $o && rm -rf c4/bin t4/bin && tar czf $OUT/a.tgz . 
