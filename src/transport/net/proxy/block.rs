//! A NET connection's host block: the memory its kernels and the proxy thread share (pinned host
//! memory mapped for the GPU), and where the counters, size words and FIFOs sit in it.

use crate::abi::{
    FN_NET_ONE_MESSAGE_SIMPLE, FN_NSTEPS, FN_NUM_PROTOS, FN_PROTO_LL, FN_PROTO_LL128, FN_PROTO_SIMPLE,
    FN_SIZE_PROTO_SHIFT,
};
use crate::error::{Error, Result};
use crate::transport::fifo;

/// Steps a connection has in flight at most, each in its slot.
pub(super) const NSTEPS: u64 = FN_NSTEPS as u64;
/// Tags of the messages of a step: its size word (alone, or followed by the step's bytes when it
/// crosses as one message), then its bytes.
pub(super) const TAG_SIZE: i32 = 1;
pub(super) const TAG_DATA: i32 = 2;
/// The size word that says "closing": its protocol bits name no protocol, so no step has it.
pub(super) const GOODBYE: u32 = u32::MAX;

/// Offsets in one connection's host block: the counters on their own 128-byte lines, then the
/// sender's staging FIFOs, then the receiver's FIFOs (each: LL128, LL, Simple).
pub const SEND_TAIL: usize = 0;
pub const SEND_HEAD: usize = 128;
pub const SEND_SIZES: usize = 256;
pub const RECV_TAIL: usize = 384;
pub const RECV_HEAD: usize = 512;
/// Where the peer's size words land, one per slot.
pub const RECV_SIZES: usize = 640;
/// The goodbye word we send from when the communicator closes.
pub(super) const GOODBYE_AT: usize = 768;
/// Where the proxy copies each slot's size word to send it from, as it empties the kernel's
/// entry at once (see [`SIZE_EMPTY`]).
pub(super) const SEND_WORDS: usize = 896;
pub(super) const FIFOS: usize = 1024;
/// A size word entry no step has filled since the proxy took the last: an untailed LL step has
/// only its word to say it is there, so the proxy empties each entry once it has taken the step.
pub const SIZE_EMPTY: u32 = crate::abi::FN_SIZE_EMPTY;

/// The bytes of a size word; the rest of its 32 bits is the protocol.
const SIZE_MASK: u32 = (1 << FN_SIZE_PROTO_SHIFT) - 1;

/// The most bytes of a Simple or LL128 step that travel in one message with its size word into
/// an LL slot ([`Landing::Ll`]), when the net does not merge the two itself
/// ([`Layout::one_message`]): the receiving proxy copies such a step to its own slot. Up to 16
/// KiB that copy costs less than a second message; from 16 to 32 KiB it measured level or slower
/// (docs/NET.md, "One message per small step"). Every LL step but the largest (a whole slot)
/// crosses as one message, in place.
pub const INLINE_MAX: usize = 16 << 10;
/// The most bytes of a step that travel in one message into a Simple slot ([`Landing::Simple`]).
/// Four hosts through the test plugin on one H200, against two messages a step: steps of 16–64
/// KiB 1.09–1.27× faster (all-to-all of 64–256 KB, ring all-reduce of 32 KB–1 MB, send/recv of
/// 32–64 KB), steps of 128–256 KiB 0.86–0.96× (send/recv and broadcast from 512 KB, all-to-all
/// from 1 MB) (docs/NET.md, "One message per small step").
pub const SIMPLE_LANDING_MAX: usize = FN_NET_ONE_MESSAGE_SIMPLE as usize;

/// Where the first message of a step lands through a plugin ([`Layout::one_message`]), which both
/// ends of a connection derive alike from the step before (its protocol travels in its size
/// word): in the step's LL slot, where an LL step lands in place, or, after a Simple step, in the
/// step's Simple slot, where a Simple step lands in place up to its slot less a line, so that a
/// run of Simple steps crosses one message each (docs/NET.md, "One message per small step").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Landing {
    /// The first step, and every step after one in LL or LL128.
    #[default]
    Ll,
    Simple,
}

impl Landing {
    /// Where the step after one in `proto` lands.
    pub fn after(proto: u32) -> Landing {
        if proto == FN_PROTO_SIMPLE {
            Landing::Simple
        } else {
            Landing::Ll
        }
    }

    /// The protocol whose slot the first message lands in.
    pub fn proto(self) -> u32 {
        match self {
            Landing::Ll => FN_PROTO_LL,
            Landing::Simple => FN_PROTO_SIMPLE,
        }
    }
}
/// The line that carries a one-message step's size word (its first 4 bytes), after its data, and
/// the step's LL flag in both halves' flag words. In an LL slot a later LL step with more lines
/// polls this line, and that flag, FN_NSTEPS steps or more before its own, is not the one it
/// waits for; in a Simple slot the step's own bytes end before it, and a later step there is read
/// only once the tail has passed that step, whose own bytes then cover what it reads.
pub const WORD_LINE: usize = 16;

/// Where each protocol's slots sit in a connection's host block (`slot_bytes`: NCCL_BUFFSIZE's
/// Simple slot), in the layout of every connection's FIFOs (`transport::fifo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub slot_bytes: usize,
    /// A small step crosses as one message ([`Layout::inline`]), its data and then its size word's
    /// line, sent from the step's slot, where the sending proxy writes the line after the data; it
    /// lands in the step's LL slot, where an LL step's receiver polls its lines as the net's
    /// receive writes them, as NCCL's does, and any other step is copied to its own slot
    /// (docs/NET.md, "One message per small step"). For nets that send each message on its own
    /// (plugins); the built-in Socket net already puts a step's two messages in one `sendmsg` and
    /// lands the data in its slot with no copy (an LL step's, in the LL landing).
    pub one_message: bool,
}

impl Layout {
    /// Bytes between consecutive slots of `proto`'s FIFO.
    pub fn stride(&self, proto: u32) -> usize {
        fifo::stride(proto, self.slot_bytes)
    }

    /// Offset of the sender's staging FIFO of `proto`.
    pub fn send_fifo(&self, proto: u32) -> usize {
        FIFOS + fifo::offset(proto, self.slot_bytes)
    }

    /// Offset of the receiver's FIFO of `proto`.
    pub fn recv_fifo(&self, proto: u32) -> usize {
        FIFOS + fifo::bytes(self.slot_bytes) + fifo::offset(proto, self.slot_bytes)
    }

    /// Offset of the LL landing: where the net stores what the receiving kernel would find in its
    /// LL FIFO (one slot a step, at the same place as there), which the kernel never reads. A
    /// copy from the network (a socket's receive, a plugin's) does not promise to store each
    /// 8-byte half of an LL line whole, data with its flag, and an LL receiver polls the lines
    /// with no tail: so the proxy moves each LL step from here to its slot with stores that keep
    /// each half whole ([`publish_ll`]). The built-in net's LL steps all land here; through a
    /// plugin only those that cross as two messages (a whole slot's, or after a Simple step),
    /// since a one-message step lands in its LL slot, as NCCL's do ([`Layout::recv_first`]).
    pub fn ll_landing(&self) -> usize {
        FIFOS + 2 * fifo::bytes(self.slot_bytes)
    }

    /// Where the net stores what belongs at `off` of the receiver's FIFOs: an offset in its LL
    /// FIFO moves to the LL landing, any other stays.
    pub fn net_side(&self, off: usize) -> usize {
        let ll = self.recv_fifo(FN_PROTO_LL);
        match off.checked_sub(ll) {
            Some(d) if d < NSTEPS as usize * self.stride(FN_PROTO_LL) => self.ll_landing() + d,
            _ => off,
        }
    }

    /// Bytes of one connection's host block.
    pub fn block_bytes(&self) -> usize {
        self.ll_landing() + NSTEPS as usize * self.stride(FN_PROTO_LL)
    }

    /// Bytes of the one message of a step of `bytes`: its data to whole 16-byte lines, then the
    /// word's line, which starts at the length less [`WORD_LINE`].
    pub fn inline_len(bytes: usize) -> usize {
        bytes.div_ceil(16) * 16 + WORD_LINE
    }

    /// Where the first message of the step at `slot` lands, and the most bytes it may be: its
    /// size word alone, or with [`Layout::one_message`] the whole step, in the step's slot of the
    /// receiver's FIFO that `landing` names.
    ///
    /// In the LL slot, an LL step's lines are where the kernel polls them while the plugin's
    /// receive writes them, as NCCL's are: a plugin's `test` that copies from a socket returns
    /// 3–5 µs after its copy on `lo` (the TCP stack's work after it), and through the landing
    /// that wait came before the kernel's (docs/NET.md, "One message per small step"). This
    /// trusts the plugin's copy to store each aligned 8-byte half whole, as NCCL's LL does with
    /// the same plugin; the built-in net, whose copies we choose, keeps the landing.
    pub fn recv_first(&self, slot: usize, landing: Landing) -> (usize, usize) {
        let p = landing.proto();
        match self.one_message {
            true => (self.recv_fifo(p) + slot * self.stride(p), self.stride(p)),
            false => (RECV_SIZES + 4 * slot, 4),
        }
    }

    /// Whether the step of `proto` and `bytes` crosses as one message where the step lands as
    /// `landing` says: with its word's line it fits the slot it lands in and its own slot, which
    /// it is sent from; and, landing in an LL slot, it is LL (in place) or at most [`INLINE_MAX`],
    /// landing in a Simple slot at most [`SIMPLE_LANDING_MAX`] (in place if Simple, else copied:
    /// the first step after a run of Simple steps).
    pub fn inline(&self, proto: u32, bytes: usize, landing: Landing) -> bool {
        let fits = |slot: usize| Layout::inline_len(bytes) <= slot;
        let small = match landing {
            Landing::Ll => proto == FN_PROTO_LL || bytes <= INLINE_MAX,
            Landing::Simple => bytes <= SIMPLE_LANDING_MAX,
        };
        self.one_message && fits(self.stride(landing.proto())) && fits(self.stride(proto)) && small
    }

    /// Whether two full Simple slots fit a size word's bytes, so that they may cross as a pair
    /// (not with NCCL_BUFFSIZE's largest FIFOs, whose slots are 512 MiB).
    pub(super) fn pairs_fit(&self) -> bool {
        2 * self.slot_bytes <= SIZE_MASK as usize
    }

    /// The size word of a message of `bytes` of `proto`.
    pub(super) fn encode(proto: u32, bytes: usize) -> u32 {
        bytes as u32 | proto << FN_SIZE_PROTO_SHIFT
    }

    /// Checks a size word from the peer for the step at `slot`, and says how many steps its data
    /// carries: one, checked as [`Layout::decode`] does, or a pair of Simple steps in this slot
    /// and the next (more than a slot's bytes, at most two, and not from the FIFO's last slot).
    pub(super) fn decode_peer(&self, word: u32, slot: usize) -> std::result::Result<(u32, usize, u64), String> {
        let (proto, bytes) = (word >> FN_SIZE_PROTO_SHIFT, (word & SIZE_MASK) as usize);
        if proto != FN_PROTO_SIMPLE || bytes <= self.slot_bytes {
            return self.decode(word).map(|(p, b)| (p, b, 1));
        }
        if bytes > 2 * self.slot_bytes {
            return Err(format!(
                "size word {word:#010x}: {bytes} bytes for a slot of {} (protocol {proto}), or two in a pair",
                self.slot_bytes
            ));
        }
        if slot + 1 >= FN_NSTEPS as usize {
            return Err(format!("size word {word:#010x}: a pair of Simple steps from the FIFO's last slot"));
        }
        Ok((proto, bytes, 2))
    }

    /// Checks a size word (from our kernel or from the peer): a protocol we have, no more bytes
    /// than its slot holds, and for LL and LL128 whole lines (16 and 128 bytes), as the kernels
    /// write them (`kernels/prims.cuh`).
    pub(super) fn decode(&self, word: u32) -> std::result::Result<(u32, usize), String> {
        let (proto, bytes) = (word >> FN_SIZE_PROTO_SHIFT, (word & SIZE_MASK) as usize);
        if proto >= FN_NUM_PROTOS {
            return Err(format!("size word {word:#010x} names protocol {proto}"));
        }
        if bytes > self.stride(proto) {
            return Err(format!(
                "size word {word:#010x}: {bytes} bytes for a slot of {} (protocol {proto})",
                self.stride(proto)
            ));
        }
        let line = match proto {
            FN_PROTO_LL => 16,
            FN_PROTO_LL128 => 128,
            _ => 1,
        };
        if bytes % line != 0 {
            return Err(format!(
                "size word {word:#010x}: {bytes} bytes are not whole {line}-byte lines (protocol {proto})"
            ));
        }
        Ok((proto, bytes))
    }
}

/// Memory the kernels and the proxy share: pinned host memory mapped for the GPU (or, in tests,
/// plain host memory). `dev` is its address for the GPU.
pub struct HostBlock {
    host: *mut u8,
    dev: u64,
    len: usize,
    _owner: Box<dyn Send + Sync>,
}

// SAFETY: the block is plain memory; every access goes through volatile reads and writes or
// through the net's requests, and `_owner` (which frees it) is Send + Sync.
unsafe impl Send for HostBlock {}
// SAFETY: as above.
unsafe impl Sync for HostBlock {}

/// Page-aligned zeroed host memory, freed on drop (the memory of [`HostBlock::plain`]).
struct Plain {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: owns a plain allocation; nothing in it is thread-bound.
unsafe impl Send for Plain {}
// SAFETY: as above.
unsafe impl Sync for Plain {}

impl Drop for Plain {
    fn drop(&mut self) {
        // SAFETY: ptr came from alloc_zeroed with this layout and is freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

impl HostBlock {
    /// A block over memory `owner` keeps alive (and frees when dropped).
    ///
    /// # Safety
    /// `host..host+len` must be valid for reads and writes for as long as `owner` lives, and
    /// `dev` must be the same memory as the GPU sees it.
    pub unsafe fn new(host: *mut u8, dev: u64, len: usize, owner: Box<dyn Send + Sync>) -> HostBlock {
        HostBlock { host, dev, len, _owner: owner }
    }

    /// Zeroed, page-aligned plain host memory whose "device" address is its host address: for
    /// proxies driven by host threads in tests.
    pub fn plain(len: usize) -> Result<HostBlock> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| Error::InvalidArgument(format!("host block of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::System(format!("out of host memory for a {len}-byte FIFO block")));
        }
        Ok(HostBlock { host: ptr, dev: ptr as u64, len, _owner: Box::new(Plain { ptr, layout }) })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The host address of `off`, checked to leave `bytes` in the block.
    pub fn ptr(&self, off: usize, bytes: usize) -> *mut u8 {
        assert!(off.checked_add(bytes).is_some_and(|end| end <= self.len), "offset {off}+{bytes} past {}", self.len);
        // SAFETY: in bounds, checked above.
        unsafe { self.host.add(off) }
    }

    /// The device address of `off`.
    pub fn dev(&self, off: usize) -> u64 {
        assert!(off <= self.len);
        self.dev + off as u64
    }

    pub fn load_u64(&self, off: usize) -> u64 {
        // SAFETY: in bounds (checked by ptr) and 8-byte aligned (the counters' offsets are);
        // volatile because the GPU writes it concurrently.
        unsafe { std::ptr::read_volatile(self.ptr(off, 8) as *const u64) }
    }

    pub fn store_u64(&self, off: usize, v: u64) {
        // SAFETY: as in load_u64; volatile because the GPU polls it.
        unsafe { std::ptr::write_volatile(self.ptr(off, 8) as *mut u64, v) }
    }

    pub fn load_u32(&self, off: usize) -> u32 {
        // SAFETY: in bounds (checked by ptr) and 4-byte aligned; volatile as in load_u64.
        unsafe { std::ptr::read_volatile(self.ptr(off, 4) as *const u32) }
    }

    pub fn store_u32(&self, off: usize, v: u32) {
        // SAFETY: as in load_u32.
        unsafe { std::ptr::write_volatile(self.ptr(off, 4) as *mut u32, v) }
    }
}

/// Moves an LL step's `bytes` of lines from where the net stored them (`from`, in the LL landing
/// or, for a step that came as one message after a Simple step, in a Simple slot) to its slot
/// (`to`), where its kernel polls them: stores of whole 8-byte halves, in order, so that a half
/// the kernel finds carrying the step's flag carries its data too ([`Layout::ll_landing`]). With
/// AVX, 32 bytes a store: the kernel's threads poll every line of the step across PCIe while the
/// proxy stores them, and each store to a line one of them just read costs the cache line's
/// ownership again: with 8-byte stores, collectives whose LL steps carry 8 KiB of lines ran 2.5–5
/// us slower than with the socket's whole-line copy into the slot (one H200, 2026-11-27).
pub fn publish_ll(blk: &HostBlock, from: usize, to: usize, bytes: usize) {
    let (src, dst) = (blk.ptr(from, bytes), blk.ptr(to, bytes));
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: both ranges are in the block (checked by `ptr`) and apart (a landing is never
        // the step's own slot); every slot starts 16-byte aligned (`layout_fits_and_aligns`), and
        // AVX is there.
        unsafe { publish_avx(src, dst, bytes) };
        return;
    }
    publish_words(blk, from, to, bytes);
}

/// [`publish_ll`]'s copy without AVX: one 8-byte store a half.
fn publish_words(blk: &HostBlock, from: usize, to: usize, bytes: usize) {
    for off in (0..bytes).step_by(8) {
        blk.store_u64(to + off, blk.load_u64(from + off));
    }
}

/// [`publish_ll`]'s copy with 32-byte loads and stores (a 16-byte one for an odd line last): an
/// aligned 8-byte part of a vector store is stored whole.
///
/// # Safety
/// `src` and `dst` are valid for `bytes` (a multiple of 16) and apart, and the CPU has AVX. They
/// should be 8-byte aligned, or a half may be stored in two parts (not unsound, but no longer
/// whole).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn publish_avx(src: *const u8, dst: *mut u8, bytes: usize) {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm256_loadu_si256, _mm256_storeu_si256, _mm_loadu_si128, _mm_storeu_si128,
    };
    let mut off = 0;
    while off + 32 <= bytes {
        // SAFETY: in both ranges (the caller's contract).
        unsafe {
            _mm256_storeu_si256(dst.add(off) as *mut __m256i, _mm256_loadu_si256(src.add(off) as *const __m256i))
        };
        off += 32;
    }
    if off < bytes {
        // SAFETY: as above; what is left is one 16-byte line.
        unsafe { _mm_storeu_si128(dst.add(off) as *mut __m128i, _mm_loadu_si128(src.add(off) as *const __m128i)) };
    }
}

#[cfg(test)]
mod tests {
    use super::super::GOODBYE;
    use super::*;

    #[test]
    fn layout_fits_and_aligns() {
        for one_message in [false, true] {
            let l = Layout { slot_bytes: 1 << 19, one_message };
            let mut ends = Vec::new();
            for p in 0..FN_NUM_PROTOS {
                for off in [l.send_fifo(p), l.recv_fifo(p)] {
                    assert_eq!(off % 128, 0, "protocol {p}: LL128 lines and vector stores need alignment");
                    ends.push((off, off + FN_NSTEPS as usize * l.stride(p)));
                }
            }
            // The LL landing mirrors the receiver's LL FIFO, slot for slot, apart from every FIFO.
            let (ll, ll_fifo) = (l.ll_landing(), l.recv_fifo(FN_PROTO_LL));
            let ll_bytes = FN_NSTEPS as usize * l.stride(FN_PROTO_LL);
            assert_eq!(ll % 128, 0);
            ends.push((ll, ll + ll_bytes));
            assert_eq!((l.net_side(ll_fifo), l.net_side(ll_fifo + ll_bytes - 8)), (ll, ll + ll_bytes - 8));
            for other in [ll_fifo - 1, ll_fifo + ll_bytes, l.recv_fifo(FN_PROTO_SIMPLE), RECV_SIZES] {
                assert_eq!(l.net_side(other), other, "only the LL FIFO moves");
            }
            if one_message {
                let (ll_slot, simple_slot) = (l.stride(FN_PROTO_LL), l.stride(FN_PROTO_SIMPLE));
                for slot in 0..FN_NSTEPS as usize {
                    let ll = l.recv_fifo(FN_PROTO_LL) + slot * ll_slot;
                    assert_eq!(l.recv_first(slot, Landing::Ll), (ll, ll_slot), "in its own LL slot");
                    let simple = l.recv_fifo(FN_PROTO_SIMPLE) + slot * simple_slot;
                    assert_eq!(l.recv_first(slot, Landing::Simple), (simple, simple_slot), "or its Simple slot");
                }
                let ll = Landing::Ll;
                for p in [FN_PROTO_SIMPLE, FN_PROTO_LL128] {
                    assert!(l.inline(p, INLINE_MAX, ll) && !l.inline(p, INLINE_MAX + 1, ll), "protocol {p}");
                }
                assert!(l.inline(FN_PROTO_LL, ll_slot - WORD_LINE, ll), "LL steps of all but a whole slot");
                assert!(!l.inline(FN_PROTO_LL, ll_slot, ll), "a whole LL slot has no room for its word's line");
                // After a Simple step: a Simple step up to its slot less a line lands in place, the
                // others are copied up to their own slot less a line.
                let simple = Landing::Simple;
                assert!(l.inline(FN_PROTO_SIMPLE, SIMPLE_LANDING_MAX, simple));
                assert!(!l.inline(FN_PROTO_SIMPLE, SIMPLE_LANDING_MAX + 1, simple));
                assert!(!l.inline(FN_PROTO_LL128, l.stride(FN_PROTO_LL128), simple), "a whole LL128 slot");
                let big = Layout { slot_bytes: 1 << 15, one_message };
                assert!(big.inline(FN_PROTO_SIMPLE, (1 << 15) - WORD_LINE, simple), "a Simple slot less a line");
                assert!(!big.inline(FN_PROTO_SIMPLE, 1 << 15, simple));
                assert!(l.inline(FN_PROTO_LL128, SIMPLE_LANDING_MAX - 128, simple), "copied to its slot");
                assert!(!l.inline(FN_PROTO_LL, ll_slot, simple));
                assert_eq!((Landing::after(FN_PROTO_SIMPLE), Landing::after(FN_PROTO_LL128)), (simple, ll));
                assert_eq!((Layout::inline_len(16), Layout::inline_len(3)), (32, 32));
                // A Simple slot smaller than the step and its word's line: two messages.
                let small = Layout { slot_bytes: 4096, one_message };
                for landing in [ll, simple] {
                    assert!(small.inline(FN_PROTO_SIMPLE, 4096 - 16, landing));
                    assert!(!small.inline(FN_PROTO_SIMPLE, 4096 - 15, landing));
                }
                assert!(!small.inline(FN_PROTO_LL, 8192, simple), "LL landing in a Simple slot too small");
            } else {
                assert!(!l.inline(FN_PROTO_LL, 0, Landing::Ll), "the built-in net merges the messages itself");
                assert_eq!(l.recv_first(3, Landing::Ll), (RECV_SIZES + 12, 4), "a size word alone");
                assert_eq!(l.recv_first(3, Landing::Simple), (RECV_SIZES + 12, 4));
            }
            ends.sort();
            assert!(ends[0].0 >= FIFOS && ends.windows(2).all(|w| w[0].1 <= w[1].0), "areas overlap: {ends:?}");
            assert!(ends.last().unwrap().1 <= l.block_bytes() && l.block_bytes() - ends.last().unwrap().1 < 128);
        }
        let l = Layout { slot_bytes: 1 << 19, one_message: false };
        assert!(RECV_SIZES + 4 * FN_NSTEPS as usize <= GOODBYE_AT && GOODBYE_AT + 4 <= SEND_WORDS);
        assert!(SEND_WORDS + 4 * FN_NSTEPS as usize <= FIFOS);
        assert!(l.decode(GOODBYE).is_err(), "a goodbye is never a step");
        assert!(l.decode(SIZE_EMPTY).is_err(), "an empty entry is never a step");
    }

    /// Both of the landing's copies move an LL step's lines exactly, odd lines included, and
    /// nothing past them.
    #[test]
    fn ll_lines_move_exactly() {
        let l = Layout { slot_bytes: 1 << 16, one_message: false };
        let stride = l.stride(FN_PROTO_LL);
        for bytes in [16, 32, 48, 1008, stride] {
            type Copy = fn(&HostBlock, usize, usize, usize);
            for (name, copy) in [("publish_ll", publish_ll as Copy), ("publish_words", publish_words as Copy)] {
                let blk = HostBlock::plain(l.block_bytes()).unwrap();
                let (from, to) = (l.ll_landing() + stride, l.recv_fifo(FN_PROTO_LL) + stride);
                for off in (0..stride).step_by(8) {
                    blk.store_u64(from + off, 0x0101_0101_0101_0101u64.wrapping_mul(off as u64 + 1));
                    blk.store_u64(to + off, u64::MAX);
                }
                copy(&blk, from, to, bytes);
                for off in (0..stride).step_by(8) {
                    let want = if off < bytes { blk.load_u64(from + off) } else { u64::MAX };
                    assert_eq!(blk.load_u64(to + off), want, "{name}, {bytes} bytes: word at {off}");
                }
            }
        }
    }

    #[test]
    fn size_words_are_bounded() {
        let l = Layout { slot_bytes: 1 << 16, one_message: false };
        let w = |p: u32, b: u32| b | p << FN_SIZE_PROTO_SHIFT;
        assert_eq!(l.decode(w(FN_PROTO_SIMPLE, 1 << 16)), Ok((FN_PROTO_SIMPLE, 1 << 16)));
        assert_eq!(l.decode(w(FN_PROTO_LL, 0)), Ok((FN_PROTO_LL, 0)));
        assert!(l.decode(w(FN_PROTO_SIMPLE, (1 << 16) + 1)).is_err());
        assert!(l.decode(w(FN_PROTO_LL, 32 * 1024 + 16)).unwrap_err().contains("bytes for a slot"));
        // LL and LL128 steps are whole lines; anything else from a peer is garbage.
        assert!(l.decode(w(FN_PROTO_LL, 24)).unwrap_err().contains("whole 16-byte lines"));
        assert!(l.decode(w(FN_PROTO_LL128, 192)).unwrap_err().contains("whole 128-byte lines"));
        assert_eq!(l.decode(w(FN_PROTO_LL128, 256)), Ok((FN_PROTO_LL128, 256)));
        assert_eq!(l.decode(w(FN_PROTO_SIMPLE, 3)), Ok((FN_PROTO_SIMPLE, 3)));
        assert!(l.decode(w(3, 8)).unwrap_err().contains("protocol 3"));
        // From the peer, a Simple word of more than a slot is a pair: this slot and the next.
        assert_eq!(l.decode_peer(w(FN_PROTO_SIMPLE, 1 << 16), 7), Ok((FN_PROTO_SIMPLE, 1 << 16, 1)));
        assert_eq!(l.decode_peer(w(FN_PROTO_SIMPLE, 2 << 16), 6), Ok((FN_PROTO_SIMPLE, 2 << 16, 2)));
        assert!(l.decode_peer(w(FN_PROTO_SIMPLE, (1 << 16) + 1), 7).unwrap_err().contains("last slot"));
        assert!(l.decode_peer(w(FN_PROTO_SIMPLE, (2 << 16) + 1), 0).unwrap_err().contains("or two in a pair"));
        assert!(l.decode_peer(w(FN_PROTO_LL128, (1 << 16) + 128), 0).unwrap_err().contains("bytes for a slot"));
        assert_eq!(l.decode_peer(w(FN_PROTO_LL, 32), 3), Ok((FN_PROTO_LL, 32, 1)));
        // A pair's bytes must fit the word: not with NCCL_BUFFSIZE's largest FIFO (4 GiB).
        assert!(l.pairs_fit() && Layout { slot_bytes: 1 << 28, ..l }.pairs_fit());
        assert!(!Layout { slot_bytes: 1 << 29, ..l }.pairs_fit());
    }
}
