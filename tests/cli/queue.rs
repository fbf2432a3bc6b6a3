//! `icq queue pause|resume|list` and `icq pending --by-queue` showing a pause, on every
//! engine: JSON for scripts, the state stored where every replica reads it, and a clear
//! refusal of a bad queue name.

use std::process::{Command, Output};

use serde_json::Value;

use crate::support::{RUNTIME_ENGINES, TestDb};

fn icq(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(args)
        .args(["--database-url", url, "--format", "json"])
        .output()
        .unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[tokio::test]
async fn pause_list_resume_on_every_engine() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "queuecli").await;
        let (t, ty, p, q) = (
            db.q("InternalCommands"),
            db.q("Type"),
            db.q("Payload"),
            db.q("Queue"),
        );
        db.execute(&format!(
            "INSERT INTO {t} ({ty}, {p}, {q}) VALUES ('a', '{{}}', 'webhooks'), ('b', '{{}}', 'mail')"
        ))
        .await;

        let paused = icq(&db.url, &["queue", "pause", "webhooks"]);
        assert_eq!(paused.status.code(), Some(0), "{engine}: {paused:?}");
        let doc = json(&paused);
        assert_eq!(doc[0]["queue"], "webhooks", "{engine}: {doc}");
        assert_eq!(doc[0]["paused"], true, "{engine}");
        assert_eq!(doc[0]["changed"], true, "{engine}");
        let again = json(&icq(&db.url, &["queue", "pause", "webhooks"]));
        assert_eq!(again[0]["changed"], false, "{engine}: already paused");

        let list = json(&icq(&db.url, &["queue", "list"]));
        let find = |name: &str| {
            list.as_array()
                .unwrap()
                .iter()
                .find(|q| q["queue"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("{engine}: {name} in {list}"))
        };
        assert_eq!(find("webhooks")["paused"], true, "{engine}");
        assert!(find("webhooks")["paused_at"].is_string(), "{engine}");
        assert_eq!(find("webhooks")["due"], 1, "{engine}");
        assert_eq!(find("mail")["paused"], false, "{engine}");

        let pending = json(&icq(&db.url, &["pending", "--by-queue"]));
        let rows = pending.as_array().unwrap();
        let webhooks = rows.iter().find(|r| r["queue"] == "webhooks").unwrap();
        assert_eq!(webhooks["paused"], true, "{engine}: {pending}");
        let mail = rows.iter().find(|r| r["queue"] == "mail").unwrap();
        assert!(mail.get("paused").is_none(), "{engine}: only when paused");

        let resumed = json(&icq(&db.url, &["queue", "resume", "webhooks"]));
        assert_eq!(resumed[0]["changed"], true, "{engine}");
        let list = json(&icq(&db.url, &["queue", "list"]));
        assert!(
            list.as_array()
                .unwrap()
                .iter()
                .all(|q| q["paused"] == false),
            "{engine}: {list}"
        );

        let bad = icq(&db.url, &["queue", "pause", ""]);
        assert_eq!(bad.status.code(), Some(2), "{engine}: {bad:?}");
    }
}
