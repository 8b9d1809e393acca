//! Shared helpers of the integration tests that compile C/C++ or inspect the built library.
//!
//! Where things are found:
//! - CUDA headers: `$FERRONICKEL_CUDA_INCLUDE`, else `.deps/cuda-include` (made by
//!   `scripts/setup-deps.sh`).
//! - NVIDIA's reference `nccl.h` 2.28.9: `$FERRONICKEL_NCCL_REF_INCLUDE`, else
//!   `.deps/nvidia-nccl/include` (extracted by `scripts/setup-deps.sh`).
//! - The built cdylib: `target/<profile>/deps/libnccl.so`, next to the test binary. `cargo test`
//!   compiles the library once with both crate types (cdylib + rlib) before it builds the
//!   integration tests, but it does not copy the cdylib up to `target/<profile>/libnccl.so`
//!   (only `cargo build` does), so the copy in `deps/` is the one that is always fresh.
//!
//! A missing dependency is a test failure with a message saying how to get it, never a skip.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const SETUP: &str = "run `bash scripts/setup-deps.sh` (it installs/fetches everything the tests need)";

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A scratch directory for this test binary's files, under the target directory.
pub fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
    d
}

fn dir_from_env_or(var: &str, default: PathBuf, must_hold: &str, what: &str) -> PathBuf {
    let (dir, origin) = match std::env::var_os(var) {
        Some(v) if !v.is_empty() => (PathBuf::from(v), format!("${var}")),
        _ => (default, "the default".to_string()),
    };
    if !dir.join(must_hold).is_file() {
        panic!(
            "{what} not found: {} ({origin}) has no {must_hold}.\n  Fix: {SETUP}\n  or set {var} to a directory holding {must_hold}.",
            dir.display()
        );
    }
    dir
}

pub fn cuda_include() -> PathBuf {
    dir_from_env_or(
        "FERRONICKEL_CUDA_INCLUDE",
        root().join(".deps/cuda-include"),
        "cuda_runtime.h",
        "CUDA headers (cuda_runtime.h, cuda_fp16.h, cuda_bf16.h, cuda_fp8.h)",
    )
}

pub fn nvidia_include() -> PathBuf {
    let d = dir_from_env_or(
        "FERRONICKEL_NCCL_REF_INCLUDE",
        root().join(".deps/nvidia-nccl/include"),
        "nccl.h",
        "NVIDIA's reference nccl.h (NCCL 2.28.9)",
    );
    let text = std::fs::read_to_string(d.join("nccl.h")).unwrap();
    assert!(
        text.lines().any(|l| l.trim() == "#define NCCL_VERSION_CODE 22809"),
        "{} is not NCCL 2.28.9's header (no `#define NCCL_VERSION_CODE 22809`); {SETUP}",
        d.join("nccl.h").display()
    );
    d
}

pub fn our_include() -> PathBuf {
    let d = root().join("include");
    assert!(d.join("nccl.h").is_file(), "include/nccl.h is missing; FERRONICKEL_BLESS=1 cargo test --test header");
    d
}

/// `target/<profile>/deps`, the directory of this test binary, where cargo leaves the cdylib.
pub fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().expect("test binary has a parent directory").to_path_buf()
}

/// The freshly built `libnccl.so` (see the module docs for why `deps/`).
pub fn cdylib() -> PathBuf {
    let so = deps_dir().join("libnccl.so");
    assert!(
        so.is_file(),
        "{} does not exist. cargo builds the cdylib (crate-type = [\"cdylib\", \"rlib\"] in Cargo.toml) \
         before the integration tests and leaves it there; did the crate type change?",
        so.display()
    );
    so
}

/// Runs a command; panics with the full command line and its output if it cannot start or fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    if !out.status.success() {
        panic!(
            "command failed ({}):\n  {shown}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

pub fn stdout_of(cmd: &mut Command) -> String {
    String::from_utf8(run_ok(cmd).stdout).expect("non-UTF-8 output")
}

/// Lines of a committed list (tests/data/*.txt): trimmed, without blanks and `#` comments.
pub fn read_list(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

/// Runs a command with a hard time limit: past `limit` it is killed and the test fails naming it.
/// Output is read on threads, so a chatty child cannot block on a full pipe.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::io::Read;
    use std::process::Stdio;
    let shown = format!("{cmd:?}");
    let mut child =
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap_or_else(|e| panic!("waiting for {shown}: {e}")) {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} did not finish within {limit:?}; killed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output { status, stdout: out.join().expect("stdout reader"), stderr: err.join().expect("stderr reader") }
}

/// Hosts of network and UTS namespaces for the cross-host tests (tests/hosts.rs).
pub mod hosts;

/// A fault-injecting TCP relay (delay, stall, cut one stream) for the net tests (tests/net_relay.rs).
pub mod relay;

/// Drives a net's connect and accept to the end (both sides in this thread): the comm pair.
pub fn finish_connect(
    mut conn: Box<dyn nccl::transport::net::Connecting>,
    listener: &mut dyn nccl::transport::net::Listener,
    within: std::time::Duration,
) -> (Box<dyn nccl::transport::net::SendComm>, Box<dyn nccl::transport::net::RecvComm>) {
    let (mut s, mut r) = (None, None);
    let until = std::time::Instant::now() + within;
    while s.is_none() || r.is_none() {
        assert!(std::time::Instant::now() < until, "connect/accept did not complete within {within:?}");
        if s.is_none() {
            s = conn.poll().unwrap();
        }
        if r.is_none() {
            r = listener.accept().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    (s.unwrap(), r.unwrap())
}

/// The nvcc that built the library's kernels (build.rs passes its path).
pub fn nvcc() -> PathBuf {
    PathBuf::from(env!("FERRONICKEL_NVCC"))
}
