//! Metrics and logs for `icq work`.
//!
//! **Metrics** (`--metrics-addr`): a Prometheus recorder whose text rendering is served by a
//! small HTTP/1.1 listener answering `GET /metrics` (and `HEAD`) only: any other path is a
//! 404, any other method on `/metrics` a 405. The per-source pending gauges are refreshed
//! by [`spawn_pending_gauges`].
//!
//! Series (all prefixed `icq_internal_commands_`): `claimed_total`, `succeeded_total`,
//! `failed_total` (attempts that will be retried), `dead_lettered_total`,
//! `stale_stamps_total` (outcomes dropped because the lease had moved on) — each labelled
//! by `source`; `lost_races_total` (by `source` and `role`: deadlocks and Galera
//! certification conflicts, retried); `execution_seconds` (histogram by `source`, `type`, `outcome`); and
//! `pending` (gauge by `source`, `state` = `due` | `running`). Every
//! [`HEALTH_EVERY`], [`spawn_health_gauges`] samples each source's health (the figures of
//! `icq doctor`) into `table_bytes` (by `source`, `table` = `commands` | `history`),
//! `dead_rows`, `xmin_holder_age_seconds` (the transaction holding back cleanup; 0 when
//! none), `long_transactions` and `oldest_due_wait_seconds` (0 when nothing is due),
//! each by `source`; the same go to OpenTelemetry as `icq.table.size`,
//! `icq.table.dead_rows`, `icq.xmin_holder.age`, `icq.transactions.long` and
//! `icq.due.oldest_wait`.
//!
//! **Logs**: [`init_logging`] installs the subscriber on stderr through a non-blocking,
//! lossy writer (tracing-appender): a line is handed to a writer thread through a bounded
//! queue of [`LOG_QUEUE_LINES`] (`ICQ_LOG_QUEUE_LINES` sets another length), and when that is full (stderr is a pipe nobody reads, a
//! stalled terminal) the line is dropped and counted, never waited for. Logging therefore
//! never blocks the runtime: commands keep running and SIGTERM is honoured however stuck
//! stderr is. Dropped lines are the `icq_log_lines_dropped_total` counter, and once the
//! sink drains a warning says how many were lost. The [`LogGuard`] flushes what is queued
//! at exit, waiting at most [`FLUSH_WITHIN`].
//!
//! **OpenTelemetry** ([`init_otel`]): OTLP over HTTP/protobuf from the `OTEL_*`
//! variables. A collector that cannot be reached is warned about once, naming the
//! endpoint (redacted) and what to check: at startup when nothing accepts a connection on
//! its port, or at the first failed export; further failures to the same collector are
//! not logged again (the exports are retried at their intervals all the same).
//!
//! [`escaping_fields`] formats the fields of text log lines with every control
//! character escaped, so text a handler controls (its stderr, a response body) cannot
//! forge a log line.

use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

use icq::error::{Error, Result};

/// Execution-time buckets, in seconds: 1 ms to 5 minutes.
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The only path the metrics listener serves.
pub const METRICS_PATH: &str = "/metrics";

/// The Prometheus text exposition format's content type.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long a client may take to send a request's head before the connection is dropped.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the recorder's upkeep (histogram bucket maintenance) runs.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Log lines queued for the writer thread before new ones are dropped (a few MB of
/// text); [`LOG_QUEUE_ENV`] sets another number.
pub const LOG_QUEUE_LINES: usize = 8_192;

/// The variable that sets how many log lines may wait for stderr (1 to 1,000,000).
pub const LOG_QUEUE_ENV: &str = "ICQ_LOG_QUEUE_LINES";

/// The queue length in effect: [`LOG_QUEUE_ENV`] when it holds a number from 1 to
/// 1,000,000, else [`LOG_QUEUE_LINES`].
fn log_queue_lines() -> usize {
    std::env::var(LOG_QUEUE_ENV)
        .ok()
        .and_then(|text| text.trim().parse::<usize>().ok())
        .filter(|lines| (1..=1_000_000).contains(lines))
        .unwrap_or(LOG_QUEUE_LINES)
}

/// The longest [`LogGuard`] waits at exit for queued lines to reach stderr.
pub const FLUSH_WITHIN: Duration = Duration::from_secs(2);

/// How often dropped log lines are counted into the metric (and, once stderr drains,
/// reported).
const DROPPED_CHECK_EVERY: Duration = Duration::from_secs(1);

/// The counter of log lines dropped because stderr did not take them.
pub const DROPPED_LINES_METRIC: &str = "icq_log_lines_dropped_total";

/// Keeps the log writer thread alive; dropping it reports the lines lost, if any, and
/// flushes the queue within [`FLUSH_WITHIN`] (never longer, even if stderr is blocked).
pub struct LogGuard {
    guard: Option<tracing_appender::non_blocking::WorkerGuard>,
    dropped: tracing_appender::non_blocking::ErrorCounter,
    watch: Option<tokio::task::JoinHandle<()>>,
    reported: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.abort();
        }
        let dropped = self.dropped.dropped_lines();
        let reported = self.reported.load(std::sync::atomic::Ordering::Relaxed);
        metrics::counter!(DROPPED_LINES_METRIC).absolute(dropped as u64);
        if dropped > reported {
            tracing::warn!(
                dropped = dropped - reported,
                total = dropped,
                "log lines were dropped: stderr did not take them fast enough"
            );
        }
        let Some(guard) = self.guard.take() else {
            return;
        };
        // The guard's own drop waits up to ~1.1 s and then prints to stdout, which could
        // block too: drop it on a thread of its own and stop waiting after FLUSH_WITHIN.
        let (done, flushed) = std::sync::mpsc::channel();
        let flushing = std::thread::Builder::new()
            .name("icq-log-flush".into())
            .spawn(move || {
                drop(guard);
                let _ = done.send(());
            });
        if flushing.is_ok() {
            let _ = flushed.recv_timeout(FLUSH_WITHIN);
        }
    }
}

/// Installs the log subscriber on stderr, text or JSON lines (`RUST_LOG` filters, default
/// `icq=info`), writing through a non-blocking lossy writer (see the module docs). Call
/// once, inside the runtime; keep the guard until the process is about to exit.
///
/// With `otel` (see [`init_otel`]) the OpenTelemetry layer joins: it exports the execution
/// spans ([`icq::otel::SPAN_TARGET`]) and nothing else, and the log lines never include
/// them. How the filters are laid out, and why: `log_dispatch`.
pub fn init_logging(json: bool, otel: Option<&Otel>) -> LogGuard {
    use tracing_subscriber::util::SubscriberInitExt;

    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(log_queue_lines())
        .thread_name("icq-log")
        .finish(std::io::stderr());
    let dropped = writer.error_counter();
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let _ = log_dispatch(json, colour, otel, writer).try_init();
    // Once warnings can be seen: whether the collector listens at all.
    if let Some(otel) = otel {
        otel.unreachable.probe(&otel.endpoints);
    }
    let reported = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watch = tokio::runtime::Handle::try_current()
        .ok()
        .map(|runtime| runtime.spawn(watch_dropped(dropped.clone(), reported.clone())));
    LogGuard {
        guard: Some(guard),
        dropped,
        watch,
        reported,
    }
}

/// The subscriber [`init_logging`] installs, writing to `writer`.
///
/// `RUST_LOG` (default `icq=info`) is one **global** filter, outermost, so whatever it
/// rejects never reaches a layer. Without OpenTelemetry it is the only filter: it also
/// turns [`icq::otel::SPAN_TARGET`] off, so the execution spans and metrics cost nothing
/// (`tracing::enabled!` says no) and no layer filters on its own.
///
/// A per-layer filter (`Layer::with_filter`) is used only to split the log lines from the
/// OpenTelemetry spans, and only when both layers are there. Per-layer filters keep the
/// verdict of an `enabled` call in a thread-local until the event or span it was for is
/// recorded; a check that is never followed by one (`tracing::enabled!`, `log_enabled!`
/// through the `log` bridge: sqlx asks it for every server notice) leaves a stale "off",
/// and the next event whose callsite is always enabled skips the `enabled` call, reads
/// that stale verdict and is dropped. With the fmt layer alone behind a per-layer filter
/// (and an absent OpenTelemetry layer making the filtered-out callsites "sometimes"),
/// every command's metrics check swallowed whatever line came next on that worker
/// thread, among them a replica's one "PostgreSQL failover: now using …". When both
/// layers are there their filters are complementary (the fmt layer takes everything but
/// the span target, OpenTelemetry only that), so no callsite is always enabled for both:
/// every event asks `enabled` first, which overwrites any stale verdict.
pub(crate) fn log_dispatch<W>(
    json: bool,
    colour: bool,
    otel: Option<&Otel>,
    writer: W,
) -> tracing::Dispatch
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("icq=info"));
    let spans = |level: &str| {
        format!("{}={level}", icq::otel::SPAN_TARGET)
            .parse()
            .expect("a valid directive")
    };
    let Some(otel) = otel else {
        let filter = filter.add_directive(spans("off"));
        return tracing_subscriber::registry()
            .with(fmt_layer(json, colour, writer))
            .with(filter)
            .into();
    };
    let filter = filter.add_directive(spans("info"));
    let not_spans = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_target(icq::otel::SPAN_TARGET, LevelFilter::OFF);
    let otel_layer = tracing_opentelemetry::layer()
        .with_tracer(otel.tracer.clone())
        // The spans carry the messaging attributes only, not the code location,
        // thread or busy/idle timings of tracing-opentelemetry's defaults.
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(Targets::new().with_target(icq::otel::SPAN_TARGET, tracing::Level::INFO));
    tracing_subscriber::registry()
        .with(fmt_layer(json, colour, writer).with_filter(not_spans))
        .with(otel_layer)
        .with(filter)
        .into()
}

/// The log-line layer: text with escaped fields, or JSON.
fn fmt_layer<S, W>(
    json: bool,
    colour: bool,
    writer: W,
) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer;

    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(writer)
        // A failed write is reported with `eprintln!`, which panics when stderr is
        // closed (`icq work 2>&1 | head -0`): a lost log line is not an error.
        .log_internal_errors(false);
    if json {
        fmt.json().boxed()
    } else {
        // Escaped fields: handler stderr and response bodies cannot forge log lines.
        fmt.fmt_fields(escaping_fields()).boxed()
    }
}

/// Every [`DROPPED_CHECK_EVERY`]: sets the dropped-lines counter, and once a check finds
/// no new drops after some (the sink drained), warns how many were lost.
async fn watch_dropped(
    dropped: tracing_appender::non_blocking::ErrorCounter,
    reported: Arc<std::sync::atomic::AtomicUsize>,
) {
    let mut last = 0;
    loop {
        tokio::time::sleep(DROPPED_CHECK_EVERY).await;
        let now = dropped.dropped_lines();
        metrics::counter!(DROPPED_LINES_METRIC).absolute(now as u64);
        let told = reported.load(std::sync::atomic::Ordering::Relaxed);
        if now == last && now > told {
            tracing::warn!(
                dropped = now - told,
                total = now,
                "log lines were dropped: stderr did not take them fast enough"
            );
            reported.store(now, std::sync::atomic::Ordering::Relaxed);
        }
        last = now;
    }
}

/// The OpenTelemetry pipeline of a run: traces and metrics exported over OTLP
/// (HTTP/protobuf), configured by the standard `OTEL_*` variables. Dropping it flushes
/// what is queued and shuts the exporters down.
pub struct Otel {
    tracer: opentelemetry_sdk::trace::Tracer,
    traces: opentelemetry_sdk::trace::SdkTracerProvider,
    metrics: opentelemetry_sdk::metrics::SdkMeterProvider,
    unreachable: Unreachable,
    /// The endpoints exported to, each with the signal it carries.
    endpoints: Vec<String>,
}

/// The OTLP endpoints that could not be reached, each warned about once: the first
/// failed connection or export to a collector (its scheme, host and port) logs one
/// warning naming it (redacted) and what to check; later failures to it are silent, so
/// a closed port is neither hidden nor a warning per export.
#[derive(Debug, Clone, Default)]
struct Unreachable {
    warned: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Unreachable {
    /// Records that `endpoint` failed with `error`; warns the first time for its
    /// collector.
    fn failed(&self, endpoint: &str, error: &dyn fmt::Display) {
        let collector = match url::Url::parse(endpoint) {
            Ok(url) => format!(
                "{}://{}:{}",
                url.scheme(),
                url.host_str().unwrap_or_default(),
                url.port_or_known_default().unwrap_or_default()
            ),
            Err(_) => endpoint.to_owned(),
        };
        let first = match self.warned.lock() {
            Ok(mut warned) => warned.insert(collector),
            Err(_) => false,
        };
        if first {
            tracing::warn!(
                endpoint = %icq::redact::redact_url(endpoint),
                error = %icq::redact::redact_text(&error.to_string()),
                "OpenTelemetry: cannot reach the OTLP endpoint, so spans and metrics are being dropped; check that the collector is running and that OTEL_EXPORTER_OTLP_ENDPOINT names its OTLP/HTTP port (usually 4318; icq speaks http/protobuf only). Said once per collector"
            );
        }
    }

    /// Tries a TCP connection to each endpoint's host and port (without sending
    /// anything), so a collector that is not listening is reported at startup rather than
    /// at the first export, which may come only at exit.
    fn probe(&self, endpoints: &[String]) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for endpoint in endpoints {
            let Ok(url) = url::Url::parse(endpoint) else {
                continue;
            };
            let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
                continue;
            };
            // An IPv6 host comes bracketed, as a socket address wants it.
            let address = format!("{host}:{port}");
            let (endpoint, unreachable) = (endpoint.clone(), self.clone());
            runtime.spawn(async move {
                let connect = tokio::net::TcpStream::connect(address);
                match tokio::time::timeout(PROBE_WITHIN, connect).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(err)) => unreachable.failed(&endpoint, &err),
                    Err(_) => unreachable.failed(
                        &endpoint,
                        &format!("no connection within {} s", PROBE_WITHIN.as_secs()),
                    ),
                }
            });
        }
    }
}

/// How long the startup probe of an OTLP endpoint waits for a connection.
const PROBE_WITHIN: Duration = Duration::from_secs(5);

/// Where the OTLP/HTTP exporter sends `signal` (`traces` or `metrics`), resolved from
/// the `OTEL_*` variables as the exporter does: the signal's own endpoint as given, else
/// `OTEL_EXPORTER_OTLP_ENDPOINT` plus `/v1/<signal>`, else the default collector on
/// localhost.
fn signal_endpoint(signal: &str) -> String {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .map(|value| value.trim().to_owned())
            .filter(|value| !value.is_empty())
    };
    if let Some(endpoint) = var(&format!(
        "OTEL_EXPORTER_OTLP_{}_ENDPOINT",
        signal.to_ascii_uppercase()
    )) {
        return endpoint;
    }
    let base = var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_else(|| "http://localhost:4318".into());
    format!("{}/v1/{signal}", base.trim_end_matches('/'))
}

/// An exporter whose failures are reported through [`Unreachable`] (once per collector).
#[derive(Debug)]
struct Watched<E> {
    inner: E,
    endpoint: String,
    unreachable: Unreachable,
}

impl<E: opentelemetry_sdk::trace::SpanExporter> opentelemetry_sdk::trace::SpanExporter
    for Watched<E>
{
    fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        let export = self.inner.export(batch);
        async move {
            let result = export.await;
            if let Err(err) = &result {
                self.unreachable.failed(&self.endpoint, err);
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown()
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

impl<E: opentelemetry_sdk::metrics::exporter::PushMetricExporter>
    opentelemetry_sdk::metrics::exporter::PushMetricExporter for Watched<E>
{
    fn export(
        &self,
        metrics: &opentelemetry_sdk::metrics::data::ResourceMetrics,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        let export = self.inner.export(metrics);
        async move {
            let result = export.await;
            if let Err(err) = &result {
                self.unreachable.failed(&self.endpoint, err);
            }
            result
        }
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown()
    }

    fn temporality(&self) -> opentelemetry_sdk::metrics::Temporality {
        self.inner.temporality()
    }
}

impl Drop for Otel {
    fn drop(&mut self) {
        // Both flush on shutdown; each is bounded by its exporter's timeout
        // (OTEL_EXPORTER_OTLP_TIMEOUT, 10 s by default).
        if let Err(err) = self.traces.shutdown() {
            tracing::debug!(error = %err, "shutting down the trace exporter");
        }
        if let Err(err) = self.metrics.shutdown() {
            tracing::debug!(error = %err, "shutting down the metrics exporter");
        }
    }
}

/// Whether the environment asks for OTLP export: an endpoint variable is set
/// (`OTEL_EXPORTER_OTLP_ENDPOINT` or its traces/metrics variants) and
/// `OTEL_SDK_DISABLED` is not `true`.
pub fn otel_requested() -> bool {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    let disabled =
        std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled
        && (set("OTEL_EXPORTER_OTLP_ENDPOINT")
            || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            || set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))
}

/// Builds the OTLP pipeline when [`otel_requested`], installing its meter provider as
/// the global one (so [`icq::otel`]'s metrics flow) and the W3C trace-context
/// propagator. `None` when no `OTEL_*` endpoint is set: nothing is exported and the
/// execution spans are never created. Only the `http/protobuf` protocol is built in.
pub fn init_otel() -> Result<Option<Otel>> {
    use opentelemetry_otlp::WithExportConfig as _;

    if !otel_requested() {
        return Ok(None);
    }
    if let Ok(protocol) = std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL")
        && !protocol.trim().is_empty()
        && protocol.trim() != "http/protobuf"
    {
        return Err(Error::invalid(format!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: icq exports OTLP over HTTP with \
             protobuf only; set it to http/protobuf (or unset it) and point \
             OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (usually 4318)"
        )));
    }
    let otlp_error = |what: &str| {
        let what = what.to_owned();
        move |err: opentelemetry_otlp::ExporterBuildError| {
            Error::invalid(format!(
                "cannot set up the OpenTelemetry {what} exporter from the OTEL_* variables: {}",
                icq::redact::redact_text(&err.to_string())
            ))
        }
    };
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(
            std::env::var("OTEL_SERVICE_NAME")
                .ok()
                .filter(|name| !name.trim().is_empty())
                .unwrap_or_else(|| "icq".to_owned()),
        )
        .build();
    let span_exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()
        .map_err(otlp_error("trace"))?;
    let unreachable = Unreachable::default();
    let endpoints = vec![signal_endpoint("traces"), signal_endpoint("metrics")];
    let span_exporter = Watched {
        inner: span_exporter,
        endpoint: endpoints[0].clone(),
        unreachable: unreachable.clone(),
    };
    let traces = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_resource(resource.clone())
        .with_batch_exporter(span_exporter)
        .build();
    let metric_exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()
        .map_err(otlp_error("metrics"))?;
    let metric_exporter = Watched {
        inner: metric_exporter,
        endpoint: endpoints[1].clone(),
        unreachable: unreachable.clone(),
    };
    let metrics = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_resource(resource)
        .with_periodic_exporter(metric_exporter)
        .build();
    opentelemetry::global::set_meter_provider(metrics.clone());
    opentelemetry::global::set_tracer_provider(traces.clone());
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    use opentelemetry::trace::TracerProvider as _;
    let tracer = traces.tracer("icq");
    Ok(Some(Otel {
        tracer,
        traces,
        metrics,
        unreachable,
        endpoints,
    }))
}

/// Installs the Prometheus recorder as the global metrics recorder and starts serving it on
/// `addr` (`GET /metrics`). Call once per process, inside the runtime. Returns the address
/// bound (useful with port 0).
pub fn serve(addr: SocketAddr) -> Result<SocketAddr> {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("icq_internal_commands_execution_seconds".into()),
            BUCKETS,
        )
        .map_err(Error::runtime("metrics buckets"))?
        .build_recorder();
    let handle = recorder.handle();
    let cannot = |e: std::io::Error| Error::io(format!("cannot serve metrics on {addr}"))(e);
    let listener = std::net::TcpListener::bind(addr).map_err(cannot)?;
    listener.set_nonblocking(true).map_err(cannot)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(cannot)?;
    let bound = listener.local_addr().map_err(cannot)?;
    metrics::set_global_recorder(recorder).map_err(|e| {
        Error::runtime(format!(
            "cannot serve metrics on {addr}: a metrics recorder is already installed"
        ))(e)
    })?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP_EVERY).await;
            upkeep.run_upkeep();
        }
    });
    spawn_metrics_server(listener, handle);
    describe();
    Ok(bound)
}

fn describe() {
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
    metrics::describe_counter!(
        "icq_internal_commands_lost_races_total",
        "Claims, stamps, lease renewals and schedule ticks rolled back by a deadlock or a \
         Galera certification conflict, and retried"
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
    metrics::describe_gauge!(
        "icq_internal_commands_table_bytes",
        metrics::Unit::Bytes,
        "Bytes the commands (or history) table takes, indexes included"
    );
    metrics::describe_gauge!(
        "icq_internal_commands_dead_rows",
        "Dead row versions not yet removed (InnoDB: the history list length)"
    );
    metrics::describe_gauge!(
        "icq_internal_commands_xmin_holder_age_seconds",
        metrics::Unit::Seconds,
        "How long the transaction holding back cleanup has been open (0: none)"
    );
    metrics::describe_gauge!(
        "icq_internal_commands_long_transactions",
        "Transactions open longer than a minute"
    );
    metrics::describe_gauge!(
        "icq_internal_commands_oldest_due_wait_seconds",
        metrics::Unit::Seconds,
        "How long the oldest due command has waited past its run time (0: nothing due)"
    );
    metrics::describe_counter!(
        DROPPED_LINES_METRIC,
        "Log lines dropped because stderr did not take them (never waited for)"
    );
}

/// Serves `handle`'s rendering on `listener` until the task is aborted: `GET`/`HEAD
/// /metrics` only (404 for any other path, 405 for any other method on `/metrics`).
pub fn spawn_metrics_server(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
) -> tokio::task::JoinHandle<()> {
    let render: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(move || handle.render());
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::debug!(error = %err, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let render = render.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<_>| {
                    let render = render.clone();
                    async move { Ok::<_, Infallible>(respond(&request, || render())) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// The answer to one request: the metrics for `GET`/`HEAD /metrics`, 404 or 405 otherwise.
fn respond<B>(request: &Request<B>, render: impl FnOnce() -> String) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, text: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *response.status_mut() = status;
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    };
    if request.uri().path() != METRICS_PATH {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: icq serves metrics at GET /metrics only\n",
        );
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        let mut response = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use GET /metrics\n",
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let mut response = Response::new(Full::new(Bytes::from(render())));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_FORMAT));
    response
}

/// How many times its own duration a refresh of the `pending` gauges waits before the
/// next: the count walks the head of the poll index, cheap until a held xmin horizon (or
/// MariaDB's held-back purge) leaves every completed row's entry there.
const PENDING_COST_SHARE: u32 = 50;

/// How many refresh intervals the `pending` gauges wait at most between two refreshes.
const PENDING_STALE_AT_MOST: u32 = 10;

/// Refreshes the `pending` gauges of each source every `every` (longer while a refresh is
/// costly) until the task is aborted.
pub fn spawn_pending_gauges(
    sources: &[crate::cli::sources::Source],
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let sources: Vec<(Arc<str>, icq::Queue)> = sources
        .iter()
        .map(|s| (Arc::from(s.name.as_str()), s.queue.clone()))
        .collect();
    tokio::spawn(async move {
        loop {
            let started = std::time::Instant::now();
            for (name, queue) in &sources {
                match queue.activity().await {
                    Ok(activity) => {
                        let depth = otel_depth_gauge();
                        for (state, count) in [("due", activity.due), ("running", activity.running)]
                        {
                            depth.record(
                                count,
                                &[
                                    opentelemetry::KeyValue::new("icq.source", name.to_string()),
                                    opentelemetry::KeyValue::new("icq.state", state),
                                ],
                            );
                        }
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
            // One refresh slowed by a stall must not leave the gauges stale for minutes.
            let cost = started.elapsed().saturating_mul(PENDING_COST_SHARE);
            tokio::time::sleep(
                every
                    .max(cost)
                    .min(every.saturating_mul(PENDING_STALE_AT_MOST)),
            )
            .await;
        }
    })
}

/// How often a worker samples each source's health for its gauges: catalogue reads and
/// one seek, on the source's ordinary pool, never on the claim path.
pub const HEALTH_EVERY: Duration = Duration::from_secs(30);

/// Samples each source's health (as `icq doctor` reads it) into the health gauges every
/// `every` until the task is aborted.
pub fn spawn_health_gauges(
    sources: &[crate::cli::sources::Source],
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let sources: Vec<(Arc<str>, icq::Queue)> = sources
        .iter()
        .map(|s| (Arc::from(s.name.as_str()), s.queue.clone()))
        .collect();
    let thresholds = icq::admin::doctor::Thresholds::default();
    tokio::spawn(async move {
        loop {
            for (name, queue) in &sources {
                match icq::admin::doctor::health(queue, &thresholds).await {
                    Ok(report) => record_health(name, &report),
                    Err(err) => {
                        tracing::debug!(source = %name, error = %err, "cannot refresh health gauges")
                    }
                }
            }
            tokio::time::sleep(every).await;
        }
    })
}

/// Sets the health gauges of source `name` from `report`.
fn record_health(name: &str, report: &icq::admin::doctor::HealthReport) {
    use opentelemetry::KeyValue;
    let gauges = otel_health_gauges();
    let source = KeyValue::new("icq.source", name.to_string());
    for (table, stats) in [("commands", &report.table), ("history", &report.history)] {
        if let Some(stats) = stats {
            metrics::gauge!("icq_internal_commands_table_bytes", "source" => name.to_string(), "table" => table)
                .set(stats.total_bytes as f64);
            gauges.table_bytes.record(
                stats.total_bytes,
                &[source.clone(), KeyValue::new("icq.table", table)],
            );
        }
    }
    if let Some(dead) = report
        .table
        .as_ref()
        .and_then(|t| t.dead_rows)
        .or(report.history_list_length)
    {
        metrics::gauge!("icq_internal_commands_dead_rows", "source" => name.to_string())
            .set(dead as f64);
        gauges.dead_rows.record(dead, std::slice::from_ref(&source));
    }
    let held = report
        .xmin_holder
        .as_ref()
        .and_then(|h| h.transaction_age)
        .unwrap_or_default()
        .as_secs_f64();
    metrics::gauge!("icq_internal_commands_xmin_holder_age_seconds", "source" => name.to_string())
        .set(held);
    gauges.xmin_age.record(held, std::slice::from_ref(&source));
    let long = report.long_transactions.len() as u64;
    metrics::gauge!("icq_internal_commands_long_transactions", "source" => name.to_string())
        .set(long as f64);
    gauges.long.record(long, std::slice::from_ref(&source));
    let wait = report.oldest_due_wait.unwrap_or_default().as_secs_f64();
    metrics::gauge!("icq_internal_commands_oldest_due_wait_seconds", "source" => name.to_string())
        .set(wait);
    gauges.due_wait.record(wait, std::slice::from_ref(&source));
}

/// The OpenTelemetry health gauges, on the global meter provider.
struct HealthGauges {
    table_bytes: opentelemetry::metrics::Gauge<u64>,
    dead_rows: opentelemetry::metrics::Gauge<u64>,
    xmin_age: opentelemetry::metrics::Gauge<f64>,
    long: opentelemetry::metrics::Gauge<u64>,
    due_wait: opentelemetry::metrics::Gauge<f64>,
}

fn otel_health_gauges() -> &'static HealthGauges {
    static GAUGES: std::sync::OnceLock<HealthGauges> = std::sync::OnceLock::new();
    GAUGES.get_or_init(|| {
        let meter = opentelemetry::global::meter("icq");
        HealthGauges {
            table_bytes: meter
                .u64_gauge("icq.table.size")
                .with_description("Bytes the commands (or history) table takes, indexes included")
                .with_unit("By")
                .build(),
            dead_rows: meter
                .u64_gauge("icq.table.dead_rows")
                .with_description(
                    "Dead row versions not yet removed (InnoDB: the history list length)",
                )
                .with_unit("{row}")
                .build(),
            xmin_age: meter
                .f64_gauge("icq.xmin_holder.age")
                .with_description(
                    "How long the transaction holding back cleanup has been open (0: none)",
                )
                .with_unit("s")
                .build(),
            long: meter
                .u64_gauge("icq.transactions.long")
                .with_description("Transactions open longer than a minute")
                .with_unit("{transaction}")
                .build(),
            due_wait: meter
                .f64_gauge("icq.due.oldest_wait")
                .with_description("How long the oldest due command has waited past its run time")
                .with_unit("s")
                .build(),
        }
    })
}

/// The OpenTelemetry queue-depth gauge (`icq.queue.depth`, by `icq.source` and
/// `icq.state`), on the global meter provider (a no-op unless [`init_otel`] installed one).
fn otel_depth_gauge() -> &'static opentelemetry::metrics::Gauge<u64> {
    static GAUGE: std::sync::OnceLock<opentelemetry::metrics::Gauge<u64>> =
        std::sync::OnceLock::new();
    GAUGE.get_or_init(|| {
        opentelemetry::global::meter("icq")
            .u64_gauge("icq.queue.depth")
            .with_description("Pending commands by state: due (waiting for a slot) or running")
            .with_unit("{message}")
            .build()
    })
}

/// The field formatter for text logs: like tracing-subscriber's default (`message` first,
/// then `name=value` pairs), but every value, the message included, is passed through
/// [`icq::redact::escape_for_log`], so a line break or terminal escape in a handler's
/// stderr or a response body is written as `\n`, `\u{1b}`, ... and a log line can never
/// be forged; and through [`icq::redact::redact_text`] first, so a URL's password or
/// `?token=` that slipped into a driver's message is masked. Use with
/// `tracing_subscriber::fmt().fmt_fields(escaping_fields())`.
pub fn escaping_fields() -> impl for<'writer> FormatFields<'writer> + Send + Sync + 'static {
    tracing_subscriber::fmt::format::debug_fn(
        |writer: &mut Writer<'_>, field: &tracing::field::Field, value: &dyn fmt::Debug| {
            let name = field.name();
            if name.starts_with("log.") {
                // tracing-log's metadata fields: already in the line's prefix.
                return Ok(());
            }
            let name = name.strip_prefix("r#").unwrap_or(name);
            let raw = format!("{value:?}");
            let text = if icq::redact::is_plain_for_log(&raw) {
                raw
            } else {
                icq::redact::escape_for_log(&icq::redact::redact_text(&raw))
            };
            if name == "message" {
                write!(writer, "{text}")
            } else {
                write!(writer, "{name}={text}")
            }
        },
    )
    .delimited(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Starts a private (not global) recorder's listener; returns its address.
    async fn start() -> (SocketAddr, PrometheusHandle) {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!("icq_internal_commands_claimed_total", "source" => "s").increment(3);
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        spawn_metrics_server(listener, handle.clone());
        (addr, handle)
    }

    /// Sends `request` as is and returns the whole response.
    async fn raw(addr: SocketAddr, request: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        String::from_utf8_lossy(&response).into_owned()
    }

    #[tokio::test]
    async fn metrics_listener_serves_get_metrics_only() {
        let (addr, _handle) = start().await;
        let client = reqwest::Client::new();
        let url = |path: &str| format!("http://{addr}{path}");

        let ok = client.get(url("/metrics")).send().await.unwrap();
        assert_eq!(ok.status(), 200);
        assert_eq!(ok.headers()["content-type"], TEXT_FORMAT);
        let body = ok.text().await.unwrap();
        assert!(
            body.contains("icq_internal_commands_claimed_total{source=\"s\"} 3"),
            "{body}"
        );
        // A query string does not change the path.
        let ok = client.get(url("/metrics?x=1")).send().await.unwrap();
        assert_eq!(ok.status(), 200);
        let head = client.head(url("/metrics")).send().await.unwrap();
        assert_eq!(head.status(), 200);

        for path in [
            "/",
            "/metrics/",
            "/metricsx",
            "/api/metrics",
            "/favicon.ico",
        ] {
            let response = client.get(url(path)).send().await.unwrap();
            assert_eq!(response.status(), 404, "{path}");
            let body = response.text().await.unwrap();
            assert!(!body.contains("icq_internal_commands"), "{path}: {body}");
        }
        for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            let response = client
                .request(method.clone(), url("/metrics"))
                .body("x")
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 405, "{method}");
            assert_eq!(response.headers()["allow"], "GET, HEAD");
            assert!(!response.text().await.unwrap().contains("icq_internal"));
        }
        // A made-up method and a request that is not HTTP at all.
        let response = raw(
            addr,
            "BREW /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 405"), "{response}");
        let response = raw(addr, "hello\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 400"), "{response}");
        assert!(!response.contains("icq_internal"), "{response}");
    }

    /// A writer collecting everything logged.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A check that no event follows (`tracing::enabled!`, as every execution's metrics
    /// make, or `log_enabled!`) must not swallow the next line: per-layer filters keep
    /// its verdict in a thread-local, and an always-enabled event after it read that
    /// stale "off" and was dropped (a replica's failover line went missing that way).
    #[test]
    fn a_check_without_an_event_does_not_swallow_the_next_line() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let dispatch = log_dispatch(false, false, None, move || writer.clone());
        // A thread of its own: the callsites below are registered while this dispatcher
        // is the only one in use on it.
        std::thread::spawn(move || {
            tracing::dispatcher::with_default(&dispatch, || {
                for round in 0..3 {
                    let spans = tracing::enabled!(target: "icq::otel", tracing::Level::INFO);
                    assert!(!spans, "no exporter: the execution spans are off");
                    tracing::warn!(target: "icq::engine::postgres::connect", round, "after the check");
                    tracing::info!(target: "icq::processor::health", round, "and the next one");
                }
            });
        })
        .join()
        .unwrap();
        let logged = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        for round in 0..3 {
            for line in ["after the check", "and the next one"] {
                assert!(
                    logged.contains(&format!("{line} round={round}")),
                    "{line} (round {round}) was dropped:\n{logged}"
                );
            }
        }
    }

    #[test]
    fn text_logs_escape_control_characters_in_every_field() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .fmt_fields(escaping_fields())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let stderr = "disk full\n2030-01-01T00:00:00Z ERROR forged: admin logged in\x1b[2K";
            let span = tracing::info_span!("command", r#type = "t\nx", id = 7);
            let _entered = span.enter();
            tracing::warn!(error = %stderr, plain = "a\rb", terminal = false, "command failed\nreally");
            tracing::warn!(
                error = "cannot reach postgres://u:pw1@h/d?token=tk2",
                "lost"
            );
        });
        let logged = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(logged.lines().count(), 2, "{logged}");
        assert!(
            !logged.contains("pw1") && !logged.contains("tk2"),
            "{logged}"
        );
        assert!(
            logged.contains("postgres://u:***@h/d?token=***"),
            "{logged}"
        );
        assert!(logged.contains("command{type=\"t\\nx\" id=7}"), "{logged}");
        assert!(
            logged.contains(
                "command failed\\nreally error=disk full\\n2030-01-01T00:00:00Z ERROR forged: \
                 admin logged in\\u{1b}[2K plain=\"a\\rb\" terminal=false"
            ),
            "{logged}"
        );
    }
}
