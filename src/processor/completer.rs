//! The completer: receives outcomes from executions and stamps them in batches, each
//! stamp guarded by the row's lease token. A stamp that fails (the database went away)
//! is retried until the lease would expire; after that the lease takes over and the
//! command runs again, so an outcome is never silently lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use super::stats::Stats;
use crate::engine::{Backend, Failure, Lease};

/// Most outcomes stamped in one round.
const MAX_BATCH: usize = 1000;

/// What happened to one execution.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The handler succeeded.
    Completed(Lease),
    /// The handler failed; retry or dead-letter as `failure.retry_in` says.
    Failed(Failure),
}

/// An outcome plus when its lease runs out.
#[derive(Debug, Clone)]
pub struct Stamp {
    /// The outcome.
    pub outcome: Outcome,
    /// The lease's expiry: past it, stamping is pointless.
    pub lease_until: DateTime<Utc>,
}

/// Runs until the sender side closes and everything received is stamped.
pub async fn run(
    source: Arc<str>,
    backend: Arc<dyn Backend>,
    mut inbox: mpsc::UnboundedReceiver<Stamp>,
    stats: Arc<Stats>,
    outstanding: Arc<AtomicUsize>,
) {
    while let Some(first) = inbox.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match inbox.try_recv() {
                Ok(stamp) => batch.push(stamp),
                Err(_) => break,
            }
        }
        let count = batch.len();
        stamp_batch(&source, backend.as_ref(), batch, &stats).await;
        outstanding.fetch_sub(count, Ordering::AcqRel);
    }
}

async fn stamp_batch(source: &str, backend: &dyn Backend, batch: Vec<Stamp>, stats: &Stats) {
    let deadline = batch
        .iter()
        .map(|s| s.lease_until)
        .min()
        .unwrap_or_else(Utc::now);
    let mut completed = Vec::new();
    let mut failed = Vec::new();
    for stamp in batch {
        match stamp.outcome {
            Outcome::Completed(lease) => completed.push(lease),
            Outcome::Failed(failure) => failed.push(failure),
        }
    }
    let mut pause = Duration::from_millis(100);
    while !completed.is_empty() || !failed.is_empty() {
        let result: crate::Result<()> = async {
            if !completed.is_empty() {
                let stamped = backend.command_complete_many(&completed).await?;
                stats.succeeded(stamped);
                note_stale(source, "completed", completed.len() as u64, stamped, stats);
                completed.clear();
            }
            if !failed.is_empty() {
                let dead = failed.iter().filter(|f| f.retry_in.is_none()).count() as u64;
                let stamped = backend.command_fail_many(&failed).await?;
                // Stale rows are rare; attribute them to retries first for the counters.
                let stamped_dead = dead.min(stamped);
                stats.dead_lettered(stamped_dead);
                stats.failed(stamped - stamped_dead);
                note_stale(source, "failed", failed.len() as u64, stamped, stats);
                failed.clear();
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => break,
            Err(err)
                if Utc::now() + chrono::Duration::from_std(pause).unwrap_or_default()
                    < deadline =>
            {
                tracing::warn!(source, error = %err, retry_in_ms = pause.as_millis() as u64, "could not stamp outcomes; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(err) => {
                tracing::error!(
                    source,
                    error = %err,
                    rows = completed.len() + failed.len(),
                    "could not stamp outcomes before their leases expired; the rows will run again"
                );
                break;
            }
        }
    }
}

fn note_stale(source: &str, kind: &str, requested: u64, stamped: u64, stats: &Stats) {
    if stamped < requested {
        let stale = requested - stamped;
        stats.stale(stale);
        tracing::warn!(
            source,
            kind,
            stale,
            "dropped stale outcomes: their leases had passed to another claim"
        );
    }
}
