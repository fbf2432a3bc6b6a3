//! `icq work --until-idle --fail-on-dead`: exit 1 when the run dead-lettered anything,
//! counting only what this run's processor dead-lettered, on every engine.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::TestDb;

fn config(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join("icq.yaml");
    let text = format!(
        "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n      max_attempts: 1\n      \
         polling_interval_seconds: 0.1\nhandlers:\n  always.fails:\n    exec: [sh, -c, 'exit 3']\n    \
         timeout_seconds: 10\n  always.works:\n    noop: true\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn insert(db: &TestDb, ty: &str, n: usize) {
    let (t, c1, c2) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
    for i in 0..n {
        db.execute(&format!(
            "INSERT INTO {t} ({c1}, {c2}) VALUES ('{ty}', '{{\"n\": {i}}}')"
        ))
        .await;
    }
}

fn work(config: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["work", "--until-idle", "--config"])
        .arg(config)
        .args(extra)
        .env("RUST_LOG", "off")
        .output()
        .unwrap()
}

async fn dead_count(db: &TestDb) -> i64 {
    db.scalar_i64(&format!(
        "SELECT COUNT(*) FROM {} WHERE {} IS NOT NULL",
        db.q("InternalCommands"),
        db.q("DeadLetteredAt")
    ))
    .await
}

async fn a_failing_handler_fails_the_run(engine: &'static str) {
    let db = TestDb::with_table(engine, "fail_on_dead").await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &db.url);
    insert(&db, "always.fails", 2).await;
    insert(&db, "always.works", 3).await;
    let out = work(&config, &["--fail-on-dead"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("2 commands were dead-lettered during this run"),
        "{stderr}"
    );
    assert_eq!(dead_count(&db).await, 2);

    // The earlier run's dead letters are not this run's: nothing new, exit 0.
    insert(&db, "always.works", 1).await;
    let out = work(&config, &["--fail-on-dead"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn an_unknown_type_fails_the_run_as_json(engine: &'static str) {
    let db = TestDb::with_table(engine, "fail_on_dead_unknown").await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &db.url);
    insert(&db, "nobody.handles.this", 1).await;
    let out = work(&config, &["--fail-on-dead", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&out.stderr)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(doc["error"]["kind"], "dead_lettered");
    assert_eq!(doc["error"]["exit_code"], 1);
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("1 command was dead-lettered"),
        "{doc}"
    );
}

async fn without_the_flag_dead_letters_do_not_fail(engine: &'static str) {
    let db = TestDb::with_table(engine, "no_fail_on_dead").await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &db.url);
    insert(&db, "always.fails", 1).await;
    let out = work(&config, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(dead_count(&db).await, 1);
}

macro_rules! per_engine {
    ($($name:ident),*) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("postgres").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("sqlite").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("mysql").await } )* }
    };
}

per_engine!(
    a_failing_handler_fails_the_run,
    an_unknown_type_fails_the_run_as_json,
    without_the_flag_dead_letters_do_not_fail
);

#[test]
fn fail_on_dead_requires_until_idle() {
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["work", "--fail-on-dead"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--until-idle"), "{stderr}");
}
