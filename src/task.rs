//! The vocabulary every layer above the platform shares: what a call asks for ([`Task`]), what
//! planning needs to know about a communicator ([`CommShape`]), and what planning produces for the
//! kernels ([`Launch`]). It sits low (docs/ARCHITECTURE.md, "Layers") so that the tuner, the
//! planner, the communicator and the group code all import it and none of them imports another
//! sideways or upwards.

use crate::abi::{
    fnWork, FN_ALGO_DIRECT, FN_ALGO_RECDBL, FN_ALGO_RING, FN_WORK_BROADCAST, FN_WORK_COPY, FN_WORK_RECV,
    FN_WORK_REDUCE, FN_WORK_SEND,
};
use crate::cuda::module::KernelId;
use crate::cuda::CUstream;
use crate::plugin::tuner::Session as TunerSession;
use crate::topo::tree::TreeShape;
use crate::types::ncclDataType_t;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollKind {
    AllReduce,
    Reduce,
    Broadcast,
    AllGather,
    ReduceScatter,
}

/// The device-side reduction: an `fnRedOp` and its PreMulSum scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevOp {
    pub kind: u32,
    /// PreMulSum: the scalar's bits in the data type, or a device pointer to it.
    pub scalar: u64,
    pub scalar_is_ptr: bool,
}

impl DevOp {
    pub const fn plain(kind: u32) -> DevOp {
        DevOp { kind, scalar: 0, scalar_is_ptr: false }
    }
}

/// A buffer in a symmetric window as the symmetric kernels reach it: LSA rank 0's address of it
/// in the window's flat mapping, and the distance from one rank's to the next in 4 GiB units
/// (docs/ARCHITECTURE.md, "Symmetric kernels").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymBuf {
    pub flat: u64,
    pub stride4g: u32,
}

/// A collective's send and receive buffers, both in symmetric windows of a communicator that is
/// one LSA team: what lets it run the symmetric kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymBufs {
    pub send: SymBuf,
    pub recv: SymBuf,
}

#[derive(Debug, Clone, Copy)]
pub struct CollTask {
    pub kind: CollKind,
    pub send: u64,
    pub recv: u64,
    /// Elements, as the user counts them for this collective.
    pub count: usize,
    pub dtype: ncclDataType_t,
    pub op: DevOp,
    pub root: usize,
    /// Found when the collective was queued: its buffers in symmetric windows, if they are.
    pub sym: Option<SymBufs>,
}

#[derive(Debug, Clone, Copy)]
pub enum Task {
    Coll(CollTask),
    Send { buf: u64, bytes: usize, peer: usize },
    Recv { buf: u64, bytes: usize, peer: usize },
}

/// One queued operation: which communicator (`C`: the group code's `Arc<Comm>`; generic so that
/// this module stays below the communicator), on which stream, doing what.
pub struct Queued<C> {
    pub comm: C,
    pub stream: CUstream,
    pub task: Task,
}

/// What planning needs to know about the communicator. Every input but `rank` is the same on
/// every rank, so all ranks pick the same algorithm, protocol and split for an operation.
#[derive(Debug, Clone)]
pub struct CommShape {
    pub rank: usize,
    pub nranks: usize,
    /// CTAs one rank may use for a launch (its channel budget).
    pub nchannels: usize,
    /// The channels the user asked for at least (NCCL_MIN_NCHANNELS, the config's minCTAs; 0: none),
    /// which ring and tree collectives use but for small messages (`tuner`).
    pub min_channels: usize,
    /// Channels that connect every pair of ranks: the most a one-shot all-reduce can use.
    pub all_pairs_channels: usize,
    /// Bytes of one Simple FIFO slot (NCCL_BUFFSIZE / 8): the most a ring step carries (`tuner`).
    pub slot_bytes: usize,
    /// The Tree algorithm's hosts, depth and fan-out.
    pub tree: TreeShape,
    /// Each rank's host and its place in that host's chain (the ring's order within the host),
    /// alike on every rank; `None`: the ranks spread evenly over `tree.nhosts` hosts, host by host
    /// in rank order, as launchers number them (the planner's tests describe communicators so).
    /// See [`CommShape::host`].
    pub hosts: Option<Arc<[(u32, u32)]>>,
    /// The slowest kind of connection between two of its ranks: it prices algorithms, protocols
    /// and channels (`tuner`).
    pub link: Link,
    /// What a net plugin reports of the NET link, which then prices it; `None`: the built-in
    /// Socket net, priced by its measured constants (`tuner`).
    pub net: Option<NetLink>,
    /// The communicator's context of an external tuner plugin, which the tuner consults
    /// (docs/PLUGINS.md, "Tuner").
    pub tuner: Option<Arc<TunerSession>>,
}

/// What a hop between two ranks costs, by where its FIFOs sit: GPU memory (P2P), host memory that
/// both GPUs reach over PCIe (SHM), or host memory drained by proxy threads (NET). Ordered from
/// fastest to slowest, as the transports that make them are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Link {
    P2p,
    Shm,
    Net,
}

impl Link {
    /// The slowest link of a communicator: `net` when some pair is on NET, else `host_fifos` when
    /// some pair has its FIFOs in host memory (SHM).
    pub fn slowest(net: bool, host_fifos: bool) -> Link {
        match (net, host_fifos) {
            (true, _) => Link::Net,
            (false, true) => Link::Shm,
            (false, false) => Link::P2p,
        }
    }
}

impl CommShape {
    /// Rank `r`'s host (see `hosts`).
    pub fn host(&self, r: usize) -> usize {
        match &self.hosts {
            Some(h) => h[r].0 as usize,
            None => r / self.nranks.div_ceil(self.tree.nhosts.max(1)).max(1),
        }
    }

    /// The ranks of host `h` in its chain's order (see `hosts`).
    pub fn host_chain(&self, h: usize) -> Vec<usize> {
        let mut ranks: Vec<usize> = (0..self.nranks).filter(|&r| self.host(r) == h).collect();
        if let Some(places) = &self.hosts {
            ranks.sort_unstable_by_key(|&r| places[r].1);
        }
        ranks
    }

    /// Rank 0 of `nranks` ranks on one host, every pair on P2P: the shape planner tests start from.
    #[cfg(test)]
    pub const fn one_host(nranks: usize, nchannels: usize, all_pairs_channels: usize) -> CommShape {
        CommShape {
            rank: 0,
            nranks,
            nchannels,
            min_channels: 0,
            all_pairs_channels,
            slot_bytes: 512 << 10, // NCCL_BUFFSIZE's default, 4 MiB, over 8 slots
            tree: TreeShape::chain(nranks),
            hosts: None,
            link: Link::P2p,
            net: None,
            tuner: None,
        }
    }
}

/// A net plugin's NET link as its `getProperties` reports it (docs/NET.md, "What a net plugin's
/// properties change"), bounded: what the tuner prices NET with and sizes its channels by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetLink {
    /// Link speed in Mbps; a plugin reporting none (0 or less) is taken at 10 Gbps, as in NCCL.
    pub speed_mbps: u32,
    /// The wire's latency in microseconds, 0 when unreported.
    pub latency_us: f64,
    /// Connections the plugin allows per device (at least 1).
    pub max_comms: usize,
}

impl NetLink {
    /// The speed NCCL assumes of a net that reports none.
    pub const DEFAULT_SPEED_MBPS: u32 = 10_000;

    /// From a plugin's reported `speed`, `latency` and `maxComms`, which are untrusted.
    pub fn new(speed_mbps: i32, latency_us: f32, max_comms: i32) -> NetLink {
        NetLink {
            speed_mbps: u32::try_from(speed_mbps).ok().filter(|&s| s > 0).unwrap_or(Self::DEFAULT_SPEED_MBPS),
            latency_us: if latency_us.is_finite() && latency_us > 0.0 { latency_us.min(1e6) as f64 } else { 0.0 },
            max_comms: usize::try_from(max_comms).unwrap_or(0).max(1),
        }
    }

    /// The link's bandwidth in GB/s (bytes: the speed is in bits).
    pub fn gbps(&self) -> f64 {
        self.speed_mbps as f64 / 8000.0
    }

    /// What every rank can count on when hosts report differently: the slowest speed, the
    /// longest latency, the fewest connections.
    pub fn weakest(self, other: NetLink) -> NetLink {
        NetLink {
            speed_mbps: self.speed_mbps.min(other.speed_mbps),
            latency_us: self.latency_us.max(other.latency_us),
            max_comms: self.max_comms.min(other.max_comms),
        }
    }
}

/// One kernel launch for one communicator.
#[derive(Debug)]
pub struct Launch {
    pub kernel: KernelId,
    pub grid: u32,
    pub stream: CUstream,
    /// Other streams whose operations joined this launch: ordered before and after it.
    pub joined: Vec<CUstream>,
    pub works: Vec<fnWork>,
}

impl Launch {
    /// Whether it carries sends and receives (a group's, or a direct broadcast's), which no
    /// collective joins.
    pub fn is_p2p(&self) -> bool {
        self.works.iter().any(|w| (w.type_ as u32) >= FN_WORK_SEND)
    }

    /// The connections' channels its works use, a bit each (a collective runs on channels
    /// 0..nChannels, a send or receive on `chan`.. for its parts), and apart those that works which
    /// may reach a peer connected at runtime use: sends and receives, recursive doubling and direct
    /// collectives (the proxy tests such connections' receives only for these).
    pub fn channels(&self) -> (u64, u64) {
        self.works.iter().fold((0, 0), |(all, off_ring), w| {
            let c = work_channels(w);
            let reaches = (w.type_ as u32) >= FN_WORK_SEND || matches!(w.algo as u32, FN_ALGO_RECDBL | FN_ALGO_DIRECT);
            (all | c, if reaches { off_ring | c } else { off_ring })
        })
    }
}

/// What a launch's works move over connections to other ranks: whether any of them sends, and
/// whether any receives, and to which ranks it may send ([`Launch::moves`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moves {
    pub sends: bool,
    pub receives: bool,
    /// The ranks it may send to, bit `r % 64` for rank r (all bits: any rank).
    pub to: u64,
}

impl std::ops::BitOr for Moves {
    type Output = Moves;
    fn bitor(self, o: Moves) -> Moves {
        Moves { sends: self.sends || o.sends, receives: self.receives || o.receives, to: self.to | o.to }
    }
}

/// Rank `r`'s bit in [`Moves::to`].
pub fn rank_bit(r: usize) -> u64 {
    1 << (r % 64)
}

impl Launch {
    /// Whether its works, run on `rank`, whose ring neighbours are `(prev, next)`, may send and
    /// may receive over connections (the proxy wakes only the threads of the halves a launch
    /// uses): a send only sends, a receive only receives, a copy does neither; a broadcast's root
    /// only sends, and a rank with no rank to pass it on to only receives (run direct, the work
    /// lists none; along the ring, the rank before the root); a reduce's root only receives, and
    /// a rank that starts a chain only sends (run direct, every other rank; along the ring, the
    /// rank after the root: `kernels/collectives.cuh`). Any other collective may do both. A send
    /// goes to its peer, a direct broadcast to the ranks its work lists, a direct reduce to the
    /// root, a ring's to the next rank; the other algorithms' to any rank.
    pub fn moves(&self, rank: usize, (prev, next): (usize, usize)) -> Moves {
        let sends = |to: u64| Moves { sends: true, receives: false, to };
        const RECEIVES: Moves = Moves { sends: false, receives: true, to: 0 };
        self.works.iter().fold(Moves::default(), |m, w| {
            let (direct, root) = (w.algo as u32 == FN_ALGO_DIRECT, usize::try_from(w.root) == Ok(rank));
            let ring = w.algo as u32 == FN_ALGO_RING;
            let (after_root, before_root) = (usize::try_from(w.root) == Ok(prev), usize::try_from(w.root) == Ok(next));
            // A direct broadcast's `scalar` lists the ranks this one passes it on to, rank + 1
            // in each 4 bits.
            let listed = || {
                (0..16)
                    .map(|i| (w.scalar >> (4 * i)) & 0xf)
                    .take_while(|&r| r != 0)
                    .fold(0, |m, r| m | rank_bit(r as usize - 1))
            };
            let onward = if ring { rank_bit(next) } else { u64::MAX };
            m | match w.type_ as u32 {
                FN_WORK_SEND => sends(rank_bit(w.root as usize)),
                FN_WORK_RECV => RECEIVES,
                FN_WORK_COPY => Moves::default(),
                FN_WORK_BROADCAST if direct && root => sends(listed()),
                FN_WORK_BROADCAST if root => sends(onward),
                FN_WORK_BROADCAST if (direct && w.scalar == 0) || (ring && before_root) => RECEIVES,
                FN_WORK_REDUCE if root => RECEIVES,
                FN_WORK_REDUCE if direct => sends(rank_bit(w.root as usize)),
                FN_WORK_REDUCE if ring && after_root => sends(onward),
                FN_WORK_BROADCAST if direct => Moves { sends: true, receives: true, to: listed() },
                _ => Moves { sends: true, receives: true, to: onward },
            }
        })
    }
}

/// The channels a work uses, a bit each (none past 63).
fn work_channels(w: &fnWork) -> u64 {
    let range = |from: usize, n: usize| (from..from + n).filter(|&c| c < 64).fold(0u64, |m, c| m | 1 << c);
    if (w.type_ as u32) < FN_WORK_SEND {
        range(0, usize::from(w.nChannels))
    } else {
        range(w.chan.max(0) as usize, usize::from(w.nParts).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{FN_ALGO_TREE, FN_WORK_ALLGATHER, FN_WORK_ALLREDUCE};

    /// A copy-kernel launch of `works`: only its works matter here.
    fn launch(works: Vec<fnWork>) -> Launch {
        Launch { kernel: KernelId::COPY, grid: 1, stream: std::ptr::null_mut(), joined: vec![], works }
    }

    /// A launch names channels 0..nChannels for a collective and a p2p work's channels from its
    /// first for its parts; nothing past channel 63.
    #[test]
    fn a_launch_names_the_channels_its_works_use() {
        let work = |ty: u32, nch: u16, chan: i32, parts: u8| fnWork {
            type_: ty as i32,
            nChannels: nch,
            chan,
            nParts: parts,
            ..Default::default()
        };
        assert_eq!(launch(vec![work(FN_WORK_ALLREDUCE, 3, 0, 0)]).channels().0, 0b111);
        assert_eq!(launch(vec![work(FN_WORK_RECV, 0, 2, 0)]).channels(), (0b100, 0b100));
        assert_eq!(launch(vec![work(FN_WORK_SEND, 0, 0, 4), work(FN_WORK_ALLREDUCE, 1, 0, 0)]).channels().0, 0b1111);
        assert_eq!(launch(vec![work(FN_WORK_ALLREDUCE, 80, 0, 0)]).channels().0, u64::MAX);
    }

    /// Only sends, receives, recursive doubling and direct collectives may reach a peer connected
    /// at runtime: a ring or tree collective names no channel for such connections.
    #[test]
    fn a_launch_names_off_ring_channels_for_works_that_may_reach_runtime_peers() {
        let coll = |algo: u32, nch: u16| fnWork {
            type_: FN_WORK_ALLREDUCE as i32,
            algo: algo as _,
            nChannels: nch,
            ..Default::default()
        };
        let recv = fnWork { type_: FN_WORK_RECV as i32, chan: 3, nParts: 1, ..Default::default() };
        let ring = launch(vec![coll(FN_ALGO_RING, 4)]);
        assert_eq!(ring.channels(), (0b1111, 0));
        let mixed = launch(vec![coll(FN_ALGO_RING, 2), coll(FN_ALGO_RECDBL, 1), recv]);
        assert_eq!(mixed.channels(), (0b1011, 0b1001));
        assert_eq!(launch(vec![coll(FN_ALGO_DIRECT, 1)]).channels(), (0b1, 0b1));
    }

    /// A work of type `ty` by `algo` with `root` and `scalar`, on one channel.
    fn work(ty: u32, algo: u32, root: i32, scalar: u64) -> fnWork {
        fnWork { type_: ty as i32, algo: algo as _, root, scalar, nChannels: 1, ..Default::default() }
    }

    /// What a launch of `works` moves on `rank` of ranks 0..4 in a ring in that order (rank r's
    /// neighbours are r - 1 and r + 1).
    fn on_ring_of_4(rank: usize, works: Vec<fnWork>) -> Moves {
        launch(works).moves(rank, ((rank + 3) % 4, (rank + 1) % 4))
    }

    /// A launch says which halves of its connections it may use on a rank: only what a work
    /// certainly leaves alone is left out, and a launch of several works uses what any does.
    #[test]
    fn a_launch_says_whether_it_sends_and_receives() {
        const S: (bool, bool) = (true, false);
        const R: (bool, bool) = (false, true);
        const BOTH: (bool, bool) = (true, true);
        let on = |rank: usize, works: Vec<fnWork>| {
            let m = on_ring_of_4(rank, works);
            (m.sends, m.receives)
        };
        assert_eq!(on(0, vec![work(FN_WORK_SEND, 0, 1, 0)]), S);
        assert_eq!(on(0, vec![work(FN_WORK_RECV, 0, 1, 0)]), R);
        assert_eq!(on_ring_of_4(0, vec![work(FN_WORK_COPY, 0, 0, 0)]), Moves::default());
        assert_eq!(on(0, vec![work(FN_WORK_SEND, 0, 1, 0), work(FN_WORK_RECV, 0, 2, 0)]), BOTH);
        assert_eq!(on(0, vec![work(FN_WORK_COPY, 0, 0, 0), work(FN_WORK_RECV, 0, 2, 0)]), R);
        for algo in [FN_ALGO_RING, FN_ALGO_DIRECT] {
            assert_eq!(on(2, vec![work(FN_WORK_BROADCAST, algo, 2, 0)]), S, "a broadcast's root (algo {algo})");
            assert_eq!(on(2, vec![work(FN_WORK_REDUCE, algo, 2, 0)]), R, "a reduce's root (algo {algo})");
            assert_eq!(on(0, vec![work(FN_WORK_BROADCAST, algo, 2, 0x4)]), BOTH, "passes a broadcast on (algo {algo})");
        }
        assert_eq!(on(1, vec![work(FN_WORK_BROADCAST, FN_ALGO_DIRECT, 2, 0)]), R, "the end of a direct broadcast");
        assert_eq!(on(1, vec![work(FN_WORK_REDUCE, FN_ALGO_DIRECT, 2, 0)]), S, "a direct reduce's other ranks");
        // Along the ring from root 2: a broadcast goes 2, 3, 0, 1 and a reduce 3, 0, 1, 2.
        let ring = |ty: u32, rank: usize| on(rank, vec![work(ty, FN_ALGO_RING, 2, 0)]);
        assert_eq!([1, 3, 0].map(|r| ring(FN_WORK_BROADCAST, r)), [R, BOTH, BOTH], "the last only receives");
        assert_eq!([3, 0, 1].map(|r| ring(FN_WORK_REDUCE, r)), [S, BOTH, BOTH], "the first only sends");
        // A work of another algorithm is taken to do both.
        assert_eq!(on(1, vec![work(FN_WORK_BROADCAST, FN_ALGO_TREE, 2, 0)]), BOTH);
        for ty in [FN_WORK_ALLREDUCE, FN_WORK_ALLGATHER] {
            assert_eq!(on(0, vec![work(ty, FN_ALGO_RING, 0, 0)]), BOTH);
        }
        // Between two ranks the rank that is not the root is both ends of the ring's chain.
        let pair = |rank: usize, works: Vec<fnWork>| {
            let m = launch(works).moves(rank, (1 - rank, 1 - rank));
            (m.sends, m.receives)
        };
        assert_eq!(pair(1, vec![work(FN_WORK_BROADCAST, FN_ALGO_RING, 0, 0)]), R, "a pair's broadcast");
        assert_eq!(pair(1, vec![work(FN_WORK_REDUCE, FN_ALGO_RING, 0, 0)]), S, "a pair's reduce");
        assert_eq!(pair(0, vec![work(FN_WORK_REDUCE, FN_ALGO_RING, 0, 0)]), R, "a pair's reduce root");
        assert_eq!(pair(1, vec![work(FN_WORK_ALLREDUCE, FN_ALGO_RING, 0, 0)]), BOTH);
    }

    /// A launch names the ranks it may send to: a send's peer, the ranks a direct broadcast
    /// lists, a direct reduce's root, the next rank along a ring; any rank for other algorithms.
    #[test]
    fn a_launch_says_which_ranks_it_sends_to() {
        let to = |rank: usize, works: Vec<fnWork>| on_ring_of_4(rank, works).to;
        let bits = |ranks: &[usize]| ranks.iter().fold(0, |m, &r| m | rank_bit(r));
        assert_eq!(to(0, vec![work(FN_WORK_SEND, 0, 1, 0), work(FN_WORK_SEND, 0, 3, 0)]), bits(&[1, 3]));
        assert_eq!(to(0, vec![work(FN_WORK_RECV, 0, 1, 0)]), 0);
        // A direct broadcast's root lists 1, 2, 3 (rank + 1 in each 4 bits), first send lowest.
        assert_eq!(to(0, vec![work(FN_WORK_BROADCAST, FN_ALGO_DIRECT, 0, 0x432)]), bits(&[1, 2, 3]));
        assert_eq!(to(1, vec![work(FN_WORK_BROADCAST, FN_ALGO_DIRECT, 0, 0x3)]), bits(&[2]), "passes it on");
        assert_eq!(to(1, vec![work(FN_WORK_REDUCE, FN_ALGO_DIRECT, 2, 0)]), bits(&[2]));
        assert_eq!(to(1, vec![work(FN_WORK_ALLREDUCE, FN_ALGO_RING, 0, 0)]), bits(&[2]));
        assert_eq!(to(3, vec![work(FN_WORK_REDUCE, FN_ALGO_RING, 2, 0)]), bits(&[0]));
        assert_eq!(to(1, vec![work(FN_WORK_ALLREDUCE, FN_ALGO_TREE, 0, 0)]), u64::MAX);
        assert_eq!(rank_bit(65), rank_bit(1), "ranks share bits modulo 64");
    }
}
