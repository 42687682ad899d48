/* A client of NCCL 2.27 run over a real 2.26 behind ncclshim's build for every version. Without
 * arguments it only asks the version; with "missing" it also calls ncclCommShrink (new in 2.27)
 * twice and ncclCommWindowRegister (also new) once: each fails with ncclInvalidUsage, and the
 * shim warns once per function. */
#include <nccl.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  int version = 0;
  ncclResult_t rc = ncclGetVersion(&version);
  printf("ncclGetVersion: rc=%d version=%d\n", (int)rc, version);
  if (argc < 2 || strcmp(argv[1], "missing") != 0) return 0;
  for (int i = 0; i < 2; i++) {
    ncclComm_t child = NULL;
    rc = ncclCommShrink(NULL, NULL, 0, &child, NULL, NCCL_SHRINK_DEFAULT);
    printf("ncclCommShrink: rc=%d\n", (int)rc);
  }
  ncclWindow_t window = NULL;
  rc = ncclCommWindowRegister(NULL, NULL, 0, &window, NCCL_WIN_DEFAULT);
  printf("ncclCommWindowRegister: rc=%d\n", (int)rc);
  return 0;
}
