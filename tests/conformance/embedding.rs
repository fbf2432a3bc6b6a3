//! Embedding on the application's own pool: `schema::apply` creates and upgrades
//! the table, `Queue::from_pool` schedules in the application's transaction and a typed
//! handler processes what was committed until idle; the pool stays the application's. A
//! connection of another engine is refused without writing anything.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use icq::schema::SchemaChange;
use icq::{
    CommandType, Engine, Enqueue, Error, NewCommand, Processor, Queue, QueueDatabase, Registry,
    RunOptions, Settings, TableName,
};
use serde::{Deserialize, Serialize};
use sqlx::Connection;

use crate::support::TestDb;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SendReceipt {
    order_id: i64,
}

impl CommandType for SendReceipt {
    const TYPE: &'static str = "orders.send_receipt";
}

/// The application's pool on `db`, with its own `orders` table.
async fn app_pool<DB: sqlx::Database>(db: &TestDb) -> sqlx::Pool<DB> {
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(12)
        .connect(&db.url)
        .await
        .expect("the application's pool");
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, status VARCHAR(20) NOT NULL)")
        .await;
    pool
}

/// Everything an embedding service does, on one engine's pool.
async fn schedule_in_the_apps_transaction_and_drain<DB>(pool: sqlx::Pool<DB>, db: &TestDb)
where
    DB: QueueDatabase,
    DB::Connection: Enqueue,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    let table = TableName::default();
    let created = icq::schema::apply(&pool, &table).await.expect("apply");
    assert_eq!(created, SchemaChange::Created);
    let again = icq::schema::apply(&pool, &table)
        .await
        .expect("apply again");
    assert_eq!(again, SchemaChange::UpToDate);
    let queue = Queue::from_pool("shop", &pool, &table)
        .await
        .expect("from_pool");
    assert_eq!(queue.engine().name(), db.engine);

    // The order and its command commit together.
    let mut tx = pool.begin().await.unwrap();
    sqlx::raw_sql("INSERT INTO orders (id, status) VALUES (42, 'paid')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let paid = NewCommand::typed(&SendReceipt { order_id: 42 }).unwrap();
    queue.schedule_in(&mut *tx, &paid).await.unwrap();
    queue.commit(tx).await.unwrap();

    // A rolled-back order schedules nothing.
    let mut tx = pool.begin().await.unwrap();
    sqlx::raw_sql("INSERT INTO orders (id, status) VALUES (43, 'paid')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let lost = NewCommand::typed(&SendReceipt { order_id: 43 }).unwrap();
    queue.schedule_in(&mut *tx, &lost).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(queue.get(&lost.id).await.unwrap().is_none());

    let seen: Arc<Mutex<Vec<(i64, u32)>>> = Arc::default();
    let sink = seen.clone();
    let mut registry = Registry::new();
    registry
        .register::<SendReceipt, _, _>(move |receipt, job| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push((receipt.order_id, job.attempt));
                Ok(())
            }
        })
        .unwrap();
    let mut processor = Processor::new(registry);
    processor
        .add_source(queue.source_handle(Settings::default().with_polling_interval_seconds(0.05)));
    tokio::time::timeout(
        Duration::from_secs(60),
        processor.run(
            RunOptions::default().with_until_idle(true),
            Default::default(),
        ),
    )
    .await
    .expect("drained within 60 s")
    .expect("the processor ran");

    assert_eq!(*seen.lock().unwrap(), vec![(42, 1)]);
    assert_eq!(queue.stats().snapshot().succeeded, 1);
    let row = queue.get(&paid.id).await.unwrap().expect("the row");
    assert!(row.processed_at.is_some(), "stamped completed");
    // In the history table, where completed commands move.
    assert_eq!(
        db.scalar_i64(&format!("SELECT COUNT(*) FROM {}", db.all_rows()))
            .await,
        1
    );
    assert_eq!(db.scalar_i64("SELECT COUNT(*) FROM orders").await, 1);

    // Closing the queue leaves the application's pool open and working.
    queue.close().await;
    assert!(!pool.is_closed());
    sqlx::raw_sql("SELECT 1").execute(&pool).await.unwrap();
    pool.close().await;
}

pub async fn the_applications_pool_schedules_in_its_transaction_and_drains(engine: &'static str) {
    let db = TestDb::new(engine, "from_pool").await;
    match engine {
        "postgres" => {
            let pool = app_pool::<sqlx::Postgres>(&db).await;
            schedule_in_the_apps_transaction_and_drain(pool, &db).await;
        }
        "mysql" => {
            let pool = app_pool::<sqlx::MySql>(&db).await;
            schedule_in_the_apps_transaction_and_drain(pool, &db).await;
        }
        _ => {
            let pool = app_pool::<sqlx::Sqlite>(&db).await;
            schedule_in_the_apps_transaction_and_drain(pool, &db).await;
        }
    }
}

/// A version-1 table is upgraded in place (its rows kept), and replicas applying at once
/// all succeed.
async fn upgrade_and_race<DB>(pool: sqlx::Pool<DB>, db: &TestDb)
where
    DB: QueueDatabase,
{
    let engine: Engine = db.engine.parse().unwrap();
    let old = TableName::parse("OldCommands").unwrap();
    db.execute(&icq::schema::render_v1(engine, &old).up).await;
    let t = db.q("OldCommands");
    db.execute(&format!(
        "INSERT INTO {t} ({}, {}) VALUES ('old.one', '{{}}')",
        db.q("Type"),
        db.q("Payload")
    ))
    .await;
    let upgraded = icq::schema::apply(&pool, &old).await.expect("upgrade");
    assert_eq!(upgraded, SchemaChange::Upgraded);
    assert_eq!(
        icq::schema::apply(&pool, &old).await.unwrap(),
        SchemaChange::UpToDate
    );
    let queue = Queue::from_pool("shop", &pool, &old).await.unwrap();
    // Version 2 now: a queue and a priority are accepted.
    queue
        .schedule(
            &NewCommand::new("new.one", serde_json::json!({}))
                .queue("reports")
                .priority(3),
        )
        .await
        .expect("a version-2 schedule");
    assert_eq!(db.scalar_i64(&format!("SELECT COUNT(*) FROM {t}")).await, 2);

    // Four replicas starting at once on a fresh table: one creates it, none fails.
    let fresh = TableName::parse("RaceCommands").unwrap();
    let results =
        futures::future::join_all((0..4).map(|_| icq::schema::apply(&pool, &fresh))).await;
    let changes: Vec<SchemaChange> = results
        .into_iter()
        .map(|r| r.expect("every replica's apply succeeds"))
        .collect();
    assert!(changes.contains(&SchemaChange::Created), "{changes:?}");
    assert!(
        changes
            .iter()
            .all(|c| matches!(c, SchemaChange::Created | SchemaChange::UpToDate)),
        "{changes:?}"
    );
    Queue::from_pool("shop", &pool, &fresh).await.unwrap();
}

pub async fn schema_apply_upgrades_version_1_and_tolerates_replicas(engine: &'static str) {
    let db = TestDb::new(engine, "apply").await;
    match engine {
        "postgres" => upgrade_and_race(sqlx::PgPool::connect(&db.url).await.unwrap(), &db).await,
        "mysql" => upgrade_and_race(sqlx::MySqlPool::connect(&db.url).await.unwrap(), &db).await,
        _ => upgrade_and_race(sqlx::SqlitePool::connect(&db.url).await.unwrap(), &db).await,
    }
}

/// A PostgreSQL queue given a SQLite transaction, and a SQLite queue given a PostgreSQL
/// one: refused with the engines named, and nothing written through the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_of_another_engine_is_refused_and_writes_nothing() {
    let table = TableName::default();
    let pg = TestDb::with_table("postgres", "mismatch").await;
    let lite = TestDb::with_table("sqlite", "mismatch").await;
    let pg_pool = sqlx::PgPool::connect(&pg.url).await.unwrap();
    let lite_pool = sqlx::SqlitePool::connect(&lite.url).await.unwrap();
    let pg_queue = Queue::from_pool("pg", &pg_pool, &table).await.unwrap();
    let lite_queue = Queue::from_pool("lite", &lite_pool, &table).await.unwrap();
    let command = NewCommand::new("t", serde_json::json!({}));

    let mut tx = lite_pool.begin().await.unwrap();
    let err = pg_queue.schedule_in(&mut *tx, &command).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::EngineMismatch {
                queue: Engine::Postgres,
                connection: Engine::Sqlite
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("postgres") && message.contains("sqlite"),
        "{message}"
    );
    tx.commit().await.unwrap();

    let mut conn = sqlx::PgConnection::connect(&pg.url).await.unwrap();
    let err = lite_queue
        .schedule_in(&mut conn, &command)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::EngineMismatch {
                queue: Engine::Sqlite,
                connection: Engine::Postgres
            }
        ),
        "{err:?}"
    );

    let t = "\"InternalCommands\"";
    assert_eq!(pg.scalar_i64(&format!("SELECT COUNT(*) FROM {t}")).await, 0);
    assert_eq!(
        lite.scalar_i64(&format!("SELECT COUNT(*) FROM {t}")).await,
        0
    );
}
