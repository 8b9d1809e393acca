//! External tuner plugins (`NCCL_TUNER_PLUGIN`; docs/PLUGINS.md, "Tuner"): the library is found once
//! per process (else, as NCCL, the tuner table in the net plugin's library), its table looked up newest first (`ncclTunerPlugin_v5` .. `_v2`, as NCCL 2.28.9),
//! and each communicator gets a [`Session`]: the plugin's `init` with the communicator's size, its
//! `getCollInfo` per collective on our cost table, its `finalize` when the communicator goes. What
//! the table holds and how its answer is used is the cost model's (`tuner`); this module only
//! speaks the ABI, adapting v2's algorithm/protocol answer to a table as NCCL does.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::abi::*;
use super::{Found, Kind, Library, Loaded, Versions};
use crate::debug::Subsys;
use crate::error::{Error, Result};

crate::str_param!(
    /// `NCCL_TUNER_PLUGIN`: the tuner plugin library, or `none`.
    tuner_plugin_env, "NCCL_TUNER_PLUGIN"
);

/// How tuner plugins are found: `NCCL_TUNER_PLUGIN`, `libnccl-tuner-<name>.so`, `libnccl-tuner.so`.
pub const TUNER_PLUGINS: Kind = Kind {
    var: "NCCL_TUNER_PLUGIN",
    kind: "tuner",
    default: "libnccl-tuner.so",
    label: "TUNER/Plugin",
    subsys: Subsys::TUNING,
    list: false,
};

/// Rows and columns of a cost table: `[NCCL algorithm][NCCL protocol]`, microseconds,
/// [`IGNORE`] where not offered.
pub type CostTable = [[f32; NCCL_NUM_PROTOCOLS as usize]; NCCL_NUM_ALGORITHMS as usize];
/// A cost table entry that is not offered, or that the plugin rules out.
pub const IGNORE: f32 = -1.0;

super::versions!(
    /// The tuner tables, looked up newest first.
    Table,
    "ncclTunerPlugin_v",
    V5(ncclTuner_v5_t) = 5,
    V4(ncclTuner_v4_t) = 4,
    V3(ncclTuner_v3_t) = 3,
    V2(ncclTuner_v2_t) = 2,
);

/// A tuner library and the table it exports; kept mapped for the life of the process.
pub type TunerLib = Loaded<Table>;

impl TunerLib {
    /// Takes a library that exports a tuner table; refuses one that exports none, or whose table
    /// lacks a function.
    pub fn accept(lib: Library) -> Result<TunerLib> {
        let mut t = TunerLib::find(&TUNER_PLUGINS, lib, "using the built-in tuner")?;
        // SAFETY: every version's table has three function pointers after its name; the table
        // is the library's static data.
        let complete = unsafe {
            match t.table {
                Table::V5(t) => (*t).init.is_some() && (*t).getCollInfo.is_some() && (*t).finalize.is_some(),
                Table::V4(t) => (*t).init.is_some() && (*t).getCollInfo.is_some() && (*t).destroy.is_some(),
                Table::V3(t) => (*t).init.is_some() && (*t).getCollInfo.is_some() && (*t).destroy.is_some(),
                Table::V2(t) => (*t).init.is_some() && (*t).getCollInfo.is_some() && (*t).destroy.is_some(),
            }
        };
        if !complete {
            return Err(Error::System(format!(
                "TUNER/Plugin: {} in {} has a NULL init, getCollInfo or finalize; using the built-in tuner",
                t.symbol(),
                t.path()
            )));
        }
        t.keep();
        crate::nccl_info!(
            Subsys::INIT | Subsys::TUNING,
            "TUNER/Plugin: using {} (v{}) from {}",
            t.name(),
            t.version(),
            t.path()
        );
        Ok(t)
    }
}

/// The process's tuner plugin, looked for once (NCCL loads one per process). As NCCL, when no
/// tuner library could be opened (and `NCCL_TUNER_PLUGIN` is not `none`), the tuner table is looked
/// for in the net plugin's library, whose path `net_library` gives (the NET transport knows it;
/// every caller passes `transport::net::plugin_library`).
pub fn found(net_library: fn() -> Option<String>) -> &'static Found<TunerLib> {
    static FOUND: OnceLock<Found<TunerLib>> = OnceLock::new();
    FOUND.get_or_init(|| {
        let opened = std::cell::Cell::new(false);
        let mut found = super::find(&TUNER_PLUGINS, tuner_plugin_env(), |lib| {
            opened.set(true);
            TunerLib::accept(lib)
        });
        let off = tuner_plugin_env().is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
        if found.plugin.is_none() && !opened.get() && !off {
            if let Some(path) = net_library() {
                found.notes.push(in_net_library(&path, &mut found.plugin));
            }
        }
        found
    })
}

/// Looks for a tuner table in the net plugin's library `path`, as NCCL does when no tuner library
/// was found; a net plugin without one is no error (NCCL says so at INFO level). The note for
/// `ferronickel info`.
fn in_net_library(path: &str, plugin: &mut Option<TunerLib>) -> String {
    let lib = match Library::open(&TUNER_PLUGINS, path) {
        Ok(Some(lib)) => lib,
        Ok(None) => return format!("net plugin library {path}: not found"),
        Err(e) => return format!("net plugin library {path}: {e}"),
    };
    if Table::lookup(&lib).is_none() {
        crate::nccl_info!(Subsys::INIT | Subsys::TUNING, "TUNER/Plugin: the net plugin {path} holds no tuner");
        return format!("net plugin library {path}: holds no tuner");
    }
    match TunerLib::accept(lib) {
        Ok(t) => {
            *plugin = Some(t);
            format!("net plugin library {path}: tuner loaded from it")
        }
        Err(e) => {
            crate::nccl_warn!("{e}");
            format!("net plugin library {path}: refused: {e}")
        }
    }
}

/// What `init` is told about the communicator.
pub struct CommInfo {
    pub comm_id: u64,
    pub nranks: usize,
    pub nnodes: usize,
    pub min_ranks_per_node: usize,
    pub max_ranks_per_node: usize,
    /// v5's constants, as the cost model fills them (docs/PLUGINS.md says which).
    pub constants: ncclTunerConstants_v5_t,
}

/// One communicator's tuner context: `finalize` runs when the last holder drops it.
pub struct Session {
    lib: &'static TunerLib,
    ctx: *mut c_void,
    /// Calls into one context are serialized; whether getCollInfo failed before (WARNed once).
    warned: Mutex<bool>,
}

// SAFETY: `ctx` is the plugin's context, used only under `warned`'s lock or by drop.
unsafe impl Send for Session {}
// SAFETY: as above.
unsafe impl Sync for Session {}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tuner plugin {} (v{})", self.lib.name(), self.lib.version())
    }
}

impl Session {
    /// Runs the process's plugin's `init` for a communicator. `None` when there is no plugin or
    /// its `init` failed (WARNed: the communicator then uses the built-in tuner).
    /// `net_library` as for [`found`].
    pub fn start(info: &mut CommInfo, net_library: fn() -> Option<String>) -> Option<Arc<Session>> {
        let lib = found(net_library).plugin.as_ref()?;
        match Self::init(lib, info) {
            Ok(s) => Some(Arc::new(s)),
            Err(e) => {
                crate::nccl_warn!("{e}; using the built-in tuner");
                None
            }
        }
    }

    fn init(lib: &'static TunerLib, info: &mut CommInfo) -> Result<Session> {
        let mut ctx = null_mut();
        let log = super::logger::logger();
        let mut nvl = ncclNvlDomainInfo_v5_t {
            nNvlDomains: info.nnodes as c_int,
            minRanksPerNvlDomain: info.min_ranks_per_node as c_int,
            maxRanksPerNvlDomain: info.max_ranks_per_node as c_int,
        };
        // SAFETY: the table is the library's static data and its functions were checked non-NULL
        // at load; the arguments follow plugin_abi.h and outlive the call.
        let rc = unsafe {
            match lib.table {
                Table::V5(t) => (*t).init.expect("checked")(
                    &mut ctx,
                    info.comm_id,
                    info.nranks,
                    info.nnodes,
                    log,
                    &mut nvl,
                    &mut info.constants,
                ),
                Table::V4(t) => (*t).init.expect("checked")(info.nranks, info.nnodes, log, &mut ctx),
                Table::V3(t) => (*t).init.expect("checked")(info.nranks, info.nnodes, log, &mut ctx),
                Table::V2(t) => (*t).init.expect("checked")(info.nranks, info.nnodes, log, &mut ctx),
            }
        } as c_int;
        if rc != 0 {
            return Err(super::error_for(
                rc,
                format!("TUNER/Plugin {} (v{}, {}): init failed with code {rc}", lib.name(), lib.version(), lib.path()),
            ));
        }
        Ok(Session { lib, ctx, warned: Mutex::new(false) })
    }

    /// Asks the plugin about one collective of `bytes` (NCCL's `ncclFunc_t` `func`): it may
    /// change `table` and set `nchannels` (0: unset). An error (WARNed the first time per
    /// communicator) means its answer is not to be used.
    pub fn coll_info(&self, func: ncclFunc_t, bytes: usize, table: &mut CostTable, nchannels: &mut i32) -> Result<()> {
        let mut warned = self.warned.lock();
        let cost = table.as_mut_ptr() as *mut *mut f32;
        let (na, np) = (NCCL_NUM_ALGORITHMS as c_int, NCCL_NUM_PROTOCOLS as c_int);
        // SAFETY: functions checked non-NULL at load; ctx came from init; the table is a live
        // float[7][3] passed as float**, as NCCL passes it; nchannels outlives the call.
        let rc = unsafe {
            match self.lib.table {
                Table::V5(t) => {
                    (*t).getCollInfo.expect("checked")(self.ctx, func, bytes, 1, cost, na, np, 0, nchannels)
                }
                Table::V4(t) => {
                    (*t).getCollInfo.expect("checked")(self.ctx, func, bytes, 1, cost, na, np, 0, nchannels)
                }
                Table::V3(t) => (*t).getCollInfo.expect("checked")(self.ctx, func, bytes, 1, cost, na, np, nchannels),
                Table::V2(t) => {
                    let (mut algo, mut proto) = (NCCL_ALGO_UNDEF, NCCL_PROTO_UNDEF);
                    let rc = (*t).getCollInfo.expect("checked")(
                        self.ctx, func, bytes, 0, 0, 1, &mut algo, &mut proto, nchannels,
                    );
                    // v2 names a choice; as NCCL's adapter, an offered entry it names costs 0.
                    if rc == 0 && (0..na).contains(&algo) && (0..np).contains(&proto) {
                        let e = &mut table[algo as usize][proto as usize];
                        if *e != IGNORE {
                            *e = 0.0;
                        }
                    }
                    rc
                }
            }
        } as c_int;
        if rc == 0 {
            return Ok(());
        }
        let e = super::error_for(
            rc,
            format!(
                "TUNER/Plugin {} (v{}): getCollInfo failed with code {rc}; using the built-in tuner's choice",
                self.lib.name(),
                self.lib.version()
            ),
        );
        if !*warned {
            *warned = true;
            crate::nccl_warn!("{e}");
        }
        Err(e)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: functions checked non-NULL at load; ctx came from init and is finalized once.
        let rc = unsafe {
            match self.lib.table {
                Table::V5(t) => (*t).finalize.expect("checked")(self.ctx),
                Table::V4(t) => (*t).destroy.expect("checked")(self.ctx),
                Table::V3(t) => (*t).destroy.expect("checked")(self.ctx),
                Table::V2(t) => (*t).destroy.expect("checked")(self.ctx),
            }
        } as c_int;
        if rc != 0 {
            crate::nccl_warn!("TUNER/Plugin {}: finalize failed with code {rc}", self.lib.name());
        }
    }
}
