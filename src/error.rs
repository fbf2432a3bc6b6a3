//! The library's error type and the process exit code each kind of error maps to.
//!
//! Every message is written for the person at the terminal: it says what went wrong and,
//! where there is one, what to do next. Database URLs never appear with their password.

use std::path::PathBuf;

/// Result alias used throughout the library.
///
/// # Examples
///
/// ```
/// fn table_from_env(value: &str) -> icq::Result<icq::TableName> {
///     icq::TableName::parse(value)
/// }
/// assert!(table_from_env("OrderCommands").is_ok());
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A boxed error kept as the [`source`](std::error::Error::source) of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong inside icq.
///
/// Every message is meant to be shown as is: it holds the underlying error's text too. A
/// variant that wraps another error also returns it from
/// [`source`](std::error::Error::source), for programs that walk the chain (the `icq`
/// binary prints each text once). [`Error::kind`] and [`Error::exit_code`] classify it for
/// programs. New variants may be added: match with a wildcard arm.
///
/// # Examples
///
/// ```
/// use icq::{Error, TableName};
///
/// match TableName::parse("orders; DROP TABLE users") {
///     Err(Error::Invalid { message, .. }) => assert!(message.starts_with("invalid table name")),
///     other => panic!("unexpected: {other:?}"),
/// }
/// let err = TableName::parse("a b").unwrap_err();
/// assert_eq!((err.kind(), err.exit_code()), ("usage", 2));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The command line (or the call) is incomplete or contradicts itself: a missing or
    /// conflicting flag, several sources where one is needed (exit code 2).
    #[error("{0}")]
    Usage(String),

    /// A value is malformed or out of range: a command id, a queue or table name, a
    /// duration, a URL, a JSON payload (exit code 2, kind `usage`).
    #[error("{message}")]
    Invalid {
        /// What is wrong with the value and what a valid one looks like (it includes the
        /// text of `source`, when there is one).
        message: String,
        /// The parser's own error, when one said why.
        #[source]
        source: Option<BoxError>,
    },

    /// The request is understood but refused as things stand: a command in the wrong state
    /// for the operation, a change without the confirmation it needs, a console that would
    /// serve actions without a token. Nothing was changed (exit code 2, kind `usage`).
    #[error("{0}")]
    Refused(String),

    /// A queue, a priority or a unique key was asked of a table at schema version 1; the
    /// message names the upgrade. Nothing was changed (exit code 2, kind `usage`).
    #[error(
        "table {table} is schema version 1; queues, priorities and unique keys need version 2: \
         add the upgrade with `icq migrate add` (it writes <version>_icq_schema_v2.sql) and \
         apply it with `icq migrate run` (asked for: {asked_for}); nothing was changed"
    )]
    NeedsSchemaV2 {
        /// The (display form of the) table.
        table: String,
        /// What needed version 2, e.g. `a unique key`.
        asked_for: String,
    },

    /// What was asked is not something icq supports: SQL Server outside migrations, a
    /// PostgreSQL pooler in transaction mode, a database URL of an engine whose Cargo
    /// feature this build lacks ([`Error::engine_not_built`]) (exit code 2, kind `usage`).
    #[error("{0}")]
    Unsupported(String),

    /// Someone else changed the rows while this request was applying, so it was rolled back
    /// (or stopped) as the message says; running it again usually succeeds (exit code 1,
    /// kind `conflict`).
    #[error("{0}")]
    Conflict(String),

    /// Something inside icq failed at run time: a source worker crashed, a client could
    /// not be built, a process-wide recorder was taken (exit code 1, kind `runtime`).
    #[error("{context}: {source}")]
    Runtime {
        /// What icq was doing.
        context: String,
        /// What failed (its text is part of the message).
        source: BoxError,
    },

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

    /// The commands table is missing from a source's database, or the schema its
    /// schema-qualified name points into does not exist. The message says which, and how
    /// to fix it with the source's own `--table` and `--source`.
    #[error("{}", table_missing_message(source_name, table, engine, missing_schema.as_deref()))]
    TableMissing {
        /// The configured source (empty until [`Error::in_source`] names it, when
        /// the driver found the schema missing while connecting).
        source_name: String,
        /// The (display form of the) table name.
        table: String,
        /// The engine name, for the suggested command.
        engine: &'static str,
        /// The schema of a schema-qualified table, when it is the schema that is missing.
        missing_schema: Option<String>,
    },

    /// The database could not be reached or returned an error. The message is passed
    /// through the redaction of secrets: a driver's message may echo a URL. The
    /// PostgreSQL driver's ` at line N` (a line of the server's C source) is left out.
    #[error("{}", crate::redact::redact_text(&format!("{context}: {}", describe_cause(cause))))]
    Database {
        /// What icq was doing, e.g. `claiming commands from source orders`.
        context: String,
        /// The underlying driver error (already part of the message, so not a `source`:
        /// `{:#}` would print it twice).
        cause: sqlx::Error,
    },

    /// Applying migrations failed.
    #[error("migration failed: {}", crate::redact::redact_text(without_line_suffix(&.0.to_string())))]
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

    /// A connection to a database server could not be made: refused, the host does not
    /// resolve, no answer in time (found by a TCP probe of the server while a slow pool
    /// connect is still retrying, so the real cause is reported at once instead of a pool
    /// timeout), or the URL looks mistyped (see `hint`).
    #[error("{}", crate::redact::redact_text(&format!("{context}: {reason}{hint}")))]
    Connect {
        /// What icq was doing, with the redacted URL.
        context: String,
        /// What happened, e.g. `connection refused (127.0.0.1:1)`.
        reason: String,
        /// Empty, or `; hint: ...` (e.g. to percent-encode an `@` in the password).
        hint: String,
    },

    /// A configuration file parsed but some of what it names cannot work (an exec
    /// program that is missing or not executable, ...): every problem, one per line
    /// (exit code 2).
    #[error("{}", located_list(path, problems))]
    ConfigCheck {
        /// The file that was checked.
        path: PathBuf,
        /// One message per problem, each `line:col: key: what` where known.
        problems: Vec<String>,
    },

    /// `icq work --until-idle --fail-on-dead`: the run dead-lettered commands (exit code 1).
    #[error(
        "{count} {} dead-lettered during this run; see them with `icq dead-letters list`",
        if *count == 1 { "command was" } else { "commands were" }
    )]
    DeadLettered {
        /// How many commands this run's processor dead-lettered.
        count: u64,
    },

    /// `icq bench` could not finish a measurement (its worker failed, a command did not
    /// complete, or the run was interrupted).
    #[error("{0}")]
    Bench(String),

    /// `icq work --until-idle` gave up on a database error that retrying cannot fix
    /// (permission denied, a missing table or column, a read-only database, a failed
    /// login: see [`Error::healing`]) after a short bounded retry (exit code 1, kind
    /// `database`). The message holds the server's own and what to do about it.
    #[error(
        "source `{source_name}`: {cause}; retrying cannot fix this (still failing after {tries} tries over {seconds:.1} s); hint: {hint}"
    )]
    CannotHeal {
        /// The configured source.
        source_name: String,
        /// The last error, as the driver reported it (already redacted).
        cause: Box<Error>,
        /// How many times the operation was tried.
        tries: u32,
        /// For how long it was tried.
        seconds: f64,
        /// What to do about it.
        hint: String,
    },

    /// [`Queue::schedule_in`](crate::Queue::schedule_in) was given a connection of another
    /// engine than the queue's (a PostgreSQL queue and a `SqliteConnection`): nothing was
    /// scheduled (exit code 2).
    #[error(
        "the queue's table is on {}, but the connection passed to `schedule_in` is a {} \
         connection; nothing was scheduled: pass a connection or transaction of the queue's \
         own database (`&mut *tx` from the pool the queue was made from)",
        queue.name(), connection.name()
    )]
    EngineMismatch {
        /// The queue's engine.
        queue: crate::kind::Engine,
        /// The engine of the connection it was given.
        connection: crate::kind::Engine,
    },
}

/// How a failed database call can heal: what the processor does next (see
/// [`Error::healing`]).
///
/// # Examples
///
/// ```
/// use icq::error::Healing;
///
/// assert!(Healing::Retry.heals() && Healing::Reconnect.heals() && !Healing::Never.heals());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Healing {
    /// It heals by itself: the connection was refused or reset, the server is starting or
    /// shutting down, a serialization failure, a deadlock, a lock or statement timeout, or
    /// too many connections. Retry with a capped, jittered backoff.
    Retry,
    /// The server answered but is the wrong one for writes (PostgreSQL SQLSTATE 25006 on a
    /// server in recovery): heals on a new connection to the writable host, after a failover.
    Reconnect,
    /// Retrying cannot fix it: permission denied, a missing table or column, a read-only
    /// SQLite file or MariaDB/MySQL `read_only` server, a failed login, a statement the
    /// server rejects. Someone has to act; `--until-idle` fails after a short retry.
    Never,
}

impl Healing {
    /// True for [`Healing::Retry`] and [`Healing::Reconnect`]. See [`Healing`]'s example.
    pub fn heals(self) -> bool {
        !matches!(self, Healing::Never)
    }
}

/// How an error with this PostgreSQL SQLSTATE heals (by its class, the first two
/// characters, with a few exceptions).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn postgres_healing(code: &str) -> Healing {
    match code {
        // read_only_sql_transaction: a server in recovery; the failover finds the primary.
        "25006" => Healing::Reconnect,
        // idle_in_transaction_session_timeout, idle_session_timeout: the session ended.
        "25P03" | "57P05" => Healing::Retry,
        // invalid_password / invalid_authorization_specification.
        _ if code.starts_with("28") => Healing::Never,
        // 08 connection exception, 40 serialization failure / deadlock, 53 insufficient
        // resources (too many connections, disk full), 55 lock not available, 57 operator
        // intervention (shutdown, cannot connect now, statement timeout), 58 system error.
        _ if ["08", "40", "53", "55", "57", "58"]
            .iter()
            .any(|class| code.starts_with(class)) =>
        {
            Healing::Retry
        }
        // 42 (insufficient privilege, undefined table or column), 3D (no such database),
        // 3F (no such schema), 22/23 (data), and anything else.
        _ => Healing::Never,
    }
}

/// How an error with this MariaDB/MySQL error number heals.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
fn mysql_healing(number: u16) -> Healing {
    match number {
        // Too many connections, out of memory, shutdown in progress, aborted connection,
        // network read/write errors, max_user_connections, lock wait timeout, deadlock,
        // resource limits, query interrupted, re-prepare needed, connection killed,
        // statement timeouts (MariaDB max_statement_time, MySQL max_execution_time), idle
        // disconnect, and the client library's lost-connection numbers.
        1040
        | 1041
        | 1053
        | 1152..=1161
        | 1203
        | 1205
        | 1213
        | 1226
        | 1317
        | 1615
        | 1927
        | 1969
        | 3024
        | 4031
        | 2002
        | 2003
        | 2006
        | 2013 => Healing::Retry,
        // Access denied (1044, 1045), command/column denied (1142, 1143), unknown table or
        // column (1146, 1054), unknown database (1049), read_only (1290, 1792, 1836), ...
        _ => Healing::Never,
    }
}

/// How an error with this SQLite (extended) result code heals.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
fn sqlite_healing(code: i64) -> Healing {
    match code & 0xff {
        // SQLITE_NOMEM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_FULL, SQLITE_PROTOCOL.
        5 | 6 | 7 | 10 | 13 | 15 => Healing::Retry,
        // SQLITE_ERROR (no such table/column), SQLITE_PERM, SQLITE_READONLY, SQLITE_CANTOPEN,
        // SQLITE_CORRUPT, SQLITE_AUTH, SQLITE_NOTADB, ...
        _ => Healing::Never,
    }
}

/// How a driver error heals.
fn sqlx_healing(cause: &sqlx::Error) -> Healing {
    match cause {
        // Only the engines this build has can have raised one (see the `*_healing` above).
        sqlx::Error::Database(db) => {
            #[cfg(feature = "postgres")]
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                return postgres_healing(pg.code());
            }
            #[cfg(feature = "mysql")]
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return mysql_healing(my.number());
            }
            #[cfg(feature = "sqlite")]
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                let code = db.code().and_then(|c| c.parse().ok()).unwrap_or(1);
                return sqlite_healing(code);
            }
            let _ = db;
            Healing::Retry
        }
        // The statement's columns do not match what icq expects: a schema problem.
        sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::Configuration(_) => Healing::Never,
        // I/O, TLS, protocol, pool timeouts, a crashed SQLite worker, ...
        _ => Healing::Retry,
    }
}

/// What to do about an error that does not heal: the hint of [`Error::CannotHeal`].
pub(crate) fn unhealable_hint(err: &Error) -> String {
    let text = err.to_string().to_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if has(&[
        "permission denied",
        "command denied",
        "access denied for user",
        "not authorized",
    ]) && !has(&["password"])
    {
        "the database user of this source lacks a privilege on the commands table: grant it \
         SELECT, INSERT, UPDATE and DELETE on the table (PostgreSQL: `GRANT SELECT, INSERT, \
         UPDATE, DELETE ON <table> TO <role>`; MariaDB/MySQL: `GRANT SELECT, INSERT, UPDATE, \
         DELETE ON <db>.<table> TO <user>`)"
            .into()
    } else if has(&["password", "authentication", "access denied"]) {
        "the server refused the login: check the user and password in the source's url (and \
         the server's pg_hba.conf or the user's allowed hosts)"
            .into()
    } else if has(&[
        "does not exist",
        "doesn't exist",
        "no such table",
        "no such column",
        "unknown column",
    ]) {
        "the commands table (or a column icq needs) is missing: create or upgrade it with \
         `icq migrate run` against this source's database, or fix `table:`"
            .into()
    } else if has(&["read-only", "read only", "readonly", "read_only"]) {
        "the database accepts no writes (a read-only file or mount, a server with \
         `read_only` set, or a replica): point the source at a writable database"
            .into()
    } else {
        "the server rejects icq's statements and retrying does not change that: fix the cause \
         in the message, then run again"
            .into()
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        Error::Migrate(err)
    }
}

/// The message of [`Error::TableMissing`]: what is missing, then the commands that create
/// it for this very table and source (a missing schema is created first, by hand).
fn table_missing_message(
    source: &str,
    table: &str,
    engine: &str,
    missing_schema: Option<&str>,
) -> String {
    let create = format!(
        "`icq migrate add --engine {engine} --table {table}`, then apply it with \
         `icq migrate run --source {source}` against the same database (with the same \
         --database-url, if you gave one)"
    );
    match missing_schema {
        None => format!("source `{source}`: table {table} does not exist; create it with {create}"),
        Some(schema) => format!(
            "source `{source}`: the schema `{schema}` of table {table} does not exist in the \
             database; hint: fix the schema in `table:`, or create \
             the schema ({}) and then the table with {create}",
            create_schema_hint(engine, schema)
        ),
    }
}

/// How `engine` creates a schema named `schema`.
fn create_schema_hint(engine: &str, schema: &str) -> String {
    match engine {
        "postgres" => format!("`CREATE SCHEMA \"{schema}\"`"),
        "mysql" => format!("on MySQL/MariaDB a schema is a database: `CREATE DATABASE {schema}`"),
        _ => format!(
            "on SQLite a schema is an attached database file: `ATTACH DATABASE 'file.db' AS {schema}` on every connection, which icq does not do, so use an unqualified table"
        ),
    }
}

impl Error {
    /// [`Error::NeedsSchemaV2`] for asking a version-1 `table` for `what` (a queue, a
    /// priority, a unique key: schema version 2), naming the upgrade.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{Error, TableName};
    ///
    /// let err = Error::needs_schema_v2(&TableName::default(), "a unique key");
    /// assert_eq!((err.kind(), err.exit_code()), ("usage", 2));
    /// assert!(err.to_string().starts_with("table InternalCommands is schema version 1"), "{err}");
    /// assert!(err.to_string().contains("icq migrate add"), "{err}");
    /// ```
    pub fn needs_schema_v2(table: &impl std::fmt::Display, what: &str) -> Error {
        Error::NeedsSchemaV2 {
            table: table.to_string(),
            asked_for: what.to_owned(),
        }
    }

    /// [`Error::Unsupported`] for a database URL whose engine this build of icq has no
    /// driver for: its Cargo feature ([`Engine::feature`](crate::Engine::feature)) was not
    /// enabled. The message names the feature to enable.
    ///
    /// # Examples
    ///
    /// ```
    /// let err = icq::Error::engine_not_built(icq::Engine::Mysql);
    /// assert_eq!((err.kind(), err.exit_code()), ("usage", 2));
    /// assert!(err.to_string().contains(r#"features = ["mysql"]"#), "{err}");
    /// ```
    pub fn engine_not_built(engine: crate::Engine) -> Error {
        let Some(feature) = engine.feature() else {
            return Error::Unsupported(format!(
                "{} has no driver in icq: it is supported for migrations only \
                 (`icq migrate add --engine {engine}`)",
                engine.prose()
            ));
        };
        Error::Unsupported(format!(
            "this build of icq has no {} driver: enable icq-queue's `{feature}` Cargo feature \
             (`icq-queue = {{ version = \"…\", features = [\"{feature}\"] }}`)",
            engine.prose()
        ))
    }

    /// [`Error::Invalid`] without a source: for a value icq itself found wrong.
    ///
    /// # Examples
    ///
    /// ```
    /// let err = icq::Error::invalid("`-5s` must not be negative");
    /// assert_eq!((err.kind(), err.exit_code()), ("usage", 2));
    /// assert!(std::error::Error::source(&err).is_none());
    /// ```
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::Invalid {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Invalid`] whose `message` (which should include the text of `source`) came
    /// from a parser's error, kept as the source.
    ///
    /// # Examples
    ///
    /// ```
    /// let parse = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
    /// let err = icq::Error::invalid_because(format!("--payload is not JSON: {parse}"), parse);
    /// assert!(std::error::Error::source(&err).is_some());
    /// ```
    pub fn invalid_because(message: impl Into<String>, source: impl Into<BoxError>) -> Error {
        Error::Invalid {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// The same error with `prefix: ` before its message, for errors that carry their
    /// message as text (the others already name what they are about).
    pub fn prefixed(self, prefix: &str) -> Error {
        let with = |text: String| format!("{prefix}: {text}");
        match self {
            Error::Usage(text) => Error::Usage(with(text)),
            Error::Invalid { message, source } => Error::Invalid {
                message: with(message),
                source,
            },
            Error::Refused(text) => Error::Refused(with(text)),
            Error::Unsupported(text) => Error::Unsupported(with(text)),
            Error::Conflict(text) => Error::Conflict(with(text)),
            Error::Runtime { context, source } => Error::Runtime {
                context: with(context),
                source,
            },
            other => other,
        }
    }

    /// Wraps a run-time failure inside icq with what it was doing: for `map_err`
    /// ([`Error::Runtime`], exit code 1).
    ///
    /// # Examples
    ///
    /// ```
    /// let err = icq::Error::runtime("cannot build the HTTP client")(std::io::Error::other("no TLS"));
    /// assert_eq!(err.to_string(), "cannot build the HTTP client: no TLS");
    /// assert_eq!((err.kind(), err.exit_code()), ("runtime", 1));
    /// ```
    pub fn runtime<E: Into<BoxError>>(context: impl Into<String>) -> impl FnOnce(E) -> Error {
        let context = context.into();
        move |source| Error::Runtime {
            context,
            source: source.into(),
        }
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

/// Every problem of a configuration check, each on its own line prefixed by the file.
fn located_list(path: &std::path::Path, problems: &[String]) -> String {
    let lines: Vec<String> = problems.iter().map(|p| located(path, p)).collect();
    format!(
        "{} problem{} found:\n{}",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" },
        lines.join("\n")
    )
}

/// A driver error as text, without the PostgreSQL driver's trailing ` at line N`.
fn describe_cause(cause: &sqlx::Error) -> String {
    let text = cause.to_string();
    // sqlx wraps a configuration error's own "error with configuration: ..." once more.
    const CONFIGURATION: &str = "error with configuration: ";
    let text = match text.strip_prefix(CONFIGURATION) {
        Some(rest) if rest.starts_with(CONFIGURATION) => rest.to_owned(),
        _ => text,
    };
    without_line_suffix(&text).to_owned()
}

/// `text` without a trailing ` at line N`: sqlx appends the line of the PostgreSQL
/// server's C source that raised the error, which means nothing to an operator.
///
/// # Examples
///
/// ```
/// use icq::error::without_line_suffix;
///
/// let message = "relation \"x\" does not exist at line 42";
/// assert_eq!(without_line_suffix(message), "relation \"x\" does not exist");
/// assert_eq!(without_line_suffix("at line or not"), "at line or not");
/// ```
pub fn without_line_suffix(text: &str) -> &str {
    match text.rsplit_once(" at line ") {
        Some((head, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => head,
        _ => text,
    }
}

impl Error {
    /// The exit code the `icq` binary uses for this error: 2 for what the caller can fix in
    /// the request ([`Error::Usage`], [`Error::Invalid`], [`Error::Refused`],
    /// [`Error::NeedsSchemaV2`], [`Error::Unsupported`], configuration), 3 not found, 1 for
    /// run-time failures.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Error;
    ///
    /// assert_eq!(Error::Usage("bad flag".into()).exit_code(), 2);
    /// assert_eq!(Error::Conflict("changed meanwhile".into()).exit_code(), 1);
    /// assert_eq!(Error::NotFound("no command with id x".into()).exit_code(), 3);
    /// assert_eq!(Error::DeadLettered { count: 1 }.exit_code(), 1);
    /// ```
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_)
            | Error::Invalid { .. }
            | Error::Refused(_)
            | Error::NeedsSchemaV2 { .. }
            | Error::Unsupported(_)
            | Error::Config { .. }
            | Error::ConfigCheck { .. }
            | Error::EngineMismatch { .. } => 2,
            Error::NotFound(_) => 3,
            _ => 1,
        }
    }

    /// A stable, machine-readable name for what kind of error this is: the `kind` of the
    /// `--format json` error document (`usage` (every exit-2 request error but
    /// configuration), `config`, `not_found`, `connection`, `database` (also
    /// [`Error::CannotHeal`]), `table_missing`, `migration`, `io`, `malformed_row`,
    /// `dead_lettered`, `bench`, `conflict`, `runtime`).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Error;
    ///
    /// assert_eq!(Error::NotFound("no command with id x".into()).kind(), "not_found");
    /// let lost = Error::db("claiming commands from source orders")(sqlx::Error::PoolTimedOut);
    /// assert_eq!(lost.kind(), "connection");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Usage(_)
            | Error::Invalid { .. }
            | Error::Refused(_)
            | Error::NeedsSchemaV2 { .. }
            | Error::Unsupported(_)
            | Error::EngineMismatch { .. } => "usage",
            Error::Conflict(_) => "conflict",
            Error::Runtime { .. } => "runtime",
            Error::Config { .. } | Error::ConfigCheck { .. } => "config",
            Error::NotFound(_) => "not_found",
            Error::Connect { .. } => "connection",
            Error::Database { .. } if self.is_connection_error() => "connection",
            Error::Database { .. } => "database",
            Error::TableMissing { .. } => "table_missing",
            Error::Migrate(_) => "migration",
            Error::Io { .. } => "io",
            Error::MalformedRow { .. } => "malformed_row",
            Error::DeadLettered { .. } => "dead_lettered",
            Error::Bench(_) => "bench",
            Error::CannotHeal { .. } => "database",
        }
    }

    /// How this error heals: retried with backoff ([`Healing::Retry`]), after a reconnect
    /// to the writable host ([`Healing::Reconnect`]: PostgreSQL's read-only SQLSTATE 25006),
    /// or not at all ([`Healing::Never`]: permission denied, a missing table or column, a
    /// read-only SQLite file or MariaDB/MySQL server, a failed login). The processor retries
    /// what heals; `icq work --until-idle` fails on the rest after a short bounded retry.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> icq::Result<()> {
    /// use icq::Error;
    /// use icq::error::Healing;
    ///
    /// let refused = Error::db("claiming commands")(sqlx::Error::PoolTimedOut);
    /// assert_eq!(refused.healing(), Healing::Retry);
    ///
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.map_err(Error::db("opening"))?;
    /// let missing = sqlx::query("SELECT * FROM missing").execute(&pool).await;
    /// let err = missing.map_err(Error::db("claiming commands")).unwrap_err();
    /// assert_eq!(err.healing(), Healing::Never);
    /// # Ok(())
    /// # }
    /// ```
    pub fn healing(&self) -> Healing {
        match self {
            Error::Database { cause, .. } => sqlx_healing(cause),
            Error::Connect { .. } => Healing::Retry,
            Error::CannotHeal { .. }
            | Error::TableMissing { .. }
            | Error::Usage(_)
            | Error::Invalid { .. }
            | Error::Refused(_)
            | Error::NeedsSchemaV2 { .. }
            | Error::Unsupported(_)
            | Error::EngineMismatch { .. }
            | Error::Config { .. }
            | Error::ConfigCheck { .. } => Healing::Never,
            _ => Healing::Retry,
        }
    }

    /// Names the source a connection error happened on (`source `orders`: cannot connect to
    /// ...`), or whose table's schema the driver found missing. Other errors are returned as
    /// they are (they name their table or URL already).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Error;
    ///
    /// let refused = Error::Connect {
    ///     context: "cannot connect to postgres://app@db/shop".into(),
    ///     reason: "connection refused (10.0.0.5:5432)".into(),
    ///     hint: String::new(),
    /// };
    /// let named = refused.in_source("orders");
    /// assert!(named.to_string().starts_with("source `orders`: cannot connect"), "{named}");
    /// let usage = Error::Usage("bad".into()).in_source("orders");
    /// assert_eq!(usage.to_string(), "bad"); // left as it was
    /// ```
    pub fn in_source(self, source: &str) -> Error {
        match self {
            Error::TableMissing {
                table,
                engine,
                missing_schema,
                ..
            } => Error::TableMissing {
                source_name: source.to_owned(),
                table,
                engine,
                missing_schema,
            },
            Error::Connect {
                context,
                reason,
                hint,
            } => Error::Connect {
                context: format!("source `{source}`: {context}"),
                reason,
                hint,
            },
            other => other,
        }
    }

    /// Wraps a driver error with what icq was doing when it happened: for `map_err`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> icq::Result<()> {
    /// use icq::Error;
    ///
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await;
    /// let pool = pool.map_err(Error::db("opening the database"))?;
    /// let bad = sqlx::query("SELECT * FROM missing").execute(&pool).await;
    /// let err = bad.map_err(Error::db("reading the report")).unwrap_err();
    /// assert!(err.to_string().starts_with("reading the report: "), "{err}");
    /// assert_eq!(err.kind(), "database");
    /// # Ok(())
    /// # }
    /// ```
    pub fn db(context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Error {
        let context = context.into();
        move |cause| Error::Database { context, cause }
    }

    /// Wraps an I/O error with what icq was doing when it happened: for `map_err`.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Error;
    ///
    /// let path = "/no/such/icq.yaml";
    /// let read = std::fs::read_to_string(path).map_err(Error::io(format!("reading {path}")));
    /// let err = read.unwrap_err();
    /// assert!(err.to_string().starts_with("reading /no/such/icq.yaml: "), "{err}");
    /// assert_eq!(err.kind(), "io");
    /// ```
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |cause| Error::Io { context, cause }
    }

    /// True when the error means the database connection failed (as opposed to a bad
    /// query): worth retrying once the database is back.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Error;
    ///
    /// let timed_out = Error::db("claiming commands")(sqlx::Error::PoolTimedOut);
    /// assert!(timed_out.is_connection_error());
    /// let bad_query = Error::db("claiming commands")(sqlx::Error::RowNotFound);
    /// assert!(!bad_query.is_connection_error());
    /// ```
    pub fn is_connection_error(&self) -> bool {
        matches!(self, Error::Connect { .. })
            || matches!(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal of a URL whose engine the build lacks (`engine::connect_driver`,
    /// `migrate`'s connection) names the feature to enable, for each engine. The default
    /// build has every engine, so this pins the message; `.ci/run` compiles a one-engine
    /// build (`--no-default-features --features sqlite`) that takes the refusing path.
    #[test]
    fn an_engine_the_build_lacks_is_refused_naming_its_feature() {
        for (engine, feature, prose) in [
            (crate::Engine::Postgres, "postgres", "PostgreSQL"),
            (crate::Engine::Sqlite, "sqlite", "SQLite"),
            (crate::Engine::Mysql, "mysql", "MySQL/MariaDB"),
        ] {
            assert_eq!(engine.feature(), Some(feature));
            let err = Error::engine_not_built(engine);
            assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
            assert_eq!((err.kind(), err.exit_code()), ("usage", 2));
            let text = err.to_string();
            assert!(text.contains(&format!("no {prose} driver")), "{text}");
            assert!(
                text.contains(&format!("`{feature}` Cargo feature"))
                    && text.contains(&format!("features = [\"{feature}\"]")),
                "{text}"
            );
        }
        let sql_server = Error::engine_not_built(crate::Engine::SqlServer).to_string();
        assert!(sql_server.contains("migrations only"), "{sql_server}");
        assert!(!sql_server.contains("Cargo feature"), "{sql_server}");
    }

    /// `Engine::is_built` follows each engine's feature, and SQL Server never has a driver.
    #[test]
    fn an_engine_is_built_with_its_feature_and_sql_server_never() {
        for (engine, built) in [
            (crate::Engine::Postgres, cfg!(feature = "postgres")),
            (crate::Engine::Sqlite, cfg!(feature = "sqlite")),
            (crate::Engine::Mysql, cfg!(feature = "mysql")),
            (crate::Engine::SqlServer, false),
        ] {
            assert_eq!(engine.is_built(), built, "{engine}");
        }
    }

    #[test]
    fn the_postgres_line_suffix_is_dropped() {
        assert_eq!(
            without_line_suffix("relation \"x\" does not exist at line 1234"),
            "relation \"x\" does not exist"
        );
        assert_eq!(
            without_line_suffix("stopped at line five"),
            "stopped at line five"
        );
        assert_eq!(without_line_suffix("plain"), "plain");
    }

    #[test]
    fn kinds_and_exit_codes_agree() {
        let cases = [
            (Error::Usage("x".into()), "usage", 2),
            (Error::NotFound("x".into()), "not_found", 3),
            (Error::invalid("x"), "usage", 2),
            (Error::Refused("x".into()), "usage", 2),
            (Error::needs_schema_v2(&"T", "x"), "usage", 2),
            (Error::Unsupported("x".into()), "usage", 2),
            (Error::Conflict("x".into()), "conflict", 1),
            (
                Error::runtime("a source worker crashed")(std::io::Error::other("panic")),
                "runtime",
                1,
            ),
            (
                Error::ConfigCheck {
                    path: "icq.yaml".into(),
                    problems: vec!["1:1: x".into()],
                },
                "config",
                2,
            ),
            (Error::DeadLettered { count: 2 }, "dead_lettered", 1),
            (
                Error::Connect {
                    context: "c".into(),
                    reason: "r".into(),
                    hint: String::new(),
                },
                "connection",
                1,
            ),
            (
                Error::Database {
                    context: "c".into(),
                    cause: sqlx::Error::PoolTimedOut,
                },
                "connection",
                1,
            ),
            (
                Error::Database {
                    context: "c".into(),
                    cause: sqlx::Error::RowNotFound,
                },
                "database",
                1,
            ),
        ];
        for (err, kind, code) in cases {
            assert_eq!((err.kind(), err.exit_code()), (kind, code), "{err}");
        }
    }

    #[test]
    fn postgres_codes_heal_by_class() {
        for code in [
            "08006", "40001", "40P01", "53300", "55P03", "57P01", "57P03", "57014",
        ] {
            assert_eq!(postgres_healing(code), Healing::Retry, "{code}");
        }
        assert_eq!(postgres_healing("25006"), Healing::Reconnect);
        for code in [
            "42501", "42P01", "42703", "28P01", "28000", "3D000", "3F000", "23505",
        ] {
            assert_eq!(postgres_healing(code), Healing::Never, "{code}");
        }
    }

    #[test]
    fn mysql_numbers_heal_when_transient() {
        for number in [1040, 1053, 1205, 1213, 1226, 1927, 1969, 2006, 2013] {
            assert_eq!(mysql_healing(number), Healing::Retry, "{number}");
        }
        for number in [1044, 1045, 1142, 1143, 1146, 1054, 1049, 1290, 1792] {
            assert_eq!(mysql_healing(number), Healing::Never, "{number}");
        }
    }

    #[test]
    fn sqlite_codes_heal_when_busy() {
        // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_BUSY_SNAPSHOT (extended), SQLITE_IOERR_READ.
        for code in [5, 6, 517, 266] {
            assert_eq!(sqlite_healing(code), Healing::Retry, "{code}");
        }
        // SQLITE_ERROR, SQLITE_READONLY, SQLITE_READONLY_DBMOVED, SQLITE_CANTOPEN, SQLITE_AUTH.
        for code in [1, 8, 1032, 14, 23] {
            assert_eq!(sqlite_healing(code), Healing::Never, "{code}");
        }
    }

    #[test]
    fn driver_errors_without_a_server_code_heal_unless_the_schema_is_wrong() {
        let lost = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(sqlx_healing(&lost), Healing::Retry);
        assert_eq!(sqlx_healing(&sqlx::Error::PoolTimedOut), Healing::Retry);
        assert_eq!(
            sqlx_healing(&sqlx::Error::ColumnNotFound("LockToken".into())),
            Healing::Never
        );
        let table = Error::TableMissing {
            source_name: "s".into(),
            table: "t".into(),
            engine: "postgres",
            missing_schema: None,
        };
        assert_eq!(table.healing(), Healing::Never);
        let refused = Error::Connect {
            context: "c".into(),
            reason: "connection refused (127.0.0.1:1)".into(),
            hint: String::new(),
        };
        assert_eq!(refused.healing(), Healing::Retry);
    }

    #[test]
    fn cannot_heal_is_a_database_error_with_a_hint() {
        let cause = Error::Database {
            context: "claiming due commands (InternalCommands)".into(),
            cause: sqlx::Error::Protocol("permission denied for table InternalCommands".into()),
        };
        let hint = unhealable_hint(&cause);
        assert!(hint.contains("GRANT"), "{hint}");
        let err = Error::CannotHeal {
            source_name: "orders".into(),
            cause: Box::new(cause),
            tries: 4,
            seconds: 3.2,
            hint,
        };
        assert_eq!((err.kind(), err.exit_code()), ("database", 1));
        let text = err.to_string();
        assert!(
            text.starts_with("source `orders`: claiming due commands"),
            "{text}"
        );
        assert!(text.contains("permission denied for table"), "{text}");
        assert!(text.contains("4 tries over 3.2 s"), "{text}");
    }

    #[test]
    fn dead_letter_counts_read_naturally() {
        assert!(
            Error::DeadLettered { count: 1 }
                .to_string()
                .starts_with("1 command was dead-lettered")
        );
        assert!(
            Error::DeadLettered { count: 3 }
                .to_string()
                .starts_with("3 commands were dead-lettered")
        );
    }
}
