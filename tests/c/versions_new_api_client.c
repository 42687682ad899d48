/* A client of NCCL 2.28 (compiled against its nccl.h) run over an older real NCCL behind
 * ncclshim's build for every version: the functions 2.28 added must fail with ncclInvalidUsage
 * and a message naming the function and the real version; the others forward. */
#include <nccl.h>
#include <stdio.h>

int main(void) {
  int version = 0;
  ncclResult_t rc = ncclGetVersion(&version);
  printf("ncclGetVersion: rc=%d version=%d\n", (int)rc, version);
  printf("ncclGetErrorString(ncclInvalidUsage): %s\n", ncclGetErrorString(ncclInvalidUsage));
  rc = ncclAlltoAll(NULL, NULL, 0, ncclFloat, NULL, NULL);
  const char* last = ncclGetLastError(NULL);
  printf("ncclAlltoAll: rc=%d last_error=\"%s\"\n", (int)rc, last ? last : "(null)");
  return 0;
}
