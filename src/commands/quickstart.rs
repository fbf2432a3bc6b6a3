//! `icq quickstart`: a tour on the database the command line names (default: the embedded
//! SQLite one), in a table of its own that each run starts afresh — schedules sample
//! commands (one always fails), runs the worker until idle, then shows what `pending` and
//! `dead-letters list` say. Under `--format json` the whole tour is one document on
//! stdout and nothing else is printed.

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::Format;
use crate::cli::demo::{self, TourReport};
use crate::cli::output;
use crate::cli::sources::Source;
use icq::{Processor, RunOptions};

/// Arguments of `icq quickstart`.
#[derive(Debug, Args)]
pub struct QuickstartArgs {}

/// Runs the tour.
pub async fn run(_args: QuickstartArgs, global: &super::GlobalArgs) -> anyhow::Result<()> {
    let people = global.format == Format::Table;
    let target = demo::target(&global.source_request())?;
    let url = target.url.expose().to_owned();
    say(
        people,
        &format!(
            "using {} (source `{}`), table {}",
            icq::redact::redact_url(&url),
            target.name,
            target.table
        ),
    );
    let source = demo::reset(&target).await?;
    let result = tour(&source, &url, people).await;
    source.queue.close().await;
    let report = result?;
    match global.format {
        Format::Json => output::raw(&format!("{}\n", serde_json::to_string_pretty(&report)?))?,
        Format::Table => show(&report)?,
    }
    Ok(())
}

/// Schedules the samples, works them off and reads back what happened.
async fn tour(source: &Source, url: &str, people: bool) -> anyhow::Result<TourReport> {
    let commands = demo::commands();
    source.queue.schedule_many(&commands).await?;
    say(
        people,
        &format!(
            "scheduled {} sample commands (the one of type {} always fails); running the worker until idle",
            commands.len(),
            demo::FLAKY
        ),
    );
    let mut processor = Processor::new(demo::registry());
    processor.add_source(source.queue.source_handle(source.settings.clone()));
    let progress = super::progress::RunProgress::start(
        vec![source.queue.stats().clone()],
        Some(commands.len() as u64),
    );
    let mut options = RunOptions::default();
    options.until_idle = true;
    processor.run(options, CancellationToken::new()).await?;
    progress.finish();
    Ok(TourReport::collect(source, url, commands.len() as u64).await?)
}

/// The tour's result for people: the counts, then the two tables, then what to try next.
fn show(report: &TourReport) -> anyhow::Result<()> {
    output::note(&format!(
        "done: {} succeeded, {} failed attempts retried, {} dead-lettered",
        report.succeeded, report.failed_attempts, report.dead_lettered
    ));
    output::note("\n$ icq pending");
    output::emit(Format::Table, &report.pending)?;
    output::note("\n$ icq dead-letters list");
    output::emit(Format::Table, &report.dead_letters)?;
    output::note(&format!(
        "\nThe samples stay in table {table} until the next tour replaces them. Next: write an \
         icq.yaml with a source of `url: {url}` and `table: {table}` to try \
         `icq dead-letters show ID` or `icq requeue ID --yes` on them, or point `table:` at \
         your own commands (see README).",
        table = report.table,
        url = report.database
    ));
    Ok(())
}

/// A note for people; nothing under `--format json`, whose one document is the result.
fn say(people: bool, text: &str) {
    if people {
        output::note(text);
    }
}
