//! Communicator creation and teardown.

use super::{boundary, comm_arg, non_null, write_out, SUCCESS};
use crate::abi;
use crate::bootstrap::{self, BootstrapId};
use crate::comm::{self, registry, Comm, CommConfig, CommHandle, Phase};
use crate::cuda;
use crate::error::{Error, Result};
use crate::types::*;
use std::ffi::{c_char, c_int, CStr};
use std::mem::offset_of;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
    boundary("ncclGetUniqueId", || {
        non_null(uniqueId, "uniqueId")?;
        let id = bootstrap::new_unique_id()?;
        // SAFETY: checked non-NULL; the caller provides an ncclUniqueId.
        unsafe { write_out(uniqueId, id.to_unique_id()) };
        SUCCESS
    })
}

/// Reads an `ncclConfig_t`, touching only the fields its `size` covers (older callers pass a
/// smaller struct), and checks every value NCCL checks; the environment's overrides then apply
/// (`CommConfig::with_env`).
///
/// # Safety
/// `config` is NULL or points to at least `config->size` readable bytes.
pub unsafe fn read_config(config: *const ncclConfig_t) -> Result<CommConfig> {
    if config.is_null() {
        return Ok(CommConfig::from_env());
    }
    let mut out = CommConfig { blocking: true, ..Default::default() };
    let base = config as *const u8;
    // SAFETY: the header fields (size, magic, version) exist in every config version.
    let (size, magic) = unsafe { ((*config).size, (*config).magic) };
    if magic != NCCL_CONFIG_MAGIC {
        crate::bail_arg!(
            "config magic {magic:#x} is not NCCL_CONFIG_MAGIC: initialize it with NCCL_CONFIG_INITIALIZER"
        );
    }
    if size < offset_of!(ncclConfig_t, blocking) {
        crate::bail_arg!("config size {size} is too small to be an ncclConfig_t");
    }
    let int = |off: usize| -> Option<c_int> {
        // SAFETY: only read when the caller's struct (size bytes) covers the field.
        (off + 4 <= size)
            .then(|| unsafe { (base.add(off) as *const c_int).read_unaligned() })
            .filter(|&v| v != NCCL_CONFIG_UNDEF_INT)
    };
    let flag = |name: &str, off: usize| -> Result<Option<bool>> {
        match int(off) {
            None => Ok(None),
            Some(0) => Ok(Some(false)),
            Some(1) => Ok(Some(true)),
            Some(v) => Err(Error::InvalidArgument(format!("config.{name} = {v}: must be 0 or 1"))),
        }
    };
    let positive = |name: &str, off: usize| -> Result<Option<usize>> {
        match int(off) {
            None => Ok(None),
            Some(v) if v >= 1 => Ok(Some(v as usize)),
            Some(v) => Err(Error::InvalidArgument(format!("config.{name} = {v}: must be at least 1"))),
        }
    };
    out.blocking = flag("blocking", offset_of!(ncclConfig_t, blocking))?.unwrap_or(true);
    if let Some(v) = int(offset_of!(ncclConfig_t, cgaClusterSize)) {
        if !(0..=8).contains(&v) {
            crate::bail_arg!("config.cgaClusterSize = {v}: must be between 0 and 8");
        }
    }
    out.min_ctas = positive("minCTAs", offset_of!(ncclConfig_t, minCTAs))?;
    out.max_ctas = positive("maxCTAs", offset_of!(ncclConfig_t, maxCTAs))?;
    if let (Some(lo), Some(hi)) = (out.min_ctas, out.max_ctas) {
        if lo > hi {
            crate::bail_arg!("config.minCTAs = {lo} is larger than config.maxCTAs = {hi}");
        }
    }
    flag("splitShare", offset_of!(ncclConfig_t, splitShare))?;
    let string = |off: usize| -> Option<String> {
        if off + std::mem::size_of::<*const c_char>() > size {
            return None;
        }
        // SAFETY: covered by size, as above.
        let p = unsafe { (base.add(off) as *const *const c_char).read_unaligned() };
        // SAFETY: a non-NULL string field is NUL-terminated by the API's contract.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    out.name = string(offset_of!(ncclConfig_t, commName));
    out.net.net_name = string(offset_of!(ncclConfig_t, netName));
    out.net.traffic_class = int(offset_of!(ncclConfig_t, trafficClass));
    flag("collnetEnable", offset_of!(ncclConfig_t, collnetEnable))?;
    if let Some(v) = int(offset_of!(ncclConfig_t, CTAPolicy)) {
        if !(0..=3).contains(&v) {
            crate::bail_arg!("config.CTAPolicy = {v}: must be a combination of NCCL_CTA_POLICY_* flags");
        }
    }
    flag("shrinkShare", offset_of!(ncclConfig_t, shrinkShare))?;
    positive("nvlsCTAs", offset_of!(ncclConfig_t, nvlsCTAs))?;
    out.net_peer_channels = positive("nChannelsPerNetPeer", offset_of!(ncclConfig_t, nChannelsPerNetPeer))?;
    if let Some(n) = out.net_peer_channels.filter(|&n| n > abi::FN_MAX_CHANNELS as usize) {
        crate::bail_arg!("config.nChannelsPerNetPeer = {n}: must be at most {}", abi::FN_MAX_CHANNELS);
    }
    flag("nvlinkCentricSched", offset_of!(ncclConfig_t, nvlinkCentricSched))?;
    Ok(out.with_env())
}

fn check_ranks(nranks: c_int, rank: c_int) -> Result<(usize, usize)> {
    if nranks < 1 {
        crate::bail_arg!("nranks {nranks} must be at least 1");
    }
    if nranks as usize > bootstrap::MAX_RANKS {
        crate::bail_arg!("nranks {nranks} exceeds the limit of {} ranks per communicator", bootstrap::MAX_RANKS);
    }
    if rank < 0 || rank >= nranks {
        crate::bail_arg!("rank {rank} is out of range for nranks {nranks}");
    }
    Ok((nranks as usize, rank as usize))
}

/// Creates a communicator on the caller's current device: blocking, or in the background
/// (returning ncclInProgress) when the config says `blocking = 0`.
fn init_on_current_device(
    newcomm: *mut ncclComm_t,
    id: BootstrapId,
    nranks: usize,
    rank: usize,
    config: CommConfig,
) -> Result<ncclResult_t> {
    // NCCL's first line of a job's log, before anything can fail.
    crate::debug::show_version();
    cuda::init()?;
    let dev = cuda::current_device()?;
    let in_group = crate::group::open()?;
    if config.blocking && !in_group {
        let c = comm::init_rank(&id, nranks, rank, dev, config)?;
        let (ptr, _) = registry::publish(Phase::Ready(Arc::new(c)));
        // SAFETY: newcomm was checked non-NULL by the caller.
        unsafe { write_out(newcomm, ptr) };
        return SUCCESS;
    }
    let blocking = config.blocking;
    let (ptr, phase) = registry::publish(if in_group { Phase::Deferred } else { Phase::Initializing });
    // SAFETY: as above.
    unsafe { write_out(newcomm, ptr) };
    let init = move || {
        settle(Some(phase), blocking, &format!("init of rank {rank}"), || {
            comm::init_rank(&id, nranks, rank, dev, config).map(Some)
        })
    };
    if in_group {
        crate::group::defer_init(Box::new(init), blocking)?;
        return if blocking { SUCCESS } else { Ok(ncclResult_t::ncclInProgress) };
    }
    std::thread::Builder::new()
        .name(format!("fn-init-r{rank}"))
        .spawn(init)
        .map_err(|e| Error::System(format!("could not start the init thread: {e}")))?;
    Ok(ncclResult_t::ncclInProgress)
}

/// Makes a communicator away from its call (in the background, or at the end of the group it
/// was called in) and settles its handle's `phase` (none: the caller gets no communicator, as
/// a split with NCCL_SPLIT_NOCOLOR): Ready, or Failed with the error, which is also returned
/// for the group end to report. A nonblocking one's failure is logged, since no call returns it.
fn settle(
    phase: Option<Arc<parking_lot::Mutex<Phase>>>,
    blocking: bool,
    what: &str,
    make: impl FnOnce() -> Result<Option<Comm>>,
) -> Result<()> {
    if let Some(p) = &phase {
        *p.lock() = Phase::Initializing;
    }
    let made = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(make)) {
        Err(_) => Err(Error::Internal(format!("panic during the {what}"))),
        // A handle waits for a communicator: it must not stay initializing for ever.
        Ok(Ok(None)) if phase.is_some() => Err(Error::Internal(format!("the {what} made no communicator"))),
        Ok(made) => made,
    };
    if let (Err(e), false) = (&made, blocking) {
        crate::nccl_warn!("nonblocking communicator {what}: {e}");
    }
    let (next, outcome) = match made {
        Ok(c) => (c.map(|c| Phase::Ready(Arc::new(c))), Ok(())),
        Err(e) => (Some(Phase::Failed(e.clone())), Err(e)),
    };
    if let (Some(p), Some(next)) = (phase, next) {
        *p.lock() = next;
    }
    outcome
}

fn id_arg(id: &ncclUniqueId) -> Result<BootstrapId> {
    BootstrapId::from_unique_id(id).map_err(|e| e.context("commId"))
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    boundary("ncclCommInitRank", || {
        non_null(comm, "comm")?;
        let (n, r) = check_ranks(nranks, rank)?;
        init_on_current_device(comm, id_arg(&commId)?, n, r, CommConfig::from_env())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    boundary("ncclCommInitRankConfig", || {
        non_null(comm, "comm")?;
        let (n, r) = check_ranks(nranks, rank)?;
        // SAFETY: config is NULL or a caller-provided ncclConfig_t of at least config->size bytes.
        let cfg = unsafe { read_config(config) }?;
        init_on_current_device(comm, id_arg(&commId)?, n, r, cfg)
    })
}

/// ncclCommInitRank with several unique ids (every rank passes the same nId ids).
// Several roots spread the rendezvous in NCCL; every rank has every id, so one root (the
// first) serves all ranks here.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    boundary("ncclCommInitRankScalable", || {
        non_null(newcomm, "newcomm")?;
        let (n, r) = check_ranks(nranks, myrank)?;
        if nId < 1 {
            crate::bail_arg!("nId {nId} must be at least 1");
        }
        non_null(commIds, "commIds")?;
        // SAFETY: as in ncclCommInitRankConfig.
        let cfg = unsafe { read_config(config) }?;
        // SAFETY: commIds is non-NULL and holds nId >= 1 ids.
        let id = id_arg(unsafe { &*commIds })?;
        crate::nccl_info!(
            crate::debug::Subsys::INIT,
            "ncclCommInitRankScalable: rank {r}/{n}, {nId} id(s); the first id's root serves all ranks"
        );
        init_on_current_device(newcomm, id, n, r, cfg)
    })
}

/// One process, `ndev` ranks on devlist (or devices 0..ndev-1 when NULL); devices may repeat.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
    boundary("ncclCommInitAll", || {
        non_null(comm, "comm")?;
        if ndev < 1 {
            crate::bail_arg!("ndev {ndev} must be at least 1");
        }
        // Counts first: one thread and one communicator per rank follow, so an absurd ndev
        // must fail before anything is allocated.
        if ndev as usize > bootstrap::MAX_RANKS {
            crate::bail_arg!("ndev {ndev} exceeds the limit of {} ranks per communicator", bootstrap::MAX_RANKS);
        }
        let n = ndev as usize;
        let devs: Vec<i32> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: a non-NULL devlist holds ndev ints by the API's contract.
            unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
        };
        if let Some(&bad) = devs.iter().find(|&&d| d < 0) {
            crate::bail_arg!("devlist contains invalid device {bad}");
        }
        crate::debug::show_version();
        cuda::init()?;
        let count = cuda::device_count()?;
        if let Some(&bad) = devs.iter().find(|&&d| d >= count) {
            crate::bail_arg!("devlist contains device {bad}, but only {count} CUDA device(s) exist");
        }
        let id = bootstrap::new_unique_id()?;
        let threads: Vec<_> = devs
            .iter()
            .enumerate()
            .map(|(rank, &dev)| {
                std::thread::Builder::new()
                    .name(format!("fn-initall-r{rank}"))
                    .spawn(move || comm::init_rank(&id, n, rank, dev, CommConfig::from_env()))
            })
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::System(format!("could not start init threads: {e}")))?;
        let results: Vec<Result<Comm>> = threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err(Error::Internal("panic in an init thread".into()))))
            .collect();
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            return Err(e.clone());
        }
        for (i, c) in results.into_iter().enumerate() {
            let (ptr, _) = registry::publish(Phase::Ready(Arc::new(c.expect("checked above"))));
            // SAFETY: comm holds ndev handles by the API's contract.
            unsafe { write_out(comm.add(i), ptr) };
        }
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    boundary("ncclCommSplit", || {
        let parent = comm_arg(comm)?.ready()?;
        non_null(newcomm, "newcomm")?;
        if color < NCCL_SPLIT_NOCOLOR {
            crate::bail_arg!("color {color} must be non-negative or NCCL_SPLIT_NOCOLOR");
        }
        // SAFETY: as in ncclCommInitRankConfig. Without a config the child inherits the parent's.
        let cfg = if config.is_null() { parent.config.clone() } else { unsafe { read_config(config) }? };
        // Inside a group the split's rendezvous runs at the group's end, with the splits of the
        // other ranks this thread drives; the end waits for it. A nonblocking config runs it in
        // the call all the same: in the background it would share the parent's bootstrap with
        // the caller's next operations on the parent.
        if crate::group::open()? {
            let (ptr, phase) = match color {
                // No communicator for this rank, but it takes part in the rendezvous all the same.
                NCCL_SPLIT_NOCOLOR => (std::ptr::null_mut(), None),
                _ => {
                    let (ptr, phase) = registry::publish(Phase::Deferred);
                    (ptr, Some(phase))
                }
            };
            // SAFETY: checked non-NULL above.
            unsafe { write_out(newcomm, ptr) };
            crate::group::defer_init(
                Box::new(move || settle(phase, true, "split", || comm::split(&parent, color, key, cfg))),
                true,
            )?;
            return SUCCESS;
        }
        let ptr = match comm::split(&parent, color, key, cfg)? {
            Some(c) => registry::publish(Phase::Ready(Arc::new(c))).0,
            None => std::ptr::null_mut(),
        };
        // SAFETY: checked non-NULL above.
        unsafe { write_out(newcomm, ptr) };
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ncclResult_t {
    boundary("ncclCommShrink", || {
        let parent = comm_arg(comm)?.queryable()?;
        non_null(newcomm, "newcomm")?;
        if excludeRanksCount < 0 || excludeRanksCount as usize >= parent.nranks {
            crate::bail_arg!("excludeRanksCount {excludeRanksCount} must be in 0..{}", parent.nranks);
        }
        if excludeRanksCount > 0 {
            non_null(excludeRanksList, "excludeRanksList")?;
        }
        if shrinkFlags & !NCCL_SHRINK_ABORT != 0 {
            crate::bail_arg!("shrinkFlags {shrinkFlags:#x} has bits other than NCCL_SHRINK_ABORT");
        }
        let excluded: Vec<usize> = if excludeRanksCount == 0 {
            Vec::new()
        } else {
            // SAFETY: a non-NULL list of excludeRanksCount ints by the API's contract.
            unsafe { std::slice::from_raw_parts(excludeRanksList, excludeRanksCount as usize) }
                .iter()
                .map(|&r| super::rank_arg(r, parent.nranks, "excludeRanksList entry"))
                .collect::<Result<_>>()?
        };
        if let Some(dup) = excluded.iter().enumerate().find(|(i, r)| excluded[..*i].contains(r)) {
            crate::bail_arg!("excludeRanksList names rank {} twice", dup.1);
        }
        // SAFETY: as in ncclCommInitRankConfig. Without a config the child inherits the parent's.
        let cfg = if config.is_null() { parent.config.clone() } else { unsafe { read_config(config) }? };
        if shrinkFlags & NCCL_SHRINK_ABORT != 0 {
            // Ongoing parent work may wait on an excluded (dead) rank: stop it first.
            parent.request_abort();
            parent.wait_idle(Some(Instant::now() + Duration::from_secs(10)))?;
        }
        // As a split: inside a group at the group's end, which waits for it; else in the call.
        if crate::group::open()? {
            let (ptr, phase) = registry::publish(Phase::Deferred);
            // SAFETY: checked non-NULL above.
            unsafe { write_out(newcomm, ptr) };
            let shrink =
                move || settle(Some(phase), true, "shrink", || comm::shrink(&parent, &excluded, cfg).map(Some));
            crate::group::defer_init(Box::new(shrink), true)?;
            return SUCCESS;
        }
        let child = comm::shrink(&parent, &excluded, cfg)?;
        let (ptr, _) = registry::publish(Phase::Ready(Arc::new(child)));
        // SAFETY: checked non-NULL above.
        unsafe { write_out(newcomm, ptr) };
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
    boundary("ncclCommRevoke", || {
        let c = comm_arg(comm)?.queryable()?;
        if revokeFlags != 0 {
            crate::bail_arg!("revokeFlags {revokeFlags:#x} must be NCCL_REVOKE_DEFAULT (0)");
        }
        // Local, as every NCCL call on a communicator: each rank that wants its work stopped
        // revokes, then the ranks shrink (or abort).
        c.revoke(Duration::from_secs(10))?;
        SUCCESS
    })
}

/// Waits out a background init so teardown sees a settled phase. One deferred to the end of
/// the group it was called in has not started, and would never settle before that end.
fn settled(handle: &CommHandle) -> Result<()> {
    loop {
        match *handle.phase.lock() {
            Phase::Deferred => return Err(Error::InvalidUsage(registry::DEFERRED.into())),
            Phase::Initializing => {}
            _ => return Ok(()),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    boundary("ncclCommFinalize", || {
        let handle = comm_arg(comm)?;
        settled(&handle)?;
        let c = handle.ready()?;
        c.wait_idle(None)?;
        *handle.phase.lock() = Phase::Finalized(c);
        SUCCESS
    })
}

/// Destroy and abort share this: NULL is accepted and ignored (as NCCL does), a background init
/// is waited out, `stop` quiesces the communicator, then the handle is retired and everything it
/// holds is freed. If `stop` fails the communicator stays as it was.
fn teardown(comm: ncclComm_t, stop: impl FnOnce(&Comm) -> Result<()>) -> Result<ncclResult_t> {
    if comm.is_null() || super::left_to_exit("teardown") {
        return SUCCESS;
    }
    let handle = comm_arg(comm)?;
    settled(&handle)?;
    let live = match &*handle.phase.lock() {
        Phase::Ready(c) | Phase::Finalized(c) => Some(c.clone()),
        _ => None,
    };
    if let Some(c) = live {
        crate::nccl_info!(
            crate::debug::Subsys::INIT,
            "comm {comm:p} rank {} nranks {} cudaDev {} - teardown START",
            c.rank,
            c.nranks,
            c.dev
        );
        stop(&c)?;
    }
    // The caller gives the handle up with this call.
    registry::retire(comm);
    crate::nccl_info!(crate::debug::Subsys::INIT, "comm {comm:p} - teardown COMPLETE");
    SUCCESS
}

/// Waits for the communicator's work, then frees everything it holds. NULL is accepted.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    // Our kernels time out (NCCL_WATCHDOG_TIMEOUT_MS) rather than hang, so the wait ends.
    boundary("ncclCommDestroy", || teardown(comm, |c| c.wait_idle(None).map(|_| ())))
}

/// Stops the communicator's kernels and frees everything it holds. NULL is accepted.
// The kernels poll a host-mapped abort flag.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    boundary("ncclCommAbort", || {
        teardown(comm, |c| {
            c.request_abort();
            if !c.wait_idle(Some(Instant::now() + Duration::from_secs(10)))? {
                crate::nccl_warn!(
                    "ncclCommAbort: kernels of rank {} did not stop within 10 s; leaving their buffers allocated",
                    c.rank
                );
                c.leak_resources();
            }
            Ok(())
        })
    })
}

// The pnccl* profiling twins of this file's exports.
twins! {
    ncclGetUniqueId => pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t;
    ncclCommInitRank => pncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId,
        rank: c_int) -> ncclResult_t;
    ncclCommInitRankConfig => pncclCommInitRankConfig(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId,
        rank: c_int, config: *mut ncclConfig_t) -> ncclResult_t;
    ncclCommInitRankScalable => pncclCommInitRankScalable(newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int,
        nId: c_int, commIds: *mut ncclUniqueId, config: *mut ncclConfig_t) -> ncclResult_t;
    ncclCommInitAll => pncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t;
    ncclCommSplit => pncclCommSplit(comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t) -> ncclResult_t;
    ncclCommShrink => pncclCommShrink(comm: ncclComm_t, excludeRanksList: *mut c_int, excludeRanksCount: c_int,
        newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, shrinkFlags: c_int) -> ncclResult_t;
    ncclCommRevoke => pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t;
    ncclCommFinalize => pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t;
    ncclCommDestroy => pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t;
    ncclCommAbort => pncclCommAbort(comm: ncclComm_t) -> ncclResult_t;
}

#[cfg(test)]
mod settle_tests {
    use super::*;

    fn phase() -> Arc<parking_lot::Mutex<Phase>> {
        Arc::new(parking_lot::Mutex::new(Phase::Deferred))
    }

    fn failed(p: &Arc<parking_lot::Mutex<Phase>>) -> String {
        match &*p.lock() {
            Phase::Failed(e) => e.to_string(),
            _ => "not failed".into(),
        }
    }

    /// A communicator made away from its call always leaves its handle settled: failed with the
    /// error (also returned, for a group end to report), whether the init failed, panicked or
    /// made nothing; a split without a color has no handle and succeeds with nothing.
    #[test]
    fn a_handle_never_stays_initializing() {
        let p = phase();
        let e = settle(Some(p.clone()), true, "init of rank 3", || Err(Error::Remote("rank 1 is gone".into())));
        assert!(e.unwrap_err().to_string().contains("rank 1 is gone"));
        assert!(failed(&p).contains("rank 1 is gone"));

        let p = phase();
        let e = settle(Some(p.clone()), false, "split", || panic!("boom"));
        assert!(e.unwrap_err().to_string().contains("panic during the split"));
        assert!(failed(&p).contains("panic during the split"));

        let p = phase();
        assert!(settle(Some(p.clone()), true, "split", || Ok(None)).is_err());
        assert!(failed(&p).contains("made no communicator"));

        assert!(settle(None, true, "split", || Ok(None)).is_ok());
    }
}
