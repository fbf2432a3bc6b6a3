//! The recurring schedules' bookkeeping, as each engine keeps it in its folder
//! (`postgres/recurring.rs`, `mysql/recurring.rs`, `sqlite/recurring.rs`): one row per
//! schedule in `<table>Schedules` ("Name", "LastOccurrence", "UpdatedAt").
//!
//! The bookkeeping row is what makes an occurrence run once however many replicas tick:
//! [`ScheduleOps::schedule_advance`] locks it, reads the database's `now` and the last
//! occurrence recorded, and, in the same transaction, moves `LastOccurrence` forward with a
//! guarded `UPDATE` (`WHERE "LastOccurrence" IS NULL OR "LastOccurrence" < $occurrence`)
//! and inserts the occurrences' commands only when that `UPDATE` changed the row. A replica
//! that comes second finds the occurrence recorded and does nothing. The unique key each
//! command carries (`schedule:<name>:<time>`) is not enough alone: a completed command
//! moves to history and no longer holds its key.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::recurring::{Plan, Schedule};

/// Which bookkeeping rows to read.
#[derive(Debug, Clone, Copy)]
pub struct ScheduleReadParams<'a> {
    /// The schedules' names.
    pub names: &'a [String],
}

/// The database's clock and what the bookkeeping table holds for some schedules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleState {
    /// The database's `now`.
    pub now: DateTime<Utc>,
    /// Each asked-for schedule that has a row, with its last occurrence (`None`: the row
    /// exists but records none yet). A schedule without a row is absent.
    pub last: HashMap<String, Option<DateTime<Utc>>>,
}

/// The schedule to advance.
#[derive(Debug, Clone, Copy)]
pub struct ScheduleAdvanceParams<'a> {
    /// The schedule: its name keys the row, its [`Schedule::plan`] decides what is due
    /// and its [`Schedule::command`] makes each occurrence's command.
    pub schedule: &'a Schedule,
    /// Whether the read before found its row (if not, it is inserted first, race-safely).
    pub row_exists: bool,
}

/// A source's schedule bookkeeping. Needs a table of schema version 4
/// ([`crate::recurring::SCHEMA_VERSION`]); the processor checks that before it ticks.
#[async_trait]
pub trait ScheduleOps: Send + Sync + 'static {
    /// The database's `now` and the bookkeeping rows of `names`: a read, cheap enough to
    /// run every second on every replica.
    async fn schedule_read(&self, params: &ScheduleReadParams<'_>) -> Result<ScheduleState>;

    /// In one transaction: inserts the schedule's row if missing (race-safe), locks it,
    /// reads the database's `now` and the row's last occurrence, asks the schedule's plan,
    /// advances the row with the guarded `UPDATE` and, only if this call advanced it,
    /// inserts the plan's commands; commits. Returns the plan carried out, or `None` when
    /// nothing was due or another replica had already recorded the occurrence.
    async fn schedule_advance(&self, params: &ScheduleAdvanceParams<'_>) -> Result<Option<Plan>>;
}
