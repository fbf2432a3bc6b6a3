//! `icq purge`: delete completed commands and/or dead letters older than a cutoff, in batches.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::engine::Backend;
use crate::engine::admin::{FinishedDeleteBatchParams, FinishedFilter, FinishedKind};
use crate::error::{Error, Result};
use crate::queue::Queue;

use super::{Progress, in_batches};

/// Rows deleted per batch by `purge`.
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
/// # let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("shop.db").display())).await?;
/// use icq::admin::{NoProgress, PURGE_BATCH, PurgeRequest, plan_purge, purge};
///
/// let old = (0..PURGE_BATCH + 1).map(|_| icq::NewCommand::new("t", serde_json::json!({})));
/// queue.schedule_many(&old.collect::<Vec<_>>()).await?;
/// # sqlx::raw_sql(r#"UPDATE "InternalCommands" SET "ProcessedAt" = "CreatedAt""#).execute(&pool).await?;
/// // ... once they have completed: two batches, one of 5000 rows and one of 1.
/// let plan = plan_purge(&sources, &PurgeRequest { completed: true, ..Default::default() }).await?;
/// assert_eq!(purge(&plan, &NoProgress).await?.total(), u64::from(PURGE_BATCH) + 1);
/// # Ok(())
/// # }
/// ```
pub const PURGE_BATCH: u32 = 5000;

/// What to purge.
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
/// use std::time::Duration;
/// use icq::admin::{PurgeRequest, plan_purge};
///
/// // `icq purge --completed --dead-letters --older-than 7d`
/// let week_old = PurgeRequest {
///     completed: true,
///     dead_letters: true,
///     older_than: Some(Duration::from_secs(7 * 86_400)),
///     queue: None,
///     type_name: None,
/// };
/// assert_eq!(plan_purge(&sources, &week_old).await?.total(), 0);
/// assert!(plan_purge(&sources, &PurgeRequest::default()).await.is_err()); // say what to purge
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeRequest {
    /// Delete completed rows.
    pub completed: bool,
    /// Delete dead letters.
    pub dead_letters: bool,
    /// Only rows finished longer ago than this (default: all of them).
    pub older_than: Option<Duration>,
    /// Only rows of this queue (refused on a version-1 table, naming the upgrade).
    pub queue: Option<String>,
    /// Only rows of this command type.
    pub type_name: Option<String>,
}

struct PurgePart {
    source: String,
    backend: Arc<dyn Backend>,
    filter: FinishedFilter,
    count: u64,
}

/// A purge with its rows counted under a fixed cutoff, ready to confirm and apply.
///
/// Nothing is deleted until it is applied with [`purge`].
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
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions::default().with_until_idle(true), Default::default()).await?;
/// use icq::admin::{PurgeRequest, plan_purge};
///
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let request = PurgeRequest { completed: true, dead_letters: true, ..Default::default() };
/// let plan = plan_purge(&sources, &request).await?;
/// assert_eq!(plan.total(), 2);
/// let dry_run = plan.dry_run_report(); // `icq purge --dry-run`
/// assert_eq!(serde_json::to_value(&dry_run)?["would_delete"], 2);
/// # Ok(())
/// # }
/// ```
pub struct PurgePlan {
    parts: Vec<PurgePart>,
    type_name: Option<String>,
    queue: Option<String>,
}

/// Rows of one kind in one source, deleted or to delete.
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
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions::default().with_until_idle(true), Default::default()).await?;
/// use icq::admin::{PurgeRequest, plan_purge};
///
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let request = PurgeRequest { completed: true, dead_letters: true, ..Default::default() };
/// let report = plan_purge(&sources, &request).await?.dry_run_report();
/// let counts = serde_json::to_value(&report.counts)?;
/// assert_eq!(counts[0], serde_json::json!({ "source": "shop", "kind": "completed", "count": 1 }));
/// assert_eq!(counts[1]["kind"], "dead_letters");
/// # Ok(())
/// # }
/// ```
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
/// with the split by state: `"completed"` and `"dead_letters"`, and the filter it was
/// limited to, when any: `"type"` and `"queue"`.
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
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions::default().with_until_idle(true), Default::default()).await?;
/// use icq::admin::{NoProgress, PurgeRequest, plan_purge, purge};
///
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let request = PurgeRequest { dead_letters: true, ..Default::default() };
/// let report = purge(&plan_purge(&sources, &request).await?, &NoProgress).await?;
/// assert!(!report.dry_run);
/// assert_eq!(
///     serde_json::to_value(&report)?,
///     serde_json::json!({ "deleted": 1, "completed": 0, "dead_letters": 1 })
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeReport {
    /// True when nothing was deleted and the counts say what would be.
    pub dry_run: bool,
    /// The counts per source and kind.
    pub counts: Vec<PurgeCount>,
    /// How many sources were asked.
    pub source_count: usize,
    /// The command type the purge was limited to.
    pub type_name: Option<String>,
    /// The queue the purge was limited to.
    pub queue: Option<String>,
}

impl PurgeReport {
    /// All rows deleted (or that would be). See [`NoProgress`](super::NoProgress)'s example.
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
        let mut map = serializer.serialize_map(None)?;
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
        if let Some(type_name) = &self.type_name {
            map.serialize_entry("type", type_name)?;
        }
        if let Some(queue) = &self.queue {
            map.serialize_entry("queue", queue)?;
        }
        map.end()
    }
}

impl PurgePlan {
    /// How many rows the plan deletes, as counted when planning. See [`PurgePlan`]'s
    /// example.
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|p| p.count).sum()
    }

    /// The counts as a dry-run report. See [`PurgePlan`]'s example.
    pub fn dry_run_report(&self) -> PurgeReport {
        PurgeReport {
            dry_run: true,
            counts: self.counts(|p| p.count),
            source_count: self.source_count(),
            type_name: self.type_name.clone(),
            queue: self.queue.clone(),
        }
    }

    /// The command type the plan is limited to, if any.
    pub fn type_name(&self) -> Option<&str> {
        self.type_name.as_deref()
    }

    /// The queue the plan is limited to, if any.
    pub fn queue(&self) -> Option<&str> {
        self.queue.as_deref()
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
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions::default().with_until_idle(true), Default::default()).await?;
/// use std::time::Duration;
/// use icq::admin::{PurgeRequest, plan_purge};
///
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let all_dead = PurgeRequest { dead_letters: true, ..Default::default() };
/// assert_eq!(plan_purge(&sources, &all_dead).await?.total(), 1);
/// let old_dead = PurgeRequest { older_than: Some(Duration::from_secs(3600)), ..all_dead.clone() };
/// assert_eq!(plan_purge(&sources, &old_dead).await?.total(), 0); // it died just now
/// # Ok(())
/// # }
/// ```
pub async fn plan_purge(sources: &[Queue], request: &PurgeRequest) -> Result<PurgePlan> {
    let mut kinds = Vec::new();
    if request.completed {
        kinds.push(FinishedKind::Completed);
    }
    if request.dead_letters {
        kinds.push(FinishedKind::DeadLetters);
    }
    if kinds.is_empty() {
        return Err(Error::invalid(
            "say what to purge: --completed, --dead-letters, or both",
        ));
    }
    let age = match request.older_than {
        None => chrono::TimeDelta::zero(),
        Some(age) => chrono::TimeDelta::from_std(age)
            .map_err(|_| Error::invalid("--older-than is too long"))?,
    };
    super::check_queue_filter(sources, request.queue.as_deref()).await?;
    let mut parts = Vec::new();
    for source in sources {
        let backend = source.backend().clone();
        let now = backend.clock_now().await?;
        let before = now
            .checked_sub_signed(age)
            .ok_or_else(|| Error::invalid("--older-than reaches before the year 0"))?;
        for kind in &kinds {
            let filter = FinishedFilter {
                kind: *kind,
                before,
                queue: request.queue.clone(),
                type_name: request.type_name.clone(),
            };
            let count = backend.finished_count(&filter).await?;
            parts.push(PurgePart {
                source: source.name().to_owned(),
                backend: backend.clone(),
                filter,
                count,
            });
        }
    }
    Ok(PurgePlan {
        parts,
        type_name: request.type_name.clone(),
        queue: request.queue.clone(),
    })
}

/// Deletes what the plan counted, in batches of [`PURGE_BATCH`] rows by primary key.
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
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions::default().with_until_idle(true), Default::default()).await?;
/// use icq::admin::{NoProgress, PurgeRequest, plan_purge, purge};
///
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let plan = plan_purge(&sources, &PurgeRequest { completed: true, ..Default::default() }).await?;
/// println!("deleting {} completed command(s)", plan.total()); // confirm here
/// purge(&plan, &NoProgress).await?;
/// assert!(queue.get(&done).await?.is_none());
/// assert!(queue.get(&dead).await?.is_some()); // dead letters were not asked for
/// # Ok(())
/// # }
/// ```
pub async fn purge(plan: &PurgePlan, progress: &dyn Progress) -> Result<PurgeReport> {
    let mut deleted = Vec::with_capacity(plan.parts.len());
    for part in &plan.parts {
        let mut count = 0;
        if part.count > 0 {
            let what = match part.filter.kind {
                FinishedKind::Completed => "completed commands",
                FinishedKind::DeadLetters => "dead letters",
            };
            let params = FinishedDeleteBatchParams {
                filter: part.filter.clone(),
                limit: PURGE_BATCH,
            };
            count = in_batches(
                progress,
                &format!("deleting {what} in {}", part.source),
                part.count,
                PURGE_BATCH,
                || part.backend.finished_delete_batch(&params),
            )
            .await?;
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
        type_name: plan.type_name.clone(),
        queue: plan.queue.clone(),
    })
}
