//! Dead-peer detection for a communicator's whole life.
//!
//! At init every rank opens one extra link to its ring successor (`LinkKind::Liveness`), so each
//! rank holds one to each ring neighbour. [`Watcher`] owns them on a thread of its own that sends
//! a heartbeat on both every [`HEARTBEAT_EVERY`] and reads whatever comes back:
//! - the link closing without a goodbye (the process died: the kernel closes its sockets) means
//!   that neighbour is lost, noticed at once on any host;
//! - no heartbeat for the heartbeat timeout (a host that vanished, a network that dropped) means
//!   the same, noticed within that timeout;
//! - a [`TAG_LOST`] frame carries news of a rank lost further round the ring.
//!
//! The first loss is reported once through the callback, forwarded to the other neighbour, and
//! the watcher stops; closing its links then passes the news on round the ring, so every survivor
//! learns which rank was lost, not just that its neighbour left. A rank that destroys its
//! communicator sends [`TAG_BYE`] first, and so does a process that exits with its communicators
//! alive (crate::exit runs [`Watcher`]s' farewell), so an orderly exit is never taken for a
//! death; the neighbours pass [`TAG_LEFT`] on round the ring, so that every rank can refuse
//! later operations that need the rank that left ([`Observer::left`]). The goodbye counts the
//! collectives the rank took part in, when all of them finished ([`Observer::taken_part`]), so
//! that the others still run those from the data it sent.
//!
//! The same links carry hang reports: a [`TAG_REPORT`] token started by one rank goes round the
//! ring, each rank appending its state line ([`Observer::state`]), and comes back to its origin,
//! which gets every line ([`Observer::report`]). A rank starts one when its communicator asks
//! ([`Watcher::request_report`]: the device watchdog fired) or, if it watches the file named by
//! `FERRONICKEL_HANG_REPORT_FILE`, when that file is touched.
//!
//! Frames are bootstrap `Data` frames from a peer that authenticated at init (`auth`); their
//! bodies are still bounded ([`MAX_BODY`]) and their text cut before it is logged.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::error::{Error, Result};
use crate::socket::frame::{self, FrameStream, NetError};
use crate::socket::wire::{self, Msg};

/// How often each rank tells its neighbours it is alive.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// A heartbeat this late is worth a warning (a slow network or a stalled peer, not a lost one).
const LATE: Duration = Duration::from_secs(2);

crate::int_param!(
    /// FERRONICKEL_HEARTBEAT_TIMEOUT_MS: a neighbour silent this long is taken for lost (0: only a
    /// closed connection counts). Heartbeats come from a thread of their own, so a busy or
    /// time-sliced process still sends them; a process stopped in a debugger does not.
    heartbeat_timeout_ms, "FERRONICKEL_HEARTBEAT_TIMEOUT_MS", 5000
);

/// Frame tags on a liveness link.
pub const TAG_HEARTBEAT: u32 = 1;
/// The sender is leaving on purpose (ncclCommDestroy): stop watching it. Payload: empty, or how
/// many collectives it took part in (u64 little-endian; [`Observer::taken_part`]).
pub const TAG_BYE: u32 = 2;
/// Payload: the lost rank (u32 little-endian), then UTF-8 text saying how it was noticed.
pub const TAG_LOST: u32 = 3;
/// Payload: the origin rank (u32 little-endian), then one state line per rank so far, '\n'-separated.
pub const TAG_REPORT: u32 = 4;
/// Payload: a rank that left in order (u32 little-endian), then what its goodbye said it took part
/// in (u64 little-endian, when it said), passed on round the ring.
pub const TAG_LEFT: u32 = 5;
/// Largest report payload; a longer one stops growing (lines are dropped, and say so).
const MAX_REPORT: usize = 1 << 20;
/// Longest state line a rank adds.
const MAX_LINE: usize = 512;
/// Largest liveness frame body accepted (the data header, then a report).
pub const MAX_BODY: usize = MAX_REPORT + 64;

crate::str_param!(
    /// FERRONICKEL_HANG_REPORT_FILE: touching this file asks for a hang report of every
    /// communicator whose watcher watches it (the lowest rank of each host does).
    hang_report_file, "FERRONICKEL_HANG_REPORT_FILE"
);

/// What the watcher needs from the communicator it serves; called from the watcher thread.
pub trait Observer: Send + 'static {
    /// How messages name a rank: "rank 3 (host h, pid 7)".
    fn describe(&self, rank: usize) -> String;
    /// The first rank lost anywhere in the ring; called at most once.
    fn lost(&self, lost: Lost);
    /// A rank that left in order (destroyed its communicator, or its process exited with it
    /// alive); called once per rank, with the collectives it took part in when its goodbye said.
    /// Not an error: only later operations that need it are.
    fn left(&self, rank: usize, colls: Option<u64>);
    /// How many collectives this rank took part in, all finished, for its goodbye: peers may
    /// still run the ones it took part in from the data it sent. `None` (the default) while any
    /// is in flight or unknown: peers then refuse every later collective that needs it.
    fn taken_part(&self) -> Option<u64> {
        None
    }
    /// This rank's line in a hang report (one line, at most 512 bytes are kept).
    fn state(&self) -> String;
    /// Every rank's line of a report this rank started, in ring order from this rank.
    fn report(&self, lines: Vec<String>);
}

/// Wake-up bytes on the watcher's socket pair.
const WAKE_STOP: u8 = 1;
const WAKE_REPORT: u8 = 2;
/// Longest text carried in a [`TAG_LOST`] frame.
const MAX_TEXT: usize = 1024;

/// A rank found lost, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    pub rank: usize,
    pub text: String,
}

/// The watcher's view of one neighbour link.
struct Side {
    link: FrameStream,
    /// The rank at the other end.
    peer: usize,
    heard: Instant,
    /// Closed after a goodbye: nothing more to watch here.
    done: bool,
}

/// The thread that watches both neighbour links; dropping it says goodbye and stops it.
pub struct Watcher {
    wake: UnixStream,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Our entry in [`LIVE`].
    id: u64,
}

/// The watchers running in this process, for the farewell at exit: (id, a handle on the wake-up
/// socket, whether the thread has ended).
static LIVE: parking_lot::Mutex<Vec<(u64, UnixStream, Arc<AtomicBool>)>> = parking_lot::Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// How long the farewell at exit waits for the watchers' goodbyes to go out.
const FAREWELL_WITHIN: Duration = Duration::from_millis(300);

/// At exit with communicators alive (crate::exit): every watcher says goodbye to its neighbours
/// and ends, as it does when its communicator is destroyed; nothing else is touched.
fn farewell() {
    let live: Vec<Arc<AtomicBool>> = LIVE
        .lock()
        .iter()
        .map(|(_, wake, done)| {
            let _ = (&*wake).write(&[WAKE_STOP]);
            done.clone()
        })
        .collect();
    let end = Instant::now() + FAREWELL_WITHIN;
    while Instant::now() < end && !live.iter().all(|d| d.load(Ordering::Acquire)) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Watcher {
    /// Starts watching for `observer`. `watch_file`: this watcher starts a report when the file
    /// named by `FERRONICKEL_HANG_REPORT_FILE` is touched (give it to one rank per host).
    pub fn start(
        me: usize,
        nranks: usize,
        links: (FrameStream, FrameStream),
        observer: impl Observer,
        watch_file: bool,
    ) -> Result<Watcher> {
        let (wake, asleep) = UnixStream::pair()?;
        asleep.set_nonblocking(true)?;
        let now = Instant::now();
        let (next, prev) = ((me + 1) % nranks, (me + nranks - 1) % nranks);
        let sides = [
            Side { link: links.0, peer: next, heard: now, done: false },
            Side { link: links.1, peer: prev, heard: now, done: false },
        ];
        let timeout = Duration::from_millis(heartbeat_timeout_ms().max(0) as u64);
        let file = hang_report_file().filter(|_| watch_file).map(|f| (PathBuf::from(f), mtime(f)));
        let done = Arc::new(AtomicBool::new(false));
        let ended = done.clone();
        let thread = std::thread::Builder::new()
            .name("nccl-liveness".into())
            .spawn(move || {
                watch(me, sides, asleep, timeout, file, observer);
                ended.store(true, Ordering::Release);
            })
            .map_err(|e| Error::System(format!("liveness: cannot start the watcher thread: {e}")))?;
        crate::exit::on_exit(farewell);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LIVE.lock().push((id, wake.try_clone()?, done));
        Ok(Watcher { wake, thread: Some(thread), id })
    }

    /// Starts a hang report from this rank (the summary comes to [`Observer::report`]).
    pub fn request_report(&self) {
        let _ = (&self.wake).write(&[WAKE_REPORT]);
    }
}

/// When `path` was last modified (None if it does not exist).
fn mtime(path: impl AsRef<std::path::Path>) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Drop for Watcher {
    fn drop(&mut self) {
        LIVE.lock().retain(|(id, _, _)| *id != self.id);
        // The byte (or the close) wakes the thread, which says goodbye on its links and exits.
        let _ = (&self.wake).write(&[WAKE_STOP]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What one look at a link found.
enum Seen {
    Quiet,
    /// A hang report token (its payload).
    Report(Vec<u8>),
    Lost(Lost),
    /// A rank that left in order: the neighbour's goodbye, or news of one from further away, with
    /// the collectives it took part in when it said.
    Left(usize, Option<u64>),
}

fn watch(
    me: usize,
    mut sides: [Side; 2],
    mut asleep: UnixStream,
    timeout: Duration,
    mut file: Option<(PathBuf, Option<SystemTime>)>,
    observer: impl Observer,
) {
    let heartbeat = wire::encode_data(TAG_HEARTBEAT, 0, &[]);
    let mut next_beat = Instant::now();
    let mut left = std::collections::BTreeSet::new();
    loop {
        let now = Instant::now();
        // A peer that refused a heartbeat: lost, unless what it sent before says otherwise (read
        // below): a peer that said goodbye and then exited refuses heartbeats too.
        let mut refused = None;
        if now >= next_beat {
            // A full socket buffer means the peer has not read for a very long time.
            refused = sides.iter_mut().filter(|s| !s.done).find_map(|s| {
                let e = s.link.send_bytes(&heartbeat, now + HEARTBEAT_EVERY).err()?;
                let text = format!("{} stopped taking heartbeats from rank {me} ({e})", observer.describe(s.peer));
                Some(Lost { rank: s.peer, text })
            });
            if let Some((path, seen)) = &mut file {
                let m = mtime(&*path);
                if m.is_some() && m != *seen {
                    *seen = m;
                    start_report(me, &mut sides[0], &observer);
                }
            }
            next_beat = now + HEARTBEAT_EVERY;
        }
        let mut fds = vec![frame::pollfd(&asleep, libc::POLLIN)];
        fds.extend(sides.iter().map(|s| frame::pollfd(&s.link, if s.done { 0 } else { libc::POLLIN })));
        let wait = if refused.is_some() { Duration::ZERO } else { next_beat.saturating_duration_since(Instant::now()) };
        if let Err(e) = frame::poll(&mut fds, Some(wait)) {
            crate::nccl_warn!("Liveness watcher of rank {me} stops: poll failed: {e}");
            return;
        }
        if fds[0].revents != 0 {
            let mut wake = [0u8; 16];
            let n = asleep.read(&mut wake).unwrap_or(0);
            if n == 0 || wake[..n].contains(&WAKE_STOP) {
                let taken = observer.taken_part().map(u64::to_le_bytes);
                let bye = wire::encode_data(TAG_BYE, 0, taken.as_ref().map_or(&[][..], |t| &t[..]));
                for s in sides.iter_mut().filter(|s| !s.done) {
                    let _ = s.link.send_bytes(&bye, Instant::now() + Duration::from_millis(100));
                }
                return;
            }
            start_report(me, &mut sides[0], &observer);
        }
        for i in 0..2 {
            match look(me, &mut sides[i], timeout, &observer) {
                Seen::Quiet => {}
                Seen::Report(payload) => pass_report(me, &mut sides[0], payload, &observer),
                Seen::Lost(lost) => return report_loss(me, &mut sides, lost, &observer),
                Seen::Left(rank, colls) if rank != me && left.insert(rank) => {
                    observer.left(rank, colls);
                    let news = wire::encode_data(TAG_LEFT, 0, &encode_left(rank, colls));
                    for s in sides.iter_mut().filter(|s| !s.done && s.peer != rank) {
                        let _ = s.link.send_bytes(&news, Instant::now() + HEARTBEAT_EVERY);
                    }
                }
                Seen::Left(..) => {}
            }
        }
        if let Some(lost) = refused.filter(|l| sides.iter().any(|s| s.peer == l.rank && !s.done)) {
            return report_loss(me, &mut sides, lost, &observer);
        }
        if sides.iter().all(|s| s.done) {
            return;
        }
    }
}

/// This rank's state line, one line and bounded.
fn state_line(observer: &impl Observer) -> String {
    let mut line = observer.state().replace('\n', " ");
    let mut end = line.len().min(MAX_LINE);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line.truncate(end);
    line
}

/// Sends a new report token, holding this rank's line, to the next rank.
fn start_report(me: usize, next: &mut Side, observer: &impl Observer) {
    let mut payload = (me as u32).to_le_bytes().to_vec();
    payload.extend_from_slice(state_line(observer).as_bytes());
    if next.done
        || next.link.send_bytes(&wire::encode_data(TAG_REPORT, 0, &payload), Instant::now() + HEARTBEAT_EVERY).is_err()
    {
        observer.report(vec![state_line(observer)]);
    }
}

/// A report token from the previous rank: ours come home, others get our line and go on.
fn pass_report(me: usize, next: &mut Side, mut payload: Vec<u8>, observer: &impl Observer) {
    let Some((origin, lines)) = payload.split_first_chunk::<4>() else { return };
    if u32::from_le_bytes(*origin) as usize == me {
        observer.report(String::from_utf8_lossy(lines).lines().map(String::from).collect());
        return;
    }
    let line = state_line(observer);
    if payload.len() + 1 + line.len() <= MAX_REPORT {
        payload.push(b'\n');
        payload.extend_from_slice(line.as_bytes());
    }
    if !next.done {
        let _ = next.link.send_bytes(&wire::encode_data(TAG_REPORT, 0, &payload), Instant::now() + HEARTBEAT_EVERY);
    }
}

/// Reads what one link has for us and checks its silence.
fn look(me: usize, s: &mut Side, timeout: Duration, observer: &impl Observer) -> Seen {
    if s.done {
        return Seen::Quiet;
    }
    loop {
        match s.link.try_recv(MAX_BODY) {
            Ok(None) => break,
            Ok(Some(Msg::Data { tag: TAG_HEARTBEAT, .. })) => {
                let gap = s.heard.elapsed();
                if gap > LATE {
                    crate::nccl_warn!(
                        "Liveness: rank {me} heard from {} after {:.1} s of silence: the network to it is slow or \
                         was down for a while, or its process stalled; not lost (FERRONICKEL_HEARTBEAT_TIMEOUT_MS={})",
                        observer.describe(s.peer),
                        gap.as_secs_f64(),
                        timeout.as_millis()
                    );
                }
                s.heard = Instant::now();
            }
            Ok(Some(Msg::Data { tag: TAG_BYE, payload, .. })) => {
                crate::nccl_info!(
                    crate::debug::Subsys::BOOTSTRAP,
                    "Liveness: {} left the communicator (destroyed it, or its process ended); rank {me} stops watching it",
                    observer.describe(s.peer)
                );
                s.done = true;
                return Seen::Left(s.peer, decode_count(&payload));
            }
            Ok(Some(Msg::Data { tag: TAG_LEFT, payload, .. })) => match decode_left(&payload) {
                Some((rank, colls)) => return Seen::Left(rank, colls),
                None => {
                    let text = format!("{} sent a malformed liveness frame", observer.describe(s.peer));
                    return Seen::Lost(Lost { rank: s.peer, text });
                }
            },
            Ok(Some(Msg::Data { tag: TAG_REPORT, payload, .. })) => return Seen::Report(payload),
            Ok(Some(Msg::Data { tag: TAG_LOST, payload, .. })) => match decode_lost(&payload) {
                Some(lost) if lost.text.contains("(reported by ") => return Seen::Lost(lost),
                Some(lost) => {
                    let text = format!("{} (reported by {})", lost.text, observer.describe(s.peer));
                    return Seen::Lost(Lost { rank: lost.rank, text });
                }
                None => {
                    let text = format!("{} sent a malformed liveness frame", observer.describe(s.peer));
                    return Seen::Lost(Lost { rank: s.peer, text });
                }
            },
            Ok(Some(other)) => {
                let text =
                    format!("{} sent a {} frame on its liveness link", observer.describe(s.peer), other.kind_name());
                return Seen::Lost(Lost { rank: s.peer, text });
            }
            // A killed process's sockets close, or reset when unread data was left in them.
            Err(NetError::Closed) => return dead(me, s, observer),
            Err(NetError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => return dead(me, s, observer),
            Err(NetError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                let text = format!(
                    "{}: its host reset its liveness link to rank {me} without a goodbye (its process was killed with \
                     data unread, its sockets were destroyed, or the connection was reset on the way)",
                    observer.describe(s.peer)
                );
                return Seen::Lost(Lost { rank: s.peer, text });
            }
            Err(NetError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionAborted => {
                let text = format!(
                    "{}: its liveness link to rank {me} was aborted on rank {me}'s host ({e}): the connection was \
                     destroyed here, not by the peer",
                    observer.describe(s.peer)
                );
                return Seen::Lost(Lost { rank: s.peer, text });
            }
            Err(e) => {
                let text = format!("{}: its liveness link to rank {me} failed ({e})", observer.describe(s.peer));
                return Seen::Lost(Lost { rank: s.peer, text });
            }
        }
    }
    let silent = s.heard.elapsed();
    if !timeout.is_zero() && silent > timeout {
        let text = format!(
            "{} sent no heartbeat to rank {me} for {:.1} s (FERRONICKEL_HEARTBEAT_TIMEOUT_MS={}): {}",
            observer.describe(s.peer),
            silent.as_secs_f64(),
            timeout.as_millis(),
            why_silent(&s.link, timeout)
        );
        return Seen::Lost(Lost { rank: s.peer, text });
    }
    Seen::Quiet
}

/// `tcpi_state` of a closed connection (Linux's TCP_CLOSE; libc does not export it).
const TCP_CLOSE: u8 = 7;

/// What the kernel knows of a link's TCP connection.
fn tcp_info(link: &FrameStream) -> Option<libc::tcp_info> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero tcp_info is a valid out-buffer; len says how much of it there is.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let at = (&mut info as *mut libc::tcp_info).cast();
    // SAFETY: the descriptor is the link's open socket; info and len are valid for writes.
    let rc = unsafe { libc::getsockopt(link.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, at, &mut len) };
    (rc == 0).then_some(info)
}

/// Why a link's peer is silent, from what TCP knows of it: a dead network (or host) leaves our
/// heartbeats unacknowledged; a live network with a stopped or starved process acknowledges
/// them (its kernel does) while the process sends nothing.
fn why_silent(link: &FrameStream, timeout: Duration) -> String {
    let Some(info) = tcp_info(link) else { return "its host or the network is gone".into() };
    // We send a heartbeat every second: a live host's kernel acknowledges each within a round
    // trip. (Packets that could not even leave this host are neither in flight nor acknowledged.)
    // A dead link has been deaf about as long as it has been silent (more than `timeout`).
    let deaf = Duration::from_millis(info.tcpi_last_ack_recv.into()) > (timeout / 2).max(HEARTBEAT_EVERY * 3 / 2);
    if info.tcpi_unacked > 0 || deaf {
        format!(
            "its host has acknowledged nothing for {:.1} s ({} packets unacknowledged, {} retransmissions): the network \
             to it is down, or the host is gone",
            info.tcpi_last_ack_recv as f64 / 1000.0,
            info.tcpi_unacked,
            info.tcpi_total_retrans
        )
    } else {
        format!(
            "its host still acknowledges our heartbeats (last {:.1} s ago), so the network is up: its process is stopped \
             or starved",
            info.tcpi_last_ack_recv as f64 / 1000.0
        )
    }
}

/// The peer at the other end of `s` is gone: its process exited or was killed (its kernel
/// closed the link: our side waits to close). A link already closed on our side as well was
/// reset: either after that close (a heartbeat we sent to the dead process drew the reset, which
/// a busy host makes likely) or by itself (the error that said so was taken by an earlier call).
fn dead(me: usize, s: &Side, observer: &impl Observer) -> Seen {
    if tcp_info(&s.link).is_some_and(|i| i.tcpi_state == TCP_CLOSE) {
        let text = format!(
            "{}: its liveness link to rank {me} closed without a goodbye and is reset now: its process exited or \
             was killed (a heartbeat sent after that drew the reset), or the connection was reset on the way",
            observer.describe(s.peer)
        );
        return Seen::Lost(Lost { rank: s.peer, text });
    }
    let text = format!(
        "{} exited or was killed: its connection to rank {me} closed without a goodbye",
        observer.describe(s.peer)
    );
    Seen::Lost(Lost { rank: s.peer, text })
}

/// Reports a loss, passes it to the neighbours still watched, and lets the links close. Once
/// this process has begun to exit, peers closing are no news: the watcher just stops.
fn report_loss(me: usize, sides: &mut [Side; 2], lost: Lost, observer: &impl Observer) {
    if crate::exit::begun() {
        return;
    }
    crate::nccl_warn!("Rank {me}: lost {}", lost.text);
    let frame = wire::encode_data(TAG_LOST, 0, &encode_lost(&lost));
    for s in sides.iter_mut().filter(|s| !s.done && s.peer != lost.rank) {
        let _ = s.link.send_bytes(&frame, Instant::now() + Duration::from_millis(200));
    }
    observer.lost(lost);
}

pub fn encode_lost(lost: &Lost) -> Vec<u8> {
    let mut end = lost.text.len().min(MAX_TEXT);
    while !lost.text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = (lost.rank as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&lost.text.as_bytes()[..end]);
    out
}

pub fn decode_lost(payload: &[u8]) -> Option<Lost> {
    let (rank, text) = payload.split_first_chunk::<4>()?;
    let text = String::from_utf8_lossy(text);
    let text: String = text.chars().take(MAX_TEXT).collect();
    Some(Lost { rank: u32::from_le_bytes(*rank) as usize, text })
}

/// A [`TAG_LEFT`] payload: the rank, then its goodbye's count when it said one.
fn encode_left(rank: usize, colls: Option<u64>) -> Vec<u8> {
    let mut out = (rank as u32).to_le_bytes().to_vec();
    out.extend(colls.map(u64::to_le_bytes).into_iter().flatten());
    out
}

/// A peer's [`TAG_LEFT`] payload (untrusted): `None` without a whole rank; a count that is not
/// whole is no count, so the others stay strict about that rank.
fn decode_left(payload: &[u8]) -> Option<(usize, Option<u64>)> {
    let (rank, rest) = payload.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*rank) as usize, decode_count(rest)))
}

/// The count of collectives at the start of a [`TAG_BYE`] payload, or of a [`TAG_LEFT`] one's rest.
fn decode_count(bytes: &[u8]) -> Option<u64> {
    bytes.first_chunk::<8>().map(|c| u64::from_le_bytes(*c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_frames_carry_the_count_or_none() {
        assert_eq!(decode_left(&encode_left(3, Some(41))), Some((3, Some(41))));
        assert_eq!(decode_left(&encode_left(3, None)), Some((3, None)));
        assert_eq!(decode_left(&[1, 0, 0]), None, "no whole rank");
        assert_eq!(decode_left(&[1, 0, 0, 0, 9, 9, 9]), Some((1, None)), "a cut count is no count");
        assert_eq!(decode_count(&[]), None);
        assert_eq!(decode_count(&7u64.to_le_bytes()), Some(7));
    }

    #[test]
    fn lost_frames_round_trip_and_are_bounded() {
        let l = Lost { rank: 7, text: "rank 7 (host h, pid 9) exited".into() };
        assert_eq!(decode_lost(&encode_lost(&l)), Some(l));
        let long = Lost { rank: 1, text: "é".repeat(4000) };
        let enc = encode_lost(&long);
        assert!(enc.len() <= 4 + MAX_TEXT, "{}", enc.len());
        assert!(decode_lost(&enc).unwrap().text.chars().all(|c| c == 'é'));
        assert_eq!(decode_lost(&[1, 2]), None);
        let junk = decode_lost(&[2, 0, 0, 0, 0xff, 0xfe]).unwrap();
        assert_eq!(junk.rank, 2);
    }
}
