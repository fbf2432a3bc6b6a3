//! The sweeper: every `cleanup_interval_hours`, deletes completed rows older than
//! `retention_days` in bounded batches, one short statement each, never touching
//! pending rows or dead letters. On a version-3 table it deletes from the history table
//! and moves into it the completed rows it finds left in the commands table (by an older
//! icq during a rolling upgrade, or by another program). On PostgreSQL and MySQL only one replica sweeps a
//! table at a time (an advisory lock / `GET_LOCK`); the others skip the round.
//!
//! Between sweeps it keeps the commands table tight: every few seconds, when the dead row
//! versions that claims and completions leave pass a bound, it has them reclaimed (a
//! `VACUUM` on PostgreSQL), so the table the claims read stays the size of the work in
//! flight even where autovacuum runs rarely or not at all.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{SourceHandle, health};
use crate::engine::SweepParams;

/// Rows deleted per statement.
const BATCH: u32 = 1000;

/// How long one batch may take before its connection is abandoned as dead.
const SWEEP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Dead row versions above which the commands table is vacuumed: at 1,000 commands a
/// second, a claim and a completion each leave one, so about one vacuum per tick.
const TIDY_DEAD_ROWS: u64 = 10_000;

/// How often the dead row versions are looked at.
const TIDY_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Sweeps now and then every interval, and tidies every [`TIDY_EVERY`], until `stop` is
/// cancelled.
pub(crate) async fn run(source: SourceHandle, stop: CancellationToken) {
    let name: Arc<str> = source.name.clone();
    let mut next_sweep = tokio::time::Instant::now();
    loop {
        if tokio::time::Instant::now() >= next_sweep {
            sweep(&source, &name, &stop).await;
            next_sweep = tokio::time::Instant::now() + source.settings.cleanup_interval();
        }
        if stop.is_cancelled() {
            return;
        }
        let tidy = source.backend.table_tidy(TIDY_DEAD_ROWS);
        let tidied = tokio::select! {
            tidied = health::deadline(source.backend.as_ref(), SWEEP_DEADLINE, "vacuuming the commands table", tidy) => tidied,
            _ = stop.cancelled() => return,
        };
        match tidied {
            Ok(Some(dead)) => tracing::debug!(source = %name, dead, "vacuumed the commands table"),
            Ok(None) => {}
            Err(err) => {
                tracing::debug!(source = %name, error = %err, "vacuuming the commands table failed")
            }
        }
        let wait = next_sweep.saturating_duration_since(tokio::time::Instant::now());
        tokio::select! {
            _ = tokio::time::sleep(wait.min(TIDY_EVERY)) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// One retention sweep, batch after batch until a short one.
async fn sweep(source: &SourceHandle, name: &str, stop: &CancellationToken) {
    let params = SweepParams {
        older_than: source.settings.retention(),
        limit: BATCH,
    };
    let mut deleted = 0u64;
    loop {
        // Not latency-bound (and a batch delete may take a while): the longest deadline.
        let call = source.backend.completed_delete_batch(&params);
        let sweeping = health::deadline(
            source.backend.as_ref(),
            SWEEP_DEADLINE,
            "deleting old completed commands",
            call,
        );
        // Shutdown does not wait for a batch (it is repeated next time).
        let swept = tokio::select! {
            swept = sweeping => swept,
            _ = stop.cancelled() => return,
        };
        match swept {
            Ok(Some(n)) => {
                deleted += n;
                if n < u64::from(BATCH) || stop.is_cancelled() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            Ok(None) => {
                tracing::debug!(source = %name, "another replica is sweeping; skipping this round");
                break;
            }
            // On a Galera cluster the sweep's lock is each node's own: replicas on two
            // nodes may sweep at once, and one of them loses the race. The next round
            // sweeps what it left.
            Err(err) if err.lost_race() => {
                super::health::count_lost_race(name, "sweep");
                tracing::debug!(source = %name, error = %err, "retention sweep lost a race to another replica's; trying again next round");
                break;
            }
            Err(err) => {
                tracing::warn!(source = %name, error = %err, "retention sweep failed");
                break;
            }
        }
    }
    if deleted > 0 {
        tracing::info!(source = %name, deleted, "retention sweep deleted completed commands");
    }
}
