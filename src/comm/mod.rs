//! The communicator: one rank's connections, device resources and health.
//!
//! [`registry`] maps the C handle to it, [`init`] creates it (also by split and shrink), and
//! [`launch`] is the executor that runs planned groups on it.

pub mod init;
pub mod launch;
pub mod registry;

pub use init::{init_rank, shrink, split};
pub use registry::{CommHandle, Phase};

use crate::abi;
use crate::bootstrap::Bootstrap;
use crate::cuda::{Context, DeviceBuffer, Event, HostMapped};
use crate::error::{Error, Result};
use crate::task::{CommShape, DevOp};
use crate::transport::p2p::{ConnPlan, P2pTransport};
use crate::types::ncclDataType_t;
use launch::LaunchState;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::time::{Duration, Instant};

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

