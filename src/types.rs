//! The C ABI types of NCCL 2.28.9's `nccl.h`, laid out exactly as NVIDIA's header does.
//!
//! Enums that the caller passes in (`ncclDataType_t`, `ncclRedOp_t`, ...) are plain `c_int`s
//! here: a C caller may pass any integer, and an out-of-range value in a Rust enum would be
//! undefined behaviour before we could reject it. Their C `typedef enum`s live in
//! `cbindgen.toml` and the ABI test checks both against NVIDIA's header.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// The status every NCCL call returns.
// (Only ever produced by the library, so a Rust enum is safe here.)
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ncclResult_t {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8,
}

/// An `ncclResult_t` coming *in* from C (ncclGetErrorString): any int is possible there.
/// cbindgen:ignore
pub type ncclResultCode = c_int;
/// cbindgen:ignore
pub type ncclDataType_t = c_int;
/// cbindgen:ignore
pub type ncclRedOp_t = c_int;
/// cbindgen:ignore
pub type ncclScalarResidence_t = c_int;
/// The CUDA runtime's stream handle (`CUstream` in the driver API); declared by `cuda_runtime.h`.
/// cbindgen:ignore
pub type cudaStream_t = *mut c_void;

pub const NCCL_MAJOR: c_int = 2;
pub const NCCL_MINOR: c_int = 28;
pub const NCCL_PATCH: c_int = 9;
/// `NCCL_VERSION_CODE`, what `ncclGetVersion` reports and PyTorch keys features on.
pub const NCCL_VERSION_CODE: c_int = NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH;
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
pub const NCCL_CONFIG_MAGIC: c_uint = 0xcafebeef;
pub const NCCL_SIM_INFO_MAGIC: c_uint = 0x74685283;
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// ncclCommShrink flag: stop the parent's ongoing operations before shrinking.
pub const NCCL_SHRINK_ABORT: c_int = 0x01;

pub const ncclInt8: ncclDataType_t = 0;
pub const ncclUint8: ncclDataType_t = 1;
pub const ncclInt32: ncclDataType_t = 2;
pub const ncclUint32: ncclDataType_t = 3;
pub const ncclInt64: ncclDataType_t = 4;
pub const ncclUint64: ncclDataType_t = 5;
pub const ncclFloat16: ncclDataType_t = 6;
pub const ncclFloat32: ncclDataType_t = 7;
pub const ncclFloat64: ncclDataType_t = 8;
pub const ncclBfloat16: ncclDataType_t = 9;
pub const ncclFloat8e4m3: ncclDataType_t = 10;
pub const ncclFloat8e5m2: ncclDataType_t = 11;
pub const ncclNumTypes: ncclDataType_t = 12;

pub const ncclSum: ncclRedOp_t = 0;
pub const ncclProd: ncclRedOp_t = 1;
pub const ncclMax: ncclRedOp_t = 2;
pub const ncclMin: ncclRedOp_t = 3;
pub const ncclAvg: ncclRedOp_t = 4;
pub const ncclNumOps: ncclRedOp_t = 5;
pub const ncclMaxRedOp: ncclRedOp_t = 0x7fffffff;

pub const ncclScalarDevice: ncclScalarResidence_t = 0;
pub const ncclScalarHostImmediate: ncclScalarResidence_t = 1;

/// 128 opaque bytes from ncclGetUniqueId, to be passed to every rank unchanged.
// bootstrap::id defines what goes inside.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl ncclUniqueId {
    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        self.internal.map(|c| c as u8)
    }

    /// From bytes a peer sent; anything but exactly 128 bytes is rejected (`None`).
    pub fn from_bytes(b: &[u8]) -> Option<ncclUniqueId> {
        let arr: [u8; NCCL_UNIQUE_ID_BYTES] = b.try_into().ok()?;
        Some(ncclUniqueId { internal: arr.map(|x| x as c_char) })
    }
}

/// What a communicator handle points at, as C sees it: an incomplete type. The handle is only a
/// key into the registry (`comm::registry`); nothing reads through it.
/// cbindgen:ignore
#[repr(C)]
pub struct ncclComm {
    _opaque: [u8; 0],
}

/// Opaque communicator handle (`struct ncclComm*` in C).
/// cbindgen:ignore
pub type ncclComm_t = *mut ncclComm;

/// Opaque window handle (`struct ncclWindow_vidmem*` in C).
/// cbindgen:ignore
pub type ncclWindow_t = *mut c_void;

/// Communicator options; initialize with NCCL_CONFIG_INITIALIZER.
// v22800. Older callers pass a smaller `size`: read only what it covers.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
}

/// `ncclSimInfo_t` v22200, filled by `ncclGroupSimulateEnd`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimatedTime: f32,
}

/// Element size in bytes of a valid `ncclDataType_t`.
pub fn dtype_size(dt: ncclDataType_t) -> Option<usize> {
    Some(match dt {
        ncclInt8 | ncclUint8 | ncclFloat8e4m3 | ncclFloat8e5m2 => 1,
        ncclFloat16 | ncclBfloat16 => 2,
        ncclInt32 | ncclUint32 | ncclFloat32 => 4,
        ncclInt64 | ncclUint64 | ncclFloat64 => 8,
        _ => return None,
    })
}

/// NCCL's own name of a data type, for log lines.
pub fn dtype_name(dt: ncclDataType_t) -> &'static str {
    const NAMES: [&str; 12] = [
        "ncclInt8",
        "ncclUint8",
        "ncclInt32",
        "ncclUint32",
        "ncclInt64",
        "ncclUint64",
        "ncclFloat16",
        "ncclFloat32",
        "ncclFloat64",
        "ncclBfloat16",
        "ncclFloat8e4m3",
        "ncclFloat8e5m2",
    ];
    usize::try_from(dt).ok().and_then(|i| NAMES.get(i)).copied().unwrap_or("invalid")
}

/// Whether a data type is a floating-point type (which decides how `ncclAvg` is computed).
pub fn dtype_is_float(dt: ncclDataType_t) -> bool {
    matches!(dt, ncclFloat16 | ncclFloat32 | ncclFloat64 | ncclBfloat16 | ncclFloat8e4m3 | ncclFloat8e5m2)
}
