//! A rank's rendezvous ([`Bootstrap::init`]): register with the root, get the next rank's
//! address, link the ring (and the liveness links) both ways, gather every rank's listen address
//! around it, and wait for the root's word that every rank did, so that init succeeds everywhere
//! or fails everywhere, naming the same culprit.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::listener::{Listener, Shared};
use super::{root, Bootstrap, BootstrapId, Me, Ring, MAX_RANKS, TELL_TIMEOUT};
use crate::debug::Subsys;
use crate::error::{Error, Result};
use crate::socket::acceptor::Acceptor;
use crate::socket::frame::{FrameStream, NetError};
use crate::socket::progress::Progress;
use crate::socket::wire::{self, LinkKind, Msg, MAX_ADDR_LEN, MAX_CONTROL_BODY};
use crate::socket::{addr, iface};

/// How much longer than the root a rank waits for its ring neighbour's address, so that when
/// ranks are missing the root's report (which names them) arrives before the rank gives up.
const ROOT_REPORT_MARGIN: Duration = Duration::from_secs(1);
impl Bootstrap {
    /// Register with the root, receive the next rank's address, connect the ring (to next, from
    /// prev), gather the peer table around it, and wait until the root says every rank has done
    /// so: init succeeds everywhere or fails everywhere. `timeout` bounds every wait (cut to
    /// [`root::MAX_TIMEOUT`]); on failure the error names the missing, bad or lost rank(s).
    pub fn init(id: &BootstrapId, rank: usize, nranks: usize, timeout: Duration) -> Result<Bootstrap> {
        if nranks == 0 || rank >= nranks {
            crate::bail_arg!("bootstrap: rank {rank} is out of range for nranks {nranks}");
        }
        if nranks > MAX_RANKS {
            crate::bail_arg!("bootstrap: nranks {nranks} exceeds the limit of {MAX_RANKS} ranks per communicator");
        }
        if timeout.is_zero() {
            crate::bail_arg!("bootstrap: a zero timeout leaves no time to rendezvous; set NCCL_BOOTSTRAP_TIMEOUT > 0");
        }
        let timeout = timeout.min(root::MAX_TIMEOUT);
        let start = Instant::now();
        let cred = id.credentials();
        let me = Me { cred, rank, nranks };
        let acceptor = Acceptor::new(addr::listen(iface::local_ip()?)?, cred)?;
        let listen = acceptor.local_addr()?;
        let shared = Arc::new(Shared::default());
        let listener = Listener::spawn(acceptor, me, shared.clone(), timeout)?;
        if id.root_by_rank0 && rank == 0 {
            root::spawn(addr::listen_exact(id.root)?, cred)?;
        }
        let (next, mut root_conn) = register(id, me, listen, timeout, start)?;
        let (ring, liveness) = match connect_ring(me, next, &shared, &mut root_conn, timeout)? {
            Some(Links { ring, liveness }) => (Some(Mutex::new(ring)), Some(liveness)),
            None => (None, None),
        };
        let (lost_rx, lost_tx) = UnixStream::pair()?;
        let mut b = Bootstrap {
            me,
            timeout,
            peers: Vec::new(),
            listen,
            ring,
            liveness: Mutex::new(liveness),
            shared,
            send_seq: Mutex::new(HashMap::new()),
            lost_rx,
            lost_tx,
            _listener: listener,
        };
        b.peers = b.gather_peers(next, &mut root_conn)?;
        wait_ready(me, &mut root_conn, id.root, timeout)?;
        crate::nccl_info!(
            Subsys::BOOTSTRAP,
            "Bootstrap rank {rank}/{nranks} ready in {:?}: listening on {listen}, root {}",
            start.elapsed(),
            id.root
        );
        Ok(b)
    }

    /// Every rank's listen address, indexed by rank: one ring allgather of one address per
    /// rank (n - 1 steps), run by init before anything reads the table. The next rank's entry
    /// must be the address it registered with the root. A failure is settled with the root, so
    /// that every rank names the same culprit.
    fn gather_peers(&self, next: SocketAddr, root_conn: &mut FrameStream) -> Result<Vec<SocketAddr>> {
        let mut mine = Vec::with_capacity(MAX_ADDR_LEN);
        wire::put_addr(&mut mine, &self.listen);
        // The root connection stops the gather: a verdict from the root (a rank died, or named
        // a bad address) ends every rank's wait at once, not only its ring neighbours'.
        let blocks = self.allgather_until(&mine, &*root_conn).map_err(|e| root_verdict(self.me, root_conn, e))?;
        let mut peers = Vec::with_capacity(blocks.len());
        for (r, block) in blocks.iter().enumerate() {
            let mut read = wire::Reader::new(block);
            let addr = read.addr("listen address").and_then(|a| read.finish("listen address").map(|_| a));
            let bad = match addr {
                Ok(a) if r == self.me.next() && a != next => {
                    format!("its listen address came around the ring as {a} but was registered as {next}")
                }
                Ok(a) => {
                    peers.push(a);
                    continue;
                }
                Err(e) => format!("its listen address came around the ring malformed ({e})"),
            };
            return Err(blame(self.me, root_conn, r, format!("rank {r}'s {bad}")));
        }
        Ok(peers)
    }
}

/// Registers with the root and waits for the next rank's address (or the root's refusal). The
/// connection stays open: the root learns through it that this rank's ring is up, or that it
/// died, and tells this rank the same about the others.
fn register(
    id: &BootstrapId,
    me: Me,
    listen: SocketAddr,
    timeout: Duration,
    start: Instant,
) -> Result<(SocketAddr, FrameStream)> {
    let (root, rank, nranks) = (id.root, me.rank, me.nranks);
    let mut conn = FrameStream::open(root, &me.cred, start + timeout, true).map_err(|e| match e {
        NetError::Refused(text) => {
            Error::InvalidUsage(format!("bootstrap: the root at {root} refused rank {rank}: {text}"))
        }
        e => Error::System(format!(
            "bootstrap: rank {rank} could not reach the root at {root} within {timeout:?} ({e}); check that the \
             process that called ncclGetUniqueId (or rank 0 under NCCL_COMM_ID) is running and reachable"
        )),
    })?;
    conn.set_label(format!(
        "its ring neighbour's address from the root at {root} (rank {rank} registered; the root waits for the others, \
         and its own log names the missing ranks)"
    ));
    let deadline = Instant::now() + timeout + ROOT_REPORT_MARGIN;
    let reg = Msg::Register {
        rank: rank as u32,
        nranks: nranks as u32,
        listen,
        timeout_ms: timeout.as_millis().min(u64::MAX as u128) as u64,
    };
    let what = format!("bootstrap: rank {rank} registering with the root at {root}");
    conn.send(&reg, deadline).map_err(|e| e.context(&what))?;
    let reply = conn.recv(MAX_CONTROL_BODY, deadline).map_err(|e| match e {
        NetError::Timeout => Error::System(format!(
            "bootstrap: rank {rank} got no ring neighbour from the root at {root} within {:?}; \
             other ranks have not registered, or the root is stuck",
            timeout + ROOT_REPORT_MARGIN
        )),
        e => e.context(&what),
    })?;
    Ok((root::check_reply(reply, rank, root)?, conn))
}

/// How often init looks at the root connection while it waits for its ring link (which wakes
/// it at once when it comes).
const ROOT_CHECK_EVERY: Duration = Duration::from_millis(10);

/// Opens the link to the next rank and waits for the previous rank's (which the listener thread
/// files). The root connection is watched meanwhile: if another rank is lost, the root says so
/// at once.
fn connect_ring(
    me: Me,
    next_addr: SocketAddr,
    shared: &Shared,
    root_conn: &mut FrameStream,
    timeout: Duration,
) -> Result<Option<Links>> {
    if me.nranks == 1 {
        return Ok(None);
    }
    let deadline = Instant::now() + timeout;
    let (rank, next, prev) = (me.rank, me.next(), me.prev());
    let root = root_conn.peer();
    let mut open = |kind: LinkKind| match open_link(me, next_addr, kind, deadline) {
        Ok(mut s) => {
            s.set_label(format!("rank {next} (ring next)"));
            Ok(s)
        }
        Err(e) => {
            let text = format!("rank {rank} could not open its {kind:?} link to rank {next} at {next_addr} ({e})");
            Err(blame(me, root_conn, next, text))
        }
    };
    let (ring_out, live_out) = (open(LinkKind::Ring)?, open(LinkKind::Liveness)?);
    let mut progress = Progress::new(|| format!("rank {prev} to open its ring links to rank {rank}"));
    loop {
        let taken = {
            let mut inbox = shared.inbox.lock();
            if inbox.prev_links.iter().any(Option::is_none) {
                shared.arrived.wait_for(&mut inbox, ROOT_CHECK_EVERY);
            }
            match inbox.prev_links.iter().all(Option::is_some) {
                true => {
                    inbox.prev_taken = true;
                    Some(inbox.prev_links.each_mut().map(|l| l.take().expect("checked above")))
                }
                false => None,
            }
        };
        if let Some([mut ring_in, mut live_in]) = taken {
            ring_in.set_label(format!("rank {prev} (ring prev)"));
            live_in.set_label(format!("rank {prev} (ring prev)"));
            return Ok(Some(Links {
                ring: Ring { next: ring_out, prev: ring_in, op: 0, broken: None },
                liveness: (live_out, live_in),
            }));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let text = format!("rank {prev} did not open its ring links to rank {rank} within {timeout:?}");
            return Err(blame(me, root_conn, prev, text));
        }
        let lost_root = |e: NetError| e.context(&format!("bootstrap: rank {rank} lost the root at {root} during init"));
        if root_conn.wait_readable(Duration::ZERO).map_err(|e| lost_root(e.into()))? {
            match root_conn.recv(MAX_CONTROL_BODY, Instant::now()) {
                Err(NetError::Timeout) => {}
                Ok(msg) => return Err(root::refusal(msg, rank, root)),
                Err(e) => return Err(lost_root(e)),
            }
        }
        progress.tick(Some(deadline));
    }
}

/// The two links a rank keeps with each ring neighbour: the ring (bootstrap collectives) and the
/// liveness link (heartbeats, watched by [`liveness`] for the communicator's life).
struct Links {
    ring: Ring,
    /// (to next, from prev)
    liveness: (FrameStream, FrameStream),
}

/// Opens an authenticated connection to the listener at `addr` (a rank's) and announces what
/// it is for: the one way every rank-to-rank link starts, whatever its kind.
pub(super) fn open_link(
    me: Me,
    addr: SocketAddr,
    kind: LinkKind,
    deadline: Instant,
) -> std::result::Result<FrameStream, NetError> {
    let mut s = FrameStream::open(addr, &me.cred, deadline, false)?;
    s.send(&Msg::Hello { from: me.rank as u32, link: kind }, deadline)?;
    Ok(s)
}

/// Reports to the root that rank `lost` could not be linked (the root tells everyone, so all
/// ranks name the same culprit), and returns the root's verdict, or our own view if the root
/// does not answer at once.
pub(super) fn blame(me: Me, root_conn: &mut FrameStream, lost: usize, text: String) -> Error {
    let root = root_conn.peer();
    let _ = root_conn.send(&Msg::Lost { rank: lost as u32, text: text.clone() }, Instant::now() + TELL_TIMEOUT);
    match root_conn.recv(MAX_CONTROL_BODY, Instant::now() + TELL_TIMEOUT) {
        Ok(msg) => root::refusal(msg, me.rank, root),
        Err(_) => Error::Remote(format!("bootstrap: {text}; did rank {lost} fail?")),
    }
}

/// After a ring failure inside init: the root's verdict if it comes at once (a rank that died
/// closed its root connection too, and the root names it to every rank in the same words), else
/// this rank's own error.
fn root_verdict(me: Me, root_conn: &mut FrameStream, e: Error) -> Error {
    let root = root_conn.peer();
    match root_conn.recv(MAX_CONTROL_BODY, Instant::now() + TELL_TIMEOUT) {
        Ok(msg) => root::refusal(msg, me.rank, root),
        Err(NetError::Timeout) => e,
        Err(lost) => lost.context(&format!("bootstrap: rank {} lost the root at {root} during init ({e})", me.rank)),
    }
}

/// Tells the root this rank's ring is up (and its table gathered) and waits until every rank's is (or the root's
/// explanation why init failed).
fn wait_ready(me: Me, root_conn: &mut FrameStream, root: SocketAddr, timeout: Duration) -> Result<()> {
    let rank = me.rank;
    let deadline = Instant::now() + timeout + ROOT_REPORT_MARGIN;
    let what = format!("bootstrap: rank {rank} waiting for the root at {root} to confirm every rank's ring");
    root_conn.set_label(format!("the root at {root} to confirm that every rank linked its ring"));
    root_conn.send(&Msg::Ready, deadline).map_err(|e| e.context(&what))?;
    match root_conn.recv(MAX_CONTROL_BODY, deadline) {
        Ok(Msg::Ready) => Ok(()),
        Ok(msg) => Err(root::refusal(msg, rank, root)),
        Err(e) => Err(e.context(&what)),
    }
}
