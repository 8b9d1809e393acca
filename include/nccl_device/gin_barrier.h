/*
 * ferronickel: barriers over GIN, NCCL 2.28.9's device API (across LSA teams, typically the rail
 * team). Not provided, as GIN is not (nccl_device/gin.h): ncclGinBarrierCreateRequirement and
 * railGinBarrierCount are refused on the host, and sync() traps. Declared as NVIDIA's so that
 * kernels holding such code paths compile.
 */
#ifndef NCCL_DEVICE_GIN_BARRIER_H_
#define NCCL_DEVICE_GIN_BARRIER_H_
#include "core.h"
#include "gin.h"
#include "team.h"

#if defined(__CUDACC__)
enum class ncclGinFenceLevel { Relaxed };

template <typename Coop>
struct ncclGinBarrierSession {
  Coop coop;
  ncclGin net;
  ncclTeam team;
  ncclGinBarrierHandle handle;
  int index;

  NCCL_DEVICE_INLINE ncclGinBarrierSession(Coop coop, ncclGin net, ncclTeam team, ncclGinBarrierHandle handle,
                                           uint32_t index)
      : coop(coop), net(net), team(team), handle(handle), index((int)index) {}
  NCCL_DEVICE_INLINE ncclGinBarrierSession(Coop coop, ncclGin net, ncclTeamTagRail, uint32_t index)
      : ncclGinBarrierSession(coop, net, ncclTeamRail(net.comm), net.comm.railGinBarrier, index) {}

  ncclGinBarrierSession(ncclGinBarrierSession const&) = delete;

  NCCL_DEVICE_INLINE void sync(Coop, cuda::memory_order, ncclGinFenceLevel) {
    nccl::gin_detail::notProvided("ncclGinBarrierSession::sync");
  }
};
#endif /* __CUDACC__ */

#endif /* NCCL_DEVICE_GIN_BARRIER_H_ */
