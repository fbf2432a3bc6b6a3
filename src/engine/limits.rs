//! The limited claim: a queue's fleet-wide limits (`global_concurrency`,
//! `key_concurrency`, `rate`) enforced by the claim itself, in the database, with no
//! leader.
//!
//! Every limited claim of a queue runs in one transaction that first locks the queue's row
//! of the `<table>Queues` table (inserted on first use; `SELECT … FOR UPDATE` on
//! PostgreSQL and MariaDB, SQLite's single writer under `BEGIN IMMEDIATE`). Holding it,
//! the claim counts the queue's live leases (pending rows whose `LockedUntil` is after
//! the database's now), refills the token bucket by the database's clock, claims at most
//! what every limit still allows and takes the tokens, then commits. Claims of one queue
//! therefore see each other's leases one after the other, never at once, so racing
//! replicas cannot together exceed a limit; a crashed replica's leases stop counting when
//! they lapse. Queues without limits never come here: their claims stay as they are.
//!
//! A hand-on needs neither the lock nor the count. When a claim under `global_concurrency`
//! alone (no rate, no per-key limit) carries the outcomes of rows whose leases it holds,
//! the places those leases fill are its own: it stamps them and leases at most as many
//! rows in the same commit, so no commit ever raises the queue's live leases and every
//! count another claim takes stays true. A hand-on holds the queue's row in share mode
//! (hand-ons do not wait for each other; a counting claim, which holds it exclusively,
//! waits for them and they for it): a lease that lapses while a hand-on waits on a lock or
//! a slow commit cannot be counted free by a claim meanwhile, and a pause is ordered
//! with every hand-on. Its leases must still be live, by half a lease (renewals keep a
//! live row's at two thirds or more); a hand-on whose rows do not all qualify, or whose
//! queue is paused, takes the lock like any claim. A hand-on never counts, so places freed
//! without one (a crashed replica's lapsed leases) are found by the counting claims the
//! processor makes at least every second.
//! The count reads every pending row of the queue (no index finds live leases, and on
//! PostgreSQL none may: claims would lose their HOT updates), so with a backlog it is the
//! dearest step of a claim; a queue at its limit hands its places on without it, and its
//! hand-ons no longer wait for each other on the lock.
//!
//! This module holds what the three engines share: the parameters and answer of the
//! claim, the bucket's arithmetic and the choice of rows under a per-key limit. The SQL is
//! each engine's.

use std::collections::HashMap;
use std::time::Duration;

use super::{ClaimParams, ClaimedRow, SetState};
use crate::error::Result;

/// A queue's fleet-wide limits, as the claim enforces them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueLimits {
    /// At most this many live leases of the queue.
    pub global_concurrency: Option<u32>,
    /// At most this many live leases of the queue per `ConcurrencyKey`.
    pub key_concurrency: Option<u32>,
    /// The token bucket: tokens per second and its capacity.
    pub rate: Option<RateLimit>,
}

/// A token bucket's refill rate and capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Tokens added per second of the database's clock.
    pub per_second: f64,
    /// The most tokens the bucket holds (a new bucket starts full).
    pub burst: f64,
}

impl QueueLimits {
    /// The limits a queue's settings configure (`None` when it has none).
    pub fn of(queue: &crate::settings::QueueSettings) -> Option<QueueLimits> {
        queue.is_limited().then(|| QueueLimits {
            global_concurrency: queue.global_concurrency,
            key_concurrency: queue.key_concurrency,
            rate: queue.rate.map(|rate| RateLimit {
                per_second: rate.per_second(),
                burst: rate.burst(),
            }),
        })
    }
}

/// A limited claim: stamps first, then a claim of one queue under its limits, in one
/// transaction.
#[derive(Debug, Clone, Copy)]
pub struct LimitedClaimParams<'a> {
    /// The claim; its `queues` names exactly the limited queue.
    pub claim: &'a ClaimParams,
    /// The queue's limits.
    pub limits: &'a QueueLimits,
    /// Outcome stamps written first, in the same transaction (may be empty): a slot that
    /// finished gives its lease back and the same commit may hand it on.
    pub changes: &'a [SetState],
    /// The stamps' places may be handed on without the queue's lock or count (see
    /// [`crate::engine::limits`]); `false` counts, which also finds places that were
    /// freed without a hand-on (a crashed replica's lapsed leases). The processor counts
    /// at least every second.
    pub hand_on: bool,
}

/// Why a limited claim took fewer rows than it asked for although rows may be due.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Held {
    /// The queue's live leases are at `global_concurrency`.
    Concurrency,
    /// The due rows' keys are at `key_concurrency`.
    Keys,
    /// The bucket is empty; the next token comes in this long.
    Rate(Duration),
    /// The queue is paused.
    Paused,
}

/// What a limited claim did.
#[derive(Debug, Default)]
pub struct LimitedClaim {
    /// Stamps written.
    pub stamped: u64,
    /// The rows claimed.
    pub rows: Vec<ClaimedRow>,
    /// Set when a limit (or a pause) held the claim back: the producer then looks again
    /// soon, since no insert will wake it when the limit frees up.
    pub held: Option<Held>,
}

/// The queue's row of `<table>Queues` as the limited claim read it, locked.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QueueRow {
    /// `Paused`.
    pub paused: bool,
    /// `RateTokens` (NULL: no bucket yet).
    pub tokens: Option<f64>,
    /// Seconds of the database's clock since `RateCheckedAt` (NULL: never written).
    pub elapsed: Option<f64>,
}

/// Which due rows of the queue to lock as candidates, in claim order, skipping rows other
/// claims hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidates<'a> {
    /// The queue.
    pub queue: &'a str,
    /// The claim (types, processing delay).
    pub claim: &'a ClaimParams,
    /// Rows whose key is one of these are left out (their key is at its limit).
    pub except_keys: &'a [String],
    /// Rows already looked at by this claim are left out.
    pub except_ids: &'a [String],
    /// At most this many.
    pub limit: u32,
}

/// The statements of a limited claim, run by each engine inside its open transaction.
#[async_trait::async_trait]
pub(crate) trait LimitedTx: Send {
    /// Reads the queue's row of `<table>Queues`, locked (`None`: it has none yet).
    async fn read_queue(&mut self, queue: &str) -> Result<Option<QueueRow>>;
    /// Inserts the queue's row of `<table>Queues` unless it exists (race-safe: a
    /// concurrent insert of the same queue makes this one insert nothing).
    async fn insert_queue(&mut self, queue: &str) -> Result<()>;
    /// Locks the queue's row of `<table>Queues`, inserting it first when it is missing,
    /// and reads it.
    async fn lock_queue(&mut self, queue: &str) -> Result<QueueRow> {
        if let Some(row) = self.read_queue(queue).await? {
            return Ok(row);
        }
        self.insert_queue(queue).await?;
        Ok(self.read_queue(queue).await?.unwrap_or_default())
    }
    /// Writes outcome stamps (each guarded by its lease token), moving completed rows to
    /// history; returns how many were stamped.
    async fn stamp(&mut self, changes: &[SetState]) -> Result<u64>;
    /// The queue's live leases (pending, `LockedUntil` after the database's now).
    async fn running(&mut self, queue: &str) -> Result<u64>;
    /// Locks and returns due rows (`Id` as text, `ConcurrencyKey`), see [`Candidates`].
    async fn candidates(&mut self, which: &Candidates<'_>)
    -> Result<Vec<(String, Option<String>)>>;
    /// The queue's live leases per key, of `keys`.
    async fn running_by_key(
        &mut self,
        queue: &str,
        keys: &[String],
    ) -> Result<HashMap<String, u64>>;
    /// Leases the rows `ids` (locked by [`LimitedTx::candidates`]) as a claim does, and
    /// returns them.
    async fn lease(&mut self, ids: &[&str], claim: &ClaimParams) -> Result<Vec<ClaimedRow>>;
    /// Locks the candidates of `which` and leases them all: [`LimitedTx::candidates`], then
    /// [`LimitedTx::lease`], or one statement where the engine can.
    async fn claim_free(&mut self, which: &Candidates<'_>) -> Result<Vec<ClaimedRow>> {
        let found = self.candidates(which).await?;
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = found.iter().map(|(id, _)| id.as_str()).collect();
        self.lease(&ids, which.claim).await
    }

    /// Writes the bucket: `tokens` left, `RateCheckedAt` moved on by `advance` seconds
    /// (the span the refill counted, so no time is counted twice or lost between the
    /// statements' clocks), or set to the database's now when it was NULL.
    async fn store_tokens(&mut self, queue: &str, tokens: f64, advance: f64) -> Result<()>;

    /// For a hand-on: holding the queue's row of `<table>Queues` in share mode, how many
    /// of the rows `changes` stamp are pending rows of `queue` leased under their change's
    /// token until at least `margin` after the database's now, and whether `queue` is
    /// paused. The rows are read by primary key alone (queue, state and lease judged on the
    /// rows read: with them in the condition, PostgreSQL read a table not yet analyzed
    /// through a poll index, every pending row). A queue without its row gives back no
    /// place (the counting claim inserts it). `None`: this engine hands places on under
    /// the queue's lock only.
    async fn places_to_hand_on(
        &mut self,
        queue: &str,
        changes: &[SetState],
        margin: Duration,
    ) -> Result<Option<Places>> {
        let _ = (queue, changes, margin);
        Ok(None)
    }

    /// The hand-on's statements: [`LimitedTx::places_to_hand_on`]; when every row
    /// qualifies, the stamps; when they all landed, [`LimitedTx::claim_free`] of
    /// `ask.which`. An engine may run them in fewer round trips, as long as it leases
    /// nothing unless [`HandOn::may_lease`]. `None`: this engine hands places on under
    /// the queue's lock only.
    async fn hand_on(&mut self, ask: &HandOn<'_>) -> Result<Option<HandedOn>> {
        let Some(places) = self
            .places_to_hand_on(ask.which.queue, ask.changes, ask.margin)
            .await?
        else {
            return Ok(None);
        };
        if !ask.may_stamp(places) {
            return Ok(Some(HandedOn::Declined));
        }
        let stamped = self.stamp(ask.changes).await?;
        let rows = if ask.may_lease(places, stamped) {
            self.claim_free(&ask.which).await?
        } else {
            Vec::new()
        };
        Ok(Some(HandedOn::Stamped {
            places,
            stamped,
            rows,
        }))
    }
}

/// A hand-on's question (see [`LimitedTx::hand_on`]).
pub(crate) struct HandOn<'a> {
    /// The outcomes to stamp.
    pub changes: &'a [SetState],
    /// How long after the database's now each lease handed on must still be live.
    pub margin: Duration,
    /// The rows to lease in their places (at most as many as `changes`).
    pub which: Candidates<'a>,
}

impl HandOn<'_> {
    /// Every stamp ends a live lease of the queue, which is not paused.
    pub(crate) fn may_stamp(&self, places: Places) -> bool {
        !places.paused && places.live == self.changes.len() as u64
    }

    /// ... and every stamp landed: the places are this hand-on's to fill.
    pub(crate) fn may_lease(&self, places: Places, stamped: u64) -> bool {
        self.may_stamp(places) && stamped == places.live
    }
}

/// What a hand-on did.
pub(crate) enum HandedOn {
    /// Not every row qualified: nothing was written; the claim takes the lock.
    Declined,
    /// The stamps were written, and the rows leased when [`HandOn::may_lease`].
    Stamped {
        places: Places,
        stamped: u64,
        rows: Vec<ClaimedRow>,
    },
}

/// What [`LimitedTx::places_to_hand_on`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Places {
    /// Rows whose live lease (with the margin) the stamps end.
    pub live: u64,
    /// The queue's `Paused`.
    pub paused: bool,
}

/// One row of a hand-on's read, decoded by the engine (`None`: NULL or unreadable). The
/// engines that read the places apart from the stamps; PostgreSQL judges them in SQL.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) struct PlaceRow {
    /// The queue's `Paused`.
    pub paused: bool,
    pub id: Option<String>,
    pub token: Option<String>,
    pub queue: Option<String>,
    /// Pending, and leased for the margin and more.
    pub live: bool,
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
impl Places {
    /// The places `rows` give back to a hand-on of `queue` stamping `changes`: the live
    /// rows of exactly that queue leased under their change's token (compared here, byte
    /// for byte, whatever the columns' collation).
    pub(crate) fn tally(
        queue: &str,
        changes: &[SetState],
        rows: impl IntoIterator<Item = PlaceRow>,
    ) -> Places {
        let mut places = Places::default();
        for row in rows {
            places.paused |= row.paused;
            let (Some(id), Some(token), Some(of)) = (row.id, row.token, row.queue) else {
                continue;
            };
            let ours = row.live
                && of == queue
                && changes
                    .iter()
                    .any(|c| c.lease.id.as_str() == id && c.lease.token.to_string() == token);
            places.live += u64::from(ours);
        }
        places
    }
}

/// A lease handed on must stay live this share of a lease past the hand-on's start.
const HAND_ON_MARGIN_DIVISOR: u32 = 2;

/// The limited claim's steps inside the engine's transaction: lock the queue's row, write
/// the stamps, count, refill, claim what the limits allow, take the tokens. The stamps
/// come after the lock, so the limited claims of a queue never hold row locks while they
/// wait for each other (on InnoDB, stamps that waited for the queue's lock holding their
/// rows met deadlocks with the claim holding it).
pub(crate) async fn claim_in(
    tx: &mut dyn LimitedTx,
    params: &LimitedClaimParams<'_>,
) -> Result<LimitedClaim> {
    let claim = params.claim;
    let Some([queue]) = claim.queues.as_deref() else {
        return Err(crate::Error::invalid(
            "a limited claim names exactly one queue".to_owned(),
        ));
    };
    if let Some(claimed) = hand_on(tx, params, queue).await? {
        return Ok(claimed);
    }
    let row = tx.lock_queue(queue).await?;
    let stamped = if params.changes.is_empty() {
        0
    } else {
        tx.stamp(params.changes).await?
    };
    let (rows, held) = claim_locked(tx, params, queue, row).await?;
    Ok(LimitedClaim {
        stamped,
        rows,
        held,
    })
}

/// The hand-on without the queue's lock (see the module's doc), when it applies: every
/// stamped row gave back a live place of `queue`, which is not paused, and its only limit
/// is `global_concurrency`. `None`: the claim takes the lock instead (nothing was written).
async fn hand_on(
    tx: &mut dyn LimitedTx,
    params: &LimitedClaimParams<'_>,
    queue: &str,
) -> Result<Option<LimitedClaim>> {
    let Some(ask) = hand_on_ask(params, queue) else {
        return Ok(None);
    };
    match tx.hand_on(&ask).await? {
        None | Some(HandedOn::Declined) => Ok(None),
        Some(HandedOn::Stamped {
            places,
            stamped,
            rows,
        }) => Ok(Some(handed_on(&ask, params.claim, places, stamped, rows))),
    }
}

/// The hand-on a limited claim of `queue` may make first: when it carries outcomes, the
/// processor allows it, and the queue's only limit is `global_concurrency`.
pub(crate) fn hand_on_ask<'a>(
    params: &LimitedClaimParams<'a>,
    queue: &'a str,
) -> Option<HandOn<'a>> {
    let (limits, changes) = (params.limits, params.changes);
    if !params.hand_on
        || changes.is_empty()
        || limits.global_concurrency.is_none()
        || limits.rate.is_some()
        || limits.key_concurrency.is_some()
    {
        return None;
    }
    let limit = params
        .claim
        .limit
        .min(u32::try_from(changes.len()).unwrap_or(u32::MAX));
    Some(HandOn {
        changes,
        margin: params.claim.lease / HAND_ON_MARGIN_DIVISOR,
        which: Candidates {
            queue,
            claim: params.claim,
            except_keys: &[],
            except_ids: &[],
            limit,
        },
    })
}

/// The claim's answer once a hand-on of `ask` read `places`, stamped `stamped` rows and
/// leased `rows` (none unless [`HandOn::may_lease`]).
pub(crate) fn handed_on(
    ask: &HandOn<'_>,
    claim: &ClaimParams,
    places: Places,
    stamped: u64,
    rows: Vec<ClaimedRow>,
) -> LimitedClaim {
    if !ask.may_lease(places, stamped) {
        // A lease changed hands (an operator's cancel) between the read and the stamp:
        // its place may be another claim's by now. Nothing was claimed; the next claim
        // counts.
        return LimitedClaim {
            stamped,
            rows: Vec::new(),
            held: Some(Held::Concurrency),
        };
    }
    // Cut short by the places it had, not by the rows due: the limit holds the rest.
    let limit = ask.which.limit;
    let held = (limit < claim.limit && rows.len() as u32 == limit).then_some(Held::Concurrency);
    LimitedClaim {
        stamped,
        rows,
        held,
    }
}

/// [`claim_in`] once the queue's row is locked and the stamps are written.
async fn claim_locked(
    tx: &mut dyn LimitedTx,
    params: &LimitedClaimParams<'_>,
    queue: &str,
    row: QueueRow,
) -> Result<(Vec<ClaimedRow>, Option<Held>)> {
    let (claim, limits) = (params.claim, params.limits);
    if row.paused {
        return Ok((Vec::new(), Some(Held::Paused)));
    }
    let running = match limits.global_concurrency {
        Some(_) => tx.running(queue).await?,
        None => 0,
    };
    let tokens = limits
        .rate
        .as_ref()
        .map(|rate| refill(rate, row.tokens, row.elapsed));
    let (allowed, held) = allowed(limits, claim.limit, running, tokens);
    if allowed == 0 {
        return Ok((Vec::new(), held));
    }
    let mut ids: Vec<String> = Vec::new();
    let mut held = held;
    let rows = match limits.key_concurrency {
        None => {
            let which = Candidates {
                queue,
                claim,
                except_keys: &[],
                except_ids: &[],
                limit: allowed,
            };
            tx.claim_free(&which).await?
        }
        Some(k) => {
            // Candidates a few times over, in claim order; a key at its limit is left out
            // of the next look, so a key with a long backlog at the head cannot hide the
            // rows of other keys behind it.
            let mut full: Vec<String> = Vec::new();
            let mut seen: Vec<String> = Vec::new();
            let mut taken: HashMap<String, u64> = HashMap::new();
            for _ in 0..4 {
                let limit = candidates_for(allowed - ids.len() as u32);
                let which = Candidates {
                    queue,
                    claim,
                    except_keys: &full,
                    except_ids: &seen,
                    limit,
                };
                let found = tx.candidates(&which).await?;
                let keys = keys_of(&found);
                let mut running = if keys.is_empty() {
                    HashMap::new()
                } else {
                    tx.running_by_key(queue, &keys).await?
                };
                for (key, n) in &taken {
                    *running.entry(key.clone()).or_default() += n;
                }
                let left = allowed - ids.len() as u32;
                let picked = pick_by_key(&found, &running, k, left, &mut full);
                for id in picked {
                    if let Some((_, Some(key))) = found.iter().find(|(i, _)| i == id) {
                        *taken.entry(key.clone()).or_default() += 1;
                    }
                    ids.push(id.to_owned());
                }
                seen.extend(found.iter().map(|(id, _)| id.clone()));
                if ids.len() as u32 >= allowed || (found.len() as u32) < limit {
                    break;
                }
            }
            if (ids.len() as u32) < allowed && !full.is_empty() {
                held = held.or(Some(Held::Keys));
            }
            if ids.is_empty() {
                return Ok((Vec::new(), held));
            }
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            tx.lease(&refs, claim).await?
        }
    };
    if rows.is_empty() {
        return Ok((rows, held));
    }
    if let Some(tokens) = tokens {
        let advance = row
            .elapsed
            .filter(|e| e.is_finite())
            .unwrap_or(0.0)
            .max(0.0);
        tx.store_tokens(queue, (tokens - rows.len() as f64).max(0.0), advance)
            .await?;
    }
    Ok((rows, held))
}

/// A look before the limited claim's transaction, for a claim that carries no stamps (a
/// replica looking for a free place, not one handing on its own): when the queue's live
/// leases already fill `global_concurrency`, the claim is held back without taking the
/// queue's lock, which the replicas handing on their places wait on. A plain count outside
/// any transaction, so it never fixes the snapshot the claim's own count reads; a place
/// that frees up just after it is found at the next look.
pub(crate) async fn full_before_claim(
    conn: &mut dyn LimitedTx,
    params: &LimitedClaimParams<'_>,
) -> Result<bool> {
    let (Some(n), true) = (params.limits.global_concurrency, params.changes.is_empty()) else {
        return Ok(false);
    };
    let Some([queue]) = params.claim.queues.as_deref() else {
        return Ok(false);
    };
    Ok(conn.running(queue).await? >= u64::from(n))
}

/// The error for a limit configured on a table older than version 4.
pub(crate) fn needs_schema_v4(table: &crate::ident::TableName, version: u32) -> crate::Error {
    crate::Error::needs_schema_v4(
        table,
        version,
        "a queue's `global_concurrency`, `key_concurrency` or `rate`",
    )
}

/// The bucket's tokens now: `stored` (NULL: a new bucket, full) plus what accrued over
/// `elapsed` seconds of the database's clock since it was last written (NULL: never; a
/// negative span — another claim's clock read later — adds nothing), at most the capacity.
pub(crate) fn refill(rate: &RateLimit, stored: Option<f64>, elapsed: Option<f64>) -> f64 {
    let Some(stored) = stored.filter(|t| t.is_finite()) else {
        return rate.burst;
    };
    let elapsed = elapsed.filter(|e| e.is_finite()).unwrap_or(0.0).max(0.0);
    (stored.max(0.0) + elapsed * rate.per_second).min(rate.burst)
}

/// How many rows the claim may take: at most `asked`, what `global_concurrency` leaves
/// beside `running` live leases, and the whole tokens; with the reason when a limit cut
/// the claim short (the producer then waits for a slot of its own or a short while
/// instead of claiming again at once, which would only meet the limit again).
pub(crate) fn allowed(
    limits: &QueueLimits,
    asked: u32,
    running: u64,
    tokens: Option<f64>,
) -> (u32, Option<Held>) {
    let mut allowed = asked;
    let mut held = None;
    if let Some(n) = limits.global_concurrency {
        let free = u64::from(n).saturating_sub(running);
        if free < u64::from(allowed) {
            allowed = free as u32;
            held = Some(Held::Concurrency);
        }
    }
    if let (Some(rate), Some(tokens)) = (&limits.rate, tokens) {
        let whole = tokens.max(0.0).floor();
        if whole < f64::from(allowed) {
            allowed = whole as u32;
            held = Some(Held::Rate(next_token_in(rate, tokens)));
        }
    }
    (allowed, held)
}

/// How long until the bucket holding `tokens` has a whole one more.
pub(crate) fn next_token_in(rate: &RateLimit, tokens: f64) -> Duration {
    let missing = 1.0 - tokens.max(0.0).fract();
    let seconds = missing / rate.per_second.max(f64::MIN_POSITIVE);
    Duration::from_secs_f64(seconds.clamp(0.001, 3600.0))
}

/// How many candidates a per-key claim locks for `allowed` rows: a few times more, since
/// some may belong to keys at their limit.
pub(crate) fn candidates_for(allowed: u32) -> u32 {
    allowed.saturating_mul(4).clamp(16, 1_000)
}

/// Of `candidates` (id and key, in claim order), the ones to lease: at most `allowed`,
/// and per key no more than `k` together with the key's `running` live leases. Keys that
/// reached the limit are added to `full`.
pub(crate) fn pick_by_key<'c>(
    candidates: &'c [(String, Option<String>)],
    running: &HashMap<String, u64>,
    k: u32,
    allowed: u32,
    full: &mut Vec<String>,
) -> Vec<&'c str> {
    let mut taken: HashMap<&str, u64> = HashMap::new();
    let mut picked = Vec::new();
    for (id, key) in candidates {
        if picked.len() >= allowed as usize {
            break;
        }
        let Some(key) = key else {
            picked.push(id.as_str());
            continue;
        };
        let now =
            running.get(key).copied().unwrap_or(0) + taken.get(key.as_str()).copied().unwrap_or(0);
        if now >= u64::from(k) {
            if !full.contains(key) {
                full.push(key.clone());
            }
            continue;
        }
        *taken.entry(key.as_str()).or_default() += 1;
        picked.push(id.as_str());
    }
    picked
}

/// The keys of `candidates`, each once.
pub(crate) fn keys_of(candidates: &[(String, Option<String>)]) -> Vec<String> {
    let mut keys: Vec<String> = candidates.iter().filter_map(|(_, k)| k.clone()).collect();
    keys.sort();
    keys.dedup();
    keys
}

/// What the engines' tests of the hand-on share.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{LimitedClaim, LimitedClaimParams, LimitedTx, Places, QueueLimits};
    use crate::command::{CommandId, LeaseToken};
    use crate::engine::{ClaimParams, Lease, QueueOps, SetState, StateChange};

    /// The outcome "completed" of the row `id` leased under `token`.
    pub(crate) fn completed(id: &str, token: LeaseToken) -> SetState {
        SetState {
            lease: Lease {
                id: CommandId::stored(id.to_owned()),
                token,
            },
            change: StateChange::Completed,
        }
    }

    /// What a hand-on of `queue` stamping the rows `ids` under `token` reads (margin 10 s).
    pub(crate) async fn places(
        tx: &mut dyn LimitedTx,
        queue: &str,
        ids: &[String],
        token: LeaseToken,
    ) -> Option<Places> {
        let changes: Vec<SetState> = ids.iter().map(|id| completed(id, token)).collect();
        tx.places_to_hand_on(queue, &changes, Duration::from_secs(10))
            .await
            .unwrap()
    }

    /// A claim of queue `q` for at most `limit` rows with a lease of `lease_seconds` (a
    /// hand-on's margin is half of it), under `global_concurrency` alone.
    #[cfg_attr(not(feature = "driver-suite"), allow(dead_code))]
    fn limited_claim(
        limit: u32,
        lease_seconds: u64,
        global_concurrency: u32,
    ) -> (ClaimParams, QueueLimits) {
        let claim = ClaimParams {
            limit,
            lease: Duration::from_secs(lease_seconds),
            processing_delay: Duration::ZERO,
            token: LeaseToken::new(),
            types: None,
            queues: Some(Arc::from(vec!["q".to_owned()])),
            spread: false,
            skip_paused: false,
        };
        let limits = QueueLimits {
            global_concurrency: Some(global_concurrency),
            key_concurrency: None,
            rate: None,
        };
        (claim, limits)
    }

    /// The claim and limits of a hand-on in queue `q`: a 20 s lease (a margin of 10 s), at
    /// most 8 rows, `global_concurrency: 3`.
    #[cfg_attr(not(feature = "driver-suite"), allow(dead_code))]
    pub(crate) fn hand_on_claim() -> (ClaimParams, QueueLimits) {
        limited_claim(8, 20, 3)
    }

    /// [`Places`] as `places_to_hand_on` answers them.
    pub(crate) fn seen(live: u64, paused: bool) -> Option<Places> {
        Some(Places { live, paused })
    }

    /// The stalled hand-on's race: `r1` (in queue `q`, leased under `held_by` for 1.3 s
    /// more, its row held by another session) is handed on under `global_concurrency: 1`
    /// with a 2 s lease (margin 1 s); once it has lapsed a counting claim starts;
    /// `release` then lets the hand-on's stamp through. Returns both claims' answers.
    #[cfg_attr(not(feature = "driver-suite"), allow(dead_code))]
    pub(crate) async fn stalled_hand_on(
        driver: Arc<dyn QueueOps>,
        r1: &str,
        held_by: LeaseToken,
        release: impl std::future::Future<Output = ()>,
    ) -> (LimitedClaim, LimitedClaim) {
        let hand_on = spawn_claim(&driver, vec![completed(r1, held_by)], true);
        tokio::time::sleep(Duration::from_millis(1800)).await;
        let counting = spawn_claim(&driver, Vec::new(), false);
        tokio::time::sleep(Duration::from_millis(300)).await;
        release.await;
        let handed = hand_on.await.unwrap().unwrap();
        let counted = counting.await.unwrap().unwrap();
        (handed, counted)
    }

    /// A limited claim of queue `q` under `global_concurrency: 1` with a 2 s lease (a
    /// margin of 1 s) carrying `changes`, on a task of its own.
    #[cfg_attr(not(feature = "driver-suite"), allow(dead_code))]
    pub(crate) fn spawn_claim(
        driver: &Arc<dyn QueueOps>,
        changes: Vec<SetState>,
        hand_on: bool,
    ) -> tokio::task::JoinHandle<crate::Result<LimitedClaim>> {
        let driver = driver.clone();
        tokio::spawn(async move {
            let (claim, limits) = limited_claim(1, 2, 1);
            let params = LimitedClaimParams {
                claim: &claim,
                limits: &limits,
                changes: &changes,
                hand_on,
            };
            driver.command_claim_limited(&params).await
        })
    }

    /// The race of a lease that lapses while its hand-on waits for the queue's row: `r1`
    /// (in queue `q`, leased under `held_by` for 1.3 s more) is handed on under
    /// `global_concurrency: 1` with a 2 s lease (margin 1 s) while another claim holds
    /// the queue's row; `fill` (that claim) leases a due row in the lapsed place and lets
    /// the row go after 1.5 s. The hand-on's answer.
    #[cfg_attr(not(feature = "driver-suite"), allow(dead_code))]
    pub(crate) async fn hand_on_behind_a_count(
        driver: Arc<dyn QueueOps>,
        r1: &str,
        held_by: LeaseToken,
        fill: impl std::future::Future<Output = ()>,
    ) -> LimitedClaim {
        let hand_on = spawn_claim(&driver, vec![completed(r1, held_by)], true);
        fill.await;
        hand_on.await.unwrap().unwrap()
    }

    /// The lapsed race's outcome: the hand-on stamped and leased nothing (the counting
    /// claim had filled the place), and one lease (`live`) was live.
    #[cfg_attr(not(feature = "driver-suite"), allow(dead_code))]
    pub(crate) fn assert_lapsed_place_kept(handed: &LimitedClaim, live: i64) {
        assert_eq!(handed.stamped, 1);
        assert!(
            handed.rows.is_empty(),
            "the lapsed place was filled already"
        );
        assert_eq!(live, 1, "{live} live leases under global_concurrency 1");
    }

    /// The stalled race's outcome: the hand-on stamped, one of the two took the place, and
    /// no more than one lease (`live`) was live.
    #[cfg_attr(not(feature = "driver-suite"), allow(dead_code))]
    pub(crate) fn assert_one_place(handed: &LimitedClaim, counted: &LimitedClaim, live: i64) {
        assert_eq!(handed.stamped, 1);
        assert_eq!(
            handed.rows.len() + counted.rows.len(),
            1,
            "one of the two took the place"
        );
        assert!(live <= 1, "{live} live leases under global_concurrency 1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::command::{CommandId, LeaseToken};
    use crate::engine::{Lease, StateChange};

    /// The steps a limited claim asked of its engine, with what the engine answers.
    #[derive(Default)]
    struct Steps {
        places: Option<Places>,
        /// What the stamp reports (`None`: every change).
        stamps: Option<u64>,
        log: Vec<String>,
    }

    #[async_trait::async_trait]
    impl LimitedTx for Steps {
        async fn read_queue(&mut self, _: &str) -> Result<Option<QueueRow>> {
            self.log.push("lock".into());
            Ok(Some(QueueRow {
                paused: self.places.is_some_and(|p| p.paused),
                ..QueueRow::default()
            }))
        }
        async fn insert_queue(&mut self, _: &str) -> Result<()> {
            unreachable!("the queue's row exists")
        }
        async fn stamp(&mut self, changes: &[SetState]) -> Result<u64> {
            self.log.push(format!("stamp {}", changes.len()));
            Ok(self.stamps.unwrap_or(changes.len() as u64))
        }
        async fn running(&mut self, _: &str) -> Result<u64> {
            self.log.push("count".into());
            Ok(1)
        }
        async fn candidates(
            &mut self,
            _: &Candidates<'_>,
        ) -> Result<Vec<(String, Option<String>)>> {
            self.log.push("candidates".into());
            Ok(Vec::new())
        }
        async fn running_by_key(&mut self, _: &str, _: &[String]) -> Result<HashMap<String, u64>> {
            unreachable!("no candidates were found")
        }
        async fn lease(&mut self, _: &[&str], _: &ClaimParams) -> Result<Vec<ClaimedRow>> {
            unreachable!("no candidates were found")
        }
        async fn claim_free(&mut self, which: &Candidates<'_>) -> Result<Vec<ClaimedRow>> {
            self.log.push(format!("claim {}", which.limit));
            Ok(Vec::new())
        }
        async fn store_tokens(&mut self, _: &str, _: f64, _: f64) -> Result<()> {
            self.log.push("tokens".into());
            Ok(())
        }
        async fn places_to_hand_on(
            &mut self,
            _: &str,
            changes: &[SetState],
            margin: Duration,
        ) -> Result<Option<Places>> {
            assert_eq!(margin, Duration::from_secs(10), "half the 20 s lease");
            self.log.push(format!("places {}", changes.len()));
            Ok(self.places)
        }
    }

    /// The steps of one limited claim of 8 carrying `changes` outcomes.
    fn steps_of(limits: QueueLimits, changes: usize, mut engine: Steps) -> Vec<String> {
        let claim = ClaimParams {
            limit: 8,
            lease: Duration::from_secs(20),
            processing_delay: Duration::ZERO,
            token: LeaseToken::new(),
            types: None,
            queues: Some(Arc::from(vec!["q".to_owned()])),
            spread: false,
            skip_paused: false,
        };
        let changes: Vec<SetState> = (0..changes)
            .map(|_| SetState {
                lease: Lease {
                    id: CommandId::new(),
                    token: claim.token,
                },
                change: StateChange::Completed,
            })
            .collect();
        let params = LimitedClaimParams {
            claim: &claim,
            limits: &limits,
            changes: &changes,
            hand_on: true,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(claim_in(&mut engine, &params)).unwrap();
        engine.log
    }

    const THREE: QueueLimits = QueueLimits {
        global_concurrency: Some(3),
        key_concurrency: None,
        rate: None,
    };

    /// Outcomes of live leases hand their places on without the queue's lock or a count,
    /// taking no more places than they give back; anything else takes the lock.
    #[test]
    fn a_hand_on_takes_only_the_places_its_stamps_give_back() {
        let live = |live, paused| Steps {
            places: Some(Places { live, paused }),
            ..Steps::default()
        };
        assert_eq!(
            steps_of(THREE, 2, live(2, false)),
            ["places 2", "stamp 2", "claim 2"]
        );
        let locked = ["lock", "stamp 2", "count", "claim 2"];
        // One lease lapsed (or nearly): its place may be another claim's already.
        assert_eq!(
            steps_of(THREE, 2, live(1, false)),
            ["places 2"]
                .iter()
                .chain(&locked)
                .copied()
                .collect::<Vec<_>>()
        );
        // Paused: the lock reads it and claims nothing.
        assert_eq!(
            steps_of(THREE, 2, live(2, true)),
            ["places 2", "lock", "stamp 2"]
        );
        // An engine that hands on under the lock only.
        assert_eq!(
            steps_of(THREE, 2, Steps::default()),
            ["places 2"]
                .iter()
                .chain(&locked)
                .copied()
                .collect::<Vec<_>>()
        );
        // A row changed hands between the read and the stamp: nothing is claimed.
        let raced = Steps {
            stamps: Some(1),
            ..live(2, false)
        };
        assert_eq!(steps_of(THREE, 2, raced), ["places 2", "stamp 2"]);
        // No outcomes, or other limits: the lock.
        assert_eq!(
            steps_of(THREE, 0, live(0, false)),
            ["lock", "count", "claim 2"]
        );
        let rate = QueueLimits {
            rate: Some(FIFTY),
            ..THREE
        };
        assert_eq!(steps_of(rate, 2, live(2, false))[0], "lock");
        let keys = QueueLimits {
            global_concurrency: None,
            key_concurrency: Some(1),
            rate: None,
        };
        assert_eq!(steps_of(keys, 2, live(2, false))[0], "lock");
    }

    const FIFTY: RateLimit = RateLimit {
        per_second: 50.0,
        burst: 50.0,
    };

    #[test]
    fn a_bucket_refills_by_elapsed_time_up_to_its_capacity() {
        assert_eq!(refill(&FIFTY, None, None), 50.0);
        assert_eq!(refill(&FIFTY, Some(0.0), Some(0.1)), 5.0);
        assert_eq!(refill(&FIFTY, Some(10.0), Some(100.0)), 50.0);
        // Another claim read the clock later: nothing accrues, nothing is lost.
        assert_eq!(refill(&FIFTY, Some(3.0), Some(-0.5)), 3.0);
    }

    #[test]
    fn the_tightest_limit_decides_and_says_why() {
        let limits = QueueLimits {
            global_concurrency: Some(3),
            key_concurrency: None,
            rate: Some(FIFTY),
        };
        assert_eq!(
            allowed(&limits, 8, 1, Some(10.0)),
            (2, Some(Held::Concurrency))
        );
        assert_eq!(allowed(&limits, 2, 0, Some(10.0)), (2, None));
        assert_eq!(
            allowed(&limits, 8, 3, Some(10.0)),
            (0, Some(Held::Concurrency))
        );
        assert_eq!(allowed(&limits, 8, 5, Some(10.0)).0, 0);
        let (n, held) = allowed(&limits, 8, 0, Some(0.5));
        assert_eq!(n, 0);
        assert_eq!(held, Some(Held::Rate(Duration::from_millis(10))));
        assert_eq!(allowed(&limits, 8, 0, Some(1.9)).0, 1);
    }

    #[test]
    fn a_key_at_its_limit_is_skipped_and_the_rest_taken_in_order() {
        let rows = |list: &[(&str, Option<&str>)]| -> Vec<(String, Option<String>)> {
            list.iter()
                .map(|(id, k)| (id.to_string(), k.map(str::to_string)))
                .collect()
        };
        let candidates = rows(&[
            ("1", Some("a")),
            ("2", Some("a")),
            ("3", Some("b")),
            ("4", None),
            ("5", Some("c")),
        ]);
        let running = HashMap::from([("b".to_string(), 1)]);
        let mut full = Vec::new();
        let picked = pick_by_key(&candidates, &running, 1, 10, &mut full);
        assert_eq!(picked, ["1", "4", "5"]);
        assert_eq!(full, ["a", "b"]);
        let mut full = Vec::new();
        assert_eq!(
            pick_by_key(&candidates, &running, 2, 2, &mut full),
            ["1", "2"]
        );
        assert_eq!(keys_of(&candidates), ["a", "b", "c"]);
    }
}
