//! `icq schedules`: each configured schedule of a source with its expression, time zone,
//! queue and type, the last occurrence its bookkeeping row records, and the next one,
//! computed from the database's `now` (never the local clock). A read: nothing changes.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::engine::recurring::ScheduleReadParams;
use crate::error::Result;
use crate::queue::Queue;
use crate::recurring::{SCHEMA_VERSION, Schedule, needs_schema};

/// One schedule as `icq schedules` lists it (an element of its JSON array).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ScheduleRow {
    /// The source it belongs to.
    pub source: String,
    /// Its name.
    pub name: String,
    /// The cron expression, or `every 10m`.
    pub expression: String,
    /// The IANA time zone a cron expression is read in.
    pub time_zone: String,
    /// The queue its commands go to.
    pub queue: String,
    /// The command type it schedules.
    #[serde(rename = "type")]
    pub type_name: String,
    /// The priority of its commands.
    pub priority: i16,
    /// `skip` or `once`.
    pub missed: &'static str,
    /// The latest occurrence recorded (scheduled, or skipped as missed); `None` before
    /// its first.
    pub last_occurrence: Option<DateTime<Utc>>,
    /// The first occurrence after the database's `now`.
    pub next_occurrence: Option<DateTime<Utc>>,
}

/// The rows of `schedules` (a source's configured schedules) on `queue`'s table. A table
/// older than schema version 4 is an error naming the upgrade, when there are schedules.
pub async fn schedules(queue: &Queue, schedules: &[Schedule]) -> Result<Vec<ScheduleRow>> {
    if schedules.is_empty() {
        return Ok(Vec::new());
    }
    let backend = queue.backend();
    let version = backend.schema_version().await?;
    if version < SCHEMA_VERSION {
        return Err(needs_schema(backend.table(), version, queue.name()));
    }
    let names: Vec<String> = schedules.iter().map(|s| s.name.clone()).collect();
    let state = backend
        .schedule_read(&ScheduleReadParams { names: &names })
        .await?;
    Ok(schedules
        .iter()
        .map(|schedule| ScheduleRow {
            source: queue.name().to_owned(),
            name: schedule.name.clone(),
            expression: schedule.expression(),
            time_zone: schedule.time_zone.name().to_owned(),
            queue: schedule.queue.clone(),
            type_name: schedule.type_name.clone(),
            priority: schedule.priority,
            missed: schedule.missed.as_str(),
            last_occurrence: state.last.get(&schedule.name).copied().flatten(),
            next_occurrence: schedule.next_after(state.now),
        })
        .collect())
}
