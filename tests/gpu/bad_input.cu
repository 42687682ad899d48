// Bad input through NCCL's API: every case of the table below calls NCCL as a careless user
// might, on real communicators (one process drives 2 GPUs, ncclCommInitAll), and prints what came
// back, one line per case, so that tests/gpu/bad_input_compare.py can set the shim's answers
// beside the real NCCL's (run.sh, suite `badinput`, runs this program once through each):
//   case <id> <name> result <n> <ncclResult_t name>|- none [calls a,b,..] [end <n>] [value <v>]
//        sync <ok|CUDA error name> guard <ok|bad:<bytes>|-> after <ok|wrong|err...|->
//   case <id> <name> crashed | hung       (the process died, or a call never returned)
//   case <id> <name> result ... hung <stage>   (the calls returned; the wait after them hung)
// result: the case's first NCCL call's; calls: every call's, where it made several; end: the
// ncclGroupEnd closing its group; value: what the calls gave besides results (strings, handles
// NULL or not, whether an output holds the right sums); sync: the case's streams and both GPUs,
// synchronized; guard: whether every byte around the outputs (and of the inputs sharing their
// allocations) is as it was; after: whether a valid all-reduce on the same communicators then
// sums right (whether the communicators survived). Before each case: `begin <id> <name>`, so
// that lines NCCL and the shim log (WARN) can be told apart by case.
//
//   bad_input [--cases A-B] [--deadline S]  the driver: runs the cases (default all) in worker
//       processes (this program again, --worker), never touching CUDA itself, so that a case that
//       kills its process, hangs or spoils the CUDA context costs that case only: a worker
//       stops after such a case, and the next one goes on after it
//   bad_input --list                        the table: id, name, alone|shared
//   bad_input --worker --cases A-B          runs the cases from A in this process, up to B, a
//       case that spoils the process or an `alone` one (run first in a fresh worker, then it stops)
// Every case runs under a deadline (alarm, --deadline, default 15 s); the driver kills a worker
// that outlives it. In the shim's run, NCCLSHIM_CORE=force gives every valid-looking all-reduce to
// the core. NCCL's expected answers below are read from its source (2.28.9: src/misc/argcheck.cc,
// src/enqueue.cc, src/init.cc, src/group.cc); with NCCL_CHECK_POINTERS unset (0), NCCL checks no
// buffer pointer, so calls with bad buffers are accepted and fail, if at all, on the GPU.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "mapped_nccl.h"

#define NR 2             // ranks: one per GPU
#define N 1024           // floats per rank of most calls (4 KiB: the core's sentinel kernel)
#define GUARD 4096       // watched bytes before and after each output
#define POISON 0xA5
#define HOST (-1)        // a buffer in host memory (malloc), where a device number goes
#define NO_RESULT (-100)

#define HAS_2_28 (NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0))

static const char* result_name(int r) {
  static const char* const names[] = {"ncclSuccess",         "ncclUnhandledCudaError",
                                      "ncclSystemError",     "ncclInternalError",
                                      "ncclInvalidArgument", "ncclInvalidUsage",
                                      "ncclRemoteError",     "ncclInProgress"};
  return r >= 0 && r < 8 ? names[r] : "unknown";
}

// Set-up calls: a failure ends the worker (exit 2), which the driver reports.
#define SETUP(call)                                                                          \
  do {                                                                                       \
    long r_ = (long)(call);                                                                  \
    if (r_ != 0) {                                                                           \
      fprintf(stderr, "%s:%d: %s failed: %ld\n", __FILE__, __LINE__, #call, r_);             \
      fflush(stderr);                                                                        \
      _exit(2);                                                                              \
    }                                                                                        \
  } while (0)

// ---------------------------------------------------------------------------------------------
// What every case gets: the worker's communicators and streams, valid inputs, and helpers that
// make bad buffers, watched outputs and record what the calls returned.

static float pattern(int rank, size_t i) { return (float)((rank + 1) * (1 + i % 7)); }
static float pattern_sum(size_t i) { return (float)(3 * (1 + i % 7)); }  // ranks 0 and 1

// An allocation whose bytes outside [out_lo, out_hi) must keep what they were given.
struct Buf {
  char* base;
  size_t bytes;
  int dev;  // HOST: malloc
  size_t out_lo, out_hi;
  std::vector<unsigned char> expect;
};

struct World {
  ncclComm_t comm[NR];
  cudaStream_t s[NR];
  float* in[NR];  // NR * N floats of pattern(r, i) on GPU r; never written by a valid call
  float *after_in[NR], *after_out[NR];
  void* zeros;  // a foreign "communicator": 1 MiB of zero bytes
};

enum Coll { AR, BROADCAST, BCAST, REDUCE, ALLGATHER, REDUCESCATTER, SEND, RECV, SENDRECV,
            GATHER, SCATTER, ALLTOALL };

// One collective's arguments for both ranks (index: rank).
struct Args {
  const void* send[NR];
  void* recv[NR];
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op[NR];
  int root;
  int peer[NR];
  ncclComm_t comm[NR];
  cudaStream_t stream[NR];
};

static ncclResult_t issue(Coll k, const Args& a, int r) {
  const void* s = a.send[r];
  void* d = a.recv[r];
  size_t n = a.count;
  ncclDataType_t t = a.type;
  ncclComm_t c = a.comm[r];
  cudaStream_t st = a.stream[r];
  switch (k) {
    case AR: return ncclAllReduce(s, d, n, t, a.op[r], c, st);
    case BROADCAST: return ncclBroadcast(s, d, n, t, a.root, c, st);
    case BCAST: return ncclBcast(d, n, t, a.root, c, st);
    case REDUCE: return ncclReduce(s, d, n, t, a.op[r], a.root, c, st);
    case ALLGATHER: return ncclAllGather(s, d, n, t, c, st);
    case REDUCESCATTER: return ncclReduceScatter(s, d, n, t, a.op[r], c, st);
    case SEND: return ncclSend(s, n, t, a.peer[r], c, st);
    case RECV: return ncclRecv(d, n, t, a.peer[r], c, st);
#if HAS_2_28
    case GATHER: return ncclGather(s, d, n, t, a.root, c, st);
    case SCATTER: return ncclScatter(s, d, n, t, a.root, c, st);
    case ALLTOALL: return ncclAlltoAll(s, d, n, t, c, st);
#endif
    default: return ncclInternalError;
  }
}

// Floats each rank receives, for the default count N.
static size_t recv_count(Coll k) {
  return k == ALLGATHER || k == GATHER || k == ALLTOALL ? NR * N : N;
}

struct Ctx {
  World& w;
  ncclComm_t* comm;  // w.comm
  cudaStream_t* s;   // w.s
  float** in;        // w.in
  std::vector<int> calls;
  int end = NO_RESULT;
  std::string value;
  std::vector<Buf> bufs;
  std::vector<void*> plain_dev, plain_host;
  std::vector<cudaStream_t> streams;  // made by the case: synchronized, then destroyed

  explicit Ctx(World& world) : w(world), comm(world.comm), s(world.s), in(world.in) {}

  void call(ncclResult_t r);
  void ended(ncclResult_t r) {
    end = r;
    call_done();
  }
  void call_done();
  // Appends a word (blanks become '_') to the case's value.
  void note(const char* v) {
    if (!value.empty()) value += ",";
    for (const char* p = v; *p; p++) value += (unsigned char)*p <= ' ' ? '_' : *p;
    call_done();
  }
  // Opens a group that is not itself under test.
  void start() {
    if (ncclGroupStart() != ncclSuccess) note("groupstart-failed");
  }

  // A watched allocation of `bytes` on `dev` (or HOST), poisoned; its output starts empty.
  char* watched(int dev, size_t bytes) {
    Buf b;
    b.bytes = GUARD + bytes + GUARD;
    b.dev = dev;
    b.out_lo = b.out_hi = 0;
    b.expect.assign(b.bytes, POISON);
    if (dev == HOST) {
      b.base = (char*)malloc(b.bytes);
      memset(b.base, POISON, b.bytes);
    } else {
      SETUP(cudaSetDevice(dev));
      SETUP(cudaMalloc(&b.base, b.bytes));
      SETUP(cudaMemset(b.base, POISON, b.bytes));
      SETUP(cudaSetDevice(0));  // GPU 0 current, as at every case's start
    }
    bufs.push_back(b);
    return b.base + GUARD;
  }
  Buf* find(const void* p) {
    for (Buf& b : bufs)
      if ((const char*)p >= b.base && (const char*)p < b.base + b.bytes) return &b;
    return NULL;
  }
  // Marks `bytes` from p (inside a watched allocation) as output: a call may write there.
  void output(void* p, size_t bytes) {
    Buf* b = find(p);
    b->out_lo = (char*)p - b->base;
    b->out_hi = b->out_lo + bytes;
  }
  // A watched output of `count` floats on `dev`, `skew` bytes past its allocation's alignment.
  float* out(int dev, size_t count, size_t skew = 0) {
    char* p = watched(dev, count * 4 + skew) + skew;
    output(p, count * 4);
    return (float*)p;
  }
  // Writes rank r's pattern into `count` floats at p (device or host, watched or not).
  void fill(void* p, size_t count, int r) {
    std::vector<float> h(count);
    for (size_t i = 0; i < count; i++) h[i] = pattern(r, i);
    Buf* b = find(p);
    if (b) memcpy(&b->expect[(char*)p - b->base], h.data(), count * 4);
    if (b && b->dev == HOST) memcpy(p, h.data(), count * 4);
    else SETUP(cudaMemcpy(p, h.data(), count * 4, cudaMemcpyDefault));
  }
  // Host memory (malloc) holding rank r's pattern: NR * N floats.
  void* host_input(int r) {
    void* p = malloc(NR * N * 4);
    plain_host.push_back(p);
    fill(p, NR * N, r);
    return p;
  }
  // Device memory of `dev`, freed again: a dangling pointer.
  void* freed(int dev) {
    void* p;
    SETUP(cudaSetDevice(dev));
    SETUP(cudaMalloc(&p, NR * N * 4));
    SETUP(cudaFree(p));
    SETUP(cudaSetDevice(0));
    return p;
  }
  // Device memory of `dev` the case may use as it likes (freed after the case).
  void* scratch(int dev, size_t bytes) {
    void* p;
    SETUP(cudaSetDevice(dev));
    SETUP(cudaMalloc(&p, bytes));
    SETUP(cudaMemset(p, 0, bytes));
    SETUP(cudaSetDevice(0));
    plain_dev.push_back(p);
    return p;
  }
  cudaStream_t stream(int dev) {
    cudaStream_t st;
    SETUP(cudaSetDevice(dev));
    SETUP(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    SETUP(cudaSetDevice(0));
    streams.push_back(st);
    return st;
  }

  // Valid arguments of collective k for both ranks: the shared inputs, fresh watched outputs of
  // each rank's GPU, N floats, sum, root 0, each rank's peer the other.
  Args args(Coll k) {
    Args a;
    for (int r = 0; r < NR; r++) {
      a.send[r] = in[r];
      a.recv[r] = out(r, recv_count(k));
      a.op[r] = ncclSum;
      a.peer[r] = NR - 1 - r;
      a.comm[r] = comm[r];
      a.stream[r] = s[r];
    }
    a.count = N;
    a.type = ncclFloat;
    a.root = 0;
    return a;
  }
  // Both ranks call k in one group (for Send and Recv kinds: SENDRECV issues both per rank).
  void both(Coll k, const Args& a) {
    start();
    for (int r = 0; r < NR; r++) {
      if (k == SENDRECV) {
        call(issue(SEND, a, r));
        call(issue(RECV, a, r));
      } else {
        call(issue(k, a, r));
      }
    }
    ended(ncclGroupEnd());
  }
  // Rank 0 alone calls k, outside any group: for what NCCL refuses before enqueuing anything.
  void one(Coll k, const Args& a) { call(issue(k, a, 0)); }
  // Whether `count` floats at p (rank-summed pattern expected) are right, untouched or wrong.
  void sums(const void* p, size_t count) {
    std::vector<float> h(count);
    cudaError_t e = cudaSuccess;
    for (int d = 0; d < NR && e == cudaSuccess; d++) {
      e = cudaSetDevice(d);
      if (e == cudaSuccess) e = cudaDeviceSynchronize();
    }
    cudaSetDevice(0);
    if (e != cudaSuccess || cudaMemcpy(h.data(), p, count * 4, cudaMemcpyDefault) != cudaSuccess) {
      note("sums-unreadable");
      return;
    }
    bool right = true, poison = true;
    for (size_t i = 0; i < count; i++) {
      right &= h[i] == pattern_sum(i);
      unsigned char bytes[4];
      memcpy(bytes, &h[i], 4);
      for (unsigned char b : bytes) poison &= b == POISON;
    }
    note(right ? "sums-right" : poison ? "untouched" : "sums-wrong");
  }
  // Whether `bytes` at p (a watched output) still hold the poison: "untouched", or "written".
  void poisoned(const void* p, size_t bytes) {
    std::vector<unsigned char> h(bytes);
    cudaError_t e = cudaSuccess;
    for (int d = 0; d < NR && e == cudaSuccess; d++) {
      e = cudaSetDevice(d);
      if (e == cudaSuccess) e = cudaDeviceSynchronize();
    }
    cudaSetDevice(0);
    if (e != cudaSuccess || cudaMemcpy(h.data(), p, bytes, cudaMemcpyDefault) != cudaSuccess) {
      note("unreadable");
      return;
    }
    bool poison = true;
    for (unsigned char b : h) poison &= b == POISON;
    note(poison ? "untouched" : "written");
  }
};

// Two fresh communicators (ncclCommInitAll), for cases that finalize, revoke or destroy theirs.
static void fresh_comms(ncclComm_t* comms) {
  int devs[NR] = {0, 1};
  SETUP(ncclCommInitAll(comms, NR, devs));
  SETUP(cudaSetDevice(0));
}
// Destroys them; notes "destroyed", or the first failure.
static void destroy_comms(Ctx& c, ncclComm_t* comms) {
  ncclResult_t first = ncclSuccess;
  for (int r = 0; r < NR; r++) {
    ncclResult_t e = ncclCommDestroy(comms[r]);
    if (first == ncclSuccess) first = e;
  }
  c.note(first == ncclSuccess ? "destroyed" : result_name(first));
}
// Finalizes them, in one group as NCCL wants (not a call under test: a failure ends the worker).
static void finalize_comms(ncclComm_t* comms) {
  SETUP(ncclGroupStart());
  for (int r = 0; r < NR; r++) SETUP(ncclCommFinalize(comms[r]));
  SETUP(ncclGroupEnd());
}

// A valid all-reduce on `comms`: whether every rank's output holds the right sums.
static const char* all_reduce_right(World& w, ncclComm_t* comms) {
  static char why[64];
  for (int r = 0; r < NR; r++) {
    if (cudaSetDevice(r) != cudaSuccess || cudaMemset(w.after_out[r], 0, N * 4) != cudaSuccess)
      return "err-cuda";
  }
  cudaSetDevice(0);
  ncclResult_t started = ncclGroupStart(), issued[NR];
  for (int r = 0; r < NR; r++)
    issued[r] =
        ncclAllReduce(w.after_in[r], w.after_out[r], N, ncclFloat, ncclSum, comms[r], w.s[r]);
  ncclResult_t ended = ncclGroupEnd();
  ncclResult_t first = started != ncclSuccess   ? started
                       : issued[0] != ncclSuccess ? issued[0]
                       : issued[1] != ncclSuccess ? issued[1]
                                                  : ended;
  if (first != ncclSuccess) {
    snprintf(why, sizeof why, "err-%s", result_name(first));
    return why;
  }
  std::vector<float> h(N);
  for (int r = 0; r < NR; r++) {
    cudaError_t e = cudaStreamSynchronize(w.s[r]);
    if (e == cudaSuccess) e = cudaMemcpy(h.data(), w.after_out[r], N * 4, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
      snprintf(why, sizeof why, "err-%s", cudaGetErrorName(e));
      return why;
    }
    for (size_t i = 0; i < N; i++)
      if (h[i] != pattern_sum(i)) return "wrong";
  }
  return "ok";
}

// In one group, each communicator gets an all-reduce on an uncaptured stream, then one of
// `captured` elements on a stream being captured; the captures' ends and the first all-reduce's
// sums follow. With `sendrecv_first`, a send and a receive between the ranks come first in the
// group, which go to NCCL even through the shim: where NCCL fails the whole group, they must not
// run either (the receiving buffer stays untouched).
static void mixed_capture(Ctx& c, size_t captured, bool sendrecv_first = false) {
  Args p{}, a = c.args(AR), b = c.args(AR);
  if (sendrecv_first) p = c.args(SENDRECV);
  b.count = captured;
  for (int r = 0; r < NR; r++) {
    b.stream[r] = c.stream(r);
    SETUP(cudaStreamBeginCapture(b.stream[r], cudaStreamCaptureModeRelaxed));
  }
  c.start();
  for (int r = 0; r < NR && sendrecv_first; r++) {
    c.call(issue(SEND, p, r));
    c.call(issue(RECV, p, r));
  }
  for (int r = 0; r < NR; r++) {
    c.call(issue(AR, a, r));
    c.call(issue(AR, b, r));
  }
  c.ended(ncclGroupEnd());
  for (int r = 0; r < NR; r++) {
    cudaGraph_t g = NULL;
    c.note(cudaGetErrorName(cudaStreamEndCapture(b.stream[r], &g)));
    if (g) cudaGraphDestroy(g);
  }
  if (sendrecv_first) c.poisoned(p.recv[0], N * 4);
  c.sums(a.recv[0], N);
}

// A PreMulSum op for floats (scalar 1) on `comm` (a failure ends the worker).
static ncclRedOp_t premulsum(ncclComm_t comm) {
  float scalar = 1;
  ncclRedOp_t op = ncclSum;
  SETUP(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
  return op;
}

// ---------------------------------------------------------------------------------------------
// The cases. `one`: rank 0 alone, outside a group (what NCCL refuses before enqueuing). `both`:
// both ranks in one group (what NCCL may accept: a lone rank would wait for its peer forever).
// Comments: what NCCL 2.28.9 does. "Accepted": NCCL returns ncclSuccess and enqueues the work.

enum { SHARED = 0, ALONE = 1 };  // ALONE: in a fresh worker, alone (may break the process)

struct Case {
  const char* name;
  int alone;
  void (*run)(Ctx&);
};

// `EACH statement;` runs that one statement for each rank r (what follows it runs once).
#define EACH for (int r = 0; r < NR; r++)

static const Case CASES[] = {
    // --- Buffers: NULL, freed, host memory, another GPU's, misaligned, overlapping ---
    // Accepted (pointers unchecked); the kernel reads address 0: an illegal address on the GPU.
    {"allreduce-null-send", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.send[r] = NULL; c.both(AR, a); }},
    // Accepted; the kernel writes to address 0.
    {"allreduce-null-recv", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.recv[r] = NULL; c.both(AR, a); }},
    // Accepted; every rank's kernel writes to address 0.
    {"broadcast-null-recv", SHARED, [](Ctx& c) {
       Args a = c.args(BROADCAST); EACH a.recv[r] = NULL; c.both(BROADCAST, a); }},
    {"allgather-null-send", SHARED, [](Ctx& c) {
       Args a = c.args(ALLGATHER); EACH a.send[r] = NULL; c.both(ALLGATHER, a); }},
    {"sendrecv-null-buffers", SHARED, [](Ctx& c) {
       Args a = c.args(SENDRECV); EACH a.send[r] = NULL, a.recv[r] = NULL; c.both(SENDRECV, a); }},
    // Accepted; the kernel uses memory freed just before (the driver may keep it mapped: then no
    // fault, as seen on H200).
    {"allreduce-freed-send", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.send[r] = c.freed(r); c.both(AR, a); }},
    {"allreduce-freed-recv", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.recv[r] = c.freed(r); c.both(AR, a); }},
    {"reducescatter-freed-recv", SHARED, [](Ctx& c) {
       Args a = c.args(REDUCESCATTER); EACH a.recv[r] = c.freed(r); c.both(REDUCESCATTER, a); }},
    // Accepted; the kernel uses pageable host memory: an illegal address unless the GPU can reach
    // it (HMM).
    {"allreduce-host-send", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.send[r] = c.host_input(r); c.both(AR, a);
       c.sums(a.recv[0], N); }},
    {"allreduce-host-recv", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.recv[r] = c.out(HOST, N); c.both(AR, a);
       c.sums(a.recv[0], N); }},
    {"allgather-host-recv", SHARED, [](Ctx& c) {
       Args a = c.args(ALLGATHER); EACH a.recv[r] = c.out(HOST, NR * N); c.both(ALLGATHER, a); }},
    // Accepted (the device of a pointer is checked only with NCCL_CHECK_POINTERS=1); the kernel
    // reads the peer GPU's memory through peer access: right sums.
    {"allreduce-other-gpu-send", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.send[r] = c.in[NR - 1 - r]; c.both(AR, a);
       c.sums(a.recv[0], N); }},
    {"allreduce-other-gpu-recv", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.recv[r] = c.out(NR - 1 - r, N); c.both(AR, a);
       c.sums(a.recv[0], N); }},
    {"reduce-other-gpu-recv", SHARED, [](Ctx& c) {
       Args a = c.args(REDUCE); EACH a.recv[r] = c.out(NR - 1 - r, N); c.both(REDUCE, a);
       c.sums(a.recv[0], N); }},
    // Accepted; floats 1 byte off their alignment: the kernel's loads fault (misaligned address).
    {"allreduce-misaligned-send", SHARED, [](Ctx& c) {
       Args a = c.args(AR);
       EACH { char* p = c.watched(r, N * 4 + 1) + 1; c.fill(p, N, r); a.send[r] = p; }
       c.both(AR, a); c.sums(a.recv[0], N); }},
    {"allreduce-misaligned-recv", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.recv[r] = c.out(r, N, 1); c.both(AR, a);
       c.sums(a.recv[0], N); }},
    // Accepted; output overlapping the second half of the input (no defined sums; nothing may
    // change outside the output, the input's first half included).
    {"allreduce-overlap-partial", SHARED, [](Ctx& c) {
       Args a = c.args(AR);
       EACH {
         float* p = (float*)c.watched(r, 2 * N * 4);
         c.fill(p, N, r);
         a.send[r] = p, a.recv[r] = p + N / 2;
         c.output(p + N / 2, N * 4);
       }
       c.both(AR, a); }},
    {"allgather-overlap-partial", SHARED, [](Ctx& c) {
       Args a = c.args(ALLGATHER);
       EACH {
         float* p = (float*)c.watched(r, NR * N * 4);
         c.fill(p + N / 2, N, r);
         a.send[r] = p + N / 2, a.recv[r] = p;
         c.output(p, NR * N * 4);
       }
       c.both(ALLGATHER, a); }},

    // --- Communicators: NULL, foreign ---
    // CommCheck: "comm argument is NULL", ncclInvalidArgument.
    {"allreduce-null-comm", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.comm[0] = NULL; c.one(AR, a); }},
    {"broadcast-null-comm", SHARED, [](Ctx& c) {
       Args a = c.args(BROADCAST); a.comm[0] = NULL; c.one(BROADCAST, a); }},
    {"send-null-comm", SHARED, [](Ctx& c) {
       Args a = c.args(SEND); a.comm[0] = NULL; c.one(SEND, a); }},
    // CommCheck: "corrupted comm object detected" (no magic), ncclInvalidArgument.
    {"allreduce-foreign-comm", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.comm[0] = (ncclComm_t)c.w.zeros; c.one(AR, a); }},
    {"allgather-foreign-comm", SHARED, [](Ctx& c) {
       Args a = c.args(ALLGATHER); a.comm[0] = (ncclComm_t)c.w.zeros; c.one(ALLGATHER, a); }},
    {"commcount-foreign-comm", SHARED, [](Ctx& c) {
       int n = -1; c.call(ncclCommCount((ncclComm_t)c.w.zeros, &n)); }},

    // --- Data types: ArgsCheck "invalid type", ncclInvalidArgument ---
    {"allreduce-type-numtypes", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.type = ncclNumTypes; c.one(AR, a); }},
    {"allreduce-type-minus1", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.type = (ncclDataType_t)-1; c.one(AR, a); }},
    {"allreduce-type-255", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.type = (ncclDataType_t)255; c.one(AR, a); }},
    {"allreduce-type-255-both", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.type = (ncclDataType_t)255; c.both(AR, a); }},
    {"allgather-type-numtypes", SHARED, [](Ctx& c) {
       Args a = c.args(ALLGATHER); a.type = ncclNumTypes; c.one(ALLGATHER, a); }},
    {"reduce-type-minus1", SHARED, [](Ctx& c) {
       Args a = c.args(REDUCE); a.type = (ncclDataType_t)-1; c.one(REDUCE, a); }},
    {"broadcast-type-255", SHARED, [](Ctx& c) {
       Args a = c.args(BROADCAST); a.type = (ncclDataType_t)255; c.one(BROADCAST, a); }},

    // --- Reduction ops ---
    // ArgsCheck "invalid reduction operation" (negative) or "unknown to this communicator".
    {"allreduce-op-numops", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.op[0] = ncclNumOps; c.one(AR, a); }},
    {"allreduce-op-minus1", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.op[0] = (ncclRedOp_t)-1; c.one(AR, a); }},
    {"allreduce-op-255", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.op[0] = (ncclRedOp_t)255; c.one(AR, a); }},
    {"reduce-op-numops", SHARED, [](Ctx& c) {
       Args a = c.args(REDUCE); a.op[0] = ncclNumOps; c.one(REDUCE, a); }},
    {"reducescatter-op-minus1", SHARED, [](Ctx& c) {
       Args a = c.args(REDUCESCATTER); a.op[0] = (ncclRedOp_t)-1; c.one(REDUCESCATTER, a); }},
    // Rank 0 passes rank 1's PreMulSum op (mangled with rank 1's comm: unknown to rank 0's):
    // ncclInvalidArgument for rank 0, and the group's end fails with it (nothing launched).
    {"allreduce-op-other-comms-premulsum", SHARED, [](Ctx& c) {
       Args a = c.args(AR); ncclRedOp_t op = premulsum(c.comm[1]); EACH a.op[r] = op;
       c.both(AR, a); c.sums(a.recv[1], N); SETUP(ncclRedOpDestroy(op, c.comm[1])); }},
    // Ops destroyed before use: "unknown to this communicator", ncclInvalidArgument.
    {"allreduce-op-destroyed-premulsum", SHARED, [](Ctx& c) {
       Args a = c.args(AR);
       EACH { a.op[r] = premulsum(c.comm[r]); SETUP(ncclRedOpDestroy(a.op[r], c.comm[r])); }
       c.both(AR, a); }},
    // A float PreMulSum used on int32: "does not match type", ncclInvalidArgument.
    {"allreduce-premulsum-type-mismatch", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.type = ncclInt32; EACH a.op[r] = premulsum(c.comm[r]);
       c.both(AR, a); EACH SETUP(ncclRedOpDestroy(a.op[r], c.comm[r])); }},

    // --- Counts ---
    // Empty collectives are dropped (ncclSuccess, nothing written), with or without buffers.
    {"allreduce-count-0", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.count = 0; EACH c.output(a.recv[r], 0); c.both(AR, a); }},
    {"allreduce-count-0-null-buffers", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.count = 0; EACH a.send[r] = NULL, a.recv[r] = NULL; c.both(AR, a); }},
    {"allgather-count-0", SHARED, [](Ctx& c) {
       Args a = c.args(ALLGATHER); a.count = 0; EACH c.output(a.recv[r], 0);
       c.both(ALLGATHER, a); }},
    // Zero-byte sends and receives are valid (ncclSuccess).
    {"sendrecv-count-0-null-buffers", SHARED, [](Ctx& c) {
       Args a = c.args(SENDRECV); a.count = 0; EACH a.send[r] = NULL, a.recv[r] = NULL;
       c.both(SENDRECV, a); }},
    // Empty collectives still go through ArgsCheck: a bad type, op or root is
    // ncclInvalidArgument as with elements.
    {"allreduce-count-0-type-255", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.count = 0; a.type = (ncclDataType_t)255; c.one(AR, a); }},
    {"allgather-count-0-type-numtypes", SHARED, [](Ctx& c) {
       Args a = c.args(ALLGATHER); a.count = 0; a.type = ncclNumTypes; c.one(ALLGATHER, a); }},
    {"reducescatter-count-0-op-numops", SHARED, [](Ctx& c) {
       Args a = c.args(REDUCESCATTER); a.count = 0; a.op[0] = ncclNumOps;
       c.one(REDUCESCATTER, a); }},
    {"broadcast-count-0-root-nranks", SHARED, [](Ctx& c) {
       Args a = c.args(BROADCAST); a.count = 0; a.root = NR; c.one(BROADCAST, a); }},
    {"reduce-count-0-root-minus1", SHARED, [](Ctx& c) {
       Args a = c.args(REDUCE); a.count = 0; a.root = -1; c.one(REDUCE, a); }},
    // A PreMulSum op of no elements: accepted while it lives, refused once destroyed.
    {"allreduce-count-0-premulsum", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.count = 0; EACH a.op[r] = premulsum(c.comm[r]); c.both(AR, a);
       EACH SETUP(ncclRedOpDestroy(a.op[r], c.comm[r])); }},
    {"allreduce-count-0-destroyed-premulsum", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.count = 0;
       EACH { a.op[r] = premulsum(c.comm[r]); SETUP(ncclRedOpDestroy(a.op[r], c.comm[r])); }
       c.both(AR, a); }},
    // Dropped before NCCL looks at the stream: another GPU's stream, or a captured one in a
    // group whose other calls are not captured, is accepted (the group's all-reduces: right sums).
    {"allgather-count-0-other-gpu-stream", SHARED, [](Ctx& c) {
       Args a = c.args(ALLGATHER); a.count = 0; EACH a.stream[r] = c.s[NR - 1 - r];
       c.both(ALLGATHER, a); }},
    {"allreduce-count-0-group-mixed-capture", SHARED, [](Ctx& c) { mixed_capture(c, 0); }},
    // count * 4 overflows size_t: unchecked, accepted (all-reduce: an illegal address; broadcast's
    // byte count wraps to 4, no fault seen).
    {"allreduce-count-overflow", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.count = SIZE_MAX / 4 + 2; c.both(AR, a); }},
    {"broadcast-count-overflow", SHARED, [](Ctx& c) {
       Args a = c.args(BROADCAST); a.count = SIZE_MAX / 4 + 2; c.both(BROADCAST, a); }},
    // 2^36 floats (256 GiB) in 8 KiB buffers: accepted; the kernel runs past the buffers.
    {"allreduce-count-past-buffers", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.count = (size_t)1 << 36; c.both(AR, a); }},

    // --- Roots and peers: ArgsCheck "invalid root", ncclInvalidArgument ---
    {"broadcast-root-minus1", SHARED, [](Ctx& c) {
       Args a = c.args(BROADCAST); a.root = -1; c.one(BROADCAST, a); }},
    {"broadcast-root-nranks", SHARED, [](Ctx& c) {
       Args a = c.args(BROADCAST); a.root = NR; c.one(BROADCAST, a); }},
    {"bcast-root-nranks", SHARED, [](Ctx& c) {
       Args a = c.args(BCAST); a.root = NR; c.one(BCAST, a); }},
    {"reduce-root-minus1", SHARED, [](Ctx& c) {
       Args a = c.args(REDUCE); a.root = -1; c.one(REDUCE, a); }},
    {"reduce-root-nranks", SHARED, [](Ctx& c) {
       Args a = c.args(REDUCE); a.root = NR; c.one(REDUCE, a); }},
    {"reduce-root-nranks-both", SHARED, [](Ctx& c) {
       Args a = c.args(REDUCE); a.root = NR; c.both(REDUCE, a); }},
#if HAS_2_28
    {"gather-root-nranks", SHARED, [](Ctx& c) {
       Args a = c.args(GATHER); a.root = NR; c.one(GATHER, a); }},
    {"scatter-root-minus1", SHARED, [](Ctx& c) {
       Args a = c.args(SCATTER); a.root = -1; c.one(SCATTER, a); }},
#endif
    // The peer goes through the root check.
    {"send-peer-minus1", SHARED, [](Ctx& c) {
       Args a = c.args(SEND); a.peer[0] = -1; c.one(SEND, a); }},
    {"send-peer-nranks", SHARED, [](Ctx& c) {
       Args a = c.args(SEND); a.peer[0] = NR; c.one(SEND, a); }},
    {"recv-peer-nranks", SHARED, [](Ctx& c) {
       Args a = c.args(RECV); a.peer[0] = NR; c.one(RECV, a); }},
    // A send to self without its receive: the group's end fails, "Trying to send to self
    // without a matching recv", ncclInvalidUsage.
    {"send-to-self-without-recv", SHARED, [](Ctx& c) {
       Args a = c.args(SEND); a.peer[0] = 0; c.start(); c.call(issue(SEND, a, 0));
       c.ended(ncclGroupEnd()); }},

    // --- Groups ---
    // "ncclGroupEnd: not in a group call.", ncclInvalidUsage.
    {"groupend-without-start", SHARED, [](Ctx& c) { c.call(ncclGroupEnd()); }},
    // Started twice, ended once: the all-reduces wait inside the outer group (ncclSuccess, not
    // launched: output untouched) until the second end launches them (right sums).
    {"group-started-twice-ended-once", SHARED, [](Ctx& c) {
       Args a = c.args(AR);
       c.call(ncclGroupStart()); c.call(ncclGroupStart()); c.call(ncclGroupEnd());
       EACH c.call(issue(AR, a, r));
       c.sums(a.recv[0], N); c.ended(ncclGroupEnd()); c.sums(a.recv[0], N); }},
    // One start, two ends: the second is ncclInvalidUsage; the group's work ran at the first.
    {"group-ended-twice", SHARED, [](Ctx& c) {
       Args a = c.args(AR); c.start(); EACH c.call(issue(AR, a, r));
       c.call(ncclGroupEnd()); c.ended(ncclGroupEnd()); c.sums(a.recv[0], N); }},
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 22, 0)
    // A group ended by ncclGroupSimulateEnd: its all-reduces are estimated, never launched
    // (output untouched), and the group is over: the next group runs (right sums).
    {"group-simulated-end", SHARED, [](Ctx& c) {
       Args a = c.args(AR); ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
       c.start(); EACH c.call(issue(AR, a, r)); c.call(ncclGroupSimulateEnd(&sim));
       c.sums(a.recv[0], N); c.both(AR, a); c.sums(a.recv[0], N); }},
    // Its ncclSimInfo_t not made with NCCL_SIM_INFO_INITIALIZER: "ncclSimInfo_t argument not
    // initialized via NCCL_SIM_INFO_INITIALIZER", ncclInvalidArgument; the group is over all the
    // same, nothing of it launched.
    {"group-simulated-end-bad-info", SHARED, [](Ctx& c) {
       Args a = c.args(AR); ncclSimInfo_t sim; memset(&sim, 0, sizeof sim); sim.size = sizeof sim;
       c.start(); EACH c.call(issue(AR, a, r)); c.call(ncclGroupSimulateEnd(&sim));
       c.sums(a.recv[0], N); c.both(AR, a); c.sums(a.recv[0], N); }},
#endif
    // Rank 0's all-reduce is valid, rank 1's has a bad type: the group fails as a whole
    // (ncclInvalidArgument at its end) and rank 0's never runs (output untouched).
    {"allreduce-group-one-bad-rank", SHARED, [](Ctx& c) {
       Args a = c.args(AR); c.start(); c.call(issue(AR, a, 0));
       a.type = (ncclDataType_t)255; c.call(issue(AR, a, 1)); c.ended(ncclGroupEnd());
       c.sums(a.recv[0], N); }},
    // In one group, each communicator gets an all-reduce on an uncaptured stream, then one on a
    // stream being captured: "Streams given to a communicator within a NCCL group must either be
    // all uncaptured or all captured by the same graph", ncclInvalidUsage, nothing launched.
    {"allreduce-group-mixed-capture", SHARED, [](Ctx& c) { mixed_capture(c, N); }},
    // The same after a send and a receive in the group, which NCCL takes: none of it runs.
    {"allreduce-group-mixed-capture-after-sendrecv", SHARED,
     [](Ctx& c) { mixed_capture(c, N, true); }},

    // --- Streams ---
    // Each rank's all-reduce on the other GPU's stream: the calls are accepted, the launch at the
    // group's end fails (CUDA: invalid resource handle), ncclUnhandledCudaError.
    {"allreduce-other-gpu-stream", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.stream[r] = c.s[NR - 1 - r]; c.both(AR, a);
       c.sums(a.recv[0], N); }},
    {"broadcast-other-gpu-stream", SHARED, [](Ctx& c) {
       Args a = c.args(BROADCAST); EACH a.stream[r] = c.s[NR - 1 - r]; c.both(BROADCAST, a); }},
    // Both ranks on one stream of GPU 1, being captured: rank 0's is another GPU's stream; the
    // group's end fails as above, ncclUnhandledCudaError.
    {"allreduce-captured-other-gpu-stream", SHARED, [](Ctx& c) {
       Args a = c.args(AR); cudaStream_t st = c.stream(1); EACH a.stream[r] = st;
       SETUP(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed)); c.both(AR, a);
       cudaGraph_t g = NULL; c.note(cudaGetErrorName(cudaStreamEndCapture(st, &g)));
       if (g) cudaGraphDestroy(g); }},
    // The NULL stream with GPU 0 current: each communicator's own GPU's legacy stream (NCCL
    // switches to the communicator's GPU): valid, right sums.
    {"allreduce-null-stream", SHARED, [](Ctx& c) {
       Args a = c.args(AR); EACH a.stream[r] = NULL; c.both(AR, a); c.sums(a.recv[1], N); }},
    // A destroyed stream: undefined in CUDA (a segmentation fault seen); in a fresh worker.
    {"allreduce-destroyed-stream", ALONE, [](Ctx& c) {
       Args a = c.args(AR);
       EACH {
         cudaStream_t st;
         SETUP(cudaSetDevice(r));
         SETUP(cudaStreamCreate(&st));
         SETUP(cudaStreamDestroy(st));
         a.stream[r] = st;
       }
       SETUP(cudaSetDevice(0)); c.both(AR, a); }},

    // --- Queries: PtrCheck / CommCheck, ncclInvalidArgument ---
    {"commcount-null-out", SHARED, [](Ctx& c) { c.call(ncclCommCount(c.comm[0], NULL)); }},
    {"commuserrank-null-out", SHARED, [](Ctx& c) { c.call(ncclCommUserRank(c.comm[0], NULL)); }},
    {"commcudevice-null-out", SHARED, [](Ctx& c) { c.call(ncclCommCuDevice(c.comm[0], NULL)); }},
    {"commcount-null-comm", SHARED, [](Ctx& c) { int n = -1; c.call(ncclCommCount(NULL, &n)); }},
    {"getasyncerror-null-out", SHARED, [](Ctx& c) {
       c.call(ncclCommGetAsyncError(c.comm[0], NULL)); }},
    {"getasyncerror-null-comm", SHARED, [](Ctx& c) {
       ncclResult_t e; c.call(ncclCommGetAsyncError(NULL, &e)); }},
    // No WARN for these two.
    {"getversion-null", SHARED, [](Ctx& c) { c.call(ncclGetVersion(NULL)); }},
    {"getuniqueid-null", SHARED, [](Ctx& c) { c.call(ncclGetUniqueId(NULL)); }},

    // --- Making communicators: refused before any bootstrap (the zeroed id is never used) ---
    // "Invalid rank requested", ncclInvalidArgument, *comm set NULL.
    {"initrank-rank-nranks", SHARED, [](Ctx& c) {
       ncclUniqueId id = {}; ncclComm_t k = c.comm[0]; c.call(ncclCommInitRank(&k, NR, id, NR));
       c.note(k ? "comm-set" : "comm-null"); }},
    {"initrank-rank-minus1", SHARED, [](Ctx& c) {
       ncclUniqueId id = {}; ncclComm_t k = c.comm[0]; c.call(ncclCommInitRank(&k, NR, id, -1));
       c.note(k ? "comm-set" : "comm-null"); }},
    // nranks 0: "improper usage of ncclCommInitRank: nId = 1, nranks=0", ncclInvalidArgument.
    {"initrank-nranks-0", SHARED, [](Ctx& c) {
       ncclUniqueId id = {}; ncclComm_t k = c.comm[0]; c.call(ncclCommInitRank(&k, 0, id, 0));
       c.note(k ? "comm-set" : "comm-null"); }},
    {"initrank-null-comm", SHARED, [](Ctx& c) {
       ncclUniqueId id = {}; c.call(ncclCommInitRank(NULL, NR, id, 0)); }},
    // A config not made by NCCL_CONFIG_INITIALIZER: "ncclConfig_t argument not initialized".
    {"initrankconfig-zeroed-config", SHARED, [](Ctx& c) {
       ncclUniqueId id = {}; ncclComm_t k = NULL;
       ncclConfig_t config; memset(&config, 0, sizeof config);
       c.call(ncclCommInitRankConfig(&k, NR, id, 0, &config));
       c.note(k ? "comm-set" : "comm-null"); }},
    // nId 0 (no ids, NULL): "improper usage", ncclInvalidArgument.
    {"initrankscalable-no-ids", SHARED, [](Ctx& c) {
       ncclComm_t k = NULL; c.call(ncclCommInitRankScalable(&k, NR, 0, 0, NULL, NULL)); }},
    // One id, NULL: NCCL copies the id from NULL (a segmentation fault): in a fresh worker.
    {"initrankscalable-null-ids", ALONE, [](Ctx& c) {
       ncclComm_t k = NULL; c.call(ncclCommInitRankScalable(&k, NR, 0, 1, NULL, NULL)); }},
    // "Invalid device count", ncclInvalidArgument; an unknown device: "Invalid device",
    // ncclInvalidArgument; a device twice: ncclInvalidUsage; NULL comms: ncclInvalidArgument.
    {"initall-ndev-minus1", SHARED, [](Ctx& c) {
       ncclComm_t k[NR]; c.call(ncclCommInitAll(k, -1, NULL)); }},
    {"initall-unknown-device", SHARED, [](Ctx& c) {
       ncclComm_t k[NR]; int devs[NR] = {0, 4096}; c.call(ncclCommInitAll(k, NR, devs)); }},
    {"initall-device-twice", SHARED, [](Ctx& c) {
       ncclComm_t k[NR]; int devs[NR] = {0, 0}; c.call(ncclCommInitAll(k, NR, devs)); }},
    {"initall-null-comms", SHARED, [](Ctx& c) { c.call(ncclCommInitAll(NULL, NR, NULL)); }},

    // --- Strings ---
    // Out-of-range codes: "unknown result code" (no call result).
    {"errorstring-out-of-range", SHARED, [](Ctx& c) {
       c.note(ncclGetErrorString(ncclNumResults)); c.note(ncclGetErrorString((ncclResult_t)-1));
       c.note(ncclGetErrorString((ncclResult_t)1000)); }},
    // The last error after a bad type: NCCL's WARN message ("ncclAllReduce : invalid type 255").
    {"getlasterror-after-bad-type", SHARED, [](Ctx& c) {
       Args a = c.args(AR); a.type = (ncclDataType_t)255; c.one(AR, a);
       c.note(ncclGetLastError(NULL)); }},

    // --- Reduction op handles ---
    // "operator is a NCCL builtin" / "operator is garbage" / "unknown to this communicator" (the
    // second destroy) / "invalid communicator passed": all ncclInvalidArgument.
    {"redopdestroy-builtin", SHARED, [](Ctx& c) { c.call(ncclRedOpDestroy(ncclSum, c.comm[0])); }},
    {"redopdestroy-minus1", SHARED, [](Ctx& c) {
       c.call(ncclRedOpDestroy((ncclRedOp_t)-1, c.comm[0])); }},
    {"redopdestroy-twice", SHARED, [](Ctx& c) {
       ncclRedOp_t op = premulsum(c.comm[0]); c.call(ncclRedOpDestroy(op, c.comm[0]));
       c.call(ncclRedOpDestroy(op, c.comm[0])); }},
    {"redopdestroy-null-comm", SHARED, [](Ctx& c) {
       ncclRedOp_t op = premulsum(c.comm[0]); c.call(ncclRedOpDestroy(op, NULL));
       ncclRedOpDestroy(op, c.comm[0]); }},
    // CommCheck: ncclInvalidArgument.
    {"redopcreate-null-comm", SHARED, [](Ctx& c) {
       float x = 1; ncclRedOp_t op;
       c.call(ncclRedOpCreatePreMulSum(&op, &x, ncclFloat, ncclScalarHostImmediate, NULL)); }},
    // A host scalar of type 255 has no size: ncclInternalError (the op's slot stays taken).
    {"redopcreate-type-255", SHARED, [](Ctx& c) {
       double x = 1; ncclRedOp_t op; ncclDataType_t type = (ncclDataType_t)255;
       c.call(ncclRedOpCreatePreMulSum(&op, &x, type, ncclScalarHostImmediate, c.comm[0])); }},

    // --- Memory ---
    // cudaFree(NULL): ncclSuccess. cudaMalloc(NULL, ...): ncclUnhandledCudaError. Size 0:
    // cudaMalloc of 0 bytes, ncclSuccess. A cudaMalloc pointer is no cuMem allocation and a host
    // pointer no device's: ncclUnhandledCudaError.
    {"memfree-null", SHARED, [](Ctx& c) { c.call(ncclMemFree(NULL)); }},
    {"memalloc-null-out", SHARED, [](Ctx& c) { c.call(ncclMemAlloc(NULL, 4096)); }},
    {"memalloc-size-0", SHARED, [](Ctx& c) {
       void* p = (void*)1; c.call(ncclMemAlloc(&p, 0)); c.note(p == NULL ? "ptr-null" : "ptr-set");
       if (p && p != (void*)1) ncclMemFree(p); }},
    {"memfree-cudamalloc-pointer", SHARED, [](Ctx& c) { c.call(ncclMemFree(c.scratch(0, 4096))); }},
    {"memfree-host-pointer", SHARED, [](Ctx& c) { char x[64]; c.call(ncclMemFree(x)); }},

    // --- Registration ---
    // Local registration is lazy: NULL and 0 bytes are recorded as given (ncclSuccess, a
    // handle); a NULL comm: CommCheck, ncclInvalidArgument; deregistering NULL: ncclSuccess; an
    // unknown handle: "Could not find handle", ncclInvalidUsage.
    {"commregister-null-buff", SHARED, [](Ctx& c) {
       void* h = NULL; c.call(ncclCommRegister(c.comm[0], NULL, 4096, &h));
       c.note(h ? "handle" : "no-handle"); if (h) c.call(ncclCommDeregister(c.comm[0], h)); }},
    {"commregister-size-0", SHARED, [](Ctx& c) {
       void* h = NULL; c.call(ncclCommRegister(c.comm[0], c.scratch(0, 4096), 0, &h));
       c.note(h ? "handle" : "no-handle"); if (h) c.call(ncclCommDeregister(c.comm[0], h)); }},
    {"commregister-null-comm", SHARED, [](Ctx& c) {
       void* h = NULL; c.call(ncclCommRegister(NULL, c.scratch(0, 4096), 4096, &h)); }},
    {"commderegister-null-handle", SHARED, [](Ctx& c) {
       c.call(ncclCommDeregister(c.comm[0], NULL)); }},
    {"commderegister-unknown-handle", SHARED, [](Ctx& c) {
       static char fake[4096]; c.call(ncclCommDeregister(c.comm[0], fake)); }},

    // --- Split and shrink ---
    // A negative color other than NCCL_SPLIT_NOCOLOR is just a color: both ranks get a child
    // of 2 ranks (ncclSuccess), whose all-reduce sums right.
    {"split-color-minus2", SHARED, [](Ctx& c) {
       ncclComm_t k[NR] = {NULL, NULL}; c.start();
       EACH c.call(ncclCommSplit(c.comm[r], -2, r, &k[r], NULL));
       c.ended(ncclGroupEnd());
       if (k[0] && k[1]) c.note(all_reduce_right(c.w, k)), destroy_comms(c, k);
       else c.note("no-child"); }},
    // NCCL_SPLIT_NOCOLOR on both: ncclSuccess, no child (NULL).
    {"split-nocolor-both", SHARED, [](Ctx& c) {
       ncclComm_t k[NR] = {c.comm[0], c.comm[1]}; c.start();
       EACH c.call(ncclCommSplit(c.comm[r], NCCL_SPLIT_NOCOLOR, r, &k[r], NULL));
       c.ended(ncclGroupEnd());
       EACH c.note(k[r] ? "child" : "null"); }},
    // PtrCheck / CommCheck: ncclInvalidArgument, before any exchange.
    {"split-null-newcomm", SHARED, [](Ctx& c) {
       c.call(ncclCommSplit(c.comm[0], 0, 0, NULL, NULL)); }},
    {"split-null-comm", SHARED, [](Ctx& c) {
       ncclComm_t k = NULL; c.call(ncclCommSplit(NULL, 0, 0, &k, NULL)); }},
    // A rank may not exclude itself; a NULL list: ncclInvalidArgument.
    {"shrink-excluding-self", SHARED, [](Ctx& c) {
       int ex[1] = {0}; ncclComm_t k = NULL;
       c.call(ncclCommShrink(c.comm[0], ex, 1, &k, NULL, NCCL_SHRINK_DEFAULT)); }},
    {"shrink-null-list", SHARED, [](Ctx& c) {
       ncclComm_t k = NULL;
       c.call(ncclCommShrink(c.comm[0], NULL, 1, &k, NULL, NCCL_SHRINK_DEFAULT)); }},

    // --- Finalize, revoke, destroy (on communicators of the case's own) ---
    // NULL: ncclSuccess, nothing done.
    {"finalize-destroy-abort-null", SHARED, [](Ctx& c) {
       c.call(ncclCommFinalize(NULL)); c.call(ncclCommDestroy(NULL));
       c.call(ncclCommAbort(NULL)); }},
    // The second finalize: "prevent double finalize", ncclInvalidArgument.
    {"finalize-twice", SHARED, [](Ctx& c) {
       ncclComm_t k[NR]; fresh_comms(k); finalize_comms(k); c.call(ncclCommFinalize(k[0]));
       destroy_comms(c, k); }},
    // An all-reduce after finalize: NCCL takes the calls, then hangs in the group's end.
    {"allreduce-after-finalize", SHARED, [](Ctx& c) {
       ncclComm_t k[NR]; fresh_comms(k); finalize_comms(k); Args a = c.args(AR);
       EACH a.comm[r] = k[r];
       c.both(AR, a); c.sums(a.recv[0], N); destroy_comms(c, k); }},
#if HAS_2_28
    // Revoke flags other than NCCL_REVOKE_DEFAULT: ncclInvalidArgument.
    {"revoke-bad-flags", SHARED, [](Ctx& c) { c.call(ncclCommRevoke(c.comm[0], 1)); }},
    // An all-reduce on revoked communicators: "communicator was revoked", ncclInvalidUsage.
    {"allreduce-after-revoke", SHARED, [](Ctx& c) {
       ncclComm_t k[NR]; fresh_comms(k); EACH SETUP(ncclCommRevoke(k[r], NCCL_REVOKE_DEFAULT));
       Args a = c.args(AR); EACH a.comm[r] = k[r];
       c.both(AR, a); c.sums(a.recv[0], N); destroy_comms(c, k); }},
#endif
    // Use after ncclCommDestroy: NCCL reads freed memory (undefined; seen: CommCheck fails,
    // ncclInvalidArgument; a second destroy: "comm ... has already been destroyed",
    // ncclInvalidArgument, returning inside its own group: no later group of NCCL's launches, and
    // the check after the case finds no sums): in fresh workers, last.
    {"allreduce-destroyed-comm", ALONE, [](Ctx& c) {
       ncclComm_t k[NR]; fresh_comms(k); destroy_comms(c, k); Args a = c.args(AR);
       EACH a.comm[r] = k[r];
       c.both(AR, a); }},
    {"destroy-twice", ALONE, [](Ctx& c) {
       ncclComm_t k[NR]; fresh_comms(k); destroy_comms(c, k); c.call(ncclCommDestroy(k[0])); }},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

// ---------------------------------------------------------------------------------------------
// The worker: runs cases in this process, each under the deadline.

static int g_deadline = 15;
static char g_line[2048];          // the case's line as far as known, for the alarm
static const char* volatile g_stage = "call";  // "call": no call returned yet
static int g_case;

static void on_alarm(int) {
  char msg[2200];
  int n = strcmp(g_stage, "call") == 0
              ? snprintf(msg, sizeof msg, "case %d %s hung\n", g_case + 1, CASES[g_case].name)
              : snprintf(msg, sizeof msg, "%s hung %s\n", g_line, g_stage);
  ssize_t w = write(1, msg, n);
  (void)w;
  _exit(3);
}

void Ctx::call(ncclResult_t r) {
  calls.push_back(r);
  call_done();
}

// Writes what is known of the case's line, for the alarm.
void Ctx::call_done() {
  std::string line = "case " + std::to_string(g_case + 1) + " " + CASES[g_case].name + " result ";
  line += calls.empty() ? "- none"
                        : std::to_string(calls[0]) + " " + result_name(calls[0]);
  for (size_t i = 0; i < calls.size() && calls.size() > 1; i++)
    line += (i ? "," : " calls ") + std::to_string(calls[i]);
  if (end != NO_RESULT) line += " end " + std::to_string(end);
  if (!value.empty()) line += " value " + value;
  snprintf(g_line, sizeof g_line, "%s", line.c_str());
  g_stage = "case";
}

// Synchronizes the case's streams and both GPUs: "ok" or the first CUDA error's name.
static const char* sync_all(Ctx& c) {
  cudaError_t e = cudaSuccess;
  for (int r = 0; r < NR && e == cudaSuccess; r++) e = cudaStreamSynchronize(c.s[r]);
  for (size_t i = 0; i < c.streams.size() && e == cudaSuccess; i++)
    e = cudaStreamSynchronize(c.streams[i]);
  for (int d = 0; d < NR && e == cudaSuccess; d++) {
    e = cudaSetDevice(d);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
  }
  cudaSetDevice(0);
  return e == cudaSuccess ? "ok" : cudaGetErrorName(e);
}

// Whether every watched byte outside the outputs kept its value: "ok", "bad:<bytes changed>",
// "err" (unreadable), "-" (nothing watched).
static std::string check_guards(Ctx& c) {
  if (c.bufs.empty()) return "-";
  long changed = 0;
  for (Buf& b : c.bufs) {
    std::vector<unsigned char> now(b.bytes);
    if (b.dev == HOST) memcpy(now.data(), b.base, b.bytes);
    else if (cudaMemcpy(now.data(), b.base, b.bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
      return "err";
    for (size_t i = 0; i < b.bytes; i++)
      if ((i < b.out_lo || i >= b.out_hi) && now[i] != b.expect[i]) changed++;
  }
  return changed ? "bad:" + std::to_string(changed) : "ok";
}

static void release(Ctx& c) {
  for (Buf& b : c.bufs) b.dev == HOST ? free(b.base) : (void)cudaFree(b.base);
  for (void* p : c.plain_dev) cudaFree(p);
  for (void* p : c.plain_host) free(p);
  for (cudaStream_t st : c.streams) cudaStreamDestroy(st);
  cudaSetDevice(0);
}

// Runs case i; whether the worker may go on with the next.
static bool run_case(World& w, int i) {
  g_case = i;
  g_stage = "call";
  printf("begin %d %s\n", i + 1, CASES[i].name);
  fflush(stdout);
  alarm(g_deadline);
  Ctx c(w);
  cudaSetDevice(0);
  CASES[i].run(c);
  c.call_done();
  g_stage = "sync";
  const char* synced = sync_all(c);
  g_stage = "guard";
  std::string guard = check_guards(c);
  g_stage = "after";
  const char* after = all_reduce_right(w, w.comm);
  alarm(0);
  printf("%s sync %s guard %s after %s\n", g_line, synced, guard.c_str(), after);
  fflush(stdout);
  release(c);
  return strcmp(synced, "ok") == 0 && strcmp(after, "ok") == 0;
}

static int worker(int first, int last) {
  signal(SIGALRM, on_alarm);
  alarm(120);  // the set-up
  World w;
  int devs[NR] = {0, 1};
  SETUP(ncclCommInitAll(w.comm, NR, devs));
  for (int r = 0; r < NR; r++) {
    SETUP(cudaSetDevice(r));
    SETUP(cudaStreamCreateWithFlags(&w.s[r], cudaStreamNonBlocking));
    SETUP(cudaMalloc(&w.in[r], NR * N * 4));
    SETUP(cudaMalloc(&w.after_in[r], N * 4));
    SETUP(cudaMalloc(&w.after_out[r], N * 4));
    std::vector<float> h(NR * N);
    for (size_t i = 0; i < NR * N; i++) h[i] = pattern(r, i);
    SETUP(cudaMemcpy(w.in[r], h.data(), NR * N * 4, cudaMemcpyHostToDevice));
    SETUP(cudaMemcpy(w.after_in[r], h.data(), N * 4, cudaMemcpyHostToDevice));
  }
  SETUP(cudaSetDevice(0));
  w.zeros = calloc(1, 1 << 20);
  print_mapped_nccl("# ");
  alarm(0);
  for (int i = first; i <= last; i++) {
    if (CASES[i].alone && i != first) break;  // an alone case starts a worker of its own
    if (!run_case(w, i) || CASES[i].alone) break;
  }
  fflush(stdout);
  _exit(0);  // no teardown: a case may have left NCCL or CUDA in any state
}

// ---------------------------------------------------------------------------------------------
// The driver: runs cases [first, last] in workers, one after another; reports a case whose
// worker died in it as crashed, and one whose worker it had to kill as hung.

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int driver(int first, int last) {
  int next = first;
  while (next <= last) {
    int fds[2];
    if (pipe(fds) != 0) return 2;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      char range[64], deadline[32];
      snprintf(range, sizeof range, "%d-%d", next + 1, last + 1);
      snprintf(deadline, sizeof deadline, "%d", g_deadline);
      execl("/proc/self/exe", "bad_input", "--worker", "--cases", range, "--deadline", deadline,
            (char*)NULL);
      _exit(127);
    }
    close(fds[1]);
    FILE* from = fdopen(fds[0], "r");
    int open_case = -1, done = next - 1, killed = 0, begun = 0;
    double since = now(), limit = 150;  // the worker's set-up, then each case's deadline
    char line[8192];
    for (;;) {
      struct pollfd p = {fds[0], POLLIN, 0};
      double left = since + limit - now();
      if (poll(&p, 1, left > 0 ? (int)(left * 1000) + 1 : 0) == 0) {
        kill(pid, SIGKILL);  // past its own alarm: stuck where no signal handler runs
        killed = 1;
        break;
      }
      if (!fgets(line, sizeof line, from)) break;
      fputs(line, stdout);
      int id;
      if (sscanf(line, "begin %d", &id) == 1) {
        open_case = id - 1, begun = 1, since = now(), limit = g_deadline + 15;
      } else if (sscanf(line, "case %d", &id) == 1) {
        done = id - 1, open_case = -1;
      }
    }
    fclose(from);
    int status = 0;
    waitpid(pid, &status, 0);
    if (open_case >= 0) {
      printf("case %d %s %s\n", open_case + 1, CASES[open_case].name, killed ? "hung" : "crashed");
      printf("# worker %s (%s %d)\n", killed ? "killed" : "died",
             WIFSIGNALED(status) ? "signal" : "exit status",
             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      done = open_case;
    }
    if (!begun) {
      printf("# a worker failed before its first case (exit status %d): stopping\n",
             WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      return 2;
    }
    next = done + 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int first = 1, last = NCASES, as_worker = 0;
  for (int i = 1; i < argc; i++) {
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(argv[i], "--list")) {
      for (int k = 0; k < NCASES; k++)
        printf("%d %s %s\n", k + 1, CASES[k].name, CASES[k].alone ? "alone" : "shared");
      return 0;
    } else if (!strcmp(argv[i], "--cases")) {
      i++;
      if (sscanf(v, "%d-%d", &first, &last) == 1) last = first;
    } else if (!strcmp(argv[i], "--deadline")) {
      g_deadline = atoi(v);
      i++;
    } else if (!strcmp(argv[i], "--worker")) {
      as_worker = 1;
    } else {
      fprintf(stderr, "usage: see the comment at the top of bad_input.cu\n");
      return 2;
    }
  }
  if (first < 1 || last > NCASES || first > last || g_deadline < 1) {
    fprintf(stderr, "cases are 1-%d\n", NCASES);
    return 2;
  }
  return as_worker ? worker(first - 1, last - 1) : driver(first - 1, last - 1);
}
