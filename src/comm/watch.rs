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
    newest: Mutex<Newest>,
    /// A hang report was already asked for after the device watchdog fired.
    pub(super) reported: AtomicBool,
}

/// What the newest operation is, kept as a few numbers on the launch path and put into words only
/// when a hang report asks ([`Newest::describe`]).
#[derive(Clone, Copy, Default)]
pub(super) enum Newest {
    #[default]
    Nothing,
    /// A kernel launch: the work types it holds (bit `fnWorkType`), how many works, their counts.
    Kernel {
        types: u32,
        works: usize,
        elems: u64,
    },
    CopyGroup,
}

impl Newest {
    pub(super) fn kernel(works: &[abi::fnWork]) -> Newest {
        let types = works.iter().fold(0u32, |m, w| m | 1u32.checked_shl(w.type_ as u32).unwrap_or(0));
        Newest::Kernel { types, works: works.len(), elems: works.iter().map(|w| w.count).sum() }
    }

    /// "AllReduce+Send (3 works, 4096 elements)".
    fn describe(self) -> String {
        const NAMES: [&str; 8] =
            ["AllReduce", "Reduce", "Broadcast", "AllGather", "ReduceScatter", "Send", "Recv", "Copy"];
        match self {
            Newest::Nothing => "nothing yet".into(),
            Newest::CopyGroup => "copy-engine group".into(),
            Newest::Kernel { types, works, elems } => {
                let names: Vec<&str> = (0..NAMES.len()).filter(|t| types & (1 << t) != 0).map(|t| NAMES[t]).collect();
                format!("{} ({works} works, {elems} elements)", names.join("+"))
            }
        }
    }
}

impl Ops {
    pub(super) fn issue(&self, what: Newest) {
        *self.newest.lock() = what;
        self.issued.fetch_add(1, Ordering::Relaxed);
    }
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
            what: self.ops.newest.lock().describe(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_operation_in_words() {
        let work = |ty: u32, count: u64| abi::fnWork { type_: ty as i32, count, ..Default::default() };
        let w = [work(abi::FN_WORK_SEND, 10), work(abi::FN_WORK_RECV, 20), work(abi::FN_WORK_SEND, 30)];
        assert_eq!(Newest::kernel(&w).describe(), "Send+Recv (3 works, 60 elements)");
        assert_eq!(
            Newest::kernel(&[work(abi::FN_WORK_ALLREDUCE, 1024)]).describe(),
            "AllReduce (1 works, 1024 elements)"
        );
        assert_eq!(Newest::CopyGroup.describe(), "copy-engine group");
        assert_eq!(Newest::default().describe(), "nothing yet");
        // A type the host never sends is ignored, not a panic.
        assert_eq!(Newest::kernel(&[work(40, 1)]).describe(), " (1 works, 1 elements)");
    }
}
