//! Topology: who each rank is (host, process, GPU) and the rings the collectives run on.
//!
//! Everything here is pure: built from the peer table the bootstrap allgathers, unit-tested
//! without GPUs or sockets.

pub mod tree;

use crate::error::{Error, Result};

/// What every rank tells every other rank at init.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    pub rank: u32,
    /// Identifies the machine (NCCL_HOSTID, host name and boot id).
    pub host_hash: u64,
    pub pid: u32,
    /// CUDA device ordinal in that process.
    pub dev: i32,
    /// PCI bus id of the GPU, NUL-padded: identifies the GPU across processes.
    pub bus_id: [u8; 16],
    /// Host name, NUL-padded and cut to fit: only for messages that name a rank.
    pub host: [u8; 32],
    /// Identifies the running kernel (its boot id) whatever host the rank claims (NCCL_HOSTID,
    /// a host name of its own): ranks that share it share the machine's CPUs.
    pub machine: u64,
}

impl PeerInfo {
    pub const BYTES: usize = 4 + 8 + 4 + 4 + 16 + 32 + 8;

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::BYTES);
        v.extend_from_slice(&self.rank.to_le_bytes());
        v.extend_from_slice(&self.host_hash.to_le_bytes());
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.dev.to_le_bytes());
        v.extend_from_slice(&self.bus_id);
        v.extend_from_slice(&self.host);
        v.extend_from_slice(&self.machine.to_le_bytes());
        v
    }

    pub fn decode(b: &[u8]) -> Result<PeerInfo> {
        if b.len() != Self::BYTES {
            return Err(Error::Internal(format!("peer info of {} bytes, expected {}", b.len(), Self::BYTES)));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        Ok(PeerInfo {
            rank: u32_at(0),
            host_hash: u64::from_le_bytes(b[4..12].try_into().unwrap()),
            pid: u32_at(12),
            dev: u32_at(16) as i32,
            bus_id: b[20..36].try_into().unwrap(),
            host: b[36..68].try_into().unwrap(),
            machine: u64::from_le_bytes(b[68..76].try_into().unwrap()),
        })
    }

    pub fn same_process(&self, other: &PeerInfo) -> bool {
        self.host_hash == other.host_hash && self.pid == other.pid
    }

    pub fn same_gpu(&self, other: &PeerInfo) -> bool {
        self.host_hash == other.host_hash && self.bus_id == other.bus_id
    }

    pub fn bus_id_str(&self) -> String {
        String::from_utf8_lossy(&self.bus_id).trim_end_matches('\0').to_string()
    }

    /// "rank 3 (host h, pid 777)": how messages name a rank.
    pub fn describe(&self) -> String {
        let host = String::from_utf8_lossy(&self.host).trim_end_matches('\0').to_string();
        format!("rank {} (host {host}, pid {})", self.rank, self.pid)
    }

    /// A host name in the fixed-size field, cut at a character boundary.
    pub fn host_field(name: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        let mut end = name.len().min(out.len());
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        out[..end].copy_from_slice(&name.as_bytes()[..end]);
        out
    }
}

/// NCCL-style host identity: NCCL_HOSTID if set, else host name plus boot id.
pub fn host_hash() -> u64 {
    let ident = match crate::env::hostid() {
        Some(id) => id.to_string(),
        None => format!("{}{}", crate::debug::host_name(), boot_id()),
    };
    fnv1a(ident.as_bytes())
}

/// The machine's identity ([`PeerInfo::machine`]): its kernel's boot id.
pub fn machine_hash() -> u64 {
    fnv1a(boot_id().as_bytes())
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default().trim().to_string()
}

/// FNV-1a: a stable hash (std's hasher is randomly seeded per process).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// The ring order: ranks grouped by host, then by GPU (so ranks sharing a GPU sit side by side
/// and cross the link as few times as possible), then by rank.
pub fn ring_order(peers: &[PeerInfo]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..peers.len()).collect();
    order.sort_by_key(|&r| (peers[r].host_hash, peers[r].bus_id, r));
    order
}

/// One rank's view of a ring: neighbours and position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    pub prev: usize,
    pub next: usize,
    pub index: usize,
    pub user_ranks: Vec<usize>,
}

impl Ring {
    pub fn new(order: &[usize], rank: usize) -> Ring {
        let n = order.len();
        let index = order.iter().position(|&r| r == rank).expect("rank is in the ring");
        Ring { prev: order[(index + n - 1) % n], next: order[(index + 1) % n], index, user_ranks: order.to_vec() }
    }
}

/// Channels (one ring each, one CTA each) for a communicator: NCCL_MIN_NCHANNELS and
/// NCCL_MAX_NCHANNELS bound the default, itself capped so that every rank sharing a GPU can
/// keep its CTAs resident at once (a ring only progresses if all its kernels run together).
pub fn channel_count(ranks_per_gpu: usize, min_env: i64, max_env: i64) -> usize {
    // All-reduce bus bandwidth at 1 GB on 2x H200 NV18 (2026-11-22): 16 CTAs ~280 GB/s,
    // 32 ~320, 48 ~337, 64 ~353 (NCCL 2.28.9: 327).
    const DEFAULT: usize = 64;
    const CTA_BUDGET_PER_GPU: usize = 64;
    let max = (crate::abi::FN_MAX_CHANNELS as usize).min(if max_env > 0 { max_env as usize } else { usize::MAX });
    let min = if min_env > 0 { min_env as usize } else { 1 };
    let fit = (CTA_BUDGET_PER_GPU / ranks_per_gpu.max(1)).max(1);
    DEFAULT.min(fit).max(min).min(max).max(1)
}

/// The channels the user asks for at least: NCCL_MIN_NCHANNELS or the config's `min_ctas`
/// (minCTAs), whichever is more (0: neither).
pub fn least_channels(min_ctas: Option<usize>) -> usize {
    min_ctas.unwrap_or(0).max(min_nchannels().max(0) as usize)
}

/// This rank's LSA team (load/store accessible): consecutive world ranks, all of them reachable
/// from one another by P2P loads and stores, as the device API's `ncclTeamLsa` (stride 1) and
/// `ncclTeamRail` (the world cut into teams of `size`) need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lsa {
    pub rank: usize,
    pub size: usize,
}

impl Lsa {
    /// The largest size that divides the world into blocks of consecutive ranks in which every
    /// pair reaches the other (`reach[a][b]`: a loads and stores b's memory), so that every rank
    /// computes the same size; 1 when no such block of two or more exists.
    pub fn new(rank: usize, reach: &[Vec<bool>]) -> Lsa {
        let n = reach.len().max(1);
        let reachable_blocks = |d: usize| {
            (0..n).step_by(d).all(|start| (start..start + d).all(|a| (start..start + d).all(|b| a == b || reach[a][b])))
        };
        let size = (1..=n).rev().find(|&d| n.is_multiple_of(d) && reachable_blocks(d)).unwrap_or(1);
        Lsa { rank: rank % size, size }
    }
}

crate::int_param!(
    /// NCCL_MIN_NCHANNELS: the fewest channels (rings) to use.
    min_nchannels, "NCCL_MIN_NCHANNELS", 0
);
crate::int_param!(
    /// NCCL_MAX_NCHANNELS: the most channels (rings) to use.
    max_nchannels, "NCCL_MAX_NCHANNELS", 0
);

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: u32, host: u64, pid: u32, bus: &str) -> PeerInfo {
        let mut bus_id = [0u8; 16];
        bus_id[..bus.len()].copy_from_slice(bus.as_bytes());
        PeerInfo { rank, host_hash: host, pid, dev: 0, bus_id, host: PeerInfo::host_field("h"), machine: host }
    }

    fn reach(n: usize, pairs: impl Fn(usize, usize) -> bool) -> Vec<Vec<bool>> {
        (0..n).map(|a| (0..n).map(|b| pairs(a, b)).collect()).collect()
    }

    #[test]
    fn lsa_team_is_the_largest_block_of_mutually_reachable_ranks() {
        // One host, every pair reachable: one team of all.
        assert_eq!(Lsa::new(2, &reach(4, |_, _| true)), Lsa { rank: 2, size: 4 });
        // Two hosts of 4 ranks each: teams of 4.
        let two_hosts = reach(8, |a, b| a / 4 == b / 4);
        assert_eq!(Lsa::new(5, &two_hosts), Lsa { rank: 1, size: 4 });
        // Nothing reachable: teams of one.
        assert_eq!(Lsa::new(3, &reach(4, |a, b| a == b)), Lsa { rank: 0, size: 1 });
        // 6 ranks where only 0-1 and 1-2 and 0-2 reach each other: blocks of 3 fail on 3-5,
        // blocks of 2 on 2-3, so teams of one.
        let ragged = reach(6, |a, b| a / 2 == b / 2 && a < 3 && b < 3);
        assert_eq!(Lsa::new(4, &ragged).size, 1);
        // 3 hosts of 2: teams of 2, never of 3 (which would mix hosts).
        assert_eq!(Lsa::new(3, &reach(6, |a, b| a / 2 == b / 2)), Lsa { rank: 1, size: 2 });
        // A single rank.
        assert_eq!(Lsa::new(0, &reach(1, |_, _| true)), Lsa { rank: 0, size: 1 });
    }

    #[test]
    fn peer_info_round_trip() {
        let p = peer(3, 0xdead_beef_1234, 77, "0000:1B:00.0");
        assert_eq!(PeerInfo::decode(&p.encode()).unwrap(), p);
        assert!(PeerInfo::decode(&[0u8; 5]).is_err());
        assert_eq!(p.bus_id_str(), "0000:1B:00.0");
    }

    #[test]
    fn ring_groups_ranks_sharing_a_gpu() {
        // Ranks 0,2 on GPU A and 1,3 on GPU B: the ring visits A,A,B,B.
        let peers = [peer(0, 1, 1, "A"), peer(1, 1, 1, "B"), peer(2, 1, 1, "A"), peer(3, 1, 1, "B")];
        assert_eq!(ring_order(&peers), vec![0, 2, 1, 3]);
    }

    /// 1,024 hosts of 8 GPUs whose ranks are dealt round-robin (rank r on host r % 1,024): the ring
    /// still visits each host's 8 ranks one after the other, in GPU order, so it crosses the
    /// network exactly twice per host (once in, once out).
    #[test]
    fn ring_visits_each_host_once_at_1024_hosts_of_8() {
        let (hosts, gpus) = (1024u64, 8usize);
        let n = hosts as usize * gpus;
        let buses: Vec<String> = (0..gpus).map(|g| format!("0000:{:02X}:00.0", 0x10 + g)).collect();
        let peers: Vec<PeerInfo> = (0..n)
            .map(|r| peer(r as u32, 0x9e37 * (r as u64 % hosts) + 1, r as u32, &buses[r / hosts as usize]))
            .collect();
        let order = ring_order(&peers);
        let mut seen = order.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..n).collect::<Vec<_>>(), "every rank once");
        let host = |i: usize| peers[order[i % n]].host_hash;
        let crossings = (0..n).filter(|&i| host(i) != host(i + 1)).count();
        assert_eq!(crossings, hosts as usize, "each host is entered once and left once");
        for chunk in order.chunks(gpus) {
            let buses: Vec<_> = chunk.iter().map(|&r| peers[r].bus_id).collect();
            assert!(chunk.iter().all(|&r| peers[r].host_hash == peers[chunk[0]].host_hash));
            assert!(buses.windows(2).all(|w| w[0] < w[1]), "GPU order within a host");
        }
        // A rank's neighbours are its places either side in that order.
        let ring = Ring::new(&order, order[5]);
        assert_eq!((ring.prev, ring.next), (order[4], order[6]));
    }

    #[test]
    fn ring_neighbours_are_consistent() {
        for n in 1..=9 {
            let order: Vec<usize> = (0..n).rev().collect();
            for r in 0..n {
                let ring = Ring::new(&order, r);
                assert_eq!(Ring::new(&order, ring.next).prev, r);
                assert_eq!(Ring::new(&order, ring.prev).next, r);
                assert_eq!(ring.user_ranks[ring.index], r);
            }
        }
    }

    #[test]
    fn channels_respect_env_and_sharing() {
        assert_eq!(channel_count(1, 0, 0), 64);
        assert_eq!(channel_count(2, 0, 0), 32);
        assert_eq!(channel_count(8, 0, 0), 8);
        assert_eq!(channel_count(1, 0, 4), 4);
        assert_eq!(channel_count(8, 12, 0), 12);
        assert_eq!(channel_count(1, 0, 1000), 64);
        assert_eq!(channel_count(1, 100, 0), 64);
    }

    #[test]
    fn host_hash_is_stable() {
        assert_eq!(fnv1a(b"abc"), fnv1a(b"abc"));
        assert_ne!(fnv1a(b"abc"), fnv1a(b"abd"));
    }
}
