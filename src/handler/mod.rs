//! Handlers: what runs a command. A [`Handler`] receives a [`Job`] (payload plus the
//! captured context) and returns `Ok` or a [`HandlerError`]; a [`Registry`] maps type
//! names to handlers, each wrapped in a pipeline of [`Layer`]s (authorization on the
//! captured roles, timeout, tracing).
//!
//! Typed Rust handlers take a deserialized [`CommandType`]; the `exec` handler runs a
//! program with the payload on stdin (see [`exec`]).

pub mod exec;
pub mod http;
pub mod layers;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;

use crate::command::{CommandId, CommandType, Context};

pub use layers::{AuthorizeLayer, Layer, TimeoutLayer, TraceLayer};

/// One execution of one command.
#[derive(Debug, Clone)]
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
}

tokio::task_local! {
    static CURRENT_CONTEXT: Context;
}

/// The captured context of the command running on this task, if any: lets code deep in
/// a handler see (and propagate into commands it schedules) the original principal.
pub fn current_context() -> Option<Context> {
    CURRENT_CONTEXT.try_with(Clone::clone).ok()
}

/// Runs `future` with `context` as the [`current_context`].
pub async fn with_context<F: Future>(context: Context, future: F) -> F::Output {
    CURRENT_CONTEXT.scope(context, future).await
}

/// Why a handler did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    /// The text stored in `LastError`.
    pub message: String,
    /// Terminal errors dead-letter at once; others consume an attempt and retry.
    pub terminal: bool,
}

impl HandlerError {
    /// A failure that will be retried with backoff.
    pub fn retry(message: impl Into<String>) -> HandlerError {
        HandlerError {
            message: message.into(),
            terminal: false,
        }
    }

    /// A failure that retrying cannot fix: the row is dead-lettered at once.
    pub fn terminal(message: impl Into<String>) -> HandlerError {
        HandlerError {
            message: message.into(),
            terminal: true,
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HandlerError {}

impl From<anyhow::Error> for HandlerError {
    fn from(err: anyhow::Error) -> Self {
        HandlerError::retry(format!("{err:#}"))
    }
}

/// What a handler returns.
pub type HandlerResult = Result<(), HandlerError>;

/// Runs commands of one type.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Executes `job`.
    async fn handle(&self, job: Job) -> HandlerResult;
}

/// A handler that succeeds at once (`noop: true`): for smoke tests and benchmarks.
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
        let command: C = serde_json::from_value(job.payload.clone()).map_err(|e| {
            HandlerError::terminal(format!("payload does not match {}: {e}", C::TYPE))
        })?;
        (self.function)(command, job).await
    }
}

/// Adapts an async closure over the raw [`Job`] into a [`Handler`].
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
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers `handler` for `type_name` as is (wrap it in layers first if needed).
    /// A second registration of the same type is an error.
    pub fn insert(
        &mut self,
        type_name: impl Into<String>,
        handler: Arc<dyn Handler>,
    ) -> crate::Result<&mut Self> {
        let type_name = type_name.into();
        if self.handlers.contains_key(&type_name) {
            return Err(crate::Error::Usage(format!(
                "a handler for command type `{type_name}` is registered twice"
            )));
        }
        self.handlers.insert(type_name, handler);
        Ok(self)
    }

    /// Registers a typed handler for `C::TYPE` behind the tracing layer.
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
    pub fn insert_exec(
        &mut self,
        type_name: impl Into<String>,
        argv: Vec<String>,
        timeout: Option<std::time::Duration>,
    ) -> crate::Result<&mut Self> {
        let handler: Arc<dyn Handler> = Arc::new(exec::ExecHandler::new(argv, timeout)?);
        self.insert(type_name, TraceLayer.layer(handler))
    }

    /// The pipeline for `type_name`, if one is registered.
    pub fn get(&self, type_name: &str) -> Option<&Arc<dyn Handler>> {
        self.handlers.get(type_name)
    }

    /// The registered type names, sorted.
    pub fn types(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.handlers.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }
}
