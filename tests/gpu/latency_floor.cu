// The floor under a small call in a CUDA graph, between two GPUs linked by NVLink: what no
// all-reduce of a few bytes can take less than, measured on its own. One process drives GPUs 0
// and 1 (peer access both ways); every figure is µs per step, the median of BATCHES batches:
//   latency_floor [--steps 200]
// - launch:       a graph of STEPS empty kernels on one GPU, back to back (a graph's launch
//                 floor), and the same launched early (programmatic stream serialization, as the
//                 core's kernels are on sm_90: the next kernel starts while this one runs, and
//                 waits for it with griddepcontrol.wait);
// - round trip:   one kernel on each GPU passing a flag back and forth over NVLink STEPS times
//                 (a store into the peer's memory, a spin on one's own): the NVLink round trip
//                 with no launch at all; one way is half of it;
// - meeting:      a graph of STEPS kernels on each GPU, replayed on both at once, each kernel
//                 taking the next epoch from a counter in its own GPU's memory, storing it into
//                 the peer's flag and waiting for the peer's: one exchange with the peer per
//                 kernel, which is all a small all-reduce needs (its data can ride with the flag),
//                 plain and launched early. This is the floor for a graph-captured small call;
// - toward a kernel of the core's shape, one thing added at a time, each launched early: the
//                 previous kernel waited for before the next one may start (as the core's
//                 kernels do: griddepcontrol.wait, then launch_dependents), 64 threads a block
//                 (the sentinel kernel's block at small sizes), 400 bytes of parameters (its
//                 argument struct), then 16 bytes of data in place of the flag, sent and waited
//                 for as the sentinel kernel does (an inbox word that still holds the sentinel,
//                 every bit set, has not arrived; the receiver sets it back), with the input
//                 loaded from and the sum stored into GPU memory; that kernel with its
//                 parameters read as the core's are (through tables indexed by rank), and with
//                 its path jumping over 24 KiB of code it does not run, as a long kernel's path
//                 runs past the cases it does not take (the instruction cache then misses).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_check.h"

#define BATCHES 21
#define WARMUP 3

typedef unsigned long long u64;

// Programmatic launch exists from sm_90 on (main runs nothing on older GPUs).
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__global__ void empty_kernel(int early) {
  if (early) {
    launch_dependents();
    wait_for_previous();
  }
}

// The starter stores i into the peer's flag and waits for i back; the other waits, then answers.
__global__ void ping_pong(volatile u64* mine, volatile u64* peer, u64 base, int steps, int starter,
                          u64* took_ns) {
  u64 start = 0;
  for (int i = 1; i <= steps; i++) {
    // The first tenth warms up (and absorbs when the peer's kernel started).
    if (i == steps / 10 + 1) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    u64 e = base + i;
    if (starter) {
      *peer = e;
      while (*mine < e) {
      }
    } else {
      while (*mine < e) {
      }
      *peer = e;
    }
  }
  u64 end;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(end));
  if (starter) *took_ns = end - start;
}

// One exchange with the peer: the next epoch from this GPU's counter into the peer's flag, then
// this GPU's flag waited for.
__global__ void meet(u64* counter, volatile u64* mine, volatile u64* peer, int early) {
  if (early) {
    launch_dependents();
    wait_for_previous();
  }
  u64 e = *counter + 1;
  *counter = e;
  *peer = e;
  while (*mine < e) {
  }
}

// One step of the kernels of the core's shape: `data` 0, the flag of `meet`; 1, 16 bytes through
// the inboxes (two, by epoch parity) as the sentinel kernel sends them.
struct Step {
  u64* counter;
  volatile u64* mine;
  volatile u64* peer;
  const uint4* in;
  uint4* out;
  uint4* inbox_mine;
  uint4* inbox_peer;
  int data;
};
template <int BYTES> struct Padded {
  Step step;
  char pad[BYTES - sizeof(Step)];
};

#define SENTINEL 0xffffffffu

// Sends `own` into the peer's inbox `to` and waits for the peer's in `mine`, as the sentinel
// kernel does: a word that still holds the sentinel has not arrived; set back once read.
__device__ __forceinline__ uint4 exchange_16(uint4 own, uint4* to, uint4* mine) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(to), "r"(own.x), "r"(own.y), "r"(own.z),
               "r"(own.w)
               : "memory");
  uint4 got;
  do {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(got.x), "=r"(got.y), "=r"(got.z), "=r"(got.w)
                 : "l"(mine)
                 : "memory");
  } while (got.x == SENTINEL || got.y == SENTINEL || got.z == SENTINEL || got.w == SENTINEL);
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};" ::"l"(mine), "r"(SENTINEL) : "memory");
  return got;
}

template <int BYTES, bool WAIT_FIRST>
__global__ void shaped(Padded<BYTES> p) {
  if (WAIT_FIRST) {
    wait_for_previous();
    launch_dependents();
  } else {
    launch_dependents();
    wait_for_previous();
  }
  if (threadIdx.x != 0) return;  // the others only take their place in the block
  const Step& s = p.step;
  if (!s.data) {
    u64 e = *s.counter + 1;
    *s.counter = e;
    *s.peer = e;
    while (*s.mine < e) {
    }
    return;
  }
  uint4 own = *s.in;
  u64 e = *s.counter + 1;
  int parity = (int)(e & 1);
  uint4 got = exchange_16(own, s.inbox_peer + parity, s.inbox_mine + parity);
  *s.out = make_uint4(own.x + got.x, own.y + got.y, own.z + got.z, own.w + got.w);
  *s.counter = e;
}

// The data step again, with its parameters laid out and read as the core's kernels read theirs:
// pointers to every rank's memory in tables indexed by rank at run time, the rank and the inbox's
// offset from other lines of the parameters, 400 bytes in all.
struct CoreLike {
  uint4* inboxes[8];  // every rank's inboxes, by rank
  u64* counters[8];   // every rank's epoch counter, by rank
  u64 inbox_offset;   // in uint4s, from an inbox's start
  u64 unused[5];
  const uint4* in;
  uint4* out;
  int rank;
  int nranks;
  int ncalls;
  int unused2;
  char pad[400 - 8 * 8 * 2 - 8 * 6 - 8 * 2 - 4 * 4];
};
static_assert(sizeof(CoreLike) == 400, "CoreLike is 400 bytes");

__global__ void core_like(CoreLike p) {
  wait_for_previous();
  launch_dependents();
  if (threadIdx.x != 0) return;  // the others only take their place in the block
  const int rank = p.rank, peer = (p.rank + 1) % p.nranks;
  uint4 own = *p.in;
  u64* counter = p.counters[rank];
  u64 e = *counter + 1;
  int parity = (int)(e & 1);
  uint4* to = p.inboxes[peer] + p.inbox_offset + parity;
  uint4* mine = p.inboxes[rank] + p.inbox_offset + parity;
  uint4 got = exchange_16(own, to, mine);
  *p.out = make_uint4(own.x + got.x, own.y + got.y, own.z + got.z, own.w + got.w);
  *counter = e;
}

// A block of 32 instructions the path jumps over (512 bytes of code; `skip` is never 0), and
// eight of them, labelled by `tag`.
#define ADD1 "add.u32 %0, %0, %2; "
#define ADD8 ADD1 ADD1 ADD1 ADD1 ADD1 ADD1 ADD1 ADD1
#define SKIPPED(label) \
  asm volatile("{ .reg .pred p; setp.ne.u32 p, %1, 0; @p bra skip_" #label "; " ADD8 ADD8 ADD8 ADD8 "skip_" #label ": }" \
               : "+r"(x)                                                                                 \
               : "r"(skip), "r"(x));
#define SKIPPED8(tag)                                                                    \
  SKIPPED(tag##0) SKIPPED(tag##1) SKIPPED(tag##2) SKIPPED(tag##3) SKIPPED(tag##4) SKIPPED(tag##5) \
  SKIPPED(tag##6) SKIPPED(tag##7)

// The data step whose code is spread out as the core's kernels' is: between reading the epoch
// and sending, the path jumps over 48 blocks of code it does not run (512 bytes each), as a
// kernel's one path runs past the code of the cases it does not take. The instruction cache
// then misses where the small kernels above never do.
__global__ void spread(Padded<80> p, unsigned skip) {
  wait_for_previous();
  launch_dependents();
  if (threadIdx.x != 0) return;  // the others only take their place in the block
  const Step& s = p.step;
  uint4 own = *s.in;
  u64 e = *s.counter + 1;
  unsigned x = (unsigned)e;
  SKIPPED8(A) SKIPPED8(B) SKIPPED8(C) SKIPPED8(D) SKIPPED8(E) SKIPPED8(F)
  int parity = (int)(x & 1);
  uint4 got = exchange_16(own, s.inbox_peer + parity, s.inbox_mine + parity);
  *s.out = make_uint4(own.x + got.x, own.y + got.y, own.z + got.z, own.w + got.w);
  *s.counter = e;
}

struct Gpu {
  int device;
  cudaStream_t stream;
  cudaEvent_t begin, end;
  u64* flags;  // [0] this GPU's flag (the peer stores into it), [1] its epoch counter, [2] a result
  uint4* data;  // [0] input, [1] output, [2..3] inbox (by epoch parity): every bit set when empty
};

// A kernel launch of `threads` threads on `g`'s stream, early where asked (captured as a
// programmatic edge).
template <typename... Params, typename... Args>
static void launch_threads(const Gpu& g, bool early, int threads, void (*kernel)(Params...), Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(threads);
  config.stream = g.stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = early ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

// A one-thread launch: a flag is all these kernels move.
template <typename... Params, typename... Args>
static void launch(const Gpu& g, bool early, void (*kernel)(Params...), Args... args) {
  launch_threads(g, early, 1, kernel, args...);
}


// A graph of `steps` launches made by `enqueue(gpu)` on each of `gpus`.
template <typename F>
static std::vector<cudaGraphExec_t> capture(std::vector<Gpu>& gpus, int steps, F enqueue) {
  std::vector<cudaGraphExec_t> execs;
  for (Gpu& g : gpus) {
    CUDA_CHECK(cudaSetDevice(g.device));
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
    for (int s = 0; s < steps; s++) enqueue(g);
    CUDA_CHECK(cudaStreamEndCapture(g.stream, &graph));
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    execs.push_back(exec);
  }
  return execs;
}

// µs per step of replaying `execs` (one per GPU, all at once): the slowest GPU's replay / steps,
// the median of BATCHES replays after WARMUP.
static double replay_us(std::vector<Gpu>& gpus, std::vector<cudaGraphExec_t>& execs, int steps) {
  std::vector<double> times;
  for (int b = 0; b < WARMUP + BATCHES; b++) {
    for (size_t i = 0; i < gpus.size(); i++) {
      CUDA_CHECK(cudaSetDevice(gpus[i].device));
      CUDA_CHECK(cudaEventRecord(gpus[i].begin, gpus[i].stream));
      CUDA_CHECK(cudaGraphLaunch(execs[i], gpus[i].stream));
      CUDA_CHECK(cudaEventRecord(gpus[i].end, gpus[i].stream));
    }
    float slowest = 0;
    for (Gpu& g : gpus) {
      CUDA_CHECK(cudaEventSynchronize(g.end));
      float ms;
      CUDA_CHECK(cudaEventElapsedTime(&ms, g.begin, g.end));
      slowest = std::max(slowest, ms);
    }
    if (b >= WARMUP) times.push_back(slowest * 1000.0 / steps);
  }
  for (size_t i = 0; i < gpus.size(); i++) {
    CUDA_CHECK(cudaSetDevice(gpus[i].device));
    CUDA_CHECK(cudaGraphExecDestroy(execs[i]));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The step of a kernel of the core's shape, for `g` (`data`: 16 bytes through the inboxes).
static Step step_of(std::vector<Gpu>& gpus, const Gpu& g, int data) {
  const Gpu& peer = gpus[1 - g.device];
  return Step{g.flags + 1, (volatile u64*)g.flags, (volatile u64*)peer.flags, g.data, g.data + 1, g.data + 2,
              peer.data + 2, data};
}

// Its graph of `steps` kernels on each GPU, replayed: µs per step.
template <int BYTES>
static double shaped_us(std::vector<Gpu>& gpus, int steps, bool wait_first, int threads, int data) {
  auto execs = capture(gpus, steps, [&](Gpu& g) {
    Padded<BYTES> p = {};
    p.step = step_of(gpus, g, data);
    if (wait_first) {
      launch_threads(g, true, threads, shaped<BYTES, true>, p);
    } else {
      launch_threads(g, true, threads, shaped<BYTES, false>, p);
    }
  });
  return replay_us(gpus, execs, steps);
}

// The core-like step's graph on each GPU, replayed: µs per step.
static double core_like_us(std::vector<Gpu>& gpus, int steps) {
  CoreLike p = {};
  for (Gpu& g : gpus) {
    p.inboxes[g.device] = g.data;
    p.counters[g.device] = g.flags + 1;
  }
  p.inbox_offset = 2;
  p.nranks = 2;
  p.ncalls = 1;
  auto execs = capture(gpus, steps, [&](Gpu& g) {
    CoreLike mine = p;
    mine.rank = g.device;
    mine.in = g.data;
    mine.out = g.data + 1;
    launch_threads(g, true, 64, core_like, mine);
  });
  return replay_us(gpus, execs, steps);
}

// The spread-out step's graph on each GPU, replayed: µs per step.
static double spread_us(std::vector<Gpu>& gpus, int steps) {
  auto execs = capture(gpus, steps, [&](Gpu& g) {
    Padded<80> p = {};
    p.step = step_of(gpus, g, 1);
    launch_threads(g, true, 64, spread, p, 1u);
  });
  return replay_us(gpus, execs, steps);
}

int main(int argc, char** argv) {
  int steps = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
  }
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count < 2 || steps < 10) {
    fprintf(stderr, "latency_floor needs 2 GPUs and at least 10 steps\n");
    return 2;
  }
  std::vector<Gpu> gpus(2);
  for (int d = 0; d < 2; d++) {
    Gpu& g = gpus[d];
    g.device = d;
    CUDA_CHECK(cudaSetDevice(d));
    CUDA_CHECK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&g.begin));
    CUDA_CHECK(cudaEventCreate(&g.end));
    CUDA_CHECK(cudaMalloc(&g.flags, 3 * sizeof(u64)));
    CUDA_CHECK(cudaMemset(g.flags, 0, 3 * sizeof(u64)));
    CUDA_CHECK(cudaMalloc(&g.data, 4 * sizeof(uint4)));
    CUDA_CHECK(cudaMemset(g.data, 0x01, 2 * sizeof(uint4)));  // no word of the input is the sentinel
    CUDA_CHECK(cudaMemset(g.data + 2, 0xff, 2 * sizeof(uint4)));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    printf("# latency_floor: %s is sm_%d%d; the floor is measured on sm_90 or newer\n", prop.name, prop.major,
           prop.minor);
    return 0;
  }
  printf("# latency_floor: 2 x %s, %d steps, median of %d batches\n", prop.name, steps, BATCHES);
  printf("%-58s %8s\n", "# what", "us/step");

  std::vector<Gpu> one(gpus.begin(), gpus.begin() + 1);
  for (int early = 0; early < 2; early++) {
    auto execs = capture(one, steps, [&](Gpu& g) { launch(g, early, empty_kernel, early); });
    printf("%-58s %8.3f\n", early ? "launch: empty kernel in a graph, launched early"
                                  : "launch: empty kernel in a graph",
           replay_us(one, execs, steps));
  }

  // The flag round trip, no launch: both kernels run at once (the non-starter first).
  std::vector<double> trips;
  for (int b = 0; b < WARMUP + BATCHES; b++) {
    u64 base = (u64)b * (steps + 1) + (1ull << 40);
    for (int d = 1; d >= 0; d--) {
      Gpu& g = gpus[d];
      CUDA_CHECK(cudaSetDevice(d));
      launch(g, false, ping_pong, (volatile u64*)g.flags, (volatile u64*)gpus[1 - d].flags, base,
             steps, d == 0 ? 1 : 0, g.flags + 2);
    }
    for (Gpu& g : gpus) {
      CUDA_CHECK(cudaSetDevice(g.device));
      CUDA_CHECK(cudaStreamSynchronize(g.stream));
    }
    u64 ns;
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaMemcpy(&ns, gpus[0].flags + 2, sizeof ns, cudaMemcpyDeviceToHost));
    if (b >= WARMUP) trips.push_back(ns / 1000.0 / (steps - steps / 10));
  }
  std::sort(trips.begin(), trips.end());
  double trip = trips[trips.size() / 2];
  printf("%-58s %8.3f\n", "round trip: NVLink flag there and back, no launch", trip);
  printf("%-58s %8.3f\n", "one way: half the round trip", trip / 2);

  // The meetings count epochs from where the round trips left the flags.
  for (Gpu& g : gpus) {
    CUDA_CHECK(cudaSetDevice(g.device));
    CUDA_CHECK(cudaMemset(g.flags, 0, 3 * sizeof(u64)));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  for (int early = 0; early < 2; early++) {
    auto execs = capture(gpus, steps, [&](Gpu& g) {
      launch(g, early, meet, g.flags + 1, (volatile u64*)g.flags,
             (volatile u64*)gpus[1 - g.device].flags, early);
    });
    printf("%-58s %8.3f\n", early ? "meeting: one exchange per kernel in a graph, launched early"
                                  : "meeting: one exchange per kernel in a graph",
           replay_us(gpus, execs, steps));
  }

  // Toward the core's kernel, one thing at a time (every one launched early).
  printf("%-58s %8.3f\n", "shaped: the meeting, launched early (as above)",
         shaped_us<80>(gpus, steps, false, 1, 0));
  printf("%-58s %8.3f\n", "shaped: + the previous kernel waited for first",
         shaped_us<80>(gpus, steps, true, 1, 0));
  printf("%-58s %8.3f\n", "shaped: + 64 threads", shaped_us<80>(gpus, steps, true, 64, 0));
  printf("%-58s %8.3f\n", "shaped: + 400 bytes of parameters", shaped_us<400>(gpus, steps, true, 64, 0));
  printf("%-58s %8.3f\n", "shaped: + 16 bytes of data, sentinel-style, memory in/out",
         shaped_us<400>(gpus, steps, true, 64, 1));
  printf("%-58s %8.3f\n", "shaped: the same, the next kernel started first",
         shaped_us<400>(gpus, steps, false, 64, 1));
  printf("%-58s %8.3f\n", "shaped: data, parameters read as the core's kernels do",
         core_like_us(gpus, steps));
  printf("%-58s %8.3f\n", "shaped: data, its path jumping over 24 KiB of code",
         spread_us(gpus, steps));
  uint4 out;
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaMemcpy(&out, gpus[0].data + 1, sizeof out, cudaMemcpyDeviceToHost));
  if (out.x != 0x02020202u) {
    fprintf(stderr, "latency_floor: the data steps summed %08x, not 02020202\n", out.x);
    return 1;
  }
  return 0;
}
