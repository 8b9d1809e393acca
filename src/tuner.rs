//! The tuner's constraints: `NCCL_ALGO` and `NCCL_PROTO` restrict which algorithm and protocol
//! a collective may use, with NCCL's syntax (a comma list of names, case-insensitive; a leading
//! `^` excludes the listed ones instead).
//!
//! ferronickel implements one algorithm (Ring) and one protocol (Simple) so far. A restriction
//! that leaves none of the implemented ones makes collectives fail with `ncclInvalidUsage` and a
//! message naming the variable, rather than silently ignoring what the user asked for.

use crate::error::{Error, Result};
use std::sync::OnceLock;

pub const ALGOS: [&str; 7] = ["Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"];
pub const PROTOS: [&str; 3] = ["LL", "LL128", "Simple"];

/// The names of `all` that a setting allows, or an error naming an unknown entry.
pub fn allowed<'a>(setting: &str, all: &[&'a str], var: &str) -> Result<Vec<&'a str>> {
    let (exclude, list) = match setting.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, setting.trim()),
    };
    let mut named = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match all.iter().find(|a| a.eq_ignore_ascii_case(item)) {
            Some(a) => named.push(*a),
            None => crate::bail_arg!("{var}={setting}: unknown entry {item:?} (known: {})", all.join(", ")),
        }
    }
    Ok(all.iter().copied().filter(|a| named.contains(a) != exclude).collect())
}

/// Checks that an implemented choice remains under `var`'s restriction.
pub fn check_restriction(setting: Option<&str>, all: &[&str], implemented: &str, var: &str) -> Result<()> {
    let Some(setting) = setting else { return Ok(()) };
    let ok = allowed(setting, all, var)?;
    if ok.contains(&implemented) {
        return Ok(());
    }
    Err(Error::InvalidUsage(format!(
        "{var}={setting} allows only {} but ferronickel implements only {implemented} so far; unset {var} or include {implemented}",
        if ok.is_empty() { "nothing".to_string() } else { ok.join(", ") }
    )))
}

crate::str_param!(
    /// NCCL_ALGO: which algorithms collectives may use.
    algo_setting, "NCCL_ALGO"
);
crate::str_param!(
    /// NCCL_PROTO: which protocols collectives may use.
    proto_setting, "NCCL_PROTO"
);

/// Whether collectives can run under this process's NCCL_ALGO / NCCL_PROTO (checked once).
pub fn check_env() -> Result<()> {
    static CHECKED: OnceLock<Result<()>> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            check_restriction(algo_setting(), &ALGOS, "Ring", "NCCL_ALGO")?;
            check_restriction(proto_setting(), &PROTOS, "Simple", "NCCL_PROTO")
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_syntax() {
        assert_eq!(allowed("LL,simple", &PROTOS, "NCCL_PROTO").unwrap(), ["LL", "Simple"]);
        assert_eq!(allowed("^LL", &PROTOS, "NCCL_PROTO").unwrap(), ["LL128", "Simple"]);
        assert_eq!(allowed(" ring ", &ALGOS, "NCCL_ALGO").unwrap(), ["Ring"]);
        assert!(allowed("Ring,Bogus", &ALGOS, "NCCL_ALGO").unwrap_err().to_string().contains("\"Bogus\""));
    }

    #[test]
    fn restrictions_that_exclude_what_exists_are_refused() {
        assert!(check_restriction(None, &PROTOS, "Simple", "NCCL_PROTO").is_ok());
        assert!(check_restriction(Some("Simple"), &PROTOS, "Simple", "NCCL_PROTO").is_ok());
        assert!(check_restriction(Some("^LL,LL128"), &PROTOS, "Simple", "NCCL_PROTO").is_ok());
        let e = check_restriction(Some("LL"), &PROTOS, "Simple", "NCCL_PROTO").unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)));
        assert!(e.to_string().contains("NCCL_PROTO=LL allows only LL but ferronickel implements only Simple"));
        let e = check_restriction(Some("^Ring"), &ALGOS, "Ring", "NCCL_ALGO").unwrap_err();
        assert!(e.to_string().contains("allows only Tree, CollnetDirect"));
    }
}
