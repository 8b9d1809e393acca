//! The built-in "Socket" net: NCCL's net API over TCP, host memory only (`docs/NET.md`).
//!
//! A connection is one control socket plus `NCCL_NSOCKS_PERTHREAD × NCCL_SOCKET_NTHREADS` data
//! sockets (at most 64, over at most 16 helper threads). Every message starts with a 16-byte
//! header on the control socket (tag, size). A message under [`MIN_CHUNK`] follows inline on
//! the control socket; a larger one is cut into chunks of at least [`MIN_CHUNK`], each sent on
//! the next data socket in turn behind its own 16-byte chunk header (sequence, length, offset),
//! which the receiver checks, so garbage on a data socket is an error and not silent corruption.
//! Both ends assign chunks to sockets by the same rule, in message order.
//!
//! The caller's thread moves control bytes inside `isend`/`irecv`/`test`; the helper threads
//! move chunks. Nothing waits without a bound: helpers poll with a short timeout and stop when
//! their comm closes, and a peer that vanishes turns every request of the comm into an error
//! that names it.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use socket2::{Domain, Protocol, Socket, Type};

use super::{
    check_recv, Connecting, Handle, Listener, MemHandle, Net, Properties, PtrKind, RecvBuf, RecvComm, Request,
    SendComm, MAX_RECVS, MAX_REQUESTS,
};
use crate::bootstrap::auth::random_bytes;
use crate::bootstrap::net::{interfaces, IfRule};
use crate::debug::Subsys;
use crate::error::{Error, Result};

/// The name `NCCL_NET` selects this net by.
pub const NAME: &str = "Socket";

crate::int_param!(
    /// Helper threads per connection (NCCL_SOCKET_NTHREADS), 1 to 16.
    socket_nthreads, "NCCL_SOCKET_NTHREADS", 1
);
crate::int_param!(
    /// Data sockets per helper thread (NCCL_NSOCKS_PERTHREAD); at most 64 sockets in all.
    nsocks_perthread, "NCCL_NSOCKS_PERTHREAD", 1
);

/// At most this many data sockets per connection, as NCCL.
pub const MAX_SOCKS: usize = 64;
/// At most this many helper threads per connection, as NCCL.
pub const MAX_THREADS: usize = 16;
/// Smallest chunk a message is cut into; smaller messages go inline on the control socket.
pub const MIN_CHUNK: usize = 64 << 10;
/// Largest chunk, so that a chunk's length fits its header's 32 bits.
const MAX_CHUNK: usize = 1 << 30;
/// At most this many interfaces become devices, as NCCL.
const MAX_IFS: usize = 16;
/// How long a connection may take to connect and say hello.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an accepted connection may take to send its hello, and a connection's sockets to
/// all arrive.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections read at once by a listener; more wait in the kernel's backlog.
const MAX_PENDING: usize = 128;
/// Connections a listener gathers sockets for at once; hellos for more are dropped.
const MAX_GROUPS: usize = 64;
/// How long a helper thread sleeps in `poll` before it checks whether its comm closed.
const HELPER_NAP: Duration = Duration::from_millis(50);
/// Bytes a helper moves on one socket before it turns to its next one.
const HELPER_SLICE: usize = 1 << 20;

const HANDLE_MAGIC: &[u8; 8] = b"FNSOCK\x00\x01";
const HELLO_MAGIC: &[u8; 8] = b"FNSKHELO";
const HELLO_BYTES: usize = 32;
const HDR_BYTES: usize = 16;

// ---------------------------------------------------------------------------------------------
// Interfaces

/// The devices of the Socket net: one address per interface, in NCCL's order of preference
/// (the bootstrap's [`IfRule`]).
pub fn select_interfaces() -> Result<Vec<(String, IpAddr)>> {
    pick_interfaces(&IfRule::from_env()?, &interfaces())
}

/// The pure part of [`select_interfaces`]: an empty result is an error that names the spec and
/// lists every interface there is (NCCL says nothing there).
pub fn pick_interfaces(rule: &IfRule, all: &[(String, IpAddr)]) -> Result<Vec<(String, IpAddr)>> {
    let (spec, v6) = (rule.spec.as_deref(), rule.v6);
    let mut picked: Vec<(String, IpAddr)> = Vec::new();
    for (name, ip) in rule.select(all) {
        if picked.len() < MAX_IFS && !picked.iter().any(|(n, _)| *n == name) {
            picked.push((name, ip));
        }
    }
    if !picked.is_empty() {
        return Ok(picked);
    }
    let listing = if all.is_empty() {
        "none".to_string()
    } else {
        all.iter().map(|(n, ip)| format!("{n} ({ip})")).collect::<Vec<_>>().join(", ")
    };
    let fam = match v6 {
        None => String::new(),
        Some(v6) => format!(" with NCCL_SOCKET_FAMILY={}", if v6 { "AF_INET6" } else { "AF_INET" }),
    };
    Err(Error::InvalidUsage(match spec {
        Some(s) => format!(
            "NET/Socket: NCCL_SOCKET_IFNAME={s} matches no usable interface{fam}. Interfaces that are up: {listing}. \
             Use a name prefix (eth), ^ to exclude (^docker,lo) or = for exact names (=eth0)"
        ),
        None => format!("NET/Socket: no usable network interface{fam}. Interfaces that are up: {listing}"),
    }))
}

fn link_speed_mbps(ifname: &str) -> i32 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(10_000)
}

// ---------------------------------------------------------------------------------------------
// Wire formats

fn encode_handle(nonce: u64, addr: SocketAddr) -> Handle {
    let mut h = [0u8; super::HANDLE_BYTES];
    h[..8].copy_from_slice(HANDLE_MAGIC);
    h[8..16].copy_from_slice(&nonce.to_le_bytes());
    h[16..18].copy_from_slice(&addr.port().to_le_bytes());
    match addr.ip() {
        IpAddr::V4(v4) => {
            h[18] = 4;
            h[19..23].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            h[18] = 6;
            h[19..35].copy_from_slice(&v6.octets());
        }
    }
    h
}

fn decode_handle(h: &Handle) -> Result<(u64, SocketAddr)> {
    if &h[..8] != HANDLE_MAGIC {
        return Err(Error::InvalidArgument("connect: the handle is not one the Socket net's listen made".into()));
    }
    let nonce = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    let port = u16::from_le_bytes([h[16], h[17]]);
    let ip = match h[18] {
        4 => IpAddr::from(<[u8; 4]>::try_from(&h[19..23]).expect("4 bytes")),
        6 => IpAddr::from(<[u8; 16]>::try_from(&h[19..35]).expect("16 bytes")),
        f => return Err(Error::InvalidArgument(format!("connect: the handle holds an unknown address family {f}"))),
    };
    Ok((nonce, SocketAddr::new(ip, port)))
}

/// What a connecting socket says first: which listener it wants (the handle's nonce), which
/// connection it belongs to, its place in it and the connection's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub nonce: u64,
    pub conn: u64,
    /// 0: the control socket; 1..=nsocks: data sockets.
    pub index: u16,
    pub nsocks: u16,
    pub nthreads: u16,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[..8].copy_from_slice(HELLO_MAGIC);
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..24].copy_from_slice(&self.conn.to_le_bytes());
        b[24..26].copy_from_slice(&self.index.to_le_bytes());
        b[26..28].copy_from_slice(&self.nsocks.to_le_bytes());
        b[28..30].copy_from_slice(&self.nthreads.to_le_bytes());
        b
    }

    /// Parses and bounds a hello; the error says what was wrong with it.
    fn decode(b: &[u8; HELLO_BYTES], nonce: u64) -> std::result::Result<Hello, String> {
        if &b[..8] != HELLO_MAGIC {
            return Err("not a ferronickel net hello".into());
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let h = Hello {
            nonce: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            conn: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            index: u16_at(24),
            nsocks: u16_at(26),
            nthreads: u16_at(28),
        };
        if h.nonce != nonce {
            return Err("a hello for another listener (stale or forged handle)".into());
        }
        if h.nsocks == 0
            || h.nsocks as usize > MAX_SOCKS
            || h.nthreads == 0
            || h.nthreads as usize > MAX_THREADS
            || h.nthreads > h.nsocks
        {
            return Err(format!("{} data sockets over {} threads is out of bounds", h.nsocks, h.nthreads));
        }
        if h.index > h.nsocks {
            return Err(format!("socket index {} of {}", h.index, h.nsocks));
        }
        Ok(h)
    }
}

/// The header of a message on the control socket.
pub(crate) fn msg_header(tag: i32, size: u64) -> [u8; HDR_BYTES] {
    let mut b = [0u8; HDR_BYTES];
    b[..4].copy_from_slice(&tag.to_le_bytes());
    b[8..].copy_from_slice(&size.to_le_bytes());
    b
}

/// The header of a chunk on a data socket.
pub(crate) fn chunk_header(seq: u32, len: u32, offset: u64) -> [u8; HDR_BYTES] {
    let mut b = [0u8; HDR_BYTES];
    b[..4].copy_from_slice(&seq.to_le_bytes());
    b[4..8].copy_from_slice(&len.to_le_bytes());
    b[8..].copy_from_slice(&offset.to_le_bytes());
    b
}

/// How a message of `size` bytes is cut: `(offset, len)` of each chunk; empty for a message
/// that goes inline. One chunk per data socket at most, each at least [`MIN_CHUNK`] long but
/// the last, which may fall short of it by less than one byte per chunk; more chunks only where
/// one would pass [`MAX_CHUNK`].
pub(crate) fn chunks(size: usize, nsocks: usize) -> Vec<(usize, usize)> {
    if size < MIN_CHUNK {
        return Vec::new();
    }
    let n = (size / MIN_CHUNK).clamp(1, nsocks).max(size.div_ceil(MAX_CHUNK));
    let len = size.div_ceil(n);
    (0..n).map(|i| (i * len, len.min(size - (i * len).min(size)))).filter(|&(_, l)| l > 0).collect()
}

// ---------------------------------------------------------------------------------------------
// Non-blocking I/O that never raises SIGPIPE

/// Runs one non-blocking socket call again while it is interrupted: `Ok(None)` when it would
/// block, else the byte count it returned.
fn nonblocking(mut call: impl FnMut() -> isize) -> io::Result<Option<usize>> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// Sends what the socket takes now: `Ok(None)` if it takes nothing.
fn send_some(fd: RawFd, buf: &[u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is valid for reads of buf.len() bytes; MSG_NOSIGNAL turns a dead peer into
    // EPIPE instead of a signal that would kill a C host program.
    nonblocking(|| unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) })
}

/// As [`send_some`], for several buffers in one call (`sendmsg`).
///
/// # Safety
/// Every iovec must describe memory valid for reads during the call.
unsafe fn send_iov(fd: RawFd, iov: &[libc::iovec]) -> io::Result<Option<usize>> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: the caller vouches for the iovecs; flags as in send_some.
    nonblocking(|| unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) })
}

/// Receives what is there now: `Ok(None)` if nothing is, `Ok(Some(0))` at end of stream.
fn recv_some(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    nonblocking(|| unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) })
}

fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    // SAFETY: fds is a valid array of fds.len() pollfd structs for the duration of the call.
    unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout.as_millis().min(i32::MAX as u128) as i32)
    };
}

// ---------------------------------------------------------------------------------------------
// The net

/// The built-in Socket net: one device per chosen interface.
pub struct SocketNet {
    ifs: Vec<(String, IpAddr)>,
}

impl SocketNet {
    /// Chooses the interfaces (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`); fails, naming the
    /// spec and the interfaces there are, when none fits.
    pub fn new() -> Result<SocketNet> {
        let ifs = select_interfaces()?;
        let list: Vec<String> = ifs.iter().enumerate().map(|(i, (n, ip))| format!("[{i}]{n}:{ip}")).collect();
        crate::nccl_info!(
            Subsys::INIT | Subsys::NET,
            "NET/Socket: using {} ({} threads × {} sockets per connection)",
            list.join(" "),
            shape().1,
            shape().0 / shape().1
        );
        Ok(SocketNet { ifs })
    }

    fn dev(&self, dev: usize) -> Result<&(String, IpAddr)> {
        self.ifs.get(dev).ok_or_else(|| {
            Error::InvalidArgument(format!("NET/Socket: device {dev} out of range ({} devices)", self.ifs.len()))
        })
    }
}

/// `(data sockets, helper threads)` of a new connection, from the environment, bounded.
fn shape() -> (usize, usize) {
    let threads = socket_nthreads().clamp(1, MAX_THREADS as i64) as usize;
    let per = nsocks_perthread().clamp(1, MAX_SOCKS as i64) as usize;
    ((threads * per).min(MAX_SOCKS), threads)
}

impl Net for SocketNet {
    fn name(&self) -> &str {
        NAME
    }

    fn devices(&self) -> usize {
        self.ifs.len()
    }

    fn properties(&self, dev: usize) -> Result<Properties> {
        let (name, _) = self.dev(dev)?;
        Ok(Properties {
            name: name.clone(),
            pci_path: None,
            guid: dev as u64,
            ptr_support: super::abi::NCCL_PTR_HOST,
            reg_is_global: false,
            force_flush: false,
            speed_mbps: link_speed_mbps(name),
            port: 0,
            latency_us: 0.0,
            max_comms: 65536,
            max_recvs: MAX_RECVS,
            max_p2p_bytes: usize::MAX,
            max_coll_bytes: usize::MAX,
        })
    }

    fn listen(&self, dev: usize) -> Result<(Handle, Box<dyn Listener>)> {
        let (name, ip) = self.dev(dev)?;
        let addr = SocketAddr::new(*ip, 0);
        let bound = (|| -> io::Result<TcpListener> {
            let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
            s.bind(&addr.into())?;
            s.listen(1024)?;
            s.set_nonblocking(true)?;
            Ok(s.into())
        })()
        .map_err(|e| Error::System(format!("NET/Socket: cannot listen on {name} ({ip}): {e}")))?;
        let local = bound.local_addr()?;
        let nonce = u64::from_le_bytes(random_bytes()?);
        crate::nccl_trace!(Subsys::NET, "NET/Socket: listening on {local}");
        Ok((
            encode_handle(nonce, local),
            Box::new(SocketListen { listener: bound, local, nonce, pending: Vec::new(), groups: HashMap::new() }),
        ))
    }

    fn connect(&self, dev: usize, handle: &Handle) -> Result<Box<dyn Connecting>> {
        self.dev(dev)?;
        let (nonce, addr) = decode_handle(handle)?;
        let (nsocks, nthreads) = shape();
        let conn = u64::from_le_bytes(random_bytes()?);
        let socks = (0..=nsocks)
            .map(|i| {
                let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
                s.set_nonblocking(true)?;
                s.set_nodelay(true)?;
                match s.connect(&addr.into()) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                    Err(e) => return Err(e),
                }
                let hello = Hello { nonce, conn, index: i as u16, nsocks: nsocks as u16, nthreads: nthreads as u16 };
                Ok(Dialing { sock: s, hello: hello.encode(), sent: None })
            })
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| Error::System(format!("NET/Socket: cannot connect to {addr}: {e}")))?;
        Ok(Box::new(SocketConnecting { addr, socks, nthreads, deadline: Instant::now() + CONNECT_TIMEOUT }))
    }
}

// ---------------------------------------------------------------------------------------------
// Connecting

struct Dialing {
    sock: Socket,
    hello: [u8; HELLO_BYTES],
    /// `None` until the TCP connection is up; then how much of the hello went out.
    sent: Option<usize>,
}

struct SocketConnecting {
    addr: SocketAddr,
    socks: Vec<Dialing>,
    nthreads: usize,
    deadline: Instant,
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
            let comm = Conn::new(ctrl, socks.collect(), self.nthreads, addr, true)?;
            crate::nccl_trace!(Subsys::NET, "NET/Socket: connected to {addr}");
            return Ok(Some(Box::new(SocketSend { conn: comm, reqs: Slots::new(), order: VecDeque::new() })));
        }
        if Instant::now() > self.deadline {
            return Err(Error::Remote(format!("NET/Socket: no connection to {addr} within {CONNECT_TIMEOUT:?}")));
        }
        Ok(None)
    }
}

// ---------------------------------------------------------------------------------------------
// Listening

struct PendingConn {
    stream: TcpStream,
    from: SocketAddr,
    buf: [u8; HELLO_BYTES],
    got: usize,
    expires: Instant,
}

/// The sockets of one connection gathered so far.
struct Group {
    peer: SocketAddr,
    nsocks: u16,
    nthreads: u16,
    socks: Vec<Option<TcpStream>>,
    expires: Instant,
}

struct SocketListen {
    listener: TcpListener,
    local: SocketAddr,
    nonce: u64,
    pending: Vec<PendingConn>,
    groups: HashMap<u64, Group>,
}

impl SocketListen {
    fn take_new(&mut self) {
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
    fn read_hellos(&mut self) {
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

    fn join_group(&mut self, h: Hello, p: PendingConn) {
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
        let conn = Conn::new(ctrl, socks.collect(), g.nthreads as usize, g.peer, false)?;
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

// ---------------------------------------------------------------------------------------------
// Helper threads and the connection they serve

/// A chunk for a helper thread: header first, then the payload, to or from the caller's memory.
struct Task {
    hdr: [u8; HDR_BYTES],
    hdr_done: usize,
    ptr: usize,
    len: usize,
    done: usize,
    pending: Arc<AtomicUsize>,
}

/// What the comm and its helper threads share.
struct Shared {
    peer: SocketAddr,
    send: bool,
    /// One queue per data socket, in chunk order.
    queues: Vec<Mutex<VecDeque<Task>>>,
    /// One wake-up per helper thread.
    wake: Vec<(Mutex<bool>, Condvar)>,
    stop: AtomicBool,
    /// The first failure of the connection; every later call reports it.
    error: Mutex<Option<String>>,
}

impl Shared {
    fn fail(&self, msg: String) {
        let mut e = self.error.lock();
        if e.is_none() {
            *e = Some(msg);
        }
    }

    fn check(&self) -> Result<()> {
        match self.error.lock().as_ref() {
            Some(m) => Err(Error::Remote(m.clone())),
            None => Ok(()),
        }
    }
}

/// The state of a connection common to both directions.
struct Conn {
    ctrl: TcpStream,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    nthreads: usize,
    next_sock: usize,
    seq: u32,
}

impl Conn {
    fn new(ctrl: TcpStream, data: Vec<TcpStream>, nthreads: usize, peer: SocketAddr, send: bool) -> Result<Conn> {
        ctrl.set_nonblocking(true)?;
        let nsocks = data.len();
        let shared = Arc::new(Shared {
            peer,
            send,
            queues: (0..nsocks).map(|_| Mutex::new(VecDeque::new())).collect(),
            wake: (0..nthreads).map(|_| (Mutex::new(false), Condvar::new())).collect(),
            stop: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        let mut mine: Vec<Vec<(usize, TcpStream)>> = (0..nthreads).map(|_| Vec::new()).collect();
        for (i, s) in data.into_iter().enumerate() {
            s.set_nonblocking(true)?;
            mine[i % nthreads].push((i, s));
        }
        let mut conn = Conn { ctrl, shared: shared.clone(), threads: Vec::new(), nthreads, next_sock: 0, seq: 0 };
        for (t, socks) in mine.into_iter().enumerate() {
            let sh = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("fn-net-{}", if send { "send" } else { "recv" }))
                .spawn(move || helper(sh, t, socks))
                .map_err(|e| Error::System(format!("NET/Socket: cannot start a helper thread: {e}")))?;
            conn.threads.push(h);
        }
        Ok(conn)
    }

    fn nsocks(&self) -> usize {
        self.shared.queues.len()
    }

    /// Queues the chunks of the next message (`ptr`, `size`) on the data sockets, in turn.
    fn post_chunks(&mut self, ptr: usize, size: usize, pending: &Arc<AtomicUsize>) {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let parts = chunks(size, self.nsocks());
        pending.fetch_add(parts.len(), Ordering::AcqRel);
        let mut woken = vec![false; self.nthreads];
        for (off, len) in parts {
            let sock = self.next_sock;
            self.next_sock = (self.next_sock + 1) % self.nsocks();
            let task = Task {
                hdr: chunk_header(seq, len as u32, off as u64),
                hdr_done: 0,
                ptr: ptr + off,
                len,
                done: 0,
                pending: pending.clone(),
            };
            self.shared.queues[sock].lock().push_back(task);
            woken[sock % self.nthreads] = true;
        }
        for t in (0..self.nthreads).filter(|&t| woken[t]) {
            let (m, cv) = &self.shared.wake[t];
            *m.lock() = true;
            cv.notify_one();
        }
    }

    fn fail(&self, msg: String) -> Error {
        self.shared.fail(msg);
        self.shared.check().expect_err("just failed")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for (m, cv) in &self.shared.wake {
            *m.lock() = true;
            cv.notify_one();
        }
        // Each helper notices `stop` within HELPER_NAP.
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A helper thread: moves the chunks queued on its sockets until the comm closes or fails.
fn helper(sh: Arc<Shared>, me: usize, socks: Vec<(usize, TcpStream)>) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(socks.len());
    while !sh.stop.load(Ordering::Acquire) && sh.error.lock().is_none() {
        fds.clear();
        let mut moved = false;
        for (i, s) in &socks {
            let mut q = sh.queues[*i].lock();
            let Some(task) = q.front_mut() else { continue };
            match step(&sh, *i, s.as_raw_fd(), task) {
                Ok((n, finished)) => {
                    moved |= n > 0;
                    if finished {
                        let t = q.pop_front().expect("front exists");
                        t.pending.fetch_sub(1, Ordering::AcqRel);
                        moved = true;
                    } else {
                        let ev = if sh.send { libc::POLLOUT } else { libc::POLLIN };
                        fds.push(libc::pollfd { fd: s.as_raw_fd(), events: ev, revents: 0 });
                    }
                }
                Err(msg) => {
                    sh.fail(msg);
                    return;
                }
            }
        }
        if moved {
            continue;
        }
        if fds.is_empty() {
            let (m, cv) = &sh.wake[me];
            let mut flag = m.lock();
            if !*flag {
                cv.wait_for(&mut flag, HELPER_NAP);
            }
            *flag = false;
        } else {
            poll_fds(&mut fds, HELPER_NAP);
        }
    }
}

/// Moves up to HELPER_SLICE bytes of one chunk; `(bytes moved, chunk finished)`, or the error
/// that ends the connection, naming the peer and the socket.
fn step(sh: &Shared, sock: usize, fd: RawFd, t: &mut Task) -> std::result::Result<(usize, bool), String> {
    let peer = sh.peer;
    let mut moved = 0;
    let io_err = |e: io::Error, t: &Task| {
        format!(
            "NET/Socket: connection with {peer} failed on data socket {sock} after {} of {} bytes of a chunk: {e}",
            t.done, t.len
        )
    };
    let eof = |t: &Task| {
        format!(
            "NET/Socket: {peer} closed data socket {sock} mid-message ({} of {} bytes of a chunk received)",
            t.done, t.len
        )
    };
    while t.hdr_done < HDR_BYTES {
        let r = if sh.send {
            send_some(fd, &t.hdr[t.hdr_done..])
        } else {
            let mut got = [0u8; HDR_BYTES];
            let want = HDR_BYTES - t.hdr_done;
            recv_some(fd, &mut got[..want]).map(|n| {
                if let Some(n) = n.filter(|&n| n > 0) {
                    let at = t.hdr_done;
                    if got[..n] != t.hdr[at..at + n] {
                        return Some(usize::MAX);
                    }
                }
                n
            })
        };
        match r.map_err(|e| io_err(e, t))? {
            None => return Ok((moved, false)),
            Some(0) if !sh.send => return Err(eof(t)),
            Some(usize::MAX) => {
                return Err(format!(
                    "NET/Socket: garbage on data socket {sock} from {peer}: the chunk header is not the one expected \
                     (sequence {}, {} bytes at offset {})",
                    u32::from_le_bytes(t.hdr[..4].try_into().expect("4")),
                    t.len,
                    u64::from_le_bytes(t.hdr[8..].try_into().expect("8"))
                ))
            }
            Some(n) => {
                t.hdr_done += n;
                moved += n;
            }
        }
    }
    while t.done < t.len && moved < HELPER_SLICE {
        let want = (t.len - t.done).min(HELPER_SLICE);
        let p = (t.ptr + t.done) as *mut u8;
        let r = if sh.send {
            // SAFETY: the caller of isend keeps ptr..ptr+len valid until the request completes
            // or the comm closes, and the comm joins this thread before it closes.
            send_some(fd, unsafe { std::slice::from_raw_parts(p, want) })
        } else {
            // SAFETY: as above, for the buffer posted with irecv; only this task writes there.
            recv_some(fd, unsafe { std::slice::from_raw_parts_mut(p, want) })
        };
        match r.map_err(|e| io_err(e, t))? {
            None => return Ok((moved, false)),
            Some(0) if !sh.send => return Err(eof(t)),
            Some(n) => {
                t.done += n;
                moved += n;
            }
        }
    }
    Ok((moved, t.done == t.len))
}

// ---------------------------------------------------------------------------------------------
// Request slots

/// Up to MAX_REQUESTS requests; a request's id carries its slot and a generation, so a stale or
/// forged request is refused rather than mistaken for another.
struct Slots<T> {
    slots: Vec<Option<(u32, T)>>,
    gen: u32,
}

impl<T> Slots<T> {
    fn new() -> Self {
        Slots { slots: (0..MAX_REQUESTS).map(|_| None).collect(), gen: 0 }
    }

    fn insert(&mut self, v: T) -> Option<Request> {
        let i = self.slots.iter().position(Option::is_none)?;
        self.gen = self.gen.wrapping_add(1);
        self.slots[i] = Some((self.gen, v));
        Some(Request(((self.gen as usize) << 8) | i))
    }

    fn index(&self, r: &Request) -> Result<usize> {
        let i = r.0 & 0xff;
        match self.slots.get(i) {
            Some(Some((g, _))) if *g as usize == r.0 >> 8 => Ok(i),
            _ => Err(Error::InvalidArgument(format!("test: request {:#x} is not in flight on this comm", r.0))),
        }
    }

    fn get(&mut self, i: usize) -> &mut T {
        &mut self.slots[i].as_mut().expect("slot in use").1
    }

    fn remove(&mut self, i: usize) -> T {
        self.slots[i].take().expect("slot in use").1
    }
}

fn host_only(kind: PtrKind) -> Result<MemHandle> {
    match kind {
        PtrKind::Host => Ok(MemHandle(PtrKind::Host as usize)),
        PtrKind::Cuda => Err(Error::InvalidArgument(
            "regMr: the Socket net moves host memory only (ptrSupport NCCL_PTR_HOST); CUDA buffers go through a host FIFO".into(),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Sending

struct SendReq {
    ptr: usize,
    size: usize,
    /// Control bytes (header, then an inline payload) written so far.
    written: usize,
    hdr: [u8; HDR_BYTES],
    pending: Arc<AtomicUsize>,
}

struct SocketSend {
    conn: Conn,
    reqs: Slots<SendReq>,
    /// Requests whose control bytes are not all written, in posting order.
    order: VecDeque<usize>,
}

/// Messages whose control bytes (header and inline payload) go out in one `sendmsg`.
const SEND_BATCH: usize = 8;

impl SocketSend {
    /// Writes the control bytes of the queued messages, several at a time, and hands the chunks
    /// of each fully announced large message to the helper threads, in order.
    fn progress(&mut self) -> Result<()> {
        self.conn.shared.check()?;
        let peer = self.conn.shared.peer;
        let fd = self.conn.ctrl.as_raw_fd();
        while !self.order.is_empty() {
            let mut iov = Vec::with_capacity(2 * SEND_BATCH);
            for &i in self.order.iter().take(SEND_BATCH) {
                let r = self.reqs.get(i);
                let inline = r.inline();
                let hdr = &r.hdr[r.written.min(HDR_BYTES)..];
                let off = r.written.saturating_sub(HDR_BYTES);
                iov.push(libc::iovec { iov_base: hdr.as_ptr() as *mut libc::c_void, iov_len: hdr.len() });
                iov.push(libc::iovec { iov_base: (r.ptr + off) as *mut libc::c_void, iov_len: inline - off });
            }
            // SAFETY: each header lives in its request's slot, which stays put until the request
            // leaves `order`; each payload is the isend caller's, valid until completion.
            let mut n = match unsafe { send_iov(fd, &iov) } {
                Ok(Some(n)) => n,
                Ok(None) => return Ok(()),
                Err(e) => {
                    return Err(self
                        .conn
                        .fail(format!("NET/Socket: lost the connection to {peer} (control socket): {e}")))
                }
            };
            while let Some(&i) = self.order.front() {
                let r = self.reqs.get(i);
                let take = n.min(HDR_BYTES + r.inline() - r.written);
                r.written += take;
                n -= take;
                if r.written < HDR_BYTES + r.inline() {
                    break;
                }
                let (ptr, size, pending) = (r.ptr, r.size, r.pending.clone());
                if size >= MIN_CHUNK {
                    self.conn.post_chunks(ptr, size, &pending);
                }
                self.order.pop_front();
            }
        }
        Ok(())
    }
}

impl SendReq {
    /// Bytes of the message that follow its header on the control socket.
    fn inline(&self) -> usize {
        if self.size < MIN_CHUNK {
            self.size
        } else {
            0
        }
    }
}

impl SendComm for SocketSend {
    fn reg_mr(&mut self, _data: *mut u8, _size: usize, kind: PtrKind) -> Result<MemHandle> {
        host_only(kind)
    }

    fn dereg_mr(&mut self, _mr: MemHandle) -> Result<()> {
        Ok(())
    }

    unsafe fn isend(&mut self, data: *const u8, size: usize, tag: i32, _mr: &MemHandle) -> Result<Option<Request>> {
        if data.is_null() && size > 0 {
            return Err(Error::InvalidArgument(format!("isend: NULL buffer of {size} bytes")));
        }
        self.conn.shared.check()?;
        let req = SendReq {
            ptr: data as usize,
            size,
            written: 0,
            hdr: msg_header(tag, size as u64),
            pending: Arc::new(AtomicUsize::new(0)),
        };
        let Some(r) = self.reqs.insert(req) else { return Ok(None) };
        // Written by the next `test`, together with whatever else was posted before it.
        self.order.push_back(r.0 & 0xff);
        Ok(Some(r))
    }

    fn test(&mut self, req: &Request) -> Result<Option<usize>> {
        let i = self.reqs.index(req)?;
        if let Err(e) = self.progress() {
            self.reqs.remove(i);
            return Err(e);
        }
        let r = self.reqs.get(i);
        let control_written = !self.order.contains(&i);
        if control_written && r.pending.load(Ordering::Acquire) == 0 {
            return Ok(Some(self.reqs.remove(i).size));
        }
        Ok(None)
    }
}

// ---------------------------------------------------------------------------------------------
// Receiving

/// A posted buffer: address, capacity, tag.
struct Posted {
    ptr: usize,
    size: usize,
    tag: i32,
}

struct RecvReq {
    bufs: Vec<Posted>,
    /// Bytes each buffer received (`None` until a message is matched to it).
    got: Vec<Option<usize>>,
    pending: Arc<AtomicUsize>,
}

/// An inline payload being read from the control socket.
struct Inline {
    req: usize,
    ptr: usize,
    size: usize,
    done: usize,
}

/// Bytes the control socket is read ahead by: a few small messages (a header and its inline
/// payload each) come in with one `recv` instead of two per message.
const READ_AHEAD: usize = 4096;

/// The control socket's read-ahead: bytes received but not yet consumed.
struct ReadAhead {
    buf: Box<[u8; READ_AHEAD]>,
    lo: usize,
    hi: usize,
}

impl ReadAhead {
    fn new() -> ReadAhead {
        ReadAhead { buf: Box::new([0; READ_AHEAD]), lo: 0, hi: 0 }
    }

    /// As [`recv_some`] (`Ok(Some(0))` only at the end of the stream), served from the bytes read
    /// ahead first; a large read into an empty read-ahead goes straight to `dst`.
    fn read(&mut self, fd: RawFd, dst: &mut [u8]) -> io::Result<Option<usize>> {
        if self.lo == self.hi {
            if dst.len() >= READ_AHEAD {
                return recv_some(fd, dst);
            }
            match recv_some(fd, &mut self.buf[..])? {
                Some(0) => return Ok(Some(0)),
                Some(n) => (self.lo, self.hi) = (0, n),
                None => return Ok(None),
            }
        }
        let n = dst.len().min(self.hi - self.lo);
        dst[..n].copy_from_slice(&self.buf[self.lo..self.lo + n]);
        self.lo += n;
        Ok(Some(n))
    }
}

struct SocketRecv {
    conn: Conn,
    reqs: Slots<RecvReq>,
    /// Requests still expecting messages, in posting order.
    order: VecDeque<usize>,
    hdr: [u8; HDR_BYTES],
    hdr_got: usize,
    inline: Option<Inline>,
    ahead: ReadAhead,
}

impl SocketRecv {
    fn progress(&mut self) -> Result<()> {
        self.conn.shared.check()?;
        let peer = self.conn.shared.peer;
        let fd = self.conn.ctrl.as_raw_fd();
        loop {
            if let Some(inl) = &mut self.inline {
                while inl.done < inl.size {
                    // SAFETY: the irecv caller keeps the matched buffer valid, and its size was
                    // checked against the message size before this read was set up.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut((inl.ptr + inl.done) as *mut u8, inl.size - inl.done) };
                    match self.ahead.read(fd, dst) {
                        Ok(Some(0)) => {
                            let m = format!(
                                "NET/Socket: {peer} closed the connection mid-message ({} of {} bytes received)",
                                inl.done, inl.size
                            );
                            return Err(self.conn.fail(m));
                        }
                        Ok(Some(n)) => inl.done += n,
                        Ok(None) => return Ok(()),
                        Err(e) => {
                            return Err(self.conn.fail(format!("NET/Socket: lost the connection to {peer}: {e}")))
                        }
                    }
                }
                let req = inl.req;
                self.inline = None;
                self.finish_message(req);
                continue;
            }
            let Some(&i) = self.order.front() else { return Ok(()) };
            while self.hdr_got < HDR_BYTES {
                match self.ahead.read(fd, &mut self.hdr[self.hdr_got..]) {
                    Ok(Some(0)) => {
                        let left = self.reqs.get(i).got.iter().filter(|g| g.is_none()).count();
                        let m = format!("NET/Socket: {peer} closed the connection while {left} posted receive(s) still expected data");
                        return Err(self.conn.fail(m));
                    }
                    Ok(Some(n)) => self.hdr_got += n,
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(self.conn.fail(format!("NET/Socket: lost the connection to {peer}: {e}"))),
                }
            }
            self.hdr_got = 0;
            let tag = i32::from_le_bytes(self.hdr[..4].try_into().expect("4"));
            let size = u64::from_le_bytes(self.hdr[8..].try_into().expect("8"));
            let r = self.reqs.get(i);
            let Some(b) = (0..r.bufs.len()).find(|&b| r.bufs[b].tag == tag && r.got[b].is_none()) else {
                let posted: Vec<i32> =
                    (0..r.bufs.len()).filter(|&b| r.got[b].is_none()).map(|b| r.bufs[b].tag).collect();
                let m = format!(
                    "NET/Socket: {peer} sent a message with tag {tag}, but the receive posted expects tags {posted:?}"
                );
                return Err(self.conn.fail(m));
            };
            let cap = r.bufs[b].size;
            if size > cap as u64 {
                let m = format!("NET/Socket: {peer} sent {size} bytes (tag {tag}) to a receive buffer of {cap} bytes");
                return Err(self.conn.fail(m));
            }
            let size = size as usize;
            r.got[b] = Some(size);
            let ptr = r.bufs[b].ptr;
            if size < MIN_CHUNK {
                self.inline = Some(Inline { req: i, ptr, size, done: 0 });
            } else {
                let pending = r.pending.clone();
                self.conn.post_chunks(ptr, size, &pending);
                self.finish_message(i);
            }
        }
    }

    /// After a message of request `i` is matched: retire the request from `order` once all of
    /// its buffers have one.
    fn finish_message(&mut self, i: usize) {
        if self.reqs.get(i).got.iter().all(Option::is_some) && self.order.front() == Some(&i) {
            self.order.pop_front();
        }
    }
}

impl RecvComm for SocketRecv {
    fn reg_mr(&mut self, _data: *mut u8, _size: usize, kind: PtrKind) -> Result<MemHandle> {
        host_only(kind)
    }

    fn dereg_mr(&mut self, _mr: MemHandle) -> Result<()> {
        Ok(())
    }

    unsafe fn irecv(&mut self, bufs: &[RecvBuf], mrs: &[&MemHandle]) -> Result<Option<Request>> {
        check_recv(bufs, mrs, MAX_RECVS)?;
        self.conn.shared.check()?;
        let posted = bufs.iter().map(|b| Posted { ptr: b.data as usize, size: b.size, tag: b.tag }).collect();
        let req = RecvReq { bufs: posted, got: vec![None; bufs.len()], pending: Arc::new(AtomicUsize::new(0)) };
        let Some(r) = self.reqs.insert(req) else { return Ok(None) };
        self.order.push_back(r.0 & 0xff);
        self.progress()?;
        Ok(Some(r))
    }

    fn iflush(&mut self, bufs: &[RecvBuf], mrs: &[&MemHandle]) -> Result<Option<Request>> {
        check_recv(bufs, mrs, MAX_RECVS)?;
        // Host memory: what the helpers wrote is visible once the request completed.
        Ok(None)
    }

    fn test(&mut self, req: &Request) -> Result<Option<Vec<usize>>> {
        let i = self.reqs.index(req)?;
        if let Err(e) = self.progress() {
            self.reqs.remove(i);
            return Err(e);
        }
        let inline_here = self.inline.as_ref().is_some_and(|x| x.req == i);
        let r = self.reqs.get(i);
        if !inline_here && r.got.iter().all(Option::is_some) && r.pending.load(Ordering::Acquire) == 0 {
            let r = self.reqs.remove(i);
            return Ok(Some(r.got.into_iter().map(|g| g.expect("all matched")).collect()));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::Ipv4Addr;

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
        assert_eq!(
            names(pick_interfaces(&rule(Some("^eth"), None), &h).unwrap()),
            ["lo/127.0.0.1", "docker0/172.17.0.1"]
        );
        let many: Vec<(String, IpAddr)> =
            (0..40).map(|i| (format!("eth{i}"), IpAddr::from([10, 0, 0, i as u8]))).collect();
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
        assert!(decode_handle(&[0; 128]).unwrap_err().to_string().contains("not one the Socket net's listen made"));
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
        let net = lo_net();
        let (handle, mut l) = net.listen(0).unwrap();
        let mut socks = fake_sender(&handle, 2);
        let mut r = accept_within(&mut *l, Duration::from_secs(10));
        let mut buf = vec![0u8; 4 * MIN_CHUNK];
        let mr = r.reg_mr(buf.as_mut_ptr(), buf.len(), PtrKind::Host).unwrap();
        let posted = [RecvBuf { data: buf.as_mut_ptr(), size: buf.len(), tag: 5 }];
        // SAFETY: buf outlives r (dropped first, at the end of the scope, in reverse order).
        let req = unsafe { r.irecv(&posted, &[&mr]) }.unwrap().unwrap();
        socks[0].write_all(&msg_header(5, 2 * MIN_CHUNK as u64)).unwrap();
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
        let net = lo_net();
        let (handle, mut l) = net.listen(0).unwrap();
        let mut socks = fake_sender(&handle, 1);
        let mut r = accept_within(&mut *l, Duration::from_secs(10));
        let mut buf = vec![0xA5u8; 1000];
        let mr = r.reg_mr(buf.as_mut_ptr(), 0, PtrKind::Host).unwrap();
        let posted = [RecvBuf { data: buf.as_mut_ptr(), size: 500, tag: 1 }];
        // SAFETY: buf outlives r.
        let req = unsafe { r.irecv(&posted, &[&mr]) }.unwrap().unwrap();
        socks[0].write_all(&msg_header(1, u64::MAX)).unwrap();
        let e = failure(&mut *r, &req);
        assert!(e.contains("sent 18446744073709551615 bytes (tag 1) to a receive buffer of 500 bytes"), "{e}");
        drop(r);
        assert!(buf.iter().all(|&b| b == 0xA5));
    }

    #[test]
    fn a_slow_sender_trickling_bytes_is_received_intact() {
        let net = lo_net();
        let (handle, mut l) = net.listen(0).unwrap();
        let mut socks = fake_sender(&handle, 1);
        let mut r = accept_within(&mut *l, Duration::from_secs(10));
        let (small, big): (Vec<u8>, Vec<u8>) =
            ((0..300).map(|i| i as u8).collect(), (0..MIN_CHUNK + 5).map(|i| (i * 7) as u8).collect());
        let (mut b1, mut b2) = (vec![0xA5u8; 400], vec![0xA5u8; MIN_CHUNK + 100]);
        let mr = r.reg_mr(std::ptr::null_mut(), 0, PtrKind::Host).unwrap();
        let posted = [
            RecvBuf { data: b1.as_mut_ptr(), size: b1.len(), tag: 3 },
            RecvBuf { data: b2.as_mut_ptr(), size: b2.len(), tag: 4 },
        ];
        // SAFETY: b1 and b2 outlive r.
        let req = unsafe { r.irecv(&posted, &[&mr, &mr]) }.unwrap().unwrap();
        // Tag 4 (chunked) first, then tag 3 (inline), every piece a few bytes apart in time.
        let mut ctrl = msg_header(4, big.len() as u64).to_vec();
        ctrl.extend(msg_header(3, small.len() as u64));
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
    fn a_receiver_that_goes_away_fails_the_pending_send_naming_it() {
        let net = lo_net();
        let (handle, mut l) = net.listen(0).unwrap();
        let mut c = net.connect(0, &handle).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let (mut s, mut r) = (None, None);
        while s.is_none() || r.is_none() {
            assert!(Instant::now() < until, "no connection within 10 s");
            s = s.or(c.poll().unwrap());
            r = r.or(l.accept().unwrap());
        }
        let (mut s, r) = (s.unwrap(), r.unwrap());
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
        let until = Instant::now() + Duration::from_secs(10);
        let (mut s, mut r) = (None, None);
        while s.is_none() || r.is_none() {
            assert!(Instant::now() < until, "the honest connection did not complete");
            s = s.or(c.poll().unwrap());
            r = r.or(l.accept().unwrap());
            std::thread::sleep(Duration::from_millis(1));
        }
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
}
