//! OpenTelemetry in the library (feature `otel`): the trace context a command carries
//! from the code that scheduled it to the handler that runs it, the execution span and
//! the messaging metrics.
//!
//! - Scheduling inside a span records that span's W3C `traceparent` in `TraceParent`
//!   ([`current_traceparent`]), unless the command names one itself.
//! - Each execution runs inside a CONSUMER span named `process <queue>` with the
//!   OpenTelemetry messaging attributes (`execution_span`), linked to the scheduler's
//!   span through `TraceParent`. Exec handlers see it as `TRACEPARENT`, http handlers as a
//!   `traceparent` header, so their own spans join the trace.
//! - Every execution counts into `messaging.client.consumed.messages` and
//!   `messaging.process.duration` (`record_execution`) on the global meter provider.
//!
//! It costs nothing unless someone listens: the spans are `tracing` spans of target
//! [`SPAN_TARGET`], created only when the subscriber enables that target (the `icq` binary
//! enables it only when an OTLP exporter is configured; an embedding service that installs
//! `tracing-opentelemetry` enables it like any other target), and the global meter
//! provider is a no-op until one is installed.

use std::sync::OnceLock;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of the execution spans: enable it (at `INFO`) in the subscriber
/// layer that exports to OpenTelemetry, keep it off in the others.
pub const SPAN_TARGET: &str = "icq::otel";

/// The W3C `traceparent` of the current span (the `tracing` span when it is bridged to
/// OpenTelemetry, else the current OpenTelemetry context), if it has a valid one.
///
/// # Examples
///
/// ```
/// // Outside any span there is nothing to record.
/// assert_eq!(icq::otel::current_traceparent(), None);
/// ```
pub fn current_traceparent() -> Option<String> {
    // Inside an execution: its span, whatever spans the handler opened below it (those
    // may be invisible to the OpenTelemetry layer, whose filter takes only icq's own).
    if let Ok(Some(traceparent)) = EXECUTION_TRACEPARENT.try_with(Clone::clone) {
        return Some(traceparent);
    }
    let span = tracing::Span::current();
    let context = if span.is_none() {
        opentelemetry::Context::current()
    } else {
        span.context()
    };
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| format_traceparent(&span_context))
}

tokio::task_local! {
    /// The `traceparent` of the execution span the current task runs a handler in.
    static EXECUTION_TRACEPARENT: Option<String>;
}

/// Runs `handler` (an execution's future) with `span`'s trace context as the one
/// [`current_traceparent`] reports to the handler, its exec environment and http headers.
pub(crate) async fn in_execution<F: std::future::Future>(
    span: &tracing::Span,
    handler: F,
) -> F::Output {
    let traceparent = if span.is_none() {
        None
    } else {
        let context = span.context();
        let span_context = context.span().span_context().clone();
        span_context
            .is_valid()
            .then(|| format_traceparent(&span_context))
    };
    EXECUTION_TRACEPARENT.scope(traceparent, handler).await
}

/// Formats a span context as a W3C `traceparent` (version 00).
fn format_traceparent(span: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        span.trace_id(),
        span.span_id(),
        span.trace_flags().to_u8()
    )
}

/// Parses a W3C `traceparent` (version 00; later versions by their first four fields).
/// Anything else — text another program stored, a zero trace id — is `None`: the
/// execution then has no link, never an error.
///
/// # Examples
///
/// ```
/// let parsed = icq::otel::parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// let span = parsed.expect("valid");
/// assert_eq!(span.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(span.is_sampled());
/// assert!(icq::otel::parse_traceparent("not a traceparent").is_none());
/// assert!(icq::otel::parse_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
/// ```
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let mut parts = text.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(version, 2) || version.eq_ignore_ascii_case("ff") || !hex(trace, 32) || !hex(span, 16) {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let flags = u8::from_str_radix(flags.get(..2)?, 16).ok()?;
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// What an execution span says about its command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Execution<'a> {
    pub(crate) source: &'a str,
    pub(crate) queue: &'a str,
    pub(crate) type_name: &'a str,
    pub(crate) id: &'a str,
    pub(crate) attempt: u32,
    pub(crate) trace_parent: Option<&'a str>,
}

/// The CONSUMER span an execution runs in: `process <queue>`, with the messaging
/// attributes, linked to the scheduler's span. [`tracing::Span::none`] (free) when no
/// subscriber enables [`SPAN_TARGET`].
pub(crate) fn execution_span(execution: &Execution<'_>) -> tracing::Span {
    if !tracing::enabled!(target: "icq::otel", tracing::Level::INFO) {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        target: "icq::otel",
        "process",
        otel.name = %format_args!("process {}", execution.queue),
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        messaging.system = "icq",
        messaging.operation.name = "process",
        messaging.operation.type = "process",
        messaging.destination.name = %execution.queue,
        messaging.message.id = %execution.id,
        icq.command.type = %execution.type_name,
        icq.attempt = i64::from(execution.attempt),
        icq.source = %execution.source,
    );
    if let Some(link) = execution.trace_parent.and_then(parse_traceparent) {
        span.add_link(link);
    }
    span
}

/// Marks `span` failed with `error_type` (`error.type`, status ERROR).
pub(crate) fn execution_failed(span: &tracing::Span, error_type: &str) {
    if !span.is_none() {
        span.record("error.type", error_type);
        span.record("otel.status_code", "ERROR");
    }
}

struct Instruments {
    consumed: Counter<u64>,
    duration: Histogram<f64>,
}

fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = opentelemetry::global::meter("icq");
        Instruments {
            consumed: meter
                .u64_counter("messaging.client.consumed.messages")
                .with_description("Commands handed to a handler")
                .with_unit("{message}")
                .build(),
            duration: meter
                .f64_histogram("messaging.process.duration")
                .with_description("How long handlers took, by outcome")
                .with_unit("s")
                .with_boundaries(vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 300.0,
                ])
                .build(),
        }
    })
}

/// Counts one execution into the messaging metrics. `error_type` is `None` on success.
/// A no-op (a few atomic loads) until a meter provider is installed, and skipped entirely
/// while no subscriber enables [`SPAN_TARGET`] so an unobserved drain pays nothing.
pub(crate) fn record_execution(execution: &Execution<'_>, error_type: Option<&str>, seconds: f64) {
    if !tracing::enabled!(target: "icq::otel", tracing::Level::INFO) {
        return;
    }
    let mut attributes = vec![
        KeyValue::new("messaging.system", "icq"),
        KeyValue::new("messaging.operation.name", "process"),
        KeyValue::new("messaging.destination.name", execution.queue.to_owned()),
        KeyValue::new("icq.source", execution.source.to_owned()),
        KeyValue::new("icq.command.type", execution.type_name.to_owned()),
    ];
    if let Some(error_type) = error_type {
        attributes.push(KeyValue::new("error.type", error_type.to_owned()));
    }
    let instruments = instruments();
    instruments.consumed.add(1, &attributes);
    instruments.duration.record(seconds, &attributes);
}

impl crate::NewCommand {
    /// The `TraceParent` to store for this command: its own, or else the trace context of
    /// the span it is scheduled in ([`current_traceparent`]).
    pub(crate) fn trace_parent_to_store(&self) -> Option<String> {
        self.trace_parent.clone().or_else(current_traceparent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = parse_traceparent(text).unwrap();
        assert_eq!(format_traceparent(&parsed), text);
        assert!(
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01").is_none()
        );
        assert!(
            parse_traceparent("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").is_none()
        );
        assert!(
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x")
                .is_none()
        );
        assert!(
            parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x")
                .is_some()
        );
        assert!(parse_traceparent("").is_none());
    }
}
