/* A program that loads NCCL at run time by its soname, calls it, closes it, and opens it again
 * (as Rust crates that dlopen libnccl.so.2 for one call do): prints which file answered each
 * round, so the test can tell the shim from the real NCCL it loaded behind itself. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*get_version_fn)(int *);

static int round_trip(int round) {
  void *library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    printf("round %d: dlopen failed: %s\n", round, dlerror());
    return 1;
  }
  void *function = dlsym(library, "ncclGetVersion");
  Dl_info info;
  if (function == NULL || dladdr(function, &info) == 0 || info.dli_fname == NULL) {
    printf("round %d: ncclGetVersion not found\n", round);
    return 1;
  }
  int version = 0;
  int rc = ((get_version_fn)function)(&version);
  printf("round %d: from %s rc=%d version=%d\n", round, info.dli_fname, rc, version);
  return dlclose(library) == 0 ? 0 : 1;
}

int main(void) {
  for (int round = 1; round <= 2; round++) {
    if (round_trip(round) != 0) return 1;
  }
  return 0;
}
