//! Drain throughput of one processor on each engine: N no-op commands scheduled through
//! the bulk path, then processed until idle. Run with `cargo bench --bench throughput`;
//! `ICQ_BENCH_N` sets N (default 20000). Needs the local test servers (see README).
//!
//! Figures are printed side by side from one run, as ratios to PostgreSQL, because the
//! machines this runs on are noisy.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use icq::ConnectOptions;
use icq::{NewCommand, Processor, Queue, Registry, RunOptions, Settings, TableName};
use tokio_util::sync::CancellationToken;

async fn drain(engine: &'static str, n: usize) -> (Duration, Duration) {
    let db = support::TestDb::with_table(engine, "bench").await;
    let queue = Queue::connect(
        "bench",
        &db.url,
        &TableName::default(),
        &ConnectOptions::default(),
    )
    .await
    .expect("connect");
    let commands: Vec<NewCommand> = (0..n)
        .map(|i| NewCommand::new("bench.noop", serde_json::json!({ "i": i })))
        .collect();
    let started = Instant::now();
    queue.schedule_many(&commands).await.expect("schedule");
    let scheduled = started.elapsed();
    let mut registry = Registry::new();
    registry
        .insert("bench.noop", Arc::new(icq::handler::Noop))
        .expect("register");
    let mut processor = Processor::new(registry);
    processor.add_source(
        queue.source_handle(
            Settings::default()
                .with_batch_size(200)
                .with_concurrency(64)
                .with_polling_interval_seconds(0.1),
        ),
    );
    let started = Instant::now();
    processor
        .run(
            RunOptions::default().with_until_idle(true),
            CancellationToken::new(),
        )
        .await
        .expect("run");
    (scheduled, started.elapsed())
}

fn main() {
    let n: usize = std::env::var("ICQ_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows = Vec::new();
    for engine in ["postgres", "sqlite", "mysql"] {
        let (schedule, drain) = runtime.block_on(drain(engine, n));
        rows.push((engine, schedule, drain));
    }
    let base = rows[0].2.as_secs_f64();
    println!("{n} no-op commands, one processor (batch 200, concurrency 64)");
    println!(
        "{:<10} {:>14} {:>14} {:>14} {:>10}",
        "engine", "schedule/s", "drain", "drain/s", "vs pg"
    );
    for (engine, schedule, drain) in rows {
        println!(
            "{engine:<10} {:>14.0} {:>13.2}s {:>14.0} {:>9.2}x",
            n as f64 / schedule.as_secs_f64(),
            drain.as_secs_f64(),
            n as f64 / drain.as_secs_f64(),
            base / drain.as_secs_f64(),
        );
    }
}
