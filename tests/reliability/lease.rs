//! Leases and shutdown, with `icq work` processes and exec handlers.
//!
//! - A handler that runs three times its lease under two workers runs once: the worker
//!   running it keeps renewing the lease, so the other never takes the command.
//! - SIGTERM during a long exec handler (`sh -c 'sleep … & wait'`) with `--grace-seconds 1`:
//!   the worker exits 0 within a few seconds, the handler's whole process group (the
//!   backgrounded `sleep` grandchild included) is dead before the lease is released, and a
//!   second worker then runs the command, never alongside the first.

use std::time::{Duration, Instant};

use rand::RngExt;

use crate::common::{Worker, completed, pgrep, table, wait_until, write_config, yaml_str};
use crate::support::TestDb;

macro_rules! per_engine {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() { super::$name("postgres").await }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() { super::$name("sqlite").await }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn mysql() { super::$name("mysql").await }
            }
        )*
    };
}

per_engine!(
    handler_running_three_leases_under_two_workers_runs_once,
    sigterm_kills_the_handlers_process_group_then_another_worker_runs_it,
);

async fn insert_one(db: &TestDb, ty: &str) {
    db.execute(&format!(
        "INSERT INTO {} ({}, {}) VALUES ('{ty}', '{{}}')",
        table(db),
        db.q("Type"),
        db.q("Payload")
    ))
    .await;
}

async fn handler_running_three_leases_under_two_workers_runs_once(engine: &'static str) {
    let db = TestDb::with_table(engine, "lease3x").await;
    insert_one(&db, "slow.exec").await;
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs.txt");
    let script = format!("echo $ICQ_COMMAND_ID >> '{}'; sleep 6", runs.display());
    let handlers = format!(
        "  slow.exec:\n    exec: [\"sh\", \"-c\", {}]\n    timeout_seconds: 30\n",
        yaml_str(&script)
    );
    let settings = "{ lease_seconds: 2, polling_interval_seconds: 0.2 }";
    let mut workers: Vec<Worker> = ["a", "b"]
        .iter()
        .map(|name| {
            let config = write_config(&dir.path().join(name), name, &db.url, settings, &handlers);
            Worker::start(&config, &[], &dir.path().join(format!("{name}.log")))
        })
        .collect();
    let done = wait_until(Duration::from_secs(60), || async {
        completed(&db).await == 1
    })
    .await;
    let logs: Vec<String> = workers.iter().map(|w| w.log_tail(20)).collect();
    for worker in &mut workers {
        let status = worker.stop(Duration::from_secs(20)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "{engine}: a worker did not stop cleanly: {status:?}\n{}",
            worker.log_tail(20)
        );
    }
    assert!(done, "{engine}: the command completed\n{logs:#?}");
    let lines: Vec<String> = std::fs::read_to_string(&runs)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "{engine}: a 6 s handler under a 2 s lease and two workers ran {} times: {lines:?}\n{logs:#?}",
        lines.len()
    );
    let attempts = db
        .scalar_i64(&format!(
            "SELECT CAST({} AS {}) FROM {}",
            db.q("Attempts"),
            if engine == "mysql" {
                "SIGNED"
            } else {
                "BIGINT"
            },
            db.all_rows()
        ))
        .await;
    assert_eq!(attempts, 1, "{engine}: one attempt consumed");
}

/// Lines of the times file: `start <attempt> <ns>` / `end <attempt> <ns>`.
fn events(path: &std::path::Path) -> Vec<(String, u128)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let kind = parts.next()?.to_owned();
            let at = parts.nth(1)?.parse().ok()?;
            Some((kind, at))
        })
        .collect()
}

fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

async fn sigterm_kills_the_handlers_process_group_then_another_worker_runs_it(
    engine: &'static str,
) {
    let db = TestDb::with_table(engine, "sigterm").await;
    insert_one(&db, "long.exec").await;
    let dir = tempfile::tempdir().unwrap();
    let times = dir.path().join("times.txt");
    let phase2 = dir.path().join("phase2");
    // A unique sleep length is the marker `pgrep -f` looks for.
    let marker = format!("sleep 30.{:06}", rand::rng().random_range(0..1_000_000));
    let script = format!(
        "echo start $ICQ_ATTEMPT $(date +%s%N) >> '{times}'; \
         if [ -e '{phase2}' ]; then echo end $ICQ_ATTEMPT $(date +%s%N) >> '{times}'; exit 0; fi; \
         {marker} & wait; echo end $ICQ_ATTEMPT $(date +%s%N) >> '{times}'",
        times = times.display(),
        phase2 = phase2.display(),
    );
    let handlers = format!(
        "  long.exec:\n    exec: [\"sh\", \"-c\", {}]\n    timeout_seconds: 60\n",
        yaml_str(&script)
    );
    let config = write_config(
        dir.path(),
        "term",
        &db.url,
        "{ lease_seconds: 2, polling_interval_seconds: 0.2 }",
        &handlers,
    );
    let mut first = Worker::start(
        &config,
        &["--grace-seconds", "1"],
        &dir.path().join("first.log"),
    );
    assert!(
        wait_until(Duration::from_secs(30), || async {
            !pgrep(&marker).is_empty()
        })
        .await,
        "{engine}: the handler's background sleep started\n{}",
        first.log_tail(20)
    );
    // Let it run a little past a lease renewal.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let termed = Instant::now();
    first.signal(nix::sys::signal::Signal::SIGTERM);
    let status = first.wait_for_exit(Duration::from_secs(15)).await;
    let exited_after = termed.elapsed();
    let exited_at = unix_nanos();
    // SIGKILL is delivered at once; the kernel tears the processes down when it schedules
    // them, which on a loaded machine can take a while.
    let mut survivors = pgrep(&marker);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !survivors.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        survivors = pgrep(&marker);
    }
    for pid in &survivors {
        // Ours to clean up: the grandchild of a worker this test started.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let log = first.log_tail(30);
    assert!(
        status.is_some(),
        "{engine}: the worker did not exit within 15 s of SIGTERM with --grace-seconds 1\n{log}"
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "{engine}: the worker exited {status:?} on SIGTERM\n{log}"
    );
    assert!(
        exited_after < Duration::from_secs(8),
        "{engine}: the worker took {exited_after:?} to exit with --grace-seconds 1\n{log}"
    );
    assert!(
        survivors.is_empty(),
        "{engine}: the handler's `{marker}` grandchild survived the worker: pids {survivors:?}\n{log}"
    );
    let t = table(&db);
    let row = |column: &str| format!("SELECT COUNT(*) FROM {t} WHERE {} IS NULL", db.q(column));
    assert_eq!(
        db.scalar_i64(&row("LockToken")).await,
        1,
        "{engine}: lease released\n{log}"
    );
    assert_eq!(
        db.scalar_i64(&row("ProcessedAt")).await,
        1,
        "{engine}: not completed"
    );
    let attempts = format!("SELECT COUNT(*) FROM {t} WHERE {} = 0", db.q("Attempts"));
    assert_eq!(
        db.scalar_i64(&attempts).await,
        1,
        "{engine}: the interrupted attempt is given back"
    );

    // A second worker runs it (quickly this time), after the first is gone.
    std::fs::write(&phase2, "").unwrap();
    let mut second = Worker::start(&config, &["--until-idle"], &dir.path().join("second.log"));
    let status = second.wait_for_exit(Duration::from_secs(60)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{engine}: the second worker drained the command: {status:?}\n{}",
        second.log_tail(20)
    );
    assert_eq!(
        completed(&db).await,
        1,
        "{engine}: completed by the second worker"
    );
    let events = events(&times);
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        ["start", "start", "end"],
        "{engine}: the first run was stopped (no end), the second ran to its end: {events:?}"
    );
    assert!(
        events[1].1 > exited_at,
        "{engine}: the second run started after the first worker (and its process group) was gone"
    );
}
