// ---- entry points -------------------------------------------------------------------------------

// M(NAME, T, OPNAME, OP) for each operation, in the host's order (types::Op).
#define FOR_EACH_OP(M, NAME, T)                                                                       \
  M(NAME, T, sum, OP_SUM)                                                                             \
  M(NAME, T, prod, OP_PROD)                                                                           \
  M(NAME, T, max, OP_MAX)                                                                             \
  M(NAME, T, min, OP_MIN)                                                                             \
  M(NAME, T, avg, OP_AVG)

// The reducing kernels, for every type and op.
#define KERNELS(NAME, T) FOR_EACH_OP(KERNEL, NAME, T)

#define KERNEL(NAME, T, OPNAME, OP)                                                                   \
  FUSED_KERNEL_OF(ll_one_shot, ncclshim_ll_##NAME##_##OPNAME, T, OP)                                 \
  KERNEL_OF(one_shot, ncclshim_one_shot_##NAME##_##OPNAME, T, OP)                                     \
  KERNEL_OF(two_shot, ncclshim_two_shot_##NAME##_##OPNAME, T, OP)                                     \
  KERNEL_OF(direct, ncclshim_direct_##NAME##_##OPNAME, T, OP)                                         \
  KERNEL_OF(reduce_scatter, ncclshim_reduce_scatter_##NAME##_##OPNAME, T, OP)                         \
  KERNEL_OF(reduce, ncclshim_reduce_##NAME##_##OPNAME, T, OP)                                         \
  PACKET_KERNEL_OF(ll_reduce, ncclshim_ll_reduce_##NAME##_##OPNAME, T, OP)

// The collectives that move data without reducing it, each a row of `route` (device.cuh):
// M(COLLECTIVE, KIND, NAME, T) for each, in the host's order. A new one is a row there and a line
// here.
#define FOR_EACH_MOVE(M, NAME, T)                                                                     \
  M(all_gather, MOVE_ALL_GATHER, NAME, T)                                                             \
  M(broadcast, MOVE_BROADCAST, NAME, T)                                                               \
  M(all_to_all, MOVE_ALL_TO_ALL, NAME, T)                                                             \
  M(gather, MOVE_GATHER, NAME, T)                                                                     \
  M(scatter, MOVE_SCATTER, NAME, T)

// Each one's two algorithms: staged or direct (moves.cu), and as packets (packets.cu).
#define MOVE_ALGORITHMS(COLLECTIVE, KIND, NAME, T) MOVE(COLLECTIVE, KIND) LL_MOVE(COLLECTIVE, KIND)
FOR_EACH_MOVE(MOVE_ALGORITHMS, , )

// Their kernels, for bytes only (the host moves any type as bytes), under the op `sum` (the host
// asks for no other).
#define MOVE_KERNELS(NAME, T) FOR_EACH_MOVE(MOVE_KERNEL, NAME, T) FOR_EACH_MOVE(LL_MOVE_KERNEL, NAME, T)
#define MOVE_KERNEL(COLLECTIVE, KIND, NAME, T) \
  KERNEL_OF(COLLECTIVE, ncclshim_##COLLECTIVE##_##NAME##_sum, T, OP_SUM)
#define LL_MOVE_KERNEL(COLLECTIVE, KIND, NAME, T) \
  PACKET_KERNEL_OF(ll_##COLLECTIVE, ncclshim_ll_##COLLECTIVE##_##NAME##_sum, T, OP_SUM)

// The sentinel kernels, for the floating-point types only.
#define SENTINEL_KERNELS(NAME, T) FOR_EACH_OP(SENTINEL_KERNEL, NAME, T)
#define SENTINEL_KERNEL(NAME, T, OPNAME, OP) FUSED_KERNEL_OF(sentinel, ncclshim_sentinel_##NAME##_##OPNAME, T, OP)

// Runs the launch's calls one after the other (see "batches"). The next kernel is scheduled
// early only after a small launch (let_next_kernel_start).
#define KERNEL_OF(ALGORITHM, SYMBOL, T, OP)                                                           \
  extern "C" __global__ void __launch_bounds__(MAX_THREADS) SYMBOL(const __grid_constant__ Args args) { \
    after_previous_kernel();                                                                          \
    if (small_launch<T>(args)) let_next_kernel_start();                                               \
    for (int k = 0; k < args.ncalls; k++) {                                                           \
      if (k > 0) between_calls(args.peers, args.rank, k, args.abort);                                 \
      const Call& c = args.calls[k];                                                                  \
      ALGORITHM<T, OP>(args.peers, args.rank, args.nranks, (const T*)c.in, (T*)c.out, c.count,        \
                       args.staging, args.abort, c.views, c.root);                                 \
    }                                                                                                 \
    batch_done(args.peers, args.rank, args.ncalls);                                                   \
  }

// The packet kernels of the collectives other than all-reduce, which take no views, run a
// launch's calls as one (see "fused launches"). A launch of one call (most of them) reads it at
// fixed places of the parameters, not through its index: a small call is one trip over NVLink,
// where every instruction before it shows. Launches of several calls run in a function of their
// own, so that their loop does not take registers from the lone call's path. One block per SM
// at least: without it ptxas held these kernels to 64 registers beside that function, and both
// paths spilled.
#define PACKET_KERNEL_OF(ALGORITHM, SYMBOL, T, OP)                                                    \
  __device__ __noinline__ void SYMBOL##_calls(const PacketArgs& args) { ALGORITHM##_fused<T, OP>(args); } \
  extern "C" __global__ void __launch_bounds__(MAX_THREADS, 1) SYMBOL(const __grid_constant__ PacketArgs args) { \
    after_previous_kernel();                                                                          \
    let_next_kernel_start();                                                                          \
    if (args.ncalls != 1) return SYMBOL##_calls(args);                                                \
    const PacketCall& c = args.calls[0];                                                              \
    ALGORITHM<T, OP>(args.peers, args.rank, args.nranks, (const T*)c.in, (T*)c.out, c.count,          \
                     args.staging, args.abort, c.root, c.sentinel);                                   \
  }

// Runs the launch's calls as one (the packet kernels of all-reduce, see "fused launches").
#define FUSED_KERNEL_OF(ALGORITHM, SYMBOL, T, OP)                                                     \
  extern "C" __global__ void __launch_bounds__(MAX_THREADS) SYMBOL(const __grid_constant__ FusedArgs args) { \
    after_previous_kernel();                                                                          \
    let_next_kernel_start();                                                                          \
    ALGORITHM<T, OP>(args);                                                                           \
  }

// NCCL_TYPES is defined by the host to the types wanted (all of them by default).
#ifndef NCCL_TYPES
#define NCCL_TYPES                                                                                    \
  KERNELS(i8, signed char)                                                                            \
  KERNELS(u8, unsigned char) MOVE_KERNELS(u8, unsigned char)                                          \
  KERNELS(i32, int)                                                                                   \
  KERNELS(u32, u32)                                                                                   \
  KERNELS(i64, long long)                                                                             \
  KERNELS(u64, u64)                                                                                   \
  KERNELS(f16, f16) SENTINEL_KERNELS(f16, f16)                                                       \
  KERNELS(f32, float) SENTINEL_KERNELS(f32, float)                                                    \
  KERNELS(f64, double) SENTINEL_KERNELS(f64, double)                                                  \
  KERNELS(bf16, bf16) SENTINEL_KERNELS(bf16, bf16)                                                    \
  KERNELS(e4m3, e4m3) SENTINEL_KERNELS(e4m3, e4m3)                                                    \
  KERNELS(e5m2, e5m2) SENTINEL_KERNELS(e5m2, e5m2)
#endif
NCCL_TYPES
