//! The NET transport's connections: for each (peer, channel) a send comm to the peer and a
//! receive comm from it, proven to come from a member of the communicator, their host FIFOs, and
//! the `fnConn` the kernels use (`docs/NET.md`, "The NET transport").
//!
//! Setup, on every rank at once: pick the net ([`super::init`]), listen once, share the
//! listener's handle and a fresh challenge nonce through the bootstrap (which is authenticated),
//! connect to every peer's handle once per channel and accept as many connections. Each send
//! comm's first message is an introduction: the communicator's magic, who sends it (rank, peer,
//! channel and a random part: the connector nonce) and an HMAC over the receiver's challenge and
//! that nonce with the unique id's secret ([`crate::socket::auth`]). An accepted connection is
//! used only once its introduction checks out; one that does not (a stranger, garbage, a replay
//! for a connection already made) is closed with a WARN while the others go on. Everything
//! happens under one deadline that names what is still missing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::proxy::{self, Entry, FaultHook, HostBlock, Launches, Layout, Proxy, TraceInfo};
use super::{Connecting, Handle, MemHandle, Net, PtrKind, RecvBuf, RecvComm, Request, SendComm};
use crate::abi::{fnConn, fnConnRecv, fnConnSend, FN_CONN_TAIL_LL128, FN_NUM_PROTOS};
use crate::bootstrap::Bootstrap;
use crate::debug::Subsys;
use crate::error::{Error, Result};
use crate::plugin::profiler::Profiler;
use crate::socket::auth::{self, Credentials, Nonce, Role, NONCE_LEN};
use crate::topo::PeerInfo;
use crate::transport::conn_plan::ConnPlan;
use crate::transport::{net_pairs, Cx, Half, Kind, Pairs, Started, Transport, TransportSetup};

pub use crate::transport::conn_plan::NET_MAX_CHANNELS as MAX_CHANNELS;
/// Bytes of an introduction: tag, magic, connector nonce, proof.
const INTRO_BYTES: usize = 8 + 8 + NONCE_LEN + auth::MAC_LEN;
const INTRO_TAG: &[u8; 8] = b"FNNETINT";
/// The net tag of the introduction message.
const TAG_INTRO: i32 = 0x1d;
/// The bootstrap tag of a runtime connection's handle and challenge ([`NetTransport::connect_pair`]).
const TAG_PAIR: u32 = 0xc0ec7;
/// Accepted connections whose introduction has not arrived, beyond those we expect.
const MAX_EXTRA_CANDIDATES: usize = 64;

/// What an introduction claims, once its proof checked out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim {
    rank: usize,
    ch: usize,
}

/// The connector nonce: who connects to whom on which channel, and 4 random bytes, so a proof
/// is bound to one connection.
fn connector_nonce(rank: usize, peer: usize, ch: usize) -> Result<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    n[..4].copy_from_slice(&(rank as u32).to_le_bytes());
    n[4..8].copy_from_slice(&(peer as u32).to_le_bytes());
    n[8..12].copy_from_slice(&(ch as u32).to_le_bytes());
    n[12..].copy_from_slice(&auth::random_bytes::<4>()?);
    Ok(n)
}

fn intro(cred: &Credentials, rank: usize, peer: usize, ch: usize, challenge: &Nonce) -> Result<[u8; INTRO_BYTES]> {
    let cn = connector_nonce(rank, peer, ch)?;
    let mut b = [0u8; INTRO_BYTES];
    b[..8].copy_from_slice(INTRO_TAG);
    b[8..16].copy_from_slice(&cred.magic.to_le_bytes());
    b[16..32].copy_from_slice(&cn);
    b[32..].copy_from_slice(&cred.secret.proof(Role::Connector, challenge, &cn));
    Ok(b)
}

/// Checks an introduction received by `me`, whose challenge was `challenge`; the error says
/// what was wrong, for the WARN.
fn check_intro(b: &[u8], cred: &Credentials, me: usize, challenge: &Nonce) -> std::result::Result<Claim, String> {
    if b.len() != INTRO_BYTES || &b[..8] != INTRO_TAG {
        return Err(format!("not an introduction ({} bytes)", b.len()));
    }
    if u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")) != cred.magic {
        return Err("an introduction for another communicator".into());
    }
    let cn: Nonce = b[16..32].try_into().expect("16 bytes");
    let proof: auth::Proof = b[32..].try_into().expect("32 bytes");
    if !cred.secret.verify(Role::Connector, challenge, &cn, &proof) {
        return Err("its proof of the communicator's secret is wrong".into());
    }
    let field = |i: usize| u32::from_le_bytes(cn[i..i + 4].try_into().expect("4 bytes")) as usize;
    if field(4) != me {
        return Err(format!("an introduction meant for rank {}", field(4)));
    }
    Ok(Claim { rank: field(0), ch: field(8) })
}

/// A rank's connection record, as the bootstrap carried it: its listener's handle, then its
/// challenge nonce. Anything else is refused, naming the rank.
fn split_record(b: &[u8], from: usize) -> Result<(Handle, Nonce)> {
    if b.len() != super::HANDLE_BYTES + NONCE_LEN {
        return Err(Error::Internal(format!(
            "NET: rank {from} sent a connection record of {} bytes, not a handle and a challenge",
            b.len()
        )));
    }
    let (h, c) = b.split_at(super::HANDLE_BYTES);
    Ok((h.try_into().expect("handle bytes"), c.try_into().expect("nonce bytes")))
}

/// A connection on its way: our send comm (connecting, then sending its introduction) and the
/// receive comm accepted from the peer.
struct Pending {
    peer: usize,
    ch: usize,
    connecting: Option<Box<dyn Connecting>>,
    // The comm is dropped before the introduction it may still be sending.
    send: Option<Box<dyn SendComm>>,
    sending: Option<(Request, MemHandle)>,
    intro: Box<[u8; INTRO_BYTES]>,
    sent: bool,
    recv: Option<Box<dyn RecvComm>>,
}

/// An accepted connection waiting for its introduction.
struct Candidate {
    /// Dropped before the buffer its receive may still be writing.
    comm: Option<Box<dyn RecvComm>>,
    req: Request,
    mr: Option<MemHandle>,
    buf: Box<[u8; INTRO_BYTES]>,
    since: Instant,
}

impl Drop for Candidate {
    fn drop(&mut self) {
        if let (Some(c), Some(mr)) = (self.comm.as_mut(), self.mr.take()) {
            let _ = c.dereg_mr(mr);
        }
    }
}

/// What [`establish`] needs to know about this rank and its peers.
pub struct Peers<'a> {
    pub rank: usize,
    /// Every rank's listen handle and challenge nonce (ours included).
    pub handles: &'a [Handle],
    pub challenges: &'a [Nonce],
    /// How messages name a rank: "rank 3 (host h, pid 7)".
    pub names: &'a [String],
    pub cred: Credentials,
}

impl<'a> Peers<'a> {
    /// This rank of `bootstrap`, with every rank's handle and challenge (only ours and those of
    /// the peers we connect are read).
    fn of(bootstrap: &Bootstrap, handles: &'a [Handle], challenges: &'a [Nonce], names: &'a [String]) -> Peers<'a> {
        Peers { rank: bootstrap.rank(), handles, challenges, names, cred: bootstrap.credentials() }
    }

    fn name(&self, r: usize) -> String {
        self.names.get(r).cloned().unwrap_or_else(|| format!("rank {r}"))
    }
}

/// One connection, made and authenticated: (peer, channel, our send comm, our receive comm).
pub type Link = (usize, usize, Box<dyn SendComm>, Box<dyn RecvComm>);

/// Connects to and accepts from every (peer, channel) of `conns` (each pair once; the peers call
/// it with the mirror image), authenticating every accepted connection, before `deadline`.
pub fn establish(
    net: &dyn Net,
    listener: &mut dyn super::Listener,
    who: &Peers,
    conns: &[(usize, usize)],
    deadline: Instant,
) -> Result<Vec<Link>> {
    let me = who.rank;
    let mut pending: Vec<Pending> = Vec::with_capacity(conns.len());
    let mut index = HashMap::new();
    for &(peer, ch) in conns {
        if peer == me || peer >= who.handles.len() || index.insert((peer, ch), pending.len()).is_some() {
            return Err(Error::Internal(format!("NET: connection plan of rank {me} lists ({peer}, {ch}) wrongly")));
        }
        let connecting = net
            .connect(0, &who.handles[peer])
            .map_err(|e| e.context(&format!("NET: connecting to {} (channel {ch})", who.name(peer))))?;
        pending.push(Pending {
            peer,
            ch,
            connecting: Some(connecting),
            send: None,
            sending: None,
            intro: Box::new(intro(&who.cred, me, peer, ch, &who.challenges[peer])?),
            sent: false,
            recv: None,
        });
    }
    let mut candidates: Vec<Candidate> = Vec::new();
    let challenge = who.challenges[me];
    loop {
        let mut moved = false;
        for p in pending.iter_mut() {
            moved |= advance_send(p, who).map_err(|e| {
                e.context(&format!("NET: rank {me}: connection to {} (channel {})", who.name(p.peer), p.ch))
            })?;
        }
        while let Some(comm) = listener.accept()? {
            moved = true;
            if candidates.len() >= conns.len() + MAX_EXTRA_CANDIDATES {
                crate::nccl_warn!(
                    "NET: rank {me} closed an accepted connection: {} are already unidentified",
                    candidates.len()
                );
                continue;
            }
            match Candidate::start(comm) {
                Ok(c) => candidates.push(c),
                Err(e) => crate::nccl_warn!("NET: rank {me} closed an accepted connection: {e}"),
            }
        }
        let mut i = 0;
        while i < candidates.len() {
            let c = &mut candidates[i];
            let verdict = match c.comm.as_mut().expect("present until taken").test(&c.req) {
                Ok(None) => {
                    i += 1;
                    continue;
                }
                Ok(Some(sizes)) => {
                    let n = sizes.first().copied().unwrap_or(0).min(INTRO_BYTES);
                    check_intro(&c.buf[..n], &who.cred, me, &challenge)
                }
                Err(e) => Err(format!("it failed before introducing itself: {e}")),
            };
            let c = candidates.swap_remove(i);
            moved = true;
            let slot = verdict.and_then(|claim| {
                let k = index.get(&(claim.rank, claim.ch)).copied().ok_or_else(|| {
                    format!(
                        "it claims to be {} on channel {}, which has no connection with us",
                        who.name(claim.rank),
                        claim.ch
                    )
                })?;
                if pending[k].recv.is_some() {
                    return Err(format!(
                        "{} on channel {} is already connected (a replay?)",
                        who.name(claim.rank),
                        claim.ch
                    ));
                }
                Ok(k)
            });
            match slot {
                Ok(k) => pending[k].recv = Some(c.into_comm()),
                Err(why) => crate::nccl_warn!("NET: rank {me} refused an incoming connection: {why}"),
            }
        }
        if pending.iter().all(|p| p.sent && p.recv.is_some()) {
            break;
        }
        if Instant::now() > deadline {
            let missing: Vec<String> = pending
                .iter()
                .flat_map(|p| {
                    let name = who.name(p.peer);
                    let s = (!p.sent).then(|| format!("to {name} (channel {})", p.ch));
                    let r = p.recv.is_none().then(|| format!("from {name} (channel {})", p.ch));
                    s.into_iter().chain(r)
                })
                .collect();
            return Err(Error::Remote(format!(
                "NET: rank {me}: connections not established in time: {}{}",
                missing.join(", "),
                if candidates.is_empty() {
                    String::new()
                } else {
                    format!(" ({} accepted connection(s) never introduced themselves)", candidates.len())
                }
            )));
        }
        if !moved {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // Whoever is still unidentified is not one of ours.
    for c in &candidates {
        crate::nccl_warn!(
            "NET: rank {me} closed an incoming connection that did not introduce itself in {:?}",
            c.since.elapsed()
        );
    }
    drop(candidates);
    Ok(pending
        .into_iter()
        .map(|mut p| (p.peer, p.ch, p.send.take().expect("sent"), p.recv.take().expect("received")))
        .collect())
}

/// Moves our half of one connection on: connect, then send the introduction.
fn advance_send(p: &mut Pending, who: &Peers) -> Result<bool> {
    if p.sent {
        return Ok(false);
    }
    if let Some(c) = p.connecting.as_mut() {
        let Some(comm) = c.poll()? else { return Ok(false) };
        p.connecting = None;
        p.send = Some(comm);
    }
    let comm = p.send.as_mut().expect("connected above");
    match &p.sending {
        None => {
            let mr = comm.reg_mr(p.intro.as_mut_ptr(), INTRO_BYTES, PtrKind::Host)?;
            // SAFETY: the introduction is boxed in `p`, which outlives the request: the comm is
            // dropped before it, and `sent` is set only once the send completed.
            match unsafe { comm.isend(p.intro.as_ptr(), INTRO_BYTES, TAG_INTRO, &mr)? } {
                Some(r) => p.sending = Some((r, mr)),
                None => comm.dereg_mr(mr)?,
            }
            Ok(true)
        }
        Some((r, _)) => {
            if comm.test(r)?.is_none() {
                return Ok(false);
            }
            let (_, mr) = p.sending.take().expect("matched above");
            comm.dereg_mr(mr)?;
            p.sent = true;
            crate::nccl_trace!(
                Subsys::NET,
                "NET: rank {} introduced itself to {} (channel {})",
                who.rank,
                who.name(p.peer),
                p.ch
            );
            Ok(true)
        }
    }
}

impl Candidate {
    fn start(mut comm: Box<dyn RecvComm>) -> Result<Candidate> {
        let mut buf = Box::new([0u8; INTRO_BYTES]);
        let mr = comm.reg_mr(buf.as_mut_ptr(), INTRO_BYTES, PtrKind::Host)?;
        let b = RecvBuf { data: buf.as_mut_ptr(), size: INTRO_BYTES, tag: TAG_INTRO };
        // SAFETY: the buffer is boxed in the candidate, which drops its comm first.
        let req = match unsafe { comm.irecv(&[b], &[&mr]) } {
            Ok(Some(r)) => r,
            Ok(None) => {
                let _ = comm.dereg_mr(mr);
                return Err(Error::Internal("a fresh receive comm has no free request".into()));
            }
            Err(e) => {
                let _ = comm.dereg_mr(mr);
                return Err(e);
            }
        };
        Ok(Candidate { comm: Some(comm), req, mr: Some(mr), buf, since: Instant::now() })
    }

    /// The comm, once its introduction checked out (the receive is done: the buffer is free).
    fn into_comm(mut self) -> Box<dyn RecvComm> {
        let mut comm = self.comm.take().expect("present until taken");
        if let Some(mr) = self.mr.take() {
            let _ = comm.dereg_mr(mr);
        }
        comm
    }
}

/// How [`NetTransport::connect`] sets up this rank's connections.
#[derive(Clone)]
pub struct Setup {
    /// The CUDA device whose proxy thread drives the connections.
    pub dev: i32,
    /// Bytes of one connection's Simple FIFO (all its slots).
    pub fifo_bytes: usize,
    /// How messages name each rank.
    pub names: Vec<String>,
    /// Called with the error that first ended one of the connections (a peer gone); later
    /// failures are only logged.
    pub fault: FaultHook,
    /// How long connecting may take in all.
    pub timeout: Duration,
    /// The net the connections go through, initialised once for the communicator.
    pub net: Arc<dyn Net>,
    /// The communicator's profiler plugin, told of the proxy's ops and steps.
    pub profiler: Option<Arc<Profiler>>,
    /// The CPUs near the GPU (`crate::affinity`): a proxy started for these connections runs
    /// there, or on `NCCL_PROXY_CPUSET`.
    pub cpus: Option<crate::affinity::CpuSet>,
    /// The communicator's ranks on this machine, ours included (`PeerInfo::machine`): they share
    /// its CPUs with the proxy threads.
    pub machine_ranks: usize,
    /// The communicator's ranks that this one reaches over the net: a second send thread needs
    /// two.
    pub net_peers: usize,
}

/// The NET transport of one communicator on one rank: its connections, in the proxy.
pub struct NetTransport {
    proxy: Arc<Proxy>,
    ids: Vec<u64>,
    blocks: HashMap<(usize, usize), Arc<HostBlock>>,
    layout: Layout,
    /// Told once when a peer fails its connections (the rest only log).
    fault: FaultHook,
    /// The net's name ("Socket" or the plugin's), for logs.
    pub net_name: String,
    profiler: Option<Arc<Profiler>>,
    /// The channels our launches name, shared with our connections in the proxy.
    launches: Arc<Launches>,
}

impl NetTransport {
    /// Connects this rank to every (peer, channel) of `conns` (the same call runs on every rank
    /// of `bootstrap`, with mirrored lists; ranks with nothing to connect still take part) and
    /// hands the connections to the device's proxy. `alloc` makes each connection's host block
    /// (pinned and mapped for the GPU, or plain memory in tests).
    pub fn connect(
        bootstrap: &Bootstrap,
        conns: &[(usize, usize)],
        setup: &Setup,
        alloc: &dyn Fn(usize) -> Result<HostBlock>,
    ) -> Result<NetTransport> {
        let nranks = bootstrap.nranks();
        let deadline = Instant::now() + setup.timeout;
        let net = &*setup.net;
        let (handle, mut listener) = net.listen(0)?;
        let challenge = auth::nonce()?;
        let all = bootstrap.allgather(&[&handle[..], &challenge[..]].concat())?;
        let mut handles = Vec::with_capacity(nranks);
        let mut challenges = Vec::with_capacity(nranks);
        for (r, b) in all.iter().enumerate() {
            let (h, c) = split_record(b, r)?;
            handles.push(h);
            challenges.push(c);
        }
        let who = Peers::of(bootstrap, &handles, &challenges, &setup.names);
        let links = establish(net, &mut *listener, &who, conns, deadline)?;
        Self::start(links, setup, &who, net.name(), alloc)
    }

    /// Connects this rank to `peer` on channels `0..nch` after init, when a group first needs the
    /// pair (NCCL's runtime connect; docs/ARCHITECTURE.md, "Scale"). Only the two ranks take
    /// part: each listens afresh, sends the other its handle and a fresh challenge through the
    /// bootstrap (authenticated, with its deadline), and they connect, accept and introduce
    /// themselves as at init.
    pub fn connect_pair(
        &mut self,
        bootstrap: &Bootstrap,
        peer: usize,
        nch: usize,
        setup: &Setup,
        alloc: &dyn Fn(usize) -> Result<HostBlock>,
    ) -> Result<()> {
        let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
        if peer == rank || peer >= nranks || nch == 0 || nch > MAX_CHANNELS {
            return Err(Error::Internal(format!("NET: rank {rank} cannot connect to rank {peer} on {nch} channels")));
        }
        let deadline = Instant::now() + setup.timeout;
        let net = &*setup.net;
        let (handle, mut listener) = net.listen(0)?;
        let challenge = auth::nonce()?;
        // The channel count rides along: both ends must make the same, and a rank set up
        // otherwise would leave ours waiting for connections it never makes.
        bootstrap.send(peer, TAG_PAIR, &[&handle[..], &challenge[..], &[nch as u8]].concat())?;
        let record = bootstrap.recv(peer, TAG_PAIR)?;
        let (theirs, theirs_nch) = match record.split_last() {
            Some((&n, rest)) if rest.len() == super::HANDLE_BYTES + NONCE_LEN => {
                (split_record(rest, peer)?, usize::from(n))
            }
            _ => {
                return Err(Error::Internal(format!(
                    "NET: rank {peer} sent a connection record of {} bytes, not a handle, a challenge and a \
                     channel count",
                    record.len()
                )))
            }
        };
        if theirs_nch != nch {
            return Err(Error::InvalidUsage(format!(
                "NET: rank {peer} connects to rank {rank} on {theirs_nch} channel(s) and rank {rank} on {nch}: \
                 NCCL_NCHANNELS_PER_NET_PEER (or the config's nChannelsPerNetPeer) and NCCL_NCHANNELS_PER_PEER \
                 must be alike on every rank"
            )));
        }
        // Only our entry and the peer's are read.
        let mut handles = vec![[0u8; super::HANDLE_BYTES]; nranks];
        let mut challenges = vec![[0u8; NONCE_LEN]; nranks];
        (handles[rank], challenges[rank]) = (handle, challenge);
        (handles[peer], challenges[peer]) = theirs;
        let who = Peers::of(bootstrap, &handles, &challenges, &setup.names);
        let conns: Vec<(usize, usize)> = (0..nch).map(|ch| (peer, ch)).collect();
        let links = establish(net, &mut *listener, &who, &conns, deadline)?;
        self.add(links, &who, alloc, true)
    }

    /// Gives each link its host block and hands it to the proxy.
    pub fn start(
        links: Vec<Link>,
        setup: &Setup,
        who: &Peers,
        net_name: &str,
        alloc: &dyn Fn(usize) -> Result<HostBlock>,
    ) -> Result<NetTransport> {
        let layout =
            Layout { slot_bytes: setup.fifo_bytes / crate::abi::FN_NSTEPS as usize, one_message: !setup.net.builtin() };
        let proxy = Proxy::for_device(
            setup.dev,
            proxy::Threads::choose(setup.net.builtin(), setup.cpus.as_ref(), setup.machine_ranks, setup.net_peers),
            setup.cpus.as_ref(),
        )?;
        // A dead peer fails all its connections at once: the first says so, the rest only log.
        let (hook, told) = (setup.fault.clone(), Arc::new(AtomicBool::new(false)));
        let fault: FaultHook = Arc::new(move |m: String| {
            if told.swap(true, Ordering::AcqRel) {
                crate::nccl_info!(Subsys::NET, "{m}");
            } else {
                hook(m);
            }
        });
        let mut t = NetTransport {
            proxy,
            ids: Vec::new(),
            blocks: HashMap::new(),
            layout,
            fault,
            net_name: net_name.to_string(),
            profiler: setup.profiler.clone(),
            launches: Arc::default(),
        };
        t.add(links, who, alloc, false)?;
        crate::nccl_info!(
            Subsys::INIT | Subsys::NET,
            "NET/{net_name}: rank {} has {} connections through the proxy of device {}",
            who.rank,
            t.blocks.len(),
            setup.dev
        );
        Ok(t)
    }

    /// Gives each link its host block and hands it to the proxy; `runtime`: made after init, for
    /// a peer off the ring (`proxy::Launches`).
    fn add(
        &mut self,
        links: Vec<Link>,
        who: &Peers,
        alloc: &dyn Fn(usize) -> Result<HostBlock>,
        runtime: bool,
    ) -> Result<()> {
        let layout = self.layout;
        let t = self;
        for (peer, ch, send, recv) in links {
            let block = Arc::new(alloc(layout.block_bytes())?);
            if block.len() < layout.block_bytes() {
                return Err(Error::Internal(format!(
                    "NET: a host block of {} bytes, {} needed",
                    block.len(),
                    layout.block_bytes()
                )));
            }
            let what = format!("{}, channel {ch}", who.name(peer));
            let trace = t.profiler.clone().map(|profiler| TraceInfo { profiler, peer, channel: ch });
            let entry = Entry::new(send, recv, block.clone(), layout, what, t.fault.clone(), trace.as_ref())?
                .launched_by(t.launches.clone(), peer, ch, runtime);
            t.ids.push(t.proxy.add(entry));
            t.blocks.insert((peer, ch), block);
        }
        Ok(())
    }

    /// The kernels' view of the connection with `peer` on `ch`; `None` if there is none.
    pub fn conn(&self, peer: usize, ch: usize) -> Option<fnConn> {
        let b = self.blocks.get(&(peer, ch))?;
        let l = &self.layout;
        let fifos = |at: &dyn Fn(u32) -> usize| {
            let mut f = [std::ptr::null_mut(); FN_NUM_PROTOS as usize];
            for (p, slot) in f.iter_mut().enumerate() {
                *slot = b.dev(at(p as u32)) as *mut _;
            }
            f
        };
        Some(fnConn {
            send: fnConnSend {
                buffs: fifos(&|p| l.send_fifo(p)),
                tail: b.dev(proxy::SEND_TAIL) as *mut _,
                head: b.dev(proxy::SEND_HEAD) as *mut _,
                sizes: b.dev(proxy::SEND_SIZES) as *mut _,
                flags: FN_CONN_TAIL_LL128,
                ..Default::default()
            },
            recv: fnConnRecv {
                buffs: fifos(&|p| l.recv_fifo(p)),
                tail: b.dev(proxy::RECV_TAIL) as *mut _,
                head: b.dev(proxy::RECV_HEAD) as *mut _,
                flags: FN_CONN_TAIL_LL128,
                ..Default::default()
            },
        })
    }

    /// The host block of a connection (tests drive it as the kernels would).
    pub fn block(&self, peer: usize, ch: usize) -> Option<&Arc<HostBlock>> {
        self.blocks.get(&(peer, ch))
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// What wakes the proxy thread of these connections.
    pub fn proxy_waker(&self) -> proxy::Waker {
        self.proxy.waker(self.launches.clone())
    }

    /// How many connections' peers have closed them (their communicator was destroyed).
    pub fn closed_by_peer(&self) -> usize {
        self.proxy.closed_by_peer(&self.ids)
    }
}

impl Drop for NetTransport {
    fn drop(&mut self) {
        // Out of the proxy first, then closed (here, outside its lock); the blocks go last.
        proxy::close(self.proxy.remove(&self.ids));
    }
}

/// NET's place among the transports (`transport::TRANSPORTS`). It publishes no record in the
/// transports' allgather: when any pair of the communicator uses NET, every rank exchanges its
/// listener's handle in an allgather of its own ([`NetTransport::connect`]).
pub const SETUP: TransportSetup = TransportSetup { kind: Kind::Net, record_bytes: 0, setup };

/// Step one has nothing to allocate: connections get their host blocks as they are made.
fn setup(_cx: &Cx) -> Result<Started> {
    Ok((Box::new(NetHalf), Vec::new()))
}

struct NetHalf;

impl Half for NetHalf {
    /// Connects us to every peer of kind NET on each channel the plan gives it, through the
    /// proxy of our device, with connection blocks in pinned host memory mapped for our GPU.
    fn connect(self: Box<Self>, cx: &Cx, _records: &[&[u8]]) -> Result<Option<Box<dyn Transport>>> {
        let Pairs { plan, rank, kinds } = cx.pairs;
        if !net_pairs(kinds) {
            return Ok(None);
        }
        let peers: Vec<usize> = (0..plan.nranks).filter(|&p| p != rank && kinds[rank][p] == Kind::Net).collect();
        let conns: Vec<(usize, usize)> =
            peers.iter().flat_map(|&p| (0..plan.channels(rank, p)).map(move |ch| (p, ch))).collect();
        let setup = Setup {
            dev: cx.needs.dev,
            fifo_bytes: plan.fifo_bytes,
            names: cx.peers.iter().map(PeerInfo::describe).collect(),
            fault: cx.needs.fault.clone(),
            timeout: cx.needs.timeout,
            net: cx.needs.net.clone().ok_or_else(|| Error::Internal("NET pairs, but no net was initialised".into()))?,
            profiler: cx.needs.profiler.clone(),
            cpus: cx.needs.cpus,
            machine_ranks: cx.peers.iter().filter(|p| p.machine == cx.peers[rank].machine).count(),
            net_peers: peers.len(),
        };
        let net = NetTransport::connect(cx.bootstrap, &conns, &setup, &host_block)?;
        Ok(Some(Box::new(NetConnections { net, setup })))
    }
}

/// The NET transport of a communicator, with what connecting another peer at runtime needs.
struct NetConnections {
    net: NetTransport,
    setup: Setup,
}

impl Transport for NetConnections {
    fn kind(&self) -> Kind {
        Kind::Net
    }

    fn conn(&self, _pairs: &Pairs, peer: usize, ch: usize) -> fnConn {
        self.net.conn(peer, ch).expect("NET connects every (peer, channel) of the plan")
    }

    fn route(&self, _me: &PeerInfo, _peer: &PeerInfo) -> String {
        format!("NET/{}/proxy", self.net.net_name)
    }

    fn proxy_waker(&self) -> Option<proxy::Waker> {
        Some(self.net.proxy_waker())
    }

    fn connect_runtime(&mut self, bootstrap: &Bootstrap, plan: &ConnPlan, peer: usize) -> Result<Vec<fnConn>> {
        let (rank, nch) = (bootstrap.rank(), plan.runtime_channels());
        self.net.connect_pair(bootstrap, peer, nch, &self.setup, &host_block)?;
        crate::nccl_info!(
            Subsys::INIT | Subsys::NET,
            "Channel 00-{:02} : {rank} <-> {peer} via NET/{}/proxy, connected at runtime",
            nch - 1,
            self.net.net_name
        );
        Ok((0..nch).map(|ch| self.net.conn(peer, ch).expect("connect_pair connected every channel")).collect())
    }
}

/// A NET connection's block: pinned host memory mapped for our GPU.
fn host_block(bytes: usize) -> Result<HostBlock> {
    let mem = crate::cuda::HostMapped::zeroed(bytes.div_ceil(4))?;
    // SAFETY: the pinned allocation lives as long as its owner, moved into the block; `dev` is the
    // same memory as our GPU maps it.
    Ok(unsafe { HostBlock::new(mem.host_ptr(), mem.dev, bytes, Box::new(mem)) })
}

#[cfg(test)]
mod tests;
