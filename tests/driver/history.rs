//! Schema version 3: a successful stamp moves the row to the history table in its own
//! statement (or transaction), guarded by the lease token; the sweep moves completed rows
//! left in the table and deletes old history; every read of completed rows finds history.

use std::time::Duration;

use super::{Harness, ids, params};
use crate::command::{CommandId, State};
use crate::engine::admin::{
    CommandGetManyParams, CommandHeadParams, CommandListParams, FinishedDeleteBatchParams,
    FinishedFilter, FinishedKind, ListState, StateCountParams,
};
use crate::engine::{CommandSetStateManyParams, Lease, SetState, StateChange, SweepParams};

fn completed(id: &CommandId, token: crate::command::LeaseToken) -> SetState {
    SetState {
        lease: Lease {
            id: id.clone(),
            token,
        },
        change: StateChange::Completed,
    }
}

/// A completed command is in history, not in the table, and every read finds it: by id,
/// by id with its payload cut, among several ids, in the completed listing (with keyset
/// paging), in the counts; a purge of completed rows deletes it there.
pub(crate) async fn a_completed_command_moves_to_history_and_every_read_finds_it(engine: &str) {
    let h = Harness::new(engine, "histmove").await;
    let a = h.insert("t").await;
    let b = h.insert("t").await;
    let pending = h.insert("t").await;
    let (token, rows) = h.claim(2).await;
    assert_eq!(ids(&rows).len(), 2);
    let changes: Vec<SetState> = rows.iter().map(|r| completed(&r.lease.id, token)).collect();
    let stamped = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams { changes: &changes })
        .await
        .expect("stamp");
    assert_eq!(stamped, 2, "{engine}");
    let processed = format!("{} IS NOT NULL", h.q("ProcessedAt"));
    assert_eq!(
        h.count(&processed).await,
        0,
        "{engine}: nothing completed in the table"
    );
    assert_eq!(
        h.count("1 = 1").await,
        1,
        "{engine}: only the pending row stays"
    );
    assert_eq!(
        h.count_history(&processed).await,
        2,
        "{engine}: both in history"
    );
    let lease_kept = format!("{} IS NOT NULL", h.q("LockToken"));
    assert_eq!(
        h.count_history(&lease_kept).await,
        0,
        "{engine}: no lease in history"
    );

    for id in [&a, &b] {
        let row = h.get(id).await;
        assert_eq!(row.state(chrono::Utc::now()), State::Completed, "{engine}");
        let head = h
            .driver
            .command_head(&CommandHeadParams { id, max_chars: 10 })
            .await
            .expect("head")
            .expect("found in history");
        assert!(head.row.processed_at.is_some(), "{engine}");
    }
    let many = h
        .driver
        .command_get_many(&CommandGetManyParams {
            ids: &[a.clone(), b.clone(), pending.clone()],
        })
        .await
        .expect("get many");
    assert_eq!(many.len(), 3, "{engine}: history and table rows alike");

    let list = |after: Option<CommandId>| CommandListParams {
        state: ListState::Completed,
        type_name: None,
        queue: None,
        limit: 1,
        after,
        before: None,
    };
    let first = h.driver.command_list(&list(None)).await.expect("list");
    assert_eq!(first.len(), 1, "{engine}");
    let second = h
        .driver
        .command_list(&list(Some(first[0].id.clone())))
        .await
        .expect("list");
    assert_eq!(second.len(), 1, "{engine}: keyset paging through history");
    assert_ne!(first[0].id, second[0].id);
    let third = h
        .driver
        .command_list(&list(Some(second[0].id.clone())))
        .await
        .expect("list");
    assert!(third.is_empty(), "{engine}");

    let counts = h
        .driver
        .state_count(&StateCountParams::default())
        .await
        .expect("count");
    assert_eq!((counts[0].completed, counts[0].due), (2, 1), "{engine}");

    let filter = FinishedFilter {
        kind: FinishedKind::Completed,
        before: h.driver.clock_now().await.expect("now") + chrono::Duration::seconds(1),
        queue: None,
        type_name: None,
    };
    assert_eq!(h.driver.finished_count(&filter).await.expect("count"), 2);
    let purged = h
        .driver
        .finished_delete_batch(&FinishedDeleteBatchParams { filter, limit: 10 })
        .await
        .expect("purge");
    assert_eq!(purged, 2, "{engine}: a purge deletes history");
    assert_eq!(h.count_history("1 = 1").await, 0, "{engine}");
    assert_eq!(h.count("1 = 1").await, 1, "{engine}: the pending row stays");
}

/// A success stamp under a lease the row no longer carries moves nothing, alone or
/// together with a claim; under the current lease it moves the row once.
pub(crate) async fn a_stale_success_stamp_moves_nothing(engine: &str) {
    let h = Harness::new(engine, "histstale").await;
    let id = h.insert("t").await;
    let (first, _) = h.claim(1).await;
    h.update(&id, &format!("{} = {}", h.q("LockedUntil"), h.ago(1)))
        .await;
    let (second, rows) = h.claim(1).await;
    assert_eq!(ids(&rows), vec![id.clone()]);
    let stale = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[completed(&id, first)],
        })
        .await
        .expect("stamp");
    assert_eq!(stale, 0, "{engine}");
    let (stale, _) = h
        .stamp_and_claim(&[completed(&id, first)], &params(1))
        .await
        .expect("stamp and claim");
    assert_eq!(stale, 0, "{engine}");
    assert_eq!(h.count_history("1 = 1").await, 0, "{engine}: nothing moved");
    assert_eq!(
        h.count("1 = 1").await,
        1,
        "{engine}: the row is still leased here"
    );
    let (current, _) = h
        .stamp_and_claim(&[completed(&id, second)], &params(1))
        .await
        .expect("stamp and claim");
    assert_eq!(current, 1, "{engine}");
    assert_eq!(h.count("1 = 1").await, 0, "{engine}");
    assert_eq!(h.count_history("1 = 1").await, 1, "{engine}");
}

/// A success stamp that waits on a row another claimer has just leased again (its
/// lease lapsed; the new lease not yet committed) reads the row as that commit left it:
/// nothing is stamped, nothing copied to history, and the row stays leased.
pub(crate) async fn a_completion_waiting_on_a_new_lease_moves_nothing(engine: &str) {
    const ANOTHER: &str = "0190a000-0000-7000-8000-0000000000a1";
    let h = Harness::new(engine, "histrace").await;
    let id = h.insert("t").await;
    let (first, _) = h.claim(1).await;
    let relapse = format!(
        "UPDATE {} SET {} = '{ANOTHER}' WHERE {} = '{id}'",
        h.t,
        h.q("LockToken"),
        h.q("Id")
    );
    let (leased, release) = (
        tokio::sync::oneshot::channel(),
        tokio::sync::oneshot::channel::<()>(),
    );
    let holder = tokio::spawn(hold_uncommitted(
        h.engine,
        h.url.clone(),
        relapse,
        leased.0,
        release.1,
    ));
    leased.1.await.expect("the new lease is written");
    let driver = h.driver.clone();
    let stamp_id = id.clone();
    let stamping = tokio::spawn(async move {
        driver
            .command_set_state_many(&CommandSetStateManyParams {
                changes: &[completed(&stamp_id, first)],
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !stamping.is_finished(),
        "{engine}: the stamp waits for the new lease"
    );
    release.0.send(()).expect("the holder waits");
    holder.await.expect("the holder commits");
    let stamped = stamping.await.expect("join").expect("stamp");
    assert_eq!(stamped, 0, "{engine}: the lease is another's");
    assert_eq!(
        h.count_history("1 = 1").await,
        0,
        "{engine}: nothing copied"
    );
    let leased_again = format!("{} = '{ANOTHER}'", h.q("LockToken"));
    assert_eq!(h.count(&leased_again).await, 1, "{engine}: still leased");
}

/// Runs `sql` in a transaction on a connection of its own, says so on `done`, and commits
/// when `release` fires.
async fn hold_uncommitted(
    engine: crate::ident::Engine,
    url: String,
    sql: String,
    done: tokio::sync::oneshot::Sender<()>,
    release: tokio::sync::oneshot::Receiver<()>,
) {
    use crate::ident::Engine;
    use sqlx::Connection;
    let begin = if engine == Engine::Sqlite {
        "BEGIN IMMEDIATE"
    } else {
        "BEGIN"
    };
    let script = sqlx::AssertSqlSafe(format!("{begin}; {sql}"));
    let commit = sqlx::AssertSqlSafe("COMMIT".to_owned());
    macro_rules! hold_on {
        ($conn:ty) => {{
            let mut conn = <$conn>::connect(&url).await.expect("connect");
            sqlx::raw_sql(script)
                .execute(&mut conn)
                .await
                .expect("lease");
            let _ = done.send(());
            let _ = release.await;
            sqlx::raw_sql(commit)
                .execute(&mut conn)
                .await
                .expect("commit");
        }};
    }
    match engine {
        Engine::Postgres => hold_on!(sqlx::PgConnection),
        Engine::Mysql => hold_on!(sqlx::MySqlConnection),
        _ => hold_on!(sqlx::SqliteConnection),
    }
}

/// The sweep moves the completed rows an older icq (or another program) left in the
/// table into history, in bounded batches, and deletes history older than the retention;
/// pending and dead rows stay where they are.
pub(crate) async fn the_sweep_moves_left_completed_rows_and_deletes_old_history(engine: &str) {
    let h = Harness::new(engine, "histsweep").await;
    let (processed, dead) = (h.q("ProcessedAt"), h.q("DeadLetteredAt"));
    let day = 86_400;
    // What a version-2 stamp leaves: completed in the table.
    for (ty, age) in [
        ("old", 10 * day),
        ("old", 10 * day),
        ("old", 10 * day),
        ("new", day),
    ] {
        let id = h.insert(ty).await;
        h.update(&id, &format!("{processed} = {}", h.ago(age)))
            .await;
    }
    let id = h.insert("dead").await;
    h.update(&id, &format!("{dead} = {}", h.ago(30 * day)))
        .await;
    h.insert("pending").await;
    let sweep = |limit| SweepParams {
        older_than: Duration::from_secs(7 * day as u64),
        limit,
    };
    let done = h
        .driver
        .completed_delete_batch(&sweep(2))
        .await
        .expect("sweep")
        .expect("not locked");
    assert!(done >= 2, "{engine}: a batch moved {done}");
    assert_eq!(
        h.count(&format!("{processed} IS NOT NULL")).await,
        2,
        "{engine}: at most the batch limit moved"
    );
    while h
        .driver
        .completed_delete_batch(&sweep(2))
        .await
        .expect("sweep")
        .expect("not locked")
        > 0
    {}
    assert_eq!(
        h.count(&format!("{processed} IS NOT NULL")).await,
        0,
        "{engine}"
    );
    let ty = h.q("Type");
    assert_eq!(
        h.count_history(&format!("{ty} = 'new'")).await,
        1,
        "{engine}: kept"
    );
    assert_eq!(
        h.count_history(&format!("{ty} = 'old'")).await,
        0,
        "{engine}: deleted"
    );
    assert_eq!(
        h.count("1 = 1").await,
        2,
        "{engine}: the dead and the pending row stay"
    );
}

/// Tables of versions 1 and 2 with pending, running, completed and dead rows, upgraded by
/// the schema's upgrade script: every row is kept (the completed one moved to history), the
/// driver sees version 3 at once, and work goes on: the pending row completes into history.
pub(crate) async fn an_upgrade_keeps_every_row_and_work_goes_on(engine: &str) {
    for from in [1, 2] {
        let h = if from == 1 {
            Harness::v1(engine, "histupv1").await
        } else {
            Harness::v2(engine, "histupv2").await
        };
        let (processed, dead, until) = (
            h.q("ProcessedAt"),
            h.q("DeadLetteredAt"),
            h.q("LockedUntil"),
        );
        let done = h.insert("completed").await;
        h.update(&done, &format!("{processed} = {}", h.ago(60)))
            .await;
        let died = h.insert("dead").await;
        h.update(&died, &format!("{dead} = {}", h.ago(60))).await;
        let running = h.insert("running").await;
        h.update(&running, &format!("{until} = {}", h.ago(-600)))
            .await;
        let pending = h.insert("pending").await;
        assert_eq!(h.driver.schema_version().await.expect("version"), from);

        let upgrade = crate::schema::render_upgrade_from(h.engine, &h.table, from);
        h.driver.schema_apply(&upgrade.up).await.expect("upgrade");
        assert_eq!(
            h.driver.schema_version().await.expect("version"),
            crate::schema::SCHEMA_VERSION,
            "{engine}"
        );
        assert_eq!(h.count("1 = 1").await, 3, "{engine} from {from}");
        assert_eq!(h.count_history("1 = 1").await, 1, "{engine} from {from}");
        for id in [&done, &died, &running, &pending] {
            h.get(id).await;
        }
        let (token, rows) = h.claim(10).await;
        assert_eq!(ids(&rows), vec![pending.clone()], "{engine} from {from}");
        let stamped = h
            .driver
            .command_set_state_many(&CommandSetStateManyParams {
                changes: &[completed(&pending, token)],
            })
            .await
            .expect("stamp");
        assert_eq!(stamped, 1);
        assert_eq!(h.count_history("1 = 1").await, 2, "{engine} from {from}");

        // And back: every history row returns to the table, completed.
        h.driver
            .schema_apply(&upgrade.down)
            .await
            .expect("downgrade");
        assert_eq!(h.driver.schema_version().await.expect("version"), from);
        assert_eq!(h.count("1 = 1").await, 4, "{engine} back to {from}");
        assert_eq!(
            h.count(&format!("{processed} IS NOT NULL")).await,
            2,
            "{engine} back to {from}"
        );
    }
}

/// Schema version 4: the keys and the attempt errors a row carries (written by plain SQL,
/// as another program would) are decoded when it is claimed, and travel with it into
/// history, by the stamp's move and by the sweep's.
pub(crate) async fn the_version_4_columns_move_to_history_with_the_row(engine: &str) {
    let h = Harness::new(engine, "histv4").await;
    let (ck, ok, errors) = (h.q("ConcurrencyKey"), h.q("OrderKey"), h.q("Errors"));
    let assignments = format!(
        r#"{ck} = 'tenant-1', {ok} = 'order-7', {errors} = '[{{"attempt":1,"error":"boom"}}]'"#
    );
    let keyed = |id| h.update(id, &assignments);
    let stamped = h.insert("t").await;
    keyed(&stamped).await;
    let (token, rows) = h.claim(1).await;
    assert_eq!(ids(&rows), vec![stamped.clone()], "{engine}");
    let claimed = &rows[0].row;
    assert_eq!(
        claimed.concurrency_key.as_deref(),
        Some("tenant-1"),
        "{engine}"
    );
    assert_eq!(claimed.order_key.as_deref(), Some("order-7"), "{engine}");
    assert!(
        claimed
            .errors
            .as_deref()
            .is_some_and(|e| e.contains("boom")),
        "{engine}: {:?}",
        claimed.errors
    );
    h.driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[completed(&stamped, token)],
        })
        .await
        .expect("stamp");

    // A completed row another program left in the table: the sweep moves it.
    let swept = h.insert("t").await;
    keyed(&swept).await;
    let processed = h.q("ProcessedAt");
    h.update(&swept, &format!("{processed} = {}", h.ago(60)))
        .await;
    let sweep = SweepParams {
        older_than: Duration::from_secs(7 * 86_400),
        limit: 10,
    };
    h.driver
        .completed_delete_batch(&sweep)
        .await
        .expect("sweep")
        .expect("not locked");

    for id in [&stamped, &swept] {
        let row = h.get(id).await;
        assert_eq!(row.state(chrono::Utc::now()), State::Completed, "{engine}");
        assert_eq!(row.concurrency_key.as_deref(), Some("tenant-1"), "{engine}");
        assert_eq!(row.order_key.as_deref(), Some("order-7"), "{engine}");
        assert!(
            row.errors.as_deref().is_some_and(|e| e.contains("boom")),
            "{engine}: {:?}",
            row.errors
        );
    }
    let kept = format!("{ok} = 'order-7' AND {ck} = 'tenant-1' AND {errors} IS NOT NULL");
    assert_eq!(h.count_history(&kept).await, 2, "{engine}: both in history");
    assert_eq!(
        h.count("1 = 1").await,
        0,
        "{engine}: none left in the table"
    );
}
