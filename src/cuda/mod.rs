//! The CUDA driver, loaded at run time through cudarc's `dynamic-loading`.
//!
//! cudarc panics on the first call when `libcuda.so` is missing, so [`init`] probes for the
//! driver with `dlopen` first and every driver call goes through [`check`], which turns a
//! failing `CUresult` into [`Error::Cuda`] carrying CUDA's own error name.
// CUDA handles (streams, functions) are opaque pointers handed to the driver, which validates
// them; nothing here dereferences them.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod module;
pub mod vmm;

use crate::abi::fnKernelArgs;
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUdeviceptr, CUresult};
use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

pub use sys::{CUevent, CUlaunchMemSyncDomain as MemSyncDomain, CUstream};

/// Maps a driver status to our error, naming the call and CUDA's error.
pub fn check(res: CUresult, what: &str) -> Result<()> {
    if res == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it NULL.
    unsafe { sys::cuGetErrorName(res, &mut name) };
    let name = if name.is_null() {
        format!("{res:?}")
    } else {
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    };
    Err(Error::Cuda(format!("CUDA call {what} failed: {name}")))
}

/// Whether `libcuda.so.1` can be loaded at all (no cudarc call before this says yes).
fn driver_library_present() -> bool {
    ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
        let c = std::ffi::CString::new(*name).unwrap();
        // SAFETY: dlopen with a valid C string; the handle is deliberately kept open (the driver
        // stays loaded for the life of the process, as cudarc will load it again anyway).
        !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }.is_null()
    })
}

/// Loads and initialises the driver once; every later call gets the same answer.
pub fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !driver_library_present() {
            return Err(Error::Cuda(
                "no CUDA driver found (libcuda.so.1 could not be loaded): this machine has no NVIDIA driver or GPU"
                    .into(),
            ));
        }
        // SAFETY: the driver library is present, so cudarc's loader will not panic.
        check(unsafe { sys::cuInit(0) }, "cuInit")?;
        let n = device_count()?;
        if n == 0 {
            return Err(Error::Cuda("no CUDA device found (cuDeviceGetCount returned 0)".into()));
        }
        Ok(())
    })
    .clone()
}

pub fn device_count() -> Result<i32> {
    let mut n = 0;
    // SAFETY: n is a valid out-pointer; only called after the driver is loaded.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n)
}

/// The device of the calling thread's current context (what `cudaSetDevice` chose), or 0.
pub fn current_device() -> Result<i32> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    if ctx.is_null() {
        return Ok(0);
    }
    let mut dev: CUdevice = 0;
    // SAFETY: a context is current, dev is a valid out-pointer.
    check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
    Ok(dev)
}

/// The primary context of a device: the one the CUDA runtime (and so the user) uses.
pub fn primary_context(dev: i32) -> Result<Context> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the retain is released in Context's Drop.
    check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
    Ok(Context { ctx, dev })
}

/// A retained primary context. Send + Sync: CUDA contexts may be used from any thread.
#[derive(Debug)]
pub struct Context {
    ctx: CUcontext,
    pub dev: i32,
}

// SAFETY: a CUcontext handle may be used from any thread; the driver synchronises internally.
unsafe impl Send for Context {}
// SAFETY: as above; we only pass the handle to driver calls.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in primary_context.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

impl Context {
    /// Makes this context current until the guard drops, restoring the caller's afterwards.
    pub fn enter(&self) -> Result<CtxGuard> {
        // SAFETY: ctx is a retained, valid context.
        check(unsafe { sys::cuCtxPushCurrent_v2(self.ctx) }, "cuCtxPushCurrent")?;
        Ok(CtxGuard(()))
    }

    pub fn raw(&self) -> CUcontext {
        self.ctx
    }
}

/// Pops the context pushed by [`Context::enter`].
pub struct CtxGuard(());

impl Drop for CtxGuard {
    fn drop(&mut self) {
        let mut old: CUcontext = std::ptr::null_mut();
        // SAFETY: balances the push in Context::enter on the same thread.
        unsafe { sys::cuCtxPopCurrent_v2(&mut old) };
    }
}

/// PCI bus id string of a device, e.g. "0000:1B:00.0".
pub fn pci_bus_id(dev: i32) -> Result<String> {
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: buf is writable for the length passed.
    check(unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) }, "cuDeviceGetPCIBusId")?;
    // SAFETY: the driver NUL-terminates within the buffer.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

pub fn compute_capability_major(dev: i32) -> Result<i32> {
    let mut v = 0;
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
    // SAFETY: valid out-pointer.
    check(unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) }, "cuDeviceGetAttribute")?;
    Ok(v)
}

pub fn can_access_peer(dev: i32, peer: i32) -> Result<bool> {
    if dev == peer {
        return Ok(true);
    }
    let mut ok = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { sys::cuDeviceCanAccessPeer(&mut ok, dev, peer) }, "cuDeviceCanAccessPeer")?;
    Ok(ok != 0)
}

/// The local ordinal of the GPU with this PCI bus id, or `None` when this process does not
/// see it (CUDA_VISIBLE_DEVICES).
pub fn device_by_bus_id(bus_id: &str) -> Result<Option<i32>> {
    let Ok(c) = std::ffi::CString::new(bus_id) else { return Ok(None) };
    let mut dev: CUdevice = 0;
    // SAFETY: c is a NUL-terminated string, dev a valid out-pointer.
    let res = unsafe { sys::cuDeviceGetByPCIBusId(&mut dev, c.as_ptr()) };
    match res {
        CUresult::CUDA_ERROR_INVALID_DEVICE | CUresult::CUDA_ERROR_INVALID_VALUE => Ok(None),
        _ => check(res, "cuDeviceGetByPCIBusId").map(|_| Some(dev)),
    }
}

/// Whether `dev` and `peer` support native atomics on each other's memory: the driver's hint
/// that NVLink joins them (PCIe between GPUs does not provide them).
pub fn p2p_native_atomics(dev: i32, peer: i32) -> Result<bool> {
    let mut v = 0;
    let attr = sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED;
    // SAFETY: valid out-pointer; both are device ordinals of this process.
    check(unsafe { sys::cuDeviceGetP2PAttribute(&mut v, attr, dev, peer) }, "cuDeviceGetP2PAttribute")?;
    Ok(v != 0)
}

/// Lets kernels in the current context read and write `peer`'s memory.
pub fn enable_peer_access(peer: &Context) -> Result<()> {
    // SAFETY: peer.ctx is a valid retained context; a context is current (caller entered one).
    let res = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) };
    if res == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check(res, "cuCtxEnablePeerAccess")
}

/// Device memory owned by us, freed on drop. The owning context must outlive it.
#[derive(Debug)]
pub struct DeviceBuffer {
    pub ptr: CUdeviceptr,
    pub len: usize,
}

impl DeviceBuffer {
    /// Allocates in the current context and zeroes it (so FIFO counters start at 0).
    pub fn zeroed(len: usize) -> Result<DeviceBuffer> {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; a context is current.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) }, "cuMemAlloc")?;
        let buf = DeviceBuffer { ptr, len };
        // SAFETY: ptr..ptr+len was just allocated; the synchronous memset completes before return.
        check(unsafe { sys::cuMemsetD8_v2(ptr, 0, len) }, "cuMemsetD8")?;
        Ok(buf)
    }

    /// Copies a host value into the buffer at `offset` (synchronous).
    pub fn write<T: Copy>(&self, offset: usize, items: &[T]) -> Result<()> {
        let bytes = std::mem::size_of_val(items);
        if offset + bytes > self.len {
            return Err(Error::Internal(format!("device write of {bytes} B at {offset} overflows {} B", self.len)));
        }
        // SAFETY: bounds checked above; the source slice is valid for `bytes` bytes.
        check(
            unsafe { sys::cuMemcpyHtoD_v2(self.ptr + offset as u64, items.as_ptr() as *const c_void, bytes) },
            "cuMemcpyHtoD",
        )
    }

    /// Copies a host value into the buffer at `offset` on `stream` and waits for it: unlike
    /// [`DeviceBuffer::write`] (the legacy stream), it does not wait behind kernels of other
    /// streams, which may be spinning on a peer.
    pub fn write_on<T: Copy>(&self, stream: &Stream, offset: usize, items: &[T]) -> Result<()> {
        let bytes = std::mem::size_of_val(items);
        if offset + bytes > self.len {
            return Err(Error::Internal(format!("device write of {bytes} B at {offset} overflows {} B", self.len)));
        }
        let (dst, src) = (self.ptr + offset as u64, items.as_ptr() as *const c_void);
        // SAFETY: bounds checked above; the source slice outlives the copy, which is waited for
        // before returning.
        let rc = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, stream.0) };
        check(rc, "cuMemcpyHtoDAsync")?;
        stream_synchronize(stream.0)
    }

    /// Copies the buffer's first `out.len()` items back to the host (synchronous).
    pub fn read<T: Copy>(&self, out: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(out);
        if bytes > self.len {
            return Err(Error::Internal(format!("device read of {bytes} B overflows {} B", self.len)));
        }
        // SAFETY: bounds checked; out is valid for `bytes` bytes of writes.
        check(unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, self.ptr, bytes) }, "cuMemcpyDtoH")
    }

    pub fn ipc_handle(&self) -> Result<[u8; 64]> {
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: ptr is the base of a cuMemAlloc allocation.
        check(unsafe { sys::cuIpcGetMemHandle(&mut h, self.ptr) }, "cuIpcGetMemHandle")?;
        Ok(h.reserved.map(|c| c as u8))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuMemAlloc and is freed once.
        unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Another process's device memory mapped into ours; unmapped on drop.
#[derive(Debug)]
pub struct IpcMapping {
    pub ptr: CUdeviceptr,
}

impl IpcMapping {
    pub fn open(handle: &[u8; 64]) -> Result<IpcMapping> {
        let h = sys::CUipcMemHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut ptr: CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: valid out-pointer; the handle came from a peer's cuIpcGetMemHandle.
        check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) }, "cuIpcOpenMemHandle")?;
        Ok(IpcMapping { ptr })
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: ptr came from cuIpcOpenMemHandle and is closed once.
        unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
    }
}

/// Pinned host memory mapped into the device: flags both sides poll (abort, errors).
#[derive(Debug)]
pub struct HostMapped {
    host: *mut u32,
    pub dev: CUdeviceptr,
    len: usize,
}

// SAFETY: the memory is plain pinned host memory; access goes through volatile reads/writes.
unsafe impl Send for HostMapped {}
// SAFETY: as above.
unsafe impl Sync for HostMapped {}

impl HostMapped {
    /// `words` zeroed u32 flags visible to every context (portable) and to the device.
    pub fn zeroed(words: usize) -> Result<HostMapped> {
        let len = words * 4;
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: valid out-pointer; a context is current.
        check(unsafe { sys::cuMemHostAlloc(&mut p, len, flags) }, "cuMemHostAlloc")?;
        // SAFETY: p points to len writable bytes just allocated.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, len) };
        let mut dev: CUdeviceptr = 0;
        // SAFETY: p is a mapped pinned allocation.
        let res = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) };
        let me = HostMapped { host: p as *mut u32, dev, len };
        check(res, "cuMemHostGetDevicePointer")?;
        Ok(me)
    }

    /// The host address of the memory (the device's is `dev`).
    pub fn host_ptr(&self) -> *mut u8 {
        self.host.cast()
    }

    pub fn get(&self, i: usize) -> u32 {
        assert!(i * 4 < self.len);
        // SAFETY: in bounds; volatile because the device writes it concurrently.
        unsafe { std::ptr::read_volatile(self.host.add(i)) }
    }

    pub fn set(&self, i: usize, v: u32) {
        assert!(i * 4 < self.len);
        // SAFETY: in bounds; volatile because the device polls it.
        unsafe { std::ptr::write_volatile(self.host.add(i), v) }
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        // SAFETY: host came from cuMemHostAlloc and is freed once.
        unsafe { sys::cuMemFreeHost(self.host as *mut c_void) };
    }
}

/// Host memory we did not allocate (a shared mapping) pinned and mapped into every context's
/// address space; unregistered on drop, before the caller unmaps it.
#[derive(Debug)]
pub struct HostRegistration {
    host: *mut c_void,
    /// The address kernels use for it.
    pub dev: CUdeviceptr,
}

// SAFETY: the registration is a handle to pinned memory; the driver synchronises its use.
unsafe impl Send for HostRegistration {}
// SAFETY: as above; we only pass the pointer to driver calls.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` bytes at `host` (PORTABLE: every context; DEVICEMAP: kernels may use it).
    ///
    /// # Safety
    /// `host..host + len` is a page-aligned mapping that stays mapped until this value drops.
    pub unsafe fn new(host: *mut c_void, len: usize) -> Result<HostRegistration> {
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: per this function's contract; a context is current (caller entered one).
        check(unsafe { sys::cuMemHostRegister_v2(host, len, flags) }, "cuMemHostRegister")?;
        // Unregistered on drop if the device pointer cannot be had.
        let mut me = HostRegistration { host, dev: 0 };
        // SAFETY: host is the start of a registration made just above.
        check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut me.dev, host, 0) }, "cuMemHostGetDevicePointer")?;
        Ok(me)
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        // SAFETY: host was registered in new() and is unregistered once.
        unsafe { sys::cuMemHostUnregister(self.host) };
    }
}

/// An event used to order our launches and to wait for them (destroy, abort, finalize).
#[derive(Debug)]
pub struct Event(pub CUevent);

// SAFETY: event handles may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    pub fn new() -> Result<Event> {
        let mut e: CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: valid out-pointer; a context is current.
        check(unsafe { sys::cuEventCreate(&mut e, flags) }, "cuEventCreate")?;
        Ok(Event(e))
    }

    pub fn record(&self, stream: CUstream) -> Result<()> {
        // SAFETY: valid event; the stream belongs to the current context (checked by the driver).
        check(unsafe { sys::cuEventRecord(self.0, stream) }, "cuEventRecord")
    }

    /// Makes `stream` wait for the work this event last recorded (the event may belong to another
    /// context or device).
    pub fn wait(&self, stream: CUstream) -> Result<()> {
        // SAFETY: both handles are valid; flags 0.
        check(unsafe { sys::cuStreamWaitEvent(stream, self.0, 0) }, "cuStreamWaitEvent")
    }

    /// Done yet? Errors other than "not ready" are reported.
    pub fn is_done(&self) -> Result<bool> {
        // SAFETY: valid event.
        let res = unsafe { sys::cuEventQuery(self.0) };
        if res == CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(res, "cuEventQuery").map(|_| true)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once.
        unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// A stream of our own that never waits for the legacy default stream (`CU_STREAM_NON_BLOCKING`):
/// small copies queued on it finish while users' kernels spin (hang reports read FIFO counters).
#[derive(Debug)]
pub struct Stream(pub CUstream);

// SAFETY: stream handles may be used from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    pub fn non_blocking() -> Result<Stream> {
        let mut s: CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: valid out-pointer; a context is current.
        check(unsafe { sys::cuStreamCreate(&mut s, flags) }, "cuStreamCreate")?;
        Ok(Stream(s))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by cuStreamCreate, destroyed once (queued work still completes).
        unsafe { sys::cuStreamDestroy_v2(self.0) };
    }
}

/// Whether a pointer is device-accessible memory (device, managed or mapped host memory).
pub fn is_device_pointer(p: *const c_void) -> bool {
    if init().is_err() {
        return false;
    }
    let mut ty: u32 = 0;
    // SAFETY: valid out-pointer of the attribute's size (unsigned int).
    let res = unsafe {
        sys::cuPointerGetAttribute(
            &mut ty as *mut u32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            p as CUdeviceptr,
        )
    };
    res == CUresult::CUDA_SUCCESS
}

/// Whether `stream` is being captured into a graph.
pub fn is_capturing(stream: CUstream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid out-pointer; the stream handle comes from the user (the driver validates it).
    check(unsafe { sys::cuStreamIsCapturing(stream, &mut status) }, "cuStreamIsCapturing")?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Queues a copy of `bytes` from `src` to `dst` (unified addresses, any devices) on `stream`: the
/// copy engines move it, no kernel.
///
/// # Safety
/// `src` and `dst` are device (or mapped) memory valid for `bytes` until the copy runs.
pub unsafe fn memcpy_async(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream) -> Result<()> {
    // SAFETY: valid buffers per this function's contract; the copy runs in stream order.
    check(unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream) }, "cuMemcpyAsync")
}

/// Waits for all work on a stream.
pub fn stream_synchronize(stream: CUstream) -> Result<()> {
    // SAFETY: the stream handle is valid in the current context.
    check(unsafe { sys::cuStreamSynchronize(stream) }, "cuStreamSynchronize")
}

/// Launches one of our kernels (`func`, whose single parameter is the kernel argument struct of
/// `kernels/device_abi.h`) on `stream`, in memory synchronization domain `domain` where given
/// (Hopper and later; docs/ARCHITECTURE.md, "Memory synchronization domains").
///
/// # Safety
/// `func` is a kernel loaded from our fatbin, and every device address `args` holds (its device
/// communicator and the works' buffers) is valid for what the kernel reads and writes there.
pub unsafe fn launch(
    func: sys::CUfunction,
    grid: u32,
    block: u32,
    stream: CUstream,
    args: &fnKernelArgs,
    domain: Option<MemSyncDomain>,
) -> Result<()> {
    let mut params = [args as *const fnKernelArgs as *mut c_void];
    // SAFETY: a zeroed attribute is a plain C struct with an id of 0 (ignored) and a value union
    // of bytes; the domain member is set before the attribute is passed.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN;
    if let Some(d) = domain {
        attr.value.memSyncDomain = d;
    }
    let config = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: u32::from(domain.is_some()),
    };
    // SAFETY: func takes one fnKernelArgs by value (the shared ABI header) and the addresses in
    // it are valid per this function's contract; `params`, `attr` and `config` outlive the call,
    // which copies the parameter block.
    check(
        unsafe { sys::cuLaunchKernelEx(&config, func, params.as_mut_ptr(), std::ptr::null_mut()) },
        "cuLaunchKernelEx",
    )
}
