//! Per-engine DDL for the commands table, rendered from `templates/migrations/`.
//!
//! The templates are compiled into the binary; every name spliced into them is a
//! validated [`TableName`] quoted by [`Engine::quote_ident`].

use crate::ident::{Engine, TableName};

/// The up and down SQL for one engine and table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ddl {
    /// Creates the table, its indexes and (PostgreSQL) the notify trigger.
    pub up: String,
    /// Removes everything `up` created.
    pub down: String,
}

/// The NOTIFY channel the PostgreSQL trigger signals for `table`.
pub fn notify_channel(table: &TableName) -> String {
    format!("icq_{}", table.name())
}

/// Renders the DDL for `engine` and `table`.
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
        Engine::SqlServer => ("-- TODO sqlserver\n", "-- TODO sqlserver\n"),
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
    template
        .replace("{{table}}", &table.quoted(engine))
        .replace("{{table_unqualified}}", &engine.quote_ident(table.name()))
        .replace("{{ix_poll}}", &index("_Poll"))
        .replace("{{ix_retention}}", &index("_Retention"))
        .replace("{{ix_dead_letters}}", &index("_DeadLetters"))
        .replace(
            "{{notify_function}}",
            &table.derived_qualified(engine, "icq_notify_", ""),
        )
        .replace("{{notify_trigger}}", &table.derived(engine, "icq_notify_", ""))
        .replace("{{channel}}", &notify_channel(table))
}
