//! Where the next claim starts in the poll index: just after the last row claimed, so a
//! claim does not step over the rows this processor already holds.
//!
//! A claim from the head of the poll index (claim order: `"Priority", "RunAt", "Id"` on a
//! version-2 table, `"RunAt", "Id"` on version 1) walks every entry before the first
//! claimable row: the rows the processor has buffered and is running (leased, so filtered
//! out row by row) and the entries of rows completed moments ago (dead, not yet
//! vacuumed). Measured on 50,000 commands, that was 36 index entries read per command
//! claimed. A claim that starts after the `("Priority", "RunAt", "Id")` of the last row
//! claimed skips all of them with one index descent.
//!
//! Only claims of every queue and every type use it (the order it follows is the
//! all-queue poll index's); a claim with a queue or type filter starts at the head.
//! PostgreSQL and MariaDB (version-2 tables with icq's poll index) keep one; on MariaDB
//! the head is also where completed rows' delete-marked poll entries wait for the purge,
//! so a claim from the head read more of them the longer a drain ran (32 index reads per
//! command into a 50,000-command drain against 11 at 30,000).
//!
//! Rows behind the cursor can become claimable again: a lease that lapsed (a crashed
//! replica), a release, a row committed late by a long transaction with an early `RunAt`,
//! a new row of a more urgent priority than the cursor's.
//! So the cursor is dropped, and the next claim scans from the head, whenever a claim
//! comes back short (the rows after the cursor ran out) and at least every
//! [`HEAD_SCAN_EVERY`]: such rows wait that much longer at most.
//!
//! Costly heads. While a transaction holds back cleanup (PostgreSQL's xmin horizon,
//! MariaDB's purge), every row completed since stays in the poll index as an entry the
//! claim must fetch and reject, all of them at its head: a claim from the head grows
//! with the hold (a minute at 1,000 commands a second is 60,000 entries), and so does a
//! claim that starts anywhere behind the rows claimed last. When a claim from the head
//! took [`HEAD_COSTLY`] and several times what claims after the cursor take, a short
//! claim no longer drops the cursor: the next claim starts right after the furthest row
//! claimed (the frontier). Every [`HEAD_SCAN_EVERY`] one claim starts [`LATE_COMMIT`]
//! before the frontier instead (a row committed a little late, with the `RunAt` of its
//! transaction's start, is still found there), and the claims from the head, which also
//! tell when the head is cheap again, come no more often than their cost allows
//! ([`crate::engine::paced`], by the cheaper of the last two: one claim slowed by a stall
//! is an outlier, a held horizon makes every one dear). Meanwhile a lapsed lease, a release or a more urgent new
//! row waits for the next claim from the head, as rows behind the cursor always could.
//!
//! Replicas apart. Each processor's cursor follows its own claims, so several replicas
//! draining one backlog all chase the same head and every claim steps over the rows the
//! others claimed since (leased rows cannot be skipped by the index: each is fetched and
//! rejected): four replicas read 22 index entries per command against 9 for one. While
//! other processors hold leases at the head ([`crate::engine::ClaimParams::spread`]),
//! the first full claim after a head scan moves the cursor a random distance further on
//! (a random number of times the stretch of ids that claim covered, up to a bound that
//! grows while jumps land among rows and shrinks when they overshoot) among rows of the same
//! `Priority` and `RunAt` (a backlog scheduled in one transaction shares one `RunAt`), so
//! replicas claim from different places. The claim order promises nothing among rows of
//! equal priority and `RunAt` beyond a tie-break, so this reorders nothing it promises;
//! the rows jumped over are behind the cursor as above.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::engine::ClaimedRow;

/// How far a spreading jump goes at most, in spans of the claim before it: where it
/// starts, and its bounds as it adapts (doubled after a jump that landed among rows,
/// halved after one that overshot the group, i.e. was followed by a short claim).
const JUMP_SPANS: u128 = 32;
const JUMP_SPANS_MIN: u128 = 2;
const JUMP_SPANS_MAX: u128 = 4096;

/// A position further on with `at`'s priority and `RunAt`: a random number (0 to
/// `spans`) of `span`s past its id, where `span` is how much of the id space the last
/// claim's rows of that group covered. Ids are random (version 4) or time-ordered
/// (MariaDB's `UUID()` is version 1) — the span measures how densely they sit either way.
fn jump((priority, run_at, id): Position, span: u128, spans: u128) -> Position {
    let steps = Uuid::new_v4().as_u128() % (spans + 1);
    let to = id.as_u128().saturating_add(steps.saturating_mul(span));
    (priority, run_at, Uuid::from_u128(to))
}

/// The longest a claimable row behind the cursor waits for a claim from the head.
pub(crate) const HEAD_SCAN_EVERY: Duration = Duration::from_millis(500);

/// A claim from the head this long (and [`COSTLY_FACTOR`] times the claims after the
/// cursor) means the head holds many entries to step over.
const HEAD_COSTLY: Duration = Duration::from_millis(2);

/// How many times the smoothed claim after the cursor a costly head claim takes.
const COSTLY_FACTOR: f64 = 4.0;

/// How far before the furthest row claimed a claim goes back every [`HEAD_SCAN_EVERY`]
/// while the head is costly: rows committed that much after their `RunAt` are found.
const LATE_COMMIT: Duration = Duration::from_secs(1);

/// A position in the poll index: `("Priority", "RunAt", "Id")` of a claimed row (the
/// priority is 0 on a version-1 table, whose claims compare `RunAt` and `Id` only).
pub(crate) type Position = (i16, DateTime<Utc>, Uuid);

/// The claim cursor of one driver (one per source; claims with a type or queue filter
/// always scan from the head, since the cursor follows the unfiltered order).
#[derive(Debug)]
pub(crate) struct ClaimCursor {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    after: Option<Position>,
    head_scanned_at: Instant,
    /// The cursor jumped since the last head scan (at most once per head scan).
    spread: bool,
    /// The last claim started where a jump put the cursor.
    jumped: bool,
    /// How far the next jump may go, in claim spans (adapts; see [`JUMP_SPANS`]).
    jump_spans: u128,
    /// The furthest row of the last claim that claimed any.
    frontier: Option<Position>,
    /// When the claim in flight from the head started (`None`: it started after the
    /// cursor).
    head_started: Option<Instant>,
    /// When the claim in flight after the cursor started.
    cursor_started: Option<Instant>,
    /// Claims after the cursor, smoothed (seconds).
    cursor_claim: Option<f64>,
    /// The last claim from the head was costly (see the module's doc).
    head_costly: bool,
    /// How long the last claim from the head took.
    head_cost: Duration,
    /// How long the one before it took.
    head_cost_before: Duration,
    /// When a claim last started [`LATE_COMMIT`] before the frontier.
    looked_back_at: Instant,
}

impl Default for ClaimCursor {
    fn default() -> Self {
        ClaimCursor {
            state: Mutex::new(State {
                after: None,
                head_scanned_at: Instant::now(),
                spread: false,
                jumped: false,
                jump_spans: JUMP_SPANS,
                frontier: None,
                head_started: None,
                cursor_started: None,
                cursor_claim: None,
                head_costly: false,
                head_cost: Duration::ZERO,
                head_cost_before: Duration::ZERO,
                looked_back_at: Instant::now(),
            }),
        }
    }
}

impl ClaimCursor {
    /// Where the next claim starts: after a position, or `None` for the head (which also
    /// restarts the head-scan clock).
    pub(crate) fn start(&self) -> Option<Position> {
        let mut state = self.lock();
        let now = Instant::now();
        let head_every = if state.head_costly {
            super::paced(HEAD_SCAN_EVERY, state.head_cost.min(state.head_cost_before))
        } else {
            HEAD_SCAN_EVERY
        };
        if now.duration_since(state.head_scanned_at) >= head_every {
            state.after = None;
        } else if state.head_costly
            && now.duration_since(state.looked_back_at) >= HEAD_SCAN_EVERY
            && let Some((priority, run_at, _)) = state.frontier
        {
            state.looked_back_at = now;
            let back = chrono::Duration::from_std(LATE_COMMIT).unwrap_or_default();
            let back = (priority, run_at - back, Uuid::nil());
            state.after = Some(state.after.map_or(back, |at| at.min(back)));
        }
        if state.after.is_none() {
            state.head_scanned_at = now;
            state.spread = false;
            state.head_started = Some(now);
            state.cursor_started = None;
        } else {
            state.head_started = None;
            state.cursor_started = Some(now);
        }
        state.after
    }

    /// Whether the next claim starts from the head.
    pub(crate) fn at_head(&self) -> bool {
        self.lock().after.is_none()
    }

    /// Times the claim that [`ClaimCursor::start`] began (when no other began since).
    fn time_claim(state: &mut State) {
        if let Some(started) = state.cursor_started.take() {
            let took = started.elapsed().as_secs_f64();
            state.cursor_claim = Some(match state.cursor_claim {
                Some(smoothed) => smoothed * 0.8 + took * 0.2,
                None => took,
            });
        }
        if let Some(started) = state.head_started.take() {
            let took = started.elapsed();
            state.head_cost_before = std::mem::replace(&mut state.head_cost, took);
            // Against nothing to compare (no claim after the cursor yet), never costly.
            state.head_costly = state.cursor_claim.is_some_and(|usual| {
                took >= HEAD_COSTLY && took.as_secs_f64() >= usual * COSTLY_FACTOR
            });
        }
    }

    /// Moves the cursor after a claim of up to `limit` rows: past the furthest row claimed
    /// when the claim was full, back to the head when it was short (while the head is
    /// costly: to the furthest row of the last claim that found any);
    /// with `spread`, once per head scan, a random distance further among rows of the
    /// furthest row's priority and `RunAt` ([`jump`]).
    pub(crate) fn advance(&self, claimed: &[ClaimedRow], limit: u32, spread: bool) {
        let positions: Vec<Position> = claimed
            .iter()
            .filter(|c| c.row.defects.is_empty())
            .filter_map(|c| Some((c.row.priority, c.row.run_at, c.row.id.as_uuid()?)))
            .collect();
        self.advance_past(&positions, claimed.len() < limit as usize, spread);
    }

    /// [`ClaimCursor::advance`] with the claimed rows' positions, and whether the claim
    /// was short.
    fn advance_past(&self, positions: &[Position], short: bool, spread: bool) {
        let mut state = self.lock();
        Self::time_claim(&mut state);
        if std::mem::take(&mut state.jumped) {
            state.jump_spans = if short {
                (state.jump_spans / 2).max(JUMP_SPANS_MIN)
            } else {
                (state.jump_spans * 2).min(JUMP_SPANS_MAX)
            };
        }
        let furthest = positions.iter().copied().max();
        if furthest.is_some() {
            state.frontier = furthest;
        }
        if short {
            state.after = if state.head_costly {
                state.frontier
            } else {
                None
            };
            return;
        }
        state.after = match (state.after, furthest) {
            (Some(at), Some(furthest)) => Some(at.max(furthest)),
            (at, furthest) => at.or(furthest),
        };
        if spread && !state.spread {
            state.spread = true;
            if let Some((priority, run_at, last)) = furthest {
                let first = positions
                    .iter()
                    .filter(|(p, r, _)| (*p, *r) == (priority, run_at))
                    .map(|(_, _, id)| *id)
                    .min()
                    .unwrap_or(last);
                let span = last.as_u128() - first.as_u128();
                let to = jump((priority, run_at, last), span, state.jump_spans);
                state.after = state.after.map(|at| at.max(to));
                state.jumped = true;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is plain values: a panic elsewhere cannot leave it torn.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short claim drops the cursor while claims from the head are cheap; once one took
    /// [`HEAD_COSTLY`] and several times a claim after the cursor, a short claim leaves the
    /// cursor at its furthest row and an empty one keeps it there; every
    /// [`HEAD_SCAN_EVERY`] a claim goes [`LATE_COMMIT`] back, and the claim from the head
    /// (paced by its cost) finds the head cheap again.
    #[test]
    fn a_costly_head_keeps_the_cursor_after_short_claims() {
        let cursor = ClaimCursor::default();
        let run_at = Utc::now();
        let row = (0, run_at, Uuid::now_v7());
        // A cheap head: a short claim goes back to the head.
        assert_eq!(cursor.start(), None);
        cursor.advance_past(&[row], true, false);
        assert_eq!(cursor.start(), None);
        // A full claim moves past its rows, and the claim after them is timed.
        cursor.advance_past(&[row], false, false);
        assert_eq!(cursor.start(), Some(row));
        cursor.advance_past(&[row], false, false);
        assert_eq!(cursor.start(), Some(row));
        cursor.advance_past(&[row], false, false);
        // A costly claim from the head (the cursor dropped by hand to start one).
        cursor.lock().after = None;
        assert_eq!(cursor.start(), None);
        std::thread::sleep(HEAD_COSTLY + Duration::from_millis(2));
        cursor.advance_past(&[row], true, false);
        assert_eq!(cursor.start(), Some(row), "short: after its furthest row");
        cursor.advance_past(&[], true, false);
        assert_eq!(cursor.start(), Some(row), "empty: the cursor stays");
        cursor.advance_past(&[], true, false);
        // A look back once every HEAD_SCAN_EVERY, then after the frontier again.
        cursor.lock().looked_back_at = Instant::now() - HEAD_SCAN_EVERY;
        let back = (0, run_at - chrono::Duration::seconds(1), Uuid::nil());
        assert_eq!(cursor.start(), Some(back), "behind the frontier");
        cursor.advance_past(&[], true, false);
        assert_eq!(cursor.start(), Some(row));
        cursor.advance_past(&[], true, false);
        // From the head once the paced interval passed; a cheap one ends the costly head.
        let every = {
            let state = cursor.lock();
            crate::engine::paced(HEAD_SCAN_EVERY, state.head_cost.min(state.head_cost_before))
        };
        assert!(every >= HEAD_SCAN_EVERY);
        cursor.lock().head_scanned_at = Instant::now() - every;
        assert_eq!(cursor.start(), None);
        cursor.advance_past(&[row], true, false);
        assert_eq!(cursor.start(), None);
        // One claim from the head slowed by a stall (a minute) is an outlier: the next
        // comes after the interval the claim before it set.
        let costly = |last: u64, before: u64, since: Duration| {
            let mut state = cursor.lock();
            state.head_costly = true;
            state.head_cost = Duration::from_secs(last);
            state.head_cost_before = Duration::from_millis(before);
            state.after = Some(row);
            state.head_scanned_at = Instant::now() - since;
        };
        costly(60, 1, HEAD_SCAN_EVERY);
        assert_eq!(cursor.start(), None, "after the usual interval");
        // Two in a row (a long-held horizon): paced, but sixty intervals at most.
        costly(60, 60_000, HEAD_SCAN_EVERY * 59);
        assert_eq!(cursor.start(), Some(row), "not yet");
        costly(60, 60_000, HEAD_SCAN_EVERY * 60);
        assert_eq!(cursor.start(), None, "sixty intervals at most");
    }

    #[test]
    fn a_jump_stays_among_rows_of_the_same_priority_and_run_at_and_moves_on() {
        let run_at = Utc::now();
        let span = 1u128 << 100;
        let mut moved = 0;
        for _ in 0..1_000 {
            let id = Uuid::from_u128(Uuid::new_v4().as_u128() >> 1);
            let (priority, at, to) = jump((3, run_at, id), span, JUMP_SPANS);
            assert_eq!((priority, at), (3, run_at));
            assert!(to >= id, "{to} before {id}");
            assert!(
                to.as_u128() - id.as_u128() <= JUMP_SPANS * span,
                "{to} too far"
            );
            moved += usize::from(to != id);
        }
        assert!(moved > 900, "only {moved} of 1000 jumps moved");
        let last = (0, run_at, Uuid::max());
        assert_eq!(
            jump(last, span, JUMP_SPANS),
            last,
            "the end of the id space is as far as it goes"
        );
    }
}
