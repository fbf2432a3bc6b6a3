//! Ordered keys and every attempt's error (schema version 4), on every engine: commands of
//! one order key run one at a time in the order they were scheduled, across processors,
//! while other keys run in parallel; a failing head holds its successors; each failed
//! attempt is kept in `Errors` and shown.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use icq::handler::FnHandler;
use icq::{
    CommandId, ConnectOptions, HandlerError, Job, NewCommand, Processor, Queue, Registry,
    RunOptions, Settings, TableName,
};
use tokio_util::sync::CancellationToken;

use crate::support::TestDb;

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

fn fast() -> Settings {
    Settings::default()
        .with_polling_interval_seconds(0.05)
        .with_retry_backoff_base_seconds(0.05)
        .with_max_retry_backoff_seconds(0.2)
}

/// Runs every processor until the source is idle (at most `limit`).
async fn drain(processors: Vec<Processor>, limit: Duration) {
    let runs = processors.iter().map(|p| {
        p.run(
            RunOptions::default().with_until_idle(true),
            CancellationToken::new(),
        )
    });
    let results = tokio::time::timeout(limit, futures::future::join_all(runs))
        .await
        .unwrap_or_else(|_| panic!("drained within {limit:?}"));
    for result in results {
        result.expect("processor run");
    }
}

/// Runs `processor` until every row of `ids` completed (checked every 50 ms; a retry's
/// wait is not "idle"), at most `limit`.
async fn run_until_completed(
    processor: Processor,
    queue: &Queue,
    ids: &[CommandId],
    limit: Duration,
) {
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { processor.run(RunOptions::default(), stop).await }
    });
    let started = Instant::now();
    loop {
        let mut done = true;
        for id in ids {
            let row = queue.get(id).await.unwrap().expect("row exists");
            done &= row.processed_at.is_some() || row.dead_lettered_at.is_some();
        }
        if done {
            break;
        }
        assert!(started.elapsed() < limit, "finished within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await.expect("processor task").expect("processor run");
}

/// One handler run: the command's key and number, and when it started and ended.
#[derive(Debug, Clone)]
struct Run {
    key: String,
    n: u64,
    start: Instant,
    end: Instant,
}

/// A registry whose `ordered.step` handler records each run (`{"key", "n"}`) and takes
/// `work` to run.
fn recording(runs: &Arc<Mutex<Vec<Run>>>, work: Duration) -> Registry {
    let sink = runs.clone();
    let mut registry = Registry::new();
    registry
        .insert(
            "ordered.step",
            Arc::new(FnHandler(move |job: Job| {
                let sink = sink.clone();
                async move {
                    let start = Instant::now();
                    tokio::time::sleep(work).await;
                    sink.lock().unwrap().push(Run {
                        key: job.payload["key"].as_str().unwrap_or("").to_owned(),
                        n: job.payload["n"].as_u64().unwrap_or(0),
                        start,
                        end: Instant::now(),
                    });
                    Ok(())
                }
            })),
        )
        .unwrap();
    registry
}

fn step(key: &str, n: u64) -> NewCommand {
    NewCommand::new("ordered.step", serde_json::json!({ "key": key, "n": n })).with_order_key(key)
}

/// Asserts `key`'s runs started in scheduling order and never overlapped.
fn assert_in_order(engine: &str, runs: &[Run], key: &str, count: u64) {
    let mut mine: Vec<&Run> = runs.iter().filter(|r| r.key == key).collect();
    mine.sort_by_key(|r| r.start);
    let order: Vec<u64> = mine.iter().map(|r| r.n).collect();
    assert_eq!(
        order,
        (0..count).collect::<Vec<_>>(),
        "{engine}: {key} ran in start order {order:?}"
    );
    for pair in mine.windows(2) {
        assert!(
            pair[1].start >= pair[0].end,
            "{engine}: {key} #{} started before #{} ended",
            pair[1].n,
            pair[0].n
        );
    }
}

/// 100 commands on one order key, scheduled in one transaction (one `CreatedAt`, so
/// `Id` orders them), run strictly in order and one at a time across four processors,
/// while 100 commands spread over ten other keys run in parallel beside them.
pub async fn one_key_runs_in_order_across_four_processors(engine: &'static str) {
    let db = TestDb::with_table(engine, "ordered").await;
    let queue = connect(&db).await;
    let mut commands: Vec<NewCommand> = Vec::new();
    for n in 0..100 {
        commands.push(step("account:1", n));
        commands.push(step(&format!("other:{}", n % 10), n / 10));
    }
    queue.schedule_many(&commands).await.unwrap();
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let mut processors = Vec::new();
    for _ in 0..4 {
        let mut processor = Processor::new(recording(&runs, Duration::from_millis(5)));
        processor.add_source(
            connect(&db)
                .await
                .source_handle(fast().with_concurrency(8).with_batch_size(20)),
        );
        processors.push(processor);
    }
    let started = Instant::now();
    drain(processors, Duration::from_secs(120)).await;
    let took = started.elapsed();
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 200, "{engine}: every command ran once");
    assert_in_order(engine, &runs, "account:1", 100);
    for k in 0..10 {
        assert_in_order(engine, &runs, &format!("other:{k}"), 10);
    }
    // Keys run beside each other: some run of another key overlaps a run of account:1.
    let overlapping = runs
        .iter()
        .filter(|r| r.key != "account:1")
        .filter(|o| {
            runs.iter()
                .any(|a| a.key == "account:1" && o.start < a.end && a.start < o.end)
        })
        .count();
    assert!(overlapping > 0, "{engine}: other keys ran beside account:1");
    eprintln!(
        "{engine}: 100 commands of one order key (and 100 of ten others) in order across 4 \
         processors in {took:?} ({:.1} ms per step of the key; {overlapping} runs of other \
         keys overlapped it)",
        took.as_secs_f64() * 1000.0 / 100.0
    );
}

/// A queue with a fleet-wide limit claims through its own statement; order keys hold there
/// too: 30 commands of one key in a `global_concurrency: 4` queue run in order, one at a
/// time, across two processors, beside 30 of three other keys.
pub async fn order_keys_hold_in_a_limited_queue(engine: &'static str) {
    let db = TestDb::with_table(engine, "ordered_limited").await;
    let queue = connect(&db).await;
    let mut commands: Vec<NewCommand> = Vec::new();
    for n in 0..30 {
        commands.push(step("account:1", n).queue("limited"));
        commands.push(step(&format!("other:{}", n % 3), n / 3).queue("limited"));
    }
    queue.schedule_many(&commands).await.unwrap();
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let mut processors = Vec::new();
    for _ in 0..2 {
        let mut processor = Processor::new(recording(&runs, Duration::from_millis(5)));
        let limited = icq::settings::QueueSettings::new("limited", 8).with_global_concurrency(4);
        processor.add_source(
            connect(&db)
                .await
                .source_handle(fast().with_batch_size(10).with_queues(vec![limited])),
        );
        processors.push(processor);
    }
    drain(processors, Duration::from_secs(120)).await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 60, "{engine}: every command ran once");
    assert_in_order(engine, &runs, "account:1", 30);
    for k in 0..3 {
        assert_in_order(engine, &runs, &format!("other:{k}"), 10);
    }
}

/// A head that fails holds its successors while it waits for its retries, until it
/// succeeds; one that keeps failing holds them until it is dead-lettered. `show` names
/// the command a successor waits behind.
pub async fn a_failing_head_holds_its_successors(engine: &'static str) {
    let db = TestDb::with_table(engine, "ordered_fail").await;
    let queue = connect(&db).await;
    let events: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = events.clone();
    let mut registry = Registry::new();
    registry
        .insert(
            "ordered.flaky",
            Arc::new(FnHandler(move |job: Job| {
                let sink = sink.clone();
                async move {
                    let name = job.payload["name"].as_str().unwrap_or("").to_owned();
                    let fails = job.payload["fails"].as_u64().unwrap_or(0);
                    sink.lock().unwrap().push(format!("{name}#{}", job.attempt));
                    if u64::from(job.attempt) <= fails {
                        return Err(HandlerError::retry(format!("{name} failed")));
                    }
                    Ok(())
                }
            })),
        )
        .unwrap();
    let flaky = |key: &str, name: &str, fails: u64| {
        NewCommand::new(
            "ordered.flaky",
            serde_json::json!({ "name": name, "fails": fails }),
        )
        .with_order_key(key)
    };
    // Key a: the head fails twice, then succeeds. Key b: the head always fails and is
    // dead-lettered after three attempts.
    let a_head = queue.schedule(&flaky("a", "a0", 2)).await.unwrap().id;
    let a_next = queue.schedule(&flaky("a", "a1", 0)).await.unwrap().id;
    let b_head = queue.schedule(&flaky("b", "b0", 99)).await.unwrap().id;
    queue.schedule(&flaky("b", "b1", 0)).await.unwrap();
    let sources = vec![queue.clone()];
    let shown = icq::admin::show(&sources, a_next.clone()).await.unwrap();
    assert_eq!(
        shown.attempts.held_by.as_ref(),
        Some(&a_head),
        "{engine}: the successor waits behind the head"
    );
    let json = serde_json::to_value(&shown).unwrap();
    assert_eq!(json["held_by"], a_head.as_str(), "{engine}: {json}");
    assert_eq!(
        icq::admin::show(&sources, a_head.clone())
            .await
            .unwrap()
            .attempts
            .held_by,
        None
    );

    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast().with_max_attempts(3).with_concurrency(4)));
    drain(vec![processor], Duration::from_secs(60)).await;
    let events = events.lock().unwrap().clone();
    let at = |e: &str| {
        events
            .iter()
            .position(|x| x == e)
            .unwrap_or_else(|| panic!("{engine}: {e} ran: {events:?}"))
    };
    assert!(at("a0#3") < at("a1#1"), "{engine}: {events:?}");
    assert!(at("b0#3") < at("b1#1"), "{engine}: {events:?}");
    assert_eq!(
        events
            .iter()
            .filter(|e| e.starts_with("a1") || e.starts_with("b1"))
            .count(),
        2,
        "{engine}: each successor ran once: {events:?}"
    );
    let dead = queue.get(&b_head).await.unwrap().unwrap();
    assert!(dead.dead_lettered_at.is_some(), "{engine}");
    let head = icq::admin::show(&sources, a_head.clone()).await.unwrap();
    assert_eq!(head.attempts.succeeded_on_attempt, Some(3), "{engine}");
    assert_eq!(head.attempts.attempt_errors.len(), 2, "{engine}");
}

/// Rows another program inserted with an `OrderKey` run in `CreatedAt` order, then `Id`
/// order among rows of one `CreatedAt` (as rows inserted in one transaction are).
pub async fn plain_sql_rows_with_an_order_key_run_in_order(engine: &'static str) {
    let db = TestDb::with_table(engine, "ordered_sql").await;
    let queue = connect(&db).await;
    // Inserted in reverse: ids and insertion order disagree with CreatedAt.
    let rows = [
        (
            "00000000-0000-4000-8000-000000000009",
            "2020-01-01T00:00:03",
            3,
        ),
        (
            "00000000-0000-4000-8000-000000000002",
            "2020-01-01T00:00:02",
            2,
        ),
        (
            "00000000-0000-4000-8000-000000000005",
            "2020-01-01T00:00:01",
            1,
        ),
        (
            "00000000-0000-4000-8000-000000000003",
            "2020-01-01T00:00:01",
            0,
        ),
    ];
    for (id, created, n) in rows {
        db.insert_row(
            id,
            "ordered.step",
            &format!(r#"{{"key":"plain","n":{n}}}"#),
            &[
                ("OrderKey", "'plain'".to_owned()),
                ("CreatedAt", db.ts(created)),
                ("RunAt", db.ts("2020-01-01T00:00:00")),
            ],
        )
        .await;
    }
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let mut processor = Processor::new(recording(&runs, Duration::from_millis(5)));
    processor.add_source(queue.source_handle(fast().with_concurrency(8)));
    drain(vec![processor], Duration::from_secs(60)).await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 4, "{engine}");
    assert_in_order(engine, &runs, "plain", 4);
}

/// A command failing twice then succeeding keeps both errors, with their attempt and
/// time, and says attempt 3 succeeded: in the library and in `icq show --format json`.
/// A dead letter lists each attempt in `icq dead-letters show --format json`.
pub async fn failing_twice_then_succeeding_shows_both_errors(engine: &'static str) {
    let db = TestDb::with_table(engine, "attempts").await;
    let queue = connect(&db).await;
    let mut registry = Registry::new();
    registry
        .insert(
            "flaky",
            Arc::new(FnHandler(move |job: Job| async move {
                let fails = job.payload["fails"].as_u64().unwrap_or(0);
                if u64::from(job.attempt) <= fails {
                    return Err(HandlerError::retry(format!(
                        "attempt {} failed: timeout",
                        job.attempt
                    )));
                }
                Ok(())
            })),
        )
        .unwrap();
    let ok = queue
        .schedule(&NewCommand::new("flaky", serde_json::json!({ "fails": 2 })))
        .await
        .unwrap()
        .id;
    let dead = queue
        .schedule(&NewCommand::new(
            "flaky",
            serde_json::json!({ "fails": 99 }),
        ))
        .await
        .unwrap()
        .id;
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast().with_max_attempts(3)));
    let before = chrono::Utc::now() - chrono::Duration::seconds(5);
    run_until_completed(
        processor,
        &queue,
        &[ok.clone(), dead.clone()],
        Duration::from_secs(60),
    )
    .await;

    let row = queue.get(&ok).await.unwrap().unwrap();
    assert!(row.processed_at.is_some(), "{engine}: completed");
    let errors = icq::attempts::parse(row.errors.as_deref());
    assert_eq!(
        errors
            .iter()
            .map(|e| (e.attempt, e.error.as_str()))
            .collect::<Vec<_>>(),
        [
            (Some(1), "attempt 1 failed: timeout"),
            (Some(2), "attempt 2 failed: timeout")
        ],
        "{engine}: {:?}",
        row.errors
    );
    for error in &errors {
        let at = icq::command::parse_timestamp(error.at.as_deref().unwrap()).unwrap();
        assert!(at > before && at < chrono::Utc::now() + chrono::Duration::seconds(5));
    }
    let shown = icq::admin::show(std::slice::from_ref(&queue), ok.clone())
        .await
        .unwrap();
    assert_eq!(shown.attempts.succeeded_on_attempt, Some(3), "{engine}");

    let out = icq_cli(&db, &["show", ok.as_str(), "--format", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{engine}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(json["state"], "completed", "{engine}: {json}");
    assert_eq!(json["succeeded_on_attempt"], 3, "{engine}: {json}");
    let listed = json["attempt_errors"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{engine}: {json}");
    assert_eq!(listed[1]["attempt"], 2, "{engine}: {json}");
    assert_eq!(
        listed[1]["error"], "attempt 2 failed: timeout",
        "{engine}: {json}"
    );
    let table = icq_cli(&db, &["show", ok.as_str()]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("attempt 3 succeeded") && table.contains("#1 ") && table.contains("#2 "),
        "{engine}: {table}"
    );

    let out = icq_cli(
        &db,
        &["dead-letters", "show", dead.as_str(), "--format", "json"],
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{engine}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(json["state"], "dead", "{engine}: {json}");
    let listed: Vec<i64> = json["attempt_errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(listed, [1, 2, 3], "{engine}: {json}");
}

fn icq_cli(db: &TestDb, args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .arg("--database-url")
        .arg(&db.url)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run icq");
    assert!(
        out.status.success(),
        "icq {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// An `Errors` value another program wrote (text that is not JSON; 1 MB of it) never
/// fails the stamp of a failure: it is replaced by an entry holding its start, and the
/// new attempt follows.
pub async fn a_hostile_errors_value_does_not_fail_the_stamp(engine: &'static str) {
    let db = TestDb::with_table(engine, "hostile_errors").await;
    let queue = connect(&db).await;
    let huge = "x".repeat(1 << 20);
    let ids = [
        (
            "00000000-0000-4000-8000-0000000000a1",
            "not json at all".to_owned(),
        ),
        ("00000000-0000-4000-8000-0000000000a2", huge),
        (
            "00000000-0000-4000-8000-0000000000a3",
            r#"{"attempt":1}"#.to_owned(),
        ),
    ];
    for (id, errors) in &ids {
        db.insert_row(id, "fails.once", "{}", &[("Errors", format!("'{errors}'"))])
            .await;
    }
    let mut registry = Registry::new();
    registry
        .insert(
            "fails.once",
            Arc::new(FnHandler(move |job: Job| async move {
                if job.attempt == 1 {
                    return Err(HandlerError::retry("first attempt failed"));
                }
                Ok(())
            })),
        )
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(fast()));
    let all: Vec<CommandId> = ids.iter().map(|(id, _)| id.parse().unwrap()).collect();
    run_until_completed(processor, &queue, &all, Duration::from_secs(60)).await;
    for (id, _) in &ids {
        let id: CommandId = id.parse().unwrap();
        let row = queue.get(&id).await.unwrap().unwrap();
        assert!(row.processed_at.is_some(), "{engine}: {id} completed");
        let stored = row.errors.clone().unwrap_or_default();
        assert!(
            stored.len() < 8 * 1024,
            "{engine}: {id}: {} bytes",
            stored.len()
        );
        let errors = icq::attempts::parse(Some(&stored));
        assert_eq!(errors.len(), 2, "{engine}: {id}: {stored}");
        assert_eq!(errors[1].attempt, Some(1), "{engine}: {stored}");
        assert_eq!(
            errors[1].error, "first attempt failed",
            "{engine}: {stored}"
        );
    }
}

/// An order key or a concurrency key on a table older than version 4 is refused naming
/// the upgrade, by every insert path, and nothing is written; the same command without
/// the key is scheduled.
pub async fn keys_on_an_older_table_name_the_upgrade(engine: &'static str) {
    let db = TestDb::new(engine, "ordered_v3").await;
    let kind: icq::Engine = engine.parse().unwrap();
    let table = TableName::default();
    db.execute(&icq::schema::render_v1(kind, &table).up).await;
    db.execute(&icq::schema::render_upgrade(kind, &table).up)
        .await;
    db.execute(&icq::schema::render_upgrade_v3(kind, &table).up)
        .await;
    let queue = connect(&db).await;
    let keyed = NewCommand::new("t", serde_json::json!({})).with_order_key("k");
    let limited = NewCommand::new("t", serde_json::json!({})).with_concurrency_key("tenant");
    for result in [
        queue.schedule(&keyed).await.map(|_| ()),
        queue.schedule(&limited).await.map(|_| ()),
        queue
            .schedule_many(&[NewCommand::new("t", serde_json::json!({})), keyed.clone()])
            .await
            .map(|_| ()),
    ] {
        let err = result.expect_err("refused");
        assert!(
            matches!(err, icq::Error::NeedsSchemaV4 { version: 3, .. }),
            "{engine}: {err}"
        );
        assert!(
            err.to_string().contains("_icq_schema_v4.sql"),
            "{engine}: {err}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .arg("--database-url")
        .arg(&db.url)
        .args([
            "schedule",
            "--type",
            "t",
            "--payload",
            "{}",
            "--order-key",
            "k",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{engine}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("icq migrate add") && said.contains("_icq_schema_v4.sql"),
        "{engine}: {said}"
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {}",
            db.q("InternalCommands")
        ))
        .await,
        0,
        "{engine}: nothing written"
    );
    queue
        .schedule(&NewCommand::new("t", serde_json::json!({})))
        .await
        .unwrap();
}

/// Every insert path writes the keys: one command, a unique-key command, a batch (with
/// and without unique keys), the caller's transaction, `icq schedule --order-key
/// --concurrency-key` and `--from-file`.
pub async fn every_insert_path_writes_the_keys(engine: &'static str) {
    let db = TestDb::with_table(engine, "ordered_inserts").await;
    let queue = connect(&db).await;
    let keyed = |n: u32| {
        NewCommand::new("t", serde_json::json!({ "n": n }))
            .with_order_key(format!("o{n}"))
            .with_concurrency_key(format!("c{n}"))
    };
    queue.schedule(&keyed(1)).await.unwrap();
    queue.schedule(&keyed(2).unique_key("u2")).await.unwrap();
    queue
        .schedule_many(&[keyed(3), keyed(4).unique_key("u4"), keyed(5)])
        .await
        .unwrap();
    icq_cli(
        &db,
        &[
            "schedule",
            "--type",
            "t",
            "--payload",
            r#"{"n":6}"#,
            "--order-key",
            "o6",
            "--concurrency-key",
            "c6",
        ],
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        "{\"type\":\"t\",\"payload\":{\"n\":7},\"order_key\":\"o7\",\"concurrency_key\":\"c7\"}\n",
    )
    .unwrap();
    icq_cli(
        &db,
        &["schedule", "--from-file", file.path().to_str().unwrap()],
    );
    schedule_in_transaction(&db, &[keyed(8), keyed(9), keyed(10)]).await;
    let (o, c) = match engine {
        "postgres" => (r#"'o' || ("Payload"->>'n')"#, r#"'c' || ("Payload"->>'n')"#),
        "mysql" => (
            "CONCAT('o', JSON_VALUE(`Payload`, '$.n'))",
            "CONCAT('c', JSON_VALUE(`Payload`, '$.n'))",
        ),
        _ => (
            r#"'o' || json_extract("Payload", '$.n')"#,
            r#"'c' || json_extract("Payload", '$.n')"#,
        ),
    };
    let matching = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {ok} = {o} AND {ck} = {c}",
            t = db.q("InternalCommands"),
            ok = db.q("OrderKey"),
            ck = db.q("ConcurrencyKey"),
        ))
        .await;
    assert_eq!(matching, 10, "{engine}: every path wrote both keys");
    let err = queue
        .schedule(&NewCommand::new("t", serde_json::json!({})).with_order_key("k".repeat(201)))
        .await
        .unwrap_err();
    assert!(matches!(err, icq::Error::Invalid { .. }), "{engine}: {err}");
}

/// Schedules `commands` in the caller's transaction: the first alone, the rest in bulk.
async fn schedule_in_transaction(db: &TestDb, commands: &[NewCommand]) {
    use sqlx::Connection;
    match db.engine {
        "postgres" => {
            in_transaction(
                sqlx::PgConnection::connect(&db.url).await.unwrap(),
                commands,
            )
            .await
        }
        "mysql" => {
            in_transaction(
                sqlx::MySqlConnection::connect(&db.url).await.unwrap(),
                commands,
            )
            .await
        }
        _ => {
            in_transaction(
                sqlx::SqliteConnection::connect(&db.url).await.unwrap(),
                commands,
            )
            .await
        }
    }
}

async fn in_transaction<C>(mut conn: C, commands: &[NewCommand])
where
    C: sqlx::Connection + icq::Enqueue,
    C::Database: sqlx::Database<Connection = C>,
{
    let table = TableName::default();
    let mut tx = conn.begin().await.unwrap();
    icq::schedule_in(&mut *tx, &table, &commands[0])
        .await
        .unwrap();
    icq::schedule_many_in(&mut *tx, &table, &commands[1..])
        .await
        .unwrap();
    tx.commit().await.unwrap();
}
