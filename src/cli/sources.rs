//! Opening the configured sources: configuration (or `--database-url`, or the embedded
//! default) in, connected [`Queue`]s out, each checked to have its table (the embedded
//! default creates its own on first use, and upgrades an older table it finds to the
//! current schema version: it is icq's own database).
//!
//! Connections fail fast with their cause (a refused port, an unresolvable host, a
//! mistyped password): see the engine's connection probe.

use std::path::PathBuf;

use crate::cli::config::{self, Config, ConfigRequest, SourceConfig};
use crate::cli::error::{CliError, Result};
use icq::ConnectOptions;
use icq::ident::TableName;
use icq::queue::Queue;
use icq::settings::Settings;

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
pub struct Source {
    /// The configured name.
    pub name: String,
    /// Its queue (pool and driver).
    pub queue: Queue,
    /// Its processing settings.
    pub settings: Settings,
}

/// Loads the configuration the request points at (see [`crate::cli::config::load`] for the
/// lookup order).
pub fn load_config(request: &SourceRequest) -> Result<Config> {
    config::load(&ConfigRequest {
        config_path: request.config_path.clone(),
        database_url: request.database_url.clone(),
        source: request.source.clone(),
    })
}

/// Opens every selected source of `config` (all for `None`, or the one named),
/// concurrently.
pub async fn open_selected(config: &Config, source: Option<&str>) -> Result<Vec<Source>> {
    let selected = config.select(source)?;
    let opened = futures::future::join_all(selected.into_iter().map(open_one)).await;
    opened.into_iter().collect()
}

/// Loads the configuration and opens the selected sources.
pub async fn open(request: &SourceRequest) -> Result<Vec<Source>> {
    let config = load_config(request)?;
    open_selected(&config, request.source.as_deref()).await
}

/// Connects one source and checks (or, for the embedded default, creates or upgrades) its
/// table.
pub async fn open_one(source: &SourceConfig) -> Result<Source> {
    let options = ConnectOptions::for_settings(&source.settings).creating_table(source.embedded);
    let queue = Queue::connect(&source.name, source.url.expose(), &source.table, &options).await?;
    Ok(Source {
        name: source.name.clone(),
        queue,
        settings: source.settings.clone(),
    })
}

/// The database `icq migrate` works on, as the command line or configuration names it
/// (see [`migration_target`]).
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
            Err(CliError::Usage(format!(
                "{} sources are configured ({}); choose one with --source",
                many.len(),
                names.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_target_is_the_files_only_source_with_its_table() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("icq.yaml");
        let text = "sources:\n  - { name: shop, url: 'sqlite:shop.db', table: ShopCommands }\n";
        std::fs::write(&file, text).unwrap();
        let request = SourceRequest {
            config_path: Some(file),
            ..SourceRequest::default()
        };
        let target = migration_target(&request)
            .unwrap()
            .expect("the file's only source");
        assert_eq!(target.url, "sqlite:shop.db");
        assert_eq!(
            target.table.map(|t| t.to_string()).as_deref(),
            Some("ShopCommands")
        );
    }

    #[test]
    fn a_database_url_without_a_source_is_the_target_without_a_table() {
        let request = SourceRequest {
            database_url: Some("postgres://app@db/shop".to_string()),
            ..SourceRequest::default()
        };
        let target = migration_target(&request).unwrap().unwrap();
        assert_eq!(target.url, "postgres://app@db/shop");
        assert_eq!(target.table, None);
    }
}
