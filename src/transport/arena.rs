//! The arena: where one rank keeps its connections of one kind, P2P's in device memory and
//! SHM's in shared host memory, in one layout that any rank can compute for any other.

use super::conn_plan::ConnPlan;
use super::{fifo, Kind, Pairs};
use crate::abi::{fnConn, fnConnRecv, fnConnSend, FN_NUM_PROTOS};

/// Flags sit on their own 128-byte line so a poller never shares a line with data.
pub const FLAG_STRIDE: usize = 128;

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
        fifo::bytes(self.plan.slot_bytes())
    }

    /// Offsets of the connection with `peer` on `ch`: (head, tail, receive FIFO of each
    /// protocol by fnProto).
    pub fn offsets(&self, peer: usize, ch: usize) -> (usize, usize, [usize; FN_NUM_PROTOS as usize]) {
        let k = self.slot(peer, ch);
        let n = self.nslots();
        let fifos = 2 * n * FLAG_STRIDE + k * self.conn_fifo_bytes();
        let fifos = std::array::from_fn(|p| fifos + fifo::offset(p as u32, self.plan.slot_bytes()));
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
    // (FIFOs, tail, head) of each half, as our GPU addresses them.
    let send = (peer_fifo.map(|o| at(peer_base, o)), at(peer_base, peer_tail), at(mine, my_head));
    let recv = (my_fifo.map(|o| at(mine, o)), at(mine, my_tail), at(peer_base, peer_head));
    fnConn {
        send: fnConnSend { buffs: send.0, tail: send.1, head: send.2, flags, ..Default::default() },
        recv: fnConnRecv { buffs: recv.0, tail: recv.1, head: recv.2, flags, ..Default::default() },
    }
}

/// The address `off` bytes into an arena at `base`.
fn at<T>(base: u64, off: usize) -> *mut T {
    (base + off as u64) as *mut T
}

/// Our connection with `peer` on `ch` between two arenas of `kind` whose bases, as our GPU
/// addresses them, are `bases` (by rank): what a P2P or SHM transport gives the kernels.
pub fn pair_conn(pairs: &Pairs, kind: Kind, bases: &[u64], peer: usize, ch: usize, flags: u32) -> fnConn {
    let ours = ArenaLayout::new(pairs.plan, pairs.rank, &pairs.kinds[pairs.rank], kind);
    let theirs = ArenaLayout::new(pairs.plan, peer, &pairs.kinds[peer], kind);
    arena_conn(&ours, &theirs, bases[pairs.rank], bases[peer], ch, flags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::FN_PROTO_SIMPLE;
    use crate::transport::conn_plan::InitPairs;

    fn plan(n: usize, ring: usize, p2p: usize) -> ConnPlan {
        ConnPlan::new(ring, p2p, (0..n).collect(), 1 << 16, InitPairs::All)
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
}
