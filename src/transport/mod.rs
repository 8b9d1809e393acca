//! Transports: how bytes move between two ranks' GPUs (docs/ARCHITECTURE.md, "Transports").
//!
//! Every pair of ranks gets one kind, tried in NCCL's order: P2P (the GPUs reach each other's
//! memory: [`p2p`]), then SHM (same host, FIFOs in shared host memory: [`shm`]), then NET (another
//! host, or nothing else allowed: the network API in [`net`], the NET transport in
//! [`net::conn`]). [`select`] decides it. Every transport is one [`Transport`] behind one entry of
//! [`TRANSPORTS`], set up in NCCL's two steps ([`TransportSetup::setup`], then [`Half::connect`])
//! and freed by `Drop`; [`Connections`] runs the steps for every kind at once and builds the
//! `fnConn` table the kernels read without knowing which kinds exist.

pub mod arena;
pub mod conn_plan;
pub mod fifo;
pub mod net;
pub mod p2p;
pub mod select;
pub mod shm;

use std::sync::Arc;
use std::time::Duration;

use crate::abi::{fnConn, FN_MAX_CHANNELS};
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::topo::PeerInfo;
use conn_plan::ConnPlan;
use net::proxy::FaultHook;
pub use select::{exchange_kinds, host_fifos, net_pairs, select, Kind, Kinds, Path, Settings};

/// Every transport, in the order their first steps run and their records sit in a rank's
/// published record. A new transport is a module with its `SETUP`, a line here and its place in
/// [`select`].
const TRANSPORTS: [TransportSetup; 3] = [p2p::SETUP, shm::SETUP, net::conn::SETUP];

/// Which connections exist and each rank's kind for each of its peers: what a transport needs
/// to lay out or find a connection.
#[derive(Clone, Copy)]
pub struct Pairs<'a> {
    pub plan: &'a ConnPlan,
    /// This rank.
    pub rank: usize,
    pub kinds: &'a Kinds,
}

/// What setting a transport up sees: the communicator's bootstrap and ranks, its pairs, and what
/// the NET transport needs from the communicator.
pub struct Cx<'a> {
    pub bootstrap: &'a Bootstrap,
    pub peers: &'a [PeerInfo],
    pub pairs: Pairs<'a>,
    pub needs: &'a NetNeeds,
}

/// A transport's entry in [`TRANSPORTS`]: its kind, the bytes of the record each rank publishes
/// about its half (0: none), and step one of its setup (allocate our half, say how peers reach
/// it), which every rank runs for every kind, whether or not it has such a pair.
pub struct TransportSetup {
    pub kind: Kind,
    pub record_bytes: usize,
    pub setup: fn(&Cx) -> Result<Started>,
}

/// What step one gives: our half, and the record every rank publishes about it.
pub type Started = (Box<dyn Half>, Vec<u8>);

/// Our half of a transport's connections after step one, waiting for the peers'.
pub trait Half {
    /// Step two: connect to every peer of this kind, given every rank's record (in rank order);
    /// `None` when the communicator has no pair of this kind.
    fn connect(self: Box<Self>, cx: &Cx, records: &[&[u8]]) -> Result<Option<Box<dyn Transport>>>;
}

/// A transport with its connections made: what the rest of the library asks of it. Dropping it
/// frees them (NCCL's `free`).
pub trait Transport: Send {
    fn kind(&self) -> Kind;

    /// The kernels' view of our connection with `peer` on `ch`, one the plan connected at init.
    fn conn(&self, pairs: &Pairs, peer: usize, ch: usize) -> fnConn;

    /// How a peer's INFO line says we reach it ("P2P/IPC", "NET/Socket/proxy").
    fn route(&self, me: &PeerInfo, peer: &PeerInfo) -> String;

    /// What wakes the thread that progresses these connections when kernels are launched; only
    /// NET has one (its proxy).
    fn proxy_waker(&self) -> Option<net::proxy::Waker> {
        None
    }

    /// Connects `peer`, which the plan left to connect when a group first needs it, on
    /// `plan.p2p_channels` channels; returns the kernels' connections by channel. Only the two
    /// ranks take part. Only NET connects at runtime.
    fn connect_runtime(&mut self, bootstrap: &Bootstrap, _plan: &ConnPlan, peer: usize) -> Result<Vec<fnConn>> {
        Err(Error::Internal(format!(
            "rank {}: the connection plan left rank {peer} ({}) to connect at runtime, which only NET does",
            bootstrap.rank(),
            self.kind().name()
        )))
    }
}

/// One rank's connections to every peer: the transports behind them and the kind of each.
pub struct Connections {
    kinds: Kinds,
    /// The transports this communicator has, at most one per kind.
    transports: Vec<Box<dyn Transport>>,
}

/// What the NET transport needs beyond the connection plan.
pub struct NetNeeds {
    /// Our CUDA device: its proxy thread drives our NET connections.
    pub dev: i32,
    /// Called once per NET connection that fails later (a peer gone), with the reason.
    pub fault: FaultHook,
    /// How long connecting may take.
    pub timeout: Duration,
    /// The communicator's net, initialised once for it (a v11 plugin keeps a context per
    /// communicator); `None` when no pair of ranks is on NET.
    pub net: Option<Arc<dyn net::Net>>,
    /// The communicator's profiler plugin, for the NET proxy's events.
    pub profiler: Option<Arc<crate::plugin::profiler::Profiler>>,
    /// The CPUs near our GPU (`crate::affinity`), where a proxy thread it starts runs.
    pub cpus: Option<crate::affinity::CpuSet>,
}

/// Splits one rank's published record into its transports' records, in [`TRANSPORTS`] order.
fn split_record(b: &[u8]) -> Result<Vec<&[u8]>> {
    let want: usize = TRANSPORTS.iter().map(|t| t.record_bytes).sum();
    if b.len() != want {
        return Err(Error::Internal(format!("connection record of {} bytes, expected {want}", b.len())));
    }
    let mut rest = b;
    Ok(TRANSPORTS
        .iter()
        .map(|t| {
            let (mine, tail) = rest.split_at(t.record_bytes);
            rest = tail;
            mine
        })
        .collect())
}

impl Connections {
    /// Sets up our half of every connection in `plan` (current context = ours), exchanges the
    /// records of every transport with every rank in one allgather and connects. `kinds` comes
    /// from [`exchange_kinds`].
    pub fn establish(
        bootstrap: &Bootstrap,
        plan: &ConnPlan,
        peers: &[PeerInfo],
        kinds: Kinds,
        needs: NetNeeds,
    ) -> Result<Connections> {
        let rank = bootstrap.rank();
        let cx = Cx { bootstrap, peers, pairs: Pairs { plan, rank, kinds: &kinds }, needs: &needs };
        let mut halves = Vec::with_capacity(TRANSPORTS.len());
        let mut mine = Vec::new();
        for t in &TRANSPORTS {
            let (half, record) = (t.setup)(&cx)?;
            debug_assert_eq!(record.len(), t.record_bytes, "{} record", t.kind.name());
            halves.push(half);
            mine.extend(record);
        }
        let all = bootstrap.allgather(&mine)?;
        let records: Vec<Vec<&[u8]>> = all.iter().map(|b| split_record(b)).collect::<Result<_>>()?;
        let mut transports = Vec::new();
        for (i, half) in halves.into_iter().enumerate() {
            let theirs: Vec<&[u8]> = records.iter().map(|r| r[i]).collect();
            transports.extend(half.connect(&cx, &theirs)?);
        }
        let c = Connections { kinds, transports };
        c.log(plan, rank, peers);
        Ok(c)
    }

    /// What wakes the proxy thread of these connections, if any needs one.
    pub fn proxy_waker(&self) -> Option<net::proxy::Waker> {
        self.transports.iter().find_map(|t| t.proxy_waker())
    }

    fn transport(&self, kind: Kind) -> Option<&dyn Transport> {
        self.transports.iter().find(|t| t.kind() == kind).map(|t| &**t)
    }

    /// The device-side connection table: conns[peer * FN_MAX_CHANNELS + ch].
    pub fn table(&self, plan: &ConnPlan, rank: usize) -> Vec<fnConn> {
        let pairs = Pairs { plan, rank, kinds: &self.kinds };
        let mut table = vec![fnConn::default(); plan.nranks * FN_MAX_CHANNELS as usize];
        for p in (0..plan.nranks).filter(|&p| p != rank && plan.channels(rank, p) > 0) {
            let t = self.transport(self.kinds[rank][p]).expect("establish sets up every kind a pair uses");
            for ch in 0..plan.channels(rank, p) {
                table[p * FN_MAX_CHANNELS as usize + ch] = t.conn(&pairs, p, ch);
            }
        }
        table
    }

    /// Connects `peer`, which `plan` left to connect when a group first needs it (a send/recv
    /// peer on another host, so over NET), on `plan.runtime_channels()` channels; returns the device
    /// connections by channel, for the caller to add to the table. Only the two ranks take part.
    pub fn connect_runtime(&mut self, bootstrap: &Bootstrap, plan: &ConnPlan, peer: usize) -> Result<Vec<fnConn>> {
        let kind = self.kinds[bootstrap.rank()][peer];
        match self.transports.iter_mut().find(|t| t.kind() == kind) {
            Some(t) => t.connect_runtime(bootstrap, plan, peer),
            None => Err(Error::Internal(format!(
                "rank {}: rank {peer} is to connect over {}, which this communicator did not set up",
                bootstrap.rank(),
                kind.name()
            ))),
        }
    }

    /// One INFO line per peer, NCCL-style: which channels, and over what.
    fn log(&self, plan: &ConnPlan, rank: usize, peers: &[PeerInfo]) {
        for (p, info) in peers.iter().enumerate() {
            let n = plan.channels(rank, p);
            if n == 0 {
                continue;
            }
            let kind = self.kinds[rank][p];
            let how = self.transport(kind).map_or_else(|| kind.name().to_string(), |t| t.route(&peers[rank], info));
            crate::nccl_info!(
                crate::debug::Subsys::INIT,
                "Channel 00-{:02} : {rank}[{}] <-> {p}[{}] via {how}",
                n - 1,
                peers[rank].dev,
                info.dev
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p2p::ArenaAddr;
    use shm::ShmAddr;

    #[test]
    fn records_split_by_transport_and_are_checked() {
        let p2p = ArenaAddr { ptr: 0x1000, ipc: [3; 64] };
        let shm = ShmAddr { pid: 77, fd: 5, bytes: 4096, ptr: 0x2000 };
        let b = [p2p.encode(), shm.encode()].concat();
        let parts = split_record(&b).unwrap();
        assert_eq!(parts.len(), TRANSPORTS.len());
        let back = ArenaAddr::decode(parts[0]).unwrap();
        assert_eq!((back.ptr, back.ipc, ShmAddr::decode(parts[1]).unwrap()), (p2p.ptr, p2p.ipc, shm));
        assert!(parts[2].is_empty(), "NET publishes nothing here: it exchanges its handles itself");
        assert!(split_record(&b[1..]).is_err());
        assert!(split_record(&[b.clone(), vec![0]].concat()).is_err());
    }
}
