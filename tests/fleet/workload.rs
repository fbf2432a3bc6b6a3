//! Workload control as a processor sees it, on every engine: named
//! queues with their own slots (a slow queue never starves another), priorities claimed
//! in order, snooze (exec exit 75, http 429 + Retry-After, Rust) that keeps `Attempts`
//! and is bounded by `max_snoozes`, and an operator's cancel stopping a running exec
//! handler and a running Rust handler on another replica within 2 s on PostgreSQL
//! (notification) and 5 s elsewhere (the lease check every second).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use icq::handler::FnHandler;
use icq::settings::QueueSettings;
use icq::{HandlerError, Job, NewCommand, Processor, Registry, RunOptions, Settings};
use tokio_util::sync::CancellationToken;

use super::support::{RUNTIME_ENGINES, TestDb};
use super::{Replica, wait_until, write_config};

/// Opens the test database's default table as source `main` with `settings`.
async fn open(db: &TestDb, settings: &Settings) -> icq::Queue {
    let options = icq::ConnectOptions::for_settings(settings);
    icq::Queue::connect("main", &db.url, &Default::default(), &options)
        .await
        .unwrap()
}

/// A processor over `source` with `registry`, running in the background until the
/// returned token is cancelled.
fn start(
    registry: Registry,
    source: &icq::Queue,
    settings: &Settings,
    grace: Duration,
) -> (CancellationToken, tokio::task::JoinHandle<icq::Result<()>>) {
    let mut processor = Processor::new(registry);
    processor.add_source(source.source_handle(settings.clone()));
    let shutdown = CancellationToken::new();
    let options = RunOptions::default().with_shutdown_grace(grace);
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { processor.run(options, shutdown).await }
    });
    (shutdown, task)
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn on_queue(type_name: &str, queue: &str, payload: serde_json::Value) -> NewCommand {
    let mut command = NewCommand::new(type_name, payload);
    command.queue = queue.into();
    command
}

fn p99(latencies: &mut [u64]) -> u64 {
    latencies.sort_unstable();
    let at = ((latencies.len() as f64) * 0.99).ceil() as usize;
    latencies[at.clamp(1, latencies.len()) - 1]
}

/// 8 five-second webhooks on queue `webhooks` (concurrency 2) scheduled before 100
/// one-millisecond receipts on `default` (concurrency 8): every receipt runs while the
/// first two webhooks still hold their queue's slots (none has finished, none other has
/// started), so no receipt waited for a webhook. The receipts' p99 latency (schedule to
/// start) beside the webhooks and on an idle worker are printed; the bound on it is half
/// a webhook, far from either, so a loaded machine's timers cannot fail the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_queue_never_starves_another() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "starve").await;
        let settings = Settings::default()
            .with_polling_interval_seconds(0.2)
            .with_queues(vec![
                QueueSettings::new("default", 8),
                QueueSettings::new("webhooks", 2),
            ]);
        let source = open(&db, &settings).await;
        let latencies = Arc::new(Mutex::new(Vec::<u64>::new()));
        let webhooks_started = Arc::new(AtomicU32::new(0));
        let webhooks_finished = Arc::new(AtomicU32::new(0));
        let mut registry = Registry::new();
        registry
            .insert(
                "receipt",
                Arc::new(FnHandler({
                    let latencies = latencies.clone();
                    move |job: Job| {
                        let latencies = latencies.clone();
                        async move {
                            let at = job.payload["at"].as_u64().unwrap();
                            latencies
                                .lock()
                                .unwrap()
                                .push(epoch_ms().saturating_sub(at));
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            Ok(())
                        }
                    }
                })),
            )
            .unwrap();
        registry
            .insert(
                "webhook",
                Arc::new(FnHandler({
                    let started = webhooks_started.clone();
                    let finished = webhooks_finished.clone();
                    move |job: Job| {
                        started.fetch_add(1, Ordering::SeqCst);
                        let finished = finished.clone();
                        async move {
                            tokio::select! {
                                _ = tokio::time::sleep(Duration::from_secs(5)) => {
                                    finished.fetch_add(1, Ordering::SeqCst);
                                    Ok(())
                                }
                                _ = job.cancellation.cancelled() => Err(HandlerError::retry("stopped")),
                            }
                        }
                    }
                })),
            )
            .unwrap();
        let (shutdown, worker) = start(registry, &source, &settings, Duration::ZERO);
        let receipts = |n: usize| -> Vec<NewCommand> {
            let at = epoch_ms();
            (0..n)
                .map(|i| {
                    on_queue(
                        "receipt",
                        "default",
                        serde_json::json!({ "at": at, "i": i }),
                    )
                })
                .collect()
        };
        let drained = |n: usize| {
            let latencies = latencies.clone();
            async move {
                wait_until(Duration::from_secs(20), || {
                    let done = latencies.lock().unwrap().len() >= n;
                    async move { done }
                })
                .await
            }
        };
        // Warm up, then the idle baseline.
        source.schedule_many(&receipts(20)).await.unwrap();
        assert!(drained(20).await, "{engine}: warm-up receipts did not run");
        latencies.lock().unwrap().clear();
        source.schedule_many(&receipts(100)).await.unwrap();
        assert!(drained(100).await, "{engine}: idle receipts did not run");
        let idle = p99(&mut latencies.lock().unwrap());
        latencies.lock().unwrap().clear();

        // The slow webhooks first, then the receipts.
        let hooks: Vec<NewCommand> = (0..8)
            .map(|i| on_queue("webhook", "webhooks", serde_json::json!({ "i": i })))
            .collect();
        source.schedule_many(&hooks).await.unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || {
                let n = webhooks_started.load(Ordering::SeqCst);
                async move { n >= 2 }
            })
            .await,
            "{engine}: webhooks did not start"
        );
        source.schedule_many(&receipts(100)).await.unwrap();
        assert!(drained(100).await, "{engine}: receipts starved");
        let loaded = p99(&mut latencies.lock().unwrap());
        assert_eq!(
            webhooks_finished.load(Ordering::SeqCst),
            0,
            "{engine}: the receipts ran only after a webhook finished"
        );
        // The webhooks queue holds only its own 2 slots meanwhile.
        assert_eq!(
            webhooks_started.load(Ordering::SeqCst),
            2,
            "{engine}: more webhooks ran at once than their queue's concurrency"
        );
        shutdown.cancel();
        worker.await.unwrap().unwrap();
        eprintln!("{engine}: receipts p99 idle {idle} ms, beside 8 slow webhooks {loaded} ms");
        assert!(
            loaded < 2_500,
            "{engine}: receipts p99 {loaded} ms beside slow webhooks (idle: {idle} ms)"
        );
    }
}

/// A single worker with one slot runs rows scheduled in reverse priority order by
/// priority (lower first), then by `RunAt`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_are_claimed_in_order() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "priority").await;
        let settings = Settings::default().with_concurrency(1).with_batch_size(3);
        let source = open(&db, &settings).await;
        let order = Arc::new(Mutex::new(Vec::<i64>::new()));
        let mut registry = Registry::new();
        registry
            .insert(
                "p",
                Arc::new(FnHandler({
                    let order = order.clone();
                    move |job: Job| {
                        order
                            .lock()
                            .unwrap()
                            .push(job.payload["p"].as_i64().unwrap());
                        async { Ok(()) }
                    }
                })),
            )
            .unwrap();
        // Scheduled from the last to run to the first, with the default in the middle.
        let priorities = [5i16, 3, 0, -1, -7, 2, i16::MAX, i16::MIN, 1, 0];
        for p in priorities {
            let mut command = NewCommand::new("p", serde_json::json!({ "p": p }));
            command.priority = p;
            source.schedule(&command).await.unwrap();
        }
        let mut processor = Processor::new(registry);
        processor.add_source(source.source_handle(settings.clone()));
        let options = RunOptions::default().with_until_idle(true);
        processor.run(options, Default::default()).await.unwrap();
        let mut expected: Vec<i64> = priorities.iter().map(|&p| i64::from(p)).collect();
        expected.sort();
        let ran = order.lock().unwrap().clone();
        let mut sorted = ran.clone();
        sorted.sort();
        assert_eq!(sorted, expected, "{engine}: each ran once");
        // Each claim takes the due rows in priority order and hands them to the slot in
        // that order; two claims in flight (MariaDB runs two, PostgreSQL up to four) may
        // come back in either order, so the rows of two neighbouring claims can swap: at
        // most batch × batch pairs out of order (scheduled in reverse, 45 of 45 would be).
        let inversions = (0..ran.len())
            .flat_map(|i| (i + 1..ran.len()).map(move |j| (i, j)))
            .filter(|&(i, j)| ran[i] > ran[j])
            .count();
        assert!(
            inversions <= (settings.batch_size * settings.batch_size) as usize,
            "{engine}: ran in {ran:?}, {inversions} pairs out of priority order"
        );
    }
}

/// A one-response-at-a-time HTTP server: the first request gets `429 Too Many Requests`
/// with `Retry-After: 1`, every later one `204`.
async fn busy_once_server() -> (String, Arc<AtomicU32>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicU32::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => head.extend_from_slice(&buf[..k]),
                    }
                }
                let answer = if n == 0 {
                    "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                } else {
                    "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
                };
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

/// An HTTP server answering every request `429 Too Many Requests` with `retry_after` as
/// its `Retry-After`, counting the requests.
async fn always_busy_server(retry_after: &'static str) -> (String, Arc<AtomicU32>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicU32::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => head.extend_from_slice(&buf[..k]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {retry_after}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

/// Reads `Attempts`, `Snoozes`, `LastError` and whether the row completed / is dead, by
/// type (one row per type).
async fn row_state(db: &TestDb, ty: &str) -> (i64, i64, Option<String>, bool, bool) {
    use sqlx::{Connection, Row};
    let (t, q) = (db.all_rows(), |c: &str| db.q(c));
    let sql = format!(
        "SELECT {a}, {s}, {e}, CASE WHEN {p} IS NULL THEN 0 ELSE 1 END AS done, \
         CASE WHEN {d} IS NULL THEN 0 ELSE 1 END AS dead FROM {t} WHERE {ty_col} = '{ty}'",
        a = q("Attempts"),
        s = q("Snoozes"),
        e = q("LastError"),
        p = q("ProcessedAt"),
        d = q("DeadLetteredAt"),
        ty_col = q("Type"),
    );
    let sql = sqlx::AssertSqlSafe(sql);
    macro_rules! read {
        ($conn:ty) => {{
            let mut c = <$conn>::connect(&db.url).await.unwrap();
            let row = sqlx::query(sql).fetch_one(&mut c).await.unwrap();
            let int = |i: usize| {
                row.try_get::<i64, _>(i)
                    .or_else(|_| row.try_get::<i32, _>(i).map(i64::from))
                    .unwrap()
            };
            (
                int(0),
                int(1),
                row.get::<Option<String>, _>(2),
                int(3) == 1,
                int(4) == 1,
            )
        }};
    }
    match db.engine {
        "postgres" => read!(sqlx::PgConnection),
        "mysql" => read!(sqlx::MySqlConnection),
        _ => read!(sqlx::SqliteConnection),
    }
}

/// Exec exit 75 + `snooze 1`, http 429 + `Retry-After: 1` and a Rust
/// `HandlerError::snooze` each run again about a second later and complete with one
/// attempt consumed (the snooze gave its attempt back) and `Snoozes` = 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snooze_keeps_attempts() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "snooze").await;
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("snoozed-once");
        let settings = Settings::default().with_polling_interval_seconds(0.2);
        let source = open(&db, &settings).await;
        let (url, requests) = busy_once_server().await;
        let mut registry = Registry::new();
        let script = format!(
            "if [ -e {m} ]; then exit 0; fi; touch {m}; echo working; echo 'snooze 1'; exit 75",
            m = marker.display()
        );
        registry
            .insert_exec("exec.snooze", vec!["sh".into(), "-c".into(), script], None)
            .unwrap();
        registry
            .insert(
                "http.snooze",
                Arc::new(
                    icq::handler::http::HttpHandler::new(&url, &Default::default(), None).unwrap(),
                ),
            )
            .unwrap();
        let calls = Arc::new(AtomicU32::new(0));
        registry
            .insert(
                "rust.snooze",
                Arc::new(FnHandler({
                    let calls = calls.clone();
                    move |_job: Job| {
                        let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
                        async move {
                            if first {
                                Err(HandlerError::snooze(Duration::from_secs(1)))
                            } else {
                                Ok(())
                            }
                        }
                    }
                })),
            )
            .unwrap();
        let started = Instant::now();
        for ty in ["exec.snooze", "http.snooze", "rust.snooze"] {
            source
                .schedule(&NewCommand::new(ty, serde_json::json!({})))
                .await
                .unwrap();
        }
        let (shutdown, worker) = start(registry, &source, &settings, Duration::from_secs(5));
        let stats = source.stats().clone();
        let done = wait_until(Duration::from_secs(20), || {
            let s = stats.snapshot();
            async move { s.succeeded >= 3 }
        })
        .await;
        shutdown.cancel();
        worker.await.unwrap().unwrap();
        assert!(done, "{engine}: {:?}", source.stats().snapshot());
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "{engine}: ran again before the snooze delay"
        );
        assert_eq!(source.stats().snapshot().snoozed, 3, "{engine}");
        assert_eq!(requests.load(Ordering::SeqCst), 2, "{engine}");
        for ty in ["exec.snooze", "http.snooze", "rust.snooze"] {
            let (attempts, snoozes, last_error, done, dead) = row_state(&db, ty).await;
            assert_eq!(
                (attempts, snoozes, last_error, done, dead),
                (1, 1, None, true, false),
                "{engine} {ty}"
            );
        }
    }
}

/// A snooze of no time still waits: an endpoint answering 429 with `Retry-After: 0` (or
/// a date already past), an exec program printing `snooze 0` and a Rust
/// `HandlerError::snooze(Duration::ZERO)` each run about once a second, not as fast as
/// the worker can claim, and none of their attempts is consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_snooze_still_waits_and_keeps_attempts() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "snooze_zero").await;
        let dir = tempfile::tempdir().unwrap();
        let runs_file = dir.path().join("exec-runs");
        let settings = Settings::default().with_polling_interval_seconds(0.05);
        let source = open(&db, &settings).await;
        let (zero_url, zero_posts) = always_busy_server("0").await;
        let (past_url, past_posts) = always_busy_server("Thu, 01 Jan 1970 00:00:00 GMT").await;
        let mut registry = Registry::new();
        for (ty, url) in [("http.zero", &zero_url), ("http.past", &past_url)] {
            let handler = icq::handler::http::HttpHandler::new(url, &Default::default(), None);
            registry.insert(ty, Arc::new(handler.unwrap())).unwrap();
        }
        let script = format!(
            "echo run >> {runs}; echo 'snooze 0'; exit 75",
            runs = runs_file.display()
        );
        registry
            .insert_exec("exec.zero", vec!["sh".into(), "-c".into(), script], None)
            .unwrap();
        let rust_calls = Arc::new(AtomicU32::new(0));
        registry
            .insert(
                "rust.zero",
                Arc::new(FnHandler({
                    let calls = rust_calls.clone();
                    move |_job: Job| {
                        calls.fetch_add(1, Ordering::SeqCst);
                        async { Err(HandlerError::snooze(Duration::ZERO)) }
                    }
                })),
            )
            .unwrap();
        let types = ["http.zero", "http.past", "exec.zero", "rust.zero"];
        for ty in types {
            source
                .schedule(&NewCommand::new(ty, serde_json::json!({})))
                .await
                .unwrap();
        }
        let counts = {
            let (zero, past, rust) = (zero_posts.clone(), past_posts.clone(), rust_calls.clone());
            let runs_file = runs_file.clone();
            move || {
                let exec = std::fs::read_to_string(&runs_file)
                    .map(|t| t.lines().count() as u32)
                    .unwrap_or(0);
                [
                    zero.load(Ordering::SeqCst),
                    past.load(Ordering::SeqCst),
                    exec,
                    rust.load(Ordering::SeqCst),
                ]
            }
        };
        let started = Instant::now();
        let (shutdown, worker) = start(registry, &source, &settings, Duration::from_secs(5));
        // Each runs again after its snooze (at least three runs each), however long a
        // loaded machine takes.
        let ran_again = wait_until(Duration::from_secs(30), || {
            let now = counts();
            async move { now.iter().all(|&n| n >= 3) }
        })
        .await;
        shutdown.cancel();
        worker.await.unwrap().unwrap();
        let elapsed = started.elapsed();
        let runs = counts();
        assert!(ran_again, "{engine}: runs {runs:?} after {elapsed:?}");
        // One run at once, then at most one a second (the floor), with a run of slack.
        let most = elapsed.as_secs() as u32 + 2;
        for (ty, n) in types.iter().zip(runs) {
            assert!(
                n <= most,
                "{engine} {ty}: {n} runs in {elapsed:?} (at most {most}): a zero snooze did not wait"
            );
        }
        for ty in types {
            let (attempts, snoozes, last_error, done, dead) = row_state(&db, ty).await;
            assert_eq!(
                (attempts, last_error, done, dead),
                (0, None, false, false),
                "{engine} {ty}: a snooze consumed an attempt or ended the command"
            );
            assert!(snoozes >= 2, "{engine} {ty}: {snoozes} snoozes");
        }
    }
}

/// A command that snoozes every time is dead-lettered on the snooze past `max_snoozes`,
/// saying how often it snoozed; its attempts were all given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snoozes_are_bounded_by_max_snoozes() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "snooze_bound").await;
        let settings = Settings::default()
            .with_max_snoozes(3)
            .with_polling_interval_seconds(0.05);
        let source = open(&db, &settings).await;
        let mut registry = Registry::new();
        registry
            .insert(
                "always.later",
                Arc::new(FnHandler(|_job: Job| async {
                    Err(HandlerError::snooze(Duration::ZERO))
                })),
            )
            .unwrap();
        source
            .schedule(&NewCommand::new("always.later", serde_json::json!({})))
            .await
            .unwrap();
        let (shutdown, worker) = start(registry, &source, &settings, Duration::from_secs(5));
        let stats = source.stats().clone();
        let dead = wait_until(Duration::from_secs(20), || {
            let s = stats.snapshot();
            async move { s.dead_lettered >= 1 }
        })
        .await;
        shutdown.cancel();
        worker.await.unwrap().unwrap();
        assert!(dead, "{engine}: {:?}", source.stats().snapshot());
        let (attempts, snoozes, last_error, done, dead) = row_state(&db, "always.later").await;
        assert_eq!(
            (attempts, snoozes, done, dead),
            (1, 3, false, true),
            "{engine}"
        );
        let last_error = last_error.unwrap_or_default();
        assert!(
            last_error.contains("snoozed 3 times") && last_error.contains("max_snoozes (3)"),
            "{engine}: {last_error}"
        );
    }
}

/// What an operator's `icq cancel` does to a running row (until the command lands: the
/// statement it runs), and on PostgreSQL the notification.
async fn cancel_running(db: &TestDb) {
    let (t, q) = (db.q("InternalCommands"), |c: &str| db.q(c));
    let now = match db.engine {
        "postgres" => "now()",
        "mysql" => "UTC_TIMESTAMP(6)",
        _ => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    };
    let mut sql = format!(
        "UPDATE {t} SET {d} = {now}, {e} = 'cancelled by operator', {k} = NULL, {u} = NULL \
         WHERE {p} IS NULL AND {d} IS NULL AND {k} IS NOT NULL",
        d = q("DeadLetteredAt"),
        e = q("LastError"),
        k = q("LockToken"),
        u = q("LockedUntil"),
        p = q("ProcessedAt"),
    );
    if db.engine == "postgres" {
        sql = format!("BEGIN; {sql}; SELECT pg_notify('icq_cancel_InternalCommands', ''); COMMIT;");
    }
    db.execute(&sql).await;
}

fn cancel_limit(engine: &str) -> Duration {
    if engine == "postgres" {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(5)
    }
}

fn process_alive(pid: i32) -> bool {
    // The program is reaped by its worker once it died, so its /proc entry goes too.
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `sleep 60` run by an exec handler in another process (`icq work`) stops within 2 s
/// (PostgreSQL) or 5 s (elsewhere) of an operator's cancel; the row ends dead with
/// `LastError = "cancelled by operator"` (the worker's late outcome is dropped), and the
/// worker logs it once, without a stale-stamp warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_running_exec_on_another_replica() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "cancel_exec").await;
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let handlers = format!(
            "  report.render:\n    exec: [\"sh\", \"-c\", \"echo $$$$ > {}; exec sleep 60\"]\n    timeout_seconds: 120\n",
            pidfile.display()
        );
        // A long lease: the cancel must be noticed by the lease check, not a renewal.
        let config = write_config(
            dir.path(),
            &db.url,
            "      lease_seconds: 60\n      polling_interval_seconds: 0.2",
            &handlers,
        );
        let log = dir.path().join("worker.log");
        let mut replica = Replica::start(&[], &config, &[], &[("RUST_LOG", "info")], &log);
        super::insert_many(&db, "report.render", 1).await;
        assert!(
            wait_until(Duration::from_secs(15), || {
                let ready = std::fs::read_to_string(&pidfile)
                    .is_ok_and(|text| text.trim().parse::<i32>().is_ok());
                async move { ready }
            })
            .await,
            "{engine}: the handler did not start"
        );
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(process_alive(pid));
        let asked = Instant::now();
        cancel_running(&db).await;
        let stopped = wait_until(cancel_limit(engine) + Duration::from_secs(3), || {
            let alive = process_alive(pid);
            async move { !alive }
        })
        .await;
        let took = asked.elapsed();
        assert!(
            stopped,
            "{engine}: `sleep 60` still runs {took:?} after the cancel"
        );
        assert!(
            took <= cancel_limit(engine),
            "{engine}: stopped {took:?} after the cancel"
        );
        // The worker's outcome never overwrites the operator's.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, _, last_error, done, dead) = row_state(&db, "report.render").await;
        assert_eq!(
            (last_error.as_deref(), done, dead),
            (Some("cancelled by operator"), false, true),
            "{engine}"
        );
        replica.signal(nix::sys::signal::Signal::SIGTERM);
        let status = replica.wait(Duration::from_secs(10)).await;
        assert!(status.is_some_and(|s| s.success()), "{engine}: {status:?}");
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            text.lines()
                .filter(|line| line.contains("cancelled by operator"))
                .count(),
            1,
            "{engine}: {text}"
        );
        assert!(!text.contains("dropped stale outcomes"), "{engine}: {text}");
        assert!(!text.contains("command failed"), "{engine}: {text}");
    }
}

/// A Rust handler running in another processor (its own connections, as another replica
/// would) sees its job's cancellation fire within the limits of an operator's cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_fires_a_rust_handlers_token_on_another_replica() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "cancel_rust").await;
        let settings = Settings::default()
            .with_lease_seconds(60)
            .with_polling_interval_seconds(0.2);
        let source = open(&db, &settings).await;
        let started = Arc::new(AtomicU32::new(0));
        let fired: Arc<Mutex<HashMap<&'static str, Instant>>> = Default::default();
        let mut registry = Registry::new();
        registry
            .insert(
                "export",
                Arc::new(FnHandler({
                    let (started, fired) = (started.clone(), fired.clone());
                    move |job: Job| {
                        started.fetch_add(1, Ordering::SeqCst);
                        let fired = fired.clone();
                        async move {
                            job.cancellation.cancelled().await;
                            fired.lock().unwrap().insert("fired", Instant::now());
                            Err(HandlerError::retry("stopped by its cancellation"))
                        }
                    }
                })),
            )
            .unwrap();
        let (shutdown, worker) = start(registry, &source, &settings, Duration::from_secs(5));
        super::insert_many(&db, "export", 1).await;
        assert!(
            wait_until(Duration::from_secs(15), || {
                let n = started.load(Ordering::SeqCst);
                async move { n == 1 }
            })
            .await,
            "{engine}: the handler did not start"
        );
        let asked = Instant::now();
        cancel_running(&db).await;
        let seen = wait_until(cancel_limit(engine) + Duration::from_secs(3), || {
            let seen = fired.lock().unwrap().contains_key("fired");
            async move { seen }
        })
        .await;
        assert!(seen, "{engine}: the cancellation never fired");
        let took = fired.lock().unwrap()["fired"].duration_since(asked);
        assert!(
            took <= cancel_limit(engine),
            "{engine}: fired {took:?} after the cancel"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        shutdown.cancel();
        worker.await.unwrap().unwrap();
        let stats = source.stats().snapshot();
        assert_eq!(
            (stats.cancelled, stats.stale, stats.failed),
            (1, 0, 0),
            "{engine}"
        );
        let (_, _, last_error, _, dead) = row_state(&db, "export").await;
        assert_eq!(
            (last_error.as_deref(), dead),
            (Some("cancelled by operator"), true),
            "{engine}"
        );
    }
}

/// A worker that lists queues refuses to start on a version-1 table, naming the upgrade;
/// without `queues:` it keeps working there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_on_a_version_1_table_name_the_upgrade() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::new(engine, "queues_v1").await;
        let kind: icq::Engine = engine.parse().unwrap();
        db.execute(&icq::schema::render_v1(kind, &icq::TableName::default()).up)
            .await;
        let settings = Settings::default().with_queues(vec![QueueSettings::new("webhooks", 2)]);
        let source = open(&db, &settings).await;
        let mut registry = Registry::new();
        registry
            .insert("ping", Arc::new(icq::handler::Noop))
            .unwrap();
        let mut processor = Processor::new(registry.clone());
        processor.add_source(source.source_handle(settings.clone()));
        let options = RunOptions::default().with_until_idle(true);
        let err = processor
            .run(options.clone(), Default::default())
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, icq::Error::NeedsSchemaV2 { .. }),
            "{engine}: {err:?}"
        );
        assert!(
            message.contains("schema version 1")
                && message.contains("schema upgrade migration")
                && !message.contains("icq migrate"),
            "{engine}: {message}"
        );
        // Without `queues:` a version-1 table works as before.
        super::insert_many(&db, "ping", 3).await;
        let mut processor = Processor::new(registry);
        processor.add_source(source.source_handle(Settings::default()));
        processor.run(options, Default::default()).await.unwrap();
        assert_eq!(source.stats().snapshot().succeeded, 3, "{engine}");
    }
}
