//! CUDA virtual memory management: physical allocations that can be exported as POSIX file
//! descriptors, reserved address ranges, and mappings of the one into the other. Windows are made
//! of these (docs/ARCHITECTURE.md, "Windows and the device communicator").

use super::check;
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUdeviceptr, CUmemGenericAllocationHandle};
use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};

fn prop(dev: i32, exportable: bool) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct for which all zeroes is the "no flags" value.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = if exportable {
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    } else {
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
    };
    p
}

/// The allocation granularity of `dev` (2 MiB on H100): sizes and mapping addresses are
/// multiples of it. Asked for exportable memory, and for plain memory where the driver refuses.
pub fn granularity(dev: i32) -> Result<usize> {
    let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    let mut g = 0usize;
    // SAFETY: valid out-pointer and property struct.
    if unsafe { sys::cuMemGetAllocationGranularity(&mut g, &prop(dev, true), flag) } == sys::CUresult::CUDA_SUCCESS {
        return Ok(g.max(1));
    }
    // SAFETY: as above.
    let rc = unsafe { sys::cuMemGetAllocationGranularity(&mut g, &prop(dev, false), flag) };
    check(rc, "cuMemGetAllocationGranularity")?;
    Ok(g.max(1))
}

/// A physical allocation (or a peer's, imported); released on drop, after its mappings.
#[derive(Debug)]
pub struct Physical {
    handle: CUmemGenericAllocationHandle,
    /// Whether it can be exported as a file descriptor.
    pub exportable: bool,
}

impl Physical {
    /// `size` bytes (a multiple of [`granularity`]) on `dev`, exportable as a file descriptor
    /// when the driver allows it; otherwise not exportable, which rules out symmetric windows.
    pub fn create(dev: i32, size: usize) -> Result<Physical> {
        let mut handle = 0;
        // SAFETY: valid out-pointer and property struct.
        let rc = unsafe { sys::cuMemCreate(&mut handle, size, &prop(dev, true), 0) };
        if rc == sys::CUresult::CUDA_SUCCESS {
            return Ok(Physical { handle, exportable: true });
        }
        crate::nccl_warn_unrecorded!(
            "cuMemCreate with a POSIX file descriptor handle failed ({rc:?}) on device {dev}; allocating without one: \
             this memory cannot back symmetric windows"
        );
        // SAFETY: as above.
        check(unsafe { sys::cuMemCreate(&mut handle, size, &prop(dev, false), 0) }, "cuMemCreate")?;
        Ok(Physical { handle, exportable: false })
    }

    /// The allocation that backs `ptr`, or None when `ptr` is not VMM memory.
    pub fn retain(ptr: CUdeviceptr) -> Option<Physical> {
        let mut handle = 0;
        // SAFETY: valid out-pointer; the driver checks the address.
        let rc = unsafe { sys::cuMemRetainAllocationHandle(&mut handle, ptr as *mut c_void) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return None;
        }
        // SAFETY: valid out-pointer and a live handle.
        let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer and a live handle.
        let rc = unsafe { sys::cuMemGetAllocationPropertiesFromHandle(&mut p, handle) };
        let exportable = rc == sys::CUresult::CUDA_SUCCESS
            && p.requestedHandleTypes.0 & sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0
                != 0;
        Some(Physical { handle, exportable })
    }

    /// A file descriptor for this allocation, for a peer process to import.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        if !self.exportable {
            return Err(Error::InvalidUsage(
                "the memory was allocated without a shareable handle (the driver refused POSIX file descriptor \
                 handles), so it cannot be shared with other processes"
                    .into(),
            ));
        }
        let mut fd: i32 = -1;
        let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for this handle type the driver writes an int file descriptor.
        let rc = unsafe { sys::cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut c_void, self.handle, kind, 0) };
        check(rc, "cuMemExportToShareableHandle")?;
        // SAFETY: a fresh descriptor the driver opened for us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// A peer's allocation from a file descriptor it exported (duplicated into this process).
    pub fn import_fd(fd: &OwnedFd) -> Result<Physical> {
        use std::os::fd::AsRawFd;
        let mut handle = 0;
        let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for this handle type the driver takes the descriptor's value as the pointer.
        let rc =
            unsafe { sys::cuMemImportFromShareableHandle(&mut handle, fd.as_raw_fd() as usize as *mut c_void, kind) };
        check(rc, "cuMemImportFromShareableHandle")?;
        Ok(Physical { handle, exportable: true })
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        // SAFETY: the handle is live and released once; mappings keep their own reference.
        unsafe { sys::cuMemRelease(self.handle) };
    }
}

/// A reserved range of device addresses; freed on drop, after its mappings.
#[derive(Debug)]
pub struct VaRange {
    pub base: CUdeviceptr,
    pub size: usize,
}

impl VaRange {
    pub fn reserve(size: usize, align: usize) -> Result<VaRange> {
        let mut base = 0;
        // SAFETY: valid out-pointer.
        check(unsafe { sys::cuMemAddressReserve(&mut base, size, align, 0, 0) }, "cuMemAddressReserve")?;
        Ok(VaRange { base, size })
    }
}

impl Drop for VaRange {
    fn drop(&mut self) {
        // SAFETY: reserved by reserve() and freed once.
        unsafe { sys::cuMemAddressFree(self.base, self.size) };
    }
}

/// `size` bytes of a physical allocation mapped at `at` (inside a [`VaRange`]); unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    pub at: CUdeviceptr,
    pub size: usize,
}

impl Mapping {
    /// Maps `phys` at `at` and lets every device of `devs` read and write it.
    pub fn new(at: CUdeviceptr, size: usize, phys: &Physical, devs: &[i32]) -> Result<Mapping> {
        // SAFETY: `at..at+size` lies in a range the caller reserved; the handle is live.
        check(unsafe { sys::cuMemMap(at, size, 0, phys.handle, 0) }, "cuMemMap")?;
        let m = Mapping { at, size };
        let access: Vec<sys::CUmemAccessDesc> = devs
            .iter()
            .map(|&d| {
                // SAFETY: a plain C struct, all fields set below.
                let mut a: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
                a.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                a.location.id = d;
                a.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                a
            })
            .collect();
        // SAFETY: the range was just mapped; `access` holds `access.len()` descriptors.
        check(unsafe { sys::cuMemSetAccess(at, size, access.as_ptr(), access.len()) }, "cuMemSetAccess")?;
        Ok(m)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by new() and unmapped once.
        unsafe { sys::cuMemUnmap(self.at, self.size) };
    }
}

/// The base and size of the allocation (or mapping) that contains `ptr`.
pub fn address_range(ptr: CUdeviceptr) -> Result<(CUdeviceptr, usize)> {
    let (mut base, mut size) = (0, 0);
    // SAFETY: valid out-pointers; the driver checks the address.
    check(unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }, "cuMemGetAddressRange")?;
    Ok((base, size))
}

/// Devices that can access `dev`'s memory: `dev` itself and every peer with access.
pub fn accessing_devices(dev: i32) -> Result<Vec<i32>> {
    let mut devs = vec![dev];
    for d in 0..super::device_count()? {
        if d != dev && super::can_access_peer(d, dev)? {
            devs.push(d);
        }
    }
    Ok(devs)
}

/// Device memory of our own made with the VMM API (what ncclMemAlloc returns): a physical
/// allocation rounded up to the granularity, mapped at a range of its own for `dev` and every
/// device that can reach it, zeroed. Dropped in field order: unmap, release, free the range.
#[derive(Debug)]
pub struct Allocation {
    mapping: Mapping,
    pub phys: Physical,
    _va: VaRange,
}

impl Allocation {
    pub fn new(dev: i32, size: usize) -> Result<Allocation> {
        let g = granularity(dev)?;
        let size = size.max(1).div_ceil(g) * g;
        let phys = Physical::create(dev, size)?;
        let va = VaRange::reserve(size, g)?;
        let mapping = Mapping::new(va.base, size, &phys, &accessing_devices(dev)?)?;
        // SAFETY: the range was just mapped read-write for this device; the memset is synchronous.
        check(unsafe { sys::cuMemsetD8_v2(va.base, 0, size) }, "cuMemsetD8")?;
        Ok(Allocation { mapping, phys, _va: va })
    }

    pub fn ptr(&self) -> CUdeviceptr {
        self.mapping.at
    }

    pub fn size(&self) -> usize {
        self.mapping.size
    }
}
