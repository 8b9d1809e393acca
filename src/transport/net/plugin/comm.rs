//! A plugin's comms: the listen comm, a connection being made, and the send and receive comms,
//! each calling the table of its plugin's version.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Arc;

use super::super::abi::*;
use super::super::{
    check_recv, Connecting, Handle, Listener, MemHandle, PtrKind, RecvBuf, RecvComm, Request, SendComm, MAX_RECVS,
};
use super::{call, check, Inner, Table};
use crate::error::{Error, Result};
use crate::plugin::profiler::Parent;

pub(super) struct PluginListen {
    pub(super) inner: Arc<Inner>,
    pub(super) comm: *mut c_void,
    pub(super) max_recvs: usize,
}
// SAFETY: a plugin comm is used by one thread at a time, as NCCL's proxy uses it.
unsafe impl Send for PluginListen {}

impl Listener for PluginListen {
    fn accept(&mut self) -> Result<Option<Box<dyn RecvComm>>> {
        let mut rc = null_mut();
        // "Not requesting device offload": a valid pointer to NULL, as some plugins write it.
        let mut dev: *mut ncclNetDeviceHandle_v8_t = null_mut();
        call!(&self.inner.lib, accept(self.comm, &mut rc, &mut dev))?;
        Ok((!rc.is_null()).then(|| {
            let max_recvs = self.max_recvs;
            Box::new(PluginComm {
                inner: self.inner.clone(),
                comm: rc,
                send: false,
                max_recvs,
                nbufs: HashMap::new(),
                steps: HashMap::new(),
            }) as Box<dyn RecvComm>
        }))
    }
}

impl Drop for PluginListen {
    fn drop(&mut self) {
        if let Err(e) = call!(&self.inner.lib, closeListen(self.comm)) {
            crate::nccl_warn!("{e}");
        }
    }
}

pub(super) struct PluginConnecting {
    pub(super) inner: Arc<Inner>,
    pub(super) dev: c_int,
    /// The plugin may keep its connection state inside the handle between calls, as NCCL's
    /// socket net does, so the same buffer is passed every time.
    pub(super) handle: Box<Handle>,
}
// SAFETY: see PluginListen.
unsafe impl Send for PluginConnecting {}

impl Connecting for PluginConnecting {
    fn poll(&mut self) -> Result<Option<Box<dyn SendComm>>> {
        let mut sc: *mut c_void = null_mut();
        let mut dev: *mut ncclNetDeviceHandle_v8_t = null_mut();
        let (h, s, d) = (self.handle.as_mut_ptr().cast(), &mut sc as *mut *mut c_void, &mut dev as *mut _);
        let inner = &*self.inner;
        let lib = &inner.lib;
        // SAFETY: handle is the 128-byte buffer listen filled; sc and dev are valid out-pointers;
        // the v10 config lives in `inner` for as long as the plugin may read it.
        let rc = unsafe {
            match lib.table {
                Table::V11(t) => (*t).connect.unwrap()(inner.ctx, self.dev, h, s, d),
                Table::V10(t) => (*t).connect.unwrap()(self.dev, &*inner.config as *const _ as *mut _, h, s, d),
                Table::V9(t) => (*t).connect.unwrap()(self.dev, h, s, d),
                Table::V8(t) => (*t).connect.unwrap()(self.dev, h, s, d),
            }
        };
        check(lib, "connect", rc)?;
        Ok((!sc.is_null()).then(|| {
            Box::new(PluginComm {
                inner: self.inner.clone(),
                comm: sc,
                send: true,
                max_recvs: 1,
                nbufs: HashMap::new(),
                steps: HashMap::new(),
            }) as Box<dyn SendComm>
        }))
    }
}

/// A send or receive comm of a plugin.
struct PluginComm {
    inner: Arc<Inner>,
    comm: *mut c_void,
    send: bool,
    /// The device's `maxRecvs` (receive comms), checked before the plugin sees an `irecv`.
    max_recvs: usize,
    /// Buffers of each receive request in flight, to size `test`'s output.
    nbufs: HashMap<usize, usize>,
    /// The proxy step each request in flight moves, passed to the plugin as its pHandle for
    /// its profiler events (`net_events`): kept here, at a fixed address, until it completes.
    steps: HashMap<usize, Box<Parent>>,
}
// SAFETY: see PluginListen.
unsafe impl Send for PluginComm {}

impl PluginComm {
    fn reg_mr(&mut self, data: *mut u8, size: usize, kind: PtrKind) -> Result<MemHandle> {
        let mut mh = null_mut();
        call!(&self.inner.lib, regMr(self.comm, data.cast(), size, kind.bit(), &mut mh))?;
        Ok(MemHandle(mh as usize))
    }

    fn dereg_mr(&mut self, mr: MemHandle) -> Result<()> {
        call!(&self.inner.lib, deregMr(self.comm, mr.0 as *mut c_void))
    }

    /// Tests a request; `Some(sizes)` once done. The request is forgotten on done or error.
    fn test_req(&mut self, req: &Request, n: usize) -> Result<Option<Vec<usize>>> {
        let mut done: c_int = 0;
        let mut sizes = [0 as c_int; MAX_RECVS];
        let r = call!(&self.inner.lib, test(req.0 as *mut c_void, &mut done, sizes.as_mut_ptr()));
        if r.is_err() || done != 0 {
            self.nbufs.remove(&req.0);
            // Empty unless a profiler wants the net's events: no lookup per completion then.
            if !self.steps.is_empty() {
                self.steps.remove(&req.0);
            }
        }
        r?;
        Ok((done != 0).then(|| sizes[..n].iter().map(|&s| s.max(0) as usize).collect()))
    }

    /// The pHandle of a request moving `step`: its boxed parent, or NULL.
    fn step_handle(step: Option<&Parent>) -> (Option<Box<Parent>>, *mut c_void) {
        let boxed = step.map(|p| Box::new(p.clone()));
        let ph = boxed.as_deref().map_or(null_mut(), |p| p as *const Parent as *mut c_void);
        (boxed, ph)
    }

    /// Keeps a posted request's step until the request completes.
    fn posted(&mut self, req: *mut c_void, step: Option<Box<Parent>>) -> Option<Request> {
        if req.is_null() {
            return None;
        }
        if let Some(p) = step {
            self.steps.insert(req as usize, p);
        }
        Some(Request(req as usize))
    }
}

impl Drop for PluginComm {
    fn drop(&mut self) {
        let r = if self.send {
            call!(&self.inner.lib, closeSend(self.comm))
        } else {
            call!(&self.inner.lib, closeRecv(self.comm))
        };
        if let Err(e) = r {
            crate::nccl_warn!("{e}");
        }
    }
}

impl SendComm for PluginComm {
    fn reg_mr(&mut self, data: *mut u8, size: usize, kind: PtrKind) -> Result<MemHandle> {
        PluginComm::reg_mr(self, data, size, kind)
    }

    fn dereg_mr(&mut self, mr: MemHandle) -> Result<()> {
        PluginComm::dereg_mr(self, mr)
    }

    unsafe fn isend_in(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        mr: &MemHandle,
        step: Option<&Parent>,
    ) -> Result<Option<Request>> {
        if data.is_null() && size > 0 {
            return Err(Error::InvalidArgument(format!("isend: NULL buffer of {size} bytes")));
        }
        let lib = &self.inner.lib;
        let mut req: *mut c_void = null_mut();
        let (c, d, m, r) = (self.comm, data as *mut c_void, mr.0 as *mut c_void, &mut req as *mut *mut c_void);
        let (step, ph) = Self::step_handle(step);
        // SAFETY: the caller keeps the buffer valid (trait contract); the arguments follow each
        // version's isend; v8 takes an int size, so larger sends are refused first; `ph` lives
        // in `steps` while the request is in flight.
        let rc = unsafe {
            match lib.table {
                Table::V11(t) => (*t).isend.unwrap()(c, d, size, tag, m, ph, r),
                Table::V10(t) => (*t).isend.unwrap()(c, d, size, tag, m, ph, r),
                Table::V9(t) => (*t).isend.unwrap()(c, d, size, tag, m, r),
                Table::V8(t) => {
                    if size > MAX_NET_SIZE {
                        return Err(Error::InvalidArgument(format!(
                            "isend of {size} bytes: a v8 plugin ({}) takes at most {MAX_NET_SIZE}",
                            lib.name()
                        )));
                    }
                    (*t).isend.unwrap()(c, d, size as c_int, tag, m, r)
                }
            }
        };
        check(lib, "isend", rc)?;
        Ok(self.posted(req, step))
    }

    fn test(&mut self, req: &Request) -> Result<Option<usize>> {
        Ok(self.test_req(req, 1)?.map(|s| s[0]))
    }
}

impl RecvComm for PluginComm {
    fn reg_mr(&mut self, data: *mut u8, size: usize, kind: PtrKind) -> Result<MemHandle> {
        PluginComm::reg_mr(self, data, size, kind)
    }

    fn dereg_mr(&mut self, mr: MemHandle) -> Result<()> {
        PluginComm::dereg_mr(self, mr)
    }

    unsafe fn irecv_in(
        &mut self,
        bufs: &[RecvBuf],
        mrs: &[&MemHandle],
        step: Option<&Parent>,
    ) -> Result<Option<Request>> {
        check_recv(bufs, mrs, self.max_recvs)?;
        let lib = &self.inner.lib;
        let n = bufs.len();
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| b.data.cast()).collect();
        let mut sizes: Vec<usize> = bufs.iter().map(|b| b.size).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.tag).collect();
        let mut mh: Vec<*mut c_void> = mrs.iter().map(|m| m.0 as *mut c_void).collect();
        let (step, one) = Self::step_handle(step);
        let mut ph: Vec<*mut c_void> = vec![one; n];
        let mut req: *mut c_void = null_mut();
        let (c, ni, d, t, m, r) =
            (self.comm, n as c_int, data.as_mut_ptr(), tags.as_mut_ptr(), mh.as_mut_ptr(), &mut req as *mut _);
        // SAFETY: all arrays hold n entries and live through the call; buffers stay valid per
        // the trait contract; v8 takes int sizes, so larger receives are refused first; the
        // pHandles' parent lives in `steps` while the request is in flight.
        let rc = unsafe {
            match lib.table {
                Table::V11(tb) => (*tb).irecv.unwrap()(c, ni, d, sizes.as_mut_ptr(), t, m, ph.as_mut_ptr(), r),
                Table::V10(tb) => (*tb).irecv.unwrap()(c, ni, d, sizes.as_mut_ptr(), t, m, ph.as_mut_ptr(), r),
                Table::V9(tb) => (*tb).irecv.unwrap()(c, ni, d, sizes.as_mut_ptr(), t, m, r),
                Table::V8(tb) => {
                    if let Some(b) = bufs.iter().find(|b| b.size > MAX_NET_SIZE) {
                        return Err(Error::InvalidArgument(format!(
                            "irecv of {} bytes: a v8 plugin ({}) takes at most {MAX_NET_SIZE}",
                            b.size,
                            lib.name()
                        )));
                    }
                    let mut s8: Vec<c_int> = sizes.iter().map(|&s| s as c_int).collect();
                    (*tb).irecv.unwrap()(c, ni, d, s8.as_mut_ptr(), t, m, r)
                }
            }
        };
        check(lib, "irecv", rc)?;
        let posted = self.posted(req, step);
        if posted.is_some() {
            self.nbufs.insert(req as usize, n);
        }
        Ok(posted)
    }

    fn iflush(&mut self, bufs: &[RecvBuf], mrs: &[&MemHandle]) -> Result<Option<Request>> {
        check_recv(bufs, mrs, self.max_recvs)?;
        let lib = &self.inner.lib;
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| b.data.cast()).collect();
        let mut sizes: Vec<c_int> = bufs.iter().map(|b| b.size.min(c_int::MAX as usize) as c_int).collect();
        let mut mh: Vec<*mut c_void> = mrs.iter().map(|m| m.0 as *mut c_void).collect();
        let mut req: *mut c_void = null_mut();
        // A plugin without iflush needs no flush (host memory only).
        if !self.inner.has("iflush") {
            return Ok(None);
        }
        call!(
            lib,
            iflush(self.comm, bufs.len() as c_int, data.as_mut_ptr(), sizes.as_mut_ptr(), mh.as_mut_ptr(), &mut req)
        )?;
        if req.is_null() {
            return Ok(None);
        }
        self.nbufs.insert(req as usize, 1);
        Ok(Some(Request(req as usize)))
    }

    fn test(&mut self, req: &Request) -> Result<Option<Vec<usize>>> {
        let n = self.nbufs.get(&req.0).copied().unwrap_or(1);
        self.test_req(req, n)
    }
}
