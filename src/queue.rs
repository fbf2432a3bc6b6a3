//! Scheduling: a [`Queue`] is one source's handle for scheduling commands standalone
//! (saved at once, waking the local processor), and [`schedule_in`] (one command) and
//! [`schedule_many_in`] (a batch, in bulk) enroll commands in the caller's own sqlx
//! transaction, so they commit or roll back with the business change.
//!
//! A queue is made from the application's own sqlx pool ([`Queue::from_pool`]) or from a
//! URL, with pools of its own ([`Queue::connect`]).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::command::{CommandId, NewCommand, Scheduled};
use crate::engine::sealed;
use crate::engine::{self, Backend, ConnectOptions};
use crate::engine::{CommandGetParams, CommandInsertManyParams, CommandInsertParams};
use crate::error::{Error, Result};
use crate::ident::{Engine, TableName};
use crate::processor::{SourceHandle, Stats};
use crate::settings::Settings;

pub use crate::engine::QueueDatabase;

/// A connection (or, through `&mut *tx`, an open transaction) that can take a command.
///
/// Implemented for sqlx's `PgConnection`, `SqliteConnection` and `MySqlConnection`, so a
/// pooled connection (`&mut *conn`) or a transaction (`&mut *tx`) of any of them works
/// with [`schedule_in`] and [`Queue::schedule_in`], each in a build with its engine's Cargo
/// feature (`postgres`, `sqlite`, `mysql`). Sealed: implemented by icq only.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let pool = sqlx::SqlitePool::connect(&url).await?;
/// # let ddl = icq::schema::render(icq::Engine::Sqlite, &icq::TableName::default());
/// # sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.up)).execute(&pool).await?;
/// use icq::{Enqueue, NewCommand, TableName};
///
/// let mut conn = pool.acquire().await?;
/// let command = NewCommand::new("orders.receipt", serde_json::json!({ "order": 42 }));
/// let scheduled = conn.enqueue(&TableName::default(), &command).await?;
/// assert_eq!(scheduled.id, command.id);
///
/// // The same unique key again, while the first row is pending: no second row.
/// let first = NewCommand::new("reports.daily", serde_json::json!({})).unique_key("day:2030-01-01");
/// let again = NewCommand::new("reports.daily", serde_json::json!({})).unique_key("day:2030-01-01");
/// let one = conn.enqueue(&TableName::default(), &first).await?;
/// let two = conn.enqueue(&TableName::default(), &again).await?;
/// assert_eq!((one.existing, two.existing), (false, true));
/// assert_eq!(two.id, first.id);
/// # Ok(())
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "icq cannot schedule through `{Self}`",
    note = "pass a connection, or an open transaction as `&mut *tx` (a `&mut Transaction` itself is not a connection)",
    note = "if it is one, enable icq-queue's Cargo feature for its engine: `postgres`, `sqlite` or `mysql` (MySQL and MariaDB)"
)]
#[async_trait]
pub trait Enqueue: sealed::Connection + Send {
    /// The engine this connection speaks.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use icq::{Engine, Enqueue};
    /// use sqlx::Connection;
    ///
    /// let conn = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
    /// assert_eq!(conn.engine(), Engine::Sqlite);
    /// # Ok(())
    /// # }
    /// ```
    fn engine(&self) -> Engine;

    /// Inserts `command` into `table` through this connection. With a unique key whose
    /// pending row exists, inserts nothing and returns that row's id
    /// ([`Scheduled::existing`]). See [`Enqueue`]'s example.
    async fn enqueue(&mut self, table: &TableName, command: &NewCommand) -> Result<Scheduled>;

    /// Inserts `commands` into `table` through this connection in bulk (`COPY` and
    /// multi-row inserts on PostgreSQL, multi-row inserts in chunks on SQLite and
    /// MySQL/MariaDB), inside a savepoint of its own: all of them or, on an error, none.
    /// One [`Scheduled`] per command, in order; unique keys as [`Enqueue::enqueue`] keeps
    /// them (a command whose key a pending row holds, stored before or earlier in the
    /// batch, returns that row's id). See [`schedule_many_in`].
    async fn enqueue_many(
        &mut self,
        table: &TableName,
        commands: &[NewCommand],
    ) -> Result<Vec<Scheduled>>;
}

/// Schedules `command` inside the caller's transaction (pass `&mut *tx`). Nothing else is
/// touched: the caller's commit persists the row, a rollback erases it. On PostgreSQL
/// the commit also wakes idle processors (the table's NOTIFY trigger).
///
/// [`Queue::schedule_in`] does the same with the queue's table, and [`Queue::commit`] then
/// also wakes the processor in this process.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let pool = sqlx::SqlitePool::connect(&url).await?;
/// # let ddl = icq::schema::render(icq::Engine::Sqlite, &icq::TableName::default());
/// # sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.up)).execute(&pool).await?;
/// use icq::{NewCommand, TableName};
///
/// let mut tx = pool.begin().await?;
/// let command = NewCommand::new("orders.receipt", serde_json::json!({ "order": 42 }));
/// icq::schedule_in(&mut *tx, &TableName::default(), &command).await?;
/// tx.rollback().await?; // the command goes with the rest of the transaction
/// let (rows,): (i64,) = sqlx::query_as(r#"SELECT COUNT(*) FROM "InternalCommands""#)
///     .fetch_one(&pool)
///     .await?;
/// assert_eq!(rows, 0);
/// # Ok(())
/// # }
/// ```
pub async fn schedule_in<C: Enqueue + ?Sized>(
    conn: &mut C,
    table: &TableName,
    command: &NewCommand,
) -> Result<Scheduled> {
    conn.enqueue(table, command).await
}

/// Schedules `commands` inside the caller's transaction (pass `&mut *tx`) in bulk: on
/// PostgreSQL by `COPY` (with one multi-row insert per chunk for the commands with a
/// unique key), on SQLite and MySQL/MariaDB by multi-row inserts in chunks. As fast as
/// [`Queue::schedule_many`], and like [`schedule_in`] nothing is committed: the caller's
/// commit persists them all, a rollback none; on PostgreSQL the commit wakes idle
/// processors.
///
/// Returns one [`Scheduled`] per command, in input order. A command with a unique key
/// that a pending row holds — stored before, or earlier in the same batch — inserts
/// nothing and returns that row's id with `existing: true`. Every command is checked
/// before anything is written: an invalid one fails the call with an error naming its
/// index ([`Error::Invalid`]); a failing statement leaves none of the batch (the call
/// runs in a savepoint of its own) and the caller's transaction usable. No commands, no
/// statement.
///
/// [`Queue::schedule_many_in`] does the same with the queue's table, and
/// [`Queue::commit`] then also wakes the processor in this process.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let pool = sqlx::SqlitePool::connect(&url).await?;
/// # let ddl = icq::schema::render(icq::Engine::Sqlite, &icq::TableName::default());
/// # sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.up)).execute(&pool).await?;
/// use icq::{NewCommand, TableName};
/// use serde_json::json;
///
/// let table = TableName::default();
/// let mut commands: Vec<NewCommand> = (1..=500)
///     .map(|line| NewCommand::new("orders.ship_line", json!({ "order": 42, "line": line })))
///     .collect();
/// // Two commands with one unique key: one row, both get its id.
/// let receipt = || NewCommand::new("orders.receipt", json!({ "order": 42 })).unique_key("receipt:42");
/// commands.push(receipt());
/// commands.push(receipt());
///
/// let mut tx = pool.begin().await?;
/// let scheduled = icq::schedule_many_in(&mut *tx, &table, &commands).await?;
/// tx.commit().await?;
/// assert_eq!(scheduled.len(), 502);
/// assert_eq!(scheduled[0].id, commands[0].id);
/// assert!(!scheduled[500].existing && scheduled[501].existing);
/// assert_eq!(scheduled[501].id, scheduled[500].id);
/// let (rows,): (i64,) = sqlx::query_as(r#"SELECT COUNT(*) FROM "InternalCommands""#)
///     .fetch_one(&pool)
///     .await?;
/// assert_eq!(rows, 501);
///
/// // An invalid command fails the batch, naming it; nothing of the batch is written.
/// let bad = vec![
///     NewCommand::new("orders.receipt", json!({})),
///     NewCommand::new("orders.receipt", json!({})).queue("no\nnewlines"),
/// ];
/// let mut tx = pool.begin().await?;
/// let err = icq::schedule_many_in(&mut *tx, &table, &bad).await.unwrap_err();
/// assert!(err.to_string().starts_with("command 1 of the batch"), "{err}");
/// # Ok(())
/// # }
/// ```
pub async fn schedule_many_in<C: Enqueue + ?Sized>(
    conn: &mut C,
    table: &TableName,
    commands: &[NewCommand],
) -> Result<Vec<Scheduled>> {
    if commands.is_empty() {
        return Ok(Vec::new());
    }
    conn.enqueue_many(table, commands).await
}

/// One source: a connection pool on its commands table, and the signal that wakes the
/// processor running in this process.
///
/// Made from the application's own pool ([`Queue::from_pool`]) or from a URL
/// ([`Queue::connect`], which opens pools of its own). Cloning is cheap: clones share the
/// pool, the wake-up signal and the counters.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// use icq::{Engine, NewCommand, Queue, TableName};
///
/// let pool = sqlx::SqlitePool::connect(&url).await?; // the application's pool
/// let table = TableName::default();
/// icq::schema::apply(&pool, &table).await?; // creates the table (or upgrades it)
/// let queue = Queue::from_pool("shop", &pool, &table).await?;
/// assert_eq!((queue.name(), queue.table().name()), ("shop", "InternalCommands"));
/// assert_eq!(queue.engine(), Engine::Sqlite);
///
/// let id = queue.schedule(&NewCommand::new("orders.receipt", serde_json::json!({}))).await?;
/// assert!(queue.get(&id).await?.is_some());
/// queue.close().await; // the application's pool stays open
/// assert!(!pool.is_closed());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Queue {
    name: Arc<str>,
    backend: Arc<dyn Backend>,
    wake: Arc<Notify>,
    stats: Arc<Stats>,
}

impl Queue {
    /// Connects to `url` (engine from the scheme) for `table`, checking the table exists,
    /// with pools of the queue's own (what `icq work` uses; a service that has a pool
    /// already hands it over with [`Queue::from_pool`]). An unreachable server fails at
    /// once with the cause ([`Error::Connect`], e.g. `connection refused (127.0.0.1:1)`),
    /// not after the pool's acquire timeout. A PostgreSQL URL may list several hosts, and
    /// the queue follows a failover to the writable one.
    ///
    /// The table must exist: create it with a migration (`icq migrate add`, then
    /// `icq migrate run` or sqlx-cli), or with [`crate::schema::apply`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let pool = sqlx::SqlitePool::connect(&url).await?;
    /// # let ddl = icq::schema::render(icq::Engine::Sqlite, &icq::TableName::default());
    /// # sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.up)).execute(&pool).await?;
    /// use icq::{ConnectOptions, Error, Queue, TableName};
    ///
    /// let options = ConnectOptions::default().with_max_connections(4);
    /// let queue = Queue::connect("shop", &url, &TableName::default(), &options).await?;
    /// assert_eq!(queue.name(), "shop");
    ///
    /// let missing = TableName::parse("NoSuchTable")?;
    /// let result = Queue::connect("shop", &url, &missing, &options).await;
    /// assert!(matches!(result, Err(Error::TableMissing { .. })));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(
        name: &str,
        url: &str,
        table: &TableName,
        options: &ConnectOptions,
    ) -> Result<Queue> {
        if options.create_table {
            let engine = Engine::from_url(url).map_err(|err| err.in_source(name))?;
            let upgrade = |from| crate::schema::render_upgrade_from(engine, table, from).up;
            engine::upgrade_owned_table(url, table, &upgrade)
                .await
                .map_err(|err| err.in_source(name))?;
        }
        let backend = engine::connect(url, table, options)
            .await
            .map_err(|err| err.in_source(name))?;
        let queue = Queue::from_backend(name, backend);
        queue.ensure_table(options.create_table).await?;
        Ok(queue)
    }

    /// A queue on the application's own sqlx pool (a [`sqlx::PgPool`],
    /// [`sqlx::SqlitePool`] or [`sqlx::MySqlPool`]) for `table`, which must exist (create
    /// or upgrade it with [`crate::schema::apply`], or with a migration: `icq migrate
    /// add`). Scheduling, reads and the processor's claims, stamps, lease renewals and
    /// retention sweeps all use `pool`; [`Queue::close`] leaves it open.
    ///
    /// What differs from [`Queue::connect`], which opens pools of its own:
    ///
    /// - **Pool size.** A processor working a backlog uses up to about eight connections
    ///   of `pool` at once (four claims in flight, stamps, lease renewals, the sweep):
    ///   size `max_connections` for the application's own load plus that.
    /// - **PostgreSQL.** icq still opens one connection of its own, from `pool`'s connect
    ///   options: the LISTEN connection that wakes the processor on inserts and operator
    ///   cancels (it reconnects when lost). A transaction pooler (PgBouncer's
    ///   `pool_mode = transaction`) is detected when the queue is made (one extra
    ///   connection) and handled as `pooler: transaction` is: no LISTEN (the processor
    ///   polls) and each statement in its own transaction; the application's options
    ///   should then turn sqlx's statement cache off (`statement_cache_capacity(0)`).
    ///   Behind PgBouncer in either mode they also need `extra_float_digits(None)` (unless
    ///   PgBouncer's `ignore_startup_parameters` lists it): PgBouncer refuses sqlx's
    ///   default startup parameter, and icq's own connections leave it out. A
    ///   URL listing several hosts (failover) is [`Queue::connect`]'s alone.
    /// - **Durability, PostgreSQL.** The same as [`Queue::connect`]'s: everything icq
    ///   writes commits with the server's `synchronous_commit`. The processor's claims,
    ///   stamps, lease renewals and sweeps run each in a transaction of its own with `SET
    ///   LOCAL plan_cache_mode = force_generic_plan` (the claim is planned once, not per
    ///   execution) and `SET LOCAL jit = off` (never compiled), so the application's
    ///   statements on `pool` keep its settings.
    /// - **SQLite.** `pool` is used as configured: icq's own connect sets WAL
    ///   (`journal_mode(Wal)`), `synchronous(Full)` (`Normal` only for the processor's own
    ///   writes) and a 30 s `busy_timeout`. A shared pool wants WAL and the busy timeout
    ///   too (above all: the processor writes from several connections), and keeps
    ///   SQLite's default `Full` for schedules that survive a power loss.
    /// - **Abandoned calls.** The processor abandons a database call that outlives its
    ///   deadline (a tenth of the lease). Its own pools then close the connection when it
    ///   comes back; `pool` has no such hook, so a connection on a dead socket is held
    ///   until TCP gives up on it: keep TCP keepalives (or a server-side statement timeout)
    ///   on where connections cross a proxy or NAT.
    ///
    /// # Examples
    ///
    /// On SQLite (see [`Queue`]'s example); PostgreSQL and MySQL/MariaDB take their pools
    /// the same way:
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use icq::{Queue, TableName};
    ///
    /// let pool = sqlx::PgPool::connect("postgres://app@db/shop").await?;
    /// let table = TableName::default();
    /// icq::schema::apply(&pool, &table).await?;
    /// let queue = Queue::from_pool("shop", &pool, &table).await?;
    ///
    /// let pool = sqlx::MySqlPool::connect("mysql://app@db/shop").await?;
    /// let queue = Queue::from_pool("shop", &pool, &table).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn from_pool<DB: QueueDatabase>(
        name: &str,
        pool: &sqlx::Pool<DB>,
        table: &TableName,
    ) -> Result<Queue> {
        let backend = DB::driver(pool, table)
            .await
            .map_err(|err| err.in_source(name))?;
        let queue = Queue::from_backend(name, backend);
        queue.ensure_table(false).await?;
        Ok(queue)
    }

    /// Wraps an already connected driver.
    pub(crate) fn from_backend(name: &str, backend: Arc<dyn Backend>) -> Queue {
        let name: Arc<str> = Arc::from(name);
        Queue {
            stats: Arc::new(Stats::new(name.clone())),
            name,
            backend,
            wake: Arc::new(Notify::new()),
        }
    }

    /// Checks that the commands table exists; with `create`, creates it (the embedded
    /// default's first use) instead of failing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// # let queue = source.clone();
    /// # let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("shop.db").display())).await?;
    /// queue.ensure_table(false).await?; // it is there
    ///
    /// let down = icq::schema::render(icq::Engine::Sqlite, queue.table()).down;
    /// sqlx::raw_sql(sqlx::AssertSqlSafe(down)).execute(&pool).await?; // dropped
    /// let gone = queue.ensure_table(false).await;
    /// assert!(matches!(gone, Err(icq::Error::TableMissing { .. })));
    /// queue.ensure_table(true).await?; // created again
    /// queue.ensure_table(false).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn ensure_table(&self, create: bool) -> Result<()> {
        if self.backend.table_exists().await? {
            return Ok(());
        }
        let engine = self.backend.engine();
        if create {
            let ddl = crate::schema::render(engine, self.backend.table());
            return self.backend.schema_apply(&ddl.up).await;
        }
        Err(Error::TableMissing {
            source_name: self.name.to_string(),
            table: self.backend.table().to_string(),
            engine: engine.name(),
            missing_schema: None,
        })
    }

    /// The source name. See [`Queue`]'s example.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The engine of the queue's database. See [`Queue`]'s example.
    pub fn engine(&self) -> Engine {
        self.backend.engine()
    }

    /// How many commands are due and running right now, counted no further than a
    /// processor needs to know whether it is idle (at least the first 1,000 in claim
    /// order): a cheap gauge for a dashboard, where [`crate::admin::pending`] counts
    /// exactly.
    pub async fn activity(&self) -> Result<crate::Activity> {
        self.backend.activity().await
    }

    /// Pauses `queue` for every replica: claims skip its commands (at once on
    /// PostgreSQL, within each processor's polling interval elsewhere); scheduling into
    /// it goes on and running commands finish. `true` when it was running. Needs a table
    /// at schema version 4 ([`crate::Error::NeedsSchemaV4`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// let queue = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// assert!(queue.pause("webhooks").await?);
    /// assert!(queue.queue_states().await?.iter().any(|q| q.queue == "webhooks" && q.paused));
    /// assert!(queue.resume("webhooks").await?);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn pause(&self, queue: &str) -> Result<bool> {
        crate::settings::validate_queue_name(queue).map_err(crate::Error::invalid)?;
        self.backend.queue_set_paused(queue, true).await
    }

    /// Resumes a queue [`Queue::pause`]d: `true` when it was paused.
    pub async fn resume(&self, queue: &str) -> Result<bool> {
        crate::settings::validate_queue_name(queue).map_err(crate::Error::invalid)?;
        self.backend.queue_set_paused(queue, false).await
    }

    /// The stored state of every queue that has one (paused or once paused), by name;
    /// empty on a table older than schema version 4. See [`Queue::pause`]'s example.
    pub async fn queue_states(&self) -> Result<Vec<crate::engine::control::QueueState>> {
        self.backend.queue_states().await
    }

    /// Drops the table and everything its migration created with it (the down script of
    /// [`crate::schema::render`]), if it exists, with every command in it: for a scratch
    /// table (a benchmark, a demo, a test), never for an application's queue.
    pub async fn drop_table(&self) -> Result<()> {
        let down = crate::schema::render(self.engine(), self.table()).down;
        self.backend.table_drop(&down).await
    }

    /// The driver, for operator queries.
    pub(crate) fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The table. See [`Queue`]'s example.
    pub fn table(&self) -> &TableName {
        self.backend.table()
    }

    /// Saves `command` now, on its own, and wakes the local processor. With a unique key
    /// whose pending row exists, saves nothing and returns that row's id
    /// ([`Scheduled::existing`]). On a version-1 table, a queue, a priority or a unique
    /// key is refused ([`Error::needs_schema_v2`]); plain commands schedule as before.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// # let queue = source.clone();
    /// use std::time::Duration;
    /// use icq::{NewCommand, State};
    ///
    /// let command = NewCommand::new("reports.daily", serde_json::json!({ "day": "2030-01-01" }))
    ///     .delay(Duration::from_secs(3600));
    /// let scheduled = queue.schedule(&command).await?;
    /// assert_eq!((scheduled.id.clone(), scheduled.existing), (command.id.clone(), false));
    /// let row = queue.get(&scheduled.id).await?.unwrap();
    /// assert_eq!(row.state(chrono::Utc::now()), State::Scheduled);
    ///
    /// // A unique key: while its row is pending, scheduling it again returns that row.
    /// let nightly = || NewCommand::new("reports.nightly", serde_json::json!({}))
    ///     .queue("reports")
    ///     .priority(5)
    ///     .unique_key("reports.nightly:2030-01-01");
    /// let first = queue.schedule(&nightly()).await?;
    /// let again = queue.schedule(&nightly()).await?;
    /// assert!(!first.existing && again.existing);
    /// assert_eq!(again.id, first.id);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn schedule(&self, command: &NewCommand) -> Result<Scheduled> {
        let scheduled = self
            .backend
            .command_insert(&CommandInsertParams { command })
            .await?;
        if !scheduled.existing {
            self.wake.notify_one();
        }
        Ok(scheduled)
    }

    /// Saves many commands through the engine's bulk path and wakes the local processor.
    /// Each with a unique key returns the one pending row holding it, whether that row
    /// existed before or came earlier in the same batch.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// # let queue = source.clone();
    /// use icq::NewCommand;
    ///
    /// let commands: Vec<NewCommand> = (1..=3)
    ///     .map(|order| NewCommand::new("orders.receipt", serde_json::json!({ "order": order })))
    ///     .collect();
    /// let ids = queue.schedule_many(&commands).await?;
    /// assert_eq!(ids.len(), 3);
    /// assert_eq!(ids[2], commands[2].id);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn schedule_many(&self, commands: &[NewCommand]) -> Result<Vec<Scheduled>> {
        let ids = self
            .backend
            .command_insert_many(&CommandInsertManyParams { commands })
            .await?;
        self.wake.notify_one();
        Ok(ids)
    }

    /// Schedules `command` in this queue's table inside the caller's transaction (pass
    /// `&mut *tx`): the caller's commit persists it, a rollback erases it. Commit with
    /// [`Queue::commit`] to also wake the local processor.
    ///
    /// `conn` must be of the queue's own engine: a connection of another
    /// ([`Enqueue::engine`]) fails with [`Error::EngineMismatch`] and writes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// # let queue = source.clone();
    /// # let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("shop.db").display())).await?;
    /// # sqlx::raw_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT); INSERT INTO orders VALUES (42, 'new')").execute(&pool).await?;
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = 42").execute(&mut *tx).await?;
    /// let command = icq::NewCommand::new("email.receipt", serde_json::json!({"order": 42}));
    /// let id = queue.schedule_in(&mut *tx, &command).await?;
    /// queue.commit(tx).await?; // both rows, or neither
    /// assert!(queue.get(&id).await?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn schedule_in<C: Enqueue + ?Sized>(
        &self,
        conn: &mut C,
        command: &NewCommand,
    ) -> Result<Scheduled> {
        let (queue, connection) = (self.engine(), conn.engine());
        if queue != connection {
            return Err(Error::EngineMismatch { queue, connection });
        }
        conn.enqueue(self.table(), command).await
    }

    /// Schedules `commands` in this queue's table inside the caller's transaction (pass
    /// `&mut *tx`), in bulk: [`schedule_many_in`] with the queue's table. Commit with
    /// [`Queue::commit`] to also wake the local processor.
    ///
    /// `conn` must be of the queue's own engine: a connection of another
    /// ([`Enqueue::engine`]) fails with [`Error::EngineMismatch`] and writes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// # let queue = source.clone();
    /// # let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("shop.db").display())).await?;
    /// use icq::NewCommand;
    ///
    /// let lines: Vec<NewCommand> = (1..=3)
    ///     .map(|line| NewCommand::new("orders.ship_line", serde_json::json!({ "line": line })))
    ///     .collect();
    /// let mut tx = pool.begin().await?;
    /// let scheduled = queue.schedule_many_in(&mut *tx, &lines).await?;
    /// tx.rollback().await?; // none of them
    /// assert!(queue.get(&scheduled[0].id).await?.is_none());
    ///
    /// let mut tx = pool.begin().await?;
    /// let scheduled = queue.schedule_many_in(&mut *tx, &lines).await?;
    /// queue.commit(tx).await?; // all of them, and the local processor wakes
    /// assert!(queue.get(&scheduled[2].id).await?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn schedule_many_in<C: Enqueue + ?Sized>(
        &self,
        conn: &mut C,
        commands: &[NewCommand],
    ) -> Result<Vec<Scheduled>> {
        let (queue, connection) = (self.engine(), conn.engine());
        if queue != connection {
            return Err(Error::EngineMismatch { queue, connection });
        }
        schedule_many_in(conn, self.table(), commands).await
    }

    /// Commits a transaction that scheduled commands with [`Queue::schedule_in`], then
    /// wakes the local processor so they start without waiting for a poll.
    /// See [`Queue::schedule_in`]'s example.
    pub async fn commit<DB: sqlx::Database>(&self, tx: sqlx::Transaction<'_, DB>) -> Result<()> {
        tx.commit()
            .await
            .map_err(Error::db("committing the transaction"))?;
        self.wake();
        Ok(())
    }

    /// Reads one command in full, or `None` when no row has that id.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// # let queue = source.clone();
    /// use icq::{CommandId, NewCommand};
    ///
    /// let command = NewCommand::new("orders.receipt", serde_json::json!({ "order": 42 }));
    /// let id = queue.schedule(&command).await?;
    /// let row = queue.get(&id).await?.expect("just scheduled");
    /// assert_eq!(row.payload["order"], 42);
    /// assert!(queue.get(&CommandId::new()).await?.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn get(&self, id: &CommandId) -> Result<Option<crate::CommandRow>> {
        self.backend.command_get(&CommandGetParams { id }).await
    }

    /// Closes the connection pools icq opened (in-flight statements finish first); a
    /// queue made by [`Queue::from_pool`] stops only its own LISTEN connection and leaves
    /// the application's pool open. Clones of the queue share the pools, so this closes
    /// theirs too. See [`Queue`]'s example.
    ///
    /// Bounded by [`CLOSE_DEADLINE`]: a server that stopped answering (a stalled machine,
    /// a vanished network) cannot hold the caller; the pools are closed to new work at
    /// once and the connections still open are dropped when the process ends.
    pub async fn close(&self) {
        close_within(self.backend.as_ref(), CLOSE_DEADLINE).await;
    }

    /// Wakes the local processor (call after committing a transaction that scheduled
    /// commands, on engines without LISTEN/NOTIFY, to skip waiting for the next poll).
    /// [`Queue::commit`] calls it for you.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// # let queue = source.clone();
    /// # let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("shop.db").display())).await?;
    /// let mut tx = pool.begin().await?;
    /// queue.schedule_in(&mut *tx, &icq::NewCommand::new("t", serde_json::json!({}))).await?;
    /// tx.commit().await?; // committed without `queue.commit(tx)`:
    /// queue.wake(); // start it now rather than at the next poll
    /// # Ok(())
    /// # }
    /// ```
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Counters of the processor running this source in this process.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// # let queue = source.clone();
    /// use icq::{NewCommand, Processor, Registry, RunOptions, Settings};
    ///
    /// queue.schedule(&NewCommand::new("ping", serde_json::json!({}))).await?;
    /// let mut registry = Registry::new();
    /// registry.insert("ping", std::sync::Arc::new(icq::handler::Noop))?;
    /// let mut processor = Processor::new(registry);
    /// processor.add_source(queue.source_handle(Settings::default()));
    /// let options = RunOptions::default().with_until_idle(true);
    /// processor.run(options, Default::default()).await?;
    ///
    /// let stats = queue.stats().snapshot();
    /// assert_eq!((stats.claimed, stats.succeeded, stats.dead_lettered), (1, 1, 0));
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The handle a [`crate::Processor`] needs to process this source with `settings`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// # let queue = source.clone();
    /// use icq::{Processor, Registry, Settings};
    ///
    /// let settings = Settings::default().with_concurrency(2);
    /// let mut processor = Processor::new(Registry::new());
    /// processor.add_source(queue.source_handle(settings));
    /// assert_eq!(processor.sources().len(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn source_handle(&self, settings: Settings) -> SourceHandle {
        SourceHandle {
            name: self.name.clone(),
            backend: self.backend.clone(),
            settings,
            wake: self.wake.clone(),
            stats: self.stats.clone(),
            pauses: Default::default(),
        }
    }
}

/// How long [`Queue::close`] (and `icq work` at exit) waits for the pools' connections
/// to close.
pub const CLOSE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// Closes `backend`'s pools, waiting at most `limit` for their connections.
pub(crate) async fn close_within(backend: &dyn crate::engine::Backend, limit: std::time::Duration) {
    if tokio::time::timeout(limit, backend.close()).await.is_err() {
        tracing::warn!(
            table = %backend.table(),
            waited_ms = limit.as_millis() as u64,
            "the database did not answer while its connections were closed; leaving them to the operating system"
        );
    }
}
