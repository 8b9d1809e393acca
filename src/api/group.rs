//! ncclGroupStart / ncclGroupEnd / ncclGroupSimulateEnd.

use super::{boundary, non_null, SUCCESS};
use crate::types::{ncclResult_t, ncclSimInfo_t, NCCL_SIM_INFO_MAGIC};

#[no_mangle]
pub unsafe extern "C" fn ncclGroupStart() -> ncclResult_t {
    boundary("ncclGroupStart", || {
        crate::group::start()?;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclGroupEnd() -> ncclResult_t {
    boundary("ncclGroupEnd", || match crate::group::end()? {
        crate::group::Ended::Done => SUCCESS,
        crate::group::Ended::InitInProgress => Ok(ncclResult_t::ncclInProgress),
    })
}

/// Ends the group without launching and reports the time the tuner's cost model expects it to
/// take, in `simInfo->estimatedTime` (microseconds, as NCCL).
#[no_mangle]
pub unsafe extern "C" fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    boundary("ncclGroupSimulateEnd", || {
        non_null(simInfo, "simInfo")?;
        // SAFETY: checked non-NULL; the header fields exist in every version.
        let info = unsafe { &mut *simInfo };
        if info.magic != NCCL_SIM_INFO_MAGIC {
            crate::bail_arg!("simInfo magic {:#x} is wrong: initialize it with NCCL_SIM_INFO_INITIALIZER", info.magic);
        }
        if info.size < std::mem::size_of::<ncclSimInfo_t>() {
            crate::bail_arg!("simInfo size {} is smaller than ncclSimInfo_t", info.size);
        }
        let queued = crate::group::end_without_launch()?;
        let tasks: Vec<_> = queued.iter().map(|q| (q.comm.shape(), q.task)).collect();
        // Collectives checked the restrictions when they were queued; sends do not depend on them.
        let allowed = crate::tuner::restrictions().unwrap_or(&crate::tuner::Allowed::ALL);
        info.estimatedTime = crate::plan::estimate_us(&tasks, allowed) as f32;
        SUCCESS
    })
}

// The pnccl* profiling twins of this file's exports.
twins! {
    ncclGroupStart => pncclGroupStart() -> ncclResult_t;
    ncclGroupEnd => pncclGroupEnd() -> ncclResult_t;
    ncclGroupSimulateEnd => pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t;
}
