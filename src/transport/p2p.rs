//! P2P transport: connection FIFOs in GPU memory, written directly by the sending GPU.
//!
//! Every rank allocates one arena holding, for each P2P connection it takes part in, the flag its
//! sender writes (tail), the flag its receiver writes back (head, kept on the sender's side) and
//! the FIFOs themselves (on the receiver): one per protocol, LL128's first so its 128-byte lines
//! stay 128-byte aligned ([`ArenaLayout`], which SHM reuses in host memory). Peers reach the
//! arena through a plain pointer (same process, with peer access enabled) or a CUDA IPC mapping
//! (another process). This module also holds what every transport shares: which connections
//! exist ([`ConnPlan`]) and the FIFO sizes.

use super::Kind;
use crate::abi::{
    fnConn, fnConnRecv, fnConnSend, FN_LL128_SLOT_LINES, FN_LL_SLOT_LINES, FN_MAX_CHANNELS, FN_NSTEPS, FN_PROTO_LL,
    FN_PROTO_LL128, FN_PROTO_SIMPLE,
};
use crate::cuda::{self, Context, DeviceBuffer, IpcMapping};
use crate::error::{Error, Result};
use crate::topo::tree::Trees;
use crate::topo::PeerInfo;
use std::collections::HashSet;

/// Flags sit on their own 128-byte line so a poller never shares a line with data.
pub const FLAG_STRIDE: usize = 128;
/// Bytes of one connection's LL128 FIFO, then of its LL FIFO (sizes fixed by the kernels).
const LL128_FIFO_BYTES: usize = FN_NSTEPS as usize * FN_LL128_SLOT_LINES as usize * 128;
const LL_FIFO_BYTES: usize = FN_NSTEPS as usize * FN_LL_SLOT_LINES as usize * 16;

/// Which connections exist after init: ring neighbours get every ring channel; the other pairs
/// that [`InitPairs`] names get `p2p_channels`; the rest (send/recv peers on other hosts) connect
/// when a group first needs them (`transport::Connections::connect_runtime`). Symmetric, and the
/// same on every rank, so both ends of a pair agree and any rank can lay out any peer's arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnPlan {
    pub nranks: usize,
    pub ring_channels: usize,
    pub p2p_channels: usize,
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
        InitPairs::HostsAndTrees { host: trees.host_index(), edges }
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
        ConnPlan { nranks: order.len(), ring_channels, p2p_channels, order, fifo_bytes, init_pairs, pos }
    }

    /// A communicator's plan: `ring_channels` on the ring `order`, `trees` between its hosts, and
    /// the environment's NCCL_NCHANNELS_PER_PEER, NCCL_BUFFSIZE and NCCL_RUNTIME_CONNECT.
    pub fn from_env(ring_channels: usize, order: Vec<usize>, trees: &Trees) -> ConnPlan {
        let init_pairs = if runtime_connect() == 0 { InitPairs::All } else { InitPairs::hosts_and_trees(trees) };
        let p2p_channels = p2p_nchannels().clamp(1, FN_MAX_CHANNELS as i64) as usize;
        ConnPlan::new(ring_channels, p2p_channels, order, fifo_bytes(buffsize()), init_pairs)
    }

    /// Whether `a` and `b` are neighbours in the ring.
    fn adjacent(&self, a: usize, b: usize) -> bool {
        let n = self.order.len();
        let (pa, pb) = (self.pos[a], self.pos[b]);
        (pa + 1) % n == pb || (pb + 1) % n == pa
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

/// Where one rank's connections of one kind sit in its arena (P2P: device memory; SHM: the
/// same layout in shared host memory): for each connection with a peer of that kind, the head
/// it keeps as a sender, the tail it keeps as a receiver (each on its own line), and its receive
/// FIFO of every protocol. A pure function of the plan and the owner's kinds, so a peer can
/// compute any offset in our arena.
pub struct ArenaLayout<'a> {
    plan: &'a ConnPlan,
    owner: usize,
    /// The owner's kind for each peer.
    kinds: &'a [Kind],
    kind: Kind,
}

impl<'a> ArenaLayout<'a> {
    pub fn new(plan: &'a ConnPlan, owner: usize, kinds: &'a [Kind], kind: Kind) -> ArenaLayout<'a> {
        ArenaLayout { plan, owner, kinds, kind }
    }

    /// Channels to `peer` held in this arena.
    fn channels(&self, peer: usize) -> usize {
        if self.kinds[peer] == self.kind {
            self.plan.channels(self.owner, peer)
        } else {
            0
        }
    }

    /// Index of connection (peer, channel) among the arena's connections.
    fn slot(&self, peer: usize, ch: usize) -> usize {
        (0..peer).map(|p| self.channels(p)).sum::<usize>() + ch
    }

    fn nslots(&self) -> usize {
        (0..self.plan.nranks).map(|p| self.channels(p)).sum()
    }

    /// Bytes of one connection's FIFOs, all protocols.
    fn conn_fifo_bytes(&self) -> usize {
        LL128_FIFO_BYTES + LL_FIFO_BYTES + self.plan.fifo_bytes
    }

    /// Offsets of the connection with `peer` on `ch`: (head, tail, receive FIFO of each
    /// protocol by fnProto).
    pub fn offsets(&self, peer: usize, ch: usize) -> (usize, usize, [usize; 3]) {
        let k = self.slot(peer, ch);
        let n = self.nslots();
        let fifo = 2 * n * FLAG_STRIDE + k * self.conn_fifo_bytes();
        let mut fifos = [0; 3];
        fifos[FN_PROTO_LL128 as usize] = fifo;
        fifos[FN_PROTO_LL as usize] = fifo + LL128_FIFO_BYTES;
        fifos[FN_PROTO_SIMPLE as usize] = fifo + LL128_FIFO_BYTES + LL_FIFO_BYTES;
        (k * FLAG_STRIDE, (n + k) * FLAG_STRIDE, fifos)
    }

    /// Bytes of the whole arena (0: no connection of this kind).
    pub fn bytes(&self) -> usize {
        let n = self.nslots();
        2 * n * FLAG_STRIDE + n * self.conn_fifo_bytes()
    }
}

/// Connection (peer, ch) between two arenas of one kind: `ours` (owner: us) at `mine` and the
/// peer's `theirs` at `peer_base`, both as our GPU addresses them. We send into the peer's FIFO
/// and tail and keep our head; we receive in our FIFO and tail and write the peer's head.
pub fn arena_conn(
    ours: &ArenaLayout,
    theirs: &ArenaLayout,
    mine: u64,
    peer_base: u64,
    ch: usize,
    flags: u32,
) -> fnConn {
    let (my_head, my_tail, my_fifo) = ours.offsets(theirs.owner, ch);
    let (peer_head, peer_tail, peer_fifo) = theirs.offsets(ours.owner, ch);
    fnConn {
        send: fnConnSend {
            buffs: peer_fifo.map(|o| (peer_base + o as u64) as *mut _),
            tail: (peer_base + peer_tail as u64) as *mut _,
            head: (mine + my_head as u64) as *mut _,
            flags,
            ..Default::default()
        },
        recv: fnConnRecv {
            buffs: my_fifo.map(|o| (mine + o as u64) as *mut _),
            tail: (mine + my_tail as u64) as *mut _,
            head: (peer_base + peer_head as u64) as *mut _,
            flags,
            ..Default::default()
        },
    }
}

/// What a rank publishes about its arena.
#[derive(Debug, Clone, Copy)]
pub struct ArenaAddr {
    pub ptr: u64,
    pub ipc: [u8; 64],
}

impl ArenaAddr {
    pub const BYTES: usize = 8 + 64;

    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.ptr.to_le_bytes().to_vec();
        v.extend_from_slice(&self.ipc);
        v
    }

    pub fn decode(b: &[u8]) -> Result<ArenaAddr> {
        if b.len() != Self::BYTES {
            return Err(Error::Internal(format!("arena address of {} bytes, expected {}", b.len(), Self::BYTES)));
        }
        Ok(ArenaAddr { ptr: u64::from_le_bytes(b[..8].try_into().unwrap()), ipc: b[8..].try_into().unwrap() })
    }
}

/// Our arena and our views of the peers' arenas.
pub struct P2pTransport {
    /// None when we have no P2P connection.
    _arena: Option<DeviceBuffer>,
    /// IPC mappings of other processes' arenas, kept open while we use them.
    _mappings: Vec<IpcMapping>,
    /// Base address of each rank's arena as seen from our GPU (0 where unused).
    pub bases: Vec<u64>,
}

impl P2pTransport {
    /// Allocates our arena (current context = ours) and returns what peers need to reach it.
    pub fn allocate(layout: &ArenaLayout) -> Result<(Option<DeviceBuffer>, ArenaAddr)> {
        if layout.bytes() == 0 {
            return Ok((None, ArenaAddr { ptr: 0, ipc: [0; 64] }));
        }
        let arena = DeviceBuffer::zeroed(layout.bytes())?;
        let ipc = arena.ipc_handle()?;
        let addr = ArenaAddr { ptr: arena.ptr, ipc };
        Ok((Some(arena), addr))
    }

    /// Maps the arena of every peer we reach over P2P into our address space (`kinds[r][p]`:
    /// rank r's kind for peer p, the same for both ends).
    pub fn connect(
        arena: Option<DeviceBuffer>,
        rank: usize,
        me: &PeerInfo,
        peers: &[PeerInfo],
        addrs: &[ArenaAddr],
        plan: &ConnPlan,
        kinds: &[Vec<Kind>],
    ) -> Result<P2pTransport> {
        let mut mappings = Vec::new();
        let mut bases = vec![0u64; peers.len()];
        bases[rank] = arena.as_ref().map_or(0, |a| a.ptr);
        for (p, info) in peers.iter().enumerate() {
            if p == rank || kinds[rank][p] != Kind::P2p || plan.channels(rank, p) == 0 {
                continue;
            }
            if me.same_process(info) {
                if info.dev != me.dev {
                    let peer_ctx: Context = cuda::primary_context(info.dev)?;
                    cuda::enable_peer_access(&peer_ctx)?;
                }
                bases[p] = addrs[p].ptr;
            } else {
                let m =
                    IpcMapping::open(&addrs[p].ipc).map_err(|e| e.context(&format!("mapping rank {p}'s buffers")))?;
                bases[p] = m.ptr;
                mappings.push(m);
            }
        }
        Ok(P2pTransport { _arena: arena, _mappings: mappings, bases })
    }
}

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

    /// Rank r's kind for peer p: SHM between ranks whose sum is odd, P2P otherwise.
    fn mixed(n: usize) -> Vec<Vec<Kind>> {
        (0..n).map(|r| (0..n).map(|p| if (r + p) % 2 == 1 { Kind::Shm } else { Kind::P2p }).collect()).collect()
    }

    #[test]
    fn offsets_never_overlap_and_fit() {
        for n in 1..7 {
            let p = plan(n, 3, 2);
            let kinds = mixed(n);
            for (owner, own_kinds) in kinds.iter().enumerate() {
                for kind in [Kind::P2p, Kind::Shm] {
                    let l = ArenaLayout::new(&p, owner, own_kinds, kind);
                    let mut seen = std::collections::HashSet::new();
                    let mut conns = 0;
                    for peer in (0..n).filter(|&q| own_kinds[q] == kind) {
                        for ch in 0..p.channels(owner, peer) {
                            conns += 1;
                            let (h, t, f) = l.offsets(peer, ch);
                            assert!(seen.insert(h) && seen.insert(t) && f.iter().all(|&o| seen.insert(o)));
                            assert!(h + 8 <= FLAG_STRIDE * (h / FLAG_STRIDE + 1) && t % FLAG_STRIDE == 0);
                            assert!(f[FN_PROTO_SIMPLE as usize] + p.fifo_bytes <= l.bytes());
                            // LL128 lines must not straddle 128-byte lines.
                            assert!(f.iter().all(|o| o % 128 == 0));
                        }
                    }
                    // Only the connections of its kind: nothing else takes memory.
                    assert_eq!(l.bytes(), conns * (2 * FLAG_STRIDE + l.conn_fifo_bytes()), "n={n} owner={owner}");
                }
            }
        }
    }

    #[test]
    fn both_halves_meet() {
        // Every rank's arena at its own base, as one address space sees them (same process).
        let n = 5;
        let p = plan(n, 3, 2);
        let kinds = mixed(n);
        let base = |r: usize| 0x1_0000_0000u64 * (r as u64 + 1);
        let conn = |a: usize, b: usize, ch: usize| {
            let k = kinds[a][b];
            let ours = ArenaLayout::new(&p, a, &kinds[a], k);
            let theirs = ArenaLayout::new(&p, b, &kinds[b], k);
            arena_conn(&ours, &theirs, base(a), base(b), ch, 7)
        };
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                for ch in 0..p.channels(a, b) {
                    let (ab, ba) = (conn(a, b, ch), conn(b, a, ch));
                    assert_eq!(ab.send.buffs, ba.recv.buffs);
                    assert_eq!(ab.send.tail, ba.recv.tail);
                    assert_eq!(ab.send.head, ba.recv.head);
                    assert_eq!((ab.send.flags, ab.recv.flags), (7, 7));
                    // What we write lies in the receiver's arena, what we poll in ours.
                    let layout_b = ArenaLayout::new(&p, b, &kinds[b], kinds[a][b]);
                    let in_b = |x: u64| x >= base(b) && x < base(b) + layout_b.bytes() as u64;
                    assert!(in_b(ab.send.tail as u64) && ab.send.buffs.iter().all(|&f| in_b(f as u64)));
                    assert!(!in_b(ab.send.head as u64));
                }
            }
        }
    }

    #[test]
    fn arena_addr_round_trip() {
        let a = ArenaAddr { ptr: 0x7f00_1234_0000, ipc: [7; 64] };
        let b = ArenaAddr::decode(&a.encode()).unwrap();
        assert_eq!((a.ptr, a.ipc), (b.ptr, b.ipc));
    }

    #[test]
    fn fifo_sizes() {
        assert_eq!(fifo_bytes(4 << 20), 4 << 20);
        assert_eq!(fifo_bytes(1), 64 << 10);
        assert_eq!(fifo_bytes((4 << 20) + 5) % (8 * 16), 0);
        assert!(fifo_bytes(i64::MAX) / (FN_NSTEPS as usize) < 1 << crate::abi::FN_SIZE_PROTO_SHIFT);
    }
}
