//! Plugin libraries, found and opened as NCCL 2.28 finds its plugins (`docs/NET.md`, "Which net is used";
//! `docs/PLUGINS.md`): a variable (`NCCL_NET_PLUGIN`, `NCCL_TUNER_PLUGIN`, `NCCL_PROFILER_PLUGIN`)
//! names a library (`none`: no plugin; for nets a comma list of them, tuner and profiler take one
//! name as in NCCL), each tried as given with
//! `dlopen(RTLD_NOW | RTLD_LOCAL)` and then as `libnccl-<kind>-<name>.so`; unset, the list is the
//! kind's default library. What a library must export is its user's business: the net's in
//! `transport::net::plugin`, the tuner's in [`tuner`], the profiler's in [`profiler`]; the ABI of
//! the last two is [`abi`] and the logger every plugin gets is [`logger`].

pub mod abi;
pub mod logger;
pub mod nvtx;
pub mod profiler;
pub mod tuner;

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::null_mut;

use crate::debug::Subsys;
use crate::error::{Error, Result};

/// NCCL keeps 16 nets per process, two of them built in.
const MAX_LISTED: usize = 14;

/// A kind of plugin: its variable, the `<kind>` of its file names, its default library and how
/// its messages start.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    /// The variable that lists the libraries (`NCCL_NET_PLUGIN`).
    pub var: &'static str,
    /// The `<kind>` of `libnccl-<kind>-<name>.so` ("net"), and of "trying the next net".
    pub kind: &'static str,
    /// The library tried when the variable is unset (`libnccl-net.so`).
    pub default: &'static str,
    /// How messages about it start ("NET/Plugin").
    pub label: &'static str,
    /// The subsystem of its INFO lines.
    pub subsys: u64,
    /// Whether the variable holds a comma list (nets) or one name (tuner, profiler), as in NCCL.
    pub list: bool,
}

impl Kind {
    /// The libraries to try, in order, for `value`, the variable's value.
    pub fn candidates(&self, value: Option<&str>) -> Vec<String> {
        match value.map(str::trim) {
            None => vec![self.default.to_string()],
            Some(v) if v.eq_ignore_ascii_case("none") => Vec::new(),
            Some(v) if !self.list => vec![v.to_string()],
            Some(v) => {
                let list: Vec<String> =
                    v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
                if list.len() > MAX_LISTED {
                    crate::nccl_info!(
                        self.subsys | Subsys::ENV,
                        "{} lists {} plugins; trying the first {MAX_LISTED}",
                        self.var,
                        list.len()
                    );
                }
                list.into_iter().take(MAX_LISTED).collect()
            }
        }
    }

    /// The file names one list entry is tried as: the entry itself, then, for a bare name that
    /// is neither a path nor a `lib*.so` file name, `libnccl-<kind>-<name>.so`.
    pub fn file_names(&self, entry: &str) -> Vec<String> {
        let mut v = vec![entry.to_string()];
        let is_file_name = entry.starts_with("lib") && entry.ends_with(".so");
        if !entry.contains('/') && !is_file_name {
            v.push(format!("libnccl-{}-{entry}.so", self.kind));
        }
        v
    }
}

/// An opened plugin library: closed when dropped, unless [`Library::keep`] was called.
pub struct Library {
    dl: *mut c_void,
    path: String,
}

// SAFETY: a dlopen handle may be used from any thread; nothing in Library is mutated after open
// but `dl` by `keep`, which takes `&mut self`.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

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

impl Library {
    /// Opens one entry of `kind`'s list. `Ok(None)`: no such file (an INFO line, as NCCL);
    /// `Err`: the file exists but cannot be loaded (the caller WARNs and tries the next entry).
    pub fn open(kind: &Kind, entry: &str) -> Result<Option<Library>> {
        let mut missing = Vec::new();
        for file in kind.file_names(entry) {
            let c = CString::new(file.clone())
                .map_err(|_| Error::InvalidArgument(format!("{} entry {file:?} holds a NUL byte", kind.var)))?;
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
                return Err(Error::System(format!(
                    "{}: cannot load {file}: {why}; trying the next {}",
                    kind.label, kind.kind
                )));
            }
            let path = loaded_path(dl).unwrap_or(file);
            return Ok(Some(Library { dl, path }));
        }
        crate::nccl_info!(Subsys::INIT | kind.subsys, "{}: could not find {}", kind.label, missing.join(" or "));
        Ok(None)
    }

    /// The address of the symbol `name`, or null when the library does not export it.
    pub fn symbol(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).expect("symbol names hold no NUL");
        // SAFETY: dl is a live handle from dlopen; c is NUL-terminated.
        unsafe { libc::dlsym(self.dl, c.as_ptr()) }
    }

    /// The file the loader mapped.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Keeps the library mapped for the life of the process: for a plugin whose `init` ran, whose
    /// function pointers and threads may be in use until the process exits.
    pub fn keep(&mut self) {
        self.dl = null_mut();
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        if !self.dl.is_null() {
            // SAFETY: dl came from dlopen and is closed once.
            unsafe { libc::dlclose(self.dl) };
        }
    }
}

/// The versions of one kind's function table a library may export, newest first: an enum with a
/// pointer to each version's struct, declared by [`versions!`].
pub trait Versions: Copy {
    /// The symbols looked up, newest first.
    const SYMBOLS: &'static [&'static str];
    /// The newest table `lib` exports.
    fn lookup(lib: &Library) -> Option<Self>;
    /// The table's version number (`ncclTunerPlugin_v5`: 5).
    fn version(self) -> u32;
    /// The symbol the table was exported as.
    fn symbol(self) -> &'static str;
    /// The table's address.
    fn ptr(self) -> *const c_void;
}

/// Declares `$name`, a [`Versions`] enum, from its versions newest first: variant, the table's
/// struct, and its number, appended to `$prefix` for the symbol (`"ncclNetPlugin_v"`).
macro_rules! versions {
    ($(#[$m:meta])* $name:ident, $prefix:literal, $($v:ident($t:ty) = $n:literal),+ $(,)?) => {
        $(#[$m])*
        #[derive(Clone, Copy)]
        pub enum $name {
            $($v(*const $t)),+
        }

        impl $crate::plugin::Versions for $name {
            const SYMBOLS: &'static [&'static str] = &[$(concat!($prefix, $n)),+];

            fn lookup(lib: &$crate::plugin::Library) -> Option<Self> {
                $(
                    let p = lib.symbol(concat!($prefix, $n));
                    if !p.is_null() {
                        return Some($name::$v(p.cast()));
                    }
                )+
                None
            }

            fn version(self) -> u32 {
                match self {
                    $($name::$v(_) => $n),+
                }
            }

            fn symbol(self) -> &'static str {
                match self {
                    $($name::$v(_) => concat!($prefix, $n)),+
                }
            }

            fn ptr(self) -> *const std::ffi::c_void {
                match self {
                    $($name::$v(p) => p.cast()),+
                }
            }
        }
    };
}
pub(crate) use versions;

/// An opened plugin library, the newest table of its kind it exports and the name the table gives.
pub struct Loaded<T> {
    lib: Library,
    name: String,
    pub(crate) table: T,
}

// SAFETY: the table is the library's static data, read-only; see `Library`.
unsafe impl<T: Versions> Send for Loaded<T> {}
// SAFETY: as above.
unsafe impl<T: Versions> Sync for Loaded<T> {}

impl<T: Versions> Loaded<T> {
    /// Takes `lib` with the newest table it exports. A library that exports none is refused with
    /// an error naming it (as `kind`'s messages start) and the symbols, then `instead`: what
    /// happens without it.
    pub fn find(kind: &Kind, lib: Library, instead: &str) -> Result<Self> {
        let Some(table) = T::lookup(&lib) else {
            return Err(Error::System(format!(
                "{}: {} exports none of {}; {instead}",
                kind.label,
                lib.path(),
                T::SYMBOLS.join(", ")
            )));
        };
        // SAFETY: every version of every plugin table starts with `const char* name`; the table
        // is the library's static data, valid while it is loaded.
        let p = unsafe { *(table.ptr() as *const *const c_char) };
        let name = if p.is_null() {
            "(unnamed)".into()
        } else {
            // SAFETY: a plugin's name is a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Ok(Loaded { lib, name, table })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> &str {
        self.lib.path()
    }

    pub fn version(&self) -> u32 {
        self.table.version()
    }

    /// The symbol the table was exported as.
    pub fn symbol(&self) -> &'static str {
        self.table.symbol()
    }

    /// See [`Library::keep`].
    pub fn keep(&mut self) {
        self.lib.keep();
    }
}

/// Our error for a plugin call's return code `rc` (non-zero), with `msg` naming plugin and call.
pub fn error_for(rc: c_int, msg: String) -> Error {
    match rc {
        1 => Error::Cuda(msg),
        3 => Error::Internal(msg),
        4 => Error::InvalidArgument(msg),
        5 => Error::InvalidUsage(msg),
        6 => Error::Remote(msg),
        _ => Error::System(msg),
    }
}

/// What looking for one kind of plugin came to: the library in use and how it was found, or why
/// there is none (`ferronickel info` shows it).
pub struct Found<T> {
    pub plugin: Option<T>,
    /// One line per entry tried: loaded, not found, or refused and why.
    pub notes: Vec<String>,
}

/// Tries the entries `kind`'s variable lists, in order, and keeps the first that `accept` takes
/// (it looks up the symbols and may refuse the library with an error, which is WARNed and noted).
pub fn find<T>(kind: &Kind, value: Option<&str>, accept: impl Fn(Library) -> Result<T>) -> Found<T> {
    let mut notes = Vec::new();
    let entries = kind.candidates(value);
    if entries.is_empty() {
        notes.push(format!("{}=none: no {} plugin", kind.var, kind.kind));
    }
    for entry in entries {
        match Library::open(kind, &entry) {
            Ok(None) => notes.push(format!("{entry}: not found")),
            Ok(Some(lib)) => {
                let path = lib.path().to_string();
                match accept(lib) {
                    Ok(t) => {
                        notes.push(format!("{entry}: loaded from {path}"));
                        return Found { plugin: Some(t), notes };
                    }
                    Err(e) => {
                        crate::nccl_warn!("{e}");
                        notes.push(format!("{entry}: refused: {e}"));
                    }
                }
            }
            Err(e) => {
                crate::nccl_warn!("{e}");
                notes.push(format!("{entry}: refused: {e}"));
            }
        }
    }
    Found { plugin: None, notes }
}

/// The file the loader actually mapped, for messages.
fn loaded_path(dl: *mut c_void) -> Option<String> {
    let mut map: *mut c_void = null_mut();
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

#[cfg(test)]
mod tests {
    use super::*;

    const NET: Kind = Kind {
        var: "NCCL_NET_PLUGIN",
        kind: "net",
        default: "libnccl-net.so",
        label: "NET/Plugin",
        subsys: Subsys::NET,
        list: true,
    };

    #[test]
    fn plugin_list_as_nccl_reads_it() {
        assert_eq!(NET.candidates(None), ["libnccl-net.so"]);
        assert!(NET.candidates(Some("none")).is_empty());
        assert!(NET.candidates(Some("NONE")).is_empty());
        assert_eq!(NET.candidates(Some("a, /x/libb.so,,c")), ["a", "/x/libb.so", "c"]);
        assert_eq!(NET.candidates(Some(&vec!["p"; 20].join(","))).len(), MAX_LISTED);
    }

    #[test]
    fn file_names_of_an_entry() {
        assert_eq!(NET.file_names("aws-ofi"), ["aws-ofi", "libnccl-net-aws-ofi.so"]);
        assert_eq!(NET.file_names("libfoo.so"), ["libfoo.so"]);
        assert_eq!(NET.file_names("./x.so"), ["./x.so"]);
        assert_eq!(NET.file_names("/opt/libnccl-net.so"), ["/opt/libnccl-net.so"]);
        assert_eq!(NET.file_names("libfoo"), ["libfoo", "libnccl-net-libfoo.so"]);
        let tuner = Kind { kind: "tuner", list: false, ..NET };
        assert_eq!(tuner.file_names("x"), ["x", "libnccl-tuner-x.so"]);
        // One name, commas and all, as NCCL reads NCCL_TUNER_PLUGIN.
        assert_eq!(tuner.candidates(Some(" a,b ")), ["a,b"]);
        assert!(tuner.candidates(Some("none")).is_empty());
    }

    #[test]
    fn a_missing_plugin_is_not_an_error() {
        assert!(Library::open(&NET, "ferronickel-no-such-plugin").unwrap().is_none());
    }
}
