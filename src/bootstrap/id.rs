//! The layout of `ncclUniqueId`'s 128 bytes, and the `NCCL_COMM_ID` rules. Pure code.
//!
//! ```text
//! 0..4   b"FNID"          rejects ids from other libraries or uninitialised memory
//! 4      layout version   2
//! 5      flags            bit 0: the root is started by rank 0 (NCCL_COMM_ID)
//! 6..8   zero
//! 8..16  magic            u64 little-endian, never 0: names the job, not secret
//! 16..48 secret           auth::Secret: every bootstrap connection proves it holds it
//! 48..   root address     wire::put_addr encoding (7 bytes for IPv4, 23 for IPv6)
//! rest   zero
//! ```
//!
//! The id is the credential: whoever holds its 128 bytes can join the communicator, so hand it
//! to the other ranks over a channel strangers cannot read (see the README's "Reliability and
//! security").

use std::net::SocketAddr;

use super::BootstrapId;
use crate::error::{Error, Result};
use crate::socket::auth::{Secret, SECRET_LEN};
use crate::socket::wire::{put_addr, Reader};
use crate::types::ncclUniqueId;

const ID_TAG: [u8; 4] = *b"FNID";
const ID_VERSION: u8 = 2;
const FLAG_ROOT_BY_RANK0: u8 = 1;
const ID_BYTES: usize = std::mem::size_of::<ncclUniqueId>();

impl BootstrapId {
    pub fn to_unique_id(&self) -> ncclUniqueId {
        let mut b = Vec::with_capacity(ID_BYTES);
        b.extend_from_slice(&ID_TAG);
        b.extend_from_slice(&[ID_VERSION, if self.root_by_rank0 { FLAG_ROOT_BY_RANK0 } else { 0 }, 0, 0]);
        b.extend_from_slice(&self.magic.to_le_bytes());
        b.extend_from_slice(&self.secret.0);
        put_addr(&mut b, &self.root);
        b.resize(ID_BYTES, 0);
        let mut id = ncclUniqueId { internal: [0; ID_BYTES] };
        for (dst, src) in id.internal.iter_mut().zip(b) {
            *dst = src as std::ffi::c_char;
        }
        id
    }

    /// Reads an id back, refusing anything [`to_unique_id`](Self::to_unique_id) could not
    /// have written: the caller passed garbage, a zeroed id, or one from another library.
    pub fn from_unique_id(id: &ncclUniqueId) -> Result<BootstrapId> {
        let b: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        let bad = |why: String| {
            Error::InvalidArgument(format!(
                "ncclUniqueId is not valid ({why}); pass every rank the id produced by one ncclGetUniqueId call"
            ))
        };
        if b[..4] != ID_TAG {
            return Err(bad(format!("it does not start with {:?}: never filled by ncclGetUniqueId?", "FNID")));
        }
        let mut r = Reader::new(&b[4..]);
        let wire = |e: crate::socket::wire::WireError| bad(e.to_string());
        let version = r.u8("version").map_err(wire)?;
        if version != ID_VERSION {
            return Err(bad(format!("layout version {version}, this library reads {ID_VERSION}")));
        }
        let flags = r.u8("flags").map_err(wire)?;
        if flags & !FLAG_ROOT_BY_RANK0 != 0 {
            return Err(bad(format!("unknown flags {flags:#x}")));
        }
        if r.bytes(2, "reserved").map_err(wire)? != [0, 0] {
            return Err(bad("reserved bytes are not zero".into()));
        }
        let magic = r.u64("magic").map_err(wire)?;
        if magic == 0 {
            return Err(bad("magic is 0".into()));
        }
        let secret = Secret(r.array::<SECRET_LEN>("secret").map_err(wire)?);
        let root = r.addr("root address").map_err(wire)?;
        if r.rest().iter().any(|&x| x != 0) {
            return Err(bad("bytes after the root address are not zero".into()));
        }
        Ok(BootstrapId { magic, secret, root, root_by_rank0: flags & FLAG_ROOT_BY_RANK0 != 0 })
    }

    /// The id every process computes from `NCCL_COMM_ID` and, when set, the shared secret of
    /// [`SECRET_VAR`]: same address, same magic, same secret, no exchange. Without a shared
    /// secret the secret is derived from the address alone, which anyone can do.
    pub fn from_comm_id(root: SocketAddr, shared_secret: Option<&str>) -> BootstrapId {
        let mut addr = Vec::new();
        put_addr(&mut addr, &root);
        let secret = Secret::derive(&[b"ferronickel NCCL_COMM_ID", &addr, shared_secret.unwrap_or("").as_bytes()]);
        BootstrapId { magic: comm_id_magic(&root), secret, root, root_by_rank0: true }
    }
}

/// The environment variable that gives every process of an `NCCL_COMM_ID` run a shared
/// secret: without it, anyone who can reach the address can join.
pub const SECRET_VAR: &str = "FERRONICKEL_BOOTSTRAP_SECRET";

/// A magic derived from the root address alone (FNV-1a, then a splitmix64 finaliser to spread
/// the bits), so that processes given the same `NCCL_COMM_ID` agree without talking.
pub fn comm_id_magic(root: &SocketAddr) -> u64 {
    let mut bytes = b"ferronickel NCCL_COMM_ID".to_vec();
    put_addr(&mut bytes, root);
    let mut h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    h.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(magic: u64, root: &str, by0: bool) -> BootstrapId {
        BootstrapId {
            magic,
            secret: Secret([magic as u8; SECRET_LEN]),
            root: root.parse().unwrap(),
            root_by_rank0: by0,
        }
    }

    fn raw(id: &ncclUniqueId) -> Vec<u8> {
        id.internal.iter().map(|&c| c as u8).collect()
    }

    fn from_raw(b: &[u8]) -> Result<BootstrapId> {
        let mut u = ncclUniqueId { internal: [0; ID_BYTES] };
        for (d, &s) in u.internal.iter_mut().zip(b) {
            *d = s as std::ffi::c_char;
        }
        BootstrapId::from_unique_id(&u)
    }

    #[test]
    fn round_trip() {
        for i in [
            id(1, "127.0.0.1:1", false),
            id(u64::MAX, "192.0.2.2:65535", true),
            id(0x1234_5678_9abc_def0, "[fd00::2]:29500", false),
            id(7, "[fe80::1%3]:80", true),
        ] {
            assert_eq!(BootstrapId::from_unique_id(&i.to_unique_id()), Ok(i));
        }
    }

    #[test]
    fn layout_is_stable() {
        let b = raw(&id(0x0102_0304_0506_0708, "10.0.0.1:4660", true).to_unique_id());
        assert_eq!(&b[..8], b"FNID\x02\x01\x00\x00");
        assert_eq!(&b[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[16..48], &[8; 32]);
        assert_eq!(&b[48..55], &[4, 10, 0, 0, 1, 0x12, 0x34]);
        assert!(b[55..].iter().all(|&x| x == 0));
    }

    #[test]
    fn garbage_is_rejected() {
        let good = raw(&id(5, "127.0.0.1:9", false).to_unique_id());
        let expect_bad = |b: &[u8], needle: &str| match from_raw(b) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("{needle}: {other:?}"),
        };
        expect_bad(&[0; 128], "FNID");
        expect_bad(&[0xa5; 128], "FNID");
        let mut b = good.clone();
        b[4] = 1;
        expect_bad(&b, "version");
        let mut b = good.clone();
        b[5] = 2;
        expect_bad(&b, "flags");
        let mut b = good.clone();
        b[6] = 1;
        expect_bad(&b, "reserved");
        let mut b = good.clone();
        b[8..16].fill(0);
        expect_bad(&b, "magic is 0");
        let mut b = good.clone();
        b[48] = 5;
        expect_bad(&b, "family");
        let mut b = good.clone();
        b[53..55].fill(0);
        expect_bad(&b, "port 0");
        let mut b = good;
        b[127] = 1;
        expect_bad(&b, "not zero");
    }

    #[test]
    fn comm_id_magic_is_deterministic_and_address_specific() {
        let a: SocketAddr = "10.0.0.1:29500".parse().unwrap();
        let b: SocketAddr = "10.0.0.1:29501".parse().unwrap();
        assert_eq!(comm_id_magic(&a), comm_id_magic(&a));
        assert_ne!(comm_id_magic(&a), comm_id_magic(&b));
        assert_ne!(comm_id_magic(&a), 0);
        let i = BootstrapId::from_comm_id(a, None);
        assert!(i.root_by_rank0);
        assert_eq!(BootstrapId::from_unique_id(&i.to_unique_id()), Ok(i));
        // The secret: the same for the same inputs, different with a shared secret or address.
        assert_eq!(i, BootstrapId::from_comm_id(a, None));
        let s = BootstrapId::from_comm_id(a, Some("hunter2"));
        assert_eq!((s.magic, s.root), (i.magic, i.root));
        assert_ne!(s.secret, i.secret);
        assert_eq!(s, BootstrapId::from_comm_id(a, Some("hunter2")));
        assert_ne!(s.secret, BootstrapId::from_comm_id(a, Some("hunter3")).secret);
        assert_ne!(i.secret, BootstrapId::from_comm_id(b, None).secret);
    }
}
