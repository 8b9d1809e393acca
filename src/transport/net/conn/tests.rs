//! The NET transport's connections between threads of one process: steps byte for byte, runtime
//! pairs, strangers and broken peers.

use super::*;
use crate::abi::{FN_NSTEPS, FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE, FN_SIZE_PROTO_SHIFT};
use crate::bootstrap::{new_unique_id, Bootstrap};
use crate::socket::auth::Secret;
use std::sync::atomic::{fence, Ordering};
use std::sync::mpsc;
use std::thread;

/// Every wait in these tests gives up after this long.
const LIMIT: Duration = Duration::from_secs(30);
/// A small Simple FIFO keeps the blocks small (8 KiB slots).
const FIFO: usize = 64 << 10;

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let end = Instant::now() + LIMIT;
    while !ready() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        thread::yield_now();
    }
}

/// splitmix64: the same stream on both sides of a connection.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The protocol and bytes of step `s` of stream `seed`: every protocol, empty and full slots, and
/// every fourth run of 16 steps full Simple slots, as a large transfer sends them (pairs of them
/// cross as one message).
fn step_shape(l: &Layout, seed: u64, s: u64) -> (u32, usize) {
    if s / 16 % 4 == 3 {
        return (FN_PROTO_SIMPLE, l.slot_bytes);
    }
    let r = mix(seed ^ s.wrapping_mul(0x1234_5678_9abc));
    let proto = (r % 3) as u32;
    let stride = l.stride(proto);
    let bytes = match (r >> 8) % 8 {
        0 => 0,
        1 => stride,
        _ => (r >> 16) as usize % stride,
    };
    // LL and LL128 steps fill whole lines, as the kernels' size words say.
    let bytes = match proto {
        FN_PROTO_LL => bytes / 16 * 16,
        FN_PROTO_LL128 => bytes / 128 * 128,
        _ => bytes,
    };
    (proto, bytes)
}

fn byte(seed: u64, s: u64, i: usize) -> u8 {
    (mix(seed ^ (s << 20) ^ (i as u64 / 8)) >> (8 * (i % 8))) as u8
}

/// Plays the sending kernel: fills `steps` slots in random protocols and sizes.
fn fake_sender(b: &HostBlock, l: Layout, seed: u64, steps: u64) {
    for s in 0..steps {
        wait_for("a free send slot (head)", || b.load_u64(proxy::SEND_HEAD) + FN_NSTEPS as u64 > s);
        let (proto, bytes) = step_shape(&l, seed, s);
        let slot = (s % FN_NSTEPS as u64) as usize;
        let at = b.ptr(l.send_fifo(proto) + slot * l.stride(proto), bytes);
        for i in 0..bytes {
            // SAFETY: in the slot, which the proxy does not read before the tail moves.
            unsafe { at.add(i).write(byte(seed, s, i)) };
        }
        b.store_u32(proxy::SEND_SIZES + 4 * slot, bytes as u32 | proto << FN_SIZE_PROTO_SHIFT);
        fence(Ordering::SeqCst);
        b.store_u64(proxy::SEND_TAIL, s + 1);
    }
}

/// Plays the receiving kernel: checks every step byte for byte where its protocol puts it,
/// that nothing landed past it, then poisons the slot and frees it.
fn fake_receiver(b: &HostBlock, l: Layout, seed: u64, steps: u64) {
    const POISON: u8 = 0xEE;
    for s in 0..steps {
        wait_for(&format!("step {s} (tail)"), || b.load_u64(proxy::RECV_TAIL) > s);
        fence(Ordering::Acquire);
        let (proto, bytes) = step_shape(&l, seed, s);
        let slot = (s % FN_NSTEPS as u64) as usize;
        let stride = l.stride(proto);
        let at = b.ptr(l.recv_fifo(proto) + slot * stride, stride);
        for i in 0..bytes {
            // SAFETY: in the slot, which the proxy does not write again before head moves.
            let got = unsafe { at.add(i).read() };
            assert_eq!(got, byte(seed, s, i), "step {s} (protocol {proto}, {bytes} bytes): byte {i}");
        }
        // Through a plugin a small step lands in its LL slot with its size word on the line after
        // it, an LL line of the step: an LL step's word line stays there, and any other step's
        // lines there are left as this step's LL lines would be (its flag, no data), so that no
        // later LL step in the slot takes them for its own. After a Simple step the next lands in
        // its Simple slot: a Simple step in place with its word's line after it (unless it came
        // as the second step of a pair, with no line), any other copied to its own slot.
        let landing = match s {
            0 => proxy::Landing::Ll,
            _ => proxy::Landing::after(step_shape(&l, seed, s - 1).0),
        };
        let one_message = l.inline(proto, bytes, landing);
        let flag = ((s + 1) as u32).to_ne_bytes();
        let word = (bytes as u32 | proto << FN_SIZE_PROTO_SHIFT).to_ne_bytes();
        let mut past = bytes;
        if one_message && landing == proxy::Landing::Simple {
            if proto == FN_PROTO_SIMPLE {
                // The message's last line, after the step's bytes to whole lines.
                let end = Layout::inline_len(bytes);
                // SAFETY: as above; the word's line is in the slot (an inline step is under a slot).
                let line = unsafe { std::slice::from_raw_parts(at.add(end - 16), 16) };
                if line[..4] == word {
                    assert_eq!((line[4..8] == flag, line[12..] == flag), (true, true), "step {s}: its word's line");
                    past = end;
                }
            }
        } else if one_message && proto == FN_PROTO_LL {
            // SAFETY: as above; the word's line is in the slot (an inline step is under a slot).
            let line = unsafe { std::slice::from_raw_parts(at.add(bytes), 16) };
            assert_eq!(line[..4], word, "step {s}: its word");
            assert_eq!((line[4..8] == flag, line[8..12] == [0; 4], line[12..] == flag), (true, true, true), "step {s}");
            past += 16;
        } else if one_message {
            let len = Layout::inline_len(bytes);
            let ll = b.ptr(l.recv_fifo(FN_PROTO_LL) + slot * l.stride(FN_PROTO_LL), len);
            // SAFETY: the LL slot, which the proxy left before moving tail.
            let left = unsafe { std::slice::from_raw_parts(ll, len) };
            for (i, half) in left.chunks(8).enumerate() {
                assert_eq!((half[..4] == [0; 4], half[4..] == flag), (true, true), "step {s}: LL slot, word {i}");
            }
        }
        if past < stride {
            // SAFETY: as above.
            let after = unsafe { at.add(past).read() };
            assert!(after == 0 || after == POISON, "step {s}: byte {past}, past the step, was written");
        }
        // SAFETY: as above.
        unsafe { at.write_bytes(POISON, stride) };
        let landed = landing.proto();
        if l.one_message && landed != proto {
            // The step's first message (the whole step, copied out, or its size word) landed in a
            // slot of another protocol: what it left there is no step of that protocol's, so that
            // a later one's check past its bytes holds.
            let other = l.stride(landed);
            // SAFETY: that slot is in the block, and the proxy lands nothing there before head moves.
            unsafe { b.ptr(l.recv_fifo(landed) + slot * other, other).write_bytes(POISON, other) };
        }
        fence(Ordering::SeqCst);
        b.store_u64(proxy::RECV_HEAD, s + 1);
    }
}

type Faults = Arc<parking_lot::Mutex<Vec<String>>>;

fn setup(names: &[&str], faults: &Faults) -> Setup {
    let f = faults.clone();
    Setup {
        dev: -7,
        fifo_bytes: FIFO,
        names: names.iter().map(|s| s.to_string()).collect(),
        fault: Arc::new(move |m| f.lock().push(m)),
        timeout: LIMIT,
        net: crate::transport::net::init(&crate::transport::net::NetConfig::default()).expect("the net"),
        profiler: None,
        cpus: None,
        machine_ranks: 1,
        net_peers: 1,
    }
}

/// The built-in Socket net dressed as a plugin: the proxy then sends a small step as one message
/// (`Layout::one_message`), as it does through plugins, over sockets these tests can drive.
struct AsPlugin(Arc<dyn Net>);

impl Net for AsPlugin {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn devices(&self) -> usize {
        self.0.devices()
    }
    fn properties(&self, dev: usize) -> Result<super::super::Properties> {
        self.0.properties(dev)
    }
    fn listen(&self, dev: usize) -> Result<(Handle, Box<dyn super::super::Listener>)> {
        self.0.listen(dev)
    }
    fn connect(&self, dev: usize, handle: &Handle) -> Result<Box<dyn Connecting>> {
        self.0.connect(dev, handle)
    }
}

/// `setup`, its net taken for a plugin when `plugin`.
fn setup_as(names: &[&str], faults: &Faults, plugin: bool) -> Setup {
    let mut s = setup(names, faults);
    if plugin {
        s.net = Arc::new(AsPlugin(s.net));
    }
    s
}

/// Two ranks in threads, through the bootstrap: the whole connect path.
fn connect_pair(channels: usize) -> [(NetTransport, Faults); 2] {
    connect_pair_as(channels, false)
}

/// As [`connect_pair`], the net taken for a plugin when `plugin`.
fn connect_pair_as(channels: usize, plugin: bool) -> [(NetTransport, Faults); 2] {
    let id = new_unique_id().unwrap();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            thread::spawn(move || {
                let bs = Bootstrap::init(&id, r, 2, LIMIT).unwrap();
                let faults = Faults::default();
                let conns: Vec<_> = (0..channels).map(|ch| (1 - r, ch)).collect();
                let su = setup_as(&["rank 0", "rank 1"], &faults, plugin);
                let t = NetTransport::connect(&bs, &conns, &su, &HostBlock::plain).unwrap();
                // Nobody leaves (closing its bootstrap) before both are connected.
                bs.barrier().unwrap();
                (t, faults)
            })
        })
        .collect();
    let mut v: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let b = v.pop().unwrap();
    [v.pop().unwrap(), b]
}

#[test]
fn steps_cross_byte_for_byte_in_every_protocol() {
    steps_cross_byte_for_byte(false);
}

/// Through a plugin a small step (`Layout::inline`: LL up to a slot less a line, others up to
/// `INLINE_MAX`) crosses as one message into its LL slot (moved to its own slot unless it is LL),
/// and after a Simple step any step up to its slot less a line into its Simple slot (moved unless
/// it is Simple): the same steps, those inline, the others in two messages.
#[test]
fn steps_cross_byte_for_byte_in_every_protocol_through_a_plugin() {
    steps_cross_byte_for_byte(true);
}

fn steps_cross_byte_for_byte(plugin: bool) {
    let [(t0, f0), (t1, f1)] = connect_pair_as(2, plugin);
    let l = t0.layout();
    assert_eq!(l.one_message, plugin);
    thread::scope(|sc| {
        for ch in 0..2 {
            for (a, b, peer_of_a) in [(&t0, &t1, 1), (&t1, &t0, 0)] {
                let seed = 77 + ch as u64 * 2 + peer_of_a as u64;
                let sb = a.block(peer_of_a, ch).unwrap().clone();
                let rb = b.block(1 - peer_of_a, ch).unwrap().clone();
                sc.spawn(move || fake_sender(&sb, l, seed, 300));
                sc.spawn(move || fake_receiver(&rb, l, seed, 300));
            }
        }
    });
    assert!(f0.lock().is_empty() && f1.lock().is_empty(), "faults: {:?} {:?}", f0.lock(), f1.lock());
    // The kernels' view: host FIFOs, tails for Simple and LL128 (LL publishes none, its receiver
    // polls the lines), sizes on the send side.
    let c = t0.conn(1, 1).unwrap();
    let b = t0.block(1, 1).unwrap();
    assert_eq!(c.send.flags, FN_CONN_TAIL_LL128);
    assert_eq!(c.recv.flags, FN_CONN_TAIL_LL128);
    assert_eq!(c.send.sizes as u64, b.dev(proxy::SEND_SIZES));
    assert_eq!(c.recv.buffs[FN_PROTO_LL as usize] as u64, b.dev(l.recv_fifo(FN_PROTO_LL)));
    assert!(t0.conn(1, 2).is_none() && t0.conn(0, 0).is_none());
    // A communicator destroyed on one side is a close on the other, not a failure.
    drop(t0);
    wait_for("rank 1 to see both goodbyes", || t1.closed_by_peer() == 2);
    assert!(f1.lock().is_empty(), "{:?}", f1.lock());
}

/// An LL step's sender publishes no tail over NET (kernels/README.md): the proxy sends it once its
/// size word is there and every line carries the step's flag, not before, and empties the word;
/// the receiving kernel polls the lines, as over P2P, and finds each half that carries the flag
/// whole, and the tail follows. Three rounds of the slots, the last line of each step stored late.
#[test]
fn untailed_ll_steps_go_out_once_every_line_carries_its_flag() {
    untailed_ll_steps(false);
}

#[test]
fn untailed_ll_steps_go_out_whole_through_a_plugin() {
    untailed_ll_steps(true);
}

fn untailed_ll_steps(plugin: bool) {
    let [(t0, f0), (t1, f1)] = connect_pair_as(1, plugin);
    let l = t0.layout();
    let (sb, rb) = (t0.block(1, 0).unwrap(), t1.block(0, 0).unwrap());
    let stride = l.stride(FN_PROTO_LL);
    let word = |s: u64, i: usize| mix(s << 32 | i as u64);
    for s in 0..3 * FN_NSTEPS as u64 {
        let lines = 1 + (mix(s) % (stride as u64 / 16)) as usize;
        wait_for("a free send slot (head)", || sb.load_u64(proxy::SEND_HEAD) + FN_NSTEPS as u64 > s);
        let slot = (s % FN_NSTEPS as u64) as usize;
        assert_eq!(sb.load_u32(proxy::SEND_SIZES + 4 * slot), proxy::SIZE_EMPTY, "step {s}: the word was taken");
        let (send_at, recv_at) = (l.send_fifo(FN_PROTO_LL) + slot * stride, l.recv_fifo(FN_PROTO_LL) + slot * stride);
        let flag = (s + 1) as u32;
        let store = |b: &HostBlock, at: usize, i: usize| {
            let v = word(s, i);
            for (off, x) in [(0, v as u32), (4, flag), (8, (v >> 32) as u32), (12, flag)] {
                b.store_u32(at + 16 * i + off, x);
            }
        };
        // The size word may come first: the kernel's thread 0 stores it after a barrier, but the
        // lines of other threads can still be on their way across PCIe.
        sb.store_u32(proxy::SEND_SIZES + 4 * slot, (16 * lines) as u32 | FN_PROTO_LL << FN_SIZE_PROTO_SHIFT);
        for i in 0..lines - 1 {
            store(sb, send_at, i);
        }
        let arrived =
            |i: usize| rb.load_u32(recv_at + 16 * i + 4) == flag && rb.load_u32(recv_at + 16 * i + 12) == flag;
        if s % 4 == 0 {
            thread::sleep(Duration::from_millis(20));
            assert!(!arrived(0), "step {s} went out before its last line carried the flag");
        }
        store(sb, send_at, lines - 1);
        for i in 0..lines {
            // Each half at once, as the kernel's 16-byte load reads it: a flag never before its data.
            let half = |h: usize| rb.load_u64(recv_at + 16 * i + 8 * h);
            let end = Instant::now() + Duration::from_secs(10);
            let (lo, hi) = loop {
                let (lo, hi) = (half(0), half(1));
                if (lo >> 32, hi >> 32) == (u64::from(flag), u64::from(flag)) {
                    break (lo, hi);
                }
                assert!(Instant::now() < end, "step {s}, line {i}: no flag");
                thread::yield_now();
            };
            assert_eq!(lo as u32 as u64 | (hi as u32 as u64) << 32, word(s, i), "step {s}, line {i}");
        }
        wait_for(&format!("step {s}'s tail"), || rb.load_u64(proxy::RECV_TAIL) > s);
        rb.store_u64(proxy::RECV_HEAD, s + 1);
    }
    assert!(f0.lock().is_empty() && f1.lock().is_empty(), "faults: {:?} {:?}", f0.lock(), f1.lock());
}

/// A rank whose kernel has handed its last steps to the proxy and which then ends (destroy, or a
/// process exit with the communicator alive) still delivers them: its peer's last collective
/// needs that data, and a goodbye sent ahead of it would leave the peer waiting for ever.
#[test]
fn closing_right_after_the_last_steps_still_delivers_them() {
    let [(t0, f0), (t1, f1)] = connect_pair(1);
    let l = t0.layout();
    let steps = FN_NSTEPS as u64;
    let sb = t0.block(1, 0).unwrap().clone();
    let rb = t1.block(0, 0).unwrap().clone();
    thread::scope(|sc| {
        sc.spawn(move || fake_receiver(&rb, l, 5, steps));
        fake_sender(&sb, l, 5, steps);
        drop(t0);
    });
    wait_for("rank 1 to see the goodbye", || t1.closed_by_peer() == 1);
    assert!(f0.lock().is_empty() && f1.lock().is_empty(), "faults: {:?} {:?}", f0.lock(), f1.lock());
}

/// Connections that have been quiet past the proxy's hot window (a quiet receive is tested only
/// every few rounds) still carry their steps, byte for byte, both ways, one channel after the other.
#[test]
fn connections_gone_quiet_still_carry_their_steps() {
    let [(t0, f0), (t1, f1)] = connect_pair(2);
    let l = t0.layout();
    thread::sleep(proxy::HOT * 3);
    for ch in [1, 0] {
        thread::scope(|sc| {
            for (a, b, peer_of_a) in [(&t0, &t1, 1), (&t1, &t0, 0)] {
                let (sb, rb) = (a.block(peer_of_a, ch).unwrap().clone(), b.block(1 - peer_of_a, ch).unwrap().clone());
                let (seed, steps) = (40 + 2 * ch as u64 + peer_of_a as u64, 3 * FN_NSTEPS as u64);
                sc.spawn(move || fake_receiver(&rb, l, seed, steps));
                sc.spawn(move || fake_sender(&sb, l, seed, steps));
            }
        });
    }
    assert!(f0.lock().is_empty() && f1.lock().is_empty(), "faults: {:?} {:?}", f0.lock(), f1.lock());
}

/// `n` ranks in threads, each with a NET transport that connected nothing at init, each then
/// running `connect(rank, bootstrap, transport, setup)`; returned after a barrier.
fn runtime_ranks(n: usize, connect: fn(usize, &Bootstrap, &mut NetTransport, &Setup)) -> Vec<(NetTransport, Faults)> {
    let id = new_unique_id().unwrap();
    let names: Vec<String> = (0..n).map(|r| format!("rank {r}")).collect();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let names = names.clone();
            thread::spawn(move || {
                let bs = Bootstrap::init(&id, r, n, LIMIT).unwrap();
                let faults = Faults::default();
                let su = setup(&names.iter().map(String::as_str).collect::<Vec<_>>(), &faults);
                let mut t = NetTransport::connect(&bs, &[], &su, &HostBlock::plain).unwrap();
                assert!(t.block((r + 1) % n, 0).is_none(), "nothing connected at init");
                connect(r, &bs, &mut t, &su);
                bs.barrier().unwrap();
                (t, faults)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Every pair of `ranks` carries `steps` steps both ways on channel `ch`, byte for byte, and
/// nobody reports a fault.
fn cross_every_pair(ranks: &[(NetTransport, Faults)], ch: usize, steps: u64) {
    let (n, l) = (ranks.len(), ranks[0].0.layout());
    thread::scope(|sc| {
        for a in 0..n {
            for b in (0..n).filter(|&b| b != a) {
                let seed = 1000 + 10 * a as u64 + b as u64;
                let sb = ranks[a].0.block(b, ch).unwrap().clone();
                let rb = ranks[b].0.block(a, ch).unwrap().clone();
                sc.spawn(move || fake_sender(&sb, l, seed, steps));
                sc.spawn(move || fake_receiver(&rb, l, seed, steps));
            }
        }
    });
    for (r, (_, f)) in ranks.iter().enumerate() {
        assert!(f.lock().is_empty(), "rank {r}: {:?}", f.lock());
    }
}

/// NCCL's runtime connect: three ranks with no connection at init each connect the two
/// others after it, in ascending rank order, so each pair is made while its ranks also owe
/// the third (0 takes 1 then 2, 1 takes 0 then 2, 2 takes 0 then 1); then every pair carries
/// steps both ways, byte for byte.
#[test]
fn runtime_pairs_connect_in_crossing_orders_and_carry_steps() {
    let ranks = runtime_ranks(3, |r, bs, t, su| {
        for peer in (0..3).filter(|&p| p != r) {
            t.connect_pair(bs, peer, 2, su, &HostBlock::plain).unwrap();
        }
    });
    cross_every_pair(&ranks, 1, 100);
    for (r, (t, _)) in ranks.iter().enumerate() {
        assert!(t.conn((r + 1) % 3, 1).is_some() && t.conn((r + 1) % 3, 2).is_none());
    }
}

/// A runtime peer that reaches its group 10 s after us (a slow rank) still connects, and the
/// pair carries steps.
#[test]
fn a_late_runtime_peer_still_connects() {
    let ranks = runtime_ranks(2, |r, bs, t, su| {
        if r == 1 {
            thread::sleep(Duration::from_secs(10));
        }
        t.connect_pair(bs, 1 - r, 1, su, &HostBlock::plain).unwrap();
    });
    cross_every_pair(&ranks, 0, 50);
}

/// Ranks that ask for different channel counts for one pair (NCCL_NCHANNELS_PER_NET_PEER set on
/// one of them) both fail at once, saying which setting must agree, and connect nothing.
#[test]
fn a_runtime_pair_that_disagrees_on_channels_fails_at_once_naming_the_setting() {
    let ranks = runtime_ranks(2, |r, bs, t, su| {
        let start = Instant::now();
        let e = t.connect_pair(bs, 1 - r, 1 + r, su, &HostBlock::plain).expect_err("a mismatch").to_string();
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        let named = e.contains("NCCL_NCHANNELS_PER_NET_PEER") && e.contains(" on 1") && e.contains(" on 2");
        assert!(named, "rank {r}: {e}");
        assert!(t.block(1 - r, 0).is_none());
    });
    assert_eq!(ranks.len(), 2);
}

/// A runtime peer that never takes part is named when the bootstrap's deadline passes, and
/// one whose record is not a handle and a challenge is refused before anything is connected.
#[test]
fn a_runtime_peer_absent_or_hostile_is_named() {
    let id = new_unique_id().unwrap();
    let short = Duration::from_secs(2);
    let hs: Vec<_> = (0..2)
        .map(|r| {
            thread::spawn(move || {
                let bs = Bootstrap::init(&id, r, 2, short).unwrap();
                let faults = Faults::default();
                let su = setup(&["rank 0", "rank 1"], &faults);
                let mut t = NetTransport::connect(&bs, &[], &su, &HostBlock::plain).unwrap();
                if r == 1 {
                    // Absent at first, then a record of the wrong size.
                    thread::sleep(short + Duration::from_secs(1));
                    bs.send(0, TAG_PAIR, &[7; 9]).unwrap();
                    thread::sleep(Duration::from_secs(1));
                    return None;
                }
                let start = Instant::now();
                let absent = t.connect_pair(&bs, 1, 1, &su, &HostBlock::plain).err().unwrap().to_string();
                assert!(start.elapsed() < short + Duration::from_secs(2), "{:?}", start.elapsed());
                let hostile = t.connect_pair(&bs, 1, 1, &su, &HostBlock::plain).err().unwrap().to_string();
                assert!(t.block(1, 0).is_none());
                Some((absent, hostile))
            })
        })
        .collect();
    let (absent, hostile) = hs.into_iter().filter_map(|h| h.join().unwrap()).next().unwrap();
    assert!(absent.contains("rank 1"), "{absent}");
    assert!(hostile.contains("rank 1 sent a connection record of 9 bytes"), "{hostile}");
}

/// Two ranks' links made with `establish` over the Socket net, without a bootstrap, so a
/// test can put strangers on rank 0's listener first (`before(handle of rank 0)`).
fn links_pair(
    channels: usize,
    cred: Credentials,
    before: impl FnOnce(&Handle) + Send,
) -> (Vec<Link>, Vec<Link>, Vec<Nonce>) {
    let net = super::super::socket::SocketNet::new().unwrap();
    let (h0, mut l0) = net.listen(0).unwrap();
    let (h1, mut l1) = net.listen(0).unwrap();
    let handles = [h0, h1];
    let challenges = vec![auth::nonce().unwrap(), auth::nonce().unwrap()];
    let names = ["rank 0".to_string(), "rank 1".to_string()];
    let (tx, rx) = mpsc::channel();
    let (a, b) = thread::scope(|sc| {
        let (net, handles, challenges, names) = (&net, &handles, &challenges, &names);
        let r0 = sc.spawn(move || {
            let who = Peers { rank: 0, handles, challenges, names, cred };
            let conns: Vec<_> = (0..channels).map(|ch| (1, ch)).collect();
            establish(net, &mut *l0, &who, &conns, Instant::now() + LIMIT)
        });
        before(&handles[0]);
        tx.send(()).unwrap();
        let r1 = sc.spawn(move || {
            rx.recv().unwrap();
            let who = Peers { rank: 1, handles, challenges, names, cred };
            let conns: Vec<_> = (0..channels).map(|ch| (0, ch)).collect();
            establish(net, &mut *l1, &who, &conns, Instant::now() + LIMIT)
        });
        (r0.join().unwrap().unwrap(), r1.join().unwrap().unwrap())
    });
    (a, b, challenges)
}

fn cred() -> Credentials {
    Credentials { magic: 0x5eed, secret: Secret::random().unwrap() }
}

/// Sends one 64-byte introduction from a stranger to `handle`, and keeps the comm open.
fn stranger(handle: &Handle, intro: [u8; INTRO_BYTES]) -> Box<dyn SendComm> {
    let net = super::super::socket::SocketNet::new().unwrap();
    let mut c = net.connect(0, handle).unwrap();
    let end = Instant::now() + LIMIT;
    let mut comm = loop {
        if let Some(c) = c.poll().unwrap() {
            break c;
        }
        assert!(Instant::now() < end, "a stranger could not connect");
        thread::sleep(Duration::from_millis(1));
    };
    let mut buf = Box::new(intro);
    let mr = comm.reg_mr(buf.as_mut_ptr(), INTRO_BYTES, PtrKind::Host).unwrap();
    // SAFETY: `buf` is leaked below, so it outlives the request.
    let r = unsafe { comm.isend(buf.as_ptr(), INTRO_BYTES, TAG_INTRO, &mr) }.unwrap().unwrap();
    wait_for("a stranger's send", || comm.test(&r).unwrap().is_some());
    Box::leak(buf);
    comm
}

#[test]
fn strangers_without_the_secret_are_refused_and_honest_ranks_connect() {
    let c = cred();
    let mut strangers = Vec::new();
    let (l0, l1, challenges) = links_pair(2, c, |h0| {
        // Forged challenges can't be answered: rank 0's challenge travels only through the
        // (authenticated) bootstrap. Each of these claims to be rank 1 on channel 0.
        let wrong_secret = Credentials { magic: c.magic, secret: Secret::random().unwrap() };
        let any_nonce = auth::nonce().unwrap();
        strangers.push(stranger(h0, intro(&wrong_secret, 1, 0, 0, &any_nonce).unwrap()));
        // Another job's id, and garbage.
        let other_job = Credentials { magic: 1, secret: c.secret };
        strangers.push(stranger(h0, intro(&other_job, 1, 0, 0, &any_nonce).unwrap()));
        strangers.push(stranger(h0, [0x42; INTRO_BYTES]));
    });
    drop(strangers);
    // The honest connections won: each side got exactly its channels, and steps flow.
    let chans = |l: &[Link]| l.iter().map(|(p, ch, ..)| (*p, *ch)).collect::<Vec<_>>();
    assert_eq!(chans(&l0), vec![(1, 0), (1, 1)]);
    assert_eq!(chans(&l1), vec![(0, 0), (0, 1)]);
    let faults = Faults::default();
    let names = ["rank 0".to_string(), "rank 1".to_string()];
    let handles = [[0u8; super::super::HANDLE_BYTES]; 2];
    let who = |rank| Peers { rank, handles: &handles, challenges: &challenges, names: &names, cred: c };
    let s = setup(&["rank 0", "rank 1"], &faults);
    let t0 = NetTransport::start(l0, &s, &who(0), "Socket", &HostBlock::plain).unwrap();
    let t1 = NetTransport::start(l1, &s, &who(1), "Socket", &HostBlock::plain).unwrap();
    let l = t0.layout();
    thread::scope(|sc| {
        let (sb, rb) = (t1.block(0, 0).unwrap(), t0.block(1, 0).unwrap());
        sc.spawn(|| fake_sender(sb, l, 5, 40));
        sc.spawn(|| fake_receiver(rb, l, 5, 40));
    });
    assert!(faults.lock().is_empty(), "{:?}", faults.lock());
}

#[test]
fn introductions_are_checked() {
    let c = cred();
    let ch = auth::nonce().unwrap();
    let good = intro(&c, 3, 1, 5, &ch).unwrap();
    assert_eq!(check_intro(&good, &c, 1, &ch), Ok(Claim { rank: 3, ch: 5 }));
    assert!(check_intro(&good, &c, 2, &ch).unwrap_err().contains("meant for rank 1"));
    assert!(check_intro(&good, &c, 1, &auth::nonce().unwrap()).unwrap_err().contains("proof"), "replayed");
    assert!(check_intro(&good[..40], &c, 1, &ch).unwrap_err().contains("not an introduction"));
    let other = Credentials { magic: c.magic + 1, ..c };
    assert!(check_intro(&good, &other, 1, &ch).unwrap_err().contains("another communicator"));
    // The proof covers who and where: changing the claimed rank or channel breaks it.
    for at in [16, 24] {
        let mut forged = good;
        forged[at] ^= 1;
        assert!(check_intro(&forged, &c, 1, &ch).unwrap_err().contains("proof"));
    }
}

/// Rank 0 runs the transport; the test plays rank 1 by hand on its raw links.
fn half_pair() -> (NetTransport, Faults, Vec<Link>) {
    half_pair_as(false)
}

/// As [`half_pair`], the net taken for a plugin when `plugin`.
fn half_pair_as(plugin: bool) -> (NetTransport, Faults, Vec<Link>) {
    let c = cred();
    let (l0, l1, challenges) = links_pair(1, c, |_| {});
    let faults = Faults::default();
    let names = ["rank 0".to_string(), "rank 1 (host h1, pid 9)".to_string()];
    let handles = [[0u8; super::super::HANDLE_BYTES]; 2];
    let who = Peers { rank: 0, handles: &handles, challenges: &challenges, names: &names, cred: c };
    let s = setup_as(&["rank 0", "rank 1 (host h1, pid 9)"], &faults, plugin);
    (NetTransport::start(l0, &s, &who, "Socket", &HostBlock::plain).unwrap(), faults, l1)
}

fn wait_fault(faults: &Faults) -> String {
    wait_for("the proxy to report the fault", || !faults.lock().is_empty());
    faults.lock()[0].clone()
}

#[test]
fn garbage_size_words_fail_the_connection_naming_the_peer() {
    let (t0, faults, mut l1) = half_pair();
    let (_, _, send, _) = &mut l1[0];
    // Protocol 3 (none), 16 bytes.
    let mut word = Box::new(0xc000_0010u32.to_le_bytes());
    let mr = send.reg_mr(word.as_mut_ptr(), 4, PtrKind::Host).unwrap();
    // SAFETY: `word` lives until the end of the test, after the send completed.
    let r = unsafe { send.isend(word.as_ptr(), 4, 1, &mr) }.unwrap().unwrap();
    wait_for("the garbage to go out", || send.test(&r).unwrap().is_some());
    let m = wait_fault(&faults);
    assert!(m.contains("rank 1 (host h1, pid 9), channel 0") && m.contains("garbage"), "{m}");
    // The tail never moved: the kernel saw nothing.
    assert_eq!(t0.block(1, 0).unwrap().load_u64(proxy::RECV_TAIL), 0);
}

/// Through a plugin the first message of a step is its size word alone or the whole step; one
/// whose length is neither (here a line more than its word announces, then a word cut short), or
/// whose word announces more than any slot holds, or a whole LL128 step larger than a step other
/// than LL may be in one message into an LL slot, fails the connection, naming the peer, and the
/// tail does not pass it; so do the first two after a good Simple step, landing in a Simple slot,
/// where no LL kernel sees anything of them.
#[test]
fn one_message_steps_of_the_wrong_length_fail_the_connection() {
    use crate::abi::{FN_PROTO_LL128, FN_PROTO_SIMPLE};
    let big = proxy::INLINE_MAX + 128;
    for (proto, data, extra, cut, huge, after_simple) in [
        (FN_PROTO_SIMPLE, 32usize, 16usize, false, false, false),
        (FN_PROTO_LL, 32, 16, false, false, false),
        (FN_PROTO_LL, 32, 16, false, false, true),
        (FN_PROTO_SIMPLE, 32, 0, true, false, false),
        (FN_PROTO_SIMPLE, 32, 0, false, true, false),
        (FN_PROTO_LL128, big, 0, false, false, false),
        (FN_PROTO_SIMPLE, 32, 16, false, false, true),
        (FN_PROTO_SIMPLE, 32, 0, true, false, true),
    ] {
        let (t0, faults, mut l1) = half_pair_as(true);
        assert!(t0.layout().one_message);
        let (_, _, send, _) = &mut l1[0];
        let landed = if after_simple {
            // A good Simple step of 48 bytes first: the next lands in its Simple slot.
            let mut good = vec![0u8; 64];
            good[48..52].copy_from_slice(&(48 | FN_PROTO_SIMPLE << FN_SIZE_PROTO_SHIFT).to_le_bytes());
            let mr = send.reg_mr(good.as_mut_ptr(), good.len(), PtrKind::Host).unwrap();
            // SAFETY: `good` lives until the send completed, just below.
            let r = unsafe { send.isend(good.as_ptr(), good.len(), 1, &mr) }.unwrap().unwrap();
            wait_for("the good step to go out", || send.test(&r).unwrap().is_some());
            wait_for("the good step to land", || t0.block(1, 0).unwrap().load_u64(proxy::RECV_TAIL) == 1);
            1
        } else {
            0
        };
        // A step of `data` bytes, sent with `data` + `extra` bytes before its word's line, or 3
        // bytes of a word.
        let mut msg = vec![0xA5u8; data + extra + 16];
        let word = msg.len() - 16;
        let bytes: u32 = if huge { (1 << FN_SIZE_PROTO_SHIFT) - 1 } else { data as u32 };
        msg[word..word + 4].copy_from_slice(&(bytes | proto << FN_SIZE_PROTO_SHIFT).to_le_bytes());
        let len = if cut { 3 } else { msg.len() };
        let mr = send.reg_mr(msg.as_mut_ptr(), msg.len(), PtrKind::Host).unwrap();
        // SAFETY: `msg` lives until the end of the iteration, after the send completed.
        let r = unsafe { send.isend(msg.as_ptr(), len, 1, &mr) }.unwrap().unwrap();
        wait_for("the message to go out", || send.test(&r).unwrap().is_some());
        let m = wait_fault(&faults);
        assert!(m.contains("rank 1 (host h1, pid 9), channel 0"), "{m}");
        let want = match (cut, huge) {
            (true, _) => "expected 4".to_string(),
            (_, true) => "bytes for a slot".to_string(),
            _ => format!("announces {data} bytes"),
        };
        assert!(m.contains(&want), "{m}");
        let b = t0.block(1, 0).unwrap();
        assert_eq!(b.load_u64(proxy::RECV_TAIL), landed);
        // An LL kernel polls its lines, not the tail. A message that lands in an LL slot is where
        // such a kernel may take its lines, as NCCL's may, before the proxy finds it wrong and the
        // communicator stops (docs/NET.md, "One message per small step"); after a Simple step the
        // message lands in a Simple slot, and none of it reached the LL FIFO, where the good step
        // before it left only lines of its flag and no data.
        let l = t0.layout();
        let ll = (0..FN_NSTEPS as usize * l.stride(FN_PROTO_LL)).step_by(8);
        let no_data = ll.clone().all(|o| b.load_u64(l.recv_fifo(FN_PROTO_LL) + o) as u32 == 0);
        assert!(no_data || !after_simple, "{proto}: the LL FIFO has data");
    }
}

#[test]
fn a_peer_gone_mid_transfer_is_named_promptly() {
    peer_gone_mid_transfer(false);
}

/// The same through a plugin, where the steps in flight are one-message steps.
#[test]
fn a_peer_gone_mid_transfer_is_named_promptly_through_a_plugin() {
    peer_gone_mid_transfer(true);
}

fn peer_gone_mid_transfer(plugin: bool) {
    let (t0, faults, l1) = half_pair_as(plugin);
    assert_eq!(t0.layout().one_message, plugin);
    let l = t0.layout();
    // Rank 0's kernel sends more steps than the peer ever takes; the peer closes its comms.
    let b = t0.block(1, 0).unwrap().clone();
    let start = Instant::now();
    drop(l1);
    let m = wait_fault(&faults);
    assert!(m.contains("rank 1 (host h1, pid 9), channel 0"), "{m}");
    assert!(start.elapsed() < LIMIT);
    // Removing the connections from the proxy does not wait on the dead peer.
    fake_sender_until_stuck(&b, l);
    drop(t0);
}

/// Sends steps until the slots run out (the peer is gone, nothing frees them): mixed steps, then
/// full Simple slots, which go in pairs.
fn fake_sender_until_stuck(b: &HostBlock, l: Layout) {
    for s in 0..FN_NSTEPS as u64 {
        let (proto, bytes) =
            if s < FN_NSTEPS as u64 / 2 { step_shape(&l, 9, s) } else { (FN_PROTO_SIMPLE, l.slot_bytes) };
        b.store_u32(
            proxy::SEND_SIZES + 4 * (s % FN_NSTEPS as u64) as usize,
            bytes as u32 | proto << FN_SIZE_PROTO_SHIFT,
        );
        fence(Ordering::SeqCst);
        b.store_u64(proxy::SEND_TAIL, s + 1);
    }
}
