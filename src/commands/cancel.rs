//! `icq cancel ID... | --type T | --queue Q`: take pending commands out of the queue
//! (they become dead letters saying "cancelled by operator"). A running command named by
//! its id is cancelled too: its processor loses the lease and stops the handler.

use clap::{ArgGroup, Args};

use super::GlobalArgs;
use crate::cli::output::{self, Confirmation};
use icq::admin::{self, CancelTarget};
use icq::command::CommandId;

/// Arguments of `icq cancel`.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("target").required(true).multiple(true).args(["ids", "type_name", "queue"])))]
pub struct CancelArgs {
    /// Ids of pending commands to cancel, running ones included (the processor running
    /// one stops its handler).
    #[arg(value_name = "ID")]
    pub ids: Vec<CommandId>,

    /// Cancel every pending, not running command of this type, in batches.
    #[arg(long = "type", value_name = "TYPE", conflicts_with = "ids", value_parser = super::parse_non_empty)]
    pub type_name: Option<String>,

    /// Cancel every pending, not running command of this queue (with --type: of that
    /// type in this queue), in batches. Needs a schema version 2 table.
    #[arg(long, value_name = "QUEUE", conflicts_with = "ids", value_parser = super::pending::parse_queue)]
    pub queue: Option<String>,

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

async fn cancel(args: CancelArgs, sources: &[icq::Queue], global: &GlobalArgs) -> icq::Result<()> {
    let bulk = args.type_name.is_some() || args.queue.is_some();
    let target = if bulk {
        CancelTarget::Matching {
            type_name: args.type_name.clone(),
            queue: args.queue.clone(),
        }
    } else {
        CancelTarget::Ids(args.ids.clone())
    };
    let plan = admin::plan_cancel(sources, &target).await?;
    if plan.total() > 0 {
        let mut what = if bulk {
            output::plural(plan.total(), "pending command", "pending commands")
        } else {
            output::plural(plan.total(), "command", "commands")
        };
        if let Some(t) = &args.type_name {
            what.push_str(&format!(" of type {t}"));
        }
        if let Some(q) = &args.queue {
            what.push_str(&format!(" in queue {q}"));
        }
        let running = match plan.running() {
            0 => String::new(),
            1 => " 1 is running: its handler will be stopped.".to_owned(),
            n => format!(" {n} are running: their handlers will be stopped."),
        };
        let sources = plan.sources();
        let noun = if sources.len() == 1 {
            "source"
        } else {
            "sources"
        };
        let question = format!("Cancel {what} in {noun} {}?", sources.join(", "));
        let consequence = format!("They will not run.{running}");
        if !output::confirm(&question, &consequence, args.confirmation)? {
            output::note("Nothing was cancelled.");
            return Ok(());
        }
    }
    let progress = output::progress();
    let report = admin::cancel(&plan, progress.as_ref()).await?;
    output::emit(global.format, &report)
}
