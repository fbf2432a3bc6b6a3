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

/// `icq schedule --unique-key KEY --format json`: the answer's id and `existing`.
fn schedule_keyed(db: &TestDb, key: &str) -> (String, bool) {
    let out = icq(
        db,
        &[
            "schedule",
            "--type",
            "invoices.send",
            "--payload",
            "{}",
            "--unique-key",
            key,
            "--format",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}: {key:?}: {}",
        db.engine,
        text(&out)
    );
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    (
        json["id"].as_str().unwrap().to_owned(),
        json["existing"].as_bool().unwrap(),
    )
}

/// `icq pending --by-queue --format json` (or another grouping): each line's name and
/// its (due, completed) counts.
fn counts(db: &TestDb, by: &str) -> Vec<(String, i64, i64)> {
    let out = icq(db, &["pending", by, "--format", "json"]);
    assert!(out.status.success(), "{}: {}", db.engine, text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let key = if by == "--by-queue" { "queue" } else { "type" };
    let mut lines: Vec<(String, i64, i64)> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l[key].as_str().unwrap().to_owned(),
                l["due"].as_i64().unwrap(),
                l["completed"].as_i64().unwrap(),
            )
        })
        .collect();
    lines.sort();
    lines
}

/// Rows of queue `emails ` (a trailing space) and of type `mail.send ` written by plain
/// SQL beside one of queue `emails`: a worker serving `emails` runs that one only, and
/// counts and filters keep every name apart.
async fn queues_differing_in_trailing_spaces_stay_apart(db: &TestDb) {
    let engine = db.engine;
    let (t, q) = (db.q("InternalCommands"), |c: &str| db.q(c));
    let insert = |ty: &str, queue: &str| {
        format!(
            "INSERT INTO {t} ({}, {}, {}) VALUES ('{ty}', '{{}}', '{queue}')",
            q("Type"),
            q("Payload"),
            q("Queue")
        )
    };
    db.execute(&insert("mail.send", "emails")).await;
    db.execute(&insert("mail.send", "emails ")).await;
    db.execute(&insert("mail.send", "emails ")).await;
    db.execute(&insert("mail.send ", "other")).await;

    let pending = |due_emails| {
        vec![
            ("emails".to_owned(), due_emails, 1 - due_emails),
            ("emails ".to_owned(), 2, 0),
            ("other".to_owned(), 1, 0),
        ]
    };
    assert_eq!(counts(db, "--by-queue"), pending(1), "{engine}");
    let out = icq(db, &["pending", "--queue", "emails", "--format", "json"]);
    assert!(out.status.success(), "{engine}: {}", text(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["due"], 1, "{engine}: {json}");
    assert_eq!(
        counts(db, "--by-type"),
        vec![
            ("mail.send".to_owned(), 3, 0),
            ("mail.send ".to_owned(), 1, 0)
        ],
        "{engine}"
    );

    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let config = dir.path().join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: main\n    url: \"{}\"\n    queues:\n      emails: {{ concurrency: 2 }}\n    \
             settings:\n      polling_interval_seconds: 0.1\nhandlers:\n  mail.send:\n    \
             exec: [\"sh\", \"-c\", \"echo $ICQ_COMMAND_ID >> {}\"]\n",
            db.url,
            ran.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{engine}: {}", text(&out));
    let lines = std::fs::read_to_string(&ran).unwrap_or_default();
    assert_eq!(lines.lines().count(), 1, "{engine}: ran {lines:?}");
    let done = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {} IS NOT NULL",
            db.rows_of_any_version().await,
            q("ProcessedAt")
        ))
        .await;
    assert_eq!(done, 1, "{engine}: only the row of queue `emails` ran");
    assert_eq!(counts(db, "--by-queue"), pending(0), "{engine}");
}

/// Unique keys, queues and types compare byte for byte on every engine: two keys that
/// differ only in trailing spaces make two rows (each found again by its own key), and
/// queues and types that do are kept apart by workers, counts and filters.
pub async fn keys_and_queues_differing_in_trailing_spaces_stay_apart(engine: &'static str) {
    let db = TestDb::with_table(engine, "cli_pad").await;
    let (first, existing) = schedule_keyed(&db, "invoice-42");
    assert!(!existing, "{engine}");
    let (second, existing) = schedule_keyed(&db, "invoice-42 ");
    assert!(
        !existing,
        "{engine}: `invoice-42 ` found `invoice-42`'s row"
    );
    assert_ne!(first, second, "{engine}");
    assert_eq!(
        schedule_keyed(&db, "invoice-42 "),
        (second, true),
        "{engine}"
    );
    assert_eq!(schedule_keyed(&db, "invoice-42"), (first, true), "{engine}");
    let rows = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {}",
            db.q("InternalCommands")
        ))
        .await;
    assert_eq!(rows, 2, "{engine}");
    db.execute(&format!("DELETE FROM {}", db.q("InternalCommands")))
        .await;
    queues_differing_in_trailing_spaces_stay_apart(&db).await;
}

/// The MariaDB/MySQL table as the first version-2 migration created it (before keys
/// and queues compared byte for byte): its generated columns are `utf8mb4_bin`, which
/// ignores trailing spaces. Tables made by it are in use and keep working.
const MYSQL_V2_PAD_SPACE_TABLE: &str = "CREATE TABLE `InternalCommands` (
    `Id`             CHAR(36)     NOT NULL DEFAULT (UUID()),
    `Type`           VARCHAR(255) NOT NULL,
    `Payload`        JSON         NOT NULL,
    `CreatedAt`      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    `RunAt`          DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    `Attempts`       INT          NOT NULL DEFAULT 0,
    `LockToken`      CHAR(36)     NULL,
    `LockedUntil`    DATETIME(6)  NULL,
    `ProcessedAt`    DATETIME(6)  NULL,
    `DeadLetteredAt` DATETIME(6)  NULL,
    `LastError`      TEXT         NULL,
    `UserId`         VARCHAR(255) NULL,
    `Roles`          TEXT         NULL,
    `TenantId`       VARCHAR(255) NULL,
    `CorrelationId`  VARCHAR(255) NULL,
    `Queue`          VARCHAR(128) NOT NULL DEFAULT 'default',
    `Priority`       SMALLINT     NOT NULL DEFAULT 0,
    `UniqueKey`      VARCHAR(255) NULL,
    `TraceParent`    VARCHAR(255) NULL,
    `Snoozes`        INT          NOT NULL DEFAULT 0,
    `PendingUniqueKey` VARCHAR(255) AS (IF(`ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL, `UniqueKey`, NULL)) STORED,
    `PollQueue` VARCHAR(128) AS (IF(`ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL AND `Queue` <> 'default', `Queue`, NULL)) STORED,
    PRIMARY KEY (`Id`),
    INDEX `IX_InternalCommands_Poll` (`ProcessedAt`, `DeadLetteredAt`, `Priority`, `RunAt`),
    INDEX `IX_InternalCommands_QueuePoll` (`PollQueue`, `Priority`, `RunAt`),
    UNIQUE INDEX `IX_InternalCommands_UniqueKey` (`PendingUniqueKey`),
    INDEX `IX_InternalCommands_Retention` (`ProcessedAt`),
    INDEX `IX_InternalCommands_DeadLetters` (`DeadLetteredAt`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;";

/// On a MariaDB table made by the earlier version-2 migration, whose indexes ignore
/// trailing spaces: workers, counts and filters still keep `emails` and `emails ` apart;
/// a unique key that collides with another only through that padding is refused (never
/// answered with the other key's row), naming the statement that fixes the table, and
/// after that statement both keys are scheduled.
pub async fn a_pad_space_mysql_table_keeps_names_apart_and_names_its_fix() {
    let db = TestDb::new("mysql", "cli_padold").await;
    db.execute(MYSQL_V2_PAD_SPACE_TABLE).await;
    queues_differing_in_trailing_spaces_stay_apart(&db).await;
    db.execute("DELETE FROM `InternalCommands`").await;

    let (first, existing) = schedule_keyed(&db, "invoice-42");
    assert!(!existing);
    let out = icq(
        &db,
        &[
            "schedule",
            "--type",
            "invoices.send",
            "--payload",
            "{}",
            "--unique-key",
            "invoice-42 ",
        ],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&first) && said.contains("trailing spaces") && said.contains("ALTER TABLE"),
        "{said}"
    );
    assert!(!said.contains("Already scheduled"), "{said}");
    let rows = db
        .scalar_i64("SELECT COUNT(*) FROM `InternalCommands`")
        .await;
    assert_eq!(rows, 1, "nothing was scheduled");

    // The statement the message names makes the table compare bytes.
    let start = said.find("ALTER TABLE").unwrap();
    let end = start + said[start..].find(';').unwrap();
    db.execute(&said[start..=end]).await;
    let (second, existing) = schedule_keyed(&db, "invoice-42 ");
    assert!(!existing, "after the fix");
    assert_ne!(first, second);
    assert_eq!(schedule_keyed(&db, "invoice-42"), (first, true));
    db.execute("DELETE FROM `InternalCommands`").await;
    queues_differing_in_trailing_spaces_stay_apart(&db).await;
}
