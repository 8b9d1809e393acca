//! The dynamic symbol table and SONAME of the built `libnccl.so`, as programs linked against
//! NVIDIA's libnccl.so.2 (nccl-tests, PyTorch) see them through LD_PRELOAD.
//!
//! - every function NVIDIA NCCL 2.28.9 exports (tests/data/nccl-2.28.9-exported-symbols.txt)
//!   is exported, and so is its `pnccl` profiling twin;
//! - every symbol PyTorch 2.11 binds (tests/data/pytorch-2.11-needed-symbols.txt) is exported;
//! - no function outside the `nccl*`/`pnccl*` namespace is exported (it could interpose on the
//!   application's or another library's symbols);
//! - the SONAME is `libnccl.so.2`, which is what makes LD_PRELOAD satisfy `NEEDED libnccl.so.2`.
//!
//! The library inspected is `target/<profile>/deps/libnccl.so` (tests/common explains why).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::process::Command;

/// NVIDIA's own libnccl.so.2 2.28.9 exports no `pncclResetDebugInitInternal` (checked with
/// `nm -D` on the library in the nvidia-nccl-cu13 2.28.9 wheel: 53 nccl* and 52 pnccl* names),
/// so it is the one name whose twin is not required.
const NO_PNCCL_TWIN_IN_NVIDIA: &[&str] = &["ncclResetDebugInitInternal"];

/// name -> nm type letter, for every defined dynamic symbol.
fn dynamic_symbols() -> BTreeMap<String, char> {
    let so = cdylib();
    let text = stdout_of(Command::new("nm").args(["-D", "--defined-only"]).arg(&so));
    let mut syms = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "<address> <type> <name>"; versioned names come as name@@VERSION.
        if let [_, ty, name] = f[..] {
            let name = name.split('@').next().unwrap().to_string();
            syms.insert(name, ty.chars().next().unwrap());
        }
    }
    syms
}

fn is_function(ty: char) -> bool {
    matches!(ty, 'T' | 't' | 'W' | 'w' | 'i')
}

fn require_exported(names: &[String], list: &str) {
    let syms = dynamic_symbols();
    let missing: Vec<&String> = names.iter().filter(|n| !syms.get(*n).is_some_and(|t| is_function(*t))).collect();
    assert!(
        missing.is_empty(),
        "{} does not export {} function(s) of {list}: {missing:?}",
        cdylib().display(),
        missing.len()
    );
}

#[test]
fn symbol_lists_are_the_reference_ones() {
    let nccl = read_list(&root().join("tests/data/nccl-2.28.9-exported-symbols.txt"));
    let torch = read_list(&root().join("tests/data/pytorch-2.11-needed-symbols.txt"));
    assert_eq!(nccl.len(), 53, "nccl-2.28.9-exported-symbols.txt should list NCCL 2.28.9's 53 nccl* exports");
    assert_eq!(torch.len(), 38, "pytorch-2.11-needed-symbols.txt should list the 38 symbols PyTorch 2.11 binds");
    for t in &torch {
        assert!(nccl.contains(t), "PyTorch needs {t}, which NCCL 2.28.9 does not export?");
    }
}

#[test]
fn exports_every_nccl_2_28_9_function_and_its_pnccl_twin() {
    let mut names = Vec::new();
    for n in read_list(&root().join("tests/data/nccl-2.28.9-exported-symbols.txt")) {
        if !NO_PNCCL_TWIN_IN_NVIDIA.contains(&n.as_str()) {
            names.push(format!("p{n}"));
        }
        names.push(n);
    }
    require_exported(&names, "NVIDIA NCCL 2.28.9's exports (with pnccl twins)");
}

#[test]
fn exports_every_symbol_pytorch_2_11_binds() {
    require_exported(&read_list(&root().join("tests/data/pytorch-2.11-needed-symbols.txt")), "PyTorch 2.11's needs");
}

#[test]
fn exports_no_function_outside_the_nccl_namespace() {
    let foreign: Vec<String> = dynamic_symbols()
        .into_iter()
        .filter(|(name, ty)| is_function(*ty) && !name.starts_with("nccl") && !name.starts_with("pnccl"))
        .map(|(name, ty)| format!("{name} ({ty})"))
        .collect();
    assert!(
        foreign.is_empty(),
        "{} exports functions outside nccl*/pnccl*; they could interpose on the host program's symbols: {foreign:?}",
        cdylib().display()
    );
}

#[test]
fn soname_is_libnccl_so_2() {
    let so = cdylib();
    let text = stdout_of(Command::new("readelf").arg("-d").arg(&so));
    let sonames: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("(SONAME)"))
        .filter_map(|l| l.split('[').nth(1).and_then(|r| r.split(']').next()))
        .collect();
    assert_eq!(
        sonames,
        ["libnccl.so.2"],
        "{}: SONAME must be libnccl.so.2 (build.rs passes -Wl,-soname); readelf -d says:\n{text}",
        so.display()
    );
}
