//! Prometheus metrics for `icq work --metrics-addr`: installs the exporter (its own HTTP
//! listener serving the text format on any path, conventionally `/metrics`) and keeps
//! the per-source pending gauges fresh.
//!
//! Series (all prefixed `icq_internal_commands_`): `claimed_total`, `succeeded_total`,
//! `failed_total` (attempts that will be retried), `dead_lettered_total`,
//! `stale_stamps_total` (outcomes dropped because the lease had moved on) — each labelled
//! by `source`; `execution_seconds` (histogram by `source`, `type`, `outcome`); and
//! `pending` (gauge by `source`, `state` = `due` | `running`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::engine::Backend;
use crate::error::{Error, Result};

/// Execution-time buckets, in seconds: 1 ms to 5 minutes.
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Starts serving Prometheus metrics on `addr`. Call once per process, inside the runtime.
pub fn serve(addr: SocketAddr) -> Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            Matcher::Full("icq_internal_commands_execution_seconds".into()),
            BUCKETS,
        )
        .map_err(|e| Error::Usage(format!("metrics buckets: {e}")))?
        .install()
        .map_err(|e| Error::Usage(format!("cannot serve metrics on {addr}: {e}")))?;
    metrics::describe_counter!("icq_internal_commands_claimed_total", "Rows claimed");
    metrics::describe_counter!("icq_internal_commands_succeeded_total", "Rows completed");
    metrics::describe_counter!(
        "icq_internal_commands_failed_total",
        "Failed attempts scheduled for retry"
    );
    metrics::describe_counter!(
        "icq_internal_commands_dead_lettered_total",
        "Rows dead-lettered"
    );
    metrics::describe_counter!(
        "icq_internal_commands_stale_stamps_total",
        "Outcomes dropped: lease expired and taken over"
    );
    metrics::describe_histogram!(
        "icq_internal_commands_execution_seconds",
        metrics::Unit::Seconds,
        "Handler execution time"
    );
    metrics::describe_gauge!(
        "icq_internal_commands_pending",
        "Pending rows by state (due, running)"
    );
    Ok(())
}

/// Refreshes the `pending` gauges of each source every `every` until the task is aborted.
pub fn spawn_pending_gauges(
    sources: Vec<(Arc<str>, Arc<dyn Backend>)>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            for (name, backend) in &sources {
                match backend.activity().await {
                    Ok(activity) => {
                        metrics::gauge!("icq_internal_commands_pending", "source" => name.to_string(), "state" => "due")
                            .set(activity.due as f64);
                        metrics::gauge!("icq_internal_commands_pending", "source" => name.to_string(), "state" => "running")
                            .set(activity.running as f64);
                    }
                    Err(err) => {
                        tracing::debug!(source = %name, error = %err, "cannot refresh pending gauges")
                    }
                }
            }
            tokio::time::sleep(every).await;
        }
    })
}
