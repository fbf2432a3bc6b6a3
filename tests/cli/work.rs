//! `icq work` as a process: crash recovery after SIGKILL, graceful SIGTERM, startup errors.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::TestDb;

fn icq() -> Command {
    Command::new(env!("CARGO_BIN_EXE_icq"))
}

fn write_config(dir: &Path, url: &str, settings: &str, handlers: &str) -> std::path::PathBuf {
    let path = dir.join("icq.yaml");
    let text = format!(
        "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n{settings}\nhandlers:\n{handlers}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn insert(db: &TestDb, ty: &str, n: usize) {
    let (t, c1, c2) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
    for i in 0..n {
        db.execute(&format!(
            "INSERT INTO {t} ({c1}, {c2}) VALUES ('{ty}', '{{\"n\": {i}}}')"
        ))
        .await;
    }
}

async fn wait_for(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
}

async fn killed_mid_handler_runs_again_after_the_lease(engine: &'static str) {
    let db = TestDb::with_table(engine, "sigkill").await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("first-attempt-started");
    let handler = format!(
        "  crash.test:\n    exec: [\"sh\", \"-c\", \"if [ \\\"$ICQ_ATTEMPT\\\" = 1 ]; then touch {}; sleep 3; fi\"]\n",
        marker.display()
    );
    let config = write_config(
        dir.path(),
        &db.url,
        "      lease_seconds: 2\n      polling_interval_seconds: 0.1",
        &handler,
    );
    insert(&db, "crash.test", 1).await;

    let mut first = icq()
        .arg("work")
        .arg("--config")
        .arg(&config)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || marker.exists()).await,
        "first attempt started"
    );
    signal(&first, nix::sys::signal::Signal::SIGKILL);
    first.wait().unwrap();

    crate::work_until_idle(&config);
    let (p, a) = (db.q("ProcessedAt"), db.q("Attempts"));
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {p} IS NOT NULL",
            db.all_rows()
        ))
        .await,
        1,
        "completed after the lease expired"
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {a} = 2",
            db.all_rows()
        ))
        .await,
        1,
        "the crashed attempt was counted"
    );
}

/// SIGTERM with one command running and two not started (concurrency 1): the running one
/// finishes within the grace, the two others end pending with no attempt charged (released
/// if they were buffered), and the worker exits 0.
async fn sigterm_finishes_in_flight_and_releases_the_rest(engine: &'static str) {
    let db = TestDb::with_table(engine, "sigterm").await;
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let handler = format!(
        "  slow.test:\n    exec: [\"sh\", \"-c\", \"echo x >> {}; sleep 2\"]\n",
        started.display()
    );
    let config = write_config(
        dir.path(),
        &db.url,
        "      concurrency: 1\n      polling_interval_seconds: 0.1",
        &handler,
    );
    insert(&db, "slow.test", 3).await;

    let mut worker = icq()
        .arg("work")
        .arg("--config")
        .arg(&config)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || started.exists()).await,
        "a command started"
    );
    let (t, p, l) = (
        db.q("InternalCommands"),
        db.q("ProcessedAt"),
        db.q("LockToken"),
    );
    let leased = format!("SELECT COUNT(*) FROM {t} WHERE {l} IS NOT NULL");
    // The worker claims its one free slot plus a look-ahead paced by finished commands
    // (0 before any finished): the other two are buffered or not claimed yet; either
    // way SIGTERM must leave them pending with no attempt charged.
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    let status = worker.wait().unwrap();
    assert!(status.success(), "exit 0 after SIGTERM, got {status:?}");
    assert_eq!(
        std::fs::read_to_string(&started).unwrap().lines().count(),
        1,
        "only the running command started"
    );
    let done = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {p} IS NOT NULL",
            db.all_rows()
        ))
        .await;
    assert_eq!(
        done, 1,
        "the in-flight command finished, the worker stopped claiming"
    );
    assert_eq!(db.scalar_i64(&leased).await, 0, "no lease left behind");
    let (a, u) = (db.q("Attempts"), db.q("LockedUntil"));
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {p} IS NULL AND {a} = 0 AND {u} IS NULL"
        ))
        .await,
        2,
        "the two commands that never started are pending with no attempt charged"
    );

    // Past the grace period, the unfinished command's lease is released, not left to expire.
    let slow = format!(
        "  slow.test:\n    exec: [\"sh\", \"-c\", \"echo y >> {}; sleep 20\"]\n",
        started.display()
    );
    let config = write_config(
        dir.path(),
        &db.url,
        "      concurrency: 1\n      polling_interval_seconds: 0.1",
        &slow,
    );
    std::fs::remove_file(&started).unwrap();
    let mut worker = icq()
        .args(["work", "--grace-seconds", "0.3", "--config"])
        .arg(&config)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(20), || started.exists()).await);
    signal(&worker, nix::sys::signal::Signal::SIGTERM);
    assert!(worker.wait().unwrap().success());
    assert_eq!(
        db.scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {l} IS NOT NULL"))
            .await,
        0,
        "lease released at once"
    );
}

/// `requires_roles` from the config file is checked against the captured roles: a row
/// whose principal has the role runs; one whose principal lacks it (or has no roles) is
/// dead-lettered on its first attempt with the reason, and its program never starts.
async fn requires_roles_from_the_config_file(engine: &'static str) {
    let db = TestDb::with_table(engine, "roles").await;
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    std::fs::create_dir(&ran).unwrap();
    let handler = format!(
        "  orders.guarded:\n    exec: [\"sh\", \"-c\", \"touch {}/$ICQ_USER_ID\"]\n    requires_roles: [orders.write]\n",
        ran.display()
    );
    let config = write_config(
        dir.path(),
        &db.url,
        "      polling_interval_seconds: 0.1",
        &handler,
    );
    let (t, ty, pl, user, roles) = (
        db.q("InternalCommands"),
        db.q("Type"),
        db.q("Payload"),
        db.q("UserId"),
        db.q("Roles"),
    );
    for (who, granted) in [
        ("writer", r#"'["staff","orders.write"]'"#),
        ("reader", r#"'["orders.read"]'"#),
        ("nobody", "NULL"),
    ] {
        db.execute(&format!(
            "INSERT INTO {t} ({ty}, {pl}, {user}, {roles}) VALUES ('orders.guarded', '{{}}', '{who}', {granted})"
        ))
        .await;
    }
    crate::work_until_idle(&config);
    let mut started: Vec<String> = std::fs::read_dir(&ran)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    started.sort();
    assert_eq!(started, ["writer"], "only the principal with the role ran");
    let (p, d, a, le) = (
        db.q("ProcessedAt"),
        db.q("DeadLetteredAt"),
        db.q("Attempts"),
        db.q("LastError"),
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {user} = 'writer' AND {p} IS NOT NULL AND {a} = 1",
            db.all_rows()
        ))
        .await,
        1
    );
    for who in ["reader", "nobody"] {
        assert_eq!(
            db.scalar_i64(&format!(
                "SELECT COUNT(*) FROM {t} WHERE {user} = '{who}' AND {d} IS NOT NULL AND {p} IS NULL \
                 AND {a} = 1 AND {le} = 'forbidden: principal {who} lacks required role(s) orders.write'"
            ))
            .await,
            1,
            "{who} is dead-lettered on its first attempt with the reason"
        );
    }
}

macro_rules! per_engine {
    ($($name:ident),*) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("postgres").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("sqlite").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread")] async fn $name() { super::$name("mysql").await } )* }
    };
}

per_engine!(
    killed_mid_handler_runs_again_after_the_lease,
    sigterm_finishes_in_flight_and_releases_the_rest,
    requires_roles_from_the_config_file
);

#[tokio::test]
async fn missing_table_says_which_migrate_command_to_run() {
    let db = TestDb::new("postgres", "notable").await;
    let out = icq()
        .args(["pending", "--database-url", &db.url])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("table InternalCommands does not exist"),
        "{stderr}"
    );
    assert!(
        stderr.contains("icq migrate add --engine postgres"),
        "{stderr}"
    );
}

#[test]
fn missing_exec_program_fails_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("q.db").display());
    let config = write_config(
        dir.path(),
        &url,
        "      batch_size: 5",
        "  a.b:\n    exec: [\"/nonexistent/send-receipt\"]\n",
    );
    let out = icq()
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("handler `a.b`: program /nonexistent/send-receipt does not exist"),
        "{stderr}"
    );
}
