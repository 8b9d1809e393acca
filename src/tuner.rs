//! The tuner: for each collective, the algorithm and protocol with the lowest modelled time.
//!
//! The model is NCCL's in shape: a collective of S bytes takes `hops × hop_us(proto) +
//! wire(S) / bw(proto)`, where `hops` is the number of dependent FIFO steps on the critical path
//! and `wire` the bytes each rank pushes over its link. The constants per protocol were measured
//! on 2× H200 (NV18) with each protocol forced (see COST).
//!
//! `NCCL_ALGO` and `NCCL_PROTO` restrict the choice with NCCL's syntax (a comma list of names,
//! case-insensitive; a leading `^` excludes the listed ones instead). ferronickel's algorithms are
//! Ring and, for all-reduce, a one-shot push to every peer that NCCL has no name for: it is used
//! only when `NCCL_ALGO` is unset or an exclusion list, so `NCCL_ALGO=Ring` means ring only. Point
//! to point always runs Simple.
//!
//! Pure data movement may instead run on the copy engines (`plan::copies`), which this model also
//! prices; like the one-shot, only while neither setting is an inclusion list, so that forcing a
//! protocol or algorithm always runs the kernels that use it.

use crate::abi::{FN_ALGO_ONESHOT, FN_ALGO_RING, FN_LL_SLOT_LINES, FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE};
use crate::error::{Error, Result};
use crate::task::{CollKind, CommShape};
use std::sync::OnceLock;

pub const ALGOS: [&str; 7] = ["Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"];
/// Indexed by fnProto.
pub const PROTOS: [&str; 3] = ["LL", "LL128", "Simple"];

/// The measured cost of one protocol: latency of one dependent FIFO step (a hop to the next rank
/// and its flag), and the link bandwidth it sustains with every channel busy.
#[derive(Debug, Clone, Copy)]
struct ProtoCost {
    hop_us: f64,
    gbps: f64,
}

/// Indexed by fnProto. Fitted to the crossovers of `scripts/proto_sweep.sh` on 2× H200, graph
/// mode, 2026-11-22 (docs/NOTES.md): the hop is the rise from one dependent step to two at 8 B
/// (one-shot against ring all-reduce), the bandwidth is the slope where a protocol competes
/// (LL128 sustains about 295 GB/s at 64 MB but about 220 GB/s from 1 to 8 MB, where it is chosen).
const COST: [ProtoCost; 3] = [
    ProtoCost { hop_us: 0.55, gbps: 160.0 }, // LL: 8 data bytes per 16-byte line, a poll per line
    ProtoCost { hop_us: 0.75, gbps: 220.0 }, // LL128: 120 of 128 bytes, a warp-wide poll per line
    ProtoCost { hop_us: 3.0, gbps: 330.0 },  // Simple: data, a system fence, then the step flag
];

/// The one-shot all-reduce between two ranks sends what the ring sends, but each byte passes
/// through a CTA twice (send, then receive-and-reduce) against the ring's 1.5 times: from 16 MB
/// it ran 2–6 % slower than the ring (sweep of 2026-11-22), as if at this fraction of the bandwidth.
const ONESHOT_PAIR_BW: f64 = 0.93;

/// Copy engines: the link rate of cuMemcpyAsync between the two H200s, 388 GB/s per direction with
/// both directions busy (docs/ARCHITECTURE.md, "Measured constants"; against about 362 for SM stores), and the cost of the event
/// handshake and copy launches around a group of copies. Two ranks on one H100, no graph
/// (`proto_sweep.sh --no-graph`, 2026-11-23): 8-byte copies took 4 µs (send/recv), 9 µs (broadcast)
/// and 20 µs (all-gather: two copies per rank) longer than the kernels.
const CE_GBPS: f64 = 388.0;
const CE_SYNC_US: f64 = 20.0;

/// Bytes of data one LL FIFO slot carries: a one-shot channel's part must fit in one.
pub const LL_SLOT_BYTES: usize = FN_LL_SLOT_LINES as usize * 8;

/// What the user allows (NCCL_PROTO / NCCL_ALGO), read once per process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// By fnProto.
    pub protos: [bool; 3],
    pub oneshot: bool,
    /// Whether the tuner may move data with the copy engines instead of kernels.
    pub copy_engine: bool,
}

impl Allowed {
    pub const ALL: Allowed = Allowed { protos: [true; 3], oneshot: true, copy_engine: true };

    /// What a communicator of `nranks` may run over its connections. Host-memory FIFOs (SHM,
    /// NET) rule out the one-shot all-reduce of more than two ranks, which writes LL lines to
    /// every peer without publishing a tail (docs/ARCHITECTURE.md, "Transports"); between two
    /// ranks it runs over the ring primitives, which do. Copy engines need every pair on P2P.
    pub fn for_connections(nranks: usize, host_fifos: bool, copy_engines: bool) -> Allowed {
        Allowed { protos: [true; 3], oneshot: !host_fifos || nranks <= 2, copy_engine: copy_engines }
    }

    /// What both allow.
    pub fn intersect(&self, other: &Allowed) -> Allowed {
        Allowed {
            protos: [0, 1, 2].map(|p| self.protos[p] && other.protos[p]),
            oneshot: self.oneshot && other.oneshot,
            copy_engine: self.copy_engine && other.copy_engine,
        }
    }
}

/// What a collective runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub algo: u32,
    pub proto: u32,
    pub nchannels: usize,
}

/// Dependent steps on the critical path and bytes each rank sends, for a ring collective of
/// `bytes` (nccl-tests' size: the whole buffer for all-reduce / broadcast / reduce, the gathered
/// or scattered total for all-gather / reduce-scatter).
fn ring_shape(kind: CollKind, n: f64, bytes: f64) -> (f64, f64) {
    match kind {
        CollKind::AllReduce => (2.0 * (n - 1.0), 2.0 * (n - 1.0) / n * bytes),
        CollKind::AllGather | CollKind::ReduceScatter => (n - 1.0, (n - 1.0) / n * bytes),
        CollKind::Broadcast | CollKind::Reduce => (n - 1.0, bytes),
    }
}

fn model_us(proto: u32, hops: f64, wire: f64, bw_scale: f64) -> f64 {
    let c = COST[proto as usize];
    hops * c.hop_us + wire / (c.gbps * bw_scale * 1e3)
}

/// Bytes of the largest per-channel part when `count` elements of `elem` bytes are spread over
/// `nch` channels (the kernels' channelPart rule: parts rounded up to 16 bytes).
fn part_bytes(count: usize, elem: usize, nch: usize) -> usize {
    let align = (16 / elem).max(1);
    count.div_ceil(nch).div_ceil(align) * align * elem
}

/// The fastest allowed (algorithm, protocol) for a collective of `count` elements of `elem` bytes.
pub fn choose(kind: CollKind, count: usize, elem: usize, shape: &CommShape, allowed: &Allowed) -> Choice {
    choose_timed(kind, count, elem, shape, allowed).1
}

/// The modelled time of the kernel [`choose`] picks, in microseconds.
pub fn coll_us(kind: CollKind, count: usize, elem: usize, shape: &CommShape, allowed: &Allowed) -> f64 {
    choose_timed(kind, count, elem, shape, allowed).0
}

/// Point to point in a kernel: one Simple hop and the bytes over the link.
pub fn p2p_us(bytes: usize) -> f64 {
    model_us(FN_PROTO_SIMPLE, 1.0, bytes as f64, 1.0)
}

/// A group of copy-engine copies in which the busiest rank pushes `bytes` to its peers.
pub fn copy_engine_us(bytes: usize) -> f64 {
    CE_SYNC_US + bytes as f64 / (CE_GBPS * 1e3)
}

fn choose_timed(kind: CollKind, count: usize, elem: usize, shape: &CommShape, allowed: &Allowed) -> (f64, Choice) {
    let n = shape.nranks;
    let ring = |proto| Choice { algo: FN_ALGO_RING, proto, nchannels: shape.nchannels };
    if n == 1 {
        return (model_us(FN_PROTO_SIMPLE, 0.0, 0.0, 1.0), ring(FN_PROTO_SIMPLE));
    }
    let bytes = match kind {
        CollKind::AllGather | CollKind::ReduceScatter => count * elem * n,
        _ => count * elem,
    } as f64;
    let (hops, wire) = ring_shape(kind, n as f64, bytes);
    let mut best: Option<(f64, Choice)> = None;
    let mut consider = |t: f64, c: Choice| {
        if best.is_none_or(|(bt, _)| t < bt) {
            best = Some((t, c));
        }
    };
    for proto in [FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE] {
        if allowed.protos[proto as usize] {
            consider(model_us(proto, hops, wire, 1.0), ring(proto));
        }
    }
    // One-shot all-reduce: one hop. Between two ranks it runs over any protocol and sends what the
    // ring sends; with more ranks each rank sends its whole input to every peer, over LL, one slot
    // per channel.
    let nch = shape.all_pairs_channels.min(shape.nchannels);
    if kind == CollKind::AllReduce && allowed.oneshot && nch > 0 {
        for proto in [FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE] {
            let fits = n == 2 || (proto == FN_PROTO_LL && part_bytes(count, elem, nch) <= LL_SLOT_BYTES);
            if allowed.protos[proto as usize] && fits {
                let scale = if n == 2 { ONESHOT_PAIR_BW } else { 1.0 };
                let t = model_us(proto, 1.0, (n - 1) as f64 * bytes, scale);
                consider(t, Choice { algo: FN_ALGO_ONESHOT, proto, nchannels: nch });
            }
        }
    }
    // Restrictions always leave a ring protocol (see restrictions()).
    best.unwrap_or((model_us(FN_PROTO_SIMPLE, hops, wire, 1.0), ring(FN_PROTO_SIMPLE)))
}

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

/// What NCCL_ALGO / NCCL_PROTO settings allow; an error when they leave nothing we implement.
pub fn parse_restrictions(algo: Option<&str>, proto: Option<&str>) -> Result<Allowed> {
    let refuse = |var: &str, setting: &str, ok: &[&str], have: &str| {
        Error::InvalidUsage(format!(
            "{var}={setting} allows only {} but ferronickel implements only {have}; unset {var} or include one of those",
            if ok.is_empty() { "nothing".to_string() } else { ok.join(", ") },
        ))
    };
    let mut out = Allowed::ALL;
    let excludes_only = |s: Option<&str>| s.is_none_or(|s| s.trim().starts_with('^'));
    out.copy_engine = excludes_only(algo) && excludes_only(proto);
    if let Some(setting) = algo {
        let ok = allowed(setting, &ALGOS, "NCCL_ALGO")?;
        if !ok.contains(&"Ring") {
            return Err(refuse("NCCL_ALGO", setting, &ok, "Ring (and a one-shot all-reduce)"));
        }
        out.oneshot = setting.trim().starts_with('^');
    }
    if let Some(setting) = proto {
        let ok = allowed(setting, &PROTOS, "NCCL_PROTO")?;
        if ok.is_empty() {
            return Err(refuse("NCCL_PROTO", setting, &ok, "LL, LL128 and Simple"));
        }
        out.protos = PROTOS.map(|p| ok.contains(&p));
    }
    Ok(out)
}

crate::str_param!(
    /// NCCL_ALGO: which algorithms collectives may use.
    algo_setting, "NCCL_ALGO"
);
crate::str_param!(
    /// NCCL_PROTO: which protocols collectives may use.
    proto_setting, "NCCL_PROTO"
);

/// This process's restrictions (parsed once): collectives fail with this error if they are invalid.
pub fn restrictions() -> Result<&'static Allowed> {
    static PARSED: OnceLock<Result<Allowed>> = OnceLock::new();
    PARSED.get_or_init(|| parse_restrictions(algo_setting(), proto_setting())).as_ref().map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: CommShape = CommShape { rank: 0, nranks: 2, nchannels: 64, all_pairs_channels: 64 };

    #[test]
    fn nccl_syntax() {
        assert_eq!(allowed("LL,simple", &PROTOS, "NCCL_PROTO").unwrap(), ["LL", "Simple"]);
        assert_eq!(allowed("^LL", &PROTOS, "NCCL_PROTO").unwrap(), ["LL128", "Simple"]);
        assert_eq!(allowed(" ring ", &ALGOS, "NCCL_ALGO").unwrap(), ["Ring"]);
        assert!(allowed("Ring,Bogus", &ALGOS, "NCCL_ALGO").unwrap_err().to_string().contains("\"Bogus\""));
    }

    #[test]
    fn restrictions_follow_the_settings() {
        assert_eq!(parse_restrictions(None, None).unwrap(), Allowed::ALL);
        let a = parse_restrictions(Some("Ring"), Some("LL128")).unwrap();
        assert_eq!(a, Allowed { protos: [false, true, false], oneshot: false, copy_engine: false });
        let a = parse_restrictions(Some("^Tree"), Some("^LL")).unwrap();
        assert_eq!(a, Allowed { protos: [false, true, true], oneshot: true, copy_engine: true });
        assert!(!parse_restrictions(None, Some("Simple")).unwrap().copy_engine);
        let e = parse_restrictions(Some("^Ring"), None).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)));
        assert!(e.to_string().contains("NCCL_ALGO=^Ring allows only Tree, CollnetDirect"), "{e}");
        let e = parse_restrictions(None, Some("^LL,LL128,Simple")).unwrap_err();
        assert!(e.to_string().contains("allows only nothing"), "{e}");
        assert!(parse_restrictions(None, Some("LL256")).is_err());
    }

    #[test]
    fn forced_protocols_are_obeyed() {
        for proto in [FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE] {
            for oneshot in [false, true] {
                let mut only = Allowed { protos: [false; 3], oneshot, copy_engine: false };
                only.protos[proto as usize] = true;
                for kind in [CollKind::AllReduce, CollKind::AllGather, CollKind::Broadcast] {
                    for count in [1, 1000, 1 << 20, 1 << 28] {
                        let c = choose(kind, count, 4, &TWO, &only);
                        assert_eq!((c.proto, c.nchannels), (proto, 64));
                        assert!(c.algo == FN_ALGO_RING || oneshot && kind == CollKind::AllReduce);
                    }
                }
            }
        }
    }

    #[test]
    fn protocol_follows_size() {
        let pick = |count| {
            let c = choose(CollKind::AllReduce, count, 4, &TWO, &Allowed::ALL);
            (c.algo, c.proto)
        };
        // Measured best on 2x H200: one-shot LL to 64 KB, one-shot LL128 to 1 MB, one-shot Simple
        // to 8 MB, the Simple ring from 16 MB.
        assert_eq!(pick(2), (FN_ALGO_ONESHOT, FN_PROTO_LL));
        assert_eq!(pick(16 << 10), (FN_ALGO_ONESHOT, FN_PROTO_LL));
        assert_eq!(pick(128 << 10), (FN_ALGO_ONESHOT, FN_PROTO_LL128));
        assert_eq!(pick(1 << 20), (FN_ALGO_ONESHOT, FN_PROTO_SIMPLE));
        assert_eq!(pick(4 << 20), (FN_ALGO_RING, FN_PROTO_SIMPLE));
        assert_eq!(pick(1 << 28), (FN_ALGO_RING, FN_PROTO_SIMPLE));
        let ag = |count| choose(CollKind::AllGather, count, 4, &TWO, &Allowed::ALL).proto;
        assert_eq!((ag(2), ag(1 << 28)), (FN_PROTO_LL, FN_PROTO_SIMPLE));
        // With more ranks, a part bigger than one LL slot cannot go one-shot.
        let four = CommShape { rank: 0, nranks: 4, nchannels: 16, all_pairs_channels: 16 };
        assert_eq!(choose(CollKind::AllReduce, 2, 4, &four, &Allowed::ALL).algo, FN_ALGO_ONESHOT);
        let ring_only = choose(CollKind::AllReduce, 16 * LL_SLOT_BYTES / 4 + 64, 4, &four, &Allowed::ALL);
        assert_eq!(ring_only.algo, FN_ALGO_RING);
        // Without channels joining every pair, no one-shot either.
        let sparse = CommShape { rank: 0, nranks: 4, nchannels: 16, all_pairs_channels: 0 };
        assert_eq!(choose(CollKind::AllReduce, 2, 4, &sparse, &Allowed::ALL).algo, FN_ALGO_RING);
        // One rank: the local copy.
        let one = CommShape { rank: 0, nranks: 1, nchannels: 64, all_pairs_channels: 0 };
        assert_eq!(choose(CollKind::AllReduce, 2, 4, &one, &Allowed::ALL).proto, FN_PROTO_SIMPLE);
    }

    #[test]
    fn host_memory_fifos_limit_the_choice() {
        let four = CommShape { rank: 0, nranks: 4, nchannels: 16, all_pairs_channels: 16 };
        let shm4 = Allowed::for_connections(4, true, false);
        assert_eq!(shm4, Allowed { protos: [true; 3], oneshot: false, copy_engine: false });
        assert_eq!(Allowed::for_connections(4, false, true), Allowed::ALL);
        // Two ranks keep the one-shot (it runs over the ring primitives, which publish tails).
        let shm2 = Allowed::for_connections(2, true, false);
        assert!(shm2.oneshot && !shm2.copy_engine);
        assert_eq!(choose(CollKind::AllReduce, 2, 4, &TWO, &shm2).algo, FN_ALGO_ONESHOT);
        // With more ranks: the ring, at every size, whatever NCCL_PROTO allows.
        for proto in [None, Some("LL"), Some("^Simple")] {
            let user = parse_restrictions(None, proto).unwrap();
            let both = user.intersect(&shm4);
            assert_eq!(both.protos, user.protos);
            assert!(!both.oneshot && !both.copy_engine);
            for count in [1, 64, 4096, 1 << 20, 1 << 28] {
                let c = choose(CollKind::AllReduce, count, 4, &four, &both);
                assert_eq!(c.algo, FN_ALGO_RING, "count={count} proto={proto:?}");
                assert!(both.protos[c.proto as usize]);
            }
        }
        // The intersection keeps only what both allow.
        let user = parse_restrictions(Some("Ring"), Some("LL128")).unwrap();
        assert_eq!(user.intersect(&Allowed::ALL), user);
        assert_eq!(Allowed::ALL.intersect(&shm4), shm4);
    }

    #[test]
    fn part_bytes_matches_the_kernels_partition() {
        assert_eq!(part_bytes(1, 4, 64), 16);
        assert_eq!(part_bytes(4096 * 64, 4, 64), 16384);
        assert_eq!(part_bytes(4096 * 64 + 1, 4, 64), 16400);
        assert_eq!(part_bytes(7, 8, 2), 32);
    }
}
