//! The `ferronickel` command, run as a user runs it: each subcommand's text and `--json` output,
//! the settings table's sources (environment, conf file), plans against rings worked out by hand,
//! and bad input. Without a GPU, `topo --measure` and `perf` must fail with a clear message; on a
//! GPU machine they must run and (perf) find no wrong element.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// `ferronickel <args>` with a clean environment: only PATH, LD_LIBRARY_PATH (for a driver),
/// HOME (a scratch directory, so no `~/.nccl.conf` leaks in) and `env`.
fn ferronickel(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferronickel"));
    cmd.args(args).env_clear().env("HOME", scratch("cli-home"));
    for var in ["PATH", "LD_LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    cmd.envs(env.iter().copied());
    output_within(&mut cmd, LIMIT)
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn ok_text(args: &[&str], env: &[(&str, &str)]) -> String {
    let o = ferronickel(args, env);
    let (out, err) = text(&o);
    assert!(o.status.success(), "ferronickel {args:?} failed ({}):\n{out}\n{err}", o.status);
    out
}

fn ok_json(args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = ok_text(&a, env);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("ferronickel {a:?} printed invalid JSON ({e}):\n{out}"))
}

/// The failure message of a command that must fail; with `--json`, stdout must still parse.
fn failure(args: &[&str], env: &[(&str, &str)]) -> String {
    let o = ferronickel(args, env);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "ferronickel {args:?} should fail with status 1:\n{out}\n{err}");
    let mut a = args.to_vec();
    a.push("--json");
    let j = ferronickel(&a, env);
    let doc: Value = serde_json::from_slice(&j.stdout).expect("an error under --json is still JSON");
    assert!(doc["error"].as_str().is_some_and(|e| !e.is_empty()), "no error field: {doc}");
    err
}

/// clap's message for a command line it refuses: status 2, `error: …` and a pointer to `--help` on stderr;
/// with `--json`, the same message as `{"error": …}` on stdout.
fn usage_error(args: &[&str]) -> String {
    let o = ferronickel(args, &[]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "ferronickel {args:?} should be a usage error:\n{out}\n{err}");
    assert!(err.starts_with("error: ") && err.contains("try '--help'"), "not clap's message: {err}");
    let mut a = args.to_vec();
    a.push("--json");
    let j = ferronickel(&a, &[]);
    assert_eq!(j.status.code(), Some(2));
    let doc: Value = serde_json::from_slice(&j.stdout).expect("a usage error under --json is still JSON");
    assert!(doc["error"].as_str().is_some_and(|e| e.starts_with("error: ")), "no error field: {doc}");
    err
}

fn has_gpu() -> bool {
    ok_json(&["info"], &[])["gpu"]["available"].as_bool().expect("gpu.available is a bool")
}

fn conf_file(dir: &Path) -> String {
    let path = dir.join("nccl.conf");
    std::fs::write(&path, "# test conf\nNCCL_BUFFSIZE=0x200000\nFERRONICKEL_COPY_ENGINE=0\nNCCL_DEBUG=INFO\nOTHER=1\n")
        .unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn info_shows_versions_and_where_each_setting_came_from() {
    let conf = conf_file(&scratch("cli-info"));
    let env = [("NCCL_DEBUG", "WARN"), ("NCCL_CONF_FILE", conf.as_str()), ("NCCL_SOCKET_IFNAME", "lo")];
    let out = ok_text(&["info"], &env);
    assert!(out.contains("NCCL API 2.28.9, code 22809"), "{out}");
    // The environment wins over the conf file; conf-only settings name the file.
    assert!(out.contains("NCCL_DEBUG=WARN  (environment)"), "{out}");
    assert!(!out.contains("NCCL_DEBUG=INFO"), "{out}");
    assert!(out.contains(&format!("NCCL_BUFFSIZE=0x200000  (conf file {conf})")), "{out}");
    assert!(out.contains(&format!("FERRONICKEL_COPY_ENGINE=0  (conf file {conf})")), "{out}");
    assert!(out.contains(&format!("NCCL_CONF_FILE={conf}  (environment)")), "{out}");
    assert!(!out.contains("OTHER"), "only NCCL_* and FERRONICKEL_* are listed:\n{out}");
    assert!(out.contains("Bootstrap interfaces (NCCL_SOCKET_IFNAME=lo selects them)"), "{out}");
    assert!(out.contains("listeners bind lo (127.0.0.1)"), "{out}");
    assert!(out.contains("built-in Socket net: lo (127.0.0.1)"), "{out}");

    let j = ok_json(&["info"], &env);
    assert_eq!(j["nccl_version"], "2.28.9");
    assert_eq!(j["nccl_version_code"], 22809);
    let settings = j["settings"].as_array().expect("settings is an array");
    let find =
        |name: &str| settings.iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("{name} missing: {j}"));
    assert_eq!((&find("NCCL_DEBUG")["value"], &find("NCCL_DEBUG")["source"]), (&"WARN".into(), &"environment".into()));
    let buff = find("NCCL_BUFFSIZE");
    assert_eq!(
        (&buff["value"], &buff["source"], &buff["file"]),
        (&"0x200000".into(), &"conf file".into(), &conf.clone().into())
    );
    assert_eq!(settings.len(), 5, "exactly the five NCCL_*/FERRONICKEL_* settings: {settings:?}");
    assert_eq!(j["bootstrap"]["bind"], "127.0.0.1");
    let selected: Vec<&str> = j["bootstrap"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["selected"] == true)
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert!(!selected.is_empty() && selected.iter().all(|n| n.starts_with("lo")), "{selected:?}");

    // Without a GPU it says so and still printed everything above.
    if !j["gpu"]["available"].as_bool().unwrap() {
        assert!(out.contains("\nNo GPU: "), "{out}");
        assert!(j["gpu"]["reason"].as_str().is_some_and(|r| r.contains("CUDA")), "{j}");
        assert_eq!(j["cuda_driver_version"], Value::Null);
    } else {
        let devs = j["gpu"]["devices"].as_array().unwrap();
        assert!(!devs.is_empty());
        assert_eq!(j["gpu"]["p2p_access"].as_array().unwrap().len(), devs.len());
    }
}

#[test]
fn info_without_settings_and_with_an_interface_that_does_not_exist() {
    let out = ok_text(&["info"], &[("NCCL_SOCKET_IFNAME", "=no-such-if0")]);
    assert!(
        out.contains("nothing matches: init fails (Bootstrap: NCCL_SOCKET_IFNAME==no-such-if0 matches no"),
        "{out}"
    );
    assert!(out.contains("NCCL_SOCKET_IFNAME==no-such-if0  (environment)"), "{out}");
    let j = ok_json(&["info"], &[("NCCL_CONF_FILE", "/nonexistent/nccl.conf")]);
    assert_eq!(j["settings"].as_array().unwrap().len(), 1, "only NCCL_CONF_FILE itself: {j}");
    assert_eq!(j["bootstrap"]["socket_ifname"], Value::Null);
}

#[test]
fn info_shows_the_networks_between_hosts() {
    // A plugin named in NCCL_NET_PLUGIN that does not exist is not listed; the Socket net is.
    let j = ok_json(&["info"], &[("NCCL_NET_PLUGIN", "no-such-plugin")]);
    assert_eq!(j["network"]["used_by_communicators"], Value::Bool(false), "{j}");
    assert_eq!(j["network"]["plugins"].as_array().map(Vec::len), Some(0), "{j}");
    assert!(j["network"]["socket"]["interfaces"].as_array().is_some_and(|v| !v.is_empty()), "{j}");
    // An interface spec that matches nothing is named, with the interfaces that do exist.
    let out = ok_text(&["info"], &[("NCCL_SOCKET_IFNAME", "=no-such-if0")]);
    assert!(
        out.contains("built-in Socket net: unusable: NET/Socket: NCCL_SOCKET_IFNAME==no-such-if0 matches no"),
        "{out}"
    );
    assert!(out.contains("Interfaces that are up: lo (127.0.0.1)"), "{out}");
}

fn ring(j: &Value) -> Vec<u64> {
    j["rings"][0].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
}

fn choice(j: &Value, bytes: u64, coll: &str) -> (String, String) {
    let row = j["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["bytes"] == bytes)
        .unwrap_or_else(|| panic!("no {bytes} B row"));
    let c = &row["choices"][coll];
    (c["algorithm"].as_str().unwrap().into(), c["protocol"].as_str().unwrap().into())
}

#[test]
fn plan_matches_rings_worked_out_by_hand() {
    // 2 hosts x 2 GPUs, 8 ranks: host 0 has ranks 0-3, rank l on GPU l % 2, so GPU 0 holds 0,2
    // and GPU 1 holds 1,3; the ring visits them GPU by GPU, host by host. Peers on the other host
    // are reached over NET, which caps the channels at the 4 the built-in net's link can use.
    let j = ok_json(&["plan", "--nranks", "8", "--hosts", "2", "--gpus-per-host", "2"], &[]);
    assert_eq!(ring(&j), [0, 2, 1, 3, 4, 6, 5, 7]);
    assert_eq!((j["ring_channels"].as_u64(), j["max_ranks_per_gpu"].as_u64()), (Some(4), Some(2)));
    assert!(j["notes"][0].as_str().unwrap().contains("connect over NET"), "{j}");
    // The built-in net's connections: one proxy thread for both halves, as a communicator's get.
    assert_eq!(j["net_link"]["proxy_threads"], "one thread", "{j}");
    let split = [("FERRONICKEL_NET_PROXY_THREADS", "2"), ("FERRONICKEL_NET_PROXY_SEND_THREADS", "3")];
    let j = ok_json(&["plan", "--nranks", "8", "--hosts", "2", "--gpus-per-host", "2"], &split);
    let threads = j["net_link"]["proxy_threads"].as_str().unwrap();
    assert!(threads.starts_with("3 threads for the send halves"), "{j}");
    // Host-memory FIFOs: no one-shot all-reduce for more than two ranks.
    assert_ne!(choice(&j, 16, "all_reduce").0, "OneShot");
    // Two trees between the 2 hosts (chain heads 0 and 4, chains in ring order): tree 0 rooted at
    // host 1's head, tree 1 at host 0's; the other head hangs below the root, 1 + 3 hops deep.
    let roots: Vec<_> = j["trees"].as_array().unwrap().iter().map(|t| t["root"].as_u64().unwrap()).collect();
    assert_eq!(roots, [4, 0]);
    assert_eq!((j["trees"][0]["depth"].as_u64(), j["tree_hosts"].as_u64()), (Some(4), Some(2)));

    // One host of 4 GPUs: the identity ring, 64 channels, one-shot limited to the 4 p2p channels.
    let j = ok_json(&["plan", "--nranks", "4", "--gpus-per-host", "4"], &[]);
    assert_eq!(ring(&j), [0, 1, 2, 3]);
    assert_eq!((j["ring_channels"].as_u64(), j["oneshot_channels"].as_u64()), (Some(64), Some(4)));

    // Two GPUs: the tuner's measured crossovers (src/tuner.rs tests): one-shot LL for small
    // all-reduces, the Simple ring for large ones.
    let j = ok_json(&["plan", "--nranks", "2", "--gpus-per-host", "2"], &[]);
    assert_eq!(choice(&j, 16, "all_reduce"), ("OneShot".into(), "LL".into()));
    assert_eq!(choice(&j, 1 << 30, "all_reduce"), ("Ring".into(), "Simple".into()));
    assert_eq!(choice(&j, 16, "all_gather"), ("Ring".into(), "LL".into()));
    assert_eq!(j["sizes"].as_array().unwrap().len(), 14, "16 B to 1 GiB by factors of 4");

    // P2P disabled: SHM, whose host-memory FIFOs rule out the one-shot for more than two ranks.
    let j = ok_json(&["plan", "--nranks", "4", "--gpus-per-host", "4"], &[("NCCL_P2P_DISABLE", "1")]);
    assert_eq!(choice(&j, 16, "all_reduce").0, "Ring");
    let j = ok_json(&["plan", "--nranks", "2", "--gpus-per-host", "2"], &[("NCCL_P2P_DISABLE", "1")]);
    assert_eq!(choice(&j, 16, "all_reduce").0, "OneShot");

    // The environment restricts it exactly as it restricts a communicator.
    let env = [("NCCL_PROTO", "Simple"), ("NCCL_MAX_NCHANNELS", "8")];
    let j = ok_json(&["plan", "--nranks", "2", "--gpus-per-host", "2"], &env);
    assert_eq!(j["ring_channels"], 8);
    for row in j["sizes"].as_array().unwrap() {
        for (_, c) in row["choices"].as_object().unwrap() {
            assert_eq!(c["protocol"], "Simple", "{row}");
        }
    }

    let out = ok_text(&["plan", "--nranks", "8", "--hosts", "2", "--gpus-per-host", "2"], &[]);
    assert!(out.contains("ring (every channel): 0 -> 2 -> 1 -> 3 -> 4 -> 6 -> 5 -> 7"), "{out}");
    // Ranks on two hosts: the channels the built-in net's link can use (tuner::net_channels).
    assert!(out.contains("4 ring channels") && out.contains("connect over NET"), "{out}");
    // NCCL_MIN_NCHANNELS raises them, as NCCL copies its rings up to it, and large collectives
    // use them all.
    let j = ok_json(&["plan", "--nranks", "4", "--hosts", "4"], &[("NCCL_MIN_NCHANNELS", "6")]);
    assert_eq!(j["ring_channels"], 6);
    let largest = j["sizes"].as_array().unwrap().last().unwrap();
    assert_eq!(largest["choices"]["all_gather"]["channels"], 6, "{largest}");
    // Send/recv peers on other hosts: NCCL_NCHANNELS_PER_PEER's channels, or as many as
    // NCCL_NCHANNELS_PER_NET_PEER asks for.
    let j = ok_json(&["plan", "--nranks", "4", "--hosts", "4"], &[]);
    assert_eq!(j["net_peer_channels"], 4);
    // Send/recv in LL up to 2 KiB a part across hosts, 16 KiB on one, or as NCCL_P2P_LL_THRESHOLD says.
    assert_eq!(j["p2p_ll_bytes_per_part"], 2048);
    let j = ok_json(&["plan", "--nranks", "4", "--gpus-per-host", "4"], &[]);
    assert_eq!(j["p2p_ll_bytes_per_part"], 16384);
    let out = ok_text(&["plan", "--nranks", "4", "--hosts", "4"], &[("NCCL_P2P_LL_THRESHOLD", "0")]);
    assert!(out.contains("send/recv: LL while a part carries at most 0 B"), "{out}");
    let out = ok_text(&["plan", "--nranks", "4", "--hosts", "4"], &[("NCCL_NCHANNELS_PER_NET_PEER", "1")]);
    assert!(out.contains("1 channel(s) each, connected when first used") && out.contains("at most 1"), "{out}");
    // Not on one host, where no peer is over NET.
    let out = ok_text(&["plan", "--nranks", "4", "--gpus-per-host", "4"], &[("NCCL_NCHANNELS_PER_NET_PEER", "1")]);
    assert!(!out.contains("peers on other hosts"), "{out}");

    // A small broadcast over four hosts of two goes direct: from rank 0 to each other host's first
    // rank, then to its own host's other; each host's first rank on to its other.
    let j = ok_json(&["plan", "--nranks", "8", "--hosts", "4", "--gpus-per-host", "2"], &[]);
    assert_eq!(choice(&j, 16, "broadcast").0, "Direct");
    let sends: Vec<Vec<u64>> = j["direct_broadcast_sends_from_root_0"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_array().unwrap().iter().map(|r| r.as_u64().unwrap()).collect())
        .collect();
    assert_eq!(sends, [vec![2, 4, 6, 1], vec![], vec![3], vec![], vec![5], vec![], vec![7], vec![]]);
    // Over two hosts the ring crosses NET once too: no direct broadcast.
    let j = ok_json(&["plan", "--nranks", "8", "--hosts", "2", "--gpus-per-host", "2"], &[]);
    assert!(j["direct_broadcast_sends_from_root_0"].is_null(), "{j}");
    assert_eq!(choice(&j, 16, "broadcast").0, "Ring");
}

#[test]
fn plan_over_the_socket_net_keeps_its_measured_constants() {
    // Two hosts over the built-in Socket net: every choice as the tuner makes it from the link as
    // measured (LL up to a few KB since LL's head wait, docs/NET.md "Small steps"), unchanged by
    // net plugins' properties pricing NET.
    let j = ok_json(&["plan", "--nranks", "2", "--hosts", "2"], &[("NCCL_SOCKET_IFNAME", "lo")]);
    assert_eq!(j["ring_channels"], 4);
    let net = &j["net_link"];
    assert_eq!((net["net"].as_str(), net["channels"].as_u64()), (Some("Socket"), Some(4)), "{net}");
    assert_eq!((net["hop_us"].as_f64(), net["gbps"].as_f64()), (Some(36.0), Some(8.2)), "{net}");
    let expected: [(&str, &str); 14] = [
        ("OneShot/LL 1ch 30.0us", "Ring/LL 1ch 30.0us"),
        ("OneShot/LL 1ch 30.1us", "Ring/LL 1ch 30.0us"),
        ("OneShot/LL 1ch 30.4us", "Ring/LL 1ch 30.2us"),
        ("OneShot/LL 1ch 31.6us", "Ring/LL 1ch 30.7us"),
        ("OneShot/LL 1ch 36.4us", "Ring/LL 1ch 33.0us"),
        ("OneShot/Simple 1ch 43.7us", "Ring/Simple 1ch 39.6us"),
        ("OneShot/Simple 2ch 66.3us", "Ring/Simple 1ch 50.2us"),
        ("OneShot/Simple 3ch 106.9us", "Ring/Simple 2ch 79.5us"),
        ("OneShot/Simple 4ch 218.5us", "Ring/Simple 3ch 142.0us"),
        ("OneShot/Simple 4ch 631.0us", "Ring/Simple 4ch 336.8us"),
        ("Ring/Simple 4ch 2208.0us", "Ring/Simple 4ch 1104.0us"),
        ("Ring/Simple 4ch 8346.0us", "Ring/Simple 4ch 4173.0us"),
        ("Ring/Simple 4ch 32898.0us", "Ring/Simple 4ch 16449.0us"),
        ("Ring/Simple 4ch 131106.1us", "Ring/Simple 4ch 65553.1us"),
    ];
    let rows = j["sizes"].as_array().unwrap();
    assert_eq!(rows.len(), expected.len());
    for (row, (all_reduce, all_gather)) in rows.iter().zip(expected) {
        let show = |c: &Value| {
            format!(
                "{}/{} {}ch {:.1}us",
                c["algorithm"].as_str().unwrap(),
                c["protocol"].as_str().unwrap(),
                c["channels"],
                c["modelled_us"].as_f64().unwrap()
            )
        };
        let got = (show(&row["choices"]["all_reduce"]), show(&row["choices"]["all_gather"]));
        assert_eq!(got, (all_reduce.to_string(), all_gather.to_string()), "{} bytes", row["bytes"]);
    }
}

#[test]
fn plan_rejects_bad_input_naming_it() {
    let e = failure(&["plan", "--nranks", "2", "--gpus-per-host", "2"], &[("NCCL_PROTO", "LL256")]);
    assert!(e.contains("NCCL_PROTO=LL256"), "{e}");
    assert!(usage_error(&["plan", "--gpus-per-host", "2"]).contains("--nranks <N>"));
    let e = usage_error(&["plan", "--nranks", "0", "--gpus-per-host", "2"]);
    assert!(e.contains("invalid value '0' for '--nranks <N>': not a positive integer"), "{e}");
    assert!(failure(&["plan", "--nranks", "3", "--hosts", "2", "--gpus-per-host", "2"], &[]).contains("evenly"));
    assert!(failure(&["plan", "--nranks", "3", "--hosts", "2"], &[]).contains("does not divide evenly over --hosts 2"));
    assert!(failure(&["plan", "--nranks", "99999999", "--gpus-per-host", "2"], &[]).contains("65536"));
    let e = usage_error(&["plan", "--nranks", "2", "--gpus-per-host", "2", "--bogus", "1"]);
    assert!(e.contains("unexpected argument '--bogus'"), "{e}");
    // "This machine": its GPUs, or, without any, a pointer to describing one.
    if has_gpu() {
        ok_json(&["plan", "--nranks", "2"], &[]);
    } else {
        assert!(failure(&["plan", "--nranks", "2"], &[]).contains("describe the machine with --gpus-per-host"));
    }
}

#[test]
fn plan_of_several_hosts_without_a_gpu_puts_one_rank_on_each_gpu() {
    if has_gpu() {
        return; // this machine's GPUs count; the rule is for describing a machine from anywhere
    }
    // 16 ranks over 2 hosts: 8 GPUs a host, host 0 holds ranks 0-7 in GPU order.
    let j = ok_json(&["plan", "--nranks", "16", "--hosts", "2"], &[]);
    assert_eq!((j["gpus_per_host"].as_u64(), j["max_ranks_per_gpu"].as_u64()), (Some(8), Some(1)), "{j}");
    assert_eq!(ring(&j), (0..16).collect::<Vec<u64>>());
    // The same as saying so.
    let given = ok_json(&["plan", "--nranks", "16", "--hosts", "2", "--gpus-per-host", "8"], &[]);
    assert_eq!(j, given);
}

#[test]
fn topo_needs_measure_and_a_gpu() {
    assert!(failure(&["topo"], &[]).contains("needs --measure"));
    assert!(failure(&["topo", "--measure", "--bytes", "8"], &[]).contains("--bytes"));
    let args = ["topo", "--measure", "--bytes", "1M", "--iters", "2"];
    if has_gpu() {
        let j = ok_json(&args, &[]);
        let n = j["gpus"].as_array().unwrap().len();
        for key in
            ["ce_unidirectional_gbps", "ce_bidirectional_gbps", "sm_unidirectional_gbps", "sm_bidirectional_gbps"]
        {
            let m = j[key].as_array().unwrap();
            assert_eq!(m.len(), n, "{key}");
            assert!(m[0][0].as_f64().is_some_and(|v| v > 0.0), "{key}: a GPU always reaches itself: {j}");
        }
    } else {
        let e = failure(&args, &[]);
        assert!(e.contains("topo --measure needs a GPU: no CUDA driver found"), "{e}");
    }
}

#[test]
fn perf_checks_results_or_says_it_needs_a_gpu() {
    assert!(failure(&["perf", "all_reduce", "allreduce"], &[]).contains("unknown collective \"allreduce\""));
    assert!(failure(&["perf", "--factor", "1"], &[]).contains("--factor >= 2"));
    let args = ["perf", "--max-bytes", "64K", "--iters", "2", "--warmup", "1"];
    if has_gpu() {
        let j = ok_json(&args, &[]);
        assert_eq!(j["wrong_total"], 0, "{j}");
        assert!(!j["rows"].as_array().unwrap().is_empty());
        let out = ok_text(&args, &[]);
        assert!(out.contains("#wrong") && out.contains("all_reduce"), "{out}");
    } else {
        let e = failure(&args, &[]);
        assert!(e.contains("perf needs a GPU: no CUDA driver found"), "{e}");
    }
}

#[test]
fn usage_and_unknown_commands() {
    for args in [&["--help"][..], &["help"], &[]] {
        let out = ok_text(args, &[]);
        assert!(out.contains("Usage: ferronickel [OPTIONS] [COMMAND]"), "{args:?}: {out}");
        for cmd in ["info", "topo", "plan", "perf"] {
            assert!(out.lines().any(|l| l.trim_start().starts_with(cmd)), "{args:?}: {cmd} not listed: {out}");
        }
    }
    assert!(usage_error(&["frobnicate"]).contains("unrecognized subcommand 'frobnicate'"));
}

#[test]
fn every_command_answers_help_with_its_options() {
    let cases: [(&str, &[&str]); 4] = [
        ("info", &["--json"]),
        ("topo", &["--measure", "--bytes <B>", "--iters <N>"]),
        ("plan", &["--nranks <N>", "--hosts <H>", "--gpus-per-host <G>"]),
        ("perf", &["[COLLECTIVE]...", "--ranks-per-gpu <R>", "--min-bytes <B>", "--max-bytes <B>", "--factor <F>"]),
    ];
    for (cmd, options) in cases {
        for args in [vec![cmd, "--help"], vec![cmd, "-h"], vec!["help", cmd]] {
            let out = ok_text(&args, &[]);
            assert!(out.contains(&format!("Usage: ferronickel {cmd}")), "{args:?}: {out}");
            for opt in options {
                assert!(out.contains(opt), "{args:?} does not mention {opt}: {out}");
            }
        }
    }
}

#[test]
fn a_bad_option_is_a_usage_error_naming_it() {
    for cmd in ["info", "topo", "plan", "perf"] {
        let e = usage_error(&[cmd, "--bogus"]);
        assert!(e.contains("unexpected argument '--bogus' found"), "{cmd}: {e}");
        assert!(e.contains(&format!("Usage: ferronickel {cmd}")), "{cmd}: {e}");
    }
    let e = usage_error(&["topo", "--measure=yes"]);
    assert!(e.contains("--measure"), "{e}");
    let e = usage_error(&["perf", "--iters", "many"]);
    assert!(e.contains("invalid value 'many' for '--iters <N>'"), "{e}");
}
