//! Collectives, point-to-point, and user reduction operators.
//!
//! Every entry goes the same way (NCCL's habit): check the communicator, check every argument,
//! then hand tasks to the group layer, which launches at once outside a group.

use super::{boundary, boundary_with, comm_arg, non_null, rank_arg, write_out, SUCCESS};
use crate::abi;
use crate::comm::{Comm, UserOp};
use crate::error::{Error, Result};
use crate::group::{self, Queued};
use crate::plugin::nvtx::Payload;
use crate::task::{CollKind, CollTask, DevOp, Task};
use crate::types::*;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// One buffer argument: its pointer, the bytes the operation touches, and whether this rank
/// touches it at all (a non-root's receive buffer of a Reduce may be NULL).
struct Buf<'a>(*const c_void, usize, bool, &'a str);

/// Checks buffer arguments: first that none that will be touched is NULL, then (with
/// NCCL_CHECK_POINTERS=1, the default) that the GPU can address them, which would otherwise
/// kill the CUDA context.
fn buffers<const N: usize>(bufs: [Buf; N]) -> Result<[u64; N]> {
    let touched = |b: &Buf| b.2 && b.1 > 0;
    for b in bufs.iter().filter(|b| touched(b)) {
        if b.0.is_null() {
            crate::bail_arg!("{} is NULL but {} bytes must be accessed", b.3, b.1);
        }
    }
    if crate::comm::check_pointers() != 0 {
        for b in bufs.iter().filter(|b| touched(b)) {
            if !crate::cuda::is_device_pointer(b.0) {
                crate::bail_arg!(
                    "{} {:p} is not memory the GPU can access (allocate it with cudaMalloc or register it)",
                    b.3,
                    b.0
                );
            }
        }
    }
    Ok(bufs.map(|b| b.0 as u64))
}

/// Element size, refusing unknown types and fp8 on GPUs older than Hopper.
fn dtype_arg(comm: &Comm, dtype: ncclDataType_t) -> Result<usize> {
    let size = dtype_size(dtype)
        .ok_or_else(|| Error::InvalidArgument(format!("datatype {dtype} is not a valid ncclDataType_t")))?;
    if matches!(dtype, ncclFloat8e4m3 | ncclFloat8e5m2) && comm.cc_major < 9 {
        crate::bail_arg!(
            "datatype {} needs compute capability 9.0 or newer (device {} has {}.x)",
            dtype_name(dtype),
            comm.dev,
            comm.cc_major
        );
    }
    Ok(size)
}

/// Bytes of `count` elements times `factor`, refusing overflow.
fn bytes_of(count: usize, elem: usize, factor: usize, arg: &str) -> Result<usize> {
    count
        .checked_mul(elem)
        .and_then(|b| b.checked_mul(factor))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Error::InvalidArgument(format!("{arg} {count} overflows the addressable size")))
}

/// Bits of `v` rounded to the nearest value of a float type (for ncclAvg's 1/nranks).
pub fn float_bits(v: f64, dtype: ncclDataType_t) -> u64 {
    fn minifloat(v: f64, ebits: i32, mbits: i32) -> u64 {
        // v is positive and finite here; subnormals are handled, overflow cannot happen for 1/n.
        let bias = (1 << (ebits - 1)) - 1;
        let e = v.log2().floor() as i32;
        if e < 1 - bias {
            return (v / 2f64.powi(1 - bias - mbits)).round_ties_even() as u64;
        }
        let mant = ((v / 2f64.powi(e) - 1.0) * 2f64.powi(mbits)).round_ties_even() as u64;
        (((e + bias) as u64) << mbits) + mant
    }
    match dtype {
        ncclFloat64 => v.to_bits(),
        ncclFloat32 => (v as f32).to_bits() as u64,
        ncclFloat16 => minifloat(v, 5, 10),
        ncclBfloat16 => minifloat(v, 8, 7),
        ncclFloat8e4m3 => minifloat(v, 4, 3),
        ncclFloat8e5m2 => minifloat(v, 5, 2),
        _ => 0,
    }
}

/// The device operator for a user-visible `ncclRedOp_t`.
fn op_arg(comm: &Comm, op: ncclRedOp_t, dtype: ncclDataType_t) -> Result<DevOp> {
    Ok(match op {
        ncclSum => DevOp::plain(abi::FN_OP_SUM),
        ncclProd => DevOp::plain(abi::FN_OP_PROD),
        ncclMax => DevOp::plain(abi::FN_OP_MAX),
        ncclMin => DevOp::plain(abi::FN_OP_MIN),
        // Floats average as NCCL does: each rank pre-multiplies by 1/n; integers divide at the end.
        ncclAvg if dtype_is_float(dtype) => DevOp {
            kind: abi::FN_OP_PREMULSUM,
            scalar: float_bits(1.0 / comm.nranks as f64, dtype),
            scalar_is_ptr: false,
        },
        ncclAvg => DevOp::plain(abi::FN_OP_SUMPOSTDIV),
        _ => {
            let ops = comm.user_ops.lock();
            let user = usize::try_from(op - ncclNumOps).ok().and_then(|i| ops.get(i).copied().flatten());
            match user {
                Some(u) if u.dtype == dtype => u.op,
                Some(u) => crate::bail_arg!(
                    "op {op} was created for {} but is used with {}",
                    dtype_name(u.dtype),
                    dtype_name(dtype)
                ),
                None => crate::bail_arg!("op {op} is not a valid ncclRedOp_t on this communicator"),
            }
        }
    })
}

/// The communicator hash of an NVTX payload: 0 for a handle that is no communicator, as NCCL.
fn comm_hash(comm: ncclComm_t) -> u64 {
    comm_arg(comm).and_then(|h| h.queryable()).map_or(0, |c| c.bootstrap.magic())
}

/// An NVTX payload's message size: NCCL's `count * ncclTypeSize(datatype)` (one rank's part, also
/// for AllGather and AlltoAll); 0 for an unknown type.
fn nvtx_bytes(count: usize, dtype: ncclDataType_t) -> usize {
    dtype_size(dtype).map_or(0, |e| count.wrapping_mul(e))
}

/// Queues tasks whose buffers the caller checked with [`buffers`].
fn submit(comm: &Arc<Comm>, stream: cudaStream_t, tasks: Vec<Task>) -> Result<ncclResult_t> {
    let ops = tasks.into_iter().map(|task| Queued { comm: comm.clone(), stream: stream as _, task }).collect();
    // SAFETY: every caller passes only buffers that `buffers` accepted (device memory of the
    // operation's size, when NCCL_CHECK_POINTERS is on, as NCCL checks them).
    unsafe { group::submit(ops) }?;
    SUCCESS
}

/// The reducing and data-moving collectives share everything but their buffer sizes.
#[allow(clippy::too_many_arguments)]
fn collective(
    kind: CollKind,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: Option<ncclRedOp_t>,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<ncclResult_t> {
    let c = comm_arg(comm)?.ready()?;
    c.check_peers_coll()?;
    crate::tuner::restrictions()?.check(kind, c.nranks)?;
    let elem = dtype_arg(&c, dtype)?;
    let dev_op = match op {
        Some(op) => op_arg(&c, op, dtype)?,
        None => DevOp::plain(abi::FN_OP_SUM),
    };
    let rooted = matches!(kind, CollKind::Reduce | CollKind::Broadcast);
    let root = if rooted { rank_arg(root, c.nranks, "root")? } else { 0 };
    let n = c.nranks;
    let me_root = c.rank == root;
    let (send_bytes, recv_bytes, send_used, recv_used) = match kind {
        CollKind::AllReduce => (bytes_of(count, elem, 1, "count")?, bytes_of(count, elem, 1, "count")?, true, true),
        CollKind::Reduce => (bytes_of(count, elem, 1, "count")?, bytes_of(count, elem, 1, "count")?, true, me_root),
        CollKind::Broadcast => (bytes_of(count, elem, 1, "count")?, bytes_of(count, elem, 1, "count")?, me_root, true),
        CollKind::AllGather => {
            (bytes_of(count, elem, 1, "sendcount")?, bytes_of(count, elem, n, "sendcount")?, true, true)
        }
        CollKind::ReduceScatter => {
            (bytes_of(count, elem, n, "recvcount")?, bytes_of(count, elem, 1, "recvcount")?, true, true)
        }
    };
    let [send, recv] =
        buffers([Buf(sendbuff, send_bytes, send_used, "sendbuff"), Buf(recvbuff, recv_bytes, recv_used, "recvbuff")])?;
    crate::nccl_info!(
        crate::debug::Subsys::COLL,
        "{kind:?}: sendbuff {sendbuff:p} recvbuff {recvbuff:p} count {count} datatype {} op {} root {root} comm {comm:p} [nranks={n}] stream {stream:p}",
        dtype_name(dtype),
        op.unwrap_or(ncclSum)
    );
    // Symmetric kernels need both buffers in symmetric windows (docs/ARCHITECTURE.md, "Symmetric
    // kernels"); found here, once, so that planning stays a pure function of the task.
    let sym = match kind {
        CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter if count > 0 => {
            c.symmetric_buffers(send, send_bytes, recv, recv_bytes)
        }
        _ => None,
    };
    let queued =
        submit(&c, stream, vec![Task::Coll(CollTask { kind, send, recv, count, dtype, op: dev_op, root, sym })])?;
    c.called_coll();
    Ok(queued)
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclAllReduce",
        || Payload::BytesOp { comm: comm_hash(comm), bytes: nvtx_bytes(count, datatype), op },
        || collective(CollKind::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), 0, comm, stream),
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclReduce",
        || Payload::BytesRootOp { comm: comm_hash(comm), bytes: nvtx_bytes(count, datatype), root, op },
        || collective(CollKind::Reduce, sendbuff, recvbuff, count, datatype, Some(op), root, comm, stream),
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclBroadcast",
        || Payload::BytesRank { comm: comm_hash(comm), bytes: nvtx_bytes(count, datatype), rank: root },
        || collective(CollKind::Broadcast, sendbuff, recvbuff, count, datatype, None, root, comm, stream),
    )
}

/// The legacy in-place broadcast.
#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclBcast",
        || Payload::BytesRank { comm: comm_hash(comm), bytes: nvtx_bytes(count, datatype), rank: root },
        || collective(CollKind::Broadcast, buff, buff, count, datatype, None, root, comm, stream),
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclAllGather",
        || Payload::Bytes { comm: comm_hash(comm), bytes: nvtx_bytes(sendcount, datatype) },
        || collective(CollKind::AllGather, sendbuff, recvbuff, sendcount, datatype, None, 0, comm, stream),
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclReduceScatter",
        || Payload::BytesOp { comm: comm_hash(comm), bytes: nvtx_bytes(recvcount, datatype), op },
        || collective(CollKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, Some(op), 0, comm, stream),
    )
}

/// Which peers a grouped point-to-point pattern sends to and receives from.
#[derive(Clone, Copy)]
enum Pattern {
    AlltoAll,
    Gather(usize),
    Scatter(usize),
}

/// AlltoAll, Gather and Scatter are grouped sends and receives, as in NCCL.
fn p2p_pattern(
    pattern: Pattern,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    comm: &Arc<Comm>,
    stream: cudaStream_t,
) -> Result<ncclResult_t> {
    comm.check_peers(None)?;
    let elem = dtype_arg(comm, dtype)?;
    let (n, me) = (comm.nranks, comm.rank);
    let block = bytes_of(count, elem, 1, "count")?;
    let all = bytes_of(count, elem, n, "count")?;
    let (sends_to, recvs_from): (Vec<usize>, Vec<usize>) = match pattern {
        Pattern::AlltoAll => ((0..n).collect(), (0..n).collect()),
        Pattern::Gather(root) => (vec![root], if me == root { (0..n).collect() } else { vec![] }),
        Pattern::Scatter(root) => (if me == root { (0..n).collect() } else { vec![] }, vec![root]),
    };
    // Per-peer blocks for the side that talks to every rank, one block otherwise.
    let strided_send = matches!(pattern, Pattern::AlltoAll | Pattern::Scatter(_));
    let strided_recv = matches!(pattern, Pattern::AlltoAll | Pattern::Gather(_));
    let [send, recv] = buffers([
        Buf(sendbuff, if strided_send { all } else { block }, !sends_to.is_empty(), "sendbuff"),
        Buf(recvbuff, if strided_recv { all } else { block }, !recvs_from.is_empty(), "recvbuff"),
    ])?;
    let mut tasks = Vec::new();
    for &p in &sends_to {
        let buf = if strided_send { send + (p * block) as u64 } else { send };
        tasks.push(Task::Send { buf, bytes: block, peer: p });
    }
    for &p in &recvs_from {
        let buf = if strided_recv { recv + (p * block) as u64 } else { recv };
        tasks.push(Task::Recv { buf, bytes: block, peer: p });
    }
    submit(comm, stream, tasks)
}

#[no_mangle]
pub unsafe extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclAlltoAll",
        || Payload::Bytes { comm: comm_hash(comm), bytes: nvtx_bytes(count, datatype) },
        || {
            let c = comm_arg(comm)?.ready()?;
            p2p_pattern(Pattern::AlltoAll, sendbuff, recvbuff, count, datatype, &c, stream)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclGather",
        || Payload::BytesRank { comm: comm_hash(comm), bytes: nvtx_bytes(count, datatype), rank: root },
        || {
            let c = comm_arg(comm)?.ready()?;
            let root = rank_arg(root, c.nranks, "root")?;
            p2p_pattern(Pattern::Gather(root), sendbuff, recvbuff, count, datatype, &c, stream)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclScatter",
        || Payload::BytesRank { comm: comm_hash(comm), bytes: nvtx_bytes(count, datatype), rank: root },
        || {
            let c = comm_arg(comm)?.ready()?;
            let root = rank_arg(root, c.nranks, "root")?;
            p2p_pattern(Pattern::Scatter(root), sendbuff, recvbuff, count, datatype, &c, stream)
        },
    )
}

fn point_to_point(
    is_send: bool,
    buff: *const c_void,
    count: usize,
    dtype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<ncclResult_t> {
    let c = comm_arg(comm)?.ready()?;
    let elem = dtype_arg(&c, dtype)?;
    let peer = rank_arg(peer, c.nranks, "peer")?;
    c.check_peers(Some(peer))?;
    let bytes = bytes_of(count, elem, 1, "count")?;
    let [buf] = buffers([Buf(buff, bytes, true, if is_send { "sendbuff" } else { "recvbuff" })])?;
    let task = if is_send { Task::Send { buf, bytes, peer } } else { Task::Recv { buf, bytes, peer } };
    submit(&c, stream, vec![task])
}

#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclSend",
        || Payload::BytesRank { comm: comm_hash(comm), bytes: nvtx_bytes(count, datatype), rank: peer },
        || point_to_point(true, sendbuff, count, datatype, peer, comm, stream),
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary_with(
        "ncclRecv",
        || Payload::BytesRank { comm: comm_hash(comm), bytes: nvtx_bytes(count, datatype), rank: peer },
        || point_to_point(false, recvbuff, count, datatype, peer, comm, stream),
    )
}

/// A sum where each rank first multiplies its input by `*scalar` (host value read now, or a
/// device value read by every collective that uses the op).
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    boundary("ncclRedOpCreatePreMulSum", || {
        let c = comm_arg(comm)?.ready()?;
        non_null(op, "op")?;
        non_null(scalar, "scalar")?;
        let elem = dtype_arg(&c, datatype)?;
        let dev_op = match residence {
            ncclScalarHostImmediate => {
                let mut bits = [0u8; 8];
                // SAFETY: scalar points to one value of `datatype` (elem bytes) by the API's contract.
                unsafe { std::ptr::copy_nonoverlapping(scalar as *const u8, bits.as_mut_ptr(), elem) };
                DevOp { kind: abi::FN_OP_PREMULSUM, scalar: u64::from_le_bytes(bits), scalar_is_ptr: false }
            }
            ncclScalarDevice => {
                if !crate::cuda::is_device_pointer(scalar) {
                    crate::bail_arg!(
                        "scalar {scalar:p} is not device-accessible memory but residence is ncclScalarDevice"
                    );
                }
                DevOp { kind: abi::FN_OP_PREMULSUM, scalar: scalar as u64, scalar_is_ptr: true }
            }
            _ => crate::bail_arg!("residence {residence} is not a valid ncclScalarResidence_t"),
        };
        let mut ops = c.user_ops.lock();
        let slot = match ops.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                ops.push(None);
                ops.len() - 1
            }
        };
        ops[slot] = Some(UserOp { dtype: datatype, op: dev_op });
        // SAFETY: checked non-NULL.
        unsafe { write_out(op, ncclNumOps + slot as c_int) };
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    boundary("ncclRedOpDestroy", || {
        let c = comm_arg(comm)?.queryable()?;
        if (0..ncclNumOps).contains(&op) {
            crate::bail_arg!("op {op} is a built-in operator and cannot be destroyed");
        }
        let mut ops = c.user_ops.lock();
        match usize::try_from(op - ncclNumOps).ok().and_then(|i| ops.get_mut(i)) {
            Some(slot @ Some(_)) => *slot = None,
            _ => crate::bail_arg!("op {op} is not a user operator of this communicator"),
        }
        SUCCESS
    })
}

// The pnccl* profiling twins of this file's exports.
twins! {
    ncclAllReduce => pncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
        datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    ncclReduce => pncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    ncclBroadcast => pncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
        datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    ncclBcast => pncclBcast(buff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t,
        stream: cudaStream_t) -> ncclResult_t;
    ncclAllGather => pncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize,
        datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    ncclReduceScatter => pncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize,
        datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    ncclAlltoAll => pncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
        datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    ncclGather => pncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
        root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    ncclScatter => pncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize,
        datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    ncclSend => pncclSend(sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int,
        comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    ncclRecv => pncclRecv(recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: c_int,
        comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    ncclRedOpCreatePreMulSum => pncclRedOpCreatePreMulSum(op: *mut ncclRedOp_t, scalar: *mut c_void,
        datatype: ncclDataType_t, residence: ncclScalarResidence_t, comm: ncclComm_t) -> ncclResult_t;
    ncclRedOpDestroy => pncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avg_scalars() {
        assert_eq!(float_bits(0.5, ncclFloat16), 0x3800);
        assert_eq!(float_bits(0.25, ncclBfloat16), 0x3e80);
        assert_eq!(float_bits(1.0 / 3.0, ncclFloat16), 0x3555);
        assert_eq!(float_bits(0.5, ncclFloat8e4m3), 0x30);
        assert_eq!(float_bits(0.5, ncclFloat8e5m2), 0x38);
        assert_eq!(float_bits(0.125, ncclFloat32), 0.125f32.to_bits() as u64);
        // 1/1024 is subnormal in e4m3 (min normal 2^-6): 2^-10 rounds to 2^-9 * 0.5 -> 0 or 1 ulp.
        assert!(float_bits(1.0 / 512.0, ncclFloat8e4m3) == 1);
    }

    #[test]
    fn overflow_is_refused() {
        assert!(bytes_of(usize::MAX / 2, 4, 1, "count").is_err());
        assert!(bytes_of(1 << 40, 8, 1 << 30, "count").is_err());
        assert_eq!(bytes_of(10, 4, 3, "count").unwrap(), 120);
    }
}
