//! A warm send path: the kernel's TCP stack, idle on this thread's CPU for a while, makes the
//! next send slow. On one H200's host (16 cores), a 1 KB send on loopback TCP with both threads
//! polling took 4.2-4.6 us back to back, 8-11 us after 2.5 ms idle and 33-42 us after 20 ms; a
//! byte sent over another loopback pair every 100 us of the idle spell brought it back to 5-7 us
//! (so it is the stack's code and data going cold, not the connection's state). While a launch's
//! first step is awaited, the proxy thread asks its comms to keep the path warm
//! ([`super::super::SendComm::warm`]); the built-in net then sends one byte through a loopback
//! pair of the calling thread's own and reads it back (docs/NET.md, "A warm send path").

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};

use crate::debug::Subsys;

/// The pair's two ends, or why it could not be made (then it is not tried again).
type Pair = std::result::Result<(TcpStream, TcpStream), ()>;

thread_local! {
    /// The calling thread's pair, made on first use. Sockets only: the thread may drop them at
    /// any time, the process's exit included.
    static PAIR: RefCell<Option<Pair>> = const { RefCell::new(None) };
}

/// A connected loopback pair, both ends non-blocking, without Nagle's delay.
fn connect_pair() -> io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let a = TcpStream::connect(listener.local_addr()?)?;
    // The kernel completed the handshake inside `connect`: the peer is in the accept queue.
    listener.set_nonblocking(true)?;
    let (b, _) = listener.accept()?;
    for s in [&a, &b] {
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
    }
    Ok((a, b))
}

/// One byte through the calling thread's loopback pair, read back at once; whether it went (not
/// if no pair could be made: loopback TCP missing, or out of descriptors).
pub(super) fn touch() -> bool {
    PAIR.with_borrow_mut(|pair| {
        let pair = pair.get_or_insert_with(|| {
            connect_pair().map_err(|e| {
                crate::nccl_info!(Subsys::NET, "NET/Socket: no loopback pair to keep the send path warm: {e}");
            })
        });
        let Ok((a, b)) = pair else { return false };
        if !matches!(a.write(&[0]), Ok(1)) {
            return false;
        }
        // Loopback delivers inside the send; whatever is there is ours, a byte per call.
        let mut buf = [0u8; 64];
        while matches!(b.read(&mut buf), Ok(n) if n > 0) {}
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call sends its byte and takes it back: nothing piles up in the pair.
    #[test]
    fn a_touch_sends_a_byte_and_reads_it_back() {
        for _ in 0..1000 {
            assert!(touch());
        }
        PAIR.with_borrow_mut(|pair| {
            let Some(Ok((_, b))) = pair else { panic!("the pair was made") };
            let mut buf = [0u8; 8];
            assert!(b.read(&mut buf).is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock), "nothing left to read");
        });
    }
}
