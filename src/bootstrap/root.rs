//! The bootstrap root: collects one registration per rank and hands every rank the peer table.
//!
//! [`RootState`] is the whole protocol as a pure state machine: it is fed registrations and the
//! current time, and answers with [`Action`]s; it does no I/O and reads no clock, so every
//! transition is unit-tested. [`spawn`] is the thin socket edge that runs it on a thread.

use std::fmt::Debug;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use super::net::{Acceptor, FrameStream};
use super::wire::{Msg, RefuseReason};
use crate::error::{Error, Result};

/// Longest wait the bootstrap honours (longer requests are cut to it), so that deadline
/// arithmetic cannot overflow whatever a caller or a peer asks for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

/// A rank's registration, as decoded from [`Msg::Register`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    pub magic: u64,
    pub rank: u32,
    pub nranks: u32,
    pub listen: SocketAddr,
    /// How long the root waits for the others, counted from the first accepted registration.
    pub timeout: Duration,
}

/// What the edge must do; `C` names a connection (the edge's handle, opaque here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action<C> {
    /// Send `reason` to this connection as a refusal, log it, close it. The root goes on.
    Reject { conn: C, reason: String },
    /// Every rank is in: send `table` to every connection (`conns[r]` is rank r's), then exit.
    Complete { conns: Vec<C>, table: Vec<SocketAddr> },
    /// The deadline passed: send `text` to every registered connection, then exit.
    Missing { conns: Vec<C>, missing: Vec<usize>, text: String },
}

#[derive(Debug)]
pub struct RootState<C> {
    magic: u64,
    /// Fixed by the first accepted registration, with the rank that gave it.
    nranks: Option<(usize, u32)>,
    slots: Vec<Option<(C, SocketAddr)>>,
    first: Option<(Instant, Duration)>,
    finished: bool,
}

impl<C: Copy + Debug> RootState<C> {
    pub fn new(magic: u64) -> Self {
        RootState { magic, nranks: None, slots: Vec::new(), first: None, finished: false }
    }

    /// When [`poll`](Self::poll) will report missing ranks; `None` before the first registration
    /// (the id may legitimately be handed out long before anyone calls init, as in NCCL).
    pub fn deadline(&self) -> Option<Instant> {
        self.first.map(|(at, timeout)| at + timeout)
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    pub fn on_register(&mut self, conn: C, reg: Registration, now: Instant) -> Option<Action<C>> {
        let reject = |reason: String| Some(Action::Reject { conn, reason });
        let rank = reg.rank as usize;
        if self.finished {
            return reject("the bootstrap root has already finished".into());
        }
        if reg.magic != self.magic {
            return reject(format!(
                "rank {rank} presented a unique id whose magic does not match this root's; \
                 every rank must use the id from the same ncclGetUniqueId call"
            ));
        }
        if reg.nranks == 0 || reg.rank >= reg.nranks {
            return reject(format!("rank {rank} is out of range for nranks {}", reg.nranks));
        }
        match self.nranks {
            Some((n, by)) if n != reg.nranks as usize => {
                return reject(format!("nranks {} differs from {n} given by rank {by}", reg.nranks));
            }
            Some(_) => {}
            None => {
                self.nranks = Some((reg.nranks as usize, reg.rank));
                self.slots = vec![None; reg.nranks as usize];
                self.first = Some((now, reg.timeout.min(MAX_TIMEOUT)));
            }
        }
        if let Some((_, by)) = self.slots[rank] {
            return reject(format!("rank {rank} already registered by the process listening at {by}"));
        }
        self.slots[rank] = Some((conn, reg.listen));
        if self.slots.iter().any(Option::is_none) {
            return None;
        }
        self.finished = true;
        let (conns, table) = self.slots.iter().flatten().copied().unzip();
        Some(Action::Complete { conns, table })
    }

    /// What the root is waiting for, for progress lines: the ranks not registered yet.
    pub fn waiting_for(&self) -> String {
        match self.nranks {
            None => "the first rank to register with the root".into(),
            Some((n, _)) => {
                let missing: Vec<usize> = (0..n).filter(|&r| self.slots[r].is_none()).collect();
                format!("rank(s) {missing:?} to register with the root ({} of {n} in)", n - missing.len())
            }
        }
    }

    /// Reports the missing ranks once the deadline has passed.
    pub fn poll(&mut self, now: Instant) -> Option<Action<C>> {
        let (_, timeout) = self.first?;
        if self.finished || now < self.deadline()? {
            return None;
        }
        self.finished = true;
        let missing: Vec<usize> = (0..self.slots.len()).filter(|&r| self.slots[r].is_none()).collect();
        let text = format!(
            "bootstrap: rank(s) {missing:?} never registered with the root within {timeout:?}; \
             check that every process called ncclCommInitRank with the same unique id"
        );
        let conns = self.slots.iter().flatten().map(|&(c, _)| c).collect();
        Some(Action::Missing { conns, missing, text })
    }
}

/// How long the root keeps trying to deliver one reply; a rank that does not read it is gone.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs a root on `listener` in a background thread that exits once every rank has the table
/// or the missing ranks have been told off.
pub fn spawn(listener: TcpListener, magic: u64) -> Result<()> {
    let addr = listener.local_addr()?;
    let acceptor = Acceptor::new(listener)?;
    std::thread::Builder::new()
        .name("nccl-bootstrap-root".into())
        .spawn(move || run(acceptor, magic, addr))
        .map(drop)
        .map_err(|e| Error::System(format!("bootstrap: could not start the root thread: {e}")))
}

fn run(mut acceptor: Acceptor, magic: u64, addr: SocketAddr) {
    crate::nccl_info!(crate::debug::Subsys::BOOTSTRAP, "Bootstrap root listening on {addr}");
    let mut state = RootState::<usize>::new(magic);
    let mut conns: Vec<Option<FrameStream>> = Vec::new();
    loop {
        if let Some(action) = state.poll(Instant::now()) {
            return perform(action, &mut conns);
        }
        let waiting_for = || state.waiting_for();
        let arrival = match acceptor.next(state.deadline(), &waiting_for) {
            Ok(Some(a)) => a,
            Ok(None) => continue,
            Err(e) => {
                crate::nccl_warn!("Bootstrap root at {addr} stops: {e}");
                return;
            }
        };
        let Msg::Register { magic, rank, nranks, listen, timeout_ms } = arrival.msg else {
            crate::nccl_warn!(
                "Bootstrap root: dropped a connection from {} that sent {} instead of a registration",
                arrival.from,
                arrival.msg.kind_name()
            );
            continue;
        };
        let reg = Registration { magic, rank, nranks, listen, timeout: Duration::from_millis(timeout_ms) };
        conns.push(Some(arrival.conn));
        if let Some(action) = state.on_register(conns.len() - 1, reg, Instant::now()) {
            perform(action, &mut conns);
            if state.is_finished() {
                crate::nccl_info!(crate::debug::Subsys::BOOTSTRAP, "Bootstrap root at {addr} done");
                return;
            }
        }
    }
}

fn perform(action: Action<usize>, conns: &mut [Option<FrameStream>]) {
    let deadline = Instant::now() + REPLY_TIMEOUT;
    let mut reply = |c: usize, msg: &Msg| {
        if let Some(mut s) = conns[c].take() {
            if let Err(e) = s.send(msg, deadline) {
                crate::nccl_warn!("Bootstrap root: could not reply to {}: {e}", s.peer());
            }
        }
    };
    match action {
        Action::Reject { conn, reason } => {
            crate::nccl_warn!("Bootstrap root: refused a registration: {reason}");
            reply(conn, &Msg::Refused { reason: RefuseReason::Rejected, text: reason });
        }
        Action::Complete { conns: ranks, table } => {
            crate::nccl_info!(crate::debug::Subsys::BOOTSTRAP, "Bootstrap root: all {} ranks registered", table.len());
            let msg = Msg::PeerTable { peers: table };
            ranks.into_iter().for_each(|c| reply(c, &msg));
        }
        Action::Missing { conns: ranks, missing: _, text } => {
            crate::nccl_warn!("{text}");
            let msg = Msg::Refused { reason: RefuseReason::Missing, text };
            ranks.into_iter().for_each(|c| reply(c, &msg));
        }
    }
}

/// The reply a rank waits for after registering: only a table or a refusal are legal.
pub fn check_reply(msg: Msg, rank: usize, nranks: usize, root: SocketAddr) -> Result<Vec<SocketAddr>> {
    match msg {
        Msg::PeerTable { peers } if peers.len() == nranks => Ok(peers),
        Msg::PeerTable { peers } => Err(Error::Remote(format!(
            "bootstrap: the root at {root} sent rank {rank} a table of {} peers, expected {nranks}",
            peers.len()
        ))),
        Msg::Refused { reason: RefuseReason::Missing, text } => Err(Error::System(text)),
        Msg::Refused { reason: RefuseReason::Rejected, text } => {
            Err(Error::InvalidUsage(format!("bootstrap: the root at {root} refused rank {rank}: {text}")))
        }
        other => Err(Error::Remote(format!(
            "bootstrap: the root at {root} sent rank {rank} an unexpected {} frame",
            other.kind_name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAGIC: u64 = 0x5eed;
    const T: Duration = Duration::from_secs(5);

    fn reg(rank: u32, nranks: u32) -> Registration {
        Registration {
            magic: MAGIC,
            rank,
            nranks,
            listen: SocketAddr::from(([10, 0, 0, rank as u8], 1000 + rank as u16)),
            timeout: T,
        }
    }

    fn reason(a: Option<Action<u32>>) -> String {
        match a {
            Some(Action::Reject { reason, .. }) => reason,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn completes_in_any_order_and_indexes_by_rank() {
        let t0 = Instant::now();
        let mut s = RootState::new(MAGIC);
        assert_eq!(s.deadline(), None);
        assert_eq!(s.on_register(12, reg(2, 3), t0), None);
        assert_eq!(s.deadline(), Some(t0 + T));
        assert_eq!(s.on_register(10, reg(0, 3), t0 + T / 2), None);
        assert_eq!(s.poll(t0 + T / 2), None);
        let done = s.on_register(11, reg(1, 3), t0 + T / 2);
        assert_eq!(
            done,
            Some(Action::Complete { conns: vec![10, 11, 12], table: (0..3).map(|r| reg(r, 3).listen).collect() })
        );
        assert!(s.is_finished());
        assert_eq!(s.poll(t0 + 2 * T), None, "a finished root reports nothing more");
    }

    #[test]
    fn single_rank_completes_at_once() {
        let mut s = RootState::new(MAGIC);
        assert!(matches!(s.on_register(1u32, reg(0, 1), Instant::now()), Some(Action::Complete { .. })));
    }

    #[test]
    fn wrong_magic_is_rejected_and_changes_nothing() {
        let mut s = RootState::new(MAGIC);
        let mut r = reg(0, 2);
        r.magic = MAGIC + 1;
        assert!(reason(s.on_register(1, r, Instant::now())).contains("magic does not match"));
        assert_eq!(s.deadline(), None, "a stranger does not start the clock");
        // Its rank and nranks were not learned: an honest rank with other values is fine.
        assert_eq!(s.on_register(2, reg(0, 3), Instant::now()), None);
    }

    #[test]
    fn rank_out_of_range() {
        let mut s = RootState::new(MAGIC);
        assert_eq!(reason(s.on_register(1, reg(4, 4), Instant::now())), "rank 4 is out of range for nranks 4");
        assert!(reason(s.on_register(1, reg(0, 0), Instant::now())).contains("out of range for nranks 0"));
        assert_eq!(s.deadline(), None);
    }

    #[test]
    fn disagreeing_nranks_names_the_first() {
        let mut s = RootState::new(MAGIC);
        assert_eq!(s.on_register(1, reg(0, 4), Instant::now()), None);
        assert_eq!(reason(s.on_register(2, reg(1, 3), Instant::now())), "nranks 3 differs from 4 given by rank 0");
        // Out of range against the learned nranks but in range for its own claim: still the nranks error.
        assert_eq!(reason(s.on_register(2, reg(5, 6), Instant::now())), "nranks 6 differs from 4 given by rank 0");
    }

    #[test]
    fn duplicate_rank_keeps_the_first() {
        let t0 = Instant::now();
        let mut s = RootState::new(MAGIC);
        assert_eq!(s.on_register(1, reg(1, 2), t0), None);
        let mut dup = reg(1, 2);
        dup.listen = "10.9.9.9:9".parse().unwrap();
        assert_eq!(
            reason(s.on_register(2, dup, t0)),
            "rank 1 already registered by the process listening at 10.0.0.1:1001"
        );
        match s.on_register(3, reg(0, 2), t0) {
            Some(Action::Complete { conns, table }) => {
                assert_eq!(conns, vec![3, 1]);
                assert_eq!(table[1], reg(1, 2).listen);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn deadline_reports_missing_ranks_once() {
        let t0 = Instant::now();
        let mut s = RootState::new(MAGIC);
        let mut first = reg(0, 4);
        first.timeout = Duration::from_secs(2);
        assert_eq!(s.on_register(7, first, t0), None);
        // Later registrations do not move the deadline, whatever timeout they carry.
        assert_eq!(s.on_register(8, reg(2, 4), t0 + Duration::from_secs(1)), None);
        assert_eq!(s.deadline(), Some(t0 + Duration::from_secs(2)));
        assert_eq!(s.poll(t0 + Duration::from_millis(1999)), None);
        match s.poll(t0 + Duration::from_secs(2)) {
            Some(Action::Missing { conns, missing, text }) => {
                assert_eq!(conns, vec![7, 8]);
                assert_eq!(missing, vec![1, 3]);
                assert_eq!(
                    text,
                    "bootstrap: rank(s) [1, 3] never registered with the root within 2s; \
                     check that every process called ncclCommInitRank with the same unique id"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(s.is_finished());
        assert_eq!(s.poll(t0 + Duration::from_secs(3)), None);
        assert!(reason(s.on_register(9, reg(1, 4), t0 + Duration::from_secs(3))).contains("already finished"));
    }

    #[test]
    fn huge_timeouts_are_capped() {
        let t0 = Instant::now();
        let mut s = RootState::new(MAGIC);
        let mut r = reg(0, 2);
        r.timeout = Duration::MAX;
        assert_eq!(s.on_register(1u32, r, t0), None);
        assert_eq!(s.deadline(), Some(t0 + MAX_TIMEOUT));
    }

    #[test]
    fn no_deadline_before_the_first_registration() {
        let mut s = RootState::<u32>::new(MAGIC);
        assert_eq!(s.poll(Instant::now() + Duration::from_secs(3600)), None);
        assert!(!s.is_finished());
    }

    #[test]
    fn replies_map_to_errors() {
        let root: SocketAddr = "10.0.0.9:9".parse().unwrap();
        let peers = vec![root, root];
        assert_eq!(check_reply(Msg::PeerTable { peers: peers.clone() }, 0, 2, root), Ok(peers));
        assert!(matches!(check_reply(Msg::PeerTable { peers: vec![root] }, 0, 2, root), Err(Error::Remote(_))));
        let text = "bootstrap: rank(s) [1] never registered".to_string();
        assert_eq!(
            check_reply(Msg::Refused { reason: RefuseReason::Missing, text: text.clone() }, 0, 2, root),
            Err(Error::System(text))
        );
        match check_reply(
            Msg::Refused { reason: RefuseReason::Rejected, text: "rank 1 already registered".into() },
            1,
            2,
            root,
        ) {
            Err(Error::InvalidUsage(m)) => assert!(m.contains("refused rank 1: rank 1 already registered"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check_reply(Msg::Data { tag: 0, seq: 0, payload: vec![] }, 0, 2, root),
            Err(Error::Remote(_))
        ));
    }
}
