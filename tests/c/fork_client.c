/* A parent that calls NCCL before it forks, and a child that calls it after (as launchers and
 * data loaders do): with NCCL_DEBUG_FILE naming a file per process (%p), the child's lines, the
 * shim's and the real NCCL's, go to the child's file. Built against 2.27.7 headers, run on a real
 * 2.26.5: ncclCommShrink is missing there, so the shim warns in the child. */
#include <nccl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
  int version = 0;
  ncclGetVersion(&version);
  printf("parent %d: version=%d\n", (int)getpid(), version);
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    ncclComm_t shrunk = NULL;
    ncclResult_t rc = ncclCommShrink(NULL, NULL, 0, &shrunk, NULL, NCCL_SHRINK_DEFAULT);
    int count = 0;
    ncclResult_t count_rc = ncclCommCount(NULL, &count);
    printf("child %d: ncclCommShrink rc=%d ncclCommCount(NULL) rc=%d\n", (int)getpid(), (int)rc,
           (int)count_rc);
    return 0;
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
