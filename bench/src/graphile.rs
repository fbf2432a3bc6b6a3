//! graphile_worker 0.14 (the Rust port): concurrency 10, its LocalQueue (batch fetching)
//! and batched completions/failures on, a no-op task; backlog added with its own bulk
//! `add_raw_jobs`; drained until `_private_jobs` is empty (it deletes completed jobs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use graphile_worker::{
    IntoTaskHandlerResult, JobSpec, LocalQueueConfig, RawJobSpec, TaskHandler, WorkerContext,
    WorkerOptions,
};
use serde::{Deserialize, Serialize};

use crate::db::{self, FreshDb};
use crate::{Drain, Opts};

pub const VERSION: &str = "0.14.1";
pub const CONCURRENCY: usize = 10;
/// The flush delay graphile_worker's docs suggest ("a small value like 1-5ms").
pub const BATCH_DELAY: Duration = Duration::from_millis(5);

static HANDLED: AtomicU64 = AtomicU64::new(0);

#[derive(Serialize, Deserialize)]
struct Noop {}

impl TaskHandler for Noop {
    const IDENTIFIER: &'static str = "bench_noop";

    async fn run(self, _ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        HANDLED.fetch_add(1, Ordering::Relaxed);
        Ok::<(), String>(())
    }
}

pub async fn run(opts: &Opts) -> Result<Drain> {
    let db = FreshDb::postgres(&opts.pg_server).await?;
    let result = drain(&db, opts.jobs, opts.timeout()).await;
    db.drop_db(opts.keep_databases).await?;
    result
}

async fn drain(db: &FreshDb, jobs: usize, timeout: Duration) -> Result<Drain> {
    HANDLED.store(0, Ordering::Relaxed);
    let worker = WorkerOptions::default()
        .database_url(&db.url())
        .schema("graphile_worker")
        .concurrency(CONCURRENCY)
        .define_job::<Noop>()
        .local_queue(LocalQueueConfig::default())
        .complete_job_batch_delay(BATCH_DELAY)
        .fail_job_batch_delay(BATCH_DELAY)
        .listen_os_shutdown_signals(false)
        .init()
        .await
        .context("graphile_worker init (connect + migrate)")?;

    let utils = worker.create_utils();
    let specs: Vec<RawJobSpec> = (0..jobs)
        .map(|_| RawJobSpec {
            identifier: Noop::IDENTIFIER.to_owned(),
            payload: serde_json::json!({}),
            spec: JobSpec::default(),
        })
        .collect();
    for chunk in specs.chunks(5_000) {
        utils
            .add_raw_jobs(chunk)
            .await
            .context("graphile_worker add_raw_jobs")?;
    }
    drop(specs);

    let pool = db.pg_pool(2).await?;
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM graphile_worker._private_jobs")
        .fetch_one(&pool)
        .await?;
    anyhow::ensure!(
        queued as usize == jobs,
        "graphile_worker holds {queued} jobs, expected {jobs}"
    );
    db::settle_postgres(&pool, &["graphile_worker._private_jobs"]).await?;

    let start = Instant::now();
    let run = worker.run();
    tokio::pin!(run);
    let waited = tokio::select! {
        ran = &mut run => {
            ran.context("graphile_worker run")?;
            anyhow::bail!("graphile_worker stopped before draining its backlog");
        }
        waited = crate::wait_until(timeout, || async {
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM graphile_worker._private_jobs")
                .fetch_one(&pool)
                .await?;
            Ok(left == 0)
        }) => waited,
    };
    let seconds = start.elapsed().as_secs_f64();
    worker.request_shutdown();
    run.await.context("graphile_worker run (shutting down)")?;
    waited.with_context(|| format!("graphile_worker did not drain {jobs} jobs"))?;

    let unfinished: i64 = sqlx::query_scalar("SELECT count(*) FROM graphile_worker._private_jobs")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    Ok(Drain {
        seconds,
        unfinished: unfinished as u64,
        handled: Some(HANDLED.load(Ordering::Relaxed)),
        claimed_twice: None,
    })
}
