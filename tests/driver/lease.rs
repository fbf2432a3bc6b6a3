//! Lease renewal ("Lease renewal ... token-guarded, batched").

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;

use super::{Harness, near};
use crate::command::{CommandId, LeaseToken};
use crate::engine::CommandSetStateManyParams;
use crate::engine::{Lease, LeaseExtendManyParams, SetState, StateChange};

/// `lease_extend_many` extends exactly the leases whose row still carries the token, and
/// returns exactly those: a row taken over by another claim, a row already stamped and an
/// id that does not exist are neither extended nor returned.
pub(crate) async fn lease_extend_keeps_only_leases_with_the_current_token(engine: &str) {
    let h = Harness::new(engine, "extend").await;
    let mut rows = Vec::new();
    for _ in 0..4 {
        rows.push(h.insert("t").await);
    }
    let (token, claimed) = h.claim(10).await;
    assert_eq!(claimed.len(), 4);
    let [kept_a, taken, stamped, kept_b] = [0, 1, 2, 3].map(|i| rows[i].clone());
    let locked = h.q("LockedUntil");
    // Every lease about to lapse, so an extension is visible.
    h.exec(&format!("UPDATE {} SET {locked} = {}", h.t, h.ago(-5)))
        .await;
    let other = "00000000-0000-4000-8000-0000000000bb";
    h.update(&taken, &format!("{} = '{other}'", h.q("LockToken")))
        .await;
    let done = h
        .driver
        .command_set_state_many(&CommandSetStateManyParams {
            changes: &[SetState {
                lease: Lease {
                    id: stamped.clone(),
                    token,
                },
                change: StateChange::Completed,
            }],
        })
        .await
        .expect("stamp");
    assert_eq!(done, 1);
    let taken_before = h.get(&taken).await;

    let lease = |id: &CommandId| Lease {
        id: id.clone(),
        token,
    };
    let asked = [
        lease(&kept_a),
        lease(&taken),
        lease(&stamped),
        lease(&kept_b),
        lease(&CommandId::new()),
        Lease {
            id: kept_a.clone(),
            token: LeaseToken::new(),
        },
    ];
    let at = Utc::now();
    let extended = h
        .driver
        .lease_extend_many(&LeaseExtendManyParams {
            leases: asked.to_vec(),
            lease: Duration::from_secs(600),
        })
        .await
        .expect("extend");
    let extended: HashSet<Lease> = extended.into_iter().collect();
    let expected: HashSet<Lease> = [lease(&kept_a), lease(&kept_b)].into_iter().collect();
    assert_eq!(extended, expected, "{engine}: only the leases still held");
    for id in [&kept_a, &kept_b] {
        let row = h.get(id).await;
        assert_eq!(row.lock_token, Some(token));
        near(
            row.locked_until.expect("leased"),
            at + chrono::Duration::seconds(600),
            Duration::from_secs(5),
            "LockedUntil = now + lease",
        );
    }
    assert_eq!(
        h.get(&taken).await,
        taken_before,
        "{engine}: another claim's lease is not touched"
    );
    let s = h.get(&stamped).await;
    assert_eq!(
        (s.lock_token, s.locked_until),
        (None, None),
        "{engine}: stamped stays unleased"
    );
    assert!(
        h.driver
            .lease_extend_many(&LeaseExtendManyParams {
                leases: Vec::new(),
                lease: Duration::from_secs(600),
            })
            .await
            .expect("extend nothing")
            .is_empty()
    );
}
