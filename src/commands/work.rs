//! `icq work`: runs the processor for every configured source in the foreground.
//!
//! Signals. The first SIGINT, SIGTERM, SIGHUP or SIGQUIT (or SIGUSR1, SIGUSR2, SIGALRM,
//! whose default would kill the worker on the spot and orphan its handlers) is a graceful
//! stop: no new claims, claimed-but-unstarted rows released at once, running commands
//! given `--grace-seconds`; then the exit code is 0. A second one ends the grace at once:
//! the commands still running are stopped (an exec handler's process group killed and
//! reaped), released with their attempt given back, every stamp written, and only then
//! does `icq work` exit, with 128 + the second signal's number (130 for a second Ctrl-C,
//! 143 for SIGTERM), the shell's code for "ended by a signal", so a supervisor can tell a
//! cut-short stop from a clean one. Later signals are only logged: the process never exits
//! with a handler alive. (With the database unreachable, the releases are retried only
//! while the leases could be held; the rows then run again after their lease, as after a
//! crash, but never alongside a handler of this worker.) SIGPIPE is ignored (Rust's runtime does so at startup; a closed
//! pipe is an error on the write instead). SIGKILL cannot be caught: on Linux exec
//! handlers die with the worker all the same (see [`icq::handler::exec`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::{Args, ValueEnum};
use futures::StreamExt;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use icq::RunOptions;

/// Arguments of `icq work`.
#[derive(Debug, Args)]
pub struct WorkArgs {
    /// Exit 0 once nothing is due or running (commands scheduled for later do not keep
    /// it alive).
    #[arg(long)]
    pub until_idle: bool,

    /// With --until-idle: exit 1 if this run dead-lettered any command, saying how many.
    #[arg(long, requires = "until_idle")]
    pub fail_on_dead: bool,

    /// How long in-flight commands may run after SIGINT/SIGTERM/SIGHUP/SIGQUIT before they
    /// are stopped and their leases released for another replica; a second signal ends it
    /// at once (0 to 86400).
    #[arg(
        long,
        default_value_t = 30.0,
        value_name = "SECONDS",
        value_parser = parse_grace_seconds,
        allow_negative_numbers = true
    )]
    pub grace_seconds: f64,

    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// Log format on stderr (default: json under `--format json`, text otherwise).
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
}

impl WorkArgs {
    /// The log format in effect: `--log-format`, else JSON lines when the global
    /// `--format json` asks for machine-readable output, else text.
    pub fn effective_log_format(&self, format: super::Format) -> LogFormat {
        match (self.log_format, format) {
            (Some(chosen), _) => chosen,
            (None, super::Format::Json) => LogFormat::Json,
            (None, super::Format::Table) => LogFormat::Text,
        }
    }
}

/// The longest `--grace-seconds`: one day.
pub const MAX_GRACE_SECONDS: f64 = 86_400.0;

/// `--grace-seconds`: a finite number of seconds from 0 to [`MAX_GRACE_SECONDS`].
pub fn parse_grace_seconds(text: &str) -> Result<f64, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds (e.g. 30 or 2.5)"))?;
    if !seconds.is_finite() {
        return Err(format!(
            "must be a finite number of seconds from 0 to {MAX_GRACE_SECONDS} (got {text})"
        ));
    }
    if seconds < 0.0 {
        return Err(format!("must not be negative (got {text})"));
    }
    if seconds > MAX_GRACE_SECONDS {
        return Err(format!(
            "must be at most {MAX_GRACE_SECONDS} seconds, one day (got {text})"
        ));
    }
    Ok(seconds)
}

/// How `icq work` writes its logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the log subscriber on stderr in `format`: see
/// [`crate::cli::telemetry::init_logging`] (non-blocking; keep the guard until exit).
fn init_logging(
    format: LogFormat,
    otel: Option<&crate::cli::telemetry::Otel>,
) -> crate::cli::telemetry::LogGuard {
    crate::cli::telemetry::init_logging(format == LogFormat::Json, otel)
}

/// The signals that stop `icq work`: graceful on the first, hard on the second.
const STOP_SIGNALS: [(SignalKind, &str); 7] = [
    (SignalKind::interrupt(), "SIGINT"),
    (SignalKind::terminate(), "SIGTERM"),
    (SignalKind::hangup(), "SIGHUP"),
    (SignalKind::quit(), "SIGQUIT"),
    (SignalKind::user_defined1(), "SIGUSR1"),
    (SignalKind::user_defined2(), "SIGUSR2"),
    (SignalKind::alarm(), "SIGALRM"),
];

/// Watches [`STOP_SIGNALS`]: the first cancels `graceful`, the second `hard` (and is
/// recorded, for the exit code); later ones are logged. The handlers are installed before
/// this returns, so none of these signals can kill the process from then on.
fn stop_on_signals(
    graceful: CancellationToken,
    hard: CancellationToken,
) -> std::io::Result<Arc<OnceLock<i32>>> {
    let forced = Arc::new(OnceLock::new());
    let mut streams = Vec::with_capacity(STOP_SIGNALS.len());
    for (kind, name) in STOP_SIGNALS {
        let stream = signal(kind).map_err(|err| {
            std::io::Error::new(err.kind(), format!("cannot watch {name}: {err}"))
        })?;
        streams.push((stream, kind, name));
    }
    let received = futures::stream::select_all(
        streams
            .into_iter()
            .map(|(stream, kind, name)| tokio_stream_of(stream).map(move |()| (kind, name))),
    );
    let recorded = forced.clone();
    tokio::spawn(async move {
        tokio::pin!(received);
        let mut round = 0;
        while let Some((kind, name)) = received.next().await {
            round += 1;
            match round {
                1 => {
                    tracing::info!(
                        signal = name,
                        "stopping: no new claims; finishing in-flight commands (a second signal stops them now)"
                    );
                    graceful.cancel();
                }
                2 => {
                    tracing::warn!(
                        signal = name,
                        "second signal: stopping the commands still running, releasing their leases, then exiting"
                    );
                    let _ = recorded.set(128 + kind.as_raw_value());
                    graceful.cancel();
                    hard.cancel();
                }
                _ => {
                    tracing::warn!(
                        signal = name,
                        "already stopping: the running commands are being stopped and their releases written"
                    );
                }
            }
        }
    });
    Ok(forced)
}

/// A stream that yields once per delivery of `signal`.
fn tokio_stream_of(
    mut signal: tokio::signal::unix::Signal,
) -> impl futures::Stream<Item = ()> + Unpin {
    Box::pin(futures::stream::poll_fn(move |cx| signal.poll_recv(cx)))
}

/// Runs the processor until a signal (or idle, with `--until-idle`).
pub async fn run(args: WorkArgs, global: &super::GlobalArgs) -> anyhow::Result<()> {
    // OpenTelemetry first (its layer joins the log subscriber); dropped last, after the
    // processor has stamped everything, so the final spans and metrics are flushed.
    let otel = crate::cli::telemetry::init_otel()?;
    let _logs = init_logging(args.effective_log_format(global.format), otel.as_ref());
    let work = crate::cli::worker::Work::open(&global.source_request()).await?;
    if let Some(addr) = args.metrics_addr {
        crate::cli::telemetry::serve(addr)?;
        tracing::info!(%addr, "serving Prometheus metrics");
    }
    let gauges = (args.metrics_addr.is_some() || otel.is_some()).then(|| {
        crate::cli::telemetry::spawn_pending_gauges(work.sources(), Duration::from_secs(2))
    });
    let health_gauges = (args.metrics_addr.is_some() || otel.is_some()).then(|| {
        use crate::cli::telemetry::{HEALTH_EVERY, spawn_health_gauges};
        spawn_health_gauges(work.sources(), HEALTH_EVERY)
    });
    let (shutdown, hard_stop) = (CancellationToken::new(), CancellationToken::new());
    let forced = stop_on_signals(shutdown.clone(), hard_stop.clone())?;
    let mut options = RunOptions::default();
    options.until_idle = args.until_idle;
    options.shutdown_grace = Duration::from_secs_f64(args.grace_seconds.max(0.0));
    options.hard_stop = hard_stop;
    let progress = args.until_idle.then(|| {
        super::progress::RunProgress::start(
            work.sources()
                .iter()
                .map(|s| s.queue.stats().clone())
                .collect(),
            None,
        )
    });
    let outcome = work.run(options, shutdown).await;
    if let Some(progress) = progress {
        progress.finish();
    }
    for gauges in [gauges, health_gauges].into_iter().flatten() {
        gauges.abort();
    }
    let summary = outcome?;
    if let Some(&code) = forced.get() {
        // Every handler is stopped and reaped and every stamp written: exiting now leaves
        // nothing running.
        tracing::warn!(
            exit_code = code,
            "stopped by a second signal: the commands cut short were released"
        );
        std::process::exit(code);
    }
    let dead_lettered = summary.dead_lettered();
    if args.fail_on_dead && dead_lettered > 0 {
        return Err(crate::cli::error::CliError::DeadLettered {
            count: dead_lettered,
        }
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_seconds_must_be_finite_and_in_range() {
        assert_eq!(parse_grace_seconds("0"), Ok(0.0));
        assert_eq!(parse_grace_seconds("2.5"), Ok(2.5));
        assert_eq!(parse_grace_seconds("86400"), Ok(86_400.0));
        for (text, wanted) in [
            ("inf", "finite"),
            ("NaN", "finite"),
            ("1e20", "at most 86400"),
            ("86400.5", "at most 86400"),
            ("-1", "must not be negative"),
            ("-0.001", "must not be negative"),
            ("soon", "not a number"),
        ] {
            let err = parse_grace_seconds(text).unwrap_err();
            assert!(err.contains(wanted), "{text}: {err}");
        }
    }
}
