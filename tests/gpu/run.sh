#!/usr/bin/env bash
# The GPU suite, on a machine with NVIDIA GPUs, nvcc and PyTorch (no Rust needed): compiles the
# C/CUDA programs, runs the correctness matrix, the PyTorch checks and the side-by-side
# benchmark through ncclshim, and writes logs and OUTDIR/summary.txt.
#   run.sh OUTDIR [collectives] [torch] [torchbench] [zerocopy] [meeting] [bench] [latepeer] [groupcost] [graphlaunch] [groupfused] [groupmoves] [torchcoalesced] [torchoverlap] [launch] [floor] [sanitizer] [waitlimit] [nccltests] [badinput] [faults] [observe] [netplugin]  (default: the first three)
# It runs from the folder `make gpu-bundle` makes (the shim in shim/lib beside this script).
# Environment (all optional):
#   GPU_COUNTS  GPU counts to run on (default "2 4", less those the machine lacks)
#   REAL_NCCL   the real libnccl.so.2 (default: the one in PyTorch's environment)
#   NCCL_INCLUDE  its nccl.h folder (default: REAL_NCCL/../../include)
#   SHIM_LIB    the folder holding the shim's libnccl.so.2 (default: shim/lib beside this file)
#   PYTHON (python3), NVCC (nvcc), NVCC_ARCH (-arch=native), QUICK=1 (a short run),
#   STEP_TIMEOUT (seconds any one program may run; default 900), BENCH_AA=1 (also time NCCL
#   against itself: the benchmark's noise floor)
#   For weighing settings (tests/gpu/compare_configs.py puts the runs side by side):
#   BENCH_CONFIGS  the benchmark's configurations (default "forward default"); any other NAME is
#                  the shim as built under the variables in BENCH_ENV_NAME ("VAR=value ...")
#   BENCH_ARGS     more arguments for every benchmark run, e.g. "--colls AllReduce"
#   COLLECTIVE_RUNS  only the correctness runs whose names contain one of these words
#   FLOOR_ARGS     more arguments for the floor, e.g. "--sizes 8M,16M"
#   FAULTS_CASES   only these cases of the faults suite (faults.cu's names)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
[ $# -ge 1 ] || { echo "usage: $0 OUTDIR [collectives] [torch] [torchbench] [zerocopy] [meeting] [bench] [latepeer] [groupcost] [graphlaunch] [groupfused] [groupmoves] [torchcoalesced] [torchoverlap] [launch] [floor] [sanitizer] [waitlimit] [nccltests] [badinput] [faults] [observe] [netplugin]" >&2; exit 2; }
mkdir -p "$1" && out=$(cd "$1" && pwd) && shift
suites=${*:-collectives torch bench}

# NVLink multicast stays off: on shared machines a program that uses it can take the GPUs down.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
nvcc=${NVCC:-nvcc}
shim_lib=${SHIM_LIB:-$here/shim/lib}
shim=$shim_lib/libnccl.so.2
real=${REAL_NCCL:-$($python -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)}
include=${NCCL_INCLUDE:-$(dirname "$(dirname "$real")")/include}
summary=$out/summary.txt
for f in "$shim" "$real" "$include/nccl.h"; do
  [ -e "$f" ] || { echo "missing $f (run \`make gpu-bundle\` and set REAL_NCCL/NCCL_INCLUDE)" >&2; exit 2; }
done
ngpus=$(nvidia-smi -L | grep -c '^GPU')
counts=""
for n in ${GPU_COUNTS:-2 4}; do [ "$n" -le "$ngpus" ] && counts="$counts $n"; done
[ -n "$counts" ] || { echo "no GPU count of '${GPU_COUNTS:-2 4}' fits $ngpus GPUs" >&2; exit 2; }

fails=0
step_timeout=${STEP_TIMEOUT:-900}
# One summary line: NAME, PASS when the status is 0, then details.
verdict() {
  local name=$1 status=$2; shift 2
  local word=PASS
  [ "$status" -eq 0 ] || { word=FAIL; fails=$((fails + 1)); }
  printf '%-44s %s  %s\n' "$name" "$word" "$*" | tee -a "$summary"
}
# The shim's own line, and the shim mapped, in a log: proof that the calls went through it.
shim_used() { grep -q '\[ncclshim\].*forwarding to real NCCL' "$1" && grep -q "mapped: .*$shim_lib" "$1"; }
# "ON/OFF": the communicators a log shows the core set up for, and those it left to NCCL.
core_counts() { echo "$(grep -c 'core on for comm' "$1")/$(grep -c 'core off for comm' "$1")"; }

{
  echo "ncclshim GPU suite, $(date -u '+%Y-%m-%d %H:%M UTC'), bundle $(cat "$here/VERSION" 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sort | uniq -c
  echo "nvcc: $($nvcc --version | tail -1)"
  echo "shim: $(readlink -f "$shim")"
  echo "real NCCL: $real ($(grep -h '^#define NCCL_\(MAJOR\|MINOR\|PATCH\)' "$include/nccl.h" | awk '{printf "%s%s", sep, $3; sep="."}'))"
  echo "GPU counts: $counts; suites: $suites"
} | tee "$summary"

# --- Build ---
mkdir -p "$out/bin"
flags=(-O2 -std=c++17 "${NVCC_ARCH:--arch=native}" -I"$here" -I"$include")
t0=$SECONDS
$nvcc "${flags[@]}" "$here/collectives.cu" -o "$out/bin/collectives" -L"$shim_lib" -lnccl \
  >"$out/build-collectives.log" 2>&1 &
pid1=$!
$nvcc "${flags[@]}" "$here/bench.cu" -o "$out/bin/bench" -ldl >"$out/build-bench.log" 2>&1 &
pid2=$!
$nvcc "${flags[@]}" "$here/launch_cost.cu" -o "$out/bin/launch_cost" -lcuda -ldl \
  >"$out/build-launch_cost.log" 2>&1 &
pid3=$!
$nvcc "${flags[@]}" "$here/traffic_floor.cu" -o "$out/bin/traffic_floor" -ldl \
  >"$out/build-traffic_floor.log" 2>&1 &
pid4=$!
$nvcc "${flags[@]}" "$here/latency_floor.cu" -o "$out/bin/latency_floor" \
  >"$out/build-latency_floor.log" 2>&1 &
pid5=$!
wait $pid1; s1=$?
wait $pid2; s2=$?
wait $pid3; s3=$?
wait $pid4; s4=$?
wait $pid5; s5=$?
verdict "build (nvcc)" $((s1 | s2 | s3 | s4 | s5)) "$((SECONDS - t0)) s; logs build-*.log"
cat "$out"/build-*.log

# --- The correctness matrix ---
collectives() {
  local n=$1 dir=$out/collectives-$n full=full big=256M
  [ "${QUICK:-0}" = 1 ] && full=quick big=16M
  # Every all-reduce the core can take, at every size, by the direct two-shot (one process; one
  # process per GPU through zero-copy mappings, also with buffers freed and allocated again at
  # the same addresses between tests, and in graphs), with cudaMalloc and with ncclMemAlloc
  # (cuMem, mapped for every GPU) buffers.
  local direct="NCCLSHIM_CORE=force NCCLSHIM_TUNE=sentinel_max:0,ll_max:0,one_shot_max:0"
  # Every collective on the core (the others by default only up to their measured limits) at every size it takes.
  local every=" NCCLSHIM_MAX_BYTES=all_gather:32M,reduce_scatter:32M,broadcast:32M,reduce:32M,all_to_all:32M,gather:32M,scatter:32M"
  # With every lone call of the collectives that move bytes sent as sentinel stores (on 2 ranks;
  # by default only chunks past 32 KiB), the matrix's words of all bits set included.
  # All-to-all in place, which only the core gets right (NCCL's is undefined): where it takes them all.
  local a2a_in_place=--alltoall-in-place
  mkdir -p "$dir"
  # name | library (shim or nccl) | environment | arguments
  local runs=(
    "procs-$full|shim||--launch procs --matrix $full --max-bytes $big"
    "procs-$full-forcecore|shim|NCCLSHIM_CORE=force|--launch procs --matrix $full --max-bytes $big"
    "procs-quick-nosentinel|shim|NCCLSHIM_TUNE=sentinel_max:0|--launch procs --matrix quick --max-bytes 0"
    "group-$full-forcedirect|shim|$direct|--launch group --matrix $full --max-bytes $big"
    "group-memalloc-forcedirect|shim|$direct|--launch group --matrix quick --memalloc --max-bytes $big"
    "procs-memalloc-split|shim||--launch procs --matrix quick --memalloc --split --max-bytes $big"
    "procs-graph|shim||--launch procs --matrix quick --graph --max-bytes 0"
    "procs-$full-forcedirect|shim|$direct|--launch procs --matrix $full --max-bytes $big"
    "procs-realloc-forcedirect|shim|$direct|--launch procs --matrix quick --realloc --max-bytes 32M"
    "procs-graph-forcedirect|shim|$direct|--launch procs --matrix quick --graph --max-bytes 32M"
    "procs-quick-everycore|shim|$every|--launch procs --matrix quick --max-bytes 32M $a2a_in_place"
    "group-quick-everycore|shim|$every|--launch group --matrix quick --max-bytes 32M $a2a_in_place"
    "procs-graph-everycore|shim|$every|--launch procs --matrix quick --graph --max-bytes 32M $a2a_in_place"
    "procs-quick-everycore-staged|shim|$every NCCLSHIM_TUNE=zero_copy:0|--launch procs --matrix quick --max-bytes 32M $a2a_in_place"
    "procs-quick-sentinelmoves|shim|$every NCCLSHIM_TUNE=sentinel_move_from:0|--launch procs --matrix quick --max-bytes 32M $a2a_in_place"
    "group-quick-sentinelmoves|shim|$every NCCLSHIM_TUNE=sentinel_move_from:0|--launch group --matrix quick --max-bytes 32M $a2a_in_place"
    "procs-graph-sentinelmoves|shim|$every NCCLSHIM_TUNE=sentinel_move_from:0|--launch procs --matrix quick --graph --max-bytes 32M $a2a_in_place"
    "group-split|shim||--launch group --matrix quick --split --max-bytes 0"
    "group-graph-memalloc|shim||--launch group --matrix quick --graph --memalloc --max-bytes 0"
    "threads-split|shim||--launch threads --matrix quick --split --max-bytes 0"
    "initall|shim||--launch initall --matrix quick --max-bytes 0"
    "nonblocking-group-split|shim||--launch group --nonblocking --matrix quick --split --max-bytes 0"
    "nonblocking-threads|shim||--launch threads --nonblocking --matrix quick --max-bytes 0"
    "nonblocking-procs-graph|shim||--launch procs --nonblocking --matrix quick --graph --max-bytes 0"
    "procs-windows|shim||--launch procs --memalloc --windows --matrix quick --max-bytes $big"
    "nonblocking-procs-windows|shim||--launch procs --nonblocking --memalloc --windows --matrix quick --max-bytes $big"
    "nonblocking-group-windows-everycore|shim|$every|--launch group --nonblocking --memalloc --windows --matrix quick --max-bytes 32M"
    "procs-p2p-disabled|shim|NCCL_P2P_DISABLE=1|--launch procs --matrix quick --max-bytes 0"
    "control-procs-$full|nccl||--launch procs --matrix $full --max-bytes $big"
  )
  for run in "${runs[@]}"; do
    IFS='|' read -r name lib vars args <<<"$run"
    if [ -n "${COLLECTIVE_RUNS:-}" ]; then
      local word wanted=no
      for word in $COLLECTIVE_RUNS; do [[ $name == *$word* ]] && wanted=yes; done
      [ $wanted = yes ] || continue
    fi
    local log=$dir/$name.log libdir=$shim_lib t=$SECONDS
    [ "$lib" = nccl ] && libdir=$(dirname "$real")
    # shellcheck disable=SC2086
    env $vars LD_LIBRARY_PATH="$libdir" NCCLSHIM_REAL_NCCL="$real" NCCL_DEBUG=INFO \
      NCCL_DEBUG_SUBSYS=INIT timeout "$step_timeout" "$out/bin/collectives" --ngpus "$n" \
      --timeout "$((step_timeout - 10))" $args >"$log" 2>&1
    local status=$? wrong
    wrong=$(grep -h '^#wrong' "$log" | tail -1)
    local used=no
    shim_used "$log" && used=yes
    # Through the shim it must be in use; the control run must not touch it.
    [ "$lib" = shim ] && [ $used = no ] && status=1
    [ "$lib" = nccl ] && [ $used = yes ] && status=1
    # Nonblocking communicators must get the core too (after their first all-reduce), and split
    # children (made inside a group; a nonblocking parent's at their first all-reduce) as well as
    # their parents.
    local core
    core=$(core_counts "$log")
    [[ $name == nonblocking-* ]] && [ "${core%/*}" = 0 ] && status=1
    # --split makes two sets of children: of every rank, then of all but the last (a child of
    # one on 2 ranks, which gets no core). A blocking parent's children meet on it.
    local children=$n
    [ "$n" -ge 3 ] && children=$((2 * n - 1))
    [[ $name == *split* ]] && [ "${core%/*}" != $((n + children)) ] && status=1
    [[ $name == *split* && $name != nonblocking* ]] &&
      [ "$(grep -c 'core on for comm.* on its parent' "$log")" != "$children" ] && status=1
    # Communicators whose ranks are all on this host meet in shared memory, not through NCCL
    # (nonblocking ones after their first all-reduce); only a nonblocking parent's children,
    # which no unique id names, meet through NCCL.
    local through_nccl=0
    [[ $name == nonblocking*split* ]] && through_nccl=$children
    [ "$(grep -c 'core on for comm.* through NCCL' "$log")" != "$through_nccl" ] && status=1
    # Where NCCL is told not to use peer-to-peer, neither is the core.
    [[ $name == *p2p-disabled* ]] && [ "${core%/*}" != 0 ] && status=1
    # One process per GPU, direct: the peers' buffers were mapped (zero-copy) and used; with
    # --realloc, buffers came back at the same addresses (what the buffer id check is for).
    local zero_copy=""
    if [[ $name == procs-*forcedirect ]]; then
      local served offered same
      served=$(grep -ho 'zero-copy of rank [0-9]*: [0-9]* calls direct' "$log" | awk '{s += $5} END {print s + 0}')
      offered=$(grep -ho '[0-9]* allocations offered' "$log" | awk '{s += $1} END {print s + 0}')
      [ "$served" -gt 0 ] || status=1
      zero_copy="; zero-copy: $served calls on the peers' buffers, $offered allocations offered"
      if [[ $name == *realloc* ]]; then
        same=$(grep -ho 'realloc: [0-9]* of [0-9]*' "$log" | awk '{s += $2; n += $4} END {print s + 0 " of " n + 0}')
        [ "${same%% *}" -gt 0 ] || status=1
        zero_copy="$zero_copy; $same reallocations at the same address"
      fi
    fi
    verdict "collectives $n GPUs $name" $status "${wrong:-#wrong ?} ($(grep -h '^checks' "$log" | tail -1)); shim in use: $used; core on/off: $core$zero_copy; $((SECONDS - t)) s"
  done
}

# --- PyTorch, unchanged: without the shim, with it forwarding everything, with it as built ---
torch_suite() {
  local n=$1 dir=$out/torch-$n t=$SECONDS
  mkdir -p "$dir"
  local launch=($python -m torch.distributed.run --standalone --nproc_per_node "$n" "$here/torch_collectives.py")
  local common=(CUBLAS_WORKSPACE_CONFIG=:4096:8 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT)
  env "${common[@]}" timeout "$step_timeout" "${launch[@]}" "$dir/nccl" >"$dir/nccl.log" 2>&1
  local s_nccl=$?
  local preload=(LD_PRELOAD="$shim" NCCLSHIM_REAL_NCCL="$real")
  env "${common[@]}" "${preload[@]}" NCCLSHIM_CORE=0 timeout "$step_timeout" "${launch[@]}" \
    "$dir/shim-forward" >"$dir/shim-forward.log" 2>&1
  local s_fwd=$?
  env "${common[@]}" "${preload[@]}" timeout "$step_timeout" "${launch[@]}" "$dir/shim" \
    >"$dir/shim.log" 2>&1
  local s_shim=$?
  # Every collective the core has on it, to the staged limit (by default only to the measured ones).
  local every=(NCCLSHIM_MAX_BYTES=all_gather:32M,reduce_scatter:32M,broadcast:32M,reduce:32M,all_to_all:32M,gather:32M,scatter:32M)
  env "${common[@]}" "${preload[@]}" "${every[@]}" timeout "$step_timeout" "${launch[@]}" \
    "$dir/shim-every" >"$dir/shim-every.log" 2>&1
  local s_every=$?
  # PyTorch's nonblocking communicators (their core is set up after their first all-reduce),
  # without and with the shim. PyTorch 2.11's all_to_all_single fails there with NCCL alone
  # ("NCCL Error 7: NCCL operation in progress"), so both leave it out.
  local nonblocking=(TORCH_NCCL_USE_COMM_NONBLOCKING=1 TORCH_COLLECTIVES_SKIP=all_to_all)
  env "${common[@]}" "${nonblocking[@]}" timeout "$step_timeout" "${launch[@]}" \
    "$dir/nccl-nonblocking" >"$dir/nccl-nonblocking.log" 2>&1
  local s_nb_nccl=$?
  env "${common[@]}" "${preload[@]}" "${nonblocking[@]}" timeout "$step_timeout" "${launch[@]}" \
    "$dir/shim-nonblocking" >"$dir/shim-nonblocking.log" 2>&1
  local s_nb=$?
  # Forwarding everything, every bit must match; with our own all-reduce, DDP's float sums may
  # be added in another order.
  $python "$here/torch_compare.py" "$dir/shim-forward" "$dir/nccl" >"$dir/compare-forward.log" 2>&1
  local c_fwd=$?
  $python "$here/torch_compare.py" --ddp-rtol 1e-5 "$dir/shim" "$dir/nccl" >"$dir/compare.log" 2>&1
  local c_shim=$?
  $python "$here/torch_compare.py" --ddp-rtol 1e-5 "$dir/shim-every" "$dir/nccl" >"$dir/compare-every.log" 2>&1
  local c_every=$?
  # The core must have served each collective PyTorch issues through NCCL's own API: the
  # summary's line of its function names a kernel of the core.
  local served="" function
  for function in AllGather ReduceScatter 'B(road)?cast' AlltoAll; do
    grep -qE "summary: .* $function [^:]*: .* core [a-z_]+ [1-9]" "$dir/shim-every.log" &&
      served+=" ${function/B(road)?cast/Broadcast}" || c_every=1
  done
  $python "$here/torch_compare.py" --ddp-rtol 1e-5 "$dir/shim-nonblocking" "$dir/nccl-nonblocking" \
    >"$dir/compare-nonblocking.log" 2>&1
  local c_nb=$? used=no
  # PyTorch's nonblocking communicators meet in shared memory too (their split children, which no
  # unique id names, through NCCL).
  grep -q 'core on for comm.* in shared memory' "$dir/shim-nonblocking.log" || c_nb=1
  shim_used "$dir/shim.log" && shim_used "$dir/shim-forward.log" && used=yes
  local status=$((s_nccl | s_fwd | s_shim | s_every | s_nb_nccl | s_nb | c_fwd | c_shim | c_every | c_nb))
  [ $used = yes ] || status=1
  # Every communicator PyTorch made (each all-reduces) gets the core, split children included.
  local core made core_nb made_nb
  core=$(core_counts "$dir/shim.log") made=$(grep -c 'Init COMPLETE' "$dir/shim.log")
  core_nb=$(core_counts "$dir/shim-nonblocking.log") made_nb=$(grep -c 'Init COMPLETE' "$dir/shim-nonblocking.log")
  [ "${core%/*}" = "$made" ] && [ "${core_nb%/*}" = "$made_nb" ] || status=1
  verdict "torch $n GPUs" $status "exit codes: without shim $s_nccl, forwarding $s_fwd, as built $s_shim, nonblocking without shim $s_nb_nccl and as built $s_nb; shim in use: $used; core on/off: $core of $made comms, nonblocking $core_nb of $made_nb ($(grep -c 'is nonblocking' "$dir/shim-nonblocking.log") made nonblocking, $(grep -c 'could not see its handle' "$dir/shim-nonblocking.log") children seen at their first all-reduce); $((SECONDS - t)) s"
  echo "  forwarding (NCCLSHIM_CORE=0) vs NCCL: $(tail -1 "$dir/compare-forward.log" | cut -c1-200)" | tee -a "$summary"
  echo "  as built vs NCCL: $(tail -1 "$dir/compare.log" | cut -c1-200)" | tee -a "$summary"
  echo "  every collective on the core (exit $s_every; served:${served:- none}) vs NCCL: $(tail -1 "$dir/compare-every.log" | cut -c1-200)" | tee -a "$summary"
  echo "  nonblocking (TORCH_NCCL_USE_COMM_NONBLOCKING=1, no all_to_all) vs NCCL alike: $(tail -1 "$dir/compare-nonblocking.log" | cut -c1-200)" | tee -a "$summary"
  grep -h "^torch rank" "$dir/shim.log" | sed 's/^/  as built: /' | tee -a "$summary"
}

# --- Zero-copy between processes, on one GPU (CUDA IPC works between processes of one device):
# the core's own GPU tests (shim/bin/core-tests, built by make gpu-bundle): two processes offer
# and map each other's buffers (cudaMalloc and cuMem, a buffer across two cuMem allocations of one
# reservation, one of them made again at its place), with the GPU of the mapping one busy; the
# same without buffer ids must read a stale mapping (the check the ids are for); the core's
# direct all-reduce between two processes through zero-copy, in and out of place, misaligned,
# on buffers made again at the same addresses, in a CUDA graph, and through the routed path
# with the trace timed, on a stream destroyed before the next call: 0 wrong, every routed call
# with a GPU time; the core through ncclCommSuspend (kept while a graph may hold it, freed
# otherwise, two communicators at once); a staged all-reduce on a green context of 8 SMs; calls
# 2^31 epochs past their flags' slots, as after billions of small calls, right once the count
# has passed a multiple of 2^29 (device.cuh, EPOCH_REFRESH), and no slot left 2^29 behind; 1 GiB
# of cuMem memory the peer mapped, freed with no call after: free again within 5 s ---
zero_copy_suite() {
  local dir=$out/zero-copy t=$SECONDS status=0 tests=$here/shim/bin/core-tests name
  rm -rf "$dir" && mkdir -p "$dir"
  [ -x "$tests" ] || { verdict "zero-copy (1 GPU)" 1 "no shim/bin/core-tests in the bundle"; return; }
  for name in two_processes_share_buffers_and_never_a_stale_one without_buffer_ids_the_stale_mapping_is_read \
    core_all_reduce_between_two_processes_through_zero_copy core_suspension_between_two_processes \
    core_on_a_green_context_between_two_processes core_epochs_far_along_between_two_processes \
    a_peer_lets_go_of_memory_freed_between_two_processes; do
    NCCLSHIM_TIMEOUT=60 NCCL_DEBUG=INFO CUDA_VISIBLE_DEVICES=0 timeout 300 "$tests" --exact \
      "core::zero_copy::gpu_test::$name" --ignored --nocapture >"$dir/$name.log" 2>&1 || status=1
  done
  local first
  first=$(grep -ho 'first call [0-9.]* ms' "$dir"/two_processes_*.log | awk '{print $3}' | paste -sd/)
  local back
  back=$(grep -ho 'after [0-9.]* ms' "$dir"/a_peer_*.log | awk '{print $2}')
  local right all
  right=$(cat "$dir"/core_*.log | grep -c ' 0 wrong$') all=$(cat "$dir"/core_*.log | grep -c ' wrong$')
  [ "$all" -gt 0 ] && [ "$right" = "$all" ] || status=1
  verdict "zero-copy (1 GPU)" $status "first calls on new buffers $first ms; freed memory the peer mapped free again after ${back:-?} ms; core all-reduce (eager, graph replays, timed trace): $right of $all right; $((SECONDS - t)) s; logs in zero-copy/"
}

# --- The set-up's meeting in shared memory, on one GPU: two processes through the shim and a
# stand-in NCCL (fake_operations_nccl.c, whose init returns once both ranks have entered it, as
# NCCL's does) make a communicator of 2 ranks (calls_client.c "pair"). Alike, they meet, make
# their GPU parts, exchange their records and decline (both ranks on one GPU); one nonblocking
# (NCCL_COMM_BLOCKING=0), both decline without waiting for the other ---
meeting_suite() {
  local dir=$out/meeting t=$SECONDS status=0 tag rank
  rm -rf "$dir" && mkdir -p "$dir"
  local cflags=(-O2 -std=gnu11 -I"$include" -I/usr/local/cuda/include)
  { gcc "${cflags[@]}" -shared -fPIC "$here/fake_operations_nccl.c" -o "$dir/libfake.so" &&
    gcc "${cflags[@]}" "$here/calls_client.c" -o "$dir/calls_client" -L"$shim_lib" -lnccl -lpthread \
      -Wl,-rpath,"$shim_lib"; } >"$dir/build.log" 2>&1 ||
    { verdict "set-up meeting (1 GPU)" 1 "build failed: meeting/build.log"; return; }
  for tag in alike mixed; do
    mkdir -p "$dir/$tag"
    for rank in 0 1; do
      local extra=()
      [ $tag = mixed ] && [ $rank = 1 ] && extra=(NCCL_COMM_BLOCKING=0)
      env NCCLSHIM_REAL_NCCL="$dir/libfake.so" FAKE_NCCL_BARRIER="$dir/$tag" PAIR_ID="$tag-$$" \
        NCCL_DEBUG=INFO CUDA_VISIBLE_DEVICES=0 "${extra[@]}" timeout 60 "$dir/calls_client" pair $rank \
        >"$dir/$tag-$rank.log" 2>&1 &
    done
    wait
  done
  local alike mixed
  alike=$(grep -l 'shares its GPU with another rank' "$dir"/alike-*.log | wc -l)
  mixed=$(grep -l 'not all blocking nor all nonblocking' "$dir"/mixed-*.log | wc -l)
  [ "$alike" = 2 ] && [ "$mixed" = 2 ] && [ "$(grep -l '^done' "$dir"/*-*.log | wc -l)" = 4 ] || status=1
  verdict "set-up meeting (1 GPU)" $status "alike: $alike of 2 ranks met and declined (one GPU); differing in blocking: $mixed of 2 declined without waiting; $((SECONDS - t)) s; logs in meeting/"
}

# --- PyTorch's all-reduce timed (torch_bench.py; TORCH_BENCH_COLLECTIVES names others too,
# TORCH_BENCH_MIB other sizes):
# bf16, one process per GPU under torchrun, eager and in a CUDA graph; runs without and with
# the shim alternate, three times each (eager calls wait on the host, whose pace varies by up
# to 2x from one launch to the next on a virtual machine), and
# torch_bench_report.py puts the best run of each side by side and fails where the shim is above
# TORCH_GATE_LIMIT (1.05) x NCCL ---
torch_bench_suite() {
  local n=$1 dir=$out/torch-bench-$n t=$SECONDS status=0 round alloc
  rm -rf "$dir" && mkdir -p "$dir"
  local launch=($python -m torch.distributed.run --standalone --nproc_per_node "$n" "$here/torch_bench.py")
  # PyTorch's caching allocator as it comes (cudaMalloc segments), and with expandable segments
  # (cuMem allocations of 2 or 20 MiB in one reservation).
  for alloc in default expandable; do
    local conf=()
    [ $alloc = expandable ] && conf=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
    for round in 1 2 3; do
      env "${conf[@]}" NCCL_DEBUG=WARN timeout "$step_timeout" "${launch[@]}" "$dir/nccl-$alloc-$round.json" \
        >"$dir/nccl-$alloc-$round.log" 2>&1 || status=1
      env "${conf[@]}" LD_PRELOAD="$shim" NCCLSHIM_REAL_NCCL="$real" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
        timeout "$step_timeout" "${launch[@]}" "$dir/shim-$alloc-$round.json" >"$dir/shim-$alloc-$round.log" 2>&1 ||
        status=1
    done
    echo "PyTorch's allocator: $alloc" >>"$dir/report.txt"
    $python "$here/torch_bench_report.py" --limit "${TORCH_GATE_LIMIT:-1.05}" --nccl "$dir"/nccl-$alloc-*.json \
      --shim "$dir"/shim-$alloc-*.json \
      >>"$dir/report.txt" 2>&1 || status=1
  done
  shim_used "$dir/shim-default-1.log" || status=1
  # Calls zero-copy took direct on the peers' buffers, as each rank says once its communicator
  # is aborted at the end (a PyTorch that cannot abort them says nothing): PyTorch's own
  # allocator's buffers are mapped, so some must be.
  local served
  served=$(cat "$dir"/shim-default-*.log | grep -ho 'zero-copy of rank [0-9]*: [0-9]* calls direct' | awk '{s += $5} END {print s + 0}')
  if grep -q 'torch bench rank 0: communicators aborted' "$dir"/shim-default-*.log; then
    [ "$served" -gt 0 ] || status=1
  else
    served="not known (communicators not aborted)"
  fi
  verdict "torch bench $n GPUs" $status "$(grep -h 'torch bench rank 0:' "$dir/shim-default-1.log" | cut -c1-80); zero-copy calls: $served; $((SECONDS - t)) s; table in torch-bench-$n/report.txt"
  sed 's/^/  /' "$dir/report.txt" | tee -a "$summary"
}

# --- The benchmark: shim and NCCL in one process, alternating. Configurations: forward (the
# shim forwards every call: NCCLSHIM_CORE=0; see bench_report.py for the band), default (the
# shim as built, its own code included), aa (NCCL against itself: the noise floor; BENCH_AA=1).
bench_suite() {
  local n=$1 configs=${BENCH_CONFIGS:-forward default}
  [ "${BENCH_AA:-0}" = 1 ] && configs="$configs aa"
  for config in $configs; do
    local t=$SECONDS name=bench-$config-$n vars=() check=--check-wrong
    local args=(--shim "$(readlink -f "$shim")" --real "$real" --ngpus "$n" --json "$out/$name.json")
    [ "${QUICK:-0}" = 1 ] && args+=(--max-bytes 64M --rounds 5 --round-us 1000)
    # shellcheck disable=SC2206
    args+=(${BENCH_ARGS:-})
    case $config in
      forward) vars=(NCCLSHIM_CORE=0); check=--check ;;
      default) ;;
      aa) args+=(--same) ;;
      *) local env_name=BENCH_ENV_$config
         # shellcheck disable=SC2206
         vars=(${!env_name:-}) ;;
    esac
    env "${vars[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout "$step_timeout" \
      "$out/bin/bench" "${args[@]}" >"$out/$name.log" 2>&1
    local status=$?
    grep -E '^(#|  )' "$out/$name.log" >"$out/$name.txt"  # the tables, without NCCL's lines
    local report
    report=$($python "$here/bench_report.py" $check "$out/$name.json" 2>&1)
    status=$((status | $?))
    [ $config = aa ] || grep -q '\[ncclshim\].*forwarding to real NCCL' "$out/$name.log" || status=1
    verdict "bench $n GPUs $config" $status "$report; $((SECONDS - t)) s; tables in $name.txt"
  done
}

# --- A late peer (late_peer.cu, torch_late_peer.py): each rank late by its own random 0 - 50 us
# before every call, one process per GPU, eager and in graphs, in place and apart, sizes across
# every kernel's range; through the shim and NCCL alternately in one run. Fails where a size
# takes more than LATE_PEER_LIMIT (1.5) x NCCL's time: a kernel that waits badly for a late
# peer stalls call after call. With every collective on the core too (LATE_PEER_EVERY=0: not),
# and groups of LATE_PEER_GROUP (8) all-reduces (0: not) ---
late_peer_suite() {
  local n=$1 dir=$out/late-peer-$n t=$SECONDS status=0 limit=${LATE_PEER_LIMIT:-1.5} round
  rm -rf "$dir" && mkdir -p "$dir"
  $nvcc "${flags[@]}" "$here/late_peer.cu" -o "$out/bin/late_peer" -ldl >"$out/build-late_peer.log" 2>&1 ||
    { verdict "late peer $n GPUs" 1 "build failed: build-late_peer.log"; return; }
  local args=(--shim "$(readlink -f "$shim")" --real "$real" --ngpus "$n" --limit "$limit" --runs "${LATE_PEER_RUNS:-3}")
  NCCL_DEBUG=WARN timeout "$step_timeout" "$out/bin/late_peer" "${args[@]}" --types bf16,i32 \
    >"$dir/all-reduce.log" 2>&1 || status=1
  verdict "late peer $n GPUs all-reduce (C)" $status "$(grep -h '^# ' "$dir/all-reduce.log" | tail -1); $((SECONDS - t)) s; late-peer-$n/all-reduce.log"
  if [ "${LATE_PEER_EVERY:-1}" = 1 ]; then
    local every=(NCCLSHIM_MAX_BYTES=all_gather:32M,reduce_scatter:32M,broadcast:32M,reduce:32M,all_to_all:32M)
    local s2=0 t2=$SECONDS
    env "${every[@]}" NCCL_DEBUG=WARN timeout "$step_timeout" "$out/bin/late_peer" "${args[@]}" --runs 2 \
      --colls AllGather,ReduceScatter,Broadcast,Reduce,AlltoAll --sizes 8K,128K,512K,2M,8M \
      >"$dir/every.log" 2>&1 || s2=1
    verdict "late peer $n GPUs every collective (C)" $s2 "$(grep -h '^# ' "$dir/every.log" | tail -1); $((SECONDS - t2)) s; late-peer-$n/every.log"
  fi
  # Groups of all-reduces (LATE_PEER_GROUP calls each, 0: none), several to a launch on the core.
  local group=${LATE_PEER_GROUP:-8}
  if [ "$group" -gt 1 ]; then
    local s4=0 t4=$SECONDS
    NCCL_DEBUG=WARN timeout "$step_timeout" "$out/bin/late_peer" "${args[@]}" --runs 2 --group "$group" \
      --types bf16,f32 --sizes 8K,256K,512K,1M >"$dir/groups.log" 2>&1 || s4=1
    verdict "late peer $n GPUs groups of $group all-reduces (C)" $s4 "$(grep -h '^# ' "$dir/groups.log" | tail -1); $((SECONDS - t4)) s; late-peer-$n/groups.log"
  fi
  local s3=0 t3=$SECONDS pairs=()
  local launch=($python -m torch.distributed.run --standalone --nproc_per_node "$n" "$here/torch_late_peer.py")
  for round in $(seq "${LATE_PEER_TORCH_ROUNDS:-2}"); do
    NCCL_DEBUG=WARN timeout "$step_timeout" "${launch[@]}" "$dir/nccl-$round.json" >"$dir/nccl-$round.log" 2>&1 || s3=1
    LD_PRELOAD="$shim" NCCLSHIM_REAL_NCCL="$real" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout "$step_timeout" \
      "${launch[@]}" "$dir/shim-$round.json" >"$dir/shim-$round.log" 2>&1 || s3=1
    pairs+=("$dir/nccl-$round.json" "$dir/shim-$round.json")
  done
  $python "$here/torch_late_peer.py" --compare --limit "$limit" "${pairs[@]}" >"$dir/torch.txt" 2>&1 || s3=1
  # The core served the shim's runs (each process says so).
  [ "$(grep -c 'core on for comm' "$dir/shim-1.log")" -ge "$n" ] || s3=1
  verdict "late peer $n GPUs PyTorch" $s3 "$(tail -1 "$dir/torch.txt"); $((SECONDS - t3)) s; late-peer-$n/torch.txt"
  grep -h 'SLOW' "$dir"/*.log "$dir/torch.txt" | head -20 | sed 's/^/  /' | tee -a "$summary"
}

# --- What a group costs the host (group_cost.cu): groups of four small all-reduces (and of four
# of no element, which NCCL only checks), as nccl-tests -m 4 issues them, host-bound under NCCL,
# through the shim and NCCL alternately in one run; one process per GPU, then one process for
# every GPU. Fails where the shim's best round takes more than GROUP_COST_LIMIT (1.05) x NCCL's
# per operation ---
group_cost_suite() {
  local n=$1 log=$out/group-cost-$n.txt t=$SECONDS status=0
  $nvcc "${flags[@]}" "$here/group_cost.cu" -o "$out/bin/group_cost" -ldl >"$out/build-group_cost.log" 2>&1 ||
    { verdict "group cost $n GPUs" 1 "build failed: build-group_cost.log"; return; }
  local args=(--shim "$(readlink -f "$shim")" --real "$real" --ngpus "$n" --limit "${GROUP_COST_LIMIT:-1.05}")
  : >"$log"
  for mode in "" --one-process; do
    # $mode unquoted: no word where empty.
    NCCL_DEBUG=WARN timeout "$step_timeout" "$out/bin/group_cost" "${args[@]}" $mode >>"$log" 2>&1 || status=1
  done
  verdict "group cost $n GPUs" $status "$(grep -h '^# [0-9]' "$log" | tr '\n' ' ')$((SECONDS - t)) s; group-cost-$n.txt"
  grep -v '^# shim\|^# nccl' "$log" | sed 's/^/  /' | tee -a "$summary"
}

# --- A CUDA graph's first launch against its next ones (graph_launch.cu): graphs of 20 small
# all-reduces or all-gathers per GPU, one process driving every GPU, through the shim and NCCL
# alternately in one run. Fails where a shim's launch takes more than GRAPH_LAUNCH_LIMIT (1.05) x
# NCCL's per call ---
graph_launch_suite() {
  local n=$1 log=$out/graph-launch-$n.txt t=$SECONDS status=0
  $nvcc "${flags[@]}" "$here/graph_launch.cu" -o "$out/bin/graph_launch" -ldl >"$out/build-graph_launch.log" 2>&1 ||
    { verdict "graph launch $n GPUs" 1 "build failed: build-graph_launch.log"; return; }
  NCCL_DEBUG=WARN timeout "$step_timeout" "$out/bin/graph_launch" --shim "$(readlink -f "$shim")" --real "$real" \
    --ngpus "$n" --limit "${GRAPH_LAUNCH_LIMIT:-1.05}" >"$log" 2>&1 || status=1
  verdict "graph launch $n GPUs" $status "$(tail -n 1 "$log"); $((SECONDS - t)) s; graph-launch-$n.txt"
  grep -v '^# shim\|^# nccl' "$log" | sed 's/^/  /' | tee -a "$summary"
}

# --- Groups of several calls on one communicator, checked value by value by group_KIND.cu: built
# (once a run: `built_groups` lists the kinds built), run through the shim (under the settings
# given, VAR=VALUE each, after TAG, which names a run under other settings than the default's, ""
# for none) and through NCCL alone as the control; the shim's exit summary must show fused
# launches ---
built_groups=" "
group_check() {
  local kind=$1 n=$2 tag=${3:+-$3} t=$SECONDS status=0
  local dir=$out/group-$kind-$n$tag name="group $kind $n GPUs${3:+ $3}"
  shift 3
  rm -rf "$dir" && mkdir -p "$dir"
  if [[ $built_groups != *" $kind "* ]]; then
    $nvcc "${flags[@]}" "$here/group_$kind.cu" -o "$out/bin/group_$kind" -ldl >"$out/build-group_$kind.log" 2>&1 ||
      { verdict "$name" 1 "build failed: build-group_$kind.log"; return; }
    built_groups+="$kind "
  fi
  env "$@" NCCLSHIM_REAL_NCCL="$real" NCCLSHIM_SUMMARY=1 NCCL_DEBUG=WARN timeout "$step_timeout" \
    "$out/bin/group_$kind" --lib "$(readlink -f "$shim")" --ngpus "$n" >"$dir/shim.log" 2>&1 || status=1
  NCCL_DEBUG=WARN timeout "$step_timeout" "$out/bin/group_$kind" --lib "$real" --ngpus "$n" >"$dir/nccl.log" 2>&1 || status=1
  local shared
  shared=$(grep -ho '[0-9]* in launches shared' "$dir/shim.log" | awk '{s += $1} END {print s + 0}')
  [ "$shared" -gt 0 ] || status=1
  verdict "$name" $status "shim: $(grep -h '^# ' "$dir/shim.log" | tail -1), $shared calls in shared launches; NCCL: $(grep -h '^# ' "$dir/nccl.log" | tail -1); $((SECONDS - t)) s; group-$kind-$n$tag/"
  grep -h 'wrong$' "$dir/shim.log" | grep -v ' 0 wrong$' | head -10 | sed 's/^/  /' | tee -a "$summary"
}

# Groups of all-reduces (group_fused.cu): the core fuses a group's small all-reduces of one type
# and op into one or two launches, and sends other groups to NCCL; every type and op, eager, over
# two streams and in graphs. Twice: as built (a group's small launches through the
# communicator's graphs), and with kernel launches only.
group_fused_suite() {
  group_check fused "$1" ""
  group_check fused "$1" kernellaunch NCCLSHIM_TUNE=graph_launch_max:0
}

# Groups of the other collectives (group_moves.cu): the core fuses a group's small calls of one
# packet kernel into one or two launches (the roots free to differ), and sends other groups to
# NCCL; every collective, type (and op), eager, over two streams and in graphs, each collective on
# the core at these sizes whatever this GPU's measured limits. Twice, as group_fused_suite.
group_moves_suite() {
  local every=NCCLSHIM_MAX_BYTES=all_gather:32M,reduce_scatter:32M,broadcast:32M,reduce:32M,all_to_all:32M,gather:32M,scatter:32M
  group_check moves "$1" "" "$every"
  group_check moves "$1" kernellaunch "$every" NCCLSHIM_TUNE=graph_launch_max:0
}

# --- PyTorch's coalescing manager timed (torch_coalesced.py): eight small bf16 all-reduces,
# all-gathers or reduce-scatters in one group, as DDP, FSDP and optimizers issue them, eager and
# in a CUDA graph; runs without and with the shim alternate, twice each; fails where the shim is
# above TORCH_GATE_LIMIT (1.05) x NCCL, or a result is wrong ---
torch_coalesced_suite() {
  local n=$1 dir=$out/torch-coalesced-$n t=$SECONDS status=0
  torch_rounds "$n" "$dir" torch_coalesced.py || status=1
  $python "$here/torch_bench_report.py" --limit "${TORCH_GATE_LIMIT:-1.05}" --nccl "$dir"/nccl-*.json \
    --shim "$dir"/shim-*.json >"$dir/report.txt" 2>&1 || status=1
  # The core served the shim's runs (each process says so; they end without an exit summary).
  [ "$(grep -c 'core on for comm' "$dir/shim-1.log")" -ge "$n" ] || status=1
  verdict "torch coalesced $n GPUs" $status "$(grep -h 'torch coalesced rank 0:' "$dir/shim-1.log" | cut -c1-60); $((SECONDS - t)) s; table in torch-coalesced-$n/report.txt"
  sed 's/^/  /' "$dir/report.txt" | tee -a "$summary"
}

# Two rounds of SCRIPT under torchrun on N GPUs, into DIR (made anew): NCCL alone
# (nccl-ROUND.json and .log), then the shim (shim-ROUND), then, where SETTINGS (VAR=VALUE ...)
# are given, the shim under them too (bounded-ROUND); fails where a run failed.
torch_rounds() {
  local n=$1 dir=$2 script=$3 settings=${4:-} status=0 round
  rm -rf "$dir" && mkdir -p "$dir"
  local launch=($python -m torch.distributed.run --standalone --nproc_per_node "$n" "$here/$script")
  for round in 1 2; do
    NCCL_DEBUG=WARN timeout "$step_timeout" "${launch[@]}" "$dir/nccl-$round.json" >"$dir/nccl-$round.log" 2>&1 ||
      status=1
    LD_PRELOAD="$shim" NCCLSHIM_REAL_NCCL="$real" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
      timeout "$step_timeout" "${launch[@]}" "$dir/shim-$round.json" >"$dir/shim-$round.log" 2>&1 || status=1
    if [ -n "$settings" ]; then
      # shellcheck disable=SC2086 # VAR=VALUE words
      env LD_PRELOAD="$shim" NCCLSHIM_REAL_NCCL="$real" $settings timeout "$step_timeout" "${launch[@]}" \
        "$dir/bounded-$round.json" >"$dir/bounded-$round.log" 2>&1 || status=1
    fi
  done
  return $status
}

# --- Collectives overlapped with compute (torch_overlap.py): after each of eight bf16 matrix
# products, an all-reduce, all-gather or reduce-scatter with async_op (as DDP and FSDP overlap
# them), the step timed eager and in a CUDA graph, and the collectives alone; runs without and
# with the shim alternate, twice each; fails where a step under the shim is above
# TORCH_GATE_LIMIT (1.05) x NCCL's, or a result is wrong ---
torch_overlap_suite() {
  local n=$1 dir=$out/torch-overlap-$n t=$SECONDS status=0
  # The core's grids bounded as NCCL's CTAs are: a table beside the verdict's, no gate.
  torch_rounds "$n" "$dir" torch_overlap.py "NCCLSHIM_TUNE=max_blocks:${TORCH_OVERLAP_BLOCKS:-32}" ||
    status=1
  $python "$here/torch_bench_report.py" --limit "${TORCH_GATE_LIMIT:-1.05}" --nccl "$dir"/nccl-*.json \
    --shim "$dir"/shim-*.json >"$dir/report.txt" 2>&1 || status=1
  $python "$here/torch_bench_report.py" --nccl "$dir"/nccl-*.json --shim "$dir"/bounded-*.json \
    >"$dir/report-bounded.txt" 2>&1 || status=1
  [ "$(grep -c 'core on for comm' "$dir/shim-1.log")" -ge "$n" ] || status=1
  verdict "torch overlap $n GPUs" $status "$(grep -h 'torch overlap: ' "$dir/nccl-1.log" | cut -c1-70); $(grep -h 'torch overlap rank 0:' "$dir/shim-1.log" | cut -c1-60); $((SECONDS - t)) s; table in torch-overlap-$n/report.txt"
  sed 's/^/  /' "$dir/report.txt" | tee -a "$summary"
  echo "  with NCCLSHIM_TUNE=max_blocks:${TORCH_OVERLAP_BLOCKS:-32}:" | tee -a "$summary"
  sed 's/^/  /' "$dir/report-bounded.txt" | tee -a "$summary"
}

# --- What the host pays per launch: the floor under eager times (a table, no verdict on it) ---
launch_suite() {
  local n=$1 log=$out/launch-cost-$n.txt
  timeout "$step_timeout" "$out/bin/launch_cost" --real "$real" --ngpus "$n" >"$log" 2>&1
  verdict "launch cost $n GPUs" $? "table in launch-cost-$n.txt"
  sed 's/^/  /' "$log" | tee -a "$summary"
}

# --- The floor: an all-reduce's NVLink traffic alone, against NCCL and the shim (a table) ---
floor_suite() {
  local n=$1 log=$out/traffic-floor-$n.txt
  # shellcheck disable=SC2086
  timeout "$step_timeout" "$out/bin/traffic_floor" --real "$real" --shim "$(readlink -f "$shim")" --ngpus "$n" \
    ${FLOOR_ARGS:-} >"$log" 2>&1
  verdict "traffic floor $n GPUs" $? "table in traffic-floor-$n.txt"
  grep -v '^NCCL\|\[ncclshim\]' "$log" | sed 's/^/  /' | tee -a "$summary"
  # The floor under a small call in a CUDA graph, between GPUs 0 and 1.
  [ "$n" = 2 ] || return 0
  log=$out/latency-floor.txt
  timeout "$step_timeout" "$out/bin/latency_floor" >"$log" 2>&1
  verdict "latency floor" $? "table in latency-floor.txt"
  sed 's/^/  /' "$log" | tee -a "$summary"
}

# --- NVIDIA's nccl-tests under the shim and under NCCL alone (nccl_tests.sh) ---
nccl_tests_suite() {
  local n=$1 t=$SECONDS
  if [ ! -f "$here/nccl-tests.tar.gz" ]; then
    verdict "nccl-tests $n GPUs SKIP" 0 "the bundle has no nccl-tests (make gpu-bundle NCCL_TESTS_GIT=...)"
    return
  fi
  REAL="$real" STEP_TIMEOUT="$step_timeout" "$here/nccl_tests.sh" "$out/nccl-tests-$n" "$n" \
    >"$out/nccl-tests-$n.log" 2>&1
  local line name status details
  while read -r line; do
    read -r _ name status details <<<"$line"
    verdict "nccl-tests $n GPUs $name" "$status" "$details"
  done < <(grep '^VERDICT ' "$out/nccl-tests-$n.log")
  grep -q '^VERDICT ' "$out/nccl-tests-$n.log" || verdict "nccl-tests $n GPUs" 1 "no verdict: nccl-tests-$n.log"
  echo "  ratios: nccl-tests-$n/nccl-tests-ratios.md; $((SECONDS - t)) s" | tee -a "$summary"
}

# --- A rank that never comes: the core's kernels give up after NCCLSHIM_TIMEOUT and say so ---
wait_limit_suite() {
  local n=$1 log=$out/wait-limit-$n.log t=$SECONDS
  $nvcc "${flags[@]}" "$here/wait_limit.cu" -o "$out/bin/wait_limit" -L"$shim_lib" -lnccl \
    >"$out/build-wait_limit.log" 2>&1 || { verdict "wait limit $n GPUs" 1 "build failed: build-wait_limit.log"; return; }
  env LD_LIBRARY_PATH="$shim_lib" NCCLSHIM_REAL_NCCL="$real" NCCLSHIM_CORE=force NCCLSHIM_TIMEOUT=3 \
    NCCL_DEBUG=WARN timeout "$step_timeout" "$out/bin/wait_limit" --limit 3 >"$log" 2>&1
  local status=$? cases warns
  local late
  cases=$(grep -c '^PASS' "$log")
  # One WARN per case, naming the rank that never came (the late rank's case too, for rank 0),
  # and one for the late rank, naming the rank it found on a later call.
  warns=$(grep -c 'WARN .*waited 3 s for rank 1 and gave up' "$log")
  late=$(grep -c 'WARN .*found rank 0 on a later call' "$log")
  [ "$cases" = 5 ] && [ "$warns" = 5 ] && [ "$late" = 1 ] || status=1
  verdict "wait limit $n GPUs" $status "$cases of 5 cases passed, $warns WARNs naming the missing rank, $late the rank out of step; $((SECONDS - t)) s"
  grep -h '^\(PASS\|FAIL\)' "$log" | sed 's/^/  /' | tee -a "$summary"
}

# --- compute-sanitizer over the core's kernels (only ours are instrumented; NCCL's own API
# errors, such as its probing for kernel images, are not ours to report): memcheck for each
# algorithm family, then racecheck, synccheck and initcheck; every tool must find 0 errors ---
sanitizer_suite() {
  local n=$1 dir=$out/sanitizer-$n cs=${COMPUTE_SANITIZER:-compute-sanitizer}
  mkdir -p "$dir"
  local forced="NCCLSHIM_CORE=force"
  # name | tool | environment (every all-reduce to the core; which algorithm by size, or forced)
  local runs=(
    "memcheck|memcheck|$forced"
    "memcheck-lowlatency-staged|memcheck|$forced NCCLSHIM_TUNE=sentinel_max:0,direct:0"
    "memcheck-twoshot|memcheck|$forced NCCLSHIM_TUNE=sentinel_max:0,ll_max:0,one_shot_max:0"
    "racecheck|racecheck|$forced"
    "synccheck|synccheck|$forced"
    "initcheck|initcheck|$forced"
  )
  for run in "${runs[@]}"; do
    IFS='|' read -r name tool vars <<<"$run"
    local log=$dir/$name.log t=$SECONDS
    # shellcheck disable=SC2086
    env $vars LD_LIBRARY_PATH="$shim_lib" NCCLSHIM_REAL_NCCL="$real" NCCL_DEBUG=WARN \
      timeout "$step_timeout" "$cs" --tool "$tool" --error-exitcode 9 --kernel-name kns=ncclshim_ \
      --report-api-errors no --print-limit 50 \
      "$out/bin/collectives" --launch group --ngpus "$n" --matrix quick --max-bytes "${SANITIZER_MAX_BYTES:-1M}" \
      --timeout "$((step_timeout - 10))" >"$log" 2>&1
    local status=$?
    local summary_line
    # racecheck sums up as "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)".
    summary_line=$(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$log" | tail -1)
    grep -q 'ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards' "$log" || status=1
    verdict "sanitizer $n GPUs $name" $status "${summary_line:-no ERROR SUMMARY}; $(grep -h '^#wrong' "$log" | tail -1); $((SECONDS - t)) s"
  done
}

# --- Bad input (bad_input.cu, 2 GPUs): each case once through the real NCCL, once through the
# shim with every all-reduce it can take given to the core; bad_input_compare.py puts them side by
# side in bad-input.md and fails on any case the shim answers otherwise ---
bad_input_suite() {
  local n=$1 dir=$out/bad-input t=$SECONDS
  if [ "$n" != 2 ]; then
    verdict "bad input $n GPUs SKIP" 0 "bad_input drives 2 GPUs"
    return
  fi
  mkdir -p "$dir"
  # The shim's own nccl.h first (the bundle's shim/include), as a program built against it.
  $nvcc -I"$shim_lib/../include" "${flags[@]}" "$here/bad_input.cu" -o "$out/bin/bad_input" \
    -L"$shim_lib" -lnccl >"$out/build-bad_input.log" 2>&1 ||
    { verdict "bad input $n GPUs" 1 "build failed: build-bad_input.log"; return; }
  # Both runs at once (processes of their own). INFO for INIT only: the WARN lines, and the shim's
  # "core on for comm" lines, which show that its core took the communicators.
  local logs=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT)
  env "${logs[@]}" LD_LIBRARY_PATH="$(dirname "$real")" timeout "$step_timeout" \
    "$out/bin/bad_input" >"$dir/nccl.log" 2>&1 &
  local pid=$!
  env "${logs[@]}" LD_LIBRARY_PATH="$shim_lib" NCCLSHIM_REAL_NCCL="$real" NCCLSHIM_CORE=force \
    timeout "$step_timeout" "$out/bin/bad_input" >"$dir/shim.log" 2>&1
  local s_shim=$? s_nccl
  wait $pid
  s_nccl=$?
  $python "$here/bad_input_compare.py" "$dir/nccl.log" "$dir/shim.log" >"$out/bad-input.md" 2>&1
  local status=$((s_nccl | s_shim | $?)) core
  grep -q "mapped: .*$shim_lib" "$dir/shim.log" && ! grep -q "mapped: .*$shim_lib" "$dir/nccl.log" ||
    status=1
  core=$(core_counts "$dir/shim.log")
  [ "${core%/*}" -gt 0 ] || status=1
  verdict "bad input $n GPUs" $status "$(tail -1 "$out/bad-input.md"); exit codes $s_nccl (NCCL) $s_shim (shim); core on/off: $core; $((SECONDS - t)) s; bad-input.md"
  grep -h '^- FAIL' "$out/bad-input.md" | sed 's/^/  /' | tee -a "$summary"
}

# --- Faults (faults.cu, 2 GPUs): an abort while a kernel waits, destroy after revoke, two streams
# of one communicator, a rank killed mid-loop, ranks' calls that differ, and create/all-reduce/
# destroy cycles with the resources they leave printed and checked flat. Every all-reduce on the
# core; its wait limit far above the cases' deadlines, so that an abort, not the limit, ends each
# wait, but in the cases of calls that differ, where the limit ends the wait left over ---
faults_suite() {
  local n=$1 dir=$out/faults t=$SECONDS
  if [ "$n" != 2 ]; then
    verdict "faults $n GPUs SKIP" 0 "faults drives 2 GPUs"
    return
  fi
  mkdir -p "$dir"
  $nvcc "${flags[@]}" "$here/faults.cu" -o "$out/bin/faults" -L"$shim_lib" -lnccl -ldl \
    >"$out/build-faults.log" 2>&1 || { verdict "faults" 1 "build failed: build-faults.log"; return; }
  local shim_env=(LD_LIBRARY_PATH="$shim_lib" NCCLSHIM_REAL_NCCL="$real" NCCLSHIM_CORE=force NCCLSHIM_TIMEOUT=600)
  local case
  local once=(abort-while-waiting destroy-after-revoke two-streams kill-rank one-rank-launch-fails counts-differ)
  local leaks=(leak-split-one-process leak-split-procs leak-one-process leak-procs leak-groups)
  # FAULTS_CASES: the cases to run (default all).
  local chosen=" ${FAULTS_CASES:-${once[*]} ${leaks[*]}} "
  for case in "${once[@]}"; do
    [[ $chosen == *" $case "* ]] || continue
    local log=$dir/$case.log t1=$SECONDS limit=()
    # Here the wait limit is what ends the peer's wait for the rest of its call.
    [[ $case == one-rank-launch-fails || $case == counts-differ ]] && limit=(NCCLSHIM_TIMEOUT=5)
    env "${shim_env[@]}" "${limit[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 300 "$out/bin/faults" "$case" >"$log" 2>&1
    local status=$? core
    core=$(core_counts "$log")
    shim_used "$log" && [ "${core%/*}" -gt 0 ] || status=1
    verdict "faults $case" $status "$(grep -h "^\(PASS\|FAIL\|SKIP\) $case" "$log" | cut -d' ' -f3- | cut -c1-220); core on/off: $core; $((SECONDS - t1)) s"
  done
  # The leak cycles: NCCL logs little (ENV), the shim its release lines, which faults reads back.
  # Communicators split from one made first (the core set up and released each cycle) for up to
  # FAULTS_LEAK_BUDGET seconds, sharing the parent's NCCL resources (40 ms a cycle instead of
  # 0.6 s; FAULTS_SPLIT_SHARE=0: not); made by NCCL's whole init (0.6 s each) for a minute; and
  # groups of the core's all-reduces on two communicators for 20 s (millions of groups).
  for case in "${leaks[@]}"; do
    [[ $chosen == *" $case "* ]] || continue
    local log=$dir/$case.log t1=$SECONDS budget=${FAULTS_LEAK_BUDGET:-240}
    [[ $case == *split* ]] || budget=${FAULTS_INIT_LEAK_BUDGET:-60}
    local cycles=10000
    [ $case = leak-groups ] && budget=20 cycles=100000000
    rm -f "$dir/$case".*.debug
    env "${shim_env[@]}" NCCL_COMM_SPLIT_SHARE_RESOURCES=${FAULTS_SPLIT_SHARE:-1} NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV NCCL_DEBUG_FILE="$dir/$case.%p.debug" \
      timeout $((budget + 300)) "$out/bin/faults" "$case" --cycles "$cycles" --budget "$budget" >"$log" 2>&1
    local status=$? on
    on=$(cat "$dir/$case".*.debug 2>/dev/null | grep -c 'core on for comm')
    [ "$on" -gt 0 ] || status=1
    verdict "faults $case" $status "$(grep -h "^\(PASS\|FAIL\) $case" "$log" | cut -d' ' -f3- | cut -c1-200); core on for $on comms; $((SECONDS - t1)) s"
    grep -h '^STATS' "$log" | sed 's/^STATS /  /' | tee -a "$summary"
    # The debug files are large: keep their last lines only.
    for f in "$dir/$case".*.debug; do [ -f "$f" ] && tail -200 "$f" >"$f.tail" && rm -f "$f"; done
  done
  echo "  faults: $((SECONDS - t)) s" | tee -a "$summary"
}

# --- NCCL's network plugins behind the shim (netplugin): a TCP plugin of ours
# (net_socket_plugin.c), the correctness matrix one process per GPU through it with peer-to-peer
# and shared memory off, under NCCL alone and under the shim: 0 wrong in both, NCCL's log names
# the plugin in both ("NET/Plugin: Loaded net plugin shimtest", "Using network shimtest"), and the
# core stays off (NCCL_P2P_DISABLE) ---
net_plugin_suite() {
  local n=$1 dir=$out/netplugin-$n t=$SECONDS
  mkdir -p "$dir"
  local plugin=$out/bin/libnccl-net-shimtest.so
  cc -O2 -shared -fPIC -I"$here" "$here/net_socket_plugin.c" -o "$plugin" >"$out/build-net_plugin.log" 2>&1 ||
    { verdict "netplugin $n GPUs" 1 "build failed: build-net_plugin.log"; return; }
  local lib
  for lib in nccl shim; do
    local log=$dir/$lib.log libdir=$shim_lib t1=$SECONDS
    [ "$lib" = nccl ] && libdir=$(dirname "$real")
    env LD_LIBRARY_PATH="$libdir" NCCLSHIM_REAL_NCCL="$real" NCCL_NET_PLUGIN="$plugin" \
      NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
      timeout "$step_timeout" "$out/bin/collectives" --ngpus "$n" --launch procs --matrix quick \
      --max-bytes 0 --timeout "$((step_timeout - 10))" >"$log" 2>&1
    local status=$? loaded used core
    loaded=$(grep -c 'NET/Plugin: Loaded net plugin shimtest' "$log")
    used=$(grep -c 'Using network shimtest' "$log")
    core=$(core_counts "$log")
    grep -q '^#wrong 0' "$log" && [ "$loaded" -gt 0 ] && [ "$used" -gt 0 ] || status=1
    if [ "$lib" = shim ]; then
      shim_used "$log" && [ "${core%/*}" = 0 ] || status=1
    else
      ! shim_used "$log" || status=1
    fi
    verdict "netplugin $n GPUs $lib" $status "$(grep -h '^#wrong' "$log" | tail -1); plugin loaded in $loaded and used by $used communicators; core on/off: $core; $((SECONDS - t1)) s"
  done
}

# --- What the shim says it did (observe): the correctness matrix once more, one thread per GPU
# with split communicators (one process: its ranks' rank processes end with _exit, which skips
# what runs at exit), with the exit summary and the trace on, timed: the summary must count the
# core's calls, the trace (trace_check.py --timed) must number every communicator's calls without
# a gap, drop none, and give the routed ones a GPU time ---
observe_suite() {
  local n=$1 dir=$out/observe-$n t=$SECONDS
  rm -rf "$dir" && mkdir -p "$dir"
  env LD_LIBRARY_PATH="$shim_lib" NCCLSHIM_REAL_NCCL="$real" NCCLSHIM_SUMMARY=1 \
    NCCLSHIM_TRACE="$dir/trace.%p.jsonl" NCCLSHIM_TRACE_TIMING=1 NCCL_DEBUG=WARN timeout "$step_timeout" \
    "$out/bin/collectives" --ngpus "$n" --launch threads --split --matrix quick --max-bytes 0 \
    --timeout "$((step_timeout - 10))" >"$dir/collectives.log" 2>&1
  local status=$? routed check
  routed=$(grep -c 'NCCL INFO summary: .* AllReduce .*core ' "$dir/collectives.log")
  grep -q '^#wrong 0' "$dir/collectives.log" && [ "$routed" -gt 0 ] || status=1
  check=$($python "$here/trace_check.py" --timed "$dir"/trace.*.jsonl 2>&1) || status=1
  verdict "observe $n GPUs" $status "$(grep -h '^#wrong' "$dir/collectives.log" | tail -1); summary lines of routed all-reduces: $routed; trace: $check; $((SECONDS - t)) s"
  grep -h 'NCCL INFO summary: .*rank 0 ' "$dir/collectives.log" | sed 's/^.*NCCL INFO /  /' | head -12 | tee -a "$summary"
  coll_lines "$n"
}

# The log of calls (NCCL_DEBUG_SUBSYS=COLL, part of observe): NCCL writes a line for each collective
# call, the shim one for each call NCCL never sees. The correctness matrix with every collective on
# the core, in one process, its calls in groups (--launch group) and alone (--launch threads),
# under NCCL alone and under the shim: the same lines, by collective, in both (the shim's and
# NCCL's together), some of them the shim's, whose opCount counts each communicator's calls on the
# core (each line's the last one's or the next).
coll_lines() {
  local n=$1 dir=$out/coll-lines-$n t=$SECONDS status=0 lib launch details=""
  rm -rf "$dir" && mkdir -p "$dir"
  local every=NCCLSHIM_MAX_BYTES=all_gather:32M,reduce_scatter:32M,broadcast:32M,reduce:32M,all_to_all:32M,gather:32M,scatter:32M
  for launch in group threads; do
    for lib in nccl shim; do
      local libdir=$shim_lib log=$dir/$lib-$launch.log
      [ "$lib" = nccl ] && libdir=$(dirname "$real")
      env $every LD_LIBRARY_PATH="$libdir" NCCLSHIM_REAL_NCCL="$real" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL \
        timeout "$step_timeout" "$out/bin/collectives" --ngpus "$n" --launch $launch --matrix quick \
        --max-bytes 32M --timeout "$((step_timeout - 10))" >"$log" 2>&1 || status=1
      grep -q '^#wrong 0' "$log" || status=1
      grep -o 'NCCL INFO [A-Za-z]*: opCount ' "$log" | cut -d' ' -f3 | tr -d : | sort | uniq -c |
        awk '{print $2, $1}' >"$dir/$lib-$launch.counts"
    done
    local ours counted
    ours=$(grep -c '\[ncclshim\] NCCL INFO [A-Za-z]*: opCount ' "$dir/shim-$launch.log")
    cmp -s "$dir/nccl-$launch.counts" "$dir/shim-$launch.counts" && [ "$ours" -gt 0 ] || status=1
    counted=$($python - "$dir/shim-$launch.log" <<'PY'
import re, sys
last = {}
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"\[ncclshim\] NCCL INFO \w+: opCount ([0-9a-f]+) .* comm (\S+) ", line)
    if m:
        count, comm = int(m.group(1), 16), m.group(2)
        if count - last.get(comm, 0) not in (0, 1):
            sys.exit(f"opCount {count:x} after {last.get(comm, 0):x} on comm {comm}")
        last[comm] = count
print(f"opCount up to {max(last.values(), default=0)} in {len(last)} comms")
PY
    ) || status=1
    details+="$launch: lines by collective, NCCL alone: $(paste -sd, "$dir/nccl-$launch.counts" | sed "s/,/, /g"); under the shim: $(paste -sd, "$dir/shim-$launch.counts" | sed "s/,/, /g"), $ours of them the shim's, $counted. "
  done
  verdict "observe $n GPUs: the log of calls" $status "$details$((SECONDS - t)) s"
}

for n in $counts; do
  for suite in $suites; do
    case $suite in
      collectives) collectives "$n" ;;
      torch) torch_suite "$n" ;;
      torchbench) torch_bench_suite "$n" ;;
      zerocopy) zero_copy_suite ;;
      meeting) meeting_suite ;;
      bench) bench_suite "$n" ;;
      latepeer) late_peer_suite "$n" ;;
      groupcost) group_cost_suite "$n" ;;
      graphlaunch) graph_launch_suite "$n" ;;
      groupfused) group_fused_suite "$n" ;;
      groupmoves) group_moves_suite "$n" ;;
      torchcoalesced) torch_coalesced_suite "$n" ;;
      torchoverlap) torch_overlap_suite "$n" ;;
      launch) launch_suite "$n" ;;
      floor) floor_suite "$n" ;;
      sanitizer) sanitizer_suite "$n" ;;
      waitlimit) wait_limit_suite "$n" ;;
      nccltests) nccl_tests_suite "$n" ;;
      badinput) bad_input_suite "$n" ;;
      faults) faults_suite "$n" ;;
      observe) observe_suite "$n" ;;
      netplugin) net_plugin_suite "$n" ;;
      *) echo "unknown suite $suite" >&2; exit 2 ;;
    esac
  done
done
if ls "$out"/bench-*.json >/dev/null 2>&1; then
  $python "$here/bench_report.py" --plot "$out" "$out"/bench-*.json >"$out/bench-report.log" 2>&1 ||
    echo "(no plot: see bench-report.log)" | tee -a "$summary"
fi
echo "RESULT: $([ $fails -eq 0 ] && echo PASS || echo "FAIL ($fails failed)") in $SECONDS s" | tee -a "$summary"
[ $fails -eq 0 ]
