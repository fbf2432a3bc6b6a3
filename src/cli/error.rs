//! The CLI's error: what only the `icq` binary can get wrong (its command line, its
//! configuration file, `--fail-on-dead`, `icq bench`) beside the library's [`icq::Error`],
//! the exit code and `--format json` kind each maps to, and the command-line hints (which
//! `icq` command to run) added to the library's messages when they are shown.

use std::path::{Path, PathBuf};

use icq::error::DatabaseErrorKind;

/// Result alias of the CLI's modules.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

/// Everything the `icq` binary reports: its own errors, and the library's.
#[derive(Debug)]
pub enum CliError {
    /// The command line is incomplete or contradicts itself: a missing or conflicting
    /// flag, a flag the configuration makes meaningless (exit code 2).
    Usage(String),

    /// A configuration file could not be read or parsed (exit code 2).
    Config {
        /// The file that holds the problem.
        path: PathBuf,
        /// What is wrong, including line and key where known.
        message: String,
    },

    /// A configuration file parsed but some of what it names cannot work (an exec
    /// program that is missing or not executable, ...): every problem, one per line
    /// (exit code 2).
    ConfigCheck {
        /// The file that was checked.
        path: PathBuf,
        /// One message per problem, each `line:col: key: what` where known.
        problems: Vec<String>,
    },

    /// `icq work --until-idle --fail-on-dead`: the run dead-lettered commands (exit code 1).
    DeadLettered {
        /// How many commands this run's processor dead-lettered.
        count: u64,
    },

    /// `icq doctor` found something that needs action (exit code 1).
    NeedsAction {
        /// How many findings need action.
        count: usize,
    },

    /// `icq bench` could not finish a measurement (its worker failed, a command did not
    /// complete, or the run was interrupted) (exit code 1).
    Bench(String),

    /// What the library reported, shown with the CLI's hints ([`message`]).
    Library(icq::Error),
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(text) | CliError::Bench(text) => f.write_str(text),
            CliError::Config { path, message } => f.write_str(&located(path, message)),
            CliError::ConfigCheck { path, problems } => f.write_str(&located_list(path, problems)),
            CliError::DeadLettered { count } => write!(
                f,
                "{count} {} dead-lettered during this run; see them with `icq dead-letters list`",
                if *count == 1 {
                    "command was"
                } else {
                    "commands were"
                }
            ),
            CliError::NeedsAction { count } => write!(
                f,
                "{count} {} action: see the findings above",
                if *count == 1 {
                    "finding needs"
                } else {
                    "findings need"
                }
            ),
            CliError::Library(err) => f.write_str(&message(err)),
        }
    }
}

/// A library error stands in for itself: its source is the library error's source (its
/// own text is already the message).
impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Library(err) => std::error::Error::source(err),
            _ => None,
        }
    }
}

impl From<icq::Error> for CliError {
    fn from(err: icq::Error) -> Self {
        CliError::Library(err)
    }
}

impl CliError {
    /// The exit code: 2 for what the caller can fix in the request or the configuration,
    /// 3 not found, 1 for run-time failures.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) | CliError::Config { .. } | CliError::ConfigCheck { .. } => 2,
            CliError::DeadLettered { .. } | CliError::NeedsAction { .. } | CliError::Bench(_) => 1,
            CliError::Library(err) => exit_code(err),
        }
    }

    /// The `kind` of the `--format json` error document.
    pub fn kind(&self) -> &'static str {
        match self {
            CliError::Usage(_) => "usage",
            CliError::Config { .. } | CliError::ConfigCheck { .. } => "config",
            CliError::DeadLettered { .. } => "dead_lettered",
            CliError::NeedsAction { .. } => "needs_action",
            CliError::Bench(_) => "bench",
            CliError::Library(err) => kind(err),
        }
    }
}

/// The exit code of a library error: 2 for what the caller can fix in the request, 3 not
/// found, 1 for run-time failures.
pub fn exit_code(err: &icq::Error) -> i32 {
    use icq::Error as E;
    match err {
        E::Invalid { .. }
        | E::Refused(_)
        | E::Ambiguous(_)
        | E::NeedsSchemaV2 { .. }
        | E::NeedsSchemaV4 { .. }
        | E::Unsupported(_)
        | E::EngineMismatch { .. } => 2,
        E::NotFound(_) => 3,
        _ => 1,
    }
}

/// The `--format json` kind of a library error: `usage` (every exit-2 request error),
/// `not_found`, `connection`, `database` (also [`icq::Error::CannotHeal`]),
/// `table_missing`, `migration`, `io`, `malformed_row`, `conflict`, `runtime`.
pub fn kind(err: &icq::Error) -> &'static str {
    use icq::Error as E;
    match err {
        E::Invalid { .. }
        | E::Refused(_)
        | E::Ambiguous(_)
        | E::NeedsSchemaV2 { .. }
        | E::NeedsSchemaV4 { .. }
        | E::Unsupported(_)
        | E::EngineMismatch { .. } => "usage",
        E::Conflict(_) => "conflict",
        E::NotFound(_) => "not_found",
        E::Connect { .. } => "connection",
        E::Database { .. } if err.is_connection_error() => "connection",
        E::Database { .. } | E::CannotHeal { .. } => "database",
        E::TableMissing { .. } => "table_missing",
        E::Migrate(_) => "migration",
        E::Io { .. } => "io",
        E::MalformedRow { .. } => "malformed_row",
        _ => "runtime",
    }
}

/// A library error's message as the CLI shows it: with the `icq` commands that fix a
/// missing table or an old schema.
pub fn message(err: &icq::Error) -> String {
    use icq::Error as E;
    match err {
        E::NeedsSchemaV2 { table, asked_for } => format!(
            "table {table} is schema version 1; queues, priorities and unique keys need version 2: \
             add the upgrade with `icq migrate add` (it writes <version>_icq_schema_v4.sql) and \
             apply it with `icq migrate run` (asked for: {asked_for}); nothing was changed"
        ),
        E::NeedsSchemaV4 {
            table,
            version,
            asked_for,
        } => format!(
            "table {table} is schema version {version}; {asked_for} needs version 4: add the \
             upgrade with `icq migrate add` (it writes <version>_icq_schema_v4.sql) and apply it \
             with `icq migrate run`; nothing was changed"
        ),
        E::TableMissing {
            source_name,
            table,
            engine,
            ..
        } => table_missing_message(err, source_name, table, engine),
        E::CannotHeal {
            source_name,
            cause,
            tries,
            seconds,
            hint,
        } => {
            let hint = match cause.database_kind() {
                Some(DatabaseErrorKind::UndefinedTable | DatabaseErrorKind::UndefinedColumn) => {
                    "the commands table (or a column icq needs) is missing: create or upgrade it \
                     with `icq migrate run` against this source's database, or fix `table:`"
                }
                _ => hint,
            };
            format!(
                "source `{source_name}`: {}; retrying cannot fix this (still failing after \
                 {tries} tries over {seconds:.1} s); hint: {hint}",
                message(cause)
            )
        }
        other => other.to_string(),
    }
}

/// The library's message of a [`icq::Error::TableMissing`] (`err`), then the `icq`
/// commands that create the table for this very table and source.
fn table_missing_message(err: &icq::Error, source: &str, table: &str, engine: &str) -> String {
    let create = format!(
        "`icq migrate add --engine {engine} --table {table}`, then apply it with \
         `icq migrate run --source {source}` against the same database (with the same \
         --database-url, if you gave one)"
    );
    match err {
        icq::Error::TableMissing {
            missing_schema: Some(_),
            ..
        } => format!("{err} with {create}"),
        _ => format!("{err}; create it with {create}"),
    }
}

/// `file:line:col: …` when the message starts with a position, `file: …` otherwise.
fn located(path: &Path, message: &str) -> String {
    if message.starts_with(|c: char| c.is_ascii_digit()) {
        format!("{}:{message}", path.display())
    } else {
        format!("{}: {message}", path.display())
    }
}

/// Every problem of a configuration check, each on its own line prefixed by the file.
fn located_list(path: &Path, problems: &[String]) -> String {
    let lines: Vec<String> = problems.iter().map(|p| located(path, p)).collect();
    format!(
        "{} problem{} found:\n{}",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" },
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_exit_codes_agree() {
        let cases = [
            (CliError::Usage("x".into()), "usage", 2),
            (icq::Error::NotFound("x".into()).into(), "not_found", 3),
            (icq::Error::invalid("x").into(), "usage", 2),
            (icq::Error::Refused("x".into()).into(), "usage", 2),
            (icq::Error::Ambiguous("x".into()).into(), "usage", 2),
            (icq::Error::needs_schema_v2(&"T", "x").into(), "usage", 2),
            (icq::Error::Unsupported("x".into()).into(), "usage", 2),
            (icq::Error::Conflict("x".into()).into(), "conflict", 1),
            (
                icq::Error::runtime("a source worker crashed")(std::io::Error::other("panic"))
                    .into(),
                "runtime",
                1,
            ),
            (
                CliError::Config {
                    path: "icq.yaml".into(),
                    message: "1:1: x".into(),
                },
                "config",
                2,
            ),
            (
                CliError::ConfigCheck {
                    path: "icq.yaml".into(),
                    problems: vec!["1:1: x".into()],
                },
                "config",
                2,
            ),
            (CliError::DeadLettered { count: 2 }, "dead_lettered", 1),
            (CliError::NeedsAction { count: 1 }, "needs_action", 1),
            (CliError::Bench("x".into()), "bench", 1),
            (
                icq::Error::Connect {
                    context: "c".into(),
                    reason: "r".into(),
                    hint: String::new(),
                }
                .into(),
                "connection",
                1,
            ),
            (
                icq::Error::db("c")(sqlx::Error::PoolTimedOut).into(),
                "connection",
                1,
            ),
            (
                icq::Error::db("c")(sqlx::Error::RowNotFound).into(),
                "database",
                1,
            ),
        ];
        for (err, kind, code) in cases {
            assert_eq!((err.kind(), err.exit_code()), (kind, code), "{err}");
        }
    }

    #[test]
    fn library_messages_get_the_cli_hints() {
        let old = CliError::from(icq::Error::needs_schema_v2(&"T", "a unique key")).to_string();
        assert!(old.contains("`icq migrate add`"), "{old}");
        let missing = icq::Error::TableMissing {
            source_name: "orders".into(),
            table: "Nope".into(),
            engine: "postgres",
            missing_schema: None,
        };
        let text = CliError::from(missing).to_string();
        assert!(
            text.contains("icq migrate add --engine postgres --table Nope")
                && text.contains("icq migrate run --source orders"),
            "{text}"
        );
        let schema = icq::Error::TableMissing {
            source_name: "orders".into(),
            table: "jobs.Nope".into(),
            engine: "postgres",
            missing_schema: Some("jobs".into()),
        };
        let text = CliError::from(schema).to_string();
        assert!(
            text.contains(r#"create the schema (`CREATE SCHEMA "jobs"`) and then the table with `icq migrate add --engine postgres --table jobs.Nope`"#),
            "{text}"
        );
    }

    #[test]
    fn dead_letter_counts_read_naturally() {
        assert!(
            CliError::DeadLettered { count: 1 }
                .to_string()
                .starts_with("1 command was dead-lettered")
        );
        assert!(
            CliError::DeadLettered { count: 3 }
                .to_string()
                .starts_with("3 commands were dead-lettered")
        );
    }
}
