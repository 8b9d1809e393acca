//! Device communicators (`ncclDevComm`): the resource window that holds every buffer the
//! requirements ask for (LSA barriers among them), symmetric-registered like any window, and the
//! struct kernels take by value (docs/ARCHITECTURE.md, "Windows and the device communicator").

use crate::abi::device_api::{ncclDevComm, ncclLsaBarrierHandle};
use crate::comm::Comm;
use crate::cuda::vmm::Allocation;
use crate::error::Result;

/// Resource handles count in units of this many bytes (the device multiplies by it).
pub const RESOURCE_UNIT: usize = 128;

/// Where each buffer (size, alignment) goes in the resource window: offsets in
/// [`RESOURCE_UNIT`]s, in list order, each aligned to its alignment (at least the unit), and the
/// bytes the window needs.
pub fn resource_layout(bufs: &[(usize, usize)]) -> Result<(Vec<u32>, usize)> {
    let mut handles = Vec::with_capacity(bufs.len());
    let mut end = 0usize;
    for (i, &(size, align)) in bufs.iter().enumerate() {
        let align = align.max(RESOURCE_UNIT);
        if !align.is_power_of_two() {
            crate::bail_arg!("resource requirement {i}: bufferAlign {align} is not a power of two");
        }
        let at = end.div_ceil(align).checked_mul(align);
        let next = at.and_then(|a| a.checked_add(size));
        let (Some(at), Some(next)) = (at, next) else {
            crate::bail_arg!("resource requirement {i}: bufferSize {size} overflows the resource window");
        };
        let Ok(h) = u32::try_from(at / RESOURCE_UNIT) else {
            crate::bail_arg!("resource requirement {i}: the resource window would pass 512 GiB");
        };
        handles.push(h);
        end = next;
    }
    Ok((handles, end))
}

/// Bytes of `n` LSA barriers over a team of `team_size` ranks, as the device indexes them in
/// 32-bit words: 3n words of this rank's own state and inboxes, then one inbox per barrier and
/// arriving peer (`nccl_device/core.h`, `ncclLsaBarrierHandle`).
pub fn lsa_barrier_bytes(n: usize, team_size: usize) -> usize {
    (3 + team_size) * n * std::mem::size_of::<u32>()
}

/// `u32::MAX / x` rounded as the device's fast division expects (0 for 1).
pub fn reciprocal32(x: u32) -> u32 {
    (u32::MAX / x.max(1)).wrapping_add(x.is_power_of_two() as u32)
}

/// A device communicator's memory: its resource window's allocation (the window itself is one of
/// the communicator's windows, deregistered first).
pub struct DevCommMemory {
    _alloc: Allocation,
}

impl Comm {
    /// Creates a device communicator, collectively: a resource window holding `bufs` (size,
    /// alignment) and then `lsa_barriers` LSA barriers. Returns the struct and each buffer's
    /// handle.
    pub fn create_dev_comm(&self, bufs: &[(usize, usize)], lsa_barriers: usize) -> Result<(ncclDevComm, Vec<u32>)> {
        let (gpu, res) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        let mut all = bufs.to_vec();
        if lsa_barriers > 0 {
            all.push((lsa_barrier_bytes(lsa_barriers, self.lsa.size), std::mem::size_of::<u32>()));
        }
        let (mut handles, bytes) = resource_layout(&all)?;
        let alloc = Allocation::new(self.dev, bytes.max(RESOURCE_UNIT))?;
        let window = self.register_window(alloc.ptr(), alloc.size())?;
        let mut windows = res.windows.lock();
        let inlined = windows.windows[&window].inlined.0;
        let table = self.window_table(&mut windows)?;
        windows.dev_comms.insert(window, DevCommMemory { _alloc: alloc });
        let lsa_barrier = if lsa_barriers > 0 {
            ncclLsaBarrierHandle { bufHandle: handles.pop().unwrap_or(0), nBarriers: lsa_barriers as i32 }
        } else {
            ncclLsaBarrierHandle::default()
        };
        let dc = ncclDevComm {
            rank: self.rank as i32,
            nRanks: self.nranks as i32,
            nRanks_rcp32: reciprocal32(self.nranks as u32),
            lsaRank: self.lsa.rank as i32,
            lsaSize: self.lsa.size as i32,
            lsaSize_rcp32: reciprocal32(self.lsa.size as u32),
            windowTable: table as *mut _,
            resourceWindow: window as *mut _,
            resourceWindow_inlined: inlined,
            lsaBarrier: lsa_barrier,
            // No multimem and no GIN: their fields stay zero, as NCCL leaves them without either.
            ..ncclDevComm::default()
        };
        Ok((dc, handles))
    }

    /// Destroys a device communicator made by [`Comm::create_dev_comm`], collectively.
    pub fn destroy_dev_comm(&self, resource_window: u64) -> Result<()> {
        let known = self.gpu().is_ok_and(|(_, res)| res.windows.lock().dev_comms.contains_key(&resource_window));
        if !known {
            crate::bail_arg!(
                "devComm's resourceWindow {resource_window:#x} is not a device communicator of this communicator \
                 (created by ncclDevCommCreate and not yet destroyed)"
            );
        }
        self.deregister_then(resource_window, |w| {
            w.dev_comms.remove(&resource_window);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_buffers_are_laid_out_in_order_and_aligned() {
        // 100 B, then 1 KiB aligned to 512, then 8 B aligned to 4 (rounded up to the unit).
        let (h, end) = resource_layout(&[(100, 0), (1024, 512), (8, 4)]).unwrap();
        assert_eq!(h, vec![0, 512 / 128, (512 + 1024) / 128]);
        assert_eq!(end, 512 + 1024 + 8);
        assert_eq!(resource_layout(&[]).unwrap(), (vec![], 0));
        let e = resource_layout(&[(8, 0), (8, 384)]).unwrap_err().to_string();
        assert!(e.contains("requirement 1: bufferAlign 384"), "{e}");
        assert!(resource_layout(&[(usize::MAX, 0), (1, 0)]).is_err());
    }

    #[test]
    fn lsa_barriers_hold_three_words_plus_one_inbox_per_peer_each() {
        // The device's last unicast inbox of barrier n-1 from peer size-1 is word
        // 3n + (n-1)*size + size-1, the buffer's last.
        let (n, size) = (5, 4);
        assert_eq!(lsa_barrier_bytes(n, size) / 4, 3 * n + (n - 1) * size + size);
    }

    #[test]
    fn reciprocals_divide_as_the_device_does() {
        let div = |x: u32, y: u32| -> u32 {
            let rcp = reciprocal32(y);
            let mut q = if rcp == 0 { x } else { ((x as u64 * rcp as u64) >> 32) as u32 };
            if x - y * q >= y {
                q += 1;
            }
            q
        };
        for y in [1u32, 2, 3, 4, 7, 8, 12, 1000] {
            for x in [0u32, 1, 5, 99, 1 << 20, 123_456_789] {
                assert_eq!(div(x, y), x / y, "{x} / {y}");
            }
        }
    }
}
