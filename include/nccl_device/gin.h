/*
 * ferronickel: GIN, the GPU-initiated network of NCCL 2.28.9's device API: puts, signals and
 * counters a kernel drives towards ranks outside its LSA team.
 *
 * ferronickel does not provide GIN. ncclDevCommCreate refuses requirements that need it
 * (ginForceEnable, ginContextCount, ginSignalCount, ginCounterCount, railGinBarrierCount and
 * resource requirements with GIN signals or counters) with ncclInvalidUsage, so its device
 * communicators have ginContextCount == 0. The types and members below are declared as NVIDIA's so
 * that kernels holding GIN code paths compile against these headers; every GIN operation prints
 * that GIN is not provided and traps, ending the kernel with an error rather than doing nothing.
 */
#ifndef NCCL_DEVICE_GIN_H_
#define NCCL_DEVICE_GIN_H_
#include "coop.h"
#include "core.h"
#include "net_device.h"
#include "ptr.h"
#include "utility.h"

/* The GIN backends a kernel may be compiled for: NVIDIA's proxy and GDAKI. */
#define NCCL_GIN_BACKEND_MASK_ALL \
  ((1u << (unsigned)NCCL_NET_DEVICE_GIN_PROXY) | (1u << (unsigned)NCCL_NET_DEVICE_GIN_GDAKI))

typedef enum ncclGinSignalOp_t {
  ncclGinSignalInc = 0,
  ncclGinSignalAdd,
} ncclGinSignalOp_t;

#if defined(__CUDACC__)
#include <stdio.h>

/* Space for a put's descriptor in shared memory. */
struct ncclGinDescriptorSmem {
  alignas(16) char space[64];
};

/* Completion actions of put(): nothing, on the peer a signal incremented or added to, locally a
 * counter incremented; and a descriptor in shared memory to build the put in. */
struct ncclGin_None {};
struct ncclGin_SignalAdd {
  ncclGinSignal_t signal;
  uint64_t value;
};
struct ncclGin_SignalInc {
  ncclGinSignal_t signal;
};
struct ncclGin_CounterInc {
  ncclGinCounter_t counter;
};
struct ncclGin_DescriptorSmem {
  ncclGinDescriptorSmem* descriptor;
};

namespace nccl {
namespace gin_detail {
/* Every GIN operation ends here. */
NCCL_DEVICE_INLINE void notProvided(char const* what) {
  printf("ferronickel: ncclGin::%s: GIN is not provided (ncclDevCommCreate refuses it; README.md, \"The device API\")\n",
         what);
  __trap();
}
} /* namespace gin_detail */
} /* namespace nccl */

/* A GIN context of a device communicator, for the backends in backendMask. */
template <unsigned backendMask>
struct ncclGin_BackendMask {
  ncclDevComm const& comm;
  uint32_t nContexts : 8, contextId : 8, _ginBackend : 8;
  void* _ginHandle;
  uint64_t* _signalShadows;

  /* Context contextIndex modulo the communicator's context count (0 in ferronickel). */
  NCCL_DEVICE_INLINE ncclGin_BackendMask(ncclDevComm const& comm, int contextIndex)
      : comm(comm), nContexts(comm.ginContextCount), contextId(0), _ginBackend(0), _ginHandle(nullptr),
        _signalShadows(nullptr) {
    if (comm.ginContextCount > 0) {
      contextId = (uint32_t)contextIndex % comm.ginContextCount;
      _ginBackend = comm.ginTypes[contextId];
      _ginHandle = comm.ginHandles[contextId];
      _signalShadows = comm.ginSignalShadows + contextId * comm.ginSignalCount;
    }
  }

  template <typename RemoteAction = ncclGin_None, typename LocalAction = ncclGin_None, typename Coop = ncclCoopThread,
            typename DescriptorSmem = ncclGin_None>
  NCCL_DEVICE_INLINE void put(ncclTeam, int peer, ncclWindow_t dstWnd, size_t dstOffset, ncclWindow_t srcWnd,
                              size_t srcOffset, size_t bytes, RemoteAction remoteAction = ncclGin_None{},
                              LocalAction localAction = ncclGin_None{}, Coop coop = ncclCoopThread{},
                              DescriptorSmem descriptor = ncclGin_None{},
                              cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                              cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    nccl::gin_detail::notProvided("put");
  }

  template <typename T, typename RemoteAction = ncclGin_None, typename LocalAction = ncclGin_None,
            typename Coop = ncclCoopThread, typename DescriptorSmem = ncclGin_None>
  NCCL_DEVICE_INLINE void put(ncclTeam, int peer, ncclSymPtr<T> dstElts, ncclSymPtr<T> srcElts, size_t nElts,
                              RemoteAction remoteAction = ncclGin_None{}, LocalAction localAction = ncclGin_None{},
                              Coop coop = ncclCoopThread{}, DescriptorSmem descriptor = ncclGin_None{},
                              cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                              cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    nccl::gin_detail::notProvided("put");
  }

  template <typename T, typename RemoteAction = ncclGin_None, typename Coop = ncclCoopThread,
            typename DescriptorSmem = ncclGin_None>
  NCCL_DEVICE_INLINE void putValue(ncclTeam, int peer, ncclWindow_t dstWnd, size_t dstOffset, T value,
                                   RemoteAction remoteAction = ncclGin_None{}, Coop coop = ncclCoopThread{},
                                   DescriptorSmem descriptor = ncclGin_None{},
                                   cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                                   cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    nccl::gin_detail::notProvided("putValue");
  }

  template <typename T, typename RemoteAction = ncclGin_None, typename Coop = ncclCoopThread,
            typename DescriptorSmem = ncclGin_None>
  NCCL_DEVICE_INLINE void putValue(ncclTeam, int peer, ncclSymPtr<T> dst, T value,
                                   RemoteAction remoteAction = ncclGin_None{}, Coop coop = ncclCoopThread{},
                                   DescriptorSmem descriptor = ncclGin_None{},
                                   cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                                   cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    nccl::gin_detail::notProvided("putValue");
  }

  template <typename RemoteAction, typename Coop = ncclCoopThread, typename DescriptorSmem = ncclGin_None>
  NCCL_DEVICE_INLINE void signal(ncclTeam, int peer, RemoteAction remoteAction, Coop coop = ncclCoopThread(),
                                 DescriptorSmem descriptor = ncclGin_None{},
                                 cuda::thread_scope alreadyReleased = cuda::thread_scope_thread,
                                 cuda::thread_scope expected_scope = cuda::thread_scope_device) const {
    nccl::gin_detail::notProvided("signal");
  }

  template <typename Coop>
  NCCL_DEVICE_INLINE void flush(Coop, cuda::memory_order ord = cuda::memory_order_acquire) const {
    nccl::gin_detail::notProvided("flush");
  }

  NCCL_DEVICE_INLINE uint64_t readCounter(ncclGinCounter_t counter, int bits = 56,
                                          cuda::memory_order ord = cuda::memory_order_acquire) const {
    nccl::gin_detail::notProvided("readCounter");
    return 0;
  }

  template <typename Coop>
  NCCL_DEVICE_INLINE void waitCounter(Coop, ncclGinCounter_t counter, uint64_t least, int bits = 56,
                                      cuda::memory_order ord = cuda::memory_order_acquire) const {
    nccl::gin_detail::notProvided("waitCounter");
  }

  NCCL_DEVICE_INLINE uint64_t* getSignalShadowPtr(ncclGinSignal_t signal) const {
    nccl::gin_detail::notProvided("getSignalShadowPtr");
    return nullptr;
  }

  NCCL_DEVICE_INLINE void increaseSignalShadow(ncclGinSignal_t signal, uint64_t delta) const {
    nccl::gin_detail::notProvided("increaseSignalShadow");
  }

  NCCL_DEVICE_INLINE uint64_t readSignal(ncclGinSignal_t signal, int bits = 64,
                                         cuda::memory_order ord = cuda::memory_order_acquire) const {
    nccl::gin_detail::notProvided("readSignal");
    return 0;
  }

  template <typename Coop>
  NCCL_DEVICE_INLINE void waitSignal(Coop, ncclGinSignal_t signal, uint64_t least, int bits = 64,
                                     cuda::memory_order ord = cuda::memory_order_acquire) const {
    nccl::gin_detail::notProvided("waitSignal");
  }

  template <typename Coop>
  NCCL_DEVICE_INLINE void waitSignalMeetShadow(Coop, ncclGinSignal_t signal, int bits = 64,
                                               cuda::memory_order ord = cuda::memory_order_acquire) const {
    nccl::gin_detail::notProvided("waitSignalMeetShadow");
  }

  template <typename Coop, typename Uint>
  NCCL_DEVICE_INLINE void waitSignalFollowShadow(Coop, ncclGinSignal_t signal, Uint leastDelta, Uint* before,
                                                 Uint* delta, int bits = 64,
                                                 cuda::memory_order ord = cuda::memory_order_acquire) const {
    nccl::gin_detail::notProvided("waitSignalFollowShadow");
  }

  NCCL_DEVICE_INLINE void resetCounter(ncclGinCounter_t counter) const { nccl::gin_detail::notProvided("resetCounter"); }

  NCCL_DEVICE_INLINE void resetSignal(ncclGinSignal_t signal) const { nccl::gin_detail::notProvided("resetSignal"); }
};

template <ncclNetDeviceType backend>
using ncclGin_BackendOne = ncclGin_BackendMask<(1u << (int)backend)>;

using ncclGin = ncclGin_BackendMask<NCCL_GIN_BACKEND_MASK_ALL>;
#endif /* __CUDACC__ */

#endif /* NCCL_DEVICE_GIN_H_ */
