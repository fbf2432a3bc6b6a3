//! The quick start's sample workload: a few commands with built-in handlers, one of
//! which always fails so that retries and a dead letter can be seen, run in a table of
//! their own ([`TABLE`]) that each run starts afresh.

use std::sync::Arc;

use serde::Serialize;

use crate::cli::config::SourceConfig;
use crate::cli::error::{CliError, Result};
use crate::cli::sources::Source;
use crate::cli::sources::SourceRequest;
use icq::ConnectOptions;
use icq::admin::{self, DeadLetterQuery, DeadLetterReport, PendingReport};
use icq::command::{Context, NewCommand};
use icq::handler::{FnHandler, HandlerError, Job, Layer, Registry, TraceLayer};
use icq::ident::TableName;
use icq::queue::Queue;
use icq::settings::Settings;

/// The type the demo's succeeding handler runs.
pub const GREET: &str = "demo.greet";
/// The type the demo's always-failing handler runs.
pub const FLAKY: &str = "demo.charge_card";

/// Handlers for the sample commands.
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    let greet = FnHandler(|job: Job| async move {
        let name = job
            .payload
            .get("name")
            .and_then(|n| n.as_str())
            .unwrap_or("world");
        tracing::info!(name, "hello");
        Ok(())
    });
    let flaky = FnHandler(|job: Job| async move {
        Err(HandlerError::retry(format!(
            "card declined (attempt {}): the demo handler always fails",
            job.attempt
        )))
    });
    // Both names are distinct constants, so registration cannot collide.
    let _ = registry.insert(GREET, TraceLayer.layer(Arc::new(greet)));
    let _ = registry.insert(FLAKY, TraceLayer.layer(Arc::new(flaky)));
    registry
}

/// The sample commands: four greetings and one charge that keeps failing.
pub fn commands() -> Vec<NewCommand> {
    let context = Context {
        user_id: Some("demo-user".into()),
        roles: vec!["demo".into()],
        tenant_id: Some("demo-tenant".into()),
        correlation_id: Some("quickstart".into()),
    };
    let mut commands: Vec<NewCommand> = ["Ada", "Grace", "Edsger", "Barbara"]
        .iter()
        .map(|name| {
            NewCommand::new(GREET, serde_json::json!({ "name": name })).context(context.clone())
        })
        .collect();
    commands.push(
        NewCommand::new(
            FLAKY,
            serde_json::json!({ "order_id": 42, "amount_cents": 1999 }),
        )
        .context(context),
    );
    commands
}

/// Settings that let the failing command exhaust its attempts within a second: three
/// attempts, retried at once.
pub fn settings() -> Settings {
    let mut settings = Settings::default();
    settings.max_attempts = 3;
    settings.retry_backoff_base_seconds = 0.0;
    settings.max_retry_backoff_seconds = 0.0;
    settings.polling_interval_seconds = 0.2;
    settings
}

/// The tour's own table: the samples never mix with a source's real commands, and each
/// run starts from an empty table, so running the tour twice leaves the same counts.
pub const TABLE: &str = "IcqQuickstart";

/// The tour's table name.
pub fn table() -> TableName {
    // A constant plain identifier: it always parses.
    TableName::parse(TABLE).unwrap_or_default()
}

/// The database the tour runs against: the one the command line names (`--config`,
/// `--source`, `--database-url`), or else the embedded default. Ambient configuration
/// (`./icq.yaml`, `$DATABASE_URL`) is not used: the tour only writes where it was told to.
/// The table is always [`TABLE`], with the demo's [`settings`].
pub fn target(request: &SourceRequest) -> Result<SourceConfig> {
    let named =
        request.config_path.is_some() || request.database_url.is_some() || request.source.is_some();
    let mut source = if named {
        let config = crate::cli::sources::load_config(request)?;
        let selected = config.select(request.source.as_deref())?;
        match selected.as_slice() {
            [one] => (*one).clone(),
            _ => {
                return Err(CliError::Usage(
                    "the quick start runs on one source: pick it with --source NAME".into(),
                ));
            }
        }
    } else {
        crate::cli::config::embedded_default()?
    };
    source.table = table();
    source.settings = settings();
    Ok(source)
}

/// Connects to the tour's database and gives it a fresh, empty [`TABLE`] (the previous
/// run's samples are dropped with the old table).
pub async fn reset(source: &SourceConfig) -> Result<Source> {
    let options = ConnectOptions::default().creating_table(true);
    let queue = Queue::connect(&source.name, source.url.expose(), &source.table, &options).await?;
    queue.drop_table().await?;
    queue.ensure_table(true).await?;
    Ok(Source {
        name: source.name.clone(),
        queue,
        settings: source.settings.clone(),
    })
}

/// What one run of the tour did and left behind: the one document `icq quickstart
/// --format json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct TourReport {
    /// The database, password redacted.
    pub database: String,
    /// The tour's table.
    pub table: String,
    /// How many sample commands were scheduled.
    pub scheduled: u64,
    /// Commands that succeeded.
    pub succeeded: u64,
    /// Failed attempts that were retried.
    pub failed_attempts: u64,
    /// Commands dead-lettered.
    pub dead_lettered: u64,
    /// `icq pending` on the tour's table afterwards.
    pub pending: PendingReport,
    /// `icq dead-letters list` on the tour's table afterwards.
    pub dead_letters: DeadLetterReport,
}

impl TourReport {
    /// Reads the counters of the finished run and the state of the tour's table.
    pub async fn collect(source: &Source, url: &str, scheduled: u64) -> Result<TourReport> {
        let stats = source.queue.stats().snapshot();
        let sources = std::slice::from_ref(&source.queue);
        Ok(TourReport {
            database: icq::redact::redact_url(url),
            table: source.queue.table().to_string(),
            scheduled,
            succeeded: stats.succeeded,
            failed_attempts: stats.failed,
            dead_lettered: stats.dead_lettered,
            pending: admin::pending(sources, false).await?,
            dead_letters: admin::dead_letters(sources, &DeadLetterQuery::default()).await?,
        })
    }
}
