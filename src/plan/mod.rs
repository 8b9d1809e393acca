//! Planning: a pure function from a group's tasks to what runs them, kernel launches
//! ([`kernels`]) or copy-engine copies ([`copies`]). Nothing here touches CUDA or a communicator;
//! the executor (`comm::launch`) runs whatever [`Plan`] it gets. The costs that decide between
//! algorithms, protocols and copies come from the one cost model, the [`tuner`](crate::tuner).

pub mod copies;
pub mod kernels;

use crate::cuda::CUstream;
use crate::error::Result;
use crate::task::{CommShape, Launch, Task};
use crate::tuner::{self, Allowed};
use crate::types;

pub use copies::{Copy, Mode};

/// One communicator's part of a group, as the planner sees it.
pub struct Member<'a> {
    /// The same on every rank of the communicator (its unique id's magic).
    pub key: u64,
    pub shape: CommShape,
    /// What this communicator's connections allow (`Comm::limits`), on top of the group's
    /// `allowed`: every rank of a communicator plans with the same intersection.
    pub limits: Allowed,
    /// Channels a send or receive with a peer may split over (`Comm::p2p_channels`).
    pub p2p_channels: &'a dyn Fn(usize) -> usize,
    /// Its operations in issue order, with their streams.
    pub ops: &'a [(CUstream, Task)],
}

/// What runs a group.
#[derive(Debug)]
pub enum Plan {
    /// Kernel launches, by member, each member's in order.
    Kernels(Vec<Vec<Launch>>),
    /// Copies among the members' streams (one stream per member). Events cannot join separate
    /// stream captures, so when a stream turns out to be capturing the executor runs
    /// [`kernels`] for the group instead.
    Copies(Vec<Copy>),
}

/// Plans a whole group: copies where they can and (per `mode` and the tuner) should carry it,
/// kernel launches otherwise. A planning error means nothing of the group may run.
pub fn group(members: &[Member], allowed: &Allowed, mode: Mode) -> Result<Plan> {
    if copies::candidate(members, mode, allowed) {
        match copies::plan(members, mode, allowed) {
            Ok(c) => return Ok(Plan::Copies(c)),
            Err(why) => crate::nccl_trace!(crate::debug::Subsys::TUNING, "copy engines not used: {why}"),
        }
    }
    kernels(members, allowed).map(Plan::Kernels)
}

/// The kernel launches of every member of a group.
pub fn kernels(members: &[Member], allowed: &Allowed) -> Result<Vec<Vec<Launch>>> {
    members.iter().map(|m| kernels::plan(&m.shape, &allowed.intersect(&m.limits), m.p2p_channels, m.ops)).collect()
}

/// Rough time of a group, for ncclGroupSimulateEnd, from the tuner's cost model: each
/// collective at the time of the kernel the tuner picks for it, each send or receive as one
/// Simple hop plus its bytes, in microseconds.
pub fn estimate_us(tasks: &[(CommShape, Task)], allowed: &Allowed) -> f64 {
    tasks
        .iter()
        .map(|(shape, task)| match *task {
            Task::Coll(c) => {
                let elem = types::dtype_size(c.dtype).unwrap_or(1);
                tuner::coll_us(c.kind, c.count, elem, shape, allowed)
            }
            Task::Send { bytes, .. } | Task::Recv { bytes, .. } => tuner::p2p_us(bytes),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{CollKind, CollTask, DevOp};

    #[test]
    fn estimates_grow_with_size_and_follow_the_tuner() {
        let shape = CommShape::one_host(2, 64, 64);
        let ar = |count| {
            Task::Coll(CollTask {
                kind: CollKind::AllReduce,
                send: 0,
                recv: 0,
                count,
                dtype: types::ncclFloat32,
                op: DevOp::plain(0),
                root: 0,
                sym: None,
            })
        };
        let est = |tasks: &[(CommShape, Task)]| estimate_us(tasks, &Allowed::ALL);
        let small = est(&[(shape.clone(), ar(1))]);
        assert_eq!(small, tuner::coll_us(CollKind::AllReduce, 1, 4, &shape, &Allowed::ALL));
        assert!(est(&[(shape.clone(), ar(1 << 28))]) > small);
        assert_eq!(
            est(&[(shape.clone(), ar(1)), (shape.clone(), Task::Send { buf: 0, bytes: 8, peer: 1 })]),
            small + tuner::p2p_us(8)
        );
    }
}
