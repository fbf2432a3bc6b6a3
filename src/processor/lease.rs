//! Leases this processor holds, and the renewer that keeps them.
//!
//! Every claimed row is registered here from the claim until its outcome is stamped:
//! while buffered, while its handler runs, and while its stamp waits in the completer.
//! The renewer extends all of them every `lease_seconds / 3` in one token-guarded
//! statement, so a command whose worker is alive is never claimed by another. A lease
//! that could not be extended is either lost (another claim holds the row now) or about
//! to lapse (the database is unreachable): either way the execution is cancelled before
//! the lease can expire, so two executions of one command never overlap — unless a
//! process dies, when the lease lapses and the row runs again (at-least-once).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::health;
use crate::command::CommandId;
use crate::engine::{Backend, Lease, LeaseExtendManyParams};

/// One held lease.
struct Held {
    lease: Lease,
    /// Cancelled when the lease is lost or about to lapse, or at the end of the grace.
    cancel: CancellationToken,
    /// When the lease lapses at the latest, by this process's clock: measured from
    /// before the statement that took or extended it was sent.
    expires: Instant,
}

/// The leases held by one source's processor.
#[derive(Default)]
pub(crate) struct Leases {
    held: Mutex<HashMap<CommandId, Held>>,
}

impl Leases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CommandId, Held>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a freshly claimed lease; returns the token that cancels its execution.
    pub(crate) fn hold(&self, lease: &Lease, expires: Instant) -> CancellationToken {
        let cancel = CancellationToken::new();
        self.lock().insert(
            lease.id.clone(),
            Held {
                lease: lease.clone(),
                cancel: cancel.clone(),
                expires,
            },
        );
        cancel
    }

    /// Forgets leases whose outcome was stamped (or given up on).
    pub(crate) fn forget<'a>(&self, leases: impl Iterator<Item = &'a Lease>) {
        let mut held = self.lock();
        for lease in leases {
            if held
                .get(&lease.id)
                .is_some_and(|h| h.lease.token == lease.token)
            {
                held.remove(&lease.id);
            }
        }
    }

    /// How many leases are held.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Cancels every execution (the end of the shutdown grace).
    pub(crate) fn cancel_all(&self) {
        for held in self.lock().values() {
            held.cancel.cancel();
        }
    }

    fn snapshot(&self) -> Vec<Lease> {
        self.lock().values().map(|h| h.lease.clone()).collect()
    }

    /// Records the outcome of one renewal round started at `started`.
    fn renewed(&self, asked: &[Lease], kept: &[Lease], started: Instant, lease: Duration) {
        let kept: std::collections::HashSet<&Lease> = kept.iter().collect();
        let mut held = self.lock();
        for lease_asked in asked {
            let Some(entry) = held.get_mut(&lease_asked.id) else {
                continue; // stamped meanwhile
            };
            if entry.lease.token != lease_asked.token {
                continue;
            }
            if kept.contains(lease_asked) {
                entry.expires = started + lease;
            } else {
                // Another claim holds the row (or it was stamped in between, in which case
                // cancelling a finished execution does nothing).
                entry.cancel.cancel();
            }
        }
    }

    /// Cancels executions whose lease would lapse within `margin`.
    fn cancel_lapsing(&self, margin: Duration) -> usize {
        let now = Instant::now();
        let mut cancelled = 0;
        for held in self.lock().values() {
            if held.expires <= now + margin && !held.cancel.is_cancelled() {
                held.cancel.cancel();
                cancelled += 1;
            }
        }
        cancelled
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
) {
    let every = renew_every(lease);
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
            let asked = leases.snapshot();
            for chunk in asked.chunks(EXTEND_CHUNK) {
                let started = Instant::now();
                // A slow or hung statement must not stop the lapse check: an execution
                // whose lease runs out while we wait is cancelled all the same.
                let params = LeaseExtendManyParams {
                    leases: chunk.to_vec(),
                    lease,
                };
                let extend = health::deadline(
                    health::call_deadline(lease),
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
                        if kept.len() < chunk.len() {
                            tracing::debug!(source = %source, lost = chunk.len() - kept.len(), "leases not extended");
                        }
                        leases.renewed(chunk, &kept, started, lease);
                    }
                    Err(err) => {
                        tracing::warn!(source = %source, error = %err, "could not extend leases; retrying");
                        next = Instant::now() + every.min(Duration::from_secs(1));
                        break;
                    }
                }
            }
        }
        check_lapsing();
    }
}
