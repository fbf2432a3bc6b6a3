//! Papercuts, each pinned: what a new user ran into on a first afternoon with
//! the binary (a panic on a closed or full stdout, a hidden `man`, a SQLite URL without
//! `?mode=rwc`, an absurd `--jobs`, two migrations with one version). The listing, cancel
//! and id-spelling items live with their subcommands' tests in `admin.rs` and the table
//! fitting with `src/cli/output/grid.rs`'s unit tests.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

/// `icq` with a private HOME and working directory, and no ambient configuration.
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

/// `icq completions bash | head -0`: the reader is gone before the script is written;
/// that is no error (exit 0, nothing on stderr), and certainly no panic (101).
#[test]
fn completions_into_a_closed_pipe_exit_0() {
    let home = tempfile::tempdir().unwrap();
    let mut child = icq(home.path())
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // `head -0`: closes its end at once
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `> /dev/full`: a write that fails is an error with exit 1 that says what failed.
#[test]
fn writing_to_a_full_device_is_an_error_not_a_panic() {
    let home = tempfile::tempdir().unwrap();
    for args in [&["completions", "bash"][..], &["man"], &["--help"]] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = icq(home.path())
            .args(args)
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        if args != ["--help"] {
            // clap prints help itself (its own exit code); ours must say what failed.
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(stderr.contains("writing to stdout"), "{args:?}: {stderr}");
        }
    }
}

/// `man` is listed in `icq --help`.
#[test]
fn man_is_listed_in_help() {
    let home = tempfile::tempdir().unwrap();
    let out = icq(home.path()).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.lines().any(|l| l.trim_start().starts_with("man ")),
        "{help}"
    );
}

/// `icq bench --database-url sqlite:bench.db` (no file yet, no `?mode=rwc`) says how to
/// create the file instead of sqlx's "unable to open database file", and creates nothing.
#[test]
fn bench_on_a_missing_sqlite_file_names_mode_rwc() {
    let home = tempfile::tempdir().unwrap();
    let out = icq(home.path())
        .args(["bench", "--jobs", "10", "--database-url", "sqlite:bench.db"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("sqlite:bench.db?mode=rwc"), "{stderr}");
    assert!(!stderr.contains("unable to open"), "{stderr}");
    assert!(!home.path().join("bench.db").exists());
}

/// `icq bench --jobs 99999999999` is refused before anything is created (it used to abort
/// on allocation with its scratch tables left behind).
#[test]
fn bench_refuses_an_absurd_job_count_and_creates_nothing() {
    let home = tempfile::tempdir().unwrap();
    let db = home.path().join("b.db");
    let url = format!("sqlite://{}?mode=rwc", db.display());
    for jobs in ["99999999999", "10000001"] {
        let out = icq(home.path())
            .args(["bench", "--jobs", jobs, "--database-url", &url])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{jobs}: {stderr}");
        assert!(stderr.contains("10000000"), "{jobs}: {stderr}");
        assert!(!stderr.contains("panicked"), "{jobs}: {stderr}");
    }
    // Refused at parsing: not even the database file was opened.
    assert!(!db.exists());
}

/// Two migration files with one version: refused naming both (sqlx-cli refuses too), not
/// "up to date".
#[test]
fn two_migrations_with_one_version_are_refused() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("migrations");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("1_first.sql"), "CREATE TABLE a (x INTEGER);").unwrap();
    std::fs::write(dir.join("1_second.sql"), "CREATE TABLE b (x INTEGER);").unwrap();
    let url = format!("sqlite://{}?mode=rwc", home.path().join("m.db").display());
    for sub in ["run", "info"] {
        let out = icq(home.path())
            .args(["migrate", sub, "--database-url", &url, "--dir"])
            .arg(&dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{sub}: {stderr}");
        assert!(stderr.contains("1_first.sql"), "{sub}: {stderr}");
        assert!(stderr.contains("1_second.sql"), "{sub}: {stderr}");
        assert!(stderr.contains("both have version 1"), "{sub}: {stderr}");
    }
    // A reversible pair shares its version and is fine.
    std::fs::remove_file(dir.join("1_second.sql")).unwrap();
    std::fs::rename(dir.join("1_first.sql"), dir.join("1_first.up.sql")).unwrap();
    std::fs::write(dir.join("1_first.down.sql"), "DROP TABLE a;").unwrap();
    let out = icq(home.path())
        .args(["migrate", "run", "--database-url", &url, "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
