//! `icq quickstart`: on the embedded default from nothing, as the README says, and
//! (defect 5) on the database `--database-url` names, in its own table, the same counts
//! however often it runs, one JSON document under `--format json`.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::{RUNTIME_ENGINES, TestDb};

/// Runs `icq quickstart` with `args`, the embedded default's data dir at `data`.
fn quickstart(data: &Path, args: &[&str]) -> Output {
    let work = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .arg("quickstart")
        .args(args)
        .current_dir(work.path())
        .env("ICQ_DATA_DIR", data)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .output()
        .unwrap()
}

/// The one JSON document stdout holds: anything after it fails the test.
fn one_document(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let mut docs = serde_json::Deserializer::from_str(&stdout).into_iter::<Value>();
    let doc = docs
        .next()
        .expect("a document")
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(docs.next().is_none(), "exactly one document: {stdout}");
    assert!(
        stderr.trim().is_empty(),
        "no prose under --format json: {stderr}"
    );
    doc
}

/// The tour's result: 4 greetings completed, the failing charge dead after 3 attempts.
fn assert_tour(doc: &Value) {
    assert_eq!(doc["scheduled"], 5, "{doc}");
    assert_eq!(doc["succeeded"], 4, "{doc}");
    assert_eq!(doc["failed_attempts"], 2, "{doc}");
    assert_eq!(doc["dead_lettered"], 1, "{doc}");
    assert_eq!(doc["table"], "IcqQuickstart", "{doc}");
    assert_eq!(doc["pending"][0]["completed"], 4, "{doc}");
    assert_eq!(doc["pending"][0]["dead"], 1, "{doc}");
    assert_eq!(doc["dead_letters"][0]["type"], "demo.charge_card", "{doc}");
    assert_eq!(doc["dead_letters"][0]["attempts"], 3, "{doc}");
}

#[test]
fn quickstart_runs_end_to_end_on_the_embedded_default() {
    let data = tempfile::tempdir().unwrap();
    let out = quickstart(data.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        data.path().join("icq.db").exists(),
        "the embedded database was created"
    );
    assert!(
        stderr.contains("done: 4 succeeded, 2 failed attempts retried, 1 dead-lettered"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("demo.charge_card"), "{stdout}");
    assert_tour(&one_document(&quickstart(
        data.path(),
        &["--format", "json"],
    )));
}

#[tokio::test]
async fn defect_5_quickstart_uses_the_given_database_and_its_own_table_twice_alike() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::with_table(engine, "quickstart_twice").await;
        let data = tempfile::tempdir().unwrap();
        for run in 1..=2 {
            let out = quickstart(
                data.path(),
                &["--database-url", &db.url, "--format", "json"],
            );
            let doc = one_document(&out);
            assert_tour(&doc);
            let samples = db
                .scalar_i64(&format!(
                    "SELECT (SELECT COUNT(*) FROM {}) + (SELECT COUNT(*) FROM {})",
                    db.q("IcqQuickstart"),
                    db.q("IcqQuickstartHistory")
                ))
                .await;
            assert_eq!(samples, 5, "{engine}, run {run}: the samples of one run");
            let own = db
                .scalar_i64(&format!(
                    "SELECT COUNT(*) FROM {}",
                    db.q("InternalCommands")
                ))
                .await;
            assert_eq!(own, 0, "{engine}: the source's own table is not touched");
        }
        assert!(
            !data.path().join("icq.db").exists(),
            "{engine}: the embedded default was not used"
        );
    }
}

#[test]
fn defect_5_quickstart_twice_on_the_embedded_default_keeps_the_counts() {
    let data = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        assert_tour(&one_document(&quickstart(
            data.path(),
            &["--format", "json"],
        )));
    }
}

#[test]
fn defect_5_quickstart_ignores_an_ambient_database_url() {
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["quickstart", "--format", "json"])
        .current_dir(work.path())
        .env("ICQ_DATA_DIR", data.path())
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/test")
        .env_remove("ICQ_CONFIG")
        .output()
        .unwrap();
    assert_tour(&one_document(&out));
    assert!(data.path().join("icq.db").exists(), "the embedded default");
}
