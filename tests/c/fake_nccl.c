/* A stand-in for the real NCCL that, like the real one, calls its own exports through the PLT.
 * Loaded by ncclshim as "the real NCCL" (NCCLSHIM_REAL_NCCL), its calls to ncclGetErrorString
 * and ncclGetLastError land in ncclshim's exports, on the thread that is already inside the
 * shim: the reentrancy guard must send them straight back here. Build with -O0 -fPIC so the
 * calls stay interposable. */
#include <nccl.h>
#include <string.h>

const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "fake: no error" : "fake: some error";
}

const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return "fake: own last error";
}

/* Called by ncclshim while it loads this library: the nested call must neither deadlock nor
 * recurse. */
ncclResult_t ncclGetVersion(int* version) {
  const char* nested = ncclGetErrorString(ncclSuccess);
  if (version) *version = nested != NULL ? 22707 : -1;
  return ncclSuccess;
}

/* Reports through *count whether a nested ncclGetLastError reached this library (1) or was
 * answered by ncclshim's router (0). */
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  (void)comm;
  *count = strcmp(ncclGetLastError(NULL), "fake: own last error") == 0;
  return ncclSuccess;
}
