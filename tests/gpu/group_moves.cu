// Groups of several calls of the collectives other than all-reduce on one communicator, checked
// value by value: the core runs a group's small calls of one packet kernel as one fused launch
// (calls of one collective; reduce-scatters and reduces of one type and op, and never together;
// moves of any type, which move bytes) while their chunks fit the inboxes of a pair of ranks
// (512 KiB on 2 ranks, 256 KiB on 3 - 4), at most 8 calls a launch and 2 launches a group, the
// roots free to differ; it sends other groups to NCCL whole. One process drives every GPU (as
// nccl-tests -g), through the library given (the shim, or NCCL alone as the control).
//   group_moves --lib DIR/libnccl.so.2 [--ngpus 2]
// Each collective alone in groups of 2, 8 (one element, odd counts) and 9 calls (two launches)
// and 17 (past two: NCCL's), chunks that fill the inboxes exactly, past them and past two launches,
// one call of the whole inbox and one past it; roots that differ from call to call (the last rank
// first); every other call in place (all-to-all never: NCCL defines no in-place form of it); some
// buffers one element off their 16-byte alignment; a group with another collective, and one of
// moves of two types. Moves of four sizes of element, reductions of every op and type; eagerly
// on one stream, eagerly with the calls spread over two streams, and captured in a CUDA graph
// replayed three times with new values.
// Prints one line per (mode, collective, type[, op]) with its wrong elements, and "# N groups,
// M wrong elements"; exits 1 where any is wrong.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "group_values.h"
#include "nccl_lib.h"

enum Mode { EAGER, TWO_STREAMS, GRAPH };
static const char* mode_names[] = {"eager", "two-streams", "graph"};

enum Coll { ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALL_TO_ALL, GATHER, SCATTER, NCOLLS };
static const char* coll_names[] = {"all_gather", "reduce_scatter", "broadcast", "reduce",
                                   "all_to_all", "gather",         "scatter"};

static bool reduces(Coll c) { return c == REDUCE_SCATTER || c == REDUCE; }
static bool rooted(Coll c) { return c == BROADCAST || c == REDUCE || c == GATHER || c == SCATTER; }

// One call of a group: its collective, NCCL's count (the chunk a rank sends each peer, or the
// root each rank), type, op (reductions), root (rooted ones), in place or not, and its buffers'
// misalignment (the input's; the output's is another).
struct CallSpec {
  Coll coll;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
  bool in_place;
  size_t offset;
  size_t send_offset() const { return offset; }
  size_t recv_offset() const { return offset * 3 % 16; }
};

// Element i of call k's input on `rank` in replay `round`. For reductions 1, 2 or 3, exact in
// every type, and so are the sums, products (2 to 4 ranks), maxima, minima and averages of them;
// for moves 1 to 120 (exact in int8 and bf16), so that an element moved to the wrong place shows.
// Never 0: outputs start as 0, which no result is. Scrambled, so that no two ranks, calls,
// offsets or rounds hold the same values.
static double value(const CallSpec& c, int rank, size_t i, int k, int round) {
  unsigned h = (unsigned)i * 2654435761u + (unsigned)k * 40503u + (unsigned)rank * 9973u + (unsigned)round * 7919u;
  return 1 + (h >> 13) % (reduces(c.coll) ? 3 : 120);
}

// Element i of call k's inputs reduced over the ranks, as NCCL must: avg of integers truncated.
static double reduced(const CallSpec& c, int nranks, size_t i, int k, int round) {
  double acc = value(c, 0, i, k, round);
  for (int r = 1; r < nranks; r++) {
    double v = value(c, r, i, k, round);
    switch (c.op) {
      case ncclSum: case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      default: acc = v < acc ? v : acc; break;
    }
  }
  if (c.op == ncclAvg) acc = is_int(c.type) ? (double)((long long)acc / nranks) : acc / nranks;
  return acc;
}

// What element j of call k's output on `rank` must hold (NCCL's placement of every chunk).
static double expected(const CallSpec& c, int rank, int nranks, size_t j, int k, int round) {
  size_t n = c.count;
  switch (c.coll) {
    case ALL_GATHER: case GATHER: return value(c, (int)(j / n), j % n, k, round);
    case REDUCE_SCATTER: return reduced(c, nranks, rank * n + j, k, round);
    case BROADCAST: return value(c, c.root, j, k, round);
    case REDUCE: return reduced(c, nranks, j, k, round);
    case ALL_TO_ALL: return value(c, (int)(j / n), rank * n + j % n, k, round);
    default: return value(c, c.root, rank * n + j, k, round);  // scatter
  }
}

// Whether NCCL defines `rank`'s output: a reduce's and a gather's only on the root.
static bool defined(const CallSpec& c, int rank) {
  return !((c.coll == REDUCE || c.coll == GATHER) && rank != c.root);
}

// Where a rank's input and output of a call lie, in elements: out of place, each at the start of
// its own buffer; in place, both in the output's buffer where NCCL's in-place forms put them
// (all-gather, gather: the input is the rank's block of the output; reduce-scatter, scatter: the
// output is the rank's block of the input; broadcast, reduce: the same elements), `span` in all.
struct Layout {
  size_t in_n, out_n, in_at, out_at, span;
};

static Layout layout(const CallSpec& c, int rank, int nranks) {
  size_t n = (size_t)nranks, in_block = 0, out_block = 0;
  Layout l = {c.count, c.count, 0, 0, 0};
  switch (c.coll) {
    case ALL_GATHER: case GATHER: l.out_n = n * c.count; in_block = (size_t)rank; break;
    case REDUCE_SCATTER: case SCATTER: l.in_n = n * c.count; out_block = (size_t)rank; break;
    case ALL_TO_ALL: l.in_n = l.out_n = n * c.count; break;
    default: break;
  }
  if (c.in_place) l.in_at = in_block * c.count, l.out_at = out_block * c.count;
  l.span = std::max(l.in_n, l.out_n);
  return l;
}

// The bytes the packets of one call carry from one rank to another: what a fused launch's calls'
// chunks share (the shim's ll_capacity).
static size_t inbox_bytes(int nranks) { return nranks <= 2 ? 512 << 10 : 256 << 10; }

static const int MAX_CALLS = 17;

struct Gpus {
  int count;
  size_t slot;  // bytes of each buffer: nranks chunks of a little more than the inbox
  ncclComm_t comms[LIB_MAX_GPUS];
  cudaStream_t streams[LIB_MAX_GPUS][2];
  char* send[LIB_MAX_GPUS][MAX_CALLS];
  char* recv[LIB_MAX_GPUS][MAX_CALLS];
  char* scratch[LIB_MAX_GPUS][MAX_CALLS];  // an input and an output, staged for `fill`
};

static const char* input_of(Gpus& g, const CallSpec& c, int d, size_t k) {
  Layout l = layout(c, d, g.count);
  if (!c.in_place) return g.send[d][k] + c.send_offset();
  return g.recv[d][k] + c.recv_offset() + l.in_at * type_size(c.type);
}

static char* output_of(Gpus& g, const CallSpec& c, int d, size_t k) {
  return g.recv[d][k] + c.recv_offset() + layout(c, d, g.count).out_at * type_size(c.type);
}

// The groups run for one collective, type and op (ncclSum for moves): each a list of calls.
static std::vector<std::vector<CallSpec>> groups_of(Coll coll, ncclDataType_t t, ncclRedOp_t op, int nranks) {
  size_t size = type_size(t), inbox = inbox_bytes(nranks) / size;  // elements
  // Call k: the last rank its root first, then 0, 1, ...; every other one in place.
  auto call = [&](Coll c, size_t count, ncclDataType_t type, size_t k, bool misaligned) {
    CallSpec s = {c, count, type, op, (int)((k + nranks - 1) % nranks), k % 2 == 1 && c != ALL_TO_ALL,
                  misaligned && k % 4 < 2 ? type_size(type) : 0};
    return s;
  };
  auto calls = [&](std::vector<size_t> counts, bool misaligned = false) {
    std::vector<CallSpec> g;
    for (size_t k = 0; k < counts.size(); k++) g.push_back(call(coll, counts[k], t, k, misaligned));
    return g;
  };
  std::vector<size_t> odd = {1, 3, 17, 255, 256, 1000, 4097, 8191};
  std::vector<std::vector<CallSpec>> all = {
      calls({8 / size + 1, 8 / size + 1, 8 / size + 1, 8 / size + 1}),  // chunks of 9 - 16 bytes
      calls({1, 4097}),
      calls(odd),
      calls(odd, true),
      calls(std::vector<size_t>(9, 100)),          // more than a launch carries
      calls(std::vector<size_t>(17, 100)),         // more than two launches carry: NCCL's
      calls(std::vector<size_t>(8, inbox / 8)),    // the inboxes, full
      calls(std::vector<size_t>(3, inbox * 2 / 5)),  // past them: two launches
      calls(std::vector<size_t>(5, inbox / 2)),    // past two: NCCL's
      calls({inbox, 5}),                           // one call the whole inbox, the next a launch of its own
      calls({inbox + 1, 3}),                       // past the packet kernel: no fused launch
  };
  // Another collective in the group (reduce-scatters and reduces, though of one packet kernel,
  // never share a launch): NCCL's.
  static const Coll other[NCOLLS] = {REDUCE_SCATTER, REDUCE, GATHER, REDUCE_SCATTER, SCATTER, BROADCAST, ALL_TO_ALL};
  std::vector<CallSpec> mixed = calls({64, 64, 3, 100});
  for (size_t k = 1; k < mixed.size(); k += 2) mixed[k] = call(other[coll], mixed[k].count, t, k, false);
  all.push_back(mixed);
  std::vector<CallSpec> types = calls({64, 65, 3, 100});
  if (reduces(coll)) {
    // Another type, and another op: not one kernel, so NCCL's.
    types[1].type = t == ncclFloat32 ? ncclInt32 : ncclFloat32;
    types[2].op = op == ncclSum ? ncclMax : ncclSum;
  } else {
    // Moves of another type: bytes all the same, so one kernel, one launch.
    for (size_t k = 1; k < types.size(); k += 2) types[k].type = t == ncclInt8 ? ncclFloat32 : ncclInt8;
  }
  all.push_back(types);
  // One root for every call: on 2 ranks too, a pair then carries no chunk in any call of the
  // launch, and gets the empty packet.
  if (rooted(coll)) {
    std::vector<CallSpec> one_root = calls({100, 5, 33});
    for (CallSpec& c : one_root) c.root = 0;
    all.push_back(one_root);
  }
  return all;
}

// The stream call k of a group is issued on.
static cudaStream_t stream_of(Gpus& g, int d, size_t k, Mode mode) {
  return g.streams[d][mode == TWO_STREAMS ? k % 2 : 0];
}

// Fills every call's input for `round`, and its output with 0 (which no result is), on the
// call's own stream (staged, then copied there): with two streams, late (`hold`), so that a
// launch on the other stream must wait for it, and that stream itself is held before the group,
// so that a read of the results on this one must wait for the launch. In place, the whole region
// goes at once: 0 with the input in it.
static void fill(Gpus& g, const std::vector<CallSpec>& group, int round, Mode mode) {
  for (int d = 0; d < g.count; d++) {
    CUDA_CHECK(cudaSetDevice(d));
    for (size_t k = 0; k < group.size(); k++) {
      const CallSpec& c = group[k];
      size_t size = type_size(c.type);
      Layout l = layout(c, d, g.count);
      cudaStream_t s = stream_of(g, d, k, mode);
      std::vector<char> in((c.in_place ? l.span : l.in_n) * size), out(l.out_n * size);  // zeros
      for (size_t i = 0; i < l.in_n; i++) put(&in[(l.in_at + i) * size], c.type, value(c, d, i, (int)k, round));
      char* staged = g.scratch[d][k];
      CUDA_CHECK(cudaMemcpy(staged, in.data(), in.size(), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(staged + g.slot, out.data(), out.size(), cudaMemcpyHostToDevice));
      if (mode == TWO_STREAMS && k % 2 == 1) hold<<<1, 1, 0, s>>>(200000);
      char* to = c.in_place ? g.recv[d][k] + c.recv_offset() : g.send[d][k] + c.send_offset();
      CUDA_CHECK(cudaMemcpyAsync(to, staged, in.size(), cudaMemcpyDeviceToDevice, s));
      if (!c.in_place)
        CUDA_CHECK(cudaMemcpyAsync(output_of(g, c, d, k), staged + g.slot, out.size(), cudaMemcpyDeviceToDevice, s));
    }
    if (mode == TWO_STREAMS) hold<<<1, 1, 0, g.streams[d][0]>>>(2000000);
  }
}

static void issue(Lib* lib, Gpus& g, const std::vector<CallSpec>& group, Mode mode) {
  NCCL_CALL(lib, GroupStart());
  for (size_t k = 0; k < group.size(); k++) {
    const CallSpec& c = group[k];
    for (int d = 0; d < g.count; d++) {
      const char* in = input_of(g, c, d, k);
      char* out = output_of(g, c, d, k);
      size_t n = c.count;
      ncclDataType_t t = c.type;
      ncclComm_t comm = g.comms[d];
      cudaStream_t s = stream_of(g, d, k, mode);
      switch (c.coll) {
        case ALL_GATHER: NCCL_CALL(lib, AllGather(in, out, n, t, comm, s)); break;
        case REDUCE_SCATTER: NCCL_CALL(lib, ReduceScatter(in, out, n, t, c.op, comm, s)); break;
        case BROADCAST: NCCL_CALL(lib, Broadcast(in, out, n, t, c.root, comm, s)); break;
        case REDUCE: NCCL_CALL(lib, Reduce(in, out, n, t, c.op, c.root, comm, s)); break;
        case ALL_TO_ALL: NCCL_CALL(lib, AlltoAll(in, out, n, t, comm, s)); break;
        case GATHER: NCCL_CALL(lib, Gather(in, out, n, t, c.root, comm, s)); break;
        default: NCCL_CALL(lib, Scatter(in, out, n, t, c.root, comm, s)); break;
      }
    }
  }
  NCCL_CALL(lib, GroupEnd());
}

// Reads each call's output on the call's own stream (which must wait for the launch), then
// checks it; the first 3 wrong elements of a line (`shown` so far) go to stderr.
static size_t check(Gpus& g, const std::vector<CallSpec>& group, int round, Mode mode, size_t& shown) {
  size_t wrong = 0;
  for (int d = 0; d < g.count; d++) {
    CUDA_CHECK(cudaSetDevice(d));
    for (size_t k = 0; k < group.size(); k++) {
      const CallSpec& c = group[k];
      if (!defined(c, d)) continue;
      size_t size = type_size(c.type);
      std::vector<char> out(layout(c, d, g.count).out_n * size);
      cudaStream_t s = stream_of(g, d, k, mode);
      CUDA_CHECK(cudaMemcpyAsync(out.data(), output_of(g, c, d, k), out.size(), cudaMemcpyDeviceToHost, s));
      CUDA_CHECK(cudaStreamSynchronize(s));
      for (size_t j = 0; j < out.size() / size; j++) {
        double want = expected(c, d, g.count, j, (int)k, round), got = get(&out[j * size], c.type);
        // Averages of floats over 3 ranks are not exact (NCCL may scale before or after the sum):
        // within 1%, where an element of the wrong sum is 8% or more away.
        bool near = reduces(c.coll) && c.op == ncclAvg && !is_int(c.type);
        bool right = near ? fabs(got - want) <= want / 100 : got == want;
        if (!right) {
          if (shown++ < 3)
            fprintf(stderr, "  GPU %d call %zu of %zu (%s, count %zu, type %d, op %d, root %d%s%s, round %d): "
                    "[%zu] = %g, want %g\n", d, k, group.size(), coll_names[c.coll], c.count, c.type,
                    reduces(c.coll) ? (int)c.op : -1, rooted(c.coll) ? c.root : -1, c.in_place ? ", in place" : "",
                    c.offset ? ", misaligned" : "", round, j, got, want);
          wrong++;
        }
      }
    }
    for (int s = 0; s < 2; s++) CUDA_CHECK(cudaStreamSynchronize(g.streams[d][s]));
  }
  return wrong;
}

// One group in `mode`: eagerly once, or captured once and replayed three times.
static size_t run_group(Lib* lib, Gpus& g, const std::vector<CallSpec>& group, Mode mode, size_t& shown) {
  if (mode != GRAPH) {
    fill(g, group, 0, mode);
    issue(lib, g, group, mode);
    return check(g, group, 0, mode, shown);
  }
  cudaGraph_t graphs[LIB_MAX_GPUS];
  cudaGraphExec_t execs[LIB_MAX_GPUS];
  for (int d = 0; d < g.count; d++) {
    CUDA_CHECK(cudaSetDevice(d));
    CUDA_CHECK(cudaStreamBeginCapture(g.streams[d][0], cudaStreamCaptureModeThreadLocal));
  }
  issue(lib, g, group, mode);
  // Every capture ends before any graph is instantiated (not allowed while this thread captures).
  for (int d = 0; d < g.count; d++) {
    CUDA_CHECK(cudaSetDevice(d));
    CUDA_CHECK(cudaStreamEndCapture(g.streams[d][0], &graphs[d]));
  }
  for (int d = 0; d < g.count; d++) {
    CUDA_CHECK(cudaSetDevice(d));
    CUDA_CHECK(cudaGraphInstantiate(&execs[d], graphs[d], 0));
  }
  size_t wrong = 0;
  for (int round = 1; round <= 3; round++) {
    fill(g, group, round, mode);
    for (int d = 0; d < g.count; d++) {
      CUDA_CHECK(cudaSetDevice(d));
      CUDA_CHECK(cudaGraphLaunch(execs[d], g.streams[d][0]));
    }
    wrong += check(g, group, round, mode, shown);
  }
  for (int d = 0; d < g.count; d++) {
    CUDA_CHECK(cudaGraphExecDestroy(execs[d]));
    CUDA_CHECK(cudaGraphDestroy(graphs[d]));
  }
  return wrong;
}

int main(int argc, char** argv) {
  const char* path = NULL;
  int ngpus = 2;
  for (int i = 1; i < argc; i += 2) {
    std::string a = argv[i];
    if (i + 1 >= argc) { fprintf(stderr, "%s needs a value\n", a.c_str()); return 2; }
    if (a == "--lib") path = argv[i + 1];
    else if (a == "--ngpus") ngpus = atoi(argv[i + 1]);
    else { fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  if (!path || ngpus < 2 || ngpus > 4) {
    fprintf(stderr, "usage: group_moves --lib LIB [--ngpus 2..4]\n");
    return 2;
  }
  Lib lib;
  load(&lib, "lib", path);
  Gpus g;
  g.count = ngpus;
  // The largest chunk is one element past the inbox (8 bytes at most), nranks of them in a buffer
  // (all-gather, all-to-all, gather, scatter, reduce-scatter), plus room for the misalignment:
  // about 1 MiB on 2 to 4 ranks, 4 of them per call, 68 MiB per GPU in all.
  g.slot = (size_t)ngpus * (inbox_bytes(ngpus) + 16) + 64;
  int devices[LIB_MAX_GPUS];
  for (int d = 0; d < ngpus; d++) devices[d] = d;
  NCCL_CALL(&lib, CommInitAll(g.comms, ngpus, devices));
  for (int d = 0; d < ngpus; d++) {
    CUDA_CHECK(cudaSetDevice(d));
    for (int s = 0; s < 2; s++) CUDA_CHECK(cudaStreamCreateWithFlags(&g.streams[d][s], cudaStreamNonBlocking));
    for (int k = 0; k < MAX_CALLS; k++) {
      CUDA_CHECK(cudaMalloc(&g.send[d][k], g.slot));
      CUDA_CHECK(cudaMalloc(&g.recv[d][k], g.slot));
      CUDA_CHECK(cudaMalloc(&g.scratch[d][k], 2 * g.slot));
    }
  }
  // Moves: bytes whatever the type, so a few sizes of element do. Reductions: every op of float,
  // and every type under one op each (what a group fuses depends on the element's size, not on
  // the arithmetic, which the lone calls' checks cover), to keep the run short.
  typedef std::pair<ncclDataType_t, ncclRedOp_t> Kind;
  const std::vector<Kind> move_kinds = {
      {ncclFloat32, ncclSum}, {ncclBfloat16, ncclSum}, {ncclInt8, ncclSum}, {ncclFloat64, ncclSum}};
  const std::vector<Kind> reduce_kinds = {
      {ncclFloat32, ncclSum}, {ncclFloat32, ncclProd}, {ncclFloat32, ncclMax}, {ncclFloat32, ncclMin},
      {ncclFloat32, ncclAvg}, {ncclBfloat16, ncclSum}, {ncclFloat16, ncclMax}, {ncclFloat64, ncclAvg},
      {ncclInt32, ncclProd},  {ncclUint8, ncclSum},    {ncclInt64, ncclMin}};
  size_t groups = 0, wrong_all = 0;
  for (int mode = EAGER; mode <= GRAPH; mode++) {
    for (int ci = 0; ci < NCOLLS; ci++) {
      Coll coll = (Coll)ci;
      for (const Kind& kind : reduces(coll) ? reduce_kinds : move_kinds) {
        {
          const ncclDataType_t t = kind.first;
          const ncclRedOp_t op = kind.second;
          size_t wrong = 0, shown = 0;
          for (const auto& group : groups_of(coll, t, op, ngpus)) {
            if (!group_fits(group.size(), MAX_CALLS)) return 2;
            wrong += run_group(&lib, g, group, (Mode)mode, shown);
            groups++;
          }
          if (reduces(coll))
            printf("%-12s %-14s type %d op %d: %zu wrong\n", mode_names[mode], coll_names[coll], t, op, wrong);
          else
            printf("%-12s %-14s type %d: %zu wrong\n", mode_names[mode], coll_names[coll], t, wrong);
          fflush(stdout);
          wrong_all += wrong;
        }
      }
    }
  }
  for (int d = 0; d < ngpus; d++) NCCL_CALL(&lib, CommDestroy(g.comms[d]));
  printf("# %zu groups, %zu wrong elements\n", groups, wrong_all);
  return wrong_all ? 1 : 0;
}
