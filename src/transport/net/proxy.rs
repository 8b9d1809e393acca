//! The proxy progress thread of the NET transport: it moves the steps the kernels put in host
//! memory over the net, and lands the peer's steps where the kernels read them (`docs/NET.md`,
//! "The NET transport").
//!
//! One proxy per process and CUDA device, shared by every communicator on that device, as in
//! NCCL; connections join it at init ([`Proxy::add`]) and leave at destroy or abort
//! ([`Proxy::remove`]). For connections through a net plugin it runs two progress threads, one
//! for the send halves and one for the receive halves, where NCCL runs one for both: a plugin
//! may copy the bytes inside its calls (one over TCP does), and one thread then sends or
//! receives, never both at once, so a ring's call took as long as its sends' copies plus its
//! receives' (docs/NET.md, "Two progress threads"). Where a rank has the CPUs, two threads share
//! the send halves out by peer, so that a scatter's root copies to two peers at once
//! ([`Threads::choose`]; docs/NET.md, "Send threads"). The built-in Socket net's helper threads
//! already move large messages side by side, and one thread for both halves serves it best
//! (`FERRONICKEL_NET_PROXY_THREADS` sets it either way). Per connection the proxy drives one
//! send comm and one receive comm:
//!
//! - **send** (`side::SendSide`): once the kernel has handed over the next step (its `tail` is
//!   past it, or, for an LL step, which publishes no tail, its size word is there and every line
//!   carries the step's flag) and fewer than `FN_NSTEPS` steps, and less than a slot's bytes, are
//!   in flight, it sends the step's size word (bytes and protocol) and then the bytes of that
//!   protocol's slot, and empties the word; when the data send completes it moves `head`, which
//!   frees the slot for the kernel.
//! - **receive** (`side::RecvSide`): it posts a receive for the next step's size word once the
//!   kernel has freed that slot (`head`), then a receive of exactly that many bytes into that
//!   protocol's slot; when the data lands it moves `tail` (after a release fence), which the
//!   kernel waits for before it reads the slot in Simple and LL128. An LL step's kernel polls its
//!   lines instead, and a copy from the network does not promise to store each 8-byte half of a
//!   line whole: the built-in net's bytes land in the LL landing, away from the kernel, and the
//!   proxy then stores them in the slot with stores that keep each half whole
//!   ([`Layout::ll_landing`]). One step lands a round, so that each direction gets its turn
//!   (docs/NET.md, "One step a turn").
//! - Through a net plugin a small step's bytes and word go as one message, sent from its slot
//!   with the word on the line after the bytes; it lands in the step's LL slot, where an LL
//!   step's kernel polls its lines as the plugin writes them, as NCCL's does, and a step of
//!   another protocol moves to its own slot from there ([`Layout::one_message`],
//!   [`Layout::recv_first`]).
//!
//! The block's layout is `block`'s; the profiler events, `trace`'s.
//!
//! With a profiler plugin (docs/PLUGINS.md, "Profiler"), each direction of a connection reports
//! its steps (`ncclProfileProxyStep`: a send from the kernel's tail to the send's completion, a
//! receive from its size word's arrival to its data's) under a proxy op (`ncclProfileProxyOp`)
//! that spans a run of steps, from the first step after an idle spell to the next idle spell.
//! These are plain calls into the plugin; the proxy thread never touches CUDA.
//!
//! Each thread busy-polls while any of its halves has a step in flight and backs off to short
//! sleeps when every one is idle. A communicator wakes them when it launches kernels ([`Waker`]),
//! as NCCL posts its proxy ops at enqueue, each thread only for launches that may use its half
//! (a rank that only sends leaves the receiving thread asleep), and they then poll until
//! something moves, in either half (at most [`LAUNCH_SPIN`]), as NCCL's proxy polls while an op
//! is posted: the kernel may run long after its launch, behind the compute queued before it on
//! its stream, and its first step should not wait for a nap to end. The wake-up names the
//! channels the kernels use (and apart, those of works that may reach a peer connected at
//! runtime: [`Launches`]), so that a round asks only those connections (and ones that moved in
//! the last millisecond) for bytes, as NCCL's proxy progresses only the ops posted to it: a
//! round is then shorter, and each step is noticed sooner (docs/NET.md, "Small steps"). While
//! the sending thread waits for that first step, it has its comms keep its send path warm
//! ([`SendComm::warm`]): the kernel's TCP stack, idle a few milliseconds, makes the next send
//! two to eight times slower (docs/NET.md, "A warm send path").
//!
//! A net plugin may be called from several threads at once on different comms (NCCL runs a
//! proxy thread per GPU of a process); each comm here is only ever driven by one thread at a
//! time: its half's lock.
//!
//! A connection whose net fails (a peer gone, garbage in a size word) is reported once through
//! its fault hook, which stops the communicator's kernels, and is not touched again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard, RwLock};

mod block;
mod side;
mod trace;

use super::{RecvComm, Request, SendComm};
use crate::abi::{FN_MAX_CHANNELS, FN_NSTEPS};
use crate::affinity::{self, CpuSet};
use crate::error::{Error, Result};
pub use block::{
    HostBlock, Landing, Layout, INLINE_MAX, RECV_HEAD, RECV_TAIL, SEND_HEAD, SEND_SIZES, SEND_TAIL, SIZE_EMPTY,
};
use block::{GOODBYE, GOODBYE_AT, NSTEPS, TAG_SIZE};
use side::{Expect, RecvSide, SendSide};
use trace::Trace;
pub use trace::TraceInfo;

/// After this long without progress the thread sleeps between polls instead of yielding.
const SPIN: Duration = Duration::from_millis(2);
/// After a wake-up the thread polls until something moves, this long at most: the launch's
/// kernel starts when the work queued before it on its stream ends. With 2.5 or 20 ms of compute
/// before each call, polling only [`SPIN`] after the wake-up made the small collectives over
/// two hosts 1.4x slower and the large ones 1.1x (docs/NET.md, "Polling from a launch").
const LAUNCH_SPIN: Duration = Duration::from_millis(100);
/// While a launch's first step is awaited, how often the send comms keep the thread's send path
/// warm ([`SendComm::warm`]), from the wake-up on: with the built-in net, one hop after 2.5 ms of
/// compute before each call was 1.1-1.2x faster so, after 20 ms 1.2-2.3x (docs/NET.md, "A warm
/// send path"). Back to back the first step moves before the first warm-up is due.
const WARM_EVERY: Duration = Duration::from_micros(100);
/// Sleeps while idle: short at first, longer once idle for [`LONG_IDLE`].
const NAP: Duration = Duration::from_micros(20);
const LONG_NAP: Duration = Duration::from_millis(1);
const LONG_IDLE: Duration = Duration::from_millis(200);
/// A connection that moved this recently is hot: its receive is tested every round. So is one on
/// a channel that a launch of its communicator named less than [`LAUNCHED`] ago ([`Waker::wake`]),
/// or named since the connection last moved, less than [`LAUNCH_SPIN`] ago.
/// Any other one's only every [`COLD_EVERY`]th round, since testing a receive with nothing in
/// flight costs a syscall (the Socket net's) that lengthens the round every hot step waits
/// through. Its send side, loads from host memory only, is looked at every round.
pub(crate) const HOT: Duration = Duration::from_millis(1);
/// How long after a launch its channels' connections stay hot even if they moved since: longer
/// than the skew between ranks that a cold connection's later look (a round in [`COLD_EVERY`])
/// would add noticeably to. A connection the launch named that has not moved since stays hot
/// until it does, as the thread polls ([`LAUNCH_SPIN`]): the kernel may start long after its
/// launch, behind compute, and with 20 ms of it before each call, a cold receive made send/recv
/// over four hosts 2.3x slower (docs/NET.md, "Polling from a launch").
const LAUNCHED: Duration = Duration::from_millis(10);
const COLD_EVERY: u32 = 64;
/// How long closing connections waits for their goodbyes to go out, in all.
const GOODBYE_WAIT: Duration = Duration::from_millis(500);
/// How long closing connections waits, before its goodbyes, for steps the kernel has handed over
/// to go out (a FIFO's worth of data at most).
const DRAIN_WAIT: Duration = Duration::from_secs(1);

crate::int_param!(
    /// FERRONICKEL_NET_PROXY_THREADS: 1, one progress thread for both halves of every connection
    /// (NCCL's way); 2, a thread for the send halves and one for the receive halves; 0 (the
    /// default, and any other value), two for a net plugin's connections where the threads have
    /// [`SPLIT_MIN_CPUS`] or more, else one ([`Threads::choose`]).
    proxy_threads, "FERRONICKEL_NET_PROXY_THREADS", 0
);

crate::int_param!(
    /// FERRONICKEL_NET_PROXY_SEND_THREADS: where a net plugin's connections get a thread for each
    /// half, how many threads share the send halves out, by peer (1 to 8; docs/NET.md, "Send
    /// threads"). A plugin that copies a step's bytes inside its calls (one over TCP does) then
    /// sends to several peers side by side. 0 (the default, and any value below it): two for a
    /// plugin's where a rank has [`SEND_LANES_MIN_CPUS`] of the machine's CPUs or more, else one.
    proxy_send_threads, "FERRONICKEL_NET_PROXY_SEND_THREADS", 0
);

/// A plugin's connections get a thread for each half only where the proxy's threads may run on
/// this many CPUs or more. With each rank bound to two, its main thread and two polling proxy
/// threads took turns, and one thread was faster at every size (a call held up to 2 ms where a
/// thread that polled kept the CPU its other half needed); from three CPUs on, two were faster
/// (docs/NET.md, "Two progress threads").
const SPLIT_MIN_CPUS: usize = 3;

/// A second send thread where a rank has this many CPUs of the machine's to itself, and two
/// peers over the net or more. Four ranks with eight each (32 cores) ran a scatter 1.17x, a
/// broadcast 1.13x and an all-to-all 1.09x faster with it and kept their tails; with four each
/// (16 cores) the extra polling threads made most collectives' tails longer; over two hosts,
/// where it has no peer to send to, the reduce still ran 6 % slower (docs/NET.md, "Send threads").
const SEND_LANES_MIN_CPUS: usize = 8;

/// The CPUs a rank may count on: the `ncpus` its threads may run on, at most its part of the
/// machine's `online` CPUs, which `machine_ranks` ranks use (NCCL_HOSTID or host names may tell
/// them apart as hosts: `PeerInfo::machine` does not).
fn share(ncpus: Option<usize>, online: Option<usize>, machine_ranks: usize) -> Option<usize> {
    ncpus.map(|n| online.map_or(n, |all| n.min(all / machine_ranks.max(1))))
}

/// How a proxy's threads share the connections' halves: one thread for both, or one for the
/// receive halves and `send` threads for the send halves, shared out by peer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Threads {
    One,
    Split { send: usize },
}

impl Threads {
    /// The threads for the connections of a net, built in or a plugin, of a communicator whose
    /// proxy threads run on `cpus`, which has `machine_ranks` ranks on this machine (ours
    /// included) and in which this rank reaches `net_peers` ranks over the net (see the module
    /// docs).
    pub fn choose(builtin: bool, cpus: Option<&CpuSet>, machine_ranks: usize, net_peers: usize) -> Threads {
        let ncpus = affinity::cpus_of_new_thread(affinity::proxy_cpus(cpus).as_ref());
        let online = affinity::online_cpus();
        let share = share(ncpus, online, machine_ranks);
        let threads = Threads::rule(proxy_threads(), proxy_send_threads(), builtin, ncpus, share, net_peers);
        let known = |n: Option<usize>| n.map_or("?".to_string(), |n| n.to_string());
        crate::nccl_info!(
            crate::debug::Subsys::NET,
            "NET: proxy threads, where this communicator starts the proxy: {threads}; the rank's share of the machine \
             {} CPU(s) ({} for its threads, {} online, {machine_ranks} rank(s) of the communicator on it; {net_peers} \
             peer(s) over the net)",
            known(share),
            known(ncpus),
            known(online)
        );
        threads
    }

    /// [`Threads::choose`] by the two settings, the net, how many CPUs the threads may run on,
    /// the rank's share of the machine's CPUs (at most those; `None`: not known) and its peers
    /// over the net.
    fn rule(
        split: i64,
        send: i64,
        builtin: bool,
        ncpus: Option<usize>,
        share: Option<usize>,
        net_peers: usize,
    ) -> Threads {
        let split = match split {
            1 => false,
            2 => true,
            _ => !builtin && ncpus.is_none_or(|n| n >= SPLIT_MIN_CPUS),
        };
        let send = match send {
            n if n >= 1 => n.min(8) as usize,
            _ if !builtin && net_peers >= 2 && share.is_some_and(|n| n >= SEND_LANES_MIN_CPUS) => 2,
            _ => 1,
        };
        if split {
            Threads::Split { send }
        } else {
            Threads::One
        }
    }

    /// What each thread drives.
    fn halves(self) -> Vec<Halves> {
        match self {
            Threads::One => vec![Halves::Both],
            Threads::Split { send: of } => {
                (0..of).map(|lane| Halves::Send { lane, of }).chain([Halves::Recv]).collect()
            }
        }
    }
}

/// As the INFO lines say it.
impl std::fmt::Display for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Threads::One => write!(f, "one thread"),
            Threads::Split { send: 1 } => write!(f, "a thread for the send halves and one for the receive halves"),
            Threads::Split { send } => {
                write!(f, "{send} threads for the send halves, shared out by peer, and one for the receive halves")
            }
        }
    }
}

/// Called once with the error that ended a connection: stops the communicator and says why.
pub type FaultHook = Arc<dyn Fn(String) + Send + Sync>;

/// Which halves of the connections a progress thread drives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Halves {
    /// The send halves of the connections with the ranks `r` with `r % 64 % of == lane`.
    Send {
        lane: usize,
        of: usize,
    },
    Recv,
    Both,
}

/// Every send half, by one thread.
const SENDS: Halves = Halves::Send { lane: 0, of: 1 };

impl Halves {
    fn sends(self) -> bool {
        self != Halves::Recv
    }

    fn receives(self) -> bool {
        !matches!(self, Halves::Send { .. })
    }

    /// The ranks whose connections' halves the thread drives, bit `r % 64` for rank r (as a
    /// launch names the ranks it sends to: [`Waker::wake`]).
    fn peers(self) -> u64 {
        match self {
            Halves::Send { lane, of } => (lane..64).step_by(of).fold(0, |m, b| m | 1 << b),
            _ => u64::MAX,
        }
    }

    /// Whether the thread drives the halves of a connection with rank `peer` (a bit of
    /// [`Halves::peers`]).
    fn serves(self, peer: usize) -> bool {
        match self {
            Halves::Send { lane, of } => peer % 64 % of == lane,
            _ => true,
        }
    }
}

/// The send half of a connection and its goodbye.
struct SendHalf {
    side: SendSide,
    /// Our goodbye word is posted (at close, or in answer to the peer's), and its send request
    /// while it is in flight.
    said_goodbye: bool,
    goodbye: Option<Request>,
}

/// One connection (a peer on a channel) in the proxy: its two comms and their host block. Each
/// half has its own lock, taken by the thread that drives it (and by [`close`], once the
/// connection is out of the proxy).
pub struct Entry {
    // Dropped in this order: the comms (which stop their threads) before the memory they use.
    send: Mutex<SendHalf>,
    recv: Mutex<RecvSide>,
    block: Arc<HostBlock>,
    layout: Layout,
    /// "rank 3 (host h, pid 7), channel 2": how faults name the connection.
    who: String,
    fault: FaultHook,
    failed: AtomicBool,
    /// The peer said goodbye (the receive half's flag, which it sets when it sees the word): the
    /// send half answers.
    peer_closed: Arc<AtomicBool>,
    id: u64,
    /// When either half last moved or had a step in flight (see [`HOT`]), in nanoseconds from
    /// `born`.
    active: AtomicU64,
    born: Instant,
    /// The communicator's launches ([`Launches`]), the rank at the connection's other end and its
    /// channel.
    launches: Arc<Launches>,
    peer: usize,
    channel: usize,
    /// Made at runtime, for a peer off the ring ([`Launches`]).
    off_ring: bool,
}

impl Entry {
    /// Registers `block` with both comms (host memory) and makes the entry.
    pub fn new(
        mut send: Box<dyn SendComm>,
        mut recv: Box<dyn RecvComm>,
        block: Arc<HostBlock>,
        layout: Layout,
        who: String,
        fault: FaultHook,
        trace: Option<&TraceInfo>,
    ) -> Result<Entry> {
        let len = block.len();
        // No step has filled a size word yet.
        for slot in 0..FN_NSTEPS as usize {
            block.store_u32(SEND_SIZES + 4 * slot, SIZE_EMPTY);
        }
        let smr = send.reg_mr(block.ptr(0, len), len, super::PtrKind::Host)?;
        let send = SendSide::new(send, smr, Trace::new(trace, true, &layout));
        let rmr = recv.reg_mr(block.ptr(0, len), len, super::PtrKind::Host)?;
        let recv = RecvSide::new(recv, rmr, Trace::new(trace, false, &layout));
        let peer_closed = recv.peer_closed.clone();
        Ok(Entry {
            send: Mutex::new(SendHalf { side: send, said_goodbye: false, goodbye: None }),
            recv: Mutex::new(recv),
            block,
            layout,
            who,
            fault,
            failed: AtomicBool::new(false),
            peer_closed,
            id: 0,
            active: AtomicU64::new(0),
            born: Instant::now(),
            launches: Arc::default(),
            peer: 0,
            channel: 0,
            off_ring: false,
        })
    }

    /// Makes the connection, with rank `peer` of `launches`' communicator, hot whenever a launch
    /// of that communicator names `channel`; for one made at runtime (`off_ring`), a launch that
    /// may reach such peers ([`Launches`]). A launch that sends to `peer` wakes the send thread
    /// that drives it ([`Waker::wake`]).
    pub fn launched_by(mut self, launches: Arc<Launches>, peer: usize, channel: usize, off_ring: bool) -> Entry {
        (self.launches, self.peer, self.channel, self.off_ring) = (launches, peer, channel, off_ring);
        self
    }

    /// When either half last moved or had a step in flight.
    fn active(&self) -> Instant {
        self.born + Duration::from_nanos(self.active.load(Ordering::Relaxed))
    }

    /// Either half moved or has a step in flight at `now`.
    fn touch(&self, now: Instant) {
        self.active.fetch_max(now.saturating_duration_since(self.born).as_nanos() as u64, Ordering::Relaxed);
    }

    /// Whether this round tests the receive: a sweep, a recent move, or a launch on its channel
    /// (see [`HOT`]).
    fn hot(&self, now: Instant, sweep: bool) -> bool {
        let active = self.active();
        sweep
            || now.saturating_duration_since(active) < HOT
            || self.launches.named(self.channel, self.off_ring, now, active)
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Marks the connection failed and reports it, once.
    fn fail(&self, e: Error) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            (self.fault)(format!("NET connection with {}: {e}", self.who));
        }
    }

    /// One turn of the send half: (anything moved, a step still in flight).
    fn progress_send(&self) -> (bool, bool) {
        if self.failed() {
            return (false, false);
        }
        let mut s = self.send.lock();
        if self.peer_closed.load(Ordering::Acquire) {
            // The peer's receive of our next size word is still posted: answer its goodbye with
            // ours, so that its comm closes with nothing in flight.
            return (self.answer_goodbye(&mut s), false);
        }
        match s.side.progress(&self.block, &self.layout) {
            Ok(moved) => {
                let busy = s.side.busy(&self.block);
                if let Some(t) = s.side.trace.as_mut().filter(|_| !busy) {
                    t.idle();
                }
                (moved, busy)
            }
            Err(e) => {
                self.fail(e.context("sending"));
                (true, false)
            }
        }
    }

    /// One turn of the receive half, which tests its receives only if `test` (see [`HOT`]):
    /// (anything moved, a step still in flight).
    fn progress_recv(&self, test: bool) -> (bool, bool) {
        if self.failed() || self.peer_closed.load(Ordering::Acquire) {
            return (false, false);
        }
        let mut r = self.recv.lock();
        let moved = match test.then(|| r.progress(&self.block, &self.layout)) {
            None => false,
            Some(Ok(moved)) => moved,
            Some(Err(e)) => {
                self.fail(e.context("receiving"));
                return (true, false);
            }
        };
        let busy = r.busy();
        if let Some(t) = r.trace.as_mut().filter(|_| !busy) {
            t.idle();
        }
        (moved, busy)
    }

    /// One turn of the `halves` a thread drives, the receive half tested only if `test`; marks
    /// the connection active at `now` if anything moved or is in flight: (moved, in flight).
    fn progress(&self, halves: Halves, test: bool, now: Instant) -> (bool, bool) {
        let (sm, sb) = if halves.sends() { self.progress_send() } else { (false, false) };
        let (rm, rb) = if halves.receives() { self.progress_recv(test) } else { (false, false) };
        let (moved, busy) = (sm || rm, sb || rb);
        if moved || busy {
            self.touch(now);
        }
        (moved, busy)
    }
}

/// Closes connections taken out of the proxy ([`Proxy::remove`]): sends what is left to send, says goodbye on each, so the
/// peers see a close and not a failure, and waits at most [`GOODBYE_WAIT`] in all for the words
/// to go out and for the peers' answers to land in the receives we have posted, so that every
/// request is complete when the comms close (a strict net plugin warns about, or leaks, requests
/// still in flight at close). Then drops them.
pub fn close(entries: Vec<Entry>) {
    part(&entries);
}

/// Says goodbye on every connection and waits for the answers, as [`close`] does, without
/// freeing anything: the connections stay with their owner.
fn part(entries: &[Entry]) {
    // Steps the kernel has already handed over go out first: a rank whose last collective has
    // completed on its GPU may still owe its peers the data of that collective's final steps.
    let end = Instant::now() + DRAIN_WAIT;
    let owes = |e: &Entry| !e.failed() && !e.peer_closed.load(Ordering::Acquire) && e.send.lock().side.busy(&e.block);
    while Instant::now() < end && entries.iter().any(owes) {
        let now = Instant::now();
        if !entries.iter().fold(false, |moved, e| e.progress(Halves::Both, true, now).0 | moved) {
            std::thread::yield_now();
        }
    }
    for e in entries {
        e.say_goodbye(&mut e.send.lock());
    }
    let end = Instant::now() + GOODBYE_WAIT;
    while Instant::now() < end && entries.iter().map(Entry::settle).fold(false, |busy, b| busy | b) {
        std::thread::yield_now();
    }
}

impl Entry {
    /// Posts the goodbye word once, unless the connection failed or a step is half sent (its size
    /// word went out: the peer expects its data next).
    fn say_goodbye(&self, s: &mut SendHalf) {
        if s.said_goodbye || self.failed() || s.side.size_sent.is_some() {
            return;
        }
        s.said_goodbye = true;
        self.block.store_u32(GOODBYE_AT, GOODBYE);
        let Some(mr) = s.side.mr.as_ref() else { return };
        // SAFETY: the word is in the block, which outlives the comm (field order of Entry).
        s.goodbye = unsafe { s.side.comm.isend(self.block.ptr(GOODBYE_AT, 4), 4, TAG_SIZE, mr) }.ok().flatten();
        // A net with no free request now: the word goes out on a later attempt.
        s.said_goodbye = s.goodbye.is_some();
    }

    /// After the peer's goodbye: ours in answer once nothing of ours is in flight, and its
    /// request tested; whether anything moved.
    fn answer_goodbye(&self, s: &mut MutexGuard<SendHalf>) -> bool {
        if !s.said_goodbye && !s.side.busy(&self.block) {
            self.say_goodbye(s);
            return s.said_goodbye;
        }
        test_goodbye(s);
        false
    }

    /// One look at a closing connection: whether it still waits, for our goodbye to go out or
    /// for a receive to complete (the peer's goodbye, or a step already on its way).
    fn settle(&self) -> bool {
        if self.failed() {
            return false;
        }
        let mut s = self.send.lock();
        if !s.said_goodbye {
            self.say_goodbye(&mut s);
        }
        test_goodbye(&mut s);
        let mut guard = self.recv.lock();
        let r = &mut *guard;
        while let Some((req, what)) = r.inflight.front() {
            match r.comm.test(req) {
                Ok(None) => break,
                Ok(Some(got)) => {
                    // A goodbye is a size word alone.
                    let at = match *what {
                        Expect::Size(step, landing) if got.first() == Some(&4) => {
                            Some(self.layout.recv_first((step % NSTEPS) as usize, landing).0)
                        }
                        _ => None,
                    };
                    if at.is_some_and(|at| self.block.load_u32(at) == GOODBYE) {
                        self.peer_closed.store(true, Ordering::Release);
                    }
                    r.inflight.pop_front();
                }
                Err(_) => {
                    self.failed.store(true, Ordering::Release);
                    return false;
                }
            }
        }
        s.goodbye.is_some() || !r.inflight.is_empty()
    }
}

/// Tests our goodbye's send request, forgetting it once done (or failed).
fn test_goodbye(s: &mut SendHalf) {
    if let Some(r) = &s.goodbye {
        if !matches!(s.side.comm.test(r), Ok(None)) {
            s.goodbye = None;
        }
    }
}

/// When a communicator's launches last named each channel, in microseconds since the struct was
/// made (0: never): `at` by any launch, `off_ring_at` by a launch whose works may reach a peer
/// connected at runtime (recursive doubling, a direct root, a send or receive). Such a peer's
/// connection is hot only for the latter: a ring launch on its channel never uses it, and testing
/// its receive every round lengthens the round the ring's steps wait through.
pub struct Launches {
    epoch: Instant,
    at: [AtomicU64; FN_MAX_CHANNELS as usize],
    off_ring_at: [AtomicU64; FN_MAX_CHANNELS as usize],
}

impl Default for Launches {
    fn default() -> Launches {
        let never = || [const { AtomicU64::new(0) }; FN_MAX_CHANNELS as usize];
        Launches { epoch: Instant::now(), at: never(), off_ring_at: never() }
    }
}

impl Launches {
    fn stamp(&self, t: Instant) -> u64 {
        // 1 at least: 0 means never.
        (t.saturating_duration_since(self.epoch).as_micros() as u64).max(1)
    }

    fn name(&self, channels: u64, off_ring: u64) {
        let now = self.stamp(Instant::now());
        for (stamps, mask) in [(&self.at, channels | off_ring), (&self.off_ring_at, off_ring)] {
            for (c, at) in stamps.iter().enumerate() {
                if mask >> c & 1 == 1 {
                    at.store(now, Ordering::Relaxed);
                }
            }
        }
    }

    /// Whether a launch named `channel` (for a connection made at runtime, `off_ring`, a launch
    /// that may reach such peers) less than [`LAUNCHED`] ago, or after `moved` (when its
    /// connection last moved) and less than [`LAUNCH_SPIN`] ago.
    fn named(&self, channel: usize, off_ring: bool, now: Instant, moved: Instant) -> bool {
        let stamps = if off_ring { &self.off_ring_at } else { &self.at };
        let at = stamps.get(channel).map_or(0, |a| a.load(Ordering::Relaxed));
        let age = self.stamp(now).saturating_sub(at);
        at != 0
            && (age < LAUNCHED.as_micros() as u64 || (age < LAUNCH_SPIN.as_micros() as u64 && at > self.stamp(moved)))
    }
}

struct Inner {
    /// Each thread reads it for a whole round; adding and removing connections writes it.
    entries: RwLock<Vec<Entry>>,
    stop: AtomicBool,
    next_id: AtomicU64,
    /// Per thread, set by [`Waker::wake`]: polling restarts from now.
    woken: Vec<Arc<AtomicBool>>,
    /// When a thread last moved anything, in nanoseconds from `epoch`: a wake-up is awaited
    /// until either half moves, as by one thread for both.
    moved_at: AtomicU64,
    epoch: Instant,
}

impl Inner {
    fn stamp(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Whether a wake-up at `woken` is still awaited at `now`: less than [`LAUNCH_SPIN`] ago,
    /// and no thread of the proxy has moved anything since (the other thread's move ends the
    /// wait as this one's does).
    fn still_awaited(&self, woken: Instant, now: Instant) -> bool {
        now.saturating_duration_since(woken) < LAUNCH_SPIN && self.moved_at.load(Ordering::Relaxed) < self.stamp(woken)
    }
}

/// Wakes a proxy's threads ahead of the steps of kernels being launched, and tells them which of
/// the communicator's channels they use (see the module docs).
#[derive(Clone)]
pub struct Waker {
    threads: Vec<(Halves, Arc<AtomicBool>, std::thread::Thread)>,
    launches: Arc<Launches>,
}

impl Waker {
    /// `channels`: a bit per channel the launch's kernels use; `off_ring`: those of them its works
    /// that may reach a peer connected at runtime use ([`Launches`]); `sends`, `receives`: whether
    /// its kernels may send, and receive; `to`: the ranks it may send to, bit `r % 64` for rank r.
    /// Only the threads of the halves it may use are woken, and of several send threads those of
    /// the ranks it sends to: a thread polls from its wake-up until something moves, and the idle
    /// half's thread of a rank that only sends (a gather's, a broadcast root's) or only receives
    /// would poll through the whole call for nothing, a busy core a process (docs/NET.md, "Two
    /// progress threads").
    /// Cheap when the threads are polling already: a store per channel and one per thread, and a
    /// futex wake only where one sleeps.
    pub fn wake(&self, channels: u64, off_ring: u64, sends: bool, receives: bool, to: u64) {
        self.launches.name(channels, off_ring);
        for (halves, woken, thread) in &self.threads {
            let used = match halves {
                Halves::Send { .. } => sends && to & halves.peers() != 0,
                Halves::Recv => receives,
                Halves::Both => sends || receives,
            };
            if used {
                woken.store(true, Ordering::Release);
                thread.unpark();
            }
        }
    }
}

/// The progress threads of one CUDA device in this process.
pub struct Proxy {
    inner: Arc<Inner>,
    /// What each thread drives, in the order of `threads` and `inner.woken`.
    halves: Vec<Halves>,
    threads: Vec<JoinHandle<()>>,
}

/// A proxy's device and whether it splits the halves.
type ProxyKey = (i32, bool);

/// The live proxies; a proxy stops when its last user drops it.
static PROXIES: Mutex<Vec<(ProxyKey, Weak<Proxy>)>> = Mutex::new(Vec::new());

impl Proxy {
    /// The proxy of `dev` for connections whose halves get a thread each or share one
    /// ([`Threads::choose`]), started if none runs, its threads on `NCCL_PROXY_CPUSET` or else on
    /// `cpus` (the CPUs near the GPU of the communicator that starts it; `crate::affinity`).
    /// How many threads send is also that communicator's choice: a later one shares them.
    pub fn for_device(dev: i32, threads: Threads, cpus: Option<&CpuSet>) -> Result<Arc<Proxy>> {
        let split = threads != Threads::One;
        let mut all = PROXIES.lock();
        all.retain(|(_, w)| w.strong_count() > 0);
        if let Some(p) = all.iter().find(|(k, _)| *k == (dev, split)).and_then(|(_, w)| w.upgrade()) {
            return Ok(p);
        }
        // A process that exits with communicators alive still says goodbye on their connections.
        crate::exit::on_exit(farewell);
        let halves = threads.halves();
        let inner = Arc::new(Inner {
            entries: RwLock::new(Vec::new()),
            stop: AtomicBool::new(false),
            next_id: 1.into(),
            woken: halves.iter().map(|_| Arc::new(AtomicBool::new(false))).collect(),
            moved_at: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        let mut p = Proxy { inner: inner.clone(), halves: halves.clone(), threads: Vec::new() };
        let bind = affinity::proxy_cpus(cpus);
        crate::nccl_info!(
            crate::debug::Subsys::NET,
            "NET: proxy of device {dev}: {threads} on {}",
            bind.map_or("the caller's CPUs".to_string(), |s| format!("CPUs {s}"))
        );
        for (i, &h) in halves.iter().enumerate() {
            let run = inner.clone();
            // The receiving thread's name ends in `r`, a further sending thread's in `s` and its
            // lane; the first sending thread's is NCCL's proxy thread's.
            let tail = match h {
                Halves::Recv => "r".to_string(),
                Halves::Send { lane, .. } if lane > 0 => format!("s{lane}"),
                _ => String::new(),
            };
            let name = format!("nccl-proxy-d{dev}{tail}");
            let t = std::thread::Builder::new().name(name.clone()).spawn(move || {
                if let Some(set) = bind {
                    affinity::bind_this_thread(&set, &name);
                }
                serve(&run, i, h)
            });
            // Dropping `p` stops the threads already started.
            p.threads
                .push(t.map_err(|e| Error::System(format!("NET: cannot start a proxy thread of device {dev}: {e}")))?);
        }
        let p = Arc::new(p);
        all.push(((dev, split), Arc::downgrade(&p)));
        Ok(p)
    }

    /// What wakes this proxy's threads for the communicator whose entries were made
    /// [`Entry::launched_by`] `launches`.
    pub fn waker(&self, launches: Arc<Launches>) -> Waker {
        let threads = (self.halves.iter().zip(&self.inner.woken).zip(&self.threads))
            .map(|((&h, woken), t)| (h, woken.clone(), t.thread().clone()))
            .collect();
        Waker { threads, launches }
    }

    /// Hands a connection to the threads; the id removes it.
    pub fn add(&self, mut e: Entry) -> u64 {
        e.id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let id = e.id;
        self.inner.entries.write().push(e);
        id
    }

    /// How many of these connections' peers have said goodbye.
    pub fn closed_by_peer(&self, ids: &[u64]) -> usize {
        let entries = self.inner.entries.read();
        entries.iter().filter(|e| ids.contains(&e.id) && e.peer_closed.load(Ordering::Acquire)).count()
    }

    /// Takes connections out of the threads (once this returns, neither touches them); the
    /// caller closes them ([`close`]) outside the threads' lock.
    pub fn remove(&self, ids: &[u64]) -> Vec<Entry> {
        let mut entries = self.inner.entries.write();
        let (gone, kept) = std::mem::take(&mut *entries).into_iter().partition(|e| ids.contains(&e.id));
        *entries = kept;
        gone
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            // A thread checks `stop` after every poll and nap.
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// At exit with communicators alive: every proxy's connections say goodbye, so that peers which
/// go on (or exit later) see an orderly close, not a lost rank. Nothing is freed: the pinned
/// blocks and the comms stay with their communicators, which the process leaks (crate::exit).
fn farewell() {
    let proxies: Vec<Arc<Proxy>> = PROXIES.lock().iter().filter_map(|(_, w)| w.upgrade()).collect();
    for p in proxies {
        // The write lock keeps the proxy's threads out while the goodbyes go, as `close` has the
        // connections to itself: neither posts a receive behind the other's back.
        part(&p.inner.entries.write());
    }
}

/// Thread `me` of a proxy, driving `halves` of every connection: poll them, spin while a step is
/// in flight or after a wake-up, nap when idle. It touches pinned memory only while the process
/// is not exiting (crate::exit), and then stops.
fn serve(inner: &Inner, me: usize, halves: Halves) {
    // Naps are timed to microseconds: without this, Linux lets a 20 us nap run 50 us late.
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack; its failure is harmless.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
    let mut last_move = Instant::now();
    let (mut round, mut napped) = (0u32, false);
    // A wake-up that nothing has moved since, less than LAUNCH_SPIN ago, and when the send path
    // was last kept warm for it.
    let mut awaiting: Option<Instant> = None;
    let mut warmed = Instant::now();
    let sends = halves.sends();
    while !inner.stop.load(Ordering::Acquire) {
        if inner.woken[me].swap(false, Ordering::AcqRel) {
            last_move = Instant::now();
            (awaiting, warmed) = (Some(last_move), last_move);
        }
        let Some(alive) = crate::exit::hold() else { return };
        let (mut moved, mut busy) = (false, false);
        // After a nap every connection is tested: a round costs little next to the nap.
        round = if napped { 0 } else { round.wrapping_add(1) };
        let sweep = round % COLD_EVERY == 0;
        let start = Instant::now();
        awaiting = awaiting.filter(|&t| inner.still_awaited(t, start));
        let entries = inner.entries.read();
        if sends && awaiting.is_some() && start - warmed >= WARM_EVERY {
            // The first comm that warms the path warms it for every comm of its net.
            let _ =
                entries.iter().filter(|e| !e.failed() && halves.serves(e.peer)).any(|e| e.send.lock().side.comm.warm());
            warmed = start;
        }
        for e in entries.iter().filter(|e| halves.serves(e.peer)) {
            let (m, b) = e.progress(halves, halves.receives() && e.hot(start, sweep), start);
            moved |= m;
            busy |= b;
        }
        if halves == Halves::Both {
            // The receives' syscalls make up most of a round: look at the send halves (loads
            // from host memory only) once more, so a kernel's step waits half as long to be
            // noticed.
            for e in entries.iter() {
                let (m, b) = e.progress(SENDS, false, start);
                moved |= m;
                busy |= b;
            }
        }
        drop(entries);
        drop(alive);
        let now = Instant::now();
        if moved {
            last_move = now;
            awaiting = None;
            if halves != Halves::Both {
                inner.moved_at.store(inner.stamp(now), Ordering::Relaxed);
            }
        }
        let idle = now - last_move;
        napped = nap_now(busy, idle, awaiting.is_some());
        if !napped {
            std::thread::yield_now();
        } else {
            // A wake-up ends the nap early.
            std::thread::park_timeout(if idle < LONG_IDLE { NAP } else { LONG_NAP });
        }
    }
}

/// Whether the thread naps after a round: not while a step is in flight (`busy`), nor within
/// [`SPIN`] of the last move (`idle` ago), nor while a wake-up is `awaited` (nothing has moved
/// since, and it came less than [`LAUNCH_SPIN`] ago).
fn nap_now(busy: bool, idle: Duration, awaited: bool) -> bool {
    !(busy || idle < SPIN || awaited)
}

#[cfg(test)]
mod tests {
    use super::super::{MemHandle, PtrKind, RecvBuf};
    use super::*;
    use crate::plugin::profiler::Parent;

    /// A launch's wake-up keeps the thread polling while it is awaited, however long the
    /// kernel waits behind other work (how long it stays awaited: the warm-up test below).
    #[test]
    fn the_thread_polls_from_a_launch_until_something_moves() {
        let ms = Duration::from_millis;
        assert!(!nap_now(true, ms(500), false), "a step in flight");
        assert!(!nap_now(false, ms(1), false), "within SPIN of a move");
        assert!(nap_now(false, ms(3), false), "idle, no launch awaited");
        assert!(!nap_now(false, ms(20), true), "a launch awaited, nothing moved since");
    }

    #[test]
    fn a_plugins_halves_get_a_thread_each_only_where_there_are_cpus_for_them() {
        let split = |setting, builtin, ncpus| Threads::rule(setting, 0, builtin, ncpus, ncpus, 3) != Threads::One;
        assert!(!split(0, true, Some(64)), "the built-in net's helpers move its large messages");
        assert!(split(0, false, Some(SPLIT_MIN_CPUS)));
        assert!(split(0, false, None), "CPUs not known");
        assert!(!split(0, false, Some(2)), "two CPUs: the rank's thread and one proxy thread");
        assert!(split(2, false, Some(1)) && split(2, true, Some(1)), "two, as set");
        assert!(!split(1, false, Some(64)), "one, as set");
    }

    /// A second send thread where a rank's share of the machine has the CPUs for it, unless set.
    #[test]
    fn a_second_send_thread_only_where_a_rank_has_the_machines_cpus_for_it() {
        let send = |setting, share| match Threads::rule(0, setting, false, Some(64), share, 3) {
            Threads::Split { send } => send,
            Threads::One => 0,
        };
        assert_eq!(send(0, Some(SEND_LANES_MIN_CPUS)), 2, "eight CPUs a rank");
        assert_eq!(send(0, Some(SEND_LANES_MIN_CPUS - 1)), 1);
        assert_eq!(send(0, None), 1, "a share not known");
        assert_eq!((send(3, Some(1)), send(1, Some(64)), send(99, None)), (3, 1, 8), "as set, at most 8");
        assert_eq!(send(-1, Some(64)), 2, "below 1: by the CPUs");
        let one_peer = Threads::rule(0, 0, false, Some(64), Some(64), 1);
        assert_eq!(one_peer, Threads::Split { send: 1 }, "one peer over the net: nothing to send side by side");
        assert_eq!(Threads::rule(0, 2, false, Some(64), Some(64), 1), Threads::Split { send: 2 }, "unless set");
        assert_eq!(Threads::rule(1, 2, false, Some(64), Some(64), 3), Threads::One, "no send threads without a split");
        let socket = Threads::rule(2, 0, true, Some(64), Some(64), 3);
        assert_eq!(socket, Threads::Split { send: 1 }, "the built-in net's helpers send side by side already");
        assert_eq!(Threads::Split { send: 2 }.halves().len(), 3);
        assert_eq!(Threads::One.halves(), [Halves::Both]);
        // scripts/gpu_check.sh finds one-thread proxies by their INFO line.
        assert_eq!(Threads::One.to_string(), "one thread");
        assert!(Threads::Split { send: 2 }.to_string().starts_with("2 threads for the send halves"));
    }

    /// A rank's share: the CPUs its threads may run on, at most the machine's over its ranks.
    #[test]
    fn a_ranks_share_of_the_machine() {
        assert_eq!(share(Some(16), Some(16), 4), Some(4), "four ranks unbound on 16 cores");
        assert_eq!(share(Some(32), Some(32), 4), Some(8), "four ranks unbound on 32 cores");
        assert_eq!(share(Some(4), Some(64), 2), Some(4), "bound to four of many");
        assert_eq!(share(Some(8), None, 4), Some(8), "the machine's CPUs not known");
        assert_eq!(share(None, Some(8), 1), None, "the threads' CPUs not known");
        assert_eq!(share(Some(8), Some(8), 0), Some(8), "no rank counted is one");
    }

    /// A wake-up is awaited until either thread moves something after it, LAUNCH_SPIN at most.
    #[test]
    fn a_wake_up_is_awaited_until_either_thread_moves() {
        let inner = Inner {
            entries: RwLock::new(Vec::new()),
            stop: AtomicBool::new(false),
            next_id: 1.into(),
            woken: Vec::new(),
            moved_at: AtomicU64::new(0),
            epoch: Instant::now(),
        };
        let woken = inner.epoch + Duration::from_millis(5);
        let soon = woken + Duration::from_millis(1);
        assert!(inner.still_awaited(woken, soon), "nothing moved yet");
        assert!(!inner.still_awaited(woken, woken + LAUNCH_SPIN), "awaited LAUNCH_SPIN at most");
        inner.moved_at.store(inner.stamp(woken - Duration::from_millis(1)), Ordering::Relaxed);
        assert!(inner.still_awaited(woken, soon), "a move before the wake-up does not end it");
        inner.moved_at.store(inner.stamp(soon), Ordering::Relaxed);
        assert!(!inner.still_awaited(woken, soon + Duration::from_millis(1)), "a move after it does");
    }

    /// A launch makes the connections of the channels it names hot for a while, no others, and
    /// those that have not moved since it until they do (at most LAUNCH_SPIN); a connection made
    /// at runtime only for a launch that may reach such peers.
    #[test]
    fn launches_name_their_channels_for_a_while() {
        let l = Launches::default();
        let before = Instant::now();
        assert!(!(0..64).any(|c| l.named(c, false, before, before)), "nothing is named before a launch");
        std::thread::sleep(Duration::from_millis(1));
        l.name(1 << 0 | 1 << 5 | 1 << 63, 0);
        let now = Instant::now();
        let named: Vec<usize> = (0..64).filter(|&c| l.named(c, false, now, now)).collect();
        assert_eq!(named, [0, 5, 63]);
        assert!(!(0..64).any(|c| l.named(c, true, now, now)), "a ring launch leaves runtime connections cold");
        assert!(!l.named(64, false, now, before), "no channel 64");
        let later = now + LAUNCHED + Duration::from_millis(1);
        assert!(!l.named(5, false, later, now), "a launch's mark wears off once its connection moved");
        assert!(l.named(5, false, later, before), "a connection that has not moved since stays hot");
        assert!(!l.named(1, false, later, before), "only on the channels named");
        assert!(!l.named(5, false, now + LAUNCH_SPIN + Duration::from_millis(1), before), "but not forever");
        l.name(1 << 1, 1 << 2);
        let now = Instant::now();
        let (ring, off): (Vec<usize>, Vec<usize>) = (
            (0..64).filter(|&c| l.named(c, false, now, now)).collect(),
            (0..64).filter(|&c| l.named(c, true, now, now)).collect(),
        );
        assert_eq!((ring, off), (vec![0, 1, 2, 5, 63], vec![2]), "a launch reaching peers off the ring names both");
    }

    /// A comm that never sees a byte, and counts how often it is asked to keep its path warm.
    struct Idle(Arc<AtomicU64>);

    impl SendComm for Idle {
        fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrKind) -> Result<MemHandle> {
            Ok(MemHandle(1))
        }
        fn dereg_mr(&mut self, _: MemHandle) -> Result<()> {
            Ok(())
        }
        unsafe fn isend_in(
            &mut self,
            _: *const u8,
            _: usize,
            _: i32,
            _: &MemHandle,
            _: Option<&Parent>,
        ) -> Result<Option<Request>> {
            Ok(Some(Request(1)))
        }
        fn test(&mut self, _: &Request) -> Result<Option<usize>> {
            Ok(Some(4))
        }
        fn warm(&mut self) -> bool {
            self.0.fetch_add(1, Ordering::Relaxed);
            true
        }
    }

    impl RecvComm for Idle {
        fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrKind) -> Result<MemHandle> {
            Ok(MemHandle(1))
        }
        fn dereg_mr(&mut self, _: MemHandle) -> Result<()> {
            Ok(())
        }
        unsafe fn irecv_in(&mut self, _: &[RecvBuf], _: &[&MemHandle], _: Option<&Parent>) -> Result<Option<Request>> {
            Ok(Some(Request(1)))
        }
        fn iflush(&mut self, _: &[RecvBuf], _: &[&MemHandle]) -> Result<Option<Request>> {
            Ok(None)
        }
        fn test(&mut self, _: &Request) -> Result<Option<Vec<usize>>> {
            Ok(None)
        }
    }

    /// The send path is kept warm while a launch's first step is awaited, and only then: not
    /// before a wake-up, nor once LAUNCH_SPIN has passed without a move (then the thread naps);
    /// by the one thread, or by the sending one of two.
    #[test]
    fn the_send_path_is_kept_warm_while_a_launch_is_awaited() {
        for (dev, threads) in [(-1001, Threads::One), (-1002, Threads::Split { send: 1 })] {
            send_path_kept_warm(dev, threads);
        }
    }

    fn send_path_kept_warm(dev: i32, threads: Threads) {
        let warms = Arc::new(AtomicU64::new(0));
        let layout = Layout { slot_bytes: 1 << 16, one_message: false };
        let block = Arc::new(HostBlock::plain(layout.block_bytes()).unwrap());
        let fault: FaultHook = Arc::new(|e| panic!("{e}"));
        let send = Box::new(Idle(warms.clone()));
        let recv = Box::new(Idle(Arc::default()));
        let e = Entry::new(send, recv, block, layout, "an idle peer".into(), fault, None).unwrap();
        let proxy = Proxy::for_device(dev, threads, None).unwrap();
        let id = proxy.add(e);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(warms.load(Ordering::Relaxed), 0, "no launch awaited, no warm-up");
        let woken = Instant::now();
        proxy.waker(Arc::default()).wake(1, 0, true, true, u64::MAX);
        std::thread::sleep(Duration::from_millis(20));
        let during = warms.load(Ordering::Relaxed);
        let took = woken.elapsed();
        // About one every WARM_EVERY, never more often; the sleep may last longer than asked on a
        // loaded machine, and the thread may run a fraction of the time.
        let most = (took.as_micros() / WARM_EVERY.as_micros()) as u64 + 2;
        assert!(
            (2..=most).contains(&during),
            "{during} warm-ups in {took:?}, every {WARM_EVERY:?} expected ({threads:?})"
        );
        std::thread::sleep(LAUNCH_SPIN + Duration::from_millis(50));
        let after = warms.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(warms.load(Ordering::Relaxed), after, "none once the launch is no longer awaited");
        drop(proxy.remove(&[id]));
    }

    /// A launch wakes the threads of the halves it may use, and leaves the other's asleep; of
    /// several send threads, those of the ranks it may send to.
    #[test]
    fn a_launch_wakes_the_threads_of_the_halves_it_uses() {
        let me = std::thread::current();
        let (lane0, lane1) = (Halves::Send { lane: 0, of: 2 }, Halves::Send { lane: 1, of: 2 });
        let shapes = [SENDS, Halves::Recv, Halves::Both, lane0, lane1];
        for (sends, receives) in [(true, true), (true, false), (false, true), (false, false)] {
            for (to, even, odd) in [
                (0b100, true, false),
                (0b110, true, true),
                (0b10, false, true),
                (u64::MAX, true, true),
                (0, false, false),
            ] {
                let flags: Vec<Arc<AtomicBool>> = shapes.iter().map(|_| Arc::default()).collect();
                let threads = shapes.iter().zip(&flags).map(|(&h, f)| (h, f.clone(), me.clone())).collect();
                Waker { threads, launches: Arc::default() }.wake(1, 0, sends, receives, to);
                let woken: Vec<bool> = flags.iter().map(|f| f.load(Ordering::Acquire)).collect();
                let want = [sends && to != 0, receives, sends || receives, sends && even, sends && odd];
                assert_eq!(woken, want, "sends {sends}, receives {receives}, to {to:#b}");
            }
        }
    }

    /// Send threads share the peers out by lane; the others drive every connection.
    #[test]
    fn send_threads_share_the_peers_out() {
        let lanes: Vec<Halves> = (0..3).map(|lane| Halves::Send { lane, of: 3 }).collect();
        for r in 0..200 {
            let serving: Vec<bool> = lanes.iter().map(|h| h.serves(r)).collect();
            assert_eq!(serving.iter().filter(|&&s| s).count(), 1, "rank {r}: one send thread");
            assert!(serving[r % 64 % 3] && lanes[r % 64 % 3].peers() >> (r % 64) & 1 == 1);
        }
        assert_eq!(lanes.iter().fold(0, |m, h| m | h.peers()), u64::MAX);
        assert!(SENDS.serves(5) && Halves::Recv.serves(5) && Halves::Both.serves(5));
        assert!(SENDS.sends() && !SENDS.receives() && Halves::Recv.receives() && !Halves::Recv.sends());
    }

    /// A wake-up reaches every thread while it naps (a fresh proxy naps at once: nothing moves).
    #[test]
    fn a_wake_up_reaches_a_napping_thread() {
        let proxy = Proxy::for_device(-1000, Threads::Split { send: 1 }, None).unwrap();
        assert_eq!(proxy.threads.len(), 2, "a thread for each half");
        let waker = proxy.waker(Arc::default());
        for _ in 0..3 {
            std::thread::sleep(SPIN * 2);
            waker.wake(1, 0, true, true, u64::MAX);
            let end = Instant::now() + Duration::from_secs(10);
            while proxy.inner.woken.iter().any(|w| w.load(Ordering::Acquire)) {
                assert!(Instant::now() < end, "a proxy thread never took the wake-up");
                std::thread::yield_now();
            }
        }
    }

    /// The CPUs each thread of this process whose name starts with `name` may run on (its
    /// `Cpus_allowed_list`).
    fn threads_cpus(name: &str) -> Vec<String> {
        let mut found = Vec::new();
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim_end().starts_with(name) {
                let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
                let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
                found.push(line.unwrap_or("").trim().to_string());
            }
        }
        found
    }

    /// A proxy's threads run on the CPUs they were given (near the GPU of the communicator that
    /// starts them), whatever the thread that starts them runs on.
    #[test]
    fn a_proxys_threads_run_on_the_cpus_near_the_gpu() {
        let allowed = std::fs::read_to_string("/proc/self/status").unwrap();
        let allowed = allowed.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
        let mine = CpuSet::parse(&allowed).unwrap();
        // With one CPU allowed, unbound threads would show the same list: nothing to tell apart.
        if mine.count() < 2 {
            eprintln!("skipped: this process may run on one CPU only");
            return;
        }
        let first = mine.to_string().split([',', '-']).next().unwrap().to_string();
        let one = CpuSet::parse(&first).unwrap();
        // Device -7: no other test's proxy; its threads' names fit the kernel's 15 characters.
        let proxy = Proxy::for_device(-7, Threads::Split { send: 2 }, Some(&one)).unwrap();
        // Each thread binds itself as it starts.
        let want = vec![first.clone(), first.clone(), first];
        let end = Instant::now() + Duration::from_secs(10);
        let mut cpus = threads_cpus("nccl-proxy-d-7");
        while cpus != want && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
            cpus = threads_cpus("nccl-proxy-d-7");
        }
        assert_eq!(cpus, want, "every thread, both send threads and the receiving one, on the one CPU given");
        drop(proxy);
    }
}
