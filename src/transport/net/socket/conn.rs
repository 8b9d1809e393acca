//! A connection's sockets, the chunks it queues for the helpers (`pool`), and the request slots of
//! both directions.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::super::{MemHandle, PtrKind, Request, MAX_REQUESTS};
use super::chunk::{Shared, Task};
use super::pool::{self, Pool};
use super::tcp_timeout_ms;
use super::wire::{chunk_header, chunks};
use crate::error::{Error, Result};
use crate::plugin::profiler::Parent;

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
        let shared = Arc::new(Shared::new(peer, send, data.len()));
        let pool = pool::pool()?;
        pool.join(&shared, data);
        Ok(Conn { ctrl, shared, pool, next_sock: 0, seq: 0 })
    }

    /// Messages sent below this many bytes go inline: the process's cut ([`super::inline_cut`]).
    pub(super) fn inline_max(&self) -> usize {
        self.pool.inline_max
    }

    pub(super) fn nsocks(&self) -> usize {
        self.shared.queues.len()
    }

    /// Queues the chunks of the next message (`ptr`, `size`), which moves the proxy step `step`,
    /// on the data sockets, in turn.
    pub(super) fn post_chunks(&mut self, ptr: usize, size: usize, pending: &Arc<AtomicUsize>, step: Option<&Parent>) {
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
                step: step.cloned(),
                event: None,
            };
            self.shared.push(sock, task);
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
