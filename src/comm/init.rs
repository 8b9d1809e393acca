//! Creating a communicator: rendezvous over the bootstrap, topology, connections, and the
//! device-side state the kernels read; also ncclCommSplit and ncclCommShrink, which create one
//! from a parent.

use super::launch::LaunchState;
use super::watch::{Observer, Ops};
use super::{Comm, CommConfig, Gpu, Resources, FLAG_ABORT, FLAG_ERROR};
use crate::abi::{self, fnDevComm, fnRing};
use crate::bootstrap::{Bootstrap, BootstrapId};
use crate::cuda::{self, DeviceBuffer, Event, HostMapped};
use crate::error::{Error, Result};
use crate::topo::{self, PeerInfo, Ring};
use crate::transport::net;
use crate::transport::p2p::{self, ConnPlan, P2pTransport};
use crate::types::NCCL_SPLIT_NOCOLOR;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

crate::int_param!(
    /// NCCL_WATCHDOG_TIMEOUT_MS: how long a kernel may wait on a peer before it gives up and the
    /// communicator reports an error through ncclCommGetAsyncError (0 = wait forever).
    watchdog_timeout_ms, "NCCL_WATCHDOG_TIMEOUT_MS", 30 * 60 * 1000
);

/// Creates a rank's communicator on device `dev`: rendezvous, topology, connections.
pub fn init_rank(id: &BootstrapId, nranks: usize, rank: usize, dev: i32, config: CommConfig) -> Result<Comm> {
    cuda::init()?;
    let start = Instant::now();
    crate::debug::set_log_device(dev);
    let ctx = Arc::new(cuda::primary_context(dev)?);
    let _guard = ctx.enter()?;
    let timeout = Duration::from_secs(crate::env::bootstrap_timeout_s().max(1) as u64);
    let bootstrap = Bootstrap::init(id, rank, nranks, timeout)?;

    let me = PeerInfo {
        rank: rank as u32,
        host_hash: topo::host_hash(),
        pid: std::process::id(),
        dev,
        bus_id: {
            let mut b = [0u8; 16];
            let s = cuda::pci_bus_id(dev)?;
            let n = s.len().min(16);
            b[..n].copy_from_slice(&s.as_bytes()[..n]);
            b
        },
        host: PeerInfo::host_field(&crate::debug::host_name()),
    };
    let peers: Vec<PeerInfo> =
        bootstrap.allgather(&me.encode())?.iter().map(|b| PeerInfo::decode(b)).collect::<Result<_>>()?;
    // Ranks on other hosts are reached through the NET transport (every rank has some, or none).
    let remote: Vec<usize> = peers.iter().filter(|p| p.host_hash != me.host_hash).map(|p| p.rank as usize).collect();
    let sharing = peers.iter().filter(|p| p.same_gpu(&me)).count();
    if sharing > 1 {
        crate::nccl_info!(
            crate::debug::Subsys::INIT,
            "{sharing} ranks share GPU {} ({}); NCCL refuses this, ferronickel allows it",
            dev,
            me.bus_id_str()
        );
    }
    let max_per_gpu = peers.iter().map(|p| peers.iter().filter(|q| q.same_gpu(p)).count()).max().unwrap_or(1);
    let mut nchannels = topo::channel_count(max_per_gpu, topo::min_nchannels(), topo::max_nchannels());
    if !remote.is_empty() {
        nchannels = nchannels.min(net::conn::MAX_CHANNELS);
    }
    if let Some(max) = config.max_ctas {
        nchannels = nchannels.min(max.max(1));
    }
    if let Some(min) = config.min_ctas {
        nchannels = nchannels.max(min).min(abi::FN_MAX_CHANNELS as usize);
    }
    let order = topo::ring_order(&peers);
    let ring = Ring::new(&order, rank);
    let plan = ConnPlan {
        nranks,
        ring_channels: nchannels,
        p2p_channels: (p2p::p2p_nchannels().clamp(1, abi::FN_MAX_CHANNELS as i64)) as usize,
        order,
        fifo_bytes: p2p::fifo_bytes(p2p::buffsize()),
    };

    let (arena, addr) = P2pTransport::allocate(&plan, rank)?;
    let addrs =
        bootstrap.allgather(&addr.encode())?.iter().map(|b| p2p::ArenaAddr::decode(b)).collect::<Result<Vec<_>>>()?;
    let transport = P2pTransport::connect(arena, rank, &me, &peers, &addrs, &plan)?;
    let flags = Arc::new(HostMapped::zeroed(2)?);
    let lost = Arc::new(OnceLock::new());
    let net = if remote.is_empty() {
        None
    } else {
        Some(connect_net(&bootstrap, &plan, &remote, &peers, dev, &lost, &flags, timeout)?)
    };

    let mut table = transport.conn_table(&plan, rank);
    if let Some(net) = &net {
        for &p in &remote {
            for ch in 0..plan.channels(rank, p) {
                table[p * abi::FN_MAX_CHANNELS as usize + ch] = net.conn(p, ch).expect("connected above");
            }
        }
    }
    let conns = DeviceBuffer::zeroed(std::mem::size_of_val(&table[..]))?;
    conns.write(0, &table)?;
    let ring_ranks_host: Vec<i32> = ring.user_ranks.iter().map(|&r| r as i32).collect();
    let ring_ranks = DeviceBuffer::zeroed(4 * nranks)?;
    ring_ranks.write(0, &ring_ranks_host)?;
    let watchdog = Duration::from_millis(watchdog_timeout_ms().max(0) as u64);

    let mut dc = fnDevComm {
        rank: rank as i32,
        nRanks: nranks as i32,
        nChannels: nchannels as i32,
        slotBytes: plan.slot_bytes() as i32,
        conns: conns.ptr as *mut _,
        abortFlag: (flags.dev + 4 * FLAG_ABORT as u64) as *mut _,
        errorFlag: (flags.dev + 4 * FLAG_ERROR as u64) as *mut _,
        timeoutNs: watchdog.as_nanos() as u64,
        ..Default::default()
    };
    for c in 0..nchannels {
        dc.rings[c] = fnRing {
            prev: ring.prev as i32,
            next: ring.next as i32,
            index: ring.index as i32,
            pad: 0,
            userRanks: ring_ranks.ptr as *mut _,
        };
    }
    let dev_comm = DeviceBuffer::zeroed(std::mem::size_of::<fnDevComm>())?;
    dev_comm.write(0, std::slice::from_ref(&dc))?;
    // Nobody launches until every peer has mapped everyone's buffers.
    bootstrap.barrier()?;
    // From here on a lost peer stops our kernels and is reported by name, within the heartbeat
    // timeout at worst, instead of leaving them to the watchdog.
    let ops = Arc::new(Ops::default());
    let last = Arc::new(Event::new()?);
    let observer = Observer {
        comm_id: bootstrap.magic(),
        names: peers.iter().map(PeerInfo::describe).collect(),
        rank,
        lost: lost.clone(),
        flags: flags.clone(),
        ops: ops.clone(),
        ctx: ctx.clone(),
        last: last.clone(),
    };
    // One rank per host watches FERRONICKEL_HANG_REPORT_FILE, so one touch gives one report.
    let first_on_host =
        peers.iter().filter(|p| p.host_hash == me.host_hash).map(|p| p.rank as usize).min() == Some(rank);
    let watcher = bootstrap.watch(observer, first_on_host)?;

    crate::nccl_info!(
        crate::debug::Subsys::INIT,
        "comm rank {rank}/{nranks} on device {dev} ({}) ready: {nchannels} channels, ring {:?}, {} B FIFO slots, init {:.3} s",
        me.bus_id_str(),
        ring.user_ranks,
        plan.slot_bytes(),
        start.elapsed().as_secs_f64()
    );
    Ok(Comm {
        rank,
        nranks,
        dev,
        cc_major: cuda::compute_capability_major(dev)?,
        config,
        bootstrap,
        conns: plan,
        user_ops: Mutex::new(Vec::new()),
        registrations: Mutex::new(HashSet::new()),
        watchdog,
        lost,
        watcher,
        revoked: AtomicBool::new(false),
        ops,
        gpu: Some(Gpu {
            launch_state: Mutex::new(LaunchState::new(last)),
            copy_marks: [Event::new()?, Event::new()?],
            res: Some(Resources {
                _net: net,
                _transport: transport,
                dev_comm,
                _conns: conns,
                _ring_ranks: ring_ranks,
                flags,
            }),
            ctx,
        }),
        leak: AtomicBool::new(false),
    })
}

/// Connects this rank to the ranks on other hosts (`remote`) on every channel the plan gives
/// them, through the NET transport; a connection that fails later stops the communicator and
/// names the peer, as a lost rank does.
#[allow(clippy::too_many_arguments)]
fn connect_net(
    bootstrap: &Bootstrap,
    plan: &ConnPlan,
    remote: &[usize],
    peers: &[PeerInfo],
    dev: i32,
    lost: &Arc<OnceLock<String>>,
    flags: &Arc<HostMapped>,
    timeout: Duration,
) -> Result<net::conn::NetTransport> {
    let rank = bootstrap.rank();
    let conns: Vec<(usize, usize)> =
        remote.iter().flat_map(|&p| (0..plan.channels(rank, p)).map(move |ch| (p, ch))).collect();
    let (lost, flags) = (lost.clone(), flags.clone());
    let setup = net::conn::Setup {
        dev,
        fifo_bytes: plan.fifo_bytes,
        names: peers.iter().map(PeerInfo::describe).collect(),
        fault: Arc::new(move |m: String| {
            crate::nccl_warn!("{m}");
            let _ = lost.set(m);
            flags.set(FLAG_ABORT, 1);
        }),
        timeout,
        net: net::NetConfig::default(),
    };
    net::conn::NetTransport::connect(bootstrap, &conns, &setup, &|bytes| {
        let mem = HostMapped::zeroed(bytes.div_ceil(4))?;
        // SAFETY: the pinned allocation lives as long as its owner, moved into the block.
        Ok(unsafe { net::proxy::HostBlock::new(mem.host_ptr(), mem.dev, bytes, Box::new(mem)) })
    })
}

/// ncclCommSplit: ranks with the same color form a new communicator, ordered by (key, rank).
pub fn split(parent: &Comm, color: i32, key: i32, config: CommConfig) -> Result<Option<Comm>> {
    let mine: Vec<u8> = [color.to_le_bytes(), key.to_le_bytes()].concat();
    let all = parent.bootstrap.allgather(&mine)?;
    let decoded: Vec<(i32, i32)> = all
        .iter()
        .map(|b| {
            let b: [u8; 8] = b.as_slice().try_into().map_err(|_| Error::Internal("bad split record".into()))?;
            Ok((i32::from_le_bytes(b[..4].try_into().unwrap()), i32::from_le_bytes(b[4..].try_into().unwrap())))
        })
        .collect::<Result<_>>()?;
    if color == NCCL_SPLIT_NOCOLOR {
        return Ok(None);
    }
    let members = split_members(&decoded, color);
    regroup(parent, &members, config).map(Some)
}

/// ncclCommShrink: the ranks not in `excluded` form a new communicator, in parent-rank order.
/// Excluded ranks take no part (they may be dead), so nothing goes around the parent's ring.
pub fn shrink(parent: &Comm, excluded: &[usize], config: CommConfig) -> Result<Comm> {
    let members = survivors(parent.nranks, excluded);
    if !members.contains(&parent.rank) {
        crate::bail_usage!("rank {} is in excludeRanksList: excluded ranks must not call ncclCommShrink", parent.rank);
    }
    regroup(parent, &members, config)
}

/// The parent ranks left after excluding some, in order.
pub fn survivors(nranks: usize, excluded: &[usize]) -> Vec<usize> {
    (0..nranks).filter(|r| !excluded.contains(r)).collect()
}

/// Creates the communicator of `members` (parent ranks, in new-rank order; we are one of them).
fn regroup(parent: &Comm, members: &[usize], config: CommConfig) -> Result<Comm> {
    let new_rank = members.iter().position(|&r| r == parent.rank).expect("caller checked membership");
    let id = crate::bootstrap::share_id(&parent.bootstrap, members)?;
    init_rank(&id, members.len(), new_rank, parent.dev, config)
}

/// The parent ranks that share `color`, in new-rank order: by key, then by parent rank.
pub fn split_members(colors_keys: &[(i32, i32)], color: i32) -> Vec<usize> {
    let mut m: Vec<usize> = (0..colors_keys.len()).filter(|&r| colors_keys[r].0 == color).collect();
    m.sort_by_key(|&r| (colors_keys[r].1, r));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrink_keeps_the_others_in_order() {
        assert_eq!(survivors(5, &[1, 3]), vec![0, 2, 4]);
        assert_eq!(survivors(2, &[]), vec![0, 1]);
    }

    #[test]
    fn split_orders_by_key_then_rank() {
        let ck = [(0, 5), (1, 0), (0, 1), (0, 5), (NCCL_SPLIT_NOCOLOR, 0)];
        assert_eq!(split_members(&ck, 0), vec![2, 0, 3]);
        assert_eq!(split_members(&ck, 1), vec![1]);
        assert!(split_members(&ck, 7).is_empty());
    }
}
