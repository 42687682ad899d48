// What the group checks (group_fused.cu, group_moves.cu) share: NCCL's types as host values,
// a kernel that holds a stream, and the check that a group fits the buffers made for it.
#pragma once
#include <cuda_fp16.h>
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

static bool is_int(ncclDataType_t t) { return t <= ncclUint64; }

// Value `v` (a small integer, or a fraction of one) as `t`, into `p`.
static void put(void* p, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8: *(signed char*)p = (signed char)v; break;
    case ncclUint8: *(unsigned char*)p = (unsigned char)v; break;
    case ncclInt32: *(int*)p = (int)v; break;
    case ncclUint32: *(unsigned*)p = (unsigned)v; break;
    case ncclInt64: *(long long*)p = (long long)v; break;
    case ncclUint64: *(unsigned long long*)p = (unsigned long long)v; break;
    case ncclFloat16: *(__half*)p = __float2half((float)v); break;
    case ncclBfloat16: {
      float f = (float)v;
      unsigned bits;
      memcpy(&bits, &f, 4);
      *(unsigned short*)p = (unsigned short)(bits >> 16);
      break;
    }
    case ncclFloat32: *(float*)p = (float)v; break;
    default: *(double*)p = v; break;
  }
}

static double get(const void* p, ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return *(const signed char*)p;
    case ncclUint8: return *(const unsigned char*)p;
    case ncclInt32: return *(const int*)p;
    case ncclUint32: return *(const unsigned*)p;
    case ncclInt64: return (double)*(const long long*)p;
    case ncclUint64: return (double)*(const unsigned long long*)p;
    case ncclFloat16: return __half2float(*(const __half*)p);
    case ncclBfloat16: {
      unsigned bits = (unsigned)*(const unsigned short*)p << 16;
      float f;
      memcpy(&f, &bits, 4);
      return f;
    }
    case ncclFloat32: return *(const float*)p;
    default: return *(const double*)p;
  }
}

// Holds a stream for about `ns` nanoseconds: what comes after it there is late.
__global__ void hold(long long ns) {
  long long start = clock64(), cycles = ns * 2;  // about 2 GHz
  while (clock64() - start < cycles) {
  }
}

// Whether a group of `calls` calls fits the buffers made for `most`; says so where it does not.
static bool group_fits(size_t calls, int most) {
  if (calls <= (size_t)most) return true;
  fprintf(stderr, "a group of %zu calls: buffers for %d only\n", calls, most);
  return false;
}
