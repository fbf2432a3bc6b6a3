//! `icq bench`: measures enqueue, drain, idle latency and memory on a scratch table
//! (see `crate::cli::bench`), then prints the figures.

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::cli::bench::BenchOptions;
use crate::cli::config::DatabaseUrl;
use crate::cli::error::CliError;
use crate::cli::output;
use icq::error::Error;

/// Arguments of `icq bench`.
#[derive(Debug, Args)]
#[command(
    after_help = "The database is the one --database-url names, or else the embedded \
    default; icq bench never reads icq.yaml or $DATABASE_URL, so it writes only where it was \
    told to. It works on a scratch table icq_bench_<hex> that it creates and drops again \
    (also on failure or Ctrl-C). Every setting is icq's default except --concurrency."
)]
pub struct BenchArgs {
    /// Commands enqueued in bulk and drained (a tenth of this, at least 100, is also
    /// enqueued one transaction per command first).
    #[arg(long, default_value_t = 20_000, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=crate::cli::bench::MAX_JOBS))]
    pub jobs: u64,

    /// Execution slots of the drain worker (default: the settings default, 8).
    #[arg(long, value_name = "C", value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: Option<u32>,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: BenchArgs, global: &super::GlobalArgs) -> anyhow::Result<()> {
    if global.config.is_some() || global.source.is_some() {
        return Err(CliError::Usage(
            "icq bench works on the database --database-url names (or the embedded default), \
             not on a configured source: pass --database-url URL instead of --config/--source"
                .into(),
        )
        .into());
    }
    let url = match &global.database_url {
        Some(url) => DatabaseUrl::new(url.clone()),
        None => crate::cli::config::embedded_default()?.url,
    };
    let worker = std::env::current_exe().map_err(Error::io("locating the icq binary"))?;
    let mut options = BenchOptions::new(url, worker);
    options.jobs = args.jobs;
    options.concurrency = args.concurrency;

    let interrupt = CancellationToken::new();
    let signals = stop_on_signals(interrupt.clone());
    let progress = output::progress();
    let report = crate::cli::bench::run(&options, progress.as_ref(), interrupt).await;
    signals.abort();
    output::emit(global.format, &report?)?;
    Ok(())
}

/// Cancels `token` on SIGINT or SIGTERM (the benchmark then drops its scratch tables and
/// exits); a second signal exits at once.
fn stop_on_signals(token: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            return;
        };
        for round in 0.. {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            if round == 0 {
                output::note(
                    "stopping: dropping the scratch tables (press Ctrl-C again to exit now)",
                );
                token.cancel();
            } else {
                std::process::exit(130);
            }
        }
    })
}
