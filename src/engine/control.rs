//! Fleet-wide queue state, kept in the commands table's `<table>Queues` (schema version
//! 4) so every replica, every language and the console read one truth: whether a queue
//! is paused. Each engine implements [`ControlOps`] in its folder (`control.rs`).
//!
//! A pause is one upsert of the queue's row; on PostgreSQL the same transaction sends
//! `QUEUES_CHANGED` on the table's cancel channel, so listening processors re-read the
//! paused queues at once (elsewhere they re-read them every polling interval). Claims
//! skip paused queues in the database (see [`crate::engine::ClaimParams::skip_paused`]);
//! scheduling into a paused queue goes on, and running commands finish.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::Result;

/// The payload of the NOTIFY a pause or resume sends on the table's cancel channel
/// (PostgreSQL): processors re-read the paused queues instead of checking their leases.
#[cfg(feature = "postgres")]
pub(crate) const QUEUES_CHANGED: &str = "queues";

/// What a pause (`paused`) or a resume is called in messages.
pub(crate) fn action(paused: bool) -> &'static str {
    if paused {
        "pausing a queue"
    } else {
        "resuming a queue"
    }
}

/// Refuses a pause or resume (`paused`) of a table at schema `version` below 4.
pub(crate) fn require_v4(
    table: &crate::ident::TableName,
    version: u32,
    paused: bool,
) -> Result<()> {
    if version < 4 {
        return Err(crate::Error::needs_schema_v4(
            table,
            version,
            action(paused),
        ));
    }
    Ok(())
}

/// One queue's stored state (a row of `<table>Queues`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct QueueState {
    /// The queue's name.
    pub queue: String,
    /// Whether claims skip it.
    pub paused: bool,
    /// When it was paused (the database's clock); `None` while it runs.
    pub paused_at: Option<DateTime<Utc>>,
    /// When its row last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

/// Pausing and resuming queues for the whole fleet.
#[async_trait]
pub trait ControlOps: Send + Sync {
    /// Pauses (`paused`) or resumes `queue` for every replica; `true` when that changed
    /// its state, `false` when it already was so. A table older than schema version 4 is
    /// [`crate::Error::NeedsSchemaV4`].
    async fn queue_set_paused(&self, queue: &str, paused: bool) -> Result<bool>;

    /// Every queue that has a stored state, by name. Empty on a table older than schema
    /// version 4 (nothing can be paused there).
    async fn queue_states(&self) -> Result<Vec<QueueState>>;
}
