//! Engines and identifiers: which SQL dialect a URL speaks, and the one place that quotes
//! table and index names for it.
//!
//! Table names come from configuration, so they are validated here as plain identifiers
//! (letters, digits, `_`, optionally `schema.table`) and then quoted; nothing else is ever
//! spliced into SQL text.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The default table name from the product contract.
///
/// # Examples
///
/// ```
/// use icq::TableName;
/// use icq::ident::DEFAULT_TABLE;
///
/// assert_eq!(TableName::default().to_string(), DEFAULT_TABLE);
/// assert_eq!(DEFAULT_TABLE, "InternalCommands");
/// ```
pub const DEFAULT_TABLE: &str = "InternalCommands";

/// The newest version of the table's layout (see [`crate::schema::SCHEMA_VERSION`]).
pub(crate) const SCHEMA_VERSION: u32 = 4;

pub use crate::kind::Engine;

impl Engine {
    /// Infers the engine from a database URL's scheme.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Engine;
    ///
    /// assert_eq!(Engine::from_url("postgresql://app@localhost/shop")?, Engine::Postgres);
    /// assert_eq!(Engine::from_url("sqlite:shop.db")?, Engine::Sqlite);
    /// assert!(Engine::from_url("redis://localhost").is_err());
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Engine> {
        let scheme = url
            .split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        match scheme.as_str() {
            "postgres" | "postgresql" => Ok(Engine::Postgres),
            "sqlite" => Ok(Engine::Sqlite),
            "mysql" | "mariadb" => Ok(Engine::Mysql),
            "sqlserver" | "mssql" => Ok(Engine::SqlServer),
            _ => Err(Error::invalid(format!(
                "cannot tell the database engine from URL scheme `{scheme}:`; use postgres://, \
                 postgresql://, sqlite:, mysql:// or mariadb://"
            ))),
        }
    }
}

impl FromStr for Engine {
    type Err = Error;

    fn from_str(s: &str) -> Result<Engine> {
        match s.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" | "pg" => Ok(Engine::Postgres),
            "sqlite" => Ok(Engine::Sqlite),
            "mysql" | "mariadb" => Ok(Engine::Mysql),
            "sqlserver" | "mssql" => Ok(Engine::SqlServer),
            other => Err(Error::invalid(format!(
                "unknown engine `{other}`; choose one of postgres, sqlite, mysql, sqlserver"
            ))),
        }
    }
}

/// A validated, optionally schema-qualified table name.
///
/// # Examples
///
/// ```
/// use icq::{Engine, TableName};
///
/// let table: TableName = "jobs.InternalCommands".parse()?;
/// assert_eq!((table.schema(), table.name()), (Some("jobs"), "InternalCommands"));
/// assert_eq!(table.to_string(), "jobs.InternalCommands");
/// assert_eq!(table.quoted(Engine::Postgres), r#""jobs"."InternalCommands""#);
/// assert_eq!(TableName::default().name(), "InternalCommands");
/// # Ok::<(), icq::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    /// The PostgreSQL NOTIFY channel of inserts into this table (see
    /// [`crate::schema::notify_channel`]).
    pub(crate) fn notify_channel(&self) -> String {
        format!("icq_{}", self.name())
    }

    /// The PostgreSQL NOTIFY channel of operator cancels on this table (see
    /// [`crate::schema::cancel_channel`]).
    pub(crate) fn cancel_channel(&self) -> String {
        format!("icq_cancel_{}", self.name())
    }

    /// The history table of a commands table (schema version 3): `<name>History` in the
    /// same schema, where completed commands move. Table names are at most 50 characters,
    /// so the history's name (57 at most) and its index's (`IX_<name>_History`, 61) stay
    /// within every engine's identifier limit (PostgreSQL's 63 bytes is the smallest).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{Engine, TableName};
    ///
    /// let orders = TableName::parse("app.Orders")?;
    /// assert_eq!(orders.history().to_string(), "app.OrdersHistory");
    /// assert_eq!(TableName::default().history().quoted(Engine::Postgres), r#""InternalCommandsHistory""#);
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn history(&self) -> TableName {
        self.with_suffix(HISTORY_SUFFIX)
    }

    /// The queue-state table of a commands table (schema version 4): `<name>Queues` in the
    /// same schema, one row per queue paused or rate-limited fleet-wide.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::TableName;
    ///
    /// assert_eq!(TableName::parse("app.Orders")?.queues().to_string(), "app.OrdersQueues");
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn queues(&self) -> TableName {
        self.with_suffix("Queues")
    }

    /// The schedule bookkeeping table of a commands table (schema version 4):
    /// `<name>Schedules` in the same schema, one row per recurring schedule with the latest
    /// occurrence scheduled.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::TableName;
    ///
    /// assert_eq!(TableName::parse("Orders")?.schedules().to_string(), "OrdersSchedules");
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn schedules(&self) -> TableName {
        self.with_suffix("Schedules")
    }

    fn with_suffix(&self, suffix: &str) -> TableName {
        TableName {
            schema: self.schema.clone(),
            name: format!("{}{suffix}", self.name),
        }
    }

    /// Parses `name` or `schema.name`; each part must be a plain identifier (a letter or
    /// `_`, then letters, digits and `_`, at most 50 characters), so a configured name can
    /// never smuggle SQL in.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::TableName;
    ///
    /// assert_eq!(TableName::parse("OrderCommands")?.schema(), None);
    /// for bad in ["a;drop", "a b", "a.b.c", "1abc", ""] {
    ///     assert!(TableName::parse(bad).is_err(), "{bad} accepted");
    /// }
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn parse(raw: &str) -> Result<TableName> {
        let parts: Vec<&str> = raw.split('.').collect();
        let (schema, name) = match parts.as_slice() {
            [name] => (None, *name),
            [schema, name] => (Some(*schema), *name),
            _ => {
                return Err(Error::invalid(format!(
                    "invalid table name `{raw}`: use `Name` or `schema.Name`"
                )));
            }
        };
        for part in schema.iter().chain(std::iter::once(&name)) {
            validate_ident(part, raw)?;
        }
        Ok(TableName {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
        })
    }

    /// The unqualified table name (used to derive index and trigger names). See
    /// [`TableName`]'s example.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The schema, if the name was qualified. See [`TableName`]'s example.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table name quoted for `engine`, schema-qualified when a schema was given.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{Engine, TableName};
    ///
    /// let table = TableName::parse("jobs.InternalCommands")?;
    /// assert_eq!(table.quoted(Engine::Mysql), "`jobs`.`InternalCommands`");
    /// assert_eq!(TableName::default().quoted(Engine::Sqlite), r#""InternalCommands""#);
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn quoted(&self, engine: Engine) -> String {
        match &self.schema {
            Some(schema) => format!(
                "{}.{}",
                engine.quote_ident(schema),
                engine.quote_ident(&self.name)
            ),
            None => engine.quote_ident(&self.name),
        }
    }

    /// A name derived from the table (`IX_<table>_Poll`), quoted for `engine`.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{Engine, TableName};
    ///
    /// let table = TableName::parse("jobs.InternalCommands")?;
    /// let index = table.derived(Engine::Postgres, "IX_", "_Poll");
    /// assert_eq!(index, r#""IX_InternalCommands_Poll""#); // no schema: indexes live beside it
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn derived(&self, engine: Engine, prefix: &str, suffix: &str) -> String {
        engine.quote_ident(&format!("{prefix}{}{suffix}", self.name))
    }

    /// A derived name qualified by the table's schema (for objects living beside it).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{Engine, TableName};
    ///
    /// let table = TableName::parse("jobs.InternalCommands")?;
    /// let function = table.derived_qualified(Engine::Postgres, "icq_notify_", "");
    /// assert_eq!(function, r#""jobs"."icq_notify_InternalCommands""#);
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn derived_qualified(&self, engine: Engine, prefix: &str, suffix: &str) -> String {
        let derived = self.derived(engine, prefix, suffix);
        match &self.schema {
            Some(schema) => format!("{}.{derived}", engine.quote_ident(schema)),
            None => derived,
        }
    }
}

impl Default for TableName {
    fn default() -> Self {
        TableName {
            schema: None,
            name: DEFAULT_TABLE.to_owned(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl FromStr for TableName {
    type Err = Error;
    fn from_str(s: &str) -> Result<TableName> {
        TableName::parse(s)
    }
}

/// What [`TableName::history`] appends to the table's name.
const HISTORY_SUFFIX: &str = "History";

/// The longest table name part: with [`HISTORY_SUFFIX`] or `Schedules` and the longest
/// index name (`IX_…_OrderKey`) around it, still within PostgreSQL's 63-byte identifiers.
const MAX_IDENT: usize = 50;

fn validate_ident(part: &str, whole: &str) -> Result<()> {
    let mut chars = part.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !starts_well
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        || part.len() > MAX_IDENT
    {
        return Err(Error::invalid(format!(
            "invalid table name `{whole}`: each part must start with a letter or `_`, contain \
             only letters, digits and `_`, and be at most 50 characters"
        )));
    }
    Ok(())
}

impl Error {
    /// [`Error::TableMissing`] for `table`, whose schema does not exist (`source_name`
    /// is filled in by [`Error::in_source`]). It lives here, by the table name, so that
    /// the error module depends on nothing above it.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{Engine, Error, TableName};
    ///
    /// let table = TableName::parse("jobs.InternalCommands")?;
    /// let err = Error::schema_missing(&table, Engine::Postgres).in_source("orders");
    /// assert!(matches!(&err, Error::TableMissing { missing_schema: Some(s), .. } if s == "jobs"));
    /// assert!(err.to_string().contains(r#"`CREATE SCHEMA "jobs"`"#), "{err}");
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn schema_missing(table: &TableName, engine: Engine) -> Error {
        Error::TableMissing {
            source_name: String::new(),
            table: table.to_string(),
            engine: engine.name(),
            missing_schema: table.schema().map(str::to_owned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_each_engine_its_own_way() {
        let t = TableName::parse("jobs.InternalCommands").unwrap();
        assert_eq!(t.quoted(Engine::Postgres), r#""jobs"."InternalCommands""#);
        assert_eq!(t.quoted(Engine::Mysql), "`jobs`.`InternalCommands`");
        assert_eq!(t.quoted(Engine::SqlServer), "[jobs].[InternalCommands]");
        assert_eq!(
            t.derived(Engine::Postgres, "IX_", "_Poll"),
            r#""IX_InternalCommands_Poll""#
        );
    }

    #[test]
    fn the_longest_name_s_history_and_its_index_fit_postgres_identifiers() {
        let longest = TableName::parse(&format!("s.{}", "a".repeat(MAX_IDENT))).unwrap();
        let history = longest.history();
        assert_eq!(history.schema(), Some("s"));
        assert!(history.name().len() <= 63, "{history}");
        assert!(format!("IX_{}_History", longest.name()).len() <= 63);
        assert!(TableName::parse(&format!("{}History", "a".repeat(MAX_IDENT - 6))).is_err());
    }

    #[test]
    fn rejects_injection_attempts() {
        for bad in ["a;drop", "a b", "\"x\"", "a.b.c", "", "1abc", "a-b"] {
            assert!(TableName::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn engine_from_url_scheme() {
        assert_eq!(
            Engine::from_url("postgresql://x@h/db").unwrap(),
            Engine::Postgres
        );
        assert_eq!(Engine::from_url("sqlite:foo.db").unwrap(), Engine::Sqlite);
        assert_eq!(Engine::from_url("mariadb://h/db").unwrap(), Engine::Mysql);
        assert!(Engine::from_url("redis://h").is_err());
    }
}
