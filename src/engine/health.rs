//! What a source's database says about its own health, as facts each engine reads in its
//! folder (`postgres/doctor.rs`, `mysql/doctor.rs`, `sqlite/doctor.rs`): the table's size
//! and dead versions, the sessions holding back their cleanup, and how long the oldest
//! due command has waited. Judging the facts (which need action, and what to do) is
//! [`crate::admin::doctor`]'s, the same for every engine.
//!
//! Every read here is of catalogues and statistics views, plus one seek into the poll
//! order for the oldest due command: cheap enough to sample every few seconds, and never
//! on a claim's connection. A figure an engine cannot see (another process's transactions
//! on SQLite, the history list length with its metric off) is `None` and the report says
//! why in its notes; nothing is invented.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Serialize, Serializer};

use crate::error::Result;

/// Longest query text a report keeps of a session (characters), before literals are
/// masked: enough to recognise the statement, never a whole payload.
pub const QUERY_HEAD_CHARS: usize = 200;

/// The size and cleanup state of one table (the commands table, or its history table).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct TableStats {
    /// The table's name, as configured (`schema.Name` when qualified).
    pub table: String,
    /// Everything the table takes on disk: rows, indexes and (PostgreSQL) TOAST.
    pub total_bytes: u64,
    /// The rows alone (the heap on PostgreSQL, the clustered index on InnoDB, the
    /// table's b-tree on SQLite).
    pub table_bytes: u64,
    /// The indexes.
    pub index_bytes: u64,
    /// Estimated live rows (statistics, not a count), where the engine keeps them.
    pub live_rows: Option<u64>,
    /// Estimated dead row versions not yet removed (PostgreSQL's `n_dead_tup`).
    pub dead_rows: Option<u64>,
    /// Space allocated to the table but free for reuse (InnoDB's `DATA_FREE`; on
    /// SQLite the whole file's free pages).
    pub free_bytes: Option<u64>,
    /// When the table was last vacuumed by hand (PostgreSQL).
    pub last_vacuum: Option<DateTime<Utc>>,
    /// When autovacuum last vacuumed it (PostgreSQL).
    pub last_autovacuum: Option<DateTime<Utc>>,
    /// The table's own storage settings (PostgreSQL `reloptions`: autovacuum thresholds,
    /// fillfactor), as `name=value, ...`; `None` when it has none (the server's defaults).
    pub storage_settings: Option<String>,
}

/// What kind of holder a [`Session`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionKind {
    /// A client connection (a PostgreSQL backend, a MariaDB/MySQL thread).
    Connection,
    /// A prepared (two-phase) transaction: no connection holds it, only
    /// `COMMIT PREPARED` / `ROLLBACK PREPARED` ends it.
    PreparedTransaction,
    /// A replication slot holding the xmin horizon for a standby or a consumer.
    ReplicationSlot,
}

/// A session (or prepared transaction, or replication slot) with an open transaction.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Session {
    /// What holds the transaction.
    pub kind: SessionKind,
    /// The backend pid (PostgreSQL) or thread id (MariaDB/MySQL) of a connection.
    pub pid: Option<i64>,
    /// The prepared transaction's gid, or the replication slot's name.
    pub name: Option<String>,
    /// `active`, `idle in transaction`, `idle in transaction (aborted)`, ... (PostgreSQL's
    /// `state`; on MariaDB/MySQL `idle in transaction` for a sleeping thread with an open
    /// transaction, else the transaction's state in lower case); `inactive`/`active`
    /// for a replication slot.
    pub state: Option<String>,
    /// How long its transaction has been open (`None` for a replication slot).
    #[serde(rename = "transaction_age_seconds", serialize_with = "opt_secs")]
    pub transaction_age: Option<Duration>,
    /// How long it has been in its current state (idle in transaction for this long).
    #[serde(rename = "state_age_seconds", serialize_with = "opt_secs")]
    pub state_age: Option<Duration>,
    /// How many transactions ago its snapshot was taken (PostgreSQL `age(xmin)`): how
    /// far it holds the xmin horizon back.
    pub xmin_age_transactions: Option<u64>,
    /// The head of its current or last statement, at most [`QUERY_HEAD_CHARS`]
    /// characters, with string literals masked and URL passwords redacted.
    pub query_head: Option<String>,
    /// The client's `application_name` (PostgreSQL).
    pub application_name: Option<String>,
    /// The client's address (and port, on MariaDB/MySQL).
    pub client: Option<String>,
    /// The database user.
    pub user: Option<String>,
    /// The database it is connected to.
    pub database: Option<String>,
}

/// How [`HealthOps::health_read`] reads.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthReadParams {
    /// Transactions open at least this long are listed as long transactions (the xmin
    /// holder is reported whatever its age).
    pub long_after: Duration,
    /// Also read the size of the history table (`<table>History`) when it exists.
    pub history: bool,
}

/// What one source's database reports about itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthFacts {
    /// The commands table; `None` when it does not exist.
    pub table: Option<TableStats>,
    /// The history table (`<table>History`), when one exists.
    pub history: Option<TableStats>,
    /// The session whose transaction holds back the removal of dead rows the longest
    /// (the xmin horizon on PostgreSQL, the oldest read view on InnoDB).
    pub xmin_holder: Option<Session>,
    /// Connections whose transaction has been open longer than asked, oldest first.
    pub long_transactions: Vec<Session>,
    /// InnoDB's history list length: row versions kept for open read views (the
    /// analogue of dead rows; `None` where not available).
    pub history_list_length: Option<u64>,
    /// The write-ahead log file's size (SQLite's `-wal`).
    pub wal_bytes: Option<u64>,
    /// How long the oldest due command (pending, unleased, `RunAt <= now`) has waited
    /// since its `RunAt`.
    pub oldest_due_wait: Option<Duration>,
    /// What the engine could not see, and why (shown as information, never guessed).
    pub notes: Vec<String>,
}

/// The health reads of one source's database, implemented in each engine's folder.
#[async_trait]
pub trait HealthOps: Send + Sync + 'static {
    /// Reads the table's size and cleanup state, the open transactions holding it back
    /// and the oldest due command's wait, in a few short catalogue reads (no transaction
    /// is left open, and the reader's own session is never reported).
    async fn health_read(&self, params: &HealthReadParams) -> Result<HealthFacts>;
}

/// A duration as fractional seconds (JSON), `null` when absent.
pub(crate) fn opt_secs<S: Serializer>(
    value: &Option<Duration>,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    match value {
        Some(d) => serializer.serialize_some(&secs(*d)),
        None => serializer.serialize_none(),
    }
}

/// Seconds rounded to milliseconds.
pub(crate) fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// A duration from seconds read from the database (negative or not finite: zero, as
/// when clocks disagree by a hair).
pub(crate) fn from_secs(seconds: f64) -> Duration {
    if seconds.is_finite() && seconds > 0.0 {
        Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX)
    } else {
        Duration::ZERO
    }
}

/// A count read as a signed integer (negative: an estimate not yet made).
pub(crate) fn count(n: Option<i64>) -> Option<u64> {
    n.and_then(|n| u64::try_from(n).ok())
}

/// A statement's head as a report shows it: at most [`QUERY_HEAD_CHARS`] characters,
/// every quoted string literal masked (`'…'`: a password in `ALTER ROLE`, a payload in an
/// `INSERT`), URL passwords and `name=secret` pairs redacted, control characters escaped.
pub fn query_head(query: &str) -> String {
    let head: String = query.trim().chars().take(QUERY_HEAD_CHARS).collect();
    let mut masked = String::with_capacity(head.len());
    let mut chars = head.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' {
            masked.push_str("'…'");
            // Skip to the closing quote ('' inside a literal is a quote, not the end).
            loop {
                match chars.next() {
                    None => break,
                    Some('\'') if chars.peek() == Some(&'\'') => {
                        chars.next();
                    }
                    Some('\'') => break,
                    Some(_) => {}
                }
            }
        } else if c == '$' && chars.peek() == Some(&'$') {
            // A dollar-quoted body (`$$ … $$`): masked the same way.
            chars.next();
            masked.push_str("$$…$$");
            let mut last = ' ';
            for next in chars.by_ref() {
                if last == '$' && next == '$' {
                    break;
                }
                last = next;
            }
        } else {
            masked.push(c);
        }
    }
    let cut = query.trim().chars().count() > QUERY_HEAD_CHARS;
    let mut out = crate::redact::escape_for_log(&crate::redact::redact_text(&masked));
    if cut {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_heads_mask_literals_and_stay_bounded() {
        assert_eq!(
            query_head("ALTER ROLE app PASSWORD 'hunter2'"),
            "ALTER ROLE app PASSWORD '…'"
        );
        assert_eq!(
            query_head("SELECT 'it''s', 1 FROM t WHERE a = 'x'"),
            "SELECT '…', 1 FROM t WHERE a = '…'"
        );
        assert_eq!(
            query_head("DO $$ secret $$; SELECT 1"),
            "DO $$…$$; SELECT 1"
        );
        let url = query_head("SELECT dblink_connect(concat('postgres://u:pw@h/db'))");
        assert!(!url.contains("pw"), "{url}");
        let long = query_head(&"x".repeat(1000));
        assert_eq!(long.chars().count(), QUERY_HEAD_CHARS + 1);
        assert_eq!(query_head("SELECT\n1"), "SELECT\\n1");
    }
}
