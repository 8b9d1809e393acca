//! The acceptor: a listener that challenges every connection at once and reads the answers
//! concurrently, so a silent or slow stranger delays nobody.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::auth::{Credentials, Nonce};
use super::frame::{poll, pollfd, read_some, FrameStream, NetError};
use super::handshake::{challenge, check_proof};
use super::progress::Progress;
use super::wire::{self, Msg, MAX_CONTROL_BODY};
use crate::debug::Subsys;
use crate::error::Result;

/// How long an accepted connection may take to authenticate and send its first frame.
pub const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections a listener reads at once. Each costs a descriptor and a small buffer, so the cap
/// is a slice of the descriptor limit (this process also runs the application). When it is
/// reached, a new connection evicts the oldest one that has not yet authenticated instead of
/// waiting behind it: a flood of silent strangers then only delays an honest rank by the
/// retry of its handshake ([`FrameStream::open`]), never by the strangers' timeouts. There is
/// deliberately no per-address cap: honest ranks on one host, or behind one NAT, share an
/// address with each other and with any local stranger.
pub fn max_pending() -> usize {
    static CAP: OnceLock<usize> = OnceLock::new();
    *CAP.get_or_init(|| {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: lim is a valid rlimit for getrlimit to fill.
        let soft = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
            0 => lim.rlim_cur.min(1 << 20) as usize,
            _ => 1024,
        };
        (soft / 8).clamp(32, 1024)
    })
}

/// A connection accepted but not yet identified by an authenticated first frame.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    buf: Vec<u8>,
    accepted: Instant,
    /// The nonce we challenged it with, until its proof checks out.
    challenge: Option<Nonce>,
}

impl Pending {
    fn expires(&self) -> Instant {
        self.accepted + FIRST_FRAME_TIMEOUT
    }
}

/// A connection that proved it holds the unique id and sent its first frame; the caller checks
/// the frame (kind, rank) and keeps or drops the connection.
pub struct Arrival {
    pub conn: FrameStream,
    pub from: SocketAddr,
    pub msg: Msg,
}

/// What woke [`Acceptor::next`].
pub enum Wake {
    Arrival(Box<Arrival>),
    /// The watched streams at these indices are readable: a frame, or their end.
    Watched(Vec<usize>),
}

/// Accepts connections on a listener, challenges each one at once and reads the answers
/// concurrently, so a silent or slow stranger delays nobody. Nothing but the handshake of
/// [`auth`] is read from a connection that has not passed it; garbage, oversized frames and
/// failed proofs are dropped and logged at once, silent connections after
/// [`FIRST_FRAME_TIMEOUT`] or when evicted. The log lines about strangers never become the
/// application's last-error text.
pub struct Acceptor {
    listener: TcpListener,
    cred: Credentials,
    pending: Vec<Pending>,
}

impl Acceptor {
    pub fn new(listener: TcpListener, cred: Credentials) -> Result<Acceptor> {
        listener.set_nonblocking(true)?;
        Ok(Acceptor { listener, cred, pending: Vec::new() })
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// The next authenticated connection with its first frame, or the watched streams that
    /// became readable (established connections whose closing or news the caller must not
    /// miss), or `None` once `deadline` passes (`None` deadline: wait as long as it takes).
    /// `waiting_for` names what the caller expects, for the progress lines of a long wait.
    /// Frames already buffered in a watched [`FrameStream`] are the caller's to check first.
    pub fn next(
        &mut self,
        deadline: Option<Instant>,
        waiting_for: &dyn Fn() -> String,
        watch: &[&dyn AsRawFd],
    ) -> Result<Option<Wake>> {
        let here = self.local_addr()?;
        let mut progress = Progress::new(waiting_for);
        loop {
            let now = Instant::now();
            self.pending.retain(|p| {
                let alive = p.expires() > now;
                if !alive {
                    crate::nccl_warn_unrecorded!(
                        "Bootstrap listener {here}: dropped a connection from {} that did not authenticate and \
                         send a frame within {FIRST_FRAME_TIMEOUT:?}",
                        p.from
                    );
                }
                alive
            });
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let mut fds: Vec<libc::pollfd> = self.pending.iter().map(|p| pollfd(&p.stream, libc::POLLIN)).collect();
            fds.extend(watch.iter().map(|w| libc::pollfd { fd: w.as_raw_fd(), events: libc::POLLIN, revents: 0 }));
            fds.push(pollfd(&self.listener, libc::POLLIN));
            let wake = self.pending.iter().map(Pending::expires).chain(deadline).min();
            poll(&mut fds, progress.nap(wake))?;
            progress.tick(deadline);

            let n = self.pending.len();
            let readable: Vec<usize> = (0..watch.len()).filter(|&i| fds[n + i].revents != 0).collect();
            if !readable.is_empty() {
                return Ok(Some(Wake::Watched(readable)));
            }
            let (mut done, mut dead) = (None, Vec::new());
            for (i, p) in self.pending.iter_mut().enumerate() {
                if fds[i].revents == 0 {
                    continue;
                }
                match first_frame(p, &self.cred) {
                    Ok(None) => {}
                    Ok(Some(msg)) => {
                        done = Some((i, msg));
                        break;
                    }
                    Err(NetError::Closed) => {
                        crate::nccl_info!(
                            Subsys::BOOTSTRAP,
                            "Bootstrap listener {here}: {} connected and closed without a word",
                            p.from
                        );
                        dead.push(i);
                    }
                    Err(e) => {
                        crate::nccl_warn_unrecorded!(
                            "Bootstrap listener {here}: dropped a connection from {}: {e}",
                            p.from
                        );
                        dead.push(i);
                    }
                }
            }
            // Every dead index is below `done`'s, so removing `done` first keeps them valid.
            let arrival = done.map(|(i, msg)| (self.pending.remove(i), msg));
            dead.iter().rev().for_each(|&i| drop(self.pending.remove(i)));
            if let Some((p, msg)) = arrival {
                match FrameStream::new(p.stream, p.buf, p.from) {
                    Ok(conn) => return Ok(Some(Wake::Arrival(Box::new(Arrival { conn, from: p.from, msg })))),
                    Err(e) => crate::nccl_warn_unrecorded!(
                        "Bootstrap listener {here}: lost the connection from {}: {e}",
                        p.from
                    ),
                }
            }
            if fds.last().is_some_and(|f| f.revents != 0) {
                self.accept_ready(here);
            }
        }
    }

    /// Takes the connections the kernel has ready (at most a full table's worth per call, so
    /// the pending ones are still read during a flood) and challenges each at once. Each one's
    /// clock starts at its accept, never at a time read before the `poll` that may have slept
    /// for minutes.
    fn accept_ready(&mut self, here: SocketAddr) {
        for _ in 0..max_pending() {
            let (stream, from) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning on a
                    // listener that stays readable.
                    crate::nccl_warn_unrecorded!("Bootstrap listener {here}: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    return;
                }
            };
            if self.pending.len() >= max_pending() {
                self.evict(here);
            }
            match challenge(&stream) {
                Ok(nonce) => self.pending.push(Pending {
                    stream,
                    from,
                    buf: Vec::new(),
                    accepted: Instant::now(),
                    challenge: Some(nonce),
                }),
                Err(e) => crate::nccl_warn_unrecorded!("Bootstrap listener {here}: cannot challenge {from}: {e}"),
            }
        }
    }

    /// Drops the oldest connection that has not authenticated (or the oldest of all).
    fn evict(&mut self, here: SocketAddr) {
        let unproven =
            self.pending.iter().enumerate().filter(|(_, p)| p.challenge.is_some()).min_by_key(|(_, p)| p.accepted);
        let oldest = self.pending.iter().enumerate().min_by_key(|(_, p)| p.accepted);
        if let Some((i, _)) = unproven.or(oldest) {
            let p = self.pending.remove(i);
            crate::nccl_warn_unrecorded!(
                "Bootstrap listener {here}: {} connections are waiting to authenticate; dropped the oldest, from {}",
                max_pending(),
                p.from
            );
        }
    }
}

/// Reads what is ready on a pending connection: first its proof (answered with ours, or with a
/// refusal), then its first frame, returned once complete; bytes after it stay in `p.buf`.
fn first_frame(p: &mut Pending, cred: &Credentials) -> std::result::Result<Option<Msg>, NetError> {
    loop {
        while let Some((msg, used)) = wire::decode(&p.buf, MAX_CONTROL_BODY)? {
            p.buf.drain(..used);
            match p.challenge.take() {
                None => return Ok(Some(msg)),
                Some(nonce) => check_proof(&p.stream, p.from, cred, nonce, msg)?,
            }
        }
        if !read_some(&p.stream, &mut p.buf, MAX_CONTROL_BODY)? {
            return Ok(None);
        }
    }
}
