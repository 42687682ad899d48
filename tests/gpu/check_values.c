// A CPU check of values.h, the ground the GPU matrix stands on: the encodings are right, and for
// the inputs it picks every reduction order gives the same bits (each partial result exact).
//   gcc -O2 -std=gnu11 tests/gpu/check_values.c -lm -o /tmp/check_values && /tmp/check_values
#include <stdio.h>

#include "matrix.h"

static int failures;

#define EXPECT(cond, ...)        \
  do {                           \
    if (!(cond)) {               \
      failures++;                \
      printf("FAIL: " __VA_ARGS__); \
      printf("\n");              \
    }                            \
  } while (0)

static void known_encodings(void) {
  EXPECT(encode_float(T_HALF, 1.0) == 0x3C00, "half 1.0");
  EXPECT(encode_float(T_HALF, -2.0) == 0xC000, "half -2.0");
  EXPECT(encode_float(T_BF16, 1.0) == 0x3F80, "bf16 1.0");
  EXPECT(encode_float(T_BF16, 0.5) == 0x3F00, "bf16 0.5");
  EXPECT(encode_float(T_FP8E4M3, 1.0) == 0x38, "e4m3 1.0");
  EXPECT(encode_float(T_FP8E4M3, 448.0) == 0x7E, "e4m3 448");
  EXPECT(encode_float(T_FP8E4M3, -0.25) == 0xA8, "e4m3 -0.25");
  EXPECT(encode_float(T_FP8E5M2, 1.0) == 0x3C, "e5m2 1.0");
  EXPECT(encode_float(T_FP8E5M2, 57344.0) == 0x7B, "e5m2 57344");
  EXPECT(encode_float(T_FLOAT, 1.0) == 0x3F800000, "float 1.0");
  for (int t = T_HALF; t < T_COUNT; t++) {
    if (t == T_FLOAT || t == T_DOUBLE) continue;
    for (uint64_t b = 0; b < (1ull << (8 * TYPES[t].size)); b++) {
      double v = decode_float(t, b);
      int e = (int)((b >> TYPES[t].mant_bits) & ((1u << TYPES[t].exp_bits) - 1));
      int special = e == (1 << TYPES[t].exp_bits) - 1;  // inf/NaN (e4m3: top binade too)
      if (special || v == 0) continue;
      EXPECT(encode_float(t, v) == b, "%s round trip of 0x%llx", TYPES[t].name,
             (unsigned long long)b);
    }
  }
}

// One step of op in the type: exact for floats (else a failure), wrapping for integers.
static uint64_t step(int type, int op, int nranks, uint64_t acc, uint64_t x, int first) {
  const TypeInfo* t = &TYPES[type];
  int premul = op == OP_PREMUL_HOST || op == OP_PREMUL_DEVICE;
  if (t->is_float) {
    double a = decode_float(type, acc), v = decode_float(type, x), r;
    if (premul) v *= PREMUL_SCALAR;
    if (op == OP_AVG) v /= nranks;  // as NCCL does for floats: pre-multiply by 1/n, then sum
    if (first) {
      r = v;
    } else {
      switch (op) {
        case OP_PROD: r = a * v; break;
        case OP_MAX: r = v > a ? v : a; break;
        case OP_MIN: r = v < a ? v : a; break;
        default: r = a + v;
      }
    }
    uint64_t bits = encode_float(type, r);
    EXPECT(decode_float(type, bits) == r, "%s %s: partial %g not exact", t->name, OP_NAMES[op],
           r);
    return bits;
  }
  uint64_t a = extend_int(type, acc), v = extend_int(type, x);
  if (premul) v *= (uint64_t)PREMUL_SCALAR;
  if (first) return v & width_mask(t->size);
  int gt = t->is_signed ? (int64_t)v > (int64_t)a : v > a;
  switch (op) {
    case OP_PROD: return (a * v) & width_mask(t->size);
    case OP_MAX: return (gt ? v : a) & width_mask(t->size);
    case OP_MIN: return (!gt && v != a ? v : a) & width_mask(t->size);
    default: return (a + v) & width_mask(t->size);
  }
}

static void orders_agree(void) {
  for (int type = 0; type < T_COUNT; type++) {
    for (int op = 0; op < OP_NONE; op++) {
      for (int nranks = 2; nranks <= 8; nranks *= 2) {
        for (uint64_t i = 0; i < 3000; i++) {
          uint64_t in[8], fwd = 0, rev = 0;
          for (int r = 0; r < nranks; r++) in[r] = input_bits(type, op, nranks, r, 42, i);
          for (int r = 0; r < nranks; r++) fwd = step(type, op, nranks, fwd, in[r], r == 0);
          for (int r = nranks - 1; r >= 0; r--)
            rev = step(type, op, nranks, rev, in[r], r == nranks - 1);
          if (op == OP_AVG && !TYPES[type].is_float) {
            int64_t s = (int64_t)extend_int(type, fwd);  // integers: sum, then divide
            fwd = rev = (uint64_t)(TYPES[type].is_signed ? s / nranks
                                                         : (int64_t)((uint64_t)s / nranks)) &
                        width_mask(TYPES[type].size);
          }
          uint64_t want = reduce_bits(type, op, nranks, in);
          EXPECT(fwd == want && rev == want, "%s %s n=%d i=%llu: fwd 0x%llx rev 0x%llx want 0x%llx",
                 TYPES[type].name, OP_NAMES[op], nranks, (unsigned long long)i,
                 (unsigned long long)fwd, (unsigned long long)rev, (unsigned long long)want);
          if (failures > 20) return;
        }
      }
    }
  }
}

// Inputs are not all alike: a constant input would hide a collective that mixes ranks up.
static void inputs_vary(void) {
  for (int type = 0; type < T_COUNT; type++)
    for (int op = 0; op <= OP_NONE; op++) {
      uint64_t first = input_bits(type, op, 4, 0, 7, 0);
      int differ = 0;
      for (uint64_t i = 1; i < 64 && !differ; i++) differ = input_bits(type, op, 4, 1, 7, i) != first;
      EXPECT(differ, "%s %s: inputs all alike", TYPES[type].name, OP_NAMES[op]);
    }
}

// The special values' ground: -0.0 keeps its sign in every float type, the all-ones pattern is a
// NaN in each (what the sentinel kernel reserves), and NaN is told from the largest finite
// values and infinity.
static void special_values(void) {
  for (int t = T_HALF; t < T_COUNT; t++) {
    if (!TYPES[t].is_float) continue;
    uint64_t sign = 1ull << (8 * TYPES[t].size - 1);
    EXPECT(encode_float(t, -0.0) == sign, "%s -0.0", TYPES[t].name);
    EXPECT(is_nan_bits(t, width_mask(TYPES[t].size)), "%s all ones is NaN", TYPES[t].name);
    EXPECT(!is_nan_bits(t, encode_float(t, 1.0)), "%s 1.0 is no NaN", TYPES[t].name);
    EXPECT(!is_nan_bits(t, encode_float(t, -0.0)), "%s -0.0 is no NaN", TYPES[t].name);
    for (uint64_t i = 0; i < 12; i++) {  // runs of 4: the pattern on rank 0, -0.0, sums
      uint64_t r0 = special_input_bits(t, 4, 0, 7, i), r3 = special_input_bits(t, 4, 3, 7, i);
      uint64_t want0 = i < 4 ? width_mask(TYPES[t].size) : i < 8 ? sign : r0;
      uint64_t want3 = i < 4 ? encode_float(t, 1.0) : i < 8 ? sign : r3;
      EXPECT(r0 == want0 && r3 == want3, "%s: special input %llu", TYPES[t].name,
             (unsigned long long)i);
    }
    int differ = 0;
    for (uint64_t i = 8; i < 512; i += 12) differ += special_input_bits(t, 4, 0, 7, i) !=
                                                    special_input_bits(t, 4, 3, 7, i);
    EXPECT(differ > 0, "%s: the sums' inputs differ by rank", TYPES[t].name);
  }
  EXPECT(!is_nan_bits(T_FP8E4M3, 0x7E), "e4m3 448 is finite");
  EXPECT(is_nan_bits(T_FP8E4M3, 0x7F), "e4m3 NaN");
  EXPECT(!is_nan_bits(T_HALF, 0x7C00) && is_nan_bits(T_HALF, 0x7C01), "half inf and NaN");
  EXPECT(!is_nan_bits(T_FLOAT, 0x7F800000) && is_nan_bits(T_FLOAT, 0x7FFFFFFF), "float");
}

// Copies' special inputs hold whole words of all bits set (what the core's sentinel stores flag),
// and the matrix copies them in chunks the sentinel stores take on 2 ranks (past 1 MiB, at most
// 2 MiB) for every copying collective.
static void special_copies(void) {
  for (uint64_t i = 0; i < 12; i++) {
    uint64_t r0 = special_copy_bits(T_UINT32, 2, 0, 7, i);
    uint64_t r1 = special_copy_bits(T_UINT32, 2, 1, 7, i);
    unsigned long long at = i;
    EXPECT(i >= 4 || (r0 == 0xffffffffull && r1 == r0), "special copy %llu: all ones", at);
    EXPECT(i < 4 || i >= 8 || (r0 == 0 && r1 == 0), "special copy %llu: zero", at);
  }
  int differ = 0;
  for (uint64_t i = 8; i < 512; i += 12)
    differ += special_copy_bits(T_UINT32, 2, 0, 7, i) != special_copy_bits(T_UINT32, 2, 1, 7, i);
  EXPECT(differ > 0, "special copies: the arbitrary runs differ by rank");
  TestList list = build_matrix(MATRIX_QUICK, 2, 0, 0);
  int covered[C_COUNT] = {0};
  for (size_t k = 0; k < list.n; k++) {
    const Test* t = &list.tests[k];
    size_t chunk = t->count * (size_t)TYPES[t->type].size;
    if (t->special && !coll_reduces(t->coll) && chunk > (1u << 20) && chunk <= (2u << 20))
      covered[t->coll]++;
  }
  for (int c = C_BROADCAST; c < C_SENDRECV_RING; c++)
    EXPECT(covered[c] > 0, "%s: no special copy of a chunk past 1 MiB", COLL_NAMES[c]);
  free(list.tests);
}

// All-to-all in place only where asked for (NCCL's is undefined), then every rank in place and
// only the first: that rank's input is where its output is, the others' apart.
static void alltoall_in_place(void) {
  for (int asked = 0; asked < 2; asked++) {
    TestList list = build_matrix(MATRIX_QUICK, 4, 1 << 20, asked);
    int every = 0, first = 0;
    for (size_t k = 0; k < list.n; k++) {
      const Test* t = &list.tests[k];
      if (t->coll != C_ALLTOALL || !t->inplace) continue;
      every += t->inplace == 1;
      first += t->inplace == INPLACE_FIRST_RANK;
      if (t->inplace != INPLACE_FIRST_RANK) continue;
      Layout l0 = test_layout(t, 0, 4);
      EXPECT(test_in_place(t, 0) && l0.send_at == l0.recv_at, "all-to-all: rank 0 in place");
      EXPECT(!test_in_place(t, 1) && !test_in_place(t, 3), "all-to-all: the other ranks apart");
    }
    EXPECT(asked ? every > 0 && first > 0 : every + first == 0,
           "all-to-all in place %s: %d tests of every rank, %d of the first", asked ? "asked" : "not asked",
           every, first);
    free(list.tests);
  }
}

int main(void) {
  known_encodings();
  special_values();
  special_copies();
  orders_agree();
  inputs_vary();
  alltoall_in_place();
  TestList full = build_matrix(MATRIX_FULL, 4, 256u << 20, 0);
  TestList quick = build_matrix(MATRIX_QUICK, 4, 0, 0);
  printf("matrix: %zu tests (full), %zu (quick); buffers %zu bytes\n", full.n, quick.n,
         matrix_alloc_bytes(&full, 4));
  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures != 0;
}
