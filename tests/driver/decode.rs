//! Rows another program wrote ("a row icq cannot decode or use (any column, any
//! engine) is dead-lettered alone with the reason; it never fails a claim or stamp for
//! other rows, and ids are matched exactly as stored").

use std::collections::HashSet;

use super::{Harness, ids};
use crate::command::CommandId;
use crate::engine::CommandSetStateManyParams;
use crate::engine::{Lease, SetState, StateChange};
use crate::ident::Engine;

/// Rows whose columns cannot be decoded, inserted by plain SQL between healthy rows, all
/// come back from one claim: each bad row with a defect naming its column, the healthy
/// rows without defects, and an absurd `Attempts` saturated instead of failing the
/// statement. One stamp then dead-letters the bad rows and completes the others.
pub(crate) async fn undecodable_rows_come_back_with_defects_and_never_fail_the_claim(engine: &str) {
    // A foreign program's table may keep the payload as plain text: without SQLite's
    // json_valid check, with MySQL's column as LONGTEXT.
    let h = Harness::with_ddl(engine, "defects", |ddl| {
        ddl.replace(r#" CHECK (json_valid("Payload"))"#, "")
    })
    .await;
    if h.engine == Engine::Mysql {
        h.exec(&format!(
            "ALTER TABLE {} MODIFY `Payload` LONGTEXT NOT NULL",
            h.t
        ))
        .await;
    }
    let healthy_before = h.insert("healthy").await;
    let mut bad: Vec<(CommandId, &str)> = Vec::new();
    let mut spoil = async |column: &'static str, value: &str| {
        let id = h.insert("spoiled").await;
        h.update(&id, &format!("{} = {value}", h.q(column))).await;
        bad.push((id, column));
    };
    match h.engine {
        Engine::Postgres => {
            // Valid jsonb, deeper than the JSON decoder goes.
            let deep = format!("'{}{}'", "[".repeat(300), "]".repeat(300));
            spoil("Payload", &deep).await;
            spoil("RunAt", "'-infinity'").await;
            spoil("CreatedAt", "'-infinity'").await;
        }
        Engine::Sqlite => {
            spoil("Payload", "'not json {'").await;
            spoil("RunAt", "'tomorrow'").await;
            spoil("CreatedAt", "'yesterday'").await;
            // Not UTF-8 (an integer would be stored as text by the column's affinity).
            spoil("Type", "X'FF'").await;
        }
        _ => {
            spoil("Payload", "'not json {'").await;
        }
    }
    if h.engine == Engine::Mysql {
        // A zero date, which MariaDB stores outside strict NO_ZERO_DATE mode.
        let id = h.insert("spoiled").await;
        h.exec(&format!(
            "SET SESSION sql_mode = ''; UPDATE {} SET `RunAt` = '0000-00-00 00:00:00' WHERE `Id` = '{id}'",
            h.t
        ))
        .await;
        bad.push((id, "RunAt"));
    }
    let absurd = h.insert("absurd.attempts").await;
    h.update(&absurd, &format!("{} = 2147483647", h.q("Attempts")))
        .await;
    let healthy_after = h.insert("healthy").await;
    // A lease expiry that is not a time (SQLite compares it as text, after every real
    // time) must not hold the row as running forever: the claim overwrites it.
    let garbage_lease = if h.engine == Engine::Sqlite {
        let id = h.insert("garbage.lease").await;
        h.update(&id, &format!("{} = 'soon'", h.q("LockedUntil")))
            .await;
        Some(id)
    } else {
        None
    };

    let (token, rows) = h.claim(100).await;
    let mut expected: Vec<CommandId> = bad.iter().map(|(id, _)| id.clone()).collect();
    expected.extend([
        healthy_before.clone(),
        absurd.clone(),
        healthy_after.clone(),
    ]);
    expected.extend(garbage_lease.clone());
    expected.sort();
    assert_eq!(
        ids(&rows),
        expected,
        "{engine}: one claim returns every row"
    );
    for (id, column) in &bad {
        let row = rows.iter().find(|r| &r.lease.id == id).expect("claimed");
        let prefix = format!("column {column}:");
        assert!(
            row.row.defects.iter().any(|d| d.starts_with(&prefix)),
            "{engine}: the spoiled {column} is a defect: {:?}",
            row.row.defects
        );
        assert!(row.row.defect_summary().is_some());
    }
    for id in [&healthy_before, &healthy_after, &absurd]
        .into_iter()
        .chain(garbage_lease.as_ref())
    {
        let row = rows.iter().find(|r| &r.lease.id == id).expect("claimed");
        assert!(
            row.row.defects.is_empty(),
            "{engine}: {id}: {:?}",
            row.row.defects
        );
        assert_eq!(row.lease.token, token);
    }
    let saturated = rows.iter().find(|r| r.lease.id == absurd).expect("claimed");
    assert_eq!(
        saturated.row.attempts,
        i32::MAX,
        "{engine}: Attempts saturates"
    );

    let bad_ids: HashSet<&CommandId> = bad.iter().map(|(id, _)| id).collect();
    let changes: Vec<SetState> = rows
        .iter()
        .map(|r| SetState {
            lease: r.lease.clone(),
            change: match (bad_ids.contains(&r.lease.id), r.row.defect_summary()) {
                (true, Some(reason)) => StateChange::Dead {
                    error: reason,
                    errors: None,
                },
                _ => StateChange::Completed,
            },
        })
        .collect();
    let stamped = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams { changes: &changes })
        .await
        .expect("stamp");
    assert_eq!(
        stamped as usize,
        rows.len(),
        "{engine}: one bad row fails no stamp"
    );
    assert_eq!(
        h.count(&format!("{} IS NOT NULL", h.q("DeadLetteredAt")))
            .await as usize,
        bad.len(),
        "{engine}"
    );
    assert_eq!(
        h.count_history(&format!("{} IS NOT NULL", h.q("ProcessedAt")))
            .await as usize,
        rows.len() - bad.len(),
        "{engine}: the completed rows moved to history"
    );
}

/// Ids another program wrote in its own format are claimed, returned, extended, read and
/// stamped exactly as stored: `JOB-1` and `job-1` are two rows, an upper-case UUID is
/// not rewritten. On SQLite a BLOB id, which no statement can match as text, is
/// dead-lettered by the claim with the reason instead of failing it. PostgreSQL stores
/// ids as `uuid`, so there an upper-case id is canonical once stored and reads back by
/// either spelling.
pub(crate) async fn ids_are_matched_exactly_as_stored(engine: &str) {
    let h = Harness::new(engine, "ids").await;
    let upper = "AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE";
    let odd: &[&str] = match h.engine {
        Engine::Postgres => &[upper],
        Engine::Sqlite => &[
            upper,
            "{aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee}",
            "job-1",
            "JOB-1",
        ],
        _ => &[upper, "job-1", "JOB-1"],
    };
    let (t, id_col, ty, payload) = (&h.t, h.q("Id"), h.q("Type"), h.q("Payload"));
    for id in odd {
        h.exec(&format!(
            "INSERT INTO {t} ({id_col}, {ty}, {payload}) VALUES ('{id}', 'odd', '{{}}')"
        ))
        .await;
    }
    if h.engine == Engine::Sqlite {
        h.exec(&format!(
            "INSERT INTO {t} ({id_col}, {ty}, {payload}) VALUES (X'0102', 'blob.id', '{{}}')"
        ))
        .await;
    }
    let (token, rows) = h.claim(100).await;
    let got: HashSet<String> = rows.iter().map(|r| r.lease.id.to_string()).collect();
    let want: HashSet<String> = match h.engine {
        Engine::Postgres => [upper.to_ascii_lowercase()].into(),
        _ => odd.iter().map(|s| s.to_string()).collect(),
    };
    assert_eq!(got, want, "{engine}: ids as stored");
    for row in &rows {
        assert!(
            row.row.defects.is_empty(),
            "{engine}: {:?}",
            row.row.defects
        );
        let stored = h.get(&row.lease.id).await;
        assert_eq!(
            stored.lock_token,
            Some(token),
            "{engine}: read back by its id"
        );
    }
    if h.engine == Engine::Sqlite {
        assert_eq!(
            h.count(&format!(
                "{ty} = 'blob.id' AND {} IS NOT NULL AND {} LIKE '%Id is a blob%'",
                h.q("DeadLetteredAt"),
                h.q("LastError")
            ))
            .await,
            1,
            "{engine}: the BLOB id is dead-lettered with the reason"
        );
    }
    if h.engine == Engine::Postgres {
        let spelled: CommandId = upper.parse().expect("an id");
        assert_eq!(h.get(&spelled).await.lock_token, Some(token));
    }

    let lease = |id: &str| Lease {
        id: id.parse().expect("an id"),
        token,
    };
    let extended = h
        .driver
        .lease_extend_many(&crate::engine::LeaseExtendManyParams {
            leases: rows.iter().map(|r| r.lease.clone()).collect(),
            lease: std::time::Duration::from_secs(120),
        })
        .await
        .expect("extend");
    let extended: HashSet<String> = extended.iter().map(|l| l.id.to_string()).collect();
    assert_eq!(extended, want, "{engine}: extended by id as stored");
    if h.engine == Engine::Postgres {
        return;
    }
    let n = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[SetState {
                lease: lease("job-1"),
                change: StateChange::Completed,
            }],
        })
        .await
        .expect("stamp");
    assert_eq!(n, 1, "{engine}: job-1 only");
    assert!(
        h.get(&"job-1".parse().unwrap())
            .await
            .processed_at
            .is_some()
    );
    let other = h.get(&"JOB-1".parse().unwrap()).await;
    assert_eq!(
        (other.processed_at, other.lock_token),
        (None, Some(token)),
        "{engine}: JOB-1 is another row"
    );
    let n = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[SetState {
                lease: lease(&upper.to_ascii_lowercase()),
                change: StateChange::Completed,
            }],
        })
        .await
        .expect("stamp");
    assert_eq!(
        n, 0,
        "{engine}: a lower-case spelling is not the upper-case row"
    );
    let n = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[SetState {
                lease: lease(upper),
                change: StateChange::Completed,
            }],
        })
        .await
        .expect("stamp");
    assert_eq!(n, 1, "{engine}: the id as stored");
}
