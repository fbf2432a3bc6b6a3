//! `icq.yaml`: the sources icq processes, their settings, and the handlers that run each
//! command type.
//!
//! [`load`] finds the configuration the way the command line promises (`--config PATH`,
//! `$ICQ_CONFIG`, `./icq.yaml`, the user config dir, then `--database-url`/`$DATABASE_URL`,
//! then the embedded SQLite default); [`parse`] turns one file's text into a [`Config`]
//! without touching anything but the environment reader it is given.
//!
//! Guarantees:
//!
//! - A configuration that parses is complete: every source has a known engine and a valid
//!   table name and settings, every handler exactly one kind. Nothing is silently ignored:
//!   an unknown key anywhere is an error.
//! - Every error names the file, the line and column, and the key path
//!   (`icq.yaml:7:7: sources[0].settings: unknown field `batchsize`, ...`), and is an
//!   [`CliError::Config`] (exit code 2).
//! - A database password never appears in an error or in `Debug`/`Display` output:
//!   [`DatabaseUrl`] masks it, and error messages are scrubbed of any `user:password@`.

mod check;
mod expand;
mod lookup;
mod raw;
pub(crate) mod verify;
mod yaml;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use lookup::{embedded_default, load};
pub use verify::{CheckReport, check_file};

use crate::cli::error::{CliError, Result};
use icq::ident::{Engine, TableName};
use icq::redact::redact_url;
use icq::settings::Settings;

/// The name of the source made from `--database-url`, `$DATABASE_URL` or the embedded
/// default, when there is no configuration file.
pub const DEFAULT_SOURCE: &str = "default";

/// A loaded configuration: where it came from, its sources and its handlers.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it was read from; `None` when it was made from a URL or is the embedded
    /// default.
    pub path: Option<PathBuf>,
    /// The sources, in file order; never empty.
    pub sources: Vec<SourceConfig>,
    /// Handlers by command type.
    pub handlers: BTreeMap<String, HandlerConfig>,
}

/// One database (and table) that icq processes.
///
/// Usually read from `icq.yaml` by [`load`]; build one to open a source yourself with
/// [`crate::cli::sources::open_one`].
#[derive(Debug, Clone, PartialEq)]
pub struct SourceConfig {
    /// The unique name used by `--source` and in output.
    pub name: String,
    /// Where the database is; its engine is known to be supported.
    pub url: DatabaseUrl,
    /// The commands table (default `InternalCommands`).
    pub table: TableName,
    /// How the source is processed.
    pub settings: Settings,
    /// True for the embedded SQLite default: the runtime creates and migrates its table on
    /// first use, since no one else will.
    pub embedded: bool,
}

impl SourceConfig {
    /// A source with default table and settings.
    fn from_url(name: &str, url: DatabaseUrl, embedded: bool) -> Self {
        SourceConfig {
            name: name.to_string(),
            url,
            table: TableName::default(),
            settings: Settings::default(),
            embedded,
        }
    }

    /// The engine this source speaks (checked when the configuration was loaded).
    pub fn engine(&self) -> icq::Result<Engine> {
        self.url.engine()
    }
}

/// A database URL whose `Debug` and `Display` never show the password (they use
/// `redact_url`); [`DatabaseUrl::expose`] gives the real string, for connecting only.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// Wraps a URL; nothing is checked here (see [`parse`] and [`load`] for the checks).
    pub fn new(url: String) -> Self {
        DatabaseUrl(url)
    }

    /// The URL with its password, to hand to the database driver. Never print it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The engine named by the URL's scheme.
    pub fn engine(&self) -> icq::Result<Engine> {
        Engine::from_url(&self.0)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DatabaseUrl")
            .field(&redact_url(&self.0))
            .finish()
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

/// How commands of one type are run.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerConfig {
    /// What runs the command.
    pub kind: HandlerKind,
    /// An attempt running longer fails (and an `exec` process group is killed).
    pub timeout: Option<Duration>,
    /// Roles the captured principal must all hold; otherwise the command is dead-lettered
    /// on its first attempt.
    pub requires_roles: Vec<String>,
}

/// The kinds of configured handler.
#[derive(Clone, PartialEq)]
pub enum HandlerKind {
    /// Run a program with the payload on stdin; never through a shell.
    Exec {
        /// The program and its arguments; never empty.
        argv: Vec<String>,
    },
    /// POST the payload to an `http://` or `https://` URL.
    Http {
        /// The endpoint.
        url: String,
        /// Extra request headers (names are valid header names, values have no line
        /// breaks).
        headers: BTreeMap<String, String>,
    },
    /// Complete at once (for benchmarks and smoke tests).
    Noop,
}

/// `Debug` masks header values (they often carry tokens) and any password in the URL.
impl fmt::Debug for HandlerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerKind::Exec { argv } => f.debug_struct("Exec").field("argv", argv).finish(),
            HandlerKind::Http { url, headers } => {
                let masked: BTreeMap<&str, &str> =
                    headers.keys().map(|name| (name.as_str(), "***")).collect();
                f.debug_struct("Http")
                    .field("url", &redact_url(url))
                    .field("headers", &masked)
                    .finish()
            }
            HandlerKind::Noop => f.write_str("Noop"),
        }
    }
}

/// What the command line said about where the configuration is.
///
/// `database_url` is the `--database-url` flag only: [`load`] reads `$DATABASE_URL`
/// itself, because the two rank differently. The flag overrides the URL of one source of
/// a configuration file; the ambient `$DATABASE_URL` is used only when there is no file
/// (a file that wants it says `url: ${DATABASE_URL}`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConfigRequest {
    /// `--config PATH`: this file, which must exist.
    pub config_path: Option<PathBuf>,
    /// `--database-url URL`.
    pub database_url: Option<String>,
    /// `--source NAME`: which source `--database-url` replaces the URL of when the file
    /// has several (selection itself is [`Config::select`]'s job).
    pub source: Option<String>,
}

impl fmt::Debug for ConfigRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigRequest")
            .field("config_path", &self.config_path)
            .field(
                "database_url",
                &self.database_url.as_deref().map(redact_url),
            )
            .field("source", &self.source)
            .finish()
    }
}

impl Config {
    /// The sources to work on: all of them for `None`, or the one named. An unknown name
    /// is a usage error listing the configured names.
    pub fn select(&self, source: Option<&str>) -> Result<Vec<&SourceConfig>> {
        let Some(name) = source else {
            return Ok(self.sources.iter().collect());
        };
        match self.sources.iter().find(|s| s.name == name) {
            Some(found) => Ok(vec![found]),
            None => Err(CliError::Usage(format!(
                "unknown source `{name}`; {} configures: {}",
                self.origin(),
                self.source_names()
            ))),
        }
    }

    /// The names of the sources, comma-separated, for messages.
    fn source_names(&self) -> String {
        let names: Vec<&str> = self.sources.iter().map(|s| s.name.as_str()).collect();
        names.join(", ")
    }

    /// Where this configuration came from, for messages.
    fn origin(&self) -> String {
        match &self.path {
            Some(path) => path.display().to_string(),
            None => "the command line".to_string(),
        }
    }
}

/// Parses the text of a configuration file. `path` is only used in messages and kept as
/// [`Config::path`]; `env` reads variables for `${VAR}` expansion.
///
/// Nothing else is read: this is what [`load`] calls once it has found a file.
pub fn parse(text: &str, path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
    let fail = |message: String| CliError::Config {
        path: path.to_path_buf(),
        message,
    };
    let (expanded, columns) = expand::expand(text, env).map_err(|err| {
        let message = format!("{}:{}: {}", err.line, err.column, err.message);
        fail(yaml::mask_passwords(&message))
    })?;
    let doc = yaml::Document::new(&expanded, &columns);
    if !doc.check().map_err(fail)? {
        return Err(fail(format!(
            "the file is empty; it needs a `sources:` list, e.g.\n{EXAMPLE}"
        )));
    }
    let raw: raw::RawConfig = doc.deserialize().map_err(fail)?;
    let sources = check::sources(raw.sources.unwrap_or_default(), &doc).map_err(fail)?;
    let handlers = check::handlers(raw.handlers.unwrap_or_default(), &doc).map_err(fail)?;
    Ok(Config {
        path: Some(path.to_path_buf()),
        sources,
        handlers,
    })
}

/// The smallest useful file, shown when a file has no sources.
const EXAMPLE: &str = "sources:\n  - name: orders\n    url: ${ORDERS_DATABASE_URL}";

#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod tests;
