// What a CUDA graph of small calls costs on its first launch, against its next ones: one process
// driving every GPU, a graph of CALLS calls per GPU (each in a group across the GPUs, as
// nccl-tests -g captures them), through the shim and through NCCL alternately in one run.
//   graph_launch --shim DIR/libnccl.so.2 --real DIR/libnccl.so.2 [--ngpus 2] [--calls 20]
//                [--trials 7] [--sizes 8,4K] [--limit 1.05]
// Prints per collective (all-reduce, all-gather) and size the median over trials of the time per
// call, in us: eager (CALLS calls and the GPUs' catching up), an explicit cudaGraphUpload, the
// first launch of a graph uploaded so, the first launch of one not uploaded (which uploads it),
// its second launch, and ten more launches. nccl-tests -G 1 times one launch of a graph it has
// not uploaded, so the upload shows there. Exits 1 where a shim's launch (first, second, ten
// more) takes more than LIMIT x NCCL's.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

#include "cuda_check.h"
#include "nccl_lib.h"

static struct {
  const char *shim = NULL, *real = NULL;
  int ngpus = 2, calls = 20, trials = 7;
  double limit = 1.05;
  std::vector<size_t> sizes{8, 4 << 10};
} opt;

enum { LIB_REAL, LIB_SHIM, LIBS };
enum Collective { ALL_REDUCE, ALL_GATHER };
static const char* const COLLECTIVES[] = {"all_reduce", "all_gather"};
// What each trial times, per call.
enum Stage { EAGER, UPLOAD, FIRST_UPLOADED, FIRST, SECOND, REPLAYED, STAGES };
static const char* const STAGE_NAMES[] = {"eager", "upload", "first (uploaded)", "first", "second", "replayed"};

static double now_us() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static cudaStream_t streams[LIB_MAX_GPUS];
// Per GPU: the input (the largest size's bytes) and the output (every rank's chunk).
static float* inputs[LIB_MAX_GPUS];
static float* outputs[LIB_MAX_GPUS];

static size_t largest_size() { return *std::max_element(opt.sizes.begin(), opt.sizes.end()); }

// `calls` calls of `collective`, each in a group across the GPUs.
static void issue(Lib* lib, Collective collective, size_t bytes) {
  const size_t count = std::max<size_t>(bytes / sizeof(float), 1);
  for (int k = 0; k < opt.calls; k++) {
    NCCL_CALL(lib, GroupStart());
    for (int g = 0; g < opt.ngpus; g++) {
      const float* in = inputs[g];
      float* out = outputs[g];
      if (collective == ALL_REDUCE) {
        NCCL_CALL(lib, AllReduce(in, out, count, ncclFloat, ncclSum, lib->comms[g], streams[g]));
      } else {
        NCCL_CALL(lib, AllGather(in, out, count, ncclFloat, lib->comms[g], streams[g]));
      }
    }
    NCCL_CALL(lib, GroupEnd());
  }
}

static void synchronize() {
  for (int g = 0; g < opt.ngpus; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaStreamSynchronize(streams[g]));
  }
}

// One graph per GPU of the calls `issue` makes.
static void capture(Lib* lib, Collective collective, size_t bytes, cudaGraphExec_t* execs) {
  cudaGraph_t graphs[LIB_MAX_GPUS];
  for (int g = 0; g < opt.ngpus; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaStreamBeginCapture(streams[g], cudaStreamCaptureModeThreadLocal));
  }
  issue(lib, collective, bytes);
  // Every capture ends before any graph is instantiated: not while a stream captures.
  for (int g = 0; g < opt.ngpus; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaStreamEndCapture(streams[g], &graphs[g]));
  }
  for (int g = 0; g < opt.ngpus; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaGraphInstantiate(&execs[g], graphs[g], 0));
    CUDA_CHECK(cudaGraphDestroy(graphs[g]));
  }
}

// Wall time of `launches` launches of the graphs and the GPUs' catching up, per call.
static double launch(cudaGraphExec_t* execs, int launches) {
  double t0 = now_us();
  for (int l = 0; l < launches; l++) {
    for (int g = 0; g < opt.ngpus; g++) {
      CUDA_CHECK(cudaSetDevice(g));
      CUDA_CHECK(cudaGraphLaunch(execs[g], streams[g]));
    }
  }
  synchronize();
  return (now_us() - t0) / ((double)launches * opt.calls);
}

static void destroy(cudaGraphExec_t* execs) {
  for (int g = 0; g < opt.ngpus; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaGraphExecDestroy(execs[g]));
  }
}

// One trial's time per call of each stage.
static void trial(Lib* lib, Collective collective, size_t bytes, double* stage) {
  double t0 = now_us();
  issue(lib, collective, bytes);
  synchronize();
  stage[EAGER] = (now_us() - t0) / opt.calls;
  cudaGraphExec_t uploaded[LIB_MAX_GPUS], fresh[LIB_MAX_GPUS];
  capture(lib, collective, bytes, uploaded);
  capture(lib, collective, bytes, fresh);
  t0 = now_us();
  for (int g = 0; g < opt.ngpus; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaGraphUpload(uploaded[g], streams[g]));
  }
  synchronize();
  stage[UPLOAD] = (now_us() - t0) / opt.calls;
  stage[FIRST_UPLOADED] = launch(uploaded, 1);
  stage[FIRST] = launch(fresh, 1);
  stage[SECOND] = launch(fresh, 1);
  stage[REPLAYED] = launch(fresh, 10);
  destroy(uploaded);
  destroy(fresh);
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static void parse(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--shim") && v) opt.shim = argv[++i];
    else if (!strcmp(a, "--real") && v) opt.real = argv[++i];
    else if (!strcmp(a, "--ngpus") && v) opt.ngpus = atoi(argv[++i]);
    else if (!strcmp(a, "--calls") && v) opt.calls = atoi(argv[++i]);
    else if (!strcmp(a, "--trials") && v) opt.trials = atoi(argv[++i]);
    else if (!strcmp(a, "--limit") && v) opt.limit = atof(argv[++i]);
    else if (!strcmp(a, "--sizes") && v) {
      opt.sizes.clear();
      const char* s = argv[++i];
      while (*s) {
        opt.sizes.push_back(parse_bytes(s, &s));
        if (*s == ',') s++;
        else if (*s) break;
      }
    } else {
      fprintf(stderr, "usage: graph_launch --shim LIB --real LIB [--ngpus N] [--calls N] [--trials N] "
                      "[--sizes 8,4K] [--limit 1.05]\n");
      exit(2);
    }
  }
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (!opt.shim || !opt.real || opt.ngpus < 2 || opt.ngpus > std::min(devices, LIB_MAX_GPUS) || opt.calls < 1 ||
      opt.trials < 1 || opt.sizes.empty() || largest_size() == 0) {
    fprintf(stderr, "graph_launch: --shim, --real, 2 to %d GPUs, and positive calls, trials and sizes\n",
            std::min(devices, LIB_MAX_GPUS));
    exit(2);
  }
}

int main(int argc, char** argv) {
  parse(argc, argv);
  Lib libs[LIBS];
  load(&libs[LIB_REAL], "nccl", opt.real);
  load(&libs[LIB_SHIM], "shim", opt.shim);
  int devices[LIB_MAX_GPUS];
  for (int g = 0; g < opt.ngpus; g++) {
    devices[g] = g;
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking));
    const size_t bytes = std::max(largest_size(), sizeof(float));
    CUDA_CHECK(cudaMalloc(&inputs[g], bytes));
    CUDA_CHECK(cudaMalloc(&outputs[g], bytes * opt.ngpus));
    CUDA_CHECK(cudaMemset(inputs[g], 0, bytes));
  }
  for (Lib& lib : libs) NCCL_CALL(&lib, CommInitAll(lib.comms, opt.ngpus, devices));
  printf("# %d GPUs, one process, graphs of %d calls per GPU, median of %d trials, us per call\n", opt.ngpus,
         opt.calls, opt.trials);
  printf("%-10s %8s %-4s", "collective", "bytes", "lib");
  for (const char* name : STAGE_NAMES) printf(" %17s", name);
  printf("\n");
  int slower = 0;
  for (Collective collective : {ALL_REDUCE, ALL_GATHER}) {
    for (size_t bytes : opt.sizes) {
      double med[LIBS][STAGES];
      std::vector<double> got[LIBS][STAGES];
      for (Lib& lib : libs) {  // warm: the first calls of a size set things up
        issue(&lib, collective, bytes);
        synchronize();
      }
      for (int t = 0; t < opt.trials; t++) {
        for (int l = 0; l < LIBS; l++) {  // alternately
          double stage[STAGES];
          trial(&libs[l], collective, bytes, stage);
          for (int s = 0; s < STAGES; s++) got[l][s].push_back(stage[s]);
        }
      }
      for (int l = 0; l < LIBS; l++) {
        printf("%-10s %8zu %-4s", COLLECTIVES[collective], bytes, libs[l].name);
        for (int s = 0; s < STAGES; s++) printf(" %17.2f", med[l][s] = median(got[l][s]));
        printf("\n");
      }
      for (Stage s : {FIRST, SECOND, REPLAYED}) {
        if (med[LIB_SHIM][s] > opt.limit * med[LIB_REAL][s]) {
          printf("SLOWER: %s of %zu B, %s launch: %.2f us a call against NCCL's %.2f\n", COLLECTIVES[collective],
                 bytes, STAGE_NAMES[s], med[LIB_SHIM][s], med[LIB_REAL][s]);
          slower++;
        }
      }
    }
  }
  for (Lib& lib : libs) {
    for (int g = 0; g < opt.ngpus; g++) NCCL_CALL(&lib, CommDestroy(lib.comms[g]));
  }
  for (int g = 0; g < opt.ngpus; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaFree(inputs[g]));
    CUDA_CHECK(cudaFree(outputs[g]));
    CUDA_CHECK(cudaStreamDestroy(streams[g]));
  }
  printf("# %s\n", slower ? "the shim slower somewhere" : "the shim never slower");
  return slower ? 1 : 0;
}
