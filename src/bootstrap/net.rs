//! The socket edge of the bootstrap: interface selection, listeners, framed streams and the
//! acceptor that screens strangers. All sockets are non-blocking and every wait is a `poll`
//! with a deadline, so nothing here can block forever.
//!
//! Interface matching ([`IfSpec`], [`select_addrs`]) is pure and unit-tested; only
//! [`interfaces`] touches the OS.

use std::ffi::CStr;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::wire::{self, Msg, WireError, MAX_CONTROL_BODY};
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

/// The order NCCL tries when `NCCL_SOCKET_IFNAME` is unset: InfiniBand, then anything that is
/// neither docker nor loopback, then docker, then loopback.
const DEFAULT_TIERS: [&str; 4] = ["ib", "^docker,lo", "docker", "lo"];

/// Candidate addresses in preference order: the user's spec, or the first default tier that
/// matches anything; IPv4 before IPv6 within that. Addresses a listener cannot usefully bind
/// (unspecified, multicast, IPv6 link-local, which would need a scope) are skipped.
pub fn select_addrs(spec: Option<&str>, ifaces: &[(String, IpAddr)]) -> Vec<(String, IpAddr)> {
    let usable = |ip: &IpAddr| {
        !ip.is_unspecified()
            && !ip.is_multicast()
            && !matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
    };
    let pick = |spec: &IfSpec| -> Vec<(String, IpAddr)> {
        let mut v: Vec<_> = ifaces.iter().filter(|(n, ip)| usable(ip) && spec.matches(n)).cloned().collect();
        v.sort_by_key(|(_, ip)| ip.is_ipv6());
        v
    };
    match spec {
        Some(s) => pick(&IfSpec::parse(s)),
        None => DEFAULT_TIERS.iter().map(|t| pick(&IfSpec::parse(t))).find(|v| !v.is_empty()).unwrap_or_default(),
    }
}

/// `(name, address)` of every interface that is up, from getifaddrs.
pub fn interfaces() -> Vec<(String, IpAddr)> {
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
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as libc::c_uint == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null and its sa_family says which sockaddr it points to;
        // ifa_name is a NUL-terminated string owned by the list.
        let (ip, name) = unsafe {
            let ip = match (*ifa.ifa_addr).sa_family as libc::c_int {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            };
            (ip, CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned())
        };
        out.push((name, ip));
    }
    // SAFETY: head came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The address this process's bootstrap listeners bind, chosen once per process.
pub fn local_ip() -> IpAddr {
    static IP: OnceLock<IpAddr> = OnceLock::new();
    *IP.get_or_init(|| {
        let spec = crate::env::socket_ifname();
        match select_addrs(spec, &interfaces()).first() {
            Some((name, ip)) => {
                crate::nccl_info!(Subsys::BOOTSTRAP, "Bootstrap: using interface {name} ({ip})");
                *ip
            }
            None => {
                let why = match spec {
                    Some(s) => format!("NCCL_SOCKET_IFNAME={s} matches no interface that is up"),
                    None => "no usable interface found".into(),
                };
                crate::nccl_info!(Subsys::BOOTSTRAP, "Bootstrap: {why}; falling back to 127.0.0.1");
                Ipv4Addr::LOCALHOST.into()
            }
        }
    })
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

/// A fresh non-zero random magic from the kernel (hash-seeded fallback if getrandom fails).
pub fn random_magic() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: b is valid for writes of b.len() bytes for the duration of the call.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let v = if n == b.len() as isize {
        u64::from_le_bytes(b)
    } else {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
        h.finish()
    };
    v.max(1)
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

    /// How long the next `poll` may sleep: up to `deadline`, but no later than the next report.
    fn nap(&self, deadline: Option<Instant>) -> Option<Duration> {
        let now = Instant::now();
        let until = deadline.map_or(self.next, |d| d.min(self.next));
        Some(until.saturating_duration_since(now))
    }

    /// Reports if a report is due.
    fn tick(&mut self, deadline: Option<Instant>) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + PROGRESS_EVERY;
        let left = deadline.map_or("no time limit".to_string(), |d| {
            format!("giving up in {}s", d.saturating_duration_since(now).as_secs())
        });
        crate::nccl_info!(
            Subsys::BOOTSTRAP,
            "Bootstrap: still waiting for {} after {}s ({left})",
            (self.waiting_for)(),
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
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Wire(#[from] WireError),
}

impl NetError {
    /// `System` for local and timing failures, `Remote` where the peer misbehaved or went away.
    pub fn context(self, what: &str) -> Error {
        match self {
            NetError::Timeout | NetError::Io(_) => Error::System(format!("{what}: {self}")),
            NetError::Closed | NetError::Wire(_) => Error::Remote(format!("{what}: {self}")),
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

/// One end of a bootstrap connection: a non-blocking socket plus the bytes read past the last
/// frame.
#[derive(Debug)]
pub struct FrameStream {
    stream: TcpStream,
    buf: Vec<u8>,
    peer: SocketAddr,
    /// Who is at the other end, for progress lines ("rank 3 (ring prev)").
    label: String,
}

impl FrameStream {
    fn new(stream: TcpStream, buf: Vec<u8>, peer: SocketAddr) -> io::Result<FrameStream> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(FrameStream { stream, buf, peer, label: format!("the peer at {peer}") })
    }

    /// Names the other end in the progress lines of long waits on this stream.
    pub fn set_label(&mut self, label: String) {
        self.label = label;
    }

    /// Connects, retrying refusals until `deadline`: the listener may not be up yet (rank 0
    /// starting an `NCCL_COMM_ID` root, a peer still in its own init).
    pub fn connect(addr: SocketAddr, deadline: Instant) -> std::result::Result<FrameStream, NetError> {
        let mut backoff = Duration::from_millis(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NetError::Timeout);
            }
            match TcpStream::connect_timeout(&addr, left) {
                Ok(s) => return Ok(FrameStream::new(s, Vec::new(), addr)?),
                Err(e) if Instant::now() + backoff >= deadline => return Err(e.into()),
                Err(_) => std::thread::sleep(backoff),
            }
            backoff = (backoff * 2).min(Duration::from_millis(100));
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

    pub fn send(&mut self, msg: &Msg, deadline: Instant) -> std::result::Result<(), NetError> {
        self.send_bytes(&wire::encode(msg), deadline)
    }

    /// Writes already-encoded frames.
    pub fn send_bytes(&mut self, bytes: &[u8], deadline: Instant) -> std::result::Result<(), NetError> {
        pump(Some((self, bytes)), None, deadline).map(drop)
    }

    /// The next frame, with bodies up to `max_body`.
    pub fn recv(&mut self, max_body: usize, deadline: Instant) -> std::result::Result<Msg, NetError> {
        pump(None, Some((self, max_body)), deadline)?.ok_or(NetError::Timeout)
    }

    /// Writes `bytes` to `out` while reading one frame from `inp`, so that a ring of ranks all
    /// sending large blocks at once cannot deadlock on full socket buffers.
    pub fn exchange(
        out: &mut FrameStream,
        bytes: &[u8],
        inp: &mut FrameStream,
        max_body: usize,
        deadline: Instant,
    ) -> std::result::Result<Msg, NetError> {
        pump(Some((out, bytes)), Some((inp, max_body)), deadline)?.ok_or(NetError::Timeout)
    }
}

impl AsRawFd for FrameStream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }
}

/// The one I/O loop behind send, recv and exchange.
fn pump(
    out: Option<(&mut FrameStream, &[u8])>,
    mut inp: Option<(&mut FrameStream, usize)>,
    deadline: Instant,
) -> std::result::Result<Option<Msg>, NetError> {
    let mut written = 0;
    let mut got = None;
    let mut note = None;
    loop {
        if let (Some((s, max)), None) = (inp.as_mut(), got.as_ref()) {
            if let Some((msg, used)) = wire::decode(&s.buf, *max)? {
                s.buf.drain(..used);
                got = Some(msg);
            }
        }
        let want_write = out.as_ref().is_some_and(|(_, b)| written < b.len());
        let want_read = inp.is_some() && got.is_none();
        if !want_write && !want_read {
            return Ok(got);
        }
        let mut progress = false;
        if let (true, Some((s, b))) = (want_write, out.as_ref()) {
            match (&s.stream).write(&b[written..]) {
                Ok(n) => (written, progress) = (written + n, true),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let (true, Some((s, max))) = (want_read, inp.as_mut()) {
            progress |= read_some(&s.stream, &mut s.buf, *max)?;
        }
        if progress {
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NetError::Timeout);
        }
        let mut fds = Vec::with_capacity(2);
        if let (true, Some((s, _))) = (want_write, out.as_ref()) {
            fds.push(pollfd(&s.stream, libc::POLLOUT));
        }
        if let (true, Some((s, _))) = (want_read, inp.as_ref()) {
            fds.push(pollfd(&s.stream, libc::POLLIN));
        }
        let note = note.get_or_insert_with(|| {
            let label = match (&out, &inp) {
                (Some((o, _)), Some((i, _))) if o.peer != i.peer => format!("{} and {}", o.label, i.label),
                (Some((s, _)), _) | (None, Some((s, _))) => s.label.clone(),
                (None, None) => String::new(),
            };
            Progress::new(move || label.clone())
        });
        poll(&mut fds, note.nap(Some(deadline)))?;
        note.tick(Some(deadline));
    }
}

// ---------------------------------------------------------------------------------------------
// Acceptor

/// How long an accepted connection may take to send its first complete frame.
pub const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections read at once; more wait in the kernel's backlog and cost no descriptor.
const MAX_PENDING: usize = 32;

/// A connection accepted but not yet identified by a complete first frame.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    buf: Vec<u8>,
    expires: Instant,
}

/// A connection whose first frame has arrived; the caller checks it (magic, kind) and keeps or
/// drops the connection.
pub struct Arrival {
    pub conn: FrameStream,
    pub from: SocketAddr,
    pub msg: Msg,
}

/// Accepts connections on a listener and reads each one's first frame concurrently, so a silent
/// or slow stranger delays nobody: garbage, truncated and oversized first frames are dropped
/// and logged at once, silent connections after [`FIRST_FRAME_TIMEOUT`].
pub struct Acceptor {
    listener: TcpListener,
    pending: Vec<Pending>,
}

impl Acceptor {
    pub fn new(listener: TcpListener) -> Result<Acceptor> {
        listener.set_nonblocking(true)?;
        Ok(Acceptor { listener, pending: Vec::new() })
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// The next connection with a complete first frame, or `None` once `deadline` passes
    /// (`None` deadline: wait as long as it takes). `waiting_for` names what the caller expects,
    /// for the progress lines of a long wait.
    pub fn next(&mut self, deadline: Option<Instant>, waiting_for: &dyn Fn() -> String) -> Result<Option<Arrival>> {
        let here = self.local_addr()?;
        let mut progress = Progress::new(waiting_for);
        loop {
            let now = Instant::now();
            self.pending.retain(|p| {
                let alive = p.expires > now;
                if !alive {
                    crate::nccl_warn!(
                        "Bootstrap listener {here}: dropped a connection from {} that sent no complete frame within {:?}",
                        p.from,
                        FIRST_FRAME_TIMEOUT
                    );
                }
                alive
            });
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let accepting = self.pending.len() < MAX_PENDING;
            let mut fds: Vec<libc::pollfd> = self.pending.iter().map(|p| pollfd(&p.stream, libc::POLLIN)).collect();
            if accepting {
                fds.push(pollfd(&self.listener, libc::POLLIN));
            }
            let wake = self.pending.iter().map(|p| p.expires).chain(deadline).min();
            poll(&mut fds, progress.nap(wake))?;
            progress.tick(deadline);

            let (mut done, mut dead) = (None, Vec::new());
            for (i, p) in self.pending.iter_mut().enumerate() {
                if fds[i].revents == 0 {
                    continue;
                }
                match first_frame(p) {
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
                        crate::nccl_warn!("Bootstrap listener {here}: dropped a connection from {}: {e}", p.from);
                        dead.push(i);
                    }
                }
            }
            // Every dead index is below `done`'s, so removing `done` first keeps them valid.
            let arrival = done.map(|(i, msg)| (self.pending.remove(i), msg));
            dead.iter().rev().for_each(|&i| drop(self.pending.remove(i)));
            if let Some((p, msg)) = arrival {
                match FrameStream::new(p.stream, p.buf, p.from) {
                    Ok(conn) => return Ok(Some(Arrival { conn, from: p.from, msg })),
                    Err(e) => crate::nccl_warn!("Bootstrap listener {here}: lost the connection from {}: {e}", p.from),
                }
            }
            if accepting && fds.last().is_some_and(|f| f.revents != 0) {
                self.accept_ready();
            }
        }
    }

    /// Takes every connection the kernel has ready. Each one's first-frame clock starts now, at
    /// its accept, never at a time read before the `poll` that may have slept for minutes.
    fn accept_ready(&mut self) {
        while self.pending.len() < MAX_PENDING {
            match self.listener.accept() {
                Ok((stream, from)) => match stream.set_nonblocking(true) {
                    Ok(()) => self.pending.push(Pending {
                        stream,
                        from,
                        buf: Vec::new(),
                        expires: Instant::now() + FIRST_FRAME_TIMEOUT,
                    }),
                    Err(e) => crate::nccl_warn!("Bootstrap: cannot use the connection from {from}: {e}"),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning on a
                    // listener that stays readable.
                    crate::nccl_warn!("Bootstrap: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    return;
                }
            }
        }
    }
}

/// Reads what is ready on a pending connection and decodes its first frame if complete; the
/// frame's bytes are consumed, anything after them stays in `p.buf`.
fn first_frame(p: &mut Pending) -> std::result::Result<Option<Msg>, NetError> {
    while read_some(&p.stream, &mut p.buf, MAX_CONTROL_BODY)? {
        if let Some((msg, used)) = wire::decode(&p.buf, MAX_CONTROL_BODY)? {
            p.buf.drain(..used);
            return Ok(Some(msg));
        }
    }
    Ok(None)
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

    #[test]
    fn default_prefers_real_interfaces_ipv4_first() {
        assert_eq!(names(select_addrs(None, &ifs(HOST))), ["eth0/192.0.2.2", "eth1/10.0.0.2", "eth0/fd00::2"]);
    }

    #[test]
    fn default_prefers_ib_then_falls_back_to_docker_then_lo() {
        let mut with_ib = HOST.to_vec();
        with_ib.push(("ib0", "10.9.0.1"));
        assert_eq!(names(select_addrs(None, &ifs(&with_ib))), ["ib0/10.9.0.1"]);
        let no_real = &[("lo", "127.0.0.1"), ("docker0", "172.17.0.1")];
        assert_eq!(names(select_addrs(None, &ifs(no_real))), ["docker0/172.17.0.1"]);
        assert_eq!(names(select_addrs(None, &ifs(&[("lo", "::1"), ("lo", "127.0.0.1")]))), ["lo/127.0.0.1", "lo/::1"]);
        assert!(select_addrs(None, &[]).is_empty());
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

    #[test]
    fn loopback_listener_round_trip() {
        let mut acc = Acceptor::new(listen(Ipv4Addr::LOCALHOST.into()).unwrap()).unwrap();
        let addr = acc.local_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut c = FrameStream::connect(addr, deadline).unwrap();
        let hello = Msg::Hello { magic: 3, from: 1, link: wire::LinkKind::Ring };
        let data = Msg::Data { tag: 1, seq: 2, payload: vec![7; 300_000] };
        let mut both = wire::encode(&hello);
        both.extend(wire::encode(&data));
        // A blob bigger than the socket buffers: the reader must run while the writer writes.
        let writer = std::thread::spawn(move || c.send_bytes(&both, deadline).map(|_| c));
        let mut a = acc.next(Some(deadline), &String::new).unwrap().unwrap();
        assert_eq!(a.msg, hello);
        assert_eq!(a.conn.recv(wire::MAX_DATA_BODY, deadline).unwrap(), data);
        let mut c = writer.join().unwrap().unwrap();
        assert!(matches!(c.recv(16, Instant::now() + Duration::from_millis(50)), Err(NetError::Timeout)));
        drop(a);
        assert!(matches!(c.recv(16, deadline), Err(NetError::Closed)));
    }

    #[test]
    fn acceptor_deadline_and_refused_connect() {
        let mut acc = Acceptor::new(listen(Ipv4Addr::LOCALHOST.into()).unwrap()).unwrap();
        let t = Instant::now();
        assert!(acc.next(Some(t + Duration::from_millis(100)), &String::new).unwrap().is_none());
        assert!(t.elapsed() >= Duration::from_millis(100));
        let gone = acc.local_addr().unwrap();
        drop(acc);
        let r = FrameStream::connect(gone, Instant::now() + Duration::from_millis(200));
        assert!(matches!(r, Err(NetError::Io(e)) if e.kind() == io::ErrorKind::ConnectionRefused));
    }
}
