//! The counts the console shows, taken once and shared: one grouped statement per source
//! (by queue and type) from which every table of a page is derived, so the per-source,
//! per-queue and per-type figures of one page always agree, and any number of open tabs
//! costs the database one count per [`SAMPLE_EVERY`], not one per tab.
//!
//! The sampler counts only while someone watches: a page request in the last
//! [`WATCHED_FOR`] wakes it, and it goes back to sleep (no query at all) once nobody has
//! asked for that long. Pages read the latest snapshot when it is recent enough for them,
//! and otherwise wake the sampler and wait for the next one.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, watch};

use icq::admin::{PendingCount, PendingReport, StateCount};

/// How often the sampler counts while someone watches (and how often the overview
/// refreshes itself).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// How long after the last page request the sampler keeps counting.
pub const WATCHED_FOR: Duration = Duration::from_secs(60);

/// How long a page waits for a snapshot before it shows what it has (or an error).
const WAIT_AT_MOST: Duration = Duration::from_secs(30);

/// One sample of every open source.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When it was taken (the console's clock).
    pub at: DateTime<Utc>,
    /// When it was taken, for freshness.
    pub taken: Instant,
    /// Per source, per queue and type: the one statement each source answered.
    pub rows: Vec<PendingCount>,
    /// Every source that answered, in configuration order (a source with no rows
    /// still has a line of zeros).
    pub sources: Vec<String>,
    /// Sources that could not be opened or counted.
    pub errors: Vec<String>,
}

impl Snapshot {
    /// One line per source: the sum of its rows.
    pub fn totals(&self) -> PendingReport {
        let mut rows: Vec<PendingCount> = self
            .sources
            .iter()
            .map(|source| PendingCount {
                source: source.clone(),
                counts: StateCount::default(),
                paused: false,
            })
            .collect();
        for row in &self.rows {
            if let Some(total) = rows.iter_mut().find(|t| t.source == row.source) {
                add(&mut total.counts, &row.counts);
            }
        }
        PendingReport {
            rows,
            by_type: false,
            by_queue: false,
            source_count: self.sources.len(),
        }
    }

    /// One line per source and queue (`by_queue`) or per source and type.
    pub fn breakdown(&self, by_queue: bool) -> PendingReport {
        let mut lines: BTreeMap<(usize, String), StateCount> = BTreeMap::new();
        for row in &self.rows {
            let order = self
                .sources
                .iter()
                .position(|s| *s == row.source)
                .unwrap_or(usize::MAX);
            let key = if by_queue {
                row.counts.queue.clone()
            } else {
                row.counts.type_name.clone()
            }
            .unwrap_or_default();
            let line = lines.entry((order, key.clone())).or_default();
            if by_queue {
                line.queue = Some(key);
            } else {
                line.type_name = Some(key);
            }
            add(line, &row.counts);
        }
        PendingReport {
            rows: lines
                .into_iter()
                .map(|((order, _), counts)| {
                    let source = self.sources.get(order).cloned().unwrap_or_default();
                    let paused = by_queue
                        && self.rows.iter().any(|row| {
                            row.paused && row.source == source && row.counts.queue == counts.queue
                        });
                    PendingCount {
                        source,
                        counts,
                        paused,
                    }
                })
                .collect(),
            by_type: !by_queue,
            by_queue,
            source_count: self.sources.len(),
        }
    }

    /// The count of one source's rows matching a list's filters, summed by `pick`.
    pub fn count(
        &self,
        source: &str,
        type_name: Option<&str>,
        queue: Option<&str>,
        pick: impl Fn(&StateCount) -> u64,
    ) -> Option<u64> {
        if !self.sources.iter().any(|s| s == source) {
            return None;
        }
        Some(
            self.rows
                .iter()
                .filter(|row| row.source == source)
                .filter(|row| type_name.is_none_or(|t| row.counts.type_name.as_deref() == Some(t)))
                .filter(|row| queue.is_none_or(|q| row.counts.queue.as_deref() == Some(q)))
                .map(|row| pick(&row.counts))
                .sum(),
        )
    }
}

fn add(into: &mut StateCount, counts: &StateCount) {
    into.due += counts.due;
    into.scheduled += counts.scheduled;
    into.running += counts.running;
    into.dead += counts.dead;
    into.completed += counts.completed;
}

/// Who watches, and the latest snapshot.
pub struct Watch {
    last_request: Mutex<Option<Instant>>,
    wake: Notify,
    /// A page wants a newer snapshot than the latest.
    needed: Notify,
    latest: watch::Sender<Option<std::sync::Arc<Snapshot>>>,
    /// How many samples were taken (what the tests observe of the sampler).
    pub samples: std::sync::atomic::AtomicU64,
}

impl Default for Watch {
    fn default() -> Watch {
        Watch {
            last_request: Mutex::new(None),
            wake: Notify::new(),
            needed: Notify::new(),
            latest: watch::channel(None).0,
            samples: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Watch {
    /// Someone asked for a page: the sampler runs for the next [`WATCHED_FOR`].
    pub fn touch(&self) {
        if let Ok(mut last) = self.last_request.lock() {
            *last = Some(Instant::now());
        }
        self.wake.notify_one();
    }

    /// Whether a page was asked for within [`WATCHED_FOR`] of `now`.
    pub fn watched(&self, now: Instant) -> bool {
        self.last_request
            .lock()
            .ok()
            .and_then(|last| *last)
            .is_some_and(|last| now.saturating_duration_since(last) < WATCHED_FOR)
    }

    /// Waits until someone watches.
    pub async fn until_watched(&self) {
        loop {
            let notified = self.wake.notified();
            if self.watched(Instant::now()) {
                return;
            }
            notified.await;
        }
    }

    /// Waits until a page wants a newer snapshot than the latest.
    pub async fn until_needed(&self) {
        self.needed.notified().await;
    }

    /// Publishes a new snapshot.
    pub fn publish(&self, snapshot: Snapshot) {
        self.samples
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.latest
            .send_replace(Some(std::sync::Arc::new(snapshot)));
    }

    /// Marks the latest snapshot stale (after an action changed rows): the next page
    /// waits for a new one.
    pub fn invalidate(&self) {
        self.latest.send_replace(None);
    }

    /// A snapshot no older than `fresh`: the latest if it is, else the next one taken
    /// (waking the sampler). `None` when none came within a reasonable wait.
    pub async fn snapshot(&self, fresh: Duration) -> Option<std::sync::Arc<Snapshot>> {
        // An idle sampler is woken by the touch alone; a running one is asked for an
        // early count (asking an idle one too would make it count twice).
        let running = self.watched(Instant::now());
        self.touch();
        let mut receiver = self.latest.subscribe();
        let recent = |s: &Option<std::sync::Arc<Snapshot>>| {
            s.as_ref().filter(|s| s.taken.elapsed() <= fresh).cloned()
        };
        if let Some(snapshot) = recent(&receiver.borrow_and_update()) {
            return Some(snapshot);
        }
        if running {
            self.needed.notify_one();
        }
        let deadline = tokio::time::Instant::now() + WAIT_AT_MOST;
        loop {
            match tokio::time::timeout_at(deadline, receiver.changed()).await {
                Ok(Ok(())) => {
                    if let Some(snapshot) = receiver.borrow_and_update().clone() {
                        return Some(snapshot);
                    }
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(queue: &str, type_name: &str, due: u64, completed: u64) -> StateCount {
        StateCount {
            queue: Some(queue.into()),
            type_name: Some(type_name.into()),
            due,
            completed,
            ..StateCount::default()
        }
    }

    fn snapshot() -> Snapshot {
        let row = |source: &str, counts| PendingCount {
            source: source.into(),
            counts,
            paused: false,
        };
        Snapshot {
            at: Utc::now(),
            taken: Instant::now(),
            rows: vec![
                row("shop", counts("default", "a", 1, 10)),
                row("shop", counts("emails", "a", 2, 0)),
                row("shop", counts("emails", "b", 4, 1)),
            ],
            sources: vec!["shop".into(), "empty".into()],
            errors: Vec::new(),
        }
    }

    #[test]
    fn every_table_of_a_page_comes_from_the_same_rows() {
        let snapshot = snapshot();
        let totals = snapshot.totals();
        assert_eq!(
            totals.rows.len(),
            2,
            "a source with no rows has a line of zeros"
        );
        assert_eq!(
            (totals.rows[0].counts.due, totals.rows[0].counts.completed),
            (7, 11)
        );
        assert_eq!(totals.rows[1].counts, StateCount::default());
        let by_queue = snapshot.breakdown(true);
        let due: Vec<(Option<&str>, u64)> = by_queue
            .rows
            .iter()
            .map(|r| (r.counts.queue.as_deref(), r.counts.due))
            .collect();
        assert_eq!(due, [(Some("default"), 1), (Some("emails"), 6)]);
        let by_type = snapshot.breakdown(false);
        let due: Vec<u64> = by_type.rows.iter().map(|r| r.counts.due).collect();
        assert_eq!(due, [3, 4]);
        assert_eq!(
            snapshot.count("shop", Some("a"), Some("emails"), |c| c.due),
            Some(2)
        );
        assert_eq!(snapshot.count("nosuch", None, None, |c| c.due), None);
    }

    #[test]
    fn the_sampler_is_wanted_only_after_a_request_and_for_a_while() {
        let watch = Watch::default();
        let now = Instant::now();
        assert!(!watch.watched(now), "nobody asked yet");
        watch.touch();
        assert!(watch.watched(Instant::now()));
        assert!(!watch.watched(Instant::now() + WATCHED_FOR + Duration::from_secs(1)));
    }
}
