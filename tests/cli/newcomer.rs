//! What a new user ran into with the operator commands: an id that cannot be one, a
//! listing that ignored priorities, a secret URL parameter warned about by `work` only,
//! and messages that did not say what was wrong or what to write instead. Each is run as
//! a process, on every engine where the behaviour depends on the engine.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{RUNTIME_ENGINES, TestDb};

/// What one run of `icq` did.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `icq args…` with a private HOME and no ambient configuration.
fn icq(args: &[&str]) -> Run {
    let home = tempfile::tempdir().unwrap();
    icq_in(home.path(), args)
}

fn icq_in(home: &Path, args: &[&str]) -> Run {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(args)
        .current_dir(home)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home)
        .env("XDG_DATA_HOME", home)
        .env("NO_COLOR", "1")
        .env("COLUMNS", "200")
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `icq --database-url URL args…`.
fn on(db: &TestDb, args: &[&str]) -> Run {
    let mut all = vec!["--database-url", db.url.as_str()];
    all.extend_from_slice(args);
    icq(&all)
}

/// Runs a command that must succeed with `--format json`; its document.
fn json_of(db: &TestDb, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--format", "json"]);
    let run = on(db, &all);
    assert_eq!(run.code, 0, "icq {args:?}: {}", run.stderr);
    serde_json::from_str(&run.stdout).unwrap()
}

/// Schedules one command; its id.
fn schedule(db: &TestDb, args: &[&str]) -> String {
    let mut all = vec!["schedule", "--payload", "{}"];
    all.extend_from_slice(args);
    json_of(db, &all)["id"].as_str().unwrap().to_owned()
}

/// An id no row of a PostgreSQL table can have is a usage error (2), like any malformed
/// value, on show, dead-letters show, cancel, requeue, replay and `list --after`; on
/// MariaDB an id longer than its `CHAR(36)` is; on SQLite any text is an id, so only a
/// missing one, exit 3. A well-formed id that is absent is 3 everywhere.
#[tokio::test]
async fn an_id_that_cannot_exist_is_a_usage_error_on_every_engine() {
    let long = "x".repeat(40);
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "newcomer_ids").await;
        let (malformed, possible): (Vec<&str>, Vec<&str>) = match engine {
            "postgres" => (vec!["not-a-uuid", &long], vec![]),
            "mysql" => (vec![&long], vec!["not-a-uuid"]),
            _ => (vec![], vec!["not-a-uuid", &long]),
        };
        let absent = "0b5e3c1e-8f0a-4c1e-9d0e-2f3a4b5c6d7e";
        for id in malformed
            .iter()
            .map(|id| (*id, 2))
            .chain(possible.iter().map(|id| (*id, 3)))
            .chain([(absent, 3)])
        {
            let (id, code) = id;
            for args in [
                vec!["show", id],
                vec!["dead-letters", "show", id],
                vec!["cancel", id, "--yes"],
                vec!["requeue", id, "--yes"],
                vec!["replay", id],
                vec!["list", "--after", id],
            ] {
                let run = on(&db, &args);
                assert_eq!(run.code, code, "{engine} {args:?}: {}", run.stderr);
                if code == 2 {
                    assert!(
                        run.stderr.contains("is not a command id")
                            && run.stderr.contains("0b5e3c1e-8f0a-4c1e-9d0e-2f3a4b5c6d7e"),
                        "{engine} {args:?}: {}",
                        run.stderr
                    );
                }
            }
        }
        // `--format json` says `usage`.
        if let Some(id) = malformed.first() {
            let run = on(&db, &["show", id, "--format", "json"]);
            let doc: Value = serde_json::from_str(run.stderr.trim()).unwrap();
            assert_eq!(doc["error"]["kind"], "usage", "{engine}");
        }
    }
}

/// The ids of every page of the listing `args`, each page joined to the next with
/// `--after`; more than `most` ids (a page repeating itself) fails the test.
fn every_page(db: &TestDb, args: &[&str], most: usize) -> Vec<String> {
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut all = args.to_vec();
        if let Some(after) = &after {
            all.extend(["--after", after.as_str()]);
        }
        let page = json_of(db, &all);
        for command in page["commands"].as_array().unwrap() {
            seen.push(command["id"].as_str().unwrap().to_owned());
        }
        assert!(seen.len() <= most, "{} {args:?}: {seen:?}", db.engine);
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return seen,
        }
    }
}

/// An id no configured source can hold names each engine's id shape once, however many
/// sources of that engine are configured (PostgreSQL, MariaDB, PostgreSQL).
#[tokio::test]
async fn a_malformed_id_names_each_engines_id_shape_once() {
    let pg = TestDb::with_table("postgres", "newcomer_ids_pg").await;
    let my = TestDb::with_table("mysql", "newcomer_ids_my").await;
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("icq.yaml");
    std::fs::write(
        &file,
        format!(
            "sources:\n  - name: a\n    url: {}\n  - name: b\n    url: {}\n  - name: c\n    \
             url: {}\n",
            pg.url, my.url, pg.url
        ),
    )
    .unwrap();
    let long = "x".repeat(40);
    let run = icq_in(
        home.path(),
        &["--config", file.to_str().unwrap(), "show", &long],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert_eq!(run.stderr.matches("are UUIDs").count(), 1, "{}", run.stderr);
    assert_eq!(
        run.stderr.matches("at most 36 characters").count(),
        1,
        "{}",
        run.stderr
    );
}

/// `icq list` (pending, the default) and `--state due` list in claim order: priority,
/// then run at, then id; pages of two joined with `--after` give every row once, in that
/// order, on every engine.
#[tokio::test]
async fn pending_listing_is_in_claim_order_across_pages() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "newcomer_order").await;
        // (priority, run at): two share a run at and a priority (the id decides).
        let rows = [
            (5, "2026-01-01T00:00:01Z"),
            (-3, "2026-01-01T00:00:05Z"),
            (0, "2026-01-01T00:00:02Z"),
            (5, "2026-01-01T00:00:00Z"),
            (-3, "2026-01-01T00:00:03Z"),
            (0, "2026-01-01T00:00:02Z"),
            (7, "2026-01-01T00:00:00Z"),
        ];
        let mut expected: Vec<(i64, String, String)> = rows
            .iter()
            .map(|(priority, at)| {
                let p = priority.to_string();
                let id = schedule(&db, &["--type", "t", "--priority", &p, "--at", at]);
                (*priority, at.to_string(), id)
            })
            .collect();
        expected.sort();
        let ids: Vec<String> = expected.iter().map(|(_, _, id)| id.clone()).collect();
        for state in ["pending", "due"] {
            let seen = every_page(&db, &["list", "--state", state, "--limit", "2"], ids.len());
            // Ids compare as the engine sorts them (lower-case UUIDs: byte order).
            assert_eq!(seen, ids, "{engine} {state}: {expected:?}");
        }
    }
}

/// Pages of every size give every pending row once, in claim order, when many rows tie
/// on priority and run at, priorities sit at both ends of their range and run ats lie
/// beyond 2038 (a bound instant MariaDB compares as a `TIMESTAMP` would end there); and
/// `--before` a far instant keeps those rows.
#[tokio::test]
async fn pending_pages_of_any_size_give_every_row_once_with_ties_and_far_run_ats() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rows.jsonl");
    let priorities = [-32768, -1, 0, 32767];
    let run_ats = [
        "2020-01-01T00:00:00Z",
        "2099-01-01T00:00:00Z",
        "2099-01-01T00:00:00.001Z",
    ];
    let mut lines = String::new();
    let mut keys = Vec::new();
    for copy in 0..2 {
        for priority in priorities {
            for at in run_ats {
                lines.push_str(&format!(
                    "{{\"type\":\"t\",\"payload\":{{}},\"run_at\":\"{at}\",\"priority\":{priority}}}\n"
                ));
                let micros = chrono::DateTime::parse_from_rfc3339(at)
                    .unwrap()
                    .timestamp_micros();
                keys.push((priority, micros, copy));
            }
        }
    }
    std::fs::write(&file, lines).unwrap();
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "newcomer_far").await;
        let doc = json_of(&db, &["schedule", "--from-file", file.to_str().unwrap()]);
        let ids: Vec<String> = doc["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_str().unwrap().to_owned())
            .collect();
        let mut expected: Vec<(i32, i64, String)> = keys
            .iter()
            .zip(&ids)
            .map(|((priority, micros, _), id)| (*priority, *micros, id.clone()))
            .collect();
        expected.sort();
        let expected: Vec<String> = expected.into_iter().map(|(_, _, id)| id).collect();
        for limit in ["1", "2", "5", "100"] {
            let seen = every_page(&db, &["list", "--limit", limit], expected.len());
            assert_eq!(seen, expected, "{engine} pages of {limit}");
        }
        let before = json_of(
            &db,
            &["list", "--limit", "100", "--before", "2100-01-01T00:00:00Z"],
        );
        assert_eq!(
            before["commands"].as_array().unwrap().len(),
            expected.len(),
            "{engine} --before 2100"
        );
    }
}

/// A queue whose name ends in a space (written by another program, or by an icq that
/// took such names) is a queue an operator can still name in a filter: `schedule`
/// refuses the name, but `list`, `pending`, `cancel`, `dead-letters list` and `purge`
/// with `--queue 'emails '` act on exactly its rows, byte for byte, never on `emails`'s.
#[tokio::test]
async fn operator_filters_name_a_queue_that_ends_in_a_space() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "newcomer_edge_filter").await;
        let t = db.q("InternalCommands");
        let (ty, queue, payload) = (db.q("Type"), db.q("Queue"), db.q("Payload"));
        db.execute(&format!(
            "INSERT INTO {t} ({ty}, {queue}, {payload}) VALUES \
             ('t', 'emails ', '{{}}'), ('t', 'emails', '{{}}')"
        ))
        .await;
        let listed = json_of(&db, &["list", "--queue", "emails "]);
        let queues: Vec<&str> = listed["commands"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["queue"].as_str().unwrap())
            .collect();
        assert_eq!(queues, ["emails "], "{engine}: {listed}");
        let pending = json_of(&db, &["pending", "--by-queue", "--queue", "emails "]);
        assert!(
            pending.to_string().contains("\"emails \""),
            "{engine}: {pending}"
        );
        let run = on(&db, &["cancel", "--queue", "emails ", "-y"]);
        assert_eq!(run.code, 0, "{engine}: {}", run.stderr);
        assert!(
            run.stdout.contains("Cancelled 1 command"),
            "{engine}: {}",
            run.stdout
        );
        let dead = json_of(&db, &["dead-letters", "list", "--queue", "emails "]);
        assert_eq!(
            dead.to_string().matches("\"emails \"").count(),
            1,
            "{engine}: {dead}"
        );
        let run = on(
            &db,
            &[
                "purge",
                "--dead-letters",
                "--queue",
                "emails ",
                "--older-than",
                "0s",
                "-y",
            ],
        );
        assert_eq!(run.code, 0, "{engine}: {}", run.stderr);
        let left = json_of(&db, &["list", "--queue", "emails"]);
        assert_eq!(
            left["commands"].as_array().unwrap().len(),
            1,
            "{engine}: {left}"
        );
        let gone = json_of(&db, &["list", "--state", "dead", "--queue", "emails "]);
        assert_eq!(
            gone["commands"].as_array().unwrap().len(),
            0,
            "{engine}: {gone}"
        );
    }
}

/// `?PassWord=` (which sqlx would log with its value) is dropped with a warning naming
/// it, in every command that opens a source, not only `icq work`; never its value.
#[tokio::test]
async fn a_secret_url_parameter_is_warned_about_by_every_command() {
    let db = TestDb::with_table("postgres", "newcomer_password").await;
    let url = format!("{}?PassWord=sekrit-value", db.url);
    let dir = tempfile::tempdir().unwrap();
    let migrations = dir.path().join("migrations");
    for args in [
        vec!["pending"],
        vec!["list"],
        vec!["dead-letters", "list"],
        vec!["show", "0b5e3c1e-8f0a-4c1e-9d0e-2f3a4b5c6d7e"],
        vec!["schedule", "--type", "t", "--payload", "{}"],
        vec!["pending", "--format", "json"],
        vec!["migrate", "info", "--dir", migrations.to_str().unwrap()],
    ] {
        std::fs::create_dir_all(&migrations).unwrap();
        let mut all = vec!["--database-url", url.as_str()];
        all.extend_from_slice(&args);
        let run = icq(&all);
        assert!(
            run.stderr.contains("ignoring the connect parameter")
                && run.stderr.contains("PassWord"),
            "{args:?}: {} {}",
            run.code,
            run.stderr
        );
        assert!(
            !run.stderr.contains("sekrit") && !run.stdout.contains("sekrit"),
            "{args:?}: {}",
            run.stderr
        );
    }
}

/// `cancel --type` off a terminal refuses naming the action, not the terminal prompt
/// pasted in ("…in default? They will not run. without confirmation").
#[tokio::test]
async fn a_refused_confirmation_names_the_action_only() {
    let db = TestDb::with_table("sqlite", "newcomer_confirm").await;
    schedule(&db, &["--type", "reports.nightly"]);
    let run = on(&db, &["cancel", "--type", "reports.nightly"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "refusing to cancel 1 pending command of type reports.nightly in source default \
             without confirmation"
        ),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("will not run"), "{}", run.stderr);
    assert!(!run.stderr.contains('?'), "{}", run.stderr);
}

/// A MySQL URL on a PostgreSQL server's port fails within seconds naming the mismatch,
/// not after the pool's 10 s with "pool timed out".
#[tokio::test]
async fn a_mysql_url_on_a_postgres_port_says_so_at_once() {
    let pg = TestDb::new("postgres", "newcomer_mismatch").await;
    let port = url::Url::parse(&pg.url).unwrap().port().unwrap_or(5432);
    let host = url::Url::parse(&pg.url)
        .unwrap()
        .host_str()
        .unwrap()
        .to_owned();
    let mysql = format!("mysql://root@{host}:{port}/test");
    let started = Instant::now();
    let run = icq(&["--database-url", &mysql, "pending"]);
    let took = started.elapsed();
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("answers as PostgreSQL, not MySQL/MariaDB")
            && run.stderr.contains("postgres://"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("timed out"), "{}", run.stderr);
    assert!(took < Duration::from_secs(6), "took {took:?}");
}

/// A PostgreSQL URL on a MariaDB server's port names the mismatch, not "unexpected
/// response from SSLRequest".
#[tokio::test]
async fn a_postgres_url_on_a_mysql_port_says_so() {
    let my = TestDb::new("mysql", "newcomer_mismatch_pg").await;
    let parsed = url::Url::parse(&my.url).unwrap();
    let port = parsed.port().unwrap_or(3306);
    let host = parsed.host_str().unwrap();
    let postgres = format!("postgres://postgres@{host}:{port}/test");
    let run = icq(&["--database-url", &postgres, "pending"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("answers as MySQL/MariaDB, not PostgreSQL")
            && run.stderr.contains("mysql://"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("SSLRequest"), "{}", run.stderr);
}

/// A `--from-file` line's `priority` that is no whole number says what a priority is, not
/// "expected i64"; `null` is still no priority.
#[tokio::test]
async fn a_jsonl_priority_says_what_a_priority_is() {
    let db = TestDb::with_table("sqlite", "newcomer_jsonl_priority").await;
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs.jsonl");
    for priority in ["1.5", "\"high\"", "1e300"] {
        std::fs::write(
            &jobs,
            format!("{{\"type\": \"t\", \"payload\": {{}}, \"priority\": {priority}}}\n"),
        )
        .unwrap();
        let run = on(&db, &["schedule", "--from-file", jobs.to_str().unwrap()]);
        assert_eq!(run.code, 2, "{priority}: {}", run.stderr);
        assert!(
            run.stderr
                .contains("expected a whole number from -32768 to 32767 (lower runs first)"),
            "{priority}: {}",
            run.stderr
        );
        assert!(!run.stderr.contains("i64"), "{}", run.stderr);
    }
    std::fs::write(
        &jobs,
        "{\"type\": \"t\", \"payload\": {}, \"priority\": null}\n",
    )
    .unwrap();
    let run = on(&db, &["schedule", "--from-file", jobs.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// `?sslmode=bogus` names the parameter and the values the driver takes, once, on
/// PostgreSQL and MariaDB; it is not blamed on the host.
#[tokio::test]
async fn an_unknown_tls_mode_names_the_parameter_and_its_values() {
    for (engine, name, takes) in [
        (
            "postgres",
            "sslmode",
            "disable, allow, prefer, require, verify-ca, verify-full",
        ),
        (
            "mysql",
            "ssl-mode",
            "disabled, preferred, required, verify_ca, verify_identity",
        ),
    ] {
        let db = TestDb::with_table(engine, "newcomer_tls").await;
        let url = format!("{}?{name}=bogus", db.url);
        let run = icq(&["--database-url", &url, "pending"]);
        assert_eq!(run.code, 2, "{engine}: {}", run.stderr);
        assert!(
            run.stderr.contains(&format!(
                "`{name}=bogus` is not a TLS mode: it takes {takes}"
            )),
            "{engine}: {}",
            run.stderr
        );
        assert!(
            !run.stderr.contains("error with configuration"),
            "{}",
            run.stderr
        );
        assert!(!run.stderr.contains("host `"), "{}", run.stderr);
        // A mode the driver takes, in any case, still connects.
        let upper = if engine == "postgres" {
            "DISABLE"
        } else {
            "DISABLED"
        };
        let good = format!("{}?{name}={upper}", db.url);
        let run = icq(&["--database-url", &good, "pending"]);
        assert_eq!(run.code, 0, "{engine}: {}", run.stderr);
    }
}

/// `--priority`, `--limit` and `--target-version` say what they take, not "invalid digit
/// found in string"; both listings' `--limit` state one range in one message.
#[test]
fn whole_number_flags_say_their_range() {
    let url = "sqlite:nothing.db";
    for value in ["1.5", "high", "1e300", "40000"] {
        let run = icq(&[
            "--database-url",
            url,
            "schedule",
            "--type",
            "t",
            "--payload",
            "{}",
            "--priority",
            value,
        ]);
        assert_eq!(run.code, 2, "{value}: {}", run.stderr);
        assert!(
            run.stderr
                .contains("a whole number from -32768 to 32767, e.g. --priority -5"),
            "{value}: {}",
            run.stderr
        );
        assert!(!run.stderr.contains("invalid digit"), "{}", run.stderr);
    }
    let limits: Vec<String> = [
        &["list", "--limit", "0"][..],
        &["dead-letters", "list", "--limit", "0"],
        &["list", "--limit", "10001"],
        &["dead-letters", "list", "--limit", "99999999999"],
    ]
    .iter()
    .map(|args| {
        let mut all = vec!["--database-url", url];
        all.extend_from_slice(args);
        let run = icq(&all);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        let line = run.stderr.lines().next().unwrap().to_owned();
        assert!(
            line.contains("a page size is a whole number from 1 to 10000"),
            "{args:?}: {line}"
        );
        line.split_once("': ").unwrap().1.to_owned()
    })
    .collect();
    assert_eq!(limits[0], limits[1], "one rule, one message");
    for target in ["latest", "1.5"] {
        let run = icq(&[
            "migrate",
            "run",
            "--database-url",
            url,
            "--target-version",
            target,
        ]);
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert!(
            run.stderr.contains("not a migration version")
                && run.stderr.contains("--target-version 20260131120000"),
            "{}",
            run.stderr
        );
    }
}

/// A handler's `timeout_seconds: 10s` says to write a number of seconds (here: 10), not
/// "expected f64"; a huge number is echoed short.
#[test]
fn timeout_seconds_messages_say_what_to_write() {
    let home = tempfile::tempdir().unwrap();
    let check = |timeout: &str| {
        let file = home.path().join("icq.yaml");
        std::fs::write(
            &file,
            format!(
                "sources:\n  - name: a\n    url: sqlite:a.db\nhandlers:\n  t: {{ noop: true, \
                 timeout_seconds: {timeout} }}\n"
            ),
        )
        .unwrap();
        icq_in(
            home.path(),
            &["config", "check", "--config", file.to_str().unwrap()],
        )
    };
    let run = check("10s");
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("`timeout_seconds` is a number of seconds")
            && run.stderr.contains("write `timeout_seconds: 10`"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("f64"), "{}", run.stderr);
    let run = check("2m");
    assert!(
        run.stderr.contains("write `timeout_seconds: 120`"),
        "{}",
        run.stderr
    );
    let run = check("1e300");
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("(1e300)"), "{}", run.stderr);
    assert!(run.stderr.len() < 300, "{}", run.stderr);
    assert!(run.stderr.contains("e.g. 10 or 2.5"), "{}", run.stderr);
    let run = check("2.5");
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// Type and queue names with white space at either end are refused where icq takes them
/// (`schedule --type/--queue`, `--from-file`, `queues:` and `handlers:` keys) with what to
/// write; white space inside a name is kept. A row another program inserted with such a
/// name is not refused by the operator commands: it is listed as it is.
#[tokio::test]
async fn names_with_white_space_at_an_end_are_refused() {
    let db = TestDb::with_table("sqlite", "newcomer_names").await;
    for args in [
        &["--type", " orders.receipt"][..],
        &["--type", "orders.receipt "],
        &["--type", "t", "--queue", "emails "],
        &["--type", "t", "--queue", " emails"],
    ] {
        let mut all = vec!["schedule", "--payload", "{}"];
        all.extend_from_slice(args);
        let run = on(&db, &all);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains("begins or ends with white space")
                && run.stderr.contains("write it without"),
            "{args:?}: {}",
            run.stderr
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs.jsonl");
    for line in [
        r#"{"type": "t ", "payload": {}}"#,
        r#"{"type": "t", "queue": " q", "payload": {}}"#,
    ] {
        std::fs::write(
            &jobs,
            format!("{{\"type\": \"ok\", \"payload\": {{}}}}\n{line}\n"),
        )
        .unwrap();
        let run = on(&db, &["schedule", "--from-file", jobs.to_str().unwrap()]);
        assert_eq!(run.code, 2, "{line}: {}", run.stderr);
        assert!(
            run.stderr.contains(":2:") && run.stderr.contains("begins or ends with white space"),
            "{line}: {}",
            run.stderr
        );
    }
    assert_eq!(
        json_of(&db, &["pending"])[0]["due"],
        0,
        "nothing was scheduled"
    );
    // Inside a name, white space is kept as written.
    schedule(&db, &["--type", "reports eu", "--queue", "reports (eu)"]);
    // A row inserted by plain SQL with a padded name is listed, not refused.
    db.execute(&format!(
        "INSERT INTO {} ({}, {}) VALUES ('padded ', '{{}}')",
        db.q("InternalCommands"),
        db.q("Type"),
        db.q("Payload")
    ))
    .await;
    let listed = json_of(&db, &["list"]);
    let types: Vec<&str> = listed["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert!(
        types.contains(&"padded ") && types.contains(&"reports eu"),
        "{types:?}"
    );
    for yaml in [
        "sources:\n  - name: a\n    url: sqlite:a.db\n    queues:\n      'emails ': {}\n",
        "sources:\n  - name: a\n    url: sqlite:a.db\nhandlers:\n  ' orders.receipt': { noop: true }\n",
    ] {
        let file = dir.path().join("icq.yaml");
        std::fs::write(&file, yaml).unwrap();
        let run = icq_in(
            dir.path(),
            &["config", "check", "--config", file.to_str().unwrap()],
        );
        assert_eq!(run.code, 2, "{yaml}: {}", run.stderr);
        assert!(
            run.stderr.contains("begins or ends with white space")
                && run.stderr.contains("write it without"),
            "{yaml}: {}",
            run.stderr
        );
    }
}

/// A completed command whose earlier attempt failed: the tables of `show` and `list` say
/// the error came before it completed; JSON keeps `last_error` as stored, beside `state`.
#[tokio::test]
async fn a_completed_command_says_its_last_error_came_before() {
    let db = TestDb::with_table("sqlite", "newcomer_earlier").await;
    let id = schedule(&db, &["--type", "webhooks.deliver"]);
    db.execute(&format!(
        "UPDATE {} SET {} = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), {} = 'HTTP 503', {} = 2",
        db.q("InternalCommands"),
        db.q("ProcessedAt"),
        db.q("LastError"),
        db.q("Attempts")
    ))
    .await;
    for args in [
        vec!["show", id.as_str(), "--format", "table"],
        vec!["dead-letters", "show", id.as_str(), "--format", "table"],
        vec!["list", "--state", "completed", "--format", "table"],
    ] {
        let run = on(&db, &args);
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(
            run.stdout.contains("(before it completed) HTTP 503"),
            "{args:?}: {}",
            run.stdout
        );
    }
    let shown = json_of(&db, &["show", &id]);
    assert_eq!(shown["last_error"], "HTTP 503");
    assert_eq!(shown["state"], "completed");
    // A dead letter's last error is its outcome: shown as it is.
    db.execute(&format!(
        "UPDATE {} SET {} = NULL, {} = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        db.q("InternalCommands"),
        db.q("ProcessedAt"),
        db.q("DeadLetteredAt")
    ))
    .await;
    let run = on(&db, &["show", &id, "--format", "table"]);
    assert!(
        !run.stdout.contains("before it completed"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("HTTP 503"), "{}", run.stdout);
}
