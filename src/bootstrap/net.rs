//! The socket edge of the bootstrap: interface selection, listeners, framed streams and the
//! acceptor that screens strangers. All sockets are non-blocking and every wait is a `poll`
//! with a deadline, so nothing here can block forever.
//!
//! Interface matching ([`IfSpec`], [`IfRule::select`], [`on_subnet`]) is pure and unit-tested;
//! only [`interface_nets`] and [`IfRule::from_env`] touch the OS.

use std::ffi::CStr;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::auth::{self, Credentials, Nonce, Role};
use super::wire::{self, Msg, RefuseReason, WireError, MAX_CONTROL_BODY};
use crate::debug::Subsys;
use crate::error::{Error, Result};

// ---------------------------------------------------------------------------------------------
// Interface selection (NCCL_SOCKET_IFNAME)

/// A parsed `NCCL_SOCKET_IFNAME`: `eth,ib` (prefixes), `^docker,lo` (all but these prefixes),
/// `=eth0` (exact names), `^=eth0` (all but these names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfSpec {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfSpec {
    pub fn parse(spec: &str) -> IfSpec {
        let spec = spec.trim();
        let (exclude, spec) = spec.strip_prefix('^').map_or((false, spec), |s| (true, s));
        let (exact, spec) = spec.strip_prefix('=').map_or((false, spec), |s| (true, s));
        let names = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        IfSpec { exclude, exact, names }
    }

    /// As NCCL: an empty list matches every name, and `^` inverts the result.
    pub fn matches(&self, name: &str) -> bool {
        let listed = self.names.is_empty()
            || self.names.iter().any(|n| if self.exact { name == n } else { name.starts_with(n.as_str()) });
        listed != self.exclude
    }
}

crate::str_param!(
    /// NCCL_SOCKET_FAMILY: `AF_INET` or `AF_INET6`, the only address family sockets use.
    socket_family, "NCCL_SOCKET_FAMILY"
);

/// How sockets (the bootstrap's and the Socket net's) choose their interfaces, as NCCL 2.28.9:
/// `NCCL_SOCKET_IFNAME` when set; otherwise the first of these tiers that has an interface:
/// InfiniBand (`ib*`), the interfaces on the subnet of `NCCL_COMM_ID`'s address, anything but
/// `docker*`, `lo*` and `virbr*`, then `docker*`, then `lo*`, then `virbr*`. `NCCL_SOCKET_FAMILY`
/// keeps one address family throughout; IPv4 comes before IPv6 otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IfRule {
    /// `NCCL_SOCKET_IFNAME`.
    pub spec: Option<String>,
    /// `NCCL_SOCKET_FAMILY`: `Some(true)` for IPv6 only, `Some(false)` for IPv4 only.
    pub v6: Option<bool>,
    /// The interfaces on the subnet of `NCCL_COMM_ID`'s address (the second default tier).
    pub near: Vec<String>,
}

/// The default tiers around the subnet tier (see [`IfRule`]).
const FIRST_TIER: &str = "ib";
const LATER_TIERS: [&str; 4] = ["^docker,lo,virbr", "docker", "lo", "virbr"];

impl IfRule {
    /// The rule the environment sets. Fails on an `NCCL_SOCKET_FAMILY` that is neither family.
    pub fn from_env() -> Result<IfRule> {
        let v6 = match socket_family().map(str::trim) {
            None => None,
            Some(f) if f.eq_ignore_ascii_case("AF_INET") => Some(false),
            Some(f) if f.eq_ignore_ascii_case("AF_INET6") => Some(true),
            Some(f) => crate::bail_arg!("NCCL_SOCKET_FAMILY={f}: expected AF_INET or AF_INET6"),
        };
        let spec = crate::env::socket_ifname().map(String::from);
        // NCCL_COMM_ID's host, when it parses and resolves; a bad one fails where it is used.
        let remote = crate::env::comm_id()
            .filter(|_| spec.is_none())
            .and_then(|c| super::id::split_host_port(c).ok())
            .and_then(|(host, port)| resolve(host, port).ok());
        let near = remote.map(|r| on_subnet(r.ip(), &interface_nets())).unwrap_or_default();
        Ok(IfRule { spec, v6, near })
    }

    /// Candidate addresses in preference order: the spec's, or the first default tier that
    /// matches anything; IPv4 before IPv6 within that. Addresses a listener cannot usefully
    /// bind (unspecified, multicast, IPv6 link-local, which would need a scope) are skipped.
    pub fn select(&self, ifaces: &[(String, IpAddr)]) -> Vec<(String, IpAddr)> {
        let usable = |ip: &IpAddr| {
            !ip.is_unspecified()
                && !ip.is_multicast()
                && !matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
                && self.v6.is_none_or(|v6| ip.is_ipv6() == v6)
        };
        let pick = |spec: &IfSpec| -> Vec<(String, IpAddr)> {
            let mut v: Vec<_> = ifaces.iter().filter(|(n, ip)| usable(ip) && spec.matches(n)).cloned().collect();
            v.sort_by_key(|(_, ip)| ip.is_ipv6());
            v
        };
        if let Some(s) = &self.spec {
            return pick(&IfSpec::parse(s));
        }
        let near = IfSpec { exclude: false, exact: true, names: self.near.clone() };
        std::iter::once(IfSpec::parse(FIRST_TIER))
            .chain((!self.near.is_empty()).then_some(near))
            .chain(LATER_TIERS.iter().map(|t| IfSpec::parse(t)))
            .map(|t| pick(&t))
            .find(|v| !v.is_empty())
            .unwrap_or_default()
    }

    /// How this rule chooses, for tools: "NCCL_SOCKET_IFNAME=eth0 selects them", or the
    /// default order.
    pub fn describe(&self) -> String {
        let only = self.v6.map(|v6| format!("NCCL_SOCKET_FAMILY keeps {} only", if v6 { "IPv6" } else { "IPv4" }));
        match &self.spec {
            Some(s) => {
                format!("NCCL_SOCKET_IFNAME={s} selects them{}", only.map(|o| format!("; {o}")).unwrap_or_default())
            }
            None => {
                let near = match self.near.is_empty() {
                    true => String::new(),
                    false => format!("then {} (on NCCL_COMM_ID's subnet), ", self.near.join(",")),
                };
                format!(
                    "NCCL_SOCKET_IFNAME is unset: the first of these that exists wins: ib*, {near}then any but \
                     docker*, lo* and virbr*, then docker*, then lo*, then virbr*; {}",
                    only.unwrap_or_else(|| "IPv4 before IPv6".into())
                )
            }
        }
    }
}

/// The names of the interfaces whose subnet holds `remote` (`nets`: name, address, prefix
/// length), as NCCL matches `NCCL_COMM_ID`'s address.
pub fn on_subnet(remote: IpAddr, nets: &[(String, IpAddr, u8)]) -> Vec<String> {
    let bits = |ip: IpAddr| match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)) << 96, 32u32),
        IpAddr::V6(a) => (u128::from(a), 128u32),
    };
    let (r, rlen) = bits(remote);
    let mut out: Vec<String> = Vec::new();
    for (name, ip, prefix) in nets {
        let (a, len) = bits(*ip);
        let prefix = u32::from(*prefix);
        if len != rlen || prefix > len || prefix == 0 {
            continue;
        }
        let mask = u128::MAX << (128 - prefix);
        if a & mask == r & mask && !out.contains(name) {
            out.push(name.clone());
        }
    }
    out
}

/// `(name, address)` of every interface that is up.
pub fn interfaces() -> Vec<(String, IpAddr)> {
    interface_nets().into_iter().map(|(n, ip, _)| (n, ip)).collect()
}

/// The prefix length of a netmask (its leading ones).
fn prefix_len(mask: IpAddr) -> u8 {
    match mask {
        IpAddr::V4(m) => u32::from(m).leading_ones() as u8,
        IpAddr::V6(m) => u128::from(m).leading_ones() as u8,
    }
}

/// The address a `sockaddr` holds, for the two families we use.
///
/// # Safety
/// `sa` is null or points at a valid sockaddr whose `sa_family` says which struct it is.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: per this function's contract, the family says which sockaddr `sa` points at.
    unsafe {
        match (*sa).sa_family as libc::c_int {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

/// `(name, address, prefix length)` of every interface that is up, from getifaddrs.
pub fn interface_nets() -> Vec<(String, IpAddr, u8)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs only writes the list head; the list is freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        crate::nccl_warn!("Bootstrap: getifaddrs failed: {}", io::Error::last_os_error());
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_flags & libc::IFF_UP as libc::c_uint == 0 {
            continue;
        }
        // SAFETY: the list's sockaddrs are null or valid with a family; ifa_name is a
        // NUL-terminated string owned by the list.
        let (ip, mask, name) =
            unsafe { (sockaddr_ip(ifa.ifa_addr), sockaddr_ip(ifa.ifa_netmask), CStr::from_ptr(ifa.ifa_name)) };
        let Some(ip) = ip else { continue };
        let full = if ip.is_ipv4() { 32 } else { 128 };
        out.push((name.to_string_lossy().into_owned(), ip, mask.map_or(full, prefix_len)));
    }
    // SAFETY: head came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The address this process's bootstrap listeners bind, chosen once per process ([`IfRule`]).
pub fn local_ip() -> Result<IpAddr> {
    static IP: OnceLock<Result<IpAddr>> = OnceLock::new();
    IP.get_or_init(|| {
        let rule = IfRule::from_env()?;
        Ok(match rule.select(&interfaces()).first() {
            Some((name, ip)) => {
                crate::nccl_info!(Subsys::BOOTSTRAP, "Bootstrap: using interface {name} ({ip})");
                *ip
            }
            None => {
                let why = match &rule.spec {
                    Some(s) => format!("NCCL_SOCKET_IFNAME={s} matches no interface that is up"),
                    None => "no usable interface found".into(),
                };
                crate::nccl_info!(Subsys::BOOTSTRAP, "Bootstrap: {why}; falling back to 127.0.0.1");
                Ipv4Addr::LOCALHOST.into()
            }
        })
    })
    .clone()
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // A fixed NCCL_COMM_ID port must be reusable while old connections sit in TIME_WAIT.
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    // Deep backlog: many ranks may connect to one listener at once (p2p fan-in, the root).
    s.listen(1024)?;
    Ok(s.into())
}

/// A listener on an ephemeral port of `ip`, or of 127.0.0.1 if `ip` cannot be bound.
pub fn listen(ip: IpAddr) -> Result<TcpListener> {
    bind(SocketAddr::new(ip, 0)).or_else(|e| {
        crate::nccl_info!(Subsys::BOOTSTRAP, "Bootstrap: cannot listen on {ip} ({e}); falling back to 127.0.0.1");
        bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .map_err(|e| Error::System(format!("bootstrap: cannot listen on 127.0.0.1 either: {e}")))
    })
}

/// A listener on exactly `addr` (the root of an `NCCL_COMM_ID` run).
pub fn listen_exact(addr: SocketAddr) -> Result<TcpListener> {
    bind(addr).map_err(|e| {
        Error::System(format!(
            "bootstrap: rank 0 cannot listen on the NCCL_COMM_ID address {addr} ({e}); \
             NCCL_COMM_ID must name this host of rank 0 and a free port"
        ))
    })
}

/// Resolves `NCCL_COMM_ID`'s host, preferring IPv4 as the interface choice does.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("NCCL_COMM_ID host {host:?} does not resolve: {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| Error::InvalidArgument(format!("NCCL_COMM_ID host {host:?} has no address")))
}

// ---------------------------------------------------------------------------------------------
// Progress of long waits

/// How often a bootstrap wait that is still going says so.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Writes an INFO line every [`PROGRESS_EVERY`] while a wait goes on, naming whom it waits for,
/// so that a rank held up by a slow but honest peer (a framework import, a data loader) reads
/// differently from a hang. Every clock reading is fresh: nothing here is stamped before a
/// blocking wait and used after it.
pub struct Progress<F: Fn() -> String> {
    since: Instant,
    next: Instant,
    waiting_for: F,
}

impl<F: Fn() -> String> Progress<F> {
    pub fn new(waiting_for: F) -> Progress<F> {
        let since = Instant::now();
        Progress { since, next: since + PROGRESS_EVERY, waiting_for }
    }

    /// How long the next wait may sleep: up to `deadline`, but no later than the next report.
    pub fn nap(&self, deadline: Option<Instant>) -> Option<Duration> {
        let now = Instant::now();
        let until = deadline.map_or(self.next, |d| d.min(self.next));
        Some(until.saturating_duration_since(now))
    }

    /// Reports if a report is due (never for a wait that names nobody: a listener's idle time).
    pub fn tick(&mut self, deadline: Option<Instant>) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + PROGRESS_EVERY;
        let whom = (self.waiting_for)();
        if whom.is_empty() {
            return;
        }
        let left = deadline.map_or("no time limit".to_string(), |d| {
            format!("giving up in {}s", d.saturating_duration_since(now).as_secs())
        });
        crate::nccl_info!(
            Subsys::BOOTSTRAP,
            "Bootstrap: still waiting for {whom} after {}s ({left})",
            (now - self.since).as_secs()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Framed streams

/// Why a socket operation failed; callers turn it into an [`Error`] naming the rank involved.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("timed out")]
    Timeout,
    #[error("the peer closed the connection")]
    Closed,
    /// The other end refused us (with its explanation) or failed to prove it holds the id.
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Wire(#[from] WireError),
    /// The caller's stop descriptor became readable: a rank was lost, the wait is pointless.
    #[error("called off: a rank was lost")]
    Stopped,
}

impl NetError {
    /// `System` for local and timing failures, `Remote` where the peer misbehaved or went away.
    pub fn context(self, what: &str) -> Error {
        match self {
            NetError::Timeout | NetError::Io(_) => Error::System(format!("{what}: {self}")),
            NetError::Closed | NetError::Refused(_) | NetError::Wire(_) | NetError::Stopped => {
                Error::Remote(format!("{what}: {self}"))
            }
        }
    }
}

/// Waits until one of `fds` is ready or `timeout` passes (`None`: no limit). EINTR is a wake-up.
pub(super) fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<()> {
    // Round up, so a sub-millisecond remainder sleeps instead of spinning.
    let ms = timeout.map_or(-1, |t| t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int);
    // SAFETY: fds is a valid, initialised slice of pollfd for the whole call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    let err = io::Error::last_os_error();
    match rc < 0 && err.kind() != io::ErrorKind::Interrupted {
        true => Err(err),
        false => Ok(()),
    }
}

pub(super) fn pollfd(fd: &impl AsRawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 }
}

/// Reads what is available into `buf`: `Ok(true)` if bytes came, `Ok(false)` if none were ready.
/// End of stream is [`NetError::Closed`], or a truncation error if a frame was half-read.
fn read_some(stream: &TcpStream, buf: &mut Vec<u8>, max_body: usize) -> std::result::Result<bool, NetError> {
    const CHUNK: usize = 64 << 10;
    let len = buf.len();
    buf.resize(len + CHUNK, 0);
    let r = (&*stream).read(&mut buf[len..]);
    buf.truncate(len + *r.as_ref().unwrap_or(&0));
    match r {
        Ok(0) if len == 0 => Err(NetError::Closed),
        Ok(0) => Err(wire::decode_complete(buf, max_body)
            .err()
            .unwrap_or(WireError::Truncated { have: len, need: len + 1 })
            .into()),
        Ok(_) => Ok(true),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// One end of a bootstrap connection: a non-blocking socket, the bytes read past the last
/// frame, and the bytes of frames not yet fully written (kept across a failed send, so that a
/// frame written afterwards still starts at a frame boundary).
#[derive(Debug)]
pub struct FrameStream {
    stream: TcpStream,
    buf: Vec<u8>,
    outbox: Vec<u8>,
    sent: usize,
    peer: SocketAddr,
    /// Who is at the other end, for progress lines ("rank 3 (ring prev)").
    label: String,
}

impl AsRawFd for FrameStream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }
}

impl FrameStream {
    fn new(stream: TcpStream, buf: Vec<u8>, peer: SocketAddr) -> io::Result<FrameStream> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(FrameStream { stream, buf, outbox: Vec::new(), sent: 0, peer, label: format!("the peer at {peer}") })
    }

    /// Names the other end in the progress lines of long waits on this stream.
    pub fn set_label(&mut self, label: String) {
        self.label = label;
    }

    /// Connects and authenticates both ways (see [`auth`]): the listener's challenge, our proof,
    /// the listener's proof. `patient`: retry refused connections until `deadline`, for a
    /// listener that may not be up yet (the root of an `NCCL_COMM_ID` run, started by rank 0);
    /// otherwise a refusal is final (every rank's listener is up before the root sends the ring
    /// addresses, so a refusal means the peer is gone). A connection closed during the handshake is
    /// retried either way: a listener shedding a flood of silent connections may have evicted it.
    pub fn open(
        addr: SocketAddr,
        cred: &Credentials,
        deadline: Instant,
        patient: bool,
    ) -> std::result::Result<FrameStream, NetError> {
        let mut backoff = Duration::from_millis(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NetError::Timeout);
            }
            let r = TcpStream::connect_timeout(&addr, left).map_err(NetError::from).and_then(|s| {
                let mut s = FrameStream::new(s, Vec::new(), addr)?;
                s.handshake(cred, deadline).map(|()| s)
            });
            let retry = match &r {
                Err(NetError::Io(e)) if e.kind() == io::ErrorKind::ConnectionRefused => patient,
                Err(NetError::Io(e)) => e.kind() == io::ErrorKind::ConnectionReset,
                Err(NetError::Closed) => true,
                _ => false,
            };
            if !retry || Instant::now() + backoff >= deadline {
                return r;
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(100));
        }
    }

    /// The connector's side of the handshake of [`auth`].
    fn handshake(&mut self, cred: &Credentials, deadline: Instant) -> std::result::Result<(), NetError> {
        let peer = self.peer;
        let unexpected =
            |m: Msg| NetError::Refused(format!("the listener at {peer} sent {} during the handshake", m.kind_name()));
        let listener_nonce = match self.recv(MAX_CONTROL_BODY, deadline)? {
            Msg::Challenge { nonce } => nonce,
            other => return Err(unexpected(other)),
        };
        let nonce = auth::nonce().map_err(|e| NetError::Io(io::Error::other(e.to_string())))?;
        let proof = cred.secret.proof(Role::Connector, &listener_nonce, &nonce);
        self.send(&Msg::Auth { magic: cred.magic, nonce, proof }, deadline)?;
        match self.recv(MAX_CONTROL_BODY, deadline)? {
            Msg::Proven { proof } if cred.secret.verify(Role::Listener, &listener_nonce, &nonce, &proof) => Ok(()),
            Msg::Proven { .. } => Err(NetError::Refused(format!(
                "the listener at {peer} could not prove it holds the unique id: not the rank it claims to be"
            ))),
            Msg::Refused { text, .. } => Err(NetError::Refused(text)),
            other => Err(unexpected(other)),
        }
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The next frame if one has fully arrived, without waiting: for a caller that polls
    /// several streams at once (see [`AsRawFd`]).
    pub fn try_recv(&mut self, max_body: usize) -> std::result::Result<Option<Msg>, NetError> {
        loop {
            if let Some((msg, used)) = wire::decode(&self.buf, max_body)? {
                self.buf.drain(..used);
                return Ok(Some(msg));
            }
            if !read_some(&self.stream, &mut self.buf, max_body)? {
                return Ok(None);
            }
        }
    }

    /// Whether a complete frame (or a malformed one) is already buffered: `poll` will not
    /// announce it.
    pub fn has_frame(&self) -> bool {
        !matches!(wire::decode(&self.buf, wire::MAX_DATA_BODY), Ok(None))
    }

    /// Waits up to `timeout` for something to read (a frame or the end); true if there is.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        if self.has_frame() {
            return Ok(true);
        }
        let mut fds = [pollfd(&self.stream, libc::POLLIN)];
        poll(&mut fds, Some(timeout))?;
        Ok(fds[0].revents != 0)
    }

    pub fn send(&mut self, msg: &Msg, deadline: Instant) -> std::result::Result<(), NetError> {
        self.send_bytes(&wire::encode(msg), deadline)
    }

    /// Writes already-encoded frames (after any left over from a failed send).
    pub fn send_bytes(&mut self, bytes: &[u8], deadline: Instant) -> std::result::Result<(), NetError> {
        self.outbox.extend_from_slice(bytes);
        pump(Some(self), None, false, None, deadline).map(drop).map_err(|(_, e)| e)
    }

    /// The next frame, with bodies up to `max_body`.
    pub fn recv(&mut self, max_body: usize, deadline: Instant) -> std::result::Result<Msg, NetError> {
        pump(None, Some((self, max_body)), false, None, deadline).map_err(|(_, e)| e)?.ok_or(NetError::Timeout)
    }

    /// One step of a ring collective: writes `bytes` to `next` while reading one frame from
    /// `prev` (if given), so that a ring of ranks all sending large blocks at once cannot
    /// deadlock on full socket buffers. `next` is watched too: a [`Msg::Lost`] sent back on it
    /// ends the step at once, as does its closing while we still write to it. A `Lost` read
    /// from `prev` also ends the step, even with our write unfinished, and so does `stop`
    /// becoming readable ([`NetError::Stopped`]: news of a lost rank from elsewhere). Errors say
    /// which link failed.
    pub fn ring_step(
        next: &mut FrameStream,
        bytes: &[u8],
        prev: Option<&mut FrameStream>,
        stop: Option<&dyn AsRawFd>,
        deadline: Instant,
    ) -> std::result::Result<Option<Msg>, (Link, NetError)> {
        next.outbox.extend_from_slice(bytes);
        pump(Some(next), prev.map(|p| (p, wire::MAX_DATA_BODY)), true, stop, deadline)
    }
}

/// Which link of a ring step failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Next,
    Prev,
}

/// The one I/O loop behind send, recv and ring_step: flushes `out`'s outbox while reading one
/// frame from `inp`; with `watch_out`, also reads what comes back on `out`; gives up when `stop`
/// is readable (see [`FrameStream::ring_step`]).
fn pump(
    mut out: Option<&mut FrameStream>,
    mut inp: Option<(&mut FrameStream, usize)>,
    mut watch_out: bool,
    stop: Option<&dyn AsRawFd>,
    deadline: Instant,
) -> std::result::Result<Option<Msg>, (Link, NetError)> {
    let next = |e: NetError| (Link::Next, e);
    let prev = |e: NetError| (Link::Prev, e);
    let mut got = None;
    let mut note = None;
    loop {
        if let (Some((s, max)), None) = (inp.as_mut(), got.as_ref()) {
            if let Some((msg, used)) = wire::decode(&s.buf, *max).map_err(|e| prev(e.into()))? {
                s.buf.drain(..used);
                if matches!(msg, Msg::Lost { .. }) {
                    return Ok(Some(msg));
                }
                got = Some(msg);
            }
        }
        if let (true, Some(s)) = (watch_out, out.as_mut()) {
            if let Some((msg, used)) = wire::decode(&s.buf, MAX_CONTROL_BODY).map_err(|e| next(e.into()))? {
                s.buf.drain(..used);
                return match msg {
                    Msg::Lost { .. } => Ok(Some(msg)),
                    other => Err(next(
                        WireError::Malformed(format!("{} sent back on a ring link", other.kind_name())).into(),
                    )),
                };
            }
        }
        let want_write = out.as_ref().is_some_and(|s| s.sent < s.outbox.len());
        let want_read = inp.is_some() && got.is_none();
        if !want_write && !want_read {
            return Ok(got);
        }
        let mut progress = false;
        if let (true, Some(s)) = (want_write, out.as_mut()) {
            match (&s.stream).write(&s.outbox[s.sent..]) {
                Ok(n) => {
                    s.sent += n;
                    progress = true;
                    if s.sent == s.outbox.len() {
                        s.outbox.clear();
                        s.sent = 0;
                    }
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(next(e.into())),
            }
        }
        if let (true, Some((s, max))) = (want_read, inp.as_mut()) {
            progress |= read_some(&s.stream, &mut s.buf, *max).map_err(prev)?;
        }
        if let (true, Some(s)) = (watch_out, out.as_mut()) {
            match read_some(&s.stream, &mut s.buf, MAX_CONTROL_BODY) {
                Ok(more) => progress |= more,
                // The next rank closing after it got everything we sent (maybe just now, in
                // this very pass) is its normal end; a real loss reaches us as a Lost frame
                // around the ring.
                Err(_) if s.sent == s.outbox.len() => watch_out = false,
                Err(e) => return Err(next(e)),
            }
        }
        if progress {
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(if want_read { prev(NetError::Timeout) } else { next(NetError::Timeout) });
        }
        let mut fds = Vec::with_capacity(2);
        if let Some(s) = out.as_ref() {
            let events = if want_write { libc::POLLOUT } else { 0 } | if watch_out { libc::POLLIN } else { 0 };
            if events != 0 {
                fds.push(pollfd(&s.stream, events));
            }
        }
        if let (true, Some((s, _))) = (want_read, inp.as_ref()) {
            fds.push(pollfd(&s.stream, libc::POLLIN));
        }
        let note = note.get_or_insert_with(|| {
            let label = match (&out, &inp) {
                (Some(o), Some((i, _))) if o.peer != i.peer => format!("{} and {}", o.label, i.label),
                (Some(s), _) | (None, Some((s, _))) => s.label.clone(),
                (None, None) => String::new(),
            };
            Progress::new(move || label.clone())
        });
        if let Some(stop) = stop {
            fds.push(pollfd(&stop.as_raw_fd(), libc::POLLIN));
        }
        poll(&mut fds, note.nap(Some(deadline))).map_err(|e| prev(e.into()))?;
        if stop.is_some() && fds.last().is_some_and(|f| f.revents != 0) {
            return Err(if want_read { prev(NetError::Stopped) } else { next(NetError::Stopped) });
        }
        note.tick(Some(deadline));
    }
}

// ---------------------------------------------------------------------------------------------
// Acceptor

/// How long an accepted connection may take to authenticate and send its first frame.
pub const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections a listener reads at once. Each costs a descriptor and a small buffer, so the cap
/// is a slice of the descriptor limit (this process also runs the application). When it is
/// reached, a new connection evicts the oldest one that has not yet authenticated instead of
/// waiting behind it: a flood of silent strangers then only delays an honest rank by the
/// retry of its handshake ([`FrameStream::open`]), never by the strangers' timeouts. There is
/// deliberately no per-address cap: honest ranks on one host, or behind one NAT, share an
/// address with each other and with any local stranger.
pub fn max_pending() -> usize {
    static CAP: OnceLock<usize> = OnceLock::new();
    *CAP.get_or_init(|| {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: lim is a valid rlimit for getrlimit to fill.
        let soft = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
            0 => lim.rlim_cur.min(1 << 20) as usize,
            _ => 1024,
        };
        (soft / 8).clamp(32, 1024)
    })
}

/// A connection accepted but not yet identified by an authenticated first frame.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    buf: Vec<u8>,
    accepted: Instant,
    /// The nonce we challenged it with, until its proof checks out.
    challenge: Option<Nonce>,
}

impl Pending {
    fn expires(&self) -> Instant {
        self.accepted + FIRST_FRAME_TIMEOUT
    }
}

/// A connection that proved it holds the unique id and sent its first frame; the caller checks
/// the frame (kind, rank) and keeps or drops the connection.
pub struct Arrival {
    pub conn: FrameStream,
    pub from: SocketAddr,
    pub msg: Msg,
}

/// What woke [`Acceptor::next`].
pub enum Wake {
    Arrival(Box<Arrival>),
    /// The watched streams at these indices are readable: a frame, or their end.
    Watched(Vec<usize>),
}

/// Accepts connections on a listener, challenges each one at once and reads the answers
/// concurrently, so a silent or slow stranger delays nobody. Nothing but the handshake of
/// [`auth`] is read from a connection that has not passed it; garbage, oversized frames and
/// failed proofs are dropped and logged at once, silent connections after
/// [`FIRST_FRAME_TIMEOUT`] or when evicted. The log lines about strangers never become the
/// application's last-error text.
pub struct Acceptor {
    listener: TcpListener,
    cred: Credentials,
    pending: Vec<Pending>,
}

impl Acceptor {
    pub fn new(listener: TcpListener, cred: Credentials) -> Result<Acceptor> {
        listener.set_nonblocking(true)?;
        Ok(Acceptor { listener, cred, pending: Vec::new() })
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// The next authenticated connection with its first frame, or the watched streams that
    /// became readable (established connections whose closing or news the caller must not
    /// miss), or `None` once `deadline` passes (`None` deadline: wait as long as it takes).
    /// `waiting_for` names what the caller expects, for the progress lines of a long wait.
    /// Frames already buffered in a watched [`FrameStream`] are the caller's to check first.
    pub fn next(
        &mut self,
        deadline: Option<Instant>,
        waiting_for: &dyn Fn() -> String,
        watch: &[&dyn AsRawFd],
    ) -> Result<Option<Wake>> {
        let here = self.local_addr()?;
        let mut progress = Progress::new(waiting_for);
        loop {
            let now = Instant::now();
            self.pending.retain(|p| {
                let alive = p.expires() > now;
                if !alive {
                    crate::nccl_warn_unrecorded!(
                        "Bootstrap listener {here}: dropped a connection from {} that did not authenticate and \
                         send a frame within {FIRST_FRAME_TIMEOUT:?}",
                        p.from
                    );
                }
                alive
            });
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let mut fds: Vec<libc::pollfd> = self.pending.iter().map(|p| pollfd(&p.stream, libc::POLLIN)).collect();
            fds.extend(watch.iter().map(|w| libc::pollfd { fd: w.as_raw_fd(), events: libc::POLLIN, revents: 0 }));
            fds.push(pollfd(&self.listener, libc::POLLIN));
            let wake = self.pending.iter().map(Pending::expires).chain(deadline).min();
            poll(&mut fds, progress.nap(wake))?;
            progress.tick(deadline);

            let n = self.pending.len();
            let readable: Vec<usize> = (0..watch.len()).filter(|&i| fds[n + i].revents != 0).collect();
            if !readable.is_empty() {
                return Ok(Some(Wake::Watched(readable)));
            }
            let (mut done, mut dead) = (None, Vec::new());
            for (i, p) in self.pending.iter_mut().enumerate() {
                if fds[i].revents == 0 {
                    continue;
                }
                match first_frame(p, &self.cred) {
                    Ok(None) => {}
                    Ok(Some(msg)) => {
                        done = Some((i, msg));
                        break;
                    }
                    Err(NetError::Closed) => {
                        crate::nccl_info!(
                            Subsys::BOOTSTRAP,
                            "Bootstrap listener {here}: {} connected and closed without a word",
                            p.from
                        );
                        dead.push(i);
                    }
                    Err(e) => {
                        crate::nccl_warn_unrecorded!(
                            "Bootstrap listener {here}: dropped a connection from {}: {e}",
                            p.from
                        );
                        dead.push(i);
                    }
                }
            }
            // Every dead index is below `done`'s, so removing `done` first keeps them valid.
            let arrival = done.map(|(i, msg)| (self.pending.remove(i), msg));
            dead.iter().rev().for_each(|&i| drop(self.pending.remove(i)));
            if let Some((p, msg)) = arrival {
                match FrameStream::new(p.stream, p.buf, p.from) {
                    Ok(conn) => return Ok(Some(Wake::Arrival(Box::new(Arrival { conn, from: p.from, msg })))),
                    Err(e) => crate::nccl_warn_unrecorded!(
                        "Bootstrap listener {here}: lost the connection from {}: {e}",
                        p.from
                    ),
                }
            }
            if fds.last().is_some_and(|f| f.revents != 0) {
                self.accept_ready(here);
            }
        }
    }

    /// Takes the connections the kernel has ready (at most a full table's worth per call, so
    /// the pending ones are still read during a flood) and challenges each at once. Each one's
    /// clock starts at its accept, never at a time read before the `poll` that may have slept
    /// for minutes.
    fn accept_ready(&mut self, here: SocketAddr) {
        for _ in 0..max_pending() {
            let (stream, from) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning on a
                    // listener that stays readable.
                    crate::nccl_warn_unrecorded!("Bootstrap listener {here}: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    return;
                }
            };
            if self.pending.len() >= max_pending() {
                self.evict(here);
            }
            match challenge(&stream) {
                Ok(nonce) => self.pending.push(Pending {
                    stream,
                    from,
                    buf: Vec::new(),
                    accepted: Instant::now(),
                    challenge: Some(nonce),
                }),
                Err(e) => crate::nccl_warn_unrecorded!("Bootstrap listener {here}: cannot challenge {from}: {e}"),
            }
        }
    }

    /// Drops the oldest connection that has not authenticated (or the oldest of all).
    fn evict(&mut self, here: SocketAddr) {
        let unproven =
            self.pending.iter().enumerate().filter(|(_, p)| p.challenge.is_some()).min_by_key(|(_, p)| p.accepted);
        let oldest = self.pending.iter().enumerate().min_by_key(|(_, p)| p.accepted);
        if let Some((i, _)) = unproven.or(oldest) {
            let p = self.pending.remove(i);
            crate::nccl_warn_unrecorded!(
                "Bootstrap listener {here}: {} connections are waiting to authenticate; dropped the oldest, from {}",
                max_pending(),
                p.from
            );
        }
    }
}

/// Writes `bytes` to a fresh non-blocking socket in one go: small frames at the start of a
/// connection always fit in its empty send buffer, so a short write means the peer is gone.
fn write_now(stream: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    match (&*stream).write(bytes)? {
        n if n == bytes.len() => Ok(()),
        n => Err(io::Error::other(format!("only {n} of {} bytes could be written", bytes.len()))),
    }
}

/// Makes the socket non-blocking and sends it a fresh challenge.
fn challenge(stream: &TcpStream) -> io::Result<Nonce> {
    stream.set_nonblocking(true)?;
    let nonce = auth::nonce().map_err(|e| io::Error::other(e.to_string()))?;
    write_now(stream, &wire::encode(&Msg::Challenge { nonce }))?;
    Ok(nonce)
}

/// Reads what is ready on a pending connection: first its proof (answered with ours, or with a
/// refusal), then its first frame, returned once complete; bytes after it stay in `p.buf`.
fn first_frame(p: &mut Pending, cred: &Credentials) -> std::result::Result<Option<Msg>, NetError> {
    loop {
        while let Some((msg, used)) = wire::decode(&p.buf, MAX_CONTROL_BODY)? {
            p.buf.drain(..used);
            match p.challenge.take() {
                None => return Ok(Some(msg)),
                Some(nonce) => check_proof(p, cred, nonce, msg)?,
            }
        }
        if !read_some(&p.stream, &mut p.buf, MAX_CONTROL_BODY)? {
            return Ok(None);
        }
    }
}

/// Checks a connector's answer to our challenge and sends our own proof; a wrong magic or proof
/// gets a refusal that explains it (nothing secret in it) and ends the connection.
fn check_proof(p: &Pending, cred: &Credentials, ours: Nonce, msg: Msg) -> std::result::Result<(), NetError> {
    let refuse = |text: String| {
        let _ =
            write_now(&p.stream, &wire::encode(&Msg::Refused { reason: RefuseReason::Rejected, text: text.clone() }));
        Err(NetError::Refused(text))
    };
    match msg {
        Msg::Auth { magic, .. } if magic != cred.magic => refuse(format!(
            "{} presented a unique id whose magic does not match this listener's; \
             every rank must use the id from the same ncclGetUniqueId call",
            p.from
        )),
        Msg::Auth { nonce, proof, .. } if cred.secret.verify(Role::Connector, &ours, &nonce, &proof) => {
            let proof = cred.secret.proof(Role::Listener, &ours, &nonce);
            Ok(write_now(&p.stream, &wire::encode(&Msg::Proven { proof }))?)
        }
        Msg::Auth { .. } => refuse(format!(
            "{} could not prove it holds the unique id (right magic, wrong secret: a forged or corrupted id)",
            p.from
        )),
        other => Err(NetError::Refused(format!("{} sent {} instead of authenticating", p.from, other.kind_name()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifs(list: &[(&str, &str)]) -> Vec<(String, IpAddr)> {
        list.iter().map(|(n, a)| (n.to_string(), a.parse().unwrap())).collect()
    }

    fn names(v: Vec<(String, IpAddr)>) -> Vec<String> {
        v.into_iter().map(|(n, ip)| format!("{n}/{ip}")).collect()
    }

    #[test]
    fn spec_parsing_and_matching() {
        let s = IfSpec::parse("eth,ib");
        assert!(s.matches("eth0") && s.matches("ib1") && !s.matches("lo") && !s.matches("veth0"));
        let s = IfSpec::parse("^docker,lo");
        assert!(s.matches("eth0") && !s.matches("docker0") && !s.matches("lo"));
        let s = IfSpec::parse("=eth0");
        assert!(s.matches("eth0") && !s.matches("eth01") && !s.matches("eth"));
        let s = IfSpec::parse("^=eth0, eth1 ");
        assert!(!s.matches("eth0") && !s.matches("eth1") && s.matches("eth10"));
        assert!(IfSpec::parse("").matches("anything"));
        assert!(!IfSpec::parse("^").matches("anything"));
    }

    const HOST: &[(&str, &str)] = &[
        ("lo", "127.0.0.1"),
        ("lo", "::1"),
        ("docker0", "172.17.0.1"),
        ("eth0", "fd00::2"),
        ("eth0", "fe80::1"),
        ("eth0", "192.0.2.2"),
        ("eth1", "10.0.0.2"),
    ];

    fn rule(spec: Option<&str>, v6: Option<bool>, near: &[&str]) -> IfRule {
        IfRule { spec: spec.map(String::from), v6, near: near.iter().map(|n| n.to_string()).collect() }
    }

    fn select_addrs(spec: Option<&str>, ifaces: &[(String, IpAddr)]) -> Vec<(String, IpAddr)> {
        rule(spec, None, &[]).select(ifaces)
    }

    #[test]
    fn default_prefers_real_interfaces_ipv4_first() {
        assert_eq!(names(select_addrs(None, &ifs(HOST))), ["eth0/192.0.2.2", "eth1/10.0.0.2", "eth0/fd00::2"]);
    }

    #[test]
    fn default_prefers_ib_then_falls_back_to_docker_then_lo_then_virbr() {
        let mut with_ib = HOST.to_vec();
        with_ib.push(("ib0", "10.9.0.1"));
        assert_eq!(names(select_addrs(None, &ifs(&with_ib))), ["ib0/10.9.0.1"]);
        let no_real = &[("lo", "127.0.0.1"), ("virbr0", "192.168.122.1"), ("docker0", "172.17.0.1")];
        assert_eq!(names(select_addrs(None, &ifs(no_real))), ["docker0/172.17.0.1"]);
        let lo_virbr = &[("virbr0", "192.168.122.1"), ("lo", "::1"), ("lo", "127.0.0.1")];
        assert_eq!(names(select_addrs(None, &ifs(lo_virbr))), ["lo/127.0.0.1", "lo/::1"]);
        assert_eq!(names(select_addrs(None, &ifs(&[("virbr0", "192.168.122.1")]))), ["virbr0/192.168.122.1"]);
        assert!(select_addrs(None, &[]).is_empty());
        // virbr is never in the "anything else" tier.
        let mut with_virbr = HOST.to_vec();
        with_virbr.push(("virbr0", "192.168.122.1"));
        assert_eq!(names(select_addrs(None, &ifs(&with_virbr))), ["eth0/192.0.2.2", "eth1/10.0.0.2", "eth0/fd00::2"]);
    }

    #[test]
    fn comm_id_subnet_comes_after_ib_and_before_the_rest() {
        let nets: Vec<(String, IpAddr, u8)> = [
            ("lo", "127.0.0.1", 8),
            ("eth0", "192.0.2.2", 24),
            ("eth1", "10.0.0.2", 16),
            ("eth1", "fd00::2", 64),
            ("eth2", "10.1.0.2", 16),
        ]
        .iter()
        .map(|(n, a, p)| (n.to_string(), a.parse().unwrap(), *p))
        .collect();
        let near = |r: &str| on_subnet(r.parse().unwrap(), &nets);
        assert_eq!(near("10.0.77.1"), ["eth1"]);
        assert_eq!(near("127.0.0.1"), ["lo"]);
        assert_eq!(near("fd00::99"), ["eth1"]);
        assert!(near("203.0.113.5").is_empty() && near("fd01::1").is_empty());
        assert!(on_subnet("10.0.0.1".parse().unwrap(), &[("odd".into(), "10.0.0.2".parse().unwrap(), 0)]).is_empty());
        assert!(on_subnet("10.0.0.1".parse().unwrap(), &[("odd".into(), "10.0.0.2".parse().unwrap(), 99)]).is_empty());
        let h = ifs(HOST);
        assert_eq!(names(rule(None, None, &["eth1"]).select(&h)), ["eth1/10.0.0.2"]);
        let mut with_ib = HOST.to_vec();
        with_ib.push(("ib0", "10.9.0.1"));
        assert_eq!(names(rule(None, None, &["eth1"]).select(&ifs(&with_ib))), ["ib0/10.9.0.1"]);
        // A subnet match only counts without NCCL_SOCKET_IFNAME.
        assert_eq!(names(rule(Some("=eth0"), None, &["eth1"]).select(&h)), ["eth0/192.0.2.2", "eth0/fd00::2"]);
        // An interface on the subnet whose address the family excludes falls through to the rest.
        assert_eq!(names(rule(None, Some(true), &["eth1"]).select(&h)), ["eth0/fd00::2"]);
    }

    #[test]
    fn family_keeps_one_kind_of_address_in_every_tier() {
        let h = ifs(HOST);
        assert_eq!(names(rule(None, Some(false), &[]).select(&h)), ["eth0/192.0.2.2", "eth1/10.0.0.2"]);
        assert_eq!(names(rule(None, Some(true), &[]).select(&h)), ["eth0/fd00::2"]);
        assert_eq!(names(rule(Some("lo"), Some(true), &[]).select(&h)), ["lo/::1"]);
        assert!(rule(Some("docker"), Some(true), &[]).select(&h).is_empty());
        let text = rule(None, Some(true), &["eth1"]).describe();
        assert!(text.contains("ib*, then eth1 (on NCCL_COMM_ID's subnet), then any but docker*"), "{text}");
        assert!(text.contains("IPv6 only"), "{text}");
    }

    #[test]
    fn user_spec_is_obeyed() {
        let h = ifs(HOST);
        assert_eq!(names(select_addrs(Some("lo"), &h)), ["lo/127.0.0.1", "lo/::1"]);
        assert_eq!(names(select_addrs(Some("=eth1"), &h)), ["eth1/10.0.0.2"]);
        assert_eq!(names(select_addrs(Some("=eth"), &h)), Vec::<String>::new());
        assert_eq!(names(select_addrs(Some("^eth"), &h)), ["lo/127.0.0.1", "docker0/172.17.0.1", "lo/::1"]);
        assert_eq!(names(select_addrs(Some("docker,eth1"), &h)), ["docker0/172.17.0.1", "eth1/10.0.0.2"]);
        assert!(select_addrs(Some("nonexistent"), &h).is_empty());
    }

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
}
