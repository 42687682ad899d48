/* Stand-in for the CUDA runtime header: just what nccl.h's declarations need,
 * so that a spec can be generated on a machine without the CUDA toolkit. */
#ifndef NCCLSHIM_STAND_IN_CUDA_RUNTIME_H
#define NCCLSHIM_STAND_IN_CUDA_RUNTIME_H
#include <stddef.h>
#include <stdint.h>
#define CUDART_VERSION 12080
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
#endif
