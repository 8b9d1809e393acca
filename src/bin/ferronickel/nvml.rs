//! NVLink counts from NVML (`libnvidia-ml.so.1`, loaded at run time where the driver installed
//! it). Only the few calls `info` needs; any failure means "NVML cannot say" and the caller falls
//! back to the PCIe path.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};

type NvmlDevice = *mut c_void;
/// `nvmlReturn_t`; 0 is `NVML_SUCCESS`.
type Ret = c_int;

/// `nvmlPciInfo_t` as NVML lays it out.
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `NVML_NVLINK_MAX_LINKS`.
const MAX_LINKS: c_uint = 18;

type ByBusId = unsafe extern "C" fn(*const c_char, *mut NvmlDevice) -> Ret;
type LinkState = unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_int) -> Ret;
type LinkVersion = unsafe extern "C" fn(NvmlDevice, c_uint, *mut c_uint) -> Ret;
type RemotePci = unsafe extern "C" fn(NvmlDevice, c_uint, *mut PciInfo) -> Ret;

/// The loaded library's entry points (the library stays loaded for the process's life).
pub struct Nvml {
    by_bus_id: ByBusId,
    link_state: LinkState,
    link_version: LinkVersion,
    remote_pci: RemotePci,
}

impl Nvml {
    /// Loads and initialises NVML, or says why not.
    pub fn load() -> Result<Nvml, String> {
        let lib = c"libnvidia-ml.so.1";
        // SAFETY: dlopen with a valid C string; the handle is never closed.
        let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err("libnvidia-ml.so.1 not found".into());
        }
        let sym = |name: &str| -> Result<*mut c_void, String> {
            let c = CString::new(name).expect("no NUL in symbol names");
            // SAFETY: h is a live handle from dlopen, c a valid C string.
            let p = unsafe { libc::dlsym(h, c.as_ptr()) };
            if p.is_null() {
                Err(format!("libnvidia-ml.so.1 has no {name}"))
            } else {
                Ok(p)
            }
        };
        // SAFETY: each symbol is NVML's documented function of exactly this C signature.
        let init = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> Ret>(sym("nvmlInit_v2")?) };
        // SAFETY: as above.
        let nvml = unsafe {
            Nvml {
                by_bus_id: std::mem::transmute::<*mut c_void, ByBusId>(sym("nvmlDeviceGetHandleByPciBusId_v2")?),
                link_state: std::mem::transmute::<*mut c_void, LinkState>(sym("nvmlDeviceGetNvLinkState")?),
                link_version: std::mem::transmute::<*mut c_void, LinkVersion>(sym("nvmlDeviceGetNvLinkVersion")?),
                remote_pci: std::mem::transmute::<*mut c_void, RemotePci>(sym("nvmlDeviceGetNvLinkRemotePciInfo_v2")?),
            }
        };
        // SAFETY: nvmlInit_v2 takes no arguments; calling it more than once is allowed.
        match unsafe { init() } {
            0 => Ok(nvml),
            r => Err(format!("nvmlInit_v2 failed (nvmlReturn_t {r})")),
        }
    }

    /// Active NVLinks from GPU `a` to GPU `b` (CUDA bus ids) and the NVLink version NVML reports
    /// for them; `None` when NVML does not know GPU `a`.
    pub fn nvlinks(&self, a: &str, b: &str) -> Option<(u32, Option<u32>)> {
        let target = parse_bus_id(b)?;
        let c = CString::new(a).ok()?;
        let mut dev: NvmlDevice = std::ptr::null_mut();
        // SAFETY: c is a valid C string, dev a valid out-pointer.
        if unsafe { (self.by_bus_id)(c.as_ptr(), &mut dev) } != 0 {
            return None;
        }
        let (mut count, mut version) = (0, None);
        for link in 0..MAX_LINKS {
            let mut active: c_int = 0;
            // SAFETY: dev is a handle NVML returned, active a valid out-pointer.
            if unsafe { (self.link_state)(dev, link, &mut active) } != 0 || active == 0 {
                continue;
            }
            // SAFETY: all-zero is a valid PciInfo (integers and char arrays).
            let mut pci: PciInfo = unsafe { std::mem::zeroed() };
            // SAFETY: pci is a valid out-pointer of NVML's layout.
            if unsafe { (self.remote_pci)(dev, link, &mut pci) } != 0 || (pci.domain, pci.bus, pci.device) != target {
                continue;
            }
            count += 1;
            let mut v: c_uint = 0;
            // SAFETY: valid out-pointer.
            if unsafe { (self.link_version)(dev, link, &mut v) } == 0 {
                version = Some(v);
            }
        }
        Some((count, version))
    }
}

/// `0000:1B:00.0` (or NVML's 8-digit domain) -> (domain, bus, device).
fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let mut it = s.split([':', '.']);
    let domain = u32::from_str_radix(it.next()?, 16).ok()?;
    let bus = u32::from_str_radix(it.next()?, 16).ok()?;
    let device = u32::from_str_radix(it.next()?, 16).ok()?;
    Some((domain, bus, device))
}

#[cfg(test)]
mod tests {
    #[test]
    fn bus_ids() {
        assert_eq!(super::parse_bus_id("0000:1B:00.0"), Some((0, 0x1b, 0)));
        assert_eq!(super::parse_bus_id("00000001:c3:1f.0"), Some((1, 0xc3, 0x1f)));
        assert_eq!(super::parse_bus_id("nonsense"), None);
    }
}
