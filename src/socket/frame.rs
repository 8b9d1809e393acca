//! Framed streams: a non-blocking socket that sends and receives whole [`wire`] frames, with
//! every wait a `poll` under a deadline, so nothing here can block forever; and the one I/O loop
//! behind a send, a receive and a ring step (a write to one stream while reading another).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::progress::Progress;
use super::wire::{self, Msg, WireError, MAX_CONTROL_BODY};
use crate::error::Error;

/// Why a socket operation failed; callers turn it into an [`Error`] naming the rank involved.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("timed out")]
    Timeout,
    #[error("the peer closed the connection")]
    Closed,
    /// The other end refused us (with its explanation) or failed to prove it holds the id.
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Wire(#[from] WireError),
    /// The caller's stop descriptor became readable: a rank was lost, the wait is pointless.
    #[error("called off: a rank was lost")]
    Stopped,
}

impl NetError {
    /// `System` for local and timing failures, `Remote` where the peer misbehaved or went away.
    pub fn context(self, what: &str) -> Error {
        match self {
            NetError::Timeout | NetError::Io(_) => Error::System(format!("{what}: {self}")),
            NetError::Closed | NetError::Refused(_) | NetError::Wire(_) | NetError::Stopped => {
                Error::Remote(format!("{what}: {self}"))
            }
        }
    }
}

/// Waits until one of `fds` is ready or `timeout` passes (`None`: no limit). EINTR is a wake-up.
pub fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<()> {
    // Round up, so a sub-millisecond remainder sleeps instead of spinning.
    let ms = timeout.map_or(-1, |t| t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int);
    // SAFETY: fds is a valid, initialised slice of pollfd for the whole call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    let err = io::Error::last_os_error();
    match rc < 0 && err.kind() != io::ErrorKind::Interrupted {
        true => Err(err),
        false => Ok(()),
    }
}

/// A `pollfd` for `fd` waiting for `events`.
pub fn pollfd(fd: &impl AsRawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 }
}

/// Reads what is available into `buf`: `Ok(true)` if bytes came, `Ok(false)` if none were ready.
/// End of stream is [`NetError::Closed`], or a truncation error if a frame was half-read.
pub(super) fn read_some(stream: &TcpStream, buf: &mut Vec<u8>, max_body: usize) -> std::result::Result<bool, NetError> {
    const CHUNK: usize = 64 << 10;
    let len = buf.len();
    buf.resize(len + CHUNK, 0);
    let r = (&*stream).read(&mut buf[len..]);
    buf.truncate(len + *r.as_ref().unwrap_or(&0));
    match r {
        Ok(0) if len == 0 => Err(NetError::Closed),
        Ok(0) => Err(wire::decode_complete(buf, max_body)
            .err()
            .unwrap_or(WireError::Truncated { have: len, need: len + 1 })
            .into()),
        Ok(_) => Ok(true),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// One end of a bootstrap connection: a non-blocking socket, the bytes read past the last
/// frame, and the bytes of frames not yet fully written (kept across a failed send, so that a
/// frame written afterwards still starts at a frame boundary).
#[derive(Debug)]
pub struct FrameStream {
    stream: TcpStream,
    buf: Vec<u8>,
    outbox: Vec<u8>,
    sent: usize,
    peer: SocketAddr,
    /// Who is at the other end, for progress lines ("rank 3 (ring prev)").
    label: String,
}

impl AsRawFd for FrameStream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }
}

impl FrameStream {
    pub(super) fn new(stream: TcpStream, buf: Vec<u8>, peer: SocketAddr) -> io::Result<FrameStream> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        super::size_buffers((&stream).into())?;
        Ok(FrameStream { stream, buf, outbox: Vec::new(), sent: 0, peer, label: format!("the peer at {peer}") })
    }

    /// Names the other end in the progress lines of long waits on this stream.
    pub fn set_label(&mut self, label: String) {
        self.label = label;
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The next frame if one has fully arrived, without waiting: for a caller that polls
    /// several streams at once (see [`AsRawFd`]).
    pub fn try_recv(&mut self, max_body: usize) -> std::result::Result<Option<Msg>, NetError> {
        loop {
            if let Some((msg, used)) = wire::decode(&self.buf, max_body)? {
                self.buf.drain(..used);
                return Ok(Some(msg));
            }
            if !read_some(&self.stream, &mut self.buf, max_body)? {
                return Ok(None);
            }
        }
    }

    /// Whether a complete frame (or a malformed one) is already buffered: `poll` will not
    /// announce it.
    pub fn has_frame(&self) -> bool {
        !matches!(wire::decode(&self.buf, wire::MAX_DATA_BODY), Ok(None))
    }

    /// Waits up to `timeout` for something to read (a frame or the end); true if there is.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        if self.has_frame() {
            return Ok(true);
        }
        let mut fds = [pollfd(&self.stream, libc::POLLIN)];
        poll(&mut fds, Some(timeout))?;
        Ok(fds[0].revents != 0)
    }

    pub fn send(&mut self, msg: &Msg, deadline: Instant) -> std::result::Result<(), NetError> {
        self.send_bytes(&wire::encode(msg), deadline)
    }

    /// Writes already-encoded frames (after any left over from a failed send).
    pub fn send_bytes(&mut self, bytes: &[u8], deadline: Instant) -> std::result::Result<(), NetError> {
        self.outbox.extend_from_slice(bytes);
        pump(Some(self), None, false, None, deadline).map(drop).map_err(|(_, e)| e)
    }

    /// The next frame, with bodies up to `max_body`.
    pub fn recv(&mut self, max_body: usize, deadline: Instant) -> std::result::Result<Msg, NetError> {
        pump(None, Some((self, max_body)), false, None, deadline).map_err(|(_, e)| e)?.ok_or(NetError::Timeout)
    }

    /// One step of a ring collective: writes `bytes` to `next` while reading one frame from
    /// `prev` (if given), so that a ring of ranks all sending large blocks at once cannot
    /// deadlock on full socket buffers. `next` is watched too: a [`Msg::Lost`] sent back on it
    /// ends the step at once, as does its closing while we still write to it. A `Lost` read
    /// from `prev` also ends the step, even with our write unfinished, and so does `stop`
    /// becoming readable ([`NetError::Stopped`]: news of a lost rank from elsewhere). Errors say
    /// which link failed.
    pub fn ring_step(
        next: &mut FrameStream,
        bytes: &[u8],
        prev: Option<&mut FrameStream>,
        stop: Option<&dyn AsRawFd>,
        deadline: Instant,
    ) -> std::result::Result<Option<Msg>, (Link, NetError)> {
        next.outbox.extend_from_slice(bytes);
        pump(Some(next), prev.map(|p| (p, wire::MAX_DATA_BODY)), true, stop, deadline)
    }
}

/// Which link of a ring step failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Next,
    Prev,
}

/// The one I/O loop behind send, recv and ring_step: flushes `out`'s outbox while reading one
/// frame from `inp`; with `watch_out`, also reads what comes back on `out`; gives up when `stop`
/// is readable (see [`FrameStream::ring_step`]).
fn pump(
    mut out: Option<&mut FrameStream>,
    mut inp: Option<(&mut FrameStream, usize)>,
    mut watch_out: bool,
    stop: Option<&dyn AsRawFd>,
    deadline: Instant,
) -> std::result::Result<Option<Msg>, (Link, NetError)> {
    let next = |e: NetError| (Link::Next, e);
    let prev = |e: NetError| (Link::Prev, e);
    let mut got = None;
    let mut note = None;
    loop {
        if let (Some((s, max)), None) = (inp.as_mut(), got.as_ref()) {
            if let Some((msg, used)) = wire::decode(&s.buf, *max).map_err(|e| prev(e.into()))? {
                s.buf.drain(..used);
                if matches!(msg, Msg::Lost { .. }) {
                    return Ok(Some(msg));
                }
                got = Some(msg);
            }
        }
        if let (true, Some(s)) = (watch_out, out.as_mut()) {
            if let Some((msg, used)) = wire::decode(&s.buf, MAX_CONTROL_BODY).map_err(|e| next(e.into()))? {
                s.buf.drain(..used);
                return match msg {
                    Msg::Lost { .. } => Ok(Some(msg)),
                    other => Err(next(
                        WireError::Malformed(format!("{} sent back on a ring link", other.kind_name())).into(),
                    )),
                };
            }
        }
        let want_write = out.as_ref().is_some_and(|s| s.sent < s.outbox.len());
        let want_read = inp.is_some() && got.is_none();
        if !want_write && !want_read {
            return Ok(got);
        }
        let mut progress = false;
        if let (true, Some(s)) = (want_write, out.as_mut()) {
            match (&s.stream).write(&s.outbox[s.sent..]) {
                Ok(n) => {
                    s.sent += n;
                    progress = true;
                    if s.sent == s.outbox.len() {
                        s.outbox.clear();
                        s.sent = 0;
                    }
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(next(e.into())),
            }
        }
        if let (true, Some((s, max))) = (want_read, inp.as_mut()) {
            progress |= read_some(&s.stream, &mut s.buf, *max).map_err(prev)?;
        }
        if let (true, Some(s)) = (watch_out, out.as_mut()) {
            match read_some(&s.stream, &mut s.buf, MAX_CONTROL_BODY) {
                Ok(more) => progress |= more,
                // The next rank closing after it got everything we sent (maybe just now, in
                // this very pass) is its normal end; a real loss reaches us as a Lost frame
                // around the ring.
                Err(_) if s.sent == s.outbox.len() => watch_out = false,
                Err(e) => return Err(next(e)),
            }
        }
        if progress {
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(if want_read { prev(NetError::Timeout) } else { next(NetError::Timeout) });
        }
        let mut fds = Vec::with_capacity(2);
        if let Some(s) = out.as_ref() {
            let events = if want_write { libc::POLLOUT } else { 0 } | if watch_out { libc::POLLIN } else { 0 };
            if events != 0 {
                fds.push(pollfd(&s.stream, events));
            }
        }
        if let (true, Some((s, _))) = (want_read, inp.as_ref()) {
            fds.push(pollfd(&s.stream, libc::POLLIN));
        }
        let note = note.get_or_insert_with(|| {
            let label = match (&out, &inp) {
                (Some(o), Some((i, _))) if o.peer != i.peer => format!("{} and {}", o.label, i.label),
                (Some(s), _) | (None, Some((s, _))) => s.label.clone(),
                (None, None) => String::new(),
            };
            Progress::new(move || label.clone())
        });
        if let Some(stop) = stop {
            fds.push(pollfd(&stop.as_raw_fd(), libc::POLLIN));
        }
        poll(&mut fds, note.nap(Some(deadline))).map_err(|e| prev(e.into()))?;
        if stop.is_some() && fds.last().is_some_and(|f| f.revents != 0) {
            return Err(if want_read { prev(NetError::Stopped) } else { next(NetError::Stopped) });
        }
        note.tick(Some(deadline));
    }
}
