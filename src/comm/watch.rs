//! The communicator's side of its liveness watcher (`bootstrap::liveness`): what it does when a
//! peer is lost (stop our kernels, remember who) or leaves in order (remember who, so that later
//! operations needing it fail instead of waiting), and what it says of this rank in a hang report
//! (its newest operation, whether it finished, where its ring channels stand), with the summary
//! logged and kept for the error text.
//!
//! The watcher thread owns nothing of CUDA's: the stream, event and pinned memory it uses belong
//! to the communicator ([`WatchGpu`], freed by destroy or abort on the caller's thread, after the
//! watcher has stopped), and it reaches them through a `Weak` and only while the process is not
//! exiting (crate::exit). docs/ARCHITECTURE.md, "Who owns what".

use super::{FLAG_ABORT, FLAG_ERROR};
use crate::abi::{self, fnConn, fnConnRecv, fnConnSend};
use crate::bootstrap::liveness::{self, Lost};
use crate::cuda::{self, Context, Event, HostMapped, Stream};
use crate::error::Result;
use crate::hang_report::{self, Channels, RankState};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::mem::{offset_of, size_of, ManuallyDrop};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Our operations on the communicator so far, for hang reports: how many were issued and what
/// the newest is (whether it finished, the observer asks the GPU).
#[derive(Default)]
pub(super) struct Ops {
    issued: AtomicU64,
    /// Collectives launched (or queued on the copy engines), zero-count ones too, by NCCL's
    /// `ncclFunc_t`: the profiler's sequence numbers, and in all what a goodbye says this rank took
    /// part in once the last of them finished ([`liveness::Observer::taken_part`]).
    pub(super) coll_seq: [AtomicU64; 5],
    newest: Mutex<Newest>,
    /// A hang report was already asked for after the device watchdog fired.
    pub(super) reported: AtomicBool,
}

/// What the newest operation is, kept as a few numbers on the launch path and put into words only
/// when a hang report asks ([`Newest::describe`]).
#[derive(Clone, Copy, Default)]
pub(super) enum Newest {
    #[default]
    Nothing,
    /// A kernel launch: the work types it holds (bit `fnWorkType`), how many works, their counts,
    /// and how many ring channels its ring collectives use (0: none).
    Kernel {
        types: u32,
        works: usize,
        elems: u64,
        ring: usize,
    },
    CopyGroup,
}

impl Newest {
    pub(super) fn kernel(works: &[abi::fnWork]) -> Newest {
        let types = works.iter().fold(0u32, |m, w| m | 1u32.checked_shl(w.type_ as u32).unwrap_or(0));
        let ring = works
            .iter()
            .filter(|w| (w.type_ as u32) <= abi::FN_WORK_REDUCESCATTER && w.algo as u32 == abi::FN_ALGO_RING)
            .map(|w| usize::from(w.nChannels))
            .max()
            .unwrap_or(0);
        Newest::Kernel { types, works: works.len(), elems: works.iter().map(|w| w.count).sum(), ring }
    }

    /// "AllReduce+Send (3 works, 4096 elements)".
    fn describe(self) -> String {
        const NAMES: [&str; 8] =
            ["AllReduce", "Reduce", "Broadcast", "AllGather", "ReduceScatter", "Send", "Recv", "Copy"];
        match self {
            Newest::Nothing => "nothing yet".into(),
            Newest::CopyGroup => "copy-engine group".into(),
            Newest::Kernel { types, works, elems, .. } => {
                let names: Vec<&str> = (0..NAMES.len()).filter(|t| types & (1 << t) != 0).map(|t| NAMES[t]).collect();
                format!("{} ({works} works, {elems} elements)", names.join("+"))
            }
        }
    }
}

impl Ops {
    pub(super) fn issue(&self, what: Newest) {
        *self.newest.lock() = what;
        self.issued.fetch_add(1, Ordering::Relaxed);
    }
}

/// The communicator's side of its liveness watcher (bootstrap::liveness), on the watcher thread.
pub(super) struct Observer {
    /// The communicator's id in logs (its bootstrap magic, the same on every rank).
    pub(super) comm_id: u64,
    pub(super) names: Vec<String>,
    pub(super) rank: usize,
    pub(super) lost: Arc<OnceLock<String>>,
    pub(super) news: Arc<News>,
    pub(super) ops: Arc<Ops>,
    pub(super) gpu: Weak<WatchGpu>,
}

/// What the watcher learned that later calls on the communicator report.
#[derive(Default)]
pub(super) struct News {
    /// Ranks that left in order: how logs name them, and the collectives they took part in when
    /// their goodbye said.
    pub(super) left: Mutex<BTreeMap<usize, (String, Option<u64>)>>,
    /// The summary of the last hang report this rank asked for.
    pub(super) report: Mutex<Option<String>>,
}

/// The CUDA objects the watcher uses, owned by the communicator ([`Observer::gpu`]).
pub(super) struct WatchGpu {
    pub(super) ctx: Arc<Context>,
    /// [abort, error] flags of the communicator: raised when a peer is lost.
    pub(super) flags: Arc<HostMapped>,
    /// Recorded after our newest launch: whether it finished.
    pub(super) last: Arc<Event>,
    pub(super) counters: Mutex<RingCounters>,
}

/// How long a hang report waits for the FIFO counters before it calls them unknown.
const READ_WITHIN: Duration = Duration::from_secs(1);

/// Reads the FIFO counters of our ring connections for hang reports: per channel, our receive
/// head from `prev` (steps we took), our send head to `next` (steps it took of ours), and where
/// each stood when the operation in flight began (the `step` fields the kernels save in the
/// device connection table at each work's end). The counters live in device memory (P2P) or
/// host memory (SHM, NET); their unified addresses are copied on a private non-blocking stream,
/// waited for up to [`READ_WITHIN`], so a report never blocks behind a spinning kernel.
pub(super) struct RingCounters {
    prev: usize,
    next: usize,
    /// Per connected ring channel: the addresses of its receive head, send head, receive step
    /// and send step.
    addrs: Vec<[u64; 4]>,
    /// Current while the CUDA objects below are used and freed.
    ctx: Arc<Context>,
    stream: ManuallyDrop<Stream>,
    copied: ManuallyDrop<Event>,
    /// Pinned and device-mapped: four u64 per channel, in the order of `addrs`.
    out: ManuallyDrop<HostMapped>,
    /// A copy did not finish in time: it may still write into `out`.
    busy: bool,
}

impl RingCounters {
    /// From the host copy of our connection table (`table[peer * FN_MAX_CHANNELS + channel]`),
    /// the device address of that table, and the ring neighbours.
    pub(super) fn new(
        ctx: Arc<Context>,
        table: &[fnConn],
        dev_table: u64,
        (prev, next): (usize, usize),
        nchannels: usize,
    ) -> Result<Self> {
        let addrs = ring_addrs(table, dev_table, prev, next, nchannels);
        let _g = ctx.enter()?;
        let (stream, copied) = (Stream::non_blocking()?, Event::new()?);
        let out = HostMapped::zeroed(8 * addrs.len().max(1))?;
        Ok(RingCounters {
            prev,
            next,
            addrs,
            stream: ManuallyDrop::new(stream),
            copied: ManuallyDrop::new(copied),
            out: ManuallyDrop::new(out),
            ctx,
            busy: false,
        })
    }

    /// Where the first `nchannels` ring channels stand in the operation in flight.
    fn read(&mut self, nchannels: usize) -> Channels {
        let n = nchannels.min(self.addrs.len());
        if n == 0 {
            return Channels::None;
        }
        self.try_read(n).unwrap_or(Channels::Unknown)
    }

    fn try_read(&mut self, n: usize) -> Result<Channels> {
        let ctx = self.ctx.clone();
        let _g = ctx.enter()?;
        if self.busy && !self.copied.is_done()? {
            return Ok(Channels::Unknown);
        }
        self.busy = false;
        for (c, a) in self.addrs[..n].iter().enumerate() {
            for (k, &src) in a.iter().enumerate() {
                let dst = self.out.dev + (8 * (4 * c + k)) as u64;
                // SAFETY: `src` is a counter of a connection of this communicator (our arena, a
                // peer's mapped arena or registered host memory, alive as long as the transport,
                // which outlives the watcher) or a field of our device table; `dst` is 8 bytes of
                // `out`, which is kept alive until the copy is known to be done (see Drop).
                unsafe { cuda::memcpy_async(dst, src, 8, self.stream.0) }?;
            }
        }
        self.copied.record(self.stream.0)?;
        let deadline = Instant::now() + READ_WITHIN;
        while !self.copied.is_done()? {
            if Instant::now() >= deadline {
                self.busy = true;
                return Ok(Channels::Unknown);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let words: Vec<u64> =
            (0..4 * n).map(|i| u64::from(self.out.get(2 * i)) | u64::from(self.out.get(2 * i + 1)) << 32).collect();
        Ok(Channels::Read { prev: self.prev, next: self.next, runs: hang_report::runs(&progress(&words)), more: false })
    }
}

/// Per connected ring channel (from channel 0 up to the first that is not), the addresses
/// [`RingCounters`] reads: the receive head of our connection from `prev` (in its memory: we
/// store how many steps we took), the send head of ours to `next` (in our memory: it stores how
/// many it took), and both connections' `step` fields in the device table at `dev_table`.
/// Heads, not tails: every protocol moves them, while LL and LL128 over P2P leave tails alone.
fn ring_addrs(table: &[fnConn], dev_table: u64, prev: usize, next: usize, nchannels: usize) -> Vec<[u64; 4]> {
    let max = abi::FN_MAX_CHANNELS as usize;
    let step_at = |i: usize, field: usize| dev_table + (i * size_of::<fnConn>() + field) as u64;
    let recv_step = offset_of!(fnConn, recv) + offset_of!(fnConnRecv, step);
    let send_step = offset_of!(fnConn, send) + offset_of!(fnConnSend, step);
    (0..nchannels.min(max))
        .map(|c| (prev * max + c, next * max + c))
        .take_while(|&(p, n)| {
            table.get(p).is_some_and(|t| !t.recv.buffs[0].is_null())
                && table.get(n).is_some_and(|t| !t.send.buffs[0].is_null())
        })
        .map(|(p, n)| {
            [table[p].recv.head as u64, table[n].send.head as u64, step_at(p, recv_step), step_at(n, send_step)]
        })
        .collect()
}

/// Per channel, (steps taken from prev, steps next took) in this operation, from the four words
/// read per channel in the order of [`ring_addrs`]. A head behind its saved step (a counter
/// not reached yet, or a torn view) counts as 0.
fn progress(words: &[u64]) -> Vec<(u64, u64)> {
    words.chunks_exact(4).map(|w| (w[0].saturating_sub(w[2]), w[1].saturating_sub(w[3]))).collect()
}

impl Drop for RingCounters {
    fn drop(&mut self) {
        let _g = self.ctx.enter();
        // A copy still queued would write into freed memory: leave `out` allocated then.
        if !self.busy || self.copied.is_done().unwrap_or(false) {
            // SAFETY: dropped once, here; nothing writes into it any more.
            unsafe { ManuallyDrop::drop(&mut self.out) };
        }
        // SAFETY: each dropped once, here, with their context current; never used again.
        unsafe {
            ManuallyDrop::drop(&mut self.copied);
            ManuallyDrop::drop(&mut self.stream);
        }
    }
}

impl Observer {
    /// `f` with the communicator's GPU side, unless the communicator is gone or the process is
    /// exiting: then nothing is touched.
    fn with_gpu<T>(&self, f: impl FnOnce(&WatchGpu) -> T) -> Option<T> {
        let _alive = crate::exit::hold()?;
        self.gpu.upgrade().map(|g| f(&g))
    }
}

impl liveness::Observer for Observer {
    fn describe(&self, rank: usize) -> String {
        self.names.get(rank).cloned().unwrap_or_else(|| format!("rank {rank}"))
    }

    fn lost(&self, lost: Lost) {
        let _ = self.lost.set(lost.text);
        self.with_gpu(|g| g.flags.set(FLAG_ABORT, 1));
    }

    fn left(&self, rank: usize, colls: Option<u64>) {
        self.news.left.lock().insert(rank, (self.describe(rank), colls));
    }

    fn taken_part(&self) -> Option<u64> {
        // Read before asking whether the newest launch finished: it counts that launch or an older one.
        let colls = self.ops.coll_seq.iter().map(|c| c.load(Ordering::Acquire)).sum();
        let finished = self.with_gpu(|g| g.ctx.enter().and_then(|_g| g.last.is_done()).unwrap_or(false))?;
        finished.then_some(colls)
    }

    fn state(&self) -> String {
        let newest = *self.ops.newest.lock();
        let (finished, timed_out, channels) = self
            .with_gpu(|g| {
                let finished = g.ctx.enter().and_then(|_g| g.last.is_done()).unwrap_or(false);
                let timed_out = g.flags.get(FLAG_ERROR) == abi::FN_DEV_TIMEOUT;
                // The channels of an operation still waiting (or stopped by the watchdog while it
                // waited).
                let channels = match newest {
                    Newest::Kernel { ring, .. } if ring > 0 && (!finished || timed_out) => g.counters.lock().read(ring),
                    _ => Channels::None,
                };
                (finished, timed_out, channels)
            })
            .unwrap_or((false, false, Channels::Unknown));
        RankState {
            rank: self.rank,
            who: self.describe(self.rank),
            issued: self.ops.issued.load(Ordering::Relaxed),
            finished,
            what: newest.describe(),
            timed_out,
            channels,
        }
        .encode()
    }

    fn report(&self, lines: Vec<String>) {
        let states: Vec<RankState> = lines.iter().filter_map(|l| RankState::decode(l)).collect();
        for s in &states {
            crate::nccl_info!(
                crate::debug::Subsys::INIT,
                "hang report: {} issued #{} ({}), {}",
                s.who,
                s.issued,
                s.what,
                if s.finished { "finished" } else { "not finished" }
            );
        }
        let summary = hang_report::summarize(self.names.len(), &states);
        crate::nccl_warn!("comm {:#018x}: {summary}", self.comm_id);
        *self.news.report.lock() = Some(summary);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_operation_in_words() {
        let work = |ty: u32, count: u64| abi::fnWork { type_: ty as i32, count, ..Default::default() };
        let w = [work(abi::FN_WORK_SEND, 10), work(abi::FN_WORK_RECV, 20), work(abi::FN_WORK_SEND, 30)];
        assert_eq!(Newest::kernel(&w).describe(), "Send+Recv (3 works, 60 elements)");
        assert_eq!(
            Newest::kernel(&[work(abi::FN_WORK_ALLREDUCE, 1024)]).describe(),
            "AllReduce (1 works, 1024 elements)"
        );
        assert_eq!(Newest::CopyGroup.describe(), "copy-engine group");
        assert_eq!(Newest::default().describe(), "nothing yet");
        // A type the host never sends is ignored, not a panic.
        assert_eq!(Newest::kernel(&[work(40, 1)]).describe(), " (1 works, 1 elements)");
    }

    #[test]
    fn ring_counters_are_read_from_the_neighbours_connections() {
        let max = abi::FN_MAX_CHANNELS as usize;
        let (prev, next, dev_table) = (2usize, 1usize, 0x7f00_0000_0000u64);
        let mut table = vec![fnConn::default(); 3 * max];
        // Channels 0-2 connected both ways, channel 3 only towards prev: reading stops at 3.
        for c in 0..4 {
            let t = &mut table[prev * max + c];
            t.recv.buffs[0] = 0x1000 as *mut _;
            t.recv.head = (0x2000 + 8 * c) as *mut _;
            if c < 3 {
                let t = &mut table[next * max + c];
                t.send.buffs[0] = 0x3000 as *mut _;
                t.send.head = (0x4000 + 8 * c) as *mut _;
            }
        }
        let addrs = ring_addrs(&table, dev_table, prev, next, 64);
        assert_eq!(addrs.len(), 3);
        let conn = size_of::<fnConn>() as u64;
        let recv_step = (offset_of!(fnConn, recv) + offset_of!(fnConnRecv, step)) as u64;
        let send_step = (offset_of!(fnConn, send) + offset_of!(fnConnSend, step)) as u64;
        assert_eq!(
            addrs[1],
            [
                0x2008,
                0x4008,
                dev_table + (prev * max + 1) as u64 * conn + recv_step,
                dev_table + (next * max + 1) as u64 * conn + send_step
            ]
        );
        assert_eq!(ring_addrs(&table, dev_table, prev, next, 2).len(), 2);
        // A neighbour outside the table (a one-rank ring has no connections) reads nothing.
        assert!(ring_addrs(&table, dev_table, 5, next, 64).is_empty());
        assert!(ring_addrs(&[], dev_table, 0, 0, 64).is_empty());
    }

    #[test]
    fn progress_counts_this_operations_steps() {
        // (recv head, send head, recv step at the start, send step at the start) per channel.
        assert_eq!(progress(&[50, 41, 10, 10, 7, 7, 7, 7, 3, 9, 5, 2]), [(40, 31), (0, 0), (0, 7)]);
        assert!(progress(&[1, 2, 3]).is_empty());
    }

    #[test]
    fn only_ring_collectives_have_ring_channels_to_report() {
        let work = |ty: u32, algo: u32, ch: u16| abi::fnWork {
            type_: ty as i32,
            algo: algo as u8,
            nChannels: ch,
            ..Default::default()
        };
        let ring = |w: &[abi::fnWork]| match Newest::kernel(w) {
            Newest::Kernel { ring, .. } => ring,
            _ => unreachable!(),
        };
        let (r, one) = (abi::FN_ALGO_RING, abi::FN_ALGO_ONESHOT);
        assert_eq!(ring(&[work(abi::FN_WORK_ALLREDUCE, r, 32), work(abi::FN_WORK_ALLGATHER, r, 64)]), 64);
        assert_eq!(ring(&[work(abi::FN_WORK_ALLREDUCE, one, 16)]), 0);
        assert_eq!(ring(&[work(abi::FN_WORK_SEND, r, 4), work(abi::FN_WORK_COPY, r, 4)]), 0);
    }
}
