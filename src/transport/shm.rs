//! SHM transport: connection FIFOs in host memory shared by the two processes of a pair on one
//! host, and mapped into both GPUs (docs/ARCHITECTURE.md, "Transports").
//!
//! Each rank lays out its SHM connections as the P2P arena does ([`ArenaLayout`]: the receiver
//! owns its FIFOs and tail, the sender its head), in a `memfd` (not `/dev/shm`, which containers
//! often cap at 64 MB) sized with `ftruncate`, mapped `MAP_SHARED` and registered with CUDA
//! (portable, device-mapped). A peer in another process opens `/proc/<pid>/fd/<fd>`, checks that
//! it is the memfd it expects, maps and registers it too; a peer in the same process uses the
//! owner's registration. Over host memory a 128-byte store does not arrive whole, so both halves
//! of every SHM connection carry `FN_CONN_TAIL_LL128`: LL128 publishes a tail, as Simple does;
//! LL's 16-byte lines arrive whole and run as over P2P.

use super::arena::{pair_conn, ArenaLayout};
use super::{Cx, Half, Kind, Pairs, Started, Transport, TransportSetup};
use crate::abi::{fnConn, FN_CONN_TAIL_LL128};
use crate::cuda::HostRegistration;
use crate::error::{Error, Result};
use crate::topo::PeerInfo;
use std::ffi::{c_void, CString};

/// A shared, writable mapping of a memfd: ours (we keep the descriptor open so that peers can
/// open it through /proc) or a peer's (the descriptor is closed once mapped).
#[derive(Debug)]
pub struct SharedMem {
    ptr: *mut c_void,
    len: usize,
    /// Our memfd, open while peers may still open it; -1 for a peer's.
    fd: i32,
}

// SAFETY: the mapping is plain shared memory whose users synchronise through the FIFO counters.
unsafe impl Send for SharedMem {}
// SAFETY: as above.
unsafe impl Sync for SharedMem {}

fn os_error(what: &str) -> Error {
    Error::System(format!("{what}: {}", std::io::Error::last_os_error()))
}

impl SharedMem {
    /// A new zeroed memfd of `len` bytes named `name`, mapped.
    pub fn create(name: &str, len: usize) -> Result<SharedMem> {
        let cname = CString::new(name).map_err(|_| Error::Internal(format!("memfd name {name:?} has a NUL")))?;
        // SAFETY: cname is a valid C string; the flags are plain bits.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_error(&format!("memfd_create({name})")));
        }
        // SAFETY: fd is the memfd just created.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = os_error(&format!("ftruncate of memfd {name} to {len} bytes"));
            // SAFETY: fd is ours and closed once.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        // On failure the descriptor is closed by map's error path.
        Self::map(fd, len, name).map(|ptr| SharedMem { ptr, len, fd })
    }

    /// Maps `len` bytes of `fd` shared and writable; closes `fd` on failure.
    fn map(fd: i32, len: usize, what: &str) -> Result<*mut c_void> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh mapping chosen by the kernel; fd is a valid descriptor of at least len bytes.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if ptr == libc::MAP_FAILED {
            let e = os_error(&format!("mmap of {len} bytes of {what}"));
            // SAFETY: fd is ours and closed once.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(ptr)
    }

    /// Maps another process's memfd (`pid`'s descriptor `fd`), after checking that it is the
    /// memfd called `name` and is exactly `len` bytes: anything else (a reused descriptor number,
    /// a record from a stranger) is refused rather than mapped.
    pub fn open(pid: u32, fd: i32, name: &str, len: usize) -> Result<SharedMem> {
        let path = format!("/proc/{pid}/fd/{fd}");
        let target = std::fs::read_link(&path).map_err(|e| {
            Error::System(format!(
                "cannot reach {path} (a peer's shared memory): {e}. Processes of one host must see each other's \
                 /proc (same PID namespace, same user); otherwise give them distinct NCCL_HOSTID values"
            ))
        })?;
        let target = target.to_string_lossy();
        let want = format!("/memfd:{name}");
        if target != want && !target.starts_with(&format!("{want} ")) {
            return Err(Error::System(format!("{path} is {target:?}, not the peer's shared memory {want:?}")));
        }
        let cpath = CString::new(path.clone()).expect("no NUL in a /proc path");
        // SAFETY: cpath is a valid C string.
        let own = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if own < 0 {
            return Err(os_error(&format!("open({path})")));
        }
        // SAFETY: an all-zero stat is a valid out-buffer; own is an open descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(own, &mut st) } != 0 || st.st_size as u64 != len as u64 {
            let size = st.st_size;
            // SAFETY: own is ours and closed once.
            unsafe { libc::close(own) };
            return Err(Error::System(format!("{path} holds {size} bytes, expected {len}")));
        }
        let ptr = Self::map(own, len, &path)?;
        // The mapping keeps the memory; the descriptor is no longer needed.
        // SAFETY: own is ours and closed once.
        unsafe { libc::close(own) };
        Ok(SharedMem { ptr, len, fd: -1 })
    }

    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// The mapped bytes (the tests' view; the kernels use the registration).
    #[cfg(test)]
    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is len bytes, readable, alive as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// Stores `data` at `offset` (volatile: another process reads it concurrently).
    #[cfg(test)]
    fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.len, "write past the shared mapping");
        for (i, b) in data.iter().enumerate() {
            // SAFETY: in bounds (checked above) of a writable mapping.
            unsafe { std::ptr::write_volatile((self.ptr as *mut u8).add(offset + i), *b) };
        }
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: ptr/len is our mapping, unmapped once; fd (if ours) closed once.
        unsafe {
            libc::munmap(self.ptr, self.len);
            if self.fd >= 0 {
                libc::close(self.fd);
            }
        }
    }
}

/// What a rank publishes about its SHM arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmAddr {
    pub pid: u32,
    /// Its memfd in that process (-1: no SHM connection).
    pub fd: i32,
    pub bytes: u64,
    /// The arena's device address (what a peer in the same process uses).
    pub ptr: u64,
}

impl ShmAddr {
    pub const BYTES: usize = 4 + 4 + 8 + 8;
    const NONE: ShmAddr = ShmAddr { pid: 0, fd: -1, bytes: 0, ptr: 0 };

    pub fn encode(&self) -> Vec<u8> {
        [&self.pid.to_le_bytes()[..], &self.fd.to_le_bytes(), &self.bytes.to_le_bytes(), &self.ptr.to_le_bytes()]
            .concat()
    }

    pub fn decode(b: &[u8]) -> Result<ShmAddr> {
        if b.len() != Self::BYTES {
            return Err(Error::Internal(format!("SHM address of {} bytes, expected {}", b.len(), Self::BYTES)));
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        Ok(ShmAddr {
            pid: u32::from_le_bytes(b[..4].try_into().unwrap()),
            fd: i32::from_le_bytes(b[4..8].try_into().unwrap()),
            bytes: u64_at(8),
            ptr: u64_at(16),
        })
    }
}

/// The memfd name of `rank`'s arena in communicator `comm_id`.
pub fn arena_name(comm_id: u64, rank: usize) -> String {
    format!("ferronickel-shm-{comm_id:016x}-r{rank}")
}

/// A mapped arena registered with CUDA. The registration is declared first: it is dropped
/// (unregistered) before the mapping goes.
pub struct ShmArena {
    reg: HostRegistration,
    _mem: SharedMem,
}

impl ShmArena {
    fn register(mem: SharedMem) -> Result<ShmArena> {
        // SAFETY: the mapping is page-aligned (mmap) and outlives the registration (field order).
        let reg = unsafe { HostRegistration::new(mem.as_ptr(), mem.len) }?;
        Ok(ShmArena { reg, _mem: mem })
    }
}

/// Our SHM arena and our views of the peers'.
pub struct ShmTransport {
    _local: Option<ShmArena>,
    _mapped: Vec<ShmArena>,
    /// Base address of each rank's arena as our GPU sees it (0 where unused).
    pub bases: Vec<u64>,
}

impl ShmTransport {
    /// Creates and registers our arena (current context = ours) and says how peers reach it.
    pub fn allocate(layout: &ArenaLayout, comm_id: u64, rank: usize) -> Result<(Option<ShmArena>, ShmAddr)> {
        let bytes = layout.bytes();
        if bytes == 0 {
            return Ok((None, ShmAddr::NONE));
        }
        let mem = SharedMem::create(&arena_name(comm_id, rank), bytes)?;
        let fd = mem.fd;
        let arena = ShmArena::register(mem)?;
        let addr = ShmAddr { pid: std::process::id(), fd, bytes: bytes as u64, ptr: arena.reg.dev };
        Ok((Some(arena), addr))
    }

    /// Maps the arena of every peer we reach over SHM (`kinds[r][p]`: rank r's kind for peer p).
    pub fn connect(
        local: Option<ShmArena>,
        pairs: Pairs,
        peers: &[PeerInfo],
        addrs: &[ShmAddr],
        comm_id: u64,
    ) -> Result<ShmTransport> {
        let Pairs { plan, rank, kinds } = pairs;
        let me = &peers[rank];
        let mut mapped = Vec::new();
        let mut bases = vec![0u64; peers.len()];
        bases[rank] = local.as_ref().map_or(0, |a| a.reg.dev);
        for (p, info) in peers.iter().enumerate() {
            if p == rank || kinds[rank][p] != Kind::Shm || plan.channels(rank, p) == 0 {
                continue;
            }
            // The size follows from the peer's kinds: a record claiming another is refused.
            let want = ArenaLayout::new(plan, p, &kinds[p], Kind::Shm).bytes();
            let a = addrs[p];
            if a.bytes != want as u64 || a.pid != info.pid {
                return Err(Error::Internal(format!(
                    "rank {p}'s SHM record ({a:?}) does not match its arena of {want} bytes in pid {}",
                    info.pid
                )));
            }
            if me.same_process(info) {
                // Registered PORTABLE by its owner: valid in every context of this process.
                bases[p] = a.ptr;
                continue;
            }
            let mem = SharedMem::open(a.pid, a.fd, &arena_name(comm_id, p), want)
                .map_err(|e| e.context(&format!("mapping rank {p}'s shared memory")))?;
            let arena =
                ShmArena::register(mem).map_err(|e| e.context(&format!("registering rank {p}'s shared memory")))?;
            bases[p] = arena.reg.dev;
            mapped.push(arena);
        }
        Ok(ShmTransport { _local: local, _mapped: mapped, bases })
    }
}

/// SHM's place among the transports (`transport::TRANSPORTS`).
pub const SETUP: TransportSetup = TransportSetup { kind: Kind::Shm, record_bytes: ShmAddr::BYTES, setup };

/// Step one: our arena, created and registered, and how peers reach it as the record.
fn setup(cx: &Cx) -> Result<Started> {
    let rank = cx.pairs.rank;
    let layout = ArenaLayout::new(cx.pairs.plan, rank, &cx.pairs.kinds[rank], Kind::Shm);
    let (arena, addr) = ShmTransport::allocate(&layout, cx.bootstrap.magic(), rank)?;
    Ok((Box::new(ShmHalf(arena)), addr.encode()))
}

/// Our arena, registered, before the peers' are mapped.
struct ShmHalf(Option<ShmArena>);

impl Half for ShmHalf {
    fn connect(self: Box<Self>, cx: &Cx, records: &[&[u8]]) -> Result<Option<Box<dyn Transport>>> {
        let addrs: Vec<ShmAddr> = records.iter().map(|b| ShmAddr::decode(b)).collect::<Result<_>>()?;
        let t = ShmTransport::connect(self.0, cx.pairs, cx.peers, &addrs, cx.bootstrap.magic())?;
        Ok(Some(Box::new(t)))
    }
}

/// Both halves of every SHM connection carry `FN_CONN_TAIL_LL128` (see the module's comment).
impl Transport for ShmTransport {
    fn kind(&self) -> Kind {
        Kind::Shm
    }

    fn conn(&self, pairs: &Pairs, peer: usize, ch: usize) -> fnConn {
        pair_conn(pairs, Kind::Shm, &self.bases, peer, ch, FN_CONN_TAIL_LL128)
    }

    fn route(&self, _me: &PeerInfo, _peer: &PeerInfo) -> String {
        "SHM/direct/direct".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::conn_plan::{ConnPlan, InitPairs};
    use std::time::{Duration, Instant};

    const CHILD_ENV: &str = "FERRONICKEL_TEST_SHM_CHILD";

    #[test]
    fn addr_round_trip() {
        let a = ShmAddr { pid: 4242, fd: 17, bytes: 5 << 20, ptr: 0x7f00_0000_1000 };
        assert_eq!(ShmAddr::decode(&a.encode()).unwrap(), a);
        assert_eq!(ShmAddr::decode(&ShmAddr::NONE.encode()).unwrap(), ShmAddr::NONE);
        assert!(ShmAddr::decode(&a.encode()[1..]).is_err());
    }

    #[test]
    fn views_share_bytes_and_strangers_are_refused() {
        let name = arena_name(0xfeed, 3);
        let mine = SharedMem::create(&name, 8192).unwrap();
        assert!(mine.bytes().iter().all(|&b| b == 0), "a new arena starts zeroed");
        let pid = std::process::id();
        let view = SharedMem::open(pid, mine.fd, &name, 8192).unwrap();
        mine.write(100, b"tail");
        assert_eq!(&view.bytes()[100..104], b"tail");
        view.write(8188, b"head");
        assert_eq!(&mine.bytes()[8188..], b"head");
        // Another memfd's name, another size, a descriptor that is no memfd, a missing one.
        let e = SharedMem::open(pid, mine.fd, &arena_name(0xfeed, 4), 8192).unwrap_err();
        assert!(e.to_string().contains("not the peer's shared memory"), "{e}");
        let e = SharedMem::open(pid, mine.fd, &name, 4096).unwrap_err();
        assert!(e.to_string().contains("holds 8192 bytes, expected 4096"), "{e}");
        assert!(SharedMem::open(pid, 0, &name, 8192).is_err());
        let e = SharedMem::open(pid, 1 << 20, &name, 8192).unwrap_err();
        assert!(e.to_string().contains("cannot reach /proc/"), "{e}");
    }

    #[test]
    fn a_record_that_does_not_match_the_layout_is_refused() {
        let plan = ConnPlan::new(2, 1, vec![0, 1], 1 << 16, InitPairs::All);
        let kinds = vec![vec![Kind::Shm; 2]; 2];
        let peer = |rank, pid| PeerInfo { rank, host_hash: 1, pid, dev: 0, bus_id: [0; 16], host: [0; 32], machine: 1 };
        let peers = [peer(0, 100), peer(1, 200)];
        let want = ArenaLayout::new(&plan, 1, &kinds[1], Kind::Shm).bytes() as u64;
        let mine = ShmAddr { pid: 100, fd: 3, bytes: want, ptr: 0 };
        // A size other than the layout's, or a pid other than the peer's: refused before anything
        // is opened or registered.
        for bad in
            [ShmAddr { pid: 200, fd: 3, bytes: want + 4096, ptr: 0 }, ShmAddr { pid: 201, fd: 3, bytes: want, ptr: 0 }]
        {
            let pairs = Pairs { plan: &plan, rank: 0, kinds: &kinds };
            let e = ShmTransport::connect(None, pairs, &peers, &[mine, bad], 7).err().unwrap();
            assert!(e.to_string().contains("rank 1's SHM record"), "{e}");
        }
    }

    /// Another process maps our arena through /proc and both see each other's bytes: the child is
    /// this test binary running [`child_maps_the_parents_arena`].
    #[test]
    fn views_are_shared_between_processes() {
        let name = arena_name(0xc0ffee, 1);
        let len = 1 << 20;
        let mine = SharedMem::create(&name, len).unwrap();
        let pattern: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        mine.write(0, &pattern);
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args(["--exact", "transport::shm::tests::child_maps_the_parents_arena", "--ignored", "--nocapture"])
            .env(CHILD_ENV, format!("{} {} {name} {len}", std::process::id(), mine.fd))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                panic!("the child process did not finish within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = child.wait_with_output().unwrap();
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(status.success() && log.contains("1 passed"), "child failed:\n{log}");
        // The child replaced every byte b with 255 - b.
        for (i, (&got, &sent)) in mine.bytes().iter().zip(&pattern).enumerate() {
            assert_eq!(got, 255 - sent, "byte {i}");
        }
    }

    /// The child half of [`views_are_shared_between_processes`] (ignored: only that test runs it,
    /// in its own process, with the parent's arena named in the environment).
    #[test]
    #[ignore]
    fn child_maps_the_parents_arena() {
        let spec = std::env::var(CHILD_ENV).expect("run by views_are_shared_between_processes");
        let f: Vec<&str> = spec.split(' ').collect();
        let (pid, fd, name, len) = (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2], f[3].parse().unwrap());
        assert_ne!(pid, std::process::id());
        let view = SharedMem::open(pid, fd, name, len).unwrap();
        let flipped: Vec<u8> = view
            .bytes()
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                assert_eq!(b, (i * 7 % 251) as u8, "byte {i}");
                255 - b
            })
            .collect();
        view.write(0, &flipped);
    }
}
