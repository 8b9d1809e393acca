//! The tuner: for each collective, the algorithm and protocol with the lowest modelled time.
//!
//! The model is NCCL's in shape: a collective of S bytes takes `hops × hop_us(proto) +
//! wire(S) / bw(proto)`, where `hops` is the number of dependent FIFO steps on the critical path
//! and `wire` the bytes each rank pushes over its link. The constants per protocol were measured
//! on 2× H200 (NV18) with each protocol forced (see COST). A communicator with a pair on SHM or
//! NET is priced by its slowest link (see SHM_COST and NET_COST), where channels may cost
//! latency, so the tuner also picks how many to use.
//!
//! `NCCL_ALGO` and `NCCL_PROTO` restrict the choice with NCCL's syntax (a comma list of names,
//! case-insensitive; a leading `^` excludes the listed ones instead). `NCCL_ALGO` also takes
//! NCCL's per-collective form, `allreduce:tree;allgather:ring` (entries separated by `;`, each
//! `Function:list` or a bare list for every collective). ferronickel's algorithms are Ring, Tree
//! (all-reduce only) and some NCCL has no name for: for all-reduce a one-shot push to every peer,
//! across hosts a direct broadcast and reduce ([`direct`]) and a recursive-doubling all-reduce,
//! all-gather and reduce-scatter ([`recursive_doubling`]). Those are used only when the collective's `NCCL_ALGO`
//! entry is unset or an exclusion list, so `NCCL_ALGO=Ring` means ring only. A collective that the setting leaves no algorithm for fails
//! with ncclInvalidUsage, as in NCCL (`NCCL_ALGO=Tree` and an all-gather). Point to point always
//! runs Simple.
//!
//! An external tuner plugin (`NCCL_TUNER_PLUGIN`, docs/PLUGINS.md) is consulted in one place,
//! [`choose`]: it sees our modelled cost of every allowed Ring and Tree (algorithm, protocol) in
//! NCCL's cost table, may change them and ask for a channel count.
//!
//! Pure data movement may instead run on the copy engines (`plan::copies`), which this model also
//! prices; like the one-shot, only while neither setting is an inclusion list, so that forcing a
//! protocol or algorithm always runs the kernels that use it.

use crate::abi::{
    FN_ALGO_DIRECT, FN_ALGO_ONESHOT, FN_ALGO_RECDBL, FN_ALGO_RING, FN_ALGO_SYMMETRIC, FN_ALGO_TREE, FN_LL_SLOT_LINES,
    FN_MAX_CHANNELS, FN_NET_ONE_MESSAGE_SIMPLE, FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE, FN_RECDBL_SCRATCH,
};
use crate::error::{Error, Result};
use crate::plugin::abi::{
    ncclFuncAllGather, ncclFuncAllReduce, ncclFuncBroadcast, ncclFuncReduce, ncclFuncReduceScatter, ncclFunc_t,
    ncclTunerConstants_v5_t, NCCL_ALGO_RING, NCCL_ALGO_TREE, NCCL_HW_NET, NCCL_HW_NVLINK, NCCL_HW_PCI,
};
use crate::plugin::tuner::{CostTable, Session as TunerSession, IGNORE};
use crate::task::{CollKind, CommShape, Link, NetLink};
use std::sync::OnceLock;

pub const ALGOS: [&str; 7] = ["Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"];
/// Indexed by fnProto.
pub const PROTOS: [&str; 3] = ["LL", "LL128", "Simple"];
/// The collectives, in the order of `Allowed::ring`; NCCL's names are their `Debug` names.
const KINDS: [CollKind; 5] =
    [CollKind::AllReduce, CollKind::Reduce, CollKind::Broadcast, CollKind::AllGather, CollKind::ReduceScatter];

/// How logs and `ferronickel plan` name an fnAlgo.
pub fn algo_name(algo: u32) -> &'static str {
    match algo {
        FN_ALGO_RING => "Ring",
        FN_ALGO_TREE => "Tree",
        FN_ALGO_ONESHOT => "OneShot",
        FN_ALGO_SYMMETRIC => "Symmetric",
        FN_ALGO_DIRECT => "Direct",
        FN_ALGO_RECDBL => "RecDoubling",
        _ => "?",
    }
}

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
/// A copy within one GPU (a broadcast root's own copy, a rank's own all-gather chunk) runs on the
/// same stream after its pushes. On 2× H200 (`proto_sweep.sh --no-graph`, 2026-11-26) a broadcast
/// by copies took 124 µs (256 MB) and 244 µs (512 MB) longer than a send/recv's single push of the
/// same size: about 2200 GB/s. Left out, the model ran broadcast and all-gather from 64 MB on the
/// copy engines, 8 % slower than the kernels.
const CE_LOCAL_GBPS: f64 = 2200.0;

/// The tree all-reduce (kernels/collectives.cuh) reduces every chunk up the tree, then broadcasts
/// it down; NCCL models its bandwidth at 92 % of the ring's link rate. Not measured here: no two
/// hosts to run it between yet.
const TREE_BW: f64 = 0.92;

/// Bytes of data one LL FIFO slot carries: a one-shot channel's part must fit in one.
pub const LL_SLOT_BYTES: usize = FN_LL_SLOT_LINES as usize * 8;

/// What the user allows (NCCL_PROTO / NCCL_ALGO), read once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    /// By fnProto.
    pub protos: [bool; 3],
    /// By collective (the order of `KINDS`): whether the ring may run it.
    pub ring: [bool; 5],
    /// Whether the tree may run all-reduce (the one collective it implements).
    pub tree: bool,
    pub oneshot: bool,
    /// By collective (the order of `KINDS`): whether it may run one of the algorithms NCCL has no
    /// name for, direct ([`direct`]) and recursive doubling ([`recursive_doubling`]).
    pub direct: [bool; 5],
    /// Whether the tuner may move data with the copy engines instead of kernels.
    pub copy_engine: bool,
    /// When collectives on symmetric buffers run the symmetric kernels.
    pub symmetric: Symmetric,
    /// NCCL_ALGO as set, for the message of a collective it leaves no algorithm (a `&'static`
    /// so that the per-launch intersection copies no string).
    pub algo_env: Option<&'static str>,
}

impl Allowed {
    pub const ALL: Allowed = Allowed {
        protos: [true; 3],
        ring: [true; 5],
        tree: true,
        oneshot: true,
        direct: [true; 5],
        copy_engine: true,
        symmetric: Symmetric::Tuned,
        algo_env: None,
    };

    fn ring_for(&self, kind: CollKind) -> bool {
        self.ring[KINDS.iter().position(|&k| k == kind).expect("every kind is listed")]
    }

    fn direct_for(&self, kind: CollKind) -> bool {
        self.direct[KINDS.iter().position(|&k| k == kind).expect("every kind is listed")]
    }

    /// Whether a collective of `kind` on `nranks` ranks has an algorithm left: NCCL refuses one
    /// that NCCL_ALGO leaves none (ncclInvalidUsage), and so do we, before queueing it. One rank
    /// runs no algorithm (a local copy).
    pub fn check(&self, kind: CollKind, nranks: usize) -> Result<()> {
        if nranks <= 1 || self.ring_for(kind) || (kind == CollKind::AllReduce && self.tree) {
            return Ok(());
        }
        let have = if kind == CollKind::AllReduce { "Ring and Tree" } else { "Ring only" };
        Err(Error::InvalidUsage(format!(
            "no algorithm available for {kind:?}: NCCL_ALGO={} leaves it none of the algorithms ferronickel runs it with \
             ({have}); NCCL fails here too. Restrict one collective with NCCL_ALGO=\"allreduce:tree\"",
            self.algo_env.unwrap_or("")
        )))
    }

    /// What a communicator of `nranks` may run over its connections. Host-memory FIFOs (SHM,
    /// NET) rule out the one-shot all-reduce of more than two ranks, which writes LL lines to
    /// every peer without publishing a tail (docs/ARCHITECTURE.md, "Transports"); between two
    /// ranks it runs over the ring primitives, which do. Copy engines need every pair on P2P.
    pub fn for_connections(nranks: usize, host_fifos: bool, copy_engines: bool) -> Allowed {
        Allowed { oneshot: !host_fifos || nranks <= 2, copy_engine: copy_engines, ..Allowed::ALL }
    }

    /// What both allow.
    pub fn intersect(&self, other: &Allowed) -> Allowed {
        Allowed {
            protos: [0, 1, 2].map(|p| self.protos[p] && other.protos[p]),
            ring: [0, 1, 2, 3, 4].map(|k| self.ring[k] && other.ring[k]),
            tree: self.tree && other.tree,
            oneshot: self.oneshot && other.oneshot,
            direct: [0, 1, 2, 3, 4].map(|k| self.direct[k] && other.direct[k]),
            copy_engine: self.copy_engine && other.copy_engine,
            symmetric: self.symmetric.min(other.symmetric),
            algo_env: self.algo_env.or(other.algo_env),
        }
    }
}

/// When a collective whose buffers lie in symmetric windows runs the symmetric kernels
/// (`FERRONICKEL_SYMMETRIC`). Ordered so that the stricter of two settings is the smaller:
/// `Never` wins over everything, `Always` over the tuner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Symmetric {
    Never,
    Always,
    /// As the tuner decides, while neither NCCL_ALGO nor NCCL_PROTO is an inclusion list: today
    /// never (see [`symmetric`]).
    Tuned,
}

crate::int_param!(
    /// FERRONICKEL_SYMMETRIC: 0 = never run the symmetric kernels, 1 = whenever a collective's
    /// buffers allow it, unset = as the tuner decides (today never: see `symmetric`).
    symmetric_setting, "FERRONICKEL_SYMMETRIC", -1
);

impl Symmetric {
    pub fn from_setting(v: i64) -> Symmetric {
        match v {
            0 => Symmetric::Never,
            1 => Symmetric::Always,
            _ => Symmetric::Tuned,
        }
    }
}

/// Bytes per channel (CTA) of a symmetric kernel, and the most channels it uses: its barriers
/// cost every CTA a round trip, so small collectives take few.
const SYMMETRIC_CHANNEL_BYTES: usize = 64 << 10;
const SYMMETRIC_MAX_CHANNELS: usize = 16;

/// The channels of the symmetric kernel for a collective whose buffers allow it, or `None` when
/// the ordinary kernels run it: all-reduce, all-gather and reduce-scatter of more than one rank,
/// when `allowed.symmetric` is `Always`. The tuner itself never picks them: on two H100s over
/// NVLink our ordinary all-reduce beat them at every size from 8 B to 16 MB (6.5-7 us against
/// 10 us small, 9.3 against 14.5 us at 512 KB), and on one GPU they won only between 1 and 8 MiB,
/// by 2-18% (BENCHMARKS.md, "Symmetric windows"). So a job that registers its buffers in
/// symmetric windows, as NCCL's users do to reach NCCL's symmetric kernels, keeps our faster ones.
pub fn symmetric(kind: CollKind, count: usize, elem: usize, shape: &CommShape, allowed: &Allowed) -> Option<usize> {
    let n = shape.nranks;
    if n < 2 || !matches!(kind, CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter) {
        return None;
    }
    let bytes = coll_bytes(kind, count, elem, n);
    if allowed.symmetric != Symmetric::Always {
        return None;
    }
    let max = SYMMETRIC_MAX_CHANNELS.min(shape.nchannels).clamp(1, FN_MAX_CHANNELS as usize);
    Some(bytes.div_ceil(SYMMETRIC_CHANNEL_BYTES).clamp(1, max))
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

/// Dependent steps and bytes through the busiest rank for a tree all-reduce of `bytes`: the reduce
/// goes up `depth` hops and the broadcast comes down as many (chunks pipeline behind the first);
/// per phase the busiest rank passes every byte once per child.
fn tree_shape(shape: &CommShape, bytes: f64) -> (f64, f64) {
    let t = shape.tree;
    (2.0 * t.depth as f64, 2.0 * t.max_children.max(1) as f64 * bytes)
}

/// Channels the tree may use: on one host every tree edge is a chain link between ring neighbours,
/// connected on every ring channel (`topo::tree::Trees::new`); between hosts the trees join chain
/// heads, which only the channels connecting every pair of ranks are sure to connect.
fn tree_channels(shape: &CommShape) -> usize {
    if shape.tree.nhosts <= 1 {
        shape.nchannels
    } else {
        shape.all_pairs_channels.min(shape.nchannels)
    }
}

fn model_us(proto: u32, hops: f64, wire: f64, bw_scale: f64) -> f64 {
    let c = COST[proto as usize];
    hops * c.hop_us + wire / (c.gbps * bw_scale * 1e3)
}

/// What a hop costs over a link whose FIFOs sit in host memory, by fnProto: a hop on one channel,
/// what each further channel adds to it, the bandwidth of one channel and the most that every
/// channel together reaches. Over host memory LL has the cheapest hop (no tail, no fence: its
/// receiver polls the data) and carries the fewest bytes (docs/ARCHITECTURE.md, "Transports").
#[derive(Debug, Clone, Copy, PartialEq)]
struct HostLinkCost {
    hop_us: [f64; 3],
    channel_us: [f64; 3],
    channel_gbps: [f64; 3],
    gbps: [f64; 3],
}

impl HostLinkCost {
    fn us(&self, proto: u32, hops: f64, wire: f64, bw_scale: f64, nch: usize) -> f64 {
        let p = proto as usize;
        let hop = self.hop_us[p] + (nch.max(1) - 1) as f64 * self.channel_us[p];
        let gbps = (nch as f64 * self.channel_gbps[p]).min(self.gbps[p]) * bw_scale;
        hops * hop + wire / (gbps * 1e3)
    }

    /// What `step` bytes take on one channel alone.
    fn step_us(&self, proto: u32, step: f64) -> f64 {
        step / (self.channel_gbps[proto as usize] * 1e3)
    }
}

/// SHM: the sender's GPU writes the slot to host memory and the receiver's GPU reads it back over
/// PCIe. Measured on 2× H200 with `NCCL_P2P_DISABLE=1` (BENCHMARKS.md, "SHM transport"), each
/// protocol forced on 1, 2, 4 and 8 channels, all-reduce of two ranks:
/// - Simple took 10.5–12 µs at 8 B on any number of channels (P2P's Simple hop, 3 µs, plus the
///   launch; each channel is charged 0.1 µs, within the noise, so that the fewest channels that
///   carry the bytes as fast win). It carried 12.6–14.4 GB/s on one channel, 28.7 on four, 30.3
///   on eight and 34 on all of them (256 MB): modelled as 10 per channel up to 34, so that four
///   channels carry large messages.
/// - LL128, which also waits for a tail (FN_CONN_TAIL_LL128), took 24–25 µs on one channel, each
///   further channel adding about 7.5 µs to a hop; one channel carried 1.85–2.8 GB/s, eight 5.6.
/// - LL, since its sender polls head with one thread and keeps the head it read across launches
///   (kernels/README.md; 2 processes on one H200, `net_bench.sh --shm --also NCCL_PROTO=LL`,
///   docs/results/net-shm-2026-11-26-h200-ll.txt): 13–14 µs a call up to 8 KB where Simple took
///   15–17, so its hop is priced 2.4 µs under Simple's; from 16 to 64 KB (all-gather 17.6 µs at
///   64 KB against Simple's 18.2, all-reduce 25.6 against 20.4) it carries about 5 GB/s, 4 on one
///   channel, each further channel adding about 0.5 µs to a hop. Before (every thread polling
///   head): 22 µs at 8 B.
///
/// So LL wins up to about 16 KB of wire a hop, Simple above.
const SHM_COST: HostLinkCost = HostLinkCost {
    hop_us: [0.6, 9.7, 3.0],
    channel_us: [0.5, 7.5, 0.1],
    channel_gbps: [4.0, 1.85, 10.0],
    gbps: [5.0, 5.6, 34.0],
};

/// NET (docs/ARCHITECTURE.md, "Transports") moves every step of every protocol through the
/// sender's and the receiver's proxy threads. Measured on one H100 with two processes as two
/// hosts, CUDA MPS on (BENCHMARKS.md, "NET transport", commit 6fe470c): an 8-byte all-reduce (one
/// hop) took 44 µs on one channel, about 8 of them the launch; each further channel added about
/// 15 µs to a hop (8 KB: 50 µs on one channel, 159 on eight), as the one proxy thread serves the
/// channels in turn; one channel carried 2 MB of Simple in 905 µs (2.3 GB/s of wire) and eight
/// channels 8.2 GB/s. LL128 carried 1 MB in 1970 µs on one channel against Simple's 2 MB in 905 µs
/// (0.23 of Simple's rate: each 60 KB slot is a round through both proxies). LL, untailed and
/// with one thread polling head (docs/NET.md, "Small steps"), measured on one H200 with two and
/// four processes as hosts (`net_bench.sh --uts --also NCCL_PROTO=LL`,
/// docs/results/net-bench-2026-11-26-h200-ll.txt): with two hosts the ring collectives took
/// 19–22 µs a call up to 8 KB where Simple took 25–28, so its hop is priced 6 µs under Simple's;
/// Simple overtakes it between 4 and 16 KB (broadcast and reduce from 8 KB, all-gather and
/// reduce-scatter from 16 KB, two ranks; from 16–32 KB with four), which a rate of 0.3 of
/// Simple's gives (LL's slots hold 16 KB, half of every line is flags). Send/recv and the
/// collectives made of it run Simple always.
const NET_COST: HostLinkCost = HostLinkCost {
    hop_us: [30.0, 36.0, 36.0],
    channel_us: [15.0; 3],
    channel_gbps: [2.3 * 0.3, 2.3 * 0.23, 2.3],
    gbps: [8.2 * 0.3, 8.2 * 0.23, 8.2],
};

/// NET through a net plugin (docs/NET.md, "What a net plugin's properties change"): the proxies'
/// cost per hop and per channel stays NET_COST's, the plugin's latency is added to every hop
/// (NCCL likewise adds a net's latency to its base NET latency), and the link's bandwidth,
/// `speed / 8000` GB/s as in NCCL, is what all Simple channels together reach, each channel at
/// most NET_COST's rate per channel. LL and LL128 move a slot a round through both proxies, so
/// their rates are NET_COST's, bounded by the link only where it carries less of their lines (LL:
/// half of them are flags; LL128: 8 bytes of 128): through the test plugin reporting 10 Gbps, LL
/// beat Simple up to 8 KB by 2–4 µs a call and was level at 16 KB (BENCHMARKS.md), where a rate of
/// 0.3 of the reported link's had it lose from 4 KB.
fn plugin_net_cost(link: &NetLink) -> HostLinkCost {
    let simple = FN_PROTO_SIMPLE as usize;
    let gbps = link.gbps();
    // The share of each protocol's bytes on the wire that is data (LL, LL128, Simple).
    let data = [0.5, 120.0 / 128.0, 1.0];
    let capped = |p: usize, rate: f64| rate.min(gbps * data[p]);
    HostLinkCost {
        hop_us: NET_COST.hop_us.map(|h| h + link.latency_us),
        channel_us: NET_COST.channel_us,
        channel_gbps: [0, 1, 2].map(|p| capped(p, NET_COST.channel_gbps[p])),
        gbps: [0, 1, 2].map(|p| if p == simple { gbps } else { capped(p, NET_COST.gbps[p]) }),
    }
}

/// NET channels a communicator connects, out of its budget `nchannels` and the transport's most,
/// `max`: over the built-in Socket net enough that every channel's Simple rate (NET_COST's per
/// channel) adds up to its measured bandwidth (4 channels); through a plugin the two NCCL gives a
/// NIC (its rings doubled), whatever speed it reports. A plugin's channels all go through the
/// one proxy thread of each process, whose work a faster link does not shrink: through the test
/// plugin reporting 100 Gbps, six channels (the link's 12.5 GB/s at 2.3 a channel) ran 1.14x
/// slower than two in the geometric mean of every collective at 64 KB-64 MB, over two hosts and
/// over four: 0.96-1.08x NCCL there, two 1.10-1.23x (docs/NET.md, "What a net plugin's
/// properties change"). Never fewer than `least`, the channels the user asks for at least
/// (NCCL_MIN_NCHANNELS, the config's minCTAs: NCCL copies its rings up to them), and no more than
/// a plugin's `maxComms`. The tuner still picks, per collective, how many to use
/// ([`asked_channels`]).
pub fn net_channels(net: Option<&NetLink>, nchannels: usize, max: usize, least: usize) -> usize {
    const PER_NIC: usize = 2;
    let most = nchannels.min(max).max(1);
    let simple = FN_PROTO_SIMPLE as usize;
    let (wanted, most) = match net {
        None => ((NET_COST.gbps[simple] / NET_COST.channel_gbps[simple]).ceil() as usize, most),
        Some(link) => (PER_NIC, most.min(link.max_comms)),
    };
    wanted.max(PER_NIC).max(least).clamp(1, most)
}

/// What the tuner takes of a NET link, for `ferronickel plan`: one hop of Simple on one channel
/// (µs) and the bandwidth all channels reach with Simple (GB/s).
pub fn net_hop_and_gbps(net: Option<&NetLink>) -> (f64, f64) {
    let cost = net.map_or(NET_COST, plugin_net_cost);
    let simple = FN_PROTO_SIMPLE as usize;
    (cost.hop_us[simple], cost.gbps[simple])
}

/// The modelled time of an algorithm's kernel and the channels to run it on, from `min_nch` (or
/// `max_nch` where fewer) to `max_nch`. Over P2P every channel is used (the measured costs assume
/// it); over host memory the fewest channels that pay for themselves. `behind`: hops that wait for
/// a whole step of the hop before them ([`chain_behind`]), each charged a step's time on one
/// channel when the channels are chosen; the time returned, by which protocols and algorithms are
/// compared, stays the model's, whose constants were fitted without it.
#[allow(clippy::too_many_arguments)]
fn price(
    shape: &CommShape,
    proto: u32,
    hops: f64,
    wire: f64,
    bw_scale: f64,
    behind: f64,
    min_nch: usize,
    max_nch: usize,
) -> (f64, usize) {
    let plugin_net;
    let cost = match (shape.link, &shape.net) {
        (Link::P2p, _) => return (model_us(proto, hops, wire, bw_scale), max_nch),
        (Link::Shm, _) => &SHM_COST,
        (Link::Net, None) => &NET_COST,
        (Link::Net, Some(link)) => {
            plugin_net = plugin_net_cost(link);
            &plugin_net
        }
    };
    let max_nch = max_nch.max(1);
    let (_, t, nch) = (min_nch.clamp(1, max_nch)..=max_nch)
        .map(|nch| {
            let t = cost.us(proto, hops, wire, bw_scale, nch);
            let step = (wire / nch as f64).min(shape.slot_bytes as f64);
            (t + behind * cost.step_us(proto, step), t, nch)
        })
        .fold((f64::INFINITY, f64::INFINITY, 1), |best, c| if c.0 < best.0 { c } else { best });
    (t, nch)
}

/// Hops of a ring collective that wait for a whole step of the hop before them, over NET in
/// Simple: a broadcast's or reduce's chain forwards each step once it has all of it, so where a
/// channel's part is one step (no larger than a slot) it crosses the n - 1 hops one after another,
/// and the hops behind the first each add that step's time; more channels make the step smaller.
/// Once a part spans several steps they pipeline and only the first pays. (The all-gather,
/// reduce-scatter and all-reduce rings send every rank's chunk at once, so their hops overlap.)
/// Two hosts of two ranks on 2× H200 (P2P inside a host), with NCCL_MIN_NCHANNELS=2 against the
/// one channel the model picked without this: broadcast of 128 KB 1.30× faster, reduce 1.59×,
/// where NCCL ran them 1.10× and 1.29× faster than that one channel; the all-gather and
/// reduce-scatter 0.86–0.93×, so they keep theirs (docs/NET.md, "A chain's steps").
fn chain_behind(kind: CollKind, proto: u32, hops: f64, shape: &CommShape) -> f64 {
    let chain = matches!(kind, CollKind::Broadcast | CollKind::Reduce);
    if chain && proto == FN_PROTO_SIMPLE && shape.link == Link::Net {
        (hops - 1.0).max(0.0)
    } else {
        0.0
    }
}

/// Wire bytes from which a broadcast or reduce between two ranks through a net plugin runs on two
/// channels.
const ONE_WAY_TWO_CHANNELS_WIRE: f64 = (1 << 20) as f64;

/// The fewest channels of a ring `kind` in `proto` with `wire` bytes a rank: two for a Simple
/// broadcast or reduce between two ranks through a net plugin of at least
/// [`ONE_WAY_TWO_CHANNELS_WIRE`], or of more than one message's step and at most two
/// (FN_NET_ONE_MESSAGE_SIMPLE, 64 KiB); one otherwise. There each proxy carries one direction only.
/// From 1 MiB a second channel (a second connection through the plugin, a second CTA) kept more
/// bytes moving, though the plugin's 10 Gbps report prices one channel as enough: on one H200
/// with the test plugin, 1–64 MB, the reduce 7–9 % faster in three calls on three machines, the
/// broadcast 0–12 %. At 64–128 KiB one channel's step crosses as two messages and the root waits
/// for both, where each of two channels' steps crosses as one and the two cross side by side:
/// eight runs a side, and again with the sides swapped, both 1.05–1.09× faster at 128 KiB; at 256
/// and 512 KiB two channels (two messages each) were 0.87–0.98×, four channels and steps of 64 KiB
/// slower still (docs/NET.md, "What a net plugin's properties change"). Where a proxy carries both
/// directions it did not pay: over four ranks 3 % faster in one call and up to 17 % slower in the
/// other, the all-reduce and all-gather 6–11 % slower.
fn one_way_channels(kind: CollKind, proto: u32, wire: f64, shape: &CommShape) -> usize {
    let one_way = matches!(kind, CollKind::Broadcast | CollKind::Reduce) && shape.nranks == 2;
    let plugin = shape.link == Link::Net && shape.net.is_some();
    let two_messages = two_message_steps(shape).is_some_and(|(above, upto)| wire > above as f64 && wire <= upto as f64);
    if one_way && plugin && proto == FN_PROTO_SIMPLE && (wire >= ONE_WAY_TWO_CHANNELS_WIRE || two_messages) {
        2
    } else {
        1
    }
}

/// The Simple steps through communicator `shape`'s net plugin that cross as two messages (their
/// size word, then their bytes) where each half would cross as one: more than the first and at
/// most the second, in bytes. After a Simple step a plugin's Simple step of at most
/// FN_NET_ONE_MESSAGE_SIMPLE (64 KiB) crosses as one message with its size word (docs/NET.md,
/// "One message per small step"). Such a send's part runs in two steps
/// (`plan::kernels::p2p_step`), such a two-rank broadcast or reduce on two channels
/// ([`one_way_channels`]). `None` where the hosts are not joined through a plugin: the built-in
/// net sends every step as two messages.
pub fn two_message_steps(shape: &CommShape) -> Option<(usize, usize)> {
    let one = FN_NET_ONE_MESSAGE_SIMPLE as usize;
    shape.net.is_some().then_some((one, 2 * one))
}

/// The fewest channels of a ring or tree collective of `bytes` in `proto` where the user asked
/// for channels (`CommShape::min_channels`): as many as asked, less one for each channel that
/// would carry under NCCL's per-channel threshold (its threads per channel times its bytes per
/// thread: LL 512 × 8, times the ranks for a ring; LL128 640 × 8; Simple 512 × 64), as NCCL
/// lowers a collective's channels below the communicator's only for such small messages. Where
/// nothing was asked, 1: the cost model picks.
fn asked_channels(shape: &CommShape, algo: u32, proto: u32, bytes: f64) -> usize {
    let per_channel = match proto {
        FN_PROTO_LL if algo == FN_ALGO_RING => 512.0 * 8.0 * shape.nranks as f64,
        FN_PROTO_LL => 512.0 * 8.0,
        FN_PROTO_LL128 => 640.0 * 8.0,
        _ => 512.0 * 64.0,
    };
    shape.min_channels.min((bytes / per_channel) as usize).max(1)
}

/// Bytes of a collective a channel carries at least between GPUs of one host (P2P), where the
/// cost model has no per-channel cost and offers every channel: on 2× H200, a process per GPU,
/// under CUDA graphs, the all-gather, reduce-scatter, all-reduce, broadcast and reduce of 8 B–4
/// KB took 0.2–0.6 µs less on one channel than on 64 (reduce-scatter of 1 KB 4.98 µs against
/// 5.38, NCCL's 4.98), two channels were fastest at 8 KB, eight at 16–32 KB and 64 from 64 KB
/// (`docs/results/p2p-channels-2026-11-27-h200x2.txt`). NCCL likewise lowers a small message's
/// channels (8 bytes a thread a channel in LL, times the ranks for a ring).
const GPU_LINK_CHANNEL_BYTES: f64 = 2048.0;

/// The channels of a ring or two-rank one-shot collective of `bytes` that `price` gave `priced`:
/// between GPUs of one host, one per [`GPU_LINK_CHANNEL_BYTES`], at least `least` (what the
/// user asked for), at most `priced`; over SHM and NET the cost model already chose.
fn gpu_link_channels(shape: &CommShape, bytes: f64, least: usize, priced: usize) -> usize {
    if shape.link != Link::P2p {
        return priced;
    }
    let most = priced.max(1);
    ((bytes / GPU_LINK_CHANNEL_BYTES) as usize).clamp(least.clamp(1, most), most)
}

/// Bytes of the largest per-channel part when `count` elements of `elem` bytes are spread over
/// `nch` channels (the kernels' channelPart rule: parts rounded up to 16 bytes).
fn part_bytes(count: usize, elem: usize, nch: usize) -> usize {
    let align = (16 / elem).max(1);
    count.div_ceil(nch).div_ceil(align) * align * elem
}

/// The most bytes a direct broadcast's root sends in all ((n - 1) × the message): on one H200 with
/// four processes as hosts, scatter (the same sends) moved 3 × 1 MiB in 364 µs where the ring's
/// broadcast of 1 MiB took 495, and 3 × 2 MiB in 712 against 692.
const DIRECT_ROOT_BYTES: usize = 3 << 20;
/// The most bytes a direct reduce's root receives in all, on one channel ([`FN_ALGO_DIRECT`]): four
/// processes as hosts on one H200, reduce of 128 KB 119 µs against the ring's 173, 256 KB 179
/// against 236 (3 × 256 KiB coming in at the root).
const DIRECT_REDUCE_ROOT_BYTES: usize = 1 << 20;
/// The most ranks a direct broadcast or reduce serves: the root's messages go out or come in one
/// after another through its proxy, so more peers only pay at small sizes (measured up to four).
const DIRECT_MAX_RANKS: usize = 8;
// A direct broadcast's work lists the ranks it sends to, 4 bits each (kernels/device_abi.h).
const _: () = assert!(DIRECT_MAX_RANKS < 16);

/// Whether a broadcast or reduce of `bytes` runs direct, between the root and every rank (one hop)
/// instead of along the ring (n - 1 hops): across hosts over NET, from three ranks on (two are
/// one hop either way), while the root's bytes stay under [`DIRECT_ROOT_BYTES`]
/// (broadcast: the root's sends, `plan::kernels::direct_p2p`) or [`DIRECT_REDUCE_ROOT_BYTES`]
/// (reduce: `FN_ALGO_DIRECT`). Four processes as hosts on one H200: a broadcast of 8 B in 31 µs
/// where the ring takes 36 and NCCL's 34 (docs/NET.md, "Direct broadcast and reduce"). Like the
/// one-shot all-reduce, no tuner plugin is offered it: NCCL has no index for it. Every input is
/// the same on every rank.
///
/// Where hosts hold several ranks the ring crosses NET only between hosts, while a direct reduce's
/// root takes in a message over NET for every rank elsewhere, one after another through its proxy:
/// a reduce runs direct across hosts of at most two ranks (its chain leaves the root's host and
/// comes back, so it crosses NET once a host where the direct reduce crosses once); on 2× H200
/// against the ring, reduce of 8 B–256 KB 1.06–1.37× faster over two hosts of two ranks,
/// 1.06–1.46× to 128 KB over four (docs/NET.md, "Hosts of several ranks"). A broadcast there
/// crosses NET once on every path (`plan::kernels::direct_broadcast_links`): the root sends to one
/// rank of every other host and each host's ranks pass it along, where the ring crosses NET
/// between each two hosts in turn; so from three hosts on, as over two the ring crosses once too.
/// On 2× H200 against the ring, four hosts of two ranks: 1.04–1.17× faster at 8 B–4 KB,
/// 1.30–1.71× at 8–256 KB; over two hosts of two 0.94–1.05× to 8 KB and 0.53–0.89× from 128 KB
/// (docs/NET.md, "Hosts of several ranks").
pub fn direct(kind: CollKind, bytes: usize, shape: &CommShape, allowed: &Allowed) -> bool {
    let n = shape.nranks;
    let (cap, fits) = match kind {
        CollKind::Broadcast => (DIRECT_ROOT_BYTES, n == shape.tree.nhosts || shape.tree.nhosts >= 3),
        CollKind::Reduce => (DIRECT_REDUCE_ROOT_BYTES, n <= 2 * shape.tree.nhosts),
        _ => return false,
    };
    allowed.direct_for(kind)
        && allowed.ring_for(kind)
        && shape.link == Link::Net
        && shape.tree.nhosts >= 2
        && fits
        && (3..=DIRECT_MAX_RANKS).contains(&n)
        && bytes > 0
        && (n - 1).saturating_mul(bytes) <= cap
}

/// The most bytes a recursive-doubling all-reduce reduces, and all-gather gathers in all
/// ([`FN_ALGO_RECDBL`]). Four processes as hosts on one H200, against the ring and tree in the same
/// binary: all-reduce of 128 KB 157–162 µs against 175–177, 256 KB 304–335 against 262–271 (each
/// exchange sends the whole vector); all-gather of 512 KB 202–204 against 217–219, 1 MB 384–398
/// against 369–379 (docs/NET.md, "Recursive doubling").
const RECDBL_MAX_ALLREDUCE: usize = 128 << 10;
const RECDBL_MAX_ALLGATHER: usize = 512 << 10;
/// The most bytes of a recursive-doubling all-reduce or all-gather where hosts hold several ranks:
/// the ring's hops inside a host are cheap there, and the exchanges over NET move everything on
/// one channel. On 2× H200, over four hosts of two ranks and two of four, the all-gather of
/// 256–512 KB took 1.2–1.3× the ring's time and was level at 128 KB; the all-reduce of 128 KB took
/// 2.4–2.9× the ring's time in three of ten runs (1.11–1.12× faster over two hosts of two), of 64 KB
/// it ran 1.18–1.35× faster (docs/NET.md, "Hosts of several ranks").
const RECDBL_MAX_SHARED_HOSTS: usize = 64 << 10;
/// A reduce-scatter all-reduces its whole input in the communicator's scratch, where the ring
/// moves each byte once: it pays up to 2 KiB of output a rank. Four hosts: 8 KB of input 62–63 µs
/// against 65–66, 16 KB 68–71 against 67–68; eight: 16 KB 114–118 against 160–163, 64 KB 204–206
/// against 174–176.
const RECDBL_MAX_REDUCESCATTER_PER_RANK: usize = 2 << 10;

/// Whether recursive doubling can run on a communicator of `nranks` ranks over `nhosts` hosts
/// linked by `link` at all: a power of two of ranks, from four (two are one hop either way), across
/// hosts over NET. Where a host holds several ranks, some exchanges pair ranks of one host (P2P or
/// SHM, connected at init) and the others cross hosts: with ranks numbered host by host, as
/// launchers number them, two hosts of two ranks make one hop over NET and one inside a host where
/// the ring makes two over NET and one inside. Init gives such a communicator the
/// reduce-scatter's scratch.
pub fn recursive_doubling_shape(nranks: usize, nhosts: usize, link: Link) -> bool {
    link == Link::Net && nhosts >= 2 && nranks >= 4 && nranks.is_power_of_two()
}

/// Whether an all-reduce, all-gather or reduce-scatter of `bytes` (all-gather: its output;
/// reduce-scatter: its input) runs by recursive doubling: log2(n) exchanges, each one hop, where
/// the ring makes n - 1 hops (all-gather, reduce-scatter) or 2(n - 1) (all-reduce) and the tree
/// 2 log2(n). On the communicators of [`recursive_doubling_shape`], up to [`RECDBL_MAX_ALLREDUCE`],
/// [`RECDBL_MAX_ALLGATHER`] or [`RECDBL_MAX_REDUCESCATTER_PER_RANK`] a rank. Like the direct broadcast and reduce, no tuner plugin is offered
/// it (NCCL has no index for it), and NCCL_ALGO as a list of algorithms to use leaves it out.
pub fn recursive_doubling(kind: CollKind, bytes: usize, shape: &CommShape, allowed: &Allowed) -> bool {
    let shared_hosts = shape.tree.nhosts < shape.nranks;
    let cap = match kind {
        CollKind::AllReduce | CollKind::AllGather if shared_hosts => RECDBL_MAX_SHARED_HOSTS,
        CollKind::AllReduce => RECDBL_MAX_ALLREDUCE,
        CollKind::AllGather => RECDBL_MAX_ALLGATHER,
        CollKind::ReduceScatter => (RECDBL_MAX_REDUCESCATTER_PER_RANK * shape.nranks).min(FN_RECDBL_SCRATCH as usize),
        _ => return false,
    };
    allowed.direct_for(kind)
        && allowed.ring_for(kind)
        && recursive_doubling_shape(shape.nranks, shape.tree.nhosts, shape.link)
        && bytes > 0
        && bytes <= cap
}

/// The bytes the tuner sizes a collective of `count` elements of `elem` bytes by: an all-gather's
/// output, a reduce-scatter's input (`count` is per rank), the buffer of the others.
pub fn coll_bytes(kind: CollKind, count: usize, elem: usize, nranks: usize) -> usize {
    match kind {
        CollKind::AllGather | CollKind::ReduceScatter => count * elem * nranks,
        _ => count * elem,
    }
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

/// A group of copy-engine copies whose busiest rank queues `remote` bytes of pushes to its peers
/// and `local` bytes of copies within its GPU, one after another on its stream.
pub fn copy_engine_us(remote: usize, local: usize) -> f64 {
    CE_SYNC_US + remote as f64 / (CE_GBPS * 1e3) + local as f64 / (CE_LOCAL_GBPS * 1e3)
}

fn choose_timed(kind: CollKind, count: usize, elem: usize, shape: &CommShape, allowed: &Allowed) -> (f64, Choice) {
    let n = shape.nranks;
    let ring = |proto| Choice { algo: FN_ALGO_RING, proto, nchannels: shape.nchannels };
    if n == 1 {
        return (model_us(FN_PROTO_SIMPLE, 0.0, 0.0, 1.0), ring(FN_PROTO_SIMPLE));
    }
    let bytes = coll_bytes(kind, count, elem, n) as f64;
    let (hops, wire) = ring_shape(kind, n as f64, bytes);
    // A direct broadcast or reduce, one channel: the protocol that moves the root's outgoing or
    // incoming bytes fastest. A Simple broadcast runs as the root's sends instead, split over the
    // connections' channels (`plan::kernels::direct_p2p`).
    if direct(kind, bytes as usize, shape, allowed) {
        let priced = [FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE]
            .into_iter()
            .filter(|&p| allowed.protos[p as usize])
            .map(|proto| (price(shape, proto, 1.0, (n - 1) as f64 * bytes, 1.0, 0.0, 1, 1).0, proto));
        if let Some((t, proto)) = priced.min_by(|a, b| a.0.total_cmp(&b.0)) {
            return (t, Choice { algo: FN_ALGO_DIRECT, proto, nchannels: 1 });
        }
    }
    // Recursive doubling, one channel: log2(n) hops, a reduction sending its whole vector each.
    if recursive_doubling(kind, bytes as usize, shape, allowed) {
        let hops = (n as f64).log2();
        let wire = if kind == CollKind::AllGather { wire } else { hops * bytes };
        let priced = [FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE]
            .into_iter()
            .filter(|&p| allowed.protos[p as usize])
            .map(|proto| (price(shape, proto, hops, wire, 1.0, 0.0, 1, 1).0, proto));
        if let Some((t, proto)) = priced.min_by(|a, b| a.0.total_cmp(&b.0)) {
            return (t, Choice { algo: FN_ALGO_RECDBL, proto, nchannels: 1 });
        }
    }
    // Ring and Tree, which NCCL has indices for: what a tuner plugin sees (see `consult`).
    let mut offered: Vec<(f64, Choice)> = Vec::new();
    for proto in [FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE] {
        if allowed.protos[proto as usize] && allowed.ring_for(kind) {
            let least =
                one_way_channels(kind, proto, wire, shape).max(asked_channels(shape, FN_ALGO_RING, proto, bytes));
            let behind = chain_behind(kind, proto, hops, shape);
            let (t, nchannels) = price(shape, proto, hops, wire, 1.0, behind, least, shape.nchannels);
            let nchannels = gpu_link_channels(shape, bytes, least, nchannels);
            offered.push((t, Choice { algo: FN_ALGO_RING, proto, nchannels }));
        }
    }
    // Tree all-reduce: across hosts its log-depth latency beats the ring's 2(n - 1) hops; on one
    // host the trees are one chain, no better than the ring, so as in NCCL it runs there only when
    // NCCL_ALGO leaves all-reduce no ring.
    let tch = tree_channels(shape);
    let tree_wanted = shape.tree.nhosts > 1 || !allowed.ring_for(kind);
    if kind == CollKind::AllReduce && allowed.tree && tree_wanted && tch > 0 {
        let (hops, wire) = tree_shape(shape, bytes);
        for proto in [FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE] {
            if allowed.protos[proto as usize] {
                let least = asked_channels(shape, FN_ALGO_TREE, proto, bytes);
                let (t, nchannels) = price(shape, proto, hops, wire, TREE_BW, 0.0, least, tch);
                offered.push((t, Choice { algo: FN_ALGO_TREE, proto, nchannels }));
            }
        }
    }
    // One-shot all-reduce: one hop. Between two ranks it runs over any protocol and sends what the
    // ring sends; with more ranks each rank sends its whole input to every peer, over LL, one slot
    // per channel.
    let mut oneshot: Vec<(f64, Choice)> = Vec::new();
    let nch = shape.all_pairs_channels.min(shape.nchannels);
    if kind == CollKind::AllReduce && allowed.oneshot && nch > 0 {
        for proto in [FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE] {
            let fits = n == 2 || (proto == FN_PROTO_LL && part_bytes(count, elem, nch) <= LL_SLOT_BYTES);
            if allowed.protos[proto as usize] && fits {
                let scale = if n == 2 { ONESHOT_PAIR_BW } else { 1.0 };
                // More than two ranks: one LL slot per channel holds the part, so every channel.
                let (t, nchannels) = if n == 2 {
                    let (t, nchannels) = price(shape, proto, 1.0, (n - 1) as f64 * bytes, scale, 0.0, 1, nch);
                    (t, gpu_link_channels(shape, bytes, 1, nchannels))
                } else {
                    (model_us(proto, 1.0, (n - 1) as f64 * bytes, scale), nch)
                };
                oneshot.push((t, Choice { algo: FN_ALGO_ONESHOT, proto, nchannels }));
            }
        }
    }
    let fastest = |c: &mut dyn Iterator<Item = (f64, (f64, Choice))>| {
        c.fold(
            None,
            |best: Option<(f64, (f64, Choice))>, x| if best.is_none_or(|b| x.0 < b.0) { Some(x) } else { best },
        )
    };
    let ours = || fastest(&mut offered.iter().chain(&oneshot).map(|&o| (o.0, o)));
    let picked = match shape.tuner.as_deref().and_then(|s| consult(s, kind, count * elem, &offered)) {
        // The plugin's costs for what it was offered; the one-shot competes at its modelled cost.
        Some((costs, nchannels)) => {
            let with_costs = offered.iter().zip(costs).filter_map(|(&o, c)| c.map(|c| (c, o)));
            match fastest(&mut with_costs.chain(oneshot.iter().map(|&o| (o.0, o)))) {
                Some((_, (t, mut c))) => {
                    if let Some(want) = nchannels.filter(|_| c.algo != FN_ALGO_ONESHOT) {
                        let max = if c.algo == FN_ALGO_TREE { tch } else { shape.nchannels };
                        c.nchannels = want.clamp(1, max.max(1));
                    }
                    Some((0.0, (t, c)))
                }
                None => {
                    crate::nccl_info!(
                        crate::debug::Subsys::TUNING,
                        "TUNER/Plugin: {kind:?} of {} bytes: the plugin ruled out every algorithm offered; using the \
                         built-in tuner's choice",
                        count * elem
                    );
                    ours()
                }
            }
        }
        None => ours(),
    };
    // Allowed::check refused collectives that the restrictions leave nothing.
    picked.map(|(_, o)| o).unwrap_or((model_us(FN_PROTO_SIMPLE, hops, wire, 1.0), ring(FN_PROTO_SIMPLE)))
}

/// NCCL's index of one of our algorithms in a tuner plugin's cost table (the one-shot has none).
fn nccl_algo(algo: u32) -> usize {
    match algo {
        FN_ALGO_TREE => NCCL_ALGO_TREE as usize,
        _ => NCCL_ALGO_RING as usize,
    }
}

/// NCCL's `ncclFunc_t` of a collective (what tuner and profiler plugins are told).
pub fn nccl_func(kind: CollKind) -> ncclFunc_t {
    match kind {
        CollKind::AllReduce => ncclFuncAllReduce,
        CollKind::Reduce => ncclFuncReduce,
        CollKind::Broadcast => ncclFuncBroadcast,
        CollKind::AllGather => ncclFuncAllGather,
        CollKind::ReduceScatter => ncclFuncReduceScatter,
    }
}

/// Asks a tuner plugin about a collective of `bytes` (the user's count times the element size):
/// the cost table holds our modelled time of every offered (Ring or Tree, protocol), NCCL's
/// `NCCL_ALGO_PROTO_IGNORE` elsewhere. Returns the plugin's cost of each offered entry (`None`:
/// ruled out) and the channels it asks for, or `None` when it failed (our own choice stands).
fn consult(
    plugin: &TunerSession,
    kind: CollKind,
    bytes: usize,
    offered: &[(f64, Choice)],
) -> Option<(Vec<Option<f64>>, Option<usize>)> {
    let mut table: CostTable = [[IGNORE; 3]; 7];
    for (t, c) in offered {
        table[nccl_algo(c.algo)][c.proto as usize] = *t as f32;
    }
    let mut nchannels = 0;
    plugin.coll_info(nccl_func(kind), bytes, &mut table, &mut nchannels).ok()?;
    let costs = offered
        .iter()
        .map(|(_, c)| {
            let v = table[nccl_algo(c.algo)][c.proto as usize];
            (v >= 0.0 && v.is_finite()).then_some(v as f64)
        })
        .collect();
    Some((costs, usize::try_from(nchannels).ok().filter(|&n| n > 0)))
}

/// v5 tuner plugins' constants, filled from this model where it has a counterpart: the hop
/// latency of each protocol for Ring and Tree over NVLink (P2P), PCI (SHM) and the network
/// (NET). The rest is zero; what a plugin writes there is not read back (docs/PLUGINS.md).
pub fn plugin_constants() -> ncclTunerConstants_v5_t {
    let mut c = ncclTunerConstants_v5_t::default();
    for (p, cost) in COST.iter().enumerate() {
        let hops =
            [(NCCL_HW_NVLINK, cost.hop_us), (NCCL_HW_PCI, SHM_COST.hop_us[p]), (NCCL_HW_NET, NET_COST.hop_us[p])];
        for (hw, hop) in hops {
            for algo in [NCCL_ALGO_RING, NCCL_ALGO_TREE] {
                c.hwLatencies[hw as usize][algo as usize][p] = hop;
            }
        }
    }
    c
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

/// NCCL_ALGO's per-collective entries: for each of `KINDS`, the algorithms it allows and whether
/// its entry was an inclusion list. `allreduce:tree;allgather:ring`, or a bare list for every
/// collective; later entries override earlier ones. `SendRecv` is accepted and has no algorithm.
fn parse_algo(setting: &str) -> Result<[(Vec<&'static str>, bool); 5]> {
    // NCCL's function names, the first five in the order of KINDS.
    const FUNCS: [&str; 6] = ["AllReduce", "Reduce", "Broadcast", "AllGather", "ReduceScatter", "SendRecv"];
    let mut out: [(Vec<&'static str>, bool); 5] = std::array::from_fn(|_| (ALGOS.to_vec(), false));
    for entry in setting.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (kinds, list) = match entry.split_once(':') {
            Some((f, list)) => match FUNCS.iter().position(|n| n.eq_ignore_ascii_case(f.trim())) {
                // SendRecv has no entry of its own in `out`.
                Some(i) => (i..(i + 1).min(KINDS.len()), list),
                None => crate::bail_arg!(
                    "NCCL_ALGO={setting}: unknown collective {:?} (known: {})",
                    f.trim(),
                    FUNCS.join(", ")
                ),
            },
            None => (0..KINDS.len(), entry),
        };
        let ok = allowed(list, &ALGOS, "NCCL_ALGO")?;
        let inclusion = !list.trim().starts_with('^');
        for slot in &mut out[kinds] {
            *slot = (ok.clone(), inclusion);
        }
    }
    Ok(out)
}

/// What NCCL_ALGO / NCCL_PROTO settings allow; an error for unknown names and for a protocol list
/// that leaves nothing. A collective that NCCL_ALGO leaves no algorithm fails when it is called
/// ([`Allowed::check`]), as in NCCL.
pub fn parse_restrictions(algo: Option<&'static str>, proto: Option<&str>) -> Result<Allowed> {
    let mut out = Allowed::ALL;
    let proto_excludes_only = proto.is_none_or(|s| s.trim().starts_with('^'));
    if let Some(setting) = algo {
        let per_kind = parse_algo(setting)?;
        out.ring = std::array::from_fn(|k| per_kind[k].0.contains(&"Ring"));
        out.tree = per_kind[0].0.contains(&"Tree");
        out.oneshot = !per_kind[0].1;
        // As the one-shot: NCCL has no such algorithm, so a list of those to use leaves it out.
        out.direct = std::array::from_fn(|k| !per_kind[k].1);
        out.copy_engine = per_kind.iter().all(|(_, inclusion)| !inclusion);
        out.algo_env = Some(setting);
    }
    out.copy_engine &= proto_excludes_only;
    // As the copy engines: forcing an algorithm or a protocol runs the kernels that use it.
    if !out.copy_engine {
        out.symmetric = Symmetric::Never;
    }
    if let Some(setting) = proto {
        let ok = allowed(setting, &PROTOS, "NCCL_PROTO")?;
        if ok.is_empty() {
            return Err(Error::InvalidUsage(format!(
                "NCCL_PROTO={setting} allows nothing but ferronickel implements LL, LL128 and Simple; unset \
                 NCCL_PROTO or include one of those"
            )));
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
/// With `FERRONICKEL_SYMMETRIC` applied: 0 and 1 override what NCCL_ALGO / NCCL_PROTO imply.
pub fn restrictions() -> Result<&'static Allowed> {
    static PARSED: OnceLock<Result<Allowed>> = OnceLock::new();
    PARSED
        .get_or_init(|| {
            parse_restrictions(algo_setting(), proto_setting()).map(|mut a| {
                match Symmetric::from_setting(symmetric_setting()) {
                    Symmetric::Tuned => {}
                    forced => a.symmetric = forced,
                }
                a
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests;
