//! The schedule tick: at each schedule's next occurrence (by the database's clock) and at
//! least every [`TICK`], each replica reads the database's `now` and its
//! source's schedules' bookkeeping rows in one read, and advances each schedule that has
//! an occurrence due ([`crate::engine::ScheduleOps::schedule_advance`]). There is no
//! leader: every replica ticks, and the bookkeeping row lets exactly one of them record
//! and schedule each occurrence. Only the schedules in the source's settings tick, so a
//! schedule removed from the configuration stops with the next start (its row stays,
//! unused).
//!
//! A failed tick is logged and tried again on the next one; what it did not record is
//! still due then (within [`crate::recurring::GRACE`], or as a missed occurrence).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{SourceHandle, health};
use crate::engine::recurring::{ScheduleAdvanceParams, ScheduleReadParams};
use crate::error::{DatabaseErrorKind, Result};

/// How often, at least, each replica looks for due occurrences.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// How long after an occurrence (by the database's clock) the tick that schedules it
/// wakes: the local sleep and the database's clock each run a little apart.
const AFTER_OCCURRENCE: Duration = Duration::from_millis(20);

/// The shortest wait between ticks.
const MIN_WAIT: Duration = Duration::from_millis(50);

/// How long one read or advance may take before its connection is abandoned as dead.
const TICK_DEADLINE: Duration = Duration::from_secs(10);

/// Ticks until `stop` is cancelled (or once, with `once`). Returns at once for a source
/// without schedules.
pub(crate) async fn run(source: SourceHandle, stop: CancellationToken, once: bool) {
    if source.settings.schedules.is_empty() {
        return;
    }
    let names: Vec<String> = source
        .settings
        .schedules
        .iter()
        .map(|schedule| schedule.name.clone())
        .collect();
    loop {
        let ticked = tokio::select! {
            ticked = tick(&source, &names) => ticked,
            _ = stop.cancelled() => return,
        };
        let wait = match ticked {
            Ok(until_next) => {
                until_next.map_or(TICK, |d| (d + AFTER_OCCURRENCE).clamp(MIN_WAIT, TICK))
            }
            Err(err) => {
                log_failure(&source.name, &err);
                TICK
            }
        };
        if once {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// One tick: one read, then one advance per schedule with something due. Returns how long,
/// by the database's clock, until the next occurrence of any schedule.
pub(crate) async fn tick(source: &SourceHandle, names: &[String]) -> Result<Option<Duration>> {
    let params = ScheduleReadParams { names };
    let read = source.backend.schedule_read(&params);
    let state = health::deadline(
        source.backend.as_ref(),
        TICK_DEADLINE,
        "reading the schedules",
        read,
    )
    .await?;
    // A write waiting for SQLite's write lock fails on its own after the busy timeout.
    let limit = TICK_DEADLINE + source.backend.local_lock_wait().unwrap_or_default();
    for schedule in &source.settings.schedules {
        let row = state.last.get(&schedule.name);
        if schedule.plan(row.copied().flatten(), state.now).is_none() {
            continue;
        }
        let params = ScheduleAdvanceParams {
            schedule,
            row_exists: row.is_some(),
        };
        let advance = source.backend.schedule_advance(&params);
        match health::deadline(
            source.backend.as_ref(),
            limit,
            "advancing a schedule",
            advance,
        )
        .await
        {
            Ok(Some(plan)) => {
                if !plan.run.is_empty() {
                    source.wake.notify_one();
                }
                tracing::debug!(
                    source = %source.name,
                    schedule = %schedule.name,
                    occurrence = %plan.advance_to,
                    scheduled = plan.run.len(),
                    "schedule advanced"
                );
            }
            Ok(None) => {}
            Err(err) => log_failure(&source.name, &err),
        }
    }
    let next = source
        .settings
        .schedules
        .iter()
        .filter_map(|schedule| schedule.next_after(state.now))
        .min();
    Ok(next.and_then(|next| (next - state.now).to_std().ok()))
}

/// A lost race (a deadlock, a busy database) is routine among replicas; anything else is
/// worth a warning.
fn log_failure(source: &Arc<str>, err: &crate::Error) {
    if err.lost_race() {
        super::health::count_lost_race(source, "schedule");
    }
    if err.database_kind() == Some(DatabaseErrorKind::Contention) {
        tracing::debug!(source = %source, error = %err, "schedule tick lost a race; trying again next tick");
    } else {
        tracing::warn!(source = %source, error = %err, "schedule tick failed; trying again next tick");
    }
}
