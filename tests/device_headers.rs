//! ferronickel's device-API headers (`include/nccl_device.h`, `include/nccl_device/`) against
//! NVIDIA's 2.28.9 ones: `tests/device/api.cu`, which uses every name of the API, must compile
//! with nvcc against both; the host-callable team algebra and `ncclSymPtr` arithmetic must give
//! the same answers with both (`tests/device/teams.cpp`, also checked against brute force); the
//! example (`examples/device_allreduce`) must compile against both; the host half must compile as
//! plain C; and the two header sets must declare the same public names.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

fn ok(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let out = output_within(cmd, LIMIT);
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "failed ({}): {shown}\n--- stdout ---\n{so}\n--- stderr ---\n{se}", out.status);
    so.into_owned()
}

/// nvcc -c for sm_90 with every warning an error.
fn nvcc_compiles(src: &Path, include: &Path, obj: &Path) {
    ok(Command::new(nvcc())
        .args(["-c", "-std=c++17", "-arch=sm_90", "-Werror", "all-warnings", "-Xcompiler", "-Wall,-Werror"])
        .arg("-I")
        .arg(include)
        .arg(src)
        .arg("-o")
        .arg(obj));
}

#[test]
fn every_api_name_compiles_with_nvcc_against_ours_and_nvidias() {
    let dir = scratch("device-api");
    nvcc_compiles(&root().join("tests/device/api.cu"), &our_include(), &dir.join("ours.o"));
    nvcc_compiles(&root().join("tests/device/api.cu"), &nvidia_include(), &dir.join("nvidia.o"));
}

#[test]
fn team_algebra_and_sym_ptr_match_nvidias_on_the_host() {
    let dir = scratch("device-teams");
    let run = |include: &Path, name: &str| -> String {
        let exe = dir.join(name);
        ok(Command::new("c++")
            .args(["-std=c++17", "-Wall", "-Werror"])
            .arg("-I")
            .arg(include)
            .arg("-I")
            .arg(cuda_include())
            .arg(root().join("tests/device/teams.cpp"))
            .arg("-o")
            .arg(&exe));
        ok(&mut Command::new(&exe))
    };
    let ours = run(&our_include(), "teams_ours");
    let theirs = run(&nvidia_include(), "teams_nvidia");
    assert!(ours.contains("difference cases: 2564, wrong: 0"), "{}", ours.lines().last().unwrap_or(""));
    if ours != theirs {
        let (a, b) = ours.lines().zip(theirs.lines()).find(|(a, b)| a != b).unwrap_or(("<end>", "<end>"));
        panic!("ours and NVIDIA's differ; first difference:\n  ours:   {a}\n  NVIDIA: {b}");
    }
}

#[test]
fn example_compiles_against_ours_and_nvidias() {
    let out = scratch("device-example");
    let log = ok(Command::new("bash")
        .arg(root().join("scripts/build_device_example.sh"))
        .arg("--compile-only")
        .arg("--out")
        .arg(&out)
        .arg("--nvidia-include")
        .arg(nvidia_include())
        .env("NVCC", nvcc()));
    for name in ["device_allreduce_ours.o", "device_allreduce_nvhdr.o"] {
        assert!(out.join(name).is_file(), "no {name}:\n{log}");
    }
}

#[test]
fn host_half_compiles_as_c() {
    let dir = scratch("device-c");
    let src = dir.join("host.c");
    std::fs::write(
        &src,
        "#include <nccl_device.h>\n\
         int f(ncclComm_t comm) {\n\
           ncclDevCommRequirements_t reqs = {0};\n\
           ncclDevComm_t dev;\n\
           ncclLsaBarrierHandle_t bar;\n\
           ncclDevResourceRequirements_t res;\n\
           reqs.lsaBarrierCount = ncclTeamRankToTeam(ncclTeamLsa(comm), ncclTeamWorld(comm), 0);\n\
           if (ncclLsaBarrierCreateRequirement(ncclTeamLsa(comm), 1, &bar, &res) != ncclSuccess) return -1;\n\
           return (int)ncclDevCommCreate(comm, &reqs, &dev) + (int)ncclGetResourceBufferOffset(bar.bufHandle);\n\
         }\n",
    )
    .unwrap();
    ok(Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-c"])
        .arg("-I")
        .arg(our_include())
        .arg("-I")
        .arg(cuda_include())
        .arg(&src)
        .arg("-o")
        .arg(dir.join("host.o")));
}

/// NVIDIA's names that are implementation details of its headers, not API: ferronickel's headers
/// need not have them.
const NVIDIA_INTERNALS: &[&str] = &[
    "NCCL_GIN_GDAKI_ENABLE",
    "NCCL_GIN_HAS_FENCE_ACQUIRE_RELEASE_PTX",
    "NCCL_GIN_PROXY_ENABLE",
    "ncclBarrierSession_internal",
    "ncclCoopBcast_Cta_stash",
    "ncclCoopBcast_WarpSpan_stash",
    "ncclGinBarrierSession_internal",
    "ncclGinCall",
    "ncclGinCtx",
    "ncclGinCtx_M",
    "ncclGinGpuCtx",
    "ncclGinGpuCtx_t",
    "ncclLLA2ASession_internal",
    "ncclLsaBarrierSession_internal",
];
/// NVIDIA's name prefixes of the same kind (its GIN backend dispatch).
const NVIDIA_INTERNAL_PREFIXES: &[&str] = &["ncclGinApi_", "ncclGin_is", "ncclGin_get"];
/// API that ferronickel's headers do not have yet (README.md, "The device API").
const NOT_YET: &[&str] = &["ncclLLA2ASession"];

/// `nccl[A-Z]...` and `NCCL_...` identifiers outside comments, include guards left out.
fn public_names(files: &[PathBuf]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let code = strip_comments(&text);
        let mut word = String::new();
        for ch in code.chars().chain(std::iter::once(' ')) {
            if ch.is_ascii_alphanumeric() || ch == '_' {
                word.push(ch);
                continue;
            }
            let api = (word.starts_with("nccl") && word[4..].starts_with(|c: char| c.is_ascii_uppercase()))
                || (word.starts_with("NCCL_") && !word.ends_with("_H_"));
            if api {
                names.insert(std::mem::take(&mut word));
            }
            word.clear();
        }
    }
    names
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('/') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(t) = tail.strip_prefix("//") {
            rest = t.find('\n').map_or("", |j| &t[j..]);
        } else if let Some(t) = tail.strip_prefix("/*") {
            rest = t.find("*/").map_or("", |j| &t[j + 2..]);
        } else {
            out.push('/');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

fn headers_under(include: &Path, subdirs: &[&str]) -> Vec<PathBuf> {
    let mut files = vec![include.join("nccl_device.h")];
    for sub in subdirs {
        let dir = include.join(sub);
        let mut here: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "h"))
            .collect();
        here.sort();
        files.extend(here);
    }
    files
}

#[test]
fn public_names_are_nvidias() {
    let nv = nvidia_include();
    let theirs: BTreeSet<String> =
        &public_names(&headers_under(&nv, &["nccl_device", "nccl_device/impl", "nccl_device/gin"]))
            - &public_names(&[nv.join("nccl.h")]);
    let ours: BTreeSet<String> = &public_names(&headers_under(&our_include(), &["nccl_device"]))
        - &public_names(&[our_include().join("nccl.h")]);
    let internal = |n: &str| NVIDIA_INTERNALS.contains(&n) || NVIDIA_INTERNAL_PREFIXES.iter().any(|p| n.starts_with(p));
    let missing: Vec<&String> =
        theirs.iter().filter(|n| !ours.contains(*n) && !internal(n) && !NOT_YET.contains(&n.as_str())).collect();
    let extra: Vec<&String> = ours.iter().filter(|n| !theirs.contains(*n)).collect();
    assert!(missing.is_empty(), "NVIDIA's device headers declare these and ours do not: {missing:?}");
    assert!(extra.is_empty(), "ours declare public names NVIDIA's do not: {extra:?}");
    for n in NOT_YET {
        assert!(!ours.contains(*n), "{n} is in our headers now: take it off NOT_YET");
    }
}
