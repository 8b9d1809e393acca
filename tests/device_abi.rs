//! Layout of the device API's shared types: `include/nccl_device/core.h` (ours, the one
//! definition that the library binds with bindgen and the device headers include) against
//! NVIDIA's NCCL 2.28.9 headers. `tests/c/device_abi_probe.cpp` prints the size and alignment of
//! every type and the offset and size of every field; built against each side, the outputs must be
//! equal. Our header must also compile on its own as C, which is how bindgen reads it.
//!
//! Needs NVIDIA's headers and the CUDA headers: `bash scripts/setup-deps.sh` (see tests/common).

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

fn probe(types_header: &str, include: &Path, tag: &str) -> String {
    let exe = scratch("device_abi").join(format!("device_abi_probe_{tag}"));
    let mut cc = Command::new("c++");
    cc.args(["-x", "c++", "-std=c++17", "-O0", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-DPROBE_TYPES={types_header}"))
        .arg("-I")
        .arg(include)
        .arg("-I")
        .arg(cuda_include())
        .arg(root().join("tests/c/device_abi_probe.cpp"))
        .arg("-o")
        .arg(&exe);
    run_ok(&mut cc);
    let out = stdout_of(&mut Command::new(&exe));
    assert!(out.ends_with("END\n"), "{} stopped early:\n{out}", exe.display());
    out
}

#[test]
fn shared_types_match_nvidia_field_for_field() {
    let ours = probe("\"nccl_device/core.h\"", &our_include(), "ours");
    let theirs = probe("<nccl_device/impl/comm__types.h>", &nvidia_include(), "nvidia");
    assert!(ours.lines().filter(|l| l.starts_with("field ")).count() >= 60, "the probe printed too little:\n{ours}");
    let report: String = ours
        .lines()
        .zip(theirs.lines())
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("  ours:   {a}\n  NVIDIA: {b}\n"))
        .collect();
    assert!(
        report.is_empty() && ours.lines().count() == theirs.lines().count(),
        "include/nccl_device/core.h differs from NVIDIA's device API 2.28.9:\n{report}"
    );
}

#[test]
fn core_header_compiles_alone_as_c_and_cxx() {
    for (lang, std) in [("c", "-std=c11"), ("c++", "-std=c++17")] {
        let mut cc = Command::new("cc");
        cc.args(["-x", lang, std, "-fsyntax-only", "-Wall", "-Wextra", "-Werror"])
            .arg("-I")
            .arg(our_include())
            .arg("-I")
            .arg(cuda_include())
            .arg(our_include().join("nccl_device/core.h"));
        run_ok(&mut cc);
    }
}
