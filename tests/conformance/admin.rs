//! The operator operations (`icq::admin`: pending, list, show, dead letters, cancel,
//! requeue, replay, purge) through the library on every engine, over rows another program
//! wrote with plain SQL: each one's answer, and what it changed, checked with SQL.
//!
//! `tests/cli/admin.rs` checks the subcommands' output, messages and exit codes; this
//! file checks the engine under them: the same calls give the same answers and the same
//! writes on PostgreSQL, SQLite and MariaDB.

use std::time::Duration;

use icq::admin::{
    self, CancelTarget, DeadLetterQuery, ListRequest, ListState, NoProgress, PendingRequest,
    PurgeRequest, RequeueTarget,
};
use icq::{CommandId, ConnectOptions, Error, Queue, State, TableName};

use crate::support::TestDb;

/// `mail.send`, queue `mail`, due since 2026-01-01.
const DUE: &str = "60000000-0000-4000-8000-000000000001";
/// `mail.send`, queue `mail`, due in 2999.
const SCHEDULED: &str = "60000000-0000-4000-8000-000000000002";
/// `report.build`, due since 2026-01-02, leased until 2999 (a processor runs it).
const RUNNING: &str = "60000000-0000-4000-8000-000000000003";
/// `mail.send`, queue `mail`, dead since 2026-01-02 after 5 attempts.
const DEAD_OLD: &str = "60000000-0000-4000-8000-000000000004";
/// `report.build`, dead since 2026-01-03.
const DEAD_NEW: &str = "60000000-0000-4000-8000-000000000005";
/// `mail.send`, completed on 2026-01-01.
const DONE_OLD: &str = "60000000-0000-4000-8000-000000000006";
/// `mail.send`, completed just now.
const DONE_NEW: &str = "60000000-0000-4000-8000-000000000007";

/// The sources the operations act on: one, `default`, on `db`'s default table. The one
/// place a test builds a source.
async fn sources(db: &TestDb) -> Vec<Queue> {
    let queue = Queue::connect(
        "default",
        &db.url,
        &TableName::default(),
        &ConnectOptions::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("{}: open the queue: {e}", db.engine));
    vec![queue]
}

/// A fresh table holding one row in each state (see the constants), all written with
/// plain SQL, and the sources over it.
async fn seeded(engine: &'static str, tag: &str) -> (TestDb, Vec<Queue>) {
    let db = TestDb::with_table(engine, tag).await;
    seed(&db).await;
    let sources = sources(&db).await;
    (db, sources)
}

/// One row in each state (see the constants).
async fn seed(db: &TestDb) {
    let mail = || ("Queue", "'mail'".to_owned());
    let at = |column, when| (column, db.ts(when));
    db.insert_row(
        DUE,
        "mail.send",
        r#"{"n": 1}"#,
        &[mail(), at("RunAt", "2026-01-01T00:00:00")],
    )
    .await;
    db.insert_row(
        SCHEDULED,
        "mail.send",
        r#"{"n": 2}"#,
        &[mail(), at("RunAt", "2999-01-01T00:00:00")],
    )
    .await;
    db.insert_row(
        RUNNING,
        "report.build",
        r#"{"n": 3}"#,
        &[
            at("RunAt", "2026-01-02T00:00:00"),
            ("Attempts", "1".into()),
            ("LockToken", "'70000000-0000-4000-8000-000000000001'".into()),
            at("LockedUntil", "2999-01-01T00:00:00"),
        ],
    )
    .await;
    db.insert_row(
        DEAD_OLD,
        "mail.send",
        r#"{"n": 4, "to": "ann@example.com"}"#,
        &[
            mail(),
            ("Attempts", "5".into()),
            at("DeadLetteredAt", "2026-01-02T00:00:00"),
            ("LastError", "'SMTP 550: mailbox unavailable'".into()),
            ("UserId", "'user-7'".into()),
        ],
    )
    .await;
    db.insert_row(
        DEAD_NEW,
        "report.build",
        r#"{"n": 5}"#,
        &[
            ("Attempts", "1".into()),
            at("DeadLetteredAt", "2026-01-03T00:00:00"),
            ("LastError", "'no handler'".into()),
        ],
    )
    .await;
    db.insert_row(
        DONE_OLD,
        "mail.send",
        r#"{"n": 6}"#,
        &[
            ("Attempts", "1".into()),
            at("ProcessedAt", "2026-01-01T00:00:00"),
        ],
    )
    .await;
    db.insert_row(
        DONE_NEW,
        "mail.send",
        r#"{"n": 7}"#,
        &[
            ("Attempts", "1".into()),
            ("ProcessedAt", db.now_sql().into()),
        ],
    )
    .await;
}

/// `SELECT COUNT(*)` of the rows matching `condition`, whose `{Column}`s are quoted.
async fn count(db: &TestDb, condition: &str) -> i64 {
    let mut condition = condition.to_owned();
    for column in [
        "Id",
        "Type",
        "Payload",
        "RunAt",
        "Attempts",
        "LockToken",
        "LockedUntil",
        "ProcessedAt",
        "DeadLetteredAt",
        "LastError",
        "Queue",
    ] {
        condition = condition.replace(&format!("{{{column}}}"), &db.q(column));
    }
    db.scalar_i64(&format!(
        "SELECT COUNT(*) FROM {} WHERE {condition}",
        db.q("InternalCommands")
    ))
    .await
}

fn id(text: &str) -> CommandId {
    text.parse().expect("a fixture id")
}

fn ids(texts: &[&str]) -> Vec<CommandId> {
    texts.iter().map(|t| id(t)).collect()
}

/// Due, scheduled, running, dead and completed counts of the whole table.
async fn states(sources: &[Queue]) -> [u64; 5] {
    let report = admin::pending(sources, false).await.unwrap();
    assert_eq!(report.rows.len(), 1, "one line for the one source");
    let c = &report.rows[0].counts;
    [c.due, c.scheduled, c.running, c.dead, c.completed]
}

/// Counts follow the rows' states, by type and by queue, and follow a row another program
/// inserts afterwards.
pub async fn pending_counts_each_state_by_type_and_queue(engine: &'static str) {
    let (db, sources) = seeded(engine, "adm_pending").await;
    assert_eq!(states(&sources).await, [1, 1, 1, 2, 2], "{engine}");

    let by_type = admin::pending(&sources, true).await.unwrap();
    let lines: Vec<(Option<&str>, [u64; 5])> = by_type
        .rows
        .iter()
        .map(|r| {
            let c = &r.counts;
            (
                c.type_name.as_deref(),
                [c.due, c.scheduled, c.running, c.dead, c.completed],
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            (Some("mail.send"), [1, 1, 0, 1, 2]),
            (Some("report.build"), [0, 0, 1, 1, 0]),
        ],
        "{engine}"
    );

    let mail = admin::pending_with(
        &sources,
        &PendingRequest {
            queue: Some("mail".into()),
            ..PendingRequest::default()
        },
    )
    .await
    .unwrap();
    let c = &mail.rows[0].counts;
    assert_eq!(
        [c.due, c.scheduled, c.running, c.dead, c.completed],
        [1, 1, 0, 1, 0],
        "{engine}: the mail queue alone"
    );

    db.insert_row(
        "60000000-0000-4000-8000-0000000000a1",
        "mail.send",
        "{}",
        &[],
    )
    .await;
    assert_eq!(
        states(&sources).await,
        [2, 1, 1, 2, 2],
        "{engine}: a row inserted by plain SQL is counted at once"
    );
    admin::close(&sources).await;
}

/// Each state lists its rows in its order, a page at a time, with the total.
pub async fn list_pages_each_state_in_its_order(engine: &'static str) {
    let (db, sources) = seeded(engine, "adm_list").await;
    let listed = |state, limit, after: Option<CommandId>| {
        let sources = &sources;
        async move {
            let request = ListRequest {
                state,
                type_name: None,
                queue: None,
                limit,
                after,
                before: None,
            };
            admin::list(sources, &request).await.unwrap()
        }
    };
    let of = |report: &admin::ListReport| -> Vec<String> {
        report.commands.iter().map(|c| c.id.to_string()).collect()
    };

    // Claim order: RunAt, then the far future.
    let pending = listed(ListState::Pending, 2, None).await;
    assert_eq!(
        (pending.total, of(&pending)),
        (3, vec![DUE.into(), RUNNING.into()]),
        "{engine}"
    );
    let next = listed(ListState::Pending, 2, pending.next_after.clone()).await;
    assert_eq!(
        (of(&next), next.next_after),
        (vec![SCHEDULED.to_owned()], None),
        "{engine}"
    );
    let states: Vec<State> = pending.commands.iter().map(|c| c.state).collect();
    assert_eq!(states, [State::Due, State::Running], "{engine}");

    // Finished rows, newest first.
    let dead = listed(ListState::Dead, 10, None).await;
    assert_eq!(of(&dead), [DEAD_NEW, DEAD_OLD], "{engine}");
    let done = listed(ListState::Completed, 10, None).await;
    assert_eq!(of(&done), [DONE_NEW, DONE_OLD], "{engine}");
    assert_eq!(
        (
            listed(ListState::Running, 10, None).await.total,
            listed(ListState::Scheduled, 10, None).await.total
        ),
        (1, 1),
        "{engine}"
    );

    // A row another program makes due is listed where its RunAt puts it.
    db.insert_row(
        "60000000-0000-4000-8000-0000000000b1",
        "mail.send",
        "{}",
        &[("RunAt", db.ts("2025-06-01T00:00:00"))],
    )
    .await;
    let due = listed(ListState::Due, 10, None).await;
    assert_eq!(
        of(&due),
        ["60000000-0000-4000-8000-0000000000b1", DUE],
        "{engine}"
    );
    admin::close(&sources).await;
}

/// A row written with plain SQL is shown whole, and its payload's head cut by the
/// database; an unknown id is not found.
pub async fn show_reads_a_plain_sql_row_whole(engine: &'static str) {
    let (_db, sources) = seeded(engine, "adm_show").await;
    let shown = admin::show(&sources, id(DEAD_OLD)).await.unwrap();
    assert_eq!(
        (
            shown.source.as_str(),
            shown.state,
            shown.row.type_name.as_str(),
            shown.row.queue.as_str(),
            shown.row.attempts,
            shown.row.last_error.as_deref(),
            shown.row.user_id.as_deref(),
        ),
        (
            "default",
            State::Dead,
            "mail.send",
            "mail",
            5,
            Some("SMTP 550: mailbox unavailable"),
            Some("user-7"),
        ),
        "{engine}"
    );
    assert_eq!(
        shown.row.payload,
        serde_json::json!({"n": 4, "to": "ann@example.com"}),
        "{engine}"
    );

    let head = admin::show_head(&sources, id(DEAD_OLD), 5).await.unwrap();
    assert_eq!(head.state, State::Dead, "{engine}");
    assert!(
        head.payload_head.chars().count() <= 5,
        "{engine}: {:?}",
        head.payload_head
    );
    assert!(head.payload_bytes > 5, "{engine}: {}", head.payload_bytes);
    assert!(!head.whole(), "{engine}");

    let missing = admin::show(&sources, id("60000000-0000-4000-8000-0000000000ff")).await;
    assert!(
        matches!(missing, Err(Error::NotFound(_))),
        "{engine}: {missing:?}"
    );
    admin::close(&sources).await;
}

/// Dead letters newest first, filtered by type and queue, and a row another program
/// dead-letters afterwards comes first.
pub async fn dead_letters_list_newest_first_and_filter(engine: &'static str) {
    let (db, sources) = seeded(engine, "adm_dead").await;
    let listed = |query: DeadLetterQuery| {
        let sources = &sources;
        async move {
            admin::dead_letters(sources, &query)
                .await
                .unwrap()
                .rows
                .into_iter()
                .map(|r| (r.summary.id.to_string(), r.summary.attempts))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        listed(DeadLetterQuery::default()).await,
        [(DEAD_NEW.to_owned(), 1), (DEAD_OLD.to_owned(), 5)],
        "{engine}"
    );
    let mail = DeadLetterQuery {
        type_name: Some("mail.send".into()),
        ..DeadLetterQuery::default()
    };
    assert_eq!(listed(mail).await, [(DEAD_OLD.to_owned(), 5)], "{engine}");
    let queue = DeadLetterQuery {
        queue: Some("default".into()),
        ..DeadLetterQuery::default()
    };
    assert_eq!(listed(queue).await, [(DEAD_NEW.to_owned(), 1)], "{engine}");

    db.execute(&format!(
        "UPDATE {} SET {} = {} WHERE {} = '{DUE}'",
        db.q("InternalCommands"),
        db.q("DeadLetteredAt"),
        db.now_sql(),
        db.q("Id")
    ))
    .await;
    let limited = DeadLetterQuery {
        limit: 2,
        ..DeadLetterQuery::default()
    };
    assert_eq!(
        listed(limited).await,
        [(DUE.to_owned(), 0), (DEAD_NEW.to_owned(), 1)],
        "{engine}"
    );
    admin::close(&sources).await;
}

/// Cancelling by id dead-letters a due and a running row (its lease cleared); by type it
/// takes the pending rows of that type; finished rows are never touched.
pub async fn cancel_dead_letters_pending_rows(engine: &'static str) {
    let (db, sources) = seeded(engine, "adm_cancel").await;
    let plan = admin::plan_cancel(&sources, &CancelTarget::Ids(ids(&[DUE, RUNNING])))
        .await
        .unwrap();
    assert_eq!((plan.total(), plan.running()), (2, 1), "{engine}");
    let report = admin::cancel(&plan, &NoProgress).await.unwrap();
    assert_eq!((report.cancelled, report.were_running), (2, 1), "{engine}");
    let cancelled = format!(
        "{{Id}} IN ('{DUE}', '{RUNNING}') AND {{DeadLetteredAt}} IS NOT NULL \
         AND {{LastError}} = '{}' AND {{LockToken}} IS NULL AND {{LockedUntil}} IS NULL",
        admin::CANCELLED
    );
    assert_eq!(count(&db, &cancelled).await, 2, "{engine}");

    // A row another program schedules is cancelled with its type; the scheduled row too.
    db.insert_row(
        "60000000-0000-4000-8000-0000000000c1",
        "mail.send",
        "{}",
        &[],
    )
    .await;
    let by_type = CancelTarget::Matching {
        type_name: Some("mail.send".into()),
        queue: None,
    };
    let plan = admin::plan_cancel(&sources, &by_type).await.unwrap();
    assert_eq!(plan.total(), 2, "{engine}");
    assert_eq!(
        admin::cancel(&plan, &NoProgress).await.unwrap().cancelled,
        2,
        "{engine}"
    );
    assert_eq!(
        count(&db, &format!("{{LastError}} = '{}'", admin::CANCELLED)).await,
        4,
        "{engine}"
    );
    assert_eq!(states(&sources).await, [0, 0, 0, 6, 2], "{engine}");

    // A finished row is refused, and nothing in the request changes.
    db.insert_row(
        "60000000-0000-4000-8000-0000000000c2",
        "mail.send",
        "{}",
        &[],
    )
    .await;
    let refused = admin::plan_cancel(
        &sources,
        &CancelTarget::Ids(ids(&["60000000-0000-4000-8000-0000000000c2", DONE_OLD])),
    )
    .await;
    assert!(
        matches!(refused, Err(Error::Refused(_))),
        "{engine}: {:?}",
        refused.err()
    );
    assert_eq!(states(&sources).await, [1, 0, 0, 6, 2], "{engine}");
    admin::close(&sources).await;
}

/// Requeueing by id puts a dead letter back, due now with its attempts reset; requeueing
/// every dead letter of a type takes only those.
pub async fn requeue_puts_dead_letters_back(engine: &'static str) {
    let (db, sources) = seeded(engine, "adm_requeue").await;
    let plan = admin::plan_requeue(&sources, &RequeueTarget::Ids(ids(&[DEAD_OLD])))
        .await
        .unwrap();
    assert_eq!(plan.total(), 1, "{engine}");
    assert_eq!(
        admin::requeue(&plan, &NoProgress).await.unwrap().requeued,
        1,
        "{engine}"
    );
    let back = format!(
        "{{Id}} = '{DEAD_OLD}' AND {{DeadLetteredAt}} IS NULL AND {{ProcessedAt}} IS NULL \
         AND {{Attempts}} = 0 AND {{LockToken}} IS NULL AND {{RunAt}} <= {}",
        db.now_sql()
    );
    assert_eq!(count(&db, &back).await, 1, "{engine}");
    assert_eq!(states(&sources).await, [2, 1, 1, 1, 2], "{engine}");

    // Two more dead letters, one written by another program: all of `report.build` go.
    db.insert_row(
        "60000000-0000-4000-8000-0000000000d1",
        "report.build",
        "{}",
        &[("DeadLetteredAt", db.ts("2026-02-01T00:00:00"))],
    )
    .await;
    db.insert_row(
        "60000000-0000-4000-8000-0000000000d2",
        "mail.send",
        "{}",
        &[("DeadLetteredAt", db.ts("2026-02-01T00:00:00"))],
    )
    .await;
    let all = RequeueTarget::AllDead {
        type_name: Some("report.build".into()),
        queue: None,
    };
    let plan = admin::plan_requeue(&sources, &all).await.unwrap();
    assert_eq!(plan.total(), 2, "{engine}");
    assert_eq!(
        admin::requeue(&plan, &NoProgress).await.unwrap().requeued,
        2,
        "{engine}"
    );
    assert_eq!(
        count(
            &db,
            "{Type} = 'report.build' AND {DeadLetteredAt} IS NOT NULL"
        )
        .await,
        0,
        "{engine}"
    );
    assert_eq!(
        count(&db, "{Type} = 'mail.send' AND {DeadLetteredAt} IS NOT NULL").await,
        1,
        "{engine}: the other type's dead letter stays"
    );

    // A running row is refused, and nothing in the request changes.
    let refused = admin::plan_requeue(
        &sources,
        &RequeueTarget::Ids(ids(&["60000000-0000-4000-8000-0000000000d2", RUNNING])),
    )
    .await;
    assert!(
        matches!(refused, Err(Error::Refused(_))),
        "{engine}: {:?}",
        refused.err()
    );
    assert_eq!(
        count(&db, "{DeadLetteredAt} IS NOT NULL").await,
        1,
        "{engine}"
    );
    admin::close(&sources).await;
}

/// Replaying a dead and a completed row adds a due copy of each (type, payload, queue),
/// with no attempt charged; the originals stay as they were.
pub async fn replay_copies_finished_rows_as_new_work(engine: &'static str) {
    let (db, sources) = seeded(engine, "adm_replay").await;
    let report = admin::replay(&sources, &ids(&[DEAD_OLD, DONE_OLD]))
        .await
        .unwrap();
    let from: Vec<String> = report.replayed.iter().map(|r| r.from.to_string()).collect();
    assert_eq!(from, [DEAD_OLD, DONE_OLD], "{engine}");
    assert!(report.replayed.iter().all(|r| !r.existing), "{engine}");
    assert_eq!(count(&db, "1 = 1").await, 9, "{engine}: two new rows");
    for replayed in &report.replayed {
        let copy = admin::show(&sources, replayed.id.clone()).await.unwrap();
        let original = admin::show(&sources, replayed.from.clone()).await.unwrap();
        assert_eq!(copy.state, State::Due, "{engine}");
        assert_eq!(
            (&copy.row.type_name, &copy.row.payload, &copy.row.queue),
            (
                &original.row.type_name,
                &original.row.payload,
                &original.row.queue
            ),
            "{engine}"
        );
        assert_eq!(
            (copy.row.attempts, copy.row.last_error.as_deref()),
            (0, None),
            "{engine}"
        );
    }
    assert_eq!(
        count(
            &db,
            &format!(
                "{{Id}} = '{DEAD_OLD}' AND {{DeadLetteredAt}} IS NOT NULL AND {{Attempts}} = 5"
            )
        )
        .await,
        1,
        "{engine}: the original stays dead"
    );
    assert_eq!(states(&sources).await, [3, 1, 1, 2, 2], "{engine}");

    // A pending row is refused, and nothing is replayed.
    let refused = admin::replay(&sources, &ids(&[DONE_NEW, SCHEDULED])).await;
    assert!(
        matches!(refused, Err(Error::Refused(_))),
        "{engine}: {:?}",
        refused.err()
    );
    assert_eq!(count(&db, "1 = 1").await, 9, "{engine}");
    admin::close(&sources).await;
}

/// Purging deletes finished rows by kind and age (a dry run's plan counts them first);
/// pending rows are never deleted.
pub async fn purge_deletes_finished_rows_by_kind_and_age(engine: &'static str) {
    let (db, sources) = seeded(engine, "adm_purge").await;
    let old_completed = PurgeRequest {
        completed: true,
        older_than: Some(Duration::from_secs(86_400)),
        ..PurgeRequest::default()
    };
    let plan = admin::plan_purge(&sources, &old_completed).await.unwrap();
    assert_eq!(plan.total(), 1, "{engine}");
    assert_eq!(
        count(&db, "1 = 1").await,
        7,
        "{engine}: planning deletes nothing"
    );
    assert_eq!(
        admin::purge(&plan, &NoProgress).await.unwrap().total(),
        1,
        "{engine}"
    );
    assert_eq!(
        count(&db, &format!("{{Id}} = '{DONE_OLD}'")).await,
        0,
        "{engine}"
    );
    assert_eq!(
        count(&db, &format!("{{Id}} = '{DONE_NEW}'")).await,
        1,
        "{engine}"
    );

    // Dead letters of one type, one of them written by another program just now.
    db.insert_row(
        "60000000-0000-4000-8000-0000000000e1",
        "report.build",
        "{}",
        &[("DeadLetteredAt", db.now_sql().into())],
    )
    .await;
    let dead_reports = PurgeRequest {
        dead_letters: true,
        type_name: Some("report.build".into()),
        ..PurgeRequest::default()
    };
    let plan = admin::plan_purge(&sources, &dead_reports).await.unwrap();
    assert_eq!(
        admin::purge(&plan, &NoProgress).await.unwrap().total(),
        2,
        "{engine}"
    );
    assert_eq!(states(&sources).await, [1, 1, 1, 1, 1], "{engine}");

    // Everything finished: what is left is the pending rows.
    let everything = PurgeRequest {
        completed: true,
        dead_letters: true,
        ..PurgeRequest::default()
    };
    let plan = admin::plan_purge(&sources, &everything).await.unwrap();
    assert_eq!(
        admin::purge(&plan, &NoProgress).await.unwrap().total(),
        2,
        "{engine}"
    );
    assert_eq!(states(&sources).await, [1, 1, 1, 0, 0], "{engine}");
    assert_eq!(count(&db, "1 = 1").await, 3, "{engine}");
    admin::close(&sources).await;
}
