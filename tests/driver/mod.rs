//! The driver conformance suite: every engine driver called directly through the engine
//! seam ([`super::QueueOps`]), case by case, on a real PostgreSQL, SQLite and MariaDB.
//!
//! It is compiled into the library's unit tests (`src/engine/mod.rs` includes this file
//! as `engine::conformance`), so it reaches the drivers without their being public, and
//! only under the `driver-suite` feature, so that `cargo test --lib` needs no server:
//! `cargo test --lib --features driver-suite engine::conformance` (the test command,
//! `cargo nextest run --features driver-suite`, runs it with the rest). Cargo does not
//! build this directory as an integration test of its own (`autotests = false`, and no
//! `[[test]]` target in Cargo.toml names it).
//!
//! Each case gets a table of its own (a fresh file on SQLite), so the cases run in
//! parallel. A server that cannot be reached fails the case: it is never skipped.

mod admin;
mod claim;
mod decode;
mod history;
mod lease;
mod recurring;
mod stamp;
mod sweep;
mod workload;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Connection as _;

use super::{Backend, ClaimParams, ClaimedRow, ConnectOptions};
use crate::command::{CommandId, CommandRow, LeaseToken, NewCommand};
use crate::engine::{
    CommandGetParams, CommandInsertParams, CommandSetStateAndClaimParams, SetState,
};
use crate::ident::{Engine, TableName};

/// One test table on one engine, a driver connected to it, and a raw connection for the
/// plain SQL another program would run.
pub(crate) struct Harness {
    pub engine: Engine,
    pub driver: Arc<dyn Backend>,
    /// The quoted table name, for test SQL.
    pub t: String,
    pub table: TableName,
    url: String,
    _dir: Option<tempfile::TempDir>,
}

fn postgres_url() -> String {
    std::env::var("ICQ_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn mysql_url() -> String {
    std::env::var("ICQ_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// A table name no other case (or concurrent test run) uses.
fn unique_table(tag: &str) -> TableName {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let tag: String = tag
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    let name = format!(
        "drv_{tag}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    TableName::parse(&name).expect("a valid test table name")
}

impl Harness {
    /// A fresh commands table on `engine`, created by the migration's DDL.
    pub async fn new(engine: &str, tag: &str) -> Harness {
        Harness::with_ddl(engine, tag, |ddl| ddl).await
    }

    /// A fresh commands table created by the migration's DDL as `edit` changes it (a
    /// foreign program's variant of the table).
    pub async fn with_ddl(engine: &str, tag: &str, edit: impl FnOnce(String) -> String) -> Harness {
        Harness::create(engine, tag, crate::schema::render, edit).await
    }

    /// A fresh version-1 commands table (before queues, priorities and unique keys).
    pub async fn v1(engine: &str, tag: &str) -> Harness {
        Harness::create(engine, tag, crate::schema::render_v1, |ddl| ddl).await
    }

    /// A fresh version-2 commands table (before the history table): version 1 upgraded.
    pub async fn v2(engine: &str, tag: &str) -> Harness {
        let render = |engine, table: &TableName| crate::schema::Ddl {
            up: crate::schema::render_v1(engine, table).up
                + &crate::schema::render_upgrade(engine, table).up,
            down: String::new(),
        };
        Harness::create(engine, tag, render, |ddl| ddl).await
    }

    /// The quoted name of the history table (schema version 3).
    pub fn history(&self) -> String {
        self.table.history().quoted(self.engine)
    }

    /// How many rows of the history table match `condition`.
    pub async fn count_history(&self, condition: &str) -> i64 {
        self.scalar(&format!(
            "SELECT COUNT(*) FROM {} WHERE {condition}",
            self.history()
        ))
        .await
    }

    /// How many rows of the table and its history together match `condition`.
    pub async fn count_all(&self, condition: &str) -> i64 {
        self.count(condition).await + self.count_history(condition).await
    }

    async fn create(
        engine: &str,
        tag: &str,
        render: fn(Engine, &TableName) -> crate::schema::Ddl,
        edit: impl FnOnce(String) -> String,
    ) -> Harness {
        let engine: Engine = engine.parse().expect("a runtime engine");
        let table = unique_table(tag);
        let (url, dir) = match engine {
            Engine::Postgres => (postgres_url(), None),
            Engine::Mysql => (mysql_url(), None),
            Engine::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}?mode=rwc", dir.path().join("q.db").display());
                (url, Some(dir))
            }
            Engine::SqlServer => unreachable!("no runtime driver"),
        };
        let harness = Harness {
            engine,
            t: table.quoted(engine),
            driver: super::connect(&url, &table, &ConnectOptions::default())
                .await
                .unwrap_or_else(|e| panic!("{engine} test server at {url} is not reachable: {e}")),
            table: table.clone(),
            url,
            _dir: dir,
        };
        let ddl = edit(render(engine, &table).up);
        harness
            .driver
            .schema_apply(&ddl)
            .await
            .expect("create the table");
        harness
    }

    /// A second driver on the same table (another replica with its own pool).
    pub async fn another_driver(&self) -> Arc<dyn Backend> {
        super::connect(&self.url, &self.table, &ConnectOptions::default())
            .await
            .expect("a second driver")
    }

    /// An identifier quoted for this engine (test SQL only).
    pub fn q(&self, ident: &str) -> String {
        self.engine.quote_ident(ident)
    }

    /// SQL for the instant `seconds` before now (after now when negative), in the
    /// engine's stored form.
    pub fn ago(&self, seconds: i64) -> String {
        match self.engine {
            Engine::Postgres => format!("(now() - make_interval(secs => {seconds}))"),
            Engine::Mysql => format!("(UTC_TIMESTAMP(6) - INTERVAL {seconds} SECOND)"),
            _ => format!(
                "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '{:+} seconds')",
                -seconds
            ),
        }
    }

    /// Runs plain SQL (no parameters) on a connection of its own.
    pub async fn exec(&self, sql: &str) {
        let text = sqlx::AssertSqlSafe(sql.to_owned());
        let result = match self.engine {
            Engine::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::raw_sql(text).execute(&mut c).await.map(|_| ())
            }
            Engine::Mysql => {
                let mut c = sqlx::MySqlConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::raw_sql(text).execute(&mut c).await.map(|_| ())
            }
            _ => {
                let mut c = sqlx::SqliteConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::raw_sql(text).execute(&mut c).await.map(|_| ())
            }
        };
        result.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Runs a query returning one integer.
    pub async fn scalar(&self, sql: &str) -> i64 {
        let text = sqlx::AssertSqlSafe(sql.to_owned());
        let result = match self.engine {
            Engine::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::query_scalar::<_, i64>(text).fetch_one(&mut c).await
            }
            Engine::Mysql => {
                let mut c = sqlx::MySqlConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::query_scalar::<_, i64>(text).fetch_one(&mut c).await
            }
            _ => {
                let mut c = sqlx::SqliteConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::query_scalar::<_, i64>(text).fetch_one(&mut c).await
            }
        };
        result.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Rows matching `condition` (SQL over quoted columns).
    pub async fn count(&self, condition: &str) -> i64 {
        self.scalar(&format!(
            "SELECT COUNT(*) FROM {} WHERE {condition}",
            self.t
        ))
        .await
    }

    /// Inserts a due command of `type_name` through the driver.
    pub async fn insert(&self, type_name: &str) -> CommandId {
        self.driver
            .command_insert(&CommandInsertParams {
                command: &NewCommand::new(type_name, serde_json::json!({})),
            })
            .await
            .expect("insert a command")
            .id
    }

    /// Sets `assignments` (SQL) on the row `id`.
    pub async fn update(&self, id: &CommandId, assignments: &str) {
        self.exec(&format!(
            "UPDATE {} SET {assignments} WHERE {} = '{id}'",
            self.t,
            self.q("Id")
        ))
        .await;
    }

    /// The row `id`, as the driver reads it.
    pub async fn get(&self, id: &CommandId) -> CommandRow {
        self.driver
            .command_get(&CommandGetParams { id })
            .await
            .expect("read a row")
            .unwrap_or_else(|| panic!("row {id} exists"))
    }

    /// Stamps `changes` and claims with `claim` in one call.
    pub async fn stamp_and_claim(
        &self,
        changes: &[SetState],
        claim: &ClaimParams,
    ) -> crate::error::Result<(u64, Vec<ClaimedRow>)> {
        self.driver
            .command_set_state_and_claim(&CommandSetStateAndClaimParams { changes, claim })
            .await
    }

    /// Claims under a fresh token with a 60 s lease and no processing delay.
    pub async fn claim(&self, limit: u32) -> (LeaseToken, Vec<ClaimedRow>) {
        let params = params(limit);
        let rows = self.driver.command_claim(&params).await.expect("claim");
        (params.token, rows)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if self.engine == Engine::Sqlite {
            return;
        }
        let (engine, url) = (self.engine, self.url.clone());
        let ddl = sqlx::AssertSqlSafe(crate::schema::render(engine, &self.table).down);
        // Best effort, on a thread and a connection of its own: Drop cannot be async, and
        // the driver's pool belongs to the test's runtime.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if engine == Engine::Postgres {
                    if let Ok(mut c) = sqlx::PgConnection::connect(&url).await {
                        let _ = sqlx::raw_sql(ddl).execute(&mut c).await;
                    }
                } else if let Ok(mut c) = sqlx::MySqlConnection::connect(&url).await {
                    let _ = sqlx::raw_sql(ddl).execute(&mut c).await;
                }
            });
        })
        .join();
    }
}

/// Claim parameters: `limit` rows, a fresh token, a 60 s lease, no delay, every type.
pub(crate) fn params(limit: u32) -> ClaimParams {
    ClaimParams {
        limit,
        lease: Duration::from_secs(60),
        processing_delay: Duration::ZERO,
        token: LeaseToken::new(),
        types: None,
        queues: None,
        spread: false,
        skip_paused: false,
    }
}

/// The ids of claimed rows, sorted.
pub(crate) fn ids(rows: &[ClaimedRow]) -> Vec<CommandId> {
    let mut ids: Vec<CommandId> = rows.iter().map(|r| r.lease.id.clone()).collect();
    ids.sort();
    ids
}

/// `ids` sorted, for comparing sets.
pub(crate) fn sorted(ids: &[&CommandId]) -> Vec<CommandId> {
    let mut ids: Vec<CommandId> = ids.iter().map(|&id| id.clone()).collect();
    ids.sort();
    ids
}

/// Asserts `at` lies within `slack` of `expected`.
#[track_caller]
pub(crate) fn near(at: DateTime<Utc>, expected: DateTime<Utc>, slack: Duration, what: &str) {
    let off = (at - expected).abs().to_std().unwrap_or(Duration::MAX);
    assert!(
        off <= slack,
        "{what}: {at} is {off:?} away from {expected}, more than {slack:?}"
    );
}

/// Expands each listed case (an `async fn(&str)` in one of the topic modules) into one
/// `#[tokio::test]` per engine: `engine::conformance::postgres::<case>`, `…::sqlite::…`,
/// `…::mysql::…`.
macro_rules! driver_cases {
    ($($topic:ident :: $name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$topic::$name("postgres").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$topic::$name("sqlite").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$topic::$name("mysql").await } )* }
    };
}

driver_cases!(
    claim::claims_due_rows_in_run_at_order_up_to_the_limit,
    claim::claim_skips_rows_younger_than_the_processing_delay,
    claim::claim_with_types_takes_only_those_types,
    claim::two_claimers_get_disjoint_rows_and_together_all,
    claim::a_row_released_behind_the_last_claim_is_claimed_again_soon,
    claim::a_backlog_with_one_run_at_is_claimed_once_in_full_batches,
    stamp::completed_is_guarded_by_the_lease_token,
    stamp::retry_is_guarded_by_the_lease_token,
    stamp::dead_is_guarded_by_the_lease_token,
    stamp::release_is_guarded_and_gives_the_attempt_back,
    stamp::one_statement_stamps_every_kind_and_skips_stale_leases,
    stamp::set_state_and_claim_stamps_and_claims_in_one_call,
    stamp::a_stamp_and_claim_that_fails_stamps_nothing,
    stamp::a_full_batch_stamp_and_claim_returns_every_row,
    lease::lease_extend_keeps_only_leases_with_the_current_token,
    decode::undecodable_rows_come_back_with_defects_and_never_fail_the_claim,
    decode::ids_are_matched_exactly_as_stored,
    sweep::sweep_deletes_only_old_completed_rows_in_bounded_batches,
    recurring::racing_replicas_schedule_each_occurrence_once,
    recurring::missed_occurrences_are_skipped_or_run_once,
    workload::claims_come_in_priority_then_run_at_order,
    workload::a_queue_filter_claims_only_those_queues,
    workload::activity_in_counts_the_queues_asked_for,
    workload::concurrent_schedulers_with_one_unique_key_create_one_row,
    workload::plain_sql_inserts_honour_the_unique_key,
    workload::completed_and_dead_rows_free_the_unique_key,
    workload::bulk_inserts_with_repeated_keys_return_the_one_row,
    workload::in_transaction_inserts_honour_the_unique_key,
    workload::snooze_gives_the_attempt_back_and_counts_itself,
    workload::lease_check_returns_the_leases_still_held,
    workload::a_version_1_table_claims_as_before_and_refuses_version_2_asks,
    workload::foreign_rows_with_unusable_queue_or_priority_settle_alone,
    workload::new_columns_round_trip,
    admin::a_key_taken_meanwhile_leaves_the_row_dead,
    history::a_completed_command_moves_to_history_and_every_read_finds_it,
    history::a_stale_success_stamp_moves_nothing,
    history::a_completion_waiting_on_a_new_lease_moves_nothing,
    history::the_sweep_moves_left_completed_rows_and_deletes_old_history,
    history::an_upgrade_keeps_every_row_and_work_goes_on,
    history::the_version_4_columns_move_to_history_with_the_row,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_stamp_and_claim_dropped_mid_string_leaves_no_transaction() {
    stamp::sqlite_stamp_and_claim_dropped_mid_string_leaves_no_transaction().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_claims_name_rows_on_tables_without_a_usable_rowid() {
    claim::sqlite_claims_name_rows_on_tables_without_a_usable_rowid().await
}
