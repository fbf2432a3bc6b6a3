//! `icq doctor`: table size, the transaction holding back cleanup (named by pid, state
//! and age), the oldest due command's wait, each with advice; exit 1 when something needs
//! action and 0 when healthy, on every engine against real servers.

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use sqlx::Connection;

use crate::support::TestDb;

fn doctor(url: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["doctor", "--database-url", url])
        .args(extra)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(out)))
}

fn findings(report: &Value) -> Vec<(String, String)> {
    report["sources"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["severity"].as_str().unwrap().to_owned(),
                f["what"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn a_fresh_table_is_healthy(engine: &'static str) {
    let db = TestDb::with_table(engine, "doctor_fresh").await;
    let out = doctor(&db.url, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report = json(&out);
    assert_eq!(report["needs_action"], false);
    let source = &report["sources"][0];
    assert_eq!(source["engine"], engine);
    assert_eq!(source["table"]["table"], "InternalCommands");
    assert!(
        source["table"]["total_bytes"].as_u64().unwrap() > 0,
        "{source}"
    );
    assert!(source["oldest_due_wait_seconds"].is_null(), "{source}");
    assert!(
        findings(&report)
            .iter()
            .all(|(severity, _)| severity != "action"),
        "{report}"
    );
    let out = doctor(&db.url, &["--format", "table"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = text(&out);
    assert!(shown.contains("InternalCommands: "), "{shown}");
    assert!(
        shown.contains("oldest due command waited: nothing due"),
        "{shown}"
    );
}

async fn a_due_backlog_is_reported_with_its_wait(engine: &'static str) {
    let db = TestDb::with_table(engine, "doctor_backlog").await;
    let run_at = (chrono::Utc::now() - chrono::Duration::minutes(10))
        .format("%Y-%m-%dT%H:%M:%S")
        .to_string();
    let minutes_ago = |m: i64| {
        db.ts(&(chrono::Utc::now() - chrono::Duration::minutes(m))
            .format("%Y-%m-%dT%H:%M:%S")
            .to_string())
    };
    let lease = db.ts(&(chrono::Utc::now() + chrono::Duration::minutes(5))
        .format("%Y-%m-%dT%H:%M:%S")
        .to_string());
    // The oldest due row is of a later priority; an older one is running (leased), and
    // a due one of the first priority is younger: the wait is the late one's.
    db.insert_row(
        "7d7b5f2e-4a57-4a5e-9a60-000000000001",
        "late.one",
        "{}",
        &[("RunAt", db.ts(&run_at)), ("Priority", "5".into())],
    )
    .await;
    db.insert_row(
        "7d7b5f2e-4a57-4a5e-9a60-000000000002",
        "fresh.one",
        "{}",
        &[("RunAt", minutes_ago(2))],
    )
    .await;
    db.insert_row(
        "7d7b5f2e-4a57-4a5e-9a60-000000000004",
        "running.one",
        "{}",
        &[
            ("RunAt", minutes_ago(30)),
            ("Priority", "5".into()),
            ("LockedUntil", lease),
            ("LockToken", "'7d7b5f2e-4a57-4a5e-9a60-0000000000ff'".into()),
        ],
    )
    .await;
    let out = doctor(&db.url, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json(&out);
    assert_eq!(report["needs_action"], true);
    let wait = report["sources"][0]["oldest_due_wait_seconds"]
        .as_f64()
        .unwrap();
    assert!((595.0..700.0).contains(&wait), "{wait}");
    let found = findings(&report);
    assert!(
        found
            .iter()
            .any(|(s, what)| s == "action" && what.contains("oldest due command has waited 10m")),
        "{found:?}"
    );
    let out = doctor(&db.url, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = text(&out);
    assert!(
        shown.contains("[ACTION] the oldest due command has waited 10m"),
        "{shown}"
    );
    assert!(
        shown.contains("what to do: no worker is taking commands"),
        "{shown}"
    );
    assert!(shown.contains("error: 1 finding needs action"), "{shown}");
    // A stricter threshold still reports it; a looser one does not.
    let out = doctor(&db.url, &["--max-age", "1h"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A URL with a password PostgreSQL's trust authentication ignores.
fn with_password(url: &str) -> String {
    url.replacen("postgres://postgres@", "postgres://postgres:sekrit-pw@", 1)
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_names_an_idle_in_transaction_session() {
    let db = TestDb::with_table("postgres", "doctor_idle").await;
    let url = with_password(&db.url);
    let mut planted = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("SET application_name = 'planted-app'")
        .execute(&mut planted)
        .await
        .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut planted)
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut planted).await.unwrap();
    sqlx::raw_sql("SELECT txid_current(), 'sekrit-literal'")
        .execute(&mut planted)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;

    // Under the default thresholds two seconds is information, not action.
    let out = doctor(&url, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report = json(&out);
    let holder = &report["sources"][0]["xmin_holder"];
    assert_eq!(holder["pid"], pid, "{report}");
    assert_eq!(holder["state"], "idle in transaction");
    assert_eq!(holder["application_name"], "planted-app");
    assert!(
        holder["transaction_age_seconds"].as_f64().unwrap() >= 2.0,
        "{holder}"
    );
    assert!(
        holder["state_age_seconds"].as_f64().unwrap() >= 2.0,
        "{holder}"
    );
    assert_eq!(holder["query_head"], "SELECT txid_current(), '…'");

    // Past a (stricter) threshold it needs action, named by pid, state and age.
    let out = doctor(&url, &["--format", "json", "--max-age", "1s"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json(&out);
    assert_eq!(report["needs_action"], true);
    let found = findings(&report);
    let (_, what) = found
        .iter()
        .find(|(s, _)| s == "action")
        .unwrap_or_else(|| panic!("{found:?}"));
    assert!(
        what.starts_with(&format!("pid {pid} (app 'planted-app', from 127.0.0.1:")),
        "{what}"
    );
    assert!(what.contains(", idle in transaction for "), "{what}");
    assert!(
        what.contains("holds the xmin horizon: dead rows cannot be removed; last statement: SELECT txid_current(), '…'"),
        "{what}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error: Value = serde_json::from_str(stderr.trim()).unwrap();
    assert_eq!(error["error"]["kind"], "needs_action");
    assert_eq!(error["error"]["exit_code"], 1);

    let out = doctor(&url, &["--max-age", "1s"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = text(&out);
    assert!(
        shown.contains(&format!("[ACTION] pid {pid} (app 'planted-app'")),
        "{shown}"
    );
    let idle_for = shown
        .split("idle in transaction for ")
        .nth(1)
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        idle_for.starts_with(|c: char| c.is_ascii_digit()),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("SELECT pg_terminate_backend({pid})")),
        "{shown}"
    );
    assert!(!shown.contains("sekrit"), "a secret shown: {shown}");

    // Once it ends, the source is healthy again.
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut planted)
        .await
        .unwrap();
    let out = doctor(&url, &["--max-age", "1s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = text(&out);
    assert!(shown.contains("oldest transaction: none open"), "{shown}");
    assert!(!shown.contains("sekrit"), "a secret shown: {shown}");
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_reports_dead_rows_and_history() {
    let db = TestDb::with_table("postgres", "doctor_dead").await;
    db.execute(
        r#"ALTER TABLE "InternalCommands" SET (autovacuum_enabled = false);
           INSERT INTO "InternalCommands" ("Id", "Type", "Payload", "ProcessedAt")
             SELECT gen_random_uuid(), 't', '{}', now() FROM generate_series(1, 12000);
           DELETE FROM "InternalCommands";
           ANALYZE "InternalCommands";"#,
    )
    .await;
    // The statistics collector reports the dead rows within a second or so.
    let mut report = Value::Null;
    for _ in 0..50 {
        let out = doctor(&db.url, &["--format", "json"]);
        report = json(&out);
        if report["sources"][0]["table"]["dead_rows"].as_u64() > Some(10_000) {
            assert_eq!(out.status.code(), Some(1), "{}", text(&out));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let source = &report["sources"][0];
    assert!(
        source["table"]["dead_rows"].as_u64() > Some(10_000),
        "{report}"
    );
    assert_eq!(
        source["history"]["table"], "InternalCommandsHistory",
        "{report}"
    );
    assert!(
        source["table"]["storage_settings"]
            .as_str()
            .unwrap()
            .contains("autovacuum_enabled=false"),
        "{report}"
    );
    let found = findings(&report);
    assert!(
        found
            .iter()
            .any(|(s, what)| s == "action" && what.contains("dead row versions")),
        "{found:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_names_an_open_transaction() {
    let db = TestDb::with_table("mysql", "doctor_open").await;
    db.insert_row("7d7b5f2e-4a57-4a5e-9a60-000000000003", "held", "{}", &[])
        .await;
    let mut planted = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&mut planted)
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN; SELECT `Id` FROM `InternalCommands` FOR UPDATE")
        .execute(&mut planted)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;

    // Other tests' transactions share the server: look for this one by its thread id.
    let out = doctor(&db.url, &["--format", "json", "--max-age", "1s"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json(&out);
    let long = report["sources"][0]["long_transactions"]
        .as_array()
        .unwrap();
    let mine = long
        .iter()
        .find(|s| s["pid"] == id)
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(mine["state"], "idle in transaction", "{mine}");
    assert!(
        mine["transaction_age_seconds"].as_f64().unwrap() >= 1.0,
        "{mine}"
    );

    let out = doctor(&db.url, &["--max-age", "1s"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = text(&out);
    assert!(shown.contains(&format!("pid {id} (")), "{shown}");
    assert!(shown.contains(&format!("KILL {id}")), "{shown}");
    assert!(shown.contains("InnoDB history list length: "), "{shown}");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut planted)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_reports_sizes_and_says_what_it_cannot_see() {
    let db = TestDb::with_table("sqlite", "doctor_sqlite").await;
    db.insert_row("a", "t", "{}", &[]).await;
    let out = doctor(&db.url, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report = json(&out);
    let source = &report["sources"][0];
    assert!(
        source["table"]["table_bytes"].as_u64().unwrap() > 0,
        "{source}"
    );
    assert!(source["wal_bytes"].as_u64().is_some(), "{source}");
    assert!(source["xmin_holder"].is_null(), "{source}");
    assert_eq!(
        source["history"]["table"], "InternalCommandsHistory",
        "{source}"
    );
    assert!(
        source["history"]["table_bytes"].as_u64().unwrap() > 0,
        "{source}"
    );
    assert!(
        source["oldest_due_wait_seconds"].as_f64().is_some(),
        "{source}"
    );
    assert!(
        findings(&report)
            .iter()
            .any(|(s, what)| s == "info" && what.contains("does not show other connections")),
        "{report}"
    );
}

macro_rules! per_engine {
    ($($name:ident),*) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("postgres").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("sqlite").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("mysql").await } )* }
    };
}

per_engine!(
    a_fresh_table_is_healthy,
    a_due_backlog_is_reported_with_its_wait
);

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_publishes_the_health_gauges() {
    let db = TestDb::with_table("postgres", "doctor_gauges").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: main\n    url: \"{}\"\nhandlers:\n  t:\n    noop: true\n",
            with_password(&db.url)
        ),
    )
    .unwrap();
    let spawn = |port: u16| {
        Command::new(env!("CARGO_BIN_EXE_icq"))
            .args([
                "work",
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
                "--config",
            ])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let mut port = free_port();
    let mut worker = spawn(port);
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    let body = loop {
        if worker.try_wait().unwrap().is_some() {
            port = free_port();
            worker = spawn(port);
        }
        if let Ok(response) = client
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
            && response.status() == 200
        {
            let body = response.text().await.unwrap();
            if body.contains("icq_internal_commands_oldest_due_wait_seconds") {
                break body;
            }
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = worker.kill();
            panic!("no health gauges from icq work");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = worker.kill();
    let _ = worker.wait();
    for series in [
        r#"icq_internal_commands_table_bytes{source="main",table="commands"}"#,
        r#"icq_internal_commands_dead_rows{source="main"}"#,
        r#"icq_internal_commands_xmin_holder_age_seconds{source="main"}"#,
        r#"icq_internal_commands_long_transactions{source="main"}"#,
        r#"icq_internal_commands_oldest_due_wait_seconds{source="main"}"#,
    ] {
        assert!(body.contains(series), "{series} missing: {body}");
    }
    assert!(!body.contains("sekrit"), "{body}");
}
