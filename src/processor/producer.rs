//! The producer: claims due rows ahead of the execution slots into a bounded local
//! buffer, so a slot that frees up takes its next row from memory instead of waiting on
//! a round trip.
//!
//! Each claim asks for `batch_size` rows, and up to the engine's
//! [`crate::engine::QueueOps::claims_in_flight`] claims run
//! at once while the buffer has room for them, so at least one claim is in flight while
//! the buffer drains. A claim that returns rows is followed by another at once (a short
//! claim under `SKIP LOCKED` contention does not mean the table is empty); an empty one
//! waits for a wake-up (an in-process schedule, a PostgreSQL NOTIFY) or the polling
//! interval. Outcomes waiting in the completer's outbox are stamped by the same
//! statement as the next claim. Buffered rows are leased like running ones and renewed
//! alike; on shutdown they are released at once with their attempt given back.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Buffered, RunOptions, Shared, completer, health};
use crate::command::LeaseToken;
use crate::engine::CommandSetStateAndClaimParams;
use crate::engine::{ClaimParams, ClaimedRow};
use crate::error::Result;

/// Rows the buffer holds: enough for every claim in flight, never fewer than the slots.
pub(crate) fn buffer_capacity(batch_size: u32, concurrency: u32, claims: usize) -> usize {
    (batch_size as usize * claims).max(concurrency as usize)
}

/// Why the producer stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// Shutdown was requested.
    Shutdown,
    /// `until_idle`: nothing is due or running any more.
    Idle,
}

/// Claims until shutdown (or, with `until_idle`, until the source is idle).
pub(crate) async fn run(
    shared: Arc<Shared>,
    options: RunOptions,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) -> Result<Stopped> {
    let settings = &shared.source.settings;
    let batch = settings.batch_size.max(1);
    let in_flight = shared.source.backend.claims_in_flight().max(1);
    let capacity = buffer_capacity(batch, settings.concurrency, in_flight);
    let poll = if options.until_idle {
        settings.polling_interval().min(Duration::from_millis(250))
    } else {
        settings.polling_interval()
    };
    let mut claims = FuturesUnordered::new();
    let mut reserved = 0usize;
    let mut want = true;
    let mut next_poll = Instant::now() + poll;
    let mut db_health =
        health::Health::new(shared.source.name.clone(), "claim", options.until_idle);
    let mut gave_up = None;

    let stopped = loop {
        if shutdown.is_cancelled() {
            break Stopped::Shutdown;
        }
        while want
            && claims.len() < in_flight
            && shared.buffered.load(Ordering::Acquire) + reserved + batch as usize <= capacity
        {
            reserved += batch as usize;
            claims.push(claim(&shared, batch));
        }
        if !want && claims.is_empty() && options.until_idle && shared.leases.len() == 0 {
            match idle_activity(&shared).await {
                Ok(activity) if activity.due == 0 && activity.running == 0 => {
                    break Stopped::Idle;
                }
                Ok(activity) if activity.due > 0 => {
                    // Due but not claimable yet (processing delay) or taken by a racing
                    // replica: look again shortly.
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        _ = shutdown.cancelled() => {}
                    }
                    want = true;
                    continue;
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(source = %shared.source.name, error = %err, "cannot count due commands")
                }
            }
        }
        tokio::select! {
            Some((result, limit)) = claims.next(), if !claims.is_empty() => {
                reserved -= limit as usize;
                match result {
                    Ok(rows) => {
                        let claimed = rows.len();
                        db_health.succeeded(claimed > 0);
                        shared.source.stats.claimed(claimed as u64);
                        buffer(&shared, rows);
                        want = claimed > 0;
                        if !want {
                            next_poll = Instant::now() + poll;
                        }
                    }
                    Err(err) => {
                        let pause = match db_health.failed(err) {
                            health::Next::RetryAfter(pause) => pause,
                            health::Next::GiveUp(err) => {
                                gave_up = Some(err);
                                break Stopped::Shutdown;
                            }
                        };
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = shutdown.cancelled() => {}
                        }
                        want = true;
                    }
                }
            }
            _ = shared.space.notified(), if want => {}
            _ = wake.notified() => want = true,
            _ = tokio::time::sleep_until(next_poll), if !want => {
                want = true;
                next_poll = Instant::now() + poll;
            }
            _ = shutdown.cancelled() => {}
        }
    };
    // Claims already sent still lease their rows: buffer them, so shutdown releases them.
    while let Some((result, _)) = claims.next().await {
        if let Ok(rows) = result {
            shared.source.stats.claimed(rows.len() as u64);
            buffer(&shared, rows);
        }
    }
    gave_up.map_or(Ok(stopped), Err)
}

type ClaimOutcome = (Result<Vec<(ClaimedRow, Instant)>>, u32);

/// One claim of up to `limit` rows, each with the instant its lease lapses at the latest.
async fn claim(shared: &Shared, limit: u32) -> ClaimOutcome {
    let settings = &shared.source.settings;
    let params = ClaimParams {
        limit,
        lease: settings.lease(),
        processing_delay: Duration::from_secs(settings.processing_delay_seconds),
        token: LeaseToken::new(),
        types: shared.types.clone(),
    };
    // Outcomes waiting to be stamped ride along: one round trip, one commit.
    let stamps = shared.outbox.take(completer::MAX_BATCH);
    let sent = Instant::now();
    let expires = sent + params.lease;
    let backend = &shared.source.backend;
    let limit_call = health::call_deadline(params.lease);
    let result = if stamps.is_empty() {
        health::deadline(limit_call, "claiming", backend.command_claim(&params)).await
    } else {
        let both = CommandSetStateAndClaimParams {
            changes: &stamps,
            claim: &params,
        };
        let call = backend.command_set_state_and_claim(&both);
        match health::deadline(limit_call, "stamping and claiming", call).await {
            Ok((stamped, rows)) => {
                completer::count(&shared.source.name, &shared.source.stats, &stamps, stamped);
                completer::settled(&shared.leases, &shared.outbox, &stamps);
                Ok(rows)
            }
            Err(err) => {
                // The completer retries them on its own.
                shared.outbox.put(stamps);
                Err(err)
            }
        }
    };
    (
        result.map(|rows| rows.into_iter().map(|row| (row, expires)).collect()),
        limit,
    )
}

fn buffer(shared: &Shared, rows: Vec<(ClaimedRow, Instant)>) {
    for (claimed, expires) in rows {
        let cancel = shared.leases.hold(&claimed.lease, expires);
        shared.buffered.fetch_add(1, Ordering::AcqRel);
        if shared.buffer_tx.send(Buffered { claimed, cancel }).is_err() {
            shared.buffered.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// What `--until-idle` waits for: due and running rows, only of the types this worker
/// claims when `claim_only_handled_types` is on (the others wait for the worker that has
/// their handler, and must not keep this one running).
async fn idle_activity(shared: &Shared) -> crate::error::Result<crate::engine::Activity> {
    let limit = health::call_deadline(shared.source.settings.lease());
    let backend = &shared.source.backend;
    let Some(types) = &shared.types else {
        return health::deadline(limit, "counting due commands", backend.activity()).await;
    };
    let params = crate::engine::admin::StateCountParams { by_type: true };
    let counting = backend.state_count(&params);
    let counts = health::deadline(limit, "counting due commands", counting).await?;
    let mut activity = crate::engine::Activity::default();
    for count in counts {
        if count
            .type_name
            .as_deref()
            .is_some_and(|t| types.iter().any(|mine| mine == t))
        {
            activity.due += count.due;
            activity.running += count.running;
        }
    }
    Ok(activity)
}
