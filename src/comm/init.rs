//! Creating a communicator: rendezvous over the bootstrap, topology, connections, and the
//! device-side state the kernels read; also ncclCommSplit and ncclCommShrink, which create one
//! from a parent.

use super::launch::LaunchState;
use super::watch::{News, Observer, Ops, RingCounters, WatchGpu};
use super::window::Windows;
use super::{Comm, CommConfig, Gpu, Resources, FLAG_ABORT, FLAG_ERROR};
use crate::abi::{self, fnDevComm, fnRing};
use crate::bootstrap::{Bootstrap, BootstrapId};
use crate::cuda::{self, DeviceBuffer, Event, HostMapped};
use crate::error::{Error, Result};
use crate::plugin::profiler::{self, Profiler};
use crate::plugin::tuner as tuner_plugin;
use crate::task::{Link, NetLink};
use crate::topo::tree::Trees;
use crate::topo::{self, Lsa, PeerInfo, Ring};
use crate::transport::conn_plan::ConnPlan;
use crate::transport::net::proxy::FaultHook;
use crate::transport::{self, net, Connections, Kind, NetNeeds, Path, Settings};
use crate::tuner::{self, Allowed};
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
    if crate::exit::forked_child() {
        crate::bail_usage!(
            "this process is a child made by fork() after its parent created a communicator: CUDA does not survive \
             fork, so create communicators in a fresh process (exec, or Python's \"spawn\" start method)"
        );
    }
    cuda::init()?;
    // After CUDA's own exit handlers are in place, so that ours runs first (crate::exit).
    crate::exit::install();
    let start = Instant::now();
    crate::debug::set_log_device(dev);
    let ctx = Arc::new(cuda::primary_context(dev)?);
    let _guard = ctx.enter()?;
    let timeout = Duration::from_secs(crate::env::bootstrap_timeout_s().max(1) as u64);
    let bootstrap = Bootstrap::init(id, rank, nranks, timeout)?;

    let me = peer_info(rank, dev)?;
    // Until init returns, this thread runs near our GPU: the threads it starts inherit that, and
    // the pinned host memory it allocates lands on the GPU's NUMA node (crate::affinity).
    let cpus = crate::affinity::for_gpu(dev, &me.bus_id_str());
    let _near_gpu = crate::affinity::Window::enter(cpus.as_ref());
    let (peers, kinds) = gather_peers(&bootstrap, &me)?;
    let on_net = transport::net_pairs(&kinds);
    let over_net: Vec<bool> = kinds[rank].iter().map(|k| *k == Kind::Net).collect();
    // One net for the communicator: its properties size the channels, its connections carry them.
    let net = match on_net {
        true => Some(net::init(&net::NetConfig { comm_id: bootstrap.magic(), ..config.net.clone() })?),
        false => None,
    };
    let net_link = match &net {
        Some(n) => agreed_net_link(&bootstrap, &**n)?,
        None => None,
    };
    warn_lazy_loading(&me, &peers);
    let nchannels = channel_count(&me, &peers, on_net.then_some(net_link.as_ref()), &config);
    let order = topo::ring_order(&peers);
    let ring = Ring::new(&order, rank);
    let trees = Trees::new(&order, &peers.iter().map(|p| p.host_hash).collect::<Vec<_>>());
    let plan = ConnPlan::from_env(nchannels, order, &trees, config.net_peer_channels);

    let (flags, lost, fault) = fault_hook()?;
    let (tuner_plugin, profiler) = plugins(&bootstrap, &peers, &config, rank);
    let needs = NetNeeds { dev, fault, timeout, net, profiler: profiler.clone(), cpus };
    // Alike on every rank: from every pair's kind, not only ours.
    let host_fifos = transport::host_fifos(&kinds);
    let limits = Allowed::for_connections(nranks, host_fifos, !host_fifos);
    // Alike on every rank, from every pair's kind.
    let reach: Vec<Vec<bool>> = kinds
        .iter()
        .enumerate()
        .map(|(a, row)| row.iter().enumerate().map(|(b, k)| a == b || *k == Kind::P2p).collect())
        .collect();
    let lsa = Lsa::new(rank, &reach);
    let transport = Connections::establish(&bootstrap, &plan, &peers, kinds, needs)?;

    let table = transport.table(&plan, rank);
    let proxy_waker = transport.proxy_waker();
    let watchdog = Duration::from_millis(watchdog_timeout_ms().max(0) as u64);
    let link = Link::slowest(on_net, host_fifos);
    let scratch = tuner::recursive_doubling_shape(nranks, trees.shape().nhosts, link);
    let tuning = Tuning { chunk_slots: ring_chunk_slots(on_net), scratch };
    let DeviceState { conns, ring_ranks, scratch, dev_comm } =
        DeviceState::new(&table, &plan, &ring, &trees, &flags, rank, nchannels, watchdog, tuning)?;
    // Nobody launches until every peer has mapped everyone's buffers.
    bootstrap.barrier()?;
    // From here on a lost peer stops our kernels and is reported by name, within the heartbeat
    // timeout at worst, instead of leaving them to the watchdog.
    let ops = Arc::new(Ops::default());
    let last = Arc::new(Event::new()?);
    let news = Arc::new(News::default());
    let watch_gpu = Arc::new(WatchGpu {
        ctx: ctx.clone(),
        flags: flags.clone(),
        last: last.clone(),
        counters: Mutex::new(RingCounters::new(ctx.clone(), &table, conns.ptr, (ring.prev, ring.next), nchannels)?),
    });
    let observer = Observer {
        comm_id: bootstrap.magic(),
        names: peers.iter().map(PeerInfo::describe).collect(),
        rank,
        lost: lost.clone(),
        news: news.clone(),
        ops: ops.clone(),
        gpu: Arc::downgrade(&watch_gpu),
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
        runtime_peers: Mutex::new(HashSet::new()),
        cpus,
        over_net,
        tree: trees.shape(),
        hosts: trees.host_places().into(),
        link,
        net: net_link,
        proxy_waker,
        limits,
        user_ops: Mutex::new(Vec::new()),
        registrations: Mutex::new(HashSet::new()),
        lsa,
        watchdog,
        lost,
        news,
        watcher,
        revoked: AtomicBool::new(false),
        ops,
        gpu: Some(Gpu {
            launch_state: Mutex::new(LaunchState::new(last)),
            copy_marks: [Event::new()?, Event::new()?],
            res: Some(Resources {
                transport: Mutex::new(transport),
                dev_comm,
                conns,
                _ring_ranks: ring_ranks,
                _scratch: scratch,
                flags,
                _watch: watch_gpu,
                windows: Mutex::new(Windows::default()),
                symmetric_ready: AtomicBool::new(false),
            }),
            ctx,
        }),
        leak: AtomicBool::new(false),
        tuner_plugin,
        profiler,
        colls_called: Default::default(),
    })
}

/// This communicator's contexts of the process's tuner and profiler plugins, if any
/// (docs/PLUGINS.md): each plugin's `init` with the communicator's ranks and hosts.
fn plugins(
    bootstrap: &Bootstrap,
    peers: &[PeerInfo],
    config: &CommConfig,
    rank: usize,
) -> (Option<Arc<tuner_plugin::Session>>, Option<Arc<Profiler>>) {
    let mut per_host: Vec<(u64, usize)> = Vec::new();
    for p in peers {
        match per_host.iter_mut().find(|(h, _)| *h == p.host_hash) {
            Some((_, n)) => *n += 1,
            None => per_host.push((p.host_hash, 1)),
        }
    }
    let counts = per_host.iter().map(|(_, n)| *n);
    let mut info = tuner_plugin::CommInfo {
        comm_id: bootstrap.magic(),
        nranks: peers.len(),
        nnodes: per_host.len(),
        min_ranks_per_node: counts.clone().min().unwrap_or(1),
        max_ranks_per_node: counts.max().unwrap_or(1),
        constants: crate::tuner::plugin_constants(),
    };
    let tuner = tuner_plugin::Session::start(&mut info, crate::transport::net::plugin_library);
    let profiler = Profiler::start(&profiler::CommInfo {
        comm_hash: bootstrap.magic(),
        name: config.name.as_deref().unwrap_or(""),
        nnodes: per_host.len(),
        nranks: peers.len(),
        rank,
    });
    (tuner, profiler)
}

/// What this rank tells the others about itself: host, process, GPU.
fn peer_info(rank: usize, dev: i32) -> Result<PeerInfo> {
    let mut bus_id = [0u8; 16];
    let s = cuda::pci_bus_id(dev)?;
    let n = s.len().min(16);
    bus_id[..n].copy_from_slice(&s.as_bytes()[..n]);
    Ok(PeerInfo {
        rank: rank as u32,
        host_hash: topo::host_hash(),
        pid: std::process::id(),
        dev,
        bus_id,
        host: PeerInfo::host_field(&crate::debug::host_name()),
        machine: topo::machine_hash(),
    })
}

/// Every rank's `PeerInfo` and every pair's transport kind: one allgather of the peer info with
/// each rank's transport settings (a pair uses the stricter of its two ends'), then our kinds
/// shared and checked against the peers' ([`transport::exchange_kinds`]).
fn gather_peers(bootstrap: &Bootstrap, me: &PeerInfo) -> Result<(Vec<PeerInfo>, transport::Kinds)> {
    let settings = Settings::from_env();
    let gathered = bootstrap.allgather(&[&me.encode()[..], &settings.encode()].concat())?;
    let (peers, peer_settings): (Vec<PeerInfo>, Vec<Settings>) = gathered
        .iter()
        .map(|b| {
            let (info, s) = b.split_at(b.len().min(PeerInfo::BYTES));
            Ok((PeerInfo::decode(info)?, Settings::decode(s)?))
        })
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    let mine: Vec<Kind> = peers
        .iter()
        .zip(&peer_settings)
        .map(|(p, s)| Ok(transport::select(me, p, &settings.stricter(s), link(me, p)?)))
        .collect::<Result<_>>()?;
    let kinds = transport::exchange_kinds(bootstrap, &mine)?;
    Ok((peers, kinds))
}

/// The NET link as the net plugin of every rank reports it (docs/NET.md, "What a net plugin's
/// properties change"), the weakest report when they differ, so that every rank sizes its channels
/// alike; `None` when some rank runs the built-in Socket net.
fn agreed_net_link(bootstrap: &Bootstrap, net: &dyn net::Net) -> Result<Option<NetLink>> {
    const BYTES: usize = 17;
    let mine = net::plugin_properties(net)?.map(|p| NetLink::new(p.speed_mbps, p.latency_us, p.max_comms));
    let mut record = [0u8; BYTES];
    if let Some(l) = mine {
        record[0] = 1;
        record[1..5].copy_from_slice(&l.speed_mbps.to_le_bytes());
        record[5..9].copy_from_slice(&u32::try_from(l.max_comms).unwrap_or(u32::MAX).to_le_bytes());
        record[9..].copy_from_slice(&l.latency_us.to_le_bytes());
    }
    let mut agreed: Option<NetLink> = None;
    for (r, b) in bootstrap.allgather(&record)?.iter().enumerate() {
        let b: &[u8; BYTES] = b
            .as_slice()
            .try_into()
            .map_err(|_| Error::Internal(format!("rank {r} sent {} bytes of NET properties, not {BYTES}", b.len())))?;
        if b[0] == 0 {
            return Ok(None);
        }
        let word = |i: usize| i32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let latency = f64::from_le_bytes(b[9..].try_into().expect("8 bytes"));
        let theirs = NetLink::new(word(1), latency as f32, word(5));
        agreed = Some(agreed.map_or(theirs, |a| a.weakest(theirs)));
    }
    Ok(agreed)
}

/// Warns, once a process, where ranks of this process share our GPU while CUDA loads modules
/// lazily: their kernels wait for each other, and a lazy load (of a kernel, or of the driver's
/// own code for a copy or memset) can wait for the device to go idle, which a kernel spinning on
/// a peer never does. Seen as a first iteration hanging now and then with the device API
/// (docs/ARCHITECTURE.md, "Windows and the device communicator"). NCCL never meets this: it
/// refuses two ranks on one GPU.
fn warn_lazy_loading(me: &PeerInfo, peers: &[PeerInfo]) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let sharing = peers.iter().filter(|p| p.rank != me.rank && p.same_process(me) && p.same_gpu(me)).count();
    if sharing == 0 || std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v.eq_ignore_ascii_case("EAGER")) {
        return;
    }
    ONCE.call_once(|| {
        crate::nccl_warn!(
            "rank {} shares GPU {} with {sharing} other rank(s) of this process; their kernels wait for each other, \
             which CUDA's lazy module loading can deadlock: set CUDA_MODULE_LOADING=EAGER before the first CUDA call",
            me.rank,
            me.dev
        )
    });
}

/// The communicator's channel count: from the ranks sharing a GPU, within the config's maxCTAs;
/// when any pair is on NET (`net`: `Some` then, holding a plugin's link or `None` for Socket)
/// what the NET link needs but no fewer than the user asks for, within the NET transport's most
/// and a plugin's `maxComms` (`tuner::net_channels`); otherwise raised to the config's minCTAs.
fn channel_count(me: &PeerInfo, peers: &[PeerInfo], net: Option<Option<&NetLink>>, config: &CommConfig) -> usize {
    let sharing = peers.iter().filter(|p| p.same_gpu(me)).count();
    if sharing > 1 {
        crate::nccl_info!(
            crate::debug::Subsys::INIT,
            "{sharing} ranks share GPU {} ({}); NCCL refuses this, ferronickel allows it",
            me.dev,
            me.bus_id_str()
        );
    }
    let max_per_gpu = peers.iter().map(|p| peers.iter().filter(|q| q.same_gpu(p)).count()).max().unwrap_or(1);
    let budget = topo::channel_count(max_per_gpu, topo::min_nchannels(), topo::max_nchannels());
    let budget = config.max_ctas.map_or(budget, |max| budget.min(max.max(1)));
    match net {
        Some(link) => {
            crate::tuner::net_channels(link, budget, net::conn::MAX_CHANNELS, topo::least_channels(config.min_ctas))
        }
        None => config.min_ctas.map_or(budget, |min| budget.max(min).min(abi::FN_MAX_CHANNELS as usize)),
    }
}

/// The communicator's flags the kernels poll, where the first lost peer's text goes, and the
/// hook a NET connection that fails later calls: it stops the communicator and names the peer,
/// as a lost rank does (comm::watch).
fn fault_hook() -> Result<(Arc<HostMapped>, Arc<OnceLock<String>>, FaultHook)> {
    let flags = Arc::new(HostMapped::zeroed(2)?);
    let lost = Arc::new(OnceLock::new());
    let fault: FaultHook = {
        let (lost, flags) = (lost.clone(), flags.clone());
        Arc::new(move |m: String| {
            crate::nccl_warn!("{m}");
            let _ = lost.set(m);
            flags.set(FLAG_ABORT, 1);
        })
    };
    Ok((flags, lost, fault))
}

/// Simple slots a ring collective sends per hop before it waits on its receive (`fnDevComm`'s
/// `chunkSlots`), alike on every rank since both ends of a hop must cut the same steps. Over NET
/// half the FIFO, as NCCL's chunk steps: a step there makes a round trip through two proxies and a
/// socket, and with one slot in flight the hop's pipe stands empty meanwhile (docs/NET.md, "A hop
/// kept full"). One elsewhere, where a step is a store away.
fn ring_chunk_slots(on_net: bool) -> u32 {
    match on_net {
        true => abi::FN_NSTEPS / 2,
        false => 1,
    }
}

/// What the kernels read of a communicator, in device memory: the connection table, the ring's
/// user ranks, the scratch of recursive doubling where it can run, and the `fnDevComm` pointing at
/// them.
struct DeviceState {
    conns: DeviceBuffer,
    ring_ranks: DeviceBuffer,
    scratch: Option<DeviceBuffer>,
    dev_comm: DeviceBuffer,
}

/// How the kernels cut and stage work, alike on every rank: Simple slots per ring chunk
/// ([`ring_chunk_slots`]), and whether recursive doubling can run, which needs the scratch.
struct Tuning {
    chunk_slots: u32,
    scratch: bool,
}

impl DeviceState {
    #[allow(clippy::too_many_arguments)]
    fn new(
        table: &[abi::fnConn],
        plan: &ConnPlan,
        ring: &Ring,
        trees: &Trees,
        flags: &HostMapped,
        rank: usize,
        nchannels: usize,
        watchdog: Duration,
        tuning: Tuning,
    ) -> Result<DeviceState> {
        let conns = DeviceBuffer::zeroed(std::mem::size_of_val(table))?;
        conns.write(0, table)?;
        let scratch = tuning.scratch.then(|| DeviceBuffer::zeroed(abi::FN_RECDBL_SCRATCH as usize)).transpose()?;
        let ring_ranks_host: Vec<i32> = ring.user_ranks.iter().map(|&r| r as i32).collect();
        let ring_ranks = DeviceBuffer::zeroed(4 * plan.nranks)?;
        ring_ranks.write(0, &ring_ranks_host)?;
        let mut dc = fnDevComm {
            rank: rank as i32,
            nRanks: plan.nranks as i32,
            nChannels: nchannels as i32,
            slotBytes: plan.slot_bytes() as i32,
            conns: conns.ptr as *mut _,
            abortFlag: (flags.dev + 4 * FLAG_ABORT as u64) as *mut _,
            errorFlag: (flags.dev + 4 * FLAG_ERROR as u64) as *mut _,
            timeoutNs: watchdog.as_nanos() as u64,
            chunkSlots: tuning.chunk_slots,
            scratch: scratch.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr as *mut _),
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
            dc.trees[c] = trees.dev_tree(c, rank);
        }
        let dev_comm = DeviceBuffer::zeroed(std::mem::size_of::<fnDevComm>())?;
        dev_comm.write(0, std::slice::from_ref(&dc))?;
        Ok(DeviceState { conns, ring_ranks, scratch, dev_comm })
    }
}

/// The path between our GPU and `peer`'s on one host, or `None` when they cannot reach each
/// other's memory. Without a PCI topology a pair of GPUs counts as SYS (the farthest), or NVL when
/// the driver reports native P2P atomics (NVLink); a peer's GPU that this process cannot see
/// (CUDA_VISIBLE_DEVICES) is unreachable.
fn link(me: &PeerInfo, peer: &PeerInfo) -> Result<Option<Path>> {
    if me.host_hash != peer.host_hash {
        return Ok(None);
    }
    if me.same_gpu(peer) {
        return Ok(Some(Path::Loc));
    }
    let dev = if me.same_process(peer) { Some(peer.dev) } else { cuda::device_by_bus_id(&peer.bus_id_str())? };
    let Some(dev) = dev else { return Ok(None) };
    if !cuda::can_access_peer(me.dev, dev)? || !cuda::can_access_peer(dev, me.dev)? {
        return Ok(None);
    }
    Ok(Some(if cuda::p2p_native_atomics(me.dev, dev)? { Path::Nvl } else { Path::Sys }))
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

    /// Over NET a ring chunk is several steps; at most half the FIFO, so that a rank's sends ahead
    /// of its receives never fill a hop (docs/NET.md, "A hop kept full").
    #[test]
    fn ring_chunks_take_half_the_fifo_over_net() {
        assert_eq!(ring_chunk_slots(false), 1);
        assert!(ring_chunk_slots(true) > 1);
        assert!(2 * ring_chunk_slots(true) <= abi::FN_NSTEPS);
    }

    /// The config's CTA limits bound the channels; over NET the user's minimum raises them only
    /// within the NET transport's most and a plugin's maxComms, whose connections those are.
    #[test]
    fn channel_limits_apply_within_the_net_caps() {
        let peer = |rank: u32| PeerInfo {
            rank,
            host_hash: u64::from(rank),
            pid: rank,
            dev: 0,
            bus_id: [rank as u8 + 1; 16],
            host: PeerInfo::host_field("h"),
            machine: 0,
        };
        let peers: Vec<PeerInfo> = (0..2).map(peer).collect();
        let cfg =
            |min: Option<usize>, max: Option<usize>| CommConfig { min_ctas: min, max_ctas: max, ..Default::default() };
        let count = |net, c: &CommConfig| channel_count(&peers[0], &peers, net, c);
        let slow = NetLink::new(10_000, 0.0, 1024);
        let narrow = NetLink::new(10_000, 0.0, 3);
        // One host: every channel, within maxCTAs; minCTAs raises a smaller budget.
        assert_eq!(count(None, &cfg(None, None)), 64);
        assert_eq!(count(None, &cfg(None, Some(8))), 8);
        assert_eq!(count(None, &cfg(Some(16), Some(16))), 16);
        // Over NET: the link's need, raised to minCTAs but never past 8 or maxComms.
        assert_eq!(count(Some(Some(&slow)), &cfg(None, None)), 2);
        assert_eq!(count(Some(Some(&slow)), &cfg(Some(6), None)), 6);
        assert_eq!(count(Some(Some(&slow)), &cfg(Some(16), None)), net::conn::MAX_CHANNELS);
        assert_eq!(count(Some(Some(&narrow)), &cfg(Some(6), None)), 3);
        assert_eq!(count(Some(None), &cfg(None, Some(1))), 1);
    }

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
