//! `icq show ID`: one command in full, in any state.

use clap::Args;

use super::GlobalArgs;
use crate::cli::output;
use icq::admin;
use icq::command::CommandId;

/// Arguments of `icq show`.
#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    /// The command id, exactly as stored.
    #[arg(value_name = "ID")]
    pub id: CommandId,
}

/// Runs `icq show`.
pub async fn run(args: ShowArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let result = admin::show(&sources, args.id)
        .await
        .and_then(|row| output::emit(global.format, &row));
    admin::close(&sources).await;
    Ok(result?)
}
