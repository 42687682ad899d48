// The correctness matrix: which tests run, where each rank's buffers lie, and what each output
// element must be. Pure C over values.h, so that it can be checked without a GPU.
#ifndef NCCLSHIM_GPU_MATRIX_H
#define NCCLSHIM_GPU_MATRIX_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "values.h"

// Bytes after a test's region that must keep the poison they were given.
#define GUARD_BYTES 64

enum { C_ALLREDUCE, C_REDUCE, C_REDUCESCATTER, C_BROADCAST, C_BCAST, C_ALLGATHER, C_ALLTOALL,
       C_GATHER, C_SCATTER, C_SENDRECV_RING, C_SENDRECV_ALL, C_COUNT };

static const char* const COLL_NAMES[C_COUNT] = {
    "AllReduce", "Reduce",   "ReduceScatter", "Broadcast",    "Bcast",        "AllGather",
    "AlltoAll",  "Gather",   "Scatter",       "SendRecvRing", "SendRecvAll"};

static inline int coll_reduces(int coll) {
  return coll == C_ALLREDUCE || coll == C_REDUCE || coll == C_REDUCESCATTER;
}

// Whether the collective has an in-place form (Bcast has only that one). NCCL's all-to-all in
// place is none: its results are undefined (NCCL 2.28.9's are wrong; nccl-tests leaves them
// unchecked). The core's are right, tested where it takes every all-to-all (`alltoall_in_place`).
static inline int coll_inplace_ok(int coll, int alltoall_in_place) {
  return coll != C_SENDRECV_RING && coll != C_SENDRECV_ALL && (coll != C_ALLTOALL || alltoall_in_place);
}

typedef struct {
  int coll, type, op;
  size_t count;     // NCCL's count argument (per rank for the gathering and scattering ones)
  int inplace;      // 1: every rank in place; INPLACE_FIRST_RANK: only rank 0
  int misaligned;   // buffers start 1 and 3 elements past an allocation's start
  uint64_t seed;
  int special;      // AllReduce sums of floats: NaN and -0.0 among the inputs; copies: words of
                    // all bits set among them (values.h)
} Test;

// Test::inplace: the first rank in place, the others apart (a call's ranks need not agree).
#define INPLACE_FIRST_RANK 2

// Whether rank `rank`'s buffers of the test are in place.
static inline int test_in_place(const Test* t, int rank) {
  return t->inplace == 1 || (t->inplace == INPLACE_FIRST_RANK && rank == 0);
}

// The root of the rooted collectives: not rank 0, so that a root argument ignored shows.
static inline int test_root(int nranks) { return nranks - 1; }

// Where one rank's buffers lie, in elements. Out of place the input is in the send allocation
// at `send_at` and the output in the recv allocation at `recv_at`; in place both are in the recv
// allocation. `span` elements from `base` in the recv allocation are the region the test uses;
// everything outside it must stay untouched.
typedef struct {
  size_t base, span;
  size_t send_at, send_n;  // input: `send_n` elements
  size_t recv_at, recv_n;  // output: `recv_n` elements
  int check_output;        // 0 where NCCL leaves the output undefined (non-root Reduce, Gather)
} Layout;

static inline Layout test_layout(const Test* t, int rank, int nranks) {
  size_t c = t->count, n = (size_t)nranks, root = (size_t)test_root(nranks);
  size_t in_n = c, out_n = c, in_block = 0, out_block = 0;  // block: offset in units of count
  int inplace_out_is_block = 0;  // in place, is the output the rank's block of the input?
  switch (t->coll) {
    case C_REDUCESCATTER: in_n = n * c; inplace_out_is_block = 1; break;
    case C_ALLGATHER: out_n = n * c; in_block = (size_t)rank; break;
    case C_GATHER: out_n = n * c; in_block = (size_t)rank; break;
    case C_SCATTER: in_n = n * c; inplace_out_is_block = 1; break;
    case C_ALLTOALL: case C_SENDRECV_ALL: in_n = out_n = n * c; break;
    default: break;
  }
  Layout l;
  l.base = t->misaligned ? 3 : 0;
  l.span = in_n > out_n ? in_n : out_n;
  if (test_in_place(t, rank)) {
    if (inplace_out_is_block) out_block = (size_t)rank;
    l.send_at = l.base + in_block * c;
    l.recv_at = l.base + out_block * c;
  } else {
    l.send_at = t->misaligned ? 1 : 0;
    l.recv_at = l.base;
  }
  l.send_n = in_n;
  l.recv_n = out_n;
  l.check_output = !((t->coll == C_REDUCE || t->coll == C_GATHER) && (size_t)rank != root);
  return l;
}

// Element `i` of rank `rank`'s input.
static inline uint64_t test_input(const Test* t, int nranks, int rank, uint64_t i) {
  if (t->special && !coll_reduces(t->coll)) return special_copy_bits(t->type, nranks, rank, t->seed, i);
  if (t->special) return special_input_bits(t->type, nranks, rank, t->seed, i);
  return input_bits(t->type, t->op, nranks, rank, t->seed, i);
}

// What element `j` of rank `rank`'s output must hold.
static inline uint64_t test_expected(const Test* t, int nranks, int rank, uint64_t j) {
  uint64_t c = t->count, n = (uint64_t)nranks, root = (uint64_t)test_root(nranks);
  uint64_t in[64];  // one input per rank: the matrix runs on at most 64 ranks
  if (t->special && coll_reduces(t->coll)) return special_sum_bits(t->type, nranks, t->seed, j);
  switch (t->coll) {
    case C_ALLREDUCE:
    case C_REDUCE:
    case C_REDUCESCATTER: {
      uint64_t i = t->coll == C_REDUCESCATTER ? (uint64_t)rank * c + j : j;
      for (int r = 0; r < nranks; r++) in[r] = test_input(t, nranks, r, i);
      return reduce_bits(t->type, t->op, nranks, in);
    }
    case C_BROADCAST:
    case C_BCAST: return test_input(t, nranks, (int)root, j);
    case C_ALLGATHER:
    case C_GATHER: return test_input(t, nranks, (int)(j / c), j % c);
    case C_SCATTER: return test_input(t, nranks, (int)root, (uint64_t)rank * c + j);
    case C_ALLTOALL:
    case C_SENDRECV_ALL: return test_input(t, nranks, (int)(j / c), (uint64_t)rank * c + j % c);
    case C_SENDRECV_RING: return test_input(t, nranks, (int)((rank + n - 1) % n), j);
  }
  return 0;
}

// --- The list of tests ---

enum { MATRIX_FULL, MATRIX_QUICK };

typedef struct {
  Test* tests;
  size_t n, cap;
} TestList;

static inline void test_list_push(TestList* l, Test t) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 1024;
    l->tests = (Test*)realloc(l->tests, l->cap * sizeof(Test));
  }
  t.seed = mix64(0x5eed0000ull + l->n);
  l->tests[l->n++] = t;
}

// The per-rank count whose largest buffer is `bytes` long.
static inline size_t count_for_bytes(int coll, int type, int nranks, size_t bytes) {
  size_t elems = bytes / (size_t)TYPES[type].size;
  int per_rank = coll == C_REDUCESCATTER || coll == C_ALLGATHER || coll == C_ALLTOALL ||
                 coll == C_GATHER || coll == C_SCATTER || coll == C_SENDRECV_ALL;
  return per_rank ? elems / (size_t)nranks : elems;
}

// The tests, in one order every rank agrees on. FULL: every collective x type x op, counts
// 0, 1, 7 and 4099 (odd, and not a multiple of 16 bytes), in and out of place, misaligned, one
// medium count of each type, and one test per collective at `max_bytes`. QUICK: fewer types and
// ops, for the ways of driving NCCL that the full matrix doesn't use. `alltoall_in_place`: also
// all-to-all in place, and with only the first rank in place.
static inline TestList build_matrix(int matrix, int nranks, size_t max_bytes, int alltoall_in_place) {
  static const int quick_types[] = {T_INT32, T_FLOAT, T_BF16, T_FP8E4M3};
  static const int quick_ops[] = {OP_SUM, OP_AVG, OP_PREMUL_DEVICE, OP_MAX};
  static const size_t counts[] = {0, 1, 7, 4099};
  TestList list = {0, 0, 0};
  int full = matrix == MATRIX_FULL;
  int ntypes = full ? T_COUNT : 4, nops = full ? OP_NONE : 4;
  for (int coll = 0; coll < C_COUNT; coll++) {
    for (int ti = 0; ti < ntypes; ti++) {
      int type = full ? ti : quick_types[ti];
      for (int oi = 0; oi < (coll_reduces(coll) ? nops : 1); oi++) {
        int op = !coll_reduces(coll) ? OP_NONE : full ? oi : quick_ops[oi];
        if (!op_checkable(type, op, nranks)) continue;
        for (int ci = 0; ci < 4; ci++) {
          if (!full && ci == 2) continue;
          for (int inplace = 0; inplace < (coll == C_ALLTOALL ? 3 : 2); inplace++) {
            if (inplace ? !coll_inplace_ok(coll, alltoall_in_place) : coll == C_BCAST) continue;
            Test t = {coll, type, op, counts[ci], inplace, 0, 0, 0};
            test_list_push(&list, t);
            if (counts[ci] == 4099) {
              t.misaligned = 1;
              test_list_push(&list, t);
            }
          }
        }
      }
      // One medium, odd count per type: past NCCL's small-message protocols.
      Test medium = {coll, type, coll_reduces(coll) ? OP_SUM : OP_NONE,
                     count_for_bytes(coll, type, nranks, 4 << 20) | 1, coll == C_BCAST, 0, 0, 0};
      if (full || type == T_FLOAT) test_list_push(&list, medium);
      // Special values: as small as the sentinel kernel takes (4095: the last, partial pack
      // ends in a run of the all-ones pattern), also misaligned, and past it.
      for (int big = 0; coll == C_ALLREDUCE && TYPES[type].is_float && big < 2; big++) {
        for (int inplace = 0; inplace < 2; inplace++) {
          size_t count = big ? count_for_bytes(coll, type, nranks, 1 << 20) | 1 : 4095;
          Test special = {coll, type, OP_SUM, count, inplace, 0, 0, 1};
          test_list_push(&list, special);
          if (!big) {
            special.misaligned = 1;
            test_list_push(&list, special);
          }
        }
      }
    }
    // Copies of words of all bits set (values.h), 32-bit: chunks of 1.5 MiB and one element
    // (the core's sentinel stores on 2 ranks), and of 4099 elements (where a setting sends
    // every chunk so), in and out of place, also misaligned.
    for (int big = 0; !coll_reduces(coll) && coll < C_SENDRECV_RING && big < 2; big++) {
      for (int inplace = 0; inplace < 2; inplace++) {
        if (inplace ? !coll_inplace_ok(coll, alltoall_in_place) : coll == C_BCAST) continue;
        // 1.5 MiB a chunk: nranks of them in the per-rank collectives' buffers, one in broadcast's.
        size_t bytes = (coll == C_BROADCAST || coll == C_BCAST ? 1 : (size_t)nranks) * (3 << 19);
        size_t count = big ? count_for_bytes(coll, T_UINT32, nranks, bytes) | 1 : 4099;
        Test special = {coll, T_UINT32, OP_NONE, count, inplace, 0, 0, 1};
        test_list_push(&list, special);
        special.misaligned = 1;
        test_list_push(&list, special);
      }
    }
    if (max_bytes > 0) {  // the largest: float sums and copies
      Test big = {coll, T_FLOAT, coll_reduces(coll) ? OP_SUM : OP_NONE,
                  count_for_bytes(coll, T_FLOAT, nranks, max_bytes), coll == C_BCAST, 0, 0, 0};
      test_list_push(&list, big);
      // All-to-all in place on the direct path (which swaps chunks), and a mix that may not.
      for (int inplace = 1; coll == C_ALLTOALL && alltoall_in_place && inplace <= INPLACE_FIRST_RANK; inplace++) {
        big.inplace = inplace;
        test_list_push(&list, big);
      }
    }
  }
  return list;
}

// Bytes each allocation needs for every test of the list (plus room for misalignment).
static inline size_t matrix_alloc_bytes(const TestList* l, int nranks) {
  size_t most = 0;
  for (size_t k = 0; k < l->n; k++) {
    Layout lay = test_layout(&l->tests[k], 0, nranks);
    size_t b = (lay.base + lay.span + 8) * (size_t)TYPES[l->tests[k].type].size;
    if (b > most) most = b;
  }
  return most + GUARD_BYTES;
}

#endif
