//! The Socket net through a fault-injecting TCP relay of our own (`tests/common/relay.rs`),
//! between a send comm and a receive comm of this process: a slow network (every forward
//! delayed), a stalled one (nothing forwarded for longer than the net's TCP timeout, while the
//! relay's kernel still acknowledges: a slow peer, which must not be cut), and one stream cut
//! with a reset mid-transfer (an error naming the peer and the reset, within a bound).
//!
//! Messages are random, sent in order and checked byte for byte, the receive buffers poisoned
//! first. The relay runs on loopback: no root or namespaces needed.

mod common;

use common::relay::Relay;
use nccl::transport::net::socket::{decode_handle, encode_handle};
use nccl::transport::net::{self, Net, PtrKind, RecvBuf, RecvComm, SendComm};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The TCP timeout the net runs with here: shorter than the stall, so a stall that cut the
/// connection would show.
const TCP_MS: u64 = 1000;
const STALL: Duration = Duration::from_millis(2500);
const MSGS: usize = 12;
const MSG: usize = 1 << 20;
const LIMIT: Duration = Duration::from_secs(30);
const POISON: u8 = 0xa5;

fn the_net() -> Arc<dyn Net> {
    // Every test of this binary wants the same settings; the net reads them once. Messages go
    // in chunks on the data sockets wherever the test runs (on two CPUs they would all go
    // inline, and a cut data socket would carry nothing).
    std::env::set_var("FERRONICKEL_NET_TCP_TIMEOUT_MS", TCP_MS.to_string());
    std::env::set_var("FERRONICKEL_NET_SOCKET_INLINE_MAX", (128 << 10).to_string());
    net::init(&net::NetConfig { net_name: Some("Socket".into()), ..Default::default() }).expect("the Socket net")
}

/// A send comm and a receive comm whose every socket goes through a relay.
fn through_relay(net: &dyn Net) -> (Box<dyn SendComm>, Box<dyn RecvComm>, Relay) {
    let (handle, mut listener) = net.listen(0).unwrap();
    let (nonce, real) = decode_handle(&handle).unwrap();
    let relay = Relay::start(std::net::SocketAddr::new(real.ip(), 0), real);
    let (s, r) =
        common::finish_connect(net.connect(0, &encode_handle(nonce, relay.addr)).unwrap(), &mut *listener, LIMIT);
    (s, r, relay)
}

/// Fresh random bytes (xorshift64* from the clock).
fn random(len: usize) -> Vec<u8> {
    let mut x = Instant::now().elapsed().as_nanos() as u64 ^ 0x9e3779b97f4a7c15 ^ (len as u64) << 17;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545f4914f6cdd1d) >> 56) as u8
        })
        .collect()
}

/// Sends [`MSGS`] messages one at a time, each received into a poisoned buffer and checked;
/// `during(i)` runs after message i is posted. Ok(elapsed) when all arrived intact, else the
/// first error with when it came.
fn transfer(s: &mut dyn SendComm, r: &mut dyn RecvComm, during: impl Fn(usize)) -> Result<Duration, (String, Instant)> {
    let (smr, rmr) = (
        s.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap(),
        r.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap(),
    );
    let start = Instant::now();
    for i in 0..MSGS {
        let data = random(MSG);
        let mut buf = vec![POISON; MSG + 64];
        let posted = [RecvBuf { data: buf.as_mut_ptr(), size: MSG + 64, tag: 7 }];
        // SAFETY: buf and data outlive the requests: both are tested to completion or failure
        // below, and a failed comm is dropped before them.
        let rq = unsafe { r.irecv(&posted, &[&rmr]) }.unwrap().expect("a free slot");
        // SAFETY: as above.
        let sq = unsafe { s.isend(data.as_ptr(), MSG, 7, &smr) }.unwrap().expect("a free slot");
        during(i);
        let (mut sent, mut got) = (false, None);
        let until = Instant::now() + LIMIT;
        while !sent || got.is_none() {
            assert!(Instant::now() < until, "message {i} neither arrived nor failed within {LIMIT:?}");
            if !sent {
                sent = s.test(&sq).map_err(|e| (format!("send: {e}"), Instant::now()))?.is_some();
            }
            if got.is_none() {
                got = r.test(&rq).map_err(|e| (format!("receive: {e}"), Instant::now()))?;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        assert_eq!(got.unwrap(), vec![MSG], "message {i}'s size");
        assert!(buf[..MSG] == data[..], "message {i} arrived changed");
        assert!(buf[MSG..].iter().all(|&b| b == POISON), "message {i} landed past its length");
    }
    Ok(start.elapsed())
}

/// Every forward delayed by 5 ms: slower, intact, no error.
#[test]
fn a_slow_network_delivers_everything() {
    let net = the_net();
    let (mut s, mut r, relay) = through_relay(&*net);
    relay.delay(Duration::from_millis(5));
    transfer(&mut *s, &mut *r, |_| {}).unwrap_or_else(|(e, _)| panic!("{e}"));
}

/// Nothing forwarded for 2.5 s, longer than the net's TCP timeout, mid-transfer: the relay's
/// kernel still acknowledges what it holds and its window closes, as a slow peer's does. The
/// net must wait, not cut: every message arrives intact after the stall.
#[test]
fn a_stall_longer_than_the_tcp_timeout_is_slow_not_dead() {
    let net = the_net();
    let (mut s, mut r, relay) = through_relay(&*net);
    let took = transfer(&mut *s, &mut *r, |i| {
        if i == 2 {
            relay.stall(true);
            std::thread::sleep(STALL);
            relay.stall(false);
        }
    })
    .unwrap_or_else(|(e, _)| panic!("the stall was taken for a dead peer: {e}"));
    assert!(took >= STALL, "{took:?}");
}

/// One stream of the connection reset mid-transfer: both ends fail within a second, saying
/// the peer reset it and naming the peer's address.
#[test]
fn one_stream_cut_mid_transfer_fails_naming_the_peer() {
    let net = the_net();
    let (mut s, mut r, relay) = through_relay(&*net);
    let cut_at = std::cell::Cell::new(None);
    let (e, when) = transfer(&mut *s, &mut *r, |i| {
        if i == 3 {
            // A control socket and at least one data socket per connection: cut the last.
            relay.cut(relay.streams() - 1);
            cut_at.set(Some(Instant::now()));
        }
    })
    .expect_err("a cut stream must fail the transfer");
    let after = when - cut_at.get().expect("the cut happened");
    assert!(after < Duration::from_secs(1), "noticed {after:?} after the cut: {e}");
    assert!(e.contains("reset") && e.contains(&relay.addr.ip().to_string()), "{e}");
    eprintln!("noticed {after:?} after the cut: {e}");
}
