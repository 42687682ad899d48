/* Stand-in for cuda_fp16.h: nccl.h includes it but declares nothing that needs it. */
