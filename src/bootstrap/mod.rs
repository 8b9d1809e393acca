//! TCP bootstrap: the unique id, the root rendezvous and the ring of peers.
//!
//! `ncclGetUniqueId` ([`new_unique_id`]) starts a root listener; every rank's
//! `ncclCommInitRank` ([`Bootstrap::init`]) registers its own listener with the root, gets the
//! table of all listeners back, and links into a ring (a connection to the next rank, one from
//! the previous). Collectives ([`Bootstrap::allgather`], ...) run around the ring;
//! point-to-point messages open a short-lived connection each, so a rank holds three sockets
//! however many ranks there are.
//!
//! Protocol logic is pure and tested without sockets ([`id`], [`wire`], [`root::RootState`],
//! `mailbox`); the sockets live in [`net`] and the thin edges here and in [`root::spawn`].

pub mod id;
mod mailbox;
pub mod net;
pub mod root;
pub mod wire;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::debug::Subsys;
use crate::error::{Error, Result};
use mailbox::Mailbox;
use net::{Acceptor, Arrival, FrameStream};
use wire::{LinkKind, Msg, MAX_CONTROL_BODY, MAX_DATA_BODY};

/// What goes inside ncclUniqueId's 128 bytes (layout in [`id`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootstrapId {
    /// Random per `ncclGetUniqueId` call (derived from the address under `NCCL_COMM_ID`); every
    /// frame that opens a connection carries it, so strangers and other jobs are told apart.
    pub magic: u64,
    /// The root's listening address.
    pub root: SocketAddr,
    /// `NCCL_COMM_ID` mode: no root runs yet; rank 0 starts it inside [`Bootstrap::init`].
    pub root_by_rank0: bool,
}

/// ncclGetUniqueId: a fresh random magic, and a root listener thread started on the chosen
/// interface. With `NCCL_COMM_ID=<host>:<port>` set: the id carries that address and a magic
/// derived from it (every process computes the same id), and no root is started here.
pub fn new_unique_id() -> Result<BootstrapId> {
    if let Some(spec) = crate::env::comm_id() {
        let (host, port) = id::split_host_port(spec)?;
        let root = net::resolve(host, port)?;
        crate::nccl_info!(Subsys::BOOTSTRAP, "NCCL_COMM_ID={spec}: rank 0 will run the bootstrap root at {root}");
        return Ok(BootstrapId::from_comm_id(root));
    }
    let listener = net::listen(net::local_ip())?;
    let root = listener.local_addr()?;
    let magic = net::random_magic();
    root::spawn(listener, magic)?;
    Ok(BootstrapId { magic, root, root_by_rank0: false })
}

/// The p2p tag of [`share_id`]'s messages.
const TAG_SHARE_ID: u32 = 0x5b17;

/// A fresh unique id made by the first of `members` (ranks of `parent`, in new-rank order; this
/// rank is one of them) and sent point to point to the others, for ncclCommSplit and
/// ncclCommShrink. Nothing goes around the parent's ring, so ranks outside `members` (maybe dead)
/// take no part.
pub fn share_id(parent: &Bootstrap, members: &[usize]) -> Result<BootstrapId> {
    let leader = members[0];
    if parent.rank() == leader {
        let id = new_unique_id()?;
        let bytes = id.to_unique_id().to_bytes();
        for &m in &members[1..] {
            parent.send(m, TAG_SHARE_ID, &bytes)?;
        }
        return Ok(id);
    }
    let bytes = parent.recv(leader, TAG_SHARE_ID)?;
    let id = crate::types::ncclUniqueId::from_bytes(&bytes).ok_or_else(|| {
        Error::InvalidArgument(format!("unique id of {} bytes, expected {}", bytes.len(), crate::types::NCCL_UNIQUE_ID_BYTES))
    })?;
    BootstrapId::from_unique_id(&id)
}

/// How much longer than the root a rank waits for the peer table, so that when ranks are
/// missing the root's report (which names them) arrives before the rank gives up on its own.
const ROOT_REPORT_MARGIN: Duration = Duration::from_secs(1);

/// Who this rank is, as the checks on incoming connections need it.
#[derive(Clone, Copy, Debug)]
struct Me {
    magic: u64,
    rank: usize,
    nranks: usize,
}

/// The ring links and the collective counter that keeps ranks' collectives matched.
struct Ring {
    next: FrameStream,
    prev: FrameStream,
    op: u64,
}

/// One rank's handle after rendezvous. Send + Sync (internally locked); used by one thread at a
/// time normally.
pub struct Bootstrap {
    me: Me,
    timeout: Duration,
    peers: Vec<SocketAddr>,
    listen: SocketAddr,
    /// `None` for a single rank.
    ring: Option<Mutex<Ring>>,
    acceptor: Mutex<Acceptor>,
    mailbox: Mutex<Mailbox>,
    /// Next p2p sequence number per (peer, tag).
    send_seq: Mutex<HashMap<(usize, u32), u64>>,
}

impl Bootstrap {
    /// Register with the root, receive the peer table, connect the ring (to next, from prev).
    /// `timeout` bounds every wait (cut to [`root::MAX_TIMEOUT`]); on failure the error names
    /// the missing/bad rank(s).
    pub fn init(id: &BootstrapId, rank: usize, nranks: usize, timeout: Duration) -> Result<Bootstrap> {
        if nranks == 0 || nranks > u32::MAX as usize || rank >= nranks {
            crate::bail_arg!("bootstrap: rank {rank} is out of range for nranks {nranks}");
        }
        if timeout.is_zero() {
            crate::bail_arg!("bootstrap: a zero timeout leaves no time to rendezvous; set NCCL_BOOTSTRAP_TIMEOUT > 0");
        }
        let timeout = timeout.min(root::MAX_TIMEOUT);
        let start = Instant::now();
        let mut acceptor = Acceptor::new(net::listen(net::local_ip())?)?;
        let listen = acceptor.local_addr()?;
        if id.root_by_rank0 && rank == 0 {
            root::spawn(net::listen_exact(id.root)?, id.magic)?;
        }
        let peers = register(id, rank, nranks, listen, timeout, start)?;
        let me = Me { magic: id.magic, rank, nranks };
        let mailbox = Mutex::new(Mailbox::default());
        let ring = match nranks {
            1 => None,
            _ => Some(Mutex::new(connect_ring(me, &peers, &mut acceptor, &mailbox, timeout)?)),
        };
        crate::nccl_info!(
            Subsys::BOOTSTRAP,
            "Bootstrap rank {rank}/{nranks} ready in {:?}: listening on {listen}, root {}",
            start.elapsed(),
            id.root
        );
        Ok(Bootstrap {
            me,
            timeout,
            peers,
            listen,
            ring,
            acceptor: Mutex::new(acceptor),
            mailbox,
            send_seq: Mutex::new(HashMap::new()),
        })
    }

    pub fn rank(&self) -> usize {
        self.me.rank
    }

    pub fn nranks(&self) -> usize {
        self.me.nranks
    }

    /// The unique id's magic: the same on every rank of this communicator, different for others.
    pub fn magic(&self) -> u64 {
        self.me.magic
    }

    /// Where this rank accepts ring and p2p connections.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// Every rank's bytes, indexed by rank (lengths may differ between ranks). Ring-based: in
    /// step s each rank forwards the block it received in step s-1.
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let Me { rank, nranks: n, .. } = self.me;
        check_len(mine.len())?;
        let mut all = vec![Vec::new(); n];
        all[rank] = mine.to_vec();
        let Some(ring) = &self.ring else { return Ok(all) };
        let (mut ring, deadline) = self.lock_ring(ring)?;
        let Ring { next, prev, op } = &mut *ring;
        *op += 1;
        for step in 0..n - 1 {
            let (send, recv) = ((rank + n - step) % n, (rank + n - step - 1) % n);
            let frame = wire::encode_data(send as u32, *op, &all[send]);
            let msg = FrameStream::exchange(next, &frame, prev, MAX_DATA_BODY, deadline)
                .map_err(|e| e.context(&self.ring_context("allgather", step)))?;
            all[recv] = self.ring_block(msg, recv, *op)?;
        }
        Ok(all)
    }

    /// `data` must be Some on `root`; everyone returns root's bytes. The bytes travel the ring.
    pub fn broadcast(&self, root: usize, data: Option<&[u8]>) -> Result<Vec<u8>> {
        let Me { rank, nranks: n, .. } = self.me;
        if root >= n {
            crate::bail_arg!("bootstrap broadcast: root {root} is out of range for nranks {n}");
        }
        let mine = match (rank == root, data) {
            (true, None) => crate::bail_arg!("bootstrap broadcast: rank {rank} is the root but gave no data"),
            (true, Some(d)) => Some(check_len(d.len()).map(|_| d)?),
            (false, _) => None,
        };
        let Some(ring) = &self.ring else { return Ok(mine.unwrap_or_default().to_vec()) };
        let (mut ring, deadline) = self.lock_ring(ring)?;
        let Ring { next, prev, op } = &mut *ring;
        *op += 1;
        let ctx = |e: net::NetError| e.context(&self.ring_context("broadcast", 0));
        let data = match mine {
            Some(d) => d.to_vec(),
            None => {
                let msg = prev.recv(MAX_DATA_BODY, deadline).map_err(ctx)?;
                self.ring_block(msg, root, *op)?
            }
        };
        if (rank + 1) % n != root {
            next.send_bytes(&wire::encode_data(root as u32, *op, &data), deadline).map_err(ctx)?;
        }
        Ok(data)
    }

    /// Returns once every rank has entered the barrier (an allgather of nothing).
    pub fn barrier(&self) -> Result<()> {
        self.allgather(&[]).map(drop)
    }

    /// Point-to-point with a tag; messages from one peer with one tag arrive in order. Each
    /// message uses its own connection, closed after writing, so no descriptors pile up.
    pub fn send(&self, peer: usize, tag: u32, data: &[u8]) -> Result<()> {
        let Me { magic, rank, nranks } = self.me;
        if peer >= nranks {
            crate::bail_arg!("bootstrap send: peer {peer} is out of range for nranks {nranks}");
        }
        check_len(data.len())?;
        let deadline = Instant::now() + self.timeout;
        let mut seqs = self.send_seq.try_lock_until(deadline).ok_or_else(|| self.busy("send"))?;
        let seq = seqs.get(&(peer, tag)).copied().unwrap_or(0);
        if peer == rank {
            self.mailbox.lock().push(rank, tag, seq, data.to_vec());
        } else {
            let addr = self.peers[peer];
            let what = || {
                format!("bootstrap: rank {rank} sending {} bytes with tag {tag} to rank {peer} at {addr}", data.len())
            };
            let mut conn = FrameStream::connect(addr, deadline).map_err(|e| e.context(&what()))?;
            conn.set_label(format!("rank {peer} to take a message with tag {tag} from rank {rank}"));
            let mut frames = wire::encode(&Msg::Hello { magic, from: rank as u32, link: LinkKind::P2p });
            frames.extend(wire::encode_data(tag, seq, data));
            conn.send_bytes(&frames, deadline).map_err(|e| e.context(&what()))?;
        }
        seqs.insert((peer, tag), seq + 1);
        Ok(())
    }

    /// Blocks up to the timeout for the next message from `peer` with `tag`; messages for other
    /// (peer, tag) pairs that arrive meanwhile are kept for their own `recv`.
    pub fn recv(&self, peer: usize, tag: u32) -> Result<Vec<u8>> {
        let Me { rank, nranks, .. } = self.me;
        if peer >= nranks {
            crate::bail_arg!("bootstrap recv: peer {peer} is out of range for nranks {nranks}");
        }
        let deadline = Instant::now() + self.timeout;
        let take = || self.mailbox.lock().take(peer, tag);
        if let Some(m) = take() {
            return Ok(m);
        }
        let mut acceptor = self.acceptor.try_lock_until(deadline).ok_or_else(|| self.busy("recv"))?;
        loop {
            if let Some(m) = take() {
                return Ok(m);
            }
            let waiting_for = || format!("rank {peer}'s message with tag {tag} (rank {rank} is receiving)");
            match acceptor.next(Some(deadline), &waiting_for)? {
                Some(arrival) => drop(admit(self.me, &self.mailbox, arrival, deadline, None)),
                None => {
                    return Err(Error::System(format!(
                        "bootstrap: rank {rank} got no message from rank {peer} with tag {tag} within {:?}; \
                         did rank {peer} fail or skip the matching send?",
                        self.timeout
                    )))
                }
            }
        }
    }

    fn lock_ring<'a>(&self, ring: &'a Mutex<Ring>) -> Result<(parking_lot::MutexGuard<'a, Ring>, Instant)> {
        let deadline = Instant::now() + self.timeout;
        Ok((ring.try_lock_until(deadline).ok_or_else(|| self.busy("collective"))?, deadline))
    }

    fn busy(&self, what: &str) -> Error {
        Error::System(format!(
            "bootstrap: rank {} waited {:?} for another thread's bootstrap {what} on the same communicator",
            self.me.rank, self.timeout
        ))
    }

    fn ring_context(&self, what: &str, step: usize) -> String {
        let Me { rank, nranks: n, .. } = self.me;
        format!(
            "bootstrap {what} step {step}: rank {rank} exchanging with rank {} (next) and rank {} (prev)",
            (rank + 1) % n,
            (rank + n - 1) % n
        )
    }

    /// Checks that a ring frame is the block expected in this collective: ranks that call
    /// bootstrap collectives in different orders fail here instead of mixing up data.
    fn ring_block(&self, msg: Msg, origin: usize, op: u64) -> Result<Vec<u8>> {
        match msg {
            Msg::Data { tag, seq, payload } if tag as usize == origin && seq == op => Ok(payload),
            Msg::Data { tag, seq, .. } => Err(Error::InvalidUsage(format!(
                "bootstrap: rank {} expected rank {origin}'s block of collective #{op} but got rank {tag}'s of #{seq}; \
                 every rank must call the same bootstrap collectives in the same order",
                self.me.rank
            ))),
            other => Err(Error::Remote(format!(
                "bootstrap: rank {} got a {} frame on its ring link",
                self.me.rank,
                other.kind_name()
            ))),
        }
    }
}

fn check_len(len: usize) -> Result<()> {
    match len > MAX_DATA_BODY - 12 {
        true => {
            Err(Error::InvalidArgument(format!("bootstrap: {len} bytes exceed the {MAX_DATA_BODY}-byte message limit")))
        }
        false => Ok(()),
    }
}

/// Registers with the root and waits for the peer table (or the root's refusal).
fn register(
    id: &BootstrapId,
    rank: usize,
    nranks: usize,
    listen: SocketAddr,
    timeout: Duration,
    start: Instant,
) -> Result<Vec<SocketAddr>> {
    let root = id.root;
    let mut conn = FrameStream::connect(root, start + timeout).map_err(|e| {
        Error::System(format!(
            "bootstrap: rank {rank} could not reach the root at {root} within {timeout:?} ({e}); check that the \
             process that called ncclGetUniqueId (or rank 0 under NCCL_COMM_ID) is running and reachable"
        ))
    })?;
    conn.set_label(format!(
        "the peer table from the root at {root} (rank {rank} registered; the root waits for the others, \
         and its own log names the missing ranks)"
    ));
    let deadline = Instant::now() + timeout + ROOT_REPORT_MARGIN;
    let reg = Msg::Register {
        magic: id.magic,
        rank: rank as u32,
        nranks: nranks as u32,
        listen,
        timeout_ms: timeout.as_millis().min(u64::MAX as u128) as u64,
    };
    let what = format!("bootstrap: rank {rank} registering with the root at {root}");
    conn.send(&reg, deadline).map_err(|e| e.context(&what))?;
    let reply = conn.recv(MAX_CONTROL_BODY, deadline).map_err(|e| match e {
        net::NetError::Timeout => Error::System(format!(
            "bootstrap: rank {rank} got no peer table from the root at {root} within {:?}; \
             other ranks have not registered, or the root is stuck",
            timeout + ROOT_REPORT_MARGIN
        )),
        e => e.context(&what),
    })?;
    root::check_reply(reply, rank, nranks, root)
}

/// Opens the link to the next rank and waits for the previous rank's, stashing any p2p
/// message that arrives first (a faster peer may already be sending to us).
fn connect_ring(
    me: Me,
    peers: &[SocketAddr],
    acceptor: &mut Acceptor,
    mailbox: &Mutex<Mailbox>,
    timeout: Duration,
) -> Result<Ring> {
    let deadline = Instant::now() + timeout;
    let (next, prev) = ((me.rank + 1) % me.nranks, (me.rank + me.nranks - 1) % me.nranks);
    let what = format!(
        "bootstrap: rank {} could not open its ring link to rank {next} at {} (did rank {next} fail?)",
        me.rank, peers[next]
    );
    let mut out = FrameStream::connect(peers[next], deadline).map_err(|e| e.context(&what))?;
    out.set_label(format!("rank {next} (ring next)"));
    out.send(&Msg::Hello { magic: me.magic, from: me.rank as u32, link: LinkKind::Ring }, deadline)
        .map_err(|e| e.context(&what))?;
    let waiting_for = || format!("rank {prev} to open its ring link to rank {}", me.rank);
    loop {
        match acceptor.next(Some(deadline), &waiting_for)? {
            Some(arrival) => {
                if let Some(mut inp) = admit(me, mailbox, arrival, deadline, Some(prev)) {
                    inp.set_label(format!("rank {prev} (ring prev)"));
                    return Ok(Ring { next: out, prev: inp, op: 0 });
                }
            }
            None => return Err(Error::System(format!(
                "bootstrap: rank {prev} did not open its ring link to rank {} within {timeout:?}; it may have failed",
                me.rank
            ))),
        }
    }
}

/// Screens a connection on a rank's listener: a p2p message goes to the mailbox, the expected
/// ring link is returned, anything else (wrong magic, unknown rank, garbage) is dropped and
/// logged.
fn admit(
    me: Me,
    mailbox: &Mutex<Mailbox>,
    a: Arrival,
    deadline: Instant,
    ring_from: Option<usize>,
) -> Option<FrameStream> {
    let Arrival { mut conn, from: addr, msg } = a;
    let here = me.rank;
    match msg {
        Msg::Hello { magic, from, link } if magic == me.magic && (from as usize) < me.nranks => match link {
            LinkKind::Ring if ring_from == Some(from as usize) => Some(conn),
            LinkKind::Ring => {
                crate::nccl_warn!("Bootstrap rank {here}: dropped an unexpected ring link from rank {from} ({addr})");
                None
            }
            LinkKind::P2p => {
                match conn.recv(MAX_DATA_BODY, deadline) {
                    Ok(Msg::Data { tag, seq, payload }) => {
                        if !mailbox.lock().push(from as usize, tag, seq, payload) {
                            crate::nccl_warn!("Bootstrap rank {here}: dropped a repeated message #{seq} from rank {from} with tag {tag}");
                        }
                    }
                    Ok(other) => crate::nccl_warn!(
                        "Bootstrap rank {here}: rank {from} sent {} instead of data",
                        other.kind_name()
                    ),
                    Err(e) => crate::nccl_warn!("Bootstrap rank {here}: lost a message from rank {from} ({addr}): {e}"),
                }
                None
            }
        },
        Msg::Hello { magic, from, .. } if magic == me.magic => {
            crate::nccl_warn!(
                "Bootstrap rank {here}: dropped a connection from {addr} claiming rank {from} of {}",
                me.nranks
            );
            None
        }
        Msg::Hello { .. } => {
            crate::nccl_warn!(
                "Bootstrap rank {here}: dropped a connection from {addr} with a wrong magic (another job?)"
            );
            None
        }
        other => {
            crate::nccl_warn!(
                "Bootstrap rank {here}: dropped a connection from {addr} that opened with {}",
                other.kind_name()
            );
            None
        }
    }
}
