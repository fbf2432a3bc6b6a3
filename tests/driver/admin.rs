//! The operator seam ([`crate::engine::admin::AdminOps`]) where only a driver call can
//! reach the case: a race between an operation's check and its write. The operations
//! themselves, on every engine, are covered through the public `icq::admin` functions by
//! `tests/conformance/admin.rs`.

use super::Harness;
use crate::command::CommandId;
use crate::engine::admin::{CommandRequeueDeadManyParams, CommandRequeueManyParams};

const DEAD: &str = "50000000-0000-4000-8000-000000000001";
const PENDING: &str = "50000000-0000-4000-8000-000000000002";
const FREE: &str = "50000000-0000-4000-8000-000000000003";

/// A dead letter whose key a pending row took after the requeue's check: the requeue
/// leaves it dead (the others go back) instead of failing on the unique index.
pub(crate) async fn a_key_taken_meanwhile_leaves_the_row_dead(engine: &str) {
    let h = Harness::new(engine, "takenkey").await;
    let (t, id, key, dead) = (&h.t, h.q("Id"), h.q("UniqueKey"), h.q("DeadLetteredAt"));
    let (ty, payload, ago) = (h.q("Type"), h.q("Payload"), h.ago(60));
    h.exec(&format!(
        "INSERT INTO {t} ({id}, {ty}, {payload}, {key}, {dead}) VALUES ('{DEAD}', 't', '{{}}', 'k', {ago});
         INSERT INTO {t} ({id}, {ty}, {payload}, {key}) VALUES ('{PENDING}', 't', '{{}}', 'k');
         INSERT INTO {t} ({id}, {ty}, {payload}, {dead}) VALUES ('{FREE}', 't', '{{}}', {ago});"
    ))
    .await;
    let ids: Vec<CommandId> = [DEAD, FREE].iter().map(|i| i.parse().unwrap()).collect();
    let all_or_nothing = h
        .driver
        .command_requeue_many(&CommandRequeueManyParams { ids: ids.clone() })
        .await
        .unwrap();
    assert_eq!(all_or_nothing, 0, "{engine}: nothing changes");
    assert_eq!(h.count(&format!("{dead} IS NOT NULL")).await, 2);
    let done = h
        .driver
        .command_requeue_dead_many(&CommandRequeueDeadManyParams { ids })
        .await
        .unwrap();
    assert_eq!(done, 1, "{engine}: the free one goes back");
    assert_eq!(
        h.count(&format!("{id} = '{DEAD}' AND {dead} IS NOT NULL"))
            .await,
        1
    );
}
