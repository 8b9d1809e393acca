//! Memory: ncclMemAlloc/Free, buffer registration and windows.

use super::{boundary, comm_arg, non_null, write_out, SUCCESS};
use crate::comm::Comm;
use crate::cuda::{self, vmm::Allocation};
use crate::error::Result;
use crate::types::{ncclComm_t, ncclResult_t, ncclWindow_t};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// Allocations made by ncclMemAlloc, so ncclMemFree can refuse pointers that are not ours.
static ALLOCS: Mutex<Option<HashMap<u64, (Allocation, cuda::Context)>>> = Mutex::new(None);

/// Device memory on the caller's current device (device 0 if none is current), made with the
/// CUDA VMM API and exportable as a file descriptor, so that it can back symmetric windows
/// (docs/ARCHITECTURE.md, "Windows and the device communicator"); zeroed.
#[no_mangle]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    boundary("ncclMemAlloc", || {
        non_null(ptr, "ptr")?;
        if size == 0 {
            crate::bail_arg!("size is 0");
        }
        cuda::init()?;
        let dev = cuda::current_device()?;
        let ctx = cuda::primary_context(dev)?;
        let buf = {
            let _g = ctx.enter()?;
            Allocation::new(dev, size)?
        };
        let p = buf.ptr();
        ALLOCS.lock().get_or_insert_with(HashMap::new).insert(p, (buf, ctx));
        // SAFETY: checked non-NULL.
        unsafe { write_out(ptr, p as *mut c_void) };
        SUCCESS
    })
}

/// Frees memory from ncclMemAlloc; NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    boundary("ncclMemFree", || {
        if ptr.is_null() || super::left_to_exit("ncclMemFree") {
            return SUCCESS;
        }
        let entry = ALLOCS.lock().as_mut().and_then(|m| m.remove(&(ptr as u64)));
        match entry {
            Some((buf, ctx)) => {
                let _g = ctx.enter()?;
                drop(buf);
                SUCCESS
            }
            None => crate::bail_arg!("ptr {ptr:p} was not allocated by ncclMemAlloc (or was already freed)"),
        }
    })
}

/// A registered range; its address is the handle the caller gets. Buffers (ncclCommRegister) and
/// windows (ncclCommWindowRegister) are told apart, so neither deregisters the other.
struct Registration {
    _base: u64,
    _len: usize,
    window: bool,
}

/// The ready communicator `comm`, once `buff` is checked to be `size` (> 0) bytes of device
/// memory: what registering a buffer or a window starts with.
fn ready_with_buffer(comm: ncclComm_t, buff: *mut c_void, size: usize) -> Result<Arc<Comm>> {
    let c = comm_arg(comm)?.ready()?;
    non_null(buff, "buff")?;
    if size == 0 {
        crate::bail_arg!("size is 0");
    }
    if !cuda::is_device_pointer(buff) {
        crate::bail_arg!("buff {buff:p} is not device-accessible memory");
    }
    Ok(c)
}

/// Registration is a performance hint in NCCL, and so is a window for the collectives: ours copy
/// through FIFOs from any device buffer and do not use either yet, so registering checks the
/// buffer and records it, and nothing else changes.
fn register(comm: ncclComm_t, buff: *mut c_void, size: usize, window: bool) -> Result<*mut c_void> {
    let c = ready_with_buffer(comm, buff, size)?;
    let h = Box::into_raw(Box::new(Registration { _base: buff as u64, _len: size, window }));
    c.registrations.lock().insert(h as usize);
    Ok(h as *mut c_void)
}

fn deregister(comm: ncclComm_t, handle: *mut c_void, window: bool) -> Result<()> {
    let c = comm_arg(comm)?.queryable()?;
    let what = if window { "win" } else { "handle" };
    non_null(handle, what)?;
    let mut regs = c.registrations.lock();
    // SAFETY: only dereferenced once found in the set, i.e. created by register() and not freed.
    let known = regs.contains(&(handle as usize)) && unsafe { (*(handle as *const Registration)).window } == window;
    if !known {
        let kind = if window { "window" } else { "registration" };
        crate::bail_arg!("{what} {handle:p} is not a {kind} of this communicator");
    }
    regs.remove(&(handle as usize));
    // SAFETY: created by Box::into_raw in register() and just left the set.
    drop(unsafe { Box::from_raw(handle as *mut Registration) });
    Ok(())
}

/// Registers a device buffer with the communicator; release it with ncclCommDeregister.
#[no_mangle]
pub unsafe extern "C" fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    boundary("ncclCommRegister", || {
        non_null(handle, "handle")?;
        let h = register(comm, buff, size, false)?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(handle, h) };
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    boundary("ncclCommDeregister", || {
        if super::left_to_exit("ncclCommDeregister") {
            return SUCCESS;
        }
        deregister(comm, handle, false)?;
        SUCCESS
    })
}

/// `winFlags` bit of a symmetric window (nccl.h's NCCL_WIN_COLL_SYMMETRIC).
const NCCL_WIN_COLL_SYMMETRIC: c_int = 0x1;

/// Registers a window. A symmetric one (memory from ncclMemAlloc) is collective and maps every
/// LSA peer's buffer; the handle is the device address of its `ncclWindow_vidmem`. Otherwise the
/// range is recorded, as for ncclCommRegister.
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ncclResult_t {
    boundary("ncclCommWindowRegister", || {
        non_null(win, "win")?;
        if winFlags & !NCCL_WIN_COLL_SYMMETRIC != 0 {
            crate::bail_arg!("winFlags {winFlags:#x} has bits other than NCCL_WIN_COLL_SYMMETRIC");
        }
        let h = if winFlags & NCCL_WIN_COLL_SYMMETRIC != 0 {
            ready_with_buffer(comm, buff, size)?.register_window(buff as u64, size)? as *mut c_void
        } else {
            register(comm, buff, size, true)?
        };
        // SAFETY: checked non-NULL.
        unsafe { write_out(win, h) };
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    boundary("ncclCommWindowDeregister", || {
        if super::left_to_exit("ncclCommWindowDeregister") {
            return SUCCESS;
        }
        let c = comm_arg(comm)?.queryable()?;
        if !win.is_null() && c.is_window(win as u64) {
            c.deregister_window(win as u64)?;
        } else {
            deregister(comm, win, true)?;
        }
        SUCCESS
    })
}

// The pnccl* profiling twins of this file's exports.
twins! {
    ncclMemAlloc => pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t;
    ncclMemFree => pncclMemFree(ptr: *mut c_void) -> ncclResult_t;
    ncclCommRegister => pncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: usize,
        handle: *mut *mut c_void) -> ncclResult_t;
    ncclCommDeregister => pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t;
    ncclCommWindowRegister => pncclCommWindowRegister(comm: ncclComm_t, buff: *mut c_void, size: usize,
        win: *mut ncclWindow_t, winFlags: c_int) -> ncclResult_t;
    ncclCommWindowDeregister => pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t;
}
