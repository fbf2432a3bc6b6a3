//! `icq quickstart`: a tour on the embedded SQLite default — schedules sample commands
//! (one always fails), runs the worker until idle, then shows `pending` and
//! `dead-letters list`.

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, DeadLetterQuery};
use crate::output;
use crate::processor::{Processor, RunOptions};

/// Arguments of `icq quickstart`.
#[derive(Debug, Args)]
pub struct QuickstartArgs {}

/// Runs the tour.
pub async fn run(_args: QuickstartArgs, global: &super::GlobalArgs) -> anyhow::Result<()> {
    let embedded = crate::config::embedded_default()?;
    output::note(&format!(
        "using the embedded default database: {}",
        embedded.url
    ));
    let mut source = crate::sources::open_one(&embedded).await?;
    source.settings = crate::demo::settings();
    let commands = crate::demo::commands();
    source.queue.schedule_many(&commands).await?;
    output::note(&format!(
        "scheduled {} sample commands (the one of type {} always fails); running the worker until idle",
        commands.len(),
        crate::demo::FLAKY
    ));

    let mut processor = Processor::new(crate::demo::registry());
    processor.add_source(source.queue.source_handle(source.settings.clone()));
    let progress = super::progress::RunProgress::start(
        vec![source.queue.stats().clone()],
        Some(commands.len() as u64),
    );
    let options = RunOptions {
        until_idle: true,
        ..RunOptions::default()
    };
    processor.run(options, CancellationToken::new()).await?;
    progress.finish();
    let stats = source.queue.stats().snapshot();
    output::note(&format!(
        "done: {} succeeded, {} failed attempts retried, {} dead-lettered",
        stats.succeeded, stats.failed, stats.dead_lettered
    ));

    let sources = vec![source];
    output::note("\n$ icq pending");
    output::emit(global.format, &admin::pending(&sources, false).await?)?;
    output::note("\n$ icq dead-letters list");
    output::emit(
        global.format,
        &admin::dead_letters(&sources, &DeadLetterQuery::default()).await?,
    )?;
    output::note(
        "\nNext: `icq dead-letters show ID`, `icq requeue ID --yes`, or write an icq.yaml (see README).",
    );
    admin::close(&sources).await;
    Ok(())
}
