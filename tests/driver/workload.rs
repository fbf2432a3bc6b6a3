//! Workload control on schema version 2: claims in `Priority`, `RunAt` order,
//! queue filters, unique keys (from the library, inside a transaction, in bulk and from
//! plain SQL), the snooze stamp, lease checks, and a version-1 table that keeps working
//! and refuses what needs version 2.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use sqlx::Connection as _;

use super::{Harness, ids, near, params, sorted};
use crate::command::{CommandId, LeaseToken, NewCommand, Scheduled};
use crate::engine::{
    ClaimParams, CommandInsertManyParams, CommandInsertParams, CommandSetStateManyParams, Lease,
    LeaseCheckManyParams, SetState, StateChange,
};
use crate::ident::Engine;

const SLACK: Duration = Duration::from_secs(5);

fn command() -> NewCommand {
    NewCommand::new("t", serde_json::json!({}))
}

async fn schedule(h: &Harness, command: &NewCommand) -> Scheduled {
    h.driver
        .command_insert(&CommandInsertParams { command })
        .await
        .unwrap_or_else(|e| panic!("{}: insert: {e}", h.engine))
}

/// Claim parameters for `queues` (and `limit` rows).
fn in_queues(limit: u32, queues: &[&str]) -> ClaimParams {
    ClaimParams {
        queues: Some(queues.iter().map(|q| (*q).to_owned()).collect()),
        ..params(limit)
    }
}

async fn stamp(h: &Harness, lease: &Lease, change: StateChange) -> u64 {
    h.driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[SetState {
                lease: lease.clone(),
                change,
            }],
        })
        .await
        .expect("stamp")
}

/// Due rows come most urgent priority first, then by `RunAt`; a row not due yet never.
/// Claimed one at a time, so the order is the claims' (and PostgreSQL's claim cursor
/// follows it).
pub(crate) async fn claims_come_in_priority_then_run_at_order(engine: &str) {
    let h = Harness::new(engine, "prio").await;
    let mut expected = Vec::new();
    let mut later = Vec::new();
    // (priority, seconds ago): claim order c, b, a, d; e is not due.
    for (name, priority, ago) in [
        ("a", 0, 30),
        ("b", -5, 10),
        ("c", -5, 20),
        ("d", 3, 40),
        ("e", 0, -3600),
    ] {
        let id = schedule(&h, &command().priority(priority)).await.id;
        h.update(&id, &format!("{} = {}", h.q("RunAt"), h.ago(ago)))
            .await;
        later.push((name, id));
    }
    for name in ["c", "b", "a", "d"] {
        expected.push(later.iter().find(|(n, _)| *n == name).unwrap().1.clone());
    }
    let mut order = Vec::new();
    loop {
        let (_, rows) = h.claim(1).await;
        let Some(row) = rows.first() else { break };
        assert!(
            row.row.defects.is_empty(),
            "{engine}: {:?}",
            row.row.defects
        );
        order.push(row.lease.id.clone());
    }
    assert_eq!(order, expected, "{engine}: claim order");
}

/// A claim for some queues takes only their rows, in priority order; `None` takes the
/// rest.
pub(crate) async fn a_queue_filter_claims_only_those_queues(engine: &str) {
    let h = Harness::new(engine, "queues").await;
    let a1 = schedule(&h, &command().queue("a")).await.id;
    let a2 = schedule(&h, &command().queue("a").priority(-1)).await.id;
    let b = schedule(&h, &command().queue("b")).await.id;
    let d = schedule(&h, &command()).await.id;
    let other = schedule(&h, &command().queue("other")).await.id;

    let rows = h
        .driver
        .command_claim(&in_queues(10, &["a"]))
        .await
        .unwrap();
    assert_eq!(ids(&rows), sorted(&[&a1, &a2]), "{engine}: queue a");
    let rows = h
        .driver
        .command_claim(&in_queues(10, &["b", "default"]))
        .await
        .unwrap();
    assert_eq!(ids(&rows), sorted(&[&b, &d]), "{engine}: queues b, default");
    let rows = h.driver.command_claim(&in_queues(10, &[])).await.unwrap();
    assert!(rows.is_empty(), "{engine}: no queue claims nothing");
    let (_, rows) = h.claim(10).await;
    assert_eq!(ids(&rows), vec![other], "{engine}: every queue");

    // With stamps first, in one round trip, the filter holds too.
    let e = schedule(&h, &command().queue("e")).await.id;
    let f = schedule(&h, &command().queue("f")).await.id;
    let (_, claimed) = h
        .driver
        .command_set_state_and_claim(&crate::engine::CommandSetStateAndClaimParams {
            changes: &[],
            claim: &in_queues(10, &["f"]),
        })
        .await
        .unwrap();
    assert_eq!(ids(&claimed), vec![f], "{engine}: stamp and claim queue f");
    let rows = h
        .driver
        .command_claim(&in_queues(10, &["e"]))
        .await
        .unwrap();
    assert_eq!(ids(&rows), vec![e], "{engine}");
}

/// The activity of some queues counts their rows only.
pub(crate) async fn activity_in_counts_the_queues_asked_for(engine: &str) {
    let h = Harness::new(engine, "activity").await;
    schedule(&h, &command().queue("a")).await;
    schedule(&h, &command().queue("b")).await;
    schedule(&h, &command().queue("b")).await;
    let of = |queues: Option<Vec<String>>| {
        let driver = h.driver.clone();
        async move {
            driver
                .activity_in(queues.as_deref())
                .await
                .expect("activity")
                .due
        }
    };
    assert_eq!(of(Some(vec!["a".into()])).await, 1, "{engine}");
    assert_eq!(of(Some(vec!["b".into()])).await, 2, "{engine}");
    assert_eq!(of(Some(vec!["a".into(), "b".into()])).await, 3, "{engine}");
    assert_eq!(of(None).await, 3, "{engine}");
}

/// Eight schedulers, each with a pool of its own, schedule the same unique key at once:
/// one row, one of them inserted it, the others got its id back.
pub(crate) async fn concurrent_schedulers_with_one_unique_key_create_one_row(engine: &str) {
    let h = Harness::new(engine, "uniqrace").await;
    let start = Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let driver = h.another_driver().await;
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            let command = command().unique_key("report:2030-01-01");
            start.wait().await;
            driver
                .command_insert(&CommandInsertParams { command: &command })
                .await
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(
            task.await
                .unwrap()
                .unwrap_or_else(|e| panic!("{engine}: {e}")),
        );
    }
    let inserted: Vec<&Scheduled> = results.iter().filter(|s| !s.existing).collect();
    assert_eq!(inserted.len(), 1, "{engine}: one insert: {results:?}");
    assert!(
        results.iter().all(|s| s.id == inserted[0].id),
        "{engine}: {results:?}"
    );
    let rows = h
        .count(&format!("{} = 'report:2030-01-01'", h.q("UniqueKey")))
        .await;
    assert_eq!(rows, 1, "{engine}");
}

/// Another program scheduling with plain SQL (`INSERT … ON CONFLICT DO NOTHING`, MariaDB
/// `INSERT IGNORE`) adds nothing while the key is pending; icq then finds its row.
pub(crate) async fn plain_sql_inserts_honour_the_unique_key(engine: &str) {
    let h = Harness::new(engine, "uniqsql").await;
    let first = schedule(&h, &command().unique_key("p")).await;
    let plain = |key: &str| match h.engine {
        Engine::Mysql => format!(
            "INSERT IGNORE INTO {} (`Type`, `Payload`, `UniqueKey`) VALUES ('t', '{{}}', '{key}')",
            h.t
        ),
        _ => format!(
            r#"INSERT INTO {} ("Type", "Payload", "UniqueKey") VALUES ('t', '{{}}', '{key}')
               ON CONFLICT DO NOTHING"#,
            h.t
        ),
    };
    h.exec(&plain("p")).await;
    h.exec(&plain("p")).await;
    assert_eq!(h.count(&format!("{} = 'p'", h.q("UniqueKey"))).await, 1);
    assert!(!first.existing);

    h.exec(&plain("q")).await;
    let again = schedule(&h, &command().unique_key("q")).await;
    assert!(again.existing, "{engine}: the plain SQL row holds q");
    let row = h.get(&again.id).await;
    assert_eq!(row.unique_key.as_deref(), Some("q"), "{engine}");
    assert_eq!(h.count(&format!("{} = 'q'", h.q("UniqueKey"))).await, 1);
}

/// A completed or dead row frees its key: the next schedule inserts.
pub(crate) async fn completed_and_dead_rows_free_the_unique_key(engine: &str) {
    let h = Harness::new(engine, "uniqfree").await;
    let key = || command().unique_key("k");
    let first = schedule(&h, &key()).await;
    assert!(schedule(&h, &key()).await.existing);
    let (_, rows) = h.claim(10).await;
    assert_eq!(stamp(&h, &rows[0].lease, StateChange::Completed).await, 1);
    let second = schedule(&h, &key()).await;
    assert!(!second.existing, "{engine}: completed frees the key");
    assert_ne!(second.id, first.id);
    let (_, rows) = h.claim(10).await;
    let dead = StateChange::Dead {
        error: "boom".into(),
        errors: None,
    };
    assert_eq!(stamp(&h, &rows[0].lease, dead).await, 1);
    let third = schedule(&h, &key()).await;
    assert!(!third.existing, "{engine}: dead frees the key");
    assert_eq!(h.count_all(&format!("{} = 'k'", h.q("UniqueKey"))).await, 3);
}

/// A bulk insert: a key held by a pending row, or repeated within the batch, returns the
/// one row for each; commands without a key are all inserted.
pub(crate) async fn bulk_inserts_with_repeated_keys_return_the_one_row(engine: &str) {
    let h = Harness::new(engine, "uniqbulk").await;
    let held = schedule(&h, &command().unique_key("x")).await.id;
    let batch = vec![
        command().unique_key("y"),
        command().unique_key("y"),
        command(),
        command().unique_key("x"),
        command().queue("q").priority(2),
        command(),
    ];
    let out = h
        .driver
        .command_insert_many(&CommandInsertManyParams { commands: &batch })
        .await
        .unwrap_or_else(|e| panic!("{engine}: {e}"));
    let got: Vec<(CommandId, bool)> = out.iter().map(|s| (s.id.clone(), s.existing)).collect();
    assert_eq!(
        got,
        vec![
            (batch[0].id.clone(), false),
            (batch[0].id.clone(), true),
            (batch[2].id.clone(), false),
            (held, true),
            (batch[4].id.clone(), false),
            (batch[5].id.clone(), false),
        ],
        "{engine}"
    );
    assert_eq!(h.count("1 = 1").await, 5, "{engine}");
    let row = h.get(&batch[4].id).await;
    assert_eq!((row.queue.as_str(), row.priority), ("q", 2), "{engine}");
}

/// Inside the caller's transaction (`Enqueue`): a key repeated in the transaction
/// returns the first row; a rollback leaves the key free.
pub(crate) async fn in_transaction_inserts_honour_the_unique_key(engine: &str) {
    use crate::queue::Enqueue;
    let h = Harness::new(engine, "uniqtx").await;
    let first = command().unique_key("tx").queue("mail");
    let again = command().unique_key("tx");
    let (one, two) = match h.engine {
        Engine::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&h.url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            let one = tx.enqueue(&h.table, &first).await.unwrap();
            let two = tx.enqueue(&h.table, &again).await.unwrap();
            tx.commit().await.unwrap();
            (one, two)
        }
        Engine::Mysql => {
            let mut conn = sqlx::MySqlConnection::connect(&h.url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            let one = tx.enqueue(&h.table, &first).await.unwrap();
            let two = tx.enqueue(&h.table, &again).await.unwrap();
            tx.commit().await.unwrap();
            (one, two)
        }
        _ => {
            let mut conn = sqlx::SqliteConnection::connect(&h.url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            let one = tx.enqueue(&h.table, &first).await.unwrap();
            let two = tx.enqueue(&h.table, &again).await.unwrap();
            tx.commit().await.unwrap();
            (one, two)
        }
    };
    assert_eq!((one.existing, two.existing), (false, true), "{engine}");
    assert_eq!(
        (one.id.clone(), two.id),
        (first.id.clone(), first.id.clone())
    );
    assert_eq!(h.get(&one.id).await.queue, "mail", "{engine}");

    // Rolled back: the key is free again for the next schedule.
    let rolled = command().unique_key("rolled");
    match h.engine {
        Engine::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&h.url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            tx.enqueue(&h.table, &rolled).await.unwrap();
            tx.rollback().await.unwrap();
        }
        Engine::Mysql => {
            let mut conn = sqlx::MySqlConnection::connect(&h.url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            tx.enqueue(&h.table, &rolled).await.unwrap();
            tx.rollback().await.unwrap();
        }
        _ => {
            let mut conn = sqlx::SqliteConnection::connect(&h.url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            tx.enqueue(&h.table, &rolled).await.unwrap();
            tx.rollback().await.unwrap();
        }
    }
    assert!(!schedule(&h, &command().unique_key("rolled")).await.existing);
}

/// A snooze: `RunAt` moves, the attempt the claim consumed is given back, `Snoozes`
/// counts it, `LastError` stays, the lease is cleared; guarded by the token.
pub(crate) async fn snooze_gives_the_attempt_back_and_counts_itself(engine: &str) {
    let h = Harness::new(engine, "snooze").await;
    let id = schedule(&h, &command()).await.id;
    h.update(&id, &format!("{} = 'earlier failure'", h.q("LastError")))
        .await;
    for round in 1..=2 {
        let (token, rows) = h.claim(10).await;
        assert_eq!(ids(&rows), vec![id.clone()], "{engine}");
        assert_eq!(h.get(&id).await.attempts, 1, "{engine}: claimed");
        let stale = Lease {
            id: id.clone(),
            token: LeaseToken::new(),
        };
        let snooze = StateChange::Snooze {
            delay: Duration::from_secs(60),
        };
        assert_eq!(stamp(&h, &stale, snooze.clone()).await, 0, "{engine}");
        let at = Utc::now();
        let lease = Lease {
            id: id.clone(),
            token,
        };
        assert_eq!(stamp(&h, &lease, snooze).await, 1, "{engine}");
        let row = h.get(&id).await;
        assert_eq!(row.attempts, 0, "{engine}: the attempt is given back");
        assert_eq!(row.snoozes, round, "{engine}: counted");
        assert_eq!(
            row.last_error.as_deref(),
            Some("earlier failure"),
            "{engine}"
        );
        assert_eq!((row.lock_token, row.locked_until), (None, None), "{engine}");
        near(
            row.run_at,
            at + chrono::Duration::seconds(60),
            SLACK,
            "snoozed RunAt",
        );
        h.update(&id, &format!("{} = {}", h.q("RunAt"), h.ago(1)))
            .await;
    }
}

/// The lease check returns the leases still held: not a completed row's, not one an
/// operator cancelled, not one another claim took over, not a made-up token.
pub(crate) async fn lease_check_returns_the_leases_still_held(engine: &str) {
    let h = Harness::new(engine, "leasecheck").await;
    for _ in 0..4 {
        schedule(&h, &command()).await;
    }
    let (_, rows) = h.claim(10).await;
    assert_eq!(rows.len(), 4);
    let leases: Vec<Lease> = rows.iter().map(|r| r.lease.clone()).collect();
    assert_eq!(stamp(&h, &leases[0], StateChange::Completed).await, 1);
    h.update(
        &leases[1].id,
        &format!(
            "{} = {}, {} = NULL, {} = NULL, {} = 'cancelled by operator'",
            h.q("DeadLetteredAt"),
            h.ago(0),
            h.q("LockToken"),
            h.q("LockedUntil"),
            h.q("LastError")
        ),
    )
    .await;
    h.update(
        &leases[2].id,
        &format!("{} = {}", h.q("LockedUntil"), h.ago(1)),
    )
    .await;
    let (_, taken) = h.claim(10).await;
    assert_eq!(ids(&taken), vec![leases[2].id.clone()], "{engine}");
    let mut asked = leases.clone();
    asked.push(Lease {
        id: leases[3].id.clone(),
        token: LeaseToken::new(),
    });
    let held = h
        .driver
        .lease_check_many(&LeaseCheckManyParams { leases: asked })
        .await
        .expect("check leases");
    assert_eq!(held, vec![leases[3].clone()], "{engine}");
    let none = h
        .driver
        .lease_check_many(&LeaseCheckManyParams { leases: Vec::new() })
        .await
        .unwrap();
    assert!(none.is_empty());
}

/// A version-1 table: plain schedules, claims in `RunAt` order, stamps (a snooze as a
/// release with a move) and lease checks work; a queue filter, a queue, a priority or a
/// unique key is refused naming the upgrade, and nothing is inserted.
pub(crate) async fn a_version_1_table_claims_as_before_and_refuses_version_2_asks(engine: &str) {
    let h = Harness::v1(engine, "v1").await;
    assert_eq!(h.driver.schema_version().await.unwrap(), 1, "{engine}");
    let late = schedule(&h, &command()).await.id;
    let early = schedule(&h, &command()).await.id;
    h.update(&late, &format!("{} = {}", h.q("RunAt"), h.ago(10)))
        .await;
    h.update(&early, &format!("{} = {}", h.q("RunAt"), h.ago(20)))
        .await;
    let traced = schedule(
        &h,
        &command().trace_parent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    )
    .await
    .id;
    h.update(&traced, &format!("{} = {}", h.q("RunAt"), h.ago(5)))
        .await;

    let upgrade = |err: crate::Error, what: &str| {
        let text = err.to_string();
        assert!(
            matches!(err, crate::Error::NeedsSchemaV2 { .. }),
            "{engine}: {what}: {err:?}"
        );
        assert!(
            text.contains("is schema version 1") && text.contains("schema upgrade migration"),
            "{engine}: {what}: {text}"
        );
    };
    let refused = h.driver.command_claim(&in_queues(10, &["a"])).await;
    upgrade(refused.unwrap_err(), "claim by queue");
    upgrade(
        h.driver.activity_in(Some(&["a".into()])).await.unwrap_err(),
        "activity by queue",
    );
    for (what, ask) in [
        ("queue", command().queue("a")),
        ("priority", command().priority(1)),
        ("unique key", command().unique_key("k")),
    ] {
        let err = h
            .driver
            .command_insert(&CommandInsertParams { command: &ask })
            .await
            .unwrap_err();
        upgrade(err, what);
        let err = h
            .driver
            .command_insert_many(&CommandInsertManyParams {
                commands: &[command(), ask.clone()],
            })
            .await
            .unwrap_err();
        upgrade(err, what);
    }
    assert_eq!(h.count("1 = 1").await, 3, "{engine}: nothing more inserted");

    let mut order = Vec::new();
    for _ in 0..3 {
        let (_, rows) = h.claim(1).await;
        let row = &rows[0];
        assert_eq!((row.row.queue.as_str(), row.row.priority), ("default", 0));
        order.push(row.lease.clone());
    }
    let order_ids: Vec<CommandId> = order.iter().map(|l| l.id.clone()).collect();
    assert_eq!(order_ids, vec![early, late, traced.clone()], "{engine}");
    let held = h
        .driver
        .lease_check_many(&LeaseCheckManyParams {
            leases: order.clone(),
        })
        .await
        .unwrap();
    assert_eq!(held.len(), 3, "{engine}");
    let snooze = StateChange::Snooze {
        delay: Duration::from_secs(60),
    };
    let at = Utc::now();
    assert_eq!(stamp(&h, &order[2], snooze).await, 1, "{engine}");
    let row = h.get(&traced).await;
    assert_eq!((row.attempts, row.snoozes), (0, 0), "{engine}");
    near(
        row.run_at,
        at + chrono::Duration::seconds(60),
        SLACK,
        "v1 snooze",
    );
}

/// Rows another program wrote with a NULL `Queue` (a relaxed column) or a `Priority`
/// icq cannot use come back from the claim each with its own defect naming the column,
/// next to healthy rows without any; a claim for one queue still takes the NULL-queue
/// row (no queue filter would ever match it).
pub(crate) async fn foreign_rows_with_unusable_queue_or_priority_settle_alone(engine: &str) {
    let h = Harness::with_ddl(engine, "foreignq", |ddl| {
        ddl.replace(
            r#""Queue"          TEXT    NOT NULL DEFAULT 'default'"#,
            r#""Queue"          TEXT    NULL DEFAULT 'default'"#,
        )
        .replace(
            r#""Priority"       INTEGER NOT NULL DEFAULT 0"#,
            r#""Priority"       INTEGER NULL DEFAULT 0"#,
        )
    })
    .await;
    match h.engine {
        Engine::Postgres => {
            h.exec(&format!(
                r#"ALTER TABLE {} ALTER COLUMN "Queue" DROP NOT NULL,
                                  ALTER COLUMN "Priority" DROP NOT NULL"#,
                h.t
            ))
            .await
        }
        Engine::Mysql => {
            h.exec(&format!(
                "ALTER TABLE {} MODIFY `Queue` VARCHAR(128) NULL DEFAULT 'default', \
                 MODIFY `Priority` SMALLINT NULL DEFAULT 0",
                h.t
            ))
            .await
        }
        _ => {}
    }
    let good = schedule(&h, &command()).await.id;
    let null_queue = schedule(&h, &command()).await.id;
    h.update(&null_queue, &format!("{} = NULL", h.q("Queue")))
        .await;
    let mut bad_priority = Vec::new();
    let values: &[&str] = match h.engine {
        Engine::Sqlite => &["99999", "1.5", "'high'", "NULL"],
        _ => &["NULL"],
    };
    for value in values {
        let id = schedule(&h, &command()).await.id;
        h.update(&id, &format!("{} = {value}", h.q("Priority")))
            .await;
        bad_priority.push(id);
    }
    let rows = h
        .driver
        .command_claim(&in_queues(20, &["default"]))
        .await
        .unwrap_or_else(|e| panic!("{engine}: {e}"));
    assert_eq!(rows.len(), 2 + values.len(), "{engine}: {rows:?}");
    for row in &rows {
        let defects = &row.row.defects;
        if row.lease.id == good {
            assert!(defects.is_empty(), "{engine}: {defects:?}");
        } else if row.lease.id == null_queue {
            assert_eq!(defects.len(), 1, "{engine}: {defects:?}");
            assert!(
                defects[0].starts_with("column Queue:"),
                "{engine}: {defects:?}"
            );
        } else {
            assert!(bad_priority.contains(&row.lease.id));
            assert_eq!(defects.len(), 1, "{engine}: {defects:?}");
            assert!(
                defects[0].starts_with("column Priority:"),
                "{engine}: {defects:?}"
            );
        }
    }
}

/// The version-2 columns are stored and read back as given.
pub(crate) async fn new_columns_round_trip(engine: &str) {
    let h = Harness::new(engine, "v2cols").await;
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let command = command()
        .queue("mail (eu)")
        .priority(-32768)
        .unique_key("ü-key")
        .trace_parent(parent);
    let id = schedule(&h, &command).await.id;
    let row = h.get(&id).await;
    assert!(row.defects.is_empty(), "{engine}: {:?}", row.defects);
    assert_eq!(
        (row.queue.as_str(), row.priority, row.unique_key.as_deref()),
        ("mail (eu)", -32768, Some("ü-key")),
        "{engine}"
    );
    assert_eq!(
        (row.trace_parent.as_deref(), row.snoozes),
        (Some(parent), 0),
        "{engine}"
    );
    let plain = schedule(&h, &self::command()).await.id;
    let row = h.get(&plain).await;
    assert_eq!(
        (
            row.queue.as_str(),
            row.priority,
            row.unique_key,
            row.trace_parent
        ),
        ("default", 0, None, None),
        "{engine}"
    );
}

/// PostgreSQL's listener signals `cancelled` on the table's cancel channel (an
/// operator's `icq cancel`) and `wake` on inserts, each only its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_listen_signals_cancels_and_inserts_apart() {
    use tokio::sync::Notify;
    let h = Harness::new("postgres", "cancelch").await;
    let (wake, cancelled) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    assert!(
        h.driver
            .listen(wake.clone(), cancelled.clone(), Default::default())
            .await
            .expect("listen")
    );
    let within = Duration::from_secs(5);
    h.exec(&format!(
        "SELECT pg_notify('{}', '')",
        crate::schema::cancel_channel(&h.table)
    ))
    .await;
    tokio::time::timeout(within, cancelled.notified())
        .await
        .expect("the cancel notification signals `cancelled`");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), wake.notified())
            .await
            .is_err(),
        "a cancel is not an insert"
    );
    schedule(&h, &command()).await;
    tokio::time::timeout(within, wake.notified())
        .await
        .expect("an insert signals `wake`");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), cancelled.notified())
            .await
            .is_err(),
        "an insert is not a cancel"
    );
    h.driver.close().await;
}
