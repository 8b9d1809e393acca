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
//! Protocol logic is pure and tested without sockets ([`id`], [`wire`], [`root::RootState`],
//! `mailbox`); the sockets live in [`net`] and the thin edges here and in [`root::spawn`].

pub mod auth;
pub mod id;
pub mod liveness;
mod mailbox;
pub mod net;
pub mod root;
pub mod wire;

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::debug::Subsys;
use crate::error::{Error, Result};
use auth::{Credentials, Secret};
use mailbox::Mailbox;
use net::{Acceptor, Arrival, FrameStream, Link, NetError, Progress, Wake};
use wire::{LinkKind, Msg, MAX_ADDR_LEN, MAX_CONTROL_BODY, MAX_DATA_BODY};

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
        let (host, port) = id::split_host_port(spec)?;
        let root = net::resolve(host, port)?;
        let shared = crate::env::get(id::SECRET_VAR);
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
    let listener = net::listen(net::local_ip()?)?;
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

/// How much longer than the root a rank waits for its ring neighbour's address, so that when
/// ranks are missing the root's report (which names them) arrives before the rank gives up.
const ROOT_REPORT_MARGIN: Duration = Duration::from_secs(1);
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

/// What this rank's listener thread has received for the rank's own threads.
#[derive(Default)]
struct Inbox {
    mailbox: Mailbox,
    /// The links from the previous rank, until init takes them: the ring link and the liveness
    /// link (indexed by [`prev_slot`]).
    prev_links: [Option<FrameStream>; 2],
    /// Init took them: any later one is unexpected.
    prev_taken: bool,
    /// The first rank the liveness watcher found lost: receives from it fail at once.
    lost: Option<liveness::Lost>,
}

/// Where [`Inbox::prev_links`] keeps a link of this kind.
fn prev_slot(kind: LinkKind) -> usize {
    usize::from(kind == LinkKind::Liveness)
}

/// The inbox and the condition variable its readers wait on.
#[derive(Default)]
struct Shared {
    inbox: Mutex<Inbox>,
    arrived: Condvar,
}

/// The thread that serves this rank's listener for the life of the handle: it authenticates
/// every connection and files what arrives, so that a peer's send or ring link never waits for
/// this rank to be inside a bootstrap call (sends are fire-and-forget, as in NCCL).
struct Listener {
    /// Closing this end tells the thread to exit.
    stop: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    fn spawn(acceptor: Acceptor, me: Me, shared: Arc<Shared>, timeout: Duration) -> Result<Listener> {
        let (stop, stopped) = UnixStream::pair()?;
        let thread = std::thread::Builder::new()
            .name(format!("nccl-bootstrap-r{}", me.rank))
            .spawn(move || serve(acceptor, me, &shared, &stopped, timeout))
            .map_err(|e| Error::System(format!("bootstrap: could not start the listener thread: {e}")))?;
        Ok(Listener { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            // The thread wakes on the closed pair at once; it only lingers while it finishes
            // reading one message, bounded by the bootstrap timeout.
            let _ = t.join();
        }
    }
}

/// The listener thread's loop: until the handle is dropped.
fn serve(mut acceptor: Acceptor, me: Me, shared: &Shared, stopped: &UnixStream, timeout: Duration) {
    loop {
        match acceptor.next(None, &String::new, &[stopped]) {
            Ok(Some(Wake::Arrival(a))) => admit(me, shared, *a, timeout),
            Ok(_) => return,
            Err(e) => {
                crate::nccl_warn_unrecorded!("Bootstrap rank {}: the listener stops: {e}", me.rank);
                return;
            }
        }
    }
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

    fn left(&self, rank: usize) {
        self.inner.left(rank)
    }

    fn state(&self) -> String {
        self.inner.state()
    }

    fn report(&self, lines: Vec<String>) {
        self.inner.report(lines)
    }
}

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
        let acceptor = Acceptor::new(net::listen(net::local_ip()?)?, cred)?;
        let listen = acceptor.local_addr()?;
        let shared = Arc::new(Shared::default());
        let listener = Listener::spawn(acceptor, me, shared.clone(), timeout)?;
        if id.root_by_rank0 && rank == 0 {
            root::spawn(net::listen_exact(id.root)?, cred)?;
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
fn open_link(
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
fn blame(me: Me, root_conn: &mut FrameStream, lost: usize, text: String) -> Error {
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

/// Files an authenticated connection on a rank's listener: a p2p message goes to the mailbox,
/// the ring link from the previous rank to init, anything else (unknown rank, wrong kind, a
/// second ring link) is dropped and logged. Strangers never get this far: they fail the
/// handshake in [`net`].
fn admit(me: Me, shared: &Shared, a: Arrival, timeout: Duration) {
    let Arrival { mut conn, from: addr, msg } = a;
    let here = me.rank;
    match msg {
        Msg::Hello { from, link: link @ (LinkKind::Ring | LinkKind::Liveness) } if from as usize == me.prev() => {
            let mut inbox = shared.inbox.lock();
            let slot = prev_slot(link);
            match inbox.prev_taken || inbox.prev_links[slot].is_some() {
                true => crate::nccl_warn_unrecorded!(
                    "Bootstrap rank {here}: dropped a second {link:?} link from rank {from} ({addr})"
                ),
                false => inbox.prev_links[slot] = Some(conn),
            }
            shared.arrived.notify_all();
        }
        Msg::Hello { from, link: LinkKind::P2p } if (from as usize) < me.nranks => {
            match conn.recv(MAX_DATA_BODY, Instant::now() + timeout) {
                Ok(Msg::Data { tag, seq, payload }) => {
                    if !shared.inbox.lock().mailbox.push(from as usize, tag, seq, payload) {
                        crate::nccl_warn_unrecorded!(
                            "Bootstrap rank {here}: dropped a repeated message #{seq} from rank {from} with tag {tag}"
                        );
                    }
                    shared.arrived.notify_all();
                }
                Ok(other) => crate::nccl_warn_unrecorded!(
                    "Bootstrap rank {here}: rank {from} sent {} instead of data",
                    other.kind_name()
                ),
                Err(e) => {
                    crate::nccl_warn_unrecorded!("Bootstrap rank {here}: lost a message from rank {from} ({addr}): {e}")
                }
            }
        }
        Msg::Hello { from, link } => crate::nccl_warn_unrecorded!(
            "Bootstrap rank {here}: dropped a {link:?} link from {addr} claiming rank {from} of {}",
            me.nranks
        ),
        other => crate::nccl_warn_unrecorded!(
            "Bootstrap rank {here}: dropped a connection from {addr} that opened with {}",
            other.kind_name()
        ),
    }
}
