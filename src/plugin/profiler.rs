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
use super::{Found, Kind, Library, Loaded};
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

super::versions!(
    /// The profiler tables, looked up newest first.
    Table,
    "ncclProfiler_v",
    V5(ncclProfiler_v5_t) = 5,
    V4(ncclProfiler_v4_t) = 4,
    V3(ncclProfiler_v3_t) = 3,
    V2(ncclProfiler_v2_t) = 2,
    V1(ncclProfiler_v1_t) = 1,
);

/// `$body` with `$t` bound to the table of whatever version the library exports: every version's
/// table has the same five functions after its name; only `init`'s signature and the descriptor
/// and state-argument types differ (see [`EventDescr`], [`StepArgs`]).
macro_rules! each {
    ($table:expr, |$t:ident| $body:expr) => {
        match $table {
            Table::V5($t) => $body,
            Table::V4($t) => $body,
            Table::V3($t) => $body,
            Table::V2($t) => $body,
            Table::V1($t) => $body,
        }
    };
}

/// A profiler library and the table it exports; kept mapped for the life of the process.
pub type ProfilerLib = Loaded<Table>;

impl ProfilerLib {
    /// Takes a library that exports a profiler table with every function; refuses others.
    pub fn accept(lib: Library) -> Result<ProfilerLib> {
        let mut l = ProfilerLib::find(&PROFILER_PLUGINS, lib, "continuing without a profiler")?;
        // SAFETY: the table is the library's static data, laid out as plugin_abi.h says.
        let complete = unsafe {
            each!(l.table, |t| {
                (*t).init.is_some()
                    && (*t).startEvent.is_some()
                    && (*t).stopEvent.is_some()
                    && (*t).recordEventState.is_some()
                    && (*t).finalize.is_some()
            })
        };
        if !complete {
            return Err(Error::System(format!(
                "PROFILER/Plugin: {} in {} has a NULL function; continuing without a profiler",
                l.symbol(),
                l.path()
            )));
        }
        l.keep();
        crate::nccl_info!(Subsys::INIT, "PROFILER/Plugin: using {} (v{}) from {}", l.name(), l.version(), l.path());
        Ok(l)
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
        write!(f, "profiler plugin {} (v{}), mask {:#x}", self.lib.name(), self.lib.version(), self.mask)
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
    /// An event a net plugin defines, under the step it moves (`ncclProfileNetPlugin`): the
    /// plugin's event type and version (`id`) and its own descriptor (`data`, an address).
    NetPlugin { id: i64, data: usize },
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
            Descr::NetPlugin { .. } => ncclProfileNetPlugin,
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
                lib.name(),
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
        self.start_under(d, parent.map_or(null_mut(), |e| e.handle))
    }

    /// [`Profiler::start_event`] under the plugin's handle of an open event (or NULL).
    fn start_under(self: &Arc<Self>, d: &Descr, parent: *mut c_void) -> Option<Event> {
        // Descriptors before v3 have no net-plugin member.
        if !self.wants(d.bit()) || matches!(d, Descr::NetPlugin { .. }) && self.lib.version() < 3 {
            return None;
        }
        let mut handle = null_mut();
        // SAFETY: the table is the library's static data and its startEvent was checked non-NULL
        // at load.
        let rc = unsafe { each!(self.lib.table, |t| start((*t).startEvent, self, d, parent, &mut handle)) } as c_int;
        if rc != 0 {
            crate::nccl_trace!(
                Subsys::PROFILE,
                "PROFILER/Plugin {}: startEvent failed with code {rc}",
                self.lib.name()
            );
        }
        (!handle.is_null()).then(|| Event { prof: self.clone(), handle })
    }
}

/// One version's event descriptor, filled from a [`Descr`].
trait EventDescr {
    fn new(p: &Profiler, d: &Descr, parent: *mut c_void) -> Self;
}

/// Implements [`EventDescr`] for the descriptor `$ty`, whose `type_` is a `$kind`. The fields every
/// version has are filled alike; what differs is named: `names` (NCCL's strings, v2 and later) or
/// `indices` (v1) for the function, data type, algorithm and protocol; `comm` (v1 to v3: the
/// communicator's name and hash, `nMaxChannels`, no p2p channels) or `channels` (v4 and later:
/// `nChannels` for both); and, last, the field that names the parent group (v5).
macro_rules! event_descr {
    (@comm comm, $x:expr, $p:ident) => {
        $x.name = $p.name.as_ptr();
        $x.commHash = $p.comm_hash;
    };
    (@comm channels, $x:expr, $p:ident) => {};
    (@coll_channels comm, $x:expr, $n:expr) => {
        $x.nMaxChannels = $n
    };
    (@coll_channels channels, $x:expr, $n:expr) => {
        $x.nChannels = $n
    };
    // v1 to v3's p2p descriptors have no channel count.
    (@p2p_channels comm, $x:expr, $n:expr) => {
        let _ = $n;
    };
    (@p2p_channels channels, $x:expr, $n:expr) => {
        $x.nChannels = $n
    };
    (@func names, $f:expr) => {
        func_name($f).as_ptr()
    };
    (@func indices, $f:expr) => {
        $f as u8
    };
    (@dtype names, $d:expr) => {
        dtype_name($d).as_ptr()
    };
    (@dtype indices, $d:expr) => {
        $d as u8
    };
    (@choice names, $c:expr) => {
        $c.0.as_ptr()
    };
    (@choice indices, $c:expr) => {
        $c.1
    };
    (@net net, $u:expr, $id:expr, $data:expr) => {{
        $u.netPlugin.id = $id;
        $u.netPlugin.data = $data as *mut c_void;
    }};
    (@net none, $u:expr, $id:expr, $data:expr) => {
        unreachable!("no net-plugin event before v3 ({}, {})", $id, $data)
    };
    ($ty:ty, $kind:ty, $enc:ident, $layout:ident, $net:ident $(, $group:ident)?) => {
        impl EventDescr for $ty {
            fn new(p: &Profiler, d: &Descr, parent: *mut c_void) -> Self {
                let mut e = Self { type_: d.bit() as $kind, parentObj: parent, rank: p.rank, ..Default::default() };
                let u = &mut e.__bindgen_anon_1;
                match *d {
                    Descr::Group => {}
                    Descr::Coll { seq, func, send, recv, count, root, dtype, nchannels, nwarps, algo, proto } => {
                        event_descr!(@comm $layout, u.coll, p);
                        u.coll.seqNumber = seq;
                        u.coll.func = event_descr!(@func $enc, func);
                        u.coll.sendBuff = send as *const c_void;
                        u.coll.recvBuff = recv as *mut c_void;
                        u.coll.count = count;
                        u.coll.root = root;
                        u.coll.datatype = event_descr!(@dtype $enc, dtype);
                        event_descr!(@coll_channels $layout, u.coll, nchannels);
                        u.coll.nWarps = nwarps;
                        u.coll.algo = event_descr!(@choice $enc, algo);
                        u.coll.proto = event_descr!(@choice $enc, proto);
                        // The group is the parent (no API events are produced: docs/PLUGINS.md).
                        $(u.coll.$group = parent;)?
                    }
                    Descr::P2p { func, buff, dtype, count, peer, nchannels } => {
                        event_descr!(@comm $layout, u.p2p, p);
                        u.p2p.func = event_descr!(@func $enc, func);
                        u.p2p.buff = buff as *mut c_void;
                        u.p2p.datatype = event_descr!(@dtype $enc, dtype);
                        u.p2p.count = count;
                        u.p2p.peer = peer;
                        event_descr!(@p2p_channels $layout, u.p2p, nchannels);
                        $(u.p2p.$group = parent;)?
                    }
                    Descr::ProxyOp { .. } => u.proxyOp = proxy_op(d),
                    Descr::ProxyStep { step } => u.proxyStep.step = step,
                    Descr::NetPlugin { id, data } => event_descr!(@net $net, u, id, data),
                }
                e
            }
        }
    };
}

event_descr!(ncclProfilerEventDescr_v5_t, u64, names, channels, net, parentGroup);
event_descr!(ncclProfilerEventDescr_v4_t, u8, names, channels, net);
event_descr!(ncclProfilerEventDescr_v3_t, u8, names, comm, net);
event_descr!(ncclProfilerEventDescr_v2_t, u8, names, comm, none);
event_descr!(ncclProfilerEventDescr_v1_t, u8, indices, comm, none);

/// Calls a version's `startEvent` `f` with its descriptor of `d`.
///
/// # Safety
/// `f` is `p`'s plugin's, checked non-NULL at load.
unsafe fn start<E: EventDescr>(
    f: Option<unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut E) -> ncclResult_t>,
    p: &Profiler,
    d: &Descr,
    parent: *mut c_void,
    handle: &mut *mut c_void,
) -> ncclResult_t {
    let mut e = E::new(p, d, parent);
    // SAFETY: per the contract; the descriptor lives for the call and its strings are static or
    // owned by p.
    unsafe { f.expect("checked")(p.ctx, handle, &mut e) }
}

/// One version's state arguments of a proxy step moving `bytes`.
trait StepArgs: Default {
    fn with_bytes(bytes: usize) -> Self;
}

impl StepArgs for ncclProfilerEventStateArgs_v5_t {
    fn with_bytes(bytes: usize) -> Self {
        let mut a = Self::default();
        a.proxyStep.transSize = bytes;
        a
    }
}

/// v1 to v3 (v4 shares v5's).
impl StepArgs for ncclProfilerEventStateArgs_v1_t {
    fn with_bytes(bytes: usize) -> Self {
        let mut a = Self::default();
        a.proxyOp.transSize = bytes;
        a
    }
}

/// Calls a version's `recordEventState` `f` for a proxy step moving `bytes`.
///
/// # Safety
/// `f` is the plugin's, checked non-NULL at load; `handle` came from its startEvent and is not
/// stopped yet.
unsafe fn record<A: StepArgs>(
    f: Option<unsafe extern "C" fn(*mut c_void, ncclProfilerEventState_t, *mut A) -> ncclResult_t>,
    handle: *mut c_void,
    state: ncclProfilerEventState_t,
    bytes: usize,
) -> ncclResult_t {
    let mut a = A::with_bytes(bytes);
    // SAFETY: per the contract; the arguments live for the call.
    unsafe { f.expect("checked")(handle, state, &mut a) }
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
        // stopped yet (this event owns it).
        let rc = unsafe { each!(p.lib.table, |t| record((*t).recordEventState, self.handle, state, bytes)) } as c_int;
        self.recorded(rc);
    }

    /// Traces a failed `recordEventState` (its code `rc`): the event goes on without the state.
    fn recorded(&self, rc: c_int) {
        if rc != 0 {
            crate::nccl_trace!(
                Subsys::PROFILE,
                "PROFILER/Plugin {}: recordEventState failed with code {rc}",
                self.prof.lib.name()
            );
        }
    }

    /// Records a net plugin's update of its event (`ncclProfilerNetPluginUpdate`) with the
    /// plugin's `data`; state arguments before v4 have no net-plugin member, so nothing there.
    pub fn record_net_update(&self, data: *mut c_void) {
        let mut v5 = ncclProfilerEventStateArgs_v5_t::default();
        v5.netPlugin.data = data;
        let state = ncclProfilerNetPluginUpdate;
        // SAFETY: as in record_step; v4's arguments are v5's type.
        let rc = unsafe {
            match self.prof.lib.table {
                Table::V5(t) => (*t).recordEventState.expect("checked")(self.handle, state, &mut v5),
                Table::V4(t) => (*t).recordEventState.expect("checked")(self.handle, state, &mut v5),
                Table::V3(_) | Table::V2(_) | Table::V1(_) => return,
            }
        } as c_int;
        self.recorded(rc);
    }

    /// This event as the parent of events that other code starts while it is open.
    pub fn as_parent(&self) -> Parent {
        Parent { prof: self.prof.clone(), handle: self.handle }
    }

    pub fn profiler(&self) -> &Arc<Profiler> {
        &self.prof
    }
}

/// An open event, for starting child events under it away from its owner (a net plugin's, on
/// whatever thread the plugin calls back on). Its handle is the plugin's; it stays valid while
/// the event is open, which the holder guarantees (a step outlives the requests that move it).
#[derive(Clone)]
pub struct Parent {
    prof: Arc<Profiler>,
    handle: *mut c_void,
}

// SAFETY: as for Event: the handle is the plugin's, passed back to it from any thread.
unsafe impl Send for Parent {}
// SAFETY: as above.
unsafe impl Sync for Parent {}

impl Parent {
    /// Starts a net plugin's event of type and version `id`, with its descriptor `data`, under
    /// this one; `None` where the plugin does not want such events or its version has none.
    pub fn start_net_plugin(&self, id: i64, data: *mut c_void) -> Option<Event> {
        self.prof.start_under(&Descr::NetPlugin { id, data: data as usize }, self.handle)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: every table's stopEvent has the same signature at the same offset; checked
        // non-NULL at load; the handle came from startEvent and is stopped once.
        let rc = unsafe { each!(self.prof.lib.table, |t| (*t).stopEvent.expect("checked")(self.handle)) } as c_int;
        if rc != 0 {
            crate::nccl_trace!(
                Subsys::PROFILE,
                "PROFILER/Plugin {}: stopEvent failed with code {rc}",
                self.prof.lib.name()
            );
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        // SAFETY: as in Event's drop; ctx came from init and is finalized once, after every event
        // (each holds this profiler).
        let rc = unsafe { each!(self.lib.table, |t| (*t).finalize.expect("checked")(self.ctx)) } as c_int;
        if rc != 0 {
            crate::nccl_warn!("PROFILER/Plugin {}: finalize failed with code {rc}", self.lib.name());
        }
    }
}
