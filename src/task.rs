//! The vocabulary every layer above the platform shares: what a call asks for ([`Task`]), what
//! planning needs to know about a communicator ([`CommShape`]), and what planning produces for the
//! kernels ([`Launch`]). It sits low (docs/ARCHITECTURE.md, "Layers") so that the tuner, the
//! planner, the communicator and the group code all import it and none of them imports another
//! sideways or upwards.

use crate::abi::fnWork;
use crate::cuda::module::KernelId;
use crate::cuda::CUstream;
use crate::plugin::tuner::Session as TunerSession;
use crate::topo::tree::TreeShape;
use crate::types::ncclDataType_t;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollKind {
    AllReduce,
    Reduce,
    Broadcast,
    AllGather,
    ReduceScatter,
}

/// The device-side reduction: an `fnRedOp` and its PreMulSum scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevOp {
    pub kind: u32,
    /// PreMulSum: the scalar's bits in the data type, or a device pointer to it.
    pub scalar: u64,
    pub scalar_is_ptr: bool,
}

impl DevOp {
    pub const fn plain(kind: u32) -> DevOp {
        DevOp { kind, scalar: 0, scalar_is_ptr: false }
    }
}

/// A buffer in a symmetric window as the symmetric kernels reach it: LSA rank 0's address of it
/// in the window's flat mapping, and the distance from one rank's to the next in 4 GiB units
/// (docs/ARCHITECTURE.md, "Symmetric kernels").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymBuf {
    pub flat: u64,
    pub stride4g: u32,
}

/// A collective's send and receive buffers, both in symmetric windows of a communicator that is
/// one LSA team: what lets it run the symmetric kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymBufs {
    pub send: SymBuf,
    pub recv: SymBuf,
}

#[derive(Debug, Clone, Copy)]
pub struct CollTask {
    pub kind: CollKind,
    pub send: u64,
    pub recv: u64,
    /// Elements, as the user counts them for this collective.
    pub count: usize,
    pub dtype: ncclDataType_t,
    pub op: DevOp,
    pub root: usize,
    /// Found when the collective was queued: its buffers in symmetric windows, if they are.
    pub sym: Option<SymBufs>,
}

#[derive(Debug, Clone, Copy)]
pub enum Task {
    Coll(CollTask),
    Send { buf: u64, bytes: usize, peer: usize },
    Recv { buf: u64, bytes: usize, peer: usize },
}

/// One queued operation: which communicator (`C`: the group code's `Arc<Comm>`; generic so that
/// this module stays below the communicator), on which stream, doing what.
pub struct Queued<C> {
    pub comm: C,
    pub stream: CUstream,
    pub task: Task,
}

/// What planning needs to know about the communicator. Every input but `rank` is the same on
/// every rank, so all ranks pick the same algorithm, protocol and split for an operation.
#[derive(Debug, Clone)]
pub struct CommShape {
    pub rank: usize,
    pub nranks: usize,
    /// CTAs one rank may use for a launch (its channel budget).
    pub nchannels: usize,
    /// Channels that connect every pair of ranks: the most a one-shot all-reduce can use.
    pub all_pairs_channels: usize,
    /// The Tree algorithm's hosts, depth and fan-out.
    pub tree: TreeShape,
    /// The slowest kind of connection between two of its ranks: it prices algorithms, protocols
    /// and channels (`tuner`).
    pub link: Link,
    /// The communicator's context of an external tuner plugin, which the tuner consults
    /// (docs/PLUGINS.md, "Tuner").
    pub tuner: Option<Arc<TunerSession>>,
}

/// What a hop between two ranks costs, by where its FIFOs sit: GPU memory (P2P), host memory that
/// both GPUs reach over PCIe (SHM), or host memory drained by proxy threads (NET). Ordered from
/// fastest to slowest, as the transports that make them are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Link {
    P2p,
    Shm,
    Net,
}

impl Link {
    /// The slowest link of a communicator: `net` when some pair is on NET, else `host_fifos` when
    /// some pair has its FIFOs in host memory (SHM).
    pub fn slowest(net: bool, host_fifos: bool) -> Link {
        match (net, host_fifos) {
            (true, _) => Link::Net,
            (false, true) => Link::Shm,
            (false, false) => Link::P2p,
        }
    }
}

impl CommShape {
    /// Rank 0 of `nranks` ranks on one host, every pair on P2P: the shape planner tests start from.
    #[cfg(test)]
    pub const fn one_host(nranks: usize, nchannels: usize, all_pairs_channels: usize) -> CommShape {
        CommShape {
            rank: 0,
            nranks,
            nchannels,
            all_pairs_channels,
            tree: TreeShape::chain(nranks),
            link: Link::P2p,
            tuner: None,
        }
    }
}

/// One kernel launch for one communicator.
#[derive(Debug)]
pub struct Launch {
    pub kernel: KernelId,
    pub grid: u32,
    pub stream: CUstream,
    /// Other streams whose operations joined this launch: ordered before and after it.
    pub joined: Vec<CUstream>,
    pub works: Vec<fnWork>,
}
