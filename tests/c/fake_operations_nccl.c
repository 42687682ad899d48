/* A stand-in for the real NCCL whose operations succeed without a GPU, for tests of what the
 * shim records of each call (summary, trace, flight recorder) and of what reaches NCCL in a
 * group. Communicators are made-up handles: rank = handle / 0x1000 - 1 (so 0x1000 is rank 0),
 * 2 ranks, GPU 0 (ncclCommInitRank makes them too). With FAKE_NCCL_GROUPS set, it prints
 * "fake NAME" for each group call (a simulated end too), all-reduce and broadcast it gets.
 * Windows as NCCL 2.28 registers them: handle 0xbeef, and nothing written (ncclSuccess still)
 * where there is nothing to register. With FAKE_NCCL_BARRIER naming a folder, ncclCommInitRank returns only once both
 * ranks' processes have entered it (as NCCL's init completes on no rank before every rank has
 * entered it), each leaving a file there. */
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void say(const char* name) {
  if (getenv("FAKE_NCCL_GROUPS")) printf("fake %s\n", name);
}

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t result) { return result ? "fake error" : "no error"; }
const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return "";
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = (int)((uintptr_t)comm / 0x1000) - 1;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  (void)comm;
  *count = 2;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  (void)comm;
  *device = 0;
  return ncclSuccess;
}
/* Waits (up to 20 s) until every rank of 2 has entered ncclCommInitRank, where FAKE_NCCL_BARRIER
 * names a folder for their files. */
static void barrier(int rank) {
  const char* dir = getenv("FAKE_NCCL_BARRIER");
  if (!dir) return;
  char mine[4096], peer[4096];
  snprintf(mine, sizeof mine, "%s/rank%d", dir, rank);
  snprintf(peer, sizeof peer, "%s/rank%d", dir, 1 - rank);
  FILE* f = fopen(mine, "w");
  if (f) fclose(f);
  for (int i = 0; i < 2000 && access(peer, F_OK) != 0; i++) usleep(10000);
}

/* Makes rank `rank`'s communicator: handle 0x1000 * (rank + 1). */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  (void)nranks, (void)id;
  barrier(rank);
  *comm = (ncclComm_t)(uintptr_t)(0x1000 * (rank + 1));
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  (void)comm;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
  (void)s, (void)r, (void)n, (void)t, (void)op, (void)c, (void)st;
  say("ncclAllReduce");
  return ncclSuccess;
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  (void)s, (void)r, (void)n, (void)t, (void)c, (void)st;
  return ncclSuccess;
}
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t st) {
  (void)s, (void)r, (void)n, (void)t, (void)root, (void)c, (void)st;
  say("ncclBroadcast");
  return ncclSuccess;
}
ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  (void)s, (void)n, (void)t, (void)peer, (void)c, (void)st;
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  (void)r, (void)n, (void)t, (void)peer, (void)c, (void)st;
  return ncclSuccess;
}
ncclResult_t ncclGroupStart(void) {
  say("ncclGroupStart");
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  say("ncclGroupEnd");
  return ncclSuccess;
}
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  (void)simInfo;
  say("ncclGroupSimulateEnd");
  return ncclSuccess;
}
/* Asked by the shim before it sets up its core for a communicator (which it then declines here:
 * no GPU). */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  (void)comm;
  *state = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int flags) {
  (void)flags;
  if (!comm) return ncclInvalidArgument;
  if (buff && size) *win = (ncclWindow_t)(uintptr_t)0xbeef;
  return ncclSuccess;
}
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  (void)win;
  return comm ? ncclSuccess : ncclInvalidArgument;
}
