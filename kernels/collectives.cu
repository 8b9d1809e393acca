// collectives.cu: ring algorithms over the Simple protocol for every work type, and the extern "C"
// kernels (one per data type x reduction op, plus fnCopy). See kernels/README.md for the contract.
#include "prims_simple.cuh"

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

// The ring connections of channel c: send to next, receive from prev.
template <typename T, typename Op>
__device__ __forceinline__ Prims<T, Op> ringPrims(const Group& g, const fnDevComm* comm, const Op& op,
                                                  const fnRing& ring, int c) {
  return Prims<T, Op>(g, comm, op, &comm->conns[ring.next * FN_MAX_CHANNELS + c].send,
                      &comm->conns[ring.prev * FN_MAX_CHANNELS + c].recv);
}

// Each algorithm returns false when a wait told the group to stop (abort, error, timeout). They are
// out of line (arguments by value) so kernels sharing template arguments share one body.

template <typename T, typename Op>
__device__ __noinline__ bool allReduce(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, comm->nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;
  if (n == 1) {
    reduceCopy<T, Op, F_USRC | F_UDST | F_PRE | F_POST>(g, op, nullptr, src, dst, nullptr, pt.len);
    return true;
  }
  const fnRing ring = comm->rings[c];
  const int ix = ring.index;
  Prims<T, Op> p = ringPrims<T, Op>(g, comm, op, ring, c);
  const uint64_t slotElems = p.slotBytes / sizeof(T);
  for (uint64_t base = 0; base < pt.len;) {
    // n chunks of C elements per piece; chunk i is the one ring position i finishes reducing.
    const uint64_t C = chunkElems<T>(pt.len - base, n, slotElems);
    auto off = [&](int i) { return min(base + i * C, pt.len); };
    auto len = [&](int i) { return min(base + (i + 1) * C, pt.len) - off(i); };
    int i = ringMod(ix - 1, n);
    if (!p.send(src + off(i), len(i))) return false;
    for (int j = 2; j < n; j++) {
      i = ringMod(ix - j, n);
      if (!p.recvReduceSend(src + off(i), len(i))) return false;
    }
    i = ix;
    if (!p.recvReduceCopySend(src + off(i), dst + off(i), len(i))) return false;
    for (int j = 1; j < n - 1; j++) {
      i = ringMod(ix - j, n);
      if (!p.recvCopySend(dst + off(i), len(i))) return false;
    }
    i = ringMod(ix + 1, n);
    if (!p.recv(dst + off(i), len(i))) return false;
    base += uint64_t(n) * C;
  }
  p.save();
  return true;
}

// Chain from the rank after the root around to the root.
template <typename T, typename Op>
__device__ __noinline__ bool reduce(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, comm->nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;  // used on the root only
  if (n == 1) {
    reduceCopy<T, Op, F_USRC | F_UDST | F_PRE | F_POST>(g, op, nullptr, src, dst, nullptr, pt.len);
    return true;
  }
  const fnRing ring = comm->rings[c];
  const bool first = ring.prev == w.root, root = comm->rank == w.root;
  Prims<T, Op> p = ringPrims<T, Op>(g, comm, op, ring, c);
  const uint64_t slotElems = p.slotBytes / sizeof(T);
  for (uint64_t base = 0; base < pt.len;) {
    const uint64_t C = chunkElems<T>(pt.len - base, 1, slotElems), len = min(C, pt.len - base);
    const bool ok = first  ? p.send(src + base, len)
                    : root ? p.recvReduceCopy(src + base, dst + base, len)
                           : p.recvReduceSend(src + base, len);
    if (!ok) return false;
    base += C;
  }
  p.save();
  return true;
}

// From the root around the ring to the rank before it.
template <typename T, typename Op>
__device__ __noinline__ bool broadcast(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, comm->nChannels, c);
  const T* src = static_cast<const T*>(w.sendbuff) + pt.off;  // used on the root only
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;
  if (n == 1) {
    if (src != dst) reduceCopy<T, Op, F_USRC | F_UDST>(g, op, nullptr, src, dst, nullptr, pt.len);
    return true;
  }
  const fnRing ring = comm->rings[c];
  const bool root = comm->rank == w.root, last = ring.next == w.root;
  Prims<T, Op> p = ringPrims<T, Op>(g, comm, op, ring, c);
  const uint64_t slotElems = p.slotBytes / sizeof(T);
  for (uint64_t base = 0; base < pt.len;) {
    const uint64_t C = chunkElems<T>(pt.len - base, 1, slotElems), len = min(C, pt.len - base);
    const bool ok = root   ? p.copySend(src + base, dst + base, len)
                    : last ? p.recv(dst + base, len)
                           : p.recvCopySend(dst + base, len);
    if (!ok) return false;
    base += C;
  }
  p.save();
  return true;
}

// At step j every rank receives the block that originated at ring position ix - j.
template <typename T, typename Op>
__device__ __noinline__ bool allGather(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, comm->nChannels, c);
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
  Prims<T, Op> p = ringPrims<T, Op>(g, comm, op, ring, c);
  const uint64_t slotElems = p.slotBytes / sizeof(T);
  for (uint64_t base = 0; base < pt.len;) {
    const uint64_t C = chunkElems<T>(pt.len - base, 1, slotElems), len = min(C, pt.len - base);
    if (!p.copySend(src + base, mine + base, len)) return false;
    for (int j = 1; j < n - 1; j++) {
      if (!p.recvCopySend(block(ring.userRanks[ringMod(ix - j, n)]) + base, len)) return false;
    }
    if (!p.recv(block(ring.userRanks[ringMod(ix + 1, n)]) + base, len)) return false;
    base += C;
  }
  p.save();
  return true;
}

// At step j every rank reduces into the block destined for ring position ix - j; it ends with its own.
template <typename T, typename Op>
__device__ __noinline__ bool reduceScatter(const Group g, const fnDevComm* comm, const fnWork w, const Op op) {
  const int n = comm->nRanks, c = blockIdx.x;
  const Part pt = channelPart<T>(w.count, comm->nChannels, c);
  const T* const in = static_cast<const T*>(w.sendbuff) + pt.off;
  T* dst = static_cast<T*>(w.recvbuff) + pt.off;
  auto block = [&](int rank) { return in + uint64_t(rank) * w.count; };
  if (n == 1) {
    reduceCopy<T, Op, F_USRC | F_UDST | F_PRE | F_POST>(g, op, nullptr, in, dst, nullptr, pt.len);
    return true;
  }
  const fnRing ring = comm->rings[c];
  const int ix = ring.index;
  Prims<T, Op> p = ringPrims<T, Op>(g, comm, op, ring, c);
  const uint64_t slotElems = p.slotBytes / sizeof(T);
  for (uint64_t base = 0; base < pt.len;) {
    const uint64_t C = chunkElems<T>(pt.len - base, 1, slotElems), len = min(C, pt.len - base);
    if (!p.send(block(ring.userRanks[ringMod(ix - 1, n)]) + base, len)) return false;
    for (int j = 2; j < n; j++) {
      if (!p.recvReduceSend(block(ring.userRanks[ringMod(ix - j, n)]) + base, len)) return false;
    }
    if (!p.recvReduceCopy(block(comm->rank) + base, dst + base, len)) return false;
    base += C;
  }
  p.save();
  return true;
}

// Point-to-point, always in bytes whatever the kernel's type: slot-sized steps on one connection.
__device__ __noinline__ bool p2pSend(const Group g, const fnDevComm* comm, const fnWork w) {
  const OpNone<uint8_t> op;
  Prims<uint8_t, OpNone<uint8_t>> p(g, comm, op, &comm->conns[w.root * FN_MAX_CHANNELS + w.chan].send, nullptr);
  const uint8_t* src = static_cast<const uint8_t*>(w.sendbuff);
  for (uint64_t off = 0; off < w.count; off += p.slotBytes) {
    if (!p.send(src + off, min(uint64_t(p.slotBytes), w.count - off))) return false;
  }
  p.save();
  return true;
}
__device__ __noinline__ bool p2pRecv(const Group g, const fnDevComm* comm, const fnWork w) {
  const OpNone<uint8_t> op;
  Prims<uint8_t, OpNone<uint8_t>> p(g, comm, op, nullptr, &comm->conns[w.root * FN_MAX_CHANNELS + w.chan].recv);
  uint8_t* dst = static_cast<uint8_t*>(w.recvbuff);
  for (uint64_t off = 0; off < w.count; off += p.slotBytes) {
    if (!p.recv(dst + off, min(uint64_t(p.slotBytes), w.count - off))) return false;
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

// Runs the launch's works in order. A collective runs on every CTA (CTA b = channel b); a p2p work
// only on CTAs blk..blk+nParts-1. A p2p-only CTA holding both sends and receives splits into a send half
// (sends and copies) and a receive half that progress independently.
template <typename T, typename Op>
__device__ __forceinline__ void runWorks(const fnKernelArgs& args) {
  using B = typename BitsOf<sizeof(T)>::type;
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
    switch (w.type) {
      case FN_WORK_SEND:
      case FN_WORK_COPY:
      case FN_WORK_RECV: {
        fnWork part;
        if (!p2pPart(w, b, part) || (split && recvHalf != (w.type == FN_WORK_RECV))) continue;
        if (part.count == 0) continue;  // both ends skip the same empty part
        if (w.type == FN_WORK_SEND) ok = p2pSend(g, comm, part);
        else if (w.type == FN_WORK_RECV) ok = p2pRecv(g, comm, part);
        else p2pCopy(g, part);
        break;
      }
      // Pure movement: instantiated on same-width storage so kernels of one width share the code.
      case FN_WORK_BROADCAST:
        ok = broadcast<B, OpNone<B>>(g, comm, w, OpNone<B>());
        break;
      case FN_WORK_ALLGATHER:
        ok = allGather<B, OpNone<B>>(g, comm, w, OpNone<B>());
        break;
      default:
        if constexpr (Op::kReduce) {
          const Op op(w, comm->nRanks);
          if (w.type == FN_WORK_ALLREDUCE) ok = allReduce<T, Op>(g, comm, w, op);
          else if (w.type == FN_WORK_REDUCE) ok = reduce<T, Op>(g, comm, w, op);
          else if (w.type == FN_WORK_REDUCESCATTER) ok = reduceScatter<T, Op>(g, comm, w, op);
        }
        break;
    }
    if (!ok) return;  // the whole group stops together: the decision came through a barrier
  }
}

// The kernels. __grid_constant__ lets the works be indexed in parameter space without a local copy;
// the parameter layout is the plain fnKernelArgs one.
#define FN_KERNEL(name, T, OP)                                                                   \
  extern "C" __global__ void __launch_bounds__(FN_NTHREADS, 1) name(const __grid_constant__ fnKernelArgs args) { \
    runWorks<T, OP<T>>(args);                                                                    \
  }
#define FN_KERNELS_ALL_OPS(tn, T)          \
  FN_KERNEL(fnColl_##tn##_sum, T, OpSum)   \
  FN_KERNEL(fnColl_##tn##_prod, T, OpProd) \
  FN_KERNEL(fnColl_##tn##_max, T, OpMax)   \
  FN_KERNEL(fnColl_##tn##_min, T, OpMin)   \
  FN_KERNEL(fnColl_##tn##_premulsum, T, OpPreMulSum)
#define FN_KERNELS_INT(tn, T) \
  FN_KERNELS_ALL_OPS(tn, T)   \
  FN_KERNEL(fnColl_##tn##_sumpostdiv, T, OpSumPostDiv)

FN_KERNELS_INT(i8, int8_t)
FN_KERNELS_INT(u8, uint8_t)
FN_KERNELS_INT(i32, int32_t)
FN_KERNELS_INT(u32, uint32_t)
FN_KERNELS_INT(i64, int64_t)
FN_KERNELS_INT(u64, uint64_t)
FN_KERNELS_ALL_OPS(f16, __half)
FN_KERNELS_ALL_OPS(f32, float)
FN_KERNELS_ALL_OPS(f64, double)
FN_KERNELS_ALL_OPS(bf16, __nv_bfloat16)
FN_KERNELS_ALL_OPS(e4m3, __nv_fp8_e4m3)
FN_KERNELS_ALL_OPS(e5m2, __nv_fp8_e5m2)
FN_KERNEL(fnCopy, uint8_t, OpNone)
