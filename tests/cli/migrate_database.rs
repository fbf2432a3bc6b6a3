//! `icq migrate info`, `icq migrate run --dry-run/--target-version` and
//! `icq migrate revert` on every runtime engine, checked against the real sqlx-cli's view
//! of the same `_sqlx_migrations` table; and `migrate add` refusing to create a table twice.

use std::path::Path;

use predicates::prelude::*;

use crate::migrate::{files, icq, sqlx, stdout_of};
use crate::support::TestDb;

/// A `migrations/` directory with a reversible `0001_before` pair, then icq's reversible
/// `0002_add_internal_commands` pair.
fn two_reversible(cwd: &Path, engine: &str) {
    let dir = cwd.join("migrations");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("0001_before.up.sql"),
        "CREATE TABLE before_icq (id INT);\n",
    )
    .unwrap();
    std::fs::write(dir.join("0001_before.down.sql"), "DROP TABLE before_icq;\n").unwrap();
    stdout_of(icq(cwd).args(["migrate", "add", "--engine", engine]));
    assert_eq!(files(&dir).len(), 4, "{:?}", files(&dir));
}

fn json(cmd: &mut assert_cmd::Command) -> serde_json::Value {
    serde_json::from_str(&stdout_of(cmd.args(["--format", "json"]))).unwrap()
}

fn states(doc: &serde_json::Value) -> Vec<(i64, String)> {
    doc["migrations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["version"].as_i64().unwrap(),
                m["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pair(a: &str, b: &str) -> Vec<(i64, String)> {
    vec![(1, a.to_owned()), (2, b.to_owned())]
}

async fn table_count(db: &TestDb, name: &str) -> i64 {
    let sql = match db.engine {
        "postgres" => format!("SELECT COUNT(*) FROM pg_class WHERE relname = '{name}'"),
        "sqlite" => format!("SELECT COUNT(*) FROM sqlite_master WHERE name = '{name}'"),
        _ => format!(
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{name}'"
        ),
    };
    db.scalar_i64(&sql).await
}

/// The whole cycle: info on a fresh database, a dry run that changes nothing, a run up to a
/// target, the rest, a dry revert, a revert of the latest, a revert of everything; sqlx-cli
/// reads the same bookkeeping at each step.
async fn info_run_revert(engine: &'static str) {
    let db = TestDb::new(engine, "mig_cycle").await;
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    two_reversible(cwd, engine);
    let url = db.url.as_str();
    let dir = Path::new("migrations");
    let info = |cwd: &Path| json(icq(cwd).args(["migrate", "info", "--database-url", url]));

    let out = stdout_of(icq(cwd).args(["migrate", "info", "--database-url", url]));
    assert_eq!(out, "1/pending before\n2/pending add internal commands\n");
    assert_eq!(info(cwd)["migrations"][1]["reversible"], true);

    // --dry-run lists both and applies nothing.
    let out = stdout_of(icq(cwd).args(["migrate", "run", "--dry-run", "--database-url", url]));
    assert_eq!(
        out,
        "Can apply 1/migrate before\nCan apply 2/migrate add internal commands\n"
    );
    assert_eq!(states(&info(cwd)), pair("pending", "pending"));
    assert_eq!(table_count(&db, "before_icq").await, 0);

    // Up to a target, then the rest.
    let doc = json(icq(cwd).args([
        "migrate",
        "run",
        "--target-version",
        "1",
        "--database-url",
        url,
    ]));
    assert_eq!(doc["applied"][0]["version"], 1);
    assert_eq!(doc["skipped"], serde_json::json!([2]));
    assert_eq!(doc["dry_run"], false);
    assert_eq!(states(&info(cwd)), pair("installed", "pending"));
    let theirs = sqlx(cwd, &["info"], dir, url);
    assert!(
        theirs.contains("1/installed") && theirs.contains("2/pending"),
        "{theirs}"
    );
    let out = stdout_of(icq(cwd).args(["migrate", "run", "--database-url", url]));
    assert!(
        out.starts_with("Applied 2/migrate add internal commands ("),
        "{out}"
    );
    assert_eq!(states(&info(cwd)), pair("installed", "installed"));
    assert_eq!(table_count(&db, "InternalCommands").await, 1);

    // A target below what is applied is refused with the way back.
    icq(cwd)
        .args([
            "migrate",
            "run",
            "--target-version",
            "1",
            "--database-url",
            url,
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "migrate revert --target-version 1",
        ));

    // Revert: a dry run changes nothing, then only the latest goes.
    let out = stdout_of(icq(cwd).args(["migrate", "revert", "--dry-run", "--database-url", url]));
    assert_eq!(out, "Can revert 2/revert add internal commands\n");
    assert_eq!(table_count(&db, "InternalCommands").await, 1);
    let out = stdout_of(icq(cwd).args(["migrate", "revert", "--database-url", url]));
    assert!(
        out.starts_with("Reverted 2/revert add internal commands ("),
        "{out}"
    );
    assert_eq!(out.lines().count(), 1, "{out}");
    assert_eq!(table_count(&db, "InternalCommands").await, 0);
    assert_eq!(table_count(&db, "before_icq").await, 1);
    let theirs = sqlx(cwd, &["info"], dir, url);
    assert!(
        theirs.contains("1/installed") && theirs.contains("2/pending"),
        "{theirs}"
    );

    // sqlx-cli applies it again; icq reverts everything down to 0.
    sqlx(cwd, &["run"], dir, url);
    let doc = json(icq(cwd).args([
        "migrate",
        "revert",
        "--target-version",
        "0",
        "--database-url",
        url,
    ]));
    let reverted: Vec<i64> = doc["reverted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["version"].as_i64().unwrap())
        .collect();
    assert_eq!(reverted, [2, 1]);
    assert_eq!(table_count(&db, "before_icq").await, 0);
    let out = stdout_of(icq(cwd).args(["migrate", "revert", "--database-url", url]));
    assert_eq!(out, "No migrations available to revert\n");
    assert_eq!(states(&info(cwd)), pair("pending", "pending"));
}

#[tokio::test]
async fn info_run_and_revert_postgres() {
    info_run_revert("postgres").await;
}

#[tokio::test]
async fn info_run_and_revert_sqlite() {
    info_run_revert("sqlite").await;
}

#[tokio::test]
async fn info_run_and_revert_mysql() {
    info_run_revert("mysql").await;
}

/// What sqlx refuses, icq refuses too, and `info` shows why: a file edited after it was
/// applied, a migration applied but gone from the directory, a latest migration without a
/// down file, targets that are not in the directory.
async fn refusals(engine: &'static str) {
    let db = TestDb::new(engine, "mig_refuse").await;
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let url = db.url.as_str();
    let dir = cwd.join("migrations");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("0001_a.up.sql"), "CREATE TABLE mig_a (id INT);\n").unwrap();
    std::fs::write(dir.join("0001_a.down.sql"), "DROP TABLE mig_a;\n").unwrap();
    std::fs::write(dir.join("0002_b.sql"), "CREATE TABLE mig_b (id INT);\n").unwrap();
    stdout_of(icq(cwd).args(["migrate", "run", "--database-url", url]));

    icq(cwd)
        .args(["migrate", "revert", "--database-url", url])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "migration 2 (b) is not reversible: it has no .down.sql file, so nothing was reverted",
        ));
    assert_eq!(table_count(&db, "mig_a").await, 1);
    for (command, target) in [("run", "7"), ("revert", "7")] {
        icq(cwd)
            .args([
                "migrate",
                command,
                "--target-version",
                target,
                "--database-url",
                url,
            ])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(
                "--target-version 7 is not a migration in",
            ));
    }

    // An applied file edited afterwards.
    std::fs::write(dir.join("0002_b.sql"), "CREATE TABLE mig_b (id BIGINT);\n").unwrap();
    let out = stdout_of(icq(cwd).args(["migrate", "info", "--database-url", url]));
    assert!(
        out.contains("2/installed (different checksum) b\n"),
        "{out}"
    );
    assert!(out.contains("applied migration had checksum "), "{out}");
    icq(cwd)
        .args(["migrate", "run", "--database-url", url])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "migration 2 was previously applied but has been modified",
        ));

    // An applied file removed.
    std::fs::remove_file(dir.join("0002_b.sql")).unwrap();
    let doc = json(icq(cwd).args(["migrate", "info", "--database-url", url]));
    assert_eq!(states(&doc), pair("installed", "missing_file"));
    icq(cwd)
        .args(["migrate", "run", "--database-url", url])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(
            "missing in the resolved migrations",
        ));
}

#[tokio::test]
async fn refusals_postgres() {
    refusals("postgres").await;
}

#[tokio::test]
async fn refusals_sqlite() {
    refusals("sqlite").await;
}

#[tokio::test]
async fn refusals_mysql() {
    refusals("mysql").await;
}

#[test]
fn info_and_revert_on_a_missing_sqlite_file_create_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "sqlite"]));
    for command in ["info", "revert"] {
        icq(tmp.path())
            .args(["migrate", command, "--database-url", "sqlite:nothing.db"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("does not exist yet"));
    }
    icq(tmp.path())
        .args([
            "migrate",
            "run",
            "--dry-run",
            "--database-url",
            "sqlite:nothing.db",
        ])
        .assert()
        .code(2);
    assert!(!tmp.path().join("nothing.db").exists());
}

/// Defect 7: `migrate add` twice into a directory that already creates the table wrote a
/// second migration that failed when run (exit 0 with a warning).
#[test]
fn defect_7_add_twice_refuses_unless_another_table() {
    let tmp = tempfile::tempdir().unwrap();
    let first = stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres"]));
    icq(tmp.path())
        .args(["migrate", "add", "--engine", "postgres"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains(format!("{} already creates InternalCommands", first.trim()))
                .and(predicate::str::contains("--table NAME")),
        );
    // Reversible or not, it is the same table.
    icq(tmp.path())
        .args(["migrate", "add", "--engine", "postgres", "-r"])
        .assert()
        .code(2);
    assert_eq!(files(&tmp.path().join("migrations")).len(), 1);

    // Another table is another queue: allowed.
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres", "--table", "Other"]));
    assert_eq!(files(&tmp.path().join("migrations")).len(), 2);

    // On engines whose table names ignore case, `internalcommands` is the same table.
    let tmp = tempfile::tempdir().unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "mysql"]));
    icq(tmp.path())
        .args([
            "migrate",
            "add",
            "--engine",
            "mysql",
            "--table",
            "internalcommands",
        ])
        .assert()
        .code(2);
}
