//! `icq work` as a library call: handlers built from the configuration, every selected
//! source added to one [`Processor`].

use std::sync::Arc;

use crate::config::{Config, HandlerConfig, HandlerKind};
use crate::error::{Error, Result};
use crate::handler::exec::ExecHandler;
use crate::handler::http::HttpHandler;
use crate::handler::{AuthorizeLayer, Handler, Layer, Noop, Registry, TimeoutLayer, TraceLayer};
use crate::processor::Processor;
use crate::sources::OpenSource;

/// Builds the handler registry the configuration describes. Exec programs are checked
/// here, so a typo fails at startup with the handler's name rather than on every command.
/// A handler without a timeout, or with one longer than a source's lease, is warned
/// about: its worker keeps renewing the lease, so a hung handler would hold its command
/// until the worker stops.
pub fn registry_from_config(config: &Config) -> Result<Registry> {
    let mut registry = Registry::new();
    for (type_name, handler) in &config.handlers {
        registry.insert(type_name.clone(), build_handler(type_name, handler)?)?;
        warn_about_timeout(config, type_name, handler);
    }
    Ok(registry)
}

fn warn_about_timeout(config: &Config, type_name: &str, handler: &HandlerConfig) {
    if matches!(handler.kind, HandlerKind::Noop) {
        return;
    }
    let Some(timeout) = handler.timeout else {
        tracing::warn!(
            r#type = type_name,
            "handler has no timeout_seconds: a hung handler holds its command (the lease is renewed while it runs) until the worker stops"
        );
        return;
    };
    for source in &config.sources {
        if timeout > source.settings.lease() {
            tracing::warn!(
                r#type = type_name,
                source = %source.name,
                timeout_seconds = timeout.as_secs_f64(),
                lease_seconds = source.settings.lease_seconds,
                "handler timeout is longer than the lease: the lease is renewed while it runs, but if this worker dies the command waits a whole lease before another worker retries it"
            );
        }
    }
}

fn build_handler(type_name: &str, config: &HandlerConfig) -> Result<Arc<dyn Handler>> {
    let inner: Arc<dyn Handler> = match &config.kind {
        HandlerKind::Exec { argv } => {
            let exec = ExecHandler::new(argv.clone(), config.timeout)?;
            exec.check_program()
                .map_err(|problem| Error::Usage(format!("handler `{type_name}`: {problem}")))?;
            // The exec handler enforces its own timeout so it can kill the process group.
            Arc::new(exec)
        }
        HandlerKind::Noop => with_timeout(Arc::new(Noop), config),
        HandlerKind::Http { url, headers } => Arc::new(
            HttpHandler::new(url, headers, config.timeout)
                .map_err(|err| Error::Usage(format!("handler `{type_name}`: {err}")))?,
        ),
    };
    let authorized = AuthorizeLayer {
        required: config.requires_roles.clone(),
    }
    .layer(inner);
    Ok(TraceLayer.layer(authorized))
}

fn with_timeout(handler: Arc<dyn Handler>, config: &HandlerConfig) -> Arc<dyn Handler> {
    match config.timeout {
        Some(timeout) => TimeoutLayer { timeout }.layer(handler),
        None => handler,
    }
}

/// A processor over `sources` with `registry`'s handlers.
pub fn processor(registry: Registry, sources: &[OpenSource]) -> Processor {
    let mut processor = Processor::new(registry);
    for source in sources {
        processor.add_source(source.queue.source_handle(source.settings.clone()));
    }
    processor
}
