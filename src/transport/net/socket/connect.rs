//! The connecting side: a control socket and the data sockets dialed one by one, each
//! introduced by its hello, without waiting.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use socket2::Socket;

use super::super::{Connecting, SendComm};
use super::conn::{Conn, Slots};
use super::nonblock::{poll_fds, send_some};
use super::send::SocketSend;
use super::{CONNECT_TIMEOUT, HELLO_BYTES};
use crate::debug::Subsys;
use crate::error::{Error, Result};

pub(super) struct Dialing {
    pub(super) sock: Socket,
    pub(super) hello: [u8; HELLO_BYTES],
    /// `None` until the TCP connection is up; then how much of the hello went out.
    pub(super) sent: Option<usize>,
}

pub(super) struct SocketConnecting {
    pub(super) addr: SocketAddr,
    pub(super) socks: Vec<Dialing>,
    pub(super) deadline: Instant,
}

impl Connecting for SocketConnecting {
    fn poll(&mut self) -> Result<Option<Box<dyn SendComm>>> {
        let addr = self.addr;
        let lost = |e: io::Error| Error::Remote(format!("NET/Socket: cannot connect to {addr}: {e}"));
        for d in &mut self.socks {
            if d.sent.is_none() {
                let mut fd = [libc::pollfd { fd: d.sock.as_raw_fd(), events: libc::POLLOUT, revents: 0 }];
                poll_fds(&mut fd, Duration::ZERO);
                if fd[0].revents == 0 {
                    continue;
                }
                if let Some(e) = d.sock.take_error().map_err(lost)? {
                    return Err(lost(e));
                }
                d.sent = Some(0);
            }
            let sent = d.sent.expect("set above");
            if sent < HELLO_BYTES {
                if let Some(n) = send_some(d.sock.as_raw_fd(), &d.hello[sent..]).map_err(lost)? {
                    d.sent = Some(sent + n);
                }
            }
        }
        if self.socks.iter().all(|d| d.sent == Some(HELLO_BYTES)) {
            // The comm is authenticated above the net, by its first message (`conn.rs`), so that
            // plugins' connections are too.
            let mut socks = std::mem::take(&mut self.socks).into_iter().map(|d| TcpStream::from(d.sock));
            let ctrl = socks.next().expect("a control socket");
            let comm = Conn::new(ctrl, socks.collect(), addr, true)?;
            crate::nccl_trace!(Subsys::NET, "NET/Socket: connected to {addr}");
            return Ok(Some(Box::new(SocketSend { conn: comm, reqs: Slots::new(), order: VecDeque::new() })));
        }
        if Instant::now() > self.deadline {
            return Err(Error::Remote(format!("NET/Socket: no connection to {addr} within {CONNECT_TIMEOUT:?}")));
        }
        Ok(None)
    }
}
