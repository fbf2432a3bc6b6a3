//! The operator subcommands (`pending`, `dead-letters list|show`, `requeue`, `purge`,
//! `replay`, `schedule`) run as a process: their table and JSON output on SQLite
//! as snapshots, their effect on every engine checked with SQL, every bad input's exit
//! code and message, and the batching of bulk requeues through the library.
//!
//! Every database gets the same fixture ([`seed`]): one command in each state, with fixed
//! ids and fixed past timestamps so the order of every listing is known.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use icq::ConnectOptions;
use icq::admin::{self, Progress, PurgeRequest, RequeueTarget};
use icq::{Queue, TableName};
use serde_json::{Value, json};

use crate::support::TestDb;

/// Pending, `RunAt` in the past.
const DUE: &str = "10000000-0000-4000-8000-000000000001";
/// Pending, `RunAt` far in the future.
const SCHEDULED: &str = "10000000-0000-4000-8000-000000000002";
/// Pending with a live lease.
const RUNNING: &str = "10000000-0000-4000-8000-000000000003";
/// Dead since 2026-01-02, `webhooks.deliver`, with a captured context and a long error.
const DEAD_OLD: &str = "10000000-0000-4000-8000-000000000004";
/// Dead since 2026-01-03, `orders.send_receipt`.
const DEAD_NEW: &str = "10000000-0000-4000-8000-000000000005";
/// Completed on 2026-01-01.
const DONE_OLD: &str = "10000000-0000-4000-8000-000000000006";
/// Completed just now.
const DONE_NEW: &str = "10000000-0000-4000-8000-000000000007";
/// An id no fixture row has.
const UNKNOWN: &str = "0b5e3c1e-8f0a-4c1e-9d0e-2f3a4b5c6d7e";

const LONG_ERROR: &str = "HTTP 503 from http://127.0.0.1:8080/hooks after 10.0s: upstream unavailable, \
                          the receiving service answered with an HTML error page instead of JSON\n\
                          <html><body>Service Unavailable</body></html>";

// ---------------------------------------------------------------------------------------
// fixture

/// One command in each state (see the constants).
async fn seed(db: &TestDb) {
    let created = || ("CreatedAt", db.ts("2025-12-31T00:00:00"));
    db.insert_row(
        DUE,
        "orders.send_receipt",
        r#"{"order_id": 1}"#,
        &[created(), ("RunAt", db.ts("2026-01-01T00:00:00"))],
    )
    .await;
    db.insert_row(
        SCHEDULED,
        "orders.send_receipt",
        r#"{"order_id": 2}"#,
        &[created(), ("RunAt", db.ts("2999-01-01T00:00:00"))],
    )
    .await;
    db.insert_row(
        RUNNING,
        "orders.send_receipt",
        r#"{"order_id": 3}"#,
        &[
            created(),
            ("RunAt", db.ts("2026-01-01T00:00:00")),
            ("Attempts", "1".into()),
            ("LockToken", "'20000000-0000-4000-8000-000000000001'".into()),
            ("LockedUntil", db.ts("2999-01-01T00:00:00")),
        ],
    )
    .await;
    db.insert_row(
        DEAD_OLD,
        "webhooks.deliver",
        r#"{"event": "order.paid", "order_id": 4}"#,
        &[
            created(),
            ("RunAt", db.ts("2026-01-01T00:00:00")),
            ("Attempts", "5".into()),
            ("DeadLetteredAt", db.ts("2026-01-02T00:00:00")),
            ("LastError", format!("'{LONG_ERROR}'")),
            ("UserId", "'user-7'".into()),
            ("Roles", r#"'["orders.write", "support"]'"#.into()),
            ("TenantId", "'acme'".into()),
            ("CorrelationId", "'req-42'".into()),
        ],
    )
    .await;
    db.insert_row(
        DEAD_NEW,
        "orders.send_receipt",
        r#"{"order_id": 5}"#,
        &[
            created(),
            ("RunAt", db.ts("2026-01-01T00:00:00")),
            ("Attempts", "1".into()),
            ("DeadLetteredAt", db.ts("2026-01-03T00:00:00")),
            (
                "LastError",
                "'no handler for command type orders.send_receipt'".into(),
            ),
        ],
    )
    .await;
    db.insert_row(
        DONE_OLD,
        "orders.send_receipt",
        r#"{"order_id": 6}"#,
        &[
            created(),
            ("Attempts", "1".into()),
            ("ProcessedAt", db.ts("2026-01-01T00:00:00")),
        ],
    )
    .await;
    db.insert_row(
        DONE_NEW,
        "orders.send_receipt",
        r#"{"order_id": 7}"#,
        &[
            created(),
            ("Attempts", "1".into()),
            ("ProcessedAt", db.now_sql().into()),
        ],
    )
    .await;
}

async fn seeded(engine: &'static str, tag: &str) -> TestDb {
    let db = TestDb::with_table(engine, tag).await;
    seed(&db).await;
    db
}

/// `SELECT COUNT(*) FROM InternalCommands WHERE {condition}` with `{Column}` quoted.
async fn count(db: &TestDb, condition: &str) -> i64 {
    let mut sql = format!(
        "SELECT COUNT(*) FROM {} WHERE {condition}",
        db.q("InternalCommands")
    );
    for column in [
        "Id",
        "Type",
        "Payload",
        "RunAt",
        "Attempts",
        "LockToken",
        "LockedUntil",
        "ProcessedAt",
        "DeadLetteredAt",
        "LastError",
        "UserId",
        "Roles",
        "TenantId",
        "CorrelationId",
        "CreatedAt",
        "Queue",
        "Priority",
        "UniqueKey",
        "TraceParent",
        "Snoozes",
    ] {
        sql = sql.replace(&format!("{{{column}}}"), &db.q(column));
    }
    db.scalar_i64(&sql).await
}

async fn total(db: &TestDb) -> i64 {
    count(db, "1 = 1").await
}

// ---------------------------------------------------------------------------------------
// running the binary

/// A directory standing in for $HOME, the XDG dirs and the working directory, so no
/// configuration file of the machine running the tests is picked up.
fn isolated_home() -> PathBuf {
    // One fixed directory (not one per run): it only ever holds a fixture file.
    let dir = std::env::temp_dir().join("icq-admin-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What one run of `icq` did.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `icq` with `args` (which name the database: `--database-url` or `--config`).
fn icq(args: &[&str], stdin: Option<&str>) -> Run {
    let home = isolated_home();
    let mut cmd = assert_cmd::Command::cargo_bin("icq").unwrap();
    cmd.args(args)
        .current_dir(&home)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", &home)
        .env("XDG_DATA_HOME", &home)
        .env("COLUMNS", "120")
        .env("NO_COLOR", "1")
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG");
    if let Some(stdin) = stdin {
        cmd.write_stdin(stdin);
    }
    let out = cmd.output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Runs `icq --database-url URL args…`.
fn on(db: &TestDb, args: &[&str]) -> Run {
    let mut all = vec!["--database-url", db.url.as_str()];
    all.extend_from_slice(args);
    icq(&all, None)
}

/// Runs a command that must succeed and returns its stdout.
fn ok(db: &TestDb, args: &[&str]) -> String {
    let run = on(db, args);
    assert_eq!(run.code, 0, "icq {args:?} failed: {}", run.stderr);
    run.stdout
}

/// Runs a command with `--format json` that must succeed and returns the document.
fn json_of(db: &TestDb, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--format", "json"]);
    serde_json::from_str(&ok(db, &all)).unwrap()
}

/// Runs a command that must fail with `code` and returns its stderr.
fn fails(db: &TestDb, args: &[&str], code: i32) -> String {
    let run = on(db, args);
    assert_eq!(
        run.code, code,
        "icq {args:?}: stdout {} stderr {}",
        run.stdout, run.stderr
    );
    assert!(
        run.stdout.is_empty(),
        "a failure wrote to stdout: {}",
        run.stdout
    );
    run.stderr
}

/// `$ icq args…` followed by its output, for a snapshot.
fn transcript(db: &TestDb, runs: &[&[&str]]) -> String {
    let mut text = String::new();
    for args in runs {
        text.push_str(&format!("$ icq {}\n{}\n", args.join(" "), ok(db, args)));
    }
    text
}

macro_rules! snapshot {
    ($name:expr, $text:expr) => {
        insta::with_settings!({
            filters => vec![
                (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "[ID]"),
                (r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z", "[TS]"),
            ],
            prepend_module_to_snapshot => true,
        }, {
            insta::assert_snapshot!($name, $text);
        });
    };
}

/// Generates `mod $name { postgres, sqlite, mysql }` tests calling `$name(engine)`.
macro_rules! on_every_engine {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn postgres() {
                super::$name("postgres").await
            }
            #[tokio::test]
            async fn sqlite() {
                super::$name("sqlite").await
            }
            #[tokio::test]
            async fn mysql() {
                super::$name("mysql").await
            }
        }
    )*};
}

// ---------------------------------------------------------------------------------------
// output snapshots (SQLite)

#[tokio::test]
async fn pending_output() {
    let db = seeded("sqlite", "snap_pending").await;
    snapshot!(
        "pending",
        transcript(
            &db,
            &[
                &["pending"],
                &["pending", "--format", "table"],
                &["pending", "--format", "json"],
                &["pending", "--by-type"],
                &["pending", "--by-type", "--format", "table"],
                &["pending", "--by-type", "--format", "json"]
            ]
        )
    );
}

#[tokio::test]
async fn dead_letters_list_output() {
    let db = seeded("sqlite", "snap_dl_list").await;
    snapshot!(
        "dead_letters_list",
        transcript(
            &db,
            &[
                &["dead-letters", "list"],
                &["dead-letters", "list", "--format", "table"],
                &["dead-letters", "list", "--format", "json"],
                &[
                    "dead-letters",
                    "list",
                    "--type",
                    "webhooks.deliver",
                    "--limit",
                    "1"
                ],
            ]
        )
    );
}

#[tokio::test]
async fn dead_letters_show_output() {
    let db = seeded("sqlite", "snap_dl_show").await;
    snapshot!(
        "dead_letters_show",
        transcript(
            &db,
            &[
                &["dead-letters", "show", DEAD_OLD],
                &["dead-letters", "show", DEAD_OLD, "--format", "table"],
                &["dead-letters", "show", DEAD_OLD, "--format", "json"]
            ]
        )
    );
}

#[tokio::test]
async fn empty_outputs() {
    let db = TestDb::with_table("sqlite", "snap_empty").await;
    snapshot!(
        "empty",
        transcript(
            &db,
            &[
                &["pending"],
                &["pending", "--by-type"],
                &["pending", "--by-type", "--format", "json"],
                &["dead-letters", "list"],
                &["dead-letters", "list", "--format", "json"],
                &["requeue", "--all-dead"],
                &["purge", "--completed", "--dead-letters"],
            ]
        )
    );
}

#[tokio::test]
async fn requeue_output() {
    let db = seeded("sqlite", "snap_requeue").await;
    snapshot!(
        "requeue",
        transcript(
            &db,
            &[
                &["requeue", DEAD_NEW, "--yes"],
                &["requeue", DEAD_OLD, "-y", "--format", "json"],
                &["requeue", "--all-dead", "-y", "--format", "json"],
            ]
        )
    );
}

#[tokio::test]
async fn purge_output() {
    let db = seeded("sqlite", "snap_purge").await;
    snapshot!(
        "purge",
        transcript(
            &db,
            &[
                &["purge", "--completed", "--dead-letters", "--dry-run"],
                &[
                    "purge",
                    "--completed",
                    "--dead-letters",
                    "--older-than",
                    "7d",
                    "--dry-run",
                    "--format",
                    "json"
                ],
                &["purge", "--completed", "--older-than", "7d", "--yes"],
                &["purge", "--dead-letters", "--yes", "--format", "json"],
            ]
        )
    );
}

#[tokio::test]
async fn replay_output() {
    let db = seeded("sqlite", "snap_replay").await;
    snapshot!(
        "replay",
        transcript(
            &db,
            &[
                &["replay", DONE_OLD, DEAD_OLD],
                &["replay", DONE_NEW, "--format", "table"],
                &["replay", DEAD_NEW, "--format", "json"]
            ]
        )
    );
}

#[tokio::test]
async fn schedule_output() {
    let db = TestDb::with_table("sqlite", "snap_schedule").await;
    // Written to the directory icq runs in, so the transcript shows a relative path.
    let jobs = "schedule-output-jobs.jsonl";
    std::fs::write(
        isolated_home().join(jobs),
        "{\"type\": \"a\", \"payload\": 1}\n{\"type\": \"b\", \"payload\": {}}\n",
    )
    .unwrap();
    snapshot!(
        "schedule",
        transcript(
            &db,
            &[
                &[
                    "schedule",
                    "--type",
                    "orders.send_receipt",
                    "--payload",
                    r#"{"order_id": 1}"#
                ],
                &[
                    "schedule",
                    "--type",
                    "orders.send_receipt",
                    "--payload",
                    "{}",
                    "--format",
                    "json"
                ],
                &["schedule", "--from-file", jobs],
                &["schedule", "--from-file", jobs, "--format", "json"],
            ]
        )
    );
}

/// Two sources from a configuration file: the output names the source of every row.
#[tokio::test]
async fn several_sources_are_named_in_the_output() {
    let alpha = seeded("sqlite", "multi_alpha").await;
    let beta = TestDb::with_table("sqlite", "multi_beta").await;
    beta.insert_row(
        "30000000-0000-4000-8000-000000000001",
        "billing.charge",
        "{}",
        &[
            ("DeadLetteredAt", beta.ts("2026-01-04T00:00:00")),
            ("LastError", "'card declined'".into()),
        ],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: alpha\n    url: \"{}\"\n  - name: beta\n    url: \"{}\"\n",
            alpha.url, beta.url
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let run = |args: &[&str]| {
        let mut all = vec!["--config", config];
        all.extend_from_slice(args);
        icq(&all, None)
    };
    let mut text = String::new();
    for args in [
        &["pending"][..],
        &["pending", "--format", "json"],
        &["dead-letters", "list", "--limit", "2"],
        &["dead-letters", "list", "--limit", "2", "--format", "json"],
        &["purge", "--completed", "--dead-letters", "--dry-run"],
    ] {
        let out = run(args);
        assert_eq!(out.code, 0, "{}", out.stderr);
        text.push_str(&format!("$ icq {}\n{}\n", args.join(" "), out.stdout));
    }
    snapshot!("several_sources", text);

    // Ids are found in whichever source holds them.
    let out = run(&[
        "dead-letters",
        "show",
        "30000000-0000-4000-8000-000000000001",
        "--format",
        "json",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let shown: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(shown["source"], "beta");
    let out = run(&[
        "requeue",
        DEAD_OLD,
        "30000000-0000-4000-8000-000000000001",
        "-y",
        "--format",
        "json",
    ]);
    assert_eq!(
        (out.code, out.stdout.trim()),
        (0, "{\n  \"requeued\": 2\n}"),
        "{}",
        out.stderr
    );

    // Scheduling needs one target.
    let out = run(&["schedule", "--type", "t", "--payload", "{}"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("2 sources are configured (alpha, beta)"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("--source NAME"), "{}", out.stderr);
    let out = run(&[
        "--source",
        "beta",
        "schedule",
        "--type",
        "t",
        "--payload",
        "{}",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(count(&beta, "{Type} = 't'").await, 1);
    assert_eq!(count(&alpha, "{Type} = 't'").await, 0);
}

// ---------------------------------------------------------------------------------------
// effects on every engine

async fn pending_counts(engine: &'static str) {
    let db = seeded(engine, "pending").await;
    assert_eq!(
        json_of(&db, &["pending"]),
        json!([{"source": "default", "due": 1, "scheduled": 1, "running": 1, "dead": 2, "completed": 2}])
    );
    assert_eq!(
        json_of(&db, &["pending", "--by-type"]),
        json!([
            {"source": "default", "type": "orders.send_receipt", "due": 1, "scheduled": 1, "running": 1, "dead": 1, "completed": 2},
            {"source": "default", "type": "webhooks.deliver", "due": 0, "scheduled": 0, "running": 0, "dead": 1, "completed": 0},
        ])
    );
}

async fn dead_letter_listing(engine: &'static str) {
    let db = seeded(engine, "dead_letters").await;
    let listed = json_of(&db, &["dead-letters", "list"]);
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [DEAD_NEW, DEAD_OLD], "newest first");
    assert_eq!(listed[1]["type"], "webhooks.deliver");
    assert_eq!(listed[1]["attempts"], 5);
    assert_eq!(listed[1]["dead_lettered_at"], "2026-01-02T00:00:00Z");
    assert_eq!(listed[1]["last_error"], LONG_ERROR);
    let keys: Vec<&String> = listed[0].as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "attempts",
            "dead_lettered_at",
            "id",
            "last_error",
            "priority",
            "queue",
            "source",
            "type"
        ]
    );

    let typed = json_of(&db, &["dead-letters", "list", "--type", "webhooks.deliver"]);
    assert_eq!(typed.as_array().unwrap().len(), 1);
    let limited = json_of(&db, &["dead-letters", "list", "--limit", "1"]);
    assert_eq!(limited[0]["id"], DEAD_NEW);
    assert_eq!(limited.as_array().unwrap().len(), 1);

    let shown = json_of(&db, &["dead-letters", "show", DEAD_OLD]);
    assert_eq!(
        shown,
        json!({
            "source": "default",
            "id": DEAD_OLD,
            "type": "webhooks.deliver",
            "payload": {"event": "order.paid", "order_id": 4},
            "created_at": "2025-12-31T00:00:00Z",
            "run_at": "2026-01-01T00:00:00Z",
            "attempts": 5,
            "lock_token": null,
            "locked_until": null,
            "processed_at": null,
            "dead_lettered_at": "2026-01-02T00:00:00Z",
            "state": "dead",
            "last_error": LONG_ERROR,
            "user_id": "user-7",
            "roles": ["orders.write", "support"],
            "tenant_id": "acme",
            "correlation_id": "req-42",
            "queue": "default",
            "priority": 0,
            "unique_key": null,
            "trace_parent": null,
            "snoozes": 0,
            "attempt_errors": [],
            "succeeded_on_attempt": null,
            "held_by": null,
        })
    );
}

async fn requeue_effects(engine: &'static str) {
    let db = seeded(engine, "requeue").await;
    assert_eq!(
        json_of(&db, &["requeue", DEAD_OLD, DUE, DEAD_OLD, "-y"]),
        json!({"requeued": 2})
    );
    let requeued = format!("{{Id}} = '{DEAD_OLD}'");
    assert_eq!(
        count(
            &db,
            &format!("{requeued} AND {{DeadLetteredAt}} IS NULL AND {{ProcessedAt}} IS NULL")
        )
        .await,
        1
    );
    assert_eq!(count(&db, &format!("{requeued} AND {{Attempts}} = 0 AND {{LockToken}} IS NULL AND {{LockedUntil}} IS NULL")).await, 1);
    assert_eq!(
        count(
            &db,
            &format!("{requeued} AND {{LastError}} = '{LONG_ERROR}'")
        )
        .await,
        1,
        "LastError is kept"
    );
    assert_eq!(
        count(
            &db,
            &format!(
                "{requeued} AND {{RunAt}} > {}",
                db.ts("2026-06-01T00:00:00")
            )
        )
        .await,
        1,
        "due now"
    );
    assert_eq!(
        count(
            &db,
            &format!("{requeued} AND {{RunAt}} <= {}", db.now_sql())
        )
        .await,
        1,
        "due now"
    );
    assert_eq!(
        count(&db, "{DeadLetteredAt} IS NOT NULL").await,
        1,
        "the other dead letter is untouched"
    );

    // A running or completed row is refused, and nothing else in the request changes.
    let err = fails(&db, &["requeue", DEAD_NEW, RUNNING, "-y"], 2);
    assert!(
        err.contains(&format!("command {RUNNING} is running")),
        "{err}"
    );
    let err = fails(&db, &["requeue", DEAD_NEW, DONE_OLD, "-y"], 2);
    assert!(err.contains(&format!("`icq replay {DONE_OLD}`")), "{err}");
    assert!(err.contains("nothing was requeued"), "{err}");
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{DEAD_NEW}' AND {{DeadLetteredAt}} IS NOT NULL")
        )
        .await,
        1
    );

    // --all-dead with a type filter, then without.
    assert_eq!(
        json_of(
            &db,
            &["requeue", "--all-dead", "--type", "nothing.like.this", "-y"]
        ),
        json!({"requeued": 0})
    );
    assert_eq!(
        json_of(
            &db,
            &[
                "requeue",
                "--all-dead",
                "--type",
                "orders.send_receipt",
                "-y"
            ]
        ),
        json!({"requeued": 1})
    );
    assert_eq!(count(&db, "{DeadLetteredAt} IS NOT NULL").await, 0);
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{DEAD_NEW}' AND {{Attempts}} = 0 AND {{LastError}} IS NOT NULL")
        )
        .await,
        1
    );
    assert_eq!(
        json_of(&db, &["requeue", "--all-dead", "-y"]),
        json!({"requeued": 0})
    );
    assert_eq!(total(&db).await, 7);
}

async fn purge_effects(engine: &'static str) {
    let db = seeded(engine, "purge").await;
    assert_eq!(
        json_of(
            &db,
            &["purge", "--completed", "--dead-letters", "--dry-run"]
        ),
        json!({"would_delete": 4, "completed": 2, "dead_letters": 2})
    );
    assert_eq!(
        json_of(
            &db,
            &["purge", "--completed", "--older-than", "7d", "--dry-run"]
        ),
        json!({"would_delete": 1, "completed": 1, "dead_letters": 0})
    );
    assert_eq!(total(&db).await, 7, "a dry run deletes nothing");

    assert_eq!(
        json_of(&db, &["purge", "--completed", "--older-than", "7d", "-y"]),
        json!({"deleted": 1, "completed": 1, "dead_letters": 0})
    );
    assert_eq!(count(&db, &format!("{{Id}} = '{DONE_OLD}'")).await, 0);
    assert_eq!(
        count(&db, &format!("{{Id}} = '{DONE_NEW}'")).await,
        1,
        "younger than 7 days"
    );

    assert_eq!(
        json_of(
            &db,
            &["purge", "--dead-letters", "--older-than", "1h", "-y"]
        ),
        json!({"deleted": 2, "completed": 0, "dead_letters": 2})
    );
    assert_eq!(count(&db, "{DeadLetteredAt} IS NOT NULL").await, 0);
    assert_eq!(
        json_of(&db, &["purge", "--completed", "-y"]),
        json!({"deleted": 1, "completed": 1, "dead_letters": 0})
    );
    assert_eq!(count(&db, "{ProcessedAt} IS NOT NULL").await, 0);
    assert_eq!(total(&db).await, 3, "pending rows are never purged");
}

/// `purge --type T` deletes the finished rows of that type only, dead letters and completed
/// alike, comparing the type byte for byte (a trailing space or another case is another
/// type), and its output names the type.
async fn purge_by_type_effects(engine: &'static str) {
    let db = seeded(engine, "purge_by_type").await;
    let done = |n: u32| format!("10000000-0000-4000-8000-00000000010{n}");
    for (n, ty) in [
        (1, "webhooks.deliver"),
        (2, "webhooks.deliver "),
        (3, "Webhooks.deliver"),
    ] {
        db.insert_row(
            &done(n),
            ty,
            "{}",
            &[
                ("Attempts", "1".into()),
                ("ProcessedAt", db.ts("2026-01-01T00:00:00")),
            ],
        )
        .await;
    }
    let args = [
        "purge",
        "--completed",
        "--dead-letters",
        "--type",
        "webhooks.deliver",
    ];
    assert_eq!(
        json_of(&db, &[&args[..], &["--dry-run"]].concat()),
        json!({"would_delete": 2, "completed": 1, "dead_letters": 1, "type": "webhooks.deliver"})
    );
    assert_eq!(
        json_of(&db, &[&args[..], &["-y"]].concat()),
        json!({"deleted": 2, "completed": 1, "dead_letters": 1, "type": "webhooks.deliver"})
    );
    assert_eq!(count(&db, &format!("{{Id}} = '{DEAD_OLD}'")).await, 0);
    assert_eq!(count(&db, &format!("{{Id}} = '{}'", done(1))).await, 0);
    assert_eq!(
        count(&db, "{DeadLetteredAt} IS NOT NULL").await,
        1,
        "the other type's dead letter stays"
    );
    assert_eq!(
        count(&db, "{ProcessedAt} IS NOT NULL").await,
        4,
        "the other types' completed commands stay"
    );
    let text = ok(
        &db,
        &[
            "purge",
            "--dead-letters",
            "--type",
            "orders.send_receipt",
            "--dry-run",
        ],
    );
    assert!(
        text.contains("Would delete 1 dead letter of type orders.send_receipt"),
        "{text}"
    );
}

/// A command read to show its payload's start gets the first characters (not bytes) and
/// the whole payload's length in bytes from the database; a small payload comes whole.
async fn payload_heads_are_cut_by_the_database(engine: &'static str) {
    let db = seeded(engine, "payload_head").await;
    let big = "10000000-0000-4000-8000-000000000201";
    db.insert_row(
        big,
        "reports.render",
        &json!({ "text": "é".repeat(100_000) }).to_string(),
        &[],
    )
    .await;
    let sources = open(&db).await;
    let shown = admin::show_head(&sources, big.parse().unwrap(), 20)
        .await
        .unwrap();
    assert_eq!(shown.row.type_name, "reports.render");
    assert_eq!(
        shown.row.payload,
        Value::Null,
        "the payload is not read whole"
    );
    assert_eq!(
        shown.payload_head.chars().count(),
        20,
        "{}",
        shown.payload_head
    );
    assert!(
        shown.payload_head.starts_with(r#"{"text""#),
        "{}",
        shown.payload_head
    );
    assert!(shown.payload_head.ends_with('é'), "{}", shown.payload_head);
    assert!(!shown.whole());
    // 100,000 two-byte characters and the JSON around them (spacing differs by engine).
    assert!(
        (200_011..200_020).contains(&shown.payload_bytes),
        "{} bytes",
        shown.payload_bytes
    );
    let small = admin::show_head(&sources, DEAD_OLD.parse().unwrap(), 1000)
        .await
        .unwrap();
    assert!(small.whole());
    let payload: Value = serde_json::from_str(&small.payload_head).unwrap();
    assert_eq!(payload, json!({"event": "order.paid", "order_id": 4}));
    assert_eq!(small.row.last_error.as_deref(), Some(LONG_ERROR));
    assert!(matches!(
        admin::show_head(&sources, UNKNOWN.parse().unwrap(), 10).await,
        Err(icq::Error::NotFound(_))
    ));
    admin::close(&sources).await;
}

async fn replay_effects(engine: &'static str) {
    let db = seeded(engine, "replay").await;
    let out = json_of(&db, &["replay", DEAD_OLD, DONE_OLD]);
    let replayed = out["replayed"].as_array().unwrap();
    assert_eq!(replayed.len(), 2);
    assert_eq!(replayed[0]["from"], DEAD_OLD);
    assert_eq!(replayed[1]["from"], DONE_OLD);
    let copy = replayed[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        replayed[0].as_object().unwrap().len(),
        3,
        "exactly from, id and existing"
    );
    assert_eq!(replayed[0]["existing"], false);

    let copy_row = json_of(&db, &["dead-letters", "show", &copy]);
    assert_eq!(copy_row["type"], "webhooks.deliver");
    assert_eq!(
        copy_row["payload"],
        json!({"event": "order.paid", "order_id": 4})
    );
    assert_eq!(copy_row["user_id"], "user-7");
    assert_eq!(copy_row["roles"], json!(["orders.write", "support"]));
    assert_eq!(copy_row["tenant_id"], "acme");
    assert_eq!(copy_row["correlation_id"], "req-42");
    assert_eq!(copy_row["attempts"], 0);
    assert_eq!(copy_row["last_error"], Value::Null);
    assert_eq!(copy_row["dead_lettered_at"], Value::Null);
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{copy}' AND {{RunAt}} <= {}", db.now_sql())
        )
        .await,
        1,
        "due now"
    );
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{DEAD_OLD}' AND {{DeadLetteredAt}} IS NOT NULL")
        )
        .await,
        1,
        "the original stays"
    );
    assert_eq!(total(&db).await, 9);

    let err = fails(&db, &["replay", DUE], 2);
    assert!(
        err.contains(&format!("command {DUE} is still pending (due)")),
        "{err}"
    );
    let err = fails(&db, &["replay", DEAD_NEW, SCHEDULED], 2);
    assert!(err.contains("still pending (scheduled)"), "{err}");
    // Defect: a running command was told to `icq requeue`, which refuses running ones.
    let err = fails(&db, &["replay", RUNNING], 2);
    assert!(
        err.contains(&format!("command {RUNNING} is running")),
        "{err}"
    );
    assert!(!err.contains("requeue"), "advice that works: {err}");
    assert_eq!(total(&db).await, 9, "nothing was replayed");
}

async fn schedule_effects(engine: &'static str) {
    let db = TestDb::with_table(engine, "schedule").await;
    let one = json_of(
        &db,
        &[
            "schedule",
            "--type",
            "orders.send_receipt",
            "--payload",
            r#"{"order_id": 9}"#,
            "--in",
            "5m",
            "--user-id",
            "u1",
            "--roles",
            "a,b",
            "--tenant-id",
            "t1",
            "--correlation-id",
            "c1",
        ],
    );
    let id = one["id"].as_str().unwrap().to_owned();
    assert_eq!(one.as_object().unwrap().len(), 2);
    assert_eq!(one["existing"], false);
    let row = json_of(&db, &["dead-letters", "show", &id]);
    assert_eq!(row["type"], "orders.send_receipt");
    assert_eq!(row["payload"], json!({"order_id": 9}));
    assert_eq!(
        (
            &row["user_id"],
            &row["roles"],
            &row["tenant_id"],
            &row["correlation_id"]
        ),
        (&json!("u1"), &json!(["a", "b"]), &json!("t1"), &json!("c1"))
    );
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{id}' AND {{RunAt}} > {}", db.now_sql())
        )
        .await,
        1,
        "due in 5 minutes"
    );

    let at = json_of(
        &db,
        &[
            "schedule",
            "--type",
            "x",
            "--payload",
            "[1, 2]",
            "--at",
            "2030-05-01T12:00:00+02:00",
        ],
    );
    let at_row = json_of(&db, &["dead-letters", "show", at["id"].as_str().unwrap()]);
    assert_eq!(at_row["run_at"], "2030-05-01T10:00:00Z");
    assert_eq!(at_row["payload"], json!([1, 2]));

    let dir = tempfile::tempdir().unwrap();
    let payload = dir.path().join("payload.json");
    std::fs::write(&payload, r#"{"from": "file"}"#).unwrap();
    let from_file = json_of(
        &db,
        &[
            "schedule",
            "--type",
            "y",
            "--payload",
            &format!("@{}", payload.display()),
        ],
    );
    let file_row = json_of(
        &db,
        &["dead-letters", "show", from_file["id"].as_str().unwrap()],
    );
    assert_eq!(file_row["payload"], json!({"from": "file"}));

    let jobs = dir.path().join("jobs.jsonl");
    std::fs::write(
        &jobs,
        "{\"type\": \"bulk.a\", \"payload\": {\"n\": 1}}\n\
         \n\
         {\"type\": \"bulk.b\", \"payload\": 2, \"run_at\": \"2031-01-01T00:00:00Z\", \"user_id\": \"u\", \"roles\": [\"r\"], \"tenant_id\": \"t\", \"correlation_id\": \"c\"}\n\
         {\"type\": \"bulk.a\", \"payload\": null}\n",
    )
    .unwrap();
    let many = json_of(&db, &["schedule", "--from-file", jobs.to_str().unwrap()]);
    let ids = many["ids"].as_array().unwrap();
    assert_eq!(ids.len(), 3);
    let second = json_of(&db, &["dead-letters", "show", ids[1].as_str().unwrap()]);
    assert_eq!(second["type"], "bulk.b");
    assert_eq!(second["run_at"], "2031-01-01T00:00:00Z");
    assert_eq!(second["roles"], json!(["r"]));
    assert_eq!(second["correlation_id"], "c");
    assert_eq!(count(&db, "{Type} LIKE 'bulk.%'").await, 3);
    assert_eq!(total(&db).await, 6);
}

on_every_engine!(
    pending_counts,
    dead_letter_listing,
    requeue_effects,
    purge_effects,
    purge_by_type_effects,
    payload_heads_are_cut_by_the_database,
    replay_effects,
    schedule_effects
);

fn ids_of(listing: &Value) -> Vec<String> {
    listing["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn list_effects(engine: &'static str) {
    let db = seeded(engine, "list").await;
    let pending = json_of(&db, &["list"]);
    assert_eq!(pending["state"], "pending");
    assert_eq!(pending["total"], 3);
    assert_eq!(pending["next_after"], Value::Null);
    let mut ids = ids_of(&pending);
    ids.sort();
    assert_eq!(ids, [DUE, SCHEDULED, RUNNING]);
    assert_eq!(
        pending["commands"].as_array().unwrap().last().unwrap()["id"],
        SCHEDULED,
        "queue order: the far future last"
    );
    for (state, id) in [("due", DUE), ("scheduled", SCHEDULED), ("running", RUNNING)] {
        let page = json_of(&db, &["list", "--state", state]);
        assert_eq!(ids_of(&page), [id], "{state}");
        assert_eq!(page["commands"][0]["state"], state);
        assert_eq!(page["total"], 1, "{state}");
    }

    // Keyset pages, newest first for dead letters.
    assert_eq!(
        ids_of(&json_of(&db, &["list", "--state", "dead"])),
        [DEAD_NEW, DEAD_OLD]
    );
    let first = json_of(&db, &["list", "--state", "dead", "--limit", "1"]);
    assert_eq!(ids_of(&first), [DEAD_NEW]);
    assert_eq!(first["next_after"], DEAD_NEW);
    assert_eq!(first["total"], 2);
    let second = json_of(
        &db,
        &[
            "list", "--state", "dead", "--limit", "1", "--after", DEAD_NEW,
        ],
    );
    assert_eq!(ids_of(&second), [DEAD_OLD]);
    assert_eq!(second["next_after"], Value::Null);
    let typed = json_of(
        &db,
        &["list", "--state", "dead", "--type", "webhooks.deliver"],
    );
    assert_eq!(ids_of(&typed), [DEAD_OLD]);
    assert_eq!(typed["total"], 1);
    let old = json_of(
        &db,
        &[
            "list",
            "--state",
            "completed",
            "--before",
            "2026-06-01T00:00:00Z",
        ],
    );
    assert_eq!(ids_of(&old), [DONE_OLD]);

    // The next page's command is its own line on stderr (whole, and not mixed
    // into a pipe's result); the summary stays with the table.
    let run = on(
        &db,
        &[
            "list", "--state", "dead", "--limit", "1", "--format", "table",
        ],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let (text, note) = (run.stdout, run.stderr);
    assert!(
        text.contains("Showing 1 of 2 dead commands in source default."),
        "{text}"
    );
    assert!(!text.contains("Next page"), "{text}");
    assert!(
        note.lines()
            .any(|l| l == format!("Next page: icq list --state dead --after {DEAD_NEW}")),
        "{note}"
    );
    let err = fails(&db, &["list", "--after", UNKNOWN], 3);
    assert!(err.contains(UNKNOWN), "{err}");
    fails(&db, &["list", "--limit", "0"], 2);
    fails(&db, &["list", "--before", "yesterday"], 2);
}

async fn show_effects(engine: &'static str) {
    let db = seeded(engine, "show").await;
    for (id, state) in [
        (DUE, "due"),
        (RUNNING, "running"),
        (DONE_OLD, "completed"),
        (DEAD_OLD, "dead"),
    ] {
        let shown = json_of(&db, &["show", id]);
        assert_eq!(shown["id"], id);
        assert_eq!(shown["state"], state, "{id}");
    }
    fails(&db, &["show", UNKNOWN], 3);
}

async fn cancel_effects(engine: &'static str) {
    let db = seeded(engine, "cancel").await;
    for (id, why) in [(DEAD_OLD, "already a dead letter"), (DONE_OLD, "completed")] {
        let err = fails(&db, &["cancel", id, DUE, "-y"], 2);
        assert!(err.contains(why), "{id}: {err}");
    }
    // Two refusals read as two clauses and the consequence, nothing run together.
    let both = fails(&db, &["cancel", RUNNING, DONE_OLD, DEAD_OLD, "-y"], 2);
    let clauses: Vec<&str> = both.trim_end().split("; ").collect();
    assert_eq!(clauses.len(), 3, "{both}");
    assert_eq!(
        clauses[0],
        format!(
            "error: command {DEAD_OLD} is already a dead letter (delete it with `icq purge --dead-letters` or run it again with `icq requeue {DEAD_OLD}`)"
        ),
        "{both}"
    );
    assert_eq!(
        clauses[1],
        format!("command {DONE_OLD} is completed, so there is nothing left to cancel"),
        "{both}"
    );
    assert_eq!(clauses[2], "nothing was cancelled", "{both}");
    fails(&db, &["cancel", UNKNOWN, "-y"], 3);
    let off_terminal = fails(&db, &["cancel", DUE], 2);
    assert!(off_terminal.contains("--yes"), "{off_terminal}");
    assert_eq!(
        count(&db, "{DeadLetteredAt} IS NOT NULL").await,
        2,
        "nothing changed yet"
    );

    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{RUNNING}' AND {{LockToken}} IS NOT NULL")
        )
        .await,
        1,
        "the running row was not touched by the refused requests"
    );
    assert_eq!(
        json_of(&db, &["cancel", DUE, SCHEDULED, DUE, "-y"]),
        json!({"cancelled": 2, "were_running": 0, "commands": [
            {"id": DUE, "was": "pending"},
            {"id": SCHEDULED, "was": "pending"},
        ]})
    );
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} IN ('{DUE}', '{SCHEDULED}') AND {{DeadLetteredAt}} IS NOT NULL AND {{LastError}} = 'cancelled by operator' AND {{ProcessedAt}} IS NULL")
        )
        .await,
        2
    );
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{RUNNING}' AND {{DeadLetteredAt}} IS NULL")
        )
        .await,
        1
    );

    for _ in 0..3 {
        ok(
            &db,
            &["schedule", "--type", "reports.nightly", "--payload", "{}"],
        );
    }
    ok(
        &db,
        &[
            "schedule",
            "--type",
            "reports.nightly",
            "--payload",
            "{}",
            "--in",
            "1d",
        ],
    );
    assert_eq!(
        json_of(&db, &["cancel", "--type", "reports.nightly", "--yes"]),
        json!({"cancelled": 4, "were_running": 0})
    );
    assert_eq!(
        count(
            &db,
            "{Type} = 'reports.nightly' AND {DeadLetteredAt} IS NULL"
        )
        .await,
        0
    );
    assert_eq!(
        json_of(&db, &["cancel", "--type", "reports.nightly", "--yes"]),
        json!({"cancelled": 0, "were_running": 0})
    );
    // A cancelled command is a dead letter like any other: it can be requeued.
    assert_eq!(
        json_of(&db, &["requeue", DUE, "-y"]),
        json!({"requeued": 1})
    );
}

on_every_engine!(list_effects, show_effects, cancel_effects);

/// A row another program wrote with a `RunAt` that is not a time is listed as due and
/// can be cancelled by its id, whatever case or format the id has.
#[tokio::test]
async fn a_foreign_row_can_be_listed_and_cancelled() {
    let db = TestDb::with_table("sqlite", "foreign_cancel").await;
    db.execute(
        r#"INSERT INTO "InternalCommands" ("Id", "Type", "Payload", "RunAt")
           VALUES ('Order-42/ABC', 'legacy.job', '{}', 'tomorrow')"#,
    )
    .await;
    let due = json_of(&db, &["list", "--state", "due"]);
    assert_eq!(ids_of(&due), ["Order-42/ABC"]);
    assert_eq!(
        json_of(&db, &["cancel", "Order-42/ABC", "-y"]),
        json!({"cancelled": 1, "were_running": 0, "commands": [{"id": "Order-42/ABC", "was": "pending"}]})
    );
    let shown = json_of(&db, &["show", "Order-42/ABC"]);
    assert_eq!(shown["state"], "dead");
    assert_eq!(shown["last_error"], "cancelled by operator");
}

// ---------------------------------------------------------------------------------------
// bad input

#[tokio::test]
async fn unknown_ids_exit_3_and_change_nothing() {
    let db = seeded("sqlite", "unknown_ids").await;
    let err = fails(&db, &["dead-letters", "show", UNKNOWN], 3);
    assert_eq!(
        err,
        format!("error: no command with id {UNKNOWN} in source `default`; nothing to show\n")
    );
    let err = fails(&db, &["requeue", DEAD_OLD, UNKNOWN, "-y"], 3);
    assert!(
        err.contains(&format!("no command with id {UNKNOWN}"))
            && err.contains("nothing was requeued"),
        "{err}"
    );
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{DEAD_OLD}' AND {{DeadLetteredAt}} IS NOT NULL")
        )
        .await,
        1,
        "still dead"
    );
    let err = fails(&db, &["replay", DEAD_OLD, UNKNOWN], 3);
    assert!(err.contains("nothing was replayed"), "{err}");
    assert_eq!(total(&db).await, 7);
}

#[tokio::test]
async fn ids_are_matched_as_stored_and_empty_ids_are_usage_errors() {
    // Ids are text on SQLite and MySQL, and other programs may write any: `42` is a
    // well-formed id that matches no row here (exit 3), an empty one is a usage error.
    let db = seeded("sqlite", "malformed_ids").await;
    for args in [
        &["dead-letters", "show", "42"][..],
        &["requeue", "42", "-y"],
        &["replay", DEAD_OLD, "not-an-id"],
    ] {
        let err = fails(&db, args, 3);
        assert!(
            err.contains("not found") || err.contains("no command"),
            "{args:?}: {err}"
        );
    }
    let err = fails(&db, &["dead-letters", "show", " "], 2);
    assert!(err.contains("must not be empty"), "{err}");
    assert_eq!(total(&db).await, 7);
}

#[tokio::test]
async fn bad_durations_and_instants_are_usage_errors() {
    let db = seeded("sqlite", "bad_durations").await;
    let err = fails(
        &db,
        &["purge", "--completed", "--older-than", "7x", "-y"],
        2,
    );
    assert!(
        err.contains("`7x` is not a duration") && err.contains("like 30s, 5m, 12h, 7d"),
        "{err}"
    );
    let err = fails(
        &db,
        &["schedule", "--type", "t", "--payload", "{}", "--in", "soon"],
        2,
    );
    assert!(err.contains("`soon` is not a duration"), "{err}");
    let err = fails(
        &db,
        &[
            "schedule",
            "--type",
            "t",
            "--payload",
            "{}",
            "--at",
            "tomorrow",
        ],
        2,
    );
    assert!(
        err.contains("is not an RFC 3339 instant") && err.contains("2026-01-31T12:00:00Z"),
        "{err}"
    );
    let err = fails(
        &db,
        &[
            "schedule",
            "--type",
            "t",
            "--payload",
            "{}",
            "--at",
            "2030-01-01T00:00:00Z",
            "--in",
            "5m",
        ],
        2,
    );
    assert!(err.contains("cannot be used with"), "{err}");
    let err = fails(&db, &["purge", "-y"], 2);
    assert!(
        err.contains("--completed, --dead-letters, or both"),
        "{err}"
    );
    assert_eq!(total(&db).await, 7);
}

#[tokio::test]
async fn payloads_and_job_files_must_be_json() {
    let db = TestDb::with_table("sqlite", "bad_json").await;
    let err = fails(
        &db,
        &["schedule", "--type", "t", "--payload", "{order: 1}"],
        2,
    );
    assert_eq!(
        err,
        "error: --payload is not JSON: key must be a string at line 1 column 2 (pass a JSON document \
         such as '{\"order_id\": 42}', or @file to read one)\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs.jsonl");
    std::fs::write(&jobs, "{\"type\": \"a\", \"payload\": 1}\n{\"type\": \"a\", \"payload\": 2}\n{\"type\": \"a\", \"payload\": }\n").unwrap();
    let err = fails(&db, &["schedule", "--from-file", jobs.to_str().unwrap()], 2);
    assert!(
        err.ends_with(
            "jobs.jsonl:3: field `payload`: expected value at line 1 column 26; nothing was \
             scheduled\n"
        ),
        "{err}"
    );
    std::fs::write(
        &jobs,
        "{\"type\": \"a\", \"payload\": 1}\n{\"type\": \"a\", \"payload\": 1, \"when\": 3}\n",
    )
    .unwrap();
    let err = fails(&db, &["schedule", "--from-file", jobs.to_str().unwrap()], 2);
    assert!(err.contains("jobs.jsonl:2: unknown field `when`"), "{err}");
    // A value of the wrong type names its field.
    std::fs::write(
        &jobs,
        "{\"type\": \"a\", \"payload\": 1}\n{\"type\": \"a\", \"payload\": 1, \"priority\": \"high\"}\n",
    )
    .unwrap();
    let err = fails(&db, &["schedule", "--from-file", jobs.to_str().unwrap()], 2);
    assert_eq!(
        err.replace(&format!("{}/", dir.path().display()), ""),
        "error: jobs.jsonl:2: field `priority`: invalid type: string \"high\", expected a whole \
         number from -32768 to 32767 (lower runs first) at line 1 column 46; nothing was \
         scheduled\n"
    );
    assert_eq!(total(&db).await, 0, "nothing was inserted");
}

#[tokio::test]
async fn destructive_commands_need_yes_off_a_terminal() {
    let db = seeded("sqlite", "needs_yes").await;
    let err = fails(&db, &["requeue", DEAD_OLD], 2);
    assert_eq!(
        err,
        "error: refusing to requeue 1 command in source default without confirmation: stdin is not \
         a terminal, so pass --yes (-y) to confirm; nothing was changed\n"
    );
    let err = fails(&db, &["requeue", "--all-dead"], 2);
    assert!(err.contains("refusing to requeue 2 dead letters"), "{err}");
    let err = fails(&db, &["purge", "--completed", "--dead-letters"], 2);
    assert!(
        err.contains(
            "refusing to delete 2 completed commands and 2 dead letters from source default"
        ),
        "{err}"
    );
    assert_eq!(count(&db, "{DeadLetteredAt} IS NOT NULL").await, 2);
    assert_eq!(total(&db).await, 7);
}

#[tokio::test]
async fn a_missing_table_is_explained() {
    for engine in ["sqlite", "postgres", "mysql"] {
        let db = TestDb::new(engine, "no_table").await;
        for args in [
            &["pending"][..],
            &["dead-letters", "list"],
            &["purge", "--completed", "-y"],
            &["schedule", "--type", "t", "--payload", "{}"],
        ] {
            let err = fails(&db, args, 1);
            assert!(
                err.contains("does not exist; create it with `icq migrate add --engine"),
                "{engine} {args:?}: {err}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// batches, through the library

/// Records every progress step.
#[derive(Default)]
struct Steps(Mutex<Vec<u64>>);

impl Progress for Steps {
    fn begin(&self, _label: &str, _total: u64) {}
    fn advance(&self, n: u64) {
        self.0.lock().unwrap().push(n);
    }
    fn finish(&self) {}
}

async fn open(db: &TestDb) -> Vec<Queue> {
    let queue = Queue::connect(
        "default",
        &db.url,
        &TableName::default(),
        &ConnectOptions::default(),
    )
    .await
    .unwrap();
    vec![queue]
}

#[tokio::test]
async fn requeue_all_dead_works_in_batches_on_postgres() {
    let db = TestDb::with_table("postgres", "requeue_batches").await;
    db.execute(
        r#"INSERT INTO "InternalCommands" ("Type", "Payload", "Attempts", "DeadLetteredAt", "LastError")
           SELECT 'bulk.t', jsonb_build_object('n', n), 5, now() - interval '1 hour', 'boom'
           FROM generate_series(1, 20000) AS n"#,
    )
    .await;
    let sources = open(&db).await;
    let plan = admin::plan_requeue(
        &sources,
        &RequeueTarget::AllDead {
            type_name: None,
            queue: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(plan.total(), 20_000);
    // A row that dies after the plan was made is not part of it.
    db.execute(
        r#"INSERT INTO "InternalCommands" ("Type", "Payload", "DeadLetteredAt") VALUES ('late', '{}', now() + interval '1 second')"#,
    )
    .await;
    let steps = Steps::default();
    let report = admin::requeue(&plan, &steps).await.unwrap();
    assert_eq!(report.requeued, 20_000);
    let steps = steps.0.into_inner().unwrap();
    assert!(steps.len() >= 20, "{} batches", steps.len());
    assert!(
        steps.iter().all(|n| *n <= u64::from(admin::REQUEUE_BATCH)),
        "{steps:?}"
    );
    assert_eq!(count(&db, "{Type} = 'bulk.t' AND {DeadLetteredAt} IS NULL AND {Attempts} = 0 AND {LastError} = 'boom'").await, 20_000);
    assert_eq!(
        count(&db, "{Type} = 'late' AND {DeadLetteredAt} IS NOT NULL").await,
        1
    );
    admin::close(&sources).await;
}

/// A one-off measurement, not a test: `cargo test --test cli admin::measure -- --ignored
/// --nocapture`. Requeues 100,000 dead rows and purges 1,000,000 completed rows on
/// PostgreSQL through the same library calls the CLI makes, and prints the times.
#[tokio::test]
#[ignore = "a measurement that takes a while; run by hand"]
async fn measure_bulk_requeue_and_purge_on_postgres() {
    let db = TestDb::with_table("postgres", "measure").await;
    db.execute(
        r#"INSERT INTO "InternalCommands" ("Type", "Payload", "Attempts", "DeadLetteredAt", "LastError")
           SELECT 'dead.t', jsonb_build_object('n', n), 5, now() - interval '1 day', 'boom'
           FROM generate_series(1, 100000) AS n;
           INSERT INTO "InternalCommands" ("Type", "Payload", "Attempts", "ProcessedAt")
           SELECT 'done.t', jsonb_build_object('n', n), 1, now() - interval '8 days' + n * interval '1 millisecond'
           FROM generate_series(1, 1000000) AS n;
           ANALYZE "InternalCommands";"#,
    )
    .await;
    let sources = open(&db).await;

    let started = Instant::now();
    let plan = admin::plan_requeue(
        &sources,
        &RequeueTarget::AllDead {
            type_name: None,
            queue: None,
        },
    )
    .await
    .unwrap();
    let report = admin::requeue(&plan, &admin::NoProgress).await.unwrap();
    let requeue_time = started.elapsed();
    assert_eq!(report.requeued, 100_000);

    let started = Instant::now();
    let request = PurgeRequest {
        completed: true,
        dead_letters: false,
        older_than: Some(std::time::Duration::from_secs(7 * 86_400)),
        queue: None,
        type_name: None,
    };
    let plan = admin::plan_purge(&sources, &request).await.unwrap();
    let report = admin::purge(&plan, &admin::NoProgress).await.unwrap();
    let purge_time = started.elapsed();
    assert_eq!(report.total(), 1_000_000);
    println!("requeue --all-dead of 100,000 dead rows: {requeue_time:.2?}");
    println!("purge --completed --older-than 7d of 1,000,000 rows: {purge_time:.2?}");
    admin::close(&sources).await;
}

/// Runs `icq --database-url URL args…` with `$COLUMNS` set to `columns` (or unset).
fn with_columns(db: &TestDb, columns: Option<&str>, args: &[&str]) -> Run {
    let home = isolated_home();
    let mut cmd = assert_cmd::Command::cargo_bin("icq").unwrap();
    cmd.arg("--database-url")
        .arg(&db.url)
        .args(args)
        .current_dir(&home)
        .env("HOME", &home)
        .env("NO_COLOR", "1")
        .env_remove("COLUMNS")
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG");
    if let Some(columns) = columns {
        cmd.env("COLUMNS", columns);
    }
    let out = cmd.output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn widest_line(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

/// Defect: at 80 columns `dead-letters list` was 87 wide with a one-character error
/// column, and `$COLUMNS` was ignored. Tables fit `$COLUMNS`, cut the error with `…`
/// and never wrap a row onto more lines.
#[tokio::test]
async fn tables_fit_the_terminal_width() {
    let db = seeded("sqlite", "fit_width").await;
    for columns in ["80", "100", "120"] {
        let run = with_columns(
            &db,
            Some(columns),
            &["dead-letters", "list", "--format", "table"],
        );
        assert_eq!(run.code, 0, "{}", run.stderr);
        let width: usize = columns.parse().unwrap();
        assert!(
            widest_line(&run.stdout) <= width,
            "wider than {width}:\n{}",
            run.stdout
        );
        // Top border, header, rule, two rows, bottom border: no wrapped lines.
        assert_eq!(run.stdout.lines().count(), 6, "{}", run.stdout);
        assert!(
            run.stdout.contains(DEAD_OLD),
            "ids stay whole:\n{}",
            run.stdout
        );
        assert!(run.stdout.contains('…'), "{}", run.stdout);
    }
    for args in [
        &["pending", "--by-type", "--format", "table"][..],
        &["dead-letters", "show", DEAD_OLD, "--format", "table"],
    ] {
        let run = with_columns(&db, Some("80"), args);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert!(widest_line(&run.stdout) <= 80, "{args:?}:\n{}", run.stdout);
    }
    // Narrower than ids, a type and an error can be: the table leaves out the droppable
    // columns and stays one line per row rather than wrapping.
    let narrow = with_columns(
        &db,
        Some("40"),
        &["dead-letters", "list", "--format", "table"],
    );
    assert_eq!(narrow.stdout.lines().count(), 6, "{}", narrow.stdout);
    assert!(!narrow.stdout.contains("Attempts"), "{}", narrow.stdout);
}

/// Defect: with a reported width of 0 every column collapsed to one character. An
/// unknown width (unset or 0 `$COLUMNS`, a terminal that reports 0 columns) means 100.
#[tokio::test]
async fn tables_fall_back_to_100_columns_when_the_width_is_unknown() {
    let db = seeded("sqlite", "fit_fallback").await;
    for columns in [None, Some("0")] {
        let run = with_columns(&db, columns, &["dead-letters", "list", "--format", "table"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert_eq!(
            widest_line(&run.stdout),
            100,
            "{columns:?}:\n{}",
            run.stdout
        );
        assert_eq!(run.stdout.lines().count(), 6, "{}", run.stdout);
    }
    // A real terminal that reports 0 columns (`script` gives icq a pseudo-terminal).
    let bin = assert_cmd::cargo::cargo_bin("icq");
    let line = format!(
        "stty cols 0 rows 0; {} --database-url '{}' dead-letters list",
        bin.display(),
        db.url
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env_remove("COLUMNS")
        .env("NO_COLOR", "1")
        .output()
        .expect("run script(1)");
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(out.status.success(), "{text}");
    assert!(text.contains('╭'), "a terminal gets a table:\n{text}");
    assert_eq!(widest_line(&text), 100, "{text}");
}

/// Off a terminal, listings are tab-separated lines with a header (like `gh`), whole
/// values with tabs and line breaks escaped; `--format table` still draws the table.
#[tokio::test]
async fn listings_in_a_pipe_are_tab_separated() {
    let db = seeded("sqlite", "tsv").await;
    let run = with_columns(&db, None, &["dead-letters", "list"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "Id\tType\tQueue\tAttempts\tDead lettered at\tLast error"
    );
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    assert!(
        lines.iter().all(|l| l.split('\t').count() == 6),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains(DEAD_OLD));
    let pending = with_columns(&db, None, &["pending"]);
    assert!(
        pending
            .stdout
            .starts_with("Due\tScheduled\tRunning\tDead\tCompleted\n"),
        "{}",
        pending.stdout
    );
    let table = with_columns(&db, None, &["pending", "--format", "table"]);
    assert!(table.stdout.contains('╭'), "{}", table.stdout);
}

/// On PostgreSQL (a `uuid` column) an id in upper case or in braces is the same
/// value: `show` finds it and `requeue` requeues it.
#[tokio::test]
async fn uuid_spellings_on_postgres() {
    let db = seeded("postgres", "uuid_spellings").await;
    let upper = DEAD_OLD.to_uppercase();
    let braced = format!("{{{upper}}}");
    for spelling in [upper.as_str(), braced.as_str()] {
        let shown = json_of(&db, &["show", spelling]);
        assert_eq!(shown["id"], DEAD_OLD, "{spelling}");
        assert_eq!(shown["state"], "dead", "{spelling}");
    }
    assert_eq!(
        json_of(&db, &["requeue", &braced, "-y"]),
        json!({"requeued": 1})
    );
    let requeued = format!("{{Id}} = '{DEAD_OLD}' AND {{DeadLetteredAt}} IS NULL");
    assert_eq!(count(&db, &requeued).await, 1);
    let err = fails(&db, &["show", &UNKNOWN.to_uppercase()], 3);
    assert!(err.contains(&UNKNOWN.to_uppercase()), "{err}");
}

// ---------------------------------------------------------------------------------------
// schema version 2: queues, priorities, unique keys; cancelling running commands

/// The fixture with queues: `DUE` (priority 5) and `DEAD_OLD` in `emails`, the rest in
/// `default`; `SCHEDULED` holds the unique key `k-2`; `DEAD_OLD` has a trace parent and
/// 3 snoozes.
async fn seeded_queues(engine: &'static str, tag: &str) -> TestDb {
    let db = seeded(engine, tag).await;
    let t = db.q("InternalCommands");
    let (id, queue, priority, key, parent, snoozes) = (
        db.q("Id"),
        db.q("Queue"),
        db.q("Priority"),
        db.q("UniqueKey"),
        db.q("TraceParent"),
        db.q("Snoozes"),
    );
    db.execute(&format!(
        "UPDATE {t} SET {queue} = 'emails', {priority} = 5 WHERE {id} = '{DUE}';
         UPDATE {t} SET {queue} = 'emails', {parent} = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', {snoozes} = 3 WHERE {id} = '{DEAD_OLD}';
         UPDATE {t} SET {key} = 'k-2' WHERE {id} = '{SCHEDULED}';"
    ))
    .await;
    db
}

/// What a request that must change nothing is checked against: the count of rows in each
/// state and the lease columns.
async fn fingerprint(db: &TestDb) -> Vec<i64> {
    let mut prints = Vec::new();
    for condition in [
        "1 = 1",
        "{DeadLetteredAt} IS NOT NULL",
        "{ProcessedAt} IS NOT NULL",
        "{LockToken} IS NOT NULL",
        "{LastError} IS NOT NULL",
        "{Attempts} = 0",
    ] {
        prints.push(count(db, condition).await);
    }
    prints
}

async fn queue_views(engine: &'static str) {
    let db = seeded_queues(engine, "queue_views").await;
    assert_eq!(
        json_of(&db, &["pending", "--by-queue"]),
        json!([
            {"source": "default", "queue": "default", "due": 0, "scheduled": 1, "running": 1, "dead": 1, "completed": 2},
            {"source": "default", "queue": "emails", "due": 1, "scheduled": 0, "running": 0, "dead": 1, "completed": 0},
        ])
    );
    assert_eq!(
        json_of(&db, &["pending", "--by-queue", "--by-type"]),
        json!([
            {"source": "default", "queue": "default", "type": "orders.send_receipt", "due": 0, "scheduled": 1, "running": 1, "dead": 1, "completed": 2},
            {"source": "default", "queue": "emails", "type": "orders.send_receipt", "due": 1, "scheduled": 0, "running": 0, "dead": 0, "completed": 0},
            {"source": "default", "queue": "emails", "type": "webhooks.deliver", "due": 0, "scheduled": 0, "running": 0, "dead": 1, "completed": 0},
        ])
    );
    assert_eq!(
        json_of(&db, &["pending", "--queue", "emails"]),
        json!([{"source": "default", "due": 1, "scheduled": 0, "running": 0, "dead": 1, "completed": 0}])
    );
    assert_eq!(
        json_of(&db, &["pending", "--queue", "nowhere", "--by-type"]),
        json!([])
    );
    let table = ok(&db, &["pending", "--by-queue", "--format", "table"]);
    assert!(
        table.contains("Queue") && table.contains("emails"),
        "{table}"
    );

    let listed = json_of(&db, &["list", "--queue", "emails"]);
    assert_eq!(ids_of(&listed), [DUE]);
    assert_eq!(listed["total"], 1);
    assert_eq!(
        (
            &listed["commands"][0]["queue"],
            &listed["commands"][0]["priority"]
        ),
        (&json!("emails"), &json!(5))
    );
    let default = json_of(&db, &["list", "--queue", "default"]);
    assert_eq!(ids_of(&default), [RUNNING, SCHEDULED]);
    assert_eq!(default["commands"][0]["queue"], "default");
    let dead = json_of(&db, &["list", "--state", "dead", "--queue", "emails"]);
    assert_eq!(ids_of(&dead), [DEAD_OLD]);
    let typed = json_of(
        &db,
        &["list", "--queue", "default", "--type", "webhooks.deliver"],
    );
    assert_eq!(typed["total"], 0);
    let table = ok(&db, &["list", "--queue", "emails", "--format", "table"]);
    assert!(
        table.contains("Queue") && table.contains("emails"),
        "{table}"
    );

    let letters = json_of(&db, &["dead-letters", "list", "--queue", "emails"]);
    assert_eq!(letters.as_array().unwrap().len(), 1);
    assert_eq!(
        (
            &letters[0]["id"],
            &letters[0]["queue"],
            &letters[0]["priority"]
        ),
        (&json!(DEAD_OLD), &json!("emails"), &json!(0))
    );
    let letters = json_of(&db, &["dead-letters", "list", "--queue", "default"]);
    assert_eq!(letters[0]["id"], DEAD_NEW);

    let shown = json_of(&db, &["dead-letters", "show", DEAD_OLD]);
    assert_eq!(shown["queue"], "emails");
    assert_eq!(
        shown["trace_parent"],
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    );
    assert_eq!(shown["snoozes"], 3);
    let shown = json_of(&db, &["show", SCHEDULED]);
    assert_eq!(
        (&shown["unique_key"], &shown["queue"], &shown["priority"]),
        (&json!("k-2"), &json!("default"), &json!(0))
    );
    let shown = ok(&db, &["show", DUE]);
    assert!(shown.contains("Queue\temails"), "{shown}");
    assert!(shown.contains("Priority\t5"), "{shown}");
}

async fn queue_filters_change_only_their_queue(engine: &'static str) {
    let db = seeded_queues(engine, "queue_filters").await;
    // purge
    assert_eq!(
        json_of(
            &db,
            &[
                "purge",
                "--dead-letters",
                "--completed",
                "--queue",
                "emails",
                "--dry-run"
            ]
        ),
        json!({"would_delete": 1, "completed": 0, "dead_letters": 1, "queue": "emails"})
    );
    assert_eq!(
        json_of(&db, &["purge", "--dead-letters", "--queue", "emails", "-y"]),
        json!({"deleted": 1, "completed": 0, "dead_letters": 1, "queue": "emails"})
    );
    assert_eq!(count(&db, &format!("{{Id}} = '{DEAD_OLD}'")).await, 0);
    assert_eq!(count(&db, &format!("{{Id}} = '{DEAD_NEW}'")).await, 1);
    assert_eq!(
        json_of(&db, &["purge", "--completed", "--queue", "default", "-y"]),
        json!({"deleted": 2, "completed": 2, "dead_letters": 0, "queue": "default"})
    );

    // cancel: alone, and with --type
    assert_eq!(
        json_of(
            &db,
            &[
                "cancel",
                "--queue",
                "emails",
                "--type",
                "webhooks.deliver",
                "-y"
            ]
        ),
        json!({"cancelled": 0, "were_running": 0})
    );
    assert_eq!(
        json_of(&db, &["cancel", "--queue", "emails", "-y"]),
        json!({"cancelled": 1, "were_running": 0})
    );
    assert_eq!(
        count(
            &db,
            &format!(
                "{{Id}} = '{DUE}' AND {{DeadLetteredAt}} IS NOT NULL AND {{Queue}} = 'emails'"
            )
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} IN ('{SCHEDULED}', '{RUNNING}') AND {{DeadLetteredAt}} IS NULL")
        )
        .await,
        2,
        "other queues are left alone"
    );

    // requeue --all-dead: DEAD_NEW (default) stays dead, DUE (emails, just cancelled) goes back
    assert_eq!(
        json_of(&db, &["requeue", "--all-dead", "--queue", "emails", "-y"]),
        json!({"requeued": 1})
    );
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{DUE}' AND {{DeadLetteredAt}} IS NULL AND {{Queue}} = 'emails' AND {{Priority}} = 5")
        )
        .await,
        1,
        "requeued with its queue and priority"
    );
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{DEAD_NEW}' AND {{DeadLetteredAt}} IS NOT NULL")
        )
        .await,
        1
    );
    assert_eq!(
        json_of(
            &db,
            &[
                "requeue",
                "--all-dead",
                "--queue",
                "default",
                "--type",
                "orders.send_receipt",
                "-y"
            ]
        ),
        json!({"requeued": 1})
    );
}

async fn cancel_running(engine: &'static str) {
    let db = seeded_queues(engine, "cancel_running").await;
    let mut listener = if engine == "postgres" {
        let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
        listener
            .listen("icq_cancel_InternalCommands")
            .await
            .unwrap();
        Some(listener)
    } else {
        None
    };
    let wait = std::time::Duration::from_millis(500);

    // A pending row that is not running: no cancel notification.
    assert_eq!(
        json_of(&db, &["cancel", SCHEDULED, "-y"]),
        json!({"cancelled": 1, "were_running": 0, "commands": [{"id": SCHEDULED, "was": "pending"}]})
    );
    if let Some(listener) = &mut listener {
        assert!(
            tokio::time::timeout(wait, listener.recv()).await.is_err(),
            "no running row was cancelled, so no notification"
        );
    }

    // A running row (its lease set by SQL, as a processor's claim sets it) and a due one.
    let t = db.q("InternalCommands");
    db.execute(&format!(
        "UPDATE {t} SET {} = '20000000-0000-4000-8000-000000000009', {} = {} WHERE {} = '{DUE}'",
        db.q("LockToken"),
        db.q("LockedUntil"),
        db.ts("2999-01-01T00:00:00"),
        db.q("Id")
    ))
    .await;
    assert_eq!(
        json_of(&db, &["cancel", RUNNING, DUE, "-y"]),
        json!({"cancelled": 2, "were_running": 2, "commands": [
            {"id": RUNNING, "was": "running"},
            {"id": DUE, "was": "running"},
        ]})
    );
    assert_eq!(
        count(
            &db,
            &format!(
                "{{Id}} IN ('{RUNNING}', '{DUE}') AND {{DeadLetteredAt}} IS NOT NULL \
                 AND {{ProcessedAt}} IS NULL AND {{LastError}} = 'cancelled by operator' \
                 AND {{LockToken}} IS NULL AND {{LockedUntil}} IS NULL"
            )
        )
        .await,
        2
    );
    if let Some(listener) = &mut listener {
        let note = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
            .await
            .expect("a notification within 5 s")
            .unwrap();
        assert_eq!(note.channel(), "icq_cancel_InternalCommands");
    }
    let shown = json_of(&db, &["show", RUNNING]);
    assert_eq!(
        (&shown["state"], &shown["last_error"]),
        (&json!("dead"), &json!("cancelled by operator"))
    );

    // Completed, dead and unknown ids change nothing, running rows included.
    let before = fingerprint(&db).await;
    let err = fails(&db, &["cancel", DONE_OLD, "-y"], 2);
    assert!(err.contains("is completed"), "{err}");
    let err = fails(&db, &["cancel", RUNNING, "-y"], 2);
    assert!(err.contains("already a dead letter"), "{err}");
    fails(&db, &["cancel", UNKNOWN, DEAD_NEW, "-y"], 3);
    assert_eq!(fingerprint(&db).await, before);

    // A table (human) answer says how many were running.
    db.execute(&format!(
        "UPDATE {t} SET {} = NULL, {} = NULL, {} = NULL WHERE {} = '{RUNNING}'",
        db.q("DeadLetteredAt"),
        db.q("LastError"),
        db.q("LockToken"),
        db.q("Id")
    ))
    .await;
    db.execute(&format!(
        "UPDATE {t} SET {} = {} WHERE {} = '{RUNNING}'",
        db.q("LockedUntil"),
        db.ts("2999-01-01T00:00:00"),
        db.q("Id")
    ))
    .await;
    let said = ok(&db, &["cancel", RUNNING, "-y", "--format", "table"]);
    assert!(said.contains("1 of them running"), "{said}");
}

/// Inserts a dead letter (or a pending row with `dead_at` = None) holding `key`.
async fn keyed(db: &TestDb, id: &str, key: Option<&str>, dead_at: Option<&str>) {
    let mut columns = vec![("RunAt", db.ts("2026-01-01T00:00:00"))];
    if let Some(key) = key {
        columns.push(("UniqueKey", format!("'{key}'")));
    }
    if let Some(at) = dead_at {
        columns.push(("DeadLetteredAt", db.ts(at)));
        columns.push(("LastError", "'boom'".into()));
        columns.push(("Attempts", "3".into()));
    }
    db.insert_row(id, "keyed.t", r#"{"k": 1}"#, &columns).await;
}

const D1: &str = "40000000-0000-4000-8000-000000000001";
const P1: &str = "40000000-0000-4000-8000-000000000002";
const D2: &str = "40000000-0000-4000-8000-000000000003";
const D3: &str = "40000000-0000-4000-8000-000000000004";
const D4: &str = "40000000-0000-4000-8000-000000000005";
const D5: &str = "40000000-0000-4000-8000-000000000006";
const D6: &str = "40000000-0000-4000-8000-000000000007";
const D7: &str = "40000000-0000-4000-8000-000000000008";

async fn requeue_with_taken_keys(engine: &'static str) {
    let db = TestDb::with_table(engine, "requeue_keys").await;
    keyed(&db, D1, Some("k"), Some("2026-01-01T00:00:01")).await;
    keyed(&db, P1, Some("k"), None).await;
    keyed(&db, D2, Some("j"), Some("2026-01-01T00:00:02")).await;
    keyed(&db, D3, Some("j"), Some("2026-01-01T00:00:03")).await;
    keyed(&db, D4, None, Some("2026-01-01T00:00:04")).await;

    // By id: the taken key's row stays dead and is reported; the others go back.
    assert_eq!(
        json_of(&db, &["requeue", D1, D4, "-y"]),
        json!({"requeued": 1, "skipped": [{
            "id": D1, "unique_key": "k", "held_by": P1,
            "reason": format!("unique key k is held by pending row {P1}"),
        }]})
    );
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{D1}' AND {{DeadLetteredAt}} IS NOT NULL")
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &db,
            &format!("{{Id}} = '{D4}' AND {{DeadLetteredAt}} IS NULL")
        )
        .await,
        1
    );
    // Two dead letters sharing a key: the first named goes back, the second waits.
    assert_eq!(
        json_of(&db, &["requeue", D2, D3, "-y"]),
        json!({"requeued": 1, "skipped": [{
            "id": D3, "unique_key": "j", "held_by": D2,
            "reason": format!("unique key j is held by pending row {D2}"),
        }]})
    );
    // Only taken keys: nothing to do, and no error.
    let run = on(&db, &["requeue", D1, "-y"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("Requeued 0 commands."),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&format!("Skipped {D1}")),
        "{}",
        run.stdout
    );
    assert!(run.stderr.contains("stays dead"), "{}", run.stderr);

    // --all-dead: D5 and D7 go back; D1 (held by P1), D3 (held by D2) and D6 (held by D5,
    // which went back first) stay dead.
    keyed(&db, D5, Some("m"), Some("2026-01-01T00:00:05")).await;
    keyed(&db, D6, Some("m"), Some("2026-01-01T00:00:06")).await;
    keyed(&db, D7, None, Some("2026-01-01T00:00:07")).await;
    let out = json_of(&db, &["requeue", "--all-dead", "-y"]);
    assert_eq!(out["requeued"], 2, "{out}");
    let skipped: Vec<(&str, &str)> = out["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].as_str().unwrap(), s["held_by"].as_str().unwrap()))
        .collect();
    assert_eq!(skipped, [(D1, P1), (D3, D2), (D6, D5)], "{out}");
    assert_eq!(
        count(&db, "{DeadLetteredAt} IS NOT NULL").await,
        3,
        "D1, D3 and D6 stay dead"
    );
    assert_eq!(
        count(
            &db,
            &format!(
                "{{Id}} IN ('{D5}', '{D7}') AND {{DeadLetteredAt}} IS NULL AND {{Attempts}} = 0"
            )
        )
        .await,
        2
    );
}

async fn replay_with_unique_keys(engine: &'static str) {
    let db = TestDb::with_table(engine, "replay_keys").await;
    keyed(&db, D1, Some("k"), Some("2026-01-01T00:00:01")).await;
    keyed(&db, P1, Some("k"), None).await;
    // A pending row holds the key: it stands for the replay, no copy is made.
    assert_eq!(
        json_of(&db, &["replay", D1]),
        json!({"replayed": [{"from": D1, "id": P1, "existing": true}]})
    );
    assert_eq!(total(&db).await, 2);
    let table = ok(&db, &["replay", D1, "--format", "table"]);
    assert!(table.contains("already pending"), "{table}");
    // Two dead letters with one free key: one copy, which the second also reports.
    keyed(&db, D2, Some("j"), Some("2026-01-01T00:00:02")).await;
    keyed(&db, D3, Some("j"), Some("2026-01-01T00:00:03")).await;
    let out = json_of(&db, &["replay", D2, D3]);
    let replayed = out["replayed"].as_array().unwrap();
    assert_eq!(replayed[0]["existing"], false, "{out}");
    assert_eq!(replayed[1]["existing"], true, "{out}");
    assert_eq!(replayed[0]["id"], replayed[1]["id"], "{out}");
    assert_eq!(total(&db).await, 5);
}

/// The copy carries the queue, priority and unique key (the insert of those columns is
/// the scheduling side's, the `v2-engine` branch).
async fn replay_copies_queue_priority_and_key(engine: &'static str) {
    let db = TestDb::with_table(engine, "replay_copies").await;
    keyed(&db, D1, Some("k"), Some("2026-01-01T00:00:01")).await;
    db.execute(&format!(
        "UPDATE {} SET {} = 'emails', {} = -3 WHERE {} = '{D1}'",
        db.q("InternalCommands"),
        db.q("Queue"),
        db.q("Priority"),
        db.q("Id")
    ))
    .await;
    let out = json_of(&db, &["replay", D1]);
    let copy = out["replayed"][0]["id"].as_str().unwrap().to_owned();
    let shown = json_of(&db, &["show", &copy]);
    assert_eq!(
        (&shown["queue"], &shown["priority"], &shown["unique_key"]),
        (&json!("emails"), &json!(-3), &json!("k")),
        "{shown}"
    );
}

/// A version-1 table (before `icq migrate` added queues): every view works and shows the
/// one queue, `default`; a `--queue` filter is refused naming the upgrade, changing nothing.
async fn version_1_tables(engine: &'static str) {
    let db = TestDb::new(engine, "v1_views").await;
    let kind: icq::Engine = engine.parse().unwrap();
    db.execute(&icq::schema::render_v1(kind, &TableName::default()).up)
        .await;
    seed(&db).await;

    assert_eq!(
        json_of(&db, &["pending", "--by-queue"]),
        json!([{"source": "default", "queue": "default", "due": 1, "scheduled": 1, "running": 1, "dead": 2, "completed": 2}])
    );
    assert_eq!(
        json_of(&db, &["pending", "--by-queue", "--by-type"])[1]["queue"],
        "default"
    );
    let listed = json_of(&db, &["list"]);
    assert_eq!(listed["commands"][0]["queue"], "default");
    assert_eq!(listed["commands"][0]["priority"], 0);
    let letters = json_of(&db, &["dead-letters", "list"]);
    assert_eq!(letters[0]["queue"], "default");
    let shown = json_of(&db, &["dead-letters", "show", DEAD_OLD]);
    assert_eq!(
        (&shown["queue"], &shown["unique_key"], &shown["snoozes"]),
        (&json!("default"), &Value::Null, &json!(0))
    );
    ok(&db, &["show", DUE]);

    let before = fingerprint(&db).await;
    for args in [
        &["pending", "--queue", "emails"][..],
        &["list", "--queue", "emails"],
        &["dead-letters", "list", "--queue", "emails"],
        &["requeue", "--all-dead", "--queue", "emails", "-y"],
        &["cancel", "--queue", "emails", "-y"],
        &[
            "cancel",
            "--queue",
            "emails",
            "--type",
            "orders.send_receipt",
            "-y",
        ],
        &["purge", "--dead-letters", "--queue", "emails", "-y"],
    ] {
        let err = fails(&db, args, 2);
        assert!(
            err.contains("schema version 1") && err.contains("icq migrate add"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(fingerprint(&db).await, before, "nothing changed");

    // Everything without a queue keeps working on version 1.
    assert_eq!(json_of(&db, &["cancel", RUNNING, "-y"])["were_running"], 1);
    assert_eq!(
        json_of(&db, &["requeue", DEAD_OLD, "-y"]),
        json!({"requeued": 1})
    );
    assert_eq!(
        json_of(&db, &["requeue", "--all-dead", "-y"]),
        json!({"requeued": 2})
    );
    assert_eq!(
        json_of(&db, &["replay", DONE_OLD])["replayed"][0]["existing"],
        false
    );
    assert_eq!(json_of(&db, &["purge", "--completed", "-y"])["deleted"], 2);
}

on_every_engine!(
    queue_views,
    queue_filters_change_only_their_queue,
    cancel_running,
    requeue_with_taken_keys,
    replay_with_unique_keys,
    version_1_tables,
);

mod replay_copies_queue_priority_and_key {
    #[tokio::test]
    async fn postgres() {
        super::replay_copies_queue_priority_and_key("postgres").await
    }
    #[tokio::test]
    async fn sqlite() {
        super::replay_copies_queue_priority_and_key("sqlite").await
    }
    #[tokio::test]
    async fn mysql() {
        super::replay_copies_queue_priority_and_key("mysql").await
    }
}

/// A queue name is 1 to 128 bytes of text without control characters, not only
/// whitespace: anything else is a usage error before anything is read or written.
#[tokio::test]
async fn bad_queue_names_are_usage_errors() {
    let db = seeded_queues("sqlite", "bad_queue_names").await;
    let before = fingerprint(&db).await;
    let long = "q".repeat(129);
    for bad in ["", "   ", "a\nb", "tab\there", long.as_str()] {
        for command in [
            &["pending"][..],
            &["list"],
            &["dead-letters", "list"],
            &["requeue", "--all-dead", "-y"],
            &["cancel", "-y"],
            &["purge", "--dead-letters", "-y"],
        ] {
            let mut args = command.to_vec();
            args.extend(["--queue", bad]);
            let err = fails(&db, &args, 2);
            assert!(err.contains("queue"), "{args:?}: {err}");
        }
    }
    // Not text at all (invalid UTF-8 on the command line).
    use std::os::unix::ffi::OsStrExt;
    let out = assert_cmd::Command::cargo_bin("icq")
        .unwrap()
        .args(["--database-url", db.url.as_str(), "pending", "--queue"])
        .arg(std::ffi::OsStr::from_bytes(b"q\xff"))
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // 128 bytes is the most a name may have.
    let longest = "q".repeat(128);
    assert_eq!(json_of(&db, &["pending", "--queue", &longest])[0]["due"], 0);
    assert_eq!(fingerprint(&db).await, before, "nothing changed");
}

#[tokio::test]
async fn queues_output() {
    let db = seeded_queues("sqlite", "snap_queues").await;
    let mut text = transcript(
        &db,
        &[
            &["pending", "--by-queue"],
            &["pending", "--by-queue", "--by-type", "--format", "table"],
            &["list", "--queue", "emails", "--format", "table"],
            &[
                "dead-letters",
                "list",
                "--queue",
                "emails",
                "--format",
                "table",
            ],
        ],
    );
    text.push_str(&transcript(&db, &[&["cancel", RUNNING, DUE, "-y"]]));
    snapshot!("queues", text);
}
