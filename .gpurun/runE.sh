#!/usr/bin/env bash
# sentinel_block on by default on 2 ranks, fused launches shaped by all their calls: A/B + checks.
set -u
export NCCL_NVLS_ENABLE=0
b=$PWD/.bundle o=$OUT/e; mkdir -p $o/ab
nvidia-smi -L
real=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
src=/tmp/nt; ar=$src/build/all_reduce_perf
mkdir -p $src; tar xzf $b/nccl-tests.tar.gz -C $src --strip-components=1
make -C $src -j32 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=$b/shim CUDA_HOME=/usr/local/cuda NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > $o/build.log 2>&1
one() { local name=$1 lib=$2 tune=$3; shift 3
  LD_LIBRARY_PATH=$lib NCCLSHIM_REAL_NCCL=$real NCCLSHIM_TUNE=$tune timeout 60 mpirun --allow-run-as-root --bind-to none -np 2 \
    -x LD_LIBRARY_PATH -x NCCLSHIM_REAL_NCCL -x NCCLSHIM_TUNE -x NCCL_NVLS_ENABLE $ar -g 1 -b 8 -e 128K -f 4 -w 20 -n 100 -c 0 "$@" > $o/ab/$name.log 2>&1; }
for set in "r2g:-R 2 -G 20" "m2g:-m 2 -G 20" "m4g:-m 4 -G 20" "m8g:-m 8 -G 20" "e:" "m4:-m 4" "m8:-m 8"; do
  s=${set%%:*}; a=${set#*:}
  one real-$s $(dirname $real) "" $a
  one new-$s $b/shim/lib "" $a
  one old-$s $b/shim/lib "sentinel_block:0" $a
done
for f in $o/ab/*.log; do echo "== $(basename $f)"; grep -E '^ +[0-9]+ ' $f | awk '{print $1, $6, $10}' | tr '\n' ';'; echo; done
for a in "-m 4" "-m 8 -G 5" "-m 3 -R 2 -G 5" "-G 5" ""; do
  LD_LIBRARY_PATH=$b/shim/lib NCCLSHIM_REAL_NCCL=$real timeout 60 mpirun --allow-run-as-root --bind-to none -np 2 \
    -x LD_LIBRARY_PATH -x NCCLSHIM_REAL_NCCL -x NCCL_NVLS_ENABLE $ar -g 1 -b 8 -e 1M -f 2 -w 2 -n 5 -c 1 $a > $o/nt.log 2>&1
  echo "nccl-tests $a: rc $? $(grep 'Out of bounds' $o/nt.log)"
  LD_LIBRARY_PATH=$b/shim/lib NCCLSHIM_REAL_NCCL=$real timeout 60 $ar -g 2 -b 8 -e 1M -f 2 -w 2 -n 5 -c 1 -d all $a > $o/ntg.log 2>&1
  echo "nccl-tests -g 2 -d all $a: rc $? $(grep 'Out of bounds' $o/ntg.log)"
done
cd $b && QUICK=1 STEP_TIMEOUT=110 GPU_COUNTS=2 COLLECTIVE_RUNS="procs-quick procs-graph group split initall nonblocking control" timeout 200 ./run.sh $o/c2 collectives > $o/c2.out 2>&1
grep -v '^build' $o/c2/summary.txt | cut -c1-120
GPU_COUNTS=2 STEP_TIMEOUT=150 timeout 200 ./run.sh $o/t2 torch > $o/t2.out 2>&1
grep -v '^build' $o/t2/summary.txt | cut -c1-250 | head -12
cd $o && rm -rf c2/bin t2/bin && tar czf $OUT/e.tgz .
