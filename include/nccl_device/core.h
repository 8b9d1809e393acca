/*
 * ferronickel: the types of NCCL 2.28.9's device API that host and device share, and the host
 * functions that create them. This header is their one definition: the library binds it with
 * bindgen (build.rs), the device headers (nccl_device.h and the headers under nccl_device/) include it, and a layout
 * test checks every size and offset against NCCL's (docs/ARCHITECTURE.md, "Windows and the device
 * communicator").
 */
#ifndef NCCL_DEVICE_CORE_H_
#define NCCL_DEVICE_CORE_H_

#include <stddef.h>
#include <stdint.h>
#if !defined(__cplusplus)
#include <stdbool.h>
#endif
#include "nccl.h"
/* Linkage and inlining of the device API (NCCL_EXTERN_C, __host__ outside nvcc). */
#include "utility.h"

/* Device-side contexts of the GPU-initiated network; always 0 of them in ferronickel. */
#define NCCL_GIN_MAX_CONTEXTS 4

/* Index of a resource buffer inside the device communicator's resource window, in 128-byte units. */
typedef uint32_t ncclDevResourceHandle;
typedef ncclDevResourceHandle ncclDevResourceHandle_t;
typedef uint32_t ncclGinSignal_t;
typedef uint32_t ncclGinCounter_t;
typedef void* ncclGinWindow_t;

/* A strided set of ranks: world rank of team rank r is myWorldRank + (r - rank) * stride. */
struct ncclTeam {
  int nRanks;
  int rank;
  int stride;
};
typedef struct ncclTeam ncclTeam_t;

/* What ncclWindow_t (nccl.h) points to, in device memory. Byte o of LSA rank p's buffer is at
 * lsaFlatBase + p * stride4G * 4 GiB + o. */
struct ncclWindow_vidmem {
  void* winHost;        /* the library's host record of the window */
  char* lsaFlatBase;    /* LSA rank 0's first byte of the window */
  int lsaRank;
  int worldRank;
  uint32_t stride4G;    /* distance between consecutive LSA ranks, in units of 4 GiB */
  uint32_t mcOffset4K;  /* offset in the multicast object, in 4 KiB units (no multicast: 0) */
  uint32_t ginOffset4K; /* offset in the GIN registration, in 4 KiB units (no GIN: 0) */
  ncclGinWindow_t ginWins[NCCL_GIN_MAX_CONTEXTS];
};

/* Base of a team's multicast mapping (never created by ferronickel: multicast stays off). */
struct ncclMultimemHandle {
  void* mcBasePtr;
};
typedef struct ncclMultimemHandle ncclMultimemHandle_t;

/* Barrier among an LSA team. Its resource buffer holds 32-bit words: nBarriers of local state,
 * nBarriers more, nBarriers multicast inboxes, then nBarriers * team.nRanks unicast inboxes
 * (barrier b, arriving peer q at 3 * nBarriers + b * team.nRanks + q). */
struct ncclLsaBarrierHandle {
  ncclDevResourceHandle_t bufHandle;
  int nBarriers;
};
typedef struct ncclLsaBarrierHandle ncclLsaBarrierHandle_t;

/* Barrier over the GIN (refused by ferronickel; the type is part of ncclDevComm). */
struct ncclGinBarrierHandle {
  ncclGinSignal_t signal0;
  ncclDevResourceHandle_t bufHandle;
};
typedef struct ncclGinBarrierHandle ncclGinBarrierHandle_t;

/* Low-latency all-to-all slots inside the resource window. */
struct ncclLLA2AHandle {
  ncclDevResourceHandle_t bufHandle;
  uint32_t nSlots;
};
typedef struct ncclLLA2AHandle ncclLLA2AHandle_t;

/* Device-memory list of the communicator's registered windows, 32 per block. In C++ the entry is
 * ncclDevCommWindowTable::Entry, in C struct Entry. */
struct ncclDevCommWindowTable {
  struct Entry {
    uintptr_t base;
    uintptr_t size;
    ncclWindow_t window;
  } entries[32];
  struct ncclDevCommWindowTable* next;
};

/* The device communicator: passed by value to kernels. */
struct ncclDevComm {
  int rank;
  int nRanks;
  uint32_t nRanks_rcp32; /* reciprocal of nRanks for fast division on the device */
  int lsaRank;
  int lsaSize;
  uint32_t lsaSize_rcp32;

  struct ncclDevCommWindowTable* windowTable;

  ncclWindow_t resourceWindow;                     /* device copy ... */
  struct ncclWindow_vidmem resourceWindow_inlined; /* ... and its contents, saving a load */

  ncclMultimemHandle_t lsaMultimem;
  ncclLsaBarrierHandle_t lsaBarrier;
  ncclGinBarrierHandle_t railGinBarrier;

  uint8_t ginContextCount;
  uint8_t ginTypes[NCCL_GIN_MAX_CONTEXTS];
  void* ginHandles[NCCL_GIN_MAX_CONTEXTS];
  uint32_t ginSignalBase;
  int ginSignalCount;
  uint32_t ginCounterBase;
  int ginCounterCount;
  uint64_t* ginSignalShadows;
};
typedef struct ncclDevComm ncclDevComm_t;

struct ncclDevResourceRequirements;
typedef struct ncclDevResourceRequirements ncclDevResourceRequirements_t;
struct ncclTeamRequirements;
typedef struct ncclTeamRequirements ncclTeamRequirements_t;

/* What a device communicator must hold. */
struct ncclDevCommRequirements {
  ncclDevResourceRequirements_t* resourceRequirementsList;
  ncclTeamRequirements_t* teamRequirementsList;

  bool lsaMultimem;

  int barrierCount;
  int lsaBarrierCount;
  int railGinBarrierCount;

  int lsaLLA2ABlockCount;
  int lsaLLA2ASlotCount;

  bool ginForceEnable;
  int ginContextCount;
  int ginSignalCount;
  int ginCounterCount;
};
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;

/* One buffer (and GIN signals/counters) of the resource window; a linked list. */
struct ncclDevResourceRequirements {
  ncclDevResourceRequirements_t* next;
  size_t bufferSize;
  size_t bufferAlign;
  ncclDevResourceHandle_t* outBufferHandle; /* if non-null, set by ncclDevCommCreate */
  int ginSignalCount;
  int ginCounterCount;
  ncclGinSignal_t* outGinSignalStart;
  ncclGinCounter_t* outGinCounterStart;
};

/* A team the device communicator must serve (multimem on it is refused by ferronickel). */
struct ncclTeamRequirements {
  ncclTeamRequirements_t* next;
  ncclTeam_t team;
  bool multimem;
  ncclMultimemHandle_t* outMultimemHandle; /* if non-null, set by ncclDevCommCreate */
};

/* Host functions of the device API. */
NCCL_EXTERN_C __host__ ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
                                                      ncclDevComm_t* outDevComm);
NCCL_EXTERN_C __host__ ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm);

NCCL_EXTERN_C __host__ ncclTeam_t ncclTeamWorld(ncclComm_t comm);
NCCL_EXTERN_C __host__ ncclTeam_t ncclTeamLsa(ncclComm_t comm);
NCCL_EXTERN_C __host__ ncclTeam_t ncclTeamRail(ncclComm_t comm);
NCCL_EXTERN_C __host__ int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank);
NCCL_EXTERN_C __host__ int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank);

NCCL_EXTERN_C __host__ ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                                                    ncclLsaBarrierHandle_t* outHandle,
                                                                    ncclDevResourceRequirements_t* outReq);
NCCL_EXTERN_C __host__ ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                                                    ncclGinBarrierHandle_t* outHandle,
                                                                    ncclDevResourceRequirements_t* outReq);
NCCL_EXTERN_C __host__ int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
NCCL_EXTERN_C __host__ ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle,
                                                               ncclDevResourceRequirements_t* outReq);

#endif /* NCCL_DEVICE_CORE_H_ */
