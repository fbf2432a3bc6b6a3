//! Pausing and resuming a queue for the whole fleet, and the queues' stored state: `icq
//! queue pause|resume|list`. A pause is stored in the source's database
//! (`<table>Queues`), so every replica stops starting the queue's commands (at once on
//! PostgreSQL, which notifies them; within the polling interval elsewhere) while
//! scheduling into it goes on and running commands finish.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::queue::Queue;

/// What a pause or resume did in one source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct QueueChange {
    /// The source name.
    pub source: String,
    /// The queue.
    pub queue: String,
    /// Its state now.
    pub paused: bool,
    /// Whether this call changed it (`false`: it already was so).
    pub changed: bool,
}

/// The result of [`set_paused`]: one change per source, serialized as an array.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct QueueChangeReport {
    /// One per source.
    pub changes: Vec<QueueChange>,
}

/// One queue of one source, as [`queue_list`] reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct QueueListing {
    /// The source name.
    pub source: String,
    /// The queue.
    pub queue: String,
    /// Whether it is paused fleet-wide.
    pub paused: bool,
    /// When it was paused.
    pub paused_at: Option<DateTime<Utc>>,
    /// Pending commands due now.
    pub due: u64,
    /// Commands running now.
    pub running: u64,
    /// Pending commands due later.
    pub scheduled: u64,
}

/// The result of [`queue_list`], serialized as an array.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct QueueListReport {
    /// Every queue that has pending commands or a stored state, by source and name.
    pub queues: Vec<QueueListing>,
}

/// Pauses (`paused`) or resumes `queue` in every source of `sources`. The name is checked
/// first ([`Error::Invalid`]); a table older than schema version 4 is
/// [`Error::NeedsSchemaV4`], before any source is changed.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let options = icq::ConnectOptions::default().creating_table(true);
/// let queue = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
/// let sources = vec![queue.clone()];
/// let report = icq::admin::set_paused(&sources, "webhooks", true).await?;
/// assert!(report.changes[0].changed);
/// let listed = icq::admin::queue_list(&sources).await?;
/// assert!(listed.queues.iter().any(|q| q.queue == "webhooks" && q.paused));
/// assert!(!icq::admin::set_paused(&sources, "webhooks", true).await?.changes[0].changed);
/// icq::admin::set_paused(&sources, "webhooks", false).await?;
/// # Ok(())
/// # }
/// ```
pub async fn set_paused(sources: &[Queue], queue: &str, paused: bool) -> Result<QueueChangeReport> {
    crate::settings::validate_queue_name(queue).map_err(Error::invalid)?;
    for source in sources {
        let version = source.backend().schema_version().await?;
        crate::engine::control::require_v4(source.table(), version, paused)?;
    }
    let mut changes = Vec::with_capacity(sources.len());
    for source in sources {
        let changed = source.backend().queue_set_paused(queue, paused).await?;
        changes.push(QueueChange {
            source: source.name().to_owned(),
            queue: queue.to_owned(),
            paused,
            changed,
        });
    }
    Ok(QueueChangeReport { changes })
}

/// Every queue of `sources` that has pending commands or a stored state (a pause), with
/// its counts. See [`set_paused`]'s example.
pub async fn queue_list(sources: &[Queue]) -> Result<QueueListReport> {
    let counts =
        super::pending_with(sources, &super::PendingRequest::default().per_queue()).await?;
    let mut queues: Vec<QueueListing> = Vec::new();
    for source in sources {
        let states = source.backend().queue_states().await?;
        for row in counts.rows.iter().filter(|r| r.source == source.name()) {
            let Some(name) = row.counts.queue.clone() else {
                continue;
            };
            let state = states.iter().find(|s| s.queue == name);
            queues.push(QueueListing {
                source: source.name().to_owned(),
                paused: state.is_some_and(|s| s.paused),
                paused_at: state.and_then(|s| s.paused_at),
                queue: name,
                due: row.counts.due,
                running: row.counts.running,
                scheduled: row.counts.scheduled,
            });
        }
        for state in states {
            if !queues
                .iter()
                .any(|q| q.source == source.name() && q.queue == state.queue)
            {
                queues.push(QueueListing {
                    source: source.name().to_owned(),
                    queue: state.queue,
                    paused: state.paused,
                    paused_at: state.paused_at,
                    due: 0,
                    running: 0,
                    scheduled: 0,
                });
            }
        }
    }
    queues.sort_by(|a, b| (&a.source, &a.queue).cmp(&(&b.source, &b.queue)));
    Ok(QueueListReport { queues })
}
