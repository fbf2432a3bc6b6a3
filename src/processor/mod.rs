//! The processor: for each source, a claim loop (the producer) that never claims more
//! rows than it has free execution slots, an executor per row, a completer that stamps
//! outcomes in batches, and a retention sweeper.
//!
//! Guarantees: a row runs only under a live lease; every outcome stamp is guarded by the
//! lease token; a failure, an error, a panic and a timeout each consume one attempt; an
//! unknown type is dead-lettered on its first attempt without running anything. On
//! shutdown the loop stops claiming, lets in-flight work finish within the grace period
//! and releases the leases of anything it did not finish.

mod completer;
pub mod retry;
pub mod stats;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::command::{CommandRow, LeaseToken};
use crate::engine::{Backend, ClaimParams, Failure, Lease};
use crate::error::Result;
use crate::handler::{HandlerError, Job, Registry, with_context};
use crate::settings::Settings;
use completer::{Outcome, Stamp};
pub use stats::{Stats, StatsSnapshot};

/// One source as the processor sees it.
#[derive(Clone)]
pub struct SourceHandle {
    /// The configured name (`ICQ_SOURCE`).
    pub name: Arc<str>,
    /// The engine driver.
    pub backend: Arc<dyn Backend>,
    /// How to process it.
    pub settings: Settings,
    /// Signalled when a command is scheduled (in-process or via LISTEN).
    pub wake: Arc<Notify>,
    /// Counters.
    pub stats: Arc<Stats>,
}

/// Options for a processor run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Return once nothing is due or running (later-scheduled rows do not count).
    pub until_idle: bool,
    /// How long in-flight commands may take to finish after shutdown is requested.
    pub shutdown_grace: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            until_idle: false,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Processes commands from one or more sources with one handler registry.
pub struct Processor {
    sources: Vec<SourceHandle>,
    registry: Arc<Registry>,
}

impl Processor {
    /// A processor running `registry`'s handlers.
    pub fn new(registry: Registry) -> Processor {
        Processor {
            sources: Vec::new(),
            registry: Arc::new(registry),
        }
    }

    /// Adds a source (see [`crate::Queue::source_handle`]).
    pub fn add_source(&mut self, source: SourceHandle) -> &mut Self {
        self.sources.push(source);
        self
    }

    /// The sources added so far.
    pub fn sources(&self) -> &[SourceHandle] {
        &self.sources
    }

    /// Runs every source until `shutdown` is cancelled (or, with `until_idle`, until each
    /// source is idle). Each source runs independently, so a burst on one cannot starve
    /// another.
    pub async fn run(&self, options: RunOptions, shutdown: CancellationToken) -> Result<()> {
        let mut tasks = JoinSet::new();
        for source in &self.sources {
            let worker = SourceWorker {
                source: source.clone(),
                registry: self.registry.clone(),
                options: options.clone(),
                shutdown: shutdown.clone(),
            };
            tasks.spawn(worker.run());
        }
        let mut first_error = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    shutdown.cancel();
                    first_error.get_or_insert(err);
                }
                Err(join) => {
                    shutdown.cancel();
                    first_error.get_or_insert(crate::Error::Usage(format!(
                        "a source worker crashed: {join}"
                    )));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// How long the claim loop waits for more slots to free up before claiming a small batch.
const REFILL_WAIT: Duration = Duration::from_millis(5);

struct SourceWorker {
    source: SourceHandle,
    registry: Arc<Registry>,
    options: RunOptions,
    shutdown: CancellationToken,
}

/// State shared by the claim loop and its executions.
struct Shared {
    source: SourceHandle,
    registry: Arc<Registry>,
    outcomes: mpsc::UnboundedSender<Stamp>,
    outstanding: Arc<AtomicUsize>,
    running: Mutex<HashSet<Lease>>,
}

impl SourceWorker {
    async fn run(self) -> Result<()> {
        let src = &self.source;
        let name = src.name.clone();
        let settings = &src.settings;
        match src.backend.listen(src.wake.clone()).await {
            Ok(true) => tracing::debug!(source = %name, "listening for inserts"),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(source = %name, error = %err, "cannot LISTEN; relying on polling")
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let outstanding = Arc::new(AtomicUsize::new(0));
        let completer = tokio::spawn(completer::run(
            name.clone(),
            src.backend.clone(),
            rx,
            src.stats.clone(),
            outstanding.clone(),
        ));
        let sweeper = tokio::spawn(sweep_loop(src.clone(), self.shutdown.clone()));
        let shared = Arc::new(Shared {
            source: src.clone(),
            registry: self.registry.clone(),
            outcomes: tx,
            outstanding: outstanding.clone(),
            running: Mutex::new(HashSet::new()),
        });
        let slots = Arc::new(Semaphore::new(settings.concurrency as usize));
        let mut in_flight: JoinSet<()> = JoinSet::new();
        let mut claim_now = true;
        let mut db_pause = Duration::from_millis(200);
        // Refilling one freed slot at a time costs a claim statement per row; when only a
        // few slots are free, wait briefly for more so claims stay batched.
        let worthwhile = settings
            .batch_size
            .min(settings.concurrency)
            .div_ceil(2)
            .max(1);
        let mut waited_for_refill = false;

        loop {
            while in_flight.try_join_next().is_some() {}
            if self.shutdown.is_cancelled() {
                break;
            }
            if claim_now {
                let free = slots.available_permits() as u32;
                if free == 0 {
                    tokio::select! {
                        _ = in_flight.join_next() => {}
                        _ = self.shutdown.cancelled() => {}
                    }
                    continue;
                }
                if free < worthwhile && !in_flight.is_empty() && !waited_for_refill {
                    waited_for_refill = true;
                    tokio::select! {
                        _ = tokio::time::sleep(REFILL_WAIT) => {}
                        _ = self.shutdown.cancelled() => {}
                    }
                    continue;
                }
                waited_for_refill = false;
                let limit = free.min(settings.batch_size);
                let params = ClaimParams {
                    limit,
                    lease: settings.lease(),
                    processing_delay: Duration::from_secs(settings.processing_delay_seconds),
                    token: LeaseToken::new(),
                };
                match src.backend.command_claim(&params).await {
                    Ok(rows) => {
                        db_pause = Duration::from_millis(200);
                        let claimed = rows.len() as u32;
                        src.stats.claimed(u64::from(claimed));
                        for row in rows {
                            let Ok(permit) = slots.clone().try_acquire_owned() else {
                                // Cannot happen: only this loop takes permits.
                                release(&shared, &[lease_of(&row, params.token)]).await;
                                continue;
                            };
                            let lease = lease_of(&row, params.token);
                            lock(&shared.running).insert(lease);
                            let shared = shared.clone();
                            in_flight.spawn(async move {
                                execute(&shared, row, lease).await;
                                drop(permit);
                            });
                        }
                        claim_now = claimed == limit;
                        if claim_now {
                            continue;
                        }
                    }
                    Err(err) => {
                        tracing::warn!(source = %name, error = %err, retry_in_ms = db_pause.as_millis() as u64, "claim failed; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(db_pause) => {}
                            _ = self.shutdown.cancelled() => {}
                        }
                        db_pause = (db_pause * 2).min(Duration::from_secs(30));
                        continue;
                    }
                }
            }
            if self.options.until_idle
                && in_flight.is_empty()
                && outstanding.load(Ordering::Acquire) == 0
            {
                match src.backend.activity().await {
                    Ok(activity) if activity.due == 0 && activity.running == 0 => break,
                    Ok(activity) if activity.due > 0 => {
                        // Due but not claimable yet (processing delay) or taken by a
                        // racing replica: look again shortly.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        claim_now = true;
                        continue;
                    }
                    Ok(_) => {}
                    Err(err) => {
                        tracing::warn!(source = %name, error = %err, "cannot count due commands")
                    }
                }
            }
            let poll = if self.options.until_idle && in_flight.is_empty() {
                settings.polling_interval().min(Duration::from_millis(250))
            } else {
                settings.polling_interval()
            };
            tokio::select! {
                _ = src.wake.notified() => claim_now = true,
                _ = tokio::time::sleep(poll) => claim_now = true,
                _ = self.shutdown.cancelled() => {}
                Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            }
        }

        // Shutdown: stop claiming, give in-flight work its grace period, then release the
        // leases of whatever did not finish so another replica can take it at once.
        if !in_flight.is_empty() {
            tracing::info!(source = %name, in_flight = in_flight.len(), "waiting for in-flight commands");
            let drained = tokio::time::timeout(self.options.shutdown_grace, async {
                while in_flight.join_next().await.is_some() {}
            })
            .await;
            if drained.is_err() {
                in_flight.abort_all();
                while in_flight.join_next().await.is_some() {}
            }
        }
        let unfinished: Vec<Lease> = lock(&shared.running).drain().collect();
        if !unfinished.is_empty() {
            tracing::warn!(source = %name, count = unfinished.len(), "releasing leases of unfinished commands");
            release(&shared, &unfinished).await;
        }
        drop(shared);
        let _ = completer.await;
        sweeper.abort();
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn lease_of(row: &CommandRow, token: LeaseToken) -> Lease {
    Lease {
        id: row.id,
        token: row.lock_token.unwrap_or(token),
    }
}

async fn release(shared: &Shared, leases: &[Lease]) {
    if let Err(err) = shared.source.backend.command_release_many(leases).await {
        tracing::warn!(source = %shared.source.name, error = %err, "could not release leases; they expire on their own");
    }
}

/// Runs one claimed row and hands its outcome to the completer.
async fn execute(shared: &Shared, row: CommandRow, lease: Lease) {
    let settings = &shared.source.settings;
    let attempts = u32::try_from(row.attempts).unwrap_or(0).max(1);
    let lease_until = row
        .locked_until
        .unwrap_or_else(|| Utc::now() + chrono::Duration::seconds(settings.lease_seconds as i64));
    let started = std::time::Instant::now();
    let result = if attempts > settings.max_attempts {
        Err(HandlerError::terminal(format!(
            "gave up after {} attempts: the last lease expired without an outcome (the processor \
             crashed or was killed during execution)",
            attempts - 1
        )))
    } else {
        match shared.registry.get(&row.type_name) {
            None => Err(HandlerError::terminal(format!(
                "no handler is registered for command type `{}`",
                row.type_name
            ))),
            Some(handler) => {
                let job = Job {
                    id: row.id,
                    type_name: row.type_name.clone(),
                    payload: row.payload.clone(),
                    attempt: attempts,
                    source: shared.source.name.clone(),
                    context: row.context(),
                };
                let handler = handler.clone();
                let context = job.context.clone();
                // A task of its own, so a panic is caught and counted as a failed attempt.
                match tokio::spawn(with_context(
                    context,
                    async move { handler.handle(job).await },
                ))
                .await
                {
                    Ok(result) => result,
                    Err(join) if join.is_panic() => Err(HandlerError::retry(format!(
                        "handler panicked: {}",
                        panic_message(join.into_panic())
                    ))),
                    Err(join) => Err(HandlerError::retry(format!(
                        "handler was cancelled: {join}"
                    ))),
                }
            }
        }
    };
    let label = match &result {
        Ok(()) => "succeeded",
        Err(err) if err.terminal => "terminal",
        Err(_) => "failed",
    };
    shared
        .source
        .stats
        .execution(&row.type_name, label, started.elapsed().as_secs_f64());
    let outcome = match result {
        Ok(()) => Outcome::Completed(lease),
        Err(err) => {
            let retry_in = if err.terminal || attempts >= settings.max_attempts {
                None
            } else {
                Some(retry::backoff(
                    attempts,
                    settings.retry_backoff_base_seconds,
                    settings.max_retry_backoff_seconds,
                    &mut rand::rng(),
                ))
            };
            Outcome::Failed(Failure {
                lease,
                error: err.message,
                retry_in,
            })
        }
    };
    shared.outstanding.fetch_add(1, Ordering::AcqRel);
    lock(&shared.running).remove(&lease);
    if shared
        .outcomes
        .send(Stamp {
            outcome,
            lease_until,
        })
        .is_err()
    {
        shared.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}

/// Every `cleanup_interval_hours`, deletes completed rows older than `retention_days` in
/// batches of 1000, one short statement each.
async fn sweep_loop(source: SourceHandle, shutdown: CancellationToken) {
    const BATCH: u32 = 1000;
    loop {
        let mut deleted = 0u64;
        loop {
            match source
                .backend
                .completed_delete_batch(source.settings.retention(), BATCH)
                .await
            {
                Ok(n) => {
                    deleted += n;
                    if n < u64::from(BATCH) || shutdown.is_cancelled() {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                Err(err) => {
                    tracing::warn!(source = %source.name, error = %err, "retention sweep failed");
                    break;
                }
            }
        }
        if deleted > 0 {
            tracing::info!(source = %source.name, deleted, "retention sweep deleted completed commands");
        }
        tokio::select! {
            _ = tokio::time::sleep(source.settings.cleanup_interval()) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
