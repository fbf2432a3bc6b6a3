//! `icq config check`: validates a file without connecting to any database (the sources
//! below point at a refused port, so a connection attempt would fail the check).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const SOURCES: &str = "sources:\n  - name: orders\n    url: postgres://app:s3cret@127.0.0.1:1/orders\n  \
                       - name: local\n    url: sqlite:local.db\n    table: Jobs\n";

fn write(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("icq.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// An executable script in `dir`.
fn program(dir: &Path, name: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

fn check(config: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["config", "check", "--config"])
        .arg(config)
        .args(extra)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn handlers_with(program: &Path) -> String {
    format!(
        "handlers:\n  orders.send_receipt:\n    exec: [\"{}\", \"--fast\"]\n    timeout_seconds: 30\n  \
         webhooks.deliver:\n    http: {{ url: \"http://127.0.0.1:8080/hooks\" }}\n    timeout_seconds: 10\n  \
         bench.noop:\n    noop: true\n",
        program.display()
    )
}

#[test]
fn a_valid_file_passes_with_a_summary_and_no_connection() {
    let dir = tempfile::tempdir().unwrap();
    let script = program(dir.path(), "send-receipt", 0o755);
    let config = write(dir.path(), &format!("{SOURCES}{}", handlers_with(&script)));
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for wanted in [
        ": OK",
        "2 sources",
        "orders (postgres, table InternalCommands)",
        "local (sqlite, table Jobs)",
        "3 handlers",
        "orders.send_receipt (exec ",
        "webhooks.deliver (http http://127.0.0.1:8080/hooks)",
        "bench.noop (noop)",
    ] {
        assert!(stdout.contains(wanted), "{wanted:?} in {stdout}");
    }
    assert!(!stdout.contains("s3cret"), "{stdout}");
    assert!(!stdout.contains("warning"), "{stdout}");
}

#[test]
fn a_valid_file_as_one_json_document() {
    let dir = tempfile::tempdir().unwrap();
    let script = program(dir.path(), "send-receipt", 0o755);
    let config = write(dir.path(), &format!("{SOURCES}{}", handlers_with(&script)));
    let out = check(&config, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["sources"][0]["name"], "orders");
    assert_eq!(doc["sources"][0]["engine"], "postgres");
    assert_eq!(doc["sources"][1]["table"], "Jobs");
    let kinds: Vec<&str> = doc["handlers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["noop", "exec", "http"], "sorted by type: {doc}");
    assert_eq!(doc["handlers"][1]["type"], "orders.send_receipt");
    assert_eq!(doc["warnings"], serde_json::json!([]));
}

#[test]
fn a_missing_program_fails_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        &format!("{SOURCES}handlers:\n  a.run:\n    exec: [\"./bin/missing\"]\n"),
    );
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(text.contains("icq.yaml:9:12: handlers"), "{text}");
    assert!(
        text.contains("handler `a.run`: program ./bin/missing does not exist"),
        "{text}"
    );
}

#[test]
fn a_program_missing_from_path_fails() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        &format!("{SOURCES}handlers:\n  a.run:\n    exec: [icq-no-such-program]\n"),
    );
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("program `icq-no-such-program` not found on PATH"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_directory_as_program_fails() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        &format!(
            "{SOURCES}handlers:\n  a.run:\n    exec: [\"{}\"]\n",
            dir.path().display()
        ),
    );
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is a directory, not a program"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_non_executable_file_fails_and_every_problem_is_listed() {
    let dir = tempfile::tempdir().unwrap();
    let plain = program(dir.path(), "plain.sh", 0o644);
    let config = write(
        dir.path(),
        &format!(
            "{SOURCES}handlers:\n  a.run:\n    exec: [\"{}\"]\n  b.run:\n    exec: [\"/nonexistent/x\"]\n",
            plain.display()
        ),
    );
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(text.contains("2 problems found"), "{text}");
    assert!(
        text.contains(&format!("{} is not executable (chmod +x", plain.display())),
        "{text}"
    );
    assert!(text.contains("/nonexistent/x does not exist"), "{text}");

    let out = check(&config, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(2));
    let doc: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(doc["error"]["kind"], "config");
    assert_eq!(doc["error"]["exit_code"], 2);
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not executable")
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn unknown_keys_fail_with_the_loaders_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "sources:\n  - name: orders\n    url: sqlite:a.db\n    settings:\n      batchsize: 5\n",
    );
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(text.contains("icq.yaml:5:7"), "{text}");
    assert!(text.contains("unknown field `batchsize`"), "{text}");
}

#[test]
fn malformed_yaml_fails() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "sources:\n  - name: [orders\n");
    let out = check(&config, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(2));
    let doc: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(doc["error"]["kind"], "config");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("icq.yaml:"),
        "{doc}"
    );
}

#[test]
fn risky_handlers_are_warnings_not_failures() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        &format!("{SOURCES}handlers:\n  a.run:\n    exec: [sh, -c, 'true']\n"),
    );
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("warning: handler `a.run` has no timeout_seconds"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn no_file_at_all_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["config", "check"])
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path().join("config"))
        .env("ICQ_DATA_DIR", dir.path().join("data"))
        .env_remove("ICQ_CONFIG")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no configuration file found"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("data").exists(), "nothing is created");
}
