//! Database faults the processor must ride out. (PostgreSQL restarts and MariaDB
//! connection kills live in `tests/outage`, a binary of their own, because they disturb
//! the shared servers.)
//!
//! Here: a SQLite source drained by an `icq work` process while another program holds the
//! database's write lock (`BEGIN IMMEDIATE`, then sleeping) for most of 20 seconds, in
//! bursts, inserting more commands inside each burst. Processing must resume after every
//! burst, nothing may be lost (every command completed and delivered) or run twice, and the
//! worker must not exit.

use std::str::FromStr;
use std::time::{Duration, Instant};

use rand::RngExt;
use sqlx::ConnectOptions;

use crate::common::{
    CountingServer, HEAVY, Worker, all_ids, completed, table, write_config, yaml_str,
};
use crate::support::TestDb;

const INITIAL: usize = 3000;
const CONTENTION: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_competing_writer_holding_the_lock_loses_nothing() {
    let _heavy = HEAVY.lock().await;
    let db = TestDb::with_table("sqlite", "writer").await;
    let t = table(&db);
    let insert = |from: usize, n: usize| {
        let rows: Vec<String> = (from..from + n)
            .map(|k| format!("('slow.http', '{{\"n\": {k}}}')"))
            .collect();
        format!(
            "INSERT INTO {t} (\"Type\", \"Payload\") VALUES {}",
            rows.join(", ")
        )
    };
    db.execute(&insert(0, INITIAL)).await;

    // ~20 ms per command, 4 at once: the drain outlasts the 20 s of contention.
    let server = CountingServer::start((15, 25)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "lite",
        &db.url,
        "{ lease_seconds: 10, polling_interval_seconds: 0.2, concurrency: 4 }",
        &format!(
            "  slow.http:\n    http: {{ url: {} }}\n    timeout_seconds: 5\n",
            yaml_str(&server.url())
        ),
    );
    let log = dir.path().join("worker.log");
    let mut worker = Worker::start(&config, &[], &log);
    assert!(
        crate::common::wait_until(Duration::from_secs(20), || async {
            completed(&db).await > 0
        })
        .await,
        "the worker started processing\n{}",
        worker.log_tail(20)
    );

    // The competing writer: its own connection, a patient busy timeout.
    let mut writer = sqlx::sqlite::SqliteConnectOptions::from_str(&db.url)
        .unwrap()
        .busy_timeout(Duration::from_secs(60))
        .connect()
        .await
        .unwrap();
    let mut rng = rand::rng();
    let started = Instant::now();
    let mut locked = Duration::ZERO;
    let mut inserted = 0usize;
    let mut progress: Vec<i64> = Vec::new();
    let mut bursts = 0;
    while started.elapsed() < CONTENTION {
        let hold = Duration::from_millis(rng.random_range(1500..3000));
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut writer)
            .await
            .unwrap();
        let took = Instant::now();
        sqlx::raw_sql(sqlx::AssertSqlSafe(insert(INITIAL + inserted, 25)))
            .execute(&mut writer)
            .await
            .unwrap();
        tokio::time::sleep(hold).await;
        sqlx::raw_sql("COMMIT").execute(&mut writer).await.unwrap();
        locked += took.elapsed();
        inserted += 25;
        bursts += 1;
        assert!(
            worker.exited().is_none(),
            "the worker exited during the contention\n{}",
            worker.log_tail(30)
        );
        let gap = Duration::from_millis(rng.random_range(200..600));
        tokio::time::sleep(gap).await;
        progress.push(completed(&db).await);
    }
    let window = started.elapsed();
    // The contention is over: the rest of the backlog (kept slow so it outlasted the
    // window) is drained at full speed; every command must still complete, delivered.
    server.set_delay((0, 0));
    let total = INITIAL + inserted;
    let drained = crate::common::wait_until(Duration::from_secs(180), || async {
        completed(&db).await == total as i64
    })
    .await;
    let alive = worker.exited().is_none();
    let status = worker.stop(Duration::from_secs(30)).await;
    let done = completed(&db).await;
    let counts = server.counts();
    let ids = all_ids(&db).await;
    let never = ids
        .iter()
        .filter(|id| !counts.contains_key(id.as_str()))
        .count();
    let repeated = counts.values().filter(|&&n| n > 1).count();
    eprintln!(
        "sqlite competing writer: lock held {locked:.1?} of {window:.1?} in {bursts} bursts; \
         {total} commands ({inserted} inserted under the lock); completed {done}; never delivered {never}; \
         delivered more than once {repeated}; completions after each burst {progress:?}"
    );
    assert!(alive, "the worker exited\n{}", worker.log_tail(30));
    assert!(
        drained,
        "not drained: {done} of {total} completed\n{}",
        worker.log_tail(30)
    );
    assert_eq!(never, 0, "commands completed without a delivery");
    // Nothing crashed, so nothing runs twice: a lease (10 s, bursts of up to 3 s) outlives
    // the writer's bursts when its renewals wait for the lock, neither abandoned at the
    // call deadline nor queued behind the processor's claims and stamps.
    assert_eq!(
        repeated, 0,
        "commands delivered more than once without a crash"
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "the worker stopped cleanly on SIGTERM: {status:?}\n{}",
        worker.log_tail(30)
    );
    assert!(
        locked.as_secs_f64() >= window.as_secs_f64() * 0.6,
        "the writer held the lock for most of the window ({locked:?} of {window:?})"
    );
    // Processing resumed between bursts: completions grew in every gap between two
    // bursts but at most one (a gap is 200–600 ms; a loaded machine may spend one).
    let grew = progress.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(
        grew + 1 >= progress.len().saturating_sub(1),
        "processing stalled during the contention: completions after each burst {progress:?}"
    );
}
