//! Conformance of the net layer (`src/transport/net/`, `docs/NET.md`) without a GPU: the
//! built-in Socket net and two C plugins built here from `tests/c/` against our own
//! `net_plugin_abi.h` (one exporting `ncclNetPlugin_v11`, one only `ncclNetPlugin_v8`).
//!
//! Every scenario runs in child processes of this test binary (the net's environment is read
//! once per process), several at once, each under a hard time limit:
//! - connect/accept, then many concurrent sends and grouped receives of random sizes (0 B to
//!   64 MiB), sent in shuffled tag order and checked byte for byte, with the slack after each
//!   message still holding its poison;
//! - a message larger than the posted buffer, and a tag nobody posted: errors, not overflows;
//! - a sender killed mid-message: the receiver fails promptly, naming the peer;
//! - the plugin loader: a plugin whose init fails, a library without the symbol, a missing
//!   file, a plugin whose own dependency is missing, `NCCL_NET`, `none`; and an
//!   `NCCL_SOCKET_IFNAME` that matches nothing;
//! - `ferronickel plan` across two hosts over the Socket net and over plugins reporting a slow and a
//!   fast link: their properties set the NET link's channels and costs (docs/NET.md).
//!
//! Garbage on the Socket net's data sockets is tested in the module's unit tests, which can
//! speak its wire format.
//!
//! Needs `cc` (see tests/common).

mod common;

use common::*;
use nccl::transport::net::{self, Net, PtrKind, RecvBuf, RecvComm, SendComm};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const CHILD: &str = "FERRONICKEL_NET_CHILD";
/// No child may run longer than this.
const CHILD_LIMIT: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------------
// Building the plugins

struct Plugins {
    dir: PathBuf,
}

impl Plugins {
    fn path(&self, short: &str) -> String {
        self.dir.join(format!("libnccl-net-{short}.so")).to_string_lossy().into_owned()
    }
}

fn plugins() -> &'static Plugins {
    static P: OnceLock<Plugins> = OnceLock::new();
    P.get_or_init(|| {
        let dir = scratch("net-plugins");
        let inc = root().join("src/transport/net");
        let build = |out: &str, src: &str, defs: &[&str]| {
            let mut cc = Command::new("cc");
            cc.args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror"])
                .arg("-I")
                .arg(&inc)
                .args(defs)
                .arg(root().join("tests/c").join(src))
                .arg("-o")
                .arg(dir.join(out));
            run_ok(&mut cc);
        };
        build("libnccl-net-fntcp11.so", "net_plugin_tcp.c", &["-DPLUGIN_VERSION=11"]);
        build("libnccl-net-fntcp8.so", "net_plugin_tcp.c", &["-DPLUGIN_VERSION=8"]);
        // The same net reporting a fast link: 100 Gbps, 5 us, 65536 connections.
        let fast = ["-DPLUGIN_VERSION=11", "-DPLUGIN_SPEED=100000", "-DPLUGIN_LATENCY=5", "-DPLUGIN_MAX_COMMS=65536"];
        build("libnccl-net-fntcpfast.so", "net_plugin_tcp.c", &fast);
        build("libnccl-net-fnbroken.so", "net_plugin_broken.c", &[]);
        build("libnccl-net-fnnosym.so", "net_plugin_nosym.c", &[]);
        // A plugin whose own dependency is missing: present, but it cannot load.
        build("libfnnetdep.so", "net_plugin_nosym.c", &[]);
        let mut cc = Command::new("cc");
        cc.args(["-shared", "-fPIC", "-x", "c", "/dev/null", "-Wl,--no-as-needed", "-L"])
            .arg(&dir)
            .arg("-lfnnetdep")
            .arg("-o")
            .arg(dir.join("libnccl-net-fnneedsdep.so"));
        run_ok(&mut cc);
        std::fs::remove_file(dir.join("libfnnetdep.so")).unwrap();
        // The test profiler plugin (ABI v5), which hears of the proxy's ops and steps.
        let mut cc = Command::new("cc");
        cc.args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-DPROFILER_VERSION=5", "-I"])
            .arg(root().join("src/plugin"))
            .arg(root().join("tests/c/profiler_plugin.c"))
            .arg("-o")
            .arg(dir.join("libnccl-profiler-fnprof5.so"));
        run_ok(&mut cc);
        Plugins { dir }
    })
}

// ---------------------------------------------------------------------------------------------
// Running children

fn child_cmd(scenario: &str, env: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, scenario)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_DEBUG", "WARN")
        .env_remove("NCCL_NET")
        .env_remove("NCCL_NET_PLUGIN")
        .env_remove("FERRONICKEL_NET_PROXY_THREADS")
        .env_remove("NCCL_PROFILER_PLUGIN")
        .env_remove("TEST_PROFILER_OUT")
        .env_remove("NCCL_DEBUG_FILE")
        .env_remove("NCCL_CONF_FILE")
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Waits for a child under [`CHILD_LIMIT`] (killing it past that); returns (success, stdout+stderr).
fn finish(mut child: Child, what: &str) -> (bool, String) {
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > CHILD_LIMIT {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {CHILD_LIMIT:?}, killed\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (status.success(), text)
}

fn run_child(scenario: &str, env: &[(&str, String)]) -> String {
    let child = child_cmd(scenario, env).spawn().expect("spawn child");
    let (ok, text) = finish(child, scenario);
    assert!(ok, "child {scenario} {env:?} failed:\n{text}");
    text
}

fn socket_env() -> Vec<(&'static str, String)> {
    vec![("NCCL_NET_PLUGIN", "none".into())]
}

fn plugin_env(short: &str) -> Vec<(&'static str, String)> {
    vec![("NCCL_NET_PLUGIN", plugins().path(short))]
}

/// The nets every scenario runs against (a name's first word is the net's), each net with the
/// proxy threads it gets by default and with the other shape (`FERRONICKEL_NET_PROXY_THREADS`:
/// one thread for both halves of the Socket net's connections, a thread a half for a plugin's),
/// and a plugin's send halves shared out by peer between two threads
/// (`FERRONICKEL_NET_PROXY_SEND_THREADS`: rank 0's peer is rank 1, whose lane is the second).
/// The Socket net's eight sockets a connection carry chunks whatever the machine's CPUs (on two
/// the plain Socket net sends every message inline).
fn backends() -> Vec<(&'static str, Vec<(&'static str, String)>)> {
    let mut wide = socket_env();
    wide.push(("NCCL_SOCKET_NTHREADS", "4".into()));
    wide.push(("NCCL_NSOCKS_PERTHREAD", "2".into()));
    wide.push(("FERRONICKEL_NET_SOCKET_INLINE_MAX", (128 << 10).to_string()));
    let mut split = socket_env();
    split.push(("FERRONICKEL_NET_PROXY_THREADS", "2".into()));
    let mut one = plugin_env("fntcp11");
    one.push(("FERRONICKEL_NET_PROXY_THREADS", "1".into()));
    let mut lanes = plugin_env("fntcp11");
    lanes.push(("FERRONICKEL_NET_PROXY_THREADS", "2".into()));
    lanes.push(("FERRONICKEL_NET_PROXY_SEND_THREADS", "2".into()));
    vec![
        ("Socket", socket_env()),
        ("Socket 4x2", wide),
        ("Socket, a proxy thread a half", split),
        ("FnTcp11", plugin_env("fntcp11")),
        ("FnTcp11, one proxy thread", one),
        ("FnTcp11, two send threads", lanes),
        ("FnTcp8", plugin_env("fntcp8")),
    ]
}

/// Runs `scenario` against every backend at once; returns each child's output.
fn on_every_net(scenario: &'static str) -> Vec<(&'static str, String)> {
    let handles: Vec<_> = backends()
        .into_iter()
        .map(|(name, env)| std::thread::spawn(move || (name, run_child(scenario, &env))))
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

// ---------------------------------------------------------------------------------------------
// The parent's tests

#[test]
fn layout_matches_the_c_header() {
    let exe = scratch("net-plugins").join("net_plugin_layout");
    let mut cc = Command::new("cc");
    cc.args(["-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root().join("src/transport/net"))
        .arg(root().join("tests/c/net_plugin_layout.c"))
        .arg("-o")
        .arg(&exe);
    run_ok(&mut cc);
    let mut c: Vec<String> = stdout_of(&mut Command::new(&exe)).lines().map(String::from).collect();
    let mut rust: Vec<String> = net::abi::layout().into_iter().map(|(k, v)| format!("{k} {v}")).collect();
    c.sort();
    rust.sort();
    assert!(c.len() > 100, "the C probe printed too little: {c:?}");
    assert_eq!(c, rust, "net plugin ABI: C header and Rust mirrors disagree");
}

/// `ferronickel plan --json` of two ranks on two hosts over the net `NCCL_NET_PLUGIN` names.
fn plan_over(net_plugin: &str) -> serde_json::Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferronickel"));
    cmd.args(["plan", "--nranks", "2", "--hosts", "2", "--json"])
        .env("NCCL_NET_PLUGIN", net_plugin)
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_DEBUG", "WARN")
        .env_remove("NCCL_NET")
        .env_remove("NCCL_ALGO")
        .env_remove("NCCL_PROTO")
        .env_remove("NCCL_TUNER_PLUGIN");
    let out = stdout_of(&mut cmd);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("plan printed invalid JSON ({e}):\n{out}"))
}

/// The choice of all-reduce at `bytes` in a plan: (channels, modelled µs).
fn all_reduce_at(plan: &serde_json::Value, bytes: u64) -> (u64, f64) {
    let row = plan["sizes"].as_array().unwrap().iter().find(|r| r["bytes"] == bytes).expect("size planned");
    let c = &row["choices"]["all_reduce"];
    (c["channels"].as_u64().unwrap(), c["modelled_us"].as_f64().unwrap())
}

#[test]
fn a_net_plugins_properties_price_net_and_size_its_channels_in_plan() {
    let socket = plan_over("none");
    let slow = plan_over(&plugins().path("fntcp11"));
    let fast = plan_over(&plugins().path("fntcpfast"));
    // The built-in Socket net: its measured constants, and the 4 channels that reach its 8.2 GB/s.
    let net = &socket["net_link"];
    assert_eq!((net["net"].as_str(), net["speed_mbps"].is_null()), (Some("Socket"), true), "{net}");
    assert_eq!(
        (net["channels"].as_u64(), net["hop_us"].as_f64(), net["gbps"].as_f64()),
        (Some(4), Some(36.0), Some(8.2))
    );
    assert_eq!(socket["ring_channels"], 4);
    // A send's part of 64-128 KiB to another host runs in two steps through a plugin only.
    assert!(socket["p2p_two_steps_bytes_per_part"].is_null(), "{socket}");
    for plan in [&slow, &fast] {
        assert_eq!(plan["p2p_two_steps_bytes_per_part"], serde_json::json!([65536, 131072]), "{plan}");
    }
    // Through a plugin two channels, NCCL's for a NIC, whatever the speed it reports (10 Gbps,
    // 1.25 GB/s; 100 Gbps, 12.5), which prices the link.
    for (plan, speed, latency, max_comms, channels, hop, gbps) in
        [(&slow, 10_000, 0.0, 1024, 2, 36.0, 1.25), (&fast, 100_000, 5.0, 65536, 2, 41.0, 12.5)]
    {
        let net = &plan["net_link"];
        assert_eq!(net["net"], "fn-tcp-lo", "{net}");
        assert_eq!(
            (net["speed_mbps"].as_u64(), net["latency_us"].as_f64(), net["max_comms"].as_u64()),
            (Some(speed), Some(latency), Some(max_comms)),
            "{net}"
        );
        assert_eq!(
            (net["channels"].as_u64(), net["hop_us"].as_f64(), net["gbps"].as_f64()),
            (Some(channels), Some(hop), Some(gbps))
        );
        assert_eq!(plan["ring_channels"], channels);
    }
    // Large all-reduces: the fast link on both its channels, modelled faster than the slow one on
    // one (its 1.25 GB/s), Socket on its four fastest; small ones pay the fast link's 5 us a hop.
    let (s, sl, f) = (all_reduce_at(&socket, 1 << 30), all_reduce_at(&slow, 1 << 30), all_reduce_at(&fast, 1 << 30));
    assert_eq!((s.0, sl.0, f.0), (4, 1, 2));
    assert!(s.1 < f.1 && f.1 < sl.1, "fast {f:?}, Socket {s:?}, slow {sl:?}");
    let (s, f) = (all_reduce_at(&socket, 16), all_reduce_at(&fast, 16));
    assert_eq!((s.0, f.0), (1, 1));
    assert!((f.1 - s.1 - 5.0).abs() < 1e-6, "fast {f:?}, Socket {s:?}");
}

#[test]
fn traffic_on_every_net() {
    for (name, out) in on_every_net("traffic") {
        assert!(out.contains("TRAFFIC OK"), "{name}:\n{out}");
    }
}

/// How many CPUs this process, and the children it starts, may run on.
fn allowed_cpus() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap();
    nccl::affinity::CpuSet::parse(list).unwrap().count()
}

/// The NET transport (proxy thread and all) over every net, the plugins included: a plugin of
/// `maxRecvs` 1 and one of the v8 ABI carry steps of every protocol as the Socket net does, the
/// small ones as one message each (docs/NET.md, "One message per small step"), the larger in two.
#[test]
fn the_proxy_carries_steps_on_every_net() {
    for (name, out) in on_every_net("transport") {
        let net = name.split([' ', ',']).next().unwrap_or(name);
        let want = if net == "Socket" {
            "TRANSPORT OK over Socket\n".to_string()
        } else {
            format!("TRANSPORT OK over {net}, small steps as one message")
        };
        assert!(out.contains(&want), "{name}: no {want:?}:\n{out}");
        // Each rank's proxy: a thread for each half through a plugin where its threads have
        // three CPUs or more, or where asked; else one.
        let split = if name.contains("a proxy thread a half") {
            true
        } else if name.contains("one proxy thread") {
            false
        } else {
            net != "Socket" && allowed_cpus() >= 3
        };
        // A second send thread is named `s1`, cut to 15 characters by the kernel.
        let want = if name.contains("two send threads") {
            "PROXY THREADS nccl-proxy-d-1,nccl-proxy-d-1r,nccl-proxy-d-1s,nccl-proxy-d-2,nccl-proxy-d-2r,nccl-proxy-d-2s\n"
        } else if split {
            "PROXY THREADS nccl-proxy-d-1,nccl-proxy-d-1r,nccl-proxy-d-2,nccl-proxy-d-2r\n"
        } else {
            "PROXY THREADS nccl-proxy-d-1,nccl-proxy-d-2\n"
        };
        assert!(out.contains(want), "{name}: no {want:?}:\n{out}");
        // Closing answers goodbyes and completes every posted receive first (docs/NET.md).
        assert!(!out.contains("in flight"), "{name}: a comm closed with requests in flight:\n{out}");
    }
}

/// With a profiler plugin, the proxy threads of the same run report every step they move, on the
/// Socket net (steps inline, and steps in chunks for its helpers) and through a plugin: balanced
/// proxy op and step events with each step's bytes, and under the steps the net's own events
/// (checked in the child, which knows them).
#[test]
fn the_proxy_reports_every_step_to_a_profiler() {
    let dir = scratch("proxy-profiler");
    let mut chunked = socket_env();
    chunked.push(("FN_TEST_FIFO_BYTES", (2 << 20).to_string()));
    // Chunks wherever the test runs: a machine of two CPUs sends every message inline.
    chunked.push(("FERRONICKEL_NET_SOCKET_INLINE_MAX", (128 << 10).to_string()));
    for (name, mut env) in [("Socket", socket_env()), ("Socket-chunks", chunked), ("FnTcp11", plugin_env("fntcp11"))] {
        let trace = dir.join(format!("{name}.trace"));
        let _ = std::fs::remove_file(&trace);
        env.push(("NCCL_PROFILER_PLUGIN", plugins().dir.join("libnccl-profiler-fnprof5.so").display().to_string()));
        env.push(("TEST_PROFILER_OUT", trace.display().to_string()));
        let out = run_child("transport", &env);
        assert!(out.contains("PROFILER OK"), "{name}: the proxy's events do not add up:\n{out}");
    }
}

#[test]
fn oversized_message_and_unknown_tag_fail_cleanly() {
    for (name, out) in on_every_net("bad-messages") {
        assert!(out.contains("OVERSIZE ERR"), "{name}: a message larger than its buffer was not refused:\n{out}");
        assert!(out.contains("BADTAG ERR"), "{name}: a message with an unposted tag was not refused:\n{out}");
        let max = if name.starts_with("Socket") { 8 } else { 1 };
        assert!(
            out.contains(&format!("TOOMANY irecv: {} buffers posted, the net takes 1 to {max}", max + 1)),
            "{name}:\n{out}"
        );
        if name.starts_with("Socket") {
            assert!(out.contains("sent 100 bytes (tag 1) to a receive buffer of 50 bytes"), "{name}:\n{out}");
            assert!(out.contains("with tag 2, but the receive posted expects tags [1]"), "{name}:\n{out}");
        } else {
            assert!(out.contains("100 bytes into a 50-byte buffer") && out.contains("sent tag 2"), "{name}:\n{out}");
        }
    }
}

/// A receiver, a sender that dies mid-message, then the receiver's verdict.
fn disconnect(name: &'static str, env: Vec<(&'static str, String)>) -> String {
    let mut recv = child_cmd("recv-from-dying", &env).stdin(Stdio::piped()).spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    let out = recv.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut lines = Vec::new();
    let mut wait_for = |prefix: &str| -> String {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                // The harness prints its `test child_entry ... ` without a newline before it.
                Ok(l) if l.contains(prefix) => return l[l.find(prefix).unwrap()..].to_string(),
                Ok(l) => lines.push(l),
                Err(e) => panic!("{name}: receiver said no {prefix} ({e:?}); it said:\n{}", lines.join("\n")),
            }
        }
    };
    let handle = wait_for("HANDLE ")["HANDLE ".len()..].to_string();
    let mut senv = env.clone();
    senv.push(("FN_HANDLE", handle));
    let sender = child_cmd("send-and-die", &senv).spawn().unwrap();
    let (_, sout) = finish(sender, "send-and-die");
    assert!(sout.contains("DYING"), "{name}: the sender did not get to send:\n{sout}");
    recv.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let verdict = wait_for("VERDICT ");
    let (ok, rest) = finish(recv, "recv-from-dying");
    assert!(ok, "{name}: receiver failed:\n{}\n{rest}", lines.join("\n"));
    format!("{verdict}\n{}\n{rest}", lines.join("\n"))
}

#[test]
fn a_sender_dying_mid_message_is_an_error_naming_the_peer() {
    let handles: Vec<_> =
        backends().into_iter().map(|(name, env)| std::thread::spawn(move || (name, disconnect(name, env)))).collect();
    for h in handles {
        let (name, out) = h.join().unwrap();
        println!("{name}: {}", out.lines().next().unwrap_or(""));
        assert!(out.contains("VERDICT ERR"), "{name}: the receive did not fail:\n{out}");
        assert!(out.contains("127.0.0.1:"), "{name}: the error does not name the peer:\n{out}");
        if name.starts_with("Socket") {
            assert!(out.contains("mid-message"), "{name}:\n{out}");
        } else {
            assert!(out.contains("fn-tcp: peer 127.0.0.1:") && out.contains("closed the connection"), "{name}:\n{out}");
        }
    }
}

#[test]
fn loader_falls_through_broken_plugins_and_warns() {
    let p = plugins();
    let dir = p.dir.to_string_lossy().into_owned();
    let list = format!("{},{},fnmissing,fnneedsdep,fntcp11", p.path("fnbroken"), p.path("fnnosym"));
    let verbose = |mut v: Vec<(&'static str, String)>| {
        v.push(("NCCL_DEBUG", "INFO".into()));
        v.push(("NCCL_DEBUG_SUBSYS", "INIT,NET".into()));
        v.push(("LD_LIBRARY_PATH", dir.clone()));
        v
    };
    let cases: Vec<(&str, Vec<(&'static str, String)>)> = vec![
        ("fallthrough", verbose(vec![("NCCL_NET_PLUGIN", list.clone())])),
        ("by-name", verbose(vec![("NCCL_NET_PLUGIN", "fntcp8".into())])),
        ("net=Socket", verbose(vec![("NCCL_NET_PLUGIN", list.clone()), ("NCCL_NET", "Socket".into())])),
        (
            "net=FnTcp8",
            verbose(vec![("NCCL_NET_PLUGIN", format!("fntcp11,{}", p.path("fntcp8"))), ("NCCL_NET", "fntcp8".into())]),
        ),
        ("net=Bogus", verbose(vec![("NCCL_NET_PLUGIN", "fntcp11".into()), ("NCCL_NET", "Bogus".into())])),
        ("none", verbose(vec![("NCCL_NET_PLUGIN", "none".into())])),
        ("all-broken", verbose(vec![("NCCL_NET_PLUGIN", format!("fnbroken,{}", p.path("fnnosym")))])),
        ("ifname", vec![("NCCL_NET_PLUGIN", "none".into()), ("NCCL_SOCKET_IFNAME", "nosuchif0".into())]),
    ];
    let handles: Vec<_> =
        cases.into_iter().map(|(name, env)| std::thread::spawn(move || (name, run_child("select", &env)))).collect();
    for h in handles {
        let (name, out) = h.join().unwrap();
        let has = |s: &str| assert!(out.contains(s), "{name}: no {s:?} in:\n{out}");
        match name {
            "fallthrough" => {
                has("NET FnTcp11");
                has("NCCL WARN NET/Plugin: FnBroken (ncclNetPlugin_v11 in ");
                has("libnccl-net-fnbroken.so) init failed with code 2; trying the next net");
                has("NCCL WARN NET/Plugin: ");
                has("libnccl-net-fnnosym.so exports none of ncclNetPlugin_v11");
                has("could not find fnmissing or libnccl-net-fnmissing.so");
                has("NCCL WARN NET/Plugin: cannot load libnccl-net-fnneedsdep.so: libfnnetdep.so: cannot open shared object file");
                // The plugins' own log lines, formatted from their printf arguments.
                has("fn-broken: refusing to start (by design)");
                has("fn-tcp plugin v11 up: loopback, 2.50, 1099511627776, k");
                has("fn-tcp plugin context for comm 0x5e1ec7");
            }
            "by-name" => {
                has("NET FnTcp8");
                has("fn-tcp plugin v8 up: loopback, 2.50, 1099511627776, k");
            }
            "net=Socket" | "none" | "all-broken" => has("NET Socket"),
            "net=FnTcp8" => has("NET FnTcp8"),
            "net=Bogus" => has("NETERR the net name \"Bogus\" (NCCL_NET or the config's netName) names no available net: tried FnTcp11"),
            "ifname" => {
                has("NETERR NET/Socket: NCCL_SOCKET_IFNAME=nosuchif0 matches no usable interface");
                has("lo (127.0.0.1)");
            }
            _ => unreachable!(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The children

#[test]
fn child_entry() {
    let Ok(scenario) = std::env::var(CHILD) else { return };
    match scenario.as_str() {
        "traffic" => traffic(),
        "bad-messages" => bad_messages(),
        "recv-from-dying" => recv_from_dying(),
        "send-and-die" => send_and_die(),
        "transport" => transport(),
        "select" => match net::init(&net::NetConfig { comm_id: 0x5e1ec7, ..Default::default() }) {
            Ok(n) => println!("NET {}", n.name()),
            Err(e) => println!("NETERR {e}"),
        },
        s => panic!("unknown child scenario {s}"),
    }
}

/// The transport scenario's FIFO: 64 KiB (steps to 8 KiB, inline on the Socket net), or
/// `FN_TEST_FIFO_BYTES`, where steps of 128 KiB and more go to the Socket net's helpers in chunks.
fn fifo_bytes() -> usize {
    std::env::var("FN_TEST_FIFO_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(64 << 10)
}

fn the_net() -> std::sync::Arc<dyn Net> {
    net::init(&net::NetConfig::default()).unwrap_or_else(|e| panic!("net init: {e}"))
}

fn connect_pair(net: &dyn Net) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let (handle, mut listener) = net.listen(0).unwrap();
    finish_connect(net.connect(0, &handle).unwrap(), &mut *listener, Duration::from_secs(20))
}

/// A small deterministic generator (xorshift64*), so a failure can be replayed.
/// Two ranks in threads connect through the bootstrap and the net of this process's
/// environment; threads play the kernels on both ends of 2 channels in each direction: 200 steps
/// of random protocols and sizes each, checked byte for byte where the step's protocol puts them.
fn transport() {
    use nccl::bootstrap::{new_unique_id, Bootstrap};
    use nccl::plugin::profiler::{CommInfo, Profiler};
    use nccl::transport::net::conn::{NetTransport, Setup};
    use nccl::transport::net::proxy::{self, HostBlock, Layout};
    use std::sync::atomic::{fence, Ordering};
    use std::sync::Arc;
    const STEPS: u64 = 200;
    // After this step the kernels pause past the proxies' long idle, then wake them as a launch
    // does and go on.
    const PAUSE_AT: u64 = 150;
    let limit = Duration::from_secs(30);
    let id = new_unique_id().unwrap();
    let ranks: Vec<_> = (0..2usize)
        .map(|r| {
            std::thread::spawn(move || {
                let bs = Bootstrap::init(&id, r, 2, limit).unwrap();
                // The profiler NCCL_PROFILER_PLUGIN names, if any.
                let info = CommInfo { comm_hash: 0x5e1ec7, name: "transport", nnodes: 2, nranks: 2, rank: r };
                let setup = Setup {
                    dev: -1 - r as i32,
                    fifo_bytes: fifo_bytes(),
                    names: vec!["rank 0".into(), "rank 1".into()],
                    fault: Arc::new(|m| panic!("NET fault: {m}")),
                    timeout: limit,
                    net: net::init(&net::NetConfig { comm_id: bs.magic(), ..Default::default() }).unwrap(),
                    profiler: Profiler::start(&info),
                    cpus: None,
                    machine_ranks: 2,
                    // One peer over the net: one send thread unless asked for more.
                    net_peers: 1,
                };
                let t = NetTransport::connect(&bs, &[(1 - r, 0), (1 - r, 1)], &setup, &HostBlock::plain).unwrap();
                bs.barrier().unwrap();
                (bs, t)
            })
        })
        .collect();
    let ranks: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    let wait = |what: &str, ok: &dyn Fn() -> bool| {
        let end = Instant::now() + limit;
        while !ok() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            std::thread::yield_now();
        }
    };
    // Step s of stream `seed`: its protocol, bytes (whole lines for LL and LL128) and byte i.
    let shape = |l: &Layout, seed: u64, s: u64| {
        let mut rng = Rng(seed * 1000 + s + 1);
        let proto = rng.below(3) as u32;
        let line = [16, 128, 1][proto as usize];
        (proto, rng.below(l.stride(proto) as u64 + 1) as usize / line * line)
    };
    let byte = |seed: u64, s: u64, i: usize| (seed as usize * 131 + s as usize * 7 + i * 13) as u8;
    std::thread::scope(|sc| {
        for (r, (_, t)) in ranks.iter().enumerate() {
            for ch in 0..2 {
                let (l, seed) = (t.layout(), (r * 2 + ch) as u64);
                let send = t.block(1 - r, ch).unwrap().clone();
                let recv = ranks[1 - r].1.block(r, ch).unwrap().clone();
                let waker = t.proxy_waker();
                sc.spawn(move || {
                    for s in 0..STEPS {
                        if s == PAUSE_AT {
                            wait("the peer's last step", &|| send.load_u64(proxy::SEND_HEAD) == s);
                            std::thread::sleep(Duration::from_millis(300));
                            waker.wake(u64::MAX, 0, true, true, u64::MAX);
                        }
                        wait("a free slot", &|| send.load_u64(proxy::SEND_HEAD) + 8 > s);
                        let (proto, bytes) = shape(&l, seed, s);
                        let slot = l.send_fifo(proto) + (s % 8) as usize * l.stride(proto);
                        for i in 0..bytes {
                            // SAFETY: in the slot, which the proxy does not read before the tail.
                            unsafe { send.ptr(slot + i, 1).write(byte(seed, s, i)) };
                        }
                        send.store_u32(proxy::SEND_SIZES + 4 * (s % 8) as usize, bytes as u32 | proto << 30);
                        fence(Ordering::SeqCst);
                        send.store_u64(proxy::SEND_TAIL, s + 1);
                    }
                });
                sc.spawn(move || {
                    for s in 0..STEPS {
                        wait("a step", &|| recv.load_u64(proxy::RECV_TAIL) > s);
                        fence(Ordering::Acquire);
                        let (proto, bytes) = shape(&l, seed, s);
                        let slot = l.recv_fifo(proto) + (s % 8) as usize * l.stride(proto);
                        for i in 0..bytes {
                            // SAFETY: in the slot, which the proxy does not write before the head moves.
                            let got = unsafe { recv.ptr(slot + i, 1).read() };
                            assert_eq!(got, byte(seed, s, i), "stream {seed} step {s} (protocol {proto}): byte {i}");
                        }
                        recv.store_u64(proxy::RECV_HEAD, s + 1);
                    }
                });
            }
        }
    });
    let one = if ranks[0].1.layout().one_message { ", small steps as one message" } else { "" };
    println!("TRANSPORT OK over {}{one}", ranks[0].1.net_name);
    // The proxy threads that moved the steps (the parent checks their shape).
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| n.starts_with("nccl-proxy"))
        .collect();
    names.sort();
    println!("PROXY THREADS {}", names.join(","));
    if let Ok(trace) = std::env::var("TEST_PROFILER_OUT") {
        let layouts: Vec<Layout> = ranks.iter().map(|(_, t)| t.layout()).collect();
        let ranks_net = ranks[0].1.net_name.clone();
        // The proxies end with the transports, stopping their events; the plugin writes its
        // trace when the last holder of each rank's profiler is gone.
        drop(ranks);
        let text = std::fs::read_to_string(&trace).unwrap_or_else(|e| panic!("{trace}: {e}"));
        let mut expected = std::collections::BTreeMap::new();
        for (r, l) in layouts.iter().enumerate() {
            for ch in 0..2 {
                let seed = (r * 2 + ch) as u64;
                for s in 0..STEPS {
                    let bytes = shape(l, seed, s).1;
                    // Rank r sends stream `seed` on channel ch to 1 - r, which receives it.
                    expected.insert((r, ch, 1 - r, 1, s), bytes);
                    expected.insert((1 - r, ch, r, 0, s), bytes);
                }
            }
        }
        // The test plugin reports each request it moves under the request's step, the Socket
        // net each message or chunk (NCCL's socket events).
        let kind = if ranks_net == "Socket" { "sock" } else { "fntcp" };
        check_proxy_trace(&text, &expected, kind, fifo_bytes() > 64 << 10);
        println!("PROFILER OK: {} steps", expected.len());
    }
}

/// Checks a profiler trace of the proxies: every step of `expected` ((rank, channel, peer,
/// send, step) -> bytes) one step event, stopped once, with one state and its bytes, under an
/// op of its connection direction, and
/// the net's own events (`kind`: the Socket net's "sock", the test plugin's "fntcp") under the
/// steps whose messages they moved; with `chunks`, some of them chunks of the Socket net's
/// helpers (64 KiB or more).
fn check_proxy_trace(
    text: &str,
    expected: &std::collections::BTreeMap<(usize, usize, usize, usize, u64), usize>,
    kind: &str,
    chunks: bool,
) {
    use std::collections::HashMap;
    let field = |line: &str, key: &str| -> u64 {
        let v = line.split(' ').find_map(|w| w.strip_prefix(key).and_then(|w| w.strip_prefix('=')));
        v.unwrap_or_else(|| panic!("no {key} in {line:?}")).parse().unwrap_or_else(|e| panic!("{key} in {line:?}: {e}"))
    };
    let mut ops = HashMap::new();
    let mut seen = std::collections::BTreeMap::new();
    // Step event id -> (rank, send); net-plugin events as (parent step id, rank, send, bytes,
    // started by a Socket helper thread: a chunk).
    let mut steps = HashMap::new();
    let mut net = Vec::new();
    for line in text.lines() {
        assert_eq!(field(line, "stopped"), 1, "an event not stopped exactly once: {line}");
        let w: Vec<&str> = line.split(' ').collect();
        match w[2] {
            "ProxyOp" => {
                let key = (field(line, "rank"), field(line, "channel"), field(line, "peer"), field(line, "send"));
                assert!(field(line, "chunk") > 0 && field(line, "pid_ok") == 1, "{line}");
                ops.insert(w[0].to_string(), key);
            }
            "ProxyStep" => {
                let (r, ch, peer, send) = *ops.get(w[1]).unwrap_or_else(|| panic!("a step before its op: {line}"));
                assert_eq!(field(line, "rank"), r, "{line}");
                assert_eq!(field(line, "states"), 1, "{line}");
                let key = (r as usize, ch as usize, peer as usize, send as usize, field(line, "step"));
                let bytes = field(line, "bytes") as usize;
                assert!(seen.insert(key, bytes).is_none(), "step {key:?} twice: {line}");
                steps.insert(w[0].to_string(), (r, send));
            }
            "NetPlugin" => {
                assert!(w[4] == kind, "not a {kind} event: {line}");
                let (send, bytes, helper) = if kind == "sock" {
                    // NCCL's socket events carry no state: the direction and bytes are fields.
                    assert_eq!(field(line, "states"), 0, "{line}");
                    (1 - field(line, "op"), field(line, "length"), field(line, "helper") == 1)
                } else {
                    assert_eq!(field(line, "states"), 1, "one update with its bytes: {line}");
                    (field(line, "send"), field(line, "bytes"), false)
                };
                net.push((w[1].to_string(), field(line, "rank"), send, bytes, helper));
            }
            other => panic!("only proxy events were produced here, not {other}: {line}"),
        }
    }
    let mut covered = std::collections::HashSet::new();
    for (parent, rank, send, bytes, _) in &net {
        let step = steps.get(parent).unwrap_or_else(|| panic!("a net-plugin event under {parent}, not a step"));
        assert_eq!(*step, (*rank, *send), "a net-plugin event of rank {rank}, send {send} under the step {step:?}");
        assert!(*bytes > 0, "a net-plugin event of step {parent} moved no byte");
        covered.insert(parent.clone());
    }
    // Every message is under the first step it moves (a pair moves two); a receive of a size
    // word, or of a whole small step, is posted before its step is known: none.
    let sends = steps.values().filter(|s| s.1 == 1).count();
    let sends_covered = covered.iter().filter(|p| steps[*p].1 == 1).count();
    assert!(2 * sends_covered >= sends, "{sends_covered} of {sends} send steps have the net's events");
    assert!(covered.iter().any(|p| steps[p].1 == 0), "no receive step has the net's events");
    if chunks {
        for send in [0, 1] {
            assert!(
                net.iter().any(|n| n.2 == send && n.3 >= 64 << 10 && n.4),
                "no chunk of 64 KiB or more moved by a helper thread (send {send})"
            );
        }
    }
    for (k, want) in expected {
        match seen.get(k) {
            Some(got) => assert_eq!(got, want, "(rank, channel, peer, send, step) {k:?}: bytes"),
            None => panic!("(rank, channel, peer, send, step) {k:?}: no event"),
        }
    }
    assert_eq!(seen.len(), expected.len(), "steps nobody moved were reported");
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn pattern(msg: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (msg.wrapping_mul(131) ^ j.wrapping_mul(7) ^ (j >> 9)) as u8).collect()
}

const POISON: u8 = 0xA5;

struct Msg {
    tag: i32,
    data: Vec<u8>,
}

/// Many sends and grouped receives in flight at once, then every byte checked.
fn traffic() {
    let net = the_net();
    let props = net.properties(0).unwrap();
    let (mut s, mut r) = connect_pair(&*net);
    let seed = 0x5eed_0000 + props.max_recvs as u64;
    let mut rng = Rng(seed);
    let mut sizes: Vec<usize> = vec![
        0,
        1,
        3,
        100,
        4095,
        4096,
        65535,
        65536,
        65537,
        131071,
        131072,
        131073,
        262143,
        262144,
        262145,
        (1 << 20) + 7,
        64 << 20,
    ];
    for _ in 0..48 {
        // Log-uniform up to 4 MiB, so small and large messages mix.
        let bits = rng.below(23);
        sizes.push(rng.below(1 << bits) as usize);
    }
    // Groups of 1..=max_recvs messages with distinct tags; the sender sends each group in a
    // shuffled order, so only tag matching puts each message in its buffer.
    let mut groups: Vec<Vec<Msg>> = Vec::new();
    let mut i = 0;
    while i < sizes.len() {
        let n = (1 + rng.below(props.max_recvs as u64) as usize).min(sizes.len() - i);
        let g = (0..n)
            .map(|k| Msg { tag: (rng.below(1 << 30) as i32) * 8 + k as i32, data: pattern(i + k, sizes[i + k]) })
            .collect();
        groups.push(g);
        i += n;
    }
    let mut send_order: Vec<(usize, usize)> = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let mut idx: Vec<usize> = (0..g.len()).collect();
        for k in (1..idx.len()).rev() {
            idx.swap(k, rng.below(k as u64 + 1) as usize);
        }
        send_order.extend(idx.into_iter().map(|k| (gi, k)));
    }
    let mut bufs: Vec<Vec<Vec<u8>>> =
        groups.iter().map(|g| g.iter().map(|m| vec![POISON; m.data.len() + (m.data.len() % 61)]).collect()).collect();
    let smr = s.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();
    let rmr = r.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();

    let until = Instant::now() + Duration::from_secs(60);
    let (mut next_send, mut next_recv) = (0, 0);
    let mut sends: Vec<(net::Request, usize)> = Vec::new();
    let mut recvs: Vec<(net::Request, usize)> = Vec::new();
    let mut done_recv = vec![false; groups.len()];
    let mut sent_bytes = 0;
    while done_recv.iter().any(|d| !d) || !sends.is_empty() || next_send < send_order.len() {
        assert!(Instant::now() < until, "traffic did not finish within 60 s (seed {seed:#x})");
        if next_recv < groups.len() {
            let posted: Vec<RecvBuf> = bufs[next_recv]
                .iter_mut()
                .zip(&groups[next_recv])
                .map(|(b, m)| RecvBuf { data: b.as_mut_ptr(), size: b.len(), tag: m.tag })
                .collect();
            let mrs: Vec<&net::MemHandle> = posted.iter().map(|_| &rmr).collect();
            // SAFETY: the buffers live in `bufs` until the end of this function, untouched
            // until their request completes.
            if let Some(req) = unsafe { r.irecv(&posted, &mrs) }.unwrap() {
                recvs.push((req, next_recv));
                next_recv += 1;
            }
        }
        if next_send < send_order.len() {
            let (gi, k) = send_order[next_send];
            let m = &groups[gi][k];
            // SAFETY: `groups` outlives every request.
            if let Some(req) = unsafe { s.isend(m.data.as_ptr(), m.data.len(), m.tag, &smr) }.unwrap() {
                sends.push((req, m.data.len()));
                next_send += 1;
            }
        }
        let mut k = 0;
        while k < sends.len() {
            match s.test(&sends[k].0).unwrap() {
                Some(n) => {
                    assert_eq!(n, sends[k].1, "send reported the wrong size");
                    sent_bytes += n;
                    sends.swap_remove(k);
                }
                None => k += 1,
            }
        }
        let mut k = 0;
        while k < recvs.len() {
            match r.test(&recvs[k].0).unwrap() {
                Some(got) => {
                    let gi = recvs[k].1;
                    for (j, m) in groups[gi].iter().enumerate() {
                        assert_eq!(got[j], m.data.len(), "group {gi} buffer {j}: wrong size received");
                        let b = &bufs[gi][j];
                        if let Some(p) = (0..m.data.len()).find(|&p| b[p] != m.data[p]) {
                            panic!(
                                "group {gi} buffer {j} ({} bytes, tag {}): first wrong byte at {p}",
                                m.data.len(),
                                m.tag
                            );
                        }
                        assert!(
                            b[m.data.len()..].iter().all(|&x| x == POISON),
                            "group {gi} buffer {j}: written past the message"
                        );
                    }
                    done_recv[gi] = true;
                    recvs.swap_remove(k);
                }
                None => k += 1,
            }
        }
    }
    s.dereg_mr(smr).unwrap();
    r.dereg_mr(rmr).unwrap();
    println!(
        "TRAFFIC OK {} messages, {} bytes, {} groups, max_recvs {}",
        sizes.len(),
        sent_bytes,
        groups.len(),
        props.max_recvs
    );
}

/// Posts one receive, sends one message, and expects the receive to fail.
fn expect_failed_recv(net: &dyn Net, send_len: usize, send_tag: i32, cap: usize, recv_tag: i32) -> String {
    let (mut s, mut r) = connect_pair(net);
    let data = vec![7u8; send_len];
    let mut buf = vec![POISON; cap + 16];
    let mr = r.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();
    let smr = s.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();
    let posted = [RecvBuf { data: buf.as_mut_ptr(), size: cap, tag: recv_tag }];
    // SAFETY: buf and data outlive the comms, which are dropped at the end of this function.
    let rq = unsafe { r.irecv(&posted, &[&mr]) }.unwrap().expect("a free slot");
    // SAFETY: as above.
    let sq = unsafe { s.isend(data.as_ptr(), send_len, send_tag, &smr) }.unwrap().expect("a free slot");
    let until = Instant::now() + Duration::from_secs(20);
    let mut send_done = false;
    let verdict = loop {
        assert!(Instant::now() < until, "the bad receive neither failed nor completed within 20 s");
        if !send_done {
            send_done = s.test(&sq).map(|d| d.is_some()).unwrap_or(true);
        }
        match r.test(&rq) {
            Err(e) => break format!("ERR {e}"),
            Ok(Some(sz)) => break format!("COMPLETED {sz:?}"),
            Ok(None) => std::thread::sleep(Duration::from_micros(100)),
        }
    };
    assert!(buf[cap..].iter().all(|&x| x == POISON), "the receive wrote past its buffer");
    verdict
}

fn bad_messages() {
    let net = the_net();
    // More buffers than the device's maxRecvs: refused before the net sees them.
    let max = net.properties(0).unwrap().max_recvs;
    let (_s, mut r) = connect_pair(&*net);
    let mr = r.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();
    let empty = RecvBuf { data: std::ptr::null_mut(), size: 0, tag: 0 };
    let (bufs, mrs) = (vec![empty; max + 1], vec![&mr; max + 1]);
    // SAFETY: refused before any buffer is touched.
    let e = unsafe { r.irecv(&bufs, &mrs) }.map(|_| ()).unwrap_err();
    println!("TOOMANY {e}");
    println!("OVERSIZE {}", expect_failed_recv(&*net, 100, 1, 50, 1));
    println!("BADTAG {}", expect_failed_recv(&*net, 10, 2, 50, 1));
}

const DYING_BYTES: usize = 64 << 20;

fn read_stdin_line() -> String {
    let mut l = String::new();
    std::io::stdin().read_line(&mut l).unwrap();
    l
}

fn recv_from_dying() {
    let net = the_net();
    let (handle, mut listener) = net.listen(0).unwrap();
    let hex: String = handle.iter().map(|b| format!("{b:02x}")).collect();
    println!("HANDLE {hex}");
    let until = Instant::now() + Duration::from_secs(20);
    let mut r = loop {
        assert!(Instant::now() < until, "no connection within 20 s");
        if let Some(r) = listener.accept().unwrap() {
            break r;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    println!("ACCEPTED");
    // The parent says go once the sender is dead.
    read_stdin_line();
    let mut buf = vec![POISON; DYING_BYTES];
    let mr = r.reg_mr(buf.as_mut_ptr(), buf.len(), PtrKind::Host).unwrap();
    let posted = [RecvBuf { data: buf.as_mut_ptr(), size: DYING_BYTES, tag: 9 }];
    // SAFETY: buf outlives r.
    let rq = unsafe { r.irecv(&posted, &[&mr]) }.unwrap().expect("a free slot");
    let t = Instant::now();
    let verdict = loop {
        if t.elapsed() > Duration::from_secs(20) {
            break "HANG: no error 20 s after the sender died".to_string();
        }
        match r.test(&rq) {
            Err(e) => break format!("ERR after {:?}: {e}", t.elapsed()),
            Ok(Some(s)) => break format!("COMPLETED {s:?}"),
            Ok(None) => std::thread::sleep(Duration::from_micros(200)),
        }
    };
    println!("VERDICT {verdict}");
}

fn send_and_die() {
    let net = the_net();
    let hex = std::env::var("FN_HANDLE").unwrap();
    let mut handle = [0u8; net::HANDLE_BYTES];
    for (i, b) in handle.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    let mut conn = net.connect(0, &handle).unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let mut s = loop {
        assert!(Instant::now() < until, "no connection within 20 s");
        if let Some(s) = conn.poll().unwrap() {
            break s;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let data = pattern(1, DYING_BYTES);
    let mr = s.reg_mr(data.as_ptr() as *mut u8, data.len(), PtrKind::Host).unwrap();
    // SAFETY: data lives until the process ends below.
    let req = unsafe { s.isend(data.as_ptr(), data.len(), 9, &mr) }.unwrap().expect("a free slot");
    // Push what the socket buffers take, then die without closing anything.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(200) {
        assert!(s.test(&req).unwrap().is_none(), "64 MiB went out with nobody receiving");
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("DYING");
    std::io::stdout().flush().unwrap();
    // SAFETY: _exit ends the process at once, as a crash would, without running destructors.
    unsafe { libc::_exit(0) };
}
