/*
 * ferronickel: cooperative groups of NCCL 2.28.9's device API. A "coop" is the set of threads that
 * call a device-API function together; each offers the subset of CUDA's cooperative groups the API
 * needs: thread_rank(), size(), num_threads() (== size()) and sync().
 *
 *   ncclCoopTile<N>   an aligned power-of-two group of N lanes of one warp
 *   ncclCoopThread    ncclCoopTile<1>: the calling thread alone
 *   ncclCoopWarp      ncclCoopTile<32>: the whole warp
 *   ncclCoopLanes     any lanes of one warp, given as a lane mask
 *   ncclCoopWarpSpan  consecutive warps of the block, with an id in [0, 15) naming their hardware
 *                     barrier (two spans with one id must not be in a collective at once)
 *   ncclCoopCta       the whole thread block
 */
#ifndef NCCL_DEVICE_COOP_H_
#define NCCL_DEVICE_COOP_H_
#include "utility.h"

#if defined(__CUDACC__)
template <int nThreadsPow2>
struct ncclCoopTile {
  static_assert(nThreadsPow2 >= 1 && nThreadsPow2 <= 32 && nccl::utility::isPow2(nThreadsPow2),
                "a tile is a power of two of at most 32 lanes");

  NCCL_DEVICE_INLINE int thread_rank() const { return nccl::utility::lane() & (nThreadsPow2 - 1); }
  NCCL_DEVICE_INLINE constexpr int size() const { return nThreadsPow2; }
  NCCL_DEVICE_INLINE constexpr int num_threads() const { return nThreadsPow2; }
  /* The lanes of this tile within the warp. */
  NCCL_DEVICE_INLINE uint32_t laneMask() const {
    uint32_t tile = nThreadsPow2 == 32 ? ~0u : ((1u << nThreadsPow2) - 1);
    return tile << (nccl::utility::lane() & ~(nThreadsPow2 - 1));
  }
  NCCL_DEVICE_INLINE void sync() {
    if (nThreadsPow2 > 1) __syncwarp(laneMask());
  }
};

typedef ncclCoopTile<1> ncclCoopThread;
typedef ncclCoopTile<32> ncclCoopWarp;

struct ncclCoopLanes {
  uint32_t lmask;

  NCCL_DEVICE_INLINE constexpr ncclCoopLanes(uint32_t lmask = ~0u) : lmask(lmask) {}

  NCCL_DEVICE_INLINE int thread_rank() const { return __popc(lmask & nccl::utility::lanemask_lt()); }
  NCCL_DEVICE_INLINE int size() const { return __popc(lmask); }
  NCCL_DEVICE_INLINE int num_threads() const { return __popc(lmask); }
  NCCL_DEVICE_INLINE void sync() { __syncwarp(lmask); }
};

struct ncclCoopWarpSpan {
  uint32_t warp0 : 8, nWarps : 8, id : 8;

  NCCL_DEVICE_INLINE constexpr ncclCoopWarpSpan(int warp0, int nWarps, int id)
      : warp0(warp0), nWarps(nWarps), id(id) {}

  NCCL_DEVICE_INLINE int thread_rank() const { return (int)threadIdx.x - 32 * (int)warp0; }
  NCCL_DEVICE_INLINE int size() const { return 32 * nWarps; }
  NCCL_DEVICE_INLINE int num_threads() const { return 32 * nWarps; }
  /* Hardware barrier 1 + id (barrier 0 is __syncthreads'). */
  NCCL_DEVICE_INLINE void sync() { __barrier_sync_count(1 + id, 32 * nWarps); }
};

struct ncclCoopCta {
  NCCL_DEVICE_INLINE int thread_rank() const { return threadIdx.x; }
  NCCL_DEVICE_INLINE int size() const { return blockDim.x; }
  NCCL_DEVICE_INLINE int num_threads() const { return blockDim.x; }
  NCCL_DEVICE_INLINE void sync() { __syncthreads(); }
};

/* The lanes of the caller's warp that belong to the coop (all of them for warp spans and CTAs). */
template <int n>
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopTile<n> coop) {
  return coop.laneMask();
}
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopLanes coop) { return coop.lmask; }
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopWarpSpan) { return ~0u; }
NCCL_DEVICE_INLINE uint32_t ncclCoopGetLaneMask(ncclCoopCta) { return ~0u; }

/* Known at compile time to be one thread. */
template <int n>
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopTile<n>) {
  return n == 1;
}
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopLanes) { return false; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopWarpSpan) { return false; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopIsThread(ncclCoopCta) { return false; }

/* Known at compile time to fit in one warp. */
template <int n>
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopTile<n>) {
  return true;
}
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopLanes) { return true; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopWarpSpan) { return false; }
NCCL_DEVICE_INLINE constexpr bool ncclCoopWithinWarp(ncclCoopCta) { return false; }

/* The lanes of the caller's warp that are running this code now. */
NCCL_DEVICE_INLINE ncclCoopLanes ncclCoopCoalesced() { return ncclCoopLanes(__activemask()); }

/* The lanes of the caller's warp that may act together inside a collective call on `coop`: the
 * coop itself when it lies within the warp, else the whole warp (every lane of a warp span or a
 * CTA makes the call). */
template <typename Coop>
NCCL_DEVICE_INLINE ncclCoopWarp ncclCoopCoalesced(Coop) {
  return ncclCoopWarp();
}
NCCL_DEVICE_INLINE ncclCoopLanes ncclCoopCoalesced(ncclCoopLanes coop) { return coop; }
template <int n>
NCCL_DEVICE_INLINE ncclCoopTile<n> ncclCoopCoalesced(ncclCoopTile<n> coop) {
  return coop;
}

/* Broadcasts of `value` from the member of rank `root` to the whole coop. Within a warp this is a
 * shuffle; across warps it goes through shared memory (entrySync: first wait until every member
 * is done with the previous broadcast's slot). */
namespace nccl {
namespace coop_detail {
template <typename T, typename Shuffle>
NCCL_DEVICE_INLINE T shuffleWords(T value, Shuffle shuffle) {
  constexpr int nWords = (sizeof(T) + 3) / 4;
  union {
    uint32_t word[nWords];
    T value;
  } u;
  u.value = value;
#pragma unroll
  for (int i = 0; i < nWords; i++) u.word[i] = shuffle(u.word[i]);
  return u.value;
}
/* One 16-byte slot per warp-span id, and one for the CTA. */
NCCL_DEVICE_INLINE ulong2* warpSpanSlots() {
  __shared__ ulong2 slots[16];
  return slots;
}
NCCL_DEVICE_INLINE ulong2* ctaSlot() {
  __shared__ ulong2 slot;
  return &slot;
}
template <typename Coop, typename T>
NCCL_DEVICE_INLINE T viaShared(Coop coop, ulong2* slot, T value, int root, bool entrySync) {
  static_assert(sizeof(T) <= sizeof(ulong2), "a broadcast across warps carries at most 16 bytes");
  if (entrySync) coop.sync();
  if (coop.thread_rank() == root) *(T*)slot = value;
  coop.sync();
  return *(T const*)slot;
}
} /* namespace coop_detail */
} /* namespace nccl */

template <int n, typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopTile<n> coop, T value, int root, bool entrySync = true) {
  (void)entrySync;
  uint32_t mask = coop.laneMask();
  return nccl::coop_detail::shuffleWords(value, [&](uint32_t w) { return __shfl_sync(mask, w, root, n); });
}
template <typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopLanes coop, T value, int root, bool entrySync = true) {
  (void)entrySync;
  uint32_t mask = coop.lmask;
  int srcLane = __fns(mask, 0, root + 1); /* the (root+1)-th set lane */
  return nccl::coop_detail::shuffleWords(value, [&](uint32_t w) { return __shfl_sync(mask, w, srcLane); });
}
template <typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopWarpSpan coop, T value, int root, bool entrySync = true) {
  return nccl::coop_detail::viaShared(coop, nccl::coop_detail::warpSpanSlots() + coop.id, value, root, entrySync);
}
template <typename T>
NCCL_DEVICE_INLINE T ncclCoopBcast(ncclCoopCta coop, T value, int root, bool entrySync = true) {
  return nccl::coop_detail::viaShared(coop, nccl::coop_detail::ctaSlot(), value, root, entrySync);
}
#endif /* __CUDACC__ */

#endif /* NCCL_DEVICE_COOP_H_ */
