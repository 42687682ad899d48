/* Stand-in for cuda_fp8.h: nccl.h includes it but declares nothing that needs it. */
