//! `icq bench`: a small smoke run per engine (never a timed test: only the report's shape,
//! the scratch table's removal and an untouched database are checked), and its errors.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::Connection;

use crate::support::TestDb;

/// Every key of the report, and whether its value must be greater than 0.
const KEYS: [(&str, bool); 7] = [
    ("jobs", true),
    ("enqueue_single_per_s", true),
    ("enqueue_bulk_per_s", true),
    ("drain_per_s", true),
    ("latency_p50_ms", false),
    ("latency_p99_ms", false),
    ("rss_mb", true),
];

/// `icq` with a private HOME, and no ambient configuration or database URL.
fn icq(home: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_icq"));
    cmd.current_dir(home)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home)
        .env("XDG_DATA_HOME", home)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env_remove("ICQ_DATA_DIR");
    cmd
}

fn bench_args(url: &str, jobs: &str) -> Vec<String> {
    [
        "bench",
        "--jobs",
        jobs,
        "--format",
        "json",
        "--database-url",
        url,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Every table, index, view, trigger and function in the test database, sorted.
async fn objects(db: &TestDb) -> Vec<String> {
    let mut names: Vec<String> = match db.engine {
        "postgres" => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar(
                "SELECT c.relkind::text || ' ' || n.nspname || '.' || c.relname FROM pg_class c \
                   JOIN pg_namespace n ON n.oid = c.relnamespace \
                   WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') \
                     AND n.nspname NOT LIKE 'pg_toast%' \
                 UNION ALL SELECT 'function ' || p.proname FROM pg_proc p \
                   JOIN pg_namespace n ON n.oid = p.pronamespace \
                   WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') \
                 UNION ALL SELECT 'trigger ' || tgname FROM pg_trigger WHERE NOT tgisinternal",
            )
            .fetch_all(&mut c)
            .await
            .unwrap()
        }
        "mysql" => {
            let mut c = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar(
                "SELECT CONCAT(table_type, ' ', table_name) FROM information_schema.tables \
                   WHERE table_schema = DATABASE() \
                 UNION ALL SELECT CONCAT('index ', table_name, '.', index_name) \
                   FROM information_schema.statistics WHERE table_schema = DATABASE() \
                 UNION ALL SELECT CONCAT('trigger ', trigger_name) FROM information_schema.triggers \
                   WHERE trigger_schema = DATABASE() \
                 UNION ALL SELECT CONCAT('routine ', routine_name) FROM information_schema.routines \
                   WHERE routine_schema = DATABASE()",
            )
            .fetch_all(&mut c)
            .await
            .unwrap()
        }
        _ => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar("SELECT type || ' ' || name FROM sqlite_master")
                .fetch_all(&mut c)
                .await
                .unwrap()
        }
    };
    names.sort();
    names
}

/// The default table with one pending command, to check the benchmark leaves it alone.
async fn bystander(engine: &'static str) -> TestDb {
    let db = TestDb::with_table(engine, "bench").await;
    let (t, ty, p) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
    db.execute(&format!(
        "INSERT INTO {t} ({ty}, {p}) VALUES ('app.keep', '{{\"keep\": true}}')"
    ))
    .await;
    db
}

async fn bystander_untouched(db: &TestDb) {
    let (t, a, p, l) = (
        db.q("InternalCommands"),
        db.q("Attempts"),
        db.q("ProcessedAt"),
        db.q("LockToken"),
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {a} = 0 AND {p} IS NULL AND {l} IS NULL"
        ))
        .await,
        1,
        "the application's pending command is untouched"
    );
    assert_eq!(db.scalar_i64(&format!("SELECT COUNT(*) FROM {t}")).await, 1);
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn smoke_run_reports_every_figure_and_leaves_nothing_behind(engine: &'static str) {
    let db = bystander(engine).await;
    let before = objects(&db).await;
    let home = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();

    let started = Instant::now();
    let out = icq(home.path())
        .env("TMPDIR", tmp.path())
        .args(bench_args(&db.url, "200"))
        .output()
        .unwrap();
    assert!(out.status.success(), "icq bench failed: {}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the smoke run took {:?}",
        started.elapsed()
    );
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is one JSON document ({e}): {:?}", out.stdout));
    assert_eq!(report["engine"], engine, "{report}");
    for (key, positive) in KEYS {
        let value = report[key]
            .as_f64()
            .unwrap_or_else(|| panic!("`{key}` is missing or not a number in {report}"));
        assert!(value.is_finite() && value >= 0.0, "`{key}` = {value}");
        if positive {
            assert!(value > 0.0, "`{key}` should be greater than 0 in {report}");
        }
    }
    assert_eq!(
        report.as_object().unwrap().len(),
        KEYS.len() + 1,
        "{report}"
    );
    assert_eq!(report["jobs"], 200);
    assert!(report["latency_p99_ms"].as_f64() >= report["latency_p50_ms"].as_f64());

    assert_eq!(
        objects(&db).await,
        before,
        "the scratch table and its objects are gone, nothing else changed"
    );
    bystander_untouched(&db).await;
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "the drain worker's configuration file was removed"
    );
}

macro_rules! per_engine {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("postgres").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("sqlite").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("mysql").await } )* }
    };
}

per_engine!(smoke_run_reports_every_figure_and_leaves_nothing_behind);

/// Ctrl-C in the middle of a run: the scratch table is dropped before the exit.
#[tokio::test(flavor = "multi_thread")]
async fn interrupted_run_drops_its_scratch_table() {
    let db = bystander("sqlite").await;
    let before = objects(&db).await;
    let home = tempfile::tempdir().unwrap();
    // Half a million commands (and 50,000 enqueued one transaction each first): still
    // running when the signal arrives.
    let child = icq(home.path())
        .args(bench_args(&db.url, "500000"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let scratch = objects(&db)
            .await
            .into_iter()
            .any(|o| o.starts_with("table icq_bench_"));
        if scratch {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the scratch table never appeared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("interrupted"), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "no report after an interruption");
    assert_eq!(objects(&db).await, before, "the scratch table was dropped");
    bystander_untouched(&db).await;
}

#[test]
fn a_bad_url_is_a_clear_error() {
    let home = tempfile::tempdir().unwrap();
    let out = icq(home.path())
        .args(["bench", "--database-url", "nosuch://db/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("URL scheme `nosuch:`"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());

    let out = icq(home.path())
        .args([
            "bench",
            "--database-url",
            "postgres://app:s3cret-pw@127.0.0.1:9/orders",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("127.0.0.1:9"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("s3cret-pw"), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
}

#[test]
fn a_configured_source_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let out = icq(home.path())
        .args(["bench", "--source", "orders"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--database-url"), "{}", stderr(&out));
}
