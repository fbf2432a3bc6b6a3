//! Defect 10's leftovers, each pinned: an exec program that is a directory, `icq work
//! --format json` (JSON logs), a backoff base above its cap, an oversized `batch_size`.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::TestDb;

fn icq(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(args)
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// A directory holding an `icq.yaml` with one source on `url`, the given `settings` lines
/// and `handlers` lines.
fn with_config(url: &str, settings: &str, handlers: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n      polling_interval_seconds: 0.1\n{settings}handlers:\n{handlers}"
    );
    std::fs::write(dir.path().join("icq.yaml"), text).unwrap();
    dir
}

#[tokio::test]
async fn defect_10_an_exec_program_that_is_a_directory_says_so() {
    let db = TestDb::with_table("sqlite", "exec_dir").await;
    let dir = with_config(&db.url, "", "  t:\n    exec: [\"/tmp\"]\n");
    for args in [&["work", "--until-idle"][..], &["config", "check"][..]] {
        let out = icq(dir.path(), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("/tmp is a directory, not a program"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("not found"), "{args:?}: {stderr}");
    }
}

/// `icq work` refuses programs that cannot start with the very lines `icq config check`
/// prints: the file, line, column and key of each, every one listed.
#[tokio::test]
async fn work_names_the_file_line_and_key_of_each_program_that_cannot_start() {
    let db = TestDb::with_table("sqlite", "exec_dir_line").await;
    let dir = with_config(
        &db.url,
        "",
        "  a.dir:\n    exec: [\"/tmp\"]\n  b.ok:\n    noop: true\n  c.missing:\n    exec: [./bin/missing, --flag]\n",
    );
    let check = icq(dir.path(), &["config", "check"]);
    let check_err = String::from_utf8_lossy(&check.stderr).into_owned();
    assert_eq!(check.status.code(), Some(2), "{check_err}");
    let work = icq(dir.path(), &["work", "--until-idle"]);
    let work_err = String::from_utf8_lossy(&work.stderr).into_owned();
    assert_eq!(work.status.code(), Some(2), "{work_err}");
    for wanted in [
        "icq.yaml:8:12: handlers.a.dir.exec[0]: handler `a.dir`: /tmp is a directory, not a program",
        "icq.yaml:12:12: handlers.c.missing.exec[0]: handler `c.missing`: program ./bin/missing does not exist",
        "2 problems found",
    ] {
        assert!(
            check_err.contains(wanted),
            "config check: {wanted}\n{check_err}"
        );
        assert!(work_err.contains(wanted), "work: {wanted}\n{work_err}");
    }
}

#[tokio::test]
async fn defect_10_work_format_json_logs_json_lines() {
    let db = TestDb::with_table("sqlite", "work_json").await;
    let dir = with_config(&db.url, "", "  t:\n    noop: true\n");
    let out = icq(dir.path(), &["work", "--until-idle", "--format", "json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.lines().count() > 0, "some logs");
    for line in stderr.lines() {
        let log: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(log["level"].is_string(), "{line}");
    }
    // --log-format still wins.
    let out = icq(
        dir.path(),
        &[
            "work",
            "--until-idle",
            "--format",
            "json",
            "--log-format",
            "text",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.trim_start().starts_with('{'), "{stderr}");
}

#[tokio::test]
async fn defect_10_backoff_base_above_its_cap_is_a_config_error() {
    let db = TestDb::with_table("sqlite", "backoff_cap").await;
    let dir = with_config(
        &db.url,
        "      retry_backoff_base_seconds: 700\n      max_retry_backoff_seconds: 600\n",
        "  t:\n    noop: true\n",
    );
    for args in [&["pending"][..], &["config", "check"][..]] {
        let out = icq(dir.path(), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(
                "`retry_backoff_base_seconds` (700) must not exceed `max_retry_backoff_seconds` (600)"
            ),
            "{args:?}: {stderr}"
        );
    }
}

#[tokio::test]
async fn defect_10_an_oversized_batch_size_is_out_of_range_not_invalid_yaml() {
    let db = TestDb::with_table("sqlite", "batch_range").await;
    for raw in ["99999999999", "99999999999999999999999", "1e30"] {
        let dir = with_config(
            &db.url,
            &format!("      batch_size: {raw}\n"),
            "  t:\n    noop: true\n",
        );
        let out = icq(dir.path(), &["pending"]);
        assert_eq!(out.status.code(), Some(2), "{raw}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "`batch_size` must be a whole number from 1 to 10000 (got {raw})"
            )),
            "{raw}: {stderr}"
        );
        assert!(!stderr.to_lowercase().contains("invalid yaml"), "{stderr}");
    }
}
