//! A queue's fleet-wide limits, on every engine, with several processors racing on one
//! table: `global_concurrency` (live leases of the queue), `key_concurrency` (per
//! `ConcurrencyKey`) and `rate` (a token bucket on the database's clock). Rows are
//! inserted with plain SQL, keys included. The `measure_*` tests (ignored) measure the
//! limits' cost and accuracy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use icq::handler::FnHandler;
use icq::settings::{QueueSettings, Rate};
use icq::{Job, Processor, Registry, RunOptions, Settings};
use tokio_util::sync::CancellationToken;

use super::drain::now_plus;
use super::support::{RUNTIME_ENGINES, TestDb};

/// The commands table of these tests: a name of their own, so a worker another test left
/// running on a reused test database (which serves the default table) cannot take their rows.
const TABLE: &str = "LimitedCommands";

fn table() -> icq::TableName {
    icq::TableName::parse(TABLE).unwrap()
}

/// A fresh database holding [`TABLE`] at the current schema version.
async fn fresh(engine: &'static str, tag: &str) -> TestDb {
    let db = TestDb::new(engine, tag).await;
    let kind: icq::Engine = engine.parse().unwrap();
    db.execute(&icq::schema::render(kind, &table()).up).await;
    db
}

/// Opens [`TABLE`] as source `main` with `settings`.
async fn open(db: &TestDb, settings: &Settings) -> icq::Queue {
    let options = icq::ConnectOptions::for_settings(settings);
    icq::Queue::connect("main", &db.url, &table(), &options)
        .await
        .unwrap()
}

/// Inserts `n` rows of type `ty` into `queue` with plain SQL, the `i`th with key
/// `key(i)` (also in its payload, for the handler).
async fn insert_keyed(
    db: &TestDb,
    ty: &str,
    queue: &str,
    n: usize,
    key: impl Fn(usize) -> Option<String>,
) {
    let (t, c_ty, c_payload, c_queue, c_key) = (
        db.q(TABLE),
        db.q("Type"),
        db.q("Payload"),
        db.q("Queue"),
        db.q("ConcurrencyKey"),
    );
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let rows: Vec<String> = chunk
            .iter()
            .map(|&i| {
                let k = key(i);
                let literal = k.as_ref().map_or("NULL".to_owned(), |k| format!("'{k}'"));
                let in_payload = k.map_or("null".to_owned(), |k| format!("\"{k}\""));
                format!("('{ty}', '{{\"n\": {i}, \"key\": {in_payload}}}', '{queue}', {literal})")
            })
            .collect();
        db.execute(&format!(
            "INSERT INTO {t} ({c_ty}, {c_payload}, {c_queue}, {c_key}) VALUES {}",
            rows.join(", ")
        ))
        .await;
    }
}

/// Pending rows left in the table.
async fn pending(db: &TestDb) -> i64 {
    let (t, processed, dead) = (db.q(TABLE), db.q("ProcessedAt"), db.q("DeadLetteredAt"));
    db.scalar_i64(&format!(
        "SELECT COUNT(*) FROM {t} WHERE {processed} IS NULL AND {dead} IS NULL"
    ))
    .await
}

/// What the handler saw: commands running at once (overall and per key), and each start.
#[derive(Default)]
struct Seen {
    running: AtomicUsize,
    most: AtomicUsize,
    done: AtomicU64,
    by_key: Mutex<HashMap<String, (usize, usize)>>,
    starts: Mutex<Vec<Instant>>,
    /// Every start (+1) and end (-1), in the order they happened.
    events: Mutex<Vec<(Instant, i8)>>,
}

impl Seen {
    fn most_by_key(&self) -> HashMap<String, usize> {
        let by_key = self.by_key.lock().unwrap();
        by_key
            .iter()
            .map(|(k, (_, most))| (k.clone(), *most))
            .collect()
    }
}

/// A registry whose `work` handler records into `seen` and takes `hold`.
fn recording(seen: &Arc<Seen>, hold: Duration) -> Registry {
    let mut registry = Registry::new();
    let seen = seen.clone();
    registry
        .insert(
            "work",
            Arc::new(FnHandler(move |job: Job| {
                let seen = seen.clone();
                async move {
                    let started = Instant::now();
                    seen.starts.lock().unwrap().push(started);
                    seen.events.lock().unwrap().push((started, 1));
                    let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
                    seen.most.fetch_max(now, Ordering::SeqCst);
                    let key = job.payload["key"].as_str().map(str::to_owned);
                    if let Some(key) = &key {
                        let mut by_key = seen.by_key.lock().unwrap();
                        let entry = by_key.entry(key.clone()).or_default();
                        entry.0 += 1;
                        entry.1 = entry.1.max(entry.0);
                    }
                    tokio::time::sleep(hold).await;
                    if let Some(key) = &key {
                        seen.by_key.lock().unwrap().get_mut(key).unwrap().0 -= 1;
                    }
                    seen.events.lock().unwrap().push((Instant::now(), -1));
                    seen.running.fetch_sub(1, Ordering::SeqCst);
                    seen.done.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })),
        )
        .unwrap();
    registry
}

/// `replicas` processors (each its own pool, as separate processes would have) serving
/// `queue` with `settings`, until `shutdown`.
async fn start_fleet(
    db: &TestDb,
    settings: &Settings,
    replicas: usize,
    seen: &Arc<Seen>,
    hold: Duration,
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<icq::Result<()>>> {
    let mut fleet = Vec::new();
    for _ in 0..replicas {
        let source = open(db, settings).await;
        let mut processor = Processor::new(recording(seen, hold));
        processor.add_source(source.source_handle(settings.clone()));
        let shutdown = shutdown.clone();
        fleet.push(tokio::spawn(async move {
            processor.run(RunOptions::default(), shutdown).await
        }));
    }
    fleet
}

/// Samples the queue's live leases every 10 ms until `stop`, on one connection held
/// throughout; the most seen and the number of samples.
fn sample_leases(
    db: Arc<TestDb>,
    queue: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(i64, usize)> {
    use sqlx::Connection;
    tokio::spawn(async move {
        let (t, c_queue, until, processed, dead) = (
            db.q(TABLE),
            db.q("Queue"),
            db.q("LockedUntil"),
            db.q("ProcessedAt"),
            db.q("DeadLetteredAt"),
        );
        let sql = format!(
            "SELECT COUNT(*) FROM {t} WHERE {c_queue} = '{queue}' AND {processed} IS NULL \
             AND {dead} IS NULL AND {until} > {}",
            db.now_sql()
        );
        let sql = || sqlx::AssertSqlSafe(sql.clone());
        let (mut most, mut samples) = (0, 0);
        macro_rules! sample_on {
            ($conn:ty) => {{
                let mut conn = <$conn>::connect(&db.url).await.expect("connect");
                while !stop.load(Ordering::SeqCst) {
                    let n: i64 = sqlx::query_scalar(sql())
                        .fetch_one(&mut conn)
                        .await
                        .expect("count live leases");
                    most = most.max(n);
                    samples += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }};
        }
        match db.engine {
            "postgres" => sample_on!(sqlx::PgConnection),
            "mysql" => sample_on!(sqlx::MySqlConnection),
            _ => sample_on!(sqlx::SqliteConnection),
        }
        (most, samples)
    })
}

async fn stop_fleet(
    shutdown: CancellationToken,
    fleet: Vec<tokio::task::JoinHandle<icq::Result<()>>>,
) {
    shutdown.cancel();
    for replica in fleet {
        replica.await.unwrap().unwrap();
    }
}

fn limited(queue: &str, concurrency: u32) -> QueueSettings {
    QueueSettings::new(queue, concurrency)
}

fn fast_polling(queues: Vec<QueueSettings>) -> Settings {
    Settings::default()
        .with_polling_interval_seconds(0.1)
        .with_queues(queues)
}

/// `global_concurrency: 3` over four processors of 8 slots each: the commands running at
/// once (counted in the handler) and the live leases (sampled every 10 ms) never exceed 3,
/// and reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn global_concurrency_holds_across_racing_processors() {
    for engine in RUNTIME_ENGINES {
        let db = Arc::new(fresh(engine, "global_limit").await);
        insert_keyed(&db, "work", "limited", 90, |_| None).await;
        let settings = fast_polling(vec![limited("limited", 8).with_global_concurrency(3)]);
        let seen = Arc::new(Seen::default());
        let shutdown = CancellationToken::new();
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = sample_leases(db.clone(), "limited", stop.clone());
        let fleet = start_fleet(
            &db,
            &settings,
            4,
            &seen,
            Duration::from_millis(30),
            &shutdown,
        )
        .await;
        let drained = super::wait_until(Duration::from_secs(60), || async {
            seen.done.load(Ordering::SeqCst) >= 90
        })
        .await;
        stop.store(true, Ordering::SeqCst);
        let (most_leases, samples) = sampler.await.unwrap();
        stop_fleet(shutdown, fleet).await;
        let most = seen.most.load(Ordering::SeqCst);
        eprintln!(
            "{engine}: most running {most}, most live leases {most_leases} in {samples} samples"
        );
        assert!(drained, "{engine}: the queue drained");
        assert!(most <= 3, "{engine}: {most} ran at once");
        assert!(
            most_leases <= 3,
            "{engine}: {most_leases} live leases at once"
        );
        assert_eq!(most, 3, "{engine}: the limit is used, not just respected");
        assert_eq!(pending(&db).await, 0, "{engine}");
    }
}

/// A lease held by a worker that died (a SIGKILL leaves its lease in the row) counts until
/// it lapses, then stops counting: with `global_concurrency: 1` nothing starts while it is
/// live, and everything runs once it lapsed. Leases that lapsed long ago (the other rows)
/// never count.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_workers_lease_counts_until_it_lapses() {
    for engine in RUNTIME_ENGINES {
        let db = Arc::new(fresh(engine, "dead_lease").await);
        insert_keyed(&db, "work", "limited", 5, |_| None).await;
        let (t, token, until, attempts, id) = (
            db.q(TABLE),
            db.q("LockToken"),
            db.q("LockedUntil"),
            db.q("Attempts"),
            db.q("Id"),
        );
        let first = match engine {
            "postgres" => format!("(SELECT {id} FROM {t} LIMIT 1)"),
            // MariaDB cannot select from the table it updates, except through a derived table.
            _ => format!("(SELECT x.{id} FROM (SELECT {id} FROM {t} LIMIT 1) AS x)"),
        };
        db.execute(&format!(
            "UPDATE {t} SET {token} = '6f2b1f4e-0000-4000-8000-00000000dead', {until} = {}, \
             {attempts} = 1 WHERE {id} = {first}",
            now_plus(engine, 3)
        ))
        .await;
        // An older crash: a lease that lapsed a minute ago.
        let past = match engine {
            "postgres" => "now() - interval '60 seconds'".to_owned(),
            "mysql" => "UTC_TIMESTAMP(6) - INTERVAL 60 SECOND".to_owned(),
            _ => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-60 seconds')".to_owned(),
        };
        db.execute(&format!(
            "UPDATE {t} SET {token} = '6f2b1f4e-0000-4000-8000-00000000beef', {until} = {past} \
             WHERE {token} IS NULL"
        ))
        .await;
        let settings = fast_polling(vec![limited("limited", 4).with_global_concurrency(1)]);
        let seen = Arc::new(Seen::default());
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let fleet = start_fleet(
            &db,
            &settings,
            2,
            &seen,
            Duration::from_millis(10),
            &shutdown,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let early = seen.done.load(Ordering::SeqCst) + seen.running.load(Ordering::SeqCst) as u64;
        let drained = super::wait_until(Duration::from_secs(30), || async {
            seen.done.load(Ordering::SeqCst) >= 5
        })
        .await;
        let took = started.elapsed();
        stop_fleet(shutdown, fleet).await;
        eprintln!("{engine}: drained in {took:?}");
        assert_eq!(
            early, 0,
            "{engine}: nothing starts while the dead worker's lease is live"
        );
        assert!(drained, "{engine}: the lapsed lease stopped counting");
        assert!(took >= Duration::from_millis(2500), "{engine}: {took:?}");
        assert_eq!(seen.most.load(Ordering::SeqCst), 1, "{engine}");
    }
}

/// `key_concurrency: 1`: commands of one key run one at a time across two processors,
/// while other keys and rows without a key run beside them; a key with a long backlog at
/// the head of the queue does not hold back the other keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_concurrency_limits_each_key_across_processors() {
    for engine in RUNTIME_ENGINES {
        let db = Arc::new(fresh(engine, "key_limit").await);
        // 40 rows of key `hot` first (the head of the queue), then a, b, c and no key.
        insert_keyed(&db, "work", "keyed", 40, |_| Some("hot".to_owned())).await;
        insert_keyed(&db, "work", "keyed", 30, |i| match i % 4 {
            0 => Some("a".to_owned()),
            1 => Some("b".to_owned()),
            2 => Some("c".to_owned()),
            _ => None,
        })
        .await;
        let settings = fast_polling(vec![limited("keyed", 6).with_key_concurrency(1)]);
        let seen = Arc::new(Seen::default());
        let shutdown = CancellationToken::new();
        let fleet = start_fleet(
            &db,
            &settings,
            2,
            &seen,
            Duration::from_millis(20),
            &shutdown,
        )
        .await;
        let drained = super::wait_until(Duration::from_secs(60), || async {
            seen.done.load(Ordering::SeqCst) >= 70
        })
        .await;
        stop_fleet(shutdown, fleet).await;
        let by_key = seen.most_by_key();
        let most = seen.most.load(Ordering::SeqCst);
        eprintln!("{engine}: most at once {most}, per key {by_key:?}");
        assert!(drained, "{engine}: the queue drained");
        for (key, most) in &by_key {
            assert_eq!(*most, 1, "{engine}: key {key} ran {most} at once");
        }
        assert_eq!(by_key.len(), 4, "{engine}: every key ran");
        assert!(
            most >= 3,
            "{engine}: other keys ran beside `hot` ({most} at once)"
        );
    }
}

/// `rate: 20/s` over two processors: 80 quick commands take at least (80 − 20) / 20 = 3 s
/// (a full bucket of one second's worth, then the refill), and no window of one second
/// holds more starts than the bucket allows. The bucket runs on the database's clock and
/// the test sees a start only after the claim's commit, a delay that varies on a loaded
/// machine: a second of the test's clock can hold the claims of up to `1 s + JITTER` of
/// the database's, so the bound is 20 (the full bucket) + 20 × (1 + JITTER) + 1 (a start at
/// each edge). Two buckets instead of one, or a bucket that does not cap, still break it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_holds_starts_to_the_bucket_across_processors() {
    for engine in RUNTIME_ENGINES {
        let db = Arc::new(fresh(engine, "rate_limit").await);
        insert_keyed(&db, "work", "paced", 80, |_| None).await;
        let rate: Rate = "20/s".parse().unwrap();
        let settings = fast_polling(vec![limited("paced", 8).with_rate(rate)]);
        let seen = Arc::new(Seen::default());
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let fleet = start_fleet(&db, &settings, 2, &seen, Duration::ZERO, &shutdown).await;
        let drained = super::wait_until(Duration::from_secs(60), || async {
            seen.done.load(Ordering::SeqCst) >= 80
        })
        .await;
        let took = started.elapsed();
        stop_fleet(shutdown, fleet).await;
        let starts = seen.starts.lock().unwrap().clone();
        let most = most_in_window(&starts, Duration::from_secs(1));
        eprintln!("{engine}: 80 starts in {took:?}, at most {most} in one second");
        assert!(drained, "{engine}: the queue drained");
        assert!(took >= Duration::from_millis(2800), "{engine}: {took:?}");
        const JITTER: f64 = 0.5;
        let bound = (20.0 + 20.0 * (1.0 + JITTER) + 1.0) as usize;
        assert!(most <= bound, "{engine}: {most} starts in one second");
    }
}

/// How long the limit's places stood free: for every place freed (the running count fell
/// below `limit`), the time until a command took it again; sorted.
fn place_gaps(events: &[(Instant, i8)], limit: i64) -> Vec<Duration> {
    let mut sorted = events.to_vec();
    sorted.sort();
    let mut running = 0i64;
    let mut freed: Vec<Instant> = Vec::new();
    let mut gaps = Vec::new();
    for (at, step) in sorted {
        running += i64::from(step);
        if step < 0 && running < limit {
            freed.push(at);
        } else if step > 0 && !freed.is_empty() {
            gaps.push(at - freed.remove(0));
        }
    }
    gaps.sort();
    gaps
}

/// The most of `starts` in any window of length `window`.
fn most_in_window(starts: &[Instant], window: Duration) -> usize {
    let mut sorted = starts.to_vec();
    sorted.sort();
    let mut most = 0;
    let mut first = 0;
    for (last, at) in sorted.iter().enumerate() {
        while *at - sorted[first] >= window {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

/// A configured limit on a table older than version 4 is refused before anything is
/// claimed, naming the upgrade.
#[tokio::test]
async fn a_limit_on_an_older_table_names_the_upgrade() {
    for engine in RUNTIME_ENGINES {
        let db = TestDb::new(engine, "limit_v3").await;
        let kind: icq::Engine = engine.parse().unwrap();
        let table = table();
        db.execute(&icq::schema::render_v1(kind, &table).up).await;
        db.execute(&icq::schema::render_upgrade(kind, &table).up)
            .await;
        db.execute(&icq::schema::render_upgrade_v3(kind, &table).up)
            .await;
        let settings = fast_polling(vec![limited("limited", 2).with_global_concurrency(1)]);
        let source = open(&db, &settings).await;
        let mut registry = Registry::new();
        registry
            .insert("work", Arc::new(icq::handler::Noop))
            .unwrap();
        let mut processor = Processor::new(registry);
        processor.add_source(source.source_handle(settings));
        let err = processor
            .run(
                RunOptions::default().with_until_idle(true),
                Default::default(),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("schema version 3"), "{engine}: {err}");
        assert!(err.contains("needs version 4"), "{engine}: {err}");
        assert!(err.contains("global_concurrency"), "{engine}: {err}");
    }
}

/// The engines a measurement runs on: `ICQ_ENGINES` (comma-separated), or all of them.
fn engines_to_measure() -> Vec<&'static str> {
    std::env::var("ICQ_ENGINES")
        .map(|list| {
            RUNTIME_ENGINES
                .into_iter()
                .filter(|e| list.split(',').any(|x| x == *e))
                .collect()
        })
        .unwrap_or_else(|_| RUNTIME_ENGINES.to_vec())
}

/// The measurements' handler time: 20 ms, or `ICQ_MEASURE_HANDLER_MS`.
fn handler_ms() -> Duration {
    let ms = std::env::var("ICQ_MEASURE_HANDLER_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(20);
    Duration::from_millis(ms)
}

/// Measures `global_concurrency: 3` over 4 processors × 8 slots with 20 ms handlers
/// against 3 slots on one processor without limits: the live leases sampled every 10 ms
/// never exceed 3, and the limited fleet's throughput is at least 0.9× the single
/// processor's. Also one processor × 8 slots under the same limit (all places on one
/// processor, whose slots finish while its own hand-ons are in flight). `cargo test --features cli --test fleet measure_global -- --ignored --nocapture`;
/// `ICQ_MEASURE_NOT_DUE=20000` adds that many rows to the queue that are not due (a backlog
/// scheduled for later), `ICQ_MEASURE_HANDLER_MS=2` shortens the handlers,
/// `ICQ_ENGINES=mysql` measures one engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement"]
async fn measure_global_concurrency_throughput() {
    const ROWS: usize = 1_500;
    for engine in engines_to_measure() {
        let mut rates = Vec::new();
        for (label, queue, replicas) in [
            ("one processor, concurrency 3, no limit", limited("q", 3), 1),
            (
                "4 processors x 8 slots, global_concurrency 3",
                limited("q", 8).with_global_concurrency(3),
                4,
            ),
            (
                "one processor x 8 slots, global_concurrency 3",
                limited("q", 8).with_global_concurrency(3),
                1,
            ),
        ] {
            let db = Arc::new(fresh(engine, "measure_global").await);
            // A backlog that is not due yet: rows a count of the queue's leases reads.
            let not_due: usize = std::env::var("ICQ_MEASURE_NOT_DUE")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if not_due > 0 {
                insert_keyed(&db, "work", "q", not_due, |_| None).await;
                db.execute(&format!(
                    "UPDATE {} SET {} = '2099-01-01 00:00:00'",
                    db.q(TABLE),
                    db.q("RunAt")
                ))
                .await;
            }
            insert_keyed(&db, "work", "q", ROWS, |_| None).await;
            let settings = fast_polling(vec![queue]);
            let seen = Arc::new(Seen::default());
            let shutdown = CancellationToken::new();
            let stop = Arc::new(AtomicBool::new(false));
            let sampler = sample_leases(db.clone(), "q", stop.clone());
            let started = Instant::now();
            let fleet = start_fleet(&db, &settings, replicas, &seen, handler_ms(), &shutdown).await;
            let drained = super::wait_until(Duration::from_secs(300), || async {
                seen.done.load(Ordering::SeqCst) >= ROWS as u64
            })
            .await;
            let took = started.elapsed();
            stop.store(true, Ordering::SeqCst);
            let (most_leases, samples) = sampler.await.unwrap();
            stop_fleet(shutdown, fleet).await;
            assert!(drained, "{engine}: {label}: drained");
            let rate = ROWS as f64 / took.as_secs_f64();
            eprintln!(
                "{engine}: {label}: {ROWS} x {:?} in {took:.2?} = {rate:.1}/s; most running \
                 {}, most live leases {most_leases} in {samples} samples",
                handler_ms(),
                seen.most.load(Ordering::SeqCst)
            );
            let events = seen.events.lock().unwrap().clone();
            let first = events.iter().map(|(at, _)| *at).min();
            let last = events.iter().map(|(at, _)| *at).max();
            if let (Some(first), Some(last)) = (first, last) {
                eprintln!(
                    "{engine}: {label}: from the first start to the last end {:.2?} = {:.1}/s \
                     (the fleet's start {:.2?})",
                    last - first,
                    ROWS as f64 / (last - first).as_secs_f64(),
                    first - started
                );
            }
            let gaps = place_gaps(&events, 3);
            if !gaps.is_empty() {
                let at = |q: f64| gaps[((gaps.len() - 1) as f64 * q) as usize];
                let total: Duration = gaps.iter().sum();
                eprintln!(
                    "{engine}: {label}: a freed place stood free p50 {:.2?}, p90 {:.2?}, \
                     p99 {:.2?}, max {:.2?}; {:.2?} per command",
                    at(0.5),
                    at(0.9),
                    at(0.99),
                    at(1.0),
                    total / ROWS as u32
                );
            }
            rates.push((rate, most_leases));
        }
        let ratio = rates[1].0 / rates[0].0;
        eprintln!("{engine}: limited fleet / one processor = {ratio:.3}");
        let alone = rates[2].0 / rates[0].0;
        eprintln!("{engine}: one limited processor / one processor = {alone:.3}");
        assert!(rates[1].1 <= 3, "{engine}: live leases exceeded 3");
        assert!(
            rates[2].1 <= 3,
            "{engine}: live leases exceeded 3 on one processor"
        );
    }
}

/// Measures `rate: 50/s` over 60 s with 4 processors and a backlog: 3,000 ± 5% starts,
/// and no window of one second holds more starts than the bucket allows (50 + 50).
/// `cargo test --features cli --test fleet measure_rate -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement"]
async fn measure_rate_over_a_minute() {
    for engine in engines_to_measure() {
        let db = Arc::new(fresh(engine, "measure_rate").await);
        insert_keyed(&db, "work", "paced", 4_000, |_| None).await;
        let settings = fast_polling(vec![limited("paced", 8).with_rate("50/s".parse().unwrap())]);
        let seen = Arc::new(Seen::default());
        let shutdown = CancellationToken::new();
        let fleet = start_fleet(
            &db,
            &settings,
            4,
            &seen,
            Duration::from_millis(5),
            &shutdown,
        )
        .await;
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(60)).await;
        let starts: Vec<Instant> = seen
            .starts
            .lock()
            .unwrap()
            .iter()
            .copied()
            .filter(|at| at.saturating_duration_since(started) < Duration::from_secs(60))
            .collect();
        stop_fleet(shutdown, fleet).await;
        let most = most_in_window(&starts, Duration::from_secs(1));
        // After the first second (the full bucket's burst), the steady rate.
        let steady: Vec<Instant> = starts
            .iter()
            .copied()
            .filter(|at| at.saturating_duration_since(started) >= Duration::from_secs(2))
            .collect();
        let most_steady = most_in_window(&steady, Duration::from_secs(1));
        eprintln!(
            "{engine}: {} starts in 60 s (expected 3000 +- 150 plus the first burst of 50); \
             most in any 1 s window {most} (bucket allows 100); after the first 2 s at most \
             {most_steady} in 1 s",
            starts.len()
        );
    }
}
