//! How `icq migrate` results read: file paths for `add`, and sqlx-cli's own line shapes for
//! `run`, `revert` and `info` (`Applied 20260101120000/migrate add internal commands (4.2ms)`,
//! `20260101120000/installed add internal commands`), so scripts written against
//! `sqlx migrate` output keep working.

use std::path::PathBuf;

use serde::Serialize;

use super::{Render, Style, plural};
use icq::ident::Engine;
use icq::migrate::{
    Applied, InfoReport, MigrationKind, MigrationPlan, PlanAction, RevertReport, RunReport,
};

/// What `icq migrate add` wrote, or that it had nothing to write.
#[derive(Debug, Serialize)]
pub struct Added {
    /// The engine the SQL is for.
    pub engine: Engine,
    /// The table created or upgraded.
    pub table: String,
    /// `create` (the whole table), `upgrade` (from schema version 1 or 2 to 3) or `up_to_date`
    /// (nothing written).
    pub action: &'static str,
    /// The schema version the directory's migrations leave the table at.
    pub schema_version: u32,
    /// The version prefix of the file names (none when nothing was written).
    pub version: Option<String>,
    /// Simple or reversible (none when nothing was written).
    pub kind: Option<MigrationKind>,
    /// The files written, in order.
    pub files: Vec<PathBuf>,
    /// The migration already there: the version-1 one an upgrade follows, or the one that
    /// makes the directory up to date.
    pub existing: Option<PathBuf>,
}

impl Added {
    /// The report for files `plan` wrote.
    pub fn written(plan: &MigrationPlan, files: Vec<PathBuf>) -> Added {
        let (action, existing) = match &plan.action {
            PlanAction::Create => ("create", None),
            PlanAction::Upgrade { from, .. } => ("upgrade", Some(from.clone())),
            PlanAction::UpToDate { by } => ("up_to_date", Some(by.clone())),
        };
        Added {
            engine: plan.engine,
            table: plan.table.to_string(),
            action,
            schema_version: icq::schema::SCHEMA_VERSION,
            version: Some(plan.version.clone()),
            kind: Some(plan.kind),
            files,
            existing,
        }
    }

    /// The report for a directory that already brings the table to the current version.
    pub fn up_to_date(plan: &MigrationPlan, by: PathBuf) -> Added {
        Added {
            engine: plan.engine,
            table: plan.table.to_string(),
            action: "up_to_date",
            schema_version: icq::schema::SCHEMA_VERSION,
            version: None,
            kind: None,
            files: Vec::new(),
            existing: Some(by),
        }
    }

    /// The sentence an up-to-date directory gets.
    pub fn message(&self) -> String {
        match &self.existing {
            Some(by) if self.files.is_empty() => format!(
                "{} is up to date: {} already brings {} to schema version {}; nothing written \
                 (pass --table NAME for another queue table)\n",
                by.parent().unwrap_or(by).display(),
                by.display(),
                self.table,
                self.schema_version
            ),
            _ => String::new(),
        }
    }
}

impl Render for Added {
    fn human(&self, _style: &Style) -> String {
        if self.files.is_empty() {
            return self.message();
        }
        self.files
            .iter()
            .map(|path| format!("{}\n", path.display()))
            .collect()
    }
}

fn step_line(verb: &str, label: &str, step: &Applied, dry_run: bool) -> String {
    if dry_run {
        format!("{verb} {}/{label} {}\n", step.version, step.description)
    } else {
        format!(
            "{verb} {}/{label} {} ({:.1}ms)\n",
            step.version, step.description, step.elapsed_ms
        )
    }
}

impl Render for RunReport {
    fn human(&self, _style: &Style) -> String {
        let verb = if self.dry_run { "Can apply" } else { "Applied" };
        let mut text: String = self
            .applied
            .iter()
            .map(|step| step_line(verb, "migrate", step, self.dry_run))
            .collect();
        for version in &self.skipped {
            text.push_str(&format!("Skipped {version} (above --target-version)\n"));
        }
        if self.applied.is_empty() {
            let already = plural(self.already_applied as u64, "migration", "migrations");
            text.push_str(&format!(
                "{} is up to date ({already} already applied)\n",
                self.database
            ));
        }
        text
    }
}

impl Render for RevertReport {
    fn human(&self, _style: &Style) -> String {
        if self.reverted.is_empty() {
            return "No migrations available to revert\n".to_owned();
        }
        let verb = if self.dry_run {
            "Can revert"
        } else {
            "Reverted"
        };
        self.reverted
            .iter()
            .map(|step| step_line(verb, "revert", step, self.dry_run))
            .collect()
    }
}

impl Render for InfoReport {
    fn human(&self, _style: &Style) -> String {
        if self.migrations.is_empty() {
            return format!("No migrations in the directory or in {}\n", self.database);
        }
        let mut text = String::new();
        for m in &self.migrations {
            text.push_str(&format!(
                "{}/{} {}\n",
                m.version,
                m.state.label(),
                m.description
            ));
            if let (Some(applied), Some(local)) = (&m.applied_checksum, &m.local_checksum) {
                text.push_str(&format!("applied migration had checksum {applied}\n"));
                text.push_str(&format!("local migration has checksum {local}\n"));
            }
        }
        text
    }
}
