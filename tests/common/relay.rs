//! A fault-injecting TCP relay of our own (`netem` is not available everywhere): it accepts
//! connections, forwards each to a target, and on command delays what it forwards, stalls
//! (stops reading, so the sender's window closes while the relay's kernel still acknowledges:
//! a slow peer, not a dead one), or cuts one stream with a reset.
//!
//! Every thread it starts polls with a short timeout and stops when the relay is dropped.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const NAP: Duration = Duration::from_millis(20);

type Pair = (Arc<TcpStream>, Arc<TcpStream>, Arc<AtomicBool>);

#[derive(Default)]
struct State {
    stop: AtomicBool,
    stalled: AtomicBool,
    /// Delay before each forwarded read, in microseconds.
    delay_us: AtomicU64,
    /// Every accepted stream, its outgoing twin and its "cut" flag, in accept order (`None` once
    /// cut).
    streams: Mutex<Vec<Option<Pair>>>,
}

pub struct Relay {
    pub addr: SocketAddr,
    state: Arc<State>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    /// Listens on `listen` (port 0 for any) and forwards every connection to `target`.
    pub fn start(listen: SocketAddr, target: SocketAddr) -> Relay {
        let l = TcpListener::bind(listen).expect("relay listens");
        l.set_nonblocking(true).unwrap();
        let (addr, state) = (l.local_addr().unwrap(), Arc::new(State::default()));
        let st = state.clone();
        let accept = std::thread::spawn(move || {
            while !st.stop.load(Ordering::Acquire) {
                match l.accept() {
                    Ok((inbound, _)) => {
                        let outbound =
                            TcpStream::connect_timeout(&target, Duration::from_secs(5)).expect("relay connects");
                        inbound.set_nonblocking(false).unwrap();
                        let (inbound, outbound) = (Arc::new(inbound), Arc::new(outbound));
                        let cut = Arc::new(AtomicBool::new(false));
                        for (from, to) in [(&inbound, &outbound), (&outbound, &inbound)] {
                            let (from, to, st, cut) = (from.clone(), to.clone(), st.clone(), cut.clone());
                            std::thread::spawn(move || pump(&from, &to, &st, &cut));
                        }
                        st.streams.lock().unwrap().push(Some((inbound, outbound, cut)));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
                    Err(e) => panic!("relay accept: {e}"),
                }
            }
        });
        Relay { addr, state, accept: Some(accept) }
    }

    /// Waits before forwarding each read (a slow network).
    pub fn delay(&self, d: Duration) {
        self.state.delay_us.store(d.as_micros() as u64, Ordering::Release);
    }

    /// Stops forwarding (and reading) on every stream, or resumes.
    pub fn stall(&self, on: bool) {
        self.state.stalled.store(on, Ordering::Release);
    }

    /// How many streams were relayed so far.
    pub fn streams(&self) -> usize {
        self.state.streams.lock().unwrap().len()
    }

    /// Resets stream `i` (in accept order) on both sides: each end gets a TCP reset.
    pub fn cut(&self, i: usize) {
        let (a, b, cut) = self.state.streams.lock().unwrap()[i].take().expect("a stream not cut yet");
        // A close with a zero linger resets the connection; it happens when the last of the
        // stream's handles goes, the pumps' included (they stop within NAP).
        for s in [&a, &b] {
            socket2::SockRef::from(&**s).set_linger(Some(Duration::ZERO)).unwrap();
        }
        cut.store(true, Ordering::Release);
    }
}

/// Forwards `from` to `to` until either closes, the stream is cut or the relay stops.
fn pump(from: &TcpStream, to: &TcpStream, st: &State, cut: &AtomicBool) {
    from.set_read_timeout(Some(NAP)).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let live = || !st.stop.load(Ordering::Acquire) && !cut.load(Ordering::Acquire);
    while live() {
        if st.stalled.load(Ordering::Acquire) {
            std::thread::sleep(NAP);
            continue;
        }
        let n = match (&mut &*from).read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue
            }
            Err(_) => break,
        };
        std::thread::sleep(Duration::from_micros(st.delay_us.load(Ordering::Acquire)));
        if (&mut &*to).write_all(&buf[..n]).is_err() {
            break;
        }
    }
    if live() {
        let _ = to.shutdown(Shutdown::Write);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for (a, b, _) in self.state.streams.lock().unwrap().drain(..).flatten() {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}
