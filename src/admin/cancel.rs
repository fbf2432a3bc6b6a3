//! `icq cancel`: take pending commands out of the queue without running them. A
//! cancelled command is a dead letter with `LastError = "cancelled by operator"`, so it
//! stays visible, can be requeued, and is purged like any dead letter. A running
//! command is refused: its handler is already executing.

use std::sync::Arc;

use serde::Serialize;

use super::{Progress, distinct, locate_checked};
use crate::command::{CommandId, State};
use crate::engine::Backend;
use crate::engine::admin::{
    CommandCancelManyParams, CommandListParams, ListState, StateCountParams,
};
use crate::error::{Error, Result};
use crate::sources::OpenSource;

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
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
/// # let sources = vec![source];
/// use icq::NewCommand;
/// use icq::admin::{CancelTarget, NoProgress, cancel, plan_cancel};
///
/// let a = queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?.id;
/// queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?;
///
/// let one = plan_cancel(&sources, &CancelTarget::Ids(vec![a])).await?;
/// let by_type = plan_cancel(&sources, &CancelTarget::Type("email.digest".into())).await?;
/// assert_eq!((one.total(), by_type.total()), (1, 2));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelTarget {
    /// These pending rows.
    Ids(Vec<CommandId>),
    /// Every pending, not running command of this type.
    Type(String),
}

enum Work {
    Ids(Vec<CommandId>),
    Type(String),
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
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
/// # let sources = vec![source];
/// use icq::NewCommand;
/// use icq::admin::{CancelTarget, NoProgress, cancel, plan_cancel};
///
/// let a = queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?.id;
/// queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?;
///
/// let plan = plan_cancel(&sources, &CancelTarget::Type("email.digest".into())).await?;
/// assert_eq!((plan.total(), plan.sources()), (2, vec!["shop"]));
/// let nothing = plan_cancel(&sources, &CancelTarget::Type("other".into())).await?;
/// assert!(nothing.sources().is_empty());
/// # Ok(())
/// # }
/// ```
pub struct CancelPlan {
    parts: Vec<Part>,
}

impl CancelPlan {
    /// How many rows the plan cancels (for a type, as counted when planning). See
    /// [`CancelPlan`]'s example.
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|p| p.count).sum()
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

/// The result of [`cancel`]: `{"cancelled": N}`.
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
/// use icq::NewCommand;
/// use icq::admin::{CancelTarget, NoProgress, cancel, plan_cancel};
///
/// let a = queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?.id;
/// queue.schedule(&NewCommand::new("email.digest", serde_json::json!({}))).await?;
///
/// let plan = plan_cancel(&sources, &CancelTarget::Ids(vec![a])).await?;
/// let report = cancel(&plan, &NoProgress).await?;
/// assert_eq!(serde_json::to_value(report)?, serde_json::json!({ "cancelled": 1 }));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CancelReport {
    /// Rows taken out of the queue.
    pub cancelled: u64,
}

/// Checks a cancel without changing anything: every id must exist ([`Error::NotFound`])
/// and be pending without a live lease ([`Error::Usage`] otherwise, naming each).
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
/// use icq::admin::{CancelTarget, plan_cancel};
/// use icq::{CommandId, Error};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let unknown = plan_cancel(&sources, &CancelTarget::Ids(vec![CommandId::new()])).await;
/// assert!(matches!(unknown, Err(Error::NotFound(_))));
/// let Err(Error::Usage(why)) = plan_cancel(&sources, &CancelTarget::Ids(vec![dead])).await else {
///     panic!("a dead letter cannot be cancelled");
/// };
/// assert!(why.contains("already a dead letter"), "{why}");
/// # Ok(())
/// # }
/// ```
pub async fn plan_cancel(sources: &[OpenSource], target: &CancelTarget) -> Result<CancelPlan> {
    match target {
        CancelTarget::Ids(ids) => plan_ids(sources, &distinct(ids)).await,
        CancelTarget::Type(type_name) => {
            let mut parts = Vec::with_capacity(sources.len());
            for source in sources {
                let backend = source.queue.backend().clone();
                let counts = backend
                    .state_count(&StateCountParams { by_type: true })
                    .await?;
                let count = counts
                    .iter()
                    .filter(|c| c.type_name.as_deref() == Some(type_name))
                    .map(|c| c.due + c.scheduled)
                    .sum();
                parts.push(Part {
                    source: source.name.clone(),
                    backend,
                    work: Work::Type(type_name.clone()),
                    count,
                });
            }
            Ok(CancelPlan { parts })
        }
    }
}

async fn plan_ids(sources: &[OpenSource], ids: &[CommandId]) -> Result<CancelPlan> {
    if ids.is_empty() {
        return Err(Error::Usage(
            "name the commands to cancel (ids), or pass --type TYPE".into(),
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
        State::Running => Err(format!(
            "command {} is running, so it cannot be cancelled (its handler is executing, \
             leased until {}, and it ends completed, retried or dead)",
            row.id,
            row.locked_until
                .map_or_else(|| "now".to_owned(), crate::command::format_timestamp)
        )),
        State::Due | State::Scheduled => Ok(()),
    })
    .await?;
    let parts = per_source
        .into_iter()
        .map(|(index, rows)| Part {
            source: sources[index].name.clone(),
            backend: sources[index].queue.backend().clone(),
            count: rows.len() as u64,
            work: Work::Ids(rows.into_iter().map(|row| row.id).collect()),
        })
        .collect();
    Ok(CancelPlan { parts })
}

/// Applies a cancel plan. Explicit ids are cancelled in one guarded statement per
/// source; a row a processor claimed since the plan was made is left running and the
/// result says so. A type is cancelled in batches of `CANCEL_BATCH`, never more rows
/// than were counted when planning (new commands of that type keep coming).
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
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
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
    let mut cancelled = 0;
    progress.begin("cancelling", plan.total());
    for part in &plan.parts {
        match &part.work {
            Work::Ids(ids) => {
                let done = part
                    .backend
                    .command_cancel_many(&CommandCancelManyParams { ids: ids.clone() })
                    .await?;
                cancelled += done;
                progress.advance(done);
                if done < ids.len() as u64 {
                    progress.finish();
                    return Err(Error::Usage(format!(
                        "source `{}`: {} of the {} commands started running or changed state \
                         while being cancelled and were left alone ({cancelled} cancelled in \
                         all); check them with `icq show ID`",
                        part.source,
                        ids.len() as u64 - done,
                        ids.len()
                    )));
                }
            }
            Work::Type(type_name) => {
                let mut left = part.count;
                for state in [ListState::Due, ListState::Scheduled] {
                    while left > 0 {
                        let page = part
                            .backend
                            .command_list(&CommandListParams {
                                state,
                                type_name: Some(type_name.clone()),
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
                            .command_cancel_many(&CommandCancelManyParams { ids })
                            .await?;
                        if done == 0 {
                            break;
                        }
                        cancelled += done;
                        left = left.saturating_sub(done);
                        progress.advance(done);
                    }
                }
            }
        }
    }
    progress.finish();
    Ok(CancelReport { cancelled })
}
