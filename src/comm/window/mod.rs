//! Symmetric windows: every rank of the LSA team maps every member's buffer into one flat range,
//! member p's byte o at `lsaFlatBase + p * stride4G * 4 GiB + o`, and the device reads and writes
//! peers through that arithmetic (docs/ARCHITECTURE.md, "Windows and the device communicator").
//! Registration and deregistration are collective over the communicator.

pub mod dev_comm;
mod fd;
pub mod symmetric;

use super::Comm;
use crate::abi::device_api::{ncclDevCommWindowTable, ncclDevCommWindowTable_Entry, ncclWindow_vidmem};
use crate::cuda::vmm::{self, Mapping, Physical, VaRange};
use crate::cuda::DeviceBuffer;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// The flat range's unit: peers sit a whole number of 4 GiB apart.
pub const FOUR_GIB: u64 = 1 << 32;

/// Distance between consecutive LSA ranks' allocations, in 4 GiB units: room for the largest.
pub fn stride4g(max_alloc: u64) -> u32 {
    max_alloc.div_ceil(FOUR_GIB).max(1) as u32
}

/// Where LSA rank `lsa_rank`'s allocation starts, from the flat range's base.
pub fn flat_slot(lsa_rank: usize, stride4g: u32) -> u64 {
    lsa_rank as u64 * stride4g as u64 * FOUR_GIB
}

/// Windows listed per block of the device's window table.
const TABLE_BLOCK: usize = 32;

/// What a rank needs of each rank's descriptor (one byte per rank): nothing, the socket
/// hand-over, or, in its own byte, that it failed to take one.
const WANT_NONE: u8 = 0;
const WANT_SOCKET: u8 = 1;
const WANT_FAILED: u8 = 2;

/// How long the descriptor hand-over of one registration may take.
const HANDOVER_WITHIN: Duration = Duration::from_secs(60);

/// One symmetric window. Dropped in field order: the device record, our mappings of every
/// member's allocation, the imported allocations, the flat range.
struct Window {
    vidmem: DeviceBuffer,
    /// What `vidmem` holds.
    inlined: Vidmem,
    user: u64,
    size: usize,
    _mappings: Vec<Mapping>,
    _imports: Vec<Physical>,
    _va: VaRange,
}

/// A window's device record kept on the host: its pointers are device addresses, never
/// dereferenced here.
#[derive(Clone, Copy)]
struct Vidmem(ncclWindow_vidmem);

// SAFETY: the pointers inside are device addresses, only copied into device memory and into
// the device communicators handed to the caller; the host never dereferences them.
unsafe impl Send for Vidmem {}
// SAFETY: as for Send; the value is never mutated after creation.
unsafe impl Sync for Vidmem {}

/// A communicator's symmetric windows (by the device address the caller holds), the device's
/// table of them, and its device communicators.
#[derive(Default)]
pub struct Windows {
    windows: HashMap<u64, Window>,
    table: Vec<DeviceBuffer>,
    dev_comms: HashMap<u64, dev_comm::DevCommMemory>,
    /// The symmetric kernels' barrier memory, made with the first symmetric window.
    sync: Option<symmetric::SyncMemory>,
    /// Registrations so far: names each one's descriptor sockets.
    seq: u64,
}

/// What each rank publishes at registration: how its buffer sits in its allocation and where
/// peers find the allocation's descriptor, or why it cannot take part.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Offer {
    Ready { pid: u32, fd: i32, alloc_size: u64, offset: u64 },
    Failed(String),
}

/// Bytes of a published reason for failure that are kept.
const MAX_REASON: usize = 1024;

impl Offer {
    fn encode(&self) -> Vec<u8> {
        match self {
            Offer::Ready { pid, fd, alloc_size, offset } => {
                let mut v = vec![0u8];
                v.extend_from_slice(&pid.to_le_bytes());
                v.extend_from_slice(&fd.to_le_bytes());
                v.extend_from_slice(&alloc_size.to_le_bytes());
                v.extend_from_slice(&offset.to_le_bytes());
                v
            }
            Offer::Failed(why) => {
                let mut v = vec![1u8];
                let mut end = why.len().min(MAX_REASON);
                while !why.is_char_boundary(end) {
                    end -= 1;
                }
                v.extend_from_slice(&why.as_bytes()[..end]);
                v
            }
        }
    }

    /// A peer's bytes (untrusted: lengths checked, the reason bounded).
    fn decode(rank: usize, b: &[u8]) -> Result<Offer> {
        match b.first() {
            Some(0) if b.len() == 25 => Ok(Offer::Ready {
                pid: u32::from_le_bytes(b[1..5].try_into().unwrap()),
                fd: i32::from_le_bytes(b[5..9].try_into().unwrap()),
                alloc_size: u64::from_le_bytes(b[9..17].try_into().unwrap()),
                offset: u64::from_le_bytes(b[17..25].try_into().unwrap()),
            }),
            Some(1) if b.len() <= 1 + MAX_REASON => Ok(Offer::Failed(String::from_utf8_lossy(&b[1..]).into_owned())),
            _ => Err(Error::Internal(format!("rank {rank} published a malformed window offer of {} bytes", b.len()))),
        }
    }
}

/// The first failure among every rank's outcome of a collective step, named by rank.
fn first_failure(outcomes: &[Vec<u8>], what: &str) -> Result<()> {
    for (r, b) in outcomes.iter().enumerate() {
        if let Offer::Failed(why) = Offer::decode(r, b)? {
            return Err(Error::InvalidArgument(format!("rank {r} could not {what}: {why}")));
        }
    }
    Ok(())
}

/// A rank's outcome of a collective step, as published: success, or why not.
fn outcome(failure: Option<String>) -> Vec<u8> {
    match failure {
        None => Offer::Ready { pid: 0, fd: -1, alloc_size: 0, offset: 0 }.encode(),
        Some(why) => Offer::Failed(why).encode(),
    }
}

/// Every LSA team's members must place the window at the same offset of their allocations (the
/// device adds one offset for all of them); checked for every team, so every rank agrees.
fn check_offsets(offsets: &[u64], lsa_size: usize) -> Result<()> {
    for team in offsets.chunks(lsa_size.max(1)).enumerate().map(|(i, t)| (i * lsa_size, t)) {
        let (start, t) = team;
        if let Some(p) = t.iter().position(|&o| o != t[0]) {
            crate::bail_arg!(
                "buff lies {} bytes into its allocation on rank {start}, but {} bytes into it on rank {}: a symmetric \
                 window must start at the same offset of the allocation on every rank of an LSA team",
                t[0],
                t[p],
                start + p
            );
        }
    }
    Ok(())
}

/// Our buffer's allocation: the physical handle, its size, the buffer's offset in it, and a
/// descriptor for peers. Memory that is not CUDA VMM memory cannot be mapped by peers.
fn locate(buff: u64, size: usize) -> Result<(Physical, u64, u64, OwnedFd)> {
    let Some(phys) = Physical::retain(buff) else {
        crate::bail_arg!(
            "buff {buff:#x} is not memory from ncclMemAlloc (or other CUDA VMM memory), which a symmetric window \
             needs"
        );
    };
    let (base, alloc_size) = vmm::address_range(buff)?;
    if buff + size as u64 > base + alloc_size as u64 {
        crate::bail_arg!(
            "buff {buff:#x} + size {size} runs past the end of its allocation ({base:#x}, {alloc_size} bytes)"
        );
    }
    let fd = phys.export_fd()?;
    Ok((phys, alloc_size as u64, buff - base, fd))
}

impl Comm {
    /// The world ranks of our LSA team.
    pub fn lsa_members(&self) -> std::ops::Range<usize> {
        let start = self.rank - self.lsa.rank;
        start..start + self.lsa.size
    }

    /// Registers `size` bytes at `buff` as a symmetric window, collectively: returns the device
    /// address of its `ncclWindow_vidmem`, the handle the caller holds.
    pub fn register_window(&self, buff: u64, size: usize) -> Result<u64> {
        let (gpu, res) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        let mut windows = res.windows.lock();
        windows.seq += 1;
        let seq = windows.seq;
        let window = self.map_window(buff, size, seq)?;
        let handle = window.vidmem.ptr;
        windows.windows.insert(handle, window);
        let written = self.write_table(&mut windows);
        // Collective like the rest: every rank takes part whatever its table did.
        self.ensure_sync(&mut windows, res);
        drop(windows);
        // No rank returns, and launches, while a peer still allocates: an allocation in the
        // context of ranks that share a GPU would hold back the peer's next kernel behind ours,
        // which waits for it (docs/ARCHITECTURE.md, "Windows and the device communicator"). A
        // rank whose table failed still comes, so that its peers do not wait for it in vain.
        self.bootstrap.barrier()?;
        written.map(|()| handle)
    }

    /// Whether `handle` is one of our symmetric windows.
    pub fn is_window(&self, handle: u64) -> bool {
        self.gpu().is_ok_and(|(_, res)| res.windows.lock().windows.contains_key(&handle))
    }

    /// Deregisters a symmetric window, collectively: once every rank has arrived, each unmaps
    /// every member's allocation.
    pub fn deregister_window(&self, handle: u64) -> Result<()> {
        self.deregister_then(handle, |_| {})
    }

    /// [`Comm::deregister_window`], freeing with the window what `also` takes out of `Windows`.
    pub(super) fn deregister_then(&self, handle: u64, also: impl FnOnce(&mut Windows)) -> Result<()> {
        let (gpu, res) = self.gpu()?;
        let _g = gpu.ctx.enter()?;
        if !res.windows.lock().windows.contains_key(&handle) {
            crate::bail_arg!("win {handle:#x} is not a symmetric window of this communicator");
        }
        // No rank unmaps while a peer may still be inside a kernel reading through it.
        self.bootstrap.barrier()?;
        let mut windows = res.windows.lock();
        windows.windows.remove(&handle);
        also(&mut windows);
        let written = self.write_table(&mut windows);
        drop(windows);
        // Unmapping and freeing hold back kernels of ranks sharing the GPU, as allocating does:
        // no rank returns before every rank has freed (one whose table failed included).
        self.bootstrap.barrier()?;
        written
    }

    /// The collective steps of a registration: offers, hand-over of descriptors, mapping, and
    /// agreement that every rank succeeded.
    fn map_window(&self, buff: u64, size: usize, seq: u64) -> Result<Window> {
        self.map_located(locate(buff, size), buff, size, seq)
    }

    /// [`Comm::map_window`] from our side's outcome of [`locate`]: a rank that failed before it
    /// could locate anything still takes part, so that every rank fails together.
    fn map_located(
        &self,
        local: Result<(Physical, u64, u64, OwnedFd)>,
        buff: u64,
        size: usize,
        seq: u64,
    ) -> Result<Window> {
        let offer = match &local {
            Ok((_, alloc_size, offset, fd)) => {
                use std::os::fd::AsRawFd;
                Offer::Ready { pid: std::process::id(), fd: fd.as_raw_fd(), alloc_size: *alloc_size, offset: *offset }
            }
            Err(e) => Offer::Failed(e.to_string()),
        };
        let offers = self.bootstrap.allgather(&offer.encode())?;
        let (phys, _, offset, fd) = local?;
        let offers: Vec<Offer> = offers.iter().enumerate().map(|(r, b)| Offer::decode(r, b)).collect::<Result<_>>()?;
        first_failure(&offers.iter().map(Offer::encode).collect::<Vec<_>>(), "register its window")?;
        let all: Vec<(u32, i32, u64, u64)> = offers
            .iter()
            .map(|o| match *o {
                Offer::Ready { pid, fd, alloc_size, offset } => (pid, fd, alloc_size, offset),
                Offer::Failed(_) => (0, -1, 0, 0),
            })
            .collect();
        check_offsets(&all.iter().map(|t| t.3).collect::<Vec<_>>(), self.lsa.size)?;
        let team = &all[self.lsa_members()];
        let stride = stride4g(team.iter().map(|t| t.2).max().unwrap_or(1));

        // Descriptors: taken with pidfd_getfd, or handed over a socket where the kernel refuses.
        let mut fds: Vec<Option<OwnedFd>> = Vec::with_capacity(team.len());
        let mut wants = vec![WANT_NONE; self.nranks];
        let mut failed = None;
        for (p, &(pid, peer_fd, _, _)) in team.iter().enumerate() {
            let taken = if p == self.lsa.rank { Ok(None) } else { fd::take(pid, peer_fd).map(Some) };
            fds.push(match taken {
                Ok(Some(fd::Taken::Fd(f))) => Some(f),
                Ok(Some(fd::Taken::Refused)) => {
                    wants[self.lsa_members().start + p] = WANT_SOCKET;
                    None
                }
                Ok(None) => None,
                Err(e) => {
                    wants[self.rank] = WANT_FAILED;
                    failed.get_or_insert(e);
                    None
                }
            });
        }
        self.hand_over(&wants, failed, &fd, &mut fds, seq)?;

        let mapped = self.map_members(team, &fds, &phys, stride);
        let agreed = self.bootstrap.allgather(&outcome(mapped.as_ref().err().map(|e| e.to_string())));
        // Every rank has imported: our descriptor may close now.
        drop(fd);
        let (va, mappings, imports) = mapped?;
        first_failure(&agreed?, "map its peers' windows")?;

        let inlined = ncclWindow_vidmem {
            winHost: std::ptr::null_mut(),
            lsaFlatBase: (va.base + offset) as *mut std::ffi::c_char,
            lsaRank: self.lsa.rank as i32,
            worldRank: self.rank as i32,
            stride4G: stride,
            mcOffset4K: 0,
            ginOffset4K: 0,
            ginWins: [std::ptr::null_mut(); crate::abi::device_api::NCCL_GIN_MAX_CONTEXTS as usize],
        };
        let vidmem = DeviceBuffer::zeroed(std::mem::size_of::<ncclWindow_vidmem>())?;
        vidmem.write(0, &[inlined])?;
        Ok(Window {
            vidmem,
            inlined: Vidmem(inlined),
            user: buff,
            size,
            _mappings: mappings,
            _imports: imports,
            _va: va,
        })
    }

    /// The SCM_RIGHTS fallback: `refused[r]` says we need rank r's descriptor over its socket.
    /// Every rank learns who needs its descriptor, owners listen, all connect, owners send, all
    /// receive; nothing waits on a step that waits on it.
    fn hand_over(
        &self,
        wants: &[u8],
        failed: Option<Error>,
        ours: &OwnedFd,
        fds: &mut [Option<OwnedFd>],
        seq: u64,
    ) -> Result<()> {
        let all = self.bootstrap.allgather(wants)?;
        if let Some(e) = failed {
            return Err(e);
        }
        if let Some(r) = (0..all.len()).find(|&r| all[r].get(r) == Some(&WANT_FAILED)) {
            crate::bail_usage!("rank {r} could not take a peer's window descriptor (its log says why)");
        }
        if all.iter().all(|row| row.iter().all(|&b| b == WANT_NONE)) {
            return Ok(());
        }
        let wanted_by = all.iter().filter(|row| row.get(self.rank) == Some(&WANT_SOCKET)).count();
        let name = fd::socket_name(self.bootstrap.magic(), seq, self.rank);
        let owner = if wanted_by > 0 { Some(fd::Owner::listen(&name)?) } else { None };
        self.bootstrap.barrier()?;
        let deadline = Instant::now() + HANDOVER_WITHIN;
        let start = self.lsa_members().start;
        let streams: Vec<(usize, String, std::os::unix::net::UnixStream)> = wants
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == WANT_SOCKET)
            .map(|(r, _)| {
                let n = fd::socket_name(self.bootstrap.magic(), seq, r);
                fd::connect(&n).map(|s| (r, n, s))
            })
            .collect::<Result<_>>()?;
        if let Some(o) = &owner {
            o.serve(ours, wanted_by, deadline, &name)?;
        }
        for (r, n, s) in streams {
            fds[r - start] = Some(fd::recv_fd(&s, deadline, &n)?);
        }
        Ok(())
    }

    /// Reserves the flat range and maps every member's allocation into it.
    fn map_members(
        &self,
        team: &[(u32, i32, u64, u64)],
        fds: &[Option<OwnedFd>],
        ours: &Physical,
        stride: u32,
    ) -> Result<(VaRange, Vec<Mapping>, Vec<Physical>)> {
        let g = vmm::granularity(self.dev)?;
        let va = VaRange::reserve((team.len() as u64 * stride as u64 * FOUR_GIB) as usize, g)?;
        let (mut mappings, mut imports) = (Vec::new(), Vec::new());
        for (p, &(_, _, alloc_size, _)) in team.iter().enumerate() {
            let at = va.base + flat_slot(p, stride);
            let phys = match &fds[p] {
                None if p == self.lsa.rank => None,
                None => return Err(Error::Internal(format!("no descriptor for LSA rank {p}'s window"))),
                Some(f) => Some(Physical::import_fd(f)?),
            };
            mappings.push(Mapping::new(at, alloc_size as usize, phys.as_ref().unwrap_or(ours), &[self.dev])?);
            imports.extend(phys);
        }
        Ok((va, mappings, imports))
    }

    /// Rewrites the device's window table: our windows, 32 per block, blocks chained; the first
    /// block stays where it is, as device communicators point at it.
    fn write_table(&self, w: &mut Windows) -> Result<()> {
        let entries: Vec<ncclDevCommWindowTable_Entry> = w
            .windows
            .iter()
            .map(|(&h, win)| ncclDevCommWindowTable_Entry {
                base: win.user as usize,
                size: win.size,
                window: h as *mut ncclWindow_vidmem,
            })
            .collect();
        let blocks = entries.len().div_ceil(TABLE_BLOCK).max(1);
        while w.table.len() < blocks {
            w.table.push(DeviceBuffer::zeroed(std::mem::size_of::<ncclDevCommWindowTable>())?);
        }
        for (i, block) in w.table.iter().enumerate() {
            let mut t = [ncclDevCommWindowTable_Entry::default(); TABLE_BLOCK];
            for (slot, e) in entries.iter().skip(i * TABLE_BLOCK).take(TABLE_BLOCK).enumerate() {
                t[slot] = *e;
            }
            let next = w.table.get(i + 1).map_or(0, |b| b.ptr);
            block.write(std::mem::offset_of!(ncclDevCommWindowTable, entries), &t)?;
            block.write(std::mem::offset_of!(ncclDevCommWindowTable, next), &[next])?;
        }
        Ok(())
    }

    /// The device address of the window table's first block.
    fn window_table(&self, w: &mut Windows) -> Result<u64> {
        if w.table.is_empty() {
            self.write_table(w)?;
        }
        Ok(w.table[0].ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{new_unique_id, Bootstrap};
    use std::io::Write;
    use std::os::fd::FromRawFd;

    fn memfd_with(text: &str) -> OwnedFd {
        let name = std::ffi::CString::new("ferronickel-window-test").unwrap();
        // SAFETY: memfd_create with a valid name; the result is a fresh descriptor or -1.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        f.write_all(text.as_bytes()).unwrap();
        f.into()
    }

    /// Four ranks that each need every peer's descriptor over the socket (as where pidfd_getfd
    /// is refused) get them all: the collective steps neither deadlock nor mix them up.
    #[test]
    fn every_rank_gets_every_peers_descriptor_over_the_sockets() {
        let n = 4;
        let id = new_unique_id().unwrap();
        let ranks: Vec<_> = (0..n)
            .map(|r| {
                std::thread::spawn(move || {
                    let comm = Comm::without_gpu(Bootstrap::init(&id, r, n, Duration::from_secs(20)).unwrap(), 9);
                    let wants: Vec<u8> = (0..n).map(|p| if p == r { WANT_NONE } else { WANT_SOCKET }).collect();
                    let mut fds: Vec<Option<OwnedFd>> = (0..n).map(|_| None).collect();
                    comm.hand_over(&wants, None, &memfd_with(&format!("rank {r}")), &mut fds, 7).unwrap();
                    fds.into_iter()
                        .map(|f| {
                            f.map(|f| {
                                // pread: every peer holds the same open file, whose offset they share.
                                use std::os::unix::fs::FileExt;
                                let mut buf = [0u8; 64];
                                let n = std::fs::File::from(f).read_at(&mut buf, 0).unwrap();
                                String::from_utf8_lossy(&buf[..n]).into_owned()
                            })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (r, t) in ranks.into_iter().enumerate() {
            let got = t.join().unwrap();
            for (p, text) in got.iter().enumerate() {
                let want = (p != r).then(|| format!("rank {p}"));
                assert_eq!(text, &want, "rank {r}'s descriptor of rank {p}");
            }
        }
    }

    /// A rank that failed to take a descriptor fails every rank, named.
    #[test]
    fn a_rank_that_could_not_take_a_descriptor_fails_everyone() {
        let n = 2;
        let id = new_unique_id().unwrap();
        let ranks: Vec<_> = (0..n)
            .map(|r| {
                std::thread::spawn(move || {
                    let comm = Comm::without_gpu(Bootstrap::init(&id, r, n, Duration::from_secs(20)).unwrap(), 9);
                    let mut wants = vec![WANT_NONE; n];
                    let failed = (r == 1).then(|| {
                        wants[1] = WANT_FAILED;
                        Error::System("pidfd_getfd of descriptor 9 of process 1: bad".into())
                    });
                    let mut fds: Vec<Option<OwnedFd>> = (0..n).map(|_| None).collect();
                    comm.hand_over(&wants, failed, &memfd_with("x"), &mut fds, 1).unwrap_err().to_string()
                })
            })
            .collect();
        let errs: Vec<String> = ranks.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(errs[0].contains("rank 1 could not take a peer's window descriptor"), "{}", errs[0]);
        assert!(errs[1].contains("pidfd_getfd of descriptor 9"), "{}", errs[1]);
    }

    #[test]
    fn flat_mapping_puts_peers_whole_4gib_strides_apart() {
        assert_eq!(stride4g(0), 1);
        assert_eq!(stride4g(2 << 20), 1);
        assert_eq!(stride4g(FOUR_GIB), 1);
        assert_eq!(stride4g(FOUR_GIB + 1), 2);
        assert_eq!(stride4g(9 * FOUR_GIB), 9);
        assert_eq!(flat_slot(0, 3), 0);
        assert_eq!(flat_slot(2, 3), 6 * FOUR_GIB);
        // Peer p's byte o of a window at offset `off` of its allocation, as the device computes
        // it from lsaFlatBase = base + off.
        let (base, off, o) = (0x7f00_0000_0000u64, 4096u64, 100u64);
        let lsa_flat_base = base + off;
        for p in 0..4 {
            assert_eq!(lsa_flat_base + flat_slot(p, 2) + o, base + p as u64 * 2 * FOUR_GIB + off + o);
        }
    }

    #[test]
    fn window_offsets_must_agree_within_each_lsa_team() {
        // Two teams of two: each agrees within itself, not with the other.
        assert!(check_offsets(&[0, 0, 4096, 4096], 2).is_ok());
        let e = check_offsets(&[0, 0, 4096, 8192], 2).unwrap_err().to_string();
        assert!(e.contains("4096 bytes into its allocation on rank 2, but 8192 bytes into it on rank 3"), "{e}");
        assert!(check_offsets(&[0, 4096], 1).is_ok());
    }

    #[test]
    fn offers_round_trip_and_reject_malformed_bytes() {
        let ready = Offer::Ready { pid: 77, fd: 12, alloc_size: 2 << 20, offset: 4096 };
        assert_eq!(Offer::decode(0, &ready.encode()).unwrap(), ready);
        let failed = Offer::Failed("buff is not VMM memory".into());
        assert_eq!(Offer::decode(0, &failed.encode()).unwrap(), failed);
        let long = Offer::Failed("é".repeat(MAX_REASON));
        assert!(long.encode().len() <= 1 + MAX_REASON);
        assert!(Offer::decode(3, &[0u8; 7]).unwrap_err().to_string().contains("rank 3"));
        assert!(Offer::decode(3, &[]).is_err());
        assert!(Offer::decode(3, &[1u8; 2 + MAX_REASON]).is_err());
        let outcomes = vec![outcome(None), failed.encode()];
        let e = first_failure(&outcomes, "map its peers' windows").unwrap_err().to_string();
        assert!(e.contains("rank 1 could not map its peers' windows: buff is not VMM memory"), "{e}");
    }
}
