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

typedef Unit<unsigned char, 8> ByteUnit;

// Unit u of a chunk (8 bytes, fewer at its end) into `out`, whatever its alignment.
__device__ __forceinline__ void store_unit(unsigned char* out, u64 count, u64 u, ByteUnit unit) {
  if (((u64)out & 7) == 0 && (u + 1) * 8 <= count) {
    *(ByteUnit*)(out + u * 8) = unit;
  } else {
    // Unrolled, as load_unit's.
#pragma unroll
    for (int e = 0; e < 8; e++) {
      if (u * 8 + e < count) out[u * 8 + e] = unit.v[e];
    }
  }
}

// What one thread sends of unit u: [i], the unit for the i-th rank after this one, where that
// pair carries a chunk (only [0] where every receiver gets the same chunk, `same_chunk_to_all`).
// A thread's first units are loaded before the call's epoch, so that the loads overlap.
template <int KIND, int NR> struct Outgoing {
  ByteUnit to[NR];
};

template <int KIND, int NR>
__device__ __forceinline__ Outgoing<KIND, NR> outgoing(int rank, int nranks, const unsigned char* in, u64 bytes,
                                                       int root, u64 u) {
  Outgoing<KIND, NR> o{};
  if constexpr (same_chunk_to_all<KIND>()) {
    // A rank that sends nothing (a broadcast's non-root) may give no input.
    if (route<KIND>(rank, rank, root).carries) o.to[0] = input_unit(in, bytes, u);
  } else {
#pragma unroll
    for (int i = 1; i < NR; i++) {
      if (i < nranks) {
        const Route r = route<KIND>(rank, rank_after(rank, i, nranks), root);
        if (r.carries) o.to[i] = input_unit(in + r.from * bytes, bytes, u);
      }
    }
  }
  return o;
}

// Sends unit u of what this rank's pairs carry into the receivers' inboxes.
template <int KIND, int NR>
__device__ __forceinline__ void send_unit(const Peers& peers, int rank, int nranks, const Outgoing<KIND, NR>& o,
                                          u64 inbox, u32 epoch, int root, u64 u) {
#pragma unroll
  for (int i = 1; i < NR; i++) {
    if (i < nranks) {
      const int d = rank_after(rank, i, nranks);
      if (!route<KIND>(rank, d, root).carries) continue;
      const ByteUnit& unit = o.to[same_chunk_to_all<KIND>() ? 0 : i];
      ll_store(ll_slot<NR>(peers.staging[d], inbox, epoch & 1, rank) + 2 * u, unit.w[0], unit.w[1], epoch);
    }
  }
}

// Whether the pair (sender s, receiver d) carries a chunk in a call of root `root`.
template <int KIND> struct CarriesOne {
  int root;
  __device__ __forceinline__ bool operator()(int s, int d) const { return route<KIND>(s, d, root).carries; }
};

// Whether it carries one in any call of a fused launch, whose calls' roots may differ.
template <int KIND> struct CarriesAny {
  const PacketArgs& args;
  __device__ __forceinline__ bool operator()(int s, int d) const {
    for (int k = 0; k < args.ncalls; k++) {
      if (route<KIND>(s, d, args.calls[k].root).carries) return true;
    }
    return false;
  }
};

// Thread 0 sends an empty packet to every receiver whose pair with this rank carries no chunk
// (`carries`, CarriesOne or CarriesAny): at the slot's first unit, which no call's data takes.
template <int KIND, int NR, typename Carries>
__device__ __forceinline__ void send_empty(const Peers& peers, int rank, int nranks, u64 inbox, u32 epoch,
                                           Carries carries) {
  if (thread_index() != 0) return;
#pragma unroll
  for (int i = 1; i < NR; i++) {
    if (i < nranks) {
      const int d = rank_after(rank, i, nranks);
      if (!carries(rank, d)) ll_store(ll_slot<NR>(peers.staging[d], inbox, epoch & 1, rank), 0, 0, epoch);
    }
  }
}

// Thread 0 waits for the empty packet of every sender whose pair with this rank carries no chunk.
template <int KIND, int NR, typename Carries>
__device__ __forceinline__ void wait_empty(const Peers& peers, int rank, int nranks, u64 inbox, u32 epoch,
                                           const volatile int* abort, Carries carries) {
  if (thread_index() != 0) return;
#pragma unroll
  for (int i = 1; i < NR; i++) {
    if (i < nranks) {
      const int s = rank_after(rank, i, nranks);
      if (carries(s, rank)) continue;
      ByteUnit unit;
      ll_wait(ll_slot<NR>(peers.staging[rank], inbox, epoch & 1, s), epoch, abort, s, unit.w);
    }
  }
}

// The packet kernel of the collective KIND for up to NR ranks (as the sentinel kernel's).
template <int KIND, int NR>
__device__ void ll_move_of(const Peers& peers, int rank, int nranks, const unsigned char* in, unsigned char* out,
                           u64 count, const Staging& staging, const volatile int* abort, int root) {
  const u64 units = (count + 7) / 8;
  const u64 first = thread_index();
  // This rank's own chunk, unless it is in place already: in the first units loaded where it is
  // what every receiver gets (all-gather, broadcast), loaded alongside them otherwise.
  const Route own = route<KIND>(rank, rank, root);
  const unsigned char* own_from = in + own.from * count;
  unsigned char* own_to = out + own.to * count;
  const bool copies_own = own.carries && own_from != own_to;
  auto own_unit_of = [&](const Outgoing<KIND, NR>& o, u64 u) {
    if constexpr (same_chunk_to_all<KIND>()) return o.to[0];
    return copies_own ? input_unit(own_from, count, u) : ByteUnit{};
  };
  Outgoing<KIND, NR> o = outgoing<KIND, NR>(rank, nranks, in, count, root, first);
  ByteUnit own_unit = own_unit_of(o, first);
  const u32 epoch = begin_call(peers, rank);
  const u64 inbox = staging.ll_inbox;
  send_empty<KIND, NR>(peers, rank, nranks, inbox, epoch, CarriesOne<KIND>{root});
  for (u64 u = first; u < units; u += grid_threads()) {
    if (u != first) {
      o = outgoing<KIND, NR>(rank, nranks, in, count, root, u);
      own_unit = own_unit_of(o, u);
    }
    send_unit<KIND, NR>(peers, rank, nranks, o, inbox, epoch, root, u);
    if (copies_own) store_unit(own_to, count, u, own_unit);
  }
  wait_empty<KIND, NR>(peers, rank, nranks, inbox, epoch, abort, CarriesOne<KIND>{root});
  for (u64 u = first; u < units; u += grid_threads()) {
#pragma unroll
    for (int i = 1; i < NR; i++) {
      if (i < nranks) {
        const int s = rank_after(rank, i, nranks);
        const Route r = route<KIND>(s, rank, root);
        if (!r.carries) continue;
        ByteUnit unit;
        ll_wait(ll_slot<NR>(peers.staging[rank], inbox, epoch & 1, s) + 2 * u, epoch, abort, s, unit.w);
        store_unit(out + r.to * count, count, u, unit);
      }
    }
  }
  end_call(peers, staging, rank, epoch, epoch);
}

template <int KIND>
__device__ void ll_move(const Peers& peers, int rank, int nranks, const unsigned char* in, unsigned char* out,
                        u64 count, const Staging& staging, const volatile int* abort, int root) {
  BY_RANKS(nranks, (ll_move_of<KIND, NR>(peers, rank, nranks, in, out, count, staging, abort, root)));
}

// ---- sentinel moves: the packet kernels' larger chunks -------------------------------------------
//
// As ll_move_of, one trip and no barrier, but each 16 bytes of a chunk go whole into the
// receiver's sentinel inbox (all_reduce.cu, "Sentinel"), so that every byte on NVLink is data:
// the receiver takes a pack once no 4-byte word of it is the sentinel (every bit set), puts the
// sentinel back and copies the pack out. Bytes cannot be changed as all-reduce's NaNs are, so a
// pack that holds a word of every bit set (which its receiver cannot tell from one not yet
// there) is flagged instead: its sender, once it has stored it, fences and writes a packet of the
// call's epoch at the pack's unit of its low-latency slot in the receiver's inbox (`send_pack`),
// and a receiver still waiting on a pack looks there between its polls (`take_pack`): once the
// flag is there, the pack as it reads it then is the sender's. A pair that carries no chunk
// sends the empty packet at unit 0 of that slot instead, which no flag of that pair then takes.
// Epoch parities, and the sentinel left in every slot a call read, as the sentinel all-reduce's.
// The host sends a lone call's chunks this way past a size (PacketCall::sentinel), up to the
// sentinel slots (2 MiB a pair on 2 ranks); a fused launch's go as packets.

// Whether a word of `p` is the sentinel.
__device__ __forceinline__ bool holds_sentinel(const Pack& p) {
  return p.w[0] == SENTINEL || p.w[1] == SENTINEL || p.w[2] == SENTINEL || p.w[3] == SENTINEL;
}

// Sends pack j of this rank's chunk for receiver d; flags it where it holds the sentinel.
template <int NR>
__device__ __forceinline__ void send_pack(const Peers& peers, int rank, int d, const Staging& staging, u32 epoch,
                                          u64 j, Pack p) {
  sentinel_store<u32>(sentinel_slot<NR>(peers.staging[d], staging.sentinel_inbox, epoch & 1, rank) + j, p);
  if (holds_sentinel(p)) {
    // The pack before its flag, wherever the receiver reads them.
    __threadfence_system();
    ll_store(ll_slot<NR>(peers.staging[d], staging.ll_inbox, epoch & 1, rank) + 2 * j, 0, 0, epoch);
  }
}

// Takes pack j of sender s's chunk: once no word of it is the sentinel, or its flag is there;
// puts the sentinel back.
template <int NR>
__device__ __forceinline__ Pack take_pack(const Peers& peers, int rank, int s, const Staging& staging, u32 epoch,
                                          u64 j, const volatile int* abort) {
  Pack* at = sentinel_slot<NR>(peers.staging[rank], staging.sentinel_inbox, epoch & 1, s) + j;
  Pack p;
  bool arrived = false;
#pragma unroll 1
  for (int i = 0; i < FAST_POLLS && !arrived; i++) arrived = sentinel_poll<u32>(at, p);
  if (!arrived) {
    const u64* flag = ll_slot<NR>(peers.staging[rank], staging.ll_inbox, epoch & 1, s) + 2 * j;
    unsigned spins = FAST_POLLS;
    u64 since = 0;
    while (!sentinel_poll<u32>(at, p)) {
      u32 none[2];
      if (ll_poll(flag, epoch, none)) {
        // The flag before the pack: what the sender stored before it.
        __threadfence_system();
        sentinel_poll<u32>(at, p);
        break;
      }
      if ((++spins & 1023u) == 0 && give_up(abort, since, s)) break;
      poll_pause(spins);
    }
  }
  sentinel_store<u32>(at, Pack{{SENTINEL, SENTINEL, SENTINEL, SENTINEL}});
  return p;
}

// Pack j of a chunk of `count` bytes into `out`, whatever its alignment.
__device__ __forceinline__ void store_pack(unsigned char* out, u64 count, u64 j, Pack p) {
  if (aligned16(out) && (j + 1) * 16 <= count) {
    ((Pack*)out)[j] = p;
    return;
  }
  PackOf<unsigned char>::U u;
  u.pack = p;
#pragma unroll
  for (int e = 0; e < 16; e++) {
    if (j * 16 + e < count) out[j * 16 + e] = u.v[e];
  }
}

// Pack j of a chunk of `count` bytes at `in` (zeros past its end).
__device__ __forceinline__ Pack chunk_pack(const unsigned char* in, u64 count, u64 j) {
  return load_padded_pack(in, count, j, aligned16(in));
}

template <int KIND, int NR>
__device__ void sentinel_move_of(const Peers& peers, int rank, int nranks, const unsigned char* in,
                                 unsigned char* out, u64 count, const Staging& staging, const volatile int* abort,
                                 int root) {
  static_assert(sentinel_capacity<NR>() / 16 <= ll_capacity<NR>() / 8, "a flag's unit for every pack");
  const u64 packs = (count + 15) / 16;
  const Route own = route<KIND>(rank, rank, root);
  const unsigned char* own_from = in + own.from * count;
  unsigned char* own_to = out + own.to * count;
  const bool copies_own = own.carries && own_from != own_to;
  const u32 epoch = begin_call(peers, rank);
  send_empty<KIND, NR>(peers, rank, nranks, staging.ll_inbox, epoch, CarriesOne<KIND>{root});
  for (u64 j = thread_index(); j < packs; j += grid_threads()) {
    if constexpr (same_chunk_to_all<KIND>()) {
      // A rank that sends nothing (a broadcast's non-root) may give no input.
      if (!own.carries) continue;
      const Pack p = chunk_pack(in, count, j);
#pragma unroll
      for (int i = 1; i < NR; i++) {
        if (i < nranks) send_pack<NR>(peers, rank, rank_after(rank, i, nranks), staging, epoch, j, p);
      }
      if (copies_own) store_pack(own_to, count, j, p);
    } else {
#pragma unroll
      for (int i = 1; i < NR; i++) {
        if (i < nranks) {
          const int d = rank_after(rank, i, nranks);
          const Route r = route<KIND>(rank, d, root);
          if (r.carries) send_pack<NR>(peers, rank, d, staging, epoch, j, chunk_pack(in + r.from * count, count, j));
        }
      }
      if (copies_own) store_pack(own_to, count, j, chunk_pack(own_from, count, j));
    }
  }
  wait_empty<KIND, NR>(peers, rank, nranks, staging.ll_inbox, epoch, abort, CarriesOne<KIND>{root});
  for (u64 j = thread_index(); j < packs; j += grid_threads()) {
#pragma unroll
    for (int i = 1; i < NR; i++) {
      if (i < nranks) {
        const int s = rank_after(rank, i, nranks);
        const Route r = route<KIND>(s, rank, root);
        if (r.carries) store_pack(out + r.to * count, count, j, take_pack<NR>(peers, rank, s, staging, epoch, j, abort));
      }
    }
  }
  end_call(peers, staging, rank, epoch, epoch);
}

template <int KIND>
__device__ void sentinel_move(const Peers& peers, int rank, int nranks, const unsigned char* in, unsigned char* out,
                              u64 count, const Staging& staging, const volatile int* abort, int root) {
  BY_RANKS(nranks, (sentinel_move_of<KIND, NR>(peers, rank, nranks, in, out, count, staging, abort, root)));
}

// As ll_move_of, for a launch of several calls as one (see "fused launches"): one epoch, and unit
// j of the launch (unit p.unit of call p.call) at unit j of every sender's slot. The calls' roots
// may differ: a pair gets the empty packet where it carries a chunk in none of them.
template <int KIND, int NR>
__device__ void ll_move_fused_of(const PacketArgs& args) {
  const Peers& peers = args.peers;
  const int rank = args.rank, nranks = args.nranks;
  const u64 units = fused_units<unsigned char, 8>(args);
  const u32 epoch = begin_call(peers, rank);
  const u64 inbox = args.staging.ll_inbox;
  const CarriesAny<KIND> carries{args};
  send_empty<KIND, NR>(peers, rank, nranks, inbox, epoch, carries);
  for (u64 j = thread_index(); j < units; j += grid_threads()) {
    const Piece p = piece_of<unsigned char, 8>(args, j);
    const PacketCall& c = args.calls[p.call];
    const unsigned char* in = (const unsigned char*)c.in;
    const Outgoing<KIND, NR> o = outgoing<KIND, NR>(rank, nranks, in, c.count, c.root, p.unit);
    send_unit<KIND, NR>(peers, rank, nranks, o, inbox, epoch, c.root, j);
    const Route own = route<KIND>(rank, rank, c.root);
    const unsigned char* own_from = in + own.from * c.count;
    unsigned char* own_to = (unsigned char*)c.out + own.to * c.count;
    if (own.carries && own_from != own_to) {
      const ByteUnit unit = same_chunk_to_all<KIND>() ? o.to[0] : input_unit(own_from, c.count, p.unit);
      store_unit(own_to, c.count, p.unit, unit);
    }
  }
  wait_empty<KIND, NR>(peers, rank, nranks, inbox, epoch, args.abort, carries);
  for (u64 j = thread_index(); j < units; j += grid_threads()) {
    const Piece p = piece_of<unsigned char, 8>(args, j);
    const PacketCall& c = args.calls[p.call];
#pragma unroll
    for (int i = 1; i < NR; i++) {
      if (i < nranks) {
        const int s = rank_after(rank, i, nranks);
        const Route r = route<KIND>(s, rank, c.root);
        if (!r.carries) continue;
        ByteUnit unit;
        ll_wait(ll_slot<NR>(peers.staging[rank], inbox, epoch & 1, s) + 2 * j, epoch, args.abort, s, unit.w);
        store_unit((unsigned char*)c.out + r.to * c.count, c.count, p.unit, unit);
      }
    }
  }
  end_call(peers, args.staging, rank, epoch, epoch);
}

template <int KIND>
__device__ void ll_move_fused(const PacketArgs& args) {
  BY_RANKS(args.nranks, (ll_move_fused_of<KIND, NR>(args)));
}

// Reduce-scatter and reduce of small messages: every chunk goes as packets to the rank that
// reduces it, as all-to-all's (reduce-scatter: chunk d of every input to rank d) or gather's
// (reduce: every input to the root) do, and that rank reduces them in rank order, its own chunk
// read from its input. One kernel for both (a root below 0: reduce-scatter), so that the two add
// one kernel per type and op. In place is safe: a thread reads its unit of this rank's chunk
// before it writes that unit of the output, and sends only the other chunks.
template <typename T, int OP, int KIND, int NR>
__device__ void ll_reduce_of(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                             const Staging& staging, const volatile int* abort, int root) {
  const int E = 8 / sizeof(T);
  const u64 bytes = count * sizeof(T), units = (bytes + 7) / 8;
  const u64 first = thread_index();
  const unsigned char* from = (const unsigned char*)in;
  const T* mine = in + (KIND == MOVE_ALL_TO_ALL ? rank * count : 0);
  const bool reduces_here = route<KIND>(rank, rank, root).carries;
  // The thread's first units, its own to reduce included, loaded before the epoch.
  Outgoing<KIND, NR> o = outgoing<KIND, NR>(rank, nranks, from, bytes, root, first);
  Unit<T, E> own{};
  if (reduces_here) own = input_unit(mine, count, first);
  const u32 epoch = begin_call(peers, rank);
  const u64 inbox = staging.ll_inbox;
  send_empty<KIND, NR>(peers, rank, nranks, inbox, epoch, CarriesOne<KIND>{root});
  for (u64 u = first; u < units; u += grid_threads()) {
    if (u != first) o = outgoing<KIND, NR>(rank, nranks, from, bytes, root, u);
    send_unit<KIND, NR>(peers, rank, nranks, o, inbox, epoch, root, u);
  }
  wait_empty<KIND, NR>(peers, rank, nranks, inbox, epoch, abort, CarriesOne<KIND>{root});
  if (reduces_here) {
    for (u64 u = first; u < units; u += grid_threads()) {
      if (u != first) own = input_unit(mine, count, u);
      ll_reduce_unit<T, OP, NR>(peers, rank, nranks, inbox, epoch, abort, u, own, out, count, u);
    }
  }
  end_call(peers, staging, rank, epoch, epoch);
}

// As ll_reduce_of, for a launch of several calls as one (as ll_move_fused_of).
template <typename T, int OP, int KIND, int NR>
__device__ void ll_reduce_fused_of(const PacketArgs& args) {
  const Peers& peers = args.peers;
  const int rank = args.rank, nranks = args.nranks;
  const u64 units = fused_units<T, 8>(args);
  const u32 epoch = begin_call(peers, rank);
  const u64 inbox = args.staging.ll_inbox;
  const CarriesAny<KIND> carries{args};
  send_empty<KIND, NR>(peers, rank, nranks, inbox, epoch, carries);
  for (u64 j = thread_index(); j < units; j += grid_threads()) {
    const Piece p = piece_of<T, 8>(args, j);
    const PacketCall& c = args.calls[p.call];
    const Outgoing<KIND, NR> o =
        outgoing<KIND, NR>(rank, nranks, (const unsigned char*)c.in, c.count * sizeof(T), c.root, p.unit);
    send_unit<KIND, NR>(peers, rank, nranks, o, inbox, epoch, c.root, j);
  }
  wait_empty<KIND, NR>(peers, rank, nranks, inbox, epoch, args.abort, carries);
  for (u64 j = thread_index(); j < units; j += grid_threads()) {
    const Piece p = piece_of<T, 8>(args, j);
    const PacketCall& c = args.calls[p.call];
    if (!route<KIND>(rank, rank, c.root).carries) continue;
    const T* mine = (const T*)c.in + (KIND == MOVE_ALL_TO_ALL ? rank * c.count : 0);
    ll_reduce_unit<T, OP, NR>(peers, rank, nranks, inbox, epoch, args.abort, j, input_unit(mine, c.count, p.unit),
                              (T*)c.out, c.count, p.unit);
  }
  end_call(peers, args.staging, rank, epoch, epoch);
}

// The host fuses reduce-scatters with reduce-scatters and reduces with reduces (`same_launch`).
template <typename T, int OP>
__device__ void ll_reduce_fused(const PacketArgs& args) {
  if (args.calls[0].root < 0) {
    BY_RANKS(args.nranks, (ll_reduce_fused_of<T, OP, MOVE_ALL_TO_ALL, NR>(args)));
  } else {
    BY_RANKS(args.nranks, (ll_reduce_fused_of<T, OP, MOVE_GATHER, NR>(args)));
  }
}

// `sentinel`: for the moves' kernels only (the host never sets it for these).
template <typename T, int OP>
__device__ void ll_reduce(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                          const Staging& staging, const volatile int* abort, int root, int sentinel) {
  if (root < 0) {
    BY_RANKS(nranks, (ll_reduce_of<T, OP, MOVE_ALL_TO_ALL, NR>(peers, rank, nranks, in, out, count, staging, abort,
                                                               root)));
  } else {
    BY_RANKS(nranks,
             (ll_reduce_of<T, OP, MOVE_GATHER, NR>(peers, rank, nranks, in, out, count, staging, abort, root)));
  }
}

// A collective's packet kernel (the host's algorithm), ll_NAME for a lone call and ll_NAME_fused
// for several, for each one entry.cu lists.
#define LL_MOVE(NAME, KIND)                                                                              \
  template <typename T, int OP>                                                                          \
  __device__ void ll_##NAME(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,    \
                            const Staging& staging, const volatile int* abort, int root, int sentinel) { \
    const unsigned char* from = (const unsigned char*)in;                                                 \
    unsigned char* to = (unsigned char*)out;                                                             \
    if (sentinel) return sentinel_move<KIND>(peers, rank, nranks, from, to, count * sizeof(T), staging, abort, root); \
    ll_move<KIND>(peers, rank, nranks, from, to, count * sizeof(T), staging, abort, root);               \
  }                                                                                                      \
  template <typename T, int OP>                                                                          \
  __device__ void ll_##NAME##_fused(const PacketArgs& args) {                                            \
    ll_move_fused<KIND>(args);                                                                           \
  }
