//! The retention sweep's statement ("Retention ... completed rows older than
//! `retention_days` are deleted in bounded batches. Dead letters stay until purged.").

use std::time::Duration;

use super::Harness;
use crate::engine::SweepParams;

/// `completed_delete_batch` deletes completed rows older than the cutoff, at most
/// `limit` a call, and nothing else: not recent completed rows, not dead letters (however
/// old), not pending rows (however old).
/// On a version-2 table (no history); version 3 is in `history`.
pub(crate) async fn sweep_deletes_only_old_completed_rows_in_bounded_batches(engine: &str) {
    let h = Harness::v2(engine, "sweep").await;
    let (processed, dead, created) = (h.q("ProcessedAt"), h.q("DeadLetteredAt"), h.q("CreatedAt"));
    let day = 86_400;
    for _ in 0..5 {
        let id = h.insert("old.completed").await;
        h.update(&id, &format!("{processed} = {}", h.ago(10 * day)))
            .await;
    }
    for _ in 0..2 {
        let id = h.insert("recent.completed").await;
        h.update(&id, &format!("{processed} = {}", h.ago(day)))
            .await;
    }
    for _ in 0..2 {
        let id = h.insert("old.dead").await;
        h.update(
            &id,
            &format!(
                "{dead} = {}, {created} = {}",
                h.ago(30 * day),
                h.ago(31 * day)
            ),
        )
        .await;
    }
    for _ in 0..2 {
        let id = h.insert("old.pending").await;
        h.update(&id, &format!("{created} = {}", h.ago(30 * day)))
            .await;
    }
    let sweep = |limit| SweepParams {
        older_than: Duration::from_secs(7 * day as u64),
        limit,
    };
    let old = format!("{} = 'old.completed'", h.q("Type"));
    assert_eq!(
        h.driver
            .completed_delete_batch(&sweep(3))
            .await
            .expect("sweep"),
        Some(3),
        "{engine}: at most the batch limit"
    );
    assert_eq!(h.count(&old).await, 2);
    assert_eq!(
        h.driver
            .completed_delete_batch(&sweep(3))
            .await
            .expect("sweep"),
        Some(2),
        "{engine}: the rest of the old completed rows"
    );
    assert_eq!(
        h.driver
            .completed_delete_batch(&sweep(3))
            .await
            .expect("sweep"),
        Some(0),
        "{engine}: nothing else is old and completed"
    );
    assert_eq!(h.count(&old).await, 0);
    let kept = |ty: &str| format!("{} = '{ty}'", h.q("Type"));
    assert_eq!(
        h.count(&kept("recent.completed")).await,
        2,
        "{engine}: younger than the cutoff"
    );
    assert_eq!(
        h.count(&kept("old.dead")).await,
        2,
        "{engine}: dead letters are never swept"
    );
    assert_eq!(
        h.count(&kept("old.pending")).await,
        2,
        "{engine}: pending rows are never swept"
    );
    // A zero cutoff takes every completed row, still never a dead or pending one.
    let all = SweepParams {
        older_than: Duration::ZERO,
        limit: 100,
    };
    assert_eq!(
        h.driver.completed_delete_batch(&all).await.expect("sweep"),
        Some(2)
    );
    assert_eq!(
        h.scalar(&format!("SELECT COUNT(*) FROM {}", h.t)).await,
        4,
        "{engine}"
    );
}
