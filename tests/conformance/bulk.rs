//! Bulk scheduling in the application's transaction (`schedule_many_in`): all of a
//! batch commits with the caller's transaction or none of it, in chunks past the
//! engines' bind limits, with unique keys kept as single schedules keep them, and a bad
//! command refused by its index with nothing written.

use icq::{Enqueue, Error, NewCommand, Queue, QueueDatabase, TableName};
use serde_json::json;

use crate::support::TestDb;

/// Commands a batch test schedules: `n` plain ones, numbered in their payloads.
fn plain(n: usize) -> Vec<NewCommand> {
    (0..n)
        .map(|i| NewCommand::new("orders.ship_line", json!({ "line": i })))
        .collect()
}

async fn count(db: &TestDb) -> i64 {
    let t = db.q("InternalCommands");
    db.scalar_i64(&format!("SELECT COUNT(*) FROM {t}")).await
}

/// Runs `check` on a pool of `db`'s engine with the default table.
macro_rules! on_engine {
    ($engine:expr, $tag:expr, $check:ident) => {{
        let db = TestDb::with_table($engine, $tag).await;
        match $engine {
            "postgres" => $check(sqlx::PgPool::connect(&db.url).await.unwrap(), &db).await,
            "mysql" => $check(sqlx::MySqlPool::connect(&db.url).await.unwrap(), &db).await,
            _ => $check(sqlx::SqlitePool::connect(&db.url).await.unwrap(), &db).await,
        }
    }};
}

async fn rollback_and_commit<DB>(pool: sqlx::Pool<DB>, db: &TestDb)
where
    DB: QueueDatabase,
    DB::Connection: Enqueue,
{
    let table = TableName::default();
    let queue = Queue::from_pool("shop", &pool, &table).await.unwrap();

    // No commands: no rows, no statement, nothing to fail.
    let mut tx = pool.begin().await.unwrap();
    assert!(
        icq::schedule_many_in(&mut *tx, &table, &[])
            .await
            .unwrap()
            .is_empty()
    );
    tx.commit().await.unwrap();

    // 10,000 commands (several chunks on every engine), rolled back: none.
    let commands = plain(10_000);
    let mut tx = pool.begin().await.unwrap();
    let scheduled = queue.schedule_many_in(&mut *tx, &commands).await.unwrap();
    assert_eq!(scheduled.len(), 10_000);
    tx.rollback().await.unwrap();
    assert_eq!(count(db).await, 0, "a rollback leaves none");

    // Committed: all, each id in input order, none reported as existing.
    let mut tx = pool.begin().await.unwrap();
    let started = std::time::Instant::now();
    let scheduled = icq::schedule_many_in(&mut *tx, &table, &commands)
        .await
        .unwrap();
    let took = started.elapsed();
    queue.commit(tx).await.unwrap();
    eprintln!(
        "{}: 10,000 commands in one transaction in {took:?}",
        db.engine
    );
    assert_eq!(count(db).await, 10_000, "a commit leaves all");
    assert!(scheduled.iter().all(|s| !s.existing));
    for (s, c) in scheduled.iter().zip(&commands) {
        assert_eq!(s.id, c.id);
    }
    let row = queue.get(&commands[9_999].id).await.unwrap().unwrap();
    assert_eq!(row.payload["line"], 9_999);
    assert_eq!(row.type_name, "orders.ship_line");
}

pub async fn schedule_many_in_commits_all_or_rolls_back_none(engine: &'static str) {
    on_engine!(engine, "bulk_tx", rollback_and_commit)
}

async fn unique_keys<DB>(pool: sqlx::Pool<DB>, db: &TestDb)
where
    DB: QueueDatabase,
    DB::Connection: Enqueue,
{
    let table = TableName::default();
    let queue = Queue::from_pool("shop", &pool, &table).await.unwrap();
    let keyed = |key: &str| {
        NewCommand::new("reports.daily", json!({ "key": key }))
            .queue("reports")
            .priority(2)
            .unique_key(key)
    };
    let before = queue.schedule(&keyed("day:1")).await.unwrap();

    // Against a pending row, twice in the batch, and new: three rows of five keyed
    // commands, with plain ones between them.
    let batch = vec![
        keyed("day:1"),
        NewCommand::new("plain", json!({})),
        keyed("day:2"),
        keyed("day:2"),
        NewCommand::new("plain", json!({})).queue("reports"),
        keyed("day:3"),
        keyed("day:1"),
    ];
    let mut tx = pool.begin().await.unwrap();
    let got = queue.schedule_many_in(&mut *tx, &batch).await.unwrap();
    queue.commit(tx).await.unwrap();
    let existing: Vec<bool> = got.iter().map(|s| s.existing).collect();
    assert_eq!(
        existing,
        [true, false, false, true, false, false, true],
        "{got:?}"
    );
    assert_eq!(got[0].id, before.id);
    assert_eq!(got[6].id, before.id);
    assert_eq!(
        got[2].id, batch[2].id,
        "the first of two in a batch is stored"
    );
    assert_eq!(got[3].id, batch[2].id);
    assert_eq!(got[5].id, batch[5].id);
    assert_eq!(
        count(db).await,
        1 + 4,
        "day:1 before, two plain, day:2, day:3"
    );
    let row = queue.get(&batch[2].id).await.unwrap().unwrap();
    assert_eq!((row.queue.as_str(), row.priority), ("reports", 2));

    // Rolled back: the keys are free again, and a later batch stores them.
    let mut tx = pool.begin().await.unwrap();
    let fresh = vec![keyed("day:4"), keyed("day:4")];
    let got = icq::schedule_many_in(&mut *tx, &table, &fresh)
        .await
        .unwrap();
    assert_eq!((got[0].existing, got[1].existing), (false, true));
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let again = vec![keyed("day:4")];
    let got = icq::schedule_many_in(&mut *tx, &table, &again)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        (got[0].id.clone(), got[0].existing),
        (again[0].id.clone(), false)
    );
    assert_eq!(count(db).await, 6);

    // 6,000 keyed commands, half of them repeats: 3,000 rows.
    let many: Vec<NewCommand> = (0..6_000)
        .map(|i| keyed(&format!("bulk:{}", i % 3_000)))
        .collect();
    let mut tx = pool.begin().await.unwrap();
    let got = icq::schedule_many_in(&mut *tx, &table, &many)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(got.iter().filter(|s| s.existing).count(), 3_000);
    assert_eq!(got[3_000].id, many[0].id);
    assert_eq!(count(db).await, 6 + 3_000);
}

pub async fn schedule_many_in_keeps_unique_keys_in_the_batch_and_against_pending_rows(
    engine: &'static str,
) {
    on_engine!(engine, "bulk_keys", unique_keys)
}

async fn bad_input<DB>(pool: sqlx::Pool<DB>, db: &TestDb)
where
    DB: QueueDatabase,
    DB::Connection: Enqueue,
{
    let table = TableName::default();
    let queue = Queue::from_pool("shop", &pool, &table).await.unwrap();

    // An invalid queue name at index 7 of 2,000: refused by its index, before writing.
    let mut commands = plain(2_000);
    commands[7] = NewCommand::new("orders.ship_line", json!({})).queue("bad\nqueue");
    let mut tx = pool.begin().await.unwrap();
    let err = icq::schedule_many_in(&mut *tx, &table, &commands)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with("command 7 of the batch") && message.contains("queue name"),
        "{message}"
    );
    tx.commit().await.unwrap();
    assert_eq!(count(db).await, 0);

    // A row the database refuses (an id that exists) late in the batch: none of the batch
    // is left, and the caller's transaction goes on with what it did before.
    let taken = queue
        .schedule(&NewCommand::new("taken", json!({})))
        .await
        .unwrap();
    let mut commands = plain(3_000);
    commands[2_999].id = taken.id.clone();
    let mut tx = pool.begin().await.unwrap();
    let mine = plain(1);
    icq::schedule_many_in(&mut *tx, &table, &mine)
        .await
        .unwrap();
    let err = queue
        .schedule_many_in(&mut *tx, &commands)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Database { .. }), "{err:?}");
    tx.commit().await.unwrap();
    assert_eq!(count(db).await, 2, "the taken row and the caller's own");
    assert!(queue.get(&mine[0].id).await.unwrap().is_some());
    assert!(queue.get(&commands[0].id).await.unwrap().is_none());
}

pub async fn schedule_many_in_refuses_a_bad_command_by_its_index_and_writes_none(
    engine: &'static str,
) {
    on_engine!(engine, "bulk_bad", bad_input)
}
