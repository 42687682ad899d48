// ---- all-gather and reduce-scatter ------------------------------------------------------------
//
// Every rank's chunk is `count` elements: all-gather's input, reduce-scatter's output. Where every
// rank's buffers can be reached (`Views`, as for the direct all-reduce: the ranks tell each
// other their buffers and all see whether every rank's are usable), all-gather pushes each
// rank's input straight into its place in every rank's output, and reduce-scatter has each rank
// read its chunk of every rank's input and reduce it, in rank order, into its output; they meet
// once at the end, so that no rank goes on (and reuses its buffers) while a peer still reads or
// writes them. Otherwise, as one-shot: every rank pushes into a slot of its own in the peers'
// staging (all-gather: its input to every rank; reduce-scatter: each rank's chunk of its input to
// that rank), they meet, and every rank copies out (all-gather) or reduces its slots in rank
// order (reduce-scatter). The host plans them only where nranks slots of a chunk, each rounded
// up to 16 bytes, fit in an area. Direct needs the chunk's places 16-aligned: the host says in
// `usable` whether the buffers and the chunk size allow it. Element i of a chunk is handled by
// the same thread in every phase on every rank (push_range, copy_out and reduce_range partition
// alike), so per-block barriers are enough, as in two-shot.

template <typename T, int OP>
__device__ void all_gather(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                           const volatile int* abort, const Views& views, int) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  char* dst[MAX_RANKS];
  if (start.direct) {
    // Starting with the next rank: the ranks' first stores go to different GPUs.
    for (int i = 0; i < nranks; i++) dst[i] = (char*)start.outs[(rank + 1 + i) % nranks] + rank * count * sizeof(T);
    push_range(in, count, 0, count, dst, nranks);
    barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
  } else {
    u64 area = area_offset(half_bytes, start.epoch), slot = chunk_slot(count, sizeof(T));
    for (int i = 0; i < nranks; i++) dst[i] = peers.staging[(rank + 1 + i) % nranks] + area + rank * slot;
    push_range(in, count, 0, count, dst, nranks);
    barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
    for (int p = 0; p < nranks; p++)
      copy_out(out + p * count, (const T*)(peers.staging[rank] + area + p * slot), count, 0, count);
  }
  end_call(peers, rank, start.epoch);
}

template <typename T, int OP>
__device__ void reduce_scatter(Peers peers, int rank, int nranks, const T* in, T* out, u64 count,
                               u64 half_bytes, const volatile int* abort, const Views& views, int) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  const char* src[MAX_RANKS];
  char* no_copies[1] = {0};
  if (start.direct) {
    for (int p = 0; p < nranks; p++) src[p] = (const char*)start.ins[p] + rank * count * sizeof(T);
    reduce_range<T, OP>(src, nranks, count, 0, count, out, no_copies, 0);
    barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
  } else {
    u64 area = area_offset(half_bytes, start.epoch), slot = chunk_slot(count, sizeof(T));
    for (int i = 1; i <= nranks; i++) {
      int p = (rank + i) % nranks;
      char* dst = peers.staging[p] + area + rank * slot;
      push_range(in + p * count, count, 0, count, &dst, 1);
    }
    barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
    for (int r = 0; r < nranks; r++) src[r] = peers.staging[rank] + area + r * slot;
    reduce_range<T, OP>(src, nranks, count, 0, count, out, no_copies, 0);
  }
  end_call(peers, rank, start.epoch);
}

