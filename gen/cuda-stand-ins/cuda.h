/* Stand-in for the CUDA driver header, which nccl_device/ includes: just what its host-side
 * declarations need, with the same sizes as CUDA's own. */
#ifndef NCCLSHIM_STAND_IN_CUDA_H
#define NCCLSHIM_STAND_IN_CUDA_H
/* An enum in CUDA; only its size matters here. */
typedef int CUmemLocationType;
#endif
