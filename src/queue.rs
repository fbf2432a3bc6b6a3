//! Scheduling: a [`Queue`] is one source's handle for scheduling commands standalone
//! (saved at once, waking the local processor), and [`schedule_in`] enrolls a command in
//! the caller's own sqlx transaction, so it commits or rolls back with the business change.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{MySqlConnection, PgConnection, SqliteConnection};
use tokio::sync::Notify;

use crate::command::{CommandId, NewCommand};
use crate::engine::{self, Backend, ConnectOptions};
use crate::engine::{CommandGetParams, CommandInsertManyParams, CommandInsertParams};
use crate::error::{Error, Result};
use crate::ident::TableName;
use crate::processor::{SourceHandle, Stats};
use crate::settings::Settings;

/// A connection (or, through `&mut *tx`, an open transaction) that can take a command.
#[async_trait]
pub trait Enqueue: Send {
    /// Inserts `command` into `table` through this connection.
    async fn enqueue(&mut self, table: &TableName, command: &NewCommand) -> Result<CommandId>;
}

#[async_trait]
impl Enqueue for PgConnection {
    async fn enqueue(&mut self, table: &TableName, command: &NewCommand) -> Result<CommandId> {
        engine::postgres::insert_command(self, table, command).await
    }
}

#[async_trait]
impl Enqueue for SqliteConnection {
    async fn enqueue(&mut self, table: &TableName, command: &NewCommand) -> Result<CommandId> {
        engine::sqlite::insert_command(self, table, command).await
    }
}

#[async_trait]
impl Enqueue for MySqlConnection {
    async fn enqueue(&mut self, table: &TableName, command: &NewCommand) -> Result<CommandId> {
        engine::mysql::insert_command(self, table, command).await
    }
}

/// Schedules `command` inside the caller's transaction (pass `&mut *tx`). Nothing else is
/// touched: the caller's commit persists the row, a rollback erases it. On PostgreSQL
/// the commit also wakes idle processors (the table's NOTIFY trigger).
pub async fn schedule_in<C: Enqueue + ?Sized>(
    conn: &mut C,
    table: &TableName,
    command: &NewCommand,
) -> Result<CommandId> {
    conn.enqueue(table, command).await
}

/// One source: a connection pool on its commands table, and the signal that wakes the
/// processor running in this process.
#[derive(Clone)]
pub struct Queue {
    name: Arc<str>,
    backend: Arc<dyn Backend>,
    wake: Arc<Notify>,
    stats: Arc<Stats>,
}

impl Queue {
    /// Connects to `url` (engine from the scheme) for `table`, checking the table exists.
    /// An unreachable server fails at once with the cause ([`Error::Connect`], e.g.
    /// `connection refused (127.0.0.1:1)`), not after the pool's acquire timeout.
    pub async fn connect(
        name: &str,
        url: &str,
        table: &TableName,
        options: &ConnectOptions,
    ) -> Result<Queue> {
        let backend = engine::connect(url, table, options)
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

    /// The source name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The driver, for operator queries.
    pub(crate) fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        self.backend.table()
    }

    /// Saves `command` now, on its own, and wakes the local processor.
    pub async fn schedule(&self, command: &NewCommand) -> Result<CommandId> {
        let id = self
            .backend
            .command_insert(&CommandInsertParams { command })
            .await?;
        self.wake.notify_one();
        Ok(id)
    }

    /// Saves many commands through the engine's bulk path and wakes the local processor.
    pub async fn schedule_many(&self, commands: &[NewCommand]) -> Result<Vec<CommandId>> {
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
    /// ```no_run
    /// # async fn demo(queue: &icq::Queue, pool: &sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = 42").execute(&mut *tx).await?;
    /// let id = queue
    ///     .schedule_in(&mut *tx, &icq::NewCommand::new("email.receipt", serde_json::json!({"order": 42})))
    ///     .await?;
    /// queue.commit(tx).await?; // both rows, or neither
    /// println!("scheduled {id}");
    /// # Ok(()) }
    /// ```
    pub async fn schedule_in<C: Enqueue + ?Sized>(
        &self,
        conn: &mut C,
        command: &NewCommand,
    ) -> Result<CommandId> {
        conn.enqueue(self.table(), command).await
    }

    /// Commits a transaction that scheduled commands with [`Queue::schedule_in`], then
    /// wakes the local processor so they start without waiting for a poll.
    pub async fn commit<DB: sqlx::Database>(&self, tx: sqlx::Transaction<'_, DB>) -> Result<()> {
        tx.commit()
            .await
            .map_err(Error::db("committing the transaction"))?;
        self.wake();
        Ok(())
    }

    /// Reads one command in full, or `None` when no row has that id.
    pub async fn get(&self, id: &CommandId) -> Result<Option<crate::CommandRow>> {
        self.backend.command_get(&CommandGetParams { id }).await
    }

    /// Closes the connection pool (in-flight statements finish first).
    pub async fn close(&self) {
        self.backend.close().await;
    }

    /// Wakes the local processor (call after committing a transaction that scheduled
    /// commands, on engines without LISTEN/NOTIFY, to skip waiting for the next poll).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Counters of the processor running this source in this process.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The handle a [`crate::Processor`] needs to process this source with `settings`.
    pub fn source_handle(&self, settings: Settings) -> SourceHandle {
        SourceHandle {
            name: self.name.clone(),
            backend: self.backend.clone(),
            settings,
            wake: self.wake.clone(),
            stats: self.stats.clone(),
        }
    }
}
