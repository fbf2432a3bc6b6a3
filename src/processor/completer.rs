//! The completer: every outcome (completed, retry, dead, release) goes into a bounded
//! outbox and is stamped in batches with the engine's one set-state statement, each row
//! guarded by its lease token.
//!
//! Two paths empty the outbox. While a backlog drains, the producer takes what is
//! waiting into its next claim ([`crate::engine::QueueOps::command_set_state_and_claim`]),
//! so a stamp and a claim share one round trip and one commit — unless other processors
//! share the head of the queue, when claims carry no stamps (see the producer's `claim`).
//! Otherwise the completer flushes a batch when it reaches [`MAX_BATCH`] or half the
//! outbox, or [`FLUSH_AFTER`] after its first outcome ([`FLUSH_AFTER_SHARING`] while the
//! producer shares the head of the queue: every outcome is then the completer's to stamp,
//! and batches of 5 ms made four replicas commit twice the transactions per command of
//! one), with at most [`STAMPS_IN_FLIGHT`] statements at once. A full outbox makes
//! executors wait (back-pressure) instead of growing memory. A stamp that fails (the
//! database went away) is retried while the leases can still be held, and until
//! shutdown's write deadline; one that fails with an error that cannot heal also holds
//! the source's claims ([`health::Trouble`]). The completer returns once the outbox is
//! closed and empty, so shutdown loses no outcome the database can take.
//! Leases are forgotten (and so no longer renewed) only once their row is stamped.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::health;
use super::lease::Leases;
use super::stats::Stats;
use crate::engine::CommandSetStateManyParams;
use crate::engine::{Backend, SetState, StateChange};

/// Most outcomes stamped in one statement.
pub(crate) const MAX_BATCH: usize = 1000;

/// How long a batch waits for more outcomes before the completer stamps it.
const FLUSH_AFTER: Duration = Duration::from_millis(5);
/// The same while other processors share the head of the queue (5 ms and 50 ms were no
/// better, on SQLite or MariaDB).
const FLUSH_AFTER_SHARING: Duration = Duration::from_millis(20);

/// Set-state statements the completer runs side by side.
const STAMPS_IN_FLIGHT: usize = 2;

/// Outcomes waiting to be stamped.
pub(crate) struct Outbox {
    pending: Mutex<Pending>,
    /// Signalled when the outbox goes from empty to not empty, fills to half, or closes.
    ready: Notify,
    /// One permit per free place: executors wait here when the outbox is full.
    room: Semaphore,
    /// The room the outbox was made with.
    capacity: usize,
    closed: AtomicBool,
    /// The producer shares the head of the queue with other processors (its claims come
    /// further apart): batches wait [`FLUSH_AFTER_SHARING`] for one.
    sharing: AtomicBool,
    /// This processor has run a row with an order key: a completion or a dead-letter it
    /// stamps may free the next row of that key ([`wake_successors`]).
    pub(crate) ordered: AtomicBool,
    /// A lane of this source has fleet-wide limits: every outcome the completer stamps
    /// ends a lease, whose place no claim handed on ([`wake_limited`]).
    pub(crate) limited: AtomicBool,
    /// Outcomes the completer stamped, not carried by a claim.
    stamped_alone: AtomicU64,
}

#[derive(Default)]
struct Pending {
    changes: Vec<SetState>,
    /// When the oldest waiting outcome arrived.
    since: Option<Instant>,
}

impl Outbox {
    /// An outbox with room for `capacity` outcomes.
    pub(crate) fn new(capacity: usize) -> Outbox {
        Outbox {
            pending: Mutex::new(Pending::default()),
            ready: Notify::new(),
            room: Semaphore::new(capacity.max(1)),
            capacity: capacity.max(1),
            closed: AtomicBool::new(false),
            sharing: AtomicBool::new(false),
            ordered: AtomicBool::new(false),
            limited: AtomicBool::new(false),
            stamped_alone: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds one outcome, waiting while the outbox is full.
    pub(crate) async fn push(&self, change: SetState) {
        if let Ok(permit) = self.room.acquire().await {
            permit.forget();
        }
        self.put(std::iter::once(change));
    }

    /// Puts outcomes back (a combined stamp-and-claim that failed); they keep the room
    /// they already hold.
    pub(crate) fn put(&self, changes: impl IntoIterator<Item = SetState>) {
        let mut pending = self.lock();
        let before = pending.changes.len();
        pending.changes.extend(changes);
        let after = pending.changes.len();
        pending.since.get_or_insert_with(Instant::now);
        drop(pending);
        let half = self.half();
        if before == 0 || (before < half && after >= half) {
            self.ready.notify_one();
        }
    }

    /// Takes up to `max` waiting outcomes, oldest first.
    pub(crate) fn take(&self, max: usize) -> Vec<SetState> {
        let mut pending = self.lock();
        let n = pending.changes.len().min(max);
        let taken: Vec<SetState> = pending.changes.drain(..n).collect();
        pending.since = if pending.changes.is_empty() {
            None
        } else {
            Some(Instant::now())
        };
        taken
    }

    /// How many outcomes wait to be stamped.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().changes.len()
    }

    /// How many outcomes the completer has stamped on its own so far.
    pub(crate) fn stamped_alone(&self) -> u64 {
        self.stamped_alone.load(Ordering::Acquire)
    }

    /// Frees the room of `n` stamped (or given up) outcomes.
    pub(crate) fn done(&self, n: usize) {
        self.room.add_permits(n);
    }

    /// How many waiting outcomes are stamped without waiting for a claim to carry them.
    fn half(&self) -> usize {
        MAX_BATCH.min(self.capacity / 2).max(1)
    }

    /// Whether the producer shares the head of the queue with other processors.
    pub(crate) fn set_sharing(&self, sharing: bool) {
        self.sharing.store(sharing, Ordering::Relaxed);
    }

    /// No more outcomes will come: the completer stamps what is left and returns.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.ready.notify_one();
    }

    fn state(&self) -> (usize, Option<Instant>) {
        let pending = self.lock();
        (pending.changes.len(), pending.since)
    }
}

/// What the completer needs besides the outbox.
pub(crate) struct Completer {
    pub(crate) source: Arc<str>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) leases: Arc<Leases>,
    pub(crate) outbox: Arc<Outbox>,
    /// How long a failing stamp is retried before the lease is left to lapse.
    pub(crate) lease: Duration,
    /// Stamps that fail with an error that cannot heal stop the source's claims.
    pub(crate) trouble: Arc<health::Trouble>,
    /// `--until-idle`: such an error fails the run after a short retry.
    pub(crate) until_idle: bool,
    /// Cancelled when writing must end (shutdown's write deadline): what is not stamped
    /// by then is given up on, its lease left to lapse.
    pub(crate) writes_end: tokio_util::sync::CancellationToken,
    /// The source's wake-up, for [`wake_successors`].
    pub(crate) wake: Arc<Notify>,
}

impl Completer {
    /// Runs until the outbox is closed and everything in it is stamped.
    pub(crate) async fn run(self) {
        let this = Arc::new(self);
        let slots = Arc::new(Semaphore::new(STAMPS_IN_FLIGHT));
        let mut stamps = JoinSet::new();
        loop {
            let (waiting, since) = this.outbox.state();
            let closed = this.outbox.closed.load(Ordering::Acquire);
            if waiting == 0 {
                if closed {
                    break;
                }
                this.outbox.ready.notified().await;
                continue;
            }
            let wait = if this.outbox.sharing.load(Ordering::Relaxed) {
                FLUSH_AFTER_SHARING
            } else {
                FLUSH_AFTER
            };
            let due = since.map_or_else(Instant::now, |at| at + wait);
            let full = waiting >= this.outbox.half();
            if !full && !closed && Instant::now() < due {
                // Give the producer the chance to carry these with its next claim (while
                // sharing: a bigger batch).
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => {}
                    _ = this.outbox.ready.notified() => {}
                }
                continue;
            }
            let Ok(permit) = slots.clone().acquire_owned().await else {
                break;
            };
            let batch = this.outbox.take(MAX_BATCH);
            if batch.is_empty() {
                continue;
            }
            let this2 = this.clone();
            stamps.spawn(async move {
                this2.stamp(batch).await;
                drop(permit);
            });
            while stamps.try_join_next().is_some() {}
        }
        while stamps.join_next().await.is_some() {}
    }

    async fn stamp(&self, batch: Vec<SetState>) {
        let started = Instant::now();
        let mut health = health::Health::new(self.source.clone(), "stamp", self.until_idle);
        loop {
            if self.writes_end.is_cancelled() {
                self.give_up(&batch);
                break;
            }
            let params = CommandSetStateManyParams { changes: &batch };
            let call = self.backend.command_set_state_many(&params);
            let stamping = health::deadline(
                self.backend.as_ref(),
                health::call_deadline(self.backend.as_ref(), self.lease),
                "stamping outcomes",
                call,
            );
            let stamped = tokio::select! {
                stamped = stamping => stamped,
                () = self.writes_end.cancelled() => continue,
            };
            match stamped {
                Ok(stamped) => {
                    self.trouble.succeeded();
                    count(&self.source, &self.stats, &batch, stamped);
                    wake_successors(&self.outbox, &batch, &self.wake);
                    wake_limited(&self.outbox, &batch, &self.wake);
                    break;
                }
                Err(err) => {
                    self.trouble.failed(&err);
                    let heals = err.healing().heals();
                    // Once the source gave up, what cannot heal is tried once: the run is
                    // ending and the leases lapse anyway.
                    let pause = if !heals && self.trouble.gave_up() {
                        None
                    } else {
                        match health.failed(err) {
                            health::Next::RetryAfter(pause) => Some(pause),
                            health::Next::GiveUp(err) => {
                                self.trouble.give_up(err);
                                None
                            }
                        }
                    };
                    match pause {
                        Some(pause) if started.elapsed() + pause < self.lease => {
                            // A pause of zero means "waited already" to a role whose calls
                            // run side by side; a batch's retries follow one another.
                            let pause = pause.max(Duration::from_millis(100));
                            tokio::select! {
                                () = tokio::time::sleep(pause) => {}
                                () = self.writes_end.cancelled() => {}
                            }
                        }
                        _ => {
                            tracing::error!(
                                source = %self.source,
                                rows = batch.len(),
                                "could not stamp outcomes before their leases lapse; the rows will run again"
                            );
                            break;
                        }
                    }
                }
            }
        }
        settled(&self.leases, &self.outbox, &batch);
    }

    /// Shutdown's write deadline passed with `batch` not stamped.
    fn give_up(&self, batch: &[SetState]) {
        tracing::error!(
            source = %self.source,
            rows = batch.len(),
            "could not write outcomes before shutdown's deadline; their leases lapse and the rows run again"
        );
    }
}

/// After `batch` was stamped: when this processor has run rows with an order key and the
/// batch completed or dead-lettered rows, the producer is woken to claim at once, so the
/// next row of a key starts now rather than at the next poll. The stamp's commit is what
/// makes that row claimable, and a claim made in the same statement (PostgreSQL's
/// stamp-and-claim) cannot see it. Processors that never ran a keyed row skip this.
pub(crate) fn wake_successors(outbox: &Outbox, batch: &[SetState], wake: &Notify) {
    if outbox.ordered.load(Ordering::Relaxed)
        && batch
            .iter()
            .any(|c| matches!(c.change, StateChange::Completed | StateChange::Dead { .. }))
    {
        wake.notify_one();
    }
}

/// After the completer stamped `batch` on its own (outcomes that came while a limited
/// lane's claim was in flight, say): under a fleet-wide limit the leases it ended freed
/// places that no claim handed on. They are counted, for a claim that comes back held by
/// the limit, and the producer is woken to claim them now, not at its next look.
fn wake_limited(outbox: &Outbox, batch: &[SetState], wake: &Notify) {
    outbox
        .stamped_alone
        .fetch_add(batch.len() as u64, Ordering::AcqRel);
    if outbox.limited.load(Ordering::Relaxed) {
        wake.notify_one();
    }
}

/// After a batch was stamped (or given up on): its leases are no longer held and its
/// room in the outbox is free again.
pub(crate) fn settled(leases: &Leases, outbox: &Outbox, batch: &[SetState]) {
    leases.forget(batch.iter().map(|c| &c.lease));
    outbox.done(batch.len());
}

/// Updates the counters for a stamped batch. Stale stamps are rare; when some rows were
/// not stamped they are taken from the completions first for the counters.
pub(crate) fn count(source: &str, stats: &Stats, batch: &[SetState], stamped: u64) {
    let (mut completed, mut retried, mut dead, mut snoozed) = (0u64, 0u64, 0u64, 0u64);
    for change in batch {
        match change.change {
            StateChange::Completed => completed += 1,
            StateChange::Retry { .. } => retried += 1,
            StateChange::Dead { .. } => dead += 1,
            StateChange::Snooze { .. } => snoozed += 1,
            StateChange::Release { .. } => {}
        }
    }
    let mut stale = (batch.len() as u64).saturating_sub(stamped);
    if stale > 0 {
        stats.stale(stale);
        tracing::warn!(
            source,
            stale,
            "dropped stale outcomes: their leases had passed to another claim"
        );
        for counter in [&mut completed, &mut retried, &mut dead, &mut snoozed] {
            let taken = stale.min(*counter);
            *counter -= taken;
            stale -= taken;
        }
    }
    stats.succeeded(completed);
    stats.failed(retried);
    stats.dead_lettered(dead);
    stats.snoozed(snoozed);
}
