//! The producer: claims rows for the execution slots into a local buffer, so a slot that
//! frees up takes its next row from memory.
//!
//! The rule is River's: a lane holds (running, buffered and being claimed) at most its
//! `concurrency` slots plus the source's `prefetch`, and claims whatever of that is free,
//! at most `batch_size` rows a claim, up to the engine's
//! [`crate::engine::QueueOps::claims_in_flight`] claims at once. Slow commands therefore
//! hold only what their slots run plus `prefetch` (a killed replica charges an attempt to
//! little more than that, and idle replicas get the rest), while fast ones find the next
//! rows already buffered.
//!
//! A claim that returns rows is followed by another as soon as there is room (a short
//! claim under `SKIP LOCKED` contention does not mean the table is empty); an empty one
//! waits for a wake-up (an in-process schedule, a PostgreSQL NOTIFY) or the polling
//! interval. Buffered rows are leased like running ones and renewed alike; on shutdown
//! they are released at once with their attempt given back.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Buffered, RunOptions, Shared, health};
use crate::command::LeaseToken;
use crate::engine::{ClaimParams, ClaimedRow};
use crate::error::Result;

/// The most rows one lane holds: its slots plus the prefetch. Sizes the completer's outbox.
pub(crate) fn buffer_capacity(concurrency: u32, prefetch: u32) -> usize {
    concurrency as usize + prefetch as usize
}

/// `until_idle`: the first wait before counting again when other processors still hold
/// due or running rows; it doubles up to the polling interval.
const IDLE_RECHECK_FIRST: Duration = Duration::from_millis(10);

/// How often a lane the source's idle poll claims for polls on its own anyway.
const IDLE_LANE_POLL: Duration = Duration::from_secs(24 * 3600);

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
    idle: Option<(Arc<super::idle::IdleLanes>, usize)>,
) -> Result<Stopped> {
    let settings = &shared.source.settings;
    let batch = settings.batch_size.max(1) as usize;
    let slots = shared.lane.concurrency.max(1);
    let in_flight = shared.lane.claims_in_flight.max(1);
    let most = buffer_capacity(slots as u32, settings.prefetch);
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
    // `until_idle` with work still due or running elsewhere (another replica's claim in
    // flight, its last rows running): look again soon, then less often. The wall time of a
    // fleet's drain ends with its last replica's exit, so a fixed wait here was paid by
    // every drain shared with other replicas.
    let mut idle_recheck = IDLE_RECHECK_FIRST;

    let stopped = loop {
        if shutdown.is_cancelled() {
            break Stopped::Shutdown;
        }
        // Outcomes or leases that cannot be written: claim nothing that would run again.
        let mut trouble_changed = std::pin::pin!(shared.trouble.changed());
        trouble_changed.as_mut().enable();
        if let Some(err) = shared.trouble.take_fatal() {
            gave_up = Some(err);
            break Stopped::Shutdown;
        }
        let held_until = shared.trouble.holds_claims_until();
        while want && held_until.is_none() && claims.len() < in_flight {
            let held = shared.active.load(Ordering::Acquire)
                + shared.buffered.load(Ordering::Acquire)
                + reserved;
            let room = most.saturating_sub(held).min(batch);
            if room == 0 {
                break;
            }
            reserved += room;
            claims.push(claim(&shared, room as u32));
        }
        // `until_idle` counts what is left once this processor holds no lease; while its
        // last rows are still being stamped it waits for that, not for the polling
        // interval (a quarter of a second at the end of half the drains).
        let mut leases_emptied = std::pin::pin!(shared.leases.emptied());
        leases_emptied.as_mut().enable();
        let waiting_for_own =
            !want && claims.is_empty() && options.until_idle && held_until.is_none();
        if waiting_for_own && shared.leases.len() == 0 {
            let counting = idle_activity(&shared, shared.lane.queues.as_deref());
            let counted = tokio::select! {
                counted = counting => counted,
                () = shutdown.cancelled() => continue,
            };
            match counted {
                Ok(activity) if activity.due == 0 && activity.running == 0 => {
                    // This lane's queue is idle; the drain ends only when every queue the
                    // source serves is (a retry may come due here while another lane
                    // still waits for a lease to end).
                    let others = match &shared.lane.served {
                        Some(served) if served.len() > 1 => {
                            idle_activity(&shared, Some(served)).await
                        }
                        _ => Ok(activity),
                    };
                    match others {
                        Ok(all) if all.due == 0 && all.running == 0 => break Stopped::Idle,
                        Ok(_) => {
                            // Look again (and claim: a retry here may have come due) soon.
                            next_poll = next_poll.min(Instant::now() + idle_recheck);
                            idle_recheck = (idle_recheck * 2).min(poll);
                        }
                        Err(err) => {
                            tracing::warn!(source = %shared.source.name, error = %err, "cannot count due commands")
                        }
                    }
                }
                Ok(activity) if activity.due > 0 => {
                    // Due but not claimable yet (processing delay) or taken by a racing
                    // replica: look again shortly.
                    tokio::select! {
                        _ = tokio::time::sleep(idle_recheck) => {}
                        _ = shutdown.cancelled() => {}
                    }
                    idle_recheck = (idle_recheck * 2).min(poll);
                    want = true;
                    continue;
                }
                Ok(_) => {
                    // Running on another processor: its outcome ends the drain.
                    next_poll = next_poll.min(Instant::now() + idle_recheck);
                    idle_recheck = (idle_recheck * 2).min(poll);
                }
                Err(err) => {
                    tracing::warn!(source = %shared.source.name, queue = shared.lane.name.as_deref().unwrap_or("*"), error = %err, "cannot count due commands")
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
                        if want {
                            idle_recheck = IDLE_RECHECK_FIRST;
                        } else if let Some((idle, index)) = &idle {
                            // The source's idle poll claims for this lane from now on.
                            idle.set_idle(*index);
                            next_poll = Instant::now() + IDLE_LANE_POLL;
                        } else {
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
            _ = &mut leases_emptied, if waiting_for_own => {}
            _ = wake.notified() => want = true,
            _ = tokio::time::sleep_until(next_poll), if !want => {
                want = true;
                next_poll = Instant::now() + poll;
            }
            _ = &mut trouble_changed => {}
            _ = tokio::time::sleep_until(held_until.unwrap_or(next_poll)), if held_until.is_some() => {}
            _ = shutdown.cancelled() => {}
        }
    };
    // Claims already sent still lease their rows: buffer them, so shutdown releases them
    // (not for long after a hard stop: a claim that cannot answer leases nothing).
    let hard_stop = options.hard_stop.clone();
    let abandon = async move {
        hard_stop.cancelled().await;
        tokio::time::sleep(super::HARD_STOP_WRITES).await;
    };
    tokio::pin!(abandon);
    loop {
        let next = tokio::select! {
            next = claims.next() => next,
            () = &mut abandon => None,
        };
        let Some((result, _)) = next else { break };
        if let Ok(rows) = result {
            shared.source.stats.claimed(rows.len() as u64);
            buffer(&shared, rows);
        }
    }
    gave_up.map_or(Ok(stopped), Err)
}

/// A claim's rows (each with the instant its lease lapses at the latest) and the limit it
/// asked for.
type ClaimOutcome = (Result<Vec<(ClaimedRow, Instant)>>, u32);

/// One claim of up to `limit` rows, each with the instant its lease lapses at the latest.
async fn claim(shared: &Shared, limit: u32) -> ClaimOutcome {
    let settings = &shared.source.settings;
    let params = ClaimParams {
        limit,
        lease: settings.lease(),
        processing_delay: Duration::from_secs(settings.processing_delay_seconds),
        token: LeaseToken::owned_by(shared.owner),
        types: shared.types.clone(),
        queues: shared.lane.queues.clone(),
        spread: false,
    };
    let expires = Instant::now() + params.lease;
    let deadline = health::call_deadline(params.lease);
    let claiming = shared.source.backend.command_claim(&params);
    let result = health::deadline(deadline, "claiming", claiming).await;
    (
        result.map(|rows| rows.into_iter().map(|row| (row, expires)).collect()),
        limit,
    )
}

pub(crate) fn buffer(shared: &Arc<Shared>, mut rows: Vec<(ClaimedRow, Instant)>) {
    // A claim takes the best rows, but a statement's returned rows come in no particular
    // order: the slots take them in claim order (`Priority`, then `RunAt`; a stable sort
    // keeps the statement's order for ties).
    rows.sort_by_key(|(claimed, _)| (claimed.row.priority, claimed.row.run_at));
    for (claimed, expires) in rows {
        let stopper = shared.leases.hold(&claimed.lease, expires);
        shared.buffered.fetch_add(1, Ordering::SeqCst);
        if shared
            .buffer_tx
            .send(Buffered { claimed, stopper })
            .is_err()
        {
            shared.buffered.fetch_sub(1, Ordering::AcqRel);
        }
    }
    super::executor::ensure_slots(shared);
}

/// What `--until-idle` waits for: due and running rows, only of the types this worker
/// claims when `claim_only_handled_types` is on (the others wait for the worker that has
/// their handler, and must not keep this one running).
///
/// `queues` limits the count (`QueueOps::activity_in`): a lane counts its own queue, then
/// every queue its source serves, so rows of queues this worker does not serve never keep
/// it running.
async fn idle_activity(
    shared: &Shared,
    queues: Option<&[String]>,
) -> crate::error::Result<crate::engine::Activity> {
    let limit = health::call_deadline(shared.source.settings.lease());
    let backend = &shared.source.backend;
    let Some(types) = &shared.types else {
        let counting = backend.activity_in(queues);
        return health::deadline(limit, "counting due commands", counting).await;
    };
    let params = crate::engine::admin::StateCountParams {
        by_type: true,
        by_queue: queues.is_some(),
        ..Default::default()
    };
    let counting = backend.state_count(&params);
    let counts = health::deadline(limit, "counting due commands", counting).await?;
    let mut activity = crate::engine::Activity::default();
    for count in counts {
        let in_lane = match (queues, count.queue.as_deref()) {
            (Some(mine), Some(queue)) => mine.iter().any(|q| q == queue),
            _ => true,
        };
        if in_lane
            && count
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
