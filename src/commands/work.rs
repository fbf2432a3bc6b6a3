//! `icq work`: runs the processor for every configured source in the foreground.

use std::time::Duration;

use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;

use crate::processor::RunOptions;

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

    /// How long in-flight commands may run after SIGINT/SIGTERM before their leases are
    /// released for another replica (0 to 86400).
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
/// [`crate::telemetry::init_logging`] (non-blocking; keep the guard until exit).
fn init_logging(format: LogFormat) -> crate::telemetry::LogGuard {
    crate::telemetry::init_logging(format == LogFormat::Json)
}

/// Cancels `token` on SIGINT or SIGTERM; a second signal exits at once.
fn stop_on_signals(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot watch SIGTERM");
                    return;
                }
            };
        for round in 0.. {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            if round == 0 {
                tracing::info!("stopping: no new claims; finishing in-flight commands");
                token.cancel();
            } else {
                tracing::warn!("second signal: exiting now; unfinished leases will expire");
                std::process::exit(130);
            }
        }
    });
}

/// Runs the processor until a signal (or idle, with `--until-idle`).
pub async fn run(args: WorkArgs, global: &super::GlobalArgs) -> anyhow::Result<()> {
    let _logs = init_logging(args.effective_log_format(global.format));
    let work = crate::worker::Work::open(&global.source_request()).await?;
    let gauges = match args.metrics_addr {
        Some(addr) => {
            crate::telemetry::serve(addr)?;
            tracing::info!(%addr, "serving Prometheus metrics");
            Some(crate::telemetry::spawn_pending_gauges(
                work.sources(),
                Duration::from_secs(2),
            ))
        }
        None => None,
    };
    let shutdown = CancellationToken::new();
    stop_on_signals(shutdown.clone());
    let options = RunOptions {
        until_idle: args.until_idle,
        shutdown_grace: Duration::from_secs_f64(args.grace_seconds.max(0.0)),
    };
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
    if let Some(gauges) = gauges {
        gauges.abort();
    }
    let summary = outcome?;
    let dead_lettered = summary.dead_lettered();
    if args.fail_on_dead && dead_lettered > 0 {
        return Err(crate::Error::DeadLettered {
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
