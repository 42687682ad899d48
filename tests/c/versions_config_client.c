/* Passes the config of the nccl.h it is compiled against (80 bytes for 2.28) to
 * ncclCommInitRankConfig and prints what comes back: the result, the last error, whether the
 * communicator handed back is the config's own address (what versions_config_recorder.c
 * answers), and whether the config's bytes are as the client left them. */
#include <nccl.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  unsigned char before[sizeof config];
  memcpy(before, &config, sizeof config);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclComm_t comm = NULL;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
  const char* last = ncclGetLastError(NULL);
  printf("config size: %zu\n", sizeof config);
  printf("ncclCommInitRankConfig: rc=%d last_error=\"%s\"\n", (int)rc, last ? last : "(null)");
  printf("comm is the config's address: %d\n", (void*)comm == (void*)&config);
  printf("config unchanged: %d\n", memcmp(before, &config, sizeof config) == 0);
  return 0;
}
