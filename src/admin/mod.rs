//! Operator operations across one or many sources: counts, dead letters, requeue, purge,
//! replay and one-off scheduling. Every `icq` operator subcommand is a thin layer over one
//! function here; each returns a typed report whose `Serialize` form is exactly the JSON
//! document of the product contract, and the CLI's output module renders it.
//!
//! Guarantees:
//!
//! - **Nothing changes on a bad request.** Ids are located in every selected source and
//!   their states checked before anything is written: an unknown id is
//!   [`Error::NotFound`] (exit 3), a row in the wrong state is [`Error::Refused`] (exit 2),
//!   and in both cases no row was touched. Within a source, requeueing explicit ids is one
//!   transaction guarded in SQL, so a row that changes state concurrently rolls the whole
//!   request back.
//! - **Bulk work is bounded.** `requeue --all-dead` and `purge` are split into a *plan*
//!   (counts under a cutoff fixed from the database clock, used for the confirmation
//!   prompt and `--dry-run`) and an apply step that works in short batches
//!   ([`REQUEUE_BATCH`], [`PURGE_BATCH`] rows, each its own statement), never one giant
//!   transaction. Rows that die or complete after the cutoff are left alone, so the loop
//!   always ends even while processors keep running.
//! - **Bulk scheduling validates first.** Every line of a `--from-file` is parsed and
//!   checked before the first insert.

mod cancel;
mod dead_letters;
pub mod doctor;
mod list;
mod methods;
mod pending;
mod purge;
mod queues;
mod replay;
mod requeue;
mod schedule;
mod schedules;
mod show;

pub use crate::engine::admin::{CANCELLED, FinishedKind, ListState, StateCount};
pub use cancel::{
    CancelPlan, CancelReport, CancelTarget, CancelledCommand, WasState, cancel, plan_cancel,
};
pub use dead_letters::{
    DEFAULT_DEAD_LETTER_LIMIT, DeadLetterQuery, DeadLetterReport, DeadLetterRow, dead_letters,
};
pub use list::{ListReport, ListRequest, ListedCommand, MAX_PAGE_LIMIT, list, list_page};
pub use pending::{PendingCount, PendingReport, PendingRequest, pending, pending_with};
pub use purge::{PURGE_BATCH, PurgeCount, PurgePlan, PurgeReport, PurgeRequest, plan_purge, purge};
pub use queues::{
    QueueChange, QueueChangeReport, QueueListReport, QueueListing, queue_list, set_paused,
};
pub use replay::{ReplayReport, Replayed, replay};
pub use requeue::{
    REQUEUE_BATCH, RequeuePlan, RequeueReport, RequeueTarget, Skipped, plan_requeue, requeue,
};
pub use schedule::{
    DEFAULT_MAX_INPUT_BYTES, InputLimit, SCHEDULE_CHUNK, Scheduled, ScheduledMany, one_source,
    parse_jobs, read_jobs, read_limited, schedule, schedule_many,
};
pub use schedules::{ScheduleRow, schedules};
pub use show::{AttemptsView, ShownCommand, ShownHead, show, show_head};

use std::collections::HashSet;

use crate::command::{CommandId, CommandRow, State};
use crate::engine::admin::CommandGetManyParams;
use crate::error::{Error, Result};
use crate::queue::Queue;

/// Receives progress of long operations (a terminal progress bar, or nothing).
///
/// # Examples
///
/// The CLI shows a progress bar; a service can log, or pass [`NoProgress`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let options = icq::ConnectOptions::default().creating_table(true);
/// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
/// # let queue = source.clone();
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use icq::admin::{Progress, schedule_many};
/// use icq::NewCommand;
///
/// struct Log(AtomicU64);
/// impl Progress for Log {
///     fn begin(&self, label: &str, total: u64) {
///         println!("{label}: {total} to do");
///     }
///     fn advance(&self, n: u64) {
///         self.0.fetch_add(n, Ordering::Relaxed);
///     }
///     fn finish(&self) {}
/// }
///
/// let commands: Vec<NewCommand> =
///     (1..=3).map(|n| NewCommand::new("t", serde_json::json!({ "n": n }))).collect();
/// let log = Log(AtomicU64::new(0));
/// schedule_many(&source, &commands, &log).await?;
/// assert_eq!(log.0.load(Ordering::Relaxed), 3);
/// # Ok(())
/// # }
/// ```
pub trait Progress: Send + Sync {
    /// A new phase of `total` units starts, described by `label`. See [`Progress`]'s example.
    fn begin(&self, label: &str, total: u64);
    /// `n` more units are done. See [`Progress`]'s example.
    fn advance(&self, n: u64);
    /// The operation is over (successfully or not). See [`Progress`]'s example.
    fn finish(&self);
}

/// Progress that is not shown anywhere.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let options = icq::ConnectOptions::default().creating_table(true);
/// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
/// # let queue = source.clone();
/// # let sources = vec![source];
/// use icq::admin::{NoProgress, PurgeRequest, plan_purge, purge};
///
/// let plan = plan_purge(&sources, &PurgeRequest { completed: true, ..Default::default() }).await?;
/// let report = purge(&plan, &NoProgress).await?;
/// assert_eq!(report.total(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&self, _label: &str, _total: u64) {}
    fn advance(&self, _n: u64) {}
    fn finish(&self) {}
}

/// Rows found for a set of ids, with the index of the source holding each.
pub(super) struct Located {
    pub(super) rows: Vec<(usize, CommandRow)>,
}

impl Located {
    /// The ids of `wanted` that no source holds, or `None` when every one was found. A
    /// UUID matches in any spelling `uuid` parses (`{105C235B-…}` is the row PostgreSQL
    /// returns as `105c235b-…`): the engine already matched it as the same value.
    pub(super) fn missing(&self, wanted: &[CommandId]) -> Option<Vec<CommandId>> {
        let found: HashSet<&CommandId> = self.rows.iter().map(|(_, row)| &row.id).collect();
        let found_uuids: HashSet<uuid::Uuid> = self
            .rows
            .iter()
            .filter_map(|(_, row)| row.id.as_uuid())
            .collect();
        let missing: Vec<CommandId> = wanted
            .iter()
            .filter(|id| {
                !found.contains(id) && !id.as_uuid().is_some_and(|u| found_uuids.contains(&u))
            })
            .cloned()
            .collect();
        (!missing.is_empty()).then_some(missing)
    }
}

/// Reads the rows of `ids` from every source.
pub(super) async fn locate(sources: &[Queue], ids: &[CommandId]) -> Result<Located> {
    let found =
        futures::future::try_join_all(sources.iter().enumerate().map(|(i, s)| async move {
            Ok::<_, Error>((
                i,
                s.backend()
                    .command_get_many(&CommandGetManyParams { ids })
                    .await?,
            ))
        }))
        .await?;
    Ok(Located {
        rows: found
            .into_iter()
            .flat_map(|(i, rows)| rows.into_iter().map(move |row| (i, row)))
            .collect(),
    })
}

/// Locates `ids` in every source and checks each row's state at its database's clock:
/// `check` returns `Err(reason)` for a row the operation must not touch. An unknown id is
/// [`Error::NotFound`] and any refusal is [`Error::Refused`] (all reasons in one message),
/// and in both cases nothing was written ("nothing was {done}"). Returns the accepted
/// rows grouped by source, in source order.
pub(super) async fn locate_checked(
    sources: &[Queue],
    ids: &[CommandId],
    done: &str,
    check: impl Fn(&CommandRow, State) -> std::result::Result<(), String>,
) -> Result<Vec<(usize, Vec<CommandRow>)>> {
    let consequence = format!("nothing was {done}");
    let located = locate(sources, ids).await?;
    if let Some(missing) = located.missing(ids) {
        return Err(not_found(&missing, sources, &consequence));
    }
    let mut refusals = Vec::new();
    let mut per_source: Vec<(usize, Vec<CommandRow>)> = Vec::new();
    for (index, source) in sources.iter().enumerate() {
        let rows: Vec<&CommandRow> = located
            .rows
            .iter()
            .filter(|(i, _)| *i == index)
            .map(|(_, row)| row)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let now = source.backend().clock_now().await?;
        let mut accepted = Vec::with_capacity(rows.len());
        for row in rows {
            match check(row, row.state(now)) {
                Ok(()) => accepted.push(row.clone()),
                Err(reason) => refusals.push(reason),
            }
        }
        per_source.push((index, accepted));
    }
    if !refusals.is_empty() {
        return Err(Error::Refused(format!(
            "{}; {consequence}",
            refusals.join("; ")
        )));
    }
    Ok(per_source)
}

/// `ids` without repeats, in their first-seen order.
pub(super) fn distinct(ids: &[CommandId]) -> Vec<CommandId> {
    let mut seen = HashSet::new();
    ids.iter().filter(|id| seen.insert(*id)).cloned().collect()
}

pub(super) fn list_ids(ids: &[CommandId]) -> String {
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn where_sources(sources: &[Queue]) -> String {
    match sources {
        [one] => format!("in source `{}`", one.name()),
        many => format!(
            "in any of the sources {}",
            many.iter()
                .map(|s| format!("`{}`", s.name()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The error for `ids` that none of `sources` holds: [`Error::Invalid`] (exit 2) when some
/// of them could not be the id of a row in any of these sources (not a UUID where ids are
/// PostgreSQL `uuid`s, longer than MariaDB's `CHAR(36)`), since no row will ever have it,
/// and [`Error::NotFound`] (exit 3) otherwise.
pub(super) fn not_found(ids: &[CommandId], sources: &[Queue], consequence: &str) -> Error {
    let malformed: Vec<(&CommandId, String)> = ids
        .iter()
        .filter_map(|id| {
            // Malformed only when no selected source could hold it (and with no source
            // open at all, nothing says so).
            if sources.is_empty() {
                return None;
            }
            let reasons = sources
                .iter()
                .map(|s| s.backend().id_problem(id))
                .collect::<Option<Vec<String>>>()?;
            // Each engine's reason once, however many of its sources are selected.
            let mut distinct: Vec<String> = Vec::new();
            for reason in reasons {
                if !distinct.contains(&reason) {
                    distinct.push(reason);
                }
            }
            Some((id, distinct.join("; ")))
        })
        .collect();
    if !malformed.is_empty() {
        let listed: Vec<String> = malformed
            .iter()
            .map(|(id, why)| {
                format!(
                    "`{}` is not a command id: {why}",
                    crate::redact::echo(id.as_str())
                )
            })
            .collect();
        return Error::invalid(format!(
            "{}; copy an id from `icq list` or `icq dead-letters list`; {consequence}",
            listed.join("; ")
        ));
    }
    let what = match ids {
        [one] => format!("no command with id {one}"),
        many => format!("no commands with ids {}", list_ids(many)),
    };
    Error::NotFound(format!("{what} {}; {consequence}", where_sources(sources)))
}

pub(super) fn state_name(state: State) -> &'static str {
    match state {
        State::Due => "due",
        State::Scheduled => "scheduled",
        State::Running => "running",
        State::Completed => "completed",
        State::Dead => "dead",
    }
}

/// Runs `batch` (one short statement) until it reports fewer than `limit` rows, showing
/// `label` and each batch's count on `progress`; returns the rows done in all. The
/// progress is finished whether the loop ends well or not. Bulk operations never run
/// as one long transaction: each batch commits on its own.
pub(super) async fn in_batches<F, Fut>(
    progress: &dyn Progress,
    label: &str,
    total: u64,
    limit: u32,
    mut batch: F,
) -> Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64>>,
{
    progress.begin(label, total);
    let mut done_in_all = 0;
    let outcome = loop {
        match batch().await {
            Ok(done) => {
                done_in_all += done;
                progress.advance(done);
                if done < u64::from(limit) {
                    break Ok(done_in_all);
                }
            }
            Err(err) => break Err(err),
        }
    };
    progress.finish();
    outcome
}

pub use crate::command::{MAX_QUEUE_NAME_BYTES, validate_queue_filter as check_queue_name};

/// Checks a `--queue` filter before anything is read or written: a valid name, and every
/// source's table at schema version 2 (a version-1 table has no queues: the refusal
/// names the upgrade).
pub(super) async fn check_queue_filter(sources: &[Queue], queue: Option<&str>) -> Result<()> {
    let Some(queue) = queue else {
        return Ok(());
    };
    check_queue_name(queue)?;
    for source in sources {
        let backend = source.backend();
        if backend.schema_version().await? < 2 {
            return Err(Error::needs_schema_v2(backend.table(), "a --queue filter"));
        }
    }
    Ok(())
}

/// Closes every queue's connection pools, each within [`crate::queue::CLOSE_DEADLINE`]
/// (call once a command is done).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// use icq::{ConnectOptions, Queue};
///
/// let options = ConnectOptions::default().creating_table(true);
/// let sources = vec![Queue::connect("shop", &url, &Default::default(), &options).await?];
/// let pending = icq::admin::pending(&sources, false).await?;
/// icq::admin::close(&sources).await;
/// assert_eq!(pending.rows.len(), 1);
/// # Ok(())
/// # }
/// ```
pub async fn close(sources: &[Queue]) {
    futures::future::join_all(sources.iter().map(Queue::close)).await;
}
