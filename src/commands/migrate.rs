//! `icq migrate add|run` (placeholder; being written).

use clap::Subcommand;

/// Migration subcommands.
#[derive(Debug, Subcommand)]
pub enum MigrateCommand {
    /// Write the migration that creates the commands table.
    Add,
    /// Apply pending migrations.
    Run,
}

/// Runs a migrate subcommand.
pub async fn run(_cmd: MigrateCommand, _global: &super::GlobalArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
