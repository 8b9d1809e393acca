//! The process's helper threads: they move the chunks of every Socket connection.
//!
//! A thread per connection (NCCL's way) sleeps between calls, and with compute before each call
//! every message at or above [`super::INLINE_MAX`] waited for a wake-up on each side: on one
//! H200's host, sizes of 128 KB to 4 MB over two hosts had their p99 above 1.5 × p50 at 14 to 17
//! of 30 sizes, where the proxy moving everything itself had 3 (docs/NET.md, "The helper pool").
//! So the process has a few helpers shared by every connection's data sockets: any helper moves
//! the first chunk of any socket no other helper is moving. The first helper, the lead, polls
//! while a launch's first step is awaited ([`arm`], through [`super::super::SendComm::warm`]),
//! so a launch's first chunk never waits for a wake-up; the others wake when chunks are queued,
//! to share the work. Every helper polls for [`super::helper_spin`] after it last moved a byte,
//! then sleeps until woken.
//!
//! The helpers live as long as the process and own sockets only: they touch a connection's
//! memory through `send`/`recv` system calls, never after [`Pool::leave`] returned for it, and
//! not once the process has begun to exit (`crate::exit::hold`).

use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::chunk::{step, Shared};
use super::nonblock::poll_fds;
use super::{helper_spin, socket_helpers, HELPER_NAP};
use crate::error::{Error, Result};

/// How long one [`arm`] keeps the lead polling: ten times the proxy's warm-up period, so that it
/// stays awake from one warm-up to the next.
const ARM_FOR: Duration = Duration::from_millis(1);
/// An arm counts only if a chunk was queued this recently: a job whose messages all go inline
/// keeps no helper polling.
const ARM_IF_USED_WITHIN: Duration = Duration::from_secs(1);
/// `last_queued` before any chunk was.
const NEVER: u64 = u64::MAX;

/// A data socket the helpers serve: its connection's shared state and its index there.
struct Served {
    shared: Arc<Shared>,
    index: usize,
    sock: TcpStream,
}

/// One helper thread: how to wake it.
struct Helper {
    /// Readable when the helper should look at the queues again (a chunk queued, an arm).
    wake: OwnedFd,
    /// The helper is in (or about to enter) `poll`: a queuer must write `wake`.
    asleep: AtomicBool,
}

impl Helper {
    fn nudge(&self) {
        if self.asleep.load(Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: `wake` is an eventfd this helper owns; the buffer is 8 valid bytes. A
            // failed write (the counter full) leaves the fd readable, which is all it is for.
            unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    fn drain(&self) {
        let mut n: u64 = 0;
        // SAFETY: as in `nudge`; the eventfd is non-blocking, so this returns at once.
        unsafe { libc::read(self.wake.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

/// The helpers of the process (of the process that made them: a forked child makes its own).
pub(super) struct Pool {
    pid: u32,
    /// Every connection's data sockets. Helpers read it for a whole pass, so that a connection
    /// that leaves (the write lock) is out of every pass once [`Pool::leave`] returns.
    served: RwLock<Vec<Served>>,
    /// The first is the lead, which an arm keeps polling.
    helpers: Vec<Helper>,
    /// The cut between inline and chunked messages for what this process sends, by the CPUs
    /// the helpers run on ([`super::inline_cut`]).
    pub(super) inline_max: usize,
    /// Monotonic nanoseconds (from `epoch`) until which the lead keeps polling.
    armed_until: AtomicU64,
    /// When a chunk was last queued, in the same nanoseconds ([`NEVER`] before the first).
    last_queued: AtomicU64,
    epoch: Instant,
}

static POOL: Mutex<Option<Arc<Pool>>> = Mutex::new(None);

/// The process's pool, made with [`socket_helpers`] threads on first use.
pub(super) fn pool() -> Result<Arc<Pool>> {
    let mut p = POOL.lock();
    let pid = std::process::id();
    if let Some(pool) = p.as_ref().filter(|pool| pool.pid == pid) {
        return Ok(pool.clone());
    }
    let n = socket_helpers().clamp(1, super::MAX_THREADS as i64) as usize;
    // The helpers serve every communicator of the process, whatever its GPU: they run where the
    // thread that starts them runs outside its communicator's init window (crate::affinity).
    let bind = crate::affinity::outside_window();
    let cpus = crate::affinity::cpus_of_new_thread(bind.as_ref());
    // Unit tests keep the cut wherever they run, so that the chunks' path is tested on machines
    // of two CPUs too; `inline_cut` is tested on its own, and the integration tests see the rule.
    let setting = if cfg!(test) { super::INLINE_MAX as i64 } else { super::inline_max_param() };
    let inline_max = super::inline_cut(setting, cpus);
    let pool = Arc::new(Pool {
        pid,
        served: RwLock::new(Vec::new()),
        helpers: (0..n).map(|_| new_helper()).collect::<Result<_>>()?,
        inline_max,
        armed_until: AtomicU64::new(0),
        last_queued: AtomicU64::new(NEVER),
        epoch: Instant::now(),
    });
    crate::nccl_info!(
        crate::debug::Subsys::NET,
        "NET/Socket: helper threads: {n}, on {}; messages sent inline: {}",
        bind.map_or("the caller's CPUs".to_string(), |s| format!("CPUs {s}")),
        match inline_max {
            usize::MAX => "all".to_string(),
            m => format!("below {m} bytes"),
        }
    );
    for i in 0..n {
        let mine = pool.clone();
        let started = std::thread::Builder::new().name(format!("fn-net-help{i}")).spawn(move || {
            if let Some(set) = bind {
                crate::affinity::bind_this_thread(&set, "a Socket net helper");
            }
            serve(&mine, i)
        });
        match started {
            Ok(_) => {}
            // Without its lead the pool moves nothing; the next connection tries again.
            Err(e) if i == 0 => {
                return Err(Error::System(format!("NET/Socket: cannot start a helper thread: {e}")));
            }
            // Any helper serves any socket: the ones that started are a smaller pool.
            Err(e) => {
                crate::nccl_warn!("NET/Socket: started {i} of {n} helper threads ({e}); going on with {i}");
                break;
            }
        }
    }
    *p = Some(pool.clone());
    Ok(pool)
}

fn new_helper() -> Result<Helper> {
    // SAFETY: eventfd takes no pointers; a non-negative return is a new descriptor we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::System(format!("NET/Socket: no eventfd for a helper: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: fd was just returned by eventfd and nothing else owns it.
    let wake = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    Ok(Helper { wake, asleep: AtomicBool::new(false) })
}

/// Keeps the lead helper polling for [`ARM_FOR`] from now: a launch's steps are coming. False
/// where it does nothing: helpers told never to poll (`FERRONICKEL_NET_HELPER_SPIN_US=0`, for
/// hosts short of cores), no pool yet, or no chunk queued within [`ARM_IF_USED_WITHIN`].
pub(super) fn arm() -> bool {
    if helper_spin().is_zero() {
        return false;
    }
    let Some(pool) = POOL.lock().clone() else { return false };
    let now = pool.now_ns();
    if !used_lately(now, pool.last_queued.load(Ordering::Relaxed)) {
        return false;
    }
    pool.armed_until.fetch_max(now + ARM_FOR.as_nanos() as u64, Ordering::AcqRel);
    pool.helpers[0].nudge();
    true
}

/// Whether a chunk queued at `last` (nanoseconds, or [`NEVER`]) is recent enough at `now` for an
/// arm to count.
fn used_lately(now: u64, last: u64) -> bool {
    last != NEVER && now.saturating_sub(last) <= ARM_IF_USED_WITHIN.as_nanos() as u64
}

impl Pool {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Hands a connection's data sockets (its index order) to the helpers.
    pub(super) fn join(&self, shared: &Arc<Shared>, socks: Vec<TcpStream>) {
        let mut served = self.served.write();
        for (index, sock) in socks.into_iter().enumerate() {
            served.push(Served { shared: shared.clone(), index, sock });
        }
    }

    /// A chunk was queued: the lead takes it at once if it polls; sleeping helpers wake to share
    /// the work.
    pub(super) fn queued(&self) {
        self.last_queued.store(self.now_ns(), Ordering::Relaxed);
        for h in &self.helpers {
            h.nudge();
        }
    }

    /// Takes a connection's sockets back: once this returns, no helper touches them or the
    /// memory of their chunks again.
    pub(super) fn leave(&self, shared: &Arc<Shared>) {
        self.served.write().retain(|s| !Arc::ptr_eq(&s.shared, shared));
    }
}

/// Helper `me`: moves queued chunks, for as long as the process runs.
fn serve(pool: &Pool, me: usize) {
    let h = &pool.helpers[me];
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut last_move = Instant::now();
    let mut turn = me;
    loop {
        fds.clear();
        fds.push(libc::pollfd { fd: h.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        turn = turn.wrapping_add(1);
        if pass(pool, turn, &mut fds) {
            last_move = Instant::now();
            continue;
        }
        let armed = me == 0 && pool.now_ns() < pool.armed_until.load(Ordering::Acquire);
        if armed || last_move.elapsed() < helper_spin() {
            std::thread::yield_now();
            continue;
        }
        h.asleep.store(true, Ordering::SeqCst);
        // A chunk queued before `asleep` was seen is found by this second look.
        fds.truncate(1);
        if !pass(pool, turn, &mut fds) {
            poll_fds(&mut fds, HELPER_NAP);
        }
        h.asleep.store(false, Ordering::SeqCst);
        h.drain();
    }
}

/// One pass over the sockets, from `turn` on (helpers start at different ones): moves what it
/// can of the first chunk of each socket no other helper is moving; whether a byte moved.
/// Sockets left waiting to move bytes are added to `fds`.
fn pass(pool: &Pool, turn: usize, fds: &mut Vec<libc::pollfd>) -> bool {
    let mut moved = false;
    let served = pool.served.read();
    let mut alive = None;
    let n = served.len();
    for k in 0..n {
        let s = &served[(turn + k) % n];
        let sh = &s.shared;
        if sh.idle() || sh.failed() {
            continue;
        }
        // A chunk's memory is a pinned FIFO, CUDA's: touched only while the process is not
        // exiting (`crate::exit`), so that nothing lands in memory CUDA has freed at exit.
        if alive.is_none() {
            alive = crate::exit::hold();
            if alive.is_none() {
                return false;
            }
        }
        // Another helper moving this socket's chunk is its only mover.
        let Some(mut q) = sh.queues[s.index].try_lock() else { continue };
        let Some(task) = q.front_mut() else { continue };
        let fd = s.sock.as_raw_fd();
        match step(sh, s.index, fd, task) {
            Ok((n, finished)) => {
                moved |= n > 0;
                if finished {
                    sh.pop_done(&mut q);
                    moved = true;
                } else {
                    let ev = if sh.send { libc::POLLOUT } else { libc::POLLIN };
                    fds.push(libc::pollfd { fd, events: ev, revents: 0 });
                }
            }
            Err(msg) => sh.fail(msg),
        }
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arm keeps the lead polling for `ARM_FOR` from now and never cuts an earlier one short.
    #[test]
    fn an_arm_keeps_the_lead_polling_for_a_while() {
        let pool = pool().unwrap();
        let ns = ARM_FOR.as_nanos() as u64;
        pool.queued();
        let before = pool.now_ns();
        assert!(arm());
        let until = pool.armed_until.load(Ordering::Acquire);
        assert!(until >= before + ns && until <= pool.now_ns() + ns, "armed until {until}, from {before}");
        // An arm an hour ahead (no test thread is descheduled that long) stays.
        let later = until + 3600 * 1_000_000_000;
        pool.armed_until.fetch_max(later, Ordering::AcqRel);
        assert!(arm());
        assert_eq!(pool.armed_until.load(Ordering::Acquire), later);
        // The lead of this test process need not poll for that hour.
        pool.armed_until.store(0, Ordering::Release);
    }

    /// Only a pool whose helpers had chunks lately is armed.
    #[test]
    fn an_arm_counts_only_after_a_chunk_queued_lately() {
        let w = ARM_IF_USED_WITHIN.as_nanos() as u64;
        assert!(!used_lately(5, NEVER));
        assert!(used_lately(5, 5) && used_lately(w + 5, 5));
        assert!(!used_lately(w + 6, 5));
    }
}
