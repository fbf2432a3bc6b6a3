//! Crash loop: 4 `icq work` processes drain one table through an `http` handler while a
//! random one is SIGKILLed and restarted again and again.
//!
//! Each worker has its own icq.yaml whose source is named `w0`..`w3` (same URL and table,
//! `lease_seconds: 2`), so every request the counting endpoint receives names the worker
//! that sent it (`X-Icq-Source`) and the command (`X-Icq-Command-Id`). The kills are spread
//! over the drain: kill number k happens once a random share of the commands, between
//! (k-1)/n and k/n of 90 %, has completed, at a random worker.
//!
//! At the end: every command is completed and was delivered at least once (0 lost), and
//! every repeated delivery is explained by a kill: for each pair of consecutive requests
//! for one id, the process that received the earlier one was killed after it arrived
//! (within the lease plus 2 s: a live worker stamps an outcome well within its lease) and
//! before the later one did. The one other explanation is the database not answering the
//! earlier worker: when it cannot stamp a delivered command or renew its lease before the
//! lease lapses, another worker claims the command again, after the first execution ended
//! (the worker says so: "leases could not be extended in time" or "dropped stale
//! outcomes", logged between the two deliveries). Seen only on a loaded CI machine, where a
//! worker's statements went unanswered for over a second. A repeat without either is a
//! command run twice without a crash.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::RngExt;

use crate::common::{
    CountingServer, HEAVY, Hit, Worker, all_ids, completed, lit, table, write_config, yaml_str,
};
use crate::support::TestDb;

const WORKERS: usize = 4;

/// A request's arrival may be recorded a moment after the kill of the worker that sent it
/// (the bytes were in flight): a kill this close before the recorded arrival still counts.
const ARRIVAL_SLACK: Duration = Duration::from_millis(100);

/// The workers' `lease_seconds`.
const LEASE_SECONDS: u64 = 2;

/// How long a killed process may have held a delivered, unstamped command for its kill to
/// explain the repeat: the lease, plus room for a loaded CI machine.
const HELD_AT_MOST: Duration = Duration::from_secs(LEASE_SECONDS + 2);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_loop_postgres() {
    crash_loop("postgres", 10_000, 20, Duration::from_secs(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_loop_mysql() {
    crash_loop("mysql", 10_000, 20, Duration::from_secs(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "soak: 100,000 commands and 100 kills per engine; run with --ignored"]
async fn crash_loop_soak_postgres() {
    crash_loop("postgres", 100_000, 100, Duration::from_secs(1800)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "soak: 100,000 commands and 100 kills per engine; run with --ignored"]
async fn crash_loop_soak_mysql() {
    crash_loop("mysql", 100_000, 100, Duration::from_secs(1800)).await;
}

/// Inserts `n` commands of type `crash.http` with plain multi-row INSERTs.
async fn bulk_insert(db: &TestDb, n: usize) {
    let (t, ty, payload) = (table(db), db.q("Type"), db.q("Payload"));
    let mut i = 0;
    while i < n {
        let end = (i + 1000).min(n);
        let rows: Vec<String> = (i..end)
            .map(|k| format!("('crash.http', {})", lit(db, &format!("{{\"n\": {k}}}"))))
            .collect();
        db.execute(&format!(
            "INSERT INTO {t} ({ty}, {payload}) VALUES {}",
            rows.join(", ")
        ))
        .await;
        i = end;
    }
}

struct Kill {
    worker: usize,
    at: Instant,
}

async fn crash_loop(engine: &'static str, commands: usize, kills: usize, limit: Duration) {
    let _heavy = HEAVY.lock().await;
    let db = TestDb::with_table(engine, "crash").await;
    bulk_insert(&db, commands).await;
    let ids = all_ids(&db).await;
    assert_eq!(ids.len(), commands, "{engine}: every command inserted");

    let server = CountingServer::start((5, 15)).await;
    let dir = tempfile::tempdir().unwrap();
    let handlers = format!(
        "  crash.http:\n    http: {{ url: {} }}\n    timeout_seconds: 10\n",
        yaml_str(&server.url())
    );
    let configs: Vec<PathBuf> = (0..WORKERS)
        .map(|k| {
            write_config(
                &dir.path().join(format!("w{k}")),
                &format!("w{k}"),
                &db.url,
                &format!("{{ lease_seconds: {LEASE_SECONDS}, polling_interval_seconds: 0.25, concurrency: 4 }}"),
                &handlers,
            )
        })
        .collect();
    let log = |k: usize| dir.path().join(format!("w{k}.log"));
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|k| Worker::start(&configs[k], &[], &log(k)))
        .collect();

    // Kill k happens once completions pass a random point in the k-th slice of 90 %.
    let mut rng = rand::rng();
    let thresholds: Vec<i64> = (0..kills)
        .map(|k| {
            let slice = 0.85 / kills as f64;
            let share = slice * k as f64 + rng.random_range(0.05..1.0) * slice;
            (share * commands as f64) as i64
        })
        .collect();
    let mut kill_log: Vec<Kill> = Vec::new();
    let mut unexpected_exits: Vec<String> = Vec::new();
    let started = Instant::now();
    let started_wall = chrono::Utc::now();
    let mut done = 0;
    while started.elapsed() < limit {
        done = completed(&db).await;
        if done == commands as i64 {
            break;
        }
        for (k, worker) in workers.iter_mut().enumerate() {
            if let Some(status) = worker.exited() {
                unexpected_exits.push(format!(
                    "w{k} exited by itself: {status}\n{}",
                    worker.log_tail(20)
                ));
                *worker = Worker::start(&configs[k], &[], &log(k));
            }
        }
        if kill_log.len() < kills && done >= thresholds[kill_log.len()] {
            let k = rng.random_range(0..WORKERS);
            let at = Instant::now();
            workers[k].kill();
            kill_log.push(Kill { worker: k, at });
            let pause = rng.random_range(0..250);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            workers[k] = Worker::start(&configs[k], &[], &log(k));
            continue;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained_in = started.elapsed();
    let mut stop_problems = Vec::new();
    for (k, worker) in workers.iter_mut().enumerate() {
        match worker.stop(Duration::from_secs(30)).await {
            Some(status) if status.success() => {}
            other => stop_problems.push(format!(
                "w{k} on SIGTERM: {other:?}\n{}",
                worker.log_tail(20)
            )),
        }
    }
    // A request may still be answered after the last stamp; let the endpoint settle.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let hits = server.hits();
    let mut by_id: HashMap<&str, Vec<&Hit>> = HashMap::new();
    for hit in &hits {
        by_id.entry(hit.id.as_str()).or_default().push(hit);
    }
    let not_completed = commands as i64 - completed(&db).await;
    let never_delivered: Vec<&String> = ids
        .iter()
        .filter(|id| !by_id.contains_key(id.as_str()))
        .collect();
    let mut duplicates = 0usize;
    let mut repeats = 0usize;
    let mut explained = 0usize;
    // Repeats explained by the earlier worker's unanswered database (see the module doc).
    let mut stalls = 0usize;
    let mut unexplained: Vec<String> = Vec::new();
    // For explained repeats: how long the killed process had held the delivered command.
    let mut gaps: Vec<Duration> = Vec::new();
    for (id, list) in by_id.iter_mut() {
        if list.len() < 2 {
            continue;
        }
        duplicates += 1;
        repeats += list.len() - 1;
        list.sort_by_key(|h| h.at);
        let mut all_explained = true;
        for pair in list.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            let worker: Option<usize> = earlier
                .source
                .strip_prefix('w')
                .and_then(|n| n.parse().ok());
            // The process that received the earlier request is the one its worker slot
            // had then: it died at the slot's first kill after that request arrived.
            let death = kill_log
                .iter()
                .filter(|kill| Some(kill.worker) == worker && kill.at + ARRIVAL_SLACK >= earlier.at)
                .map(|kill| kill.at)
                .min();
            // And it died soon after: a live worker stamps (or gives up on) an outcome
            // within its lease, so a process that held a delivered command longer than
            // that before dying did not lose it to the kill.
            let killed = death.is_some_and(|at| {
                at <= later.at && at.saturating_duration_since(earlier.at) <= HELD_AT_MOST
            });
            if let Some(at) = death.filter(|_| killed) {
                gaps.push(at.saturating_duration_since(earlier.at));
            }
            let stalled = !killed
                && worker.is_some_and(|k| {
                    // The stale outcome is dropped when the late stamp finally lands,
                    // after the other worker's claim: up to a lease and some later.
                    let wall = |at: Instant| {
                        started_wall
                            + chrono::Duration::from_std(at.saturating_duration_since(started))
                                .unwrap_or_default()
                    };
                    let from = wall(earlier.at) - chrono::Duration::milliseconds(100);
                    let to = wall(later.at + HELD_AT_MOST);
                    lease_lapsed_between(&log(k), from, to)
                });
            if stalled {
                stalls += 1;
            }
            if !killed && !stalled {
                all_explained = false;
                unexplained.push(format!(
                    "{id}: delivered to {} at +{:?} and again to {} at +{:?}; {} was {}",
                    earlier.source,
                    earlier.at - started,
                    later.source,
                    later.at - started,
                    earlier.source,
                    match death {
                        Some(at) => format!("killed at +{:?}", at - started),
                        None => "not killed after the first delivery".into(),
                    }
                ));
            }
        }
        if all_explained {
            explained += 1;
        }
    }
    let known: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
    let unknown_ids = hits
        .iter()
        .filter(|h| !known.contains(h.id.as_str()))
        .count();
    eprintln!(
        "crash loop {engine}: commands {commands}, workers {WORKERS}, kills {}, drained in {drained_in:.1?}, \
         requests {}, lost {} (not completed {not_completed}, never delivered {}), duplicates {duplicates} \
         ({repeats} extra deliveries), explained by a kill or an unanswered database {explained} \
         (repeats after a worker's lease lapsed unanswered: {stalls}), unexplained {}",
        kill_log.len(),
        hits.len(),
        not_completed.max(never_delivered.len() as i64),
        never_delivered.len(),
        duplicates - explained,
    );
    gaps.sort();
    if !gaps.is_empty() {
        eprintln!(
            "crash loop {engine}: delivery-to-kill time of repeated deliveries: median {:?}, p99 {:?}, max {:?}",
            gaps[gaps.len() / 2],
            gaps[gaps.len() * 99 / 100],
            gaps[gaps.len() - 1]
        );
    }
    let tails = || {
        (0..WORKERS)
            .map(|k| format!("--- w{k}.log\n{}", crate::common::log_tail(&log(k), 15)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    // Every warning and error the workers logged.
    let warnings = || {
        (0..WORKERS)
            .map(|k| {
                let text = std::fs::read_to_string(log(k)).unwrap_or_default();
                let lines: Vec<&str> = text
                    .lines()
                    .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                    .collect();
                format!(
                    "--- w{k}.log: {} warnings/errors, the last ones:\n{}",
                    lines.len(),
                    lines[lines.len().saturating_sub(25)..]
                        .iter()
                        .map(|l| l.chars().take(400).collect::<String>())
                        .collect::<Vec<_>>()
                        .join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        not_completed,
        0,
        "{engine}: {not_completed} commands not completed after {drained_in:?} (done {done})\n{}",
        tails()
    );
    assert!(
        never_delivered.is_empty(),
        "{engine}: {} completed commands never reached the endpoint, e.g. {:?}",
        never_delivered.len(),
        &never_delivered[..never_delivered.len().min(5)]
    );
    assert_eq!(
        unknown_ids, 0,
        "{engine}: requests for ids that are not in the table"
    );
    assert_eq!(
        kill_log.len(),
        kills,
        "{engine}: every planned kill happened during the drain"
    );
    assert!(
        unexpected_exits.is_empty(),
        "{engine}: workers exited by themselves: {unexpected_exits:#?}"
    );
    assert!(
        stop_problems.is_empty(),
        "{engine}: workers did not stop cleanly: {stop_problems:#?}"
    );
    assert!(
        unexplained.is_empty(),
        "{engine}: {} duplicate deliveries not explained by a kill:\n{}\nworker warnings:\n{}",
        unexplained.len(),
        unexplained[..unexplained.len().min(20)].join("\n"),
        warnings()
    );
}

/// Whether the worker logging to `log` said, between `from` and `to`, that leases of its
/// lapsed because the database did not answer in time (it stopped those executions, or
/// dropped an outcome whose lease had passed to another claim).
fn lease_lapsed_between(
    log: &std::path::Path,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> bool {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|line| {
            line.contains("leases could not be extended in time")
                || line.contains("dropped stale outcomes")
        })
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .any(|at| at >= from && at <= to)
}
