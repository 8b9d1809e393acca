//! Bootstrap frames: a fixed 12-byte header (tag, version, kind, length) and a typed body.
//!
//! Pure code: [`encode`] and [`decode`] work on byte slices, so every malformed input a stranger
//! could send is covered by unit tests without sockets. The header carries a tag so that random
//! bytes are recognised after the first byte, and the length is checked against a cap *before*
//! any body is buffered, so an oversized frame costs the reader nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use super::auth::{Nonce, Proof};

/// First four bytes of every frame.
pub const FRAME_TAG: [u8; 4] = *b"FNBS";
/// Frame layout version; a peer speaking another one is refused rather than misread.
/// 2: connections open with the challenge/response of [`super::auth`]; the magic moved from
/// Register and Hello into Auth; Lost.
/// 3: the root sends each rank its ring neighbour's address ([`Msg::RingNext`]) instead of the
/// whole peer table; ranks gather the table around the ring.
pub const VERSION: u8 = 3;
/// Tag, version, kind, two reserved zero bytes, body length (u32 little-endian).
pub const HEADER_LEN: usize = 12;
/// Largest body accepted from a connection that has not yet proved it holds the unique id.
pub const MAX_CONTROL_BODY: usize = 1 << 20;
/// Largest body accepted from an authenticated rank (bootstrap data is small; this only bounds
/// what a buggy peer can make us allocate).
pub const MAX_DATA_BODY: usize = 1 << 30;

/// What a connection to a rank's listener is for, announced in its [`Msg::Hello`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// The long-lived ring link from the previous rank.
    Ring,
    /// One point-to-point message, then the sender closes.
    P2p,
    /// The link to the next rank that the liveness watcher (`liveness`) keeps for the
    /// communicator's life: heartbeats, a goodbye, news of a lost rank, hang reports.
    Liveness,
}

/// Why the root refused or ended a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefuseReason {
    /// This registration itself was wrong (magic, rank, nranks, duplicate).
    Rejected,
    /// The deadline passed with ranks still missing.
    Missing,
    /// A registered rank's connection closed before every rank was in: it died.
    Lost,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Rank → root: who I am and where my listener is. `timeout_ms` tells a root started by
    /// `ncclGetUniqueId` (which cannot know the caller's timeout) how long to wait for the rest.
    Register { rank: u32, nranks: u32, listen: SocketAddr, timeout_ms: u64 },
    /// Root → each rank, once every rank has registered: the listen address of its next rank
    /// on the ring. One address per rank, so the root's work grows linearly with ranks; the
    /// ranks then gather the whole table around the ring (docs/ARCHITECTURE.md, "Bootstrap at
    /// scale").
    RingNext { next: SocketAddr },
    /// Root → rank: the registration failed; `text` is the whole explanation.
    Refused { reason: RefuseReason, text: String },
    /// First frame after authentication on a connection to a rank's listener.
    Hello { from: u32, link: LinkKind },
    /// Payload between ranks: `tag` and `seq` identify it (p2p: user tag and per-tag sequence;
    /// ring: originating rank and collective counter).
    Data { tag: u32, seq: u64, payload: Vec<u8> },
    /// Listener → connector, as soon as a connection is accepted: the nonce to sign.
    Challenge { nonce: Nonce },
    /// Connector → listener: the unique id's magic (which job) and the connector's proof over
    /// both nonces. Nothing else is accepted before it checks out.
    Auth { magic: u64, nonce: Nonce, proof: Proof },
    /// Listener → connector: the listener's proof, so the connector knows whom it talks to.
    Proven { proof: Proof },
    /// On a ring link, instead of the next block: `rank` was lost (its connection closed) and
    /// the collective cannot finish; forwarded around the ring so every rank names it.
    Lost { rank: u32, text: String },
    /// Rank → root: my ring links are up. Root → every rank: everyone's are, init is done.
    Ready,
}

impl Msg {
    /// The message's kind for logs, without dumping a stranger's payload.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Msg::Register { .. } => "Register",
            Msg::RingNext { .. } => "RingNext",
            Msg::Refused { .. } => "Refused",
            Msg::Hello { .. } => "Hello",
            Msg::Data { .. } => "Data",
            Msg::Challenge { .. } => "Challenge",
            Msg::Auth { .. } => "Auth",
            Msg::Proven { .. } => "Proven",
            Msg::Lost { .. } => "Lost",
            Msg::Ready => "Ready",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not a ferronickel bootstrap frame (starts with {0:02x?})")]
    BadTag(Vec<u8>),
    #[error("bootstrap frame version {0} is not supported (this library speaks {VERSION}); are all ranks using the same library?")]
    BadVersion(u8),
    #[error("unknown bootstrap frame kind {0}")]
    BadKind(u8),
    #[error("bootstrap frame body of {len} bytes exceeds the {max}-byte limit")]
    Oversized { len: usize, max: usize },
    #[error("truncated bootstrap frame: the connection ended after {have} of {need} bytes")]
    Truncated { have: usize, need: usize },
    #[error("malformed bootstrap frame: {0}")]
    Malformed(String),
}

const KIND_REGISTER: u8 = 1;
const KIND_RING_NEXT: u8 = 2;
const KIND_REFUSED: u8 = 3;
const KIND_HELLO: u8 = 4;
const KIND_DATA: u8 = 5;
const KIND_CHALLENGE: u8 = 6;
const KIND_AUTH: u8 = 7;
const KIND_PROVEN: u8 = 8;
const KIND_LOST: u8 = 9;
const KIND_READY: u8 = 10;

/// The longest address [`put_addr`] writes (IPv6 with a scope), for bounding what carries one.
pub const MAX_ADDR_LEN: usize = 23;

const FAMILY_V4: u8 = 4;
const FAMILY_V6: u8 = 6;

/// Appends the address encoding shared by frames and the unique id:
/// family byte, IP (4 or 16 bytes), port (big-endian), and for IPv6 the scope id.
pub fn put_addr(out: &mut Vec<u8>, addr: &SocketAddr) {
    match addr {
        SocketAddr::V4(a) => {
            out.push(FAMILY_V4);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
        SocketAddr::V6(a) => {
            out.push(FAMILY_V6);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
            out.extend_from_slice(&a.scope_id().to_le_bytes());
        }
    }
}

/// A bounds-checked cursor over a body; every read names what it was reading when it fails.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], WireError> {
        if self.remaining() < n {
            return Err(WireError::Malformed(format!("{what}: needs {n} bytes, {} left", self.remaining())));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N, what)?);
        Ok(a)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, WireError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Reads what [`put_addr`] wrote; port 0 is refused because no listener has it.
    pub fn addr(&mut self, what: &str) -> Result<SocketAddr, WireError> {
        let addr = match self.u8(what)? {
            FAMILY_V4 => {
                let ip = Ipv4Addr::from(self.array::<4>(what)?);
                SocketAddr::new(IpAddr::V4(ip), u16::from_be_bytes(self.array(what)?))
            }
            FAMILY_V6 => {
                let ip = Ipv6Addr::from(self.array::<16>(what)?);
                let port = u16::from_be_bytes(self.array(what)?);
                let scope = u32::from_le_bytes(self.array(what)?);
                SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope))
            }
            f => return Err(WireError::Malformed(format!("{what}: unknown address family {f}"))),
        };
        if addr.port() == 0 {
            return Err(WireError::Malformed(format!("{what}: port 0")));
        }
        Ok(addr)
    }

    /// The rest of the body as UTF-8 text.
    pub fn text(&mut self, what: &str) -> Result<String, WireError> {
        String::from_utf8(self.rest().to_vec()).map_err(|_| WireError::Malformed(format!("{what} is not UTF-8")))
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    /// Fails when bytes are left over: a body must be exactly what its kind says.
    pub fn finish(&self, what: &str) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(WireError::Malformed(format!("{what}: {n} trailing bytes"))),
        }
    }
}

/// The whole frame for `msg`. The caller keeps payloads under [`MAX_DATA_BODY`].
pub fn encode(msg: &Msg) -> Vec<u8> {
    let mut body = Vec::new();
    let kind = match msg {
        Msg::Register { rank, nranks, listen, timeout_ms } => {
            body.extend_from_slice(&rank.to_le_bytes());
            body.extend_from_slice(&nranks.to_le_bytes());
            put_addr(&mut body, listen);
            body.extend_from_slice(&timeout_ms.to_le_bytes());
            KIND_REGISTER
        }
        Msg::RingNext { next } => {
            put_addr(&mut body, next);
            KIND_RING_NEXT
        }
        Msg::Refused { reason, text } => {
            body.push(match reason {
                RefuseReason::Rejected => 0,
                RefuseReason::Missing => 1,
                RefuseReason::Lost => 2,
            });
            body.extend_from_slice(text.as_bytes());
            KIND_REFUSED
        }
        Msg::Hello { from, link } => {
            body.extend_from_slice(&from.to_le_bytes());
            body.push(match link {
                LinkKind::Ring => 0,
                LinkKind::P2p => 1,
                LinkKind::Liveness => 2,
            });
            KIND_HELLO
        }
        Msg::Data { tag, seq, payload } => return encode_data(*tag, *seq, payload),
        Msg::Challenge { nonce } => {
            body.extend_from_slice(nonce);
            KIND_CHALLENGE
        }
        Msg::Auth { magic, nonce, proof } => {
            body.extend_from_slice(&magic.to_le_bytes());
            body.extend_from_slice(nonce);
            body.extend_from_slice(proof);
            KIND_AUTH
        }
        Msg::Proven { proof } => {
            body.extend_from_slice(proof);
            KIND_PROVEN
        }
        Msg::Lost { rank, text } => {
            body.extend_from_slice(&rank.to_le_bytes());
            body.extend_from_slice(text.as_bytes());
            KIND_LOST
        }
        Msg::Ready => KIND_READY,
    };
    frame(kind, &[&body])
}

/// The frame of a [`Msg::Data`] without first copying the payload into a `Msg`.
pub fn encode_data(tag: u32, seq: u64, payload: &[u8]) -> Vec<u8> {
    frame(KIND_DATA, &[&tag.to_le_bytes(), &seq.to_le_bytes(), payload])
}

fn frame(kind: u8, body: &[&[u8]]) -> Vec<u8> {
    let len: usize = body.iter().map(|b| b.len()).sum();
    let mut out = Vec::with_capacity(HEADER_LEN + len);
    out.extend_from_slice(&FRAME_TAG);
    out.extend_from_slice(&[VERSION, kind, 0, 0]);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    body.iter().for_each(|b| out.extend_from_slice(b));
    out
}

/// Decodes the first frame in `buf`: `Ok(None)` while more bytes are needed, else the message
/// and how many bytes it used. Errors as early as the bytes allow: a wrong first byte, a bad
/// header or a length over `max_body` fail before the body arrives.
pub fn decode(buf: &[u8], max_body: usize) -> Result<Option<(Msg, usize)>, WireError> {
    let seen = buf.len().min(FRAME_TAG.len());
    if buf[..seen] != FRAME_TAG[..seen] {
        return Err(WireError::BadTag(buf[..seen].to_vec()));
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let mut h = Reader::new(&buf[4..HEADER_LEN]);
    let (version, kind, reserved) = (h.u8("version")?, h.u8("kind")?, h.bytes(2, "reserved")?);
    if version != VERSION {
        return Err(WireError::BadVersion(version));
    }
    if !(KIND_REGISTER..=KIND_READY).contains(&kind) {
        return Err(WireError::BadKind(kind));
    }
    if reserved != [0, 0] {
        return Err(WireError::Malformed("reserved header bytes are not zero".into()));
    }
    let len = h.u32("length")? as usize;
    if len > max_body {
        return Err(WireError::Oversized { len, max: max_body });
    }
    let end = HEADER_LEN + len;
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((decode_body(kind, &buf[HEADER_LEN..end])?, end)))
}

/// Decodes a buffer that must hold exactly one frame (a connection that has ended, a test).
pub fn decode_complete(buf: &[u8], max_body: usize) -> Result<Msg, WireError> {
    match decode(buf, max_body)? {
        None => {
            let need = match buf.len() >= HEADER_LEN {
                true => HEADER_LEN + Reader::new(&buf[8..]).u32("length")? as usize,
                false => HEADER_LEN,
            };
            Err(WireError::Truncated { have: buf.len(), need })
        }
        Some((msg, used)) if used == buf.len() => Ok(msg),
        Some((_, used)) => Err(WireError::Malformed(format!("{} bytes after the frame", buf.len() - used))),
    }
}

fn decode_body(kind: u8, body: &[u8]) -> Result<Msg, WireError> {
    let mut r = Reader::new(body);
    let msg = match kind {
        KIND_REGISTER => Msg::Register {
            rank: r.u32("register rank")?,
            nranks: r.u32("register nranks")?,
            listen: r.addr("register listen address")?,
            timeout_ms: r.u64("register timeout")?,
        },
        KIND_RING_NEXT => Msg::RingNext { next: r.addr("ring next address")? },
        KIND_REFUSED => {
            let reason = match r.u8("refusal reason")? {
                0 => RefuseReason::Rejected,
                1 => RefuseReason::Missing,
                2 => RefuseReason::Lost,
                x => return Err(WireError::Malformed(format!("unknown refusal reason {x}"))),
            };
            Msg::Refused { reason, text: r.text("refusal text")? }
        }
        KIND_HELLO => Msg::Hello {
            from: r.u32("hello rank")?,
            link: match r.u8("hello link kind")? {
                0 => LinkKind::Ring,
                1 => LinkKind::P2p,
                2 => LinkKind::Liveness,
                x => return Err(WireError::Malformed(format!("unknown link kind {x}"))),
            },
        },
        KIND_DATA => Msg::Data { tag: r.u32("data tag")?, seq: r.u64("data sequence")?, payload: r.rest().to_vec() },
        KIND_CHALLENGE => Msg::Challenge { nonce: r.array("challenge nonce")? },
        KIND_AUTH => {
            Msg::Auth { magic: r.u64("auth magic")?, nonce: r.array("auth nonce")?, proof: r.array("auth proof")? }
        }
        KIND_PROVEN => Msg::Proven { proof: r.array("proof")? },
        KIND_LOST => Msg::Lost { rank: r.u32("lost rank")?, text: r.text("lost text")? },
        KIND_READY => Msg::Ready,
        _ => return Err(WireError::BadKind(kind)),
    };
    r.finish("frame body")?;
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn samples() -> Vec<Msg> {
        vec![
            Msg::Register { rank: 3, nranks: 8, listen: v4("10.1.2.3:4567"), timeout_ms: 5000 },
            Msg::Register {
                rank: 0,
                nranks: 1,
                listen: SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 9, 0, 7)),
                timeout_ms: 0,
            },
            Msg::RingNext { next: v4("127.0.0.1:1") },
            Msg::RingNext { next: SocketAddr::V6(SocketAddrV6::new("fe80::2".parse().unwrap(), 65535, 0, 3)) },
            Msg::Refused { reason: RefuseReason::Rejected, text: "rank 1 already registered".into() },
            Msg::Refused { reason: RefuseReason::Missing, text: String::new() },
            Msg::Refused { reason: RefuseReason::Lost, text: "rank 2 died".into() },
            Msg::Hello { from: 7, link: LinkKind::Ring },
            Msg::Hello { from: 0, link: LinkKind::P2p },
            Msg::Hello { from: 3, link: LinkKind::Liveness },
            Msg::Challenge { nonce: [9; 16] },
            Msg::Auth { magic: u64::MAX, nonce: [1; 16], proof: [2; 32] },
            Msg::Proven { proof: [3; 32] },
            Msg::Lost { rank: 5, text: "rank 5 closed its ring link".into() },
            Msg::Ready,
            Msg::Data { tag: 9, seq: 1 << 40, payload: vec![] },
            Msg::Data { tag: u32::MAX, seq: 0, payload: (0..=255).collect() },
        ]
    }

    #[test]
    fn round_trip_every_kind() {
        for m in samples() {
            let f = encode(&m);
            assert_eq!(decode(&f, MAX_CONTROL_BODY), Ok(Some((m.clone(), f.len()))));
            assert_eq!(decode_complete(&f, MAX_CONTROL_BODY), Ok(m));
        }
    }

    #[test]
    fn frames_back_to_back_decode_one_at_a_time() {
        let msgs = samples();
        let stream: Vec<u8> = msgs.iter().flat_map(encode).collect();
        let mut pos = 0;
        for m in &msgs {
            let (got, used) = decode(&stream[pos..], MAX_CONTROL_BODY).unwrap().unwrap();
            assert_eq!(&got, m);
            pos += used;
        }
        assert_eq!(pos, stream.len());
    }

    #[test]
    fn every_prefix_is_incomplete_not_an_error() {
        for m in samples() {
            let f = encode(&m);
            for cut in 0..f.len() {
                assert_eq!(decode(&f[..cut], MAX_CONTROL_BODY), Ok(None), "{m:?} cut at {cut}");
                assert!(matches!(decode_complete(&f[..cut], MAX_CONTROL_BODY), Err(WireError::Truncated { .. })));
            }
        }
    }

    #[test]
    fn truncated_reports_sizes() {
        let f = encode(&Msg::Hello { from: 2, link: LinkKind::P2p });
        assert_eq!(
            decode_complete(&f[..f.len() - 1], MAX_CONTROL_BODY),
            Err(WireError::Truncated { have: f.len() - 1, need: f.len() })
        );
        assert_eq!(decode_complete(&f[..3], MAX_CONTROL_BODY), Err(WireError::Truncated { have: 3, need: HEADER_LEN }));
    }

    #[test]
    fn garbage_is_rejected_from_the_first_byte() {
        assert_eq!(decode(b"G", MAX_CONTROL_BODY), Err(WireError::BadTag(b"G".to_vec())));
        assert_eq!(decode(b"GET / HTTP/1.1\r\n", MAX_CONTROL_BODY), Err(WireError::BadTag(b"GET ".to_vec())));
        assert_eq!(decode(b"FNBX\x01", MAX_CONTROL_BODY), Err(WireError::BadTag(b"FNBX".to_vec())));
        assert_eq!(decode(b"", MAX_CONTROL_BODY), Ok(None));
    }

    #[test]
    fn header_fields_are_checked() {
        let good = encode(&Msg::Hello { from: 2, link: LinkKind::Ring });
        let mut f = good.clone();
        f[4] = 1;
        assert_eq!(decode(&f, MAX_CONTROL_BODY), Err(WireError::BadVersion(1)), "version 1 peers are refused");
        let mut f = good.clone();
        f[5] = 0;
        assert_eq!(decode(&f, MAX_CONTROL_BODY), Err(WireError::BadKind(0)));
        f[5] = 11;
        assert_eq!(decode(&f, MAX_CONTROL_BODY), Err(WireError::BadKind(11)));
        let mut f = good;
        f[7] = 1;
        assert!(matches!(decode(&f, MAX_CONTROL_BODY), Err(WireError::Malformed(_))));
    }

    #[test]
    fn oversized_is_rejected_from_the_header_alone() {
        let mut h = encode(&Msg::Data { tag: 0, seq: 0, payload: vec![] });
        h[8..12].copy_from_slice(&(MAX_CONTROL_BODY as u32 + 1).to_le_bytes());
        assert_eq!(
            decode(&h[..HEADER_LEN], MAX_CONTROL_BODY),
            Err(WireError::Oversized { len: MAX_CONTROL_BODY + 1, max: MAX_CONTROL_BODY })
        );
        // The same length is fine where the cap is larger (an authenticated peer): just incomplete.
        assert_eq!(decode(&h[..HEADER_LEN], MAX_DATA_BODY), Ok(None));
    }

    /// A frame whose header is valid but whose body does not match its kind.
    fn with_body(kind: u8, body: &[u8]) -> Vec<u8> {
        frame(kind, &[body])
    }

    #[test]
    fn malformed_bodies() {
        let malformed = |kind, body: &[u8]| {
            let r = decode(&with_body(kind, body), MAX_CONTROL_BODY);
            assert!(matches!(r, Err(WireError::Malformed(_))), "kind {kind} body {body:?}: {r:?}");
        };
        // Short bodies of every fixed-size kind.
        malformed(KIND_REGISTER, &[0; 10]);
        malformed(KIND_HELLO, &[0; 4]);
        malformed(KIND_CHALLENGE, &[0; 15]);
        malformed(KIND_AUTH, &[0; 55]);
        malformed(KIND_PROVEN, &[0; 31]);
        malformed(KIND_LOST, &[0; 3]);
        malformed(KIND_LOST, &[0, 0, 0, 0, 0xff]);
        malformed(KIND_READY, &[0]);
        malformed(KIND_DATA, &[0; 11]);
        malformed(KIND_RING_NEXT, &[FAMILY_V4, 127, 0, 0]);
        malformed(KIND_RING_NEXT, &[]);
        malformed(KIND_REFUSED, &[]);
        // Trailing bytes after a complete body.
        let mut hello = encode(&Msg::Hello { from: 2, link: LinkKind::Ring })[HEADER_LEN..].to_vec();
        hello.push(0);
        malformed(KIND_HELLO, &hello);
        // Bad enums inside bodies.
        malformed(KIND_HELLO, &[0, 0, 0, 0, 9]);
        malformed(KIND_REFUSED, &[7]);
        malformed(KIND_REFUSED, &[0, 0xff, 0xfe]);
        // One address, not a table: anything after it is refused.
        malformed(KIND_RING_NEXT, &[FAMILY_V4, 127, 0, 0, 1, 0, 9, FAMILY_V4]);
    }

    #[test]
    fn bad_addresses() {
        let reg = |addr: &[u8]| {
            let mut b = 0u32.to_le_bytes().to_vec();
            b.extend_from_slice(&1u32.to_le_bytes());
            b.extend_from_slice(addr);
            b.extend_from_slice(&0u64.to_le_bytes());
            decode(&with_body(KIND_REGISTER, &b), MAX_CONTROL_BODY)
        };
        assert!(reg(&[FAMILY_V4, 127, 0, 0, 1, 0x12, 0x34]).unwrap().is_some());
        assert!(matches!(reg(&[5, 127, 0, 0, 1, 0x12, 0x34]), Err(WireError::Malformed(m)) if m.contains("family")));
        assert!(matches!(reg(&[FAMILY_V4, 127, 0, 0, 1, 0, 0]), Err(WireError::Malformed(m)) if m.contains("port 0")));
        assert!(matches!(reg(&[FAMILY_V6, 0, 0]), Err(WireError::Malformed(_))));
    }
}
