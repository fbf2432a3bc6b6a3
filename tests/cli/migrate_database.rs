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
/// second migration that failed when run (exit 0 with a warning). Now the second `add`
/// finds the table up to date and writes nothing.
#[test]
fn defect_7_add_twice_is_up_to_date_unless_another_table() {
    let tmp = tempfile::tempdir().unwrap();
    let first = stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres"]));
    let out = stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres"]));
    assert_eq!(
        out,
        format!(
            "migrations is up to date: {} already brings InternalCommands to schema version 4; \
             nothing written (pass --table NAME for another queue table)\n",
            first.trim()
        )
    );
    // Reversible or not, it is the same table.
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres", "-r"]));
    assert_eq!(files(&tmp.path().join("migrations")).len(), 1);

    // Another table is another queue: allowed.
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "postgres", "--table", "Other"]));
    assert_eq!(files(&tmp.path().join("migrations")).len(), 2);

    // On engines whose table names ignore case, `internalcommands` is the same table.
    let tmp = tempfile::tempdir().unwrap();
    stdout_of(icq(tmp.path()).args(["migrate", "add", "--engine", "mysql"]));
    let out = stdout_of(icq(tmp.path()).args([
        "migrate",
        "add",
        "--engine",
        "mysql",
        "--table",
        "internalcommands",
    ]));
    assert!(out.contains("is up to date"), "{out}");
    assert_eq!(files(&tmp.path().join("migrations")).len(), 1);
}

// ---- Schema version 2: upgrading a version-1 table ("Upgrades") ----

/// What an older icq wrote with `migrate add -r`: its header, the version-1 table, and the
/// down file dropping it.
pub(crate) fn write_v1_pair(dir: &Path, version: &str, engine: icq::Engine) {
    let table = icq::TableName::default();
    let header = format!(
        "{} engine={engine} table={table}\n",
        icq::migrate::HEADER_PREFIX
    );
    let v1 = icq::schema::render_v1(engine, &table);
    std::fs::create_dir_all(dir).unwrap();
    let up = dir.join(format!("{version}_add_internal_commands.up.sql"));
    std::fs::write(up, format!("{header}{}", v1.up)).unwrap();
    let down = dir.join(format!("{version}_add_internal_commands.down.sql"));
    std::fs::write(down, format!("{header}{}", v1.down)).unwrap();
}

async fn column_count(db: &TestDb, column: &str) -> i64 {
    let sql = match db.engine {
        "postgres" => format!(
            "SELECT COUNT(*) FROM information_schema.columns \
             WHERE table_name = 'InternalCommands' AND column_name = '{column}'"
        ),
        "sqlite" => {
            format!(
                "SELECT COUNT(*) FROM pragma_table_info('InternalCommands') WHERE name = '{column}'"
            )
        }
        _ => format!(
            "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = 'InternalCommands' AND COLUMN_NAME = '{column}'"
        ),
    };
    db.scalar_i64(&sql).await
}

/// How many `IX_` indexes a version-2 table has: SQLite has one poll index (a worker
/// serving some queues filters it by `Queue`), the others a second, per-queue one.
fn v2_indexes(engine: &str) -> i64 {
    if engine == "sqlite" { 4 } else { 5 }
}

/// The indexes of the commands table at the current schema version: version 2's, and
/// version 4's order-key and concurrency-key indexes.
fn current_indexes(engine: &str) -> i64 {
    // Version 4 adds the order-key and concurrency-key indexes; on MariaDB it drops the
    // retention and dead-letter indexes, which the poll index serves.
    v2_indexes(engine) + 2 - if engine == "mysql" { 2 } else { 0 }
}

async fn index_count(db: &TestDb) -> i64 {
    let sql = match db.engine {
        "postgres" => {
            "SELECT COUNT(*) FROM pg_indexes WHERE tablename = 'InternalCommands' \
             AND indexname LIKE 'IX_InternalCommands_%'"
        }
        "sqlite" => {
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' \
             AND tbl_name = 'InternalCommands' AND name LIKE 'IX_InternalCommands_%'"
        }
        _ => {
            "SELECT COUNT(DISTINCT INDEX_NAME) FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'InternalCommands' \
               AND INDEX_NAME LIKE 'IX\\_InternalCommands\\_%'"
        }
    };
    db.scalar_i64(sql).await
}

/// Whether the history table (schema version 3) exists.
async fn history_exists(db: &TestDb) -> bool {
    let sql = match db.engine {
        "postgres" => "SELECT COUNT(*) FROM pg_tables WHERE tablename = 'InternalCommandsHistory'",
        "sqlite" => {
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' \
             AND name = 'InternalCommandsHistory'"
        }
        _ => {
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = 'InternalCommandsHistory'"
        }
    };
    db.scalar_i64(sql).await > 0
}

/// `SELECT COUNT(*) FROM InternalCommands WHERE <condition>`, columns in {braces}, plus
/// the rows of its history table where there is one (schema version 3).
async fn count_where(db: &TestDb, condition: &str) -> i64 {
    let hot = count_in(db, "InternalCommands", condition).await;
    if !history_exists(db).await {
        return hot;
    }
    hot + count_in(db, "InternalCommandsHistory", condition).await
}

/// `SELECT COUNT(*) FROM <table> WHERE <condition>`, columns in {braces}.
async fn count_in(db: &TestDb, table: &str, condition: &str) -> i64 {
    let mut condition = condition.to_owned();
    for column in [
        "Type",
        "Queue",
        "Priority",
        "UniqueKey",
        "ProcessedAt",
        "DeadLetteredAt",
    ] {
        condition = condition.replace(&format!("{{{column}}}"), &db.q(column));
    }
    db.scalar_i64(&format!(
        "SELECT COUNT(*) FROM {} WHERE {condition}",
        db.q(table)
    ))
    .await
}

/// Inserts a row of `ty` with only the two required columns (a plain-SQL enqueue, valid
/// on both versions).
async fn enqueue(db: &TestDb, ty: &str) {
    db.execute(&format!(
        "INSERT INTO {} ({}, {}) VALUES ('{ty}', '{{}}')",
        db.q("InternalCommands"),
        db.q("Type"),
        db.q("Payload")
    ))
    .await;
}

/// A plain-SQL idempotent enqueue on a version-2 table: at most one pending row per key.
async fn enqueue_unique(db: &TestDb, ty: &str, queue: &str, key: &str) {
    let (t, c) = (db.q("InternalCommands"), |c: &str| db.q(c));
    let columns = format!(
        "({}, {}, {}, {}, {})",
        c("Type"),
        c("Payload"),
        c("Queue"),
        c("Priority"),
        c("UniqueKey")
    );
    let values = format!("('{ty}', '{{}}', '{queue}', 5, '{key}')");
    let sql = match db.engine {
        "mysql" => format!("INSERT IGNORE INTO {t} {columns} VALUES {values}"),
        _ => format!("INSERT INTO {t} {columns} VALUES {values} ON CONFLICT DO NOTHING"),
    };
    db.execute(&sql).await;
}

fn noop_config(dir: &Path, url: &str) -> std::path::PathBuf {
    let path = dir.join("icq.yaml");
    let text = format!(
        "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n      \
         polling_interval_seconds: 0.1\nhandlers:\n  old.pending:\n    noop: true\n  \
         new.mail:\n    noop: true\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Applies (`up`) or reverts the latest migration with sqlx-cli or with icq.
fn apply(cwd: &Path, url: &str, with_sqlx: bool, up: bool) -> String {
    let dir = Path::new("migrations");
    match (with_sqlx, up) {
        (true, true) => sqlx(cwd, &["run"], dir, url),
        (true, false) => sqlx(cwd, &["revert"], dir, url),
        (false, true) => stdout_of(icq(cwd).args(["migrate", "run", "--database-url", url])),
        (false, false) => stdout_of(icq(cwd).args(["migrate", "revert", "--database-url", url])),
    }
}

/// What an older icq wrote with `migrate add -r` next to [`write_v1_pair`]: the upgrade to
/// version 2.
fn write_v2_upgrade_pair(dir: &Path, version: &str, engine: icq::Engine) {
    let table = icq::TableName::default();
    let header = format!(
        "{} engine={engine} table={table}\n",
        icq::migrate::HEADER_PREFIX
    );
    let v2 = icq::schema::render_upgrade(engine, &table);
    let up = dir.join(format!("{version}_icq_schema_v2.up.sql"));
    std::fs::write(up, format!("{header}{}", v2.up)).unwrap();
    let down = dir.join(format!("{version}_icq_schema_v2.down.sql"));
    std::fs::write(down, format!("{header}{}", v2.down)).unwrap();
}

/// A version-1 (or version-2) table with pending, completed and dead rows; `migrate add`
/// writes the upgrade to version 3 beside the old migrations; it applies (with sqlx-cli or
/// icq), every row kept and the completed one in history; the old pending rows run (into
/// history), new rows with a queue, a priority and a unique key run; a second `add` is a
/// no-op; the revert takes the table back to its version with every row (history moved
/// back), and a worker still drains it; the other tool applies the upgrade again.
async fn upgrade_to_v3_and_back(engine: &'static str, with_sqlx: bool, from: u32) {
    let tag = format!("v{from}_{}", if with_sqlx { "sqlx" } else { "icq" });
    let db = TestDb::new(engine, &tag).await;
    let kind: icq::Engine = engine.parse().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let url = db.url.as_str();
    let dir = cwd.join("migrations");
    write_v1_pair(&dir, "0001", kind);
    let out = apply(cwd, url, with_sqlx, true);
    assert!(out.contains("1/migrate add internal commands"), "{out}");
    assert_eq!(column_count(&db, "Queue").await, 0, "a version-1 table");
    if from == 2 {
        write_v2_upgrade_pair(&dir, "0002", kind);
        let out = apply(cwd, url, with_sqlx, true);
        assert!(out.contains("2/migrate icq schema v2"), "{out}");
    }
    let next = from + 1;

    // Rows of every state, written by version-1 clients.
    for ty in ["old.pending", "old.pending", "old.done", "old.dead"] {
        enqueue(&db, ty).await;
    }
    let (t, run_at) = (db.q("InternalCommands"), db.q("RunAt"));
    let (ty, processed, dead) = (db.q("Type"), db.q("ProcessedAt"), db.q("DeadLetteredAt"));
    db.execute(&format!(
        "UPDATE {t} SET {processed} = {run_at} WHERE {ty} = 'old.done'"
    ))
    .await;
    db.execute(&format!(
        "UPDATE {t} SET {dead} = {run_at} WHERE {ty} = 'old.dead'"
    ))
    .await;

    // The upgrade, reversible like the migration before it, named for sqlx.
    let out = stdout_of(icq(cwd).args(["migrate", "add", "--engine", engine]));
    let upgrade = format!("000{next}_icq_schema_v4");
    assert_eq!(
        out,
        format!("migrations/{upgrade}.up.sql\nmigrations/{upgrade}.down.sql\n")
    );
    let written = std::fs::read_to_string(dir.join(format!("{upgrade}.up.sql"))).unwrap();
    let table = icq::TableName::default();
    assert!(
        written.ends_with(&icq::schema::render_upgrade_from(kind, &table, from).up),
        "{written}"
    );
    // Once it is there, `add` has nothing more to write.
    let out = stdout_of(icq(cwd).args(["migrate", "add", "--engine", engine]));
    assert!(out.contains("is up to date"), "{out}");
    assert_eq!(files(&dir).len(), 2 * next as usize, "{:?}", files(&dir));
    let out = stdout_of(icq(cwd).args(["migrate", "info", "--database-url", url]));
    let installed_v2 = if from == 2 {
        "2/installed icq schema v2\n"
    } else {
        ""
    };
    assert_eq!(
        out,
        format!("1/installed add internal commands\n{installed_v2}{next}/pending icq schema v4\n")
    );

    let out = apply(cwd, url, with_sqlx, true);
    assert!(
        out.contains(&format!("{next}/migrate icq schema v4")),
        "{out}"
    );
    assert!(history_exists(&db).await, "{engine}: the history table");
    assert_eq!(
        count_in(&db, "InternalCommandsHistory", "{Type} = 'old.done'").await,
        1,
        "{engine}: the completed row moved to history"
    );
    assert_eq!(
        count_in(&db, "InternalCommands", "{ProcessedAt} IS NOT NULL").await,
        0,
        "{engine}: no completed row left in the table"
    );
    assert_eq!(column_count(&db, "Queue").await, 1);
    assert_eq!(column_count(&db, "Snoozes").await, 1);
    assert_eq!(
        index_count(&db).await,
        current_indexes(engine),
        "{engine}: the current version's indexes"
    );
    assert_eq!(
        count_where(&db, "{Queue} = 'default' AND {Priority} = 0").await,
        4,
        "the old rows are in the default queue"
    );

    // New rows with a queue, a priority and a unique key, from plain SQL.
    enqueue_unique(&db, "new.mail", "mail", "k1").await;
    enqueue_unique(&db, "new.mail", "mail", "k1").await;
    assert_eq!(count_where(&db, "{UniqueKey} = 'k1'").await, 1);

    let config = noop_config(cwd, url);
    crate::work_until_idle(&config);
    let pending = "{ProcessedAt} IS NULL AND {DeadLetteredAt} IS NULL";
    assert_eq!(count_where(&db, pending).await, 0, "everything ran");
    assert_eq!(
        count_where(&db, "{Type} = 'old.pending' AND {ProcessedAt} IS NOT NULL").await,
        2
    );
    assert_eq!(
        count_in(&db, "InternalCommands", "{ProcessedAt} IS NOT NULL").await,
        0,
        "{engine}: completed rows go to history"
    );
    assert_eq!(
        count_where(&db, "{Queue} = 'mail' AND {ProcessedAt} IS NOT NULL").await,
        1
    );
    // A completed row frees its key.
    enqueue_unique(&db, "new.mail", "mail", "k1").await;
    assert_eq!(count_where(&db, "{UniqueKey} = 'k1'").await, 2);

    // Back to the old version: every row survives, the pending one included.
    let out = apply(cwd, url, with_sqlx, false);
    assert!(
        out.contains(&format!("{next}/revert icq schema v4")),
        "{out}"
    );
    assert!(!history_exists(&db).await, "{engine}: no history table");
    let (queue, indexes) = if from == 1 {
        (0, 3)
    } else {
        (1, v2_indexes(engine))
    };
    assert_eq!(column_count(&db, "Queue").await, queue);
    assert_eq!(column_count(&db, "Snoozes").await, queue);
    assert_eq!(index_count(&db).await, indexes, "{engine}: the old indexes");
    assert_eq!(count_where(&db, "1 = 1").await, 6);
    assert_eq!(
        count_where(&db, "{ProcessedAt} IS NOT NULL").await,
        4,
        "{engine}: history came back completed"
    );
    assert_eq!(count_where(&db, pending).await, 1);
    crate::work_until_idle(&config);
    assert_eq!(
        count_where(&db, pending).await,
        0,
        "a version-1 table still works"
    );

    // The other tool applies the upgrade again.
    let out = apply(cwd, url, !with_sqlx, true);
    assert!(
        out.contains(&format!("{next}/migrate icq schema v4")),
        "{out}"
    );
    assert_eq!(column_count(&db, "Queue").await, 1);
    // Back from version 1 every row is in the default queue; from 2 the mail rows keep theirs.
    let default = if from == 1 { 6 } else { 4 };
    assert_eq!(count_where(&db, "{Queue} = 'default'").await, default);
    assert_eq!(
        count_in(&db, "InternalCommands", "{ProcessedAt} IS NOT NULL").await,
        0,
        "{engine}: every completed row in history again"
    );
}

#[tokio::test]
async fn v1_upgrade_and_revert_with_icq_postgres() {
    upgrade_to_v3_and_back("postgres", false, 1).await;
}

#[tokio::test]
async fn v1_upgrade_and_revert_with_icq_sqlite() {
    upgrade_to_v3_and_back("sqlite", false, 1).await;
}

#[tokio::test]
async fn v1_upgrade_and_revert_with_icq_mysql() {
    upgrade_to_v3_and_back("mysql", false, 1).await;
}

#[tokio::test]
async fn v1_upgrade_and_revert_with_sqlx_cli_postgres() {
    upgrade_to_v3_and_back("postgres", true, 1).await;
}

#[tokio::test]
async fn v1_upgrade_and_revert_with_sqlx_cli_sqlite() {
    upgrade_to_v3_and_back("sqlite", true, 1).await;
}

#[tokio::test]
async fn v1_upgrade_and_revert_with_sqlx_cli_mysql() {
    upgrade_to_v3_and_back("mysql", true, 1).await;
}

#[tokio::test]
async fn v2_upgrade_and_revert_with_icq_postgres() {
    upgrade_to_v3_and_back("postgres", false, 2).await;
}

#[tokio::test]
async fn v2_upgrade_and_revert_with_icq_sqlite() {
    upgrade_to_v3_and_back("sqlite", false, 2).await;
}

#[tokio::test]
async fn v2_upgrade_and_revert_with_icq_mysql() {
    upgrade_to_v3_and_back("mysql", false, 2).await;
}

#[tokio::test]
async fn v2_upgrade_and_revert_with_sqlx_cli_postgres() {
    upgrade_to_v3_and_back("postgres", true, 2).await;
}

#[tokio::test]
async fn v2_upgrade_and_revert_with_sqlx_cli_sqlite() {
    upgrade_to_v3_and_back("sqlite", true, 2).await;
}

#[tokio::test]
async fn v2_upgrade_and_revert_with_sqlx_cli_mysql() {
    upgrade_to_v3_and_back("mysql", true, 2).await;
}

/// A simple (one-file) version-1 migration, timestamped: the upgrade is one file with a
/// later timestamp, sqlx-cli applies both in one run on a fresh database, and the table
/// ends at version 2.
async fn simple_timestamped_upgrade(engine: &'static str) {
    let db = TestDb::new(engine, "v2_simple").await;
    let kind: icq::Engine = engine.parse().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let dir = cwd.join("migrations");
    std::fs::create_dir(&dir).unwrap();
    let table = icq::TableName::default();
    let header = format!(
        "{} engine={engine} table={table}\n",
        icq::migrate::HEADER_PREFIX
    );
    let v1 = icq::schema::render_v1(kind, &table).up;
    std::fs::write(
        dir.join("20250101000000_add_internal_commands.sql"),
        format!("{header}{v1}"),
    )
    .unwrap();
    let out = stdout_of(icq(cwd).args(["migrate", "add", "--engine", engine]));
    let name = out.trim().strip_prefix("migrations/").unwrap().to_owned();
    assert!(name.ends_with("_icq_schema_v4.sql"), "{name}");
    let version: i64 = name.split('_').next().unwrap().parse().unwrap();
    assert!(version > 20250101000000, "{name}");
    let out = sqlx(cwd, &["run"], Path::new("migrations"), &db.url);
    assert!(out.contains("icq schema v4"), "{out}");
    assert_eq!(column_count(&db, "Priority").await, 1);
    assert!(history_exists(&db).await, "{engine}: version 3");
    assert_eq!(
        column_count(&db, "OrderKey").await,
        1,
        "{engine}: version 4"
    );
    assert_eq!(index_count(&db).await, current_indexes(engine));
}

#[tokio::test]
async fn simple_timestamped_upgrade_postgres() {
    simple_timestamped_upgrade("postgres").await;
}

#[tokio::test]
async fn simple_timestamped_upgrade_sqlite() {
    simple_timestamped_upgrade("sqlite").await;
}

#[tokio::test]
async fn simple_timestamped_upgrade_mysql() {
    simple_timestamped_upgrade("mysql").await;
}

/// The embedded default (icq's own SQLite database) upgrades a version-1 table on first
/// use, once, saying so once; its pending row survives in the default queue.
#[tokio::test]
async fn embedded_default_upgrades_a_version_1_table_once() {
    use sqlx::Connection as _;

    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let file = data.join("icq.db");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let v1 = icq::schema::render_v1(icq::Engine::Sqlite, &icq::TableName::default()).up;
    sqlx::raw_sql(sqlx::AssertSqlSafe(v1))
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::raw_sql(r#"INSERT INTO "InternalCommands" ("Type", "Payload") VALUES ('t', '{}')"#)
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let run = |args: &[&str]| {
        icq(tmp.path())
            .args(args)
            .env("HOME", tmp.path())
            .env("XDG_CONFIG_HOME", tmp.path().join("config"))
            .env("ICQ_DATA_DIR", &data)
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    };
    // `icq work` logs (other commands upgrade just as well, silently). Without handlers it
    // then refuses to process, which is beside the point here.
    let upgrades = |out: &std::process::Output| {
        String::from_utf8_lossy(&out.stderr)
            .matches("upgraded the embedded table to schema version 4")
            .count()
    };
    let first = run(&["work", "--until-idle"]);
    assert_eq!(
        upgrades(&first),
        1,
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let again = run(&["work", "--until-idle"]);
    assert_eq!(
        upgrades(&again),
        0,
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let pending = run(&["pending", "--format", "json"]);
    assert!(pending.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&pending.stdout).unwrap();
    assert_eq!(doc[0]["due"], 1, "{doc}");

    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let row: (String, i64) =
        sqlx::query_as(r#"SELECT "Queue", "Priority" FROM "InternalCommands""#)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(row, ("default".to_owned(), 0));
    let indexes: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name LIKE 'IX_%'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(indexes, current_indexes("sqlite") + 1, "and the history's");
}

/// A MariaDB database whose default character set is latin1 (MariaDB's compiled
/// default): the migration still makes utf8mb4 tables (the commands, their history, the
/// queues' and the schedules' tables), and a worker stamps every command and renews leases
/// there (each statement names its own character sets), error texts, order keys,
/// concurrency keys and queue names beyond latin1 included.
#[tokio::test]
async fn a_latin1_database_gets_a_utf8mb4_table_that_workers_stamp() {
    let db = TestDb::new("mysql", "latin1").await;
    db.execute("ALTER DATABASE CHARACTER SET latin1 COLLATE latin1_swedish_ci")
        .await;
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let url = db.url.as_str();
    stdout_of(icq(cwd).args(["migrate", "add", "--engine", "mysql"]));
    stdout_of(icq(cwd).args(["migrate", "run", "--database-url", url]));
    let not_utf8mb4 = db
        .scalar_i64(
            "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME LIKE 'InternalCommands%' AND CHARACTER_SET_NAME IS NOT NULL \
             AND (CHARACTER_SET_NAME <> 'utf8mb4' OR COLLATION_NAME <> 'utf8mb4_bin')",
        )
        .await;
    assert_eq!(not_utf8mb4, 0, "every text column is utf8mb4_bin");
    let tables = db
        .scalar_i64(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME LIKE 'InternalCommands%'",
        )
        .await;
    assert_eq!(
        tables, 4,
        "the commands, history, queues and schedules tables"
    );

    // A queue named beyond latin1 is paused and resumed, and listed by its name whole.
    for action in ["pause", "resume"] {
        stdout_of(icq(cwd).args(["queue", action, "wärme-€", "--database-url", url]));
    }
    let listed =
        stdout_of(icq(cwd).args(["queue", "list", "--database-url", url, "--format", "json"]));
    assert!(listed.contains("wärme-€"), "{listed}");

    for n in 0..4 {
        let payload = format!("{{\"n\": {n}, \"name\": \"Zoë €\"}}");
        stdout_of(icq(cwd).args([
            "schedule",
            "--database-url",
            url,
            "--type",
            "slow.job",
            "--payload",
            &payload,
            "--order-key",
            &format!("Zoë-€-{}", n % 2),
            "--concurrency-key",
            "tenant-€",
        ]));
    }
    stdout_of(icq(cwd).args([
        "schedule",
        "--database-url",
        url,
        "--type",
        "failing.job",
        "--payload",
        "{}",
    ]));
    let ran = cwd.join("ran");
    std::fs::create_dir(&ran).unwrap();
    // Each handler outlives its lease (3 s, renewed every second): only renewals keep it.
    let config = cwd.join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n      \
             lease_seconds: 3\n      max_attempts: 1\n      polling_interval_seconds: 0.1\n\
             handlers:\n  slow.job:\n    exec: [\"sh\", \"-c\", \"cat >> {}/$ICQ_COMMAND_ID; sleep 5\"]\n  \
             failing.job:\n    exec: [\"sh\", \"-c\", \"echo 'Zoë € failed' >&2; exit 1\"]\n",
            ran.display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .current_dir(cwd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Unstamped outcomes are retried forever: a run that does not end has failed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for problem in [
        "could not stamp",
        "could not extend",
        "1253",
        "leases were lost",
    ] {
        assert!(!stderr.contains(problem), "{problem}: {stderr}");
    }
    let once = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE `Type` = 'slow.job' \
                 AND `ProcessedAt` IS NOT NULL AND `Attempts` = 1",
            db.all_rows()
        ))
        .await;
    assert_eq!(
        once, 4,
        "every command stamped completed after one run: {stderr}"
    );
    let payloads: Vec<String> = std::fs::read_dir(&ran)
        .unwrap()
        .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap())
        .collect();
    assert_eq!(payloads.len(), 4, "{payloads:?}");
    for payload in &payloads {
        let json: serde_json::Value = serde_json::from_str(payload).unwrap();
        assert_eq!(
            json["name"], "Zoë €",
            "each handler ran once on its payload whole"
        );
    }
    let dead = db
        .scalar_i64(
            "SELECT COUNT(*) FROM `InternalCommands` WHERE `Type` = 'failing.job' \
             AND `DeadLetteredAt` IS NOT NULL AND `LastError` LIKE '%Zoë € failed%'",
        )
        .await;
    assert_eq!(dead, 1, "the error text is kept whole: {stderr}");
    let kept = db
        .scalar_i64(
            "SELECT COUNT(*) FROM `InternalCommands` WHERE `Type` = 'failing.job' \
             AND `Errors` LIKE '%Zoë € failed%'",
        )
        .await;
    assert_eq!(kept, 1, "the attempt's error is kept whole: {stderr}");
    let keyed = db
        .scalar_i64(
            "SELECT COUNT(*) FROM (SELECT `OrderKey`, `ConcurrencyKey` FROM `InternalCommands` \
             UNION ALL SELECT `OrderKey`, `ConcurrencyKey` FROM `InternalCommandsHistory`) AS a \
             WHERE `OrderKey` LIKE 'Zoë-€-%' AND `ConcurrencyKey` = 'tenant-€'",
        )
        .await;
    assert_eq!(keyed, 4, "the keys are kept whole");
    let payloads = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE JSON_VALUE(`Payload`, '$.name') = 'Zoë €'",
            db.all_rows()
        ))
        .await;
    assert_eq!(payloads, 4);
}

/// A PostgreSQL database whose encoding is LATIN1: a handler's error text with characters
/// LATIN1 lacks (`€`) is stored with those characters escaped, instead of failing every
/// stamp of the batch it is in, forever.
#[tokio::test]
async fn a_latin1_postgres_database_keeps_error_texts_it_cannot_store_as_escapes() {
    use sqlx::Connection as _;
    let admin = std::env::var("ICQ_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let name = format!("icqt_latin1_{}", std::process::id());
    let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
    for statement in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!(
            "CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' \
             TEMPLATE template0"
        ),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let (base, _) = admin.rsplit_once('/').unwrap();
    let url = format!("{base}/{name}");
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    stdout_of(icq(cwd).args(["migrate", "add", "--engine", "postgres"]));
    stdout_of(icq(cwd).args(["migrate", "run", "--database-url", &url]));
    for ty in ["failing.job", "fine.job"] {
        stdout_of(icq(cwd).args([
            "schedule",
            "--database-url",
            &url,
            "--type",
            ty,
            "--payload",
            "{\"name\": \"Zoë\"}",
        ]));
    }
    let config = cwd.join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n      \
             max_attempts: 1\n      polling_interval_seconds: 0.1\n\
             handlers:\n  failing.job:\n    exec: [\"sh\", \"-c\", \"echo 'Zoë € failed' >&2; exit 1\"]\n  \
             fine.job:\n    exec: [\"true\"]\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .current_dir(cwd)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut db = sqlx::PgConnection::connect(&url).await.unwrap();
    let rows: Vec<(String, Option<String>, bool, bool)> = sqlx::query_as(
        r#"SELECT "Type", "LastError", "ProcessedAt" IS NOT NULL, "DeadLetteredAt" IS NOT NULL
           FROM "InternalCommands"
           UNION ALL
           SELECT "Type", "LastError", "ProcessedAt" IS NOT NULL, "DeadLetteredAt" IS NOT NULL
           FROM "InternalCommandsHistory" ORDER BY "Type""#,
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    db.close().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("could not stamp"), "{stderr}");
    assert_eq!(rows.len(), 2, "{rows:?}");
    let (_, error, _, dead) = &rows[0];
    assert!(dead, "the failing command is dead-lettered: {rows:?}");
    let error = error.as_deref().unwrap_or_default();
    assert!(
        error.contains("Zo\\u{eb} \\u{20ac} failed"),
        "the error text is kept, its non-ASCII characters escaped: {error}"
    );
    assert!(rows[1].2, "the other command completed: {rows:?}");
}
