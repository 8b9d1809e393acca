//! Which interfaces sockets use (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`, the subnet of
//! `NCCL_COMM_ID`), for the bootstrap's listeners and the Socket net's devices alike.
//!
//! Interface matching ([`IfSpec`], [`IfRule::select`], [`on_subnet`]) is pure and unit-tested;
//! only [`interface_nets`] and [`IfRule::from_env`] touch the OS.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use super::addr::{resolve, split_host_port};
use crate::debug::Subsys;
use crate::error::{Error, Result};

/// A parsed `NCCL_SOCKET_IFNAME`: `eth,ib` (prefixes), `^docker,lo` (all but these prefixes),
/// `=eth0` (exact names), `^=eth0` (all but these names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfSpec {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfSpec {
    pub fn parse(spec: &str) -> IfSpec {
        let spec = spec.trim();
        let (exclude, spec) = spec.strip_prefix('^').map_or((false, spec), |s| (true, s));
        let (exact, spec) = spec.strip_prefix('=').map_or((false, spec), |s| (true, s));
        let names = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        IfSpec { exclude, exact, names }
    }

    /// As NCCL: an empty list matches every name, and `^` inverts the result.
    pub fn matches(&self, name: &str) -> bool {
        let listed = self.names.is_empty()
            || self.names.iter().any(|n| if self.exact { name == n } else { name.starts_with(n.as_str()) });
        listed != self.exclude
    }
}

crate::str_param!(
    /// NCCL_SOCKET_FAMILY: `AF_INET` or `AF_INET6`, the only address family sockets use.
    socket_family, "NCCL_SOCKET_FAMILY"
);

/// How sockets (the bootstrap's and the Socket net's) choose their interfaces, as NCCL 2.28.9:
/// `NCCL_SOCKET_IFNAME` when set; otherwise the first of these tiers that has an interface:
/// InfiniBand (`ib*`), the interfaces on the subnet of `NCCL_COMM_ID`'s address, anything but
/// `docker*`, `lo*` and `virbr*`, then `docker*`, then `lo*`, then `virbr*`. `NCCL_SOCKET_FAMILY`
/// keeps one address family throughout; IPv4 comes before IPv6 otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IfRule {
    /// `NCCL_SOCKET_IFNAME`.
    pub spec: Option<String>,
    /// `NCCL_SOCKET_FAMILY`: `Some(true)` for IPv6 only, `Some(false)` for IPv4 only.
    pub v6: Option<bool>,
    /// The interfaces on the subnet of `NCCL_COMM_ID`'s address (the second default tier).
    pub near: Vec<String>,
}

/// The default tiers around the subnet tier (see [`IfRule`]).
const FIRST_TIER: &str = "ib";
const LATER_TIERS: [&str; 4] = ["^docker,lo,virbr", "docker", "lo", "virbr"];

impl IfRule {
    /// The rule the environment sets. Fails on an `NCCL_SOCKET_FAMILY` that is neither family.
    pub fn from_env() -> Result<IfRule> {
        let v6 = match socket_family().map(str::trim) {
            None => None,
            Some(f) if f.eq_ignore_ascii_case("AF_INET") => Some(false),
            Some(f) if f.eq_ignore_ascii_case("AF_INET6") => Some(true),
            Some(f) => crate::bail_arg!("NCCL_SOCKET_FAMILY={f}: expected AF_INET or AF_INET6"),
        };
        let spec = crate::env::socket_ifname().map(String::from);
        // NCCL_COMM_ID's host, when it parses and resolves; a bad one fails where it is used.
        let remote = crate::env::comm_id()
            .filter(|_| spec.is_none())
            .and_then(|c| split_host_port(c).ok())
            .and_then(|(host, port)| resolve(host, port).ok());
        let near = remote.map(|r| on_subnet(r.ip(), &interface_nets())).unwrap_or_default();
        Ok(IfRule { spec, v6, near })
    }

    /// Candidate addresses in preference order: the spec's, or the first default tier that
    /// matches anything; IPv4 before IPv6 within that. Addresses a listener cannot usefully
    /// bind (unspecified, multicast, IPv6 link-local, which would need a scope) are skipped.
    pub fn select(&self, ifaces: &[(String, IpAddr)]) -> Vec<(String, IpAddr)> {
        let usable = |ip: &IpAddr| {
            !ip.is_unspecified()
                && !ip.is_multicast()
                && !matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
                && self.v6.is_none_or(|v6| ip.is_ipv6() == v6)
        };
        let pick = |spec: &IfSpec| -> Vec<(String, IpAddr)> {
            let mut v: Vec<_> = ifaces.iter().filter(|(n, ip)| usable(ip) && spec.matches(n)).cloned().collect();
            v.sort_by_key(|(_, ip)| ip.is_ipv6());
            v
        };
        if let Some(s) = &self.spec {
            return pick(&IfSpec::parse(s));
        }
        let near = IfSpec { exclude: false, exact: true, names: self.near.clone() };
        std::iter::once(IfSpec::parse(FIRST_TIER))
            .chain((!self.near.is_empty()).then_some(near))
            .chain(LATER_TIERS.iter().map(|t| IfSpec::parse(t)))
            .map(|t| pick(&t))
            .find(|v| !v.is_empty())
            .unwrap_or_default()
    }

    /// The error for a rule that selects nothing on this host: names the spec and the family and
    /// lists every interface that is up (NCCL's own message names neither). `layer` begins it.
    pub fn nothing_matches(&self, layer: &str, all: &[(String, IpAddr)]) -> Error {
        let listing = if all.is_empty() {
            "none".to_string()
        } else {
            all.iter().map(|(n, ip)| format!("{n} ({ip})")).collect::<Vec<_>>().join(", ")
        };
        let fam = match self.v6 {
            None => String::new(),
            Some(v6) => format!(" with NCCL_SOCKET_FAMILY={}", if v6 { "AF_INET6" } else { "AF_INET" }),
        };
        Error::InvalidUsage(match &self.spec {
            Some(s) => format!(
                "{layer}: NCCL_SOCKET_IFNAME={s} matches no usable interface{fam}. Interfaces that are up: {listing}. \
                 Use a name prefix (eth), ^ to exclude (^docker,lo) or = for exact names (=eth0)"
            ),
            None => format!("{layer}: no usable network interface{fam}. Interfaces that are up: {listing}"),
        })
    }

    /// How this rule chooses, for tools: "NCCL_SOCKET_IFNAME=eth0 selects them", or the
    /// default order.
    pub fn describe(&self) -> String {
        let only = self.v6.map(|v6| format!("NCCL_SOCKET_FAMILY keeps {} only", if v6 { "IPv6" } else { "IPv4" }));
        match &self.spec {
            Some(s) => {
                format!("NCCL_SOCKET_IFNAME={s} selects them{}", only.map(|o| format!("; {o}")).unwrap_or_default())
            }
            None => {
                let near = match self.near.is_empty() {
                    true => String::new(),
                    false => format!("then {} (on NCCL_COMM_ID's subnet), ", self.near.join(",")),
                };
                format!(
                    "NCCL_SOCKET_IFNAME is unset: the first of these that exists wins: ib*, {near}then any but \
                     docker*, lo* and virbr*, then docker*, then lo*, then virbr*; {}",
                    only.unwrap_or_else(|| "IPv4 before IPv6".into())
                )
            }
        }
    }
}

/// The names of the interfaces whose subnet holds `remote` (`nets`: name, address, prefix
/// length), as NCCL matches `NCCL_COMM_ID`'s address.
pub fn on_subnet(remote: IpAddr, nets: &[(String, IpAddr, u8)]) -> Vec<String> {
    let bits = |ip: IpAddr| match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)) << 96, 32u32),
        IpAddr::V6(a) => (u128::from(a), 128u32),
    };
    let (r, rlen) = bits(remote);
    let mut out: Vec<String> = Vec::new();
    for (name, ip, prefix) in nets {
        let (a, len) = bits(*ip);
        let prefix = u32::from(*prefix);
        if len != rlen || prefix > len || prefix == 0 {
            continue;
        }
        let mask = u128::MAX << (128 - prefix);
        if a & mask == r & mask && !out.contains(name) {
            out.push(name.clone());
        }
    }
    out
}

/// `(name, address)` of every interface that is up.
pub fn interfaces() -> Vec<(String, IpAddr)> {
    interface_nets().into_iter().map(|(n, ip, _)| (n, ip)).collect()
}

/// The prefix length of a netmask (its leading ones).
fn prefix_len(mask: IpAddr) -> u8 {
    match mask {
        IpAddr::V4(m) => u32::from(m).leading_ones() as u8,
        IpAddr::V6(m) => u128::from(m).leading_ones() as u8,
    }
}

/// The address a `sockaddr` holds, for the two families we use.
///
/// # Safety
/// `sa` is null or points at a valid sockaddr whose `sa_family` says which struct it is.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: per this function's contract, the family says which sockaddr `sa` points at.
    unsafe {
        match (*sa).sa_family as libc::c_int {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

/// `(name, address, prefix length)` of every interface that is up, from getifaddrs.
pub fn interface_nets() -> Vec<(String, IpAddr, u8)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs only writes the list head; the list is freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        crate::nccl_warn!("Bootstrap: getifaddrs failed: {}", io::Error::last_os_error());
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_flags & libc::IFF_UP as libc::c_uint == 0 {
            continue;
        }
        // SAFETY: the list's sockaddrs are null or valid with a family; ifa_name is a
        // NUL-terminated string owned by the list.
        let (ip, mask, name) =
            unsafe { (sockaddr_ip(ifa.ifa_addr), sockaddr_ip(ifa.ifa_netmask), CStr::from_ptr(ifa.ifa_name)) };
        let Some(ip) = ip else { continue };
        let full = if ip.is_ipv4() { 32 } else { 128 };
        out.push((name.to_string_lossy().into_owned(), ip, mask.map_or(full, prefix_len)));
    }
    // SAFETY: head came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The address this process's bootstrap listeners bind, chosen once per process ([`IfRule`]).
/// A rule the user set (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`) that selects nothing is an
/// error, as in NCCL: 127.0.0.1 in its place would send every other host to its own loopback.
pub fn local_ip() -> Result<IpAddr> {
    static IP: OnceLock<Result<IpAddr>> = OnceLock::new();
    IP.get_or_init(|| {
        let rule = IfRule::from_env()?;
        let all = interfaces();
        match rule.select(&all).first() {
            Some((name, ip)) => {
                crate::nccl_info!(Subsys::BOOTSTRAP, "Bootstrap: using interface {name} ({ip})");
                Ok(*ip)
            }
            None if rule.spec.is_some() || rule.v6.is_some() => Err(rule.nothing_matches("Bootstrap", &all)),
            None => {
                crate::nccl_info!(Subsys::BOOTSTRAP, "Bootstrap: no usable interface found; falling back to 127.0.0.1");
                Ok(Ipv4Addr::LOCALHOST.into())
            }
        }
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifs(list: &[(&str, &str)]) -> Vec<(String, IpAddr)> {
        list.iter().map(|(n, a)| (n.to_string(), a.parse().unwrap())).collect()
    }

    fn names(v: Vec<(String, IpAddr)>) -> Vec<String> {
        v.into_iter().map(|(n, ip)| format!("{n}/{ip}")).collect()
    }

    #[test]
    fn spec_parsing_and_matching() {
        let s = IfSpec::parse("eth,ib");
        assert!(s.matches("eth0") && s.matches("ib1") && !s.matches("lo") && !s.matches("veth0"));
        let s = IfSpec::parse("^docker,lo");
        assert!(s.matches("eth0") && !s.matches("docker0") && !s.matches("lo"));
        let s = IfSpec::parse("=eth0");
        assert!(s.matches("eth0") && !s.matches("eth01") && !s.matches("eth"));
        let s = IfSpec::parse("^=eth0, eth1 ");
        assert!(!s.matches("eth0") && !s.matches("eth1") && s.matches("eth10"));
        assert!(IfSpec::parse("").matches("anything"));
        assert!(!IfSpec::parse("^").matches("anything"));
    }

    const HOST: &[(&str, &str)] = &[
        ("lo", "127.0.0.1"),
        ("lo", "::1"),
        ("docker0", "172.17.0.1"),
        ("eth0", "fd00::2"),
        ("eth0", "fe80::1"),
        ("eth0", "192.0.2.2"),
        ("eth1", "10.0.0.2"),
    ];

    fn rule(spec: Option<&str>, v6: Option<bool>, near: &[&str]) -> IfRule {
        IfRule { spec: spec.map(String::from), v6, near: near.iter().map(|n| n.to_string()).collect() }
    }

    fn select_addrs(spec: Option<&str>, ifaces: &[(String, IpAddr)]) -> Vec<(String, IpAddr)> {
        rule(spec, None, &[]).select(ifaces)
    }

    #[test]
    fn default_prefers_real_interfaces_ipv4_first() {
        assert_eq!(names(select_addrs(None, &ifs(HOST))), ["eth0/192.0.2.2", "eth1/10.0.0.2", "eth0/fd00::2"]);
    }

    #[test]
    fn default_prefers_ib_then_falls_back_to_docker_then_lo_then_virbr() {
        let mut with_ib = HOST.to_vec();
        with_ib.push(("ib0", "10.9.0.1"));
        assert_eq!(names(select_addrs(None, &ifs(&with_ib))), ["ib0/10.9.0.1"]);
        let no_real = &[("lo", "127.0.0.1"), ("virbr0", "192.168.122.1"), ("docker0", "172.17.0.1")];
        assert_eq!(names(select_addrs(None, &ifs(no_real))), ["docker0/172.17.0.1"]);
        let lo_virbr = &[("virbr0", "192.168.122.1"), ("lo", "::1"), ("lo", "127.0.0.1")];
        assert_eq!(names(select_addrs(None, &ifs(lo_virbr))), ["lo/127.0.0.1", "lo/::1"]);
        assert_eq!(names(select_addrs(None, &ifs(&[("virbr0", "192.168.122.1")]))), ["virbr0/192.168.122.1"]);
        assert!(select_addrs(None, &[]).is_empty());
        // virbr is never in the "anything else" tier.
        let mut with_virbr = HOST.to_vec();
        with_virbr.push(("virbr0", "192.168.122.1"));
        assert_eq!(names(select_addrs(None, &ifs(&with_virbr))), ["eth0/192.0.2.2", "eth1/10.0.0.2", "eth0/fd00::2"]);
    }

    #[test]
    fn comm_id_subnet_comes_after_ib_and_before_the_rest() {
        let nets: Vec<(String, IpAddr, u8)> = [
            ("lo", "127.0.0.1", 8),
            ("eth0", "192.0.2.2", 24),
            ("eth1", "10.0.0.2", 16),
            ("eth1", "fd00::2", 64),
            ("eth2", "10.1.0.2", 16),
        ]
        .iter()
        .map(|(n, a, p)| (n.to_string(), a.parse().unwrap(), *p))
        .collect();
        let near = |r: &str| on_subnet(r.parse().unwrap(), &nets);
        assert_eq!(near("10.0.77.1"), ["eth1"]);
        assert_eq!(near("127.0.0.1"), ["lo"]);
        assert_eq!(near("fd00::99"), ["eth1"]);
        assert!(near("203.0.113.5").is_empty() && near("fd01::1").is_empty());
        assert!(on_subnet("10.0.0.1".parse().unwrap(), &[("odd".into(), "10.0.0.2".parse().unwrap(), 0)]).is_empty());
        assert!(on_subnet("10.0.0.1".parse().unwrap(), &[("odd".into(), "10.0.0.2".parse().unwrap(), 99)]).is_empty());
        let h = ifs(HOST);
        assert_eq!(names(rule(None, None, &["eth1"]).select(&h)), ["eth1/10.0.0.2"]);
        let mut with_ib = HOST.to_vec();
        with_ib.push(("ib0", "10.9.0.1"));
        assert_eq!(names(rule(None, None, &["eth1"]).select(&ifs(&with_ib))), ["ib0/10.9.0.1"]);
        // A subnet match only counts without NCCL_SOCKET_IFNAME.
        assert_eq!(names(rule(Some("=eth0"), None, &["eth1"]).select(&h)), ["eth0/192.0.2.2", "eth0/fd00::2"]);
        // An interface on the subnet whose address the family excludes falls through to the rest.
        assert_eq!(names(rule(None, Some(true), &["eth1"]).select(&h)), ["eth0/fd00::2"]);
    }

    #[test]
    fn family_keeps_one_kind_of_address_in_every_tier() {
        let h = ifs(HOST);
        assert_eq!(names(rule(None, Some(false), &[]).select(&h)), ["eth0/192.0.2.2", "eth1/10.0.0.2"]);
        assert_eq!(names(rule(None, Some(true), &[]).select(&h)), ["eth0/fd00::2"]);
        assert_eq!(names(rule(Some("lo"), Some(true), &[]).select(&h)), ["lo/::1"]);
        assert!(rule(Some("docker"), Some(true), &[]).select(&h).is_empty());
        let text = rule(None, Some(true), &["eth1"]).describe();
        assert!(text.contains("ib*, then eth1 (on NCCL_COMM_ID's subnet), then any but docker*"), "{text}");
        assert!(text.contains("IPv6 only"), "{text}");
    }

    #[test]
    fn user_spec_is_obeyed() {
        let h = ifs(HOST);
        assert_eq!(names(select_addrs(Some("lo"), &h)), ["lo/127.0.0.1", "lo/::1"]);
        assert_eq!(names(select_addrs(Some("=eth1"), &h)), ["eth1/10.0.0.2"]);
        assert_eq!(names(select_addrs(Some("=eth"), &h)), Vec::<String>::new());
        assert_eq!(names(select_addrs(Some("^eth"), &h)), ["lo/127.0.0.1", "docker0/172.17.0.1", "lo/::1"]);
        assert_eq!(names(select_addrs(Some("docker,eth1"), &h)), ["docker0/172.17.0.1", "eth1/10.0.0.2"]);
        assert!(select_addrs(Some("nonexistent"), &h).is_empty());
    }
}
