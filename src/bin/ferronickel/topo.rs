//! `ferronickel topo --measure`: P2P bandwidth and latency between the local GPUs, like the CUDA
//! samples' p2pBandwidthLatencyTest. Row `i`, column `j` moves data from GPU `i` to GPU `j`:
//! - copy engines: `cuMemcpyAsync` issued on GPU `i`;
//! - SM copies: a kernel on GPU `i` that reads its own memory and stores into GPU `j`'s (the
//!   way ferronickel's kernels push data);
//! - one direction, and both at once (GPU `j` moving the same amount back on its own stream);
//! - latency: the time per 16-byte copy or one-thread kernel in a chain of many, launch included.
//!
//! With one GPU it measures the device-to-itself row. Pairs without P2P access show `n/a`.

use crate::args::TopoArgs;
use crate::gpu::{self, err, Stream};
use crate::{CmdResult, Report};
use cudarc::driver::sys::{self, CUdevice_attribute, CUevent, CUfunction, CUmodule, CUstream};
use nccl::cuda::{self, Context, DeviceBuffer};
use serde_json::{json, Value};
use std::ffi::c_void;
use std::fmt::Write;

/// `fn_copy(dst, src, n16)`: 16-byte vectors, grid-stride. Hand-written PTX (ISA 8.0, sm_80),
/// which every driver since CUDA 12.0 JIT-compiles for its GPU, so this binary needs no nvcc.
const COPY_PTX: &str = "\
.version 8.0
.target sm_80
.address_size 64
.visible .entry fn_copy(.param .u64 dst, .param .u64 src, .param .u64 n16)
{
    .reg .pred %p;
    .reg .b32 %r<9>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u64 %rd3, [n16];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
LOOP:
    setp.ge.u64 %p, %rd4, %rd3;
    @%p bra DONE;
    shl.b64 %rd7, %rd4, 4;
    add.u64 %rd8, %rd2, %rd7;
    add.u64 %rd9, %rd1, %rd7;
    ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd8];
    st.global.v4.u32 [%rd9], {%r5, %r6, %r7, %r8};
    add.u64 %rd4, %rd4, %rd6;
    bra LOOP;
DONE:
    ret;
}
\0";

/// Figures by (from, to) GPU; `None` where the pair has no P2P access.
type Matrix = Vec<Vec<Option<f64>>>;

/// Copies (or kernels) chained per latency figure.
const LATENCY_OPS: usize = 1000;

/// A CUDA event that records timing, destroyed on drop.
struct Event(CUevent);

impl Event {
    fn new() -> Result<Event, String> {
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current. Flags 0: timing enabled.
        cuda::check(unsafe { sys::cuEventCreate(&mut e, 0) }, "cuEventCreate").map_err(err)?;
        Ok(Event(e))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once.
        unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// A loaded module, unloaded on drop (its context must still be alive then).
struct Module(CUmodule);

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by cuModuleLoadData, unloaded once.
        unsafe { sys::cuModuleUnload(self.0) };
    }
}

/// One GPU's measuring kit. Fields drop in order, so everything goes before the context.
struct Dev {
    ordinal: i32,
    streams: [Stream; 2],
    start: Event,
    stop: Event,
    src: DeviceBuffer,
    dst: DeviceBuffer,
    func: CUfunction,
    _module: Module,
    sms: u32,
    ctx: Context,
}

impl Dev {
    fn new(ordinal: i32, bytes: usize) -> Result<Dev, String> {
        // Two retains of the primary context: one entered while building, one kept in the Dev.
        let building = cuda::primary_context(ordinal).map_err(err)?;
        let _g = building.enter().map_err(err)?;
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: COPY_PTX is a NUL-terminated PTX image; valid out-pointer.
        let rc = unsafe { sys::cuModuleLoadData(&mut raw, COPY_PTX.as_ptr() as *const c_void) };
        cuda::check(rc, "cuModuleLoadData (PTX)").map_err(err)?;
        let module = Module(raw);
        let mut func: CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; the name is NUL-terminated.
        let rc = unsafe { sys::cuModuleGetFunction(&mut func, module.0, c"fn_copy".as_ptr()) };
        cuda::check(rc, "cuModuleGetFunction").map_err(err)?;
        let mut sms = 0;
        let attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
        // SAFETY: valid out-pointer and device ordinal.
        cuda::check(unsafe { sys::cuDeviceGetAttribute(&mut sms, attr, ordinal) }, "cuDeviceGetAttribute")
            .map_err(err)?;
        Ok(Dev {
            ordinal,
            streams: [Stream::new()?, Stream::new()?],
            start: Event::new()?,
            stop: Event::new()?,
            src: DeviceBuffer::zeroed(bytes).map_err(err)?,
            dst: DeviceBuffer::zeroed(bytes).map_err(err)?,
            func,
            _module: module,
            sms: sms.max(1) as u32,
            ctx: cuda::primary_context(ordinal).map_err(err)?,
        })
    }

    /// Queues `ops` copies of `bytes` from our `src` to `dst` on our stream `s`.
    fn copies(&self, s: usize, dst: u64, bytes: usize, ops: usize, engine: bool) -> Result<(), String> {
        let _g = self.ctx.enter().map_err(err)?;
        let stream = self.streams[s].0;
        for _ in 0..ops {
            if engine {
                // SAFETY: `src` is our device buffer of at least `bytes`, and every `dst` a caller
                // passes is a device buffer of at least `bytes` (the measured pairs' buffers).
                unsafe { cuda::memcpy_async(dst, self.src.ptr, bytes, stream) }.map_err(err)?;
            } else {
                let (mut d, mut sp, mut n16) = (dst, self.src.ptr, (bytes / 16) as u64);
                let mut params = [
                    &mut d as *mut u64 as *mut c_void,
                    &mut sp as *mut u64 as *mut c_void,
                    &mut n16 as *mut u64 as *mut c_void,
                ];
                // A single thread for latency, two 512-thread CTAs per SM for bandwidth.
                let (grid, block) = if bytes <= 16 { (1, 1) } else { (2 * self.sms, 512) };
                // SAFETY: func takes three u64 parameters, `params` points at three live u64s;
                // dst and src are device buffers of at least `bytes` bytes reachable from here
                // (our own, or a peer's with peer access enabled).
                let r = unsafe {
                    sys::cuLaunchKernel(
                        self.func,
                        grid,
                        1,
                        1,
                        block,
                        1,
                        1,
                        0,
                        stream,
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                };
                cuda::check(r, "cuLaunchKernel (fn_copy)").map_err(err)?;
            }
        }
        Ok(())
    }

    fn record(&self, ev: &Event, s: usize) -> Result<(), String> {
        let _g = self.ctx.enter().map_err(err)?;
        // SAFETY: event and stream are live and of this context.
        cuda::check(unsafe { sys::cuEventRecord(ev.0, self.streams[s].0) }, "cuEventRecord").map_err(err)
    }
}

fn stream_wait(stream: CUstream, ev: &Event) -> Result<(), String> {
    // SAFETY: live stream and event (events may come from another context).
    cuda::check(unsafe { sys::cuStreamWaitEvent(stream, ev.0, 0) }, "cuStreamWaitEvent").map_err(err)
}

/// Milliseconds from `a.start` to `a.stop`, once `a.stop` has completed.
fn elapsed_ms(a: &Dev) -> Result<f64, String> {
    // SAFETY: live event.
    gpu::wait_done(&format!("GPU {}'s measurement", a.ordinal), || unsafe { sys::cuEventQuery(a.stop.0) })?;
    let mut ms = 0f32;
    // SAFETY: both events recorded and complete; valid out-pointer.
    cuda::check(unsafe { sys::cuEventElapsedTime_v2(&mut ms, a.start.0, a.stop.0) }, "cuEventElapsedTime")
        .map_err(err)?;
    Ok(ms as f64)
}

/// Time of `ops` transfers of `bytes` from `a` to `b` and, if `both`, as many from `b` to `a`
/// at the same time (on `b`'s second stream, so that `a == b` works too).
fn run_pair(a: &Dev, b: &Dev, bytes: usize, ops: usize, engine: bool, both: bool) -> Result<f64, String> {
    a.record(&a.start, 0)?;
    if both {
        stream_wait(b.streams[1].0, &a.start)?;
        b.copies(1, a.dst.ptr, bytes, ops, engine)?;
        b.record(&b.stop, 1)?;
        stream_wait(a.streams[0].0, &b.stop)?;
    }
    a.copies(0, b.dst.ptr, bytes, ops, engine)?;
    a.record(&a.stop, 0)?;
    elapsed_ms(a)
}

pub fn run(args: TopoArgs) -> CmdResult {
    let TopoArgs { measure, bytes, iters } = args;
    let bytes = bytes / 16 * 16;
    if !measure {
        return Err("topo needs --measure (the static topology, links and P2P access are in `ferronickel info`)".into());
    }
    if !(16..=4 << 30).contains(&bytes) || iters > 10_000 {
        return Err("need 16 <= --bytes <= 4G and --iters <= 10000".into());
    }
    let gpus = gpu::probe().map_err(|e| format!("topo --measure needs a GPU: {e}"))?;
    let access = gpu::p2p_matrix(&gpus);
    let devs: Vec<Dev> = gpus.iter().map(|g| Dev::new(g.ordinal, bytes)).collect::<Result<_, _>>()?;
    for (i, a) in devs.iter().enumerate() {
        let _g = a.ctx.enter().map_err(err)?;
        for (j, b) in devs.iter().enumerate() {
            if i != j && access[i][j] {
                cuda::enable_peer_access(&b.ctx).map_err(err)?;
            }
        }
    }
    let matrix = |f: &dyn Fn(&Dev, &Dev) -> Result<f64, String>| -> Result<Matrix, String> {
        devs.iter()
            .enumerate()
            .map(|(i, a)| {
                devs.iter().enumerate().map(|(j, b)| if access[i][j] { f(a, b).map(Some) } else { Ok(None) }).collect()
            })
            .collect()
    };
    // Warm up every pair once: the first copies and launches map memory and settle clocks.
    matrix(&|a, b| run_pair(a, b, bytes, 1, false, true).and_then(|_| run_pair(a, b, bytes, 1, true, true)))?;
    let gbps = |engine: bool, both: bool| {
        let moved = (bytes * iters * if both { 2 } else { 1 }) as f64;
        matrix(&|a, b| run_pair(a, b, bytes, iters, engine, both).map(|ms| moved / ms / 1e6))
    };
    let lat = |engine: bool| {
        matrix(&|a, b| run_pair(a, b, 16, LATENCY_OPS, engine, false).map(|ms| ms * 1e3 / LATENCY_OPS as f64))
    };
    let tables: Vec<(&str, &str, &str, Matrix)> = vec![
        ("ce_unidirectional_gbps", "Copy engines, one direction", "GB/s", gbps(true, false)?),
        ("ce_bidirectional_gbps", "Copy engines, both directions (sum)", "GB/s", gbps(true, true)?),
        ("sm_unidirectional_gbps", "SM copies (stores into the peer), one direction", "GB/s", gbps(false, false)?),
        ("sm_bidirectional_gbps", "SM copies, both directions (sum)", "GB/s", gbps(false, true)?),
        ("ce_latency_us", "Copy-engine latency (16 B copies, chained)", "us", lat(true)?),
        ("sm_latency_us", "SM store latency (one-thread kernels, chained, launch included)", "us", lat(false)?),
    ];

    let mut text = format!(
        "P2P between {} GPU(s): {} per transfer, {iters} transfers per figure\n",
        devs.len(),
        crate::plan::human(bytes)
    );
    let mut json = serde_json::Map::new();
    json.insert("gpus".into(), json!(gpus.iter().map(gpu::Gpu::json).collect::<Vec<_>>()));
    json.insert("bytes".into(), json!(bytes));
    json.insert("iters".into(), json!(iters));
    for (key, title, unit, m) in tables {
        writeln!(text, "\n{title} ({unit}), row = from, column = to:").unwrap();
        writeln!(
            text,
            "       {}",
            devs.iter().map(|d| format!("{:>9}", format!("GPU{}", d.ordinal))).collect::<String>()
        )
        .unwrap();
        for (d, row) in devs.iter().zip(&m) {
            let cells: String =
                row.iter().map(|v| v.map_or(format!("{:>9}", "n/a"), |v| format!("{v:>9.2}"))).collect();
            writeln!(text, "  GPU{:<3}{cells}", d.ordinal).unwrap();
        }
        json.insert(
            key.into(),
            Value::from(m.iter().map(|r| r.iter().map(|v| json!(v)).collect::<Vec<_>>()).collect::<Vec<_>>()),
        );
    }
    Ok(Report { text, json: Value::Object(json), failed: None })
}
