// ---- all-reduce ---------------------------------------------------------------------------------

// One-shot: every rank pushes its input into a slot of every rank's staging, they meet, and
// every rank reduces all slots, locally, in rank order.
template <typename T, int OP>
__device__ void one_shot(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                         const Staging& staging, const volatile int* abort, const Views&, int) {
  u32 epoch = begin_call(peers, rank);
  u64 area = area_offset(staging, epoch);
  u64 slot = staging.one_shot_slot;
  char* dst[MAX_RANKS];
  const char* src[MAX_RANKS];
  for (int p = 0; p < nranks; p++) {
    // Start with the next rank: the ranks' first stores go to different GPUs.
    int to = (rank + 1 + p) % nranks;
    dst[p] = peers.staging[to] + area + rank * slot;
    src[p] = peers.staging[rank] + area + p * slot;
  }
  push_range(in, count, 0, count, dst, nranks);
  barrier(peers, rank, nranks, BARRIER_START, epoch, abort);
  reduce_range<T, OP>(src, nranks, count, 0, count, out, (char* const*)0, 0);
  end_call(peers, staging, rank, epoch, epoch);
}

// Two-shot: every rank pushes each chunk of its input into a slot of the chunk's owner; they
// meet; each owner reduces its chunk from its slots, in rank order, into its output and into
// every other rank's result area; they meet; every rank copies the other chunks from its result
// area to its output.
template <typename T, int OP>
__device__ void two_shot_staged(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                                const Staging& staging, const volatile int* abort, u32 epoch) {
  u64 area = area_offset(staging, epoch);
  // A slot holds one chunk, and the last owner's also the elements past the last whole pack.
  u64 slot = chunk_elements<T>(nranks, count) * sizeof(T) + 16;
  u64 begin, end;
  for (int step = 1; step <= nranks; step++) {
    int owner = (rank + step) % nranks;
    chunk_bounds<T>(owner, nranks, count, &begin, &end);
    char* dst = peers.staging[owner] + area + rank * slot;
    push_range(in, count, begin, end, &dst, 1);
  }
  barrier(peers, rank, nranks, BARRIER_START, epoch, abort);
  chunk_bounds<T>(rank, nranks, count, &begin, &end);
  const char* src[MAX_RANKS];
  char* copies[MAX_RANKS];
  int ncopies = 0;
  for (int r = 0; r < nranks; r++) {
    src[r] = peers.staging[rank] + area + r * slot;
    if (r != rank) copies[ncopies++] = peers.staging[r] + area + staging.results + begin * sizeof(T);
  }
  reduce_range<T, OP>(src, nranks, count, begin, end, out, copies, ncopies);
  barrier(peers, rank, nranks, BARRIER_MIDDLE, epoch, abort);
  const T* results = (const T*)(peers.staging[rank] + area + staging.results);
  for (int step = 1; step < nranks; step++) {
    int owner = (rank + step) % nranks;
    chunk_bounds<T>(owner, nranks, count, &begin, &end);
    copy_out(out, results + begin, count, begin, end);
  }
}

// Messages larger than the staging go through it in windows of `staging.window` bytes, each run
// as if it were a call of its own (for_each_window; a window's element i is the same thread's in
// every phase as in a call). Returns the last epoch used.
template <typename T, int OP>
__device__ u32 two_shot_windows(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                                const Staging& staging, const volatile int* abort, u32 epoch) {
  return for_each_window(peers, rank, count, staging.window / sizeof(T), epoch, abort, [&](u64 begin, u64 size, u32 e) {
    two_shot_staged<T, OP>(peers, rank, nranks, in + begin, out + begin, size, staging, abort, e);
  });
}

// The direct kernel's fallback (the staged two-shot), not inlined: inlined, it made the compiler
// spill registers in the direct path (MAX_THREADS per block leave 128 per thread).
template <typename T, int OP>
__device__ __noinline__ u32 direct_fallback(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                                            const Staging& staging, const volatile int* abort, u32 epoch) {
  return two_shot_windows<T, OP>(peers, rank, nranks, in, out, count, staging, abort, epoch);
}

template <typename T, int OP>
__device__ void two_shot(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count,
                         const Staging& staging, const volatile int* abort, const Views&, int) {
  u32 epoch = begin_call(peers, rank);
  u32 last = two_shot_windows<T, OP>(peers, rank, nranks, in, out, count, staging, abort, epoch);
  end_call(peers, staging, rank, epoch, last);
}

// Direct (every rank in one process, or each rank's buffers mapped by every peer: zero_copy/):
// two-shot without the staging. The ranks tell each other
// their buffers; each owner reads its chunk straight from every rank's input, reduces it in rank
// order and writes it straight into every rank's output; they meet once at the end, so that no
// rank goes on (and reuses its buffers) while a peer still reads or writes them. Pack j is read
// and written by one thread only, the owner's (j mod grid size), so in-place is safe. A rank's
// buffers may not be reachable from the other GPUs (cuMem allocations without access for them,
// other contexts, allocations a peer process has not mapped) or not 16-aligned: the host says so
// in `usable`, and if any rank's are not, every rank sees it and they all run the staged
// two-shot instead, in the same call.
template <typename T, int OP>
__device__ void direct(const Peers& peers, int rank, int nranks, const T* in, T* out, u64 count, const Staging& staging,
                       const volatile int* abort, const Views& views, int) {
  direct_or_staged(
      peers, staging, rank, nranks, views, abort,
      [&](const Start& start) {
        u64 begin, end;
        chunk_bounds<T>(rank, nranks, count, &begin, &end);
        const char* src[MAX_RANKS];
        char* copies[MAX_RANKS];
        int ncopies = 0;
        for (int r = 0; r < nranks; r++) {
          src[r] = (const char*)start.ins[r] + begin * sizeof(T);
          if (r != rank) copies[ncopies++] = (char*)start.outs[r] + begin * sizeof(T);
        }
        reduce_range<T, OP>(src, nranks, count, begin, end, out, copies, ncopies);
      },
      [&](u32 epoch) { return direct_fallback<T, OP>(peers, rank, nranks, in, out, count, staging, abort, epoch); });
}

// Low latency (small messages): no staging, no barrier. Each rank writes its input straight into
// every peer's inbox as 8-byte packets of 4 data bytes and a 4-byte flag (the epoch), two to a
// 16-byte store (an 8-byte half always arrives whole, which is all a packet needs); a receiver
// spins on each pair until both flags are this call's epoch, then reduces in rank order, its own
// input read again from memory rather than through its inbox. Inboxes alternate by epoch parity:
// a rank writes a parity again only two calls later, and to finish the call in between it must
// have received every peer's packets of that call, which each peer sends only once done with
// the call before.
// NR: as the sentinel kernel's (sentinel_of). A thread's first unit is loaded before the epoch,
// so that the two loads overlap, and kept for its reduction.
template <typename T, int OP, int NR>
__device__ void ll_one_shot_of(const FusedArgs& args) {
  const int E = 8 / sizeof(T);  // elements in one 8-byte unit
  const int rank = args.rank, nranks = args.nranks;
  // The launch's calls as one (see "fused launches"): unit u is a unit of call piece.call.
  const u64 units = fused_units<T, 8>(args);
  const u64 first = thread_index();
  Piece piece = piece_of<T, 8>(args, first);
  const T* in = (const T*)args.calls[piece.call].in;
  const Unit<T, E> first_unit = input_unit(in, args.calls[piece.call].count, piece.unit);
  u32 epoch = begin_call(args.peers, rank);
  const u64 parity = epoch & 1;
  const u64 inbox = args.staging.ll_inbox;
  for (u64 u = first; u < units; u += grid_threads()) {
    Unit<T, E> mine = first_unit;
    if (u != first) {
      piece = piece_of<T, 8>(args, u);
      const FusedCall& c = args.calls[piece.call];
      mine = input_unit((const T*)c.in, c.count, piece.unit);
    }
#pragma unroll
    for (int i = 1; i < NR; i++) {
      if (i < nranks) {
        const int p = rank_after(rank, i, nranks);
        ll_store(ll_slot<NR>(args.peers.staging[p], inbox, parity, rank) + 2 * u, mine.w[0], mine.w[1], epoch);
      }
    }
  }
  for (u64 u = first; u < units; u += grid_threads()) {
    piece = piece_of<T, 8>(args, u);
    const FusedCall& c = args.calls[piece.call];
    Unit<T, E> mine = first_unit;
    if (u != first) mine = input_unit((const T*)c.in, c.count, piece.unit);
    ll_reduce_unit<T, OP, NR>(args.peers, rank, nranks, inbox, epoch, args.abort, u, mine, (T*)c.out, c.count,
                              piece.unit);
  }
  end_call(args.peers, args.staging, rank, epoch, epoch);
}

template <typename T, int OP>
__device__ void ll_one_shot(const FusedArgs& args) {
  BY_RANKS(args.nranks, (ll_one_shot_of<T, OP, NR>(args)));
}

// Sentinel (small messages of floating-point types): as low-latency, but the data signals its
// own arrival, so every byte on NVLink is data. A word of the inbox that holds no data holds the
// sentinel, every bit set: a NaN in every element of every floating-point type. Senders write
// their input straight into every peer's inbox in 16-byte stores, each word of it (4 bytes, or 8
// for double) after one change: a word that is the sentinel gets its top bit cleared, which
// turns a NaN's sign, nothing else (the all-ones NaN of the top element becomes the positive
// one; the other elements, all-ones NaNs too, stay). A receiver spins on each 16 bytes until no
// word is the sentinel, then puts the sentinel back and reduces in rank order, its own input
// read again from memory and changed alike, so that every rank reduces the same bits. A word is
// written and read whole (aligned 4- and 8-byte accesses are single-copy atomic), so a word that
// is not the sentinel is the sender's, whatever order the words of a store arrive in.
//
// Inboxes alternate by epoch parity, as the low-latency kernel's: a sender writes a parity again
// only two calls later, once it has received something every peer sent in the call between,
// after that peer's kernel of this call had completed, sentinels put back included (a kernel's
// writes are done before the next one passes griddepcontrol.wait). The host fills the inboxes
// with the sentinel once; every call leaves them so, as long as every rank gives the same count.
// Integers have no free bit pattern: their small messages take the low-latency kernel.
#define SENTINEL 0xffffffffu

// The word a sentinel is a value of: an element, or 4 bytes of smaller ones.
template <typename T> struct SentinelWord { typedef u32 W; };
template <> struct SentinelWord<double> { typedef u64 W; };

// Clears the top bit of each word of `p` that is the sentinel (W: the word, u32 or u64).
template <typename W> __device__ __forceinline__ Pack clear_sentinels(Pack p) {
  if constexpr (sizeof(W) == 8) {
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
      if (p.w[k] == SENTINEL && p.w[k + 1] == SENTINEL) p.w[k + 1] = SENTINEL >> 1;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      if (p.w[k] == SENTINEL) p.w[k] = SENTINEL >> 1;
    }
  }
  return p;
}

template <typename W> __device__ __forceinline__ void sentinel_store(Pack* address, Pack p) {
  if constexpr (sizeof(W) == 8) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(address),
                 "l"(((u64)p.w[1] << 32) | p.w[0]), "l"(((u64)p.w[3] << 32) | p.w[2])
                 : "memory");
  } else {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(p.w[0]), "r"(p.w[1]),
                 "r"(p.w[2]), "r"(p.w[3])
                 : "memory");
  }
}

// Loads the 16 bytes at `address` into `p`: whether no word of them is the sentinel.
template <typename W>
__device__ __forceinline__ bool sentinel_poll(const Pack* address, Pack& p) {
  if constexpr (sizeof(W) == 8) {
    u64 lo, hi;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(address) : "memory");
    p.w[0] = (u32)lo, p.w[1] = (u32)(lo >> 32), p.w[2] = (u32)hi, p.w[3] = (u32)(hi >> 32);
    return lo != ~0ull && hi != ~0ull;
  } else {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(p.w[0]), "=r"(p.w[1]), "=r"(p.w[2]), "=r"(p.w[3])
                 : "l"(address)
                 : "memory");
    return p.w[0] != SENTINEL && p.w[1] != SENTINEL && p.w[2] != SENTINEL && p.w[3] != SENTINEL;
  }
}

// Waits until no word at `address` is the sentinel, puts the sentinel back, returns the words.
template <typename W>
__device__ __forceinline__ Pack sentinel_take(Pack* address, const volatile int* abort, int peer) {
  Pack p;
  bool arrived = false;
#pragma unroll 1
  for (int i = 0; i < FAST_POLLS && !arrived; i++) arrived = sentinel_poll<W>(address, p);
  if (!arrived) {
    unsigned spins = FAST_POLLS;
    u64 since = 0;
    while (!sentinel_poll<W>(address, p)) {
      if ((++spins & 1023u) == 0 && give_up(abort, since, peer)) break;
      poll_pause(spins);
    }
  }
  sentinel_store<W>(address, Pack{{SENTINEL, SENTINEL, SENTINEL, SENTINEL}});
  return p;
}

// Pack j of `src` (zero past `count`), whatever the alignment of `src`.
template <typename T>
__device__ __forceinline__ Pack load_padded_pack(const T* src, u64 count, u64 j, bool aligned) {
  const int N = PackOf<T>::N;
  if (aligned && (j + 1) * N <= count) return ((const Pack*)src)[j];
  typename PackOf<T>::U p;
  p.pack = Pack{{0, 0, 0, 0}};
  // Unrolled, so that the loads go out together and the pack stays in registers.
#pragma unroll
  for (int k = 0; k < N; k++) {
    if (j * N + k < count) p.v[k] = src[j * N + k];
  }
  return p.pack;
}

// Pack `piece` of the launch's calls as its input holds it; zeros past the end, with no access.
template <typename T>
__device__ __forceinline__ Pack input_pack(const FusedArgs& args, Piece piece) {
  const FusedCall& c = args.calls[piece.call];
  return load_padded_pack((const T*)c.in, c.count, piece.unit, aligned16(c.in));
}

// The sentinel kernel for up to NR ranks (the fewest of 2, 4 and 8 that hold the
// communicator's), so that the loops over peers unroll to what is there; ONE: the launch carries
// one call. A small call is one exchange over NVLink, where every instruction shows.
template <typename T, int OP, int NR, bool ONE>
__device__ void sentinel_of(const FusedArgs& args) {
  typedef typename SentinelWord<T>::W W;
  const int N = PackOf<T>::N;
  const int rank = args.rank, nranks = args.nranks;
  const u64 packs = launch_units<T, 16, ONE>(args);
  // The policy gives a thread one pack (the loop takes any grid). Its load is issued before the
  // epoch's, and nothing looks at it until the epoch is read, so that the two loads overlap:
  // with its sentinels cleared at once, the epoch's load waited for it (0.2 - 0.25 us a call on
  // 2 H100, timed inside the kernel).
  u64 j = thread_index();
  Piece piece = launch_piece<T, 16, ONE>(args, j);
  Pack loaded = input_pack<T>(args, piece);
  const u32 epoch = begin_call(args.peers, rank);
  const u64 inbox = args.staging.sentinel_inbox;
  const u64 parity = epoch & 1;
  for (; j < packs; j += grid_threads()) {
    if (j != thread_index()) {
      piece = launch_piece<T, 16, ONE>(args, j);
      loaded = input_pack<T>(args, piece);
    }
    const Pack own = clear_sentinels<W>(loaded);
#pragma unroll
    for (int i = 1; i < NR; i++) {
      if (i < nranks) {
        const int p = rank_after(rank, i, nranks);
        sentinel_store<W>(sentinel_slot<NR>(args.peers.staging[p], inbox, parity, rank) + j, own);
      }
    }
    typename PackOf<T>::U from[NR];
#pragma unroll
    for (int p = 0; p < NR; p++) {
      if (p == rank) {
        from[p].pack = own;
      } else if (p < nranks) {
        from[p].pack = sentinel_take<W>(sentinel_slot<NR>(args.peers.staging[rank], inbox, parity, p) + j, args.abort, p);
      }
    }
    typename PackOf<T>::U result;
#pragma unroll
    for (int k = 0; k < N; k++) result.v[k] = reduce_element<T, OP, NR>(from, nranks, k);
    // In place, the output is the input: this thread alone reads and writes these elements.
    const FusedCall& c = args.calls[piece.call];
    T* out = (T*)c.out;
    const u64 at = piece.unit;
    if (aligned16(out) && (at + 1) * N <= c.count) {
      ((Pack*)out)[at] = result.pack;
    } else {
#pragma unroll
      for (int k = 0; k < N; k++) {
        if (at * N + k < c.count) out[at * N + k] = result.v[k];
      }
    }
  }
  end_call(args.peers, args.staging, rank, epoch, epoch);
}

template <typename T, int OP, int NR>
__device__ void sentinel_for(const FusedArgs& args) {
  if (args.ncalls == 1) return sentinel_of<T, OP, NR, true>(args);
  sentinel_of<T, OP, NR, false>(args);
}

template <typename T, int OP>
__device__ void sentinel(const FusedArgs& args) {
  BY_RANKS(args.nranks, (sentinel_for<T, OP, NR>(args)));
}
