//! Without the `otel` feature: the same calls, doing nothing.

/// The span target the `otel` feature's execution spans use.
pub const SPAN_TARGET: &str = "icq::otel";

/// Always `None` without the `otel` feature.
pub fn current_traceparent() -> Option<String> {
    None
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Execution<'a> {
    pub(crate) source: &'a str,
    pub(crate) queue: &'a str,
    pub(crate) type_name: &'a str,
    pub(crate) id: &'a str,
    pub(crate) attempt: u32,
    pub(crate) trace_parent: Option<&'a str>,
}

pub(crate) fn execution_span(_execution: &Execution<'_>) -> tracing::Span {
    tracing::Span::none()
}

pub(crate) fn execution_failed(_span: &tracing::Span, _error_type: &str) {}

pub(crate) fn record_execution(
    _execution: &Execution<'_>,
    _error_type: Option<&str>,
    _seconds: f64,
) {
}

pub(crate) async fn in_execution<F: std::future::Future>(
    _span: &tracing::Span,
    handler: F,
) -> F::Output {
    handler.await
}

impl crate::NewCommand {
    /// The `TraceParent` to store for this command: its own.
    #[allow(dead_code)] // until the engines store it (schema v2 merge)
    pub(crate) fn trace_parent_to_store(&self) -> Option<String> {
        self.trace_parent.clone()
    }
}
