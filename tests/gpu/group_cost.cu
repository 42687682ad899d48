// What a group of all-reduces costs the host: ncclGroupStart, CALLS all-reduces per GPU,
// ncclGroupEnd, as nccl-tests -m CALLS issues them, through the shim and through NCCL in
// alternating rounds of one run (--collective: reduces, to the last rank, or all-gathers
// instead, e.g. at sizes the shim forwards). Small groups are host-bound (NCCL's host work, about 2 us an
// operation, outlasts its kernel), so any work the shim adds to a call shows here undiluted.
// One process per GPU (forked, as mpirun would start them), or one process driving every GPU
// (--one-process, as nccl-tests -g). Each group on the same buffers, or group i on the (i mod
// PLACES)th of --places sets of them, as a training step's groups each on their own.
//   group_cost --shim DIR/libnccl.so.2 --real DIR/libnccl.so.2 [--ngpus 2] [--one-process]
//              [--calls 4] [--groups 2000] [--rounds 3] [--sizes 0,8,2K,32K,128K,1M] [--limit 1.05]
//              [--collective all_reduce|reduce|all_gather] [--places 1]
// Prints per size the best round's time per operation of each library (wall time of GROUPS
// groups and the GPUs' catching up, divided by the operations) and their ratio, then the host's
// mean time in each step of a group in that round (start, each call of the first GPU, end).
// Exits 1 where the shim's best is above LIMIT x NCCL's.
#include <cuda_runtime.h>
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

static struct {
  const char *shim = NULL, *real = NULL;
  int ngpus = 2, calls = 4, groups = 2000, rounds = 3, places = 1;
  bool one_process = false;
  double limit = 1.05;
  const char* collective = "all_reduce";
  std::vector<size_t> sizes{0, 8, 2 << 10, 32 << 10, 128 << 10, 1 << 20};
} opt;

enum { LIB_REAL, LIB_SHIM, LIBS };

// The collective the groups hold (--collective), read once from its name, not per call.
enum Collective { ALL_REDUCE, REDUCE, ALL_GATHER, COLLECTIVES };
static const char* const COLLECTIVE_NAMES[COLLECTIVES] = {"all_reduce", "reduce", "all_gather"};
static Collective collective = ALL_REDUCE;

// What the forked ranks share: the unique ids and a barrier.
struct Shared {
  ncclUniqueId ids[LIBS];
  int ids_ready, arrived, generation;
};
static Shared* shared;

static void barrier(int nranks) {
  int generation = __atomic_load_n(&shared->generation, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&shared->arrived, 1, __ATOMIC_ACQ_REL) == nranks) {
    __atomic_store_n(&shared->arrived, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&shared->generation, 1, __ATOMIC_RELEASE);
  } else {
    while (__atomic_load_n(&shared->generation, __ATOMIC_ACQUIRE) == generation) {
    }
  }
}

static double now_us() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

// The GPUs this process drives, with a communicator of each library, a buffer and a stream each.
struct Gpus {
  int count, nranks;
  int devices[LIB_MAX_GPUS];
  int rank_of[LIB_MAX_GPUS];
  ncclComm_t comms[LIBS][LIB_MAX_GPUS];
  float* buffers[LIB_MAX_GPUS];
  cudaStream_t streams[LIB_MAX_GPUS];
};

// One round: GROUPS groups through `lib`; the time per operation, and each step's mean host time
// (start, the calls in order, end) in `steps`.
static double round_of(const Lib* lib, int l, Gpus& g, size_t bytes, std::vector<double>& steps) {
  size_t count = bytes / sizeof(float), stride = (count + 64) * g.nranks;
  int per_group = opt.calls * g.count;
  steps.assign(per_group + 2, 0.0);
  auto group = [&](bool timed, int i) {
    size_t place = (size_t)(i % opt.places) * opt.calls * stride;
    double at = now_us(), start = at;
    NCCL_CALL(lib, GroupStart());
    double t = now_us();
    if (timed) steps[0] += t - at;
    at = t;
    for (int k = 0; k < opt.calls; k++) {
      for (int d = 0; d < g.count; d++) {
        float* b = g.buffers[d] + place + k * stride;
        ncclComm_t comm = g.comms[l][d];
        switch (collective) {
          case REDUCE:
            NCCL_CALL(lib, Reduce(b, b, count, ncclFloat, ncclSum, g.nranks - 1, comm, g.streams[d]));
            break;
          case ALL_GATHER:
            NCCL_CALL(lib, AllGather(b + g.rank_of[d] * count, b, count, ncclFloat, comm, g.streams[d]));
            break;
          default:
            NCCL_CALL(lib, AllReduce(b, b, count, ncclFloat, ncclSum, comm, g.streams[d]));
        }
        t = now_us();
        if (timed) steps[1 + k * g.count + d] += t - at;
        at = t;
      }
    }
    NCCL_CALL(lib, GroupEnd());
    t = now_us();
    if (timed) steps[per_group + 1] += t - at;
    return t - start;
  };
  for (int w = 0; w < 50; w++) group(false, w);
  for (int d = 0; d < g.count; d++) CUDA_CHECK(cudaStreamSynchronize(g.streams[d]));
  double start = now_us();
  for (int i = 0; i < opt.groups; i++) group(true, i);
  for (int d = 0; d < g.count; d++) CUDA_CHECK(cudaStreamSynchronize(g.streams[d]));
  double per_op = (now_us() - start) / ((double)opt.groups * opt.calls);
  for (double& s : steps) s /= opt.groups;
  return per_op;
}

// Every size, rounds alternating the libraries; `report` is whether this process prints. Returns
// the number of sizes above the limit.
static int run(Lib libs[LIBS], Gpus& g, bool report, void (*sync)()) {
  if (report)
    printf("%9s %9s %9s %7s  %s\n", "bytes", "nccl_us", "shim_us", "ratio",
           "host us per step, best round of each: start, calls, end");
  int above = 0;
  for (size_t bytes : opt.sizes) {
    double best[LIBS] = {1e30, 1e30};
    std::vector<double> steps, best_steps[LIBS];
    for (int round = 0; round < opt.rounds; round++) {
      for (int k = 0; k < LIBS; k++) {
        int l = (k + round) % LIBS;  // which goes first alternates
        sync();
        double t = round_of(&libs[l], l, g, bytes, steps);
        if (t < best[l]) best[l] = t, best_steps[l] = steps;
      }
    }
    double ratio = best[LIB_SHIM] / best[LIB_REAL];
    bool bad = ratio > opt.limit;
    above += bad;
    if (report) {
      printf("%9zu %9.2f %9.2f %7.3f%s", bytes, best[LIB_REAL], best[LIB_SHIM], ratio, bad ? " SLOW" : "");
      for (int l = 0; l < LIBS; l++) {
        printf("  %s:", libs[l].name);
        for (double s : best_steps[l]) printf(" %.2f", s);
      }
      printf("\n");
      fflush(stdout);
    }
  }
  if (report)
    printf("# %d sizes through the shim above %.2f x NCCL's time per operation (groups of %d %s, %s)\n",
           above, opt.limit, opt.calls, COLLECTIVE_NAMES[collective],
           opt.one_process ? "one process" : "one process per GPU");
  fflush(stdout);  // a forked rank leaves by _exit
  return above;
}

static void make_buffers(Gpus& g) {
  for (int d = 0; d < g.count; d++) {
    CUDA_CHECK(cudaSetDevice(g.devices[d]));
    size_t largest = 0;
    for (size_t s : opt.sizes) largest = s > largest ? s : largest;
    // all-gather: nranks x
    size_t bytes = (size_t)opt.places * opt.calls * (largest + 256) * g.nranks + 4096;
    CUDA_CHECK(cudaMalloc(&g.buffers[d], bytes));
    CUDA_CHECK(cudaMemset(g.buffers[d], 0, bytes));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g.streams[d], cudaStreamNonBlocking));
  }
}

static void load_both(Lib libs[LIBS]) {
  // The shim forwards to the same real NCCL as the other table.
  setenv("NCCLSHIM_REAL_NCCL", opt.real, 1);
  load(&libs[LIB_REAL], "nccl", opt.real);
  load(&libs[LIB_SHIM], "shim", opt.shim);
}

static void no_sync() {}
static int forked_ranks;
static void sync_ranks() { barrier(forked_ranks); }

static int one_process() {
  Lib libs[LIBS];
  load_both(libs);
  Gpus g;
  g.count = g.nranks = opt.ngpus;
  for (int d = 0; d < g.count; d++) g.devices[d] = g.rank_of[d] = d;
  for (int l = 0; l < LIBS; l++) NCCL_CALL(&libs[l], CommInitAll(g.comms[l], g.count, g.devices));
  make_buffers(g);
  int above = run(libs, g, true, no_sync);
  for (int l = 0; l < LIBS; l++)
    for (int d = 0; d < g.count; d++) NCCL_CALL(&libs[l], CommDestroy(g.comms[l][d]));
  return above;
}

static int rank_process(int rank) {
  CUDA_CHECK(cudaSetDevice(rank));
  Lib libs[LIBS];
  load_both(libs);
  if (rank == 0) {
    for (int l = 0; l < LIBS; l++) NCCL_CALL(&libs[l], GetUniqueId(&shared->ids[l]));
    __atomic_store_n(&shared->ids_ready, 1, __ATOMIC_RELEASE);
  }
  while (!__atomic_load_n(&shared->ids_ready, __ATOMIC_ACQUIRE)) usleep(100);
  Gpus g;
  g.count = 1;
  g.nranks = opt.ngpus;
  g.devices[0] = rank;
  g.rank_of[0] = rank;
  for (int l = 0; l < LIBS; l++)
    NCCL_CALL(&libs[l], CommInitRank(&g.comms[l][0], opt.ngpus, shared->ids[l], rank));
  make_buffers(g);
  int above = run(libs, g, rank == 0, sync_ranks);
  for (int l = 0; l < LIBS; l++) NCCL_CALL(&libs[l], CommDestroy(g.comms[l][0]));
  return above;
}

static void parse_args(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (a == "--one-process") { opt.one_process = true; continue; }
    if (!v) { fprintf(stderr, "%s needs a value\n", a.c_str()); exit(2); }
    if (a == "--shim") opt.shim = v;
    else if (a == "--real") opt.real = v;
    else if (a == "--ngpus") opt.ngpus = atoi(v);
    else if (a == "--calls") opt.calls = atoi(v);
    else if (a == "--groups") opt.groups = atoi(v);
    else if (a == "--places") opt.places = atoi(v);
    else if (a == "--rounds") opt.rounds = atoi(v);
    else if (a == "--limit") opt.limit = atof(v);
    else if (a == "--collective") opt.collective = v;
    else if (a == "--sizes") {
      opt.sizes.clear();
      for (const char* s = v; *s;) {
        opt.sizes.push_back(parse_bytes(s, &s));
        if (*s == ',') s++;
      }
    } else { fprintf(stderr, "unknown argument %s\n", a.c_str()); exit(2); }
    i++;
  }
  bool known = false;
  for (int c = 0; c < COLLECTIVES; c++)
    if (!strcmp(opt.collective, COLLECTIVE_NAMES[c])) collective = (Collective)c, known = true;
  if (!opt.shim || !opt.real || opt.ngpus < 2 || opt.ngpus > LIB_MAX_GPUS || opt.calls < 1 ||
      opt.groups < 1 || opt.rounds < 1 || opt.places < 1 || !known) {
    fprintf(stderr, "usage: group_cost --shim LIB --real LIB [--ngpus N] [--one-process] [--calls M] "
                    "[--groups G] [--rounds R] [--sizes 8,2K,...] [--limit X] "
                    "[--collective all_reduce|reduce|all_gather] [--places P]\n");
    exit(2);
  }
}

int main(int argc, char** argv) {
  parse_args(argc, argv);
  int above;
  if (opt.one_process) {
    above = one_process();
  } else {
    // Before any CUDA call: the children each take a GPU.
    shared = (Shared*)mmap(NULL, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
      perror("mmap");
      return 2;
    }
    memset(shared, 0, sizeof(Shared));
    forked_ranks = opt.ngpus;
    std::vector<pid_t> children;
    for (int r = 0; r < opt.ngpus; r++) {
      pid_t pid = fork();
      if (pid == 0) {
        fflush(stdout);
        _exit(rank_process(r) > 0 ? 1 : 0);
      }
      children.push_back(pid);
    }
    above = 0;  // the worst exit: 1 where a size was above the limit, 2 - 3 where a rank failed
    for (pid_t pid : children) {
      int s;
      waitpid(pid, &s, 0);
      int code = WIFEXITED(s) ? WEXITSTATUS(s) : 3;
      above = code > above ? code : above;
    }
  }
  return above > 0 ? 1 : 0;
}
