//! The root's state machine without sockets, and its descriptor and traffic budgets.

use super::*;

const T: Duration = Duration::from_secs(5);

fn reg(rank: u32, nranks: u32) -> Registration {
    Registration { rank, nranks, listen: SocketAddr::from(([10, 0, 0, rank as u8], 1000 + rank as u16)), timeout: T }
}

fn reason(a: Option<Action<u32>>) -> String {
    match a {
        Some(Action::Reject { reason, .. }) => reason,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn fail(a: Option<Action<u32>>) -> (Vec<u32>, RefuseReason, String) {
    match a {
        Some(Action::Fail { conns, reason, text }) => (conns, reason, text),
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// A root with every rank of `n` registered (rank r on connection 10 + r), table sent.
fn tabled(n: u32, t0: Instant) -> RootState<u32> {
    let mut s = RootState::default();
    for r in 0..n {
        let a = s.on_register(10 + r, reg(r, n), t0);
        assert_eq!(a.is_some(), r == n - 1);
    }
    s
}

#[test]
fn completes_in_any_order_and_indexes_by_rank() {
    let t0 = Instant::now();
    let mut s = RootState::default();
    assert_eq!(s.deadline(), None);
    assert_eq!(s.on_register(12, reg(2, 3), t0), None);
    assert_eq!(s.deadline(), Some(t0 + T));
    assert_eq!(s.on_register(10, reg(0, 3), t0 + T / 2), None);
    assert_eq!(s.poll(t0 + T / 2), None);
    let done = s.on_register(11, reg(1, 3), t0 + T / 2);
    // Each rank gets its next rank's address, the last rank rank 0's.
    let next = |r: u32| reg((r + 1) % 3, 3).listen;
    assert_eq!(done, Some(Action::Ring { links: vec![(10, next(0)), (11, next(1)), (12, next(2))] }));
    // The ring phase has its own deadline, from the table.
    assert_eq!(s.deadline(), Some(t0 + T / 2 + T + RING_REPORT_MARGIN));
    assert_eq!(s.registered().collect::<Vec<_>>(), vec![10, 11, 12]);
    assert_eq!(s.on_ready(12), None);
    assert_eq!(s.on_ready(12), None, "a repeated report counts once");
    assert_eq!(s.on_ready(10), None);
    assert_eq!(s.on_ready(99), None, "unknown connections are ignored");
    assert_eq!(s.on_ready(11), Some(Action::Ready { conns: vec![10, 11, 12] }));
    assert!(s.is_finished());
    assert_eq!(s.poll(t0 + 4 * T), None, "a finished root reports nothing more");
    assert_eq!(s.on_closed(10, "closed"), None);
}

/// Everything the root writes after the handshakes, for n = 1,000 ranks registering in a
/// scrambled order: one address and one Ready per rank, so O(n) bytes in all (the whole
/// table to every rank would be n^2 addresses: about 7 MB here, 2 GB at 8,192 ranks).
#[test]
fn root_sends_one_address_per_rank() {
    use crate::socket::wire::{encode, HEADER_LEN, MAX_ADDR_LEN};
    const N: u32 = 1_000;
    let t0 = Instant::now();
    let mut s = RootState::default();
    let mut ring = Vec::new();
    for i in 0..N {
        // 7919 is prime to N: a permutation of the ranks.
        let r = i * 7919 % N;
        if let Some(a) = s.on_register(10 + r, reg(r, N), t0) {
            assert_eq!(i, N - 1, "nothing is sent before the last registration");
            ring = a.messages();
        }
    }
    assert_eq!(ring.len(), N as usize, "one message per rank");
    for (r, (conn, msg)) in ring.iter().enumerate() {
        assert_eq!(*conn, 10 + r as u32);
        assert_eq!(*msg, Msg::RingNext { next: reg((r as u32 + 1) % N, N).listen });
    }
    let bytes = |msgs: &[(u32, Msg)]| msgs.iter().map(|(_, m)| encode(m).len()).collect::<Vec<_>>();
    let ring_bytes = bytes(&ring);
    assert!(ring_bytes.iter().all(|&b| b <= HEADER_LEN + MAX_ADDR_LEN), "O(1) bytes per rank");
    // An IPv4 address is 7 bytes on the wire.
    assert_eq!(ring_bytes.iter().sum::<usize>(), N as usize * (HEADER_LEN + 7));
    let mut ready = Vec::new();
    for r in 0..N {
        if let Some(a) = s.on_ready(10 + r) {
            ready = a.messages();
        }
    }
    assert_eq!(ready.len(), N as usize);
    assert!(ready.iter().all(|(_, m)| *m == Msg::Ready));
    assert_eq!(bytes(&ready).iter().sum::<usize>(), N as usize * HEADER_LEN);
}

#[test]
fn descriptor_limit_grows_by_nranks_within_the_hard_limit() {
    let spare = SPARE_DESCRIPTORS;
    // Few ranks: the usual soft limit is enough, nothing changes.
    assert_eq!(descriptor_limit(1024, 1 << 20, 40, 8), None);
    assert_eq!(descriptor_limit(1024, 1 << 20, 40, 1024), Some((40 + 1024 + spare, false)));
    assert_eq!(descriptor_limit(1024, 1 << 20, 40, 8192), Some((40 + 8192 + spare, false)));
    // The hard limit caps it and is reported short; a soft limit is never lowered.
    assert_eq!(descriptor_limit(1024, 4096, 40, 8192), Some((4096, true)));
    assert_eq!(descriptor_limit(4096, 4096, 40, 8192), Some((4096, true)));
    assert_eq!(descriptor_limit(u64::MAX, u64::MAX, u64::MAX, 8), None);
    assert_eq!(descriptor_limit(10, 5, 0, 1000), Some((10, true)));
}

#[test]
fn single_rank_completes_at_once() {
    let mut s = RootState::default();
    // Its own next rank: itself (it links no ring, but the reply has one shape).
    assert_eq!(
        s.on_register(1u32, reg(0, 1), Instant::now()),
        Some(Action::Ring { links: vec![(1, reg(0, 1).listen)] })
    );
    assert_eq!(s.on_ready(1), Some(Action::Ready { conns: vec![1] }));
}

#[test]
fn rank_out_of_range() {
    let mut s = RootState::<u32>::default();
    assert_eq!(reason(s.on_register(1, reg(4, 4), Instant::now())), "rank 4 is out of range for nranks 4");
    assert!(reason(s.on_register(1, reg(0, 0), Instant::now())).contains("out of range for nranks 0"));
    assert_eq!(s.deadline(), None);
}

#[test]
fn huge_nranks_is_refused_without_allocating() {
    let mut s = RootState::<u32>::default();
    let r = reason(s.on_register(1, reg(0, u32::MAX), Instant::now()));
    assert_eq!(r, format!("nranks 4294967295 exceeds the bootstrap's limit of {MAX_RANKS}"));
    assert_eq!(s.deadline(), None, "a refused registration changes nothing");
    // The largest allowed count costs only what registered ranks take.
    assert_eq!(s.on_register(1, reg(7, MAX_RANKS as u32), Instant::now()), None);
    assert_eq!(s.slots.len(), 1);
    assert!(s.waiting_for().contains("and 131055 more"), "{}", s.waiting_for());
}

#[test]
fn disagreeing_nranks_names_the_first() {
    let mut s = RootState::<u32>::default();
    assert_eq!(s.on_register(1, reg(0, 4), Instant::now()), None);
    assert_eq!(reason(s.on_register(2, reg(1, 3), Instant::now())), "nranks 3 differs from 4 given by rank 0");
    // Out of range against the learned nranks but in range for its own claim: still the nranks error.
    assert_eq!(reason(s.on_register(2, reg(5, 6), Instant::now())), "nranks 6 differs from 4 given by rank 0");
}

#[test]
fn duplicate_rank_keeps_the_first() {
    let t0 = Instant::now();
    let mut s = RootState::default();
    assert_eq!(s.on_register(1, reg(1, 2), t0), None);
    let mut dup = reg(1, 2);
    dup.listen = "10.9.9.9:9".parse().unwrap();
    assert_eq!(
        reason(s.on_register(2, dup, t0)),
        "rank 1 already registered by the process listening at 10.0.0.1:1001"
    );
    match s.on_register(3, reg(0, 2), t0) {
        Some(Action::Ring { links }) => assert_eq!(links, vec![(3, reg(1, 2).listen), (1, reg(0, 2).listen)]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn deadline_reports_missing_ranks_once() {
    let t0 = Instant::now();
    let mut s = RootState::default();
    let mut first = reg(0, 4);
    first.timeout = Duration::from_secs(2);
    assert_eq!(s.on_register(7, first, t0), None);
    // Later registrations do not move the deadline, whatever timeout they carry.
    assert_eq!(s.on_register(8, reg(2, 4), t0 + Duration::from_secs(1)), None);
    assert_eq!(s.deadline(), Some(t0 + Duration::from_secs(2)));
    assert_eq!(s.poll(t0 + Duration::from_millis(1999)), None);
    assert_eq!(
        fail(s.poll(t0 + Duration::from_secs(2))),
        (
            vec![7, 8],
            RefuseReason::Missing,
            "bootstrap: rank(s) [1, 3] never registered with the root within 2s; \
             check that every process called ncclCommInitRank with the same unique id"
                .into()
        )
    );
    assert!(s.is_finished());
    assert_eq!(s.poll(t0 + Duration::from_secs(3)), None);
    assert!(reason(s.on_register(9, reg(1, 4), t0 + Duration::from_secs(3))).contains("already finished"));
}

#[test]
fn ranks_that_never_link_the_ring_are_named() {
    let t0 = Instant::now();
    let mut s = tabled(3, t0);
    assert_eq!(s.on_ready(11), None);
    assert_eq!(s.poll(t0 + T), None, "the ranks get to report first");
    let (conns, why, text) = fail(s.poll(t0 + T + RING_REPORT_MARGIN));
    assert_eq!((conns, why), (vec![10, 11, 12], RefuseReason::Missing));
    assert!(text.contains("rank(s) [0, 2] did not link the ring and gather the peer table within 5s"), "{text}");
}

#[test]
fn a_registered_rank_that_closes_is_named_to_the_others() {
    let t0 = Instant::now();
    // Before the table: the others hear at once, not at the deadline.
    let mut s = RootState::default();
    assert_eq!(s.on_register(10, reg(0, 3), t0), None);
    assert_eq!(s.on_register(12, reg(2, 3), t0), None);
    assert_eq!(s.on_closed(99, "closed"), None, "a connection that never registered is nobody");
    let (conns, why, text) = fail(s.on_closed(12, "closed"));
    assert_eq!((conns, why), (vec![10], RefuseReason::Lost));
    assert_eq!(
        text,
        "bootstrap: rank 2 (listening at 10.0.0.2:1002) was lost during init: its connection to the root closed; \
         did its process die?"
    );
    assert!(s.is_finished());
    // After the table, while the ring is linked.
    let mut s = tabled(3, t0);
    assert_eq!(s.on_ready(10), None);
    let (conns, _, text) = fail(s.on_closed(11, "failed (reset)"));
    assert_eq!(conns, vec![10, 12]);
    assert!(text.contains("rank 1 (listening at 10.0.0.1:1001) was lost"), "{text}");
}

#[test]
fn a_rank_reporting_an_unreachable_neighbour() {
    let mut s = tabled(3, Instant::now());
    let (conns, why, text) = fail(s.on_lost_report(11, 2, "could not open its ring link".into()));
    assert_eq!((conns, why), (vec![10, 11], RefuseReason::Lost));
    assert!(
        text.contains("rank 2 (listening at 10.0.0.2:1002) was lost during init: rank 1 reports: could not"),
        "{text}"
    );
    // A report naming a rank that does not exist blames the reporter.
    let mut s = tabled(3, Instant::now());
    let (_, _, text) = fail(s.on_lost_report(11, 7, "?".into()));
    assert!(text.starts_with("bootstrap: rank 1 "), "{text}");
    // A ring report before the table is a protocol violation by that rank.
    let mut s = RootState::default();
    assert_eq!(s.on_register(10, reg(0, 2), Instant::now()), None);
    assert!(fail(s.on_ready(10)).2.contains("rank 0"));
}

#[test]
fn huge_timeouts_are_capped() {
    let t0 = Instant::now();
    let mut s = RootState::default();
    let mut r = reg(0, 2);
    r.timeout = Duration::MAX;
    assert_eq!(s.on_register(1u32, r, t0), None);
    assert_eq!(s.deadline(), Some(t0 + MAX_TIMEOUT));
}

#[test]
fn no_deadline_before_the_first_registration() {
    let mut s = RootState::<u32>::default();
    assert_eq!(s.poll(Instant::now() + Duration::from_secs(3600)), None);
    assert!(!s.is_finished());
}

#[test]
fn replies_map_to_errors() {
    let root: SocketAddr = "10.0.0.9:9".parse().unwrap();
    let next: SocketAddr = "10.0.0.1:1001".parse().unwrap();
    assert_eq!(check_reply(Msg::RingNext { next }, 0, root), Ok(next));
    assert!(matches!(check_reply(Msg::Ready, 0, root), Err(Error::Remote(_))));
    let text = "bootstrap: rank(s) [1] never registered".to_string();
    assert_eq!(
        check_reply(Msg::Refused { reason: RefuseReason::Missing, text: text.clone() }, 0, root),
        Err(Error::System(text.clone()))
    );
    assert_eq!(
        check_reply(Msg::Refused { reason: RefuseReason::Lost, text: text.clone() }, 0, root),
        Err(Error::Remote(text))
    );
    match check_reply(
        Msg::Refused { reason: RefuseReason::Rejected, text: "rank 1 already registered".into() },
        1,
        root,
    ) {
        Err(Error::InvalidUsage(m)) => assert!(m.contains("refused rank 1: rank 1 already registered"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(check_reply(Msg::Data { tag: 0, seq: 0, payload: vec![] }, 0, root), Err(Error::Remote(_))));
}
