//! The built-in "Socket" net: NCCL's net API over TCP, host memory only (`docs/NET.md`).
//!
//! A connection is one control socket plus `NCCL_NSOCKS_PERTHREAD × NCCL_SOCKET_NTHREADS` data
//! sockets (at most 64), served by the process's helper threads (`pool`). Every message starts with a 16-byte
//! header on the control socket (tag, size). A message under [`INLINE_MAX`] follows inline on
//! the control socket; a larger one is cut into chunks of at least [`MIN_CHUNK`], each sent on
//! the next data socket in turn behind its own 16-byte chunk header (sequence, length, offset),
//! which the receiver checks, so garbage on a data socket is an error and not silent corruption.
//! Both ends assign chunks to sockets by the same rule, in message order.
//!
//! The caller's thread moves control bytes inside `isend`/`irecv`/`test`; the helper threads
//! move chunks. Nothing waits without a bound: helpers poll with a short timeout and let a
//! comm's sockets go when it closes, and a peer that vanishes turns every request of the comm
//! into an error that names it.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::{Connecting, Handle, Listener, Net, Properties, MAX_RECVS};
use crate::debug::Subsys;
use crate::error::{Error, Result};
use crate::socket::auth::random_bytes;
use crate::socket::iface::{interfaces, IfRule};

/// The name `NCCL_NET` selects this net by.
pub const NAME: &str = "Socket";

crate::int_param!(
    /// NCCL_SOCKET_NTHREADS, 1 to 16: NCCL's helper threads per connection. Here it only
    /// multiplies the data sockets of a connection; the process's helpers serve them all.
    socket_nthreads, "NCCL_SOCKET_NTHREADS", 1
);
crate::int_param!(
    /// Data sockets per NCCL_SOCKET_NTHREADS (NCCL_NSOCKS_PERTHREAD); at most 64 sockets in all.
    nsocks_perthread, "NCCL_NSOCKS_PERTHREAD", 1
);
crate::int_param!(
    /// FERRONICKEL_NET_SOCKET_HELPERS, 1 to 16: the helper threads of the process, shared by
    /// every connection's data sockets (`pool`).
    socket_helpers, "FERRONICKEL_NET_SOCKET_HELPERS", 4
);

crate::int_param!(
    /// FERRONICKEL_NET_TCP_TIMEOUT_MS: a connection whose peer's host acknowledges nothing for
    /// this long (data in flight or, on an idle socket, keepalive probes unanswered: the network
    /// to it is down, or the host is gone) fails with an error saying so; 0 leaves it to the
    /// kernel (about 15 minutes). A slow peer whose host still acknowledges is never cut.
    tcp_timeout_ms, "FERRONICKEL_NET_TCP_TIMEOUT_MS", 20000
);

/// At most this many data sockets per connection, as NCCL.
pub const MAX_SOCKS: usize = 64;
/// At most this many helper threads per connection, as NCCL (and in the process's pool).
pub const MAX_THREADS: usize = 16;
/// Smallest chunk a message is cut into.
pub const MIN_CHUNK: usize = 64 << 10;
/// By default messages below this follow their header on the control socket, moved by the
/// caller's thread (the proxy's); larger ones are cut into chunks for the helper threads
/// ([`inline_cut`]: the sender's choice, which the header carries). Inline, one proxy
/// thread copies every channel's bytes in turn; through the helpers a message may wait for one
/// to wake. 128 KiB, not 256: with the helper pool, collectives whose channels each carry
/// 128-255 KiB steps ran 1.15-1.9x faster; a lone step of that size takes about 10 us more
/// (docs/NET.md, "The Socket net").
pub const INLINE_MAX: usize = 128 << 10;
// A message that does not go inline must be cut into at least one chunk (`wire::chunks` cuts
// none below MIN_CHUNK): otherwise both ends would skip its bytes and report it complete.
const _: () = assert!(INLINE_MAX >= MIN_CHUNK);
crate::int_param!(
    /// FERRONICKEL_NET_SOCKET_INLINE_MAX: messages this process sends below this many bytes go
    /// inline on the control socket, larger ones in chunks through the helpers (at least
    /// MIN_CHUNK); 0, the default: [`inline_cut`]'s rule.
    inline_max_param, "FERRONICKEL_NET_SOCKET_INLINE_MAX", 0
);

/// Where the helpers have fewer CPUs than this, every message goes inline. With each rank bound
/// to two, the helpers only took turns with the proxy and the rank's main thread: every message
/// inline was 1.16x faster over four hosts and 1.10x over two (64 KB-16 MB); on three CPUs it
/// was 0.89x, unbound 0.76x (docs/NET.md, "Every message inline on two CPUs").
const HELPERS_MIN_CPUS: usize = 3;

/// The sender's cut between inline and chunked messages: the `setting` where it is positive (at
/// least [`MIN_CHUNK`]), else [`INLINE_MAX`] where the helpers run on [`HELPERS_MIN_CPUS`] or
/// more (or where that is not known), else none: every message inline.
fn inline_cut(setting: i64, helper_cpus: Option<usize>) -> usize {
    match usize::try_from(setting) {
        Ok(n) if n > 0 => n.max(MIN_CHUNK),
        _ if helper_cpus.is_some_and(|n| n < HELPERS_MIN_CPUS) => usize::MAX,
        _ => INLINE_MAX,
    }
}
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
crate::int_param!(
    /// FERRONICKEL_NET_HELPER_SPIN_US: how long a helper thread keeps polling its sockets and
    /// queue after it last moved a byte, before it sleeps until woken; 0 also keeps the lead
    /// from polling while a launch is awaited (`pool::arm`).
    helper_spin_us, "FERRONICKEL_NET_HELPER_SPIN_US", 200
);

fn helper_spin() -> Duration {
    Duration::from_micros(helper_spin_us().max(0) as u64)
}

/// How long a helper thread sleeps in `poll` at most before it looks at its queues again.
const HELPER_NAP: Duration = Duration::from_millis(50);
/// Bytes a helper moves on one socket before it turns to its next one.
const HELPER_SLICE: usize = 1 << 20;

/// Names the wire format too: a peer of another format (before `\x04` the receiver cut messages
/// at its own INLINE_MAX; now the header says) is refused at connect.
const HANDLE_MAGIC: &[u8; 8] = b"FNSOCK\x00\x04";
const HELLO_MAGIC: &[u8; 8] = b"FNSKHELO";
const HELLO_BYTES: usize = 32;
const HDR_BYTES: usize = 16;

mod chunk;
mod conn;
mod connect;
mod listen;
mod nonblock;
mod pool;
mod recv;
mod send;
#[cfg(test)]
mod tests;
mod warm;
mod wire;

use connect::{Dialing, SocketConnecting};
use listen::SocketListen;
use wire::Hello;
pub use wire::{decode_handle, encode_handle};

/// The devices of the Socket net: one address per interface, in NCCL's order of preference
/// (the bootstrap's [`IfRule`]).
pub fn select_interfaces() -> Result<Vec<(String, IpAddr)>> {
    pick_interfaces(&IfRule::from_env()?, &interfaces())
}

/// The pure part of [`select_interfaces`]: an empty result is an error that names the spec and
/// lists every interface there is (NCCL says nothing there).
pub fn pick_interfaces(rule: &IfRule, all: &[(String, IpAddr)]) -> Result<Vec<(String, IpAddr)>> {
    let mut picked: Vec<(String, IpAddr)> = Vec::new();
    for (name, ip) in rule.select(all) {
        if picked.len() < MAX_IFS && !picked.iter().any(|(n, _)| *n == name) {
            picked.push((name, ip));
        }
    }
    if !picked.is_empty() {
        return Ok(picked);
    }
    Err(rule.nothing_matches("NET/Socket", all))
}

fn link_speed_mbps(ifname: &str) -> i32 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(10_000)
}

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

    fn builtin(&self) -> bool {
        true
    }

    fn properties(&self, dev: usize) -> Result<Properties> {
        let (name, _) = self.dev(dev)?;
        Ok(Properties {
            name: name.clone(),
            pci_path: None,
            guid: dev as u64,
            ptr_support: super::abi::NCCL_PTR_HOST as i32,
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
            crate::socket::size_buffers((&s).into())?;
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
                crate::socket::size_buffers((&s).into())?;
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
        Ok(Box::new(SocketConnecting { addr, socks, deadline: Instant::now() + CONNECT_TIMEOUT }))
    }
}
