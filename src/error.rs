//! The library's error type and the process exit code each kind of error maps to.
//!
//! Every message is written for the person at the terminal: it says what went wrong and,
//! where there is one, what to do next. Database URLs never appear with their password.

use std::path::PathBuf;

/// Result alias used throughout the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong inside icq.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file or a command-line value is invalid (exit code 2).
    #[error("{0}")]
    Usage(String),

    /// A configuration file could not be read or parsed (exit code 2).
    #[error("{}", located(path, message))]
    Config {
        /// The file that holds the problem.
        path: PathBuf,
        /// What is wrong, including line and key where known.
        message: String,
    },

    /// A command id, source or other named thing does not exist (exit code 3).
    #[error("{0}")]
    NotFound(String),

    /// The commands table is missing from a source's database.
    #[error(
        "source `{source_name}`: table {table} does not exist; create it with \
         `icq migrate add --engine {engine}`, then apply it with `icq migrate run` against the \
         same database (the same --source or --database-url)"
    )]
    TableMissing {
        /// The configured source.
        source_name: String,
        /// The (display form of the) table name.
        table: String,
        /// The engine name, for the suggested command.
        engine: &'static str,
    },

    /// The database could not be reached or returned an error. The message is passed
    /// through [`crate::redact::redact_text`]: a driver's message may echo a URL.
    #[error("{}", crate::redact::redact_text(&format!("{context}: {cause}")))]
    Database {
        /// What icq was doing, e.g. `claiming commands from source orders`.
        context: String,
        /// The underlying driver error (already part of the message, so not a `source`:
        /// `{:#}` would print it twice).
        cause: sqlx::Error,
    },

    /// Applying migrations failed.
    #[error("migration failed: {}", crate::redact::redact_text(&.0.to_string()))]
    Migrate(sqlx::migrate::MigrateError),

    /// A file could not be read or written.
    #[error("{context}: {cause}")]
    Io {
        /// What icq was doing, with the path.
        context: String,
        /// The underlying I/O error (part of the message, not a `source`).
        cause: std::io::Error,
    },

    /// A stored row could not be decoded (a foreign writer put something unexpected in it).
    #[error("malformed row {id} in {table}: {message}")]
    MalformedRow {
        /// The row's id as stored.
        id: String,
        /// The table.
        table: String,
        /// What was wrong.
        message: String,
    },

    /// `icq bench` could not finish a measurement (its worker failed, a command did not
    /// complete, or the run was interrupted).
    #[error("{0}")]
    Bench(String),
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        Error::Migrate(err)
    }
}

/// `file:line:col: …` when the message starts with a position, `file: …` otherwise.
fn located(path: &std::path::Path, message: &str) -> String {
    if message.starts_with(|c: char| c.is_ascii_digit()) {
        format!("{}:{message}", path.display())
    } else {
        format!("{}: {message}", path.display())
    }
}

impl Error {
    /// The exit code the `icq` binary uses for this error: 2 usage, 3 not found, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) | Error::Config { .. } => 2,
            Error::NotFound(_) => 3,
            _ => 1,
        }
    }

    /// Wraps a driver error with what icq was doing when it happened.
    pub fn db(context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Error {
        let context = context.into();
        move |cause| Error::Database { context, cause }
    }

    /// Wraps an I/O error with what icq was doing when it happened.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |cause| Error::Io { context, cause }
    }

    /// True when the error means the database connection failed (as opposed to a bad query).
    pub fn is_connection_error(&self) -> bool {
        matches!(
            self,
            Error::Database {
                cause: sqlx::Error::Io(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::Tls(_)
                    | sqlx::Error::Protocol(_)
                    | sqlx::Error::WorkerCrashed,
                ..
            }
        )
    }
}
