//! The receive comm: headers read from the control socket, inline bytes copied, chunks landed
//! by the helpers into the posted buffers.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::{check_recv, MemHandle, PtrKind, RecvBuf, RecvComm, Request, MAX_RECVS};
use super::chunk::{explain, socket_event};
use super::conn::{host_only, Conn, Slots};
use super::nonblock::{delay_acks, peek_some, recv_iov, recv_some};
use super::wire::parse_msg_header;
use super::HDR_BYTES;
use crate::error::Result;
use crate::plugin::profiler::{Event, Parent};

/// A posted buffer: address, capacity, tag.
pub(super) struct Posted {
    pub(super) ptr: usize,
    pub(super) size: usize,
    pub(super) tag: i32,
}

pub(super) struct RecvReq {
    pub(super) bufs: Vec<Posted>,
    /// Bytes each buffer received (`None` until a message is matched to it).
    pub(super) got: Vec<Option<usize>>,
    pub(super) pending: Arc<AtomicUsize>,
    /// The proxy step the receive is for: its messages' events go under it.
    pub(super) step: Option<Parent>,
    /// The profiler events of its inline messages, from their headers to its completion.
    pub(super) events: Vec<Event>,
}

/// An inline payload being read from the control socket.
pub(super) struct Inline {
    pub(super) req: usize,
    pub(super) ptr: usize,
    pub(super) size: usize,
    pub(super) done: usize,
}

/// Bytes the control socket is read ahead by: a few small messages (a header and its inline
/// payload each) come in with one look ([`ReadAhead`]) instead of two `recv`s per message.
pub(super) const READ_AHEAD: usize = 4096;

/// How often a control socket that receives is put back in delayed-ACK mode at most: Linux
/// leaves the mode only when its delayed-ACK timer fires (tens of ms without an ACK), so once a
/// millisecond costs a `setsockopt` per thousand steps instead of one per step.
const REARM_DELAYED_ACKS: Duration = Duration::from_millis(1);

/// Peeked bytes stay in the socket at most this long, or over this many looks that found new
/// bytes, or up to this many bytes ([`ReadAhead`]): long enough that taking them off (a `recv`
/// that may send and, on `lo`, process an ACK: 1-4 us of the proxy thread) comes after the proxy
/// has handed on the step that a kernel forwards from them, and short enough that the sender
/// gets an ACK for every few small segments.
const SETTLE_AFTER: Duration = Duration::from_micros(8);
const SETTLE_ARRIVALS: u32 = 2;
const SETTLE_BYTES: usize = READ_AHEAD / 2;

/// The control socket's read-ahead: bytes read but not yet consumed.
///
/// It looks at the socket with `MSG_PEEK`, hands out what is new at once, and takes the peeked
/// bytes off the socket later ([`SETTLE_AFTER`]): a `recv` that empties the socket may send an
/// ACK (and on `lo` process it for the sender's socket too, 3-4 us), which would otherwise stand
/// between a step's bytes and the slot the GPU polls, and then between the GPU's forwarded step
/// and the proxy noticing it (docs/NET.md, "ACKs off the step's path").
pub(super) struct ReadAhead {
    buf: Box<[u8; READ_AHEAD]>,
    lo: usize,
    hi: usize,
    /// Bytes at the front of the socket's queue that `buf` holds or has handed out: a look
    /// peeks them again and skips them, until they are received for good.
    peeked: usize,
    /// When the oldest of those was first peeked, and how many looks found new bytes since.
    peeked_at: Option<Instant>,
    arrivals: u32,
    /// When the socket was last put in delayed-ACK mode ([`delay_acks`]).
    acks_delayed: Option<Instant>,
}

impl ReadAhead {
    pub(super) fn new() -> ReadAhead {
        ReadAhead {
            buf: Box::new([0; READ_AHEAD]),
            lo: 0,
            hi: 0,
            peeked: 0,
            peeked_at: None,
            arrivals: 0,
            acks_delayed: None,
        }
    }

    /// As [`recv_some`] (`Ok(Some(0))` only at the end of the stream), served from the bytes read
    /// ahead first; a large read into an empty read-ahead goes straight to `dst`. A look that got
    /// bytes keeps the socket in delayed-ACK mode.
    pub(super) fn read(&mut self, fd: RawFd, dst: &mut [u8]) -> io::Result<Option<usize>> {
        if self.lo == self.hi {
            if dst.len() >= READ_AHEAD {
                return self.read_large(fd, dst);
            }
            if self.peeked > 0 && self.settle_due() && !self.settle(fd)? {
                return Ok(None);
            }
            match peek_some(fd, &mut self.buf[..])? {
                Some(0) => return Ok(Some(0)),
                Some(n) if n > self.peeked => {
                    self.keep_acks_delayed(fd);
                    if self.peeked == 0 {
                        self.peeked_at = Some(Instant::now());
                    }
                    self.arrivals += 1;
                    (self.lo, self.hi, self.peeked) = (self.peeked, n, n)
                }
                _ => return Ok(None),
            }
        }
        let n = dst.len().min(self.hi - self.lo);
        dst[..n].copy_from_slice(&self.buf[self.lo..self.lo + n]);
        self.lo += n;
        Ok(Some(n))
    }

    /// The peeked bytes are taken off at the next look, however recent.
    pub(super) fn settle_soon(&mut self) {
        self.arrivals = self.arrivals.max(SETTLE_ARRIVALS);
    }

    /// Whether the peeked bytes should be taken off the socket before the next look.
    fn settle_due(&self) -> bool {
        self.peeked >= SETTLE_BYTES
            || self.arrivals >= SETTLE_ARRIVALS
            || self.peeked_at.is_some_and(|t| t.elapsed() >= SETTLE_AFTER)
    }

    /// A large read (the rest of an inline payload) straight into `dst`, with the bytes last
    /// peeked taken off the socket in the same call.
    fn read_large(&mut self, fd: RawFd, dst: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            let mut iov = [
                libc::iovec { iov_base: self.buf.as_mut_ptr().cast(), iov_len: self.peeked },
                libc::iovec { iov_base: dst.as_mut_ptr().cast(), iov_len: dst.len() },
            ];
            // SAFETY: both iovecs describe memory we hold &mut to for the call.
            let got = match unsafe { recv_iov(fd, &mut iov)? } {
                Some(0) if self.peeked == 0 => return Ok(Some(0)),
                Some(n) if n > 0 => n,
                _ => return Ok(None),
            };
            let taken = got.min(self.peeked);
            self.took(taken);
            if got > taken {
                self.keep_acks_delayed(fd);
                return Ok(Some(got - taken));
            }
        }
    }

    /// Takes the bytes last peeked off the socket (into the spent buffer); whether all are.
    fn settle(&mut self, fd: RawFd) -> io::Result<bool> {
        while self.peeked > 0 {
            match recv_some(fd, &mut self.buf[..self.peeked])? {
                Some(n) if n > 0 => self.took(n),
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// `n` of the peeked bytes were received for good.
    fn took(&mut self, n: usize) {
        self.peeked -= n;
        if self.peeked == 0 {
            (self.peeked_at, self.arrivals) = (None, 0);
        }
    }

    /// Delayed-ACK mode again, unless it was set less than [`REARM_DELAYED_ACKS`] ago.
    fn keep_acks_delayed(&mut self, fd: RawFd) {
        let now = Instant::now();
        if self.acks_delayed.is_none_or(|t| now - t >= REARM_DELAYED_ACKS) {
            delay_acks(fd);
            self.acks_delayed = Some(now);
        }
    }
}

pub(super) struct SocketRecv {
    pub(super) conn: Conn,
    pub(super) reqs: Slots<RecvReq>,
    /// Requests still expecting messages, in posting order.
    pub(super) order: VecDeque<usize>,
    pub(super) hdr: [u8; HDR_BYTES],
    pub(super) hdr_got: usize,
    pub(super) inline: Option<Inline>,
    pub(super) ahead: ReadAhead,
}

impl SocketRecv {
    /// Reads the control socket and matches its messages to the posted receives, in order,
    /// until request `until` has all its messages (or no byte is left to read): the bytes of a
    /// later step then stay in the socket or the read-ahead, and a test of a completed receive
    /// costs no `recv` call, so the proxy publishes a landed step before it looks for the next.
    pub(super) fn progress(&mut self, until: usize) -> Result<()> {
        self.conn.shared.check()?;
        let peer = self.conn.shared.peer;
        let fd = self.conn.ctrl.as_raw_fd();
        loop {
            if let Some(inl) = &mut self.inline {
                while inl.done < inl.size {
                    // SAFETY: the irecv caller keeps the matched buffer valid, and its size was
                    // checked against the message size before this read was set up.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut((inl.ptr + inl.done) as *mut u8, inl.size - inl.done) };
                    match self.ahead.read(fd, dst) {
                        Ok(Some(0)) => {
                            let m = format!(
                                "NET/Socket: {peer} closed the connection mid-message ({} of {} bytes received)",
                                inl.done, inl.size
                            );
                            return Err(self.conn.fail(m));
                        }
                        Ok(Some(n)) => inl.done += n,
                        Ok(None) => return Ok(()),
                        Err(e) => {
                            return Err(self
                                .conn
                                .fail(format!("NET/Socket: lost the connection to {peer}: {}", explain(&e))))
                        }
                    }
                }
                let req = inl.req;
                self.inline = None;
                self.finish_message(req);
                continue;
            }
            let Some(&i) = self.order.front() else { return Ok(()) };
            if self.matched(until) {
                return Ok(());
            }
            while self.hdr_got < HDR_BYTES {
                match self.ahead.read(fd, &mut self.hdr[self.hdr_got..]) {
                    Ok(Some(0)) => {
                        let left = self.reqs.get(i).got.iter().filter(|g| g.is_none()).count();
                        let m = format!("NET/Socket: {peer} closed the connection while {left} posted receive(s) still expected data");
                        return Err(self.conn.fail(m));
                    }
                    Ok(Some(n)) => self.hdr_got += n,
                    Ok(None) => return Ok(()),
                    Err(e) => {
                        return Err(self
                            .conn
                            .fail(format!("NET/Socket: lost the connection to {peer}: {}", explain(&e))))
                    }
                }
            }
            self.hdr_got = 0;
            let (tag, size, chunked) = match parse_msg_header(&self.hdr) {
                Ok(h) => h,
                Err(e) => return Err(self.conn.fail(format!("NET/Socket: {peer} sent {e}"))),
            };
            let r = self.reqs.get(i);
            let Some(b) = (0..r.bufs.len()).find(|&b| r.bufs[b].tag == tag && r.got[b].is_none()) else {
                let posted: Vec<i32> =
                    (0..r.bufs.len()).filter(|&b| r.got[b].is_none()).map(|b| r.bufs[b].tag).collect();
                let m = format!(
                    "NET/Socket: {peer} sent a message with tag {tag}, but the receive posted expects tags {posted:?}"
                );
                return Err(self.conn.fail(m));
            };
            let cap = r.bufs[b].size;
            if size > cap as u64 {
                let m = format!("NET/Socket: {peer} sent {size} bytes (tag {tag}) to a receive buffer of {cap} bytes");
                return Err(self.conn.fail(m));
            }
            let size = size as usize;
            r.got[b] = Some(size);
            let ptr = r.bufs[b].ptr;
            if !chunked {
                if let Some(e) = r.step.as_ref().and_then(|p| socket_event(p, fd, false, size)) {
                    r.events.push(e);
                }
                self.inline = Some(Inline { req: i, ptr, size, done: 0 });
            } else {
                let (pending, step) = (r.pending.clone(), r.step.clone());
                self.conn.post_chunks(ptr, size, &pending, step.as_ref());
                // A large message: its header is no step the GPU waits on (its chunks are), so
                // the control socket's ACKs keep pace with its stream of headers.
                self.ahead.settle_soon();
                self.finish_message(i);
            }
        }
    }

    /// Whether every buffer of request `until` has its message and none is still being read.
    fn matched(&mut self, until: usize) -> bool {
        self.inline.as_ref().is_none_or(|x| x.req != until) && self.reqs.get(until).got.iter().all(Option::is_some)
    }

    /// After a message of request `i` is matched: retire the request from `order` once all of
    /// its buffers have one.
    pub(super) fn finish_message(&mut self, i: usize) {
        if self.reqs.get(i).got.iter().all(Option::is_some) && self.order.front() == Some(&i) {
            self.order.pop_front();
        }
    }
}

impl RecvComm for SocketRecv {
    fn reg_mr(&mut self, _data: *mut u8, _size: usize, kind: PtrKind) -> Result<MemHandle> {
        host_only(kind)
    }

    fn dereg_mr(&mut self, _mr: MemHandle) -> Result<()> {
        Ok(())
    }

    unsafe fn irecv_in(
        &mut self,
        bufs: &[RecvBuf],
        mrs: &[&MemHandle],
        step: Option<&Parent>,
    ) -> Result<Option<Request>> {
        check_recv(bufs, mrs, MAX_RECVS)?;
        self.conn.shared.check()?;
        let posted = bufs.iter().map(|b| Posted { ptr: b.data as usize, size: b.size, tag: b.tag }).collect();
        let req = RecvReq {
            bufs: posted,
            got: vec![None; bufs.len()],
            pending: Arc::new(AtomicUsize::new(0)),
            step: step.cloned(),
            events: Vec::new(),
        };
        let Some(r) = self.reqs.insert(req) else { return Ok(None) };
        // Its bytes are read by `test`.
        self.order.push_back(r.0 & 0xff);
        Ok(Some(r))
    }

    fn iflush(&mut self, bufs: &[RecvBuf], mrs: &[&MemHandle]) -> Result<Option<Request>> {
        check_recv(bufs, mrs, MAX_RECVS)?;
        // Host memory: what the helpers wrote is visible once the request completed.
        Ok(None)
    }

    fn test(&mut self, req: &Request) -> Result<Option<Vec<usize>>> {
        let i = self.reqs.index(req)?;
        if let Err(e) = self.progress(i) {
            self.reqs.remove(i);
            return Err(e);
        }
        if self.matched(i) && self.reqs.get(i).pending.load(Ordering::Acquire) == 0 {
            let r = self.reqs.remove(i);
            return Ok(Some(r.got.into_iter().map(|g| g.expect("all matched")).collect()));
        }
        Ok(None)
    }
}
