//! Group semantics: `ncclGroupStart`/`ncclGroupEnd` nest per thread; operations issued inside
//! are queued and launched together at the outermost end. A call outside any group is an
//! implicit group of one. An error inside a group is returned by that call, and again by the
//! `ncclGroupEnd` that closes the group, which then launches nothing.
//!
//! A communicator init inside a group (`ncclCommInitRank` and its variants, `ncclCommSplit`,
//! `ncclCommShrink`) is deferred to the outermost end too, as in NCCL: that is how one thread
//! initializes several ranks of one communicator (one per GPU), whose rendezvous needs them all
//! at once. The end runs every deferred init on a thread of its own, waits for the blocking
//! ones, and only then launches what was queued.

use crate::comm::{launch, Comm};
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// One queued operation of this library: on a live communicator.
pub type Queued = crate::task::Queued<Arc<Comm>>;

/// A communicator init deferred to the outermost group end: it makes the communicator and
/// settles its handle's phase, and says how that went.
pub type DeferredInit = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct GroupState {
    depth: usize,
    queued: Vec<Queued>,
    error: Option<Error>,
    /// Deferred inits, each with whether its config is blocking.
    inits: Vec<(DeferredInit, bool)>,
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

/// This thread's group state; an error, not a panic, once the thread (or the process, in a
/// static destructor) is past destroying its thread-locals.
fn with_group<R>(f: impl FnOnce(&mut GroupState) -> R) -> Result<R> {
    GROUP.try_with(|g| f(&mut g.borrow_mut())).map_err(|_| {
        Error::InvalidUsage("the calling thread is exiting: its group state is gone, so it can issue nothing".into())
    })
}

pub fn start() -> Result<()> {
    with_group(|g| g.depth += 1)
}

/// Whether this thread has a group open: a communicator init then waits for its end
/// ([`defer_init`]).
pub fn open() -> Result<bool> {
    with_group(|g| g.depth > 0)
}

/// Defers a communicator init to the outermost end of this thread's open group.
pub fn defer_init(init: DeferredInit, blocking: bool) -> Result<()> {
    with_group(|g| g.inits.push((init, blocking)))
}

/// What the outermost end of a group found: whether a nonblocking communicator init it started
/// is still running (`ncclGroupEnd` then returns `ncclInProgress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Done,
    InitInProgress,
}

/// Closes one level; at the outermost level runs the deferred inits, then launches everything
/// queued (or reports the error that happened inside the group).
pub fn end() -> Result<Ended> {
    let (queued, error, inits) = with_group(|g| {
        if g.depth == 0 {
            return Err(Error::InvalidUsage("ncclGroupEnd called without a matching ncclGroupStart".into()));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok((Vec::new(), None, Vec::new()));
        }
        Ok((std::mem::take(&mut g.queued), g.error.take(), std::mem::take(&mut g.inits)))
    })??;
    let ended = run_inits(inits)?;
    if let Some(e) = error {
        return Err(e.context("an operation inside this group failed, so the group launched nothing"));
    }
    // SAFETY: everything queued came through `submit`, whose contract covers the buffers.
    unsafe { launch::launch_group(queued) }?;
    Ok(ended)
}

/// Drops everything queued in the current group (`ncclGroupSimulateEnd` reads it first); the
/// deferred inits still run, since their handles are the caller's.
pub fn end_without_launch() -> Result<Vec<Queued>> {
    let (queued, inits) = with_group(|g| {
        if g.depth == 0 {
            return Err(Error::InvalidUsage("ncclGroupSimulateEnd called without a matching ncclGroupStart".into()));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        g.error = None;
        Ok((std::mem::take(&mut g.queued), std::mem::take(&mut g.inits)))
    })??;
    run_inits(inits)?;
    Ok(queued)
}

/// Runs deferred inits side by side, each on a thread of its own (their rendezvous needs them
/// all at once), and waits for the blocking ones; the first failure among those is the result.
/// Every init has a deadline of its own (the bootstrap's), so the wait ends.
fn run_inits(inits: Vec<(DeferredInit, bool)>) -> Result<Ended> {
    let mut ended = Ended::Done;
    let mut waits = Vec::new();
    for (init, blocking) in inits {
        let started = std::thread::Builder::new()
            .name("fn-group-init".into())
            .spawn(init)
            .map_err(|e| Error::System(format!("could not start a communicator init thread: {e}")))?;
        match blocking {
            true => waits.push(started),
            false => ended = Ended::InitInProgress,
        }
    }
    let mut first = None;
    for t in waits {
        let r = t.join().unwrap_or_else(|_| Err(Error::Internal("panic during communicator init".into())));
        if let (Err(e), None) = (r, &first) {
            first = Some(e);
        }
    }
    first.map_or(Ok(ended), Err)
}

/// Queues operations (several for AlltoAll/Gather/Scatter) as one unit, launching them
/// at once when no group is open.
///
/// # Safety
/// Every task's buffers are device memory valid for the bytes it moves (the API entry points
/// check them first).
pub unsafe fn submit(ops: Vec<Queued>) -> Result<()> {
    let outside = with_group(move |g| {
        if g.depth > 0 {
            g.queued.extend(ops);
            None
        } else {
            Some(ops)
        }
    })?;
    match outside {
        // SAFETY: per this function's contract.
        Some(ops) => unsafe { launch::launch_group(ops) },
        None => Ok(()),
    }
}

/// Records an argument error so that the enclosing group's end reports it too (nothing to do on
/// a thread past its thread-locals: it has no group).
pub fn record_error(e: &Error) {
    let _ = with_group(|g| {
        if g.depth > 0 && g.error.is_none() {
            g.error = Some(e.clone());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    /// Deferred inits run side by side at the outermost end, as one thread's ranks of one
    /// communicator must (each waits for the other here, as a rendezvous does, and gives up
    /// after a while if it never comes); the first failure of a blocking one is what the end
    /// returns, and a nonblocking one leaves the end in progress.
    #[test]
    fn the_outermost_end_runs_deferred_inits_side_by_side() {
        start().unwrap();
        start().unwrap();
        assert!(open().unwrap());
        let ((to_b, from_a), (to_a, from_b)) = (channel(), channel());
        for (tell, hear) in [(to_b, from_b), (to_a, from_a)] {
            let meet = move || {
                tell.send(()).ok();
                hear.recv_timeout(Duration::from_secs(10))
                    .map_err(|_| Error::Remote("the other rank never came".into()))
            };
            defer_init(Box::new(meet), true).unwrap();
        }
        assert_eq!(end().unwrap(), Ended::Done);
        assert_eq!(with_group(|g| g.inits.len()).unwrap(), 2, "an inner end runs nothing");
        assert_eq!(end().unwrap(), Ended::Done);
        assert!(!open().unwrap());

        start().unwrap();
        defer_init(Box::new(|| Err(Error::Remote("rank 1 never came".into()))), true).unwrap();
        defer_init(Box::new(|| Ok(())), false).unwrap();
        let e = end().unwrap_err();
        assert!(e.to_string().contains("rank 1 never came"), "{e}");

        start().unwrap();
        defer_init(Box::new(|| Ok(())), false).unwrap();
        assert_eq!(end().unwrap(), Ended::InitInProgress);
        assert!(end().is_err(), "no group is open any more");
    }
}
