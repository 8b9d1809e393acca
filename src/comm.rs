//! The communicator: what `ncclComm_t` points at.
//!
//! A handle ([`ncclComm`]) exists from the moment `ncclCommInitRank*` is called; the
//! communicator itself ([`Comm`]) appears when initialisation finishes (at once for blocking
//! configs, from a background thread for `blocking = 0`). Live handles are kept in a registry,
//! so a stale or garbage `ncclComm_t` is reported instead of dereferenced.

use crate::abi::{self, fnDevComm, fnKernelArgs, fnRing, FN_NTHREADS};
use crate::bootstrap::{Bootstrap, BootstrapId};
use crate::cuda::{self, module, Context, CUstream, DeviceBuffer, Event, HostMapped};
use crate::enqueue::{CommShape, DevOp, Launch};
use crate::error::{Error, Result};
use crate::topo::{self, PeerInfo, Ring};
use crate::transport::p2p::{self, ConnPlan, P2pTransport};
use crate::types::{ncclComm_t, ncclDataType_t, ncclResult_t, NCCL_SPLIT_NOCOLOR};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

crate::int_param!(
    /// NCCL_WATCHDOG_TIMEOUT_MS: how long a kernel may wait on a peer before it gives up and the
    /// communicator reports an error through ncclCommGetAsyncError (0 = wait forever).
    watchdog_timeout_ms, "NCCL_WATCHDOG_TIMEOUT_MS", 30 * 60 * 1000
);
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
}

/// A user reduction operator from `ncclRedOpCreatePreMulSum`.
#[derive(Debug, Clone, Copy)]
pub struct UserOp {
    pub dtype: ncclDataType_t,
    pub op: DevOp,
}

/// Where a communicator is in its life.
pub enum Phase {
    Initializing,
    Ready(Arc<Comm>),
    Failed(Error),
    /// After ncclCommFinalize: queries work, new operations don't.
    Finalized(Arc<Comm>),
}

/// What `ncclComm_t` points at.
#[allow(non_camel_case_types)]
pub struct ncclComm {
    pub phase: Arc<Mutex<Phase>>,
}

/// Addresses of live handles, and of destroyed ones (to say "destroyed" rather than "invalid").
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
static RETIRED: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

impl ncclComm {
    /// Boxes a handle and registers it; the pointer goes to the caller.
    pub fn publish(phase: Phase) -> (ncclComm_t, Arc<Mutex<Phase>>) {
        let phase = Arc::new(Mutex::new(phase));
        let ptr = Box::into_raw(Box::new(ncclComm { phase: phase.clone() }));
        LIVE.lock().get_or_insert_with(HashSet::new).insert(ptr as usize);
        if let Some(r) = RETIRED.lock().as_mut() {
            r.remove(&(ptr as usize));
        }
        (ptr, phase)
    }

    /// Checks a handle from C and borrows it.
    ///
    /// # Safety
    /// The registry guarantees the pointer came from `publish` and was not retired; the caller
    /// must not retire it while the borrow lives (the C API's contract: no destroy concurrent
    /// with use).
    pub unsafe fn from_handle<'a>(comm: ncclComm_t, arg: &str) -> Result<&'a ncclComm> {
        if comm.is_null() {
            crate::bail_arg!("{arg} is NULL");
        }
        let live = LIVE.lock().as_ref().is_some_and(|s| s.contains(&(comm as usize)));
        if !live {
            if RETIRED.lock().as_ref().is_some_and(|s| s.contains(&(comm as usize))) {
                crate::bail_usage!("{arg} {comm:p} was already destroyed");
            }
            crate::bail_arg!("{arg} {comm:p} is not a communicator created by this library");
        }
        // SAFETY: registered by publish and not yet retired (see above).
        Ok(unsafe { &*comm })
    }

    /// Unregisters and frees a handle.
    ///
    /// # Safety
    /// `comm` must have passed `from_handle`; no other thread may use it afterwards.
    pub unsafe fn retire(comm: ncclComm_t) {
        LIVE.lock().get_or_insert_with(HashSet::new).remove(&(comm as usize));
        RETIRED.lock().get_or_insert_with(HashSet::new).insert(comm as usize);
        // SAFETY: created by Box::into_raw in publish, freed exactly once (it left LIVE above).
        drop(unsafe { Box::from_raw(comm) });
    }

    /// The communicator, if it is ready for new operations.
    pub fn ready(&self) -> Result<Arc<Comm>> {
        match &*self.phase.lock() {
            Phase::Ready(c) => {
                c.check_health()?;
                Ok(c.clone())
            }
            Phase::Initializing => {
                Err(Error::InvalidUsage("communicator is still initializing (poll ncclCommGetAsyncError until it returns ncclSuccess)".into()))
            }
            Phase::Failed(e) => Err(e.clone().context("communicator initialization failed earlier")),
            Phase::Finalized(_) => Err(Error::InvalidUsage("communicator was finalized; only ncclCommDestroy is allowed now".into())),
        }
    }

    /// The communicator for queries (rank, count, device): ready or finalized.
    pub fn queryable(&self) -> Result<Arc<Comm>> {
        match &*self.phase.lock() {
            Phase::Ready(c) | Phase::Finalized(c) => Ok(c.clone()),
            Phase::Initializing => Err(Error::InvalidUsage("communicator is still initializing".into())),
            Phase::Failed(e) => Err(e.clone().context("communicator initialization failed earlier")),
        }
    }

    /// ncclCommGetAsyncError: InProgress while initializing, the failure if any, else Success.
    pub fn async_error(&self) -> ncclResult_t {
        match &*self.phase.lock() {
            Phase::Initializing => ncclResult_t::ncclInProgress,
            Phase::Failed(e) => e.code(),
            Phase::Ready(c) | Phase::Finalized(c) => match c.check_health() {
                Ok(()) => ncclResult_t::ncclSuccess,
                Err(e) => {
                    crate::nccl_warn!("{e}");
                    e.code()
                }
            },
        }
    }
}

/// Device resources, released with the communicator's context current.
struct Resources {
    _transport: P2pTransport,
    dev_comm: DeviceBuffer,
    _conns: DeviceBuffer,
    _ring_ranks: DeviceBuffer,
    /// [abort requested by the host, error reported by the device]
    flags: HostMapped,
}

const FLAG_ABORT: usize = 0;
const FLAG_ERROR: usize = 1;

/// Orders our launches across streams and lets destroy/abort wait for them.
struct LaunchState {
    last: Event,
    last_stream: Option<usize>,
}

impl LaunchState {
    /// Orders new work on `stream` after our last launch on another stream (outside capture:
    /// a graph's order is its own).
    fn begin(&self, stream: CUstream, capturing: bool) -> Result<()> {
        if !capturing && self.last_stream.is_some_and(|s| s != stream as usize) {
            self.last.wait(stream)?;
        }
        Ok(())
    }

    /// Notes that our newest work is on `stream`.
    fn end(&mut self, stream: CUstream, capturing: bool) -> Result<()> {
        if !capturing {
            self.last.record(stream)?;
            self.last_stream = Some(stream as usize);
        }
        Ok(())
    }
}

/// The two points of a copy-engine group that other ranks' streams wait for (copy_engine.rs).
#[derive(Debug, Clone, Copy)]
pub enum CopyMark {
    /// This rank's stream has reached the group: its buffers may be written.
    Ready = 0,
    /// This rank's copies are done: their destinations may be read.
    Done = 1,
}

/// An initialised communicator.
pub struct Comm {
    pub rank: usize,
    pub nranks: usize,
    pub dev: i32,
    /// Compute capability major of our GPU (fp8 needs 9).
    pub cc_major: i32,
    pub config: CommConfig,
    pub bootstrap: Bootstrap,
    /// Which connections exist and how many channels each has (rings use `ring_channels`).
    pub conns: ConnPlan,
    pub user_ops: Mutex<Vec<Option<UserOp>>>,
    pub registrations: Mutex<HashSet<usize>>,
    watchdog: Duration,
    /// The GPU side; `None` only for communicators that unit tests build without a GPU to
    /// exercise argument checking.
    gpu: Option<Gpu>,
    leak: std::sync::atomic::AtomicBool,
}

/// A communicator's context, device resources and launch ordering.
struct Gpu {
    ctx: Context,
    launch_state: Mutex<LaunchState>,
    /// By [`CopyMark`].
    copy_marks: [Event; 2],
    res: Option<Resources>,
}

/// Creates a rank's communicator on device `dev`: rendezvous, topology, connections.
pub fn init_rank(id: &BootstrapId, nranks: usize, rank: usize, dev: i32, config: CommConfig) -> Result<Comm> {
    cuda::init()?;
    let start = Instant::now();
    crate::debug::set_log_device(dev);
    let ctx = cuda::primary_context(dev)?;
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
    };
    let peers: Vec<PeerInfo> =
        bootstrap.allgather(&me.encode())?.iter().map(|b| PeerInfo::decode(b)).collect::<Result<_>>()?;
    if let Some(p) = peers.iter().find(|p| p.host_hash != me.host_hash) {
        crate::bail_usage!(
            "rank {} is on another host; ferronickel does not have a network transport yet (single-node only)",
            p.rank
        );
    }
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
    let addrs = bootstrap
        .allgather(&addr.encode())?
        .iter()
        .map(|b| p2p::ArenaAddr::decode(b))
        .collect::<Result<Vec<_>>>()?;
    let transport = P2pTransport::connect(arena, rank, &me, &peers, &addrs, &plan)?;

    let table = transport.conn_table(&plan, rank);
    let conns = DeviceBuffer::zeroed(std::mem::size_of_val(&table[..]))?;
    conns.write(0, &table)?;
    let ring_ranks_host: Vec<i32> = ring.user_ranks.iter().map(|&r| r as i32).collect();
    let ring_ranks = DeviceBuffer::zeroed(4 * nranks)?;
    ring_ranks.write(0, &ring_ranks_host)?;
    let flags = HostMapped::zeroed(2)?;
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
        gpu: Some(Gpu {
            launch_state: Mutex::new(LaunchState { last: Event::new()?, last_stream: None }),
            copy_marks: [Event::new()?, Event::new()?],
            res: Some(Resources { _transport: transport, dev_comm, _conns: conns, _ring_ranks: ring_ranks, flags }),
            ctx,
        }),
        leak: std::sync::atomic::AtomicBool::new(false),
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
            conns: ConnPlan { nranks, ring_channels: 1, p2p_channels: 1, order: order.clone(), fifo_bytes: 0 },
            user_ops: Mutex::new(Vec::new()),
            registrations: Mutex::new(HashSet::new()),
            watchdog: Duration::ZERO,
            gpu: None,
            leak: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn gpu(&self) -> Result<(&Gpu, &Resources)> {
        match &self.gpu {
            Some(g @ Gpu { res: Some(r), .. }) => Ok((g, r)),
            _ => Err(Error::Internal(format!("rank {}: communicator has no GPU resources", self.rank))),
        }
    }

    /// Fails if a kernel reported a timeout or the communicator was aborted.
    pub fn check_health(&self) -> Result<()> {
        let Ok((_, res)) = self.gpu() else { return Ok(()) };
        let flags = &res.flags;
        if flags.get(FLAG_ABORT) != 0 {
            crate::bail_usage!("communicator was aborted");
        }
        match flags.get(FLAG_ERROR) {
            0 => Ok(()),
            x if x == abi::FN_DEV_TIMEOUT => Err(Error::Remote(format!(
                "rank {}: a collective waited more than {:?} (NCCL_WATCHDOG_TIMEOUT_MS) for a peer; a rank did not call it or called it with different arguments. Abort the communicator.",
                self.rank, self.watchdog
            ))),
            x => Err(Error::Internal(format!("rank {}: device reported error code {x}", self.rank))),
        }
    }

    pub fn shape(&self) -> CommShape {
        CommShape {
            rank: self.rank,
            nranks: self.nranks,
            nchannels: self.conns.ring_channels,
            all_pairs_channels: self.conns.all_pairs_channels(),
        }
    }

    /// Channels of our connection with `peer`.
    pub fn conn_channels(&self, peer: usize) -> usize {
        self.conns.channels(self.rank, peer)
    }

    /// The kernels these launches need, loaded on our device (the first time) before anything
    /// is launched.
    pub fn load_kernels(&self, launches: &[Launch]) -> Result<Vec<module::Kernel>> {
        let (gpu, _) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        launches.iter().map(|l| module::kernel(self.dev, l.kernel)).collect()
    }

    /// Launches planned kernels (from [`Comm::load_kernels`]) on their streams, in order.
    pub fn launch(&self, launches: &[Launch], kernels: &[module::Kernel]) -> Result<()> {
        self.check_health()?;
        let (gpu, res) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        let mut st = gpu.launch_state.lock();
        for (l, kernel) in launches.iter().zip(kernels) {
            let mut args = fnKernelArgs { comm: res.dev_comm.ptr as *mut _, nWorks: l.works.len() as i32, ..Default::default() };
            args.works[..l.works.len()].copy_from_slice(&l.works);
            let capturing = cuda::is_capturing(l.stream)?;
            // Our kernels on one communicator share FIFOs: keep them in issue order across streams.
            st.begin(l.stream, capturing)?;
            let joins: Vec<Event> = l.joined.iter().map(|_| Event::new()).collect::<Result<_>>()?;
            for (s, e) in l.joined.iter().zip(&joins) {
                e.record(*s)?;
                e.wait(l.stream)?;
            }
            crate::nccl_trace!(crate::debug::Subsys::COLL, "rank {} launch {} grid {} works {}", self.rank, l.kernel, l.grid, l.works.len());
            cuda::launch(kernel.0, l.grid, FN_NTHREADS, l.stream, &args)?;
            for (s, e) in l.joined.iter().zip(&joins) {
                e.record(l.stream)?;
                e.wait(*s)?;
            }
            st.end(l.stream, capturing)?;
        }
        Ok(())
    }

    /// Copy-engine groups (copy_engine.rs) work on `stream` through this: `f` runs with our
    /// context current, after our earlier launches, and the group counts as our newest work.
    pub fn on_stream(&self, stream: CUstream, f: impl FnOnce() -> Result<()>) -> Result<()> {
        self.check_health()?;
        let (gpu, _) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        let mut st = gpu.launch_state.lock();
        let capturing = cuda::is_capturing(stream)?;
        st.begin(stream, capturing)?;
        f()?;
        st.end(stream, capturing)
    }

    /// Whether `stream` (one of ours) is being captured.
    pub fn is_capturing(&self, stream: CUstream) -> Result<bool> {
        let (gpu, _) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        cuda::is_capturing(stream)
    }

    /// Records `mark` where `stream` (one of ours) stands.
    pub fn record_mark(&self, mark: CopyMark, stream: CUstream) -> Result<()> {
        let (gpu, _) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        gpu.copy_marks[mark as usize].record(stream)
    }

    /// Makes `stream` (another rank's, with its context current) wait for our last `mark`.
    pub fn wait_mark(&self, mark: CopyMark, stream: CUstream) -> Result<()> {
        let (gpu, _) = self.gpu()?;
        gpu.copy_marks[mark as usize].wait(stream)
    }

    /// Queues a copy on `stream` with our context current.
    pub fn copy(&self, dst: u64, src: u64, bytes: usize, stream: CUstream) -> Result<()> {
        let (gpu, _) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        cuda::memcpy_async(dst, src, bytes, stream)
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

    /// Asks every running kernel of this communicator to stop.
    pub fn request_abort(&self) {
        if let Ok((_, res)) = self.gpu() {
            res.flags.set(FLAG_ABORT, 1);
        }
    }

    /// Leaves the device memory allocated: abort could not confirm that our kernels stopped,
    /// and freeing memory a running kernel uses would crash it.
    pub fn leak_resources(&self) {
        self.leak.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let Some(mut gpu) = self.gpu.take() else { return };
        if self.leak.load(std::sync::atomic::Ordering::Relaxed) {
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

    #[test]
    fn handles_are_checked() {
        // SAFETY: exercising the registry with a NULL and a made-up pointer: neither is dereferenced.
        unsafe {
            assert!(matches!(ncclComm::from_handle(std::ptr::null_mut(), "comm"), Err(Error::InvalidArgument(_))));
            assert!(matches!(ncclComm::from_handle(0x1234 as ncclComm_t, "comm"), Err(Error::InvalidArgument(_))));
            let (p, _) = ncclComm::publish(Phase::Initializing);
            assert!(ncclComm::from_handle(p, "comm").is_ok());
            ncclComm::retire(p);
            assert!(matches!(ncclComm::from_handle(p, "comm"), Err(Error::InvalidUsage(_))));
        }
    }
}
