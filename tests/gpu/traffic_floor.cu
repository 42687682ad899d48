// The floor under any all-reduce on these GPUs with NVLink multicast off: the time its NVLink
// traffic alone takes. Without reduction in the switch, an all-reduce of S bytes over n GPUs
// moves at least 2(n-1)/n * S bytes out of and into every GPU (nccl-tests' bus bandwidth counts
// exactly that). This program moves exactly those bytes on every GPU at once, with nothing else
// (no staging; no signal between GPUs but in the synced ways), in several ways and block
// shapes, and times the all-reduce of S bytes (float, sum) of the real NCCL and of the shim on
// the same GPUs in the same run:
//   traffic_floor --real DIR/libnccl.so.2 [--shim PATH] [--ngpus N] [--sizes 8M,16M,32M]
// Ways (the best block shape of each is printed):
//   pull       every GPU loads its share from every peer (loads over NVLink), stores it locally
//   push       every GPU loads its share locally and stores it into every peer
//   pull+push  the direct two-shot's traffic: each GPU loads chunk g of every GPU's input,
//              combines them and stores the result into chunk g of every GPU's output
//   ce-pull    the copy engines, each GPU pulling from every peer (one stream per peer)
//   ce-push    the copy engines, each GPU pushing to every peer
//   push+ce    both at once: the SMs store the first part of each peer's bytes (half, 3/4 or 7/8,
//              in push's best block shape), the copy engines push the rest
// The floor is the fastest of these. Then what no all-reduce can leave out, the meetings of the
// GPUs (block by block, at most one block per SM), with the bytes moved as above:
//   pull+push,synced  meets at the start and at the end: the least for the direct two-shot
//   push,synced       meets at the start, halfway and at the end: the least for an all-reduce
//                     that only stores over NVLink (reduce-scatter, then all-gather)
// Timing: every GPU's stream first runs a gate kernel that spins until the host has enqueued
// every GPU's work, so that all GPUs start together; a batch is R back-to-back runs between two
// events; the time of a run is the slowest GPU's batch / R, the median of BATCHES batches.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_check.h"
#include "nccl_lib.h"

#define MAX_GPUS 8
#define BATCHES 7
#define BATCH_US 2000.0

typedef unsigned long long u64;

// The ways of moving the bytes (up to PUSH_CE), then those with the meetings of an all-reduce.
enum Way { PULL, PUSH, PULL_PUSH, CE_PULL, CE_PUSH, PUSH_CE, PULL_PUSH_SYNCED, PUSH_SYNCED, WAYS };
static const char* WAY_NAMES[WAYS] = {"pull",    "push",    "pull+push",        "ce-pull",
                                      "ce-push", "push+ce", "pull+push,synced", "push,synced"};
#define FLAG_BLOCKS 512  // the most blocks of a synced way

struct Buffers {
  char* src[MAX_GPUS];
  char* dst[MAX_GPUS];
  unsigned* flags[MAX_GPUS];  // [3 meetings][FLAG_BLOCKS][MAX_GPUS] arrival epochs, zeroed
};

// Spins until the host's ticket reaches `ticket`.
__global__ void gate(const volatile unsigned* host_ticket, unsigned ticket) {
  while ((int)(*host_ticket - ticket) < 0) {
  }
}

// Block `blockIdx.x` of every GPU meets block `blockIdx.x` of every other at barrier `which` of
// run `epoch`, as the core's kernels do (a release store into each peer's slot for us, then
// acquire loads on ours; see shim/src/core/device/device.cuh).
__device__ __forceinline__ void meet(const Buffers& b, int me, int n, int which, unsigned epoch) {
  __syncthreads();
  int k = threadIdx.x;
  if (k < n && k != me) {
    unsigned* theirs = b.flags[k] + ((u64)which * FLAG_BLOCKS + blockIdx.x) * MAX_GPUS + me;
    const unsigned* ours = b.flags[me] + ((u64)which * FLAG_BLOCKS + blockIdx.x) * MAX_GPUS + k;
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(theirs), "r"(epoch) : "memory");
    unsigned seen;
    do {
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(ours) : "memory");
    } while ((int)(seen - epoch) < 0);
  }
  __syncthreads();
}

// Bytes [lo, hi) (multiples of 16) of each peer's chunk, chunks `chunk` bytes apart, the way
// `way` (PULL, PUSH or PULL_PUSH); NP = n - 1 peers, U packs of 16 bytes in flight per peer and
// thread.
template <int NP, int U>
__device__ __forceinline__ void move_range(const Buffers& b, int me, u64 chunk, u64 lo, u64 hi, int way) {
  const int n = NP + 1;
  const u64 packs = hi / 16, G = (u64)gridDim.x * blockDim.x;
  const char* from[n];
  char* to[n];
  for (int k = 0; k < n; k++) {
    int q = (me + 1 + k) % n;  // the next GPU first: the GPUs' first accesses go to different peers
    if (way == PULL) from[k] = b.src[q] + me * chunk, to[k] = b.dst[me] + q * chunk;
    if (way == PUSH) from[k] = b.src[me] + q * chunk, to[k] = b.dst[q] + me * chunk;
    if (way == PULL_PUSH) from[k] = b.src[q] + me * chunk, to[k] = b.dst[q] + me * chunk;
  }
  // pull and push skip k = NP (the GPU itself); pull+push reads and writes its own chunk too.
  const int count = way == PULL_PUSH ? n : NP;
  for (u64 j = lo / 16 + (u64)blockIdx.x * blockDim.x + threadIdx.x; j < packs; j += U * G) {
    uint4 v[n][U];
#pragma unroll
    for (int k = 0; k < n; k++)
#pragma unroll
      for (int u = 0; u < U; u++)
        if (k < count && j + u * G < packs) v[k][u] = ((const uint4*)from[k])[j + u * G];
    if (way == PULL_PUSH) {
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int k = 1; k < n; k++) {
          v[0][u].x += v[k][u].x, v[0][u].y += v[k][u].y, v[0][u].z += v[k][u].z, v[0][u].w += v[k][u].w;
        }
#pragma unroll
      for (int k = 1; k < n; k++)
#pragma unroll
        for (int u = 0; u < U; u++) v[k][u] = v[0][u];
    }
#pragma unroll
    for (int k = 0; k < n; k++)
#pragma unroll
      for (int u = 0; u < U; u++)
        if (k < count && j + u * G < packs) ((uint4*)to[k])[j + u * G] = v[k][u];
  }
}

// One GPU's share of a way: the first `bytes` of each peer's chunk. The synced ways add the
// meetings an all-reduce cannot do without: pull+push, synced meets at the start (a GPU's buffers
// may be written only once its stream has reached the call) and at the end (its output is whole
// only once every peer has written); push, synced also between its two halves, where an
// all-reduce that only stores reduces what it was sent.
template <int NP, int U>
__global__ void __launch_bounds__(512) move(Buffers b, int me, u64 chunk, u64 bytes, int way, unsigned epoch) {
  const int n = NP + 1;
  if (way == PULL_PUSH_SYNCED || way == PUSH_SYNCED) meet(b, me, n, 0, epoch);
  if (way == PUSH_SYNCED) {
    const u64 half = bytes / 32 * 16;
    move_range<NP, U>(b, me, chunk, 0, half, PUSH);
    meet(b, me, n, 1, epoch);
    move_range<NP, U>(b, me, chunk, half, bytes, PUSH);
  } else {
    move_range<NP, U>(b, me, chunk, 0, bytes, way == PULL_PUSH_SYNCED ? PULL_PUSH : way);
  }
  if (way == PULL_PUSH_SYNCED || way == PUSH_SYNCED) meet(b, me, n, 2, epoch);
}

typedef void (*MoveKernel)(Buffers, int, u64, u64, int, unsigned);
template <int NP>
static MoveKernel move_of(int unroll) {
  return unroll == 1 ? move<NP, 1> : unroll == 2 ? move<NP, 2> : move<NP, 4>;
}
static MoveKernel move_kernel(int n, int unroll) {
  switch (n) {
    case 2: return move_of<1>(unroll);
    case 3: return move_of<2>(unroll);
    case 4: return move_of<3>(unroll);
    case 8: return unroll == 1 ? move<7, 1> : nullptr;  // more in flight spills
    default: return nullptr;
  }
}

static int n;
static Buffers buffers;
static cudaStream_t streams[MAX_GPUS], peer_streams[MAX_GPUS][MAX_GPUS];
static cudaEvent_t started[MAX_GPUS], stopped[MAX_GPUS], go[MAX_GPUS], peer_done[MAX_GPUS][MAX_GPUS];
static volatile unsigned* host_ticket;
static unsigned* device_ticket;
static unsigned tickets;
static unsigned epochs;  // the synced ways' runs, the same on every GPU

// The time of one run, us (see the top of the file): `enqueue(r)` enqueues run r on every GPU.
template <typename F>
static double time_us(int runs, F enqueue) {
  std::vector<double> batches;
  for (int b = 0; b < BATCHES; b++) {
    tickets++;
    for (int g = 0; g < n; g++) {
      CUDA_CHECK(cudaSetDevice(g));
      gate<<<1, 1, 0, streams[g]>>>(device_ticket, tickets);
      CUDA_CHECK(cudaEventRecord(started[g], streams[g]));
    }
    for (int r = 0; r < runs; r++) enqueue(r);
    for (int g = 0; g < n; g++) {
      CUDA_CHECK(cudaSetDevice(g));
      CUDA_CHECK(cudaEventRecord(stopped[g], streams[g]));
    }
    __atomic_store_n(host_ticket, tickets, __ATOMIC_RELEASE);
    double slowest = 0;
    for (int g = 0; g < n; g++) {
      CUDA_CHECK(cudaEventSynchronize(stopped[g]));
      float ms;
      CUDA_CHECK(cudaEventElapsedTime(&ms, started[g], stopped[g]));
      slowest = std::max(slowest, ms * 1e3 / runs);
    }
    batches.push_back(slowest);
  }
  std::sort(batches.begin(), batches.end());
  return batches[BATCHES / 2];
}

// On GPU g (the current one), bytes [from, chunk) of each peer's chunk by the copy engines, a
// stream per peer, started after what g's stream holds so far; pulled into g or pushed from it.
static void start_copy_engines(int g, u64 chunk, u64 from, bool pull) {
  CUDA_CHECK(cudaEventRecord(go[g], streams[g]));
  for (int q = 0; q < n; q++) {
    if (q == g) continue;
    cudaStream_t stream = peer_streams[g][q];
    CUDA_CHECK(cudaStreamWaitEvent(stream, go[g], 0));
    if (pull)
      CUDA_CHECK(cudaMemcpyPeerAsync(buffers.dst[g] + q * chunk + from, g, buffers.src[q] + g * chunk + from, q,
                                     chunk - from, stream));
    else
      CUDA_CHECK(cudaMemcpyPeerAsync(buffers.dst[q] + g * chunk + from, q, buffers.src[g] + q * chunk + from, g,
                                     chunk - from, stream));
    CUDA_CHECK(cudaEventRecord(peer_done[g][q], stream));
  }
}

// GPU g's stream waits for the copies start_copy_engines started.
static void join_copy_engines(int g) {
  for (int q = 0; q < n; q++)
    if (q != g) CUDA_CHECK(cudaStreamWaitEvent(streams[g], peer_done[g][q], 0));
}

// Runs in a batch: about BATCH_US of work at 300 GB/s, at least 3, at most 100 (the gate holds
// every GPU's queue until the host has enqueued them all).
static int runs_for(double bytes_per_direction) {
  double us = bytes_per_direction / 300e3 + 5;
  return std::max(3, std::min(100, (int)(BATCH_US / us)));
}

struct Shape {
  int blocks, threads, unroll;
};

// One all-reduce on every GPU, from the one thread in a group (as nccl-tests -g N).
static void all_reduce_on_all(const Lib& lib, u64 bytes) {
  NCCL_CALL(&lib, GroupStart());
  for (int g = 0; g < n; g++)
    NCCL_CALL(&lib,
              AllReduce(buffers.src[g], buffers.dst[g], bytes / 4, ncclFloat, ncclSum, lib.comms[g], streams[g]));
  NCCL_CALL(&lib, GroupEnd());
}

static double time_all_reduce(const Lib& lib, u64 bytes, int runs) {
  // Once outside the gate: a first call may wait on set-up work (NCCL's connections).
  all_reduce_on_all(lib, bytes);
  for (int g = 0; g < n; g++) CUDA_CHECK(cudaStreamSynchronize(streams[g]));
  return time_us(runs, [&](int) { all_reduce_on_all(lib, bytes); });
}

int main(int argc, char** argv) {
  const char *real = NULL, *shim = NULL, *sizes_arg = "1M,4M,8M,16M,32M,64M,256M";
  int want = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--real")) real = argv[i + 1];
    if (!strcmp(argv[i], "--shim")) shim = argv[i + 1];
    if (!strcmp(argv[i], "--ngpus")) want = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--sizes")) sizes_arg = argv[i + 1];
  }
  if (!real) {
    fprintf(stderr, "usage: traffic_floor --real DIR/libnccl.so.2 [--shim PATH] [--ngpus N] [--sizes 8M,...]\n");
    return 2;
  }
  std::vector<u64> sizes;
  for (const char* s = sizes_arg; *s;) {
    const char* start = s;
    sizes.push_back(parse_bytes(start, &s));
    if (s == start || sizes.back() == 0) {
      fprintf(stderr, "traffic_floor: bad --sizes %s\n", sizes_arg);
      return 2;
    }
    if (*s == ',') s++;
  }
  CUDA_CHECK(cudaGetDeviceCount(&n));
  if (want > 0 && want < n) n = want;
  if (!move_kernel(n, 1)) {
    fprintf(stderr, "traffic_floor: %d GPUs not supported (2, 3, 4 or 8)\n", n);
    return 2;
  }
  const u64 largest = *std::max_element(sizes.begin(), sizes.end());
  CUDA_CHECK(cudaHostAlloc((void**)&host_ticket, 4, cudaHostAllocMapped | cudaHostAllocPortable));
  *host_ticket = 0;
  CUDA_CHECK(cudaHostGetDevicePointer((void**)&device_ticket, (void*)host_ticket, 0));
  int sms = 0;
  for (int g = 0; g < n; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    for (int q = 0; q < n; q++)
      if (q != g) CUDA_CHECK(cudaDeviceEnablePeerAccess(q, 0));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g));
    // pull and push move 2S/n bytes per peer: 2S in all.
    CUDA_CHECK(cudaMalloc(&buffers.src[g], 2 * largest));
    CUDA_CHECK(cudaMalloc(&buffers.dst[g], 2 * largest));
    CUDA_CHECK(cudaMemset(buffers.src[g], g + 1, 2 * largest));
    const size_t flag_bytes = 3 * FLAG_BLOCKS * MAX_GPUS * sizeof(unsigned);
    CUDA_CHECK(cudaMalloc(&buffers.flags[g], flag_bytes));
    CUDA_CHECK(cudaMemset(buffers.flags[g], 0, flag_bytes));
    CUDA_CHECK(cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&started[g]));
    CUDA_CHECK(cudaEventCreate(&stopped[g]));
    CUDA_CHECK(cudaEventCreateWithFlags(&go[g], cudaEventDisableTiming));
    for (int q = 0; q < n; q++) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&peer_streams[g][q], cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&peer_done[g][q], cudaEventDisableTiming));
    }
  }
  for (int g = 0; g < n; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaDeviceSynchronize());
  }

  setenv("NCCLSHIM_REAL_NCCL", real, 0);
  Lib nccl = {}, ours = {};
  load(&nccl, "nccl", real);
  NCCL_CALL(&nccl, CommInitAll(nccl.comms, n, NULL));
  if (shim) {
    load(&ours, "ours", shim);
    NCCL_CALL(&ours, CommInitAll(ours.comms, n, NULL));
  }

  std::vector<Shape> shapes;
  for (int threads : {256, 512})
    for (int blocks : {16, 32, 64, 128, sms, 2 * sms})
      for (int unroll : {1, 2, 4})
        if (move_kernel(n, unroll) && blocks * threads <= 2 * sms * 512) shapes.push_back({blocks, threads, unroll});

  printf("# %d GPUs (%d SMs each): an all-reduce's NVLink traffic alone, 2(n-1)/n * S bytes each way per GPU\n", n,
         sms);
  printf("# time in us (GB/s each way per GPU); floor = the fastest way without meetings; goal = 0.8 x NCCL\n");
  printf("%-8s", "size");
  for (int w = 0; w < WAYS; w++) printf(" %20s", WAY_NAMES[w]);
  printf(" %9s %9s %9s %9s %9s %9s\n", "floor", "NCCL", "goal", "floor/NC", "ours", "ours/NC");
  for (u64 size : sizes) {
    size = size / (16 * n) * (16 * n);
    const double per_direction = 2.0 * (n - 1) / n * size;
    const int runs = runs_for(per_direction);
    double best[WAYS];
    Shape best_shape[WAYS];
    for (int w : {PULL, PUSH, PULL_PUSH, PULL_PUSH_SYNCED, PUSH_SYNCED}) {
      // pull and push move 2S/n per peer; pull+push S/n each way, in both directions.
      const bool both = w == PULL_PUSH || w == PULL_PUSH_SYNCED, synced = w >= PULL_PUSH_SYNCED;
      const u64 chunk = (both ? size : 2 * size) / n;
      best[w] = 1e30;
      for (const Shape& s : shapes) {
        // Blocks that meet must all be running: at most one per SM (a block of 512 threads may
        // take every register of one).
        if (synced && (s.blocks > sms || s.blocks > FLAG_BLOCKS)) continue;
        MoveKernel kernel = move_kernel(n, s.unroll);
        double t = time_us(runs, [&](int) {
          epochs++;
          for (int g = 0; g < n; g++) {
            CUDA_CHECK(cudaSetDevice(g));
            kernel<<<s.blocks, s.threads, 0, streams[g]>>>(buffers, g, chunk, chunk, w, epochs);
          }
        });
        CUDA_CHECK(cudaGetLastError());
        if (t < best[w]) best[w] = t, best_shape[w] = s;
      }
    }
    for (int w = CE_PULL; w <= CE_PUSH; w++) {
      const u64 chunk = 2 * size / n;
      best[w] = time_us(runs, [&](int) {
        for (int g = 0; g < n; g++) {
          CUDA_CHECK(cudaSetDevice(g));
          start_copy_engines(g, chunk, 0, w == CE_PULL);
          join_copy_engines(g);
        }
      });
    }
    // push+ce: the SMs' part in push's best shape, the copy engines' started with it.
    double best_part = 0;
    best[PUSH_CE] = 1e30;
    for (double part : {0.5, 0.75, 0.875}) {
      const u64 chunk = 2 * size / n, sm_bytes = (u64)(chunk * part) / 16 * 16;
      const Shape& s = best_shape[PUSH];
      MoveKernel kernel = move_kernel(n, s.unroll);
      double t = time_us(runs, [&](int) {
        for (int g = 0; g < n; g++) {
          CUDA_CHECK(cudaSetDevice(g));
          start_copy_engines(g, chunk, sm_bytes, false);
          kernel<<<s.blocks, s.threads, 0, streams[g]>>>(buffers, g, chunk, sm_bytes, PUSH, 0);
          join_copy_engines(g);
        }
      });
      if (t < best[PUSH_CE]) best[PUSH_CE] = t, best_part = part;
    }
    double floor = *std::min_element(best, best + PUSH_CE + 1);
    double t_nccl = time_all_reduce(nccl, size, runs);
    char name[32];
    snprintf(name, sizeof name, "%lluM", size >> 20);
    if (size < (1 << 20)) snprintf(name, sizeof name, "%lluK", size >> 10);
    printf("%-8s", name);
    for (int w = 0; w < WAYS; w++) {
      char cell[64];
      snprintf(cell, sizeof cell, "%.1f (%.0f)", best[w], per_direction / best[w] / 1e3);
      printf(" %20s", cell);
    }
    printf(" %9.1f %9.1f %9.1f %9.3f", floor, t_nccl, 0.8 * t_nccl, floor / t_nccl);
    if (shim) {
      double t_ours = time_all_reduce(ours, size, runs);
      printf(" %9.1f %9.3f", t_ours, t_ours / t_nccl);
    }
    printf("\n");
    printf("#   best shapes (blocks x threads x packs in flight):");
    for (int w : {PULL, PUSH, PULL_PUSH, PULL_PUSH_SYNCED, PUSH_SYNCED})
      printf(" %s %dx%dx%d;", WAY_NAMES[w], best_shape[w].blocks, best_shape[w].threads, best_shape[w].unroll);
    printf(" push+ce: the SMs' part %.3f\n", best_part);
    fflush(stdout);
  }
  return 0;
}
