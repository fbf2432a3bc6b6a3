//! Pipeline layers around a handler: each wraps an `Arc<dyn Handler>` in another, so a
//! pipeline reads outside-in, e.g. `TraceLayer` → `AuthorizeLayer` → `TimeoutLayer` → handler.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::Instrument;

use super::{Handler, HandlerError, HandlerResult, Job};

/// Wraps a handler in another.
///
/// Write one to put your own step (metrics, a circuit breaker, ...) into a pipeline.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use icq::handler::{Layer, Noop};
/// use icq::{Handler, HandlerResult, Job};
///
/// struct CountLayer(Arc<AtomicU64>);
/// struct Count(Arc<AtomicU64>, Arc<dyn Handler>);
///
/// impl Layer for CountLayer {
///     fn layer(&self, inner: Arc<dyn Handler>) -> Arc<dyn Handler> {
///         Arc::new(Count(self.0.clone(), inner))
///     }
/// }
/// #[async_trait::async_trait]
/// impl Handler for Count {
///     async fn handle(&self, job: Job) -> HandlerResult {
///         self.0.fetch_add(1, Ordering::Relaxed);
///         self.1.handle(job).await
///     }
/// }
///
/// let count = Arc::new(AtomicU64::new(0));
/// let handler = CountLayer(count.clone()).layer(Arc::new(Noop));
/// # let job = |roles: &[&str]| icq::Job::new("reports.run", serde_json::json!({}))
/// #     .with_source("shop")
/// #     .with_context(icq::Context { roles: roles.iter().map(|r| r.to_string()).collect(), ..Default::default() });
/// // `job(roles)` builds the `Job` a processor would pass, with these captured roles.
/// handler.handle(job(&[])).await?;
/// assert_eq!(count.load(Ordering::Relaxed), 1);
/// # Ok(())
/// # }
/// ```
pub trait Layer {
    /// Returns `inner` wrapped by this layer. See [`Layer`]'s example.
    fn layer(&self, inner: Arc<dyn Handler>) -> Arc<dyn Handler>;
}

/// Refuses, terminally, a job whose captured roles lack any of `required`: the inner
/// handler is never called.
///
/// Workers configured from `icq.yaml` put it in front of a handler with `requires_roles`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use icq::handler::{AuthorizeLayer, Layer, Noop};
/// use icq::Handler;
///
/// let layer = AuthorizeLayer { required: vec!["reports.run".into()] };
/// let handler = layer.layer(Arc::new(Noop));
/// # let job = |roles: &[&str]| icq::Job::new("reports.run", serde_json::json!({}))
/// #     .with_source("shop")
/// #     .with_context(icq::Context { roles: roles.iter().map(|r| r.to_string()).collect(), ..Default::default() });
/// // `job(roles)` builds the `Job` a processor would pass, with these captured roles.
/// handler.handle(job(&["reports.run"])).await?;
/// let refused = handler.handle(job(&["orders.write"])).await.unwrap_err();
/// assert!(refused.terminal);
/// let why = "forbidden: principal <no user> lacks required role(s) reports.run";
/// assert_eq!(refused.message, why);
/// # Ok(())
/// # }
/// ```
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
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use icq::handler::{FnHandler, Layer, TimeoutLayer};
/// use icq::{Handler, Job};
///
/// let slow = Arc::new(FnHandler(|_job: Job| async {
///     tokio::time::sleep(Duration::from_secs(60)).await;
///     Ok(())
/// }));
/// let handler = TimeoutLayer { timeout: Duration::from_millis(20) }.layer(slow);
/// # let job = |roles: &[&str]| icq::Job::new("reports.run", serde_json::json!({}))
/// #     .with_source("shop")
/// #     .with_context(icq::Context { roles: roles.iter().map(|r| r.to_string()).collect(), ..Default::default() });
/// // `job(roles)` builds the `Job` a processor would pass, with these captured roles.
/// let err = handler.handle(job(&[])).await.unwrap_err();
/// assert_eq!((err.message.as_str(), err.terminal), ("timed out after 0.0s", false));
/// # Ok(())
/// # }
/// ```
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
///
/// [`Registry::register`](crate::Registry::register) and
/// [`Registry::insert_exec`](crate::Registry::insert_exec) put every handler behind it;
/// wrap handlers you [`insert`](crate::Registry::insert) yourself.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use icq::handler::{Layer, Noop, TraceLayer};
///
/// let mut registry = icq::Registry::new();
/// registry.insert("smoke.test", TraceLayer.layer(Arc::new(Noop)))?;
/// # Ok::<(), icq::Error>(())
/// ```
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
        let cancellation = job.cancellation.clone();
        let result = self.inner.handle(job).instrument(span.clone()).await;
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        span.in_scope(|| match &result {
            Ok(()) => tracing::debug!(elapsed_ms, "command succeeded"),
            // Asked to stop (an operator's cancel, a lost lease, the end of the shutdown
            // grace): the processor says why, once.
            Err(err) if cancellation.is_cancelled() => {
                tracing::debug!(elapsed_ms, error = %err.message, "command stopped after its cancellation")
            }
            Err(err) if err.snooze.is_some() => tracing::debug!(elapsed_ms, snooze = %err.message, "command snoozed"),
            Err(err) => tracing::warn!(elapsed_ms, error = %err.message, terminal = err.terminal, "command failed"),
        });
        result
    }
}
