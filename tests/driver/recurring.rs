//! The schedules' bookkeeping: replicas racing to advance one schedule record and
//! schedule each occurrence once.

use std::sync::Arc;
use std::time::Duration;

use super::Harness;
use crate::engine::recurring::{ScheduleAdvanceParams, ScheduleReadParams};
use crate::recurring::{Missed, Schedule};

/// Ticks like a processor: read, then advance what is due, every `every`, until `until`.
async fn ticker(
    driver: Arc<dyn crate::engine::Backend>,
    schedule: Schedule,
    every: Duration,
    until: tokio::time::Instant,
) -> usize {
    let names = [schedule.name.clone()];
    let mut advanced = 0;
    while tokio::time::Instant::now() < until {
        let state = driver
            .schedule_read(&ScheduleReadParams { names: &names })
            .await
            .expect("read");
        let row = state.last.get(&schedule.name);
        if schedule.plan(row.copied().flatten(), state.now).is_some() {
            let params = ScheduleAdvanceParams {
                schedule: &schedule,
                row_exists: row.is_some(),
            };
            match driver.schedule_advance(&params).await {
                Ok(Some(_)) => advanced += 1,
                Ok(None) => {}
                // A lost race on a busy engine is retried next tick, as the processor does.
                Err(err) => assert_eq!(
                    err.database_kind(),
                    Some(crate::error::DatabaseErrorKind::Contention),
                    "{err}"
                ),
            }
        }
        tokio::time::sleep(every).await;
    }
    advanced
}

/// Four replicas tick one `every: 1s` schedule for six seconds, starting at once (the
/// row is missing: they race to insert it too): every occurrence from the first to the
/// last recorded one is scheduled exactly once.
pub(crate) async fn racing_replicas_schedule_each_occurrence_once(engine: &str) {
    let h = Harness::new(engine, "sched").await;
    let schedule = Schedule::every("race", Duration::from_secs(1), "tick.race");
    let until = tokio::time::Instant::now() + Duration::from_secs(6);
    let mut replicas = Vec::new();
    for n in 0..4u64 {
        let driver = if n == 0 {
            h.driver.clone()
        } else {
            h.another_driver().await
        };
        let every = Duration::from_millis(150 + 70 * n);
        replicas.push(tokio::spawn(ticker(driver, schedule.clone(), every, until)));
    }
    let mut advanced = 0;
    for replica in replicas {
        advanced += replica.await.expect("a replica");
    }
    let key = h.q("UniqueKey");
    let ours = format!("{key} LIKE 'schedule:race:%'");
    let rows = h.count_all(&ours).await;
    let distinct = h
        .scalar(&format!(
            "SELECT COUNT(DISTINCT {key}) FROM (SELECT {key} FROM {} WHERE {ours} \
             UNION ALL SELECT {key} FROM {} WHERE {ours}) AS k",
            h.t,
            h.history()
        ))
        .await;
    assert_eq!(
        rows, distinct,
        "{engine}: an occurrence was scheduled twice"
    );
    assert!(
        (5..=8).contains(&rows),
        "{engine}: {rows} occurrences in 6 s ({advanced} advances)"
    );
    // No gap: the first and last occurrence span exactly `rows` seconds.
    let state = h
        .driver
        .schedule_read(&ScheduleReadParams {
            names: &["race".to_owned()],
        })
        .await
        .expect("read");
    let last = state.last["race"].expect("a last occurrence");
    for back in 0..rows {
        let at = last - chrono::Duration::seconds(back);
        let one = format!("{key} = '{}'", crate::recurring::unique_key("race", at));
        assert_eq!(h.count_all(&one).await, 1, "{engine}: {at}");
    }
}

/// A `missed: once` schedule whose last occurrence is long past schedules the latest
/// missed one once; `missed: skip` only records it.
pub(crate) async fn missed_occurrences_are_skipped_or_run_once(engine: &str) {
    let h = Harness::new(engine, "missed").await;
    let s = h.table.schedules().quoted(h.engine);
    let (name, last) = (h.q("Name"), h.q("LastOccurrence"));
    for schedule in ["skip", "once"] {
        h.exec(&format!(
            "INSERT INTO {s} ({name}, {last}) VALUES ('{schedule}', {})",
            h.ago(2 * 366 * 86_400)
        ))
        .await;
    }
    // New Year, 00:00 UTC: the latest is months ago (unless this runs on the day).
    let skip = Schedule::cron("skip", "0 0 1 1 *", "t.skip").expect("cron");
    let once = Schedule::cron("once", "0 0 1 1 *", "t.once")
        .expect("cron")
        .with_missed(Missed::Once);
    let mut latest = None;
    for schedule in [&skip, &once] {
        let params = ScheduleAdvanceParams {
            schedule,
            row_exists: true,
        };
        let plan = h
            .driver
            .schedule_advance(&params)
            .await
            .expect("advance")
            .expect("something was due");
        latest = Some(plan.advance_to);
        let again = h
            .driver
            .schedule_advance(&params)
            .await
            .expect("advance again");
        assert_eq!(again, None, "{engine}: recorded once");
    }
    let latest = latest.expect("a latest occurrence");
    let ty = h.q("Type");
    assert_eq!(
        h.count(&format!("{ty} = 't.skip'")).await,
        0,
        "{engine}: skip ran one"
    );
    assert_eq!(
        h.count(&format!("{ty} = 't.once'")).await,
        1,
        "{engine}: once"
    );
    let key = crate::recurring::unique_key("once", latest);
    assert_eq!(
        h.count(&format!("{} = '{key}'", h.q("UniqueKey"))).await,
        1,
        "{engine}"
    );
    let state = h
        .driver
        .schedule_read(&ScheduleReadParams {
            names: &["skip".to_owned(), "once".to_owned(), "absent".to_owned()],
        })
        .await
        .expect("read");
    assert_eq!(state.last.len(), 2, "{engine}: {state:?}");
    assert_eq!(
        state.last["skip"],
        Some(latest),
        "{engine}: skip recorded it"
    );
}
