//! Recurring commands: a [`Schedule`] (a source's `schedules:` in `icq.yaml`, or built in
//! code) names a command to schedule on a cron expression in an IANA time zone, or every
//! fixed interval, and this module says which occurrences are due.
//!
//! What it guarantees:
//!
//! - Occurrences come from the cron crate (`croner`), never from hand-written parsing, in
//!   the schedule's time zone (`chrono-tz`). A daylight-saving change neither skips nor
//!   doubles an occurrence that exists in local time: a wall-clock time the autumn change
//!   repeats (`30 2 * * *` in Europe/Berlin on the last Sunday of October) runs once, at
//!   its first instant; an expression that names every hour (`0 * * * *`) runs on each
//!   real hour, both halves of the repeated hour included; a wall-clock time the spring
//!   change skips (02:30 on the last Sunday of March) does not exist, and runs at the first
//!   instant after the gap (03:00 local), once.
//! - `every: 10m` counts whole seconds from the Unix epoch (00:00:00 UTC on 1970-01-01), so
//!   every replica derives the same occurrences with no state shared but the database.
//! - Which occurrences are due is decided against the database's `now`, never the local
//!   clock ([`Schedule::plan`]): everything in `(last, now]` no older than [`GRACE`]; an
//!   older one (the whole fleet was down) is skipped (`missed: skip`, the default) or, for
//!   `missed: once`, the latest of them runs once. A schedule seen for the first time
//!   starts at the database's `now`: its latest occurrence runs if it is no older than
//!   [`GRACE`], and nothing from before it.
//!
//! Exactly-once across replicas is the driver's ([`crate::engine::ScheduleOps`]): each
//! schedule has a bookkeeping row in `<table>Schedules`, and the one transaction that
//! advances its `LastOccurrence` inserts the occurrences' commands, each with the unique key
//! `schedule:<name>:<occurrence in UTC, RFC 3339>` ([`unique_key`]).
//!
//! # Examples
//!
//! A processor ticks the schedules of the settings its source was added with (here a drain,
//! which ticks once before it drains):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
//! # let options = icq::ConnectOptions::default().creating_table(true);
//! # let queue = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
//! use std::time::Duration;
//! use icq::recurring::Schedule;
//! use icq::{Processor, Registry, RunOptions, Settings};
//!
//! let mut registry = Registry::new();
//! registry.insert("health.ping", std::sync::Arc::new(icq::handler::Noop))?;
//! let settings = Settings::default()
//!     .with_schedules(vec![Schedule::every("ping", Duration::from_secs(1), "health.ping")]);
//! let mut processor = Processor::new(registry);
//! processor.add_source(queue.source_handle(settings));
//! processor.run(RunOptions::default().with_until_idle(true), Default::default()).await?;
//! assert_eq!(queue.stats().snapshot().succeeded, 1);
//! # Ok(())
//! # }
//! ```

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;

use crate::command::{DEFAULT_QUEUE, NewCommand, RunAt};

/// How far back from the database's `now` an occurrence still runs under `missed: skip`:
/// a tick is every second, so this covers ticks that came late (a slow statement, a
/// replica restarting) with room to spare, while a fleet that was down longer does not
/// flood the queue with stale occurrences.
pub const GRACE: Duration = Duration::from_secs(10);

/// The most occurrences one schedule inserts in one tick: a safety bound (the grace
/// already bounds them: an `every: 1s` schedule whose last tick was [`GRACE`] ago inserts
/// eleven).
pub const MAX_PER_TICK: usize = 100;

/// The longest schedule name, in bytes (the bookkeeping table's key).
pub const MAX_NAME_BYTES: usize = 200;

/// The schema version that has the `<table>Schedules` bookkeeping table.
pub const SCHEMA_VERSION: u32 = 4;

/// When a schedule's occurrences fall.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Recurrence {
    /// A cron expression (five fields, or six with seconds first), read in the schedule's
    /// time zone.
    Cron(Box<CronExpr>),
    /// A fixed interval in whole seconds, counted from the Unix epoch.
    Every(Duration),
}

/// A parsed cron expression and its text.
#[derive(Debug, Clone)]
pub struct CronExpr {
    text: String,
    cron: croner::Cron,
}

impl CronExpr {
    /// Parses `text`: five fields (`minute hour day month weekday`), or six with seconds
    /// first, or an alias (`@daily`, `@hourly`, ...).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::recurring::CronExpr;
    ///
    /// assert!(CronExpr::parse("0 3 * * *").is_ok());
    /// assert!(CronExpr::parse("*/5 * * * * *").is_ok());
    /// let err = CronExpr::parse("61 * * * *").unwrap_err();
    /// assert!(err.starts_with("`61 * * * *` is not a cron expression"), "{err}");
    /// ```
    pub fn parse(text: &str) -> Result<CronExpr, String> {
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(text.trim())
            .map_err(|err| {
                format!(
                    "`{}` is not a cron expression ({err}); write five fields \
                     (minute hour day-of-month month day-of-week), e.g. \"0 3 * * *\", or six \
                     with seconds first",
                    crate::redact::echo(text)
                )
            })?;
        Ok(CronExpr {
            text: text.trim().to_owned(),
            cron,
        })
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Two expressions are equal when written alike.
impl PartialEq for CronExpr {
    fn eq(&self, other: &CronExpr) -> bool {
        self.text == other.text
    }
}

/// What to do about occurrences that came and went while no replica ran (older than
/// [`GRACE`] when a replica next looks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Missed {
    /// Record them as done without scheduling anything (the default).
    #[default]
    Skip,
    /// Schedule the latest of them, once.
    Once,
}

impl Missed {
    /// The word `icq.yaml` and the listings use: `skip` or `once`.
    pub fn as_str(self) -> &'static str {
        match self {
            Missed::Skip => "skip",
            Missed::Once => "once",
        }
    }
}

/// One recurring command of a source.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use icq::Settings;
/// use icq::recurring::{Missed, Schedule};
///
/// let nightly = Schedule::cron("nightly-report", "0 3 * * *", "reports.nightly")?
///     .with_time_zone("Europe/Berlin")?
///     .with_payload(serde_json::json!({ "kind": "full" }))
///     .with_missed(Missed::Once);
/// let ping = Schedule::every("ping", Duration::from_secs(600), "health.ping")
///     .with_queue("default")
///     .with_priority(-1);
/// let settings = Settings::default().with_schedules(vec![nightly, ping]);
/// assert!(settings.validate().is_ok());
///
/// let too_fast = Schedule::every("fast", Duration::from_millis(500), "t");
/// assert!(too_fast.validate().unwrap_err().contains("at least 1 s"));
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Schedule {
    /// Unique among the source's schedules; part of each occurrence's unique key.
    pub name: String,
    /// When it recurs.
    pub recurrence: Recurrence,
    /// The IANA time zone a cron expression is read in (UTC unless set).
    pub time_zone: Tz,
    /// The command type each occurrence schedules.
    pub type_name: String,
    /// The payload each occurrence carries (`{}` unless set).
    pub payload: serde_json::Value,
    /// The queue (`default` unless set).
    pub queue: String,
    /// The priority (0 unless set).
    pub priority: i16,
    /// What to do about occurrences missed while nothing ran.
    pub missed: Missed,
}

impl Schedule {
    /// A schedule named `name` scheduling `type_name` on the cron expression `expression`
    /// (in UTC until [`Schedule::with_time_zone`]). Fails when the expression does not
    /// parse. See [`Schedule`]'s example.
    pub fn cron(
        name: impl Into<String>,
        expression: &str,
        type_name: impl Into<String>,
    ) -> Result<Schedule, String> {
        let cron = CronExpr::parse(expression)?;
        Ok(Schedule::new(
            name.into(),
            Recurrence::Cron(Box::new(cron)),
            type_name.into(),
        ))
    }

    /// A schedule named `name` scheduling `type_name` every `interval` (whole seconds,
    /// at least one; checked by [`Schedule::validate`]). See [`Schedule`]'s example.
    pub fn every(
        name: impl Into<String>,
        interval: Duration,
        type_name: impl Into<String>,
    ) -> Schedule {
        Schedule::new(name.into(), Recurrence::Every(interval), type_name.into())
    }

    fn new(name: String, recurrence: Recurrence, type_name: String) -> Schedule {
        Schedule {
            name,
            recurrence,
            time_zone: Tz::UTC,
            type_name,
            payload: serde_json::json!({}),
            queue: DEFAULT_QUEUE.to_owned(),
            priority: 0,
            missed: Missed::Skip,
        }
    }

    /// This schedule read in the IANA time zone `zone` (`Europe/Berlin`); fails on a name
    /// the time-zone database does not know. See [`Schedule`]'s example.
    pub fn with_time_zone(mut self, zone: &str) -> Result<Schedule, String> {
        self.time_zone = parse_time_zone(zone)?;
        Ok(self)
    }

    /// This schedule with [`Schedule::payload`] set.
    pub fn with_payload(mut self, payload: serde_json::Value) -> Schedule {
        self.payload = payload;
        self
    }

    /// This schedule with [`Schedule::queue`] set.
    pub fn with_queue(mut self, queue: impl Into<String>) -> Schedule {
        self.queue = queue.into();
        self
    }

    /// This schedule with [`Schedule::priority`] set.
    pub fn with_priority(mut self, priority: i16) -> Schedule {
        self.priority = priority;
        self
    }

    /// This schedule with [`Schedule::missed`] set.
    pub fn with_missed(mut self, missed: Missed) -> Schedule {
        self.missed = missed;
        self
    }

    /// The expression as a listing shows it: the cron text, or `every 10m`.
    pub fn expression(&self) -> String {
        match &self.recurrence {
            Recurrence::Cron(cron) => cron.as_str().to_owned(),
            Recurrence::Every(interval) => format!("every {}", format_interval(*interval)),
        }
    }

    /// Checks what the builders cannot: the name, an interval of whole seconds and at
    /// least 1 s, a time zone only for a cron expression, the type and the queue.
    pub fn validate(&self) -> Result<(), String> {
        validate_name(&self.name)?;
        let named = |why: String| format!("schedule `{}`: {why}", self.name);
        if let Recurrence::Every(interval) = self.recurrence {
            if interval < Duration::from_secs(1) {
                return Err(named(format!(
                    "`every` is {}; it must be at least 1 s",
                    format_interval(interval)
                )));
            }
            if interval.subsec_nanos() != 0 {
                return Err(named(format!(
                    "`every` is {}; write a whole number of seconds",
                    format_interval(interval)
                )));
            }
            if self.time_zone != Tz::UTC {
                return Err(named(
                    "`time_zone` applies to `cron` only: `every` counts from the Unix epoch \
                     in UTC; remove `time_zone` or write a cron expression"
                        .to_owned(),
                ));
            }
        }
        if self.type_name.trim().is_empty() {
            return Err(named("`type` must not be empty".to_owned()));
        }
        crate::command::validate_queue_name(&self.queue).map_err(|err| named(err.to_string()))?;
        Ok(())
    }

    /// The latest occurrence at or before `at`, if there is one.
    pub fn latest_at_or_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.recurrence {
            Recurrence::Every(interval) => {
                let step = interval.as_secs().max(1) as i64;
                let t = at.timestamp().div_euclid(step) * step;
                Utc.timestamp_opt(t, 0).single()
            }
            Recurrence::Cron(cron) => cron
                .cron
                .find_previous_occurrence(&at.with_timezone(&self.time_zone), true)
                .ok()
                .map(|t| t.with_timezone(&Utc)),
        }
    }

    /// The first occurrence strictly after `at`, if there is one.
    pub fn next_after(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.recurrence {
            Recurrence::Every(interval) => {
                let step = interval.as_secs().max(1) as i64;
                let t = (at.timestamp().div_euclid(step) + 1) * step;
                Utc.timestamp_opt(t, 0).single()
            }
            Recurrence::Cron(cron) => cron
                .cron
                .find_next_occurrence(&at.with_timezone(&self.time_zone), false)
                .ok()
                .map(|t| t.with_timezone(&Utc)),
        }
    }

    /// The occurrences in `(after, until]`, oldest first, at most `limit`.
    pub fn occurrences(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut at = after;
        while out.len() < limit {
            match self.next_after(at) {
                Some(next) if next <= until && next > at => {
                    out.push(next);
                    at = next;
                }
                _ => break,
            }
        }
        out
    }

    /// What a tick does when the database's clock reads `now` and the bookkeeping row
    /// says `last` (`None`: no occurrence recorded yet): `None` when nothing is due, else
    /// the occurrence to record and the ones to schedule. See the module docs.
    pub fn plan(&self, last: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<Plan> {
        let latest = self.latest_at_or_before(now)?;
        if last.is_some_and(|last| last >= latest) {
            return None;
        }
        let grace = chrono::Duration::from_std(GRACE).unwrap_or_default();
        // Occurrences at or after this are recent enough to run.
        let recent_from = now - grace;
        let before_recent = recent_from - chrono::Duration::microseconds(1);
        let Some(last) = last else {
            // First sight: the latest occurrence alone, if it is recent.
            let run = if latest >= recent_from {
                vec![latest]
            } else {
                Vec::new()
            };
            return Some(Plan {
                advance_to: latest,
                run,
            });
        };
        let after = last.max(before_recent);
        let mut run = self.occurrences(after, now, MAX_PER_TICK);
        if self.missed == Missed::Once
            && let Some(missed) = self.latest_at_or_before(before_recent)
            && missed > last
        {
            run.insert(0, missed);
        }
        Some(Plan {
            advance_to: latest,
            run,
        })
    }

    /// The command one occurrence schedules: due at the occurrence, with its unique key.
    pub fn command(&self, occurrence: DateTime<Utc>) -> NewCommand {
        let mut command = NewCommand::new(self.type_name.clone(), self.payload.clone());
        command.run_at = RunAt::At(occurrence);
        command.queue = self.queue.clone();
        command.priority = self.priority;
        command.unique_key = Some(unique_key(&self.name, occurrence));
        command
    }
}

/// What one tick of a schedule does: record `advance_to` as its last occurrence and
/// schedule `run` (possibly none: occurrences skipped as missed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The latest occurrence at or before the database's `now`.
    pub advance_to: DateTime<Utc>,
    /// The occurrences to schedule, oldest first.
    pub run: Vec<DateTime<Utc>>,
}

/// The unique key of an occurrence's command: `schedule:<name>:<occurrence in UTC,
/// RFC 3339>`.
///
/// # Examples
///
/// ```
/// use chrono::{TimeZone, Utc};
///
/// let at = Utc.with_ymd_and_hms(2026, 3, 29, 1, 0, 0).unwrap();
/// assert_eq!(icq::recurring::unique_key("nightly", at), "schedule:nightly:2026-03-29T01:00:00Z");
/// ```
pub fn unique_key(name: &str, occurrence: DateTime<Utc>) -> String {
    format!(
        "schedule:{name}:{}",
        occurrence.to_rfc3339_opts(SecondsFormat::Secs, true)
    )
}

/// Parses an IANA time-zone name (`Europe/Berlin`, `UTC`).
///
/// # Examples
///
/// ```
/// assert!(icq::recurring::parse_time_zone("Europe/Berlin").is_ok());
/// let err = icq::recurring::parse_time_zone("Europe/Berlinn").unwrap_err();
/// assert!(err.contains("not an IANA time zone"), "{err}");
/// ```
pub fn parse_time_zone(zone: &str) -> Result<Tz, String> {
    Tz::from_str(zone.trim()).map_err(|_| {
        format!(
            "`{}` is not an IANA time zone; write a name such as `UTC`, `Europe/Berlin` or \
             `America/New_York`",
            crate::redact::echo(zone)
        )
    })
}

/// Checks a schedule name: 1 to [`MAX_NAME_BYTES`] bytes, no control characters, no white
/// space at either end.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("a schedule needs a `name`".to_owned());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "schedule name is {} bytes; the most is {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(format!(
            "schedule name {name:?} holds a control character; use printable text"
        ));
    }
    if let Some(why) = crate::command::edge_whitespace(name) {
        return Err(format!("schedule name {name:?}: {why}"));
    }
    Ok(())
}

/// Checks a source's schedules: each on its own, and no name twice.
pub fn validate_all(schedules: &[Schedule]) -> Result<(), String> {
    for (index, schedule) in schedules.iter().enumerate() {
        schedule.validate()?;
        if schedules[..index].iter().any(|s| s.name == schedule.name) {
            return Err(format!(
                "schedule `{}` is listed twice in `schedules`; give each schedule its own name",
                schedule.name
            ));
        }
    }
    Ok(())
}

/// `10m`, `1h 30m`, `1s`: humantime's form of whole seconds, the exact value otherwise.
fn format_interval(interval: Duration) -> String {
    if interval.subsec_nanos() == 0 && interval.as_secs() > 0 {
        let mut secs = interval.as_secs();
        let mut parts = Vec::new();
        for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
            if secs >= size {
                parts.push(format!("{}{unit}", secs / size));
                secs %= size;
            }
        }
        parts.join(" ")
    } else {
        format!("{interval:?}")
    }
}

/// The error for a source's schedules on a table at `version`, older than
/// [`SCHEMA_VERSION`]: it names the upgrade.
pub(crate) fn needs_schema(
    table: &crate::ident::TableName,
    version: u32,
    source: &str,
) -> crate::Error {
    crate::Error::needs_schema_v4(
        table,
        version,
        &format!("`schedules:` of source `{source}`"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn all(schedule: &Schedule, from: &str, to: &str) -> Vec<String> {
        schedule
            .occurrences(utc(from), utc(to), 1000)
            .into_iter()
            .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
            .collect()
    }

    fn berlin(expression: &str) -> Schedule {
        Schedule::cron("s", expression, "t")
            .unwrap()
            .with_time_zone("Europe/Berlin")
            .unwrap()
    }

    #[test]
    fn spring_forward_runs_a_skipped_wall_time_once_after_the_gap() {
        // 2026-03-29: Berlin moves from 02:00 CET (+01) to 03:00 CEST (+02); 02:30 does
        // not exist that day.
        let daily = berlin("30 2 * * *");
        assert_eq!(
            all(&daily, "2026-03-27T12:00:00Z", "2026-03-30T12:00:00Z"),
            [
                "2026-03-28T01:30:00Z", // 02:30 CET
                "2026-03-29T01:00:00Z", // 03:00 CEST, the first instant after the gap
                "2026-03-30T00:30:00Z", // 02:30 CEST
            ]
        );
        let hourly = berlin("0 * * * *");
        assert_eq!(
            all(&hourly, "2026-03-28T23:30:00Z", "2026-03-29T02:30:00Z"),
            [
                "2026-03-29T00:00:00Z", // 01:00 CET
                "2026-03-29T01:00:00Z", // 03:00 CEST (02:00 does not exist)
                "2026-03-29T02:00:00Z", // 04:00 CEST
            ]
        );
    }

    #[test]
    fn fall_back_runs_a_repeated_wall_time_once_and_every_real_hour() {
        // 2026-10-25: Berlin moves from 03:00 CEST (+02) back to 02:00 CET (+01); 02:00
        // to 02:59 happen twice.
        let daily = berlin("30 2 * * *");
        assert_eq!(
            all(&daily, "2026-10-23T12:00:00Z", "2026-10-26T12:00:00Z"),
            [
                "2026-10-24T00:30:00Z", // 02:30 CEST
                "2026-10-25T00:30:00Z", // 02:30 CEST, the first of the two; not again
                "2026-10-26T01:30:00Z", // 02:30 CET
            ]
        );
        let hourly = berlin("0 * * * *");
        assert_eq!(
            all(&hourly, "2026-10-24T22:30:00Z", "2026-10-25T02:30:00Z"),
            [
                "2026-10-24T23:00:00Z", // 01:00 CEST
                "2026-10-25T00:00:00Z", // 02:00 CEST
                "2026-10-25T01:00:00Z", // 02:00 CET
                "2026-10-25T02:00:00Z", // 03:00 CET
            ]
        );
    }

    #[test]
    fn every_counts_whole_seconds_from_the_epoch() {
        let ten = Schedule::every("s", Duration::from_secs(600), "t");
        assert_eq!(
            ten.latest_at_or_before(utc("2026-01-01T00:17:59.9Z")),
            Some(utc("2026-01-01T00:10:00Z"))
        );
        assert_eq!(
            ten.next_after(utc("2026-01-01T00:10:00Z")),
            Some(utc("2026-01-01T00:20:00Z"))
        );
    }

    #[test]
    fn a_tick_runs_recent_occurrences_and_skips_or_catches_up_older_ones() {
        let every = Schedule::every("s", Duration::from_secs(1), "t");
        let now = utc("2026-01-01T00:01:00.5Z");
        // First sight: starts at now (the latest occurrence, within the grace).
        let first = every.plan(None, now).unwrap();
        assert_eq!(first.advance_to, utc("2026-01-01T00:01:00Z"));
        assert_eq!(first.run, [utc("2026-01-01T00:01:00Z")]);
        // Ten seconds of a tick gone missing: all within the grace run.
        let slow = every.plan(Some(utc("2026-01-01T00:00:45Z")), now).unwrap();
        assert_eq!(slow.run.len(), 10, "{slow:?}"); // 00:00:51 ..= 00:01:00
        assert_eq!(slow.run[0], utc("2026-01-01T00:00:51Z"));
        // Up to date: nothing.
        assert_eq!(every.plan(Some(utc("2026-01-01T00:01:00Z")), now), None);
        // A late tick: the three it missed.
        let late = every.plan(Some(utc("2026-01-01T00:00:57Z")), now).unwrap();
        assert_eq!(
            late.run,
            [
                utc("2026-01-01T00:00:58Z"),
                utc("2026-01-01T00:00:59Z"),
                utc("2026-01-01T00:01:00Z")
            ]
        );

        let nightly = Schedule::cron("n", "0 3 * * *", "t").unwrap();
        let now = utc("2026-01-05T10:00:00Z");
        let last = Some(utc("2026-01-02T03:00:00Z"));
        let skip = nightly.plan(last, now).unwrap();
        assert_eq!(
            (skip.advance_to, skip.run.len()),
            (utc("2026-01-05T03:00:00Z"), 0)
        );
        let once = nightly.clone().with_missed(Missed::Once).plan(last, now);
        assert_eq!(once.unwrap().run, [utc("2026-01-05T03:00:00Z")]);
        // A new schedule does not catch up, even with `missed: once`.
        let new = nightly.with_missed(Missed::Once).plan(None, now).unwrap();
        assert!(new.run.is_empty());
    }

    #[test]
    fn validation_names_what_is_wrong() {
        let zone = parse_time_zone("Mars/Olympus").unwrap_err();
        assert!(zone.contains("not an IANA time zone"), "{zone}");
        let cron = Schedule::cron("s", "* * *", "t").unwrap_err();
        assert!(cron.contains("is not a cron expression"), "{cron}");
        let every = Schedule::every("s", Duration::from_millis(1500), "t")
            .validate()
            .unwrap_err();
        assert!(every.contains("whole number of seconds"), "{every}");
        let zoned = Schedule::every("s", Duration::from_secs(60), "t")
            .with_time_zone("Europe/Berlin")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            zoned.contains("`time_zone` applies to `cron` only"),
            "{zoned}"
        );
        let twice = validate_all(&[
            Schedule::every("a", Duration::from_secs(1), "t"),
            Schedule::every("a", Duration::from_secs(2), "t"),
        ])
        .unwrap_err();
        assert!(twice.contains("listed twice"), "{twice}");
        assert!(validate_name(&"n".repeat(201)).is_err());
    }
}
