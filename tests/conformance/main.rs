//! The conformance suite: the same queue semantics checked against PostgreSQL, SQLite and
//! MariaDB, each test in a private database of its own.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod bulk;
mod embedding;
mod ordered;
mod semantics;
mod unique_keys;

/// Expands each listed test into one `#[tokio::test]` per runtime engine.
macro_rules! for_each_engine {
    ($($name:ident),* $(,)?) => {
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::semantics::$name("postgres").await } )* }
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::semantics::$name("sqlite").await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::semantics::$name("mysql").await } )* }
    };
}

/// Expands each listed test of [`unique_keys`] into one `#[tokio::test]` per engine.
macro_rules! cli_for_each_engine {
    ($($name:ident),* $(,)?) => {
        mod cli_postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::unique_keys::$name("postgres").await } )* }
        mod cli_sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::unique_keys::$name("sqlite").await } )* }
        mod cli_mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::unique_keys::$name("mysql").await } )* }
    };
}

/// Expands each listed test of [`embedding`] into one `#[tokio::test]` per engine.
macro_rules! embedding_for_each_engine {
    ($($name:ident),* $(,)?) => {
        mod embed_postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::embedding::$name("postgres").await } )* }
        mod embed_sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::embedding::$name("sqlite").await } )* }
        mod embed_mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::embedding::$name("mysql").await } )* }
    };
}

/// Expands each listed test of [`bulk`] into one `#[tokio::test]` per engine.
macro_rules! bulk_for_each_engine {
    ($($name:ident),* $(,)?) => {
        mod bulk_postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::bulk::$name("postgres").await } )* }
        mod bulk_sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::bulk::$name("sqlite").await } )* }
        mod bulk_mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::bulk::$name("mysql").await } )* }
    };
}

bulk_for_each_engine!(
    schedule_many_in_commits_all_or_rolls_back_none,
    schedule_many_in_keeps_unique_keys_in_the_batch_and_against_pending_rows,
    schedule_many_in_refuses_a_bad_command_by_its_index_and_writes_none,
);

/// Expands each listed test of [`ordered`] into one `#[tokio::test]` per engine.
macro_rules! ordered_for_each_engine {
    ($($name:ident),* $(,)?) => {
        mod ordered_postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::ordered::$name("postgres").await } )* }
        mod ordered_sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::ordered::$name("sqlite").await } )* }
        mod ordered_mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 4)] async fn $name() { crate::ordered::$name("mysql").await } )* }
    };
}

ordered_for_each_engine!(
    one_key_runs_in_order_across_four_processors,
    order_keys_hold_in_a_limited_queue,
    a_failing_head_holds_its_successors,
    plain_sql_rows_with_an_order_key_run_in_order,
    failing_twice_then_succeeding_shows_both_errors,
    a_hostile_errors_value_does_not_fail_the_stamp,
    keys_on_an_older_table_name_the_upgrade,
    every_insert_path_writes_the_keys,
);

/// Expands each listed test of [`admin`] into one `#[tokio::test]` per engine.
macro_rules! admin_for_each_engine {
    ($($name:ident),* $(,)?) => {
        mod admin_postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::admin::$name("postgres").await } )* }
        mod admin_sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::admin::$name("sqlite").await } )* }
        mod admin_mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { crate::admin::$name("mysql").await } )* }
    };
}

admin_for_each_engine!(
    pending_counts_each_state_by_type_and_queue,
    list_pages_each_state_in_its_order,
    show_reads_a_plain_sql_row_whole,
    dead_letters_list_newest_first_and_filter,
    cancel_dead_letters_pending_rows,
    requeue_puts_dead_letters_back,
    replay_copies_finished_rows_as_new_work,
    purge_deletes_finished_rows_by_kind_and_age,
);

embedding_for_each_engine!(
    the_applications_pool_schedules_in_its_transaction_and_drains,
    schema_apply_upgrades_version_1_and_tolerates_replicas,
);

cli_for_each_engine!(
    eight_schedule_processes_with_one_key_create_one_row,
    bad_values_and_version_1_tables_are_refused_with_the_reason,
    keys_and_queues_differing_in_trailing_spaces_stay_apart,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_pad_space_table_keeps_names_apart_and_names_its_fix() {
    unique_keys::a_pad_space_mysql_table_keeps_names_apart_and_names_its_fix().await
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
