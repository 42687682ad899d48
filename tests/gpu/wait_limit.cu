// A rank that never comes: the core's kernels must give up after NCCLSHIM_TIMEOUT seconds and
// say so, never hang. One process drives 2 GPUs (ncclCommInitAll); for each of the core's
// kernel families (sentinel, low-latency, one-shot, direct two-shot, by type and size), rank 0
// issues an all-reduce that rank 1 never issues. Checked, under the shim with NCCLSHIM_TIMEOUT=3
// and NCCLSHIM_CORE=force:
//   - rank 0's stream is done within the limit and a margin (the kernel gave up);
//   - ncclCommGetAsyncError then reports ncclRemoteError, and the next all-reduce fails with it;
//   - ncclCommAbort of both returns, and new communicators on the same GPUs all-reduce right.
// Then a rank that comes late, after its peer gave up: rank 0 issues two direct all-reduces, the
// first gives up waiting for rank 1 and the second runs on at once; rank 1's first all-reduce
// then finds rank 0 on a later call. It must give up at once, not wait out its own limit (nor go
// on with the buffers of rank 0's later call), and ncclCommGetAsyncError must report it.
// The WARNs that name the communicator, the rank and the peer are checked by run.sh in the log.
//   wait_limit [--limit S]
// Prints "PASS <case> ..." or "FAIL <case> <why>" per case; exits 1 if any failed.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_check.h"
#include "nccl_check.h"

static double now() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

struct Case {
  const char* name;
  ncclDataType_t type;
  size_t count;
};

// A correct all-reduce of `count` floats on both ranks: whether every element is 1 + 2.
static int all_reduce_right(ncclComm_t* comms, size_t count) {
  float* bufs[2];
  cudaStream_t streams[2];
  for (int r = 0; r < 2; r++) {
    CUDA_CHECK(cudaSetDevice(r));
    CUDA_CHECK(cudaMalloc((void**)&bufs[r], count * sizeof(float)));
    CUDA_CHECK(cudaStreamCreate(&streams[r]));
    float* host = (float*)malloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) host[i] = (float)(r + 1);
    CUDA_CHECK(cudaMemcpy(bufs[r], host, count * sizeof(float), cudaMemcpyHostToDevice));
    free(host);
  }
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; r++) {
    NCCL_OK(ncclAllReduce(bufs[r], bufs[r], count, ncclFloat, ncclSum, comms[r], streams[r]));
  }
  NCCL_OK(ncclGroupEnd());
  int right = 1;
  float* host = (float*)malloc(count * sizeof(float));
  for (int r = 0; r < 2; r++) {
    CUDA_CHECK(cudaSetDevice(r));
    CUDA_CHECK(cudaStreamSynchronize(streams[r]));
    CUDA_CHECK(cudaMemcpy(host, bufs[r], count * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; i++) right &= host[i] == 3.0f;
    CUDA_CHECK(cudaFree(bufs[r]));
    CUDA_CHECK(cudaStreamDestroy(streams[r]));
  }
  free(host);
  return right;
}

// The late rank (see the top): "" where it gave up at once and said so, else why not.
static void late_peer_gives_up_at_once(const int* devices, double limit, char* why, size_t n, double* took) {
  ncclComm_t comms[2];
  NCCL_OK(ncclCommInitAll(comms, 2, devices));
  const size_t count = 16 << 20;  // 64 MiB of floats: the direct two-shot, in one process
  float* bufs[2];
  cudaStream_t streams[2];
  for (int r = 0; r < 2; r++) {
    CUDA_CHECK(cudaSetDevice(r));
    CUDA_CHECK(cudaMalloc((void**)&bufs[r], count * sizeof(float)));
    CUDA_CHECK(cudaMemset(bufs[r], 0, count * sizeof(float)));
    CUDA_CHECK(cudaStreamCreate(&streams[r]));
  }
  *took = 0;
  CUDA_CHECK(cudaSetDevice(0));
  for (int k = 0; k < 2; k++) NCCL_OK(ncclAllReduce(bufs[0], bufs[0], count, ncclFloat, ncclSum, comms[0], streams[0]));
  cudaError_t synced0 = cudaStreamSynchronize(streams[0]);
  CUDA_CHECK(cudaSetDevice(1));
  double start = now();
  ncclResult_t issued = ncclAllReduce(bufs[1], bufs[1], count, ncclFloat, ncclSum, comms[1], streams[1]);
  cudaError_t synced1 = cudaStreamSynchronize(streams[1]);
  *took = now() - start;
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comms[1], &async));
  if (synced0 != cudaSuccess || synced1 != cudaSuccess) {
    snprintf(why, n, "a stream failed: %s, %s", cudaGetErrorString(synced0), cudaGetErrorString(synced1));
  } else if (issued != ncclSuccess) {
    snprintf(why, n, "rank 1's all-reduce returned %s", ncclGetErrorString(issued));
  } else if (*took > limit / 2) {
    snprintf(why, n, "rank 1 waited %.1f s for a call rank 0 had left (limit %.0f s)", *took, limit);
  } else if (async != ncclRemoteError) {
    snprintf(why, n, "rank 1's ncclCommGetAsyncError gave %s, not ncclRemoteError", ncclGetErrorString(async));
  }
  sleep(2);  // the watcher's WARNs, for run.sh to find in the log
  for (int r = 0; r < 2; r++) {
    ncclResult_t aborted = ncclCommAbort(comms[r]);
    if (!why[0] && aborted != ncclSuccess) snprintf(why, n, "ncclCommAbort returned %s", ncclGetErrorString(aborted));
  }
  for (int r = 0; r < 2; r++) {
    CUDA_CHECK(cudaSetDevice(r));
    CUDA_CHECK(cudaStreamDestroy(streams[r]));
    CUDA_CHECK(cudaFree(bufs[r]));
  }
}

int main(int argc, char** argv) {
  double limit = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--limit")) limit = atof(argv[i + 1]);
  }
  // Every case under one deadline: a hang ends the process (and run.sh's verdict).
  alarm((unsigned)(60 + 8 * limit * 5));
  const Case cases[] = {
      {"sentinel-float-8K", ncclFloat, 2048},
      {"lowlatency-int32-64K", ncclInt32, 16384},
      {"oneshot-float-1M", ncclFloat, 262144},
      {"twoshot-float-64M", ncclFloat, 16 << 20},
  };
  int devices[2] = {0, 1}, failed = 0;
  for (const Case& c : cases) {
    ncclComm_t comms[2];
    NCCL_OK(ncclCommInitAll(comms, 2, devices));
    CUDA_CHECK(cudaSetDevice(0));
    void* buf;
    size_t bytes = c.count * 4;  // float and int32
    CUDA_CHECK(cudaMalloc(&buf, bytes));
    CUDA_CHECK(cudaMemset(buf, 0, bytes));
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    char why[256] = "";
    // Rank 0 alone: rank 1 never comes.
    double start = now();
    ncclResult_t issued = ncclAllReduce(buf, buf, c.count, c.type, ncclSum, comms[0], stream);
    cudaError_t synced = cudaStreamSynchronize(stream);
    double waited = now() - start;
    if (issued != ncclSuccess) {
      snprintf(why, sizeof why, "the lone all-reduce returned %s", ncclGetErrorString(issued));
    } else if (synced != cudaSuccess) {
      snprintf(why, sizeof why, "the stream failed: %s", cudaGetErrorString(synced));
    } else if (waited > limit + 5) {
      snprintf(why, sizeof why, "the kernel waited %.1f s, past the limit of %.0f s", waited, limit);
    }
    // The watcher notices within a second; ncclCommGetAsyncError asks at once.
    ncclResult_t async = ncclSuccess;
    if (!why[0]) {
      NCCL_OK(ncclCommGetAsyncError(comms[0], &async));
      ncclResult_t next = ncclAllReduce(buf, buf, c.count, c.type, ncclSum, comms[0], stream);
      if (async != ncclRemoteError) {
        snprintf(why, sizeof why, "ncclCommGetAsyncError gave %s, not ncclRemoteError", ncclGetErrorString(async));
      } else if (next != ncclRemoteError) {
        snprintf(why, sizeof why, "the next all-reduce returned %s, not ncclRemoteError", ncclGetErrorString(next));
      }
    }
    sleep(2);  // the watcher's WARN, for run.sh to find in the log
    double abort_start = now();
    ncclResult_t aborted0 = ncclCommAbort(comms[0]);
    ncclResult_t aborted1 = ncclCommAbort(comms[1]);
    double abort_took = now() - abort_start;
    if (!why[0] && (aborted0 != ncclSuccess || aborted1 != ncclSuccess)) {
      snprintf(why, sizeof why, "ncclCommAbort returned %s and %s", ncclGetErrorString(aborted0),
               ncclGetErrorString(aborted1));
    }
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaStreamDestroy(stream));
    CUDA_CHECK(cudaFree(buf));
    // The GPUs serve the next communicators.
    ncclComm_t fresh[2];
    NCCL_OK(ncclCommInitAll(fresh, 2, devices));
    if (!why[0] && !all_reduce_right(fresh, c.count)) snprintf(why, sizeof why, "new communicators all-reduce wrong");
    for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(fresh[r]));
    if (why[0]) {
      printf("FAIL %s %s\n", c.name, why);
      failed++;
    } else {
      printf("PASS %s gave up after %.2f s (limit %.0f s), async error %s, abort %.2f s\n", c.name, waited, limit,
             ncclGetErrorString(async), abort_took);
    }
    fflush(stdout);
  }
  char why[256] = "";
  double took = 0;
  late_peer_gives_up_at_once(devices, limit, why, sizeof why, &took);
  if (why[0]) {
    printf("FAIL late-peer %s\n", why);
    failed++;
  } else {
    printf("PASS late-peer rank 1 found rank 0 on a later call and gave up after %.2f s (limit %.0f s)\n", took, limit);
  }
  return failed ? 1 : 0;
}
