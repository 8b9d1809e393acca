//! Dead-peer detection (bootstrap::liveness) with real processes: a rank killed with SIGKILL, a
//! rank frozen with SIGSTOP (its host "vanished": no close, only silence), a rank that leaves in
//! order; bootstrap waits that a killed rank makes hopeless (a receive from it, a barrier among
//! ranks that are not its neighbours) ending at once; and hang reports pooled round the ring,
//! asked for by a call and by a touched file. Every scenario runs at once and each is bounded in
//! time.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nccl::bootstrap::liveness::{Lost, Observer};
use nccl::bootstrap::{new_unique_id, Bootstrap, BootstrapId};
use nccl::types::ncclUniqueId;

const CHILD: &str = "FNL_CHILD";
const HONEST: Duration = Duration::from_secs(20);
/// A survivor must name a killed rank this fast.
const KILL_BOUND: Duration = Duration::from_secs(2);
/// The heartbeat timeout the frozen-rank scenario runs with, and the bound it must meet: the
/// timeout, plus a heartbeat period (silence is checked at each beat), plus slack for a loaded
/// machine: with seven scenarios' 20 processes on 2 cores, 2 s of slack was passed once in about
/// 60 runs.
const HEARTBEAT_MS: u64 = 1500;
const FREEZE_BOUND: Duration = Duration::from_millis(HEARTBEAT_MS + 1000 + 4000);

/// A bootstrap wait on a killed rank must end this fast (news
/// travels the liveness ring in milliseconds; the bootstrap timeout is [`HONEST`]).
const WAIT_BOUND: Duration = Duration::from_secs(3);
/// The tag of the receive that waits for a killed rank.
const TAG_NEVER: u32 = 77;

/// What a child's watcher told it.
enum Heard {
    Lost(Lost),
    Report(Vec<String>),
}

struct TestObserver {
    rank: usize,
    tx: mpsc::Sender<Heard>,
}

impl Observer for TestObserver {
    fn describe(&self, rank: usize) -> String {
        format!("rank {rank} (test)")
    }
    fn lost(&self, lost: Lost) {
        let _ = self.tx.send(Heard::Lost(lost));
    }
    fn left(&self, rank: usize, colls: Option<u64>) {
        println!("LEFT {rank} {colls:?}");
    }
    /// Distinct per rank, so that a test sees whose count came round.
    fn taken_part(&self) -> Option<u64> {
        Some(40 + self.rank as u64)
    }
    fn state(&self) -> String {
        format!("state of rank {}", self.rank)
    }
    fn report(&self, lines: Vec<String>) {
        let _ = self.tx.send(Heard::Report(lines));
    }
}

/// In a child: one rank that watches its neighbours and prints what it hears. Its mode says what
/// it does: "stay" (until it hears something, or 20 s), "leave" (in order, 1 s after ready),
/// "ask" (asks for a hang report), "file" (watches FERRONICKEL_HANG_REPORT_FILE), "hold" (like
/// leave, but only once the asking rank has its report), "recvN" (receives from rank N, which
/// never sends), "barrier" (enters a barrier the others never enter), "watch" (like stay, but
/// lingers after what it heard, so that its exit is no news to the others).
fn child() {
    let var = |k: &str| std::env::var(k).unwrap();
    let id_bytes = std::fs::read(var("FNL_ID_FILE")).unwrap();
    let id = BootstrapId::from_unique_id(&ncclUniqueId::from_bytes(&id_bytes).unwrap()).unwrap();
    let (rank, n): (usize, usize) = (var("FNL_RANK").parse().unwrap(), var("FNL_NRANKS").parse().unwrap());
    let mode = var("FNL_MODE");
    let b = Bootstrap::init(&id, rank, n, HONEST).unwrap();
    let (tx, rx) = mpsc::channel();
    let w = b.watch(TestObserver { rank, tx }, mode == "file").unwrap().unwrap();
    b.barrier().unwrap();
    println!("READY {rank}");
    if mode == "ask" {
        w.request_report();
    }
    if mode == "exit" {
        // The process ends with its watcher alive, as a job that never destroys its communicator.
        std::thread::sleep(Duration::from_millis(300));
        std::process::exit(0);
    }
    let waited = match mode.strip_prefix("recv") {
        Some(peer) => Some(("RECV", b.recv(peer.parse().unwrap(), TAG_NEVER).map(drop))),
        None if mode == "barrier" => Some(("BARRIER", b.barrier())),
        None => None,
    };
    if let Some((what, r)) = waited {
        match r {
            Ok(()) => println!("{what} OK"),
            Err(e) => println!("{what} ERR {e}"),
        }
        std::thread::sleep(HONEST); // until killed: our exit must not be news to the others
        return;
    }
    let stay = if mode == "leave" || mode == "hold" { Duration::from_secs(1) } else { Duration::from_secs(20) };
    match rx.recv_timeout(stay) {
        Ok(Heard::Lost(lost)) => println!("LOST {} {}", lost.rank, lost.text),
        Ok(Heard::Report(lines)) => println!("REPORT {}", lines.join(";")),
        Err(_) => println!("QUIET {rank}"),
    }
    if mode == "watch" {
        std::thread::sleep(HONEST);
        return;
    }
    if ["ask", "file", "hold"].contains(&mode.as_str()) {
        b.barrier().unwrap(); // nobody leaves while the asking rank still waits for its report
    }
    drop(w);
    drop(b);
}

/// Lines from every child, tagged with the child's index and when they were read; lines that one
/// wait passed over stay for the next ([`expect`]).
struct Lines {
    rx: mpsc::Receiver<(usize, String, Instant)>,
    backlog: std::cell::RefCell<std::collections::VecDeque<(usize, String, Instant)>>,
}

impl Lines {
    fn recv_timeout(&self, t: Duration) -> Result<(usize, String, Instant), mpsc::RecvTimeoutError> {
        match self.backlog.borrow_mut().pop_front() {
            Some(l) => Ok(l),
            None => self.rx.recv_timeout(t),
        }
    }
}

/// The ranks of one scenario; whatever happens (a failed assertion included), they are killed
/// and reaped when this goes, so no stopped child outlives the test.
struct Ranks(Vec<Child>);

impl std::ops::Deref for Ranks {
    type Target = Vec<Child>;
    fn deref(&self) -> &Vec<Child> {
        &self.0
    }
}

impl std::ops::DerefMut for Ranks {
    fn deref_mut(&mut self) -> &mut Vec<Child> {
        &mut self.0
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(modes: &[&str], env: &[(&str, String)]) -> (Ranks, Lines) {
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
    (Ranks(children), Lines { rx, backlog: Default::default() })
}

/// Waits for a line from child `who` (any child if None) that starts with `prefix`; other lines
/// are kept for later waits.
fn expect(lines: &Lines, who: Option<usize>, prefix: &str, within: Duration) -> (usize, String, Instant) {
    let matches = |(r, l, _): &(usize, String, Instant)| l.starts_with(prefix) && who.is_none_or(|w| w == *r);
    let held = lines.backlog.borrow().iter().position(matches);
    if let Some(i) = held {
        return lines.backlog.borrow_mut().remove(i).unwrap();
    }
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.rx.recv_timeout(left) {
            Ok(l) if matches(&l) => return l,
            Ok(l) => lines.backlog.borrow_mut().push_back(l),
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

/// Waits for child `r` to exit on its own, successfully, by `deadline`.
fn exits_ok(c: &mut Child, r: usize, deadline: Instant) {
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            assert!(st.success(), "child {r} failed: {st}");
            return;
        }
        assert!(Instant::now() < deadline, "child {r} did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for every child to exit on its own, successfully, within 10 s.
fn finish(mut children: Ranks) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for (r, c) in children.iter_mut().enumerate() {
        exits_ok(c, r, deadline);
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
}

/// Rank 3 of 5 is killed while rank 0 waits for a message from it and rank 1 sits in a barrier
/// whose neighbours (ranks 0 and 2) never join it: both waits end within the bound, naming rank 3,
/// instead of lasting the bootstrap timeout.
fn waits_on_the_killed() {
    let (children, lines) = spawn(&["recv3", "barrier", "watch", "watch", "watch"], &[]);
    ready(&lines, 5);
    signal(&children[3], libc::SIGKILL);
    let (_, line, _) = expect(&lines, Some(0), "RECV", WAIT_BOUND);
    assert!(line.starts_with("RECV ERR") && line.contains("rank 3 was lost") && line.contains("killed"), "{line}");
    let (_, line, _) = expect(&lines, Some(1), "BARRIER", WAIT_BOUND);
    assert!(line.starts_with("BARRIER ERR") && line.contains("rank 3 (") && line.contains("killed"), "{line}");
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
    drop(children);
}

/// Rank 1 of 3 leaves in order: nobody takes that for a loss.
fn departed() {
    let (mut children, lines) = spawn(&["stay", "leave", "stay"], &[]);
    ready(&lines, 3);
    expect(&lines, Some(1), "QUIET", Duration::from_secs(10));
    exits_ok(&mut children[1], 1, Instant::now() + Duration::from_secs(10));
    let quiet = Instant::now() + Duration::from_secs(3);
    while let Ok((r, l, _)) = lines.recv_timeout(quiet.saturating_duration_since(Instant::now())) {
        assert!(!l.starts_with("LOST"), "rank {r} took an orderly exit for a loss: {l}");
    }
}

/// Rank 1 of 4 exits without dropping its watcher (a job that ends with live communicators): its
/// exit handler says goodbye, so every other rank, neighbour or not, hears that it left, within a
/// second, with the count of collectives its goodbye carried, and none takes it for a loss.
fn exits_alive() {
    let (mut children, lines) = spawn(&["watch", "exit", "watch", "watch"], &[]);
    ready(&lines, 4);
    let t0 = Instant::now();
    exits_ok(&mut children[1], 1, t0 + Duration::from_secs(5));
    let mut heard = std::collections::BTreeSet::new();
    while heard.len() < 3 {
        let (r, line, t) = expect(&lines, None, "LEFT", Duration::from_secs(5));
        assert_eq!(line, "LEFT 1 Some(41)", "rank {r}");
        assert!(t - t0 <= Duration::from_secs(2), "rank {r} heard of it {:?} after", t - t0);
        assert!(heard.insert(r), "rank {r} heard twice");
    }
    let quiet = Instant::now() + Duration::from_secs(2);
    while let Ok((r, l, _)) = lines.recv_timeout(quiet.saturating_duration_since(Instant::now())) {
        assert!(!l.starts_with("LOST"), "rank {r} took an exit with a live watcher for a loss: {l}");
    }
}

/// Rank 0 of 3 asks for a hang report: every rank's state comes back, in ring order.
fn report_on_request() {
    let (children, lines) = spawn(&["ask", "hold", "hold"], &[]);
    ready(&lines, 3);
    let (_, line, _) = expect(&lines, Some(0), "REPORT", Duration::from_secs(10));
    assert_eq!(line, "REPORT state of rank 0;state of rank 1;state of rank 2");
    finish(children);
}

/// Touching FERRONICKEL_HANG_REPORT_FILE makes the rank that watches it report.
fn report_on_touch() {
    let file = std::env::temp_dir().join(format!("fnl-hang-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let (children, lines) =
        spawn(&["file", "hold", "hold"], &[("FERRONICKEL_HANG_REPORT_FILE", file.display().to_string())]);
    ready(&lines, 3);
    std::fs::write(&file, b"report please").unwrap();
    let (_, line, _) = expect(&lines, Some(0), "REPORT", Duration::from_secs(10));
    assert_eq!(line, "REPORT state of rank 0;state of rank 1;state of rank 2");
    let _ = std::fs::remove_file(&file);
    finish(children);
}

#[test]
fn dead_and_departed_peers() {
    if std::env::var(CHILD).is_ok() {
        return child();
    }
    let runs = [
        std::thread::spawn(killed),
        std::thread::spawn(frozen),
        std::thread::spawn(departed),
        std::thread::spawn(report_on_request),
        std::thread::spawn(report_on_touch),
        std::thread::spawn(waits_on_the_killed),
        std::thread::spawn(exits_alive),
    ];
    for (i, r) in runs.into_iter().enumerate() {
        if let Err(p) = r.join() {
            eprintln!("liveness scenario {i} failed");
            std::panic::resume_unwind(p);
        }
    }
}
