//! `icq pending`: counts per state (and per type) across sources.

use serde::Serialize;

use crate::engine::admin::{StateCount, StateCountParams};
use crate::error::{Error, Result};
use crate::sources::OpenSource;

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
