//! Per-engine DDL for the commands table, rendered from `templates/migrations/`.
//!
//! The templates are compiled into the binary; every name spliced into them is a
//! validated [`TableName`] quoted by [`Engine::quote_ident`], so configuration can never
//! inject SQL. The column shapes are the product contract that the processor and
//! any foreign writer rely on; the five indexes are `IX_<table>_Poll`,
//! `IX_<table>_QueuePoll`, `IX_<table>_UniqueKey`, `IX_<table>_Retention` and
//! `IX_<table>_DeadLetters`, partial (filtered) wherever the engine allows. Schema version
//! 3 adds the history table `<table>History` ([`TableName::history`]) with the same
//! columns and one index, `IX_<table>_History`: completed commands move there. Version 4
//! adds the `ConcurrencyKey`, `OrderKey` and `Errors` columns (to both), the indexes
//! `IX_<table>_OrderKey` and `IX_<table>_ConcKey`, and the fleet's shared state:
//! `<table>Queues` (pauses, rate buckets) and `<table>Schedules` (recurring schedules).
//! On MySQL/MariaDB it drops `IX_<table>_Retention` and `IX_<table>_DeadLetters`: without
//! partial indexes every index holds an entry for every row, which each completion's move
//! to history deletes, and the poll index, which leads with `ProcessedAt` and
//! `DeadLetteredAt`, serves the sweep and the dead-letter view.
//!
//! The renderings: [`render`] creates the current table (schema version 4),
//! [`render_upgrade`] takes a version-1 table to version 2 and back,
//! [`render_upgrade_v3`] a version-2 table to version 3 and back,
//! [`render_upgrade_v4`] a version-3 table to version 4 and back,
//! [`render_upgrade_from`] any older version to the current one, and [`render_v1`] is the
//! original table (what older `icq migrate add` wrote).
//!
//! From Rust, [`apply`] brings a table on the application's pool to the current version:
//! it creates a missing table, upgrades an older one and leaves a current one alone.
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
    /// The table was at an older version and was upgraded to [`SCHEMA_VERSION`]
    /// ([`render_upgrade_from`]), every row kept.
    Upgraded,
    /// The table was at [`SCHEMA_VERSION`] already: nothing was run.
    UpToDate,
}

/// Creates `table` on the application's `pool`, or upgrades it, to [`SCHEMA_VERSION`]:
/// a missing table is created ([`render`]'s `up`: the table, its indexes and, on
/// PostgreSQL, the notify trigger), an older table is upgraded in place
/// ([`render_upgrade_from`]'s `up`: its rows keep running, its completed ones move to
/// history) and a current one is left alone,
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
    } else if let version @ ..SCHEMA_VERSION = backend.schema_version().await? {
        (
            SchemaChange::Upgraded,
            render_upgrade_from(engine, table, version).up,
        )
    } else {
        return Ok(SchemaChange::UpToDate);
    };
    match backend.schema_apply(&ddl).await {
        Ok(()) => Ok(change),
        // Another process applied it meanwhile: its DDL won, this one failed on what it
        // had created. The table is there, at the current version once the winner's
        // script is through (MariaDB's DDL is not transactional: a loser can see it
        // half-way).
        Err(err) => {
            for _ in 0..RACE_LOOKS {
                backend.forget_schema_version();
                if backend.table_exists().await.unwrap_or(false)
                    && backend.schema_version().await.ok() == Some(SCHEMA_VERSION)
                {
                    return Ok(SchemaChange::UpToDate);
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(err)
        }
    }
}

/// How many times (100 ms apart) a replica whose DDL lost the race looks for the winner's
/// table at the current version before it reports its own error.
const RACE_LOOKS: u32 = 100;

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

/// The schema version [`render`] creates: 4 (order and concurrency keys, every attempt's
/// error, queue state and schedule bookkeeping tables). Version 1 is the original table;
/// version 2 added queues, priorities, unique keys and trace context; version 3 moved
/// completed commands to a history table.
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
/// queue, priority and unique key are lost). `icq migrate add` writes it, followed by
/// the later steps, as `<version>_icq_schema_v4.sql` next to a version-1 migration
/// ([`render_upgrade_from`]).
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

/// Renders the upgrade of a version-2 table to version 3 for `engine` and `table`: `up`
/// creates the history table `<table>History` and moves every completed row into it (on
/// PostgreSQL it also sets the commands table's autovacuum thresholds); `down` moves every
/// history row back (completed, as it was) and drops the history table. `icq migrate add`
/// writes it, followed by [`render_upgrade_v4`], as `<version>_icq_schema_v4.sql` next to
/// a version-2 migration.
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
/// run(icq::schema::render_v1(Engine::Sqlite, &table).up).await?;
/// run(icq::schema::render_upgrade(Engine::Sqlite, &table).up).await?; // version 2
/// run(r#"INSERT INTO "InternalCommands" ("Type", "Payload", "ProcessedAt")
///        VALUES ('t', '{}', '2030-01-01T00:00:00.000Z')"#.into()).await?;
///
/// run(icq::schema::render_upgrade_v3(Engine::Sqlite, &table).up).await?;
/// let moved: i64 = sqlx::query_scalar(r#"SELECT count(*) FROM "InternalCommandsHistory""#)
///     .fetch_one(&pool)
///     .await?;
/// assert_eq!(moved, 1); // the completed row is history now
/// # Ok(())
/// # }
/// ```
pub fn render_upgrade_v3(engine: Engine, table: &TableName) -> Ddl {
    let (up, down) = match engine {
        Engine::Postgres => (
            include_str!("../../templates/migrations/upgrade_v3/postgres.up.sql"),
            include_str!("../../templates/migrations/upgrade_v3/postgres.down.sql"),
        ),
        Engine::Sqlite => (
            include_str!("../../templates/migrations/upgrade_v3/sqlite.up.sql"),
            include_str!("../../templates/migrations/upgrade_v3/sqlite.down.sql"),
        ),
        Engine::Mysql => (
            include_str!("../../templates/migrations/upgrade_v3/mysql.up.sql"),
            include_str!("../../templates/migrations/upgrade_v3/mysql.down.sql"),
        ),
        Engine::SqlServer => (
            include_str!("../../templates/migrations/upgrade_v3/sqlserver.up.sql"),
            include_str!("../../templates/migrations/upgrade_v3/sqlserver.down.sql"),
        ),
    };
    Ddl {
        up: fill(up, engine, table),
        down: fill(down, engine, table),
    }
}

/// Renders the upgrade of a version-3 table to version 4 for `engine` and `table`: `up`
/// adds the `ConcurrencyKey`, `OrderKey` and `Errors` columns to the table and its history
/// (NULL in every existing row, which runs on unchanged), the order-key and
/// concurrency-key indexes, and the `<table>Queues` ([`TableName::queues`]) and
/// `<table>Schedules` ([`TableName::schedules`]) tables; `down` drops them again (every
/// row kept). `icq migrate add` writes it as `<version>_icq_schema_v4.sql` next to a
/// version-3 migration.
///
/// # Examples
///
/// ```
/// use icq::{Engine, TableName};
///
/// let v4 = icq::schema::render_upgrade_v4(Engine::Postgres, &TableName::default());
/// assert!(v4.up.contains(r#"ADD COLUMN "OrderKey""#));
/// assert!(v4.up.contains(r#"CREATE TABLE "InternalCommandsQueues""#));
/// assert!(v4.down.contains(r#"DROP TABLE IF EXISTS "InternalCommandsSchedules""#));
/// ```
pub fn render_upgrade_v4(engine: Engine, table: &TableName) -> Ddl {
    let (up, down) = match engine {
        Engine::Postgres => (
            include_str!("../../templates/migrations/upgrade_v4/postgres.up.sql"),
            include_str!("../../templates/migrations/upgrade_v4/postgres.down.sql"),
        ),
        Engine::Sqlite => (
            include_str!("../../templates/migrations/upgrade_v4/sqlite.up.sql"),
            include_str!("../../templates/migrations/upgrade_v4/sqlite.down.sql"),
        ),
        Engine::Mysql => (
            include_str!("../../templates/migrations/upgrade_v4/mysql.up.sql"),
            include_str!("../../templates/migrations/upgrade_v4/mysql.down.sql"),
        ),
        Engine::SqlServer => (
            include_str!("../../templates/migrations/upgrade_v4/sqlserver.up.sql"),
            include_str!("../../templates/migrations/upgrade_v4/sqlserver.down.sql"),
        ),
    };
    Ddl {
        up: fill(up, engine, table),
        down: fill(down, engine, table),
    }
}

/// Renders the upgrade of a table at schema version `from` (1, 2 or 3) to the current
/// version, in one script each way: the steps of each version in order (`up`), and their
/// downs in reverse order (`down`, back to `from`). From the current version (or a
/// newer one) both are empty.
///
/// # Examples
///
/// ```
/// use icq::{Engine, TableName};
///
/// let table = TableName::default();
/// let from_v1 = icq::schema::render_upgrade_from(Engine::Postgres, &table, 1);
/// assert!(from_v1.up.contains(r#"ADD COLUMN "Queue""#));
/// assert!(from_v1.up.contains(r#"CREATE TABLE "InternalCommandsHistory""#));
/// let from_v2 = icq::schema::render_upgrade_from(Engine::Postgres, &table, 2);
/// assert!(!from_v2.up.contains(r#"ADD COLUMN "Queue""#));
/// assert!(from_v2.up.contains(r#"ADD COLUMN "OrderKey""#));
/// assert!(icq::schema::render_upgrade_from(Engine::Postgres, &table, 4).up.is_empty());
/// ```
pub fn render_upgrade_from(engine: Engine, table: &TableName, from: u32) -> Ddl {
    let steps: Vec<Ddl> = [
        (1, render_upgrade as fn(Engine, &TableName) -> Ddl),
        (2, render_upgrade_v3),
        (3, render_upgrade_v4),
    ]
    .into_iter()
    .filter(|(version, _)| *version >= from)
    .map(|(_, step)| step(engine, table))
    .collect();
    Ddl {
        up: steps
            .iter()
            .map(|s| s.up.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        down: steps
            .iter()
            .rev()
            .map(|s| s.down.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
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

/// The history table's DDL for `engine` (schema version 3), spliced into the creating and
/// upgrading templates at `{{history_table}}`.
fn history_table(engine: Engine) -> &'static str {
    match engine {
        Engine::Postgres => include_str!("../../templates/migrations/history/postgres.up.sql"),
        Engine::Sqlite => include_str!("../../templates/migrations/history/sqlite.up.sql"),
        Engine::Mysql => include_str!("../../templates/migrations/history/mysql.up.sql"),
        Engine::SqlServer => include_str!("../../templates/migrations/history/sqlserver.up.sql"),
    }
}

/// The version-4 additions for `engine` (the key and `Errors` columns on the table and
/// its history, their indexes, the queue-state and schedule tables): the upgrade from
/// version 3, and the tail of a new table's script, so both leave the same columns in the
/// same order.
fn v4_body(engine: Engine) -> &'static str {
    match engine {
        Engine::Postgres => include_str!("../../templates/migrations/v4/postgres.sql"),
        Engine::Sqlite => include_str!("../../templates/migrations/v4/sqlite.sql"),
        Engine::Mysql => include_str!("../../templates/migrations/v4/mysql.sql"),
        Engine::SqlServer => include_str!("../../templates/migrations/v4/sqlserver.sql"),
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
    let history = table.history();
    template
        .replace("{{history_table}}", history_table(engine))
        .replace("{{v4}}", v4_body(engine))
        .replace("{{queues}}", &table.queues().quoted(engine))
        .replace("{{schedules}}", &table.schedules().quoted(engine))
        .replace("{{pk_queues}}", &table.queues().derived(engine, "PK_", ""))
        .replace(
            "{{pk_schedules}}",
            &table.schedules().derived(engine, "PK_", ""),
        )
        .replace("{{df_paused}}", &default("Queues_Paused"))
        .replace("{{df_queues_updated}}", &default("Queues_UpdatedAt"))
        .replace("{{df_schedules_updated}}", &default("Schedules_UpdatedAt"))
        .replace("{{ix_order_key_qualified}}", &qualified("_OrderKey"))
        .replace("{{ix_concurrency_key_qualified}}", &qualified("_ConcKey"))
        .replace("{{ix_order_key}}", &index("_OrderKey"))
        .replace("{{ix_concurrency_key}}", &index("_ConcKey"))
        .replace("{{history}}", &history.quoted(engine))
        .replace(
            "{{history_unqualified}}",
            &engine.quote_ident(history.name()),
        )
        .replace("{{ix_history}}", &index("_History"))
        .replace("{{pk_history}}", &history.derived(engine, "PK_", ""))
        // The version-3 steps move version-3 rows (a version-4 table is taken back to 3
        // before its history moves back).
        .replace("{{columns}}", &crate::engine::column_list(engine, "", 3))
        .replace(
            "{{deleted_columns}}",
            &crate::engine::column_list(engine, "deleted.", 3),
        )
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
            let v3 = render_upgrade_v3(engine, &table);
            let v4 = render_upgrade_v4(engine, &table);
            for sql in [
                &ddl.up,
                &ddl.down,
                &upgrade.up,
                &upgrade.down,
                &v1.up,
                &v3.up,
                &v3.down,
                &v4.up,
                &v4.down,
            ] {
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
        assert!(ddl.up.contains("CREATE TABLE [InternalCommandsHistory]"));
        assert!(ddl.up.contains(
            "CREATE INDEX [IX_InternalCommands_History] ON [InternalCommandsHistory] ([ProcessedAt], [Id])"
        ));
        let upgrade = render_upgrade(Engine::SqlServer, &TableName::default());
        let v3 = render_upgrade_v3(Engine::SqlServer, &TableName::default());
        assert!(
            v3.up.contains("OUTPUT deleted.[Id], deleted.[Type]"),
            "{}",
            v3.up
        );
        for sql in [
            &ddl.up,
            &ddl.down,
            &upgrade.up,
            &upgrade.down,
            &v3.up,
            &v3.down,
        ] {
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
