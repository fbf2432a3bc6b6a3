//! `icq schedules`: each configured schedule with its expression, zone, queue, type, last
//! occurrence (from the bookkeeping table) and next occurrence (from the database's
//! clock), as a table and as JSON; `icq work` records occurrences; a table older than
//! schema version 4 is an error naming the upgrade. On every engine, against real servers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chrono::{DateTime, Timelike, Utc};
use serde_json::Value;

use crate::support::{RUNTIME_ENGINES, TestDb};

fn config(dir: &Path, url: &str) -> PathBuf {
    let path = dir.join("icq.yaml");
    let text = format!(
        "sources:\n  - name: main\n    url: \"{url}\"\n    schedules:\n      \
         - name: nightly-report\n        cron: \"0 3 * * *\"\n        time_zone: Europe/Berlin\n        \
           type: reports.nightly\n        payload: {{ kind: full }}\n        queue: reports\n        \
           missed: once\n      \
         - name: ten\n        every: 10m\n        type: health.ping\n\
         handlers:\n  reports.nightly:\n    noop: true\n  health.ping:\n    noop: true\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn icq(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn listed(config: &Path) -> Vec<Value> {
    let out = icq(config, &["schedules", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out)));
    doc.as_array().expect("an array").clone()
}

fn time(value: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(value.as_str().unwrap_or_else(|| panic!("{value}")))
        .unwrap()
        .with_timezone(&Utc)
}

async fn lists_schedules_with_last_and_next(engine: &'static str) {
    let db = TestDb::with_table(engine, "schedules_cli").await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &db.url);

    let before = Utc::now();
    let rows = listed(&config);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let nightly = &rows[0];
    assert_eq!(nightly["source"], "main");
    assert_eq!(nightly["name"], "nightly-report");
    assert_eq!(nightly["expression"], "0 3 * * *");
    assert_eq!(nightly["time_zone"], "Europe/Berlin");
    assert_eq!(nightly["queue"], "reports");
    assert_eq!(nightly["type"], "reports.nightly");
    assert_eq!(nightly["missed"], "once");
    assert!(nightly["last_occurrence"].is_null(), "{nightly}");
    // 03:00 in Berlin is 01:00 or 02:00 UTC, within a day.
    let next = time(&nightly["next_occurrence"]);
    assert!(
        [1, 2].contains(&next.hour()) && next.minute() == 0,
        "{next}"
    );
    assert!(
        next > before && next - before <= chrono::Duration::hours(25),
        "{next}"
    );
    let ten = &rows[1];
    assert_eq!(ten["expression"], "every 10m");
    assert_eq!(ten["time_zone"], "UTC");
    assert_eq!(ten["queue"], "default");
    assert_eq!(ten["missed"], "skip");
    let next_ten = time(&ten["next_occurrence"]);
    assert_eq!(next_ten.timestamp() % 600, 0, "{next_ten}");

    // A drain ticks once: both schedules get their row and last occurrence.
    let out = icq(&config, &["work", "--until-idle"]);
    assert!(out.status.success(), "{}", text(&out));
    let rows = listed(&config);
    let last_ten = time(&rows[1]["last_occurrence"]);
    assert_eq!(
        time(&rows[1]["next_occurrence"]) - last_ten,
        chrono::Duration::minutes(10),
        "{rows:?}"
    );
    let last_nightly = time(&rows[0]["last_occurrence"]);
    assert!(last_nightly < next && next - last_nightly <= chrono::Duration::hours(25));

    // The table form names the columns.
    let out = icq(&config, &["schedules", "--format", "table"]);
    let shown = text(&out);
    for word in [
        "Name",
        "Expression",
        "Next occurrence",
        "nightly-report",
        "every 10m",
    ] {
        assert!(shown.contains(word), "{word}: {shown}");
    }
}

/// On a table of schema version 3, a configured schedule is an error naming the upgrade,
/// for `icq schedules` and for `icq work`.
async fn an_older_table_names_the_upgrade(engine: &'static str) {
    let db = TestDb::new(engine, "schedules_v3").await;
    let kind: icq::Engine = engine.parse().unwrap();
    let table = icq::TableName::default();
    db.execute(&icq::schema::render_v1(kind, &table).up).await;
    db.execute(&icq::schema::render_upgrade(kind, &table).up)
        .await;
    db.execute(&icq::schema::render_upgrade_v3(kind, &table).up)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &db.url);
    for args in [&["schedules"][..], &["work", "--until-idle"][..]] {
        let out = icq(&config, args);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        let shown = text(&out);
        assert!(
            shown.contains("is schema version 3; `schedules:` of source `main` needs version 4")
                && shown.contains("icq migrate add")
                && shown.contains("_icq_schema_v4.sql"),
            "{engine} {args:?}: {shown}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn schedules_lists_last_and_next_on_every_engine() {
    for engine in RUNTIME_ENGINES {
        lists_schedules_with_last_and_next(engine).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn schedules_on_an_older_table_name_the_upgrade_on_every_engine() {
    for engine in RUNTIME_ENGINES {
        an_older_table_names_the_upgrade(engine).await;
    }
}

/// A schedule taken out of the configuration schedules nothing more.
#[tokio::test(flavor = "multi_thread")]
async fn a_schedule_removed_from_the_config_stops() {
    let db = TestDb::with_table("sqlite", "schedules_removed").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("icq.yaml");
    let with = |schedules: &str| {
        format!(
            "sources:\n  - name: main\n    url: \"{}\"\n{schedules}handlers:\n  t.tick:\n    noop: true\n",
            db.url
        )
    };
    let count = || async {
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {} LIKE 'schedule:tick:%'",
            db.all_rows(),
            db.q("UniqueKey")
        ))
        .await
    };
    std::fs::write(
        &path,
        with("    schedules:\n      - { name: tick, every: 1s, type: t.tick }\n"),
    )
    .unwrap();
    let out = icq(&path, &["work", "--until-idle"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(count().await, 1);
    std::fs::write(&path, with("")).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let out = icq(&path, &["work", "--until-idle"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(count().await, 1, "a removed schedule scheduled again");
    let out = icq(&path, &["schedules"]);
    assert!(
        text(&out).contains("No schedules configured"),
        "{}",
        text(&out)
    );
}
