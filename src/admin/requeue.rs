//! `icq requeue`: put commands back to pending now, by id or every dead letter in batches.

use std::sync::Arc;

use serde::Serialize;

use crate::command::{CommandId, State};
use crate::engine::Backend;
use crate::engine::admin::{
    CommandRequeueManyParams, DeadLetterFilter, DeadLetterPageParams, UniqueKeyHoldersParams,
};
use crate::error::{Error, Result};
use crate::queue::Queue;

use super::{Progress, distinct, locate_checked};

/// Rows requeued per statement by `requeue --all-dead`.
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
/// use icq::admin::{NoProgress, REQUEUE_BATCH, RequeueTarget, plan_requeue, requeue};
///
/// // `sources`: one source holding a dead letter `dead`.
/// // `--all-dead` works through the dead letters REQUEUE_BATCH rows per statement.
/// let plan = plan_requeue(&sources, &RequeueTarget::AllDead { type_name: None, queue: None }).await?;
/// assert!(plan.total() <= u64::from(REQUEUE_BATCH));
/// requeue(&plan, &NoProgress).await?;
/// # Ok(())
/// # }
/// ```
pub const REQUEUE_BATCH: u32 = 1000;

/// What to requeue.
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
/// use icq::admin::{RequeueTarget, plan_requeue};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let these = RequeueTarget::Ids(vec![dead]);
/// let every_boom = RequeueTarget::AllDead { type_name: Some("boom".into()), queue: None };
/// assert_eq!(plan_requeue(&sources, &these).await?.total(), 1);
/// assert_eq!(plan_requeue(&sources, &every_boom).await?.total(), 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequeueTarget {
    /// These rows: dead ones, or pending ones not currently running.
    Ids(Vec<CommandId>),
    /// Every dead letter (of one type and/or queue when given), in batches.
    AllDead {
        /// Only dead letters of this type.
        type_name: Option<String>,
        /// Only dead letters of this queue (refused on a version-1 table).
        queue: Option<String>,
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
    /// Rows named by id that stay dead: a pending row holds their unique key.
    skipped: Vec<Skipped>,
}

/// A dead letter a requeue left dead because a pending row holds its unique key (at
/// most one pending row per key): `{"id", "unique_key", "held_by", "reason"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The dead letter, still dead.
    pub id: CommandId,
    /// Its unique key.
    pub unique_key: String,
    /// The pending row holding the key.
    pub held_by: CommandId,
    /// `unique key K is held by pending row ID`.
    pub reason: String,
    /// The source holding both (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

impl Skipped {
    fn new(source: &str, id: CommandId, unique_key: String, held_by: CommandId) -> Skipped {
        Skipped {
            reason: format!("unique key {unique_key} is held by pending row {held_by}"),
            id,
            unique_key,
            held_by,
            source: source.to_owned(),
        }
    }
}

/// A validated requeue, ready to confirm and apply.
///
/// Nothing is requeued until it is applied with [`requeue`].
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
/// use icq::admin::{RequeueTarget, plan_requeue};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let plan = plan_requeue(&sources, &RequeueTarget::AllDead { type_name: None, queue: None }).await?;
/// assert_eq!(plan.total(), 1);
/// assert_eq!(plan.per_source(), [("shop", 1)]);
/// # Ok(())
/// # }
/// ```
pub struct RequeuePlan {
    parts: Vec<RequeuePart>,
}

impl RequeuePlan {
    /// How many rows the plan requeues (for `--all-dead`, as counted when planning). See
    /// [`RequeuePlan`]'s example.
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|p| p.count).sum()
    }

    /// The rows named by id that will stay dead because a pending row holds their unique
    /// key (known when planning; `--all-dead` finds its own while it runs).
    pub fn skipped(&self) -> Vec<&Skipped> {
        self.parts.iter().flat_map(|p| &p.skipped).collect()
    }

    /// The rows per source, in source order (sources with nothing to do left out). See
    /// [`RequeuePlan`]'s example.
    pub fn per_source(&self) -> Vec<(&str, u64)> {
        self.parts
            .iter()
            .filter(|p| p.count > 0)
            .map(|p| (p.source.as_str(), p.count))
            .collect()
    }
}

/// The result of [`requeue`]: `{"requeued": N}`, and `"skipped": [{"id", "unique_key",
/// "held_by", "reason"}, …]` when dead letters stayed dead because a pending row holds
/// their unique key (for `--all-dead`, at most [`REQUEUE_BATCH`] of them are listed).
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
/// use icq::admin::{NoProgress, RequeueTarget, plan_requeue, requeue};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let plan = plan_requeue(&sources, &RequeueTarget::Ids(vec![dead])).await?;
/// let report = requeue(&plan, &NoProgress).await?;
/// assert_eq!(serde_json::to_value(report)?, serde_json::json!({ "requeued": 1 }));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequeueReport {
    /// Rows put back to pending.
    pub requeued: u64,
    /// Dead letters left dead: a pending row holds their unique key.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
}

/// Checks a requeue without changing anything: every id must exist in a selected source
/// ([`Error::NotFound`] otherwise) and be dead or pending without a live lease
/// ([`Error::Refused`] otherwise); `--all-dead` counts the dead letters as of now. A dead
/// letter whose unique key a pending row holds is set aside as skipped, not refused: it
/// cannot be pending next to that row.
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
/// use icq::Error;
/// use icq::admin::{RequeueTarget, plan_requeue};
///
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let completed = RequeueTarget::Ids(vec![done]);
/// let Err(Error::Refused(why)) = plan_requeue(&sources, &completed).await else {
///     panic!("a completed command cannot be requeued");
/// };
/// assert!(why.contains("icq replay"), "{why}"); // what to do instead
/// # Ok(())
/// # }
/// ```
pub async fn plan_requeue(sources: &[Queue], target: &RequeueTarget) -> Result<RequeuePlan> {
    match target {
        RequeueTarget::Ids(ids) => plan_requeue_ids(sources, &distinct(ids)).await,
        RequeueTarget::AllDead { type_name, queue } => {
            super::check_queue_filter(sources, queue.as_deref()).await?;
            let mut parts = Vec::with_capacity(sources.len());
            for source in sources {
                let backend = source.backend().clone();
                let filter = DeadLetterFilter {
                    type_name: type_name.clone(),
                    queue: queue.clone(),
                    dead_before: backend.clock_now().await?,
                };
                let count = backend.dead_letter_count(&filter).await?;
                parts.push(RequeuePart {
                    source: source.name().to_owned(),
                    backend,
                    work: RequeueWork::AllDead(filter),
                    count,
                    skipped: Vec::new(),
                });
            }
            Ok(RequeuePlan { parts })
        }
    }
}

async fn plan_requeue_ids(sources: &[Queue], ids: &[CommandId]) -> Result<RequeuePlan> {
    if ids.is_empty() {
        return Err(Error::invalid(
            "name the commands to requeue (ids), or pass --all-dead",
        ));
    }
    let per_source = locate_checked(sources, ids, "requeued", |row, state| match state {
        State::Completed => Err(format!(
            "command {} is completed; run it again as a new command with `icq replay {}`",
            row.id, row.id
        )),
        State::Running => Err(format!(
            "command {} is running (leased until {}); requeue it once the lease has expired",
            row.id,
            row.locked_until
                .map_or_else(|| "now".to_owned(), crate::command::format_timestamp)
        )),
        State::Dead | State::Due | State::Scheduled => Ok(()),
    })
    .await?;
    let mut parts = Vec::with_capacity(per_source.len());
    for (index, rows) in per_source {
        let source = &sources[index];
        let backend = source.backend().clone();
        let now = backend.clock_now().await?;
        // A dead letter goes back to pending only when no pending row holds its key:
        // neither one already pending nor one this request puts back first.
        let keys: Vec<String> = {
            let mut keys: Vec<String> = rows.iter().filter_map(|r| r.unique_key.clone()).collect();
            keys.sort();
            keys.dedup();
            keys
        };
        let mut holders: std::collections::HashMap<String, CommandId> = backend
            .unique_key_holders(&UniqueKeyHoldersParams { keys })
            .await?
            .into_iter()
            .map(|h| (h.unique_key, h.id))
            .collect();
        let mut accepted = Vec::with_capacity(rows.len());
        let mut skipped = Vec::new();
        for row in rows {
            match (&row.unique_key, row.state(now)) {
                (Some(key), State::Dead) => match holders.get(key) {
                    Some(holder) if holder != &row.id => {
                        skipped.push(Skipped::new(
                            source.name(),
                            row.id,
                            key.clone(),
                            holder.clone(),
                        ));
                    }
                    _ => {
                        holders.insert(key.clone(), row.id.clone());
                        accepted.push(row.id);
                    }
                },
                _ => accepted.push(row.id),
            }
        }
        parts.push(RequeuePart {
            source: source.name().to_owned(),
            backend,
            count: accepted.len() as u64,
            work: RequeueWork::Ids(accepted),
            skipped,
        });
    }
    Ok(RequeuePlan { parts })
}

/// Applies a requeue plan: explicit ids in one guarded transaction per source; dead
/// letters in batches of [`REQUEUE_BATCH`], each a short read and one short update. A
/// dead letter whose unique key a pending row holds stays dead and is reported skipped;
/// of several dead letters sharing a key, the oldest is put back.
///
/// A requeued row is due at once, with its attempts reset to 0.
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
/// use icq::State;
/// use icq::admin::{NoProgress, RequeueTarget, plan_requeue, requeue};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let plan = plan_requeue(&sources, &RequeueTarget::Ids(vec![dead.clone()])).await?;
/// assert_eq!(requeue(&plan, &NoProgress).await?.requeued, 1);
/// let row = queue.get(&dead).await?.unwrap();
/// assert_eq!((row.state(chrono::Utc::now()), row.attempts), (State::Due, 0));
/// # Ok(())
/// # }
/// ```
pub async fn requeue(plan: &RequeuePlan, progress: &dyn Progress) -> Result<RequeueReport> {
    let mut report = RequeueReport {
        requeued: 0,
        skipped: Vec::new(),
    };
    for part in &plan.parts {
        report.skipped.extend(part.skipped.iter().cloned());
        match &part.work {
            RequeueWork::Ids(ids) => {
                if ids.is_empty() {
                    continue;
                }
                let params = CommandRequeueManyParams { ids: ids.clone() };
                let done = part.backend.command_requeue_many(&params).await?;
                if done != ids.len() as u64 {
                    let requeued = report.requeued;
                    return Err(Error::Conflict(format!(
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
                report.requeued += done;
            }
            RequeueWork::AllDead(filter) => {
                if part.count == 0 {
                    continue;
                }
                progress.begin(
                    &format!("requeueing dead letters in {}", part.source),
                    part.count,
                );
                let outcome = all_dead(part, filter, progress).await;
                progress.finish();
                report.requeued += outcome?;
                let params = DeadLetterPageParams {
                    filter: filter.clone(),
                    limit: REQUEUE_BATCH,
                };
                let conflicts = part.backend.dead_letter_key_conflicts(&params).await?;
                report.skipped.extend(
                    conflicts
                        .into_iter()
                        .map(|c| Skipped::new(&part.source, c.id, c.unique_key, c.held_by)),
                );
            }
        }
    }
    Ok(report)
}

/// Requeues one source's dead letters in batches of [`REQUEUE_BATCH`]: each batch leaves
/// out the rows whose key a pending row holds, and of rows sharing a key only the first
/// goes back (the others then find it pending and are left out of the next batch).
async fn all_dead(
    part: &RequeuePart,
    filter: &DeadLetterFilter,
    progress: &dyn Progress,
) -> Result<u64> {
    let params = DeadLetterPageParams {
        filter: filter.clone(),
        limit: REQUEUE_BATCH,
    };
    let mut requeued = 0;
    loop {
        let batch = part.backend.dead_letter_requeue_batch(&params).await?;
        requeued += batch.requeued;
        progress.advance(batch.requeued);
        // A batch with nothing put back (its rows changed meanwhile) ends the loop too,
        // so it always ends.
        if batch.selected < u64::from(REQUEUE_BATCH) || batch.requeued == 0 {
            return Ok(requeued);
        }
    }
}
