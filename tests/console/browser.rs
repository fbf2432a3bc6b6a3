//! The console in a real browser: Debian's chromium (`/usr/bin/chromium`) driven by
//! playwright-core from `tests/console/browser/node_modules` (both installed by
//! `.ci/run`). A missing browser or module fails the test: it is never skipped.
//! Screenshots of every page go to `<target>/console-screenshots/ENGINE-*.png`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Console, DEAD, TOKEN, XSS, pending_json, seeded, state_of};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/console/browser/console.test.js"
);

/// `<target>/console-screenshots`.
fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target dir")
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("create the screenshot dir");
    dir
}

async fn scenario(engine: &'static str) {
    let db = seeded(engine, "console_browser").await;
    let console = Console::start(&db.url, &["--allow-actions"], Some(TOKEN));
    let expected = pending_json(&db.url);
    let chromium =
        std::env::var("ICQ_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let out = tokio::task::spawn_blocking({
        let base = console.base.clone();
        move || {
            Command::new("node")
                .arg(SCRIPT)
                .env("CONSOLE_URL", base)
                .env("CONSOLE_TOKEN", TOKEN)
                .env("EXPECTED_PENDING", expected.to_string())
                .env("DEAD_ID", DEAD)
                .env("XSS_ID", XSS)
                .env("ENGINE", engine)
                .env("CHROMIUM", chromium)
                .env("SCREENSHOTS", screenshots())
                .output()
                .expect("run node (install Node.js; .ci/run does)")
        }
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser scenario failed on {engine}:\n{stdout}\n{stderr}"
    );
    println!("{stdout}");
    // What the browser did, seen from the database.
    assert_eq!(state_of(&db.url, DEAD), "due");
    assert_eq!(state_of(&db.url, XSS), "dead");
}

#[tokio::test]
async fn browser_scenario_on_sqlite() {
    scenario("sqlite").await;
}

#[tokio::test]
async fn browser_scenario_on_postgres() {
    scenario("postgres").await;
}
