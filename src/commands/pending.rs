//! `icq pending [--by-type]`: how many commands are due, scheduled, running, dead and
//! completed in each source.

use clap::Args;

use super::GlobalArgs;
use crate::{admin, output};

/// Arguments of `icq pending`.
#[derive(Debug, Clone, Args)]
pub struct PendingArgs {
    /// One line per command type instead of one per source.
    #[arg(long)]
    pub by_type: bool,
}

/// Runs `icq pending`.
pub async fn run(args: PendingArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let report = admin::pending(&sources, args.by_type).await;
    admin::close(&sources).await;
    output::emit(global.format, &report?)?;
    Ok(())
}
