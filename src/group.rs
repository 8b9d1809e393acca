//! Group semantics: `ncclGroupStart`/`ncclGroupEnd` nest per thread; operations issued inside
//! are queued and launched together at the outermost end. A call outside any group is an
//! implicit group of one. An error inside a group is returned by that call, and again by the
//! `ncclGroupEnd` that closes the group, which then launches nothing.

use crate::comm::{launch, Comm};
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// One queued operation of this library: on a live communicator.
pub type Queued = crate::task::Queued<Arc<Comm>>;

#[derive(Default)]
struct GroupState {
    depth: usize,
    queued: Vec<Queued>,
    error: Option<Error>,
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

/// Closes one level; at the outermost level launches everything queued (or reports the error
/// that happened inside the group).
pub fn end() -> Result<()> {
    let (queued, error) = with_group(|g| {
        if g.depth == 0 {
            return Err(Error::InvalidUsage("ncclGroupEnd called without a matching ncclGroupStart".into()));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok((Vec::new(), None));
        }
        Ok((std::mem::take(&mut g.queued), g.error.take()))
    })??;
    if let Some(e) = error {
        return Err(e.context("an operation inside this group failed, so the group launched nothing"));
    }
    // SAFETY: everything queued came through `submit`, whose contract covers the buffers.
    unsafe { launch::launch_group(queued) }
}

/// Drops everything queued in the current group (`ncclGroupSimulateEnd` reads it first).
pub fn end_without_launch() -> Result<Vec<Queued>> {
    with_group(|g| {
        if g.depth == 0 {
            return Err(Error::InvalidUsage("ncclGroupSimulateEnd called without a matching ncclGroupStart".into()));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(Vec::new());
        }
        g.error = None;
        Ok(std::mem::take(&mut g.queued))
    })?
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
