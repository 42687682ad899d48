// Input values and host reference results for the correctness matrix (collectives.cu).
// Pure C, no CUDA: every element is held as its raw bits (uint64_t, low `size` bytes used).
//
// Inputs are chosen so that every reduction order gives the same bits, as nccl-tests does:
// sums, averages and pre-multiplied sums use integers small enough that every partial sum is
// exact in the type; products use values whose products are powers of two (floats) or wrap the
// same way in any order (integers); max and min may use any value. Copies use arbitrary bits.
#ifndef NCCLSHIM_GPU_VALUES_H
#define NCCLSHIM_GPU_VALUES_H

#include <math.h>
#include <stdint.h>
#include <string.h>

// The 12 ncclDataType_t values, in NCCL's order.
enum { T_INT8, T_UINT8, T_INT32, T_UINT32, T_INT64, T_UINT64, T_HALF, T_FLOAT, T_DOUBLE,
       T_BF16, T_FP8E4M3, T_FP8E5M2, T_COUNT };

// The 5 built-in ncclRedOp_t values, then ours: PreMulSum with a host or a device scalar, and
// "no reduction" for the copying collectives.
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_PREMUL_HOST, OP_PREMUL_DEVICE, OP_NONE,
       OP_COUNT };

// PreMulSum's scalar: a power of two keeps the exactness of the sums it scales.
#define PREMUL_SCALAR 2.0

typedef struct {
  const char* name;
  int size;      // bytes
  int is_float;
  int is_signed; // integers only
  int exp_bits, mant_bits;
  double exact;  // every integer in [-exact, exact] is representable (and fits) in the type
} TypeInfo;

static const TypeInfo TYPES[T_COUNT] = {
    {"int8", 1, 0, 1, 0, 0, 127.0},
    {"uint8", 1, 0, 0, 0, 0, 255.0},
    {"int32", 4, 0, 1, 0, 0, 2147483647.0},
    {"uint32", 4, 0, 0, 0, 0, 4294967295.0},
    {"int64", 8, 0, 1, 0, 0, 4611686018427387904.0},
    {"uint64", 8, 0, 0, 0, 0, 4611686018427387904.0},
    {"half", 2, 1, 1, 5, 10, 2048.0},
    {"float", 4, 1, 1, 8, 23, 16777216.0},
    {"double", 8, 1, 1, 11, 52, 9007199254740992.0},
    {"bfloat16", 2, 1, 1, 8, 7, 256.0},
    {"f8e4m3", 1, 1, 1, 4, 3, 16.0},
    {"f8e5m2", 1, 1, 1, 5, 2, 8.0},
};

static const char* const OP_NAMES[OP_COUNT] = {"sum", "prod", "max", "min", "avg",
                                               "premul_host", "premul_dev", "none"};

static inline uint64_t width_mask(int size) {
  return size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
}

// --- Small float formats (half, bfloat16, fp8), for values that are exactly representable. ---

static inline uint64_t encode_small_float(double v, int exp_bits, int mant_bits) {
  int bias = (1 << (exp_bits - 1)) - 1;
  uint64_t sign = signbit(v) ? 1 : 0;  // -0.0 too
  double a = fabs(v);
  uint64_t e = 0, m = 0;
  if (a != 0) {
    int exp2;
    double f = frexp(a, &exp2);  // a = f * 2^exp2, f in [0.5, 1)
    int biased = exp2 - 1 + bias;
    if (biased <= 0) {  // subnormal
      m = (uint64_t)ldexp(a, bias - 1 + mant_bits);
    } else {
      e = (uint64_t)biased;
      m = (uint64_t)ldexp(f * 2 - 1, mant_bits);
    }
  }
  return (sign << (exp_bits + mant_bits)) | (e << mant_bits) | m;
}

static inline double decode_small_float(uint64_t bits, int exp_bits, int mant_bits) {
  int bias = (1 << (exp_bits - 1)) - 1;
  uint64_t m = bits & ((1ull << mant_bits) - 1);
  int e = (int)((bits >> mant_bits) & ((1ull << exp_bits) - 1));
  double a = e == 0 ? ldexp((double)m, 1 - bias - mant_bits)
                    : ldexp(1 + ldexp((double)m, -mant_bits), e - bias);
  return (bits >> (exp_bits + mant_bits)) & 1 ? -a : a;
}

static inline uint64_t encode_float(int type, double v) {
  if (type == T_FLOAT) {
    float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
  }
  if (type == T_DOUBLE) {
    uint64_t b;
    memcpy(&b, &v, 8);
    return b;
  }
  return encode_small_float(v, TYPES[type].exp_bits, TYPES[type].mant_bits);
}

static inline double decode_float(int type, uint64_t bits) {
  if (type == T_FLOAT) {
    uint32_t b = (uint32_t)bits;
    float f;
    memcpy(&f, &b, 4);
    return f;
  }
  if (type == T_DOUBLE) {
    double d;
    memcpy(&d, &bits, 8);
    return d;
  }
  return decode_small_float(bits, TYPES[type].exp_bits, TYPES[type].mant_bits);
}

// Whether `bits` are a NaN of the floating-point `type` (e4m3 has one NaN per sign, S.1111.111;
// the others are IEEE-like: exponent all ones, mantissa not zero).
static inline int is_nan_bits(int type, uint64_t bits) {
  const TypeInfo* t = &TYPES[type];
  uint64_t m = bits & ((1ull << t->mant_bits) - 1);
  uint64_t e = (bits >> t->mant_bits) & ((1ull << t->exp_bits) - 1);
  if (type == T_FP8E4M3) return (bits & 0x7f) == 0x7f;
  return e == (1ull << t->exp_bits) - 1 && m != 0;
}

// An integer's bits, sign-extended to 64 bits if the type is signed.
static inline uint64_t extend_int(int type, uint64_t bits) {
  int shift = 64 - 8 * TYPES[type].size;
  if (shift == 0) return bits;
  return TYPES[type].is_signed ? (uint64_t)(((int64_t)(bits << shift)) >> shift)
                               : bits & width_mask(TYPES[type].size);
}

// --- Inputs ---

static inline uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Largest magnitude of one rank's input to a sum over `nranks` that keeps it exact (and, for
// integers, free of overflow even when pre-multiplied by the scalar).
static inline uint64_t sum_bound(int type, int nranks) {
  const TypeInfo* t = &TYPES[type];
  double b = t->is_float ? t->exact / nranks : t->exact / (PREMUL_SCALAR * nranks);
  if (b > 1099511627776.0) b = 1099511627776.0;  // 2^40: plenty of bits for 64-bit types
  return b < 1 ? 1 : (uint64_t)b;
}

// The bits of element `i` of `rank`'s input to a collective with reduction `op`.
static inline uint64_t input_bits(int type, int op, int nranks, int rank, uint64_t seed,
                                  uint64_t i) {
  const TypeInfo* t = &TYPES[type];
  uint64_t h = mix64(seed ^ ((uint64_t)rank << 48) ^ (i * 0x2545F4914F6CDD1Dull));
  uint64_t mask = width_mask(t->size);
  switch (op) {
    case OP_NONE:  // copies: any bits
      return h & mask;
    case OP_PROD:
      if (!t->is_float) return 1 + h % 3;
      return encode_float(type, h % 3 == 0 ? -1.0 : h % 3 == 1 ? 1.0 : 2.0);
    case OP_MAX:
    case OP_MIN:
      if (!t->is_float) return h & mask;
      {
        uint64_t e = (uint64_t)t->exact;
        return encode_float(type, (double)(int64_t)(h % (2 * e + 1)) - (double)e);
      }
    default: {  // sum, avg, premul: small values (signed integers stay >= 0 for avg's division)
      uint64_t b = sum_bound(type, nranks);
      if (!t->is_float) return h % (b + 1);
      return encode_float(type, (double)(int64_t)(h % (2 * b + 1)) - (double)b);
    }
  }
}

// --- Reductions ---

// The bits of op applied over inputs[0..n) (each an element's bits), as NCCL must compute it.
static inline uint64_t reduce_bits(int type, int op, int n, const uint64_t* in) {
  const TypeInfo* t = &TYPES[type];
  uint64_t mask = width_mask(t->size);
  if (t->is_float) {
    double acc = decode_float(type, in[0]);
    if (op == OP_PREMUL_HOST || op == OP_PREMUL_DEVICE) acc *= PREMUL_SCALAR;
    for (int r = 1; r < n; r++) {
      double x = decode_float(type, in[r]);
      switch (op) {
        case OP_PROD: acc *= x; break;
        case OP_MAX: acc = x > acc ? x : acc; break;
        case OP_MIN: acc = x < acc ? x : acc; break;
        case OP_PREMUL_HOST:
        case OP_PREMUL_DEVICE: acc += x * PREMUL_SCALAR; break;
        default: acc += x;
      }
    }
    if (op == OP_AVG) acc /= n;
    return encode_float(type, acc) & mask;
  }
  uint64_t acc = extend_int(type, in[0]);
  if (op == OP_PREMUL_HOST || op == OP_PREMUL_DEVICE) acc *= (uint64_t)PREMUL_SCALAR;
  for (int r = 1; r < n; r++) {
    uint64_t x = extend_int(type, in[r]);
    int greater = t->is_signed ? (int64_t)x > (int64_t)acc : x > acc;
    switch (op) {
      case OP_PROD: acc *= x; break;  // wraps the same way in any order
      case OP_MAX: acc = greater ? x : acc; break;
      case OP_MIN: acc = (!greater && x != acc) ? x : acc; break;
      case OP_PREMUL_HOST:
      case OP_PREMUL_DEVICE: acc += x * (uint64_t)PREMUL_SCALAR; break;
      default: acc += x;
    }
  }
  if (op == OP_AVG) acc = t->is_signed ? (uint64_t)((int64_t)acc / n) : acc / (uint64_t)n;
  return acc & mask;
}

// Special values for a floating-point sum, in runs of 4 elements (a whole 4- or 8-byte word of
// any type, in a 16-aligned buffer), by run: all bits set on rank 0 and 1.0 elsewhere (a NaN
// whose every word is the pattern the core's sentinel kernel reserves: it must come out NaN,
// and not hang); -0.0 on every rank (its sum is -0.0, sign included); a sum's usual inputs.
static inline uint64_t special_input_bits(int type, int nranks, int rank, uint64_t seed,
                                          uint64_t i) {
  switch (i / 4 % 3) {
    case 0: return rank == 0 ? width_mask(TYPES[type].size) : encode_float(type, 1.0);
    case 1: return encode_float(type, -0.0);
    default: return input_bits(type, OP_SUM, nranks, rank, seed, i);
  }
}

// The bits of the sum of special_input_bits over `nranks` ranks: any NaN where this gives one.
static inline uint64_t special_sum_bits(int type, int nranks, uint64_t seed, uint64_t i) {
  uint64_t in[64];
  switch (i / 4 % 3) {
    case 0: return width_mask(TYPES[type].size);
    case 1: return encode_float(type, -0.0);
    default:
      for (int r = 0; r < nranks; r++) in[r] = special_input_bits(type, nranks, r, seed, i);
      return reduce_bits(type, OP_SUM, nranks, in);
  }
}

// Special values for a copy, in runs of 4 elements, by run: all bits set (whole 4-byte words in
// 32-bit types, which the core's sentinel stores cannot tell from no data: such packs take their
// flagged path), zero, and arbitrary bits.
static inline uint64_t special_copy_bits(int type, int nranks, int rank, uint64_t seed, uint64_t i) {
  switch (i / 4 % 3) {
    case 0: return width_mask(TYPES[type].size);
    case 1: return 0;
    default: return input_bits(type, OP_NONE, nranks, rank, seed, i);
  }
}

// Whether the matrix can check `op` on `type` over `nranks` exactly.
static inline int op_checkable(int type, int op, int nranks) {
  // A float average divides by nranks: exact only for a power of two.
  if (op == OP_AVG && TYPES[type].is_float) return (nranks & (nranks - 1)) == 0;
  return 1;
}

static inline uint64_t load_bits(const void* p, int size) {
  uint64_t v = 0;
  memcpy(&v, p, size);  // little-endian
  return v;
}

static inline void store_bits(void* p, int size, uint64_t v) { memcpy(p, &v, size); }

#endif
