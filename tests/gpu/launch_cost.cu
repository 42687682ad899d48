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
// - N threads launching on their own GPUs at the same time, per launch;
// - each driver call of the core's launch alone, then all of them together, one GPU;
// - the same kernel through a graph of one kernel node (as it is, its node set first, its end
//   marked by an event recorded after it or by an event-record node), and the GPU's time per
//   launch back to back, a kernel launch's (as the core's) against a graph's.
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

// The size of the core's fused packet-kernel arguments (comm.rs, `FusedKernelArgs`).
struct FusedParams {
  unsigned long long words[49];
};

__global__ void empty() {}
// Waits until the host sets *flag: the launches queued behind it then run back to back.
__global__ void gate(const volatile int* flag) {
  while (*flag == 0) {
  }
}

// Busy on the GPU for p.words[2] ns: the launches behind it wait in the stream's queue.
__global__ void busy(FusedParams p) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < p.words[2]);
}
__global__ void with_fused_params(FusedParams p) {
  if (p.words[0] == ~0ull) *(volatile unsigned long long*)p.words[1] = p.words[48];
}
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

// What the core asks the driver around each launch (comm.rs, `launch_with`), each call alone and
// then together, and a graph's launch instead (`launch_by_graph`), on `stream` of the current GPU.
static void core_launch_rows(cudaStream_t stream) {
  CUfunction f;
  CUDA_CHECK(cudaGetFuncBySymbol(&f, (const void*)with_fused_params));
  FusedParams p = {};
  void* params[] = {&p};
  CUevent ended;
  CU_CHECK(cuEventCreate(&ended, CU_EVENT_DISABLE_TIMING));
  // As the core launches on sm_90 and later (cuda::launch): early, in the remote domain.
  CUlaunchAttribute attributes[2] = {};
  attributes[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attributes[0].value.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN;
  attributes[1].value.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
  CUlaunchConfig config = {};
  config.gridDimX = 1;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 512;
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = stream;
  config.attrs = attributes;
  config.numAttrs = 2;
  CUstream s = stream;
  auto green = [&] {
    CUgreenCtx g = NULL;
    (void)cuStreamGetGreenCtx(s, &g);
  };
  auto capturing = [&] {
    CUstreamCaptureStatus status;
    CU_CHECK(cuStreamIsCapturing(s, &status));
  };
  auto current = [&] {
    CUcontext c;
    CU_CHECK(cuCtxGetCurrent(&c));
  };
  auto launch = [&] { CU_CHECK(cuLaunchKernelEx(&config, f, params, NULL)); };
  printf("cuLaunchKernel, the core's fused arguments %6.3f\n", per_call_us([&](int) {
           CU_CHECK(cuLaunchKernel(f, 1, 1, 1, 512, 1, 1, 0, s, params, NULL));
         }));
  auto launch_with = [&](CUlaunchAttribute* first, unsigned count) {
    CUlaunchConfig c = config;
    c.attrs = first;
    c.numAttrs = count;
    return per_call_us([&](int) { CU_CHECK(cuLaunchKernelEx(&c, f, params, NULL)); });
  };
  printf("cuLaunchKernelEx, the same, no attribute  %6.3f\n", launch_with(NULL, 0));
  printf("cuLaunchKernelEx, early launch            %6.3f\n", launch_with(attributes, 1));
  printf("cuLaunchKernelEx, remote domain           %6.3f\n", launch_with(attributes + 1, 1));
  printf("cuLaunchKernelEx, early, remote (the core) %6.3f\n", launch_with(attributes, 2));
  printf("cuEventRecord                             %6.3f\n", per_call_us([&](int) {
           CU_CHECK(cuEventRecord(ended, s));
         }));
  printf("cuStreamIsCapturing                       %6.3f\n", per_call_us([&](int) { capturing(); }));
  printf("cuStreamGetGreenCtx                       %6.3f\n", per_call_us([&](int) { green(); }));
  printf("cuCtxGetCurrent                           %6.3f\n", per_call_us([&](int) { current(); }));
  printf("cuLaunchKernelEx + cuEventRecord          %6.3f\n", per_call_us([&](int) {
           launch();
           CU_CHECK(cuEventRecord(ended, s));
         }));
  printf("the core's launch: all of the above       %6.3f\n", per_call_us([&](int) {
           current();
           green();
           capturing();
           launch();
           CU_CHECK(cuEventRecord(ended, s));
         }));
  // The same kernel as a graph of one node, launched whole: as is (the core's launch of the
  // same calls as the graph's last), and with its arguments set before each launch.
  {
    CUgraph graph;
    CU_CHECK(cuGraphCreate(&graph, 0));
    CUDA_KERNEL_NODE_PARAMS node_params = {};
    node_params.func = f;
    node_params.gridDimX = node_params.gridDimY = node_params.gridDimZ = 1;
    node_params.blockDimX = 512;
    node_params.blockDimY = node_params.blockDimZ = 1;
    node_params.kernelParams = params;
    CUgraphNode node;
    CU_CHECK(cuGraphAddKernelNode(&node, graph, NULL, 0, &node_params));
    CUgraphExec exec;
    CU_CHECK(cuGraphInstantiate(&exec, graph, 0));
    auto launch_as_is = [&](int) { CU_CHECK(cuGraphLaunch(exec, s)); };
    // New arguments each time, as a group on other buffers than the last one's.
    auto set_and_launch = [&](int i) {
      p.words[3] = i;
      CU_CHECK(cuGraphExecKernelNodeSetParams(exec, node, &node_params));
      CU_CHECK(cuGraphLaunch(exec, s));
    };
    printf("cuGraphLaunch, one kernel node            %6.3f\n", per_call_us(launch_as_is));
    printf("cuGraphExecKernelNodeSetParams + Launch   %6.3f\n", per_call_us(set_and_launch));
    // The core marks each launch's end for its next one on another stream (`StreamOrder`): with
    // an event recorded after the graph's launch, or by an event-record node of the graph.
    printf("cuGraphLaunch + cuEventRecord             %6.3f\n", per_call_us([&](int i) {
             launch_as_is(i);
             CU_CHECK(cuEventRecord(ended, s));
           }));
    CUgraph marking;
    CU_CHECK(cuGraphCreate(&marking, 0));
    CUgraphNode kernel_node, record_node;
    CU_CHECK(cuGraphAddKernelNode(&kernel_node, marking, NULL, 0, &node_params));
    CU_CHECK(cuGraphAddEventRecordNode(&record_node, marking, &kernel_node, 1, ended));
    CUgraphExec marking_exec;
    CU_CHECK(cuGraphInstantiate(&marking_exec, marking, 0));
    printf("cuGraphLaunch, kernel and event-record nodes %6.3f\n", per_call_us([&](int) {
             CU_CHECK(cuGraphLaunch(marking_exec, s));
           }));
    // The GPU's time per launch when launches wait in the queue, each kind run back to back
    // behind a gate the host opens once they are all queued.
    int* flag;
    CUDA_CHECK(cudaHostAlloc((void**)&flag, sizeof(int), cudaHostAllocMapped));
    int* flag_on_gpu;
    CUDA_CHECK(cudaHostGetDevicePointer((void**)&flag_on_gpu, flag, 0));
    cudaEvent_t opened, drained;
    CUDA_CHECK(cudaEventCreate(&opened));
    CUDA_CHECK(cudaEventCreate(&drained));
    auto gpu_us = [&](auto one) {
      std::vector<double> runs;
      for (int r = 0; r < 5; r++) {
        *(volatile int*)flag = 0;
        gate<<<1, 1, 0, stream>>>(flag_on_gpu);
        CUDA_CHECK(cudaEventRecord(opened, stream));
        for (int i = 0; i < BATCH; i++) one(i);
        CUDA_CHECK(cudaEventRecord(drained, stream));
        *(volatile int*)flag = 1;
        CUDA_CHECK(cudaEventSynchronize(drained));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, opened, drained));
        runs.push_back(ms * 1e3 / BATCH);
      }
      std::sort(runs.begin(), runs.end());
      return runs[runs.size() / 2];
    };
    printf("GPU us per launch, back to back: kernel launch (the core's) %6.3f\n",
           gpu_us([&](int) { launch(); }));
    printf("GPU us per launch, back to back: graph launch              %6.3f\n",
           gpu_us(set_and_launch));
    printf("GPU us per launch, back to back: graph launch as is        %6.3f\n",
           gpu_us(launch_as_is));
    printf("GPU us per launch, back to back: graph with event record   %6.3f\n",
           gpu_us([&](int) { CU_CHECK(cuGraphLaunch(marking_exec, s)); }));
    CU_CHECK(cuGraphExecDestroy(marking_exec));
    CU_CHECK(cuGraphDestroy(marking));
    CUDA_CHECK(cudaEventDestroy(opened));
    CUDA_CHECK(cudaEventDestroy(drained));
    CUDA_CHECK(cudaFreeHost(flag));
    CU_CHECK(cuGraphExecDestroy(exec));
    CU_CHECK(cuGraphDestroy(graph));
  }
  CUfunction slow;
  CUDA_CHECK(cudaGetFuncBySymbol(&slow, (const void*)busy));
  p.words[2] = 4000;
  printf("the core's launch, each kernel 4 us busy  %6.3f\n", per_call_us([&](int) {
           CU_CHECK(cuLaunchKernelEx(&config, slow, params, NULL));
           CU_CHECK(cuEventRecord(ended, s));
         }));
  CU_CHECK(cuEventDestroy(ended));
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

  core_launch_rows(streams[0]);

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
