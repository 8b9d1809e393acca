/*
 * ferronickel: barriers among an LSA team, NCCL 2.28.9's device API.
 *
 * A handle (struct ncclLsaBarrierHandle, nccl_device/core.h; made on the host by
 * ncclLsaBarrierCreateRequirement, or comm.lsaBarrier from ncclDevCommCreate's lsaBarrierCount)
 * names a resource buffer of nBarriers independent barriers. The buffer is NCCL's layout, word for
 * word, so that kernels built against either library's headers meet in it (uint32_t words,
 * B = nBarriers, N = team.nRanks):
 *
 *   [0, B)                      epoch of each barrier's multimem use (unused here: no multimem)
 *   [B, 2B)                     epoch of each barrier's unicast use, kept between sessions
 *   [2B, 3B)                    multimem inboxes (unused here)
 *   [3B + b*N + q]              inbox of barrier b that team rank q stores its epoch into
 *
 * A session arrives by storing epoch+1 into its slot of every other member's inbox, and waits until
 * every member has stored at least epoch+1 into its own (counts compare modulo 2^32). The buffer
 * starts zeroed (ncclDevCommCreate), so every barrier starts at epoch 0.
 *
 * A wait that sees no progress for FERRONICKEL_DEVICE_WAIT_TIMEOUT_S seconds (default 120; define
 * it to 0 before including for no limit) prints which team rank never arrived and traps, so a
 * missing rank ends the kernel with an error instead of a hang.
 *
 * Multimem barriers (multimem=true) are not provided: the session traps (nccl_device/ptr.h says
 * why).
 */
#ifndef NCCL_DEVICE_LSA_BARRIER_H_
#define NCCL_DEVICE_LSA_BARRIER_H_
#include "coop.h"
#include "core.h"
#include "ptr.h"
#include "team.h"
#include "utility.h"

#ifndef FERRONICKEL_DEVICE_WAIT_TIMEOUT_S
#define FERRONICKEL_DEVICE_WAIT_TIMEOUT_S 120
#endif

#if defined(__CUDACC__)
#include <stdio.h>

namespace nccl {
namespace wait_detail {
NCCL_DEVICE_INLINE uint64_t nowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
/* Spins until *word, loaded with `order`, has reached `target` (modulo 2^32). Past the deadline it
 * names what it waited for and traps. */
NCCL_DEVICE_INLINE void waitReach(uint32_t* word, uint32_t target, cuda::memory_order order, char const* what,
                                  int index, int peer) {
  cuda::atomic_ref<uint32_t, cuda::thread_scope_system> ref(*word);
  uint64_t start = FERRONICKEL_DEVICE_WAIT_TIMEOUT_S > 0 ? nowNs() : 0;
  while (!nccl::utility::rollingLessEq(target, ref.load(order))) {
    if (FERRONICKEL_DEVICE_WAIT_TIMEOUT_S > 0 &&
        nowNs() - start > (uint64_t)FERRONICKEL_DEVICE_WAIT_TIMEOUT_S * 1000000000ull) {
      printf("ferronickel: %s %d: team rank %d never arrived (waited %d s for epoch %u, block %d thread %d)\n", what,
             index, peer, (int)FERRONICKEL_DEVICE_WAIT_TIMEOUT_S, target, (int)blockIdx.x, (int)threadIdx.x);
      __trap();
    }
  }
}
} /* namespace wait_detail */
} /* namespace nccl */

template <typename Coop>
struct ncclLsaBarrierSession {
  Coop coop;
  ncclDevComm const& comm;
  ncclTeam team;
  ncclLsaBarrierHandle handle;
  int index;
  uint32_t epoch;

  /* Barrier `index` of `handle` among `team` (an LSA team holding the caller). Every member of
   * `coop` constructs it. */
  NCCL_DEVICE_INLINE ncclLsaBarrierSession(Coop coop, ncclDevComm const& comm, ncclTeam team, ncclLsaBarrierHandle handle,
                                           uint32_t index, bool multimem = false, ncclMultimemHandle mmHandle = {})
      : coop(coop), comm(comm), team(team), handle(handle), index((int)index), epoch(0) {
    (void)mmHandle;
    if (multimem) __trap(); /* multimem barriers are not provided (see above) */
    epoch = *epochSlot();
  }

  /* Barrier `index` of the communicator's LSA barrier (ncclDevCommRequirements.lsaBarrierCount). */
  NCCL_DEVICE_INLINE ncclLsaBarrierSession(Coop coop, ncclDevComm const& comm, ncclTeamTagLsa, uint32_t index,
                                           bool multimem = false)
      : ncclLsaBarrierSession(coop, comm, ncclTeamLsa(comm), comm.lsaBarrier, index, multimem, comm.lsaMultimem) {}

  ncclLsaBarrierSession(ncclLsaBarrierSession const&) = delete;

  /* Keeps the epoch for the next ncclLsaBarrierSession on this barrier. */
  NCCL_DEVICE_INLINE ~ncclLsaBarrierSession() {
    if (coop.thread_rank() == 0) *epochSlot() = epoch;
    coop.sync();
  }

  /* Tells every other member this one has arrived; with a release order, after this coop's
   * preceding writes. */
  NCCL_DEVICE_INLINE void arrive(Coop, cuda::memory_order order) {
    coop.sync();
    cuda::memory_order release = nccl::utility::releaseOrderOf(order);
    for (int i = coop.thread_rank(); i < team.nRanks - 1; i += coop.size()) {
      int peer = i < team.rank ? i : i + 1;
      cuda::atomic_ref<uint32_t, cuda::thread_scope_system> slot(*inbox(peer, team.rank));
      slot.store(epoch + 1, release);
    }
  }

  /* Returns once every other member has arrived; with an acquire order, their writes before
   * arriving are visible to this coop. */
  NCCL_DEVICE_INLINE void wait(Coop, cuda::memory_order order) {
    cuda::memory_order acquire = nccl::utility::acquireOrderOf(order);
    for (int i = coop.thread_rank(); i < team.nRanks - 1; i += coop.size()) {
      int peer = i < team.rank ? i : i + 1;
      nccl::wait_detail::waitReach(inbox(team.rank, peer), epoch + 1, acquire, "LSA barrier", index, peer);
    }
    epoch += 1;
    coop.sync();
  }

  NCCL_DEVICE_INLINE void sync(Coop c, cuda::memory_order order) {
    arrive(c, order);
    wait(c, order);
  }

 private:
  NCCL_DEVICE_INLINE uint32_t* epochSlot() const {
    return (uint32_t*)ncclGetResourceBufferLocalPointer(comm, handle.bufHandle) + handle.nBarriers + index;
  }
  /* The slot of `from` in `owner`'s inbox (both team ranks). */
  NCCL_DEVICE_INLINE uint32_t* inbox(int owner, int from) const {
    uint32_t* words = (uint32_t*)ncclGetResourceBufferPeerPointer(comm, handle.bufHandle, team, owner);
    return words + 3 * handle.nBarriers + index * team.nRanks + from;
  }
};
#endif /* __CUDACC__ */

#endif /* NCCL_DEVICE_LSA_BARRIER_H_ */
