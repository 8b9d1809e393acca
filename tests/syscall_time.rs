//! benches/syscall_time.c, the shim `scripts/net_bench.sh --syscalls` loads into the benchmark's
//! ranks (docs/NET.md, "What the proxy's calls cost"): under it a probe (tests/c/syscall_time_probe.c)
//! makes three all-reduce calls into a stub library, each followed by 256 KiB over loopback TCP from
//! a second thread, and ends in `_exit`. What the shim writes must account for every byte, by the
//! thread that moved it and by call, and count the look that found nothing.

mod common;

use common::{root, run_ok, scratch};
use std::path::{Path, PathBuf};
use std::process::Command;

const MSG: u64 = 256 * 1024;
const CALLS: usize = 3;

/// The shim, the stub library and the probe linked to it, built once into `dir`.
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let probe_src = root().join("tests/c/syscall_time_probe.c");
    let shim = dir.join("libsyscall_time.so");
    run_ok(
        Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror"])
            .arg(root().join("benches/syscall_time.c"))
            .arg("-ldl")
            .arg("-o")
            .arg(&shim),
    );
    run_ok(
        Command::new("cc")
            .args(["-shared", "-fPIC", "-DSTUB", "-Wall", "-Wextra", "-Werror"])
            .arg(&probe_src)
            .arg("-o")
            .arg(dir.join("libprobestub.so")),
    );
    let probe = dir.join("syscall_time_probe");
    run_ok(
        Command::new("cc")
            .args(["-O1", "-Wall", "-Wextra", "-Werror", "-pthread"])
            .arg(&probe_src)
            .arg("-L")
            .arg(dir)
            .arg("-lprobestub")
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-o")
            .arg(&probe),
    );
    (shim, probe)
}

/// The numbers of every line of `kind` (`T` lines without their thread name).
fn lines(text: &str, kind: &str) -> Vec<Vec<u64>> {
    let skip = if kind == "T" { 2 } else { 1 };
    text.lines()
        .filter(|l| l.split(' ').next() == Some(kind))
        .map(|l| {
            l.split(' ').skip(skip).map(|x| x.parse().unwrap_or_else(|_| panic!("not a number in {l:?}"))).collect()
        })
        .collect()
}

#[test]
fn the_shim_accounts_for_every_byte_by_thread_and_by_call() {
    let dir = scratch("syscall-time");
    let (shim, probe) = build(&dir);
    let out = dir.join("out");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();

    // Without a directory to write to, the shim writes nothing.
    run_ok(Command::new(&probe).env("LD_PRELOAD", &shim).env_remove("SYSCALL_TIME_DIR"));
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);

    run_ok(Command::new(&probe).env("LD_PRELOAD", &shim).env("SYSCALL_TIME_DIR", &out));
    let files: Vec<PathBuf> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "one file for the one process: {files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("st.") && name.ends_with(".txt"), "{name}");
    let text = std::fs::read_to_string(&files[0]).unwrap();

    // T: sends ns, sent, receives ns, received, looks, look ns, yields, yield ns, cpu ns, sends,
    // receives.
    let threads = lines(&text, "T");
    let total = |i: usize| threads.iter().map(|t| t[i]).sum::<u64>();
    let bytes = CALLS as u64 * MSG;
    assert_eq!((total(1), total(3)), (bytes, bytes), "every byte sent and received once:\n{text}");
    assert!(threads.iter().any(|t| t[1] == bytes && t[3] == 0), "the sending thread alone sent:\n{text}");
    assert!(threads.iter().any(|t| t[3] == bytes && t[1] == 0), "the main thread alone received:\n{text}");
    assert!(total(4) >= 1, "the look at an empty socket is counted:\n{text}");
    assert!(threads.iter().all(|t| t[8] > 0), "each thread's CPU time:\n{text}");
    // A call that moved bytes is counted once, and moved at most what it was asked for.
    assert!(total(9) >= CALLS as u64 && total(9) * MSG >= bytes, "the sends that moved bytes:\n{text}");
    assert!(total(10) >= CALLS as u64 && total(10) <= bytes, "the receives that moved bytes:\n{text}");
    assert!(threads.iter().all(|t| (t[1] == 0) == (t[9] == 0) && (t[3] == 0) == (t[10] == 0)), "{text}");

    // K: index, time, sends ns, sent, receives ns, received, looks, look ns, sends, receives at
    // each call's start.
    let calls = lines(&text, "K");
    assert_eq!(calls.len(), CALLS, "one line per all-reduce:\n{text}");
    for (k, w) in calls.windows(2).enumerate() {
        assert_eq!(w[0][0] as usize, k);
        assert!(w[1][1] > w[0][1], "the calls' times go forward:\n{text}");
        assert_eq!((w[1][3] - w[0][3], w[1][5] - w[0][5]), (MSG, MSG), "call {k} moved its message each way:\n{text}");
        assert!(w[1][2] > w[0][2] && w[1][4] > w[0][4], "call {k}'s sends and receives took time:\n{text}");
        assert!(w[1][8] > w[0][8] && w[1][9] > w[0][9], "call {k} made sends and receives:\n{text}");
    }
}
