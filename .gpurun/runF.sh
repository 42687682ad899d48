#!/usr/bin/env bash
# x4: 2-rank all_gather/reduce_scatter in graphs vs NCCL windows; 4-rank sentinel_block A/B + checks.
set -u
export NCCL_NVLS_ENABLE=0
b=$PWD/.bundle o=$OUT/f; mkdir -p $o/ab
nvidia-smi -L | head -4
real=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
src=/tmp/nt; mkdir -p $src; tar xzf $b/nccl-tests.tar.gz -C $src --strip-components=1
make -C $src -j64 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=$b/shim CUDA_HOME=/usr/local/cuda NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > $o/build.log 2>&1
one() { local name=$1 np=$2 bin=$3 lib=$4 tune=$5; shift 5
  LD_LIBRARY_PATH=$lib NCCLSHIM_REAL_NCCL=$real NCCLSHIM_TUNE=$tune timeout 60 mpirun --allow-run-as-root --bind-to none -np $np \
    -x LD_LIBRARY_PATH -x NCCLSHIM_REAL_NCCL -x NCCLSHIM_TUNE -x NCCL_NVLS_ENABLE $src/build/${bin}_perf -g 1 -b 8 -e 128K -f 4 -w 20 -n 100 -c 0 "$@" > $o/ab/$name.log 2>&1; }
rl=$(dirname $real) sl=$b/shim/lib
for bin in all_gather reduce_scatter; do
  for set in "r2g:-R 2 -G 20" "g:-G 20"; do s=${set%%:*}; a=${set#*:}
    CUDA_VISIBLE_DEVICES=0,1 one 2-$bin-real-$s 2 $bin $rl "" $a
    CUDA_VISIBLE_DEVICES=0,1 one 2-$bin-shim-$s 2 $bin $sl "" $a
  done
done
for set in "r2g:-R 2 -G 20" "g:-G 20" "m4g:-m 4 -G 20"; do s=${set%%:*}; a=${set#*:}
  one 4-ar-real-$s 4 all_reduce $rl "" $a
  one 4-ar-shim-$s 4 all_reduce $sl "" $a
  one 4-ar-sb8-$s 4 all_reduce $sl "sentinel_block:8K" $a
done
for f in $o/ab/*.log; do echo "== $(basename $f)"; grep -E '^ +[0-9]+ ' $f | awk '{print $1, $6, $10}' | tr '\n' ';'; echo; done
export NCCLSHIM_TUNE=sentinel_block:8K
for a in "-m 4" "-m 8 -G 5" "-R 2 -G 5" ""; do
  LD_LIBRARY_PATH=$sl NCCLSHIM_REAL_NCCL=$real timeout 60 mpirun --allow-run-as-root --bind-to none -np 4 \
    -x LD_LIBRARY_PATH -x NCCLSHIM_REAL_NCCL -x NCCL_NVLS_ENABLE -x NCCLSHIM_TUNE $src/build/all_reduce_perf -g 1 -b 8 -e 1M -f 2 -w 2 -n 5 -c 1 $a > $o/nt.log 2>&1
  echo "4 ranks sb8 nccl-tests $a: rc $? $(grep 'Out of bounds' $o/nt.log)"
  LD_LIBRARY_PATH=$sl NCCLSHIM_REAL_NCCL=$real timeout 60 $src/build/all_reduce_perf -g 4 -b 8 -e 1M -f 2 -w 2 -n 5 -c 1 -d all $a > $o/ntg.log 2>&1
  echo "4 ranks sb8 nccl-tests -g 4 -d all $a: rc $? $(grep 'Out of bounds' $o/ntg.log)"
done
cd $b && QUICK=1 STEP_TIMEOUT=100 GPU_COUNTS=4 COLLECTIVE_RUNS="procs-quick-forcecore procs-graph group-split threads-split" timeout 150 ./run.sh $o/c4 collectives > $o/c4.out 2>&1
grep -v '^build' $o/c4/summary.txt | cut -c1-120
cd $o && rm -rf c4/bin && tar czf $OUT/f.tgz .
