// collectives.cuh: ring algorithms over any protocol for every work type, the one-shot LL
// all-reduce, the tree all-reduce, and the macros that define the extern "C" kernels. It
// instantiates nothing itself: build.rs generates the translation units from its one kernel list
// (one unit per data type, plus fnCopy's), which include this header and define their kernels
// with FN_COLL_KERNEL / FN_COPY_KERNEL. See kernels/README.md for the contract.
#pragma once
#include <type_traits>
#include "prims.cuh"

// A channel's share of `count` elements: contiguous, FN_ALIGN-aligned partitions, maybe empty.
struct Part {
  uint64_t off, len;
};
template <typename T>
__device__ __forceinline__ Part channelPart(uint64_t count, int nChannels, int c) {
  const uint64_t per = alignUp(divUp(count, nChannels), FN_ALIGN / sizeof(T));
  const uint64_t lo = min(uint64_t(c) * per, count);
  return {lo, min(lo + per, count) - lo};
}
// Elements per chunk for the piece starting with `rem` elements left, k chunks per piece.
template <typename T>
__device__ __forceinline__ uint64_t chunkElems(uint64_t rem, int k, uint64_t slotElems) {
  return min(slotElems, alignUp(divUp(rem, k), FN_ALIGN / sizeof(T)));
}

// Walks a partition of len elements one slot-sized chunk at a time: step(offset, length) for each,
// stopping at the first that fails.
template <typename T, typename Step>
__device__ __forceinline__ bool forEachChunk(uint64_t len, uint64_t slotElems, Step step) {
  for (uint64_t base = 0; base < len;) {
    const uint64_t C = chunkElems<T>(len - base, 1, slotElems);
    if (!step(base, min(C, len - base))) return false;
    base += C;
  }
  return true;
}

// Runs step(offset, length) over len elements in pieces of at most slotElems, one FIFO step each,
// stopping at the first that fails. An empty range is one empty piece, as both ends of a
// connection count it.
template <typename Step>
__device__ __forceinline__ bool eachSlot(uint64_t len, uint64_t slotElems, Step step) {
  uint64_t o = 0;
  do {
    const uint64_t l = min(slotElems, len - o);
    if (!step(o, l)) return false;
    o += l;
  } while (o < len);
  return true;
}

// Elements a ring collective sends per hop before it waits on its receive: chunkSlots Simple slots
// (fnDevComm), one slot of LL or LL128. Over NET a step crosses two proxies and a socket, so with
// one slot in flight a hop's pipe stands empty while each step makes its round trip.
template <int P>
__device__ __forceinline__ uint64_t ringChunkElems(const fnDevComm* comm, uint64_t slotElems) {
  return P == FN_PROTO_SIMPLE ? slotElems * max(comm->chunkSlots, 1u) : slotElems;
}

// The ring connections of channel c: send to next, receive from prev.
template <typename T, typename Op, int P>
__device__ __forceinline__ Prims<T, Op, P> ringPrims(const Group& g, const fnDevComm* comm, const Op& op,
                                                     const fnRing& ring, int c) {
  return Prims<T, Op, P>(g, comm, op, &comm->conns[ring.next * FN_MAX_CHANNELS + c].send,
                         &comm->conns[ring.prev * FN_MAX_CHANNELS + c].recv);
}

// Each algorithm returns false when a wait told the group to stop (abort, error, timeout). They are
// out of line (arguments by value) so kernels sharing template arguments share one body.

template <typename T, typename Op, int P>
__device__ __noinline__ bool allReduce(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, w.nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;
  if (n == 1) {
    reduceCopy<T, Op, F_USRC | F_UDST | F_PRE | F_POST>(g, op, nullptr, src, dst, nullptr, pt.len);
    return true;
  }
  const fnRing ring = comm->rings[c];
  const int ix = ring.index;
  Prims<T, Op, P> p = ringPrims<T, Op, P>(g, comm, op, ring, c);
  const uint64_t S = p.slotElems, G = ringChunkElems<P>(comm, S);
  for (uint64_t base = 0; base < pt.len;) {
    // n chunks of C elements per piece; chunk i is the one ring position i finishes reducing.
    const uint64_t C = chunkElems<T>(pt.len - base, n, G);
    auto off = [&](int i) { return min(base + i * C, pt.len); };
    auto len = [&](int i) { return min(base + (i + 1) * C, pt.len) - off(i); };
    int i = ringMod(ix - 1, n);
    if (!eachSlot(len(i), S, [&](uint64_t o, uint64_t l) { return p.send(src + off(i) + o, l); })) return false;
    for (int j = 2; j < n; j++) {
      i = ringMod(ix - j, n);
      if (!eachSlot(len(i), S, [&](uint64_t o, uint64_t l) { return p.recvReduceSend(src + off(i) + o, l); }))
        return false;
    }
    i = ix;
    if (!eachSlot(len(i), S, [&](uint64_t o, uint64_t l) {
          return p.recvReduceCopySend(src + off(i) + o, dst + off(i) + o, l);
        }))
      return false;
    for (int j = 1; j < n - 1; j++) {
      i = ringMod(ix - j, n);
      if (!eachSlot(len(i), S, [&](uint64_t o, uint64_t l) { return p.recvCopySend(dst + off(i) + o, l); }))
        return false;
    }
    i = ringMod(ix + 1, n);
    if (!eachSlot(len(i), S, [&](uint64_t o, uint64_t l) { return p.recv(dst + off(i) + o, l); })) return false;
    base += uint64_t(n) * C;
  }
  p.save();
  return true;
}

// One-shot all-reduce between two ranks, any protocol: each chunk goes to the peer, and comes back
// reduced with the peer's chunk. One hop instead of the ring's two; both ranks compute op(a, b) of
// the same two values, and every operator is commutative, so both get the same bits.
template <typename T, typename Op, int P>
__device__ __noinline__ bool allReduceOneShotPair(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, w.nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;
  Prims<T, Op, P> p = ringPrims<T, Op, P>(g, comm, op, comm->rings[c], c);  // next == prev == the peer
  const uint64_t S = p.slotElems;
  const bool ok = forEachChunk<T>(pt.len, ringChunkElems<P>(comm, S), [&](uint64_t base, uint64_t len) {
    return eachSlot(len, S, [&](uint64_t o, uint64_t l) { return p.send(src + base + o, l); }) &&
           eachSlot(len, S, [&](uint64_t o, uint64_t l) {
             return p.recvReduceCopy(src + base + o, dst + base + o, l);
           });
  });
  if (ok) p.save();
  return ok;
}

// One-shot all-reduce over LL for n > 2: push this channel's part of the input, pre-op applied, to
// every peer's LL slot; then reduce all inputs in rank order (the same order on every rank, so every
// rank gets the same bits; op(a, b) == op(b, a) does not make a sum of three associative) and apply
// the post-op. The host sends a part no larger than one LL slot and uses channels that connect
// every pair of ranks.
template <typename T, typename Op>
__device__ __noinline__ bool allReduceOneShot(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, me = comm->rank, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, w.nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;
  const size_t nbytes = pt.len * sizeof(T), nWords = divUp(nbytes, 8);
  fnConn* conns = comm->conns + c;  // conns[peer * FN_MAX_CHANNELS] is peer's connection on channel c
  auto slot = [](char* buff, uint64_t step) { return buff + (step % FN_NSTEPS) * (FN_LL_SLOT_LINES * 16); };
  auto stepOf = [](uint64_t* p) { return *reinterpret_cast<volatile uint64_t*>(p); };
  int stop = FN_DEV_OK;
  for (int j = 1; j < n && stop == FN_DEV_OK; j++) {
    fnConnSend& s = conns[ringMod(me + j, n) * FN_MAX_CHANNELS].send;
    const uint64_t step = stepOf(&s.step);
    // The slot is free by the head last read, or thread 0 polls head for the group (Prims'
    // groupWaitSendSlot says why one poller).
    if (stepOf(&s.headSeen) + FN_NSTEPS <= step) {
      uint64_t seen = 0;
      if (g.tid == 0) stop = waitCounter(comm, s.head, FN_NSTEPS, step, &seen);
      if (groupBarrierAny(g, stop != FN_DEV_OK)) return false;
      // After the barrier: every thread has read the old value.
      if (g.tid == 0) *reinterpret_cast<volatile uint64_t*>(&s.headSeen) = seen;
    }
    stop = llMove<T, Op, F_SEND | F_USRC | F_PRE>(g, comm, op, nullptr, 0, slot(s.buffs[FN_PROTO_LL], step),
                                                   uint32_t(step + 1), src, nullptr, pt.len);
  }
  for (size_t i = g.tid; i < nWords && stop == FN_DEV_OK; i += g.nthreads) {
    uint64_t acc = 0;
    for (int r = 0; r < n; r++) {
      uint64_t v;
      if (r == me) {
        v = combineVec<T, Op, F_USRC | F_PRE>(op, uint64_t(0), loadWord(src, i, nbytes));
      } else {
        fnConnRecv& rc = conns[r * FN_MAX_CHANNELS].recv;
        const uint64_t step = stepOf(&rc.step);
        stop = readLL(comm, slot(rc.buffs[FN_PROTO_LL], step) + 16 * i, uint32_t(step + 1), v);
        if (stop != FN_DEV_OK) break;
      }
      acc = r == 0 ? v : combineVec<T, Op, F_RECV | F_USRC>(op, acc, v);
    }
    if (stop == FN_DEV_OK) storeWord(dst, i, nbytes, combineVec<T, Op, F_RECV | F_POST>(op, acc, uint64_t(0)));
  }
  if (groupBarrierAny(g, stop != FN_DEV_OK)) return false;
  // Every thread has read its lines and every step counter: free the slots and advance.
  if (g.tid == 0) {
    for (int r = 0; r < n; r++) {
      if (r == me) continue;
      fnConn& cn = conns[r * FN_MAX_CHANNELS];
      const uint64_t rstep = stepOf(&cn.recv.step);
      *cn.recv.head = rstep + 1;
      *reinterpret_cast<volatile uint64_t*>(&cn.recv.step) = rstep + 1;
      *reinterpret_cast<volatile uint64_t*>(&cn.send.step) = stepOf(&cn.send.step) + 1;
    }
  }
  groupBarrier(g);
  return true;
}

// Tree all-reduce (FN_ALGO_TREE): channel c's part is reduced up comm->trees[c] to its root, then
// broadcast down it, chunk by chunk, all chunks up before any comes down. Each phase moves data one
// way along tree edges, and every rank handles chunks (and, within a chunk, children) in the same
// order, so bounded FIFOs cannot deadlock. A rank with k children accumulates them one by one into
// recvbuff (the first with its own input, pre applied once); the last child's step sends straight
// up, or at the root applies post and leaves the final value. Every rank then holds the root's bits.
//
// Prims holds one send and one receive connection; a tree step pairs the receive half of one edge
// with the send half of another, so each step builds its Prims from the two connections and saves
// their counters after it.
template <typename T, typename Op, int P, int F>
__device__ __forceinline__ bool treeStep(const Group& g, const fnDevComm* comm, const Op& op, fnConn* from,
                                         fnConn* to, const T* usrc, T* udst, size_t n) {
  Prims<T, Op, P> p(g, comm, op, to ? &to->send : nullptr, from ? &from->recv : nullptr);
  if (!p.template step<F>(usrc, udst, n)) return false;
  p.save();
  return true;
}

template <typename T, typename Op, int P>
__device__ __noinline__ bool allReduceTree(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, w.nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;
  const fnTree t = comm->trees[c];
  fnConn* const conns = comm->conns + c;  // conns[peer * FN_MAX_CHANNELS] is peer's connection on channel c
  fnConn* up = t.up >= 0 ? &conns[t.up * FN_MAX_CHANNELS] : nullptr;
  fnConn* down[FN_TREE_ARITY];
  int nd = 0;
  for (int j = 0; j < FN_TREE_ARITY; j++) {
    if (t.down[j] >= 0) down[nd++] = &conns[t.down[j] * FN_MAX_CHANNELS];
  }
  if (!up && nd == 0) {
    reduceCopy<T, Op, F_USRC | F_UDST | F_PRE | F_POST>(g, op, nullptr, src, dst, nullptr, pt.len);
    return true;
  }
  constexpr int RU = F_RECV | F_USRC;
  const uint64_t slotElems = slotPayload<P>(comm) / sizeof(T);
  const bool reduced = forEachChunk<T>(pt.len, slotElems, [&](uint64_t base, uint64_t len) {
    const T* s = src + base;
    T* d = dst + base;
    if (nd == 0) return treeStep<T, Op, P, F_SEND | F_USRC | F_PRE>(g, comm, op, nullptr, up, s, nullptr, len);
    for (int j = 0; j < nd; j++) {
      const bool first = j == 0, last = j == nd - 1;
      bool ok;
      if (!last) {
        ok = first ? treeStep<T, Op, P, RU | F_UDST | F_PRE>(g, comm, op, down[j], nullptr, s, d, len)
                   : treeStep<T, Op, P, RU | F_UDST>(g, comm, op, down[j], nullptr, d, d, len);
      } else if (up) {
        ok = first ? treeStep<T, Op, P, RU | F_SEND | F_PRE>(g, comm, op, down[j], up, s, nullptr, len)
                   : treeStep<T, Op, P, RU | F_SEND>(g, comm, op, down[j], up, d, nullptr, len);
      } else {
        ok = first ? treeStep<T, Op, P, RU | F_UDST | F_PRE | F_POST>(g, comm, op, down[j], nullptr, s, d, len)
                   : treeStep<T, Op, P, RU | F_UDST | F_POST>(g, comm, op, down[j], nullptr, d, d, len);
      }
      if (!ok) return false;
    }
    return true;
  });
  if (!reduced) return false;
  return forEachChunk<T>(pt.len, slotElems, [&](uint64_t base, uint64_t len) {
    T* d = dst + base;
    int j = 0;
    if (up) {
      if (nd == 0) return treeStep<T, Op, P, F_RECV | F_UDST>(g, comm, op, up, nullptr, nullptr, d, len);
      if (!treeStep<T, Op, P, F_RECV | F_UDST | F_SEND>(g, comm, op, up, down[0], nullptr, d, len)) return false;
      j = 1;
    }
    for (; j < nd; j++) {
      if (!treeStep<T, Op, P, F_SEND | F_USRC>(g, comm, op, nullptr, down[j], d, nullptr, len)) return false;
    }
    return true;
  });
}

// Chain from the rank after the root around to the root.
template <typename T, typename Op, int P>
__device__ __noinline__ bool reduce(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, w.nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;  // used on the root only
  if (n == 1) {
    reduceCopy<T, Op, F_USRC | F_UDST | F_PRE | F_POST>(g, op, nullptr, src, dst, nullptr, pt.len);
    return true;
  }
  const fnRing ring = comm->rings[c];
  const bool first = ring.prev == w.root, root = comm->rank == w.root;
  Prims<T, Op, P> p = ringPrims<T, Op, P>(g, comm, op, ring, c);
  const bool ok = forEachChunk<T>(pt.len, p.slotElems, [&](uint64_t base, uint64_t len) {
    return first  ? p.send(src + base, len)
           : root ? p.recvReduceCopy(src + base, dst + base, len)
                  : p.recvReduceSend(src + base, len);
  });
  if (ok) p.save();
  return ok;
}

// Every other rank sends its input to the root over its own connection with it (channel c); the
// root folds them in, one peer after another in rank order: the first with the root's own input
// (pre-operated), the last with the post-operation. No rank forwards anything: one hop. Three ranks
// at least (src/tuner.rs), so the first and the last peer differ.
template <typename T, typename Op, int P>
__device__ __noinline__ bool reduceDirect(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x, root = w.root;
  const Part pt = channelPart<T>(w.count, w.nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;  // used on the root only
  if (comm->rank != root) {
    Prims<T, Op, P> p(g, comm, op, &comm->conns[root * FN_MAX_CHANNELS + c].send, nullptr);
    const bool ok = forEachChunk<T>(pt.len, p.slotElems, [&](uint64_t base, uint64_t len) { return p.send(src + base, len); });
    if (ok) p.save();
    return ok;
  }
  for (int peer = 0, k = 0; peer < n; peer++) {
    if (peer == root) continue;
    const bool first = k == 0, last = k == n - 2;
    k++;
    Prims<T, Op, P> p(g, comm, op, nullptr, &comm->conns[peer * FN_MAX_CHANNELS + c].recv);
    const bool ok = forEachChunk<T>(pt.len, p.slotElems, [&](uint64_t base, uint64_t len) {
      constexpr int F = F_RECV | F_USRC | F_UDST;
      if (first) return p.template step<F | F_PRE>(src + base, dst + base, len);
      if (last) return p.template step<F | F_POST>(dst + base, dst + base, len);
      return p.template step<F>(dst + base, dst + base, len);
    });
    if (!ok) return false;
    p.save();
  }
  return true;
}

// Recursive doubling (FN_ALGO_RECDBL): log2(n) exchanges instead of the ring's n - 1 or 2(n - 1)
// hops, for small messages between hosts. In exchange d (d = 1, 2, 4, ...) rank r swaps with
// r ^ d over their own connection, chunk by chunk, each side sending its chunk before it receives
// the partner's (so at most one step waits in either FIFO). A reduction sends everything it has
// reduced so far and adds the partner's: a + b and b + a are the same bits, so every rank ends
// with the same result. src -> dst, len elements of channel c.
template <typename T, typename Op, int P>
__device__ __forceinline__ bool recDblReduce(const Group& g, const fnDevComm* comm, const Op& op, const T* src, T* dst,
                                             uint64_t len, int c) {
  const int n = comm->nRanks;
  for (int d = 1; d < n; d <<= 1) {
    fnConn* cn = &comm->conns[(comm->rank ^ d) * FN_MAX_CHANNELS + c];
    Prims<T, Op, P> p(g, comm, op, &cn->send, &cn->recv);
    const bool first = d == 1, last = 2 * d >= n;
    const bool ok = forEachChunk<T>(len, p.slotElems, [&](uint64_t base, uint64_t l) {
      constexpr int F = F_RECV | F_USRC | F_UDST;
      if (first) {
        if (!p.template step<F_SEND | F_USRC | F_PRE>(src + base, nullptr, l)) return false;
        return last ? p.template step<F | F_PRE | F_POST>(src + base, dst + base, l)
                    : p.template step<F | F_PRE>(src + base, dst + base, l);
      }
      if (!p.template step<F_SEND | F_USRC>(dst + base, nullptr, l)) return false;
      return last ? p.template step<F | F_POST>(dst + base, dst + base, l) : p.template step<F>(dst + base, dst + base, l);
    });
    if (!ok) return false;
    p.save();
  }
  return true;
}

template <typename T, typename Op, int P>
__device__ __noinline__ bool allReduceRecDbl(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const Part pt = channelPart<T>(w.count, w.nChannels, blockIdx.x);
  return recDblReduce<T, Op, P>(g, comm, op, static_cast<const T*>(w.sendbuff) + pt.off,
                                static_cast<T*>(w.recvbuff) + pt.off, pt.len, blockIdx.x);
}

// The reduce-scatter all-reduces the whole input into the communicator's scratch (the host keeps
// it within FN_RECDBL_SCRATCH and on one channel) and copies out its own piece: for the small
// inputs it runs at, log2(n) hops matter more than the bytes.
template <typename T, typename Op, int P>
__device__ __noinline__ bool reduceScatterRecDbl(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  if (w.nChannels != 1 || comm->scratch == nullptr) __trap();  // a host bug
  T* const all = static_cast<T*>(comm->scratch);
  if (!recDblReduce<T, Op, P>(g, comm, op, static_cast<const T*>(w.sendbuff), all, uint64_t(comm->nRanks) * w.count, 0))
    return false;
  reduceCopy<T, Op, F_USRC | F_UDST>(g, op, nullptr, all + uint64_t(comm->rank) * w.count, static_cast<T*>(w.recvbuff),
                                     nullptr, w.count);
  return true;
}

// Recursive doubling all-gather: in exchange d rank r holds the d pieces from piece r & ~(d - 1) on,
// sends them and receives the partner's d. One channel (the host plans no more), so those pieces
// are one contiguous block of the output.
template <typename T, typename Op, int P>
__device__ __noinline__ bool allGatherRecDbl(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  if (w.nChannels != 1) __trap();  // a host bug: the blocks below are whole pieces
  const int n = comm->nRanks, r = comm->rank;
  const T* src = static_cast<const T*>(w.sendbuff);
  T* const out = static_cast<T*>(w.recvbuff);
  for (int d = 1; d < n; d <<= 1) {
    fnConn* cn = &comm->conns[(r ^ d) * FN_MAX_CHANNELS];
    Prims<T, Op, P> p(g, comm, op, &cn->send, &cn->recv);
    T* const mine = out + uint64_t(r & ~(d - 1)) * w.count;
    T* const theirs = out + uint64_t((r ^ d) & ~(d - 1)) * w.count;
    const bool ok = forEachChunk<T>(uint64_t(d) * w.count, p.slotElems, [&](uint64_t base, uint64_t len) {
      if (!(d == 1 ? p.copySend(src + base, mine + base, len) : p.send(mine + base, len))) return false;
      return p.recv(theirs + base, len);
    });
    if (!ok) return false;
    p.save();
  }
  return true;
}

// From the root around the ring to the rank before it.
template <typename T, typename Op, int P>
__device__ __noinline__ bool broadcast(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, w.nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;  // used on the root only
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;
  if (n == 1) {
    if (src != dst) reduceCopy<T, Op, F_USRC | F_UDST>(g, op, nullptr, src, dst, nullptr, pt.len);
    return true;
  }
  const fnRing ring = comm->rings[c];
  const bool root = comm->rank == w.root, last = ring.next == w.root;
  Prims<T, Op, P> p = ringPrims<T, Op, P>(g, comm, op, ring, c);
  const bool ok = forEachChunk<T>(pt.len, p.slotElems, [&](uint64_t base, uint64_t len) {
    return root   ? p.copySend(src + base, dst + base, len)
           : last ? p.recv(dst + base, len)
                  : p.recvCopySend(dst + base, len);
  });
  if (ok) p.save();
  return ok;
}

// Broadcast without the ring: this rank receives from rank w.chan (-1: it is the root) and sends
// on to the ranks w.scalar lists (rank + 1 in each 4 bits, the first lowest), one after another,
// over their own connections (channel c). The first of them gets each step as it arrives, the
// others from this rank's output; the root copies its input to its own output with its first send.
// Across hosts of one rank the root sends to every rank; across hosts of several ranks to one rank
// of every other host, then to the next rank of its own, and every rank passes it on to the next of
// its host (src/plan/kernels.rs). For small messages across hosts (src/tuner.rs).
template <typename T, typename Op, int P>
__device__ __noinline__ bool broadcastDirect(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int c = blockIdx.x, from = w.chan;
  uint64_t to = w.scalar;
  const Part pt = channelPart<T>(w.count, w.nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;  // used on the root only
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;
  // The send half towards the first rank of a list.
  auto sendTo = [&](uint64_t list) { return &comm->conns[(int(list & 15) - 1) * FN_MAX_CHANNELS + c].send; };
  if (from >= 0) {
    Prims<T, Op, P> p(g, comm, op, to ? sendTo(to) : nullptr, &comm->conns[from * FN_MAX_CHANNELS + c].recv);
    const bool ok = forEachChunk<T>(pt.len, p.slotElems, [&](uint64_t base, uint64_t len) {
      return to ? p.recvCopySend(dst + base, len) : p.recv(dst + base, len);
    });
    if (!ok) return false;
    p.save();
    to >>= 4;
    src = dst;
  }
  bool copy = src != dst;
  for (; to; to >>= 4) {
    Prims<T, Op, P> p(g, comm, op, sendTo(to), nullptr);
    const bool ok = forEachChunk<T>(pt.len, p.slotElems, [&](uint64_t base, uint64_t len) {
      return copy ? p.copySend(src + base, dst + base, len) : p.send(src + base, len);
    });
    if (!ok) return false;
    p.save();
    copy = false;
  }
  return true;
}

// At step j every rank receives the block that originated at ring position ix - j.
template <typename T, typename Op, int P>
__device__ __noinline__ bool allGather(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, w.nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;
  T* const out = static_cast<T*>(w.recvbuff) + pt.off;
  auto block = [&](int rank) { return out + uint64_t(rank) * w.count; };
  if (n == 1) {
    if (src != block(0)) reduceCopy<T, Op, F_USRC | F_UDST>(g, op, nullptr, src, block(0), nullptr, pt.len);
    return true;
  }
  const fnRing ring = comm->rings[c];
  const int ix = ring.index;
  T* const mine = block(comm->rank);
  Prims<T, Op, P> p = ringPrims<T, Op, P>(g, comm, op, ring, c);
  const uint64_t S = p.slotElems;
  const bool ok = forEachChunk<T>(pt.len, ringChunkElems<P>(comm, S), [&](uint64_t base, uint64_t len) {
    if (!eachSlot(len, S, [&](uint64_t o, uint64_t l) { return p.copySend(src + base + o, mine + base + o, l); }))
      return false;
    for (int j = 1; j < n - 1; j++) {
      T* const to = block(ring.userRanks[ringMod(ix - j, n)]) + base;
      if (!eachSlot(len, S, [&](uint64_t o, uint64_t l) { return p.recvCopySend(to + o, l); })) return false;
    }
    T* const to = block(ring.userRanks[ringMod(ix + 1, n)]) + base;
    return eachSlot(len, S, [&](uint64_t o, uint64_t l) { return p.recv(to + o, l); });
  });
  if (ok) p.save();
  return ok;
}

// At step j every rank reduces into the block destined for ring position ix - j; it ends with its own.
template <typename T, typename Op, int P>
__device__ __noinline__ bool reduceScatter(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, w.nChannels, c);
  const T* const in = static_cast<const T*>(w.sendbuff) + pt.off;
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;
  auto block = [&](int rank) { return in + uint64_t(rank) * w.count; };
  if (n == 1) {
    reduceCopy<T, Op, F_USRC | F_UDST | F_PRE | F_POST>(g, op, nullptr, in, dst, nullptr, pt.len);
    return true;
  }
  const fnRing ring = comm->rings[c];
  const int ix = ring.index;
  Prims<T, Op, P> p = ringPrims<T, Op, P>(g, comm, op, ring, c);
  const uint64_t S = p.slotElems;
  const bool ok = forEachChunk<T>(pt.len, ringChunkElems<P>(comm, S), [&](uint64_t base, uint64_t len) {
    const T* from = block(ring.userRanks[ringMod(ix - 1, n)]) + base;
    if (!eachSlot(len, S, [&](uint64_t o, uint64_t l) { return p.send(from + o, l); })) return false;
    for (int j = 2; j < n; j++) {
      from = block(ring.userRanks[ringMod(ix - j, n)]) + base;
      if (!eachSlot(len, S, [&](uint64_t o, uint64_t l) { return p.recvReduceSend(from + o, l); })) return false;
    }
    from = block(comm->rank) + base;
    return eachSlot(len, S, [&](uint64_t o, uint64_t l) { return p.recvReduceCopy(from + o, dst + base + o, l); });
  });
  if (ok) p.save();
  return ok;
}

// Point-to-point, always in bytes whatever the kernel's type: slot-sized steps of the work's
// protocol on one connection (LL for small parts, where Simple's fence and step counter cost more
// than the copy; Simple otherwise: src/plan/kernels.rs).
template <int P>
__device__ __noinline__ bool p2pSend(const Group g, const fnDevComm* comm, const fnWork w) {
  const OpNone<uint8_t> op;
  Prims<uint8_t, OpNone<uint8_t>, P> p(g, comm, op, &comm->conns[w.root * FN_MAX_CHANNELS + w.chan].send, nullptr);
  const uint8_t* src = static_cast<const uint8_t*>(w.sendbuff);
  const uint64_t step = w.scalar ? min(w.scalar, p.slotElems) : p.slotElems;
  for (uint64_t off = 0; off < w.count; off += step) {
    if (!p.send(src + off, min(step, w.count - off))) return false;
  }
  p.save();
  return true;
}
template <int P>
__device__ __noinline__ bool p2pRecv(const Group g, const fnDevComm* comm, const fnWork w) {
  const OpNone<uint8_t> op;
  Prims<uint8_t, OpNone<uint8_t>, P> p(g, comm, op, nullptr, &comm->conns[w.root * FN_MAX_CHANNELS + w.chan].recv);
  uint8_t* dst = static_cast<uint8_t*>(w.recvbuff);
  const uint64_t step = w.scalar ? min(w.scalar, p.slotElems) : p.slotElems;
  for (uint64_t off = 0; off < w.count; off += step) {
    if (!p.recv(dst + off, min(step, w.count - off))) return false;
  }
  p.save();
  return true;
}
__device__ __forceinline__ void p2pCopy(const Group& g, const fnWork& w) {
  reduceCopy<uint8_t, OpNone<uint8_t>, F_USRC | F_UDST>(g, OpNone<uint8_t>(), nullptr,
                                                        static_cast<const uint8_t*>(w.sendbuff),
                                                        static_cast<uint8_t*>(w.recvbuff), nullptr, w.count);
}

// The part of a p2p work that CTA b runs (nParts contiguous, FN_ALIGN-aligned byte ranges over
// consecutive channels), or false when b runs none of it.
__device__ __forceinline__ bool p2pPart(const fnWork& w, int b, fnWork& part) {
  const int parts = w.nParts ? w.nParts : 1, j = b - w.blk;
  if (j < 0 || j >= parts) return false;
  const uint64_t per = alignUp(divUp(w.count, parts), FN_ALIGN);
  const uint64_t lo = min(uint64_t(j) * per, w.count);
  part = w;
  part.count = min(lo + per, w.count) - lo;
  part.chan = w.chan + j;
  if (w.sendbuff) part.sendbuff = static_cast<const uint8_t*>(w.sendbuff) + lo;
  if (w.recvbuff) part.recvbuff = static_cast<uint8_t*>(w.recvbuff) + lo;
  return true;
}

#include "symmetric.cuh"

// Calls f with the work's protocol as a compile-time constant (std::integral_constant).
template <typename F>
__device__ __forceinline__ bool byProto(int proto, F f) {
  switch (proto) {
    case FN_PROTO_LL: return f(std::integral_constant<int, FN_PROTO_LL>());
    case FN_PROTO_LL128: return f(std::integral_constant<int, FN_PROTO_LL128>());
    default: return f(std::integral_constant<int, FN_PROTO_SIMPLE>());
  }
}

// Runs the launch's works in order. A collective runs on CTAs 0..nChannels-1 (CTA b = channel b); a p2p work
// only on CTAs blk..blk+nParts-1. A p2p-only CTA holding both sends and receives splits into a send half
// (sends and copies) and a receive half that progress independently.
template <typename T, typename Op>
__device__ __forceinline__ void runWorks(const fnKernelArgs& args) {
  const fnDevComm* comm = args.comm;
  const int nWorks = args.nWorks, b = blockIdx.x;
  bool collective = false, sends = false, recvs = false;
  for (int i = 0; i < nWorks; i++) {
    const int type = args.works[i].type;
    collective |= type < FN_WORK_SEND;
    fnWork part;
    if (type >= FN_WORK_SEND && p2pPart(args.works[i], b, part)) {
      sends |= type == FN_WORK_SEND || type == FN_WORK_COPY;
      recvs |= type == FN_WORK_RECV;
    }
  }
  const bool split = !collective && sends && recvs;
  const bool recvHalf = split && threadIdx.x >= FN_NTHREADS / 2;
  const Group g = split ? Group{int(threadIdx.x % (FN_NTHREADS / 2)), FN_NTHREADS / 2, recvHalf ? 2 : 1}
                        : Group{int(threadIdx.x), FN_NTHREADS, 0};
  for (int i = 0; i < nWorks; i++) {
    const fnWork w = args.works[i];
    bool ok = true;
    if constexpr (Op::kReduce) {
      // A reduction kernel gets AllReduce, Reduce and ReduceScatter works only: the host sends
      // broadcast, all-gather and point-to-point works to fnCopy (src/plan/kernels.rs), so this
      // kernel does not carry their code. Anything else is a host bug: stop loudly.
      if (w.type != FN_WORK_ALLREDUCE && w.type != FN_WORK_REDUCE && w.type != FN_WORK_REDUCESCATTER) __trap();
      if (b >= w.nChannels) continue;
      const Op op(w, comm->nRanks);
      if (w.algo == FN_ALGO_SYMMETRIC) {
        ok = symReduceWork<T, Op>(g, comm, w, op);
      } else if (w.type == FN_WORK_ALLREDUCE && w.algo == FN_ALGO_ONESHOT && comm->nRanks == 2) {
        ok = byProto(w.proto, [&](auto P) { return allReduceOneShotPair<T, Op, decltype(P)::value>(g, comm, w, op); });
      } else if (w.type == FN_WORK_ALLREDUCE && w.algo == FN_ALGO_ONESHOT) {
        ok = allReduceOneShot<T, Op>(g, comm, w, op);
      } else if (w.type == FN_WORK_REDUCE && w.algo == FN_ALGO_DIRECT) {
        ok = byProto(w.proto, [&](auto P) { return reduceDirect<T, Op, decltype(P)::value>(g, comm, w, op); });
      } else if (w.type == FN_WORK_ALLREDUCE && w.algo == FN_ALGO_RECDBL) {
        ok = byProto(w.proto, [&](auto P) { return allReduceRecDbl<T, Op, decltype(P)::value>(g, comm, w, op); });
      } else if (w.type == FN_WORK_REDUCESCATTER && w.algo == FN_ALGO_RECDBL) {
        ok = byProto(w.proto, [&](auto P) { return reduceScatterRecDbl<T, Op, decltype(P)::value>(g, comm, w, op); });
      } else if (w.type == FN_WORK_ALLREDUCE && w.algo == FN_ALGO_TREE) {
        ok = byProto(w.proto, [&](auto P) { return allReduceTree<T, Op, decltype(P)::value>(g, comm, w, op); });
      } else {
        ok = byProto(w.proto, [&](auto P) {
          if (w.type == FN_WORK_ALLREDUCE) return allReduce<T, Op, decltype(P)::value>(g, comm, w, op);
          if (w.type == FN_WORK_REDUCE) return reduce<T, Op, decltype(P)::value>(g, comm, w, op);
          return reduceScatter<T, Op, decltype(P)::value>(g, comm, w, op);
        });
      }
    } else {
      using B = typename BitsOf<sizeof(T)>::type;
      switch (w.type) {
        case FN_WORK_SEND:
        case FN_WORK_COPY:
        case FN_WORK_RECV: {
          fnWork part;
          if (!p2pPart(w, b, part) || (split && recvHalf != (w.type == FN_WORK_RECV))) continue;
          if (part.count == 0) continue;  // both ends skip the same empty part
          const bool ll = part.proto == FN_PROTO_LL;
          if (w.type == FN_WORK_SEND) ok = ll ? p2pSend<FN_PROTO_LL>(g, comm, part) : p2pSend<FN_PROTO_SIMPLE>(g, comm, part);
          else if (w.type == FN_WORK_RECV) ok = ll ? p2pRecv<FN_PROTO_LL>(g, comm, part) : p2pRecv<FN_PROTO_SIMPLE>(g, comm, part);
          else p2pCopy(g, part);
          break;
        }
        // Pure movement, in bytes.
        case FN_WORK_BROADCAST:
          if (b >= w.nChannels) continue;
          ok = byProto(w.proto, [&](auto P) {
            using Pr = decltype(P);
            if (w.algo == FN_ALGO_DIRECT) return broadcastDirect<B, OpNone<B>, Pr::value>(g, comm, w, OpNone<B>());
            return broadcast<B, OpNone<B>, Pr::value>(g, comm, w, OpNone<B>());
          });
          break;
        case FN_WORK_ALLGATHER:
          if (b >= w.nChannels) continue;
          if (w.algo == FN_ALGO_SYMMETRIC) {
            ok = symAllGather(g, comm, w);
            break;
          }
          if (w.algo == FN_ALGO_RECDBL) {
            ok = byProto(w.proto, [&](auto P) { return allGatherRecDbl<B, OpNone<B>, decltype(P)::value>(g, comm, w, OpNone<B>()); });
            break;
          }
          ok = byProto(w.proto, [&](auto P) { return allGather<B, OpNone<B>, decltype(P)::value>(g, comm, w, OpNone<B>()); });
          break;
        default:
          __trap();  // a reduction sent to fnCopy: a host bug
      }
    }
    if (!ok) return;  // the whole group stops together: the decision came through a barrier
  }
}

// fnDataType -> the element type its kernels compute on. The generated units name kernels by
// the enums, so a kernel's name, its host-side id and its C++ type come from one list.
template <int D> struct DevType;
template <> struct DevType<FN_INT8> { using T = int8_t; };
template <> struct DevType<FN_UINT8> { using T = uint8_t; };
template <> struct DevType<FN_INT32> { using T = int32_t; };
template <> struct DevType<FN_UINT32> { using T = uint32_t; };
template <> struct DevType<FN_INT64> { using T = int64_t; };
template <> struct DevType<FN_UINT64> { using T = uint64_t; };
template <> struct DevType<FN_FLOAT16> { using T = __half; };
template <> struct DevType<FN_FLOAT32> { using T = float; };
template <> struct DevType<FN_FLOAT64> { using T = double; };
template <> struct DevType<FN_BFLOAT16> { using T = __nv_bfloat16; };
template <> struct DevType<FN_FP8E4M3> { using T = __nv_fp8_e4m3; };
template <> struct DevType<FN_FP8E5M2> { using T = __nv_fp8_e5m2; };

// fnRedOp -> the operator over element type T.
template <int O, typename T> struct DevOp;
template <typename T> struct DevOp<FN_OP_SUM, T> { using Op = OpSum<T>; };
template <typename T> struct DevOp<FN_OP_PROD, T> { using Op = OpProd<T>; };
template <typename T> struct DevOp<FN_OP_MAX, T> { using Op = OpMax<T>; };
template <typename T> struct DevOp<FN_OP_MIN, T> { using Op = OpMin<T>; };
template <typename T> struct DevOp<FN_OP_PREMULSUM, T> { using Op = OpPreMulSum<T>; };
template <typename T> struct DevOp<FN_OP_SUMPOSTDIV, T> { using Op = OpSumPostDiv<T>; };

// The kernels. __grid_constant__ lets the works be indexed in parameter space without a local copy;
// the parameter layout is the plain fnKernelArgs one.
#define FN_KERNEL_HEAD_(name) \
  extern "C" __global__ void __launch_bounds__(FN_NTHREADS, 1) name(const __grid_constant__ fnKernelArgs args)
// fnColl_<type>_<op>: every work type, reductions specialised for data type D and operator O.
#define FN_COLL_KERNEL(name, D, O) \
  FN_KERNEL_HEAD_(name) { runWorks<typename DevType<D>::T, typename DevOp<O, typename DevType<D>::T>::Op>(args); }
// fnCopy: bytes, no reduction.
#define FN_COPY_KERNEL(name) \
  FN_KERNEL_HEAD_(name) { runWorks<uint8_t, OpNone<uint8_t>>(args); }
