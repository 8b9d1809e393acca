//! The two halves of a NET connection as the proxy thread drives them: the sending half hands
//! the kernel's steps from the host block to the send comm, the receiving half lands the peer's
//! steps in the block (docs/NET.md, "The NET transport").

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use super::block::{
    publish_ll, HostBlock, Landing, Layout, RECV_HEAD, RECV_TAIL, SEND_HEAD, SEND_SIZES, SEND_TAIL, SEND_WORDS,
    SIZE_EMPTY, WORD_LINE,
};
use super::block::{GOODBYE, NSTEPS, TAG_DATA, TAG_SIZE};
use super::trace::Trace;
use crate::abi::{FN_PROTO_LL, FN_PROTO_SIMPLE};
use crate::error::{Error, Result};
use crate::plugin::profiler::Parent;
use crate::transport::net::{MemHandle, RecvBuf, RecvComm, Request, SendComm};

/// The sending half of a connection, as the proxy drives it.
pub(super) struct SendSide {
    pub(super) comm: Box<dyn SendComm>,
    pub(super) mr: Option<MemHandle>,
    /// Steps whose data send was posted / completed.
    posted: u64,
    done: u64,
    /// The size word of step `posted` went out, announcing these bytes and steps (that step's,
    /// or with the next a pair's: [`pair`]); its data has not.
    pub(super) size_sent: Option<(usize, u64)>,
    /// Lines of the untailed LL step `posted` already seen carrying its flag.
    ll_seen: usize,
    /// Requests in posting order, with the step and bytes a data send completes.
    pub(super) inflight: VecDeque<(Request, Option<(u64, usize)>)>,
    /// Bytes of the data sends posted and not completed.
    unsent: usize,
    /// Where step `posted` lands at the peer, through a plugin (after the step before it).
    landing: Landing,
    pub(super) trace: Option<Trace>,
}

impl SendSide {
    /// A send comm whose host block is registered as `mr`, nothing sent yet.
    pub(super) fn new(comm: Box<dyn SendComm>, mr: MemHandle, trace: Option<Trace>) -> SendSide {
        SendSide {
            comm,
            mr: Some(mr),
            posted: 0,
            done: 0,
            size_sent: None,
            ll_seen: 0,
            inflight: VecDeque::new(),
            unsent: 0,
            landing: Landing::default(),
            trace,
        }
    }

    /// Hands the kernel's finished steps to the net while less than a slot's bytes are posted and
    /// not sent (one step at least), and completes the sends that are done. A plugin sends inside
    /// its `test`, on this thread, as much as the socket takes of everything posted: bounded
    /// so, one direction's turn cannot keep the thread from the other (docs/NET.md, "One step a
    /// turn").
    pub(super) fn progress(&mut self, blk: &HostBlock, layout: &Layout) -> Result<bool> {
        let mut moved = false;
        let tail = blk.load_u64(SEND_TAIL);
        // Simple and LL128 steps: the kernel stores the size word and the slot before the tail
        // (after a system fence). LL steps publish no tail: the size word, then every line's flag.
        fence(Ordering::Acquire);
        while self.posted < self.done + NSTEPS {
            let slot = (self.posted % NSTEPS) as usize;
            let size_at = SEND_SIZES + 4 * slot;
            let word = blk.load_u32(size_at);
            if word == SIZE_EMPTY {
                break;
            }
            let (proto, bytes) = layout
                .decode(word)
                .map_err(|e| Error::Internal(format!("the kernel's step {} carries a bad {e}", self.posted)))?;
            let at = layout.send_fifo(proto) + slot * layout.stride(proto);
            let flag = (self.posted + 1) as u32;
            if self.posted >= tail && !(proto == FN_PROTO_LL && ll_complete(&mut self.ll_seen, flag, blk, at, bytes)) {
                break;
            }
            // A full Simple step and the next as one message where both are ready (decided once:
            // a size word sent announces its bytes).
            let (bytes, steps) = match self.size_sent {
                Some(announced) => announced,
                None if self.unsent == 0 && self.posted + 1 < tail => pair(blk, layout, slot, proto, bytes),
                None => (bytes, 1),
            };
            if self.size_sent.is_none() && self.unsent > 0 && self.unsent + bytes > layout.slot_bytes {
                break;
            }
            fence(Ordering::Acquire);
            if layout.inline(proto, bytes, self.landing) {
                // One message from the slot: the data, then the word's line on the slot's next
                // line, which the kernel leaves alone (it writes the step's `bytes` only), with
                // this step's LL flag in each half ([`WORD_LINE`]).
                let len = Layout::inline_len(bytes);
                let (word_at, stamp) = (at + len - WORD_LINE, u64::from(flag) << 32);
                blk.store_u64(word_at, u64::from(word) | stamp);
                blk.store_u64(word_at + 8, stamp);
                let step = self.trace_steps(tail, (bytes, 1));
                // SAFETY: the kernel does not write this slot again before head passes the step,
                // which happens only once this send has completed.
                let Some(r) = (unsafe {
                    self.comm.isend_in(blk.ptr(at, len), len, TAG_SIZE, registered(&self.mr), step.as_ref())?
                }) else {
                    break;
                };
                self.taken(blk, size_at, r, proto, (bytes, 1));
                moved = true;
                continue;
            }
            let step = self.trace_steps(tail, (bytes, steps));
            if self.size_sent.is_none() {
                let out = SEND_WORDS + 4 * slot;
                blk.store_u32(out, Layout::encode(proto, bytes));
                // SAFETY: our copy of the word stays put until head passes this step, which
                // waits for the data send posted after this one.
                let Some(r) =
                    (unsafe { self.comm.isend_in(blk.ptr(out, 4), 4, TAG_SIZE, registered(&self.mr), step.as_ref())? })
                else {
                    break;
                };
                self.inflight.push_back((r, None));
                self.size_sent = Some((bytes, steps));
                moved = true;
            }
            // SAFETY: the kernel does not write this slot (or a pair's two) again before head
            // passes the step, which happens only once this send has completed.
            let Some(r) = (unsafe {
                self.comm.isend_in(blk.ptr(at, bytes), bytes, TAG_DATA, registered(&self.mr), step.as_ref())?
            }) else {
                break;
            };
            self.taken(blk, size_at, r, proto, (bytes, steps));
            moved = true;
        }
        while let Some((req, step)) = self.inflight.front() {
            if self.comm.test(req)?.is_none() {
                break;
            }
            if let Some((s, bytes)) = *step {
                self.done = s + 1;
                self.unsent -= bytes;
                fence(Ordering::Release);
                blk.store_u64(SEND_HEAD, self.done);
                if let Some(t) = &mut self.trace {
                    t.done(self.done);
                }
            }
            self.inflight.pop_front();
            moved = true;
        }
        Ok(moved)
    }

    /// Starts the profiler events of step `posted` (and the next, in a pair: `steps` 2) before
    /// the message that moves them is posted, so that a net plugin can start its own events under
    /// the first (returned), as NCCL's steps are its plugins' parents. A pair's bytes are counted
    /// half to each step.
    fn trace_steps(&mut self, tail: u64, (bytes, steps): (usize, u64)) -> Option<Parent> {
        let t = self.trace.as_mut()?;
        for s in 0..steps {
            t.step(self.posted + s, bytes / steps as usize, tail.saturating_sub(self.posted).max(1));
        }
        t.parent(self.posted)
    }

    /// Step `posted` (with the next in a pair: `steps` 2), of `proto`, is on its way as `r`, whose
    /// completion frees its slot.
    fn taken(&mut self, blk: &HostBlock, size_at: usize, r: Request, proto: u32, (bytes, steps): (usize, u64)) {
        for s in 0..steps {
            // The kernel fills an entry again only once head has passed its step.
            blk.store_u32(size_at + 4 * s as usize, SIZE_EMPTY);
        }
        self.inflight.push_back((r, Some((self.posted + steps - 1, bytes))));
        self.unsent += bytes;
        self.size_sent = None;
        self.ll_seen = 0;
        self.posted += steps;
        self.landing = Landing::after(proto);
    }

    pub(super) fn busy(&self, blk: &HostBlock) -> bool {
        let waiting = blk.load_u32(SEND_SIZES + 4 * (self.posted % NSTEPS) as usize) != SIZE_EMPTY;
        !self.inflight.is_empty() || self.posted < blk.load_u64(SEND_TAIL) || waiting
    }
}

/// The bytes of step `posted` at `slot` (`proto`, `bytes`) and the next together, where this one
/// is a full Simple slot, two of which fit a size word, and the next, already handed over (its
/// tail passed), is a Simple step of at least a byte in the FIFO's next slot: both then cross as
/// one message, as NCCL's proxy sends a slice of two steps (docs/NET.md, "Two Simple steps a
/// message"). Returns the message's bytes and steps.
fn pair(blk: &HostBlock, layout: &Layout, slot: usize, proto: u32, bytes: usize) -> (usize, u64) {
    let first = proto == FN_PROTO_SIMPLE && bytes == layout.slot_bytes && layout.pairs_fit();
    if !first || slot + 1 == NSTEPS as usize {
        return (bytes, 1);
    }
    match layout.decode(blk.load_u32(SEND_SIZES + 4 * (slot + 1))) {
        Ok((FN_PROTO_SIMPLE, next)) if next > 0 => (bytes + next, 2),
        _ => (bytes, 1),
    }
}

/// The host block's registration, which a half holds from its creation to its drop.
fn registered(mr: &Option<MemHandle>) -> &MemHandle {
    mr.as_ref().expect("registered while in the proxy")
}

/// Whether every line of an untailed LL step, `bytes` at `at`, carries its `flag` (step + 1 in
/// both halves, kernels/README.md); `seen` counts the lines already found so, not read again.
fn ll_complete(seen: &mut usize, flag: u32, blk: &HostBlock, at: usize, bytes: usize) -> bool {
    while *seen < bytes / 16 {
        let line = at + 16 * *seen;
        if blk.load_u32(line + 4) != flag || blk.load_u32(line + 12) != flag {
            return false;
        }
        *seen += 1;
    }
    true
}

impl Drop for SendSide {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            if let Err(e) = self.comm.dereg_mr(mr) {
                crate::nccl_warn!("NET: deregistering a send FIFO failed: {e}");
            }
        }
    }
}

/// What a receive in flight is for.
pub(super) enum Expect {
    /// The first message of this step (its size word, or the whole step), landing as said.
    Size(u64, Landing),
    /// The bytes of the steps up to this one: (last step, bytes), one step's or a pair's; for an
    /// LL step, the slot its lines move to from the LL landing.
    Data(u64, usize, Option<usize>),
}

/// The receiving half of a connection, as the proxy drives it.
pub(super) struct RecvSide {
    pub(super) comm: Box<dyn RecvComm>,
    pub(super) mr: Option<MemHandle>,
    /// Steps whose size word has been asked for.
    sized: u64,
    /// A size word's receive is in flight (its data's receive is posted after it lands).
    size_pending: bool,
    /// Where step `sized` lands, through a plugin (after the step before it).
    landing: Landing,
    /// A step whose size word arrived but whose data receive could not be posted yet:
    /// (step, protocol, bytes, steps: 2 for a pair).
    data_next: Option<(u64, u32, usize, u64)>,
    pub(super) inflight: VecDeque<(Request, Expect)>,
    /// The peer said goodbye: its communicator is closing, and its comm will close next. Shared
    /// with the connection's entry, whose send half answers it from another thread.
    pub(super) peer_closed: Arc<AtomicBool>,
    pub(super) trace: Option<Trace>,
}

impl RecvSide {
    /// A receive comm whose host block is registered as `mr`, nothing received yet.
    pub(super) fn new(comm: Box<dyn RecvComm>, mr: MemHandle, trace: Option<Trace>) -> RecvSide {
        RecvSide {
            comm,
            mr: Some(mr),
            sized: 0,
            size_pending: false,
            landing: Landing::default(),
            data_next: None,
            inflight: VecDeque::new(),
            peer_closed: Arc::default(),
            trace,
        }
    }

    /// Posts a receive into a slot; a step's data (its size word came first) goes under the
    /// step's profiler event, the receive of a size word (or of a whole small step) before the
    /// step is known, under none.
    fn post(&mut self, buf: *mut u8, size: usize, tag: i32, step: Option<u64>) -> Result<Option<Request>> {
        let parent = step.and_then(|s| self.trace.as_ref()?.parent(s));
        // SAFETY: buf..buf+size is a slot of the host block, which outlives the comm (the proxy
        // entry drops the comm first), and the kernel leaves it alone until tail passes it.
        unsafe { self.comm.irecv_in(&[RecvBuf { data: buf, size, tag }], &[registered(&self.mr)], parent.as_ref()) }
    }

    /// Posts what can be posted and lands at most one step a call; steps that arrived behind it
    /// wait for the next round, after every other connection's halves had their turn (a
    /// plugin's receive copies the bytes on this thread: docs/NET.md, "One step a turn").
    pub(super) fn progress(&mut self, blk: &HostBlock, layout: &Layout) -> Result<bool> {
        let (mut moved, mut turn_over) = (false, false);
        loop {
            if let Some((step, proto, bytes, steps)) = self.data_next {
                // A pair's second step lands in the next slot, once the kernel is done with it.
                if step + steps > blk.load_u64(RECV_HEAD) + NSTEPS {
                    return Ok(moved);
                }
                let slot = (step % NSTEPS) as usize;
                let at = layout.recv_fifo(proto) + slot * layout.stride(proto);
                let Some(r) = self.post(blk.ptr(layout.net_side(at), bytes), bytes, TAG_DATA, Some(step))? else {
                    return Ok(moved);
                };
                let ll = (proto == FN_PROTO_LL).then_some(at);
                self.inflight.push_back((r, Expect::Data(step + steps - 1, bytes, ll)));
                self.data_next = None;
                moved = true;
            }
            // The next step's slot is free once the kernel has consumed the step FN_NSTEPS before.
            if !self.size_pending && self.sized < blk.load_u64(RECV_HEAD) + NSTEPS {
                let (at, room) = layout.recv_first((self.sized % NSTEPS) as usize, self.landing);
                if let Some(r) = self.post(blk.ptr(at, room), room, TAG_SIZE, None)? {
                    self.inflight.push_back((r, Expect::Size(self.sized, self.landing)));
                    self.size_pending = true;
                    moved = true;
                }
            }
            let Some((req, what)) = self.inflight.front().filter(|_| !turn_over) else { return Ok(moved) };
            let Some(got) = self.comm.test(req)? else { return Ok(moved) };
            let got = got.first().copied().unwrap_or(0);
            match *what {
                Expect::Size(step, landing) => {
                    let slot = (step % NSTEPS) as usize;
                    let landed = layout.recv_first(slot, landing).0;
                    let whole = got != 4;
                    if whole && !(layout.one_message && got >= WORD_LINE && got % 16 == 0) {
                        return Err(Error::Remote(format!("step {step}: a size message of {got} bytes, expected 4")));
                    }
                    // A whole step's word is on the line after its data.
                    let word = blk.load_u32(if whole { landed + got - WORD_LINE } else { landed });
                    if word == GOODBYE && !whole {
                        self.inflight.pop_front();
                        self.peer_closed.store(true, Ordering::Release);
                        return Ok(true);
                    }
                    let (proto, bytes, steps) = layout
                        .decode_peer(word, slot)
                        .map_err(|e| Error::Remote(format!("step {step}: garbage: {e}")))?;
                    if let Some(t) = &mut self.trace {
                        for s in 0..steps {
                            t.step(step + s, bytes / steps as usize, 1);
                        }
                    }
                    self.size_pending = false;
                    self.sized += steps;
                    self.landing = Landing::after(proto);
                    if !whole {
                        self.data_next = Some((step, proto, bytes, steps));
                    } else if steps > 1 || got != Layout::inline_len(bytes) || !layout.inline(proto, bytes, landing) {
                        return Err(Error::Remote(format!(
                            "step {step}: a {got}-byte message whose size word announces {bytes} bytes"
                        )));
                    } else {
                        // An LL step in its LL slot is in place (`Layout::recv_first`).
                        let to = layout.recv_fifo(proto) + slot * layout.stride(proto);
                        if proto == FN_PROTO_LL && landing == Landing::Simple {
                            publish_ll(blk, landed, to, bytes);
                        } else if proto != landing.proto() {
                            let ll_flag = (landing == Landing::Ll).then_some((step + 1) as u32);
                            move_out(blk, landed, to, bytes, got, ll_flag);
                        }
                        self.landed(blk, step);
                        (moved, turn_over) = (true, true);
                        continue;
                    }
                }
                Expect::Data(step, bytes, ll) => {
                    if got != bytes {
                        return Err(Error::Remote(format!(
                            "step {step}: {got} bytes arrived where the size word announced {bytes}"
                        )));
                    }
                    if let Some(to) = ll {
                        publish_ll(blk, layout.net_side(to), to, bytes);
                    }
                    self.landed(blk, step);
                    (moved, turn_over) = (true, true);
                    continue;
                }
            }
            self.inflight.pop_front();
            moved = true;
        }
    }

    /// The data of the steps up to `step` is in their slots, from the receive at the front: the
    /// kernel may have them.
    fn landed(&mut self, blk: &HostBlock, step: u64) {
        self.inflight.pop_front();
        // The data is in place before the kernel sees the tail.
        fence(Ordering::Release);
        blk.store_u64(RECV_TAIL, step + 1);
        if let Some(t) = &mut self.trace {
            t.done(step + 1);
        }
    }

    pub(super) fn busy(&self) -> bool {
        self.data_next.is_some() || self.inflight.iter().any(|(_, e)| matches!(e, Expect::Data(..)))
    }
}

/// Moves a one-message step of Simple or LL128, `bytes`, from the slot it landed in (`from`: an
/// LL slot, or a Simple slot for an LL128 step) to its own slot (`to`), which its kernel reads
/// only once the tail has passed the step. Landed in an LL slot (`ll_flag`: the step's LL flag),
/// it then stamps the `got` bytes it wrote there with that flag and no data, as an LL step there
/// would have left them: the next LL step in that slot polls these lines for a flag FN_NSTEPS
/// later, so none takes them for its own. What it leaves in a Simple slot needs no care: a Simple
/// kernel reads a slot once the tail has passed the step whose bytes it reads there.
fn move_out(blk: &HostBlock, from: usize, to: usize, bytes: usize, got: usize, ll_flag: Option<u32>) {
    // SAFETY: both ranges are in the block (checked by `ptr`), the landing slot is the proxy's
    // until tail passes this step and the step's own slot is free until then; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(blk.ptr(from, bytes), blk.ptr(to, bytes), bytes) };
    if let Some(flag) = ll_flag {
        for half in (from..from + got).step_by(8) {
            blk.store_u64(half, u64::from(flag) << 32);
        }
    }
}

impl Drop for RecvSide {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            if let Err(e) = self.comm.dereg_mr(mr) {
                crate::nccl_warn!("NET: deregistering a receive FIFO failed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::FN_NSTEPS;
    use crate::abi::{FN_PROTO_LL128, FN_PROTO_SIMPLE, FN_SIZE_PROTO_SHIFT};
    use crate::transport::net::{PtrKind, SendComm};
    use parking_lot::Mutex;
    use std::sync::atomic::AtomicBool;
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::Arc;

    /// A receive comm whose peer has already sent `messages`: each receive takes the next one.
    /// `log` keeps every receive posted, (address, bytes).
    struct Arrived {
        messages: VecDeque<Vec<u8>>,
        posted: VecDeque<(*mut u8, usize)>,
        log: Arc<Mutex<Vec<(usize, usize)>>>,
    }

    fn arrived(messages: VecDeque<Vec<u8>>) -> Box<Arrived> {
        Box::new(Arrived { messages, posted: VecDeque::new(), log: Arc::default() })
    }

    // SAFETY: only the test's thread uses it.
    unsafe impl Send for Arrived {}

    impl RecvComm for Arrived {
        fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrKind) -> Result<MemHandle> {
            Ok(MemHandle(1))
        }
        fn dereg_mr(&mut self, _: MemHandle) -> Result<()> {
            Ok(())
        }
        unsafe fn irecv_in(
            &mut self,
            bufs: &[RecvBuf],
            _: &[&MemHandle],
            _: Option<&Parent>,
        ) -> Result<Option<Request>> {
            self.posted.push_back((bufs[0].data, bufs[0].size));
            self.log.lock().push((bufs[0].data as usize, bufs[0].size));
            Ok(Some(Request(self.posted.len())))
        }
        fn iflush(&mut self, _: &[RecvBuf], _: &[&MemHandle]) -> Result<Option<Request>> {
            Ok(None)
        }
        fn test(&mut self, _: &Request) -> Result<Option<Vec<usize>>> {
            let (Some(&(buf, room)), Some(m)) = (self.posted.front(), self.messages.front()) else { return Ok(None) };
            assert!(m.len() <= room, "a message longer than its receive");
            // SAFETY: the buffer was posted with `room` bytes, which the message fits.
            unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), buf, m.len()) };
            self.posted.pop_front();
            Ok(Some(vec![self.messages.pop_front().unwrap().len()]))
        }
    }

    /// A send comm that keeps every send in flight until the test says the net took them all,
    /// through `open`; records each message's bytes.
    struct Slow {
        posted: Arc<Mutex<Vec<usize>>>,
        open: Arc<AtomicBool>,
    }

    impl SendComm for Slow {
        fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrKind) -> Result<MemHandle> {
            Ok(MemHandle(1))
        }
        fn dereg_mr(&mut self, _: MemHandle) -> Result<()> {
            Ok(())
        }
        unsafe fn isend_in(
            &mut self,
            _: *const u8,
            size: usize,
            _: i32,
            _: &MemHandle,
            _: Option<&Parent>,
        ) -> Result<Option<Request>> {
            self.posted.lock().push(size);
            Ok(Some(Request(size)))
        }
        fn test(&mut self, req: &Request) -> Result<Option<usize>> {
            Ok(self.open.load(Relaxed).then_some(req.0))
        }
    }

    /// Steps the kernel handed over go to the net while less than a slot's bytes are posted and
    /// not yet sent, one step at least; the rest follow as sends complete.
    #[test]
    fn a_turn_posts_a_slot_of_bytes() {
        let layout = Layout { slot_bytes: 1 << 16, one_message: false };
        let blk = HostBlock::plain(layout.block_bytes()).unwrap();
        let bytes = 40 << 10;
        for slot in 0..FN_NSTEPS as usize {
            blk.store_u32(SEND_SIZES + 4 * slot, SIZE_EMPTY);
        }
        // Three Simple steps of 40 KiB each: two would be more than the 64 KiB slot.
        for step in 0..3 {
            blk.store_u32(SEND_SIZES + 4 * step, bytes as u32 | FN_PROTO_SIMPLE << FN_SIZE_PROTO_SHIFT);
        }
        blk.store_u64(SEND_TAIL, 3);
        let (posted, open) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let sum = |p: &Mutex<Vec<usize>>| p.lock().iter().sum::<usize>();
        let comm = Slow { posted: posted.clone(), open: open.clone() };
        let mut send = SendSide::new(Box::new(comm), MemHandle(1), None);
        assert!(send.progress(&blk, &layout).unwrap());
        assert_eq!(sum(&posted), 4 + bytes, "step 0's word and data, not step 1's");
        assert!(!send.progress(&blk, &layout).unwrap(), "nothing more while step 0 is in flight");
        open.store(true, Relaxed);
        let mut head = 0;
        for _ in 0..3 {
            send.progress(&blk, &layout).unwrap();
            head = blk.load_u64(SEND_HEAD);
        }
        assert_eq!((head, sum(&posted)), (3, 3 * (4 + bytes)), "every step went, in turn");
    }

    /// With several steps already arrived, a call lands one: the thread's other halves get their
    /// turn before the next, and the kernel still finds every step in order.
    #[test]
    fn a_turn_lands_one_step() {
        for one_message in [false, true] {
            let layout = Layout { slot_bytes: 1 << 16, one_message };
            let blk = HostBlock::plain(layout.block_bytes()).unwrap();
            let bytes = 4096usize;
            let word = (bytes as u32) | FN_PROTO_SIMPLE << FN_SIZE_PROTO_SHIFT;
            let mut messages = VecDeque::new();
            for s in 0..3u8 {
                let data = vec![s + 1; bytes];
                if layout.inline(FN_PROTO_SIMPLE, bytes, if s == 0 { Landing::Ll } else { Landing::Simple }) {
                    let mut line = vec![0u8; WORD_LINE];
                    line[..4].copy_from_slice(&word.to_ne_bytes());
                    messages.push_back([data, line].concat());
                } else {
                    messages.push_back(word.to_ne_bytes().to_vec());
                    messages.push_back(data);
                }
            }
            let mut recv = RecvSide::new(arrived(messages), MemHandle(1), None);
            for s in 0..3u64 {
                assert!(recv.progress(&blk, &layout).unwrap(), "step {s} moved");
                assert_eq!(blk.load_u64(RECV_TAIL), s + 1, "one step a call (one message: {one_message})");
                let at = layout.recv_fifo(FN_PROTO_SIMPLE) + (s as usize) * layout.stride(FN_PROTO_SIMPLE);
                // SAFETY: the slot is in the block, and nothing writes it now.
                let got = unsafe { std::slice::from_raw_parts(blk.ptr(at, bytes), bytes) };
                assert!(got.iter().all(|&b| b == s as u8 + 1), "step {s}'s bytes in its slot");
            }
            assert!(!recv.progress(&blk, &layout).unwrap(), "nothing more arrived");
        }
    }

    /// The kernel's side of a send step: its size word, and the tail for Simple.
    fn hand_over(blk: &HostBlock, step: u64, proto: u32, bytes: usize) {
        blk.store_u32(SEND_SIZES + 4 * (step % NSTEPS) as usize, Layout::encode(proto, bytes));
        blk.store_u64(SEND_TAIL, step + 1);
    }

    /// A full Simple step and the next, both handed over, go as one message from the two slots,
    /// unless the next is empty or not Simple, or the first fills the FIFO's last slot; and only
    /// with nothing else unsent, so that a pair never waits behind a step.
    #[test]
    fn full_simple_steps_go_in_pairs() {
        let layout = Layout { slot_bytes: 1 << 16, one_message: true };
        let blk = HostBlock::plain(layout.block_bytes()).unwrap();
        for slot in 0..FN_NSTEPS as usize {
            blk.store_u32(SEND_SIZES + 4 * slot, SIZE_EMPTY);
        }
        let full = layout.slot_bytes;
        let steps = [(0, full), (0, 1000), (0, full), (0, 0), (0, 100), (0, full), (0, full), (0, full)];
        for (s, &(_, bytes)) in steps.iter().enumerate() {
            hand_over(&blk, s as u64, FN_PROTO_SIMPLE, bytes);
        }
        let (posted, open) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(true)));
        let comm = Slow { posted: posted.clone(), open };
        let mut send = SendSide::new(Box::new(comm), MemHandle(1), None);
        for _ in 0..16 {
            send.progress(&blk, &layout).unwrap();
        }
        let inline = Layout::inline_len(0);
        let expect = [4, full + 1000, 4, full, inline, Layout::inline_len(100), 4, 2 * full, 4, full];
        assert_eq!(*posted.lock(), expect, "pairs (0, 1) and (5, 6); step 7 in the last slot alone");
        assert_eq!(blk.load_u64(SEND_HEAD), 8);
        // The FIFO's next round starts at slot 0 again: a pair.
        hand_over(&blk, 8, FN_PROTO_SIMPLE, full);
        hand_over(&blk, 9, FN_PROTO_SIMPLE, full);
        send.progress(&blk, &layout).unwrap();
        assert_eq!(posted.lock()[expect.len()..], [4, 2 * full]);
        assert_eq!((blk.load_u64(SEND_HEAD), blk.load_u32(SEND_SIZES + 4)), (10, SIZE_EMPTY), "both entries emptied");
    }

    /// A pair's size word, then its bytes: they land in the step's slot and the next, once the
    /// kernel has freed the next, and tail passes both at once.
    #[test]
    fn a_pair_lands_in_two_slots() {
        let layout = Layout { slot_bytes: 1 << 12, one_message: false };
        let blk = HostBlock::plain(layout.block_bytes()).unwrap();
        let full = layout.slot_bytes;
        let mut messages = VecDeque::new();
        for s in 0..8u8 {
            messages.push_back(Layout::encode(FN_PROTO_SIMPLE, 1).to_ne_bytes().to_vec());
            messages.push_back(vec![s]);
        }
        let pair: Vec<u8> = (0..full + 300).map(|i| (i % 251) as u8).collect();
        messages.push_back(Layout::encode(FN_PROTO_SIMPLE, pair.len()).to_ne_bytes().to_vec());
        messages.push_back(pair.clone());
        let mut recv = RecvSide::new(arrived(messages), MemHandle(1), None);
        blk.store_u64(RECV_HEAD, 1);
        for _ in 0..32 {
            recv.progress(&blk, &layout).unwrap();
        }
        assert_eq!(blk.load_u64(RECV_TAIL), 8, "steps 8 and 9 wait for slot 1");
        blk.store_u64(RECV_HEAD, 2);
        for _ in 0..4 {
            recv.progress(&blk, &layout).unwrap();
        }
        assert_eq!(blk.load_u64(RECV_TAIL), 10, "both steps at once");
        // SAFETY: slots 0 and 1 of the Simple FIFO, in the block; nothing else writes them now.
        let got =
            unsafe { std::slice::from_raw_parts(blk.ptr(layout.recv_fifo(FN_PROTO_SIMPLE), pair.len()), pair.len()) };
        assert!(got == pair, "the pair's bytes across slots 0 and 1");
    }

    /// A pair announced from the FIFO's last slot, or of more than two slots, fails the connection.
    #[test]
    fn a_pair_that_cannot_fit_is_refused() {
        let layout = Layout { slot_bytes: 1 << 12, one_message: false };
        for (before, bytes) in [(7u8, 2 * 4096), (0, 2 * 4096 + 1)] {
            let blk = HostBlock::plain(layout.block_bytes()).unwrap();
            let mut messages = VecDeque::new();
            for s in 0..before {
                messages.push_back(Layout::encode(FN_PROTO_SIMPLE, 1).to_ne_bytes().to_vec());
                messages.push_back(vec![s]);
            }
            messages.push_back(Layout::encode(FN_PROTO_SIMPLE, bytes).to_ne_bytes().to_vec());
            let mut recv = RecvSide::new(arrived(messages), MemHandle(1), None);
            let err = (0..64).find_map(|_| recv.progress(&blk, &layout).err()).expect("refused");
            assert!(err.to_string().contains("pair"), "{err}");
            assert_eq!(blk.load_u64(RECV_TAIL), u64::from(before), "nothing of it landed");
        }
    }

    /// Where LL steps reach the LL FIFO, which the kernel polls with no tail. The built-in net
    /// never stores there: its LL steps land in the LL landing and reach their slot through the
    /// proxy's stores, their lines and nothing past them. Through a plugin a one-message LL step
    /// lands in its slot, its word's line after it carrying its flag, as NCCL's do; one of
    /// another protocol that landed there leaves only lines of its flag and no data; an LL step
    /// of two messages (a whole slot) or after a Simple step still moves through the proxy. Other
    /// steps land in, or are copied to, their own slots.
    #[test]
    fn ll_steps_reach_their_slot_whole_or_in_place() {
        const POISON: u8 = 0xEE;
        for one_message in [false, true] {
            let layout = Layout { slot_bytes: 1 << 16, one_message };
            let blk = HostBlock::plain(layout.block_bytes()).unwrap();
            let ll_stride = layout.stride(FN_PROTO_LL);
            let fifo = layout.recv_fifo(FN_PROTO_LL);
            // SAFETY: the LL FIFO is in the block, and nothing else writes it now.
            unsafe { blk.ptr(fifo, NSTEPS as usize * ll_stride).write_bytes(POISON, NSTEPS as usize * ll_stride) };
            let steps = [
                (FN_PROTO_LL, 32),
                (FN_PROTO_LL, 1024),
                (FN_PROTO_SIMPLE, 4096),
                (FN_PROTO_LL, 4096),
                (FN_PROTO_LL128, 1024),
                (FN_PROTO_LL, ll_stride),
            ];
            let data = |s: usize, bytes: usize| -> Vec<u8> { (0..bytes).map(|i| (i * 7 + s * 31 + 1) as u8).collect() };
            let flag = |s: usize| ((s + 1) as u32).to_ne_bytes();
            let (mut messages, mut landing, mut shapes) = (VecDeque::new(), Landing::Ll, vec![]);
            for (s, &(proto, bytes)) in steps.iter().enumerate() {
                let word = Layout::encode(proto, bytes).to_ne_bytes();
                let inline = layout.inline(proto, bytes, landing);
                if inline {
                    // The sender's word line: the word, and the step's flag in both halves.
                    let line = [&word[..], &flag(s), &[0; 4], &flag(s)].concat();
                    messages.push_back([data(s, bytes), line].concat());
                } else {
                    messages.push_back(word.to_vec());
                    messages.push_back(data(s, bytes));
                }
                shapes.push((landing, inline));
                landing = Landing::after(proto);
            }
            assert!(!layout.inline(FN_PROTO_LL, ll_stride, Landing::Ll), "a whole LL slot comes in two messages");
            let comm = arrived(messages);
            let log = comm.log.clone();
            let mut recv = RecvSide::new(comm, MemHandle(1), None);
            for (s, &(proto, bytes)) in steps.iter().enumerate() {
                for _ in 0..4 {
                    if blk.load_u64(RECV_TAIL) <= s as u64 {
                        recv.progress(&blk, &layout).unwrap();
                    }
                }
                assert_eq!(blk.load_u64(RECV_TAIL), s as u64 + 1, "step {s} landed (one message: {one_message})");
                let stride = layout.stride(proto);
                // SAFETY: the step's slot is in the block, and nothing writes it now.
                let got = unsafe {
                    std::slice::from_raw_parts(blk.ptr(layout.recv_fifo(proto) + s * stride, stride), stride)
                };
                assert!(got[..bytes] == data(s, bytes), "step {s}'s bytes in its slot (one message: {one_message})");
                // SAFETY: as above.
                let ll_slot =
                    unsafe { std::slice::from_raw_parts(blk.ptr(fifo + s * ll_stride, ll_stride), ll_stride) };
                let (landed, inline) = shapes[s];
                let in_place = inline && landed == Landing::Ll;
                let past = match (proto == FN_PROTO_LL, in_place) {
                    (true, true) => {
                        let line = &ll_slot[bytes..bytes + WORD_LINE];
                        let word = Layout::encode(proto, bytes).to_ne_bytes();
                        assert!(line == [&word[..], &flag(s), &[0; 4], &flag(s)].concat(), "step {s}: its word's line");
                        bytes + WORD_LINE
                    }
                    (true, false) => bytes,
                    (false, true) => {
                        // Lines of this step's flag and no data, where the message landed.
                        let len = Layout::inline_len(bytes);
                        for (i, half) in ll_slot[..len].chunks(8).enumerate() {
                            assert!(half[..4] == [0; 4] && half[4..] == flag(s), "step {s}: LL slot, half {i}");
                        }
                        len
                    }
                    (false, false) => 0,
                };
                assert!(ll_slot[past..].iter().all(|&b| b == POISON), "step {s}: nothing else in its LL slot");
            }
            // The data of a step in two messages, and every step through the built-in net, lands
            // away from the LL FIFO; only a plugin's first message of a step lands in it.
            for &(at, len) in log.lock().iter() {
                let d = at.wrapping_sub(blk.ptr(fifo, 0) as usize);
                if d < NSTEPS as usize * ll_stride {
                    assert!(one_message && d % ll_stride == 0 && len == ll_stride, "a receive at {d} of the LL FIFO");
                }
            }
        }
    }
}
