/* Calls the two functions that NCCL 2.27 added over 2.26 (ncclCommShrink,
 * ncclCommWindowRegister): against a real 2.26 behind ncclshim they must fail with
 * ncclInvalidUsage and leave a message naming the function. */
#include <nccl.h>
#include <stdio.h>

int main(void) {
  ncclComm_t child = NULL;
  ncclResult_t rc = ncclCommShrink(NULL, NULL, 0, &child, NULL, NCCL_SHRINK_DEFAULT);
  const char* last = ncclGetLastError(NULL);
  printf("ncclCommShrink: rc=%d last_error=\"%s\"\n", (int)rc, last ? last : "(null)");
  ncclWindow_t window = NULL;
  rc = ncclCommWindowRegister(NULL, NULL, 0, &window, NCCL_WIN_DEFAULT);
  last = ncclGetLastError(NULL);
  printf("ncclCommWindowRegister: rc=%d last_error=\"%s\"\n", (int)rc, last ? last : "(null)");
  /* A failure of the real NCCL afterwards is the newer error. */
  int count = 0;
  rc = ncclCommCount(NULL, &count);
  last = ncclGetLastError(NULL);
  printf("ncclCommCount(NULL): rc=%d last_error=\"%s\"\n", (int)rc, last ? last : "(null)");
  return 0;
}
