//! Bad rows: rows another program writes into the commands table with plain SQL.
//!
//! Every test writes 20 good rows (`Type = 'good'`, a handler that records each
//! execution) and ONE hostile row, runs an in-process [`Processor`] (default settings but
//! a 0.1 s poll; once with the default concurrency and once with 50), and checks:
//!
//! - every good row ran exactly once and completed, within a few seconds (the hostile row
//!   held them up by one claim at most);
//! - the hostile row settled as the test expects (completed once, or dead-lettered with a
//!   `LastError` naming the problem, or left alone when it is not due), and no outcome was
//!   dropped as stale;
//! - the processor neither panicked nor failed;
//! - afterwards `icq pending`, `icq dead-letters list`, `icq dead-letters show <id>` and
//!   `icq requeue <id> --yes` work on it through the binary (table and JSON), never
//!   exiting 101; a requeued hostile row settles again under a second processor run.
//!
//! The hostile row is found by SQL as "the row that is not one of the good ids", so even
//! a row whose id icq cannot read is checked.
//!
//! Where the engine's column types cannot hold the hostile value (MariaDB's `CHAR(36)` id,
//! `VARCHAR(255)` type, `TEXT` error, JSON depth), the test asserts that the INSERT was
//! refused and stops there.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use icq::ConnectOptions;
use icq::handler::FnHandler;
use icq::{HandlerError, Job, Processor, Queue, Registry, RunOptions, Settings, TableName};
use tokio_util::sync::CancellationToken;

use crate::common::{icq_cli, icq_cli_env, insert_sql, lit, now_sql, table, texts, try_execute};
use crate::support::TestDb;

/// Good rows around each hostile one.
const GOOD: usize = 20;

/// How long the good rows may take, at most, to be done: generous, a healthy run takes
/// well under a second.
const GOOD_LIMIT: Duration = Duration::from_secs(5);

/// How long the hostile row may take to settle.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// What the hostile row must end as.
#[derive(Debug, Clone)]
enum Expect {
    /// The handler ran it exactly once and it is completed.
    Completed,
    /// Dead-lettered without running; `LastError` contains every fragment (any case).
    Dead(Vec<&'static str>),
    /// Completed (after running once) or dead-lettered with a `LastError` containing
    /// every fragment (any case).
    Settles(Vec<&'static str>),
    /// Not due: never run, still pending (and counted as scheduled), claimed at most once.
    NotRun,
    /// Inserted dead: stays dead, untouched, its `LastError` starting with this text.
    StaysDead(&'static str),
}

/// One hostile row.
struct Hostile {
    /// Column name and SQL expression pairs of the INSERT.
    columns: Vec<(&'static str, String)>,
    /// The id as stored, when the CLI can name it.
    id: Option<String>,
    expect: Expect,
    /// Engines whose column types may refuse the value.
    refusable_on: &'static [&'static str],
    /// `lease_seconds`, and how long to keep watching after the row settled (to catch a
    /// row that is run again every lease period).
    lease_seconds: u64,
    watch: Duration,
    /// The id of the first good row, when the test needs a particular one.
    first_good_id: Option<String>,
    /// The type is longer than a table line (lines are then not bounded: the type column
    /// is never wrapped).
    long_type: bool,
    /// Columns whose NOT NULL another program's migration relaxed before any row is
    /// written ([`relax_not_null`]).
    relaxed: &'static [&'static str],
}

impl Hostile {
    /// A row of type `good` with an empty object payload, plus `columns` (which override).
    fn new(
        db: &TestDb,
        id: Option<&str>,
        columns: Vec<(&'static str, String)>,
        expect: Expect,
    ) -> Hostile {
        let mut all: Vec<(&'static str, String)> = Vec::new();
        if let Some(id) = id {
            all.push(("Id", lit(db, id)));
        }
        all.push(("Type", lit(db, "good")));
        all.push(("Payload", lit(db, "{}")));
        for (name, value) in columns {
            all.retain(|(n, _)| *n != name);
            all.push((name, value));
        }
        Hostile {
            columns: all,
            id: id.map(str::to_owned),
            expect,
            refusable_on: &[],
            lease_seconds: 300,
            watch: Duration::ZERO,
            first_good_id: None,
            long_type: false,
            relaxed: &[],
        }
    }

    /// Relaxes NOT NULL on `columns` before the rows are written.
    fn relaxed(mut self, columns: &'static [&'static str]) -> Hostile {
        self.relaxed = columns;
        self
    }

    fn long_type(mut self) -> Hostile {
        self.long_type = true;
        self
    }

    fn refusable_on(mut self, engines: &'static [&'static str]) -> Hostile {
        self.refusable_on = engines;
        self
    }

    fn lease(mut self, seconds: u64) -> Hostile {
        self.lease_seconds = seconds;
        self
    }

    /// Short lease (the shortest there is, 1 s), watched for three and a half lease
    /// periods after settling: a row run again every lease period shows three times.
    fn watched(mut self) -> Hostile {
        self.lease_seconds = WATCH_LEASE_SECONDS;
        self.watch = Duration::from_millis(3500 * WATCH_LEASE_SECONDS);
        self
    }
}

/// The lease of [`Hostile::watched`] rows: the shortest `lease_seconds` takes, so the
/// watch for a row run again every lease period is short too.
const WATCH_LEASE_SECONDS: u64 = 1;

/// The two processor shapes every row is tried under: default concurrency, and 50.
const CONCURRENCIES: [u32; 2] = [8, 50];

/// Runs `build`'s hostile row on a fresh database per concurrency. The two runs share
/// nothing (each its own database, processor and counters), so they run side by side:
/// each test waits through its watch once, not twice.
async fn attack(engine: &'static str, tag: &str, build: impl Fn(&TestDb) -> Hostile) {
    let mut runs = Vec::new();
    for concurrency in CONCURRENCIES {
        let db = TestDb::with_table(engine, tag).await;
        let hostile = build(&db);
        let tag = tag.to_owned();
        runs.push(tokio::spawn(async move {
            check(&db, &hostile, concurrency, &tag).await;
        }));
    }
    join_all_or_panic(runs).await;
}

/// Awaits every task, then re-raises the first panic (with its own message).
async fn join_all_or_panic(tasks: Vec<tokio::task::JoinHandle<()>>) {
    let mut first_panic = None;
    for task in tasks {
        if let Err(err) = task.await
            && first_panic.is_none()
        {
            first_panic = Some(err);
        }
    }
    if let Some(err) = first_panic {
        match err.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(err) => panic!("a concurrency's run did not finish: {err}"),
        }
    }
}

/// State of the hostile row by SQL: 0 pending, 1 completed, 2 dead.
async fn hostile_state(db: &TestDb, not_good: &str) -> i64 {
    db.scalar_i64(&format!(
        "SELECT CASE WHEN {p} IS NOT NULL THEN 1 WHEN {d} IS NOT NULL THEN 2 ELSE 0 END{cast} FROM {t} WHERE {not_good}",
        cast = if db.engine == "postgres" { "::bigint" } else { "" },
        p = db.q("ProcessedAt"),
        d = db.q("DeadLetteredAt"),
        t = db.all_rows()
    ))
    .await
}

async fn hostile_error(db: &TestDb, not_good: &str) -> Option<String> {
    texts(
        db,
        &format!(
            "SELECT {} FROM {} WHERE {not_good}",
            db.q("LastError"),
            db.all_rows()
        ),
    )
    .await
    .into_iter()
    .next()
    .flatten()
}

/// What one processor run saw.
struct Run {
    /// (id, when) per execution of a `good`-typed row.
    runs: Vec<(String, Instant)>,
    started: Instant,
    good_done: Option<Instant>,
    settled: bool,
    stats: icq::StatsSnapshot,
    /// Why the run did not end cleanly (a panic, an error, a shutdown that hung).
    stop_problem: Option<String>,
}

/// Runs one processor on `db` until the good rows are done and the hostile row settled
/// (or the limits pass), keeps it running for `watch`, then stops it and checks it
/// returned cleanly.
async fn process(
    db: &TestDb,
    settings: Settings,
    good_ids: &[String],
    not_good: &str,
    wait_for_settle: bool,
    watch: Duration,
) -> Run {
    let runs: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let sink = runs.clone();
    let mut registry = Registry::new();
    registry
        .insert(
            "good",
            Arc::new(FnHandler(move |job: Job| {
                let sink = sink.clone();
                async move {
                    sink.lock()
                        .unwrap()
                        .push((job.id.to_string(), Instant::now()));
                    Ok(())
                }
            })),
        )
        .unwrap();
    registry
        .insert(
            "loud.failure",
            Arc::new(FnHandler(|_job: Job| async move {
                Err(HandlerError::terminal(format!(
                    "a very long failure: {}",
                    "x".repeat(200_000)
                )))
            })),
        )
        .unwrap();
    // A pool of 5 (the default is 10): the two concurrencies run side by side, and eight
    // such tests at once must stay within the servers' connection limits (PostgreSQL's
    // 100). The rows, not the pool size, are the subject here.
    let queue = Queue::connect(
        "bad",
        &db.url,
        &TableName::default(),
        &ConnectOptions::default().with_max_connections(5),
    )
    .await
    .expect("connect queue");
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(settings));
    let stop = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            processor
                .run(
                    RunOptions::default()
                        .with_until_idle(false)
                        .with_shutdown_grace(Duration::from_secs(5)),
                    stop,
                )
                .await
        }
    });
    let good_list = good_ids
        .iter()
        .map(|id| lit(db, id))
        .collect::<Vec<_>>()
        .join(", ");
    let good_done_sql = format!(
        "SELECT COUNT(*) FROM {} WHERE {} IS NOT NULL AND {} IN ({good_list})",
        db.all_rows(),
        db.q("ProcessedAt"),
        db.q("Id")
    );
    let mut good_done = None;
    let mut settled = false;
    let limit = GOOD_LIMIT.max(SETTLE_LIMIT);
    while started.elapsed() < limit && !task.is_finished() {
        if good_done.is_none() && db.scalar_i64(&good_done_sql).await == good_ids.len() as i64 {
            good_done = Some(Instant::now());
        }
        if !settled && hostile_state(db, not_good).await != 0 {
            settled = true;
        }
        let good_enough = good_done.is_some() || started.elapsed() > GOOD_LIMIT;
        if good_enough && (settled || !wait_for_settle) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !wait_for_settle && !task.is_finished() {
        // Rows that must not run: give the processor a few polls to get it wrong.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if !watch.is_zero() && !task.is_finished() {
        tokio::time::sleep(watch).await;
    }
    stop.cancel();
    let stopping = Instant::now();
    let stop_problem = match tokio::time::timeout(Duration::from_secs(30), task).await {
        Err(_) => Some(format!(
            "the processor did not stop within {:?} of shutdown",
            stopping.elapsed()
        )),
        Ok(Err(join)) => Some(format!("the processor panicked: {join}")),
        Ok(Ok(Err(err))) => Some(format!("the processor failed: {err:#}")),
        Ok(Ok(Ok(()))) => None,
    };
    let stats = queue.stats().snapshot();
    queue.close().await;
    let runs = runs.lock().unwrap().clone();
    Run {
        runs,
        started,
        good_done,
        settled,
        stats,
        stop_problem,
    }
}

/// Drops NOT NULL from `columns` of the commands table, as another program's migration
/// might: `ALTER TABLE` where the engine has it; on SQLite (which cannot alter a column)
/// the empty table is recreated from its own DDL without the constraint, with its indexes.
async fn relax_not_null(db: &TestDb, columns: &[&str]) {
    if columns.is_empty() {
        return;
    }
    let t = table(db);
    match db.engine {
        "postgres" => {
            for column in columns {
                db.execute(&format!(
                    "ALTER TABLE {t} ALTER COLUMN {} DROP NOT NULL",
                    db.q(column)
                ))
                .await;
            }
        }
        "mysql" => {
            for column in columns {
                let definition = match *column {
                    "Attempts" => "INT NULL DEFAULT 0",
                    _ => "DATETIME(6) NULL DEFAULT (UTC_TIMESTAMP(6))",
                };
                db.execute(&format!(
                    "ALTER TABLE {t} MODIFY {} {definition}",
                    db.q(column)
                ))
                .await;
            }
        }
        _ => {
            let ddl = texts(
                db,
                "SELECT sql FROM sqlite_master WHERE tbl_name = 'InternalCommands' \
                 AND sql IS NOT NULL ORDER BY type = 'table' DESC",
            )
            .await;
            let mut statements = vec![format!("DROP TABLE {t}")];
            for (i, sql) in ddl.into_iter().flatten().enumerate() {
                if i > 0 {
                    statements.push(sql);
                    continue;
                }
                let relaxed: Vec<String> = sql
                    .lines()
                    .map(|line| {
                        let named = columns
                            .iter()
                            .any(|c| line.trim_start().starts_with(&format!("\"{c}\"")));
                        if named {
                            line.replace("NOT NULL", "")
                        } else {
                            line.to_owned()
                        }
                    })
                    .collect();
                let relaxed = relaxed.join("\n");
                assert_ne!(relaxed, sql, "NOT NULL found on {columns:?} in {sql}");
                statements.push(relaxed);
            }
            db.execute(&statements.join(";\n")).await;
        }
    }
}

/// Inserts the good rows with known lowercase UUID ids.
async fn insert_good(db: &TestDb, first: Option<&str>) -> Vec<String> {
    let mut ids: Vec<String> = (0..GOOD)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    if let Some(first) = first {
        ids[0] = first.to_owned();
    }
    let rows: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| format!("({}, 'good', '{{\"n\": {i}}}')", lit(db, id)))
        .collect();
    db.execute(&format!(
        "INSERT INTO {} ({}, {}, {}) VALUES {}",
        table(db),
        db.q("Id"),
        db.q("Type"),
        db.q("Payload"),
        rows.join(", ")
    ))
    .await;
    ids
}

async fn check(db: &TestDb, hostile: &Hostile, concurrency: u32, tag: &str) {
    let engine = db.engine;
    let what = format!("{engine}/{tag}/concurrency {concurrency}");
    relax_not_null(db, hostile.relaxed).await;
    let good_ids = insert_good(db, hostile.first_good_id.as_deref()).await;
    let sql = insert_sql(db, &hostile.columns);
    if let Err(err) = try_execute(db, &sql).await {
        assert!(
            hostile.refusable_on.contains(&engine),
            "{what}: the hostile INSERT was refused: {err}\n{}",
            &sql[..sql.len().min(400)]
        );
        eprintln!("{what}: {engine} refused the hostile row, as its column types require: {err}");
        return;
    }
    let t = table(db);
    let total = db.scalar_i64(&format!("SELECT COUNT(*) FROM {t}")).await;
    assert_eq!(total, GOOD as i64 + 1, "{what}: 21 rows written");
    let not_good = format!(
        "{} NOT IN ({})",
        db.q("Id"),
        good_ids
            .iter()
            .map(|id| lit(db, id))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let settings = Settings::default()
        .with_polling_interval_seconds(0.1)
        .with_concurrency(concurrency)
        .with_lease_seconds(hostile.lease_seconds);
    let wait_for_settle = !matches!(hostile.expect, Expect::NotRun | Expect::StaysDead(_));
    let run = process(
        db,
        settings.clone(),
        &good_ids,
        &not_good,
        wait_for_settle,
        hostile.watch,
    )
    .await;

    // The good rows: each exactly once, all completed, promptly.
    let good: std::collections::HashSet<&String> = good_ids.iter().collect();
    for id in &good_ids {
        let n = run.runs.iter().filter(|(r, _)| r == id).count();
        assert_eq!(
            n, 1,
            "{what}: good row {id} ran {n} times, want exactly once"
        );
    }
    let good_done = run.good_done.unwrap_or_else(|| {
        panic!(
            "{what}: the good rows were not all completed within {GOOD_LIMIT:?} ({} of {GOOD} ran); stats {:?}",
            run.runs.iter().filter(|(r, _)| good.contains(r)).count(),
            run.stats
        )
    });
    let took = good_done - run.started;
    assert!(
        took <= GOOD_LIMIT,
        "{what}: the good rows took {took:?}, held up by the hostile row"
    );
    eprintln!("{what}: 20 good rows done in {took:?}");

    if let Some(problem) = &run.stop_problem {
        panic!("{what}: {problem}; stats {:?}", run.stats);
    }

    // The hostile row.
    let hostile_runs: Vec<&(String, Instant)> =
        run.runs.iter().filter(|(r, _)| !good.contains(r)).collect();
    let state = hostile_state(db, &not_good).await;
    let error = hostile_error(db, &not_good).await;
    let shown_error = error
        .as_deref()
        .map(|e| e.chars().take(300).collect::<String>());
    let describe = format!(
        "state {state} (0 pending, 1 completed, 2 dead), LastError {shown_error:?}, ran {} times, stats {:?}",
        hostile_runs.len(),
        run.stats
    );
    match &hostile.expect {
        Expect::Completed => {
            assert_eq!(
                state, 1,
                "{what}: the hostile row must complete: {describe}"
            );
            assert_eq!(
                hostile_runs.len(),
                1,
                "{what}: the hostile row must run exactly once and stay completed: {describe}"
            );
        }
        Expect::Dead(fragments) => {
            assert_eq!(
                state, 2,
                "{what}: the hostile row must be dead-lettered: {describe}"
            );
            let text = error.clone().unwrap_or_default().to_lowercase();
            for fragment in fragments {
                assert!(
                    text.contains(&fragment.to_lowercase()),
                    "{what}: LastError must name the problem ({fragment:?}): {describe}"
                );
            }
            assert!(
                hostile_runs.is_empty(),
                "{what}: a dead-lettered hostile row must not run: {describe}"
            );
        }
        Expect::Settles(fragments) => {
            assert_ne!(state, 0, "{what}: the hostile row must settle: {describe}");
            if state == 1 {
                assert_eq!(hostile_runs.len(), 1, "{what}: completed once: {describe}");
            } else {
                assert!(
                    error.as_deref().is_some_and(|e| !e.trim().is_empty()),
                    "{what}: dead-lettered with a reason: {describe}"
                );
                let text = error.clone().unwrap_or_default().to_lowercase();
                for fragment in fragments {
                    assert!(
                        text.contains(&fragment.to_lowercase()),
                        "{what}: LastError must name the problem ({fragment:?}): {describe}"
                    );
                }
                assert!(hostile_runs.len() <= 1, "{what}: {describe}");
            }
        }
        Expect::NotRun => {
            assert_eq!(
                state, 0,
                "{what}: the row is not due and must stay pending: {describe}"
            );
            assert!(
                hostile_runs.is_empty(),
                "{what}: a row due in 2100 must not run now: {describe}"
            );
            assert!(
                run.stats.claimed <= GOOD as u64 + 1,
                "{what}: the row due in 2100 was claimed {} times: a claim loop: {describe}",
                run.stats.claimed.saturating_sub(GOOD as u64)
            );
        }
        Expect::StaysDead(prefix) => {
            assert_eq!(state, 2, "{what}: a dead row stays dead: {describe}");
            assert!(
                error.as_deref().is_some_and(|e| e.starts_with(prefix)),
                "{what}: its LastError is untouched: {describe}"
            );
            assert!(hostile_runs.is_empty(), "{what}: {describe}");
        }
    }
    assert_eq!(
        run.stats.stale, 0,
        "{what}: no outcome may be dropped as stale in a lone processor: {describe}"
    );
    if wait_for_settle {
        assert!(run.settled, "{what}: {describe}");
    }

    operator_commands(db, hostile, state, &not_good, &settings, &good_ids, &what).await;
}

/// The operator commands on the hostile row, through the binary.
async fn operator_commands(
    db: &TestDb,
    hostile: &Hostile,
    state: i64,
    not_good: &str,
    settings: &Settings,
    good_ids: &[String],
    what: &str,
) {
    let url = &db.url;
    icq_cli(url, &["pending"]).assert_success();
    let pending = icq_cli(url, &["pending", "--format", "json"]);
    pending.assert_success();
    let counts = &pending.json()[0];
    if matches!(hostile.expect, Expect::NotRun) {
        assert_eq!(
            counts["scheduled"], 1,
            "{what}: `pending` counts the row as scheduled: {counts}"
        );
    }
    let dead_rows = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {} IS NOT NULL",
            table(db),
            db.q("DeadLetteredAt")
        ))
        .await;
    assert_eq!(
        counts["dead"], dead_rows,
        "{what}: `pending` counts every dead row: {counts}"
    );

    let list = icq_cli(url, &["dead-letters", "list", "--format", "table"]);
    list.assert_success();
    // In a pipe the listing is tab-separated: one line per row, a tab only between fields.
    let piped = icq_cli(url, &["dead-letters", "list"]);
    piped.assert_success();
    assert_eq!(
        piped.stdout.lines().count() as i64,
        dead_rows + 1,
        "{what}: one line per dead row plus the header:\n{}",
        piped.stdout
    );
    for line in piped.stdout.lines() {
        assert_eq!(line.split('\t').count(), 6, "{what}: fields of {line:?}");
        let raw: Vec<char> = line
            .chars()
            .filter(|c| c.is_control() && *c != '\t')
            .collect();
        assert!(
            raw.is_empty(),
            "{what}: raw control characters {raw:?} in {line:?}"
        );
    }
    let list_json = icq_cli(url, &["dead-letters", "list", "--format", "json"]);
    list_json.assert_success();
    let listed = list_json.json();
    let listed = listed.as_array().expect("an array");
    assert_eq!(
        listed.len() as i64,
        dead_rows,
        "{what}: `dead-letters list` shows every dead row: {listed:?}"
    );
    if state == 2
        && let Some(id) = &hostile.id
    {
        assert!(
            listed.iter().any(|r| r["id"].as_str() == Some(id.as_str())),
            "{what}: `dead-letters list` shows the hostile row {id} as stored: {listed:?}"
        );
        assert!(
            list.stdout.contains(id.as_str()),
            "{what}: the table shows the id {id}:\n{}",
            list.stdout
        );
    }
    table_fits(&list.stdout, what, (!hostile.long_type).then_some(240));
    if matches!(hostile.expect, Expect::StaysDead(_)) {
        // On a 100-column terminal the table fits in 100 columns.
        let narrow = icq_cli_env(
            url,
            &["dead-letters", "list", "--format", "table"],
            &[("COLUMNS", "100")],
        );
        narrow.assert_success();
        table_fits(&narrow.stdout, &format!("{what} (COLUMNS=100)"), Some(100));
    }

    let Some(id) = &hostile.id else {
        return;
    };
    icq_cli(url, &["dead-letters", "show", id]).assert_success();
    let shown = icq_cli(url, &["dead-letters", "show", id, "--format", "json"]);
    shown.assert_success();
    assert_eq!(
        shown.json()["id"].as_str(),
        Some(id.as_str()),
        "{what}: `show` names the row by its id as stored"
    );

    let requeue = icq_cli(url, &["requeue", id, "--yes"]);
    requeue.assert_no_panic();
    if state == 1 {
        assert_ne!(
            requeue.code,
            Some(0),
            "{what}: requeueing a completed row must be refused: {requeue:?}"
        );
        return;
    }
    requeue.assert_success();
    let after = hostile_state(db, not_good).await;
    assert_eq!(after, 0, "{what}: requeued rows are pending");
    if state == 2 {
        assert!(
            hostile_error(db, not_good).await.is_some(),
            "{what}: requeue keeps LastError"
        );
    }
    // Once requeued the row is due now: a second run must settle it again.
    let again = process(
        db,
        settings.clone(),
        good_ids,
        not_good,
        true,
        Duration::ZERO,
    )
    .await;
    if let Some(problem) = &again.stop_problem {
        panic!("{what}: after the requeue: {problem}");
    }
    assert!(
        again.settled,
        "{what}: the requeued hostile row settles again: stats {:?}",
        again.stats
    );
}

/// Table output must stay a table: bounded lines, no raw control characters that would
/// move a terminal's cursor or recolour it.
fn table_fits(out: &str, what: &str, max_line: Option<usize>) {
    assert!(
        out.len() < 64 * 1024,
        "{what}: `dead-letters list` printed {} bytes",
        out.len()
    );
    for line in out.lines() {
        assert!(
            max_line.is_none_or(|max| line.chars().count() <= max),
            "{what}: a table line of {} characters: {:?}",
            line.chars().count(),
            line.chars().take(300).collect::<String>()
        );
        let raw: Vec<char> = line.chars().filter(|c| c.is_control()).collect();
        assert!(
            raw.is_empty(),
            "{what}: raw control characters {raw:?} in table output: {:?}",
            line.chars().take(300).collect::<String>()
        );
    }
}

// ---------------------------------------------------------------------------------------
// the hostile rows

macro_rules! bad_row_tests {
    ($($name:ident: [$($engine:ident),+];)*) => {
        $(
            mod $name {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $engine() {
                        super::$name(stringify!($engine)).await
                    }
                )+
            }
        )*
    };
}

bad_row_tests! {
    non_uuid_id_is_processed_alone: [sqlite, mysql];
    uppercase_uuid_id_completes_once_and_stays_completed: [sqlite, mysql];
    braced_uuid_id_completes_once_and_stays_completed: [sqlite, mysql];
    case_variant_ids_are_distinct_rows: [sqlite, mysql];
    blob_id_is_dead_lettered_alone: [sqlite];
    max_int_attempts_is_dead_lettered_without_failing_the_claim: [postgres, sqlite, mysql];
    negative_attempts_is_dead_lettered_naming_the_count: [postgres, sqlite, mysql];
    min_int_attempts_is_dead_lettered_not_retried_2_pow_31_times: [postgres, sqlite, mysql];
    null_attempts_is_dead_lettered_naming_the_column: [postgres, sqlite, mysql];
    attempts_beyond_32_bits_is_dead_lettered_naming_the_value: [sqlite];
    null_run_at_is_dead_lettered_within_one_lease: [postgres, sqlite, mysql];
    null_created_at_is_dead_lettered_within_one_lease: [postgres, sqlite, mysql];
    null_run_at_is_counted_and_listed_as_due: [postgres, sqlite, mysql];
    invalid_utf8_text_id_is_dead_lettered_within_one_lease: [sqlite];
    work_until_idle_returns_despite_a_null_id_row: [sqlite];
    work_until_idle_returns_despite_an_invalid_utf8_id_row: [sqlite];
    work_until_idle_returns_despite_a_null_run_at_row: [postgres, sqlite, mysql];
    invalid_utf8_type_is_counted_escaped_and_cancel_by_type_works: [sqlite];
    unrepresentable_times_are_listed_truthfully: [postgres];
    number_as_text_run_at_is_dead_lettered_within_one_lease: [sqlite];
    work_until_idle_returns_despite_a_number_as_text_run_at_row: [sqlite];
    text_attempts_settles: [sqlite];
    minus_infinity_run_at_is_dead_lettered_without_panic: [postgres];
    dead_row_with_infinite_run_at_is_listed_shown_and_requeued: [postgres];
    payload_nested_200_levels_is_dead_lettered_alone: [postgres, sqlite, mysql];
    integer_run_at_in_the_past_runs: [sqlite];
    integer_run_at_in_2100_is_not_run_now: [sqlite];
    garbage_text_run_at_settles: [sqlite];
    garbage_created_at_settles: [sqlite];
    roles_not_json_settles: [postgres, sqlite, mysql];
    roles_json_object_settles: [postgres, sqlite, mysql];
    type_300_characters_is_dead_lettered_no_handler: [postgres, sqlite, mysql];
    empty_type_is_dead_lettered_no_handler: [postgres, sqlite, mysql];
    type_with_sql_metacharacters_is_dead_lettered_and_table_intact: [postgres, sqlite, mysql];
    megabyte_last_error_with_control_characters_is_listed: [postgres, sqlite, mysql];
    huge_handler_error_does_not_fail_the_stamp_for_others: [postgres, sqlite, mysql];
    work_until_idle_returns_despite_a_garbage_created_at_row: [sqlite];
    work_until_idle_returns_despite_a_blob_id_row: [sqlite];
}

const UPPER: &str = "AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE";
const BRACED: &str = "{aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee}";
/// A fixed UUID for hostile rows whose id is not the point.
const HOSTILE_ID: &str = "0badc0de-0000-4000-8000-000000000001";

async fn non_uuid_id_is_processed_alone(engine: &'static str) {
    attack(engine, "job_1", |db| {
        Hostile::new(db, Some("job-1"), vec![], Expect::Completed).watched()
    })
    .await;
}

async fn uppercase_uuid_id_completes_once_and_stays_completed(engine: &'static str) {
    attack(engine, "upper", |db| {
        Hostile::new(db, Some(UPPER), vec![], Expect::Completed).watched()
    })
    .await;
}

async fn braced_uuid_id_completes_once_and_stays_completed(engine: &'static str) {
    // 38 characters: MariaDB's CHAR(36) id cannot hold it.
    attack(engine, "braced", |db| {
        Hostile::new(db, Some(BRACED), vec![], Expect::Completed)
            .watched()
            .refusable_on(&["mysql"])
    })
    .await;
}

/// Two rows whose ids differ only in case are two commands: each runs once, and neither
/// one's stamp lands on the other.
async fn case_variant_ids_are_distinct_rows(engine: &'static str) {
    attack(engine, "casevar", |db| {
        // The first good row is the lowercase twin of the hostile row's uppercase id.
        let mut hostile = Hostile::new(db, Some(UPPER), vec![], Expect::Completed).watched();
        hostile.first_good_id = Some(UPPER.to_lowercase());
        hostile
    })
    .await;
}

async fn blob_id_is_dead_lettered_alone(engine: &'static str) {
    attack(engine, "blobid", |db| {
        Hostile::new(
            db,
            None,
            vec![("Id", "X'DEADBEEF'".into())],
            Expect::Settles(vec!["Id"]),
        )
    })
    .await;
}

async fn max_int_attempts_is_dead_lettered_without_failing_the_claim(engine: &'static str) {
    attack(engine, "maxattempts", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Attempts", "2147483647".into())],
            Expect::Dead(vec!["Attempts is 2147483647", "beyond max_attempts (5)"]),
        )
    })
    .await;
}

/// A negative count is unusable, not a grant of extra attempts: dead-lettered at once,
/// never run, the reason naming the stored count (it was 8–9 runs with `max_attempts` 5).
async fn negative_attempts_is_dead_lettered_naming_the_count(engine: &'static str) {
    attack(engine, "negattempts", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Attempts", "-5".into())],
            Expect::Dead(vec!["column Attempts: -5 is negative"]),
        )
        .watched()
    })
    .await;
}

/// `Attempts = -2147483648` retried about 2³¹ times with `ICQ_ATTEMPT` 1.
async fn min_int_attempts_is_dead_lettered_not_retried_2_pow_31_times(engine: &'static str) {
    attack(engine, "minattempts", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Attempts", "-2147483648".into())],
            Expect::Dead(vec!["column Attempts: -2147483648 is negative"]),
        )
        .watched()
    })
    .await;
}

/// A row that never ran, with NULL `Attempts`, was dead-lettered as "gave up after
/// 2147483646 attempts: the last lease expired...": the reason must say what was wrong.
async fn null_attempts_is_dead_lettered_naming_the_column(engine: &'static str) {
    attack(engine, "nullattempts", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Attempts", "NULL".into())],
            Expect::Dead(vec!["column Attempts: NULL"]),
        )
        .relaxed(&["Attempts"])
        .watched()
    })
    .await;
}

/// SQLite's INTEGER holds 64 bits: such a count was saturated into "gave up after
/// 2147483646 attempts" before.
async fn attempts_beyond_32_bits_is_dead_lettered_naming_the_value(engine: &'static str) {
    attack(engine, "bigattempts", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Attempts", "1099511627776".into())],
            Expect::Dead(vec!["column Attempts: 1099511627776 is out of range"]),
        )
        .watched()
    })
    .await;
}

/// NULL `RunAt` (another program's migration relaxed NOT NULL) stayed pending forever
/// on all three engines. With a 1 s lease, watched for three more lease periods.
async fn null_run_at_is_dead_lettered_within_one_lease(engine: &'static str) {
    attack(engine, "nullrunat", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("RunAt", "NULL".into())],
            Expect::Dead(vec!["column RunAt: NULL"]),
        )
        .relaxed(&["RunAt"])
        .watched()
    })
    .await;
}

async fn null_created_at_is_dead_lettered_within_one_lease(engine: &'static str) {
    attack(engine, "nullcreated", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("CreatedAt", "NULL".into())],
            Expect::Dead(vec!["column CreatedAt: NULL"]),
        )
        .relaxed(&["CreatedAt"])
        .watched()
    })
    .await;
}

/// `pending` left the NULL-`RunAt` row out of every count: it is due (the claim takes it
/// at once), and `list --state due` shows it with the column named.
async fn null_run_at_is_counted_and_listed_as_due(engine: &'static str) {
    let db = TestDb::with_table(engine, "nullrunatcount").await;
    relax_not_null(&db, &["RunAt"]).await;
    let columns = vec![
        ("Id", lit(&db, HOSTILE_ID)),
        ("Type", lit(&db, "good")),
        ("Payload", lit(&db, "{}")),
        ("RunAt", "NULL".to_owned()),
    ];
    db.execute(&insert_sql(&db, &columns)).await;
    let pending = icq_cli(&db.url, &["pending", "--format", "json"]);
    pending.assert_success();
    let counts = &pending.json()[0];
    assert_eq!(
        counts["due"], 1,
        "{engine}: the NULL-RunAt row is due: {counts}"
    );
    let listed = icq_cli(&db.url, &["list", "--state", "due", "--format", "json"]);
    listed.assert_success();
    let text = listed.json().to_string();
    assert!(
        text.contains(HOSTILE_ID) && text.contains("column RunAt: NULL"),
        "{engine}: `list --state due` shows the row and names the column: {text}"
    );
}

async fn invalid_utf8_text_id_is_dead_lettered_within_one_lease(engine: &'static str) {
    attack(engine, "badutf8id", |db| {
        Hostile::new(
            db,
            None,
            vec![("Id", "CAST(X'6A6F62FF2D31' AS TEXT)".into())],
            Expect::Dead(vec![
                "column Id: text that is not valid UTF-8 (X'6A6F62FF2D31')",
            ]),
        )
        .watched()
    })
    .await;
}

async fn text_attempts_settles(engine: &'static str) {
    attack(engine, "textattempts", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Attempts", "'many'".into())],
            Expect::Settles(vec![]),
        )
    })
    .await;
}

async fn minus_infinity_run_at_is_dead_lettered_without_panic(engine: &'static str) {
    attack(engine, "neginf", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("RunAt", "'-infinity'".into())],
            Expect::Dead(vec!["infinity"]),
        )
    })
    .await;
}

async fn dead_row_with_infinite_run_at_is_listed_shown_and_requeued(engine: &'static str) {
    attack(engine, "infdead", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![
                ("RunAt", "'infinity'".into()),
                ("DeadLetteredAt", now_sql(db).into()),
                ("Attempts", "5".into()),
                ("LastError", lit(db, "old failure from another program")),
            ],
            Expect::StaysDead("old failure"),
        )
    })
    .await;
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

async fn payload_nested_200_levels_is_dead_lettered_alone(engine: &'static str) {
    attack(engine, "nested", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Payload", lit(db, &nested(200)))],
            Expect::Settles(vec!["Payload"]),
        )
        .refusable_on(&["mysql"])
    })
    .await;
}

async fn integer_run_at_in_the_past_runs(engine: &'static str) {
    attack(engine, "intpast", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("RunAt", "1700000000".into())],
            Expect::Completed,
        )
    })
    .await;
}

async fn integer_run_at_in_2100_is_not_run_now(engine: &'static str) {
    attack(engine, "int2100", |db| {
        let mut hostile = Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("RunAt", "4102444800".into())],
            Expect::NotRun,
        );
        // A short lease, so a claim loop would show within the run: watched for two and
        // a half lease periods.
        hostile.lease_seconds = WATCH_LEASE_SECONDS;
        hostile.watch = Duration::from_millis(2500 * WATCH_LEASE_SECONDS);
        hostile
    })
    .await;
}

async fn garbage_text_run_at_settles(engine: &'static str) {
    attack(engine, "textrunat", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("RunAt", "'tomorrow'".into())],
            Expect::Settles(vec!["RunAt"]),
        )
    })
    .await;
}

async fn garbage_created_at_settles(engine: &'static str) {
    attack(engine, "textcreated", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("CreatedAt", "'garbage'".into())],
            Expect::Settles(vec!["CreatedAt"]),
        )
    })
    .await;
}

async fn roles_not_json_settles(engine: &'static str) {
    attack(engine, "rolestext", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Roles", lit(db, "not json"))],
            Expect::Settles(vec![]),
        )
    })
    .await;
}

async fn roles_json_object_settles(engine: &'static str) {
    attack(engine, "rolesobj", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Roles", lit(db, r#"{"a":1}"#))],
            Expect::Settles(vec![]),
        )
    })
    .await;
}

async fn type_300_characters_is_dead_lettered_no_handler(engine: &'static str) {
    attack(engine, "type300", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Type", lit(db, &"t".repeat(300)))],
            Expect::Dead(vec!["no handler"]),
        )
        .refusable_on(&["mysql"])
        .long_type()
    })
    .await;
}

async fn empty_type_is_dead_lettered_no_handler(engine: &'static str) {
    attack(engine, "typeempty", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Type", lit(db, ""))],
            Expect::Dead(vec!["no handler"]),
        )
    })
    .await;
}

async fn type_with_sql_metacharacters_is_dead_lettered_and_table_intact(engine: &'static str) {
    let mut runs = Vec::new();
    for concurrency in CONCURRENCIES {
        let db = TestDb::with_table(engine, "typesql").await;
        runs.push(tokio::spawn(sql_metacharacters_in_type(db, concurrency)));
    }
    join_all_or_panic(runs).await;
}

async fn sql_metacharacters_in_type(db: TestDb, concurrency: u32) {
    let evil = format!("x'; DROP TABLE {}; -- \" ` \\ %", table(&db));
    let hostile = Hostile::new(
        &db,
        Some(HOSTILE_ID),
        vec![("Type", lit(&db, &evil))],
        Expect::Dead(vec!["no handler"]),
    );
    check(&db, &hostile, concurrency, "typesql").await;
    let rows = db
        .scalar_i64(&format!("SELECT COUNT(*) FROM {}", db.all_rows()))
        .await;
    assert_eq!(rows, GOOD as i64 + 1, "the table is intact");
    let stored = texts(
        &db,
        &format!(
            "SELECT {} FROM {} WHERE {} = {}",
            db.q("Type"),
            table(&db),
            db.q("Id"),
            lit(&db, HOSTILE_ID)
        ),
    )
    .await;
    assert_eq!(stored, vec![Some(evil)], "the type is stored verbatim");
}

/// A megabyte of control characters and newlines (MariaDB's TEXT holds 64 KB: there, the
/// largest value the column takes).
fn hostile_error_text(bytes: usize) -> String {
    let mut text = String::from(
        "boom \u{1b}[2J\u{1b}[31mred\u{7} \r overwritten\ttab \u{8}\u{b}\u{c} end of first line\n",
    );
    let mut n = 0;
    while text.len() < bytes {
        text.push_str(&format!("line {n} \u{1b}[0m\r\t\u{7f}\u{1}\u{1f} more\n"));
        n += 1;
    }
    text.truncate(bytes);
    text
}

async fn megabyte_last_error_with_control_characters_is_listed(engine: &'static str) {
    attack(engine, "mberror", |db| {
        let bytes = if db.engine == "mysql" {
            60_000
        } else {
            1 << 20
        };
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![
                ("DeadLetteredAt", now_sql(db).into()),
                ("Attempts", "5".into()),
                ("LastError", lit(db, &hostile_error_text(bytes))),
            ],
            Expect::StaysDead("boom "),
        )
    })
    .await;
}

/// A handler whose failure message is 200 KB (more than MariaDB's `TEXT` holds): the
/// row's stamp must not fail the batch it shares with the good rows' stamps.
async fn huge_handler_error_does_not_fail_the_stamp_for_others(engine: &'static str) {
    attack(engine, "loud", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("Type", lit(db, "loud.failure"))],
            Expect::Dead(vec!["a very long failure"]),
        )
        .lease(4)
    })
    .await;
}

/// `icq work --until-idle` (the binary, as CI scripts run it) over 20 good rows and one
/// hostile row: it must return, exit 0, within 30 s, with the good rows completed.
async fn until_idle_returns(engine: &'static str, tag: &str, hostile: Vec<(&'static str, String)>) {
    until_idle_settles(engine, tag, &[], hostile).await;
}

/// [`until_idle_returns`] on a table whose `relaxed` columns take NULL; afterwards no
/// row is left pending (every bad row settled).
async fn until_idle_settles(
    engine: &'static str,
    tag: &str,
    relaxed: &[&str],
    hostile: Vec<(&'static str, String)>,
) {
    let db = TestDb::with_table(engine, tag).await;
    relax_not_null(&db, relaxed).await;
    let good_ids = insert_good(&db, None).await;
    let mut columns = vec![("Type", lit(&db, "good")), ("Payload", lit(&db, "{}"))];
    columns.extend(hostile);
    db.execute(&insert_sql(&db, &columns)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = crate::common::write_config(
        dir.path(),
        "idle",
        &db.url,
        "{ polling_interval_seconds: 0.1, lease_seconds: 2 }",
        "  good: { noop: true }\n",
    );
    let log = dir.path().join("work.log");
    let started = Instant::now();
    let mut worker = crate::common::Worker::start(&config, &["--until-idle"], &log);
    let status = worker.wait_for_exit(Duration::from_secs(30)).await;
    let tail = worker.log_tail(6);
    drop(worker);
    let done = crate::common::completed(&db).await;
    assert!(
        done >= good_ids.len() as i64,
        "{engine}/{tag}: the good rows completed ({done})"
    );
    assert!(
        status.is_some(),
        "{engine}/{tag}: `icq work --until-idle` did not return within 30 s (killed); its log ends:\n{tail}"
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "{engine}/{tag}: `icq work --until-idle` exited {status:?} after {:?}\n{tail}",
        started.elapsed()
    );
    let pending = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {} IS NULL AND {} IS NULL",
            table(&db),
            db.q("ProcessedAt"),
            db.q("DeadLetteredAt")
        ))
        .await;
    assert_eq!(pending, 0, "{engine}/{tag}: every row settled\n{tail}");
}

/// A NULL `Id` (SQLite takes one in a primary key declared without NOT NULL) stayed due
/// forever and kept `--until-idle` running.
async fn work_until_idle_returns_despite_a_null_id_row(engine: &'static str) {
    until_idle_settles(engine, "idlenullid", &["Id"], vec![("Id", "NULL".into())]).await;
}

/// An `Id` that is invalid UTF-8 text was re-claimed every lease forever.
async fn work_until_idle_returns_despite_an_invalid_utf8_id_row(engine: &'static str) {
    until_idle_returns(
        engine,
        "idlebadutf8",
        vec![("Id", "CAST(X'6A6F62FF2D31' AS TEXT)".into())],
    )
    .await;
}

async fn work_until_idle_returns_despite_a_null_run_at_row(engine: &'static str) {
    until_idle_settles(
        engine,
        "idlenullrunat",
        &["RunAt"],
        vec![("RunAt", "NULL".into())],
    )
    .await;
}

async fn work_until_idle_returns_despite_a_garbage_created_at_row(engine: &'static str) {
    until_idle_returns(
        engine,
        "idlecreated",
        vec![("CreatedAt", "'garbage'".into())],
    )
    .await;
}

async fn work_until_idle_returns_despite_a_blob_id_row(engine: &'static str) {
    until_idle_returns(engine, "idleblob", vec![("Id", "X'DEADBEEF'".into())]).await;
}

/// SQLite: one row whose `Type` is invalid UTF-8 made `pending --by-type` and
/// `cancel --type` fail for the whole table ("invalid utf-8 sequence"). The row is
/// counted under its type with the invalid bytes escaped, and the other types still
/// count and cancel.
async fn invalid_utf8_type_is_counted_escaped_and_cancel_by_type_works(engine: &'static str) {
    let db = TestDb::with_table(engine, "badutf8type").await;
    let t = table(&db);
    db.execute(&format!(
        "INSERT INTO {t} (\"Type\", \"Payload\") VALUES (CAST(X'6A6F62FF2D31' AS TEXT), '{{}}'), \
         ('good', '{{}}'), ('good', '{{}}')"
    ))
    .await;
    let by_type = icq_cli(&db.url, &["pending", "--by-type", "--format", "json"]);
    by_type.assert_success();
    let counts = by_type.json();
    let text = counts.to_string();
    assert!(
        text.contains(r"job\\xFF-1"),
        "the bad type is counted, escaped: {text}"
    );
    let good = counts
        .as_array()
        .expect("an array")
        .iter()
        .find(|c| c["type"] == "good")
        .unwrap_or_else(|| panic!("the good type is counted: {text}"));
    assert_eq!(good["due"], 2, "{text}");
    icq_cli(&db.url, &["pending", "--by-type"]).assert_success();
    let cancel = icq_cli(&db.url, &["cancel", "--type", "good", "--yes"]);
    cancel.assert_success();
    let pending_good = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE \"Type\" = 'good' AND \"DeadLetteredAt\" IS NULL"
        ))
        .await;
    assert_eq!(
        pending_good, 0,
        "cancel --type good cancelled both good rows"
    );
    let bad_pending = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE \"Type\" <> 'good' AND \"DeadLetteredAt\" IS NULL"
        ))
        .await;
    assert_eq!(bad_pending, 1, "the other type is left alone");
}

/// PostgreSQL: `list` showed unrepresentable times (NULL, `infinity`, year 294276) as
/// 1970-01-01, called them due while `pending` counted them scheduled, and its "showing
/// 6" disagreed with the 7 rows listed. Now each row's state agrees with the counts, the
/// unreadable time is shown as such, and the footer counts every listed row.
async fn unrepresentable_times_are_listed_truthfully(engine: &'static str) {
    let db = TestDb::with_table(engine, "badtimes").await;
    relax_not_null(&db, &["RunAt"]).await;
    let t = table(&db);
    db.execute(&format!(
        "INSERT INTO {t} (\"Type\", \"Payload\", \"RunAt\") VALUES \
         ('now', '{{}}', now()), ('null', '{{}}', NULL), ('inf', '{{}}', 'infinity'), \
         ('neginf', '{{}}', '-infinity'), ('far', '{{}}', '294276-01-01 00:00:00+00'), \
         ('tomorrow', '{{}}', now() + interval '1 day'), ('bc', '{{}}', '4713-01-01 BC')"
    ))
    .await;
    let pending = icq_cli(&db.url, &["pending", "--format", "json"]);
    pending.assert_success();
    let counts = &pending.json()[0];
    assert_eq!(
        (counts["due"].as_u64(), counts["scheduled"].as_u64()),
        (Some(4), Some(3)),
        "NULL, -infinity, 4713 BC and now are due; tomorrow, infinity and 294276 are scheduled: {counts}"
    );
    let listed = icq_cli(&db.url, &["list", "--state", "pending", "--format", "json"]);
    listed.assert_success();
    let page = listed.json();
    let commands = page["commands"].as_array().expect("commands");
    assert_eq!(commands.len(), 7, "{page}");
    assert_eq!(
        page["total"], 7,
        "the footer's total counts every row: {page}"
    );
    let state_of = |name: &str| {
        commands
            .iter()
            .find(|c| c["type"] == name)
            .unwrap_or_else(|| panic!("{name} listed: {page}"))
    };
    for (name, state, unreadable) in [
        ("now", "due", false),
        ("null", "due", true),
        ("neginf", "due", true),
        ("bc", "due", false),
        ("tomorrow", "scheduled", false),
        ("inf", "scheduled", true),
        ("far", "scheduled", true),
    ] {
        let c = state_of(name);
        assert_eq!(c["state"], state, "{name}: {c}");
        assert_eq!(
            c["unreadable"] == serde_json::json!(["RunAt"]),
            unreadable,
            "{name}: unreadable columns named: {c}"
        );
    }
    for state in ["due", "scheduled"] {
        let out = icq_cli(&db.url, &["list", "--state", state, "--format", "json"]);
        out.assert_success();
        assert_eq!(
            out.json()["commands"].as_array().map(Vec::len),
            counts[state].as_u64().map(|n| n as usize),
            "list --state {state} lists what pending counts"
        );
    }
    let table_out = icq_cli(
        &db.url,
        &["list", "--state", "pending", "--format", "table"],
    );
    table_out.assert_success();
    assert!(
        !table_out.stdout.contains("1970-01-01"),
        "no placeholder time is shown:\n{}",
        table_out.stdout
    );
    assert_eq!(
        table_out.stdout.matches("(unreadable)").count(),
        4,
        "{}",
        table_out.stdout
    );
    assert!(
        table_out.stdout.contains("Showing 7 of 7 pending"),
        "{}",
        table_out.stdout
    );
}

/// SQLite: text `RunAt` `2461000.5` (a Julian day to SQLite's date functions) sorted as
/// text after every timestamp, so it was never claimed, while `list` showed it due on
/// 1970-01-29. It is dead-lettered, naming the column and the value.
async fn number_as_text_run_at_is_dead_lettered_within_one_lease(engine: &'static str) {
    attack(engine, "julianday", |db| {
        Hostile::new(
            db,
            Some(HOSTILE_ID),
            vec![("RunAt", "'2461000.5'".into())],
            Expect::Dead(vec![
                "column RunAt: `2461000.5` is text but not an ISO-8601 time",
            ]),
        )
        .watched()
    })
    .await;
}

async fn work_until_idle_returns_despite_a_number_as_text_run_at_row(engine: &'static str) {
    until_idle_returns(engine, "idlejulian", vec![("RunAt", "'2461000.5'".into())]).await;
}
