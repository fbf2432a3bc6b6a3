//! Per-engine DDL for the commands table, rendered from `templates/migrations/`.
//!
//! The templates are compiled into the binary; every name spliced into them is a
//! validated [`TableName`] quoted by [`Engine::quote_ident`], so configuration can never
//! inject SQL. The column shapes are the product contract that the processor and
//! any foreign writer rely on; the five indexes are `IX_<table>_Poll`,
//! `IX_<table>_QueuePoll`, `IX_<table>_UniqueKey`, `IX_<table>_Retention` and
//! `IX_<table>_DeadLetters`, partial (filtered) wherever the engine allows.
//!
//! Three renderings: [`render`] creates the current table (schema version 2),
//! [`render_upgrade`] takes a version-1 table to version 2 and back, and [`render_v1`] is
//! the original table (what older `icq migrate add` wrote).
//!
//! From Rust, [`apply`] brings a table on the application's pool to the current version:
//! it creates a missing table, upgrades a version-1 one and leaves a current one alone.
//!
//! PostgreSQL, SQLite and MySQL/MariaDB scripts are plain statements that sqlx's migrator
//! runs; the SQL Server script is T-SQL with `GO` batch separators, for sqlcmd, DbUp or
//! Flyway.

use crate::engine::Backend;
use crate::engine::QueueDatabase;
use crate::error::Result;
use crate::ident::{Engine, TableName};

/// What [`apply`] did to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaChange {
    /// The table was missing and was created at [`SCHEMA_VERSION`].
    Created,
    /// The table was at version 1 and was upgraded to [`SCHEMA_VERSION`]
    /// ([`render_upgrade`]).
    Upgraded,
    /// The table was at [`SCHEMA_VERSION`] already: nothing was run.
    UpToDate,
}

/// Creates `table` on the application's `pool`, or upgrades it, to [`SCHEMA_VERSION`]:
/// a missing table is created ([`render`]'s `up`: the table, its indexes and, on
/// PostgreSQL, the notify trigger), a version-1 table is upgraded in place
/// ([`render_upgrade`]'s `up`: its rows keep running) and a current one is left alone,
/// so it can run at every start of the application. The schema of a schema-qualified
/// name must exist.
///
/// Replicas starting together may all call it: one creates (or upgrades) the table, and
/// a call whose DDL lost that race finds the table at the current version and returns
/// [`SchemaChange::UpToDate`]. The CLI's way to the same table is a migration file
/// (`icq migrate add`, then `icq migrate run` or sqlx-cli): use one or the other for a
/// given table, since `apply` does not record itself in `_sqlx_migrations`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// use icq::schema::SchemaChange;
/// use icq::{Engine, TableName};
///
/// let pool = sqlx::SqlitePool::connect(&url).await?;
/// let table = TableName::default();
/// assert_eq!(icq::schema::apply(&pool, &table).await?, SchemaChange::Created);
/// assert_eq!(icq::schema::apply(&pool, &table).await?, SchemaChange::UpToDate);
///
/// // A version-1 table (written by an older icq) is upgraded, its rows kept.
/// let old = TableName::parse("OldCommands")?;
/// let v1 = icq::schema::render_v1(Engine::Sqlite, &old).up;
/// sqlx::raw_sql(sqlx::AssertSqlSafe(v1)).execute(&pool).await?;
/// assert_eq!(icq::schema::apply(&pool, &old).await?, SchemaChange::Upgraded);
/// # Ok(())
/// # }
/// ```
pub async fn apply<DB: QueueDatabase>(
    pool: &sqlx::Pool<DB>,
    table: &TableName,
) -> Result<SchemaChange> {
    let backend = DB::driver(pool, table).await?;
    apply_on(&*backend).await
}

/// [`apply`] through a driver.
pub(crate) async fn apply_on(backend: &dyn Backend) -> Result<SchemaChange> {
    let (engine, table) = (backend.engine(), backend.table());
    let (change, ddl) = if !backend.table_exists().await? {
        (SchemaChange::Created, render(engine, table).up)
    } else if backend.schema_version().await? < SCHEMA_VERSION {
        (SchemaChange::Upgraded, render_upgrade(engine, table).up)
    } else {
        return Ok(SchemaChange::UpToDate);
    };
    match backend.schema_apply(&ddl).await {
        Ok(()) => Ok(change),
        // Another process applied it meanwhile: its DDL won, this one failed on what it
        // had created. The table is there at the current version.
        Err(err) => match backend.table_exists().await {
            Ok(true) if backend.schema_version().await.ok() == Some(SCHEMA_VERSION) => {
                Ok(SchemaChange::UpToDate)
            }
            _ => Err(err),
        },
    }
}

/// The up and down SQL for one engine and table.
///
/// Apply `up` with any SQL runner (sqlx's `raw_sql`, a migration tool), or let
/// `icq migrate add` write it into a migration file, or [`apply`] it to your pool.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// use icq::{Engine, TableName};
///
/// let table = TableName::default();
/// let ddl = icq::schema::render(Engine::Sqlite, &table);
/// let pool = sqlx::SqlitePool::connect(&url).await?;
/// sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.up)).execute(&pool).await?;
/// let queue = icq::Queue::connect("shop", &url, &table, &Default::default()).await?;
/// queue.close().await;
/// sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.down)).execute(&pool).await?; // and it is gone
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ddl {
    /// Creates the table, its indexes and (PostgreSQL) the notify trigger; or, from
    /// [`render_upgrade`], takes a version-1 table to version 2.
    pub up: String,
    /// Removes everything `up` created (from [`render_upgrade`]: back to version 1).
    pub down: String,
}

/// The NOTIFY channel the PostgreSQL trigger signals for `table`: a program of your own
/// can `LISTEN` on it to learn that commands were scheduled.
///
/// # Examples
///
/// ```
/// use icq::TableName;
///
/// assert_eq!(icq::schema::notify_channel(&TableName::default()), "icq_InternalCommands");
/// let qualified = TableName::parse("jobs.Commands")?;
/// assert_eq!(icq::schema::notify_channel(&qualified), "icq_Commands");
/// # Ok::<(), icq::Error>(())
/// ```
pub fn notify_channel(table: &TableName) -> String {
    table.notify_channel()
}

/// The NOTIFY channel an operator's `icq cancel` signals for `table` on PostgreSQL when
/// it cancels a running command (`pg_notify` in the cancel's transaction): processors
/// `LISTEN` on it and check their leases at once. Table names are at most 50 characters,
/// so the channel stays within PostgreSQL's 63-byte identifiers.
///
/// # Examples
///
/// ```
/// use icq::TableName;
///
/// assert_eq!(icq::schema::cancel_channel(&TableName::default()), "icq_cancel_InternalCommands");
/// let qualified = TableName::parse("jobs.Commands")?;
/// assert_eq!(icq::schema::cancel_channel(&qualified), "icq_cancel_Commands");
/// # Ok::<(), icq::Error>(())
/// ```
pub fn cancel_channel(table: &TableName) -> String {
    table.cancel_channel()
}

/// The schema version [`render`] creates: 2 (queues, priorities, unique keys, trace
/// context). Version 1 is the original table.
pub const SCHEMA_VERSION: u32 = crate::ident::SCHEMA_VERSION;

/// Renders the version-1 DDL (the table before queues, priorities and unique keys) for
/// `engine` and `table`: what older migrations created. Tests and upgrade checks use it;
/// new tables get [`render`].
pub fn render_v1(engine: Engine, table: &TableName) -> Ddl {
    let up = match engine {
        Engine::Postgres => include_str!("../../templates/migrations/v1/postgres.up.sql"),
        Engine::Sqlite => include_str!("../../templates/migrations/v1/sqlite.up.sql"),
        Engine::Mysql => include_str!("../../templates/migrations/v1/mysql.up.sql"),
        Engine::SqlServer => include_str!("../../templates/migrations/v1/sqlserver.up.sql"),
    };
    Ddl {
        up: fill(up, engine, table),
        down: render(engine, table).down,
    }
}

/// Renders the upgrade of a version-1 table to version 2 for `engine` and `table`: `up`
/// adds the `Queue`, `Priority`, `UniqueKey`, `TraceParent` and `Snoozes` columns with
/// defaults that keep existing rows running (queue `default`, priority 0), replaces the
/// poll index with the claim-order one and adds the queue poll and unique-key indexes;
/// `down` drops them again and restores the version-1 poll index (rows survive; their
/// queue, priority and unique key are lost). `icq migrate add` writes it as
/// `<version>_icq_schema_v2.sql` next to a version-1 migration.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// use icq::{Engine, TableName};
///
/// let table = TableName::default();
/// let pool = sqlx::SqlitePool::connect(&url).await?;
/// let run = |sql: String| sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&pool);
/// run(icq::schema::render_v1(Engine::Sqlite, &table).up).await?; // an old table
/// run(r#"INSERT INTO "InternalCommands" ("Type", "Payload") VALUES ('t', '{}')"#.into()).await?;
///
/// let upgrade = icq::schema::render_upgrade(Engine::Sqlite, &table);
/// run(upgrade.up).await?;
/// let queue: String = sqlx::query_scalar(r#"SELECT "Queue" FROM "InternalCommands""#)
///     .fetch_one(&pool)
///     .await?;
/// assert_eq!(queue, "default"); // the old row runs on
/// run(upgrade.down).await?; // back to version 1, the row still there
/// # Ok(())
/// # }
/// ```
pub fn render_upgrade(engine: Engine, table: &TableName) -> Ddl {
    let (up, down) = match engine {
        Engine::Postgres => (
            include_str!("../../templates/migrations/upgrade_v2/postgres.up.sql"),
            include_str!("../../templates/migrations/upgrade_v2/postgres.down.sql"),
        ),
        Engine::Sqlite => (
            include_str!("../../templates/migrations/upgrade_v2/sqlite.up.sql"),
            include_str!("../../templates/migrations/upgrade_v2/sqlite.down.sql"),
        ),
        Engine::Mysql => (
            include_str!("../../templates/migrations/upgrade_v2/mysql.up.sql"),
            include_str!("../../templates/migrations/upgrade_v2/mysql.down.sql"),
        ),
        Engine::SqlServer => (
            include_str!("../../templates/migrations/upgrade_v2/sqlserver.up.sql"),
            include_str!("../../templates/migrations/upgrade_v2/sqlserver.down.sql"),
        ),
    };
    Ddl {
        up: fill(up, engine, table),
        down: fill(down, engine, table),
    }
}

/// Renders the DDL for `engine` and `table`. See [`Ddl`]'s example for applying it.
///
/// # Examples
///
/// ```
/// use icq::{Engine, TableName};
///
/// let table = TableName::parse("OrderCommands")?;
/// let ddl = icq::schema::render(Engine::Postgres, &table);
/// assert!(ddl.up.contains(r#"CREATE TABLE "OrderCommands""#));
/// assert!(ddl.up.contains(r#""IX_OrderCommands_Poll""#));
/// assert!(ddl.down.contains(r#"DROP TABLE IF EXISTS "OrderCommands""#), "{}", ddl.down);
/// # Ok::<(), icq::Error>(())
/// ```
pub fn render(engine: Engine, table: &TableName) -> Ddl {
    let (up, down) = match engine {
        Engine::Postgres => (
            include_str!("../../templates/migrations/postgres.up.sql"),
            include_str!("../../templates/migrations/postgres.down.sql"),
        ),
        Engine::Sqlite => (
            include_str!("../../templates/migrations/sqlite.up.sql"),
            include_str!("../../templates/migrations/sqlite.down.sql"),
        ),
        Engine::Mysql => (
            include_str!("../../templates/migrations/mysql.up.sql"),
            include_str!("../../templates/migrations/mysql.down.sql"),
        ),
        Engine::SqlServer => (
            include_str!("../../templates/migrations/sqlserver.up.sql"),
            include_str!("../../templates/migrations/sqlserver.down.sql"),
        ),
    };
    Ddl {
        up: fill(up, engine, table),
        down: fill(down, engine, table),
    }
}

fn fill(template: &str, engine: Engine, table: &TableName) -> String {
    let index = |suffix: &str| match engine {
        // SQLite names an index's schema on the index, not on the table it indexes.
        Engine::Sqlite => table.derived_qualified(engine, "IX_", suffix),
        _ => table.derived(engine, "IX_", suffix),
    };
    let qualified = |suffix: &str| table.derived_qualified(engine, "IX_", suffix);
    let default = |column: &str| table.derived(engine, "DF_", &format!("_{column}"));
    template
        .replace("{{table}}", &table.quoted(engine))
        .replace("{{ix_poll_qualified}}", &qualified("_Poll"))
        .replace("{{ix_queue_poll_qualified}}", &qualified("_QueuePoll"))
        .replace("{{ix_unique_key_qualified}}", &qualified("_UniqueKey"))
        .replace("{{df_queue}}", &default("Queue"))
        .replace("{{df_priority}}", &default("Priority"))
        .replace("{{df_snoozes}}", &default("Snoozes"))
        .replace("{{table_unqualified}}", &engine.quote_ident(table.name()))
        .replace("{{ix_poll}}", &index("_Poll"))
        .replace("{{ix_queue_poll}}", &index("_QueuePoll"))
        .replace("{{ix_unique_key}}", &index("_UniqueKey"))
        .replace("{{ix_retention}}", &index("_Retention"))
        .replace("{{ix_dead_letters}}", &index("_DeadLetters"))
        .replace("{{pk}}", &table.derived(engine, "PK_", ""))
        .replace("{{ck_payload}}", &table.derived(engine, "CK_", "_Payload"))
        .replace(
            "{{notify_function}}",
            &table.derived_qualified(engine, "icq_notify_", ""),
        )
        .replace(
            "{{notify_trigger}}",
            &table.derived(engine, "icq_notify_", ""),
        )
        .replace("{{channel}}", &notify_channel(table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled() {
        let table = TableName::parse("jobs.Queue").unwrap();
        for engine in Engine::ALL {
            let (ddl, upgrade, v1) = (
                render(engine, &table),
                render_upgrade(engine, &table),
                render_v1(engine, &table),
            );
            for sql in [&ddl.up, &ddl.down, &upgrade.up, &upgrade.down, &v1.up] {
                assert!(
                    !sql.contains("{{"),
                    "{engine}: unfilled placeholder in\n{sql}"
                );
                assert!(
                    sql.contains(&table.quoted(engine)),
                    "{engine}: table missing"
                );
            }
        }
    }

    #[test]
    fn sql_server_uses_brackets_and_filtered_indexes() {
        let ddl = render(Engine::SqlServer, &TableName::default());
        assert!(ddl.up.contains("CREATE TABLE [InternalCommands]"));
        assert!(
            ddl.up
                .contains("CONSTRAINT [PK_InternalCommands] PRIMARY KEY")
        );
        assert!(ddl.up.contains("CHECK (ISJSON([Payload]) = 1)"));
        assert!(ddl.up.contains(
            "CREATE INDEX [IX_InternalCommands_Poll] ON [InternalCommands] ([Priority], [RunAt]) INCLUDE"
        ));
        assert!(ddl.up.contains(
            "CREATE UNIQUE INDEX [IX_InternalCommands_UniqueKey] ON [InternalCommands] ([UniqueKey])"
        ));
        assert!(
            ddl.up
                .contains("CONSTRAINT [DF_InternalCommands_Queue] DEFAULT N'default'")
        );
        let upgrade = render_upgrade(Engine::SqlServer, &TableName::default());
        for sql in [&ddl.up, &ddl.down, &upgrade.up, &upgrade.down] {
            let code = sql.lines().filter(|l| !l.trim_start().starts_with("--"));
            assert!(
                code.into_iter()
                    .all(|l| !l.contains('"') && !l.contains('`')),
                "{sql}"
            );
        }
        assert!(upgrade.down.contains(
            "DROP CONSTRAINT IF EXISTS [DF_InternalCommands_Queue], [DF_InternalCommands_Priority]"
        ));
        assert!(
            ddl.down
                .contains("DROP TABLE IF EXISTS [InternalCommands];")
        );
    }
}
