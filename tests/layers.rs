//! The layers of docs/ARCHITECTURE.md hold: every `crate::` or `$crate::` path (and every use of
//! one of the crate's macros) in `src/` is an import of one top-level module by another, and a module may
//! import only its own layer and the layers its row lists, with no cycle between modules.
//! `#[cfg(test)]` items and test-only files are left out: tests may reach anywhere.
//!
//! On failure the message names the file, the line and the offending import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One row of the layer table.
#[derive(Debug)]
struct Layer {
    number: u32,
    modules: Vec<String>,
    may_import: Vec<u32>,
}

/// One import: `from` (a file of module `from_mod`) names `to` at `line`.
#[derive(Debug, Clone)]
struct Import {
    file: String,
    line: usize,
    from_mod: String,
    to_mod: String,
    text: String,
}

/// The rows between `<!-- layers:begin -->` and `<!-- layers:end -->`:
/// `| number | name | module, module | layer, layer (or "none") |`.
fn parse_layers(doc: &str) -> Result<Vec<Layer>, String> {
    let begin = doc.find("<!-- layers:begin -->").ok_or("no `<!-- layers:begin -->` marker")?;
    let end = doc.find("<!-- layers:end -->").ok_or("no `<!-- layers:end -->` marker")?;
    let mut layers = Vec::new();
    for row in doc[begin..end].lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let Ok(number) = cells[0].parse::<u32>() else { continue };
        if cells.len() != 4 {
            return Err(format!("layer row {row:?} does not have 4 cells"));
        }
        fn list(s: &str) -> impl Iterator<Item = String> + '_ {
            s.split(',').map(|m| m.trim().trim_matches('`').to_string()).filter(|m| !m.is_empty())
        }
        let modules = list(cells[2]).collect();
        let may_import = if cells[3] == "none" {
            Vec::new()
        } else {
            list(cells[3])
                .map(|n| n.parse().map_err(|_| format!("layer row {row:?}: {n:?} is not a layer number")))
                .collect::<Result<_, _>>()?
        };
        layers.push(Layer { number, modules, may_import });
    }
    if layers.is_empty() {
        return Err("the layer table is empty".into());
    }
    Ok(layers)
}

/// Source text with comments, string and char literals blanked out (newlines kept, so line
/// numbers stay right).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| out.extend(s.iter().map(|&c| if c == b'\n' { '\n' } else { ' ' }));
    while i < b.len() {
        let rest = &b[i..];
        let skip = if rest.starts_with(b"//") {
            rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            rest.windows(2).position(|w| w == b"*/").map_or(rest.len(), |p| p + 2)
        } else if rest.starts_with(b"r#\"") || rest.starts_with(b"r\"") {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let body = 2 + hashes;
            rest[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(rest.len(), |p| body + p + close.len())
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(rest.len())
        } else if rest[0] == b'\'' && (rest.get(1) == Some(&b'\\') || rest.get(2) == Some(&b'\'')) {
            // A char literal ('x', '\n', '\''); a lifetime ('a) has no closing quote there.
            let mut j = 2;
            while j < rest.len() && rest[j] != b'\'' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(rest.len())
        } else {
            0
        };
        if skip == 0 {
            out.push(rest[0] as char);
            i += 1;
        } else {
            blank(&mut out, &rest[..skip]);
            i += skip;
        }
    }
    out
}

/// `code` with every `#[cfg(test)]` item blanked out; also returns the names of test-only
/// modules declared as files (`#[cfg(test)] mod x;`).
fn without_test_items(code: &str) -> (String, Vec<String>) {
    let mut out = code.to_string();
    let mut test_files = Vec::new();
    let mut from = 0;
    while let Some(at) = out[from..].find("#[cfg(test)]").map(|p| p + from) {
        let item = at + "#[cfg(test)]".len();
        // The item ends at its first `;` before any `{`, or at the `}` matching its first `{`.
        let rest = &out[item..];
        let end = match (rest.find(';'), rest.find('{')) {
            (Some(semi), brace) if brace.is_none_or(|b| semi < b) => {
                let decl = rest[..semi].trim();
                if let Some(name) = decl.strip_prefix("mod ").or_else(|| decl.strip_prefix("pub mod ")) {
                    test_files.push(name.trim().to_string());
                }
                item + semi + 1
            }
            (_, Some(open)) => {
                let mut depth = 0usize;
                let mut end = out.len();
                for (i, c) in rest[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = item + open + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            _ => out.len(),
        };
        // One space per byte, so every later byte offset stays where it was.
        let blanked: String = out[at..end].bytes().map(|c| if c == b'\n' { '\n' } else { ' ' }).collect();
        out.replace_range(at..end, &blanked);
        from = end;
    }
    (out, test_files)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    &s[..s.find(|c: char| !is_ident(c)).unwrap_or(s.len())]
}

/// The imports of one file of module `module`. `modules` are the crate's top-level modules,
/// `macros` maps each of the crate's macros to the module defining it.
fn imports_of(
    file: &str,
    module: &str,
    code: &str,
    modules: &BTreeSet<String>,
    macros: &BTreeMap<String, String>,
) -> Vec<Import> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let mut add = |to: &str, text: &str| {
            if to != module {
                let text = text.trim().to_string();
                found.push(Import {
                    file: file.to_string(),
                    line: n + 1,
                    from_mod: module.into(),
                    to_mod: to.into(),
                    text,
                });
            }
        };
        // `$crate::` (in a macro's body) counts as the defining module's import: the module
        // that writes the path depends on its target as much as a plain `crate::` would.
        for (at, _) in line.match_indices("crate::") {
            if line[..at].ends_with(is_ident) {
                continue;
            }
            let rest = &line[at + "crate::".len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group.split([',', '}']).map(|s| ident(s.trim())).collect(),
                None => vec![ident(rest)],
            };
            for name in names {
                let target = if rest[name.len()..].starts_with('!') { macros.get(name) } else { modules.get(name) };
                if let Some(to) = target {
                    add(to, line);
                }
            }
        }
        // `super::x` in a top-level module's own file is `crate::x`.
        if !file.contains('/') {
            for (at, _) in line.match_indices("super::") {
                if !line[..at].ends_with(is_ident) {
                    if let Some(to) = modules.get(ident(&line[at + "super::".len()..])) {
                        add(to, line);
                    }
                }
            }
        }
        // A macro named without a path (macro_rules! defined earlier in the crate).
        for (name, to) in macros {
            for (at, _) in line.match_indices(name.as_str()) {
                let before = &line[..at];
                let after = &line[at + name.len()..];
                if after.starts_with('!')
                    && !before.ends_with(|c: char| is_ident(c) || c == ':')
                    && !before.ends_with("macro_rules! ")
                {
                    add(to, line);
                }
            }
        }
    }
    found
}

/// Every `.rs` file under `dir`, as paths relative to `root`.
fn rust_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(root, &p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p.strip_prefix(root).expect("under root").to_path_buf());
        }
    }
}

/// All the violations of `layers` by the crate whose sources are `files` (path relative to
/// `src/`, text); empty when the layering holds.
fn check(files: &[(String, String)], layers: &[Layer]) -> Vec<String> {
    let mut problems = Vec::new();
    let layer_of: BTreeMap<&str, &Layer> =
        layers.iter().flat_map(|l| l.modules.iter().map(move |m| (m.as_str(), l))).collect();
    // Binaries are crates of their own; lib.rs only declares the modules.
    let files: Vec<&(String, String)> = files.iter().filter(|(f, _)| f != "lib.rs" && !f.starts_with("bin/")).collect();
    let module_of = |f: &str| f.split('/').next().unwrap_or(f).trim_end_matches(".rs").to_string();
    let modules: BTreeSet<String> = files.iter().map(|(f, _)| module_of(f)).collect();
    let mut macros = BTreeMap::new();
    let mut cleaned = Vec::new();
    let mut test_files = BTreeSet::new();
    for (f, src) in &files {
        let (code, tests) = without_test_items(&code_only(src));
        // `#[cfg(test)] mod t;` in `x/mod.rs` is `x/t.rs`; in `x.rs` or `x/y.rs` it is `x/t.rs` or `x/y/t.rs`.
        let parent = f.strip_suffix("mod.rs").map_or_else(|| format!("{}/", f.trim_end_matches(".rs")), str::to_string);
        test_files.extend(tests.iter().map(|t| format!("{parent}{t}.rs")));
        for (at, _) in code.match_indices("macro_rules!") {
            let name = ident(code[at + "macro_rules!".len()..].trim_start());
            macros.insert(name.to_string(), module_of(f));
        }
        cleaned.push((f.as_str(), code));
    }
    let mut imports = Vec::new();
    for (f, code) in cleaned.iter().filter(|(f, _)| !test_files.contains(*f)) {
        let m = module_of(f);
        if !layer_of.contains_key(m.as_str()) {
            problems.push(format!(
                "src/{f}: module `{m}` is in no layer of docs/ARCHITECTURE.md; add it to the layer table"
            ));
            continue;
        }
        imports.extend(imports_of(f, &m, code, &modules, &macros));
    }
    for i in &imports {
        let (from, to) = (layer_of[i.from_mod.as_str()], layer_of.get(i.to_mod.as_str()));
        let Some(to) = to else { continue };
        if to.number != from.number && !from.may_import.contains(&to.number) {
            problems.push(format!(
                "src/{}:{}: `{}` (layer {}) imports `{}` (layer {}), which its layer may not import: {}",
                i.file, i.line, i.from_mod, from.number, i.to_mod, to.number, i.text
            ));
        }
    }
    problems.extend(cycles(&imports));
    problems
}

/// One message per cycle in the module graph, naming an import on each of its edges.
fn cycles(imports: &[Import]) -> Vec<String> {
    let mut edges: BTreeMap<&str, BTreeMap<&str, &Import>> = BTreeMap::new();
    for i in imports {
        edges.entry(&i.from_mod).or_default().entry(&i.to_mod).or_insert(i);
    }
    let mut reported: BTreeSet<Vec<&str>> = BTreeSet::new();
    let mut out = Vec::new();
    for &start in edges.keys() {
        // Depth-first search for a path back to `start`.
        let mut stack: Vec<(&str, Vec<&str>)> = vec![(start, vec![start])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for &next in edges.get(at).map(|e| e.keys().collect::<Vec<_>>()).unwrap_or_default() {
                if next == start {
                    let mut key = path.clone();
                    key.sort();
                    if reported.insert(key) {
                        let mut hops = path.clone();
                        hops.push(start);
                        let steps: Vec<String> = hops
                            .windows(2)
                            .map(|w| {
                                let i = edges[w[0]][w[1]];
                                format!(
                                    "  src/{}:{}: `{}` imports `{}`: {}",
                                    i.file, i.line, i.from_mod, i.to_mod, i.text
                                )
                            })
                            .collect();
                        out.push(format!("import cycle {}:\n{}", hops.join(" -> "), steps.join("\n")));
                    }
                } else if seen.insert(next) {
                    let mut p = path.clone();
                    p.push(next);
                    stack.push((next, p));
                }
            }
        }
    }
    out
}

#[test]
fn imports_follow_the_layers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let doc_path = root.join("docs/ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap_or_else(|e| panic!("cannot read {}: {e}", doc_path.display()));
    let layers = parse_layers(&doc).unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    let src = root.join("src");
    let mut paths = Vec::new();
    rust_files(&src, &src, &mut paths);
    let files: Vec<(String, String)> = paths
        .iter()
        .map(|p| (p.to_string_lossy().into_owned(), std::fs::read_to_string(src.join(p)).expect("readable source")))
        .collect();
    assert!(files.len() > 20, "found only {} source files under {}", files.len(), src.display());
    let problems = check(&files, &layers);
    assert!(problems.is_empty(), "the layering of docs/ARCHITECTURE.md is broken:\n{}", problems.join("\n"));
}

/// The checker itself: it must catch what it is for, and say where.
#[test]
fn checker_reports_upward_imports_and_cycles() {
    let layers = parse_layers(
        "<!-- layers:begin -->\n| layer | name | modules | may import |\n|---|---|---|---|\n\
         | 1 | low | `a`, `b` | none |\n| 2 | high | `c` | 1 |\n<!-- layers:end -->",
    )
    .unwrap();
    let file = |f: &str, s: &str| (f.to_string(), s.to_string());
    let ok = [
        file("a.rs", "#[macro_export]\nmacro_rules! yell { () => {} }\n"),
        file("b.rs", "use crate::a;\n// crate::c in a comment\nconst S: &str = \"crate::c\";\n#[cfg(test)]\nmod tests { use crate::c; }\n"),
        file("c/mod.rs", "mod d;\nuse crate::{a, b::X};\nfn f() { crate::yell!(); }\n"),
        file("c/d.rs", "use super::*;\n"),
    ];
    assert_eq!(check(&ok, &layers), Vec::<String>::new());

    let upward = [file("a.rs", "\n\nfn f() { crate::c::g() }\n"), file("c.rs", "pub fn g() {}\n")];
    let p = check(&upward, &layers);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("src/a.rs:3: `a` (layer 1) imports `c` (layer 2)") && p[0].contains("crate::c::g()"),
        "{p:?}"
    );

    let cycle = [file("a.rs", "use crate::b::Y;\n"), file("b.rs", "\nuse crate::a::X;\n")];
    let p = check(&cycle, &layers);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("import cycle a -> b -> a") && p[0].contains("src/b.rs:2: `b` imports `a`"), "{p:?}");

    let macro_up =
        [file("a.rs", "fn f() { yell!(); }\n"), file("c.rs", "#[macro_export]\nmacro_rules! yell { () => {} }\n")];
    assert!(check(&macro_up, &layers)[0].starts_with("src/a.rs:1: `a` (layer 1) imports `c`"));

    let macro_path = [file("a.rs", "macro_rules! m { () => { $crate::c::g() } }\n"), file("c.rs", "pub fn g() {}\n")];
    let p = check(&macro_path, &layers);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("src/a.rs:1: `a` (layer 1) imports `c` (layer 2)"), "{p:?}");

    let macro_cycle =
        [file("a.rs", "macro_rules! m { () => { $crate::b::f() } }\n"), file("b.rs", "fn f() { crate::a::g() }\n")];
    assert!(check(&macro_cycle, &layers)[0].contains("import cycle a -> b -> a"), "{:?}", check(&macro_cycle, &layers));

    let unknown = [file("z.rs", "")];
    assert!(check(&unknown, &layers)[0].contains("module `z` is in no layer"));
}
