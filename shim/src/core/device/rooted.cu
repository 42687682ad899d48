// ---- rooted: broadcast and reduce ---------------------------------------------------------------
//
// Both meet once at the end, so that no rank goes on (and reuses its buffers) while a peer still
// reads or writes them; direct where every buffer a peer touches is reachable and 16-aligned (the
// ranks tell each other their buffers and all see whether every rank's are usable, `Views`),
// staged otherwise. Element i is handled by the same thread in every phase on every rank, so
// per-block barriers are enough, as in two-shot.

// Broadcast: `count` elements of the root's input into every rank's output. Direct, the root
// pushes its input straight into every output; staged, into every rank's staging (its own
// included), and every rank copies it out after they meet. Only the root's input is read (the
// others' may be anything, as with NCCL).
template <typename T, int OP>
__device__ void broadcast(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                          const volatile int* abort, const Views& views, int root) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  u64 area = area_offset(half_bytes, start.epoch);
  bool in_place = (const void*)in == (const void*)out;
  if (rank == root) {
    char* dst[MAX_RANKS];
    int ndst = 0;
    // Starting with the next rank: the root's first stores go to a peer.
    for (int i = 1; i <= nranks; i++) {
      int p = (rank + i) % nranks;
      if (p == rank && in_place) continue;
      dst[ndst++] = start.direct ? (char*)start.outs[p] : peers.staging[p] + area;
    }
    push_range(in, count, 0, count, dst, ndst);
  }
  barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
  if (!start.direct && !(rank == root && in_place))
    copy_out(out, (const T*)(peers.staging[rank] + area), count, 0, count);
  end_call(peers, rank, start.epoch);
}

// Reduce: every rank's input reduced, in rank order, into the root's output. Direct, each rank
// reduces its share of the elements (chunk_bounds) straight from every rank's input into the
// root's output, as the direct all-reduce does into every output; staged, every rank pushes its
// input into a slot of the root's staging and, after they meet, the root reduces the slots. Only
// the root's output is written (the others' may be anything, as with NCCL).
template <typename T, int OP>
__device__ void reduce(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                       const volatile int* abort, const Views& views, int root) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  const char* src[MAX_RANKS];
  if (start.direct) {
    u64 begin, end;
    chunk_bounds<T>(rank, nranks, count, &begin, &end);
    for (int r = 0; r < nranks; r++) src[r] = (const char*)start.ins[r] + begin * sizeof(T);
    reduce_range<T, OP>(src, nranks, count, begin, end, (T*)start.outs[root], (char* const*)0, 0);
    barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
  } else {
    u64 area = area_offset(half_bytes, start.epoch), slot = chunk_slot(count, sizeof(T));
    char* dst = peers.staging[root] + area + rank * slot;
    push_range(in, count, 0, count, &dst, 1);
    barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
    if (rank == root) {
      for (int r = 0; r < nranks; r++) src[r] = peers.staging[rank] + area + r * slot;
      reduce_range<T, OP>(src, nranks, count, 0, count, out, (char* const*)0, 0);
    }
  }
  end_call(peers, rank, start.epoch);
}
