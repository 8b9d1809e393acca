//! Which kind of transport connects each pair of ranks (docs/ARCHITECTURE.md, "Transports"):
//! [`select`], a pure function of both ranks' [`PeerInfo`], their [`Settings`] and the link
//! between their GPUs, and [`exchange_kinds`], which checks that both ends of every pair agree.

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::topo::PeerInfo;

/// How a pair of ranks is connected. Ordered by preference (P2P first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// FIFOs in GPU memory that the peer's GPU writes directly (same process or CUDA IPC).
    P2p,
    /// FIFOs in host memory shared by both processes and mapped into both GPUs.
    Shm,
    /// Through the network, with a proxy thread on each side.
    Net,
}

impl Kind {
    /// NCCL's name for it in logs.
    pub fn name(self) -> &'static str {
        match self {
            Kind::P2p => "P2P",
            Kind::Shm => "SHM",
            Kind::Net => "NET",
        }
    }

    pub(super) fn to_byte(self) -> u8 {
        self as u8
    }

    pub(super) fn from_byte(b: u8) -> Result<Kind> {
        [Kind::P2p, Kind::Shm, Kind::Net]
            .into_iter()
            .find(|k| k.to_byte() == b)
            .ok_or_else(|| Error::Internal(format!("unknown transport kind {b} in a peer's record")))
    }
}

/// NCCL's path types between two GPUs of one host, from closest to farthest, as
/// `NCCL_P2P_LEVEL` names them. P2P is used for a pair whose path is at most the level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Path {
    /// The same GPU. As a level: never use P2P (what `NCCL_P2P_DISABLE=1` means).
    Loc,
    /// NVLink.
    Nvl,
    /// Through one PCIe switch.
    Pix,
    /// Through several PCIe switches.
    Pxb,
    /// Through the CPU's PCIe host bridge.
    Phb,
    /// Across the CPUs' interconnect (NUMA nodes).
    Sys,
}

impl Path {
    const NAMES: [(&'static str, Path); 6] = [
        ("LOC", Path::Loc),
        ("NVL", Path::Nvl),
        ("PIX", Path::Pix),
        ("PXB", Path::Pxb),
        ("PHB", Path::Phb),
        ("SYS", Path::Sys),
    ];

    /// A `NCCL_P2P_LEVEL` value: a name, or NCCL's legacy numbers (0 LOC, 1 PIX, 2 PXB, 3 PHB,
    /// 4 and above SYS). `None` for anything else.
    pub fn parse_level(s: &str) -> Option<Path> {
        let s = s.trim();
        if let Some((_, p)) = Self::NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
            return Some(*p);
        }
        const LEGACY: [Path; 5] = [Path::Loc, Path::Pix, Path::Pxb, Path::Phb, Path::Sys];
        s.parse::<u64>().ok().map(|n| LEGACY[(n as usize).min(LEGACY.len() - 1)])
    }

    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, p)| *p == self).map(|(n, _)| *n).unwrap_or("?")
    }
}

/// What the environment allows, as one rank read it. Each rank publishes its own and a pair
/// uses the stricter of the two ([`Settings::stricter`]), so both ends pick the same kind even
/// when their environments differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settings {
    /// The farthest path P2P may take; `None`: any pair with peer access (the default).
    pub p2p_level: Option<Path>,
    /// `NCCL_SHM_DISABLE=1`.
    pub shm_disable: bool,
}

impl Settings {
    pub const BYTES: usize = 2;
    const DEFAULT_LEVEL: u8 = 0xff;

    /// From `NCCL_P2P_DISABLE`, `NCCL_P2P_LEVEL` and `NCCL_SHM_DISABLE` (as NCCL: a disable of
    /// 1 wins over a level; an unknown level is ignored with a warning).
    pub fn parse(p2p_disable: Option<&str>, p2p_level: Option<&str>, shm_disable: Option<&str>) -> Settings {
        let is_one = |v: Option<&str>| v.and_then(crate::param::parse_i64) == Some(1);
        let p2p_level = if is_one(p2p_disable) {
            Some(Path::Loc)
        } else {
            p2p_level.and_then(|s| {
                let level = Path::parse_level(s);
                if level.is_none() {
                    crate::nccl_warn!(
                        "Invalid value {s:?} for NCCL_P2P_LEVEL (known: LOC, NVL, PIX, PXB, PHB, SYS or 0-5), ignored"
                    );
                }
                level
            })
        };
        Settings { p2p_level, shm_disable: is_one(shm_disable) }
    }

    /// This process's settings (read once).
    pub fn from_env() -> Settings {
        static S: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
        *S.get_or_init(|| {
            let get = crate::param::get;
            let s = Settings::parse(
                get("NCCL_P2P_DISABLE").as_deref(),
                get("NCCL_P2P_LEVEL").as_deref(),
                get("NCCL_SHM_DISABLE").as_deref(),
            );
            if s != Settings::default() {
                crate::nccl_info!(crate::debug::Subsys::ENV, "transport settings: {s:?}");
            }
            s
        })
    }

    /// What a pair may use when one end has `self` and the other `other`.
    pub fn stricter(&self, other: &Settings) -> Settings {
        let p2p_level = match (self.p2p_level, other.p2p_level) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Settings { p2p_level, shm_disable: self.shm_disable || other.shm_disable }
    }

    pub fn encode(&self) -> [u8; Self::BYTES] {
        [self.p2p_level.map_or(Self::DEFAULT_LEVEL, |p| p as u8), self.shm_disable as u8]
    }

    pub fn decode(b: &[u8]) -> Result<Settings> {
        let bad = || Error::Internal(format!("transport settings record {b:?} is malformed"));
        let [level, shm] = *b else { return Err(bad()) };
        let p2p_level = match level {
            Self::DEFAULT_LEVEL => None,
            l => Some(Path::NAMES.get(l as usize).ok_or_else(bad)?.1),
        };
        Ok(Settings { p2p_level, shm_disable: shm == 1 })
    }
}

/// The kind that connects `me` and `peer`: NET across hosts; on one host P2P when the GPUs
/// reach each other (`link`: their path, `None` without peer access) within the level the
/// settings allow, else SHM unless disabled, else NET (as NCCL falls back to the network).
pub fn select(me: &PeerInfo, peer: &PeerInfo, settings: &Settings, link: Option<Path>) -> Kind {
    if me.host_hash != peer.host_hash {
        return Kind::Net;
    }
    let p2p_ok = match (link, settings.p2p_level) {
        (None, _) | (_, Some(Path::Loc)) => false,
        (Some(_), None) => true,
        (Some(path), Some(level)) => path <= level,
    };
    if p2p_ok {
        Kind::P2p
    } else if !settings.shm_disable {
        Kind::Shm
    } else {
        Kind::Net
    }
}

/// Every rank's kind for each of its peers (`[r][p]`), the same on every rank.
pub type Kinds = Vec<Vec<Kind>>;

/// Shares our kinds (`mine[p]`: what [`select`] gave for peer p) with every rank and checks that
/// both ends of each of our pairs chose the same.
pub fn exchange_kinds(bootstrap: &Bootstrap, mine: &[Kind]) -> Result<Kinds> {
    let bytes: Vec<u8> = mine.iter().map(|k| k.to_byte()).collect();
    let kinds: Kinds = bootstrap
        .allgather(&bytes)?
        .iter()
        .enumerate()
        .map(|(r, b)| {
            if b.len() != mine.len() {
                return Err(Error::Internal(format!(
                    "rank {r} published {} transport kinds, not {}",
                    b.len(),
                    mine.len()
                )));
            }
            b.iter().map(|&k| Kind::from_byte(k)).collect()
        })
        .collect::<Result<_>>()?;
    if let Some(why) = disagreement(bootstrap.rank(), mine, &kinds) {
        crate::bail_usage!("{why}");
    }
    Ok(kinds)
}

/// Whether any pair of the communicator uses NET: then every rank takes part in setting NET up,
/// with or without connections of its own, and the communicator runs at most
/// `net::conn::MAX_CHANNELS` channels.
pub fn net_pairs(kinds: &Kinds) -> bool {
    kinds.iter().enumerate().any(|(r, row)| row.iter().enumerate().any(|(p, k)| p != r && *k == Kind::Net))
}

/// Whether any connection of the communicator, between any two of its ranks, has its FIFOs in
/// host memory (SHM, NET): the kernels then publish a tail for LL128 (SHM) or every protocol
/// (NET), which the one-shot all-reduce of more than two ranks does not. Every rank must restrict its
/// choices alike (each plans its own kernels), hence the whole communicator, not our pairs only.
pub fn host_fifos(kinds: &Kinds) -> bool {
    kinds.iter().enumerate().any(|(r, row)| row.iter().enumerate().any(|(p, k)| p != r && *k != Kind::P2p))
}

/// Both ends must have chosen the same kind; the first pair that did not, in words.
fn disagreement(rank: usize, mine: &[Kind], theirs: &[Vec<Kind>]) -> Option<String> {
    let p = (0..mine.len()).find(|&p| p != rank && theirs[p][rank] != mine[p])?;
    Some(format!(
        "rank {rank} chose {} for its connections with rank {p}, which chose {}: both ends must see the same \
         NCCL_P2P_DISABLE / NCCL_P2P_LEVEL / NCCL_SHM_DISABLE and GPU visibility",
        mine[p].name(),
        theirs[p][rank].name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: u32, host: u64, pid: u32, bus: u8) -> PeerInfo {
        PeerInfo { rank, host_hash: host, pid, dev: bus as i32, bus_id: [bus; 16], host: [0; 32], machine: host }
    }

    #[test]
    fn selection_table() {
        let me = peer(0, 1, 100, 0);
        let same_gpu_other_proc = peer(1, 1, 200, 0);
        let other_host = peer(2, 2, 100, 0);
        let def = Settings::default();
        let no_p2p = Settings { p2p_level: Some(Path::Loc), shm_disable: false };
        let nothing = Settings { p2p_level: Some(Path::Loc), shm_disable: true };
        let nvl = Settings { p2p_level: Some(Path::Nvl), shm_disable: false };
        // (peer, settings, link) -> kind
        let table = [
            (same_gpu_other_proc, def, Some(Path::Loc), Kind::P2p),
            (same_gpu_other_proc, no_p2p, Some(Path::Loc), Kind::Shm),
            (same_gpu_other_proc, nothing, Some(Path::Loc), Kind::Net),
            (peer(1, 1, 100, 1), def, Some(Path::Sys), Kind::P2p),
            (peer(1, 1, 100, 1), def, None, Kind::Shm),
            (peer(1, 1, 100, 1), nvl, Some(Path::Nvl), Kind::P2p),
            (peer(1, 1, 100, 1), nvl, Some(Path::Sys), Kind::Shm),
            (peer(1, 1, 100, 1), Settings { p2p_level: Some(Path::Sys), ..def }, Some(Path::Sys), Kind::P2p),
            (peer(1, 1, 100, 1), Settings { p2p_level: Some(Path::Phb), ..def }, Some(Path::Sys), Kind::Shm),
            (peer(1, 1, 100, 1), Settings { shm_disable: true, ..def }, None, Kind::Net),
            (other_host, def, Some(Path::Loc), Kind::Net),
            (other_host, no_p2p, None, Kind::Net),
        ];
        for (i, (p, s, link, want)) in table.iter().enumerate() {
            assert_eq!(select(&me, p, s, *link), *want, "row {i}: {p:?} {s:?} {link:?}");
        }
    }

    #[test]
    fn p2p_level_parses_as_nccl() {
        let names = ["LOC", "nvl", "PIX", "PXB", "PHB", "SYS"];
        let paths = [Path::Loc, Path::Nvl, Path::Pix, Path::Pxb, Path::Phb, Path::Sys];
        for (n, p) in names.iter().zip(paths) {
            assert_eq!(Path::parse_level(n), Some(p));
        }
        let legacy = [Path::Loc, Path::Pix, Path::Pxb, Path::Phb, Path::Sys, Path::Sys, Path::Sys];
        for (n, p) in legacy.iter().enumerate() {
            assert_eq!(Path::parse_level(&n.to_string()), Some(*p), "{n}");
        }
        assert_eq!(Path::parse_level("NVLINK"), None);
        assert_eq!(Path::parse_level("-1"), None);
    }

    #[test]
    fn env_settings() {
        let s = Settings::parse(None, None, None);
        assert_eq!(s, Settings::default());
        // NCCL_P2P_DISABLE=1 wins over any level.
        assert_eq!(Settings::parse(Some("1"), Some("SYS"), None).p2p_level, Some(Path::Loc));
        assert_eq!(Settings::parse(Some("0"), Some("PIX"), None).p2p_level, Some(Path::Pix));
        assert_eq!(Settings::parse(None, Some("bogus"), None).p2p_level, None);
        assert!(Settings::parse(None, None, Some("1")).shm_disable);
        assert!(!Settings::parse(None, None, Some("0")).shm_disable);
        assert!(!Settings::parse(None, None, Some("yes")).shm_disable);
    }

    #[test]
    fn settings_combine_and_travel() {
        let a = Settings { p2p_level: Some(Path::Phb), shm_disable: false };
        let b = Settings { p2p_level: Some(Path::Nvl), shm_disable: true };
        let d = Settings::default();
        assert_eq!(a.stricter(&b), Settings { p2p_level: Some(Path::Nvl), shm_disable: true });
        assert_eq!(a.stricter(&d), a);
        assert_eq!(d.stricter(&b), b);
        for s in [a, b, d, Settings { p2p_level: Some(Path::Loc), shm_disable: false }] {
            assert_eq!(Settings::decode(&s.encode()).unwrap(), s);
        }
        assert!(Settings::decode(&[9, 0]).is_err());
        assert!(Settings::decode(&[0]).is_err());
    }

    #[test]
    fn kinds_travel_as_bytes() {
        assert!(Kind::from_byte(9).is_err());
        for k in [Kind::P2p, Kind::Shm, Kind::Net] {
            assert_eq!(Kind::from_byte(k.to_byte()).unwrap(), k);
        }
    }

    #[test]
    fn net_takes_every_rank_when_any_pair_uses_it() {
        use Kind::*;
        assert!(!net_pairs(&vec![vec![P2p, Shm], vec![Shm, P2p]]));
        // Rank 2's row is all SHM, yet it must take part: rank 0 and 1 use NET.
        assert!(net_pairs(&vec![vec![P2p, Net, Shm], vec![Net, P2p, Shm], vec![Shm, Shm, P2p]]));
        // A rank's own entry never counts (self is no connection).
        assert!(!net_pairs(&vec![vec![Net, P2p], vec![P2p, Net]]));
    }

    #[test]
    fn host_memory_anywhere_limits_every_rank() {
        use Kind::*;
        assert!(!host_fifos(&vec![vec![Shm, P2p], vec![P2p, Net]]));
        // Rank 2 reaches both peers over P2P, but 0 and 1 use SHM: all three must plan alike.
        assert!(host_fifos(&vec![vec![P2p, Shm, P2p], vec![Shm, P2p, P2p], vec![P2p, P2p, P2p]]));
    }

    #[test]
    fn both_ends_must_agree() {
        use Kind::*;
        let views = vec![vec![P2p, Shm, P2p], vec![Shm, P2p, Shm], vec![P2p, Shm, P2p]];
        for r in 0..3 {
            assert_eq!(disagreement(r, &views[r], &views), None);
        }
        let mut bad = views.clone();
        bad[2][1] = P2p;
        let why = disagreement(1, &bad[1], &bad).unwrap();
        assert!(why.contains("rank 1 chose SHM for its connections with rank 2, which chose P2P"), "{why}");
    }
}
