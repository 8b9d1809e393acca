//! Cross-host paths on hosts of our own (`tests/common/hosts.rs`): every rank is a process in a
//! network namespace of its own, with its own interfaces, addresses and host name, joined to the
//! others through veth pairs and a bridge. No `NCCL_HOSTID` anywhere: hosts are told apart as
//! in production, by host name and boot id.
//!
//! - the bootstrap across 2 and 4 hosts (`NCCL_COMM_ID` on host 0's address, rank 0 runs the
//!   root), IPv4 and IPv6-only (`NCCL_SOCKET_FAMILY=AF_INET6`);
//! - `NCCL_SOCKET_IFNAME` prefix, `=exact`, `^exclude` and no match, on hosts with two
//!   interfaces of different names, for the bootstrap and the Socket net;
//! - host identity: different host names are different hosts; one host name in two network
//!   namespaces of one kernel (one boot id) is one host;
//! - the NET transport's proxy and the Socket net moving checked data between two hosts (IPv4
//!   and IPv6-only), and what they and the liveness watcher say when the network fails under
//!   them: a link down and back up before the timeouts (nothing is lost; the late heartbeat is
//!   a slow network), a link down for good and a host whose network vanishes (the dead network
//!   is named, by the watcher within the heartbeat timeout and by the Socket net alone within
//!   its TCP timeout), a peer whose process stops (a live network, a silent peer: said so, and
//!   not cut by the Socket net), connections reset by the peer's host.
//!
//! Each rank runs this test binary again inside its host (`FNH_TEST` names the test it runs).
//! Skips (passes, saying "SKIP: ..." on stderr) only without root or without iproute2.

mod common;

use common::hosts::{Hosts, Net, Procs};
use nccl::bootstrap::{new_unique_id, Bootstrap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The port of the bootstrap root on host 0 (each test has hosts of its own: no clashes).
const ROOT_PORT: u16 = 29500;
/// Init timeout given to the ranks; every test ends well within [`LIMIT`].
const INIT: Duration = Duration::from_secs(20);
const LIMIT: Duration = Duration::from_secs(40);

/// The environment variable that makes this binary a rank of the named test.
const CHILD: &str = "FNH_TEST";

fn var(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"))
}

/// In a rank process: runs the rank and returns true. In the test itself: false.
fn rank_of(test: &str, body: impl FnOnce(usize, usize)) -> bool {
    if std::env::var(CHILD).as_deref() != Ok(test) {
        return false;
    }
    body(var("FNH_RANK").parse().unwrap(), var("FNH_NRANKS").parse().unwrap());
    true
}

/// Starts one rank of `test` in each host `i` of `hosts`, named `names[i]`, with `env`.
fn spawn_ranks(hosts: &Hosts, test: &str, names: &[&str], env: &[(&str, String)]) -> Procs {
    let exe = std::env::current_exe().unwrap();
    let mut procs = Procs::default();
    for (i, name) in names.iter().enumerate() {
        let mut c =
            hosts.command(i, name, exe.to_str().unwrap(), &["--exact", test, "--nocapture", "--test-threads=1"]);
        c.env(CHILD, test).env("FNH_RANK", i.to_string()).env("FNH_NRANKS", names.len().to_string());
        c.env_remove("NCCL_HOSTID").env_remove("NCCL_SOCKET_IFNAME").env_remove("NCCL_SOCKET_FAMILY");
        for (k, v) in env {
            c.env(k, v);
        }
        procs.spawn(c);
    }
    procs
}

/// What follows `key` on the first line of `out` holding it (the test harness may have written
/// the test's name before it on the same line).
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.split_once(key).map(|(_, v)| v.trim()))
        .unwrap_or_else(|| panic!("no {key} line in:\n{out}"))
}

// ---------------------------------------------------------------------------------------------
// The bootstrap across hosts

/// A rank: joins the bootstrap (`NCCL_COMM_ID` names the root), gathers every rank's host name,
/// listen address and host hash, and prints them with the Socket net's devices.
/// With `FNH_EXPECT_ERR` set, the init and the Socket net must both fail: their errors are
/// printed.
fn boot_rank(rank: usize, n: usize) {
    let id = new_unique_id().expect("unique id from NCCL_COMM_ID");
    if std::env::var_os("FNH_EXPECT_ERR").is_some() {
        let e = Bootstrap::init(&id, rank, n, INIT).err().expect("init must fail");
        println!("FNH_BOOT_ERR {e}");
        let e = nccl::transport::net::socket::select_interfaces().expect_err("the Socket net must find no device");
        println!("FNH_NET_ERR {e}");
        println!("FNH_OK");
        return;
    }
    let bs = Bootstrap::init(&id, rank, n, INIT).expect("bootstrap init");
    let me = format!("{} {} {:x}", nccl::debug::host_name(), bs.listen_addr(), nccl::topo::host_hash());
    let all = bs.allgather(me.as_bytes()).expect("allgather");
    for (r, line) in all.iter().enumerate() {
        println!("FNH_PEER {r} {}", String::from_utf8_lossy(line));
    }
    let devs = nccl::transport::net::socket::select_interfaces().expect("the Socket net's devices");
    println!("FNH_NETDEV {}", devs.iter().map(|(n, ip)| format!("{n}={ip}")).collect::<Vec<_>>().join(","));
    bs.barrier().expect("barrier");
    println!("FNH_OK");
}

/// One rank's line about rank `r`: (host name, listen address, host hash).
fn peer(out: &str, r: usize) -> (String, std::net::SocketAddr, String) {
    let f: Vec<&str> = field(out, &format!("FNH_PEER {r}")).split(' ').collect();
    (f[0].to_string(), f[1].parse().unwrap(), f[2].to_string())
}

/// Runs [`boot_rank`] on `names.len()` hosts of `nets` with `env`; returns every rank's output.
fn boot(test: &str, nets: &[Net], names: &[&str], env: &[(&str, String)]) -> Option<(Hosts, Vec<String>)> {
    let hosts = Hosts::new(test, names.len(), nets)?;
    let mut procs = spawn_ranks(&hosts, test, names, env);
    let outs = procs.expect_ok(LIMIT, "FNH_OK");
    drop(procs);
    Some((hosts, outs))
}

/// n ranks on n hosts: every rank sees every other on its own host's address, under its own
/// host name, with a host hash of its own.
fn across(test: &str, n: usize) {
    let names: Vec<String> = (0..n).map(|i| format!("h{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let env = [("NCCL_COMM_ID", format!("198.18.0.1:{ROOT_PORT}"))];
    let Some((hosts, outs)) = boot(test, &[Net::v4("eth")], &names, &env) else { return };
    for (me, out) in outs.iter().enumerate() {
        let table: Vec<_> = (0..n).map(|r| peer(out, r)).collect();
        for (r, (host, addr, _)) in table.iter().enumerate() {
            assert_eq!(host, names[r], "{out}");
            assert_eq!(addr.ip(), hosts.v4(r, 0), "rank {r} listens on its host's address:\n{out}");
        }
        let mut hashes: Vec<&String> = table.iter().map(|t| &t.2).collect();
        hashes.sort();
        hashes.dedup();
        assert_eq!(hashes.len(), n, "every host has a hash of its own:\n{out}");
        assert_eq!(field(out, "FNH_NETDEV"), format!("eth0={}", hosts.v4(me, 0)), "{out}");
    }
}

#[test]
fn bootstrap_across_2_hosts() {
    if rank_of("bootstrap_across_2_hosts", boot_rank) {
        return;
    }
    across("bootstrap_across_2_hosts", 2);
}

#[test]
fn bootstrap_across_4_hosts() {
    if rank_of("bootstrap_across_4_hosts", boot_rank) {
        return;
    }
    across("bootstrap_across_4_hosts", 4);
}

// ---------------------------------------------------------------------------------------------
// NCCL_SOCKET_IFNAME and NCCL_SOCKET_FAMILY on real interfaces

/// Two hosts with two interfaces each, `data0` (198.18.0.x) and `ctl0` (198.18.1.x); the
/// bootstrap and the Socket net must both use the one of network `want`.
fn ifname(test: &str, spec: Option<&str>, root_net: usize, want: usize) {
    let mut env = vec![("NCCL_COMM_ID", format!("198.18.{root_net}.1:{ROOT_PORT}"))];
    env.extend(spec.map(|s| ("NCCL_SOCKET_IFNAME", s.to_string())));
    let Some((hosts, outs)) = boot(test, &[Net::v4("data"), Net::v4("ctl")], &["h0", "h1"], &env) else { return };
    for (me, out) in outs.iter().enumerate() {
        for r in 0..2 {
            assert_eq!(peer(out, r).1.ip(), hosts.v4(r, want), "{spec:?}: rank {r}'s bootstrap address:\n{out}");
        }
        assert_eq!(field(out, "FNH_NETDEV"), format!("{}={}", hosts.iface(want), hosts.v4(me, want)), "{spec:?}");
    }
}

#[test]
fn ifname_prefix_picks_that_interface() {
    if rank_of("ifname_prefix_picks_that_interface", boot_rank) {
        return;
    }
    ifname("ifname_prefix_picks_that_interface", Some("data"), 0, 0);
}

#[test]
fn ifname_exact_picks_that_interface() {
    if rank_of("ifname_exact_picks_that_interface", boot_rank) {
        return;
    }
    ifname("ifname_exact_picks_that_interface", Some("=ctl0"), 1, 1);
}

#[test]
fn ifname_exclusion_leaves_the_other_interface() {
    if rank_of("ifname_exclusion_leaves_the_other_interface", boot_rank) {
        return;
    }
    ifname("ifname_exclusion_leaves_the_other_interface", Some("^data,lo"), 1, 1);
}

/// No NCCL_SOCKET_IFNAME: the interface on NCCL_COMM_ID's subnet wins over the first one.
#[test]
fn without_ifname_the_comm_id_subnet_wins() {
    if rank_of("without_ifname_the_comm_id_subnet_wins", boot_rank) {
        return;
    }
    ifname("without_ifname_the_comm_id_subnet_wins", None, 1, 1);
}

/// An NCCL_SOCKET_IFNAME that matches nothing: init and the Socket net fail, naming the spec and
/// the interfaces there are.
#[test]
fn ifname_matching_nothing_fails_naming_the_interfaces() {
    const TEST: &str = "ifname_matching_nothing_fails_naming_the_interfaces";
    if rank_of(TEST, boot_rank) {
        return;
    }
    let env = [
        ("NCCL_COMM_ID", format!("198.18.0.1:{ROOT_PORT}")),
        ("NCCL_SOCKET_IFNAME", "ib".to_string()),
        ("FNH_EXPECT_ERR", "1".to_string()),
    ];
    let Some((_hosts, outs)) = boot(TEST, &[Net::v4("data"), Net::v4("ctl")], &["h0", "h1"], &env) else { return };
    for out in &outs {
        for key in ["FNH_BOOT_ERR", "FNH_NET_ERR"] {
            let e = field(out, key);
            assert!(e.contains("NCCL_SOCKET_IFNAME=ib matches no usable interface"), "{out}");
            assert!(e.contains("data0 (198.18.0.") && e.contains("ctl0 (198.18.1."), "{out}");
        }
    }
}

/// IPv6-only hosts (each interface also has its fe80:: link-local address, as every IPv6
/// interface does): the bootstrap and the Socket net use the ULA addresses.
#[test]
fn ipv6_only_hosts() {
    const TEST: &str = "ipv6_only_hosts";
    if rank_of(TEST, boot_rank) {
        return;
    }
    let root = std::net::Ipv6Addr::new(0xfd42, 0x6e62, 0, 0, 0, 0, 0, 1);
    let env = [("NCCL_COMM_ID", format!("[{root}]:{ROOT_PORT}")), ("NCCL_SOCKET_FAMILY", "AF_INET6".to_string())];
    let Some((hosts, outs)) = boot(TEST, &[Net::v6("eth")], &["h0", "h1", "h2"], &env) else { return };
    for (me, out) in outs.iter().enumerate() {
        for r in 0..3 {
            assert_eq!(peer(out, r).1.ip(), IpAddr::V6(hosts.v6(r, 0)), "rank {r}'s bootstrap address:\n{out}");
        }
        assert_eq!(field(out, "FNH_NETDEV"), format!("eth0={}", hosts.v6(me, 0)), "{out}");
    }
}

// ---------------------------------------------------------------------------------------------
// Host identity without NCCL_HOSTID

/// One host name in two network namespaces of one kernel is one host: the host hash is the
/// host name and the boot id, as NCCL's. Ranks there would use the intra-host transports (SHM
/// through /proc/<pid>/fd, CUDA IPC), which work across network namespaces: these share the
/// kernel, /proc and the GPUs. The bootstrap between them runs over their own interfaces.
#[test]
fn one_host_name_on_one_kernel_is_one_host() {
    const TEST: &str = "one_host_name_on_one_kernel_is_one_host";
    if rank_of(TEST, boot_rank) {
        return;
    }
    let env = [("NCCL_COMM_ID", format!("198.18.0.1:{ROOT_PORT}"))];
    let Some((hosts, outs)) = boot(TEST, &[Net::v4("eth")], &["twin", "twin", "other"], &env) else { return };
    for out in &outs {
        let t: Vec<_> = (0..3).map(|r| peer(out, r)).collect();
        assert_eq!(t[0].2, t[1].2, "same host name, same boot id: one host\n{out}");
        assert_ne!(t[0].2, t[2].2, "another host name: another host\n{out}");
        for (r, p) in t.iter().enumerate() {
            assert_eq!(p.1.ip(), hosts.v4(r, 0), "{out}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The NET transport between hosts, and network faults under it

use nccl::abi::{FN_NSTEPS, FN_PROTO_SIMPLE, FN_SIZE_PROTO_SHIFT};
use nccl::bootstrap::liveness::{Lost, Observer};
use nccl::transport::net::conn::{NetTransport, Setup};
use nccl::transport::net::proxy::{HostBlock, RECV_HEAD, RECV_TAIL, SEND_HEAD, SEND_SIZES, SEND_TAIL};
use nccl::transport::net::NetConfig;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

/// Bytes of one step (a full Simple slot) and channels per rank pair.
const SLOT: usize = 64 << 10;
const CHANNELS: usize = 2;
/// The heartbeat timeout the fault tests give their ranks, and the Socket net's TCP timeout.
const HEARTBEAT_MS: u64 = 2000;
const TCP_MS: u64 = 1500;
/// Detection bounds are the timeout plus this: the heartbeat period (1 s: the last beat heard
/// may be that old when the fault begins) and room for a loaded 2-core machine.
const SLACK_MS: u64 = 2500;
/// The defaults (FERRONICKEL_HEARTBEAT_TIMEOUT_MS, FERRONICKEL_NET_TCP_TIMEOUT_MS).
const HEARTBEAT_DEFAULT_MS: u64 = 5000;
const TCP_DEFAULT_MS: u64 = 20000;

/// CLOCK_MONOTONIC in milliseconds: one clock for the test and its ranks (one kernel), so a
/// rank's "noticed at" and the test's "pulled the link at" compare.
fn mono_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Word `i` of the step `step` that `from` sends on `ch`: random-looking, seeded by the test.
fn word(seed: u64, from: usize, ch: usize, step: u64, i: usize) -> u64 {
    let mut z = seed ^ (from as u64) << 60 ^ (ch as u64) << 52 ^ step << 24 ^ i as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// What the liveness watcher finds, printed with the time it was found.
struct Printer {
    names: Vec<String>,
    stop: Arc<AtomicBool>,
}

impl Observer for Printer {
    fn describe(&self, rank: usize) -> String {
        self.names[rank].clone()
    }
    fn lost(&self, lost: Lost) {
        println!("\nFNH_LOST {} {}", mono_ms(), lost.text);
        self.stop.store(true, Ordering::Release);
    }
    fn left(&self, rank: usize, _colls: Option<u64>) {
        println!("\nFNH_LEFT {rank}");
    }
    fn state(&self) -> String {
        String::new()
    }
    fn report(&self, _lines: Vec<String>) {}
}

/// Waits until `ready()` or `stop`; false when stopped or past `deadline` (said on stdout).
fn wait_until(ready: impl Fn() -> bool, stop: &AtomicBool, deadline: Instant, what: &str) -> bool {
    while !ready() {
        if stop.load(Ordering::Acquire) {
            return false;
        }
        if Instant::now() > deadline {
            println!("\nFNH_TIMEOUT waiting for {what}");
            stop.store(true, Ordering::Release);
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    true
}

/// How long a rank's steps may take in all: [`LIMIT`], plus the TCP timeout it runs with, for
/// which a link may stay deaf with nothing failing (a link down and back up waits out TCP's
/// retransmission backoff, 30 s and more on a loaded machine).
fn steps_deadline() -> Instant {
    Instant::now() + LIMIT + Duration::from_millis(var("FERRONICKEL_NET_TCP_TIMEOUT_MS").parse().unwrap())
}

/// Sends `steps` steps of checked data on `ch`, `pace` apart.
fn send_steps(
    b: &HostBlock,
    slot_at: usize,
    me: usize,
    ch: usize,
    steps: u64,
    pace: Duration,
    stop: &AtomicBool,
) -> bool {
    let (seed, deadline) = (var("FNH_SEED").parse().unwrap(), steps_deadline());
    for s in 0..steps {
        if !wait_until(|| b.load_u64(SEND_HEAD) + FN_NSTEPS as u64 > s, stop, deadline, "a free send slot") {
            return false;
        }
        let at = slot_at + (s % FN_NSTEPS as u64) as usize * SLOT;
        // SAFETY: the slot is SLOT bytes of the block, 8-byte aligned, and the proxy leaves it
        // alone until the tail passes this step.
        let words = unsafe { std::slice::from_raw_parts_mut(b.ptr(at, SLOT) as *mut u64, SLOT / 8) };
        for (i, w) in words.iter_mut().enumerate() {
            *w = word(seed, me, ch, s, i);
        }
        b.store_u32(
            SEND_SIZES + 4 * (s % FN_NSTEPS as u64) as usize,
            SLOT as u32 | FN_PROTO_SIMPLE << FN_SIZE_PROTO_SHIFT,
        );
        fence(Ordering::SeqCst);
        b.store_u64(SEND_TAIL, s + 1);
        std::thread::sleep(pace);
    }
    true
}

/// Receives `steps` steps from `peer` on `ch` and checks every word; false on a mismatch (said).
fn recv_steps(b: &HostBlock, slot_at: usize, peer: usize, ch: usize, steps: u64, stop: &AtomicBool) -> bool {
    let (seed, deadline) = (var("FNH_SEED").parse().unwrap(), steps_deadline());
    for s in 0..steps {
        if !wait_until(|| b.load_u64(RECV_TAIL) > s, stop, deadline, "a step to arrive") {
            return false;
        }
        fence(Ordering::Acquire);
        let at = slot_at + (s % FN_NSTEPS as u64) as usize * SLOT;
        // SAFETY: the slot is SLOT bytes of the block and the proxy does not write it again
        // before the head passes this step.
        let words = unsafe { std::slice::from_raw_parts(b.ptr(at, SLOT) as *const u64, SLOT / 8) };
        if let Some(i) = (0..words.len()).find(|&i| words[i] != word(seed, peer, ch, s, i)) {
            println!("\nFNH_CORRUPT channel {ch} step {s} word {i}");
            stop.store(true, Ordering::Release);
            return false;
        }
        b.store_u64(RECV_HEAD, s + 1);
    }
    true
}

/// A rank of two: bootstrap, liveness watcher and NET connections on [`CHANNELS`] channels as a
/// communicator has, then `FNH_STEPS` steps each way on every channel, `FNH_PACE_MS` apart,
/// checked word by word. Prints FNH_CONNECTED, then FNH_MOVED (all arrived intact) or what
/// stopped it (FNH_LOST / FNH_FAULT with the time and the text), then FNH_RELEASED with how
/// long tearing down took.
fn net_rank(rank: usize, n: usize) {
    assert_eq!(n, 2);
    let steps: u64 = var("FNH_STEPS").parse().unwrap();
    let pace = Duration::from_millis(var("FNH_PACE_MS").parse().unwrap());
    let id = new_unique_id().expect("unique id from NCCL_COMM_ID");
    let bs = Bootstrap::init(&id, rank, n, INIT).expect("bootstrap init");
    let me = format!("{} {}", nccl::debug::host_name(), std::process::id());
    let names: Vec<String> = bs
        .allgather(me.as_bytes())
        .expect("allgather")
        .iter()
        .enumerate()
        .map(|(r, b)| {
            let s = String::from_utf8_lossy(b).to_string();
            let (host, pid) = s.split_once(' ').unwrap();
            format!("rank {r} (host {host}, pid {pid})")
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = bs.watch(Printer { names: names.clone(), stop: stop.clone() }, false).expect("watcher");
    let on_fault = stop.clone();
    let setup = Setup {
        dev: -1,
        fifo_bytes: SLOT * FN_NSTEPS as usize,
        names,
        fault: Arc::new(move |m| {
            println!("\nFNH_FAULT {} {m}", mono_ms());
            on_fault.store(true, Ordering::Release);
        }),
        timeout: INIT,
        net: nccl::transport::net::init(&NetConfig::default()).expect("the net"),
        profiler: None,
        cpus: None,
        machine_ranks: 2,
        net_peers: 1,
    };
    let conns: Vec<_> = (0..CHANNELS).map(|ch| (1 - rank, ch)).collect();
    let t = NetTransport::connect(&bs, &conns, &setup, &HostBlock::plain).expect("NET connect");
    bs.barrier().expect("barrier");
    println!("\nFNH_CONNECTED {}", mono_ms());
    let l = t.layout();
    let moved = std::thread::scope(|sc| {
        let mut all = Vec::new();
        for ch in 0..CHANNELS {
            let b = t.block(1 - rank, ch).expect("a connection").clone();
            let (b2, stop) = (b.clone(), &*stop);
            all.push(sc.spawn(move || send_steps(&b, l.send_fifo(FN_PROTO_SIMPLE), rank, ch, steps, pace, stop)));
            all.push(sc.spawn(move || recv_steps(&b2, l.recv_fifo(FN_PROTO_SIMPLE), 1 - rank, ch, steps, stop)));
        }
        all.into_iter().all(|h| h.join().unwrap())
    });
    if moved {
        // The peer may still be receiving: close only once both are done.
        bs.barrier().expect("barrier after the transfer");
        println!("\nFNH_MOVED {}", steps * (CHANNELS * SLOT) as u64);
    }
    let start = Instant::now();
    drop(t);
    drop(watcher);
    drop(bs);
    println!("\nFNH_RELEASED {} ms", start.elapsed().as_millis());
    println!("\nFNH_OK");
}

/// Two hosts h0 and h1 running [`net_rank`] with `steps` steps `pace_ms` apart, the liveness
/// watcher's heartbeat timeout and the Socket net's TCP timeout as given.
fn net_pair(test: &str, steps: u64, pace_ms: u64, heartbeat_ms: u64, tcp_ms: u64) -> Option<(Hosts, Procs)> {
    let hosts = Hosts::new(test, 2, &[Net::v4("eth")])?;
    let root = format!("198.18.0.1:{ROOT_PORT}");
    let procs = net_ranks(&hosts, test, root, steps, pace_ms, heartbeat_ms, tcp_ms, &[]);
    Some((hosts, procs))
}

/// Starts [`net_rank`] on hosts h0 and h1 of `hosts` and waits until both are connected.
#[allow(clippy::too_many_arguments)]
fn net_ranks(
    hosts: &Hosts,
    test: &str,
    root: String,
    steps: u64,
    pace_ms: u64,
    heartbeat_ms: u64,
    tcp_ms: u64,
    more_env: &[(&'static str, String)],
) -> Procs {
    let mut env = vec![
        ("NCCL_COMM_ID", root),
        ("FNH_STEPS", steps.to_string()),
        ("FNH_PACE_MS", pace_ms.to_string()),
        ("FNH_SEED", (mono_ms() ^ std::process::id() as u64).to_string()),
        ("FERRONICKEL_HEARTBEAT_TIMEOUT_MS", heartbeat_ms.to_string()),
        ("FERRONICKEL_NET_TCP_TIMEOUT_MS", tcp_ms.to_string()),
        ("NCCL_DEBUG", "WARN".to_string()),
    ];
    env.extend_from_slice(more_env);
    let procs = spawn_ranks(hosts, test, &["h0", "h1"], &env);
    for r in 0..2 {
        procs.wait_for(r, "FNH_CONNECTED", LIMIT);
    }
    procs
}

/// Both ranks moved everything intact, and nothing was reported lost or failed; their outputs.
fn all_moved(procs: &mut Procs, within: Duration) -> Vec<String> {
    let outs = procs.expect_ok(within, "FNH_OK");
    for (r, out) in outs.iter().enumerate() {
        assert!(out.contains("FNH_MOVED"), "rank {r}:\n{out}");
        assert!(!out.contains("FNH_LOST") && !out.contains("FNH_FAULT"), "rank {r}:\n{out}");
    }
    outs
}

#[test]
fn net_transport_moves_checked_data_between_hosts() {
    const TEST: &str = "net_transport_moves_checked_data_between_hosts";
    if rank_of(TEST, net_rank) {
        return;
    }
    let Some((_hosts, mut procs)) = net_pair(TEST, 400, 0, HEARTBEAT_DEFAULT_MS, TCP_DEFAULT_MS) else { return };
    all_moved(&mut procs, LIMIT);
}

/// The same between IPv6-only hosts (`NCCL_SOCKET_FAMILY=AF_INET6`).
#[test]
fn net_transport_moves_checked_data_between_ipv6_only_hosts() {
    const TEST: &str = "net_transport_moves_checked_data_between_ipv6_only_hosts";
    if rank_of(TEST, net_rank) {
        return;
    }
    let Some(hosts) = Hosts::new(TEST, 2, &[Net::v6("eth")]) else { return };
    let root = format!("[{}]:{ROOT_PORT}", hosts.v6(0, 0));
    let v6 = [("NCCL_SOCKET_FAMILY", "AF_INET6".to_string())];
    let mut procs = net_ranks(&hosts, TEST, root, 400, 0, HEARTBEAT_DEFAULT_MS, TCP_DEFAULT_MS, &v6);
    all_moved(&mut procs, LIMIT);
}

/// A cable pulled for 2.5 s mid-transfer and put back, within the timeouts: TCP
/// retransmits, every step arrives intact, nobody is declared lost, and the late heartbeat is
/// told as a slow network, not a dead one.
#[test]
fn a_link_down_and_back_up_within_the_timeout_loses_nothing() {
    const TEST: &str = "a_link_down_and_back_up_within_the_timeout_loses_nothing";
    if rank_of(TEST, net_rank) {
        return;
    }
    // Heartbeats resume once TCP retransmits after the link is back. The retransmission backoff
    // doubles with every lost try, so that is 6.5 to 9.9 s after the last heartbeat heard on an
    // idle machine; on a loaded one the namespaced link has stayed deaf for up to 17 s after it
    // came back (both ends up, the bridge port forwarding, ARP unanswered), and the next try then
    // came 13 s later. Hence 60 s timeouts, against an outage longer than the 2 s that make a
    // heartbeat late: what is checked is that nothing is lost or reported dead, not how fast TCP
    // recovers.
    const TIMEOUT_MS: u64 = 60_000;
    let Some((hosts, mut procs)) = net_pair(TEST, 500, 10, TIMEOUT_MS, TIMEOUT_MS) else { return };
    std::thread::sleep(Duration::from_millis(300));
    hosts.set_link(1, 0, false);
    std::thread::sleep(Duration::from_millis(2500));
    hosts.set_link(1, 0, true);
    let outs = all_moved(&mut procs, Duration::from_millis(TIMEOUT_MS) + LIMIT);
    let warned = outs.iter().flat_map(|o| o.lines()).find(|l| l.contains("of silence: the network to it is slow"));
    eprintln!("{}", warned.unwrap_or_else(|| panic!("no rank warned of a late heartbeat: {outs:?}")));
}

/// Waits for both ranks to end; each must have said `key` within `bound` of `since` (the
/// monotonic ms the fault began) with a text holding every one of `words` and naming the other
/// rank and its host, and released its resources. Returns each rank's text.
fn detected(procs: &mut Procs, key: &str, since: u64, bound: Duration, words: &[&str]) -> Vec<String> {
    let outs = procs.expect_ok(LIMIT, "FNH_OK");
    let mut texts = Vec::new();
    for (r, out) in outs.iter().enumerate() {
        let line = field(out, key);
        let (at, text) = line.split_once(' ').unwrap();
        let after = at.parse::<u64>().unwrap().saturating_sub(since);
        assert!(after <= bound.as_millis() as u64, "rank {r} took {after} ms (bound {bound:?}) to say: {text}\n{out}");
        let other = format!("rank {} (host h{}", 1 - r, 1 - r);
        assert!(text.contains(&other), "rank {r} does not name {other}: {text}");
        for w in words {
            assert!(text.contains(w), "rank {r}'s text lacks {w:?}: {text}");
        }
        assert!(!out.contains("FNH_MOVED") && !out.contains("FNH_CORRUPT"), "rank {r}:\n{out}");
        // Closing waits at most 1.5 s for steps and goodbyes that cannot go out on a dead
        // network (proxy::close), then joins the helpers; CI's 2 cores, busy with the other
        // host tests' namespaces, once stretched that to 5.3 s. What is checked is that nothing
        // hangs until a TCP timeout (20 s and more).
        let released: u64 = field(out, "FNH_RELEASED").trim_end_matches(" ms").parse().unwrap();
        assert!(released < 10_000, "rank {r} took {released} ms to release its connections");
        eprintln!("rank {r}: {key} after {after} ms: {text}");
        texts.push(text.to_string());
    }
    texts
}

/// Two ranks on two hosts with (heartbeat timeout, TCP timeout) `timeouts`, moving steps for
/// longer than any test lasts; `inject` breaks something 300 ms in, and both ranks must say so
/// under `key` within `bound_ms` (see [`detected`]). Their texts, or `None` when skipped.
fn fault(
    test: &str,
    timeouts: (u64, u64),
    key: &str,
    bound_ms: u64,
    words: &[&str],
    inject: impl FnOnce(&Hosts),
) -> Option<Vec<String>> {
    let (hosts, mut procs) = net_pair(test, 2000, 10, timeouts.0, timeouts.1)?;
    std::thread::sleep(Duration::from_millis(300));
    inject(&hosts);
    // Timed from when the fault is surely in place: starting `ip` can take long on a loaded machine.
    let since = mono_ms();
    Some(detected(&mut procs, key, since, Duration::from_millis(bound_ms), words))
}

/// A cable pulled for good mid-transfer: both ranks name the other, and a dead network, within
/// the heartbeat timeout, stop and release everything (no hang).
#[test]
fn a_link_down_for_good_is_a_dead_network_named_within_the_timeout() {
    const TEST: &str = "a_link_down_for_good_is_a_dead_network_named_within_the_timeout";
    if rank_of(TEST, net_rank) {
        return;
    }
    let words = ["acknowledged nothing", "the network to it is down"];
    fault(TEST, (HEARTBEAT_MS, TCP_DEFAULT_MS), "FNH_LOST", HEARTBEAT_MS + SLACK_MS, &words, |h| {
        h.set_link(1, 0, false)
    });
}

/// Host h1's network vanishes (its veth is deleted, as when its namespace goes): the same.
#[test]
fn a_host_whose_network_vanishes_is_named_within_the_timeout() {
    const TEST: &str = "a_host_whose_network_vanishes_is_named_within_the_timeout";
    if rank_of(TEST, net_rank) {
        return;
    }
    let words = ["acknowledged nothing", "the network to it is down"];
    fault(TEST, (HEARTBEAT_MS, TCP_DEFAULT_MS), "FNH_LOST", HEARTBEAT_MS + SLACK_MS, &words, |h| h.unplug(1, 0));
}

/// Host h1 destroys every TCP connection it has with h0 (`ss -K`: h0 gets resets, h1 aborts):
/// both sides fail at once, naming the other.
#[test]
fn connections_reset_by_the_peer_host_are_named_at_once() {
    const TEST: &str = "connections_reset_by_the_peer_host_are_named_at_once";
    if rank_of(TEST, net_rank) {
        return;
    }
    let texts = fault(TEST, (HEARTBEAT_MS, TCP_DEFAULT_MS), "FNH_LOST", 1000, &[], |h| {
        let out = h.command(1, "h1", "ss", &["-K", "dst", "198.18.0.1"]).output().unwrap();
        assert!(out.status.success(), "ss -K: {}", String::from_utf8_lossy(&out.stderr));
    });
    let Some(texts) = texts else { return };
    // h0 sees the reset, unless h1's process, once it found its own links aborted, closed one
    // that `ss -K` had not reached yet: then h0 reads a close. Either way no goodbye came. The
    // same race the other way: `ss -K` kills h1's sockets one by one, and h0's process, failing
    // at the first reset, may close a link before `ss` reaches h1's end of it.
    for (text, own) in [(&texts[0], "its host reset its liveness link"), (&texts[1], "aborted")] {
        assert!(text.contains(own) || text.contains("closed without a goodbye"), "{text}");
    }
}

/// The Socket net on its own (no heartbeat timeout: only closed links count for the watcher)
/// finds a cable pulled for good within FERRONICKEL_NET_TCP_TIMEOUT_MS, on both sides, naming
/// the peer, its host and a dead network.
#[test]
fn the_socket_net_alone_names_a_dead_network_within_its_timeout() {
    const TEST: &str = "the_socket_net_alone_names_a_dead_network_within_its_timeout";
    if rank_of(TEST, net_rank) {
        return;
    }
    let words = ["NET connection with", "the network to it is down"];
    fault(TEST, (0, TCP_MS), "FNH_FAULT", TCP_MS + SLACK_MS, &words, |h| h.set_link(1, 0, false));
}

/// A peer whose process stops (SIGSTOP: a debugger, a starved host) while its network is fine:
/// named within the heartbeat timeout, and told apart from a dead network.
#[test]
fn a_stopped_peer_is_told_from_a_dead_network() {
    const TEST: &str = "a_stopped_peer_is_told_from_a_dead_network";
    if rank_of(TEST, net_rank) {
        return;
    }
    // The NET connection's TCP timeout is 10 s: a stopped process's kernel still acknowledges
    // (its window closes and it answers the zero-window probes), but a machine under memory
    // pressure may drop what it had already let in, and TCP then times out as for a dead network
    // (seen once in 17 with a 1.5 s timeout, the suite running): the liveness verdict, within
    // the 2 s heartbeat timeout, is what this test checks.
    let Some((_hosts, mut procs)) = net_pair(TEST, 2000, 10, HEARTBEAT_MS, 10_000) else { return };
    std::thread::sleep(Duration::from_millis(300));
    let since = mono_ms();
    let signal = |sig| {
        // SAFETY: the pid is our child's, still ours to signal (it is reaped only by Procs).
        assert_eq!(unsafe { libc::kill(procs.pid(1) as i32, sig) }, 0);
    };
    signal(libc::SIGSTOP);
    procs.wait_for(0, "FNH_RELEASED", Duration::from_millis(HEARTBEAT_MS + 5000));
    let out = procs.output(0);
    let (at, text) = field(&out, "FNH_LOST").split_once(' ').unwrap();
    let after = at.parse::<u64>().unwrap() - since;
    assert!(after <= HEARTBEAT_MS + SLACK_MS, "{after} ms: {text}");
    assert!(text.contains("rank 1 (host h1") && text.contains("the network is up: its process is stopped"), "{text}");
    eprintln!("rank 0: FNH_LOST after {after} ms: {text}");
    // Nor is the connection taken for cut before the liveness verdict.
    assert!(!out.contains("FNH_FAULT"), "{out}");
    signal(libc::SIGCONT);
    procs.expect_ok(LIMIT, "FNH_OK");
}
