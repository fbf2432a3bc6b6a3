//! `icq dead-letters list`: dead letters across sources, newest first.

use serde::Serialize;

use crate::engine::admin::{DeadLetterListParams, DeadLetterSummary};
use crate::error::{Error, Result};
use crate::queue::Queue;

/// Dead letters listed when no `--limit` is given.
///
/// # Examples
///
/// ```
/// use icq::admin::{DEFAULT_DEAD_LETTER_LIMIT, DeadLetterQuery};
///
/// assert_eq!(DeadLetterQuery::default().limit, DEFAULT_DEAD_LETTER_LIMIT);
/// ```
pub const DEFAULT_DEAD_LETTER_LIMIT: u32 = 50;

/// Which dead letters to list.
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
/// use icq::admin::{DeadLetterQuery, dead_letters};
///
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let query = DeadLetterQuery { type_name: Some("boom".into()), queue: None, limit: 10 };
/// assert_eq!(dead_letters(&sources, &query).await?.rows.len(), 1);
/// let other = DeadLetterQuery { type_name: Some("ok".into()), ..DeadLetterQuery::default() };
/// assert!(dead_letters(&sources, &other).await?.rows.is_empty());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterQuery {
    /// Only this command type.
    pub type_name: Option<String>,
    /// Only this queue (refused on a version-1 table, naming the upgrade).
    pub queue: Option<String>,
    /// At most this many, newest first, across all sources.
    pub limit: u32,
}

impl Default for DeadLetterQuery {
    fn default() -> Self {
        DeadLetterQuery {
            type_name: None,
            queue: None,
            limit: DEFAULT_DEAD_LETTER_LIMIT,
        }
    }
}

/// One listed dead letter and its source.
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
/// use icq::admin::{DeadLetterQuery, dead_letters};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let report = dead_letters(&sources, &DeadLetterQuery::default()).await?;
/// let row = &report.rows[0];
/// assert_eq!((row.source.as_str(), &row.summary.id, row.summary.attempts), ("shop", &dead, 1));
/// let json = serde_json::to_value(row)?; // the summary's fields, flattened
/// assert_eq!((json["source"].as_str(), json["type"].as_str()), (Some("shop"), Some("boom")));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterRow {
    /// The source name.
    pub source: String,
    /// The row.
    #[serde(flatten)]
    pub summary: DeadLetterSummary,
}

/// The result of [`dead_letters`]: serialized as an array of [`DeadLetterRow`].
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
/// use icq::admin::{DeadLetterQuery, dead_letters};
///
/// // `sources`: one source holding a dead letter `dead`.
/// let report = dead_letters(&sources, &DeadLetterQuery::default()).await?;
/// let json = serde_json::to_value(&report)?;
/// assert_eq!(json.as_array().map(Vec::len), Some(1)); // `icq dead-letters list --format json`
/// assert_eq!(report.source_count, 1);
/// # Ok(())
/// # }
/// ```
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
/// use icq::admin::{DeadLetterQuery, dead_letters};
///
/// // `sources`: one source holding a dead letter `dead`.
/// for row in dead_letters(&sources, &DeadLetterQuery::default()).await?.rows {
///     println!("{} {} {:?}", row.summary.id, row.summary.type_name, row.summary.last_error);
///     assert!(row.summary.last_error.is_some()); // why it died
/// }
/// # Ok(())
/// # }
/// ```
pub async fn dead_letters(sources: &[Queue], query: &DeadLetterQuery) -> Result<DeadLetterReport> {
    super::check_queue_filter(sources, query.queue.as_deref()).await?;
    let params = DeadLetterListParams {
        type_name: query.type_name.clone(),
        queue: query.queue.clone(),
        limit: query.limit,
    };
    let params = &params;
    let listed =
        futures::future::try_join_all(sources.iter().map(|s| async move {
            Ok::<_, Error>((s, s.backend().dead_letter_list(params).await?))
        }))
        .await?;
    let mut rows: Vec<DeadLetterRow> = listed
        .into_iter()
        .flat_map(|(source, summaries)| {
            summaries.into_iter().map(|summary| DeadLetterRow {
                source: source.name().to_owned(),
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
