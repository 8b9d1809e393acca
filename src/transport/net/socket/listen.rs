//! The listening side: accepted sockets read for their hellos and grouped by connection; a
//! connection is ready once all its sockets arrived.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::super::{Listener, RecvComm};
use super::conn::{Conn, Slots};
use super::nonblock::recv_some;
use super::recv::{ReadAhead, SocketRecv};
use super::wire::Hello;
use super::{HDR_BYTES, HELLO_BYTES, HELLO_TIMEOUT, MAX_GROUPS, MAX_PENDING};
use crate::debug::Subsys;
use crate::error::Result;

pub(super) struct PendingConn {
    pub(super) stream: TcpStream,
    pub(super) from: SocketAddr,
    pub(super) buf: [u8; HELLO_BYTES],
    pub(super) got: usize,
    pub(super) expires: Instant,
}

/// The sockets of one connection gathered so far.
pub(super) struct Group {
    pub(super) peer: SocketAddr,
    pub(super) nsocks: u16,
    pub(super) nthreads: u16,
    pub(super) socks: Vec<Option<TcpStream>>,
    pub(super) expires: Instant,
}

pub(super) struct SocketListen {
    pub(super) listener: TcpListener,
    pub(super) local: SocketAddr,
    pub(super) nonce: u64,
    pub(super) pending: Vec<PendingConn>,
    pub(super) groups: HashMap<u64, Group>,
}

impl SocketListen {
    pub(super) fn take_new(&mut self) {
        while self.pending.len() < MAX_PENDING {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    if stream.set_nonblocking(true).and_then(|_| stream.set_nodelay(true)).is_ok() {
                        self.pending.push(PendingConn {
                            stream,
                            from,
                            buf: [0; HELLO_BYTES],
                            got: 0,
                            expires: Instant::now() + HELLO_TIMEOUT,
                        });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    crate::nccl_warn!("NET/Socket: accept on {} failed: {e}", self.local);
                    return;
                }
            }
        }
    }

    /// Reads hellos; moves complete, valid ones into their group; drops the rest, saying why.
    pub(super) fn read_hellos(&mut self) {
        let (local, nonce, now) = (self.local, self.nonce, Instant::now());
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let verdict = match recv_some(p.stream.as_raw_fd(), &mut p.buf[p.got..]) {
                Ok(Some(0)) => Some(Err("closed before its hello".to_string())),
                Ok(Some(n)) => {
                    p.got += n;
                    (p.got == HELLO_BYTES).then(|| Hello::decode(&p.buf, nonce))
                }
                Ok(None) if now > p.expires => Some(Err(format!("no hello within {HELLO_TIMEOUT:?}"))),
                Ok(None) => None,
                Err(e) => Some(Err(e.to_string())),
            };
            let Some(verdict) = verdict else {
                i += 1;
                continue;
            };
            let p = self.pending.swap_remove(i);
            match verdict {
                Err(why) => {
                    crate::nccl_warn!("NET/Socket: listener {local} dropped a connection from {}: {why}", p.from)
                }
                Ok(h) => self.join_group(h, p),
            }
        }
    }

    pub(super) fn join_group(&mut self, h: Hello, p: PendingConn) {
        let local = self.local;
        if self.groups.len() >= MAX_GROUPS && !self.groups.contains_key(&h.conn) {
            crate::nccl_warn!("NET/Socket: listener {local} dropped a connection from {}: {MAX_GROUPS} connections are already being set up", p.from);
            return;
        }
        let g = self.groups.entry(h.conn).or_insert_with(|| Group {
            peer: p.from,
            nsocks: h.nsocks,
            nthreads: h.nthreads,
            socks: (0..=h.nsocks).map(|_| None).collect(),
            expires: Instant::now() + HELLO_TIMEOUT,
        });
        if g.nsocks != h.nsocks
            || g.nthreads != h.nthreads
            || g.peer.ip() != p.from.ip()
            || g.socks[h.index as usize].is_some()
        {
            crate::nccl_warn!(
                "NET/Socket: listener {local} dropped a connection from {}: it does not fit connection {:#x} from {}",
                p.from,
                h.conn,
                g.peer
            );
            return;
        }
        if h.index == 0 {
            g.peer = p.from;
        }
        g.socks[h.index as usize] = Some(p.stream);
    }
}

impl Listener for SocketListen {
    fn accept(&mut self) -> Result<Option<Box<dyn RecvComm>>> {
        self.take_new();
        self.read_hellos();
        let now = Instant::now();
        let local = self.local;
        self.groups.retain(|id, g| {
            let keep = g.expires > now || g.socks.iter().all(Option::is_some);
            if !keep {
                let have = g.socks.iter().filter(|s| s.is_some()).count();
                crate::nccl_warn!(
                    "NET/Socket: listener {local} dropped connection {id:#x} from {}: {have} of {} sockets arrived within {HELLO_TIMEOUT:?}",
                    g.peer,
                    g.nsocks as usize + 1
                );
            }
            keep
        });
        let Some(&id) = self.groups.iter().find(|(_, g)| g.socks.iter().all(Option::is_some)).map(|(id, _)| id) else {
            return Ok(None);
        };
        let g = self.groups.remove(&id).expect("found above");
        // The NET transport checks the comm's first message before using it (`conn.rs`).
        let mut socks = g.socks.into_iter().map(|s| s.expect("complete group"));
        let ctrl = socks.next().expect("a control socket");
        let conn = Conn::new(ctrl, socks.collect(), g.peer, false)?;
        crate::nccl_trace!(Subsys::NET, "NET/Socket: accepted a connection from {} on {local}", g.peer);
        Ok(Some(Box::new(SocketRecv {
            conn,
            reqs: Slots::new(),
            order: VecDeque::new(),
            hdr: [0; HDR_BYTES],
            hdr_got: 0,
            inline: None,
            ahead: ReadAhead::new(),
        })))
    }
}
