//! The communicator: one rank's connections, device resources and health.
//!
//! [`registry`] maps the C handle to it, [`init`] creates it (also by split and shrink), and
//! [`launch`] is the executor that runs planned groups on it.

pub mod init;
pub mod launch;
mod profile;
pub mod registry;
mod watch;
pub mod window;

pub use init::{init_rank, shrink, split};
pub use registry::{CommHandle, Phase};

use crate::abi;
use crate::bootstrap::liveness::Watcher;
use crate::bootstrap::Bootstrap;
use crate::cuda::{Context, DeviceBuffer, Event, HostMapped};
use crate::error::{Error, Result};
use crate::plugin::profiler::Profiler;
use crate::plugin::tuner::Session as TunerSession;
use crate::task::{CommShape, DevOp, Link, NetLink};
use crate::topo::tree::TreeShape;
use crate::topo::Lsa;
use crate::transport::conn_plan::ConnPlan;
use crate::transport::Connections;
use crate::tuner::Allowed;
use crate::types::ncclDataType_t;
use launch::LaunchState;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use watch::{News, Ops};
use window::Windows;

crate::int_param!(
    /// NCCL_CHECK_POINTERS: check that buffers are device memory before enqueuing (default on).
    check_pointers, "NCCL_CHECK_POINTERS", 1
);

/// The parts of `ncclConfig_t` we act on, with NCCL's defaults filled in.
#[derive(Debug, Clone, Default)]
pub struct CommConfig {
    pub blocking: bool,
    pub min_ctas: Option<usize>,
    pub max_ctas: Option<usize>,
    pub name: Option<String>,
    /// `netName` and `trafficClass`: which net the NET transport uses and what it asks of it.
    pub net: crate::transport::net::NetConfig,
    /// `nChannelsPerNetPeer` (or NCCL_NCHANNELS_PER_NET_PEER): the channels a send/recv with a
    /// peer on another host splits over (`ConnPlan::net_peer_channels`).
    pub net_peer_channels: Option<usize>,
}

crate::int_param!(
    /// NCCL_COMM_BLOCKING: 0 or 1 overrides every communicator's config `blocking`.
    comm_blocking_env, "NCCL_COMM_BLOCKING", -1
);
crate::int_param!(
    /// NCCL_MIN_CTAS: 1 or more overrides every communicator's config `minCTAs`.
    min_ctas_env, "NCCL_MIN_CTAS", 0
);
crate::int_param!(
    /// NCCL_MAX_CTAS: 1 or more overrides every communicator's config `maxCTAs`.
    max_ctas_env, "NCCL_MAX_CTAS", 0
);

crate::int_param!(
    /// NCCL_NCHANNELS_PER_NET_PEER: 1 or more overrides every communicator's config
    /// `nChannelsPerNetPeer`.
    nchannels_per_net_peer_env, "NCCL_NCHANNELS_PER_NET_PEER", 0
);

impl CommConfig {
    /// NCCL's defaults (blocking, nothing else set) with the environment's overrides: the config
    /// of a communicator made without one.
    pub fn from_env() -> CommConfig {
        CommConfig { blocking: true, ..Default::default() }.with_env()
    }

    /// The config with the environment's overrides, which NCCL applies to every communicator's
    /// config: NCCL_COMM_BLOCKING, NCCL_MIN_CTAS, NCCL_MAX_CTAS and NCCL_NCHANNELS_PER_NET_PEER.
    pub fn with_env(self) -> CommConfig {
        self.overridden(comm_blocking_env(), min_ctas_env(), max_ctas_env(), nchannels_per_net_peer_env())
    }

    /// `blocking` (0 or 1), `min`, `max` and `net_peer` (1 or more; the CTAs at most
    /// FN_MAX_CHANNELS) replace the config's; other values leave it. A minimum above the maximum
    /// becomes the maximum, as in NCCL.
    fn overridden(mut self, blocking: i64, min: i64, max: i64, net_peer: i64) -> CommConfig {
        if blocking == 0 || blocking == 1 {
            self.blocking = blocking == 1;
        }
        if net_peer >= 1 {
            self.net_peer_channels = Some(net_peer.min(abi::FN_MAX_CHANNELS as i64) as usize);
        }
        let ctas = |v: i64| (v >= 1).then(|| (v as usize).min(abi::FN_MAX_CHANNELS as usize));
        self.min_ctas = ctas(min).or(self.min_ctas);
        self.max_ctas = ctas(max).or(self.max_ctas);
        if let (Some(lo), Some(hi)) = (self.min_ctas, self.max_ctas) {
            if lo > hi {
                crate::nccl_info!(
                    crate::debug::Subsys::ENV,
                    "minCTAs {lo} is larger than maxCTAs {hi}: both set to {hi}, as NCCL does"
                );
                self.min_ctas = Some(hi);
            }
        }
        self
    }
}

/// A user reduction operator from `ncclRedOpCreatePreMulSum`.
#[derive(Debug, Clone, Copy)]
pub struct UserOp {
    pub dtype: ncclDataType_t,
    pub op: DevOp,
}

/// Device resources, released with the communicator's context current.
struct Resources {
    /// Our FIFO arenas and our mappings of the peers' (unregistered and unmapped on drop), and
    /// the NET connections, to which a group may add a peer (`Comm::connect_peers`).
    transport: Mutex<Connections>,
    dev_comm: DeviceBuffer,
    /// The kernels' connection table, `conns[peer * FN_MAX_CHANNELS + ch]`.
    conns: DeviceBuffer,
    _ring_ranks: DeviceBuffer,
    /// `fnDevComm.scratch`, where recursive doubling can run.
    _scratch: Option<DeviceBuffer>,
    /// [abort requested by the host, error reported by the device]; shared with the liveness
    /// watcher, which raises the abort flag when a peer is lost.
    flags: Arc<HostMapped>,
    /// What the liveness watcher borrows (it holds only a `Weak`): freed here, with the rest.
    _watch: Arc<watch::WatchGpu>,
    /// Symmetric windows and device communicators, unmapped here with the rest.
    windows: Mutex<Windows>,
    /// The symmetric kernels' barrier memory exists (set once, with it): until then a collective
    /// need not look for its buffers among the windows.
    symmetric_ready: AtomicBool,
}

/// How long the first error after a watchdog timeout waits for the hang report.
const REPORT_WITHIN: Duration = Duration::from_secs(2);

const FLAG_ABORT: usize = 0;
const FLAG_ERROR: usize = 1;

/// An initialised communicator.
pub struct Comm {
    pub rank: usize,
    pub nranks: usize,
    pub dev: i32,
    /// Compute capability major of our GPU (fp8 needs 9).
    pub cc_major: i32,
    pub config: CommConfig,
    pub bootstrap: Bootstrap,
    /// Which connections exist after init and how many channels each has (rings use
    /// `ring_channels`).
    pub conns: ConnPlan,
    /// Peers connected since, when a group first needed them (`plan.runtime_channels()` each).
    runtime_peers: Mutex<HashSet<usize>>,
    /// The CPUs near our GPU that our setup binds to (`crate::affinity`; `None`: unbound).
    cpus: Option<crate::affinity::CpuSet>,
    /// Which peers we reach over NET (on other hosts).
    over_net: Vec<bool>,
    /// The Tree algorithm's hosts, depth and fan-out (the trees themselves are in the device comm).
    pub tree: TreeShape,
    /// Each rank's host and place in its host's chain, alike on every rank (`CommShape::hosts`).
    hosts: Arc<[(u32, u32)]>,
    /// The slowest kind of connection between two of its ranks (alike on every rank).
    pub link: Link,
    /// The NET link as a net plugin reports it (alike on every rank); `None`: no NET, or the
    /// built-in Socket net.
    pub net: Option<NetLink>,
    /// Wakes the NET proxy thread when this communicator launches kernels (`None`: no NET).
    proxy_waker: Option<crate::transport::net::proxy::Waker>,
    /// What this communicator's connections allow the tuner (host-memory FIFOs rule out some
    /// kernels, and copy engines need P2P); intersected with NCCL_ALGO / NCCL_PROTO per launch.
    pub limits: Allowed,
    pub user_ops: Mutex<Vec<Option<UserOp>>>,
    pub registrations: Mutex<HashSet<usize>>,
    /// Our LSA team (docs/ARCHITECTURE.md, "Windows and the device communicator").
    pub lsa: Lsa,
    watchdog: Duration,
    /// Set once, by the liveness watcher, when a rank of this communicator is lost: what was lost
    /// and how it was noticed.
    lost: Arc<OnceLock<String>>,
    /// Ranks that left in order, and the last hang report's summary (from the watcher).
    news: Arc<News>,
    /// Watches the ring neighbours (bootstrap::liveness); stopped first when the comm goes.
    watcher: Option<Watcher>,
    /// ncclCommRevoke was called: our kernels were stopped on purpose, and only shrink, abort,
    /// destroy and queries are allowed.
    revoked: AtomicBool,
    /// Our operations so far, for hang reports.
    ops: Arc<Ops>,
    /// The GPU side; `None` only for communicators that unit tests build without a GPU to
    /// exercise argument checking.
    gpu: Option<Gpu>,
    leak: AtomicBool,
    /// This communicator's contexts of the tuner and profiler plugins (docs/PLUGINS.md).
    pub tuner_plugin: Option<Arc<TunerSession>>,
    pub profiler: Option<Arc<Profiler>>,
    /// Collectives this rank has called so far (queued, in issue order): which ones a rank that
    /// left took part in ([`Comm::check_peers_coll`]).
    colls_called: AtomicU64,
}

/// A communicator's context, device resources and launch ordering.
struct Gpu {
    ctx: Arc<Context>,
    launch_state: Mutex<LaunchState>,
    /// By [`launch::CopyMark`].
    copy_marks: [Event; 2],
    res: Option<Resources>,
}

impl Comm {
    /// A communicator with no GPU behind it, for unit tests of argument checking: everything
    /// up to the launch works, the launch itself fails.
    #[cfg(test)]
    pub fn without_gpu(bootstrap: Bootstrap, cc_major: i32) -> Comm {
        let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
        let order: Vec<usize> = (0..nranks).collect();
        Comm {
            rank,
            nranks,
            dev: 0,
            cc_major,
            config: CommConfig { blocking: true, ..Default::default() },
            bootstrap,
            conns: ConnPlan::new(1, 1, order.clone(), 0, crate::transport::conn_plan::InitPairs::All),
            runtime_peers: Mutex::new(HashSet::new()),
            cpus: None,
            over_net: vec![false; nranks],
            tree: TreeShape::chain(nranks),
            hosts: (0..nranks as u32).map(|r| (0, r)).collect(),
            link: Link::P2p,
            net: None,
            proxy_waker: None,
            limits: Allowed::ALL,
            user_ops: Mutex::new(Vec::new()),
            registrations: Mutex::new(HashSet::new()),
            lsa: Lsa { rank, size: nranks },
            watchdog: Duration::ZERO,
            lost: Arc::new(OnceLock::new()),
            news: Arc::new(News::default()),
            watcher: None,
            revoked: AtomicBool::new(false),
            ops: Arc::new(Ops::default()),
            gpu: None,
            leak: AtomicBool::new(false),
            tuner_plugin: None,
            profiler: None,
            colls_called: Default::default(),
        }
    }

    fn gpu(&self) -> Result<(&Gpu, &Resources)> {
        match &self.gpu {
            Some(g @ Gpu { res: Some(r), .. }) => Ok((g, r)),
            _ => Err(Error::Internal(format!("rank {}: communicator has no GPU resources", self.rank))),
        }
    }

    /// Fails if a peer was lost, a kernel reported a timeout, or the communicator was aborted.
    pub fn check_health(&self) -> Result<()> {
        if let Some(what) = self.lost.get() {
            return Err(Error::Remote(format!(
                "rank {}: this communicator lost {what}; its operations were stopped. Abort it (ncclCommAbort), \
                 or shrink it (ncclCommShrink) to go on without that rank",
                self.rank
            )));
        }
        let Ok((_, res)) = self.gpu() else { return Ok(()) };
        let flags = &res.flags;
        if flags.get(FLAG_ABORT) != 0 && !self.is_revoked() {
            crate::bail_usage!("communicator was aborted");
        }
        match flags.get(FLAG_ERROR) {
            0 => Ok(()),
            // Kernels that stopped because ncclCommRevoke asked them to.
            x if x == abi::FN_DEV_ABORTED && self.is_revoked() => Ok(()),
            x if x == abi::FN_DEV_TIMEOUT => Err(Error::Remote(format!(
                "rank {}: a collective waited more than {:?} (NCCL_WATCHDOG_TIMEOUT_MS) for a peer; a rank did not \
                 call it or called it with different arguments ({}). Abort the communicator.",
                self.rank,
                self.watchdog,
                self.hang_report()
            ))),
            x => Err(Error::Internal(format!("rank {}: device reported error code {x}", self.rank))),
        }
    }

    /// The hang report's summary, asked for the first time the watchdog is seen to have fired
    /// and waited for up to [`REPORT_WITHIN`] (the ring answers in milliseconds), so that the
    /// error text says who never entered even where no log is printed.
    fn hang_report(&self) -> String {
        if !self.ops.reported.swap(true, Ordering::Relaxed) {
            if let Some(w) = &self.watcher {
                w.request_report();
                let end = Instant::now() + REPORT_WITHIN;
                while self.news.report.lock().is_none() && Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        match &*self.news.report.lock() {
            Some(summary) => summary.clone(),
            None => "the hang report, logged as a WARN by one rank, names who".into(),
        }
    }

    /// Fails if an operation needs a rank that left the communicator in order (destroyed it,
    /// or its process ended): `Some(peer)` for a send or receive, `None` for a grouped pattern of
    /// them, which needs every rank. Without this the operation would wait for the rank until the
    /// watchdog.
    pub fn check_peers(&self, peer: Option<usize>) -> Result<()> {
        let left = self.news.left.lock();
        let gone = match peer {
            _ if left.is_empty() => None,
            None => left.values().next(),
            Some(p) => left.get(&p),
        };
        gone.map_or(Ok(()), |(who, _)| Err(self.left_error(who)))
    }

    /// [`Comm::check_peers`] for a collective, which needs every rank: a rank that left fails it
    /// unless its goodbye said it took part in this one (the collectives before it counted),
    /// whose data it then sent before leaving. So a root that finished its part of a broadcast
    /// and destroyed its communicator does not fail the ranks still to call that broadcast, as
    /// with NCCL.
    pub fn check_peers_coll(&self) -> Result<()> {
        let left = self.news.left.lock();
        let called = self.colls_called.load(Ordering::Relaxed);
        match left.values().find(|(_, colls)| colls.is_none_or(|c| c <= called)) {
            Some((who, _)) => Err(self.left_error(who)),
            None => Ok(()),
        }
    }

    fn left_error(&self, who: &str) -> Error {
        Error::Remote(format!(
            "rank {}: {who} left this communicator (it destroyed it, or its process ended), and this operation needs \
             it",
            self.rank
        ))
    }

    /// One more collective was queued (the count [`Comm::check_peers_coll`] compares).
    pub fn called_coll(&self) {
        self.colls_called.fetch_add(1, Ordering::Relaxed);
    }

    /// Records, as the liveness watcher does, that `rank` left in order, having taken part in
    /// `colls` collectives when said.
    #[cfg(test)]
    pub fn note_left(&self, rank: usize, who: &str, colls: Option<u64>) {
        self.news.left.lock().insert(rank, (who.into(), colls));
    }

    pub fn shape(&self) -> CommShape {
        CommShape {
            rank: self.rank,
            nranks: self.nranks,
            nchannels: self.conns.ring_channels,
            min_channels: crate::topo::least_channels(self.config.min_ctas).min(self.conns.ring_channels),
            all_pairs_channels: self.conns.all_pairs_channels(),
            slot_bytes: self.conns.slot_bytes(),
            tree: self.tree,
            hosts: Some(self.hosts.clone()),
            link: self.link,
            net: self.net,
            tuner: self.tuner_plugin.clone(),
        }
    }

    /// Channels of our connection with `peer` (0: not connected yet).
    pub fn conn_channels(&self, peer: usize) -> usize {
        match self.conns.channels(self.rank, peer) {
            0 if self.runtime_peers.lock().contains(&peer) => self.conns.runtime_channels(),
            n => n,
        }
    }

    /// Channels a send/recv with `peer` splits over: its connection's, for a peer on another
    /// host no more than the user's `nChannelsPerNetPeer`.
    pub fn p2p_channels(&self, peer: usize) -> usize {
        self.conns.p2p_split(self.conn_channels(peer), self.over_net[peer])
    }

    /// Connects the peers of a group's sends and receives that are not connected yet (NCCL's
    /// runtime connect; docs/ARCHITECTURE.md, "Scale"), and adds them to the kernels' table
    /// before anything is launched. Each such peer is in the matching group on its side (NCCL's
    /// rule for send/recv), and both take their new peers in ascending rank order: the smallest
    /// pair still to connect is then first on both its ranks, so no two ranks wait on each other.
    pub fn connect_peers(&self, peers: impl IntoIterator<Item = usize>) -> Result<()> {
        let mut new: Vec<usize> = peers.into_iter().filter(|&p| p != self.rank && self.conn_channels(p) == 0).collect();
        if new.is_empty() {
            return Ok(());
        }
        new.sort_unstable();
        new.dedup();
        let (gpu, res) = self.gpu()?;
        let _ctx = gpu.ctx.enter()?;
        // As at init: the pinned memory of these connections lands near our GPU.
        let _near_gpu = crate::affinity::Window::enter(self.cpus.as_ref());
        // Allocations and copies inside a user's stream capture (the first send of a graph).
        let _relaxed = crate::cuda::module::RelaxedCapture::new()?;
        let stream = crate::cuda::Stream::non_blocking()?;
        let mut transport = res.transport.lock();
        for p in new {
            let conns = transport
                .connect_runtime(&self.bootstrap, &self.conns, p)
                .map_err(|e| e.context(&format!("rank {}: connecting to rank {p} on first use", self.rank)))?;
            let at = p * abi::FN_MAX_CHANNELS as usize * std::mem::size_of::<abi::fnConn>();
            res.conns.write_on(&stream, at, &conns)?;
            self.runtime_peers.lock().insert(p);
        }
        Ok(())
    }

    /// Waits until our last launch finished, or the deadline passes (then false).
    pub fn wait_idle(&self, deadline: Option<Instant>) -> Result<bool> {
        let Ok((gpu, _)) = self.gpu() else { return Ok(true) };
        let _g = gpu.ctx.enter()?;
        let st = gpu.launch_state.lock();
        loop {
            if st.last.is_done()? {
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// ncclCommRevoke: stops this rank's kernels (they see the abort flag) and waits, up to
    /// `within`, until they have; from then on only shrink, abort, destroy and queries work. A
    /// revoke is not an error: ncclCommGetAsyncError stays ncclSuccess unless a peer was lost.
    pub fn revoke(&self, within: Duration) -> Result<()> {
        self.revoked.store(true, Ordering::Release);
        self.request_abort();
        if !self.wait_idle(Some(Instant::now() + within))? {
            return Err(Error::System(format!(
                "ncclCommRevoke: the kernels of rank {} did not stop within {within:?}",
                self.rank
            )));
        }
        Ok(())
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// Asks every running kernel of this communicator to stop.
    pub fn request_abort(&self) {
        if let Ok((_, res)) = self.gpu() {
            res.flags.set(FLAG_ABORT, 1);
        }
    }

    /// Leaves the device memory allocated: abort could not confirm that our kernels stopped,
    /// and freeing memory a running kernel uses would crash it.
    pub fn leak_resources(&self) {
        self.leak.store(true, Ordering::Relaxed);
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Goodbye to the neighbours first (an orderly exit is not a loss), and the watcher's hold
        // on the flags ends before they are freed.
        drop(self.watcher.take());
        let Some(mut gpu) = self.gpu.take() else { return };
        if self.leak.load(Ordering::Relaxed) {
            std::mem::forget(gpu.res.take());
            return;
        }
        // Device memory is freed with our context current.
        if let Ok(_g) = gpu.ctx.enter() {
            gpu.res.take();
        }
    }
}

#[cfg(test)]
mod config_tests {
    use super::*;

    /// NCCL_COMM_BLOCKING, NCCL_MIN_CTAS, NCCL_MAX_CTAS and NCCL_NCHANNELS_PER_NET_PEER replace
    /// what the config says, as NCCL's environment overrides do; out-of-range values leave it, and
    /// a minimum above the maximum becomes the maximum.
    #[test]
    fn the_environment_overrides_the_config() {
        let given = CommConfig {
            blocking: false,
            min_ctas: Some(2),
            max_ctas: Some(8),
            net_peer_channels: Some(2),
            ..Default::default()
        };
        let same = given.clone().overridden(-1, 0, 0, 0);
        assert_eq!((same.blocking, same.min_ctas, same.max_ctas), (false, Some(2), Some(8)));
        assert_eq!(same.net_peer_channels, Some(2));
        let env = given.clone().overridden(1, 4, 16, 1);
        assert_eq!((env.blocking, env.min_ctas, env.max_ctas), (true, Some(4), Some(16)));
        assert_eq!(env.net_peer_channels, Some(1));
        let bad = given.clone().overridden(2, -3, 0, -1);
        assert_eq!((bad.blocking, bad.min_ctas, bad.max_ctas), (false, Some(2), Some(8)));
        assert_eq!(bad.net_peer_channels, Some(2));
        let crossed = given.clone().overridden(-1, 12, 0, 0);
        assert_eq!((crossed.min_ctas, crossed.max_ctas), (Some(8), Some(8)));
        let capped = CommConfig::default().overridden(0, 1000, 1000, 1000);
        assert_eq!((capped.blocking, capped.min_ctas, capped.max_ctas), (false, Some(64), Some(64)));
        assert_eq!(capped.net_peer_channels, Some(64));
    }
}
