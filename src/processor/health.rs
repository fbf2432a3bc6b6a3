//! Database health for the processor's roles: a deadline on every database call, and what
//! to do after one failed.
//!
//! - [`deadline`] bounds a call (claim, stamp, lease renewal, sweep, activity count) by
//!   [`call_deadline`]: about a tenth of the lease, 1 to 30 s (plus, on SQLite, the busy
//!   timeout a statement waits for the write lock before it fails). A connection that stopped
//!   answering (a half-open socket behind a stalled proxy or NAT, where neither TCP keepalive
//!   nor a server-side statement timeout helps) is abandoned within that time and the next
//!   call runs over a new one (the engine's pools close a released connection that does not
//!   answer a ping promptly, so an abandoned one is never handed out again half-read).
//! - [`Health`] decides, per role, how long to wait before the next try from the error's
//!   [`Healing`]: errors that heal are retried with a jittered backoff capped at
//!   [`RETRY_CAP`], so processing resumes within a few seconds of a server's return;
//!   errors that do not heal fail `--until-idle` after [`UNHEALABLE_GRACE`] with
//!   [`Error::CannotHeal`] (exit 1, `kind: database`, the server's message and a hint), and
//!   are logged once a minute by a long-running worker, which keeps retrying them (someone
//!   may grant the privilege) and keeps its other sources running.

use std::future::Future;
use std::time::Duration;

use rand::{Rng, RngExt};
use tokio::time::Instant;

use crate::engine::Backend;
use crate::error::{Error, Healing, Result};

/// The longest pause between two tries of an error that heals. Low: a try that finds
/// the server still gone costs little (the pool's own connect retries run inside the
/// call's deadline), and processing must resume within a few seconds of its return.
pub(crate) const RETRY_CAP: Duration = Duration::from_secs(1);

/// The first pause after a failure.
const FIRST_PAUSE: Duration = Duration::from_millis(100);

/// The longest pause between two tries of an error that does not heal, in a long-running
/// worker (so a fix, e.g. a `GRANT`, is picked up within this time).
const UNHEALABLE_CAP: Duration = Duration::from_secs(10);

/// For how long `--until-idle` retries an error that does not heal before it fails (it
/// may still be a fluke, e.g. a table being recreated by a migration).
pub(crate) const UNHEALABLE_GRACE: Duration = Duration::from_secs(3);

/// How often a long-running worker logs an error that does not heal.
const UNHEALABLE_LOG_EVERY: Duration = Duration::from_secs(60);

/// How often a worker logs an error that heals while it persists.
const RETRY_LOG_EVERY: Duration = Duration::from_secs(10);

/// The deadline of one database write of the processor (a claim, stamp, lease renewal)
/// on `backend` for a source whose lease is `lease` ([`deadline_for`]).
pub(crate) fn call_deadline(backend: &dyn Backend, lease: Duration) -> Duration {
    deadline_for(backend.local_lock_wait(), lease)
}

/// How long the processor waits for a server's answer, with no lock wait on top: the
/// deadline of its reads (a count, a lease check, a row's state), which never wait for
/// SQLite's write lock, and how long a stop waits for a claim already sent.
pub(crate) fn answer_deadline(lease: Duration) -> Duration {
    deadline_for(None, lease)
}

/// A tenth of the lease, at least 1 s and at most 30 s; where statements wait for a lock
/// inside the client (`local_lock_wait`, SQLite's busy timeout), that wait on top: such a
/// statement fails on its own once the wait is over, and abandoning it sooner would only
/// queue its retry behind it.
fn deadline_for(local_lock_wait: Option<Duration>, lease: Duration) -> Duration {
    let answer = (lease / 10).clamp(Duration::from_secs(1), Duration::from_secs(30));
    answer + local_lock_wait.unwrap_or_default()
}

/// Awaits `call`, a database call of `backend` described by `what`; after `limit` it is
/// abandoned (its connection goes back to the pool, which closes it if it does not answer),
/// fails as a lost connection, and tells the backend, which may be following a failover:
/// a pool that cannot reach its server retries the connect inside the call and never
/// returns an error of its own, so the deadline is the only sign of the lost server.
pub(crate) async fn deadline<T>(
    backend: &dyn Backend,
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    abandon_after(limit, what, call, || backend.answer_lost()).await
}

/// [`deadline`] with `lost` run when the call is abandoned.
async fn abandon_after<T>(
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T>>,
    lost: impl FnOnce(),
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => {
            lost();
            Err(Error::Database {
                context: format!(
                    "{what}: no answer from the database within {} ms; the connection was \
                         abandoned and the next try uses a new one",
                    limit.as_millis()
                ),
                cause: sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the database did not answer in time",
                )),
            })
        }
    }
}

/// Writes of outcomes and leases that fail with an error that cannot heal (permission
/// denied, a missing column, a trigger or constraint refusing the stamp, an illegal
/// collation mix) make a source unhealthy: its producers stop claiming, since every
/// command they would start could not have its outcome written and would run again when
/// its lease lapsed. A long-running worker looks again [`UNHEALABLE_CAP`] after the last
/// such failure (someone may have fixed the cause); `--until-idle` fails with the error.
#[derive(Default)]
pub(crate) struct Trouble {
    state: std::sync::Mutex<TroubleState>,
    /// Signalled when the source turns unhealthy or the error to fail with is set.
    changed: tokio::sync::Notify,
}

#[derive(Default)]
struct TroubleState {
    /// When a write last failed with an error that cannot heal.
    last: Option<Instant>,
    /// `--until-idle`: the error the source fails with.
    fatal: Option<Error>,
    /// The fatal error was set (and may have been taken).
    gave_up: bool,
}

impl Trouble {
    fn lock(&self) -> std::sync::MutexGuard<'_, TroubleState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A write failed with `err`: an error that cannot heal holds the claims.
    pub(crate) fn failed(&self, err: &Error) {
        if err.healing().heals() {
            return;
        }
        self.lock().last = Some(Instant::now());
        self.changed.notify_waiters();
    }

    /// `--until-idle` gave up on a write: the source fails with `err`.
    pub(crate) fn give_up(&self, err: Error) {
        let mut state = self.lock();
        state.last = Some(Instant::now());
        if !state.gave_up {
            state.gave_up = true;
            state.fatal = Some(err);
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// A write succeeded: the claims may go on.
    pub(crate) fn succeeded(&self) {
        let mut state = self.lock();
        if !state.gave_up {
            state.last = None;
        }
    }

    /// Whether a write already gave up (the next writes try once, not for a lease).
    pub(crate) fn gave_up(&self) -> bool {
        self.lock().gave_up
    }

    /// Until when claims wait (`None`: the source is healthy).
    pub(crate) fn holds_claims_until(&self) -> Option<Instant> {
        let state = self.lock();
        if state.gave_up {
            return Some(Instant::now() + UNHEALABLE_CAP);
        }
        state
            .last
            .map(|at| at + UNHEALABLE_CAP)
            .filter(|until| *until > Instant::now())
    }

    /// The error the source fails with, once (to the first producer that asks).
    pub(crate) fn take_fatal(&self) -> Option<Error> {
        self.lock().fatal.take()
    }

    /// Resolves at the next change ([`Notified::enable`] it before looking).
    ///
    /// [`Notified::enable`]: tokio::sync::futures::Notified::enable
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}

/// What a role does after a failed database call: wait and retry, or give up.
pub(crate) enum Next {
    /// Try again after this pause.
    RetryAfter(Duration),
    /// `--until-idle` and the error does not heal: fail with this error.
    GiveUp(Error),
}

/// The failure state of one role of one source (e.g. the producer's claims).
pub(crate) struct Health {
    source: std::sync::Arc<str>,
    /// What the role does, for the logs (`claim`, `stamp`, ...).
    what: &'static str,
    until_idle: bool,
    /// When the current run of failures started, and how many tries it holds.
    failing: Option<(Instant, u32)>,
    /// When the current run of failures was last logged.
    logged: Option<Instant>,
    /// Failures in a row on a connection the server had dropped.
    dropped: u32,
    /// When the last pause ends (or ended).
    paused_until: Option<Instant>,
    /// When the last failure was seen.
    last_failure: Option<Instant>,
    /// Races lost in a row ([`Error::lost_race`]).
    races: u32,
}

/// The first pause after a lost race: another replica's transaction won, so the next try
/// is soon, spread out by jitter so that the two do not meet again at once.
const FIRST_RACE_PAUSE: Duration = Duration::from_millis(10);

/// The longest pause after races lost in a row.
const RACE_PAUSE_CAP: Duration = Duration::from_millis(500);

/// Counts a lost race of `role` on `source` (the `lost_races_total` series).
pub(crate) fn count_lost_race(source: &str, role: &'static str) {
    metrics::counter!(
        "icq_internal_commands_lost_races_total",
        "source" => source.to_string(),
        "role" => role
    )
    .increment(1);
}

/// A failure handled within this time after a pause ended was waiting during the pause.
const ALREADY_WAITED: Duration = Duration::from_millis(20);

/// How many failures in a row on dropped connections are retried after the first pause.
const DROPPED_RETRIES_AT_ONCE: u32 = 16;

/// True when `err` says the connection was there but is gone (reset, closed, broken):
/// a pooled connection the server or a proxy dropped, as opposed to one that could not be
/// opened or did not answer.
fn is_dropped_connection(err: &Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        err,
        Error::Database { cause: sqlx::Error::Io(io), .. }
            if matches!(
                io.kind(),
                ErrorKind::BrokenPipe
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::UnexpectedEof
                    | ErrorKind::NotConnected
            )
    )
}

impl Health {
    /// The state of a role that has not failed yet.
    pub(crate) fn new(source: std::sync::Arc<str>, what: &'static str, until_idle: bool) -> Self {
        Health {
            source,
            what,
            until_idle,
            failing: None,
            logged: None,
            dropped: 0,
            paused_until: None,
            last_failure: None,
            races: 0,
        }
    }

    /// A call succeeded; `worked` says whether it proves the role's calls work (a claim
    /// that returned rows) or may have succeeded only for lack of work (an empty claim:
    /// on MariaDB/MySQL a claim that finds no row to lock never reaches the `UPDATE` a
    /// read-only user is denied, while the claim beside it that locked the row fails).
    /// A proof, or an empty success [`UNHEALABLE_GRACE`] after the last failure, ends the
    /// run of failures: the next one starts from the first pause again.
    pub(crate) fn succeeded(&mut self, worked: bool) {
        self.succeeded_at(worked, Instant::now());
    }

    /// [`Health::succeeded`] at `now`.
    fn succeeded_at(&mut self, worked: bool, now: Instant) {
        self.races = 0;
        let quiet = self
            .last_failure
            .is_none_or(|at| now.duration_since(at) >= UNHEALABLE_GRACE);
        if !worked && !quiet {
            return;
        }
        if let Some((since, tries)) = self.failing.take()
            && self.logged.is_some()
        {
            tracing::info!(
                source = %self.source,
                role = self.what,
                failed_tries = tries,
                failing_for_ms = since.elapsed().as_millis() as u64,
                "the database answers again"
            );
        }
        self.logged = None;
        self.dropped = 0;
        self.paused_until = None;
        self.last_failure = None;
    }

    /// A call failed with `err`: how long to wait before the next try, or (with
    /// `--until-idle`, for an error that does not heal, after [`UNHEALABLE_GRACE`]) the
    /// error to fail with. Logs, at most every few seconds for errors that heal and once a
    /// minute for errors that do not.
    pub(crate) fn failed(&mut self, err: Error) -> Next {
        self.failed_at(err, Instant::now())
    }

    /// [`Health::failed`] at `now`.
    fn failed_at(&mut self, err: Error, now: Instant) -> Next {
        if err.lost_race() {
            // Not a failure of the database: another transaction (another replica's, on
            // a cluster often on another node) got there first and this one was rolled
            // back whole. Retried soon and quietly; no run of failures starts.
            self.races = self.races.saturating_add(1);
            count_lost_race(&self.source, self.what);
            let pause = race_pause(self.races, &mut rand::rng());
            tracing::debug!(source = %self.source, role = self.what, error = %err, races = self.races, retry_in_ms = pause.as_millis() as u64, "lost a race to another transaction (a deadlock or a cluster's certification conflict); retrying");
            return Next::RetryAfter(pause);
        }
        self.last_failure = Some(now);
        let (since, tries) = self.failing.get_or_insert((now, 0));
        *tries += 1;
        let (since, tries) = (*since, *tries);
        let healing = err.healing();
        let failing_for = now.duration_since(since);
        if !healing.heals() && self.until_idle && failing_for >= UNHEALABLE_GRACE && tries >= 3 {
            let hint = crate::error::unhealable_hint(&err);
            return Next::GiveUp(Error::CannotHeal {
                source_name: self.source.to_string(),
                cause: Box::new(err),
                tries,
                seconds: failing_for.as_secs_f64(),
                hint,
            });
        }
        // A pooled connection the server (or a proxy) dropped fails at once; the next try
        // opens a new one, so it is made at once too: after an outage the pool may hold
        // several such connections, and backing off on each would delay the return by
        // the cap per connection. A few in a row only: a server that drops every new
        // connection gets the usual backoff.
        let dropped = is_dropped_connection(&err);
        self.dropped = if dropped { self.dropped + 1 } else { 0 };
        let pause = if dropped && self.dropped <= DROPPED_RETRIES_AT_ONCE {
            pause(1, healing, self.until_idle, &mut rand::rng())
        } else {
            pause(tries, healing, self.until_idle, &mut rand::rng())
        };
        // Calls that ran side by side (the producer's claims in flight) fail together, and
        // their failures wait in line while the role pauses for the first: pausing again for
        // each would stack the pauses (four claims in flight, four times the cap). A failure
        // seen right as a pause ended was waiting during it, so it does not pause again.
        let pause = match self.paused_until {
            Some(end) if now <= end + ALREADY_WAITED => Duration::ZERO,
            _ => {
                self.paused_until = Some(now + pause);
                pause
            }
        };
        let log_every = match healing {
            Healing::Never => UNHEALABLE_LOG_EVERY,
            _ => RETRY_LOG_EVERY,
        };
        if self
            .logged
            .is_some_and(|at| now.duration_since(at) < log_every)
        {
            tracing::debug!(source = %self.source, role = self.what, error = %err, tries, retry_in_ms = pause.as_millis() as u64, "database call failed again; retrying");
        } else {
            self.logged = Some(now);
            let retry_in_ms = pause.as_millis() as u64;
            match healing {
                Healing::Never => tracing::error!(
                    source = %self.source,
                    role = self.what,
                    error = %err,
                    hint = %crate::error::unhealable_hint(&err),
                    tries,
                    retry_in_ms,
                    "database error that retrying cannot fix; retrying anyway, logged once a minute"
                ),
                _ => tracing::warn!(
                    source = %self.source,
                    role = self.what,
                    error = %err,
                    tries,
                    retry_in_ms,
                    "database call failed; retrying"
                ),
            }
        }
        Next::RetryAfter(pause)
    }
}

/// The pause after `races` lost races in a row: [`FIRST_RACE_PAUSE`] doubling, times a
/// jitter in [0.5, 1.5], capped at [`RACE_PAUSE_CAP`].
fn race_pause(races: u32, rng: &mut impl Rng) -> Duration {
    let raw = FIRST_RACE_PAUSE.as_secs_f64() * 2f64.powi(races.saturating_sub(1).min(30) as i32);
    let jittered = raw * rng.random_range(0.5..=1.5);
    Duration::from_secs_f64(jittered.min(RACE_PAUSE_CAP.as_secs_f64()))
}

/// The pause before try `tries + 1`: [`FIRST_PAUSE`] doubling, times a jitter in
/// [0.8, 1.2], capped at [`RETRY_CAP`] for errors that heal and [`UNHEALABLE_CAP`] for
/// the others.
fn pause(tries: u32, healing: Healing, until_idle: bool, rng: &mut impl Rng) -> Duration {
    // `--until-idle` gives up on what cannot heal after a few seconds: short pauses until then.
    let cap = if healing.heals() || until_idle {
        RETRY_CAP
    } else {
        UNHEALABLE_CAP
    };
    let raw = FIRST_PAUSE.as_secs_f64() * 2f64.powi(tries.saturating_sub(1).min(30) as i32);
    let jittered = raw * rng.random_range(0.8..=1.2);
    Duration::from_secs_f64(jittered.min(cap.as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn permission_denied() -> Error {
        Error::Database {
            context: "claiming due commands".into(),
            cause: sqlx::Error::ColumnNotFound("LockToken".into()),
        }
    }

    fn refused() -> Error {
        Error::Database {
            context: "claiming due commands".into(),
            cause: sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into()),
        }
    }

    #[test]
    fn the_deadline_is_a_tenth_of_the_lease_within_bounds() {
        assert_eq!(
            deadline_for(None, Duration::from_secs(300)),
            Duration::from_secs(30)
        );
        assert_eq!(
            deadline_for(None, Duration::from_secs(60)),
            Duration::from_secs(6)
        );
        assert_eq!(
            deadline_for(None, Duration::from_secs(2)),
            Duration::from_secs(1)
        );
        assert_eq!(
            deadline_for(None, Duration::from_secs(3600)),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn a_local_lock_wait_is_never_cut_short() {
        let busy = Some(Duration::from_secs(30));
        assert_eq!(
            deadline_for(busy, Duration::from_secs(6)),
            Duration::from_secs(31)
        );
        assert_eq!(
            deadline_for(busy, Duration::from_secs(300)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn lost_races_pause_briefly_with_jitter() {
        let mut rng = StdRng::seed_from_u64(5);
        for races in 1..40 {
            let p = race_pause(races, &mut rng).as_secs_f64();
            let expected = 0.01 * 2f64.powi(races as i32 - 1);
            assert!(p <= 0.5 + 1e-9, "{races}: {p}");
            assert!(p >= (expected * 0.5).min(0.5) - 1e-9, "{races}: {p}");
        }
        assert!(race_pause(1, &mut rng) <= Duration::from_millis(15));
    }

    #[test]
    fn pauses_double_with_jitter_up_to_the_cap() {
        let mut rng = StdRng::seed_from_u64(3);
        for tries in 1..40 {
            let expected = (0.1 * 2f64.powi(tries as i32 - 1)).min(1.0);
            let p = pause(tries, Healing::Retry, false, &mut rng).as_secs_f64();
            assert!(p <= 1.0 + 1e-9, "{tries}: {p}");
            assert!(p >= (expected * 0.8).min(1.0) - 1e-9, "{tries}: {p}");
        }
        assert_eq!(
            pause(40, Healing::Never, false, &mut rng),
            UNHEALABLE_CAP,
            "errors that do not heal are retried less often"
        );
    }

    /// Feeds `err` to `health` until it gives up (waiting each pause on a simulated clock);
    /// the error and the simulated time it took, or `None` after `most` tries.
    fn drive(
        health: &mut Health,
        err: impl Fn() -> Error,
        most: u32,
        mut check: impl FnMut(Duration),
    ) -> Option<(Error, Duration)> {
        let start = Instant::now();
        let mut now = start;
        for _ in 0..most {
            match health.failed_at(err(), now) {
                Next::RetryAfter(pause) => {
                    check(pause);
                    // The pause, then the next call, which takes a moment to fail.
                    now += pause + Duration::from_millis(30);
                }
                Next::GiveUp(err) => return Some((err, now - start)),
            }
        }
        None
    }

    #[test]
    fn until_idle_gives_up_on_what_cannot_heal_after_the_grace() {
        let mut health = Health::new("orders".into(), "claim", true);
        let (err, waited) = drive(&mut health, permission_denied, 100, |_| {}).expect("gave up");
        assert!(
            waited >= UNHEALABLE_GRACE && waited < UNHEALABLE_GRACE + 2 * RETRY_CAP,
            "{waited:?}"
        );
        assert!(matches!(err, Error::CannotHeal { .. }), "{err:?}");
        assert!(
            err.to_string().starts_with("source `orders`: claiming"),
            "{err}"
        );
    }

    #[test]
    fn what_heals_is_retried_for_ever_and_a_success_starts_over() {
        let mut health = Health::new("orders".into(), "claim", true);
        let gave_up = drive(&mut health, refused, 200, |pause| {
            assert!(pause <= RETRY_CAP)
        });
        assert!(gave_up.is_none(), "never gives up on what heals");
        health.succeeded(true);
        match health.failed(refused()) {
            Next::RetryAfter(pause) => assert!(pause <= FIRST_PAUSE * 2, "{pause:?}"),
            Next::GiveUp(err) => panic!("gave up on {err}"),
        }
    }

    #[test]
    fn a_long_running_worker_never_gives_up() {
        let mut health = Health::new("orders".into(), "claim", false);
        let gave_up = drive(&mut health, permission_denied, 100, |pause| {
            assert!(pause <= UNHEALABLE_CAP)
        });
        assert!(gave_up.is_none());
    }

    #[test]
    fn empty_claims_between_failures_do_not_restart_the_count() {
        let mut health = Health::new("orders".into(), "claim", true);
        let start = Instant::now();
        let mut now = start;
        let err = loop {
            match health.failed_at(permission_denied(), now) {
                Next::RetryAfter(pause) => now += pause + Duration::from_millis(30),
                Next::GiveUp(err) => break err,
            }
            // The claim beside it found nothing to lock and succeeded.
            health.succeeded_at(false, now);
            now += Duration::from_millis(5);
        };
        assert!(
            now - start < UNHEALABLE_GRACE + 2 * RETRY_CAP,
            "{:?}",
            now - start
        );
        assert!(matches!(err, Error::CannotHeal { .. }), "{err:?}");
        // A quiet spell of empty claims does end the run.
        health.succeeded_at(false, now + UNHEALABLE_GRACE);
        assert!(health.failing.is_none());
    }

    #[test]
    fn failures_that_waited_during_a_pause_do_not_pause_again() {
        let mut health = Health::new("orders".into(), "claim", false);
        let mut start = Instant::now();
        for _ in 0..10 {
            // Each claim made after the pause, failing a second later.
            let Next::RetryAfter(pause) = health.failed_at(refused(), start) else {
                panic!("gave up")
            };
            assert!(pause > Duration::ZERO);
            start += pause + Duration::from_secs(1);
        }
        let Next::RetryAfter(first) = health.failed_at(refused(), start) else {
            panic!("gave up")
        };
        assert!(first > Duration::ZERO);
        // Three claims that failed meanwhile, handled as the pause ends.
        for _ in 0..3 {
            let Next::RetryAfter(again) = health.failed_at(refused(), start + first) else {
                panic!("gave up")
            };
            assert_eq!(again, Duration::ZERO);
        }
        // A claim made after the pause fails later: it pauses.
        let later = start + first + Duration::from_secs(1);
        let Next::RetryAfter(next) = health.failed_at(refused(), later) else {
            panic!("gave up")
        };
        assert!(next > Duration::ZERO);
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_fails_as_a_lost_connection() {
        let hung = std::future::pending::<Result<()>>();
        let lost = std::cell::Cell::new(false);
        let err = abandon_after(Duration::from_millis(20), "claiming", hung, || {
            lost.set(true)
        })
        .await
        .unwrap_err();
        assert!(lost.get(), "the backend is told of the abandoned call");
        assert_eq!(err.healing(), Healing::Retry);
        assert!(err.is_connection_error(), "{err}");
        assert!(
            err.to_string()
                .contains("no answer from the database within 20 ms"),
            "{err}"
        );
    }
}
