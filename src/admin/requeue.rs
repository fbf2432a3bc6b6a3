//! `icq requeue`: put commands back to pending now, by id or every dead letter in batches.

use std::sync::Arc;

use serde::Serialize;

use crate::command::{CommandId, State};
use crate::engine::Backend;
use crate::engine::admin::{
    CommandRequeueManyParams, DeadLetterFilter, DeadLetterRequeueBatchParams,
};
use crate::error::{Error, Result};
use crate::sources::OpenSource;

use super::{Progress, distinct, in_batches, locate_checked};

/// Rows requeued per statement by `requeue --all-dead`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
/// # let sources = vec![source];
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?.id;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?.id;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions { until_idle: true, ..Default::default() }, Default::default()).await?;
/// use icq::admin::{NoProgress, REQUEUE_BATCH, RequeueTarget, plan_requeue, requeue};
///
/// // `sources`: one source holding a dead letter `dead`.
/// // `--all-dead` works through the dead letters REQUEUE_BATCH rows per statement.
/// let plan = plan_requeue(&sources, &RequeueTarget::AllDead { type_name: None }).await?;
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
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
/// # let sources = vec![source];
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?.id;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?.id;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions { until_idle: true, ..Default::default() }, Default::default()).await?;
/// use icq::admin::{RequeueTarget, plan_requeue};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let these = RequeueTarget::Ids(vec![dead]);
/// let every_boom = RequeueTarget::AllDead { type_name: Some("boom".into()) };
/// assert_eq!(plan_requeue(&sources, &these).await?.total(), 1);
/// assert_eq!(plan_requeue(&sources, &every_boom).await?.total(), 1);
/// # Ok(())
/// # }
/// ```
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
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
/// # let sources = vec![source];
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?.id;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?.id;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions { until_idle: true, ..Default::default() }, Default::default()).await?;
/// use icq::admin::{RequeueTarget, plan_requeue};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let plan = plan_requeue(&sources, &RequeueTarget::AllDead { type_name: None }).await?;
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

/// The result of [`requeue`]: `{"requeued": N}`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
/// # let sources = vec![source];
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?.id;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?.id;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions { until_idle: true, ..Default::default() }, Default::default()).await?;
/// use icq::admin::{NoProgress, RequeueTarget, plan_requeue, requeue};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let plan = plan_requeue(&sources, &RequeueTarget::Ids(vec![dead])).await?;
/// let report = requeue(&plan, &NoProgress).await?;
/// assert_eq!(serde_json::to_value(report)?, serde_json::json!({ "requeued": 1 }));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RequeueReport {
    /// Rows put back to pending.
    pub requeued: u64,
}

/// Checks a requeue without changing anything: every id must exist in a selected source
/// ([`Error::NotFound`] otherwise) and be dead or pending without a live lease
/// ([`Error::Usage`] otherwise); `--all-dead` counts the dead letters as of now.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
/// # let sources = vec![source];
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?.id;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?.id;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions { until_idle: true, ..Default::default() }, Default::default()).await?;
/// use icq::Error;
/// use icq::admin::{RequeueTarget, plan_requeue};
///
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let completed = RequeueTarget::Ids(vec![done]);
/// let Err(Error::Usage(why)) = plan_requeue(&sources, &completed).await else {
///     panic!("a completed command cannot be requeued");
/// };
/// assert!(why.contains("icq replay"), "{why}"); // what to do instead
/// # Ok(())
/// # }
/// ```
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
    let parts = per_source
        .into_iter()
        .map(|(index, rows)| RequeuePart {
            source: sources[index].name.clone(),
            backend: sources[index].queue.backend().clone(),
            count: rows.len() as u64,
            work: RequeueWork::Ids(rows.into_iter().map(|row| row.id).collect()),
        })
        .collect();
    Ok(RequeuePlan { parts })
}

/// Applies a requeue plan: explicit ids in one guarded transaction per source; dead
/// letters in batches of [`REQUEUE_BATCH`], each its own short statement.
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
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
/// # let sources = vec![source];
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?.id;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?.id;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions { until_idle: true, ..Default::default() }, Default::default()).await?;
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
                let params = DeadLetterRequeueBatchParams {
                    filter: filter.clone(),
                    limit: REQUEUE_BATCH,
                };
                requeued += in_batches(
                    progress,
                    &format!("requeueing dead letters in {}", part.source),
                    part.count,
                    REQUEUE_BATCH,
                    || part.backend.dead_letter_requeue_batch(&params),
                )
                .await?;
            }
        }
    }
    Ok(RequeueReport { requeued })
}
