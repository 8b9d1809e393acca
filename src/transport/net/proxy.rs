//! The proxy progress thread of the NET transport: it moves the steps the kernels put in host
//! memory over the net, and lands the peer's steps where the kernels read them (`docs/NET.md`,
//! "The NET transport").
//!
//! One thread per process and CUDA device, shared by every communicator on that device, as in
//! NCCL; connections join it at init ([`Proxy::add`]) and leave at destroy or abort
//! ([`Proxy::remove`]). Per connection it drives one send comm and one receive comm:
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
//! The thread busy-polls while any connection has a step in flight and backs off to short sleeps
//! when every connection is idle. A communicator wakes it when it launches kernels ([`Waker`]),
//! as NCCL posts its proxy ops at enqueue, and it then polls until something moves (at most
//! [`LAUNCH_SPIN`]), as NCCL's proxy polls while an op is posted: the kernel may run long after
//! its launch, behind the compute queued before it on its stream, and its first step should not
//! wait for a nap to end. The wake-up names the channels the kernels use (and apart, those of
//! works that may reach a peer connected at runtime: [`Launches`]), so that a round asks only
//! those connections (and ones that moved in the last millisecond) for bytes, as NCCL's
//! proxy progresses only the ops posted to it: a round is then shorter, and each step is noticed
//! sooner (docs/NET.md, "Small steps"). While it waits for that first step, it has its comms keep
//! the thread's send path warm ([`SendComm::warm`]): the kernel's TCP stack, idle a few
//! milliseconds, makes the next send two to eight times slower (docs/NET.md, "A warm send path").
//!
//! A connection whose net fails (a peer gone, garbage in a size word) is reported once through
//! its fault hook, which stops the communicator's kernels, and is not touched again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

mod block;
mod side;
mod trace;

use super::{RecvComm, Request, SendComm};
use crate::abi::{FN_MAX_CHANNELS, FN_NSTEPS};
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

/// Called once with the error that ended a connection: stops the communicator and says why.
pub type FaultHook = Arc<dyn Fn(String) + Send + Sync>;

/// One connection (a peer on a channel) in the proxy: its two comms and their host block.
pub struct Entry {
    // Dropped in this order: the comms (which stop their threads) before the memory they use.
    send: SendSide,
    recv: RecvSide,
    block: Arc<HostBlock>,
    layout: Layout,
    /// "rank 3 (host h, pid 7), channel 2": how faults name the connection.
    who: String,
    fault: FaultHook,
    failed: bool,
    /// Our goodbye word is posted (at close, or in answer to the peer's), and its send request
    /// while it is in flight.
    said_goodbye: bool,
    goodbye: Option<Request>,
    id: u64,
    /// When either half last moved or had a step in flight (see [`HOT`]).
    active: Instant,
    /// The communicator's launches ([`Launches`]), and this connection's channel.
    launches: Arc<Launches>,
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
        Ok(Entry {
            send,
            recv,
            block,
            layout,
            who,
            fault,
            failed: false,
            said_goodbye: false,
            goodbye: None,
            id: 0,
            active: Instant::now(),
            launches: Arc::default(),
            channel: 0,
            off_ring: false,
        })
    }

    /// Makes the connection hot whenever a launch of `launches`' communicator names `channel`;
    /// for one made at runtime (`off_ring`), a launch that may reach such peers ([`Launches`]).
    pub fn launched_by(mut self, launches: Arc<Launches>, channel: usize, off_ring: bool) -> Entry {
        (self.launches, self.channel, self.off_ring) = (launches, channel, off_ring);
        self
    }

    /// Whether this round tests the receive: a sweep, a recent move, or a launch on its channel
    /// (see [`HOT`]).
    fn hot(&self, now: Instant, sweep: bool) -> bool {
        sweep || now - self.active < HOT || self.launches.named(self.channel, self.off_ring, now, self.active)
    }

    /// One round over both halves, the receiving one only if `recv` (see [`HOT`]): (anything
    /// moved, a step still in flight).
    fn progress(&mut self, recv: bool) -> (bool, bool) {
        if self.failed {
            return (false, false);
        }
        if self.recv.peer_closed {
            // The peer's receive of our next size word is still posted: answer its goodbye with
            // ours, so that its comm closes with nothing in flight.
            return (self.answer_goodbye(), false);
        }
        let r = self.send.progress(&self.block, &self.layout).map_err(|e| e.context("sending")).and_then(|s| {
            Ok(s | (recv && self.recv.progress(&self.block, &self.layout).map_err(|e| e.context("receiving"))?))
        });
        match r {
            Ok(moved) => {
                let (send_busy, recv_busy) = (self.send.busy(&self.block), self.recv.busy());
                for (busy, t) in [(send_busy, &mut self.send.trace), (recv_busy, &mut self.recv.trace)] {
                    if let Some(t) = t.as_mut().filter(|_| !busy) {
                        t.idle();
                    }
                }
                (moved, send_busy || recv_busy)
            }
            Err(e) => {
                self.failed = true;
                (self.fault)(format!("NET connection with {}: {e}", self.who));
                (true, false)
            }
        }
    }
}

/// Closes connections taken out of the proxy ([`Proxy::remove`]): sends what is left to send, says goodbye on each, so the
/// peers see a close and not a failure, and waits at most [`GOODBYE_WAIT`] in all for the words
/// to go out and for the peers' answers to land in the receives we have posted, so that every
/// request is complete when the comms close (a strict net plugin warns about, or leaks, requests
/// still in flight at close). Then drops them.
pub fn close(mut entries: Vec<Entry>) {
    part(&mut entries);
}

/// Says goodbye on every connection and waits for the answers, as [`close`] does, without
/// freeing anything: the connections stay with their owner.
fn part(entries: &mut [Entry]) {
    // Steps the kernel has already handed over go out first: a rank whose last collective has
    // completed on its GPU may still owe its peers the data of that collective's final steps.
    let end = Instant::now() + DRAIN_WAIT;
    while Instant::now() < end && entries.iter().any(|e| !e.failed && !e.recv.peer_closed && e.send.busy(&e.block)) {
        if !entries.iter_mut().fold(false, |moved, e| e.progress(true).0 | moved) {
            std::thread::yield_now();
        }
    }
    for e in entries.iter_mut() {
        e.say_goodbye();
    }
    let end = Instant::now() + GOODBYE_WAIT;
    while Instant::now() < end && entries.iter_mut().map(Entry::settle).fold(false, |busy, b| busy | b) {
        std::thread::yield_now();
    }
}

impl Entry {
    /// Posts the goodbye word once, unless the connection failed or a step is half sent (its size
    /// word went out: the peer expects its data next).
    fn say_goodbye(&mut self) {
        if self.said_goodbye || self.failed || self.send.size_sent.is_some() {
            return;
        }
        self.said_goodbye = true;
        self.block.store_u32(GOODBYE_AT, GOODBYE);
        let Some(mr) = self.send.mr.as_ref() else { return };
        // SAFETY: the word is in the block, which outlives the comm (field order of Entry).
        self.goodbye = unsafe { self.send.comm.isend(self.block.ptr(GOODBYE_AT, 4), 4, TAG_SIZE, mr) }.ok().flatten();
        // A net with no free request now: the word goes out on a later attempt.
        self.said_goodbye = self.goodbye.is_some();
    }

    /// After the peer's goodbye: ours in answer once nothing of ours is in flight, and its
    /// request tested; whether anything moved.
    fn answer_goodbye(&mut self) -> bool {
        if !self.said_goodbye && !self.send.busy(&self.block) {
            self.say_goodbye();
            return self.said_goodbye;
        }
        self.test_goodbye();
        false
    }

    fn test_goodbye(&mut self) {
        if let Some(r) = &self.goodbye {
            if !matches!(self.send.comm.test(r), Ok(None)) {
                self.goodbye = None;
            }
        }
    }

    /// One look at a closing connection: whether it still waits, for our goodbye to go out or
    /// for a receive to complete (the peer's goodbye, or a step already on its way).
    fn settle(&mut self) -> bool {
        if self.failed {
            return false;
        }
        if !self.said_goodbye {
            self.say_goodbye();
        }
        self.test_goodbye();
        while let Some((req, what)) = self.recv.inflight.front() {
            match self.recv.comm.test(req) {
                Ok(None) => break,
                Ok(Some(got)) => {
                    // A goodbye is a size word alone.
                    let at = match *what {
                        Expect::Size(step, landing) if got.first() == Some(&4) => {
                            Some(self.layout.recv_first((step % NSTEPS) as usize, landing).0)
                        }
                        _ => None,
                    };
                    self.recv.peer_closed |= at.is_some_and(|at| self.block.load_u32(at) == GOODBYE);
                    self.recv.inflight.pop_front();
                }
                Err(_) => {
                    self.failed = true;
                    return false;
                }
            }
        }
        self.goodbye.is_some() || !self.recv.inflight.is_empty()
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
    entries: Mutex<Vec<Entry>>,
    stop: AtomicBool,
    next_id: AtomicU64,
    /// Set by [`Waker::wake`]: polling restarts from now.
    woken: Arc<AtomicBool>,
}

/// Wakes a proxy thread ahead of the steps of kernels being launched, and tells it which of
/// the communicator's channels they use (see the module docs).
#[derive(Clone)]
pub struct Waker {
    woken: Arc<AtomicBool>,
    thread: std::thread::Thread,
    launches: Arc<Launches>,
}

impl Waker {
    /// `channels`: a bit per channel the launch's kernels use; `off_ring`: those of them its works
    /// that may reach a peer connected at runtime use ([`Launches`]). Cheap when the thread is
    /// polling already: a store per channel and one more, and a futex wake only if it sleeps.
    pub fn wake(&self, channels: u64, off_ring: u64) {
        self.launches.name(channels, off_ring);
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// The progress thread of one CUDA device in this process.
pub struct Proxy {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

/// The live proxies, by device; a proxy stops when its last user drops it.
static PROXIES: Mutex<Vec<(i32, Weak<Proxy>)>> = Mutex::new(Vec::new());

impl Proxy {
    /// The proxy of `dev`, started if none runs.
    pub fn for_device(dev: i32) -> Result<Arc<Proxy>> {
        let mut all = PROXIES.lock();
        all.retain(|(_, w)| w.strong_count() > 0);
        if let Some(p) = all.iter().find(|(d, _)| *d == dev).and_then(|(_, w)| w.upgrade()) {
            return Ok(p);
        }
        // A process that exits with communicators alive still says goodbye on their connections.
        crate::exit::on_exit(farewell);
        let inner = Arc::new(Inner {
            entries: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            next_id: 1.into(),
            woken: Arc::new(AtomicBool::new(false)),
        });
        let run = inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nccl-proxy-d{dev}"))
            .spawn(move || serve(&run))
            .map_err(|e| Error::System(format!("NET: cannot start the proxy thread of device {dev}: {e}")))?;
        let p = Arc::new(Proxy { inner, thread: Some(thread) });
        all.push((dev, Arc::downgrade(&p)));
        Ok(p)
    }

    /// What wakes this proxy's thread for the communicator whose entries were made
    /// [`Entry::launched_by`] `launches`.
    pub fn waker(&self, launches: Arc<Launches>) -> Waker {
        let thread = self.thread.as_ref().expect("the thread runs until drop").thread().clone();
        Waker { woken: self.inner.woken.clone(), thread, launches }
    }

    /// Hands a connection to the thread; the id removes it.
    pub fn add(&self, mut e: Entry) -> u64 {
        e.id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let id = e.id;
        self.inner.entries.lock().push(e);
        id
    }

    /// How many of these connections' peers have said goodbye.
    pub fn closed_by_peer(&self, ids: &[u64]) -> usize {
        self.inner.entries.lock().iter().filter(|e| ids.contains(&e.id) && e.recv.peer_closed).count()
    }

    /// Takes connections out of the thread; the caller closes them ([`close`]) outside the
    /// thread's lock.
    pub fn remove(&self, ids: &[u64]) -> Vec<Entry> {
        let mut entries = self.inner.entries.lock();
        let (gone, kept) = std::mem::take(&mut *entries).into_iter().partition(|e| ids.contains(&e.id));
        *entries = kept;
        gone
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // The thread checks `stop` after every poll and nap.
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
        part(&mut p.inner.entries.lock());
    }
}

/// The thread: poll every connection, spin while something is in flight or after a wake-up,
/// nap when idle. It touches pinned memory only while the process is not exiting (crate::exit),
/// and then stops.
fn serve(inner: &Inner) {
    // Naps are timed to microseconds: without this, Linux lets a 20 us nap run 50 us late.
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack; its failure is harmless.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
    let mut last_move = Instant::now();
    let (mut round, mut napped) = (0u32, false);
    // A wake-up that nothing has moved since, less than LAUNCH_SPIN ago, and when the send path
    // was last kept warm for it.
    let mut awaiting: Option<Instant> = None;
    let mut warmed = Instant::now();
    while !inner.stop.load(Ordering::Acquire) {
        if inner.woken.swap(false, Ordering::AcqRel) {
            last_move = Instant::now();
            (awaiting, warmed) = (Some(last_move), last_move);
        }
        let Some(alive) = crate::exit::hold() else { return };
        let (mut moved, mut busy) = (false, false);
        // After a nap every connection is tested: a round costs little next to the nap.
        round = if napped { 0 } else { round.wrapping_add(1) };
        let sweep = round % COLD_EVERY == 0;
        let start = Instant::now();
        awaiting = awaiting.filter(|&t| start - t < LAUNCH_SPIN);
        let mut entries = inner.entries.lock();
        if awaiting.is_some() && start - warmed >= WARM_EVERY {
            // The first comm that warms the path warms it for every comm of its net.
            let _ = entries.iter_mut().filter(|e| !e.failed).any(|e| e.send.comm.warm());
            warmed = start;
        }
        for e in entries.iter_mut() {
            let (m, b) = e.progress(e.hot(start, sweep));
            if m || b {
                e.active = start;
            }
            moved |= m;
            busy |= b;
        }
        // The receives' syscalls make up most of a round: look at the send halves (loads from
        // host memory only) once more, so a kernel's step waits half as long to be noticed.
        for e in entries.iter_mut() {
            let (m, b) = e.progress(false);
            if m || b {
                e.active = start;
            }
            moved |= m;
            busy |= b;
        }
        drop(entries);
        drop(alive);
        let now = Instant::now();
        if moved {
            last_move = now;
            awaiting = None;
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
    /// before a wake-up, nor once LAUNCH_SPIN has passed without a move (then the thread naps).
    #[test]
    fn the_send_path_is_kept_warm_while_a_launch_is_awaited() {
        let warms = Arc::new(AtomicU64::new(0));
        let layout = Layout { slot_bytes: 1 << 16, one_message: false };
        let block = Arc::new(HostBlock::plain(layout.block_bytes()).unwrap());
        let fault: FaultHook = Arc::new(|e| panic!("{e}"));
        let send = Box::new(Idle(warms.clone()));
        let recv = Box::new(Idle(Arc::default()));
        let e = Entry::new(send, recv, block, layout, "an idle peer".into(), fault, None).unwrap();
        let proxy = Proxy::for_device(-1001).unwrap();
        let id = proxy.add(e);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(warms.load(Ordering::Relaxed), 0, "no launch awaited, no warm-up");
        proxy.waker(Arc::default()).wake(1, 0);
        std::thread::sleep(Duration::from_millis(20));
        let during = warms.load(Ordering::Relaxed);
        // About 200 in 20 ms; a loaded machine's thread may run a fraction of the time.
        assert!((2..=210).contains(&during), "{during} warm-ups in 20 ms, every {WARM_EVERY:?} expected");
        std::thread::sleep(LAUNCH_SPIN + Duration::from_millis(50));
        let after = warms.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(warms.load(Ordering::Relaxed), after, "none once the launch is no longer awaited");
        drop(proxy.remove(&[id]));
    }

    /// A wake-up reaches the thread while it naps (a fresh proxy naps at once: nothing moves).
    #[test]
    fn a_wake_up_reaches_a_napping_thread() {
        let proxy = Proxy::for_device(-1000).unwrap();
        let waker = proxy.waker(Arc::default());
        for _ in 0..3 {
            std::thread::sleep(SPIN * 2);
            waker.wake(1, 0);
            let end = Instant::now() + Duration::from_secs(10);
            while proxy.inner.woken.load(Ordering::Acquire) {
                assert!(Instant::now() < end, "the proxy thread never took the wake-up");
                std::thread::yield_now();
            }
        }
    }
}
