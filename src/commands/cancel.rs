//! `icq cancel ID... | --type T`: take pending commands out of the queue without running
//! them (they become dead letters saying "cancelled by operator").

use clap::{ArgGroup, Args};

use super::GlobalArgs;
use crate::admin::{self, CancelTarget};
use crate::command::CommandId;
use crate::output::{self, Confirmation};

/// Arguments of `icq cancel`.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["ids", "type_name"])))]
pub struct CancelArgs {
    /// Ids of pending commands to cancel (not running ones).
    #[arg(value_name = "ID")]
    pub ids: Vec<CommandId>,

    /// Cancel every pending, not running command of this type, in batches.
    #[arg(long = "type", value_name = "TYPE", conflicts_with = "ids", value_parser = super::parse_non_empty)]
    pub type_name: Option<String>,

    /// Confirmation.
    #[command(flatten)]
    pub confirmation: Confirmation,
}

/// Runs `icq cancel`.
pub async fn run(args: CancelArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let result = cancel(args, &sources, global).await;
    admin::close(&sources).await;
    Ok(result?)
}

async fn cancel(
    args: CancelArgs,
    sources: &[crate::sources::OpenSource],
    global: &GlobalArgs,
) -> crate::Result<()> {
    let target = match &args.type_name {
        Some(type_name) => CancelTarget::Type(type_name.clone()),
        None => CancelTarget::Ids(args.ids.clone()),
    };
    let plan = admin::plan_cancel(sources, &target).await?;
    if plan.total() > 0 {
        let what = match &args.type_name {
            Some(t) => format!(
                "{} of type {t}",
                output::plural(plan.total(), "pending command", "pending commands")
            ),
            None => output::plural(plan.total(), "command", "commands"),
        };
        let question = format!(
            "Cancel {what} in {}? They will not run.",
            plan.sources().join(", ")
        );
        if !output::confirm(&question, args.confirmation)? {
            output::note("Nothing was cancelled.");
            return Ok(());
        }
    }
    let progress = output::progress();
    let report = admin::cancel(&plan, progress.as_ref()).await?;
    output::emit(global.format, &report)
}
