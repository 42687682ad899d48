// What the host pays to launch work, one thread driving every GPU: the floor under the shim's
// eager times. Prints the median host time of one call, in batches that never fill the launch
// queue (each batch is synchronised outside the timing):
//   launch_cost --real DIR/libnccl.so.2 [--ngpus N]
// - cudaLaunchKernel and cuLaunchKernel of an empty kernel, one GPU;
// - cuLaunchKernel of a kernel with the core's parameters (168 bytes), one GPU;
// - the same, every GPU in turn, each launch inside cuCtxPushCurrent/cuCtxPopCurrent (as the shim);
// - the real NCCL's ncclGroupStart + ncclGroupEnd with nothing inside;
// - one launch on every GPU, per call: by the one thread in turn, and by the thread together
//   with one spinning helper thread per other GPU (each launches on its own GPU at once);
// - N threads launching on their own GPUs at the same time, per launch.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "cuda_check.h"

#define MAX_GPUS 16
#define BATCH 200
#define BATCHES 51

#define CU_CHECK(call)                                                                 \
  do {                                                                                 \
    CUresult e_ = (call);                                                              \
    if (e_ != CUDA_SUCCESS) {                                                          \
      fprintf(stderr, "%s:%d: %s: error %d\n", __FILE__, __LINE__, #call, (int)e_);    \
      exit(2);                                                                         \
    }                                                                                  \
  } while (0)

struct CoreParams {  // the shape of the core's kernel parameters: 16 pointers, then scalars
  unsigned long long peers[16];
};

__global__ void empty() {}
__global__ void with_params(CoreParams peers, int rank, int nranks, const float* in, float* out,
                            unsigned long long count, unsigned long long half,
                            const volatile int* abort) {
  if (count == ~0ull) out[0] = in[0] + peers.peers[rank] + nranks + half + *abort;
}

static double now_us() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int n;
static cudaStream_t streams[MAX_GPUS];
static CUcontext contexts[MAX_GPUS];

static void sync_all() {
  for (int g = 0; g < n; g++) CUDA_CHECK(cudaStreamSynchronize(streams[g]));
}

// The median over batches of the host time per call of `one` (called with the call's index).
template <typename F>
static double per_call_us(F one) {
  std::vector<double> batches;
  for (int b = 0; b < BATCHES; b++) {
    double t0 = now_us();
    for (int i = 0; i < BATCH; i++) one(i);
    batches.push_back((now_us() - t0) / BATCH);
    sync_all();
  }
  std::sort(batches.begin(), batches.end());
  return batches[BATCHES / 2];
}

int main(int argc, char** argv) {
  const char* real = NULL;
  int want = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--real")) real = argv[i + 1];
    if (!strcmp(argv[i], "--ngpus")) want = atoi(argv[i + 1]);
  }
  if (!real) {
    fprintf(stderr, "usage: launch_cost --real DIR/libnccl.so.2 [--ngpus N]\n");
    return 2;
  }
  CUDA_CHECK(cudaGetDeviceCount(&n));
  if (want > 0 && want < n) n = want;
  if (n > MAX_GPUS) n = MAX_GPUS;
  std::vector<void*> buffers(n);
  // A kernel's CUfunction is its context's: one per GPU.
  std::vector<CUfunction> f_empty(n), f_params(n);
  for (int g = 0; g < n; g++) {
    CUDA_CHECK(cudaSetDevice(g));
    CUDA_CHECK(cudaGetFuncBySymbol(&f_empty[g], (const void*)empty));
    CUDA_CHECK(cudaGetFuncBySymbol(&f_params[g], (const void*)with_params));
    CUDA_CHECK(cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc(&buffers[g], 64));
    CUDA_CHECK(cudaMemset(buffers[g], 0, 64));
    CU_CHECK(cuCtxGetCurrent(&contexts[g]));
    empty<<<1, 1, 0, streams[g]>>>();  // loads the module on every GPU
  }
  CUDA_CHECK(cudaSetDevice(0));
  sync_all();

  CoreParams peers = {};
  int rank = 0, nranks = n;
  const float* in = (const float*)buffers[0];
  float* out = (float*)buffers[0];
  unsigned long long count = 1, half = 16 << 20;
  const volatile int* abort = (const volatile int*)buffers[0];
  void* params[] = {&peers, &rank, &nranks, &in, &out, &count, &half, &abort};

  printf("# host time per call, us (median of %d batches of %d), %d GPUs\n", BATCHES, BATCH, n);
  printf("cudaLaunchKernel empty, 1 GPU            %6.3f\n", per_call_us([&](int) {
           empty<<<1, 512, 0, streams[0]>>>();
         }));
  printf("cuLaunchKernel empty, 1 GPU              %6.3f\n", per_call_us([&](int) {
           CU_CHECK(cuLaunchKernel(f_empty[0], 1, 1, 1, 512, 1, 1, 0, streams[0], NULL, NULL));
         }));
  printf("cuLaunchKernel core params, 1 GPU        %6.3f\n", per_call_us([&](int) {
           CU_CHECK(cuLaunchKernel(f_params[0], 1, 1, 1, 512, 1, 1, 0, streams[0], params, NULL));
         }));
  printf("cuCtxPush+cuLaunchKernel+Pop, GPUs in turn %6.3f\n", per_call_us([&](int i) {
           int g = i % n;
           CU_CHECK(cuCtxPushCurrent(contexts[g]));
           in = out = (float*)buffers[g];
           CU_CHECK(cuLaunchKernel(f_params[g], 1, 1, 1, 512, 1, 1, 0, streams[g], params, NULL));
           CUcontext popped;
           CU_CHECK(cuCtxPopCurrent(&popped));
         }));
  printf("cuCtxSetCurrent+cuLaunchKernel, GPUs in turn %6.3f\n", per_call_us([&](int i) {
           int g = i % n;
           CU_CHECK(cuCtxSetCurrent(contexts[g]));
           in = out = (float*)buffers[g];
           CU_CHECK(cuLaunchKernel(f_params[g], 1, 1, 1, 512, 1, 1, 0, streams[g], params, NULL));
         }));

  // One launch per GPU per call: the thread in turn, then with helpers launching alongside.
  auto launch_on = [&](int g, void** p) {
    CU_CHECK(cuLaunchKernel(f_params[g], 1, 1, 1, 512, 1, 1, 0, streams[g], p, NULL));
  };
  printf("one launch per GPU, one thread in turn    %6.3f\n", per_call_us([&](int) {
           for (int g = 0; g < n; g++) {
             CU_CHECK(cuCtxSetCurrent(contexts[g]));
             launch_on(g, params);
           }
         }));
  {
    std::atomic<unsigned> posted{0}, done{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> helpers;
    for (int g = 1; g < n; g++)
      helpers.emplace_back([&, g] {
        CU_CHECK(cuCtxSetCurrent(contexts[g]));
        CoreParams p_peers = {};
        int p_rank = g, p_nranks = n;
        const float* p_in = (const float*)buffers[g];
        float* p_out = (float*)buffers[g];
        void* p[] = {&p_peers, &p_rank, &p_nranks, &p_in, &p_out, &count, &half, &abort};
        unsigned seen = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          unsigned now = posted.load(std::memory_order_acquire);
          if (now == seen) continue;
          seen = now;
          launch_on(g, p);
          done.fetch_add(1, std::memory_order_release);
        }
      });
    CU_CHECK(cuCtxSetCurrent(contexts[0]));
    unsigned calls = 0;
    printf("one launch per GPU, with %d helper threads %6.3f\n", n - 1, per_call_us([&](int) {
             calls++;
             posted.store(calls, std::memory_order_release);
             launch_on(0, params);
             while (done.load(std::memory_order_acquire) != calls * (unsigned)(n - 1)) {
             }
           }));
    stop = true;
    for (auto& t : helpers) t.join();
  }
  {
    std::vector<double> per_launch(n);
    std::vector<std::thread> threads;
    std::atomic<int> ready{0};
    for (int g = 0; g < n; g++)
      threads.emplace_back([&, g] {
        CU_CHECK(cuCtxSetCurrent(contexts[g]));
        ready++;
        while (ready.load() < n) {
        }
        double t0 = now_us();
        for (int i = 0; i < BATCH; i++) launch_on(g, params);
        per_launch[g] = (now_us() - t0) / BATCH;
      });
    for (auto& t : threads) t.join();
    sync_all();
    printf("cuLaunchKernel, %d threads at once, per launch %6.3f (slowest thread)\n", n,
           *std::max_element(per_launch.begin(), per_launch.end()));
  }

  void* h = dlopen(real, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen %s: %s\n", real, dlerror());
    return 2;
  }
  auto group_start = (decltype(&ncclGroupStart))dlsym(h, "ncclGroupStart");
  auto group_end = (decltype(&ncclGroupEnd))dlsym(h, "ncclGroupEnd");
  if (!group_start || !group_end) {
    fprintf(stderr, "%s lacks ncclGroupStart/End\n", real);
    return 2;
  }
  printf("cuCtxGetCurrent+cuCtxPush+cuCtxPop        %6.3f\n", per_call_us([&](int i) {
           CUcontext current, popped;
           CU_CHECK(cuCtxGetCurrent(&current));
           CU_CHECK(cuCtxPushCurrent(contexts[i % n]));
           CU_CHECK(cuCtxPopCurrent(&popped));
         }));
  printf("real ncclGroupStart+ncclGroupEnd, empty  %6.3f\n", per_call_us([&](int) {
           if (group_start() != ncclSuccess || group_end() != ncclSuccess) exit(3);
         }));
  return 0;
}
