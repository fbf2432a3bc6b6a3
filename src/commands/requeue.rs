//! `icq requeue ID... | --all-dead [--type T] [--queue Q]`: put commands back to pending
//! now, with their attempts reset and their `LastError` kept. A dead letter whose unique
//! key a pending row holds stays dead and is reported skipped.

use clap::{ArgGroup, Args};

use super::GlobalArgs;
use crate::cli::output::{self, Confirmation};
use icq::admin::{self, RequeueTarget};
use icq::command::CommandId;

/// Arguments of `icq requeue`.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["ids", "all_dead"])))]
pub struct RequeueArgs {
    /// Ids of the commands to requeue (dead, or pending and not running).
    #[arg(value_name = "ID")]
    pub ids: Vec<CommandId>,

    /// Requeue every dead letter, in batches.
    #[arg(long, conflicts_with = "ids")]
    pub all_dead: bool,

    /// With --all-dead: only dead letters of this command type.
    #[arg(long = "type", value_name = "TYPE", requires = "all_dead", conflicts_with = "ids",
          value_parser = super::parse_non_empty)]
    pub type_name: Option<String>,

    /// With --all-dead: only dead letters of this queue (needs a schema version 2 table).
    #[arg(long, value_name = "QUEUE", requires = "all_dead", conflicts_with = "ids",
          value_parser = super::pending::parse_queue)]
    pub queue: Option<String>,

    /// Confirmation.
    #[command(flatten)]
    pub confirmation: Confirmation,
}

/// Runs `icq requeue`.
pub async fn run(args: RequeueArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let result = requeue(args, &sources, global).await;
    admin::close(&sources).await;
    Ok(result?)
}

async fn requeue(
    args: RequeueArgs,
    sources: &[icq::Queue],
    global: &GlobalArgs,
) -> icq::Result<()> {
    let target = if args.all_dead {
        RequeueTarget::AllDead {
            type_name: args.type_name.clone(),
            queue: args.queue.clone(),
        }
    } else {
        RequeueTarget::Ids(args.ids.clone())
    };
    let plan = admin::plan_requeue(sources, &target).await?;
    for skipped in plan.skipped() {
        output::note(&format!(
            "Command {} stays dead: {}.",
            skipped.id, skipped.reason
        ));
    }
    if plan.total() > 0 && !output::confirm(&question(&plan, &args), "", args.confirmation)? {
        output::note("Nothing was requeued.");
        return Ok(());
    }
    let progress = output::progress();
    let report = admin::requeue(&plan, progress.as_ref()).await?;
    output::emit(global.format, &report)
}

fn question(plan: &admin::RequeuePlan, args: &RequeueArgs) -> String {
    let total = plan.total();
    let mut what = if args.all_dead {
        output::plural(total, "dead letter", "dead letters")
    } else {
        output::plural(total, "command", "commands")
    };
    if let Some(t) = &args.type_name {
        what.push_str(&format!(" of type {t}"));
    }
    if let Some(q) = &args.queue {
        what.push_str(&format!(" in queue {q}"));
    }
    let sources: Vec<&str> = plan.per_source().into_iter().map(|(s, _)| s).collect();
    let noun = if sources.len() == 1 {
        "source"
    } else {
        "sources"
    };
    format!("Requeue {what} in {noun} {}?", sources.join(", "))
}
