//! Communicator queries.

use super::{boundary, comm_arg, non_null, write_out, SUCCESS};
use crate::types::{ncclComm_t, ncclResult_t};
use std::ffi::c_int;

#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    boundary("ncclCommCount", || {
        let c = comm_arg(comm)?;
        non_null(count, "count")?;
        let c = c.queryable()?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(count, c.nranks as c_int) };
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    boundary("ncclCommCuDevice", || {
        let c = comm_arg(comm)?;
        non_null(device, "device")?;
        let c = c.queryable()?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(device, c.dev) };
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    boundary("ncclCommUserRank", || {
        let c = comm_arg(comm)?;
        non_null(rank, "rank")?;
        let c = c.queryable()?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(rank, c.rank as c_int) };
        SUCCESS
    })
}

/// ncclInProgress while a nonblocking init runs, ncclRemoteError after a collective timed out
/// (NCCL_WATCHDOG_TIMEOUT_MS), the init failure, or ncclSuccess.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t {
    boundary("ncclCommGetAsyncError", || {
        let c = comm_arg(comm)?;
        non_null(asyncError, "asyncError")?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(asyncError, c.async_error()) };
        SUCCESS
    })
}

// The pnccl* profiling twins of this file's exports.
twins! {
    ncclCommCount => pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t;
    ncclCommCuDevice => pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t;
    ncclCommUserRank => pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t;
    ncclCommGetAsyncError => pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t;
}
