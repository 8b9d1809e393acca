//! Source and binary compatibility of `include/nccl.h` with NVIDIA's NCCL 2.28.9 `nccl.h`.
//!
//! 1. `tests/c/abi_probe.c` is compiled as C and as C++ against both headers and run; it prints
//!    every size, offset, field type, enumerator, macro value and initializer. Per language the
//!    output from our header must equal the output from NVIDIA's.
//! 2. Every function prototype in NVIDIA's header is appended, verbatim, after
//!    `#include <nccl.h>` (ours) and compiled as C and C++: a prototype that disagrees with ours
//!    in any parameter or the return type is a conflicting redeclaration of a C function, which
//!    both compilers reject. The set of functions must be the same on both sides.
//! 3. `ncclResetDebugInit` carries a deprecation attribute, as in NVIDIA's header.
//! 4. Our header compiles cleanly under strict warnings, in C and in C++.
//!
//! Needs NVIDIA's header and the CUDA headers: `bash scripts/setup-deps.sh` (see tests/common).

mod common;

use common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Clone, Copy, Debug)]
enum Lang {
    C,
    Cxx,
}

impl Lang {
    fn compiler(self) -> Command {
        match self {
            Lang::C => {
                let mut c = Command::new("cc");
                c.args(["-x", "c", "-std=c11"]);
                c
            }
            Lang::Cxx => {
                let mut c = Command::new("c++");
                c.args(["-x", "c++", "-std=c++17"]);
                c
            }
        }
    }
    fn name(self) -> &'static str {
        match self {
            Lang::C => "c",
            Lang::Cxx => "cxx",
        }
    }
}

fn probe_output(lang: Lang, nccl_include: &Path, tag: &str) -> String {
    let exe = scratch("abi").join(format!("abi_probe_{}_{tag}", lang.name()));
    let mut cc = lang.compiler();
    cc.args(["-O0", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(nccl_include)
        .arg("-I")
        .arg(cuda_include())
        .arg(root().join("tests/c/abi_probe.c"))
        .arg("-o")
        .arg(&exe);
    run_ok(&mut cc);
    let out = stdout_of(&mut Command::new(&exe));
    assert!(out.ends_with("END\n"), "{} stopped early:\n{out}", exe.display());
    assert!(out.lines().count() > 120, "{} printed too little:\n{out}", exe.display());
    out
}

fn compare_probe(lang: Lang) {
    // Find everything on the test's own thread, so a missing dependency reports cleanly.
    let (our_inc, nv_inc) = (our_include(), nvidia_include());
    cuda_include();
    let (ours, theirs) = std::thread::scope(|s| {
        let a = s.spawn(|| probe_output(lang, &our_inc, "ours"));
        let b = s.spawn(|| probe_output(lang, &nv_inc, "nvidia"));
        (a.join().unwrap(), b.join().unwrap())
    });
    if ours != theirs {
        let (o, t): (Vec<&str>, Vec<&str>) = (ours.lines().collect(), theirs.lines().collect());
        let mut report = String::new();
        for i in 0..o.len().max(t.len()) {
            let (a, b) = (o.get(i).copied().unwrap_or("<missing>"), t.get(i).copied().unwrap_or("<missing>"));
            if a != b {
                report.push_str(&format!("  ours:   {a}\n  NVIDIA: {b}\n"));
            }
        }
        panic!("{lang:?}: include/nccl.h differs from NVIDIA's nccl.h 2.28.9:\n{report}");
    }
}

#[test]
fn layout_values_and_initializers_match_nvidia_in_c() {
    compare_probe(Lang::C);
}

#[test]
fn layout_values_and_initializers_match_nvidia_in_cxx() {
    compare_probe(Lang::Cxx);
}

/// A function prototype found in a header: its name and its declaration as written (attributes
/// dropped, whitespace collapsed), ready to be re-declared.
#[derive(Debug, Clone)]
struct Proto {
    name: String,
    decl: String,
}

/// Drops `/* */` and `//` comments, preprocessor lines (with their continuations) and
/// `__attribute__((...))` groups, so that what is left is C declarations.
fn strip_non_declarations(src: &str) -> String {
    let mut no_comments = String::new();
    let mut rest = src;
    loop {
        let block = rest.find("/*");
        let line = rest.find("//");
        match (block, line) {
            (Some(b), l) if l.is_none_or(|l| b < l) => {
                no_comments.push_str(&rest[..b]);
                let end = rest[b + 2..].find("*/").expect("unterminated comment") + b + 4;
                no_comments.push(' ');
                rest = &rest[end..];
            }
            (_, Some(l)) => {
                no_comments.push_str(&rest[..l]);
                rest = &rest[l..];
                rest = &rest[rest.find('\n').unwrap_or(rest.len())..];
            }
            _ => {
                no_comments.push_str(rest);
                break;
            }
        }
    }
    let mut code = String::new();
    let mut continuing = false;
    for l in no_comments.lines() {
        let directive = continuing || l.trim_start().starts_with('#');
        continuing = directive && l.trim_end().ends_with('\\');
        if !directive {
            code.push_str(l);
            code.push('\n');
        }
    }
    // __attribute__ ((...)) with balanced parentheses.
    let mut out = String::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("__attribute__") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "__attribute__".len()..];
        let open = after.find('(').expect("__attribute__ without (");
        let mut depth = 0;
        let mut end = open;
        for (j, ch) in after[open..].char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + j + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Every `ncclResult_t f(...);`, `const char* f(...);` and `void f(...);` whose name starts
/// with `nccl` or `pnccl`, single- or multi-line.
fn prototypes(header: &Path) -> Vec<Proto> {
    let src = std::fs::read_to_string(header).unwrap_or_else(|e| panic!("cannot read {}: {e}", header.display()));
    let code = strip_non_declarations(&src);
    let mut found = Vec::new();
    for stmt in code.split(';') {
        // Whatever follows the last brace: drops `extern "C" {`, enum and struct bodies.
        let stmt = stmt.rsplit(['{', '}']).next().unwrap_or("");
        let decl = stmt.split_whitespace().collect::<Vec<_>>().join(" ");
        let Some(paren) = decl.find('(') else { continue };
        if !decl.ends_with(')') || decl.starts_with("typedef") {
            continue;
        }
        let head = decl[..paren].trim_end();
        let name_start = head.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let (ret, name) = (head[..name_start].replace(' ', ""), &head[name_start..]);
        let returns_api_type = matches!(ret.as_str(), "ncclResult_t" | "constchar*" | "void");
        if returns_api_type && (name.starts_with("nccl") || name.starts_with("pnccl")) {
            found.push(Proto { name: name.to_string(), decl: format!("{decl};") });
        }
    }
    found
}

fn names(p: &[Proto]) -> BTreeSet<String> {
    p.iter().map(|p| p.name.clone()).collect()
}

/// Exported by libnccl.so.2 2.28.9 but declared only in NVIDIA's device-API headers or not at all.
const EXPORTED_NOT_IN_NCCL_H: &[&str] = &[
    "ncclDevCommCreate",
    "ncclDevCommDestroy",
    "ncclGinBarrierCreateRequirement",
    "ncclLLA2ACalcSlots",
    "ncclLLA2ACreateRequirement",
    "ncclLsaBarrierCreateRequirement",
    "ncclResetDebugInitInternal",
    "ncclTeamLsa",
    "ncclTeamRail",
    "ncclTeamRankToLsa",
    "ncclTeamRankToWorld",
    "ncclTeamWorld",
];

#[test]
fn prototype_extraction_sees_all_of_nvidias_api() {
    // Guards the parser itself against an independent source: the functions NVIDIA's library
    // exports (tests/data), less those its nccl.h does not declare, each with its pnccl twin.
    let theirs = prototypes(&nvidia_include().join("nccl.h"));
    let parsed = names(&theirs);
    assert_eq!(theirs.len(), parsed.len(), "a function is declared twice in NVIDIA's header?");
    let mut expected = BTreeSet::new();
    for f in read_list(&root().join("tests/data/nccl-2.28.9-exported-symbols.txt")) {
        if !EXPORTED_NOT_IN_NCCL_H.contains(&f.as_str()) {
            expected.insert(format!("p{f}"));
            expected.insert(f);
        }
    }
    assert_eq!(expected.len(), 82, "41 functions and their pnccl twins");
    assert_eq!(
        parsed,
        expected,
        "the prototype parser disagrees with the export list\n  only parsed: {:?}\n  only expected: {:?}",
        parsed.difference(&expected).collect::<Vec<_>>(),
        expected.difference(&parsed).collect::<Vec<_>>()
    );
}

#[test]
fn declares_exactly_the_functions_nvidia_declares() {
    let theirs = names(&prototypes(&nvidia_include().join("nccl.h")));
    let ours = names(&prototypes(&our_include().join("nccl.h")));
    let missing: Vec<_> = theirs.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&theirs).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "include/nccl.h must declare exactly the functions of NVIDIA's nccl.h 2.28.9.\n\
         missing from ours ({}): {missing:?}\n\
         declared by ours but not by NVIDIA ({}; exclude them in cbindgen.toml [export] exclude): {extra:?}\n\
         (after adding exports: FERRONICKEL_BLESS=1 cargo test --test header)",
        missing.len(),
        extra.len()
    );
}

/// NVIDIA's prototypes re-declared after `#include <nccl.h>`. In C++ they go inside
/// `extern "C"`: a C++-linkage redeclaration with other parameters would be a legal overload,
/// but two C-linkage functions of one name must agree exactly.
fn redeclaration_unit(protos: &[Proto], lang: Lang) -> String {
    let mut tu = String::from(
        "/* Generated by tests/abi.rs: NVIDIA's nccl.h prototypes re-declared after ours. A mismatch in\n \
         * any parameter or the return type is a conflicting declaration of a C function. */\n#include <nccl.h>\n",
    );
    if let Lang::Cxx = lang {
        tu.push_str("extern \"C\" {\n");
    }
    for p in protos {
        tu.push_str(&p.decl);
        tu.push('\n');
    }
    if let Lang::Cxx = lang {
        tu.push_str("}\n");
    }
    tu
}

fn check_redeclarations(lang: Lang) {
    let theirs = prototypes(&nvidia_include().join("nccl.h"));
    assert!(!theirs.is_empty(), "no prototypes parsed from NVIDIA's header");
    let file = scratch("abi").join(format!(
        "redeclare_{}.{}",
        lang.name(),
        match lang {
            Lang::C => "c",
            Lang::Cxx => "cpp",
        }
    ));
    std::fs::write(&file, redeclaration_unit(&theirs, lang)).unwrap();
    let mut cc = lang.compiler();
    cc.args(["-fsyntax-only", "-Wno-deprecated-declarations"])
        .arg("-I")
        .arg(our_include())
        .arg("-I")
        .arg(cuda_include())
        .arg(&file);
    let out = cc.output().unwrap_or_else(|e| panic!("cannot run {cc:?}: {e}"));
    assert!(
        out.status.success(),
        "{lang:?}: NVIDIA's prototypes conflict with include/nccl.h (file: {}):\n{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn nvidia_prototypes_redeclare_ours_without_conflict_in_cxx() {
    check_redeclarations(Lang::Cxx);
}

#[test]
fn nvidia_prototypes_redeclare_ours_without_conflict_in_c() {
    check_redeclarations(Lang::C);
}

/// The check above must be able to fail: a prototype with one wrong parameter type is rejected.
#[test]
fn redeclaration_check_catches_a_wrong_signature() {
    let dir = scratch("abi");
    let file = dir.join("redeclare_wrong.cpp");
    std::fs::write(
        &file,
        redeclaration_unit(
            &[Proto { name: "ncclGetVersion".into(), decl: "ncclResult_t ncclGetVersion(long* v);".into() }],
            Lang::Cxx,
        )
        .replace("#include <nccl.h>", "#include <nccl.h>\nextern \"C\" ncclResult_t ncclGetVersion(int* v);"),
    )
    .unwrap();
    let mut cc = Lang::Cxx.compiler();
    cc.arg("-fsyntax-only").arg("-I").arg(our_include()).arg("-I").arg(cuda_include()).arg(&file);
    let out = cc.output().unwrap();
    assert!(!out.status.success(), "c++ accepted a conflicting redeclaration of a C function; the check is void");
}

#[test]
fn reset_debug_init_is_deprecated_like_nvidias() {
    let dir = scratch("abi");
    for (tag, inc) in [("ours", our_include()), ("nvidia", nvidia_include())] {
        for lang in [Lang::C, Lang::Cxx] {
            let file: PathBuf = dir.join(format!("deprecated_{tag}_{}.c", lang.name()));
            std::fs::write(
                &file,
                "#include <nccl.h>\nint main(void) { ncclResetDebugInit(); pncclResetDebugInit(); return 0; }\n",
            )
            .unwrap();
            let mut cc = lang.compiler();
            cc.args(["-fsyntax-only", "-Werror=deprecated-declarations"])
                .arg("-I")
                .arg(&inc)
                .arg("-I")
                .arg(cuda_include())
                .arg(&file);
            let out = cc.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && err.contains("ncclResetDebugInit") && err.contains("pncclResetDebugInit"),
                "{lang:?} {tag}: calling ncclResetDebugInit/pncclResetDebugInit must raise a deprecation error; got:\n{err}"
            );
        }
    }
}

#[test]
fn our_header_compiles_cleanly_under_strict_warnings() {
    let dir = scratch("abi");
    let file = dir.join("strict.c");
    std::fs::write(&file, "#include <nccl.h>\n#include <nccl.h>\nint main(void) { ncclConfig_t c = NCCL_CONFIG_INITIALIZER; return (int)c.blocking == 0; }\n").unwrap();
    for (lang, flags) in [
        // CUDA's own headers are not C99-pedantic clean.
        (Lang::C, &["-std=c99", "-Wall", "-Wextra", "-Wstrict-prototypes", "-Werror"][..]),
        (Lang::C, &["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Wstrict-prototypes", "-Werror"][..]),
        (Lang::Cxx, &["-std=c++11", "-Wall", "-Wextra", "-Wpedantic", "-Werror"][..]),
        (Lang::Cxx, &["-std=c++20", "-Wall", "-Wextra", "-Werror"][..]),
    ] {
        let mut cc = lang.compiler();
        cc.args(flags).arg("-fsyntax-only").arg("-I").arg(our_include()).arg("-I").arg(cuda_include()).arg(&file);
        // The language flag from compiler() comes first; a later -std wins.
        let out = cc.output().unwrap();
        assert!(
            out.status.success(),
            "include/nccl.h (included twice) does not compile cleanly with {lang:?} {flags:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
