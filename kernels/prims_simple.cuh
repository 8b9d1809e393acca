// prims_simple.cuh: the Simple protocol. Data goes into the receiver's FIFO slot; after a system
// fence the sender publishes the step count in the receiver's tail; the receiver publishes how many
// slots it has consumed in the sender's head. See kernels/README.md for the step rules.
#pragma once
#include "common.cuh"
#include "reduce_ops.cuh"
#include <type_traits>

// What one data movement reads and writes (template flags of reduceCopy and Prims::step).
enum : int {
  F_RECV = 1,   // source: the receive FIFO slot
  F_USRC = 2,   // source: the user's input
  F_UDST = 4,   // destination: the user's output
  F_SEND = 8,   // destination: the send FIFO slot (the peer's)
  F_PRE = 16,   // apply Op::pre to the user's input (it enters a reduction)
  F_POST = 32,  // apply Op::post to the result (it is a final reduced value)
};

// The per-element result of a movement: reduce(recv, pre(user)), then post.
template <typename T, typename Op, int F>
__device__ __forceinline__ T combine(const Op& op, T rv, T uv) {
  if constexpr ((F & F_USRC) && (F & F_PRE)) uv = op.pre(uv);
  T r;
  if constexpr ((F & F_RECV) && (F & F_USRC)) r = op.reduce(rv, uv);
  else if constexpr (F & F_RECV) r = rv;
  else r = uv;
  if constexpr (F & F_POST) r = op.post(r);
  return r;
}

// combine() over a 16-byte pack; a pure copy keeps the pack untouched.
template <typename T, typename Op, int F>
__device__ __forceinline__ uint4 combinePack(const Op& op, uint4 rv, uint4 uv) {
  constexpr bool kArith = ((F & F_RECV) && (F & F_USRC)) || (F & (F_PRE | F_POST));
  if constexpr (!kArith) {
    return (F & F_RECV) ? rv : uv;
  } else {
    constexpr int N = 16 / sizeof(T);
    T a[N], b[N];
    memcpy(a, &rv, 16);
    memcpy(b, &uv, 16);
#pragma unroll
    for (int i = 0; i < N; i++) a[i] = combine<T, Op, F>(op, a[i], b[i]);
    memcpy(&rv, a, 16);
    return rv;
  }
}

// Moves n elements as F says, spread over the group's threads. 16-byte vectors where every pointer
// involved has the same address modulo 16 (after a short elementwise head); elementwise otherwise.
// User pointers are not __restrict__: in-place works alias input and output (each element is read
// and written by the same thread, loads before stores). Out of line and taking everything by value:
// one body per (T, Op, F) keeps register pressure local and the module small.
template <typename T, typename Op, int F>
__device__ __noinline__ void reduceCopyImpl(const Group g, const Op op, const T* rsrc, const T* usrc, T* udst,
                                            T* sdst, size_t n) {
  constexpr int N = 16 / sizeof(T);  // elements per pack
  // Packs in flight per thread; 16-lane 8-bit arithmetic (worst: integer division) would need more
  // than the 128 registers a 512-thread CTA allows at 4.
  constexpr int U = sizeof(T) > 1 || std::is_same_v<Op, OpNone<T>> ? 4 : Op::kPost ? 1 : 2;
  // All pointers used must agree modulo 16 for the vector path.
  uintptr_t mis = 0, diff = 0;
  bool first = true;
  auto note = [&](const void* p) {
    const uintptr_t m = reinterpret_cast<uintptr_t>(p) & 15;
    if (first) mis = m, first = false;
    diff |= m ^ mis;
  };
  if (F & F_RECV) note(rsrc);
  if (F & F_USRC) note(usrc);
  if (F & F_UDST) note(udst);
  if (F & F_SEND) note(sdst);
  size_t head = n, nPacks = 0;
  if (diff == 0) {
    head = ((16 - mis) & 15) / sizeof(T);
    if (head > n) head = n;
    nPacks = (n - head) / N;
  }
  const size_t tailStart = head + nPacks * N;

  // Elementwise: the unaligned head and the tail after the last whole pack.
  const size_t nScalar = head + (n - tailStart);
  for (size_t k = g.tid; k < nScalar; k += g.nthreads) {
    const size_t i = k < head ? k : tailStart + (k - head);
    T rv{}, uv{};
    if constexpr (F & F_RECV) rv = loadVolatile(rsrc + i);
    if constexpr (F & F_USRC) uv = usrc[i];
    const T r = combine<T, Op, F>(op, rv, uv);
    if constexpr (F & F_UDST) udst[i] = r;
    if constexpr (F & F_SEND) sdst[i] = r;
  }

  const uint4* rp = reinterpret_cast<const uint4*>(rsrc + head);
  const uint4* up = reinterpret_cast<const uint4*>(usrc + head);
  uint4* dp = reinterpret_cast<uint4*>(udst + head);
  uint4* sp = reinterpret_cast<uint4*>(sdst + head);
  const size_t nt = g.nthreads;
  size_t i = g.tid;
  // U packs per thread per round: all loads issued before any store keeps U*16 bytes in flight.
  for (; i + (U - 1) * nt < nPacks; i += U * nt) {
    uint4 rv[U], uv[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      if constexpr (F & F_RECV) rv[u] = loadVolatile16(rp + i + u * nt);
      if constexpr (F & F_USRC) uv[u] = up[i + u * nt];
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const uint4 r = combinePack<T, Op, F>(op, rv[u], uv[u]);
      if constexpr (F & F_UDST) dp[i + u * nt] = r;
      if constexpr (F & F_SEND) sp[i + u * nt] = r;
    }
  }
  for (; i < nPacks; i += nt) {
    uint4 rv{}, uv{};
    if constexpr (F & F_RECV) rv = loadVolatile16(rp + i);
    if constexpr (F & F_USRC) uv = up[i];
    const uint4 r = combinePack<T, Op, F>(op, rv, uv);
    if constexpr (F & F_UDST) dp[i] = r;
    if constexpr (F & F_SEND) sp[i] = r;
  }
}


// Same-width unsigned storage: movements that only copy run on it, so every kernel of the module
// shares the few copy bodies instead of compiling its own.
template <int W> struct BitsOf;
template <> struct BitsOf<1> { using type = uint8_t; };
template <> struct BitsOf<2> { using type = uint16_t; };
template <> struct BitsOf<4> { using type = uint32_t; };
template <> struct BitsOf<8> { using type = uint64_t; };

template <typename T, typename Op, int F>
__device__ __forceinline__ void reduceCopy(const Group& g, const Op& op, const T* rsrc, const T* usrc, T* udst,
                                           T* sdst, size_t n) {
  constexpr bool kArith = ((F & F_RECV) && (F & F_USRC)) || ((F & F_PRE) && Op::kPre) || ((F & F_POST) && Op::kPost);
  if constexpr (kArith) {
    reduceCopyImpl<T, Op, F>(g, op, rsrc, usrc, udst, sdst, n);
  } else {
    using B = typename BitsOf<sizeof(T)>::type;
    constexpr int FC = F & (F_RECV | F_USRC | F_UDST | F_SEND);
    reduceCopyImpl<B, OpNone<B>, FC>(g, OpNone<B>(), reinterpret_cast<const B*>(rsrc),
                                     reinterpret_cast<const B*>(usrc), reinterpret_cast<B*>(udst),
                                     reinterpret_cast<B*>(sdst), n);
  }
}

// One ring/p2p endpoint pair of a group: the send half towards one peer and the receive half from
// another (either may be absent). Step counters live in registers (every thread keeps the same
// copy) for the duration of a work and are written back by save().
template <typename T, typename Op>
struct Prims {
  const Group g;
  const fnDevComm* comm;
  const Op op;
  fnConnSend* sendConn;
  fnConnRecv* recvConn;
  char* sendBuff = nullptr;
  char* recvBuff = nullptr;
  uint64_t sendStep = 0, recvStep = 0;
  const uint32_t slotBytes;

  __device__ Prims(const Group& g_, const fnDevComm* comm_, const Op& op_, fnConnSend* s, fnConnRecv* r)
      : g(g_), comm(comm_), op(op_), sendConn(s), recvConn(r), slotBytes(uint32_t(comm_->slotBytes)) {
    // The counters may have been advanced by this group's previous work: read them volatile.
    if (s) {
      sendBuff = s->buff;
      sendStep = *reinterpret_cast<volatile uint64_t*>(&s->step);
    }
    if (r) {
      recvBuff = r->buff;
      recvStep = *reinterpret_cast<volatile uint64_t*>(&r->step);
    }
  }

  // One FIFO step: wait for the slot(s), move n elements (n <= slot elements, may be 0), publish.
  template <int F>
  __device__ __forceinline__ bool step(const T* usrc, T* udst, size_t n) {
    constexpr bool R = F & F_RECV, S = F & F_SEND;
    int stop = FN_DEV_OK;
    if (g.tid == 0) {
      if (R) stop = waitCounter(comm, recvConn->tail, 0, recvStep);
      if (S && stop == FN_DEV_OK) stop = waitCounter(comm, sendConn->head, FN_NSTEPS, sendStep);
    }
    if (groupBarrierAny(g, stop != FN_DEV_OK)) return false;
    const T* rslot = R ? reinterpret_cast<const T*>(recvBuff + (recvStep % FN_NSTEPS) * slotBytes) : nullptr;
    T* sslot = S ? reinterpret_cast<T*>(sendBuff + (sendStep % FN_NSTEPS) * slotBytes) : nullptr;
    reduceCopy<T, Op, F>(g, op, rslot, usrc, udst, sslot, n);
    groupBarrier(g);
    if (g.tid == 0) {
      if (S) {
        __threadfence_system();  // the group's slot stores (ordered by the barrier) before the tail
        *sendConn->tail = sendStep + 1;
      }
      if (R) *recvConn->head = recvStep + 1;
    }
    if (S) sendStep++;
    if (R) recvStep++;
    return true;
  }

  // The ring primitives (PRE/POST are identities except for PreMulSum / SumPostDiv).
  __device__ bool send(const T* src, size_t n) { return step<F_SEND | F_USRC | F_PRE>(src, nullptr, n); }
  __device__ bool recvReduceSend(const T* src, size_t n) {
    return step<F_RECV | F_SEND | F_USRC | F_PRE>(src, nullptr, n);
  }
  __device__ bool recvReduceCopySend(const T* src, T* dst, size_t n) {
    return step<F_RECV | F_SEND | F_USRC | F_UDST | F_PRE | F_POST>(src, dst, n);
  }
  __device__ bool recvReduceCopy(const T* src, T* dst, size_t n) {
    return step<F_RECV | F_USRC | F_UDST | F_PRE | F_POST>(src, dst, n);
  }
  __device__ bool recvCopySend(T* dst, size_t n) { return step<F_RECV | F_SEND | F_UDST>(nullptr, dst, n); }
  __device__ bool recv(T* dst, size_t n) { return step<F_RECV | F_UDST>(nullptr, dst, n); }
  // Data movement without reduction: forward src (and copy it to dst unless it is already there).
  __device__ bool copySend(const T* src, T* dst, size_t n) {
    return src == dst ? step<F_SEND | F_USRC>(src, nullptr, n) : step<F_SEND | F_USRC | F_UDST>(src, dst, n);
  }

  // Persist the counters for the next work / launch, then let the group re-read them.
  __device__ void save() {
    if (g.tid == 0) {
      if (sendConn) *reinterpret_cast<volatile uint64_t*>(&sendConn->step) = sendStep;
      if (recvConn) *reinterpret_cast<volatile uint64_t*>(&recvConn->step) = recvStep;
    }
    groupBarrier(g);
  }
};
