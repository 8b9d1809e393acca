/*
 * ferronickel: teams of NCCL 2.28.9's device API. A team (struct ncclTeam, nccl_device/core.h) is
 * an arithmetic progression of world ranks seen from one member: team rank r is world rank
 * myWorldRank + (r - team.rank) * team.stride. The world team has stride 1; the LSA team is the
 * ranks whose memory this GPU can load and store (consecutive world ranks); the rail team is the ranks with the same LSA rank, one per LSA team.
 */
#ifndef NCCL_DEVICE_TEAM_H_
#define NCCL_DEVICE_TEAM_H_
#include "core.h"
#include "utility.h"

#if defined(__cplusplus)
/* Tags naming the communicator's built-in teams in session constructors. */
struct ncclTeamTagWorld {};
struct ncclTeamTagLsa {};
struct ncclTeamTagRail {};

NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamWorld(ncclDevComm const& comm) {
  ncclTeam team;
  team.nRanks = comm.nRanks;
  team.rank = comm.rank;
  team.stride = 1;
  return team;
}

NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamLsa(ncclDevComm const& comm) {
  ncclTeam team;
  team.nRanks = comm.lsaSize;
  team.rank = comm.lsaRank;
  team.stride = 1;
  return team;
}

/* The outer factor of the world by the LSA team: every rank with this rank's LSA rank. */
NCCL_HOST_DEVICE_INLINE ncclTeam ncclTeamRail(ncclDevComm const& comm) {
  ncclTeam team;
  team.nRanks = comm.nRanks / comm.lsaSize;
  team.rank = comm.rank / comm.lsaSize;
  team.stride = comm.lsaSize;
  return team;
}

/* World rank of `team`'s rank `rank` (team: one this rank belongs to). */
NCCL_HOST_DEVICE_INLINE int ncclTeamRankToWorld(ncclDevComm const& comm, ncclTeam team, int rank) {
  return comm.rank + (rank - team.rank) * team.stride;
}

/* LSA rank of `team`'s rank `rank`; meaningful when that rank is in this rank's LSA team. */
NCCL_HOST_DEVICE_INLINE int ncclTeamRankToLsa(ncclDevComm const& comm, ncclTeam team, int rank) {
  return comm.lsaRank + (rank - team.rank) * team.stride;
}
#endif /* __cplusplus */

/* Whether rank `bPeer` of team b is a member of team a (both teams hold the caller). */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE bool ncclTeamRankIsMember(ncclTeam_t a, ncclTeam_t b, int bPeer) {
  int worldDelta = (bPeer - b.rank) * b.stride;
  if (worldDelta % a.stride != 0) return false;
  int aRank = a.rank + worldDelta / a.stride;
  return 0 <= aRank && aRank < a.nRanks;
}

/* Team a's rank of team b's rank `bPeer` (which must be a member of a). */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE int ncclTeamRankToTeam(ncclTeam_t a, ncclTeam_t b, int bPeer) {
  return a.rank + (bPeer - b.rank) * b.stride / a.stride;
}

/* The blocks of `innerSize` consecutive ranks of `parent`: the caller's block ... */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE ncclTeam_t ncclTeamInnerFactor(ncclTeam_t parent, int innerSize) {
  ncclTeam_t team;
  team.nRanks = innerSize;
  team.rank = parent.rank % innerSize;
  team.stride = parent.stride;
  return team;
}

/* ... and the ranks at the caller's place in every block. */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE ncclTeam_t ncclTeamOuterFactor(ncclTeam_t parent, int innerSize) {
  ncclTeam_t team;
  team.nRanks = parent.nRanks / innerSize;
  team.rank = parent.rank / innerSize;
  team.stride = parent.stride * innerSize;
  return team;
}

/* The parent rank of the index-th (counting up from 0) member of `parent` that is not in
 * `subset`, a sub-team of `parent` holding the caller: index ranges over
 * [0, parent.nRanks - subset.nRanks). */
NCCL_EXTERN_C NCCL_HOST_DEVICE_INLINE int ncclTeamRankInDifference(ncclTeam_t parent, ncclTeam_t subset, int index) {
  int step = subset.stride / parent.stride; /* parent ranks between consecutive subset ranks */
  int lowest = parent.rank - subset.rank * step; /* parent rank of subset rank 0 ... */
  if (step < 0) { /* ... or of its last rank when the subset counts down */
    step = -step;
    lowest -= (subset.nRanks - 1) * step;
  }
  if (index < lowest) return index; /* below the subset */
  int past = index - lowest;
  int inGaps = (subset.nRanks - 1) * (step - 1);
  if (past < inGaps) return lowest + 1 + (past / (step - 1)) * step + past % (step - 1);
  return lowest + (subset.nRanks - 1) * step + 1 + (past - inGaps); /* above the subset */
}

#endif /* NCCL_DEVICE_TEAM_H_ */
