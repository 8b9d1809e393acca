//! The NET transport's proxy when the peer process dies (`docs/NET.md`, "The NET transport"):
//! rank 0 runs in this test, rank 1 in a child process of this test binary; both connect through
//! the bootstrap and the Socket net, the child plays a sending kernel without end, rank 0 takes
//! its steps, and the child is killed (SIGKILL) mid-transfer. Rank 0's fault hook must name rank 1
//! and its channel within seconds, from the proxy alone (no liveness watcher runs here), and
//! rank 0's transport must close without waiting on the dead peer. Every wait has a bound.
//!
//! The in-process cases (steps byte for byte in every protocol, strangers, garbage, a peer
//! closing) are the unit tests of `transport::net::conn`.

use nccl::bootstrap::{new_unique_id, Bootstrap, BootstrapId};
use nccl::transport::net::conn::{NetTransport, Setup};
use nccl::transport::net::proxy::{HostBlock, RECV_HEAD, RECV_TAIL, SEND_HEAD, SEND_SIZES, SEND_TAIL};
use nccl::transport::net::NetConfig;
use nccl::types::ncclUniqueId;
use parking_lot::Mutex;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD: &str = "FERRONICKEL_NET_PROXY_CHILD";
/// Every wait of this test gives up after this long.
const LIMIT: Duration = Duration::from_secs(30);
const CHANNELS: usize = 2;
const NSTEPS: u64 = 8;
/// Simple, 1000 bytes per step.
const SIZE_WORD: u32 = 1000 | 2 << 30;

fn setup(faults: &Arc<Mutex<Vec<String>>>) -> Setup {
    let f = faults.clone();
    Setup {
        dev: -3,
        fifo_bytes: 64 << 10,
        names: vec!["rank 0 (parent)".into(), "rank 1 (child)".into()],
        fault: Arc::new(move |m| f.lock().push(m)),
        timeout: LIMIT,
        net: nccl::transport::net::init(&NetConfig::default()).expect("the net"),
        profiler: None,
        cpus: None,
        machine_ranks: 2,
        net_peers: 1,
    }
}

fn connect(id: &BootstrapId, rank: usize, faults: &Arc<Mutex<Vec<String>>>) -> (Bootstrap, NetTransport) {
    let bs = Bootstrap::init(id, rank, 2, LIMIT).expect("bootstrap");
    let conns: Vec<_> = (0..CHANNELS).map(|ch| (1 - rank, ch)).collect();
    let t = NetTransport::connect(&bs, &conns, &setup(faults), &HostBlock::plain).expect("NET connect");
    (bs, t)
}

/// The child: rank 1, sending steps on every channel until it is killed (or LIMIT passes).
fn child(id_hex: &str) {
    let bytes: Vec<u8> =
        (0..id_hex.len()).step_by(2).map(|i| u8::from_str_radix(&id_hex[i..i + 2], 16).unwrap()).collect();
    let id = BootstrapId::from_unique_id(&ncclUniqueId::from_bytes(&bytes).unwrap()).unwrap();
    let faults = Arc::new(Mutex::new(Vec::new()));
    let (_bs, t) = connect(&id, 1, &faults);
    println!("\nNET_PROXY_CHILD_READY");
    let end = Instant::now() + LIMIT;
    let mut step = [0u64; CHANNELS];
    while Instant::now() < end {
        for (ch, s) in step.iter_mut().enumerate() {
            let b = t.block(0, ch).unwrap();
            if b.load_u64(SEND_HEAD) + NSTEPS > *s {
                b.store_u32(SEND_SIZES + 4 * (*s % NSTEPS) as usize, SIZE_WORD);
                fence(Ordering::SeqCst);
                *s += 1;
                b.store_u64(SEND_TAIL, *s);
            }
        }
        std::thread::yield_now();
    }
}

#[test]
fn a_peer_killed_mid_transfer_is_named_within_seconds() {
    if let Ok(id) = std::env::var(CHILD) {
        child(&id);
        return;
    }
    let id = new_unique_id().unwrap();
    let hex: String = id.to_unique_id().to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let mut kid = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_peer_killed_mid_transfer_is_named_within_seconds", "--nocapture", "--test-threads=1"])
        .env(CHILD, hex)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the child rank");
    // Kill the child whatever happens below.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let out = kid.stdout.take().unwrap();
    let mut kid = Reap(kid);
    let faults = Arc::new(Mutex::new(Vec::new()));
    let (_bs, t) = connect(&id, 0, &faults);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains("NET_PROXY_CHILD_READY") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(LIMIT).expect("the child connected and said it was ready");
    // Take 100 steps on every channel, then kill the sender mid-stream.
    let wait_until = |what: &str, ok: &mut dyn FnMut() -> bool| {
        let end = Instant::now() + LIMIT;
        while !ok() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            std::thread::yield_now();
        }
    };
    for ch in 0..CHANNELS {
        let b = t.block(1, ch).unwrap();
        wait_until("100 steps from the child", &mut || {
            let tail = b.load_u64(RECV_TAIL);
            b.store_u64(RECV_HEAD, tail);
            tail >= 100
        });
    }
    kid.0.kill().unwrap();
    let killed = Instant::now();
    // Keep consuming, as a kernel would, until the proxy reports the loss.
    wait_until("the proxy to report the dead peer", &mut || {
        for ch in 0..CHANNELS {
            let b = t.block(1, ch).unwrap();
            b.store_u64(RECV_HEAD, b.load_u64(RECV_TAIL));
        }
        !faults.lock().is_empty()
    });
    let noticed = killed.elapsed();
    let first = faults.lock()[0].clone();
    eprintln!("net_proxy: noticed {noticed:?} after the kill: {first}");
    assert!(first.contains("rank 1 (child), channel"), "the fault names the peer and channel: {first}");
    assert!(noticed < Duration::from_secs(5), "noticed {noticed:?} after the kill: {first}");
    let closing = Instant::now();
    drop(t);
    assert!(closing.elapsed() < Duration::from_secs(5), "closing took {:?}", closing.elapsed());
}
