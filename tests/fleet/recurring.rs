//! Recurring schedules in a fleet: four `icq work` replicas tick one `every: 1s` schedule
//! while replicas are SIGKILLed, stopped and started again; every occurrence is scheduled
//! exactly once, with no gap, on the database's clock (on the server engines one replica
//! runs two minutes ahead under faketime and schedules nothing early).
//!
//! The run lasts `ICQ_RECURRING_SECONDS` (default 20 s; the measurement in the README
//! used 60).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;

use crate::Replica;
use crate::support::TestDb;

/// Every value of a one-column text query.
async fn texts(db: &TestDb, sql: &str) -> Vec<String> {
    use sqlx::Connection;
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    match db.engine {
        "postgres" => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar(sql).fetch_all(&mut c).await.unwrap()
        }
        "mysql" => {
            let mut c = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar(sql).fetch_all(&mut c).await.unwrap()
        }
        _ => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar(sql).fetch_all(&mut c).await.unwrap()
        }
    }
}

fn write_config(dir: &Path, url: &str) -> std::path::PathBuf {
    let path = dir.join("icq.yaml");
    let text = format!(
        "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n      \
         polling_interval_seconds: 0.5\n    schedules:\n      - name: every\n        \
         every: 1s\n        type: tick.every\n        payload: {{ from: schedule }}\n\
         handlers:\n  tick.every:\n    noop: true\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn every_second_once_while_replicas_come_and_go(engine: &'static str) {
    let seconds: u64 = std::env::var("ICQ_RECURRING_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let db = TestDb::with_table(engine, "recurring").await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &db.url);
    let log = dir.path().join("log");
    // SQLite's clock is the process's own: a skewed process would be a skewed database.
    let skewed: &[&str] = if engine == "sqlite" {
        &[]
    } else {
        &["faketime", "-f", "+120s"]
    };
    let start = |n: usize| {
        let prefix = if n == 3 { skewed } else { &[] };
        Replica::start(prefix, &config, &[], &[], &log)
    };
    let began = Instant::now();
    let mut replicas: Vec<Option<Replica>> = (0..4).map(|n| Some(start(n))).collect();
    let mut round = 0usize;
    let mut events = Vec::new();
    while began.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        round += 1;
        let n = round % 4;
        if round.is_multiple_of(5) {
            // All but one at once, back after two seconds.
            for other in (0..4).filter(|&o| o != n) {
                if let Some(replica) = &replicas[other] {
                    replica.signal(Signal::SIGKILL);
                }
                replicas[other] = None;
            }
            events.push(format!("{:?}: killed all but {n}", began.elapsed()));
            tokio::time::sleep(Duration::from_secs(2)).await;
            for other in (0..4).filter(|&o| o != n) {
                replicas[other] = Some(start(other));
            }
            continue;
        }
        let signal = if round.is_multiple_of(3) {
            Signal::SIGTERM
        } else {
            Signal::SIGKILL
        };
        if let Some(mut replica) = replicas[n].take() {
            replica.signal(signal);
            if signal == Signal::SIGTERM {
                replica.wait(Duration::from_secs(10)).await;
            }
        }
        events.push(format!("{:?}: {signal} {n}", began.elapsed()));
        tokio::time::sleep(Duration::from_millis(700)).await;
        replicas[n] = Some(start(n));
    }
    let elapsed = began.elapsed();
    for replica in replicas.iter().flatten() {
        replica.signal(Signal::SIGKILL);
    }
    drop(replicas);

    let key = db.q("UniqueKey");
    let keys = texts(
        &db,
        &format!(
            "SELECT {key} FROM {} WHERE {key} LIKE 'schedule:every:%'",
            db.all_rows()
        ),
    )
    .await;
    let mut occurrences: BTreeMap<DateTime<Utc>, usize> = BTreeMap::new();
    for key in &keys {
        let at = key.strip_prefix("schedule:every:").unwrap();
        let at = DateTime::parse_from_rfc3339(at)
            .unwrap()
            .with_timezone(&Utc);
        *occurrences.entry(at).or_default() += 1;
    }
    let twice: Vec<_> = occurrences.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{engine}: occurrences scheduled more than once: {twice:?}"
    );
    let (first, last) = (
        *occurrences.keys().next().expect("an occurrence"),
        *occurrences.keys().next_back().expect("an occurrence"),
    );
    let span = (last - first).num_seconds() + 1;
    let missing: Vec<_> = (0..span)
        .map(|s| first + chrono::Duration::seconds(s))
        .filter(|at| !occurrences.contains_key(at))
        .collect();
    assert!(
        missing.is_empty(),
        "{engine}: occurrences never scheduled: {missing:?}\n{events:#?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Nothing scheduled ahead of the database's clock (the skewed replica's would be).
    let future = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {key} LIKE 'schedule:every:%' AND {} > {}",
            db.all_rows(),
            db.q("RunAt"),
            db.now_sql()
        ))
        .await;
    assert_eq!(future, 0, "{engine}: occurrences scheduled ahead of now");
    // How long after its occurrence each command was scheduled (CreatedAt - RunAt).
    let (created, run_at) = (db.q("CreatedAt"), db.q("RunAt"));
    let lag_ms = match engine {
        "postgres" => format!("(EXTRACT(EPOCH FROM {created} - {run_at}) * 1000)::text"),
        "mysql" => format!("CAST(TIMESTAMPDIFF(MICROSECOND, {run_at}, {created}) / 1000 AS CHAR)"),
        _ => format!("CAST((julianday({created}) - julianday({run_at})) * 86400000 AS TEXT)"),
    };
    let mut lags: Vec<f64> = texts(
        &db,
        &format!(
            "SELECT {lag_ms} FROM {} WHERE {key} LIKE 'schedule:every:%'",
            db.all_rows()
        ),
    )
    .await
    .iter()
    .map(|lag| lag.parse().unwrap())
    .collect();
    lags.sort_by(f64::total_cmp);
    let median = lags[lags.len() / 2];
    let p95 = lags[lags.len() * 95 / 100];
    eprintln!(
        "{engine}: scheduled after its occurrence by {median:.0} ms (median), {p95:.0} ms (p95), {:.0} ms (max)",
        lags[lags.len() - 1]
    );
    // About one a second of the run (the first replica starts in well under a second).
    let expected = elapsed.as_secs_f64();
    eprintln!(
        "{engine}: {} occurrences, each once, no gap, from {first} to {last} ({span} s) in a \
         {expected:.1} s run with {} kills/stops",
        occurrences.len(),
        events.len()
    );
    assert!(
        (occurrences.len() as f64) >= expected - 3.0
            && (occurrences.len() as f64) <= expected + 2.0,
        "{engine}: {} occurrences in {expected:.1} s",
        occurrences.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_second_once_while_replicas_come_and_go_postgres() {
    every_second_once_while_replicas_come_and_go("postgres").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_second_once_while_replicas_come_and_go_mysql() {
    every_second_once_while_replicas_come_and_go("mysql").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_second_once_while_replicas_come_and_go_sqlite() {
    every_second_once_while_replicas_come_and_go("sqlite").await;
}
