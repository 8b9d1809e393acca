//! A chunk of a large message, the connection state the helpers share with the comm, and the
//! move of a chunk's bytes on its data socket: what a comm (`conn`) and the helpers (`pool`)
//! both use.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::nonblock::{recv_some, send_some};
use super::{tcp_timeout_ms, HDR_BYTES, HELPER_SLICE};
use crate::error::{Error, Result};
use crate::plugin::abi::{
    ncclProfileSocket, ncclProfilerNetSockDescr_v1_t, NCCL_PROFILER_NET_SOCKET_VER, NCCL_PROFILER_NET_TYPE_SOCK,
};
use crate::plugin::profiler::{Event, Parent};

/// A chunk for a helper thread: header first, then the payload, to or from the caller's memory.
pub(super) struct Task {
    pub(super) hdr: [u8; HDR_BYTES],
    pub(super) hdr_done: usize,
    pub(super) ptr: usize,
    pub(super) len: usize,
    pub(super) done: usize,
    pub(super) pending: Arc<AtomicUsize>,
    /// The proxy step the chunk's message moves, until the helper that first moves it starts
    /// the chunk's profiler event under it (`event`), which stops when the chunk is done.
    pub(super) step: Option<Parent>,
    pub(super) event: Option<Event>,
}

/// NCCL's profiler event of the Socket net (its `net_socket_v1`: the socket, the direction and
/// the bytes) for a message or chunk of `length` bytes on `fd`, under `step`; `None` where the
/// profiler wants no such event.
pub(super) fn socket_event(step: &Parent, fd: RawFd, send: bool, length: usize) -> Option<Event> {
    let mut d = ncclProfilerNetSockDescr_v1_t { type_: ncclProfileSocket as u8, ..Default::default() };
    d.__bindgen_anon_1.sock.fd = fd;
    d.__bindgen_anon_1.sock.op = c_int::from(!send);
    d.__bindgen_anon_1.sock.length = length;
    let id = i64::from(NCCL_PROFILER_NET_TYPE_SOCK | NCCL_PROFILER_NET_SOCKET_VER);
    step.start_net_plugin(id, (&mut d as *mut ncclProfilerNetSockDescr_v1_t).cast())
}

/// What the comm and the helpers serving its data sockets share.
pub(super) struct Shared {
    pub(super) peer: SocketAddr,
    pub(super) send: bool,
    /// One queue per data socket, in chunk order.
    pub(super) queues: Vec<Mutex<VecDeque<Task>>>,
    /// Chunks in the queues: a helper's pass skips a connection with none without locking a
    /// queue, so a process with many connections costs a pass little more than one with few.
    queued: AtomicUsize,
    /// The first failure of the connection; every later call reports it.
    error: Mutex<Option<String>>,
    /// `error` is set: read without its lock, by the helpers' every pass and the comm's every
    /// call, so that neither waits for the other.
    failed: AtomicBool,
}

impl Shared {
    pub(super) fn new(peer: SocketAddr, send: bool, nsocks: usize) -> Shared {
        Shared {
            peer,
            send,
            queues: (0..nsocks).map(|_| Mutex::new(VecDeque::new())).collect(),
            queued: AtomicUsize::new(0),
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
        }
    }

    /// Queues a chunk on data socket `sock`.
    pub(super) fn push(&self, sock: usize, task: Task) {
        let mut q = self.queues[sock].lock();
        q.push_back(task);
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    /// Takes the finished first chunk off a queue (its lock held) and counts it done.
    pub(super) fn pop_done(&self, q: &mut VecDeque<Task>) {
        let t = q.pop_front().expect("a finished chunk is first");
        self.queued.fetch_sub(1, Ordering::AcqRel);
        t.pending.fetch_sub(1, Ordering::AcqRel);
    }

    /// No chunk is queued on any of the connection's sockets.
    pub(super) fn idle(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
    }

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
    if let Some(p) = t.step.take() {
        t.event = socket_event(&p, fd, sh.send, t.len);
    }
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
    if t.done == t.len {
        // Stopped before the chunk counts as done: the step it is under stops only after that.
        t.event = None;
    }
    Ok((moved, t.done == t.len))
}
