/*
 * ferronickel: pointers into symmetric windows, NCCL 2.28.9's device API.
 *
 * A window (ncclWindow_t, registered with ncclCommWindowRegister and NCCL_WIN_COLL_SYMMETRIC) has
 * the same size on every rank. Its device record (struct ncclWindow_vidmem, nccl_device/core.h)
 * maps all the LSA team's buffers flat: byte `offset` of LSA rank p's buffer is at
 * lsaFlatBase + p * stride4G * 4 GiB + offset (README.md, "The device API").
 *
 * Multimem (NVLink SHARP multicast) is not provided by ferronickel: ncclDevCommCreate refuses
 * lsaMultimem and multimem team requirements, so no ncclMultimemHandle it hands out has a base.
 * The multimem functions below stop the kernel with a trap when given such a handle, rather than
 * return a pointer into nothing.
 */
#ifndef NCCL_DEVICE_PTR_H_
#define NCCL_DEVICE_PTR_H_
#include "core.h"
#include "coop.h"
#include "team.h"
#include "utility.h"

#if defined(__cplusplus)
template <typename T>
struct ncclSymPtr;
#endif

/* Byte offset of a resource buffer in the device communicator's resource window. */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE size_t ncclGetResourceBufferOffset(ncclDevResourceHandle_t handle) {
  return (size_t)handle * 128;
}

#if defined(__CUDACC__)
namespace nccl {
namespace ptr_detail {
/* Byte `offset` of LSA rank `lsaPeer`'s buffer of the window whose record is `w`. */
NCCL_DEVICE_INLINE void* lsaByte(char* lsaFlatBase, uint32_t stride4G, int lsaPeer, size_t offset) {
  return nccl::utility::add4G(lsaFlatBase, (uint32_t)lsaPeer * stride4G) + offset;
}
NCCL_DEVICE_INLINE void* windowByte(ncclWindow_t w, int lsaPeer, size_t offset) {
  using nccl::utility::loadConst;
  return lsaByte(loadConst(&w->lsaFlatBase), loadConst(&w->stride4G), lsaPeer, offset);
}
NCCL_DEVICE_INLINE void* multimemByte(ncclMultimemHandle mm, uint32_t mcOffset4K, size_t offset) {
  if (mm.mcBasePtr == nullptr) __trap(); /* no multicast object: see the top of nccl_device/ptr.h */
  return (char*)mm.mcBasePtr + (size_t)mcOffset4K * 4096 + offset;
}
/* Byte 0 of resource buffer `h` in LSA rank `lsaPeer`'s resource window. */
NCCL_DEVICE_INLINE void* resourceByte(ncclDevComm const& comm, ncclDevResourceHandle h, int lsaPeer) {
  return lsaByte(comm.resourceWindow_inlined.lsaFlatBase, comm.resourceWindow_inlined.stride4G, lsaPeer,
                 ncclGetResourceBufferOffset(h));
}
} /* namespace ptr_detail */
} /* namespace nccl */

/* This rank's byte `offset` of window w. */
NCCL_DEVICE_INLINE void* ncclGetLocalPointer(ncclWindow_t w, size_t offset) {
  return nccl::ptr_detail::windowByte(w, nccl::utility::loadConst(&w->lsaRank), offset);
}

/* LSA rank `peer`'s byte `offset` of window w. */
NCCL_DEVICE_INLINE void* ncclGetLsaPointer(ncclWindow_t w, size_t offset, int peer) {
  return nccl::ptr_detail::windowByte(w, peer, offset);
}

/* World rank `peer`'s byte `offset` of window w (peer must be in this rank's LSA team). */
NCCL_DEVICE_INLINE void* ncclGetPeerPointer(ncclWindow_t w, size_t offset, int peer) {
  using nccl::utility::loadConst;
  int lsaPeer = loadConst(&w->lsaRank) + (peer - loadConst(&w->worldRank));
  return nccl::ptr_detail::windowByte(w, lsaPeer, offset);
}

/* Team `team`'s rank `peer`'s byte `offset` of window w (peer must be in this rank's LSA team). */
NCCL_DEVICE_INLINE void* ncclGetPeerPointer(ncclWindow_t w, size_t offset, ncclTeam team, int peer) {
  int lsaPeer = nccl::utility::loadConst(&w->lsaRank) + (peer - team.rank) * team.stride;
  return nccl::ptr_detail::windowByte(w, lsaPeer, offset);
}

/* Byte `offset` of window w through a multicast mapping (not provided: traps, see above). */
NCCL_DEVICE_INLINE void* ncclGetMultimemPointer(ncclWindow_t w, size_t offset, ncclMultimemHandle mm) {
  return nccl::ptr_detail::multimemByte(mm, nccl::utility::loadConst(&w->mcOffset4K), offset);
}
NCCL_DEVICE_INLINE void* ncclGetLsaMultimemPointer(ncclWindow_t w, size_t offset, ncclDevComm const& comm) {
  return ncclGetMultimemPointer(w, offset, comm.lsaMultimem);
}

/* The window holding `ptr` among the communicator's registered windows, found by the lanes of the
 * caller's warp that take part in the collective call on `coop`. `ptr` must lie in a registered
 * window: the search walks the table until it finds one. */
template <typename Coop>
NCCL_DEVICE_INLINE ncclWindow_t ncclFindWindow(Coop coop, ncclDevComm const& comm, void const* ptr) {
  using Entry = ncclDevCommWindowTable::Entry;
  auto lanes = ncclCoopCoalesced(coop);
  uint32_t laneMask = ncclCoopGetLaneMask(lanes);
  uintptr_t addr = (uintptr_t)ptr;
  for (ncclDevCommWindowTable const* table = comm.windowTable; table != nullptr;
       table = nccl::utility::loadConst(&table->next)) {
    int hit = -1;
    for (int i = lanes.thread_rank(); i < 32 && hit < 0; i += lanes.size()) {
      Entry e = nccl::utility::loadConst(&table->entries[i]);
      if (e.window != nullptr && e.size != 0 && addr - e.base < e.size) hit = i;
    }
    uint32_t found = __ballot_sync(laneMask, hit >= 0);
    if (found != 0) return nccl::utility::loadConst(&table->entries[__shfl_sync(laneMask, hit, __ffs(found) - 1)].window);
  }
  __trap(); /* not in any registered window */
  return nullptr;
}

/* Resource buffer `h` of the device communicator: this rank's, LSA rank `peer`'s, team `team`'s
 * rank `peer`'s, and through multicast (not provided: traps). */
NCCL_DEVICE_INLINE void* ncclGetResourceBufferLocalPointer(ncclDevComm const& comm, ncclDevResourceHandle h) {
  return nccl::ptr_detail::resourceByte(comm, h, comm.lsaRank);
}
NCCL_DEVICE_INLINE void* ncclGetResourceBufferLsaPointer(ncclDevComm const& comm, ncclDevResourceHandle h, int peer) {
  return nccl::ptr_detail::resourceByte(comm, h, peer);
}
NCCL_DEVICE_INLINE void* ncclGetResourceBufferPeerPointer(ncclDevComm const& comm, ncclDevResourceHandle h,
                                                          ncclTeam team, int peer) {
  return nccl::ptr_detail::resourceByte(comm, h, comm.lsaRank + (peer - team.rank) * team.stride);
}
NCCL_DEVICE_INLINE void* ncclGetResourceBufferMultimemPointer(ncclDevComm const& comm, ncclDevResourceHandle h,
                                                              ncclMultimemHandle mm) {
  return nccl::ptr_detail::multimemByte(mm, comm.resourceWindow_inlined.mcOffset4K, ncclGetResourceBufferOffset(h));
}
NCCL_DEVICE_INLINE void* ncclGetResourceBufferLsaMultimemPointer(ncclDevComm const& comm, ncclDevResourceHandle h) {
  return ncclGetResourceBufferMultimemPointer(comm, h, comm.lsaMultimem);
}
#endif /* __CUDACC__ */

#if defined(__cplusplus)
/* A typed position in a symmetric window: the same (window, offset) names the matching element on
 * every rank. Arithmetic moves the offset in units of T, as pointer arithmetic does. */
template <typename T>
struct ncclSymPtr {
  using ElementType = T;
  ncclWindow_t window;
  size_t offset;

  NCCL_HOST_DEVICE_INLINE constexpr ncclSymPtr(ncclWindow_t window = nullptr, size_t offset = 0)
      : window(window), offset(offset) {}

  template <typename U>
  NCCL_HOST_DEVICE_INLINE operator ncclSymPtr<U>() const {
    return ncclSymPtr<U>(window, offset);
  }

  /* Every integer type, as the raw pointer arithmetic it mirrors. */
  template <typename Int>
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator+=(Int d) {
    offset += (size_t)((ptrdiff_t)d * (ptrdiff_t)sizeof(T));
    return *this;
  }
  template <typename Int>
  NCCL_HOST_DEVICE_INLINE ncclSymPtr<T>& operator-=(Int d) {
    offset -= (size_t)((ptrdiff_t)d * (ptrdiff_t)sizeof(T));
    return *this;
  }

#if defined(__CUDACC__)
  NCCL_DEVICE_INLINE T* localPtr() const { return (T*)ncclGetLocalPointer(window, offset); }
  NCCL_DEVICE_INLINE T* lsaPtr(int peer) const { return (T*)ncclGetLsaPointer(window, offset, peer); }
  NCCL_DEVICE_INLINE T* peerPtr(int peer) const { return (T*)ncclGetPeerPointer(window, offset, peer); }
  NCCL_DEVICE_INLINE T* peerPtr(ncclTeam team, int peer) const {
    return (T*)ncclGetPeerPointer(window, offset, team, peer);
  }
  NCCL_DEVICE_INLINE T* multimemPtr(ncclMultimemHandle mm) const {
    return (T*)ncclGetMultimemPointer(window, offset, mm);
  }
  NCCL_DEVICE_INLINE T* lsaMultimemPtr(ncclDevComm const& comm) const {
    return (T*)ncclGetLsaMultimemPointer(window, offset, comm);
  }
#endif
};

template <typename T, typename Int>
NCCL_HOST_DEVICE_INLINE ncclSymPtr<T> operator+(ncclSymPtr<T> p, Int d) {
  return p += d;
}
template <typename T, typename Int>
NCCL_HOST_DEVICE_INLINE ncclSymPtr<T> operator-(ncclSymPtr<T> p, Int d) {
  return p -= d;
}
/* Elements between two positions of one window. */
template <typename T>
NCCL_HOST_DEVICE_INLINE ptrdiff_t operator-(ncclSymPtr<T> a, ncclSymPtr<T> b) {
  return ((ptrdiff_t)a.offset - (ptrdiff_t)b.offset) / (ptrdiff_t)sizeof(T);
}
template <typename T>
NCCL_HOST_DEVICE_INLINE bool operator==(ncclSymPtr<T> a, ncclSymPtr<T> b) {
  return a.window == b.window && a.offset == b.offset;
}
template <typename T>
NCCL_HOST_DEVICE_INLINE bool operator!=(ncclSymPtr<T> a, ncclSymPtr<T> b) {
  return !(a == b);
}

#if defined(__CUDACC__)
/* Resource buffer `h` as a position in the resource window. */
NCCL_DEVICE_INLINE ncclSymPtr<char> ncclGetResourceBuffer(ncclDevComm const& comm, ncclDevResourceHandle h) {
  return ncclSymPtr<char>(comm.resourceWindow, ncclGetResourceBufferOffset(h));
}
#endif
#endif /* __cplusplus */

#endif /* NCCL_DEVICE_PTR_H_ */
