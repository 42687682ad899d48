// The correctness matrix on the GPUs: every collective, type and op of matrix.h, each output
// element compared exactly with the host reference, under one way of driving NCCL per run:
//   collectives --launch procs|threads|group|initall [--nonblocking] [--graph] [--memalloc]
//               [--split] [--realloc] [--windows] [--matrix full|quick] [--max-bytes N]
//               [--ngpus N] [--timeout S] [--alltoall-in-place]
// procs: one process per GPU (fork; rank 0 shares the unique id through a file), ncclCommInitRank.
// threads: one thread per GPU, ncclCommInitRank. group: one thread drives every GPU, comms made by
// ncclCommInitRankConfig inside a group, collectives issued with GPU 0 current (as nccl-tests -g).
// initall: one thread, ncclCommInitAll. --nonblocking: blocking=0 communicators, ncclInProgress
// waited out with ncclCommGetAsyncError. --graph: each test captured in a CUDA graph and replayed
// twice on fresh inputs. --split: the quick matrix again on children from ncclCommSplit, then on
// children of every rank but the last (NCCL_SPLIT_NOCOLOR).
// --alltoall-in-place: also all-to-all in place (every rank, and the first rank only), which
// only the core gets right: for runs where it takes every all-to-all.
// --memalloc: buffers from ncclMemAlloc instead of cudaMalloc. --realloc: the buffers freed and
// allocated again before every test (cudaMalloc mostly gives the same addresses back: memory that
// peers may have mapped under those addresses before must not be read through those mappings).
// --windows (with --memalloc): both buffers registered as symmetric windows
// (NCCL_WIN_COLL_SYMMETRIC, NCCL's symmetric kernels) on the first communicators (in one group
// where a thread drives several GPUs), the matrix run, the windows deregistered and the matrix
// run again on the same buffers; a nonblocking communicator's registrations waited out as its
// other calls.
// Prints "#wrong N" (wrong elements, damaged guard bytes and failed calls); exits 1 unless 0.
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_check.h"
#include "mapped_nccl.h"
#include "matrix.h"

#define MAX_LOCAL 16
#define POISON 0xA5
#define MAX_REPORTS 40  // failing tests printed per process

// Set-up calls: any failure ends the process (ncclInProgress is fine, see settle()).
#define NCCL_CHECK(call)                                                               \
  do {                                                                                 \
    ncclResult_t r_ = (call);                                                          \
    if (r_ != ncclSuccess && r_ != ncclInProgress) {                                   \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
      exit(2);                                                                         \
    }                                                                                  \
  } while (0)

enum { L_PROCS, L_THREADS, L_GROUP, L_INITALL };

static struct {
  int launch, nonblocking, graph, memalloc, split, realloc, windows, matrix, ngpus, timeout, alltoall_in_place;
  size_t max_bytes;
} opt = {L_PROCS, 0, 0, 0, 0, 0, 0, MATRIX_FULL, 0, 600, 0, 256u << 20};

// --realloc: buffers allocated again, and how many came back at the same address.
static struct {
  long made, same;
} reallocs;

// One communicator member that this thread drives.
typedef struct {
  int dev, rank, nranks;
  ncclComm_t comm;
  cudaStream_t stream;
  char *send, *recv;  // device allocations of `alloc` bytes each
  size_t alloc;
  ncclWindow_t windows[2];  // --windows: send's and recv's
  unsigned char* host;  // staging for inputs and outputs, `alloc` bytes
  void* scalar;         // device memory for PreMulSum's scalar
} Rank;

typedef struct {
  long checks, elements, wrong, errors, reports;
} Tally;

static void tally_add(Tally* to, const Tally* from) {
  to->checks += from->checks;
  to->elements += from->elements;
  to->wrong += from->wrong;
  to->errors += from->errors;
}

static ncclConfig_t comm_config(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (opt.nonblocking) config.blocking = 0;
  return config;
}

// Waits while a nonblocking communicator is busy; returns its state.
static ncclResult_t settle(ncclComm_t comm) {
  ncclResult_t state;
  do {
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
  } while (state == ncclInProgress);
  return state;
}

// Waits for the communicator to be ready and learns the rank's place in it.
static void identify(Rank* R) {
  NCCL_CHECK(settle(R->comm));
  NCCL_CHECK(ncclCommUserRank(R->comm, &R->rank));
  NCCL_CHECK(ncclCommCount(R->comm, &R->nranks));
}

static void setup_rank(Rank* R, size_t alloc) {
  CUDA_CHECK(cudaSetDevice(R->dev));
  CUDA_CHECK(cudaStreamCreateWithFlags(&R->stream, cudaStreamNonBlocking));
  R->alloc = alloc;
  if (opt.memalloc) {
    NCCL_CHECK(ncclMemAlloc((void**)&R->send, alloc));
    NCCL_CHECK(ncclMemAlloc((void**)&R->recv, alloc));
  } else {
    CUDA_CHECK(cudaMalloc(&R->send, alloc));
    CUDA_CHECK(cudaMalloc(&R->recv, alloc));
  }
  CUDA_CHECK(cudaMalloc(&R->scalar, 8));
  R->host = (unsigned char*)malloc(alloc);
  if (!R->host) {
    fprintf(stderr, "out of host memory\n");
    exit(2);
  }
}

// Frees the rank's buffers and allocates them again (--realloc).
static void realloc_rank(Rank* R) {
  CUDA_CHECK(cudaSetDevice(R->dev));
  char* before[2] = {R->send, R->recv};
  CUDA_CHECK(cudaFree(R->send));
  CUDA_CHECK(cudaFree(R->recv));
  CUDA_CHECK(cudaMalloc(&R->send, R->alloc));
  CUDA_CHECK(cudaMalloc(&R->recv, R->alloc));
  __atomic_add_fetch(&reallocs.made, 2, __ATOMIC_RELAXED);
  __atomic_add_fetch(&reallocs.same, (R->send == before[0]) + (R->recv == before[1]), __ATOMIC_RELAXED);
}

static void free_rank(Rank* R) {
  CUDA_CHECK(cudaSetDevice(R->dev));
  if (opt.memalloc) {
    NCCL_CHECK(ncclMemFree(R->send));
    NCCL_CHECK(ncclMemFree(R->recv));
  } else {
    CUDA_CHECK(cudaFree(R->send));
    CUDA_CHECK(cudaFree(R->recv));
  }
  CUDA_CHECK(cudaFree(R->scalar));
  CUDA_CHECK(cudaStreamDestroy(R->stream));
  free(R->host);
}

// --windows: registers (`on`) or deregisters every rank's buffers as symmetric windows, in one
// group where the thread drives several GPUs (else one call at a time), and waits until every
// communicator is done.
static void windows(Rank* rs, int nl, int on) {
  if (nl > 1) NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < nl; r++) {
    CUDA_CHECK(cudaSetDevice(rs[r].dev));
    char* buffers[2] = {rs[r].send, rs[r].recv};
    for (int b = 0; b < 2; b++) {
      if (on) {
        NCCL_CHECK(ncclCommWindowRegister(rs[r].comm, buffers[b], rs[r].alloc, &rs[r].windows[b],
                                          NCCL_WIN_COLL_SYMMETRIC));
      } else {
        NCCL_CHECK(ncclCommWindowDeregister(rs[r].comm, rs[r].windows[b]));
      }
      // A nonblocking communicator takes no call while the last is in progress.
      if (nl == 1) NCCL_CHECK(settle(rs[r].comm));
    }
  }
  if (nl > 1) NCCL_CHECK(ncclGroupEnd());
  for (int r = 0; r < nl; r++) NCCL_CHECK(settle(rs[r].comm));
}

// Finalizes (collectively, in one group) and destroys the communicators.
static void destroy_comms(Rank* rs, int nl) {
  NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < nl; r++) NCCL_CHECK(ncclCommFinalize(rs[r].comm));
  NCCL_CHECK(ncclGroupEnd());
  for (int r = 0; r < nl; r++) {
    NCCL_CHECK(settle(rs[r].comm));
    NCCL_CHECK(ncclCommDestroy(rs[r].comm));
  }
}

// Poisons the rank's region and writes its input.
static void prepare(const Test* t, Rank* R) {
  Layout l = test_layout(t, R->rank, R->nranks);
  int sz = TYPES[t->type].size;
  CUDA_CHECK(cudaSetDevice(R->dev));
  CUDA_CHECK(cudaMemsetAsync(R->recv, POISON, (l.base + l.span) * sz + GUARD_BYTES, R->stream));
  for (size_t i = 0; i < l.send_n; i++)
    store_bits(R->host + i * sz, sz, test_input(t, R->nranks, R->rank, i));
  char* input = (test_in_place(t, R->rank) ? R->recv : R->send) + l.send_at * sz;
  CUDA_CHECK(cudaMemcpyAsync(input, R->host, l.send_n * sz, cudaMemcpyHostToDevice, R->stream));
  CUDA_CHECK(cudaStreamSynchronize(R->stream));
}

static void report(Tally* tally, const Test* t, const Rank* R, const char* what, size_t at,
                   uint64_t got, uint64_t want, long bad) {
  if (tally->reports++ >= MAX_REPORTS) return;
  printf("WRONG %s %s %s count=%zu inplace=%d misaligned=%d special=%d rank=%d/%d: %ld %s, first "
         "at %zu: got 0x%llx want 0x%llx\n",
         COLL_NAMES[t->coll], TYPES[t->type].name, OP_NAMES[t->op], t->count, t->inplace,
         t->misaligned, t->special, R->rank, R->nranks, bad, what, at, (unsigned long long)got,
         (unsigned long long)want);
}

// Compares the rank's output with the reference, and its guard bytes with the poison.
static void verify(const Test* t, Rank* R, Tally* tally) {
  Layout l = test_layout(t, R->rank, R->nranks);
  int sz = TYPES[t->type].size;
  size_t end = (l.base + l.span) * sz + GUARD_BYTES;
  tally->checks++;
  if (!l.check_output) return;
  CUDA_CHECK(cudaSetDevice(R->dev));
  CUDA_CHECK(cudaMemcpy(R->host, R->recv, end, cudaMemcpyDeviceToHost));
  long bad = 0;
  size_t first = 0;
  uint64_t got0 = 0, want0 = 0;
  for (size_t j = 0; j < l.recv_n; j++) {
    uint64_t got = load_bits(R->host + (l.recv_at + j) * sz, sz);
    uint64_t want = test_expected(t, R->nranks, R->rank, j);
    int both_nan = TYPES[t->type].is_float && is_nan_bits(t->type, got) && is_nan_bits(t->type, want);
    if (got != want && !both_nan && bad++ == 0) first = j, got0 = got, want0 = want;
  }
  tally->elements += (long)l.recv_n;
  if (bad) report(tally, t, R, "elements wrong", first, got0, want0, bad);
  tally->wrong += bad;
  // Out of place, nothing past the output may change; in place, nothing past the region.
  size_t guard_from = test_in_place(t, R->rank) ? (l.base + l.span) * sz : (l.recv_at + l.recv_n) * sz;
  long damaged = 0;
  for (size_t b = 0; b < end; b++)
    if ((b < l.base * sz || b >= guard_from) && R->host[b] != POISON && damaged++ == 0) first = b;
  if (damaged) report(tally, t, R, "guard bytes changed", first, R->host[first], POISON, damaged);
  tally->wrong += damaged;
}

static ncclResult_t issue(const Test* t, Rank* R, ncclRedOp_t op) {
  Layout l = test_layout(t, R->rank, R->nranks);
  size_t sz = TYPES[t->type].size, c = t->count;
  const char* in = (test_in_place(t, R->rank) ? R->recv : R->send) + l.send_at * sz;
  char* out = R->recv + l.recv_at * sz;
  ncclDataType_t dt = (ncclDataType_t)t->type;
  int root = test_root(R->nranks), n = R->nranks;
  ncclComm_t comm = R->comm;
  cudaStream_t s = R->stream;
  switch (t->coll) {
    case C_ALLREDUCE: return ncclAllReduce(in, out, c, dt, op, comm, s);
    case C_REDUCE: return ncclReduce(in, out, c, dt, op, root, comm, s);
    case C_REDUCESCATTER: return ncclReduceScatter(in, out, c, dt, op, comm, s);
    case C_BROADCAST: return ncclBroadcast(in, out, c, dt, root, comm, s);
    case C_BCAST: return ncclBcast(out, c, dt, root, comm, s);
    case C_ALLGATHER: return ncclAllGather(in, out, c, dt, comm, s);
    case C_ALLTOALL: return ncclAlltoAll(in, out, c, dt, comm, s);
    case C_GATHER: return ncclGather(in, out, c, dt, root, comm, s);
    case C_SCATTER: return ncclScatter(in, out, c, dt, root, comm, s);
    case C_SENDRECV_RING: {
      ncclResult_t r = ncclSend(in, c, dt, (R->rank + 1) % n, comm, s);
      return r != ncclSuccess ? r : ncclRecv(out, c, dt, (R->rank + n - 1) % n, comm, s);
    }
    case C_SENDRECV_ALL:
      for (int p = 0; p < n; p++) {
        ncclResult_t r = ncclSend(in + p * c * sz, c, dt, p, comm, s);
        if (r == ncclSuccess) r = ncclRecv(out + p * c * sz, c, dt, p, comm, s);
        if (r != ncclSuccess) return r;
      }
      return ncclSuccess;
  }
  return ncclInvalidUsage;
}

static int call_failed(ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; }

static void count_error(Tally* tally, const Test* t, const char* what, ncclResult_t r) {
  tally->errors++;
  if (tally->reports++ < MAX_REPORTS)
    printf("ERROR %s %s %s count=%zu inplace=%d misaligned=%d: %s: %s\n", COLL_NAMES[t->coll],
           TYPES[t->type].name, OP_NAMES[t->op], t->count, t->inplace, t->misaligned, what,
           ncclGetErrorString(r));
}

// Issues the test on every local rank in one group; in graph mode, inside a capture.
// One rank per thread (procs, threads) issues a collective alone, as most programs do; a thread
// driving several ranks, and sends with receives, go in a group.
static int issue_group(const Test* t, Rank* rs, int nl, const ncclRedOp_t* ops, Tally* tally) {
  int grouped = nl > 1 || t->coll == C_SENDRECV_RING || t->coll == C_SENDRECV_ALL;
  ncclResult_t r = grouped ? ncclGroupStart() : ncclSuccess;
  for (int k = 0; k < nl && !call_failed(r); k++) r = issue(t, &rs[k], ops[k]);
  ncclResult_t end = grouped ? ncclGroupEnd() : ncclSuccess;
  if (call_failed(r) || call_failed(end)) {
    count_error(tally, t, "issuing", call_failed(r) ? r : end);
    return 0;
  }
  for (int k = 0; k < nl; k++) {
    ncclResult_t state = settle(rs[k].comm);
    if (state != ncclSuccess) {
      count_error(tally, t, "async", state);
      return 0;
    }
  }
  return 1;
}

// group and initall: every NCCL call is made with the first rank's GPU current, none switched
// per call (as nccl-tests -g N does): NCCL must go by the communicator's GPU.
static void first_gpu_current(const Rank* rs) {
  if (opt.launch == L_GROUP || opt.launch == L_INITALL) CUDA_CHECK(cudaSetDevice(rs[0].dev));
}

static void run_test(const Test* t, Rank* rs, int nl, Tally* tally) {
  ncclRedOp_t ops[MAX_LOCAL];
  int premul = t->op == OP_PREMUL_HOST || t->op == OP_PREMUL_DEVICE;
  for (int k = 0; k < nl; k++) {
    ops[k] = (ncclRedOp_t)(t->op < OP_PREMUL_HOST ? t->op : ncclSum);
    if (!premul) continue;
    uint64_t scalar = TYPES[t->type].is_float ? encode_float(t->type, PREMUL_SCALAR)
                                              : (uint64_t)PREMUL_SCALAR;
    void* where = &scalar;  // little-endian: the type's bytes come first
    ncclScalarResidence_t residence = ncclScalarHostImmediate;
    if (t->op == OP_PREMUL_DEVICE) {
      CUDA_CHECK(cudaMemcpy(rs[k].scalar, &scalar, 8, cudaMemcpyHostToDevice));
      where = rs[k].scalar;
      residence = ncclScalarDevice;
    }
    ncclResult_t r = ncclRedOpCreatePreMulSum(&ops[k], where, (ncclDataType_t)t->type,
                                              residence, rs[k].comm);
    if (call_failed(r)) {
      count_error(tally, t, "ncclRedOpCreatePreMulSum", r);
      for (int j = 0; j < k; j++) ncclRedOpDestroy(ops[j], rs[j].comm);
      return;
    }
  }
  if (opt.realloc && !opt.memalloc)
    for (int k = 0; k < nl; k++) realloc_rank(&rs[k]);
  cudaGraphExec_t execs[MAX_LOCAL];
  int captured = 0;
  if (opt.graph) {
    first_gpu_current(rs);
    for (int k = 0; k < nl; k++)
      CUDA_CHECK(cudaStreamBeginCapture(rs[k].stream, cudaStreamCaptureModeThreadLocal));
    int issued = issue_group(t, rs, nl, ops, tally);
    cudaGraph_t graphs[MAX_LOCAL];
    // Every capture ends before any instantiation: that is not allowed while one is capturing.
    for (int k = 0; k < nl; k++) CUDA_CHECK(cudaStreamEndCapture(rs[k].stream, &graphs[k]));
    for (int k = 0; k < nl; k++) {
      CUDA_CHECK(cudaGraphInstantiateWithFlags(&execs[k], graphs[k], 0));
      CUDA_CHECK(cudaGraphDestroy(graphs[k]));
    }
    captured = issued;
  }
  for (int rep = 0; rep < (opt.graph ? 2 : 1); rep++) {
    Test fresh = *t;
    fresh.seed = mix64(t->seed + rep);  // each replay must read the inputs of its own time
    for (int k = 0; k < nl; k++) prepare(&fresh, &rs[k]);
    first_gpu_current(rs);
    if (opt.graph) {
      if (!captured) break;
      for (int k = 0; k < nl; k++) CUDA_CHECK(cudaGraphLaunch(execs[k], rs[k].stream));
    } else if (!issue_group(&fresh, rs, nl, ops, tally)) {
      break;
    }
    for (int k = 0; k < nl; k++) CUDA_CHECK(cudaStreamSynchronize(rs[k].stream));
    for (int k = 0; k < nl; k++) verify(&fresh, &rs[k], tally);
  }
  if (opt.graph)
    for (int k = 0; k < nl; k++) CUDA_CHECK(cudaGraphExecDestroy(execs[k]));
  if (premul)
    for (int k = 0; k < nl; k++) NCCL_CHECK(ncclRedOpDestroy(ops[k], rs[k].comm));
}

static void run_matrix(Rank* rs, int nl, int matrix, size_t max_bytes, Tally* tally) {
  TestList list = build_matrix(matrix, rs[0].nranks, max_bytes, opt.alltoall_in_place);
  if (matrix_alloc_bytes(&list, rs[0].nranks) > rs[0].alloc) {
    fprintf(stderr, "buffers too small for the matrix\n");
    exit(2);
  }
  for (size_t k = 0; k < list.n; k++) run_test(&list.tests[k], rs, nl, tally);
  free(list.tests);
}

// Children of ncclCommSplit run the quick matrix: pairs by parity on 4 or more ranks, else all
// in reversed order; with `last_alone`, every rank but the last, which gets no child
// (NCCL_SPLIT_NOCOLOR; on 2 ranks that leaves a child of one, which runs nothing).
static void run_split(Rank* rs, int nl, Tally* tally, int last_alone) {
  Rank kids[MAX_LOCAL];
  ncclConfig_t config = comm_config();
  NCCL_CHECK(ncclGroupStart());
  for (int k = 0; k < nl; k++) {
    kids[k] = rs[k];
    int color = rs[k].nranks >= 4 ? rs[k].rank % 2 : 0;
    int key = rs[k].nranks - 1 - rs[k].rank;
    if (last_alone) {
      color = rs[k].rank == rs[k].nranks - 1 ? NCCL_SPLIT_NOCOLOR : 0;
      key = rs[k].rank;
    }
    NCCL_CHECK(ncclCommSplit(rs[k].comm, color, key, &kids[k].comm, &config));
  }
  NCCL_CHECK(ncclGroupEnd());
  // A nonblocking split reports through the parent; the child handle is NULL until it is done.
  for (int k = 0; k < nl; k++) NCCL_CHECK(settle(rs[k].comm));
  Rank live[MAX_LOCAL];
  int nlive = 0;
  for (int k = 0; k < nl; k++) {
    if (last_alone && rs[k].rank == rs[k].nranks - 1) {
      if (kids[k].comm != NULL) {
        fprintf(stderr, "split: rank %d asked for no child and got one\n", rs[k].rank);
        exit(2);
      }
      printf("split: parent rank %d/%d -> no child\n", rs[k].rank, rs[k].nranks);
      continue;
    }
    identify(&kids[k]);
    printf("split: parent rank %d/%d -> child rank %d/%d\n", rs[k].rank, rs[k].nranks,
           kids[k].rank, kids[k].nranks);
    live[nlive++] = kids[k];
  }
  if (nlive > 0 && live[0].nranks >= 2) run_matrix(live, nlive, MATRIX_QUICK, 0, tally);
  if (nlive > 0) destroy_comms(live, nlive);
}

// Drives the local ranks (comms already made) through everything the options ask for.
static void drive(Rank* rs, int nl, Tally* tally) {
  for (int k = 0; k < nl; k++) identify(&rs[k]);
  TestList list = build_matrix(opt.matrix, rs[0].nranks, opt.max_bytes, opt.alltoall_in_place);
  size_t alloc = matrix_alloc_bytes(&list, rs[0].nranks);
  free(list.tests);
  for (int k = 0; k < nl; k++) setup_rank(&rs[k], alloc);
  if (opt.windows) windows(rs, nl, 1);
  run_matrix(rs, nl, opt.matrix, opt.max_bytes, tally);
  if (opt.windows) {
    windows(rs, nl, 0);
    run_matrix(rs, nl, opt.matrix, opt.max_bytes, tally);
  }
  if (opt.realloc)
    printf("realloc: %ld of %ld allocations came back at the same address\n", reallocs.same, reallocs.made);
  if (opt.split) {
    run_split(rs, nl, tally, 0);
    run_split(rs, nl, tally, 1);
  }
  destroy_comms(rs, nl);
  for (int k = 0; k < nl; k++) free_rank(&rs[k]);
}

// --- Ways of making the communicators ---

static void init_rank_comm(Rank* R, ncclUniqueId id, int n, int r) {
  CUDA_CHECK(cudaSetDevice(r));
  R->dev = r;
  if (opt.nonblocking) {
    ncclConfig_t config = comm_config();
    NCCL_CHECK(ncclCommInitRankConfig(&R->comm, n, id, r, &config));
  } else {
    NCCL_CHECK(ncclCommInitRank(&R->comm, n, id, r));
  }
}

static void proc_main(int r, int n, const char* id_path, Tally* tally) {
  ncclUniqueId id;
  if (r == 0) {
    NCCL_CHECK(ncclGetUniqueId(&id));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", id_path);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, id_path) != 0) {
      perror("writing the unique id");
      exit(2);
    }
  } else {
    FILE* f;
    while (!(f = fopen(id_path, "rb"))) usleep(1000);  // rank 0 renames it into place whole
    if (fread(&id, sizeof id, 1, f) != 1) {
      perror("reading the unique id");
      exit(2);
    }
    fclose(f);
  }
  Rank R;
  init_rank_comm(&R, id, n, r);
  if (r == 0) print_mapped_nccl("");
  drive(&R, 1, tally);
}

static void on_alarm(int sig) {
  (void)sig;
  const char msg[] = "TIMEOUT: the run took too long (hung collective?)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(3);
}

static Tally launch_procs(int n) {
  char dir[] = "/tmp/ncclshim-gpu-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    exit(2);
  }
  char id_path[4096];
  snprintf(id_path, sizeof id_path, "%s/unique-id", dir);
  int fds[2];
  if (pipe(fds) != 0) exit(2);
  fflush(stdout);
  for (int r = 0; r < n; r++) {
    if (fork() == 0) {
      close(fds[0]);
      alarm(opt.timeout);
      Tally t = {0, 0, 0, 0, 0};
      proc_main(r, n, id_path, &t);
      fflush(stdout);
      if (write(fds[1], &t, sizeof t) != (ssize_t)sizeof t) _exit(2);
      _exit(0);
    }
  }
  close(fds[1]);
  Tally total = {0, 0, 0, 0, 0};
  int exited_ok = 0, status;
  while (wait(&status) > 0) exited_ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
  Tally t;
  while (read(fds[0], &t, sizeof t) == (ssize_t)sizeof t) tally_add(&total, &t);
  if (exited_ok != n) {
    printf("ERROR: %d of %d rank processes failed\n", n - exited_ok, n);
    total.errors += n - exited_ok;
  }
  unlink(id_path);
  rmdir(dir);
  return total;
}

typedef struct {
  int r, n;
  ncclUniqueId id;
  Tally tally;
} ThreadArgs;

static void* thread_main(void* p) {
  ThreadArgs* a = (ThreadArgs*)p;
  Rank R;
  init_rank_comm(&R, a->id, a->n, a->r);
  drive(&R, 1, &a->tally);
  return NULL;
}

static Tally launch_threads(int n) {
  ThreadArgs args[MAX_LOCAL];
  pthread_t threads[MAX_LOCAL];
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  for (int r = 0; r < n; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].r = r;
    args[r].n = n;
    args[r].id = id;
    pthread_create(&threads[r], NULL, thread_main, &args[r]);
  }
  Tally total = {0, 0, 0, 0, 0};
  for (int r = 0; r < n; r++) {
    pthread_join(threads[r], NULL);
    tally_add(&total, &args[r].tally);
  }
  print_mapped_nccl("");
  return total;
}

static Tally launch_single_thread(int n) {
  Rank rs[MAX_LOCAL];
  if (opt.launch == L_INITALL) {
    ncclComm_t comms[MAX_LOCAL];
    NCCL_CHECK(ncclCommInitAll(comms, n, NULL));
    for (int r = 0; r < n; r++) rs[r].comm = comms[r], rs[r].dev = r;
  } else {
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    ncclConfig_t config = comm_config();
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < n; r++) {
      CUDA_CHECK(cudaSetDevice(r));  // a communicator belongs to the GPU current at its init
      rs[r].dev = r;
      NCCL_CHECK(ncclCommInitRankConfig(&rs[r].comm, n, id, r, &config));
    }
    NCCL_CHECK(ncclGroupEnd());
  }
  print_mapped_nccl("");
  Tally total = {0, 0, 0, 0, 0};
  drive(rs, n, &total);
  return total;
}

static size_t parse_bytes(const char* s) {
  char* end;
  double v = strtod(s, &end);
  switch (*end) {
    case 'K': case 'k': v *= 1 << 10; break;
    case 'M': case 'm': v *= 1 << 20; break;
    case 'G': case 'g': v *= 1 << 30; break;
  }
  return (size_t)v;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(a, "--launch")) {
      i++;
      opt.launch = !strcmp(v, "procs") ? L_PROCS : !strcmp(v, "threads") ? L_THREADS
                 : !strcmp(v, "group") ? L_GROUP : !strcmp(v, "initall") ? L_INITALL : -1;
    } else if (!strcmp(a, "--matrix")) {
      i++;
      opt.matrix = !strcmp(v, "quick") ? MATRIX_QUICK : MATRIX_FULL;
    } else if (!strcmp(a, "--max-bytes")) {
      opt.max_bytes = parse_bytes(argv[++i]);
    } else if (!strcmp(a, "--ngpus")) {
      opt.ngpus = atoi(argv[++i]);
    } else if (!strcmp(a, "--timeout")) {
      opt.timeout = atoi(argv[++i]);
    } else if (!strcmp(a, "--nonblocking")) {
      opt.nonblocking = 1;
    } else if (!strcmp(a, "--graph")) {
      opt.graph = 1;
    } else if (!strcmp(a, "--memalloc")) {
      opt.memalloc = 1;
    } else if (!strcmp(a, "--realloc")) {
      opt.realloc = 1;
    } else if (!strcmp(a, "--split")) {
      opt.split = 1;
    } else if (!strcmp(a, "--windows")) {
      opt.windows = 1;
    } else if (!strcmp(a, "--alltoall-in-place")) {
      opt.alltoall_in_place = 1;
    } else {
      opt.launch = -1;
    }
  }
  if (opt.launch < 0 || (opt.windows && !opt.memalloc)) {
    fprintf(stderr, "usage: see the comment at the top of collectives.cu\n");
    return 2;
  }
  int n = opt.ngpus;
  if (n <= 0 && opt.launch != L_PROCS) CUDA_CHECK(cudaGetDeviceCount(&n));
  if (n <= 0 || n > MAX_LOCAL) {
    fprintf(stderr, "give --ngpus N (1..%d) for --launch procs\n", MAX_LOCAL);
    return 2;
  }
  signal(SIGALRM, on_alarm);
  alarm(opt.timeout);
  Tally t = opt.launch == L_PROCS     ? launch_procs(n)
            : opt.launch == L_THREADS ? launch_threads(n)
                                      : launch_single_thread(n);
  printf("checks %ld, elements checked %ld, wrong %ld, errors %ld\n", t.checks, t.elements,
         t.wrong, t.errors);
  printf("#wrong %ld\n", t.wrong + t.errors);
  return t.wrong + t.errors == 0 && t.checks > 0 ? 0 : 1;
}
