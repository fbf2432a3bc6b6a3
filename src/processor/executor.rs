//! The executor: runs claimed rows, one at a time per execution slot, and turns each
//! into exactly one stamp for the completer.
//!
//! The executor owns the handler's future. Asked to stop (an operator cancelled the row,
//! its lease was lost, the shutdown grace ran out), it fires the job's
//! [`cancellation`](crate::Job::cancellation) (an exec handler's process group gets
//! SIGTERM) and gives the handler [`STOP_GRACE`] to return; killed (its lease is about to
//! lapse, a hard stop) or past that grace, it drops the future, which kills an exec
//! handler's whole process group, so no handler keeps running once its lease can pass to
//! another worker. A stopped execution is released with its attempt given back, unless
//! its lease is gone, when nothing is stamped (the token guard would drop it) and it is
//! counted as cancelled. A row that cannot run — undecodable columns, no handler, past
//! `max_attempts` — is dead-lettered on its own without running anything; a panic, an
//! error and a timeout each consume one attempt.
//!
//! A snooze ([`HandlerError::snooze`], exec exit 75, http 429/503) is stamped as
//! [`StateChange::Snooze`]: the attempt is given back and `LastError` kept. The snooze
//! that would take a row past `max_snoozes` dead-letters it instead, a delay longer than
//! [`MAX_SNOOZE`] fails the attempt like an error, saying why, and one shorter than
//! [`MIN_SNOOZE`] (zero included) waits [`MIN_SNOOZE`].
//!
//! `Attempts` written by another program is taken at its word only when it is a count:
//! NULL, a value outside `i32` (decoding defects) and a negative count are dead-lettered
//! with the reason instead of granting extra attempts, and a count already beyond
//! `max_attempts` says so rather than blaming a crash. The payload moves from the claimed
//! row into the [`Job`] (never copied), so the executor holds each payload once.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use super::{Buffered, Shared, retry};
use crate::engine::{SetState, StateChange};
use crate::handler::{HandlerError, Job, MAX_SNOOZE, MIN_SNOOZE, STOP_GRACE, with_context};

/// How long an execution slot waits for a row before it ends: slots are started as rows
/// arrive (up to the lane's `concurrency`, see [`ensure_slots`]), so an idle lane holds
/// none and a configured concurrency costs nothing until work fills it.
const SLOT_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts execution slots until there are as many as the rows running and buffered, at
/// most the lane's `concurrency`. The producer calls it after buffering rows.
pub(crate) fn ensure_slots(shared: &Arc<Shared>) {
    let concurrency = shared.lane.concurrency.max(1);
    let wanted = (shared.active.load(Ordering::SeqCst) + shared.buffered.load(Ordering::SeqCst))
        .min(concurrency);
    loop {
        let live = shared.slots_live.load(Ordering::SeqCst);
        if live >= wanted {
            return;
        }
        if shared
            .slots_live
            .compare_exchange(live, live + 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let (slots, stop) = (shared.slots.clone(), shared.stop_taking.clone());
            let mut slots = slots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Slots that ended are reaped here, so the set grows with the slots alive.
            while slots.try_join_next().is_some() {}
            slots.spawn(slot(shared.clone(), stop));
        }
    }
}

/// One execution slot: takes buffered rows until `stop` is cancelled or none came for
/// [`SLOT_IDLE`], then returns.
pub(crate) async fn slot(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let next = {
            let mut buffer = shared.buffer_rx.lock().await;
            tokio::select! {
                biased;
                _ = stop.cancelled() => None,
                item = tokio::time::timeout(SLOT_IDLE, buffer.recv()) => Some(item),
            }
        };
        let item = match next {
            None | Some(Ok(None)) => {
                shared.slots_live.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            Some(Ok(Some(item))) => item,
            Some(Err(_idle)) => {
                // Ends, unless a row arrived as it decided to: the producer counts the
                // slots after buffering a row, this slot counts the rows after leaving.
                shared.slots_live.fetch_sub(1, Ordering::SeqCst);
                let concurrency = shared.lane.concurrency.max(1);
                let live = shared.slots_live.load(Ordering::SeqCst);
                if shared.buffered.load(Ordering::SeqCst) > 0
                    && !stop.is_cancelled()
                    && live < concurrency
                    && shared
                        .slots_live
                        .compare_exchange(live, live + 1, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    continue;
                }
                return;
            }
        };
        let taken_at = Instant::now();
        shared.active.fetch_add(1, Ordering::AcqRel);
        shared.buffered.fetch_sub(1, Ordering::AcqRel);
        shared
            .buffered_bytes
            .fetch_sub(item.claimed.payload_bytes, Ordering::AcqRel);
        if item.claimed.row.order_key.is_some() {
            shared.outbox.ordered.store(true, Ordering::Relaxed);
        }
        let change = execute(&shared, item).await;
        if shared.leases.is_lost(&change.lease) {
            // Cancelled by an operator (or taken by another claim): the token guard would
            // drop any stamp, so none is sent; counted, and logged once by the lease check.
            if shared.leases.is_taken(&change.lease) {
                shared.source.stats.stale(1);
            } else {
                shared.source.stats.cancelled(1);
            }
            shared.leases.forget(std::iter::once(&change.lease));
        } else {
            shared.leases.finished(&change.lease);
            shared.outbox.push(change).await;
        }
        let busy = u64::try_from(taken_at.elapsed().as_micros()).unwrap_or(u64::MAX);
        shared.busy_micros.fetch_add(busy, Ordering::Relaxed);
        shared.finished.fetch_add(1, Ordering::Relaxed);
        shared.active.fetch_sub(1, Ordering::AcqRel);
        shared.space.notify_one();
    }
}

/// Runs one buffered row and says what to stamp.
pub(crate) async fn execute(shared: &Shared, item: Buffered) -> SetState {
    let Buffered { claimed, stopper } = item;
    let mut row = claimed.row;
    let payload = std::mem::take(&mut row.payload);
    let context = row.take_context();
    let not_due_for = claimed.not_due_for;
    let lease = claimed.lease;
    let settings = &shared.source.settings;
    let release = |lease| SetState {
        lease,
        change: StateChange::Release { run_in: None },
    };
    if stopper.is_stopped() {
        return release(lease);
    }
    // The claim counts an attempt only on a count in 0..i32::MAX-1, so a negative count
    // arrives as stored (and is refused below rather than granting extra attempts).
    let stored_attempts = row.attempts;
    let attempts = u32::try_from(row.attempts).unwrap_or(0).max(1);
    // The attempt's entry in `Errors`, after the entries the claim read: the row is leased
    // to this processor, so nobody else writes them meanwhile.
    let stored_errors = row.errors.clone();
    let errors_after = |error: &str| {
        Some(crate::attempts::append(
            stored_errors.as_deref(),
            attempts,
            chrono::Utc::now(),
            error,
        ))
    };
    let dead = |error: String| {
        tracing::warn!(
            source = %shared.source.name,
            id = %row.id,
            r#type = %row.type_name.escape_debug(),
            attempts,
            reason = %crate::redact::bounded(&error, 1024).escape_debug(),
            "command dead-lettered"
        );
        StateChange::Dead {
            errors: errors_after(&error),
            error,
        }
    };
    if let Some(defects) = row.defect_summary() {
        return SetState {
            change: dead(defects),
            lease,
        };
    }
    if stored_attempts < 0 {
        let error = format!(
            "row cannot be processed: column Attempts: {stored_attempts} is negative (an attempt \
             count is 0 or more); icq does not guess how many attempts are left, so it did not run \
             the command (set Attempts to 0 and requeue it to run it)"
        );
        return SetState {
            change: dead(error),
            lease,
        };
    }
    if attempts > settings.max_attempts.saturating_add(1) {
        let error = format!(
            "not run: Attempts is {attempts} with this claim, beyond max_attempts ({}); the row \
             was written or left with more attempts than this source grants, not used up by \
             this processor",
            settings.max_attempts
        );
        return SetState {
            change: dead(error),
            lease,
        };
    }
    if attempts > settings.max_attempts {
        let error = format!(
            "gave up after {} attempts: the last lease expired without an outcome (the processor \
             crashed or was killed during execution)",
            attempts - 1
        );
        return SetState {
            change: dead(error),
            lease,
        };
    }
    let Some(handler) = shared.registry.get(&row.type_name) else {
        let error = format!(
            "no handler is registered for command type `{}`",
            row.type_name
        );
        return SetState {
            change: dead(error),
            lease,
        };
    };
    if shared.source.pauses.is_paused(&row.queue) {
        // Claimed before the pause was seen here, or the queue was resumed since the last
        // read (the claim's own look in the database said so): either way the watch reads
        // again at once, so a resumed queue's row comes straight back. After the checks
        // above: a row that cannot run is dead-lettered paused or not (a release would
        // not change what makes the claim pick it, and would reset a refused attempt count).
        tracing::debug!(source = %shared.source.name, id = %row.id,
            queue = %row.queue.escape_debug(), "the row's queue is paused: released, not started");
        shared.source.pauses.changed.notify_one();
        return release(lease);
    }
    if let Some(run_in) = not_due_for {
        return SetState {
            lease,
            change: StateChange::Release {
                run_in: Some(run_in),
            },
        };
    }
    let cancellation = CancellationToken::new();
    let job = Job {
        id: row.id.clone(),
        type_name: row.type_name.clone(),
        payload,
        attempt: attempts,
        source: shared.source.name.clone(),
        context,
        cancellation: cancellation.clone(),
    };
    let task_context = job.context.clone();
    let id_text = row.id.to_string();
    let execution = crate::otel::Execution {
        source: &shared.source.name,
        queue: &row.queue,
        type_name: &row.type_name,
        id: &id_text,
        attempt: attempts,
        trace_parent: row.trace_parent.as_deref(),
    };
    let span = crate::otel::execution_span(&execution);
    let started = Instant::now();
    shared.leases.set_running(&lease, true);
    // The execution (and its borrow of the span) ends with this block.
    let outcome = {
        let running = tracing::Instrument::instrument(
            AssertUnwindSafe(crate::otel::in_execution(
                &span,
                with_context(task_context, handler.handle(job)),
            ))
            .catch_unwind(),
            span.clone(),
        );
        tokio::pin!(running);
        // Asked to stop, the handler sees its cancellation fire and has STOP_GRACE to return;
        // killed (a lapsing lease, a hard stop), it is dropped at once.
        tokio::select! {
            biased;
            _ = stopper.kill.cancelled() => None,
            _ = stopper.stop.cancelled() => {
                cancellation.cancel();
                tokio::select! {
                    biased;
                    _ = stopper.kill.cancelled() => None,
                    outcome = &mut running => Some(outcome),
                    _ = tokio::time::sleep(STOP_GRACE) => None,
                }
            }
            outcome = &mut running => Some(outcome),
        }
    };
    shared.leases.set_running(&lease, false);
    // What a handler returns after it was asked to stop is a success, or the stop: a
    // stopped command is released with its attempt given back, as when it is dropped.
    let outcome = match outcome {
        Some(Ok(Err(_))) if stopper.stop.is_cancelled() => None,
        other => other,
    };
    let result = match outcome {
        None => {
            if !shared.leases.is_lost(&lease) {
                tracing::warn!(source = %shared.source.name, id = %row.id, "execution stopped: its lease could not be kept or the shutdown grace ran out");
            }
            return release(lease);
        }
        Some(Ok(result)) => result,
        Some(Err(panic)) => Err(HandlerError::retry(format!(
            "handler panicked: {}",
            panic_message(panic)
        ))),
    };
    // A snooze is checked first: a bad delay is an ordinary failure, and one snooze too
    // many dead-letters the row.
    let result = match result {
        Err(err) if err.snooze.is_some() && !err.terminal => {
            match snooze_decision(
                err.snooze.unwrap_or_default(),
                row.snoozes,
                settings.max_snoozes,
            ) {
                Snoozing::Snooze(delay) => {
                    return SetState {
                        lease,
                        change: StateChange::Snooze { delay },
                    };
                }
                Snoozing::TooOften(error) => {
                    shared.source.stats.execution(
                        &row.type_name,
                        "terminal",
                        started.elapsed().as_secs_f64(),
                    );
                    return SetState {
                        change: dead(error),
                        lease,
                    };
                }
                Snoozing::BadDelay(error) => Err(HandlerError::retry(error)),
            }
        }
        other => other,
    };
    let label = match &result {
        Ok(()) => "succeeded",
        Err(err) if err.terminal => "terminal",
        Err(_) => "failed",
    };
    let seconds = started.elapsed().as_secs_f64();
    let error_type = match &result {
        Ok(()) => None,
        Err(err) if err.terminal => Some("terminal"),
        Err(err) if err.message.starts_with("handler panicked") => Some("panic"),
        Err(_) => Some("failed"),
    };
    if let Some(error_type) = error_type {
        crate::otel::execution_failed(&span, error_type);
    }
    crate::otel::record_execution(&execution, error_type, seconds);
    drop(span);
    shared
        .source
        .stats
        .execution(&row.type_name, label, seconds);
    let change = match result {
        Ok(()) => StateChange::Completed,
        Err(err) if err.terminal || attempts >= settings.max_attempts => dead(err.message),
        Err(err) => StateChange::Retry {
            delay: retry::backoff(
                attempts,
                settings.retry_backoff_base_seconds,
                settings.max_retry_backoff_seconds,
                &mut rand::rng(),
            ),
            errors: errors_after(&err.message),
            error: err.message,
        },
    };
    SetState { lease, change }
}

/// What a handler's snooze becomes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Snoozing {
    /// Run again after this delay, the attempt given back.
    Snooze(std::time::Duration),
    /// Snoozed `max_snoozes` times already: dead-letter it with this reason.
    TooOften(String),
    /// The delay is out of range: fail the attempt with this reason.
    BadDelay(String),
}

/// Decides a snooze of `delay` for a row that has snoozed `snoozes` times already. A
/// delay shorter than [`MIN_SNOOZE`] (zero included) waits [`MIN_SNOOZE`]: a handler
/// saying "not now" is never run again at once, however often it says so.
pub(crate) fn snooze_decision(
    delay: std::time::Duration,
    snoozes: i32,
    max_snoozes: u32,
) -> Snoozing {
    if delay > MAX_SNOOZE {
        return Snoozing::BadDelay(format!(
            "the handler asked to snooze for {:.0} s, longer than the most, {} s (30 days); \
             failed as an error instead",
            delay.as_secs_f64(),
            MAX_SNOOZE.as_secs()
        ));
    }
    let snoozes = u64::try_from(snoozes).unwrap_or(0);
    if snoozes + 1 > u64::from(max_snoozes) {
        return Snoozing::TooOften(format!(
            "gave up: the command snoozed {snoozes} times, the most max_snoozes ({max_snoozes}) \
             allows, and asked to snooze again"
        ));
    }
    Snoozing::Snooze(delay.max(MIN_SNOOZE))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn snoozes_are_bounded_and_bad_delays_fail() {
        let minute = Duration::from_secs(60);
        assert_eq!(snooze_decision(minute, 0, 1000), Snoozing::Snooze(minute));
        assert_eq!(snooze_decision(minute, 999, 1000), Snoozing::Snooze(minute));
        let Snoozing::TooOften(why) = snooze_decision(minute, 1000, 1000) else {
            panic!("the 1001st snooze was allowed");
        };
        assert!(why.contains("snoozed 1000 times"), "{why}");
        assert!(matches!(
            snooze_decision(minute, 0, 0),
            Snoozing::TooOften(_)
        ));
        // A foreign row with a negative count is taken as none.
        assert_eq!(snooze_decision(minute, -5, 1), Snoozing::Snooze(minute));
        let Snoozing::BadDelay(why) = snooze_decision(MAX_SNOOZE + Duration::from_secs(1), 0, 1000)
        else {
            panic!("a 30-day-plus snooze was allowed");
        };
        assert!(why.contains("longer than"), "{why}");
        assert_eq!(
            snooze_decision(MAX_SNOOZE, 0, 1000),
            Snoozing::Snooze(MAX_SNOOZE)
        );
    }

    #[test]
    fn a_snooze_shorter_than_the_floor_waits_the_floor() {
        for asked in [
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_millis(999),
        ] {
            assert_eq!(
                snooze_decision(asked, 0, 1000),
                Snoozing::Snooze(MIN_SNOOZE),
                "{asked:?}"
            );
        }
        assert_eq!(MIN_SNOOZE, Duration::from_secs(1));
        let longer = Duration::from_millis(1500);
        assert_eq!(snooze_decision(longer, 0, 1000), Snoozing::Snooze(longer));
        // The floor does not stretch the bound on how often a row may snooze.
        assert!(matches!(
            snooze_decision(Duration::ZERO, 3, 3),
            Snoozing::TooOften(_)
        ));
    }
}
