#!/usr/bin/env bash
# groups: nccl-tests -m 2/4/8 -G 20 (real, shim, sb8), then PyTorch's coalescing manager with sb8.
set -u
export NCCL_NVLS_ENABLE=0
b=$PWD/.bundle o=$OUT/d; mkdir -p $o/ab
real=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
src=/tmp/nt; ar=$src/build/all_reduce_perf
if [ ! -x $ar ]; then mkdir -p $src; tar xzf $b/nccl-tests.tar.gz -C $src --strip-components=1
make -C $src -j32 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=$b/shim CUDA_HOME=/usr/local/cuda NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > $o/build.log 2>&1; fi
one() { local name=$1 lib=$2 tune=$3; shift 3
  LD_LIBRARY_PATH=$lib NCCLSHIM_REAL_NCCL=$real NCCLSHIM_TUNE=$tune timeout 60 mpirun --allow-run-as-root --bind-to none -np 2 \
    -x LD_LIBRARY_PATH -x NCCLSHIM_REAL_NCCL -x NCCLSHIM_TUNE -x NCCL_NVLS_ENABLE $ar -g 1 -b 8 -e 128K -f 4 -w 20 -n 100 -c 0 "$@" > $o/ab/$name.log 2>&1; }
for set in "m2g:-m 2 -G 20" "m4g:-m 4 -G 20" "m8g:-m 8 -G 20" "m2gr:-m 2 -R 2 -G 20" "m8gr:-m 8 -R 2 -G 20" "m4:-m 4" "m8:-m 8"; do
  s=${set%%:*}; a=${set#*:}
  one real-$s $(dirname $real) "" $a
  one shim-$s $b/shim/lib "" $a
  one sb8-$s $b/shim/lib "sentinel_block:8K" $a
done
for f in $o/ab/*.log; do echo "== $(basename $f)"; grep -E '^ +[0-9]+ ' $f | awk '{print $1, $6, $10}' | tr '\n' ';'; echo; done
cd $b && NCCLSHIM_TUNE=sentinel_block:8K GPU_COUNTS=2 STEP_TIMEOUT=150 timeout 330 ./run.sh $o/tc torchcoalesced > $o/tc.out 2>&1
grep -v '^build' $o/tc/summary.txt | cut -c1-200
cd $o && rm -rf tc/bin && tar czf $OUT/d.tgz .
