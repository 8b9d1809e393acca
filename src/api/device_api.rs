//! Host functions of NCCL 2.28's device API (`nccl_device.h`): teams, device communicators
//! with their resource window and LSA barriers (docs/ARCHITECTURE.md, "Windows and the device
//! communicator"). GIN and multimem are refused; the LL all-to-all is not implemented yet.

use super::{boundary, boundary_value, comm_arg, non_null, write_out, SUCCESS};
use crate::abi::device_api::{
    ncclDevComm, ncclDevCommRequirements, ncclDevResourceRequirements, ncclGinBarrierHandle, ncclLLA2AHandle,
    ncclLsaBarrierHandle, ncclTeamRequirements, ncclTeam_t,
};
use crate::comm::window::dev_comm::lsa_barrier_bytes;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::topo::Lsa;
use crate::types::{ncclComm_t, ncclResult_t};
use std::ffi::c_int;

fn not_yet(what: &str) -> Result<ncclResult_t> {
    Err(Error::InvalidUsage(format!("{what} (NCCL device API) is not implemented yet in ferronickel")))
}

/// Entries of a requirements list walked at most: more is a cycle or garbage.
const MAX_LIST: usize = 1 << 16;

fn refuse_gin(what: &str) -> Result<()> {
    crate::bail_usage!(
        "{what} asks for GIN (GPU-initiated networking), which ferronickel does not provide; use LSA resources only"
    )
}

fn refuse_multimem(what: &str) -> Result<()> {
    crate::bail_usage!("{what} asks for multimem (NVLink multicast), which ferronickel does not use")
}

fn count_arg(v: c_int, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::InvalidArgument(format!("reqs->{what} {v} is negative")))
}

/// The resource buffers of a requirements list: (size, alignment, where the handle goes).
///
/// # Safety
/// Every `next` pointer of the list is NULL or points to a readable requirement.
unsafe fn resource_list(mut p: *mut ncclDevResourceRequirements) -> Result<Vec<(usize, usize, *mut u32)>> {
    let mut out = Vec::new();
    while !p.is_null() {
        if out.len() == MAX_LIST {
            crate::bail_arg!("reqs->resourceRequirementsList has more than {MAX_LIST} entries (is it a cycle?)");
        }
        // SAFETY: non-NULL, and readable by the caller's contract.
        let r = unsafe { &*p };
        if r.ginSignalCount != 0 || r.ginCounterCount != 0 {
            refuse_gin(&format!(
                "resource requirement {} (ginSignalCount {}, ginCounterCount {})",
                out.len(),
                r.ginSignalCount,
                r.ginCounterCount
            ))?;
        }
        out.push((r.bufferSize, r.bufferAlign, r.outBufferHandle));
        p = r.next;
    }
    Ok(out)
}

/// Checks the team requirements: valid teams of this communicator, no multimem.
///
/// # Safety
/// Every `next` pointer of the list is NULL or points to a readable requirement.
unsafe fn check_teams(c: &Comm, mut p: *mut ncclTeamRequirements) -> Result<()> {
    let mut i = 0;
    while !p.is_null() {
        if i == MAX_LIST {
            crate::bail_arg!("reqs->teamRequirementsList has more than {MAX_LIST} entries (is it a cycle?)");
        }
        // SAFETY: non-NULL, and readable by the caller's contract.
        let t = unsafe { &*p };
        if t.multimem {
            refuse_multimem(&format!("team requirement {i}"))?;
        }
        let tm = t.team;
        if tm.nRanks < 1 || tm.rank < 0 || tm.rank >= tm.nRanks {
            crate::bail_arg!(
                "team requirement {i}: team {{nRanks {}, rank {}, stride {}}} is not a team",
                tm.nRanks,
                tm.rank,
                tm.stride
            );
        }
        world_rank(c, tm, 0)?;
        world_rank(c, tm, tm.nRanks - 1)?;
        p = t.next;
        i += 1;
    }
    Ok(())
}

/// The requirements' counts, checked, and the LSA barriers they ask for. GIN and multimem are
/// refused; the GIN barriers of a rail team that is this rank alone (one LSA team holds the whole
/// communicator) have nothing to cross the network for and are accepted, as NCCL accepts them
/// without GIN, their handles left zero: PyTorch's symmetric memory asks for them on one host.
fn check_requirements(r: &ncclDevCommRequirements, lsa: Lsa, nranks: usize) -> Result<usize> {
    if r.ginForceEnable {
        refuse_gin("reqs->ginForceEnable")?;
    }
    for (v, what) in [(r.ginSignalCount, "ginSignalCount"), (r.ginCounterCount, "ginCounterCount")] {
        if count_arg(v, what)? > 0 {
            refuse_gin(&format!("reqs->{what} {v}"))?;
        }
    }
    if r.lsaMultimem {
        refuse_multimem("reqs->lsaMultimem")?;
    }
    if count_arg(r.lsaLLA2ABlockCount, "lsaLLA2ABlockCount")? > 0
        || count_arg(r.lsaLLA2ASlotCount, "lsaLLA2ASlotCount")? > 0
    {
        not_yet("the LL all-to-all (reqs->lsaLLA2ABlockCount, lsaLLA2ASlotCount)")?;
    }
    count_arg(r.ginContextCount, "ginContextCount")?;
    let rail = count_arg(r.railGinBarrierCount, "railGinBarrierCount")?;
    let barriers = count_arg(r.barrierCount, "barrierCount")?;
    if lsa.size < nranks {
        let teams = nranks / lsa.size;
        if rail > 0 {
            refuse_gin(&format!("reqs->railGinBarrierCount {rail} across {teams} LSA teams"))?;
        }
        if barriers > 0 {
            refuse_gin(&format!(
                "reqs->barrierCount {barriers} across {teams} LSA teams (the world barrier crosses them over the network)"
            ))?;
        }
    }
    Ok(count_arg(r.lsaBarrierCount, "lsaBarrierCount")?.max(barriers))
}

/// Creates a device communicator, collectively: its resource window holds every buffer of
/// `reqs->resourceRequirementsList` and the LSA barriers; GIN and multimem are refused.
#[no_mangle]
pub unsafe extern "C" fn ncclDevCommCreate(
    comm: ncclComm_t,
    reqs: *const ncclDevCommRequirements,
    outDevComm: *mut ncclDevComm,
) -> ncclResult_t {
    boundary("ncclDevCommCreate", || {
        let c = comm_arg(comm)?.ready()?;
        non_null(reqs, "reqs")?;
        non_null(outDevComm, "outDevComm")?;
        // SAFETY: checked non-NULL; the caller passes a readable requirements struct.
        let lsa_barriers = check_requirements(unsafe { &*reqs }, c.lsa, c.nranks)?;
        // SAFETY: as above.
        let r = unsafe { &*reqs };
        // SAFETY: the lists are the caller's, readable by the API's contract.
        let bufs = unsafe { resource_list(r.resourceRequirementsList)? };
        // SAFETY: as above.
        unsafe { check_teams(&c, r.teamRequirementsList)? };
        let sizes: Vec<(usize, usize)> = bufs.iter().map(|b| (b.0, b.1)).collect();
        let (dc, handles) = c.create_dev_comm(&sizes, lsa_barriers)?;
        for (b, h) in bufs.iter().zip(handles) {
            if !b.2.is_null() {
                // SAFETY: the requirement's out pointer, non-NULL, writable by the API's contract.
                unsafe { write_out(b.2, h) };
            }
        }
        // SAFETY: checked non-NULL.
        unsafe { write_out(outDevComm, dc) };
        SUCCESS
    })
}

/// Destroys a device communicator, collectively: its resource window is deregistered and freed.
#[no_mangle]
pub unsafe extern "C" fn ncclDevCommDestroy(comm: ncclComm_t, devComm: *const ncclDevComm) -> ncclResult_t {
    boundary("ncclDevCommDestroy", || {
        if super::left_to_exit("ncclDevCommDestroy") {
            return SUCCESS;
        }
        let c = comm_arg(comm)?.queryable()?;
        non_null(devComm, "devComm")?;
        // SAFETY: checked non-NULL; the caller passes the struct ncclDevCommCreate filled.
        let window = unsafe { (*devComm).resourceWindow } as u64;
        c.destroy_dev_comm(window)?;
        SUCCESS
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

/// Ranks reachable by load/store: consecutive ranks of one host whose GPUs reach each other.
#[no_mangle]
pub unsafe extern "C" fn ncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t {
    boundary_value("ncclTeamLsa", NO_TEAM, || {
        let c = comm_arg(comm)?.queryable()?;
        Ok(ncclTeam_t { nRanks: c.lsa.size as c_int, rank: c.lsa.rank as c_int, stride: 1 })
    })
}

/// Our peers with the same LSA rank in the other LSA teams.
#[no_mangle]
pub unsafe extern "C" fn ncclTeamRail(comm: ncclComm_t) -> ncclTeam_t {
    boundary_value("ncclTeamRail", NO_TEAM, || {
        let c = comm_arg(comm)?.queryable()?;
        let size = c.lsa.size;
        Ok(ncclTeam_t { nRanks: (c.nranks / size) as c_int, rank: (c.rank / size) as c_int, stride: size as c_int })
    })
}

/// Rank `rank` of `team` relative to our own place in it, `base` being our rank in the target
/// numbering of `n` ranks (as the device computes it).
fn team_rank_to(base: usize, n: usize, team: ncclTeam_t, rank: c_int, target: &str) -> Result<c_int> {
    if rank < 0 || rank >= team.nRanks {
        crate::bail_arg!("rank {rank} is out of range for a team of {} ranks", team.nRanks);
    }
    let r = base as i64 + (rank as i64 - team.rank as i64) * team.stride as i64;
    if r < 0 || r >= n as i64 {
        crate::bail_arg!(
            "team {{nRanks {}, rank {}, stride {}}}'s rank {rank} is not in this communicator's {target} ({n} ranks)",
            team.nRanks,
            team.rank,
            team.stride
        );
    }
    Ok(r as c_int)
}

fn world_rank(c: &Comm, team: ncclTeam_t, rank: c_int) -> Result<c_int> {
    team_rank_to(c.rank, c.nranks, team, rank, "world")
}

/// World rank of `rank` in `team` (teams are strided around our own rank); -1 on bad input.
#[no_mangle]
pub unsafe extern "C" fn ncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
    boundary_value("ncclTeamRankToWorld", -1, || world_rank(&*comm_arg(comm)?.queryable()?, team, rank))
}

/// LSA rank of `rank` in `team`; -1 on bad input (or a rank outside our LSA team).
#[no_mangle]
pub unsafe extern "C" fn ncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
    boundary_value("ncclTeamRankToLsa", -1, || {
        let c = comm_arg(comm)?.queryable()?;
        team_rank_to(c.lsa.rank, c.lsa.size, team, rank, "LSA team")
    })
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
    outHandle: *mut ncclLLA2AHandle,
    outReq: *mut ncclDevResourceRequirements,
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

/// The resource requirement of `nBarriers` LSA barriers over `team`: ncclDevCommCreate lays the
/// buffer out and writes its handle into `outHandle->bufHandle`.
#[no_mangle]
pub unsafe extern "C" fn ncclLsaBarrierCreateRequirement(
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut ncclLsaBarrierHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    boundary("ncclLsaBarrierCreateRequirement", || {
        if team.nRanks < 1 || nBarriers < 1 {
            crate::bail_arg!("team.nRanks {} and nBarriers {nBarriers} must be at least 1", team.nRanks);
        }
        non_null(outHandle, "outHandle")?;
        non_null(outReq, "outReq")?;
        let req = ncclDevResourceRequirements {
            bufferSize: lsa_barrier_bytes(nBarriers as usize, team.nRanks as usize),
            bufferAlign: std::mem::size_of::<u32>(),
            // SAFETY: checked non-NULL; a field address, not a read.
            outBufferHandle: unsafe { std::ptr::addr_of_mut!((*outHandle).bufHandle) },
            ..Default::default()
        };
        // SAFETY: both checked non-NULL and writable by the API's contract.
        unsafe {
            write_out(outHandle, ncclLsaBarrierHandle { bufHandle: 0, nBarriers });
            write_out(outReq, req);
        }
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclGinBarrierCreateRequirement(
    comm: ncclComm_t,
    team: ncclTeam_t,
    nBarriers: c_int,
    outHandle: *mut ncclGinBarrierHandle,
    outReq: *mut ncclDevResourceRequirements,
) -> ncclResult_t {
    boundary("ncclGinBarrierCreateRequirement", || {
        comm_arg(comm)?.ready()?;
        if team.nRanks < 1 || nBarriers < 1 {
            crate::bail_arg!("team.nRanks {} and nBarriers {nBarriers} must be at least 1", team.nRanks);
        }
        non_null(outHandle, "outHandle")?;
        non_null(outReq, "outReq")?;
        refuse_gin("ncclGinBarrierCreateRequirement").map(|_| ncclResult_t::ncclSuccess)
    })
}

// The pnccl* profiling twins of this file's exports.
twins! {
    ncclDevCommCreate => pncclDevCommCreate(comm: ncclComm_t, reqs: *const ncclDevCommRequirements,
        outDevComm: *mut ncclDevComm) -> ncclResult_t;
    ncclDevCommDestroy => pncclDevCommDestroy(comm: ncclComm_t, devComm: *const ncclDevComm) -> ncclResult_t;
    ncclTeamWorld => pncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t;
    ncclTeamLsa => pncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t;
    ncclTeamRail => pncclTeamRail(comm: ncclComm_t) -> ncclTeam_t;
    ncclTeamRankToWorld => pncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int;
    ncclTeamRankToLsa => pncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int;
    ncclLLA2ACalcSlots => pncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int;
    ncclLLA2ACreateRequirement => pncclLLA2ACreateRequirement(nBlocks: c_int, nSlots: c_int,
        outHandle: *mut ncclLLA2AHandle, outReq: *mut ncclDevResourceRequirements) -> ncclResult_t;
    ncclLsaBarrierCreateRequirement => pncclLsaBarrierCreateRequirement(team: ncclTeam_t, nBarriers: c_int,
        outHandle: *mut ncclLsaBarrierHandle, outReq: *mut ncclDevResourceRequirements) -> ncclResult_t;
    ncclGinBarrierCreateRequirement => pncclGinBarrierCreateRequirement(comm: ncclComm_t, team: ncclTeam_t,
        nBarriers: c_int, outHandle: *mut ncclGinBarrierHandle, outReq: *mut ncclDevResourceRequirements)
        -> ncclResult_t;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(set: impl Fn(&mut ncclDevCommRequirements), lsa: Lsa, nranks: usize) -> Result<usize> {
        let mut r = ncclDevCommRequirements::default();
        set(&mut r);
        check_requirements(&r, lsa, nranks)
    }

    #[test]
    fn gin_barriers_are_refused_only_where_the_rail_team_crosses_lsa_teams() {
        let one_team = Lsa { rank: 1, size: 4 };
        let split = Lsa { rank: 0, size: 1 };
        assert_eq!(check(|r| r.railGinBarrierCount = 8, one_team, 4).unwrap(), 0);
        assert_eq!(check(|r| r.barrierCount = 3, one_team, 4).unwrap(), 3);
        assert_eq!(check(|r| (r.barrierCount, r.lsaBarrierCount) = (3, 5), one_team, 4).unwrap(), 5);
        let e = check(|r| r.railGinBarrierCount = 8, split, 2).unwrap_err();
        assert!(
            matches!(e, Error::InvalidUsage(_)) && e.to_string().contains("railGinBarrierCount 8 across 2 LSA teams")
        );
        let e = check(|r| r.barrierCount = 1, split, 2).unwrap_err();
        assert!(e.to_string().contains("reqs->barrierCount 1 across 2 LSA teams"), "{e}");
        assert_eq!(check(|r| r.lsaBarrierCount = 2, split, 2).unwrap(), 2);
        let e = check(|r| r.ginSignalCount = 1, one_team, 4).unwrap_err();
        assert!(e.to_string().contains("reqs->ginSignalCount 1 asks for GIN"), "{e}");
    }
}
