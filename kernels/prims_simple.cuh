// prims_simple.cuh: the Simple protocol's data mover. A step's data goes into the receiver's FIFO
// slot as plain 16-byte stores; Prims (prims.cuh) then fences and publishes the step count.
#pragma once
#include "common.cuh"
#include "reduce_ops.cuh"
#include <type_traits>

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
      const uint4 r = combineVec<T, Op, F>(op, rv[u], uv[u]);
      if constexpr (F & F_UDST) dp[i + u * nt] = r;
      if constexpr (F & F_SEND) sp[i + u * nt] = r;
    }
  }
  for (; i < nPacks; i += nt) {
    uint4 rv{}, uv{};
    if constexpr (F & F_RECV) rv = loadVolatile16(rp + i);
    if constexpr (F & F_USRC) uv = up[i];
    const uint4 r = combineVec<T, Op, F>(op, rv, uv);
    if constexpr (F & F_UDST) dp[i] = r;
    if constexpr (F & F_SEND) sp[i] = r;
  }
}


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
