//! Leases this processor holds, and the renewer that keeps them.
//!
//! Every claimed row is registered here from the claim until its outcome is stamped:
//! while buffered, while its handler runs, and while its stamp waits in the completer.
//! The renewer extends them every `lease_seconds / 3` in one token-guarded statement, so a
//! command whose worker is alive is never claimed by another (a row whose stamp went out
//! within the stamp's deadline is left alone that round). A lease
//! about to lapse (the database is unreachable) has its execution killed at once, before
//! the lease can expire, so two executions of one command never overlap — unless a
//! process dies, when the lease lapses and the row runs again (at-least-once).
//!
//! A lease that is gone — an operator cancelled the row (`icq cancel`), or another claim
//! holds it — is found by the renewal or, for running handlers, by the check every
//! [`CHECK_EVERY`] (at once on PostgreSQL's cancel notification): the execution is asked
//! to stop (its job's cancellation fires, an exec handler's group gets SIGTERM, and it is
//! killed after the stop grace; at once when another claim holds the row), nothing is
//! stamped for it, and the reason is logged once ("cancelled by operator"). A row whose
//! outcome is already on its way to the database is never counted as lost: a renewal
//! that no longer finds it raced its stamp.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::health;
use crate::command::CommandId;
use crate::engine::{Backend, Lease, LeaseCheckManyParams, LeaseExtendManyParams};

/// One held lease.
struct Held {
    lease: Lease,
    /// What stops its execution.
    stopper: Stopper,
    /// When the lease lapses at the latest, by this process's clock: measured from
    /// before the statement that took or extended it was sent.
    expires: Instant,
    /// Its handler is running (not buffered, not finished).
    running: bool,
    /// The lease is gone (an operator cancelled the row, or another claim holds it): no
    /// stamp of this execution can land, so none is sent.
    lost: bool,
    /// The lease passed to another claim (not an operator's cancel): the dropped outcome
    /// counts as stale, like any outcome a lapsed lease makes stale.
    taken: bool,
    /// Its outcome is on its way to the database: a renewal that no longer finds the row
    /// under its token raced the stamp (or the stamp's guard counts it stale), so it is
    /// not a lost lease.
    finished: bool,
    /// When it finished (see [`Leases::to_renew`]).
    finished_at: Option<Instant>,
}

/// The two ways an execution is stopped.
#[derive(Clone, Default)]
pub(crate) struct Stopper {
    /// Asks the handler to stop: its [`crate::Job::cancellation`] fires (an exec
    /// handler's group gets SIGTERM) and it has [`crate::handler::STOP_GRACE`] to return
    /// before it is dropped. An operator's cancel, a lost lease, the end of the shutdown
    /// grace.
    pub(crate) stop: CancellationToken,
    /// Drops the handler at once (an exec handler's group is killed with SIGKILL): a
    /// lease about to lapse, a hard stop.
    pub(crate) kill: CancellationToken,
}

impl Stopper {
    /// Either was asked for.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stop.is_cancelled() || self.kill.is_cancelled()
    }
}

/// The leases held by one source's processor.
#[derive(Default)]
pub(crate) struct Leases {
    held: Mutex<HashMap<CommandId, Held>>,
    /// Signalled (to every waiter) when the last lease is forgotten: a producer draining
    /// `until_idle` waits for it before it counts what is left, instead of a polling
    /// interval.
    emptied: tokio::sync::Notify,
}

impl Leases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CommandId, Held>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a freshly claimed lease; returns what stops its execution.
    pub(crate) fn hold(&self, lease: &Lease, expires: Instant) -> Stopper {
        let stopper = Stopper::default();
        self.lock().insert(
            lease.id.clone(),
            Held {
                lease: lease.clone(),
                stopper: stopper.clone(),
                expires,
                running: false,
                lost: false,
                taken: false,
                finished: false,
                finished_at: None,
            },
        );
        stopper
    }

    /// Marks the handler of `lease` as running (`true`) or done (`false`): only running
    /// handlers are checked for operators' cancels.
    pub(crate) fn set_running(&self, lease: &Lease, running: bool) {
        if let Some(held) = self.lock().get_mut(&lease.id)
            && held.lease.token == lease.token
        {
            held.running = running;
        }
    }

    /// Marks `lease` as finished: its outcome goes to the outbox now, and a renewal that
    /// misses it from here on found it stamped, not lost.
    pub(crate) fn finished(&self, lease: &Lease) {
        if let Some(held) = self.lock().get_mut(&lease.id)
            && held.lease.token == lease.token
        {
            held.finished = true;
            held.finished_at = Some(Instant::now());
            held.running = false;
        }
    }

    /// True when `lease` is known to be gone (cancelled by an operator, or taken by
    /// another claim): a stamp for it would be dropped by the token guard.
    pub(crate) fn is_lost(&self, lease: &Lease) -> bool {
        self.lock()
            .get(&lease.id)
            .is_some_and(|held| held.lease.token == lease.token && held.lost)
    }

    /// Forgets leases whose outcome was stamped (or given up on).
    pub(crate) fn forget<'a>(&self, leases: impl Iterator<Item = &'a Lease>) {
        let mut held = self.lock();
        let mut removed = false;
        for lease in leases {
            if held
                .get(&lease.id)
                .is_some_and(|h| h.lease.token == lease.token)
            {
                held.remove(&lease.id);
                removed = true;
            }
        }
        if removed && held.is_empty() {
            self.emptied.notify_waiters();
        }
    }

    /// Resolves once the last lease is forgotten after this call ([`Notified::enable`]
    /// the future before looking at [`Leases::len`], so an emptying in between is not
    /// missed).
    ///
    /// [`Notified::enable`]: tokio::sync::futures::Notified::enable
    pub(crate) fn emptied(&self) -> tokio::sync::futures::Notified<'_> {
        self.emptied.notified()
    }

    /// How many leases are held.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Asks every execution to stop (the end of the shutdown grace): each handler's
    /// cancellation fires and it has the stop grace to return.
    pub(crate) fn stop_all(&self) {
        for held in self.lock().values() {
            held.stopper.stop.cancel();
        }
    }

    /// Stops the execution of `lease` at once.
    fn kill(&self, lease: &Lease) {
        if let Some(held) = self.lock().get_mut(&lease.id)
            && held.lease.token == lease.token
        {
            held.taken = true;
            held.stopper.kill.cancel();
        }
    }

    /// Whether `lease` was lost to another claim (see [`Leases::is_lost`]).
    pub(crate) fn is_taken(&self, lease: &Lease) -> bool {
        self.lock()
            .get(&lease.id)
            .is_some_and(|held| held.lease.token == lease.token && held.taken)
    }

    /// Stops every execution at once (a hard stop).
    pub(crate) fn kill_all(&self) {
        for held in self.lock().values() {
            held.stopper.kill.cancel();
        }
    }

    /// The leases a renewal at `now` extends to `lease`: all but those whose outcome went
    /// out within a stamp's own deadline (a tenth of the lease, at least 1 s). A stamp
    /// lands in milliseconds; renewing its row meanwhile only makes the two statements
    /// wait on each other's row locks (and, batched in different orders, deadlock). At
    /// most one round, a third of the lease apart, skips a row; one whose stamp is still
    /// failing after that is renewed like a running one.
    fn to_renew(&self, now: Instant, lease: Duration) -> Vec<Lease> {
        let in_flight = health::answer_deadline(lease);
        self.lock()
            .values()
            .filter(|h| {
                h.finished_at
                    .is_none_or(|at| now.saturating_duration_since(at) >= in_flight)
            })
            .map(|h| h.lease.clone())
            .collect()
    }

    /// The leases of running handlers.
    fn running(&self) -> Vec<Lease> {
        self.lock()
            .values()
            .filter(|h| h.running && !h.lost)
            .map(|h| h.lease.clone())
            .collect()
    }

    /// Marks the leases of `asked` missing from `kept` as lost and asks their executions
    /// to stop; returns the ones newly lost whose handler was running (`only_running`) or
    /// all of them.
    fn lose_missing(&self, asked: &[Lease], kept: &[Lease], only_running: bool) -> Vec<Lease> {
        let kept: std::collections::HashSet<&Lease> = kept.iter().collect();
        let mut held = self.lock();
        let mut lost = Vec::new();
        for asked in asked {
            if kept.contains(asked) {
                continue;
            }
            let Some(entry) = held.get_mut(&asked.id) else {
                continue; // stamped meanwhile
            };
            if entry.lease.token != asked.token || entry.lost || entry.finished {
                // Its outcome was stamped while the renewal ran: not lost.
                continue;
            }
            if only_running && !entry.running {
                // Finished meanwhile: its stamp (not the operator) ended the lease.
                continue;
            }
            entry.lost = true;
            entry.stopper.stop.cancel();
            lost.push(asked.clone());
        }
        lost
    }

    /// Records the outcome of one renewal round started at `started`; returns the leases
    /// newly found lost.
    fn renewed(
        &self,
        asked: &[Lease],
        kept: &[Lease],
        started: Instant,
        lease: Duration,
    ) -> Vec<Lease> {
        {
            let keep: std::collections::HashSet<&Lease> = kept.iter().collect();
            let mut held = self.lock();
            for lease_asked in asked.iter().filter(|l| keep.contains(l)) {
                if let Some(entry) = held.get_mut(&lease_asked.id)
                    && entry.lease.token == lease_asked.token
                {
                    entry.expires = started + lease;
                }
            }
        }
        // Another claim holds the others, or an operator cancelled them (or they were
        // stamped in between, in which case stopping a finished execution does nothing).
        self.lose_missing(asked, kept, false)
    }

    /// Kills executions whose lease would lapse within `margin`.
    fn cancel_lapsing(&self, margin: Duration) -> usize {
        let now = Instant::now();
        let mut cancelled = 0;
        for held in self.lock().values() {
            if held.expires <= now + margin && !held.stopper.kill.is_cancelled() {
                held.stopper.kill.cancel();
                cancelled += 1;
            }
        }
        cancelled
    }
}

/// How often the leases of running handlers are checked for operators' cancels (and at
/// once on a PostgreSQL cancel notification).
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Checks the leases of running handlers every [`CHECK_EVERY`], and at once when
/// `cancelled` is signalled (a PostgreSQL `icq_cancel_<table>` notification), with one
/// read ([`crate::engine::QueueOps::lease_check_many`]); the handlers whose lease is gone
/// are asked to stop, and each is logged once: "cancelled by operator" when the row was
/// dead-lettered, else as a lease lost to another claim.
pub(crate) async fn check_loop(
    source: Arc<str>,
    backend: Arc<dyn Backend>,
    leases: Arc<Leases>,
    lease: Duration,
    cancelled: Arc<tokio::sync::Notify>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            _ = cancelled.notified() => {}
            _ = stop.cancelled() => return,
        }
        let asked = leases.running();
        if asked.is_empty() {
            continue;
        }
        for chunk in asked.chunks(EXTEND_CHUNK) {
            let params = LeaseCheckManyParams {
                leases: chunk.to_vec(),
            };
            let checking = health::deadline(
                backend.as_ref(),
                health::answer_deadline(lease),
                "checking leases",
                backend.lease_check_many(&params),
            );
            let kept = tokio::select! {
                kept = checking => kept,
                _ = stop.cancelled() => return,
            };
            let kept = match kept {
                Ok(kept) => kept,
                Err(err) => {
                    // The renewal notices real trouble; this is only the fast path.
                    tracing::debug!(source = %source, error = %err, "cannot check leases");
                    break;
                }
            };
            let lost = leases.lose_missing(chunk, &kept, true);
            explain_all_lost(&source, backend.as_ref(), &leases, &lost).await;
        }
    }
}

/// The most lost leases explained one by one in a round; the rest are counted.
const EXPLAINED: usize = 5;

/// Logs why each lease in `lost` is gone (the first [`EXPLAINED`]; then a count).
async fn explain_all_lost(source: &str, backend: &dyn Backend, leases: &Leases, lost: &[Lease]) {
    for lease in lost.iter().take(EXPLAINED) {
        explain_lost(source, backend, leases, lease).await;
    }
    if lost.len() > EXPLAINED {
        tracing::warn!(
            source,
            more = lost.len() - EXPLAINED,
            "more leases were lost (cancelled by an operator or taken by another claim); their executions were stopped"
        );
    }
}

/// Logs, once, why a running command's lease is gone. A row still pending under another
/// claim's token runs elsewhere now: its execution here is killed at once rather than
/// given the stop grace.
async fn explain_lost(source: &str, backend: &dyn Backend, leases: &Leases, lost: &Lease) {
    let params = crate::engine::CommandGetParams { id: &lost.id };
    // Bounded like every processor call: a hung read must not hold up the renewals.
    let limit = health::answer_deadline(Duration::from_secs(10));
    let reading = health::deadline(
        backend,
        limit,
        "reading a lost lease's row",
        backend.command_get(&params),
    );
    match reading.await {
        Ok(Some(row)) if row.dead_lettered_at.is_some() => {
            let reason = row.last_error.as_deref().unwrap_or("");
            tracing::info!(source, id = %lost.id, reason = %crate::redact::bounded(reason, 200).escape_debug(), "cancelled by operator: stopping its handler");
        }
        Ok(Some(row)) if row.processed_at.is_some() => {}
        Ok(None) => {
            tracing::info!(source, id = %lost.id, "the running command was deleted: stopping its handler");
        }
        Ok(Some(_)) => {
            leases.kill(lost);
            tracing::warn!(source, id = %lost.id, "the running command's lease passed to another claim: stopping its handler");
        }
        Err(err) => {
            tracing::warn!(source, id = %lost.id, error = %err, "the running command's lease is gone (cancelled by an operator or taken by another claim): stopping its handler");
        }
    }
}

/// Most leases extended in one statement.
const EXTEND_CHUNK: usize = 1000;

/// How often leases are extended: a third of the lease, so two renewals can fail before
/// one lapses.
pub(crate) fn renew_every(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(50))
}

/// Extends every held lease every [`renew_every`], and cancels executions whose lease is
/// lost or about to lapse, until `stop` is cancelled.
pub(crate) async fn renew_loop(
    source: Arc<str>,
    backend: Arc<dyn Backend>,
    leases: Arc<Leases>,
    lease: Duration,
    stop: CancellationToken,
    trouble: Arc<health::Trouble>,
    until_idle: bool,
) {
    let every = renew_every(lease);
    let mut health = health::Health::new(source.clone(), "lease renewal", until_idle);
    // Cancel with room to spare: the handler's kill and the release need a moment.
    let margin = (lease / 10).min(Duration::from_secs(2));
    // A quarter of the renewal period, so a renewal is at most 1.25 periods after the
    // last and a 2 s lease has over a second of slack for a stalled process or server.
    let tick = (every / 4).clamp(Duration::from_millis(10), Duration::from_millis(500));
    let mut next = Instant::now() + every;
    let check_lapsing = || {
        let cancelled = leases.cancel_lapsing(margin);
        if cancelled > 0 {
            tracing::warn!(source = %source, cancelled, "leases could not be extended in time; their executions were stopped so no other worker runs them alongside");
        }
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.cancelled() => return,
        }
        if Instant::now() >= next {
            next = Instant::now() + every;
            let asked = leases.to_renew(Instant::now(), lease);
            for chunk in asked.chunks(EXTEND_CHUNK) {
                let started = Instant::now();
                // A slow or hung statement must not stop the lapse check: an execution
                // whose lease runs out while we wait is cancelled all the same.
                let params = LeaseExtendManyParams {
                    leases: chunk.to_vec(),
                    lease,
                };
                let extend = health::deadline(
                    backend.as_ref(),
                    health::call_deadline(backend.as_ref(), lease),
                    "extending leases",
                    backend.lease_extend_many(&params),
                );
                tokio::pin!(extend);
                let outcome = loop {
                    tokio::select! {
                        outcome = &mut extend => break outcome,
                        _ = tokio::time::sleep(tick) => check_lapsing(),
                        _ = stop.cancelled() => return,
                    }
                };
                match outcome {
                    Ok(kept) => {
                        health.succeeded(true);
                        if kept.len() < chunk.len() {
                            tracing::debug!(source = %source, lost = chunk.len() - kept.len(), "leases not extended");
                        }
                        let lost = leases.renewed(chunk, &kept, started, lease);
                        explain_all_lost(&source, backend.as_ref(), &leases, &lost).await;
                    }
                    Err(err) => {
                        // Logged by `health`; one that cannot heal stops the claims.
                        trouble.failed(&err);
                        if let health::Next::GiveUp(err) = health.failed(err) {
                            trouble.give_up(err);
                        }
                        next = Instant::now() + every.min(Duration::from_secs(1));
                        break;
                    }
                }
            }
        }
        check_lapsing();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::LeaseToken;

    fn lease() -> Lease {
        Lease {
            id: CommandId::new(),
            token: LeaseToken::owned_by(uuid::Uuid::new_v4()),
        }
    }

    /// A renewal leaves a row alone while its stamp is in flight (within the stamp's
    /// deadline, a tenth of the lease); a row whose stamp is still pending after that is
    /// renewed like a running one.
    #[test]
    fn a_renewal_skips_rows_whose_stamp_is_in_flight() {
        let leases = Leases::default();
        let now = Instant::now();
        let lease_time = Duration::from_secs(30);
        let (running, stamping, buffered) = (lease(), lease(), lease());
        leases.hold(&running, now + lease_time);
        leases.set_running(&running, true);
        leases.hold(&stamping, now + lease_time);
        leases.set_running(&stamping, true);
        leases.finished(&stamping);
        leases.hold(&buffered, now + lease_time);
        let sorted = |mut leases: Vec<Lease>| {
            leases.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
            leases
        };
        assert_eq!(
            sorted(leases.to_renew(Instant::now(), lease_time)),
            sorted(vec![running.clone(), buffered.clone()])
        );
        let stuck = Instant::now() + Duration::from_secs(3);
        assert_eq!(
            sorted(leases.to_renew(stuck, lease_time)),
            sorted(vec![running, stamping, buffered])
        );
    }

    /// A renewal that raced a stamp finds the stamped rows gone from under their token:
    /// those are finished, not lost, and nothing is stopped or reported.
    #[test]
    fn a_renewal_that_misses_rows_stamped_meanwhile_loses_no_lease() {
        let leases = Leases::default();
        let later = Instant::now() + Duration::from_secs(30);
        let stamped: Vec<Lease> = (0..8).map(|_| lease()).collect();
        let cancelled = lease();
        let mut stoppers = Vec::new();
        for held in stamped.iter().chain([&cancelled]) {
            stoppers.push(leases.hold(held, later));
            leases.set_running(held, true);
        }
        // The renewal takes its snapshot; the handlers finish and their outcomes go out.
        let asked = leases.to_renew(Instant::now(), Duration::from_secs(30));
        for done in &stamped {
            leases.finished(done);
        }
        // The stamps commit before the renewal's statement: it keeps none of them.
        let lost = leases.renewed(&asked, &[], Instant::now(), Duration::from_secs(30));
        assert_eq!(
            lost,
            vec![cancelled.clone()],
            "only the cancelled row is lost"
        );
        assert!(stamped.iter().all(|l| !leases.is_lost(l)));
        assert_eq!(stoppers.iter().filter(|s| s.is_stopped()).count(), 1);
    }
}
