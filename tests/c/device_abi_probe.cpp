/* Prints the size and alignment of every host/device shared type of the device API and the offset
 * and size of each of its fields. tests/device_abi.rs builds it against our
 * include/nccl_device/core.h and against NVIDIA's headers (PROBE_TYPES names the header with the
 * struct bodies) and compares the two outputs line by line. */
#include PROBE_TYPES
#include <stddef.h>
#include <stdio.h>

#define TYPE(T) printf("type %s size %zu align %zu\n", #T, sizeof(T), alignof(T))
#define FIELD(T, f) printf("field %s.%s offset %zu size %zu\n", #T, #f, offsetof(T, f), sizeof(((T*)0)->f))

int main(void) {
  TYPE(ncclTeam_t);
  FIELD(ncclTeam_t, nRanks);
  FIELD(ncclTeam_t, rank);
  FIELD(ncclTeam_t, stride);

  TYPE(ncclDevResourceHandle_t);
  TYPE(ncclGinSignal_t);
  TYPE(ncclGinCounter_t);
  TYPE(ncclGinWindow_t);
  printf("NCCL_GIN_MAX_CONTEXTS %d\n", NCCL_GIN_MAX_CONTEXTS);

  TYPE(struct ncclWindow_vidmem);
  FIELD(struct ncclWindow_vidmem, winHost);
  FIELD(struct ncclWindow_vidmem, lsaFlatBase);
  FIELD(struct ncclWindow_vidmem, lsaRank);
  FIELD(struct ncclWindow_vidmem, worldRank);
  FIELD(struct ncclWindow_vidmem, stride4G);
  FIELD(struct ncclWindow_vidmem, mcOffset4K);
  FIELD(struct ncclWindow_vidmem, ginOffset4K);
  FIELD(struct ncclWindow_vidmem, ginWins);

  TYPE(ncclMultimemHandle_t);
  FIELD(ncclMultimemHandle_t, mcBasePtr);

  TYPE(ncclLsaBarrierHandle_t);
  FIELD(ncclLsaBarrierHandle_t, bufHandle);
  FIELD(ncclLsaBarrierHandle_t, nBarriers);

  TYPE(ncclGinBarrierHandle_t);
  FIELD(ncclGinBarrierHandle_t, signal0);
  FIELD(ncclGinBarrierHandle_t, bufHandle);

  TYPE(ncclLLA2AHandle_t);
  FIELD(ncclLLA2AHandle_t, bufHandle);
  FIELD(ncclLLA2AHandle_t, nSlots);

  TYPE(ncclDevCommWindowTable::Entry);
  FIELD(ncclDevCommWindowTable::Entry, base);
  FIELD(ncclDevCommWindowTable::Entry, size);
  FIELD(ncclDevCommWindowTable::Entry, window);
  TYPE(struct ncclDevCommWindowTable);
  FIELD(struct ncclDevCommWindowTable, entries);
  FIELD(struct ncclDevCommWindowTable, next);

  TYPE(ncclDevComm_t);
  FIELD(ncclDevComm_t, rank);
  FIELD(ncclDevComm_t, nRanks);
  FIELD(ncclDevComm_t, nRanks_rcp32);
  FIELD(ncclDevComm_t, lsaRank);
  FIELD(ncclDevComm_t, lsaSize);
  FIELD(ncclDevComm_t, lsaSize_rcp32);
  FIELD(ncclDevComm_t, windowTable);
  FIELD(ncclDevComm_t, resourceWindow);
  FIELD(ncclDevComm_t, resourceWindow_inlined);
  FIELD(ncclDevComm_t, lsaMultimem);
  FIELD(ncclDevComm_t, lsaBarrier);
  FIELD(ncclDevComm_t, railGinBarrier);
  FIELD(ncclDevComm_t, ginContextCount);
  FIELD(ncclDevComm_t, ginTypes);
  FIELD(ncclDevComm_t, ginHandles);
  FIELD(ncclDevComm_t, ginSignalBase);
  FIELD(ncclDevComm_t, ginSignalCount);
  FIELD(ncclDevComm_t, ginCounterBase);
  FIELD(ncclDevComm_t, ginCounterCount);
  FIELD(ncclDevComm_t, ginSignalShadows);

  TYPE(ncclDevCommRequirements_t);
  FIELD(ncclDevCommRequirements_t, resourceRequirementsList);
  FIELD(ncclDevCommRequirements_t, teamRequirementsList);
  FIELD(ncclDevCommRequirements_t, lsaMultimem);
  FIELD(ncclDevCommRequirements_t, barrierCount);
  FIELD(ncclDevCommRequirements_t, lsaBarrierCount);
  FIELD(ncclDevCommRequirements_t, railGinBarrierCount);
  FIELD(ncclDevCommRequirements_t, lsaLLA2ABlockCount);
  FIELD(ncclDevCommRequirements_t, lsaLLA2ASlotCount);
  FIELD(ncclDevCommRequirements_t, ginForceEnable);
  FIELD(ncclDevCommRequirements_t, ginContextCount);
  FIELD(ncclDevCommRequirements_t, ginSignalCount);
  FIELD(ncclDevCommRequirements_t, ginCounterCount);

  TYPE(ncclDevResourceRequirements_t);
  FIELD(ncclDevResourceRequirements_t, next);
  FIELD(ncclDevResourceRequirements_t, bufferSize);
  FIELD(ncclDevResourceRequirements_t, bufferAlign);
  FIELD(ncclDevResourceRequirements_t, outBufferHandle);
  FIELD(ncclDevResourceRequirements_t, ginSignalCount);
  FIELD(ncclDevResourceRequirements_t, ginCounterCount);
  FIELD(ncclDevResourceRequirements_t, outGinSignalStart);
  FIELD(ncclDevResourceRequirements_t, outGinCounterStart);

  TYPE(ncclTeamRequirements_t);
  FIELD(ncclTeamRequirements_t, next);
  FIELD(ncclTeamRequirements_t, team);
  FIELD(ncclTeamRequirements_t, multimem);
  FIELD(ncclTeamRequirements_t, outMultimemHandle);

  printf("END\n");
  return 0;
}
