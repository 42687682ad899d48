// ---- reductions: reduce-scatter and reduce ------------------------------------------------------
//
// Both meet once at the end, so that no rank goes on (and reuses its buffers) while a peer still
// reads its input; direct where every input read is reachable and (reduce-scatter) its chunks'
// places 16-aligned (the ranks tell each other their buffers and all see whether every rank's are
// usable, `Views`), staged otherwise. Element i is handled by the same thread in every phase on
// every rank, so per-block barriers are enough, as in two-shot.

// The staged path of both, window by window (staged_window), each with an epoch of its own from
// `epoch` on and all blocks meeting between windows, as two-shot's windows do: reduce-scatter's
// (root < 0) pushes each rank's chunk of this rank's input into that rank's staging; reduce's
// pushes the input into the root's. Returns the last epoch used.
template <typename T, int OP>
__device__ __forceinline__ u32 reduce_staged(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                                             const Staging& staging, const volatile int* abort, int root, u32 epoch) {
  const u64 window = staged_window(staging, nranks) / sizeof(T);
  const char* src[MAX_RANKS];
  u32 w = 0;
  for (u64 begin = 0; w == 0 || begin < count; begin += window, w++) {
    if (w > 0) grid_barrier(peers, rank, w - 1, abort);
    const u64 end = count - begin < window ? count : begin + window;
    const u64 area = area_offset(staging, epoch + w), slot = chunk_slot(end - begin, sizeof(T));
    if (root < 0) {
      for (int i = 1; i <= nranks; i++) {
        int p = (rank + i) % nranks;
        char* dst = peers.staging[p] + area + rank * slot;
        push_range(in + p * count, count, begin, end, &dst, 1);
      }
    } else {
      char* dst = peers.staging[root] + area + rank * slot;
      push_range(in, count, begin, end, &dst, 1);
    }
    barrier(peers, rank, nranks, BARRIER_START, epoch + w, abort);
    if (root < 0 || rank == root) {
      for (int r = 0; r < nranks; r++) src[r] = peers.staging[rank] + area + r * slot;
      reduce_range<T, OP>(src, nranks, count, begin, end, out, (char* const*)0, 0);
    }
  }
  return epoch + w - 1;
}

// Reduce-scatter: every rank's chunk of `count` elements, reduced in rank order from every
// rank's input into its output. Direct, each rank reads its chunk of every rank's input; staged,
// every rank pushes each rank's chunk of its input into a slot of that rank's staging, they meet,
// and every rank reduces its slots.
template <typename T, int OP>
__device__ void reduce_scatter(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                               const Staging& staging, const volatile int* abort, const Views& views, int) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  u32 last = start.epoch;
  if (start.direct) {
    const char* src[MAX_RANKS];
    char* no_copies[1] = {0};
    for (int p = 0; p < nranks; p++) src[p] = (const char*)start.ins[p] + rank * count * sizeof(T);
    reduce_range<T, OP>(src, nranks, count, 0, count, out, no_copies, 0);
    barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
  } else {
    last = reduce_staged<T, OP>(peers, rank, nranks, in, out, count, staging, abort, -1, start.epoch);
  }
  end_call(peers, rank, last);
}

// Reduce: every rank's input reduced, in rank order, into the root's output. Direct, each rank
// reduces its share of the elements (chunk_bounds) straight from every rank's input into the
// root's output, as the direct all-reduce does into every output; staged, every rank pushes its
// input into a slot of the root's staging and, after they meet, the root reduces the slots. Only
// the root's output is written (the others' may be anything, as with NCCL).
template <typename T, int OP>
__device__ void reduce(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count, const Staging& staging,
                       const volatile int* abort, const Views& views, int root) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  u32 last = start.epoch;
  if (start.direct) {
    const char* src[MAX_RANKS];
    u64 begin, end;
    chunk_bounds<T>(rank, nranks, count, &begin, &end);
    for (int r = 0; r < nranks; r++) src[r] = (const char*)start.ins[r] + begin * sizeof(T);
    reduce_range<T, OP>(src, nranks, count, begin, end, (T*)start.outs[root], (char* const*)0, 0);
    barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
  } else {
    last = reduce_staged<T, OP>(peers, rank, nranks, in, out, count, staging, abort, root, start.epoch);
  }
  end_call(peers, rank, last);
}
