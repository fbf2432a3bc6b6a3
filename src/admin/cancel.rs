//! `icq cancel`: take pending commands out of the queue. A cancelled command is a dead
//! letter with `LastError = "cancelled by operator"`, so it stays visible, can be
//! requeued, and is purged like any dead letter. A running command named by its id is
//! cancelled too: its lease is cleared in the same statement, so the processor running it
//! loses the lease, stops its handler (within about 2 s; at once on PostgreSQL, which is
//! notified) and cannot stamp an outcome over the cancel. Bulk cancels (`--type`,
//! `--queue`) leave running commands alone.

use std::sync::Arc;

use serde::Serialize;

use super::{Progress, distinct, locate_checked};
use crate::command::{CommandId, State};
use crate::engine::Backend;
use crate::engine::admin::{
    CancelledRow, CommandCancelManyParams, CommandListParams, ListState, StateCountParams,
};
use crate::error::{Error, Result};
use crate::queue::Queue;

/// Rows cancelled per statement when cancelling a whole type.
const CANCEL_BATCH: u32 = 500;

/// What to cancel.
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
/// use icq::NewCommand;
/// use icq::admin::{CancelTarget, NoProgress, cancel, plan_cancel};
///
/// let a = queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?.id;
/// queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?;
///
/// let one = plan_cancel(&sources, &CancelTarget::Ids(vec![a])).await?;
/// let by_type = CancelTarget::Matching { type_name: Some("email.digest".into()), queue: None };
/// assert_eq!((one.total(), plan_cancel(&sources, &by_type).await?.total()), (1, 2));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelTarget {
    /// These pending rows, running ones included.
    Ids(Vec<CommandId>),
    /// Every pending, not running command of this type and/or queue (at least one).
    Matching {
        /// Only commands of this type.
        type_name: Option<String>,
        /// Only commands of this queue (refused on a version-1 table).
        queue: Option<String>,
    },
}

enum Work {
    Ids(Vec<(CommandId, WasState)>),
    Matching {
        type_name: Option<String>,
        queue: Option<String>,
    },
}

struct Part {
    source: String,
    backend: Arc<dyn Backend>,
    work: Work,
    count: u64,
}

/// A validated cancel, ready to confirm and apply.
///
/// Nothing is cancelled until it is applied with [`cancel`]: show [`CancelPlan::total`]
/// for a confirmation first.
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
/// use icq::NewCommand;
/// use icq::admin::{CancelTarget, NoProgress, cancel, plan_cancel};
///
/// let a = queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?.id;
/// queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?;
///
/// let digests = CancelTarget::Matching { type_name: Some("email.digest".into()), queue: None };
/// let plan = plan_cancel(&sources, &digests).await?;
/// assert_eq!((plan.total(), plan.sources()), (2, vec!["shop"]));
/// let other = CancelTarget::Matching { type_name: Some("other".into()), queue: None };
/// let nothing = plan_cancel(&sources, &other).await?;
/// assert!(nothing.sources().is_empty());
/// # Ok(())
/// # }
/// ```
pub struct CancelPlan {
    parts: Vec<Part>,
    /// The ids as named (without repeats): the report lists them in this order.
    named: Vec<CommandId>,
}

impl CancelPlan {
    /// How many rows the plan cancels (for a type, as counted when planning). See
    /// [`CancelPlan`]'s example.
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|p| p.count).sum()
    }

    /// How many of the rows named by id are running now (their handlers will be stopped).
    pub fn running(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| match &p.work {
                Work::Ids(ids) => ids
                    .iter()
                    .filter(|(_, was)| *was == WasState::Running)
                    .count() as u64,
                Work::Matching { .. } => 0,
            })
            .sum()
    }

    /// The sources with something to cancel. See [`CancelPlan`]'s example.
    pub fn sources(&self) -> Vec<&str> {
        self.parts
            .iter()
            .filter(|p| p.count > 0)
            .map(|p| p.source.as_str())
            .collect()
    }
}

/// What a cancelled command was when it was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WasState {
    /// Due or scheduled: it never ran this attempt.
    Pending,
    /// Running: a processor held its lease; it loses it and stops the handler.
    Running,
}

/// One command cancelled by its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CancelledCommand {
    /// Its id.
    pub id: CommandId,
    /// Pending or running when it was cancelled.
    pub was: WasState,
    /// The source holding it (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

/// The result of [`cancel`]: `{"cancelled": N, "were_running": R, "commands": [{"id":
/// ID, "was": "pending" | "running"}, …]}` (`commands` only when ids were named).
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
/// use icq::NewCommand;
/// use icq::admin::{CancelTarget, NoProgress, cancel, plan_cancel};
///
/// let a = queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?.id;
/// queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?;
///
/// let plan = plan_cancel(&sources, &CancelTarget::Ids(vec![a.clone()])).await?;
/// let report = cancel(&plan, &NoProgress).await?;
/// assert_eq!(
///     serde_json::to_value(report)?,
///     serde_json::json!({
///         "cancelled": 1,
///         "were_running": 0,
///         "commands": [{ "id": a, "was": "pending" }]
///     })
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CancelReport {
    /// Rows taken out of the queue.
    pub cancelled: u64,
    /// Of those, the ones a processor was running.
    pub were_running: u64,
    /// The commands named by id, each with what it was; empty (and left out of JSON) for
    /// a bulk cancel.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<CancelledCommand>,
}

/// Checks a cancel without changing anything: every id must exist ([`Error::NotFound`])
/// and be pending, running or not ([`Error::Refused`] otherwise, naming each); a queue
/// filter must name a queue of a version-2 table.
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
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?.id;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?.id;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions::default().with_until_idle(true), Default::default()).await?;
/// use icq::admin::{CancelTarget, plan_cancel};
/// use icq::{CommandId, Error};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let unknown = plan_cancel(&sources, &CancelTarget::Ids(vec![CommandId::new()])).await;
/// assert!(matches!(unknown, Err(Error::NotFound(_))));
/// let Err(Error::Refused(why)) = plan_cancel(&sources, &CancelTarget::Ids(vec![dead])).await else {
///     panic!("a dead letter cannot be cancelled");
/// };
/// assert!(why.contains("already a dead letter"), "{why}");
/// # Ok(())
/// # }
/// ```
pub async fn plan_cancel(sources: &[Queue], target: &CancelTarget) -> Result<CancelPlan> {
    match target {
        CancelTarget::Ids(ids) => plan_ids(sources, &distinct(ids)).await,
        CancelTarget::Matching { type_name, queue } => {
            if type_name.is_none() && queue.is_none() {
                return Err(Error::invalid(
                    "say what to cancel: ids, --type TYPE and/or --queue QUEUE",
                ));
            }
            super::check_queue_filter(sources, queue.as_deref()).await?;
            let mut parts = Vec::with_capacity(sources.len());
            for source in sources {
                let backend = source.backend().clone();
                let counts = backend
                    .state_count(&StateCountParams {
                        by_type: type_name.is_some(),
                        by_queue: false,
                        queue: queue.clone(),
                    })
                    .await?;
                let count = counts
                    .iter()
                    .filter(|c| type_name.is_none() || c.type_name == *type_name)
                    .map(|c| c.due + c.scheduled)
                    .sum();
                parts.push(Part {
                    source: source.name().to_owned(),
                    backend,
                    work: Work::Matching {
                        type_name: type_name.clone(),
                        queue: queue.clone(),
                    },
                    count,
                });
            }
            Ok(CancelPlan {
                parts,
                named: Vec::new(),
            })
        }
    }
}

async fn plan_ids(sources: &[Queue], ids: &[CommandId]) -> Result<CancelPlan> {
    if ids.is_empty() {
        return Err(Error::invalid(
            "name the commands to cancel (ids), or pass --type TYPE or --queue QUEUE",
        ));
    }
    let per_source = locate_checked(sources, ids, "cancelled", |row, state| match state {
        // One clause each, without `;`: refusals are joined with "; ".
        State::Completed => Err(format!(
            "command {} is completed, so there is nothing left to cancel",
            row.id
        )),
        State::Dead => Err(format!(
            "command {} is already a dead letter (delete it with `icq purge --dead-letters` \
             or run it again with `icq requeue {}`)",
            row.id, row.id
        )),
        State::Running | State::Due | State::Scheduled => Ok(()),
    })
    .await?;
    let mut parts = Vec::with_capacity(per_source.len());
    for (index, rows) in per_source {
        let backend = sources[index].backend().clone();
        let now = backend.clock_now().await?;
        parts.push(Part {
            source: sources[index].name().to_owned(),
            backend,
            count: rows.len() as u64,
            work: Work::Ids(
                rows.into_iter()
                    .map(|row| {
                        let was = if row.state(now) == State::Running {
                            WasState::Running
                        } else {
                            WasState::Pending
                        };
                        (row.id, was)
                    })
                    .collect(),
            ),
        });
    }
    Ok(CancelPlan {
        parts,
        named: ids.to_vec(),
    })
}

/// Applies a cancel plan. Explicit ids are cancelled in one guarded statement per
/// source, running ones included (their lease is cleared, so the processor running one
/// stops it; on PostgreSQL the same transaction notifies the processors); a row that
/// completed or died since the plan was made is left alone and the result says so. A
/// type or queue is cancelled in batches of `CANCEL_BATCH`, never more rows than were
/// counted when planning (new commands keep coming), running ones left alone.
///
/// A cancelled command becomes a dead letter with `LastError` `cancelled by operator`.
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
/// use icq::NewCommand;
/// use icq::admin::{CancelTarget, NoProgress, cancel, plan_cancel};
///
/// let a = queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?.id;
/// queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?;
///
/// let plan = plan_cancel(&sources, &CancelTarget::Ids(vec![a.clone()])).await?;
/// assert_eq!(cancel(&plan, &NoProgress).await?.cancelled, 1);
/// let row = queue.get(&a).await?.unwrap();
/// assert_eq!(row.last_error.as_deref(), Some("cancelled by operator"));
/// # Ok(())
/// # }
/// ```
pub async fn cancel(plan: &CancelPlan, progress: &dyn Progress) -> Result<CancelReport> {
    let mut report = CancelReport {
        cancelled: 0,
        were_running: 0,
        commands: Vec::new(),
    };
    let count = |report: &mut CancelReport, done: &[CancelledRow]| {
        report.cancelled += done.len() as u64;
        report.were_running += done.iter().filter(|row| row.was_running).count() as u64;
        progress.advance(done.len() as u64);
    };
    progress.begin("cancelling", plan.total());
    for part in &plan.parts {
        match &part.work {
            Work::Ids(ids) => {
                let params = CommandCancelManyParams {
                    ids: ids.iter().map(|(id, _)| id.clone()).collect(),
                    running: true,
                };
                let done = part.backend.command_cancel_many(&params).await?;
                count(&mut report, &done);
                // In the order the ids were named; the engine says what each one was.
                for (id, _) in ids {
                    if let Some(row) = done.iter().find(|row| same_id(&row.id, id)) {
                        report.commands.push(CancelledCommand {
                            id: id.clone(),
                            was: if row.was_running {
                                WasState::Running
                            } else {
                                WasState::Pending
                            },
                            source: part.source.clone(),
                        });
                    }
                }
                if done.len() < ids.len() {
                    progress.finish();
                    let left: Vec<String> = ids
                        .iter()
                        .filter(|(id, _)| !done.iter().any(|row| same_id(&row.id, id)))
                        .map(|(id, _)| id.to_string())
                        .collect();
                    return Err(Error::Conflict(format!(
                        "source `{}`: {} of the {} commands completed or were dead-lettered \
                         while being cancelled and were left alone ({}; {} cancelled in all); \
                         check them with `icq show ID`",
                        part.source,
                        left.len(),
                        ids.len(),
                        left.join(", "),
                        report.cancelled
                    )));
                }
            }
            Work::Matching { type_name, queue } => {
                let mut left = part.count;
                for state in [ListState::Due, ListState::Scheduled] {
                    while left > 0 {
                        let page = part
                            .backend
                            .command_list(&CommandListParams {
                                state,
                                type_name: type_name.clone(),
                                queue: queue.clone(),
                                limit: CANCEL_BATCH.min(u32::try_from(left).unwrap_or(u32::MAX)),
                                after: None,
                                before: None,
                            })
                            .await?;
                        if page.is_empty() {
                            break;
                        }
                        let ids = page.into_iter().map(|row| row.id).collect();
                        let done = part
                            .backend
                            .command_cancel_many(&CommandCancelManyParams {
                                ids,
                                running: false,
                            })
                            .await?;
                        if done.is_empty() {
                            break;
                        }
                        count(&mut report, &done);
                        left = left.saturating_sub(done.len() as u64);
                    }
                }
            }
        }
    }
    progress.finish();
    report.commands.sort_by_key(|c| {
        plan.named
            .iter()
            .position(|id| same_id(&c.id, id))
            .unwrap_or(usize::MAX)
    });
    Ok(report)
}

/// The same row: equal as stored, or the same UUID in another spelling.
fn same_id(stored: &CommandId, asked: &CommandId) -> bool {
    stored == asked || (stored.as_uuid().is_some() && stored.as_uuid() == asked.as_uuid())
}
