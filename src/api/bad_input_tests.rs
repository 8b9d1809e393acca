//! Table-driven bad-input test: every export, each bad argument, the exact code and the
//! `ncclGetLastError` text. Communicators here come from a real bootstrap (loopback) with no
//! GPU behind them, so everything before the launch is the production path.

use super::{coll, device_api, group, init, mem, query, version};
use crate::abi::device_api::{
    ncclDevComm, ncclDevCommRequirements, ncclDevResourceRequirements, ncclGinBarrierHandle, ncclLsaBarrierHandle,
    ncclTeamRequirements, ncclTeam_t,
};
use crate::bootstrap::{new_unique_id, Bootstrap};
use crate::comm::{registry, Comm, Phase};
use crate::types::ncclResult_t::*;
use crate::types::*;
use std::ffi::{c_int, c_void, CStr};
use std::sync::Arc;
use std::time::Duration;

/// Publishes `n` GPU-less communicators of one clique (one per rank) with compute capability `cc`.
fn fake_comms(n: usize, cc: i32) -> Vec<ncclComm_t> {
    let id = new_unique_id().expect("unique id");
    let threads: Vec<_> =
        (0..n).map(|r| std::thread::spawn(move || Bootstrap::init(&id, r, n, Duration::from_secs(20)))).collect();
    threads
        .into_iter()
        .map(|t| {
            let b = t.join().unwrap().expect("bootstrap");
            registry::publish(Phase::Ready(Arc::new(Comm::without_gpu(b, cc)))).0
        })
        .collect()
}

fn last_error() -> String {
    // SAFETY: a static NUL-terminated buffer.
    unsafe { CStr::from_ptr(version::ncclGetLastError(std::ptr::null_mut())) }.to_string_lossy().into_owned()
}

struct Case {
    name: &'static str,
    call: Box<dyn Fn() -> ncclResult_t>,
    code: ncclResult_t,
    text: &'static str,
}

fn case(name: &'static str, code: ncclResult_t, text: &'static str, call: impl Fn() -> ncclResult_t + 'static) -> Case {
    Case { name, call: Box::new(call), code, text }
}

fn config() -> ncclConfig_t {
    ncclConfig_t {
        size: std::mem::size_of::<ncclConfig_t>(),
        magic: NCCL_CONFIG_MAGIC,
        version: NCCL_VERSION_CODE as u32,
        blocking: NCCL_CONFIG_UNDEF_INT,
        cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
        minCTAs: NCCL_CONFIG_UNDEF_INT,
        maxCTAs: NCCL_CONFIG_UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: NCCL_CONFIG_UNDEF_INT,
        trafficClass: NCCL_CONFIG_UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: NCCL_CONFIG_UNDEF_INT,
        CTAPolicy: NCCL_CONFIG_UNDEF_INT,
        shrinkShare: NCCL_CONFIG_UNDEF_INT,
        nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
        nChannelsPerNetPeer: NCCL_CONFIG_UNDEF_INT,
        nvlinkCentricSched: NCCL_CONFIG_UNDEF_INT,
    }
}

fn init_config(mutate: impl Fn(&mut ncclConfig_t)) -> ncclResult_t {
    let mut cfg = config();
    mutate(&mut cfg);
    let mut c: ncclComm_t = std::ptr::null_mut();
    let id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: valid pointers; the config is checked before the id.
    unsafe { init::ncclCommInitRankConfig(&mut c, 2, id, 0, &mut cfg) }
}

#[allow(clippy::too_many_lines)]
fn cases(comm: ncclComm_t, old: ncclComm_t, gone: ncclComm_t) -> Vec<Case> {
    let null = std::ptr::null_mut::<c_void>();
    let host = Box::leak(Box::new([0u64; 64])).as_mut_ptr() as *mut c_void;
    let stream: cudaStream_t = std::ptr::null_mut();
    let huge = usize::MAX / 2;
    let garbage = 0x1000 as ncclComm_t;
    let mut out: c_int = 0;
    let outp = &mut out as *mut c_int;
    let valid_id = new_unique_id().unwrap().to_unique_id();
    // SAFETY: (all closures below) every pointer passed is NULL, garbage on purpose (only ever
    // compared against the registry), or valid for the call.
    unsafe {
        vec![
            case("GetVersion NULL", ncclInvalidArgument, "ncclGetVersion: version is NULL", || {
                version::ncclGetVersion(std::ptr::null_mut())
            }),
            case("GetUniqueId NULL", ncclInvalidArgument, "uniqueId is NULL", || {
                init::ncclGetUniqueId(std::ptr::null_mut())
            }),
            case("InitRank NULL comm", ncclInvalidArgument, "ncclCommInitRank: comm is NULL", move || {
                init::ncclCommInitRank(std::ptr::null_mut(), 2, valid_id, 0)
            }),
            case("InitRank nranks 0", ncclInvalidArgument, "nranks 0 must be at least 1", move || {
                let mut c = std::ptr::null_mut();
                init::ncclCommInitRank(&mut c, 0, valid_id, 0)
            }),
            case("InitRank rank = nranks", ncclInvalidArgument, "rank 2 is out of range for nranks 2", move || {
                let mut c = std::ptr::null_mut();
                init::ncclCommInitRank(&mut c, 2, valid_id, 2)
            }),
            case("InitRank rank -1", ncclInvalidArgument, "rank -1 is out of range", move || {
                let mut c = std::ptr::null_mut();
                init::ncclCommInitRank(&mut c, 2, valid_id, -1)
            }),
            case("InitRank garbage id", ncclInvalidArgument, "commId", || {
                let mut c = std::ptr::null_mut();
                init::ncclCommInitRank(&mut c, 2, ncclUniqueId { internal: [7; 128] }, 0)
            }),
            case("Config bad magic", ncclInvalidArgument, "config magic 0x1234", || init_config(|c| c.magic = 0x1234)),
            case("Config too small", ncclInvalidArgument, "config size 8 is too small", || init_config(|c| c.size = 8)),
            case("Config blocking 2", ncclInvalidArgument, "config.blocking = 2", || init_config(|c| c.blocking = 2)),
            case("Config minCTAs 0", ncclInvalidArgument, "config.minCTAs = 0", || init_config(|c| c.minCTAs = 0)),
            case("Config min > max", ncclInvalidArgument, "minCTAs = 8 is larger than config.maxCTAs = 2", || {
                init_config(|c| {
                    c.minCTAs = 8;
                    c.maxCTAs = 2
                })
            }),
            case("Config cgaClusterSize 9", ncclInvalidArgument, "cgaClusterSize = 9", || {
                init_config(|c| c.cgaClusterSize = 9)
            }),
            case("InitAll NULL", ncclInvalidArgument, "ncclCommInitAll: comm is NULL", || {
                init::ncclCommInitAll(std::ptr::null_mut(), 1, std::ptr::null())
            }),
            case("InitAll ndev 0", ncclInvalidArgument, "ndev 0 must be at least 1", || {
                let mut c = [std::ptr::null_mut(); 1];
                init::ncclCommInitAll(c.as_mut_ptr(), 0, std::ptr::null())
            }),
            case("InitAll bad device", ncclInvalidArgument, "invalid device -3", || {
                let mut c = [std::ptr::null_mut(); 2];
                init::ncclCommInitAll(c.as_mut_ptr(), 2, [0, -3].as_ptr())
            }),
            case("InitScalable nId 0", ncclInvalidArgument, "nId 0 must be at least 1", move || {
                let mut c = std::ptr::null_mut();
                let mut ids = [valid_id];
                init::ncclCommInitRankScalable(&mut c, 2, 0, 0, ids.as_mut_ptr(), std::ptr::null_mut())
            }),
            case("InitScalable NULL ids", ncclInvalidArgument, "commIds is NULL", || {
                let mut c = std::ptr::null_mut();
                init::ncclCommInitRankScalable(&mut c, 2, 0, 1, std::ptr::null_mut(), std::ptr::null_mut())
            }),
            case("Split NULL comm", ncclInvalidArgument, "ncclCommSplit: comm is NULL", || {
                let mut c = std::ptr::null_mut();
                init::ncclCommSplit(std::ptr::null_mut(), 0, 0, &mut c, std::ptr::null_mut())
            }),
            case("Split NULL newcomm", ncclInvalidArgument, "newcomm is NULL", move || {
                init::ncclCommSplit(comm, 0, 0, std::ptr::null_mut(), std::ptr::null_mut())
            }),
            case("Split color -2", ncclInvalidArgument, "color -2 must be non-negative", move || {
                let mut c = std::ptr::null_mut();
                init::ncclCommSplit(comm, -2, 0, &mut c, std::ptr::null_mut())
            }),
            case("Shrink bad flags", ncclInvalidArgument, "shrinkFlags 0x4", move || {
                let mut c = std::ptr::null_mut();
                init::ncclCommShrink(comm, std::ptr::null_mut(), 0, &mut c, std::ptr::null_mut(), 4)
            }),
            case(
                "Shrink rank out of range",
                ncclInvalidArgument,
                "excludeRanksList entry 5 is out of range",
                move || {
                    let mut c = std::ptr::null_mut();
                    let mut list = [5];
                    init::ncclCommShrink(comm, list.as_mut_ptr(), 1, &mut c, std::ptr::null_mut(), 0)
                },
            ),
            case("Shrink NULL list", ncclInvalidArgument, "excludeRanksList is NULL", move || {
                let mut c = std::ptr::null_mut();
                init::ncclCommShrink(comm, std::ptr::null_mut(), 1, &mut c, std::ptr::null_mut(), 0)
            }),
            case("Shrink excluding the caller", ncclInvalidUsage, "rank 0 is in excludeRanksList", move || {
                let mut c = std::ptr::null_mut();
                let mut list = [0];
                init::ncclCommShrink(comm, list.as_mut_ptr(), 1, &mut c, std::ptr::null_mut(), 0)
            }),
            case("Revoke bad flags", ncclInvalidArgument, "revokeFlags 0x1", move || init::ncclCommRevoke(comm, 1)),
            case("Revoke NULL comm", ncclInvalidArgument, "ncclCommRevoke: comm is NULL", move || {
                init::ncclCommRevoke(std::ptr::null_mut(), 0)
            }),
            case("Count NULL comm", ncclInvalidArgument, "ncclCommCount: comm is NULL", move || {
                query::ncclCommCount(std::ptr::null_mut(), outp)
            }),
            case("Count NULL out", ncclInvalidArgument, "count is NULL", move || {
                query::ncclCommCount(comm, std::ptr::null_mut())
            }),
            case(
                "Count garbage comm",
                ncclInvalidArgument,
                "is not a communicator created by this library",
                move || query::ncclCommCount(garbage, outp),
            ),
            case("Count destroyed comm", ncclInvalidUsage, "was already destroyed", move || {
                query::ncclCommCount(gone, outp)
            }),
            case("CuDevice NULL out", ncclInvalidArgument, "device is NULL", move || {
                query::ncclCommCuDevice(comm, std::ptr::null_mut())
            }),
            case("UserRank NULL out", ncclInvalidArgument, "rank is NULL", move || {
                query::ncclCommUserRank(comm, std::ptr::null_mut())
            }),
            case("AsyncError NULL out", ncclInvalidArgument, "asyncError is NULL", move || {
                query::ncclCommGetAsyncError(comm, std::ptr::null_mut())
            }),
            case("AllReduce NULL comm", ncclInvalidArgument, "ncclAllReduce: comm is NULL", move || {
                coll::ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, std::ptr::null_mut(), stream)
            }),
            case("AllReduce NULL sendbuff", ncclInvalidArgument, "sendbuff is NULL", move || {
                coll::ncclAllReduce(null, host, 4, ncclFloat32, ncclSum, comm, stream)
            }),
            case("AllReduce NULL recvbuff", ncclInvalidArgument, "recvbuff is NULL", move || {
                coll::ncclAllReduce(host, null, 4, ncclFloat32, ncclSum, comm, stream)
            }),
            case("AllReduce count overflow", ncclInvalidArgument, "overflows the addressable size", move || {
                coll::ncclAllReduce(host, host, huge, ncclFloat64, ncclSum, comm, stream)
            }),
            case("AllReduce dtype 12", ncclInvalidArgument, "datatype 12 is not a valid", move || {
                coll::ncclAllReduce(host, host, 4, 12, ncclSum, comm, stream)
            }),
            case("AllReduce dtype -1", ncclInvalidArgument, "datatype -1 is not a valid", move || {
                coll::ncclAllReduce(host, host, 4, -1, ncclSum, comm, stream)
            }),
            case("AllReduce op 5 unknown", ncclInvalidArgument, "op 5 is not a valid ncclRedOp_t", move || {
                coll::ncclAllReduce(host, host, 4, ncclFloat32, 5, comm, stream)
            }),
            case("AllReduce op -1", ncclInvalidArgument, "op -1 is not a valid", move || {
                coll::ncclAllReduce(host, host, 4, ncclFloat32, -1, comm, stream)
            }),
            case("AllReduce fp8 on sm80", ncclInvalidArgument, "needs compute capability 9.0", move || {
                coll::ncclAllReduce(host, host, 4, ncclFloat8e4m3, ncclSum, old, stream)
            }),
            case("AllReduce host memory", ncclInvalidArgument, "is not memory the GPU can access", move || {
                coll::ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, comm, stream)
            }),
            case(
                "Reduce root 2",
                ncclInvalidArgument,
                "root 2 is out of range (communicator has 2 ranks)",
                move || coll::ncclReduce(host, host, 4, ncclFloat32, ncclSum, 2, comm, stream),
            ),
            case("Reduce root -1", ncclInvalidArgument, "root -1 is out of range", move || {
                coll::ncclReduce(host, host, 4, ncclFloat32, ncclSum, -1, comm, stream)
            }),
            case("Broadcast NULL recvbuff", ncclInvalidArgument, "recvbuff is NULL", move || {
                coll::ncclBroadcast(host, null, 4, ncclInt8, 0, comm, stream)
            }),
            case("Bcast root 5", ncclInvalidArgument, "root 5 is out of range", move || {
                coll::ncclBcast(host, 4, ncclInt8, 5, comm, stream)
            }),
            case("AllGather overflow", ncclInvalidArgument, "sendcount", move || {
                coll::ncclAllGather(host, host, usize::MAX / 16, ncclFloat64, comm, stream)
            }),
            case("ReduceScatter NULL sendbuff", ncclInvalidArgument, "sendbuff is NULL", move || {
                coll::ncclReduceScatter(null, host, 4, ncclInt32, ncclMax, comm, stream)
            }),
            case("AlltoAll NULL recvbuff", ncclInvalidArgument, "recvbuff is NULL", move || {
                coll::ncclAlltoAll(host, null, 4, ncclInt32, comm, stream)
            }),
            case("Gather root 9", ncclInvalidArgument, "root 9 is out of range", move || {
                coll::ncclGather(host, host, 4, ncclInt32, 9, comm, stream)
            }),
            case("Scatter bad dtype", ncclInvalidArgument, "datatype 40", move || {
                coll::ncclScatter(host, host, 4, 40, 0, comm, stream)
            }),
            case("Send peer 2", ncclInvalidArgument, "peer 2 is out of range", move || {
                coll::ncclSend(host, 4, ncclUint8, 2, comm, stream)
            }),
            case("Recv peer -1", ncclInvalidArgument, "peer -1 is out of range", move || {
                coll::ncclRecv(host, 4, ncclUint8, -1, comm, stream)
            }),
            case("Send NULL buffer", ncclInvalidArgument, "sendbuff is NULL", move || {
                coll::ncclSend(null, 4, ncclUint8, 1, comm, stream)
            }),
            case("PreMulSum NULL op", ncclInvalidArgument, "op is NULL", move || {
                coll::ncclRedOpCreatePreMulSum(std::ptr::null_mut(), host, ncclFloat32, ncclScalarHostImmediate, comm)
            }),
            case("PreMulSum NULL scalar", ncclInvalidArgument, "scalar is NULL", move || {
                let mut op = 0;
                coll::ncclRedOpCreatePreMulSum(&mut op, null, ncclFloat32, ncclScalarHostImmediate, comm)
            }),
            case("PreMulSum bad residence", ncclInvalidArgument, "residence 7", move || {
                let mut op = 0;
                coll::ncclRedOpCreatePreMulSum(&mut op, host, ncclFloat32, 7, comm)
            }),
            case(
                "PreMulSum wrong dtype use",
                ncclInvalidArgument,
                "created for ncclFloat32 but is used with ncclInt32",
                move || {
                    let mut op = 0;
                    let s = 2.0f32;
                    assert_eq!(
                        coll::ncclRedOpCreatePreMulSum(
                            &mut op,
                            &s as *const f32 as *mut c_void,
                            ncclFloat32,
                            ncclScalarHostImmediate,
                            comm
                        ),
                        ncclSuccess
                    );
                    let r = coll::ncclAllReduce(host, host, 4, ncclInt32, op, comm, stream);
                    assert_eq!(coll::ncclRedOpDestroy(op, comm), ncclSuccess);
                    r
                },
            ),
            case("RedOpDestroy builtin", ncclInvalidArgument, "built-in operator", move || {
                coll::ncclRedOpDestroy(ncclSum, comm)
            }),
            case("RedOpDestroy unknown", ncclInvalidArgument, "op 17 is not a user operator", move || {
                coll::ncclRedOpDestroy(17, comm)
            }),
            case(
                "GroupEnd without start",
                ncclInvalidUsage,
                "ncclGroupEnd called without a matching ncclGroupStart",
                || group::ncclGroupEnd(),
            ),
            case("Error inside group reported at end", ncclInvalidArgument, "inside this group failed", move || {
                assert_eq!(group::ncclGroupStart(), ncclSuccess);
                assert_eq!(coll::ncclAllReduce(host, host, 4, 99, ncclSum, comm, stream), ncclInvalidArgument);
                group::ncclGroupEnd()
            }),
            case("SimulateEnd NULL", ncclInvalidArgument, "simInfo is NULL", || {
                group::ncclGroupSimulateEnd(std::ptr::null_mut())
            }),
            case("SimulateEnd bad magic", ncclInvalidArgument, "simInfo magic 0x0", || {
                let mut s = ncclSimInfo_t {
                    size: std::mem::size_of::<ncclSimInfo_t>(),
                    magic: 0,
                    version: 0,
                    estimatedTime: -1.0,
                };
                group::ncclGroupSimulateEnd(&mut s)
            }),
            case("MemAlloc NULL", ncclInvalidArgument, "ptr is NULL", || mem::ncclMemAlloc(std::ptr::null_mut(), 64)),
            case("MemAlloc size 0", ncclInvalidArgument, "size is 0", || {
                let mut p = std::ptr::null_mut();
                mem::ncclMemAlloc(&mut p, 0)
            }),
            case("MemFree foreign", ncclInvalidArgument, "was not allocated by ncclMemAlloc", move || {
                mem::ncclMemFree(host)
            }),
            case("Register NULL buff", ncclInvalidArgument, "buff is NULL", move || {
                let mut h = std::ptr::null_mut();
                mem::ncclCommRegister(comm, null, 64, &mut h)
            }),
            case("Register NULL handle", ncclInvalidArgument, "handle is NULL", move || {
                mem::ncclCommRegister(comm, host, 64, std::ptr::null_mut())
            }),
            case(
                "Deregister foreign handle",
                ncclInvalidArgument,
                "is not a registration of this communicator",
                move || mem::ncclCommDeregister(comm, host),
            ),
            case("WindowRegister bad flags", ncclInvalidArgument, "winFlags 0x8", move || {
                let mut w = std::ptr::null_mut();
                mem::ncclCommWindowRegister(comm, host, 64, &mut w, 8)
            }),
            case("WindowRegister host memory", ncclInvalidArgument, "is not device-accessible memory", move || {
                let mut w = std::ptr::null_mut();
                mem::ncclCommWindowRegister(comm, host, 64, &mut w, 0)
            }),
            case(
                "WindowDeregister foreign window",
                ncclInvalidArgument,
                "is not a window of this communicator",
                move || mem::ncclCommWindowDeregister(comm, host),
            ),
            case("DevCommCreate NULL reqs", ncclInvalidArgument, "reqs is NULL", move || {
                let mut dc = ncclDevComm::default();
                device_api::ncclDevCommCreate(comm, std::ptr::null(), &mut dc)
            }),
            case("DevCommCreate NULL outDevComm", ncclInvalidArgument, "outDevComm is NULL", move || {
                device_api::ncclDevCommCreate(comm, &ncclDevCommRequirements::default(), std::ptr::null_mut())
            }),
            dev_comm_case(
                comm,
                "DevCommCreate ginForceEnable",
                ncclInvalidUsage,
                "reqs->ginForceEnable asks for GIN",
                |r| r.ginForceEnable = true,
            ),
            dev_comm_case(
                comm,
                "DevCommCreate ginSignalCount",
                ncclInvalidUsage,
                "reqs->ginSignalCount 2 asks for GIN",
                |r| r.ginSignalCount = 2,
            ),
            dev_comm_case(
                comm,
                "DevCommCreate ginCounterCount",
                ncclInvalidUsage,
                "reqs->ginCounterCount 1 asks for GIN",
                |r| r.ginCounterCount = 1,
            ),
            dev_comm_case(
                comm,
                "DevCommCreate lsaMultimem",
                ncclInvalidUsage,
                "reqs->lsaMultimem asks for multimem",
                |r| r.lsaMultimem = true,
            ),
            dev_comm_case(
                comm,
                "DevCommCreate negative count",
                ncclInvalidArgument,
                "reqs->lsaBarrierCount -1 is negative",
                |r| r.lsaBarrierCount = -1,
            ),
            dev_comm_case(comm, "DevCommCreate LL all-to-all", ncclInvalidUsage, "is not implemented yet", |r| {
                r.lsaLLA2ABlockCount = 1
            }),
            case("DevCommCreate team multimem", ncclInvalidUsage, "team requirement 0 asks for multimem", move || {
                let mut team = ncclTeamRequirements {
                    team: ncclTeam_t { nRanks: 2, rank: 0, stride: 1 },
                    multimem: true,
                    ..Default::default()
                };
                let reqs = ncclDevCommRequirements { teamRequirementsList: &mut team, ..Default::default() };
                let mut dc = ncclDevComm::default();
                device_api::ncclDevCommCreate(comm, &reqs, &mut dc)
            }),
            case("DevCommCreate foreign team", ncclInvalidArgument, "not in this communicator's world", move || {
                let mut team =
                    ncclTeamRequirements { team: ncclTeam_t { nRanks: 4, rank: 0, stride: 1 }, ..Default::default() };
                let reqs = ncclDevCommRequirements { teamRequirementsList: &mut team, ..Default::default() };
                let mut dc = ncclDevComm::default();
                device_api::ncclDevCommCreate(comm, &reqs, &mut dc)
            }),
            case(
                "DevCommCreate resource GIN signals",
                ncclInvalidUsage,
                "resource requirement 1 (ginSignalCount 3",
                move || {
                    let mut second = ncclDevResourceRequirements { ginSignalCount: 3, ..Default::default() };
                    let mut first =
                        ncclDevResourceRequirements { bufferSize: 64, next: &mut second, ..Default::default() };
                    let reqs = ncclDevCommRequirements { resourceRequirementsList: &mut first, ..Default::default() };
                    let mut dc = ncclDevComm::default();
                    device_api::ncclDevCommCreate(comm, &reqs, &mut dc)
                },
            ),
            case("DevCommCreate resource cycle", ncclInvalidArgument, "has more than 65536 entries", move || {
                let mut r = ncclDevResourceRequirements { bufferSize: 64, ..Default::default() };
                r.next = &mut r;
                let reqs = ncclDevCommRequirements { resourceRequirementsList: &mut r, ..Default::default() };
                let mut dc = ncclDevComm::default();
                device_api::ncclDevCommCreate(comm, &reqs, &mut dc)
            }),
            case("DevCommDestroy unknown", ncclInvalidArgument, "is not a device communicator of this", move || {
                device_api::ncclDevCommDestroy(comm, &ncclDevComm::default())
            }),
            case(
                "WindowRegister symmetric host memory",
                ncclInvalidArgument,
                "is not device-accessible memory",
                move || {
                    let mut w = std::ptr::null_mut();
                    mem::ncclCommWindowRegister(comm, host, 64, &mut w, 1)
                },
            ),
            case("LsaBarrier bad count", ncclInvalidArgument, "nBarriers 0", move || {
                let (mut h, mut r) = (ncclLsaBarrierHandle::default(), ncclDevResourceRequirements::default());
                device_api::ncclLsaBarrierCreateRequirement(
                    ncclTeam_t { nRanks: 2, rank: 0, stride: 1 },
                    0,
                    &mut h,
                    &mut r,
                )
            }),
            case("GinBarrier refused", ncclInvalidUsage, "asks for GIN", move || {
                let (mut h, mut r) = (ncclGinBarrierHandle::default(), ncclDevResourceRequirements::default());
                device_api::ncclGinBarrierCreateRequirement(
                    comm,
                    ncclTeam_t { nRanks: 2, rank: 0, stride: 1 },
                    1,
                    &mut h,
                    &mut r,
                )
            }),
        ]
    }
}

/// A ncclDevCommCreate case whose requirements are the defaults changed by `set`.
fn dev_comm_case(
    comm: ncclComm_t,
    name: &'static str,
    code: ncclResult_t,
    text: &'static str,
    set: fn(&mut ncclDevCommRequirements),
) -> Case {
    case(name, code, text, move || {
        let mut reqs = ncclDevCommRequirements::default();
        set(&mut reqs);
        let mut dc = ncclDevComm::default();
        // SAFETY: a valid handle and live structs.
        unsafe { device_api::ncclDevCommCreate(comm, &reqs, &mut dc) }
    })
}

#[test]
fn lsa_barrier_requirement_sizes_the_buffer_and_points_at_the_handle() {
    let (mut h, mut r) = (ncclLsaBarrierHandle { bufHandle: 7, nBarriers: 0 }, ncclDevResourceRequirements::default());
    // SAFETY: live out structs.
    let rc = unsafe {
        device_api::ncclLsaBarrierCreateRequirement(ncclTeam_t { nRanks: 4, rank: 1, stride: 1 }, 3, &mut h, &mut r)
    };
    assert_eq!(rc, ncclSuccess);
    assert_eq!((h.bufHandle, h.nBarriers), (0, 3));
    assert_eq!(r.bufferSize, (3 * 3 + 3 * 4) * 4);
    assert_eq!(r.outBufferHandle, std::ptr::addr_of_mut!(h.bufHandle));
    assert!(r.next.is_null() && r.ginSignalCount == 0 && r.ginCounterCount == 0);
}

#[test]
fn every_export_rejects_bad_input() {
    let _l = crate::debug::LAST_ERROR_TEST_LOCK.lock();
    let comms = fake_comms(2, 9);
    let old = fake_comms(1, 8)[0];
    let gone = fake_comms(1, 9)[0];
    // SAFETY: destroying a valid handle; later uses must be reported, not dereferenced.
    assert_eq!(unsafe { init::ncclCommDestroy(gone) }, ncclSuccess);
    let mut failures = Vec::new();
    for c in cases(comms[0], old, gone) {
        crate::debug::set_last_error("");
        let code = (c.call)();
        let text = last_error();
        if code != c.code || !text.contains(c.text) {
            failures.push(format!("{}: got {code:?} {text:?}, want {:?} containing {:?}", c.name, c.code, c.text));
        }
    }
    assert!(failures.is_empty(), "{} case(s) failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn operations_needing_a_rank_that_left_fail_naming_it() {
    let _l = crate::debug::LAST_ERROR_TEST_LOCK.lock();
    let comms = fake_comms(3, 9);
    let c = registry::lookup(comms[0], "comm").unwrap().ready().unwrap();
    // Its goodbye said it took part in no collective.
    c.note_left(2, "rank 2 (host h, pid 7)", Some(0));
    let (buf, stream) = (0x1000 as *mut c_void, std::ptr::null_mut());
    // SAFETY: a valid handle; the buffers are never reached (the call fails before).
    unsafe {
        assert_eq!(coll::ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comms[0], stream), ncclRemoteError);
        assert!(last_error().contains("rank 2 (host h, pid 7) left this communicator"), "{}", last_error());
        // Said it took part in one: this rank's first collective goes on (its fake buffer fails it).
        c.note_left(2, "rank 2 (host h, pid 7)", Some(1));
        assert_eq!(coll::ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comms[0], stream), ncclInvalidArgument);
        assert!(last_error().contains("sendbuff"), "{}", last_error());
        c.called_coll();
        assert_eq!(coll::ncclBroadcast(buf, buf, 4, ncclFloat32, 0, comms[0], stream), ncclRemoteError);
        assert!(last_error().contains("rank 2 (host h, pid 7) left"), "{}", last_error());
        // A goodbye that said nothing: every later collective is refused.
        c.note_left(2, "rank 2 (host h, pid 7)", None);
        assert!(c.check_peers_coll().is_err());
        assert_eq!(coll::ncclSend(buf, 4, ncclFloat32, 2, comms[0], stream), ncclRemoteError);
        assert!(last_error().contains("rank 2 (host h, pid 7) left"), "{}", last_error());
        // A peer still there is not refused for that (the fake buffer is, later).
        assert_eq!(coll::ncclSend(buf, 4, ncclFloat32, 1, comms[0], stream), ncclInvalidArgument);
        assert!(last_error().contains("sendbuff"), "{}", last_error());
        for &c in &comms {
            assert_eq!(init::ncclCommDestroy(c), ncclSuccess);
        }
    }
}

#[test]
fn queries_and_teams_answer_on_a_good_comm() {
    let comms = fake_comms(2, 9);
    for (r, &c) in comms.iter().enumerate() {
        let (mut n, mut rank) = (0, -1);
        let mut err = ncclInternalError;
        // SAFETY: valid handles and out-pointers.
        unsafe {
            assert_eq!(query::ncclCommCount(c, &mut n), ncclSuccess);
            assert_eq!(query::ncclCommUserRank(c, &mut rank), ncclSuccess);
            assert_eq!(query::ncclCommGetAsyncError(c, &mut err), ncclSuccess);
            let world = device_api::ncclTeamWorld(c);
            assert_eq!(world, ncclTeam_t { nRanks: 2, rank: r as c_int, stride: 1 });
            assert_eq!(device_api::ncclTeamRankToWorld(c, world, 1), 1);
            assert_eq!(device_api::ncclTeamRankToWorld(c, world, 2), -1);
            assert_eq!(device_api::ncclTeamRail(c).nRanks, 1);
            let lsa = device_api::ncclTeamLsa(c);
            assert_eq!(lsa, ncclTeam_t { nRanks: 2, rank: r as c_int, stride: 1 });
            assert_eq!(device_api::ncclTeamRankToLsa(c, lsa, 1), 1);
            assert_eq!(device_api::ncclTeamRankToLsa(c, lsa, 2), -1);
        }
        assert_eq!((n, rank, err), (2, r as c_int, ncclSuccess));
    }
    // SAFETY: NULL is documented as accepted.
    unsafe {
        assert_eq!(init::ncclCommDestroy(std::ptr::null_mut()), ncclSuccess);
        assert_eq!(init::ncclCommAbort(std::ptr::null_mut()), ncclSuccess);
        assert_eq!(device_api::ncclTeamWorld(std::ptr::null_mut()).nRanks, 0);
    }
    for c in comms {
        // SAFETY: each handle destroyed once.
        assert_eq!(unsafe { init::ncclCommDestroy(c) }, ncclSuccess);
    }
}

#[test]
fn error_strings_cover_every_code() {
    for code in 0..8 {
        // SAFETY: returns a static string for any int.
        let s = unsafe { CStr::from_ptr(version::ncclGetErrorString(code)) }.to_string_lossy().into_owned();
        assert!(!s.is_empty() && s != "unknown result code", "code {code}");
    }
    // SAFETY: as above.
    let s = unsafe { CStr::from_ptr(version::ncclGetErrorString(99)) };
    assert_eq!(s.to_str().unwrap(), "unknown result code");
}

#[test]
fn a_revoked_comm_allows_only_queries_shrink_abort_and_destroy() {
    let _l = crate::debug::LAST_ERROR_TEST_LOCK.lock();
    let comms = fake_comms(2, 9);
    let (c, host, stream) = (comms[0], 0x1000 as *mut c_void, std::ptr::null_mut());
    // SAFETY: valid handles and out-pointers throughout; the buffers are never reached.
    unsafe {
        assert_eq!(init::ncclCommRevoke(c, 0), ncclSuccess);
        assert_eq!(coll::ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, c, stream), ncclInvalidUsage);
        assert!(last_error().contains("was revoked (ncclCommRevoke)"), "{}", last_error());
        assert_eq!(init::ncclCommFinalize(c), ncclInvalidUsage);
        let (mut n, mut err) = (0, ncclInternalError);
        assert_eq!(query::ncclCommCount(c, &mut n), ncclSuccess);
        assert_eq!(n, 2);
        assert_eq!(query::ncclCommGetAsyncError(c, &mut err), ncclSuccess);
        assert_eq!(err, ncclSuccess, "a revoke is not an error");
        assert_eq!(init::ncclCommRevoke(c, 0), ncclSuccess, "revoking twice is harmless");
        for &c in &comms {
            assert_eq!(init::ncclCommDestroy(c), ncclSuccess);
        }
    }
}

#[test]
fn the_config_names_the_net_and_its_traffic_class() {
    let net = c"IB";
    let name = c"trainer";
    let mut cfg = config();
    cfg.netName = net.as_ptr();
    cfg.trafficClass = 106;
    cfg.commName = name.as_ptr();
    // SAFETY: a complete config with live strings.
    let read = unsafe { init::read_config(&cfg) }.expect("a valid config");
    assert_eq!(read.net.net_name.as_deref(), Some("IB"));
    assert_eq!(read.net.traffic_class, Some(106));
    assert_eq!(read.name.as_deref(), Some("trainer"));
    // A caller's older, smaller struct that ends before netName: nothing past its size is read.
    cfg.size = std::mem::offset_of!(ncclConfig_t, netName);
    // SAFETY: as above; fewer fields are read.
    let old = unsafe { init::read_config(&cfg) }.expect("a valid older config");
    assert_eq!((old.net.net_name, old.net.traffic_class, old.name), (None, None, None));
    // Send/recv channels over NET are read; zero and more than the channels there are are refused,
    // as NCCL refuses them (NCCL_NCHANNELS_PER_NET_PEER, when set, would replace the value).
    cfg.size = std::mem::size_of::<ncclConfig_t>();
    cfg.nChannelsPerNetPeer = 2;
    // SAFETY: as above.
    let two = unsafe { init::read_config(&cfg) }.expect("a valid config");
    if std::env::var_os("NCCL_NCHANNELS_PER_NET_PEER").is_none() {
        assert_eq!(two.net_peer_channels, Some(2));
    }
    for bad in [0, -2, 65] {
        cfg.nChannelsPerNetPeer = bad;
        // SAFETY: as above.
        let e = unsafe { init::read_config(&cfg) }.unwrap_err().to_string();
        assert!(e.contains("nChannelsPerNetPeer"), "{bad}: {e}");
    }
    // Unset stays unset: NCCL_NET and the plugin's own class then apply.
    // SAFETY: as above.
    let unset = unsafe { init::read_config(&config()) }.expect("a valid config");
    assert_eq!((unset.net.net_name, unset.net.traffic_class), (None, None));
}
