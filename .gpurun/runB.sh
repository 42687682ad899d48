#!/usr/bin/env bash
# 2 GPUs: sentinel_block A/B (nccl-tests all_reduce, mpirun -np 2), then the limits row on H200.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
b=$PWD/.bundle o=$OUT/b
mkdir -p $o/ab
nvidia-smi -L; gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0)
real=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
src=/tmp/nt; mkdir -p $src; tar xzf $b/nccl-tests.tar.gz -C $src --strip-components=1
make -C $src -j32 MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi NCCL_HOME=$b/shim CUDA_HOME=/usr/local/cuda \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > $o/build.log 2>&1 || { tail $o/build.log; }
ar=$src/build/all_reduce_perf
one() { # name libdir tune args...
  local name=$1 lib=$2 tune=$3; shift 3
  LD_LIBRARY_PATH=$lib NCCLSHIM_REAL_NCCL=$real NCCLSHIM_TUNE=$tune timeout 60 mpirun --allow-run-as-root --bind-to none -np 2 \
    -x LD_LIBRARY_PATH -x NCCLSHIM_REAL_NCCL -x NCCLSHIM_TUNE -x NCCL_NVLS_ENABLE $ar -g 1 -b 8 -e 128K -f 4 -w 20 -n 100 -c 0 "$@" > $o/ab/$name.log 2>&1
}
t0=$SECONDS
for rep in 1 2; do
  for set in "r2g:-R 2 -G 20" "g:-G 20" "e:"; do
    s=${set%%:*}; a=${set#*:}
    one real-$s-$rep $(dirname $real) "" $a
    one shim-$s-$rep $b/shim/lib "" $a
    one sb8-$s-$rep $b/shim/lib "sentinel_block:8K" $a
  done
done
echo "A/B: $((SECONDS - t0)) s"
for f in $o/ab/*.log; do echo "== $(basename $f)"; grep -E '^ +[0-9]+ ' $f | awk '{print $1, $6, $10}' | tr '\n' ';'; echo; done
if [[ $gpu == *H200* ]]; then
  cd $b && NCCL_TESTS_GROUPS=limits REAL=$real STEP_TIMEOUT=60 timeout 400 ./nccl_tests.sh $o/lim 2 > $o/lim.log 2>&1
  tail -5 $o/lim.log; cat $o/lim/nccl-tests-limits.md 2>/dev/null | tail -3
fi
cd $o && tar czf $OUT/b.tgz . 
