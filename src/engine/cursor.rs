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
            }),
        }
    }
}

impl ClaimCursor {
    /// Where the next claim starts: after a position, or `None` for the head (which also
    /// restarts the head-scan clock).
    pub(crate) fn start(&self) -> Option<Position> {
        let mut state = self.lock();
        if state.head_scanned_at.elapsed() >= HEAD_SCAN_EVERY {
            state.after = None;
        }
        if state.after.is_none() {
            state.head_scanned_at = Instant::now();
            state.spread = false;
        }
        state.after
    }

    /// Moves the cursor after a claim of up to `limit` rows: past the furthest row claimed
    /// when the claim was full, back to the head when it was short; with `spread`, once per
    /// head scan, a random distance further among rows of the furthest row's priority and
    /// `RunAt` ([`jump`]).
    pub(crate) fn advance(&self, claimed: &[ClaimedRow], limit: u32, spread: bool) {
        let mut state = self.lock();
        let short = claimed.len() < limit as usize;
        if std::mem::take(&mut state.jumped) {
            state.jump_spans = if short {
                (state.jump_spans / 2).max(JUMP_SPANS_MIN)
            } else {
                (state.jump_spans * 2).min(JUMP_SPANS_MAX)
            };
        }
        if short {
            state.after = None;
            return;
        }
        let positions: Vec<Position> = claimed
            .iter()
            .filter(|c| c.row.defects.is_empty())
            .filter_map(|c| Some((c.row.priority, c.row.run_at, c.row.id.as_uuid()?)))
            .collect();
        let furthest = positions.iter().copied().max();
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
