// ---- reductions: reduce-scatter and reduce ------------------------------------------------------
//
// Both meet once at the end, so that no rank goes on (and reuses its buffers) while a peer still
// reads its input; direct where every input read is reachable and (reduce-scatter) its chunks'
// places 16-aligned (the ranks tell each other their buffers and all see whether every rank's are
// usable, `Views`), staged otherwise. Element i is handled by the same thread in every phase on
// every rank, so per-block barriers are enough, as in two-shot.

// The staged path of both, window by window, each window's reduction beside the next one's push
// (for_each_window_pipelined): reduce-scatter's (root < 0) pushes each rank's chunk of this
// rank's input into that rank's staging, all in one pass; reduce's pushes the input into the
// root's. A rank's own part of what it reduces (reduce-scatter: its chunk of its input; reduce,
// at the root: its input) is read where it lies, not pushed into its own staging first, where it
// is 16-aligned as the reduction's loads need: on 2 ranks that copy was a third of the root's
// memory traffic. In place, a thread reads its elements of it before it writes them. Returns the
// last epoch used.
template <typename T, int OP>
__device__ __forceinline__ u32 reduce_staged(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                                             const Staging& staging, const volatile int* abort, int root, u32 epoch) {
  const u64 largest = staged_window(staging, nranks) / sizeof(T);
  const T* own = root < 0 ? in + rank * count : in;
  const bool own_read = (root < 0 || rank == root) && aligned16(own);
  const auto push = [&](const Window& w, u64 lo, u64 hi) {
    const u64 area = area_offset(staging, w.epoch), slot = chunk_slot(w.size, sizeof(T));
    const T* from[MAX_RANKS];
    char* dst[MAX_RANKS];
    int ndst = 0;
    for (int i = 0; i < (root < 0 ? nranks : 1); i++) {
      // Reduce-scatter starts with the next rank: the ranks' first stores go to different GPUs.
      int p = root < 0 ? (rank + 1 + i) % nranks : root;
      if (p == rank && own_read) continue;
      from[ndst] = (root < 0 ? in + p * count : in) + w.begin;
      dst[ndst++] = peers.staging[p] + area + rank * slot + lo * sizeof(T);
    }
    if (ndst > 0) push_packs<false>(from, w.size, lo, hi, dst, ndst);
  };
  const auto drain = [&](const Window& w, u64 lo, u64 hi) {
    if (root >= 0 && rank != root) return;
    const u64 area = area_offset(staging, w.epoch), slot = chunk_slot(w.size, sizeof(T));
    const char* src[MAX_RANKS];
    for (int r = 0; r < nranks; r++) {
      src[r] = r == rank && own_read ? (const char*)(own + w.begin) : peers.staging[rank] + area + r * slot;
      src[r] += lo * sizeof(T);
    }
    reduce_range<T, OP>(src, nranks, w.size, lo, hi, out + w.begin, (char* const*)0, 0);
  };
  return for_each_window_pipelined<T>(peers, rank, nranks, count, pipelined_window<T>(count, largest), epoch, abort,
                                      push, drain);
}

// Reduce-scatter: every rank's chunk of `count` elements, reduced in rank order from every
// rank's input into its output. Direct, each rank reads its chunk of every rank's input; staged,
// every rank pushes each rank's chunk of its input into a slot of that rank's staging, they meet,
// and every rank reduces its slots.
template <typename T, int OP>
__device__ void reduce_scatter(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                               const Staging& staging, const volatile int* abort, const Views& views, int) {
  direct_or_staged(
      peers, staging, rank, nranks, views, abort,
      [&](const Start& start) {
        const char* src[MAX_RANKS];
        char* no_copies[1] = {0};
        for (int p = 0; p < nranks; p++) src[p] = (const char*)start.ins[p] + rank * count * sizeof(T);
        reduce_range<T, OP>(src, nranks, count, 0, count, out, no_copies, 0);
      },
      [&](u32 epoch) { return reduce_staged<T, OP>(peers, rank, nranks, in, out, count, staging, abort, -1, epoch); });
}

// Reduce: every rank's input reduced, in rank order, into the root's output. Direct, each rank
// reduces its share of the elements (chunk_bounds) straight from every rank's input into the
// root's output, as the direct all-reduce does into every output; staged, every rank pushes its
// input into a slot of the root's staging and, after they meet, the root reduces the slots. Only
// the root's output is written (the others' may be anything, as with NCCL).
template <typename T, int OP>
__device__ void reduce(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count, const Staging& staging,
                       const volatile int* abort, const Views& views, int root) {
  direct_or_staged(
      peers, staging, rank, nranks, views, abort,
      [&](const Start& start) {
        const char* src[MAX_RANKS];
        u64 begin, end;
        chunk_bounds<T>(rank, nranks, count, &begin, &end);
        for (int r = 0; r < nranks; r++) src[r] = (const char*)start.ins[r] + begin * sizeof(T);
        reduce_range<T, OP>(src, nranks, count, begin, end, (T*)start.outs[root], (char* const*)0, 0);
      },
      [&](u32 epoch) { return reduce_staged<T, OP>(peers, rank, nranks, in, out, count, staging, abort, root, epoch); });
}
