#!/usr/bin/env bash
# NVIDIA's nccl-tests, the benchmark every NCCL user runs first, under the shim and under the
# real NCCL: same binary, same GPUs, one after the other. Called by run.sh (suite nccltests).
#   nccl_tests.sh OUTDIR NGPUS
# Needs, beside this script: nccl-tests.tar.gz (the source; `make gpu-bundle NCCL_TESTS_GIT=...`),
# shim/ (the 2.28.9 build and headers) and, optionally, shim-2.27.7/ (the 2.27.7 build and
# headers). Environment from run.sh: REAL (the real libnccl.so.2), NVCC_GENCODE (optional),
# NCCL_TESTS_QUICK=1 (fewer runs), NCCL_TESTS_GROUPS (only these groups of runs, e.g. "core
# coregraph"; the cold start always runs), NCCL_TESTS_BINARIES (only these binaries in the
# groups that run every binary), STEP_TIMEOUT, NCCL_TESTS_GATE_LIMIT (the gate's largest shim /
# real median time, default 1.05), NCCL_TESTS_GATE_ROUNDS (default 3),
# NCCL_TESTS_GATE_SETS (only these of the gate's sets, e.g. "plain -r2 -g -r2g -m2 -m4 -m8 -m4g
# -m8g"); for the tune group NCCL_TESTS_TUNES (the settings to weigh), NCCL_TESTS_TUNE_SETS,
# NCCL_TESTS_TUNE_MODES ("mpi group"), NCCL_TESTS_TUNE_ROUNDS and NCCL_TESTS_TUNE_MAX (below).
# Groups: basic (every binary), reg1, reg2, graph, types, core, coregraph, corelarge,
# corewindows, coretypes, batch, batchgraph, batchpairs, large, gate (all_reduce's speed per size, shim and NCCL alone taking turns), tune
# (the shim under other settings beside it) and limits.
# Writes OUTDIR/nccl-tests/ (one log per run), OUTDIR/nccl-tests-ratios.md (shim / real per
# size), OUTDIR/nccl-tests-gate.md (the gate's best times) and one line per group of runs on
# stdout: "VERDICT <name> <0|1> <details>".
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
out=$1 n=$2
dir=$out/nccl-tests
mkdir -p "$dir"
real=${REAL:?REAL names the real libnccl.so.2}
real_dir=$(dirname "$real")
deadline=${STEP_TIMEOUT:-120}
[ "$deadline" -gt 120 ] && deadline=120
mpi_home=${MPI_HOME:-/usr/lib/$(uname -m)-linux-gnu/openmpi}
gencode=${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}

verdict() { echo "VERDICT $*"; }

# --- Build: nccl-tests against each shim build's headers, both at once ---
builds=()
for flavor in 2.28.9 2.27.7; do
  shim_dir=$here/shim
  [ $flavor = 2.27.7 ] && shim_dir=$here/shim-2.27.7
  [ -f "$shim_dir/include/nccl.h" ] || continue
  src=$dir/src-$flavor
  rm -rf "$src" && mkdir -p "$src" && tar xzf "$here/nccl-tests.tar.gz" -C "$src" --strip-components=1
  (make -C "$src" -j16 MPI=1 MPI_HOME="$mpi_home" NCCL_HOME="$shim_dir" CUDA_HOME=/usr/local/cuda \
    NVCC_GENCODE="$gencode" src.build >"$dir/build-$flavor.log" 2>&1) &
  builds+=("$flavor:$!:$shim_dir")
done
built=()
for b in "${builds[@]}"; do
  IFS=: read -r flavor pid shim_dir <<<"$b"
  if wait "$pid"; then built+=("$flavor:$shim_dir"); else
    verdict "build-$flavor" 1 "make failed: nccl-tests/build-$flavor.log"; fi
done
[ ${#built[@]} -gt 0 ] || exit 1
verdict build 0 "nccl-tests built against the headers of ${built[*]%%:*}"

# Settings added to the shim's runs (VAR=VALUE each), e.g. the core on for every collective.
shim_env=()

# One run: NAME LIB(shim|real) FLAVOR MODE(mpi|group) BINARY ARGS...; its log is $dir/NAME.log.
# Lines are stamped with the seconds since the start, for the cold start's timing.
run_one() {
  local name=$1 lib=$2 flavor=$3 mode=$4 binary=$5
  shift 5
  local shim_dir=$here/shim bin
  [ "$flavor" = 2.27.7 ] && shim_dir=$here/shim-2.27.7
  bin=$dir/src-$flavor/build/${binary}_perf
  local libdir=$shim_dir/lib
  [ "$lib" = real ] && libdir=$real_dir
  local vars=(LD_LIBRARY_PATH="$libdir" NCCLSHIM_REAL_NCCL="$real" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT
    NCCLSHIM_CACHE="${NCCLSHIM_CACHE:-$HOME/.cache/ncclshim}")
  local exports=() setting
  if [ "$lib" = shim ]; then
    for setting in "${shim_env[@]}"; do
      vars+=("$setting")
      exports+=(-x "${setting%%=*}")
    done
  fi
  local launch=()
  if [ "$mode" = mpi ]; then
    launch=(mpirun --allow-run-as-root --bind-to none -np "$n" -x LD_LIBRARY_PATH -x NCCLSHIM_REAL_NCCL
      -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCLSHIM_CACHE -x NCCL_NVLS_ENABLE "${exports[@]}" "$bin" -g 1)
  else
    launch=("$bin" -g "$n")
  fi
  env "${vars[@]}" timeout "$deadline" "${launch[@]}" "$@" 2>&1 | python3 -u -c '
import sys, time
t0 = time.time()
for line in sys.stdin:
    sys.stdout.write("%9.3f %s" % (time.time() - t0, line))' >"$dir/$name.log"
  local status=${PIPESTATUS[0]}
  echo "$status" >"$dir/$name.status"
  return "$status"
}

# Whether a run is sound: exit 0, every #wrong 0 (or N/A), bounds OK, the shim in use only
# where it should be. Prints what is wrong.
check_run() {
  local name=$1 lib=$2 log=$dir/$1.log status
  status=$(cat "$dir/$name.status")
  [ "$status" = 0 ] || { echo "$name: exit $status"; return 1; }
  python3 "$here/nccl_tests_report.py" --check "$log" || { echo "$name: wrong results"; return 1; }
  if [ "$lib" = shim ]; then
    grep -q '\[ncclshim\].*forwarding to real NCCL' "$log" || { echo "$name: shim not in use"; return 1; }
  else
    grep -q '\[ncclshim\]' "$log" && { echo "$name: shim in a real run"; return 1; }
  fi
  return 0
}

# --- Cold start: an empty kernel cache, as on every fresh machine ---
cold_start() {
  local mode=$1 cache
  cache=$(mktemp -d)
  NCCLSHIM_CACHE=$cache run_one "cold-$mode-shim" shim 2.28.9 "$mode" all_reduce -b 8 -e 1M -f 4 -c 1 -n 5 -w 2
  run_one "cold-$mode-real" real 2.28.9 "$mode" all_reduce -b 8 -e 1M -f 4 -c 1 -n 5 -w 2
  local problems="" p status=0
  p=$(check_run "cold-$mode-shim" shim) || { status=1; problems="$p"; }
  p=$(check_run "cold-$mode-real" real) || { status=1; problems="$problems $p"; }
  local timing
  timing=$(python3 "$here/nccl_tests_report.py" --first-call "$dir/cold-$mode-shim.log" "$dir/cold-$mode-real.log") || status=1
  [ -z "$(ls -A "$cache")" ] || { status=1; problems="$problems; kernels compiled at run time: $(ls "$cache")"; }
  rm -rf "$cache"
  verdict "cold-start-$mode" $status "$timing ${problems:+; $problems}"
}
cold_start mpi
cold_start group

# --- Every binary, both headers, both launch modes, results checked (-c 1) ---
binaries=(all_reduce all_gather reduce_scatter broadcast reduce alltoall alltoallv sendrecv gather scatter hypercube)
# NCCL_TESTS_BINARIES: only these of them (e.g. "all_gather alltoall").
[ -n "${NCCL_TESTS_BINARIES:-}" ] && read -ra binaries <<<"$NCCL_TESTS_BINARIES"
pairs=()
# Whether NCCL_TESTS_GROUPS asks for this group (empty: every group).
wanted() {
  [ -z "${NCCL_TESTS_GROUPS:-}" ] || [[ " $NCCL_TESTS_GROUPS " == *" $1 "* ]]
}
matrix() {
  local group=$1 flavor=$2 mode=$3 binary=$4
  shift 4
  [ -x "$dir/src-$flavor/build/${binary}_perf" ] || return 0
  wanted "$group" || return 0
  local name=$group-$flavor-$mode-$binary
  run_one "$name-shim" shim "$flavor" "$mode" "$binary" "$@"
  run_one "$name-real" real "$flavor" "$mode" "$binary" "$@"
  pairs+=("$name")
}
sizes=(-b 8 -e 32M -f 8 -w 5 -n 20 -c 1)
for flavor_dir in "${built[@]}"; do
  flavor=${flavor_dir%%:*}
  modes=(mpi group)
  [ "${NCCL_TESTS_QUICK:-0}" = 1 ] && [ "$flavor" = 2.27.7 ] && modes=(mpi)
  for mode in "${modes[@]}"; do
    for binary in "${binaries[@]}"; do
      matrix basic "$flavor" "$mode" "$binary" "${sizes[@]}"
    done
  done
done
# Registered buffers (local -R 1, symmetric windows -R 2), CUDA graphs, every type and op.
for mode in mpi group; do
  for binary in all_reduce all_gather; do
    matrix reg1 2.28.9 "$mode" "$binary" "${sizes[@]}" -R 1
    matrix reg2 2.28.9 "$mode" "$binary" "${sizes[@]}" -R 2
    matrix graph 2.28.9 "$mode" "$binary" "${sizes[@]}" -G 1
  done
  matrix types 2.28.9 "$mode" all_reduce -b 1K -e 1M -f 32 -w 2 -n 5 -c 1 -d all -o all
  matrix types 2.28.9 "$mode" reduce_scatter -b 1K -e 1M -f 32 -w 2 -n 5 -c 1 -d all -o all
done
# Every collective on the core (each up to 256 MiB), eager and in CUDA graphs: results checked,
# and the core must have served them (its summary at exit names the kernel). Past what the
# staging holds at once (32 MiB of slots), direct and, with the peers' buffers unmapped
# (zero_copy:0, ranks of several processes), staged in windows, the last one short.
core_settings=(NCCLSHIM_MAX_BYTES=all_gather:256M,reduce_scatter:256M,broadcast:256M,reduce:256M,all_to_all:256M,gather:256M,scatter:256M)
shim_env=("${core_settings[@]}")
for mode in mpi group; do
  for binary in all_gather reduce_scatter broadcast reduce alltoall gather scatter; do
    matrix core 2.28.9 "$mode" "$binary" "${sizes[@]}"
    matrix coregraph 2.28.9 "$mode" "$binary" "${sizes[@]}" -G 1
    matrix corelarge 2.28.9 "$mode" "$binary" -b 48M -e 192M -f 2 -w 1 -n 2 -c 1
  done
done
shim_env=("${core_settings[@]}" NCCLSHIM_TUNE=zero_copy:0)
for binary in all_gather reduce_scatter broadcast reduce alltoall gather scatter; do
  matrix corewindows 2.28.9 mpi "$binary" -b 48M -e 192M -f 2 -w 1 -n 2 -c 1
done
shim_env=("${core_settings[@]}")
# Every type and op of reduce's and reduce-scatter's kernels: as packets (4 KiB, 128 KiB) and
# past them (4 MiB: chunks of 4 and 2 MiB, more than packets carry on any number of ranks).
matrix coretypes 2.28.9 mpi reduce -b 4K -e 4M -f 32 -w 2 -n 5 -c 1 -d all -o all
matrix coretypes 2.28.9 mpi reduce_scatter -b 4K -e 4M -f 32 -w 2 -n 5 -c 1 -d all -o all
shim_env=()
# Four calls aggregated in one group (-m 4), every collective with the defaults: the core
# issues a group's calls as one launch, its small ones of one collective as one call.
for mode in mpi group; do
  for binary in all_reduce all_gather reduce_scatter broadcast reduce alltoall gather scatter; do
    matrix batch 2.28.9 "$mode" "$binary" "${sizes[@]}" -m 4
    matrix batchgraph 2.28.9 "$mode" "$binary" "${sizes[@]}" -m 4 -G 1
  done
  # Pairs of all-reduces, which the core keeps up to 128 MiB on 2 GPUs, one call after the
  # other, and past that size (NCCL's).
  matrix batchpairs 2.28.9 "$mode" all_reduce -b 1M -e 256M -f 2 -w 5 -n 20 -c 1 -m 2
done

# Large all-reduces with ncclMemAlloc buffers, one process driving every GPU: the direct
# two-shot reaches them and must not be slower than NCCL at any size (a regression seen at
# 128 MiB, 1.09 x NCCL, when cuMem memory sent it to the staged fallback).
matrix large 2.28.9 group all_reduce -b 16M -e 256M -f 2 -w 5 -n 30 -c 0

# --- Verdicts per group, and the ratio table ---
# The core's kernel for each nccl-tests binary, as the shim's summary names it.
core_kernel() {
  case $1 in
    alltoall) echo all_to_all ;;
    *) echo "$1" ;;
  esac
}
for group in basic reg1 reg2 graph types core coregraph corelarge corewindows coretypes batch batchgraph batchpairs large; do
  status=0 problems="" count=0
  for name in "${pairs[@]}"; do
    [[ $name == $group-* ]] || continue
    count=$((count + 1))
    p=$(check_run "$name-shim" shim) || { status=1; problems="$problems $p;"; }
    p=$(check_run "$name-real" real) || { status=1; problems="$problems $p;"; }
    if [[ $group == core* ]] && ! grep -q "summary: .* core $(core_kernel "${name##*-}") [1-9]" "$dir/$name-shim.log"; then
      status=1 problems="$problems $name-shim: the core served none;"
    fi
    if [[ $group == batch* ]] && ! grep -q "summary: .*in launches shared by a group's calls" "$dir/$name-shim.log"; then
      status=1 problems="$problems $name-shim: no calls shared a launch;"
    fi
  done
  [ $count -gt 0 ] || continue
  verdict "$group" $status "$count pairs of runs${problems:+; failed:$problems}"
done
if [ ${#pairs[@]} -gt 0 ]; then
  python3 "$here/nccl_tests_report.py" --ratios "$dir" "${pairs[@]}" >"$out/nccl-tests-ratios.md"
  ratios_status=$? slower=$(tail -n 1 "$out/nccl-tests-ratios.md")
  verdict ratios $ratios_status "shim / NCCL per size for every pair: nccl-tests-ratios.md; ${slower#\# }"
fi
if [[ " ${pairs[*]} " == *" large-2.28.9-group-all_reduce "* ]]; then
  limit=$(python3 "$here/nccl_tests_report.py" --largest-ratio "$dir" large-2.28.9-group-all_reduce)
  awk -v r="$limit" 'BEGIN { exit !(r != "" && r + 0 <= 1.0) }'
  verdict "large-all-reduce-not-slower" $? "largest shim/real ratio from 16 MiB to 256 MiB (ncclMemAlloc, -g $n): ${limit:-?}"
fi

# --- Speed gate: all_reduce per size, the shim and NCCL alone taking turns, several rounds ---
# Eager, with symmetric windows (-R 2), in a CUDA graph, both, and two, four and eight calls
# aggregated in a group (-m), eager and in graphs; each run sweeps the sizes twice (-N 2). The
# best time per size and placement over every round and cycle, shim against NCCL alone, may be
# at most NCCL_TESTS_GATE_LIMIT x NCCL's.
gate_sets=(":" "-r2:-R 2" "-g:-G 1" "-r2g:-R 2 -G 1" "-m2:-m 2" "-m4:-m 4" "-m8:-m 8" "-m4g:-m 4 -G 1"
  "-m8g:-m 8 -G 1")
# One run, checked: NAME LIB(shim|real) MODE BINARY ARGS... (the 2.28.9 build). Counts it in
# runs, and a failure in status and problems.
run_checked() {
  local name=$1 lib=$2 p
  shift 2
  run_one "$name" "$lib" 2.28.9 "$@"
  p=$(check_run "$name" "$lib") || { status=1; problems="$problems $p;"; }
  runs=$((runs + 1))
}
# Rounds of one set: NAME MODE BINARY ROUNDS STEP ARGS...; the shim and NCCL alone take turns,
# each run sweeping 8 B to TURNS_MAX (default 32M) twice (-N 2), by a factor of STEP.
take_turns() {
  local name=$1 mode=$2 binary=$3 rounds=$4 step=$5 round lib
  shift 5
  for round in $(seq "$rounds"); do
    for lib in shim real; do
      run_checked "$name-$lib-r$round" "$lib" "$mode" "$binary" -b 8 -e "${TURNS_MAX:-32M}" -f "$step" -w 5 -n 20 -c 1 -N 2 "$@"
    done
  done
}

if wanted gate && [ -x "$dir/src-2.28.9/build/all_reduce_perf" ]; then
  gate_names=() status=0 problems="" runs=0
  for mode in mpi group; do
    for set in "${gate_sets[@]}"; do
      IFS=: read -r suffix args <<<"$set"
      # NCCL_TESTS_GATE_SETS: only these sets, by suffix ("plain" for the first), e.g. "-m4 -m4g".
      [ -z "${NCCL_TESTS_GATE_SETS:-}" ] || [[ " $NCCL_TESTS_GATE_SETS " == *" ${suffix:-plain} "* ]] || continue
      name=gate-2.28.9-$mode-all_reduce$suffix
      gate_names+=("$name")
      # $args unquoted: the set's flags, one word each.
      take_turns "$name" "$mode" all_reduce "${NCCL_TESTS_GATE_ROUNDS:-3}" 4 $args
    done
  done
  python3 "$here/nccl_tests_report.py" --gate "${NCCL_TESTS_GATE_LIMIT:-1.05}" "$dir" "${gate_names[@]}" \
    >"$out/nccl-tests-gate.md"
  gate_status=$? last=$(tail -n 1 "$out/nccl-tests-gate.md")
  verdict gate $gate_status "${last#\# }; nccl-tests-gate.md"
  [ $status = 0 ] || verdict gate-runs 1 "$runs runs; failed:$problems"
fi

# --- Settings weighed: all_reduce per size under NCCL alone, the shim as built and the shim
# under each of NCCL_TESTS_TUNES (NCCLSHIM_TUNE values, a space between them), taking turns,
# NCCL_TESTS_TUNE_ROUNDS rounds (default 2) of each set (NCCL_TESTS_TUNE_SETS: only these, by
# suffix, e.g. "r2g m4g") in each mode of NCCL_TESTS_TUNE_MODES, timing only (-c 0), 8 B to
# NCCL_TESTS_TUNE_MAX (default 128K). Each set, mode and round is 2 + (settings) runs of about
# 5 s: choose a few. nccl_tests_report.py --tune puts them side by side: nccl-tests-tune.md ---
tune_sets=("r2g:-R 2 -G 20" "g:-G 20" "m2g:-m 2 -G 20" "m4g:-m 4 -G 20" "m8g:-m 8 -G 20" "e:" "m4:-m 4"
  "m8:-m 8")
# Only when NCCL_TESTS_GROUPS names it: it weighs settings, it checks nothing of the shim's own.
if [[ " ${NCCL_TESTS_GROUPS:-} " == *" tune "* ]] && [ -x "$dir/src-2.28.9/build/all_reduce_perf" ]; then
  read -ra tunes <<<"${NCCL_TESTS_TUNES:-sentinel_block:0}"
  : >"$dir/tune-configs.txt"
  for k in "${!tunes[@]}"; do echo "t$k ${tunes[k]}" >>"$dir/tune-configs.txt"; done
  tune_names=() status=0 problems="" runs=0
  tune_args=(-b 8 -e "${NCCL_TESTS_TUNE_MAX:-128K}" -f 4 -w 20 -n 100 -c 0)
  for mode in ${NCCL_TESTS_TUNE_MODES:-mpi group}; do
    for set in "${tune_sets[@]}"; do
      IFS=: read -r suffix args <<<"$set"
      [ -z "${NCCL_TESTS_TUNE_SETS:-}" ] || [[ " $NCCL_TESTS_TUNE_SETS " == *" $suffix "* ]] || continue
      name=tune-$mode-$suffix
      tune_names+=("$name")
      for round in $(seq "${NCCL_TESTS_TUNE_ROUNDS:-2}"); do
        # $args unquoted: the set's flags, one word each.
        run_checked "$name-real-r$round" real "$mode" all_reduce "${tune_args[@]}" $args
        run_checked "$name-shim-r$round" shim "$mode" all_reduce "${tune_args[@]}" $args
        for k in "${!tunes[@]}"; do
          shim_env=("NCCLSHIM_TUNE=${tunes[k]}")
          run_checked "$name-t$k-r$round" shim "$mode" all_reduce "${tune_args[@]}" $args
          shim_env=()
        done
      done
    done
  done
  python3 "$here/nccl_tests_report.py" --tune "$dir" "${tune_names[@]}" >"$out/nccl-tests-tune.md" || status=1
  verdict tune $status "$runs runs${problems:+; failed:$problems}; nccl-tests-tune.md"
fi

# --- Limits: where each collective but all-reduce beats NCCL on these GPUs ---
# Every such collective on the core up to NCCL_TESTS_LIMITS_MAX (default 256M), against NCCL
# alone, with plain buffers, symmetric windows (-R 2) and in CUDA graphs, one process per GPU and
# one for all; each run sweeps the sizes twice (-N 2), NCCL_TESTS_LIMITS_ROUNDS rounds (default
# 1). Sizes double, so that where the kernels change (the packets' last size, the next) both are
# measured.
# nccl_tests_report.py --limits turns the best times into the rows of this GPU for the shim's
# table of measured limits (shim/src/core/measured_limits.tsv): nccl-tests-limits.md, whose last
# two lines are the rows for any buffers and for buffers in no symmetric window; --modes into
# one table per collective and mode (nccl-tests-modes.md).
# With NCCL_TESTS_BINARIES, only those of them: the row then has "-" for the others, whose
# values in the table stand. NCCL_TESTS_LIMITS_MODES: only these modes ("mpi group"), e.g. one
# per call on a machine where both don't fit one; the report then reads both calls' logs.
# One process per GPU, also with the peers' buffers unmapped (-zc: NCCLSHIM_TUNE=zero_copy:0),
# as memory no peer can map makes them (PyTorch's expandable segments, pools of
# cudaMallocAsync): the staged paths, which the limits must hold for too.
# NCCL_TESTS_LIMITS_GRAPHS: replays per graph in the -g set (default 1; with 1 each timing holds
# the processes' skew at its replay); NCCL_TESTS_LIMITS_ITERS: "-w W -n N" for every set (default
# -w 5 -n 20); NCCL_TESTS_LIMITS_STEP: the factor between sizes (default 2; more, for a quicker
# look that may miss where a kernel changes).
limit_sets=(":" "-r2:-R 2" "-g:-G ${NCCL_TESTS_LIMITS_GRAPHS:-1}" "-zc:")
if wanted limits && [ -x "$dir/src-2.28.9/build/all_gather_perf" ]; then
  limit_names=() status=0 problems="" runs=0
  for mode in ${NCCL_TESTS_LIMITS_MODES:-mpi group}; do
    for binary in all_gather reduce_scatter broadcast reduce alltoall gather scatter; do
      [ -z "${NCCL_TESTS_BINARIES:-}" ] || [[ " $NCCL_TESTS_BINARIES " == *" $binary "* ]] || continue
      for set in "${limit_sets[@]}"; do
        IFS=: read -r suffix args <<<"$set"
        # NCCL_TESTS_LIMITS_SETS: only these sets, by suffix ("plain" for the first), e.g. "-zc".
        [ -z "${NCCL_TESTS_LIMITS_SETS:-}" ] || [[ " $NCCL_TESTS_LIMITS_SETS " == *" ${suffix:-plain} "* ]] || continue
        shim_env=("${core_settings[@]}")
        if [ "$suffix" = -zc ]; then
          [ "$mode" = mpi ] || continue
          shim_env+=(NCCLSHIM_TUNE=zero_copy:0)
        fi
        name=limits-2.28.9-$mode-$binary$suffix
        limit_names+=("$name")
        # $args and the iterations unquoted: flags, one word each; the later win.
        TURNS_MAX=${NCCL_TESTS_LIMITS_MAX:-256M} take_turns "$name" "$mode" "$binary" \
          "${NCCL_TESTS_LIMITS_ROUNDS:-1}" "${NCCL_TESTS_LIMITS_STEP:-2}" ${NCCL_TESTS_LIMITS_ITERS:-} $args
      done
    done
  done
  shim_env=()
  # With NCCL_TESTS_LIMITS_MODES, the other modes' runs of an earlier call into this folder too.
  if [ -n "${NCCL_TESTS_LIMITS_MODES:-}" ]; then
    for log in "$dir"/limits-2.28.9-*-shim-r1.log; do
      [ -e "$log" ] || continue
      name=$(basename "$log" -shim-r1.log)
      [[ " ${limit_names[*]} " == *" $name "* ]] || limit_names+=("$name")
    done
  fi
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -n 1)
  python3 "$here/nccl_tests_report.py" --limits "$gpu" "$n" "$dir" "${limit_names[@]}" >"$out/nccl-tests-limits.md"
  limits_status=$?
  # The same runs per collective and mode, for the performance page.
  python3 "$here/nccl_tests_report.py" --modes "$dir" "${limit_names[@]}" >"$out/nccl-tests-modes.md" || limits_status=1
  verdict limits $limits_status "$(tail -n 2 "$out/nccl-tests-limits.md" | paste -sd ';'); nccl-tests-modes.md"
  [ $status = 0 ] || verdict limits-runs 1 "$runs runs; failed:$problems"
fi
