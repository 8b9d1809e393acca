//! The executor: runs a group's [`Plan`] on its communicators, whatever it holds, kernel
//! launches or copy-engine copies, and keeps each communicator's work in issue order across
//! streams. What runs is decided by the planner (`plan`); this module only carries it out.

use super::{profile, Comm};
use crate::abi::{fnKernelArgs, FN_NTHREADS};
use crate::cuda::{self, module, CUstream, Event, MemSyncDomain};
use crate::error::Result;
use crate::plan::{self, Copy, Member, Mode, Plan};
use crate::task::{Launch, Moves, Queued, Task};
use crate::tuner;
use std::sync::{Arc, OnceLock};

crate::int_param!(
    /// NCCL_MEM_SYNC_DOMAIN: the memory synchronization domain of our kernels on Hopper and
    /// later, as NCCL's: 1 (remote, the default) or 0 (the default domain of compute kernels).
    mem_sync_domain_param, "NCCL_MEM_SYNC_DOMAIN", 1
);

/// The domain our kernels launch in: none before Hopper, which has no domains; else the remote
/// one unless NCCL_MEM_SYNC_DOMAIN=0, so that a fence in a compute kernel does not wait for our
/// traffic and ours not for the compute kernels' (docs/ARCHITECTURE.md, "Memory synchronization
/// domains").
fn mem_sync_domain(cc_major: i32) -> Option<MemSyncDomain> {
    static DOMAIN: OnceLock<MemSyncDomain> = OnceLock::new();
    if cc_major < 9 {
        return None;
    }
    Some(*DOMAIN.get_or_init(|| match mem_sync_domain_param() {
        0 => MemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_DEFAULT,
        1 => MemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE,
        v => {
            crate::nccl_warn!("NCCL_MEM_SYNC_DOMAIN={v} is neither 0 (default) nor 1 (remote); using 1");
            MemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE
        }
    }))
}

/// Orders our launches across streams and lets destroy/abort wait for them.
pub(super) struct LaunchState {
    /// Recorded after our newest work; shared with the liveness observer, which asks it whether
    /// that work finished (hang reports).
    pub(super) last: Arc<Event>,
    last_stream: Option<usize>,
}

impl LaunchState {
    pub(super) fn new(last: Arc<Event>) -> LaunchState {
        LaunchState { last, last_stream: None }
    }

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

/// The two points of a copy-engine group that other ranks' streams wait for (`plan::copies`).
#[derive(Debug, Clone, Copy)]
pub enum CopyMark {
    /// This rank's stream has reached the group: its buffers may be written.
    Ready = 0,
    /// This rank's copies are done: their destinations may be read.
    Done = 1,
}

/// Plans and runs everything a group queued. Communicators are independent (their kernels wait
/// on each other on the device, not on the host).
///
/// # Safety
/// Every task's buffers are device memory valid for the bytes it moves, as the API entry points
/// check before queueing (`api::coll`).
pub unsafe fn launch_group(queued: Vec<Queued<Arc<Comm>>>) -> Result<()> {
    type CommOps = (Arc<Comm>, Vec<(CUstream, Task)>);
    let mut per_comm: Vec<CommOps> = Vec::new();
    for q in queued {
        match per_comm.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &q.comm)) {
            Some((_, ops)) => ops.push((q.stream, q.task)),
            None => per_comm.push((q.comm, vec![(q.stream, q.task)])),
        }
    }
    let allowed = tuner::restrictions()?;
    let p2p_channels: Vec<_> = per_comm.iter().map(|(c, _)| move |peer| c.p2p_channels(peer)).collect();
    let members: Vec<Member> = per_comm
        .iter()
        .zip(&p2p_channels)
        .map(|((c, ops), ch)| Member {
            key: c.bootstrap.magic(),
            shape: c.shape(),
            limits: c.limits,
            p2p_channels: ch,
            ops,
        })
        .collect();
    // Peers this group sends to or receives from for the first time connect now, on both sides,
    // those of direct broadcasts and reduces included.
    for ((c, ops), m) in per_comm.iter().zip(&members) {
        let limits = allowed.intersect(&c.limits);
        let p2p = ops.iter().filter_map(|(_, t)| match t {
            Task::Send { peer, .. } | Task::Recv { peer, .. } => Some(*peer),
            Task::Coll(_) => None,
        });
        let direct = ops.iter().filter_map(|(_, t)| match t {
            Task::Coll(coll) => Some(plan::kernels::direct_peers(coll, &m.shape, &limits)),
            _ => None,
        });
        c.connect_peers(p2p.chain(direct.flatten()))?;
    }
    let comms: Vec<&Arc<Comm>> = per_comm.iter().map(|(c, _)| c).collect();
    // Plan everything before running anything, so a planning error runs nothing.
    let plan = plan::group(&members, allowed, Mode::from_env())?;
    // The profiler's events of the group, stopped when this function returns, whichever way.
    let _events: Vec<_> = per_comm
        .iter()
        .enumerate()
        .filter_map(|(i, (c, ops))| match &plan {
            Plan::Kernels(l) => profile::start(c, ops, Some(&l[i]), allowed),
            Plan::Copies(_) => profile::start(c, ops, None, allowed),
        })
        .collect();
    match plan {
        Plan::Kernels(launches) => {
            // SAFETY: the caller's contract covers the planned works' buffers.
            unsafe { run_kernels(&comms, launches) }
        }
        Plan::Copies(copies) => {
            let streams: Vec<(&Arc<Comm>, CUstream)> = per_comm.iter().map(|(c, ops)| (c, ops[0].0)).collect();
            for (c, s) in &streams {
                if c.is_capturing(*s)? {
                    crate::nccl_trace!(
                        crate::debug::Subsys::TUNING,
                        "copy engines not used: a stream is being captured"
                    );
                    let launches = plan::kernels(&members, allowed)?;
                    // SAFETY: as above.
                    return unsafe { run_kernels(&comms, launches) };
                }
            }
            // SAFETY: the copies move the tasks' own buffers, covered by the caller's contract.
            unsafe { run_copies(&streams, &copies) }
        }
    }
}

/// Launches each communicator's planned kernels in order.
///
/// # Safety
/// As [`launch_group`]: the works' buffers are valid device memory.
unsafe fn run_kernels(comms: &[&Arc<Comm>], launches: Vec<Vec<Launch>>) -> Result<()> {
    // Load every kernel before launching any: loading code must not wait behind a kernel of this
    // group that spins until a peer's kernel (not launched yet) arrives.
    let kernels: Vec<_> = comms.iter().zip(&launches).map(|(comm, l)| comm.load_kernels(l)).collect::<Result<_>>()?;
    for ((comm, launches), kernels) in comms.iter().zip(launches).zip(kernels) {
        // SAFETY: per this function's contract.
        unsafe { comm.launch(&launches, &kernels) }?;
        crate::nccl_info!(crate::debug::Subsys::COLL, "rank {}: launched {} kernel(s)", comm.rank, launches.len());
    }
    Ok(())
}

/// Queues a planned copy group: `members[i]` is the communicator and stream of member i. Every
/// rank records `Ready`; each waits for the `Ready` of the ranks it writes to, queues its copies
/// and records `Done`; each then waits for the `Done` of the ranks that wrote to it.
///
/// # Safety
/// Every copy's source and destination are device memory valid for its bytes.
unsafe fn run_copies(members: &[(&Arc<Comm>, CUstream)], copies: &[Copy]) -> Result<()> {
    let writes = |from: usize, to: usize| copies.iter().any(|c| c.from == from && c.to == to && from != to);
    for (comm, stream) in members {
        comm.on_stream(*stream, || comm.record_mark(CopyMark::Ready, *stream))?;
    }
    for (i, (comm, stream)) in members.iter().enumerate() {
        comm.ops.issue(super::watch::Newest::CopyGroup);
        comm.on_stream(*stream, || {
            for (j, (peer, _)) in members.iter().enumerate() {
                if writes(i, j) {
                    peer.wait_mark(CopyMark::Ready, *stream)?;
                }
            }
            for c in copies.iter().filter(|c| c.from == i) {
                // SAFETY: per this function's contract.
                unsafe { comm.copy(c.dst, c.src, c.bytes, *stream) }?;
            }
            comm.record_mark(CopyMark::Done, *stream)
        })?;
    }
    for (i, (comm, stream)) in members.iter().enumerate() {
        comm.on_stream(*stream, || {
            for (j, (peer, _)) in members.iter().enumerate() {
                if writes(j, i) {
                    peer.wait_mark(CopyMark::Done, *stream)?;
                }
            }
            Ok(())
        })?;
    }
    crate::nccl_info!(
        crate::debug::Subsys::COLL,
        "copy engines: {} copies among {} ranks",
        copies.len(),
        members.len()
    );
    Ok(())
}

impl Comm {
    /// The kernels these launches need, loaded on our device (the first time) before anything
    /// is launched.
    fn load_kernels(&self, launches: &[Launch]) -> Result<Vec<module::Kernel>> {
        let (gpu, _) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        launches.iter().map(|l| module::kernel(self.dev, l.kernel)).collect()
    }

    /// Launches planned kernels (from [`Comm::load_kernels`]) on their streams, in order.
    ///
    /// # Safety
    /// The works' buffers are device memory valid for the bytes they move.
    unsafe fn launch(&self, launches: &[Launch], kernels: &[module::Kernel]) -> Result<()> {
        self.check_health()?;
        let (gpu, res) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        if let Some(w) = &self.proxy_waker {
            let (all, off_ring) = launches.iter().map(Launch::channels).fold((0, 0), |(a, o), (c, r)| (a | c, o | r));
            let ring = self.conns.ring_neighbours(self.rank);
            let moves = launches.iter().fold(Moves::default(), |m, l| m | l.moves(self.rank, ring));
            w.wake(all, off_ring, moves.sends, moves.receives, moves.to);
        }
        let mut st = gpu.launch_state.lock();
        for (l, kernel) in launches.iter().zip(kernels) {
            let mut args =
                fnKernelArgs { comm: res.dev_comm.ptr as *mut _, nWorks: l.works.len() as i32, ..Default::default() };
            args.works[..l.works.len()].copy_from_slice(&l.works);
            let capturing = cuda::is_capturing(l.stream)?;
            // Our kernels on one communicator share FIFOs: keep them in issue order across streams.
            st.begin(l.stream, capturing)?;
            let joins: Vec<Event> = l.joined.iter().map(|_| Event::new()).collect::<Result<_>>()?;
            for (s, e) in l.joined.iter().zip(&joins) {
                e.record(*s)?;
                e.wait(l.stream)?;
            }
            crate::nccl_trace!(
                crate::debug::Subsys::COLL,
                "rank {} launch {} grid {} works {}",
                self.rank,
                l.kernel,
                l.grid,
                l.works.len()
            );
            self.ops.issue(super::watch::Newest::kernel(&l.works));
            // SAFETY: `kernel` was loaded for this launch; `args` points at our device comm and
            // works whose buffers are valid per this function's contract.
            unsafe { cuda::launch(kernel.0, l.grid, FN_NTHREADS, l.stream, &args, mem_sync_domain(self.cc_major)) }?;
            for (s, e) in l.joined.iter().zip(&joins) {
                e.record(l.stream)?;
                e.wait(*s)?;
            }
            st.end(l.stream, capturing)?;
        }
        Ok(())
    }

    /// Copy-engine groups work on `stream` through this: `f` runs with our context current,
    /// after our earlier launches, and the group counts as our newest work.
    fn on_stream(&self, stream: CUstream, f: impl FnOnce() -> Result<()>) -> Result<()> {
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
    fn is_capturing(&self, stream: CUstream) -> Result<bool> {
        let (gpu, _) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        cuda::is_capturing(stream)
    }

    /// Records `mark` where `stream` (one of ours) stands.
    fn record_mark(&self, mark: CopyMark, stream: CUstream) -> Result<()> {
        let (gpu, _) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        gpu.copy_marks[mark as usize].record(stream)
    }

    /// Makes `stream` (another rank's, with its context current) wait for our last `mark`.
    fn wait_mark(&self, mark: CopyMark, stream: CUstream) -> Result<()> {
        let (gpu, _) = self.gpu()?;
        gpu.copy_marks[mark as usize].wait(stream)
    }

    /// Queues a copy on `stream` with our context current.
    ///
    /// # Safety
    /// `dst` and `src` are device memory valid for `bytes`.
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: CUstream) -> Result<()> {
        let (gpu, _) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        // SAFETY: per this function's contract.
        unsafe { cuda::memcpy_async(dst, src, bytes, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hopper and later launch in the remote domain, as NCCL's kernels do by default; earlier
    /// GPUs have no domains, and the launch passes no attribute there.
    #[test]
    fn kernels_launch_in_the_remote_domain_from_hopper() {
        assert_eq!(mem_sync_domain(8), None);
        let remote = Some(MemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE);
        if std::env::var_os("NCCL_MEM_SYNC_DOMAIN").is_none() {
            assert_eq!(mem_sync_domain(9), remote);
            assert_eq!(mem_sync_domain(10), remote);
        }
    }
}
