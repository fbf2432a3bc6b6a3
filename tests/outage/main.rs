//! Outages: the database goes away mid-drain and processing resumes without losing a
//! command. A test binary of its own because it restarts the shared PostgreSQL server:
//! cargo runs test binaries one after another, so no other test sees the restart.

#[path = "../support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use icq::ConnectOptions;
use icq::handler::FnHandler;
use icq::{Job, NewCommand, Processor, Queue, Registry, RunOptions, Settings, TableName};
use tokio_util::sync::CancellationToken;

use support::TestDb;

const COMMANDS: usize = 3000;

async fn drain_through(engine: &'static str, outage: impl std::future::Future<Output = ()>) {
    let db = TestDb::with_table(engine, "outage").await;
    let queue = Queue::connect(
        "o",
        &db.url,
        &TableName::default(),
        &ConnectOptions::default(),
    )
    .await
    .unwrap();
    let commands: Vec<NewCommand> = (0..COMMANDS)
        .map(|i| NewCommand::new("slow.noop", serde_json::json!({ "i": i })))
        .collect();
    queue.schedule_many(&commands).await.unwrap();
    let runs = Arc::new(Mutex::new(0usize));
    let counter = runs.clone();
    let mut registry = Registry::new();
    registry
        .insert(
            "slow.noop",
            Arc::new(FnHandler(move |_job: Job| {
                let counter = counter.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    *counter.lock().unwrap() += 1;
                    Ok(())
                }
            })),
        )
        .unwrap();
    let mut processor = Processor::new(registry);
    let settings = Settings::default()
        .with_lease_seconds(5)
        .with_polling_interval_seconds(0.2)
        .with_concurrency(8)
        .with_batch_size(20);
    processor.add_source(queue.source_handle(settings));
    let run = tokio::spawn(async move {
        processor
            .run(
                RunOptions::default().with_until_idle(true),
                CancellationToken::new(),
            )
            .await
    });
    // The outage hits once the drain is under way, however slowly this machine starts it.
    let under_way = std::time::Instant::now() + Duration::from_secs(60);
    while *runs.lock().unwrap() < 50 {
        assert!(
            std::time::Instant::now() < under_way,
            "the drain never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = *runs.lock().unwrap();
    assert!(
        before > 0 && before < COMMANDS,
        "the outage hits mid-drain ({before} done)"
    );
    outage.await;
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("drained within 2 minutes of the outage")
        .unwrap()
        .expect("the processor kept running through the outage");
    let (t, p) = (db.all_rows(), db.q("ProcessedAt"));
    assert_eq!(
        db.scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {p} IS NOT NULL"))
            .await,
        COMMANDS as i64,
        "every command completed"
    );
    let ran = *runs.lock().unwrap();
    assert!(ran >= COMMANDS, "at least once: {ran}");
    eprintln!(
        "{engine}: {ran} executions for {COMMANDS} commands ({} re-run after the outage)",
        ran - COMMANDS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_mid_drain_loses_nothing() {
    drain_through("postgres", async {
        let version = std::fs::read_dir("/etc/postgresql")
            .expect("a Debian PostgreSQL cluster in /etc/postgresql")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .next()
            .expect("a cluster version");
        let status = tokio::process::Command::new("pg_ctlcluster")
            .args([
                "--skip-systemctl-redirect",
                &version,
                "main",
                "restart",
                "-m",
                "fast",
            ])
            .status()
            .await
            .expect("run pg_ctlcluster");
        assert!(status.success(), "PostgreSQL restarted");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_connections_killed_mid_drain_loses_nothing() {
    use sqlx::Connection;
    drain_through("mysql", async {
        let admin = std::env::var("ICQ_TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
        let mut conn = sqlx::MySqlConnection::connect(&admin).await.unwrap();
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST WHERE DB LIKE 'icqt_outage_%' AND ID <> CONNECTION_ID()",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert!(!ids.is_empty(), "the processor's connections are visible");
        for id in ids {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}"))).execute(&mut conn).await;
        }
    })
    .await;
}
