//! External net plugins, found and loaded as NCCL 2.28 loads them (`docs/NET.md`): the libraries
//! of `NCCL_NET_PLUGIN` are found by the plugin loader ([`crate::plugin`], [`NET_PLUGINS`]); in
//! each, the tables `ncclNetPlugin_v11` down to `_v8` are looked up newest first, and the calls
//! of older tables are adapted to v11's semantics here. The comms are in [`comm`], the logger
//! handed to plugins in [`crate::plugin::logger`].
//!
//! A library is never unloaded once its `init` succeeded: comms and requests hold its function
//! pointers, and a plugin may keep threads running until the process exits.

mod comm;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::Arc;

use parking_lot::Mutex;

use super::abi::*;
use super::{Connecting, Handle, Listener, Net, Properties, MAX_RECVS};
use crate::debug::Subsys;
use crate::error::{Error, Result};
use crate::plugin::logger::logger;
use crate::plugin::profiler::{Event, Parent};
use crate::plugin::{self, Library, Loaded, Versions};
use comm::{PluginConnecting, PluginListen};

crate::str_param!(
    /// `NCCL_NET_PLUGIN`: the net plugin libraries to try, comma-separated, or `none`.
    net_plugin_env, "NCCL_NET_PLUGIN"
);

/// How net plugins are found: `NCCL_NET_PLUGIN`, `libnccl-net-<name>.so`, `libnccl-net.so`.
pub const NET_PLUGINS: plugin::Kind = plugin::Kind {
    var: "NCCL_NET_PLUGIN",
    kind: "net",
    default: "libnccl-net.so",
    label: "NET/Plugin",
    subsys: Subsys::NET,
    list: true,
};

plugin::versions!(
    /// The net tables, looked up newest first.
    Table,
    "ncclNetPlugin_v",
    V11(ncclNet_v11_t) = 11,
    V10(ncclNet_v10_t) = 10,
    V9(ncclNet_v9_t) = 9,
    V8(ncclNet_v8_t) = 8,
);

/// An opened net plugin library and the table it exports, before `init`.
pub type PluginLib = Loaded<Table>;

impl PluginLib {
    /// Opens one entry of the list (see [`Library::open`]); a library that exports no net
    /// table is an error naming it.
    pub fn open(entry: &str) -> Result<Option<PluginLib>> {
        let Some(lib) = Library::open(&NET_PLUGINS, entry)? else { return Ok(None) };
        let lib = PluginLib::find(&NET_PLUGINS, lib, "trying the next net")?;
        crate::nccl_info!(
            Subsys::INIT | Subsys::NET,
            "NET/Plugin: loaded net plugin {} (v{}) from {}",
            lib.name(),
            lib.version(),
            lib.path()
        );
        Ok(Some(lib))
    }
}

/// Tables of plugins older than v11 are initialized once per process, as NCCL's adapters do.
static OLD_INITED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// A plugin after a successful `init` and `devices`: one per communicator context (v11), or
/// sharing the process-wide state of an older plugin.
pub struct PluginNet {
    inner: Arc<Inner>,
    ndev: usize,
}

struct Inner {
    lib: PluginLib,
    ctx: *mut c_void,
    config: Box<ncclNetCommConfig_v10_t>,
}

// SAFETY: see PluginLib; `ctx` is the plugin's per-comm context, which NCCL also hands to the
// plugin from several threads.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Table::V11(t) = self.lib.table {
            // SAFETY: t is the library's live table; ctx came from its init.
            if let Some(f) = unsafe { (*t).finalize } {
                // SAFETY: finalize takes the context init returned, once.
                unsafe { f(self.ctx) };
            }
        }
        // Keep the library mapped: see the module docs.
        self.lib.keep();
    }
}

/// Calls a table entry that has the same signature in every version; a NULL entry is an error
/// naming the symbol and field.
macro_rules! call {
    ($lib:expr, $field:ident ( $($arg:expr),* )) => {{
        let lib: &$crate::transport::net::plugin::PluginLib = $lib;
        // SAFETY: the table pointer stays valid while the library is loaded (forever once
        // initialized); the arguments follow the plugin ABI of net_plugin_abi.h.
        let f = unsafe {
            match lib.table {
                $crate::transport::net::plugin::Table::V11(t) => (*t).$field,
                $crate::transport::net::plugin::Table::V10(t) => (*t).$field,
                $crate::transport::net::plugin::Table::V9(t) => (*t).$field,
                $crate::transport::net::plugin::Table::V8(t) => (*t).$field,
            }
        };
        match f {
            // SAFETY: as above; each caller documents its arguments.
            Some(f) => $crate::transport::net::plugin::check(lib, stringify!($field), unsafe { f($($arg),*) }),
            None => Err($crate::transport::net::plugin::missing(lib, stringify!($field))),
        }
    }};
}

use call;

fn missing(lib: &PluginLib, field: &str) -> Error {
    Error::System(format!("NET/Plugin {}: {} in {} has no {field} function", lib.name(), lib.symbol(), lib.path()))
}

/// Maps a plugin's return code to our error, naming the plugin and call.
fn check(lib: &PluginLib, what: &str, rc: ncclResult_t) -> Result<()> {
    // Any integer a plugin returns is read as C's `int`, so that the message shows a negative one.
    let rc = rc as c_int;
    if rc == 0 {
        return Ok(());
    }
    Err(plugin::error_for(rc, format!("NET/Plugin {} ({}): {what} failed with code {rc}", lib.name(), lib.path())))
}

impl PluginNet {
    /// Runs the plugin's `init` and `devices` for the communicator `comm_id` (v11 keeps a
    /// context per communicator); an error names the file and symbol.
    pub fn init(lib: PluginLib, comm_id: u64, traffic_class: Option<i32>) -> Result<PluginNet> {
        let mut config =
            Box::new(ncclNetCommConfig_v10_t { trafficClass: traffic_class.unwrap_or(NCCL_NET_TRAFFIC_CLASS_UNDEF) });
        let mut ctx = null_mut();
        let log = logger();
        let who = format!("{} ({} in {})", lib.name(), lib.symbol(), lib.path());
        let fail = |what: &str| Error::System(format!("NET/Plugin: {who} {what}; trying the next net"));
        // SAFETY: the tables are the plugin's static data; the init signatures are those of
        // each version (net_plugin_abi.h); config and ctx outlive the call.
        let rc = unsafe {
            match lib.table {
                Table::V11(t) => (*t).init.map(|f| f(&mut ctx, comm_id, &mut *config, log, Some(net_events))),
                old => {
                    let mut done = OLD_INITED.lock();
                    if done.contains(&(old.ptr() as usize)) {
                        Some(0)
                    } else {
                        let rc = match old {
                            Table::V10(t) => (*t).init.map(|f| f(log, Some(net_events))),
                            Table::V9(t) => (*t).init.map(|f| f(log)),
                            Table::V8(t) => (*t).init.map(|f| f(log)),
                            Table::V11(_) => unreachable!(),
                        };
                        if rc == Some(0) {
                            done.push(old.ptr() as usize);
                        }
                        rc
                    }
                }
            }
        };
        // Read as C's `int`, as `check` does.
        match rc.map(|rc| rc as c_int) {
            None => return Err(fail("has no init function")),
            Some(0) => {}
            Some(rc) => return Err(fail(&format!("init failed with code {rc}"))),
        }
        let inner = Arc::new(Inner { lib, ctx, config });
        let mut n: c_int = 0;
        call!(&inner.lib, devices(&mut n)).map_err(|e| fail(&e.to_string()))?;
        if n <= 0 {
            return Err(fail(&format!("reports {n} devices")));
        }
        for f in [
            "getProperties",
            "listen",
            "connect",
            "accept",
            "regMr",
            "deregMr",
            "isend",
            "irecv",
            "test",
            "closeSend",
            "closeRecv",
            "closeListen",
        ] {
            if !inner.has(f) {
                return Err(fail(&format!("has no {f} function")));
            }
        }
        crate::nccl_info!(
            Subsys::INIT | Subsys::NET,
            "NET/Plugin: initialized {} (v{}), {n} devices",
            inner.lib.name(),
            inner.lib.version()
        );
        Ok(PluginNet { inner, ndev: n as usize })
    }

    pub fn path(&self) -> &str {
        self.inner.lib.path()
    }

    pub fn version(&self) -> u32 {
        self.inner.lib.version()
    }
}

impl Inner {
    /// Whether the plugin's table fills `field` (the functions every version has).
    fn has(&self, field: &str) -> bool {
        macro_rules! any {
            ($t:expr) => {
                any!($t; getProperties, listen, connect, accept, regMr, deregMr, isend, irecv, test,
                     closeSend, closeRecv, closeListen, iflush)
            };
            ($t:expr; $($f:ident),*) => {
                // SAFETY: the table is live (see `call!`).
                unsafe { match field { $(stringify!($f) => (*$t).$f.is_some(),)* _ => false } }
            };
        }
        match self.lib.table {
            Table::V11(t) => any!(t),
            Table::V10(t) => any!(t),
            Table::V9(t) => any!(t),
            Table::V8(t) => any!(t),
        }
    }
}

fn c_str(p: *const c_char) -> Option<String> {
    // SAFETY: plugins report NUL-terminated strings (or NULL) that live as long as the plugin.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

impl Net for PluginNet {
    fn name(&self) -> &str {
        self.inner.lib.name()
    }

    fn devices(&self) -> usize {
        self.ndev
    }

    fn properties(&self, dev: usize) -> Result<Properties> {
        if dev >= self.ndev {
            return Err(Error::InvalidArgument(format!(
                "net device {dev} out of range (the plugin has {})",
                self.ndev
            )));
        }
        let d = dev as c_int;
        let lib = &self.inner.lib;
        let clamp = |r: c_int| (r.max(1) as usize).min(MAX_RECVS);
        // v9 to v11 share the fields we read (v11 adds others), so one conversion serves them.
        macro_rules! from_v9_or_later {
            ($p:expr) => {
                Properties {
                    name: c_str($p.name).unwrap_or_default(),
                    pci_path: c_str($p.pciPath),
                    guid: $p.guid,
                    ptr_support: $p.ptrSupport,
                    reg_is_global: $p.regIsGlobal != 0,
                    force_flush: $p.forceFlush != 0,
                    speed_mbps: $p.speed,
                    port: $p.port,
                    latency_us: $p.latency,
                    max_comms: $p.maxComms,
                    max_recvs: clamp($p.maxRecvs),
                    max_p2p_bytes: $p.maxP2pBytes,
                    max_coll_bytes: $p.maxCollBytes,
                }
            };
        }
        // SAFETY: in each arm, getProperties fills the struct of its version; zeroed is a valid
        // starting value for these plain-data structs.
        let p = unsafe {
            match lib.table {
                Table::V11(t) => {
                    let mut p: ncclNetProperties_v11_t = std::mem::zeroed();
                    check(lib, "getProperties", (*t).getProperties.unwrap()(d, &mut p))?;
                    from_v9_or_later!(p)
                }
                Table::V10(_) | Table::V9(_) => {
                    let mut p: ncclNetProperties_v9_t = std::mem::zeroed();
                    let f = match lib.table {
                        Table::V10(t) => (*t).getProperties,
                        Table::V9(t) => (*t).getProperties,
                        _ => unreachable!(),
                    };
                    check(lib, "getProperties", f.unwrap()(d, &mut p))?;
                    from_v9_or_later!(p)
                }
                Table::V8(t) => {
                    let mut p: ncclNetProperties_v8_t = std::mem::zeroed();
                    check(lib, "getProperties", (*t).getProperties.unwrap()(d, &mut p))?;
                    Properties {
                        name: c_str(p.name).unwrap_or_default(),
                        pci_path: c_str(p.pciPath),
                        guid: p.guid,
                        ptr_support: p.ptrSupport,
                        reg_is_global: p.regIsGlobal != 0,
                        force_flush: false,
                        speed_mbps: p.speed,
                        port: p.port,
                        latency_us: p.latency,
                        max_comms: p.maxComms,
                        max_recvs: clamp(p.maxRecvs),
                        max_p2p_bytes: MAX_NET_SIZE,
                        max_coll_bytes: MAX_COLLNET_SIZE,
                    }
                }
            }
        };
        Ok(p)
    }

    fn listen(&self, dev: usize) -> Result<(Handle, Box<dyn Listener>)> {
        if dev >= self.ndev {
            return Err(Error::InvalidArgument(format!(
                "net device {dev} out of range (the plugin has {})",
                self.ndev
            )));
        }
        let mut handle = [0u8; super::HANDLE_BYTES];
        let mut comm: *mut c_void = null_mut();
        let (h, c) = (handle.as_mut_ptr().cast(), &mut comm as *mut *mut c_void);
        let lib = &self.inner.lib;
        // SAFETY: handle holds NCCL_NET_HANDLE_MAXSIZE bytes, comm receives the listen comm.
        let rc = unsafe {
            match lib.table {
                Table::V11(t) => (*t).listen.unwrap()(self.inner.ctx, dev as c_int, h, c),
                Table::V10(t) => (*t).listen.unwrap()(dev as c_int, h, c),
                Table::V9(t) => (*t).listen.unwrap()(dev as c_int, h, c),
                Table::V8(t) => (*t).listen.unwrap()(dev as c_int, h, c),
            }
        };
        check(lib, "listen", rc)?;
        if comm.is_null() {
            return Err(Error::System(format!(
                "NET/Plugin {}: listen succeeded but returned no listen comm",
                lib.name()
            )));
        }
        // Grouped receives are bounded by what the device says it takes.
        let max_recvs = self.properties(dev)?.max_recvs;
        Ok((handle, Box::new(PluginListen { inner: self.inner.clone(), comm, max_recvs })))
    }

    fn connect(&self, dev: usize, handle: &Handle) -> Result<Box<dyn Connecting>> {
        if dev >= self.ndev {
            return Err(Error::InvalidArgument(format!(
                "net device {dev} out of range (the plugin has {})",
                self.ndev
            )));
        }
        Ok(Box::new(PluginConnecting { inner: self.inner.clone(), dev: dev as c_int, handle: Box::new(*handle) }))
    }
}

/// The profiler callback handed to v10+ plugins (NCCL's `ncclProfilerCallback`): a plugin starts
/// an event of its own under the proxy step a request moves (`p`, the request's pHandle: a
/// [`Parent`] the comm keeps until the request completes, or NULL where no profiler wants net
/// events), updates it with its own data and stops it. Never unwinds into the plugin.
unsafe extern "C" fn net_events(
    e_handle: *mut *mut c_void,
    kind: c_int,
    p: *mut c_void,
    id: i64,
    ext: *mut c_void,
) -> ncclResult_t {
    if e_handle.is_null() {
        return ncclInvalidArgument;
    }
    let run = || {
        // SAFETY: a non-NULL event-handle pointer from the plugin is readable and writable; a
        // non-NULL handle in it is one this callback wrote from Box::into_raw and has not freed.
        unsafe {
            let kind = kind as u32;
            if kind == ncclProfilerNetEventStart {
                *e_handle = null_mut();
                // SAFETY (of the cast): a non-NULL pHandle is the Parent the comm passed with the
                // request, alive until the request completes.
                if let Some(ev) = (p as *const Parent).as_ref().and_then(|parent| parent.start_net_plugin(id, ext)) {
                    *e_handle = Box::into_raw(Box::new(ev)).cast();
                }
                return;
            }
            let ev = *e_handle as *mut Event;
            if ev.is_null() {
                return;
            }
            if kind == ncclProfilerNetEventUpdate || kind == ncclProfilerNetEventUpdateAndStop {
                (*ev).record_net_update(ext);
            }
            if kind == ncclProfilerNetEventStop || kind == ncclProfilerNetEventUpdateAndStop {
                // Stops the event (Event's drop).
                drop(Box::from_raw(ev));
                *e_handle = null_mut();
            }
        }
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(()) => ncclSuccess,
        Err(_) => ncclInternalError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_plugin_is_not_an_error() {
        assert!(PluginLib::open("ferronickel-no-such-plugin").unwrap().is_none());
    }
}
