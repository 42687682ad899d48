#!/usr/bin/env bash
# sentinel_block:8K correctness on 2 GPUs: collectives quick + nccl-tests -c 1 with groups.
set -u
export NCCL_NVLS_ENABLE=0 NCCLSHIM_TUNE=sentinel_block:8K QUICK=1 STEP_TIMEOUT=110
b=$PWD/.bundle o=$OUT/c; mkdir -p $o
real=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
cd $b && GPU_COUNTS=2 COLLECTIVE_RUNS="procs-quick procs-graph group-split threads-split initall nonblocking group-graph-memalloc" timeout 200 ./run.sh $o/c2 collectives > $o/c2.out 2>&1
grep -v '^build' $o/c2/summary.txt | cut -c1-140
src=/tmp/nt; ar=$src/build/all_reduce_perf
if [ ! -x $ar ]; then mkdir -p $src; tar xzf $b/nccl-tests.tar.gz -C $src --strip-components=1
make -C $src -j32 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=$b/shim CUDA_HOME=/usr/local/cuda NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > $o/build.log 2>&1; fi
for a in "-m 4" "-m 8 -G 5" "-G 5" "-R 2 -G 5" ""; do
  LD_LIBRARY_PATH=$b/shim/lib NCCLSHIM_REAL_NCCL=$real NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 60 mpirun --allow-run-as-root --bind-to none -np 2 \
    -x LD_LIBRARY_PATH -x NCCLSHIM_REAL_NCCL -x NCCLSHIM_TUNE -x NCCL_NVLS_ENABLE -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS $ar -g 1 -b 8 -e 1M -f 2 -w 2 -n 5 -c 1 $a > $o/nt.log 2>&1
  echo "nccl-tests $a: rc $? $(python3 $b/nccl_tests_report.py --check $o/nt.log >/dev/null 2>&1 && echo checked-ok || echo CHECK-FAIL) $(grep -c 'sentinel' $o/nt.log) $(grep 'Out of bounds' $o/nt.log)"
  LD_LIBRARY_PATH=$b/shim/lib NCCLSHIM_REAL_NCCL=$real timeout 60 $ar -g 2 -b 8 -e 1M -f 2 -w 2 -n 5 -c 1 $a > $o/ntg.log 2>&1
  echo "nccl-tests -g 2 $a: rc $? $(python3 $b/nccl_tests_report.py --check $o/ntg.log >/dev/null 2>&1 && echo checked-ok || echo CHECK-FAIL) $(grep 'Out of bounds' $o/ntg.log)"
done
grep 'summary' $o/nt.log | head -5
cd $o && rm -rf c2/bin && tar czf $OUT/c.tgz .
