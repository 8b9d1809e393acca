//! `scripts/install.sh` into a fresh prefix, then the build systems users have find and link it:
//! a plain `cc $(pkg-config --cflags --libs nccl)`, and `tests/cmake` with CMake's find_path /
//! find_library, with pkg-config through CMake, and with PyTorch's FindNCCL search (NCCL_ROOT,
//! or NCCL_INCLUDE_DIR + NCCL_LIB_DIR, and its version checks). Each program calls
//! ncclGetVersion and must land in the installed library. The device API's headers install too, and a
//! kernel and a CUDA-free host file build against them.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

fn run_ok_within(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let out = output_within(cmd, LIMIT);
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "command failed ({}):\n  {shown}\n--- stdout ---\n{so}\n--- stderr ---\n{se}",
        out.status
    );
    so.into_owned()
}

fn require_tool(name: &str) {
    let found =
        Command::new("sh").args(["-c", &format!("command -v {name}")]).output().is_ok_and(|o| o.status.success());
    assert!(found, "{name} is not installed; {SETUP}");
}

/// A directory holding the freshly built library and command under the names install.sh takes.
fn staged_build(dir: &Path) -> PathBuf {
    let stage = dir.join("from");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage).unwrap();
    std::os::unix::fs::symlink(cdylib(), stage.join("libnccl.so")).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ferronickel"), stage.join("ferronickel")).unwrap();
    stage
}

fn install(dir: &Path) -> PathBuf {
    let prefix = dir.join("prefix");
    let _ = std::fs::remove_dir_all(&prefix);
    let stage = staged_build(dir);
    run_ok_within(
        Command::new("bash")
            .arg(root().join("scripts/install.sh"))
            .arg("--prefix")
            .arg(&prefix)
            .arg("--from")
            .arg(&stage)
            .arg("--cuda-include")
            .arg(cuda_include()),
    );
    prefix.canonicalize().unwrap()
}

/// Runs a built program against the prefix and checks it called the installed library.
fn check_program(app: &Path, prefix: &Path) {
    let out = run_ok_within(Command::new(app).env("LD_LIBRARY_PATH", prefix.join("lib")).env_remove("LD_PRELOAD"));
    assert!(out.contains("ncclGetVersion: 22809 (no error); header: 2.28.9 (22809)"), "{out}");
    let lib = out.lines().find_map(|l| l.strip_prefix("library: ")).unwrap_or("<none>");
    assert!(
        Path::new(lib).starts_with(prefix.join("lib")),
        "{} called ncclGetVersion in {lib}, not in the installed {}",
        app.display(),
        prefix.join("lib").display()
    );
}

#[test]
fn install_layout_is_what_build_systems_expect() {
    let dir = scratch("install-layout");
    let prefix = install(&dir);
    let lib = prefix.join("lib");
    assert!(std::fs::symlink_metadata(lib.join("libnccl.so.2.28.9")).unwrap().file_type().is_file());
    assert_eq!(std::fs::read_link(lib.join("libnccl.so.2")).unwrap(), Path::new("libnccl.so.2.28.9"));
    assert_eq!(std::fs::read_link(lib.join("libnccl.so")).unwrap(), Path::new("libnccl.so.2"));
    let dynamic = stdout_of(Command::new("readelf").arg("-d").arg(lib.join("libnccl.so.2.28.9")));
    assert!(dynamic.contains("Library soname: [libnccl.so.2]"), "{dynamic}");
    assert_eq!(
        std::fs::read(prefix.join("include/nccl.h")).unwrap(),
        std::fs::read(root().join("include/nccl.h")).unwrap(),
        "the installed header must be the repository's"
    );
    let mut ours: Vec<PathBuf> = std::fs::read_dir(root().join("include/nccl_device"))
        .unwrap()
        .map(|e| PathBuf::from("nccl_device").join(e.unwrap().file_name()))
        .collect();
    ours.push("nccl_device.h".into());
    for h in &ours {
        assert_eq!(
            std::fs::read(prefix.join("include").join(h)).ok(),
            std::fs::read(root().join("include").join(h)).ok(),
            "the installed {} must be the repository's",
            h.display()
        );
    }
    let info = run_ok_within(Command::new(prefix.join("bin/ferronickel")).arg("info"));
    assert!(info.contains("NCCL API 2.28.9"), "{info}");
    let pc = std::fs::read_to_string(lib.join("pkgconfig/nccl.pc")).unwrap();
    assert!(pc.contains(&format!("prefix={}\n", prefix.display())) && pc.contains("Version: 2.28.9"), "{pc}");
}

#[test]
fn pkg_config_and_plain_cc_build_link_and_run() {
    require_tool("pkg-config");
    let dir = scratch("install-pkgconfig");
    let prefix = install(&dir);
    let pc_path = prefix.join("lib/pkgconfig");
    let pkg = |args: &[&str]| {
        run_ok_within(Command::new("pkg-config").args(args).arg("nccl").env("PKG_CONFIG_PATH", &pc_path))
    };
    assert_eq!(pkg(&["--modversion"]).trim(), "2.28.9");
    // cc app.c $(pkg-config --cflags --libs nccl), word-split as the shell would.
    let flags = pkg(&["--cflags", "--libs"]);
    let app = dir.join("version_app");
    run_ok_within(
        Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(root().join("tests/cmake/version.c"))
            .args(flags.split_whitespace())
            .arg("-o")
            .arg(&app),
    );
    check_program(&app, &prefix);
}

/// The device API from the install: a kernel compiled by nvcc, and the host half as CUDA-free C++,
/// both with nothing but the installed headers (and CUDA's).
#[test]
fn device_api_headers_build_against_the_install() {
    let dir = scratch("install-device");
    let prefix = install(&dir);
    let include = prefix.join("include");
    let kernel = dir.join("kernel.cu");
    std::fs::write(
        &kernel,
        "#include <nccl_device.h>\n\
         __global__ void k(ncclWindow_t w, ncclDevComm comm, float* out) {\n\
           ncclLsaBarrierSession<ncclCoopCta> bar{ncclCoopCta(), comm, ncclTeamTagLsa(), blockIdx.x};\n\
           bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);\n\
           out[threadIdx.x] = *(float*)ncclGetLsaPointer(w, 4 * threadIdx.x, comm.lsaSize - 1);\n\
         }\n",
    )
    .unwrap();
    run_ok_within(
        Command::new(common::nvcc())
            .args(["-c", "-std=c++17", "-arch=sm_90", "-Xcompiler", "-Wall"])
            .arg("-I")
            .arg(&include)
            .arg(&kernel)
            .arg("-o")
            .arg(dir.join("kernel.o")),
    );
    let host = dir.join("host.cpp");
    std::fs::write(
        &host,
        "#include <nccl_device.h>\n\
         int teams(ncclComm_t comm) {\n\
           ncclDevCommRequirements reqs = {};\n\
           reqs.lsaBarrierCount = ncclTeamOuterFactor(ncclTeamWorld(comm), 2).nRanks;\n\
           ncclDevComm dev;\n\
           return ncclDevCommCreate(comm, &reqs, &dev) == ncclSuccess ? ncclTeamLsa(dev).nRanks : -1;\n\
         }\n",
    )
    .unwrap();
    run_ok_within(
        Command::new("c++")
            .args(["-std=c++17", "-Wall", "-Werror", "-c"])
            .arg("-I")
            .arg(&include)
            .arg("-I")
            .arg(cuda_include())
            .arg(&host)
            .arg("-o")
            .arg(dir.join("host.o")),
    );
}

/// Configures, builds and runs tests/cmake in one mode.
fn cmake_mode(name: &str, prefix: &Path, configure: &[String], env: &[(&str, PathBuf)]) {
    require_tool("cmake");
    let build = scratch("install-cmake").join(name);
    let _ = std::fs::remove_dir_all(&build);
    let mut cmd = Command::new("cmake");
    cmd.arg("-S").arg(root().join("tests/cmake")).arg("-B").arg(&build);
    cmd.arg(format!("-DCUDA_INCLUDE_DIR={}", cuda_include().display())).args(configure);
    // The configure-time version checks run programs linked against the installed library.
    cmd.env("LD_LIBRARY_PATH", prefix.join("lib")).envs(env.iter().map(|(k, v)| (*k, v)));
    for var in ["NCCL_ROOT", "NCCL_INCLUDE_DIR", "NCCL_LIB_DIR", "PKG_CONFIG_PATH", "CMAKE_PREFIX_PATH"] {
        if !env.iter().any(|(k, _)| *k == var) {
            cmd.env_remove(var);
        }
    }
    let log = run_ok_within(&mut cmd);
    run_ok_within(Command::new("cmake").arg("--build").arg(&build));
    check_program(&build.join("nccl_version"), prefix);
    if name.starts_with("pytorch") {
        let want = format!("FindNCCL (PyTorch's search): version 2.28.9, include {}", prefix.join("include").display());
        assert!(log.contains(&want), "{log}");
    }
}

#[test]
fn cmake_finds_it_by_prefix_pkg_config_and_pytorchs_find_nccl() {
    let dir = scratch("install-cmake-prefix");
    let prefix = install(&dir);
    cmake_mode("prefix", &prefix, &["-DFIND=prefix".into(), format!("-DCMAKE_PREFIX_PATH={}", prefix.display())], &[]);
    cmake_mode(
        "pkgconfig",
        &prefix,
        &["-DFIND=pkgconfig".into()],
        &[("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))],
    );
    // PyTorch's two ways in: NCCL_INCLUDE_DIR + NCCL_LIB_DIR from the environment, or NCCL_ROOT.
    cmake_mode(
        "pytorch-dirs",
        &prefix,
        &["-DFIND=pytorch".into()],
        &[("NCCL_INCLUDE_DIR", prefix.join("include")), ("NCCL_LIB_DIR", prefix.join("lib"))],
    );
    cmake_mode("pytorch-root", &prefix, &["-DFIND=pytorch".into(), format!("-DNCCL_ROOT={}", prefix.display())], &[]);

    // Pointed nowhere, the same search must fail: the hints above are what found it.
    let build = scratch("install-cmake").join("pytorch-nowhere");
    let _ = std::fs::remove_dir_all(&build);
    let mut cmd = Command::new("cmake");
    cmd.arg("-S").arg(root().join("tests/cmake")).arg("-B").arg(&build).arg("-DFIND=pytorch");
    for var in ["NCCL_ROOT", "NCCL_INCLUDE_DIR", "NCCL_LIB_DIR", "CMAKE_PREFIX_PATH"] {
        cmd.env_remove(var);
    }
    let out = output_within(&mut cmd, LIMIT);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("did not find nccl.h and libnccl"), "{text}");
}

#[test]
fn install_refuses_bad_arguments_naming_them() {
    let script = root().join("scripts/install.sh");
    let fail = |args: &[&str]| -> String {
        let out: Output = output_within(Command::new("bash").arg(&script).args(args), LIMIT);
        assert!(!out.status.success(), "install.sh {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(fail(&[]).contains("--prefix DIR is required"));
    assert!(fail(&["--prefix"]).contains("--prefix needs a directory"));
    assert!(fail(&["--prefix", "/tmp/x", "--bogus"]).contains("unknown argument --bogus"));
    let empty = scratch("install-empty-from");
    let prefix = scratch("install-never").join("prefix");
    let e = fail(&["--prefix", prefix.to_str().unwrap(), "--from", empty.to_str().unwrap()]);
    assert!(e.contains("libnccl.so is missing"), "{e}");
    assert!(!prefix.exists(), "nothing may be installed when the inputs are missing");
    let e = fail(&[
        "--prefix",
        prefix.to_str().unwrap(),
        "--from",
        empty.to_str().unwrap(),
        "--cuda-include",
        "/nonexistent",
    ]);
    assert!(e.contains("is missing"), "{e}");
}
