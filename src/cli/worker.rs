//! `icq work` as a library call: handlers built from the configuration, every selected
//! source added to one [`Processor`].

use std::sync::Arc;

use crate::cli::config::{Config, HandlerConfig, HandlerKind};
use crate::cli::error::Result;
use crate::cli::sources::Source;
use icq::Processor;
use icq::error::Error;
#[cfg(all(unix, feature = "exec"))]
use icq::handler::exec::ExecHandler;
#[cfg(feature = "http")]
use icq::handler::http::HttpHandler;
use icq::handler::{AuthorizeLayer, Handler, Layer, Noop, Registry, TimeoutLayer, TraceLayer};

/// Builds the handler registry the configuration describes. Exec programs are checked
/// here, so a typo fails at startup with the handler's name, the file, line and key (the
/// [`CliError::ConfigCheck`] of `icq config check`) rather than on every command.
/// A handler without a timeout is warned about: its worker keeps renewing the lease, so a
/// hung handler would hold its command until the worker stops.
pub fn registry_from_config(config: &Config) -> Result<Registry> {
    // Positioned in the file, as `icq config check` reports them.
    crate::cli::config::verify::startup_program_check(config)?;
    let mut registry = Registry::new();
    for (type_name, handler) in &config.handlers {
        registry.insert(type_name.clone(), build_handler(type_name, handler)?)?;
        warn_about_timeout(type_name, handler);
    }
    Ok(registry)
}

fn warn_about_timeout(type_name: &str, handler: &HandlerConfig) {
    if matches!(handler.kind, HandlerKind::Noop) {
        return;
    }
    if handler.timeout.is_none() {
        tracing::warn!(
            r#type = type_name,
            "handler has no timeout_seconds: a hung handler holds its command (the lease is renewed while it runs) until the worker stops"
        );
    }
}

fn build_handler(type_name: &str, config: &HandlerConfig) -> Result<Arc<dyn Handler>> {
    let inner: Arc<dyn Handler> = match &config.kind {
        #[cfg(all(unix, feature = "exec"))]
        HandlerKind::Exec { argv } => {
            let exec = ExecHandler::new(argv.clone(), config.timeout)?;
            exec.check_program()
                .map_err(|problem| Error::invalid(format!("handler `{type_name}`: {problem}")))?;
            // The exec handler enforces its own timeout so it can kill the process group.
            Arc::new(exec)
        }
        #[cfg(not(all(unix, feature = "exec")))]
        HandlerKind::Exec { .. } => {
            return Err(Error::Unsupported(format!(
                "handler `{type_name}` runs a program, but this build has no exec handlers \
             (the `exec` feature, Unix only)"
            )));
        }
        HandlerKind::Noop => with_timeout(Arc::new(Noop), config),
        #[cfg(feature = "http")]
        HandlerKind::Http { url, headers } => Arc::new(
            HttpHandler::new(url, headers, config.timeout)
                .map_err(|err| err.prefixed(&format!("handler `{type_name}`")))?,
        ),
        #[cfg(not(feature = "http"))]
        HandlerKind::Http { .. } => {
            return Err(Error::Unsupported(format!(
                "handler `{type_name}` posts to a URL, but this build has no http handlers \
             (the `http` feature)"
            )));
        }
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

/// A processor over `sources` with `registry`'s handlers, each source with its own
/// settings.
pub fn processor(registry: Registry, sources: &[Source]) -> Processor {
    let mut processor = Processor::new(registry);
    for source in sources {
        processor.add_source(source.queue.source_handle(source.settings.clone()));
    }
    processor
}

/// A configured `icq work` run: the configuration's handlers and every selected source,
/// opened, under one [`Processor`]. [`Work::open`] then [`Work::run`] is the whole of
/// `icq work`; the CLI only adds logging, signals, metrics and a progress bar.
pub struct Work {
    sources: Vec<Source>,
    processor: Processor,
}

/// How a [`Work::run`] ended: what each source's processor did.
#[derive(Debug, Clone)]
pub struct WorkSummary {
    /// Per source, by name: its counters when it stopped.
    pub sources: Vec<(String, icq::StatsSnapshot)>,
}

impl WorkSummary {
    /// Commands dead-lettered during the run, across sources (`icq work --fail-on-dead`
    /// fails when it is not zero).
    pub fn dead_lettered(&self) -> u64 {
        self.sources.iter().map(|(_, s)| s.dead_lettered).sum()
    }
}

impl Work {
    /// Loads the configuration `request` names, builds its handlers (exec programs are
    /// checked here) and opens the selected sources.
    pub async fn open(request: &crate::cli::sources::SourceRequest) -> Result<Work> {
        let config = crate::cli::sources::load_config(request)?;
        let registry = registry_from_config(&config)?;
        let sources =
            crate::cli::sources::open_selected(&config, request.source.as_deref()).await?;
        if registry.is_empty() {
            tracing::warn!(
                "no handlers are configured: every command will be dead-lettered as unknown"
            );
        }
        for source in &sources {
            let queues: Vec<String> = source
                .settings
                .queues
                .iter()
                .map(|q| format!("{}:{}", q.name, q.concurrency))
                .collect();
            if queues.is_empty() {
                tracing::info!(source = %source.name, table = %source.queue.table(), engine = %source.queue.engine(), "processing");
            } else {
                tracing::info!(source = %source.name, table = %source.queue.table(), engine = %source.queue.engine(), queues = %queues.join(","), "processing");
            }
        }
        let processor = processor(registry, &sources);
        Ok(Work { sources, processor })
    }

    /// The opened sources (to watch their counters or pending gauges while running).
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Runs until `shutdown` is cancelled (or idle, with `options.until_idle`), then
    /// logs each source's counters and closes its connections.
    pub async fn run(
        self,
        options: icq::RunOptions,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Result<WorkSummary> {
        let outcome = self.processor.run(options, shutdown).await;
        let mut summary = WorkSummary {
            sources: Vec::with_capacity(self.sources.len()),
        };
        for source in &self.sources {
            let stats = source.queue.stats().snapshot();
            if outcome.is_ok() {
                tracing::info!(source = %source.name, succeeded = stats.succeeded, failed = stats.failed, dead_lettered = stats.dead_lettered, snoozed = stats.snoozed, cancelled = stats.cancelled, stale = stats.stale, "stopped");
            }
            summary.sources.push((source.name.clone(), stats));
            source.queue.close().await;
        }
        Ok(outcome.map(|()| summary)?)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_registry_has_a_handler_per_configured_type() {
        let text = "sources: [{ name: main, url: 'sqlite:app.db' }]\nhandlers:\n  \
                    ping: { noop: true }\n  \
                    report.render: { exec: [sh, -c, 'true'], timeout_seconds: 5 }\n";
        let config = crate::cli::config::parse(text, Path::new("icq.yaml"), &|_| None).unwrap();
        let registry = registry_from_config(&config).unwrap();
        assert_eq!(registry.types(), ["ping", "report.render"]);
    }
}
