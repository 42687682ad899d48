// The side-by-side benchmark: ncclshim against the real NCCL, in one process on the same GPUs.
// One thread drives every GPU (as nccl-tests -g N). Both libraries are dlopen()ed by absolute
// path and called through two function tables, each with its own communicators; the two are
// timed in alternating rounds at every size, eager and captured in a CUDA graph.
//   bench --shim DIR/libnccl.so.2 --real DIR/libnccl.so.2 [--ngpus N] [--min-bytes 8]
//         [--max-bytes 256M] [--colls AllReduce,...] [--rounds 25] [--round-us 1500]
//         [--modes eager,graph] [--json FILE] [--same]
// --same: both tables are the real NCCL (an A/A run: the noise floor of the comparison).
// Prints nccl-tests-style tables (float, sum; busbw with nccl-tests' factors) for both and the
// ratio of times (shim / NCCL); "#wrong" counts output elements that differ from the expected;
// "issue" (eager only, 0 for graphs) is the host's time to issue one iteration's calls.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

#include "cuda_check.h"
#include "nccl_lib.h"

#define MAX_GPUS LIB_MAX_GPUS

enum { B_ALLREDUCE, B_ALLGATHER, B_REDUCESCATTER, B_BROADCAST, B_REDUCE, B_ALLTOALL, B_GATHER,
       B_SCATTER, B_SENDRECV, B_COUNT };
static const char* const NAMES[B_COUNT] = {"AllReduce", "AllGather", "ReduceScatter",
                                           "Broadcast", "Reduce",    "AlltoAll",
                                           "Gather",    "Scatter",   "SendRecv"};

static int reduces(int coll) {
  return coll == B_ALLREDUCE || coll == B_REDUCESCATTER || coll == B_REDUCE;
}
// nccl-tests' size: the count argument times nranks for these, the count itself for the others.
static int per_rank_count(int coll) {
  return coll == B_ALLGATHER || coll == B_REDUCESCATTER || coll == B_ALLTOALL ||
         coll == B_GATHER || coll == B_SCATTER;
}
// nccl-tests' bus bandwidth factors.
static double busbw_factor(int coll, int n) {
  if (coll == B_ALLREDUCE) return 2.0 * (n - 1) / n;
  if (per_rank_count(coll)) return (double)(n - 1) / n;
  return 1.0;
}

static struct {
  int ngpus = 0, rounds = 25, round_us = 1500, same = 0, colls[B_COUNT], eager = 1, graph = 1;
  size_t min_bytes = 8, max_bytes = 256u << 20;
  const char *shim = NULL, *real = NULL, *json = NULL;
} opt;

struct Gpu {
  cudaStream_t stream;
  float *send, *recv;
  unsigned long long* bad;  // device counter for the check kernel
};
static Gpu gpus[MAX_GPUS];
static int n;

// Inputs are small integers, so sums over any number of ranks in any order are exact in float.
__device__ __host__ inline float value(int rank, size_t i) {
  return (float)((i * 7 + (size_t)rank * 3) % 13);
}

__global__ void fill(float* p, size_t count, int rank) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = value(rank, i);
}

__global__ void check(const float* p, size_t elems, int coll, int rank, int nranks,
                      size_t count, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < elems;
       j += (size_t)gridDim.x * blockDim.x) {
    float want = 0;
    size_t blk = count ? j / count : 0, at = count ? j % count : 0;
    switch (coll) {
      case B_ALLREDUCE: case B_REDUCE:
        for (int r = 0; r < nranks; r++) want += value(r, j);
        break;
      case B_REDUCESCATTER:
        for (int r = 0; r < nranks; r++) want += value(r, (size_t)rank * count + j);
        break;
      case B_BROADCAST: want = value(0, j); break;
      case B_ALLGATHER: case B_GATHER: want = value((int)blk, at); break;
      case B_ALLTOALL: want = value((int)blk, (size_t)rank * count + at); break;
      case B_SCATTER: want = value(0, (size_t)rank * count + j); break;
      case B_SENDRECV: want = value((rank + nranks - 1) % nranks, j); break;
    }
    mine += p[j] != want;
  }
  if (mine) atomicAdd(bad, mine);
}

// Elements in a rank's send and recv buffers for `count`.
static size_t send_elems(int coll, size_t count) {
  return coll == B_REDUCESCATTER || coll == B_ALLTOALL || coll == B_SCATTER ? count * n : count;
}
static size_t recv_elems(int coll, size_t count) {
  return coll == B_ALLGATHER || coll == B_ALLTOALL || coll == B_GATHER ? count * n : count;
}

static ncclResult_t issue(const Lib* L, int coll, int g, size_t count) {
  const Gpu* G = &gpus[g];
  ncclComm_t c = L->comms[g];
  cudaStream_t s = G->stream;
  const ncclDataType_t f = ncclFloat;
  switch (coll) {
    case B_ALLREDUCE: return L->AllReduce(G->send, G->recv, count, f, ncclSum, c, s);
    case B_ALLGATHER: return L->AllGather(G->send, G->recv, count, f, c, s);
    case B_REDUCESCATTER: return L->ReduceScatter(G->send, G->recv, count, f, ncclSum, c, s);
    case B_BROADCAST: return L->Broadcast(G->send, G->recv, count, f, 0, c, s);
    case B_REDUCE: return L->Reduce(G->send, G->recv, count, f, ncclSum, 0, c, s);
    case B_ALLTOALL: return L->AlltoAll(G->send, G->recv, count, f, c, s);
    case B_GATHER: return L->Gather(G->send, G->recv, count, f, 0, c, s);
    case B_SCATTER: return L->Scatter(G->send, G->recv, count, f, 0, c, s);
    case B_SENDRECV: {
      ncclResult_t r = L->Send(G->send, count, f, (g + 1) % n, c, s);
      return r != ncclSuccess ? r : L->Recv(G->recv, count, f, (g + n - 1) % n, c, s);
    }
  }
  return ncclInvalidArgument;
}

// `iters` calls of the collective on every GPU, each call one group over the GPUs.
static void issue_iters(const Lib* L, int coll, size_t count, int iters) {
  for (int it = 0; it < iters; it++) {
    NCCL_CALL(L, GroupStart());
    for (int g = 0; g < n; g++) nccl_ok(L, issue(L, coll, g, count), NAMES[coll], __FILE__, __LINE__);
    NCCL_CALL(L, GroupEnd());
  }
}

static double now_us() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void sync_all() {
  for (int g = 0; g < n; g++) CUDA_CHECK(cudaStreamSynchronize(gpus[g].stream));
}

// Time per iteration; `issue_us`, when given, gets the host's part: issuing the calls.
static double time_eager(const Lib* L, int coll, size_t count, int iters, double* issue_us = NULL) {
  double t0 = now_us();
  issue_iters(L, coll, count, iters);
  if (issue_us) *issue_us = (now_us() - t0) / iters;
  sync_all();
  return (now_us() - t0) / iters;
}

struct Graphs {
  cudaGraphExec_t exec[MAX_GPUS];
};

static void capture(const Lib* L, int coll, size_t count, int iters, Graphs* out) {
  for (int g = 0; g < n; g++)
    CUDA_CHECK(cudaStreamBeginCapture(gpus[g].stream, cudaStreamCaptureModeGlobal));
  issue_iters(L, coll, count, iters);
  cudaGraph_t graphs[MAX_GPUS];
  // Every capture ends before any instantiation: that is not allowed while one is capturing.
  for (int g = 0; g < n; g++) CUDA_CHECK(cudaStreamEndCapture(gpus[g].stream, &graphs[g]));
  for (int g = 0; g < n; g++) {
    CUDA_CHECK(cudaGraphInstantiateWithFlags(&out->exec[g], graphs[g], 0));
    CUDA_CHECK(cudaGraphDestroy(graphs[g]));
  }
}

static double time_graph(const Graphs* gr, int iters) {
  double t0 = now_us();
  for (int g = 0; g < n; g++) CUDA_CHECK(cudaGraphLaunch(gr->exec[g], gpus[g].stream));
  sync_all();
  return (now_us() - t0) / iters;
}

static void destroy_graphs(Graphs* gr) {
  for (int g = 0; g < n; g++) CUDA_CHECK(cudaGraphExecDestroy(gr->exec[g]));
}

// Runs the collective once on fresh inputs and poisoned outputs; returns the wrong elements.
static unsigned long long run_checked(const Lib* L, int coll, size_t count) {
  for (int g = 0; g < n; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    fill<<<1024, 256, 0, gpus[g].stream>>>(gpus[g].send, send_elems(coll, count), g);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemsetAsync(gpus[g].recv, 0xFF, recv_elems(coll, count) * 4, gpus[g].stream));
    CUDA_CHECK(cudaMemsetAsync(gpus[g].bad, 0, 8, gpus[g].stream));
  }
  sync_all();
  issue_iters(L, coll, count, 1);
  sync_all();
  unsigned long long total = 0;
  for (int g = 0; g < n; g++) {
    if ((coll == B_REDUCE || coll == B_GATHER) && g != 0) continue;  // only the root's output
    CUDA_CHECK(cudaSetDevice(g));
    check<<<1024, 256, 0, gpus[g].stream>>>(gpus[g].recv, recv_elems(coll, count), coll, g, n,
                                             count, gpus[g].bad);
    CUDA_CHECK(cudaGetLastError());
    unsigned long long bad;
    CUDA_CHECK(cudaMemcpyAsync(&bad, gpus[g].bad, 8, cudaMemcpyDeviceToHost, gpus[g].stream));
    CUDA_CHECK(cudaStreamSynchronize(gpus[g].stream));
    total += bad;
  }
  return total;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

struct Result {
  int coll, graph;
  size_t bytes, count;
  double time_us[2];  // [0] shim, [1] NCCL: medians of the rounds
  double ratio;       // median over rounds of shim / NCCL, each pair timed back to back
  double issue_us[2];  // eager: medians of the host's time to issue one iteration's calls
  std::vector<double> rounds[2], issue_rounds[2];
  unsigned long long wrong[2];
  int iters;
};

// Times shim and NCCL in alternating rounds (the order flips every round).
static void measure(Lib* libs, int coll, size_t count, int graph, int iters, Result* r) {
  Graphs gr[2];
  if (graph) {
    for (int l = 0; l < 2; l++) {
      capture(&libs[l], coll, count, iters, &gr[l]);
      time_graph(&gr[l], iters);  // warm-up replay
    }
  }
  for (int round = 0; round < opt.rounds; round++) {
    for (int k = 0; k < 2; k++) {
      int l = (round + k) % 2;
      double issue = 0;
      double t = graph ? time_graph(&gr[l], iters)
                       : time_eager(&libs[l], coll, count, iters, &issue);
      r->rounds[l].push_back(t);
      r->issue_rounds[l].push_back(issue);
    }
  }
  std::vector<double> ratios;
  for (int round = 0; round < opt.rounds; round++)
    ratios.push_back(r->rounds[0][round] / r->rounds[1][round]);
  r->ratio = median(ratios);
  for (int l = 0; l < 2; l++) {
    r->time_us[l] = median(r->rounds[l]);
    r->issue_us[l] = median(r->issue_rounds[l]);
    if (graph) destroy_graphs(&gr[l]);
  }
}

static void print_header(int coll, int graph, const Lib* libs) {
  printf("\n# %s, %d GPUs, %s, float %s, root 0; time: median of %d rounds\n", NAMES[coll], n,
         graph ? "CUDA graph" : "eager", reduces(coll) ? "sum" : "", opt.rounds);
  char a[32], b[32];
  snprintf(a, sizeof a, "%s(us)", libs[0].name);
  snprintf(b, sizeof b, "%s(us)", libs[1].name);
  printf("# %12s %12s %6s %6s | %10s %8s %8s %6s %8s | %10s %8s %8s %6s %8s | %6s\n",
         "size(B)", "count", "type", "redop", a, "algbw", "busbw", "#wrong", "issue", b, "algbw",
         "busbw", "#wrong", "issue", "ratio");
}

static void print_row(const Result* r) {
  double alg[2], bus[2];
  for (int l = 0; l < 2; l++) {
    alg[l] = r->bytes / r->time_us[l] / 1e3;  // GB/s
    bus[l] = alg[l] * busbw_factor(r->coll, n);
  }
  printf("  %12zu %12zu %6s %6s | %10.2f %8.2f %8.2f %6llu %8.2f | %10.2f %8.2f %8.2f %6llu "
         "%8.2f | %6.3f\n",
         r->bytes, r->count, "float", reduces(r->coll) ? "sum" : "none", r->time_us[0], alg[0],
         bus[0], r->wrong[0], r->issue_us[0], r->time_us[1], alg[1], bus[1], r->wrong[1],
         r->issue_us[1], r->ratio);
}

static void write_json(const char* path, const std::vector<Result>& results, const Lib* libs) {
  FILE* f = fopen(path, "w");
  if (!f) {
    perror(path);
    return;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  fprintf(f, "{\n  \"ngpus\": %d, \"gpu\": \"%s\", \"cuda_driver\": %d, \"cuda_runtime\": %d,\n",
          n, prop.name, driver, runtime);
  fprintf(f, "  \"shim\": {\"path\": \"%s\", \"version\": %d},\n", libs[0].path, libs[0].version);
  fprintf(f, "  \"nccl\": {\"path\": \"%s\", \"version\": %d},\n", libs[1].path, libs[1].version);
  fprintf(f, "  \"type\": \"float\", \"rounds\": %d, \"round_us\": %d, \"same\": %d,\n",
          opt.rounds, opt.round_us, opt.same);
  const char* core = getenv("NCCLSHIM_CORE");
  const char* tune = getenv("NCCLSHIM_TUNE");
  fprintf(f, "  \"env\": {\"NCCLSHIM_CORE\": \"%s\", \"NCCLSHIM_TUNE\": \"%s\"},\n  \"results\": [\n",
          core ? core : "", tune ? tune : "");
  for (size_t i = 0; i < results.size(); i++) {
    const Result* r = &results[i];
    fprintf(f, "    {\"coll\": \"%s\", \"mode\": \"%s\", \"bytes\": %zu, \"count\": %zu, "
               "\"iters\": %d, \"busbw_factor\": %.6f, \"ratio\": %.5f",
            NAMES[r->coll], r->graph ? "graph" : "eager", r->bytes, r->count, r->iters,
            busbw_factor(r->coll, n), r->ratio);
    for (int l = 0; l < 2; l++) {
      fprintf(f, ", \"%s\": {\"time_us\": %.4f, \"issue_us\": %.4f, \"wrong\": %llu, "
                 "\"rounds_us\": [",
              l ? "nccl" : "shim", r->time_us[l], r->issue_us[l], r->wrong[l]);
      for (size_t k = 0; k < r->rounds[l].size(); k++)
        fprintf(f, "%s%.4f", k ? ", " : "", r->rounds[l][k]);
      fprintf(f, "]}");
    }
    fprintf(f, "}%s\n", i + 1 < results.size() ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
}

static void parse_args(int argc, char** argv) {
  for (int c = 0; c < B_COUNT; c++) opt.colls[c] = 1;
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(a, "--same")) opt.same = 1, i--;
    else if (!strcmp(a, "--shim")) opt.shim = v;
    else if (!strcmp(a, "--real")) opt.real = v;
    else if (!strcmp(a, "--json")) opt.json = v;
    else if (!strcmp(a, "--ngpus")) opt.ngpus = atoi(v);
    else if (!strcmp(a, "--rounds")) opt.rounds = atoi(v);
    else if (!strcmp(a, "--round-us")) opt.round_us = atoi(v);
    else if (!strcmp(a, "--min-bytes")) opt.min_bytes = parse_bytes(v);
    else if (!strcmp(a, "--max-bytes")) opt.max_bytes = parse_bytes(v);
    else if (!strcmp(a, "--modes")) opt.eager = !!strstr(v, "eager"), opt.graph = !!strstr(v, "graph");
    else if (!strcmp(a, "--colls"))
      for (int c = 0; c < B_COUNT; c++) opt.colls[c] = !!strstr(v, NAMES[c]);
    else {
      fprintf(stderr, "unknown option %s: see the comment at the top of bench.cu\n", a);
      exit(2);
    }
  }
  if (opt.same) opt.shim = opt.real;
  if (!opt.shim || !opt.real || opt.shim[0] != '/' || opt.real[0] != '/') {
    fprintf(stderr, "give --shim and --real as absolute paths\n");
    exit(2);
  }
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  parse_args(argc, argv);
  // The shim forwards to exactly the library it is compared with.
  setenv("NCCLSHIM_REAL_NCCL", opt.real, 0);
  Lib libs[2];
  memset(libs, 0, sizeof libs);
  load(&libs[0], opt.same ? "A" : "ours", opt.shim);
  load(&libs[1], opt.same ? "B" : "nccl", opt.real);
  if (libs[0].AllReduce == libs[1].AllReduce && !opt.same) {
    fprintf(stderr, "both paths gave the same library: nothing to compare\n");
    return 2;
  }
  CUDA_CHECK(cudaGetDeviceCount(&n));
  if (opt.ngpus > 0 && opt.ngpus < n) n = opt.ngpus;
  if (n > MAX_GPUS) n = MAX_GPUS;
  for (int l = 0; l < 2; l++) NCCL_CALL(&libs[l], CommInitAll(libs[l].comms, n, NULL));
  for (int g = 0; g < n; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaStreamCreateWithFlags(&gpus[g].stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc(&gpus[g].send, opt.max_bytes));
    CUDA_CHECK(cudaMalloc(&gpus[g].recv, opt.max_bytes));
    CUDA_CHECK(cudaMalloc(&gpus[g].bad, 8));
  }
  // Bring the GPUs' clocks up before the first timed size.
  size_t warm_count = std::min(opt.max_bytes, (size_t)64 << 20) / 4;
  for (double t0 = now_us(); now_us() - t0 < 1e6;) time_eager(&libs[1], B_ALLREDUCE, warm_count, 5);

  std::vector<Result> results;
  int modes[2] = {opt.eager ? 0 : -1, opt.graph ? 1 : -1};
  for (int coll = 0; coll < B_COUNT; coll++) {
    if (!opt.colls[coll]) continue;
    for (int graph : modes) {
      if (graph < 0) continue;
      print_header(coll, graph, libs);
      size_t last_count = 0;
      for (size_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= 2) {
        size_t count = bytes / 4 / (per_rank_count(coll) ? n : 1);
        if (count == 0 || count == last_count) continue;
        last_count = count;
        Result r;
        r.coll = coll;
        r.graph = graph;
        r.count = count;
        r.bytes = count * 4 * (per_rank_count(coll) ? n : 1);
        for (int l = 0; l < 2; l++) r.wrong[l] = run_checked(&libs[l], coll, count);
        double guess = time_eager(&libs[1], coll, count, 3);
        r.iters = std::max(5, std::min(2000, (int)(opt.round_us / guess)));
        time_eager(&libs[0], coll, count, 3);  // same warm-up for both
        measure(libs, coll, count, graph, r.iters, &r);
        print_row(&r);
        results.push_back(r);
      }
    }
  }
  if (opt.json) write_json(opt.json, results, libs);
  for (int l = 0; l < 2; l++)
    for (int g = 0; g < n; g++) NCCL_CALL(&libs[l], CommDestroy(libs[l].comms[g]));
  return 0;
}
