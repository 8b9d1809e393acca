//! The main job: show that the built libnccl.so.2 is a complete NCCL 2.28 and, where GPUs
//! exist, run an all-reduce over all of them and check every element.
//!
//! Without a GPU it prints the version, how many of NCCL 2.28.9's exported functions the built
//! library provides, and why no device was found.

use nccl::api::{coll, group, init, version};
use nccl::cuda::{self, DeviceBuffer};
use nccl::types::*;
use std::ffi::{c_int, CStr, CString};

fn check(code: ncclResult_t, what: &str) {
    if code != ncclResult_t::ncclSuccess {
        // SAFETY: ncclGetLastError returns a static NUL-terminated buffer.
        let msg = unsafe { CStr::from_ptr(version::ncclGetLastError(std::ptr::null_mut())) };
        panic!("{what} failed with {code:?}: {}", msg.to_string_lossy());
    }
}

/// Counts how many reference names (and pnccl twins) the built shared library exports.
fn exported_api() -> Option<(usize, usize)> {
    let exe = std::env::current_exe().ok()?;
    let lib = exe.parent()?.parent()?.join("libnccl.so.2");
    let names = include_str!("../tests/data/nccl-2.28.9-exported-symbols.txt");
    let path = CString::new(lib.to_string_lossy().as_bytes()).ok()?;
    // SAFETY: dlopen of our own library; it is kept loaded for the process.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return None;
    }
    let total = names.lines().filter(|l| !l.trim().is_empty()).count() * 2;
    let found = names
        .lines()
        .filter(|l| !l.trim().is_empty())
        .flat_map(|n| [n.trim().to_string(), format!("p{}", n.trim())])
        .filter(|n| {
            let c = CString::new(n.as_str()).unwrap();
            // SAFETY: valid handle and symbol name.
            !unsafe { libc::dlsym(handle, c.as_ptr()) }.is_null()
        })
        .count();
    Some((found, total))
}

fn main() {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { version::ncclGetVersion(&mut v) }, "ncclGetVersion");
    println!(
        "ferronickel {} — NCCL version code {v} (NCCL {}.{}.{})",
        env!("CARGO_PKG_VERSION"),
        v / 10000,
        v / 100 % 100,
        v % 100
    );
    match exported_api() {
        Some((found, total)) => {
            println!("exported API: {found}/{total} NCCL 2.28.9 functions (nccl* and their pnccl* twins)")
        }
        None => println!("exported API: target/<profile>/libnccl.so.2 not found next to this example"),
    }
    if let Err(e) = cuda::init() {
        println!("devices: none ({e})");
        return;
    }
    let ndev = cuda::device_count().expect("device count");
    println!("devices: {ndev}");
    for d in 0..ndev {
        println!("  device {d}: {}", cuda::pci_bus_id(d).unwrap_or_default());
    }
    all_reduce_over(ndev);
}

/// One rank per GPU in this process; each contributes rank+1+i/1000 at index i.
fn all_reduce_over(ndev: i32) {
    let n = 1 << 20;
    let devs: Vec<c_int> = (0..ndev).collect();
    let mut comms = vec![std::ptr::null_mut(); ndev as usize];
    let t = std::time::Instant::now();
    // SAFETY: comms has ndev slots, devs ndev entries.
    check(unsafe { init::ncclCommInitAll(comms.as_mut_ptr(), ndev, devs.as_ptr()) }, "ncclCommInitAll");
    println!("ncclCommInitAll over {ndev} GPU(s): {:.3} s", t.elapsed().as_secs_f64());
    let ctxs: Vec<_> = devs.iter().map(|&d| cuda::primary_context(d).expect("context")).collect();
    let bufs: Vec<DeviceBuffer> = ctxs
        .iter()
        .enumerate()
        .map(|(r, ctx)| {
            let _g = ctx.enter().expect("enter");
            let b = DeviceBuffer::zeroed(n * 4).expect("alloc");
            let host: Vec<f32> = (0..n).map(|i| (r + 1) as f32 + (i % 1000) as f32 / 1000.0).collect();
            b.write(0, &host).expect("upload");
            b
        })
        .collect();
    // SAFETY: plain group call.
    check(unsafe { group::ncclGroupStart() }, "ncclGroupStart");
    for (r, b) in bufs.iter().enumerate() {
        let _g = ctxs[r].enter().expect("enter");
        // SAFETY: in-place all-reduce on a device buffer of n floats, legacy stream of that device.
        check(
            unsafe {
                coll::ncclAllReduce(b.ptr as _, b.ptr as _, n, ncclFloat32, ncclSum, comms[r], std::ptr::null_mut())
            },
            "ncclAllReduce",
        );
    }
    // SAFETY: closes the group opened above.
    check(unsafe { group::ncclGroupEnd() }, "ncclGroupEnd");
    let ranks_sum: f32 = (1..=ndev).map(|r| r as f32).sum();
    let mut wrong = 0;
    for (r, b) in bufs.iter().enumerate() {
        let _g = ctxs[r].enter().expect("enter");
        cuda::stream_synchronize(std::ptr::null_mut()).expect("sync");
        let mut host = vec![0f32; n];
        b.read(&mut host).expect("download");
        wrong +=
            (0..n).filter(|&i| (host[i] - (ranks_sum + ndev as f32 * (i % 1000) as f32 / 1000.0)).abs() > 1e-3).count();
    }
    for c in comms {
        // SAFETY: each comm was created above and is destroyed once.
        check(unsafe { init::ncclCommDestroy(c) }, "ncclCommDestroy");
    }
    println!("all-reduce of {n} floats over {ndev} GPU(s): {wrong} wrong elements");
    if wrong > 0 {
        std::process::exit(1);
    }
}
