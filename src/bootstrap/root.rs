//! The bootstrap root: collects one registration per rank, hands each rank the address of its
//! next rank on the ring, and stays until every rank reports its ring linked and the peer table
//! gathered around it, so that init succeeds everywhere or fails everywhere with the same
//! explanation.
//!
//! The root sends one address per rank, never the whole table: its messages and bytes grow
//! linearly with ranks (docs/ARCHITECTURE.md, "Bootstrap at scale").
//!
//! [`RootState`] is the whole protocol as a pure state machine: it is fed registrations, ring
//! reports, closed connections and the current time, and answers with [`Action`]s; it does no
//! I/O and reads no clock, so every transition is unit-tested. [`spawn`] is the thin socket edge
//! that runs it on a thread.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::hash::Hash;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use super::MAX_RANKS;
use crate::error::{Error, Result};
use crate::socket::acceptor::{Acceptor, Wake};
use crate::socket::auth::Credentials;
use crate::socket::frame::{FrameStream, NetError};
use crate::socket::wire::{Msg, RefuseReason, MAX_CONTROL_BODY};

/// How much longer than the ranks the root waits for ring reports, so that a rank that could
/// not link to a neighbour reports that neighbour (naming the culprit) before the root gives up
/// on everyone still unlinked.
const RING_REPORT_MARGIN: Duration = Duration::from_secs(1);

/// Longest wait the bootstrap honours (longer requests are cut to it), so that deadline
/// arithmetic cannot overflow whatever a caller or a peer asks for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

/// A rank's registration, as decoded from [`Msg::Register`] (after the connection
/// authenticated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
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
    /// Every rank is in: send each connection (rank r's, at index r) the listen address of
    /// rank r + 1 (mod n), and keep them, waiting for each rank's ring report.
    Ring { links: Vec<(C, SocketAddr)> },
    /// Every rank's ring is up and its table gathered: send Ready to every connection, then exit.
    Ready { conns: Vec<C> },
    /// Init cannot finish: send `text` to every connection still open, as a refusal of this
    /// kind, then exit.
    Fail { conns: Vec<C>, reason: RefuseReason, text: String },
}

impl<C> Action<C> {
    /// The frames the edge sends for this action, by connection: all the root ever writes
    /// after the handshake, so its cost can be counted without sockets.
    pub fn messages(self) -> Vec<(C, Msg)> {
        match self {
            Action::Reject { conn, reason } => {
                vec![(conn, Msg::Refused { reason: RefuseReason::Rejected, text: reason })]
            }
            Action::Ring { links } => links.into_iter().map(|(c, next)| (c, Msg::RingNext { next })).collect(),
            Action::Ready { conns } => conns.into_iter().map(|c| (c, Msg::Ready)).collect(),
            Action::Fail { conns, reason, text } => {
                conns.into_iter().map(|c| (c, Msg::Refused { reason, text: text.clone() })).collect()
            }
        }
    }
}

#[derive(Debug)]
enum Phase {
    Registering,
    /// The ring addresses went out at this time; these ranks have reported their ring up.
    Ring {
        since: Instant,
        ready: BTreeSet<usize>,
    },
    Finished,
}

#[derive(Debug)]
pub struct RootState<C> {
    /// Fixed by the first accepted registration, with the rank that gave it.
    nranks: Option<(usize, u32)>,
    /// Registered ranks only: memory follows who registered, not what a registration claims.
    slots: BTreeMap<usize, (C, SocketAddr)>,
    /// The rank of each registered connection.
    by_conn: HashMap<C, usize>,
    first: Option<(Instant, Duration)>,
    phase: Phase,
}

impl<C> Default for RootState<C> {
    fn default() -> Self {
        RootState {
            nranks: None,
            slots: BTreeMap::new(),
            by_conn: HashMap::new(),
            first: None,
            phase: Phase::Registering,
        }
    }
}

impl<C: Copy + Debug + Eq + Hash> RootState<C> {
    /// When [`poll`](Self::poll) will report missing ranks; `None` before the first registration
    /// (the id may legitimately be handed out long before anyone calls init, as in NCCL).
    pub fn deadline(&self) -> Option<Instant> {
        let (at, timeout) = self.first?;
        match &self.phase {
            Phase::Registering => Some(at + timeout),
            Phase::Ring { since, .. } => Some(*since + timeout + RING_REPORT_MARGIN),
            Phase::Finished => None,
        }
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished)
    }

    /// The connections of registered ranks: the edge watches them for reports and for closing.
    pub fn registered(&self) -> impl Iterator<Item = C> + '_ {
        self.slots.values().map(|&(c, _)| c)
    }

    pub fn on_register(&mut self, conn: C, reg: Registration, now: Instant) -> Option<Action<C>> {
        let reject = |reason: String| Some(Action::Reject { conn, reason });
        let rank = reg.rank as usize;
        if !matches!(self.phase, Phase::Registering) {
            return reject("the bootstrap root has already finished".into());
        }
        if reg.nranks == 0 || reg.rank >= reg.nranks {
            return reject(format!("rank {rank} is out of range for nranks {}", reg.nranks));
        }
        if reg.nranks as usize > MAX_RANKS {
            return reject(format!("nranks {} exceeds the bootstrap's limit of {MAX_RANKS}", reg.nranks));
        }
        match self.nranks {
            Some((n, by)) if n != reg.nranks as usize => {
                return reject(format!("nranks {} differs from {n} given by rank {by}", reg.nranks));
            }
            Some(_) => {}
            None => {
                self.nranks = Some((reg.nranks as usize, reg.rank));
                self.first = Some((now, reg.timeout.min(MAX_TIMEOUT)));
            }
        }
        if let Some((_, by)) = self.slots.get(&rank) {
            return reject(format!("rank {rank} already registered by the process listening at {by}"));
        }
        self.slots.insert(rank, (conn, reg.listen));
        self.by_conn.insert(conn, rank);
        if self.slots.len() < reg.nranks as usize {
            return None;
        }
        self.phase = Phase::Ring { since: now, ready: BTreeSet::new() };
        // The slots are every rank 0..n in order: rank r's next is the following slot.
        let addrs: Vec<SocketAddr> = self.slots.values().map(|&(_, a)| a).collect();
        let links = self.slots.values().enumerate().map(|(r, &(c, _))| (c, addrs[(r + 1) % addrs.len()])).collect();
        Some(Action::Ring { links })
    }

    /// A registered rank reports its ring links up and the peer table gathered.
    pub fn on_ready(&mut self, conn: C) -> Option<Action<C>> {
        let rank = self.rank_of(conn)?;
        let Phase::Ring { ready, .. } = &mut self.phase else {
            return self.lost(rank, "sent a ring report before every rank had registered".into());
        };
        ready.insert(rank);
        if ready.len() < self.slots.len() {
            return None;
        }
        self.phase = Phase::Finished;
        Some(Action::Ready { conns: self.registered().collect() })
    }

    /// A registered rank's connection closed, or broke the protocol, before init finished:
    /// that rank is gone, and every other rank is told at once instead of timing out.
    pub fn on_closed(&mut self, conn: C, why: &str) -> Option<Action<C>> {
        let rank = self.rank_of(conn)?;
        self.lost(rank, format!("its connection to the root {why}"))
    }

    /// A registered rank reports that it could not reach rank `lost` while linking the ring.
    pub fn on_lost_report(&mut self, conn: C, lost: usize, text: String) -> Option<Action<C>> {
        let by = self.rank_of(conn)?;
        match self.slots.contains_key(&lost) {
            true => self.lost(lost, format!("rank {by} reports: {text}")),
            false => self.lost(by, format!("reported an unknown rank {lost} lost")),
        }
    }

    fn rank_of(&self, conn: C) -> Option<usize> {
        match self.phase {
            Phase::Finished => None,
            _ => self.by_conn.get(&conn).copied(),
        }
    }

    fn lost(&mut self, rank: usize, why: String) -> Option<Action<C>> {
        let at = self.slots.get(&rank).map(|&(_, a)| a)?;
        self.phase = Phase::Finished;
        let text =
            format!("bootstrap: rank {rank} (listening at {at}) was lost during init: {why}; did its process die?");
        let conns = self.slots.iter().filter(|(&r, _)| r != rank).map(|(_, &(c, _))| c).collect();
        Some(Action::Fail { conns, reason: RefuseReason::Lost, text })
    }

    /// What the root is waiting for, for progress lines: the ranks not registered (or not
    /// linked) yet.
    pub fn waiting_for(&self) -> String {
        match (&self.phase, self.nranks) {
            (_, None) => "the first rank to register with the root".into(),
            (Phase::Ring { ready, .. }, Some((n, _))) => {
                let late = brief((0..n).filter(|r| !ready.contains(r)));
                format!("rank(s) {late} to report their ring links up ({} of {n} done)", ready.len())
            }
            (_, Some((n, _))) => {
                let missing = brief((0..n).filter(|r| !self.slots.contains_key(r)));
                format!("rank(s) {missing} to register with the root ({} of {n} in)", self.slots.len())
            }
        }
    }

    /// Reports the missing ranks once the deadline has passed.
    pub fn poll(&mut self, now: Instant) -> Option<Action<C>> {
        let (_, timeout) = self.first?;
        if now < self.deadline()? {
            return None;
        }
        let n = self.nranks?.0;
        let text = match &self.phase {
            Phase::Ring { ready, .. } => format!(
                "bootstrap: rank(s) {} did not link the ring and gather the peer table within {timeout:?} after \
                 every rank had registered",
                brief((0..n).filter(|r| !ready.contains(r)))
            ),
            _ => format!(
                "bootstrap: rank(s) {} never registered with the root within {timeout:?}; \
                 check that every process called ncclCommInitRank with the same unique id",
                brief((0..n).filter(|r| !self.slots.contains_key(r)))
            ),
        };
        self.phase = Phase::Finished;
        Some(Action::Fail { conns: self.registered().collect(), reason: RefuseReason::Missing, text })
    }
}

/// A list of ranks for a message: all of them if few, else the first ones and a count.
fn brief(ranks: impl Iterator<Item = usize>) -> String {
    const SHOWN: usize = 16;
    let v: Vec<usize> = ranks.collect();
    match v.len() > SHOWN {
        true => format!("{:?} and {} more", &v[..SHOWN], v.len() - SHOWN),
        false => format!("{v:?}"),
    }
}

/// How long the root keeps trying to deliver one reply; a rank that does not read it is gone.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs a root on `listener` in a background thread that exits once every rank has linked the
/// ring, or the ranks have been told why init failed.
pub fn spawn(listener: TcpListener, cred: Credentials) -> Result<()> {
    let addr = listener.local_addr()?;
    let acceptor = Acceptor::new(listener, cred)?;
    std::thread::Builder::new()
        .name("nccl-bootstrap-root".into())
        .spawn(move || run(acceptor, addr))
        .map(drop)
        .map_err(|e| Error::System(format!("bootstrap: could not start the root thread: {e}")))
}

/// The registered ranks' connections, watched through one epoll descriptor that the acceptor
/// polls like any other: each wake of the root then costs the same whatever the number of
/// ranks, where a poll over every connection at each registration would be quadratic.
/// A connection leaves the set when it is closed.
struct Registered {
    ep: OwnedFd,
}

impl Registered {
    fn new() -> io::Result<Registered> {
        // SAFETY: epoll_create1 takes no pointers.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that nothing else owns.
        Ok(Registered { ep: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    fn add(&self, conn: &FrameStream, key: usize) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: key as u64 };
        // SAFETY: both descriptors are open, and ev is a valid event for the call to read.
        match unsafe { libc::epoll_ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_ADD, conn.as_raw_fd(), &mut ev) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// The keys of connections readable now (a frame, or their end), a bounded batch at a time:
    /// the rest stay ready and wake the next poll.
    fn ready(&self) -> io::Result<Vec<usize>> {
        const BATCH: usize = 1024;
        let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; BATCH];
        // SAFETY: evs has room for BATCH events; a zero timeout never blocks.
        let n = unsafe { libc::epoll_wait(self.ep.as_raw_fd(), evs.as_mut_ptr(), BATCH as i32, 0) };
        match usize::try_from(n) {
            Ok(n) => Ok(evs[..n].iter().map(|e| e.u64 as usize).collect()),
            Err(_) if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => Ok(Vec::new()),
            Err(_) => Err(io::Error::last_os_error()),
        }
    }
}

impl AsRawFd for Registered {
    fn as_raw_fd(&self) -> RawFd {
        self.ep.as_raw_fd()
    }
}

fn run(mut acceptor: Acceptor, addr: SocketAddr) {
    crate::nccl_info!(crate::debug::Subsys::BOOTSTRAP, "Bootstrap root listening on {addr}");
    let registered = match Registered::new() {
        Ok(r) => r,
        Err(e) => {
            crate::nccl_warn_unrecorded!("Bootstrap root at {addr} cannot start: epoll_create1 failed: {e}");
            return;
        }
    };
    let mut state = RootState::<usize>::default();
    // Every connection the root holds, by a serial number; removed as soon as it is answered.
    let mut conns: HashMap<usize, FrameStream> = HashMap::new();
    // Connections that already hold a whole frame in their buffer: no poll would report them.
    let mut buffered: Vec<usize> = Vec::new();
    let mut serial = 0;
    while !state.is_finished() {
        if let Some(action) = state.poll(Instant::now()) {
            perform(action, &mut conns);
            break;
        }
        let wake = match buffered.is_empty() {
            false => Ok(Some(Wake::Watched(std::mem::take(&mut buffered)))),
            true => match acceptor.next(state.deadline(), &|| state.waiting_for(), &[&registered]) {
                Ok(Some(Wake::Watched(_))) => {
                    registered.ready().map(|keys| Some(Wake::Watched(keys))).map_err(Into::into)
                }
                other => other,
            },
        };
        match wake {
            Ok(None) => {}
            Err(e) => {
                crate::nccl_warn_unrecorded!("Bootstrap root at {addr} stops: {e}");
                return;
            }
            // Every readable rank in one pass: the ring reports of thousands of ranks arrive
            // together.
            Ok(Some(Wake::Watched(ready))) => {
                for key in ready {
                    let Some(conn) = conns.get_mut(&key) else { continue };
                    let action = match conn.recv(MAX_CONTROL_BODY, Instant::now()) {
                        Ok(Msg::Ready) => state.on_ready(key),
                        Ok(Msg::Lost { rank, text }) => state.on_lost_report(key, rank as usize, text),
                        Ok(other) => state.on_closed(key, &format!("carried {} out of turn", other.kind_name())),
                        Err(NetError::Timeout) => None,
                        Err(e) => state.on_closed(key, &format!("failed ({e})")),
                    };
                    if conn.has_frame() {
                        buffered.push(key);
                    }
                    if let Some(action) = action {
                        perform(action, &mut conns);
                    }
                }
            }
            Ok(Some(Wake::Arrival(a))) => {
                let Msg::Register { rank, nranks, listen, timeout_ms } = a.msg else {
                    crate::nccl_warn_unrecorded!(
                        "Bootstrap root: dropped a connection from {} that sent {} instead of a registration",
                        a.from,
                        a.msg.kind_name()
                    );
                    continue;
                };
                let reg = Registration { rank, nranks, listen, timeout: Duration::from_millis(timeout_ms) };
                if serial == 0 && (nranks as usize) <= MAX_RANKS {
                    reserve_descriptors(nranks as usize);
                }
                serial += 1;
                if let Err(e) = registered.add(&a.conn, serial) {
                    crate::nccl_warn_unrecorded!("Bootstrap root at {addr} stops: cannot watch {}: {e}", a.from);
                    return;
                }
                if a.conn.has_frame() {
                    buffered.push(serial);
                }
                conns.insert(serial, a.conn);
                if let Some(action) = state.on_register(serial, reg, Instant::now()) {
                    perform(action, &mut conns);
                }
            }
        }
    }
    crate::nccl_info!(crate::debug::Subsys::BOOTSTRAP, "Bootstrap root at {addr} done");
}

/// Descriptors the root keeps free beyond its ranks' connections (the application's own, the
/// ranks' listeners in this process, connections still authenticating).
const SPARE_DESCRIPTORS: u64 = 256;

/// The soft descriptor limit a root needs to hold `nranks` connections in a process that has
/// `open` descriptors, given the current `soft` and `hard` limits: `None` when `soft` is
/// enough, else the new soft limit and whether the hard limit cuts it short.
fn descriptor_limit(soft: u64, hard: u64, open: u64, nranks: u64) -> Option<(u64, bool)> {
    let want = open.saturating_add(nranks).saturating_add(SPARE_DESCRIPTORS);
    (want > soft).then_some((want.min(hard).max(soft), want > hard))
}

/// The root holds every rank's connection until init ends: a process holding the root of
/// 8,192 ranks needs 8,192 more descriptors, past the common soft limit of 1,024. Raises the
/// soft limit toward the hard one for it (what users would otherwise do with `ulimit -n`), and
/// warns when even the hard limit falls short.
fn reserve_descriptors(nranks: usize) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: lim is a valid rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()) as u64;
    let Some((soft, short)) = descriptor_limit(lim.rlim_cur, lim.rlim_max, open, nranks as u64) else { return };
    let old = lim.rlim_cur;
    lim.rlim_cur = soft;
    // SAFETY: lim is a valid rlimit; the soft limit stays within the hard one.
    if soft != old && unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
        crate::nccl_info!(
            crate::debug::Subsys::BOOTSTRAP,
            "Bootstrap root: raised the descriptor limit from {old} to {soft} to hold {nranks} ranks' connections"
        );
    }
    if short {
        crate::nccl_warn_unrecorded!(
            "Bootstrap root: {nranks} ranks need about {} descriptors in this process (it has {open} open), but \
             RLIMIT_NOFILE's hard limit is {}; raise it (ulimit -Hn) or ranks may fail to register",
            open + nranks as u64 + SPARE_DESCRIPTORS,
            lim.rlim_max
        );
    }
}

fn perform(action: Action<usize>, conns: &mut HashMap<usize, FrameStream>) {
    let info = |text: &str| crate::nccl_info!(crate::debug::Subsys::BOOTSTRAP, "Bootstrap root: {text}");
    match &action {
        Action::Reject { reason, .. } => {
            crate::nccl_warn_unrecorded!("Bootstrap root: refused a registration: {reason}")
        }
        Action::Ring { links } => {
            info(&format!("all {} ranks registered; sending each its ring neighbour", links.len()))
        }
        Action::Ready { .. } => info("every rank linked its ring and gathered the peer table"),
        Action::Fail { text, .. } => crate::nccl_warn_unrecorded!("{text}"),
    }
    // Only the ring addresses leave the connections open: the root waits on them for reports.
    let keep = matches!(action, Action::Ring { .. });
    let deadline = Instant::now() + REPLY_TIMEOUT;
    for (c, msg) in action.messages() {
        let Some(s) = conns.get_mut(&c) else { continue };
        if let Err(e) = s.send(&msg, deadline) {
            crate::nccl_warn_unrecorded!("Bootstrap root: could not reply to {}: {e}", s.peer());
        }
        if !keep {
            conns.remove(&c);
        }
    }
}

/// The reply a rank waits for after registering: only its next rank's address or a refusal
/// are legal.
pub fn check_reply(msg: Msg, rank: usize, root: SocketAddr) -> Result<SocketAddr> {
    match msg {
        Msg::RingNext { next } => Ok(next),
        other => Err(refusal(other, rank, root)),
    }
}

/// The error for a message from the root other than the one a rank waits for: the root's
/// refusal (whose text says it all), or nonsense.
pub fn refusal(msg: Msg, rank: usize, root: SocketAddr) -> Error {
    match msg {
        Msg::Refused { reason: RefuseReason::Missing, text } => Error::System(text),
        Msg::Refused { reason: RefuseReason::Lost, text } => Error::Remote(text),
        Msg::Refused { reason: RefuseReason::Rejected, text } => {
            Error::InvalidUsage(format!("bootstrap: the root at {root} refused rank {rank}: {text}"))
        }
        other => Error::Remote(format!(
            "bootstrap: the root at {root} sent rank {rank} an unexpected {} frame",
            other.kind_name()
        )),
    }
}

#[cfg(test)]
mod tests;
