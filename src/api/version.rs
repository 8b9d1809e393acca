//! Version, error strings and the debug reset.

use super::{boundary, boundary_value, non_null, write_out, SUCCESS};
use crate::types::{ncclComm_t, ncclResultCode, ncclResult_t, NCCL_VERSION_CODE};
use std::ffi::{c_char, c_int};

#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    boundary("ncclGetVersion", || {
        non_null(version, "version")?;
        // SAFETY: checked non-NULL; the caller provides an int.
        unsafe { write_out(version, NCCL_VERSION_CODE) };
        SUCCESS
    })
}

/// NCCL's message for each code (static C strings).
pub fn error_string(code: ncclResultCode) -> &'static [u8] {
    match code {
        0 => b"no error\0",
        1 => b"unhandled cuda error (run with NCCL_DEBUG=INFO for details)\0",
        2 => b"unhandled system error (run with NCCL_DEBUG=INFO for details)\0",
        3 => b"internal error - please report this issue to the ferronickel developers\0",
        4 => b"invalid argument (run with NCCL_DEBUG=WARN for details)\0",
        5 => b"invalid usage (run with NCCL_DEBUG=WARN for details)\0",
        6 => b"remote process exited or there was a network error\0",
        7 => b"NCCL operation in progress\0",
        _ => b"unknown result code\0",
    }
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetErrorString(result: ncclResultCode) -> *const c_char {
    error_string(result).as_ptr() as *const c_char
}

/// The last WARN text of this process; `comm` may be NULL, as in NCCL.
#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    let _ = comm;
    crate::debug::last_error_ptr()
}

/// Re-reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE on the next log line.
#[no_mangle]
pub unsafe extern "C" fn ncclResetDebugInit() {
    boundary_value("ncclResetDebugInit", (), || {
        crate::debug::reset();
        Ok(())
    })
}

/// NCCL's internal spelling of the same reset, exported by 2.28.
#[no_mangle]
pub unsafe extern "C" fn ncclResetDebugInitInternal() {
    ncclResetDebugInit()
}

// The pnccl* profiling twins of this file's exports.
twins! {
    ncclGetVersion => pncclGetVersion(version: *mut c_int) -> ncclResult_t;
    ncclGetErrorString => pncclGetErrorString(result: ncclResultCode) -> *const c_char;
    ncclGetLastError => pncclGetLastError(comm: ncclComm_t) -> *const c_char;
    ncclResetDebugInit => pncclResetDebugInit();
    ncclResetDebugInitInternal => pncclResetDebugInitInternal();
}
