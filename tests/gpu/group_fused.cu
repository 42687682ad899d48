// Groups of several all-reduces on one communicator, checked value by value: the core fuses a
// group's small all-reduces of one type and op into up to two launches, four of floats on 2 GPUs
// (their data side by side in the inboxes; up to 2 MiB of floats a launch there), and sends other
// groups to NCCL whole. One process drives every GPU (as nccl-tests -g), through the library
// given (the shim, or NCCL alone as the control).
//   group_fused --lib DIR/libnccl.so.2 [--ngpus 2]
// Each group: calls of every size class (one element, odd counts, whole inboxes, past one and
// past two, more calls than two or four launches carry, mixed types and ops), every other call in
// place, some with buffers one element off their 16-byte alignment; for every type and op;
// eagerly on one stream, eagerly with the calls spread over two streams, and captured in a CUDA
// graph replayed three times with new values. Prints one line per (mode, type, op) with its
// wrong elements, and "# N groups, M wrong elements"; exits 1 where any is wrong.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "cuda_check.h"
#include "group_values.h"
#include "nccl_lib.h"

enum Mode { EAGER, TWO_STREAMS, GRAPH };
static const char* mode_names[] = {"eager", "two-streams", "graph"};

// One call of a group: its count, type and op, in place or not, and its buffers' misalignment
// (the input's; the output's is another).
struct CallSpec {
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  bool in_place;
  size_t offset;
  size_t send_offset() const { return offset; }
  size_t recv_offset() const { return offset * 3 % 16; }
};

// Element i of call k of `rank` in replay `round`: 1, 2 or 3, exact in every type, and so are
// the sums, products (2 to 4 ranks), maxima, minima and averages of them; scrambled, so that no
// two calls, offsets or rounds hold the same values.
static double value(int rank, size_t i, int k, int round) {
  unsigned h = (unsigned)i * 2654435761u + (unsigned)k * 40503u + (unsigned)rank * 9973u + (unsigned)round * 7919u;
  return 1 + (h >> 13) % 3;
}

static double expected(const CallSpec& c, int nranks, size_t i, int k, int round) {
  double acc = value(0, i, k, round);
  for (int r = 1; r < nranks; r++) {
    double v = value(r, i, k, round);
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

static const size_t SLOT_BYTES = (512 << 10) + 64;
static const int MAX_CALLS = 33;  // the largest group of groups_of

struct Gpus {
  int count;
  ncclComm_t comms[LIB_MAX_GPUS];
  cudaStream_t streams[LIB_MAX_GPUS][2];
  char* send[LIB_MAX_GPUS][MAX_CALLS];
  char* recv[LIB_MAX_GPUS][MAX_CALLS];
  char* scratch[LIB_MAX_GPUS][MAX_CALLS];  // an input and an output, staged for `fill`
};

// The groups run for one type and op: each a list of calls.
static std::vector<std::vector<CallSpec>> groups_of(ncclDataType_t t, ncclRedOp_t op) {
  size_t size = type_size(t);
  auto calls = [&](std::vector<size_t> counts, bool misaligned = false) {
    std::vector<CallSpec> g;
    for (size_t k = 0; k < counts.size(); k++)
      g.push_back({counts[k], t, op, k % 2 == 1, misaligned && k % 4 < 2 ? size : 0});
    return g;
  };
  std::vector<std::vector<CallSpec>> all = {
      calls({8 / size + 1, 8 / size + 1, 8 / size + 1, 8 / size + 1}),
      calls({1, 4097}),
      calls({1, 3, 17, 255, 256, 1000, 4096, 8191}),
      calls({1, 3, 17, 255, 256, 1000, 4096, 8191}, true),
      calls(std::vector<size_t>(9, 100)),                    // more than a launch carries
      calls(std::vector<size_t>(17, 100)),                   // more than two launches carry
      calls(std::vector<size_t>(33, 100)),                   // more than four launches carry
      calls(std::vector<size_t>(8, (64 << 10) / size)),      // 512 KiB: a lone sentinel call's most
      calls(std::vector<size_t>(3, (200 << 10) / size)),     // past it (floats): one launch on 2 GPUs
      calls(std::vector<size_t>(8, (256 << 10) / size)),     // 2 MiB: a sender's sentinel slot, full
      calls({(512 << 10) / size, (512 << 10) / size, (512 << 10) / size, (512 << 10) / size, 3}),  // past it
      calls(std::vector<size_t>(3, (48 << 10) / size)),      // past the packets' (integers): two
      calls(std::vector<size_t>(5, (256 << 10) / size)),     // past two
      calls({(32 << 10) / size, (128 << 10) / size, 5}),     // the packets' inbox, and past it
  };
  // Another type, and another op, in one group: not one kernel, so NCCL's.
  std::vector<CallSpec> mixed = calls({64, 64, 64});
  mixed[1].type = t == ncclFloat32 ? ncclInt32 : ncclFloat32;
  mixed[2].op = op == ncclSum ? ncclMax : ncclSum;
  all.push_back(mixed);
  return all;
}

// The stream call k of a group is issued on.
static cudaStream_t stream_of(Gpus& g, int d, size_t k, Mode mode) {
  return g.streams[d][mode == TWO_STREAMS ? k % 2 : 0];
}

// Fills every call's input for `round`, and the outputs with a value no result has, on the
// call's own stream (staged, then copied there): with two streams, late (`hold`), so that a
// launch on the other stream must wait for it, and that stream itself is held before the group,
// so that a read of the results on this one must wait for the launch.
static void fill(Gpus& g, const std::vector<CallSpec>& group, int round, Mode mode) {
  for (int d = 0; d < g.count; d++) {
    CUDA_CHECK(cudaSetDevice(d));
    for (size_t k = 0; k < group.size(); k++) {
      const CallSpec& c = group[k];
      size_t size = type_size(c.type);
      cudaStream_t s = stream_of(g, d, k, mode);
      std::vector<char> in(c.count * size), out(c.count * size);
      for (size_t i = 0; i < c.count; i++) {
        put(&in[i * size], c.type, value(d, i, (int)k, round));
        put(&out[i * size], c.type, 99);
      }
      char* send = g.send[d][k] + c.send_offset();
      char* recv = g.recv[d][k] + c.recv_offset();
      char* staged = g.scratch[d][k];
      CUDA_CHECK(cudaMemcpy(staged, in.data(), in.size(), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(staged + SLOT_BYTES, out.data(), out.size(), cudaMemcpyHostToDevice));
      if (mode == TWO_STREAMS && k % 2 == 1) hold<<<1, 1, 0, s>>>(200000);
      CUDA_CHECK(cudaMemcpyAsync(c.in_place ? recv : send, staged, in.size(), cudaMemcpyDeviceToDevice, s));
      if (!c.in_place) CUDA_CHECK(cudaMemcpyAsync(recv, staged + SLOT_BYTES, out.size(), cudaMemcpyDeviceToDevice, s));
    }
    if (mode == TWO_STREAMS) hold<<<1, 1, 0, g.streams[d][0]>>>(2000000);
  }
}

static void issue(Lib* lib, Gpus& g, const std::vector<CallSpec>& group, Mode mode) {
  NCCL_CALL(lib, GroupStart());
  for (size_t k = 0; k < group.size(); k++) {
    const CallSpec& c = group[k];
    for (int d = 0; d < g.count; d++) {
      char* recv = g.recv[d][k] + c.recv_offset();
      const char* send = c.in_place ? recv : g.send[d][k] + c.send_offset();
      NCCL_CALL(lib, AllReduce(send, recv, c.count, c.type, c.op, g.comms[d], stream_of(g, d, k, mode)));
    }
  }
  NCCL_CALL(lib, GroupEnd());
}

// Reads each call's output on the call's own stream (which must wait for the launch), then
// checks it.
static size_t check(Gpus& g, const std::vector<CallSpec>& group, int round, Mode mode) {
  size_t wrong = 0;
  for (int d = 0; d < g.count; d++) {
    CUDA_CHECK(cudaSetDevice(d));
    for (size_t k = 0; k < group.size(); k++) {
      const CallSpec& c = group[k];
      size_t size = type_size(c.type);
      std::vector<char> out(c.count * size);
      cudaStream_t s = stream_of(g, d, k, mode);
      CUDA_CHECK(cudaMemcpyAsync(out.data(), g.recv[d][k] + c.recv_offset(), out.size(), cudaMemcpyDeviceToHost, s));
      CUDA_CHECK(cudaStreamSynchronize(s));
      for (size_t i = 0; i < c.count; i++) {
        double want = expected(c, g.count, i, (int)k, round), got = get(&out[i * size], c.type);
        if (got != want) {
          if (wrong < 3)
            fprintf(stderr, "  GPU %d call %zu of %zu (count %zu, type %d, op %d%s): [%zu] = %g, want %g\n", d, k,
                    group.size(), c.count, c.type, c.op, c.in_place ? ", in place" : "", i, got, want);
          wrong++;
        }
      }
    }
    for (int s = 0; s < 2; s++) CUDA_CHECK(cudaStreamSynchronize(g.streams[d][s]));
  }
  return wrong;
}

// One group in `mode`: eagerly twice, or captured once and replayed three times.
static size_t run_group(Lib* lib, Gpus& g, const std::vector<CallSpec>& group, Mode mode) {
  if (mode != GRAPH) {
    // Twice on the same buffers with new values: the second launch is the first one again.
    size_t wrong = 0;
    for (int round = 0; round <= 1; round++) {
      fill(g, group, round, mode);
      issue(lib, g, group, mode);
      wrong += check(g, group, round, mode);
    }
    return wrong;
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
    wrong += check(g, group, round, mode);
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
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--lib") path = argv[i + 1];
    else if (a == "--ngpus") ngpus = atoi(argv[i + 1]);
    else { fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  if (!path || ngpus < 2 || ngpus > 4) {
    fprintf(stderr, "usage: group_fused --lib LIB [--ngpus 2..4]\n");
    return 2;
  }
  Lib lib;
  load(&lib, "lib", path);
  Gpus g;
  g.count = ngpus;
  int devices[LIB_MAX_GPUS];
  for (int d = 0; d < ngpus; d++) devices[d] = d;
  NCCL_CALL(&lib, CommInitAll(g.comms, ngpus, devices));
  for (int d = 0; d < ngpus; d++) {
    CUDA_CHECK(cudaSetDevice(d));
    for (int s = 0; s < 2; s++) CUDA_CHECK(cudaStreamCreateWithFlags(&g.streams[d][s], cudaStreamNonBlocking));
    for (int k = 0; k < MAX_CALLS; k++) {
      CUDA_CHECK(cudaMalloc(&g.send[d][k], SLOT_BYTES));
      CUDA_CHECK(cudaMalloc(&g.recv[d][k], SLOT_BYTES));
      CUDA_CHECK(cudaMalloc(&g.scratch[d][k], 2 * SLOT_BYTES));
    }
  }
  const ncclDataType_t types[] = {ncclFloat32, ncclBfloat16, ncclFloat16, ncclFloat64,
                                  ncclInt32,   ncclUint8,    ncclInt64};
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  size_t groups = 0, wrong_all = 0;
  for (int mode = EAGER; mode <= GRAPH; mode++) {
    for (ncclDataType_t t : types) {
      for (ncclRedOp_t op : ops) {
        size_t wrong = 0;
        for (const auto& group : groups_of(t, op)) {
          if (!group_fits(group.size(), MAX_CALLS)) return 2;
          wrong += run_group(&lib, g, group, (Mode)mode);
          groups++;
        }
        printf("%-12s type %d op %d: %zu wrong\n", mode_names[mode], t, op, wrong);
        wrong_all += wrong;
      }
    }
  }
  for (int d = 0; d < ngpus; d++) NCCL_CALL(&lib, CommDestroy(g.comms[d]));
  printf("# %zu groups, %zu wrong elements\n", groups, wrong_all);
  return wrong_all ? 1 : 0;
}
