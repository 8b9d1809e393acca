//! External profiler plugins (`NCCL_PROFILER_PLUGIN`; docs/PLUGINS.md, "Profiler"): the library is
//! found once per process, its table looked up newest first (`ncclProfiler_v5` .. `_v1`, as NCCL
//! 2.28.9), and each communicator gets a [`Profiler`] whose `init` sets the events it wants (the
//! activation mask). Events are [`Event`]s: started with a version-independent [`Descr`], filled
//! into the plugin's version of the descriptor here, and stopped when dropped, so that every start
//! has its stop whatever path the caller leaves by. The calls are plain C callbacks: the NET proxy
//! thread makes them too, and nothing here touches CUDA.

use std::ffi::{c_int, c_void, CStr, CString};
use std::ptr::null_mut;
use std::sync::{Arc, OnceLock};

use super::abi::*;
use super::{Found, Kind, Library};
use crate::debug::Subsys;
use crate::error::{Error, Result};

crate::str_param!(
    /// `NCCL_PROFILER_PLUGIN`: the profiler plugin library, or `none`.
    profiler_plugin_env, "NCCL_PROFILER_PLUGIN"
);

/// How profiler plugins are found: `NCCL_PROFILER_PLUGIN`, `libnccl-profiler-<name>.so`,
/// `libnccl-profiler.so`.
pub const PROFILER_PLUGINS: Kind = Kind {
    var: "NCCL_PROFILER_PLUGIN",
    kind: "profiler",
    default: "libnccl-profiler.so",
    label: "PROFILER/Plugin",
    subsys: Subsys::PROFILE,
    list: false,
};

const SYMBOLS: [&str; 5] =
    ["ncclProfiler_v5", "ncclProfiler_v4", "ncclProfiler_v3", "ncclProfiler_v2", "ncclProfiler_v1"];

#[derive(Clone, Copy)]
enum Table {
    V5(*const ncclProfiler_v5_t),
    V4(*const ncclProfiler_v4_t),
    V3(*const ncclProfiler_v3_t),
    V2(*const ncclProfiler_v2_t),
    V1(*const ncclProfiler_v1_t),
}

/// Every version's table has the same five functions after its name; only `init`'s signature
/// and the descriptor and state-argument types differ.
macro_rules! field {
    ($table:expr, $f:ident) => {
        match $table {
            Table::V5(t) => (*t).$f.is_some(),
            Table::V4(t) => (*t).$f.is_some(),
            Table::V3(t) => (*t).$f.is_some(),
            Table::V2(t) => (*t).$f.is_some(),
            Table::V1(t) => (*t).$f.is_some(),
        }
    };
}

/// A profiler library and the table it exports; kept mapped for the life of the process.
pub struct ProfilerLib {
    lib: Library,
    name: String,
    table: Table,
}

// SAFETY: the table is the library's static data, read-only; see `Library`.
unsafe impl Send for ProfilerLib {}
// SAFETY: as above.
unsafe impl Sync for ProfilerLib {}

impl ProfilerLib {
    /// Takes a library that exports a profiler table with every function; refuses others.
    pub fn accept(mut lib: Library) -> Result<ProfilerLib> {
        let Some((i, p)) = super::first_symbol(&lib, &SYMBOLS) else {
            return Err(Error::System(format!(
                "PROFILER/Plugin: {} exports none of {}; continuing without a profiler",
                lib.path(),
                SYMBOLS.join(", ")
            )));
        };
        let table = match i {
            0 => Table::V5(p.cast()),
            1 => Table::V4(p.cast()),
            2 => Table::V3(p.cast()),
            3 => Table::V2(p.cast()),
            _ => Table::V1(p.cast()),
        };
        // SAFETY: the table is the library's static data, laid out as plugin_abi.h says.
        let (name, complete) = unsafe {
            let complete = field!(table, init)
                && field!(table, startEvent)
                && field!(table, stopEvent)
                && field!(table, recordEventState)
                && field!(table, finalize);
            (super::table_name(p), complete)
        };
        if !complete {
            return Err(Error::System(format!(
                "PROFILER/Plugin: {} in {} has a NULL function; continuing without a profiler",
                SYMBOLS[i],
                lib.path()
            )));
        }
        lib.keep();
        let l = ProfilerLib { lib, name, table };
        crate::nccl_info!(Subsys::INIT, "PROFILER/Plugin: using {} (v{}) from {}", l.name, l.version(), l.path());
        Ok(l)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> &str {
        self.lib.path()
    }

    pub fn version(&self) -> u32 {
        match self.table {
            Table::V5(_) => 5,
            Table::V4(_) => 4,
            Table::V3(_) => 3,
            Table::V2(_) => 2,
            Table::V1(_) => 1,
        }
    }
}

/// The process's profiler plugin, looked for once.
pub fn found() -> &'static Found<ProfilerLib> {
    static FOUND: OnceLock<Found<ProfilerLib>> = OnceLock::new();
    FOUND.get_or_init(|| super::find(&PROFILER_PLUGINS, profiler_plugin_env(), ProfilerLib::accept))
}

/// What `init` is told about the communicator.
pub struct CommInfo<'a> {
    pub comm_hash: u64,
    pub name: &'a str,
    pub nnodes: usize,
    pub nranks: usize,
    pub rank: usize,
}

/// One communicator's profiler context: `finalize` runs when the last holder (the communicator,
/// an event still open) drops it.
pub struct Profiler {
    lib: &'static ProfilerLib,
    ctx: *mut c_void,
    /// The events the plugin asked for at init (`ncclProfile*` bits).
    mask: i32,
    rank: i32,
    comm_hash: u64,
    name: CString,
}

// SAFETY: ctx is the plugin's context; NCCL calls a plugin from the user's and the proxy's
// threads alike, and so do we.
unsafe impl Send for Profiler {}
// SAFETY: as above.
unsafe impl Sync for Profiler {}

impl std::fmt::Debug for Profiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "profiler plugin {} (v{}), mask {:#x}", self.lib.name, self.lib.version(), self.mask)
    }
}

/// NCCL's names of the data types, by `ncclDataType_t`.
const DTYPES: [&CStr; 12] = [
    c"ncclInt8",
    c"ncclUint8",
    c"ncclInt32",
    c"ncclUint32",
    c"ncclInt64",
    c"ncclUint64",
    c"ncclFloat16",
    c"ncclFloat32",
    c"ncclFloat64",
    c"ncclBfloat16",
    c"ncclFloat8e4m3",
    c"ncclFloat8e5m2",
];

/// NCCL's name of a data type (`ncclDatatypeToString`).
pub fn dtype_name(dtype: u32) -> &'static CStr {
    DTYPES.get(dtype as usize).copied().unwrap_or(c"unknown")
}

/// NCCL's names of the functions, by `ncclFunc_t` (`ncclFuncToString`).
pub fn func_name(func: ncclFunc_t) -> &'static CStr {
    const NAMES: [&CStr; 11] = [
        c"Broadcast",
        c"Reduce",
        c"AllGather",
        c"ReduceScatter",
        c"AllReduce",
        c"SendRecv",
        c"Send",
        c"Recv",
        c"AlltoAll",
        c"Scatter",
        c"Gather",
    ];
    NAMES.get(func as usize).copied().unwrap_or(c"Unknown")
}

/// What an event is, whatever the plugin's version. Names are NCCL's strings.
#[derive(Clone, Copy, Debug)]
pub enum Descr {
    /// The host side of one group's launch on this communicator (`ncclProfileGroup`).
    Group,
    /// One collective of a group (`ncclProfileColl`).
    Coll {
        seq: u64,
        func: ncclFunc_t,
        send: u64,
        recv: u64,
        count: usize,
        root: i32,
        dtype: u32,
        nchannels: u8,
        nwarps: u8,
        /// NCCL's algorithm and protocol names and (for v1) indices.
        algo: (&'static CStr, u8),
        proto: (&'static CStr, u8),
    },
    /// One send or receive of a group (`ncclProfileP2p`).
    P2p { func: ncclFunc_t, buff: u64, dtype: u32, count: usize, peer: i32, nchannels: u8 },
    /// One connection direction's run of NET steps on the proxy thread (`ncclProfileProxyOp`).
    ProxyOp { channel: u8, peer: i32, nsteps: i32, chunk: i32, is_send: bool },
    /// One NET step (`ncclProfileProxyStep`).
    ProxyStep { step: i32 },
}

impl Descr {
    /// The `ncclProfile*` bit of the event.
    pub fn bit(&self) -> i32 {
        (match self {
            Descr::Group => ncclProfileGroup,
            Descr::Coll { .. } => ncclProfileColl,
            Descr::P2p { .. } => ncclProfileP2p,
            Descr::ProxyOp { .. } => ncclProfileProxyOp,
            Descr::ProxyStep { .. } => ncclProfileProxyStep,
        }) as i32
    }
}

/// An open event; stopped when dropped (after its children, which hold it).
pub struct Event {
    prof: Arc<Profiler>,
    handle: *mut c_void,
}

// SAFETY: the handle is the plugin's, which NCCL too stops from another thread than it started on
// (proxy steps); see Profiler.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Profiler {
    /// Runs the process's plugin's `init` for a communicator. `None` when there is no plugin, its
    /// `init` failed (WARNed; the communicator carries on without a profiler) or it wants no event.
    pub fn start(info: &CommInfo) -> Option<Arc<Profiler>> {
        let lib = found().plugin.as_ref()?;
        let name = CString::new(info.name.replace('\0', "")).unwrap_or_default();
        let mut ctx = null_mut();
        let mut mask: c_int = 0;
        let log = super::logger::logger();
        let (nnodes, nranks, rank) = (info.nnodes as c_int, info.nranks as c_int, info.rank as c_int);
        // SAFETY: functions checked non-NULL at load; arguments per plugin_abi.h, live for the call.
        let rc = unsafe {
            match lib.table {
                Table::V5(t) => (*t).init.expect("checked")(
                    &mut ctx,
                    info.comm_hash,
                    &mut mask,
                    name.as_ptr(),
                    nnodes,
                    nranks,
                    rank,
                    log,
                ),
                Table::V4(t) => (*t).init.expect("checked")(
                    &mut ctx,
                    &mut mask,
                    name.as_ptr(),
                    info.comm_hash,
                    nnodes,
                    nranks,
                    rank,
                    log,
                ),
                Table::V3(t) => (*t).init.expect("checked")(&mut ctx, &mut mask),
                Table::V2(t) => (*t).init.expect("checked")(&mut ctx, &mut mask),
                Table::V1(t) => (*t).init.expect("checked")(&mut ctx, &mut mask),
            }
        } as c_int;
        if rc != 0 {
            crate::nccl_warn!(
                "PROFILER/Plugin {} (v{}, {}): init failed with code {rc}; continuing without a profiler",
                lib.name,
                lib.version(),
                lib.path()
            );
            return None;
        }
        let p = Profiler { lib, ctx, mask, rank, comm_hash: info.comm_hash, name };
        crate::nccl_info!(Subsys::INIT | Subsys::PROFILE, "PROFILER/Plugin: rank {rank}: {p:?}");
        Some(Arc::new(p))
    }

    /// Whether the plugin wants any of the `ncclProfile*` events in `bits`.
    pub fn wants(&self, bits: i32) -> bool {
        self.mask & bits != 0
    }

    /// Starts an event under `parent` when the plugin wants its kind; `None` when it does not, or
    /// its version has no such event, or it returned no handle (nothing to stop then).
    pub fn start_event(self: &Arc<Self>, d: &Descr, parent: Option<&Event>) -> Option<Event> {
        if !self.wants(d.bit()) {
            return None;
        }
        let parent = parent.map_or(null_mut(), |e| e.handle);
        let mut handle = null_mut();
        // SAFETY: functions checked non-NULL at load; the descriptor lives for the call and its
        // strings are static or owned by self.
        let rc = unsafe {
            match self.lib.table {
                Table::V5(t) => {
                    let mut e = self.v5(d, parent);
                    (*t).startEvent.expect("checked")(self.ctx, &mut handle, &mut e)
                }
                Table::V4(t) => {
                    let mut e = self.v4(d, parent);
                    (*t).startEvent.expect("checked")(self.ctx, &mut handle, &mut e)
                }
                Table::V3(t) => {
                    let mut e = self.v3(d, parent);
                    (*t).startEvent.expect("checked")(self.ctx, &mut handle, &mut e)
                }
                Table::V2(t) => {
                    let mut e = self.v2(d, parent);
                    (*t).startEvent.expect("checked")(self.ctx, &mut handle, &mut e)
                }
                Table::V1(t) => {
                    let mut e = self.v1(d, parent);
                    (*t).startEvent.expect("checked")(self.ctx, &mut handle, &mut e)
                }
            }
        } as c_int;
        if rc != 0 {
            crate::nccl_trace!(Subsys::PROFILE, "PROFILER/Plugin {}: startEvent failed with code {rc}", self.lib.name);
        }
        (!handle.is_null()).then(|| Event { prof: self.clone(), handle })
    }

    fn v5(&self, d: &Descr, parent: *mut c_void) -> ncclProfilerEventDescr_v5_t {
        let mut e = ncclProfilerEventDescr_v5_t {
            type_: d.bit() as u64,
            parentObj: parent,
            rank: self.rank,
            ..Default::default()
        };
        let u = &mut e.__bindgen_anon_1;
        match *d {
            Descr::Group => {}
            Descr::Coll { seq, func, send, recv, count, root, dtype, nchannels, nwarps, algo, proto } => {
                u.coll.seqNumber = seq;
                u.coll.func = func_name(func).as_ptr();
                u.coll.sendBuff = send as *const c_void;
                u.coll.recvBuff = recv as *mut c_void;
                u.coll.count = count;
                u.coll.root = root;
                u.coll.datatype = dtype_name(dtype).as_ptr();
                u.coll.nChannels = nchannels;
                u.coll.nWarps = nwarps;
                u.coll.algo = algo.0.as_ptr();
                u.coll.proto = proto.0.as_ptr();
                // The group is the parent (no API events are produced: docs/PLUGINS.md).
                u.coll.parentGroup = parent;
            }
            Descr::P2p { func, buff, dtype, count, peer, nchannels } => {
                u.p2p.func = func_name(func).as_ptr();
                u.p2p.buff = buff as *mut c_void;
                u.p2p.datatype = dtype_name(dtype).as_ptr();
                u.p2p.count = count;
                u.p2p.peer = peer;
                u.p2p.nChannels = nchannels;
                u.p2p.parentGroup = parent;
            }
            Descr::ProxyOp { .. } => u.proxyOp = proxy_op(d),
            Descr::ProxyStep { step } => u.proxyStep.step = step,
        }
        e
    }

    fn v4(&self, d: &Descr, parent: *mut c_void) -> ncclProfilerEventDescr_v4_t {
        let mut e = ncclProfilerEventDescr_v4_t {
            type_: d.bit() as u8,
            parentObj: parent,
            rank: self.rank,
            ..Default::default()
        };
        let u = &mut e.__bindgen_anon_1;
        match *d {
            Descr::Group => {}
            Descr::Coll { seq, func, send, recv, count, root, dtype, nchannels, nwarps, algo, proto } => {
                u.coll.seqNumber = seq;
                u.coll.func = func_name(func).as_ptr();
                u.coll.sendBuff = send as *const c_void;
                u.coll.recvBuff = recv as *mut c_void;
                u.coll.count = count;
                u.coll.root = root;
                u.coll.datatype = dtype_name(dtype).as_ptr();
                u.coll.nChannels = nchannels;
                u.coll.nWarps = nwarps;
                u.coll.algo = algo.0.as_ptr();
                u.coll.proto = proto.0.as_ptr();
            }
            Descr::P2p { func, buff, dtype, count, peer, nchannels } => {
                u.p2p.func = func_name(func).as_ptr();
                u.p2p.buff = buff as *mut c_void;
                u.p2p.datatype = dtype_name(dtype).as_ptr();
                u.p2p.count = count;
                u.p2p.peer = peer;
                u.p2p.nChannels = nchannels;
            }
            Descr::ProxyOp { .. } => u.proxyOp = proxy_op(d),
            Descr::ProxyStep { step } => u.proxyStep.step = step,
        }
        e
    }

    fn v3(&self, d: &Descr, parent: *mut c_void) -> ncclProfilerEventDescr_v3_t {
        let mut e = ncclProfilerEventDescr_v3_t {
            type_: d.bit() as u8,
            parentObj: parent,
            rank: self.rank,
            ..Default::default()
        };
        let u = &mut e.__bindgen_anon_1;
        match *d {
            Descr::Group => {}
            Descr::Coll { seq, func, send, recv, count, root, dtype, nchannels, nwarps, algo, proto } => {
                u.coll.name = self.name.as_ptr();
                u.coll.commHash = self.comm_hash;
                u.coll.seqNumber = seq;
                u.coll.func = func_name(func).as_ptr();
                u.coll.sendBuff = send as *const c_void;
                u.coll.recvBuff = recv as *mut c_void;
                u.coll.count = count;
                u.coll.root = root;
                u.coll.datatype = dtype_name(dtype).as_ptr();
                u.coll.nMaxChannels = nchannels;
                u.coll.nWarps = nwarps;
                u.coll.algo = algo.0.as_ptr();
                u.coll.proto = proto.0.as_ptr();
            }
            Descr::P2p { func, buff, dtype, count, peer, .. } => {
                u.p2p.name = self.name.as_ptr();
                u.p2p.commHash = self.comm_hash;
                u.p2p.func = func_name(func).as_ptr();
                u.p2p.buff = buff as *mut c_void;
                u.p2p.datatype = dtype_name(dtype).as_ptr();
                u.p2p.count = count;
                u.p2p.peer = peer;
            }
            Descr::ProxyOp { .. } => u.proxyOp = proxy_op(d),
            Descr::ProxyStep { step } => u.proxyStep.step = step,
        }
        e
    }

    fn v2(&self, d: &Descr, parent: *mut c_void) -> ncclProfilerEventDescr_v2_t {
        let mut e = ncclProfilerEventDescr_v2_t {
            type_: d.bit() as u8,
            parentObj: parent,
            rank: self.rank,
            ..Default::default()
        };
        let u = &mut e.__bindgen_anon_1;
        match *d {
            Descr::Group => {}
            Descr::Coll { seq, func, send, recv, count, root, dtype, nchannels, nwarps, algo, proto } => {
                u.coll.name = self.name.as_ptr();
                u.coll.commHash = self.comm_hash;
                u.coll.seqNumber = seq;
                u.coll.func = func_name(func).as_ptr();
                u.coll.sendBuff = send as *const c_void;
                u.coll.recvBuff = recv as *mut c_void;
                u.coll.count = count;
                u.coll.root = root;
                u.coll.datatype = dtype_name(dtype).as_ptr();
                u.coll.nMaxChannels = nchannels;
                u.coll.nWarps = nwarps;
                u.coll.algo = algo.0.as_ptr();
                u.coll.proto = proto.0.as_ptr();
            }
            Descr::P2p { func, buff, dtype, count, peer, .. } => {
                u.p2p.name = self.name.as_ptr();
                u.p2p.commHash = self.comm_hash;
                u.p2p.func = func_name(func).as_ptr();
                u.p2p.buff = buff as *mut c_void;
                u.p2p.datatype = dtype_name(dtype).as_ptr();
                u.p2p.count = count;
                u.p2p.peer = peer;
            }
            Descr::ProxyOp { .. } => u.proxyOp = proxy_op(d),
            Descr::ProxyStep { step } => u.proxyStep.step = step,
        }
        e
    }

    fn v1(&self, d: &Descr, parent: *mut c_void) -> ncclProfilerEventDescr_v1_t {
        let mut e = ncclProfilerEventDescr_v1_t {
            type_: d.bit() as u8,
            parentObj: parent,
            rank: self.rank,
            ..Default::default()
        };
        let u = &mut e.__bindgen_anon_1;
        match *d {
            Descr::Group => {}
            Descr::Coll { seq, func, send, recv, count, root, dtype, nchannels, nwarps, algo, proto } => {
                u.coll.name = self.name.as_ptr();
                u.coll.commHash = self.comm_hash;
                u.coll.seqNumber = seq;
                u.coll.func = func as u8;
                u.coll.sendBuff = send as *const c_void;
                u.coll.recvBuff = recv as *mut c_void;
                u.coll.count = count;
                u.coll.root = root;
                u.coll.datatype = dtype as u8;
                u.coll.nMaxChannels = nchannels;
                u.coll.nWarps = nwarps;
                u.coll.algo = algo.1;
                u.coll.proto = proto.1;
            }
            Descr::P2p { func, buff, dtype, count, peer, .. } => {
                u.p2p.name = self.name.as_ptr();
                u.p2p.commHash = self.comm_hash;
                u.p2p.func = func as u8;
                u.p2p.buff = buff as *mut c_void;
                u.p2p.datatype = dtype as u8;
                u.p2p.count = count;
                u.p2p.peer = peer;
            }
            Descr::ProxyOp { .. } => u.proxyOp = proxy_op(d),
            Descr::ProxyStep { step } => u.proxyStep.step = step,
        }
        e
    }
}

fn proxy_op(d: &Descr) -> ncclProfilerProxyOpDescr_t {
    let Descr::ProxyOp { channel, peer, nsteps, chunk, is_send } = *d else { unreachable!("a proxy op") };
    ncclProfilerProxyOpDescr_t {
        pid: std::process::id() as libc::pid_t,
        channelId: channel,
        peer,
        nSteps: nsteps,
        chunkSize: chunk,
        isSend: is_send as c_int,
    }
}

impl Event {
    /// Records a proxy step's state change (`ncclProfilerProxyStep*`) with the bytes it moves.
    pub fn record_step(&self, state: ncclProfilerEventState_t, bytes: usize) {
        let p = &self.prof;
        // SAFETY: functions checked non-NULL at load; the handle came from startEvent and is not
        // stopped yet (this event owns it); the arguments live for the call.
        let rc = unsafe {
            match p.lib.table {
                Table::V5(t) => {
                    let mut a = ncclProfilerEventStateArgs_v5_t::default();
                    a.proxyStep.transSize = bytes;
                    (*t).recordEventState.expect("checked")(self.handle, state, &mut a)
                }
                Table::V4(t) => {
                    let mut a = ncclProfilerEventStateArgs_v4_t::default();
                    a.proxyStep.transSize = bytes;
                    (*t).recordEventState.expect("checked")(self.handle, state, &mut a)
                }
                Table::V3(t) => {
                    let mut a = ncclProfilerEventStateArgs_v3_t::default();
                    a.proxyOp.transSize = bytes;
                    (*t).recordEventState.expect("checked")(self.handle, state, &mut a)
                }
                Table::V2(t) => {
                    let mut a = ncclProfilerEventStateArgs_v2_t::default();
                    a.proxyOp.transSize = bytes;
                    (*t).recordEventState.expect("checked")(self.handle, state, &mut a)
                }
                Table::V1(t) => {
                    let mut a = ncclProfilerEventStateArgs_v1_t::default();
                    a.proxyOp.transSize = bytes;
                    (*t).recordEventState.expect("checked")(self.handle, state, &mut a)
                }
            }
        } as c_int;
        if rc != 0 {
            crate::nccl_trace!(
                Subsys::PROFILE,
                "PROFILER/Plugin {}: recordEventState failed with code {rc}",
                p.lib.name
            );
        }
    }

    pub fn profiler(&self) -> &Arc<Profiler> {
        &self.prof
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: every table's stopEvent has the same signature at the same offset; checked
        // non-NULL at load; the handle came from startEvent and is stopped once.
        let rc = unsafe {
            match self.prof.lib.table {
                Table::V5(t) => (*t).stopEvent.expect("checked")(self.handle),
                Table::V4(t) => (*t).stopEvent.expect("checked")(self.handle),
                Table::V3(t) => (*t).stopEvent.expect("checked")(self.handle),
                Table::V2(t) => (*t).stopEvent.expect("checked")(self.handle),
                Table::V1(t) => (*t).stopEvent.expect("checked")(self.handle),
            }
        } as c_int;
        if rc != 0 {
            crate::nccl_trace!(
                Subsys::PROFILE,
                "PROFILER/Plugin {}: stopEvent failed with code {rc}",
                self.prof.lib.name
            );
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        // SAFETY: as in Event's drop; ctx came from init and is finalized once, after every event
        // (each holds this profiler).
        let rc = unsafe {
            match self.lib.table {
                Table::V5(t) => (*t).finalize.expect("checked")(self.ctx),
                Table::V4(t) => (*t).finalize.expect("checked")(self.ctx),
                Table::V3(t) => (*t).finalize.expect("checked")(self.ctx),
                Table::V2(t) => (*t).finalize.expect("checked")(self.ctx),
                Table::V1(t) => (*t).finalize.expect("checked")(self.ctx),
            }
        } as c_int;
        if rc != 0 {
            crate::nccl_warn!("PROFILER/Plugin {}: finalize failed with code {rc}", self.lib.name);
        }
    }
}
