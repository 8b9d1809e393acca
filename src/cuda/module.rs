//! The kernels compiled by build.rs, loaded lazily: once per device, on its first launch, so
//! communicator init pays nothing for them.

use super::check;
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUfunction, CUmodule};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CString;

include!(concat!(env!("OUT_DIR"), "/fatbins.rs"));

/// A kernel handle; valid in the context it was loaded in, for the life of the process.
#[derive(Clone, Copy, Debug)]
pub struct Kernel(pub CUfunction);

// SAFETY: CUfunction handles are immutable driver objects usable from any thread.
unsafe impl Send for Kernel {}

struct Loaded {
    modules: Vec<CUmoduleHandle>,
    kernels: HashMap<String, Kernel>,
}

struct CUmoduleHandle(CUmodule);
// SAFETY: module handles are usable from any thread; we never unload them.
unsafe impl Send for CUmoduleHandle {}

/// Per device ordinal, the modules loaded into its primary context.
static LOADED: Mutex<Vec<Option<Loaded>>> = Mutex::new(Vec::new());

/// Switches the calling thread to relaxed stream-capture mode while it lives: loading code is
/// not allowed while a stream of the context is being captured in global mode, and a kernel may
/// be first needed inside a user's CUDA-graph capture.
struct RelaxedCapture(sys::CUstreamCaptureMode);

impl RelaxedCapture {
    fn new() -> Result<RelaxedCapture> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: valid in/out pointer; the previous mode comes back in `mode`.
        check(unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }, "cuThreadExchangeStreamCaptureMode")?;
        Ok(RelaxedCapture(mode))
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        // SAFETY: restores the mode saved in new().
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut self.0) };
    }
}

/// Looks a kernel up by name for `dev`, loading the fatbins into the current (that device's
/// primary) context the first time. The kernel's code is loaded now, not at its first launch:
/// with CUDA's lazy loading a load can wait for the device to go idle, which a kernel spinning
/// on a peer never does.
pub fn kernel(dev: i32, name: &str) -> Result<Kernel> {
    let mut all = LOADED.lock();
    let idx = dev as usize;
    if all.len() <= idx {
        all.resize_with(idx + 1, || None);
    }
    if let Some(k) = all[idx].as_ref().and_then(|l| l.kernels.get(name)) {
        return Ok(*k);
    }
    // Loading from here on: the driver work a launch must never wait on.
    let _relaxed = RelaxedCapture::new()?;
    if all[idx].is_none() {
        let mut modules = Vec::new();
        for (file, image) in FATBINS {
            let mut m: CUmodule = std::ptr::null_mut();
            // SAFETY: image is a fatbin embedded at build time; the device's context is current.
            check(unsafe { sys::cuModuleLoadData(&mut m, image.as_ptr() as *const _) }, "cuModuleLoadData")
                .map_err(|e| e.context(&format!("loading kernels/{file}.cu on device {dev}")))?;
            modules.push(CUmoduleHandle(m));
        }
        crate::nccl_info!(crate::debug::Subsys::INIT, "Loaded {} kernel modules on device {dev}", modules.len());
        all[idx] = Some(Loaded { modules, kernels: HashMap::new() });
    }
    let loaded = all[idx].as_mut().expect("loaded above");
    let cname = CString::new(name).map_err(|_| Error::Internal(format!("bad kernel name {name:?}")))?;
    for m in &loaded.modules {
        let mut f: CUfunction = std::ptr::null_mut();
        // SAFETY: m is a loaded module; f a valid out-pointer.
        if unsafe { sys::cuModuleGetFunction(&mut f, m.0, cname.as_ptr()) } == sys::CUresult::CUDA_SUCCESS {
            // SAFETY: f is a function of a loaded module.
            check(unsafe { sys::cuFuncLoad(f) }, "cuFuncLoad").map_err(|e| e.context(name))?;
            loaded.kernels.insert(name.to_string(), Kernel(f));
            return Ok(Kernel(f));
        }
    }
    Err(Error::Internal(format!("kernel {name} is not in the embedded fatbins")))
}
