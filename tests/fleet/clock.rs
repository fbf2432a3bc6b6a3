//! One clock: the database's. A replica whose clock is minutes off runs
//! commands exactly as one whose clock is right, beside a correct one, and neither starves
//! the other. (SQLite has no server: its "database clock" is the clock of the process
//! running the statement, so this is a server-engine test.)

use std::collections::HashMap;
use std::time::Duration;

use crate::support::TestDb;
use crate::{Replica, insert_many, lines, recording_handler, wait_until, write_config};

/// Under `faketime -120s` a worker released every row it claimed with `RunAt`
/// pushed ~115 s ahead, forever, starving a healthy replica beside it too.
async fn skewed_replicas_run_every_command_once(engine: &'static str) {
    let db = TestDb::with_table(engine, "clock").await;
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let config = write_config(
        dir.path(),
        &db.url,
        "      concurrency: 4\n      polling_interval_seconds: 0.2\n      retry_backoff_base_seconds: 1",
        &recording_handler("clock.job", &runs, "exit 0"),
    );
    insert_many(&db, "clock.job", 200).await;
    let log = dir.path().join("log");
    let mut replicas = [
        Replica::start(
            &["faketime", "-f", "-120s"],
            &config,
            &["--until-idle"],
            &[("REPLICA", "behind")],
            &log,
        ),
        Replica::start(
            &["faketime", "-f", "+120s"],
            &config,
            &["--until-idle"],
            &[("REPLICA", "ahead")],
            &log,
        ),
        Replica::start(
            &[],
            &config,
            &["--until-idle"],
            &[("REPLICA", "right")],
            &log,
        ),
    ];
    for replica in &mut replicas {
        let status = replica.wait(Duration::from_secs(120)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "{engine}: a replica did not finish the drain: {status:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let (t, p) = (db.all_rows(), db.q("ProcessedAt"));
    let done = wait_until(Duration::from_secs(5), || async {
        db.scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {p} IS NOT NULL"))
            .await
            == 200
    })
    .await;
    assert!(done, "{engine}: not every command completed");
    let mut runs_per_id: HashMap<String, usize> = HashMap::new();
    let mut per_replica: HashMap<String, usize> = HashMap::new();
    for line in lines(&runs) {
        let mut parts = line.split_whitespace();
        *runs_per_id
            .entry(parts.next().unwrap().to_owned())
            .or_default() += 1;
        *per_replica
            .entry(parts.next().unwrap_or("?").to_owned())
            .or_default() += 1;
    }
    assert_eq!(runs_per_id.len(), 200, "{engine}: {per_replica:?}");
    let twice: Vec<_> = runs_per_id.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{engine}: ran more than once: {twice:?}");
    // Nothing was pushed into the future on the way: no row carries a retry.
    let a = db.q("Attempts");
    assert_eq!(
        db.scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {a} <> 1"))
            .await,
        0,
        "{engine}: some rows took more than one attempt"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn skewed_replicas_run_every_command_once_postgres() {
    skewed_replicas_run_every_command_once("postgres").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn skewed_replicas_run_every_command_once_mysql() {
    skewed_replicas_run_every_command_once("mysql").await;
}
