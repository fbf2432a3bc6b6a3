//! The operator's CLI: missing-table hints that carry the source's own
//! table and source (defect 6), and the fast connection-refused report through the
//! library's own connect path.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::TestDb;

fn icq(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(args)
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .output()
        .unwrap()
}

/// An `icq.yaml` in a fresh directory with one source `orders` on `url`, table `table`.
fn config_dir(url: &str, table: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!("sources:\n  - name: orders\n    url: \"{url}\"\n    table: {table}\n");
    std::fs::write(dir.path().join("icq.yaml"), yaml).unwrap();
    dir
}

#[tokio::test]
async fn defect_6_missing_table_hint_carries_table_and_source() {
    for engine in ["postgres", "sqlite", "mysql"] {
        let db = TestDb::new(engine, "hint_table").await;
        let dir = config_dir(&db.url, "Nope");
        let out = icq(&["pending"], dir.path());
        assert_eq!(out.status.code(), Some(1), "{engine}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("icq migrate add --engine {engine} --table Nope")),
            "{engine}: {stderr}"
        );
        assert!(
            stderr.contains("icq migrate run --source orders"),
            "{engine}: {stderr}"
        );
    }
}

#[tokio::test]
async fn defect_6_a_missing_schema_says_so_with_a_hint() {
    for engine in ["postgres", "sqlite", "mysql"] {
        let db = TestDb::new(engine, "hint_schema").await;
        let dir = config_dir(&db.url, "nosuchschema.Jobs");
        for format in ["table", "json"] {
            let out = icq(&["pending", "--format", format], dir.path());
            assert_eq!(out.status.code(), Some(1), "{engine}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(
                    "the schema `nosuchschema` of table nosuchschema.Jobs does not exist"
                ),
                "{engine}: {stderr}"
            );
            assert!(stderr.contains("hint:"), "{engine}: {stderr}");
            if format == "json" {
                assert!(stderr.contains("\"table_missing\""), "{engine}: {stderr}");
            }
        }
    }
}

#[tokio::test]
async fn an_existing_schema_with_a_missing_table_is_a_missing_table() {
    let db = TestDb::new("postgres", "hint_schema_ok").await;
    db.execute("CREATE SCHEMA jobs").await;
    let dir = config_dir(&db.url, "jobs.Missing");
    let out = icq(&["pending"], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("table jobs.Missing does not exist"),
        "{stderr}"
    );
    assert!(stderr.contains("--table jobs.Missing"), "{stderr}");
}

#[tokio::test]
async fn queue_connect_to_a_refused_port_fails_fast_with_the_cause() {
    for url in [
        "postgres://postgres:s3cret@127.0.0.1:1/test",
        "mysql://root:s3cret@127.0.0.1:1/test",
    ] {
        let started = Instant::now();
        let result = icq::Queue::connect(
            "lib",
            url,
            &icq::TableName::default(),
            &icq::ConnectOptions::default(),
        )
        .await;
        let Err(err) = result else {
            panic!("{url}: connected to a refused port");
        };
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{url}: took {:?} (the pool's timeout is 10 s)",
            started.elapsed()
        );
        let message = err.to_string();
        assert!(
            message.contains("connection refused (127.0.0.1:1)"),
            "{message}"
        );
        assert!(message.contains("source `lib`"), "{message}");
        assert!(!message.contains("s3cret"), "{message}");
        assert_eq!(
            err.database_kind(),
            Some(icq::error::DatabaseErrorKind::Connection),
            "{err:?}"
        );
    }
}

#[test]
fn dead_letters_list_and_show_help_have_an_example_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    for (sub, example, code) in [
        ("list", "icq dead-letters list --type", "0  listed"),
        (
            "show",
            "icq dead-letters show 0b9e6c1e",
            "3  no command has that id",
        ),
    ] {
        let out = icq(&["dead-letters", sub, "--help"], dir.path());
        assert!(out.status.success(), "{sub}");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Examples:"), "{sub}: {help}");
        assert!(help.contains(example), "{sub}: {help}");
        assert!(help.contains("Exit codes:"), "{sub}: {help}");
        assert!(help.contains(code), "{sub}: {help}");
    }
}
