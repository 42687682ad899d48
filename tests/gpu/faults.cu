// Faults the shim must survive on 2 GPUs: each case fails if a call hangs past its deadline,
// a result is wrong, or resources leak. Run through the shim with NCCLSHIM_CORE=force (every
// all-reduce on the core's kernels) and a wait limit (NCCLSHIM_TIMEOUT) far above the deadlines
// here, so that what ends a wait is the abort under test, not the limit.
//   faults CASE [--cycles N] [--budget SECONDS] [--parent-all-gathers 0|1] [--child-all-reduce 0|1]
//               [--empty-group 0|1] [--nonblocking 0|1]
// Cases:
//   abort-while-waiting  rank 0 all-reduces alone (rank 1 never comes); another thread aborts
//                        rank 0's communicator: the abort returns, the waiting stream finishes,
//                        rank 1's communicator is destroyed (ncclCommDestroy after the abort),
//                        and new communicators on the same GPUs all-reduce right.
//   destroy-after-revoke rank 0 waits alone as above; both communicators are revoked
//                        (ncclCommRevoke, 2.28+; SKIP before), settle, and are destroyed.
//   one-rank-launch-fails  rank 0's large all-reduce fails to launch (GPU 1's stream), rank 1's
//                        is launched and meets rank 0's next, smaller one: nothing past that
//                        one's output is written, the streams end within the wait limit
//                        (NCCLSHIM_TIMEOUT, short in this case), new communicators right.
//   counts-differ        the same without the failed launch: the ranks' all-reduces differ in
//                        count (each call's tag takes them to the staged path).
//   two-streams          each rank issues two all-reduces of one communicator on two streams
//                        with no dependency between them, every size family, 200 rounds: all
//                        right (NCCL orders a communicator's operations whatever the streams).
//   kill-rank            one process per GPU; rank 1 is killed (SIGKILL) in the middle of an
//                        all-reduce loop; rank 0's watchdog thread aborts its communicator: the
//                        abort returns, the process exits, and a new pair of processes
//                        all-reduces right on the same GPUs.
//   leak-one-process     N create/all-reduce/destroy cycles (ncclCommInitAll) in one process,
//   leak-procs           and with one process per GPU (ncclCommInitRank): host RSS (and the heap
//                        in use), GPU memory in use, threads, file descriptors and the shim's own
//                        device buffers and peer mappings (read from its INFO line at each release, in
//                        NCCL_DEBUG_FILE) printed at cycles 0, 1, 10, 100, 1k, 10k and the last,
//                        and checked flat from cycle 10 on. --budget ends the cycles early.
//   leak-split-one-process, leak-split-procs: the same, each communicator split from one made
//                        first (ncclCommSplit: the core set up and released each cycle, without
//                        NCCL's whole init, which costs about half a second a cycle).
//                        --parent-all-gathers 1 (one process): after each split, two grouped
//                        all-gathers on the parents, as the shim's set-up makes there: a control
//                        for NCCL alone. --child-all-reduce 0 (one process): the children run
//                        no collective (as under the shim, whose core takes their all-reduces,
//                        NCCL runs none on them): a control for NCCL alone. --empty-group 1
//                        (one process): each cycle also opens and closes a group with no call
//                        in it, which is what NCCL sees of the children's grouped all-reduce
//                        when the shim's core takes it: a control for NCCL alone.
//                        --nonblocking 1 (leak-procs): each communicator nonblocking (blocking=0,
//                        waited for with ncclCommGetAsyncError), set up after its first all-reduce.
//   leak-groups          one process, two communicators made once (ncclCommInitAll), then N
//                        groups as a training loop issues them, each of one small all-reduce per
//                        communicator (--empty-group 1: of nothing, a control for NCCL alone):
//                        the heap in use may grow by at most 16 bytes a group from group 10,000
//                        to the last (the core takes the all-reduces, so NCCL's own group holds
//                        nothing; NCCL 2.28.9 keeps about 190 bytes of each empty group).
// Prints "PASS <case> ..." or "FAIL <case> <why>" (leak cases: "STATS" lines); exits 1 on FAIL.
#include <cuda_runtime.h>
#include <dirent.h>
#include <dlfcn.h>
#include <malloc.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <vector>

#include "cuda_check.h"
#include "nccl_check.h"
#include "mapped_nccl.h"


static const int kDevices[2] = {0, 1};
// Longest any single step may take before the case counts as hung.
static const double kDeadline = 20;

static double now() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int verdict(const char* name, const char* why, const char* fmt, ...) {
  if (why[0]) {
    printf("FAIL %s %s\n", name, why);
  } else {
    char details[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(details, sizeof details, fmt, args);
    va_end(args);
    printf("PASS %s %s\n", name, details);
  }
  fflush(stdout);
  return why[0] ? 1 : 0;
}

// --- Buffers: rank r holds r + 1 everywhere, so a sum over 2 ranks is 3 ---

struct RankBuf {
  float* data;
  size_t count;
};

static RankBuf rank_buf(int device, size_t count, float value) {
  CUDA_CHECK(cudaSetDevice(device));
  RankBuf b = {nullptr, count};
  CUDA_CHECK(cudaMalloc((void**)&b.data, count * sizeof(float)));
  float* host = (float*)malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) host[i] = value;
  CUDA_CHECK(cudaMemcpy(b.data, host, count * sizeof(float), cudaMemcpyHostToDevice));
  free(host);
  return b;
}

static void refill(RankBuf b, float value, cudaStream_t stream) {
  float* host = (float*)malloc(b.count * sizeof(float));
  for (size_t i = 0; i < b.count; i++) host[i] = value;
  CUDA_CHECK(cudaMemcpyAsync(b.data, host, b.count * sizeof(float), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  free(host);
}

// Whether every element is `want` (the stream must be synchronised).
static bool holds(RankBuf b, float want) {
  float* host = (float*)malloc(b.count * sizeof(float));
  CUDA_CHECK(cudaMemcpy(host, b.data, b.count * sizeof(float), cudaMemcpyDeviceToHost));
  bool all = true;
  for (size_t i = 0; i < b.count && all; i++) all = host[i] == want;
  free(host);
  return all;
}

// A correct all-reduce on both communicators of one process (one group): whether all is 3.
static bool all_reduce_right(ncclComm_t* comms, size_t count) {
  RankBuf bufs[2];
  cudaStream_t streams[2];
  for (int r = 0; r < 2; r++) {
    bufs[r] = rank_buf(r, count, (float)(r + 1));
    CUDA_CHECK(cudaStreamCreate(&streams[r]));
  }
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; r++) {
    NCCL_OK(ncclAllReduce(bufs[r].data, bufs[r].data, count, ncclFloat, ncclSum, comms[r], streams[r]));
  }
  NCCL_OK(ncclGroupEnd());
  bool right = true;
  for (int r = 0; r < 2; r++) {
    CUDA_CHECK(cudaSetDevice(r));
    CUDA_CHECK(cudaStreamSynchronize(streams[r]));
    right &= holds(bufs[r], 3.0f);
    CUDA_CHECK(cudaFree(bufs[r].data));
    CUDA_CHECK(cudaStreamDestroy(streams[r]));
  }
  return right;
}

static bool fresh_comms_right() {
  ncclComm_t fresh[2];
  NCCL_OK(ncclCommInitAll(fresh, 2, kDevices));
  bool right = all_reduce_right(fresh, 1 << 20);
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(fresh[r]));
  return right;
}

// --- One process: a lone all-reduce, then an abort or a revoke ---

struct Aborter {
  ncclComm_t comm;
  double delay, took;
  ncclResult_t result;
};

static void* abort_later(void* arg) {
  Aborter* a = (Aborter*)arg;
  usleep((useconds_t)(a->delay * 1e6));
  double start = now();
  a->result = ncclCommAbort(a->comm);
  a->took = now() - start;
  return nullptr;
}

// Rank 0 issues an all-reduce rank 1 never joins; returns its stream (the kernel waits).
static cudaStream_t lone_all_reduce(ncclComm_t comm, RankBuf b) {
  CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  NCCL_OK(ncclAllReduce(b.data, b.data, b.count, ncclFloat, ncclSum, comm, stream));
  return stream;
}

static int abort_while_waiting() {
  const char* name = "abort-while-waiting";
  ncclComm_t comms[2];
  NCCL_OK(ncclCommInitAll(comms, 2, kDevices));
  RankBuf b = rank_buf(0, 1 << 18, 1.0f);
  cudaStream_t stream = lone_all_reduce(comms[0], b);
  Aborter aborter = {comms[0], 1.0, 0, ncclInternalError};
  pthread_t thread;
  pthread_create(&thread, nullptr, abort_later, &aborter);
  double start = now();
  cudaError_t synced = cudaStreamSynchronize(stream);
  double waited = now() - start;
  pthread_join(thread, nullptr);
  double destroy_start = now();
  ncclResult_t destroyed = ncclCommDestroy(comms[1]);
  double destroy_took = now() - destroy_start;
  char why[256] = "";
  if (aborter.result != ncclSuccess) {
    snprintf(why, sizeof why, "ncclCommAbort returned %s", ncclGetErrorString(aborter.result));
  } else if (aborter.took > kDeadline) {
    snprintf(why, sizeof why, "ncclCommAbort took %.1f s", aborter.took);
  } else if (waited > aborter.delay + kDeadline) {
    snprintf(why, sizeof why, "the waiting stream took %.1f s after the abort", waited - aborter.delay);
  } else if (destroyed != ncclSuccess || destroy_took > kDeadline) {
    snprintf(why, sizeof why, "ncclCommDestroy of rank 1 after the abort: %s in %.1f s", ncclGetErrorString(destroyed),
             destroy_took);
  }
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(b.data));
  if (!why[0] && !fresh_comms_right()) snprintf(why, sizeof why, "new communicators all-reduce wrong");
  return verdict(name, why,
                 "abort %.2f s, the waiting stream done %.2f s after it (%s), rank 1 destroyed in %.2f s, new "
                 "communicators right",
                 aborter.took, waited - aborter.delay, cudaGetErrorString(synced), destroy_took);
}

typedef ncclResult_t (*RevokeFn)(ncclComm_t, int);

// Waits until the real NCCL says the communicator is quiescent (ncclCommRevoke's contract).
static ncclResult_t settle(ncclComm_t comm, double* took) {
  double start = now();
  ncclResult_t state = ncclInProgress;
  while (now() - start < kDeadline) {
    ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
    if (asked != ncclSuccess) return asked;
    if (state != ncclInProgress) break;
    usleep(1000);
  }
  *took = now() - start;
  return state;
}

static int destroy_after_revoke() {
  const char* name = "destroy-after-revoke";
  RevokeFn revoke = (RevokeFn)dlsym(RTLD_DEFAULT, "ncclCommRevoke");
  if (!revoke) {
    printf("SKIP %s this NCCL has no ncclCommRevoke (2.28+)\n", name);
    return 0;
  }
  ncclComm_t comms[2];
  NCCL_OK(ncclCommInitAll(comms, 2, kDevices));
  RankBuf b = rank_buf(0, 1 << 18, 1.0f);
  cudaStream_t stream = lone_all_reduce(comms[0], b);
  usleep(500000);
  char why[256] = "";
  double start = now();
  ncclResult_t revoked[2];
  for (int r = 0; r < 2; r++) revoked[r] = revoke(comms[r], 0);
  double revoke_took = now() - start;
  cudaError_t synced = cudaStreamSynchronize(stream);
  double stream_took = now() - start;
  double settle_took[2] = {0, 0};
  ncclResult_t settled[2];
  for (int r = 0; r < 2; r++) settled[r] = settle(comms[r], &settle_took[r]);
  // A revoked communicator takes no more collectives.
  ncclResult_t refused = ncclAllReduce(b.data, b.data, b.count, ncclFloat, ncclSum, comms[0], stream);
  start = now();
  ncclResult_t destroyed[2];
  for (int r = 0; r < 2; r++) destroyed[r] = ncclCommDestroy(comms[r]);
  double destroy_took = now() - start;
  for (int r = 0; r < 2 && !why[0]; r++) {
    if (revoked[r] != ncclSuccess && revoked[r] != ncclInProgress) {
      snprintf(why, sizeof why, "ncclCommRevoke of rank %d returned %s", r, ncclGetErrorString(revoked[r]));
    } else if (settled[r] == ncclInProgress) {
      snprintf(why, sizeof why, "rank %d still in progress %.0f s after the revoke", r, kDeadline);
    } else if (destroyed[r] != ncclSuccess) {
      snprintf(why, sizeof why, "ncclCommDestroy of rank %d returned %s", r, ncclGetErrorString(destroyed[r]));
    }
  }
  if (!why[0] && revoke_took + stream_took + destroy_took > kDeadline) {
    snprintf(why, sizeof why, "revoke %.1f s, stream %.1f s, destroy %.1f s", revoke_took, stream_took, destroy_took);
  }
  if (!why[0] && refused == ncclSuccess) snprintf(why, sizeof why, "a revoked communicator took an all-reduce");
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(b.data));
  if (!why[0] && !fresh_comms_right()) snprintf(why, sizeof why, "new communicators all-reduce wrong");
  return verdict(name, why,
                 "revoke %.2f s, the waiting stream done %.2f s after it (%s), settled (%s, %s), an all-reduce "
                 "after it refused with %s, destroy %.2f s, new communicators right",
                 revoke_took, stream_took, cudaGetErrorString(synced), ncclGetErrorString(settled[0]),
                 ncclGetErrorString(settled[1]), ncclGetErrorString(refused), destroy_took);
}

// --- Ranks' calls that differ: one rank's all-reduce meets a peer's of another count ---

// Rank 1's all-reduce of kLarge floats meets rank 0's of kLarge / 4, whose output sits at the
// start of an allocation of kLarge floats whose rest must keep its bytes: a direct kernel of rank
// 1 writing by its own count would spoil them. `failed_launch`: rank 0 first issues an
// all-reduce of kLarge floats on GPU 1's stream, whose launch fails (rank 1's is then the call
// of that one); otherwise the counts simply differ (a user's bug: NCCL gives wrong values). Run
// with a short wait limit (NCCLSHIM_TIMEOUT), which ends rank 1's wait for the rest of its call.
static int counts_differ(bool failed_launch) {
  const char* name = failed_launch ? "one-rank-launch-fails" : "counts-differ";
  const size_t kLarge = 4 << 20, kSmall = kLarge / 4;
  ncclComm_t comms[2];
  NCCL_OK(ncclCommInitAll(comms, 2, kDevices));
  RankBuf b0 = rank_buf(0, kLarge, 1.0f), b1 = rank_buf(1, kLarge, 2.0f);
  const unsigned char poison = 0xA5;
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaMemset(b0.data + kSmall, poison, (kLarge - kSmall) * sizeof(float)));
  cudaStream_t streams[2];
  for (int r = 0; r < 2; r++) {
    CUDA_CHECK(cudaSetDevice(r));
    CUDA_CHECK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
  }
  CUDA_CHECK(cudaSetDevice(0));
  double start = now();
  ncclResult_t failed = ncclInvalidUsage;
  if (failed_launch) failed = ncclAllReduce(b0.data, b0.data, kLarge, ncclFloat, ncclSum, comms[0], streams[1]);
  ncclResult_t peer = ncclAllReduce(b1.data, b1.data, kLarge, ncclFloat, ncclSum, comms[1], streams[1]);
  ncclResult_t next = ncclAllReduce(b0.data, b0.data, kSmall, ncclFloat, ncclSum, comms[0], streams[0]);
  cudaError_t synced[2];
  for (int r = 0; r < 2; r++) {
    CUDA_CHECK(cudaSetDevice(r));
    synced[r] = cudaStreamSynchronize(streams[r]);
  }
  double took = now() - start;
  // What lies past rank 0's output, read back whatever the streams said.
  std::vector<unsigned char> rest((kLarge - kSmall) * sizeof(float));
  CUDA_CHECK(cudaSetDevice(0));
  cudaError_t read = cudaMemcpy(rest.data(), b0.data + kSmall, rest.size(), cudaMemcpyDeviceToHost);
  long spoiled = 0;
  for (unsigned char byte : rest) spoiled += byte != poison;
  char why[256] = "";
  if (failed_launch && failed == ncclSuccess) {
    snprintf(why, sizeof why, "rank 0's all-reduce on GPU 1's stream was launched (the case needs it to fail)");
  } else if (peer != ncclSuccess || next != ncclSuccess) {
    snprintf(why, sizeof why, "rank 1's all-reduce %s, rank 0's next %s", ncclGetErrorString(peer),
             ncclGetErrorString(next));
  } else if (took > kDeadline) {
    snprintf(why, sizeof why, "the streams took %.1f s", took);
  } else if (synced[0] != cudaSuccess || synced[1] != cudaSuccess) {
    snprintf(why, sizeof why, "the streams failed: %s, %s", cudaGetErrorString(synced[0]),
             cudaGetErrorString(synced[1]));
  } else if (read != cudaSuccess) {
    snprintf(why, sizeof why, "rank 0's buffer unreadable: %s", cudaGetErrorString(read));
  } else if (spoiled) {
    snprintf(why, sizeof why, "%ld bytes past rank 0's output of %zu floats written", spoiled, kSmall);
  }
  ncclResult_t aborted[2];
  for (int r = 0; r < 2; r++) aborted[r] = ncclCommAbort(comms[r]);
  for (int r = 0; r < 2; r++) {
    CUDA_CHECK(cudaSetDevice(r));
    CUDA_CHECK(cudaStreamDestroy(streams[r]));
  }
  CUDA_CHECK(cudaSetDevice(0));
  CUDA_CHECK(cudaFree(b0.data));
  CUDA_CHECK(cudaSetDevice(1));
  CUDA_CHECK(cudaFree(b1.data));
  CUDA_CHECK(cudaSetDevice(0));
  if (!why[0] && (aborted[0] != ncclSuccess || aborted[1] != ncclSuccess)) {
    snprintf(why, sizeof why, "ncclCommAbort: %s, %s", ncclGetErrorString(aborted[0]), ncclGetErrorString(aborted[1]));
  }
  if (!why[0] && !fresh_comms_right()) snprintf(why, sizeof why, "new communicators all-reduce wrong");
  return verdict(name, why,
                 "%s; rank 1's all-reduce of %zu floats met rank 0's of %zu: streams done in %.2f s, none of "
                 "the %zu bytes past rank 0's output written, new communicators right",
                 failed_launch ? ncclGetErrorString(failed) : "no launch failed", kLarge, kSmall, took,
                 rest.size());
}

// --- Two streams of one communicator, no dependency between them ---

struct StreamsRank {
  ncclComm_t comm;
  int rank, rounds, wrong;
};

static const size_t kFamilies[] = {2048, 16384, 262144, 4 << 20};  // floats: each algorithm family

static void* two_streams_rank(void* arg) {
  StreamsRank* s = (StreamsRank*)arg;
  CUDA_CHECK(cudaSetDevice(s->rank));
  cudaStream_t streams[2];
  RankBuf bufs[2];
  for (int k = 0; k < 2; k++) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&streams[k], cudaStreamNonBlocking));
    bufs[k] = rank_buf(s->rank, 4 << 20, 0);
  }
  for (int round = 0; round < s->rounds; round++) {
    size_t count = kFamilies[round % 4];
    for (int k = 0; k < 2; k++) {
      RankBuf part = {bufs[k].data, count};
      refill(part, (float)(s->rank + 1) * (k + 1), streams[k]);
    }
    // The same order on both ranks; nothing orders the two streams.
    for (int k = 0; k < 2; k++) {
      NCCL_OK(ncclAllReduce(bufs[k].data, bufs[k].data, count, ncclFloat, ncclSum, s->comm, streams[k]));
    }
    for (int k = 0; k < 2; k++) {
      CUDA_CHECK(cudaStreamSynchronize(streams[k]));
      RankBuf part = {bufs[k].data, count};
      if (!holds(part, 3.0f * (k + 1))) s->wrong++;
    }
  }
  for (int k = 0; k < 2; k++) {
    CUDA_CHECK(cudaStreamDestroy(streams[k]));
    CUDA_CHECK(cudaFree(bufs[k].data));
  }
  return nullptr;
}

static int two_streams() {
  ncclComm_t comms[2];
  NCCL_OK(ncclCommInitAll(comms, 2, kDevices));
  StreamsRank ranks[2];
  pthread_t threads[2];
  double start = now();
  for (int r = 0; r < 2; r++) {
    ranks[r] = {comms[r], r, 200, 0};
    pthread_create(&threads[r], nullptr, two_streams_rank, &ranks[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(threads[r], nullptr);
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(comms[r]));
  char why[256] = "";
  int wrong = ranks[0].wrong + ranks[1].wrong;
  if (wrong) snprintf(why, sizeof why, "%d of %d results wrong", wrong, 2 * 2 * 200);
  return verdict("two-streams", why, "%d all-reduces on 2 streams per rank, all right, %.1f s", 2 * 2 * 200,
                 now() - start);
}

// --- One process per GPU: forked before any CUDA call; rank 0 passes the unique id ---

struct Pair {
  int id_pipe[2];        // rank 0 -> rank 1: unique ids
  int progress_pipe[2];  // rank 1 -> parent: a byte per round
};

// Waits while a nonblocking communicator is busy; returns its state.
static ncclResult_t settle(ncclComm_t comm) {
  double took;
  return settle(comm, &took);
}

static ncclComm_t join(Pair* p, int rank, bool nonblocking = false) {
  ncclUniqueId id;
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    if (write(p->id_pipe[1], &id, sizeof id) != (ssize_t)sizeof id) exit(2);
  } else if (read(p->id_pipe[0], &id, sizeof id) != (ssize_t)sizeof id) {
    exit(2);
  }
  CUDA_CHECK(cudaSetDevice(rank));
  ncclComm_t comm;
  if (!nonblocking) {
    NCCL_OK(ncclCommInitRank(&comm, 2, id, rank));
    return comm;
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t made = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
  if (made != ncclInProgress) NCCL_OK(made);
  NCCL_OK(settle(comm));
  return comm;
}

static volatile long g_rounds = 0;
static volatile int g_aborting = 0;

// Rank 0's watchdog, as PyTorch's: no progress for a while, abort the communicator.
static void* watchdog(void* arg) {
  ncclComm_t comm = (ncclComm_t)arg;
  long seen = -1;
  double still_since = now();
  for (;;) {
    usleep(100000);
    if (g_rounds != seen) {
      seen = g_rounds;
      still_since = now();
    } else if (seen > 0 && now() - still_since > 2) {
      g_aborting = 1;
      double start = now();
      ncclResult_t aborted = ncclCommAbort(comm);
      printf("rank 0: no progress for 2 s after %ld rounds; ncclCommAbort %s in %.2f s\n", seen,
             ncclGetErrorString(aborted), now() - start);
      fflush(stdout);
      if (aborted != ncclSuccess || now() - start > kDeadline) _exit(3);
      g_aborting = 2;
      return nullptr;
    }
  }
}

// A rank of the kill-rank case: all-reduces until killed (rank 1) or aborted (rank 0).
static void looping_rank(Pair* p, int rank) {
  if (rank == 0) close(p->progress_pipe[1]);  // the parent sees rank 1 stop writing
  ncclComm_t comm = join(p, rank);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  RankBuf b = rank_buf(rank, 4 << 20, 0);
  pthread_t thread = 0;
  if (rank == 0) pthread_create(&thread, nullptr, watchdog, comm);
  for (long round = 0;; round++) {
    size_t count = kFamilies[round % 4];
    RankBuf part = {b.data, count};
    refill(part, (float)(rank + 1), stream);
    if (g_aborting) break;
    NCCL_OK(ncclAllReduce(b.data, b.data, count, ncclFloat, ncclSum, comm, stream));
    cudaError_t synced = cudaStreamSynchronize(stream);
    if (g_aborting) break;
    if (synced != cudaSuccess || !holds(part, 3.0f)) {
      fprintf(stderr, "rank %d: round %ld wrong (%s)\n", rank, round, cudaGetErrorString(synced));
      _exit(4);
    }
    g_rounds = round + 1;
    if (rank == 1 && write(p->progress_pipe[1], "", 1) != 1) _exit(2);
  }
  pthread_join(thread, nullptr);
  printf("rank 0: the loop's stream returned after the abort; exiting\n");
  fflush(stdout);
  exit(g_aborting == 2 ? 0 : 5);
}

// Waits for a child up to `deadline` seconds; its exit status, or -1 (then it is killed).
static int wait_child(pid_t pid, double deadline) {
  double start = now();
  int status;
  while (now() - start < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    usleep(20000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

static void open_pair(Pair* p) {
  if (pipe(p->id_pipe) || pipe(p->progress_pipe)) exit(2);
}

// The next job on the same GPUs: two fresh processes all-reduce right.
static int next_job_right() {
  Pair p;
  open_pair(&p);
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    if ((pids[r] = fork()) == 0) {
      ncclComm_t comm = join(&p, r);
      cudaStream_t stream;
      CUDA_CHECK(cudaStreamCreate(&stream));
      RankBuf b = rank_buf(r, 1 << 20, (float)(r + 1));
      NCCL_OK(ncclAllReduce(b.data, b.data, b.count, ncclFloat, ncclSum, comm, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      bool right = holds(b, 3.0f);
      NCCL_OK(ncclCommDestroy(comm));
      _exit(right ? 0 : 4);
    }
  }
  int a = wait_child(pids[0], 60), b = wait_child(pids[1], 60);
  return a == 0 && b == 0;
}

static int kill_rank() {
  const char* name = "kill-rank";
  Pair p;
  open_pair(&p);
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    if ((pids[r] = fork()) == 0) looping_rank(&p, r);
  }
  close(p.progress_pipe[1]);
  // Let rank 1 get well into the loop, then kill it in the middle of a round.
  char byte;
  int rounds = 0;
  while (rounds < 200 && read(p.progress_pipe[0], &byte, 1) == 1) rounds++;
  usleep(300);
  double killed_at = now();
  kill(pids[1], SIGKILL);
  waitpid(pids[1], nullptr, 0);
  int survivor = wait_child(pids[0], 2 + 2 * kDeadline);
  double survivor_took = now() - killed_at;
  char why[256] = "";
  if (rounds < 200) {
    snprintf(why, sizeof why, "rank 1 stopped after %d rounds before it was killed", rounds);
  } else if (survivor != 0) {
    snprintf(why, sizeof why, "the surviving rank %s", survivor < 0 ? "hung (killed at the deadline)" : "failed");
  } else if (!next_job_right()) {
    snprintf(why, sizeof why, "the next job on the same GPUs failed");
  }
  return verdict(name, why, "rank 1 killed after %d rounds; rank 0 aborted and exited %.2f s later; the next job right",
                 rounds, survivor_took);
}

// --- Leaks: cycles of create, all-reduce, destroy ---

struct Stats {
  long rss_kib, heap_kib, gpu_used_mib, threads, fds, core_buffers, core_mappings;
};

static long count_entries(const char* dir) {
  DIR* d = opendir(dir);
  long n = 0;
  if (!d) return -1;
  while (struct dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// The shim's count from its last "core of comm ... released" INFO line in this process's
// NCCL_DEBUG_FILE (-1 where there is none: NCCL alone, or no file).
static void core_resources(long* buffers, long* mappings) {
  *buffers = *mappings = -1;
  const char* pattern = getenv("NCCL_DEBUG_FILE");
  if (!pattern) return;
  char path[512], host[256] = "";
  gethostname(host, sizeof host);
  size_t n = 0;
  for (const char* c = pattern; *c && n + 64 < sizeof path; c++) {
    if (c[0] == '%' && c[1] == 'p') n += snprintf(path + n, sizeof path - n, "%d", (int)getpid()), c++;
    else if (c[0] == '%' && c[1] == 'h') n += snprintf(path + n, sizeof path - n, "%s", host), c++;
    else path[n++] = *c;
  }
  path[n] = 0;
  FILE* f = fopen(path, "r");
  if (!f) return;
  char line[2048];
  while (fgets(line, sizeof line, f)) {
    const char* at = strstr(line, "the core holds ");
    if (at) sscanf(at, "the core holds %ld device buffers and %ld peer mappings", buffers, mappings);
  }
  fclose(f);
}

// This process's resident memory, and the memory in use on GPU `device`.
static void memory(int device, long* rss_kib, long* gpu_used_mib) {
  long pages = 0, resident = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  if (f) fclose(f);
  *rss_kib = resident * (sysconf(_SC_PAGESIZE) / 1024);
  size_t free_b, total_b;
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  *gpu_used_mib = (long)((total_b - free_b) >> 20);
}

static Stats stats(int device) {
  Stats s;
  memory(device, &s.rss_kib, &s.gpu_used_mib);
  // What malloc has handed out and not had back: where RSS grows and this does not, the growth
  // is the heap's fragments, not a leak.
  struct mallinfo2 heap = mallinfo2();
  s.heap_kib = (long)((heap.uordblks + heap.hblkhd) / 1024);
  s.threads = count_entries("/proc/self/task");
  s.fds = count_entries("/proc/self/fd");
  core_resources(&s.core_buffers, &s.core_mappings);
  return s;
}

static void print_stats(const char* name, int rank, long cycle, Stats s) {
  printf("STATS %s rank %d cycle %ld: rss %ld KiB, heap in use %ld KiB, GPU %d in use %ld MiB, threads %ld, fds %ld, "
         "core buffers %ld, peer mappings %ld\n",
         name, rank, cycle, s.rss_kib, s.heap_kib, rank, s.gpu_used_mib, s.threads, s.fds, s.core_buffers,
         s.core_mappings);
  fflush(stdout);
}

// Host and GPU memory of the last three cycles. NCCL's own GPU memory goes up and down by a few
// hundred MiB from one communicator to the next (942 and 1230 MiB in turn, seen with NCCL alone
// too), and the host's settles over the first tens of cycles; a leak grows every cycle, so the
// least of the last three shows it where one sample would catch a swing.
struct Recent {
  long rss_kib[3], gpu_used_mib[3];
  long n;
};

static void note(Recent* r, int device) {
  memory(device, &r->rss_kib[r->n % 3], &r->gpu_used_mib[r->n % 3]);
  r->n++;
}

// `last`, its memory the least of the recent cycles'.
static Stats least(Stats last, const Recent* r) {
  for (long i = 0; i < r->n && i < 3; i++) {
    if (r->rss_kib[i] < last.rss_kib) last.rss_kib = r->rss_kib[i];
    if (r->gpu_used_mib[i] < last.gpu_used_mib) last.gpu_used_mib = r->gpu_used_mib[i];
  }
  return last;
}

static bool checkpoint(long cycle) {
  for (long c = 1; c <= 10000; c *= 10)
    if (cycle == c) return true;
  return cycle == 0;
}

// Growth from cycle 10 to the last allowed: threads, fds and the core's counts not at all, host
// and GPU memory a little (NCCL's own caches). Fewer is no leak: NCCL's own threads and sockets
// come and go (one fd fewer at the last cycle was seen).
static void flat(const char* name, int rank, Stats base, Stats last, long cycles, char* why, size_t len) {
  if (last.threads > base.threads || last.fds > base.fds || last.core_buffers > base.core_buffers ||
      last.core_mappings > base.core_mappings || last.rss_kib - base.rss_kib > 64 * 1024 ||
      last.gpu_used_mib - base.gpu_used_mib > 64) {
    snprintf(why, len, "%s rank %d grew from cycle 10 to %ld: rss %+ld KiB, GPU %+ld MiB, threads %+ld, fds %+ld, core "
                       "buffers %+ld, peer mappings %+ld",
             name, rank, cycles, last.rss_kib - base.rss_kib, last.gpu_used_mib - base.gpu_used_mib,
             last.threads - base.threads, last.fds - base.fds, last.core_buffers - base.core_buffers,
             last.core_mappings - base.core_mappings);
  }
}

// What the shim's set-up of split children sends on their parents: a record (1 KiB) and a
// verdict (4 bytes) of every rank, each an all-gather grouped over the ranks, on new buffers.
static void parent_all_gathers(ncclComm_t* parents) {
  for (size_t bytes : {(size_t)1024, (size_t)4}) {
    void* bufs[2];
    cudaStream_t streams[2];
    for (int r = 0; r < 2; r++) {
      CUDA_CHECK(cudaSetDevice(r));
      CUDA_CHECK(cudaMalloc(&bufs[r], 2 * bytes));
      CUDA_CHECK(cudaStreamCreate(&streams[r]));
    }
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; r++)
      NCCL_OK(ncclAllGather((char*)bufs[r] + r * bytes, bufs[r], bytes, ncclUint8, parents[r], streams[r]));
    NCCL_OK(ncclGroupEnd());
    for (int r = 0; r < 2; r++) {
      CUDA_CHECK(cudaSetDevice(r));
      CUDA_CHECK(cudaStreamSynchronize(streams[r]));
      CUDA_CHECK(cudaFree(bufs[r]));
      CUDA_CHECK(cudaStreamDestroy(streams[r]));
    }
  }
}

static int leak_one_process(const char* name, bool split, long cycles, double budget, bool parent_gathers,
                            bool child_all_reduce, bool empty_group) {
  double start = now();
  ncclComm_t parents[2];
  if (split) NCCL_OK(ncclCommInitAll(parents, 2, kDevices));
  Stats base = {}, last = stats(0);
  Recent recent = {};
  print_stats(name, 0, 0, last);
  long cycle = 0;
  char why[512] = "";
  while (cycle < cycles && now() - start < budget && !why[0]) {
    ncclComm_t comms[2];
    if (split) {
      NCCL_OK(ncclGroupStart());
      for (int r = 0; r < 2; r++) NCCL_OK(ncclCommSplit(parents[r], 0, r, &comms[r], nullptr));
      NCCL_OK(ncclGroupEnd());
      if (parent_gathers) parent_all_gathers(parents);
    } else {
      NCCL_OK(ncclCommInitAll(comms, 2, kDevices));
    }
    if (child_all_reduce && !all_reduce_right(comms, 1 << 16))
      snprintf(why, sizeof why, "cycle %ld all-reduced wrong", cycle);
    if (empty_group) {
      NCCL_OK(ncclGroupStart());
      NCCL_OK(ncclGroupEnd());
    }
    for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(comms[r]));
    cycle++;
    if (checkpoint(cycle)) print_stats(name, 0, cycle, last = stats(0));
    if (cycle == 10) base = last;
    if (cycle > 10) note(&recent, 0);
  }
  print_stats(name, 0, cycle, last = stats(0));
  last = least(last, &recent);
  if (split)
    for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(parents[r]));
  if (!why[0] && cycle < 10) snprintf(why, sizeof why, "only %ld cycles in %.0f s", cycle, budget);
  if (!why[0]) flat(name, 0, base, last, cycle, why, sizeof why);
  return verdict(name, why, "%ld cycles in %.0f s (%.1f ms each), flat from cycle 10", cycle, now() - start,
                 1e3 * (now() - start) / cycle);
}

static int leak_groups(const char* name, long cycles, double budget, bool empty) {
  double start = now();
  ncclComm_t comms[2];
  NCCL_OK(ncclCommInitAll(comms, 2, kDevices));
  RankBuf bufs[2];
  cudaStream_t streams[2];
  for (int r = 0; r < 2; r++) {
    bufs[r] = rank_buf(r, 256, (float)(r + 1));
    CUDA_CHECK(cudaStreamCreate(&streams[r]));
  }
  Stats base = {}, last = stats(0);
  print_stats(name, 0, 0, last);
  long cycle = 0;
  while (cycle < cycles && now() - start < budget) {
    NCCL_OK(ncclGroupStart());
    for (int r = 0; !empty && r < 2; r++)
      NCCL_OK(ncclAllReduce(bufs[r].data, bufs[r].data, bufs[r].count, ncclFloat, ncclSum, comms[r], streams[r]));
    NCCL_OK(ncclGroupEnd());
    cycle++;
    // Bounds the work queued ahead of the GPUs.
    if (cycle % 256 == 0)
      for (int r = 0; r < 2; r++) CUDA_CHECK(cudaStreamSynchronize(streams[r]));
    if (checkpoint(cycle)) print_stats(name, 0, cycle, last = stats(0));
    if (cycle == 10000) base = last;
  }
  for (int r = 0; r < 2; r++) CUDA_CHECK(cudaStreamSynchronize(streams[r]));
  print_stats(name, 0, cycle, last = stats(0));
  char why[512] = "";
  long grown = last.heap_kib - base.heap_kib, groups = cycle - 10000;
  if (groups < 10000)
    snprintf(why, sizeof why, "only %ld groups in %.0f s", cycle, budget);
  else if (grown * 1024 > 16 * groups)
    snprintf(why, sizeof why, "heap in use grew %ld KiB over %ld groups (%.0f bytes a group)", grown, groups,
             grown * 1024.0 / groups);
  for (int r = 0; r < 2; r++) {
    CUDA_CHECK(cudaStreamDestroy(streams[r]));
    CUDA_CHECK(cudaFree(bufs[r].data));
    NCCL_OK(ncclCommDestroy(comms[r]));
  }
  return verdict(name, why, "%ld groups in %.0f s, heap in use %+ld KiB from group 10,000", cycle, now() - start,
                 grown);
}

static int leak_procs(const char* name, bool split, long cycles, double budget, bool nonblocking) {
  Pair p;
  open_pair(&p);
  // Rank 0 decides when the budget is spent and tells rank 1 through the id it sends (a zeroed
  // id means stop).
  int go_pipe[2];
  if (pipe(go_pipe)) exit(2);
  pid_t pids[2];
  double start = now();
  for (int r = 0; r < 2; r++) {
    if ((pids[r] = fork()) == 0) {
      ncclComm_t parent = split ? join(&p, r) : nullptr;
      Stats base = {}, last = stats(r);
      Recent recent = {};
      print_stats(name, r, 0, last);
      long cycle = 0;
      char why[512] = "";
      for (;;) {
        int go = 1;
        if (r == 0) {
          go = cycle < cycles && now() - start < budget;
          if (write(go_pipe[1], &go, sizeof go) != (ssize_t)sizeof go) _exit(2);
        } else if (read(go_pipe[0], &go, sizeof go) != (ssize_t)sizeof go) {
          _exit(2);
        }
        if (!go) break;
        ncclComm_t comm;
        if (split) {
          NCCL_OK(ncclCommSplit(parent, 0, r, &comm, nullptr));
        } else {
          comm = join(&p, r, nonblocking);
        }
        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreate(&stream));
        RankBuf b = rank_buf(r, 1 << 16, (float)(r + 1));
        ncclResult_t issued = ncclAllReduce(b.data, b.data, b.count, ncclFloat, ncclSum, comm, stream);
        if (issued != ncclInProgress) NCCL_OK(issued);
        NCCL_OK(settle(comm));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        if (!holds(b, 3.0f) && !why[0]) snprintf(why, sizeof why, "rank %d cycle %ld all-reduced wrong", r, cycle);
        if (nonblocking) {
          ncclResult_t finalized = ncclCommFinalize(comm);
          if (finalized != ncclInProgress) NCCL_OK(finalized);
          NCCL_OK(settle(comm));
        }
        NCCL_OK(ncclCommDestroy(comm));
        CUDA_CHECK(cudaStreamDestroy(stream));
        CUDA_CHECK(cudaFree(b.data));
        cycle++;
        if (checkpoint(cycle)) print_stats(name, r, cycle, last = stats(r));
        if (cycle == 10) base = last;
        if (cycle > 10) note(&recent, r);
      }
      print_stats(name, r, cycle, last = stats(r));
      last = least(last, &recent);
      if (split) NCCL_OK(ncclCommDestroy(parent));
      if (!why[0] && cycle < 10) snprintf(why, sizeof why, "rank %d: only %ld cycles", r, cycle);
      if (!why[0]) flat(name, r, base, last, cycle, why, sizeof why);
      if (why[0]) printf("rank %d: %s\n", r, why);
      printf("rank %d: %ld cycles in %.0f s\n", r, cycle, now() - start);
      fflush(stdout);
      _exit(why[0] ? 1 : 0);
    }
  }
  int a = wait_child(pids[0], budget + 120), b = wait_child(pids[1], budget + 120);
  char why[256] = "";
  if (a != 0 || b != 0) snprintf(why, sizeof why, "ranks exited %d and %d (-1: hung)", a, b);
  return verdict(name, why, "both ranks flat from cycle 10 (STATS lines), %.0f s", now() - start);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr,
            "usage: faults CASE [--cycles N] [--budget SECONDS] [--parent-all-gathers 0|1] [--child-all-reduce 0|1] "
            "[--empty-group 0|1] [--nonblocking 0|1]\n");
    return 2;
  }
  long cycles = 10000;
  double budget = 120;
  bool parent_gathers = false, nonblocking = false, child_all_reduce = true, empty_group = false;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--cycles")) cycles = atol(argv[i + 1]);
    if (!strcmp(argv[i], "--budget")) budget = atof(argv[i + 1]);
    if (!strcmp(argv[i], "--parent-all-gathers")) parent_gathers = atoi(argv[i + 1]) != 0;
    if (!strcmp(argv[i], "--nonblocking")) nonblocking = atoi(argv[i + 1]) != 0;
    if (!strcmp(argv[i], "--child-all-reduce")) child_all_reduce = atoi(argv[i + 1]) != 0;
    if (!strcmp(argv[i], "--empty-group")) empty_group = atoi(argv[i + 1]) != 0;
  }
  const char* c = argv[1];
  print_mapped_nccl("# ");  // no CUDA call: the forks below may still use CUDA
  // Multi-process cases fork before this process touches CUDA.
  if (!strcmp(c, "kill-rank")) return kill_rank();
  if (!strcmp(c, "leak-procs")) return leak_procs(c, false, cycles, budget, nonblocking);
  if (!strcmp(c, "leak-split-procs")) return leak_procs(c, true, cycles, budget, false);
  if (!strcmp(c, "abort-while-waiting")) return abort_while_waiting();
  if (!strcmp(c, "destroy-after-revoke")) return destroy_after_revoke();
  if (!strcmp(c, "two-streams")) return two_streams();
  if (!strcmp(c, "one-rank-launch-fails")) return counts_differ(true);
  if (!strcmp(c, "counts-differ")) return counts_differ(false);
  if (!strcmp(c, "leak-one-process")) return leak_one_process(c, false, cycles, budget, false, true, false);
  if (!strcmp(c, "leak-groups")) return leak_groups(c, cycles, budget, empty_group);
  if (!strcmp(c, "leak-split-one-process"))
    return leak_one_process(c, true, cycles, budget, parent_gathers, child_all_reduce, empty_group);
  fprintf(stderr, "unknown case %s\n", c);
  return 2;
}
