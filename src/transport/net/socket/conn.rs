//! A connection's sockets, the chunks queued for the helpers (`pool`), and the request slots of
//! both directions.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::super::{MemHandle, PtrKind, Request, MAX_REQUESTS};
use super::nonblock::{recv_some, send_some};
use super::pool::{self, Pool};
use super::wire::{chunk_header, chunks};
use super::{tcp_timeout_ms, HDR_BYTES, HELPER_SLICE};
use crate::error::{Error, Result};

/// A chunk for a helper thread: header first, then the payload, to or from the caller's memory.
pub(super) struct Task {
    pub(super) hdr: [u8; HDR_BYTES],
    pub(super) hdr_done: usize,
    pub(super) ptr: usize,
    pub(super) len: usize,
    pub(super) done: usize,
    pub(super) pending: Arc<AtomicUsize>,
}

/// What the comm and the helpers serving its data sockets share.
pub(super) struct Shared {
    pub(super) peer: SocketAddr,
    pub(super) send: bool,
    /// One queue per data socket, in chunk order.
    pub(super) queues: Vec<Mutex<VecDeque<Task>>>,
    /// The first failure of the connection; every later call reports it.
    error: Mutex<Option<String>>,
    /// `error` is set: read without its lock, by the helpers' every pass and the comm's every
    /// call, so that neither waits for the other.
    failed: AtomicBool,
}

impl Shared {
    pub(super) fn fail(&self, msg: String) {
        let mut e = self.error.lock();
        if e.is_none() {
            *e = Some(msg);
        }
        self.failed.store(true, Ordering::Release);
    }

    pub(super) fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    pub(super) fn check(&self) -> Result<()> {
        if !self.failed() {
            return Ok(());
        }
        match self.error.lock().as_ref() {
            Some(m) => Err(Error::Remote(m.clone())),
            None => Ok(()),
        }
    }
}

/// The state of a connection common to both directions.
pub(super) struct Conn {
    pub(super) ctrl: TcpStream,
    pub(super) shared: Arc<Shared>,
    /// The process's helpers, which serve the data sockets.
    pool: Arc<Pool>,
    pub(super) next_sock: usize,
    pub(super) seq: u32,
}

impl Conn {
    pub(super) fn new(ctrl: TcpStream, data: Vec<TcpStream>, peer: SocketAddr, send: bool) -> Result<Conn> {
        ctrl.set_nonblocking(true)?;
        for s in std::iter::once(&ctrl).chain(&data) {
            bound_silence(s)?;
            s.set_nonblocking(true)?;
        }
        let shared = Arc::new(Shared {
            peer,
            send,
            queues: (0..data.len()).map(|_| Mutex::new(VecDeque::new())).collect(),
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
        });
        let pool = pool::pool()?;
        pool.join(&shared, data);
        Ok(Conn { ctrl, shared, pool, next_sock: 0, seq: 0 })
    }

    pub(super) fn nsocks(&self) -> usize {
        self.shared.queues.len()
    }

    /// Queues the chunks of the next message (`ptr`, `size`) on the data sockets, in turn.
    pub(super) fn post_chunks(&mut self, ptr: usize, size: usize, pending: &Arc<AtomicUsize>) {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let parts = chunks(size, self.nsocks());
        pending.fetch_add(parts.len(), Ordering::AcqRel);
        for (off, len) in parts {
            let sock = self.next_sock;
            self.next_sock = (self.next_sock + 1) % self.nsocks();
            let task = Task {
                hdr: chunk_header(seq, len as u32, off as u64),
                hdr_done: 0,
                ptr: ptr + off,
                len,
                done: 0,
                pending: pending.clone(),
            };
            self.shared.queues[sock].lock().push_back(task);
        }
        self.pool.queued();
    }

    pub(super) fn fail(&self, msg: String) -> Error {
        self.shared.fail(msg);
        self.shared.check().expect_err("just failed")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.pool.leave(&self.shared);
    }
}

/// Bounds how long the peer's host may stay silent at the TCP level ([`tcp_timeout_ms`]):
/// TCP_USER_TIMEOUT for data in flight, keepalive probes for an idle socket (a receiver waiting
/// for a dead host has nothing in flight). Zero-window probes the peer answers do not count as
/// silence (Linux 5.11 and later), so a peer that is slow to read is not cut.
fn bound_silence(s: &TcpStream) -> io::Result<()> {
    let ms = tcp_timeout_ms();
    if ms <= 0 {
        return Ok(());
    }
    let sock = socket2::SockRef::from(s);
    let probe = Duration::from_millis(ms as u64 / 3).max(Duration::from_secs(1));
    sock.set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(probe).with_interval(probe).with_retries(3))?;
    sock.set_tcp_user_timeout(Some(Duration::from_millis(ms as u64)))
}

/// An I/O error on a connection with a peer, with what it means for the job.
pub(super) fn explain(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ETIMEDOUT) => format!(
            "{e}: its host acknowledged nothing for {} ms (FERRONICKEL_NET_TCP_TIMEOUT_MS): the network to it is down, \
             or the host is gone",
            tcp_timeout_ms()
        ),
        Some(libc::ECONNRESET) => format!(
            "{e}: its host reset the connection (its process died with data unread, its sockets were destroyed, or \
             the connection was reset on the way)"
        ),
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH) => format!("{e}: no route to it: the network to it is down"),
        _ => e.to_string(),
    }
}

/// Moves up to HELPER_SLICE bytes of one chunk; `(bytes moved, chunk finished)`, or the error
/// that ends the connection, naming the peer and the socket.
pub(super) fn step(sh: &Shared, sock: usize, fd: RawFd, t: &mut Task) -> std::result::Result<(usize, bool), String> {
    let peer = sh.peer;
    let mut moved = 0;
    let io_err = |e: io::Error, t: &Task| {
        format!(
            "NET/Socket: connection with {peer} failed on data socket {sock} after {} of {} bytes of a chunk: {}",
            t.done,
            t.len,
            explain(&e)
        )
    };
    let eof = |t: &Task| {
        format!(
            "NET/Socket: {peer} closed data socket {sock} mid-message ({} of {} bytes of a chunk received)",
            t.done, t.len
        )
    };
    while t.hdr_done < HDR_BYTES {
        let r = if sh.send {
            send_some(fd, &t.hdr[t.hdr_done..])
        } else {
            let mut got = [0u8; HDR_BYTES];
            let want = HDR_BYTES - t.hdr_done;
            recv_some(fd, &mut got[..want]).map(|n| {
                if let Some(n) = n.filter(|&n| n > 0) {
                    let at = t.hdr_done;
                    if got[..n] != t.hdr[at..at + n] {
                        return Some(usize::MAX);
                    }
                }
                n
            })
        };
        match r.map_err(|e| io_err(e, t))? {
            None => return Ok((moved, false)),
            Some(0) if !sh.send => return Err(eof(t)),
            Some(usize::MAX) => {
                return Err(format!(
                    "NET/Socket: garbage on data socket {sock} from {peer}: the chunk header is not the one expected \
                     (sequence {}, {} bytes at offset {})",
                    u32::from_le_bytes(t.hdr[..4].try_into().expect("4")),
                    t.len,
                    u64::from_le_bytes(t.hdr[8..].try_into().expect("8"))
                ))
            }
            Some(n) => {
                t.hdr_done += n;
                moved += n;
            }
        }
    }
    while t.done < t.len && moved < HELPER_SLICE {
        let want = (t.len - t.done).min(HELPER_SLICE);
        let p = (t.ptr + t.done) as *mut u8;
        let r = if sh.send {
            // SAFETY: the caller of isend keeps ptr..ptr+len valid until the request completes
            // or the comm closes, and the comm joins this thread before it closes.
            send_some(fd, unsafe { std::slice::from_raw_parts(p, want) })
        } else {
            // SAFETY: as above, for the buffer posted with irecv; only this task writes there.
            recv_some(fd, unsafe { std::slice::from_raw_parts_mut(p, want) })
        };
        match r.map_err(|e| io_err(e, t))? {
            None => return Ok((moved, false)),
            Some(0) if !sh.send => return Err(eof(t)),
            Some(n) => {
                t.done += n;
                moved += n;
            }
        }
    }
    Ok((moved, t.done == t.len))
}

/// Up to MAX_REQUESTS requests; a request's id carries its slot and a generation, so a stale or
/// forged request is refused rather than mistaken for another.
pub(super) struct Slots<T> {
    pub(super) slots: Vec<Option<(u32, T)>>,
    pub(super) gen: u32,
}

impl<T> Slots<T> {
    pub(super) fn new() -> Self {
        Slots { slots: (0..MAX_REQUESTS).map(|_| None).collect(), gen: 0 }
    }

    pub(super) fn insert(&mut self, v: T) -> Option<Request> {
        let i = self.slots.iter().position(Option::is_none)?;
        self.gen = self.gen.wrapping_add(1);
        self.slots[i] = Some((self.gen, v));
        Some(Request(((self.gen as usize) << 8) | i))
    }

    pub(super) fn index(&self, r: &Request) -> Result<usize> {
        let i = r.0 & 0xff;
        match self.slots.get(i) {
            Some(Some((g, _))) if *g as usize == r.0 >> 8 => Ok(i),
            _ => Err(Error::InvalidArgument(format!("test: request {:#x} is not in flight on this comm", r.0))),
        }
    }

    pub(super) fn get(&mut self, i: usize) -> &mut T {
        &mut self.slots[i].as_mut().expect("slot in use").1
    }

    pub(super) fn remove(&mut self, i: usize) -> T {
        self.slots[i].take().expect("slot in use").1
    }
}

pub(super) fn host_only(kind: PtrKind) -> Result<MemHandle> {
    match kind {
        PtrKind::Host => Ok(MemHandle(PtrKind::Host as usize)),
        PtrKind::Cuda => Err(Error::InvalidArgument(
            "regMr: the Socket net moves host memory only (ptrSupport NCCL_PTR_HOST); CUDA buffers go through a host FIFO".into(),
        )),
    }
}
