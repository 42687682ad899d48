// NCCL_OK(call): an NCCL call that must succeed; otherwise the file, line, call and NCCL's
// message go to stderr and the program exits with status 2. For the GPU programs linked with
// -lnccl (those that dlopen NCCL use nccl_lib.h's NCCL_CALL).
#pragma once
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define NCCL_OK(call)                                                                          \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    if (r_ != ncclSuccess) {                                                                   \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
      exit(2);                                                                                 \
    }                                                                                          \
  } while (0)
