//! The NET transport's connections: for each (peer, channel) a send comm to the peer and a
//! receive comm from it, proven to come from a member of the communicator, their host FIFOs, and
//! the `fnConn` the kernels use (`docs/NET.md`, "The NET transport").
//!
//! Setup, on every rank at once: pick the net ([`super::init`]), listen once, share the
//! listener's handle and a fresh challenge nonce through the bootstrap (which is authenticated),
//! connect to every peer's handle once per channel and accept as many connections. Each send
//! comm's first message is an introduction: the communicator's magic, who sends it (rank, peer,
//! channel and a random part: the connector nonce) and an HMAC over the receiver's challenge and
//! that nonce with the unique id's secret ([`crate::bootstrap::auth`]). An accepted connection is
//! used only once its introduction checks out; one that does not (a stranger, garbage, a replay
//! for a connection already made) is closed with a WARN while the others go on. Everything
//! happens under one deadline that names what is still missing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::proxy::{self, Entry, FaultHook, HostBlock, Layout, Proxy};
use super::{Connecting, Handle, MemHandle, Net, NetConfig, PtrKind, RecvBuf, RecvComm, Request, SendComm};
use crate::abi::{fnConn, fnConnRecv, fnConnSend, FN_CONN_TAIL_ALL, FN_NUM_PROTOS};
use crate::bootstrap::auth::{self, Credentials, Nonce, Role, NONCE_LEN};
use crate::bootstrap::Bootstrap;
use crate::debug::Subsys;
use crate::error::{Error, Result};

/// Channels a communicator with NET connections uses at most: each is one connection per peer,
/// a socket per connection, and one more poll per round of the proxy thread.
pub const MAX_CHANNELS: usize = 8;
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
    pub net: NetConfig,
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
        let net = super::init(&NetConfig { comm_id: bootstrap.magic(), ..setup.net.clone() })?;
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
        let links = establish(&*net, &mut *listener, &who, conns, deadline)?;
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
        let net = super::init(&NetConfig { comm_id: bootstrap.magic(), ..setup.net.clone() })?;
        let (handle, mut listener) = net.listen(0)?;
        let challenge = auth::nonce()?;
        bootstrap.send(peer, TAG_PAIR, &[&handle[..], &challenge[..]].concat())?;
        let theirs = split_record(&bootstrap.recv(peer, TAG_PAIR)?, peer)?;
        // Only our entry and the peer's are read.
        let mut handles = vec![[0u8; super::HANDLE_BYTES]; nranks];
        let mut challenges = vec![[0u8; NONCE_LEN]; nranks];
        (handles[rank], challenges[rank]) = (handle, challenge);
        (handles[peer], challenges[peer]) = theirs;
        let who = Peers::of(bootstrap, &handles, &challenges, &setup.names);
        let conns: Vec<(usize, usize)> = (0..nch).map(|ch| (peer, ch)).collect();
        let links = establish(&*net, &mut *listener, &who, &conns, deadline)?;
        self.add(links, &who, alloc)
    }

    /// Gives each link its host block and hands it to the proxy.
    pub fn start(
        links: Vec<Link>,
        setup: &Setup,
        who: &Peers,
        net_name: &str,
        alloc: &dyn Fn(usize) -> Result<HostBlock>,
    ) -> Result<NetTransport> {
        let layout = Layout { slot_bytes: setup.fifo_bytes / crate::abi::FN_NSTEPS as usize };
        let proxy = Proxy::for_device(setup.dev)?;
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
        };
        t.add(links, who, alloc)?;
        crate::nccl_info!(
            Subsys::INIT | Subsys::NET,
            "NET/{net_name}: rank {} has {} connections through the proxy of device {}",
            who.rank,
            t.blocks.len(),
            setup.dev
        );
        Ok(t)
    }

    /// Gives each link its host block and hands it to the proxy.
    fn add(&mut self, links: Vec<Link>, who: &Peers, alloc: &dyn Fn(usize) -> Result<HostBlock>) -> Result<()> {
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
            let entry = Entry::new(send, recv, block.clone(), layout, what, t.fault.clone())?;
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
                flags: FN_CONN_TAIL_ALL,
                ..Default::default()
            },
            recv: fnConnRecv {
                buffs: fifos(&|p| l.recv_fifo(p)),
                tail: b.dev(proxy::RECV_TAIL) as *mut _,
                head: b.dev(proxy::RECV_HEAD) as *mut _,
                flags: FN_CONN_TAIL_ALL,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{FN_NSTEPS, FN_PROTO_LL, FN_PROTO_LL128, FN_SIZE_PROTO_SHIFT};
    use crate::bootstrap::auth::Secret;
    use crate::bootstrap::{new_unique_id, Bootstrap};
    use std::sync::atomic::{fence, Ordering};
    use std::sync::mpsc;
    use std::thread;

    /// Every wait in these tests gives up after this long.
    const LIMIT: Duration = Duration::from_secs(30);
    /// A small Simple FIFO keeps the blocks small (8 KiB slots).
    const FIFO: usize = 64 << 10;

    fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
        let end = Instant::now() + LIMIT;
        while !ready() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            thread::yield_now();
        }
    }

    /// splitmix64: the same stream on both sides of a connection.
    fn mix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    /// The protocol and bytes of step `s` of stream `seed`: every protocol, empty and full slots.
    fn step_shape(l: &Layout, seed: u64, s: u64) -> (u32, usize) {
        let r = mix(seed ^ s.wrapping_mul(0x1234_5678_9abc));
        let proto = (r % 3) as u32;
        let stride = l.stride(proto);
        let bytes = match (r >> 8) % 8 {
            0 => 0,
            1 => stride,
            _ => (r >> 16) as usize % stride,
        };
        // LL and LL128 steps fill whole lines, as the kernels' size words say.
        let bytes = match proto {
            FN_PROTO_LL => bytes / 16 * 16,
            FN_PROTO_LL128 => bytes / 128 * 128,
            _ => bytes,
        };
        (proto, bytes)
    }

    fn byte(seed: u64, s: u64, i: usize) -> u8 {
        (mix(seed ^ (s << 20) ^ (i as u64 / 8)) >> (8 * (i % 8))) as u8
    }

    /// Plays the sending kernel: fills `steps` slots in random protocols and sizes.
    fn fake_sender(b: &HostBlock, l: Layout, seed: u64, steps: u64) {
        for s in 0..steps {
            wait_for("a free send slot (head)", || b.load_u64(proxy::SEND_HEAD) + FN_NSTEPS as u64 > s);
            let (proto, bytes) = step_shape(&l, seed, s);
            let slot = (s % FN_NSTEPS as u64) as usize;
            let at = b.ptr(l.send_fifo(proto) + slot * l.stride(proto), bytes);
            for i in 0..bytes {
                // SAFETY: in the slot, which the proxy does not read before the tail moves.
                unsafe { at.add(i).write(byte(seed, s, i)) };
            }
            b.store_u32(proxy::SEND_SIZES + 4 * slot, bytes as u32 | proto << FN_SIZE_PROTO_SHIFT);
            fence(Ordering::SeqCst);
            b.store_u64(proxy::SEND_TAIL, s + 1);
        }
    }

    /// Plays the receiving kernel: checks every step byte for byte where its protocol puts it,
    /// that nothing landed past it, then poisons the slot and frees it.
    fn fake_receiver(b: &HostBlock, l: Layout, seed: u64, steps: u64) {
        const POISON: u8 = 0xEE;
        for s in 0..steps {
            wait_for(&format!("step {s} (tail)"), || b.load_u64(proxy::RECV_TAIL) > s);
            fence(Ordering::Acquire);
            let (proto, bytes) = step_shape(&l, seed, s);
            let slot = (s % FN_NSTEPS as u64) as usize;
            let stride = l.stride(proto);
            let at = b.ptr(l.recv_fifo(proto) + slot * stride, stride);
            for i in 0..bytes {
                // SAFETY: in the slot, which the proxy does not write again before head moves.
                let got = unsafe { at.add(i).read() };
                assert_eq!(got, byte(seed, s, i), "step {s} (protocol {proto}, {bytes} bytes): byte {i}");
            }
            if bytes < stride {
                // SAFETY: as above.
                let after = unsafe { at.add(bytes).read() };
                assert!(after == 0 || after == POISON, "step {s}: byte {bytes}, past the step, was written");
            }
            // SAFETY: as above.
            unsafe { at.write_bytes(POISON, stride) };
            fence(Ordering::SeqCst);
            b.store_u64(proxy::RECV_HEAD, s + 1);
        }
    }

    type Faults = Arc<parking_lot::Mutex<Vec<String>>>;

    fn setup(names: &[&str], faults: &Faults) -> Setup {
        let f = faults.clone();
        Setup {
            dev: -7,
            fifo_bytes: FIFO,
            names: names.iter().map(|s| s.to_string()).collect(),
            fault: Arc::new(move |m| f.lock().push(m)),
            timeout: LIMIT,
            net: NetConfig::default(),
        }
    }

    /// Two ranks in threads, through the bootstrap: the whole connect path.
    fn connect_pair(channels: usize) -> [(NetTransport, Faults); 2] {
        let id = new_unique_id().unwrap();
        let hs: Vec<_> = (0..2)
            .map(|r| {
                thread::spawn(move || {
                    let bs = Bootstrap::init(&id, r, 2, LIMIT).unwrap();
                    let faults = Faults::default();
                    let conns: Vec<_> = (0..channels).map(|ch| (1 - r, ch)).collect();
                    let t =
                        NetTransport::connect(&bs, &conns, &setup(&["rank 0", "rank 1"], &faults), &HostBlock::plain)
                            .unwrap();
                    // Nobody leaves (closing its bootstrap) before both are connected.
                    bs.barrier().unwrap();
                    (t, faults)
                })
            })
            .collect();
        let mut v: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let b = v.pop().unwrap();
        [v.pop().unwrap(), b]
    }

    #[test]
    fn steps_cross_byte_for_byte_in_every_protocol() {
        let [(t0, f0), (t1, f1)] = connect_pair(2);
        let l = t0.layout();
        thread::scope(|sc| {
            for ch in 0..2 {
                for (a, b, peer_of_a) in [(&t0, &t1, 1), (&t1, &t0, 0)] {
                    let seed = 77 + ch as u64 * 2 + peer_of_a as u64;
                    let sb = a.block(peer_of_a, ch).unwrap().clone();
                    let rb = b.block(1 - peer_of_a, ch).unwrap().clone();
                    sc.spawn(move || fake_sender(&sb, l, seed, 300));
                    sc.spawn(move || fake_receiver(&rb, l, seed, 300));
                }
            }
        });
        assert!(f0.lock().is_empty() && f1.lock().is_empty(), "faults: {:?} {:?}", f0.lock(), f1.lock());
        // The kernels' view: host FIFOs, tails for every protocol, sizes on the send side.
        let c = t0.conn(1, 1).unwrap();
        let b = t0.block(1, 1).unwrap();
        assert_eq!(c.send.flags, FN_CONN_TAIL_ALL);
        assert_eq!(c.recv.flags, FN_CONN_TAIL_ALL);
        assert_eq!(c.send.sizes as u64, b.dev(proxy::SEND_SIZES));
        assert_eq!(c.recv.buffs[FN_PROTO_LL as usize] as u64, b.dev(l.recv_fifo(FN_PROTO_LL)));
        assert!(t0.conn(1, 2).is_none() && t0.conn(0, 0).is_none());
        // A communicator destroyed on one side is a close on the other, not a failure.
        drop(t0);
        wait_for("rank 1 to see both goodbyes", || t1.closed_by_peer() == 2);
        assert!(f1.lock().is_empty(), "{:?}", f1.lock());
    }

    /// `n` ranks in threads, each with a NET transport that connected nothing at init, each then
    /// running `connect(rank, bootstrap, transport, setup)`; returned after a barrier.
    fn runtime_ranks(
        n: usize,
        connect: fn(usize, &Bootstrap, &mut NetTransport, &Setup),
    ) -> Vec<(NetTransport, Faults)> {
        let id = new_unique_id().unwrap();
        let names: Vec<String> = (0..n).map(|r| format!("rank {r}")).collect();
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let names = names.clone();
                thread::spawn(move || {
                    let bs = Bootstrap::init(&id, r, n, LIMIT).unwrap();
                    let faults = Faults::default();
                    let su = setup(&names.iter().map(String::as_str).collect::<Vec<_>>(), &faults);
                    let mut t = NetTransport::connect(&bs, &[], &su, &HostBlock::plain).unwrap();
                    assert!(t.block((r + 1) % n, 0).is_none(), "nothing connected at init");
                    connect(r, &bs, &mut t, &su);
                    bs.barrier().unwrap();
                    (t, faults)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Every pair of `ranks` carries `steps` steps both ways on channel `ch`, byte for byte, and
    /// nobody reports a fault.
    fn cross_every_pair(ranks: &[(NetTransport, Faults)], ch: usize, steps: u64) {
        let (n, l) = (ranks.len(), ranks[0].0.layout());
        thread::scope(|sc| {
            for a in 0..n {
                for b in (0..n).filter(|&b| b != a) {
                    let seed = 1000 + 10 * a as u64 + b as u64;
                    let sb = ranks[a].0.block(b, ch).unwrap().clone();
                    let rb = ranks[b].0.block(a, ch).unwrap().clone();
                    sc.spawn(move || fake_sender(&sb, l, seed, steps));
                    sc.spawn(move || fake_receiver(&rb, l, seed, steps));
                }
            }
        });
        for (r, (_, f)) in ranks.iter().enumerate() {
            assert!(f.lock().is_empty(), "rank {r}: {:?}", f.lock());
        }
    }

    /// NCCL's runtime connect: three ranks with no connection at init each connect the two
    /// others after it, in ascending rank order, so each pair is made while its ranks also owe
    /// the third (0 takes 1 then 2, 1 takes 0 then 2, 2 takes 0 then 1); then every pair carries
    /// steps both ways, byte for byte.
    #[test]
    fn runtime_pairs_connect_in_crossing_orders_and_carry_steps() {
        let ranks = runtime_ranks(3, |r, bs, t, su| {
            for peer in (0..3).filter(|&p| p != r) {
                t.connect_pair(bs, peer, 2, su, &HostBlock::plain).unwrap();
            }
        });
        cross_every_pair(&ranks, 1, 100);
        for (r, (t, _)) in ranks.iter().enumerate() {
            assert!(t.conn((r + 1) % 3, 1).is_some() && t.conn((r + 1) % 3, 2).is_none());
        }
    }

    /// A runtime peer that reaches its group 10 s after us (a slow rank) still connects, and the
    /// pair carries steps.
    #[test]
    fn a_late_runtime_peer_still_connects() {
        let ranks = runtime_ranks(2, |r, bs, t, su| {
            if r == 1 {
                thread::sleep(Duration::from_secs(10));
            }
            t.connect_pair(bs, 1 - r, 1, su, &HostBlock::plain).unwrap();
        });
        cross_every_pair(&ranks, 0, 50);
    }

    /// A runtime peer that never takes part is named when the bootstrap's deadline passes, and
    /// one whose record is not a handle and a challenge is refused before anything is connected.
    #[test]
    fn a_runtime_peer_absent_or_hostile_is_named() {
        let id = new_unique_id().unwrap();
        let short = Duration::from_secs(2);
        let hs: Vec<_> = (0..2)
            .map(|r| {
                thread::spawn(move || {
                    let bs = Bootstrap::init(&id, r, 2, short).unwrap();
                    let faults = Faults::default();
                    let su = setup(&["rank 0", "rank 1"], &faults);
                    let mut t = NetTransport::connect(&bs, &[], &su, &HostBlock::plain).unwrap();
                    if r == 1 {
                        // Absent at first, then a record of the wrong size.
                        thread::sleep(short + Duration::from_secs(1));
                        bs.send(0, TAG_PAIR, &[7; 9]).unwrap();
                        thread::sleep(Duration::from_secs(1));
                        return None;
                    }
                    let start = Instant::now();
                    let absent = t.connect_pair(&bs, 1, 1, &su, &HostBlock::plain).err().unwrap().to_string();
                    assert!(start.elapsed() < short + Duration::from_secs(2), "{:?}", start.elapsed());
                    let hostile = t.connect_pair(&bs, 1, 1, &su, &HostBlock::plain).err().unwrap().to_string();
                    assert!(t.block(1, 0).is_none());
                    Some((absent, hostile))
                })
            })
            .collect();
        let (absent, hostile) = hs.into_iter().filter_map(|h| h.join().unwrap()).next().unwrap();
        assert!(absent.contains("rank 1"), "{absent}");
        assert!(hostile.contains("rank 1 sent a connection record of 9 bytes"), "{hostile}");
    }

    /// Two ranks' links made with `establish` over the Socket net, without a bootstrap, so a
    /// test can put strangers on rank 0's listener first (`before(handle of rank 0)`).
    fn links_pair(
        channels: usize,
        cred: Credentials,
        before: impl FnOnce(&Handle) + Send,
    ) -> (Vec<Link>, Vec<Link>, Vec<Nonce>) {
        let net = super::super::socket::SocketNet::new().unwrap();
        let (h0, mut l0) = net.listen(0).unwrap();
        let (h1, mut l1) = net.listen(0).unwrap();
        let handles = [h0, h1];
        let challenges = vec![auth::nonce().unwrap(), auth::nonce().unwrap()];
        let names = ["rank 0".to_string(), "rank 1".to_string()];
        let (tx, rx) = mpsc::channel();
        let (a, b) = thread::scope(|sc| {
            let (net, handles, challenges, names) = (&net, &handles, &challenges, &names);
            let r0 = sc.spawn(move || {
                let who = Peers { rank: 0, handles, challenges, names, cred };
                let conns: Vec<_> = (0..channels).map(|ch| (1, ch)).collect();
                establish(net, &mut *l0, &who, &conns, Instant::now() + LIMIT)
            });
            before(&handles[0]);
            tx.send(()).unwrap();
            let r1 = sc.spawn(move || {
                rx.recv().unwrap();
                let who = Peers { rank: 1, handles, challenges, names, cred };
                let conns: Vec<_> = (0..channels).map(|ch| (0, ch)).collect();
                establish(net, &mut *l1, &who, &conns, Instant::now() + LIMIT)
            });
            (r0.join().unwrap().unwrap(), r1.join().unwrap().unwrap())
        });
        (a, b, challenges)
    }

    fn cred() -> Credentials {
        Credentials { magic: 0x5eed, secret: Secret::random().unwrap() }
    }

    /// Sends one 64-byte introduction from a stranger to `handle`, and keeps the comm open.
    fn stranger(handle: &Handle, intro: [u8; INTRO_BYTES]) -> Box<dyn SendComm> {
        let net = super::super::socket::SocketNet::new().unwrap();
        let mut c = net.connect(0, handle).unwrap();
        let end = Instant::now() + LIMIT;
        let mut comm = loop {
            if let Some(c) = c.poll().unwrap() {
                break c;
            }
            assert!(Instant::now() < end, "a stranger could not connect");
            thread::sleep(Duration::from_millis(1));
        };
        let mut buf = Box::new(intro);
        let mr = comm.reg_mr(buf.as_mut_ptr(), INTRO_BYTES, PtrKind::Host).unwrap();
        // SAFETY: `buf` is leaked below, so it outlives the request.
        let r = unsafe { comm.isend(buf.as_ptr(), INTRO_BYTES, TAG_INTRO, &mr) }.unwrap().unwrap();
        wait_for("a stranger's send", || comm.test(&r).unwrap().is_some());
        Box::leak(buf);
        comm
    }

    #[test]
    fn strangers_without_the_secret_are_refused_and_honest_ranks_connect() {
        let c = cred();
        let mut strangers = Vec::new();
        let (l0, l1, challenges) = links_pair(2, c, |h0| {
            // Forged challenges can't be answered: rank 0's challenge travels only through the
            // (authenticated) bootstrap. Each of these claims to be rank 1 on channel 0.
            let wrong_secret = Credentials { magic: c.magic, secret: Secret::random().unwrap() };
            let any_nonce = auth::nonce().unwrap();
            strangers.push(stranger(h0, intro(&wrong_secret, 1, 0, 0, &any_nonce).unwrap()));
            // Another job's id, and garbage.
            let other_job = Credentials { magic: 1, secret: c.secret };
            strangers.push(stranger(h0, intro(&other_job, 1, 0, 0, &any_nonce).unwrap()));
            strangers.push(stranger(h0, [0x42; INTRO_BYTES]));
        });
        drop(strangers);
        // The honest connections won: each side got exactly its channels, and steps flow.
        let chans = |l: &[Link]| l.iter().map(|(p, ch, ..)| (*p, *ch)).collect::<Vec<_>>();
        assert_eq!(chans(&l0), vec![(1, 0), (1, 1)]);
        assert_eq!(chans(&l1), vec![(0, 0), (0, 1)]);
        let faults = Faults::default();
        let names = ["rank 0".to_string(), "rank 1".to_string()];
        let handles = [[0u8; super::super::HANDLE_BYTES]; 2];
        let who = |rank| Peers { rank, handles: &handles, challenges: &challenges, names: &names, cred: c };
        let s = setup(&["rank 0", "rank 1"], &faults);
        let t0 = NetTransport::start(l0, &s, &who(0), "Socket", &HostBlock::plain).unwrap();
        let t1 = NetTransport::start(l1, &s, &who(1), "Socket", &HostBlock::plain).unwrap();
        let l = t0.layout();
        thread::scope(|sc| {
            let (sb, rb) = (t1.block(0, 0).unwrap(), t0.block(1, 0).unwrap());
            sc.spawn(|| fake_sender(sb, l, 5, 40));
            sc.spawn(|| fake_receiver(rb, l, 5, 40));
        });
        assert!(faults.lock().is_empty(), "{:?}", faults.lock());
    }

    #[test]
    fn introductions_are_checked() {
        let c = cred();
        let ch = auth::nonce().unwrap();
        let good = intro(&c, 3, 1, 5, &ch).unwrap();
        assert_eq!(check_intro(&good, &c, 1, &ch), Ok(Claim { rank: 3, ch: 5 }));
        assert!(check_intro(&good, &c, 2, &ch).unwrap_err().contains("meant for rank 1"));
        assert!(check_intro(&good, &c, 1, &auth::nonce().unwrap()).unwrap_err().contains("proof"), "replayed");
        assert!(check_intro(&good[..40], &c, 1, &ch).unwrap_err().contains("not an introduction"));
        let other = Credentials { magic: c.magic + 1, ..c };
        assert!(check_intro(&good, &other, 1, &ch).unwrap_err().contains("another communicator"));
        // The proof covers who and where: changing the claimed rank or channel breaks it.
        for at in [16, 24] {
            let mut forged = good;
            forged[at] ^= 1;
            assert!(check_intro(&forged, &c, 1, &ch).unwrap_err().contains("proof"));
        }
    }

    /// Rank 0 runs the transport; the test plays rank 1 by hand on its raw links.
    fn half_pair() -> (NetTransport, Faults, Vec<Link>) {
        let c = cred();
        let (l0, l1, challenges) = links_pair(1, c, |_| {});
        let faults = Faults::default();
        let names = ["rank 0".to_string(), "rank 1 (host h1, pid 9)".to_string()];
        let handles = [[0u8; super::super::HANDLE_BYTES]; 2];
        let who = Peers { rank: 0, handles: &handles, challenges: &challenges, names: &names, cred: c };
        let s = setup(&["rank 0", "rank 1 (host h1, pid 9)"], &faults);
        (NetTransport::start(l0, &s, &who, "Socket", &HostBlock::plain).unwrap(), faults, l1)
    }

    fn wait_fault(faults: &Faults) -> String {
        wait_for("the proxy to report the fault", || !faults.lock().is_empty());
        faults.lock()[0].clone()
    }

    #[test]
    fn garbage_size_words_fail_the_connection_naming_the_peer() {
        let (t0, faults, mut l1) = half_pair();
        let (_, _, send, _) = &mut l1[0];
        // Protocol 3 (none), 16 bytes.
        let mut word = Box::new(0xc000_0010u32.to_le_bytes());
        let mr = send.reg_mr(word.as_mut_ptr(), 4, PtrKind::Host).unwrap();
        // SAFETY: `word` lives until the end of the test, after the send completed.
        let r = unsafe { send.isend(word.as_ptr(), 4, 1, &mr) }.unwrap().unwrap();
        wait_for("the garbage to go out", || send.test(&r).unwrap().is_some());
        let m = wait_fault(&faults);
        assert!(m.contains("rank 1 (host h1, pid 9), channel 0") && m.contains("garbage"), "{m}");
        // The tail never moved: the kernel saw nothing.
        assert_eq!(t0.block(1, 0).unwrap().load_u64(proxy::RECV_TAIL), 0);
    }

    #[test]
    fn a_peer_gone_mid_transfer_is_named_promptly() {
        let (t0, faults, l1) = half_pair();
        let l = t0.layout();
        // Rank 0's kernel sends more steps than the peer ever takes; the peer closes its comms.
        let b = t0.block(1, 0).unwrap().clone();
        let start = Instant::now();
        drop(l1);
        let m = wait_fault(&faults);
        assert!(m.contains("rank 1 (host h1, pid 9), channel 0"), "{m}");
        assert!(start.elapsed() < LIMIT);
        // Removing the connections from the proxy does not wait on the dead peer.
        fake_sender_until_stuck(&b, l);
        drop(t0);
    }

    /// Sends steps until the slots run out (the peer is gone, nothing frees them).
    fn fake_sender_until_stuck(b: &HostBlock, l: Layout) {
        for s in 0..FN_NSTEPS as u64 {
            let (proto, bytes) = step_shape(&l, 9, s);
            b.store_u32(
                proxy::SEND_SIZES + 4 * (s % FN_NSTEPS as u64) as usize,
                bytes as u32 | proto << FN_SIZE_PROTO_SHIFT,
            );
            fence(Ordering::SeqCst);
            b.store_u64(proxy::SEND_TAIL, s + 1);
        }
    }
}
