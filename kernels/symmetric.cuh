// symmetric.cuh: the symmetric kernels (FN_ALGO_SYMMETRIC). When a collective's buffers lie in
// symmetric windows and the whole communicator is one LSA team, every rank reaches every peer's
// buffers through the windows' flat mapping (rank q's byte o at base + q * stride * 4 GiB + o), so
// a collective is loads and stores of peers' memory between two barriers, with no FIFO. Included
// by collectives.cuh (it uses its partition rules); see kernels/README.md, "Symmetric kernels".
#pragma once
#include "common.cuh"
#include "reduce_ops.cuh"

__device__ __forceinline__ uint64_t symStride(uint32_t stride4G) { return uint64_t(stride4G) << 32; }

__device__ __forceinline__ void storeReleaseSys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Barrier of channel c's CTA with channel c's CTA of every rank (fnDevComm.symSync). Each rank
// counts its barriers per channel; arriving, it stores the new count into its slot of every rank's
// inbox (a system-scope release after the whole CTA's accesses), then waits until every rank's
// count in its own inbox has reached it. Every rank runs the same collectives on the same channels,
// so the counts agree without a reset. Returns false when a wait told the group to stop.
__device__ __noinline__ bool symBarrier(const Group g, const fnDevComm* comm, int c) {
  const int n = comm->nRanks, me = comm->rank;
  const uint64_t stride = symStride(comm->symStride4G);
  char* const base = reinterpret_cast<char*>(comm->symSync);
  uint64_t* const mine = reinterpret_cast<uint64_t*>(base + me * stride);
  groupBarrier(g);  // every thread's loads and stores of peers' memory so far are done
  int stop = FN_DEV_OK;
  const uint64_t epoch = loadVolatile(&mine[c]) + 1;
  for (int q = g.tid; q < n; q += g.nthreads) {
    uint64_t* peer = reinterpret_cast<uint64_t*>(base + q * stride);
    storeReleaseSys(&peer[2 * FN_MAX_CHANNELS + c * n + me], epoch);
  }
  for (int q = g.tid; q < n && stop == FN_DEV_OK; q += g.nthreads) {
    stop = waitCounter(comm, &mine[2 * FN_MAX_CHANNELS + c * n + q], 1, epoch);
  }
  if (groupBarrierAny(g, stop != FN_DEV_OK)) return false;
  if (g.tid == 0) *reinterpret_cast<volatile uint64_t*>(&mine[c]) = epoch;
  return true;
}

// Rank q's operator: PreMulSum scales each rank's input by that rank's own scalar, which each rank
// publishes in its barrier region before the first barrier; other operators are alike everywhere.
template <typename T, typename Op>
__device__ __forceinline__ Op symOpOf(const fnDevComm* comm, const Op& op, int q, int c) {
  if constexpr (Op::kPre) {
    Op o = op;
    const char* region = reinterpret_cast<const char*>(comm->symSync) + q * symStride(comm->symStride4G);
    const uint64_t bits = loadVolatile(reinterpret_cast<const uint64_t*>(region) + FN_MAX_CHANNELS + c);
    memcpy(&o.scalar, &bits, sizeof(T));
    return o;
  } else {
    return op;
  }
}

// Reduces len elements at byte offset src of every rank's send buffer, in rank order with each
// rank's pre applied to its input (every rank computes a given element the same way), applies post, and stores the
// result at byte offset dst of every rank's receive buffer (all) or of ours only. Each element is
// loaded and stored by one thread, loads first, so in-place works are safe. Peers' memory is read
// with volatile loads: another rank may have stored it earlier in this launch.
template <typename T, typename Op>
__device__ __forceinline__ void symReduce(const Group& g, const fnDevComm* comm, const fnWork& w, const Op& op,
                                          uint64_t src, uint64_t dst, uint64_t len, bool all) {
  const int n = comm->nRanks, me = comm->rank;
  const uint64_t ss = symStride(w.sendStride4G), rs = symStride(w.recvStride4G);
  const char* sb = static_cast<const char*>(w.sendbuff) + src;
  char* rb = static_cast<char*>(w.recvbuff) + dst;
  const int q0 = all ? 0 : me, q1 = all ? n : me + 1;
  constexpr int N = 16 / sizeof(T);
  const bool vec = ((reinterpret_cast<uintptr_t>(sb) | reinterpret_cast<uintptr_t>(rb)) & 15) == 0;
  const uint64_t nPacks = vec ? len / N : 0;
  for (uint64_t k = g.tid; k < nPacks; k += g.nthreads) {
    uint4 acc = combineVec<T, Op, F_USRC | F_PRE>(symOpOf<T>(comm, op, 0, blockIdx.x), uint4{}, loadVolatile16(sb + k * 16));
    for (int q = 1; q < n; q++) {
      acc = combineVec<T, Op, F_RECV | F_USRC | F_PRE>(symOpOf<T>(comm, op, q, blockIdx.x), acc,
                                                       loadVolatile16(sb + q * ss + k * 16));
    }
    acc = combineVec<T, Op, F_RECV | F_POST>(op, acc, uint4{});
    for (int q = q0; q < q1; q++) *reinterpret_cast<uint4*>(rb + q * rs + k * 16) = acc;
  }
  for (uint64_t i = nPacks * N + g.tid; i < len; i += g.nthreads) {
    T acc = combine<T, Op, F_USRC | F_PRE>(symOpOf<T>(comm, op, 0, blockIdx.x), T{},
                                           loadVolatile(reinterpret_cast<const T*>(sb) + i));
    for (int q = 1; q < n; q++) {
      acc = combine<T, Op, F_RECV | F_USRC | F_PRE>(symOpOf<T>(comm, op, q, blockIdx.x), acc,
                                                    loadVolatile(reinterpret_cast<const T*>(sb + q * ss) + i));
    }
    acc = combine<T, Op, F_RECV | F_POST>(op, acc, T{});
    for (int q = q0; q < q1; q++) reinterpret_cast<T*>(rb + q * rs)[i] = acc;
  }
}

// AllReduce: rank r reduces its 1/n slice of the buffer (FN_ALIGN-aligned, then split over the
// channels) from every rank's input and stores it into every rank's output. ReduceScatter: rank r
// reduces its block from every rank's input into its own output. Between two barriers: the first
// says every rank's input is ready and its output free, the second that every access to this
// rank's memory is over, so the buffers may be reused as soon as the kernel ends.
template <typename T, typename Op>
__device__ __noinline__ bool symReduceWork(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, me = comm->rank, c = blockIdx.x;
  uint64_t src, dst, len;
  bool all;
  if (w.type == FN_WORK_ALLREDUCE) {
    const uint64_t per = alignUp(divUp(w.count, n), FN_ALIGN / sizeof(T));
    const uint64_t lo = min(uint64_t(me) * per, w.count);
    const Part pt = channelPart<T>(min(lo + per, w.count) - lo, w.nChannels, c);
    src = dst = (lo + pt.off) * sizeof(T);
    len = pt.len;
    all = true;
  } else {
    const Part pt = channelPart<T>(w.count, w.nChannels, c);
    src = (uint64_t(me) * w.count + pt.off) * sizeof(T);
    dst = pt.off * sizeof(T);
    len = pt.len;
    all = false;
  }
  if constexpr (Op::kPre) {
    if (g.tid == 0) {
      uint64_t bits = 0;
      memcpy(&bits, &op.scalar, sizeof(T));
      char* region = reinterpret_cast<char*>(comm->symSync) + me * symStride(comm->symStride4G);
      reinterpret_cast<volatile uint64_t*>(region)[FN_MAX_CHANNELS + c] = bits;
    }
  }
  if (!symBarrier(g, comm, c)) return false;
  symReduce<T, Op>(g, comm, w, op, src, dst, len, all);
  return symBarrier(g, comm, c);
}

// AllGather (bytes): rank r stores its channel's part of its input into block r of every rank's
// output, between the same two barriers. In place, its own block is left as it is.
__device__ __noinline__ bool symAllGather(const Group g, const fnDevComm* comm, const fnWork w) {
  const int n = comm->nRanks, me = comm->rank, c = blockIdx.x;
  const Part pt = channelPart<uint8_t>(w.count, w.nChannels, c);
  const uint64_t rs = symStride(w.recvStride4G);
  const char* src = static_cast<const char*>(w.sendbuff) + me * symStride(w.sendStride4G) + pt.off;
  char* dst = static_cast<char*>(w.recvbuff) + me * w.count + pt.off;
  if (!symBarrier(g, comm, c)) return false;
  const bool vec = ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0;
  const uint64_t nPacks = vec ? pt.len / 16 : 0;
  for (uint64_t k = g.tid; k < nPacks; k += g.nthreads) {
    const uint4 v = loadVolatile16(src + k * 16);
    for (int q = 0; q < n; q++) {
      if (dst + q * rs != src) *reinterpret_cast<uint4*>(dst + q * rs + k * 16) = v;
    }
  }
  for (uint64_t i = nPacks * 16 + g.tid; i < pt.len; i += g.nthreads) {
    const uint8_t v = loadVolatile(reinterpret_cast<const uint8_t*>(src) + i);
    for (int q = 0; q < n; q++) {
      if (dst + q * rs != src) dst[q * rs + i] = char(v);
    }
  }
  return symBarrier(g, comm, c);
}
