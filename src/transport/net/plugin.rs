//! External net plugins, found and loaded as NCCL 2.28 loads them (`docs/NET.md`):
//! `NCCL_NET_PLUGIN` names a comma list of libraries (`none`: no plugin), each tried as given
//! with `dlopen(RTLD_NOW | RTLD_LOCAL)` and then as `libnccl-net-<name>.so`; unset, the list is
//! `libnccl-net.so`. In each library the tables `ncclNetPlugin_v11` down to `_v8` are looked up
//! newest first, and the calls of older tables are adapted to v11's semantics here.
//!
//! A library is never unloaded once its `init` succeeded: comms and requests hold its function
//! pointers, and a plugin may keep threads running until the process exits.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::ptr::null_mut;
use std::sync::Arc;

use parking_lot::Mutex;

use super::abi::*;
use super::{
    check_recv, Connecting, Handle, Listener, MemHandle, Net, Properties, PtrKind, RecvBuf, RecvComm, Request,
    SendComm, MAX_RECVS,
};
use crate::debug::{Level, Subsys};
use crate::error::{Error, Result};

crate::str_param!(
    /// `NCCL_NET_PLUGIN`: the net plugin libraries to try, comma-separated, or `none`.
    net_plugin_env, "NCCL_NET_PLUGIN"
);

/// The default library NCCL tries when `NCCL_NET_PLUGIN` is unset.
pub const DEFAULT_PLUGIN: &str = "libnccl-net.so";
/// NCCL keeps 16 nets per process, two of them built in.
const MAX_LISTED: usize = 14;

/// The libraries to try, in order, for a value of `NCCL_NET_PLUGIN`.
pub fn candidates(env: Option<&str>) -> Vec<String> {
    match env.map(str::trim) {
        None => vec![DEFAULT_PLUGIN.to_string()],
        Some(v) if v.eq_ignore_ascii_case("none") => Vec::new(),
        Some(v) => {
            let list: Vec<String> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
            if list.len() > MAX_LISTED {
                crate::nccl_info!(
                    Subsys::NET | Subsys::ENV,
                    "NCCL_NET_PLUGIN lists {} plugins; trying the first {MAX_LISTED}",
                    list.len()
                );
            }
            list.into_iter().take(MAX_LISTED).collect()
        }
    }
}

/// The file names one list entry is tried as: the entry itself, then, for a bare name that
/// is neither a path nor a `lib*.so` file name, `libnccl-net-<name>.so`.
pub fn file_names(entry: &str) -> Vec<String> {
    let mut v = vec![entry.to_string()];
    let is_file_name = entry.starts_with("lib") && entry.ends_with(".so");
    if !entry.contains('/') && !is_file_name {
        v.push(format!("libnccl-net-{entry}.so"));
    }
    v
}

/// Which table a library exports.
#[derive(Clone, Copy)]
enum Table {
    V11(*const ncclNet_v11_t),
    V10(*const ncclNet_v10_t),
    V9(*const ncclNet_v9_t),
    V8(*const ncclNet_v8_t),
}

/// An opened plugin library, before `init`.
pub struct PluginLib {
    dl: *mut c_void,
    path: String,
    name: String,
    table: Table,
}

// SAFETY: the dlopen handle and the plugin's static table are process-wide and immutable; the
// plugin's own functions are called as NCCL calls them, from any thread.
unsafe impl Send for PluginLib {}
// SAFETY: as above; nothing in PluginLib is mutated after open.
unsafe impl Sync for PluginLib {}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call
    // on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

impl PluginLib {
    /// Opens one entry of the list. `Ok(None)`: no such file (an INFO line, as NCCL); `Err`: the
    /// file exists but cannot be used (the caller WARNs and tries the next entry).
    pub fn open(entry: &str) -> Result<Option<PluginLib>> {
        let mut missing = Vec::new();
        for file in file_names(entry) {
            let c = CString::new(file.clone())
                .map_err(|_| Error::InvalidArgument(format!("NCCL_NET_PLUGIN entry {file:?} holds a NUL byte")))?;
            // SAFETY: c is a valid NUL-terminated string; the flags are the ones NCCL uses.
            let dl = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if dl.is_null() {
                let why = dlerror();
                // As NCCL: only a message about this very file means it is not there; a
                // missing dependency of an existing plugin is a real failure.
                if why.contains("No such file or directory") && why.starts_with(&format!("{file}:")) {
                    missing.push(file);
                    continue;
                }
                return Err(Error::System(format!("NET/Plugin: cannot load {file}: {why}; trying the next net")));
            }
            return Self::from_handle(dl, file).map(Some);
        }
        crate::nccl_info!(Subsys::INIT | Subsys::NET, "NET/Plugin: could not find {}", missing.join(" or "));
        Ok(None)
    }

    fn from_handle(dl: *mut c_void, file: String) -> Result<PluginLib> {
        let sym = |name: &str| {
            let c = CString::new(name).expect("symbol names hold no NUL");
            // SAFETY: dl is a live handle from dlopen; c is NUL-terminated.
            unsafe { libc::dlsym(dl, c.as_ptr()) }
        };
        let path = loaded_path(dl).unwrap_or_else(|| file.clone());
        let found = [11, 10, 9, 8].into_iter().find_map(|v| {
            let p = sym(&format!("ncclNetPlugin_v{v}"));
            (!p.is_null()).then_some((v, p))
        });
        let table = match found {
            Some((11, p)) => Table::V11(p.cast()),
            Some((10, p)) => Table::V10(p.cast()),
            Some((9, p)) => Table::V9(p.cast()),
            Some((_, p)) => Table::V8(p.cast()),
            None => {
                // SAFETY: dl came from dlopen and nothing from it is kept.
                unsafe { libc::dlclose(dl) };
                return Err(Error::System(format!(
                    "NET/Plugin: {path} exports none of the symbols ncclNetPlugin_v11, ncclNetPlugin_v10, \
                     ncclNetPlugin_v9, ncclNetPlugin_v8; trying the next net"
                )));
            }
        };
        // SAFETY: every table version starts with `const char* name`; the table is the
        // plugin's static data, valid while the library is loaded.
        let name_ptr = unsafe { *(table_ptr(table) as *const *const c_char) };
        let name = if name_ptr.is_null() {
            String::from("(unnamed)")
        } else {
            // SAFETY: a plugin's name is a NUL-terminated static string.
            unsafe { CStr::from_ptr(name_ptr) }.to_string_lossy().into_owned()
        };
        let lib = PluginLib { dl, path, name, table };
        crate::nccl_info!(
            Subsys::INIT | Subsys::NET,
            "NET/Plugin: loaded net plugin {} (v{}) from {}",
            lib.name,
            lib.version(),
            lib.path
        );
        Ok(lib)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn version(&self) -> u32 {
        match self.table {
            Table::V11(_) => 11,
            Table::V10(_) => 10,
            Table::V9(_) => 9,
            Table::V8(_) => 8,
        }
    }

    fn symbol(&self) -> String {
        format!("ncclNetPlugin_v{}", self.version())
    }
}

impl Drop for PluginLib {
    fn drop(&mut self) {
        // Only a library whose init never ran is closed (Inner clears `dl` of the others).
        if !self.dl.is_null() {
            // SAFETY: dl came from dlopen and is closed once.
            unsafe { libc::dlclose(self.dl) };
        }
    }
}

fn table_ptr(t: Table) -> *const c_void {
    match t {
        Table::V11(p) => p.cast(),
        Table::V10(p) => p.cast(),
        Table::V9(p) => p.cast(),
        Table::V8(p) => p.cast(),
    }
}

/// The file the loader actually mapped, for messages.
fn loaded_path(dl: *mut c_void) -> Option<String> {
    let mut map: *mut libc::c_void = null_mut();
    // SAFETY: RTLD_DI_LINKMAP writes a `struct link_map*` for a live handle; l_name is the
    // second field, after l_addr, and points to a NUL-terminated string owned by the loader.
    unsafe {
        if libc::dlinfo(dl, libc::RTLD_DI_LINKMAP, (&mut map as *mut *mut c_void).cast()) != 0 || map.is_null() {
            return None;
        }
        let name = *(map as *const *const c_char).add(1);
        (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned())
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
        self.lib.dl = null_mut();
    }
}

/// Calls a table entry that has the same signature in every version; a NULL entry is an error
/// naming the symbol and field.
macro_rules! call {
    ($lib:expr, $field:ident ( $($arg:expr),* )) => {{
        let lib: &PluginLib = $lib;
        // SAFETY: the table pointer stays valid while the library is loaded (forever once
        // initialized); the arguments follow the plugin ABI of net_plugin_abi.h.
        let f = unsafe {
            match lib.table {
                Table::V11(t) => (*t).$field,
                Table::V10(t) => (*t).$field,
                Table::V9(t) => (*t).$field,
                Table::V8(t) => (*t).$field,
            }
        };
        match f {
            // SAFETY: as above; each caller documents its arguments.
            Some(f) => check(lib, stringify!($field), unsafe { f($($arg),*) }),
            None => Err(missing(lib, stringify!($field))),
        }
    }};
}

fn missing(lib: &PluginLib, field: &str) -> Error {
    Error::System(format!("NET/Plugin {}: {} in {} has no {field} function", lib.name, lib.symbol(), lib.path))
}

/// Maps a plugin's return code to our error, naming the plugin and call.
fn check(lib: &PluginLib, what: &str, rc: c_int) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    let msg = format!("NET/Plugin {} ({}): {what} failed with code {rc}", lib.name, lib.path);
    Err(match rc {
        1 => Error::Cuda(msg),
        3 => Error::Internal(msg),
        4 => Error::InvalidArgument(msg),
        5 => Error::InvalidUsage(msg),
        6 => Error::Remote(msg),
        _ => Error::System(msg),
    })
}

impl PluginNet {
    /// Runs the plugin's `init` and `devices` for the communicator `comm_id` (v11 keeps a
    /// context per communicator); an error names the file and symbol.
    pub fn init(lib: PluginLib, comm_id: u64, traffic_class: Option<i32>) -> Result<PluginNet> {
        let mut config =
            Box::new(ncclNetCommConfig_v10_t { trafficClass: traffic_class.unwrap_or(NCCL_NET_TRAFFIC_CLASS_UNDEF) });
        let mut ctx = null_mut();
        let log = logger();
        let who = format!("{} ({} in {})", lib.name, lib.symbol(), lib.path);
        let fail = |what: &str| Error::System(format!("NET/Plugin: {who} {what}; trying the next net"));
        // SAFETY: the tables are the plugin's static data; the init signatures are those of
        // each version (net_plugin_abi.h); config and ctx outlive the call.
        let rc = unsafe {
            match lib.table {
                Table::V11(t) => (*t).init.map(|f| f(&mut ctx, comm_id, &mut *config, log, no_profiler)),
                old => {
                    let mut done = OLD_INITED.lock();
                    if done.contains(&(table_ptr(old) as usize)) {
                        Some(0)
                    } else {
                        let rc = match old {
                            Table::V10(t) => (*t).init.map(|f| f(log, no_profiler)),
                            Table::V9(t) => (*t).init.map(|f| f(log)),
                            Table::V8(t) => (*t).init.map(|f| f(log)),
                            Table::V11(_) => unreachable!(),
                        };
                        if rc == Some(0) {
                            done.push(table_ptr(old) as usize);
                        }
                        rc
                    }
                }
            }
        };
        match rc {
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
            inner.lib.name,
            inner.lib.version()
        );
        Ok(PluginNet { inner, ndev: n as usize })
    }

    pub fn path(&self) -> &str {
        &self.inner.lib.path
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
        &self.inner.lib.name
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
                lib.name
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

struct PluginListen {
    inner: Arc<Inner>,
    comm: *mut c_void,
    max_recvs: usize,
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
            Box::new(PluginComm { inner: self.inner.clone(), comm: rc, send: false, max_recvs, nbufs: HashMap::new() })
                as Box<dyn RecvComm>
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

struct PluginConnecting {
    inner: Arc<Inner>,
    dev: c_int,
    /// The plugin may keep its connection state inside the handle between calls, as NCCL's
    /// socket net does, so the same buffer is passed every time.
    handle: Box<Handle>,
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
        }
        r?;
        Ok((done != 0).then(|| sizes[..n].iter().map(|&s| s.max(0) as usize).collect()))
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

    unsafe fn isend(&mut self, data: *const u8, size: usize, tag: i32, mr: &MemHandle) -> Result<Option<Request>> {
        if data.is_null() && size > 0 {
            return Err(Error::InvalidArgument(format!("isend: NULL buffer of {size} bytes")));
        }
        let lib = &self.inner.lib;
        let mut req: *mut c_void = null_mut();
        let (c, d, m, r) = (self.comm, data as *mut c_void, mr.0 as *mut c_void, &mut req as *mut *mut c_void);
        // SAFETY: the caller keeps the buffer valid (trait contract); the arguments follow each
        // version's isend; v8 takes an int size, so larger sends are refused first.
        let rc = unsafe {
            match lib.table {
                Table::V11(t) => (*t).isend.unwrap()(c, d, size, tag, m, null_mut(), r),
                Table::V10(t) => (*t).isend.unwrap()(c, d, size, tag, m, null_mut(), r),
                Table::V9(t) => (*t).isend.unwrap()(c, d, size, tag, m, r),
                Table::V8(t) => {
                    if size > MAX_NET_SIZE {
                        return Err(Error::InvalidArgument(format!(
                            "isend of {size} bytes: a v8 plugin ({}) takes at most {MAX_NET_SIZE}",
                            lib.name
                        )));
                    }
                    (*t).isend.unwrap()(c, d, size as c_int, tag, m, r)
                }
            }
        };
        check(lib, "isend", rc)?;
        Ok((!req.is_null()).then_some(Request(req as usize)))
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

    unsafe fn irecv(&mut self, bufs: &[RecvBuf], mrs: &[&MemHandle]) -> Result<Option<Request>> {
        check_recv(bufs, mrs, self.max_recvs)?;
        let lib = &self.inner.lib;
        let n = bufs.len();
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| b.data.cast()).collect();
        let mut sizes: Vec<usize> = bufs.iter().map(|b| b.size).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.tag).collect();
        let mut mh: Vec<*mut c_void> = mrs.iter().map(|m| m.0 as *mut c_void).collect();
        let mut ph: Vec<*mut c_void> = vec![null_mut(); n];
        let mut req: *mut c_void = null_mut();
        let (c, ni, d, t, m, r) =
            (self.comm, n as c_int, data.as_mut_ptr(), tags.as_mut_ptr(), mh.as_mut_ptr(), &mut req as *mut _);
        // SAFETY: all arrays hold n entries and live through the call; buffers stay valid per
        // the trait contract; v8 takes int sizes, so larger receives are refused first.
        let rc = unsafe {
            match lib.table {
                Table::V11(tb) => (*tb).irecv.unwrap()(c, ni, d, sizes.as_mut_ptr(), t, m, ph.as_mut_ptr(), r),
                Table::V10(tb) => (*tb).irecv.unwrap()(c, ni, d, sizes.as_mut_ptr(), t, m, ph.as_mut_ptr(), r),
                Table::V9(tb) => (*tb).irecv.unwrap()(c, ni, d, sizes.as_mut_ptr(), t, m, r),
                Table::V8(tb) => {
                    if let Some(b) = bufs.iter().find(|b| b.size > MAX_NET_SIZE) {
                        return Err(Error::InvalidArgument(format!(
                            "irecv of {} bytes: a v8 plugin ({}) takes at most {MAX_NET_SIZE}",
                            b.size, lib.name
                        )));
                    }
                    let mut s8: Vec<c_int> = sizes.iter().map(|&s| s as c_int).collect();
                    (*tb).irecv.unwrap()(c, ni, d, s8.as_mut_ptr(), t, m, r)
                }
            }
        };
        check(lib, "irecv", rc)?;
        if req.is_null() {
            return Ok(None);
        }
        self.nbufs.insert(req as usize, n);
        Ok(Some(Request(req as usize)))
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

// ---------------------------------------------------------------------------------------------
// The logger handed to plugins

/// Writes a plugin's log line through our log, formatted by the C library's `vsnprintf`.
// `c_ulong` is 32 bits on some targets, so the casts to u64 are not always no-ops.
#[allow(clippy::unnecessary_cast)]
extern "C" fn log_va(
    level: c_int,
    flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    fmt: *const c_char,
    ap: *mut c_void,
) {
    let _ = std::panic::catch_unwind(|| {
        let lvl = match level {
            0 => return,
            1..=3 => {
                if level == 2 {
                    Level::Warn
                } else {
                    Level::Info
                }
            }
            4 => Level::Warn,
            _ => Level::Trace,
        };
        if fmt.is_null() || !crate::debug::enabled(lvl, flags as u64) {
            return;
        }
        let mut buf = [0 as c_char; 1024];
        // SAFETY: buf is writable for its length; fmt is the plugin's format string and ap the
        // va_list the trampoline built from the plugin's variadic call.
        let n = unsafe { vsnprintf(buf.as_mut_ptr(), buf.len(), fmt, ap) };
        if n < 0 {
            return;
        }
        // SAFETY: vsnprintf NUL-terminates within buf.
        let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
        crate::debug::log(lvl, flags as u64, msg.trim_end());
    });
}

/// C functions declared for this module; kept out of nccl.h.
/// cbindgen:ignore
mod c {
    use std::ffi::{c_char, c_int, c_ulong, c_void};

    extern "C" {
        pub fn vsnprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ap: *mut c_void) -> c_int;
        /// The trampoline below (x86-64 only).
        #[cfg(target_arch = "x86_64")]
        pub fn ferronickel_net_plugin_logger(
            level: c_int,
            flags: c_ulong,
            file: *const c_char,
            line: c_int,
            fmt: *const c_char,
            ...
        );
    }
}
use c::vsnprintf;

// The C logger is variadic, which stable Rust cannot define. On x86-64 this trampoline spills
// the argument registers into a System V `va_list` register save area (6 integer registers,
// then 8 vector registers), points the `va_list` at it and at the caller's stack arguments,
// and passes it as a sixth argument to `log_va`: exactly what a C variadic prologue does.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl ferronickel_net_plugin_logger",
    ".hidden ferronickel_net_plugin_logger",
    ".type ferronickel_net_plugin_logger,@function",
    "ferronickel_net_plugin_logger:",
    "push rbp",
    "mov rbp, rsp",
    // 176 bytes of register save area + 24 of va_list, rounded to keep rsp 16-byte aligned.
    "sub rsp, 208",
    "mov [rsp], rdi",
    "mov [rsp+8], rsi",
    "mov [rsp+16], rdx",
    "mov [rsp+24], rcx",
    "mov [rsp+32], r8",
    "mov [rsp+40], r9",
    "movaps [rsp+48], xmm0",
    "movaps [rsp+64], xmm1",
    "movaps [rsp+80], xmm2",
    "movaps [rsp+96], xmm3",
    "movaps [rsp+112], xmm4",
    "movaps [rsp+128], xmm5",
    "movaps [rsp+144], xmm6",
    "movaps [rsp+160], xmm7",
    // va_list: gp_offset = 40 (five named integer arguments), fp_offset = 48 (none named),
    // overflow_arg_area = the caller's stack arguments, reg_save_area = rsp.
    "mov dword ptr [rsp+176], 40",
    "mov dword ptr [rsp+180], 48",
    "lea rax, [rbp+16]",
    "mov [rsp+184], rax",
    "mov [rsp+192], rsp",
    "lea r9, [rsp+176]",
    "call {log}",
    "leave",
    "ret",
    ".size ferronickel_net_plugin_logger, .-ferronickel_net_plugin_logger",
    log = sym log_va,
);

#[cfg(target_arch = "x86_64")]
fn logger() -> ncclDebugLogger_t {
    c::ferronickel_net_plugin_logger
}

/// Elsewhere the format string is logged as is, without its arguments.
#[cfg(not(target_arch = "x86_64"))]
fn logger() -> ncclDebugLogger_t {
    extern "C" fn plain(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, fmt: *const c_char) {
        let _ = (file, line);
        if !fmt.is_null() {
            // SAFETY: fmt is the plugin's NUL-terminated format string.
            let f = unsafe { CStr::from_ptr(fmt) }.to_string_lossy();
            let lvl = if level == 2 { Level::Warn } else { Level::Info };
            crate::debug::log(lvl, flags as u64, &format!("{f} (arguments not shown on this architecture)"));
        }
    }
    // SAFETY: the C calling convention passes the named arguments of a variadic call where a
    // non-variadic callee reads them on the 64-bit Linux ABIs; `plain` reads only those.
    unsafe {
        std::mem::transmute::<extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char), ncclDebugLogger_t>(
            plain,
        )
    }
}

/// The profiler callback handed to v10+ plugins: we record no network events.
unsafe extern "C" fn no_profiler(
    e_handle: *mut *mut c_void,
    _kind: c_int,
    _p: *mut c_void,
    _id: i64,
    _ext: *mut c_void,
) -> c_int {
    if !e_handle.is_null() {
        // SAFETY: a non-NULL event-handle pointer from the plugin is writable.
        unsafe { *e_handle = null_mut() };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_list_as_nccl_reads_it() {
        assert_eq!(candidates(None), ["libnccl-net.so"]);
        assert!(candidates(Some("none")).is_empty());
        assert!(candidates(Some("NONE")).is_empty());
        assert_eq!(candidates(Some("a, /x/libb.so,,c")), ["a", "/x/libb.so", "c"]);
        assert_eq!(candidates(Some(&vec!["p"; 20].join(","))).len(), MAX_LISTED);
    }

    #[test]
    fn file_names_of_an_entry() {
        assert_eq!(file_names("aws-ofi"), ["aws-ofi", "libnccl-net-aws-ofi.so"]);
        assert_eq!(file_names("libfoo.so"), ["libfoo.so"]);
        assert_eq!(file_names("./x.so"), ["./x.so"]);
        assert_eq!(file_names("/opt/libnccl-net.so"), ["/opt/libnccl-net.so"]);
        assert_eq!(file_names("libfoo"), ["libfoo", "libnccl-net-libfoo.so"]);
    }

    #[test]
    fn a_missing_plugin_is_not_an_error() {
        assert!(PluginLib::open("ferronickel-no-such-plugin").unwrap().is_none());
    }
}
