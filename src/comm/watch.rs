//! The communicator's side of its liveness watcher (`bootstrap::liveness`): what it does when a
//! peer is lost (stop our kernels, remember who), and what it says of this rank in a hang report
//! (its newest operation, whether it finished), with the summary logged where users look.

use super::{FLAG_ABORT, FLAG_ERROR};
use crate::abi;
use crate::bootstrap::liveness::{self, Lost};
use crate::cuda::{Context, Event, HostMapped};
use crate::hang_report::{self, RankState};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Our operations on the communicator so far, for hang reports: how many were issued and what
/// the newest is (whether it finished, the observer asks the GPU).
#[derive(Default)]
pub(super) struct Ops {
    issued: AtomicU64,
    newest: Mutex<String>,
    /// A hang report was already asked for after the device watchdog fired.
    pub(super) reported: AtomicBool,
}

impl Ops {
    pub(super) fn issue(&self, what: String) {
        *self.newest.lock() = what;
        self.issued.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a launch does, in a hang report: "AllReduce+Send 3 works".
pub(super) fn describe_works(works: &[abi::fnWork]) -> String {
    const NAMES: [&str; 8] = ["AllReduce", "Reduce", "Broadcast", "AllGather", "ReduceScatter", "Send", "Recv", "Copy"];
    let mut names: Vec<&str> = works.iter().map(|w| NAMES.get(w.type_ as usize).copied().unwrap_or("?")).collect();
    names.dedup();
    let elems: u64 = works.iter().map(|w| w.count).sum();
    format!("{} ({} works, {elems} elements)", names.join("+"), works.len())
}

/// The communicator's side of its liveness watcher (bootstrap::liveness), on the watcher thread.
pub(super) struct Observer {
    /// The communicator's id in logs (its bootstrap magic, the same on every rank).
    pub(super) comm_id: u64,
    pub(super) names: Vec<String>,
    pub(super) rank: usize,
    pub(super) lost: Arc<OnceLock<String>>,
    pub(super) flags: Arc<HostMapped>,
    pub(super) ops: Arc<Ops>,
    pub(super) ctx: Arc<Context>,
    pub(super) last: Arc<Event>,
}

impl liveness::Observer for Observer {
    fn describe(&self, rank: usize) -> String {
        self.names.get(rank).cloned().unwrap_or_else(|| format!("rank {rank}"))
    }

    fn lost(&self, lost: Lost) {
        let _ = self.lost.set(lost.text);
        self.flags.set(FLAG_ABORT, 1);
    }

    fn state(&self) -> String {
        let finished = self.ctx.enter().and_then(|_g| self.last.is_done()).unwrap_or(false);
        RankState {
            rank: self.rank,
            who: self.describe(self.rank),
            issued: self.ops.issued.load(Ordering::Relaxed),
            finished,
            what: self.ops.newest.lock().clone(),
            timed_out: self.flags.get(FLAG_ERROR) == abi::FN_DEV_TIMEOUT,
        }
        .encode()
    }

    fn report(&self, lines: Vec<String>) {
        let states: Vec<RankState> = lines.iter().filter_map(|l| RankState::decode(l)).collect();
        for s in &states {
            crate::nccl_info!(
                crate::debug::Subsys::INIT,
                "hang report: {} issued #{} ({}), {}",
                s.who,
                s.issued,
                s.what,
                if s.finished { "finished" } else { "not finished" }
            );
        }
        crate::nccl_warn!("comm {:#018x}: {}", self.comm_id, hang_report::summarize(self.names.len(), &states));
    }
}
