//! P2P transport: connection FIFOs in GPU memory, written directly by the sending GPU.
//!
//! Every rank allocates one arena holding, for each P2P connection it takes part in, the flag its
//! sender writes (tail), the flag its receiver writes back (head, kept on the sender's side) and
//! the FIFOs themselves (on the receiver), laid out by [`ArenaLayout`] (which SHM shares in host
//! memory). Peers reach the arena through a plain pointer (same process, with peer access
//! enabled) or a CUDA IPC mapping (another process).

use super::arena::{pair_conn, ArenaLayout};
use super::{Cx, Half, Kind, Pairs, Started, Transport, TransportSetup};
use crate::abi::fnConn;
use crate::cuda::{self, Context, DeviceBuffer, IpcMapping};
use crate::error::{Error, Result};
use crate::topo::PeerInfo;

/// What a rank publishes about its arena.
#[derive(Debug, Clone, Copy)]
pub struct ArenaAddr {
    pub ptr: u64,
    pub ipc: [u8; 64],
}

impl ArenaAddr {
    pub const BYTES: usize = 8 + 64;

    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.ptr.to_le_bytes().to_vec();
        v.extend_from_slice(&self.ipc);
        v
    }

    pub fn decode(b: &[u8]) -> Result<ArenaAddr> {
        if b.len() != Self::BYTES {
            return Err(Error::Internal(format!("arena address of {} bytes, expected {}", b.len(), Self::BYTES)));
        }
        Ok(ArenaAddr { ptr: u64::from_le_bytes(b[..8].try_into().unwrap()), ipc: b[8..].try_into().unwrap() })
    }
}

/// Our arena and our views of the peers' arenas.
pub struct P2pTransport {
    /// None when we have no P2P connection.
    _arena: Option<DeviceBuffer>,
    /// IPC mappings of other processes' arenas, kept open while we use them.
    _mappings: Vec<IpcMapping>,
    /// Base address of each rank's arena as seen from our GPU (0 where unused).
    pub bases: Vec<u64>,
}

impl P2pTransport {
    /// Allocates our arena (current context = ours) and returns what peers need to reach it.
    pub fn allocate(layout: &ArenaLayout) -> Result<(Option<DeviceBuffer>, ArenaAddr)> {
        if layout.bytes() == 0 {
            return Ok((None, ArenaAddr { ptr: 0, ipc: [0; 64] }));
        }
        let arena = DeviceBuffer::zeroed(layout.bytes())?;
        let ipc = arena.ipc_handle()?;
        let addr = ArenaAddr { ptr: arena.ptr, ipc };
        Ok((Some(arena), addr))
    }

    /// Maps the arena of every peer we reach over P2P into our address space (`kinds[r][p]`:
    /// rank r's kind for peer p, the same for both ends).
    pub fn connect(
        arena: Option<DeviceBuffer>,
        pairs: Pairs,
        peers: &[PeerInfo],
        addrs: &[ArenaAddr],
    ) -> Result<P2pTransport> {
        let Pairs { plan, rank, kinds } = pairs;
        let me = &peers[rank];
        let mut mappings = Vec::new();
        let mut bases = vec![0u64; peers.len()];
        bases[rank] = arena.as_ref().map_or(0, |a| a.ptr);
        for (p, info) in peers.iter().enumerate() {
            if p == rank || kinds[rank][p] != Kind::P2p || plan.channels(rank, p) == 0 {
                continue;
            }
            if me.same_process(info) {
                if info.dev != me.dev {
                    let peer_ctx: Context = cuda::primary_context(info.dev)?;
                    cuda::enable_peer_access(&peer_ctx)?;
                }
                bases[p] = addrs[p].ptr;
            } else {
                let m =
                    IpcMapping::open(&addrs[p].ipc).map_err(|e| e.context(&format!("mapping rank {p}'s buffers")))?;
                bases[p] = m.ptr;
                mappings.push(m);
            }
        }
        Ok(P2pTransport { _arena: arena, _mappings: mappings, bases })
    }
}

/// P2P's place among the transports (`transport::TRANSPORTS`).
pub const SETUP: TransportSetup = TransportSetup { kind: Kind::P2p, record_bytes: ArenaAddr::BYTES, setup };

/// Step one: our arena, and its address as the record.
fn setup(cx: &Cx) -> Result<Started> {
    let rank = cx.pairs.rank;
    let (arena, addr) =
        P2pTransport::allocate(&ArenaLayout::new(cx.pairs.plan, rank, &cx.pairs.kinds[rank], Kind::P2p))?;
    Ok((Box::new(P2pHalf(arena)), addr.encode()))
}

/// Our arena, allocated, before the peers' are mapped.
struct P2pHalf(Option<DeviceBuffer>);

impl Half for P2pHalf {
    fn connect(self: Box<Self>, cx: &Cx, records: &[&[u8]]) -> Result<Option<Box<dyn Transport>>> {
        let addrs: Vec<ArenaAddr> = records.iter().map(|b| ArenaAddr::decode(b)).collect::<Result<_>>()?;
        Ok(Some(Box::new(P2pTransport::connect(self.0, cx.pairs, cx.peers, &addrs)?)))
    }
}

impl Transport for P2pTransport {
    fn kind(&self) -> Kind {
        Kind::P2p
    }

    fn conn(&self, pairs: &Pairs, peer: usize, ch: usize) -> fnConn {
        pair_conn(pairs, Kind::P2p, &self.bases, peer, ch, 0)
    }

    fn route(&self, me: &PeerInfo, peer: &PeerInfo) -> String {
        match me.same_process(peer) {
            true => "P2P/direct pointer".into(),
            false => "P2P/IPC".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_addr_round_trip() {
        let a = ArenaAddr { ptr: 0x7f00_1234_0000, ipc: [7; 64] };
        let b = ArenaAddr::decode(&a.encode()).unwrap();
        assert_eq!((a.ptr, a.ipc), (b.ptr, b.ipc));
    }
}
