//! Builds C programs as a user would (`cc app.c -I include -lnccl`, plus the CUDA include
//! directory) against the freshly built library, runs them with LD_LIBRARY_PATH, and requires
//! every check in them to pass and the calls to land in our library.

mod common;

use common::*;
use std::path::PathBuf;
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

#[test]
fn c_app_links_with_lnccl_and_runs() {
    let lib = private_lib_dir("link_app");
    let app = scratch("clink").join("link_app");
    run_ok(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(root().join("tests/c/link_app.c"))
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

    let dynamic = stdout_of(Command::new("readelf").arg("-d").arg(&app));
    assert!(
        dynamic.contains("Shared library: [libnccl.so.2]"),
        "the app should record NEEDED libnccl.so.2 (our SONAME); readelf -d:\n{dynamic}"
    );

    let out = Command::new(&app)
        .env("LD_LIBRARY_PATH", &lib)
        .env_remove("LD_PRELOAD")
        .env("NCCL_DEBUG", "WARN")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", app.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "link_app failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        out.status
    );
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
    let lib = private_lib_dir("exit_calls");
    let app = scratch("clink").join("exit_calls");
    run_ok(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(root().join("tests/c/exit_calls.c"))
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
    let out = Command::new(&app)
        .env("LD_LIBRARY_PATH", &lib)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", app.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("exit_calls: ok") && !stderr.contains("panicked"),
        "exit_calls failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        out.status
    );
}
