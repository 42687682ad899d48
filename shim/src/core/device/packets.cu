// ---- packets: every collective but all-reduce, for small messages -------------------------------
//
// Every pair of ranks (sender s, receiver d) carries at most one chunk of `count` bytes, from a
// place in s's input to a place in d's output (`Route`). A sender writes each chunk straight
// into its slot of the receiver's low-latency inbox as packets (see "packets"); the receiver
// waits for them and copies them into its output (or reduces them: ll_reduce below); its own
// chunk, if any, it copies from its input. No staging, no barrier, no handshake: one trip over
// NVLink. Unit u (8 bytes) of every chunk is sent and received by thread u mod (grid size), each
// thread sending all its units before it waits for any.
//
// Inboxes alternate by epoch parity, as all-reduce's low-latency kernel's: a rank writes a parity
// again only two calls later, and to finish the call in between it must have received packets of
// that call from every peer, which each peer sends only once done with the call before. So that
// this holds where a pair carries no chunk (a broadcast's or scatter's non-root senders, a
// gather's non-root receivers), the sender still writes one packet, of no data, which its
// receiver waits for.

// Unit u of a chunk (8 bytes, fewer at its end) into `out`, whatever its alignment.
__device__ __forceinline__ void store_unit(unsigned char* out, u64 count, u64 u, Unit<unsigned char, 8> unit) {
  if (((u64)out & 7) == 0 && (u + 1) * 8 <= count) {
    *(Unit<unsigned char, 8>*)(out + u * 8) = unit;
  } else {
    for (u64 e = 0; e < 8 && u * 8 + e < count; e++) out[u * 8 + e] = unit.v[e];
  }
}

// Sends this rank's chunks of `in` (`bytes` bytes each) as packets into the receivers' inboxes,
// as route<KIND> says; an empty packet where the pair carries none.
template <int KIND>
__device__ __forceinline__ void ll_send(const Peers& peers, int rank, int nranks, const unsigned char* in,
                                        u64 bytes, u64 inbox, u32 epoch, int root) {
  const u64 units = (bytes + 7) / 8;
  const u64 parity = epoch & 1;
  // Starting with the next rank: the ranks' first stores go to different GPUs.
  for (int i = 1; i < nranks; i++) {
    int d = (rank + i) % nranks;
    u64* slot = ll_slot(peers.staging[d], inbox, parity, rank);
    Route r = route<KIND>(rank, d, root);
    if (!r.carries) {
      if (thread_index() == 0) ll_store(slot, 0, 0, epoch);
      continue;
    }
    const unsigned char* from = in + r.from * bytes;
    const bool whole = ((u64)from & 7) == 0;
    for (u64 u = thread_index(); u < units; u += grid_threads()) {
      Unit<unsigned char, 8> unit = load_unit<unsigned char, 8>(from, bytes, u, whole);
      ll_store(slot + 2 * u, unit.w[0], unit.w[1], epoch);
    }
  }
}

// Waits for the empty packet of every sender whose pair with this rank carries no chunk.
template <int KIND>
__device__ __forceinline__ void ll_wait_empty(const Peers& peers, int rank, int nranks, u64 inbox, u32 epoch,
                                              const volatile int* abort, int root) {
  if (thread_index() != 0) return;
  for (int i = 1; i < nranks; i++) {
    int s = (rank + i) % nranks;
    if (route<KIND>(s, rank, root).carries) continue;
    Unit<unsigned char, 8> unit;
    ll_wait(ll_slot(peers.staging[rank], inbox, epoch & 1, s), epoch, abort, s, unit.w);
  }
}

template <int KIND>
__device__ void ll_move(Peers peers, int rank, int nranks, const unsigned char* in, unsigned char* out, u64 count,
                        const Staging& staging, const volatile int* abort, int root) {
  u32 epoch = begin_call(peers, rank);
  const u64 units = (count + 7) / 8;
  const u64 parity = epoch & 1;
  const u64 inbox = staging.ll_inbox;
  ll_send<KIND>(peers, rank, nranks, in, count, inbox, epoch, root);
  // This rank's own chunk, unless it is in place already.
  Route own = route<KIND>(rank, rank, root);
  if (own.carries && in + own.from * count != out + own.to * count) {
    const unsigned char* from = in + own.from * count;
    const bool whole = ((u64)from & 7) == 0;
    for (u64 u = thread_index(); u < units; u += grid_threads())
      store_unit(out + own.to * count, count, u, load_unit<unsigned char, 8>(from, count, u, whole));
  }
  ll_wait_empty<KIND>(peers, rank, nranks, inbox, epoch, abort, root);
  for (int i = 1; i < nranks; i++) {
    int s = (rank + i) % nranks;
    Route r = route<KIND>(s, rank, root);
    if (!r.carries) continue;
    const u64* slot = ll_slot(peers.staging[rank], inbox, parity, s);
    Unit<unsigned char, 8> unit;
    for (u64 u = thread_index(); u < units; u += grid_threads()) {
      ll_wait(slot + 2 * u, epoch, abort, s, unit.w);
      store_unit(out + r.to * count, count, u, unit);
    }
  }
  end_call(peers, rank, epoch);
}

// Reduce-scatter and reduce of small messages: every chunk goes as packets to the rank that
// reduces it, as all-to-all's (reduce-scatter: chunk d of every input to rank d) or gather's
// (reduce: every input to the root) do, and that rank reduces them in rank order, its own chunk
// read from its input. One kernel for both (a root below 0: reduce-scatter), so that the two add
// one kernel per type and op. In place is safe: a thread reads its unit of this rank's chunk
// before it writes that unit of the output, and sends only the other chunks.
template <typename T, int OP>
__device__ void ll_reduce(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, const Staging& staging,
                          const volatile int* abort, const Views&, int root) {
  const u64 bytes = count * sizeof(T), units = (bytes + 7) / 8;
  u32 epoch = begin_call(peers, rank);
  const u64 inbox = staging.ll_inbox;
  const bool scatters = root < 0;
  if (scatters) {
    ll_send<MOVE_ALL_TO_ALL>(peers, rank, nranks, (const unsigned char*)in, bytes, inbox, epoch, root);
  } else {
    ll_send<MOVE_GATHER>(peers, rank, nranks, (const unsigned char*)in, bytes, inbox, epoch, root);
  }
  if (!scatters && rank != root) {
    ll_wait_empty<MOVE_GATHER>(peers, rank, nranks, inbox, epoch, abort, root);
    end_call(peers, rank, epoch);
    return;
  }
  const T* mine = in + (scatters ? rank * count : 0);
  for (u64 u = thread_index(); u < units; u += grid_threads())
    ll_reduce_unit<T, OP>(peers, rank, nranks, inbox, epoch, abort, u, mine, out, count, u);
  end_call(peers, rank, epoch);
}

// A collective's packet kernel (the host's algorithm), ll_NAME, for each one entry.cu lists.
#define LL_MOVE(NAME, KIND)                                                                           \
  template <typename T, int OP>                                                                     \
  __device__ void ll_##NAME(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, const Staging& staging, \
                       const volatile int* abort, const Views&, int root) {                           \
    ll_move<KIND>(peers, rank, nranks, (const unsigned char*)in, (unsigned char*)out, count * sizeof(T), \
                  staging, abort, root);                                                           \
  }
