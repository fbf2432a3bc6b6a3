//! Operator operations across one or many sources: counts, dead letters, requeue, purge,
//! replay and one-off scheduling. Every `icq` operator subcommand is a thin layer over one
//! function here; each returns a typed report whose `Serialize` form is exactly the JSON
//! document of the product contract (SPEC §7), and [`crate::output`] renders it.
//!
//! Guarantees:
//!
//! - **Nothing changes on a bad request.** Ids are located in every selected source and
//!   their states checked before anything is written: an unknown id is
//!   [`Error::NotFound`] (exit 3), a row in the wrong state is [`Error::Usage`] (exit 2),
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
mod list;

pub use cancel::{CancelPlan, CancelReport, CancelTarget, cancel, plan_cancel};
pub use list::{ListReport, ListRequest, ListedCommand, list};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::command::{CommandId, CommandRow, Context, NewCommand, RunAt, State};
use crate::engine::Backend;
use crate::engine::admin::{
    CommandRequeueManyParams, DeadLetterFilter, DeadLetterListParams, DeadLetterRequeueBatchParams,
    DeadLetterSummary, FinishedDeleteBatchParams, FinishedFilter, FinishedKind, StateCount,
    StateCountParams,
};
use crate::error::{Error, Result};
use crate::sources::OpenSource;

/// Rows requeued per statement by `requeue --all-dead`.
pub const REQUEUE_BATCH: u32 = 1000;

/// Rows deleted per batch by `purge`.
pub const PURGE_BATCH: u32 = 5000;

/// Commands inserted per bulk-schedule call (one progress step).
pub const SCHEDULE_CHUNK: usize = 1000;

/// Dead letters listed when no `--limit` is given.
pub const DEFAULT_DEAD_LETTER_LIMIT: u32 = 50;

/// Receives progress of long operations (a terminal progress bar, or nothing).
pub trait Progress: Send + Sync {
    /// A new phase of `total` units starts, described by `label`.
    fn begin(&self, label: &str, total: u64);
    /// `n` more units are done.
    fn advance(&self, n: u64);
    /// The operation is over (successfully or not).
    fn finish(&self);
}

/// Progress that is not shown anywhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin(&self, _label: &str, _total: u64) {}
    fn advance(&self, _n: u64) {}
    fn finish(&self) {}
}

// ---------------------------------------------------------------------------------------
// pending

/// The counts of one source (and one type, with `--by-type`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingCount {
    /// The source name.
    pub source: String,
    /// The counts; `type` is present only when counting by type.
    #[serde(flatten)]
    pub counts: StateCount,
}

/// The result of [`pending`]: serialized as an array of [`PendingCount`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct PendingReport {
    /// One entry per source (per source and type when `by_type`).
    pub rows: Vec<PendingCount>,
    /// Whether the counts are per type.
    #[serde(skip)]
    pub by_type: bool,
    /// How many sources were asked (the table shows a source column when more than one).
    #[serde(skip)]
    pub source_count: usize,
}

/// Counts due, scheduled, running, dead and completed rows in every source: one aggregate
/// query per source.
pub async fn pending(sources: &[OpenSource], by_type: bool) -> Result<PendingReport> {
    let params = StateCountParams { by_type };
    let counted = futures::future::try_join_all(sources.iter().map(|s| async move {
        Ok::<_, Error>((s, s.queue.backend().state_count(&params).await?))
    }))
    .await?;
    let rows = counted
        .into_iter()
        .flat_map(|(source, counts)| {
            counts.into_iter().map(|counts| PendingCount {
                source: source.name.clone(),
                counts,
            })
        })
        .collect();
    Ok(PendingReport {
        rows,
        by_type,
        source_count: sources.len(),
    })
}

// ---------------------------------------------------------------------------------------
// dead letters

/// Which dead letters to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterQuery {
    /// Only this command type.
    pub type_name: Option<String>,
    /// At most this many, newest first, across all sources.
    pub limit: u32,
}

impl Default for DeadLetterQuery {
    fn default() -> Self {
        DeadLetterQuery {
            type_name: None,
            limit: DEFAULT_DEAD_LETTER_LIMIT,
        }
    }
}

/// One listed dead letter and its source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterRow {
    /// The source name.
    pub source: String,
    /// The row.
    #[serde(flatten)]
    pub summary: DeadLetterSummary,
}

/// The result of [`dead_letters`]: serialized as an array of [`DeadLetterRow`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct DeadLetterReport {
    /// The dead letters, newest first.
    pub rows: Vec<DeadLetterRow>,
    /// How many sources were asked.
    #[serde(skip)]
    pub source_count: usize,
}

/// Lists dead letters across every source, newest first, at most `query.limit` in all.
pub async fn dead_letters(
    sources: &[OpenSource],
    query: &DeadLetterQuery,
) -> Result<DeadLetterReport> {
    let params = DeadLetterListParams {
        type_name: query.type_name.clone(),
        limit: query.limit,
    };
    let params = &params;
    let listed = futures::future::try_join_all(sources.iter().map(|s| async move {
        Ok::<_, Error>((s, s.queue.backend().dead_letter_list(params).await?))
    }))
    .await?;
    let mut rows: Vec<DeadLetterRow> = listed
        .into_iter()
        .flat_map(|(source, summaries)| {
            summaries.into_iter().map(|summary| DeadLetterRow {
                source: source.name.clone(),
                summary,
            })
        })
        .collect();
    rows.sort_by(|a, b| {
        b.summary
            .dead_lettered_at
            .cmp(&a.summary.dead_lettered_at)
            .then_with(|| a.source.cmp(&b.source))
            .then_with(|| a.summary.id.cmp(&b.summary.id))
    });
    rows.truncate(query.limit as usize);
    Ok(DeadLetterReport {
        rows,
        source_count: sources.len(),
    })
}

/// One row in full, with its source and its state when it was read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShownCommand {
    /// The source name.
    pub source: String,
    /// Every column.
    #[serde(flatten)]
    pub row: CommandRow,
    /// The row's state at the database's `now`.
    pub state: State,
}

/// Reads one command in full from whichever selected source holds it.
pub async fn show(sources: &[OpenSource], id: CommandId) -> Result<ShownCommand> {
    let located = locate(sources, std::slice::from_ref(&id)).await?;
    if let Some(missing) = located.missing(std::slice::from_ref(&id)) {
        return Err(not_found(&missing, sources, "nothing to show"));
    }
    let found = located.rows.into_iter().next();
    let Some((index, row)) = found else {
        return Err(not_found(&[id], sources, "nothing to show"));
    };
    let source = &sources[index];
    let now = source.queue.backend().clock_now().await?;
    Ok(ShownCommand {
        source: source.name.clone(),
        state: row.state(now),
        row,
    })
}

// ---------------------------------------------------------------------------------------
// locating ids

/// Rows found for a set of ids, with the index of the source holding each.
struct Located {
    rows: Vec<(usize, CommandRow)>,
}

impl Located {
    /// The ids of `wanted` that no source holds, or `None` when every one was found.
    fn missing(&self, wanted: &[CommandId]) -> Option<Vec<CommandId>> {
        let found: HashSet<&CommandId> = self.rows.iter().map(|(_, row)| &row.id).collect();
        let missing: Vec<CommandId> = wanted
            .iter()
            .filter(|id| !found.contains(id))
            .cloned()
            .collect();
        (!missing.is_empty()).then_some(missing)
    }
}

/// Reads the rows of `ids` from every source.
async fn locate(sources: &[OpenSource], ids: &[CommandId]) -> Result<Located> {
    let found =
        futures::future::try_join_all(sources.iter().enumerate().map(|(i, s)| async move {
            Ok::<_, Error>((i, s.queue.backend().command_get_many(ids).await?))
        }))
        .await?;
    Ok(Located {
        rows: found
            .into_iter()
            .flat_map(|(i, rows)| rows.into_iter().map(move |row| (i, row)))
            .collect(),
    })
}

/// `ids` without repeats, in their first-seen order.
fn distinct(ids: &[CommandId]) -> Vec<CommandId> {
    let mut seen = HashSet::new();
    ids.iter().filter(|id| seen.insert(*id)).cloned().collect()
}

fn list_ids(ids: &[CommandId]) -> String {
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn where_sources(sources: &[OpenSource]) -> String {
    match sources {
        [one] => format!("in source `{}`", one.name),
        many => format!(
            "in any of the sources {}",
            many.iter()
                .map(|s| format!("`{}`", s.name))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn not_found(ids: &[CommandId], sources: &[OpenSource], consequence: &str) -> Error {
    let what = match ids {
        [one] => format!("no command with id {one}"),
        many => format!("no commands with ids {}", list_ids(many)),
    };
    Error::NotFound(format!("{what} {}; {consequence}", where_sources(sources)))
}

fn state_name(state: State) -> &'static str {
    match state {
        State::Due => "due",
        State::Scheduled => "scheduled",
        State::Running => "running",
        State::Completed => "completed",
        State::Dead => "dead",
    }
}

// ---------------------------------------------------------------------------------------
// requeue

/// What to requeue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequeueTarget {
    /// These rows: dead ones, or pending ones not currently running.
    Ids(Vec<CommandId>),
    /// Every dead letter (of one type when given), in batches.
    AllDead {
        /// Only dead letters of this type.
        type_name: Option<String>,
    },
}

/// The work of a requeue in one source.
enum RequeueWork {
    Ids(Vec<CommandId>),
    AllDead(DeadLetterFilter),
}

struct RequeuePart {
    source: String,
    backend: Arc<dyn Backend>,
    work: RequeueWork,
    count: u64,
}

/// A validated requeue, ready to confirm and apply.
pub struct RequeuePlan {
    parts: Vec<RequeuePart>,
}

impl RequeuePlan {
    /// How many rows the plan requeues (for `--all-dead`, as counted when planning).
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|p| p.count).sum()
    }

    /// The rows per source, in source order (sources with nothing to do left out).
    pub fn per_source(&self) -> Vec<(&str, u64)> {
        self.parts
            .iter()
            .filter(|p| p.count > 0)
            .map(|p| (p.source.as_str(), p.count))
            .collect()
    }
}

/// The result of [`requeue`]: `{"requeued": N}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RequeueReport {
    /// Rows put back to pending.
    pub requeued: u64,
}

/// Checks a requeue without changing anything: every id must exist in a selected source
/// ([`Error::NotFound`] otherwise) and be dead or pending without a live lease
/// ([`Error::Usage`] otherwise); `--all-dead` counts the dead letters as of now.
pub async fn plan_requeue(sources: &[OpenSource], target: &RequeueTarget) -> Result<RequeuePlan> {
    match target {
        RequeueTarget::Ids(ids) => plan_requeue_ids(sources, &distinct(ids)).await,
        RequeueTarget::AllDead { type_name } => {
            let mut parts = Vec::with_capacity(sources.len());
            for source in sources {
                let backend = source.queue.backend().clone();
                let filter = DeadLetterFilter {
                    type_name: type_name.clone(),
                    dead_before: backend.clock_now().await?,
                };
                let count = backend.dead_letter_count(&filter).await?;
                parts.push(RequeuePart {
                    source: source.name.clone(),
                    backend,
                    work: RequeueWork::AllDead(filter),
                    count,
                });
            }
            Ok(RequeuePlan { parts })
        }
    }
}

async fn plan_requeue_ids(sources: &[OpenSource], ids: &[CommandId]) -> Result<RequeuePlan> {
    if ids.is_empty() {
        return Err(Error::Usage(
            "name the commands to requeue (ids), or pass --all-dead".into(),
        ));
    }
    let located = locate(sources, ids).await?;
    if let Some(missing) = located.missing(ids) {
        return Err(not_found(&missing, sources, "nothing was requeued"));
    }
    let mut refusals = Vec::new();
    let mut per_source: HashMap<usize, Vec<CommandId>> = HashMap::new();
    for (index, row) in &located.rows {
        let now = Utc::now();
        match row.state(now) {
            State::Completed => refusals.push(format!(
                "command {} is completed; run it again as a new command with `icq replay {}`",
                row.id, row.id
            )),
            State::Running => refusals.push(format!(
                "command {} is running (leased until {}); requeue it once the lease has expired",
                row.id,
                row.locked_until
                    .map_or_else(|| "now".to_owned(), crate::command::format_timestamp)
            )),
            State::Dead | State::Due | State::Scheduled => {
                per_source.entry(*index).or_default().push(row.id.clone());
            }
        }
    }
    if !refusals.is_empty() {
        return Err(Error::Usage(format!(
            "{}; nothing was requeued",
            refusals.join("; ")
        )));
    }
    let parts = sources
        .iter()
        .enumerate()
        .filter_map(|(index, source)| {
            let ids = per_source.remove(&index)?;
            Some(RequeuePart {
                source: source.name.clone(),
                backend: source.queue.backend().clone(),
                count: ids.len() as u64,
                work: RequeueWork::Ids(ids),
            })
        })
        .collect();
    Ok(RequeuePlan { parts })
}

/// Applies a requeue plan: explicit ids in one guarded transaction per source; dead
/// letters in batches of [`REQUEUE_BATCH`], each its own short statement.
pub async fn requeue(plan: &RequeuePlan, progress: &dyn Progress) -> Result<RequeueReport> {
    let mut requeued = 0;
    for part in &plan.parts {
        match &part.work {
            RequeueWork::Ids(ids) => {
                let params = CommandRequeueManyParams { ids: ids.clone() };
                let done = part.backend.command_requeue_many(&params).await?;
                if done != ids.len() as u64 {
                    return Err(Error::Usage(format!(
                        "source `{}`: some of the commands changed state while being requeued \
                         (a processor or another operator touched them), so none of them were \
                         requeued there{}; check them with `icq dead-letters show ID` and try again",
                        part.source,
                        if requeued > 0 {
                            format!(" ({requeued} were requeued in earlier sources)")
                        } else {
                            String::new()
                        }
                    )));
                }
                requeued += done;
            }
            RequeueWork::AllDead(filter) => {
                if part.count == 0 {
                    continue;
                }
                progress.begin(
                    &format!("requeueing dead letters in {}", part.source),
                    part.count,
                );
                let params = DeadLetterRequeueBatchParams {
                    filter: filter.clone(),
                    limit: REQUEUE_BATCH,
                };
                loop {
                    let done = match part.backend.dead_letter_requeue_batch(&params).await {
                        Ok(done) => done,
                        Err(err) => {
                            progress.finish();
                            return Err(err);
                        }
                    };
                    requeued += done;
                    progress.advance(done);
                    if done < u64::from(REQUEUE_BATCH) {
                        break;
                    }
                }
                progress.finish();
            }
        }
    }
    Ok(RequeueReport { requeued })
}

// ---------------------------------------------------------------------------------------
// purge

/// What to purge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeRequest {
    /// Delete completed rows.
    pub completed: bool,
    /// Delete dead letters.
    pub dead_letters: bool,
    /// Only rows finished longer ago than this (default: all of them).
    pub older_than: Option<Duration>,
}

struct PurgePart {
    source: String,
    backend: Arc<dyn Backend>,
    filter: FinishedFilter,
    count: u64,
}

/// A purge with its rows counted under a fixed cutoff, ready to confirm and apply.
pub struct PurgePlan {
    parts: Vec<PurgePart>,
}

/// Rows of one kind in one source, deleted or to delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PurgeCount {
    /// The source name.
    pub source: String,
    /// Completed rows or dead letters.
    pub kind: FinishedKind,
    /// How many rows.
    pub count: u64,
}

/// The result of [`purge`] (or of a dry run): `{"deleted": N}` or `{"would_delete": N}`,
/// with the split by state: `"completed"` and `"dead_letters"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeReport {
    /// True when nothing was deleted and the counts say what would be.
    pub dry_run: bool,
    /// The counts per source and kind.
    pub counts: Vec<PurgeCount>,
    /// How many sources were asked.
    pub source_count: usize,
}

impl PurgeReport {
    /// All rows deleted (or that would be).
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|c| c.count).sum()
    }
}

impl Serialize for PurgeReport {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(3))?;
        let key = if self.dry_run {
            "would_delete"
        } else {
            "deleted"
        };
        let of = |kind| {
            self.counts
                .iter()
                .filter(|c| c.kind == kind)
                .map(|c| c.count)
                .sum::<u64>()
        };
        map.serialize_entry(key, &self.total())?;
        map.serialize_entry("completed", &of(FinishedKind::Completed))?;
        map.serialize_entry("dead_letters", &of(FinishedKind::DeadLetters))?;
        map.end()
    }
}

impl PurgePlan {
    /// How many rows the plan deletes, as counted when planning.
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|p| p.count).sum()
    }

    /// The counts as a dry-run report.
    pub fn dry_run_report(&self) -> PurgeReport {
        PurgeReport {
            dry_run: true,
            counts: self.counts(|p| p.count),
            source_count: self.source_count(),
        }
    }

    fn counts(&self, count: impl Fn(&PurgePart) -> u64) -> Vec<PurgeCount> {
        self.parts
            .iter()
            .map(|p| PurgeCount {
                source: p.source.clone(),
                kind: p.filter.kind,
                count: count(p),
            })
            .collect()
    }

    fn source_count(&self) -> usize {
        self.parts
            .iter()
            .map(|p| &p.source)
            .collect::<HashSet<_>>()
            .len()
    }
}

/// Counts what a purge would delete, under a cutoff fixed now (`now - older_than` by the
/// database's clock). At least one of `completed` and `dead_letters` is required.
pub async fn plan_purge(sources: &[OpenSource], request: &PurgeRequest) -> Result<PurgePlan> {
    let mut kinds = Vec::new();
    if request.completed {
        kinds.push(FinishedKind::Completed);
    }
    if request.dead_letters {
        kinds.push(FinishedKind::DeadLetters);
    }
    if kinds.is_empty() {
        return Err(Error::Usage(
            "say what to purge: --completed, --dead-letters, or both".into(),
        ));
    }
    let age = match request.older_than {
        None => chrono::TimeDelta::zero(),
        Some(age) => chrono::TimeDelta::from_std(age)
            .map_err(|_| Error::Usage("--older-than is too long".into()))?,
    };
    let mut parts = Vec::new();
    for source in sources {
        let backend = source.queue.backend().clone();
        let now = backend.clock_now().await?;
        let before = now
            .checked_sub_signed(age)
            .ok_or_else(|| Error::Usage("--older-than reaches before the year 0".into()))?;
        for kind in &kinds {
            let filter = FinishedFilter {
                kind: *kind,
                before,
            };
            let count = backend.finished_count(&filter).await?;
            parts.push(PurgePart {
                source: source.name.clone(),
                backend: backend.clone(),
                filter,
                count,
            });
        }
    }
    Ok(PurgePlan { parts })
}

/// Deletes what the plan counted, in batches of [`PURGE_BATCH`] rows by primary key.
pub async fn purge(plan: &PurgePlan, progress: &dyn Progress) -> Result<PurgeReport> {
    let mut deleted = Vec::with_capacity(plan.parts.len());
    for part in &plan.parts {
        let mut count = 0;
        if part.count > 0 {
            let what = match part.filter.kind {
                FinishedKind::Completed => "completed commands",
                FinishedKind::DeadLetters => "dead letters",
            };
            progress.begin(&format!("deleting {what} in {}", part.source), part.count);
            let params = FinishedDeleteBatchParams {
                filter: part.filter,
                limit: PURGE_BATCH,
            };
            loop {
                let done = match part.backend.finished_delete_batch(&params).await {
                    Ok(done) => done,
                    Err(err) => {
                        progress.finish();
                        return Err(err);
                    }
                };
                count += done;
                progress.advance(done);
                if done < u64::from(PURGE_BATCH) {
                    break;
                }
            }
            progress.finish();
        }
        deleted.push(PurgeCount {
            source: part.source.clone(),
            kind: part.filter.kind,
            count,
        });
    }
    Ok(PurgeReport {
        dry_run: false,
        counts: deleted,
        source_count: plan.source_count(),
    })
}

// ---------------------------------------------------------------------------------------
// replay

/// One replayed command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Replayed {
    /// The completed or dead row that was copied.
    pub from: CommandId,
    /// The new pending row.
    pub id: CommandId,
    /// The source both live in (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

/// The result of [`replay`]: `{"replayed": [{"from": ID, "id": NEW_ID}, …]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// The new rows, in the order the ids were given.
    pub replayed: Vec<Replayed>,
    /// How many sources were asked.
    #[serde(skip)]
    pub source_count: usize,
}

/// Schedules, for every id, a new pending row copying the type, payload and captured
/// context of a completed or dead row. The old rows are left as they are.
pub async fn replay(sources: &[OpenSource], ids: &[CommandId]) -> Result<ReplayReport> {
    let ids = distinct(ids);
    if ids.is_empty() {
        return Err(Error::Usage("name the commands to replay (ids)".into()));
    }
    let located = locate(sources, &ids).await?;
    if let Some(missing) = located.missing(&ids) {
        return Err(not_found(&missing, sources, "nothing was replayed"));
    }
    let now = Utc::now();
    let pending: Vec<String> = located
        .rows
        .iter()
        .filter_map(|(_, row)| match row.state(now) {
            State::Completed | State::Dead => None,
            State::Running => Some(format!(
                "command {} is running (leased until {}); replay it once it has completed or \
                 been dead-lettered (see its state with `icq show {}`)",
                row.id,
                row.locked_until
                    .map_or_else(|| "now".to_owned(), crate::command::format_timestamp),
                row.id
            )),
            state => Some(format!(
                "command {} is still pending ({}); it will run on its own (`icq requeue {}` \
                 makes it due now)",
                row.id,
                state_name(state),
                row.id
            )),
        })
        .collect();
    if !pending.is_empty() {
        return Err(Error::Usage(format!(
            "{}; only completed or dead commands can be replayed; nothing was replayed",
            pending.join("; ")
        )));
    }
    let mut replayed = Vec::with_capacity(located.rows.len());
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
        let commands: Vec<NewCommand> = rows
            .iter()
            .map(|row| {
                NewCommand::new(row.type_name.clone(), row.payload.clone()).context(row.context())
            })
            .collect();
        let new_ids = source.queue.schedule_many(&commands).await?;
        replayed.extend(rows.iter().zip(new_ids).map(|(row, id)| Replayed {
            from: row.id.clone(),
            id,
            source: source.name.clone(),
        }));
    }
    let order: HashMap<CommandId, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.clone(), i))
        .collect();
    replayed.sort_by_key(|r| order.get(&r.from).copied().unwrap_or(usize::MAX));
    Ok(ReplayReport {
        replayed,
        source_count: sources.len(),
    })
}

// ---------------------------------------------------------------------------------------
// schedule

/// The one source a command is scheduled into: scheduling needs an unambiguous target.
pub fn one_source(sources: &[OpenSource]) -> Result<&OpenSource> {
    match sources {
        [one] => Ok(one),
        [] => Err(Error::Usage(
            "no source is configured to schedule into".into(),
        )),
        many => Err(Error::Usage(format!(
            "{} sources are configured ({}); say which one to schedule into with --source NAME",
            many.len(),
            many.iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The result of scheduling one command: `{"id": ID}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scheduled {
    /// The new command's id.
    pub id: CommandId,
    /// The source it was scheduled into (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

/// The result of scheduling from a file: `{"ids": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduledMany {
    /// The new commands' ids, in line order.
    pub ids: Vec<CommandId>,
    /// The source they were scheduled into (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

/// Schedules one command into `source`.
pub async fn schedule(source: &OpenSource, command: &NewCommand) -> Result<Scheduled> {
    command.validate()?;
    let id = source.queue.schedule(command).await?;
    Ok(Scheduled {
        id,
        source: source.name.clone(),
    })
}

/// Schedules many commands into `source` through the engine's bulk path, in chunks of
/// [`SCHEDULE_CHUNK`] (one progress step each). Every command is validated before the
/// first insert.
pub async fn schedule_many(
    source: &OpenSource,
    commands: &[NewCommand],
    progress: &dyn Progress,
) -> Result<ScheduledMany> {
    for command in commands {
        command.validate()?;
    }
    let mut ids = Vec::with_capacity(commands.len());
    progress.begin(
        &format!("scheduling into {}", source.name),
        commands.len() as u64,
    );
    for chunk in commands.chunks(SCHEDULE_CHUNK) {
        match source.queue.schedule_many(chunk).await {
            Ok(new) => ids.extend(new),
            Err(err) => {
                progress.finish();
                return Err(err);
            }
        }
        progress.advance(chunk.len() as u64);
    }
    progress.finish();
    Ok(ScheduledMany {
        ids,
        source: source.name.clone(),
    })
}

/// One line of a `--from-file` JSON Lines document.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobLine {
    #[serde(rename = "type")]
    type_name: String,
    payload: serde_json::Value,
    #[serde(default)]
    run_at: Option<DateTime<Utc>>,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    tenant_id: Option<String>,
    #[serde(default)]
    correlation_id: Option<String>,
}

/// Parses a JSON Lines document of commands: one object per line,
/// `{"type": …, "payload": …, "run_at"?: RFC 3339, "user_id"?, "roles"?: [...],
/// "tenant_id"?, "correlation_id"?}`; blank lines are skipped. The first bad line is an
/// [`Error::Usage`] naming `origin` and the line number.
pub fn parse_jobs(text: &str, origin: &str) -> Result<Vec<NewCommand>> {
    let mut commands = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let number = index + 1;
        let job: JobLine = serde_json::from_str(line)
            .map_err(|e| Error::Usage(format!("{origin}:{number}: {e}; nothing was scheduled")))?;
        let command = NewCommand::new(job.type_name, job.payload)
            .run_at(job.run_at.map_or(RunAt::Now, RunAt::At))
            .context(Context {
                user_id: job.user_id,
                roles: job.roles,
                tenant_id: job.tenant_id,
                correlation_id: job.correlation_id,
            });
        command
            .validate()
            .map_err(|e| Error::Usage(format!("{origin}:{number}: {e}; nothing was scheduled")))?;
        commands.push(command);
    }
    if commands.is_empty() {
        return Err(Error::Usage(format!(
            "{origin} holds no commands (one JSON object per line)"
        )));
    }
    Ok(commands)
}

/// Reads a payload argument: JSON text, `@path` for a file's contents, or `@-` for stdin.
/// Text that is not JSON is an [`Error::Usage`] carrying the parse error.
pub fn read_payload(argument: &str) -> Result<serde_json::Value> {
    let (text, origin) = match argument.strip_prefix('@') {
        Some("-") => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(Error::io("reading the payload from stdin"))?;
            (text, "the payload on stdin".to_owned())
        }
        Some(path) => (
            std::fs::read_to_string(path)
                .map_err(Error::io(format!("reading the payload file {path}")))?,
            format!("the payload file {path}"),
        ),
        None => (argument.to_owned(), "--payload".to_owned()),
    };
    serde_json::from_str(&text).map_err(|e| {
        Error::Usage(format!(
            "{origin} is not JSON: {e} (pass a JSON document such as '{{\"order_id\": 42}}', \
             or @file to read one)"
        ))
    })
}

// ---------------------------------------------------------------------------------------
// values on the command line

/// Parses a duration like `30s`, `5m`, `12h`, `7d`, `2w` or a sum such as `1h30m`.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let bad = || {
        Error::Usage(format!(
            "`{text}` is not a duration: write a number and a unit (s, m, h, d or w), \
             like 30s, 5m, 12h, 7d or 1h30m"
        ))
    };
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    if rest.starts_with('-') {
        return Err(Error::Usage(format!(
            "`{text}` must not be negative: write how long, like 30s, 5m or 7d"
        )));
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| bad())?;
        let after = &rest[digits..];
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let seconds = match &after[..unit_len] {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            "w" => 604_800,
            _ => return Err(bad()),
        };
        total = number
            .checked_mul(seconds)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(bad)?;
        rest = &after[unit_len..];
    }
    Ok(Duration::from_secs(total))
}

/// Parses an RFC 3339 instant (`2026-01-31T12:00:00Z`, any offset) as UTC.
pub fn parse_instant(text: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|at| at.with_timezone(&Utc))
        .map_err(|e| {
            Error::Usage(format!(
                "`{text}` is not an RFC 3339 instant ({e}): write it like 2026-01-31T12:00:00Z"
            ))
        })
}

/// Closes every source's connection pool (call once a command is done).
pub async fn close(sources: &[OpenSource]) {
    for source in sources {
        source.queue.backend().close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_sums() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("12h").unwrap(), Duration::from_secs(43_200));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        for bad in [
            "",
            "7",
            "d",
            "7x",
            "1.5h",
            "1h 30m",
            "99999999999999999999w",
        ] {
            let err = parse_duration(bad).unwrap_err();
            assert!(
                err.to_string().contains("like 30s, 5m, 12h, 7d"),
                "{bad}: {err}"
            );
            assert_eq!(err.exit_code(), 2);
        }
        let negative = parse_duration("-1d").unwrap_err();
        assert!(
            negative.to_string().contains("must not be negative"),
            "{negative}"
        );
        assert_eq!(negative.exit_code(), 2);
    }

    #[test]
    fn job_lines_parse_and_bad_lines_name_their_number() {
        let text = "{\"type\":\"a\",\"payload\":{\"n\":1}}\n\n\
                    {\"type\":\"b\",\"payload\":2,\"run_at\":\"2030-01-01T00:00:00Z\",\"roles\":[\"x\"]}\n";
        let commands = parse_jobs(text, "jobs.jsonl").unwrap();
        assert_eq!(commands.len(), 2);
        assert_eq!(commands[1].context.roles, vec!["x"]);
        assert!(matches!(commands[1].run_at, RunAt::At(_)));

        let err = parse_jobs(
            "{\"type\":\"a\",\"payload\":1}\n{\"type\":\"a\"}\n",
            "jobs.jsonl",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("jobs.jsonl:2: missing field `payload`"),
            "{err}"
        );
        let err = parse_jobs("{\"type\":\"\",\"payload\":1}", "f").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("f:1: a command type must not be empty"),
            "{err}"
        );
        let err = parse_jobs("{\"type\":\"a\",\"payload\":1,\"typo\":1}", "f").unwrap_err();
        assert!(err.to_string().contains("unknown field `typo`"), "{err}");
    }

    #[test]
    fn payloads_must_be_json() {
        assert_eq!(
            read_payload("{\"a\":1}").unwrap(),
            serde_json::json!({"a": 1})
        );
        let err = read_payload("not json").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--payload is not JSON: expected"),
            "{err}"
        );
        assert_eq!(err.exit_code(), 2);
    }
}
