//! Counters a processor keeps per source (exported as metrics and in run reports).

use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters for one source.
#[derive(Debug, Default)]
pub struct Stats {
    /// Rows claimed.
    pub claimed: AtomicU64,
    /// Rows stamped completed.
    pub succeeded: AtomicU64,
    /// Failed attempts stamped for retry.
    pub failed: AtomicU64,
    /// Rows stamped dead.
    pub dead_lettered: AtomicU64,
    /// Outcomes dropped because the lease had passed to another claim.
    pub stale: AtomicU64,
}

/// A point-in-time copy of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Rows claimed.
    pub claimed: u64,
    /// Rows stamped completed.
    pub succeeded: u64,
    /// Failed attempts stamped for retry.
    pub failed: u64,
    /// Rows stamped dead.
    pub dead_lettered: u64,
    /// Outcomes dropped because the lease had passed to another claim.
    pub stale: u64,
}

impl Stats {
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            claimed: self.claimed.load(Ordering::Relaxed),
            succeeded: self.succeeded.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
        }
    }
}
