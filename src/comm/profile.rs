//! A group's events for the communicator's profiler plugin (docs/PLUGINS.md, "Profiler"): one
//! `ncclProfileGroup` per communicator and launch, under it one `ncclProfileColl` per collective
//! (with the algorithm, protocol and channels the plan gave it) and one `ncclProfileP2p` per send or
//! receive. They start when the group's plan is made and stop once it is queued on the streams, on
//! every path out, errors included.

use std::ffi::CStr;
use std::sync::atomic::Ordering;

use super::Comm;
use crate::abi::{
    self, fnWork, FN_ALGO_DIRECT, FN_ALGO_ONESHOT, FN_ALGO_RECDBL, FN_ALGO_SYMMETRIC, FN_ALGO_TREE, FN_NTHREADS,
};
use crate::cuda::CUstream;
use crate::plan::kernels::direct_p2p;
use crate::plugin::abi::*;
use crate::plugin::profiler::{Descr, Event};
use crate::task::{CollKind, Launch, Task};
use crate::tuner::{nccl_func, Allowed};
use crate::types::{dtype_size, ncclDataType_t, ncclInt8};

/// Open events of one communicator's part of a group; the tasks' stop before their group's.
pub struct GroupEvents {
    _tasks: Vec<Event>,
    _group: Option<Event>,
}

/// NCCL's name and index of an algorithm; the one-shot and the symmetric kernels, which NCCL's
/// table lacks, are "OneShot" and "Symmetric" with index `NCCL_ALGO_UNDEF` (as a byte) for v1
/// plugins.
fn algo(a: u32) -> (&'static CStr, u8) {
    match a {
        FN_ALGO_TREE => (c"Tree", NCCL_ALGO_TREE as u8),
        FN_ALGO_ONESHOT => (c"OneShot", NCCL_ALGO_UNDEF as u8),
        FN_ALGO_SYMMETRIC => (c"Symmetric", NCCL_ALGO_UNDEF as u8),
        FN_ALGO_DIRECT => (c"Direct", NCCL_ALGO_UNDEF as u8),
        FN_ALGO_RECDBL => (c"RecDoubling", NCCL_ALGO_UNDEF as u8),
        _ => (c"Ring", NCCL_ALGO_RING as u8),
    }
}

fn proto(p: u32) -> (&'static CStr, u8) {
    const NAMES: [&CStr; 3] = [c"LL", c"LL128", c"Simple"];
    (NAMES.get(p as usize).copied().unwrap_or(c"Simple"), p as u8)
}

/// The count and data type a collective's event reports: NCCL plans an all-gather and a broadcast
/// as bytes, so its events give their count in bytes (one rank's part) and the type as ncclInt8;
/// every other collective as the user counted it.
fn reported_count(kind: CollKind, count: usize, dtype: ncclDataType_t) -> (usize, u32) {
    match (kind, dtype_size(dtype)) {
        (CollKind::AllGather | CollKind::Broadcast, Some(size)) => (count.saturating_mul(size), ncclInt8 as u32),
        _ => (count, dtype as u32),
    }
}

/// The events of `comm`'s operations `ops` in a group planned as `launches` (`None`: copy-engine
/// copies, reported as algorithm "CopyEngine", protocol Simple, no channels). Counts each
/// collective's sequence number, plugin or not, as NCCL does.
pub(super) fn start(
    comm: &Comm,
    ops: &[(CUstream, Task)],
    launches: Option<&[Launch]>,
    allowed: &Allowed,
) -> Option<GroupEvents> {
    let colls = || ops.iter().filter_map(|(_, t)| if let Task::Coll(c) = t { Some(c) } else { None });
    let Some(prof) = comm.profiler.as_ref() else {
        for c in colls() {
            comm.ops.coll_seq[nccl_func(c.kind) as usize].fetch_add(1, Ordering::Relaxed);
        }
        return None;
    };
    let group = prof.start_event(&Descr::Group, None);
    let works: Vec<&fnWork> = launches.unwrap_or_default().iter().flat_map(|l| &l.works).collect();
    let mut coll_works = works.iter().filter(|w| (w.type_ as u32) < abi::FN_WORK_SEND);
    let (shape, allowed) = (comm.shape(), allowed.intersect(&comm.limits));
    let mut tasks = Vec::new();
    for (_, t) in ops {
        let d = match *t {
            Task::Coll(c) => {
                let seq = comm.ops.coll_seq[nccl_func(c.kind) as usize].fetch_add(1, Ordering::Relaxed);
                // Zero-count collectives are not planned; direct Simple broadcasts run as sends and
                // receives; the rest are collective works, in issue order.
                let direct = launches.is_some() && c.count > 0 && direct_p2p(&c, &shape, &allowed).is_some();
                let w = if c.count == 0 || direct { None } else { coll_works.next() };
                let (a, p, nch) = match (launches, w) {
                    _ if direct => (algo(FN_ALGO_DIRECT), proto(abi::FN_PROTO_SIMPLE), 1),
                    (Some(_), Some(w)) => (algo(w.algo as u32), proto(w.proto as u32), w.nChannels.min(255) as u8),
                    (Some(_), None) => (algo(abi::FN_ALGO_RING), proto(abi::FN_PROTO_SIMPLE), 0),
                    (None, _) => ((c"CopyEngine", NCCL_ALGO_UNDEF as u8), proto(abi::FN_PROTO_SIMPLE), 0),
                };
                let (count, dtype) = reported_count(c.kind, c.count, c.dtype);
                Descr::Coll {
                    seq,
                    func: nccl_func(c.kind),
                    send: c.send,
                    recv: c.recv,
                    count,
                    root: c.root as i32,
                    dtype,
                    nchannels: nch,
                    nwarps: (FN_NTHREADS / 32) as u8,
                    algo: a,
                    proto: p,
                }
            }
            Task::Send { buf, bytes, peer } | Task::Recv { buf, bytes, peer } => {
                let is_send = matches!(t, Task::Send { .. });
                let ty = if peer == comm.rank {
                    abi::FN_WORK_COPY
                } else if is_send {
                    abi::FN_WORK_SEND
                } else {
                    abi::FN_WORK_RECV
                };
                let parts = works
                    .iter()
                    .find(|w| w.type_ as u32 == ty && w.root as usize == peer && w.count as usize == bytes)
                    .map_or(0, |w| w.nParts);
                Descr::P2p {
                    func: if is_send { ncclFuncSend } else { ncclFuncRecv },
                    buff: buf,
                    dtype: crate::types::ncclInt8 as u32,
                    count: bytes,
                    peer: peer as i32,
                    nchannels: parts,
                }
            }
        };
        tasks.extend(prof.start_event(&d, group.as_ref()));
    }
    Some(GroupEvents { _tasks: tasks, _group: group })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ncclFloat32, ncclFloat64};

    #[test]
    fn all_gathers_and_broadcasts_report_bytes_as_nccl_does() {
        assert_eq!(reported_count(CollKind::AllGather, 1000, ncclFloat32), (4000, ncclInt8 as u32));
        assert_eq!(reported_count(CollKind::Broadcast, 7, ncclFloat64), (56, ncclInt8 as u32));
        assert_eq!(reported_count(CollKind::AllReduce, 1000, ncclFloat32), (1000, ncclFloat32 as u32));
        assert_eq!(reported_count(CollKind::ReduceScatter, 3, ncclFloat64), (3, ncclFloat64 as u32));
        assert_eq!(reported_count(CollKind::Reduce, 5, ncclInt8), (5, ncclInt8 as u32));
    }
}
