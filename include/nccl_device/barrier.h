/*
 * ferronickel: the combined barrier of NCCL 2.28.9's device API: an LSA barrier among the inner
 * (LSA) team, then a GIN barrier among the outer (rail) team. The LSA-only form (ncclTeamTagLsa)
 * works as ncclLsaBarrierSession does; forms with a GIN part trap in sync(), as GIN is not provided
 * (nccl_device/gin.h).
 */
#ifndef NCCL_DEVICE_BARRIER_H_
#define NCCL_DEVICE_BARRIER_H_
#include "core.h"
#include "gin_barrier.h"
#include "lsa_barrier.h"
#include "team.h"

#if defined(__CUDACC__)
template <typename Coop>
struct ncclBarrierSession {
  Coop coop;
  bool hasLsa, hasGin;
  /* Each part is constructed only when present. */
  union {
    ncclLsaBarrierSession<Coop> inner;
  };
  union {
    ncclGinBarrierSession<Coop> outer;
  };

  NCCL_DEVICE_INLINE ncclBarrierSession(Coop coop, ncclTeam innerTeam, ncclTeam outerTeam, ncclGin gin,
                                        ncclLsaBarrierHandle innerBarHandle, ncclGinBarrierHandle outerBarHandle,
                                        uint32_t index, bool multimem = false, ncclMultimemHandle innerMmHandle = {})
      : coop(coop), hasLsa(true), hasGin(true),
        inner(coop, gin.comm, innerTeam, innerBarHandle, index, multimem, innerMmHandle),
        outer(coop, gin, outerTeam, outerBarHandle, index) {}

  NCCL_DEVICE_INLINE ncclBarrierSession(Coop coop, ncclTeamTagWorld, ncclGin gin, uint32_t index, bool multimem = false)
      : ncclBarrierSession(coop, ncclTeamLsa(gin.comm), ncclTeamRail(gin.comm), gin, gin.comm.lsaBarrier,
                           gin.comm.railGinBarrier, index, multimem, gin.comm.lsaMultimem) {}

  NCCL_DEVICE_INLINE ncclBarrierSession(Coop coop, ncclTeamTagLsa, ncclDevComm const& comm, uint32_t index,
                                        bool multimem = false)
      : coop(coop), hasLsa(true), hasGin(false),
        inner(coop, comm, ncclTeamLsa(comm), comm.lsaBarrier, index, multimem, comm.lsaMultimem) {}

  NCCL_DEVICE_INLINE ncclBarrierSession(Coop coop, ncclTeamTagRail, ncclGin gin, uint32_t index)
      : coop(coop), hasLsa(false), hasGin(true),
        outer(coop, gin, ncclTeamRail(gin.comm), gin.comm.railGinBarrier, index) {}

  ncclBarrierSession(ncclBarrierSession const&) = delete;

  NCCL_DEVICE_INLINE ~ncclBarrierSession() {
    if (hasGin) outer.~ncclGinBarrierSession<Coop>();
    if (hasLsa) inner.~ncclLsaBarrierSession<Coop>();
  }

  NCCL_DEVICE_INLINE ncclLsaBarrierSession<Coop>& lsaBarrier() { return inner; }
  NCCL_DEVICE_INLINE ncclGinBarrierSession<Coop>& ginBarrier() { return outer; }

  /* The inner barrier releases what the outer one then acquires, so order splits between them. */
  NCCL_DEVICE_INLINE void sync(Coop c, cuda::memory_order order, ncclGinFenceLevel fence) {
    if (hasLsa) inner.sync(c, hasGin ? nccl::utility::releaseOrderOf(order) : order);
    if (hasGin) outer.sync(c, hasLsa ? nccl::utility::acquireOrderOf(order) : order, fence);
  }
};
#endif /* __CUDACC__ */

#endif /* NCCL_DEVICE_BARRIER_H_ */
