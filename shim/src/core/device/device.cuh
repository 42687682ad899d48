// ncclshim's collectives over NVLink: what every kernel family shares (device.cuh), then one
// file per family (all_reduce.cu; moves.cu: all-gather, broadcast, all-to-all, gather, scatter;
// reductions.cu: reduce-scatter, reduce; packets.cu: the small messages of the last two files)
// and the kernels' entry points (entry.cu). The host compiles them as one program, in that order
// (program.rs): NVRTC needs no CUDA headers, ahead of time for the architectures the library
// carries and at run time for others, one kernel per (algorithm, type, op), named
//   ncclshim_<algorithm>_<type>_<op>,
// the floating-point types only for the sentinel kernels, and bytes (u8) with `sum` only for
// the algorithms that move data without reducing it (all-gather, broadcast, all-to-all, gather,
// scatter: the host moves any type as bytes).
//
// Kernels write straight into the peers' buffers (peer pointers in one process, CUDA IPC
// mappings across processes). Writes, not reads where it can be helped: a store to a peer is
// posted and goes on, a load waits a round trip over NVLink.
//
// Memory layout of one rank's buffer (allocated and exchanged by the host side):
//   flags:   [BARRIERS][MAX_BLOCKS][MAX_RANKS] u32  arrival epochs, written by the peers
//            u32 epoch, blocks done, windows, calls,   this rank's call count (see begin_call)
//                blocks done with their data, 3 unused
//            [MAX_RANKS] u32                         a direct call's end, written by the peers
//                                                    (end_of_data)
//            [MAX_RANKS] Published                   each rank's buffers of this call (direct)
//   staging: two areas, by epoch parity, then the low-latency inboxes and the sentinel inboxes
//            (see "staging")
//
// Ordering. Element i is handled by the same block index in every phase on every rank (the
// same grid-stride partition), so block b of each rank only ever waits for block b of its
// peers: a barrier is per block. A barrier is `__syncthreads(); thread p < nranks stores the
// epoch into peer p's slot for us with st.release.sys, then spins with ld.acquire.sys on our
// slot for peer p; __syncthreads()`. The release is cumulative over what the CTA barrier
// ordered before it (every thread's stores into the peers' staging); the acquire orders our
// later loads of our staging after the peers' stores. Epochs grow by one per call and are kept
// in device memory by the kernel itself, so back-to-back calls and CUDA graph replays (which
// replay the same parameters) stay in step. One meeting is not per block: a direct call's end,
// which the last block of each rank to finish keeps for its grid (end_of_data); a call that
// follows it on a rank starts only once that grid is done. A peer may already have moved to the
// next epoch when we look, so arrival is `flag - epoch >= 0` (wrap-safe while no slot falls 2^31
// epochs behind, which refresh_epochs sees to). No end barrier is needed: the
// staging alternates areas by epoch parity (see "staging" for why that is enough). Every call of
// every family meets every peer at least once (a barrier, or packets from each), which that
// proof needs.
//
// Results are bitwise identical on every rank: every reduction is in rank order 0..n-1, or done
// once, by one rank, and copied.

// MAX_THREADS, MAX_RANKS, MAX_BLOCKS, MAX_BATCH, MAX_FUSED, LL_MAX_BYTES and SENTINEL_MAX_BYTES come from
// the host (program::options), from limits.rs (BARRIERS: the meetings of a block with the peers'
// same block that a call may have; layout.rs places the epoch state after their slots).
#if !defined(MAX_THREADS) || !defined(MAX_RANKS) || !defined(MAX_BLOCKS) || !defined(MAX_BATCH) || \
    !defined(MAX_FUSED) || !defined(LL_MAX_BYTES) || !defined(SENTINEL_MAX_BYTES) || !defined(BARRIERS)
#error "compile with -DMAX_THREADS, -DMAX_RANKS, -DMAX_BLOCKS, -DMAX_BATCH, -DMAX_FUSED, -DLL_MAX_BYTES, -DSENTINEL_MAX_BYTES and -DBARRIERS"
#endif
#define BARRIER_START 0
#define BARRIER_MIDDLE 1

typedef unsigned long long u64;
typedef unsigned int u32;

// Every rank's buffer as this rank maps it. Functions take it by reference, into the launch's
// parameters: a copy, indexed by a rank the compiler cannot know, lands in local memory, written
// and read back by every thread before its first store to a peer.
struct Peers {
  char* staging[MAX_RANKS];
  u32* flags[MAX_RANKS];
};

// One call's buffers as every rank addresses them, for the direct kernel (`Views` in comm.rs):
// in[r] and out[r] are this rank's input and output as rank r maps them (the same pointers where
// every rank is in one process; CUDA IPC mappings of the peers' otherwise). `usable`: the host
// found them reachable from every peer GPU, and 16-aligned. `tag`: what the call is (its
// algorithm, type, operation, count, root and grid, hashed by the host): ranks go direct only
// where all have the same, so that no kernel writes into a peer's buffers by a count the peer's
// call did not give (ranks out of step, or calls that differ between ranks).
struct Views {
  u64 in[MAX_RANKS];
  u64 out[MAX_RANKS];
  int usable;
  u32 tag;
};

// One call: its buffers, count and root (broadcast, reduce, gather and scatter; unused by the
// others), as the host hands it (`KernelCall` in comm.rs).
struct Call {
  const void* in;
  void* out;
  u64 count;
  Views views;
  int root;
};

// One call of a fused launch (`FusedKernelCall` in comm.rs): its buffers and count.
struct FusedCall {
  const void* in;
  void* out;
  u64 count;
};

// One call of a packet kernel of a collective other than all-reduce (`PacketKernelCall` in
// comm.rs): a Call without the views, which those kernels never read. `sentinel`: a lone call
// of a collective that moves bytes goes as sentinel stores (packets.cu, "sentinel moves").
struct PacketCall {
  const void* in;
  void* out;
  u64 count;
  int root;
  int sentinel;
};

// Where things lie in a rank's staging (see "staging"), as the host lays it out and hands it to
// every kernel (`Staging` in layout.rs): offsets from a rank's `Peers::staging`, in bytes.
struct Staging {
  u64 window;          // two-shot's window: the most bytes of a message staged at once
  u64 area;            // one area; two of them from offset 0, by epoch parity
  u64 one_shot_slot;   // one-shot's slot per sender in an area
  u64 results;         // two-shot's result area, within an area
  u64 ll_inbox;        // the low-latency inboxes
  u64 sentinel_inbox;  // the sentinel inboxes
};

// What a kernel takes (`LaunchArgs` in comm.rs): the communicator's side, and `ncalls` calls.
// The kernels of large calls take `Args`, and run their calls one after the other (a group's, see
// "batches" below); the packet kernels take `FusedArgs` (all-reduce) or `PacketArgs` (the other
// collectives), and run them as one (see "fused launches"). The last two are kept small: a
// launch's cost grows with its arguments (1.5 KiB cost 0.2 - 0.3 us a launch on H100).
template <typename C, int N> struct LaunchArgs {
  Peers peers;
  Staging staging;
  const volatile int* abort;
  int rank;
  int nranks;
  int ncalls;
  C calls[N];
};
typedef LaunchArgs<Call, MAX_BATCH> Args;
typedef LaunchArgs<FusedCall, MAX_FUSED> FusedArgs;
typedef LaunchArgs<PacketCall, MAX_FUSED> PacketArgs;
static_assert(sizeof(Peers) == 128 && sizeof(Staging) == 48 && sizeof(Views) == 136 && sizeof(Call) == 168 &&
                  sizeof(Args) == 200 + 168 * MAX_BATCH && sizeof(FusedCall) == 24 &&
                  sizeof(FusedArgs) == 200 + 24 * MAX_FUSED && sizeof(PacketCall) == 32 &&
                  sizeof(PacketArgs) == 200 + 32 * MAX_FUSED,
              "Args, FusedArgs and PacketArgs must be laid out as LaunchArgs in comm.rs");

// ---- element types and their conversions to and from the accumulator --------------------------

struct f16 { unsigned short bits; };
struct bf16 { unsigned short bits; };
struct e4m3 { unsigned char bits; };
struct e5m2 { unsigned char bits; };

__device__ __forceinline__ float to_float(f16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}
__device__ __forceinline__ f16 from_float(float f, f16) {
  f16 v;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v.bits) : "f"(f));
  return v;
}
__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(((u32)v.bits) << 16); }
__device__ __forceinline__ bf16 from_float(float f, bf16) {
  u32 u = __float_as_uint(f);
  bf16 v;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    v.bits = (unsigned short)((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
  } else {
    v.bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
  }
  return v;
}
// The fp8 pair conversions put our byte in the low half (sm_89 and later). Below sm_90 the core
// takes no fp8 call (NCCL refuses them there, policy.rs): the kernels exist, and stop if run.
#if __CUDA_ARCH__ >= 890
#define FP8_CONVERSIONS(T, PTX_TYPE)                                                                 \
  __device__ __forceinline__ float to_float(T v) {                                                  \
    unsigned short pair = v.bits;                                                                   \
    u32 halfs;                                                                                      \
    asm("cvt.rn.f16x2." PTX_TYPE "x2 %0, %1;" : "=r"(halfs) : "h"(pair));                          \
    return to_float(f16{(unsigned short)(halfs & 0xffff)});                                         \
  }                                                                                                 \
  __device__ __forceinline__ T from_float(float f, T) {                                             \
    unsigned short pair;                                                                            \
    asm("cvt.rn.satfinite." PTX_TYPE "x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(f));       \
    return T{(unsigned char)(pair & 0xff)};                                                         \
  }
#else
#define FP8_CONVERSIONS(T, PTX_TYPE)                                                                 \
  __device__ __forceinline__ float to_float(T) { __trap(); return 0.0f; }                          \
  __device__ __forceinline__ T from_float(float, T) { __trap(); return T{0}; }
#endif
FP8_CONVERSIONS(e4m3, "e4m3")
FP8_CONVERSIONS(e5m2, "e5m2")

// How each type is reduced: in `Acc`, converted once at the end. Integers wrap (computed
// unsigned), as NCCL's do.
template <typename T> struct Traits;
#define INTEGER_TRAITS(T, U)                                                     \
  template <> struct Traits<T> {                                                 \
    typedef U Acc;                                                               \
    static const bool is_signed = (T)(-1) < (T)0;                                \
    __device__ static Acc load(T v) { return (Acc)v; }                           \
    __device__ static T store(Acc a) { return (T)a; }                            \
  };
INTEGER_TRAITS(signed char, unsigned char)
INTEGER_TRAITS(unsigned char, unsigned char)
INTEGER_TRAITS(int, u32)
INTEGER_TRAITS(u32, u32)
INTEGER_TRAITS(long long, u64)
INTEGER_TRAITS(u64, u64)
#define FLOAT_TRAITS(T, A)                                                       \
  template <> struct Traits<T> {                                                 \
    typedef A Acc;                                                               \
    static const bool is_signed = true;                                          \
    __device__ static Acc load(T v) { return (Acc)v; }                           \
    __device__ static T store(Acc a) { return (T)a; }                            \
  };
FLOAT_TRAITS(float, float)
FLOAT_TRAITS(double, double)
#define NARROW_FLOAT_TRAITS(T)                                                   \
  template <> struct Traits<T> {                                                 \
    typedef float Acc;                                                           \
    static const bool is_signed = true;                                          \
    __device__ static Acc load(T v) { return to_float(v); }                      \
    __device__ static T store(Acc a) { return from_float(a, T()); }              \
  };
NARROW_FLOAT_TRAITS(f16)
NARROW_FLOAT_TRAITS(bf16)
NARROW_FLOAT_TRAITS(e4m3)
NARROW_FLOAT_TRAITS(e5m2)

template <typename T> struct IsInteger { static const bool value = true; };
template <> struct IsInteger<float> { static const bool value = false; };
template <> struct IsInteger<double> { static const bool value = false; };
template <> struct IsInteger<f16> { static const bool value = false; };
template <> struct IsInteger<bf16> { static const bool value = false; };
template <> struct IsInteger<e4m3> { static const bool value = false; };
template <> struct IsInteger<e5m2> { static const bool value = false; };

// ---- operations ---------------------------------------------------------------------------------

#define OP_SUM 0
#define OP_PROD 1
#define OP_MAX 2
#define OP_MIN 3
#define OP_AVG 4

// Signed comparison of accumulators that hold signed integers as unsigned bits.
template <typename T, typename A> __device__ __forceinline__ bool less(A a, A b) {
  if constexpr (IsInteger<T>::value && Traits<T>::is_signed) {
    return (T)a < (T)b;
  } else {
    return a < b;
  }
}

template <typename T, int OP> struct Reduce {
  typedef typename Traits<T>::Acc Acc;
  // The first value, as it enters the reduction (avg pre-multiplies floats by 1/n, as NCCL).
  __device__ static Acc first(T v, int nranks) {
    Acc a = Traits<T>::load(v);
    if constexpr (OP == OP_AVG && !IsInteger<T>::value) a = a * ((Acc)1 / (Acc)nranks);
    return a;
  }
  __device__ static Acc combine(Acc a, T v, int nranks) {
    Acc b = first(v, nranks);
    switch (OP) {
      case OP_PROD: return a * b;
      case OP_MAX: return less<T>(a, b) ? b : a;
      case OP_MIN: return less<T>(b, a) ? b : a;
      default: return a + b;  // sum, avg
    }
  }
  // Integer avg divides the sum, truncating like C (and NCCL).
  __device__ static T finish(Acc a, int nranks) {
    if constexpr (OP == OP_AVG && IsInteger<T>::value) {
      if constexpr (Traits<T>::is_signed) {
        return (T)((long long)(T)a / nranks);
      } else {
        return (T)(a / (Acc)nranks);
      }
    } else {
      return Traits<T>::store(a);
    }
  }
};

// Element k of `from[0..nranks)` (packs or units of T, each with `v[]`; NR >= nranks of them),
// reduced in rank order: the one order every rank's kernels reduce in, which makes their results
// bitwise identical.
template <typename T, int OP, int NR = MAX_RANKS, typename Group>
__device__ __forceinline__ T reduce_element(const Group* from, int nranks, int k) {
  typedef Reduce<T, OP> R;
  typename Traits<T>::Acc a = R::first(from[0].v[k], nranks);
#pragma unroll
  for (int r = 1; r < NR; r++) {
    if (r < nranks) a = R::combine(a, from[r].v[k], nranks);
  }
  return R::finish(a, nranks);
}

// ---- signals ------------------------------------------------------------------------------------

__device__ __forceinline__ void store_release(u32* address, u32 value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}
__device__ __forceinline__ u32 load_acquire(const u32* address) {
  u32 value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}
__device__ __forceinline__ int load_volatile(const volatile int* address) { return *address; }

// The host's control block, in pinned host memory (cuda.rs, HostControl), passed as `abort`:
//   [0] abort: raised by the host (ncclCommAbort, or a destroy that waited too long)
//   [1] how many seconds a kernel may wait for a peer (NCCLSHIM_TIMEOUT; 0: for ever)
//   [2] written by a kernel that gave up waiting: 1 + the rank it waited for (GAVE_UP_OWN: for
//       blocks of its own grid; OUT_OF_STEP(rank): that rank was found on a later call), read by
//       the host's watcher, which says so
#define GAVE_UP_OWN (MAX_RANKS + 1)
#define OUT_OF_STEP(rank) (-(rank) - 1)
__device__ __forceinline__ u64 global_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// The host's control block is in host memory: each read of it crosses PCIe, and such reads
// queue. A wait may hold every thread of a grid (the low-latency and sentinel kernels wait
// with one thread per packet, up to 128K in a fused sentinel launch), so if each waiting thread
// read the block itself, a peer late by a few hundred microseconds would set that many reads
// going at once. So a block reads it through one thread at a time, at most once per
// WATCH_INTERVAL_NS and never in its first interval of waiting, and its waiting threads look at
// what that read found, in shared memory (`BlockWatch`), and at the GPU's own clock: the
// largest grid (2048 blocks) reads it at most 20 million times a second, and only once a wait
// has lasted that long. An abort is seen within about the interval.
#define WATCH_INTERVAL_NS 100000ull

struct BlockWatch {
  u64 next_read_ns;  // when a waiting thread of the block may next read the host's words
  u32 stop;          // the host raised abort, or a wait of this rank gave up: stop waiting
  u32 limit_s;       // the host's time limit as last read (0: for ever, or not yet read)
};
__shared__ BlockWatch block_watch;

// Called by thread 0 at the start of every call (begin_call), before a __syncthreads and
// before any wait of the call.
__device__ __forceinline__ void reset_block_watch() {
  block_watch.next_read_ns = 0;
  block_watch.stop = 0;
  block_watch.limit_s = 0;
}

// Marks a wait given up, `why` for the host (control word [2]): every later wait of the block
// gives up at once, and the host reports it.
__device__ __forceinline__ void stop_waiting(const volatile int* abort, int why) {
  atomicExch(&block_watch.stop, 1u);
  *(volatile int*)(abort + 2) = why;
}

// Whether a wait for `peer` (-1: blocks of this grid) should stop: asked every 1024 spins by
// every waiting loop, `since` starting at 0 (the first ask starts the clock). A kernel that gave
// up leaves wrong results; the host reports it and fails the communicator's later calls. The
// block's several waiting threads share `block_watch` with no barrier between them, so every
// access to it here is atomic (compute-sanitizer's racecheck saw plain ones race; they happen
// every 1024 spins, so their cost does not count).
__device__ __noinline__ bool give_up(const volatile int* abort, u64& since, int peer) {
  u64 now = global_ns();
  if (since == 0) since = now;
  u64 due = atomicAdd(&block_watch.next_read_ns, 0ull);
  // One thread of the block wins the right to read the host's words until the next interval;
  // the first to ask only starts the block's clock.
  bool won = now >= due && atomicCAS(&block_watch.next_read_ns, due, now + WATCH_INTERVAL_NS) == due;
  if (won && due != 0) {
    // Once one wait has given up, the ranks are out of step: every later wait gives up at once.
    if (load_volatile(abort) || load_volatile(abort + 2)) atomicExch(&block_watch.stop, 1u);
    atomicExch(&block_watch.limit_s, (u32)load_volatile(abort + 1));
  }
  if (atomicAdd(&block_watch.stop, 0u)) return true;
  u64 limit = (u64)atomicAdd(&block_watch.limit_s, 0u) * 1000000000ull;
  if (limit == 0 || now - since < limit) return false;
  stop_waiting(abort, peer < 0 ? GAVE_UP_OWN : peer + 1);
  return true;
}

// A thread that waits for its own packet (the low-latency and sentinel kernels: one thread per
// packet, up to 128K of them) polls back to back for its first 32 polls, where a peer in step
// delivers, then pauses between polls (100 ns, from the 128th 1 us). Without the pauses, a peer
// a few tens of microseconds late kept every one of those threads loading from the inbox its
// stores were arriving into, and the call took 0.9 ms at 384 KiB and 1.4 ms at 512 KiB instead
// of 0.1 (about 40 ns per waiting thread, on 2 H100 under PyTorch); the rank so delayed was late
// for the next call in turn, and the two GPUs stayed in that state call after call. Kernels
// whose few threads wait on flags (one per peer and block) never did it.
__device__ __forceinline__ void poll_pause(unsigned spins) {
  if (spins > 32) __nanosleep(spins > 128 ? 1000 : 100);
}

// Polls back to back before the loop that may give up or pause (poll_pause's first polls): in
// step, a peer's data comes within them, and that loop's bookkeeping cost 0.1 us a call (sentinel
// kernel, 2 H100).
#define FAST_POLLS 32

__device__ __forceinline__ u32* flag_slot(u32* flags, int barrier, int block, int rank) {
  return flags + ((barrier * MAX_BLOCKS + block) * MAX_RANKS + rank);
}

// Waits for block `blockIdx.x` of every rank to reach `barrier` of `epoch`. Gives up when the
// host raises `abort` (a communicator aborted or destroyed while a peer never came), or after
// the host's time limit (give_up).
__device__ __forceinline__ void barrier(const Peers& peers, int rank, int nranks, int which, u32 epoch,
                                        const volatile int* abort) {
  __syncthreads();
  int p = threadIdx.x;
  if (p < nranks) {
    store_release(flag_slot(peers.flags[p], which, blockIdx.x, rank), epoch);
    const u32* mine = flag_slot(peers.flags[rank], which, blockIdx.x, p);
    unsigned spins = 0;
    u64 since = 0;
    while ((int)(load_acquire(mine) - epoch) < 0) {
      if ((++spins & 1023u) == 0 && give_up(abort, since, p)) break;
    }
  }
  __syncthreads();
}

// The epoch of this call: one more than the last call's, the same in every block. The count is
// kept by the kernel in device memory (graph replays repeat the parameters): every block reads
// it at its start, and the last block to finish moves it on. Launches on one stream run one
// after the other, so the next call always reads the moved count. One count for all blocks,
// not one per block: a call's grid size depends on its size, and an element handled by block 5
// in one call may be handled by block 0 in the next; with per-block counts the two could carry
// the same epoch, and a stale packet or flag could pass for a fresh one.
__device__ __forceinline__ u32* epoch_state(const Peers& peers, int rank) {
  // [0]: epoch, [1]: blocks done, [2]: blocks past the grid's meeting (grid_barrier), [3]: blocks past
  // calls of a batch (between_calls), [4]: blocks done with a call's data (end_of_data); then
  // the peers' arrivals at the end of a direct call (end_of_data)
  return peers.flags[rank] + BARRIERS * MAX_BLOCKS * MAX_RANKS;
}
__device__ __forceinline__ u32 begin_call(const Peers& peers, int rank) {
  __shared__ u32 epoch;
  if (threadIdx.x == 0) {
    epoch = *(volatile u32*)epoch_state(peers, rank) + 1;
    // Never 0, which zeroed flags and inboxes hold from the set-up on, nor 1 after it, so that
    // parities still alternate: every 2^32 calls.
    if (epoch == 0) epoch = 2;
    reset_block_watch();
  }
  __syncthreads();
  return epoch;
}

// Epochs are compared wrap-safe (`(int)(flag - epoch) < 0`: not yet), which holds while no slot
// is 2^31 or more epochs behind the count. A slot that only large grids' blocks use, or only
// direct calls, may go untouched that long where every other call is small: a server making
// billions of small all-reduces, then a large one, whose barrier would read its slots as
// ahead and pass before the peers came (and whose direct start would take a peer for one on a
// later call). So each time the count passes a multiple of EPOCH_REFRESH, the last block of
// the call moves every slot of this rank's flags that is EPOCH_REFRESH or more behind (or more
// than that ahead: no slot in step is) up to the call's last epoch, which no later call takes
// for its own: between two such calls no slot falls much more than 2 * EPOCH_REFRESH behind (a
// call's windows past it; 3 * EPOCH_REFRESH across the count's wrap, where begin_call's skip
// passes no multiple). A peer's write that comes between a slot's load and its swap stays
// (the swap fails; system scope, as the peers' stores). Once in 2^29 calls: one thread's few
// thousand loads. The same thread then moves the low-latency inboxes' packets that far behind
// (refresh_inbox), which are taken by equality and so must never be 2^32 behind.
#define EPOCH_REFRESH (1u << 29)
__device__ __forceinline__ bool stale_epoch(u32 flag, u32 epoch) {
  // epoch - flag in [EPOCH_REFRESH, 2^32 - EPOCH_REFRESH), as unsigned arithmetic.
  return epoch - flag - EPOCH_REFRESH <= ~0u - 2 * EPOCH_REFRESH;
}
__device__ __forceinline__ bool passes_refresh(u32 before, u32 after) {
  return before / EPOCH_REFRESH != after / EPOCH_REFRESH;
}
__device__ __noinline__ void refresh_epochs(u32* flags, u64* inbox, u32 first, u32 last);  // after Published, below

// `first` and `last`: the epochs this call used (a call in windows uses one per window, see
// two_shot).
__device__ __forceinline__ void end_call(const Peers& peers, const Staging& staging, int rank, u32 first, u32 last) {
  if (threadIdx.x != 0) return;
  u32* state = epoch_state(peers, rank);
  // Every block read the epoch before counting itself done, so the last one may move it on. A
  // lone block needs no count (the atomic's round trip would lengthen every small call).
  if (gridDim.x == 1 || atomicAdd(&state[1], 1u) == gridDim.x - 1) {
    state[1] = 0;
    state[2] = 0;
    state[0] = last;
    if (passes_refresh(first - 1, last))
      refresh_epochs(peers.flags[rank], (u64*)(peers.staging[rank] + staging.ll_inbox), first, last);
  }
}

// Counts this block at `count` and waits until `target` blocks of the grid have been counted
// there, what each wrote before ordered before what any does after (at system scope with
// SYSTEM: for peers too).
template <bool SYSTEM>
__device__ __forceinline__ void blocks_meet(u32* count, u32 target, const volatile int* abort) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (SYSTEM) {
      __threadfence_system();
    } else {
      __threadfence();
    }
    atomicAdd(count, 1u);
    unsigned spins = 0;
    u64 since = 0;
    while (*(volatile u32*)count < target) {
      if ((++spins & 1023u) == 0 && give_up(abort, since, -1)) break;
    }
    __threadfence();
  }
  __syncthreads();
}

// Waits for every block of this grid to get here: once a call at most (before a staged call's
// last window, see for_each_window). The host never launches more blocks than the GPU holds at
// once, so they all run. The count goes back to zero in end_call, when no block waits on it any
// more.
__device__ __forceinline__ void grid_barrier(const Peers& peers, int rank, const volatile int* abort) {
  blocks_meet<false>(&epoch_state(peers, rank)[2], gridDim.x, abort);
}

// ---- batches ------------------------------------------------------------------------------------
//
// A launch may carry several calls of one kernel (a group's calls on one communicator and stream,
// of the same kernel and grid), run one after the other, each as if it were a kernel of its own:
// its own epoch, read by begin_call and moved on by end_call, and every block of the grid done
// with one call before any starts the next (between_calls), as the end of a kernel would
// ensure. The host never batches more blocks than the GPU holds at once. The count of blocks
// past each call is the fourth word of the epoch state; the last block past the last call puts
// it back to zero, when no block waits on it any more.
__device__ __forceinline__ void between_calls(const Peers& peers, int rank, int done, const volatile int* abort) {
  // System scope: what this block wrote (into peers' memory too, and its own inboxes put back to
  // empty) is seen before anything of the next call, by every GPU.
  blocks_meet<true>(&epoch_state(peers, rank)[3], gridDim.x * done, abort);
}

__device__ __forceinline__ void batch_done(const Peers& peers, int rank, int ncalls) {
  if (threadIdx.x != 0 || ncalls < 2) return;
  u32* passed = &epoch_state(peers, rank)[3];
  if (atomicAdd(passed, 1u) == gridDim.x * ncalls - 1) *passed = 0;
}

// ---- fused launches -----------------------------------------------------------------------------
//
// The packet kernels (low-latency and sentinel all-reduce, and the other collectives') run a
// launch's calls as one call instead: one epoch, one begin and end, and the calls' units side by
// side in the inboxes, call k's right after call k-1's (each call's bytes rounded up to whole
// units; in every sender's slot, for the other collectives), so that k small calls cost about
// one. The host fuses only calls whose units fit the inboxes together, and the same
// calls on every rank (policy.rs, `fuses_with`): every rank lays the inboxes out alike. A call
// of a fused launch must not read what another writes (NCCL promises no order inside a group
// either).

// Units (of UNIT bytes) of call `c` (a FusedCall or a PacketCall).
template <typename T, int UNIT, typename C>
__device__ __forceinline__ u64 units_of(const C& c) {
  return (c.count * sizeof(T) + UNIT - 1) / UNIT;
}

// Units of every call of the launch (FusedArgs or PacketArgs).
template <typename T, int UNIT, typename A>
__device__ __forceinline__ u64 fused_units(const A& args) {
  u64 units = 0;
  for (int k = 0; k < args.ncalls; k++) units += units_of<T, UNIT>(args.calls[k]);
  return units;
}

// Unit `unit` of the launch: call `call`'s unit `unit_of_call`. Past the last unit: the last
// call's units past its end.
struct Piece {
  int call;
  u64 unit;
};
template <typename T, int UNIT, typename A>
__device__ __forceinline__ Piece piece_of(const A& args, u64 unit) {
  int k = 0;
  for (; k + 1 < args.ncalls; k++) {
    u64 units = units_of<T, UNIT>(args.calls[k]);
    if (unit < units) break;
    unit -= units;
  }
  return Piece{k, unit};
}

// As fused_units and piece_of, for a launch that may be known to carry one call (ONE): its
// fields are then read at fixed places of the parameters rather than through the call's index,
// which waits for the reads before it (part of 0.4 us a small call took more on 2 H100).
template <typename T, int UNIT, bool ONE>
__device__ __forceinline__ u64 launch_units(const FusedArgs& args) {
  if constexpr (ONE) {
    return units_of<T, UNIT>(args.calls[0]);
  } else {
    return fused_units<T, UNIT>(args);
  }
}
template <typename T, int UNIT, bool ONE>
__device__ __forceinline__ Piece launch_piece(const FusedArgs& args, u64 unit) {
  if constexpr (ONE) {
    return Piece{0, unit};
  } else {
    return piece_of<T, UNIT>(args, unit);
  }
}

// ---- data movement ------------------------------------------------------------------------------

// A pack is 16 bytes: the unit of the bulk of the work. Pack j (elements j*N .. j*N+N-1) is
// always handled by thread j mod (grid size), and the few elements past the last whole pack by
// the first threads of block 0, in every phase, whatever the alignment of the user's pointers:
// that is what makes per-block barriers enough.
struct __align__(16) Pack { u32 w[4]; };

template <typename T> struct PackOf {
  static const int N = 16 / sizeof(T);
  union U {
    Pack pack;
    T v[N];
  };
};

__device__ __forceinline__ bool aligned16(const void* p) { return ((u64)p & 15) == 0; }
__device__ __forceinline__ u64 grid_threads() { return (u64)gridDim.x * blockDim.x; }
__device__ __forceinline__ u64 thread_index() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }

// The `i`-th rank after `rank` (0 < i < nranks). Loops over peers start with the next rank, so
// that the ranks' first stores go to different GPUs.
__device__ __forceinline__ int rank_after(int rank, int i, int nranks) {
  return rank + i < nranks ? rank + i : rank + i - nranks;
}

// Runs CALL with NR, a constant, the fewest of 2, 4 and MAX_RANKS ranks that hold `nranks`: the
// kernels whose loops over peers unroll to what is there (their per-rank values in registers).
#define BY_RANKS(nranks, CALL)            \
  do {                                    \
    if ((nranks) <= 2) {                  \
      constexpr int NR = 2;               \
      CALL;                               \
    } else if ((nranks) <= 4) {           \
      constexpr int NR = 4;               \
      CALL;                               \
    } else {                              \
      constexpr int NR = MAX_RANKS;       \
      CALL;                               \
    }                                     \
  } while (0)

// The first pack index >= `lo` that this thread handles.
__device__ __forceinline__ u64 first_pack(u64 lo) {
  u64 s = grid_threads();
  return lo + (thread_index() + s - lo % s) % s;
}

// The element past the last whole pack that this thread handles, if any, within [lo, hi).
template <typename T>
__device__ __forceinline__ bool my_tail_element(u64 count, u64 lo, u64 hi, u64* element) {
  u64 tail_start = count / PackOf<T>::N * PackOf<T>::N;
  if (blockIdx.x != 0) return false;
  u64 e = tail_start + threadIdx.x;
  *element = e;
  return e < count && e >= lo && e < hi;
}

// Pack j of `src` (elements j*N .. j*N+N-1), whatever the alignment of `src`.
template <typename T>
__device__ __forceinline__ Pack load_pack(const T* src, u64 j, bool aligned) {
  if (aligned) return ((const Pack*)src)[j];
  typename PackOf<T>::U p;
#pragma unroll
  for (int k = 0; k < PackOf<T>::N; k++) p.v[k] = src[j * PackOf<T>::N + k];
  return p.pack;
}

// Copy loops take UNROLL of a thread's packs at a time, all loads before any store: each load
// waits a memory round trip, and one in flight per thread leaves HBM and NVLink idle.
#define UNROLL 4

// Pushes this thread's share of elements [begin, end) (`begin` a multiple of the pack) of
// `in[d]` into `dst[d]` for every d < ndst, or with SHARED of `in[0]` into every `dst[d]` (read
// once for all); the `dst` are 16-aligned and take element i at byte (i - begin) * sizeof(T).
// All destinations go in one pass, so that a copy within the GPU and a push over NVLink run side
// by side, not one after the other. Every destination's pack j is this thread's, as in copy_out.
template <bool SHARED, typename T>
__device__ void push_packs(const T* const* in, u64 count, u64 begin, u64 end, char* const* dst, int ndst) {
  const int N = PackOf<T>::N;
  u64 whole_end = (end < count / N * N ? end : count / N * N) / N;
  const u64 G = grid_threads();
  u64 j = first_pack(begin / N);
  for (; j + (UNROLL - 1) * G < whole_end; j += UNROLL * G) {
    for (int s = 0; s < (SHARED ? 1 : ndst); s++) {
      const bool aligned = aligned16(in[s]);
      Pack p[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; u++) p[u] = load_pack(in[s], j + u * G, aligned);
      for (int d = SHARED ? 0 : s; d < (SHARED ? ndst : s + 1); d++) {
#pragma unroll
        for (int u = 0; u < UNROLL; u++) *(Pack*)(dst[d] + ((j + u * G) * N - begin) * sizeof(T)) = p[u];
      }
    }
  }
  for (; j < whole_end; j += G) {
    for (int s = 0; s < (SHARED ? 1 : ndst); s++) {
      Pack p = load_pack(in[s], j, aligned16(in[s]));
      for (int d = SHARED ? 0 : s; d < (SHARED ? ndst : s + 1); d++)
        *(Pack*)(dst[d] + (j * N - begin) * sizeof(T)) = p;
    }
  }
  u64 e;
  if (my_tail_element<T>(count, begin, end, &e)) {
    for (int d = 0; d < ndst; d++) *(T*)(dst[d] + (e - begin) * sizeof(T)) = in[SHARED ? 0 : d][e];
  }
}

// Swaps this thread's share of packs [lo, hi) of `a` and `b` (both 16-aligned), and, where
// `tail`, the elements of `count` past the last whole pack: one thread reads each pack of both
// before it writes either, so that no other thread sees one half-swapped.
template <typename T>
__device__ void swap_packs(T* a, T* b, u64 count, u64 lo, u64 hi, bool tail) {
  Pack* pa = (Pack*)a;
  Pack* pb = (Pack*)b;
  const u64 G = grid_threads();
  u64 j = first_pack(lo);
  for (; j + (UNROLL - 1) * G < hi; j += UNROLL * G) {
    Pack p[UNROLL], q[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      p[u] = pa[j + u * G];
      q[u] = pb[j + u * G];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      pa[j + u * G] = q[u];
      pb[j + u * G] = p[u];
    }
  }
  for (; j < hi; j += G) {
    Pack p = pa[j], q = pb[j];
    pa[j] = q;
    pb[j] = p;
  }
  u64 e;
  if (tail && my_tail_element<T>(count, 0, count, &e)) {
    T x = a[e];
    a[e] = b[e];
    b[e] = x;
  }
}

// push_packs of one source into every destination.
template <typename T>
__device__ __forceinline__ void push_range(const T* in, u64 count, u64 begin, u64 end, char* const* dst, int ndst) {
  push_packs<true>(&in, count, begin, end, dst, ndst);
}

// Reduces packs j, j + G, ... (U of them) of `src[0..nranks)` into `out` and `copies[0..ncopies)`,
// all loads before any store. NR >= nranks: the ranks' packs are held in registers, so the
// fewer the better.
template <typename T, int OP, int NR, int U>
__device__ __forceinline__ void reduce_packs(const char* const* src, int nranks, u64 begin, u64 j, u64 G, T* out,
                                             bool out_aligned, char* const* copies, int ncopies) {
  const int N = PackOf<T>::N;
  typename PackOf<T>::U in[U][NR];
#pragma unroll
  for (int u = 0; u < U; u++) {
    u64 at = ((j + u * G) * N - begin) * sizeof(T);
    // Every pack set, a rank past `nranks` to zeros: one left unset kept the whole array in
    // local memory, each load stored there before the next was issued (one round trip each).
#pragma unroll
    for (int r = 0; r < NR; r++) in[u][r].pack = r < nranks ? *(const Pack*)(src[r] + at) : Pack{0, 0, 0, 0};
  }
#pragma unroll
  for (int u = 0; u < U; u++) {
    u64 at = ((j + u * G) * N - begin) * sizeof(T);
    typename PackOf<T>::U result;
#pragma unroll
    for (int k = 0; k < N; k++) result.v[k] = reduce_element<T, OP, NR>(in[u], nranks, k);
    if (out_aligned) {
      ((Pack*)out)[j + u * G] = result.pack;
    } else {
#pragma unroll
      for (int k = 0; k < N; k++) out[(j + u * G) * N + k] = result.v[k];
    }
#pragma unroll
    for (int c = 0; c < NR; c++) {
      if (c < ncopies) *(Pack*)(copies[c] + at) = result.pack;
    }
  }
}

// Reduces elements [begin, end) (`begin` a multiple of the pack) of `src[0..nranks)`, in rank
// order, into `out` and into `copies[0..ncopies)`. `src[r]` and `copies[c]` are 16-aligned and
// hold element i at byte (i - begin) * sizeof(T). Several packs at a time per thread, so that
// each thread keeps loads in flight: two for 4 ranks (on 2 H200 the direct two-shot took 3 - 6 %
// less time from 4 MiB than with one, the staged one 10 - 13 %), four for 2 ranks (the same 8
// packs in registers; with fewer blocks beside compute, each thread must keep more in flight),
// one for 8 ranks (two held 16 packs in registers and spilled).
template <typename T, int OP, int NR>
__device__ void reduce_range_of(const char* const* any_src, int nranks, u64 count, u64 begin, u64 end, T* out,
                                char* const* any_copies, int ncopies) {
  const int N = PackOf<T>::N;
  // In registers: fully unrolled loops index them with constants.
  const char* src[NR];
  char* copies[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) {
    src[r] = r < nranks ? any_src[r] : any_src[0];
    copies[r] = r < ncopies ? any_copies[r] : (char*)0;
  }
  bool out_aligned = aligned16(out);
  u64 whole_end = (end < count / N * N ? end : count / N * N) / N;
  const u64 G = grid_threads();
  u64 j = first_pack(begin / N);
  const int U = NR > 4 ? 1 : NR > 2 ? 2 : 4;
  for (; j + (U - 1) * G < whole_end; j += U * G)
    reduce_packs<T, OP, NR, U>(src, nranks, begin, j, G, out, out_aligned, copies, ncopies);
  // Up to U - 1 packs left for this thread.
  for (; j < whole_end; j += G) reduce_packs<T, OP, NR, 1>(src, nranks, begin, j, G, out, out_aligned, copies, ncopies);
  u64 e;
  if (my_tail_element<T>(count, begin, end, &e)) {
    u64 at = (e - begin) * sizeof(T);
    struct {
      T v[1];
    } from[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
      if (r < nranks) from[r].v[0] = *(const T*)(src[r] + at);
    }
    T v = reduce_element<T, OP, NR>(from, nranks, 0);
    out[e] = v;
    for (int c = 0; c < ncopies; c++) *(T*)(copies[c] + at) = v;
  }
}

// reduce_range_of for the fewest ranks that hold `nranks`.
template <typename T, int OP>
__device__ void reduce_range(const char* const* src, int nranks, u64 count, u64 begin, u64 end, T* out,
                             char* const* copies, int ncopies) {
  if (nranks <= 2) return reduce_range_of<T, OP, 2>(src, nranks, count, begin, end, out, copies, ncopies);
  if (nranks <= 4) return reduce_range_of<T, OP, 4>(src, nranks, count, begin, end, out, copies, ncopies);
  reduce_range_of<T, OP, MAX_RANKS>(src, nranks, count, begin, end, out, copies, ncopies);
}

// Copies elements [begin, end) (`begin` a multiple of the pack) from the 16-aligned `src`,
// which holds them from `begin` on, into `out`.
template <typename T>
__device__ void copy_out(T* out, const T* src, u64 count, u64 begin, u64 end) {
  const int N = PackOf<T>::N;
  u64 whole_end = (end < count / N * N ? end : count / N * N) / N;
  const Pack* packs = (const Pack*)src - begin / N;
  if (aligned16(out)) {
    const u64 G = grid_threads();
    u64 j = first_pack(begin / N);
    for (; j + (UNROLL - 1) * G < whole_end; j += UNROLL * G) {
      Pack p[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; u++) p[u] = packs[j + u * G];
#pragma unroll
      for (int u = 0; u < UNROLL; u++) ((Pack*)out)[j + u * G] = p[u];
    }
    for (; j < whole_end; j += G) ((Pack*)out)[j] = packs[j];
  } else {
    for (u64 j = first_pack(begin / N); j < whole_end; j += grid_threads()) {
      typename PackOf<T>::U p;
      p.pack = packs[j];
#pragma unroll
      for (int k = 0; k < N; k++) out[j * N + k] = p.v[k];
    }
  }
  u64 e;
  if (my_tail_element<T>(count, begin, end, &e)) out[e] = src[e - begin];
}

// ---- staging ------------------------------------------------------------------------------------
//
// Staging, as the host lays it out (`Staging` above, layout.rs):
//   [area of even epochs][area of odd epochs][low-latency inboxes][sentinel inboxes]
// One-shot uses MAX_RANKS slots of `one_shot_slot` in an area, one per sender; two-shot uses
// nranks slots of one chunk and 16 bytes (at most window + 32 * nranks in all), then a result
// area of `window` bytes at `results`; the other families' staged paths, one slot per sender (or
// one in all) of one chunk rounded up to 16 bytes (chunk_slot), or of one window of it where the
// slots would not fit twice `window` bytes (staged_window). The low-latency inboxes are 2
// parities x MAX_RANKS senders x packets of twice LL_MAX_BYTES, shared out among fewer senders in
// larger slots where there are fewer ranks (ll_capacity); the sentinel inboxes 2 parities x
// MAX_RANKS senders x SENTINEL_MAX_BYTES, shared out alike (sentinel_capacity). A rank writes
// into an area (or inbox) of a peer in call E+2 only once it has passed a barrier of (or
// received packets of) call E+1 with that peer, whose kernel of call E+1 is then running, so its
// kernel of call E, which read the same area, is done.
__device__ __forceinline__ u64 area_offset(const Staging& staging, u32 epoch) { return (epoch & 1) * staging.area; }
// The most bytes of a chunk one slot of the other families' staged paths holds, where `senders`
// slots share an area (twice two-shot's window: GATHER_SCATTER_LIMIT_BYTES in layout.rs): whole
// packs. Larger chunks go in windows of this size, each with an epoch of its own.
__device__ __forceinline__ u64 staged_window(const Staging& staging, int senders) {
  return 2 * staging.window / senders / 16 * 16;
}
// The most bytes one sender's packets carry to one receiver in a call on NR ranks (NR: 2, 4 or
// 8, the fewest that hold the communicator's): the inboxes, laid out for MAX_RANKS senders of
// LL_MAX_BYTES, in NR slots per parity (`ll_capacity` in layout.rs).
template <int NR> __device__ __forceinline__ constexpr u64 ll_capacity() {
  static_assert(NR <= MAX_RANKS && MAX_RANKS % NR == 0, "NR divides MAX_RANKS");
  return (u64)LL_MAX_BYTES * (MAX_RANKS / NR);
}
// Where the packets of sender `from` for epoch parity `parity` start, in the low-latency inbox
// at `inbox` of a rank's `staging` (the sender writes them there, the rank reads them), for a
// kernel built for up to NR ranks. Every kernel of a communicator takes the same NR: the host
// gives them one number of ranks.
template <int NR>
__device__ __forceinline__ u64* ll_slot(char* staging, u64 inbox, u64 parity, int from) {
  return (u64*)(staging + inbox) + (parity * NR + from) * (ll_capacity<NR>() / 4);
}
// The most bytes one sender's sentinel stores carry to one receiver in a call on NR ranks: the
// sentinel inboxes, laid out for MAX_RANKS senders of SENTINEL_MAX_BYTES, in NR slots per parity
// (`sentinel_capacity` in layout.rs). A lone call takes at most SENTINEL_MAX_BYTES; a fused
// launch's calls together may take the slot.
template <int NR> __device__ __forceinline__ constexpr u64 sentinel_capacity() {
  static_assert(NR <= MAX_RANKS && MAX_RANKS % NR == 0, "NR divides MAX_RANKS");
  return (u64)SENTINEL_MAX_BYTES * (MAX_RANKS / NR);
}
// As ll_slot, in the sentinel inbox.
template <int NR>
__device__ __forceinline__ Pack* sentinel_slot(char* staging, u64 inbox, u64 parity, int from) {
  return (Pack*)(staging + inbox + (parity * NR + from) * sentinel_capacity<NR>());
}

// Elements in a rank's share of `count` (two-shot's chunk, reduce's): whole packs, so that every
// share starts 16-aligned in staging.
template <typename T>
__device__ __forceinline__ u64 chunk_elements(int nranks, u64 count) {
  const u64 N = PackOf<T>::N;
  return (count / N + nranks - 1) / nranks * N;
}

// The share of `owner`; the last owner also takes the elements past the last whole
// pack.
template <typename T>
__device__ __forceinline__ void chunk_bounds(int owner, int nranks, u64 count, u64* begin, u64* end) {
  u64 chunk = chunk_elements<T>(nranks, count);
  *begin = owner * chunk < count ? owner * chunk : count;
  *end = owner == nranks - 1 ? count : (*begin + chunk < count ? *begin + chunk : count);
}

// ---- packets ------------------------------------------------------------------------------------
//
// The low-latency kernels' packets: 8 bytes of 4 data bytes and a 4-byte flag (the call's
// epoch), two to a 16-byte store (an 8-byte half always arrives whole, which is all a packet
// needs), written into a slot of the receiver's inbox that is the sender's own (ll_slot); the
// receiver spins on each pair until both flags are this call's epoch.
__device__ __forceinline__ void ll_store(u64* address, u32 data0, u32 data1, u32 flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(data0), "r"(flag),
               "r"(data1), "r"(flag)
               : "memory");
}
// Loads the packet pair at `address`: its data into `data`, its flags into `seen`.
__device__ __forceinline__ void ll_load(const u64* address, u32* data, u32* seen) {
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(data[0]), "=r"(seen[0]), "=r"(data[1]), "=r"(seen[1])
               : "l"(address)
               : "memory");
}
// The low-latency inboxes of a rank as end_call's refresh finds them (see EPOCH_REFRESH): a
// packet is taken by its flag's equality with the call's epoch, so one left exactly 2^32 calls
// behind (a slot that only the largest packet calls use, in a job of billions of small calls)
// would pass for a fresh one. Each packet EPOCH_REFRESH or more behind `last` gets `first - 2`
// as its flag: behind every epoch of this call, and the peers' packets of the next call are
// ahead. A peer's packet that comes between a load and its swap stays (the swap fails; the
// peers' 8-byte halves arrive whole). One thread, after the flags (refresh_epochs): the 8 MiB in
// 65,536 runs of eight 16-byte loads, once in 2^29 calls (spread over the grid, the loop made
// ptxas spill registers in the low-latency all-reduce kernels).
#define LL_INBOX_PAIRS (2ull * MAX_RANKS * 2 * LL_MAX_BYTES / 16)  // INBOX_BYTES in layout.rs
__device__ __forceinline__ void refresh_inbox(u64* inbox, u32 first, u32 last) {
  const int BATCH = 8;
  static_assert(LL_INBOX_PAIRS % BATCH == 0, "whole runs");
  const u64 behind = (u64)(first - 2) << 32;
  for (u64 i = 0; i < LL_INBOX_PAIRS; i += BATCH) {
    u64 seen[2 * BATCH];
#pragma unroll
    for (int k = 0; k < BATCH; k++)
      asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
                   : "=l"(seen[2 * k]), "=l"(seen[2 * k + 1])
                   : "l"(inbox + 2 * (i + k))
                   : "memory");
#pragma unroll
    for (int h = 0; h < 2 * BATCH; h++) {
      if (stale_epoch((u32)(seen[h] >> 32), last))
        atomicCAS_system(&inbox[2 * i + h], seen[h], (seen[h] & 0xffffffffull) | behind);
    }
  }
}

// Loads the packet pair at `address` into `data`: whether both flags are `flag`.
__device__ __forceinline__ bool ll_poll(const u64* address, u32 flag, u32* data) {
  u32 seen[2];
  ll_load(address, data, seen);
  return seen[0] == flag && seen[1] == flag;
}
__device__ __forceinline__ void ll_wait(const u64* address, u32 flag, const volatile int* abort, int peer,
                                        u32* data) {
  bool arrived = false;
#pragma unroll 1
  for (int i = 0; i < FAST_POLLS && !arrived; i++) arrived = ll_poll(address, flag, data);
  if (arrived) return;
  unsigned spins = FAST_POLLS;
  u64 since = 0;
  while (!ll_poll(address, flag, data)) {
    if ((++spins & 1023u) == 0 && give_up(abort, since, peer)) break;
    poll_pause(spins);
  }
}

// The low-latency kernel's unit of work: 8 bytes, E elements.
template <typename T, int E> union Unit {
  u32 w[2];
  T v[E];
};
// Unit u of `in` (zero past the end), whatever its alignment.
template <typename T, int E>
__device__ __forceinline__ Unit<T, E> load_unit(const T* in, u64 count, u64 u, bool whole) {
  Unit<T, E> unit;
  if (whole && (u + 1) * E <= count) {
    unit = *(const Unit<T, E>*)(in + u * E);
  } else {
    unit.w[0] = unit.w[1] = 0;
    // Unrolled: indexed by constants, the unit stays in registers (a loop's index would put it,
    // and every unit it is copied to, in local memory, on the waits' path too).
#pragma unroll
    for (int e = 0; e < E; e++) {
      if (u * E + e < count) unit.v[e] = in[u * E + e];
    }
  }
  return unit;
}
// Unit u of a thread's input `in` of `count` elements: whole where `in` is 8-aligned.
template <typename T, int E = 8 / sizeof(T)>
__device__ __forceinline__ Unit<T, E> input_unit(const T* in, u64 count, u64 u) {
  return load_unit<T, E>(in, count, u, ((u64)in & 7) == 0);
}

// Unit `u` of every rank's chunk reduced in rank order into `out`: this rank's own is `own` (read
// from its input before the waits: read after them, its load's round trip added to the call),
// each peer's from its packets at unit `slot` of its slot in this rank's inbox at `inbox`, once
// they came. Both reducing packet kernels receive so (ll_one_shot, ll_reduce).
// NR: at least nranks, the loops' unrolled length.
template <typename T, int OP, int NR>
__device__ __forceinline__ void ll_reduce_unit(const Peers& peers, int rank, int nranks, u64 inbox, u32 epoch,
                                               const volatile int* abort, u64 slot, Unit<T, 8 / sizeof(T)> own,
                                               T* out, u64 count, u64 u) {
  const int E = 8 / sizeof(T);
  Unit<T, E> from[NR];
#pragma unroll
  for (int p = 0; p < NR; p++) {
    if (p == rank) {
      from[p] = own;
    } else if (p < nranks) {
      ll_wait(ll_slot<NR>(peers.staging[rank], inbox, epoch & 1, p) + 2 * slot, epoch, abort, p, from[p].w);
    }
  }
#pragma unroll
  for (int e = 0; e < E; e++) {
    if (u * E + e >= count) break;
    out[u * E + e] = reduce_element<T, OP, NR>(from, nranks, e);
  }
}

// What a rank tells every rank of its call's buffers, for the direct algorithm: three packet
// pairs (`ll_store`: two 4-byte values, each beside the call's epoch), its input's address, its
// output's, and whether both are usable (the host found them reachable from every peer GPU, and
// 16-aligned) beside the call's tag (Views), written by the rank's block 0 into each rank's flags. Each half arrives whole
// with its epoch, so the writer needs no release before them: one (st.release.sys) took about
// 1 us of every direct call on 2 H200, as long as the call's data took to cross NVLink at 8 KiB.
struct Published {
  u64 in[2];
  u64 out[2];
  u64 usable[2];
};

// Published's u64 pairs, after the direct calls' end slots, stay 16-aligned.
static_assert(MAX_RANKS % 4 == 0, "MAX_RANKS keeps Published 16-aligned");
__device__ __forceinline__ Published* published(u32* flags, int rank) {
  return (Published*)(flags + BARRIERS * MAX_BLOCKS * MAX_RANKS + 8 + MAX_RANKS) + rank;
}

// The rank's flags as end_call's refresh finds them (see EPOCH_REFRESH), then its inboxes.
__device__ __noinline__ void refresh_epochs(u32* flags, u64* inbox, u32 first, u32 last) {
  const u32 epoch = last;
  // The per-block meetings' slots and the direct calls' end slots, in runs of loads.
  const int BATCH = 32;
  const int SLOTS = BARRIERS * MAX_BLOCKS * MAX_RANKS;
  static_assert(SLOTS % BATCH == 0, "whole runs");
  for (int i = 0; i < SLOTS; i += BATCH) {
    u32 seen[BATCH];
#pragma unroll
    for (int k = 0; k < BATCH; k++) seen[k] = ((volatile u32*)flags)[i + k];
#pragma unroll
    for (int k = 0; k < BATCH; k++)
      if (stale_epoch(seen[k], epoch)) atomicCAS_system(&flags[i + k], seen[k], epoch);
  }
  u32* ends = flags + SLOTS + 8;  // direct_end_slot's
  for (int k = 0; k < MAX_RANKS; k++) {
    u32 seen = ((volatile u32*)ends)[k];
    if (stale_epoch(seen, epoch)) atomicCAS_system(&ends[k], seen, epoch);
  }
  // Each rank's Published: packet pairs, a flag in each 8-byte half's upper word.
  u64* pairs = (u64*)published(flags, 0);
  for (int k = 0; k < MAX_RANKS * (int)(sizeof(Published) / sizeof(u64)); k++) {
    u64 seen = ((volatile u64*)pairs)[k];
    if (stale_epoch((u32)(seen >> 32), epoch))
      atomicCAS_system(&pairs[k], seen, (seen & 0xffffffffull) | (u64)epoch << 32);
  }
  refresh_inbox(inbox, first, last);
}

// Block 0 tells every rank this call's buffers, each as that rank maps them.
__device__ __forceinline__ void publish(const Peers& peers, int rank, int nranks, const Views& views, u32 epoch) {
  int p = threadIdx.x;
  if (blockIdx.x == 0 && p < nranks) {
    Published* mine = published(peers.flags[p], rank);
    ll_store(mine->in, (u32)views.in[p], (u32)(views.in[p] >> 32), epoch);
    ll_store(mine->out, (u32)views.out[p], (u32)(views.out[p] >> 32), epoch);
    ll_store(mine->usable, (u32)views.usable, views.tag, epoch);
  }
}

// Loads the pair of a peer's slot at `address` into `data`: whether it is call `epoch`'s; `later`
// set where it is a later call's.
__device__ __forceinline__ bool published_pair(const u64* address, u32 epoch, u32* data, bool& later) {
  u32 seen[2];
  ll_load(address, data, seen);
  later = later || (int)(seen[0] - epoch) > 0 || (int)(seen[1] - epoch) > 0;
  return seen[0] == epoch && seen[1] == epoch;
}

// Waits for every rank's buffers of call `epoch`, into `ins` and `outs` (shared). Whether every
// rank's are usable and every rank's call is this one (`tag`): the same answer in every block of
// every rank, as they all read the same slots (where one rank's tag differs, every rank sees a
// tag unlike its own). While the ranks are in step, a peer's slot for this call stays until this call is done:
// the peer publishes the next call only after passing this call's last meeting, which our last
// block reaches once every block of ours is done (end_of_data), or our staged windows' meetings
// with every block of ours. A later call's in it means that a wait of the peer gave up and it ran on: out of
// step, this call gives up at once and takes the staged path (which writes only into staging),
// where it would otherwise wait for a call the peer has left. The few threads that wait poll
// back to back (see poll_pause).
__device__ __forceinline__ bool gather_published(const Peers& peers, int rank, int nranks, u32 epoch, u32 tag,
                                                 const volatile int* abort, u64* ins, u64* outs) {
  int p = threadIdx.x;
  int ready = 1;
  if (p < nranks) {
    Published* theirs = published(peers.flags[rank], p);
    u32 in[2] = {0, 0}, out[2] = {0, 0}, usable[2] = {0, 0};
    unsigned spins = 0;
    u64 since = 0;
    bool came = false, later = false;
    while (!(came = published_pair(theirs->usable, epoch, usable, later) &&
                    published_pair(theirs->in, epoch, in, later) && published_pair(theirs->out, epoch, out, later))) {
      if (later) {
        stop_waiting(abort, OUT_OF_STEP(p));
        break;
      }
      if ((++spins & 1023u) == 0 && give_up(abort, since, p)) break;
    }
    // What the peer's earlier kernels wrote into its buffers, which this call may read, is seen
    // after the acquire (and no line of this GPU's caches read before it is used).
    (void)load_acquire((const u32*)theirs->usable + 1);
    // Aborted before the peer came, or out of step: its slot is not this call's, so take the
    // staged path; as where the peer's call is not this one.
    ready = came && usable[0] && usable[1] == tag;
    ins[p] = (u64)in[1] << 32 | in[0];
    outs[p] = (u64)out[1] << 32 | out[0];
  }
  return __syncthreads_and(ready);
}

// Where peer `from` tells `rank` that it has ended a direct call (end_of_data).
__device__ __forceinline__ u32* direct_end_slot(const Peers& peers, int rank, int from) {
  return epoch_state(peers, rank) + 8 + from;
}

// The end of a call's data in direct_where_or_staged: no rank goes on (and reuses its buffers)
// while a peer's blocks still read or write them, and one block of each rank waits for that.
// Each block counts itself once what it wrote is seen system-wide (and whether it went direct,
// in the count's upper half); the last to count, where any block went direct, meets the peers'
// last blocks in slots of their own, and the others leave at once, giving their SMs back to
// the work beside the call. A meeting of every block with the peers' same block kept finished
// blocks waiting, each on an SM, for peer blocks that a matrix product on another stream kept
// from starting, and the product waited for those SMs in turn (PyTorch overlapping its
// collectives with compute, as DDP and FSDP do). Blocks of one rank differ in the way they went
// only where a wait gave up: the call's direct blocks are then still met for. A peer's slot of
// the call's buffers (Published) stays as gather_published needs: the peer's last block passes
// this meeting only once every block of this rank has counted itself, after reading it. The
// last block puts the count back to zero as it counts itself.
static_assert(MAX_BLOCKS < (1 << 16), "end_of_data counts blocks in 16 bits");
__device__ __forceinline__ void end_of_data(const Peers& peers, int rank, int nranks, u32 epoch, bool direct,
                                            const volatile int* abort) {
  __shared__ bool meet;
  __syncthreads();
  if (threadIdx.x == 0) {
    const u32 mine = 1u + (direct ? 1u << 16 : 0u);
    // A lone block needs no count (as end_call).
    u32 before = 0;
    if (gridDim.x > 1) {
      // Only a direct block's accesses to the peers' buffers need to be seen first.
      if (direct) __threadfence_system();
      u32* count = &epoch_state(peers, rank)[4];
      before = atomicAdd(count, mine);
      // The last puts the count back for the next call (after every add, at one address).
      if ((before & 0xffffu) == gridDim.x - 1) *count = 0;
    }
    meet = (before & 0xffffu) == gridDim.x - 1 && (before + mine) >> 16 != 0;
    // What the other blocks wrote, ordered before their counts, before this block's release.
    if (meet && gridDim.x > 1) __threadfence_system();
  }
  __syncthreads();
  if (!meet) return;
  int p = threadIdx.x;
  if (p < nranks) {
    store_release(direct_end_slot(peers, p, rank), epoch);
    const u32* mine = direct_end_slot(peers, rank, p);
    unsigned spins = 0;
    u64 since = 0;
    while ((int)(load_acquire(mine) - epoch) < 0) {
      if ((++spins & 1023u) == 0 && give_up(abort, since, p)) break;
    }
  }
  __syncthreads();
}

// How a call whose kernel may go direct starts: its epoch, every rank's buffers of the call
// (published and gathered, in shared memory), and whether every rank's are usable.
struct Start {
  u32 epoch;
  bool direct;
  const u64* ins;
  const u64* outs;
};

__device__ __forceinline__ Start start_call(const Peers& peers, int rank, int nranks, const Views& views,
                                            const volatile int* abort) {
  __shared__ u64 ins[MAX_RANKS], outs[MAX_RANKS];
  u32 epoch = begin_call(peers, rank);
  publish(peers, rank, nranks, views, epoch);
  bool direct = gather_published(peers, rank, nranks, epoch, views.tag, abort, ins, outs);
  return Start{epoch, direct, ins, outs};
}

// The whole of a call whose kernel may go direct: `direct(start)` where every rank's buffers are
// usable and `may_go_direct(start)` (from what every rank published: the same answer on every
// rank), then one meeting (end_of_data), so that no rank goes on (and reuses its buffers) while
// a peer still reads or writes them; else `staged(epoch)`, which returns the last epoch it used.
template <typename MayGoDirect, typename Direct, typename Staged>
__device__ __forceinline__ void direct_where_or_staged(const Peers& peers, const Staging& staging, int rank, int nranks,
                                                       const Views& views, const volatile int* abort,
                                                       MayGoDirect may_go_direct, Direct direct, Staged staged) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  u32 last = start.epoch;
  const bool went_direct = start.direct && may_go_direct(start);
  if (went_direct) {
    direct(start);
  } else {
    last = staged(start.epoch);
  }
  end_of_data(peers, rank, nranks, start.epoch, went_direct, abort);
  end_call(peers, staging, rank, start.epoch, last);
}

// direct_where_or_staged, direct wherever every rank's buffers are usable.
template <typename Direct, typename Staged>
__device__ __forceinline__ void direct_or_staged(const Peers& peers, const Staging& staging, int rank, int nranks,
                                                 const Views& views, const volatile int* abort, Direct direct,
                                                 Staged staged) {
  direct_where_or_staged(
      peers, staging, rank, nranks, views, abort, [](const Start&) { return true; }, direct, staged);
}

// A window of a staged call: its `size` elements from `begin`, and its epoch.
struct Window {
  u64 begin;
  u64 size;
  u32 epoch;
};

// How many windows of `window` elements cover `count` (one, empty, where count is 0).
__device__ __forceinline__ u32 window_count(u64 count, u64 window) {
  return count <= window ? 1 : (u32)((count + window - 1) / window);
}

// Window w of `count` elements in windows of `window`, the first with epoch `epoch`.
__device__ __forceinline__ Window window_at(u64 count, u64 window, u32 epoch, u32 w) {
  const u64 begin = (u64)w * window;
  return Window{begin, count - begin < window ? count - begin : window, epoch + w};
}

// Runs `body(begin, size, epoch)` for elements [0, count) in windows of `window` elements (once,
// empty, where count is 0): window w, its `size` elements from `begin`, with epoch `epoch + w`
// (the staging areas alternate as between calls). Returns the last epoch used. The body
// addresses a window's elements from its start (its buffers moved on by `begin`), so that in
// windows of one size each element's place is the same thread's, on every rank: a block's
// meetings with the peers' same block then order all it touches from one window to the next
// (the slots it pushes window w + 1 into were last read, in w - 1, by the peers' same block,
// which has met it since), and it goes on to the next window without waiting for the rest of its
// grid. Before a window of another size (the last), the grid meets.
template <typename Body>
__device__ __forceinline__ u32 for_each_window(const Peers& peers, int rank, u64 count, u64 window, u32 epoch,
                                               const volatile int* abort, Body body) {
  const u32 windows = window_count(count, window);
  for (u32 w = 0; w < windows; w++) {
    const Window at = window_at(count, window, epoch, w);
    if (w > 0 && at.size != window) grid_barrier(peers, rank, abort);
    body(at.begin, at.size, at.epoch);
  }
  return epoch + windows - 1;
}

// The bytes of a window of the pipelined staged paths (for_each_window_pipelined) for a chunk of
// at most PIPELINE_FINE_BYTES; larger chunks take the staging's whole window (`largest`). Where
// the copy-out of one window runs beside the push of the next, more windows overlap more of it,
// but each costs a meeting of the peers. On 2 H100, staged: windows of 8 MiB gained on chunks of
// 16 - 64 MiB; windows of 4 MiB lost on chunks of 8 MiB (reduce-scatter, 1.12 x the time of one
// window); windows of no power of two (5 of 12.8 MiB for a chunk of 64 MiB, each starting 16-
// but not 128-aligned) lost too (1.06 - 1.19 x the time of 4 of 16 MiB).
#define PIPELINE_WINDOW_BYTES (8ull << 20)
#define PIPELINE_FINE_BYTES (64ull << 20)

// The elements of a window of the pipelined staged paths for a chunk of `count` elements of T,
// where the staging takes `largest` (whole packs) at most: the same on every rank, from the call
// alone.
template <typename T>
__device__ __forceinline__ u64 pipelined_window(u64 count, u64 largest) {
  const u64 fine = PIPELINE_WINDOW_BYTES / sizeof(T);
  return count * sizeof(T) <= PIPELINE_FINE_BYTES && fine < largest ? fine : largest;
}

// As for_each_window, for the staged paths whose windows are pushed into the peers' staging,
// met on, then drained (copied out, or reduced) by their receivers: window w + 1's push runs
// beside window w's drain, thread by thread in steps of one unrolled pass of their loops, so that
// NVLink and the GPU's own memory are busy at once. `push(window, lo, hi)` and `drain(window, lo,
// hi)` handle elements [lo, hi) (from the window's start, a multiple of the pack) of a window.
// Window w + 1 goes into the staging area window w - 1 used, which the peers' same block
// drained before the meeting of w that this block has passed; window w is drained before the
// meeting of w + 1, as for_each_window does, so the next call's order is unchanged. Before a
// window of another size (the last), whose slots lie elsewhere, the grid meets, as there.
// Returns the last epoch used.
template <typename T, typename Push, typename Drain>
__device__ __forceinline__ u32 for_each_window_pipelined(const Peers& peers, int rank, int nranks, u64 count,
                                                         u64 window, u32 epoch, const volatile int* abort, Push push,
                                                         Drain drain) {
  const u32 windows = window_count(count, window);
  const u64 step = (u64)UNROLL * grid_threads() * PackOf<T>::N;
  Window current = window_at(count, window, epoch, 0);
  push(current, 0, current.size);
  barrier(peers, rank, nranks, BARRIER_START, current.epoch, abort);
  for (u32 w = 0; w + 1 < windows; w++) {
    const Window next = window_at(count, window, epoch, w + 1);
    if (next.size != current.size) {
      drain(current, 0, current.size);
      grid_barrier(peers, rank, abort);
      push(next, 0, next.size);
    } else {
      for (u64 lo = 0; lo < current.size; lo += step) {
        const u64 hi = current.size - lo < step ? current.size : lo + step;
        push(next, lo, hi);
        drain(current, lo, hi);
      }
    }
    barrier(peers, rank, nranks, BARRIER_START, next.epoch, abort);
    current = next;
  }
  drain(current, 0, current.size);
  return epoch + windows - 1;
}

// ---- routes -------------------------------------------------------------------------------------
//
// The collectives that move bytes (all-gather, broadcast, all-to-all, gather, scatter; and the
// packet kernels of reduce-scatter and reduce, as all-to-all and gather) as one table: which
// pairs of ranks (sender s, receiver d) carry a chunk of `count` elements, and from which chunk
// of s's input to which chunk of d's output.

#define MOVE_ALL_GATHER 0
#define MOVE_BROADCAST 1
#define MOVE_ALL_TO_ALL 2
#define MOVE_GATHER 3
#define MOVE_SCATTER 4

// What the pair (s, d) carries in collective KIND: whether a chunk, from where in s's input and
// to where in d's output (in chunks).
struct Route {
  bool carries;
  u64 from;
  u64 to;
};

template <int KIND> __device__ __forceinline__ Route route(int s, int d, int root) {
  switch (KIND) {
    case MOVE_ALL_GATHER: return Route{true, 0, (u64)s};
    case MOVE_BROADCAST: return Route{s == root, 0, 0};
    case MOVE_ALL_TO_ALL: return Route{true, (u64)d, (u64)s};
    case MOVE_GATHER: return Route{d == root, 0, (u64)s};
    default: return Route{s == root, (u64)d, 0};  // scatter
  }
}

// Whether every receiver gets the same chunk of a sender's input (one read of it serves all).
template <int KIND> __device__ __forceinline__ constexpr bool same_chunk_to_all() {
  return KIND == MOVE_ALL_GATHER || KIND == MOVE_BROADCAST;
}
// Whether only the root sends (a receiver's staging then needs one slot, not one per sender).
template <int KIND> __device__ __forceinline__ constexpr bool root_sends() {
  return KIND == MOVE_BROADCAST || KIND == MOVE_SCATTER;
}

// Bytes of one rank's slot in a staging area.
__device__ __forceinline__ u64 chunk_slot(u64 count, u64 size) { return (count * size + 15) / 16 * 16; }

// Every kernel starts here. The host launches them with programmatic stream serialization
// (cuda::launch): a kernel may then be scheduled while the one before it on the stream still
// runs, which hides part of the launch latency between back-to-back calls. `griddepcontrol.wait`
// holds every thread until the previous kernel has completed and its memory is visible, so
// nothing of ours (the epoch read included) runs earlier than without it. Without the attribute
// it does nothing. Before sm_90 there is no such launch (the host never asks for it there,
// setup.rs).
__device__ __forceinline__ void after_previous_kernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the kernel after this one on the stream be scheduled now (where the host launched it
// early), rather than as this one's blocks exit: its blocks then hold SMs, waiting in
// after_previous_kernel, until this one completes. Small launches let it at once, which hides
// its launch; larger ones do not, so that no block of the next kernel holds an SM for the whole
// of a long call while work beside it (a matrix product on another stream, as PyTorch overlaps
// its collectives with compute) waits for SMs.
__device__ __forceinline__ void let_next_kernel_start() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether a launch of KERNEL_OF's kernels is small enough for let_next_kernel_start at its
// start: its calls' elements, times the ranks (a count is one rank's chunk for some
// collectives), at most EARLY_NEXT_MAX_BYTES (all-reduces of up to 1 MiB on 2 ranks).
#define EARLY_NEXT_MAX_BYTES (2ull << 20)
template <typename T>
__device__ __forceinline__ bool small_launch(const Args& args) {
  u64 count = 0;
  for (int k = 0; k < args.ncalls; k++) count += args.calls[k].count;
  return count * sizeof(T) * args.nranks <= EARLY_NEXT_MAX_BYTES;
}

