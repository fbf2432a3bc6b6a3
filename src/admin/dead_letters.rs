//! `icq dead-letters list`: dead letters across sources, newest first.

use serde::Serialize;

use crate::engine::admin::{DeadLetterListParams, DeadLetterSummary};
use crate::error::{Error, Result};
use crate::sources::OpenSource;

/// Dead letters listed when no `--limit` is given.
pub const DEFAULT_DEAD_LETTER_LIMIT: u32 = 50;

/// Which dead letters to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterQuery {
    /// Only this command type.
    pub type_name: Option<String>,
    /// At most this many, newest first, across all sources.
    pub limit: u32,
}

impl Default for DeadLetterQuery {
    fn default() -> Self {
        DeadLetterQuery {
            type_name: None,
            limit: DEFAULT_DEAD_LETTER_LIMIT,
        }
    }
}

/// One listed dead letter and its source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterRow {
    /// The source name.
    pub source: String,
    /// The row.
    #[serde(flatten)]
    pub summary: DeadLetterSummary,
}

/// The result of [`dead_letters`]: serialized as an array of [`DeadLetterRow`].
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
pub async fn dead_letters(
    sources: &[OpenSource],
    query: &DeadLetterQuery,
) -> Result<DeadLetterReport> {
    let params = DeadLetterListParams {
        type_name: query.type_name.clone(),
        limit: query.limit,
    };
    let params = &params;
    let listed = futures::future::try_join_all(sources.iter().map(|s| async move {
        Ok::<_, Error>((s, s.queue.backend().dead_letter_list(params).await?))
    }))
    .await?;
    let mut rows: Vec<DeadLetterRow> = listed
        .into_iter()
        .flat_map(|(source, summaries)| {
            summaries.into_iter().map(|summary| DeadLetterRow {
                source: source.name.clone(),
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
