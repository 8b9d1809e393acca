//! Progress lines of long waits: a wait that goes on says every few seconds whom it waits for.

use std::time::{Duration, Instant};

use crate::debug::Subsys;

/// How often a bootstrap wait that is still going says so.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Writes an INFO line every [`PROGRESS_EVERY`] while a wait goes on, naming whom it waits for,
/// so that a rank held up by a slow but honest peer (a framework import, a data loader) reads
/// differently from a hang. Every clock reading is fresh: nothing here is stamped before a
/// blocking wait and used after it.
pub struct Progress<F: Fn() -> String> {
    since: Instant,
    next: Instant,
    waiting_for: F,
}

impl<F: Fn() -> String> Progress<F> {
    pub fn new(waiting_for: F) -> Progress<F> {
        let since = Instant::now();
        Progress { since, next: since + PROGRESS_EVERY, waiting_for }
    }

    /// How long the next wait may sleep: up to `deadline`, but no later than the next report.
    pub fn nap(&self, deadline: Option<Instant>) -> Option<Duration> {
        let now = Instant::now();
        let until = deadline.map_or(self.next, |d| d.min(self.next));
        Some(until.saturating_duration_since(now))
    }

    /// Reports if a report is due (never for a wait that names nobody: a listener's idle time).
    pub fn tick(&mut self, deadline: Option<Instant>) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + PROGRESS_EVERY;
        let whom = (self.waiting_for)();
        if whom.is_empty() {
            return;
        }
        let left = deadline.map_or("no time limit".to_string(), |d| {
            format!("giving up in {}s", d.saturating_duration_since(now).as_secs())
        });
        crate::nccl_info!(
            Subsys::BOOTSTRAP,
            "Bootstrap: still waiting for {whom} after {}s ({left})",
            (now - self.since).as_secs()
        );
    }
}
