//! NCCL-compatible logging: `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS`, `NCCL_DEBUG_FILE`, and the
//! `host:pid:tid [dev] NCCL INFO ...` line shape that existing log tooling parses, with NCCL
//! 2.28's details: a WARN line comes after an empty line, with a timestamp and the source file and
//! line (`\n[2026-11-28 10:00:00] host:pid:tid [0] comm/init.rs:57 NCCL WARN ...`);
//! `NCCL_DEBUG_TIMESTAMP_LEVELS` and `NCCL_DEBUG_TIMESTAMP_FORMAT` choose which levels get a
//! timestamp and its `strftime` shape (`%3f` and the like for fractions of a second, `_` for a
//! space); `NCCL_WARN_ENABLE_DEBUG_INFO=1` turns INFO on after the first WARN.
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

/// `%h` → host name, `%p` → pid, `%%` → `%`, any other `%x` kept, as NCCL_DEBUG_FILE expands them.
pub fn expand_file_name(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

struct Config {
    level: Level,
    mask: u64,
    host: String,
    file: Option<std::fs::File>,
    /// A bit per [`Level`]: the levels whose lines start with a timestamp.
    stamped: u32,
    /// The timestamp's `strftime` format, NCCL's `%Nf` fractions of a second included.
    stamp: String,
    /// NCCL_WARN_ENABLE_DEBUG_INFO: the first WARN raises the level to INFO.
    warn_to_info: bool,
}

/// The levels NCCL_DEBUG_TIMESTAMP_LEVELS names (`WARN,INFO`; `^` excludes from all; `ALL`),
/// as a bit per level; unset, WARN alone. Unknown names are skipped, as NCCL skips them.
pub fn parse_timestamp_levels(s: Option<&str>) -> u32 {
    let Some(s) = s else { return 1 << Level::Warn as u32 };
    let (invert, list) = match s.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, s.trim()),
    };
    let named = list.split(',').map(str::trim).fold(0u32, |m, n| {
        m | match n.to_ascii_uppercase().as_str() {
            "ALL" => !0,
            "NONE" | "" => 0,
            other => match parse_level(other) {
                Level::None => 0,
                l => 1 << l as u32,
            },
        }
    });
    if invert {
        !named
    } else {
        named
    }
}

/// NCCL_DEBUG_TIMESTAMP_FORMAT as NCCL reads it: `_` stands for a space; unset, `[%F %T] `.
pub fn timestamp_format(s: Option<&str>) -> String {
    s.unwrap_or("[%F %T] ").replace('_', " ")
}

/// Replaces the first `%Nf` (N from 1 to 9) of a timestamp format with the first N digits of
/// the fraction of a second `nanos`, leaving `%%` alone, as NCCL does before `strftime`.
pub fn with_fraction(format: &str, nanos: u32) -> String {
    let b = format.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && b.get(i + 1) == Some(&b'%') {
            i += 2;
            continue;
        }
        if b[i] == b'%' && matches!(b.get(i + 1), Some(b'1'..=b'9')) && b.get(i + 2) == Some(&b'f') {
            let digits = (b[i + 1] - b'0') as u32;
            let frac = nanos.min(999_999_999) / 10u32.pow(9 - digits);
            return format!("{}{frac:0w$}{}", &format[..i], &format[i + 3..], w = digits as usize);
        }
        i += 1;
    }
    format.to_string()
}

/// The timestamp of a log line now, in local time: none for an empty format, and the default
/// shape where the format yields nothing (too long for the line, or no output), as NCCL's.
fn timestamp(format: &str) -> String {
    if format.is_empty() {
        return String::new();
    }
    // SAFETY: clock_gettime and localtime_r write only the structs passed, which live across the
    // calls; strftime writes at most `buf.len()` bytes and returns how many (0: did not fit).
    unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&ts.tv_sec, &mut tm);
        let mut buf = [0u8; 256];
        for f in [with_fraction(format, ts.tv_nsec as u32), "[%F %T] ".to_string()] {
            let Ok(cf) = std::ffi::CString::new(f) else { continue };
            let n = libc::strftime(buf.as_mut_ptr().cast(), buf.len(), cf.as_ptr(), &tm);
            if n > 0 {
                return String::from_utf8_lossy(&buf[..n]).into_owned();
            }
        }
        String::new()
    }
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
    // Opened afresh, as NCCL opens it ("w"), and only where something above the version line
    // may be logged.
    let file = crate::param::get("NCCL_DEBUG_FILE").filter(|_| level > Level::Version).and_then(|p| {
        let path = expand_file_name(&p, &host, std::process::id());
        std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(path).ok()
    });
    let stamped = parse_timestamp_levels(crate::param::get("NCCL_DEBUG_TIMESTAMP_LEVELS").as_deref());
    let stamp = timestamp_format(crate::param::get("NCCL_DEBUG_TIMESTAMP_FORMAT").as_deref());
    let warn_to_info = crate::param::get("NCCL_WARN_ENABLE_DEBUG_INFO")
        .and_then(|v| crate::param::parse_i64(&v))
        .is_some_and(|v| v != 0);
    Config { level, mask, host, file, stamped, stamp, warn_to_info }
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

/// Where a line was logged from, as NCCL's WARN lines show it: the source file (relative to
/// `src/`, as NCCL's are to its `src/`) and line.
pub type At<'a> = Option<(&'a str, u32)>;

/// Writes one log line in NCCL's shape; WARN lines also become the last-error text.
pub fn log(level: Level, subsys: u64, at: At<'_>, msg: &str) {
    if level == Level::Warn {
        set_last_error(msg);
    }
    print(level, subsys, at, msg);
}

/// Writes one log line without touching the last-error text: for events no application call
/// caused (a stranger's connection to a bootstrap listener), which must not replace the
/// explanation of the application's own last failure.
pub fn print(level: Level, subsys: u64, at: At<'_>, msg: &str) {
    let mut guard = CONFIG.lock();
    let cfg = guard.get_or_insert_with(load_config);
    if level > cfg.level || (level > Level::Warn && cfg.mask & subsys == 0) {
        return;
    }
    let dev = LOG_DEV.try_with(|d| d.get()).unwrap_or(-1);
    let stamp = if cfg.stamped & (1 << level as u32) != 0 { timestamp(&cfg.stamp) } else { String::new() };
    if level == Level::Warn && cfg.warn_to_info && cfg.level < Level::Info {
        cfg.level = Level::Info;
    }
    let who = format!("{}:{}:{} [{dev}]", cfg.host, std::process::id(), gettid());
    let line = line(level, &stamp, &who, at, msg);
    let _ = match cfg.file.as_mut() {
        Some(f) => f.write_all(line.as_bytes()),
        None => std::io::stdout().write_all(line.as_bytes()),
    };
}

/// One line as NCCL writes it: its timestamp (`stamp`, maybe empty), then `who` (`host:pid:tid
/// [dev]`) and the level; a WARN after an empty line and with where it was logged from; the
/// version line bare.
fn line(level: Level, stamp: &str, who: &str, at: At<'_>, msg: &str) -> String {
    match level {
        Level::Version => format!("{stamp}{msg}\n"),
        Level::Warn => {
            let at = at.map(|(f, l)| format!(" {}:{l}", f.strip_prefix("src/").unwrap_or(f))).unwrap_or_default();
            format!("\n{stamp}{who}{at} NCCL WARN {msg}\n")
        }
        Level::Trace => format!("{stamp}{who} NCCL TRACE {msg}\n"),
        _ => format!("{stamp}{who} NCCL INFO {msg}\n"),
    }
}

/// The version line NCCL starts a process's log with, naming this library too:
/// `NCCL version 2.28.9+cuda13.0 (ferronickel 0.1.0)`, the CUDA release its kernels were
/// compiled with.
pub fn version_line() -> String {
    use crate::types::{NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH};
    format!(
        "NCCL version {NCCL_MAJOR}.{NCCL_MINOR}.{NCCL_PATCH}+cuda{} (ferronickel {})",
        env!("FERRONICKEL_CUDA_VERSION"),
        env!("CARGO_PKG_VERSION")
    )
}

/// Logs [`version_line`] once a process, as its first communicator's init starts, as NCCL does:
/// a bare line at `NCCL_DEBUG=VERSION` or `WARN`, an INFO line of every subsystem above.
pub fn show_version() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let level = CONFIG.lock().get_or_insert_with(load_config).level;
        let as_level = if matches!(level, Level::Version | Level::Warn) { Level::Version } else { Level::Info };
        print(as_level, Subsys::ALL, None, &version_line());
    });
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
    ($($t:tt)*) => {
        $crate::debug::print(
            $crate::debug::Level::Warn,
            $crate::debug::Subsys::ALL,
            Some((file!(), line!())),
            &format!($($t)*),
        )
    };
}

#[macro_export]
macro_rules! nccl_warn {
    ($($t:tt)*) => {
        $crate::debug::log($crate::debug::Level::Warn, $crate::debug::Subsys::ALL, Some((file!(), line!())), &format!($($t)*))
    };
}

#[macro_export]
macro_rules! nccl_info {
    ($sub:expr, $($t:tt)*) => {
        if $crate::debug::enabled($crate::debug::Level::Info, $sub) {
            $crate::debug::log($crate::debug::Level::Info, $sub, None, &format!($($t)*))
        }
    };
}

#[macro_export]
macro_rules! nccl_trace {
    ($sub:expr, $($t:tt)*) => {
        if $crate::debug::enabled($crate::debug::Level::Trace, $sub) {
            $crate::debug::log($crate::debug::Level::Trace, $sub, None, &format!($($t)*))
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
    fn timestamps_go_on_the_levels_named() {
        let bit = |l: Level| 1u32 << l as u32;
        assert_eq!(parse_timestamp_levels(None), bit(Level::Warn));
        assert_eq!(parse_timestamp_levels(Some("INFO,warn")), bit(Level::Info) | bit(Level::Warn));
        assert_eq!(parse_timestamp_levels(Some("^WARN")), !bit(Level::Warn));
        assert_eq!(parse_timestamp_levels(Some("ALL")), !0);
        assert_eq!(parse_timestamp_levels(Some("")), 0);
        assert_eq!(parse_timestamp_levels(Some("bogus,TRACE")), bit(Level::Trace));
    }

    #[test]
    fn timestamp_formats_read_as_nccl_reads_them() {
        assert_eq!(timestamp_format(None), "[%F %T] ");
        assert_eq!(timestamp_format(Some("%T_|_")), "%T | ");
        assert_eq!(with_fraction("[%T.%3f] ", 123_456_789), "[%T.123] ");
        assert_eq!(with_fraction("%9f", 5), "000000005");
        assert_eq!(with_fraction("%1f", 999_999_999), "9");
        // `%%3f` is a literal "%3f", so the first fraction is the one after it; only one is filled.
        assert_eq!(with_fraction("%%3f %2f %2f", 120_000_000), "%%3f 12 %2f");
        assert_eq!(with_fraction("%0f %f %", 1), "%0f %f %");
        // The whole timestamp through strftime: `[YYYY-MM-DD HH:MM:SS.mmm] `.
        let t = timestamp("[%F %T.%3f] ");
        assert_eq!(t.len(), 26, "{t:?}");
        assert!(t.starts_with("[2") && t.ends_with("] ") && t.as_bytes()[20] == b'.', "{t:?}");
        // A format too long for the line falls back on the default; an empty one stamps nothing.
        assert_eq!(timestamp(&"%F".repeat(40)).len(), "[2026-11-28 10:00:00] ".len());
        assert_eq!(timestamp(""), "");
    }

    #[test]
    fn lines_have_nccls_shape() {
        let who = "h:1:2 [0]";
        assert_eq!(line(Level::Info, "", who, None, "hi"), "h:1:2 [0] NCCL INFO hi\n");
        assert_eq!(line(Level::Info, "[t] ", who, None, "hi"), "[t] h:1:2 [0] NCCL INFO hi\n");
        assert_eq!(line(Level::Version, "[t] ", who, None, "NCCL version x"), "[t] NCCL version x\n");
        assert_eq!(line(Level::Warn, "[t] ", who, None, "no"), "\n[t] h:1:2 [0] NCCL WARN no\n");
        let v = version_line();
        assert!(v.starts_with("NCCL version 2.28.9+cuda") && v.contains(" (ferronickel "), "{v}");
        assert_eq!(
            line(Level::Warn, "", who, Some(("src/comm/init.rs", 57)), "no"),
            "\nh:1:2 [0] comm/init.rs:57 NCCL WARN no\n"
        );
        assert_eq!(line(Level::Warn, "", who, Some(("net_ib.cc", 9)), "no"), "\nh:1:2 [0] net_ib.cc:9 NCCL WARN no\n");
        assert_eq!(line(Level::Warn, "", who, None, "no"), "\nh:1:2 [0] NCCL WARN no\n");
        assert_eq!(line(Level::Trace, "", who, None, "t"), "h:1:2 [0] NCCL TRACE t\n");
    }

    #[test]
    fn file_pattern() {
        assert_eq!(expand_file_name("/tmp/nccl.%h.%p.log", "node1", 42), "/tmp/nccl.node1.42.log");
        assert_eq!(expand_file_name("a%%p%x%", "h", 7), "a%p%x%");
    }

    #[test]
    fn last_error_is_truncated_and_terminated() {
        let _l = LAST_ERROR_TEST_LOCK.lock();
        set_last_error(&"x".repeat(5000));
        assert_eq!(last_error().len(), 1023);
    }
}
