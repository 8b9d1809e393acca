//! What the Socket net puts on its sockets besides payload: the listener handle, the hello that
//! opens every socket of a connection, and the message and chunk headers.

use std::net::{IpAddr, SocketAddr};

use super::super::{Handle, HANDLE_BYTES};
use super::{HANDLE_MAGIC, HDR_BYTES, HELLO_BYTES, HELLO_MAGIC, MAX_CHUNK, MAX_SOCKS, MAX_THREADS, MIN_CHUNK};
use crate::error::{Error, Result};

/// A handle for the listener `nonce` at `addr` (public so that a relay put between two ends, as
/// in the fault tests, can hand out its own address).
pub fn encode_handle(nonce: u64, addr: SocketAddr) -> Handle {
    let mut h = [0u8; HANDLE_BYTES];
    h[..8].copy_from_slice(HANDLE_MAGIC);
    h[8..16].copy_from_slice(&nonce.to_le_bytes());
    h[16..18].copy_from_slice(&addr.port().to_le_bytes());
    match addr.ip() {
        IpAddr::V4(v4) => {
            h[18] = 4;
            h[19..23].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            h[18] = 6;
            h[19..35].copy_from_slice(&v6.octets());
        }
    }
    h
}

/// The listener nonce and address a handle holds.
pub fn decode_handle(h: &Handle) -> Result<(u64, SocketAddr)> {
    if &h[..8] != HANDLE_MAGIC {
        return Err(Error::InvalidArgument(
            "connect: the handle is not one this version of the Socket net's listen made (a peer on another \
             ferronickel version, or not a Socket handle)"
                .into(),
        ));
    }
    let nonce = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    let port = u16::from_le_bytes([h[16], h[17]]);
    let ip = match h[18] {
        4 => IpAddr::from(<[u8; 4]>::try_from(&h[19..23]).expect("4 bytes")),
        6 => IpAddr::from(<[u8; 16]>::try_from(&h[19..35]).expect("16 bytes")),
        f => return Err(Error::InvalidArgument(format!("connect: the handle holds an unknown address family {f}"))),
    };
    Ok((nonce, SocketAddr::new(ip, port)))
}

/// What a connecting socket says first: which listener it wants (the handle's nonce), which
/// connection it belongs to, its place in it and the connection's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub nonce: u64,
    pub conn: u64,
    /// 0: the control socket; 1..=nsocks: data sockets.
    pub index: u16,
    pub nsocks: u16,
    pub nthreads: u16,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[..8].copy_from_slice(HELLO_MAGIC);
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..24].copy_from_slice(&self.conn.to_le_bytes());
        b[24..26].copy_from_slice(&self.index.to_le_bytes());
        b[26..28].copy_from_slice(&self.nsocks.to_le_bytes());
        b[28..30].copy_from_slice(&self.nthreads.to_le_bytes());
        b
    }

    /// Parses and bounds a hello; the error says what was wrong with it.
    pub(super) fn decode(b: &[u8; HELLO_BYTES], nonce: u64) -> std::result::Result<Hello, String> {
        if &b[..8] != HELLO_MAGIC {
            return Err("not a ferronickel net hello".into());
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let h = Hello {
            nonce: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            conn: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            index: u16_at(24),
            nsocks: u16_at(26),
            nthreads: u16_at(28),
        };
        if h.nonce != nonce {
            return Err("a hello for another listener (stale or forged handle)".into());
        }
        if h.nsocks == 0
            || h.nsocks as usize > MAX_SOCKS
            || h.nthreads == 0
            || h.nthreads as usize > MAX_THREADS
            || h.nthreads > h.nsocks
        {
            return Err(format!("{} data sockets over {} threads is out of bounds", h.nsocks, h.nthreads));
        }
        if h.index > h.nsocks {
            return Err(format!("socket index {} of {}", h.index, h.nsocks));
        }
        Ok(h)
    }
}

/// The header of a message on the control socket: its tag, whether its bytes come in chunks on
/// the data sockets (else they follow the header inline) and its size. The sender chooses
/// ([`super::inline_cut`]); the receiver follows the header.
pub(super) fn msg_header(tag: i32, size: u64, chunked: bool) -> [u8; HDR_BYTES] {
    let mut b = [0u8; HDR_BYTES];
    b[..4].copy_from_slice(&tag.to_le_bytes());
    b[4..8].copy_from_slice(&u32::from(chunked).to_le_bytes());
    b[8..].copy_from_slice(&size.to_le_bytes());
    b
}

/// A message header's `(tag, size, chunked)`, or what is wrong with it: flags other than
/// "chunked", or a chunked message too short to make a chunk (both ends would skip its bytes).
pub(super) fn parse_msg_header(b: &[u8; HDR_BYTES]) -> std::result::Result<(i32, u64, bool), String> {
    let tag = i32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
    let flags = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    let size = u64::from_le_bytes(b[8..].try_into().expect("8 bytes"));
    match flags {
        0 => Ok((tag, size, false)),
        1 if size >= MIN_CHUNK as u64 => Ok((tag, size, true)),
        1 => {
            Err(format!("a message of {size} bytes (tag {tag}) announced in chunks, below the {MIN_CHUNK}-byte chunk"))
        }
        f => Err(format!("a message header with unknown flags {f:#x} (tag {tag})")),
    }
}

/// The header of a chunk on a data socket.
pub(super) fn chunk_header(seq: u32, len: u32, offset: u64) -> [u8; HDR_BYTES] {
    let mut b = [0u8; HDR_BYTES];
    b[..4].copy_from_slice(&seq.to_le_bytes());
    b[4..8].copy_from_slice(&len.to_le_bytes());
    b[8..].copy_from_slice(&offset.to_le_bytes());
    b
}

/// How a message of `size` bytes is cut: `(offset, len)` of each chunk; empty for a message
/// that goes inline. One chunk per data socket at most, each at least [`MIN_CHUNK`] long but
/// the last, which may fall short of it by less than one byte per chunk; more chunks only where
/// one would pass [`MAX_CHUNK`].
pub(super) fn chunks(size: usize, nsocks: usize) -> Vec<(usize, usize)> {
    if size < MIN_CHUNK {
        return Vec::new();
    }
    let n = (size / MIN_CHUNK).clamp(1, nsocks).max(size.div_ceil(MAX_CHUNK));
    let len = size.div_ceil(n);
    (0..n).map(|i| (i * len, len.min(size - (i * len).min(size)))).filter(|&(_, l)| l > 0).collect()
}
