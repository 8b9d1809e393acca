//! ncclCommInitRank on a machine without a CUDA driver (CI): the argument checks pass, then
//! the call fails cleanly with ncclUnhandledCudaError and a message that says why, and the
//! process keeps running (cudarc would panic on a missing driver without our probe).
//! On a machine with a driver the same call must instead succeed.

use nccl::api::{init, version};
use nccl::types::ncclResult_t::*;
use nccl::types::*;
use std::ffi::CStr;

fn driver_present() -> bool {
    ["libcuda.so.1", "libcuda.so"].iter().any(|n| {
        let c = std::ffi::CString::new(*n).unwrap();
        // SAFETY: dlopen with a valid name; the handle is left open.
        !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) }.is_null()
    })
}

#[test]
fn init_without_driver_fails_cleanly() {
    let mut id = ncclUniqueId { internal: [0; 128] };
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: valid out-pointers; a one-rank communicator needs no peer.
    unsafe {
        assert_eq!(init::ncclGetUniqueId(&mut id), ncclSuccess);
        let code = init::ncclCommInitRank(&mut comm, 1, id, 0);
        let text = CStr::from_ptr(version::ncclGetLastError(std::ptr::null_mut())).to_string_lossy().into_owned();
        if driver_present() {
            assert_eq!(code, ncclSuccess, "with a driver, init must work: {text}");
            assert_eq!(init::ncclCommDestroy(comm), ncclSuccess);
        } else {
            assert_eq!(code, ncclUnhandledCudaError, "{text}");
            assert!(text.contains("no CUDA driver found"), "{text}");
            // Still alive, and the API still answers.
            let mut v = 0;
            assert_eq!(version::ncclGetVersion(&mut v), ncclSuccess);
            assert_eq!(v, 22809);
        }
    }
}
