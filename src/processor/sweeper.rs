//! The sweeper: every `cleanup_interval_hours`, deletes completed rows older than
//! `retention_days` in bounded batches, one short statement each, never touching
//! pending rows or dead letters. On PostgreSQL and MySQL only one replica sweeps a
//! table at a time (an advisory lock / `GET_LOCK`); the others skip the round.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{SourceHandle, health};
use crate::engine::SweepParams;

/// Rows deleted per statement.
const BATCH: u32 = 1000;

/// How long one batch may take before its connection is abandoned as dead.
const SWEEP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Sweeps now and then every interval until `stop` is cancelled.
pub(crate) async fn run(source: SourceHandle, stop: CancellationToken) {
    let name: Arc<str> = source.name.clone();
    loop {
        let params = SweepParams {
            older_than: source.settings.retention(),
            limit: BATCH,
        };
        let mut deleted = 0u64;
        loop {
            // Not latency-bound (and a batch delete may take a while): the longest deadline.
            let limit = SWEEP_DEADLINE;
            let call = source.backend.completed_delete_batch(&params);
            let sweeping = health::deadline(limit, "deleting old completed commands", call);
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
                Err(err) => {
                    tracing::warn!(source = %name, error = %err, "retention sweep failed");
                    break;
                }
            }
        }
        if deleted > 0 {
            tracing::info!(source = %name, deleted, "retention sweep deleted completed commands");
        }
        tokio::select! {
            _ = tokio::time::sleep(source.settings.cleanup_interval()) => {}
            _ = stop.cancelled() => return,
        }
    }
}
