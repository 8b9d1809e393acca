//! Dead-peer detection (bootstrap::liveness) with real processes: a rank killed with SIGKILL, a
//! rank frozen with SIGSTOP (its host "vanished": no close, only silence), and a rank that leaves
//! in order. Every scenario runs at once and each is bounded in time.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nccl::bootstrap::{new_unique_id, Bootstrap, BootstrapId};
use nccl::types::ncclUniqueId;

const CHILD: &str = "FNL_CHILD";
const HONEST: Duration = Duration::from_secs(20);
/// A survivor must name a killed rank this fast (the bound).
const KILL_BOUND: Duration = Duration::from_secs(2);
/// The heartbeat timeout the frozen-rank scenario runs with, and the bound it must meet.
const HEARTBEAT_MS: u64 = 1500;
const FREEZE_BOUND: Duration = Duration::from_millis(HEARTBEAT_MS + 1500);

/// In a child: one rank that watches its neighbours and prints what it hears. Its mode says
/// when it leaves: "stay" (until told of a loss, or 20 s), "leave" (in order, 1 s after ready).
fn child() {
    let var = |k: &str| std::env::var(k).unwrap();
    let id_bytes = std::fs::read(var("FNL_ID_FILE")).unwrap();
    let id = BootstrapId::from_unique_id(&ncclUniqueId::from_bytes(&id_bytes).unwrap()).unwrap();
    let (rank, n): (usize, usize) = (var("FNL_RANK").parse().unwrap(), var("FNL_NRANKS").parse().unwrap());
    let b = Bootstrap::init(&id, rank, n, HONEST).unwrap();
    let (tx, rx) = mpsc::channel();
    let w = b.watch(move |r| format!("rank {r} (test)"), move |lost| drop(tx.send(lost))).unwrap();
    b.barrier().unwrap();
    println!("READY {rank}");
    let stay = match var("FNL_MODE").as_str() {
        "leave" => Duration::from_secs(1),
        _ => Duration::from_secs(20),
    };
    match rx.recv_timeout(stay) {
        Ok(lost) => println!("LOST {} {}", lost.rank, lost.text),
        Err(_) => println!("QUIET {rank}"),
    }
    drop(w);
    drop(b);
}

/// Lines from every child, tagged with the child's index and when they were read.
type Lines = mpsc::Receiver<(usize, String, Instant)>;

fn spawn(modes: &[&str], env: &[(&str, String)]) -> (Vec<Child>, Lines) {
    let id = new_unique_id().unwrap();
    let file = std::env::temp_dir().join(format!("fnl-id-{}-{:x}", std::process::id(), id.magic));
    std::fs::write(&file, id.to_unique_id().to_bytes()).unwrap();
    let (tx, rx) = mpsc::channel();
    let children = modes
        .iter()
        .enumerate()
        .map(|(r, mode)| {
            let mut c = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "dead_and_departed_peers", "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .env("FNL_ID_FILE", &file)
                .env("FNL_RANK", r.to_string())
                .env("FNL_NRANKS", modes.len().to_string())
                .env("FNL_MODE", mode)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let (out, tx) = (c.stdout.take().unwrap(), tx.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    // The harness's "test NAME ... " has no newline before the child's first line.
                    let line = line.split_once(" ... ").map_or(line.as_str(), |(_, rest)| rest).to_string();
                    eprintln!("[child {r}] {line}");
                    let _ = tx.send((r, line, Instant::now()));
                }
            });
            c
        })
        .collect();
    (children, rx)
}

/// Waits for a line from child `who` (any child if None) that starts with `prefix`.
fn expect(lines: &Lines, who: Option<usize>, prefix: &str, within: Duration) -> (usize, String, Instant) {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok((r, l, t)) if l.starts_with(prefix) && who.is_none_or(|w| w == r) => return (r, l, t),
            Ok(_) => {}
            Err(_) => panic!("no {prefix:?} line from {who:?} within {within:?}"),
        }
    }
}

fn ready(lines: &Lines, n: usize) {
    for _ in 0..n {
        expect(lines, None, "READY", HONEST);
    }
}

fn signal(c: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(c.id() as libc::pid_t, sig) }, 0);
}

fn reap(mut children: Vec<Child>) {
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Rank 2 of 4 is killed: the other three name it within the bound, whichever neighbour they
/// heard it from.
fn killed() {
    let (children, lines) = spawn(&["stay"; 4], &[]);
    ready(&lines, 4);
    let t0 = Instant::now();
    signal(&children[2], libc::SIGKILL);
    for _ in 0..3 {
        let (r, line, t) = expect(&lines, None, "LOST", KILL_BOUND + Duration::from_secs(1));
        assert!(line.starts_with("LOST 2 "), "rank {r}: {line}");
        assert!(line.contains("rank 2 (test)") && line.contains("killed"), "rank {r}: {line}");
        assert!(t - t0 <= KILL_BOUND, "rank {r} heard of the loss {:?} after the kill", t - t0);
    }
    reap(children);
}

/// Rank 1 of 2 freezes (no close, no heartbeats): rank 0 reports it after the heartbeat timeout.
fn frozen() {
    let (children, lines) = spawn(&["stay"; 2], &[("FERRONICKEL_HEARTBEAT_TIMEOUT_MS", HEARTBEAT_MS.to_string())]);
    ready(&lines, 2);
    let t0 = Instant::now();
    signal(&children[1], libc::SIGSTOP);
    let (_, line, t) = expect(&lines, Some(0), "LOST", FREEZE_BOUND + Duration::from_secs(1));
    assert!(line.starts_with("LOST 1 ") && line.contains("no heartbeat"), "{line}");
    assert!(t - t0 <= FREEZE_BOUND, "heard of the freeze {:?} after it", t - t0);
    signal(&children[1], libc::SIGCONT);
    reap(children);
}

/// Rank 1 of 3 leaves in order: nobody takes that for a loss.
fn departed() {
    let (mut children, lines) = spawn(&["stay", "leave", "stay"], &[]);
    ready(&lines, 3);
    expect(&lines, Some(1), "QUIET", Duration::from_secs(10));
    assert!(children[1].wait().unwrap().success());
    let quiet = Instant::now() + Duration::from_secs(3);
    while let Ok((r, l, _)) = lines.recv_timeout(quiet.saturating_duration_since(Instant::now())) {
        assert!(!l.starts_with("LOST"), "rank {r} took an orderly exit for a loss: {l}");
    }
    reap(children);
}

#[test]
fn dead_and_departed_peers() {
    if std::env::var(CHILD).is_ok() {
        return child();
    }
    let runs = [std::thread::spawn(killed), std::thread::spawn(frozen), std::thread::spawn(departed)];
    for (i, r) in runs.into_iter().enumerate() {
        if let Err(p) = r.join() {
            eprintln!("liveness scenario {i} failed");
            std::panic::resume_unwind(p);
        }
    }
}
