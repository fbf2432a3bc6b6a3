//! `icq config check`: validates the configuration file without connecting to a database.

use clap::Subcommand;

use super::GlobalArgs;
use crate::cli::config::{CheckReport, ConfigRequest};
use crate::cli::output::{self, Render, Style};

/// Configuration subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the file (keys, values, settings, handlers and their programs) without
    /// connecting to any database; prints its sources and handlers.
    #[command(after_help = super::man::CONFIG)]
    Check,
}

/// Runs a configuration subcommand.
pub fn run(command: ConfigCommand, global: &GlobalArgs) -> anyhow::Result<()> {
    match command {
        ConfigCommand::Check => check(global),
    }
}

/// `icq config check`: the report on stdout, or the problems as the error (exit 2).
fn check(global: &GlobalArgs) -> anyhow::Result<()> {
    let report = crate::cli::config::check_file(&ConfigRequest {
        config_path: global.config.clone(),
        database_url: global.database_url.clone(),
        source: global.source.clone(),
    })?;
    output::emit(global.format, &report)?;
    Ok(())
}

impl Render for CheckReport {
    fn human(&self, _style: &Style) -> String {
        let mut out = format!("{}: OK\n", self.path);
        out.push_str(&format!(
            "{}:\n",
            output::plural(self.sources.len() as u64, "source", "sources")
        ));
        for source in &self.sources {
            out.push_str(&format!(
                "  {} ({}, table {})\n",
                source.name, source.engine, source.table
            ));
            for queue in &source.queues {
                out.push_str(&format!(
                    "    queue {} (concurrency {})\n",
                    queue.name, queue.concurrency
                ));
            }
            for schedule in &source.schedules {
                out.push_str(&format!(
                    "    schedule {} ({}, {}) -> {}\n",
                    schedule.name, schedule.expression, schedule.time_zone, schedule.type_name
                ));
            }
        }
        out.push_str(&format!(
            "{}:\n",
            output::plural(self.handlers.len() as u64, "handler", "handlers")
        ));
        for handler in &self.handlers {
            let target = handler
                .target
                .as_deref()
                .map_or_else(String::new, |t| format!(" {t}"));
            out.push_str(&format!(
                "  {} ({}{target})\n",
                handler.type_name, handler.kind
            ));
        }
        for warning in &self.warnings {
            out.push_str(&format!("warning: {warning}\n"));
        }
        out
    }
}
