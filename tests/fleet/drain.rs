//! What a worker does while its database misbehaves under it or changes beneath it, on
//! every engine: `--until-idle` with queues keeps claiming every queue while it waits for
//! another processor's lease, and outcomes that cannot be written stop the claims.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use icq::handler::FnHandler;
use icq::settings::QueueSettings;
use icq::{HandlerError, Job, NewCommand, Processor, Registry, RunOptions, Settings};

use super::support::{RUNTIME_ENGINES, TestDb};

/// Opens the test database's default table as source `main` with `settings`.
pub(crate) async fn open(db: &TestDb, settings: &Settings) -> icq::Queue {
    let options = icq::ConnectOptions::for_settings(settings);
    icq::Queue::connect("main", &db.url, &Default::default(), &options)
        .await
        .unwrap()
}

/// SQL for "now plus `seconds`" in the engine's `LockedUntil` representation.
pub(crate) fn now_plus(engine: &str, seconds: u32) -> String {
    match engine {
        "postgres" => format!("now() + interval '{seconds} seconds'"),
        "mysql" => format!("UTC_TIMESTAMP(6) + INTERVAL {seconds} SECOND"),
        _ => format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+{seconds} seconds')"),
    }
}

/// A worker serving queues `default` and `webhooks` drains with `--until-idle` while
/// another processor holds a `webhooks` row's lease: a `default` command that fails once
/// with a 1 s backoff comes due while the worker waits for that lease, and is claimed and
/// run before the worker returns (the drain ends only when no served queue has work due
/// or running).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_idle_with_queues_claims_a_retry_that_comes_due_while_waiting_on_another_queue() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "idle_queues").await;
        let mut settings = Settings::default();
        settings.retry_backoff_base_seconds = 1.0;
        settings.max_retry_backoff_seconds = 1.0;
        settings.polling_interval_seconds = 0.2;
        let settings = settings.with_queues(vec![
            QueueSettings::new("default", 2),
            QueueSettings::new("webhooks", 2),
        ]);
        let source = open(&db, &settings).await;
        let mut hook = NewCommand::new("hook", serde_json::json!({}));
        hook.queue = "webhooks".into();
        source.schedule(&hook).await.unwrap();
        // Another processor holds the webhook for a few seconds.
        let (t, token, until, queue) = (
            db.q("InternalCommands"),
            db.q("LockToken"),
            db.q("LockedUntil"),
            db.q("Queue"),
        );
        db.execute(&format!(
            "UPDATE {t} SET {token} = '6f2b1f4e-0000-4000-8000-000000000001', {until} = {} \
             WHERE {queue} = 'webhooks'",
            now_plus(engine, 6)
        ))
        .await;
        source
            .schedule(&NewCommand::new("flaky", serde_json::json!({})))
            .await
            .unwrap();

        let runs = Arc::new(AtomicU32::new(0));
        let mut registry = Registry::new();
        registry
            .insert("hook", Arc::new(icq::handler::Noop))
            .unwrap();
        registry
            .insert(
                "flaky",
                Arc::new(FnHandler({
                    let runs = runs.clone();
                    move |_job: Job| {
                        let first = runs.fetch_add(1, Ordering::SeqCst) == 0;
                        async move {
                            if first {
                                Err(HandlerError::retry("fails once"))
                            } else {
                                Ok(())
                            }
                        }
                    }
                })),
            )
            .unwrap();
        let mut processor = Processor::new(registry);
        processor.add_source(source.source_handle(settings.clone()));
        let started = Instant::now();
        let options = RunOptions::default().with_until_idle(true);
        tokio::time::timeout(
            Duration::from_secs(60),
            processor.run(options, Default::default()),
        )
        .await
        .expect("the drain ends")
        .unwrap();
        eprintln!("{engine}: drained in {:?}", started.elapsed());
        let (processed, pending) = (db.q("ProcessedAt"), db.q("DeadLetteredAt"));
        let left = db
            .scalar_i64(&format!(
                "SELECT COUNT(*) FROM {t} WHERE {processed} IS NULL AND {pending} IS NULL"
            ))
            .await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "{engine}: the retry ran");
        assert_eq!(left, 0, "{engine}: nothing left pending");
    }
}

/// A trigger on `db`'s table that refuses every stamp of a completed outcome (an error
/// that cannot heal, as a missing privilege or an illegal collation mix would be).
async fn refuse_stamps(db: &TestDb) {
    let sql = match db.engine {
        "postgres" => {
            "CREATE FUNCTION refuse_stamp() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.\"ProcessedAt\" IS NOT NULL THEN \
             RAISE EXCEPTION 'stamps are refused by a trigger'; END IF; RETURN NEW; END $$;\n\
             CREATE TRIGGER refuse_stamp BEFORE UPDATE ON \"InternalCommands\" \
             FOR EACH ROW EXECUTE FUNCTION refuse_stamp();\n\
             CREATE TRIGGER refuse_move BEFORE INSERT ON \"InternalCommandsHistory\" \
             FOR EACH ROW EXECUTE FUNCTION refuse_stamp();"
        }
        "mysql" => {
            // A completion moves its row to history without updating it first.
            db.execute(
                "CREATE TRIGGER refuse_move BEFORE INSERT ON `InternalCommandsHistory` \
                 FOR EACH ROW SIGNAL SQLSTATE '45000' \
                 SET MESSAGE_TEXT = 'stamps are refused by a trigger'",
            )
            .await;
            "CREATE TRIGGER refuse_stamp BEFORE UPDATE ON `InternalCommands` FOR EACH ROW \
             BEGIN IF NEW.`ProcessedAt` IS NOT NULL THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'stamps are refused by a trigger'; \
             END IF; END"
        }
        _ => {
            "CREATE TRIGGER refuse_stamp BEFORE UPDATE ON \"InternalCommands\" FOR EACH ROW \
             WHEN NEW.\"ProcessedAt\" IS NOT NULL \
             BEGIN SELECT RAISE(ABORT, 'stamps are refused by a trigger'); END;"
        }
    };
    db.execute(sql).await;
}

/// Outcomes that cannot be written stop the claims: with a trigger refusing every stamp,
/// `icq work --until-idle` fails with exit 1 and `kind: database` naming the server's
/// message, having started only the first few of 200 commands instead of running them
/// all (each of which would run again when its lease lapsed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_that_cannot_be_written_stop_the_claims_and_fail_the_drain() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "refused_stamps").await;
        super::insert_many(&db, "ping", 200).await;
        refuse_stamps(&db).await;
        let dir = tempfile::tempdir().unwrap();
        let config = super::write_config(
            dir.path(),
            &db.url,
            "      concurrency: 2\n      batch_size: 5\n      lease_seconds: 20\n      polling_interval_seconds: 0.2",
            "  ping:\n    noop: true\n",
        );
        let started = Instant::now();
        let out = super::icq()
            .args(["--format", "json", "work", "--until-idle", "--config"])
            .arg(&config)
            .env_remove("DATABASE_URL")
            .env_remove("ICQ_CONFIG")
            .output()
            .unwrap();
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let error = stderr
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find_map(|doc| doc.get("error").cloned())
            .unwrap_or_else(|| panic!("{engine}: no error document ({:?}): {stderr}", out.status));
        assert_eq!(out.status.code(), Some(1), "{engine}: {stderr}");
        assert_eq!(error["kind"], "database", "{engine}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains("stamps are refused by a trigger"),
            "{engine}: {message}"
        );
        let (t, attempts) = (db.q("InternalCommands"), db.q("Attempts"));
        let started_rows = db
            .scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {attempts} > 0"))
            .await;
        eprintln!(
            "{engine}: failed after {took:?} having started {started_rows} of 200: {message}"
        );
        assert!(
            started_rows <= 40,
            "{engine}: {started_rows} of 200 commands were started although no outcome could be written"
        );
        assert!(took < Duration::from_secs(20), "{engine}: {took:?}");
    }
}

/// SQL for "now minus `seconds`" in the engine's `RunAt` representation.
fn now_minus(engine: &str, seconds: u32) -> String {
    match engine {
        "postgres" => format!("now() - interval '{seconds} seconds'"),
        "mysql" => format!("UTC_TIMESTAMP(6) - INTERVAL {seconds} SECOND"),
        _ => format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-{seconds} seconds')"),
    }
}

/// A worker started on a version-1 table, which is upgraded to version 2 while it runs,
/// switches to the version-2 claim without a restart: it starts claiming by `Priority`
/// (a version-1 claim takes the oldest `RunAt` first). Each round schedules, in one
/// statement, an older row at priority 5 and a newer one at priority -5 and sees which
/// one a one-row claim takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_worker_switches_to_the_version_2_claim_after_the_upgrade() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::new(engine, "upgrade_live").await;
        let kind: icq::Engine = engine.parse().unwrap();
        let table = icq::TableName::default();
        db.execute(&icq::schema::render_v1(kind, &table).up).await;
        let settings = Settings::default()
            .with_concurrency(1)
            .with_batch_size(1)
            .with_polling_interval_seconds(0.1);
        let source = open(&db, &settings).await;
        let order = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let mut registry = Registry::new();
        registry
            .insert(
                "probe",
                Arc::new(FnHandler({
                    let order = order.clone();
                    move |job: Job| {
                        let order = order.clone();
                        async move {
                            let name = job.payload["p"].as_str().unwrap_or("").to_owned();
                            order.lock().unwrap().push(name);
                            Ok(())
                        }
                    }
                })),
            )
            .unwrap();
        let mut processor = Processor::new(registry);
        processor.add_source(source.source_handle(settings.clone()));
        let shutdown = tokio_util::sync::CancellationToken::new();
        let worker = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { processor.run(RunOptions::default(), shutdown).await }
        });
        let (t, ty, payload, run_at) = (
            db.q("InternalCommands"),
            db.q("Type"),
            db.q("Payload"),
            db.q("RunAt"),
        );
        // The worker claims on the version-1 table (and has looked its version up).
        db.execute(&format!(
            "INSERT INTO {t} ({ty}, {payload}) VALUES ('probe', '{{\"p\": \"warm\"}}')"
        ))
        .await;
        assert!(
            super::wait_until(Duration::from_secs(30), || async {
                order.lock().unwrap().len() == 1
            })
            .await,
            "{engine}: the worker never ran the first command"
        );
        db.execute(&icq::schema::render_upgrade(kind, &table).up)
            .await;
        let priority = db.q("Priority");
        let started = Instant::now();
        let mut rounds = 0;
        let switched = loop {
            rounds += 1;
            order.lock().unwrap().clear();
            db.execute(&format!(
                "INSERT INTO {t} ({ty}, {payload}, {run_at}, {priority}) VALUES \
                 ('probe', '{{\"p\": \"old\"}}', {}, 5), \
                 ('probe', '{{\"p\": \"urgent\"}}', {}, -5)",
                now_minus(engine, 60),
                now_minus(engine, 30)
            ))
            .await;
            assert!(
                super::wait_until(Duration::from_secs(30), || async {
                    order.lock().unwrap().len() == 2
                })
                .await,
                "{engine}: the worker stopped running commands after the upgrade"
            );
            if order.lock().unwrap()[0] == "urgent" {
                break true;
            }
            if started.elapsed() > Duration::from_secs(30) {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        shutdown.cancel();
        worker.await.unwrap().unwrap();
        eprintln!(
            "{engine}: switched after {:?} ({rounds} rounds)",
            started.elapsed()
        );
        assert!(
            switched,
            "{engine}: still claiming in version-1 order {:?} after the upgrade",
            started.elapsed()
        );
    }
}

/// A worker draining a version-3 table while it is upgraded to version 4 loses no
/// command and runs none twice, and starts keeping each attempt's error without a restart:
/// round after round a command that fails once is scheduled until one completes with its
/// first attempt's error in `Errors` (a version-3 stamp has nowhere to keep it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_worker_takes_the_version_4_upgrade_in_its_stride() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::new(engine, "upgrade_v4_live").await;
        let kind: icq::Engine = engine.parse().unwrap();
        let table = icq::TableName::default();
        for ddl in [
            icq::schema::render_v1,
            icq::schema::render_upgrade,
            icq::schema::render_upgrade_v3,
        ] {
            db.execute(&ddl(kind, &table).up).await;
        }
        let settings = Settings::default()
            .with_concurrency(4)
            .with_batch_size(10)
            .with_polling_interval_seconds(0.1)
            .with_retry_backoff_base_seconds(0.05)
            .with_max_retry_backoff_seconds(0.2);
        let source = open(&db, &settings).await;
        let ran = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
        let mut registry = Registry::new();
        registry
            .insert(
                "tick",
                Arc::new(FnHandler({
                    let ran = ran.clone();
                    move |job: Job| {
                        let ran = ran.clone();
                        async move {
                            ran.lock().unwrap().push(job.payload["n"].as_u64().unwrap());
                            Ok(())
                        }
                    }
                })),
            )
            .unwrap();
        registry
            .insert(
                "flaky",
                Arc::new(FnHandler(|job: Job| async move {
                    if job.attempt == 1 {
                        Err(HandlerError::retry("the first attempt fails"))
                    } else {
                        Ok(())
                    }
                })),
            )
            .unwrap();
        let mut processor = Processor::new(registry);
        processor.add_source(source.source_handle(settings.clone()));
        let shutdown = tokio_util::sync::CancellationToken::new();
        let worker = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { processor.run(RunOptions::default(), shutdown).await }
        });
        let (t, ty, payload) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
        const TICKS: u64 = 300;
        for n in 0..TICKS {
            db.execute(&format!(
                "INSERT INTO {t} ({ty}, {payload}) VALUES ('tick', '{{\"n\": {n}}}')"
            ))
            .await;
            if n == TICKS / 3 {
                db.execute(&icq::schema::render_upgrade_v4(kind, &table).up)
                    .await;
            }
            if n % 10 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let history = db.q("InternalCommandsHistory");
        let errors = db.q("Errors");
        let started = Instant::now();
        let mut rounds = 0;
        let kept = loop {
            rounds += 1;
            db.execute(&format!(
                "INSERT INTO {t} ({ty}, {payload}) VALUES ('flaky', '{{\"round\": {rounds}}}')"
            ))
            .await;
            let done = format!(
                "SELECT COUNT(*) FROM {history} WHERE {ty} = 'flaky' AND {errors} LIKE '%the first attempt fails%'"
            );
            if super::wait_until(Duration::from_secs(5), || async {
                db.scalar_i64(&done).await > 0
            })
            .await
            {
                break true;
            }
            if started.elapsed() > Duration::from_secs(30) {
                break false;
            }
        };
        assert!(
            super::wait_until(Duration::from_secs(30), || async {
                ran.lock().unwrap().len() as u64 >= TICKS
            })
            .await,
            "{engine}: the worker stopped running commands after the upgrade"
        );
        shutdown.cancel();
        worker.await.unwrap().unwrap();
        let mut ran = ran.lock().unwrap().clone();
        ran.sort_unstable();
        assert_eq!(
            ran,
            (0..TICKS).collect::<Vec<_>>(),
            "{engine}: every command ran once"
        );
        assert!(
            kept,
            "{engine}: no attempt's error kept {:?} after the upgrade ({rounds} rounds)",
            started.elapsed()
        );
        eprintln!(
            "{engine}: attempts' errors kept after {:?} ({rounds} rounds)",
            started.elapsed()
        );
    }
}

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Reads of the table `table` in `db` so far, by any index or a scan (PostgreSQL's
/// statistics).
async fn reads(db: &TestDb, table: &str) -> i64 {
    db.scalar_i64(&format!(
        "SELECT seq_scan + COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = '{table}'"
    ))
    .await
}

/// A worker listing 1,000 queues of 200 slots each, idle: its cost follows the work, not
/// the configured slots — a few reads of its table a second (one poll covers every idle
/// queue, not one per queue each interval), memory that does not grow by a slot per
/// configured concurrency — and it stops at once. The table has a name of its own and
/// only its reads count, so nothing else on the server (a worker another test left
/// polling the default table of this pooled database) can add to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_queues_cost_what_one_does() {
    let db = TestDb::new("postgres", "idle_queues_1000").await;
    let table = icq::TableName::parse("IdleQueues").unwrap();
    db.execute(&icq::schema::render(icq::Engine::Postgres, &table).up)
        .await;
    let n = 1000;
    let queues: Vec<QueueSettings> = (0..n)
        .map(|i| QueueSettings::new(format!("q{i}"), 200))
        .collect();
    let settings = Settings::default()
        .with_polling_interval_seconds(1.0)
        .with_queues(queues);
    let options = icq::ConnectOptions::for_settings(&settings);
    let source = icq::Queue::connect("main", &db.url, &table, &options)
        .await
        .unwrap();
    let mut registry = Registry::new();
    registry
        .insert("ping", Arc::new(icq::handler::Noop))
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(source.source_handle(settings.clone()));
    let before = rss();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { processor.run(RunOptions::default(), shutdown).await }
    });
    // Settled: every queue claimed once and found nothing, and the server's statistics
    // of those claims flushed (an idle PostgreSQL backend reports within 10 s).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let (from, window) = (reads(&db, table.name()).await, Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_reads = reads(&db, table.name()).await - from;
    let per_second = idle_reads as f64 / window.elapsed().as_secs_f64();
    let grown = rss().saturating_sub(before);
    // Work still runs: a command on the last queue.
    let mut last = NewCommand::new("ping", serde_json::json!({}));
    last.queue = format!("q{}", n - 1);
    source.schedule(&last).await.unwrap();
    assert!(
        super::wait_until(Duration::from_secs(30), || async {
            source.stats().snapshot().succeeded == 1
        })
        .await,
        "the command on an idle queue never ran"
    );
    let asked = Instant::now();
    shutdown.cancel();
    worker.await.unwrap().unwrap();
    let stopped = asked.elapsed();
    eprintln!(
        "1,000 idle queues: {per_second:.1} reads of the table/s, RSS +{} MB, stopped in {stopped:?}",
        grown >> 20
    );
    assert!(
        per_second < 20.0,
        "{per_second:.1} reads of the table a second while idle"
    );
    assert!(
        grown < 200 << 20,
        "RSS grew by {} MB while idle",
        grown >> 20
    );
    assert!(
        stopped < Duration::from_secs(15),
        "stopped after {stopped:?}"
    );
}

/// Reads through an open source keep working across the upgrade of its table: statements
/// prepared before it (`show`, the dead-letter list, several ids at once) are not read
/// past the columns the upgrade added.
#[tokio::test]
async fn operator_reads_on_an_open_source_survive_the_upgrade() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::new(engine, "upgrade_reads").await;
        let kind: icq::Engine = engine.parse().unwrap();
        let table = icq::TableName::default();
        db.execute(&icq::schema::render_v1(kind, &table).up).await;
        let sources = vec![open(&db, &Settings::default()).await];
        let (t, id, ty, payload, dead) = (
            db.q("InternalCommands"),
            db.q("Id"),
            db.q("Type"),
            db.q("Payload"),
            db.q("DeadLetteredAt"),
        );
        let uuid = "10000000-0000-4000-8000-0000000000b1";
        let now = match engine {
            "postgres" => "now()",
            "mysql" => "UTC_TIMESTAMP(6)",
            _ => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        };
        db.execute(&format!(
            "INSERT INTO {t} ({id}, {ty}, {payload}, {dead}) VALUES ('{uuid}', 'probe', '{{}}', {now})"
        ))
        .await;
        let command: icq::CommandId = uuid.parse().unwrap();
        let reads = || async {
            let shown = icq::admin::show(&sources, command.clone()).await?;
            let listed =
                icq::admin::dead_letters(&sources, &icq::admin::DeadLetterQuery::default()).await?;
            Ok::<_, icq::Error>((shown.row.id.to_string(), listed.rows.len()))
        };
        assert_eq!(
            reads().await.unwrap(),
            (uuid.to_owned(), 1),
            "{engine}: before"
        );
        db.execute(&icq::schema::render_upgrade(kind, &table).up)
            .await;
        // Both before and after the driver notices the new version.
        for _ in 0..2 {
            let read = tokio::time::timeout(Duration::from_secs(30), reads()).await;
            let read = read.unwrap_or_else(|_| panic!("{engine}: a read hung after the upgrade"));
            assert_eq!(read.unwrap(), (uuid.to_owned(), 1), "{engine}: after");
            tokio::time::sleep(Duration::from_secs(6)).await;
        }
        for source in sources {
            source.close().await;
        }
    }
}
