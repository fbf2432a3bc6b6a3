//! Opening the configured sources: configuration (or `--database-url`, or the embedded
//! default) in, connected [`Queue`]s out, each checked to have its table (the embedded
//! default creates its own on first use).
//!
//! Connections fail fast with their cause (a refused port, an unresolvable host, a
//! mistyped password): see the engine's connection probe.

use std::path::PathBuf;

use crate::config::{self, Config, ConfigRequest, SourceConfig};
use crate::engine::ConnectOptions;
use crate::error::Result;
use crate::ident::TableName;
use crate::queue::Queue;
use crate::settings::Settings;

/// Which sources the command line asked for.
#[derive(Debug, Clone, Default)]
pub struct SourceRequest {
    /// `--config`.
    pub config_path: Option<PathBuf>,
    /// `--database-url` (`$DATABASE_URL` is read by the configuration loader).
    pub database_url: Option<String>,
    /// `--source`.
    pub source: Option<String>,
}

/// A connected source.
#[derive(Clone)]
pub struct OpenSource {
    /// The configured name.
    pub name: String,
    /// Its queue (pool and driver).
    pub queue: Queue,
    /// Its processing settings.
    pub settings: Settings,
}

/// Loads the configuration the request points at.
pub fn load_config(request: &SourceRequest) -> Result<Config> {
    config::load(&ConfigRequest {
        config_path: request.config_path.clone(),
        database_url: request.database_url.clone(),
        source: request.source.clone(),
    })
}

/// Opens every selected source of `config`, concurrently.
pub async fn open_selected(config: &Config, source: Option<&str>) -> Result<Vec<OpenSource>> {
    let selected = config.select(source)?;
    let opened = futures::future::join_all(selected.into_iter().map(open_one)).await;
    opened.into_iter().collect()
}

/// Loads the configuration and opens the selected sources.
pub async fn open(request: &SourceRequest) -> Result<Vec<OpenSource>> {
    let config = load_config(request)?;
    open_selected(&config, request.source.as_deref()).await
}

/// Connects one source and checks (or, for the embedded default, creates) its table.
pub async fn open_one(source: &SourceConfig) -> Result<OpenSource> {
    let options = ConnectOptions {
        // One connection per execution slot is never needed (stamps are batched), but
        // up to four claims, two stamps, lease renewals and the sweep run side by side.
        max_connections: (source.settings.concurrency / 2).clamp(4, 32)
            + crate::engine::MAX_CLAIMS_IN_FLIGHT as u32,
        ..ConnectOptions::default()
    };
    let backend = crate::engine::connect(source.url.expose(), &source.table, &options)
        .await
        .map_err(|err| err.in_source(&source.name))?;
    let queue = Queue::from_backend(&source.name, backend);
    queue.ensure_table(source.embedded).await?;
    Ok(OpenSource {
        name: source.name.clone(),
        queue,
        settings: source.settings.clone(),
    })
}

/// The database `icq migrate` works on, as the command line or configuration names it.
#[derive(Debug, Clone)]
pub struct MigrationTarget {
    /// Its URL, secrets included (redact before printing).
    pub url: String,
    /// The table its configuration names (`table:`), when it comes from a file.
    pub table: Option<TableName>,
}

/// Resolves the one database `migrate` works on: `--database-url` (without `--source`), else
/// `--source`, the only source of the configuration file, or `$DATABASE_URL`. The embedded
/// default does not count (migrations for it are never implied), and several configured
/// sources without `--source` are a usage error naming them.
pub fn migration_target(request: &SourceRequest) -> Result<Option<MigrationTarget>> {
    if let (Some(url), None) = (&request.database_url, &request.source) {
        return Ok(Some(MigrationTarget {
            url: url.clone(),
            table: None,
        }));
    }
    let config = load_config(request)?;
    let selected = config.select(request.source.as_deref())?;
    match selected.as_slice() {
        [one] if one.embedded => Ok(None),
        [one] => Ok(Some(MigrationTarget {
            url: one.url.expose().to_owned(),
            table: Some(one.table.clone()),
        })),
        many => {
            let names: Vec<&str> = many.iter().map(|s| s.name.as_str()).collect();
            Err(crate::error::Error::Usage(format!(
                "{} sources are configured ({}); choose one with --source",
                many.len(),
                names.join(", ")
            )))
        }
    }
}
