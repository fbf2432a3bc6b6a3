//! Counters a processor keeps per source. Each one is kept in memory (for run reports and
//! the progress line) and also sent to the `metrics` facade, which the Prometheus
//! exporter of `icq work --metrics-addr` serves (a no-op when no exporter is installed).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters for one source.
///
/// Every [`Queue`](crate::Queue) has one ([`Queue::stats`](crate::Queue::stats)), which
/// the processor running the queue's source counts into; each count also goes to the
/// `metrics` facade (`icq_internal_commands_claimed_total{source=...}` and the like).
/// Read them with [`Stats::snapshot`]; only the processor counts.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # icq::schema::apply(&pool, &icq::TableName::default()).await?;
/// let queue = icq::Queue::from_pool("orders", &pool, &icq::TableName::default()).await?;
/// let snapshot = queue.stats().snapshot();
/// assert_eq!((snapshot.claimed, snapshot.succeeded, snapshot.failed), (0, 0, 0));
/// # Ok(())
/// # }
/// ```
pub struct Stats {
    source: Arc<str>,
    claimed: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    dead_lettered: AtomicU64,
    stale: AtomicU64,
    snoozed: AtomicU64,
    cancelled: AtomicU64,
    /// Execution-time histograms per type: succeeded, terminal, failed.
    histograms: std::sync::RwLock<std::collections::HashMap<String, [metrics::Histogram; 3]>>,
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats")
            .field("source", &self.source)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

/// A point-in-time copy of [`Stats`].
///
/// # Examples
///
/// ```
/// let snapshot = icq::StatsSnapshot::default();
/// assert_eq!(snapshot.dead_lettered, 0);
/// assert_eq!(serde_json::to_value(snapshot)?["dead_lettered"], 0);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
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
    /// Snoozes stamped (the command runs again later, its attempt given back).
    pub snoozed: u64,
    /// Running commands stopped because their lease was gone: cancelled by an operator
    /// (`icq cancel`), or (rarely) taken by another claim. Nothing is stamped for them.
    pub cancelled: u64,
}

macro_rules! counter_method {
    ($(#[$doc:meta])* $name:ident, $series:literal) => {
        $(#[$doc])*
        pub(crate) fn $name(&self, n: u64) {
            if n > 0 {
                self.$name.fetch_add(n, Ordering::Relaxed);
                metrics::counter!(concat!("icq_internal_commands_", $series), "source" => self.source.to_string())
                    .increment(n);
            }
        }
    };
}

impl Stats {
    /// Counters for the source named `source`.
    pub(crate) fn new(source: Arc<str>) -> Stats {
        Stats {
            source,
            claimed: AtomicU64::new(0),
            succeeded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            stale: AtomicU64::new(0),
            snoozed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            histograms: Default::default(),
        }
    }

    counter_method!(
        /// Counts rows claimed.
        claimed, "claimed_total");
    counter_method!(
        /// Counts rows stamped completed.
        succeeded, "succeeded_total");
    counter_method!(
        /// Counts failed attempts stamped for retry.
        failed, "failed_total");
    counter_method!(
        /// Counts rows stamped dead.
        dead_lettered, "dead_lettered_total");
    counter_method!(
        /// Counts outcomes dropped because their lease had passed to another claim.
        stale, "stale_stamps_total");
    counter_method!(
        /// Counts snoozes stamped.
        snoozed, "snoozed_total");
    counter_method!(
        /// Counts running commands stopped because their lease was gone (an operator's
        /// cancel).
        cancelled, "cancelled_total");

    /// Records how long one execution of `type_name` took and how it ended. The
    /// histogram handles are registered once per type, not once per execution.
    ///
    /// `outcome` is `succeeded`, `terminal` or (anything else) `failed`; it only feeds the
    /// `icq_internal_commands_execution_seconds` histogram.
    pub(crate) fn execution(&self, type_name: &str, outcome: &'static str, seconds: f64) {
        let index = match outcome {
            "succeeded" => 0,
            "terminal" => 1,
            _ => 2,
        };
        let cached = self
            .histograms
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(type_name)
            .map(|set| set[index].clone());
        let histogram = match cached {
            Some(histogram) => histogram,
            None => {
                let set = ["succeeded", "terminal", "failed"].map(|outcome| {
                    metrics::histogram!(
                        "icq_internal_commands_execution_seconds",
                        "source" => self.source.to_string(),
                        "type" => type_name.to_owned(),
                        "outcome" => outcome
                    )
                });
                let histogram = set[index].clone();
                self.histograms
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(type_name.to_owned(), set);
                histogram
            }
        };
        histogram.record(seconds);
    }

    /// Reads every counter. See [`Stats`]'s example.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            claimed: self.claimed.load(Ordering::Relaxed),
            succeeded: self.succeeded.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            snoozed: self.snoozed.load(Ordering::Relaxed),
            cancelled: self.cancelled.load(Ordering::Relaxed),
        }
    }
}
