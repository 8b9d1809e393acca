//! Where an `NCCL_*` parameter's raw value comes from, as NCCL reads it: the environment first,
//! then the configuration file (`NCCL_CONF_FILE` if set, else `~/.nccl.conf`, else
//! `/etc/nccl.conf`; lines `NAME=value`, `#` comments). It logs nothing, so that `debug` (which
//! reads `NCCL_DEBUG` here) and `env` (whose cached parameters log what they read) both sit above it.

use std::collections::HashMap;
use std::sync::OnceLock;

/// Parses `NAME=value` lines; later lines win, comments and malformed lines are skipped.
pub fn parse_conf(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// The configuration file in use (the first of the candidates that reads) and its settings.
fn conf_file() -> &'static (Option<String>, HashMap<String, String>) {
    static CONF: OnceLock<(Option<String>, HashMap<String, String>)> = OnceLock::new();
    CONF.get_or_init(|| {
        let mut paths = Vec::new();
        if let Ok(p) = std::env::var("NCCL_CONF_FILE") {
            paths.push(p);
        } else {
            if let Ok(home) = std::env::var("HOME") {
                paths.push(format!("{home}/.nccl.conf"));
            }
            paths.push("/etc/nccl.conf".to_string());
        }
        // The first file found is the one NCCL uses.
        paths
            .into_iter()
            .find_map(|p| std::fs::read_to_string(&p).ok().map(|t| (Some(p), parse_conf(&t))))
            .unwrap_or_default()
    })
}

/// The raw value of a parameter: environment first, then the configuration file.
pub fn get(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty()).or_else(|| conf_file().1.get(name).cloned())
}

/// Where a setting in effect came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Environment,
    /// The configuration file, by path.
    ConfFile(String),
}

/// Every `NCCL_*` and `FERRONICKEL_*` setting in effect, by name, with its value and source,
/// resolved as [`get`] resolves them (so `ferronickel info` shows what the library sees).
pub fn settings() -> Vec<(String, String, Source)> {
    let ours = |k: &str| k.starts_with("NCCL_") || k.starts_with("FERRONICKEL_");
    let mut out: Vec<(String, String, Source)> =
        std::env::vars().filter(|(k, v)| ours(k) && !v.is_empty()).map(|(k, v)| (k, v, Source::Environment)).collect();
    if let (Some(path), conf) = conf_file() {
        for (k, v) in conf {
            if ours(k) && !out.iter().any(|(n, _, _)| n == k) {
                out.push((k.clone(), v.clone(), Source::ConfFile(path.clone())));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Parses an integer the way NCCL does (decimal or 0x-prefixed hex).
pub fn parse_i64(v: &str) -> Option<i64> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_lines() {
        let m = parse_conf("# comment\nNCCL_DEBUG=INFO\n  NCCL_BUFFSIZE = 0x100 # trailing\nbogus\n=x\n");
        assert_eq!(m.get("NCCL_DEBUG").map(String::as_str), Some("INFO"));
        assert_eq!(m.get("NCCL_BUFFSIZE").map(String::as_str), Some("0x100"));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn ints() {
        assert_eq!(parse_i64("0x100"), Some(256));
        assert_eq!(parse_i64(" 42 "), Some(42));
        assert_eq!(parse_i64("-1"), Some(-1));
        assert_eq!(parse_i64("abc"), None);
    }
}
