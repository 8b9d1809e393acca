//! The handle registry: what an `ncclComm_t` stands for.
//!
//! A handle exists from the moment `ncclCommInitRank*` is called; the communicator itself
//! ([`Comm`]) appears when initialisation finishes (at once for blocking configs, from a
//! background thread for `blocking = 0`). The pointer a C caller holds is only a key: this
//! registry maps it to its [`CommHandle`], so a stale or garbage `ncclComm_t` is reported and
//! never dereferenced.

use super::Comm;
use crate::error::{Error, Result};
use crate::types::{ncclComm_t, ncclResult_t};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Where a communicator is in its life.
pub enum Phase {
    /// Called inside a group: the init runs at the outermost `ncclGroupEnd` of that thread.
    Deferred,
    Initializing,
    Ready(Arc<Comm>),
    Failed(Error),
    /// After ncclCommFinalize: queries work, new operations don't.
    Finalized(Arc<Comm>),
}

/// Why a communicator whose init waits for its group's end cannot be used yet.
pub const DEFERRED: &str =
    "communicator was created inside a group: its init runs at the outermost ncclGroupEnd, so end the group first";

/// What an `ncclComm_t` stands for.
pub struct CommHandle {
    pub phase: Arc<Mutex<Phase>>,
}

/// Live handles by address, and the addresses of destroyed ones (to say "destroyed" rather than
/// "invalid").
#[derive(Default)]
struct Registry {
    live: HashMap<usize, Arc<CommHandle>>,
    retired: HashSet<usize>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    f(REGISTRY.lock().get_or_insert_with(Registry::default))
}

/// Registers a new handle; the pointer goes to the caller. It is the address of the handle's
/// allocation, so it is unique while the handle lives, but nothing ever reads through it.
pub fn publish(phase: Phase) -> (ncclComm_t, Arc<Mutex<Phase>>) {
    let phase = Arc::new(Mutex::new(phase));
    let handle = Arc::new(CommHandle { phase: phase.clone() });
    let ptr = Arc::as_ptr(&handle) as ncclComm_t;
    with(|r| {
        r.retired.remove(&(ptr as usize));
        r.live.insert(ptr as usize, handle);
    });
    (ptr, phase)
}

/// The handle behind a pointer from C, or an error naming `arg`.
pub fn lookup(comm: ncclComm_t, arg: &str) -> Result<Arc<CommHandle>> {
    if comm.is_null() {
        crate::bail_arg!("{arg} is NULL");
    }
    if crate::exit::forked_child() {
        crate::bail_usage!(
            "{arg} {comm:p} belongs to the parent of this process: a child made by fork() inherits neither its \
             threads nor its CUDA context, so it can use no communicator of the parent's (create new ones after exec)"
        );
    }
    with(|r| match r.live.get(&(comm as usize)) {
        Some(h) => Ok(h.clone()),
        None if r.retired.contains(&(comm as usize)) => {
            Err(Error::InvalidUsage(format!("{arg} {comm:p} was already destroyed")))
        }
        None => Err(Error::InvalidArgument(format!("{arg} {comm:p} is not a communicator created by this library"))),
    })
}

/// Unregisters a handle: later lookups report it destroyed. Calls already holding it finish.
pub fn retire(comm: ncclComm_t) {
    with(|r| {
        r.live.remove(&(comm as usize));
        r.retired.insert(comm as usize);
    });
}

impl CommHandle {
    /// The communicator, if it is ready for new operations.
    pub fn ready(&self) -> Result<Arc<Comm>> {
        match &*self.phase.lock() {
            Phase::Ready(c) => {
                if c.is_revoked() {
                    crate::bail_usage!(
                        "communicator was revoked (ncclCommRevoke); only ncclCommShrink, ncclCommAbort, \
                         ncclCommDestroy and queries are allowed now"
                    );
                }
                c.check_health()?;
                Ok(c.clone())
            }
            Phase::Deferred => Err(Error::InvalidUsage(DEFERRED.into())),
            Phase::Initializing => Err(Error::InvalidUsage(
                "communicator is still initializing (poll ncclCommGetAsyncError until it returns ncclSuccess)".into(),
            )),
            Phase::Failed(e) => Err(e.clone().context("communicator initialization failed earlier")),
            Phase::Finalized(_) => {
                Err(Error::InvalidUsage("communicator was finalized; only ncclCommDestroy is allowed now".into()))
            }
        }
    }

    /// The communicator for queries (rank, count, device): ready or finalized.
    pub fn queryable(&self) -> Result<Arc<Comm>> {
        match &*self.phase.lock() {
            Phase::Ready(c) | Phase::Finalized(c) => Ok(c.clone()),
            Phase::Deferred => Err(Error::InvalidUsage(DEFERRED.into())),
            Phase::Initializing => Err(Error::InvalidUsage("communicator is still initializing".into())),
            Phase::Failed(e) => Err(e.clone().context("communicator initialization failed earlier")),
        }
    }

    /// ncclCommGetAsyncError: InProgress while initializing, the failure if any, else Success.
    pub fn async_error(&self) -> ncclResult_t {
        match &*self.phase.lock() {
            Phase::Deferred | Phase::Initializing => ncclResult_t::ncclInProgress,
            Phase::Failed(e) => {
                // Logged when init failed; the text may have been replaced since.
                crate::debug::set_last_error(&e.to_string());
                e.code()
            }
            Phase::Ready(c) | Phase::Finalized(c) => match c.check_health() {
                Ok(()) => ncclResult_t::ncclSuccess,
                Err(e) => {
                    crate::nccl_warn!("{e}");
                    e.code()
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_checked() {
        assert!(matches!(lookup(std::ptr::null_mut(), "comm"), Err(Error::InvalidArgument(_))));
        let e = lookup(0x1234 as ncclComm_t, "comm").err().unwrap();
        assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("not a communicator"), "{e}");
        let (p, _) = publish(Phase::Initializing);
        assert!(lookup(p, "comm").is_ok());
        retire(p);
        let e = lookup(p, "comm").err().unwrap();
        assert!(matches!(e, Error::InvalidUsage(_)) && e.to_string().contains("already destroyed"), "{e}");
    }
}
