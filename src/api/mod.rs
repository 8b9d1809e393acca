//! The C ABI: every `nccl*` export and its `pnccl*` profiling twin.
//!
//! Each export has one shape (after rustls-ffi): the whole body runs inside [`boundary`], which
//! catches panics, turns errors into `ncclResult_t`, logs one WARN line naming the call and
//! records the text for `ncclGetLastError`. Arguments are checked before anything touches CUDA
//! or queues work, so bad input leaves the communicator usable.
// Each export's safety contract is NCCL's documented C API (valid pointers of the documented
// sizes); the `# Safety` sections clippy asks for would repeat nccl.h a hundred times.
#![allow(clippy::missing_safety_doc)]

/// Defines the `pnccl*` profiling twin of each listed export (`ncclX => pncclX(args) -> ret;`):
/// the same signature, forwarding to the original. NCCL exports every function under both names
/// so that a profiler can interpose on one and call the other. The `ncclX` functions stay written
/// out, since cbindgen reads the source without expanding macros; `tests/header.rs` adds the
/// twins' prototypes to the header, and a signature that disagrees with its original does not
/// compile.
macro_rules! twins {
    ($($name:ident => $twin:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $twin($($arg: $ty),*) $(-> $ret)? {
                // SAFETY: the twin's contract is the one of the function it forwards to.
                unsafe { $name($($arg),*) }
            }
        )*
    };
}

pub mod coll;
pub mod device_api;
pub mod group;
pub mod init;
pub mod mem;
pub mod query;
pub mod version;

#[cfg(test)]
mod bad_input_tests;

use crate::comm::registry::{self, CommHandle};
use crate::error::{Error, Result};
use crate::plugin::nvtx::{self, Payload};
use crate::types::{ncclComm_t, ncclResult_t};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Whether a releasing call (destroy, abort, deregister, free) comes after the process began to
/// exit: it then leaves everything to the operating system and succeeds, as NCCL leaks the
/// communicators alive at exit, for CUDA may already be torn down (docs/ARCHITECTURE.md, "Who owns
/// what"). Static destructors do make such calls: PyTorch's symmetric-memory manager destroys its
/// device communicators from one.
fn left_to_exit(call: &str) -> bool {
    let exiting = crate::exit::exiting();
    if exiting {
        crate::nccl_info!(crate::debug::Subsys::INIT, "{call} after the process began to exit: left to the OS");
    }
    exiting
}

/// Runs an API body: panics become `ncclInternalError`, errors become their code plus a WARN.
pub fn boundary(call: &'static str, body: impl FnOnce() -> Result<ncclResult_t>) -> ncclResult_t {
    boundary_with(call, || Payload::None, body)
}

/// [`boundary`] whose NVTX range carries NCCL's payload of the call (docs/PLUGINS.md, "NVTX");
/// `payload` runs only when an NVTX tool is attached.
pub fn boundary_with(
    call: &'static str,
    payload: impl FnOnce() -> Payload,
    body: impl FnOnce() -> Result<ncclResult_t>,
) -> ncclResult_t {
    let _range = nvtx::push(call, payload);
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            crate::group::record_error(&e);
            if e.to_string().is_empty() {
                // Every failure must say something in ncclGetLastError; an empty text is a bug.
                crate::nccl_warn!("{call}: failed with {:?} and no explanation; please report this bug", e.code());
            } else {
                crate::nccl_warn!("{call}: {e}");
            }
            e.code()
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            crate::nccl_warn!("{call}: internal error (panic: {what}); please report this bug");
            ncclResult_t::ncclInternalError
        }
    }
}

/// Like [`boundary`] for the few exports that return a value instead of `ncclResult_t`.
pub fn boundary_value<T>(call: &'static str, fallback: T, body: impl FnOnce() -> Result<T>) -> T {
    let mut out = None;
    boundary(call, || {
        out = Some(body()?);
        Ok(ncclResult_t::ncclSuccess)
    });
    out.unwrap_or(fallback)
}

/// Rejects a NULL out-pointer, naming the argument.
pub fn non_null<T>(p: *const T, arg: &str) -> Result<()> {
    if p.is_null() {
        crate::bail_arg!("{arg} is NULL");
    }
    Ok(())
}

/// Writes through an out-pointer already checked by [`non_null`].
///
/// # Safety
/// `p` must be non-NULL and valid for a write of `T` (the C caller's contract).
pub unsafe fn write_out<T>(p: *mut T, v: T) {
    // SAFETY: per the function contract.
    unsafe { p.write(v) }
}

/// The handle behind a `ncclComm_t` argument. Safe with any pointer: the registry looks it up
/// by value and never reads through it.
pub fn comm_arg(comm: ncclComm_t) -> Result<Arc<CommHandle>> {
    registry::lookup(comm, "comm")
}

/// A rank argument (root, peer) in `0..nranks`.
pub fn rank_arg(v: i32, nranks: usize, arg: &str) -> Result<usize> {
    match usize::try_from(v) {
        Ok(r) if r < nranks => Ok(r),
        _ => Err(Error::InvalidArgument(format!("{arg} {v} is out of range (communicator has {nranks} ranks)"))),
    }
}

pub const SUCCESS: Result<ncclResult_t> = Ok(ncclResult_t::ncclSuccess);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_do_not_cross_the_boundary() {
        let _l = crate::debug::LAST_ERROR_TEST_LOCK.lock();
        let code = boundary("ncclTest", || panic!("boom"));
        assert_eq!(code, ncclResult_t::ncclInternalError);
        assert!(crate::debug::last_error().contains("boom"));
    }

    #[test]
    fn errors_map_to_codes() {
        let _l = crate::debug::LAST_ERROR_TEST_LOCK.lock();
        let code = boundary("ncclTest", || Err(Error::InvalidArgument("count is too large".into())));
        assert_eq!(code, ncclResult_t::ncclInvalidArgument);
        assert!(crate::debug::last_error().contains("ncclTest: count is too large"));
        assert_eq!(boundary_value("ncclTest", -1, || Ok(3)), 3);
        assert_eq!(boundary_value("ncclTest", -1, || Err::<i32, _>(Error::System("x".into()))), -1);
    }

    #[test]
    fn every_error_kind_leaves_a_text() {
        let _l = crate::debug::LAST_ERROR_TEST_LOCK.lock();
        let kinds =
            [Error::InvalidArgument, Error::InvalidUsage, Error::System, Error::Internal, Error::Cuda, Error::Remote];
        for make in kinds {
            for msg in ["", "what went wrong"] {
                crate::debug::set_last_error("");
                let code = boundary("ncclTest", || Err(make(msg.into())));
                let text = crate::debug::last_error();
                assert_eq!(code, make(msg.into()).code());
                assert!(text.starts_with("ncclTest: ") && text.len() > "ncclTest: ".len(), "{code:?}: {text:?}");
            }
        }
    }

    #[test]
    fn ranks_in_range() {
        assert_eq!(rank_arg(1, 2, "root").unwrap(), 1);
        assert!(rank_arg(2, 2, "root").is_err());
        assert!(rank_arg(-1, 2, "peer").unwrap_err().to_string().contains("peer -1"));
    }
}
