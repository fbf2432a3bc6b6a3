//! Pausing a queue for the whole fleet: four processors on one table stop starting its
//! commands (within 1 s on PostgreSQL, which notifies them; within the polling interval
//! elsewhere), scheduling into it goes on, other queues keep running, and a resume
//! starts them again. Nothing is lost; `icq work --until-idle` is not held up by a
//! paused queue's due commands.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use icq::{NewCommand, Processor, Queue, Registry, RunOptions, Settings};
use tokio_util::sync::CancellationToken;

use crate::support::TestDb;

/// Records when each command of a queue started.
#[derive(Default)]
struct Starts(Mutex<Vec<(String, Instant)>>);

struct Recorder(Arc<Starts>);

#[async_trait::async_trait]
impl icq::Handler for Recorder {
    async fn handle(&self, job: icq::Job) -> icq::HandlerResult {
        let queue = job.payload["q"].as_str().unwrap_or_default().to_owned();
        self.0.0.lock().unwrap().push((queue, Instant::now()));
        let ms = job.payload["ms"].as_u64().unwrap_or(20);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(())
    }
}

async fn completed(db: &TestDb, queue: &str) -> i64 {
    let (t, q, p) = (db.all_rows(), db.q("Queue"), db.q("ProcessedAt"));
    db.scalar_i64(&format!(
        "SELECT COUNT(*) FROM {t} WHERE {q} = '{queue}' AND {p} IS NOT NULL"
    ))
    .await
}

async fn pause_stops_new_starts_fleet_wide(engine: &'static str, within: Duration) {
    let db = TestDb::with_table(engine, "pause").await;
    let options = icq::ConnectOptions::default();
    let queue = Queue::connect("pause", &db.url, &Default::default(), &options)
        .await
        .unwrap();
    let starts = Arc::new(Starts::default());
    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    for _ in 0..4 {
        let replica = Queue::connect("pause", &db.url, &Default::default(), &options)
            .await
            .unwrap();
        let mut registry = Registry::new();
        registry
            .insert("work", Arc::new(Recorder(starts.clone())))
            .unwrap();
        let mut processor = Processor::new(registry);
        processor.add_source(
            replica.source_handle(
                Settings::default()
                    .with_concurrency(2)
                    .with_polling_interval_seconds(0.2),
            ),
        );
        let stop = stop.clone();
        runs.push(tokio::spawn(async move {
            processor.run(RunOptions::default(), stop).await
        }));
    }
    let schedule = |name: &'static str, n: usize| {
        let commands: Vec<NewCommand> = (0..n)
            .map(|i| NewCommand::new("work", serde_json::json!({ "i": i, "q": name })).queue(name))
            .collect();
        let queue = queue.clone();
        async move { queue.schedule_many(&commands).await.unwrap() }
    };
    schedule("webhooks", 20).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while completed(&db, "webhooks").await < 20 {
        assert!(Instant::now() < deadline, "{engine}: the first 20 ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    assert!(queue.pause("webhooks").await.unwrap(), "{engine}: paused");
    let paused_at = Instant::now();
    // Scheduling goes on; another queue keeps running.
    schedule("webhooks", 200).await;
    schedule("mail", 20).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while completed(&db, "mail").await < 20 {
        assert!(Instant::now() < deadline, "{engine}: another queue runs on");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(within + Duration::from_millis(500)).await;
    let late: Vec<Duration> = starts
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(q, at)| q == "webhooks" && *at > paused_at + within)
        .map(|(_, at)| *at - paused_at)
        .collect();
    assert!(
        late.is_empty(),
        "{engine}: webhooks started {:?} after the pause",
        late
    );
    // Held: nothing of the queue completes any more, and some of it waits. How many
    // started before every replica saw the pause depends on the machine's load.
    let held = completed(&db, "webhooks").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        completed(&db, "webhooks").await,
        held,
        "{engine}: still running while paused"
    );
    let waiting = 220 - held;
    assert!(waiting > 0, "{engine}: {waiting} waiting while paused");
    let states = queue.queue_states().await.unwrap();
    assert!(
        states
            .iter()
            .any(|s| s.queue == "webhooks" && s.paused && s.paused_at.is_some()),
        "{engine}: {states:?}"
    );

    assert!(queue.resume("webhooks").await.unwrap(), "{engine}: resumed");
    let deadline = Instant::now() + Duration::from_secs(60);
    while completed(&db, "webhooks").await < 220 {
        assert!(
            Instant::now() < deadline,
            "{engine}: all ran after the resume"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    let runs = starts.0.lock().unwrap().len();
    assert_eq!(runs, 240, "{engine}: each ran once");
    queue.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_pause_stops_new_starts_within_a_second() {
    pause_stops_new_starts_fleet_wide("postgres", Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_pause_stops_new_starts_within_the_polling_interval() {
    // The polling interval (0.2 s) plus a claim and a slot's run in flight.
    pause_stops_new_starts_fleet_wide("mysql", Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_pause_stops_new_starts_within_the_polling_interval() {
    pause_stops_new_starts_fleet_wide("sqlite", Duration::from_secs(1)).await;
}

/// Rows claimed ahead of busy slots before their queue was paused do not start once the
/// processor has seen the pause: they are released with their attempt given back, and
/// each runs once after the resume.
async fn rows_held_ahead_do_not_start_once_their_queue_is_paused(engine: &'static str) {
    let db = TestDb::with_table(engine, "pauseahead").await;
    let queue = Queue::connect(
        "pauseahead",
        &db.url,
        &Default::default(),
        &Default::default(),
    )
    .await
    .unwrap();
    const COMMANDS: usize = 8;
    let commands: Vec<NewCommand> = (0..COMMANDS)
        .map(|i| {
            NewCommand::new(
                "work",
                serde_json::json!({ "i": i, "q": "slow", "ms": 2500 }),
            )
            .queue("slow")
        })
        .collect();
    queue.schedule_many(&commands).await.unwrap();
    let starts = Arc::new(Starts::default());
    let mut registry = Registry::new();
    registry
        .insert("work", Arc::new(Recorder(starts.clone())))
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(
        queue.source_handle(
            Settings::default()
                .with_concurrency(2)
                .with_polling_interval_seconds(0.2),
        ),
    );
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { processor.run(RunOptions::default(), stop).await }
    });
    // Once two have finished the processor knows its slots' pace and holds a row ahead.
    let deadline = Instant::now() + Duration::from_secs(30);
    while starts.0.lock().unwrap().len() < 4 {
        assert!(
            Instant::now() < deadline,
            "{engine}: the first four started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (t, q, p, a) = (
        db.all_rows(),
        db.q("Queue"),
        db.q("ProcessedAt"),
        db.q("Attempts"),
    );
    let charged =
        format!("SELECT COUNT(*) FROM {t} WHERE {q} = 'slow' AND {p} IS NULL AND {a} > 0");
    let held = db.scalar_i64(&charged).await;
    assert!(queue.pause("slow").await.unwrap(), "{engine}: paused");
    let paused_at = Instant::now();
    // The two running finish (2.5 s); their slots would take what is held ahead.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let late: Vec<Duration> = starts
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, at)| *at > paused_at + Duration::from_secs(1))
        .map(|(_, at)| *at - paused_at)
        .collect();
    assert!(
        late.is_empty(),
        "{engine}: {} started {late:?} after the pause ({held} rows were charged an attempt \
         when it came)",
        late.len()
    );
    assert_eq!(
        db.scalar_i64(&charged).await,
        0,
        "{engine}: every row left waiting has its attempt back"
    );
    eprintln!(
        "{engine}: {held} rows charged an attempt at the pause (2 running); none started after it"
    );
    assert!(queue.resume("slow").await.unwrap(), "{engine}: resumed");
    let deadline = Instant::now() + Duration::from_secs(60);
    while completed(&db, "slow").await < COMMANDS as i64 {
        assert!(
            Instant::now() < deadline,
            "{engine}: all ran after the resume"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(
        starts.0.lock().unwrap().len(),
        COMMANDS,
        "{engine}: each ran once"
    );
    let more = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {q} = 'slow' AND {a} <> 1"
        ))
        .await;
    assert_eq!(more, 0, "{engine}: one attempt each");
    queue.close().await;
}

#[tokio::test]
async fn rows_held_ahead_do_not_start_once_their_queue_is_paused_all_engines() {
    for engine in ["postgres", "mysql", "sqlite"] {
        rows_held_ahead_do_not_start_once_their_queue_is_paused(engine).await;
    }
}

/// `--until-idle` ends while a paused queue still has due commands: they wait for a
/// resume, not for this worker.
async fn until_idle_is_not_held_up_by_a_paused_queue(engine: &'static str) {
    let db = TestDb::with_table(engine, "pauseidle").await;
    let queue = Queue::connect(
        "pauseidle",
        &db.url,
        &Default::default(),
        &Default::default(),
    )
    .await
    .unwrap();
    for (q, n) in [("held", 3), ("default", 2)] {
        for i in 0..n {
            queue
                .schedule(&NewCommand::new("work", serde_json::json!({ "i": i, "q": q })).queue(q))
                .await
                .unwrap();
        }
    }
    queue.pause("held").await.unwrap();
    let starts = Arc::new(Starts::default());
    let mut registry = Registry::new();
    registry
        .insert("work", Arc::new(Recorder(starts.clone())))
        .unwrap();
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(Settings::default()));
    let ran = tokio::time::timeout(
        Duration::from_secs(30),
        processor.run(
            RunOptions::default().with_until_idle(true),
            CancellationToken::new(),
        ),
    )
    .await
    .expect("--until-idle ended with a paused queue's commands due");
    ran.unwrap();
    assert_eq!(completed(&db, "default").await, 2, "{engine}");
    assert_eq!(
        completed(&db, "held").await,
        0,
        "{engine}: none of the paused queue"
    );
    let counted = AtomicU64::new(0);
    counted.store(starts.0.lock().unwrap().len() as u64, Ordering::Relaxed);
    assert_eq!(counted.load(Ordering::Relaxed), 2, "{engine}");
    queue.close().await;
}

#[tokio::test]
async fn until_idle_is_not_held_up_by_a_paused_queue_all_engines() {
    for engine in ["postgres", "mysql", "sqlite"] {
        until_idle_is_not_held_up_by_a_paused_queue(engine).await;
    }
}

/// A table of schema version 3 refuses a pause, naming the upgrade; nothing is written.
#[tokio::test]
async fn a_version_3_table_refuses_a_pause_naming_the_upgrade() {
    for engine in ["postgres", "mysql", "sqlite"] {
        let db = TestDb::new(engine, "pausev3").await;
        let kind: icq::Engine = engine.parse().unwrap();
        let table = icq::TableName::default();
        let mut v3 = icq::schema::render_v1(kind, &table).up;
        for step in [
            icq::schema::render_upgrade(kind, &table).up,
            icq::schema::render_upgrade_v3(kind, &table).up,
        ] {
            v3.push('\n');
            v3.push_str(&step);
        }
        db.execute(&v3).await;
        let queue = Queue::connect("v3", &db.url, &table, &Default::default())
            .await
            .unwrap();
        let err = queue.pause("webhooks").await.unwrap_err();
        assert!(
            matches!(err, icq::Error::NeedsSchemaV4 { version: 3, .. }),
            "{engine}: {err}"
        );
        assert!(queue.queue_states().await.unwrap().is_empty(), "{engine}");
        queue.close().await;
    }
}
