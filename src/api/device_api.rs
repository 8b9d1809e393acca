//! Host functions of NCCL 2.28's device API (`nccl_device.h`). Teams are answered for real;
//! device communicators and their resources (LSA/GIN barriers, LL all-to-all) are not
//! implemented yet and say so.

use super::{boundary, boundary_value, comm_arg, non_null};
use crate::error::Error;
use crate::types::{ncclComm_t, ncclResult_t, ncclTeam_t};
use std::ffi::{c_int, c_void};

fn not_yet(what: &str) -> crate::error::Result<ncclResult_t> {
    Err(Error::InvalidUsage(format!("{what} (NCCL device API) is not implemented yet in ferronickel")))
}

#[no_mangle]
pub unsafe extern "C" fn ncclDevCommCreate(
    comm: ncclComm_t,
    reqs: *const c_void,
    outDevComm: *mut c_void,
) -> ncclResult_t {
    boundary("ncclDevCommCreate", || {
        comm_arg(comm)?.ready()?;
        non_null(reqs, "reqs")?;
        non_null(outDevComm, "outDevComm")?;
        not_yet("ncclDevCommCreate")
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclDevCommDestroy(comm: ncclComm_t, devComm: *const c_void) -> ncclResult_t {
    boundary("ncclDevCommDestroy", || {
        comm_arg(comm)?.queryable()?;
        non_null(devComm, "devComm")?;
        crate::bail_arg!("devComm {devComm:p} was not created by ncclDevCommCreate")
    })
}

/// An empty team: what a team query answers for a bad communicator (after a WARN).
const NO_TEAM: ncclTeam_t = ncclTeam_t { nRanks: 0, rank: -1, stride: 0 };

/// Every rank of the communicator.
#[no_mangle]
pub unsafe extern "C" fn ncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t {
    boundary_value("ncclTeamWorld", NO_TEAM, || {
        let c = comm_arg(comm)?.queryable()?;
        Ok(ncclTeam_t { nRanks: c.nranks as c_int, rank: c.rank as c_int, stride: 1 })
    })
}

/// Ranks reachable by load/store: all of them, since every rank is on this node.
#[no_mangle]
pub unsafe extern "C" fn ncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t {
    ncclTeamWorld(comm)
}

/// Our peers with the same local index on other nodes: just us, on one node.
#[no_mangle]
pub unsafe extern "C" fn ncclTeamRail(comm: ncclComm_t) -> ncclTeam_t {
    boundary_value("ncclTeamRail", NO_TEAM, || {
        let c = comm_arg(comm)?.queryable()?;
        Ok(ncclTeam_t { nRanks: 1, rank: 0, stride: c.nranks as c_int })
    })
}

/// World rank of `rank` in `team` (teams are strided around our own rank); -1 on bad input.
#[no_mangle]
pub unsafe extern "C" fn ncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
    boundary_value("ncclTeamRankToWorld", -1, || {
        let c = comm_arg(comm)?.queryable()?;
        if rank < 0 || rank >= team.nRanks {
            crate::bail_arg!("rank {rank} is out of range for a team of {} ranks", team.nRanks);
        }
        let world = c.rank as i64 + (rank as i64 - team.rank as i64) * team.stride as i64;
        if world < 0 || world >= c.nranks as i64 {
            crate::bail_arg!(
                "team {{nRanks {}, rank {}, stride {}}} does not belong to this communicator",
                team.nRanks,
                team.rank,
                team.stride
            );
        }
        Ok(world as c_int)
    })
}

/// The LSA team is the world here, so an LSA rank is a world rank.
#[no_mangle]
pub unsafe extern "C" fn ncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
    ncclTeamRankToWorld(comm, team, rank)
}

/// Slot count for the LL all-to-all resource, which does not exist yet: -1 after a WARN.
#[no_mangle]
pub unsafe extern "C" fn ncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
    boundary_value("ncclLLA2ACalcSlots", -1, || {
        let _ = (maxElts, maxEltSize);
        not_yet("ncclLLA2ACalcSlots").map(|_| -1)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclLLA2ACreateRequirement(
    nBlocks: c_int,
    nSlots: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> ncclResult_t {
    boundary("ncclLLA2ACreateRequirement", || {
        if nBlocks < 1 || nSlots < 1 {
            crate::bail_arg!("nBlocks {nBlocks} and nSlots {nSlots} must be at least 1");
        }
        non_null(outHandle, "outHandle")?;
        non_null(outReq, "outReq")?;
        not_yet("ncclLLA2ACreateRequirement")
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclLsaBarrierCreateRequirement(
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> ncclResult_t {
    boundary("ncclLsaBarrierCreateRequirement", || {
        if team.nRanks < 1 || nBarriers < 1 {
            crate::bail_arg!("team.nRanks {} and nBarriers {nBarriers} must be at least 1", team.nRanks);
        }
        non_null(outHandle, "outHandle")?;
        non_null(outReq, "outReq")?;
        not_yet("ncclLsaBarrierCreateRequirement")
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclGinBarrierCreateRequirement(
    comm: ncclComm_t,
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut c_void,
    outReq: *mut c_void,
) -> ncclResult_t {
    boundary("ncclGinBarrierCreateRequirement", || {
        comm_arg(comm)?.ready()?;
        if team.nRanks < 1 || nBarriers < 1 {
            crate::bail_arg!("team.nRanks {} and nBarriers {nBarriers} must be at least 1", team.nRanks);
        }
        non_null(outHandle, "outHandle")?;
        non_null(outReq, "outReq")?;
        not_yet("ncclGinBarrierCreateRequirement")
    })
}

// The pnccl* profiling twins of this file's exports.
twins! {
    ncclDevCommCreate => pncclDevCommCreate(comm: ncclComm_t, reqs: *const c_void,
        outDevComm: *mut c_void) -> ncclResult_t;
    ncclDevCommDestroy => pncclDevCommDestroy(comm: ncclComm_t, devComm: *const c_void) -> ncclResult_t;
    ncclTeamWorld => pncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t;
    ncclTeamLsa => pncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t;
    ncclTeamRail => pncclTeamRail(comm: ncclComm_t) -> ncclTeam_t;
    ncclTeamRankToWorld => pncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int;
    ncclTeamRankToLsa => pncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int;
    ncclLLA2ACalcSlots => pncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int;
    ncclLLA2ACreateRequirement => pncclLLA2ACreateRequirement(nBlocks: c_int, nSlots: c_int, outHandle: *mut c_void,
        outReq: *mut c_void) -> ncclResult_t;
    ncclLsaBarrierCreateRequirement => pncclLsaBarrierCreateRequirement(team: ncclTeam_t, nBarriers: c_int,
        outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t;
    ncclGinBarrierCreateRequirement => pncclGinBarrierCreateRequirement(comm: ncclComm_t, team: ncclTeam_t,
        nBarriers: c_int, outHandle: *mut c_void, outReq: *mut c_void) -> ncclResult_t;
}
