//! Unique keys and the other schedule fields of schema version 2 through the command
//! line (`icq schedule --queue --priority --unique-key`), on every engine.

use std::process::{Command, Output, Stdio};

use crate::support::TestDb;

fn icq(db: &TestDb, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .arg("--database-url")
        .arg(&db.url)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run icq")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Eight `icq schedule` processes started together with one unique key: one row; one of
/// them says it scheduled it, the other seven print its id with `"existing": true`.
pub async fn eight_schedule_processes_with_one_key_create_one_row(engine: &'static str) {
    let db = TestDb::with_table(engine, "cli_uniq").await;
    let children: Vec<_> = (0..8)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_icq"))
                .arg("--database-url")
                .arg(&db.url)
                .args([
                    "schedule",
                    "--type",
                    "reports.daily",
                    "--payload",
                    "{}",
                    "--queue",
                    "reports",
                    "--priority",
                    "-2",
                    "--unique-key",
                    "reports.daily:2030-01-01",
                    "--format",
                    "json",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start icq")
        })
        .collect();
    let mut answers = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("icq schedule");
        assert!(out.status.success(), "{engine}: {}", text(&out));
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
        answers.push(json);
    }
    let new: Vec<_> = answers.iter().filter(|a| a["existing"] == false).collect();
    assert_eq!(new.len(), 1, "{engine}: {answers:?}");
    assert!(
        answers.iter().all(|a| a["id"] == new[0]["id"]),
        "{engine}: {answers:?}"
    );
    let rows = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {} = 'reports.daily:2030-01-01' AND {} = 'reports' AND {} = -2",
            db.q("InternalCommands"),
            db.q("UniqueKey"),
            db.q("Queue"),
            db.q("Priority")
        ))
        .await;
    assert_eq!(rows, 1, "{engine}");

    // The table output says the row existed.
    let out = icq(
        &db,
        &[
            "schedule",
            "--type",
            "reports.daily",
            "--payload",
            "{}",
            "--unique-key",
            "reports.daily:2030-01-01",
        ],
    );
    assert!(out.status.success(), "{engine}: {}", text(&out));
    let said = text(&out);
    assert!(
        said.starts_with("Already scheduled: pending command ") && said.contains("unique key"),
        "{engine}: {said}"
    );
}

/// Bad values are usage errors (exit 2) naming the flag, or the line and field of a
/// `--from-file` document, before any row is written; a version-1 table refuses a queue
/// naming the upgrade and still takes a plain schedule.
pub async fn bad_values_and_version_1_tables_are_refused_with_the_reason(engine: &'static str) {
    let db = TestDb::with_table(engine, "cli_bad").await;
    let base = ["schedule", "--type", "t", "--payload", "{}"];
    for (flag, value) in [
        ("--priority", "40000"),
        ("--priority", "x"),
        ("--queue", ""),
        ("--queue", "a\nb"),
        ("--unique-key", ""),
    ] {
        let mut args = base.to_vec();
        args.extend([flag, value]);
        let out = icq(&db, &args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{engine} {flag} {value:?}: {}",
            text(&out)
        );
        assert!(text(&out).contains(flag), "{engine} {flag}: {}", text(&out));
    }
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs.jsonl");
    std::fs::write(
        &jobs,
        "{\"type\":\"a\",\"payload\":1,\"queue\":\"q\",\"unique_key\":\"k1\"}\n\
         {\"type\":\"a\",\"payload\":1,\"priority\":99999}\n",
    )
    .unwrap();
    let out = icq(&db, &["schedule", "--from-file", jobs.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{engine}: {}", text(&out));
    assert!(
        text(&out).contains("jobs.jsonl:2: field `priority`"),
        "{engine}: {}",
        text(&out)
    );
    let count = format!("SELECT COUNT(*) FROM {}", db.q("InternalCommands"));
    assert_eq!(
        db.scalar_i64(&count).await,
        0,
        "{engine}: nothing scheduled"
    );

    // --from-file with a repeated key: JSON says which lines found their row.
    std::fs::write(
        &jobs,
        "{\"type\":\"a\",\"payload\":1,\"unique_key\":\"k1\"}\n\
         {\"type\":\"a\",\"payload\":2,\"unique_key\":\"k1\"}\n\
         {\"type\":\"a\",\"payload\":3,\"queue\":\"q\",\"priority\":-1}\n",
    )
    .unwrap();
    let out = icq(
        &db,
        &[
            "schedule",
            "--from-file",
            jobs.to_str().unwrap(),
            "--format",
            "json",
        ],
    );
    assert!(out.status.success(), "{engine}: {}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json["existing"],
        serde_json::json!([false, true, false]),
        "{engine}"
    );
    assert_eq!(json["ids"][0], json["ids"][1], "{engine}");
    assert_eq!(db.scalar_i64(&count).await, 2, "{engine}");

    // A version-1 table.
    let v1 = TestDb::new(engine, "cli_v1").await;
    let kind: icq::Engine = engine.parse().unwrap();
    v1.execute(&icq::schema::render_v1(kind, &icq::TableName::default()).up)
        .await;
    let out = icq(
        &v1,
        &["schedule", "--type", "t", "--payload", "{}", "--queue", "a"],
    );
    assert_eq!(out.status.code(), Some(2), "{engine}: {}", text(&out));
    assert!(
        text(&out).contains("is schema version 1") && text(&out).contains("icq migrate add"),
        "{engine}: {}",
        text(&out)
    );
    let out = icq(&v1, &["schedule", "--type", "t", "--payload", "{}"]);
    assert!(out.status.success(), "{engine}: {}", text(&out));
}
