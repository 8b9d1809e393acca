//! Which connections a communicator makes, and their FIFO sizes: what every transport shares.
//! Ring neighbours get every ring channel; other pairs of one host and the trees' edges get
//! `NCCL_NCHANNELS_PER_PEER` channels at init; send/recv peers on other hosts connect when first
//! used (docs/ARCHITECTURE.md, "Scale").

use crate::abi::{FN_MAX_CHANNELS, FN_NSTEPS};
use crate::topo::tree::Trees;
use std::collections::HashSet;

/// Which connections exist after init: ring neighbours get every ring channel; the other pairs
/// that [`InitPairs`] names get `p2p_channels`; the rest (send/recv peers on other hosts) connect
/// when a group first needs them (`transport::Connections::connect_runtime`). Symmetric, and the
/// same on every rank, so both ends of a pair agree and any rank can lay out any peer's arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnPlan {
    pub nranks: usize,
    pub ring_channels: usize,
    pub p2p_channels: usize,
    /// What the user asked for a send/recv with a peer on another host (the config's
    /// `nChannelsPerNetPeer`, NCCL_NCHANNELS_PER_NET_PEER): such a peer connected when first
    /// needed gets that many channels, and a message to one connected at init splits over no more.
    /// `None`: `p2p_channels`, and every channel of a connection made at init.
    pub net_peer_channels: Option<usize>,
    /// The ring order shared by every channel.
    pub order: Vec<usize>,
    /// Bytes of one connection's Simple FIFO (NCCL_BUFFSIZE).
    pub fifo_bytes: usize,
    pub init_pairs: InitPairs,
    /// Each rank's position in `order`.
    pos: Vec<usize>,
}

/// Which pairs off the ring connect at init (NCCL connects send/recv peers at runtime).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitPairs {
    /// Every pair (`NCCL_RUNTIME_CONNECT=0`).
    All,
    /// Ranks of one host (`host[r]`: rank r's host index), whose connections cost GPU or host
    /// memory only and which the one-shot all-reduce may need, and the trees' edges between hosts
    /// (`(a, b)` with a < b).
    HostsAndTrees { host: Vec<u32>, edges: HashSet<(u32, u32)> },
}

impl InitPairs {
    /// The ranks of each host and the trees' edges between hosts.
    pub fn hosts_and_trees(trees: &Trees) -> InitPairs {
        let edges = trees.host_edges().into_iter().map(|(a, b)| (a as u32, b as u32)).collect();
        InitPairs::HostsAndTrees { host: trees.host_places().into_iter().map(|(h, _)| h).collect(), edges }
    }

    fn connects(&self, a: usize, b: usize) -> bool {
        match self {
            InitPairs::All => true,
            InitPairs::HostsAndTrees { host, edges } => {
                host[a] == host[b] || edges.contains(&(a.min(b) as u32, a.max(b) as u32))
            }
        }
    }
}

impl ConnPlan {
    pub fn new(
        ring_channels: usize,
        p2p_channels: usize,
        order: Vec<usize>,
        fifo_bytes: usize,
        init_pairs: InitPairs,
    ) -> ConnPlan {
        let mut pos = vec![0; order.len()];
        for (i, &r) in order.iter().enumerate() {
            pos[r] = i;
        }
        let net_peer_channels = None;
        ConnPlan {
            nranks: order.len(),
            ring_channels,
            p2p_channels,
            net_peer_channels,
            order,
            fifo_bytes,
            init_pairs,
            pos,
        }
    }

    /// A communicator's plan: `ring_channels` on the ring `order`, `trees` between its hosts,
    /// `net_peer_channels` as the user asked for them, and the environment's
    /// NCCL_NCHANNELS_PER_PEER, NCCL_BUFFSIZE and NCCL_RUNTIME_CONNECT.
    pub fn from_env(
        ring_channels: usize,
        order: Vec<usize>,
        trees: &Trees,
        net_peer_channels: Option<usize>,
    ) -> ConnPlan {
        let init_pairs = if runtime_connect() == 0 { InitPairs::All } else { InitPairs::hosts_and_trees(trees) };
        let p2p_channels = p2p_nchannels().clamp(1, FN_MAX_CHANNELS as i64) as usize;
        let plan = ConnPlan::new(ring_channels, p2p_channels, order, fifo_bytes(buffsize()), init_pairs);
        ConnPlan { net_peer_channels, ..plan }
    }

    /// Channels of a send/recv peer on another host that connects when a group first needs it:
    /// the user's NET peer channels, else `p2p_channels`; at most what one NET pair connects.
    pub fn runtime_channels(&self) -> usize {
        self.net_peer_channels.unwrap_or(self.p2p_channels).clamp(1, NET_MAX_CHANNELS)
    }

    /// Channels a send/recv with `peer` splits over, `connected` being its connection's: for a
    /// peer on another host (`over_net`) no more than the user asked for such peers.
    pub fn p2p_split(&self, connected: usize, over_net: bool) -> usize {
        match (over_net, self.net_peer_channels) {
            (true, Some(n)) => connected.min(n),
            _ => connected,
        }
    }

    /// Rank `r`'s neighbours in the ring every channel shares: (previous, next).
    pub fn ring_neighbours(&self, r: usize) -> (usize, usize) {
        let n = self.order.len();
        (self.order[(self.pos[r] + n - 1) % n], self.order[(self.pos[r] + 1) % n])
    }

    /// Whether `a` and `b` are neighbours in the ring.
    fn adjacent(&self, a: usize, b: usize) -> bool {
        let (prev, next) = self.ring_neighbours(a);
        b == prev || b == next
    }

    /// Channels connecting ranks `a` and `b` at init (0 for a == b, and for a pair left to
    /// connect at runtime).
    pub fn channels(&self, a: usize, b: usize) -> usize {
        if a == b {
            0
        } else if self.adjacent(a, b) {
            self.ring_channels.max(self.p2p_channels)
        } else if self.init_pairs.connects(a, b) {
            self.p2p_channels
        } else {
            0
        }
    }

    /// Channels that connect every pair a one-shot all-reduce or a tree edge joins (0 for one
    /// rank): with four ranks or more some such pair is not adjacent in the ring and has only
    /// `p2p_channels`. Pairs left to connect at runtime are on different hosts, where neither
    /// runs (host-memory FIFOs rule the one-shot out there, `tuner::Allowed::for_connections`).
    pub fn all_pairs_channels(&self) -> usize {
        match self.nranks {
            0 | 1 => 0,
            2 | 3 => self.ring_channels.max(self.p2p_channels),
            _ => self.p2p_channels,
        }
    }

    /// Bytes of one FIFO slot.
    pub fn slot_bytes(&self) -> usize {
        self.fifo_bytes / FN_NSTEPS as usize
    }
}

/// Channels a communicator with NET connections uses at most (`transport::net::conn`), and a
/// NET peer connected at runtime: each is one connection per peer, a socket per connection, and
/// one more poll per round of the proxy thread.
pub const NET_MAX_CHANNELS: usize = 8;

crate::int_param!(
    /// NCCL_BUFFSIZE: bytes of one connection FIFO (all its slots).
    buffsize, "NCCL_BUFFSIZE", 4 << 20
);
crate::int_param!(
    /// NCCL_RUNTIME_CONNECT: 1 (the default, as in NCCL) connects send/recv peers on other hosts
    /// when a group first needs them; 0 connects every pair at init.
    runtime_connect, "NCCL_RUNTIME_CONNECT", 1
);
crate::int_param!(
    /// NCCL_NCHANNELS_PER_PEER: channels to a peer that is not a ring neighbour (ring neighbours
    /// get every channel); a large send/recv is split over them.
    p2p_nchannels, "NCCL_NCHANNELS_PER_PEER", 4
);

/// FIFO bytes rounded so each slot is a multiple of 16 bytes, at least 64 KiB in total and at most
/// 4 GiB (a slot's size must fit below `FN_SIZE_PROTO_SHIFT` in a proxy's size word).
pub fn fifo_bytes(requested: i64) -> usize {
    let steps = FN_NSTEPS as usize;
    let req = usize::try_from(requested).unwrap_or(0).clamp(64 << 10, 4 << 30);
    req / (steps * 16) * steps * 16
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n: usize, ring: usize, p2p: usize) -> ConnPlan {
        ConnPlan::new(ring, p2p, (0..n).collect(), 1 << 16, InitPairs::All)
    }

    /// The user's NET peer channels (`nChannelsPerNetPeer`): send/recv peers on other hosts that
    /// connect at runtime get that many (at most what one NET pair connects), and messages to
    /// any peer on another host split over no more; unset, runtime peers get NCCL_NCHANNELS_PER_PEER's
    /// channels (also bounded by NET's) and connections made at init all theirs.
    #[test]
    fn net_peer_channels_bound_send_recv_across_hosts() {
        let unset = plan(4, 4, 4);
        assert_eq!(unset.runtime_channels(), 4);
        assert_eq!((unset.p2p_split(4, true), unset.p2p_split(4, false)), (4, 4));
        let many = plan(4, 4, 64);
        assert_eq!(many.runtime_channels(), NET_MAX_CHANNELS);
        let one = ConnPlan { net_peer_channels: Some(1), ..plan(4, 4, 4) };
        assert_eq!(one.runtime_channels(), 1);
        assert_eq!((one.p2p_split(4, true), one.p2p_split(4, false)), (1, 4));
        let wide = ConnPlan { net_peer_channels: Some(16), ..plan(4, 2, 4) };
        assert_eq!(wide.runtime_channels(), NET_MAX_CHANNELS);
        assert_eq!(wide.p2p_split(2, true), 2, "no more than a connection made at init has");
    }

    #[test]
    fn channels_are_symmetric() {
        let p = plan(5, 4, 1);
        for a in 0..5 {
            for b in 0..5 {
                assert_eq!(p.channels(a, b), p.channels(b, a));
            }
        }
        assert_eq!(p.channels(0, 1), 4);
        assert_eq!(p.channels(0, 4), 4);
        assert_eq!(p.channels(0, 2), 1);
        assert_eq!(p.channels(2, 2), 0);
    }

    /// A rank's neighbours follow the ring order, not the rank numbers, and wrap around; they
    /// are the pairs `channels` connects as neighbours.
    #[test]
    fn ring_neighbours_follow_the_order() {
        let p = ConnPlan::new(4, 1, vec![2, 0, 3, 1], 1 << 16, InitPairs::All);
        assert_eq!([0, 1, 2, 3].map(|r| p.ring_neighbours(r)), [(2, 3), (3, 2), (1, 0), (0, 1)]);
        for r in 0..4 {
            let (prev, next) = p.ring_neighbours(r);
            assert!(p.adjacent(r, prev) && p.adjacent(r, next));
        }
        assert_eq!(plan(2, 4, 1).ring_neighbours(1), (0, 0));
    }

    /// What init connects at 1,024 hosts of 8 GPUs (8,192 ranks): each rank's ring neighbours,
    /// the other ranks of its host and its tree edges, a bounded number whatever the size; both
    /// ends of every pair agree; every tree edge the Tree kernels use is connected on the tree's
    /// channels. Send/recv peers elsewhere wait for runtime, unless NCCL_RUNTIME_CONNECT=0.
    #[test]
    fn init_connects_a_bounded_set_at_1024_hosts_of_8() {
        let (hosts, gpus) = (1024, 8);
        let n = hosts * gpus;
        let host_of: Vec<usize> = (0..n).map(|r| r / gpus).collect();
        let order: Vec<usize> = (0..n).collect();
        let trees = Trees::new(&order, &host_of);
        let plan = ConnPlan::new(8, 4, order.clone(), 1 << 16, InitPairs::hosts_and_trees(&trees));
        let mut most = 0;
        for a in 0..n {
            let mut peers = 0;
            for b in 0..n {
                let c = plan.channels(a, b);
                if c > 0 {
                    assert_eq!(c, plan.channels(b, a), "{a} <-> {b}");
                    peers += 1;
                }
            }
            // 7 on the host (the ring neighbours among them, or one on the next host), and as a
            // host's first rank up to a parent and two children in each of the two trees.
            assert!((gpus - 1..=gpus - 1 + 1 + 6).contains(&peers), "rank {a}: {peers} peers at init");
            most = most.max(peers);
            for which in 0..2 {
                let t = trees.rank_tree(which, a);
                for p in t.up.into_iter().chain(t.down) {
                    assert!(plan.channels(a, p) >= plan.all_pairs_channels(), "tree edge {a} - {p}");
                }
            }
        }
        assert!(most > gpus, "some host heads have tree edges off the ring");
        // A pair on two hosts that are neither neighbours nor joined by a tree: runtime.
        let (a, b) = (3, 5 * gpus + 3);
        assert_eq!(plan.channels(a, b), 0);
        let eager = ConnPlan::new(8, 4, order, 1 << 16, InitPairs::All);
        assert_eq!(eager.channels(a, b), 4);
        assert_eq!(eager.all_pairs_channels(), plan.all_pairs_channels());
    }

    #[test]
    fn all_pairs_channels_is_the_smallest_pair() {
        for n in 1..9 {
            for (ring, p2p) in [(8, 4), (4, 8), (64, 4)] {
                let p = plan(n, ring, p2p);
                let brute = (0..n).flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)));
                let want = brute.map(|(a, b)| p.channels(a, b)).min().unwrap_or(0);
                assert_eq!(p.all_pairs_channels(), want, "n={n} ring={ring} p2p={p2p}");
            }
        }
    }

    #[test]
    fn fifo_sizes() {
        assert_eq!(fifo_bytes(4 << 20), 4 << 20);
        assert_eq!(fifo_bytes(1), 64 << 10);
        assert_eq!(fifo_bytes((4 << 20) + 5) % (8 * 16), 0);
        assert!(fifo_bytes(i64::MAX) / (FN_NSTEPS as usize) < 1 << crate::abi::FN_SIZE_PROTO_SHIFT);
    }
}
