//! Rescue at the default lease: two `icq work` replicas share a table of slow exec
//! commands; the one holding them (running and claimed ahead) is SIGKILLed, and the
//! survivor completes every one of its rows, none lost, once their leases lapse — within
//! the default `lease_seconds`, not minutes.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::common::{Worker, table, wait_until, write_config, yaml_str};
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

per_engine!(a_sigkilled_replicas_rows_are_completed_by_the_survivor_within_the_default_lease);

/// Commands in the table: more than the first replica runs at once, so some wait claimed
/// ahead in its buffer when it dies.
const COMMANDS: usize = 8;

/// The lines `<event> <id> <unix ns>` of the handler's log.
fn events(path: &std::path::Path) -> Vec<(String, String, u128)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            Some((
                parts.next()?.to_owned(),
                parts.next()?.to_owned(),
                parts.next()?.parse().ok()?,
            ))
        })
        .collect()
}

fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

async fn pending(db: &TestDb) -> i64 {
    db.scalar_i64(&format!(
        "SELECT COUNT(*) FROM {} WHERE {} IS NULL AND {} IS NULL",
        table(db),
        db.q("ProcessedAt"),
        db.q("DeadLetteredAt")
    ))
    .await
}

async fn a_sigkilled_replicas_rows_are_completed_by_the_survivor_within_the_default_lease(
    engine: &'static str,
) {
    let db = TestDb::with_table(engine, "rescue").await;
    for _ in 0..COMMANDS {
        db.execute(&format!(
            "INSERT INTO {} ({}, {}) VALUES ('slow.exec', '{{}}')",
            table(&db),
            db.q("Type"),
            db.q("Payload")
        ))
        .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("events.txt");
    let script = format!(
        "echo start $ICQ_COMMAND_ID $(date +%s%N) >> '{log}'; sleep 3; \
         echo end $ICQ_COMMAND_ID $(date +%s%N) >> '{log}'",
        log = log.display(),
    );
    let handlers = format!(
        "  slow.exec:\n    exec: [\"sh\", \"-c\", {}]\n    timeout_seconds: 60\n",
        yaml_str(&script)
    );
    // The default lease: no `lease_seconds` here.
    let settings = "{ polling_interval_seconds: 0.2, concurrency: 4 }";
    let config = write_config(dir.path(), "rescue", &db.url, settings, &handlers);
    let mut doomed = Worker::start(&config, &[], &dir.path().join("doomed.log"));
    let running = wait_until(Duration::from_secs(30), || async {
        events(&log).iter().filter(|e| e.0 == "start").count() >= 4
    })
    .await;
    assert!(
        running,
        "{engine}: the first replica started its handlers\n{}",
        doomed.log_tail(20)
    );
    // What the first replica runs (rows it claimed ahead are rescued alike: every
    // command must complete, below).
    let held: HashSet<String> = events(&log).into_iter().map(|e| e.1).collect();
    let mut survivor = Worker::start(&config, &[], &dir.path().join("survivor.log"));
    // The survivor is up and polling (it finds nothing due: the first replica holds it all).
    tokio::time::sleep(Duration::from_secs(1)).await;
    doomed.kill();
    let killed_at = unix_nanos();
    let killed = Instant::now();

    let done = wait_until(Duration::from_secs(90), || async {
        pending(&db).await == 0
    })
    .await;
    let took = killed.elapsed();
    let survivor_log = survivor.log_tail(30);
    let status = survivor.stop(Duration::from_secs(20)).await;
    assert!(
        done,
        "{engine}: rows still pending {took:?} after the kill\n{survivor_log}"
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "{engine}: the survivor stopped cleanly\n{survivor_log}"
    );

    // Every command ended once after the kill or before it; none lost.
    let events = events(&log);
    let ended: HashSet<&str> = events
        .iter()
        .filter(|e| e.0 == "end")
        .map(|e| e.1.as_str())
        .collect();
    assert_eq!(
        ended.len(),
        COMMANDS,
        "{engine}: every command completed: {events:?}"
    );
    // The rescue: when each row the dead replica held started again on the survivor.
    let restarts: HashMap<&str, u128> = events
        .iter()
        .filter(|e| e.0 == "start" && e.2 > killed_at)
        .map(|e| (e.1.as_str(), e.2))
        .collect();
    let unfinished: Vec<&String> = held
        .iter()
        .filter(|id| {
            !events
                .iter()
                .any(|e| e.0 == "end" && &e.1 == *id && e.2 < killed_at)
        })
        .collect();
    assert!(
        !unfinished.is_empty(),
        "{engine}: the dead replica held running rows"
    );
    let rescue = unfinished
        .iter()
        .map(|id| {
            let at = restarts
                .get(id.as_str())
                .unwrap_or_else(|| panic!("{engine}: {id} never ran again: {events:?}"));
            Duration::from_nanos((at - killed_at) as u64)
        })
        .max()
        .unwrap();
    eprintln!(
        "{engine}: {} rows of the SIGKILLed replica (running and claimed ahead) ran again within {rescue:?}; all {COMMANDS} completed {took:?} after the kill",
        unfinished.len()
    );
    assert!(
        rescue < Duration::from_secs(60),
        "{engine}: the rescue took {rescue:?}, longer than the default lease allows"
    );
}
