//! OpenTelemetry end to end: `icq work` exporting to a real OTLP/HTTP receiver that decodes
//! the protocol (opentelemetry-proto), on every engine.

#[path = "../support/mod.rs"]
mod support;

mod receiver;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;

use receiver::Receiver;
use support::TestDb;

/// The scheduler's span every linked command names in `TraceParent`.
const SCHEDULER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SCHEDULER_SPAN: &str = "00f067aa0ba902b7";

fn attribute<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    match attribute(attributes, key)? {
        Value::StringValue(s) => Some(s.clone()),
        other => Some(format!("{other:?}")),
    }
}

fn int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attribute(attributes, key)? {
        Value::IntValue(n) => Some(*n),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_config(dir: &Path, url: &str, marker: &Path) -> std::path::PathBuf {
    let path = dir.join("icq.yaml");
    let text = format!(
        "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n      max_attempts: 1\n      polling_interval_seconds: 0.1\n\
         handlers:\n  ok:\n    exec: [\"sh\", \"-c\", \"printf '%s %s\\\\n' \\\"$ICQ_COMMAND_ID\\\" \\\"$TRACEPARENT\\\" >> {}\"]\n  \
         bad:\n    exec: [\"sh\", \"-c\", \"exit 3\"]\n",
        marker.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn drain_exports_spans_links_and_metrics(engine: &'static str) {
    let db = TestDb::with_table(engine, "otel").await;
    let (t, ty, payload, tp) = (
        db.q("InternalCommands"),
        db.q("Type"),
        db.q("Payload"),
        db.q("TraceParent"),
    );
    // Three that succeed (one linked to the scheduler's span), one that fails for good.
    db.execute(&format!(
        "INSERT INTO {t} ({ty}, {payload}, {tp}) VALUES \
         ('ok', '{{}}', '00-{SCHEDULER_TRACE}-{SCHEDULER_SPAN}-01'), \
         ('ok', '{{}}', NULL), ('ok', '{{}}', 'not a traceparent'), ('bad', '{{}}', NULL)"
    ))
    .await;

    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("traceparents");
    let config = write_config(dir.path(), &db.url, &marker);
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("OTEL_SERVICE_NAME", "icq-test")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "200")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{engine}: icq work failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let spans: Vec<Span> = receiver.wait_for_spans(4, Duration::from_secs(10));
    assert_eq!(
        spans.len(),
        4,
        "{engine}: one span per execution: {spans:#?}"
    );
    let mut ids: Vec<String> = Vec::new();
    for span in &spans {
        assert_eq!(span.name, "process default", "{engine}");
        assert_eq!(span.kind, SpanKind::Consumer as i32, "{engine}");
        let attrs = &span.attributes;
        assert_eq!(text(attrs, "messaging.system").as_deref(), Some("icq"));
        assert_eq!(
            text(attrs, "messaging.operation.name").as_deref(),
            Some("process")
        );
        assert_eq!(
            text(attrs, "messaging.operation.type").as_deref(),
            Some("process")
        );
        assert_eq!(
            text(attrs, "messaging.destination.name").as_deref(),
            Some("default")
        );
        assert_eq!(text(attrs, "icq.source").as_deref(), Some("main"));
        assert_eq!(int(attrs, "icq.attempt"), Some(1), "{engine}: {attrs:?}");
        let id = text(attrs, "messaging.message.id").expect("message id");
        assert_eq!(id.len(), 36, "{engine}: {id} is a command id");
        assert!(!ids.contains(&id), "{engine}: {id} ran twice");
        ids.push(id);
        let ty = text(attrs, "icq.command.type").expect("type");
        if ty == "bad" {
            assert_eq!(
                text(attrs, "error.type").as_deref(),
                Some("failed"),
                "{engine}"
            );
            let status = span.status.as_ref().expect("status");
            assert_eq!(status.code, 2, "{engine}: status ERROR");
        } else {
            assert_eq!(ty, "ok");
            assert_eq!(text(attrs, "error.type"), None, "{engine}");
        }
    }
    let linked: Vec<&Span> = spans.iter().filter(|s| !s.links.is_empty()).collect();
    assert_eq!(
        linked.len(),
        1,
        "{engine}: only the row with a valid TraceParent links"
    );
    let link = &linked[0].links[0];
    assert_eq!(hex(&link.trace_id), SCHEDULER_TRACE);
    assert_eq!(hex(&link.span_id), SCHEDULER_SPAN);

    // Each exec handler saw its own execution span as TRACEPARENT.
    let seen = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(seen.lines().count(), 3, "{engine}: {seen}");
    for line in seen.lines() {
        let (id, traceparent) = line.split_once(' ').unwrap();
        let span = spans
            .iter()
            .find(|s| text(&s.attributes, "messaging.message.id").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("{engine}: no span for {id}"));
        assert_eq!(
            traceparent,
            format!("00-{}-{}-01", hex(&span.trace_id), hex(&span.span_id)),
            "{engine}"
        );
    }

    // Metrics: 4 consumed (1 with error.type), 4 durations.
    let metrics = receiver.metrics();
    let mut consumed_ok = 0;
    let mut consumed_failed = 0;
    let mut durations = 0;
    let mut depth_seen = false;
    for request in &metrics {
        for resource in &request.resource_metrics {
            for scope in &resource.scope_metrics {
                for metric in &scope.metrics {
                    match (metric.name.as_str(), &metric.data) {
                        ("messaging.client.consumed.messages", Some(Data::Sum(sum))) => {
                            for point in &sum.data_points {
                                let value = match point.value {
                                    Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(n)) => n,
                                    _ => 0,
                                };
                                if text(&point.attributes, "error.type").is_some() {
                                    consumed_failed = consumed_failed.max(value);
                                } else {
                                    consumed_ok = consumed_ok.max(value);
                                }
                            }
                        }
                        ("messaging.process.duration", Some(Data::Histogram(h))) => {
                            let total: u64 = h.data_points.iter().map(|p| p.count).sum();
                            durations = durations.max(total);
                        }
                        ("icq.queue.depth", Some(Data::Gauge(_))) => depth_seen = true,
                        _ => {}
                    }
                }
            }
        }
    }
    assert_eq!(
        (consumed_ok, consumed_failed),
        (3, 1),
        "{engine}: consumed counts"
    );
    assert_eq!(durations, 4, "{engine}: process durations");
    assert!(depth_seen, "{engine}: queue depth gauge exported");
}

#[tokio::test]
async fn postgres_drain_exports_spans_links_and_metrics() {
    drain_exports_spans_links_and_metrics("postgres").await;
}

#[tokio::test]
async fn sqlite_drain_exports_spans_links_and_metrics() {
    drain_exports_spans_links_and_metrics("sqlite").await;
}

#[tokio::test]
async fn mysql_drain_exports_spans_links_and_metrics() {
    drain_exports_spans_links_and_metrics("mysql").await;
}

/// Without any OTEL_* endpoint nothing is exported and nothing is required.
#[tokio::test]
async fn without_otel_variables_nothing_is_exported() {
    let db = TestDb::with_table("sqlite", "nootel").await;
    let (t, ty, payload) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
    db.execute(&format!(
        "INSERT INTO {t} ({ty}, {payload}) VALUES ('ok', '{{}}')"
    ))
    .await;
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("traceparents");
    let config = write_config(dir.path(), &db.url, &marker);
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        // A TRACEPARENT the worker inherited is not passed on to handlers.
        .env(
            "TRACEPARENT",
            format!("00-{SCHEDULER_TRACE}-{SCHEDULER_SPAN}-01"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(receiver.requests(), 0);
    let seen = std::fs::read_to_string(&marker).unwrap();
    assert!(
        seen.trim_end().ends_with(' ') || seen.split_whitespace().count() == 1,
        "{seen:?}"
    );
}

/// A collector that does not listen is warned about once, at startup, naming the endpoint
/// with its password masked and what to check; the exports that keep failing while the
/// worker runs add no more warnings.
#[tokio::test]
async fn an_unreachable_endpoint_is_warned_about_once() {
    let db = TestDb::with_table("sqlite", "otelclosed").await;
    let (t, ty, payload) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
    db.execute(&format!(
        "INSERT INTO {t} ({ty}, {payload}) VALUES ('ok', '{{}}'), ('ok', '{{}}'), ('bad', '{{}}')"
    ))
    .await;
    // Nothing listens on this port (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("traceparents");
    let config = write_config(dir.path(), &db.url, &marker);
    let log = dir.path().join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["work", "--config"])
        .arg(&config)
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://collector:s3cret@127.0.0.1:{port}"),
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "200")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        .env_remove("RUST_LOG")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait_for = |what: &dyn Fn() -> bool, limit: Duration| {
        let start = std::time::Instant::now();
        while !what() && start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(50));
        }
        what()
    };
    let warned = wait_for(
        &|| read_log().contains("cannot reach the OTLP endpoint"),
        Duration::from_secs(20),
    );
    // The two commands that succeed ran, so their spans were due for export.
    let ran = wait_for(
        &|| {
            std::fs::read_to_string(&marker)
                .map(|text| text.lines().count() >= 2)
                .unwrap_or(false)
        },
        Duration::from_secs(20),
    );
    // Exports every 100 ms (spans) and 200 ms (metrics) keep failing for a while.
    std::thread::sleep(Duration::from_secs(2));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    let stderr = read_log();
    assert!(warned && ran, "warned {warned}, ran {ran}: {stderr}");
    assert!(status.success(), "{status}: {stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("cannot reach the OTLP endpoint"))
        .collect();
    assert_eq!(warnings.len(), 1, "once, not per export: {stderr}");
    let warning = warnings[0];
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains(&format!("http://collector:***@127.0.0.1:{port}/v1/")),
        "the endpoint, redacted: {warning}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
    for hint in [
        "collector is running",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "4318",
    ] {
        assert!(warning.contains(hint), "{hint}: {warning}");
    }
    assert!(warning.contains("refused"), "the cause: {warning}");
}

/// An OTLP protocol icq does not speak is a clear usage error.
#[tokio::test]
async fn grpc_protocol_is_refused_with_a_hint() {
    let db = TestDb::with_table("sqlite", "otelgrpc").await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &db.url, &dir.path().join("m"));
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("http/protobuf"), "{stderr}");
}

/// Scheduling from Rust inside a span records that span's trace context in `TraceParent`,
/// and a command that names its own keeps it.
async fn scheduling_inside_a_span_records_its_traceparent(engine: &'static str) {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;

    let db = TestDb::with_table(engine, "otelsched").await;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _default = tracing::subscriber::set_default(subscriber);

    let queue = icq::Queue::connect(
        "main",
        &db.url,
        &icq::TableName::default(),
        &Default::default(),
    )
    .await
    .unwrap();
    let span = tracing::info_span!("checkout");
    let expected = {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        let context = span.context();
        let sc = context.span().span_context().clone();
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    };
    let inside = icq::NewCommand::new("ok", serde_json::json!({}));
    let own = icq::NewCommand::new("ok", serde_json::json!({}));
    let mut own = own;
    own.trace_parent = Some(format!("00-{SCHEDULER_TRACE}-{SCHEDULER_SPAN}-01"));
    let outside = icq::NewCommand::new("ok", serde_json::json!({}));
    {
        let _entered = span.enter();
        queue.schedule(&inside).await.unwrap();
        queue.schedule(&own).await.unwrap();
    }
    queue.schedule(&outside).await.unwrap();
    let stored = |id: &icq::CommandId| {
        let queue = queue.clone();
        let id = id.clone();
        async move { queue.get(&id).await.unwrap().unwrap().trace_parent }
    };
    assert_eq!(
        stored(&inside.id).await.as_deref(),
        Some(expected.as_str()),
        "{engine}"
    );
    assert_eq!(
        stored(&own.id).await,
        own.trace_parent,
        "{engine}: a command's own TraceParent wins"
    );
    assert_eq!(
        stored(&outside.id).await,
        None,
        "{engine}: no span, no TraceParent"
    );
    queue.close().await;
}

#[tokio::test]
async fn postgres_scheduling_inside_a_span_records_its_traceparent() {
    scheduling_inside_a_span_records_its_traceparent("postgres").await;
}

#[tokio::test]
async fn sqlite_scheduling_inside_a_span_records_its_traceparent() {
    scheduling_inside_a_span_records_its_traceparent("sqlite").await;
}

#[tokio::test]
async fn mysql_scheduling_inside_a_span_records_its_traceparent() {
    scheduling_inside_a_span_records_its_traceparent("mysql").await;
}
