//! ncclGroupStart / ncclGroupEnd / ncclGroupSimulateEnd.

use super::{boundary, non_null, SUCCESS};
use crate::types::{ncclResult_t, ncclSimInfo_t, NCCL_SIM_INFO_MAGIC};

#[no_mangle]
pub unsafe extern "C" fn ncclGroupStart() -> ncclResult_t {
    boundary("ncclGroupStart", || {
        crate::group::start();
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn pncclGroupStart() -> ncclResult_t {
    ncclGroupStart()
}

#[no_mangle]
pub unsafe extern "C" fn ncclGroupEnd() -> ncclResult_t {
    boundary("ncclGroupEnd", || {
        crate::group::end()?;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn pncclGroupEnd() -> ncclResult_t {
    ncclGroupEnd()
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
        info.estimatedTime = crate::enqueue::estimate_us(&queued) as f32;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    ncclGroupSimulateEnd(simInfo)
}
