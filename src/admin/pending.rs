//! `icq pending`: counts per state (and per type) across sources.

use serde::Serialize;

use crate::engine::admin::{StateCount, StateCountParams};
use crate::error::{Error, Result};
use crate::queue::Queue;

/// The counts of one source (and one queue with `--by-queue`, one type with `--by-type`).
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
/// use icq::NewCommand;
///
/// let digest = || NewCommand::new("email.digest", serde_json::json!({}));
/// queue.schedule(&digest()).await?;
/// queue.schedule(&digest().delay(Duration::from_secs(600))).await?;
/// let report = icq::admin::pending(&sources, true).await?;
/// let row = &report.rows[0];
/// assert_eq!(row.source, "shop");
/// assert_eq!(row.counts.type_name.as_deref(), Some("email.digest"));
/// assert_eq!((row.counts.due, row.counts.scheduled, row.counts.dead), (1, 1, 0));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingCount {
    /// The source name.
    pub source: String,
    /// The counts; `queue` is present only when counting by queue, `type` only when
    /// counting by type.
    #[serde(flatten)]
    pub counts: StateCount,
    /// The queue is paused fleet-wide (`icq queue pause`): its due commands wait for a
    /// resume. Only in counts by queue; in JSON only when `true`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// The result of [`pending`]: serialized as an array of [`PendingCount`].
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
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let report = icq::admin::pending(&sources, false).await?;
/// let json = serde_json::to_value(&report)?; // `icq pending --format json`
/// assert_eq!(json, serde_json::json!([
///     { "source": "shop", "due": 0, "scheduled": 0, "running": 0, "dead": 1, "completed": 1 }
/// ]));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct PendingReport {
    /// One entry per source (per source and type when `by_type`).
    pub rows: Vec<PendingCount>,
    /// Whether the counts are per type.
    #[serde(skip)]
    pub by_type: bool,
    /// Whether the counts are per queue.
    #[serde(skip)]
    pub by_queue: bool,
    /// How many sources were asked (the table shows a source column when more than one).
    #[serde(skip)]
    pub source_count: usize,
}

/// Counts due, scheduled, running, dead and completed rows in every source: one aggregate
/// query per source. With `by_type`, one row per source and command type.
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
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let totals = icq::admin::pending(&sources, false).await?;
/// assert_eq!((totals.rows[0].counts.dead, totals.rows[0].counts.completed), (1, 1));
/// let by_type = icq::admin::pending(&sources, true).await?;
/// let types: Vec<_> = by_type.rows.iter().map(|r| r.counts.type_name.as_deref()).collect();
/// assert_eq!(types, [Some("boom"), Some("ok")]);
/// # Ok(())
/// # }
/// ```
pub async fn pending(sources: &[Queue], by_type: bool) -> Result<PendingReport> {
    pending_with(
        sources,
        &PendingRequest {
            by_type,
            ..PendingRequest::default()
        },
    )
    .await
}

/// What `icq pending` counts: per type and/or per queue, of one queue or all.
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
/// use icq::admin::{PendingRequest, pending_with};
///
/// queue.schedule(&icq::NewCommand::new("email.digest", serde_json::json!({}))).await?;
/// // `icq pending --by-queue --by-type`: one line per source, queue and type.
/// let request = PendingRequest { by_queue: true, by_type: true, queue: None };
/// let report = pending_with(&sources, &request).await?;
/// let json = serde_json::to_value(&report)?;
/// assert_eq!((json[0]["queue"].as_str(), json[0]["type"].as_str()), (Some("default"), Some("email.digest")));
/// // `icq pending --queue emails`: that queue only.
/// let emails = PendingRequest { queue: Some("emails".into()), ..PendingRequest::default() };
/// assert_eq!(pending_with(&sources, &emails).await?.rows[0].counts.due, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingRequest {
    /// One line per command type.
    pub by_type: bool,
    /// One line per queue (a version-1 table has one queue, `default`).
    pub by_queue: bool,
    /// Only this queue (refused on a version-1 table, naming the upgrade).
    pub queue: Option<String>,
}

impl PendingRequest {
    /// Counts per command type (`icq pending --by-type`). See [`crate::Queue::pending`].
    pub fn per_type(mut self) -> PendingRequest {
        self.by_type = true;
        self
    }

    /// Counts per queue (`icq pending --by-queue`). See [`crate::Queue::pending`].
    pub fn per_queue(mut self) -> PendingRequest {
        self.by_queue = true;
        self
    }

    /// Counts only the commands of `queue` (`icq pending --queue`). See
    /// [`crate::Queue::pending`].
    pub fn in_queue(mut self, queue: impl Into<String>) -> PendingRequest {
        self.queue = Some(queue.into());
        self
    }
}

impl PendingReport {
    /// The counts of the line for `queue` and `type_name` (each `None` when the report is
    /// not broken down by it) in source `source`, or `None` when no row matched: a
    /// service reading its backlog without walking the lines. See
    /// [`crate::Queue::pending`].
    pub fn counts(
        &self,
        source: &str,
        queue: Option<&str>,
        type_name: Option<&str>,
    ) -> Option<&StateCount> {
        self.rows
            .iter()
            .find(|r| {
                r.source == source
                    && r.counts.queue.as_deref() == queue
                    && r.counts.type_name.as_deref() == type_name
            })
            .map(|r| &r.counts)
    }
}

/// Counts as [`pending`] does, per queue and/or type, of one queue or all. A queue filter
/// is checked first: a bad name is [`Error::Invalid`], a version-1 table [`Error::NeedsSchemaV2`].
///
/// See [`PendingRequest`]'s example.
pub async fn pending_with(sources: &[Queue], request: &PendingRequest) -> Result<PendingReport> {
    super::check_queue_filter(sources, request.queue.as_deref()).await?;
    let params = StateCountParams {
        by_type: request.by_type,
        by_queue: request.by_queue,
        queue: request.queue.clone(),
    };
    let params = &params;
    let by_queue = request.by_queue;
    let counted = futures::future::try_join_all(sources.iter().map(|s| async move {
        let paused: Vec<String> = if by_queue {
            let states = s.backend().queue_states().await?;
            states
                .into_iter()
                .filter(|q| q.paused)
                .map(|q| q.queue)
                .collect()
        } else {
            Vec::new()
        };
        Ok::<_, Error>((s, s.backend().state_count(params).await?, paused))
    }))
    .await?;
    let rows = counted
        .into_iter()
        .flat_map(|(source, counts, paused)| {
            counts.into_iter().map(move |counts| PendingCount {
                source: source.name().to_owned(),
                paused: counts.queue.as_ref().is_some_and(|q| paused.contains(q)),
                counts,
            })
        })
        .collect();
    Ok(PendingReport {
        rows,
        by_type: request.by_type,
        by_queue: request.by_queue,
        source_count: sources.len(),
    })
}
