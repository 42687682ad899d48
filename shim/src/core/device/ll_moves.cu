// ---- low latency: all-gather, broadcast, all-to-all, gather and scatter of small messages -------
//
// Every pair of ranks (sender s, receiver d) carries at most one chunk of `count` bytes, from a
// place in s's input to a place in d's output (`Route`). A sender writes each chunk straight
// into its slot of the receiver's low-latency inbox as packets (see "packets"); the receiver
// waits for them and copies them into its output; its own chunk, if any, it copies from its
// input. No staging, no barrier, no handshake: one trip over NVLink. Unit u (8 bytes) of every
// chunk is sent and received by thread u mod (grid size), each thread sending all its units
// before it waits for any.
//
// Inboxes alternate by epoch parity, as all-reduce's low-latency kernel's: a rank writes a parity
// again only two calls later, and to finish the call in between it must have received packets of
// that call from every peer, which each peer sends only once done with the call before. So that
// this holds where a pair carries no chunk (a broadcast's or scatter's non-root senders, a
// gather's non-root receivers), the sender still writes one packet, of no data, which its
// receiver waits for.

#define MOVE_ALL_GATHER 0
#define MOVE_BROADCAST 1
#define MOVE_ALL_TO_ALL 2
#define MOVE_GATHER 3
#define MOVE_SCATTER 4

// What the pair (s, d) carries in collective KIND: whether a chunk, from where in s's input and
// to where in d's output (in chunks).
struct Route {
  bool carries;
  u64 from;
  u64 to;
};

template <int KIND> __device__ __forceinline__ Route route(int s, int d, int root) {
  switch (KIND) {
    case MOVE_ALL_GATHER: return Route{true, 0, (u64)s};
    case MOVE_BROADCAST: return Route{s == root, 0, 0};
    case MOVE_ALL_TO_ALL: return Route{true, (u64)d, (u64)s};
    case MOVE_GATHER: return Route{d == root, 0, (u64)s};
    default: return Route{s == root, (u64)d, 0};  // scatter
  }
}

// Unit u of a chunk (8 bytes, fewer at its end) into `out`, whatever its alignment.
__device__ __forceinline__ void store_unit(unsigned char* out, u64 count, u64 u, Unit<unsigned char, 8> unit) {
  if (((u64)out & 7) == 0 && (u + 1) * 8 <= count) {
    *(Unit<unsigned char, 8>*)(out + u * 8) = unit;
  } else {
    for (u64 e = 0; e < 8 && u * 8 + e < count; e++) out[u * 8 + e] = unit.v[e];
  }
}

template <int KIND>
__device__ void ll_move(Peers peers, int rank, int nranks, const unsigned char* in, unsigned char* out, u64 count,
                        u64 half_bytes, const volatile int* abort, int root) {
  u32 epoch = begin_call(peers, rank);
  const u64 units = (count + 7) / 8;
  const u64 parity = epoch & 1;
  const u64 inbox = inbox_offset(half_bytes);
  const bool first_thread = thread_index() == 0;
  // Starting with the next rank: the ranks' first stores go to different GPUs.
  for (int i = 1; i < nranks; i++) {
    int d = (rank + i) % nranks;
    u64* slot = ll_slot(peers.staging[d], inbox, parity, rank);
    Route r = route<KIND>(rank, d, root);
    if (!r.carries) {
      if (first_thread) ll_store(slot, 0, 0, epoch);
      continue;
    }
    const unsigned char* from = in + r.from * count;
    const bool whole = ((u64)from & 7) == 0;
    for (u64 u = thread_index(); u < units; u += grid_threads()) {
      Unit<unsigned char, 8> unit = load_unit<unsigned char, 8>(from, count, u, whole);
      ll_store(slot + 2 * u, unit.w[0], unit.w[1], epoch);
    }
  }
  // This rank's own chunk, unless it is in place already.
  Route own = route<KIND>(rank, rank, root);
  if (own.carries && in + own.from * count != out + own.to * count) {
    const unsigned char* from = in + own.from * count;
    const bool whole = ((u64)from & 7) == 0;
    for (u64 u = thread_index(); u < units; u += grid_threads())
      store_unit(out + own.to * count, count, u, load_unit<unsigned char, 8>(from, count, u, whole));
  }
  for (int i = 1; i < nranks; i++) {
    int s = (rank + i) % nranks;
    const u64* slot = ll_slot(peers.staging[rank], inbox, parity, s);
    Route r = route<KIND>(s, rank, root);
    Unit<unsigned char, 8> unit;
    if (!r.carries) {
      if (first_thread) ll_wait(slot, epoch, abort, s, unit.w);
      continue;
    }
    for (u64 u = thread_index(); u < units; u += grid_threads()) {
      ll_wait(slot + 2 * u, epoch, abort, s, unit.w);
      store_unit(out + r.to * count, count, u, unit);
    }
  }
  end_call(peers, rank, epoch);
}

// One kernel per collective (the host's algorithms), as entry.cu instantiates them.
#define LL_MOVE(NAME, KIND)                                                                           \
  template <typename T, int OP>                                                                     \
  __device__ void NAME(Peers peers, int rank, int nranks, const T* in, T* out, u64 count, u64 half_bytes, \
                       const volatile int* abort, const Views&, int root) {                           \
    ll_move<KIND>(peers, rank, nranks, (const unsigned char*)in, (unsigned char*)out, count * sizeof(T), \
                  half_bytes, abort, root);                                                           \
  }
LL_MOVE(ll_all_gather, MOVE_ALL_GATHER)
LL_MOVE(ll_broadcast, MOVE_BROADCAST)
LL_MOVE(ll_all_to_all, MOVE_ALL_TO_ALL)
LL_MOVE(ll_gather, MOVE_GATHER)
LL_MOVE(ll_scatter, MOVE_SCATTER)
