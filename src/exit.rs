//! The end of the process, as the library's own threads must see it.
//!
//! A job may end with communicators still alive: returning from `main`, `exit()`, the end of a
//! Python interpreter, `MPI_Finalize` and then `exit`. The C runtime then runs its exit handlers,
//! and the CUDA runtime's tear the contexts down, freeing pinned host memory and device objects
//! with them, while our threads (the NET proxy, the liveness watcher) still run. A thread that
//! touched a FIFO, a flag or a stream after that would crash a job that had finished its work.
//!
//! So every library thread does such work inside [`hold`], and the exit handler installed by
//! [`install`] (an `atexit` handler registered after CUDA's, so it runs before them) first marks
//! the exit begun, runs the farewells registered with it (the communicators' goodbyes to their
//! peers), and then closes the gate: it waits, with a deadline, for the holders in flight. From
//! then on [`hold`] answers `None` and nothing of ours touches CUDA again; live communicators are
//! leaked, as NCCL leaks them. docs/ARCHITECTURE.md, "Who owns what", lists each thread.
//!
//! A child made by `fork()` inherits the communicators' memory but not their threads, their
//! CUDA contexts or the right to speak on their sockets: [`forked_child`] says so,
//! the C API refuses the inherited communicators, and the exit handler does nothing there.

use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Once;
use std::time::Duration;

const RUNNING: u8 = 0;
const EXITING: u8 = 1;

static STATE: AtomicU8 = AtomicU8::new(RUNNING);
/// Set in a child made by fork() after [`install`].
static FORKED: AtomicBool = AtomicBool::new(false);
/// Held for reading by every piece of thread work that touches CUDA or CUDA-owned memory.
static GATE: RwLock<()> = RwLock::new(());
/// Run once by the exit handler, before the gate closes.
static FAREWELLS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// How long the exit handler waits for threads inside [`hold`] (a hang report may read FIFO
/// counters for up to a second).
const CLOSE_WITHIN: Duration = Duration::from_secs(2);

/// Installs the exit and fork handlers once. Call it after
/// CUDA is initialised, so that the handler runs before the CUDA runtime's own.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: both handlers are `extern "C"` functions with static lifetime that never
        // unwind (the farewells run behind catch_unwind; the fork handler is one store).
        unsafe {
            if libc::atexit(at_exit) != 0 {
                crate::nccl_warn!(
                    "cannot register the exit handler: a job that exits with live communicators may crash"
                );
            }
            libc::pthread_atfork(None, None, Some(in_child));
        }
    });
}

/// Runs `farewell` at exit, before the gate closes (each function once, however often it is
/// passed), and installs the handler if needed.
pub fn on_exit(farewell: fn()) {
    install();
    let mut f = FAREWELLS.lock();
    if !f.iter().any(|&g| g as usize == farewell as usize) {
        f.push(farewell);
    }
}

/// Permission to touch CUDA or CUDA-owned memory from a library thread, while the guard lives;
/// `None` once the process has begun to exit (or in a forked child): then leave such things
/// alone, and free nothing.
pub fn hold() -> Option<RwLockReadGuard<'static, ()>> {
    if begun() {
        return None;
    }
    let g = GATE.read();
    (!begun()).then_some(g)
}

/// The process has begun to exit (or is a child forked after the library was set up): peers
/// closing their connections now are no news, and nothing is freed any more.
pub fn begun() -> bool {
    STATE.load(Ordering::Acquire) != RUNNING || forked_child()
}

/// The exit handler has run: the process is ending (a forked child never gets here; see
/// [`begun`] for the question library threads ask).
pub fn exiting() -> bool {
    STATE.load(Ordering::Acquire) != RUNNING
}

/// This process is a child forked after the library was set up: the communicators it inherited
/// belong to its parent.
pub fn forked_child() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// In a forked child: one store (only async-signal-safe work is allowed there).
extern "C" fn in_child() {
    FORKED.store(true, Ordering::Relaxed);
}

extern "C" fn at_exit() {
    if forked_child() {
        return;
    }
    if STATE.swap(EXITING, Ordering::AcqRel) != RUNNING {
        return;
    }
    let farewells = std::mem::take(&mut *FAREWELLS.lock());
    for f in farewells {
        // A farewell that panics must not turn an orderly exit into an abort.
        let _ = std::panic::catch_unwind(f);
    }
    if GATE.try_write_for(CLOSE_WITHIN).is_none() {
        crate::nccl_warn_unrecorded!(
            "exit: a library thread still held CUDA memory after {CLOSE_WITHIN:?}; exiting anyway"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_is_open_while_the_process_runs() {
        assert!(!begun());
        assert!(hold().is_some());
        // Two holders at once: the gate is a read lock.
        let (a, b) = (hold(), hold());
        assert!(a.is_some() && b.is_some());
    }
}
