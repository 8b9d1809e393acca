//! `#[repr(C)]` mirrors of `net_plugin_abi.h`: the structs and function tables of NCCL net
//! plugins v8 to v11. The header is the one definition; `tests/net_abi.rs` compares every size
//! and offset here with a C compile of it. Return values are `c_int`, not `ncclResult_t`: a
//! plugin may return any integer, and an out-of-range Rust enum would be undefined behaviour.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_ulong, c_void};

pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
pub const NCCL_NET_MAX_REQUESTS: usize = 32;
pub const NCCL_NET_MAX_DEVS_PER_NIC: usize = 4;
pub const NCCL_PTR_HOST: c_int = 0x1;
pub const NCCL_PTR_CUDA: c_int = 0x2;
pub const NCCL_PTR_DMABUF: c_int = 0x4;
pub const NCCL_NET_TRAFFIC_CLASS_UNDEF: c_int = -1;
/// What NCCL reports as maxP2pBytes for plugins older than v9 (1 GiB).
pub const MAX_NET_SIZE: usize = 1 << 30;
/// What NCCL reports as maxCollBytes for plugins older than v9 (512 MiB).
pub const MAX_COLLNET_SIZE: usize = 512 << 20;

type Res = c_int;

/// `ncclDebugLogger_t`: printf-style, variadic.
pub type ncclDebugLogger_t =
    unsafe extern "C" fn(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, fmt: *const c_char, ...);
/// `ncclProfilerCallback_t`.
pub type ncclProfilerCallback_t = unsafe extern "C" fn(
    e_handle: *mut *mut c_void,
    kind: c_int,
    p_handle: *mut c_void,
    plugin_id: i64,
    ext: *mut c_void,
) -> Res;

/// `ncclNetDeviceHandle_v8_t` .. `_v11_t` (one layout): device offload, which we never request.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclNetDeviceHandle_v8_t {
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needsProxyProgress: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ncclNetVDeviceProps_v9_t {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ncclNetCommConfig_v10_t {
    pub trafficClass: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclNetProperties_v8_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
}

/// The layout of v9 and v10.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclNetProperties_v9_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v9_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclNetProperties_v11_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v9_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
    pub maxMultiRequestSize: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ncclNetCommAttr_v11_t {
    pub maxConcurrentPeers: i32,
    pub minConcurrentPeers: i32,
    pub maxFlowsPerPeer: i32,
    pub minFlowsPerPeer: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ncclNetAttr_v11_t {
    pub sendCommAttr: ncclNetCommAttr_v11_t,
    pub recvCommAttr: ncclNetCommAttr_v11_t,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

type DevHandle = *mut *mut ncclNetDeviceHandle_v8_t;
type P = *mut c_void;
type PP = *mut *mut c_void;
type F<T> = Option<T>;

/// `ncclNet_v8_t`: sizes are `int`, no physical handles.
#[repr(C)]
pub struct ncclNet_v8_t {
    pub name: *const c_char,
    pub init: F<unsafe extern "C" fn(ncclDebugLogger_t) -> Res>,
    pub devices: F<unsafe extern "C" fn(*mut c_int) -> Res>,
    pub getProperties: F<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v8_t) -> Res>,
    pub listen: F<unsafe extern "C" fn(c_int, P, PP) -> Res>,
    pub connect: F<unsafe extern "C" fn(c_int, P, PP, DevHandle) -> Res>,
    pub accept: F<unsafe extern "C" fn(P, PP, DevHandle) -> Res>,
    pub regMr: F<unsafe extern "C" fn(P, P, usize, c_int, PP) -> Res>,
    pub regMrDmaBuf: F<unsafe extern "C" fn(P, P, usize, c_int, u64, c_int, PP) -> Res>,
    pub deregMr: F<unsafe extern "C" fn(P, P) -> Res>,
    pub isend: F<unsafe extern "C" fn(P, P, c_int, c_int, P, PP) -> Res>,
    pub irecv: F<unsafe extern "C" fn(P, c_int, PP, *mut c_int, *mut c_int, PP, PP) -> Res>,
    pub iflush: F<unsafe extern "C" fn(P, c_int, PP, *mut c_int, PP, PP) -> Res>,
    pub test: F<unsafe extern "C" fn(P, *mut c_int, *mut c_int) -> Res>,
    pub closeSend: F<unsafe extern "C" fn(P) -> Res>,
    pub closeRecv: F<unsafe extern "C" fn(P) -> Res>,
    pub closeListen: F<unsafe extern "C" fn(P) -> Res>,
    pub getDeviceMr: F<unsafe extern "C" fn(P, P, PP) -> Res>,
    pub irecvConsumed: F<unsafe extern "C" fn(P, c_int, P) -> Res>,
}

/// `ncclNet_v9_t`: `size_t` sizes, `makeVDevice`.
#[repr(C)]
pub struct ncclNet_v9_t {
    pub name: *const c_char,
    pub init: F<unsafe extern "C" fn(ncclDebugLogger_t) -> Res>,
    pub devices: F<unsafe extern "C" fn(*mut c_int) -> Res>,
    pub getProperties: F<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v9_t) -> Res>,
    pub listen: F<unsafe extern "C" fn(c_int, P, PP) -> Res>,
    pub connect: F<unsafe extern "C" fn(c_int, P, PP, DevHandle) -> Res>,
    pub accept: F<unsafe extern "C" fn(P, PP, DevHandle) -> Res>,
    pub regMr: F<unsafe extern "C" fn(P, P, usize, c_int, PP) -> Res>,
    pub regMrDmaBuf: F<unsafe extern "C" fn(P, P, usize, c_int, u64, c_int, PP) -> Res>,
    pub deregMr: F<unsafe extern "C" fn(P, P) -> Res>,
    pub isend: F<unsafe extern "C" fn(P, P, usize, c_int, P, PP) -> Res>,
    pub irecv: F<unsafe extern "C" fn(P, c_int, PP, *mut usize, *mut c_int, PP, PP) -> Res>,
    pub iflush: F<unsafe extern "C" fn(P, c_int, PP, *mut c_int, PP, PP) -> Res>,
    pub test: F<unsafe extern "C" fn(P, *mut c_int, *mut c_int) -> Res>,
    pub closeSend: F<unsafe extern "C" fn(P) -> Res>,
    pub closeRecv: F<unsafe extern "C" fn(P) -> Res>,
    pub closeListen: F<unsafe extern "C" fn(P) -> Res>,
    pub getDeviceMr: F<unsafe extern "C" fn(P, P, PP) -> Res>,
    pub irecvConsumed: F<unsafe extern "C" fn(P, c_int, P) -> Res>,
    pub makeVDevice: F<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> Res>,
}

/// `ncclNet_v10_t`: a profiler callback, physical handles, a config on connect.
#[repr(C)]
pub struct ncclNet_v10_t {
    pub name: *const c_char,
    pub init: F<unsafe extern "C" fn(ncclDebugLogger_t, ncclProfilerCallback_t) -> Res>,
    pub devices: F<unsafe extern "C" fn(*mut c_int) -> Res>,
    pub getProperties: F<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v9_t) -> Res>,
    pub listen: F<unsafe extern "C" fn(c_int, P, PP) -> Res>,
    pub connect: F<unsafe extern "C" fn(c_int, *mut ncclNetCommConfig_v10_t, P, PP, DevHandle) -> Res>,
    pub accept: F<unsafe extern "C" fn(P, PP, DevHandle) -> Res>,
    pub regMr: F<unsafe extern "C" fn(P, P, usize, c_int, PP) -> Res>,
    pub regMrDmaBuf: F<unsafe extern "C" fn(P, P, usize, c_int, u64, c_int, PP) -> Res>,
    pub deregMr: F<unsafe extern "C" fn(P, P) -> Res>,
    pub isend: F<unsafe extern "C" fn(P, P, usize, c_int, P, P, PP) -> Res>,
    pub irecv: F<unsafe extern "C" fn(P, c_int, PP, *mut usize, *mut c_int, PP, PP, PP) -> Res>,
    pub iflush: F<unsafe extern "C" fn(P, c_int, PP, *mut c_int, PP, PP) -> Res>,
    pub test: F<unsafe extern "C" fn(P, *mut c_int, *mut c_int) -> Res>,
    pub closeSend: F<unsafe extern "C" fn(P) -> Res>,
    pub closeRecv: F<unsafe extern "C" fn(P) -> Res>,
    pub closeListen: F<unsafe extern "C" fn(P) -> Res>,
    pub getDeviceMr: F<unsafe extern "C" fn(P, P, PP) -> Res>,
    pub irecvConsumed: F<unsafe extern "C" fn(P, c_int, P) -> Res>,
    pub makeVDevice: F<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> Res>,
}

/// `ncclNet_v11_t`: a per-communicator context from `init`, `finalize`, `setNetAttr`.
#[repr(C)]
pub struct ncclNet_v11_t {
    pub name: *const c_char,
    pub init: F<
        unsafe extern "C" fn(PP, u64, *mut ncclNetCommConfig_v10_t, ncclDebugLogger_t, ncclProfilerCallback_t) -> Res,
    >,
    pub devices: F<unsafe extern "C" fn(*mut c_int) -> Res>,
    pub getProperties: F<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v11_t) -> Res>,
    pub listen: F<unsafe extern "C" fn(P, c_int, P, PP) -> Res>,
    pub connect: F<unsafe extern "C" fn(P, c_int, P, PP, DevHandle) -> Res>,
    pub accept: F<unsafe extern "C" fn(P, PP, DevHandle) -> Res>,
    pub regMr: F<unsafe extern "C" fn(P, P, usize, c_int, PP) -> Res>,
    pub regMrDmaBuf: F<unsafe extern "C" fn(P, P, usize, c_int, u64, c_int, PP) -> Res>,
    pub deregMr: F<unsafe extern "C" fn(P, P) -> Res>,
    pub isend: F<unsafe extern "C" fn(P, P, usize, c_int, P, P, PP) -> Res>,
    pub irecv: F<unsafe extern "C" fn(P, c_int, PP, *mut usize, *mut c_int, PP, PP, PP) -> Res>,
    pub iflush: F<unsafe extern "C" fn(P, c_int, PP, *mut c_int, PP, PP) -> Res>,
    pub test: F<unsafe extern "C" fn(P, *mut c_int, *mut c_int) -> Res>,
    pub closeSend: F<unsafe extern "C" fn(P) -> Res>,
    pub closeRecv: F<unsafe extern "C" fn(P) -> Res>,
    pub closeListen: F<unsafe extern "C" fn(P) -> Res>,
    pub getDeviceMr: F<unsafe extern "C" fn(P, P, PP) -> Res>,
    pub irecvConsumed: F<unsafe extern "C" fn(P, c_int, P) -> Res>,
    pub makeVDevice: F<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> Res>,
    pub finalize: F<unsafe extern "C" fn(P) -> Res>,
    pub setNetAttr: F<unsafe extern "C" fn(P, *mut ncclNetAttr_v11_t) -> Res>,
}

/// Every size and field offset above, by C name, for the layout test against the header.
pub fn layout() -> Vec<(String, usize)> {
    use std::mem::{offset_of, size_of};
    let mut v = Vec::new();
    macro_rules! rec {
        ($t:ident: $($f:ident),*) => {
            v.push((format!("sizeof {}", stringify!($t)), size_of::<$t>()));
            $(v.push((format!("{}.{}", stringify!($t), stringify!($f)), offset_of!($t, $f)));)*
        };
    }
    rec!(ncclNetDeviceHandle_v8_t: netDeviceType, netDeviceVersion, handle, size, needsProxyProgress);
    rec!(ncclNetVDeviceProps_v9_t: ndevs, devs);
    rec!(ncclNetCommConfig_v10_t: trafficClass);
    rec!(ncclNetProperties_v8_t: name, pciPath, guid, ptrSupport, regIsGlobal, speed, port, latency, maxComms,
         maxRecvs, netDeviceType, netDeviceVersion);
    rec!(ncclNetProperties_v9_t: name, pciPath, guid, ptrSupport, regIsGlobal, forceFlush, speed, port, latency,
         maxComms, maxRecvs, netDeviceType, netDeviceVersion, vProps, maxP2pBytes, maxCollBytes);
    rec!(ncclNetProperties_v11_t: name, pciPath, guid, ptrSupport, regIsGlobal, forceFlush, speed, port, latency,
         maxComms, maxRecvs, netDeviceType, netDeviceVersion, vProps, maxP2pBytes, maxCollBytes, maxMultiRequestSize);
    rec!(ncclNetCommAttr_v11_t: maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer);
    rec!(ncclNetAttr_v11_t: sendCommAttr, recvCommAttr, op, algo, proto);
    rec!(ncclNet_v8_t: name, init, devices, getProperties, listen, connect, accept, regMr, regMrDmaBuf, deregMr,
         isend, irecv, iflush, test, closeSend, closeRecv, closeListen, getDeviceMr, irecvConsumed);
    rec!(ncclNet_v9_t: name, init, devices, getProperties, listen, connect, accept, regMr, regMrDmaBuf, deregMr,
         isend, irecv, iflush, test, closeSend, closeRecv, closeListen, getDeviceMr, irecvConsumed, makeVDevice);
    rec!(ncclNet_v10_t: name, init, devices, getProperties, listen, connect, accept, regMr, regMrDmaBuf, deregMr,
         isend, irecv, iflush, test, closeSend, closeRecv, closeListen, getDeviceMr, irecvConsumed, makeVDevice);
    rec!(ncclNet_v11_t: name, init, devices, getProperties, listen, connect, accept, regMr, regMrDmaBuf, deregMr,
         isend, irecv, iflush, test, closeSend, closeRecv, closeListen, getDeviceMr, irecvConsumed, makeVDevice,
         finalize, setNetAttr);
    v
}
