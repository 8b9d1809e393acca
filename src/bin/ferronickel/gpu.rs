//! The local GPUs as the CUDA driver, NVML and sysfs describe them.
//!
//! Everything goes through `nccl::cuda::init` first: it probes for `libcuda.so.1` with dlopen
//! before any cudarc call (cudarc panics without the library), so a machine without a driver
//! gets an error to print instead of a crash.

use cudarc::driver::sys::{self, CUdevice_attribute};
use nccl::cuda;
use serde_json::{json, Value};
use std::ffi::CStr;

/// One GPU.
pub struct Gpu {
    pub ordinal: i32,
    pub name: String,
    /// As CUDA spells it: `0000:1B:00.0`.
    pub bus_id: String,
    pub numa_node: Option<i32>,
    /// The CPUs near it, which a communicator on it binds its setup and threads to (within the
    /// caller's own affinity; `nccl::affinity`).
    pub near_cpus: Option<String>,
    pub memory_bytes: usize,
    pub compute_capability: (i32, i32),
}

impl Gpu {
    pub fn json(&self) -> Value {
        json!({
            "ordinal": self.ordinal,
            "name": self.name,
            "bus_id": self.bus_id,
            "numa_node": self.numa_node,
            "near_cpus": self.near_cpus,
            "memory_bytes": self.memory_bytes,
            "compute_capability": format!("{}.{}", self.compute_capability.0, self.compute_capability.1),
        })
    }
}

/// The driver's GPUs, or why there are none (no libcuda, cuInit failing, no device).
pub fn probe() -> Result<Vec<Gpu>, String> {
    cuda::init().map_err(|e| e.to_string())?;
    let n = cuda::device_count().map_err(|e| e.to_string())?;
    (0..n).map(describe).collect::<nccl::error::Result<_>>().map_err(|e| e.to_string())
}

fn describe(dev: i32) -> nccl::error::Result<Gpu> {
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer is writable for the length passed; the driver NUL-terminates.
    cuda::check(unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) }, "cuDeviceGetName")?;
    let mut memory_bytes = 0usize;
    // SAFETY: valid out-pointer.
    cuda::check(unsafe { sys::cuDeviceTotalMem_v2(&mut memory_bytes, dev) }, "cuDeviceTotalMem")?;
    let attr = |a: CUdevice_attribute| -> nccl::error::Result<i32> {
        let mut v = 0;
        // SAFETY: valid out-pointer, a valid device ordinal.
        cuda::check(unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) }, "cuDeviceGetAttribute")?;
        Ok(v)
    };
    let bus_id = cuda::pci_bus_id(dev)?;
    Ok(Gpu {
        ordinal: dev,
        // SAFETY: NUL-terminated by the driver within the buffer.
        name: unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned(),
        numa_node: numa_node(&bus_id),
        near_cpus: nccl::affinity::near_gpu(std::path::Path::new("/sys"), &bus_id).map(|s| s.to_string()),
        memory_bytes,
        compute_capability: (
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        bus_id,
    })
}

/// The driver's CUDA version (e.g. 13000), after a successful [`probe`].
pub fn driver_version() -> Option<i32> {
    let mut v = 0;
    // SAFETY: valid out-pointer; only called once the driver is loaded.
    cuda::check(unsafe { sys::cuDriverGetVersion(&mut v) }, "cuDriverGetVersion").ok().map(|_| v)
}

/// `13000` -> `13.0`.
pub fn version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The sysfs directory of a GPU's PCI device.
fn sysfs_dir(bus_id: &str) -> std::path::PathBuf {
    nccl::affinity::pci_dir(std::path::Path::new("/sys"), bus_id)
}

fn numa_node(bus_id: &str) -> Option<i32> {
    let v: i32 = std::fs::read_to_string(sysfs_dir(bus_id).join("numa_node")).ok()?.trim().parse().ok()?;
    (v >= 0).then_some(v)
}

/// `cuDeviceCanAccessPeer` for every ordered pair (a GPU can always reach itself).
pub fn p2p_matrix(gpus: &[Gpu]) -> Vec<Vec<bool>> {
    gpus.iter()
        .map(|a| {
            gpus.iter()
                .map(|b| a.ordinal == b.ordinal || cuda::can_access_peer(a.ordinal, b.ordinal).unwrap_or(false))
                .collect()
        })
        .collect()
}

/// How two GPUs are connected.
pub struct Link {
    /// Active NVLinks between them, from NVML; `None` when NVML is absent or cannot say.
    pub nvlinks: Option<(u32, Option<u32>)>,
    /// The driver's fallback hint when NVML cannot say: whether P2P atomics are native, which
    /// NVLink provides and PCIe between GPUs does not.
    pub native_atomics: Option<bool>,
    /// The PCIe path between them from sysfs, NCCL's names (PIX, PXB, PHB, SYS) and the bridges.
    pub pcie: String,
}

impl Link {
    pub fn summary(&self) -> String {
        match (self.nvlinks, self.native_atomics) {
            (Some((n, v)), _) if n > 0 => {
                let gen = v.map(|v| format!(", NVML NVLink version {v}")).unwrap_or_default();
                format!("NV{n} ({n} NVLinks{gen}); PCIe {}", self.pcie)
            }
            (None, Some(true)) => {
                format!("NVLink likely (native P2P atomics; count unknown without NVML); PCIe {}", self.pcie)
            }
            _ => format!("PCIe {}", self.pcie),
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "nvlinks": self.nvlinks.map(|(n, _)| n),
            "nvlink_version": self.nvlinks.and_then(|(_, v)| v),
            "native_p2p_atomics": self.native_atomics,
            "pcie": self.pcie,
        })
    }
}

/// The link between two GPUs: NVLink counts from NVML where present (else the driver's hint),
/// the PCIe path from sysfs.
pub fn link(nvml: Option<&crate::nvml::Nvml>, a: &Gpu, b: &Gpu) -> Link {
    let mut atomics = 0;
    let attr = sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED;
    // SAFETY: valid out-pointer and device ordinals.
    let res = unsafe { sys::cuDeviceGetP2PAttribute(&mut atomics, attr, a.ordinal, b.ordinal) };
    Link {
        nvlinks: nvml.and_then(|n| n.nvlinks(&a.bus_id, &b.bus_id)),
        native_atomics: cuda::check(res, "cuDeviceGetP2PAttribute").ok().map(|_| atomics != 0),
        pcie: pcie_path(a, b),
    }
}

/// Where two devices' PCIe paths meet, from the sysfs device tree
/// (`/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/…`): the fewer bridges between them,
/// the closer. Named as `nvidia-smi topo -m` names them (PIX and PXB are not told apart).
fn pcie_path(a: &Gpu, b: &Gpu) -> String {
    let chain = |g: &Gpu| -> Option<Vec<String>> {
        let real = std::fs::canonicalize(sysfs_dir(&g.bus_id)).ok()?;
        Some(
            real.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .filter(|c| c.starts_with("pci") || c.contains(':'))
                .collect(),
        )
    };
    let (Some(ca), Some(cb)) = (chain(a), chain(b)) else {
        return "path unknown (no sysfs entry for the bus ids)".into();
    };
    let common = ca.iter().zip(&cb).take_while(|(x, y)| x == y).count();
    let hops = (ca.len() - common) + (cb.len() - common);
    match common {
        0 if a.numa_node != b.numa_node => {
            format!("SYS (different CPU sockets, NUMA {:?} and {:?})", a.numa_node, b.numa_node)
        }
        0 => "PHB (different PCIe host bridges of one CPU)".into(),
        1 => "PHB (through the CPU's PCIe host bridge)".into(),
        _ => format!("PIX/PXB (through PCIe switches, {hops} hops, meeting at {})", ca[common - 1]),
    }
}

/// How long `topo` and `perf` wait for one step of GPU work before giving up.
pub const STEP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Polls `query` (cuStreamQuery, cuEventQuery) until the work is done, failing with `what` if it
/// errs or is still running after [`STEP_DEADLINE`].
pub fn wait_done(what: &str, query: impl Fn() -> sys::CUresult) -> Result<(), String> {
    let deadline = std::time::Instant::now() + STEP_DEADLINE;
    loop {
        match query() {
            sys::CUresult::CUDA_SUCCESS => return Ok(()),
            sys::CUresult::CUDA_ERROR_NOT_READY if std::time::Instant::now() < deadline => std::thread::yield_now(),
            sys::CUresult::CUDA_ERROR_NOT_READY => {
                return Err(format!("{what} did not finish within {} s", STEP_DEADLINE.as_secs()))
            }
            r => return cuda::check(r, what).map_err(|e| e.to_string()),
        }
    }
}

/// A stream of the current context, destroyed on drop.
pub struct Stream(pub sys::CUstream);

impl Stream {
    pub fn new() -> Result<Stream, String> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        // Non-blocking: no implicit ordering with the legacy default stream.
        // SAFETY: valid out-pointer; the caller has a context current.
        let rc = unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) };
        cuda::check(rc, "cuStreamCreate").map_err(|e| e.to_string())?;
        Ok(Stream(s))
    }

    pub fn wait(&self, what: &str) -> Result<(), String> {
        // SAFETY: the stream is live until drop.
        wait_done(what, || unsafe { sys::cuStreamQuery(self.0) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by cuStreamCreate, destroyed once.
        unsafe { sys::cuStreamDestroy_v2(self.0) };
    }
}

/// Maps a library error to the command's error text.
pub fn err(e: nccl::error::Error) -> String {
    e.to_string()
}
