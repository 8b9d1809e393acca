//! The docs speak of the repository as it is: every repository path that README.md, the other
//! READMEs and docs/*.md cite in backticks exists, and no tracked text file refers to work by
//! ticket or issue number or to the sittings it was done in; it says what and why instead.
//! (BENCHMARKS.md and GPU_RESULTS.md are records of past commits and may name files those commits
//! had, so of their paths only the results files they cite must exist.)

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directories a cited path may start with.
const ROOTS: [&str; 7] = ["src/", "kernels/", "tests/", "scripts/", "examples/", "include/", "docs/"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The files git tracks (the repository's own text, nothing built or downloaded).
fn tracked() -> Vec<String> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output()
        .expect("git runs (the checks read the tracked files)");
    assert!(out.status.success(), "git ls-files failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout.split(|&b| b == 0).filter(|p| !p.is_empty()).map(|p| String::from_utf8_lossy(p).into_owned()).collect()
}

/// The repository paths cited in backticks in `text`: the first word of a backticked span, when
/// it starts with one of [`ROOTS`] and is a plain path (no glob, placeholder or variable), less a
/// trailing `:line` and punctuation.
fn cited_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for span in line.split('`').skip(1).step_by(2) {
            let Some(word) = span.split_whitespace().next() else { continue };
            if !ROOTS.iter().any(|r| word.starts_with(r)) || word.contains(['*', '<', '{', '$', '[', '|']) {
                continue;
            }
            let word = word.trim_end_matches([',', '.', ';', ')', ':']);
            let word = match word.rsplit_once(':') {
                Some((path, line)) if line.chars().all(|c| c.is_ascii_digit()) => path,
                _ => word,
            };
            found.push((n + 1, word.to_string()));
        }
    }
    found
}

/// Where the docs that must cite only existing paths are: every README and docs/*.md.
fn is_doc(path: &str) -> bool {
    path.ends_with("README.md") || (path.starts_with("docs/") && !path[5..].contains('/') && path.ends_with(".md"))
}

#[test]
fn every_path_the_docs_cite_exists() {
    let root = root();
    let docs: Vec<String> = tracked().into_iter().filter(|p| is_doc(p)).collect();
    assert!(docs.iter().any(|d| d == "README.md") && docs.iter().any(|d| d == "docs/ARCHITECTURE.md"), "{docs:?}");
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(root.join(doc)).expect("a tracked doc reads");
        for (line, path) in cited_paths(&text) {
            checked += 1;
            if !Path::new(&root.join(&path)).exists() {
                missing.push(format!("{doc}:{line}: `{path}` does not exist"));
            }
        }
    }
    assert!(checked > 50, "only {checked} paths cited: is the extraction broken?");
    assert!(missing.is_empty(), "the docs cite paths that are not in the repository:\n{}", missing.join("\n"));
}

/// The results files that BENCHMARKS.md and GPU_RESULTS.md cite: the measurements behind their
/// tables are kept, so each must be in the repository even where the code it measured is gone.
#[test]
fn every_results_file_the_records_cite_exists() {
    let root = root();
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in ["BENCHMARKS.md", "GPU_RESULTS.md"] {
        let text = std::fs::read_to_string(root.join(doc)).expect("the record reads");
        for (n, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices("docs/results/") {
                let path: String =
                    line[at..].chars().take_while(|c| c.is_alphanumeric() || "/._-".contains(*c)).collect();
                let path = path.trim_end_matches('.');
                if path.contains('<') || !path.contains('.') {
                    continue; // a directory or a pattern, not one file
                }
                checked += 1;
                if !root.join(path).exists() {
                    missing.push(format!("{doc}:{}: {path} does not exist", n + 1));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} results files cited: is the extraction broken?");
    assert!(missing.is_empty(), "the records cite results that are not in the repository:\n{}", missing.join("\n"));
}

/// The prose of a line of `path`: a doc's whole line, a source file's comment (after `//`, `/*`,
/// a leading `*` or a `#` that starts a shell, Python or CMake comment), less backticked code.
fn prose(path: &str, line: &str) -> String {
    let text = if path.ends_with(".md") || path.ends_with(".txt") {
        line
    } else {
        let t = line.trim_start();
        let hash = (t.starts_with('#') && !t.starts_with("#[") && !t.starts_with("#!") && !t.starts_with("#include"))
            .then_some(t)
            .or_else(|| line.find(" # ").map(|i| &line[i..]));
        match (line.find("//"), line.find("/*"), t.strip_prefix('*')) {
            (Some(i), _, _) | (None, Some(i), _) => &line[i..],
            (None, None, Some(rest)) => rest,
            _ => hash.unwrap_or(""),
        }
    };
    text.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// A reference to a ticket or to a sitting of work on `line` of `path`, or None. "Session"
/// counts in prose where it starts a word; code may name things sessions (the tuner plugin's
/// `Session`, NCCL's `ncclBarrierSession`). `op #N` and `last is #N` are the operation numbers
/// of a hang report (`src/hang_report.rs`).
fn work_reference(path: &str, line: &str) -> Option<&'static str> {
    let p = prose(path, line).to_lowercase();
    for (at, _) in p.match_indices("session") {
        if !p[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
            return Some("the word \"session\"");
        }
    }
    let l = line.to_lowercase();
    for word in ["issue", "ticket"] {
        for (at, _) in l.match_indices(word) {
            let rest = l[at + word.len()..].trim_start().trim_start_matches('#');
            if rest.starts_with(|c: char| c.is_ascii_digit()) {
                return Some("an issue or ticket number");
            }
        }
    }
    for (at, _) in l.match_indices('#') {
        let before = &l[..at];
        let digits = l[at + 1..].chars().take_while(char::is_ascii_digit).count();
        let after = l[at + 1 + digits..].chars().next();
        let standalone = before.is_empty() || before.ends_with([' ', '(', '[']);
        if digits > 0
            && standalone
            && !after.is_some_and(|c| c.is_alphanumeric())
            && !before.ends_with("op ")
            && !before.ends_with("last is ")
        {
            return Some("a `#N` ticket reference");
        }
    }
    None
}

#[test]
fn no_file_refers_to_tickets_or_sittings_of_work() {
    let root = root();
    let mut found = Vec::new();
    // This file names what it looks for; Cargo.lock is generated.
    let own = ["Cargo.lock", "tests/doc_paths.rs"];
    for path in tracked().iter().filter(|p| !own.contains(&p.as_str())) {
        let Ok(bytes) = std::fs::read(root.join(path)) else { continue };
        if bytes.contains(&0) {
            continue; // not text
        }
        // NCCL's device API names its barrier and team objects sessions (`ncclLsaBarrierSession`),
        // and the headers that define them use the word in that sense.
        let api_sessions = path.starts_with("include/nccl_device");
        for (n, line) in String::from_utf8_lossy(&bytes).lines().enumerate() {
            let what = work_reference(path, line).filter(|w| !(api_sessions && w.contains("session")));
            if let Some(what) = what {
                found.push(format!("{path}:{}: {what}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "say what and why instead:\n{}", found.join("\n"));
}

#[test]
fn the_checks_catch_what_they_are_for() {
    let cited = cited_paths("see `src/env.rs` and `scripts/gpu_check.sh --only x`, `src/a.rs:12`;\n`src/*.rs` `cargo`");
    assert_eq!(cited, [(1, "src/env.rs".into()), (1, "scripts/gpu_check.sh".into()), (1, "src/a.rs".into())]);
    for bad in [
        "fixed in issue 13",
        "Issue #5 item 3",
        "what this session changed",
        "Sessions keep it",
        "see #12 for",
        "(session 4)",
    ] {
        assert!(work_reference("docs/X.md", bad).is_some(), "{bad}");
    }
    for good in [
        "hang report: op #1 (AllReduce)",
        "(its last is #11, finished)",
        "comm {:#018x}",
        "start_new_session=True",
        "ncclLsaBarrierSession<ncclCoopCta> bar",
        "#[cfg(test)]",
        "ours#1: losses",
        "issues a request",
    ] {
        assert_eq!(work_reference("src/x.rs", &format!("// {good}")), None, "{good}");
    }
    // Code may name a thing a session; prose in comments may not speak of sittings of work.
    assert_eq!(work_reference("src/x.rs", "use crate::plugin::tuner::{CostTable, Session as S};"), None);
    assert_eq!(work_reference("src/x.rs", "//! each communicator gets a [`Session`]"), None);
    assert!(work_reference("src/x.rs", "let x = 1; // added this session").is_some());
    assert!(work_reference("scripts/x.sh", "# the session's run").is_some());
    assert!(work_reference("src/x.cuh", " * kept from the last session").is_some());
}
