//! Which database engine: the one type every layer names, errors included. It holds no
//! behaviour that can fail, so it depends on nothing; parsing an engine from text or a URL
//! (which can) lives with the other identifiers in [`crate::ident`].

use std::fmt;

/// A database engine icq knows how to speak to.
///
/// # Examples
///
/// ```
/// use icq::Engine;
///
/// let engine: Engine = "pg".parse()?;
/// assert_eq!(engine, Engine::Postgres);
/// assert_eq!(engine.to_string(), "postgres");
/// assert_eq!(Engine::from_url("mariadb://db.internal/shop")?, Engine::Mysql);
/// assert!("oracle".parse::<Engine>().is_err());
/// # Ok::<(), icq::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// PostgreSQL 13 or newer.
    Postgres,
    /// SQLite 3.35 or newer (the embedded default).
    Sqlite,
    /// MySQL 8 or MariaDB 10.6 and newer.
    Mysql,
    /// SQL Server (migrations only).
    SqlServer,
}

impl Engine {
    /// Every engine, in the order they are listed to users.
    ///
    /// # Examples
    ///
    /// ```
    /// let names: Vec<&str> = icq::Engine::ALL.iter().map(|e| e.name()).collect();
    /// assert_eq!(names, ["postgres", "sqlite", "mysql", "sqlserver"]);
    /// ```
    pub const ALL: [Engine; 4] = [
        Engine::Postgres,
        Engine::Sqlite,
        Engine::Mysql,
        Engine::SqlServer,
    ];

    /// The name used on the command line and in file names (also its `Display` form).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(icq::Engine::Mysql.name(), "mysql");
    /// assert_eq!(icq::Engine::SqlServer.to_string(), "sqlserver");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Engine::Postgres => "postgres",
            Engine::Sqlite => "sqlite",
            Engine::Mysql => "mysql",
            Engine::SqlServer => "sqlserver",
        }
    }

    /// The Cargo feature of `icq-queue` that builds this engine's driver (`None` for SQL
    /// Server, which icq writes migrations for but has no driver of).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Engine;
    ///
    /// assert_eq!(Engine::Postgres.feature(), Some("postgres"));
    /// assert_eq!(Engine::Mysql.feature(), Some("mysql")); // MySQL and MariaDB
    /// assert_eq!(Engine::SqlServer.feature(), None);
    /// ```
    pub fn feature(self) -> Option<&'static str> {
        match self {
            Engine::Postgres => Some("postgres"),
            Engine::Sqlite => Some("sqlite"),
            Engine::Mysql => Some("mysql"),
            Engine::SqlServer => None,
        }
    }

    /// Whether this build of icq has the engine's driver (its [`Engine::feature`] is
    /// enabled). A URL of an engine that is not built is refused with
    /// [`crate::Error::Unsupported`] naming the feature ([`crate::Error::engine_not_built`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Engine;
    ///
    /// // The default features build all three.
    /// assert!(Engine::Postgres.is_built() && Engine::Sqlite.is_built() && Engine::Mysql.is_built());
    /// assert!(!Engine::SqlServer.is_built());
    /// ```
    pub fn is_built(self) -> bool {
        match self {
            Engine::Postgres => cfg!(feature = "postgres"),
            Engine::Sqlite => cfg!(feature = "sqlite"),
            Engine::Mysql => cfg!(feature = "mysql"),
            Engine::SqlServer => false,
        }
    }

    /// The engine's name in prose: `PostgreSQL`, `SQLite`, `MySQL/MariaDB`, `SQL Server`.
    pub(crate) fn prose(self) -> &'static str {
        match self {
            Engine::Postgres => "PostgreSQL",
            Engine::Sqlite => "SQLite",
            Engine::Mysql => "MySQL/MariaDB",
            Engine::SqlServer => "SQL Server",
        }
    }

    /// Quotes one identifier the engine's way, doubling any embedded quote character.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Engine;
    ///
    /// assert_eq!(Engine::Postgres.quote_ident("Run\"At"), r#""Run""At""#);
    /// assert_eq!(Engine::Mysql.quote_ident("RunAt"), "`RunAt`");
    /// assert_eq!(Engine::SqlServer.quote_ident("RunAt"), "[RunAt]");
    /// ```
    pub fn quote_ident(self, ident: &str) -> String {
        match self {
            Engine::Postgres | Engine::Sqlite => format!("\"{}\"", ident.replace('"', "\"\"")),
            Engine::Mysql => format!("`{}`", ident.replace('`', "``")),
            Engine::SqlServer => format!("[{}]", ident.replace(']', "]]")),
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
