//! On SQLite, every operator command that creates or re-creates commands (`schedule`,
//! `schedule --from-file`, `requeue`, `replay`) has its commit on disk before it answers,
//! while another program holds the database open.
//!
//! In WAL mode the last connection to close a database checkpoints it, which syncs the
//! WAL; with another connection open that does not happen and the WAL outlives the
//! command, so the commit's own sync is all there is. Each command runs under
//! `strace`, which records every write and sync with the file it touched: the last write
//! to the WAL (the commit) must be followed by a sync of the WAL, and that sync must come
//! before the command's answer on stdout.

use std::path::Path;
use std::process::Command;

use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode};

use crate::support::TestDb;

/// A dead letter, for `requeue`.
const DEAD: &str = "30000000-0000-4000-8000-000000000001";
/// A completed command, for `replay`.
const DONE: &str = "30000000-0000-4000-8000-000000000002";

/// Opens the database in WAL mode and reads it, so this connection holds it open (as an
/// application running beside the operator would) until it is dropped.
async fn hold_open(db: &TestDb) -> SqliteConnection {
    let options: SqliteConnectOptions = db.url.parse().expect("the test URL parses");
    let mut conn = SqliteConnection::connect_with(&options.journal_mode(SqliteJournalMode::Wal))
        .await
        .expect("open the database");
    let _: i64 = sqlx::query_scalar(r#"SELECT COUNT(*) FROM "InternalCommands""#)
        .fetch_one(&mut conn)
        .await
        .expect("read the table");
    conn
}

async fn count(conn: &mut SqliteConnection, filter: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        r#"SELECT COUNT(*) FROM "InternalCommands" WHERE {filter}"#
    )))
    .fetch_one(conn)
    .await
    .expect("count rows")
}

/// Runs `icq ARGS --database-url URL` under `strace` in `dir`; its trace, which it
/// checks succeeded.
fn traced(db: &TestDb, dir: &Path, args: &[&str]) -> String {
    let trace = dir.join(format!("trace-{}.txt", args.join("-").replace('/', "_")));
    let out = Command::new("strace")
        .args(["-f", "-y", "-s", "0", "-o"])
        .arg(&trace)
        .args(["-e", "trace=write,writev,pwrite64,pwritev,fsync,fdatasync"])
        .arg(env!("CARGO_BIN_EXE_icq"))
        .args(args)
        .args(["--database-url", &db.url])
        .current_dir(dir)
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .output()
        .expect("run strace (installed by .ci/run)");
    assert!(
        out.status.success(),
        "icq {args:?} under strace failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&trace).expect("read the trace")
}

/// The system call a trace line records and the file of its first argument (`strace -y`
/// prints `fdatasync(5</tmp/x.db-wal>)`); `None` for lines that record no call's start.
fn call(line: &str) -> Option<(&str, &str)> {
    // `-f` puts the thread id first.
    let line = line
        .split_once(' ')
        .map_or(line, |(_, rest)| rest)
        .trim_start();
    let (name, rest) = line.split_once('(')?;
    let file = rest.split_once('<')?.1.split_once('>')?.0;
    let fd = rest.split_once('<')?.0;
    Some((name, if fd == "1" { "<stdout>" } else { file }))
}

/// Checks that the trace syncs the WAL after its last write to it, before the first
/// write to stdout after that.
fn assert_commit_synced_before_answer(trace: &str, what: &str) {
    let calls: Vec<(&str, &str)> = trace.lines().filter_map(call).collect();
    let is_wal = |file: &str| file.ends_with("-wal");
    let is_sync = |name: &str| name == "fsync" || name == "fdatasync";
    let last_write = calls
        .iter()
        .rposition(|&(name, file)| name.starts_with("pwrite") && is_wal(file))
        .unwrap_or_else(|| panic!("{what}: no write to the WAL in the trace:\n{trace}"));
    let answer = calls[last_write..]
        .iter()
        .position(|&(name, file)| name.starts_with("write") && file == "<stdout>")
        .map(|at| last_write + at)
        .unwrap_or_else(|| panic!("{what}: no answer on stdout after the commit:\n{trace}"));
    assert!(
        calls[last_write..answer]
            .iter()
            .any(|&(name, file)| is_sync(name) && is_wal(file)),
        "{what}: the WAL was not synced between the commit (its last write) and the \
         answer, so a power loss could undo a command reported as saved:\n{trace}"
    );
}

#[tokio::test]
async fn sqlite_command_creating_writes_are_synced_before_the_answer_while_another_holds_the_database()
 {
    let db = TestDb::with_table("sqlite", "durable_schedules").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut holder = hold_open(&db).await;
    db.execute(&format!(
        r#"INSERT INTO "InternalCommands" ("Id", "Type", "Payload", "Attempts", "DeadLetteredAt", "LastError")
           VALUES ('{DEAD}', 'orders.send_receipt', '{{}}', 5, '2026-01-02T00:00:00.000Z', 'boom');
           INSERT INTO "InternalCommands" ("Id", "Type", "Payload", "Attempts", "ProcessedAt")
           VALUES ('{DONE}', 'replayed.job', '{{}}', 1, '2026-01-02T00:00:00.000Z')"#
    ))
    .await;
    let jobs = dir.path().join("jobs.jsonl");
    std::fs::write(
        &jobs,
        (0..100)
            .map(|i| format!("{{\"type\": \"bulk.job\", \"payload\": {{\"n\": {i}}}}}\n"))
            .collect::<String>(),
    )
    .expect("write the JSON Lines file");
    let jobs = jobs.to_str().expect("a UTF-8 path");

    let runs: [(&str, &[&str], &str); 4] = [
        (
            "schedule",
            &["schedule", "--type", "one.job", "--payload", "{}"],
            r#""Type" = 'one.job'"#,
        ),
        (
            "schedule --from-file",
            &["schedule", "--from-file", jobs],
            r#""Type" = 'bulk.job'"#,
        ),
        (
            "requeue",
            &["requeue", DEAD, "--yes"],
            &format!(r#""Id" = '{DEAD}' AND "DeadLetteredAt" IS NULL"#),
        ),
        (
            "replay",
            &["replay", DONE],
            r#""Type" = 'replayed.job' AND "ProcessedAt" IS NULL"#,
        ),
    ];
    for (what, args, created) in runs {
        let before = count(&mut holder, created).await;
        let trace = traced(&db, dir.path(), args);
        assert!(
            count(&mut holder, created).await > before,
            "{what} wrote nothing"
        );
        assert_commit_synced_before_answer(&trace, what);
    }
    // The condition the test is about: the WAL outlived every command.
    let wal = format!(
        "{}-wal",
        db.url
            .trim_start_matches("sqlite://")
            .split('?')
            .next()
            .unwrap()
    );
    assert!(
        std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0),
        "the WAL {wal} should outlive the commands while the database is held open"
    );
}
