//! NVTX ranges (docs/PLUGINS.md, "NVTX") seen by a fake NVTX tool of our own, built here from
//! `tests/c/nvtx_injection.c` and attached through `NVTX_INJECTION64_PATH` as nsys attaches: API
//! calls that need no GPU (a version query, a group, collectives and sends on a NULL communicator,
//! which fail) each push one range in the domain "NCCL" named after the call and pop it, and the
//! collectives carry NCCL's payload decoded through the schemas registered with the tool. One test
//! per process: the tool is attached once, at the first call. `ferronickel info` names the tool.
//! Needs `cc`.

mod common;

use common::*;
use nccl::types::*;
use std::ffi::{c_char, CStr, CString};
use std::process::Command;

#[test]
fn api_calls_push_nccl_ranges_with_payloads_to_an_attached_tool() {
    let lib = scratch("nvtx").join("libfake-nvtx-injection.so");
    run_ok(
        Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread"])
            .arg(root().join("tests/c/nvtx_injection.c"))
            .arg("-o")
            .arg(&lib),
    );
    // SAFETY: set before any thread of this process reads the environment (the one test here).
    unsafe { std::env::set_var("NVTX_INJECTION64_PATH", &lib) };
    std::env::remove_var("NCCL_NVTX_DISABLE");

    let null = std::ptr::null_mut();
    let mut v = 0;
    // SAFETY: the C API with valid out-pointers and a NULL communicator, which each call refuses.
    unsafe {
        assert_eq!(nccl::api::version::ncclGetVersion(&mut v), ncclResult_t::ncclSuccess);
        assert_eq!(nccl::api::group::ncclGroupStart(), ncclResult_t::ncclSuccess);
        let bad = ncclResult_t::ncclInvalidArgument;
        assert_eq!(nccl::api::coll::ncclAllReduce(null, null, 1000, ncclFloat32, ncclMax, null.cast(), null), bad);
        assert_eq!(nccl::api::coll::ncclReduce(null, null, 3, ncclFloat64, ncclAvg, 2, null.cast(), null), bad);
        assert_eq!(nccl::api::coll::ncclAllGather(null, null, 5, ncclInt8, null.cast(), null), bad);
        assert_eq!(nccl::api::coll::ncclSend(null, 10, ncclInt32, 3, null.cast(), null), bad);
        assert_eq!(nccl::api::coll::ncclRecv(null, 7, ncclBfloat16, 1, null.cast(), null), bad);
        nccl::api::group::ncclGroupEnd();
    }

    let c = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: the tool is loaded (RTLD_NOLOAD finds the library our NVTX attached); its log is a
    // NUL-terminated string it owns.
    let log = unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        assert!(!h.is_null(), "the fake tool was not loaded: NVTX did not attach");
        let f = libc::dlsym(h, c"fake_nvtx_log".as_ptr());
        assert!(!f.is_null());
        let f: extern "C" fn() -> *const c_char = std::mem::transmute(f);
        CStr::from_ptr(f()).to_string_lossy().into_owned()
    };
    let lines: Vec<&str> = log.lines().collect();
    let expected = [
        "domain NCCL",
        "push NCCL ncclGetVersion",
        "pop NCCL",
        "push NCCL ncclGroupStart",
        "pop NCCL",
        "push NCCL ncclAllReduce NCCL communicator ID=0 Message size [bytes]=4000 Reduction operation=Max",
        "pop NCCL",
        "push NCCL ncclReduce NCCL communicator ID=0 Message size [bytes]=24 Root=2 Reduction operation=Avg",
        "pop NCCL",
        "push NCCL ncclAllGather NCCL communicator ID=0 Message size [bytes]=5",
        "pop NCCL",
        "push NCCL ncclSend NCCL communicator ID=0 Message size [bytes]=40 Peer rank=3",
        "pop NCCL",
        "push NCCL ncclRecv NCCL communicator ID=0 Message size [bytes]=14 Peer rank=1",
        "pop NCCL",
        "push NCCL ncclGroupEnd",
        "pop NCCL",
    ];
    assert_eq!(lines, expected, "the tool's log:\n{log}");

    // `ferronickel info` says whether a tool is attached, and which.
    let info = |tool: Option<&std::path::Path>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferronickel"));
        cmd.arg("info").env_remove("NVTX_INJECTION64_PATH");
        if let Some(t) = tool {
            cmd.env("NVTX_INJECTION64_PATH", t);
        }
        String::from_utf8_lossy(&run_ok(&mut cmd).stdout).into_owned()
    };
    let out = info(Some(&lib));
    assert!(out.contains(&format!("NVTX tool: {} (ranges in the domain NCCL)", lib.display())), "{out}");
    let out = info(None);
    assert!(out.contains("NVTX tool: none attached"), "{out}");
}
