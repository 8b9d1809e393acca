// Every name of NCCL 2.28.9's device API used once, so that tests/device_headers.rs can compile it
// with nvcc against ferronickel's headers and against NVIDIA's: the two must accept the same code.
// Nothing here runs; the kernels only have to compile.
#include <nccl.h>
#include <nccl_device.h>

template <typename Coop>
__device__ int useCoop(Coop coop) {
  coop.sync();
  int n = coop.thread_rank() + coop.size() + coop.num_threads();
  n += (int)ncclCoopGetLaneMask(coop) + ncclCoopIsThread(coop) + ncclCoopWithinWarp(coop);
  n += ncclCoopCoalesced(coop).size();
  return n + ncclCoopBcast(coop, n, 0) + ncclCoopBcast(coop, 1.0, 0, false);
}

__device__ int useTeams(ncclDevComm const& comm) {
  ncclTeam world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm), rail = ncclTeamRail(comm);
  ncclTeam_t inner = ncclTeamInnerFactor(world, comm.lsaSize), outer = ncclTeamOuterFactor(world, comm.lsaSize);
  int n = ncclTeamRankIsMember(lsa, world, 0) + ncclTeamRankToTeam(world, lsa, 0);
  n += ncclTeamRankToWorld(comm, rail, 0) + ncclTeamRankToLsa(comm, lsa, 0);
  n += ncclTeamRankInDifference(world, lsa, 0) + inner.nRanks + outer.stride;
  ncclTeamTagWorld tw;
  ncclTeamTagLsa tl;
  ncclTeamTagRail tr;
  (void)tw, (void)tl, (void)tr;
  return n;
}

__device__ char* usePointers(ncclDevComm const& comm, ncclWindow_t w, ncclMultimemHandle mm) {
  char* p = (char*)ncclGetLocalPointer(w, 0);
  p += (size_t)ncclGetLsaPointer(w, 8, 1) + (size_t)ncclGetPeerPointer(w, 8, 1);
  p += (size_t)ncclGetPeerPointer(w, 8, ncclTeamLsa(comm), 1);
  p += (size_t)ncclGetMultimemPointer(w, 0, mm) + (size_t)ncclGetLsaMultimemPointer(w, 0, comm);
  p += (size_t)ncclFindWindow(ncclCoopCta(), comm, p);
  ncclDevResourceHandle_t h = comm.lsaBarrier.bufHandle;
  p += ncclGetResourceBufferOffset(h) + (size_t)ncclGetResourceBufferLocalPointer(comm, h);
  p += (size_t)ncclGetResourceBufferLsaPointer(comm, h, 0);
  p += (size_t)ncclGetResourceBufferPeerPointer(comm, h, ncclTeamWorld(comm), 0);
  p += (size_t)ncclGetResourceBufferMultimemPointer(comm, h, mm);
  p += (size_t)ncclGetResourceBufferLsaMultimemPointer(comm, h);
  ncclSymPtr<char> res = ncclGetResourceBuffer(comm, h);
  return p + (size_t)res.localPtr();
}

__device__ float useSymPtr(ncclDevComm const& comm, ncclWindow_t w) {
  ncclSymPtr<float> a(w, 64), b = a + 4;
  ncclSymPtr<float>::ElementType x = 0;
  b += 2;
  b -= 1u;
  b = b - 1L;
  ncclSymPtr<char> c = b;
  x += (float)(b - a) + (a == b) + (a != b) + (float)c.offset;
  x += *a.localPtr() + *a.lsaPtr(0) + *a.peerPtr(0) + *a.peerPtr(ncclTeamLsa(comm), 0);
  x += *a.multimemPtr(comm.lsaMultimem) + *a.lsaMultimemPtr(comm);
  return x;
}

template <typename Coop>
__device__ void useBarriers(Coop coop, ncclDevComm const& comm) {
  {
    ncclLsaBarrierSession<Coop> bar{coop, comm, ncclTeamLsa(comm), comm.lsaBarrier, blockIdx.x};
    bar.arrive(coop, cuda::memory_order_release);
    bar.wait(coop, cuda::memory_order_acquire);
    bar.sync(coop, cuda::memory_order_relaxed);
  }
  {
    ncclLsaBarrierSession<Coop> bar{coop, comm, ncclTeamTagLsa(), blockIdx.x, false};
    bar.sync(coop, cuda::memory_order_acq_rel);
  }
  ncclGin gin{comm, 0};
#if defined(NCCL_DEVICE_H_)
  // ncclBarrierSession: NVIDIA's 2.28.9 headers do not compile it under nvcc 13 (its
  // nccl::utility::Present copy is deleted), so only ferronickel's headers are held to it.
  {
    ncclBarrierSession<Coop> bar{coop, ncclTeamTagLsa(), comm, blockIdx.x};
    bar.sync(coop, cuda::memory_order_seq_cst, ncclGinFenceLevel::Relaxed);
    bar.lsaBarrier().sync(coop, cuda::memory_order_relaxed);
  }
  {
    ncclBarrierSession<Coop> bar{coop, ncclTeamTagWorld(), gin, blockIdx.x};
    bar.sync(coop, cuda::memory_order_relaxed, ncclGinFenceLevel::Relaxed);
    bar.ginBarrier().sync(coop, cuda::memory_order_relaxed, ncclGinFenceLevel::Relaxed);
  }
  {
    ncclBarrierSession<Coop> bar{coop, ncclTeamTagRail(), gin, blockIdx.x};
    ncclBarrierSession<Coop> full{coop, ncclTeamLsa(comm), ncclTeamRail(comm), gin, comm.lsaBarrier,
                                  comm.railGinBarrier, blockIdx.x};
    full.sync(coop, cuda::memory_order_relaxed, ncclGinFenceLevel::Relaxed);
  }
#endif
  {
    ncclGinBarrierSession<Coop> bar{coop, gin, ncclTeamRail(comm), comm.railGinBarrier, blockIdx.x};
    ncclGinBarrierSession<Coop> rail{coop, gin, ncclTeamTagRail(), blockIdx.x};
    bar.sync(coop, cuda::memory_order_relaxed, ncclGinFenceLevel::Relaxed);
  }
}

__device__ void useGin(ncclDevComm const& comm, ncclWindow_t w, ncclGinDescriptorSmem* smem) {
  ncclGin gin(comm, 1);
  ncclGin_BackendOne<NCCL_NET_DEVICE_GIN_PROXY> proxy(comm, 0);
  ncclTeam world = ncclTeamWorld(comm);
  gin.put(world, 1, w, 0, w, 0, 16);
  gin.put(world, 1, w, 0, w, 0, 16, ncclGin_SignalInc{0}, ncclGin_CounterInc{0}, ncclCoopWarp(),
          ncclGin_DescriptorSmem{smem});
  gin.put(world, 1, ncclSymPtr<int>(w, 0), ncclSymPtr<int>(w, 64), 4, ncclGin_SignalAdd{0, 2});
  gin.putValue(world, 1, w, 0, 7);
  gin.putValue(world, 1, ncclSymPtr<int>(w, 0), 7, ncclGin_None{});
  gin.signal(world, 1, ncclGin_SignalInc{0});
  (void)proxy;
  gin.flush(ncclCoopCta());
  gin.waitCounter(ncclCoopCta(), 0, gin.readCounter(0));
  gin.increaseSignalShadow(0, 1);
  gin.waitSignal(ncclCoopCta(), 0, gin.readSignal(0) + *gin.getSignalShadowPtr(0));
  gin.waitSignalMeetShadow(ncclCoopCta(), 0);
  uint32_t before, delta;
  gin.waitSignalFollowShadow(ncclCoopCta(), 0, 1u, &before, &delta);
  gin.resetCounter(0);
  gin.resetSignal(0);
}

__global__ void everything(ncclDevComm comm, ncclWindow_t w, int* out) {
  __shared__ ncclGinDescriptorSmem smem;
  int n = useCoop(ncclCoopCta()) + useCoop(ncclCoopWarp()) + useCoop(ncclCoopThread());
  n += useCoop(ncclCoopTile<8>()) + useCoop(ncclCoopLanes(0xffu)) + useCoop(ncclCoopWarpSpan(0, 2, 1));
  n += ncclCoopCoalesced().size() + useTeams(comm);
  n += (int)(size_t)usePointers(comm, w, comm.lsaMultimem) + (int)useSymPtr(comm, w);
  useBarriers(ncclCoopCta(), comm);
  useBarriers(ncclCoopWarp(), comm);
  useGin(comm, w, &smem);
  out[threadIdx.x] = n;
}

// The host side: the requirement structs and every host function of the device API.
ncclResult_t hostSide(ncclComm_t comm, ncclWindow_t w) {
  ncclDevCommRequirements_t reqs = {};
  ncclDevResourceRequirements_t res = {};
  ncclTeamRequirements_t team = {};
  ncclLsaBarrierHandle_t lsaBar;
  ncclGinBarrierHandle_t ginBar;
  ncclLLA2AHandle_t a2a;
  ncclNetDeviceHandle_t netDev = {};
  reqs.ginContextCount = (int)netDev.size;
  team.team = ncclTeamWorld(comm);
  reqs.teamRequirementsList = &team;
  reqs.resourceRequirementsList = &res;
  reqs.lsaBarrierCount = 1;
  ncclResult_t r = ncclLsaBarrierCreateRequirement(ncclTeamLsa(comm), 4, &lsaBar, &res);
  if (r == ncclSuccess) r = ncclGinBarrierCreateRequirement(comm, ncclTeamRail(comm), 4, &ginBar, &res);
  if (r == ncclSuccess) r = ncclLLA2ACreateRequirement(1, ncclLLA2ACalcSlots(64, 8), &a2a, &res);
  int n = ncclTeamRankToWorld(comm, ncclTeamLsa(comm), 0) + ncclTeamRankToLsa(comm, ncclTeamWorld(comm), 0);
  n += ncclTeamRankIsMember(ncclTeamWorld(comm), ncclTeamLsa(comm), 0);
  ncclDevComm dev;
  if (r == ncclSuccess) r = ncclDevCommCreate(comm, &reqs, &dev);
  if (r == ncclSuccess) everything<<<1, 64>>>(dev, w, (int*)(size_t)n);
  if (r == ncclSuccess) r = ncclDevCommDestroy(comm, &dev);
  return r;
}
