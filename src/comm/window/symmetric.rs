//! What the symmetric kernels need from the windows (docs/ARCHITECTURE.md, "Symmetric kernels"):
//! the barrier memory every rank reaches, made with the communicator's first symmetric window,
//! and, when a collective is queued, whether its buffers lie in symmetric windows and where the
//! kernels find them in the flat mappings.

use super::{locate, Window, Windows};
use crate::abi::{fnDevComm, FN_MAX_CHANNELS};
use crate::comm::{Comm, Resources};
use crate::cuda::vmm::Allocation;
use crate::error::Result;
use crate::task::{SymBuf, SymBufs};
use std::sync::atomic::Ordering;

/// The barrier memory: a symmetric window over an allocation of our own. Dropped in field
/// order: the window (our mappings of every rank's), then the allocation.
pub struct SyncMemory {
    _window: Window,
    _alloc: Allocation,
}

/// Whether the symmetric kernels can run on a communicator: more than one rank, and every rank in
/// our LSA team, so that every rank reaches every peer's windows.
pub fn one_lsa_team(nranks: usize, lsa_size: usize) -> bool {
    nranks > 1 && lsa_size == nranks
}

/// Bytes of one rank's barrier region: per channel a count, a PreMulSum scalar and an inbox per rank (`FN_SYM_SYNC_WORDS` in kernels/device_abi.h).
pub fn sync_bytes(nranks: usize) -> usize {
    8 * FN_MAX_CHANNELS as usize * (2 + nranks)
}

/// A symmetric window as the lookup sees it: the caller's range and rank 0's address of its
/// first byte in the flat mapping.
#[derive(Debug, Clone, Copy)]
pub struct Placed {
    pub user: u64,
    pub size: usize,
    pub flat: u64,
    pub stride4g: u32,
}

/// The symmetric buffer of `bytes` bytes at `ptr`: the window that holds all of it, if one does.
pub fn find(windows: impl IntoIterator<Item = Placed>, ptr: u64, bytes: usize) -> Option<SymBuf> {
    let end = ptr.checked_add(bytes as u64)?;
    windows
        .into_iter()
        .find(|w| w.user <= ptr && end <= w.user + w.size as u64)
        .map(|w| SymBuf { flat: w.flat + (ptr - w.user), stride4g: w.stride4g })
}

impl Comm {
    /// Makes the barrier memory with the communicator's first symmetric window, collectively (every
    /// rank registers its windows in the same order, and [`one_lsa_team`] is alike on every rank),
    /// and points the device communicator at it. A failure, which every rank sees alike, leaves
    /// the symmetric kernels off and the window registered.
    pub(super) fn ensure_sync(&self, w: &mut Windows, res: &Resources) {
        if w.sync.is_some() || !one_lsa_team(self.nranks, self.lsa.size) {
            return;
        }
        w.seq += 1;
        match self.make_sync(w.seq, res) {
            Ok(sync) => {
                w.sync = Some(sync);
                res.symmetric_ready.store(true, Ordering::Release);
            }
            Err(e) => {
                crate::nccl_warn!("rank {}: symmetric kernels stay off: their barrier memory failed: {e}", self.rank)
            }
        }
    }

    fn make_sync(&self, seq: u64, res: &Resources) -> Result<SyncMemory> {
        let bytes = sync_bytes(self.nranks);
        // A zeroed allocation: every count starts at 0 before any peer can reach it (the
        // registration's allgathers come after).
        let alloc = Allocation::new(self.dev, bytes);
        let local = match &alloc {
            Ok(a) => locate(a.ptr(), bytes),
            Err(e) => Err(e.clone()),
        };
        let window = self.map_located(local, alloc.as_ref().map_or(0, |a| a.ptr()), bytes, seq)?;
        let alloc = alloc?;
        let v = window.inlined.0;
        let stream = crate::cuda::Stream::non_blocking()?;
        // Not the legacy stream: a kernel of another communicator may be spinning on a peer.
        res.dev_comm.write_on(&stream, std::mem::offset_of!(fnDevComm, symSync), &[v.lsaFlatBase as u64])?;
        res.dev_comm.write_on(&stream, std::mem::offset_of!(fnDevComm, symStride4G), &[v.stride4G])?;
        Ok(SyncMemory { _window: window, _alloc: alloc })
    }

    /// Where the symmetric kernels find a collective's buffers, when both lie in symmetric
    /// windows of this communicator and its barrier memory exists; `None` otherwise (the
    /// collective then runs the ordinary kernels).
    pub fn symmetric_buffers(&self, send: u64, send_bytes: usize, recv: u64, recv_bytes: usize) -> Option<SymBufs> {
        let (_, res) = self.gpu().ok()?;
        // The common case, no symmetric window yet: no lock on the enqueue path.
        if !res.symmetric_ready.load(Ordering::Acquire) {
            return None;
        }
        let w = res.windows.lock();
        w.sync.as_ref()?;
        let placed = || {
            w.windows.values().map(|win| Placed {
                user: win.user,
                size: win.size,
                flat: win.inlined.0.lsaFlatBase as u64,
                stride4g: win.inlined.0.stride4G,
            })
        };
        Some(SymBufs { send: find(placed(), send, send_bytes)?, recv: find(placed(), recv, recv_bytes)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::window::FOUR_GIB;

    const WINS: [Placed; 2] = [
        Placed { user: 0x10_0000, size: 0x1000, flat: 0x7000_0000_0000, stride4g: 1 },
        Placed { user: 0x20_0000, size: 0x2000, flat: 0x7100_0000_1000, stride4g: 3 },
    ];

    #[test]
    fn a_buffer_is_symmetric_only_when_one_window_holds_all_of_it() {
        let at = |ptr, bytes| find(WINS, ptr, bytes);
        assert_eq!(at(0x10_0000, 0x1000), Some(SymBuf { flat: 0x7000_0000_0000, stride4g: 1 }));
        // An offset inside the window keeps its offset in the flat mapping.
        assert_eq!(at(0x20_0100, 16), Some(SymBuf { flat: 0x7100_0000_1100, stride4g: 3 }));
        assert_eq!(at(0x20_1ff0, 16), Some(SymBuf { flat: 0x7100_0000_2ff0, stride4g: 3 }));
        // Running past the end, starting before the start, between windows, overflowing.
        assert_eq!(at(0x10_0ff8, 16), None);
        assert_eq!(at(0x0f_fff0, 32), None);
        assert_eq!(at(0x18_0000, 8), None);
        assert_eq!(at(u64::MAX - 4, 8), None);
        assert_eq!(find([], 0x10_0000, 8), None);
        // Rank q's copy is q strides further: what the kernels add.
        let b = at(0x20_0100, 16).unwrap();
        assert_eq!(b.flat + 2 * b.stride4g as u64 * FOUR_GIB, 0x7100_0000_1100 + 6 * FOUR_GIB);
    }

    #[test]
    fn only_a_communicator_of_one_lsa_team_runs_symmetric_kernels() {
        assert!(one_lsa_team(2, 2));
        assert!(one_lsa_team(8, 8));
        assert!(!one_lsa_team(1, 1));
        assert!(!one_lsa_team(8, 4));
        assert!(!one_lsa_team(4, 1));
    }

    #[test]
    fn barrier_regions_hold_a_count_and_an_inbox_per_rank_for_every_channel() {
        assert_eq!(sync_bytes(2), 8 * 64 * 4);
        assert_eq!(sync_bytes(8) % 8, 0);
    }
}
