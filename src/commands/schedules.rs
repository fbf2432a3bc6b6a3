//! `icq schedules`: each configured schedule of the selected sources, with its
//! expression, zone, queue, type, last occurrence (from the database) and next occurrence
//! (from the database's clock).

use clap::Args;

use super::GlobalArgs;
use crate::cli::output::{self, Column, Grid, Render, Style};
use icq::admin::ScheduleRow;

/// `icq schedules --help`.
pub const HELP: &str = "\
Examples:
  icq schedules
  icq schedules --source orders --format json | jq '.[] | {name, next_occurrence}'

Schedules come from each source's `schedules:` in icq.yaml:
  schedules:
    - name: nightly-report
      cron: \"0 3 * * *\"          # or: every: 10m
      time_zone: Europe/Berlin   # IANA; default UTC
      type: reports.nightly
      payload: { kind: full }
      missed: skip               # or: once

`icq work` schedules each occurrence once however many replicas run. The last occurrence
is the latest one recorded (scheduled, or skipped as missed); the next is computed from
the database's clock. Needs schema version 4 (`icq migrate add` writes the upgrade).";

/// Arguments of `icq schedules` (the global `--source` and `--format` apply).
#[derive(Debug, Clone, Args)]
pub struct SchedulesArgs {}

/// What `icq schedules` prints: every selected source's schedules, as one JSON array.
#[derive(Debug, serde::Serialize)]
#[serde(transparent)]
pub struct SchedulesReport {
    rows: Vec<ScheduleRow>,
    #[serde(skip)]
    sources: usize,
}

/// Runs `icq schedules`.
pub async fn run(_args: SchedulesArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = crate::cli::sources::open(&global.source_request()).await?;
    let listed = futures::future::try_join_all(
        sources
            .iter()
            .map(|s| icq::admin::schedules(&s.queue, &s.settings.schedules)),
    )
    .await;
    let queues: Vec<icq::Queue> = sources.iter().map(|s| s.queue.clone()).collect();
    icq::admin::close(&queues).await;
    let report = SchedulesReport {
        rows: listed?.into_iter().flatten().collect(),
        sources: sources.len(),
    };
    output::emit(global.format, &report)?;
    Ok(())
}

fn time(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map_or_else(
        || "-".to_owned(),
        |at| at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    )
}

impl Render for SchedulesReport {
    fn human(&self, style: &Style) -> String {
        if self.rows.is_empty() {
            return "No schedules configured (add `schedules:` to a source in icq.yaml).".into();
        }
        self.grid()
            .unwrap_or_default()
            .table(style, style.columns())
    }

    fn grid(&self) -> Option<Grid> {
        // Nothing configured is a sentence, not an empty listing.
        if self.rows.is_empty() {
            return None;
        }
        let sourced = self.sources > 1;
        let mut columns = Vec::new();
        if sourced {
            columns.push(Column::whole("Source"));
        }
        columns.extend([
            Column::shrinkable("Name", 8, 1),
            Column::shrinkable("Expression", 9, 2),
            Column::whole("Zone").droppable(1),
            Column::shrinkable("Queue", 6, 3).droppable(2),
            Column::shrinkable("Type", 6, 0),
            Column::whole("Last occurrence").droppable(0),
            Column::whole("Next occurrence"),
        ]);
        let mut grid = Grid::new(columns);
        for row in &self.rows {
            let mut cells = Vec::new();
            if sourced {
                cells.push(row.source.clone());
            }
            cells.extend([
                row.name.clone(),
                row.expression.clone(),
                row.time_zone.clone(),
                row.queue.clone(),
                row.type_name.clone(),
                time(row.last_occurrence),
                time(row.next_occurrence),
            ]);
            grid.push(cells);
        }
        Some(grid)
    }
}
