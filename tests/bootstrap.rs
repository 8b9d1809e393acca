//! The TCP bootstrap end to end: ranks as threads of one process, ranks as separate processes,
//! and hostile or broken participants. Every test has a hard upper bound; nothing may hang.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl::bootstrap::*;
use nccl::error::Error;
use nccl::socket::acceptor::{self, Acceptor, Wake};
use nccl::socket::addr::listen;
use nccl::socket::auth::{self, Role, Secret};
use nccl::socket::frame::FrameStream;
use nccl::socket::wire::{self, LinkKind, Msg, RefuseReason};
use nccl::types::ncclUniqueId;

/// Timeout given to ranks that are expected to succeed: generous, the machine may be loaded.
const HONEST: Duration = Duration::from_secs(20);
/// Timeout in the failure tests: every failure must be reported about this fast.
const SHORT: Duration = Duration::from_secs(2);
/// No test may take longer than this.
const HARD: Duration = Duration::from_secs(30);

/// Runs `f(i)` for i in 0..n on threads and returns the results in order; panics (instead of
/// hanging) if they are not all done within [`HARD`], and re-raises a thread's panic.
fn run_threads<T: Send + 'static>(n: usize, f: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let f = Arc::new(f);
    let (tx, rx) = mpsc::channel();
    for i in 0..n {
        let (f, tx) = (f.clone(), tx.clone());
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i)));
            let _ = tx.send((i, r));
        });
    }
    let deadline = Instant::now() + HARD;
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, Ok(v))) => out[i] = Some(v),
            Ok((i, Err(p))) => {
                eprintln!("thread {i} panicked");
                std::panic::resume_unwind(p)
            }
            Err(_) => panic!("threads still running after {HARD:?}: a hang"),
        }
    }
    out.into_iter().map(Option::unwrap).collect()
}

fn block(rank: usize, big: bool) -> Vec<u8> {
    let len = if big { 300_000 + rank * 1000 } else { (rank % 5) * 3 + rank / 5 };
    (0..len).map(|i| (rank * 31 + i * 7) as u8).collect()
}

fn p2p_msg(from: usize, to: usize, tag: u32, nth: usize) -> Vec<u8> {
    format!("{from}->{to} tag {tag} #{nth}").repeat(1 + (from + to) % 3).into_bytes()
}

/// What every honest rank does: collectives and p2p, checking every byte.
fn exercise(b: &Bootstrap) {
    let (r, n) = (b.rank(), b.nranks());
    let all = b.allgather(&block(r, false)).unwrap();
    assert_eq!(all, (0..n).map(|q| block(q, false)).collect::<Vec<_>>(), "allgather on rank {r}");
    if n <= 8 {
        // Blocks larger than socket buffers, all ranks sending at once.
        let all = b.allgather(&block(r, true)).unwrap();
        assert!((0..n).all(|q| all[q] == block(q, true)), "big allgather on rank {r}");
    }
    let mut roots = vec![0, n / 2, n - 1];
    roots.dedup();
    for root in roots {
        let data = format!("broadcast from {root}").repeat(root + 1).into_bytes();
        let got = b.broadcast(root, (r == root).then_some(&data[..])).unwrap();
        assert_eq!(got, data, "broadcast from {root} on rank {r}");
    }
    b.barrier().unwrap();
    // Two tags, two messages on one of them, received in another order than sent.
    for peer in 0..n {
        b.send(peer, 7, &p2p_msg(r, peer, 7, 0)).unwrap();
        b.send(peer, 9, &p2p_msg(r, peer, 9, 0)).unwrap();
        b.send(peer, 9, &p2p_msg(r, peer, 9, 1)).unwrap();
    }
    for peer in (0..n).rev() {
        assert_eq!(b.recv(peer, 9).unwrap(), p2p_msg(peer, r, 9, 0));
        assert_eq!(b.recv(peer, 9).unwrap(), p2p_msg(peer, r, 9, 1));
        assert_eq!(b.recv(peer, 7).unwrap(), p2p_msg(peer, r, 7, 0));
    }
    b.barrier().unwrap();
}

fn threads(n: usize) {
    let id = new_unique_id().unwrap();
    run_threads(n, move |r| exercise(&Bootstrap::init(&id, r, n, HONEST).unwrap()));
}

#[test]
fn handle_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Bootstrap>();
}

#[test]
fn bad_arguments() {
    let id = fake_id("127.0.0.1:9".parse().unwrap());
    for (rank, n, t) in
        [(0, 0, HONEST), (2, 2, HONEST), (0, 1, Duration::ZERO), (0, MAX_RANKS + 1, HONEST), (0, usize::MAX, HONEST)]
    {
        assert!(
            matches!(Bootstrap::init(&id, rank, n, t), Err(Error::InvalidArgument(_))),
            "rank {rank} of {n}, {t:?}"
        );
    }
    let b = Bootstrap::init(&new_unique_id().unwrap(), 0, 1, HONEST).unwrap();
    assert!(matches!(b.send(1, 0, b""), Err(Error::InvalidArgument(_))));
    assert!(matches!(b.recv(1, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(b.broadcast(1, Some(b"")), Err(Error::InvalidArgument(_))));
    assert!(matches!(b.broadcast(0, None), Err(Error::InvalidArgument(_))));
}

#[test]
fn threads_1() {
    threads(1);
}

#[test]
fn threads_2() {
    threads(2);
}

#[test]
fn threads_8() {
    threads(8);
}

#[test]
fn threads_64() {
    threads(64);
}

// ---------------------------------------------------------------------------------------------
// Ranks that start late: slow imports, data loaders, a node that boots last. Every scenario runs
// at once, so the set costs one delay of wall time.

/// Longer than any fixed first-frame or reply limit of the bootstrap (5 s), far below the timeout.
const LATE: Duration = Duration::from_secs(10);

/// Ranks as threads, rank r starting `delays[r]` after the id was made.
fn late_threads(delays: Vec<Duration>) {
    let id = new_unique_id().unwrap();
    let n = delays.len();
    run_threads(n, move |r| {
        std::thread::sleep(delays[r]);
        exercise(&Bootstrap::init(&id, r, n, HONEST).unwrap())
    });
}

/// A point-to-point message that arrives long into the receiver's wait.
fn late_p2p_message() {
    let id = new_unique_id().unwrap();
    run_threads(2, move |r| {
        let b = Bootstrap::init(&id, r, 2, HONEST).unwrap();
        match r {
            0 => {
                std::thread::sleep(LATE);
                b.send(1, 5, b"late but honest").unwrap();
            }
            _ => assert_eq!(b.recv(0, 5).unwrap(), b"late but honest"),
        }
        b.barrier().unwrap();
    });
}

/// What ncclCommSplit does, long after init: colors go around the parent's ring, the leader's
/// fresh id goes point to point, and the new group rendezvouses on it.
fn late_split() {
    let id = new_unique_id().unwrap();
    run_threads(4, move |r| {
        let parent = Bootstrap::init(&id, r, 4, HONEST).unwrap();
        std::thread::sleep(LATE);
        let colors = parent.allgather(&[(r % 2) as u8]).unwrap();
        let members: Vec<usize> = (0..4).filter(|&q| colors[q] == colors[r]).collect();
        let child_id = share_id(&parent, &members).unwrap();
        let child_rank = members.iter().position(|&q| q == r).unwrap();
        exercise(&Bootstrap::init(&child_id, child_rank, members.len(), HONEST).unwrap());
    });
}

#[test]
fn late_ranks() {
    const TEST: &str = "late_ranks";
    if child_rank(TEST) {
        return;
    }
    let now = Duration::ZERO;
    let all_late = spawn_ranks(TEST, &[LATE, LATE]);
    let one_late = spawn_ranks(TEST, &[now, now, LATE]);
    let scenarios = [
        std::thread::spawn(move || late_threads(vec![LATE; 3])),
        std::thread::spawn(move || late_threads(vec![now, LATE])),
        std::thread::spawn(move || late_threads(vec![now, now, now, LATE])),
        std::thread::spawn(late_p2p_message),
        std::thread::spawn(late_split),
        std::thread::spawn(move || wait_all(all_late)),
        std::thread::spawn(move || wait_all(one_late)),
    ];
    for (i, s) in scenarios.into_iter().enumerate() {
        if let Err(p) = s.join() {
            eprintln!("late-rank scenario {i} failed");
            std::panic::resume_unwind(p);
        }
    }
}

/// `NCCL_COMM_ID` mode: a fixed address, no root until rank 0's init starts it; ranks that
/// come first keep retrying.
#[test]
fn comm_id_root_started_by_rank0() {
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let id = BootstrapId::from_comm_id(addr, Some("shared by the job"));
    assert_eq!(BootstrapId::from_unique_id(&id.to_unique_id()), Ok(id));
    // Someone who knows only the address (and not the shared secret) is refused.
    // It tries while the root (up at 0.3 s) still waits for rank 3 (at 1.5 s).
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(800));
        tx.send(Bootstrap::init(&BootstrapId::from_comm_id(addr, None), 1, 4, SHORT).map(drop))
    });
    run_threads(4, move |r| {
        std::thread::sleep(Duration::from_millis([300, 0, 0, 1500][r]));
        exercise(&Bootstrap::init(&id, r, 4, HONEST).unwrap())
    });
    match rx.recv_timeout(HARD).unwrap() {
        Err(Error::InvalidUsage(m)) => assert!(m.contains("could not prove it holds the unique id"), "{m}"),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Separate processes: the test binary re-runs itself as each rank.

const CHILD_TEST: &str = "FNB_CHILD_TEST";

fn hex(id: &ncclUniqueId) -> String {
    id.internal.iter().map(|&c| format!("{:02x}", c as u8)).collect()
}

fn unhex(s: &str) -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    for (i, c) in id.internal.iter_mut().enumerate() {
        *c = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap() as std::ffi::c_char;
    }
    id
}

/// In a child: runs one rank and returns true. In the parent: returns false.
fn child_rank(test: &str) -> bool {
    if std::env::var(CHILD_TEST).as_deref() != Ok(test) {
        return false;
    }
    let var = |k: &str| std::env::var(k).unwrap();
    let id = BootstrapId::from_unique_id(&unhex(&var("FNB_CHILD_ID"))).unwrap();
    let (rank, n) = (var("FNB_CHILD_RANK").parse().unwrap(), var("FNB_CHILD_NRANKS").parse().unwrap());
    std::thread::sleep(Duration::from_millis(var("FNB_CHILD_DELAY_MS").parse().unwrap()));
    exercise(&Bootstrap::init(&id, rank, n, HONEST).unwrap());
    println!("FNB_CHILD_OK rank {rank}");
    true
}

fn wait_all(children: Vec<Child>) {
    wait_all_within(children, HARD)
}

/// Waits for every child to succeed, killing them all if they are not done `within`.
fn wait_all_within(mut children: Vec<Child>, within: Duration) {
    let deadline = Instant::now() + within;
    let mut done = vec![None; children.len()];
    while done.iter().any(Option::is_none) {
        for (c, d) in children.iter_mut().zip(done.iter_mut()) {
            if d.is_none() {
                *d = c.try_wait().unwrap();
            }
        }
        if Instant::now() > deadline {
            children.iter_mut().for_each(|c| drop(c.kill()));
            panic!("child processes still running after {within:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (r, mut c) in children.into_iter().enumerate() {
        let mut out = String::new();
        c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        print!("{out}");
        assert!(done[r].unwrap().success(), "rank {r} failed:\n{out}");
        assert!(out.contains(&format!("FNB_CHILD_OK rank {r}")), "rank {r} did not run its test:\n{out}");
    }
}

fn processes(test: &str, n: usize) {
    if child_rank(test) {
        return;
    }
    wait_all(spawn_ranks(test, &vec![Duration::ZERO; n]));
}

/// Starts one child process per entry of `delays`, rank r sleeping `delays[r]` before its init.
fn spawn_ranks(test: &str, delays: &[Duration]) -> Vec<Child> {
    let (id, n) = (new_unique_id().unwrap(), delays.len());
    (0..n)
        .map(|r| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", test, "--nocapture", "--test-threads=1"])
                .env(CHILD_TEST, test)
                .env("FNB_CHILD_ID", hex(&id.to_unique_id()))
                .env("FNB_CHILD_RANK", r.to_string())
                .env("FNB_CHILD_NRANKS", n.to_string())
                .env("FNB_CHILD_DELAY_MS", delays[r].as_millis().to_string())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

#[test]
fn processes_1() {
    processes("processes_1", 1);
}

#[test]
fn processes_2() {
    processes("processes_2", 2);
}

#[test]
fn processes_8() {
    processes("processes_8", 8);
}

#[test]
fn processes_64() {
    processes("processes_64", 64);
}

// ---------------------------------------------------------------------------------------------
// Hostile and broken participants.

fn expect_err(r: Result<Bootstrap, Error>) -> Error {
    match r {
        Ok(_) => panic!("init should have failed"),
        Err(e) => e,
    }
}

/// An id for a root that is not ours (nothing listens there, or a fake does).
fn fake_id(root: SocketAddr) -> BootstrapId {
    BootstrapId { magic: 1, secret: Secret([1; auth::SECRET_LEN]), root, root_by_rank0: false }
}

/// Runs `n` honest ranks of `id` and checks they rendezvous and allgather correctly.
fn honest_ranks(id: BootstrapId, n: usize) {
    run_threads(n, move |r| {
        let b = Bootstrap::init(&id, r, n, HONEST).unwrap();
        let all = b.allgather(&block(r, false)).unwrap();
        assert_eq!(all, (0..n).map(|q| block(q, false)).collect::<Vec<_>>());
    });
}

/// True once the other end has closed (or reset) the connection.
fn closed_by_peer(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        }
    }
}

/// Reads one whole frame from a blocking socket (None if it closes or times out first).
fn read_frame(s: &mut TcpStream, within: Duration) -> Option<Msg> {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some((msg, _))) = wire::decode(&buf, wire::MAX_CONTROL_BODY) {
            return Some(msg);
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A raw client's side of the handshake: reads the challenge, answers it as `magic`/`secret`,
/// and returns the listener's reply.
fn raw_handshake(s: &mut TcpStream, magic: u64, secret: &Secret) -> Option<Msg> {
    let Some(Msg::Challenge { nonce: theirs }) = read_frame(s, HARD) else { panic!("no challenge") };
    let nonce = [7; auth::NONCE_LEN];
    let proof = secret.proof(Role::Connector, &theirs, &nonce);
    s.write_all(&wire::encode(&Msg::Auth { magic, nonce, proof })).unwrap();
    read_frame(s, HARD)
}

fn register_frame(rank: u32, nranks: u32) -> Vec<u8> {
    let listen: SocketAddr = "127.0.0.1:9".parse().unwrap();
    wire::encode(&Msg::Register { rank, nranks, listen, timeout_ms: 2000 })
}

fn refusal_text(m: Option<Msg>) -> String {
    match m {
        Some(Msg::Refused { reason: RefuseReason::Rejected, text }) => text,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn wrong_magic_is_refused_and_honest_ranks_complete() {
    let id = new_unique_id().unwrap();
    let stranger = BootstrapId { magic: id.magic ^ 0xff, ..id };
    // The stranger goes first: once the honest ranks complete, the root is gone and a late
    // stranger would only see its connection refused or reset.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(Bootstrap::init(&stranger, 0, 2, SHORT).map(drop)));
    match rx.recv_timeout(HARD).unwrap() {
        Err(Error::InvalidUsage(m)) => assert!(m.contains("magic does not match"), "{m}"),
        other => panic!("{other:?}"),
    }
    honest_ranks(id, 2);
}

/// Knowing the root's address and the magic (both travel in clear) is not enough.
#[test]
fn a_forged_id_is_refused_and_learns_nothing() {
    let id = new_unique_id().unwrap();
    let forged = BootstrapId { secret: Secret([0x42; auth::SECRET_LEN]), ..id };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(Bootstrap::init(&forged, 1, 2, SHORT).map(drop)));
    match rx.recv_timeout(HARD).unwrap() {
        Err(Error::InvalidUsage(m)) => assert!(m.contains("could not prove it holds the unique id"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Rank 1's slot was not taken by the forger.
    honest_ranks(id, 2);
}

#[test]
fn strangers_on_the_root_port_are_dropped() {
    let id = new_unique_id().unwrap();
    let t0 = Instant::now();
    let connect = || TcpStream::connect(id.root).unwrap();
    let mut random = connect();
    random.write_all(&[0x5a; 64]).unwrap();
    let mut http = connect();
    http.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut oversized = connect();
    let mut frame = register_frame(0, 2);
    frame[8..12].copy_from_slice(&(2u32 << 20).to_le_bytes());
    oversized.write_all(&frame[..12]).unwrap();
    // Skips the handshake: a registration straight away is not an answer to the challenge.
    let mut unauthenticated = connect();
    unauthenticated.write_all(&register_frame(0, 2)).unwrap();
    let mut truncated = connect();
    truncated.write_all(&wire::encode(&Msg::Auth { magic: id.magic, nonce: [0; 16], proof: [0; 32] })[..20]).unwrap();
    truncated.shutdown(std::net::Shutdown::Write).unwrap();
    let _silent = connect();
    let mut bad_magic = connect();
    assert!(refusal_text(raw_handshake(&mut bad_magic, id.magic ^ 1, &id.secret)).contains("magic does not match"));
    let mut forged = connect();
    let forged_secret = Secret([3; auth::SECRET_LEN]);
    assert!(refusal_text(raw_handshake(&mut forged, id.magic, &forged_secret)).contains("could not prove"));
    // A replay: a proof made (with the real secret) for one challenge, sent on another
    // connection, whose challenge differs.
    let mut first = connect();
    let Some(Msg::Challenge { nonce: seen }) = read_frame(&mut first, HARD) else { panic!("no challenge") };
    let recorded = id.secret.proof(Role::Connector, &seen, &[7; 16]);
    let mut replay = connect();
    assert!(matches!(read_frame(&mut replay, HARD), Some(Msg::Challenge { nonce }) if nonce != seen));
    replay.write_all(&wire::encode(&Msg::Auth { magic: id.magic, nonce: [7; 16], proof: recorded })).unwrap();
    assert!(refusal_text(read_frame(&mut replay, HARD)).contains("could not prove"));

    // The stranger traffic disturbs nobody, and the silent connection delays nobody: the honest
    // ranks finish well before the root would drop it.
    honest_ranks(id, 3);
    assert!(t0.elapsed() < Duration::from_secs(4), "honest ranks were held up: {:?}", t0.elapsed());

    for (name, s) in [
        ("random", &mut random),
        ("http", &mut http),
        ("oversized", &mut oversized),
        ("unauthenticated", &mut unauthenticated),
        ("truncated", &mut truncated),
        ("bad magic", &mut bad_magic),
        ("forged", &mut forged),
        ("replay", &mut replay),
    ] {
        assert!(closed_by_peer(s, Duration::from_secs(5)), "{name} connection left open");
    }
}

/// A registration from someone who holds the id but claims absurd counts is refused without
/// the root allocating for them, and the root goes on serving the honest ranks.
#[test]
fn huge_counts_are_refused_before_allocating() {
    let id = new_unique_id().unwrap();
    for (rank, nranks, why) in [
        (0, u32::MAX, "exceeds the bootstrap's limit"),
        (u32::MAX - 1, u32::MAX, "exceeds the bootstrap's limit"),
        (7, 3, "out of range"),
    ] {
        let mut s = TcpStream::connect(id.root).unwrap();
        assert_eq!(raw_handshake(&mut s, id.magic, &id.secret).map(|m| m.kind_name()), Some("Proven"));
        s.write_all(&register_frame(rank, nranks)).unwrap();
        let text = refusal_text(read_frame(&mut s, HARD));
        assert!(text.contains(why), "{text}");
    }
    honest_ranks(id, 2);
}

/// The C API checks counts before anything is allocated or anyone is contacted.
#[test]
fn api_counts_are_checked_first() {
    use nccl::api::init::{ncclCommInitAll, ncclCommInitRank, ncclGetUniqueId};
    use nccl::types::{ncclComm_t, ncclResult_t};
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: id is a valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, ncclResult_t::ncclSuccess);
    let mut comm: ncclComm_t = std::ptr::null_mut();
    let t0 = Instant::now();
    // SAFETY: comm is a valid out-pointer; the calls must fail on their counts alone.
    assert_eq!(unsafe { ncclCommInitRank(&mut comm, i32::MAX, id, 0) }, ncclResult_t::ncclInvalidArgument);
    assert!(nccl::debug::last_error().contains("exceeds the limit"), "{}", nccl::debug::last_error());
    let mut comms = [std::ptr::null_mut(); 1];
    // SAFETY: as above; devlist NULL.
    let r = unsafe { ncclCommInitAll(comms.as_mut_ptr(), i32::MAX, std::ptr::null()) };
    assert_eq!(r, ncclResult_t::ncclInvalidArgument);
    assert!(nccl::debug::last_error().contains("ndev 2147483647 exceeds the limit"), "{}", nccl::debug::last_error());
    assert!(t0.elapsed() < Duration::from_secs(2), "count checks took {:?}", t0.elapsed());
    assert!(comm.is_null() && comms[0].is_null());
}

/// Strangers' connections are logged, but never replace the text of the application's own
/// last error.
#[test]
fn strangers_do_not_touch_the_last_error() {
    let id = new_unique_id().unwrap();
    let mut forged = TcpStream::connect(id.root).unwrap();
    let mut garbage = TcpStream::connect(id.root).unwrap();
    nccl::debug::set_last_error("the application's own error");
    garbage.write_all(&[0xee; 32]).unwrap();
    refusal_text(raw_handshake(&mut forged, id.magic, &Secret([5; auth::SECRET_LEN])));
    assert!(closed_by_peer(&mut garbage, HARD));
    // Every other test in this binary may write the text too; only the strangers' words matter.
    let last = nccl::debug::last_error();
    assert!(!last.contains("could not prove") && !last.contains("not a ferronickel bootstrap frame"), "{last}");
}

#[test]
fn two_ranks_claiming_one_rank_number() {
    let id = new_unique_id().unwrap();
    let (tx, rx) = mpsc::channel();
    for claimant in 0..2 {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let r = Bootstrap::init(&id, 1, 2, HONEST).map(|b| b.allgather(b"one").unwrap());
            let _ = tx.send((claimant, r));
        });
    }
    // The second claimant is refused as soon as both have registered; only then does rank 0
    // arrive, so the root cannot have finished before the duplicate shows up.
    let (loser, refused) = rx.recv_timeout(HARD).unwrap();
    match refused {
        Err(Error::InvalidUsage(m)) => assert!(m.contains("rank 1 already registered by"), "{m}"),
        other => panic!("claimant {loser}: {other:?}"),
    }
    let zero = run_threads(1, move |_| Bootstrap::init(&id, 0, 2, HONEST).unwrap().allgather(b"zero").unwrap());
    let (winner, accepted) = rx.recv_timeout(HARD).unwrap();
    assert_ne!(winner, loser);
    let expect = vec![b"zero".to_vec(), b"one".to_vec()];
    assert_eq!(accepted.unwrap(), expect);
    assert_eq!(zero[0], expect);
}

#[test]
fn disagreeing_nranks_is_refused() {
    let id = new_unique_id().unwrap();
    let zero = std::thread::spawn(move || Bootstrap::init(&id, 0, 2, HONEST).map(|b| b.allgather(b"0").unwrap()));
    // Let rank 0's registration fix nranks = 2 first.
    std::thread::sleep(Duration::from_millis(500));
    match Bootstrap::init(&id, 1, 3, SHORT) {
        Err(Error::InvalidUsage(m)) => assert!(m.contains("nranks 3 differs from 2 given by rank 0"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let one = run_threads(1, move |_| Bootstrap::init(&id, 1, 2, HONEST).unwrap().allgather(b"1").unwrap());
    assert_eq!(zero.join().unwrap().unwrap(), one[0]);
}

#[test]
fn missing_rank_is_named_to_everyone() {
    let id = new_unique_id().unwrap();
    let t0 = Instant::now();
    let errs = run_threads(2, move |r| expect_err(Bootstrap::init(&id, r, 3, SHORT)));
    for e in errs {
        match e {
            Error::System(m) => assert_eq!(
                m,
                "bootstrap: rank(s) [2] never registered with the root within 2s; \
                 check that every process called ncclCommInitRank with the same unique id"
            ),
            other => panic!("{other:?}"),
        }
    }
    let took = t0.elapsed();
    assert!(took >= SHORT && took < SHORT + Duration::from_secs(2), "took {took:?}");
}

#[test]
fn unreachable_root_fails_within_the_timeout() {
    let root = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let id = fake_id(root);
    let t0 = Instant::now();
    match run_threads(1, move |_| expect_err(Bootstrap::init(&id, 0, 2, SHORT))).remove(0) {
        Error::System(m) => assert!(m.contains("could not reach the root") && m.contains(&root.to_string()), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < SHORT + Duration::from_secs(1), "took {:?}", t0.elapsed());
}

#[test]
fn silent_root_fails_within_the_timeout() {
    // Connections complete in the kernel's backlog, but nobody ever answers (not even the
    // challenge).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let id = fake_id(listener.local_addr().unwrap());
    let t0 = Instant::now();
    match run_threads(1, move |_| expect_err(Bootstrap::init(&id, 0, 2, SHORT))).remove(0) {
        Error::System(m) => assert!(m.contains("could not reach the root"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < SHORT + Duration::from_secs(2), "took {:?}", t0.elapsed());
    drop(listener);
}

/// A rank that registers and then never links the ring (its listener never answers): the
/// others fail at the ring's deadline, naming it.
#[test]
fn a_rank_that_never_links_is_named() {
    let id = new_unique_id().unwrap();
    let dead_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = dead_listener.local_addr().unwrap();
    let fake = std::thread::spawn(move || {
        let mut s = TcpStream::connect(id.root).unwrap();
        assert!(matches!(raw_handshake(&mut s, id.magic, &id.secret), Some(Msg::Proven { .. })));
        let reg = Msg::Register { rank: 2, nranks: 3, listen, timeout_ms: 2000 };
        s.write_all(&wire::encode(&reg)).unwrap();
        assert!(closed_by_peer(&mut s, HARD), "the root never answered the fake rank");
    });
    let t0 = Instant::now();
    let errs = run_threads(2, move |r| expect_err(Bootstrap::init(&id, r, 3, SHORT)));
    fake.join().unwrap();
    for (r, e) in errs.iter().enumerate() {
        let m = e.to_string();
        assert!(m.contains("rank 2") || m.contains("rank(s) [2]"), "rank {r}: {m}");
    }
    assert!(t0.elapsed() < SHORT + Duration::from_secs(2), "took {:?}", t0.elapsed());
    drop(dead_listener);
}

/// A rank played by hand, honest up to the gather of the peer table inside init: it registers
/// as `rank` of `n`, takes its next rank's address from the root, links the ring both ways, and
/// hands its links to `then` (which plays the gather its own way) while the root connection
/// stays open. Uses the library's own framed streams, so only the gather is out of line.
struct FakeRank {
    root: FrameStream,
    next: FrameStream,
    prev: FrameStream,
    /// The liveness links, held so that only what `then` does is seen.
    _liveness: Vec<FrameStream>,
    listen: SocketAddr,
}

fn fake_rank(id: BootstrapId, rank: usize, n: usize) -> FakeRank {
    let cred = id.credentials();
    let deadline = Instant::now() + HARD;
    let mut acc = Acceptor::new(listen("127.0.0.1".parse().unwrap()).unwrap(), cred).unwrap();
    let listen = acc.local_addr().unwrap();
    let mut root = FrameStream::open(id.root, &cred, deadline, true).unwrap();
    let reg = Msg::Register { rank: rank as u32, nranks: n as u32, listen, timeout_ms: SHORT.as_millis() as u64 };
    root.send(&reg, deadline).unwrap();
    let Ok(Msg::RingNext { next: next_addr }) = root.recv(wire::MAX_CONTROL_BODY, deadline) else {
        panic!("the fake rank got no ring neighbour from the root")
    };
    let link = |kind| {
        let mut s = FrameStream::open(next_addr, &cred, deadline, true).unwrap();
        s.send(&Msg::Hello { from: rank as u32, link: kind }, deadline).unwrap();
        s
    };
    let (next, live_out) = (link(LinkKind::Ring), link(LinkKind::Liveness));
    let (mut prev, mut live_in) = (None, None);
    while prev.is_none() || live_in.is_none() {
        let Some(Wake::Arrival(a)) = acc.next(Some(deadline), &String::new, &[]).unwrap() else {
            panic!("the fake rank's ring neighbour never linked")
        };
        match a.msg {
            Msg::Hello { link: LinkKind::Ring, .. } => prev = Some(a.conn),
            Msg::Hello { link: LinkKind::Liveness, .. } => live_in = Some(a.conn),
            other => panic!("unexpected {other:?}"),
        }
    }
    FakeRank { root, next, prev: prev.unwrap(), _liveness: vec![live_out, live_in.unwrap()], listen }
}

/// Checks the honest ranks' init errors: all name `dead` in the root's words, promptly.
fn all_name(errs: &[(Error, Instant)], dead: usize, words: &str, since: Instant) {
    for (r, (e, at)) in errs.iter().enumerate() {
        let m = e.to_string();
        assert!(matches!(e, Error::Remote(_)), "rank {r}: {e:?}");
        assert!(m.contains(&format!("rank {dead} (listening at")) && m.contains(words), "rank {r}: {m}");
        let after = at.saturating_duration_since(since);
        assert!(after < Duration::from_secs(2), "rank {r} failed {after:?} later: {m}");
    }
}

/// A rank that dies once the ring is linked, while the others gather the peer table around it:
/// every rank is named the same culprit within milliseconds, not at the timeout.
#[test]
fn a_rank_dying_while_the_table_is_gathered_is_named() {
    let id = new_unique_id().unwrap();
    let fake = std::thread::spawn(move || {
        let mut f = fake_rank(id, 2, 4);
        // Rank 1's address: the gather has begun.
        let got = f.prev.recv(wire::MAX_DATA_BODY, Instant::now() + HARD).unwrap();
        assert!(matches!(got, Msg::Data { tag: 1, seq: 1, .. }), "{got:?}");
        drop(f);
        Instant::now()
    });
    let errs = run_threads(3, move |i| {
        let r = [0, 1, 3][i];
        (expect_err(Bootstrap::init(&id, r, 4, HONEST)), Instant::now())
    });
    let died = fake.join().unwrap();
    all_name(&errs, 2, "was lost during init: its connection to the root", died);
}

/// A rank whose address comes around the ring malformed, or other than the one it registered
/// with the root: the rank that checks it reports it to the root, and every rank fails naming
/// it, at once.
#[test]
fn a_bad_address_in_the_gathered_table_is_named() {
    let wrong = SocketAddr::from(([127, 0, 0, 1], 9));
    let mut encoded = Vec::new();
    wire::put_addr(&mut encoded, &wrong);
    for (block, words) in [
        (encoded, "came around the ring as 127.0.0.1:9 but was registered as"),
        (vec![0xff; 5], "came around the ring malformed"),
        ([&encoded_v4()[..], &[0]].concat(), "came around the ring malformed"),
    ] {
        let id = new_unique_id().unwrap();
        let t0 = Instant::now();
        let fake = std::thread::spawn(move || {
            let mut f = fake_rank(id, 2, 3);
            let deadline = Instant::now() + HARD;
            // Ring of three: send our block, forward rank 1's, and wait for the root's verdict.
            f.next.send(&Msg::Data { tag: 2, seq: 1, payload: block }, deadline).unwrap();
            let Ok(Msg::Data { tag: 1, seq: 1, payload }) = f.prev.recv(wire::MAX_DATA_BODY, deadline) else {
                panic!("rank 1's block did not come")
            };
            f.next.send(&Msg::Data { tag: 1, seq: 1, payload }, deadline).unwrap();
            let verdict = f.root.recv(wire::MAX_CONTROL_BODY, deadline);
            // The root tells everyone else; the rank it blames is only dropped.
            assert!(verdict.is_err(), "the blamed rank was told {verdict:?}");
            f.listen
        });
        let errs = run_threads(2, move |r| (expect_err(Bootstrap::init(&id, r, 3, HONEST)), Instant::now()));
        let listen = fake.join().unwrap();
        all_name(&errs, 2, words, t0);
        assert!(errs.iter().all(|(e, _)| e.to_string().contains(&listen.to_string())));
    }
}

/// An IPv4 address as the wire writes it.
fn encoded_v4() -> Vec<u8> {
    let mut v = Vec::new();
    wire::put_addr(&mut v, &SocketAddr::from(([127, 0, 0, 1], 7)));
    v
}

#[test]
fn strangers_on_a_rank_listener_are_dropped() {
    let id = new_unique_id().unwrap();
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let strangers = std::thread::spawn(move || {
        let addr = addr_rx.recv_timeout(HARD).unwrap();
        let connect = || TcpStream::connect(addr).unwrap();
        let mut garbage = connect();
        garbage.write_all(&[0xff; 100]).unwrap();
        // A forged message rank 1 is about to wait for: it must never be delivered.
        let mut forged = connect();
        let hello = |from| wire::encode(&Msg::Hello { from, link: LinkKind::P2p });
        let data = wire::encode(&Msg::Data { tag: 5, seq: 0, payload: b"forged".to_vec() });
        let Some(Msg::Challenge { .. }) = read_frame(&mut forged, HARD) else { panic!("no challenge") };
        forged.write_all(&[hello(0), data.clone()].concat()).unwrap();
        let mut bad_secret = connect();
        refusal_text(raw_handshake(&mut bad_secret, id.magic, &Secret([8; auth::SECRET_LEN])));
        // Holding the id but claiming a rank that does not exist.
        let mut bad_rank = connect();
        assert!(matches!(raw_handshake(&mut bad_rank, id.magic, &id.secret), Some(Msg::Proven { .. })));
        bad_rank.write_all(&hello(7)).unwrap();
        let mut oversized = connect();
        let mut frame = hello(0);
        frame[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        oversized.write_all(&frame[..12]).unwrap();
        let silent = connect();
        ready_tx.send(()).unwrap();
        let mut all = [garbage, forged, bad_secret, bad_rank, oversized];
        let closed = all.iter_mut().map(|s| closed_by_peer(s, Duration::from_secs(5))).collect::<Vec<_>>();
        drop(silent);
        closed
    });
    let (addr_tx, ready_rx) = (std::sync::Mutex::new(addr_tx), std::sync::Mutex::new(ready_rx));
    let results = run_threads(2, move |r| {
        let b = Bootstrap::init(&id, r, 2, HONEST).unwrap();
        if r == 1 {
            addr_tx.lock().unwrap().send(b.listen_addr()).unwrap();
            let t = Instant::now();
            let got = b.recv(0, 5).unwrap();
            Some((got, t.elapsed(), b.allgather(b"x").unwrap()))
        } else {
            // Send only once the strangers are queued ahead of us on rank 1's listener.
            ready_rx.lock().unwrap().recv_timeout(HARD).unwrap();
            b.send(1, 5, b"real").unwrap();
            b.allgather(b"x").unwrap();
            None
        }
    });
    let (got, took, all) = results[1].clone().unwrap();
    assert_eq!(got, b"real");
    assert_eq!(all, vec![b"x".to_vec(), b"x".to_vec()]);
    assert!(took < Duration::from_secs(4), "recv was held up for {took:?}");
    assert_eq!(strangers.join().unwrap(), [true; 5], "every misbehaving connection is closed");
}

// ---------------------------------------------------------------------------------------------
// Soak: init and destroy, over and over, with nothing left behind.

/// Cycles the soak runs (about 70 s on two cores); `FNB_SOAK_CYCLES` changes it.
const SOAK_CYCLES_DEFAULT: usize = 10_000;

/// (open descriptors, threads, resident KiB) of this process.
fn usage() -> (usize, usize, usize) {
    let fds = std::fs::read_dir("/proc/self/fd").unwrap().count();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> usize {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    (fds, field("Threads:"), field("VmRSS:"))
}

/// Waits (bounded) for the background threads of finished cycles (the roots) to exit.
fn settled(limit: (usize, usize)) -> (usize, usize, usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let u = usage();
        if (u.0 <= limit.0 && u.1 <= limit.1) || Instant::now() > deadline {
            return u;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn soak_init_destroy() {
    const TEST: &str = "soak_init_destroy";
    if std::env::var(CHILD_TEST).as_deref() == Ok(TEST) {
        let cycles = std::env::var("FNB_SOAK_CYCLES").map_or(SOAK_CYCLES_DEFAULT, |v| v.parse().unwrap());
        let cycle = || {
            let id = new_unique_id().unwrap();
            let ranks: Vec<_> = (0..2)
                .map(|r| {
                    std::thread::spawn(move || {
                        let b = Bootstrap::init(&id, r, 2, HONEST).unwrap();
                        b.barrier().unwrap();
                    })
                })
                .collect();
            ranks.into_iter().for_each(|t| t.join().unwrap());
        };
        // Warm up (first-use allocations, the interface choice), then measure.
        (0..20).for_each(|_| cycle());
        let before = settled((0, 0));
        for i in 0..cycles {
            cycle();
            if i % 1000 == 999 {
                println!("soak: {} cycles, usage {:?}", i + 1, usage());
            }
        }
        let after = settled((before.0, before.1));
        println!("soak: {cycles} cycles; fds, threads, VmRSS KiB before {before:?}, after {after:?}");
        assert!(after.0 <= before.0, "descriptors leaked: {before:?} -> {after:?}");
        assert!(after.1 <= before.1, "threads leaked: {before:?} -> {after:?}");
        assert!(after.2 <= before.2 + 16 * 1024, "memory grew by more than 16 MiB: {before:?} -> {after:?}");
        println!("FNB_CHILD_OK rank 0");
        return;
    }
    // A process of its own, so that the other tests' threads and sockets do not blur the counts.
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD_TEST, TEST)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_all_within(vec![child], Duration::from_secs(280));
}

// ---------------------------------------------------------------------------------------------
// Floods of silent connections: honest ranks get through whatever else is connected.

/// Raises this process's descriptor limit to the hard limit (floods need a few thousand).
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: lim is a valid rlimit for getrlimit to fill and setrlimit to read.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
}

/// Opens up to `n` connections to `addr` that never say a word (on a thread: a full backlog
/// makes connect wait for the listener), giving up after 10 s.
fn silent_flood(addr: SocketAddr, n: usize) -> std::thread::JoinHandle<Vec<TcpStream>> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        (0..n)
            .map_while(|_| {
                (Instant::now() < deadline).then(|| TcpStream::connect_timeout(&addr, Duration::from_secs(1)))
            })
            .filter_map(Result::ok)
            .collect()
    })
}

#[test]
fn silent_floods_delay_nobody() {
    raise_fd_limit();
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: as in raise_fd_limit.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    // More than a listener reads at once, so that eviction is exercised; within the limit.
    let flood = (acceptor::max_pending() + 200).min(lim.rlim_cur as usize / 6);
    let id = new_unique_id().unwrap();
    let on_root = silent_flood(id.root, flood).join().unwrap();
    assert!(on_root.len() > flood / 2, "only {} of {flood} flood connections opened", on_root.len());
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let flooder = std::thread::spawn(move || {
        let conns = silent_flood(addr_rx.recv_timeout(HARD).unwrap(), flood).join().unwrap();
        (0..3).for_each(|_| go_tx.send(()).unwrap());
        conns
    });
    let (addr_tx, go_rx) = (std::sync::Mutex::new(addr_tx), std::sync::Mutex::new(go_rx));
    let took = run_threads(4, move |r| {
        let b = Bootstrap::init(&id, r, 4, HONEST).unwrap();
        if r == 1 {
            addr_tx.lock().unwrap().send(b.listen_addr()).unwrap();
        } else {
            go_rx.lock().unwrap().recv_timeout(HARD).unwrap();
        }
        // Rank 1 starts at once, the others once rank 1's listener is flooded: every p2p
        // message to rank 1 passes the flood.
        let t = Instant::now();
        exercise(&b);
        t.elapsed()
    });
    let on_rank = flooder.join().unwrap();
    assert!(on_rank.len() > flood / 2, "only {} of {flood} flood connections opened", on_rank.len());
    // Without eviction the honest ranks would wait for the strangers' first-frame limit (5 s).
    for (r, t) in took.iter().enumerate() {
        assert!(*t < Duration::from_secs(4), "rank {r} was held up for {t:?} by {flood} silent connections");
    }
    drop((on_root, on_rank));
}

// ---------------------------------------------------------------------------------------------
// Ranks killed (SIGKILL) during init and during a bootstrap collective: every survivor fails
// within 2 s of the kill, naming the dead rank, long before the bootstrap timeout.

const VICTIM: &str = "FNB_VICTIM";

/// In a child started by [`spawn_victim`]: plays rank `FNB_CHILD_RANK` up to `stage` (init
/// blocked, or inside a collective), says so on stdout, and waits to be killed.
fn victim(test: &str) -> bool {
    if std::env::var(VICTIM).as_deref() != Ok(test) {
        return false;
    }
    let var = |k: &str| std::env::var(k).unwrap();
    let id = BootstrapId::from_unique_id(&unhex(&var("FNB_CHILD_ID"))).unwrap();
    let (rank, n) = (var("FNB_CHILD_RANK").parse().unwrap(), var("FNB_CHILD_NRANKS").parse().unwrap());
    match var("FNB_VICTIM_STAGE").as_str() {
        "init" => {
            println!("FNB_VICTIM_READY");
            // Blocks: not every rank will register.
            let _ = Bootstrap::init(&id, rank, n, HONEST);
        }
        _ => {
            let b = Bootstrap::init(&id, rank, n, HONEST).unwrap();
            b.barrier().unwrap();
            println!("FNB_VICTIM_READY");
            std::thread::sleep(HARD);
        }
    }
    true
}

fn spawn_victim(test: &str, id: &BootstrapId, rank: usize, n: usize, stage: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(VICTIM, test)
        .env("FNB_CHILD_ID", hex(&id.to_unique_id()))
        .env("FNB_CHILD_RANK", rank.to_string())
        .env("FNB_CHILD_NRANKS", n.to_string())
        .env("FNB_VICTIM_STAGE", stage)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the victim's ready line, lets the survivors block on it for `settle`, kills it,
/// and returns the time of the kill.
fn kill_when_ready(mut child: Child, settle: Duration) -> Instant {
    use std::io::BufRead;
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let ready = std::io::BufReader::new(out).lines().any(|l| l.is_ok_and(|l| l.contains("FNB_VICTIM_READY")));
        let _ = tx.send(ready);
    });
    let ready = rx.recv_timeout(HARD);
    std::thread::sleep(settle);
    child.kill().unwrap();
    let killed = Instant::now();
    child.wait().unwrap();
    assert_eq!(ready, Ok(true), "the victim never got ready");
    killed
}

/// Checks every survivor's (error, time of failure) against the kill.
fn survivors_named(results: Vec<(Error, Instant)>, killed: Instant, dead: usize) {
    for (r, (e, at)) in results.into_iter().enumerate() {
        let m = e.to_string();
        assert!(m.contains(&format!("rank {dead} ")) && m.contains("was lost"), "survivor {r}: {m}");
        assert!(matches!(e, Error::Remote(_)), "survivor {r}: {e:?}");
        let after = at.saturating_duration_since(killed);
        assert!(after < Duration::from_secs(2), "survivor {r} failed {after:?} after the kill: {m}");
    }
}

#[test]
fn rank_killed_during_init_is_named() {
    const TEST: &str = "rank_killed_during_init_is_named";
    if victim(TEST) {
        return;
    }
    // Four ranks, rank 3 never comes: ranks 0 and 1 (threads) and 2 (the victim) are
    // registered and waiting when rank 2 dies.
    let id = new_unique_id().unwrap();
    let survivors = std::thread::spawn(move || {
        run_threads(2, move |r| (expect_err(Bootstrap::init(&id, r, 4, HONEST)), Instant::now()))
    });
    let killed = kill_when_ready(spawn_victim(TEST, &id, 2, 4, "init"), Duration::from_millis(700));
    survivors_named(survivors.join().unwrap(), killed, 2);
}

#[test]
fn rank_killed_during_allgather_is_named() {
    const TEST: &str = "rank_killed_during_allgather_is_named";
    if victim(TEST) {
        return;
    }
    // Rank 2 of 5 dies while the others wait in an allgather it never joins: its neighbours
    // see its links close, and ranks 0 and 4, which have no link to it, hear it around the ring.
    let id = new_unique_id().unwrap();
    let victim = spawn_victim(TEST, &id, 2, 5, "collective");
    let survivors = std::thread::spawn(move || {
        run_threads(4, move |i| {
            let r = [0, 1, 3, 4][i];
            let b = Bootstrap::init(&id, r, 5, HONEST).unwrap();
            b.barrier().unwrap();
            let e = b.allgather(&block(r, true)).map(drop).unwrap_err();
            // The ring stays broken: later collectives fail at once with the same words.
            assert_eq!(b.barrier().map_err(|e| e.to_string()), Err(e.to_string()));
            (e, Instant::now())
        })
    });
    let killed = kill_when_ready(victim, Duration::from_millis(500));
    survivors_named(survivors.join().unwrap(), killed, 2);
}

/// A rank whose handle is gone (its sockets closed, as when its process dies): a send to it
/// fails at once, and the others' next collectives fail naming it, within the same bound.
#[test]
fn a_closed_rank_fails_sends_and_collectives_at_once() {
    let id = new_unique_id().unwrap();
    let (gone_tx, gone_rx) = mpsc::channel::<()>();
    let gone_rx = std::sync::Mutex::new(gone_rx);
    let gone_tx = std::sync::Mutex::new(gone_tx);
    let results = run_threads(3, move |r| {
        let b = Bootstrap::init(&id, r, 3, HONEST).unwrap();
        b.barrier().unwrap();
        if r == 2 {
            drop(b);
            (0..2).for_each(|_| gone_tx.lock().unwrap().send(()).unwrap());
            return None;
        }
        gone_rx.lock().unwrap().recv_timeout(HARD).unwrap();
        let t = Instant::now();
        let send = b.send(2, 1, b"to the dead").unwrap_err().to_string();
        let coll = b.broadcast(0, (r == 0).then_some(&b"x"[..])).and_then(|_| b.barrier()).unwrap_err().to_string();
        Some((send, coll, t.elapsed()))
    });
    for (r, res) in results.into_iter().take(2).enumerate() {
        let (send, coll, took) = res.unwrap();
        assert!(send.contains("to rank 2"), "rank {r}: {send}");
        assert!(coll.contains("rank 2 (listening at") && coll.contains("was lost"), "rank {r}: {coll}");
        assert!(took < Duration::from_secs(2), "rank {r} took {took:?}");
    }
}
