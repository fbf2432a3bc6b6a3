//! `icq replay ID...`: schedule a new pending copy (type, payload, captured context) of
//! completed or dead commands.

use clap::Args;

use super::GlobalArgs;
use crate::cli::output;
use icq::admin;
use icq::command::CommandId;

/// Arguments of `icq replay`.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// Ids of completed or dead commands to run again as new commands.
    #[arg(value_name = "ID", required = true)]
    pub ids: Vec<CommandId>,
}

/// Runs `icq replay`.
pub async fn run(args: ReplayArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let result = admin::replay(&sources, &args.ids)
        .await
        .and_then(|report| output::emit(global.format, &report));
    admin::close(&sources).await;
    Ok(result?)
}
