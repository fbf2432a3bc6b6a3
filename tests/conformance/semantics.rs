//! Queue semantics shared by every engine (see the contract, §6).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use icq::ConnectOptions;
use icq::handler::{AuthorizeLayer, FnHandler, Layer, TimeoutLayer};
use icq::{
    CommandId, CommandType, Context, HandlerError, Job, NewCommand, Processor, Queue, Registry,
    RunOptions, Settings, TableName,
};
use serde::{Deserialize, Serialize};
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

use crate::support::TestDb;

/// A private database with the commands table, and a connected queue on it.
async fn setup(engine: &'static str, tag: &str) -> (TestDb, Queue) {
    let db = TestDb::with_table(engine, tag).await;
    let queue = connect(&db).await;
    (db, queue)
}

async fn connect(db: &TestDb) -> Queue {
    Queue::connect(
        "orders",
        &db.url,
        &TableName::default(),
        &ConnectOptions::default(),
    )
    .await
    .expect("connect queue")
}

fn fast_settings() -> Settings {
    Settings {
        polling_interval_seconds: 0.05,
        retry_backoff_base_seconds: 0.05,
        max_retry_backoff_seconds: 0.2,
        ..Settings::default()
    }
}

/// Runs `processor` until `done` returns true (checked every 50 ms) or `limit` passes.
async fn run_until<F, Fut>(processor: Processor, limit: Duration, mut done: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { processor.run(RunOptions::default(), stop).await }
    });
    let started = Instant::now();
    let mut ok = false;
    while started.elapsed() < limit {
        if done().await {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await.expect("processor task").expect("processor run");
    ok
}

async fn run_until_idle(processor: &Processor) {
    tokio::time::timeout(
        Duration::from_secs(60),
        processor.run(
            RunOptions {
                until_idle: true,
                ..RunOptions::default()
            },
            CancellationToken::new(),
        ),
    )
    .await
    .expect("processor reached idle within 60s")
    .expect("processor run");
}

async fn row(queue: &Queue, id: &CommandId) -> icq::CommandRow {
    queue.get(id).await.expect("get row").expect("row exists")
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SendReceipt {
    order_id: u64,
    email: String,
}

impl CommandType for SendReceipt {
    const TYPE: &'static str = "orders.send_receipt";
}

fn context() -> Context {
    Context {
        user_id: Some("u-42".into()),
        roles: vec!["orders.write".into(), "staff".into()],
        tenant_id: Some("acme".into()),
        correlation_id: Some("req-7".into()),
    }
}

/// Schedules `rolled_back` in a transaction that rolls back, then `committed` in one that
/// commits, on the caller's own connection.
async fn rollback_then_commit<C>(
    mut conn: C,
    table: &TableName,
    rolled_back: &NewCommand,
    committed: &NewCommand,
) where
    C: Connection + icq::Enqueue,
    C::Database: sqlx::Database<Connection = C>,
{
    let mut tx = conn.begin().await.unwrap();
    icq::schedule_in(&mut *tx, table, rolled_back)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    icq::schedule_in(&mut *tx, table, committed).await.unwrap();
    tx.commit().await.unwrap();
}

pub async fn rollback_schedules_nothing_and_commit_runs_once(engine: &'static str) {
    let (db, queue) = setup(engine, "txn").await;
    let table = TableName::default();
    let receipt = SendReceipt {
        order_id: 42,
        email: "a@example.com".into(),
    };
    let command = NewCommand::typed(&receipt).unwrap().context(context());
    let rolled_back = NewCommand::typed(&receipt).unwrap();

    // Rollback: nothing scheduled. Commit: one row.
    match engine {
        "postgres" => {
            let conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
            rollback_then_commit(conn, &table, &rolled_back, &command).await;
        }
        "mysql" => {
            let conn = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
            rollback_then_commit(conn, &table, &rolled_back, &command).await;
        }
        _ => {
            let conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            rollback_then_commit(conn, &table, &rolled_back, &command).await;
        }
    }
    let t = db.q("InternalCommands");
    assert_eq!(db.scalar_i64(&format!("SELECT COUNT(*) FROM {t}")).await, 1);

    type Seen = Vec<(SendReceipt, Job, Option<Context>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let mut registry = Registry::new();
    let sink = seen.clone();
    registry
        .register::<SendReceipt, _, _>(move |cmd, job| {
            let sink = sink.clone();
            async move {
                sink.lock()
                    .unwrap()
                    .push((cmd, job, icq::current_context()));
                Ok(())
            }
        })
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast_settings()));
    run_until_idle(&processor).await;

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "the committed command runs exactly once");
    let (cmd, job, current) = &seen[0];
    assert_eq!(cmd, &receipt);
    assert_eq!(job.id, command.id);
    assert_eq!(job.attempt, 1);
    assert_eq!(&*job.source, "orders");
    assert_eq!(job.context, context());
    assert_eq!(
        current.as_ref(),
        Some(&context()),
        "context restored into the task"
    );
    let stored = row(&queue, &command.id).await;
    assert!(stored.processed_at.is_some());
    assert_eq!(stored.attempts, 1);
    assert!(stored.lock_token.is_none());
}

pub async fn exec_handler_receives_payload_and_context(engine: &'static str) {
    let (_db, queue) = setup(engine, "exec").await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.txt");
    let script = format!(
        "cat > {out}.payload; env | grep '^ICQ_' | sort > {out}",
        out = out.display()
    );
    let mut registry = Registry::new();
    registry
        .insert_exec(
            "orders.send_receipt",
            vec!["sh".into(), "-c".into(), script],
            None,
        )
        .unwrap();
    let payload = serde_json::json!({"order_id": 7, "note": "naïve ✓"});
    let id = queue
        .schedule(&NewCommand::new("orders.send_receipt", payload.clone()).context(context()))
        .await
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast_settings()));
    run_until_idle(&processor).await;

    let got: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{}.payload", out.display())).unwrap(),
    )
    .unwrap();
    assert_eq!(got, payload);
    let env = std::fs::read_to_string(&out).unwrap();
    for expected in [
        format!("ICQ_COMMAND_ID={id}"),
        "ICQ_COMMAND_TYPE=orders.send_receipt".into(),
        "ICQ_ATTEMPT=1".into(),
        "ICQ_SOURCE=orders".into(),
        "ICQ_USER_ID=u-42".into(),
        r#"ICQ_ROLES=["orders.write","staff"]"#.into(),
        "ICQ_TENANT_ID=acme".into(),
        "ICQ_CORRELATION_ID=req-7".into(),
    ] {
        assert!(
            env.lines().any(|l| l == expected),
            "missing {expected} in\n{env}"
        );
    }
    assert!(row(&queue, &id).await.processed_at.is_some());
}

pub async fn failures_follow_the_backoff_curve_then_dead_letter(engine: &'static str) {
    let (_db, queue) = setup(engine, "backoff").await;
    let calls = Arc::new(Mutex::new(0u32));
    let mut registry = Registry::new();
    let counter = calls.clone();
    registry
        .insert(
            "always.fails",
            Arc::new(FnHandler(move |job: Job| {
                let counter = counter.clone();
                async move {
                    *counter.lock().unwrap() += 1;
                    Err(HandlerError::retry(format!(
                        "boom on attempt {}",
                        job.attempt
                    )))
                }
            })),
        )
        .unwrap();

    // First: one failure with a 20 s base, then look at RunAt in the database.
    let id = queue
        .schedule(&NewCommand::new("always.fails", serde_json::json!({})))
        .await
        .unwrap();
    let slow = Settings {
        retry_backoff_base_seconds: 20.0,
        max_retry_backoff_seconds: 600.0,
        max_attempts: 3,
        ..fast_settings()
    };
    let mut processor = Processor::new(registry.clone());
    processor.add_source(queue.source_handle(slow));
    let before = chrono::Utc::now();
    let q = queue.clone();
    assert!(
        run_until(processor, Duration::from_secs(20), || {
            let (q, id) = (q.clone(), id.clone());
            async move { row(&q, &id).await.last_error.is_some() }
        })
        .await
    );
    let after_fail = row(&queue, &id).await;
    assert_eq!(
        *calls.lock().unwrap(),
        1,
        "one execution before the 20 s backoff"
    );
    assert_eq!(after_fail.attempts, 1);
    assert_eq!(after_fail.last_error.as_deref(), Some("boom on attempt 1"));
    assert!(after_fail.dead_lettered_at.is_none() && after_fail.lock_token.is_none());
    let delay = (after_fail.run_at - before).num_milliseconds() as f64 / 1000.0;
    assert!(
        (15.0..=25.0).contains(&delay),
        "RunAt {delay}s after the failure, expected 20s ±20%"
    );

    // Then: a fast curve to the end; dead after max_attempts with the last error.
    let id = queue
        .schedule(&NewCommand::new("always.fails", serde_json::json!({})))
        .await
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(Settings {
        max_attempts: 3,
        ..fast_settings()
    }));
    let q = queue.clone();
    assert!(
        run_until(processor, Duration::from_secs(30), || {
            let (q, id) = (q.clone(), id.clone());
            async move { row(&q, &id).await.dead_lettered_at.is_some() }
        })
        .await,
        "dead-lettered after max_attempts"
    );
    let dead = row(&queue, &id).await;
    assert_eq!(
        *calls.lock().unwrap(),
        1 + 3,
        "the second command ran exactly max_attempts times, no run after it died"
    );
    assert_eq!(dead.attempts, 3);
    assert_eq!(dead.last_error.as_deref(), Some("boom on attempt 3"));
    assert!(dead.processed_at.is_none());
}

pub async fn panic_timeout_and_exit_status_each_consume_an_attempt(engine: &'static str) {
    let (_db, queue) = setup(engine, "crashes").await;
    let mut registry = Registry::new();
    registry
        .insert(
            "panics",
            Arc::new(FnHandler(|_job: Job| async move {
                if std::env::var("ICQ_NEVER_SET_IN_TESTS").is_err() {
                    panic!("handler exploded");
                }
                Ok(())
            })),
        )
        .unwrap();
    let sleepy: Arc<dyn icq::Handler> = Arc::new(FnHandler(|_job: Job| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(())
    }));
    registry
        .insert(
            "times.out",
            TimeoutLayer {
                timeout: Duration::from_millis(200),
            }
            .layer(sleepy),
        )
        .unwrap();
    registry
        .insert_exec(
            "exits.nonzero",
            vec![
                "sh".into(),
                "-c".into(),
                "echo 'disk full' >&2; exit 3".into(),
            ],
            None,
        )
        .unwrap();
    registry
        .insert_exec(
            "exec.times.out",
            vec![
                "sh".into(),
                "-c".into(),
                "sleep 30 & sleep 30; exit 0".into(),
            ],
            Some(Duration::from_millis(300)),
        )
        .unwrap();
    let mut ids = Vec::new();
    for ty in ["panics", "times.out", "exits.nonzero", "exec.times.out"] {
        ids.push(
            queue
                .schedule(&NewCommand::new(ty, serde_json::json!({})))
                .await
                .unwrap(),
        );
    }
    let settings = Settings {
        retry_backoff_base_seconds: 60.0,
        max_retry_backoff_seconds: 600.0,
        ..fast_settings()
    };
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(settings));
    let q = queue.clone();
    let ids2 = ids.clone();
    assert!(
        run_until(processor, Duration::from_secs(20), || {
            let (q, ids) = (q.clone(), ids2.clone());
            async move {
                for id in ids {
                    if row(&q, &id).await.last_error.is_none() {
                        return false;
                    }
                }
                true
            }
        })
        .await
    );
    let expected = [
        "handler panicked: handler exploded",
        "timed out after 0.2s",
        "exit status 3: disk full",
        "timed out after 0.3s; process group killed",
    ];
    for (id, message) in ids.into_iter().zip(expected) {
        let r = row(&queue, &id).await;
        assert_eq!(r.attempts, 1, "{message}");
        assert_eq!(r.last_error.as_deref(), Some(message));
        assert!(r.dead_lettered_at.is_none() && r.processed_at.is_none());
        assert!(
            r.run_at > chrono::Utc::now() + chrono::Duration::seconds(30),
            "retry scheduled by backoff"
        );
    }
}

pub async fn unknown_type_and_missing_role_dead_letter_at_once(engine: &'static str) {
    let (_db, queue) = setup(engine, "terminal").await;
    let calls = Arc::new(Mutex::new(0u32));
    let counter = calls.clone();
    let guarded: Arc<dyn icq::Handler> = Arc::new(FnHandler(move |_job: Job| {
        let counter = counter.clone();
        async move {
            *counter.lock().unwrap() += 1;
            Ok(())
        }
    }));
    let mut registry = Registry::new();
    registry
        .insert(
            "admin.only",
            AuthorizeLayer {
                required: vec!["admin".into()],
            }
            .layer(guarded),
        )
        .unwrap();
    let unknown = queue
        .schedule(&NewCommand::new("nobody.handles", serde_json::json!({})))
        .await
        .unwrap();
    let forbidden = queue
        .schedule(&NewCommand::new("admin.only", serde_json::json!({})).context(context()))
        .await
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast_settings()));
    run_until_idle(&processor).await;

    let r = row(&queue, &unknown).await;
    assert!(r.dead_lettered_at.is_some());
    assert_eq!(r.attempts, 1);
    assert!(
        r.last_error
            .unwrap()
            .contains("no handler is registered for command type `nobody.handles`")
    );
    let r = row(&queue, &forbidden).await;
    assert!(r.dead_lettered_at.is_some());
    assert_eq!(r.attempts, 1);
    assert_eq!(
        r.last_error.as_deref(),
        Some("forbidden: principal u-42 lacks required role(s) admin")
    );
    assert_eq!(*calls.lock().unwrap(), 0, "the handler is never called");
}

pub async fn four_processors_drain_5000_exactly_once(engine: &'static str) {
    let (db, queue) = setup(engine, "drain").await;
    let commands: Vec<NewCommand> = (0..5000)
        .map(|i| NewCommand::new("count.me", serde_json::json!({ "n": i })))
        .collect();
    queue.schedule_many(&commands).await.unwrap();
    let runs: Arc<Mutex<HashMap<CommandId, u32>>> = Arc::default();
    let mut processors = Vec::new();
    for _ in 0..4 {
        let sink = runs.clone();
        let mut registry = Registry::new();
        registry
            .insert(
                "count.me",
                Arc::new(FnHandler(move |job: Job| {
                    let sink = sink.clone();
                    async move {
                        *sink.lock().unwrap().entry(job.id).or_default() += 1;
                        Ok(())
                    }
                })),
            )
            .unwrap();
        let mut processor = Processor::new(registry);
        // A separate pool per processor, as separate replicas would have.
        processor.add_source(connect(&db).await.source_handle(Settings {
            batch_size: 100,
            concurrency: 16,
            ..fast_settings()
        }));
        processors.push(processor);
    }
    let started = Instant::now();
    // Each run panics (failing the test) unless it reached idle without an error.
    futures::future::join_all(processors.iter().map(run_until_idle)).await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 5000, "every command ran");
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "commands run more than once: {twice:?}");
    let t = db.q("InternalCommands");
    let processed = db.q("ProcessedAt");
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {processed} IS NOT NULL"
        ))
        .await,
        5000
    );
    eprintln!(
        "{engine}: 4 processors drained 5000 commands in {:?}",
        started.elapsed()
    );
}

/// A handler running 3.5× its lease under two workers runs once: the live worker keeps
/// extending its lease, so the other never claims the row.
pub async fn lease_is_renewed_while_the_handler_runs(engine: &'static str) {
    let (db, queue) = setup(engine, "renew").await;
    let id = queue
        .schedule(&NewCommand::new("slow", serde_json::json!({})))
        .await
        .unwrap();
    let runs = Arc::new(Mutex::new(0u32));
    let registry = || {
        let runs = runs.clone();
        let mut registry = Registry::new();
        registry
            .insert(
                "slow",
                Arc::new(FnHandler(move |_job: Job| {
                    let runs = runs.clone();
                    async move {
                        *runs.lock().unwrap() += 1;
                        tokio::time::sleep(Duration::from_millis(3500)).await;
                        Ok(())
                    }
                })),
            )
            .unwrap();
        registry
    };
    let short_lease = Settings {
        lease_seconds: 1,
        ..fast_settings()
    };
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let q = connect(&db).await;
        let mut processor = Processor::new(registry());
        processor.add_source(q.source_handle(short_lease.clone()));
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            processor.run(RunOptions::default(), stop).await
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while row(&queue, &id).await.processed_at.is_none() {
        assert!(Instant::now() < deadline, "the slow command completed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
    assert_eq!(*runs.lock().unwrap(), 1, "ran once, never alongside itself");
    assert_eq!(row(&queue, &id).await.attempts, 1);
}

/// A lease that passes to another claim while the handler runs stops the execution, and
/// its outcome is dropped as stale instead of overwriting the new claim's row.
pub async fn stale_lease_outcome_is_dropped(engine: &'static str) {
    let (db, queue) = setup(engine, "stale").await;
    let id = queue
        .schedule(&NewCommand::new("slow.then.fail", serde_json::json!({})))
        .await
        .unwrap();
    let started = Arc::new(tokio::sync::Notify::new());
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    struct OnDrop(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let mut registry = Registry::new();
    let (signal, flag) = (started.clone(), dropped.clone());
    registry
        .insert(
            "slow.then.fail",
            Arc::new(FnHandler(move |_job: Job| {
                let (signal, guard) = (signal.clone(), OnDrop(flag.clone()));
                async move {
                    let _guard = guard;
                    signal.notify_one();
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Err(HandlerError::retry("A failed late"))
                }
            })),
        )
        .unwrap();
    let settings = Settings {
        lease_seconds: 1,
        ..fast_settings()
    };
    let queue_a = connect(&db).await;
    let mut processor = Processor::new(registry);
    processor.add_source(queue_a.source_handle(settings));
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { processor.run(RunOptions::default(), stop).await }
    });
    started.notified().await;
    // Another claim takes the row over (as if A's lease had lapsed).
    let t = db.q("InternalCommands");
    let (lock, id_col) = (db.q("LockToken"), db.q("Id"));
    let other = "00000000-0000-4000-8000-000000000001";
    db.execute(&format!(
        "UPDATE {t} SET {lock} = '{other}' WHERE {id_col} = '{id}'"
    ))
    .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dropped.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "A's handler was stopped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    let r = row(&queue, &id).await;
    assert_eq!(
        r.lock_token.map(|t| t.to_string()).as_deref(),
        Some(other),
        "the new claim still holds the row"
    );
    assert_eq!(r.last_error, None, "A's outcome was dropped");
    assert_eq!(
        r.attempts, 1,
        "A's release did not give back the new claim's attempt"
    );
    assert_eq!(
        queue_a.stats().snapshot().stale,
        1,
        "A counted one stale outcome"
    );
}

pub async fn shutdown_releases_unstarted_and_finishes_in_flight(engine: &'static str) {
    let (_db, queue) = setup(engine, "shutdown").await;
    let finished = Arc::new(Mutex::new(0u32));
    let counter = finished.clone();
    let mut registry = Registry::new();
    registry
        .insert(
            "takes.a.while",
            Arc::new(FnHandler(move |_job: Job| {
                let counter = counter.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    *counter.lock().unwrap() += 1;
                    Ok(())
                }
            })),
        )
        .unwrap();
    let id = queue
        .schedule(&NewCommand::new("takes.a.while", serde_json::json!({})))
        .await
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast_settings()));
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { processor.run(RunOptions::default(), stop).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(
        *finished.lock().unwrap(),
        1,
        "the in-flight command finished"
    );
    assert!(
        row(&queue, &id).await.processed_at.is_some(),
        "and its outcome was stamped"
    );

    // With a grace period too short for the handler, the lease is released instead.
    let id = queue
        .schedule(&NewCommand::new("takes.a.while", serde_json::json!({})))
        .await
        .unwrap();
    let mut registry = Registry::new();
    registry
        .insert(
            "takes.a.while",
            Arc::new(FnHandler(|_job: Job| async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(())
            })),
        )
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast_settings()));
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move {
            processor
                .run(
                    RunOptions {
                        until_idle: false,
                        shutdown_grace: Duration::from_millis(200),
                    },
                    stop,
                )
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(row(&queue, &id).await.lock_token.is_some(), "claimed");
    stop.cancel();
    run.await.unwrap().unwrap();
    let r = row(&queue, &id).await;
    assert!(
        r.lock_token.is_none() && r.locked_until.is_none(),
        "lease released"
    );
    assert_eq!(r.attempts, 0, "the unfinished attempt is given back");
    assert!(r.processed_at.is_none());
}

pub async fn notify_wakes_processor_without_polling() {
    let (db, queue) = setup("postgres", "notify").await;
    let started: Arc<Mutex<Option<Instant>>> = Arc::default();
    let sink = started.clone();
    let mut registry = Registry::new();
    registry
        .insert(
            "wake.me",
            Arc::new(FnHandler(move |_job: Job| {
                let sink = sink.clone();
                async move {
                    sink.lock().unwrap().get_or_insert_with(Instant::now);
                    Ok(())
                }
            })),
        )
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(Settings {
        polling_interval_seconds: 30.0,
        ..Settings::default()
    }));
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { processor.run(RunOptions::default(), stop).await }
    });
    // Let the processor finish its first (empty) claim and go to sleep on the poll.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let committed = {
        let mut tx = conn.begin().await.unwrap();
        sqlx::query(
            r#"INSERT INTO "InternalCommands" ("Type", "Payload") VALUES ('wake.me', '{}')"#,
        )
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        Instant::now()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let latency = loop {
        if let Some(at) = *started.lock().unwrap() {
            break at.saturating_duration_since(committed);
        }
        assert!(Instant::now() < deadline, "the processor never woke up");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    stop.cancel();
    run.await.unwrap().unwrap();
    eprintln!("commit-to-start latency: {latency:?}");
    assert!(
        latency < Duration::from_millis(100),
        "started {latency:?} after commit; want < 100 ms with a 30 s poll"
    );
}
