//! Pipeline layers around a handler: each wraps an `Arc<dyn Handler>` in another, so a
//! pipeline reads outside-in, e.g. `TraceLayer` → `AuthorizeLayer` → `TimeoutLayer` → handler.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::Instrument;

use super::{Handler, HandlerError, HandlerResult, Job};

/// Wraps a handler in another.
pub trait Layer {
    /// Returns `inner` wrapped by this layer.
    fn layer(&self, inner: Arc<dyn Handler>) -> Arc<dyn Handler>;
}

/// Refuses, terminally, a job whose captured roles lack any of `required`: the inner
/// handler is never called.
#[derive(Debug, Clone)]
pub struct AuthorizeLayer {
    /// Roles the captured principal must hold.
    pub required: Vec<String>,
}

struct Authorize {
    required: Vec<String>,
    inner: Arc<dyn Handler>,
}

impl Layer for AuthorizeLayer {
    fn layer(&self, inner: Arc<dyn Handler>) -> Arc<dyn Handler> {
        if self.required.is_empty() {
            return inner;
        }
        Arc::new(Authorize {
            required: self.required.clone(),
            inner,
        })
    }
}

#[async_trait]
impl Handler for Authorize {
    async fn handle(&self, job: Job) -> HandlerResult {
        let missing: Vec<&str> = self
            .required
            .iter()
            .filter(|role| !job.context.roles.contains(role))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            let who = job.context.user_id.as_deref().unwrap_or("<no user>");
            return Err(HandlerError::terminal(format!(
                "forbidden: principal {who} lacks required role(s) {}",
                missing.join(", ")
            )));
        }
        self.inner.handle(job).await
    }
}

/// Fails (retryably) a job that runs longer than `timeout`; the inner future is dropped.
#[derive(Debug, Clone, Copy)]
pub struct TimeoutLayer {
    /// The longest one execution may take.
    pub timeout: Duration,
}

struct Timeout {
    timeout: Duration,
    inner: Arc<dyn Handler>,
}

impl Layer for TimeoutLayer {
    fn layer(&self, inner: Arc<dyn Handler>) -> Arc<dyn Handler> {
        Arc::new(Timeout {
            timeout: self.timeout,
            inner,
        })
    }
}

#[async_trait]
impl Handler for Timeout {
    async fn handle(&self, job: Job) -> HandlerResult {
        match tokio::time::timeout(self.timeout, self.inner.handle(job)).await {
            Ok(result) => result,
            Err(_) => Err(HandlerError::retry(format!(
                "timed out after {:.1}s",
                self.timeout.as_secs_f64()
            ))),
        }
    }
}

/// Runs the job inside a tracing span carrying id, type, attempt, source and
/// correlation id, and logs the outcome.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceLayer;

struct Trace {
    inner: Arc<dyn Handler>,
}

impl Layer for TraceLayer {
    fn layer(&self, inner: Arc<dyn Handler>) -> Arc<dyn Handler> {
        Arc::new(Trace { inner })
    }
}

#[async_trait]
impl Handler for Trace {
    async fn handle(&self, job: Job) -> HandlerResult {
        let span = tracing::info_span!(
            "command",
            id = %job.id,
            r#type = %job.type_name,
            attempt = job.attempt,
            source = %job.source,
            correlation_id = job.context.correlation_id.as_deref().unwrap_or(""),
        );
        let started = std::time::Instant::now();
        let result = self.inner.handle(job).instrument(span.clone()).await;
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        span.in_scope(|| match &result {
            Ok(()) => tracing::debug!(elapsed_ms, "command succeeded"),
            Err(err) => tracing::warn!(elapsed_ms, error = %err.message, terminal = err.terminal, "command failed"),
        });
        result
    }
}
