//! `ferronickel perf`: a quick sweep of collectives over the local GPUs, with nccl-tests' columns
//! and every result checked.
//!
//! One process drives every rank: `ncclCommInitAll` over the GPUs (each repeated
//! `--ranks-per-gpu` times), and each operation is issued on all ranks in one group from this
//! thread, as nccl-tests' `-g` mode does. Inputs are fresh pseudo-random small integers (exact in
//! float sums, so the check is bit-exact), outputs are poisoned with NaN before every checked run,
//! and every output element is compared with a host reference. Time is wall clock over
//! `--iters` groups issued back to back, then waited for.

use crate::args::PerfArgs;
use crate::gpu::{self, err, Stream};
use crate::plan::human;
use crate::{CmdResult, Report};
use nccl::api::coll::{ncclAllGather, ncclAllReduce, ncclAlltoAll, ncclBroadcast, ncclReduce, ncclReduceScatter};
use nccl::api::group::{ncclGroupEnd, ncclGroupStart};
use nccl::api::init::{ncclCommDestroy, ncclCommInitAll};
use nccl::api::version::{ncclGetErrorString, ncclGetLastError};
use nccl::cuda::{self, Context, DeviceBuffer};
use nccl::types::{cudaStream_t, ncclComm_t, ncclFloat32, ncclResult_t, ncclSum};
use serde_json::json;
use std::ffi::{c_void, CStr};
use std::fmt::Write;
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AlltoAll,
}

const COLLS: [(Coll, &str); 6] = [
    (Coll::AllReduce, "all_reduce"),
    (Coll::AllGather, "all_gather"),
    (Coll::ReduceScatter, "reduce_scatter"),
    (Coll::Broadcast, "broadcast"),
    (Coll::Reduce, "reduce"),
    (Coll::AlltoAll, "alltoall"),
];

/// The root of rooted collectives (nccl-tests' default).
const ROOT: usize = 0;
/// Output poison: a NaN no collective of finite inputs produces.
const POISON: u32 = 0x7fc0_dead;

impl Coll {
    /// Elements each rank sends and receives for a size in nccl-tests' sense, or `None` if too
    /// small for `n` ranks; and the size actually moved.
    fn counts(self, size: usize, n: usize) -> Option<(usize, usize, usize)> {
        let elems = size / 4;
        let (send, recv) = match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce => (elems, elems),
            Coll::AllGather => (elems / n, elems / n * n),
            Coll::ReduceScatter => (elems / n * n, elems / n),
            Coll::AlltoAll => (elems / n * n, elems / n * n),
        };
        (send > 0 && recv > 0).then_some((send, recv, send.max(recv) * 4))
    }

    /// nccl-tests' bus bandwidth factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AlltoAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce => 1.0,
        }
    }

    fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// What rank `r`'s output must hold, from every rank's input (`None`: not checked, the
    /// receive buffer of a non-root reduce).
    fn reference(self, inputs: &[Vec<f32>], r: usize, recv: usize) -> Option<Vec<f32>> {
        let n = inputs.len();
        let sum = |i: usize| inputs.iter().map(|v| v[i]).sum::<f32>();
        let c = recv / if matches!(self, Coll::AllGather | Coll::AlltoAll) { n } else { 1 };
        Some(match self {
            Coll::AllReduce => (0..recv).map(sum).collect(),
            Coll::Reduce if r != ROOT => return None,
            Coll::Reduce => (0..recv).map(sum).collect(),
            Coll::Broadcast => inputs[ROOT][..recv].to_vec(),
            Coll::AllGather => (0..recv).map(|i| inputs[i / c][i % c]).collect(),
            Coll::ReduceScatter => (0..recv).map(|i| sum(r * recv + i)).collect(),
            Coll::AlltoAll => (0..recv).map(|i| inputs[i / c][r * c + i % c]).collect(),
        })
    }
}

/// One rank: its communicator, stream and context (fields drop in order: the stream before the
/// context it lives in).
struct Rank {
    comm: ncclComm_t,
    stream: Stream,
    ctx: Context,
}

/// The communicators of one `ncclCommInitAll`, destroyed on drop (before their contexts).
struct Ranks(Vec<Rank>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for r in &self.0 {
            // SAFETY: comm came from ncclCommInitAll and is destroyed once; its stream is idle
            // (every group is waited for before anything is dropped, or the process exits).
            unsafe { ncclCommDestroy(r.comm) };
        }
    }
}

/// Turns an NCCL status into the command's error, with the library's last error text.
fn nccl_ok(rc: ncclResult_t, what: &str) -> Result<(), String> {
    if rc == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: both return static NUL-terminated strings (NULL comm: the thread's last error).
    let (name, last) = unsafe {
        (CStr::from_ptr(ncclGetErrorString(rc as i32)), CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())))
    };
    Err(format!("{what} failed: {} ({})", name.to_string_lossy(), last.to_string_lossy()))
}

struct Sweep {
    min: usize,
    max: usize,
    factor: usize,
    iters: usize,
    warmup: usize,
}

pub fn run(args: PerfArgs) -> CmdResult {
    let per_gpu = args.ranks_per_gpu;
    let sweep =
        Sweep { min: args.min_bytes, max: args.max_bytes, factor: args.factor, iters: args.iters, warmup: args.warmup };
    let names = args.collectives;
    let colls: Vec<(Coll, &str)> = if names.is_empty() {
        COLLS.to_vec()
    } else {
        names
            .iter()
            .map(|n| {
                COLLS
                    .iter()
                    .find(|(_, c)| c == n)
                    .copied()
                    .ok_or_else(|| format!("unknown collective {n:?} (known: {})", COLLS.map(|(_, c)| c).join(" ")))
            })
            .collect::<Result<_, _>>()?
    };
    if sweep.factor < 2
        || sweep.min > sweep.max
        || sweep.max > 16 << 30
        || per_gpu > 64
        || sweep.iters.max(sweep.warmup) > 100_000
    {
        return Err("need --factor >= 2, --min-bytes <= --max-bytes <= 16G, --ranks-per-gpu <= 64, --iters and --warmup <= 100000".into());
    }
    let gpus = gpu::probe().map_err(|e| format!("perf needs a GPU: {e}"))?;
    let devs: Vec<i32> = gpus.iter().flat_map(|g| std::iter::repeat_n(g.ordinal, per_gpu)).collect();
    let ranks = init(&devs)?;
    let n = devs.len();

    let mut text = format!(
        "# {n} rank(s) on {} GPU(s) ({per_gpu} per GPU), one process, out of place, float, checked\n",
        gpus.len()
    );
    writeln!(
        text,
        "#{:>11} {:>12} {:>6} {:>6} {:>5} {:>10} {:>8} {:>8} {:>7}  collective",
        "size", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong"
    )
    .unwrap();
    let mut rows = Vec::new();
    let mut wrong_total = 0;
    let mut seed = 1u64;
    for (coll, name) in colls {
        let mut size = sweep.min;
        while size <= sweep.max {
            if let Some((send, recv, moved)) = coll.counts(size, n) {
                seed += 1;
                let (us, wrong) = measure(&ranks, coll, send, recv, &sweep, seed)?;
                let algbw = moved as f64 / us / 1e3;
                let busbw = algbw * coll.bus_factor(n);
                let redop = match coll {
                    Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce => "sum",
                    _ => "none",
                };
                let root = if coll.rooted() { ROOT.to_string() } else { "-".into() };
                writeln!(
                    text,
                    "{:>12} {:>12} {:>6} {:>6} {:>5} {:>10.2} {:>8.2} {:>8.2} {:>7}  {name}",
                    moved,
                    moved / 4,
                    "float",
                    redop,
                    root,
                    us,
                    algbw,
                    busbw,
                    wrong
                )
                .unwrap();
                wrong_total += wrong;
                rows.push(json!({
                    "collective": name, "size": moved, "count": moved / 4, "type": "float",
                    "redop": redop, "root": coll.rooted().then_some(ROOT), "time_us": us,
                    "algbw_gbps": algbw, "busbw_gbps": busbw, "wrong": wrong,
                }));
            }
            size = match size.checked_mul(sweep.factor) {
                Some(s) => s,
                None => break,
            };
        }
    }
    writeln!(
        text,
        "# {} wrong element(s) in total; sizes from {} to {}",
        wrong_total,
        human(sweep.min),
        human(sweep.max)
    )
    .unwrap();
    drop(ranks);
    let json = json!({ "nranks": n, "ranks_per_gpu": per_gpu, "rows": rows, "wrong_total": wrong_total });
    // Like nccl-tests: the whole table, then a failing status if anything was wrong.
    let failed =
        (wrong_total > 0).then(|| format!("{wrong_total} wrong element(s): results differ from the host reference"));
    Ok(Report { text, json, failed })
}

fn init(devs: &[i32]) -> Result<Ranks, String> {
    let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devs.len()];
    // SAFETY: comms has room for devs.len() handles; devs is a valid list of that length.
    nccl_ok(unsafe { ncclCommInitAll(comms.as_mut_ptr(), devs.len() as i32, devs.as_ptr()) }, "ncclCommInitAll")?;
    let mut ranks = Ranks(Vec::new());
    for (&comm, &dev) in comms.iter().zip(devs) {
        let ctx = cuda::primary_context(dev).map_err(err)?;
        let stream = {
            let _g = ctx.enter().map_err(err)?;
            Stream::new()?
        };
        ranks.0.push(Rank { comm, stream, ctx });
    }
    Ok(ranks)
}

/// xorshift64: inputs differ per rank and per size.
fn inputs(seed: u64, len: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) % 17) as f32 - 8.0
        })
        .collect()
}

/// One size of one collective: a checked run, then the timed ones. Returns (µs, wrong elements).
fn measure(
    ranks: &Ranks,
    coll: Coll,
    send: usize,
    recv: usize,
    sweep: &Sweep,
    seed: u64,
) -> Result<(f64, usize), String> {
    let n = ranks.0.len();
    let host_in: Vec<Vec<f32>> = (0..n).map(|r| inputs(seed * 1000 + r as u64, send)).collect();
    let mut bufs = Vec::new();
    for (r, rank) in ranks.0.iter().enumerate() {
        let _g = rank.ctx.enter().map_err(err)?;
        let s = DeviceBuffer::zeroed(send * 4).map_err(err)?;
        let d = DeviceBuffer::zeroed(recv * 4).map_err(err)?;
        s.write(0, &host_in[r]).map_err(err)?;
        d.write(0, &vec![POISON; recv]).map_err(err)?;
        bufs.push((s, d));
    }
    let issue = || -> Result<(), String> {
        // SAFETY: no arguments.
        nccl_ok(unsafe { ncclGroupStart() }, "ncclGroupStart")?;
        for (rank, (s, d)) in ranks.0.iter().zip(&bufs) {
            let (sp, dp) = (s.ptr as *const c_void, d.ptr as *mut c_void);
            let st = rank.stream.0 as cudaStream_t;
            let c = rank.comm;
            let root = ROOT as i32;
            // SAFETY: buffers are live device allocations of `send`/`recv` floats on the rank's
            // GPU, the counts match them, comm and stream belong to this rank.
            let rc = unsafe {
                match coll {
                    Coll::AllReduce => ncclAllReduce(sp, dp, send, ncclFloat32, ncclSum, c, st),
                    Coll::AllGather => ncclAllGather(sp, dp, send, ncclFloat32, c, st),
                    Coll::ReduceScatter => ncclReduceScatter(sp, dp, recv, ncclFloat32, ncclSum, c, st),
                    Coll::Broadcast => ncclBroadcast(sp, dp, send, ncclFloat32, root, c, st),
                    Coll::Reduce => ncclReduce(sp, dp, send, ncclFloat32, ncclSum, root, c, st),
                    Coll::AlltoAll => ncclAlltoAll(sp, dp, send / n, ncclFloat32, c, st),
                }
            };
            nccl_ok(rc, "the collective")?;
        }
        // SAFETY: no arguments.
        nccl_ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd")
    };
    let wait_all = || -> Result<(), String> {
        for (r, rank) in ranks.0.iter().enumerate() {
            rank.stream.wait(&format!("rank {r}'s {coll:?}"))?;
        }
        Ok(())
    };

    issue()?;
    wait_all()?;
    let mut wrong = 0;
    for (r, rank) in ranks.0.iter().enumerate() {
        let Some(want) = coll.reference(&host_in, r, recv) else { continue };
        let _g = rank.ctx.enter().map_err(err)?;
        let mut got = vec![0f32; recv];
        bufs[r].1.read(&mut got).map_err(err)?;
        wrong += got.iter().zip(&want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
    }
    for _ in 0..sweep.warmup {
        issue()?;
    }
    wait_all()?;
    let t = Instant::now();
    for _ in 0..sweep.iters {
        issue()?;
    }
    wait_all()?;
    let us = t.elapsed().as_secs_f64() * 1e6 / sweep.iters.max(1) as f64;
    // Free in each buffer's own context.
    for (rank, b) in ranks.0.iter().zip(bufs) {
        let _g = rank.ctx.enter().map_err(err)?;
        drop(b);
    }
    Ok((us, wrong))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three ranks' inputs of 6 elements: rank r holds 10r + i.
    fn three() -> Vec<Vec<f32>> {
        (0..3).map(|r| (0..6).map(|i| (10 * r + i) as f32).collect()).collect()
    }

    #[test]
    fn references_match_hand_worked_results() {
        let x = three();
        // Sums over ranks of element i: 30 + 3i.
        assert_eq!(Coll::AllReduce.reference(&x, 2, 6).unwrap(), [30.0, 33.0, 36.0, 39.0, 42.0, 45.0]);
        assert_eq!(Coll::Reduce.reference(&x, 0, 6).unwrap(), [30.0, 33.0, 36.0, 39.0, 42.0, 45.0]);
        assert_eq!(Coll::Reduce.reference(&x, 1, 6), None, "a non-root's receive buffer is not checked");
        assert_eq!(Coll::Broadcast.reference(&x, 1, 6).unwrap(), x[0]);
        // All-gather of 2 elements per rank: rank blocks in rank order.
        let two: Vec<Vec<f32>> = x.iter().map(|v| v[..2].to_vec()).collect();
        assert_eq!(Coll::AllGather.reference(&two, 1, 6).unwrap(), [0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
        // Reduce-scatter of 6 into 2 per rank: rank 1 gets the sums of elements 2 and 3.
        assert_eq!(Coll::ReduceScatter.reference(&x, 1, 2).unwrap(), [36.0, 39.0]);
        // All-to-all, 2 per peer: rank 2 gets block 2 of every rank.
        assert_eq!(Coll::AlltoAll.reference(&x, 2, 6).unwrap(), [4.0, 5.0, 14.0, 15.0, 24.0, 25.0]);
    }

    #[test]
    fn counts_follow_nccl_tests() {
        assert_eq!(Coll::AllReduce.counts(1024, 4), Some((256, 256, 1024)));
        assert_eq!(Coll::AllGather.counts(1024, 4), Some((64, 256, 1024)));
        assert_eq!(Coll::ReduceScatter.counts(1024, 4), Some((256, 64, 1024)));
        assert_eq!(Coll::AlltoAll.counts(1000, 3), Some((249, 249, 996)));
        assert_eq!(Coll::AllGather.counts(8, 4), None, "less than one element per rank");
        assert_eq!(Coll::AllReduce.bus_factor(4), 1.5);
    }

    #[test]
    fn inputs_are_small_integers_that_differ() {
        let (a, b) = (inputs(1, 1000), inputs(2, 1000));
        assert!(a.iter().chain(&b).all(|v| v.fract() == 0.0 && (-8.0..=8.0).contains(v)));
        assert_ne!(a, b);
    }
}
