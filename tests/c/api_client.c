/* A C client of the NCCL API that needs no GPU: prints one line per call with what NCCL
 * answered, so that runs against the real NCCL and through ncclshim can be compared line by
 * line. Compiled against NVIDIA's nccl.h. */
#include <nccl.h>
#include <stdio.h>
#include <string.h>

static void line(const char* what, ncclResult_t rc) {
  const char* last = ncclGetLastError(NULL);
  printf("%s: rc=%d last_error=\"%s\"\n", what, (int)rc, last ? last : "(null)");
}

int main(void) {
  int version = 0;
  ncclResult_t rc = ncclGetVersion(&version);
  printf("ncclGetVersion: rc=%d version=%d\n", (int)rc, version);

  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  rc = ncclGetUniqueId(&id);
  int nonzero = 0;
  for (size_t i = 0; i < sizeof id.internal; i++) nonzero |= id.internal[i] != 0;
  printf("ncclGetUniqueId: rc=%d nonzero=%d\n", (int)rc, nonzero);

  for (int r = 0; r <= ncclNumResults + 1; r++) printf("ncclGetErrorString(%d): %s\n", r, ncclGetErrorString((ncclResult_t)r));
  printf("ncclGetErrorString(-1): %s\n", ncclGetErrorString((ncclResult_t)-1));
  printf("ncclGetLastError(NULL) is %s\n", ncclGetLastError(NULL) ? "not NULL" : "NULL");

  /* Bad arguments: NCCL checks these before it needs a GPU. */
  line("ncclGetVersion(NULL)", ncclGetVersion(NULL));
  line("ncclGetUniqueId(NULL)", ncclGetUniqueId(NULL));
  ncclComm_t comm = NULL;
  line("ncclCommInitRank(NULL comm out)", ncclCommInitRank(NULL, 1, id, 0));
  line("ncclCommInitRank(nranks=0)", ncclCommInitRank(&comm, 0, id, 0));
  line("ncclCommInitRank(nranks=-1)", ncclCommInitRank(&comm, -1, id, 0));
  line("ncclCommInitRank(rank=2 of 2)", ncclCommInitRank(&comm, 2, id, 2));
  line("ncclCommInitRank(rank=-1)", ncclCommInitRank(&comm, 2, id, -1));
  int count = -7, rank = -7, device = -7;
  line("ncclCommCount(NULL comm)", ncclCommCount(NULL, &count));
  line("ncclCommUserRank(NULL comm)", ncclCommUserRank(NULL, &rank));
  line("ncclCommCuDevice(NULL comm)", ncclCommCuDevice(NULL, &device));
  printf("outputs untouched: %d %d %d\n", count, rank, device);
  ncclResult_t async = ncclSuccess;
  line("ncclCommGetAsyncError(NULL comm)", ncclCommGetAsyncError(NULL, &async));
  line("ncclCommFinalize(NULL)", ncclCommFinalize(NULL));
  line("ncclCommDestroy(NULL)", ncclCommDestroy(NULL));
  line("ncclCommAbort(NULL)", ncclCommAbort(NULL));
  line("ncclAllReduce(NULL comm)", ncclAllReduce(NULL, NULL, 8, ncclFloat, ncclSum, NULL, NULL));
  line("ncclBroadcast(NULL comm)", ncclBroadcast(NULL, NULL, 8, ncclFloat, 0, NULL, NULL));
  line("ncclSend(NULL comm)", ncclSend(NULL, 8, ncclFloat, 0, NULL, NULL));
  line("ncclRecv(NULL comm)", ncclRecv(NULL, 8, ncclFloat, 0, NULL, NULL));
  ncclComm_t child = NULL;
  line("ncclCommSplit(NULL comm)", ncclCommSplit(NULL, 0, 0, &child, NULL));
  line("ncclCommInitAll(NULL comms)", ncclCommInitAll(NULL, 1, NULL));
  ncclComm_t comms[2];
  line("ncclCommInitAll(ndev=0)", ncclCommInitAll(comms, 0, NULL));
  line("ncclCommInitAll(ndev=-1)", ncclCommInitAll(comms, -1, NULL));
  ncclRedOp_t op;
  float scalar = 2.0f;
  line("ncclRedOpCreatePreMulSum(NULL comm)", ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, NULL));
  line("ncclMemAlloc(NULL out)", ncclMemAlloc(NULL, 64));
  line("ncclGroupEnd without ncclGroupStart", ncclGroupEnd());
  line("ncclGroupStart", ncclGroupStart());
  line("ncclGroupEnd", ncclGroupEnd());

  /* With no GPU, creating a communicator fails the way the real NCCL fails. */
  rc = ncclCommInitRank(&comm, 1, id, 0);
  const char* last = ncclGetLastError(NULL);
  printf("ncclCommInitRank(1 rank, no GPU): rc=%d last_error=\"%s\"\n", (int)rc, last ? last : "(null)");
  return 0;
}
