//! `icq purge`: delete completed commands and/or dead letters older than a cutoff, in batches.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::engine::Backend;
use crate::engine::admin::{FinishedDeleteBatchParams, FinishedFilter, FinishedKind};
use crate::error::{Error, Result};
use crate::sources::OpenSource;

use super::{Progress, in_batches};

/// Rows deleted per batch by `purge`.
pub const PURGE_BATCH: u32 = 5000;

/// What to purge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeRequest {
    /// Delete completed rows.
    pub completed: bool,
    /// Delete dead letters.
    pub dead_letters: bool,
    /// Only rows finished longer ago than this (default: all of them).
    pub older_than: Option<Duration>,
}

struct PurgePart {
    source: String,
    backend: Arc<dyn Backend>,
    filter: FinishedFilter,
    count: u64,
}

/// A purge with its rows counted under a fixed cutoff, ready to confirm and apply.
pub struct PurgePlan {
    parts: Vec<PurgePart>,
}

/// Rows of one kind in one source, deleted or to delete.
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
/// with the split by state: `"completed"` and `"dead_letters"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeReport {
    /// True when nothing was deleted and the counts say what would be.
    pub dry_run: bool,
    /// The counts per source and kind.
    pub counts: Vec<PurgeCount>,
    /// How many sources were asked.
    pub source_count: usize,
}

impl PurgeReport {
    /// All rows deleted (or that would be).
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
        let mut map = serializer.serialize_map(Some(3))?;
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
        map.end()
    }
}

impl PurgePlan {
    /// How many rows the plan deletes, as counted when planning.
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|p| p.count).sum()
    }

    /// The counts as a dry-run report.
    pub fn dry_run_report(&self) -> PurgeReport {
        PurgeReport {
            dry_run: true,
            counts: self.counts(|p| p.count),
            source_count: self.source_count(),
        }
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
pub async fn plan_purge(sources: &[OpenSource], request: &PurgeRequest) -> Result<PurgePlan> {
    let mut kinds = Vec::new();
    if request.completed {
        kinds.push(FinishedKind::Completed);
    }
    if request.dead_letters {
        kinds.push(FinishedKind::DeadLetters);
    }
    if kinds.is_empty() {
        return Err(Error::Usage(
            "say what to purge: --completed, --dead-letters, or both".into(),
        ));
    }
    let age = match request.older_than {
        None => chrono::TimeDelta::zero(),
        Some(age) => chrono::TimeDelta::from_std(age)
            .map_err(|_| Error::Usage("--older-than is too long".into()))?,
    };
    let mut parts = Vec::new();
    for source in sources {
        let backend = source.queue.backend().clone();
        let now = backend.clock_now().await?;
        let before = now
            .checked_sub_signed(age)
            .ok_or_else(|| Error::Usage("--older-than reaches before the year 0".into()))?;
        for kind in &kinds {
            let filter = FinishedFilter {
                kind: *kind,
                before,
            };
            let count = backend.finished_count(&filter).await?;
            parts.push(PurgePart {
                source: source.name.clone(),
                backend: backend.clone(),
                filter,
                count,
            });
        }
    }
    Ok(PurgePlan { parts })
}

/// Deletes what the plan counted, in batches of [`PURGE_BATCH`] rows by primary key.
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
                filter: part.filter,
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
    })
}
