/* Stand-in for cuda_bf16.h: nccl.h includes it but declares nothing that needs it. */
