// A late peer: one process per GPU (forked, as torchrun or mpirun would start them), each rank
// late by its own random 0 - MAX microseconds before every call (a host spin before each eager
// call, a spin kernel before each call captured in a CUDA graph), so that on every call some
// rank's kernel waits for a peer, and the GPUs idle between calls as under a Python loop.
// ncclshim and the real NCCL run the same calls with the same delays, in alternating turns (after
// an untimed one each), in one run; each size's time per call through the shim must stay within
// LIMIT x NCCL's (a kernel that waits badly for a late peer stalls, and its peer, call after
// call: seen at 0.6 - 1.2 ms a call).
//   late_peer --shim DIR/libnccl.so.2 --real DIR/libnccl.so.2 [--ngpus 2] [--colls AllReduce,...]
//             [--sizes 8K,64K,...] [--types bf16,i32] [--runs 3] [--calls 200] [--graph-calls 10]
//             [--replays 20] [--max-delay-us 50] [--limit 1.5] [--group 1]
// --group K: each all-reduce becomes a group of K all-reduces of that size on K slices of the
// buffers (as PyTorch's coalescing manager issues them); times are per group.
// Prints one line per (collective, type, size, placement, mode, run): NCCL's and the shim's
// microseconds per call and their ratio; then FAIL lines, and exits 1 if any ratio passed the
// limit. Inputs are checked after every turn (any wrong element fails the run too).
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cuda_check.h"
#include "nccl_lib.h"

enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCESCATTER, C_BROADCAST, C_REDUCE, C_ALLTOALL, C_COUNT };
static const char* const COLL_NAMES[C_COUNT] = {"AllReduce", "AllGather", "ReduceScatter",
                                                "Broadcast", "Reduce",    "AlltoAll"};

struct Type {
  const char* name;
  ncclDataType_t nccl;
  size_t size;
};
static const Type TYPES[] = {{"bf16", ncclBfloat16, 2}, {"f32", ncclFloat32, 4}, {"i32", ncclInt32, 4}};

static struct {
  const char *shim = NULL, *real = NULL;
  int ngpus = 2, runs = 3, calls = 200, graph_calls = 10, replays = 20, max_delay_us = 50, group = 1;
  double limit = 1.5;
  std::vector<int> colls{C_ALLREDUCE};
  std::vector<const Type*> types{&TYPES[0]};
  std::vector<size_t> sizes{8 << 10, 64 << 10, 128 << 10, 192 << 10, 256 << 10, 384 << 10,
                            512 << 10, 1 << 20, 2 << 20, 8 << 20, 32 << 20};
} opt;

// ---- what the ranks share: the unique ids, a barrier, each rank's times -----------------------

enum { LIB_REAL, LIB_SHIM, LIBS };
struct Shared {
  ncclUniqueId ids[LIBS];
  int ids_ready;
  int arrived, generation;
  double us[64];
  unsigned long long wrong[64];
};
static Shared* shared;
static int rank, nranks;

static void barrier() {
  int generation = __atomic_load_n(&shared->generation, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&shared->arrived, 1, __ATOMIC_ACQ_REL) == nranks) {
    __atomic_store_n(&shared->arrived, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&shared->generation, 1, __ATOMIC_RELEASE);
  } else {
    while (__atomic_load_n(&shared->generation, __ATOMIC_ACQUIRE) == generation) usleep(0);
  }
}

static double now_us() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

// This rank's host delay before an eager call.
static void host_delay(unsigned* seed) {
  double until = now_us() + rand_r(seed) % (opt.max_delay_us + 1);
  while (now_us() < until) {
  }
}

// This rank's delay before a call in a graph: a spin of a pseudo-random 0 - max_ns, the same
// sequence for both libraries (the counter is put back before each one's replays).
__global__ void device_delay(unsigned long long* counter, unsigned max_ns, int rank) {
  unsigned long long x = (++*counter + 1000003ull * rank) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  unsigned long long d = x % (max_ns + 1ull), start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < d);
}

// Small integers, exact in every type and in sums over a few ranks.
__global__ void fill(unsigned char* p, size_t count, int type, int rank, int salt) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
    int v = (int)((i * 7 + rank * 3 + salt) % 5);
    if (type == 0) {
      float f = (float)v;
      ((unsigned short*)p)[i] = (unsigned short)(__float_as_uint(f) >> 16);
    } else if (type == 1) {
      ((float*)p)[i] = (float)v;
    } else {
      ((int*)p)[i] = v;
    }
  }
}

__device__ float element(const unsigned char* p, size_t i, int type) {
  if (type == 0) return __uint_as_float(((unsigned)((const unsigned short*)p)[i]) << 16);
  if (type == 1) return ((const float*)p)[i];
  return (float)((const int*)p)[i];
}

// Output element j of one call of `coll` on inputs filled with `salt` (each call's output is the
// same: the inputs stay as filled, or, in place, every call but the first reads... see turn()).
__global__ void check(const unsigned char* out, size_t elems, size_t count, int coll, int type, int rank,
                      int nranks, int salt, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < elems; j += (size_t)gridDim.x * blockDim.x) {
    float want = 0;
    size_t block = count ? j / count : 0, at = count ? j % count : 0;
    if (coll == C_ALLREDUCE || coll == C_REDUCE) {
      for (int r = 0; r < nranks; r++) want += (float)((j * 7 + r * 3 + salt) % 5);
    } else if (coll == C_REDUCESCATTER) {
      size_t i = rank * count + j;
      for (int r = 0; r < nranks; r++) want += (float)((i * 7 + r * 3 + salt) % 5);
    } else if (coll == C_ALLGATHER) {
      want = (float)((at * 7 + block * 3 + salt) % 5);
    } else if (coll == C_BROADCAST) {
      want = (float)((j * 7 + 0 * 3 + salt) % 5);
    } else if (coll == C_ALLTOALL) {
      want = (float)(((rank * count + at) * 7 + block * 3 + salt) % 5);
    }
    if (element(out, j, type) != want) mine++;
  }
  if (mine) atomicAdd(bad, mine);
}

struct Buffers {
  unsigned char *send, *recv;
  unsigned long long* bad;
  unsigned long long* counter;
  cudaStream_t stream;
};

// Elements each rank sends and receives for `bytes` as nccl-tests counts them.
static size_t count_of(int coll, size_t bytes, const Type* t) {
  size_t n = bytes / t->size;
  if (coll == C_ALLGATHER || coll == C_REDUCESCATTER || coll == C_ALLTOALL) n /= nranks;
  return n;
}
static size_t send_elems(int coll, size_t count) {
  return coll == C_REDUCESCATTER || coll == C_ALLTOALL ? count * nranks : count;
}
static size_t recv_elems(int coll, size_t count) {
  return coll == C_ALLGATHER || coll == C_ALLTOALL ? count * nranks : count;
}

// All-reduces per issue (--group); the other collectives go one at a time.
static int calls_per_issue(int coll) { return coll == C_ALLREDUCE ? opt.group : 1; }

static void issue(const Lib* L, ncclComm_t comm, int coll, const Type* t, size_t count, const void* send,
                  void* recv, cudaStream_t s) {
  switch (coll) {
    case C_ALLREDUCE:
      if (opt.group > 1) NCCL_CALL(L, GroupStart());
      for (int k = 0; k < opt.group; k++) {
        size_t at = k * count * t->size;
        NCCL_CALL(L, AllReduce((const char*)send + at, (char*)recv + at, count, t->nccl, ncclSum, comm, s));
      }
      if (opt.group > 1) NCCL_CALL(L, GroupEnd());
      break;
    case C_ALLGATHER: NCCL_CALL(L, AllGather(send, recv, count, t->nccl, comm, s)); break;
    case C_REDUCESCATTER: NCCL_CALL(L, ReduceScatter(send, recv, count, t->nccl, ncclSum, comm, s)); break;
    case C_BROADCAST: NCCL_CALL(L, Broadcast(send, recv, count, t->nccl, 0, comm, s)); break;
    case C_REDUCE: NCCL_CALL(L, Reduce(send, recv, count, t->nccl, ncclSum, 0, comm, s)); break;
    case C_ALLTOALL: NCCL_CALL(L, AlltoAll(send, recv, count, t->nccl, comm, s)); break;
  }
}

// Whether the call's output is checked on this rank (a reduce's only at the root).
static bool checked(int coll) { return coll != C_REDUCE || rank == 0; }

// One library's turn at one case: eager calls (`graph` 0) or graph replays; the microseconds per
// call on this rank, and any wrong output elements counted into b.bad.
static double turn(const Lib* L, ncclComm_t comm, Buffers& b, int coll, const Type* t, size_t count,
                   bool in_place, bool graph, unsigned seed, int salt) {
  int type = (int)(t - TYPES);
  int group = calls_per_issue(coll);
  size_t sends = send_elems(coll, count) * group, recvs = recv_elems(coll, count) * group;
  // In place: the output buffer holds the input where NCCL puts it (this rank's chunk of an
  // all-gather, the whole of a reduce-scatter's input).
  unsigned char* recv = b.recv;
  const unsigned char* send = b.send;
  if (in_place) {
    if (coll == C_ALLGATHER) {
      send = b.recv + rank * count * t->size;
    } else if (coll == C_REDUCESCATTER) {
      send = b.recv;
      recv = b.recv + rank * count * t->size;
    } else if (coll != C_ALLTOALL) {
      send = b.recv;
    }
  }
  // The calls' inputs never change between calls out of place. In place, a reduction would
  // grow from call to call: the input is filled again before each call (a copy from b.send).
  bool refill = in_place && send != b.send;
  size_t fill_bytes = coll == C_REDUCESCATTER ? sends * t->size : count * group * t->size;
  fill<<<256, 256, 0, b.stream>>>(b.send, sends, type, rank, salt);
  CUDA_CHECK(cudaMemsetAsync(b.recv, 0xee, recvs * t->size + (coll == C_REDUCESCATTER ? sends * t->size : 0),
                             b.stream));
  CUDA_CHECK(cudaMemsetAsync(b.counter, 0, sizeof(unsigned long long), b.stream));
  CUDA_CHECK(cudaStreamSynchronize(b.stream));
  auto one = [&](unsigned* s) {
    if (refill) CUDA_CHECK(cudaMemcpyAsync((void*)send, b.send, fill_bytes, cudaMemcpyDeviceToDevice, b.stream));
    if (graph) {
      device_delay<<<1, 1, 0, b.stream>>>(b.counter, opt.max_delay_us * 1000u, rank);
    } else {
      host_delay(s);
    }
    issue(L, comm, coll, t, count, send, recv, b.stream);
  };
  cudaEvent_t start, end;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&end));
  double us;
  if (!graph) {
    barrier();
    CUDA_CHECK(cudaEventRecord(start, b.stream));
    for (int i = 0; i < opt.calls; i++) one(&seed);
    CUDA_CHECK(cudaEventRecord(end, b.stream));
    CUDA_CHECK(cudaEventSynchronize(end));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
    us = ms * 1e3 / opt.calls;
  } else {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(b.stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < opt.graph_calls; i++) one(&seed);
    CUDA_CHECK(cudaStreamEndCapture(b.stream, &g));
    CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_CHECK(cudaGraphLaunch(exec, b.stream));  // the first replay sets the graph up
    CUDA_CHECK(cudaStreamSynchronize(b.stream));
    CUDA_CHECK(cudaMemsetAsync(b.counter, 0, sizeof(unsigned long long), b.stream));
    barrier();
    CUDA_CHECK(cudaEventRecord(start, b.stream));
    for (int i = 0; i < opt.replays; i++) CUDA_CHECK(cudaGraphLaunch(exec, b.stream));
    CUDA_CHECK(cudaEventRecord(end, b.stream));
    CUDA_CHECK(cudaEventSynchronize(end));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
    us = ms * 1e3 / (opt.replays * opt.graph_calls);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(g));
  }
  if (checked(coll)) {
    size_t elems = coll == C_BROADCAST || coll == C_ALLREDUCE || coll == C_REDUCE ? count * group : recvs;
    check<<<256, 256, 0, b.stream>>>(recv, elems, count, coll, type, rank, nranks, salt, b.bad);
  }
  CUDA_CHECK(cudaStreamSynchronize(b.stream));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(end));
  return us;
}

static void parse_args(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    auto list = [&](auto each) {
      std::string s = v;
      for (size_t at = 0; at <= s.size();) {
        size_t comma = s.find(',', at);
        if (comma == std::string::npos) comma = s.size();
        if (comma > at) each(s.substr(at, comma - at));
        at = comma + 1;
      }
      i++;
    };
    if (a == "--shim") opt.shim = v, i++;
    else if (a == "--real") opt.real = v, i++;
    else if (a == "--ngpus") opt.ngpus = atoi(v), i++;
    else if (a == "--runs") opt.runs = atoi(v), i++;
    else if (a == "--calls") opt.calls = atoi(v), i++;
    else if (a == "--graph-calls") opt.graph_calls = atoi(v), i++;
    else if (a == "--replays") opt.replays = atoi(v), i++;
    else if (a == "--max-delay-us") opt.max_delay_us = atoi(v), i++;
    else if (a == "--limit") opt.limit = atof(v), i++;
    else if (a == "--group") opt.group = atoi(v), i++;
    else if (a == "--sizes") {
      opt.sizes.clear();
      list([](const std::string& s) { opt.sizes.push_back(parse_bytes(s.c_str())); });
    } else if (a == "--colls") {
      opt.colls.clear();
      list([](const std::string& s) {
        for (int c = 0; c < C_COUNT; c++)
          if (s == COLL_NAMES[c]) return opt.colls.push_back(c);
        fprintf(stderr, "unknown collective %s\n", s.c_str());
        exit(2);
      });
    } else if (a == "--types") {
      opt.types.clear();
      list([](const std::string& s) {
        for (const Type& t : TYPES)
          if (s == t.name) return opt.types.push_back(&t);
        fprintf(stderr, "unknown type %s\n", s.c_str());
        exit(2);
      });
    } else {
      fprintf(stderr, "unknown argument %s (see the head of late_peer.cu)\n", a.c_str());
      exit(2);
    }
  }
  if (!opt.shim || !opt.real || opt.ngpus < 2 || opt.ngpus > 64 || opt.group < 1) {
    fprintf(stderr, "usage: late_peer --shim PATH --real PATH [--ngpus N] ...\n");
    exit(2);
  }
}

static int run_rank() {
  CUDA_CHECK(cudaSetDevice(rank));
  Lib libs[LIBS];
  // The shim forwards to the same real NCCL as the other table.
  setenv("NCCLSHIM_REAL_NCCL", opt.real, 1);
  load(&libs[LIB_REAL], "nccl", opt.real);
  load(&libs[LIB_SHIM], "shim", opt.shim);
  if (rank == 0) {
    for (int l = 0; l < LIBS; l++) NCCL_CALL(&libs[l], GetUniqueId(&shared->ids[l]));
    __atomic_store_n(&shared->ids_ready, 1, __ATOMIC_RELEASE);
  }
  while (!__atomic_load_n(&shared->ids_ready, __ATOMIC_ACQUIRE)) usleep(100);
  ncclComm_t comms[LIBS];
  for (int l = 0; l < LIBS; l++) NCCL_CALL(&libs[l], CommInitRank(&comms[l], nranks, shared->ids[l], rank));

  size_t largest = 0;
  for (size_t s : opt.sizes) largest = s > largest ? s : largest;
  Buffers b;
  // Room for an all-to-all's and a reduce-scatter's in-place input (nranks chunks) and more,
  // and for a group's all-reduces side by side.
  size_t room = (opt.group > 2 ? opt.group : 2) * largest + 256;
  CUDA_CHECK(cudaMalloc(&b.send, room));
  CUDA_CHECK(cudaMalloc(&b.recv, room));
  CUDA_CHECK(cudaMalloc(&b.bad, sizeof(unsigned long long)));
  CUDA_CHECK(cudaMalloc(&b.counter, sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(b.bad, 0, sizeof(unsigned long long)));
  CUDA_CHECK(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));

  int failures = 0, cases = 0;
  if (rank == 0)
    printf("%-13s %-5s %9s %-7s %-5s %3s %10s %10s %7s\n", "collective", "type", "bytes", "place", "mode", "run",
           "nccl_us", "shim_us", "ratio");
  for (int coll : opt.colls) {
    for (const Type* t : opt.types) {
      for (size_t bytes : opt.sizes) {
        size_t count = count_of(coll, bytes, t);
        if (count == 0) continue;
        for (int in_place = 0; in_place < 2; in_place++) {
          for (int graph = 0; graph < 2; graph++) {
            // One turn of each library first, untimed: what a job pays once (the first use of a
            // buffer or a kernel) is not what this measures, and nccl-tests leaves it out too.
            for (int l = 0; l < LIBS; l++) {
              turn(&libs[l], comms[l], b, coll, t, count, in_place, graph, 7u + rank, 0);
              barrier();
            }
            for (int run = 0; run < opt.runs; run++) {
              double us[LIBS];
              // Alternating which library goes first; the same delays for both.
              for (int k = 0; k < LIBS; k++) {
                int l = (k + run) % LIBS;
                unsigned seed = 1000003u * (unsigned)(cases + 1) + 7919u * run + rank;
                int salt = (run + k) % 3;
                double mine = turn(&libs[l], comms[l], b, coll, t, count, in_place, graph, seed, salt);
                shared->us[rank] = mine;
                barrier();
                double worst = 0;
                for (int r = 0; r < nranks; r++) worst = shared->us[r] > worst ? shared->us[r] : worst;
                us[l] = worst;
                barrier();
              }
              cases++;
              double ratio = us[LIB_SHIM] / us[LIB_REAL];
              if (rank == 0) {
                printf("%-13s %-5s %9zu %-7s %-5s %3d %10.2f %10.2f %7.3f%s\n", COLL_NAMES[coll], t->name, bytes,
                       in_place ? "inplace" : "apart", graph ? "graph" : "eager", run, us[LIB_REAL], us[LIB_SHIM],
                       ratio, ratio > opt.limit ? "  SLOW" : "");
                fflush(stdout);
              }
              if (ratio > opt.limit) failures++;
            }
          }
        }
      }
    }
  }
  unsigned long long bad;
  CUDA_CHECK(cudaMemcpy(&bad, b.bad, sizeof bad, cudaMemcpyDeviceToHost));
  shared->wrong[rank] = bad;
  barrier();
  if (rank == 0) {
    unsigned long long wrong = 0;
    for (int r = 0; r < nranks; r++) wrong += shared->wrong[r];
    printf("# %d of %d cases through the shim took more than %.2f x NCCL's time; %llu wrong elements\n",
           failures, cases, opt.limit, wrong);
    fflush(stdout);  // the rank leaves with _exit, which would drop it
    if (wrong) failures++;
  }
  for (int l = 0; l < LIBS; l++) NCCL_CALL(&libs[l], CommDestroy(comms[l]));
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  parse_args(argc, argv);
  nranks = opt.ngpus;
  // Before any CUDA call: the children each take a GPU.
  shared = (Shared*)mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    perror("mmap");
    return 2;
  }
  memset(shared, 0, sizeof(Shared));
  std::vector<pid_t> children;
  for (int r = 0; r < nranks; r++) {
    pid_t pid = fork();
    if (pid == 0) {
      rank = r;
      fflush(stdout);
      _exit(run_rank());
    }
    children.push_back(pid);
  }
  int status = 0;
  for (pid_t pid : children) {
    int s;
    waitpid(pid, &s, 0);
    int code = WIFEXITED(s) ? WEXITSTATUS(s) : 3;
    status = code > status ? code : status;
  }
  return status;
}
