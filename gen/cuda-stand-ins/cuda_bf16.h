/* Stand-in for cuda_bf16.h. nccl.h declares nothing that needs the type, but up to 2.23 it
 * declares ncclBfloat16 only where CUDA says the type exists, as it does since CUDA 11;
 * nccl_device/ names it in templates that host code never instantiates. */
#ifndef NCCLSHIM_STAND_IN_CUDA_BF16_H
#define NCCLSHIM_STAND_IN_CUDA_BF16_H
#define __CUDA_BF16_TYPES_EXIST__
typedef struct __nv_bfloat16 { unsigned short x; } __nv_bfloat16;
#endif
