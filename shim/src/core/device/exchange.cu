// ---- exchange: all-to-all, gather and scatter ---------------------------------------------------
//
// Every rank's chunk is `count` elements. All-to-all: chunk p of every rank's input goes to rank
// p's output, in rank order. Gather: every rank's input into the root's output, in rank order.
// Scatter: chunk p of the root's input into rank p's output. Direct (every output written to is
// reachable, and the chunks' places in it 16-aligned: `Views`), every sender pushes each chunk
// straight into its place in its receiver's output, and they meet; staged, into a slot of its own
// in the receiver's staging, they meet, and every receiver copies its slots out. Pack j of every
// chunk is handled by the same thread in every phase on every rank, so per-block barriers are
// enough, and a thread reads its packs of the input before it writes those of the output: in
// place is safe where only the thread's own rank writes its output. All-to-all in place is not
// (a peer's direct pushes would overwrite chunks not yet sent): the host marks its buffers not
// usable, and the staged path runs.

template <typename T, int OP>
__device__ void all_to_all(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                           const volatile int* abort, const Views& views, int) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  u64 area = area_offset(half_bytes, start.epoch), slot = chunk_slot(count, sizeof(T));
  // Starting with the next rank: the ranks' first stores go to different GPUs.
  for (int i = 1; i <= nranks; i++) {
    int p = (rank + i) % nranks;
    char* dst = start.direct ? (char*)start.outs[p] + rank * count * sizeof(T)
                             : peers.staging[p] + area + rank * slot;
    push_range(in + p * count, count, 0, count, &dst, 1);
  }
  barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
  if (!start.direct) {
    for (int p = 0; p < nranks; p++)
      copy_out(out + p * count, (const T*)(peers.staging[rank] + area + p * slot), count, 0, count);
  }
  end_call(peers, rank, start.epoch);
}

template <typename T, int OP>
__device__ void gather(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                       const volatile int* abort, const Views& views, int root) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  u64 area = area_offset(half_bytes, start.epoch), slot = chunk_slot(count, sizeof(T));
  char* dst = start.direct ? (char*)start.outs[root] + rank * count * sizeof(T)
                           : peers.staging[root] + area + rank * slot;
  push_range(in, count, 0, count, &dst, 1);
  barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
  if (!start.direct && rank == root) {
    for (int p = 0; p < nranks; p++)
      copy_out(out + p * count, (const T*)(peers.staging[rank] + area + p * slot), count, 0, count);
  }
  end_call(peers, rank, start.epoch);
}

template <typename T, int OP>
__device__ void scatter(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes,
                        const volatile int* abort, const Views& views, int root) {
  const Start start = start_call(peers, rank, nranks, views, abort);
  u64 area = area_offset(half_bytes, start.epoch);
  if (rank == root) {
    // Starting with the next rank: the root's first stores go to a peer.
    for (int i = 1; i <= nranks; i++) {
      int p = (rank + i) % nranks;
      char* dst = start.direct ? (char*)start.outs[p] : peers.staging[p] + area;
      push_range(in + p * count, count, 0, count, &dst, 1);
    }
  }
  barrier(peers, rank, nranks, BARRIER_START, start.epoch, abort);
  if (!start.direct) copy_out(out, (const T*)(peers.staging[rank] + area), count, 0, count);
  end_call(peers, rank, start.epoch);
}
