//! The thread that serves a rank's listener for the life of its handle: it authenticates every
//! connection (the socket layer's acceptor) and files what arrives (a point-to-point message, a
//! ring or liveness link from the previous rank) for the rank's own threads.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::mailbox::Mailbox;
use super::{liveness, Me};
use crate::error::{Error, Result};
use crate::socket::acceptor::{Acceptor, Arrival, Wake};
use crate::socket::frame::FrameStream;
use crate::socket::wire::{LinkKind, Msg, MAX_DATA_BODY};

/// What this rank's listener thread has received for the rank's own threads.
#[derive(Default)]
pub(super) struct Inbox {
    pub(super) mailbox: Mailbox,
    /// The links from the previous rank, until init takes them: the ring link and the liveness
    /// link (indexed by [`prev_slot`]).
    pub(super) prev_links: [Option<FrameStream>; 2],
    /// Init took them: any later one is unexpected.
    pub(super) prev_taken: bool,
    /// The first rank the liveness watcher found lost: receives from it fail at once.
    pub(super) lost: Option<liveness::Lost>,
}

/// Where [`Inbox::prev_links`] keeps a link of this kind.
pub(super) fn prev_slot(kind: LinkKind) -> usize {
    usize::from(kind == LinkKind::Liveness)
}

/// The inbox and the condition variable its readers wait on.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) inbox: Mutex<Inbox>,
    pub(super) arrived: Condvar,
}

/// The thread that serves this rank's listener for the life of the handle: it authenticates
/// every connection and files what arrives, so that a peer's send or ring link never waits for
/// this rank to be inside a bootstrap call (sends are fire-and-forget, as in NCCL).
pub(super) struct Listener {
    /// Closing this end tells the thread to exit.
    stop: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    pub(super) fn spawn(acceptor: Acceptor, me: Me, shared: Arc<Shared>, timeout: Duration) -> Result<Listener> {
        let (stop, stopped) = UnixStream::pair()?;
        let thread = std::thread::Builder::new()
            .name(format!("nccl-bootstrap-r{}", me.rank))
            .spawn(move || serve(acceptor, me, &shared, &stopped, timeout))
            .map_err(|e| Error::System(format!("bootstrap: could not start the listener thread: {e}")))?;
        Ok(Listener { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            // The thread wakes on the closed pair at once; it only lingers while it finishes
            // reading one message, bounded by the bootstrap timeout.
            let _ = t.join();
        }
    }
}

/// The listener thread's loop: until the handle is dropped.
fn serve(mut acceptor: Acceptor, me: Me, shared: &Shared, stopped: &UnixStream, timeout: Duration) {
    loop {
        match acceptor.next(None, &String::new, &[stopped]) {
            Ok(Some(Wake::Arrival(a))) => admit(me, shared, *a, timeout),
            Ok(_) => return,
            Err(e) => {
                crate::nccl_warn_unrecorded!("Bootstrap rank {}: the listener stops: {e}", me.rank);
                return;
            }
        }
    }
}

/// Files an authenticated connection on a rank's listener: a p2p message goes to the mailbox,
/// the ring link from the previous rank to init, anything else (unknown rank, wrong kind, a
/// second ring link) is dropped and logged. Strangers never get this far: they fail the
/// handshake in [`crate::socket::handshake`].
fn admit(me: Me, shared: &Shared, a: Arrival, timeout: Duration) {
    let Arrival { mut conn, from: addr, msg } = a;
    let here = me.rank;
    match msg {
        Msg::Hello { from, link: link @ (LinkKind::Ring | LinkKind::Liveness) } if from as usize == me.prev() => {
            let mut inbox = shared.inbox.lock();
            let slot = prev_slot(link);
            match inbox.prev_taken || inbox.prev_links[slot].is_some() {
                true => crate::nccl_warn_unrecorded!(
                    "Bootstrap rank {here}: dropped a second {link:?} link from rank {from} ({addr})"
                ),
                false => inbox.prev_links[slot] = Some(conn),
            }
            shared.arrived.notify_all();
        }
        Msg::Hello { from, link: LinkKind::P2p } if (from as usize) < me.nranks => {
            match conn.recv(MAX_DATA_BODY, Instant::now() + timeout) {
                Ok(Msg::Data { tag, seq, payload }) => {
                    if !shared.inbox.lock().mailbox.push(from as usize, tag, seq, payload) {
                        crate::nccl_warn_unrecorded!(
                            "Bootstrap rank {here}: dropped a repeated message #{seq} from rank {from} with tag {tag}"
                        );
                    }
                    shared.arrived.notify_all();
                }
                Ok(other) => crate::nccl_warn_unrecorded!(
                    "Bootstrap rank {here}: rank {from} sent {} instead of data",
                    other.kind_name()
                ),
                Err(e) => {
                    crate::nccl_warn_unrecorded!("Bootstrap rank {here}: lost a message from rank {from} ({addr}): {e}")
                }
            }
        }
        Msg::Hello { from, link } => crate::nccl_warn_unrecorded!(
            "Bootstrap rank {here}: dropped a {link:?} link from {addr} claiming rank {from} of {}",
            me.nranks
        ),
        other => crate::nccl_warn_unrecorded!(
            "Bootstrap rank {here}: dropped a connection from {addr} that opened with {}",
            other.kind_name()
        ),
    }
}
