//! The library's error type, and the classification of database errors a service can
//! match ([`DatabaseErrorKind`]) and act on ([`Healing`]).
//!
//! Every message says what went wrong and, where there is one, what to do next, in terms
//! of the library (the `icq` binary adds its own command-line hints). Database URLs never
//! appear with their password.

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
/// binary prints each text once). Match on the variant; for a database error,
/// [`Error::database_kind`] says what the server reported (a unique violation, permission
/// denied, a missing table, ...) and [`Error::healing`] whether retrying can help. New
/// variants may be added: match with a wildcard arm.
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
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A value is malformed, out of range or missing: a command id, a queue or table name,
    /// a duration, a URL, a JSON payload, an operation given nothing to act on.
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
    /// serve actions without a token, a processor without handlers. Nothing was changed.
    #[error("{0}")]
    Refused(String),

    /// The request needs one queue but was given several (or none) to choose from: say
    /// which one. Nothing was changed.
    #[error("{0}")]
    Ambiguous(String),

    /// A queue, a priority or a unique key was asked of a table at schema version 1: the
    /// table needs icq's schema upgrade migration first. Nothing was changed.
    #[error(
        "table {table} is schema version 1; queues, priorities and unique keys need version 2, \
         which icq's schema upgrade migration adds (asked for: {asked_for}); nothing was changed"
    )]
    NeedsSchemaV2 {
        /// The (display form of the) table.
        table: String,
        /// What needed version 2, e.g. `a unique key`.
        asked_for: String,
    },

    /// Something of schema version 4 (an order or concurrency key, a queue pause, a limit,
    /// a recurring schedule) was asked of an older table: the table needs icq's schema
    /// upgrade migration first. Nothing was changed.
    #[error(
        "table {table} is schema version {version}; {asked_for} needs version 4, which icq's \
         schema upgrade migration adds (`icq migrate add` writes <version>_icq_schema_v4.sql); \
         nothing was changed"
    )]
    NeedsSchemaV4 {
        /// The (display form of the) table.
        table: String,
        /// Its schema version.
        version: u32,
        /// What needed version 4, e.g. `pausing a queue`.
        asked_for: String,
    },

    /// What was asked is not something icq supports: SQL Server outside migrations, a
    /// PostgreSQL pooler in transaction mode, a database URL of an engine whose Cargo
    /// feature this build lacks ([`Error::engine_not_built`]).
    #[error("{0}")]
    Unsupported(String),

    /// Someone else changed the rows while this request was applying, so it was rolled back
    /// (or stopped) as the message says; running it again usually succeeds.
    #[error("{0}")]
    Conflict(String),

    /// Something inside icq failed at run time: a source worker crashed, a client could
    /// not be built, a process-wide recorder was taken.
    #[error("{context}: {source}")]
    Runtime {
        /// What icq was doing.
        context: String,
        /// What failed (its text is part of the message).
        source: BoxError,
    },

    /// A command id, source or other named thing does not exist.
    #[error("{0}")]
    NotFound(String),

    /// The commands table is missing from a source's database, or the schema its
    /// schema-qualified name points into does not exist: the message says which, and how
    /// the engine creates a missing schema. icq's migrations (or
    /// [`schema::apply`](crate::schema::apply)) create the table; a schema is created by hand.
    #[error("{}", table_missing_message(source_name, table, engine, missing_schema.as_deref()))]
    TableMissing {
        /// The configured source (empty until [`Error::in_source`] names it, when
        /// the driver found the schema missing while connecting).
        source_name: String,
        /// The (display form of the) table name.
        table: String,
        /// The engine's name (`postgres`, `mysql`, `sqlite`).
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

    /// A processor run with [`RunOptions::until_idle`](crate::RunOptions) gave up on a
    /// database error that retrying cannot fix (permission denied, a missing table or
    /// column, a read-only database, a failed login: see [`Error::healing`] and
    /// [`Error::database_kind`]) after a short bounded retry. The message holds the
    /// server's own and what to do about it.
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
    /// scheduled.
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
        // disconnect, and the client library's lost-connection numbers. On a Galera
        // cluster also a certification failure at commit (1180, `Got error 6 during
        // COMMIT`) and a node that is not in the primary component or not synced yet
        // (1047, `WSREP has not yet prepared node for application use`).
        1040
        | 1041
        | 1047
        | 1053
        | 1152..=1161
        | 1180
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

/// Whether a MariaDB/MySQL error is a deadlock or a Galera certification failure (see
/// [`Error::lost_race`]).
fn mysql_lost_race(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return matches!(my.number(), 1180 | 1213);
    }
    let _ = db;
    false
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

/// What a database reported, classified by its code (PostgreSQL's SQLSTATE, the
/// MariaDB/MySQL error number, SQLite's result code) so that a service can match it:
/// see [`Error::database_kind`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> icq::Result<()> {
/// use icq::Error;
/// use icq::error::DatabaseErrorKind;
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.map_err(Error::db("opening"))?;
/// let missing = sqlx::query("SELECT * FROM missing").execute(&pool).await;
/// let err = missing.map_err(Error::db("reading")).unwrap_err();
/// assert_eq!(err.database_kind(), Some(DatabaseErrorKind::UndefinedTable));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatabaseErrorKind {
    /// A unique constraint or primary key was violated (PostgreSQL 23505, MariaDB/MySQL
    /// 1062, SQLite `SQLITE_CONSTRAINT_UNIQUE` / `_PRIMARYKEY`).
    UniqueViolation,
    /// The database user lacks a privilege (PostgreSQL 42501, MariaDB/MySQL 1044, 1142,
    /// 1143, 1227, SQLite `SQLITE_PERM` / `SQLITE_AUTH`).
    PermissionDenied,
    /// A table, or the schema it is in, does not exist (PostgreSQL 42P01 and 3F000,
    /// MariaDB/MySQL 1146, SQLite's `no such table`; also [`Error::TableMissing`]).
    UndefinedTable,
    /// A column does not exist (PostgreSQL 42703, MariaDB/MySQL 1054, SQLite's `no such
    /// column`, or a row without a column icq reads).
    UndefinedColumn,
    /// The database accepts no writes: a PostgreSQL server in recovery (25006), a
    /// MariaDB/MySQL server with `read_only` (1290, 1792, 1836), a read-only SQLite file
    /// (`SQLITE_READONLY`).
    ReadOnly,
    /// The server refused the login (PostgreSQL class 28, MariaDB/MySQL 1045).
    LoginFailed,
    /// The connection could not be made or was lost: refused, reset, timed out waiting
    /// for the pool, TLS, the server shutting down (PostgreSQL class 08, 57P01-57P03,
    /// MariaDB/MySQL 1053, 2002, 2003, 2006, 2013; also [`Error::Connect`]).
    Connection,
    /// Concurrent work got in the way: a serialization failure, a deadlock, a lock not
    /// granted in time, a busy or locked SQLite database (PostgreSQL 40001, 40P01, 55P03,
    /// MariaDB/MySQL 1205, 1213, a Galera certification failure 1180, `SQLITE_BUSY` /
    /// `SQLITE_LOCKED`). Running again usually succeeds.
    Contention,
    /// Anything else the database reported.
    Other,
}

/// What an error with this PostgreSQL SQLSTATE is.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn postgres_kind(code: &str) -> DatabaseErrorKind {
    use DatabaseErrorKind as K;
    match code {
        "23505" => K::UniqueViolation,
        "42501" => K::PermissionDenied,
        "42P01" | "3F000" => K::UndefinedTable,
        "42703" => K::UndefinedColumn,
        "25006" => K::ReadOnly,
        "40001" | "40P01" | "55P03" => K::Contention,
        "57P01" | "57P02" | "57P03" => K::Connection,
        _ if code.starts_with("28") => K::LoginFailed,
        _ if code.starts_with("08") => K::Connection,
        _ => K::Other,
    }
}

/// What an error with this MariaDB/MySQL error number is.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
fn mysql_kind(number: u16) -> DatabaseErrorKind {
    use DatabaseErrorKind as K;
    match number {
        1062 => K::UniqueViolation,
        1044 | 1142 | 1143 | 1227 => K::PermissionDenied,
        1146 => K::UndefinedTable,
        1054 => K::UndefinedColumn,
        1290 | 1792 | 1836 => K::ReadOnly,
        1045 => K::LoginFailed,
        1047 | 1053 | 2002 | 2003 | 2006 | 2013 => K::Connection,
        1180 | 1205 | 1213 => K::Contention,
        _ => K::Other,
    }
}

/// What an error with this SQLite (extended) result code and message is. SQLite reports a
/// missing table or column as the generic `SQLITE_ERROR`: only its message tells them apart.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
fn sqlite_kind(code: i64, message: &str) -> DatabaseErrorKind {
    use DatabaseErrorKind as K;
    match code {
        // SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE.
        1555 | 2067 => K::UniqueViolation,
        _ => match code & 0xff {
            // SQLITE_ERROR
            1 if message.starts_with("no such table") => K::UndefinedTable,
            1 if message.starts_with("no such column") => K::UndefinedColumn,
            // SQLITE_PERM, SQLITE_AUTH
            3 | 23 => K::PermissionDenied,
            // SQLITE_BUSY, SQLITE_LOCKED
            5 | 6 => K::Contention,
            // SQLITE_READONLY
            8 => K::ReadOnly,
            _ => K::Other,
        },
    }
}

/// What a driver error is.
fn sqlx_kind(cause: &sqlx::Error) -> DatabaseErrorKind {
    match cause {
        // Only the engines this build has can have raised one (see the `*_kind` above).
        sqlx::Error::Database(db) => {
            #[cfg(feature = "postgres")]
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                return postgres_kind(pg.code());
            }
            #[cfg(feature = "mysql")]
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return mysql_kind(my.number());
            }
            #[cfg(feature = "sqlite")]
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                let code = db.code().and_then(|c| c.parse().ok()).unwrap_or(1);
                return sqlite_kind(code, db.message());
            }
            if db.is_unique_violation() {
                DatabaseErrorKind::UniqueViolation
            } else {
                DatabaseErrorKind::Other
            }
        }
        sqlx::Error::ColumnNotFound(_) => DatabaseErrorKind::UndefinedColumn,
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => DatabaseErrorKind::Connection,
        _ => DatabaseErrorKind::Other,
    }
}

/// What to do about an error that does not heal: the hint of [`Error::CannotHeal`], chosen
/// by the error's [`DatabaseErrorKind`].
pub(crate) fn unhealable_hint(err: &Error) -> String {
    unhealable_hint_for(err.database_kind()).into()
}

/// The hint of [`unhealable_hint`] for an error of this kind.
fn unhealable_hint_for(kind: Option<DatabaseErrorKind>) -> &'static str {
    use DatabaseErrorKind as K;
    match kind {
        Some(K::PermissionDenied) => {
            "the database user of this source lacks a privilege on the commands table: grant it \
             SELECT, INSERT, UPDATE and DELETE on the table (PostgreSQL: `GRANT SELECT, INSERT, \
             UPDATE, DELETE ON <table> TO <role>`; MariaDB/MySQL: `GRANT SELECT, INSERT, UPDATE, \
             DELETE ON <db>.<table> TO <user>`)"
        }
        Some(K::LoginFailed) => {
            "the server refused the login: check the user and password in the source's url (and \
             the server's pg_hba.conf or the user's allowed hosts)"
        }
        Some(K::UndefinedTable | K::UndefinedColumn) => {
            "the commands table (or a column icq needs) is missing: create or upgrade it by \
             applying icq's migrations to this source's database, or fix the table's name"
        }
        Some(K::ReadOnly) => {
            "the database accepts no writes (a read-only file or mount, a server with \
             `read_only` set, or a replica): point the source at a writable database"
        }
        _ => {
            "the server rejects icq's statements and retrying does not change that: fix the cause \
             in the message, then run again"
        }
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        Error::Migrate(err)
    }
}

/// The message of [`Error::TableMissing`]: what is missing (and for a schema, how to
/// create it).
fn table_missing_message(
    source: &str,
    table: &str,
    engine: &str,
    missing_schema: Option<&str>,
) -> String {
    match missing_schema {
        None => format!("source `{source}`: table {table} does not exist"),
        Some(schema) => format!(
            "source `{source}`: the schema `{schema}` of table {table} does not exist in the \
             database; hint: fix the schema in the table's name, or create the schema ({}) and \
             then the table",
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
    /// assert!(matches!(err, Error::NeedsSchemaV2 { .. }));
    /// assert!(err.to_string().starts_with("table InternalCommands is schema version 1"), "{err}");
    /// ```
    pub fn needs_schema_v2(table: &impl std::fmt::Display, what: &str) -> Error {
        Error::NeedsSchemaV2 {
            table: table.to_string(),
            asked_for: what.to_owned(),
        }
    }

    /// [`Error::NeedsSchemaV4`] for asking a `table` at schema `version` (below 4) for
    /// `what` (an order key, a paused queue, a limit, a schedule), naming the upgrade.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{Error, TableName};
    ///
    /// let err = Error::needs_schema_v4(&TableName::default(), 3, "pausing a queue");
    /// assert!(matches!(err, Error::NeedsSchemaV4 { version: 3, .. }));
    /// assert!(err.to_string().starts_with("table InternalCommands is schema version 3"), "{err}");
    /// ```
    pub fn needs_schema_v4(table: &impl std::fmt::Display, version: u32, what: &str) -> Error {
        Error::NeedsSchemaV4 {
            table: table.to_string(),
            version,
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
    /// assert!(matches!(err, icq::Error::Unsupported(_)));
    /// assert!(err.to_string().contains(r#"features = ["mysql"]"#), "{err}");
    /// ```
    pub fn engine_not_built(engine: crate::Engine) -> Error {
        let Some(feature) = engine.feature() else {
            return Error::Unsupported(format!(
                "{} has no driver in icq: it is supported for migrations only",
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
    /// assert!(matches!(err, icq::Error::Invalid { .. }));
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
            Error::Ambiguous(text) => Error::Ambiguous(with(text)),
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
    /// ([`Error::Runtime`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let err = icq::Error::runtime("cannot build the HTTP client")(std::io::Error::other("no TLS"));
    /// assert_eq!(err.to_string(), "cannot build the HTTP client: no TLS");
    /// ```
    pub fn runtime<E: Into<BoxError>>(context: impl Into<String>) -> impl FnOnce(E) -> Error {
        let context = context.into();
        move |source| Error::Runtime {
            context,
            source: source.into(),
        }
    }
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
    /// What the database reported, classified by its code, for a [`Error::Database`] (or
    /// the cause of a [`Error::CannotHeal`]); [`DatabaseErrorKind::Connection`] for a
    /// [`Error::Connect`], [`DatabaseErrorKind::UndefinedTable`] for a
    /// [`Error::TableMissing`]; `None` for errors that are not the database's.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Error;
    /// use icq::error::DatabaseErrorKind;
    ///
    /// let lost = Error::db("claiming commands")(sqlx::Error::PoolTimedOut);
    /// assert_eq!(lost.database_kind(), Some(DatabaseErrorKind::Connection));
    /// assert_eq!(Error::invalid("bad id").database_kind(), None);
    /// ```
    pub fn database_kind(&self) -> Option<DatabaseErrorKind> {
        match self {
            Error::Database { cause, .. } => Some(sqlx_kind(cause)),
            Error::CannotHeal { cause, .. } => cause.database_kind(),
            Error::Connect { .. } => Some(DatabaseErrorKind::Connection),
            Error::TableMissing { .. } => Some(DatabaseErrorKind::UndefinedTable),
            _ => None,
        }
    }

    /// True when the call lost a race to another transaction and running it again is the
    /// whole remedy: a MariaDB/MySQL deadlock (1213) or a Galera certification failure,
    /// which a cluster reports as a deadlock or, at commit, as 1180 (`Got error 6 during
    /// COMMIT`). The transaction was rolled back, so nothing it did took effect: a claim
    /// it made is the other transaction's to settle. The processor retries these quietly
    /// and counts them (`icq_internal_commands_lost_races_total`).
    pub(crate) fn lost_race(&self) -> bool {
        match self {
            Error::Database {
                cause: sqlx::Error::Database(db),
                ..
            } => mysql_lost_race(db.as_ref()),
            _ => false,
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
            | Error::Invalid { .. }
            | Error::Refused(_)
            | Error::Ambiguous(_)
            | Error::NeedsSchemaV2 { .. }
            | Error::NeedsSchemaV4 { .. }
            | Error::Unsupported(_)
            | Error::EngineMismatch { .. } => Healing::Never,
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
    /// let invalid = Error::invalid("bad").in_source("orders");
    /// assert_eq!(invalid.to_string(), "bad"); // left as it was
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
    /// assert!(matches!(err, Error::Database { .. }));
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
    /// assert!(matches!(err, Error::Io { .. }));
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
    fn database_codes_are_classified() {
        use DatabaseErrorKind as K;
        for (code, kind) in [
            ("23505", K::UniqueViolation),
            ("42501", K::PermissionDenied),
            ("42P01", K::UndefinedTable),
            ("3F000", K::UndefinedTable),
            ("42703", K::UndefinedColumn),
            ("25006", K::ReadOnly),
            ("28P01", K::LoginFailed),
            ("28000", K::LoginFailed),
            ("08006", K::Connection),
            ("57P01", K::Connection),
            ("40001", K::Contention),
            ("40P01", K::Contention),
            ("22P02", K::Other),
        ] {
            assert_eq!(postgres_kind(code), kind, "{code}");
        }
        for (number, kind) in [
            (1062, K::UniqueViolation),
            (1044, K::PermissionDenied),
            (1142, K::PermissionDenied),
            (1146, K::UndefinedTable),
            (1054, K::UndefinedColumn),
            (1290, K::ReadOnly),
            (1045, K::LoginFailed),
            (2013, K::Connection),
            (1213, K::Contention),
            (1180, K::Contention),
            (1047, K::Connection),
            (1064, K::Other),
        ] {
            assert_eq!(mysql_kind(number), kind, "{number}");
        }
        for (code, message, kind) in [
            (2067, "UNIQUE constraint failed: t.k", K::UniqueViolation),
            (1555, "UNIQUE constraint failed: t.id", K::UniqueViolation),
            (1, "no such table: InternalCommands", K::UndefinedTable),
            (1, "no such column: LockToken", K::UndefinedColumn),
            (1, "near \"x\": syntax error", K::Other),
            (8, "attempt to write a readonly database", K::ReadOnly),
            (1032, "attempt to write a readonly database", K::ReadOnly),
            (5, "database is locked", K::Contention),
            (23, "not authorized", K::PermissionDenied),
        ] {
            assert_eq!(sqlite_kind(code, message), kind, "{code} {message}");
        }
        assert_eq!(
            sqlx_kind(&sqlx::Error::ColumnNotFound("LockToken".into())),
            K::UndefinedColumn
        );
        assert_eq!(sqlx_kind(&sqlx::Error::PoolTimedOut), K::Connection);
        assert_eq!(sqlx_kind(&sqlx::Error::RowNotFound), K::Other);
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
        for number in [
            1040, 1047, 1053, 1180, 1205, 1213, 1226, 1927, 1969, 2006, 2013,
        ] {
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
    fn the_hint_follows_the_classification() {
        use DatabaseErrorKind as K;
        let grant = unhealable_hint_for(Some(K::PermissionDenied));
        assert!(grant.contains("GRANT"), "{grant}");
        assert!(unhealable_hint_for(Some(K::LoginFailed)).contains("password"));
        for missing in [K::UndefinedTable, K::UndefinedColumn] {
            assert!(unhealable_hint_for(Some(missing)).contains("is missing"));
        }
        assert!(unhealable_hint_for(Some(K::ReadOnly)).contains("writable"));
        assert!(unhealable_hint_for(None).contains("fix the cause"));
        let table = Error::TableMissing {
            source_name: "s".into(),
            table: "t".into(),
            engine: "postgres",
            missing_schema: None,
        };
        assert!(unhealable_hint(&table).contains("is missing"));
    }

    #[test]
    fn cannot_heal_names_the_source_the_cause_and_the_tries() {
        let cause = Error::Database {
            context: "claiming due commands (InternalCommands)".into(),
            cause: sqlx::Error::ColumnNotFound("LockToken".into()),
        };
        let hint = unhealable_hint(&cause);
        let err = Error::CannotHeal {
            source_name: "orders".into(),
            cause: Box::new(cause),
            tries: 4,
            seconds: 3.2,
            hint,
        };
        assert_eq!(
            err.database_kind(),
            Some(DatabaseErrorKind::UndefinedColumn)
        );
        assert_eq!(err.healing(), Healing::Never);
        let text = err.to_string();
        assert!(
            text.starts_with("source `orders`: claiming due commands"),
            "{text}"
        );
        assert!(text.contains("LockToken"), "{text}");
        assert!(text.contains("4 tries over 3.2 s"), "{text}");
        assert!(text.contains("hint: the commands table"), "{text}");
    }
}
