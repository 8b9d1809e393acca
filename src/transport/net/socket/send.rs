//! The send comm: headers and inline messages on the control socket, chunks handed to helpers.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::super::{MemHandle, PtrKind, Request, SendComm};
use super::chunk::{explain, socket_event};
use super::conn::{host_only, Conn, Slots};
use super::nonblock::send_iov;
use super::wire::msg_header;
use super::HDR_BYTES;
use crate::error::{Error, Result};
use crate::plugin::profiler::{Event, Parent};

pub(super) struct SendReq {
    pub(super) ptr: usize,
    pub(super) size: usize,
    /// Its bytes go in chunks through the helpers, not inline ([`Conn::inline_max`]).
    pub(super) chunked: bool,
    /// Control bytes (header, then an inline payload) written so far.
    pub(super) written: usize,
    pub(super) hdr: [u8; HDR_BYTES],
    pub(super) pending: Arc<AtomicUsize>,
    /// The proxy step the message moves: its chunks' events go under it.
    pub(super) step: Option<Parent>,
    /// An inline message's profiler event, from its post to its completion: held, and stopped
    /// when the request is dropped.
    pub(super) _event: Option<Event>,
}

pub(super) struct SocketSend {
    pub(super) conn: Conn,
    pub(super) reqs: Slots<SendReq>,
    /// Requests whose control bytes are not all written, in posting order.
    pub(super) order: VecDeque<usize>,
}

/// Messages whose control bytes (header and inline payload) go out in one `sendmsg`.
pub(super) const SEND_BATCH: usize = 8;

impl SocketSend {
    /// Writes the control bytes of the queued messages, several at a time, and hands the chunks
    /// of each fully announced large message to the helper threads, in order.
    pub(super) fn progress(&mut self) -> Result<()> {
        self.conn.shared.check()?;
        let peer = self.conn.shared.peer;
        let fd = self.conn.ctrl.as_raw_fd();
        while !self.order.is_empty() {
            let mut iov = Vec::with_capacity(2 * SEND_BATCH);
            for &i in self.order.iter().take(SEND_BATCH) {
                let r = self.reqs.get(i);
                let inline = r.inline();
                let hdr = &r.hdr[r.written.min(HDR_BYTES)..];
                let off = r.written.saturating_sub(HDR_BYTES);
                iov.push(libc::iovec { iov_base: hdr.as_ptr() as *mut libc::c_void, iov_len: hdr.len() });
                iov.push(libc::iovec { iov_base: (r.ptr + off) as *mut libc::c_void, iov_len: inline - off });
            }
            // SAFETY: each header lives in its request's slot, which stays put until the request
            // leaves `order`; each payload is the isend caller's, valid until completion.
            let mut n = match unsafe { send_iov(fd, &iov) } {
                Ok(Some(n)) => n,
                Ok(None) => return Ok(()),
                Err(e) => {
                    return Err(self
                        .conn
                        .fail(format!("NET/Socket: lost the connection to {peer} (control socket): {}", explain(&e))))
                }
            };
            while let Some(&i) = self.order.front() {
                let r = self.reqs.get(i);
                let take = n.min(HDR_BYTES + r.inline() - r.written);
                r.written += take;
                n -= take;
                if r.written < HDR_BYTES + r.inline() {
                    break;
                }
                let (ptr, size, pending) = (r.ptr, r.size, r.pending.clone());
                if r.chunked {
                    let step = r.step.take();
                    self.conn.post_chunks(ptr, size, &pending, step.as_ref());
                }
                self.order.pop_front();
            }
        }
        Ok(())
    }
}

impl SendReq {
    /// Bytes of the message that follow its header on the control socket.
    pub(super) fn inline(&self) -> usize {
        if self.chunked {
            0
        } else {
            self.size
        }
    }
}

impl SendComm for SocketSend {
    fn reg_mr(&mut self, _data: *mut u8, _size: usize, kind: PtrKind) -> Result<MemHandle> {
        host_only(kind)
    }

    fn dereg_mr(&mut self, _mr: MemHandle) -> Result<()> {
        Ok(())
    }

    unsafe fn isend_in(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        _mr: &MemHandle,
        step: Option<&Parent>,
    ) -> Result<Option<Request>> {
        if data.is_null() && size > 0 {
            return Err(Error::InvalidArgument(format!("isend: NULL buffer of {size} bytes")));
        }
        self.conn.shared.check()?;
        let inline = size < self.conn.inline_max();
        let req = SendReq {
            ptr: data as usize,
            size,
            chunked: !inline,
            written: 0,
            hdr: msg_header(tag, size as u64, !inline),
            pending: Arc::new(AtomicUsize::new(0)),
            step: step.filter(|_| !inline).cloned(),
            _event: None,
        };
        let Some(r) = self.reqs.insert(req) else { return Ok(None) };
        if let Some(p) = step.filter(|_| inline) {
            let fd = self.conn.ctrl.as_raw_fd();
            self.reqs.get(r.0 & 0xff)._event = socket_event(p, fd, true, size);
        }
        // Written by the next `test`, together with whatever else was posted before it.
        self.order.push_back(r.0 & 0xff);
        Ok(Some(r))
    }

    fn test(&mut self, req: &Request) -> Result<Option<usize>> {
        let i = self.reqs.index(req)?;
        if let Err(e) = self.progress() {
            self.reqs.remove(i);
            return Err(e);
        }
        let r = self.reqs.get(i);
        let control_written = !self.order.contains(&i);
        if control_written && r.pending.load(Ordering::Acquire) == 0 {
            return Ok(Some(self.reqs.remove(i).size));
        }
        Ok(None)
    }

    fn warm(&mut self) -> bool {
        let touched = super::warm::touch();
        super::pool::arm() | touched
    }
}
