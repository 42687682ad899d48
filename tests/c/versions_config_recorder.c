/* A stand-in for a real NCCL 2.27.7 that shows what ncclshim hands it: ncclCommInitRankConfig
 * answers ncclSuccess only if the config it gets is the client's own 2.28 config (size 80, the
 * magic and version NCCL_CONFIG_INITIALIZER writes), and hands the config's address back as the
 * communicator, so that the client can see it was not copied. Build with -shared -fPIC. */
#include <nccl.h>
#include <stddef.h>

ncclResult_t ncclGetVersion(int* version) {
  *version = 22707;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  (void)nranks;
  (void)commId;
  (void)rank;
  if (config == NULL || config->size != 80 || config->magic != 0xcafebeef ||
      config->version != 22809)
    return ncclInvalidArgument;
  *comm = (ncclComm_t)(void*)config;
  return ncclSuccess;
}
