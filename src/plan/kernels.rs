//! From queued operations to kernel launches: one launch per run of collectives that share a
//! kernel (same dtype and op) and stream, and one launch for all of a communicator's sends and
//! receives in a group, so that they progress together whatever order the ranks issued them in
//! (several, by rounds of NCCL's schedule, where they are more than one launch carries).

use crate::abi::{self, fnWork, FN_MAX_WORKS};
use crate::cuda::module::KernelId;
use crate::cuda::CUstream;
use crate::error::{Error, Result};
use crate::task::{CollKind, CollTask, CommShape, Launch, Link, Task};
use crate::tuner::{self, Allowed};
use crate::types;

/// The kernel for a collective: reductions are specialised per (dtype, op); pure data movement
/// runs in the type-free copy kernel.
fn kernel_id(t: &CollTask) -> Result<KernelId> {
    match t.kind {
        CollKind::Broadcast | CollKind::AllGather => Ok(KernelId::COPY),
        _ => KernelId::coll(t.dtype as u32, t.op.kind).ok_or_else(|| {
            Error::Internal(format!("no kernel reduces data type {} with device op {}", t.dtype, t.op.kind))
        }),
    }
}

fn coll_work(t: &CollTask, shape: &CommShape, allowed: &Allowed) -> fnWork {
    let elem = types::dtype_size(t.dtype).expect("validated dtype");
    let sym = t.sym.and_then(|b| Some((b, tuner::symmetric(t.kind, t.count, elem, shape, allowed)?)));
    let choice = match sym {
        Some((_, nchannels)) => tuner::Choice { algo: abi::FN_ALGO_SYMMETRIC, proto: abi::FN_PROTO_SIMPLE, nchannels },
        None => tuner::choose(t.kind, t.count, elem, shape, allowed),
    };
    crate::nccl_info!(
        crate::debug::Subsys::TUNING,
        "{:?}: {} bytes -> algo {} proto {} channels {}",
        t.kind,
        t.count * elem,
        tuner::algo_name(choice.algo),
        tuner::PROTOS[choice.proto as usize],
        choice.nchannels
    );
    let (ty, count, dtype) = match t.kind {
        // Copy kernels count bytes.
        CollKind::Broadcast => (abi::FN_WORK_BROADCAST, t.count * elem, abi::FN_UINT8),
        CollKind::AllGather => (abi::FN_WORK_ALLGATHER, t.count * elem, abi::FN_UINT8),
        CollKind::AllReduce => (abi::FN_WORK_ALLREDUCE, t.count, t.dtype as u32),
        CollKind::Reduce => (abi::FN_WORK_REDUCE, t.count, t.dtype as u32),
        CollKind::ReduceScatter => (abi::FN_WORK_REDUCESCATTER, t.count, t.dtype as u32),
    };
    // The symmetric kernels reach every rank's buffers through the windows' flat mappings.
    let (send, recv, strides) = match sym {
        Some((b, _)) => (b.send.flat, b.recv.flat, (b.send.stride4g, b.recv.stride4g)),
        None => (t.send, t.recv, (0, 0)),
    };
    // A direct broadcast names where this rank's data comes from and goes to (kernels/device_abi.h).
    let (chan, scalar) = match (t.kind, choice.algo) {
        (CollKind::Broadcast, abi::FN_ALGO_DIRECT) => {
            let links = direct_broadcast_links(shape, t.root);
            (links.from.map_or(-1, |r| r as i32), links.to_nibbles())
        }
        _ => (0, t.op.scalar),
    };
    fnWork {
        sendbuff: send as *const _,
        recvbuff: recv as *mut _,
        count: count as u64,
        scalar,
        type_: ty as i32,
        root: t.root as i32,
        chan,
        op: t.op.kind as u8,
        dtype: dtype as u8,
        scalarIsPtr: t.op.scalar_is_ptr as u8,
        proto: choice.proto as u8,
        algo: choice.algo as u8,
        nChannels: choice.nchannels as u16,
        sendStride4G: strides.0,
        recvStride4G: strides.1,
        ..Default::default()
    }
}

crate::int_param!(
    /// NCCL_P2P_LL_THRESHOLD: a send or receive runs in LL when each of its parts carries at most
    /// this many bytes; unset (-1): [`P2P_LL_BYTES`] or, across hosts, [`P2P_LL_BYTES_NET`].
    p2p_ll_threshold, "NCCL_P2P_LL_THRESHOLD", -1
);

/// The most bytes a part of a send or receive carries in LL, as NCCL's default: one LL slot.
/// Between two processes on two H200s, LL made send/recv, all-to-all, gather and scatter of 8 B–16
/// KB 1.11–1.17× faster than Simple (geometric means), whose system fence and counters cost more
/// than a small copy (docs/ARCHITECTURE.md, "Measured constants").
const P2P_LL_BYTES: usize = 16 << 10;
/// The same where the communicator spans hosts over NET: a part's LL lines then land through the
/// proxy line by line, and from 8 KiB a part LL was 0.78–0.93× Simple's speed (1.05–1.20× up to 1
/// KiB, level at 2–4 KiB).
const P2P_LL_BYTES_NET: usize = 2 << 10;

/// The most bytes a part of a send or receive carries in LL on communicator `shape`.
pub fn p2p_ll_limit(shape: &CommShape) -> usize {
    match usize::try_from(p2p_ll_threshold()) {
        Ok(t) => t,
        Err(_) if shape.link == Link::Net => P2P_LL_BYTES_NET,
        Err(_) => P2P_LL_BYTES,
    }
}

/// The protocol of a message of `bytes` in `parts` on communicator `shape`: LL up to
/// [`p2p_ll_limit`] a part, Simple above. Both ends derive it from what they agree on (the byte
/// count, the parts, the communicator's links), so a send and its receive match.
fn p2p_proto(shape: &CommShape, bytes: usize, parts: usize) -> u32 {
    if bytes.div_ceil(parts.max(1)) <= p2p_ll_limit(shape) {
        abi::FN_PROTO_LL
    } else {
        abi::FN_PROTO_SIMPLE
    }
}

fn p2p_work(m: &Msg, peer: usize, first_cta: usize) -> fnWork {
    fnWork {
        sendbuff: m.send as *const _,
        recvbuff: m.recv as *mut _,
        count: m.bytes as u64,
        type_: m.ty as i32,
        root: peer as i32,
        blk: first_cta as i32,
        chan: 0,
        dtype: abi::FN_UINT8 as u8,
        nParts: m.parts as u8,
        proto: m.proto as u8,
        scalar: m.step as u64,
        ..Default::default()
    }
}

/// The bytes of each step of a message's parts (`bytes` in `parts`, of `proto`) to `peer`, 0 for a
/// Simple slot's. A Simple part to a peer through a net plugin of more than one step that crosses
/// as one message (FN_NET_ONE_MESSAGE_SIMPLE, 64 KiB) and at most two runs in two steps: each
/// crosses as one message where the whole part took two (its size word, then its data), the
/// proxy starts sending once half is in host memory, and the peer's kernel copies the first half
/// out while the second is on the wire ([`tuner::two_message_steps`]). Four and six runs each on one H200 through the test
/// plugin: the sizes it moves 1.08–1.11× faster over two hosts and 1.03–1.11× over four; parts of
/// up to 256 KiB in four steps moved −5 to +8 % (docs/ARCHITECTURE.md, "Measured constants"). The
/// built-in net sends every step as two messages, where the split made them 0.78–0.81× as fast.
fn p2p_step(shape: &CommShape, peer: usize, bytes: usize, parts: usize, proto: u32) -> usize {
    let part = bytes.div_ceil(parts.max(1)).next_multiple_of(abi::FN_ALIGN as usize);
    match tuner::two_message_steps(shape) {
        Some((above, upto))
            if proto == abi::FN_PROTO_SIMPLE
                && shape.host(peer) != shape.host(shape.rank)
                && part > above
                && part <= upto =>
        {
            part.div_ceil(2).next_multiple_of(abi::FN_ALIGN as usize)
        }
        _ => 0,
    }
}

/// One (peer, direction) of a group's sends and receives: parts of each message run on the
/// lane's first CTAs of the launch, over channels 0, 1, ... of the connection, in issue order,
/// so both ends agree part by part.
struct Lane {
    is_send: bool,
    peer: usize,
}

impl Lane {
    /// The round of NCCL's point-to-point schedule the lane's messages belong to: in round r a
    /// rank sends to rank + r and receives from rank - r, so a send and the receive that matches
    /// it are in the same round on both ends (round 0: copies to itself).
    fn round(&self, rank: usize, nranks: usize) -> usize {
        match self.is_send {
            true => (self.peer + nranks - rank) % nranks,
            false => (rank + nranks - self.peer) % nranks,
        }
    }
}

/// A message of a group's sends and receives, in one lane.
struct Msg {
    lane: usize,
    /// Where a group split over several launches runs it: (block of rounds, place in its lane).
    key: (usize, usize),
    ty: u32,
    send: u64,
    recv: u64,
    bytes: usize,
    parts: usize,
    /// [`p2p_proto`]'s.
    proto: u32,
    /// [`p2p_step`]'s.
    step: usize,
}

crate::int_param!(
    /// FERRONICKEL_P2P_LAUNCH_WORKS: the most sends and receives one launch carries (2 to
    /// FN_MAX_WORKS, the default). Tests lower it to split small groups into several launches.
    p2p_launch_works, "FERRONICKEL_P2P_LAUNCH_WORKS", FN_MAX_WORKS as i64
);

/// A message is split over this many parts (channels): enough that each part carries at least
/// P2P_MIN_PART bytes, at most the channels the connection has, and at most an equal share of the
/// rank's CTA budget among its 2(n-1) peer lanes so that every lane can run at once. A peer on
/// another host too: two parts at least there, as NCCL gives a NET peer two channels, measured
/// slower and not kept (docs/ARCHITECTURE.md, "Measured constants").
fn p2p_parts(shape: &CommShape, p2p_channels: usize, bytes: usize) -> usize {
    // 256 KiB parts left 256 KiB..1 MiB sends 15% slower than NCCL on 2x H200 (one CTA copies
    // too slowly); 64 KiB parts spread them over 4..16 CTAs. Between GPUs of one host 32 KiB:
    // under CUDA graphs a 64 KiB message took 9.0 us on one CTA and 7.8 on two, and sends of 64
    // KB-1 MB ran 1.06-1.17x faster (docs/ARCHITECTURE.md, "Measured constants").
    const P2P_MIN_PART: usize = 64 << 10;
    const P2P_MIN_PART_GPUS: usize = 32 << 10;
    let min_part = if shape.link == Link::P2p { P2P_MIN_PART_GPUS } else { P2P_MIN_PART };
    let lanes = (2 * shape.nranks.saturating_sub(1)).max(1);
    let cap = (shape.nchannels / lanes).max(1).min(p2p_channels.max(1)).min(u8::MAX as usize);
    bytes.div_ceil(min_part).clamp(1, cap)
}

/// Whether a broadcast or reduce runs direct between its root and every rank ([`tuner::direct`]).
/// Depends only on what every rank knows alike, so all ranks agree.
fn is_direct(c: &CollTask, shape: &CommShape, allowed: &Allowed) -> bool {
    let bytes = c.count * types::dtype_size(c.dtype).expect("validated dtype");
    tuner::direct(c.kind, bytes, shape, allowed)
}

/// The peers a collective connects this rank with beyond the ring: for a direct broadcast its
/// links ([`direct_broadcast_links`]), for a direct reduce every other rank on the root, the root
/// elsewhere; for recursive doubling the partner of each exchange (rank ^ 1, ^ 2, ^ 4, ...); none
/// for any other collective.
pub fn direct_peers(c: &CollTask, shape: &CommShape, allowed: &Allowed) -> Vec<usize> {
    let elem = types::dtype_size(c.dtype).expect("validated dtype");
    if tuner::recursive_doubling(c.kind, tuner::coll_bytes(c.kind, c.count, elem, shape.nranks), shape, allowed) {
        let n = shape.nranks;
        return (0..n.trailing_zeros()).map(|b| shape.rank ^ (1 << b)).collect();
    }
    match (is_direct(c, shape, allowed), c.kind) {
        (false, _) => vec![],
        (true, CollKind::Broadcast) => {
            let links = direct_broadcast_links(shape, c.root);
            links.from.into_iter().chain(links.to).collect()
        }
        (true, _) if shape.rank == c.root => (0..shape.nranks).filter(|&p| p != c.root).collect(),
        (true, _) => vec![c.root],
    }
}

/// A broadcast that runs direct in the Simple protocol across hosts of one rank each: the sends
/// and receives that carry it, split over the connections' channels, the root's copy to its own
/// output included; `None` for any other collective. (A direct reduce, a direct broadcast in LL or
/// LL128, and one across hosts of several ranks, which ranks pass on, are a collective work on one
/// channel, `FN_ALGO_DIRECT`, which the tuner picks.)
pub fn direct_p2p(c: &CollTask, shape: &CommShape, allowed: &Allowed) -> Option<Vec<Task>> {
    let elem = types::dtype_size(c.dtype).expect("validated dtype");
    if c.kind != CollKind::Broadcast
        || shape.tree.nhosts < shape.nranks
        || !is_direct(c, shape, allowed)
        || tuner::choose(c.kind, c.count, elem, shape, allowed).proto != abi::FN_PROTO_SIMPLE
    {
        return None;
    }
    let (bytes, root) = (c.count * elem, c.root);
    // Across hosts of one rank the links are the root's sends to every rank.
    let links = direct_broadcast_links(shape, root);
    if let Some(from) = links.from {
        return Some(vec![Task::Recv { buf: c.recv, bytes, peer: from }]);
    }
    let mut tasks: Vec<Task> = links.to.into_iter().map(|peer| Task::Send { buf: c.send, bytes, peer }).collect();
    if c.send != c.recv {
        tasks.push(Task::Send { buf: c.send, bytes, peer: root });
        tasks.push(Task::Recv { buf: c.recv, bytes, peer: root });
    }
    Some(tasks)
}

/// Where a direct broadcast's data reaches one rank from, and where that rank sends it on.
#[derive(Debug, PartialEq, Eq)]
pub struct BroadcastLinks {
    /// `None` on the root.
    pub from: Option<usize>,
    /// In the order the rank sends.
    pub to: Vec<usize>,
}

impl BroadcastLinks {
    /// `to` as the work carries it (kernels/device_abi.h): rank + 1 in each 4 bits, the first
    /// send lowest, 0 after the last.
    pub fn to_nibbles(&self) -> u64 {
        self.to.iter().rev().fold(0u64, |m, &r| m << 4 | (r as u64 + 1))
    }
}

/// A direct broadcast's links at `shape.rank`. Each host's ranks form a chain in the ring's order
/// within the host ([`CommShape::host_chain`]) that starts at its entry (on the root's host the
/// root; elsewhere the rank at the root's place in its host's chain, the same local GPU where hosts
/// are alike) and wraps around; every rank sends to the next of its chain. The root also sends,
/// first, to every other host's entry, hosts in order after its own. Across hosts of one rank that
/// is the root sending to everyone. One hop over NET on every path, where the ring makes one
/// between each two hosts; inside a host as many hops as the ring's passage through it, all but the
/// wrap-around over the ring's own links.
pub fn direct_broadcast_links(shape: &CommShape, root: usize) -> BroadcastLinks {
    let n = shape.nranks;
    let (me, root_host) = (shape.rank, shape.host(root));
    let place = shape.host_chain(root_host).iter().position(|&r| r == root).expect("the root is on its host");
    // A host's ranks in chain order, its entry first.
    let chain = |h: usize| -> Vec<usize> {
        let mut ranks = shape.host_chain(h);
        let entry = if h == root_host { place } else { place % ranks.len() };
        ranks.rotate_left(entry);
        ranks
    };
    let mine = chain(shape.host(me));
    let at = mine.iter().position(|&r| r == me).expect("a rank is on its host");
    let mut to: Vec<usize> = mine.get(at + 1).copied().into_iter().collect();
    if me == root {
        // Other hosts by number, from the one after the root's, then its own chain.
        let mut hosts: Vec<usize> = (0..n).map(|r| shape.host(r)).filter(|&h| h != root_host).collect();
        hosts.sort_unstable_by_key(|&h| ((h + n - root_host) % n, h));
        hosts.dedup();
        to = hosts.into_iter().map(|h| chain(h)[0]).chain(to).collect();
    }
    let from = match at {
        0 if me == root => None,
        0 => Some(root),
        _ => Some(mine[at - 1]),
    };
    BroadcastLinks { from, to }
}

/// Plans one communicator's share of a group: collectives first, in issue order (every rank
/// issues them in the same order), each with the tuner's choice (a direct broadcast as a launch
/// of its own sends and receives, so that they never match a user's), then the sends and
/// receives: one launch, or one per block of rounds of NCCL's schedule when they are more than a
/// launch carries ([`plan_p2p`]).
pub fn plan(
    shape: &CommShape,
    allowed: &Allowed,
    p2p_channels: &dyn Fn(usize) -> usize,
    ops: &[(CUstream, Task)],
) -> Result<Vec<Launch>> {
    let mut launches: Vec<Launch> = Vec::new();
    for (stream, task) in ops {
        let Task::Coll(c) = task else { continue };
        if c.count == 0 {
            continue;
        }
        if let Some(tasks) = direct_p2p(c, shape, allowed) {
            let ops: Vec<(CUstream, Task)> = tasks.into_iter().map(|t| (*stream, t)).collect();
            // They carry a collective the tuner put in Simple (NCCL_PROTO may have asked for it),
            // not a user's sends: Simple at every size, at both ends.
            let simple = |_: usize, _: usize| abi::FN_PROTO_SIMPLE;
            launches.extend(plan_p2p(shape, p2p_channels, &simple, &ops, works_per_launch())?);
            continue;
        }
        let kernel = kernel_id(c)?;
        let work = coll_work(c, shape, allowed);
        let grid = u32::from(work.nChannels);
        match launches.last_mut() {
            Some(l)
                if l.kernel == kernel
                    && l.stream == *stream
                    && l.works.len() < FN_MAX_WORKS as usize
                    && !l.is_p2p() =>
            {
                l.grid = l.grid.max(grid);
                l.works.push(work)
            }
            _ => launches.push(Launch { kernel, grid, stream: *stream, joined: vec![], works: vec![work] }),
        }
    }
    let by_size = |bytes: usize, parts: usize| p2p_proto(shape, bytes, parts);
    launches.extend(plan_p2p(shape, p2p_channels, &by_size, ops, works_per_launch())?);
    Ok(launches)
}

/// The most sends and receives one launch carries (FERRONICKEL_P2P_LAUNCH_WORKS, within 2 and
/// FN_MAX_WORKS).
fn works_per_launch() -> usize {
    p2p_launch_works().clamp(2, FN_MAX_WORKS as i64) as usize
}

/// A communicator's sends and receives of one group as launches of the copy kernel, every lane
/// (peer and direction) on CTAs of its own so that they all progress together, each message in
/// the protocol `proto` gives its bytes and parts.
fn plan_p2p(
    shape: &CommShape,
    p2p_channels: &dyn Fn(usize) -> usize,
    proto: &dyn Fn(usize, usize) -> u32,
    ops: &[(CUstream, Task)],
    per_launch: usize,
) -> Result<Vec<Launch>> {
    let rank = shape.rank;
    // Messages in issue order per lane, with their part counts.
    let mut lanes: Vec<Lane> = Vec::new();
    let mut msgs: Vec<Msg> = Vec::new();
    let mut streams: Vec<CUstream> = Vec::new();
    let mut self_sends = std::collections::VecDeque::new();
    let mut self_recvs = std::collections::VecDeque::new();
    let mut lane_of =
        |is_send: bool, peer: usize| match lanes.iter().position(|l| (l.is_send, l.peer) == (is_send, peer)) {
            Some(i) => i,
            None => {
                lanes.push(Lane { is_send, peer });
                lanes.len() - 1
            }
        };
    for (stream, task) in ops {
        let (is_send, buf, bytes, peer) = match *task {
            Task::Send { buf, bytes, peer } => (true, buf, bytes, peer),
            Task::Recv { buf, bytes, peer } => (false, buf, bytes, peer),
            Task::Coll(_) => continue,
        };
        if bytes == 0 {
            continue;
        }
        if !streams.contains(stream) {
            streams.push(*stream);
        }
        if peer == rank {
            if is_send {
                self_sends.push_back((buf, bytes))
            } else {
                self_recvs.push_back((buf, bytes))
            }
            continue;
        }
        let lane = lane_of(is_send, peer);
        let parts = p2p_parts(shape, p2p_channels(peer), bytes);
        let (ty, send, recv) = if is_send { (abi::FN_WORK_SEND, buf, 0) } else { (abi::FN_WORK_RECV, 0, buf) };
        let proto = proto(bytes, parts);
        let step = p2p_step(shape, peer, bytes, parts, proto);
        msgs.push(Msg { lane, key: (0, 0), ty, send, recv, bytes, parts, proto, step });
    }
    if self_sends.len() != self_recvs.len() {
        return Err(Error::InvalidUsage(format!(
            "rank {rank} posted {} send(s) to itself but {} receive(s) from itself in this group; they must pair up",
            self_sends.len(),
            self_recvs.len()
        )));
    }
    for ((src, sb), (dst, rb)) in self_sends.into_iter().zip(self_recvs) {
        if sb != rb {
            return Err(Error::InvalidUsage(format!(
                "rank {rank} sends {sb} bytes to itself but receives {rb} bytes from itself"
            )));
        }
        let lane = lane_of(true, rank);
        let parts = p2p_parts(shape, shape.nchannels, sb);
        let proto = abi::FN_PROTO_SIMPLE; // a copy within the rank
        msgs.push(Msg {
            lane,
            key: (0, 0),
            ty: abi::FN_WORK_COPY,
            send: src,
            recv: dst,
            bytes: sb,
            parts,
            proto,
            step: 0,
        });
    }
    if msgs.len() <= per_launch {
        return Ok(Vec::from_iter((!msgs.is_empty()).then(|| p2p_launch(&lanes, &msgs, &streams))));
    }
    // More than a launch carries: launches keyed by (block of rounds, the message's place in its
    // lane), in that order on every rank. In round r a rank sends to rank + r and receives from
    // rank - r, so a send and its receive have the same key on both ends, and a launch only ever
    // waits for launches of the same key elsewhere (a rank that needed no split has them all in
    // its one launch, where each lane takes its messages in order). A key holds at most one
    // message a lane, and a block's rounds have two lanes each: a launch never overflows.
    let rounds = (per_launch / 2).max(1);
    let mut seen = vec![0usize; lanes.len()];
    for m in &mut msgs {
        m.key = (lanes[m.lane].round(rank, shape.nranks) / rounds, seen[m.lane]);
        seen[m.lane] += 1;
    }
    msgs.sort_by_key(|m| m.key);
    Ok(msgs.chunk_by(|a, b| a.key == b.key).map(|batch| p2p_launch(&lanes, batch, &streams)).collect())
}

/// One launch of `msgs`: each lane gets as many CTAs as its largest message has parts.
fn p2p_launch(lanes: &[Lane], msgs: &[Msg], streams: &[CUstream]) -> Launch {
    let mut first = vec![0; lanes.len()];
    let mut ctas = vec![0; lanes.len()];
    for m in msgs {
        ctas[m.lane] = ctas[m.lane].max(m.parts);
    }
    let mut next = 0;
    for (f, c) in first.iter_mut().zip(&ctas) {
        *f = next;
        next += c;
    }
    Launch {
        kernel: KernelId::COPY,
        grid: next as u32,
        stream: streams[0],
        joined: streams[1..].to_vec(),
        works: msgs.iter().map(|m| p2p_work(m, lanes[m.lane].peer, first[m.lane])).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::DevOp;
    use crate::types::ncclDataType_t;
    use std::collections::HashMap;
    use std::sync::Arc;

    fn coll(kind: CollKind, dtype: ncclDataType_t, op: u32, count: usize) -> Task {
        Task::Coll(CollTask {
            kind,
            send: 0x1000,
            recv: 0x2000,
            count,
            dtype,
            op: DevOp::plain(op),
            root: 0,
            sym: None,
        })
    }

    /// Four hosts of one rank each over NET, seen from `rank`.
    fn four_hosts(rank: usize) -> CommShape {
        CommShape {
            rank,
            link: crate::task::Link::Net,
            tree: crate::topo::tree::TreeShape { nhosts: 4, depth: 2, max_children: 2 },
            ..CommShape::one_host(4, 4, 4)
        }
    }

    fn bcast(root: usize, send: u64, recv: u64, count: usize) -> CollTask {
        let Task::Coll(c) = coll(CollKind::Broadcast, types::ncclInt8, abi::FN_OP_SUM, count) else { unreachable!() };
        CollTask { root, send, recv, ..c }
    }

    /// Recursive doubling connects each rank with its partner of every exchange, rank ^ 1, ^ 2, ...
    #[test]
    fn recursive_doubling_connects_the_partners() {
        let eight = |rank| CommShape {
            tree: crate::topo::tree::TreeShape { nhosts: 8, depth: 3, max_children: 2 },
            ..CommShape { nranks: 8, ..four_hosts(rank) }
        };
        let Task::Coll(ar) = coll(CollKind::AllReduce, types::ncclFloat32, abi::FN_OP_SUM, 16) else { unreachable!() };
        let Task::Coll(ag) = coll(CollKind::AllGather, types::ncclInt8, abi::FN_OP_SUM, 16) else { unreachable!() };
        assert_eq!(direct_peers(&ar, &eight(5), &Allowed::ALL), vec![4, 7, 1]);
        assert_eq!(direct_peers(&ag, &four_hosts(2), &Allowed::ALL), vec![3, 0]);
        let Task::Coll(rs) = coll(CollKind::ReduceScatter, types::ncclFloat32, abi::FN_OP_SUM, 16) else {
            unreachable!()
        };
        assert_eq!(direct_peers(&rs, &eight(6), &Allowed::ALL), vec![7, 4, 2]);
        let large_rs = CollTask { count: 64 << 10, ..rs };
        assert!(direct_peers(&large_rs, &eight(6), &Allowed::ALL).is_empty(), "the ring");
        let large = CollTask { count: 1 << 20, ..ar };
        assert!(direct_peers(&large, &four_hosts(2), &Allowed::ALL).is_empty(), "the ring");
        assert!(direct_peers(&ar, &SHAPE, &Allowed::ALL).is_empty(), "one host");
        let w = coll_work(&ag, &eight(0), &Allowed::ALL);
        assert_eq!((w.algo as u32, w.nChannels), (abi::FN_ALGO_RECDBL, 1));
        // Two hosts of two ranks (0, 1 | 2, 3): the partner on the same host, then the one across.
        let two_by_two = |rank| CommShape {
            tree: crate::topo::tree::TreeShape { nhosts: 2, depth: 2, max_children: 1 },
            ..four_hosts(rank)
        };
        assert_eq!(direct_peers(&rs, &two_by_two(1), &Allowed::ALL), vec![0, 3]);
        let Task::Coll(reduce) = coll(CollKind::Reduce, types::ncclFloat32, abi::FN_OP_SUM, 2) else { unreachable!() };
        let reduce = CollTask { root: 2, ..reduce };
        assert_eq!(direct_peers(&reduce, &two_by_two(2), &Allowed::ALL), vec![0, 1, 3], "the root");
        assert_eq!(direct_peers(&reduce, &two_by_two(0), &Allowed::ALL), vec![2]);
        assert!(direct_peers(&bcast(2, 1, 1, 8), &two_by_two(0), &Allowed::ALL).is_empty(), "the ring");
    }

    /// A broadcast across hosts that the tuner sends direct in Simple is the root's sends to every
    /// rank (and its own copy when out of place) and one receive from the root elsewhere; a large
    /// one stays a ring collective.
    #[test]
    fn a_direct_simple_broadcast_is_the_roots_sends() {
        const B: usize = 64 << 10;
        let c = bcast(1, 0x1000, 0x2000, B);
        // (is a send, buffer, bytes, peer) of each task.
        let sends = |rank| -> Vec<(bool, u64, usize, usize)> {
            let tasks = direct_p2p(&c, &four_hosts(rank), &Allowed::ALL).unwrap();
            tasks
                .into_iter()
                .map(|t| match t {
                    Task::Send { buf, bytes, peer } => (true, buf, bytes, peer),
                    Task::Recv { buf, bytes, peer } => (false, buf, bytes, peer),
                    Task::Coll(_) => panic!("a collective"),
                })
                .collect()
        };
        let want = [(true, 0x1000, B, 2), (true, 0x1000, B, 3), (true, 0x1000, B, 0)];
        let copy = [(true, 0x1000, B, 1), (false, 0x2000, B, 1)];
        assert_eq!(sends(1), [&want[..], &copy[..]].concat());
        assert_eq!(sends(3), vec![(false, 0x2000, B, 1)]);
        let in_place = bcast(1, 0x1000, 0x1000, B);
        assert_eq!(direct_p2p(&in_place, &four_hosts(1), &Allowed::ALL).unwrap().len(), 3);
        assert!(direct_p2p(&bcast(1, 0x1000, 0x2000, 4 << 20), &four_hosts(1), &Allowed::ALL).is_none());
        assert!(direct_p2p(&c, &SHAPE, &Allowed::ALL).is_none(), "one host: the ring");
    }

    /// A small direct broadcast runs in LL as one collective work on one channel, the root's
    /// sends in the kernel, and batches with the collectives around it; its peers are connected as
    /// a Simple one's are.
    #[test]
    fn a_small_direct_broadcast_is_one_ll_work() {
        let c = bcast(1, 0x1000, 0x2000, 64);
        assert!(direct_p2p(&c, &four_hosts(1), &Allowed::ALL).is_none());
        let w = coll_work(&c, &four_hosts(3), &Allowed::ALL);
        assert_eq!((w.algo as u32, w.proto as u32, w.nChannels, w.root), (abi::FN_ALGO_DIRECT, abi::FN_PROTO_LL, 1, 1));
        assert_eq!(direct_peers(&c, &four_hosts(1), &Allowed::ALL), vec![2, 3, 0], "hosts after the root's first");
        assert_eq!(direct_peers(&c, &four_hosts(3), &Allowed::ALL), vec![1]);
        let s = std::ptr::null_mut();
        let ops = vec![
            (s, coll(CollKind::AllGather, types::ncclInt8, abi::FN_OP_SUM, 8)),
            (s, Task::Coll(c)),
            (s, coll(CollKind::AllGather, types::ncclInt8, abi::FN_OP_SUM, 8)),
        ];
        let launches = plan(&four_hosts(3), &Allowed::ALL, &|_| 4, &ops).unwrap();
        assert_eq!(launches.len(), 1, "one copy kernel launch");
        let algos: Vec<u32> = launches[0].works.iter().map(|w| w.algo as u32).collect();
        assert_eq!(algos, [abi::FN_ALGO_RECDBL, abi::FN_ALGO_DIRECT, abi::FN_ALGO_RECDBL]);
    }

    /// Across hosts of several ranks a direct broadcast crosses NET once: the root sends to one
    /// rank of every other host and each host's ranks pass it along a chain. Every rank but the
    /// root receives exactly once, and the work names the links.
    #[test]
    fn a_direct_broadcast_across_shared_hosts_crosses_net_once() {
        let links = |shape: &dyn Fn(usize) -> CommShape, n: usize, root: usize| -> Vec<(Option<usize>, Vec<usize>)> {
            (0..n)
                .map(|r| {
                    let l = direct_broadcast_links(&shape(r), root);
                    (l.from, l.to)
                })
                .collect()
        };
        let hosts = |nranks: usize, nhosts: usize| {
            move |rank| CommShape {
                nranks,
                tree: crate::topo::tree::TreeShape { nhosts, depth: 2, max_children: 2 },
                ..four_hosts(rank)
            }
        };
        // Four hosts of two (0 1 | 2 3 | 4 5 | 6 7), root 5, second on its host: the second rank
        // of each host is its entry, hosts after the root's first.
        let four_by_two = links(&hosts(8, 4), 8, 5);
        assert_eq!(four_by_two[5], (None, vec![7, 1, 3, 4]));
        assert_eq!(four_by_two[1], (Some(5), vec![0]));
        assert_eq!(four_by_two[0], (Some(1), vec![]));
        assert_eq!(four_by_two[4], (Some(5), vec![]));
        // Two hosts of four, root 2: rank 6 enters the other host; chains wrap around.
        let two_by_four = links(&hosts(8, 2), 8, 2);
        assert_eq!(two_by_four[2], (None, vec![6, 3]));
        assert_eq!(two_by_four[6], (Some(2), vec![7]));
        assert_eq!(two_by_four[7], (Some(6), vec![4]));
        assert_eq!(two_by_four[5], (Some(4), vec![]));
        assert_eq!(two_by_four[0], (Some(3), vec![1]));
        // Hosts of unequal size from an explicit map (host 0: 0, 3; host 1: 1, 2, 4), root 3: the
        // other host is entered at place 1, rank 2.
        let map = vec![(0, 0), (1, 0), (1, 1), (0, 1), (1, 2)];
        let uneven = |rank| CommShape { hosts: Some(map.clone().into()), ..hosts(5, 2)(rank) };
        let uneven = links(&uneven, 5, 3);
        assert_eq!(
            uneven,
            [(Some(3), vec![]), (Some(4), vec![]), (Some(3), vec![4]), (None, vec![2, 0]), (Some(2), vec![1])]
        );
        // Chains in the ring's order within each host, GPU by GPU (0 2 1 3 | 4 6 5 7): root 1 is
        // third in its chain, so the other host is entered at its third, rank 5.
        let gpu_by_gpu: Vec<(u32, u32)> = (0..8).map(|r| ((r / 4) as u32, [0, 2, 1, 3][r % 4])).collect();
        let ring_order = |rank| CommShape { hosts: Some(gpu_by_gpu.clone().into()), ..hosts(8, 2)(rank) };
        let ring_order = links(&ring_order, 8, 1);
        assert_eq!(ring_order[1], (None, vec![5, 3]));
        assert_eq!(ring_order[5], (Some(1), vec![7]));
        assert_eq!(ring_order[3], (Some(1), vec![0]));
        assert_eq!(ring_order[2], (Some(0), vec![]));
        assert_eq!(ring_order[6], (Some(4), vec![]));
        // Every layout and root (with chains in rank order, and GPU by GPU): each rank but the root
        // receives once, from a rank that sends to it, and at most one hop of any path crosses hosts.
        type Layout = Box<dyn Fn(usize) -> CommShape>;
        let mut layouts: Vec<Layout> =
            [(4, 2), (6, 3), (8, 2), (8, 4), (3, 3), (8, 8)].map(|(n, h)| Box::new(hosts(n, h)) as Layout).into();
        let by_gpu = gpu_by_gpu.clone();
        layouts.push(Box::new(move |rank| CommShape { hosts: Some(by_gpu.clone().into()), ..hosts(8, 2)(rank) }));
        for shape in &layouts {
            let (nranks, nhosts) = (shape(0).nranks, shape(0).tree.nhosts);
            for root in 0..nranks {
                let all = links(&shape, nranks, root);
                let mut got = vec![0; nranks];
                for (r, (from, to)) in all.iter().enumerate() {
                    assert_eq!(from.is_none(), r == root, "{nranks}/{nhosts} root {root} rank {r}");
                    if let Some(f) = from {
                        assert!(all[*f].1.contains(&r), "{nranks}/{nhosts} root {root}: {f} does not send to {r}");
                        let crosses = |a: usize, b: usize| shape(0).host(a) != shape(0).host(b);
                        assert!(!(crosses(*f, r) && all[*f].0.is_some_and(|ff| crosses(ff, *f))), "two NET hops");
                    }
                    to.iter().for_each(|&t| got[t] += 1);
                }
                let want: Vec<usize> = (0..nranks).map(|r| usize::from(r != root)).collect();
                assert_eq!(got, want, "{nranks}/{nhosts} root {root}");
            }
        }
        // The work: LL on one channel, the links in chan and scalar; no Simple sends.
        let c = bcast(5, 0x1000, 0x2000, 64);
        let w = coll_work(&c, &hosts(8, 4)(1), &Allowed::ALL);
        assert_eq!((w.algo as u32, w.proto as u32, w.nChannels), (abi::FN_ALGO_DIRECT, abi::FN_PROTO_LL, 1));
        assert_eq!((w.chan, w.scalar), (5, 0x1));
        let w = coll_work(&c, &hosts(8, 4)(5), &Allowed::ALL);
        assert_eq!((w.chan, w.scalar), (-1, 0x5428), "ranks 7, 1, 3, 4, each + 1");
        assert_eq!(direct_peers(&c, &hosts(8, 4)(1), &Allowed::ALL), vec![5, 0]);
        let simple = Allowed { protos: [false, false, true], ..Allowed::ALL };
        assert!(direct_p2p(&c, &hosts(8, 4)(5), &simple).is_none(), "a Simple one passes on in the kernel too");
        assert_eq!(coll_work(&c, &hosts(8, 4)(5), &simple).algo as u32, abi::FN_ALGO_DIRECT);
    }

    /// A direct Simple broadcast gets a launch of its own between the collectives around it, in
    /// issue order, and the next collective does not join it.
    #[test]
    fn a_direct_simple_broadcast_launches_alone_in_issue_order() {
        const B: usize = 64 << 10;
        let s = std::ptr::null_mut();
        let ops = vec![
            (s, coll(CollKind::AllGather, types::ncclInt8, abi::FN_OP_SUM, 8)),
            (s, Task::Coll(bcast(0, 0x1000, 0x2000, B))),
            (s, coll(CollKind::AllGather, types::ncclInt8, abi::FN_OP_SUM, 8)),
            (s, Task::Recv { buf: 0x3000, bytes: 8, peer: 2 }),
        ];
        let launches = plan(&four_hosts(3), &Allowed::ALL, &|_| 4, &ops).unwrap();
        let types: Vec<Vec<u32>> = launches.iter().map(|l| l.works.iter().map(|w| w.type_ as u32).collect()).collect();
        assert_eq!(
            types,
            vec![
                vec![abi::FN_WORK_ALLGATHER],
                vec![abi::FN_WORK_RECV],
                vec![abi::FN_WORK_ALLGATHER],
                vec![abi::FN_WORK_RECV]
            ]
        );
        assert_eq!((launches[1].works[0].root, launches[1].works[0].count), (0, B as u64), "from the root, its bytes");
        assert_eq!(launches[3].works[0].root, 2, "the user's receive stays in the group's own launch");
        // Small, with NCCL_PROTO=Simple: the broadcast's sends and receive stay in Simple, where a
        // user's receive of 8 bytes runs LL.
        let simple = Allowed { protos: [false, false, true], ..Allowed::ALL };
        let ops =
            vec![(s, Task::Coll(bcast(0, 0x1000, 0x2000, 64))), (s, Task::Recv { buf: 0x3000, bytes: 8, peer: 2 })];
        for rank in [0, 3] {
            let launches = plan(&four_hosts(rank), &simple, &|_| 4, &ops).unwrap();
            let protos: Vec<Vec<u32>> =
                launches.iter().map(|l| l.works.iter().map(|w| w.proto as u32).collect()).collect();
            let direct = launches[0].works.len();
            assert!(launches[0].is_p2p() && direct >= 1, "rank {rank}: the broadcast as sends and receives");
            assert_eq!(protos[0], vec![abi::FN_PROTO_SIMPLE; direct], "rank {rank}");
            assert_eq!(protos[1], [abi::FN_PROTO_LL], "rank {rank}");
        }
    }

    const SHAPE: CommShape = CommShape::one_host(3, 4, 4);

    fn plan0(ops: &[(CUstream, Task)]) -> Result<Vec<Launch>> {
        plan(&SHAPE, &Allowed::ALL, &|_| 4, ops)
    }

    #[test]
    fn batches_collectives_sharing_a_kernel() {
        let s = std::ptr::null_mut();
        let ops = vec![
            (s, coll(CollKind::AllReduce, types::ncclFloat32, abi::FN_OP_SUM, 10)),
            (s, coll(CollKind::ReduceScatter, types::ncclFloat32, abi::FN_OP_SUM, 10)),
            (s, coll(CollKind::AllReduce, types::ncclInt32, abi::FN_OP_MAX, 10)),
            (s, coll(CollKind::AllGather, types::ncclFloat16, abi::FN_OP_SUM, 10)),
            (s, coll(CollKind::AllReduce, types::ncclFloat32, abi::FN_OP_SUM, 0)),
        ];
        let l = plan0(&ops).unwrap();
        let names: Vec<_> = l.iter().map(|l| l.kernel.name()).collect();
        assert_eq!(names, ["fnColl_f32_sum", "fnColl_i32_max", "fnCopy"]);
        assert_eq!(l[0].works.len(), 2);
        // The copy kernel counts bytes.
        assert_eq!(l[2].works[0].count, 20);
        assert_eq!(l[2].works[0].dtype as u32, abi::FN_UINT8);
    }

    /// The kernels carry only the code of the works they are sent (kernels/collectives.cuh traps
    /// on any other): reductions go to an fnColl kernel, movement and point to point to fnCopy.
    #[test]
    fn each_kernel_gets_only_the_works_it_carries() {
        let s = std::ptr::null_mut();
        let mut ops = Vec::new();
        for kind in
            [CollKind::AllReduce, CollKind::Reduce, CollKind::Broadcast, CollKind::AllGather, CollKind::ReduceScatter]
        {
            for (dtype, op) in [(types::ncclFloat32, abi::FN_OP_SUM), (types::ncclUint8, abi::FN_OP_PROD)] {
                ops.push((s, coll(kind, dtype, op, 1000)));
            }
        }
        ops.push((s, Task::Send { buf: 1, bytes: 64, peer: 1 }));
        ops.push((s, Task::Recv { buf: 2, bytes: 64, peer: 2 }));
        ops.push((s, Task::Send { buf: 3, bytes: 64, peer: 0 }));
        ops.push((s, Task::Recv { buf: 4, bytes: 64, peer: 0 }));
        let reduction = [abi::FN_WORK_ALLREDUCE, abi::FN_WORK_REDUCE, abi::FN_WORK_REDUCESCATTER];
        let launches = plan0(&ops).unwrap();
        assert!(
            launches.iter().any(|l| l.kernel == KernelId::COPY) && launches.iter().any(|l| l.kernel != KernelId::COPY)
        );
        for l in &launches {
            for w in &l.works {
                let is_reduction = reduction.contains(&(w.type_ as u32));
                assert_eq!(
                    is_reduction,
                    l.kernel != KernelId::COPY,
                    "work type {} in a launch of {}",
                    w.type_,
                    l.kernel.name()
                );
            }
        }
    }

    /// NCCL_ALGO=Tree: all-reduces carry the tree algorithm over every ring channel of one host;
    /// the other reductions keep the ring when a per-collective setting leaves it to them.
    #[test]
    fn tree_all_reduce_is_planned_as_tree_works() {
        let s = std::ptr::null_mut();
        let ops = vec![
            (s, coll(CollKind::AllReduce, types::ncclFloat32, abi::FN_OP_SUM, 1 << 20)),
            (s, coll(CollKind::ReduceScatter, types::ncclFloat32, abi::FN_OP_SUM, 1000)),
            (s, coll(CollKind::AllReduce, types::ncclFloat32, abi::FN_OP_SUM, 7)),
        ];
        let allowed = tuner::parse_restrictions(Some("allreduce:tree"), Some("LL128")).unwrap();
        let l = plan(&SHAPE, &allowed, &|_| 4, &ops).unwrap();
        assert_eq!(l.len(), 1);
        let algos: Vec<_> = l[0].works.iter().map(|w| (w.type_ as u32, w.algo as u32, w.proto as u32)).collect();
        assert_eq!(
            algos,
            [
                (abi::FN_WORK_ALLREDUCE, abi::FN_ALGO_TREE, abi::FN_PROTO_LL128),
                (abi::FN_WORK_REDUCESCATTER, abi::FN_ALGO_RING, abi::FN_PROTO_LL128),
                (abi::FN_WORK_ALLREDUCE, abi::FN_ALGO_TREE, abi::FN_PROTO_LL128),
            ]
        );
        assert!(l[0].works.iter().all(|w| usize::from(w.nChannels) == SHAPE.nchannels));
        assert_eq!(l[0].grid as usize, SHAPE.nchannels);
    }

    /// Collectives on symmetric buffers, with the symmetric kernels forced, carry the flat
    /// mappings' addresses and strides to them, in the kernels that carry their work types; the
    /// others keep the user's buffers, and so does every collective the tuner decides.
    #[test]
    fn symmetric_buffers_are_planned_as_symmetric_works() {
        use crate::task::{SymBuf, SymBufs};
        let s = std::ptr::null_mut();
        let sym = SymBufs {
            send: SymBuf { flat: 0x7000_0000_0040, stride4g: 1 },
            recv: SymBuf { flat: 0x7100_0000_0000, stride4g: 2 },
        };
        let with = |kind, count, sym| {
            let Task::Coll(c) = coll(kind, types::ncclFloat32, abi::FN_OP_SUM, count) else { unreachable!() };
            Task::Coll(CollTask { sym, ..c })
        };
        let ops = vec![
            (s, with(CollKind::AllReduce, 1000, Some(sym))),
            (s, with(CollKind::ReduceScatter, 1000, Some(sym))),
            (s, with(CollKind::Reduce, 1000, Some(sym))),
            (s, with(CollKind::AllReduce, 1 << 20, Some(sym))),
            (s, with(CollKind::AllReduce, 1000, None)),
            (s, with(CollKind::AllGather, 1000, Some(sym))),
        ];
        let always = Allowed { symmetric: tuner::Symmetric::Always, ..Allowed::ALL };
        let l = plan(&SHAPE, &always, &|_| 4, &ops).unwrap();
        let works: Vec<&fnWork> = l.iter().flat_map(|l| &l.works).collect();
        let sym_works: Vec<_> = works.iter().map(|w| w.algo as u32 == abi::FN_ALGO_SYMMETRIC).collect();
        assert_eq!(sym_works, [true, true, false, true, false, true]);
        for w in works.iter().filter(|w| w.algo as u32 == abi::FN_ALGO_SYMMETRIC) {
            assert_eq!((w.sendbuff as u64, w.recvbuff as u64), (sym.send.flat, sym.recv.flat));
            assert_eq!((w.sendStride4G, w.recvStride4G), (1, 2));
        }
        // One channel per 64 KiB: 4 KB on one, 4 MiB on every channel of the communicator (4).
        assert_eq!((works[0].nChannels, works[3].nChannels), (1, 4));
        assert_eq!(works[2].sendbuff as u64, 0x1000);
        assert_eq!((works[4].sendbuff as u64, works[4].sendStride4G), (0x1000, 0));
        // The all-gather goes to the copy kernel, in bytes.
        assert_eq!(l.last().unwrap().kernel, KernelId::COPY);
        assert_eq!(works[5].count, 4000);
        let never = Allowed { symmetric: tuner::Symmetric::Never, ..Allowed::ALL };
        for allowed in [&never, &Allowed::ALL] {
            let l = plan(&SHAPE, allowed, &|_| 4, &ops).unwrap();
            assert!(l.iter().flat_map(|l| &l.works).all(|w| w.algo as u32 != abi::FN_ALGO_SYMMETRIC));
        }
    }

    #[test]
    fn p2p_gets_lanes_per_peer_and_direction() {
        let s = std::ptr::null_mut();
        let big = 1 << 20;
        let ops = vec![
            (s, Task::Send { buf: 1, bytes: 8, peer: 1 }),
            (s, Task::Recv { buf: 2, bytes: big, peer: 1 }),
            (s, Task::Send { buf: 3, bytes: big, peer: 1 }),
            (s, Task::Recv { buf: 4, bytes: 8, peer: 0 }),
            (s, Task::Send { buf: 5, bytes: 8, peer: 0 }),
            (s, Task::Send { buf: 6, bytes: 0, peer: 2 }),
        ];
        let l = plan0(&ops).unwrap();
        assert_eq!(l.len(), 1);
        let w = &l[0].works;
        // 3 ranks, 4 CTAs: each of the 4 peer lanes may use one part; the self copy may use 4.
        assert_eq!(w.iter().map(|w| (w.blk, w.nParts)).collect::<Vec<_>>(), [(0, 1), (1, 1), (0, 1), (2, 1)]);
        assert_eq!(w[3].type_ as u32, abi::FN_WORK_COPY);
        assert_eq!(l[0].grid, 3);
        // Small messages in LL, the 1 MiB ones (one part on 4 CTAs) in Simple.
        let protos: Vec<u32> = w.iter().map(|w| w.proto as u32).collect();
        assert_eq!(protos[..3], [abi::FN_PROTO_LL, abi::FN_PROTO_SIMPLE, abi::FN_PROTO_SIMPLE]);
    }

    /// A send or receive runs in LL while each part carries at most 16 KiB (NCCL's
    /// NCCL_P2P_LL_THRESHOLD), 2 KiB across hosts over NET, so both ends pick the same protocol
    /// from the parts they agree on.
    #[test]
    fn small_p2p_parts_run_in_ll() {
        let one_host = CommShape::one_host(2, 64, 64);
        assert_eq!(p2p_proto(&one_host, 1, 1), abi::FN_PROTO_LL);
        assert_eq!(p2p_proto(&one_host, 16 << 10, 1), abi::FN_PROTO_LL);
        assert_eq!(p2p_proto(&one_host, (16 << 10) + 1, 1), abi::FN_PROTO_SIMPLE);
        assert_eq!(p2p_proto(&one_host, 64 << 10, 4), abi::FN_PROTO_LL);
        assert_eq!(p2p_proto(&one_host, 1 << 20, 16), abi::FN_PROTO_SIMPLE);
        let net = four_hosts(0);
        assert_eq!(p2p_proto(&net, 2 << 10, 1), abi::FN_PROTO_LL);
        assert_eq!(p2p_proto(&net, (2 << 10) + 1, 1), abi::FN_PROTO_SIMPLE);
    }

    #[test]
    fn big_messages_are_split_the_same_way_on_both_ends() {
        let two = CommShape::one_host(2, 64, 64);
        assert_eq!(p2p_parts(&two, 64, 8), 1);
        // Parts of at least 32 KiB between GPUs of one host, 64 KiB across hosts.
        assert_eq!(p2p_parts(&two, 64, 64 << 10), 2);
        assert_eq!(p2p_parts(&two, 64, 512 << 10), 16);
        let two_hosts = CommShape { link: crate::task::Link::Net, ..CommShape::one_host(2, 64, 64) };
        assert_eq!(p2p_parts(&two_hosts, 64, 512 << 10), 8);
        assert_eq!(p2p_parts(&two, 64, 1 << 30), 32);
        assert_eq!(p2p_parts(&two, 8, 1 << 30), 8);
        let eight_on_one_gpu = CommShape::one_host(8, 8, 4);
        assert_eq!(p2p_parts(&eight_on_one_gpu, 8, 1 << 30), 1);
        let s = std::ptr::null_mut();
        let ops = vec![
            (s, Task::Send { buf: 0, bytes: 1 << 30, peer: 1 }),
            (s, Task::Recv { buf: 0, bytes: 1 << 19, peer: 1 }),
        ];
        let l = plan(&two, &Allowed::ALL, &|_| 64, &ops).unwrap();
        assert_eq!(l[0].works.iter().map(|w| (w.blk, w.nParts)).collect::<Vec<_>>(), [(0, 32), (32, 16)]);
        assert_eq!(l[0].grid, 48);
        // A send and the receive that matches it get the same parts and protocol, at the sizes
        // around each threshold, between GPUs of one host and across hosts.
        let one_host = |rank| CommShape { rank, ..CommShape::one_host(4, 64, 64) };
        let layouts: [&dyn Fn(usize) -> CommShape; 2] = [&one_host, &four_hosts];
        for shape in layouts {
            for bytes in [1, 2 << 10, (2 << 10) + 1, 16 << 10, (16 << 10) + 1, 64 << 10, (64 << 10) + 16, 1 << 20] {
                let end = |rank: usize, task: Task| {
                    let l = plan(&shape(rank), &Allowed::ALL, &|_| 4, &[(s, task)]).unwrap();
                    (l[0].works[0].nParts, l[0].works[0].proto)
                };
                let sent = end(0, Task::Send { buf: 0, bytes, peer: 3 });
                assert_eq!(sent, end(3, Task::Recv { buf: 0, bytes, peer: 0 }), "{bytes} bytes");
            }
        }
    }

    /// A Simple part of 64-128 KiB to a peer through a net plugin runs in two steps, alike at both
    /// ends; over the built-in net, between ranks of one host and for other sizes, a slot's.
    #[test]
    fn a_plugin_peers_mid_sized_parts_run_in_two_steps() {
        let plugin = |rank| CommShape { net: Some(crate::task::NetLink::new(0, 0.0, 1)), ..four_hosts(rank) };
        let one = abi::FN_NET_ONE_MESSAGE_SIMPLE as usize;
        let s = std::ptr::null_mut();
        let step = |shape: &dyn Fn(usize) -> CommShape, bytes: usize| {
            let ends = [(0, Task::Send { buf: 0, bytes, peer: 3 }), (3, Task::Recv { buf: 0, bytes, peer: 0 })];
            let steps = ends.map(|(rank, task)| {
                let l = plan(&shape(rank), &Allowed::ALL, &|_| 4, &[(s, task)]).unwrap();
                l[0].works[0].scalar
            });
            assert_eq!(steps[0], steps[1], "{bytes} bytes: the ends step alike");
            steps[0]
        };
        assert_eq!(step(&plugin, one), 0);
        assert_eq!(step(&plugin, one + 16), (one / 2 + 16) as u64);
        assert_eq!(step(&plugin, one + 1), (one / 2 + 16) as u64, "halves of whole 16-byte units");
        assert_eq!(step(&plugin, 2 * one), one as u64);
        assert_eq!(step(&plugin, 2 * one + 16), 0);
        assert_eq!(step(&four_hosts, 2 * one), 0, "the built-in net");
        // Ranks 0 and 1 share a host: their messages never cross the net.
        let two_a_host = |rank| CommShape { hosts: Some(Arc::from([(0, 0), (0, 1), (1, 0), (1, 1)])), ..plugin(rank) };
        let l = plan(&two_a_host(0), &Allowed::ALL, &|_| 4, &[(s, Task::Send { buf: 0, bytes: 2 * one, peer: 1 })])
            .unwrap();
        assert_eq!(l[0].works[0].scalar, 0);
        assert_eq!(step(&two_a_host, 2 * one), one as u64);
    }

    /// An all-to-all of 8 ranks, two messages each way per pair, with launches of 4 works: every
    /// send is in the launch of the same index as its receive on the peer, and no launch holds
    /// more than 4.
    #[test]
    fn sends_and_receives_beyond_a_launch_go_by_rounds_both_ends_share() {
        let n = 8;
        let s = std::ptr::null_mut();
        // (is a send, peer, the message's place among those to or from that peer) -> launch index
        let launch_of = |rank: usize| -> HashMap<(bool, usize, u64), usize> {
            let shape = CommShape { rank, ..CommShape::one_host(n, 8, 4) };
            let ops: Vec<_> = (0..2u64)
                .flat_map(|k| {
                    (0..n).flat_map(move |p| {
                        let buf = 0x1000 * (k + 1);
                        [(s, Task::Send { buf, bytes: 64, peer: p }), (s, Task::Recv { buf, bytes: 64, peer: p })]
                    })
                })
                .collect();
            let l = plan_p2p(&shape, &|_| 4, &|b, p| p2p_proto(&shape, b, p), &ops, 4).unwrap();
            assert!(l.iter().all(|l| !l.works.is_empty() && l.works.len() <= 4 && l.kernel == KernelId::COPY));
            let mut at = HashMap::new();
            for (i, l) in l.iter().enumerate() {
                for w in &l.works {
                    let copy = w.type_ as u32 == abi::FN_WORK_COPY;
                    let peer = if copy { rank } else { w.root as usize };
                    let buf = if w.type_ as u32 == abi::FN_WORK_RECV { w.recvbuff as u64 } else { w.sendbuff as u64 };
                    assert!(at.insert((w.type_ as u32 != abi::FN_WORK_RECV, peer, buf), i).is_none());
                }
            }
            assert_eq!(at.len(), 2 * (2 * n - 1));
            at
        };
        let all: Vec<_> = (0..n).map(launch_of).collect();
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                for buf in [0x1000, 0x2000] {
                    assert_eq!(all[a][&(true, b, buf)], all[b][&(false, a, buf)], "{a} -> {b}, buffer {buf:#x}");
                }
            }
        }
    }

    #[test]
    fn a_lane_beyond_a_launch_takes_its_messages_in_order_one_a_launch() {
        let s = std::ptr::null_mut();
        let shape = CommShape { rank: 0, ..CommShape::one_host(8, 8, 4) };
        let to = |peer, buf| (s, Task::Send { buf, bytes: 64, peer });
        // Launches of 4 works: rank 1 is in rounds 0-1, rank 2 in rounds 2-3.
        let ops = [to(1, 1), to(2, 2), to(1, 3), to(2, 4), to(1, 5)];
        let l = plan_p2p(&shape, &|_| 4, &|b, p| p2p_proto(&shape, b, p), &ops, 4).unwrap();
        let bufs: Vec<Vec<u64>> = l.iter().map(|l| l.works.iter().map(|w| w.sendbuff as u64).collect()).collect();
        assert_eq!(bufs, [vec![1], vec![3], vec![5], vec![2], vec![4]]);
        // Within one launch's capacity, one launch.
        assert_eq!(plan_p2p(&shape, &|_| 4, &|b, p| p2p_proto(&shape, b, p), &ops, 5).unwrap().len(), 1);
    }

    #[test]
    fn unmatched_self_send_is_an_error() {
        let s = std::ptr::null_mut();
        let ops = vec![(s, Task::Send { buf: 1, bytes: 8, peer: 0 })];
        assert!(matches!(plan0(&ops), Err(Error::InvalidUsage(_))));
        let ops = vec![(s, Task::Send { buf: 1, bytes: 8, peer: 0 }), (s, Task::Recv { buf: 1, bytes: 4, peer: 0 })];
        assert!(matches!(plan0(&ops), Err(Error::InvalidUsage(_))));
    }
}
