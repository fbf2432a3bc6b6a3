//! Queue semantics shared by every engine (the product contract).

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
    Settings::default()
        .with_polling_interval_seconds(0.05)
        .with_retry_backoff_base_seconds(0.05)
        .with_max_retry_backoff_seconds(0.2)
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
            RunOptions::default().with_until_idle(true),
            CancellationToken::new(),
        ),
    )
    .await
    .expect("processor reached idle within 60s")
    .expect("processor run");
}

/// Waits (at most 20 s) for `signal`, which a handler fires when it starts.
async fn wait_notified(signal: &tokio::sync::Notify, what: &str) {
    tokio::time::timeout(Duration::from_secs(20), signal.notified())
        .await
        .unwrap_or_else(|_| panic!("{what} within 20 s"));
}

/// Polls `check` every 20 ms until it holds; fails naming `what` after `limit`.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `processor` in a task until the returned token is cancelled.
fn run_until_stopped(
    processor: Processor,
    options: RunOptions,
) -> (CancellationToken, tokio::task::JoinHandle<icq::Result<()>>) {
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { processor.run(options, stop).await }
    });
    (stop, run)
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
    let slow = fast_settings()
        .with_retry_backoff_base_seconds(20.0)
        .with_max_retry_backoff_seconds(600.0)
        .with_max_attempts(3);
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
    processor.add_source(queue.source_handle(fast_settings().with_max_attempts(3)));
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
    // The wrapper backgrounds a grandchild, writes its pid and waits on it: past the
    // timeout the whole process group goes, the grandchild included. The timeout leaves
    // a loaded machine seconds to start the shell and write the pid first.
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    registry
        .insert_exec(
            "exec.times.out",
            vec![
                "sh".into(),
                "-c".into(),
                format!("sleep 30 & echo $! > '{}'; wait", pidfile.display()),
            ],
            Some(Duration::from_secs(5)),
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
    // A backoff long past the assertions below however slowly this machine gets there.
    let settings = fast_settings()
        .with_retry_backoff_base_seconds(120.0)
        .with_max_retry_backoff_seconds(600.0);
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(settings));
    let q = queue.clone();
    let ids2 = ids.clone();
    assert!(
        run_until(processor, Duration::from_secs(60), || {
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
        "timed out after 5.0s; process group killed",
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
    let grandchild: i32 = std::fs::read_to_string(&pidfile)
        .expect("the exec handler wrote its grandchild's pid")
        .trim()
        .parse()
        .expect("a pid");
    // The attempt was stamped only after the group was killed; allow the kernel a moment.
    eventually(
        Duration::from_secs(10),
        "the grandchild died",
        || async move { !alive(grandchild) },
    )
    .await;
}

/// Whether `pid` is a live process: `kill -0` succeeds and it is not a zombie (a killed
/// process that init has not reaped yet still answers `kill -0`).
fn alive(pid: i32) -> bool {
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.trim_start().chars().next()
        })
        .is_some_and(|state| !matches!(state, 'Z' | 'X'))
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
        processor.add_source(
            connect(&db)
                .await
                .source_handle(fast_settings().with_batch_size(100).with_concurrency(16)),
        );
        processors.push(processor);
    }
    let started = Instant::now();
    // Each run panics (failing the test) unless it reached idle without an error.
    futures::future::join_all(processors.iter().map(run_until_idle)).await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 5000, "every command ran");
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "commands run more than once: {twice:?}");
    let processed = db.q("ProcessedAt");
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {processed} IS NOT NULL",
            db.all_rows()
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
    let short_lease = fast_settings().with_lease_seconds(1);
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
    let settings = fast_settings().with_lease_seconds(1);
    let queue_a = connect(&db).await;
    let mut processor = Processor::new(registry);
    processor.add_source(queue_a.source_handle(settings));
    let (stop, run) = run_until_stopped(processor, RunOptions::default());
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
    let started = Arc::new(tokio::sync::Notify::new());
    let (counter, signal) = (finished.clone(), started.clone());
    let mut registry = Registry::new();
    registry
        .insert(
            "takes.a.while",
            Arc::new(FnHandler(move |_job: Job| {
                let (counter, signal) = (counter.clone(), signal.clone());
                async move {
                    signal.notify_one();
                    // Still running when the shutdown arrives: the test cancels as soon as
                    // it hears the handler started.
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
    let (stop, run) = run_until_stopped(processor, RunOptions::default());
    wait_notified(&started, "the handler started").await;
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
    let signal = started.clone();
    registry
        .insert(
            "takes.a.while",
            Arc::new(FnHandler(move |_job: Job| {
                let signal = signal.clone();
                async move {
                    signal.notify_one();
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok(())
                }
            })),
        )
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast_settings()));
    let (stop, run) = run_until_stopped(
        processor,
        RunOptions::default()
            .with_until_idle(false)
            .with_shutdown_grace(Duration::from_millis(200)),
    );
    wait_notified(&started, "the handler started").await;
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

/// Shutdown with rows claimed but not started (concurrency 1, four rows in one claim):
/// the buffered rows are released at once, while the running command still runs, with
/// their attempt given back (Attempts 0, lease cleared); the running one finishes within
/// the grace and is stamped completed; nothing else ran.
pub async fn shutdown_releases_buffered_rows_at_once(engine: &'static str) {
    let (db, queue) = setup(engine, "buffered").await;
    let started = Arc::new(tokio::sync::Notify::new());
    let finish = Arc::new(tokio::sync::Notify::new());
    let runs: Arc<Mutex<Vec<CommandId>>> = Arc::default();
    let mut registry = Registry::new();
    let (signal, gate, sink) = (started.clone(), finish.clone(), runs.clone());
    registry
        .insert(
            "one.at.a.time",
            Arc::new(FnHandler(move |job: Job| {
                let (signal, gate, sink) = (signal.clone(), gate.clone(), sink.clone());
                async move {
                    sink.lock().unwrap().push(job.id);
                    signal.notify_one();
                    gate.notified().await;
                    Ok(())
                }
            })),
        )
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(
            queue
                .schedule(&NewCommand::new("one.at.a.time", serde_json::json!({})))
                .await
                .unwrap(),
        );
    }
    let mut processor = Processor::new(registry);
    processor
        .add_source(queue.source_handle(fast_settings().with_concurrency(1).with_batch_size(10)));
    let (stop, run) = run_until_stopped(
        processor,
        RunOptions::default()
            .with_until_idle(false)
            .with_shutdown_grace(Duration::from_secs(30)),
    );
    wait_notified(&started, "the first command started").await;
    let (t, lock, attempts) = (
        db.q("InternalCommands"),
        db.q("LockToken"),
        db.q("Attempts"),
    );
    // A worker claims its free slots plus a look-ahead paced by the commands it finishes
    // with its one slot blocked from the start the look-ahead is 0, so the
    // other three may be buffered or not claimed at all. Either way, shutdown must leave
    // them pending, unleased and with no attempt charged while the first still runs.
    let running = runs.lock().unwrap()[0].clone();
    stop.cancel();

    let given_back = format!(
        "SELECT COUNT(*) FROM {t} WHERE {lock} IS NULL AND {} IS NULL AND {attempts} = 0 AND {} IS NULL",
        db.q("LockedUntil"),
        db.q("ProcessedAt")
    );
    eventually(
        Duration::from_secs(10),
        "the three rows that never started released (or never claimed) while the first still runs",
        || {
            let (db, sql) = (&db, &given_back);
            async move { db.scalar_i64(sql).await == 3 }
        },
    )
    .await;
    assert!(
        !run.is_finished(),
        "the processor waits for the running command"
    );
    let r = row(&queue, &running).await;
    assert!(
        r.lock_token.is_some() && r.processed_at.is_none(),
        "the running command keeps its lease meanwhile"
    );
    finish.notify_one();
    run.await.unwrap().unwrap();

    assert_eq!(
        *runs.lock().unwrap(),
        vec![running.clone()],
        "only the first ran"
    );
    let r = row(&queue, &running).await;
    assert!(
        r.processed_at.is_some(),
        "the running command finished and was stamped"
    );
    assert_eq!((r.attempts, r.lock_token), (1, None));
    for id in ids.iter().filter(|id| **id != running) {
        let r = row(&queue, id).await;
        assert_eq!(r.attempts, 0, "the buffered row's attempt was given back");
        assert!(
            r.lock_token.is_none() && r.locked_until.is_none(),
            "lease cleared"
        );
        assert!(r.processed_at.is_none() && r.dead_lettered_at.is_none());
        assert_eq!(r.last_error, None);
    }
}

/// A row younger than `processing_delay_seconds` is not claimed; once it is old enough
/// it is, and runs once (`--until-idle` waits for it instead of exiting).
pub async fn processing_delay_holds_young_rows_back(engine: &'static str) {
    let (_db, queue) = setup(engine, "delay").await;
    let seen: Arc<Mutex<Vec<chrono::DateTime<chrono::Utc>>>> = Arc::default();
    let sink = seen.clone();
    let mut registry = Registry::new();
    registry
        .insert(
            "delayed",
            Arc::new(FnHandler(move |_job: Job| {
                let sink = sink.clone();
                async move {
                    sink.lock().unwrap().push(chrono::Utc::now());
                    Ok(())
                }
            })),
        )
        .unwrap();
    let id = queue
        .schedule(&NewCommand::new("delayed", serde_json::json!({})))
        .await
        .unwrap();
    let delay = 2;
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast_settings().with_processing_delay_seconds(delay)));
    run_until_idle(&processor).await;
    let r = row(&queue, &id).await;
    let ran = seen.lock().unwrap().clone();
    assert_eq!(ran.len(), 1, "ran once");
    let age = (ran[0] - r.created_at).num_milliseconds();
    assert!(
        age >= delay as i64 * 1000 - 50,
        "started {age} ms after it was created, before the {delay} s processing delay"
    );
    assert!(age < 10_000, "started {age} ms after it was created");
    assert_eq!(r.attempts, 1, "claimed once, when it was old enough");
    assert!(r.processed_at.is_some());
}

/// SQL for the instant `seconds` before now on `db`'s engine.
fn ago(db: &TestDb, seconds: i64) -> String {
    match db.engine {
        "postgres" => format!("(now() - make_interval(secs => {seconds}))"),
        "mysql" => format!("(UTC_TIMESTAMP(6) - INTERVAL {seconds} SECOND)"),
        _ => format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-{seconds} seconds')"),
    }
}

/// The processor's sweep loop deletes every completed row older than `retention_days`
/// (2,500 of them: more than one batch) and nothing else: dead letters as old, pending
/// rows as old and recent completed rows all stay.
pub async fn retention_sweep_loop_keeps_dead_letters(engine: &'static str) {
    let (db, queue) = setup(engine, "sweeploop").await;
    let old: Vec<NewCommand> = (0..2500)
        .map(|i| NewCommand::new("old.done", serde_json::json!({ "n": i })))
        .collect();
    queue.schedule_many(&old).await.unwrap();
    let mut kinds = Vec::new();
    for ty in [
        "old.dead",
        "old.dead",
        "old.dead",
        "recent.done",
        "recent.done",
    ] {
        kinds.push(NewCommand::new(ty, serde_json::json!({})));
    }
    for _ in 0..2 {
        kinds.push(
            NewCommand::new("old.scheduled", serde_json::json!({}))
                .delay(Duration::from_secs(86_400)),
        );
    }
    queue.schedule_many(&kinds).await.unwrap();
    let (t, ty) = (db.q("InternalCommands"), db.q("Type"));
    let (processed, dead, created) = (
        db.q("ProcessedAt"),
        db.q("DeadLetteredAt"),
        db.q("CreatedAt"),
    );
    let month = 30 * 86_400;
    db.execute(&format!(
        "UPDATE {t} SET {processed} = {}, {created} = {} WHERE {ty} = 'old.done'",
        ago(&db, month),
        ago(&db, month + 60)
    ))
    .await;
    db.execute(&format!(
        "UPDATE {t} SET {dead} = {}, {created} = {} WHERE {ty} = 'old.dead'",
        ago(&db, month),
        ago(&db, month + 60)
    ))
    .await;
    db.execute(&format!(
        "UPDATE {t} SET {processed} = {} WHERE {ty} = 'recent.done'",
        ago(&db, 86_400)
    ))
    .await;
    db.execute(&format!(
        "UPDATE {t} SET {created} = {} WHERE {ty} = 'old.scheduled'",
        ago(&db, month)
    ))
    .await;
    // The table and its history: the sweep moves completed rows left in the table there.
    let all = db.all_rows();
    let count = |what: &str| format!("SELECT COUNT(*) FROM {all} WHERE {ty} = '{what}'");
    assert_eq!(db.scalar_i64(&count("old.done")).await, 2500);

    let mut registry = Registry::new();
    registry
        .insert("unused", Arc::new(icq::handler::Noop))
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast_settings().with_retention_days(7)));
    let old_done = count("old.done");
    assert!(
        run_until(processor, Duration::from_secs(30), || {
            let (db, sql) = (&db, &old_done);
            async move { db.scalar_i64(sql).await == 0 }
        })
        .await,
        "the sweep deleted the old completed rows"
    );
    assert_eq!(
        db.scalar_i64(&format!("{} AND {dead} IS NOT NULL", count("old.dead")))
            .await,
        3,
        "dead letters are never swept, however old"
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "{} AND {processed} IS NULL AND {dead} IS NULL",
            count("old.scheduled")
        ))
        .await,
        2,
        "pending rows are never swept, however old"
    );
    assert_eq!(
        db.scalar_i64(&count("recent.done")).await,
        2,
        "completed rows younger than retention_days stay"
    );
}

/// On PostgreSQL an insert committed by any client wakes an idle processor through the
/// migration's trigger and LISTEN, without waiting for the poll.
///
/// No sleep decides when the processor is idle: a canary row is processed first, so the
/// processor has made its claims and waits on a 120 s poll; the commit then has to be
/// picked up well before that poll could fire, which only the notification can do.
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
    registry
        .insert("canary", Arc::new(icq::handler::Noop))
        .unwrap();
    let canary = queue
        .schedule(&NewCommand::new("canary", serde_json::json!({})))
        .await
        .unwrap();
    // Long enough that the processor's start and the canary, however slow on a loaded
    // machine, leave the window below wide: the poll cannot fire before it has passed
    // since the processor started.
    let poll = Duration::from_secs(120);
    let mut processor = Processor::new(registry);
    processor.add_source(
        queue.source_handle(Settings::default().with_polling_interval_seconds(poll.as_secs_f64())),
    );
    let run_started = Instant::now();
    let (stop, run) = run_until_stopped(processor, RunOptions::default());
    // The canary's claim is followed at once by another, empty one; once the canary is
    // stamped the processor has nothing left to do but wait for the poll or a wake-up.
    let q = queue.clone();
    eventually(Duration::from_secs(45), "the canary was processed", || {
        let (q, id) = (q.clone(), canary.clone());
        async move { row(&q, &id).await.processed_at.is_some() }
    })
    .await;
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
    // The poll cannot fire before `poll` has passed since the processor's last empty
    // claim, which came after it started: anything sooner was the notification.
    let deadline = run_started + poll / 2;
    let latency = loop {
        if let Some(at) = *started.lock().unwrap() {
            break at.saturating_duration_since(committed);
        }
        assert!(
            Instant::now() < deadline,
            "the processor did not wake up within {:?} of the commit (poll {poll:?})",
            deadline.saturating_duration_since(committed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    stop.cancel();
    run.await.unwrap().unwrap();
    eprintln!("commit-to-start latency: {latency:?}");
    assert!(
        latency < poll / 2,
        "started {latency:?} after commit: that was the poll, not the notification"
    );
    assert_eq!(
        queue.stats().snapshot().claimed,
        2,
        "the canary and the woken command, each claimed once"
    );
}
