//! The Socket net over loopback: interfaces, wire formats, strangers, slow and broken peers.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};

use super::wire::{chunk_header, chunks, msg_header, parse_msg_header};
use super::*;
use crate::transport::net::{PtrKind, RecvBuf, RecvComm, Request, SendComm, MAX_REQUESTS};

fn ifs(list: &[(&str, &str)]) -> Vec<(String, IpAddr)> {
    list.iter().map(|(n, a)| (n.to_string(), a.parse().unwrap())).collect()
}

const HOST: &[(&str, &str)] = &[
    ("lo", "127.0.0.1"),
    ("lo", "::1"),
    ("docker0", "172.17.0.1"),
    ("eth0", "192.0.2.2"),
    ("eth0", "fd00::2"),
    ("eth1", "10.0.0.2"),
];

fn rule(spec: Option<&str>, v6: Option<bool>) -> IfRule {
    IfRule { spec: spec.map(String::from), v6, near: Vec::new() }
}

#[test]
fn interfaces_one_address_each_family_and_order() {
    let h = ifs(HOST);
    let names = |v: Vec<(String, IpAddr)>| v.into_iter().map(|(n, ip)| format!("{n}/{ip}")).collect::<Vec<_>>();
    assert_eq!(names(pick_interfaces(&rule(None, None), &h).unwrap()), ["eth0/192.0.2.2", "eth1/10.0.0.2"]);
    assert_eq!(names(pick_interfaces(&rule(None, Some(true)), &h).unwrap()), ["eth0/fd00::2"]);
    assert_eq!(names(pick_interfaces(&rule(Some("lo"), Some(true)), &h).unwrap()), ["lo/::1"]);
    assert_eq!(names(pick_interfaces(&rule(Some("^eth"), None), &h).unwrap()), ["lo/127.0.0.1", "docker0/172.17.0.1"]);
    let many: Vec<(String, IpAddr)> = (0..40).map(|i| (format!("eth{i}"), IpAddr::from([10, 0, 0, i as u8]))).collect();
    assert_eq!(pick_interfaces(&rule(None, None), &many).unwrap().len(), MAX_IFS);
}

#[test]
fn an_ifname_matching_nothing_names_the_spec_and_the_interfaces() {
    let e = pick_interfaces(&rule(Some("=eth"), None), &ifs(HOST)).unwrap_err().to_string();
    assert!(e.contains("NCCL_SOCKET_IFNAME==eth matches no usable interface"), "{e}");
    assert!(e.contains("lo (127.0.0.1), lo (::1), docker0 (172.17.0.1), eth0 (192.0.2.2)"), "{e}");
    let e = pick_interfaces(&rule(Some("docker"), Some(true)), &ifs(HOST)).unwrap_err().to_string();
    assert!(e.contains("with NCCL_SOCKET_FAMILY=AF_INET6"), "{e}");
    let e = pick_interfaces(&rule(None, None), &[]).unwrap_err().to_string();
    assert!(e.contains("no usable network interface") && e.contains("up: none"), "{e}");
}

#[test]
fn handles_round_trip_and_foreign_ones_are_refused() {
    for a in ["127.0.0.1:4242", "[fd00::2]:65535"] {
        let addr: SocketAddr = a.parse().unwrap();
        assert_eq!(decode_handle(&encode_handle(77, addr)).unwrap(), (77, addr));
    }
    let mut h = encode_handle(1, "127.0.0.1:1".parse().unwrap());
    h[18] = 5;
    assert!(decode_handle(&h).unwrap_err().to_string().contains("unknown address family 5"));
    assert!(decode_handle(&[0; 128])
        .unwrap_err()
        .to_string()
        .contains("not one this version of the Socket net's listen made"));
}

#[test]
fn hellos_are_bounded() {
    let ok = Hello { nonce: 9, conn: 3, index: 2, nsocks: 4, nthreads: 2 };
    assert_eq!(Hello::decode(&ok.encode(), 9), Ok(ok));
    assert!(Hello::decode(&ok.encode(), 8).unwrap_err().contains("another listener"));
    let bad = |h: Hello| Hello::decode(&h.encode(), 9).unwrap_err();
    assert!(bad(Hello { nsocks: 65, nthreads: 1, ..ok }).contains("out of bounds"));
    assert!(bad(Hello { nsocks: 0, ..ok }).contains("out of bounds"));
    assert!(bad(Hello { nthreads: 17, nsocks: 64, ..ok }).contains("out of bounds"));
    assert!(bad(Hello { nthreads: 5, nsocks: 4, ..ok }).contains("out of bounds"));
    assert!(bad(Hello { index: 5, ..ok }).contains("socket index 5 of 4"));
    let mut garbage = ok.encode();
    garbage[0] ^= 1;
    assert!(Hello::decode(&garbage, 9).unwrap_err().contains("not a ferronickel net hello"));
}

#[test]
fn chunks_cover_the_message_once() {
    assert!(chunks(0, 8).is_empty() && chunks(MIN_CHUNK - 1, 8).is_empty());
    for (size, nsocks) in [
        (MIN_CHUNK, 8),
        (MIN_CHUNK + 1, 8),
        (3 * MIN_CHUNK - 1, 64),
        (64 << 20, 64),
        (64 << 20, 1),
        (1000003, 7),
        (5 << 30, 1),
        ((3 << 30) + 1, 2),
    ] {
        let c = chunks(size, nsocks);
        assert!(!c.is_empty() && c.len() <= nsocks.max(size.div_ceil(MAX_CHUNK)), "{size} over {nsocks}: {c:?}");
        assert!(c.iter().all(|x| x.1 <= MAX_CHUNK));
        assert_eq!(c.iter().map(|x| x.1).sum::<usize>(), size);
        let mut at = 0;
        for &(off, len) in &c {
            assert_eq!(off, at);
            assert!(len >= MIN_CHUNK || c.len() == 1 || off + len == size, "{size} over {nsocks}: {c:?}");
            at += len;
        }
    }
}

fn lo_net() -> SocketNet {
    SocketNet { ifs: vec![("lo".into(), Ipv4Addr::LOCALHOST.into())] }
}

/// Connects raw sockets to a listener with valid hellos: a peer that then misbehaves.
fn fake_sender(handle: &Handle, nsocks: u16) -> Vec<TcpStream> {
    let (nonce, addr) = decode_handle(handle).unwrap();
    (0..=nsocks)
        .map(|i| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&Hello { nonce, conn: 11, index: i, nsocks, nthreads: 1 }.encode()).unwrap();
            s
        })
        .collect()
}

/// A receive comm whose peer is [`fake_sender`]'s raw sockets (the control socket first).
fn faked_peer(nsocks: u16) -> (Vec<TcpStream>, Box<dyn RecvComm>) {
    let (handle, mut l) = lo_net().listen(0).unwrap();
    let socks = fake_sender(&handle, nsocks);
    (socks, accept_within(&mut *l, Duration::from_secs(10)))
}

fn accept_within(l: &mut dyn Listener, d: Duration) -> Box<dyn RecvComm> {
    let until = Instant::now() + d;
    loop {
        if let Some(r) = l.accept().unwrap() {
            return r;
        }
        assert!(Instant::now() < until, "no connection accepted within {d:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Both ends of a connection: `c` polled and `l` accepting until both are up (10 s at most).
fn both_ends(c: &mut dyn Connecting, l: &mut dyn Listener) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let until = Instant::now() + Duration::from_secs(10);
    let (mut s, mut r) = (None, None);
    while s.is_none() || r.is_none() {
        assert!(Instant::now() < until, "no connection within 10 s");
        s = s.or(c.poll().unwrap());
        r = r.or(l.accept().unwrap());
        std::thread::sleep(Duration::from_millis(1));
    }
    (s.unwrap(), r.unwrap())
}

fn failure(r: &mut dyn RecvComm, req: &Request) -> String {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match r.test(req) {
            Err(e) => return e.to_string(),
            Ok(Some(s)) => panic!("the receive completed ({s:?}) instead of failing"),
            Ok(None) => assert!(Instant::now() < until, "the receive neither failed nor completed in 10 s"),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn garbage_on_a_data_socket_is_an_error_naming_the_peer_and_socket() {
    let (mut socks, mut r) = faked_peer(2);
    let mut buf = vec![0u8; INLINE_MAX];
    let mr = r.reg_mr(buf.as_mut_ptr(), buf.len(), PtrKind::Host).unwrap();
    let posted = [RecvBuf { data: buf.as_mut_ptr(), size: buf.len(), tag: 5 }];
    // SAFETY: buf outlives r (dropped first, at the end of the scope, in reverse order).
    let req = unsafe { r.irecv(&posted, &[&mr]) }.unwrap().unwrap();
    socks[0].write_all(&msg_header(5, INLINE_MAX as u64, true)).unwrap();
    // The first chunk belongs on data socket 0 with sequence 0: send sequence 7 instead.
    socks[1].write_all(&chunk_header(7, MIN_CHUNK as u32, 0)).unwrap();
    socks[1].write_all(&vec![1u8; MIN_CHUNK]).unwrap();
    let e = failure(&mut *r, &req);
    assert!(e.contains("garbage on data socket 0 from 127.0.0.1:"), "{e}");
    // The comm stays failed.
    // SAFETY: refused before any buffer is touched.
    let again = unsafe { r.irecv(&posted, &[&mr]) };
    assert!(again.is_err());
    drop(r);
    drop(buf);
}

#[test]
fn a_message_larger_than_the_buffer_never_lands_past_it() {
    let (mut socks, mut r) = faked_peer(1);
    let mut buf = vec![0xA5u8; 1000];
    let mr = r.reg_mr(buf.as_mut_ptr(), 0, PtrKind::Host).unwrap();
    let posted = [RecvBuf { data: buf.as_mut_ptr(), size: 500, tag: 1 }];
    // SAFETY: buf outlives r.
    let req = unsafe { r.irecv(&posted, &[&mr]) }.unwrap().unwrap();
    socks[0].write_all(&msg_header(1, u64::MAX, true)).unwrap();
    let e = failure(&mut *r, &req);
    assert!(e.contains("sent 18446744073709551615 bytes (tag 1) to a receive buffer of 500 bytes"), "{e}");
    drop(r);
    assert!(buf.iter().all(|&b| b == 0xA5));
}

#[test]
fn a_slow_sender_trickling_bytes_is_received_intact() {
    let (mut socks, mut r) = faked_peer(1);
    let (small, big): (Vec<u8>, Vec<u8>) =
        ((0..300).map(|i| i as u8).collect(), (0..INLINE_MAX + 5).map(|i| (i * 7) as u8).collect());
    let (mut b1, mut b2) = (vec![0xA5u8; 400], vec![0xA5u8; INLINE_MAX + 100]);
    let mr = r.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();
    let posted = [
        RecvBuf { data: b1.as_mut_ptr(), size: b1.len(), tag: 3 },
        RecvBuf { data: b2.as_mut_ptr(), size: b2.len(), tag: 4 },
    ];
    // SAFETY: b1 and b2 outlive r.
    let req = unsafe { r.irecv(&posted, &[&mr, &mr]) }.unwrap().unwrap();
    // Tag 4 (chunked) first, then tag 3 (inline), every piece a few bytes apart in time.
    let mut ctrl = msg_header(4, big.len() as u64, true).to_vec();
    ctrl.extend(msg_header(3, small.len() as u64, false));
    ctrl.extend(&small);
    let mut data = chunk_header(0, big.len() as u32, 0).to_vec();
    data.extend(&big);
    let (mut c, mut d) = (socks.remove(0), socks.remove(0));
    let writer = std::thread::spawn(move || {
        for piece in ctrl.chunks(7) {
            c.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_micros(300));
        }
        for piece in data.chunks(4099) {
            d.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_micros(300));
        }
        (c, d)
    });
    let until = Instant::now() + Duration::from_secs(20);
    let got = loop {
        if let Some(g) = r.test(&req).unwrap() {
            break g;
        }
        assert!(Instant::now() < until, "the trickled receive did not complete in 20 s");
        std::thread::sleep(Duration::from_micros(200));
    };
    let _keep_open = writer.join().unwrap();
    assert_eq!(got, [small.len(), big.len()]);
    assert_eq!(&b1[..300], &small[..]);
    assert!(b1[300..].iter().all(|&x| x == 0xA5));
    assert_eq!(&b2[..big.len()], &big[..]);
    assert!(b2[big.len()..].iter().all(|&x| x == 0xA5));
    drop(r);
}

#[test]
fn every_message_goes_inline_where_the_helpers_have_fewer_than_three_cpus() {
    assert_eq!(inline_cut(0, Some(2)), usize::MAX);
    assert_eq!(inline_cut(0, Some(1)), usize::MAX);
    assert_eq!(inline_cut(0, Some(3)), INLINE_MAX);
    assert_eq!(inline_cut(0, None), INLINE_MAX, "CPUs unknown: the cut");
    assert_eq!(inline_cut(1 << 20, Some(2)), 1 << 20, "a setting wins");
    assert_eq!(inline_cut(5, Some(64)), MIN_CHUNK, "never below a chunk");
    assert_eq!(inline_cut(-1, Some(64)), INLINE_MAX);
}

#[test]
fn message_headers_say_how_the_bytes_come_and_bad_ones_are_refused() {
    for (tag, size, chunked) in [(-3, 0, false), (7, (INLINE_MAX * 9) as u64, false), (1, MIN_CHUNK as u64, true)] {
        assert_eq!(parse_msg_header(&msg_header(tag, size, chunked)), Ok((tag, size, chunked)));
    }
    let short = parse_msg_header(&msg_header(2, MIN_CHUNK as u64 - 1, true)).unwrap_err();
    assert!(short.contains("announced in chunks, below the"), "{short}");
    let mut h = msg_header(2, 10, false);
    h[5] = 0x80;
    assert!(parse_msg_header(&h).unwrap_err().contains("unknown flags 0x8000"));
}

/// The receiver follows the sender's cut: a message of several INLINE_MAX inline on the control
/// socket, then one chunked; a header with unknown flags then fails the comm, naming the peer.
#[test]
fn the_header_says_whether_a_message_is_inline_or_in_chunks() {
    let (mut socks, mut r) = faked_peer(1);
    let big: Vec<u8> = (0..3 * INLINE_MAX + 11).map(|i| (i * 13 % 251) as u8).collect();
    let mut got = vec![0xA5u8; big.len() + 64];
    let mr = r.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();
    let mut receive = |chunked: bool, buf: &mut [u8]| {
        let posted = [RecvBuf { data: buf.as_mut_ptr(), size: buf.len(), tag: 9 }];
        // SAFETY: buf outlives the request, which completes or fails before this returns.
        let req = unsafe { r.irecv(&posted, &[&mr]) }.unwrap().unwrap();
        // Written from a thread: the message is larger than the socket buffers may hold.
        let (mut ss, bytes) = (std::mem::take(&mut socks), big.clone());
        let writer = std::thread::spawn(move || {
            ss[0].write_all(&msg_header(9, bytes.len() as u64, chunked)).unwrap();
            let on = usize::from(chunked);
            if chunked {
                ss[1].write_all(&chunk_header(0, bytes.len() as u32, 0)).unwrap();
            }
            ss[on].write_all(&bytes).unwrap();
            ss
        });
        let until = Instant::now() + Duration::from_secs(20);
        let g = loop {
            if let Some(g) = r.test(&req).unwrap() {
                break g;
            }
            assert!(Instant::now() < until, "the receive did not complete in 20 s");
        };
        socks = writer.join().unwrap();
        g
    };
    for chunked in [false, true] {
        got.fill(0xA5);
        assert_eq!(receive(chunked, &mut got), [big.len()], "chunked: {chunked}");
        assert_eq!(&got[..big.len()], &big[..], "chunked: {chunked}");
        assert!(got[big.len()..].iter().all(|&x| x == 0xA5));
    }
    let posted = [RecvBuf { data: got.as_mut_ptr(), size: got.len(), tag: 9 }];
    // SAFETY: got outlives r.
    let req = unsafe { r.irecv(&posted, &[&mr]) }.unwrap().unwrap();
    let mut h = msg_header(9, 100, false);
    h[4] = 2;
    socks[0].write_all(&h).unwrap();
    let e = failure(&mut *r, &req);
    assert!(e.contains("127.0.0.1:") && e.contains("unknown flags 0x2"), "{e}");
    drop(r);
}

#[test]
fn a_receiver_that_goes_away_fails_the_pending_send_naming_it() {
    let net = lo_net();
    let (handle, mut l) = net.listen(0).unwrap();
    let mut c = net.connect(0, &handle).unwrap();
    let (mut s, r) = both_ends(&mut *c, &mut *l);
    let data = vec![3u8; 64 << 20];
    let mr = s.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();
    // SAFETY: data outlives s.
    let req = unsafe { s.isend(data.as_ptr(), data.len(), 1, &mr) }.unwrap().unwrap();
    drop(r);
    let until = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match s.test(&req) {
            Err(e) => break e.to_string(),
            Ok(Some(n)) => panic!("{n} bytes sent to a closed receiver"),
            Ok(None) => assert!(Instant::now() < until, "the send neither failed nor completed in 10 s"),
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(e.contains("connection with 127.0.0.1:") || e.contains("connection to 127.0.0.1:"), "{e}");
    drop(s);
}

#[test]
fn connecting_to_a_closed_listener_fails_naming_the_address() {
    let net = lo_net();
    let (handle, l) = net.listen(0).unwrap();
    let (_, addr) = decode_handle(&handle).unwrap();
    drop(l);
    let mut c = net.connect(0, &handle).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match c.poll() {
            Err(e) => break e.to_string(),
            Ok(Some(_)) => panic!("connected to a closed listener"),
            Ok(None) => assert!(Instant::now() < until, "no verdict within 10 s"),
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(e.contains(&format!("cannot connect to {addr}")), "{e}");
}

#[test]
fn strangers_on_the_listen_port_are_dropped_and_honest_peers_connect() {
    let net = lo_net();
    let (handle, mut l) = net.listen(0).unwrap();
    let (_, addr) = decode_handle(&handle).unwrap();
    let mut stranger = TcpStream::connect(addr).unwrap();
    stranger.write_all(&[0x42; HELLO_BYTES]).unwrap();
    let mut forged = TcpStream::connect(addr).unwrap();
    forged.write_all(&Hello { nonce: 1, conn: 2, index: 0, nsocks: 1, nthreads: 1 }.encode()).unwrap();
    let silent = TcpStream::connect(addr).unwrap();
    let mut c = net.connect(0, &handle).unwrap();
    let _honest = both_ends(&mut *c, &mut *l);
    for mut bad in [stranger, forged] {
        bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(bad.read(&mut [0u8; 8]).unwrap(), 0, "a stranger's connection was kept");
    }
    drop(silent);
}

#[test]
fn cuda_memory_and_bad_arguments_are_refused() {
    let net = lo_net();
    assert!(net.properties(1).is_err() && net.listen(3).is_err());
    let (handle, mut l) = net.listen(0).unwrap();
    let _socks = fake_sender(&handle, 1);
    let mut r = accept_within(&mut *l, Duration::from_secs(10));
    assert!(r.reg_mr(std::ptr::null_mut(), 0, PtrKind::Cuda).unwrap_err().to_string().contains("host memory only"));
    let mr = r.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();
    let null = RecvBuf { data: std::ptr::null_mut(), size: 8, tag: 0 };
    // SAFETY: refused before any buffer is touched.
    assert!(unsafe { r.irecv(&[null], &[&mr]) }.unwrap_err().to_string().contains("NULL buffer"));
    let empty = RecvBuf { data: std::ptr::null_mut(), size: 0, tag: 0 };
    let nine = [empty; MAX_RECVS + 1];
    let mrs = [&mr; MAX_RECVS + 1];
    // SAFETY: as above.
    assert!(unsafe { r.irecv(&nine, &mrs) }.unwrap_err().to_string().contains("the net takes 1 to 8"));
    assert!(r.test(&Request(0x1234)).unwrap_err().to_string().contains("not in flight"));
    // 32 receives fit, the 33rd waits for a free slot.
    // SAFETY: empty buffers: nothing is ever written.
    let reqs: Vec<_> =
        (0..MAX_REQUESTS).map(|_| unsafe { r.irecv(&[empty], &[&mr]) }.unwrap().expect("a slot")).collect();
    // SAFETY: as above.
    assert!(unsafe { r.irecv(&[empty], &[&mr]) }.unwrap().is_none());
    drop(reqs);
}

/// Whether Linux would acknowledge the next small segment on `fd` at once (quick-ACK mode)
/// rather than with a later one (delayed-ACK mode).
fn quick_acks(fd: std::os::fd::RawFd) -> bool {
    let mut v: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are valid for writes of the sizes given, for the call.
    let rc = unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_QUICKACK, (&mut v as *mut libc::c_int).cast(), &mut len)
    };
    assert_eq!(rc, 0, "getsockopt(TCP_QUICKACK): {}", std::io::Error::last_os_error());
    v != 0
}

/// A connected pair on loopback: a blocking sender and a non-blocking receiver, as the control
/// socket's reader has it.
fn loopback_pair() -> (TcpStream, TcpStream) {
    let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (rx, _) = l.accept().unwrap();
    rx.set_nonblocking(true).unwrap();
    (tx, rx)
}

/// The control socket's reader keeps the socket in delayed-ACK mode once bytes came in, so a
/// read that empties it does not also send an ACK of its own for each small message.
#[test]
fn reading_the_control_socket_delays_its_acks() {
    let (mut tx, rx) = loopback_pair();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&rx);
    assert!(quick_acks(fd), "a fresh connection acknowledges at once");
    let mut ahead = super::recv::ReadAhead::new();
    let mut got = [0u8; 8];
    assert_eq!(ahead.read(fd, &mut got).unwrap(), None, "nothing sent yet");
    assert!(quick_acks(fd), "a read that got nothing changes nothing");
    tx.write_all(b"12345678").unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let n = loop {
        if let Some(n) = ahead.read(fd, &mut got).unwrap() {
            break n;
        }
        assert!(Instant::now() < end, "8 bytes on loopback never arrived");
        std::thread::yield_now();
    };
    assert_eq!(&got[..n], &b"12345678"[..n]);
    assert!(!quick_acks(fd), "after bytes came in, ACKs are delayed");
}

/// Bytes in `fd`'s receive queue, read or peeked alike.
fn queued(fd: std::os::fd::RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the pointer given.
    assert_eq!(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) }, 0);
    n as usize
}

/// Reads `want` bytes through the read-ahead, waiting for them up to 10 s.
fn read_all(ahead: &mut super::recv::ReadAhead, fd: std::os::fd::RawFd, want: usize) -> Vec<u8> {
    let mut out = vec![0u8; want];
    let (mut got, end) = (0, Instant::now() + Duration::from_secs(10));
    while got < want {
        match ahead.read(fd, &mut out[got..]).unwrap() {
            Some(0) => panic!("end of stream after {got} of {want} bytes"),
            Some(n) => got += n,
            None => assert!(Instant::now() < end, "{got} of {want} bytes arrived"),
        }
    }
    out
}

/// The read-ahead peeks: what it hands out stays in the socket until a later look takes it off
/// (a while later, or after a second arrival); a large read takes the peeked bytes off in the same
/// call. Every byte comes out once, in order.
#[test]
fn the_control_socket_is_peeked_and_each_byte_read_once() {
    let (mut tx, rx) = loopback_pair();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&rx);
    let mut ahead = super::recv::ReadAhead::new();
    let bytes: Vec<u8> = (0..30_000u32).map(|i| (i * 7 + i / 251) as u8).collect();

    tx.write_all(&bytes[..52]).unwrap();
    assert_eq!(read_all(&mut ahead, fd, 20), bytes[..20]);
    assert_eq!(queued(fd), 52, "handed out but still in the socket (peeked)");
    assert_eq!(read_all(&mut ahead, fd, 32), bytes[20..52]);
    assert_eq!(queued(fd), 52, "the peeked bytes are taken off at a later look");
    let mut none = [0u8; 4];
    std::thread::sleep(Duration::from_millis(1));
    assert_eq!(ahead.read(fd, &mut none).unwrap(), None, "nothing new");
    assert_eq!(queued(fd), 0, "a look a while later took the peeked bytes off");

    // Bytes that come in while earlier ones may still be peeked: a look hands out only the new
    // ones, and a later one takes everything off.
    tx.write_all(&bytes[..10]).unwrap();
    assert_eq!(read_all(&mut ahead, fd, 10), bytes[..10]);
    tx.write_all(&bytes[10..30]).unwrap();
    assert_eq!(read_all(&mut ahead, fd, 20), bytes[10..30]);
    std::thread::sleep(Duration::from_millis(1));
    assert_eq!(ahead.read(fd, &mut none).unwrap(), None, "nothing new");
    assert_eq!(queued(fd), 0, "a look a while later took the peeked bytes off");

    // A small header, then an inline payload larger than the read-ahead: its first part comes
    // from the peek, the rest straight from the socket together with the peeked bytes.
    tx.write_all(&bytes[52..30_000]).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while queued(fd) < 30_000 - 52 {
        assert!(Instant::now() < end, "the payload never arrived whole");
        std::thread::yield_now();
    }
    assert_eq!(read_all(&mut ahead, fd, 16), bytes[52..68]);
    assert_eq!(read_all(&mut ahead, fd, 30_000 - 68), bytes[68..30_000]);
    assert_eq!(queued(fd), 0, "nothing left behind in the socket");
    assert_eq!(ahead.read(fd, &mut none).unwrap(), None);
}

/// Fresh bytes for each run: an xorshift seeded from the clock.
fn random_fill(buf: &mut [u8]) {
    let mut x = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64) | 1;
    for b in buf {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// The two ends of a connection.
type Ends = (Box<dyn SendComm>, Box<dyn RecvComm>);

/// Sends `out[i]` over pair `i`, all at once, into poisoned buffers; returns what landed.
fn exchange(pairs: &mut [Ends], out: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut got: Vec<Vec<u8>> = out.iter().map(|o| vec![0xA5u8; o.len() + 64]).collect();
    let mut reqs = Vec::new();
    for ((s, r), (o, g)) in pairs.iter_mut().zip(out.iter().zip(got.iter_mut())) {
        let (smr, rmr) = (
            s.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap(),
            r.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap(),
        );
        let posted = [RecvBuf { data: g.as_mut_ptr(), size: g.len(), tag: 9 }];
        // SAFETY: `out` and `got` outlive the requests, which complete below.
        let rq = unsafe { r.irecv(&posted, &[&rmr]) }.unwrap().unwrap();
        // SAFETY: as above.
        let sq = unsafe { s.isend(o.as_ptr(), o.len(), 9, &smr) }.unwrap().unwrap();
        reqs.push((Some(sq), Some(rq)));
    }
    let until = Instant::now() + Duration::from_secs(20);
    while reqs.iter().any(|(s, r)| s.is_some() || r.is_some()) {
        assert!(Instant::now() < until, "the exchanges did not complete in 20 s");
        for ((s, r), (sq, rq)) in pairs.iter_mut().zip(reqs.iter_mut()) {
            if sq.as_ref().is_some_and(|q| s.test(q).unwrap().is_some()) {
                *sq = None;
            }
            if let Some(n) = rq.as_ref().and_then(|q| r.test(q).unwrap()) {
                assert_eq!(n.len(), 1);
                *rq = None;
            }
        }
    }
    got
}

/// The process's helpers serve every connection's data sockets: more sockets than helpers all
/// land their chunks intact, and a connection closed while its chunks are moving lets the
/// others go on.
#[test]
fn connections_share_the_helpers_and_one_closing_mid_message_stops_none_of_the_others() {
    let net = lo_net();
    let mut pairs: Vec<_> = (0..4)
        .map(|_| {
            let (handle, mut l) = net.listen(0).unwrap();
            let mut c = net.connect(0, &handle).unwrap();
            both_ends(&mut *c, &mut *l)
        })
        .collect();
    assert!(2 * pairs.len() > socket_helpers() as usize, "more data sockets than helpers");
    let out: Vec<Vec<u8>> = (0..pairs.len())
        .map(|i| {
            let mut v = vec![0u8; INLINE_MAX * 3 + 1000 * i];
            random_fill(&mut v);
            v
        })
        .collect();
    let check = |got: &[Vec<u8>], out: &[Vec<u8>]| {
        for (g, o) in got.iter().zip(out) {
            assert!(g[..o.len()] == o[..], "a message landed changed");
            assert!(g[o.len()..].iter().all(|&b| b == 0xA5), "a message landed past its end");
        }
    };
    check(&exchange(&mut pairs, &out), &out);
    // A 64 MB send still moving when both of its ends close.
    let (mut s, r) = pairs.pop().unwrap();
    let big = vec![7u8; 64 << 20];
    let mr = s.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();
    // SAFETY: big outlives s, dropped below.
    let req = unsafe { s.isend(big.as_ptr(), big.len(), 1, &mr) }.unwrap().unwrap();
    assert!(s.test(&req).unwrap().is_none());
    drop(r);
    drop(s);
    let out = &out[..pairs.len()];
    check(&exchange(&mut pairs, out), out);
}
