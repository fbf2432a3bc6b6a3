//! Claims: which rows, in which order, how many, under which lease ("Claim").

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;

use super::{Harness, ids, near, params, sorted};
use crate::command::CommandId;
use crate::engine::{
    CommandInsertManyParams, CommandSetStateManyParams, Lease, SetState, StateChange,
};

/// Due rows come in `RunAt` order: a claim of `limit` takes the `limit` earliest due
/// rows, never more, and leases them (token, `LockedUntil = now + lease`, `Attempts + 1`).
/// Scheduled, completed, dead and live-leased rows are not claimed; a row whose lease has
/// expired is. (The contract orders the claim by `RunAt` only; rows with equal `RunAt` are in
/// no promised order, so every row here has its own `RunAt`.)
pub(crate) async fn claims_due_rows_in_run_at_order_up_to_the_limit(engine: &str) {
    let h = Harness::new(engine, "order").await;
    let (run_at, locked, token) = (h.q("RunAt"), h.q("LockedUntil"), h.q("LockToken"));
    // Inserted out of RunAt order, so insertion (and id) order cannot pass for RunAt order.
    let mut due = Vec::new();
    for seconds_ago in [30, 50, 10, 40, 20] {
        let id = h.insert("t").await;
        h.update(&id, &format!("{run_at} = {}", h.ago(seconds_ago)))
            .await;
        due.push((seconds_ago, id));
    }
    // The lease of an earlier claim that expired an hour ago: claimable, and the oldest.
    let expired = h.insert("t").await;
    h.update(
        &expired,
        &format!(
            "{run_at} = {}, {locked} = {}, {token} = '00000000-0000-4000-8000-00000000000e', {} = 1",
            h.ago(3600),
            h.ago(3590),
            h.q("Attempts")
        ),
    )
    .await;
    due.push((3600, expired.clone()));
    due.sort_by_key(|(seconds_ago, _)| std::cmp::Reverse(*seconds_ago));
    let due: Vec<CommandId> = due.into_iter().map(|(_, id)| id).collect();

    // Not due: scheduled for later, completed, dead, held by a live lease.
    let later = h.insert("t").await;
    h.update(&later, &format!("{run_at} = {}", h.ago(-3600)))
        .await;
    let completed = h.insert("t").await;
    h.update(
        &completed,
        &format!(
            "{run_at} = {}, {} = {}",
            h.ago(7200),
            h.q("ProcessedAt"),
            h.ago(7000)
        ),
    )
    .await;
    let dead = h.insert("t").await;
    h.update(
        &dead,
        &format!(
            "{run_at} = {}, {} = {}",
            h.ago(7200),
            h.q("DeadLetteredAt"),
            h.ago(7000)
        ),
    )
    .await;
    let held = h.insert("t").await;
    h.update(
        &held,
        &format!(
            "{run_at} = {}, {locked} = {}, {token} = '00000000-0000-4000-8000-0000000000aa'",
            h.ago(7200),
            h.ago(-600)
        ),
    )
    .await;

    let before = Utc::now();
    let (first_token, first) = h.claim(3).await;
    assert_eq!(
        ids(&first),
        sorted(&due[..3].iter().collect::<Vec<_>>()),
        "{engine}: a claim of 3 takes the 3 earliest due rows by RunAt"
    );
    for claimed in &first {
        assert_eq!(claimed.lease.token, first_token);
        assert_eq!(claimed.row.id, claimed.lease.id);
        assert_eq!(
            claimed.row.lock_token,
            Some(first_token),
            "{engine}: returned as leased"
        );
        assert!(claimed.row.defects.is_empty(), "{:?}", claimed.row.defects);
        let stored = h.get(&claimed.lease.id).await;
        assert_eq!(
            stored.lock_token,
            Some(first_token),
            "{engine}: token stored"
        );
        near(
            stored.locked_until.expect("LockedUntil set"),
            before + chrono::Duration::seconds(60),
            Duration::from_secs(5),
            "LockedUntil = now + lease",
        );
        let expected_attempts = if claimed.lease.id == expired { 2 } else { 1 };
        assert_eq!(stored.attempts, expected_attempts, "{engine}: Attempts + 1");
        assert_eq!(
            claimed.row.attempts, expected_attempts,
            "{engine}: returned after + 1"
        );
    }

    let (second_token, second) = h.claim(10).await;
    assert_ne!(first_token, second_token);
    assert_eq!(
        ids(&second),
        sorted(&due[3..].iter().collect::<Vec<_>>()),
        "{engine}: the rest of the due rows, and nothing that is not due"
    );
    let (_, third) = h.claim(10).await;
    assert!(
        third.is_empty(),
        "{engine}: nothing left: {:?}",
        ids(&third)
    );

    // The rows that were not due are untouched.
    assert_eq!(h.get(&later).await.attempts, 0);
    assert_eq!(h.get(&completed).await.lock_token, None);
    assert_eq!(h.get(&dead).await.lock_token, None);
    assert_eq!(
        h.get(&held)
            .await
            .lock_token
            .map(|t| t.to_string())
            .as_deref(),
        Some("00000000-0000-4000-8000-0000000000aa"),
        "{engine}: a live lease is never taken over"
    );
}

/// Rows younger than the processing delay (by `CreatedAt`) are not claimed; older ones
/// are.
pub(crate) async fn claim_skips_rows_younger_than_the_processing_delay(engine: &str) {
    let h = Harness::new(engine, "delay").await;
    let created = h.q("CreatedAt");
    let old = h.insert("t").await;
    h.update(&old, &format!("{created} = {}", h.ago(120))).await;
    let young = h.insert("t").await;
    h.update(&young, &format!("{created} = {}", h.ago(30)))
        .await;
    let fresh = h.insert("t").await;

    let mut delayed = params(10);
    delayed.processing_delay = Duration::from_secs(60);
    let rows = h.driver.command_claim(&delayed).await.expect("claim");
    assert_eq!(
        ids(&rows),
        vec![old],
        "{engine}: only the row older than 60 s"
    );

    let mut delayed = params(10);
    delayed.processing_delay = Duration::from_secs(10);
    let rows = h.driver.command_claim(&delayed).await.expect("claim");
    assert_eq!(
        ids(&rows),
        vec![young],
        "{engine}: 30 s old is past a 10 s delay"
    );

    let (_, rows) = h.claim(10).await;
    assert_eq!(
        ids(&rows),
        vec![fresh],
        "{engine}: no delay takes the fresh row"
    );
}

/// With `types`, a claim takes only rows of those types; the others stay pending.
pub(crate) async fn claim_with_types_takes_only_those_types(engine: &str) {
    let h = Harness::new(engine, "types").await;
    let a = h.insert("a.mine").await;
    let b = h.insert("b.mine").await;
    let other = h.insert("c.other").await;
    let mut only = params(10);
    only.types = Some(vec!["a.mine".to_owned(), "b.mine".to_owned()].into());
    let rows = h.driver.command_claim(&only).await.expect("claim");
    assert_eq!(ids(&rows), sorted(&[&a, &b]), "{engine}");
    let rest = h.get(&other).await;
    assert_eq!(
        (rest.attempts, rest.lock_token),
        (0, None),
        "{engine}: untouched"
    );
}

/// Two drivers (two replicas, two pools) claiming the same table at once get disjoint
/// rows, and together every row, each leased by the claim that returned it.
pub(crate) async fn two_claimers_get_disjoint_rows_and_together_all(engine: &str) {
    let h = Harness::new(engine, "race").await;
    let commands: Vec<_> = (0..300)
        .map(|i| crate::command::NewCommand::new("t", serde_json::json!({ "n": i })))
        .collect();
    let all: HashSet<CommandId> = h
        .driver
        .command_insert_many(&CommandInsertManyParams {
            commands: &commands,
        })
        .await
        .expect("insert")
        .into_iter()
        .map(|s| s.id)
        .collect();
    let other = h.another_driver().await;
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let claimer = |driver: std::sync::Arc<dyn crate::engine::Backend>| {
        let start = start.clone();
        tokio::spawn(async move {
            start.wait().await;
            let mut got = Vec::new();
            loop {
                let params = params(7);
                let rows = driver.command_claim(&params).await.expect("claim");
                if rows.is_empty() {
                    return got;
                }
                assert!(rows.len() <= 7, "a claim of 7 returned {}", rows.len());
                got.extend(rows.into_iter().map(|r| (r.lease.id, params.token)));
            }
        })
    };
    let (a, b) = tokio::join!(claimer(h.driver.clone()), claimer(other));
    let (a, b) = (a.expect("claimer a"), b.expect("claimer b"));
    let a_ids: HashSet<_> = a.iter().map(|(id, _)| id.clone()).collect();
    let b_ids: HashSet<_> = b.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(a_ids.len(), a.len(), "{engine}: claimer a got a row twice");
    assert_eq!(b_ids.len(), b.len(), "{engine}: claimer b got a row twice");
    let both: Vec<_> = a_ids.intersection(&b_ids).collect();
    assert!(both.is_empty(), "{engine}: claimed by both: {both:?}");
    let union: HashSet<_> = a_ids.union(&b_ids).cloned().collect();
    assert_eq!(union, all, "{engine}: together every row");
    eprintln!("{engine}: claimer a took {}, b took {}", a.len(), b.len());
    for (id, token) in a.iter().chain(&b).step_by(13) {
        let stored = h.get(id).await;
        assert_eq!(
            stored.lock_token,
            Some(*token),
            "{engine}: {id} leased by its claim"
        );
        assert_eq!(stored.attempts, 1, "{engine}: {id} claimed once");
    }
    assert_eq!(
        h.count(&format!("{} = 1", h.q("Attempts"))).await,
        300,
        "{engine}: every row claimed exactly once"
    );
}

/// A row that becomes claimable again behind the rows already claimed (its lease released,
/// as a crashed replica's lapses) is claimed again soon, and the rows after it are not
/// lost either. On PostgreSQL a claim starts after the last row it claimed
/// (`src/engine/postgres/cursor.rs`) and returns to the head at least every 500 ms; the
/// other engines always scan from the head.
pub(crate) async fn a_row_released_behind_the_last_claim_is_claimed_again_soon(engine: &str) {
    let h = Harness::new(engine, "behind").await;
    let run_at = h.q("RunAt");
    let mut rows = Vec::new();
    for seconds_ago in [50, 40, 30, 20, 10] {
        let id = h.insert("t").await;
        h.update(&id, &format!("{run_at} = {}", h.ago(seconds_ago)))
            .await;
        rows.push(id);
    }
    // A full claim: the cursor (PostgreSQL) moves past the second row.
    let (token, first) = h.claim(2).await;
    let mut claimed_first = ids(&first);
    claimed_first.sort();
    assert_eq!(claimed_first, sorted(&[&rows[0], &rows[1]]));
    let released = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[SetState {
                lease: Lease {
                    id: rows[0].clone(),
                    token,
                },
                change: StateChange::Release { run_in: None },
            }],
        })
        .await
        .expect("release");
    assert_eq!(released, 1);

    let started = std::time::Instant::now();
    let mut seen: HashSet<CommandId> = HashSet::new();
    while !(seen.contains(&rows[0]) && rows[2..].iter().all(|id| seen.contains(id))) {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{engine}: after {:?} still not claimed: {:?}",
            started.elapsed(),
            rows.iter()
                .filter(|id| !seen.contains(*id))
                .collect::<Vec<_>>()
        );
        let (_, claimed) = h.claim(1).await;
        for id in ids(&claimed) {
            assert!(seen.insert(id.clone()), "{engine}: {id} claimed twice");
        }
        if claimed.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(!seen.contains(&rows[1]), "{engine}: a held row was claimed");
    // Nothing else is due: the next claims come back empty.
    assert!(h.claim(5).await.1.is_empty());
}

/// Many claims of a backlog whose rows share one `RunAt` (a bulk `COPY`/multi-row insert
/// gives every row the same `now()`): every row is claimed exactly once, in full batches.
pub(crate) async fn a_backlog_with_one_run_at_is_claimed_once_in_full_batches(engine: &str) {
    let h = Harness::new(engine, "same_run_at").await;
    let commands: Vec<crate::command::NewCommand> = (0..95)
        .map(|i| crate::command::NewCommand::new("t", serde_json::json!({ "i": i })))
        .collect();
    let inserted = h
        .driver
        .command_insert_many(&CommandInsertManyParams {
            commands: &commands,
        })
        .await
        .expect("insert");
    h.exec(&format!(
        "UPDATE {} SET {} = {}",
        h.t,
        h.q("RunAt"),
        h.ago(60)
    ))
    .await;
    let mut seen: HashSet<CommandId> = HashSet::new();
    let mut sizes = Vec::new();
    loop {
        let (_, claimed) = h.claim(10).await;
        if claimed.is_empty() {
            break;
        }
        sizes.push(claimed.len());
        for id in ids(&claimed) {
            assert!(seen.insert(id.clone()), "{engine}: {id} claimed twice");
        }
    }
    assert_eq!(
        seen.len(),
        inserted.len(),
        "{engine}: not every row was claimed"
    );
    assert_eq!(sizes, [10, 10, 10, 10, 10, 10, 10, 10, 10, 5], "{engine}");
}

/// SQLite: claims name the rows they pick by `rowid`, or by `"Id"` where the table has no
/// usable one. On each variant another program might create — `WITHOUT ROWID`, a column
/// named `rowid` (it takes that name: `_rowid_` is used), columns taking every name of it
/// — due rows are claimed in order and once, and a stamp-and-claim works.
pub(crate) async fn sqlite_claims_name_rows_on_tables_without_a_usable_rowid() {
    type Edit = fn(String) -> String;
    let variants: [(&str, Edit); 3] = [
        ("WITHOUT ROWID", |ddl| {
            ddl.replacen("\n);", "\n) WITHOUT ROWID;", 1)
        }),
        ("a column named rowid", |ddl| {
            ddl.replacen("\n);", ",\n    \"rowid\" INTEGER NULL\n);", 1)
        }),
        ("columns named rowid, _rowid_ and OID", |ddl| {
            ddl.replacen(
                "\n);",
                ",\n    \"rowid\" INTEGER NULL, \"_rowid_\" INTEGER NULL, \"OID\" INTEGER NULL\n);",
                1,
            )
        }),
    ];
    for (what, edit) in variants {
        let h = Harness::with_ddl("sqlite", "rowkey", edit).await;
        let run_at = h.q("RunAt");
        let mut due = Vec::new();
        for seconds_ago in [30, 20, 10] {
            let id = h.insert("t").await;
            h.update(&id, &format!("{run_at} = {}", h.ago(seconds_ago)))
                .await;
            due.push(id);
        }
        let (token, first) = h.claim(2).await;
        assert_eq!(
            ids(&first),
            sorted(&[&due[0], &due[1]]),
            "{what}: the two earliest"
        );
        let changes = [SetState {
            lease: Lease {
                id: due[0].clone(),
                token,
            },
            change: StateChange::Completed,
        }];
        let claim = params(10);
        let (stamped, rows) = h
            .stamp_and_claim(&changes, &claim)
            .await
            .unwrap_or_else(|e| panic!("{what}: stamp and claim: {e}"));
        assert_eq!(
            (stamped, ids(&rows)),
            (1, vec![due[2].clone()]),
            "{what}: the last due row, once"
        );
        assert!(h.get(&due[0]).await.processed_at.is_some(), "{what}");
        assert_eq!(h.get(&due[1]).await.lock_token, Some(token), "{what}");
    }
}
