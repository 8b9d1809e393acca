//! Build script: generates the kernel translation units and the host's kernel table from one
//! list, compiles the units with nvcc 13.0 in parallel into fatbins embedded in the library, binds
//! `kernels/device_abi.h`, the net plugin ABI (`src/transport/net/net_plugin_abi.h`) and the tuner and
//! profiler plugin ABI (`src/plugin/plugin_abi.h`) into Rust with bindgen, and gives the cdylib NCCL's SONAME.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const NVCC_HELP: &str = "nvcc 13.0 was not found. ferronickel's CUDA kernels need it to build.\n\
  Install it from PyPI:  python3 -m pip install nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 \
nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96\n\
  or point NVCC=/path/to/nvcc or CUDA_HOME=/usr/local/cuda at an installed toolkit.";

/// nvcc's options besides the architectures. `--threads 0` compiles the architectures in
/// parallel. By default nvcc compresses only large images, and a unit's SASS is smaller than that:
/// `--compress-mode=size` compresses every image (zstd, undone by the driver at load), which keeps
/// the library's kernels at about a quarter of their size.
const NVCC_FLAGS: [&str; 8] =
    ["-fatbin", "-O3", "-std=c++17", "--threads", "0", "-Xptxas", "-warn-spills", "--compress-mode=size"];

/// A device data type, in `fnDataType` order (`kernels/device_abi.h`), which is also
/// `ncclDataType_t`'s: the generated table asserts both at compile time.
struct DType {
    tag: &'static str,
    abi: &'static str,
    nccl: &'static str,
    int: bool,
    /// An unsigned integer's signed twin of the same width: two's complement addition and
    /// multiplication give the same bits whatever the sign, so their sign-blind kernels are one.
    signed_twin: Option<&'static str>,
    /// Relative nvcc cost (measured CPU time of the unit), to start the slowest units first.
    cost: u32,
    /// The oldest compute capability that runs this type's collectives (fp8 needs 9.0: the API
    /// refuses it below, see `api::coll`), so older architectures are not compiled for it.
    min_arch: u32,
}

const DTYPES: [DType; 12] = [
    DType { tag: "i8", abi: "FN_INT8", nccl: "ncclInt8", int: true, signed_twin: None, cost: 4, min_arch: 0 },
    DType { tag: "u8", abi: "FN_UINT8", nccl: "ncclUint8", int: true, signed_twin: Some("i8"), cost: 2, min_arch: 0 },
    DType { tag: "i32", abi: "FN_INT32", nccl: "ncclInt32", int: true, signed_twin: None, cost: 3, min_arch: 0 },
    DType {
        tag: "u32",
        abi: "FN_UINT32",
        nccl: "ncclUint32",
        int: true,
        signed_twin: Some("i32"),
        cost: 1,
        min_arch: 0,
    },
    DType { tag: "i64", abi: "FN_INT64", nccl: "ncclInt64", int: true, signed_twin: None, cost: 3, min_arch: 0 },
    DType {
        tag: "u64",
        abi: "FN_UINT64",
        nccl: "ncclUint64",
        int: true,
        signed_twin: Some("i64"),
        cost: 1,
        min_arch: 0,
    },
    DType { tag: "f16", abi: "FN_FLOAT16", nccl: "ncclFloat16", int: false, signed_twin: None, cost: 4, min_arch: 0 },
    DType { tag: "f32", abi: "FN_FLOAT32", nccl: "ncclFloat32", int: false, signed_twin: None, cost: 3, min_arch: 0 },
    DType { tag: "f64", abi: "FN_FLOAT64", nccl: "ncclFloat64", int: false, signed_twin: None, cost: 3, min_arch: 0 },
    DType {
        tag: "bf16",
        abi: "FN_BFLOAT16",
        nccl: "ncclBfloat16",
        int: false,
        signed_twin: None,
        cost: 4,
        min_arch: 0,
    },
    DType {
        tag: "e4m3",
        abi: "FN_FP8E4M3",
        nccl: "ncclFloat8e4m3",
        int: false,
        signed_twin: None,
        cost: 4,
        min_arch: 90,
    },
    DType {
        tag: "e5m2",
        abi: "FN_FP8E5M2",
        nccl: "ncclFloat8e5m2",
        int: false,
        signed_twin: None,
        cost: 4,
        min_arch: 90,
    },
];

/// A device reduction operator, in `fnRedOp` order.
struct RedOp {
    tag: &'static str,
    abi: &'static str,
    /// The `ncclRedOp_t` with the same number, where there is one.
    nccl: Option<&'static str>,
    ints_only: bool,
    /// Same bits for signed and unsigned integers of one width.
    sign_blind: bool,
}

const OPS: [RedOp; 6] = [
    RedOp { tag: "sum", abi: "FN_OP_SUM", nccl: Some("ncclSum"), ints_only: false, sign_blind: true },
    RedOp { tag: "prod", abi: "FN_OP_PROD", nccl: Some("ncclProd"), ints_only: false, sign_blind: true },
    RedOp { tag: "max", abi: "FN_OP_MAX", nccl: Some("ncclMax"), ints_only: false, sign_blind: false },
    RedOp { tag: "min", abi: "FN_OP_MIN", nccl: Some("ncclMin"), ints_only: false, sign_blind: false },
    RedOp { tag: "premulsum", abi: "FN_OP_PREMULSUM", nccl: None, ints_only: false, sign_blind: true },
    RedOp { tag: "sumpostdiv", abi: "FN_OP_SUMPOSTDIV", nccl: None, ints_only: true, sign_blind: false },
];

/// The pure data-movement kernel, alone in its unit.
const COPY_KERNEL: &str = "fnCopy";

/// One generated translation unit: one CUDA module at run time.
struct Unit {
    name: String,
    /// (kernel name, the line defining it)
    kernels: Vec<(String, String)>,
    cost: u32,
    /// Architectures older than this are left out of the unit (see [`DType::min_arch`]).
    min_arch: u32,
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let kernels = manifest.join("kernels");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");

    let units = kernel_units();
    let archs = cuda_archs();
    let fatbins = compile_kernels(&kernels, &out, &units, &archs);
    write_kernel_table(&out, &units, &fatbins, &archs);
    bind_device_abi(&kernels, &out);
    bind_net_plugin_abi(&manifest.join("src/transport/net/net_plugin_abi.h"), &out);
    bind_plugin_abi(&manifest.join("src/plugin/plugin_abi.h"), &out);
    bind_device_api(&manifest.join("include"), &out);

    // The loader matches `NEEDED libnccl.so.2` (PyTorch, nccl-tests) against this SONAME.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    link_soname_file(&out);
}

fn coll_name(dtype: &str, op: &str) -> String {
    format!("fnColl_{dtype}_{op}")
}

/// The kernel a (data type, op) pair runs, or None where the pair is not compiled (the host never
/// asks for it): its name and its data type's tag.
fn coll_kernel(d: &DType, o: &RedOp) -> Option<(String, &'static str)> {
    if o.ints_only && !d.int {
        return None;
    }
    let owner = match d.signed_twin {
        Some(twin) if o.sign_blind => twin,
        _ => d.tag,
    };
    Some((coll_name(owner, o.tag), owner))
}

/// The one kernel list: a unit per data type with the kernels it owns, and fnCopy's unit.
fn kernel_units() -> Vec<Unit> {
    let mut units: Vec<Unit> = DTYPES
        .iter()
        .map(|d| {
            let kernels = OPS
                .iter()
                .filter_map(|o| match coll_kernel(d, o) {
                    Some((name, owner)) if owner == d.tag => {
                        let line = format!("FN_COLL_KERNEL({name}, {}, {})", d.abi, o.abi);
                        Some((name, line))
                    }
                    _ => None,
                })
                .collect();
            Unit { name: d.tag.to_string(), kernels, cost: d.cost, min_arch: d.min_arch }
        })
        .collect();
    units.push(Unit {
        name: "copy".into(),
        kernels: vec![(COPY_KERNEL.into(), format!("FN_COPY_KERNEL({COPY_KERNEL})"))],
        cost: 0,
        min_arch: 0,
    });
    units
}

/// The unit's generated source; it names the targets it is compiled for, so the kernel cache's
/// key (which hashes the sources) changes with them.
fn unit_source(u: &Unit, gencode: &[String]) -> String {
    let mut s = String::from("// Generated by build.rs from its kernel list: do not edit.\n");
    s.push_str(&format!("// Compiled for: {}\n#include \"collectives.cuh\"\n", targets(gencode).join(" ")));
    for (_, line) in &u.kernels {
        s.push_str(line);
        s.push('\n');
    }
    s
}

/// nvcc from $NVCC, $CUDA_HOME, /usr/local/cuda, PATH, or the PyPI wheels of this python3.
fn find_nvcc() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(p) = std::env::var("NVCC") {
        candidates.push(p.into());
    }
    if let Ok(h) = std::env::var("CUDA_HOME") {
        candidates.push(Path::new(&h).join("bin/nvcc"));
    }
    candidates.push("/usr/local/cuda/bin/nvcc".into());
    if let Some(paths) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&paths).map(|d| d.join("nvcc")));
    }
    let py = Command::new("python3")
        .args([
            "-c",
            "import nvidia, os; print('\\n'.join(os.path.join(p, 'cu13', 'bin', 'nvcc') for p in nvidia.__path__))",
        ])
        .output();
    if let Ok(o) = py {
        candidates.extend(String::from_utf8_lossy(&o.stdout).lines().map(PathBuf::from));
    }
    candidates.into_iter().find(|p| p.is_file())
}

/// The architectures to compile for: `FERRONICKEL_CUDA_ARCH` (comma-separated compute
/// capabilities such as `90` or `80,90`), by default 80 and 90, sorted.
fn cuda_archs() -> Vec<u32> {
    println!("cargo:rerun-if-env-changed=FERRONICKEL_CUDA_ARCH");
    let spec = std::env::var("FERRONICKEL_CUDA_ARCH").unwrap_or_default();
    let spec = if spec.trim().is_empty() { "80,90".to_string() } else { spec };
    let mut archs: Vec<u32> = spec
        .split(',')
        .map(|a| match a.trim().parse::<u32>() {
            // __grid_constant__ needs compute capability 7.0; 13.0 compiles nothing older than 7.5.
            Ok(n) if (75..=1300).contains(&n) => n,
            _ => panic!(
                "FERRONICKEL_CUDA_ARCH={spec:?}: expected compute capabilities such as 90 or 80,90 \
                 (75 or newer); unset it to build the default sm_80 + sm_90 SASS and compute_80 PTX"
            ),
        })
        .collect();
    archs.sort_unstable();
    archs.dedup();
    assert!(!archs.is_empty(), "at least one architecture");
    archs
}

/// The architectures of a unit whose kernels need compute capability `min_arch`: the build's
/// own, less the older ones (all of them if that would leave none, so that a build for old GPUs
/// only still has every unit).
fn unit_archs(archs: &[u32], min_arch: u32) -> Vec<u32> {
    let kept: Vec<u32> = archs.iter().copied().filter(|&a| a >= min_arch).collect();
    if kept.is_empty() {
        archs.to_vec()
    } else {
        kept
    }
}

/// nvcc's -gencode arguments for `archs` (sorted): SASS for each, all from the PTX of the oldest,
/// which the fatbin also carries for the driver to compile on newer GPUs. One PTX per unit means
/// one front end and optimiser pass (cicc) instead of one per architecture, about a sixth of a
/// unit's nvcc time; the kernels hold nothing that differs between compute_80 and compute_90
/// except bf16's widening to float (a shift on compute_80, `cvt.f32.bf16` on compute_90: the same
/// value), so the sm_90 SASS computes what it did. (README, "Building".)
fn gencode(archs: &[u32]) -> Vec<String> {
    let ptx = archs[0];
    let sass: Vec<String> = archs.iter().map(|a| format!("sm_{a}")).collect();
    vec!["-gencode".into(), format!("arch=compute_{ptx},code=[{},compute_{ptx}]", sass.join(","))]
}

/// What the -gencode arguments produce: `sm_80` (SASS), `compute_90` (PTX), ...
fn targets(gencode: &[String]) -> Vec<&str> {
    gencode
        .iter()
        .filter_map(|g| g.split_once("code="))
        .flat_map(|(_, c)| c.trim_matches(['[', ']']).split(','))
        .collect()
}

/// Live progress for a person at a terminal. cargo shows a build script's `cargo:warning` lines
/// only once the script has finished, so while nvcc runs the lines go straight to the terminal
/// (clearing cargo's progress bar first) and to stderr, which `cargo build -vv` streams.
struct Progress {
    tty: Option<std::fs::File>,
    start: Instant,
}

impl Progress {
    fn new() -> Progress {
        let tty = std::fs::OpenOptions::new().write(true).open("/dev/tty").ok();
        Progress { tty, start: Instant::now() }
    }

    fn say(&mut self, msg: &str) {
        let line = format!("ferronickel: [{}] {msg}", mins(self.start.elapsed()));
        eprintln!("{line}");
        if let Some(t) = self.tty.as_mut() {
            let _ = writeln!(t, "\r\x1b[K{line}");
        }
    }
}

fn mins(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}m{:02}s", s / 60, s % 60)
}

/// CPU time of every child this process has waited for (nvcc and the tools it ran).
fn children_cpu() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we pass; RUSAGE_CHILDREN is always valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Writes the units' sources into OUT_DIR and compiles each into `<unit>.fatbin` there (from the
/// cache when it holds them), several nvcc at a time. Returns the fatbins in unit order.
fn compile_kernels(kernels: &Path, out: &Path, units: &[Unit], archs: &[u32]) -> Vec<PathBuf> {
    // The headers the units include (kernels/README.md is not one of them).
    let mut headers: Vec<PathBuf> = std::fs::read_dir(kernels)
        .expect("kernels/ directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "cuh" || e == "h"))
        .collect();
    headers.sort();
    // A directory: cargo reruns us when any file in it changes, is added or removed.
    println!("cargo:rerun-if-changed={}", kernels.display());
    let nvcc = find_nvcc().unwrap_or_else(|| panic!("{NVCC_HELP}"));
    // The tests that compile CUDA against the device headers use the same compiler.
    println!("cargo:rustc-env=FERRONICKEL_NVCC={}", nvcc.display());
    // The CUDA release the kernels are compiled with, for the log's version line ("+cuda13.0").
    println!("cargo:rustc-env=FERRONICKEL_CUDA_VERSION={}", cuda_release(&nvcc));
    let src_dir = out.join("kernels");
    std::fs::create_dir_all(&src_dir).unwrap();
    let sources: Vec<(PathBuf, String)> = units
        .iter()
        .map(|u| {
            let path = src_dir.join(format!("{}.cu", u.name));
            let text = unit_source(u, &gencode(&unit_archs(archs, u.min_arch)));
            std::fs::write(&path, &text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            (path, text)
        })
        .collect();

    let cache = kernel_cache(&nvcc, &headers, &sources, &gencode(archs));
    let fatbins: Vec<PathBuf> = units.iter().map(|u| out.join(format!("{}.fatbin", u.name))).collect();
    let mut todo: Vec<usize> = Vec::new();
    for (i, u) in units.iter().enumerate() {
        match cache.as_ref().map(|c| c.join(format!("{}.fatbin", u.name))).filter(|f| f.is_file()) {
            Some(hit) => {
                std::fs::copy(&hit, &fatbins[i]).unwrap_or_else(|e| panic!("copying {}: {e}", hit.display()));
            }
            None => todo.push(i),
        }
    }
    if todo.is_empty() {
        return fatbins;
    }
    // Slowest first, so the last unit to finish is a short one.
    todo.sort_by_key(|&i| std::cmp::Reverse(units[i].cost));
    let jobs = std::env::var("NUM_JOBS")
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, todo.len());
    let progress = Mutex::new(Progress::new());
    progress.lock().unwrap().say(&format!(
        "compiling {} CUDA kernel units ({}) with nvcc, {jobs} at a time{}; the README's build section says how long",
        todo.len(),
        targets(&gencode(archs)).join(" "),
        cache.as_ref().map(|c| format!(", for {}", c.display())).unwrap_or_default()
    ));

    let queue = Mutex::new(todo.iter().copied().collect::<VecDeque<usize>>());
    let done = Mutex::new(Vec::<(usize, Duration)>::new());
    let failures = Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let Some(i) = queue.lock().unwrap().pop_front() else { break };
                if !failures.lock().unwrap().is_empty() {
                    break;
                }
                let started = Instant::now();
                let mut cmd = Command::new(&nvcc);
                cmd.args(NVCC_FLAGS)
                    .args(gencode(&unit_archs(archs, units[i].min_arch)))
                    .arg("-I")
                    .arg(kernels)
                    .arg(&sources[i].0)
                    .arg("-o")
                    .arg(&fatbins[i]);
                let shown = format!("{cmd:?}");
                let res = cmd.output().unwrap_or_else(|e| panic!("could not run nvcc ({e}): {shown}\n{NVCC_HELP}"));
                // ptxas's spill warnings and anything else nvcc says, for `cargo build -vv`.
                let _ = std::io::stderr().write_all(&res.stderr);
                if !res.status.success() {
                    failures.lock().unwrap().push(format!(
                        "nvcc failed on unit {} ({})\ncommand: {shown}\nstdout:\n{}\nstderr:\n{}",
                        units[i].name,
                        sources[i].0.display(),
                        String::from_utf8_lossy(&res.stdout),
                        String::from_utf8_lossy(&res.stderr)
                    ));
                    continue;
                }
                if let Some(dir) = &cache {
                    // Best effort: a failed store costs the next build a compile, nothing else.
                    let _ = std::fs::create_dir_all(dir)
                        .and_then(|_| std::fs::copy(&fatbins[i], dir.join(format!("{}.fatbin", units[i].name))));
                }
                let took = started.elapsed();
                let mut d = done.lock().unwrap();
                d.push((i, took));
                progress.lock().unwrap().say(&format!(
                    "kernel unit {} done in {} ({}/{})",
                    units[i].name,
                    mins(took),
                    d.len(),
                    todo.len()
                ));
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    if let Some(first) = failures.first() {
        panic!("{first}");
    }
    let done = done.into_inner().unwrap();
    let (slowest, took) = done.iter().max_by_key(|(_, t)| *t).expect("compiled at least one unit");
    let wall = progress.lock().unwrap().start.elapsed();
    println!(
        "cargo:warning=compiled {} CUDA kernel units in {} ({} of nvcc CPU time, {jobs} at a time; slowest: {} in {}){}",
        done.len(),
        mins(wall),
        mins(children_cpu()),
        units[*slowest].name,
        mins(*took),
        cache.map(|c| format!("; kept in {} for later builds", c.display())).unwrap_or_default()
    );
    fatbins
}

/// Where compiled fatbins are kept between builds and checkouts: `$FERRONICKEL_CACHE/kernels/<key>`
/// (default `~/.cache/ferronickel`), the key a hash of nvcc's identity, its options and every
/// source of the units (generated units and kernels/ headers), so any change to a kernel, a header,
/// the list or the compiler misses the cache. `None` (always compile) when `FERRONICKEL_KERNEL_CACHE=0` or no cache directory is
/// known.
fn kernel_cache(nvcc: &Path, headers: &[PathBuf], units: &[(PathBuf, String)], gencode: &[String]) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=FERRONICKEL_CACHE");
    println!("cargo:rerun-if-env-changed=FERRONICKEL_KERNEL_CACHE");
    if std::env::var("FERRONICKEL_KERNEL_CACHE").is_ok_and(|v| v == "0") {
        return None;
    }
    let base = match std::env::var_os("FERRONICKEL_CACHE") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache/ferronickel"),
    };
    let version = Command::new(nvcc).arg("--version").output().ok()?.stdout;
    // Two FNV-1a passes with different offsets: 128 bits, enough that distinct inputs never meet.
    let mut h = [0xcbf29ce484222325u64, 0x84222325cbf29ce4u64];
    let mut feed = |bytes: &[u8]| {
        for x in h.iter_mut() {
            for &b in bytes.iter().chain(&(bytes.len() as u64).to_le_bytes()) {
                *x = (*x ^ b as u64).wrapping_mul(0x100000001b3);
            }
        }
    };
    feed(nvcc.as_os_str().as_encoded_bytes());
    feed(&version);
    for g in NVCC_FLAGS.iter().copied().chain(gencode.iter().map(String::as_str)) {
        feed(g.as_bytes());
    }
    for p in headers {
        feed(p.file_name()?.as_encoded_bytes());
        feed(&std::fs::read(p).ok()?);
    }
    for (p, text) in units {
        feed(p.file_name()?.as_encoded_bytes());
        feed(text.as_bytes());
    }
    Some(base.join("kernels").join(format!("{:016x}{:016x}", h[0], h[1])))
}

/// `kernel_table.rs`, included by `src/cuda/module.rs`: the units' fatbins, every kernel with its
/// unit, the (data type, op) -> kernel table, and compile-time checks that the device numbering
/// is NCCL's where the two correspond.
fn write_kernel_table(out: &Path, units: &[Unit], fatbins: &[PathBuf], archs: &[u32]) {
    let mut t = String::from("// Generated by build.rs from its kernel list: do not edit.\n\n");
    let kernels: Vec<(&str, usize)> =
        units.iter().enumerate().flat_map(|(u, unit)| unit.kernels.iter().map(move |(k, _)| (k.as_str(), u))).collect();
    let index = |name: &str| kernels.iter().position(|(k, _)| *k == name).expect("listed kernel");

    writeln!(t, "pub const NUM_UNITS: usize = {};", units.len()).unwrap();
    writeln!(t, "pub const NUM_KERNELS: usize = {};", kernels.len()).unwrap();
    writeln!(t, "/// Per unit, the architectures compiled to SASS and those with PTX in its fatbin.").unwrap();
    writeln!(t, "pub static UNIT_ARCHS: [(&[u32], &[u32]); NUM_UNITS] = [").unwrap();
    for u in units {
        let g = gencode(&unit_archs(archs, u.min_arch));
        let archs =
            |kind: &str| -> Vec<&str> { targets(&g).into_iter().filter_map(|c| c.strip_prefix(kind)).collect() };
        writeln!(t, "    (&[{}], &[{}]), // {}", archs("sm_").join(", "), archs("compute_").join(", "), u.name)
            .unwrap();
    }
    writeln!(t, "];\n").unwrap();
    writeln!(t, "/// The compiled units, one CUDA module each: (unit, fatbin, generated source).").unwrap();
    writeln!(t, "pub static UNITS: [(&str, &[u8], &str); NUM_UNITS] = [").unwrap();
    for (u, fb) in units.iter().zip(fatbins) {
        let src = out.join("kernels").join(format!("{}.cu", u.name));
        writeln!(
            t,
            "    ({:?}, include_bytes!({:?}), include_str!({:?})),",
            u.name,
            fb.display().to_string(),
            src.display().to_string()
        )
        .unwrap();
    }
    writeln!(t, "];\n").unwrap();

    writeln!(t, "/// Every kernel the units define, indexed by `KernelId`.").unwrap();
    writeln!(t, "pub static KERNELS: [KernelDef; NUM_KERNELS] = [").unwrap();
    for (k, u) in &kernels {
        writeln!(t, "    KernelDef {{ name: c{k:?}, unit: {u} }},").unwrap();
    }
    writeln!(t, "];\n").unwrap();

    writeln!(t, "/// `COLL[fnDataType][fnRedOp]`: the kernel running that reduction, or `NO_KERNEL` where none is")
        .unwrap();
    writeln!(t, "/// compiled. Unsigned integers run their signed twin's Sum, Prod and PreMulSum (same bits).")
        .unwrap();
    writeln!(t, "pub static COLL: [[u16; crate::abi::FN_NUM_OPS as usize]; crate::abi::FN_NUM_TYPES as usize] = [")
        .unwrap();
    for d in &DTYPES {
        let row: Vec<String> = OPS
            .iter()
            .map(|o| coll_kernel(d, o).map_or("NO_KERNEL".to_string(), |(name, _)| index(&name).to_string()))
            .collect();
        writeln!(t, "    [{}], // {}", row.join(", "), d.tag).unwrap();
    }
    writeln!(t, "];\n").unwrap();
    writeln!(t, "/// The pure data-movement kernel.").unwrap();
    writeln!(t, "pub const COPY: u16 = {};", index(COPY_KERNEL)).unwrap();
    writeln!(t, "/// `COLL` entries with no kernel.").unwrap();
    writeln!(t, "pub const NO_KERNEL: u16 = u16::MAX;\n").unwrap();

    writeln!(t, "// The tables above are indexed by the device enums, which NCCL's numbering must match.").unwrap();
    for (i, d) in DTYPES.iter().enumerate() {
        writeln!(
            t,
            "const _: () = assert!(crate::abi::{} as i64 == {i} && crate::types::{} as i64 == {i});",
            d.abi, d.nccl
        )
        .unwrap();
    }
    for (i, o) in OPS.iter().enumerate() {
        match o.nccl {
            Some(n) => writeln!(
                t,
                "const _: () = assert!(crate::abi::{} as i64 == {i} && crate::types::{n} as i64 == {i});",
                o.abi
            ),
            None => writeln!(t, "const _: () = assert!(crate::abi::{} as i64 == {i});", o.abi),
        }
        .unwrap();
    }
    std::fs::write(out.join("kernel_table.rs"), t).unwrap();
}

/// Generates the bindings `builder` describes into `out/file`, with what every binding shares:
/// `Default` for each struct and bindgen's layout tests, which check every size and offset
/// against the header. `header` is watched and named if bindgen fails.
fn bind(builder: bindgen::Builder, header: &Path, out: &Path, file: &str) {
    println!("cargo:rerun-if-changed={}", header.display());
    let bindings = builder.derive_default(true).layout_tests(true).generate().unwrap_or_else(|e| {
        panic!("bindgen failed on {} ({e}); it needs libclang: apt-get install libclang-dev", header.display())
    });
    bindings.write_to_file(out.join(file)).unwrap();
}

/// A C ABI header shared with code we do not control (kernels, plugins): its enums become integer
/// constants, since the other side may hand back any integer and an out-of-range Rust enum would
/// be undefined behaviour.
fn bind_c_abi(header: &Path, types: &str, vars: &str, out: &Path, file: &str) {
    let builder = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_type(types)
        .allowlist_var(vars)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false);
    bind(builder, header, out, file);
}

fn bind_device_abi(kernels: &Path, out: &Path) {
    bind_c_abi(&kernels.join("device_abi.h"), "fn.*", "FN_.*", out, "device_abi.rs");
}

/// The structs, function tables and constants of NCCL net plugins v8 to v11, from the one C
/// definition the test plugins also build against.
fn bind_net_plugin_abi(header: &Path, out: &Path) {
    let types = "ncclNet.*|ncclDebugLogger_t|ncclProfilerCallback_t|ncclResult_t|ncclDebugLogLevel";
    bind_c_abi(header, types, "NCCL_(NET|PTR)_.*|ncclProfilerNetEvent.*", out, "net_plugin_abi.rs");
}

/// The tuner and profiler plugin ABIs (`src/plugin/plugin_abi.h`), bound as the net plugin's.
fn bind_plugin_abi(header: &Path, out: &Path) {
    let types = "ncclTuner.*|ncclNvlDomainInfo.*|ncclProfiler.*|ncclFunc_t|ncclDebugLogger_t|ncclResult_t";
    let vars = "NCCL_(ALGO|PROTO|NUM|HW|PROFILER_NET)_.*|ncclProfile.*";
    bind_c_abi(header, types, vars, out, "plugin_abi.rs");
}

/// The device API's shared types (`include/nccl_device/core.h`, also included by the device
/// headers). The few `nccl.h` types it names are declared in front of it (the communicator and the
/// result opaquely, left out of the bindings), so no CUDA header is needed here. tests/device_abi.rs
/// checks the header against NVIDIA's.
fn bind_device_api(include: &Path, out: &Path) {
    let front = "#define NCCL_H_\n\
                 typedef struct ncclComm* ncclComm_t;\n\
                 typedef struct ncclWindow_vidmem* ncclWindow_t;\n\
                 typedef int ncclResult_t;\n\
                 #include \"nccl_device/core.h\"\n";
    let builder = bindgen::Builder::default()
        .header_contents("device_api_front.h", front)
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_type("ncclTeam.*|ncclDev.*|ncclWindow_vidmem|ncclMultimem.*|ncclLsaBarrier.*|ncclGin.*|ncclLLA2A.*")
        .allowlist_var("NCCL_GIN_MAX_CONTEXTS")
        .blocklist_type("ncclComm_t|ncclComm|ncclResult_t")
        .derive_partialeq(true);
    bind(builder, &include.join("nccl_device/core.h"), out, "device_api.rs");
}

/// `target/<profile>/libnccl.so.2` pointing at the cdylib, the name loaders and LD_PRELOAD use.
fn link_soname_file(out: &Path) {
    // OUT_DIR is target/<profile>/build/<pkg>-<hash>/out.
    let Some(profile_dir) = out.ancestors().nth(3) else { return };
    let link = profile_dir.join("libnccl.so.2");
    if std::fs::symlink_metadata(&link).is_err() {
        let _ = std::os::unix::fs::symlink("libnccl.so", &link);
    }
}

/// `nvcc --version`'s release (`13.0` from "Cuda compilation tools, release 13.0, V13.0.48"), or
/// `unknown`.
fn cuda_release(nvcc: &Path) -> String {
    let out = Command::new(nvcc).arg("--version").output().map(|o| o.stdout).unwrap_or_default();
    let text = String::from_utf8_lossy(&out);
    text.split("release ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| c == ',' || c.is_whitespace()).next())
        .filter(|r| !r.is_empty())
        .unwrap_or("unknown")
        .to_string()
}
