//! TCP bootstrap: the unique id, the root rendezvous and the ring of peers.
//!
//! `ncclGetUniqueId` ([`new_unique_id`]) starts a root listener; every rank's
//! `ncclCommInitRank` ([`Bootstrap::init`]) registers its own listener with the root, gets back
//! the address of its next rank only, links into a ring (a connection to the next rank, one
//! from the previous), and gathers every rank's listen address around it. The root thus sends
//! O(n) bytes in all and each rank receives O(n), where a table sent by the root would be O(n^2)
//! through one process (docs/ARCHITECTURE.md, "Bootstrap at scale"). Collectives
//! ([`Bootstrap::allgather`], ...) run around the ring; point-to-point messages open a
//! short-lived connection each, so a rank holds five sockets (its listener, a ring link and a
//! liveness link to each neighbour) however many ranks there are. A thread per rank serves its
//! listener, so a peer's send never waits for this rank to be inside a bootstrap call.
//!
//! Every connection, to the root and to a rank's listener, first proves that it holds the
//! unique id's secret ([`auth`]); nothing else is read from it before. A rank whose connection
//! closes is named to the others within milliseconds: by the root during init, by `Lost`
//! frames passed around the ring during collectives. Once a communicator watches its
//! neighbours ([`Bootstrap::watch`]), a rank lost anywhere also ends at once every wait that
//! can no longer complete: ring collectives, and receives from that rank.
//!
//! Protocol logic is pure and tested without sockets ([`id`], [`root::RootState`], `mailbox`);
//! the sockets, frames and handshake are the socket layer's ([`crate::socket`]), and the thin
//! edges live here and in [`root::spawn`].

pub mod id;
mod listener;
pub mod liveness;
mod mailbox;
mod rendezvous;
pub mod root;

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::debug::Subsys;
use crate::error::{Error, Result};
use crate::socket::auth::{self, Credentials, Secret};
use crate::socket::frame::{FrameStream, Link, NetError};
use crate::socket::progress::Progress;
use crate::socket::wire::{self, LinkKind, Msg, MAX_DATA_BODY};
use crate::socket::{addr, iface};
use listener::{Listener, Shared};
use rendezvous::open_link;

/// The most ranks one communicator may have. NCCL's largest runs are around 100k ranks; the
/// cap bounds what a registration (honest or forged) can make the root and the ranks allocate
/// (a peer table of this many IPv6 addresses is 3 MiB).
pub const MAX_RANKS: usize = 1 << 17;

/// What goes inside ncclUniqueId's 128 bytes (layout in [`id`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootstrapId {
    /// Random per `ncclGetUniqueId` call (derived from the address under `NCCL_COMM_ID`): names
    /// the job, so that a rank given another job's id is told so. Not a credential.
    pub magic: u64,
    /// The credential: every bootstrap connection proves it holds this (see [`auth`]).
    pub secret: Secret,
    /// The root's listening address.
    pub root: SocketAddr,
    /// `NCCL_COMM_ID` mode: no root runs yet; rank 0 starts it inside [`Bootstrap::init`].
    pub root_by_rank0: bool,
}

impl BootstrapId {
    pub fn credentials(&self) -> Credentials {
        Credentials { magic: self.magic, secret: self.secret }
    }
}

/// ncclGetUniqueId: a fresh random magic and secret, and a root listener thread started on the
/// chosen interface. With `NCCL_COMM_ID=<host>:<port>` set: the id carries that address, a
/// magic derived from it and a secret derived from it and [`id::SECRET_VAR`] (every process
/// computes the same id), and no root is started here.
pub fn new_unique_id() -> Result<BootstrapId> {
    if let Some(spec) = crate::env::comm_id() {
        let (host, port) = addr::split_host_port(spec)?;
        let root = addr::resolve(host, port)?;
        let shared = crate::param::get(id::SECRET_VAR);
        let protection = match shared {
            Some(_) => format!("only processes given the same {} can join", id::SECRET_VAR),
            None => format!(
                "anyone who can reach {root} can join; set {} to the same secret on every rank to prevent it",
                id::SECRET_VAR
            ),
        };
        crate::nccl_info!(
            Subsys::BOOTSTRAP,
            "NCCL_COMM_ID={spec}: rank 0 will run the bootstrap root at {root}; {protection}"
        );
        return Ok(BootstrapId::from_comm_id(root, shared.as_deref()));
    }
    let listener = addr::listen(iface::local_ip()?)?;
    let root = listener.local_addr()?;
    let magic = u64::from_le_bytes(auth::random_bytes()?).max(1);
    let id = BootstrapId { magic, secret: Secret::random()?, root, root_by_rank0: false };
    root::spawn(listener, id.credentials())?;
    Ok(id)
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
        Error::InvalidArgument(format!(
            "unique id of {} bytes, expected {}",
            bytes.len(),
            crate::types::NCCL_UNIQUE_ID_BYTES
        ))
    })?;
    BootstrapId::from_unique_id(&id)
}

/// How long a rank that hit a loss tries to tell a ring neighbour about it.
const TELL_TIMEOUT: Duration = Duration::from_millis(500);

/// Who this rank is, as the checks on incoming connections need it.
#[derive(Clone, Copy, Debug)]
struct Me {
    cred: Credentials,
    rank: usize,
    nranks: usize,
}

impl Me {
    fn next(&self) -> usize {
        (self.rank + 1) % self.nranks
    }

    fn prev(&self) -> usize {
        (self.rank + self.nranks - 1) % self.nranks
    }
}

/// The ring links and the collective counter that keeps ranks' collectives matched.
struct Ring {
    next: FrameStream,
    prev: FrameStream,
    op: u64,
    /// Set by the first failure: the ring's streams may be mid-frame, so every later
    /// collective fails at once with the same explanation.
    broken: Option<Error>,
}

/// One rank's handle after rendezvous. Send + Sync (internally locked); used by one thread at a
/// time normally.
pub struct Bootstrap {
    me: Me,
    timeout: Duration,
    /// Every rank's listen address, for point-to-point sends. Gathered around the ring inside
    /// [`Bootstrap::init`], which returns the handle only once it is complete.
    peers: Vec<SocketAddr>,
    listen: SocketAddr,
    /// `None` for a single rank.
    ring: Option<Mutex<Ring>>,
    /// The liveness links until [`Bootstrap::watch`] takes them; `None` for a single rank.
    liveness: Mutex<Option<(FrameStream, FrameStream)>>,
    shared: Arc<Shared>,
    /// Next p2p sequence number per (peer, tag).
    send_seq: Mutex<HashMap<(usize, u32), u64>>,
    /// Readable once the liveness watcher has found a rank lost ([`Relay`] writes the other
    /// end): ring collectives poll it, so none waits for a ring that can no longer complete.
    lost_rx: UnixStream,
    lost_tx: UnixStream,
    _listener: Listener,
}

/// Passes the liveness watcher's news to the communicator's observer and to this bootstrap's
/// own waits (a receive from the lost rank, a ring collective), which then fail at once.
struct Relay<O> {
    inner: O,
    shared: Arc<Shared>,
    lost_tx: UnixStream,
}

impl<O: liveness::Observer> liveness::Observer for Relay<O> {
    fn describe(&self, rank: usize) -> String {
        self.inner.describe(rank)
    }

    fn lost(&self, lost: liveness::Lost) {
        self.shared.inbox.lock().lost.get_or_insert_with(|| lost.clone());
        self.shared.arrived.notify_all();
        let _ = (&self.lost_tx).write(&[1]);
        self.inner.lost(lost);
    }

    fn left(&self, rank: usize, colls: Option<u64>) {
        self.inner.left(rank, colls)
    }

    fn taken_part(&self) -> Option<u64> {
        self.inner.taken_part()
    }

    fn state(&self) -> String {
        self.inner.state()
    }

    fn report(&self, lines: Vec<String>) {
        self.inner.report(lines)
    }
}

impl Bootstrap {
    pub fn rank(&self) -> usize {
        self.me.rank
    }

    pub fn nranks(&self) -> usize {
        self.me.nranks
    }

    /// The unique id's magic: the same on every rank of this communicator, different for others.
    pub fn magic(&self) -> u64 {
        self.me.cred.magic
    }

    /// The unique id's credentials, for transports that authenticate their own connections
    /// with [`auth`].
    pub fn credentials(&self) -> Credentials {
        self.me.cred
    }

    /// Where this rank accepts ring and p2p connections.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// Starts watching the ring neighbours for the rest of this bootstrap's life ([`liveness`]),
    /// on behalf of `observer`. `None` for a single rank, or when called a second time. From
    /// then on a lost rank also ends this bootstrap's waits that it makes hopeless.
    pub fn watch(&self, observer: impl liveness::Observer, watch_file: bool) -> Result<Option<liveness::Watcher>> {
        let Some(links) = self.liveness.lock().take() else { return Ok(None) };
        let relay = Relay { inner: observer, shared: self.shared.clone(), lost_tx: self.lost_tx.try_clone()? };
        liveness::Watcher::start(self.me.rank, self.me.nranks, links, relay, watch_file).map(Some)
    }

    /// The rank the liveness watcher found lost, if any.
    fn lost(&self) -> Option<liveness::Lost> {
        self.shared.inbox.lock().lost.clone()
    }

    /// Every rank's bytes, indexed by rank (lengths may differ between ranks). Ring-based: in
    /// step s each rank forwards the block it received in step s-1.
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.allgather_until(mine, &self.lost_rx)
    }

    /// [`allgather`](Self::allgather), called off as soon as `stop` is readable: news of a
    /// lost rank from the liveness watcher, or inside init the root's verdict.
    fn allgather_until(&self, mine: &[u8], stop: &dyn AsRawFd) -> Result<Vec<Vec<u8>>> {
        let Me { rank, nranks: n, .. } = self.me;
        check_len(mine.len())?;
        let mut all = vec![Vec::new(); n];
        all[rank] = mine.to_vec();
        let Some(ring) = &self.ring else { return Ok(all) };
        let (mut ring, deadline) = self.lock_ring(ring)?;
        ring.op += 1;
        let op = ring.op;
        for step in 0..n - 1 {
            let (send, recv) = ((rank + n - step) % n, (rank + n - step - 1) % n);
            let frame = wire::encode_data(send as u32, op, &all[send]);
            let what = || format!("allgather #{op} step {step}");
            let msg = self.ring_step(&mut ring, &what, &frame, true, stop, deadline)?;
            all[recv] = self.ring_block(&mut ring, msg, recv, op)?;
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
        ring.op += 1;
        let op = ring.op;
        let what = || format!("broadcast #{op} from rank {root}");
        let data = match mine {
            Some(d) => d.to_vec(),
            None => {
                let msg = self.ring_step(&mut ring, &what, &[], true, &self.lost_rx, deadline)?;
                self.ring_block(&mut ring, msg, root, op)?
            }
        };
        if self.me.next() != root {
            let frame = wire::encode_data(root as u32, op, &data);
            self.ring_step(&mut ring, &what, &frame, false, &self.lost_rx, deadline)?;
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
        let Me { rank, nranks, .. } = self.me;
        if peer >= nranks {
            crate::bail_arg!("bootstrap send: peer {peer} is out of range for nranks {nranks}");
        }
        check_len(data.len())?;
        let deadline = Instant::now() + self.timeout;
        let mut seqs = self.send_seq.try_lock_until(deadline).ok_or_else(|| self.busy("send"))?;
        let seq = seqs.get(&(peer, tag)).copied().unwrap_or(0);
        if peer == rank {
            self.shared.inbox.lock().mailbox.push(rank, tag, seq, data.to_vec());
        } else {
            let addr = self.peers[peer];
            let what = || {
                format!("bootstrap: rank {rank} sending {} bytes with tag {tag} to rank {peer} at {addr}", data.len())
            };
            let mut conn = open_link(self.me, addr, LinkKind::P2p, deadline).map_err(|e| e.context(&what()))?;
            conn.set_label(format!("rank {peer} to take a message with tag {tag} from rank {rank}"));
            conn.send_bytes(&wire::encode_data(tag, seq, data), deadline).map_err(|e| e.context(&what()))?;
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
        let mut progress = Progress::new(|| format!("rank {peer}'s message with tag {tag} (rank {rank} is receiving)"));
        let mut inbox = self.shared.inbox.lock();
        loop {
            if let Some(m) = inbox.mailbox.take(peer, tag) {
                return Ok(m);
            }
            if let Some(lost) = inbox.lost.as_ref().filter(|l| l.rank == peer) {
                return Err(Error::Remote(format!(
                    "bootstrap: rank {rank} was waiting for rank {peer}'s message with tag {tag}, but rank {peer} was \
                     lost: {}",
                    lost.text
                )));
            }
            if Instant::now() >= deadline {
                return Err(Error::System(format!(
                    "bootstrap: rank {rank} got no message from rank {peer} with tag {tag} within {:?}; \
                     did rank {peer} fail or skip the matching send?",
                    self.timeout
                )));
            }
            let nap = progress.nap(Some(deadline)).unwrap_or_default();
            self.shared.arrived.wait_for(&mut inbox, nap);
            progress.tick(Some(deadline));
        }
    }

    fn lock_ring<'a>(&self, ring: &'a Mutex<Ring>) -> Result<(parking_lot::MutexGuard<'a, Ring>, Instant)> {
        let deadline = Instant::now() + self.timeout;
        let mut ring = ring.try_lock_until(deadline).ok_or_else(|| self.busy("collective"))?;
        if let (None, Some(lost)) = (&ring.broken, self.lost()) {
            ring.broken = Some(self.lost_error(&lost, "collective"));
        }
        match &ring.broken {
            Some(e) => Err(e.clone()),
            None => Ok((ring, deadline)),
        }
    }

    /// A ring collective cannot complete without every rank.
    fn lost_error(&self, lost: &liveness::Lost, what: &str) -> Error {
        Error::Remote(format!(
            "bootstrap {what}: rank {} cannot complete it: rank {} was lost: {}",
            self.me.rank, lost.rank, lost.text
        ))
    }

    fn busy(&self, what: &str) -> Error {
        Error::System(format!(
            "bootstrap: rank {} waited {:?} for another thread's bootstrap {what} on the same communicator",
            self.me.rank, self.timeout
        ))
    }

    /// One step of a ring collective ([`FrameStream::ring_step`]). A closed link or a `Lost`
    /// frame names the lost rank; the loss is passed on to both neighbours (so it travels the
    /// ring both ways and every rank names the same rank within milliseconds), and the ring
    /// stays broken.
    fn ring_step(
        &self,
        ring: &mut Ring,
        what: &dyn Fn() -> String,
        bytes: &[u8],
        recv: bool,
        stop: &dyn AsRawFd,
        deadline: Instant,
    ) -> Result<Option<Msg>> {
        let Me { rank, .. } = self.me;
        let (next, prev) = (self.me.next(), self.me.prev());
        let r = FrameStream::ring_step(&mut ring.next, bytes, recv.then_some(&mut ring.prev), Some(stop), deadline);
        let (lost, text) = match r {
            Ok(Some(Msg::Lost { rank: lost, text })) => (lost as usize, text),
            Ok(msg) => return Ok(msg),
            // The liveness watcher found a rank lost (it records which before it wakes us); its
            // neighbours learn it from their own watchers. Inside init, the root spoke instead.
            Err((_, NetError::Stopped)) => {
                let e = match self.lost() {
                    Some(l) => self.lost_error(&l, &what()),
                    None => Error::Remote(format!("bootstrap {}: rank {rank} was called off by the root", what())),
                };
                ring.broken = Some(e.clone());
                return Err(e);
            }
            Err((link, NetError::Timeout)) => {
                let waited = match link {
                    Link::Prev => format!("rank {prev} (ring prev) to send"),
                    Link::Next => format!("rank {next} (ring next) to take what it sent"),
                };
                let e = Error::System(format!(
                    "bootstrap {}: rank {rank} waited {:?} for {waited}; is that rank stuck, or not calling the \
                     same bootstrap collectives?",
                    what(),
                    self.timeout
                ));
                ring.broken = Some(e.clone());
                return Err(e);
            }
            Err((link, e)) => {
                let (lost, side) = match link {
                    Link::Next => (next, "from"),
                    Link::Prev => (prev, "to"),
                };
                (lost, format!("its ring link {side} rank {rank} failed during bootstrap {} ({e})", what()))
            }
        };
        let at = match self.peers.get(lost) {
            Some(a) => format!("listening at {a}"),
            // Inside init, while the table is being gathered.
            None if lost < self.me.nranks => "its address not gathered yet".to_string(),
            None => "no such rank".to_string(),
        };
        let e = Error::Remote(format!("bootstrap {}: rank {lost} ({at}) was lost: {text}", what()));
        ring.broken = Some(e.clone());
        let tell = wire::encode(&Msg::Lost { rank: lost as u32, text });
        let until = Instant::now() + TELL_TIMEOUT;
        if lost != next {
            let _ = ring.next.send_bytes(&tell, until);
        }
        if lost != prev {
            let _ = ring.prev.send_bytes(&tell, until);
        }
        Err(e)
    }

    /// Checks that a ring frame is the block expected in this collective: ranks that call
    /// bootstrap collectives in different orders fail here instead of mixing up data.
    fn ring_block(&self, ring: &mut Ring, msg: Option<Msg>, origin: usize, op: u64) -> Result<Vec<u8>> {
        let e = match msg {
            Some(Msg::Data { tag, seq, payload }) if tag as usize == origin && seq == op => return Ok(payload),
            Some(Msg::Data { tag, seq, .. }) => Error::InvalidUsage(format!(
                "bootstrap: rank {} expected rank {origin}'s block of collective #{op} but got rank {tag}'s of #{seq}; \
                 every rank must call the same bootstrap collectives in the same order",
                self.me.rank
            )),
            Some(other) => Error::Remote(format!(
                "bootstrap: rank {} got a {} frame on its ring link",
                self.me.rank,
                other.kind_name()
            )),
            None => Error::Internal("bootstrap: a ring step that reads returned no frame".into()),
        };
        ring.broken = Some(e.clone());
        Err(e)
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
