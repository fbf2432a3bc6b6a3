//! Outcome stamps, each guarded by the lease token ("Stamp the outcome
//! set-based, guarded by the lease token"): a stamp under a lease the row no longer
//! carries changes nothing and counts 0; under the current lease it applies and clears
//! the lease.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Harness, ids, near, params, sorted};
use crate::command::{CommandId, CommandRow, LeaseToken};
use crate::engine::{CommandSetStateAndClaimParams, CommandSetStateManyParams};
use crate::engine::{Lease, SetState, StateChange};

const SLACK: Duration = Duration::from_secs(5);

fn stamp(id: &CommandId, token: LeaseToken, change: StateChange) -> SetState {
    SetState {
        lease: Lease {
            id: id.clone(),
            token,
        },
        change,
    }
}

/// What [`stale_then_current`] saw.
struct Stamped {
    /// The row as the second claim left it (Attempts 2, leased by that claim).
    claimed: CommandRow,
    /// The row after the stamp under the current lease.
    after: CommandRow,
    /// When that stamp was sent.
    at: DateTime<Utc>,
}

/// A row with an earlier `LastError`, claimed once, its lease expired and claimed again
/// by a second claim: `change` under the first claim's token (a replica whose lease
/// lapsed) and under a random token must change nothing and count 0; under the second
/// claim's token it counts 1, and once more under it 0 (the lease is gone).
async fn stale_then_current(h: &Harness, change: StateChange) -> Stamped {
    let engine = h.engine;
    let id = h.insert("t").await;
    h.update(&id, &format!("{} = 'earlier failure'", h.q("LastError")))
        .await;
    let (first, rows) = h.claim(10).await;
    assert_eq!(ids(&rows), vec![id.clone()]);
    h.update(&id, &format!("{} = {}", h.q("LockedUntil"), h.ago(1)))
        .await;
    let (second, rows) = h.claim(10).await;
    assert_eq!(
        ids(&rows),
        vec![id.clone()],
        "{engine}: the expired lease is claimed again"
    );
    let claimed = h.get(&id).await;
    assert_eq!((claimed.attempts, claimed.lock_token), (2, Some(second)));

    for stale in [first, LeaseToken::new()] {
        let n = h
            .driver
            .command_set_state_many(&CommandSetStateManyParams {
                changes: &[stamp(&id, stale, change.clone())],
            })
            .await
            .expect("stamp");
        assert_eq!(n, 0, "{engine}: a stale token stamps nothing ({change:?})");
        assert_eq!(
            h.get(&id).await,
            claimed,
            "{engine}: a stale {change:?} changed the row"
        );
    }
    let at = Utc::now();
    let n = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[stamp(&id, second, change.clone())],
        })
        .await
        .expect("stamp");
    assert_eq!(
        n, 1,
        "{engine}: the current token stamps the row ({change:?})"
    );
    let after = h.get(&id).await;
    assert_eq!(
        (after.lock_token, after.locked_until),
        (None, None),
        "{engine}: every stamp clears the lease ({change:?})"
    );
    let again = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[stamp(&id, second, change.clone())],
        })
        .await
        .expect("stamp");
    assert_eq!(
        again, 0,
        "{engine}: the lease is gone once stamped ({change:?})"
    );
    assert_eq!(
        h.get(&id).await,
        after,
        "{engine}: a repeated stamp changed the row"
    );
    Stamped { claimed, after, at }
}

pub(crate) async fn completed_is_guarded_by_the_lease_token(engine: &str) {
    let h = Harness::new(engine, "completed").await;
    let Stamped { claimed, after, at } = stale_then_current(&h, StateChange::Completed).await;
    near(
        after.processed_at.expect("ProcessedAt set"),
        at,
        SLACK,
        "ProcessedAt = now",
    );
    assert_eq!(after.dead_lettered_at, None);
    assert_eq!(after.attempts, 2, "{engine}: the attempt stays consumed");
    assert_eq!(after.run_at, claimed.run_at, "{engine}: RunAt unchanged");
    assert_eq!(after.last_error.as_deref(), Some("earlier failure"));
}

pub(crate) async fn retry_is_guarded_by_the_lease_token(engine: &str) {
    let h = Harness::new(engine, "retry").await;
    let retry = StateChange::Retry {
        delay: Duration::from_secs(90),
        error: "boom: disk full".into(),
        errors: None,
    };
    let Stamped { after, at, .. } = stale_then_current(&h, retry).await;
    near(
        after.run_at,
        at + chrono::Duration::seconds(90),
        SLACK,
        "RunAt = now + delay",
    );
    assert_eq!(after.last_error.as_deref(), Some("boom: disk full"));
    assert_eq!(
        after.attempts, 2,
        "{engine}: the failed attempt stays consumed"
    );
    assert_eq!((after.processed_at, after.dead_lettered_at), (None, None));
}

pub(crate) async fn dead_is_guarded_by_the_lease_token(engine: &str) {
    let h = Harness::new(engine, "dead").await;
    let dead = StateChange::Dead {
        error: "gave up".into(),
        errors: None,
    };
    let Stamped { claimed, after, at } = stale_then_current(&h, dead).await;
    near(
        after.dead_lettered_at.expect("DeadLetteredAt set"),
        at,
        SLACK,
        "DeadLetteredAt = now",
    );
    assert_eq!(after.processed_at, None);
    assert_eq!(after.last_error.as_deref(), Some("gave up"));
    assert_eq!(after.attempts, 2);
    assert_eq!(after.run_at, claimed.run_at, "{engine}: RunAt unchanged");
}

/// A release gives back the attempt its claim consumed (Attempts as before that claim),
/// keeps `RunAt` and `LastError`, and with `run_in` moves `RunAt` to now + `run_in`.
pub(crate) async fn release_is_guarded_and_gives_the_attempt_back(engine: &str) {
    let h = Harness::new(engine, "release").await;
    let release = StateChange::Release { run_in: None };
    let Stamped { claimed, after, .. } = stale_then_current(&h, release).await;
    assert_eq!(
        after.attempts, 1,
        "{engine}: Attempts as before the second claim"
    );
    assert_eq!(after.run_at, claimed.run_at, "{engine}: RunAt unchanged");
    assert_eq!(after.last_error.as_deref(), Some("earlier failure"));
    assert_eq!((after.processed_at, after.dead_lettered_at), (None, None));

    // A table of its own: the row released above is due again and would be claimed.
    let h = Harness::new(engine, "release").await;
    let moved = StateChange::Release {
        run_in: Some(Duration::from_secs(120)),
    };
    let Stamped { after, at, .. } = stale_then_current(&h, moved).await;
    assert_eq!(after.attempts, 1, "{engine}");
    near(
        after.run_at,
        at + chrono::Duration::seconds(120),
        SLACK,
        "RunAt = now + run_in",
    );

    // A row claimed once and released is back where it started: Attempts 0, due (the
    // row above is not due: its RunAt moved two minutes on).
    let id = h.insert("t").await;
    let (token, _) = h.claim(10).await;
    let n = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[stamp(&id, token, StateChange::Release { run_in: None })],
        })
        .await
        .expect("release");
    assert_eq!(n, 1);
    let row = h.get(&id).await;
    assert_eq!(
        (row.attempts, row.lock_token, row.locked_until),
        (0, None, None)
    );
}

/// One statement stamps rows of every kind at once, each by its own lease, and skips
/// (without failing the others) a row whose lease is stale.
pub(crate) async fn one_statement_stamps_every_kind_and_skips_stale_leases(engine: &str) {
    let h = Harness::new(engine, "batch").await;
    let mut rows = Vec::new();
    for _ in 0..5 {
        rows.push(h.insert("t").await);
    }
    let (token, claimed) = h.claim(10).await;
    assert_eq!(claimed.len(), 5);
    let changes = [
        stamp(&rows[0], token, StateChange::Completed),
        stamp(
            &rows[1],
            token,
            StateChange::Retry {
                delay: Duration::from_secs(60),
                error: "retry me".into(),
                errors: None,
            },
        ),
        stamp(
            &rows[2],
            token,
            StateChange::Dead {
                error: "dead".into(),
                errors: None,
            },
        ),
        stamp(&rows[3], token, StateChange::Release { run_in: None }),
        stamp(&rows[4], LeaseToken::new(), StateChange::Completed),
    ];
    let n = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams { changes: &changes })
        .await
        .expect("stamp");
    assert_eq!(n, 4, "{engine}: four current leases, one stale");
    let [completed, retried, dead, released, stale] = [0, 1, 2, 3, 4].map(|i| &rows[i]);
    assert!(h.get(completed).await.processed_at.is_some());
    let r = h.get(retried).await;
    assert_eq!(
        (r.last_error.as_deref(), r.lock_token),
        (Some("retry me"), None)
    );
    assert!(r.run_at > Utc::now() + chrono::Duration::seconds(30));
    let d = h.get(dead).await;
    assert!(d.dead_lettered_at.is_some() && d.processed_at.is_none());
    assert_eq!(h.get(released).await.attempts, 0);
    let s = h.get(stale).await;
    assert_eq!(
        (s.lock_token, s.processed_at),
        (Some(token), None),
        "{engine}: the stale stamp left the row to its lease"
    );
    assert_eq!(
        h.driver
            .command_set_state_many(&CommandSetStateManyParams { changes: &[] })
            .await
            .expect("no stamps"),
        0,
        "{engine}: an empty batch is no error"
    );
}

/// `command_set_state_and_claim` stamps and claims in one call: it counts the stamped
/// rows (stale ones skipped), claims due rows under the new token, and never takes back
/// a row it has just stamped, even one released or retried to be due at once. With
/// nothing to claim the stamped count still arrives.
pub(crate) async fn set_state_and_claim_stamps_and_claims_in_one_call(engine: &str) {
    let h = Harness::new(engine, "stampclaim").await;
    let held = h.insert("t").await;
    let (holder, claimed) = h.claim(10).await;
    assert_eq!(ids(&claimed), vec![held.clone()]);
    let done = h.insert("t").await;
    let released = h.insert("t").await;
    let retried = h.insert("t").await;
    let (first, claimed) = h.claim(10).await;
    assert_eq!(claimed.len(), 3);
    let due_a = h.insert("t").await;
    let due_b = h.insert("t").await;
    let claim = params(10);
    let changes = [
        stamp(&done, first, StateChange::Completed),
        stamp(&released, first, StateChange::Release { run_in: None }),
        stamp(
            &retried,
            first,
            StateChange::Retry {
                delay: Duration::ZERO,
                error: "again".into(),
                errors: None,
            },
        ),
        // A replica whose lease on `held` passed to another claim.
        stamp(&held, LeaseToken::new(), StateChange::Completed),
    ];
    let (stamped, rows) = h
        .stamp_and_claim(&changes, &claim)
        .await
        .expect("stamp and claim");
    assert_eq!(stamped, 3, "{engine}: three current leases, one stale");
    assert_eq!(
        ids(&rows),
        sorted(&[&due_a, &due_b]),
        "{engine}: the due rows are claimed, the ones just stamped are not"
    );
    let h_row = h.get(&held).await;
    assert_eq!(
        (h_row.lock_token, h_row.processed_at),
        (Some(holder), None),
        "{engine}: the stale stamp did nothing"
    );
    for row in &rows {
        assert_eq!(row.lease.token, claim.token);
        let stored = h.get(&row.lease.id).await;
        assert_eq!((stored.lock_token, stored.attempts), (Some(claim.token), 1));
    }
    assert!(
        h.get(&done).await.processed_at.is_some(),
        "{engine}: stamped"
    );
    let r = h.get(&released).await;
    assert_eq!((r.attempts, r.lock_token), (0, None), "{engine}: released");
    let r = h.get(&retried).await;
    assert_eq!(
        (r.attempts, r.lock_token, r.last_error.as_deref()),
        (1, None, Some("again")),
        "{engine}: retried"
    );

    // Only stamps, nothing due that the stamps did not just release: the count arrives.
    let (stamped, rows) = h
        .driver
        .command_set_state_and_claim(&CommandSetStateAndClaimParams {
            changes: &rows
                .iter()
                .map(|r| stamp(&r.lease.id, claim.token, StateChange::Completed))
                .collect::<Vec<_>>(),
            claim: &params(0),
        })
        .await
        .expect("stamp, claim nothing");
    assert_eq!((stamped, rows.len()), (2, 0), "{engine}");
    assert!(h.get(&due_b).await.processed_at.is_some());
    let (stamped, rows) = h
        .driver
        .command_set_state_and_claim(&CommandSetStateAndClaimParams {
            changes: &[],
            claim: &params(10),
        })
        .await
        .expect("claim, no stamps");
    assert_eq!(stamped, 0, "{engine}");
    assert_eq!(
        ids(&rows),
        sorted(&[&released, &retried]),
        "{engine}: due again"
    );
}

/// SQL creating (`true`) or dropping (`false`) another program's trigger on `h`'s table
/// that refuses every claim (an update setting a lease) and lets stamps through.
fn refuse_claims_trigger(h: &Harness, create: bool) -> String {
    let t = &h.t;
    let name = format!("{}_refuse", t.trim_matches(|c| c == '"' || c == '`'));
    let token = h.q("LockToken");
    let refusal = "claims refused by a test trigger";
    match (h.engine, create) {
        (crate::ident::Engine::Postgres, true) => format!(
            "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF NEW.{token} IS NOT NULL THEN RAISE EXCEPTION '{refusal}'; END IF; \
               RETURN NEW; END $$; \
             CREATE TRIGGER {name} BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {name}();"
        ),
        (crate::ident::Engine::Postgres, false) => {
            format!("DROP TRIGGER {name} ON {t}; DROP FUNCTION {name}();")
        }
        (crate::ident::Engine::Mysql, true) => format!(
            "CREATE TRIGGER {name} BEFORE UPDATE ON {t} FOR EACH ROW BEGIN \
               IF NEW.{token} IS NOT NULL THEN \
                 SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{refusal}'; \
               END IF; END"
        ),
        (_, true) => format!(
            "CREATE TRIGGER {name} BEFORE UPDATE OF {token} ON {t} \
             WHEN NEW.{token} IS NOT NULL BEGIN SELECT RAISE(ABORT, '{refusal}'); END;"
        ),
        (_, false) => format!("DROP TRIGGER {name}"),
    }
}

/// A stamp-and-claim whose claim fails (another program's trigger refuses it) stamps
/// nothing, and the driver goes on: the next call stamps and claims at once. (SQLite runs
/// it as one statement string that opens its own transaction; a connection the failure
/// left inside it would hold the file's write lock from the pool, and the next write would
/// wait out the busy timeout.)
pub(crate) async fn a_stamp_and_claim_that_fails_stamps_nothing(engine: &str) {
    let h = Harness::new(engine, "stampfail").await;
    let done = h.insert("t").await;
    let (token, claimed) = h.claim(10).await;
    assert_eq!(ids(&claimed), vec![done.clone()]);
    let due = h.insert("t").await;
    h.exec(&refuse_claims_trigger(&h, true)).await;
    let changes = [stamp(&done, token, StateChange::Completed)];
    let claim = params(10);
    let failed = h.stamp_and_claim(&changes, &claim).await;
    let err = failed
        .expect_err("the trigger refuses the claim")
        .to_string();
    assert!(err.contains("claims refused"), "{engine}: {err}");
    for _ in 0..3 {
        let row = h.get(&done).await;
        assert_eq!(
            (row.processed_at, row.lock_token),
            (None, Some(token)),
            "{engine}: the stamp went with the failed claim"
        );
    }
    h.exec(&refuse_claims_trigger(&h, false)).await;
    let again = tokio::time::timeout(Duration::from_secs(10), h.stamp_and_claim(&changes, &claim))
        .await
        .unwrap_or_else(|_| panic!("{engine}: the next stamp-and-claim waited on a lock"))
        .expect("stamp and claim");
    assert_eq!((again.0, ids(&again.1)), (1, vec![due]), "{engine}");
    assert!(h.get(&done).await.processed_at.is_some(), "{engine}");
}

/// SQLite: a stamp-and-claim whose future is dropped while its string waits for the
/// write lock (another program holds it) leaves no transaction behind: once that program
/// lets go, nothing was stamped, another connection writes at once, and the next call
/// stamps and claims. (The string runs on sqlx's worker thread after the future is gone,
/// up to the statement that notices; its connection is closed, which rolls it back.)
pub(crate) async fn sqlite_stamp_and_claim_dropped_mid_string_leaves_no_transaction() {
    use sqlx::Connection;
    let h = Harness::new("sqlite", "stampdrop").await;
    let done = h.insert("t").await;
    let (token, _) = h.claim(10).await;
    let due = h.insert("t").await;
    let mut other = sqlx::SqliteConnection::connect(&h.url)
        .await
        .expect("connect");
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .expect("hold the write lock");
    let changes = [stamp(&done, token, StateChange::Completed)];
    let claim = params(10);
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        h.stamp_and_claim(&changes, &claim),
    )
    .await;
    assert!(
        waited.is_err(),
        "the call waited for the lock until dropped"
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("let go");
    // The worker thread gets the lock, runs on until it notices the dropped future, and
    // its connection is closed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let row = h.get(&done).await;
    assert_eq!(
        (row.processed_at, row.lock_token),
        (None, Some(token)),
        "the dropped call stamped nothing"
    );
    let write = tokio::time::timeout(
        Duration::from_secs(5),
        sqlx::raw_sql("BEGIN IMMEDIATE; COMMIT").execute(&mut other),
    )
    .await
    .expect("no connection holds the write lock");
    write.expect("write");
    let (stamped, rows) =
        tokio::time::timeout(Duration::from_secs(10), h.stamp_and_claim(&changes, &claim))
            .await
            .expect("the next call waits on no lock")
            .expect("stamp and claim");
    assert_eq!((stamped, ids(&rows)), (1, vec![due]));
}

/// A full claim of the default batch (50 rows) with its stamps: all four statement
/// results and every row arrive (SQLite sends them through a row channel that holds them
/// all, so its worker never waits for the task with the write lock held).
pub(crate) async fn a_full_batch_stamp_and_claim_returns_every_row(engine: &str) {
    let h = Harness::new(engine, "stampfull").await;
    let done = h.insert("t").await;
    let (token, _) = h.claim(1).await;
    for _ in 0..60 {
        h.insert("t").await;
    }
    let changes = [stamp(&done, token, StateChange::Completed)];
    let claim = params(50);
    let (stamped, rows) = h
        .stamp_and_claim(&changes, &claim)
        .await
        .expect("stamp and claim");
    assert_eq!((stamped, rows.len()), (1, 50), "{engine}");
}
