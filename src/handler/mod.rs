//! Handlers: what runs a command. A [`Handler`] receives a [`Job`] (payload plus the
//! captured context) and returns `Ok` or a [`HandlerError`]; a [`Registry`] maps type
//! names to handlers, each wrapped in a pipeline of [`Layer`]s (authorization on the
//! captured roles, timeout, tracing).
//!
//! Typed Rust handlers take a deserialized [`CommandType`]; the `exec` handler runs a
//! program with the payload on stdin (see [`exec`]).

#[cfg(all(unix, feature = "exec"))]
pub mod exec;
#[cfg(feature = "http")]
pub mod http;
pub mod layers;
pub(crate) mod program;
pub use program::program_problem;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;

use tokio_util::sync::CancellationToken;

use crate::command::{CommandId, CommandType, Context};

pub use layers::{AuthorizeLayer, Layer, TimeoutLayer, TraceLayer};

/// One execution of one command.
///
/// The processor builds one per attempt; build one yourself ([`Job::new`] and the
/// `with_*` builders) to test a handler without a database.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use icq::handler::{Handler, Noop};
/// use icq::{Context, Job};
///
/// let job = Job::new("orders.receipt", serde_json::json!({ "order": 42 }))
///     .with_attempt(2)
///     .with_source("shop")
///     .with_context(Context { user_id: Some("u-7".into()), ..Context::default() });
/// assert_eq!((job.attempt, &*job.source), (2, "shop"));
/// assert_eq!(Noop.handle(job).await, Ok(()));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Job {
    /// The command's id.
    pub id: CommandId,
    /// Its type name.
    pub type_name: String,
    /// Its payload.
    pub payload: serde_json::Value,
    /// The attempt under way, 1-based.
    pub attempt: u32,
    /// The configured source the row came from.
    pub source: Arc<str>,
    /// The captured scheduling context.
    pub context: Context,
    /// Fires when this execution must stop: an operator cancelled the command (`icq
    /// cancel` on a running row), its lease was lost, or the shutdown grace ran out.
    /// After it fires the handler has [`STOP_GRACE`] to return (whatever it returns then
    /// is stamped when the lease is still held, and dropped otherwise); then its future
    /// is dropped. A long handler can watch it:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use icq::{HandlerError, HandlerResult, Job};
    ///
    /// async fn export(job: Job) -> HandlerResult {
    ///     for _chunk in 0..1_000 {
    ///         if job.cancellation.is_cancelled() {
    ///             return Err(HandlerError::retry("stopped between chunks"));
    ///         }
    ///         tokio::select! {
    ///             _ = job.cancellation.cancelled() => return Err(HandlerError::retry("stopped")),
    ///             _ = tokio::time::sleep(Duration::from_millis(1)) => {} // one chunk of work
    ///         }
    ///     }
    ///     Ok(())
    /// }
    /// # let job = Job::new("t", serde_json::json!({}));
    /// job.cancellation.cancel(); // what the processor does on `icq cancel`
    /// assert!(export(job).await.is_err());
    /// # }
    /// ```
    pub cancellation: CancellationToken,
}

impl Job {
    /// A first attempt (`attempt` 1) of a command of `type_name` with `payload`: a new
    /// id, source `test`, an empty context and a cancellation that has not fired. See
    /// [`Job`]'s example.
    pub fn new(type_name: impl Into<String>, payload: serde_json::Value) -> Job {
        Job {
            id: CommandId::new(),
            type_name: type_name.into(),
            payload,
            attempt: 1,
            source: Arc::from("test"),
            context: Context::default(),
            cancellation: CancellationToken::new(),
        }
    }

    /// This job with [`Job::id`] set.
    pub fn with_id(mut self, id: CommandId) -> Job {
        self.id = id;
        self
    }

    /// This job with [`Job::attempt`] set (1-based). See [`Job`]'s example.
    pub fn with_attempt(mut self, attempt: u32) -> Job {
        self.attempt = attempt;
        self
    }

    /// This job with [`Job::source`] set. See [`Job`]'s example.
    pub fn with_source(mut self, source: impl Into<Arc<str>>) -> Job {
        self.source = source.into();
        self
    }

    /// This job with [`Job::context`] set. See [`Job`]'s example.
    pub fn with_context(mut self, context: Context) -> Job {
        self.context = context;
        self
    }

    /// This job with [`Job::cancellation`] set.
    pub fn with_cancellation(mut self, cancellation: CancellationToken) -> Job {
        self.cancellation = cancellation;
        self
    }
}

/// How long a handler has to return once its [`Job::cancellation`] fired (an exec
/// handler's process group gets SIGTERM then, and SIGKILL when this runs out) before the
/// processor drops it.
///
/// # Examples
///
/// ```
/// assert_eq!(icq::handler::STOP_GRACE, std::time::Duration::from_secs(2));
/// ```
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The delay of a snooze that names none (exec exit code 75 without a `snooze <seconds>`
/// line, http 429/503 without `Retry-After`): 10 s, the default
/// `retry_backoff_base_seconds`.
///
/// # Examples
///
/// ```
/// assert_eq!(icq::handler::DEFAULT_SNOOZE, std::time::Duration::from_secs(10));
/// ```
pub const DEFAULT_SNOOZE: std::time::Duration = std::time::Duration::from_secs(10);

/// The shortest snooze: 1 s. A handler asking for less (exec `snooze 0`, http
/// `Retry-After: 0` or a date already past, `HandlerError::snooze(Duration::ZERO)`) is
/// run again after this long, so an endpoint that keeps answering "not now, retry at
/// once" gets one request a second per command rather than as many as the worker can send.
///
/// # Examples
///
/// ```
/// assert_eq!(icq::handler::MIN_SNOOZE, std::time::Duration::from_secs(1));
/// ```
pub const MIN_SNOOZE: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest snooze: 30 days. A longer one (or a negative or unreadable one) fails the
/// attempt like an error, with the reason in `LastError`.
///
/// # Examples
///
/// ```
/// assert_eq!(icq::handler::MAX_SNOOZE.as_secs(), 30 * 86_400);
/// ```
pub const MAX_SNOOZE: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

tokio::task_local! {
    static CURRENT_CONTEXT: Context;
}

/// The captured context of the command running on this task, if any: lets code deep in
/// a handler see (and propagate into commands it schedules) the original principal.
///
/// The processor sets it around every execution (see [`with_context`]).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use icq::{Context, NewCommand, current_context};
///
/// // Deep inside a handler: schedule a follow-up on behalf of the same principal.
/// fn follow_up() -> NewCommand {
///     let context = current_context().unwrap_or_default();
///     NewCommand::new("orders.ship", serde_json::json!({})).context(context)
/// }
///
/// let context = Context { user_id: Some("u-17".into()), ..Context::default() };
/// let command = icq::handler::with_context(context, async { follow_up() }).await;
/// assert_eq!(command.context.user_id.as_deref(), Some("u-17"));
/// assert_eq!(current_context(), None); // outside any command
/// # Ok(())
/// # }
/// ```
pub fn current_context() -> Option<Context> {
    CURRENT_CONTEXT.try_with(Clone::clone).ok()
}

/// Runs `future` with `context` as the [`current_context`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use icq::{Context, current_context};
/// use icq::handler::with_context;
///
/// let context = Context { tenant_id: Some("acme".into()), ..Context::default() };
/// let seen = with_context(context.clone(), async { current_context() }).await;
/// assert_eq!(seen, Some(context));
/// # Ok(())
/// # }
/// ```
pub async fn with_context<F: Future>(context: Context, future: F) -> F::Output {
    CURRENT_CONTEXT.scope(context, future).await
}

/// Why a handler did not succeed.
///
/// Any `anyhow::Error` converts into a retryable one (with the `anyhow` feature, on in the
/// default build), so `?` works in handlers.
///
/// # Examples
///
/// ```
/// use icq::{HandlerError, HandlerResult};
///
/// fn charge(text: &str) -> HandlerResult {
///     let amount: i64 = text.parse().map_err(anyhow::Error::from)?; // retryable
///     if amount < 0 {
///         return Err(HandlerError::terminal("a negative amount can never be charged"));
///     }
///     Ok(())
/// }
///
/// assert_eq!(charge("5"), Ok(()));
/// assert!(charge("-1").unwrap_err().terminal);
/// assert!(!charge("five").unwrap_err().terminal); // from the `anyhow::Error`
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandlerError {
    /// The text stored in `LastError`.
    pub message: String,
    /// Terminal errors dead-letter at once; others consume an attempt and retry.
    pub terminal: bool,
    /// Set by [`HandlerError::snooze`]: run again after this delay without consuming an
    /// attempt (`LastError` is left as it was).
    pub snooze: Option<std::time::Duration>,
}

impl HandlerError {
    /// A failure that will be retried with backoff (until `max_attempts` is used up).
    ///
    /// # Examples
    ///
    /// ```
    /// let err = icq::HandlerError::retry("smtp down");
    /// assert!(!err.terminal);
    /// assert_eq!(err.to_string(), "smtp down");
    /// ```
    pub fn retry(message: impl Into<String>) -> HandlerError {
        HandlerError {
            message: message.into(),
            terminal: false,
            snooze: None,
        }
    }

    /// A failure that retrying cannot fix: the row is dead-lettered at once.
    ///
    /// # Examples
    ///
    /// ```
    /// let err = icq::HandlerError::terminal("order 42 does not exist");
    /// assert!(err.terminal);
    /// ```
    pub fn terminal(message: impl Into<String>) -> HandlerError {
        HandlerError {
            message: message.into(),
            terminal: true,
            snooze: None,
        }
    }

    /// Not now: run the command again after `delay`, without consuming an attempt
    /// (a snooze; `LastError` is kept). A command snoozes at most `max_snoozes`
    /// times (default 1000), then is dead-lettered saying so; a delay longer than
    /// [`MAX_SNOOZE`] fails the attempt instead, and one shorter than [`MIN_SNOOZE`]
    /// (zero included) waits [`MIN_SNOOZE`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use icq::{HandlerError, HandlerResult, Job};
    ///
    /// async fn sync_inventory(job: Job) -> HandlerResult {
    ///     let busy = job.payload["warehouse_busy"].as_bool().unwrap_or(false);
    ///     if busy {
    ///         // Not a failure: come back in a minute, with the attempt given back.
    ///         return Err(HandlerError::snooze(Duration::from_secs(60)));
    ///     }
    ///     Ok(())
    /// }
    /// let err = HandlerError::snooze(Duration::from_secs(60));
    /// assert_eq!(err.snooze, Some(Duration::from_secs(60)));
    /// assert!(!err.terminal);
    /// ```
    pub fn snooze(delay: std::time::Duration) -> HandlerError {
        HandlerError {
            message: format!("snoozed for {:.3}s", delay.as_secs_f64()),
            terminal: false,
            snooze: Some(delay),
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HandlerError {}

#[cfg(feature = "anyhow")]
impl From<anyhow::Error> for HandlerError {
    fn from(err: anyhow::Error) -> Self {
        HandlerError::retry(format!("{err:#}"))
    }
}

/// What a handler returns. See [`HandlerError`]'s example.
pub type HandlerResult = Result<(), HandlerError>;

/// Runs commands of one type.
///
/// Implement it (with `#[async_trait]`) for a handler that holds state; for a closure, use
/// [`Registry::register`] (typed) or [`FnHandler`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use icq::{Handler, HandlerError, HandlerResult, Job, Registry};
///
/// struct Mailer {
///     sent: AtomicU64,
/// }
///
/// #[async_trait::async_trait]
/// impl Handler for Mailer {
///     async fn handle(&self, job: Job) -> HandlerResult {
///         let to = job.payload["to"].as_str().ok_or_else(|| HandlerError::terminal("no `to`"))?;
///         println!("mail to {to} (attempt {})", job.attempt);
///         self.sent.fetch_add(1, Ordering::Relaxed);
///         Ok(())
///     }
/// }
///
/// let mailer = Arc::new(Mailer { sent: AtomicU64::new(0) });
/// Registry::new().insert("email.send", mailer.clone())?;
/// # let job = |payload: serde_json::Value| icq::Job::new("orders.receipt", payload).with_source("shop");
/// // `job(payload)` builds the `Job` a processor would pass (attempt 1).
/// mailer.handle(job(serde_json::json!({ "to": "a@example.com" }))).await?;
/// assert!(mailer.handle(job(serde_json::json!({}))).await.unwrap_err().terminal);
/// assert_eq!(mailer.sent.load(Ordering::Relaxed), 1);
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Executes `job`. See [`Handler`]'s example.
    async fn handle(&self, job: Job) -> HandlerResult;
}

/// A handler that succeeds at once (`noop: true`): for smoke tests and benchmarks.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use icq::handler::{Handler, Noop};
///
/// let mut registry = icq::Registry::new();
/// registry.insert("smoke.test", Arc::new(Noop))?;
/// # let job = |payload: serde_json::Value| icq::Job::new("orders.receipt", payload).with_source("shop");
/// // `job(payload)` builds the `Job` a processor would pass (attempt 1).
/// assert_eq!(Noop.handle(job(serde_json::json!(null))).await, Ok(()));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Noop;

#[async_trait]
impl Handler for Noop {
    async fn handle(&self, _job: Job) -> HandlerResult {
        Ok(())
    }
}

/// Adapts an async closure over a typed command into a [`Handler`]. The payload is
/// deserialized first; a payload that does not fit the type is a terminal error.
///
/// [`Registry::register`] builds one (behind the tracing layer); there is no other way to
/// make one.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use icq::{CommandType, Handler, Registry};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct SendReceipt {
///     order_id: i64,
/// }
/// impl CommandType for SendReceipt {
///     const TYPE: &'static str = "orders.send_receipt";
/// }
///
/// let mut registry = Registry::new();
/// registry.register::<SendReceipt, _, _>(|receipt, _job| async move {
///     assert_eq!(receipt.order_id, 42);
///     Ok(())
/// })?;
/// let handler = registry.get(SendReceipt::TYPE).unwrap();
/// # let job = |payload: serde_json::Value| icq::Job::new("orders.receipt", payload).with_source("shop");
/// // `job(payload)` builds the `Job` a processor would pass (attempt 1).
/// handler.handle(job(serde_json::json!({ "order_id": 42 }))).await?;
/// let err = handler.handle(job(serde_json::json!({ "order": "x" }))).await.unwrap_err();
/// assert!(err.terminal, "{err}"); // payload does not match orders.send_receipt: ...
/// # Ok(())
/// # }
/// ```
pub struct TypedHandler<C, F> {
    function: F,
    _command: PhantomData<fn(C)>,
}

#[async_trait]
impl<C, F, Fut> Handler for TypedHandler<C, F>
where
    C: CommandType,
    F: Fn(C, Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    async fn handle(&self, job: Job) -> HandlerResult {
        // Deserialized from a borrow: the job keeps its payload and no deep copy is made.
        let command = <C as serde::Deserialize>::deserialize(&job.payload).map_err(|e| {
            HandlerError::terminal(format!("payload does not match {}: {e}", C::TYPE))
        })?;
        (self.function)(command, job).await
    }
}

/// Adapts an async closure over the raw [`Job`] into a [`Handler`].
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use icq::handler::FnHandler;
/// use icq::{HandlerError, Job, Registry};
///
/// let mut registry = Registry::new();
/// registry.insert(
///     "webhook.forward",
///     Arc::new(FnHandler(|job: Job| async move {
///         match job.payload.get("url") {
///             Some(_) => Ok(()),
///             None => Err(HandlerError::terminal("no url in the payload")),
///         }
///     })),
/// )?;
/// assert_eq!(registry.types(), ["webhook.forward"]);
/// # Ok::<(), icq::Error>(())
/// ```
pub struct FnHandler<F>(pub F);

#[async_trait]
impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    async fn handle(&self, job: Job) -> HandlerResult {
        (self.0)(job).await
    }
}

/// Type names mapped to their handler pipelines.
///
/// A [`Processor`](crate::Processor) runs a registry's handlers; a claimed command of a
/// type with no handler is dead-lettered (unless
/// [`Settings::claim_only_handled_types`](crate::Settings::claim_only_handled_types)).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use icq::Registry;
///
/// let mut registry = Registry::new();
/// assert!(registry.is_empty());
/// registry
///     .insert("smoke.test", Arc::new(icq::handler::Noop))?
///     .insert_exec("report.render", vec!["render-report".into()], None)?;
/// assert_eq!(registry.types(), ["report.render", "smoke.test"]);
/// assert!(registry.get("smoke.test").is_some());
/// assert!(registry.get("unknown").is_none());
/// # Ok::<(), icq::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    handlers: HashMap<String, Arc<dyn Handler>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.handlers.keys().collect();
        names.sort();
        f.debug_struct("Registry").field("types", &names).finish()
    }
}

impl Registry {
    /// An empty registry. See [`Registry`]'s example.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers `handler` for `type_name` as is (wrap it in layers first if needed).
    /// A second registration of the same type is an error.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use icq::handler::{AuthorizeLayer, Layer, Noop, TimeoutLayer, TraceLayer};
    ///
    /// let handler = TimeoutLayer { timeout: Duration::from_secs(5) }.layer(Arc::new(Noop));
    /// let handler = AuthorizeLayer { required: vec!["reports.run".into()] }.layer(handler);
    /// let mut registry = icq::Registry::new();
    /// registry.insert("reports.run", TraceLayer.layer(handler))?;
    /// assert!(registry.insert("reports.run", Arc::new(Noop)).is_err()); // registered twice
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn insert(
        &mut self,
        type_name: impl Into<String>,
        handler: Arc<dyn Handler>,
    ) -> crate::Result<&mut Self> {
        let type_name = type_name.into();
        if self.handlers.contains_key(&type_name) {
            return Err(crate::Error::invalid(format!(
                "a handler for command type `{type_name}` is registered twice"
            )));
        }
        self.handlers.insert(type_name, handler);
        Ok(self)
    }

    /// Registers a typed handler for `C::TYPE` behind the tracing layer. The closure gets
    /// the deserialized command and the [`Job`] (attempt, context, ...).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{CommandType, HandlerError, Registry};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct SendReceipt {
    ///     order_id: i64,
    /// }
    /// impl CommandType for SendReceipt {
    ///     const TYPE: &'static str = "orders.send_receipt";
    /// }
    ///
    /// let mut registry = Registry::new();
    /// registry.register::<SendReceipt, _, _>(|receipt, job| async move {
    ///     if receipt.order_id <= 0 {
    ///         return Err(HandlerError::terminal("no such order"));
    ///     }
    ///     println!("receipt {} for {:?}", receipt.order_id, job.context.user_id);
    ///     Ok(())
    /// })?;
    /// assert_eq!(registry.types(), [SendReceipt::TYPE]);
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn register<C, F, Fut>(&mut self, function: F) -> crate::Result<&mut Self>
    where
        C: CommandType,
        F: Fn(C, Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let handler: Arc<dyn Handler> = Arc::new(TypedHandler {
            function,
            _command: PhantomData,
        });
        self.insert(C::TYPE, TraceLayer.layer(handler))
    }

    /// Registers an [`exec::ExecHandler`] running `argv` for `type_name`, behind the
    /// tracing layer; `timeout` kills the program's process group when it runs too long.
    /// The program is not looked up here (see [`exec::ExecHandler::check_program`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let mut registry = icq::Registry::new();
    /// let argv = vec!["/usr/local/bin/send-invoice".into(), "--quiet".into()];
    /// registry.insert_exec("invoices.send", argv, Some(Duration::from_secs(30)))?;
    /// assert!(registry.insert_exec("broken", vec![], None).is_err()); // no program
    /// # Ok::<(), icq::Error>(())
    /// ```
    #[cfg(all(unix, feature = "exec"))]
    pub fn insert_exec(
        &mut self,
        type_name: impl Into<String>,
        argv: Vec<String>,
        timeout: Option<std::time::Duration>,
    ) -> crate::Result<&mut Self> {
        let handler: Arc<dyn Handler> = Arc::new(exec::ExecHandler::new(argv, timeout)?);
        self.insert(type_name, TraceLayer.layer(handler))
    }

    /// The pipeline for `type_name`, if one is registered. See [`Registry`]'s example.
    pub fn get(&self, type_name: &str) -> Option<&Arc<dyn Handler>> {
        self.handlers.get(type_name)
    }

    /// The registered type names, sorted. See [`Registry`]'s example.
    pub fn types(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.handlers.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// True when nothing is registered. See [`Registry`]'s example.
    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }
}

/// `seconds` (text) as a snooze delay: a non-negative number up to [`MAX_SNOOZE`].
#[cfg_attr(
    not(any(feature = "http", all(unix, feature = "exec"))),
    allow(dead_code)
)]
pub(crate) fn checked_snooze_seconds(seconds: &str) -> Result<std::time::Duration, String> {
    let shown = crate::redact::bounded(seconds, 40);
    let value: f64 = seconds
        .parse()
        .ok()
        .filter(|v: &f64| !v.is_nan())
        .ok_or_else(|| format!("snooze delay `{shown}` is not a number of seconds"))?;
    if value < 0.0 {
        return Err(format!("snooze delay `{shown}` is negative"));
    }
    if value > MAX_SNOOZE.as_secs_f64() {
        return Err(format!(
            "snooze delay `{shown}` s is longer than the most, {} s (30 days)",
            MAX_SNOOZE.as_secs()
        ));
    }
    Ok(std::time::Duration::from_secs_f64(value))
}
