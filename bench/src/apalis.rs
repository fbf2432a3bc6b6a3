//! apalis-postgres 1.0: `PostgresStorage::new` with its default `Config` (batch 10,
//! polling), a default `WorkerBuilder` worker and a no-op handler; backlog pushed with
//! `push_bulk`; drained until no row of `apalis.jobs` is short of `Done`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use apalis_core::backend::TaskSink;
use apalis_core::error::BoxDynError;
use apalis_core::worker::builder::WorkerBuilder;
use apalis_core::worker::context::WorkerContext;
use apalis_postgres::PostgresStorage;
use serde::{Deserialize, Serialize};

use crate::db::{self, FreshDb};
use crate::{Drain, Opts};

pub const VERSION: &str = "1.0.0";

static HANDLED: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Noop {}

async fn noop(_job: Noop) -> Result<(), BoxDynError> {
    HANDLED.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

const LEFT: &str = "SELECT count(*) FROM apalis.jobs WHERE status <> 'Done'";

pub async fn run(opts: &Opts) -> Result<Drain> {
    let db = FreshDb::postgres(&opts.pg_server).await?;
    let result = drain(&db, opts.jobs, opts.timeout()).await;
    db.drop_db(opts.keep_databases).await?;
    result
}

async fn drain(db: &FreshDb, jobs: usize, timeout: Duration) -> Result<Drain> {
    HANDLED.store(0, Ordering::Relaxed);
    let pool = db.pg_pool(10).await?;
    PostgresStorage::<()>::setup(&pool)
        .await
        .context("apalis-postgres setup (migrations)")?;
    let mut backend = PostgresStorage::<Noop>::new(&pool);
    let mut left = jobs;
    while left > 0 {
        let n = left.min(5_000);
        backend
            .push_bulk(vec![Noop {}; n])
            .await
            .map_err(|e| anyhow::anyhow!("apalis-postgres push_bulk: {e}"))?;
        left -= n;
    }
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM apalis.jobs")
        .fetch_one(&pool)
        .await?;
    anyhow::ensure!(
        queued as usize == jobs,
        "apalis.jobs holds {queued} rows, expected {jobs}"
    );
    db::settle_postgres(&pool, &["apalis.jobs"]).await?;

    let ctx = WorkerContext::new("icq-bench-apalis");
    let worker = WorkerBuilder::new(&ctx).backend(backend).build(noop);

    let start = Instant::now();
    let run = worker.run();
    tokio::pin!(run);
    let waited = tokio::select! {
        ran = &mut run => {
            ran.map_err(|e| anyhow::anyhow!("apalis worker: {e}"))?;
            anyhow::bail!("apalis worker stopped before draining its backlog");
        }
        waited = crate::wait_until(timeout, || async {
            let left: i64 = sqlx::query_scalar(LEFT).fetch_one(&pool).await?;
            Ok(left == 0)
        }) => waited,
    };
    let seconds = start.elapsed().as_secs_f64();
    ctx.stop()
        .map_err(|e| anyhow::anyhow!("stopping the apalis worker: {e}"))?;
    run.await
        .map_err(|e| anyhow::anyhow!("apalis worker (shutting down): {e}"))?;
    waited.with_context(|| format!("apalis-postgres did not drain {jobs} jobs"))?;

    let unfinished: i64 = sqlx::query_scalar(LEFT).fetch_one(&pool).await?;
    pool.close().await;
    Ok(Drain {
        seconds,
        unfinished: unfinished as u64,
        handled: Some(HANDLED.load(Ordering::Relaxed)),
        claimed_twice: None,
    })
}
