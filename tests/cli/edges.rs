//! The edges issue 10 found, through the binary: settings that would panic, wrap or spin
//! are refused at load; `--grace-seconds` is range-checked; no password (userinfo or query
//! form) reaches any output; the metrics listener serves `GET /metrics` only; handler
//! stderr cannot forge log lines.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn icq() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_icq"));
    // Keep the tests' own environment out of the way.
    command
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1");
    command
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

/// A config with one SQLite source whose settings are `settings` (a YAML flow mapping).
fn config_with_settings(dir: &Path, settings: &str) -> PathBuf {
    let db = dir.join("q.db");
    write(
        dir,
        "icq.yaml",
        &format!(
            "sources:\n  - name: s\n    url: \"sqlite://{}?mode=rwc\"\n    settings: {settings}\n\
             handlers:\n  t:\n    noop: true\n",
            db.display()
        ),
    )
}

#[test]
fn settings_that_would_panic_wrap_or_spin_exit_2_naming_key_and_range() {
    let dir = tempfile::tempdir().unwrap();
    for (settings, wanted) in [
        (
            "{ polling_interval_seconds: 1e300 }",
            "sources[0].settings.polling_interval_seconds: `polling_interval_seconds` must be a \
             number from 0.01 to 3600 (got 1e300)",
        ),
        (
            "{ polling_interval_seconds: 1e-300 }",
            "`polling_interval_seconds` must be a number from 0.01 to 3600 (got 1e-300)",
        ),
        (
            "{ cleanup_interval_hours: 1e300 }",
            "`cleanup_interval_hours` must be a number from 0.001 to 8760 (got 1e300)",
        ),
        (
            "{ retry_backoff_base_seconds: 1e300 }",
            "`retry_backoff_base_seconds` must be a number from 0 to 31536000 (got 1e300)",
        ),
        (
            "{ max_retry_backoff_seconds: 1e300 }",
            "`max_retry_backoff_seconds` must be a number from 0 to 31536000 (got 1e300)",
        ),
        (
            "{ lease_seconds: 1e12 }",
            "`lease_seconds` must be a whole number from 1 to 604800 (got 1000000000000)",
        ),
        (
            "{ lease_seconds: 1e16 }",
            "`lease_seconds` must be a whole number from 1 to 604800 (got 1e16)",
        ),
        (
            "{ retention_days: 213503982334602 }",
            "`retention_days` must be a whole number from 1 to 36500 (got 213503982334602)",
        ),
        (
            "{ batch_size: 99999999999999999999 }",
            "`batch_size` must be a whole number from 1 to 10000 (got 99999999999999999999)",
        ),
        (
            "{ concurrency: 0 }",
            "`concurrency` must be a whole number from 1 to 10000 (got 0)",
        ),
        (
            "{ max_attempts: 0 }",
            "`max_attempts` must be a whole number from 1 to 1000000 (got 0)",
        ),
        (
            "{ processing_delay_seconds: 1e9 }",
            "`processing_delay_seconds` must be a whole number from 0 to 31536000 (got \
             1000000000)",
        ),
        (
            "{ retry_backoff_base_seconds: 60, max_retry_backoff_seconds: 30 }",
            "`retry_backoff_base_seconds` (60) must not exceed `max_retry_backoff_seconds` (30)",
        ),
    ] {
        let config = config_with_settings(dir.path(), settings);
        for args in [&["pending"][..], &["work", "--until-idle"]] {
            let out = icq()
                .args(args)
                .arg("--config")
                .arg(&config)
                .output()
                .unwrap();
            let (_, stderr) = text(&out);
            assert_eq!(out.status.code(), Some(2), "{settings} {args:?}: {stderr}");
            assert!(
                stderr.contains(&format!("{}:4:", config.display())),
                "file and line: {stderr}"
            );
            assert!(stderr.contains(wanted), "{settings}: {stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
    }
}

#[test]
fn grace_seconds_out_of_range_exit_2() {
    for (value, wanted) in [
        ("inf", "must be a finite number of seconds from 0 to 86400"),
        ("1e20", "must be at most 86400 seconds"),
        ("-1", "must not be negative"),
        ("nan", "must be a finite number of seconds"),
        ("later", "is not a number of seconds"),
    ] {
        let out = icq()
            .args(["work", "--until-idle", "--database-url", "sqlite::memory:"])
            .args(["--grace-seconds", value])
            .output()
            .unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{value}: {stderr}");
        assert!(stderr.contains("--grace-seconds"), "{value}: {stderr}");
        assert!(stderr.contains(wanted), "{value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
