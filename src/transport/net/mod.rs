//! The network layer under the NET transport: NCCL's `ncclNet` API (v11 semantics) over either
//! the built-in [`socket`] net or an external plugin loaded as NCCL loads one ([`plugin`]).
//! `docs/NET.md` describes the API, how plugins are found and the environment variables.
//!
//! Everything here is non-blocking as in NCCL: `connect`/`accept` return `None` until the
//! connection is up and are called again; `isend`/`irecv` return `None` when the comm has no
//! free request slot; `test` says whether a request is done. The proxy thread that drives a
//! connection owns the deadline of each exchange; nothing in this layer waits without one.

pub mod abi;
pub mod conn;
pub mod plugin;
pub mod proxy;
pub mod socket;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::plugin::profiler::Parent;

/// Bytes of a connection handle, exchanged between ranks out of band (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_BYTES: usize = abi::NCCL_NET_HANDLE_MAXSIZE as usize;
/// Requests a comm may have in flight (`NCCL_NET_MAX_REQUESTS`).
pub const MAX_REQUESTS: usize = abi::NCCL_NET_MAX_REQUESTS as usize;
/// Buffers one grouped receive may carry at most, whatever a plugin claims.
pub const MAX_RECVS: usize = 8;

/// What a listener hands out for its peer to connect to.
pub type Handle = [u8; HANDLE_BYTES];

/// The memory a net can send from and receive into (`ptrSupport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtrKind {
    Host,
    Cuda,
}

impl PtrKind {
    pub fn bit(self) -> i32 {
        match self {
            PtrKind::Host => abi::NCCL_PTR_HOST as i32,
            PtrKind::Cuda => abi::NCCL_PTR_CUDA as i32,
        }
    }
}

/// A device's properties, converted from whichever plugin version reported them.
#[derive(Clone, Debug, PartialEq)]
pub struct Properties {
    pub name: String,
    pub pci_path: Option<String>,
    pub guid: u64,
    /// `NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF` bits.
    pub ptr_support: i32,
    pub reg_is_global: bool,
    pub force_flush: bool,
    pub speed_mbps: i32,
    pub port: i32,
    pub latency_us: f32,
    pub max_comms: i32,
    /// Buffers one `irecv` may take, at least 1 and at most [`MAX_RECVS`].
    pub max_recvs: usize,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

/// A registered memory region (`mhandle`); opaque to the caller.
#[derive(Debug)]
pub struct MemHandle(pub(crate) usize);

/// An operation in flight, returned by `isend`/`irecv`/`iflush` and consumed by `test` once
/// it reports done or failed.
#[derive(Debug)]
pub struct Request(pub(crate) usize);

/// One buffer of a grouped receive.
#[derive(Clone, Copy, Debug)]
pub struct RecvBuf {
    pub data: *mut u8,
    pub size: usize,
    pub tag: i32,
}

/// A network: the built-in socket net or a plugin.
pub trait Net: Send + Sync {
    /// The name `NCCL_NET` selects by (`Socket` for the built-in net).
    fn name(&self) -> &str;
    fn devices(&self) -> usize;
    fn properties(&self, dev: usize) -> Result<Properties>;
    /// Whether this is the built-in Socket net, whose workings the library knows: the tuner
    /// prices it by its own measured constants rather than by its reported properties, its
    /// steps cross as a size word and data in one `sendmsg` (a plugin's small ones as one
    /// message: `proxy::Layout`), and its helper threads move large messages, so its connections
    /// need one proxy thread where a plugin's, which may copy in its calls, get two where there
    /// are CPUs for them (`proxy::Threads::choose`).
    fn builtin(&self) -> bool {
        false
    }
    /// Starts listening on `dev`; the handle goes to the peer that will connect.
    fn listen(&self, dev: usize) -> Result<(Handle, Box<dyn Listener>)>;
    /// Starts connecting to a peer's handle; poll the result until it yields the comm.
    fn connect(&self, dev: usize, handle: &Handle) -> Result<Box<dyn Connecting>>;
}

pub trait Listener: Send {
    /// The next connected peer, or `None` if none has finished connecting yet.
    fn accept(&mut self) -> Result<Option<Box<dyn RecvComm>>>;
}

pub trait Connecting: Send {
    /// The send comm once connected, `None` while the connection is still being set up.
    fn poll(&mut self) -> Result<Option<Box<dyn SendComm>>>;
}

pub trait SendComm: Send {
    fn reg_mr(&mut self, data: *mut u8, size: usize, kind: PtrKind) -> Result<MemHandle>;
    fn dereg_mr(&mut self, mr: MemHandle) -> Result<()>;
    /// Posts a send of `size` bytes at `data` that moves the proxy step `step` (if any), whose
    /// profiler event a net starts its own events under (`ncclProfileNetPlugin`,
    /// docs/PLUGINS.md); `None` if no request slot is free.
    ///
    /// # Safety
    /// `data..data+size` must stay valid and unchanged until `test` reports the request done
    /// or failed, or the comm is dropped.
    unsafe fn isend_in(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        mr: &MemHandle,
        step: Option<&Parent>,
    ) -> Result<Option<Request>>;
    /// [`SendComm::isend_in`] of a message that moves no proxy step.
    ///
    /// # Safety
    /// As [`SendComm::isend_in`].
    unsafe fn isend(&mut self, data: *const u8, size: usize, tag: i32, mr: &MemHandle) -> Result<Option<Request>> {
        // SAFETY: the caller keeps isend_in's contract.
        unsafe { self.isend_in(data, size, tag, mr, None) }
    }
    /// `Some(bytes sent)` once done; `None` while in flight. The request is consumed when this
    /// returns `Some` or an error.
    fn test(&mut self, req: &Request) -> Result<Option<usize>>;
    /// Keeps the calling thread's path for this comm's sends warm, and the net's own threads
    /// awake, while a step is expected soon (the proxy calls it while a launch's first step is
    /// awaited); whether it did anything, in which case that holds for every comm of this net on
    /// the thread. The built-in net sends a byte through a loopback pair of its own
    /// (`socket::warm`) and keeps its lead helper polling (`socket::pool`); a plugin's path is
    /// its own business: nothing.
    fn warm(&mut self) -> bool {
        false
    }
}

pub trait RecvComm: Send {
    fn reg_mr(&mut self, data: *mut u8, size: usize, kind: PtrKind) -> Result<MemHandle>;
    fn dereg_mr(&mut self, mr: MemHandle) -> Result<()>;
    /// Posts a grouped receive: each incoming message goes to the buffer posted with its tag,
    /// and may be shorter than that buffer, never longer; `step` as in [`SendComm::isend_in`].
    /// `None` if no request slot is free.
    ///
    /// # Safety
    /// Every buffer must stay valid and otherwise untouched until `test` reports the request
    /// done or failed, or the comm is dropped.
    unsafe fn irecv_in(
        &mut self,
        bufs: &[RecvBuf],
        mrs: &[&MemHandle],
        step: Option<&Parent>,
    ) -> Result<Option<Request>>;
    /// [`RecvComm::irecv_in`] for no proxy step.
    ///
    /// # Safety
    /// As [`RecvComm::irecv_in`].
    unsafe fn irecv(&mut self, bufs: &[RecvBuf], mrs: &[&MemHandle]) -> Result<Option<Request>> {
        // SAFETY: the caller keeps irecv_in's contract.
        unsafe { self.irecv_in(bufs, mrs, None) }
    }
    /// Makes received data visible to the GPU; `None` when nothing needs doing (host memory).
    fn iflush(&mut self, bufs: &[RecvBuf], mrs: &[&MemHandle]) -> Result<Option<Request>>;
    /// `Some(bytes received per buffer)` once done; `None` while in flight.
    fn test(&mut self, req: &Request) -> Result<Option<Vec<usize>>>;
}

/// Checks the shape of a grouped receive against the device's `max_recvs`, before any plugin
/// sees it.
pub(crate) fn check_recv(bufs: &[RecvBuf], mrs: &[&MemHandle], max_recvs: usize) -> Result<()> {
    if bufs.is_empty() || bufs.len() > max_recvs {
        return Err(Error::InvalidArgument(format!(
            "irecv: {} buffers posted, the net takes 1 to {max_recvs}",
            bufs.len()
        )));
    }
    if mrs.len() != bufs.len() {
        return Err(Error::InvalidArgument(format!("irecv: {} memory handles for {} buffers", mrs.len(), bufs.len())));
    }
    if let Some(b) = bufs.iter().find(|b| b.data.is_null() && b.size > 0) {
        return Err(Error::InvalidArgument(format!("irecv: NULL buffer of {} bytes (tag {})", b.size, b.tag)));
    }
    Ok(())
}

crate::str_param!(
    /// `NCCL_NET=<name>`: use only the net of that name (`Socket` is the built-in one).
    net_name, "NCCL_NET"
);

/// What a communicator asks of the net: from its `ncclConfig_t` (`netName`, `trafficClass`)
/// and its hash, which v11+ plugins receive in `init`, as they keep a context per comm.
#[derive(Clone, Debug, Default)]
pub struct NetConfig {
    pub comm_id: u64,
    pub traffic_class: Option<i32>,
    /// The config's `netName`; `None`: `NCCL_NET`, if set.
    pub net_name: Option<String>,
}

/// The net for a communicator, chosen as NCCL does: the plugins of `NCCL_NET_PLUGIN` (or
/// `libnccl-net.so`) first, then the built-in Socket net; a net name (`NCCL_NET` or the
/// config's `netName`) keeps only the net of that name. The first net whose `init` and
/// `devices` succeed wins.
pub fn init(cfg: &NetConfig) -> Result<Arc<dyn Net>> {
    let want = cfg.net_name.as_deref().or(net_name());
    let mut tried = Vec::new();
    for cand in plugin::NET_PLUGINS.candidates(plugin::net_plugin_env()) {
        let lib = match plugin::PluginLib::open(&cand) {
            Ok(Some(lib)) => lib,
            Ok(None) => continue,
            Err(e) => {
                crate::nccl_warn!("{e}");
                tried.push(cand);
                continue;
            }
        };
        if want.is_some_and(|w| !w.eq_ignore_ascii_case(lib.name())) {
            tried.push(format!("{} ({})", lib.name(), lib.path()));
            continue;
        }
        match plugin::PluginNet::init(lib, cfg.comm_id, cfg.traffic_class) {
            Ok(p) => return Ok(Arc::new(p)),
            Err(e) => {
                crate::nccl_warn!("{e}");
                tried.push(cand);
            }
        }
    }
    if want.is_none_or(|w| w.eq_ignore_ascii_case(socket::NAME)) {
        return Ok(Arc::new(socket::SocketNet::new()?));
    }
    Err(Error::InvalidUsage(format!(
        "the net name {:?} (NCCL_NET or the config's netName) names no available net: tried {}{}Socket",
        want.unwrap_or_default(),
        tried.join(", "),
        if tried.is_empty() { "" } else { ", " }
    )))
}

/// The properties of device 0 of `net` when it is a plugin (device 0 is the one connections
/// use), or `None` for the built-in Socket net.
pub fn plugin_properties(net: &dyn Net) -> Result<Option<Properties>> {
    if net.builtin() {
        return Ok(None);
    }
    net.properties(0).map(Some)
}

/// The file of the net plugin library NCCL_NET_PLUGIN (or `libnccl-net.so`) gives: the first that
/// opens and exports a net table, which `init` tries first. The tuner looks for its table there
/// when no tuner library is found (docs/PLUGINS.md, "Tuner").
pub fn plugin_library() -> Option<String> {
    plugin::NET_PLUGINS
        .candidates(plugin::net_plugin_env())
        .into_iter()
        .find_map(|c| plugin::PluginLib::open(&c).ok().flatten().map(|lib| lib.path().to_string()))
}

/// What `ferronickel info` shows: every net plugin the loader would try, with what it found
/// (the loaded net's name and version, or why it was skipped).
pub fn plugins_found() -> Vec<(String, std::result::Result<String, String>)> {
    plugin::NET_PLUGINS
        .candidates(plugin::net_plugin_env())
        .into_iter()
        .filter_map(|c| match plugin::PluginLib::open(&c) {
            Ok(Some(lib)) => Some((c, Ok(format!("{} (v{}) at {}", lib.name(), lib.version(), lib.path())))),
            Ok(None) => None,
            Err(e) => Some((c, Err(e.to_string()))),
        })
        .collect()
}

/// What `ferronickel info` shows: the interfaces the built-in Socket net would use, in order,
/// or the error it would fail with (an `NCCL_SOCKET_IFNAME` that matches nothing, say).
pub fn socket_interfaces() -> Result<Vec<(String, std::net::IpAddr)>> {
    socket::select_interfaces()
}
