//! Health you can see: each source's table size, dead row versions, the transaction
//! holding back their removal, long transactions and the oldest due command's wait,
//! judged against [`Thresholds`] into [`Finding`]s that each say what to do.
//!
//! The engine reads the facts ([`crate::engine::health`]); the judgement here is the
//! same for every engine. A finding of [`Severity::Action`] means something needs an
//! operator now (`icq doctor` exits 1); [`Severity::Warning`] is worth a look;
//! [`Severity::Info`] is what the engine cannot see. The reads are catalogue and
//! statistics views plus one seek into the poll order, so a worker can sample them for
//! its gauges.
//!
//! The thresholds (all in [`Thresholds::default`]):
//!
//! | what | needs action when |
//! |---|---|
//! | the xmin horizon (PostgreSQL) or oldest read view (InnoDB) | held longer than 60 s |
//! | a session idle in transaction | idle longer than 30 s |
//! | any transaction | open longer than 60 s (listed as long) |
//! | dead row versions (PostgreSQL) | more than max(10,000, 20% of live rows) |
//! | InnoDB history list length | more than 1,000,000 |
//! | the oldest due command | waiting longer than 60 s past its `RunAt` |
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
//! use icq::admin::doctor::{Thresholds, health};
//! use icq::{ConnectOptions, Queue};
//!
//! let options = ConnectOptions::default().creating_table(true);
//! let queue = Queue::connect("shop", &url, &Default::default(), &options).await?;
//! let report = health(&queue, &Thresholds::default()).await?;
//! assert!(!report.needs_action());
//! assert!(report.table.is_some());
//! for finding in &report.findings {
//!     println!("{:?}: {} — {}", finding.severity, finding.what, finding.advice);
//! }
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use serde::Serialize;

use crate::engine::health::{HealthFacts, HealthReadParams, opt_secs, secs};
pub use crate::engine::health::{QUERY_HEAD_CHARS, Session, SessionKind, TableStats, query_head};
use crate::error::Result;
use crate::ident::Engine;
use crate::queue::Queue;

/// The xmin horizon (or InnoDB's oldest read view) held longer than this needs action.
pub const XMIN_HELD_MAX: Duration = Duration::from_secs(60);
/// A session idle in transaction longer than this needs action.
pub const IDLE_IN_TRANSACTION_MAX: Duration = Duration::from_secs(30);
/// A transaction open longer than this is long (and needs action).
pub const LONG_TRANSACTION: Duration = Duration::from_secs(60);
/// Dead rows above this many (or [`DEAD_ROWS_SHARE`] of the live ones, whichever is
/// more) need action.
pub const DEAD_ROWS_MIN: u64 = 10_000;
/// The share of live rows dead rows may reach before they need action.
pub const DEAD_ROWS_SHARE: f64 = 0.20;
/// InnoDB's history list above this length needs action.
pub const HISTORY_LIST_MAX: u64 = 1_000_000;
/// The oldest due command waiting longer than this past its `RunAt` needs action.
pub const DUE_WAIT_MAX: Duration = Duration::from_secs(60);
/// A SQLite `-wal` file above this size is worth a look (a reader that never ends keeps
/// every checkpoint from resetting it).
pub const WAL_BYTES_WARN: u64 = 256 * 1024 * 1024;

/// What makes a finding need action. The defaults are the constants above.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use icq::admin::doctor::Thresholds;
///
/// let strict = Thresholds::all(Duration::from_secs(5));
/// assert_eq!(strict.idle_in_transaction, Duration::from_secs(5));
/// assert_eq!(Thresholds::default().xmin_held, Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Thresholds {
    /// [`XMIN_HELD_MAX`].
    pub xmin_held: Duration,
    /// [`IDLE_IN_TRANSACTION_MAX`].
    pub idle_in_transaction: Duration,
    /// [`LONG_TRANSACTION`].
    pub long_transaction: Duration,
    /// [`DUE_WAIT_MAX`].
    pub due_wait: Duration,
    /// [`DEAD_ROWS_MIN`].
    pub dead_rows_min: u64,
    /// [`DEAD_ROWS_SHARE`].
    pub dead_rows_share: f64,
    /// [`HISTORY_LIST_MAX`].
    pub history_list: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            xmin_held: XMIN_HELD_MAX,
            idle_in_transaction: IDLE_IN_TRANSACTION_MAX,
            long_transaction: LONG_TRANSACTION,
            due_wait: DUE_WAIT_MAX,
            dead_rows_min: DEAD_ROWS_MIN,
            dead_rows_share: DEAD_ROWS_SHARE,
            history_list: HISTORY_LIST_MAX,
        }
    }
}

impl Thresholds {
    /// The defaults with every age threshold (xmin held, idle in transaction, long
    /// transaction, due wait) set to `age`: `icq doctor --max-age`. See [`Thresholds`]'s
    /// example.
    pub fn all(age: Duration) -> Thresholds {
        Thresholds {
            xmin_held: age,
            idle_in_transaction: age,
            long_transaction: age,
            due_wait: age,
            ..Thresholds::default()
        }
    }

    /// How many dead rows need action for a table of `live` live rows.
    pub fn dead_rows_for(&self, live: u64) -> u64 {
        self.dead_rows_min
            .max((live as f64 * self.dead_rows_share).round() as u64)
    }
}

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// What the engine cannot show, or a figure for context.
    Info,
    /// Worth a look; not yet harmful.
    Warning,
    /// Needs an operator now (`icq doctor` exits 1).
    Action,
}

/// One thing the doctor found, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Finding {
    /// How much it matters.
    pub severity: Severity,
    /// What was found, with its figures.
    pub what: String,
    /// What to do about it.
    pub advice: String,
}

/// One source's health.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct HealthReport {
    /// The source name.
    pub source: String,
    /// Its engine (`postgres`, `mysql`, `sqlite`).
    pub engine: &'static str,
    /// The commands table; `None` when it does not exist.
    pub table: Option<TableStats>,
    /// The history table of completed commands (`<table>History`), when one exists.
    pub history: Option<TableStats>,
    /// The session holding the xmin horizon (PostgreSQL) or the oldest read view
    /// (InnoDB) the longest, whatever its age; `None` when no transaction is open (and
    /// always on SQLite, which cannot see other connections).
    pub xmin_holder: Option<Session>,
    /// Transactions open longer than [`Thresholds::long_transaction`], oldest first.
    pub long_transactions: Vec<Session>,
    /// InnoDB's history list length (row versions kept for open read views).
    pub history_list_length: Option<u64>,
    /// The SQLite `-wal` file's size.
    pub wal_bytes: Option<u64>,
    /// How long the oldest due command has waited past its `RunAt`; `None` when
    /// nothing is due.
    #[serde(rename = "oldest_due_wait_seconds", serialize_with = "opt_secs")]
    pub oldest_due_wait: Option<Duration>,
    /// What was found, most severe first.
    pub findings: Vec<Finding>,
}

impl HealthReport {
    /// Whether any finding needs action.
    pub fn needs_action(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Action)
    }
}

/// Every selected source's health (the `icq doctor` document).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct DoctorReport {
    /// Whether any source has a finding that needs action.
    pub needs_action: bool,
    /// One report per source, in source order.
    pub sources: Vec<HealthReport>,
}

/// One source's health, judged against `thresholds`.
pub async fn health(queue: &Queue, thresholds: &Thresholds) -> Result<HealthReport> {
    let params = HealthReadParams {
        long_after: thresholds.long_transaction,
        history: true,
    };
    let facts = queue.backend().health_read(&params).await?;
    Ok(judge(queue.name(), queue.engine(), facts, thresholds))
}

/// Every source's health, read concurrently.
pub async fn doctor(sources: &[Queue], thresholds: &Thresholds) -> Result<DoctorReport> {
    let reports =
        futures::future::try_join_all(sources.iter().map(|s| health(s, thresholds))).await?;
    Ok(DoctorReport {
        needs_action: reports.iter().any(HealthReport::needs_action),
        sources: reports,
    })
}

/// A duration as people read it: `45s`, `5m 3s`, `2h 10m`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{}s", secs(d).round() as u64),
        60..3600 if s.is_multiple_of(60) => format!("{}m", s / 60),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 if s % 3600 / 60 == 0 => format!("{}h", s / 3600),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ if s % 86_400 / 3600 == 0 => format!("{}d", s / 86_400),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Bytes as people read them: `812 kB`, `1.2 GB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Who a session is, in a few words: `pid 1234 (app 'psql', idle in transaction for 5m)`.
pub fn describe(session: &Session) -> String {
    let mut who = match session.kind {
        SessionKind::Connection => match session.pid {
            Some(pid) => format!("pid {pid}"),
            None => "a session".to_owned(),
        },
        SessionKind::PreparedTransaction => format!(
            "prepared transaction '{}'",
            session.name.as_deref().unwrap_or("?")
        ),
        SessionKind::ReplicationSlot => format!(
            "replication slot '{}'",
            session.name.as_deref().unwrap_or("?")
        ),
    };
    let mut details = Vec::new();
    if let Some(app) = &session.application_name {
        details.push(format!("app '{}'", crate::redact::echo(app)));
    }
    if let Some(client) = &session.client {
        details.push(format!("from {client}"));
    }
    match (&session.state, session.state_age, session.transaction_age) {
        (Some(state), Some(age), _) if state.starts_with("idle in transaction") => {
            details.push(format!("{state} for {}", human_duration(age)))
        }
        (state, _, Some(age)) => {
            if let Some(state) = state {
                details.push(state.clone());
            }
            details.push(format!("transaction open {}", human_duration(age)));
        }
        (Some(state), _, None) => details.push(state.clone()),
        (None, _, None) => {}
    }
    if let Some(xids) = session.xmin_age_transactions {
        details.push(format!("xmin age {xids}"));
    }
    if !details.is_empty() {
        who.push_str(&format!(" ({})", details.join(", ")));
    }
    who
}

/// `; last statement: …` of a session that has one, else nothing.
fn last_statement(session: &Session) -> String {
    session
        .query_head
        .as_ref()
        .map_or_else(String::new, |q| format!("; last statement: {q}"))
}

/// How to end what `session` holds, on `engine`.
fn how_to_end(session: &Session, engine: Engine) -> String {
    match (session.kind, engine) {
        (SessionKind::PreparedTransaction, _) => format!(
            "finish it with COMMIT PREPARED '{0}' or ROLLBACK PREPARED '{0}'",
            session.name.as_deref().unwrap_or("?")
        ),
        (SessionKind::ReplicationSlot, _) => format!(
            "if its standby or consumer is gone, drop it with SELECT pg_drop_replication_slot('{}')",
            session.name.as_deref().unwrap_or("?")
        ),
        (SessionKind::Connection, Engine::Postgres) => format!(
            "end it with SELECT pg_terminate_backend({}), or have the application commit; \
             idle_in_transaction_session_timeout ends such sessions for you",
            session.pid.unwrap_or_default()
        ),
        (SessionKind::Connection, _) => format!(
            "end it with KILL {}, or have the application commit; wait_timeout (or \
             idle_transaction_timeout on MariaDB) ends idle ones for you",
            session.pid.unwrap_or_default()
        ),
    }
}

fn is_idle_in_transaction(session: &Session) -> bool {
    session
        .state
        .as_deref()
        .is_some_and(|s| s.starts_with("idle in transaction"))
}

/// The findings of `facts` against `thresholds`, as one source's report.
fn judge(
    source: &str,
    engine: Engine,
    facts: HealthFacts,
    thresholds: &Thresholds,
) -> HealthReport {
    let mut findings = Vec::new();
    let table_name = facts
        .table
        .as_ref()
        .map_or_else(|| "the commands table".to_owned(), |t| t.table.clone());

    match &facts.table {
        None => findings.push(Finding {
            severity: Severity::Action,
            what: "the commands table does not exist".to_owned(),
            advice: "create it with `icq migrate add` and your migration tool, or start a \
                     worker with create_table: true"
                .to_owned(),
        }),
        Some(table) => {
            if let (Some(dead), live) = (table.dead_rows, table.live_rows.unwrap_or(0)) {
                let limit = thresholds.dead_rows_for(live);
                if dead > limit {
                    findings.push(Finding {
                        severity: Severity::Action,
                        what: format!(
                            "{table_name} holds {dead} dead row versions ({live} live; more \
                             than {limit} needs action)"
                        ),
                        advice: dead_rows_advice(&facts, &table_name),
                    });
                }
            }
        }
    }

    if let Some(holder) = &facts.xmin_holder {
        let held = holder.transaction_age;
        let what_held = match engine {
            Engine::Postgres => "holds the xmin horizon: dead rows cannot be removed",
            _ => {
                "is the oldest open transaction: InnoDB keeps every row version since it began (purge waits for it)"
            }
        };
        let over = match holder.kind {
            // A slot has no age in time: one not in use holds the horizon for nothing.
            SessionKind::ReplicationSlot => holder.state.as_deref() == Some("inactive"),
            _ => {
                held.is_some_and(|h| h > thresholds.xmin_held)
                    || is_idle_in_transaction(holder)
                        && holder
                            .state_age
                            .is_some_and(|a| a > thresholds.idle_in_transaction)
            }
        };
        findings.push(Finding {
            severity: if over {
                Severity::Action
            } else {
                Severity::Info
            },
            what: format!("{} {what_held}{}", describe(holder), last_statement(holder)),
            advice: if over {
                how_to_end(holder, engine)
            } else {
                format!(
                    "nothing to do while it is short (action after {})",
                    human_duration(thresholds.xmin_held)
                )
            },
        });
    }

    let holder_pid = facts
        .xmin_holder
        .as_ref()
        .filter(|h| h.kind == SessionKind::Connection)
        .and_then(|h| h.pid);
    for session in &facts.long_transactions {
        // The xmin holder's own finding already names it.
        if session.kind == SessionKind::Connection
            && session.pid.is_some()
            && session.pid == holder_pid
        {
            continue;
        }
        let idle = is_idle_in_transaction(session);
        let over = if idle {
            session
                .state_age
                .is_some_and(|a| a > thresholds.idle_in_transaction)
                || session
                    .transaction_age
                    .is_some_and(|a| a > thresholds.long_transaction)
        } else {
            session
                .transaction_age
                .is_some_and(|a| a > thresholds.long_transaction)
        };
        findings.push(Finding {
            severity: if over {
                Severity::Action
            } else {
                Severity::Warning
            },
            what: format!(
                "long transaction: {}{}",
                describe(session),
                last_statement(session)
            ),
            advice: how_to_end(session, engine),
        });
    }
    if let Some(length) = facts.history_list_length
        && length > thresholds.history_list
    {
        findings.push(Finding {
            severity: Severity::Action,
            what: format!(
                "InnoDB's history list holds {length} undo records (more than {} needs action)",
                thresholds.history_list
            ),
            advice: "end the oldest open transaction (above); purge then catches up on its own"
                .to_owned(),
        });
    }

    if let Some(wal) = facts.wal_bytes
        && wal > WAL_BYTES_WARN
    {
        findings.push(Finding {
            severity: Severity::Warning,
            what: format!("the -wal file is {}", human_bytes(wal)),
            advice: "a reader that never ends keeps checkpoints from resetting it: close long \
                     read transactions; PRAGMA wal_checkpoint(TRUNCATE) shrinks it once none is open"
                .to_owned(),
        });
    }

    if let Some(wait) = facts.oldest_due_wait
        && wait > thresholds.due_wait
    {
        findings.push(Finding {
            severity: Severity::Action,
            what: format!(
                "the oldest due command has waited {} past its run time",
                human_duration(wait)
            ),
            advice: "no worker is taking commands fast enough: check that workers run \
                     (`icq work`) and serve its queue and type, that the queue is not paused, \
                     and add workers or concurrency if they are all busy (`icq pending` shows \
                     the backlog)"
                .to_owned(),
        });
    }

    for note in &facts.notes {
        findings.push(Finding {
            severity: Severity::Info,
            what: crate::redact::redact_text(note),
            advice: String::new(),
        });
    }
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));

    HealthReport {
        source: source.to_owned(),
        engine: engine.name(),
        table: facts.table,
        history: facts.history,
        xmin_holder: facts.xmin_holder,
        long_transactions: facts.long_transactions,
        history_list_length: facts.history_list_length,
        wal_bytes: facts.wal_bytes,
        oldest_due_wait: facts.oldest_due_wait,
        findings,
    }
}

fn dead_rows_advice(facts: &HealthFacts, table: &str) -> String {
    let quoted = table
        .split('.')
        .map(|part| Engine::Postgres.quote_ident(part))
        .collect::<Vec<_>>()
        .join(".");
    let tune = format!(
        "run VACUUM (ANALYZE) {quoted}, and let autovacuum come sooner with ALTER TABLE \
         {quoted} SET (autovacuum_vacuum_scale_factor = 0.01)"
    );
    match &facts.xmin_holder {
        Some(holder)
            if holder.kind != SessionKind::Connection
                || holder
                    .transaction_age
                    .is_some_and(|a| a > Duration::from_secs(10)) =>
        {
            format!(
                "end what holds the xmin horizon ({}): no vacuum can remove them before; then {tune}",
                describe(holder)
            )
        }
        _ => format!("autovacuum is behind: {tune}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(pid: i64, idle_for: u64) -> Session {
        Session {
            kind: SessionKind::Connection,
            pid: Some(pid),
            name: None,
            state: Some("idle in transaction".into()),
            transaction_age: Some(Duration::from_secs(idle_for + 1)),
            state_age: Some(Duration::from_secs(idle_for)),
            xmin_age_transactions: Some(3),
            query_head: Some("SELECT txid_current()".into()),
            application_name: Some("psql".into()),
            client: None,
            user: None,
            database: None,
        }
    }

    fn table(live: u64, dead: u64) -> TableStats {
        TableStats {
            table: "InternalCommands".into(),
            live_rows: Some(live),
            dead_rows: Some(dead),
            ..TableStats::default()
        }
    }

    #[test]
    fn a_healthy_table_needs_nothing() {
        let facts = HealthFacts {
            table: Some(table(100, 5)),
            ..HealthFacts::default()
        };
        let report = judge("s", Engine::Postgres, facts, &Thresholds::default());
        assert!(!report.needs_action(), "{:?}", report.findings);
    }

    #[test]
    fn an_idle_transaction_past_its_threshold_needs_action_and_is_named() {
        let facts = HealthFacts {
            table: Some(table(100, 5)),
            xmin_holder: Some(idle(1234, 300)),
            long_transactions: vec![idle(1234, 300)],
            ..HealthFacts::default()
        };
        let report = judge("s", Engine::Postgres, facts, &Thresholds::default());
        assert!(report.needs_action());
        assert_eq!(report.findings.len(), 1, "{:?}", report.findings);
        let finding = &report.findings[0];
        assert!(
            finding
                .what
                .starts_with("pid 1234 (app 'psql', idle in transaction for 5m"),
            "{}",
            finding.what
        );
        assert!(
            finding.advice.contains("pg_terminate_backend(1234)"),
            "{}",
            finding.advice
        );
    }

    #[test]
    fn a_short_idle_transaction_is_information() {
        let facts = HealthFacts {
            table: Some(table(100, 5)),
            xmin_holder: Some(idle(7, 5)),
            ..HealthFacts::default()
        };
        let report = judge("s", Engine::Postgres, facts, &Thresholds::default());
        assert!(!report.needs_action(), "{:?}", report.findings);
        // Idle past its own (shorter) threshold, though not yet "long": action.
        let facts = HealthFacts {
            table: Some(table(100, 5)),
            xmin_holder: Some(idle(7, 45)),
            ..HealthFacts::default()
        };
        let report = judge("s", Engine::Postgres, facts, &Thresholds::default());
        assert!(report.needs_action(), "{:?}", report.findings);
    }

    #[test]
    fn dead_rows_need_action_above_the_larger_of_the_floor_and_the_share() {
        let t = Thresholds::default();
        assert_eq!(t.dead_rows_for(0), 10_000);
        assert_eq!(t.dead_rows_for(1_000_000), 200_000);
        for (live, dead, action) in [
            (0, 10_000, false),
            (0, 10_001, true),
            (1_000_000, 150_000, false),
            (1_000_000, 200_001, true),
        ] {
            let facts = HealthFacts {
                table: Some(table(live, dead)),
                ..HealthFacts::default()
            };
            assert_eq!(
                judge("s", Engine::Postgres, facts, &t).needs_action(),
                action,
                "{live} {dead}"
            );
        }
    }

    #[test]
    fn a_due_backlog_past_its_threshold_needs_action() {
        let facts = HealthFacts {
            table: Some(table(0, 0)),
            oldest_due_wait: Some(Duration::from_secs(125)),
            ..HealthFacts::default()
        };
        let report = judge("s", Engine::Sqlite, facts, &Thresholds::default());
        assert!(report.needs_action());
        assert!(
            report.findings[0].what.contains("2m 5s"),
            "{}",
            report.findings[0].what
        );
    }

    #[test]
    fn figures_read_naturally() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1_234_567), "1.2 MB");
        assert_eq!(human_duration(Duration::from_secs(59)), "59s");
        assert_eq!(human_duration(Duration::from_secs(3_700)), "1h 1m");
    }
}
