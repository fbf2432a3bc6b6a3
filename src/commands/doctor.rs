//! `icq doctor [--max-age D]`: each source's table size, dead rows, the transaction
//! holding back their removal, long transactions and the oldest due command's wait, with
//! what to do about each finding; exit 1 when one needs action.

use std::fmt::Write as _;
use std::time::Duration;

use clap::Args;

use super::GlobalArgs;
use crate::cli::error::CliError;
use crate::cli::output::{self, Render, Style};
use icq::admin::doctor::{
    self, DoctorReport, HealthReport, Severity, Thresholds, describe, human_bytes, human_duration,
};
use icq::redact::escape_for_log;

/// `icq doctor --help`.
pub const HELP: &str = "\
Examples:
  icq doctor
  icq doctor --source orders --format json | jq '.sources[].findings'
  icq doctor --max-age 10s                    # stricter: act on anything open 10 s

Needs action (exit 1): the xmin horizon (PostgreSQL) or oldest read view (MariaDB/MySQL)
held over 60 s; a session idle in transaction over 30 s; a transaction open over 60 s;
dead rows above max(10000, 20% of live rows); InnoDB's history list above 1000000; the
oldest due command waiting over 60 s past its run time. SQLite cannot show other
connections' transactions: the report says so.

Exit codes:
  0  healthy (information and warnings only)
  1  something needs action (see the findings), or a database error
  2  usage or configuration error";

/// Arguments of `icq doctor`.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// Act on transactions, xmin holders and due commands older than this (instead of
    /// 60 s, and 30 s idle in transaction), like 10s or 5m.
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    pub max_age: Option<Duration>,
}

fn parse_age(text: &str) -> Result<Duration, String> {
    crate::cli::parse::parse_duration(text).map_err(|e| e.to_string())
}

/// Runs `icq doctor`.
pub async fn run(args: DoctorArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let thresholds = args
        .max_age
        .map_or_else(Thresholds::default, Thresholds::all);
    let report = doctor::doctor(&sources, &thresholds).await;
    icq::admin::close(&sources).await;
    let report = report?;
    output::emit(global.format, &report)?;
    if report.needs_action {
        let count = report
            .sources
            .iter()
            .flat_map(|s| &s.findings)
            .filter(|f| f.severity == Severity::Action)
            .count();
        return Err(CliError::NeedsAction { count }.into());
    }
    Ok(())
}

fn label(severity: Severity) -> &'static str {
    match severity {
        Severity::Action => "ACTION",
        Severity::Warning => "warning",
        Severity::Info => "info",
    }
}

fn source_text(report: &HealthReport, out: &mut String) {
    let _ = writeln!(out, "Source {} ({}):", report.source, report.engine);
    for table in report.table.iter().chain(report.history.iter()) {
        let mut line = format!(
            "  {}: {} ({} rows, {} indexes)",
            table.table,
            human_bytes(table.total_bytes),
            human_bytes(table.table_bytes),
            human_bytes(table.index_bytes)
        );
        if let Some(live) = table.live_rows {
            let _ = write!(line, ", ~{live} live rows");
        }
        if let Some(dead) = table.dead_rows {
            let _ = write!(line, ", {dead} dead");
        }
        if let Some(free) = table.free_bytes {
            let _ = write!(line, ", {} free", human_bytes(free));
        }
        if let Some(at) = table.last_autovacuum.or(table.last_vacuum) {
            let _ = write!(line, ", last vacuum {}", at.format("%Y-%m-%dT%H:%M:%SZ"));
        }
        let _ = writeln!(out, "{line}");
    }
    if let Some(length) = report.history_list_length {
        let _ = writeln!(out, "  InnoDB history list length: {length}");
    }
    if let Some(wal) = report.wal_bytes {
        let _ = writeln!(out, "  -wal file: {}", human_bytes(wal));
    }
    let _ = writeln!(
        out,
        "  oldest due command waited: {}",
        report
            .oldest_due_wait
            .map_or_else(|| "nothing due".to_owned(), human_duration)
    );
    match &report.xmin_holder {
        Some(holder) => {
            let _ = writeln!(
                out,
                "  oldest transaction: {}{}",
                escape_for_log(&describe(holder)),
                holder
                    .query_head
                    .as_ref()
                    .map_or_else(String::new, |q| format!("; last statement: {q}"))
            );
        }
        None if report.engine != "sqlite" => {
            let _ = writeln!(out, "  oldest transaction: none open");
        }
        None => {}
    }
    if report.findings.is_empty() {
        let _ = writeln!(out, "  healthy: nothing to do");
    }
    for finding in &report.findings {
        let _ = writeln!(
            out,
            "  [{}] {}",
            label(finding.severity),
            escape_for_log(&finding.what)
        );
        if !finding.advice.is_empty() {
            let _ = writeln!(out, "      what to do: {}", escape_for_log(&finding.advice));
        }
    }
}

impl Render for DoctorReport {
    fn human(&self, _style: &Style) -> String {
        let mut out = String::new();
        for (i, report) in self.sources.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            source_text(report, &mut out);
        }
        if self.sources.is_empty() {
            out.push_str("No sources.\n");
        }
        out
    }
}
