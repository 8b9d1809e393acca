//! Planning copy-engine groups: pure data movement as copies instead of kernels.
//!
//! When every rank of a communicator lives in this process and issued its part of an operation
//! in the same group (`ncclCommInitAll` users: one thread driving every GPU), each rank's buffers
//! are plain unified addresses to the others. A broadcast between two ranks, an all-gather or a
//! send/recv is then a set of `cuMemcpyAsync` copies between user buffers: the copy engines move
//! about 388 GB/s per direction over NVLink against about 362 for SM stores (docs/ARCHITECTURE.md,
//! "Measured constants"), with no kernel, FIFO or flag, and no SM taken from the user's kernels. The tuner prices both ways; the
//! copies replace the kernels when they win for the whole group.
//!
//! Streams are ordered with events: every rank records `Ready` where its stream stands; each rank
//! waits for the `Ready` of every rank it writes to, queues its copies on its own stream (its
//! copy engine pushes) and records `Done`; every rank then waits for the `Done` of every rank that
//! wrote to it. Events cannot join separate stream captures (the usual way to capture one graph per
//! GPU), so a group on a capturing stream runs the kernels. The executor
//! (`comm::launch`) queues the copies and events this module plans.

use super::Member;
use crate::task::{CollKind, CollTask, Task};
use crate::tuner::{self, Allowed};
use crate::types;
use std::collections::HashMap;

crate::int_param!(
    /// FERRONICKEL_COPY_ENGINE: 0 = never use the copy engines, 1 = whenever a group allows it
    /// (tests), unset = when the tuner models them faster.
    copy_engine_mode, "FERRONICKEL_COPY_ENGINE", -1
);

/// Whether copies may replace kernels (FERRONICKEL_COPY_ENGINE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Never,
    Always,
    Tuned,
}

impl Mode {
    pub fn from_env() -> Mode {
        match copy_engine_mode() {
            0 => Mode::Never,
            1 => Mode::Always,
            _ => Mode::Tuned,
        }
    }
}

/// One copy of a group; `from` and `to` index the group's members, and `from` queues it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy {
    pub from: usize,
    pub to: usize,
    pub src: u64,
    pub dst: u64,
    pub bytes: usize,
}

/// A point-to-point operation of one rank: (peer, buffer, bytes).
type P2p = (usize, u64, usize);

/// The copies that carry out a whole group, or why the group runs kernels instead.
pub fn plan(members: &[Member], mode: Mode, allowed: &Allowed) -> std::result::Result<Vec<Copy>, String> {
    match mode {
        Mode::Never => return Err("FERRONICKEL_COPY_ENGINE=0".into()),
        Mode::Tuned if !allowed.copy_engine => return Err("NCCL_ALGO or NCCL_PROTO names what to run".into()),
        _ => {}
    }
    if members.iter().any(|m| !m.limits.copy_engine) {
        return Err("a communicator's ranks are not all connected by P2P".into());
    }
    if members.iter().any(|m| m.ops.iter().any(|(s, _)| *s != m.ops[0].0)) {
        return Err("a rank's operations are on several streams".into());
    }
    let mut cliques: HashMap<u64, Vec<Option<usize>>> = HashMap::new();
    for (i, m) in members.iter().enumerate() {
        let by_rank = cliques.entry(m.key).or_insert_with(|| vec![None; m.shape.nranks]);
        if by_rank.len() != m.shape.nranks {
            return Err("ranks of one communicator disagree on its size".into());
        }
        match by_rank.get_mut(m.shape.rank) {
            Some(slot @ None) => *slot = Some(i),
            _ => return Err("a rank appears twice in the group".into()),
        }
    }
    let (mut copies, mut kernel_us) = (Vec::new(), 0f64);
    for by_rank in cliques.values() {
        let Some(idx) = by_rank.iter().copied().collect::<Option<Vec<usize>>>() else {
            return Err("not every rank of a communicator is in this group".into());
        };
        let clique: Vec<&Member> = idx.iter().map(|&i| &members[i]).collect();
        let us = plan_clique(&clique, &idx, allowed, &mut copies)?;
        kernel_us = kernel_us.max(us);
    }
    // Each rank queues its copies on its own stream, so the group takes as long as its busiest
    // queue.
    let ce_us = (0..members.len())
        .map(|i| {
            let queued = copies.iter().filter(|c| c.from == i);
            let bytes = |remote: bool| queued.clone().filter(|c| (c.to != i) == remote).map(|c| c.bytes).sum();
            tuner::copy_engine_us(bytes(true), bytes(false))
        })
        .fold(0.0, f64::max);
    if mode == Mode::Tuned && ce_us >= kernel_us {
        return Err(format!("kernels modelled faster ({kernel_us:.1} us against {ce_us:.1} us)"));
    }
    Ok(copies)
}

/// Appends the copies of one communicator's operations (`idx`: member index by rank) and returns
/// the modelled time of running them as kernels.
fn plan_clique(
    clique: &[&Member],
    idx: &[usize],
    allowed: &Allowed,
    copies: &mut Vec<Copy>,
) -> std::result::Result<f64, String> {
    let n = clique.len();
    let mismatch = || "the ranks' operations do not match".to_string();
    let colls: Vec<Vec<_>> = clique
        .iter()
        .map(|m| m.ops.iter().filter_map(|(_, t)| if let Task::Coll(c) = t { Some(*c) } else { None }).collect())
        .collect();
    let mut kernel_us = 0.0;
    for k in 0..colls[0].len() {
        let c = colls[0][k];
        let same = |o: &CollTask| (o.kind, o.count, o.dtype, o.root) == (c.kind, c.count, c.dtype, c.root);
        if colls.iter().any(|cs| cs.get(k).is_none_or(|o| !same(o))) {
            return Err(mismatch());
        }
        let elem = types::dtype_size(c.dtype).expect("validated dtype");
        let bytes = c.count * elem;
        if bytes == 0 {
            continue;
        }
        match c.kind {
            CollKind::Broadcast if n <= 2 => {
                let src = colls[c.root][k].send;
                for d in 0..n {
                    copies.push(Copy { from: idx[c.root], to: idx[d], src, dst: colls[d][k].recv, bytes });
                }
            }
            CollKind::AllGather => {
                for (r, from) in colls.iter().enumerate() {
                    for (d, to) in colls.iter().enumerate() {
                        let dst = to[k].recv + (r * bytes) as u64;
                        copies.push(Copy { from: idx[r], to: idx[d], src: from[k].send, dst, bytes });
                    }
                }
            }
            _ => return Err(format!("{:?} on {n} ranks is not pure data movement", c.kind)),
        }
        kernel_us += tuner::coll_us(c.kind, c.count, elem, &clique[0].shape, allowed);
    }
    if colls.iter().any(|cs| cs.len() != colls[0].len()) {
        return Err(mismatch());
    }
    // Send/recv: the k-th send from a to b pairs with b's k-th receive from a (zero-byte ones
    // move nothing, on either path).
    let p2p = |m: &Member, sends: bool| -> Vec<P2p> {
        m.ops
            .iter()
            .filter_map(|(_, t)| match *t {
                Task::Send { buf, bytes, peer } if sends && bytes > 0 => Some((peer, buf, bytes)),
                Task::Recv { buf, bytes, peer } if !sends && bytes > 0 => Some((peer, buf, bytes)),
                _ => None,
            })
            .collect()
    };
    let (sends, recvs): (Vec<_>, Vec<_>) = clique.iter().map(|m| (p2p(m, true), p2p(m, false))).unzip();
    if sends.iter().chain(&recvs).any(|v| v.iter().any(|p| p.0 >= n)) {
        return Err(mismatch());
    }
    let mut egress = vec![0usize; n];
    for a in 0..n {
        for b in 0..n {
            let out: Vec<&P2p> = sends[a].iter().filter(|s| s.0 == b).collect();
            let inc: Vec<&P2p> = recvs[b].iter().filter(|r| r.0 == a).collect();
            if out.len() != inc.len() || out.iter().zip(&inc).any(|(s, r)| s.2 != r.2) {
                return Err(mismatch());
            }
            for (s, r) in out.iter().zip(&inc) {
                copies.push(Copy { from: idx[a], to: idx[b], src: s.1, dst: r.1, bytes: s.2 });
                egress[a] += if a == b { 0 } else { s.2 };
            }
        }
    }
    if egress.iter().any(|&b| b > 0) {
        kernel_us += tuner::p2p_us(egress.into_iter().max().unwrap_or(0));
    }
    // A copy onto itself (in place) moves nothing.
    copies.retain(|c| c.src != c.dst);
    Ok(kernel_us)
}

/// Whether a group is worth planning as copies at all: the cheap tests, which run at every group
/// end (one rank per process, reductions), before any matching.
pub fn candidate(members: &[Member], mode: Mode, allowed: &Allowed) -> bool {
    // A collective on symmetric buffers stays a kernel where the symmetric kernels are forced
    // (FERRONICKEL_SYMMETRIC=1); the tuner never picks them over copies.
    let forced = allowed.symmetric == tuner::Symmetric::Always;
    let movement = |t: &Task| !matches!(t, Task::Coll(c) if (forced && c.sym.is_some()) || !matches!(c.kind, CollKind::Broadcast | CollKind::AllGather));
    mode != Mode::Never
        && !members.iter().any(|m| m.shape.nranks > members.len() || !m.ops.iter().all(|(_, t)| movement(t)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::CUstream;
    use crate::task::{CommShape, DevOp};

    fn shape(rank: usize, nranks: usize) -> CommShape {
        CommShape { rank, ..CommShape::one_host(nranks, 64, 64) }
    }

    fn coll(kind: CollKind, rank: usize, count: usize, root: usize) -> Task {
        let base = 0x1000_0000 * (rank as u64 + 1);
        Task::Coll(CollTask {
            kind,
            send: base,
            recv: base + 0x800_0000,
            count,
            dtype: types::ncclFloat32,
            op: DevOp::plain(0),
            root,
            sym: None,
        })
    }

    fn members<'a>(key: u64, ops: &'a [Vec<(CUstream, Task)>]) -> Vec<Member<'a>> {
        ops.iter()
            .enumerate()
            .map(|(r, o)| Member {
                key,
                shape: shape(r, ops.len()),
                limits: Allowed::ALL,
                p2p_channels: &|_| 64,
                ops: o,
            })
            .collect()
    }

    fn one(kind: CollKind, n: usize, count: usize, root: usize) -> Vec<Vec<(CUstream, Task)>> {
        (0..n).map(|r| vec![(std::ptr::null_mut(), coll(kind, r, count, root))]).collect()
    }

    /// Buffers in symmetric windows keep a group off the copy engines only where the symmetric
    /// kernels are forced: the tuner itself never picks them.
    #[test]
    fn symmetric_buffers_leave_copies_to_the_tuner_unless_symmetric_kernels_are_forced() {
        use crate::task::{SymBuf, SymBufs};
        let mut ops = one(CollKind::AllGather, 2, 1 << 26, 0);
        let sym = SymBufs { send: SymBuf { flat: 1 << 40, stride4g: 1 }, recv: SymBuf { flat: 1 << 41, stride4g: 1 } };
        for o in &mut ops {
            if let Task::Coll(c) = &mut o[0].1 {
                c.sym = Some(sym);
            }
        }
        let m = members(7, &ops);
        let forced = Allowed { symmetric: tuner::Symmetric::Always, ..Allowed::ALL };
        assert!(candidate(&m, Mode::Tuned, &Allowed::ALL));
        assert!(!candidate(&m, Mode::Tuned, &forced));
        assert!(!candidate(&m, Mode::Never, &Allowed::ALL));
    }

    #[test]
    fn communicators_without_p2p_never_copy() {
        let ops = one(CollKind::Broadcast, 2, 1 << 28, 1);
        let mut m = members(7, &ops);
        m[1].limits = Allowed::for_connections(2, true, false);
        for mode in [Mode::Always, Mode::Tuned] {
            let e = plan(&m, mode, &Allowed::ALL).unwrap_err();
            assert!(e.contains("not all connected by P2P"), "{e}");
        }
    }

    #[test]
    fn broadcast_between_two_ranks_is_one_push_and_a_local_copy() {
        let ops = one(CollKind::Broadcast, 2, 1000, 1);
        let c = plan(&members(7, &ops), Mode::Always, &Allowed::ALL).unwrap();
        assert_eq!(
            c,
            [
                Copy { from: 1, to: 0, src: 0x2000_0000, dst: 0x1800_0000, bytes: 4000 },
                Copy { from: 1, to: 1, src: 0x2000_0000, dst: 0x2800_0000, bytes: 4000 },
            ]
        );
        // More ranks: the root would push the whole buffer to each; the ring forwards it.
        assert!(plan(&members(7, &one(CollKind::Broadcast, 3, 1000, 0)), Mode::Always, &Allowed::ALL).is_err());
    }

    #[test]
    fn all_gather_puts_each_chunk_at_its_rank() {
        let ops = one(CollKind::AllGather, 3, 10, 0);
        let c = plan(&members(7, &ops), Mode::Always, &Allowed::ALL).unwrap();
        assert_eq!(c.len(), 9);
        assert!(c.contains(&Copy { from: 2, to: 0, src: 0x3000_0000, dst: 0x1800_0000 + 80, bytes: 40 }));
        // In place (send = recv + rank * chunk): the own chunk is not copied.
        let mut ops = ops;
        for (r, o) in ops.iter_mut().enumerate() {
            if let Task::Coll(c) = &mut o[0].1 {
                c.send = c.recv + 40 * r as u64;
            }
        }
        assert_eq!(plan(&members(7, &ops), Mode::Always, &Allowed::ALL).unwrap().len(), 6);
    }

    #[test]
    fn sends_pair_with_receives_in_order() {
        let s = std::ptr::null_mut();
        let ops = vec![
            vec![
                (s, Task::Send { buf: 1, bytes: 8, peer: 1 }),
                (s, Task::Send { buf: 2, bytes: 16, peer: 1 }),
                (s, Task::Recv { buf: 3, bytes: 0, peer: 1 }),
            ],
            vec![(s, Task::Recv { buf: 4, bytes: 8, peer: 0 }), (s, Task::Recv { buf: 5, bytes: 16, peer: 0 })],
        ];
        let c = plan(&members(7, &ops), Mode::Always, &Allowed::ALL).unwrap();
        assert_eq!(
            c,
            [Copy { from: 0, to: 1, src: 1, dst: 4, bytes: 8 }, Copy { from: 0, to: 1, src: 2, dst: 5, bytes: 16 }]
        );
        let bad = vec![
            ops[0].clone(),
            vec![(s, Task::Recv { buf: 4, bytes: 16, peer: 0 }), (s, Task::Recv { buf: 5, bytes: 8, peer: 0 })],
        ];
        assert!(plan(&members(7, &bad), Mode::Always, &Allowed::ALL).is_err());
    }

    #[test]
    fn groups_that_cannot_use_copies() {
        let all = Allowed::ALL;
        // A missing rank, a reduction, another stream, forced protocols, the switch.
        let ops = one(CollKind::AllGather, 2, 10, 0);
        assert!(plan(&members(7, &ops)[..1], Mode::Always, &all).is_err());
        let mut m = members(7, &ops);
        m[1].shape = shape(1, 3);
        assert!(plan(&m, Mode::Always, &all).is_err());
        assert!(plan(&members(7, &one(CollKind::AllReduce, 2, 10, 0)), Mode::Always, &all).is_err());
        let two_streams = vec![vec![
            (std::ptr::null_mut(), coll(CollKind::AllGather, 0, 10, 0)),
            (8 as CUstream, coll(CollKind::AllGather, 0, 10, 0)),
        ]];
        assert!(plan(&members(7, &two_streams), Mode::Always, &all).is_err());
        let forced = Allowed { copy_engine: false, ..Allowed::ALL };
        assert!(plan(&members(7, &ops), Mode::Tuned, &forced).is_err());
        assert!(plan(&members(7, &ops), Mode::Always, &forced).is_ok());
        assert!(plan(&members(7, &ops), Mode::Never, &all).is_err());
        // Two communicators in one group plan independently.
        let mut both = members(7, &ops);
        both.extend(members(9, &ops));
        let c = plan(&both, Mode::Always, &all).unwrap();
        assert!(c.iter().any(|c| c.from == 3 && c.to == 2));
    }

    /// Copies win where a rank only pushes: large send/recv and in-place broadcasts. Where the
    /// root or a rank also copies within its GPU, on the same stream after its push, the kernels
    /// (which write both in one pass) stay ahead, as measured on 2× H200 (src/tuner.rs,
    /// `CE_LOCAL_GBPS`).
    #[test]
    fn tuner_picks_copies_where_a_rank_only_pushes() {
        let tuned = |kind, count, in_place: bool| {
            let mut ops = one(kind, 2, count, 0);
            for (r, o) in ops.iter_mut().enumerate() {
                if let Task::Coll(c) = &mut o[0].1 {
                    if in_place {
                        c.send = c.recv + if kind == CollKind::AllGather { (4 * count * r) as u64 } else { 0 };
                    }
                }
            }
            plan(&members(7, &ops), Mode::Tuned, &Allowed::ALL).is_ok()
        };
        assert!(!tuned(CollKind::Broadcast, 1 << 10, true));
        assert!(tuned(CollKind::Broadcast, 1 << 28, true));
        assert!(!tuned(CollKind::Broadcast, 1 << 28, false));
        assert!(tuned(CollKind::AllGather, 1 << 27, true));
        assert!(!tuned(CollKind::AllGather, 1 << 27, false));
        let sr = |bytes| {
            let s = std::ptr::null_mut();
            let ops = vec![
                vec![(s, Task::Send { buf: 1, bytes, peer: 1 }), (s, Task::Recv { buf: 2, bytes, peer: 1 })],
                vec![(s, Task::Send { buf: 3, bytes, peer: 0 }), (s, Task::Recv { buf: 4, bytes, peer: 0 })],
            ];
            plan(&members(7, &ops), Mode::Tuned, &Allowed::ALL).is_ok()
        };
        assert!(!sr(1 << 20));
        assert!(sr(1 << 30));
    }
}
