//! Builds C programs as a user would (`cc app.c -I include -lnccl`, plus the CUDA include
//! directory) against the freshly built library, runs them with LD_LIBRARY_PATH, and requires
//! every check in them to pass and the calls to land in our library.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory holding only `libnccl.so` and the `libnccl.so.2` SONAME link, both pointing at
/// the cdylib cargo just built (`target/<profile>/deps` has no `libnccl.so.2`); one per test, as
/// tests run at once.
fn private_lib_dir(test: &str) -> PathBuf {
    let so = cdylib();
    let dir = scratch(&format!("clink/lib-{test}"));
    for name in ["libnccl.so", "libnccl.so.2"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&so, &link)
            .unwrap_or_else(|e| panic!("cannot link {} -> {}: {e}", link.display(), so.display()));
    }
    dir
}

/// Compiles `tests/c/<name>.c` as a user would, against our include and a private library
/// directory: that directory and the program.
fn build(name: &str) -> (PathBuf, PathBuf) {
    let lib = private_lib_dir(name);
    let app = scratch("clink").join(name);
    run_ok(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(root().join(format!("tests/c/{name}.c")))
            .arg("-I")
            .arg(our_include())
            .arg("-I")
            .arg(cuda_include())
            .arg("-L")
            .arg(&lib)
            .arg("-lnccl")
            .arg("-o")
            .arg(&app),
    );
    (lib, app)
}

/// Runs `app` with `lib` as its only library directory (no LD_PRELOAD) and `env` set: whether it
/// succeeded, a message showing its status and output, and its stdout and stderr.
fn run(app: &Path, lib: &Path, env: &[(&str, &str)]) -> (bool, String, String, String) {
    let out = Command::new(app)
        .env("LD_LIBRARY_PATH", lib)
        .env_remove("LD_PRELOAD")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", app.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let shown =
        format!("{} failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}", app.display(), out.status);
    (out.status.success(), shown, stdout, stderr)
}

#[test]
fn c_app_links_with_lnccl_and_runs() {
    let (lib, app) = build("link_app");
    let dynamic = stdout_of(Command::new("readelf").arg("-d").arg(&app));
    assert!(
        dynamic.contains("Shared library: [libnccl.so.2]"),
        "the app should record NEEDED libnccl.so.2 (our SONAME); readelf -d:\n{dynamic}"
    );

    let (ok, shown, stdout, _) = run(&app, &lib, &[("NCCL_DEBUG", "WARN")]);
    assert!(ok, "{shown}");
    let loaded = stdout.lines().find_map(|l| l.strip_prefix("library: ")).unwrap_or("<not reported>");
    assert!(
        loaded.starts_with(lib.to_str().unwrap()),
        "link_app's ncclGetVersion came from {loaded}, not from {}",
        lib.display()
    );
    assert!(stdout.contains(", 0 failed"), "link_app did not report its checks:\n{stdout}");
}

/// Calls made from an exit handler, after exit() destroyed the main thread's thread-locals
/// (tests/c/exit_calls.c), return result codes: the library must not abort the process there.
#[test]
fn calls_from_an_exit_handler_return_codes_and_never_abort() {
    let (lib, app) = build("exit_calls");
    let (ok, shown, stdout, stderr) = run(&app, &lib, &[]);
    assert!(ok && stdout.contains("exit_calls: ok") && !stderr.contains("panicked"), "{shown}");
}
