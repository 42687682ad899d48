// ---- moves: all-gather, broadcast, all-to-all, gather and scatter -------------------------------
//
// One shape for the five collectives that move bytes, their pairs as `route` says. Direct (every
// output written to is reachable, and the chunks' places in it 16-aligned: `Views`; the ranks
// tell each other their buffers and all see whether every rank's are usable), every sender pushes
// each chunk it carries straight into its place in its receiver's output, and they meet once at
// the end, so that no rank goes on (and reuses its buffers) while a peer still writes them.
// Staged, a sender pushes each chunk into a slot of its receiver's staging (its own slot, or the
// one slot where only the root sends; its own chunk straight into its place where that is
// 16-aligned, else through its own staging too), they meet, and every receiver copies its slots
// out. Chunks go in windows (`pipelined_window`, at most a slot: `staged_window`), each window's
// copy-out beside the next one's push.
//
// Pack j of every chunk is handled by the same thread in every phase on every rank (push_packs
// and copy_out partition alike), so per-block barriers are enough, and a thread reads its packs
// of the input before it writes those of the output (window w's are pushed before window w is
// copied out): in place is safe where only the thread's own rank writes its output, and a chunk
// already in its place is not copied. All-to-all in place is not (a peer's direct pushes would
// overwrite chunks not yet sent): direct, where every rank is in place, each pair of ranks swaps
// the chunks they send each other (`swap_chunks`, up to SWAP_MAX_BYTES a chunk); where some are
// and some are not, or the chunks are larger, the staged path runs.

// Whether this rank's own chunk, if it carries one to itself, is in its place already.
template <int KIND, typename T>
__device__ __forceinline__ bool in_place(int rank, const T* in, const T* out, u64 count, int root) {
  Route own = route<KIND>(rank, rank, root);
  return in + own.from * count == out + own.to * count;
}

// Whether this rank's own chunk, if it carries one to itself and it is not in its place, goes
// straight into its place on the staged path: where that place is 16-aligned, as pushes need.
template <int KIND, typename T>
__device__ __forceinline__ bool own_straight(int rank, const T* in, const T* out, u64 count, int root) {
  Route own = route<KIND>(rank, rank, root);
  return own.carries && !in_place<KIND>(rank, in, out, count, root) && aligned16(out + own.to * count);
}

// Pushes elements [lo, hi) of the `size` from `begin` of every chunk (of `count` elements) this
// rank carries, all in one pass: receiver d's goes to `to(d, r)` (r: the pair's route), which
// takes element `begin` at its start. A chunk every receiver gets alike is read once for all of
// them.
template <int KIND, typename T, typename To>
__device__ __forceinline__ void push_chunks(int rank, int nranks, const T* in, const T* out, u64 count, int root,
                                            u64 begin, u64 size, u64 lo, u64 hi, To to) {
  const T* src[MAX_RANKS];
  char* dst[MAX_RANKS];
  int ndst = 0;
  // Starting with the next rank: the ranks' first stores go to different GPUs.
  for (int i = 1; i <= nranks; i++) {
    int d = (rank + i) % nranks;
    Route r = route<KIND>(rank, d, root);
    if (!r.carries || (d == rank && in_place<KIND>(rank, in, out, count, root))) continue;
    src[ndst] = in + r.from * count + begin;
    dst[ndst++] = to(d, r) + lo * sizeof(T);
  }
  if (ndst > 0) push_packs<same_chunk_to_all<KIND>()>(src, size, lo, hi, dst, ndst);
}

// The staged path, window by window, each window's copy-out beside the next one's push
// (for_each_window_pipelined). Returns the last epoch used.
template <int KIND, typename T>
__device__ __forceinline__ u32 move_staged(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                                           const Staging& staging, const volatile int* abort, int root, u32 epoch) {
  const u64 largest = staged_window(staging, root_sends<KIND>() ? 1 : nranks) / sizeof(T);
  const u64 my_slot = root_sends<KIND>() ? 0 : rank;
  const bool straight = own_straight<KIND>(rank, in, out, count, root);
  // This rank's own chunk needs no copy-out: pushed straight into its place, or already there.
  const bool own_placed = straight || in_place<KIND>(rank, in, out, count, root);
  const auto push = [&](const Window& w, u64 lo, u64 hi) {
    const u64 area = area_offset(staging, w.epoch), slot = chunk_slot(w.size, sizeof(T));
    push_chunks<KIND>(rank, nranks, in, out, count, root, w.begin, w.size, lo, hi, [&](int d, Route r) {
      if (d == rank && straight) return (char*)(out + r.to * count + w.begin);
      return peers.staging[d] + area + my_slot * slot;
    });
  };
  const auto drain = [&](const Window& w, u64 lo, u64 hi) {
    const u64 area = area_offset(staging, w.epoch), slot = chunk_slot(w.size, sizeof(T));
    for (int i = 1; i <= nranks; i++) {
      int s = (rank + i) % nranks;
      Route r = route<KIND>(s, rank, root);
      if (!r.carries || (s == rank && own_placed)) continue;
      const u64 their_slot = root_sends<KIND>() ? 0 : s;
      const T* from = (const T*)(peers.staging[rank] + area + their_slot * slot) + lo;
      copy_out(out + r.to * count + w.begin, from, w.size, lo, hi);
    }
  };
  return for_each_window_pipelined<T>(peers, rank, nranks, count, pipelined_window<T>(count, largest), epoch, abort,
                                      push, drain);
}

// All-to-all with every rank in place: what this rank sends rank d (chunk d of its buffer) goes
// where d keeps what it sends this rank (chunk `rank` of d's buffer, `outs[d]` as this rank maps
// it). The pair swaps the two, the lower rank the first half of their packs and the higher the
// rest and the tail, so that each element is one thread's, which reads both before it writes.
template <typename T>
__device__ void swap_chunks(int rank, int nranks, T* out, u64 count, const u64* outs) {
  const u64 packs = count / PackOf<T>::N, half = packs / 2;
  for (int i = 1; i < nranks; i++) {
    const int d = (rank + i) % nranks;
    const bool lower = rank < d;
    swap_packs(out + d * count, (T*)outs[d] + rank * count, count, lower ? 0 : half, lower ? half : packs, !lower);
  }
}

// The largest chunk swapped in place: the swap reads over NVLink as much as it writes, and
// NVLink carries reads slower than writes. On 2 H200, all-to-all in place of 4 / 16 / 64 /
// 256 MiB a rank (chunks of half that) took 16.0 / 33.4 / 107 / 401 us swapped and 15.8 / 35.5 /
// 109 / 385 us staged.
#define SWAP_MAX_BYTES (32ull << 20)

// Whether an all-to-all goes direct where every rank's buffers are usable: where no rank is in
// place (its input is not its output, as it published them), or every rank is and the chunks
// are at most SWAP_MAX_BYTES. One of each in a pair would race (the in-place rank's chunk to
// send is where its peer writes): such a mix takes the staged path.
__device__ __forceinline__ bool all_to_all_direct(const Start& start, int nranks, u64 chunk_bytes) {
  int in_place = 0;
  for (int p = 0; p < nranks; p++) in_place += start.ins[p] == start.outs[p];
  return in_place == 0 || (in_place == nranks && chunk_bytes <= SWAP_MAX_BYTES);
}

template <int KIND, typename T>
__device__ void move(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count, const Staging& staging,
                     const volatile int* abort, const Views& views, int root) {
  direct_where_or_staged(
      peers, staging, rank, nranks, views, abort,
      [&](const Start& start) {
        return KIND != MOVE_ALL_TO_ALL || all_to_all_direct(start, nranks, count * sizeof(T));
      },
      [&](const Start& start) {
        if (KIND == MOVE_ALL_TO_ALL && (const void*)in == (const void*)out) {
          swap_chunks(rank, nranks, out, count, start.outs);
          return;
        }
        push_chunks<KIND>(rank, nranks, in, out, count, root, 0, count, 0, count,
                          [&](int d, Route r) { return (char*)start.outs[d] + r.to * count * sizeof(T); });
      },
      [&](u32 epoch) { return move_staged<KIND, T>(peers, rank, nranks, in, out, count, staging, abort, root, epoch); });
}

// A collective's kernel (the host's algorithm) of this shape, for each one entry.cu lists.
#define MOVE(NAME, KIND)                                                                                  \
  template <typename T, int OP>                                                                           \
  __device__ void NAME(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,          \
                       const Staging& staging, const volatile int* abort, const Views& views, int root) { \
    move<KIND, T>(peers, rank, nranks, in, out, count, staging, abort, views, root);                      \
  }
