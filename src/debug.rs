//! NCCL-compatible logging: `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`, `NCCL_DEBUG_FILE`, and the
//! `host:pid:tid [dev] NCCL INFO ...` line shape that existing log tooling parses.
//!
//! Every WARN also becomes the text `ncclGetLastError` returns, as in NCCL.

use parking_lot::Mutex;
use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CStr};
use std::io::Write;

/// Log levels, NCCL's numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    None = 0,
    Version = 1,
    Warn = 2,
    Info = 3,
    Abort = 4,
    Trace = 5,
}

/// Subsystem bits for `NCCL_DEBUG_SUBSYS`, NCCL's names and values.
pub struct Subsys;
impl Subsys {
    pub const INIT: u64 = 0x1;
    pub const COLL: u64 = 0x2;
    pub const P2P: u64 = 0x4;
    pub const SHM: u64 = 0x8;
    pub const NET: u64 = 0x10;
    pub const GRAPH: u64 = 0x20;
    pub const TUNING: u64 = 0x40;
    pub const ENV: u64 = 0x80;
    pub const ALLOC: u64 = 0x100;
    pub const CALL: u64 = 0x200;
    pub const PROXY: u64 = 0x400;
    pub const NVLS: u64 = 0x800;
    pub const BOOTSTRAP: u64 = 0x1000;
    pub const REG: u64 = 0x2000;
    pub const PROFILE: u64 = 0x4000;
    pub const RAS: u64 = 0x8000;
    pub const ALL: u64 = !0;
    const NAMES: [(&'static str, u64); 17] = [
        ("INIT", Self::INIT),
        ("COLL", Self::COLL),
        ("P2P", Self::P2P),
        ("SHM", Self::SHM),
        ("NET", Self::NET),
        ("GRAPH", Self::GRAPH),
        ("TUNING", Self::TUNING),
        ("ENV", Self::ENV),
        ("ALLOC", Self::ALLOC),
        ("CALL", Self::CALL),
        ("PROXY", Self::PROXY),
        ("NVLS", Self::NVLS),
        ("BOOTSTRAP", Self::BOOTSTRAP),
        ("REG", Self::REG),
        ("PROFILE", Self::PROFILE),
        ("RAS", Self::RAS),
        ("ALL", Self::ALL),
    ];
}

pub fn parse_level(s: &str) -> Level {
    match s.trim().to_ascii_uppercase().as_str() {
        "VERSION" => Level::Version,
        "WARN" => Level::Warn,
        "INFO" => Level::Info,
        "ABORT" => Level::Abort,
        "TRACE" => Level::Trace,
        _ => Level::None,
    }
}

/// `INIT,COLL` selects; a leading `^` inverts the whole list, as in NCCL.
pub fn parse_subsys(s: &str) -> u64 {
    let (invert, list) = match s.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, s.trim()),
    };
    let mask = list
        .split(',')
        .filter_map(|n| Subsys::NAMES.iter().find(|(name, _)| name.eq_ignore_ascii_case(n.trim())))
        .fold(0u64, |m, (_, bit)| m | bit);
    if invert {
        !mask
    } else {
        mask
    }
}

/// `%h` → host name, `%p` → pid, as NCCL_DEBUG_FILE expands them.
pub fn expand_file_name(pattern: &str, host: &str, pid: u32) -> String {
    pattern.replace("%h", host).replace("%p", &pid.to_string())
}

struct Config {
    level: Level,
    mask: u64,
    host: String,
    file: Option<std::fs::File>,
}

static CONFIG: Mutex<Option<Config>> = Mutex::new(None);
/// `ncclGetLastError`'s text: one process-wide buffer, stable for the life of the process.
static LAST_ERROR: Mutex<[u8; 1024]> = Mutex::new([0; 1024]);

thread_local! {
    /// The CUDA device shown in `[dev]`; set while working for a communicator.
    static LOG_DEV: Cell<i32> = const { Cell::new(0) };
}

pub fn set_log_device(dev: i32) {
    let _ = LOG_DEV.try_with(|d| d.set(dev));
}

pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its full length; gethostname NUL-terminates within it on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut c_char, buf.len() - 1) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).split('.').next().unwrap_or("").to_string()
}

fn load_config() -> Config {
    let level = crate::param::get("NCCL_DEBUG").map(|s| parse_level(&s)).unwrap_or(Level::None);
    let mask = crate::param::get("NCCL_DEBUG_SUBSYS")
        .map(|s| parse_subsys(&s))
        .unwrap_or(Subsys::INIT | Subsys::BOOTSTRAP | Subsys::ENV);
    let host = host_name();
    let file = crate::param::get("NCCL_DEBUG_FILE").and_then(|p| {
        let path = expand_file_name(&p, &host, std::process::id());
        std::fs::OpenOptions::new().create(true).append(true).open(path).ok()
    });
    Config { level, mask, host, file }
}

/// Re-reads the logging environment on next use (`ncclResetDebugInit`).
pub fn reset() {
    *CONFIG.lock() = None;
}

fn gettid() -> i64 {
    // SAFETY: SYS_gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

/// Whether a message of this level and subsystem would be printed (to skip formatting).
pub fn enabled(level: Level, subsys: u64) -> bool {
    let mut cfg = CONFIG.lock();
    let cfg = cfg.get_or_insert_with(load_config);
    level <= cfg.level && (level <= Level::Warn || cfg.mask & subsys != 0)
}

/// Writes one log line in NCCL's shape; WARN lines also become the last-error text.
pub fn log(level: Level, subsys: u64, msg: &str) {
    if level == Level::Warn {
        set_last_error(msg);
    }
    print(level, subsys, msg);
}

/// Writes one log line without touching the last-error text: for events no application call
/// caused (a stranger's connection to a bootstrap listener), which must not replace the
/// explanation of the application's own last failure.
pub fn print(level: Level, subsys: u64, msg: &str) {
    let mut guard = CONFIG.lock();
    let cfg = guard.get_or_insert_with(load_config);
    if level > cfg.level || (level > Level::Warn && cfg.mask & subsys == 0) {
        return;
    }
    let tag = match level {
        Level::Warn => "WARN",
        Level::Trace => "TRACE",
        _ => "INFO",
    };
    let dev = LOG_DEV.try_with(|d| d.get()).unwrap_or(-1);
    let line = format!("{}:{}:{} [{}] NCCL {} {}\n", cfg.host, std::process::id(), gettid(), dev, tag, msg);
    let _ = match cfg.file.as_mut() {
        Some(f) => f.write_all(line.as_bytes()),
        None => std::io::stdout().write_all(line.as_bytes()),
    };
}

pub fn set_last_error(msg: &str) {
    let mut buf = LAST_ERROR.lock();
    let n = msg.len().min(buf.len() - 1);
    buf[..n].copy_from_slice(&msg.as_bytes()[..n]);
    buf[n] = 0;
}

thread_local! {
    /// This thread's copy of the last-error text, taken under the lock, so that the caller reads
    /// a string no other thread is writing.
    static LAST_ERROR_COPY: RefCell<[u8; 1024]> = const { RefCell::new([0; 1024]) };
}

/// The last error text, copied for the calling thread; the pointer stays valid until the same
/// thread asks again (NCCL's contract) or exits.
pub fn last_error_ptr() -> *const c_char {
    let text = *LAST_ERROR.lock();
    LAST_ERROR_COPY
        .try_with(|c| {
            let mut c = c.borrow_mut();
            *c = text;
            c.as_ptr() as *const c_char
        })
        // A thread past its thread-locals (a static destructor at exit) gets a fixed text.
        .unwrap_or(c"the calling thread is exiting; the last error text is not kept for it".as_ptr())
}

/// The last error text as a Rust string (for tests).
pub fn last_error() -> String {
    let buf = LAST_ERROR.lock();
    CStr::from_bytes_until_nul(&buf[..]).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default()
}

/// A WARN line that does not become the last-error text (see [`print`]).
#[macro_export]
macro_rules! nccl_warn_unrecorded {
    ($($t:tt)*) => { $crate::debug::print($crate::debug::Level::Warn, $crate::debug::Subsys::ALL, &format!($($t)*)) };
}

#[macro_export]
macro_rules! nccl_warn {
    ($($t:tt)*) => { $crate::debug::log($crate::debug::Level::Warn, $crate::debug::Subsys::ALL, &format!($($t)*)) };
}

#[macro_export]
macro_rules! nccl_info {
    ($sub:expr, $($t:tt)*) => {
        if $crate::debug::enabled($crate::debug::Level::Info, $sub) {
            $crate::debug::log($crate::debug::Level::Info, $sub, &format!($($t)*))
        }
    };
}

#[macro_export]
macro_rules! nccl_trace {
    ($sub:expr, $($t:tt)*) => {
        if $crate::debug::enabled($crate::debug::Level::Trace, $sub) {
            $crate::debug::log($crate::debug::Level::Trace, $sub, &format!($($t)*))
        }
    };
}

/// Serialises unit tests that read the process-wide last-error text.
#[cfg(test)]
pub static LAST_ERROR_TEST_LOCK: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_subsys() {
        assert_eq!(parse_level("info"), Level::Info);
        assert_eq!(parse_level("bogus"), Level::None);
        assert_eq!(parse_subsys("INIT,COLL"), Subsys::INIT | Subsys::COLL);
        assert_eq!(parse_subsys("^INIT"), !Subsys::INIT);
        assert_eq!(parse_subsys("ALL"), Subsys::ALL);
    }

    #[test]
    fn file_pattern() {
        assert_eq!(expand_file_name("/tmp/nccl.%h.%p.log", "node1", 42), "/tmp/nccl.node1.42.log");
    }

    #[test]
    fn last_error_is_truncated_and_terminated() {
        let _l = LAST_ERROR_TEST_LOCK.lock();
        set_last_error(&"x".repeat(5000));
        assert_eq!(last_error().len(), 1023);
    }
}
