// One libnccl.so.2 reached through dlsym (nccl.h gives the types, never a link), and the byte
// sizes the GPU programs take on their command lines. Shared by bench.cu, traffic_floor.cu and late_peer.cu.
#pragma once
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define LIB_MAX_GPUS 16

// One library's calls, and its communicators (one per GPU).
struct Lib {
  const char* name;
  const char* path;
  int version;
  ncclComm_t comms[LIB_MAX_GPUS];
  decltype(&ncclGetVersion) GetVersion;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclCommInitAll) CommInitAll;
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRank) CommInitRank;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclGroupStart) GroupStart;
  decltype(&ncclGroupEnd) GroupEnd;
  decltype(&ncclAllReduce) AllReduce;
  decltype(&ncclAllGather) AllGather;
  decltype(&ncclReduceScatter) ReduceScatter;
  decltype(&ncclBroadcast) Broadcast;
  decltype(&ncclReduce) Reduce;
  decltype(&ncclAlltoAll) AlltoAll;
  decltype(&ncclGather) Gather;
  decltype(&ncclScatter) Scatter;
  decltype(&ncclSend) Send;
  decltype(&ncclRecv) Recv;
};

// A call through `lib` that must succeed.
#define NCCL_CALL(lib, call) nccl_ok((lib), (lib)->call, #call, __FILE__, __LINE__)

static void nccl_ok(const Lib* lib, ncclResult_t r, const char* what, const char* file, int line) {
  if (r == ncclSuccess) return;
  fprintf(stderr, "%s:%d: %s through %s: %s\n", file, line, what, lib->name,
          lib->GetErrorString(r));
  exit(2);
}

template <typename F>
static void bind(void* handle, const char* lib, const char* symbol, F* slot) {
  *slot = (F)dlsym(handle, symbol);
  if (!*slot) {
    fprintf(stderr, "%s has no %s\n", lib, symbol);
    exit(2);
  }
}

static void load(Lib* L, const char* name, const char* path) {
  L->name = name;
  L->path = path;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
    exit(2);
  }
#define BIND(f) bind(h, path, "nccl" #f, &L->f)
  BIND(GetVersion); BIND(GetErrorString); BIND(CommInitAll); BIND(GetUniqueId);
  BIND(CommInitRank); BIND(CommDestroy);
  BIND(GroupStart); BIND(GroupEnd); BIND(AllReduce); BIND(AllGather); BIND(ReduceScatter);
  BIND(Broadcast); BIND(Reduce); BIND(AlltoAll); BIND(Gather); BIND(Scatter); BIND(Send);
  BIND(Recv);
#undef BIND
  NCCL_CALL(L, GetVersion(&L->version));
  Dl_info info;  // which file the AllReduce we call lives in: the proof of which library runs
  dladdr((void*)L->AllReduce, &info);
  printf("# %-4s %s: ncclGetVersion %d, ncclAllReduce at %p in %s\n", name, path, L->version,
         (void*)L->AllReduce, info.dli_fname);
}

// A size such as 4096, 64K, 8M or 1G; `rest`, if given, gets what follows it.
static size_t parse_bytes(const char* s, const char** rest = NULL) {
  char* end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1 << 10, end++;
  else if (*end == 'M' || *end == 'm') v *= 1 << 20, end++;
  else if (*end == 'G' || *end == 'g') v *= 1 << 30, end++;
  if (rest) *rest = end;
  return (size_t)v;
}
