//! Tuner and profiler plugins (docs/PLUGINS.md), with test plugins of our own in C built here
//! against `src/plugin/plugin_abi.h` for every ABI version: a tuner's costs change what
//! `ferronickel plan` picks; a plugin without a table, or whose init or getCollInfo fails, is
//! refused with a message and the built-in tuner carries on; with no tuner library, a tuner inside
//! the net plugin's library is used, as NCCL does; a profiler gets every event it was
//! started with stopped, with NCCL's fields. Needs `cc`.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

const CHILD: &str = "FERRONICKEL_PLUGINS_CHILD";

fn plugin_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("tool-plugins");
        let build = |out: &str, src: &str, defs: &[&str]| {
            let mut cc = Command::new("cc");
            cc.args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-I"])
                .arg(root().join("src/plugin"))
                .args(defs)
                .arg(root().join("tests/c").join(src))
                .arg("-o")
                .arg(dir.join(out));
            run_ok(&mut cc);
        };
        for v in 2..=5 {
            build(&format!("libnccl-tuner-fn{v}.so"), "tuner_plugin.c", &[&format!("-DTUNER_VERSION={v}")]);
        }
        build("libnccl-tuner-fnnosym.so", "tuner_plugin.c", &["-DTUNER_VERSION=0"]);
        build("libnccl-tuner-fninitfail.so", "tuner_plugin.c", &["-DTUNER_VERSION=5", "-DFAIL_INIT"]);
        build("libnccl-tuner-fncollfail.so", "tuner_plugin.c", &["-DTUNER_VERSION=4", "-DFAIL_COLL"]);
        for v in 1..=5 {
            build(&format!("libnccl-profiler-fn{v}.so"), "profiler_plugin.c", &[&format!("-DPROFILER_VERSION={v}")]);
        }
        build("libnccl-profiler-fninitfail.so", "profiler_plugin.c", &["-DPROFILER_VERSION=5", "-DFAIL_INIT"]);
        // Net plugins, with and without a tuner table in the same library.
        let net = root().join("src/transport/net");
        let net_build = |out: &str, tuner: bool| {
            let mut cc = Command::new("cc");
            cc.args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-DPLUGIN_VERSION=11"])
                .args(["-DTUNER_VERSION=5", "-I"])
                .arg(root().join("src/plugin"))
                .arg("-I")
                .arg(&net)
                .arg(root().join("tests/c/net_plugin_tcp.c"));
            if tuner {
                cc.arg(root().join("tests/c/tuner_plugin.c"));
            }
            run_ok(cc.arg("-o").arg(dir.join(out)));
        };
        net_build("libnccl-net-fnnettuner.so", true);
        net_build("libnccl-net-fnnetonly.so", false);
        dir
    })
}

/// `ferronickel plan` of two ranks on one host of two GPUs with the tuner `name`: (stdout, stdout and
/// stderr, where NCCL_DEBUG's lines go).
fn plan(name: &str, force: Option<&str>) -> (String, String) {
    plan_with(Some(name), None, force)
}

/// [`plan`] with `NCCL_TUNER_PLUGIN` and `NCCL_NET_PLUGIN` set, or unset where `None`.
fn plan_with(tuner: Option<&str>, net: Option<&str>, force: Option<&str>) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferronickel"));
    cmd.args(["plan", "--nranks", "2", "--gpus-per-host", "2"]).env("LD_LIBRARY_PATH", plugin_dir());
    for (var, v) in [("NCCL_TUNER_PLUGIN", tuner), ("NCCL_NET_PLUGIN", net)] {
        match v {
            Some(v) => cmd.env(var, v),
            None => cmd.env_remove(var),
        };
    }
    cmd.env("NCCL_DEBUG", "WARN").env_remove("NCCL_ALGO").env_remove("NCCL_PROTO");
    match force {
        Some(f) => cmd.env("TEST_TUNER_FORCE", f),
        None => cmd.env_remove("TEST_TUNER_FORCE"),
    };
    let out = run_ok(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (stdout.clone(), stdout + &String::from_utf8_lossy(&out.stderr))
}

/// The plan's line for 16-byte messages.
fn row16(out: &str) -> String {
    out.lines().find(|l| l.trim_start().starts_with("16 ")).expect("a 16-byte row").to_string()
}

#[test]
fn tuner_plugin_costs_change_the_choice_at_every_version() {
    let (builtin, _) = plan("none", None);
    assert!(builtin.contains("tuner plugin: none"), "{builtin}");
    let base = row16(&builtin);
    // 16 bytes between GPUs of one host: one channel (a channel for each 2 KiB).
    assert!(base.contains("OneShot/LL 1ch") && base.contains("Ring/LL 1ch"), "{base}");
    for v in 2..=5 {
        // NCCL_ALGO_RING (1), NCCL_PROTO_SIMPLE (2), 3 channels.
        let (out, err) = plan(&format!("fn{v}"), Some("1,2,3"));
        assert!(out.contains(&format!("tuner plugin: fntest{v} (v{v}) from ")), "v{v}: {out}\n{err}");
        let row = row16(&out);
        assert_eq!(row.matches("Ring/Simple 3ch").count(), 5, "v{v}: {row}");
        // Asking for Tree on one host (not offered to the plugin) changes nothing.
        let (out, _) = plan(&format!("fn{v}"), Some("0,2,0"));
        assert_eq!(row16(&out), base, "v{v}");
    }
}

/// As NCCL: with no tuner library found, the tuner table is looked for in the net plugin's library;
/// `none` turns that off too, a tuner library that is found wins, and a net plugin without a tuner
/// is no error.
#[test]
fn a_tuner_inside_the_net_plugin_library_is_used_when_no_tuner_library_is_found() {
    let (builtin, _) = plan("none", None);
    let base = row16(&builtin);
    let (out, err) = plan_with(None, Some("fnnettuner"), Some("1,2,3"));
    assert!(
        out.contains("tuner plugin: fntest5 (v5) from ") && out.contains("libnccl-net-fnnettuner.so"),
        "{out}\n{err}"
    );
    assert_eq!(row16(&out).matches("Ring/Simple 3ch").count(), 5, "{out}");
    let (out, _) = plan_with(Some("none"), Some("fnnettuner"), Some("1,2,3"));
    assert!(out.contains("tuner plugin: none"), "{out}");
    assert_eq!(row16(&out), base);
    let (out, _) = plan_with(Some("fn4"), Some("fnnettuner"), Some("1,2,3"));
    assert!(out.contains("tuner plugin: fntest4 (v4) from "), "{out}");
    let (out, err) = plan_with(None, Some("fnnetonly"), Some("1,2,3"));
    assert!(out.contains("tuner plugin: none") && out.contains("holds no tuner"), "{out}");
    assert!(!err.contains("WARN"), "{err}");
    assert_eq!(row16(&out), base);
}

#[test]
fn failing_tuner_plugins_leave_the_builtin_tuner() {
    let (builtin, _) = plan("none", None);
    let base = row16(&builtin);
    let (out, err) = plan("fnnosym", Some("1,2,3"));
    assert!(out.contains("tuner plugin: none") && out.contains("exports none of ncclTunerPlugin_v5"), "{out}");
    assert!(err.contains("WARN TUNER/Plugin") && err.contains("exports none"), "{err}");
    assert_eq!(row16(&out), base);
    let (out, err) = plan("fninitfail", Some("1,2,3"));
    assert!(out.contains("init failed, the built-in tuner decides"), "{out}");
    assert!(err.contains("init failed with code 3"), "{err}");
    assert_eq!(row16(&out), base);
    let (out, err) = plan("fncollfail", Some("1,2,3"));
    assert!(err.contains("getCollInfo failed with code 5; using the built-in tuner's choice"), "{err}");
    assert_eq!(err.matches("getCollInfo failed").count(), 1, "WARNed once: {err}");
    assert_eq!(row16(&out), base);
}

/// Runs this test binary's `child_entry` with the profiler `name`; returns the plugin's trace.
fn profile(name: &str, scenario: &str) -> (String, String) {
    let out_file = scratch("tool-plugins-out").join(format!("{name}-{scenario}.txt"));
    let _ = std::fs::remove_file(&out_file);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, scenario)
        .env("NCCL_PROFILER_PLUGIN", name)
        .env("LD_LIBRARY_PATH", plugin_dir())
        .env("TEST_PROFILER_OUT", &out_file)
        .env("NCCL_DEBUG", "WARN")
        .env_remove("NCCL_PROFILE_EVENT_MASK");
    let out = run_ok(&mut cmd);
    let trace = std::fs::read_to_string(&out_file).unwrap_or_default();
    (trace, String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn profiler_events_balance_with_nccl_fields_at_every_version() {
    for v in 1..=5 {
        let (trace, err) = profile(&format!("fn{v}"), "events");
        let lines: Vec<&str> = trace.lines().collect();
        assert_eq!(lines.len(), if v >= 3 { 6 } else { 5 }, "v{v}: {trace}\n{err}");
        assert!(err.contains(&format!("child: net event {}", v >= 3)), "v{v}: {err}");
        for l in &lines {
            assert!(l.contains("stopped=1"), "v{v}: every event stops once: {l}");
        }
        assert!(lines[0].starts_with("0 - Group rank=1"), "v{v}: {trace}");
        let (coll, p2p) = if v >= 2 {
            (
                "Coll rank=1 seq=7 func=AllReduce count=1000 root=0 dtype=ncclFloat32 nch=4 algo=Ring proto=LL128",
                "P2p rank=1 func=Send count=64 dtype=ncclInt8 peer=0",
            )
        } else {
            (
                "Coll rank=1 seq=7 func=4 count=1000 root=0 dtype=7 nch=4 algo=1 proto=1",
                "P2p rank=1 func=6 count=64 dtype=0 peer=0",
            )
        };
        assert!(lines[1].starts_with(&format!("1 0 {coll} ")), "v{v}: {}", lines[1]);
        assert!(lines[2].starts_with(&format!("2 0 {p2p} ")), "v{v}: {}", lines[2]);
        assert!(
            lines[3].starts_with("3 - ProxyOp rank=1 channel=2 peer=0 send=1 chunk=4096 pid_ok=1"),
            "v{v}: {}",
            lines[3]
        );
        assert!(
            lines[4].starts_with("4 3 ProxyStep rank=1 step=5 ") && lines[4].contains("states=1 bytes=512"),
            "v{v}: {}",
            lines[4]
        );
        if v >= 3 {
            let states = if v >= 4 { 1 } else { 0 };
            assert!(
                lines[5].starts_with("5 4 NetPlugin rank=1 id=0x30001 ")
                    && lines[5].contains(&format!("stopped=1 states={states} ")),
                "v{v}: {}",
                lines[5]
            );
        }
    }
}

#[test]
fn a_profiler_whose_init_fails_is_left_out() {
    let (trace, err) = profile("fninitfail", "events");
    assert!(trace.is_empty(), "{trace}");
    assert!(err.contains("init failed with code 2; continuing without a profiler"), "{err}");
    assert!(err.contains("child: no profiler"), "{err}");
}

/// The child side: a profiler for rank 1 of 2, and one event of each kind we produce.
#[test]
fn child_entry() {
    use nccl::plugin::abi::{ncclFuncAllReduce, ncclFuncSend, ncclProfilerProxyStepSendWait};
    use nccl::plugin::profiler::{CommInfo, Descr, Profiler};
    let Ok(scenario) = std::env::var(CHILD) else { return };
    assert_eq!(scenario, "events");
    let info = CommInfo { comm_hash: 0x1234, name: "test", nnodes: 1, nranks: 2, rank: 1 };
    let Some(prof) = Profiler::start(&info) else {
        eprintln!("child: no profiler");
        return;
    };
    let group = prof.start_event(&Descr::Group, None).expect("group event");
    let coll = Descr::Coll {
        seq: 7,
        func: ncclFuncAllReduce,
        send: 0x1000,
        recv: 0x2000,
        count: 1000,
        root: 0,
        dtype: 7,
        nchannels: 4,
        nwarps: 16,
        algo: (c"Ring", 1),
        proto: (c"LL128", 1),
    };
    let c = prof.start_event(&coll, Some(&group)).expect("coll event");
    let p2p = Descr::P2p { func: ncclFuncSend, buff: 0x3000, dtype: 0, count: 64, peer: 0, nchannels: 1 };
    let p = prof.start_event(&p2p, Some(&group)).expect("p2p event");
    let op = Descr::ProxyOp { channel: 2, peer: 0, nsteps: 1, chunk: 4096, is_send: true };
    let op = prof.start_event(&op, None).expect("proxy op event");
    let step = prof.start_event(&Descr::ProxyStep { step: 5 }, Some(&op)).expect("proxy step event");
    step.record_step(ncclProfilerProxyStepSendWait, 512);
    // A net's own event under the step, as a net plugin starts through the profiler callback:
    // profilers before v3 have no such event, v3 no state for it.
    let net = step.as_parent().start_net_plugin(0x3_0001, std::ptr::null_mut());
    println!("child: net event {}", net.is_some());
    if let Some(n) = &net {
        n.record_net_update(std::ptr::null_mut());
    }
    drop((net, step, op, p, c, group));
    // The last holder's drop finalizes: the plugin writes its trace.
    drop(prof);
}
