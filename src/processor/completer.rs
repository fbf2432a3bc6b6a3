//! The completer: receives every outcome (completed, retry, dead, release) over a bounded
//! channel and stamps them in batches with the engine's one set-state statement, each row
//! guarded by its lease token.
//!
//! A batch is flushed when it reaches [`MAX_BATCH`] or a few milliseconds after its first
//! outcome, and at most [`STAMPS_IN_FLIGHT`] statements run at once; a full channel makes
//! executors wait (back-pressure) instead of growing memory. A stamp that fails (the
//! database went away) is retried while the leases can still be held; the completer only
//! returns once every outcome it received is stamped or given up on, so shutdown loses
//! none. Leases are forgotten (and so no longer renewed) only once their row is stamped.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::lease::Leases;
use super::stats::Stats;
use crate::engine::{Backend, SetState, StateChange};

/// Most outcomes stamped in one statement.
pub(crate) const MAX_BATCH: usize = 1000;

/// How long a batch waits for more outcomes before it is stamped.
const FLUSH_AFTER: Duration = Duration::from_millis(2);

/// Set-state statements run side by side.
const STAMPS_IN_FLIGHT: usize = 2;

/// What the completer needs besides its inbox.
pub(crate) struct Completer {
    pub(crate) source: Arc<str>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) leases: Arc<Leases>,
    /// How long a failing stamp is retried before the lease is left to lapse.
    pub(crate) lease: Duration,
}

impl Completer {
    /// Runs until every sender is dropped and everything received is stamped.
    pub(crate) async fn run(self, mut inbox: mpsc::Receiver<SetState>) {
        let this = Arc::new(self);
        let slots = Arc::new(Semaphore::new(STAMPS_IN_FLIGHT));
        let mut stamps = JoinSet::new();
        while let Some(first) = inbox.recv().await {
            let mut batch = vec![first];
            let deadline = Instant::now() + FLUSH_AFTER;
            while batch.len() < MAX_BATCH {
                match inbox.try_recv() {
                    Ok(change) => batch.push(change),
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        match tokio::time::timeout_at(deadline, inbox.recv()).await {
                            Ok(Some(change)) => batch.push(change),
                            Ok(None) | Err(_) => break,
                        }
                    }
                }
            }
            let Ok(permit) = slots.clone().acquire_owned().await else {
                break;
            };
            let this = this.clone();
            stamps.spawn(async move {
                this.stamp(batch).await;
                drop(permit);
            });
            while stamps.try_join_next().is_some() {}
        }
        while stamps.join_next().await.is_some() {}
    }

    async fn stamp(&self, batch: Vec<SetState>) {
        let started = Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            match self.backend.command_set_state_many(&batch).await {
                Ok(stamped) => {
                    self.count(&batch, stamped);
                    break;
                }
                Err(err) if started.elapsed() + pause < self.lease => {
                    tracing::warn!(source = %self.source, error = %err, retry_in_ms = pause.as_millis() as u64, "could not stamp outcomes; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Err(err) => {
                    tracing::error!(
                        source = %self.source,
                        error = %err,
                        rows = batch.len(),
                        "could not stamp outcomes before their leases lapse; the rows will run again"
                    );
                    break;
                }
            }
        }
        self.leases.forget(batch.iter().map(|c| &c.lease));
    }

    /// Updates the counters. Stale stamps are rare; when some rows were not stamped they
    /// are taken from the completions first for the counters.
    fn count(&self, batch: &[SetState], stamped: u64) {
        let (mut completed, mut retried, mut dead) = (0u64, 0u64, 0u64);
        for change in batch {
            match change.change {
                StateChange::Completed => completed += 1,
                StateChange::Retry { .. } => retried += 1,
                StateChange::Dead { .. } => dead += 1,
                StateChange::Release { .. } => {}
            }
        }
        let requested = batch.len() as u64;
        let mut stale = requested.saturating_sub(stamped);
        if stale > 0 {
            self.stats.stale(stale);
            tracing::warn!(
                source = %self.source,
                stale,
                "dropped stale outcomes: their leases had passed to another claim"
            );
            for counter in [&mut completed, &mut retried, &mut dead] {
                let taken = stale.min(*counter);
                *counter -= taken;
                stale -= taken;
            }
        }
        self.stats.succeeded(completed);
        self.stats.failed(retried);
        self.stats.dead_lettered(dead);
    }
}
