//! The idle poll of a source that lists queues: one claim covers every lane whose last
//! claim came back empty, so a thousand idle queues cost one statement per polling
//! interval (or per wake-up), not one each.
//!
//! A lane whose claim found nothing registers here and stops polling on its own. The
//! poller claims, across the idle lanes' queues, up to one row per idle lane (at most a
//! batch); each row goes into its lane's buffer, and that lane wakes and claims its
//! queue's backlog on its own until a claim comes back empty again. Wake-ups (an
//! in-process schedule, a PostgreSQL NOTIFY) reach the poller, not every lane. Used by a
//! long-running worker; `--until-idle` drains lane by lane.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Shared, health, producer};
use crate::command::LeaseToken;
use crate::engine::ClaimParams;

/// Which lanes are idle, and how to wake each.
pub(crate) struct IdleLanes {
    idle: std::sync::Mutex<Vec<bool>>,
    /// Each lane's wake-up.
    wakes: Vec<Arc<Notify>>,
    /// Signalled when a lane turns idle.
    turned_idle: Notify,
    /// Lanes that never turn idle (a queue with fleet-wide limits is claimed only by its
    /// own lane): each wake-up is passed on to them.
    always: Vec<usize>,
}

impl IdleLanes {
    pub(crate) fn new(wakes: Vec<Arc<Notify>>, always: Vec<usize>) -> IdleLanes {
        IdleLanes {
            idle: std::sync::Mutex::new(vec![false; wakes.len()]),
            wakes,
            turned_idle: Notify::new(),
            always,
        }
    }

    /// Passes a wake-up on to the lanes that claim on their own.
    fn wake_always(&self) {
        for index in &self.always {
            if let Some(wake) = self.wakes.get(*index) {
                wake.notify_one();
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<bool>> {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Lane `index` found nothing: the poller claims for it from now on.
    pub(crate) fn set_idle(&self, index: usize) {
        if let Some(idle) = self.lock().get_mut(index) {
            *idle = true;
        }
        self.turned_idle.notify_one();
    }

    fn idle(&self) -> Vec<usize> {
        self.lock()
            .iter()
            .enumerate()
            .filter_map(|(i, idle)| idle.then_some(i))
            .collect()
    }

    /// Lane `index` has rows again: it claims on its own.
    fn wake(&self, index: usize) {
        if let Some(idle) = self.lock().get_mut(index) {
            *idle = false;
        }
        if let Some(wake) = self.wakes.get(index) {
            wake.notify_one();
        }
    }
}

/// Claims for the idle lanes of `lanes` at every wake-up and polling interval until
/// `shutdown`.
pub(crate) async fn poll(
    lanes: Vec<Arc<Shared>>,
    idle: Arc<IdleLanes>,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let Some(first) = lanes.first().cloned() else {
        return;
    };
    let source = &first.source;
    let settings = &source.settings;
    let poll = settings.polling_interval();
    let batch = settings.batch_size.max(1) as usize;
    let by_queue: HashMap<String, usize> = lanes
        .iter()
        .enumerate()
        .filter_map(|(i, lane)| {
            let queues = lane.lane.queues.as_deref()?;
            Some(queues.iter().map(move |q| (q.clone(), i)))
        })
        .flatten()
        .collect();
    let mut health = health::Health::new(source.name.clone(), "claim", false);
    let mut again = false;
    loop {
        if !again {
            tokio::select! {
                _ = wake.notified() => idle.wake_always(),
                _ = tokio::time::sleep(poll) => {}
                _ = shutdown.cancelled() => return,
            }
        }
        again = false;
        if let Some(until) = first.trouble.holds_claims_until() {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = shutdown.cancelled() => return,
            }
            continue;
        }
        let waiting = idle.idle();
        if waiting.is_empty() {
            tokio::select! {
                _ = idle.turned_idle.notified() => {}
                _ = shutdown.cancelled() => return,
            }
            continue;
        }
        let queues: Vec<String> = waiting
            .iter()
            .filter_map(|i| lanes[*i].lane.queues.as_deref())
            .flatten()
            .cloned()
            .collect();
        let limit = waiting.len().min(batch);
        let params = ClaimParams {
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            lease: settings.lease(),
            processing_delay: Duration::from_secs(settings.processing_delay_seconds),
            token: LeaseToken::owned_by(first.owner),
            types: first.types.clone(),
            queues: Some(queues.into()),
            spread: false,
            skip_paused: first.source.pauses.any(),
        };
        let sent = Instant::now();
        let expires = sent + params.lease;
        let claiming = health::deadline(
            source.backend.as_ref(),
            health::call_deadline(source.backend.as_ref(), params.lease),
            "claiming",
            source.backend.command_claim(&params),
        );
        // Shutdown waits for the claim (its rows are leased, and buffered they are
        // released by the teardown), for a bounded time: one that cannot answer leases
        // nothing.
        let abandon = async {
            shutdown.cancelled().await;
            tokio::time::sleep(super::HARD_STOP_WRITES).await;
        };
        let claimed = tokio::select! {
            claimed = claiming => claimed,
            () = abandon => return,
        };
        match claimed {
            Ok(rows) => {
                health.succeeded(!rows.is_empty());
                source.stats.claimed(rows.len() as u64);
                again = rows.len() >= limit;
                let mut routed: HashMap<usize, Vec<_>> = HashMap::new();
                for row in rows {
                    let lane = by_queue.get(row.row.queue.as_str()).copied().unwrap_or(0);
                    routed.entry(lane).or_default().push((row, expires));
                }
                for (lane, rows) in routed {
                    producer::buffer(&lanes[lane], rows);
                    idle.wake(lane);
                }
            }
            Err(err) => {
                first.trouble.failed(&err);
                if let health::Next::RetryAfter(pause) = health.failed(err) {
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = shutdown.cancelled() => return,
                    }
                }
            }
        }
    }
}
