// ---- moves: all-gather, broadcast, all-to-all, gather and scatter -------------------------------
//
// One shape for the five collectives that move bytes, their pairs as `route` says. Direct (every
// output written to is reachable, and the chunks' places in it 16-aligned: `Views`; the ranks
// tell each other their buffers and all see whether every rank's are usable), every sender pushes
// each chunk it carries straight into its place in its receiver's output, and they meet once at
// the end, so that no rank goes on (and reuses its buffers) while a peer still writes them.
// Staged, a sender pushes each chunk into a slot of its receiver's staging (its own slot, or the
// one slot where only the root sends; its own chunk too, since its output may not be
// 16-aligned), they meet, and every receiver copies its slots out. The host plans the staged
// path only where the slots fit in an area.
//
// Pack j of every chunk is handled by the same thread in every phase on every rank (push_range
// and copy_out partition alike), so per-block barriers are enough, and a thread reads its packs
// of the input before it writes those of the output: in place is safe where only the thread's
// own rank writes its output, and a chunk already in its place is not copied. All-to-all in place
// is not (a peer's direct pushes would overwrite chunks not yet sent): the host marks its buffers
// not usable, and the staged path runs.

// Whether this rank's own chunk, if it carries one to itself, is in its place already.
template <int KIND, typename T>
__device__ __forceinline__ bool in_place(int rank, const T* in, const T* out, u64 count, int root) {
  Route own = route<KIND>(rank, rank, root);
  return in + own.from * count == out + own.to * count;
}

template <int KIND, typename T>
__device__ void move(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count, const Staging& staging,
                     const volatile int* abort, const Views& views, int root) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  const u64 area = area_offset(staging, start.epoch), slot = chunk_slot(count, sizeof(T));
  const u64 my_slot = root_sends<KIND>() ? 0 : rank;
  char* dst[MAX_RANKS];
  int ndst = 0;
  // Starting with the next rank: the ranks' first stores go to different GPUs.
  for (int i = 1; i <= nranks; i++) {
    int d = (rank + i) % nranks;
    Route r = route<KIND>(rank, d, root);
    if (!r.carries || (d == rank && in_place<KIND>(rank, in, out, count, root))) continue;
    char* to = start.direct ? (char*)start.outs[d] + r.to * count * sizeof(T)
                            : peers.staging[d] + area + my_slot * slot;
    if (same_chunk_to_all<KIND>()) {
      dst[ndst++] = to;
    } else {
      push_range(in + r.from * count, count, 0, count, &to, 1);
    }
  }
  if (ndst > 0) push_range(in, count, 0, count, dst, ndst);
  barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
  if (!start.direct) {
    for (int i = 1; i <= nranks; i++) {
      int s = (rank + i) % nranks;
      Route r = route<KIND>(s, rank, root);
      if (!r.carries || (s == rank && in_place<KIND>(rank, in, out, count, root))) continue;
      const u64 their_slot = root_sends<KIND>() ? 0 : s;
      copy_out(out + r.to * count, (const T*)(peers.staging[rank] + area + their_slot * slot), count, 0, count);
    }
  }
  end_call(peers, rank, start.epoch);
}

// A collective's kernel (the host's algorithm) of this shape, for each one entry.cu lists.
#define MOVE(NAME, KIND)                                                                                  \
  template <typename T, int OP>                                                                           \
  __device__ void NAME(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,          \
                       const Staging& staging, const volatile int* abort, const Views& views, int root) { \
    move<KIND, T>(peers, rank, nranks, in, out, count, staging, abort, views, root);                      \
  }
