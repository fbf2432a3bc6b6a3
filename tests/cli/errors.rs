//! Errors as the binary reports them: one JSON document on stderr under `--format json`
//! (clap's usage errors included), the documented exit codes and kinds, no password ever,
//! and connection failures (defect 8) that say at once what went wrong.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::TestDb;

fn icq(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .output()
        .unwrap()
}

/// The one JSON document on stderr, checked to have exactly the three documented fields
/// and the process's exit code.
fn error_document(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr}");
    let doc: Value = serde_json::from_str(&stderr).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let error = doc["error"].as_object().expect("an `error` object");
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["exit_code", "kind", "message"], "{stderr}");
    assert_eq!(
        doc["error"]["exit_code"].as_i64(),
        out.status.code().map(i64::from)
    );
    assert!(out.stdout.is_empty(), "nothing on stdout");
    doc["error"].clone()
}

#[test]
fn clap_usage_errors_are_json_under_format_json() {
    for args in [
        &["--format", "json", "work", "--until-idel"][..],
        &["work", "--until-idel", "--format=json"][..],
        &["--format", "json", "purge", "--older-than", "soon"][..],
        &["--format", "json", "frobnicate"][..],
        &["--format", "json"][..],
    ] {
        let out = icq(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let error = error_document(&out);
        assert_eq!(error["kind"], "usage", "{args:?}");
        assert!(
            !error["message"].as_str().unwrap().starts_with("error:"),
            "{error}"
        );
    }
    let error = error_document(&icq(&["--format", "json"]));
    assert_eq!(
        error["message"],
        "a subcommand is required; see `icq --help` for the list"
    );
    let error = error_document(&icq(&["--format", "json", "work", "--until-idel"]));
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("'--until-idel'"), "{message}");
    assert!(
        message.contains("'--until-idle'"),
        "the tip is kept: {message}"
    );
}

#[test]
fn help_and_version_are_not_errors_under_format_json() {
    let help = icq(&["--format", "json", "work", "--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage:"));
    let version = icq(&["--version", "--format", "json"]);
    assert_eq!(version.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("icq "));
}

#[test]
fn usage_errors_stay_text_without_format_json() {
    let out = icq(&["work", "--until-idel"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: unexpected argument"), "{stderr}");
    assert!(serde_json::from_str::<Value>(&stderr).is_err());
}

#[test]
fn config_errors_are_json_with_kind_config() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let out = icq(&[
        "pending",
        "--format",
        "json",
        "--config",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let error = error_document(&out);
    assert_eq!(error["kind"], "config");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("no such configuration file"),
        "{error}"
    );
}

#[tokio::test]
async fn not_found_is_json_with_exit_code_3() {
    let db = TestDb::with_table("sqlite", "json_not_found").await;
    let out = icq(&[
        "--format",
        "json",
        "dead-letters",
        "show",
        "0b5e3c1e-8f0a-4c1e-9d0e-2f3a4b5c6d7e",
        "--database-url",
        &db.url,
    ]);
    assert_eq!(out.status.code(), Some(3));
    let error = error_document(&out);
    assert_eq!(error["kind"], "not_found");
}

#[tokio::test]
async fn a_missing_table_is_json_with_kind_table_missing() {
    let db = TestDb::new("postgres", "json_no_table").await;
    let out = icq(&["pending", "--format", "json", "--database-url", &db.url]);
    assert_eq!(out.status.code(), Some(1));
    let error = error_document(&out);
    assert_eq!(error["kind"], "table_missing");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("icq migrate add --engine postgres")
    );
}

#[test]
fn defect_8_a_refused_port_says_connection_refused_at_once() {
    for (url, address) in [
        ("postgres://postgres:s3cret@127.0.0.1:1/test", "127.0.0.1:1"),
        ("mysql://root:s3cret@127.0.0.1:2/test", "127.0.0.1:2"),
    ] {
        for format in ["table", "json"] {
            let started = Instant::now();
            let out = icq(&["pending", "--database-url", url, "--format", format]);
            let elapsed = started.elapsed();
            assert_eq!(out.status.code(), Some(1), "{url}");
            assert!(
                elapsed < Duration::from_secs(3),
                "{url}: took {elapsed:?} (the pool's timeout is 10 s)"
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(&format!("connection refused ({address})")),
                "{stderr}"
            );
            assert!(!stderr.contains("pool timed out"), "{stderr}");
            assert!(!stderr.contains("s3cret"), "no password: {stderr}");
            if format == "json" {
                assert_eq!(error_document(&out)["kind"], "connection");
            }
        }
    }
}

#[test]
fn defect_8_a_password_with_an_unescaped_at_sign_gets_a_hint() {
    let out = icq(&[
        "pending",
        "--database-url",
        "postgres://postgres:p@ss@127.0.0.1:1/test",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("connection refused (127.0.0.1:1)"),
        "{stderr}"
    );
    assert!(stderr.contains("percent-encode"), "{stderr}");
    assert!(stderr.contains("%40"), "{stderr}");
    assert!(!stderr.contains("p@ss"), "no password: {stderr}");
}

#[tokio::test]
async fn defect_8_postgres_errors_have_no_line_suffix() {
    // A table of the right name but the wrong shape: the first query fails in the server.
    let db = TestDb::new("postgres", "line_suffix").await;
    db.execute("CREATE TABLE \"InternalCommands\" (\"Id\" uuid PRIMARY KEY)")
        .await;
    let out = icq(&["pending", "--database-url", &db.url]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(!stderr.contains(" at line "), "{stderr}");
}
