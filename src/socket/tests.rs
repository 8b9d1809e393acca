//! The socket layer over loopback: framed streams, the handshake both ways, the acceptor.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::acceptor::{Acceptor, Arrival, Wake};
use super::addr::listen;
use super::auth::{self, Credentials};
use super::frame::{FrameStream, NetError};
use super::wire::{self, Msg};

fn cred(magic: u64) -> Credentials {
    Credentials { magic, secret: auth::Secret([magic as u8; auth::SECRET_LEN]) }
}

fn arrival(w: Option<Wake>) -> Arrival {
    match w {
        Some(Wake::Arrival(a)) => *a,
        _ => panic!("expected an arrival"),
    }
}

fn acceptor(c: Credentials) -> (Acceptor, SocketAddr) {
    let acc = Acceptor::new(listen(Ipv4Addr::LOCALHOST.into()).unwrap(), c).unwrap();
    let addr = acc.local_addr().unwrap();
    (acc, addr)
}

#[test]
fn loopback_listener_round_trip() {
    let (mut acc, addr) = acceptor(cred(3));
    let deadline = Instant::now() + Duration::from_secs(10);
    let hello = Msg::Hello { from: 1, link: wire::LinkKind::Ring };
    let data = Msg::Data { tag: 1, seq: 2, payload: vec![7; 300_000] };
    let mut both = wire::encode(&hello);
    both.extend(wire::encode(&data));
    // A blob bigger than the socket buffers: the reader must run while the writer writes.
    let writer = std::thread::spawn(move || {
        let mut c = FrameStream::open(addr, &cred(3), deadline, false).unwrap();
        c.send_bytes(&both, deadline).map(|_| c)
    });
    let mut a = arrival(acc.next(Some(deadline), &String::new, &[]).unwrap());
    assert_eq!(a.msg, hello);
    assert_eq!(a.conn.recv(wire::MAX_DATA_BODY, deadline).unwrap(), data);
    let mut c = writer.join().unwrap().unwrap();
    assert!(matches!(c.recv(16, Instant::now() + Duration::from_millis(50)), Err(NetError::Timeout)));
    drop(a);
    assert!(matches!(c.recv(16, deadline), Err(NetError::Closed)));
}

#[test]
fn wrong_credentials_are_refused_both_ways() {
    let (mut acc, addr) = acceptor(cred(3));
    let deadline = Instant::now() + Duration::from_secs(10);
    let bad_magic = std::thread::spawn(move || FrameStream::open(addr, &cred(4), deadline, false).map(drop));
    let forged = Credentials { magic: 3, secret: auth::Secret([9; auth::SECRET_LEN]) };
    let bad_secret = std::thread::spawn(move || FrameStream::open(addr, &forged, deadline, false).map(drop));
    assert!(acc.next(Some(Instant::now() + Duration::from_millis(300)), &String::new, &[]).unwrap().is_none());
    match bad_magic.join().unwrap() {
        Err(NetError::Refused(m)) => assert!(m.contains("magic does not match"), "{m}"),
        other => panic!("{other:?}"),
    }
    match bad_secret.join().unwrap() {
        Err(NetError::Refused(m)) => assert!(m.contains("could not prove it holds the unique id"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A listener that does not hold the secret is found out by the connector.
    let (mut impostor, addr) = acceptor(forged);
    let t = std::thread::spawn(move || {
        impostor.next(Some(Instant::now() + Duration::from_secs(2)), &String::new, &[]).map(|a| a.is_none())
    });
    match FrameStream::open(addr, &cred(3), deadline, false) {
        Err(NetError::Refused(m)) => assert!(m.contains("could not prove"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(t.join().unwrap().unwrap(), "the impostor accepted nothing");
}

#[test]
fn acceptor_deadline_and_refused_connect() {
    let (mut acc, gone) = acceptor(cred(1));
    let t = Instant::now();
    assert!(acc.next(Some(t + Duration::from_millis(100)), &String::new, &[]).unwrap().is_none());
    assert!(t.elapsed() >= Duration::from_millis(100));
    drop(acc);
    let t = Instant::now();
    let r = FrameStream::open(gone, &cred(1), t + Duration::from_secs(5), false);
    assert!(matches!(r, Err(NetError::Io(e)) if e.kind() == io::ErrorKind::ConnectionRefused));
    assert!(t.elapsed() < Duration::from_secs(1), "a refusal is final unless patient");
    let r = FrameStream::open(gone, &cred(1), Instant::now() + Duration::from_millis(200), true);
    assert!(r.is_err());
}

/// NCCL_SOCKET_SNDBUF and NCCL_SOCKET_RCVBUF set a socket's buffers where above 0, and leave the
/// kernel's own otherwise (Linux reports twice what was asked, within its caps).
#[test]
fn buffer_settings_size_a_socket_only_where_set() {
    use socket2::{Domain, Protocol, SockRef, Socket, Type};
    let fresh = || Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
    let kernels = fresh();
    let (snd0, rcv0) = (kernels.send_buffer_size().unwrap(), kernels.recv_buffer_size().unwrap());
    for unset in [-1, 0] {
        let s = fresh();
        super::set_buffers(SockRef::from(&s), unset, unset).unwrap();
        assert_eq!((s.send_buffer_size().unwrap(), s.recv_buffer_size().unwrap()), (snd0, rcv0));
    }
    let s = fresh();
    super::set_buffers(SockRef::from(&s), 8192, 16384).unwrap();
    assert_eq!((s.send_buffer_size().unwrap(), s.recv_buffer_size().unwrap()), (16384, 32768));
    // A value past what SO_SNDBUF takes is left alone rather than cut to something else.
    let s = fresh();
    super::set_buffers(SockRef::from(&s), i64::MAX, -5).unwrap();
    assert_eq!((s.send_buffer_size().unwrap(), s.recv_buffer_size().unwrap()), (snd0, rcv0));
}
