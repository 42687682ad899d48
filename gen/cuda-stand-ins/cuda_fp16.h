/* Stand-in for cuda_fp16.h: nccl.h declares nothing that needs it; nccl_device/ names `half`
 * in templates that host code never instantiates. */
#ifndef NCCLSHIM_STAND_IN_CUDA_FP16_H
#define NCCLSHIM_STAND_IN_CUDA_FP16_H
typedef struct __half { unsigned short x; } __half;
typedef __half half;
#endif
