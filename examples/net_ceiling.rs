//! The ceiling under the NET transport's bandwidth on this machine, without a GPU: two ranks in
//! threads of one process, connected as a communicator of two hosts would be (same net, same
//! sockets, `NCCL_SOCKET_*` settings apply), moving full Simple slots both ways at once on
//! every channel for a few seconds, as a two-rank all-reduce does.
//!
//! The bytes go through `NetTransport` and the proxy thread, with threads playing the kernels but
//! touching no data: what is measured is proxy + net + sockets, not the kernels' copies in and
//! out of the host FIFOs.
//!
//! Then the one-way latency of a step: 16-byte LL steps (untailed, as the kernels send them over
//! NET), the same step sent both ways at once (a two-rank all-gather's hop, where each proxy
//! also sends while its peer's step comes in), and Simple steps from 16 KiB to the slot's size,
//! ping-ponged on channel 0 (what the proxies and the net add to a message, without a GPU's
//! launch or PCIe polls); last, Simple steps from 64 KiB on every channel at once, as a mid-size
//! collective's round (where one proxy thread moving every channel's bytes in turn shows, against
//! helpers moving them side by side).
//!
//! With a gap G (ms) given, also the LL step's one-way latency after G ms idle: both proxies are
//! woken at the start of the gap, as a launch wakes them when its kernel waits behind G ms of
//! compute, and the step is posted at its end (what a hop costs after an idle spell).
//!
//! usage: cargo run --release --example net_ceiling [channels (8)] [seconds (3)] [slot KiB (512)] [gap ms (0: none)]
//! Prints one line per direction and rank with GB/s, then the latency lines; `scripts/net_bench.sh`
//! runs it.

use nccl::bootstrap::{new_unique_id, Bootstrap};
use nccl::transport::net::conn::{NetTransport, Setup};
use nccl::transport::net::proxy::{HostBlock, Layout, RECV_HEAD, RECV_TAIL, SEND_HEAD, SEND_SIZES, SEND_TAIL};
use nccl::transport::net::{MemHandle, Net, NetConfig, PtrKind, RecvBuf, RecvComm, SendComm};
use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const NSTEPS: u64 = 8;
const LL: u32 = 0;
const SIMPLE: u32 = 2;
/// Round trips the latency phase times.
const PINGS: u64 = 2000;
const PROTO_SHIFT: u32 = 30;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("numbers")).collect();
    let channels = args.first().copied().unwrap_or(8);
    let secs = args.get(1).copied().unwrap_or(3) as u64;
    let slot = args.get(2).copied().unwrap_or(512) << 10;
    let gap = Duration::from_millis(args.get(3).copied().unwrap_or(0) as u64);
    let id = new_unique_id().expect("unique id");
    let net = nccl::transport::net::init(&NetConfig::default()).expect("the net");
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let net = net.clone();
            thread::spawn(move || {
                let bs = Bootstrap::init(&id, r, 2, Duration::from_secs(30)).expect("bootstrap");
                let setup = Setup {
                    dev: -1 - r as i32, // a proxy per rank, as two processes have
                    fifo_bytes: slot * NSTEPS as usize,
                    names: vec!["rank 0".into(), "rank 1".into()],
                    fault: Arc::new(|m| eprintln!("net_ceiling: {m}")),
                    timeout: Duration::from_secs(30),
                    net,
                    profiler: None,
                    cpus: None,
                    machine_ranks: 2,
                    net_peers: 1,
                };
                let conns: Vec<_> = (0..channels).map(|ch| (1 - r, ch)).collect();
                let t = NetTransport::connect(&bs, &conns, &setup, &HostBlock::plain).expect("connect");
                bs.barrier().expect("barrier");
                (bs, t)
            })
        })
        .collect();
    let ranks: Vec<_> = ranks.into_iter().map(|h| h.join().expect("rank thread")).collect();
    // Senders stop at the deadline; receivers go on until every step sent has landed, so the
    // connections close idle (a close mid-message would be reported as a fault).
    let (stop_send, stop_recv) = (AtomicBool::new(false), AtomicBool::new(false));
    let start = Instant::now();
    let mut dt = 0.0;
    let moved: Vec<(usize, &str, u64)> = thread::scope(|sc| {
        let (mut senders, mut receivers) = (Vec::new(), Vec::new());
        // One thread per rank and direction serves every channel, as few cores as a GPU's
        // kernels take from the host (none), not one per channel competing with the proxy.
        for (r, (_, t)) in ranks.iter().enumerate() {
            let l = t.layout();
            let blocks: Vec<_> = (0..channels).map(|ch| t.block(1 - r, ch).expect("connection").clone()).collect();
            let (b, stop) = (blocks.clone(), &stop_send);
            senders.push(sc.spawn(move || (r, "send", sender(&b, l, stop))));
            let stop = &stop_recv;
            receivers.push(sc.spawn(move || (r, "recv", receiver(&blocks, l.stride(SIMPLE) as u64, stop))));
        }
        thread::sleep(Duration::from_secs(secs));
        stop_send.store(true, Ordering::Relaxed);
        dt = start.elapsed().as_secs_f64();
        let mut out: Vec<_> = senders.into_iter().map(|h| h.join().expect("sender")).collect();
        let drained = |r: usize, ch: usize| {
            let (mine, theirs) = (ranks[r].1.block(1 - r, ch).unwrap(), ranks[1 - r].1.block(r, ch).unwrap());
            mine.load_u64(RECV_TAIL) == theirs.load_u64(SEND_TAIL)
        };
        let end = Instant::now() + Duration::from_secs(10);
        while !(0..2).all(|r| (0..channels).all(|ch| drained(r, ch))) && Instant::now() < end {
            thread::sleep(Duration::from_millis(1));
        }
        stop_recv.store(true, Ordering::Relaxed);
        out.extend(receivers.into_iter().map(|h| h.join().expect("receiver")));
        out
    });
    // The latency steps use channel 0 alone, as small messages do: the others have gone quiet
    // first, as they are during a run of small collectives (the proxy then polls them less).
    thread::sleep(Duration::from_millis(300));
    let one_way = latency(&ranks, LL, 16, 1, None);
    let both_ways = latency(&ranks, LL, 16, 1, Some(Pace::Exchange));
    for (r, (_, t)) in ranks.iter().enumerate() {
        for dir in ["send", "recv"] {
            let bytes: u64 = moved.iter().filter(|m| m.0 == r && m.1 == dir).map(|m| m.2).sum();
            println!(
                "net_ceiling: rank {r} {dir}: {:.2} GB/s over {channels} channels ({} KiB slots, {:.1} s, net {})",
                bytes as f64 / dt / 1e9,
                slot >> 10,
                dt,
                t.net_name
            );
        }
    }
    println!("net_ceiling: one-way latency of a 16-byte LL step: {one_way}");
    println!("net_ceiling: a 16-byte LL step each way at once (a two-rank all-gather's hop): {both_ways}");
    if !gap.is_zero() {
        let after = latency(&ranks, LL, 16, 1, Some(Pace::Idle { gap, one_way: one_way.p50 }));
        println!("net_ceiling: one-way latency of a 16-byte LL step after {} ms idle: {after}", gap.as_millis());
    }
    println!("net_ceiling: one-way latency of its messages over the net, no proxy: {}", net_direct(&*net));
    println!(
        "net_ceiling: one-way latency of its {BARE_BYTES} bytes over bare TCP, a socket each way: {}",
        bare_tcp(true)
    );
    println!("net_ceiling: one-way latency of its {BARE_BYTES} bytes over bare TCP, one socket: {}", bare_tcp(false));
    let simple_max = ranks[0].1.layout().stride(SIMPLE);
    for bytes in (14..).map(|b| 1usize << b).take_while(|&b| b <= simple_max) {
        let one_way = latency(&ranks, SIMPLE, bytes as u32, 1, None);
        println!("net_ceiling: one-way latency of a {} KiB Simple step: {one_way}", bytes >> 10);
    }
    // A mid-size collective's round: a step on every channel at once (3-4 channels of 128-255
    // KiB steps carry the 512 KB-2 MB collectives over two hosts).
    for bytes in (14..).map(|b| 1usize << b).take_while(|&b| b <= simple_max).filter(|&b| b >= 64 << 10) {
        let round = latency(&ranks, SIMPLE, bytes as u32, channels, None);
        println!(
            "net_ceiling: one-way latency of {} KiB Simple steps on all {channels} channels at once: {round}",
            bytes >> 10
        );
    }
}

/// One-way latency of a step of `proto` and `bytes` on each of the first `nch` channels at once
/// (a ping has landed when every channel's step has), from ping-pongs between the two ranks'
/// threads (the connections are idle and drained when this starts). LL steps go as the
/// kernels send them over NET: lines carrying the step's flag and the size word, no tail; the
/// receiver polls the lines' flags. Other protocols publish a tail. With [`Pace::Idle`], each
/// ping follows its gap of idleness that began with a wake-up of both proxies, and its time is
/// its round trip less the one way back to back (the pong comes straight back, proxies awake).
/// With [`Pace::Exchange`] both ranks post step k and then await the other's, and a ping's time
/// is rank 0's post to its landing: a hop while the same proxies also send.
fn latency(ranks: &[(Bootstrap, NetTransport)], proto: u32, bytes: u32, nch: usize, pace: Option<Pace>) -> Spread {
    // Each channel with the step count it goes on from: every step so far published a tail.
    let conns = |r: usize| -> Vec<(Arc<HostBlock>, u64)> {
        (0..nch)
            .map(|ch| {
                let b = ranks[r].1.block(1 - r, ch).expect("a channel's connection").clone();
                let base = b.load_u64(SEND_TAIL);
                (b, base)
            })
            .collect()
    };
    let (c0, c1) = (conns(0), conns(1));
    let l = ranks[0].1.layout();
    let lines = bytes as usize / 16;
    let slot_at = |fifo: usize, s: u64| fifo + (s % NSTEPS) as usize * l.stride(proto);
    let post_one = |b: &HostBlock, s: u64| {
        if proto == LL {
            let at = slot_at(l.send_fifo(LL), s);
            for i in 0..lines {
                for (off, v) in [(0, i as u32), (4, s as u32 + 1), (8, 0), (12, s as u32 + 1)] {
                    b.store_u32(at + 16 * i + off, v);
                }
            }
        }
        b.store_u32(SEND_SIZES + 4 * (s % NSTEPS) as usize, bytes | proto << PROTO_SHIFT);
        if proto != LL {
            fence(Ordering::SeqCst);
            b.store_u64(SEND_TAIL, s + 1);
        }
    };
    let take_one = |b: &HostBlock, s: u64| {
        let at = slot_at(l.recv_fifo(LL), s);
        let arrived = || match proto {
            LL => (0..lines)
                .all(|i| b.load_u32(at + 16 * i + 4) == s as u32 + 1 && b.load_u32(at + 16 * i + 12) == s as u32 + 1),
            _ => b.load_u64(RECV_TAIL) > s,
        };
        let end = Instant::now() + Duration::from_secs(10);
        while !arrived() {
            assert!(Instant::now() < end, "net_ceiling: a ping was lost");
            thread::yield_now();
        }
        b.store_u64(RECV_HEAD, s + 1);
    };
    // Ping k: step k of every channel (counted from the peer's base where it is received), all
    // posted before any is awaited, as a kernel's channels do.
    let post = |mine: &[(Arc<HostBlock>, u64)], k: u64| mine.iter().for_each(|(b, base)| post_one(b, base + k));
    let take = |mine: &[(Arc<HostBlock>, u64)], theirs: &[(Arc<HostBlock>, u64)], k: u64| {
        mine.iter().zip(theirs).for_each(|((b, _), (_, base))| take_one(b, base + k))
    };
    // After a gap, fewer pings: each costs the gap.
    let idle = matches!(pace, Some(Pace::Idle { .. }));
    let pings = if idle { PINGS / 10 } else { PINGS };
    let exchange = matches!(pace, Some(Pace::Exchange));
    let wakers = [ranks[0].1.proxy_waker(), ranks[1].1.proxy_waker()];
    let mut trips = Vec::with_capacity(pings as usize);
    thread::scope(|sc| {
        sc.spawn(|| {
            for k in 0..pings {
                if exchange {
                    post(&c1, k);
                    take(&c1, &c0, k);
                } else {
                    take(&c1, &c0, k);
                    post(&c1, k);
                }
            }
        });
        for k in 0..pings {
            if let Some(Pace::Idle { gap, .. }) = &pace {
                wakers.iter().for_each(|w| w.wake(1, 0, true, true, u64::MAX));
                thread::sleep(*gap);
            }
            let t = Instant::now();
            post(&c0, k);
            take(&c0, &c1, k);
            trips.push(match &pace {
                None => t.elapsed() / 2,
                Some(Pace::Exchange) => t.elapsed(),
                Some(Pace::Idle { one_way, .. }) => t.elapsed().saturating_sub(*one_way),
            });
        }
    });
    // The next phase counts its steps from the tails (a tail only ever says how many steps there are).
    for (b, base) in c0.iter().chain(&c1) {
        b.store_u64(SEND_TAIL, base + pings);
    }
    Spread::of(trips)
}

/// How [`latency`]'s pings go, beside back-to-back ping-pongs.
enum Pace {
    /// After an idle spell: the gap, and the one-way time back to back that its round trip's
    /// pong takes.
    Idle { gap: Duration, one_way: Duration },
    /// Both ranks send each step at once.
    Exchange,
}

/// Half round trips of the pings: what one way takes, at the median, the 99th percentile and
/// the worst.
struct Spread {
    p50: Duration,
    p99: Duration,
    max: Duration,
    trips: usize,
}

impl Spread {
    fn of(mut trips: Vec<Duration>) -> Spread {
        trips.sort();
        let at = |q: f64| trips[((trips.len() - 1) as f64 * q).round() as usize];
        Spread { p50: at(0.5), p99: at(0.99), max: at(1.0), trips: trips.len() }
    }
}

/// What a 16-byte LL step puts on the Socket net's control socket: the size word's 16-byte
/// header and 4 bytes, the lines' header and 16 bytes.
const BARE_BYTES: usize = 52;

/// The floor under the LL step's latency on this machine: its bytes ping-ponged between two
/// threads over bare TCP on loopback, each spinning on non-blocking reads (yielding between them,
/// as the proxy thread does), with no proxy, net or host block in between. On one connection both
/// ways (`separate` false), or on one per direction, as a NET connection's two comms are.
fn bare_tcp(separate: bool) -> Spread {
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
    let addr = listener.local_addr().expect("its address");
    let open = |s: TcpStream| {
        s.set_nodelay(true).expect("TCP_NODELAY");
        s.set_nonblocking(true).expect("non-blocking");
        s
    };
    let pair = || (open(TcpStream::connect(addr).expect("connect")), open(listener.accept().expect("accept").0));
    let (mut a_out, mut b_in) = pair();
    let (mut b_out, mut a_in) = match separate {
        true => pair(),
        false => (b_in.try_clone().expect("a second handle"), a_out.try_clone().expect("a second handle")),
    };
    let mut trips = Vec::with_capacity(PINGS as usize);
    thread::scope(|sc| {
        sc.spawn(move || {
            let mut buf = [0u8; BARE_BYTES];
            for _ in 0..PINGS {
                spin_read(&mut b_in, &mut buf);
                b_out.write_all(&buf).expect("a bare answer");
            }
        });
        let mut buf = [1u8; BARE_BYTES];
        for _ in 0..PINGS {
            let t = Instant::now();
            a_out.write_all(&buf).expect("a bare ping");
            spin_read(&mut a_in, &mut buf);
            trips.push(t.elapsed() / 2);
        }
    });
    Spread::of(trips)
}

/// The LL step's messages over the net's comms, driven by the two threads themselves as the
/// proxy drives them (the size word, then the 16 bytes; the receiver posts the data's receive
/// once the word has landed), without a proxy thread or a host block: what the net adds to the
/// bare socket, and what the proxy adds to the net.
fn net_direct(net: &dyn Net) -> Spread {
    let listen = || net.listen(0).expect("listen");
    let ((ha, mut la), (hb, mut lb)) = (listen(), listen());
    let (mut ca, mut cb) = (net.connect(0, &hb).expect("connect"), net.connect(0, &ha).expect("connect"));
    let end = Instant::now() + Duration::from_secs(30);
    let (mut ends_a, mut ends_b): (Ends, Ends) = ((None, None), (None, None));
    while ends_a.0.is_none() || ends_a.1.is_none() || ends_b.0.is_none() || ends_b.1.is_none() {
        assert!(Instant::now() < end, "net_ceiling: the direct comms never connected");
        for (c, slot) in [(&mut ca, &mut ends_a.0), (&mut cb, &mut ends_b.0)] {
            if slot.is_none() {
                *slot = c.poll().expect("connecting");
            }
        }
        for (l, slot) in [(&mut la, &mut ends_a.1), (&mut lb, &mut ends_b.1)] {
            if slot.is_none() {
                *slot = l.accept().expect("accepting");
            }
        }
    }
    let (mut a, mut b) = (Direct::new(ends_a), Direct::new(ends_b));
    let mut trips = Vec::with_capacity(PINGS as usize);
    thread::scope(|sc| {
        sc.spawn(move || {
            for _ in 0..PINGS {
                b.take();
                b.post();
            }
        });
        for _ in 0..PINGS {
            let t = Instant::now();
            a.post();
            a.take();
            trips.push(t.elapsed() / 2);
        }
    });
    Spread::of(trips)
}

/// One thread's end of [`net_direct`]: its comms and the step's size word and bytes.
struct Direct {
    send: Box<dyn SendComm>,
    recv: Box<dyn RecvComm>,
    /// The size word and 16 bytes of data, sent from and received into.
    buf: Box<[u8; 20]>,
    smr: MemHandle,
    rmr: MemHandle,
}

/// A thread's two comms as they connect: the send comm, the receive comm.
type Ends = (Option<Box<dyn SendComm>>, Option<Box<dyn RecvComm>>);

impl Direct {
    fn new(ends: Ends) -> Direct {
        let (mut send, mut recv) = (ends.0.expect("connected"), ends.1.expect("accepted"));
        let mut buf = Box::new([0u8; 20]);
        let smr = send.reg_mr(buf.as_mut_ptr(), 20, PtrKind::Host).expect("reg_mr");
        let rmr = recv.reg_mr(buf.as_mut_ptr(), 20, PtrKind::Host).expect("reg_mr");
        Direct { send, recv, buf, smr, rmr }
    }

    fn post(&mut self) {
        let p = self.buf.as_ptr();
        // SAFETY: `buf` stays put and unchanged until both sends complete below.
        let reqs = [(p, 4, 1), (p.wrapping_add(4), 16, 2)]
            .map(|(at, n, tag)| unsafe { self.send.isend(at, n, tag, &self.smr) }.expect("isend").expect("a request"));
        for r in reqs {
            spin(|| self.send.test(&r).expect("send test").is_some());
        }
    }

    fn take(&mut self) {
        let p = self.buf.as_mut_ptr();
        for (at, size, tag) in [(p, 4, 1), (p.wrapping_add(4), 16, 2)] {
            let b = [RecvBuf { data: at, size, tag }];
            // SAFETY: `buf` stays put and untouched until the receive completes below.
            let r = unsafe { self.recv.irecv(&b, &[&self.rmr]) }.expect("irecv").expect("a request");
            spin(|| self.recv.test(&r).expect("recv test").is_some());
        }
    }
}

/// Calls `done` until it says so, yielding between calls.
fn spin(mut done: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < end, "net_ceiling: a direct ping was lost");
        thread::yield_now();
    }
}

/// Fills `buf` from a non-blocking socket, yielding between empty reads.
fn spin_read(s: &mut std::net::TcpStream, buf: &mut [u8]) {
    let (mut got, end) = (0, Instant::now() + Duration::from_secs(10));
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => panic!("net_ceiling: the bare socket closed"),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(Instant::now() < end, "net_ceiling: a bare ping was lost");
                thread::yield_now();
            }
            Err(e) => panic!("net_ceiling: a bare read failed: {e}"),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        write!(
            f,
            "p50 {:.1} us, p99 {:.1} us, worst {:.1} us ({} round trips)",
            us(self.p50),
            us(self.p99),
            us(self.max),
            self.trips
        )
    }
}

/// Posts full Simple slots on every connection as fast as the proxy frees them; returns the
/// bytes sent.
fn sender(blocks: &[Arc<HostBlock>], l: Layout, stop: &AtomicBool) -> u64 {
    let bytes = l.stride(SIMPLE) as u32;
    let mut steps = vec![0u64; blocks.len()];
    while !stop.load(Ordering::Relaxed) {
        let mut moved = false;
        for (b, s) in blocks.iter().zip(steps.iter_mut()) {
            if b.load_u64(SEND_HEAD) + NSTEPS > *s {
                b.store_u32(SEND_SIZES + 4 * (*s % NSTEPS) as usize, bytes | SIMPLE << PROTO_SHIFT);
                fence(Ordering::SeqCst);
                *s += 1;
                b.store_u64(SEND_TAIL, *s);
                moved = true;
            }
        }
        if !moved {
            thread::yield_now();
        }
    }
    blocks.iter().map(|b| b.load_u64(SEND_HEAD)).sum::<u64>() * bytes as u64
}

/// Frees every slot (of `bytes`) as soon as it lands; returns the bytes received.
fn receiver(blocks: &[Arc<HostBlock>], bytes: u64, stop: &AtomicBool) -> u64 {
    let mut got = vec![0u64; blocks.len()];
    while !stop.load(Ordering::Relaxed) {
        let mut moved = false;
        for (b, g) in blocks.iter().zip(got.iter_mut()) {
            let t = b.load_u64(RECV_TAIL);
            if t > *g {
                *g = t;
                b.store_u64(RECV_HEAD, t);
                moved = true;
            }
        }
        if !moved {
            thread::yield_now();
        }
    }
    got.iter().sum::<u64>() * bytes
}
