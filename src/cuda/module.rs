//! The kernels compiled by build.rs and the one table that names them. build.rs generates the
//! device translation units and this table from the same list, so a kernel the host can ask for
//! exists on the device by construction (the tests below also read the fatbins). A launch names
//! its kernel by [`KernelId`]; the `CUfunction` comes from a per-device table indexed by that id,
//! filled lazily: a unit's module is loaded on its device the first time one of its kernels is
//! needed, so communicator init pays nothing for them.

use super::check;
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUfunction, CUmodule};
use parking_lot::Mutex;
use std::ffi::CStr;
use std::sync::OnceLock;

/// A kernel of the generated list: its name and the index of its unit in `UNITS`.
pub struct KernelDef {
    pub name: &'static CStr,
    pub unit: usize,
}

include!(concat!(env!("OUT_DIR"), "/kernel_table.rs"));

/// Which kernel a launch runs: an index into the generated kernel list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelId(u16);

impl KernelId {
    /// The pure data-movement kernel (broadcast, all-gather, send/recv).
    pub const COPY: KernelId = KernelId(COPY);

    /// The kernel reducing `dtype` (fnDataType) with `op` (fnRedOp), or None where none is
    /// compiled (SumPostDiv exists for integers only).
    pub fn coll(dtype: u32, op: u32) -> Option<KernelId> {
        let id = *COLL.get(dtype as usize)?.get(op as usize)?;
        (id != NO_KERNEL).then_some(KernelId(id))
    }

    fn def(self) -> &'static KernelDef {
        &KERNELS[self.0 as usize]
    }

    pub fn name(self) -> &'static str {
        self.def().name.to_str().expect("kernel names are ASCII")
    }
}

impl std::fmt::Display for KernelId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A kernel handle; valid in the context it was loaded in, for the life of the process.
#[derive(Clone, Copy, Debug)]
pub struct Kernel(pub CUfunction);

// SAFETY: CUfunction handles are immutable driver objects usable from any thread.
unsafe impl Send for Kernel {}
// SAFETY: as above; nothing mutates through a shared handle.
unsafe impl Sync for Kernel {}

struct Module(CUmodule);
// SAFETY: module handles are usable from any thread; we never unload them.
unsafe impl Send for Module {}
// SAFETY: as above; only the driver reads them.
unsafe impl Sync for Module {}

/// One device's modules (per unit) and kernels (per id), each set once, never unloaded.
struct DeviceKernels {
    modules: [OnceLock<Module>; NUM_UNITS],
    kernels: [OnceLock<Kernel>; NUM_KERNELS],
}

impl DeviceKernels {
    fn new() -> DeviceKernels {
        DeviceKernels {
            modules: [const { OnceLock::new() }; NUM_UNITS],
            kernels: [const { OnceLock::new() }; NUM_KERNELS],
        }
    }
}

/// Per device ordinal; sized by the device count at the first lookup.
static DEVICES: OnceLock<Box<[OnceLock<DeviceKernels>]>> = OnceLock::new();
/// Held only while loading (the slow path), so two threads never load the same code twice.
static LOADING: Mutex<()> = Mutex::new(());

fn device(dev: i32) -> Result<&'static DeviceKernels> {
    let devices = match DEVICES.get() {
        Some(d) => d,
        None => {
            let mut n = 0;
            // SAFETY: valid out-pointer.
            check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
            DEVICES.get_or_init(|| (0..n.max(0)).map(|_| OnceLock::new()).collect())
        }
    };
    let slot = usize::try_from(dev)
        .ok()
        .and_then(|d| devices.get(d))
        .ok_or_else(|| Error::Internal(format!("device {dev} is not one of the {} devices", devices.len())))?;
    Ok(slot.get_or_init(DeviceKernels::new))
}

/// Switches the calling thread to relaxed stream-capture mode while it lives: loading code, and
/// the allocations and copies of a connection made on first use, are not allowed while a stream of
/// the context is being captured in global mode, and both may be first needed inside a user's
/// CUDA-graph capture.
pub struct RelaxedCapture(sys::CUstreamCaptureMode);

impl RelaxedCapture {
    pub fn new() -> Result<RelaxedCapture> {
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

/// The kernel `id` on `dev`, whose primary context must be current. Once loaded this is two
/// atomic loads and an index. The first time, its unit's module is loaded and the kernel's code
/// too, not at its first launch: with CUDA's lazy loading a load can wait for the device to go
/// idle, which a kernel spinning on a peer never does.
pub fn kernel(dev: i32, id: KernelId) -> Result<Kernel> {
    let d = device(dev)?;
    let slot = &d.kernels[id.0 as usize];
    if let Some(k) = slot.get() {
        return Ok(*k);
    }
    let _loading = LOADING.lock();
    if let Some(k) = slot.get() {
        return Ok(*k);
    }
    let _relaxed = RelaxedCapture::new()?;
    let def = id.def();
    let (unit, image, _) = UNITS[def.unit];
    let module = match d.modules[def.unit].get() {
        Some(m) => m.0,
        None => {
            let mut m: CUmodule = std::ptr::null_mut();
            // SAFETY: image is a fatbin embedded at build time; the device's context is current.
            check(unsafe { sys::cuModuleLoadData(&mut m, image.as_ptr() as *const _) }, "cuModuleLoadData")
                .map_err(|e| e.context(&format!("loading kernel unit {unit} on device {dev}")))?;
            crate::nccl_info!(crate::debug::Subsys::INIT, "Loaded kernel unit {unit} on device {dev}");
            // Set under LOADING, so the cell was empty.
            let _ = d.modules[def.unit].set(Module(m));
            m
        }
    };
    let mut f: CUfunction = std::ptr::null_mut();
    // SAFETY: module is loaded; f a valid out-pointer; the name is NUL-terminated.
    check(unsafe { sys::cuModuleGetFunction(&mut f, module, def.name.as_ptr()) }, "cuModuleGetFunction")
        .map_err(|e| e.context(&format!("kernel {id} is not in the fatbin of kernel unit {unit}")))?;
    // SAFETY: f is a function of a loaded module.
    check(unsafe { sys::cuFuncLoad(f) }, "cuFuncLoad").map_err(|e| e.context(id.name()))?;
    let _ = slot.set(Kernel(f));
    Ok(Kernel(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi;
    use crate::types;
    use std::collections::HashSet;
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// Every `FN_*_KERNEL(name, ...)` line of a generated unit: (name, its arguments after it).
    fn defined(source: &str) -> Vec<(String, Vec<String>)> {
        source
            .lines()
            .filter_map(|l| l.strip_prefix("FN_COLL_KERNEL(").or_else(|| l.strip_prefix("FN_COPY_KERNEL(")))
            .map(|rest| {
                let mut args = rest.trim_end_matches(')').split(',').map(|a| a.trim().to_string());
                (args.next().unwrap(), args.collect())
            })
            .collect()
    }

    /// The device enums by name, as bindgen read them from `kernels/device_abi.h`.
    fn enum_value(name: &str) -> u32 {
        let all = [
            ("FN_INT8", abi::FN_INT8),
            ("FN_UINT8", abi::FN_UINT8),
            ("FN_INT32", abi::FN_INT32),
            ("FN_UINT32", abi::FN_UINT32),
            ("FN_INT64", abi::FN_INT64),
            ("FN_UINT64", abi::FN_UINT64),
            ("FN_FLOAT16", abi::FN_FLOAT16),
            ("FN_FLOAT32", abi::FN_FLOAT32),
            ("FN_FLOAT64", abi::FN_FLOAT64),
            ("FN_BFLOAT16", abi::FN_BFLOAT16),
            ("FN_FP8E4M3", abi::FN_FP8E4M3),
            ("FN_FP8E5M2", abi::FN_FP8E5M2),
            ("FN_OP_SUM", abi::FN_OP_SUM),
            ("FN_OP_PROD", abi::FN_OP_PROD),
            ("FN_OP_MAX", abi::FN_OP_MAX),
            ("FN_OP_MIN", abi::FN_OP_MIN),
            ("FN_OP_PREMULSUM", abi::FN_OP_PREMULSUM),
            ("FN_OP_SUMPOSTDIV", abi::FN_OP_SUMPOSTDIV),
        ];
        all.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("unknown device enum {name}")).1
    }

    #[test]
    fn every_unit_defines_exactly_its_listed_kernels_once() {
        let mut names = HashSet::new();
        for (u, (unit, _, source)) in UNITS.iter().enumerate() {
            let listed: HashSet<&str> =
                KERNELS.iter().filter(|k| k.unit == u).map(|k| k.name.to_str().unwrap()).collect();
            let defs = defined(source);
            let in_source: HashSet<&str> = defs.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(in_source.len(), defs.len(), "unit {unit} defines a kernel twice");
            assert_eq!(listed, in_source, "unit {unit}: table and generated source disagree");
            assert!(!listed.is_empty(), "unit {unit} has no kernels");
        }
        for k in &KERNELS {
            assert!(names.insert(k.name), "kernel {:?} is listed twice", k.name);
        }
        assert_eq!(KernelId::COPY.name(), "fnCopy");
    }

    /// Every reduction the API can enqueue (`api/coll.rs` maps NCCL's ops onto these) resolves
    /// to a kernel defined with that op on that data type, or on its same-width signed twin for
    /// the operators whose bits do not depend on the sign.
    #[test]
    fn every_reduction_the_host_asks_for_has_its_kernel() {
        let ops = [
            abi::FN_OP_SUM,
            abi::FN_OP_PROD,
            abi::FN_OP_MAX,
            abi::FN_OP_MIN,
            abi::FN_OP_PREMULSUM,
            abi::FN_OP_SUMPOSTDIV,
        ];
        let mut seen = 0;
        for dt in 0..types::ncclNumTypes {
            let is_int = !types::dtype_is_float(dt);
            for &op in &ops {
                let id = KernelId::coll(dt as u32, op);
                if op == abi::FN_OP_SUMPOSTDIV && !is_int {
                    assert!(id.is_none(), "{} has no integer average", types::dtype_name(dt));
                    continue;
                }
                let id = id.unwrap_or_else(|| panic!("no kernel for {} op {op}", types::dtype_name(dt)));
                let (_, _, source) = UNITS[id.def().unit];
                let (_, args) = defined(source).into_iter().find(|(n, _)| n == id.name()).expect("defined in its unit");
                let (kdt, kop) = (enum_value(&args[0]), enum_value(&args[1]));
                assert_eq!(kop, op, "{id} runs the wrong operator");
                if kdt != dt as u32 {
                    let sign_blind = [abi::FN_OP_SUM, abi::FN_OP_PROD, abi::FN_OP_PREMULSUM].contains(&op);
                    let same_width = types::dtype_size(kdt as i32) == types::dtype_size(dt);
                    assert!(
                        is_int && !types::dtype_is_float(kdt as i32) && same_width && sign_blind,
                        "{} op {op} runs {id}, which is for another type",
                        types::dtype_name(dt)
                    );
                }
                seen += 1;
            }
        }
        assert_eq!(seen, 12 * 5 + 6);
        assert_eq!(KernelId::coll(types::ncclNumTypes as u32, abi::FN_OP_SUM), None);
        assert_eq!(KernelId::coll(abi::FN_FLOAT32, abi::FN_NUM_OPS), None);
    }

    /// Runs `cmd` with `input` on stdin, killed after `limit`.
    fn run_with_input(mut cmd: Command, input: &[u8], limit: Duration) -> Vec<u8> {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap_or_else(|e| {
            panic!("could not run {cmd:?} ({e}); install it: bash scripts/setup-deps.sh (apt-get install zstd)")
        });
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let input = input.to_vec();
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            stdout.read_to_end(&mut out).map(|_| out)
        });
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{cmd:?} did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        writer.join().unwrap().expect("writing to the decompressor");
        let out = reader.join().unwrap().expect("reading the decompressor");
        assert!(status.success(), "{cmd:?} failed: {status}");
        out
    }

    /// The images of a fatbin (nvcc's container: a 16-byte header, then images each with its own
    /// header): (kind, arch, contents), decompressed. Kind 1 is PTX, 2 is an ELF cubin.
    fn fatbin_images(unit: &str, fatbin: &[u8]) -> Vec<(u16, u32, Vec<u8>)> {
        let u16_at = |o: usize| u16::from_le_bytes(fatbin[o..o + 2].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(fatbin[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(fatbin[o..o + 8].try_into().unwrap()) as usize;
        assert_eq!(u32_at(0), 0xba55_ed50, "unit {unit}: not a fatbin");
        let (start, size) = (usize::from(u16_at(6)), u64_at(8));
        assert!(start + size <= fatbin.len(), "unit {unit}: fatbin truncated");
        let mut images = Vec::new();
        let mut off = start;
        while off < start + size {
            let (kind, header, payload) = (u16_at(off), u32_at(off + 4) as usize, u64_at(off + 8));
            let arch = u32_at(off + 28);
            let body = &fatbin[off + header..off + header + payload];
            let data = if body.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
                // zstd-compressed (nvcc does so for large images): its length without padding.
                let packed = u32_at(off + 16) as usize;
                assert!(packed <= payload, "unit {unit}: compressed length past its image");
                let mut zstd = Command::new("zstd");
                zstd.args(["-d", "-c", "-q"]);
                run_with_input(zstd, &body[..packed], Duration::from_secs(120))
            } else {
                body.to_vec()
            };
            images.push((kind, arch, data));
            off += header + payload;
        }
        images
    }

    /// Reads the embedded fatbins: each holds SASS for every architecture built and PTX for the
    /// oldest (the one they are all compiled from), and every kernel of its unit is in each of
    /// them (a missing kernel fails here, not on a GPU).
    #[test]
    fn fatbins_hold_every_kernel_for_every_architecture() {
        for (u, (unit, fatbin, _)) in UNITS.iter().enumerate() {
            let images = fatbin_images(unit, fatbin);
            let archs = |kind| {
                let mut a: Vec<u32> = images.iter().filter(|i| i.0 == kind).map(|i| i.1).collect();
                a.sort_unstable();
                a
            };
            let (sass, ptx) = (archs(2), archs(1));
            assert_eq!(sass, UNIT_ARCHS[u].0, "unit {unit}: SASS architectures");
            assert_eq!(ptx, UNIT_ARCHS[u].1, "unit {unit}: PTX architectures");
            for (kind, arch, data) in &images {
                // A cubin's string tables hold the names NUL-terminated; PTX declares `.entry name(`.
                let strings: HashSet<&[u8]> = data.split(|&b| b == 0).collect();
                let ptx = String::from_utf8_lossy(data);
                for k in KERNELS.iter().filter(|k| k.unit == u) {
                    let name = k.name.to_str().unwrap();
                    let found = match kind {
                        2 => strings.contains(name.as_bytes()),
                        _ => ptx.contains(&format!(".entry {name}(")),
                    };
                    assert!(
                        found,
                        "unit {unit}: kernel {name} is missing from its {} image for {arch}",
                        ["", "PTX", "SASS"][*kind as usize]
                    );
                }
            }
        }
    }
}
