//! The pause watch: which queues of a source are paused, as `<table>Queues` says, re-read
//! every polling interval and, on PostgreSQL, at once when a pause or resume NOTIFYs.
//! While any queue is paused the producers' claims skip paused queues in the database
//! (the claim looks the pause up itself, so a queue paused since the last read is
//! skipped as soon as the watch sees any pause); while none is, claims do not look.
//! Running commands are left to finish. A row claimed before the pause reached this
//! processor (held in the look-ahead, or returned by a claim already sent) that has not
//! started when it is seen is released, its attempt given back: a pause stops every
//! start the processor knows to be paused, not only its claims.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::SourceHandle;

/// What the watch last read, shared by the source's producers and the idle check.
#[derive(Debug, Default)]
pub(crate) struct PauseWatch {
    any: AtomicBool,
    paused: Mutex<Vec<String>>,
    /// Signalled by the PostgreSQL listener when a pause or resume was committed.
    pub(crate) changed: Arc<Notify>,
}

impl PauseWatch {
    /// Whether some queue was paused at the last read.
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// The queues paused at the last read.
    pub(crate) fn paused(&self) -> Vec<String> {
        self.paused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether `queue` was paused at the last read (exactly that name).
    pub(crate) fn is_paused(&self, queue: &str) -> bool {
        self.any()
            && self
                .paused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .any(|paused| paused == queue)
    }

    fn set(&self, paused: Vec<String>) {
        self.any.store(!paused.is_empty(), Ordering::Release);
        *self
            .paused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = paused;
    }
}

/// Reads the paused queues once, before the producers' first claim. A failed read keeps
/// what was known (the claims and the health check report a database that is gone) and
/// returns false.
pub(crate) async fn read(source: &SourceHandle) -> bool {
    let watch = &source.pauses;
    // Abandoned like every other call of the processor when the server stops answering.
    let limit = super::health::answer_deadline(source.settings.lease());
    let reading = source.backend.queue_states();
    match super::health::deadline(
        source.backend.as_ref(),
        limit,
        "reading the paused queues",
        reading,
    )
    .await
    {
        Ok(states) => {
            let paused: Vec<String> = states
                .into_iter()
                .filter(|s| s.paused)
                .map(|s| s.queue)
                .collect();
            if paused != watch.paused() {
                tracing::info!(source = %source.name, paused = ?paused, "paused queues");
                // A resumed queue's rows are due now: claim them without waiting.
                source.wake.notify_one();
            }
            watch.set(paused);
            true
        }
        Err(err) => {
            tracing::debug!(source = %source.name, error = %err, "cannot read the paused queues");
            false
        }
    }
}

/// How soon a failed read is tried again, doubled per failure in a row up to the polling
/// interval: the notification that asked for it may be the only one (a failover leaves
/// pooled connections to the old server, and the first use of each fails), and the next
/// poll can be a polling interval away.
const RETRY_FAILED_READ: Duration = Duration::from_millis(250);

/// Reads the paused queues again every polling interval, or when the watch's `changed` is
/// signalled, until `stop`.
pub(crate) async fn run(source: SourceHandle, stop: CancellationToken) {
    let mut failed: u32 = 0;
    loop {
        let poll = source.settings.polling_interval();
        let wait = match failed {
            0 => poll,
            n => RETRY_FAILED_READ
                .saturating_mul(1 << (n - 1).min(16))
                .min(poll),
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = source.pauses.changed.notified() => {}
            _ = stop.cancelled() => return,
        }
        failed = if read(&source).await {
            0
        } else {
            failed.saturating_add(1)
        };
    }
}
