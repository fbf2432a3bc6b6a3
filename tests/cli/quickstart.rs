//! `icq quickstart` on the embedded default, from nothing, as the README says.

use std::process::Command;

#[test]
fn quickstart_runs_end_to_end_on_the_embedded_default() {
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["quickstart", "--format", "json"])
        .current_dir(work.path())
        .env("ICQ_DATA_DIR", data.path())
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .output()
        .unwrap();
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
    let mut docs = serde_json::Deserializer::from_str(&stdout).into_iter::<serde_json::Value>();
    let pending = docs.next().unwrap().unwrap();
    assert_eq!(pending[0]["completed"], 4);
    assert_eq!(pending[0]["dead"], 1);
    let dead = docs.next().unwrap().unwrap();
    assert_eq!(dead[0]["type"], "demo.charge_card");
    assert_eq!(dead[0]["attempts"], 3);
}
