//! The conformance suite: the same queue semantics checked against PostgreSQL, SQLite and
//! MariaDB, each test in a private database of its own.

#[path = "../support/mod.rs"]
mod support;

mod semantics;

/// Expands each listed test into one `#[tokio::test]` per runtime engine.
macro_rules! for_each_engine {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::semantics::$name("postgres").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::semantics::$name("sqlite").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::semantics::$name("mysql").await } )* }
    };
}

for_each_engine!(
    rollback_schedules_nothing_and_commit_runs_once,
    exec_handler_receives_payload_and_context,
    failures_follow_the_backoff_curve_then_dead_letter,
    panic_timeout_and_exit_status_each_consume_an_attempt,
    unknown_type_and_missing_role_dead_letter_at_once,
    four_processors_drain_5000_exactly_once,
    stale_lease_outcome_is_dropped,
    lease_is_renewed_while_the_handler_runs,
    shutdown_releases_unstarted_and_finishes_in_flight,
    shutdown_releases_buffered_rows_at_once,
    processing_delay_holds_young_rows_back,
    retention_sweep_loop_keeps_dead_letters,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_insert_by_another_connection_wakes_processor_at_once() {
    semantics::notify_wakes_processor_without_polling().await
}
