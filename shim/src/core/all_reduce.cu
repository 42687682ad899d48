// ncclshim's all-reduce over NVLink: kernels that write straight into the peers' staging
// buffers (peer pointers in one process, CUDA IPC mappings across processes). Writes, not reads:
// a store to a peer is posted and goes on, a load waits a round trip over NVLink.
// Compiled by NVRTC (no CUDA headers needed), ahead of time for the architectures the library
// carries and at run time for others (program.rs), one kernel per (algorithm, type, op):
//   ncclshim_<ll|one_shot|two_shot|direct|reduce_scatter>_<type>_<op>,
//   ncclshim_sentinel_<type>_<op> for the floating-point types only, and
//   ncclshim_all_gather_u8_<op> (all-gather moves bytes)
//
// Memory layout of one rank's buffer (allocated and exchanged by the host side):
//   flags:   [BARRIERS][MAX_BLOCKS][MAX_RANKS] u32  arrival epochs, written by the peers
//            u32 epoch, u32 blocks done, u32 windows  this rank's call count (see begin_call)
//            [MAX_RANKS] Published                   each rank's buffers of this call (direct)
//   staging: two areas, by epoch parity, then the low-latency inboxes and the sentinel inboxes
//            (see "the kernels")
//
// Ordering. Element i is handled by the same block index in every phase on every rank (the
// same grid-stride partition), so block b of each rank only ever waits for block b of its
// peers: a barrier is per block. A barrier is `__syncthreads(); thread p < nranks stores the
// epoch into peer p's slot for us with st.release.sys, then spins with ld.acquire.sys on our
// slot for peer p; __syncthreads()`. The release is cumulative over what the CTA barrier
// ordered before it (every thread's stores into the peers' staging); the acquire orders our
// later loads of our staging after the peers' stores. Epochs grow by one per call and are kept
// in device memory by the kernel itself, so back-to-back calls and CUDA graph replays (which
// replay the same parameters) stay in step. A peer may already have moved to the next epoch
// when we look, so arrival is `flag - epoch >= 0` (wrap-safe). No end barrier is needed: the
// staging alternates areas by epoch parity (see "the kernels" for why that is enough).
//
// Results are bitwise identical on every rank: the low-latency, sentinel and one-shot kernels
// reduce in rank order 0..n-1 on every rank; two-shot reduces each chunk once, on its owner, and
// the others copy it.

// MAX_THREADS, MAX_RANKS, MAX_BLOCKS, LL_MAX_BYTES and SENTINEL_MAX_BYTES come from the host
// (program::options), from limits.rs.
#if !defined(MAX_THREADS) || !defined(MAX_RANKS) || !defined(MAX_BLOCKS) || !defined(LL_MAX_BYTES) || \
    !defined(SENTINEL_MAX_BYTES)
#error "compile with -DMAX_THREADS, -DMAX_RANKS, -DMAX_BLOCKS, -DLL_MAX_BYTES and -DSENTINEL_MAX_BYTES"
#endif
#define BARRIERS 2
#define BARRIER_START 0
#define BARRIER_MIDDLE 1

typedef unsigned long long u64;
typedef unsigned int u32;

struct Peers {
  char* staging[MAX_RANKS];
  u32* flags[MAX_RANKS];
};

// One call's buffers as every rank addresses them, for the direct kernel (`Views` in comm.rs):
// in[r] and out[r] are this rank's input and output as rank r maps them (the same pointers where
// every rank is in one process; CUDA IPC mappings of the peers' otherwise). `usable`: the host
// found them reachable from every peer GPU, and 16-aligned.
struct Views {
  u64 in[MAX_RANKS];
  u64 out[MAX_RANKS];
  int usable;
};

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
// The fp8 pair conversions put our byte in the low half (sm_89 and later).
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
//       blocks of its own grid), read by the host's watcher, which says so
#define GAVE_UP_OWN (MAX_RANKS + 1)
__device__ __forceinline__ u64 global_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Whether a wait for `peer` (-1: blocks of this grid) should stop: asked every 1024 spins by
// every waiting loop, `since` starting at 0 (the first ask starts the clock). A kernel that gave
// up leaves wrong results; the host reports it and fails the communicator's later calls.
__device__ __noinline__ bool give_up(const volatile int* abort, u64& since, int peer) {
  // Once one wait has given up, the ranks are out of step: every later wait gives up at once.
  if (load_volatile(abort) || load_volatile(abort + 2)) return true;
  u64 now = global_ns();
  if (since == 0) {
    since = now;
    return false;
  }
  u64 limit = (u64)(unsigned)load_volatile(abort + 1) * 1000000000ull;
  if (limit == 0 || now - since < limit) return false;
  *(volatile int*)(abort + 2) = peer < 0 ? GAVE_UP_OWN : peer + 1;
  return true;
}

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
  // [0]: epoch, [1]: blocks done, [2]: blocks past windows (grid_barrier)
  return peers.flags[rank] + BARRIERS * MAX_BLOCKS * MAX_RANKS;
}
__device__ __forceinline__ u32 begin_call(const Peers& peers, int rank) {
  __shared__ u32 epoch;
  if (threadIdx.x == 0) epoch = *(volatile u32*)epoch_state(peers, rank) + 1;
  __syncthreads();
  return epoch;
}
// `epoch`: the last this call used (a call in windows uses one per window, see two_shot).
__device__ __forceinline__ void end_call(const Peers& peers, int rank, u32 epoch) {
  if (threadIdx.x != 0) return;
  u32* state = epoch_state(peers, rank);
  // Every block read the epoch before counting itself done, so the last one may move it on. A
  // lone block needs no count (the atomic's round trip would lengthen every small call).
  if (gridDim.x == 1 || atomicAdd(&state[1], 1u) == gridDim.x - 1) {
    state[1] = 0;
    state[2] = 0;
    state[0] = epoch;
  }
}

// Waits for every block of this grid to finish window `window` of the call (see two_shot). The
// host never launches more blocks than the GPU holds at once, so they all run. The count goes
// back to zero in end_call, when no block waits on it any more.
__device__ __forceinline__ void grid_barrier(const Peers& peers, int rank, u32 window, const volatile int* abort) {
  __syncthreads();
  if (threadIdx.x == 0) {
    u32* windows = &epoch_state(peers, rank)[2];
    __threadfence();
    atomicAdd(windows, 1u);
    u32 target = gridDim.x * (window + 1);
    unsigned spins = 0;
    u64 since = 0;
    while (*(volatile u32*)windows < target) {
      if ((++spins & 1023u) == 0 && give_up(abort, since, -1)) break;
    }
    __threadfence();
  }
  __syncthreads();
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

// Pushes this thread's share of elements [begin, end) of `in` (`begin` a multiple of the pack)
// into `dst[0..ndst)`, 16-aligned buffers that take element i at byte (i - begin) * sizeof(T).
// Copy loops take UNROLL of a thread's packs at a time, all loads before any store: each load
// waits a memory round trip, and one in flight per thread leaves HBM and NVLink idle.
#define UNROLL 4

template <typename T>
__device__ void push_range(const T* in, u64 count, u64 begin, u64 end, char* const* dst, int ndst) {
  const int N = PackOf<T>::N;
  bool aligned = aligned16(in);
  u64 whole_end = (end < count / N * N ? end : count / N * N) / N;
  const u64 G = grid_threads();
  u64 j = first_pack(begin / N);
  for (; j + (UNROLL - 1) * G < whole_end; j += UNROLL * G) {
    Pack p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) p[u] = load_pack(in, j + u * G, aligned);
    for (int d = 0; d < ndst; d++) {
#pragma unroll
      for (int u = 0; u < UNROLL; u++) *(Pack*)(dst[d] + ((j + u * G) * N - begin) * sizeof(T)) = p[u];
    }
  }
  for (; j < whole_end; j += G) {
    Pack p = load_pack(in, j, aligned);
    for (int d = 0; d < ndst; d++) *(Pack*)(dst[d] + (j * N - begin) * sizeof(T)) = p;
  }
  u64 e;
  if (my_tail_element<T>(count, begin, end, &e)) {
    T v = in[e];
    for (int d = 0; d < ndst; d++) *(T*)(dst[d] + (e - begin) * sizeof(T)) = v;
  }
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
#pragma unroll
    for (int r = 0; r < NR; r++) {
      if (r < nranks) in[u][r].pack = *(const Pack*)(src[r] + at);
    }
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
// hold element i at byte (i - begin) * sizeof(T). Two packs at a time per thread: on 2 H200 the
// direct two-shot took 3 - 6 % less time from 4 MiB, the staged one 10 - 13 % (one pack: fewer
// loads in flight; more: spilled registers). Eight ranks take one: two held 16 packs in registers
// and spilled.
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
  const int U = NR > 4 ? 1 : 2;
  for (; j + (U - 1) * G < whole_end; j += U * G)
    reduce_packs<T, OP, NR, U>(src, nranks, begin, j, G, out, out_aligned, copies, ncopies);
  if (j < whole_end) reduce_packs<T, OP, NR, 1>(src, nranks, begin, j, G, out, out_aligned, copies, ncopies);
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

// ---- the kernels --------------------------------------------------------------------------------
//
// Staging, as the kernels divide it (the host allocates staging_bytes(half_bytes), then both
// kinds of inboxes):
//   [area of even epochs][area of odd epochs][low-latency inboxes][sentinel inboxes]
// An area is 2 * half_bytes + 256 bytes: one-shot uses MAX_RANKS slots of area / MAX_RANKS, one
// per sender; two-shot uses nranks slots of one chunk and 16 bytes (at most half_bytes + 32 *
// nranks in all), then a result area of half_bytes at RESULTS. A rank writes into an area (or
// inbox) of a peer in call E+2 only once it has passed a barrier of (or received packets of)
// call E+1 with that peer, whose kernel of call E+1 is then running, so its kernel of call E,
// which read the same area, is done.
#define RESULTS(half_bytes) ((half_bytes) + 256)

__device__ __forceinline__ u64 area_bytes(u64 half_bytes) { return 2 * half_bytes + 256; }
__device__ __forceinline__ u64 area_offset(u64 half_bytes, u32 epoch) { return (epoch & 1) * area_bytes(half_bytes); }
__device__ __forceinline__ u64 inbox_offset(u64 half_bytes) { return 2 * area_bytes(half_bytes); }
// Past the low-latency inboxes (2 parities x MAX_RANKS senders x packets of twice the payload);
// the sentinel inboxes are 2 parities x MAX_RANKS senders x SENTINEL_MAX_BYTES.
__device__ __forceinline__ u64 sentinel_inbox_offset(u64 half_bytes) {
  return inbox_offset(half_bytes) + 2ull * MAX_RANKS * 2 * LL_MAX_BYTES;
}
// Where the packets of sender `from` for epoch parity `parity` start, in the low-latency inbox
// at `inbox` of a rank's `staging` (the sender writes them there, the rank reads them).
__device__ __forceinline__ u64* ll_slot(char* staging, u64 inbox, u64 parity, int from) {
  return (u64*)(staging + inbox) + (parity * MAX_RANKS + from) * (LL_MAX_BYTES / 4);
}
// As ll_slot, in the sentinel inbox.
__device__ __forceinline__ Pack* sentinel_slot(char* staging, u64 inbox, u64 parity, int from) {
  return (Pack*)(staging + inbox + (parity * MAX_RANKS + from) * SENTINEL_MAX_BYTES);
}

// One-shot: every rank pushes its input into a slot of every rank's staging, they meet, and
// every rank reduces all slots, locally, in rank order.
template <typename T, int OP>
__device__ void one_shot(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                         const volatile int* abort, const Views&) {
  u32 epoch = begin_call(peers, rank);
  u64 area = area_offset(half_bytes, epoch);
  u64 slot = area_bytes(half_bytes) / MAX_RANKS / 16 * 16;
  char* dst[MAX_RANKS];
  const char* src[MAX_RANKS];
  for (int p = 0; p < nranks; p++) {
    // Start with the next rank: the ranks' first stores go to different GPUs.
    int to = (rank + 1 + p) % nranks;
    dst[p] = peers.staging[to] + area + rank * slot;
    src[p] = peers.staging[rank] + area + p * slot;
  }
  push_range(in, count, 0, count, dst, nranks);
  barrier(peers, rank, nranks, BARRIER_START, epoch, abort);
  reduce_range<T, OP>(src, nranks, count, 0, count, out, (char* const*)0, 0);
  end_call(peers, rank, epoch);
}

// Elements in a two-shot chunk: whole packs, so that every chunk starts 16-aligned in staging.
template <typename T>
__device__ __forceinline__ u64 chunk_elements(int nranks, u64 count) {
  const u64 N = PackOf<T>::N;
  return (count / N + nranks - 1) / nranks * N;
}

// The chunk of `owner` in two-shot; the last owner also takes the elements past the last whole
// pack.
template <typename T>
__device__ __forceinline__ void chunk_bounds(int owner, int nranks, u64 count, u64* begin, u64* end) {
  u64 chunk = chunk_elements<T>(nranks, count);
  *begin = owner * chunk < count ? owner * chunk : count;
  *end = owner == nranks - 1 ? count : (*begin + chunk < count ? *begin + chunk : count);
}

// What a rank tells every rank of its call's buffers, for the direct algorithm: written by the
// rank's block 0 into each rank's flags with plain stores, then `epoch` with a release.
struct Published {
  u64 in;
  u64 out;
  u32 usable;  // the host found both reachable from every peer GPU, and 16-aligned
  u32 epoch;
};

__device__ __forceinline__ Published* published(u32* flags, int rank) {
  return (Published*)(flags + BARRIERS * MAX_BLOCKS * MAX_RANKS + 4) + rank;
}

// Block 0 tells every rank this call's buffers, each as that rank maps them.
__device__ __forceinline__ void publish(const Peers& peers, int rank, int nranks, const Views& views, u32 epoch) {
  int p = threadIdx.x;
  if (blockIdx.x == 0 && p < nranks) {
    Published* mine = published(peers.flags[p], rank);
    mine->in = views.in[p];
    mine->out = views.out[p];
    mine->usable = views.usable;
    store_release(&mine->epoch, epoch);
  }
}

// Waits for every rank's buffers of call `epoch`, into `ins` and `outs` (shared). Whether every
// rank's are usable: the same answer in every block of every rank, as they all read the same
// slots. A peer's slot for this call stays until this call is done: the peer publishes the next
// call only after passing this call's last barrier with every block of ours.
__device__ __forceinline__ bool gather_published(const Peers& peers, int rank, int nranks, u32 epoch,
                                                 const volatile int* abort, u64* ins, u64* outs) {
  int p = threadIdx.x;
  int ready = 1;
  if (p < nranks) {
    volatile Published* theirs = published(peers.flags[rank], p);
    unsigned spins = 0;
    u64 since = 0;
    while ((int)(load_acquire((const u32*)&theirs->epoch) - epoch) < 0) {
      if ((++spins & 1023u) == 0 && give_up(abort, since, p)) break;
    }
    // Aborted before the peer came: its slot may be stale, so take the staged path.
    ready = (int)(theirs->epoch - epoch) >= 0 && theirs->usable;
    ins[p] = theirs->in;
    outs[p] = theirs->out;
  }
  return __syncthreads_and(ready);
}

// Two-shot: every rank pushes each chunk of its input into a slot of the chunk's owner; they
// meet; each owner reduces its chunk from its slots, in rank order, into its output and into
// every other rank's result area; they meet; every rank copies the other chunks from its result
// area to its output.
template <typename T, int OP>
__device__ void two_shot_staged(Peers peers, int rank, int nranks, const T* in, T* out, u64 count,
                                u64 half_bytes, const volatile int* abort, u32 epoch) {
  u64 area = area_offset(half_bytes, epoch);
  // A slot holds one chunk, and the last owner's also the elements past the last whole pack.
  u64 slot = chunk_elements<T>(nranks, count) * sizeof(T) + 16;
  u64 begin, end;
  for (int step = 1; step <= nranks; step++) {
    int owner = (rank + step) % nranks;
    chunk_bounds<T>(owner, nranks, count, &begin, &end);
    char* dst = peers.staging[owner] + area + rank * slot;
    push_range(in, count, begin, end, &dst, 1);
  }
  barrier(peers, rank, nranks, BARRIER_START, epoch, abort);
  chunk_bounds<T>(rank, nranks, count, &begin, &end);
  const char* src[MAX_RANKS];
  char* copies[MAX_RANKS];
  int ncopies = 0;
  for (int r = 0; r < nranks; r++) {
    src[r] = peers.staging[rank] + area + r * slot;
    if (r != rank) copies[ncopies++] = peers.staging[r] + area + RESULTS(half_bytes) + begin * sizeof(T);
  }
  reduce_range<T, OP>(src, nranks, count, begin, end, out, copies, ncopies);
  barrier(peers, rank, nranks, BARRIER_MIDDLE, epoch, abort);
  const T* results = (const T*)(peers.staging[rank] + area + RESULTS(half_bytes));
  for (int step = 1; step < nranks; step++) {
    int owner = (rank + step) % nranks;
    chunk_bounds<T>(owner, nranks, count, &begin, &end);
    copy_out(out, results + begin, count, begin, end);
  }
}

// Messages larger than the staging go through it in windows of `half_bytes`, each run as if it
// were a call of its own, with an epoch of its own (so the staging areas alternate as between
// calls), and all blocks meet between windows (as kernels do between calls: the proof of the
// staging layout above needs it, since a window's blocks may handle other elements than the
// previous one's). Returns the last epoch used.
template <typename T, int OP>
__device__ u32 two_shot_windows(Peers peers, int rank, int nranks, const T* in, T* out, u64 count,
                                u64 half_bytes, const volatile int* abort, u32 epoch) {
  const u64 window = half_bytes / sizeof(T);
  u32 w = 0;
  for (u64 done = 0; done < count; done += window, w++) {
    if (w > 0) grid_barrier(peers, rank, w - 1, abort);
    u64 n = count - done < window ? count - done : window;
    two_shot_staged<T, OP>(peers, rank, nranks, in + done, out + done, n, half_bytes, abort, epoch + w);
  }
  return epoch + w - 1;
}

// The direct kernel's fallback (the staged two-shot), not inlined: inlined, it made the compiler
// spill registers in the direct path (MAX_THREADS per block leave 128 per thread).
template <typename T, int OP>
__device__ __noinline__ u32 direct_fallback(Peers peers, int rank, int nranks, const T* in, T* out, u64 count,
                                            u64 half_bytes, const volatile int* abort, u32 epoch) {
  return two_shot_windows<T, OP>(peers, rank, nranks, in, out, count, half_bytes, abort, epoch);
}

template <typename T, int OP>
__device__ void two_shot(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                         const volatile int* abort, const Views&) {
  u32 epoch = begin_call(peers, rank);
  u32 last = two_shot_windows<T, OP>(peers, rank, nranks, in, out, count, half_bytes, abort, epoch);
  end_call(peers, rank, last);
}

// Direct (every rank in one process, or each rank's buffers mapped by every peer: zero_copy/):
// two-shot without the staging. The ranks tell each other
// their buffers; each owner reads its chunk straight from every rank's input, reduces it in rank
// order and writes it straight into every rank's output; they meet once at the end, so that no
// rank goes on (and reuses its buffers) while a peer still reads or writes them. Pack j is read
// and written by one thread only, the owner's (j mod grid size), so in-place is safe. A rank's
// buffers may not be reachable from the other GPUs (cuMem allocations without access for them,
// other contexts, allocations a peer process has not mapped) or not 16-aligned: the host says so
// in `usable`, and if any rank's are not, every rank sees it and they all run the staged
// two-shot instead, in the same call.
template <typename T, int OP>
__device__ void direct(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                       const volatile int* abort, const Views& views) {
  u32 epoch = begin_call(peers, rank);
  publish(peers, rank, nranks, views, epoch);
  __shared__ u64 ins[MAX_RANKS], outs[MAX_RANKS];
  u32 last = epoch;
  if (gather_published(peers, rank, nranks, epoch, abort, ins, outs)) {
    u64 begin, end;
    chunk_bounds<T>(rank, nranks, count, &begin, &end);
    const char* src[MAX_RANKS];
    char* copies[MAX_RANKS];
    int ncopies = 0;
    for (int r = 0; r < nranks; r++) {
      src[r] = (const char*)ins[r] + begin * sizeof(T);
      if (r != rank) copies[ncopies++] = (char*)outs[r] + begin * sizeof(T);
    }
    reduce_range<T, OP>(src, nranks, count, begin, end, out, copies, ncopies);
    barrier(peers, rank, nranks, BARRIER_START, epoch, abort);
  } else {
    last = direct_fallback<T, OP>(peers, rank, nranks, in, out, count, half_bytes, abort, epoch);
  }
  end_call(peers, rank, last);
}

// Low latency (small messages): no staging, no barrier. Each rank writes its input straight into
// every peer's inbox as 8-byte packets of 4 data bytes and a 4-byte flag (the epoch), two to a
// 16-byte store (an 8-byte half always arrives whole, which is all a packet needs); a receiver
// spins on each pair until both flags are this call's epoch, then reduces in rank order, its own
// input read again from memory rather than through its inbox. Inboxes alternate by epoch parity:
// a rank writes a parity again only two calls later, and to finish the call in between it must
// have received every peer's packets of that call, which each peer sends only once done with
// the call before.
__device__ __forceinline__ void ll_store(u64* address, u32 data0, u32 data1, u32 flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(data0), "r"(flag),
               "r"(data1), "r"(flag)
               : "memory");
}
__device__ __forceinline__ void ll_wait(const u64* address, u32 flag, const volatile int* abort, int peer,
                                        u32* data) {
  u32 seen0, seen1;
  unsigned spins = 0;
  u64 since = 0;
  do {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(data[0]), "=r"(seen0), "=r"(data[1]), "=r"(seen1)
                 : "l"(address)
                 : "memory");
    if ((seen0 != flag || seen1 != flag) && (++spins & 1023u) == 0 && give_up(abort, since, peer)) break;
  } while (seen0 != flag || seen1 != flag);
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
    for (u64 e = 0; e < (u64)E && u * E + e < count; e++) unit.v[e] = in[u * E + e];
  }
  return unit;
}

template <typename T, int OP>
__device__ void ll_one_shot(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                            const volatile int* abort, const Views&) {
  const int E = 8 / sizeof(T);  // elements in one 8-byte unit
  u32 epoch = begin_call(peers, rank);
  const u64 units = (count * sizeof(T) + 7) / 8;
  const u64 parity = epoch & 1;
  const u64 inbox = inbox_offset(half_bytes);
  const bool whole = ((u64)in & 7) == 0;
  for (u64 u = thread_index(); u < units; u += grid_threads()) {
    Unit<T, E> mine = load_unit<T, E>(in, count, u, whole);
    // Starting with the next rank: the ranks' first stores go to different GPUs.
    for (int i = 1; i < nranks; i++) {
      int p = (rank + i) % nranks;
      ll_store(ll_slot(peers.staging[p], inbox, parity, rank) + 2 * u, mine.w[0], mine.w[1], epoch);
    }
  }
  for (u64 u = thread_index(); u < units; u += grid_threads()) {
    Unit<T, E> from[MAX_RANKS];
#pragma unroll
    for (int p = 0; p < MAX_RANKS; p++) {
      if (p == rank) {
        // Not yet overwritten in place: only this thread writes these elements, below.
        from[p] = load_unit<T, E>(in, count, u, whole);
      } else if (p < nranks) {
        ll_wait(ll_slot(peers.staging[rank], inbox, parity, p) + 2 * u, epoch, abort, p, from[p].w);
      }
    }
#pragma unroll
    for (int e = 0; e < E; e++) {
      if (u * E + e >= count) break;
      out[u * E + e] = reduce_element<T, OP>(from, nranks, e);
    }
  }
  end_call(peers, rank, epoch);
}

// Sentinel (small messages of floating-point types): as low-latency, but the data signals its
// own arrival, so every byte on NVLink is data. A word of the inbox that holds no data holds the
// sentinel, every bit set: a NaN in every element of every floating-point type. Senders write
// their input straight into every peer's inbox in 16-byte stores, each word of it (4 bytes, or 8
// for double) after one change: a word that is the sentinel gets its top bit cleared, which
// turns a NaN's sign, nothing else (the all-ones NaN of the top element becomes the positive
// one; the other elements, all-ones NaNs too, stay). A receiver spins on each 16 bytes until no
// word is the sentinel, then puts the sentinel back and reduces in rank order, its own input
// read again from memory and changed alike, so that every rank reduces the same bits. A word is
// written and read whole (aligned 4- and 8-byte accesses are single-copy atomic), so a word that
// is not the sentinel is the sender's, whatever order the words of a store arrive in.
//
// Inboxes alternate by epoch parity, as the low-latency kernel's: a sender writes a parity again
// only two calls later, once it has received something every peer sent in the call between,
// after that peer's kernel of this call had completed, sentinels put back included (a kernel's
// writes are done before the next one passes griddepcontrol.wait). The host fills the inboxes
// with the sentinel once; every call leaves them so, as long as every rank gives the same count.
// Integers have no free bit pattern: their small messages take the low-latency kernel.
#define SENTINEL 0xffffffffu

// The word a sentinel is a value of: an element, or 4 bytes of smaller ones.
template <typename T> struct SentinelWord { typedef u32 W; };
template <> struct SentinelWord<double> { typedef u64 W; };

// Clears the top bit of each word of `p` that is the sentinel (W: the word, u32 or u64).
template <typename W> __device__ __forceinline__ Pack clear_sentinels(Pack p) {
  if constexpr (sizeof(W) == 8) {
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
      if (p.w[k] == SENTINEL && p.w[k + 1] == SENTINEL) p.w[k + 1] = SENTINEL >> 1;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      if (p.w[k] == SENTINEL) p.w[k] = SENTINEL >> 1;
    }
  }
  return p;
}

template <typename W> __device__ __forceinline__ void sentinel_store(Pack* address, Pack p) {
  if constexpr (sizeof(W) == 8) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(address),
                 "l"(((u64)p.w[1] << 32) | p.w[0]), "l"(((u64)p.w[3] << 32) | p.w[2])
                 : "memory");
  } else {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(p.w[0]), "r"(p.w[1]),
                 "r"(p.w[2]), "r"(p.w[3])
                 : "memory");
  }
}

// Waits until no word at `address` is the sentinel, puts the sentinel back, returns the words.
template <typename W>
__device__ __forceinline__ Pack sentinel_take(Pack* address, const volatile int* abort, int peer) {
  Pack p;
  bool arrived;
  unsigned spins = 0;
  u64 since = 0;
  do {
    if constexpr (sizeof(W) == 8) {
      u64 lo, hi;
      asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(address) : "memory");
      p.w[0] = (u32)lo, p.w[1] = (u32)(lo >> 32), p.w[2] = (u32)hi, p.w[3] = (u32)(hi >> 32);
      arrived = lo != ~0ull && hi != ~0ull;
    } else {
      asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(p.w[0]), "=r"(p.w[1]), "=r"(p.w[2]), "=r"(p.w[3])
                   : "l"(address)
                   : "memory");
      arrived = p.w[0] != SENTINEL && p.w[1] != SENTINEL && p.w[2] != SENTINEL && p.w[3] != SENTINEL;
    }
    if (!arrived && (++spins & 1023u) == 0 && give_up(abort, since, peer)) break;
  } while (!arrived);
  sentinel_store<W>(address, Pack{{SENTINEL, SENTINEL, SENTINEL, SENTINEL}});
  return p;
}

// Pack j of `src` (zero past `count`), whatever the alignment of `src`.
template <typename T>
__device__ __forceinline__ Pack load_padded_pack(const T* src, u64 count, u64 j, bool aligned) {
  const int N = PackOf<T>::N;
  if (aligned && (j + 1) * N <= count) return ((const Pack*)src)[j];
  typename PackOf<T>::U p;
  p.pack = Pack{{0, 0, 0, 0}};
  // Unrolled, so that the loads go out together and the pack stays in registers.
#pragma unroll
  for (int k = 0; k < N; k++) {
    if (j * N + k < count) p.v[k] = src[j * N + k];
  }
  return p.pack;
}

template <typename T, int OP>
__device__ void sentinel(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                         const volatile int* abort, const Views&) {
  typedef typename SentinelWord<T>::W W;
  const int N = PackOf<T>::N;
  const u64 packs = (count + N - 1) / N;
  const bool in_aligned = aligned16(in), out_aligned = aligned16(out);
  // Each pack is loaded one turn ahead (past the end: zeros, no access), the first one before
  // the epoch is read, so that the two loads overlap (2 - 7 % faster on 2 and 4 H200; the same
  // in the low-latency kernel measured 0.1 us slower, so it is not there). The policy gives a
  // thread one pack, so only the first load counts there; the loop takes any grid.
  Pack next = load_padded_pack(in, count, thread_index(), in_aligned);
  u32 epoch = begin_call(peers, rank);
  const u64 inbox = sentinel_inbox_offset(half_bytes);
  const u64 parity = epoch & 1;
  for (u64 j = thread_index(); j < packs; j += grid_threads()) {
    Pack mine = clear_sentinels<W>(next);
    next = load_padded_pack(in, count, j + grid_threads(), in_aligned);
    // Starting with the next rank: the ranks' first stores go to different GPUs.
    for (int i = 1; i < nranks; i++) {
      int p = (rank + i) % nranks;
      sentinel_store<W>(sentinel_slot(peers.staging[p], inbox, parity, rank) + j, mine);
    }
  }
  for (u64 j = thread_index(); j < packs; j += grid_threads()) {
    // Not yet overwritten in place: only this thread writes these elements, below. Loaded
    // before the waits, so that its round trip overlaps theirs.
    Pack own = clear_sentinels<W>(load_padded_pack(in, count, j, in_aligned));
    typename PackOf<T>::U from[MAX_RANKS];
#pragma unroll
    for (int p = 0; p < MAX_RANKS; p++) {
      if (p == rank) {
        from[p].pack = own;
      } else if (p < nranks) {
        from[p].pack = sentinel_take<W>(sentinel_slot(peers.staging[rank], inbox, parity, p) + j, abort, p);
      }
    }
    typename PackOf<T>::U result;
#pragma unroll
    for (int k = 0; k < N; k++) result.v[k] = reduce_element<T, OP>(from, nranks, k);
    if (out_aligned && (j + 1) * N <= count) {
      ((Pack*)out)[j] = result.pack;
    } else {
#pragma unroll
      for (int k = 0; k < N; k++) {
        if (j * N + k < count) out[j * N + k] = result.v[k];
      }
    }
  }
  end_call(peers, rank, epoch);
}

// ---- all-gather and reduce-scatter ------------------------------------------------------------
//
// Every rank's chunk is `count` elements: all-gather's input, reduce-scatter's output. Where every
// rank's buffers can be reached (`Views`, as for the direct all-reduce: the ranks tell each
// other their buffers and all see whether every rank's are usable), all-gather pushes each
// rank's input straight into its place in every rank's output, and reduce-scatter has each rank
// read its chunk of every rank's input and reduce it, in rank order, into its output; they meet
// once at the end, so that no rank goes on (and reuses its buffers) while a peer still reads or
// writes them. Otherwise, as one-shot: every rank pushes into a slot of its own in the peers'
// staging (all-gather: its input to every rank; reduce-scatter: each rank's chunk of its input to
// that rank), they meet, and every rank copies out (all-gather) or reduces its slots in rank
// order (reduce-scatter). The host plans them only where nranks slots of a chunk, each rounded
// up to 16 bytes, fit in an area. Direct needs the chunk's places 16-aligned: the host says in
// `usable` whether the buffers and the chunk size allow it. Element i of a chunk is handled by
// the same thread in every phase on every rank (push_range, copy_out and reduce_range partition
// alike), so per-block barriers are enough, as in two-shot.

// Bytes of one rank's slot in a staging area.
__device__ __forceinline__ u64 chunk_slot(u64 count, u64 size) { return (count * size + 15) / 16 * 16; }

template <typename T, int OP>
__device__ void all_gather(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                           const volatile int* abort, const Views& views) {
  u32 epoch = begin_call(peers, rank);
  publish(peers, rank, nranks, views, epoch);
  __shared__ u64 ins[MAX_RANKS], outs[MAX_RANKS];
  char* dst[MAX_RANKS];
  if (gather_published(peers, rank, nranks, epoch, abort, ins, outs)) {
    // Starting with the next rank: the ranks' first stores go to different GPUs.
    for (int i = 0; i < nranks; i++) dst[i] = (char*)outs[(rank + 1 + i) % nranks] + rank * count * sizeof(T);
    push_range(in, count, 0, count, dst, nranks);
    barrier(peers, rank, nranks, BARRIER_START, epoch, abort);
  } else {
    u64 area = area_offset(half_bytes, epoch), slot = chunk_slot(count, sizeof(T));
    for (int i = 0; i < nranks; i++) dst[i] = peers.staging[(rank + 1 + i) % nranks] + area + rank * slot;
    push_range(in, count, 0, count, dst, nranks);
    barrier(peers, rank, nranks, BARRIER_START, epoch, abort);
    for (int p = 0; p < nranks; p++)
      copy_out(out + p * count, (const T*)(peers.staging[rank] + area + p * slot), count, 0, count);
  }
  end_call(peers, rank, epoch);
}

template <typename T, int OP>
__device__ void reduce_scatter(Peers peers, int rank, int nranks, const T* in, T* out, u64 count,
                               u64 half_bytes, const volatile int* abort, const Views& views) {
  u32 epoch = begin_call(peers, rank);
  publish(peers, rank, nranks, views, epoch);
  __shared__ u64 ins[MAX_RANKS], outs[MAX_RANKS];
  const char* src[MAX_RANKS];
  char* no_copies[1] = {0};
  if (gather_published(peers, rank, nranks, epoch, abort, ins, outs)) {
    for (int p = 0; p < nranks; p++) src[p] = (const char*)ins[p] + rank * count * sizeof(T);
    reduce_range<T, OP>(src, nranks, count, 0, count, out, no_copies, 0);
    barrier(peers, rank, nranks, BARRIER_START, epoch, abort);
  } else {
    u64 area = area_offset(half_bytes, epoch), slot = chunk_slot(count, sizeof(T));
    for (int i = 1; i <= nranks; i++) {
      int p = (rank + i) % nranks;
      char* dst = peers.staging[p] + area + rank * slot;
      push_range(in + p * count, count, 0, count, &dst, 1);
    }
    barrier(peers, rank, nranks, BARRIER_START, epoch, abort);
    for (int r = 0; r < nranks; r++) src[r] = peers.staging[rank] + area + r * slot;
    reduce_range<T, OP>(src, nranks, count, 0, count, out, no_copies, 0);
  }
  end_call(peers, rank, epoch);
}

// Every kernel starts here. The host launches them with programmatic stream serialization
// (cuda::launch): a kernel may then be scheduled while the one before it on the stream still
// runs, which hides part of the launch latency between back-to-back calls. `griddepcontrol.wait`
// holds every thread until the previous kernel has completed and its memory is visible, so
// nothing of ours (the epoch read included) runs earlier than without it. Our own dependents may
// be scheduled at once: they wait in the same way. Without the attribute both do nothing.
__device__ __forceinline__ void after_previous_kernel() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// M(NAME, T, OPNAME, OP) for each operation, in the host's order (types::Op).
#define FOR_EACH_OP(M, NAME, T)                                                                       \
  M(NAME, T, sum, OP_SUM)                                                                             \
  M(NAME, T, prod, OP_PROD)                                                                           \
  M(NAME, T, max, OP_MAX)                                                                             \
  M(NAME, T, min, OP_MIN)                                                                             \
  M(NAME, T, avg, OP_AVG)

#define KERNELS(NAME, T) FOR_EACH_OP(KERNEL, NAME, T)

#define KERNEL(NAME, T, OPNAME, OP)                                                                   \
  KERNEL_OF(ll_one_shot, ncclshim_ll_##NAME##_##OPNAME, T, OP)                                        \
  KERNEL_OF(one_shot, ncclshim_one_shot_##NAME##_##OPNAME, T, OP)                                     \
  KERNEL_OF(two_shot, ncclshim_two_shot_##NAME##_##OPNAME, T, OP)                                     \
  KERNEL_OF(direct, ncclshim_direct_##NAME##_##OPNAME, T, OP)                                         \
  KERNEL_OF(reduce_scatter, ncclshim_reduce_scatter_##NAME##_##OPNAME, T, OP)

// The all-gather kernels, for bytes only (the host gathers any type as bytes); one per op, as
// the host's table has (the op plays no part).
#define ALL_GATHER_KERNELS(NAME, T) FOR_EACH_OP(ALL_GATHER_KERNEL, NAME, T)
#define ALL_GATHER_KERNEL(NAME, T, OPNAME, OP) KERNEL_OF(all_gather, ncclshim_all_gather_##NAME##_##OPNAME, T, OP)

// The sentinel kernels, for the floating-point types only.
#define SENTINEL_KERNELS(NAME, T) FOR_EACH_OP(SENTINEL_KERNEL, NAME, T)
#define SENTINEL_KERNEL(NAME, T, OPNAME, OP) KERNEL_OF(sentinel, ncclshim_sentinel_##NAME##_##OPNAME, T, OP)

#define KERNEL_OF(ALGORITHM, SYMBOL, T, OP)                                                           \
  extern "C" __global__ void __launch_bounds__(MAX_THREADS)                                           \
      SYMBOL(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,       \
             const volatile int* abort, Views views) {                                                \
    after_previous_kernel();                                                                          \
    ALGORITHM<T, OP>(peers, rank, nranks, in, out, count, half_bytes, abort, views);                  \
  }

// NCCL_TYPES is defined by the host to the types wanted (all of them by default).
#ifndef NCCL_TYPES
#define NCCL_TYPES                                                                                    \
  KERNELS(i8, signed char)                                                                            \
  KERNELS(u8, unsigned char) ALL_GATHER_KERNELS(u8, unsigned char)                                   \
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
