//! The one place that writes results: tables for people, one JSON document for scripts,
//! plus the two pieces of terminal interaction the operator commands need (confirmation
//! prompts and progress bars).
//!
//! - **JSON** (`--format json`): the report's `Serialize` form, pretty-printed, on stdout,
//!   exactly the shapes documented in the README. Nothing else is ever written to stdout.
//! - **Tables** (`--format table`): comfy-table, fitted to the terminal width (or to
//!   `$COLUMNS` when set); long error texts are cut to their first line and a bounded
//!   length. Colour only on a terminal and never when `$NO_COLOR` is set.
//! - **Prompts and progress** go to stderr and only on a terminal: a destructive command
//!   off a terminal needs `--yes` instead, and progress bars are simply not drawn.

mod grid;
pub mod migrate;

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, Utc};
use clap::Args;
use comfy_table::{
    Attribute, Cell, CellAlignment, Color, ContentArrangement, Table, modifiers, presets,
};
use serde::Serialize;

use crate::cli::bench::BenchReport;
use icq::admin::FinishedKind;
use icq::admin::{
    CancelReport, DeadLetterReport, ListReport, PendingReport, Progress, PurgeCount, PurgeReport,
    ReplayReport, RequeueReport, Scheduled, ScheduledMany, ShownCommand,
};
use icq::command::State;
use icq::error::{Error, Result};
use icq::redact::escape_for_log;

/// How results are written to stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Tables for people.
    Table,
    /// One JSON document, for scripts.
    Json,
}

/// Longest field value `show` prints in its table.
const SHOWN_WIDTH: usize = 4096;

pub use grid::{Column, FALLBACK_WIDTH, Grid};

/// Set when `--format table` was given explicitly: tables even off a terminal.
static TABLE_REQUESTED: AtomicBool = AtomicBool::new(false);

/// Records that `--format table` was given on the command line (or in `$ICQ_FORMAT`):
/// a pipe then gets the table too, not tab-separated lines.
pub fn request_tables(requested: bool) {
    TABLE_REQUESTED.store(requested, Ordering::Relaxed);
}

/// How tables are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// Colour headers (stdout is a terminal and `$NO_COLOR` is unset).
    pub color: bool,
    /// Fit tables to this many columns (`$COLUMNS`); `None` asks the terminal, and falls
    /// back to [`FALLBACK_WIDTH`] when it does not know.
    pub width: Option<u16>,
    /// Print tab-separated lines instead of tables: stdout is not a terminal and
    /// `--format table` was not given explicitly.
    pub tsv: bool,
}

impl Style {
    /// The style for stdout in this environment.
    pub fn detect() -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let terminal = std::io::stdout().is_terminal();
        Style {
            color: !no_color && terminal,
            width: std::env::var("COLUMNS")
                .ok()
                .and_then(|c| c.trim().parse().ok())
                .filter(|w| *w > 0),
            tsv: !terminal && !TABLE_REQUESTED.load(Ordering::Relaxed),
        }
    }

    /// The width tables are fitted to: `$COLUMNS`, the terminal's, or
    /// [`FALLBACK_WIDTH`] when neither is known (or the terminal reports 0).
    pub fn columns(&self) -> usize {
        let width = self
            .width
            .or_else(|| Table::new().width())
            .filter(|w| *w > 0)
            .unwrap_or(FALLBACK_WIDTH);
        usize::from(width)
    }

    /// A table with icq's look: condensed UTF-8 borders, fitted to the width.
    pub fn table(&self, headers: &[&str]) -> Table {
        let mut table = Table::new();
        table
            .load_preset(presets::UTF8_FULL_CONDENSED)
            .apply_modifier(modifiers::UTF8_ROUND_CORNERS)
            .set_content_arrangement(ContentArrangement::Dynamic);
        table.set_width(self.columns() as u16);
        table.set_header(headers.iter().map(|h| self.header(h)));
        table
    }

    fn header(&self, text: &str) -> Cell {
        let cell = Cell::new(text);
        if self.color {
            cell.add_attribute(Attribute::Bold).fg(Color::Cyan)
        } else {
            cell
        }
    }
}

/// A result the CLI prints: its JSON form is its `Serialize` form.
pub trait Render: Serialize {
    /// The form for people.
    fn human(&self, style: &Style) -> String;

    /// The result as rows and columns, when it is a listing: drawn as a fitted table on
    /// a terminal and as tab-separated lines in a pipe. `None` for a sentence.
    fn grid(&self) -> Option<Grid> {
        None
    }
}

/// A listing's human form: its grid as a table fitted to the width.
fn listing(grid: Grid, style: &Style) -> String {
    grid.table(style, style.columns())
}

/// Writes `report` to stdout in `format`. A closed pipe (`icq … | head`) is not an error.
pub fn emit<R: Render + ?Sized>(format: Format, report: &R) -> Result<()> {
    let mut text = match format {
        Format::Json => serde_json::to_string_pretty(report)
            .map_err(|e| Error::io("rendering the result as JSON")(std::io::Error::other(e)))?,
        Format::Table => {
            let style = Style::detect();
            match report.grid() {
                Some(grid) if style.tsv => grid.tsv(),
                _ => report.human(&style),
            }
        }
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    raw(&text)
}

/// Writes a note for people to stderr (never part of a command's result).
pub fn note(text: &str) {
    // A closed stderr (`icq … 2>&1 | head -0`) is not worth a panic: the note is lost.
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Writes `text` to stdout as it is; a closed pipe is not an error.
pub fn raw(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::io("writing to stdout")(err))
        }
        _ => Ok(()),
    }
}

/// What a listing shows for a value icq could not read (the reason is in the row's last
/// error, or its defects): never the placeholder the decoder left, which would read as a
/// real time (1970-01-01).
const UNREADABLE: &str = "(unreadable)";

fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn opt_time(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), time)
}

fn opt(text: Option<&str>) -> String {
    text.map_or_else(|| "-".to_owned(), str::to_owned)
}

/// `text` for a multi-line cell: line breaks kept, every other control character
/// escaped, at most `max_chars` characters (the JSON form has the rest).
fn printable(text: &str, max_chars: usize) -> String {
    let mut out: String = text
        .split('\n')
        .map(|line| escape_for_log(line.trim_end_matches('\r')))
        .collect::<Vec<_>>()
        .join("\n");
    if out.chars().count() > max_chars {
        let total = text.len();
        out = out.chars().take(max_chars).collect();
        out.push_str(&format!(
            "… ({total} bytes in all; --format json shows everything)"
        ));
    }
    out
}

fn number(n: u64) -> Cell {
    Cell::new(n).set_alignment(CellAlignment::Right)
}

/// `n` followed by the singular or plural noun: `1 command`, `2 commands`.
pub fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

impl Render for PendingReport {
    fn human(&self, style: &Style) -> String {
        if self.rows.is_empty() {
            return "No commands.".into();
        }
        listing(self.grid().unwrap_or_default(), style)
    }

    fn grid(&self) -> Option<Grid> {
        let sourced = self.source_count > 1;
        let mut columns = Vec::new();
        if sourced {
            columns.push(Column::whole("Source"));
        }
        if self.by_queue {
            columns.push(Column::shrinkable("Queue", 6, 1));
        }
        if self.by_type {
            columns.push(Column::shrinkable("Type", 6, 0));
        }
        for header in ["Due", "Scheduled", "Running", "Dead", "Completed"] {
            columns.push(Column::whole(header).right());
        }
        let mut grid = Grid::new(columns);
        for row in &self.rows {
            let mut cells = Vec::new();
            if sourced {
                cells.push(row.source.clone());
            }
            if self.by_queue {
                let queue = row.counts.queue.clone().unwrap_or_default();
                cells.push(if row.paused {
                    format!("{queue} (paused)")
                } else {
                    queue
                });
            }
            if self.by_type {
                cells.push(row.counts.type_name.clone().unwrap_or_default());
            }
            let c = &row.counts;
            cells.extend(
                [c.due, c.scheduled, c.running, c.dead, c.completed].map(|n| n.to_string()),
            );
            grid.push(cells);
        }
        Some(grid)
    }
}

impl Render for DeadLetterReport {
    fn human(&self, style: &Style) -> String {
        if self.rows.is_empty() {
            return "No dead letters.".into();
        }
        listing(self.grid().unwrap_or_default(), style)
    }

    fn grid(&self) -> Option<Grid> {
        let sourced = self.source_count > 1;
        let mut columns = Vec::new();
        if sourced {
            columns.push(Column::whole("Source"));
        }
        columns.extend([
            Column::whole("Id"),
            Column::shrinkable("Type", 6, 1),
            Column::shrinkable("Queue", 6, 2).droppable(2),
            Column::whole("Attempts").right().droppable(0),
            Column::whole("Dead lettered at").droppable(1),
            Column::shrinkable("Last error", 10, 0),
        ]);
        let mut grid = Grid::new(columns);
        for row in &self.rows {
            let s = &row.summary;
            let mut cells = Vec::new();
            if sourced {
                cells.push(row.source.clone());
            }
            cells.extend([
                s.id.as_str().to_owned(),
                s.type_name.clone(),
                s.queue.clone(),
                s.attempts.to_string(),
                time(s.dead_lettered_at),
                s.last_error.clone().unwrap_or_else(|| "-".to_owned()),
            ]);
            grid.push(cells);
        }
        Some(grid)
    }
}

impl Render for ShownCommand {
    fn human(&self, style: &Style) -> String {
        listing(self.grid().unwrap_or_default(), style)
    }

    fn grid(&self) -> Option<Grid> {
        let r = &self.row;
        let unreadable = icq::command::unreadable_columns(&r.defects);
        let time = |column: &str, at: DateTime<Utc>| {
            if unreadable.iter().any(|c| c == column) {
                UNREADABLE.to_owned()
            } else {
                time(at)
            }
        };
        let opt_time = |column: &str, at: Option<DateTime<Utc>>| {
            if unreadable.iter().any(|c| c == column) {
                UNREADABLE.to_owned()
            } else {
                opt_time(at)
            }
        };
        let payload =
            serde_json::to_string_pretty(&r.payload).unwrap_or_else(|_| r.payload.to_string());
        let roles = if r.roles.is_empty() {
            "-".to_owned()
        } else {
            r.roles.join(", ")
        };
        let view = &self.attempts;
        let state = match (&view.held_by, view.succeeded_on_attempt) {
            (Some(holder), _) => format!(
                "{} (held behind {holder}, the oldest pending command of its order key)",
                self.state.as_str()
            ),
            (None, Some(attempt)) => {
                format!("{} (attempt {attempt} succeeded)", self.state.as_str())
            }
            (None, None) => self.state.as_str().to_owned(),
        };
        let fields: Vec<(&str, String)> = vec![
            ("Source", self.source.clone()),
            ("Id", r.id.to_string()),
            ("State", state),
            ("Type", r.type_name.clone()),
            ("Queue", r.queue.clone()),
            ("Priority", r.priority.to_string()),
            ("Unique key", opt(r.unique_key.as_deref())),
            ("Order key", opt(r.order_key.as_deref())),
            ("Concurrency key", opt(r.concurrency_key.as_deref())),
            ("Attempts", r.attempts.to_string()),
            ("Snoozes", r.snoozes.to_string()),
            ("Created at", time("CreatedAt", r.created_at)),
            ("Run at", time("RunAt", r.run_at)),
            ("Processed at", opt_time("ProcessedAt", r.processed_at)),
            (
                "Dead lettered at",
                opt_time("DeadLetteredAt", r.dead_lettered_at),
            ),
            (
                "Lock token",
                r.lock_token
                    .map_or_else(|| "-".to_owned(), |t| t.to_string()),
            ),
            ("Locked until", opt_time("LockedUntil", r.locked_until)),
            ("User id", opt(r.user_id.as_deref())),
            ("Roles", roles),
            ("Tenant id", opt(r.tenant_id.as_deref())),
            ("Correlation id", opt(r.correlation_id.as_deref())),
            ("Trace parent", opt(r.trace_parent.as_deref())),
            (
                "Last error",
                opt(earlier_error(self.state, r.last_error.as_deref()).as_deref()),
            ),
            ("Attempt errors", attempt_errors(&view.attempt_errors)),
            ("Payload", payload),
        ];
        let mut grid = Grid::new(vec![
            Column::whole("Field"),
            Column::shrinkable("Value", 20, 0).multiline(),
        ])
        .with_row_headers();
        for (name, value) in fields {
            grid.push(vec![name.to_owned(), printable(&value, SHOWN_WIDTH)]);
        }
        Some(grid)
    }
}

/// The failed attempts as a table shows them, one per line, oldest first:
/// `#2 2030-01-01T06:00:00.000Z: timeout`.
fn attempt_errors(errors: &[icq::attempts::AttemptError]) -> String {
    if errors.is_empty() {
        return "-".to_owned();
    }
    errors
        .iter()
        .map(|e| {
            format!(
                "#{} {}: {}",
                e.attempt.map_or_else(|| "?".to_owned(), |n| n.to_string()),
                e.at.as_deref().unwrap_or("?"),
                e.error
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The last error as a table shows it: on a completed command it is an earlier attempt's
/// (a later one succeeded), and says so, so it does not read as the outcome. The JSON
/// form keeps `last_error` as stored, next to `state`.
fn earlier_error(state: State, error: Option<&str>) -> Option<String> {
    let error = error?;
    Some(if state == State::Completed {
        format!("(before it completed) {error}")
    } else {
        error.to_owned()
    })
}

/// The command that shows the page after `report`, for people: written on stderr by
/// `icq list` (its own line, so it neither wraps into the table's summary nor mixes into a
/// pipe's result). `None` on the last page.
pub fn next_page_hint(report: &ListReport) -> Option<String> {
    let state = serde_json::to_value(report.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    report.next_after.as_ref().map(|next| {
        format!(
            "Next page: icq list --state {state} --after {}",
            escape_for_log(next.as_str())
        )
    })
}

impl Render for ListReport {
    fn human(&self, style: &Style) -> String {
        let state = serde_json::to_value(self.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        if self.commands.is_empty() {
            return format!("No {state} commands in source {}.", self.source);
        }
        let mut text = listing(self.grid().unwrap_or_default(), style);
        text.push_str(&format!(
            "\nShowing {} of {} {state} commands in source {}.",
            self.commands.len(),
            self.total.max(self.commands.len() as u64),
            self.source
        ));
        text
    }

    fn grid(&self) -> Option<Grid> {
        let when = match self.state {
            icq::admin::ListState::Dead => "Dead lettered at",
            icq::admin::ListState::Completed => "Processed at",
            _ => "Run at",
        };
        let mut grid = Grid::new(vec![
            Column::whole("Id"),
            Column::shrinkable("Type", 6, 1),
            Column::shrinkable("Queue", 6, 2).droppable(3),
            Column::whole("State").droppable(1),
            Column::whole("Attempts").right().droppable(0),
            Column::whole(when).droppable(2),
            Column::shrinkable("Last error", 10, 0),
        ]);
        let key_column = match self.state {
            icq::admin::ListState::Dead => "DeadLetteredAt",
            icq::admin::ListState::Completed => "ProcessedAt",
            _ => "RunAt",
        };
        for c in &self.commands {
            let when = if c.unreadable.iter().any(|col| col == key_column) {
                UNREADABLE.to_owned()
            } else {
                c.key_time(self.state).map_or_else(|| "-".to_owned(), time)
            };
            grid.push(vec![
                c.id.as_str().to_owned(),
                c.type_name.clone(),
                c.queue.clone(),
                c.state.as_str().to_owned(),
                c.attempts.to_string(),
                when,
                earlier_error(c.state, c.last_error.as_deref()).unwrap_or_else(|| "-".to_owned()),
            ]);
        }
        Some(grid)
    }
}

impl Render for CancelReport {
    fn human(&self, _style: &Style) -> String {
        let running = match self.were_running {
            0 => String::new(),
            1 => ", 1 of them running (its processor stops the handler)".to_owned(),
            n => format!(", {n} of them running (their processors stop the handlers)"),
        };
        format!(
            "Cancelled {}{running}: they are dead letters now (LastError \"{}\").",
            plural(self.cancelled, "command", "commands"),
            icq::admin::CANCELLED
        )
    }
}

impl Render for RequeueReport {
    fn human(&self, _style: &Style) -> String {
        let mut text = format!("Requeued {}.", plural(self.requeued, "command", "commands"));
        for skipped in &self.skipped {
            text.push_str(&format!(
                "\nSkipped {}: {}; it stays dead.",
                skipped.id,
                escape_for_log(&skipped.reason)
            ));
        }
        text
    }
}

/// What purge counts amount to: `3 completed commands and 1 dead letter`.
pub fn describe_purge(counts: &[PurgeCount]) -> String {
    let (mut completed, mut dead) = (None, None);
    for c in counts {
        let slot = match c.kind {
            FinishedKind::Completed => &mut completed,
            FinishedKind::DeadLetters => &mut dead,
        };
        *slot = Some(slot.unwrap_or(0) + c.count);
    }
    let parts: Vec<String> = [
        completed.map(|n| plural(n, "completed command", "completed commands")),
        dead.map(|n| plural(n, "dead letter", "dead letters")),
    ]
    .into_iter()
    .flatten()
    .collect();
    parts.join(" and ")
}

/// ` of type T in queue Q` for a purge limited to a type and/or a queue, else empty.
pub fn purge_filter(type_name: Option<&str>, queue: Option<&str>) -> String {
    let mut text = String::new();
    if let Some(t) = type_name {
        text.push_str(&format!(" of type {t}"));
    }
    if let Some(q) = queue {
        text.push_str(&format!(" in queue {q}"));
    }
    text
}

impl Render for PurgeReport {
    fn human(&self, style: &Style) -> String {
        let verb = if self.dry_run {
            "Would delete"
        } else {
            "Deleted"
        };
        let mut text = format!(
            "{verb} {}{}",
            describe_purge(&self.counts),
            purge_filter(self.type_name.as_deref(), self.queue.as_deref())
        );
        if self.source_count > 1 {
            let mut table = style.table(&["Source", "Completed", "Dead letters"]);
            let mut sources: Vec<&str> = self.counts.iter().map(|c| c.source.as_str()).collect();
            sources.dedup();
            for source in sources {
                let of = |kind| {
                    self.counts
                        .iter()
                        .filter(|c| c.source == source && c.kind == kind)
                        .map(|c| c.count)
                        .sum::<u64>()
                };
                table.add_row([
                    Cell::new(source),
                    number(of(FinishedKind::Completed)),
                    number(of(FinishedKind::DeadLetters)),
                ]);
            }
            text = format!("{table}\n{text}");
        }
        if self.dry_run {
            text.push_str(" (dry run: nothing was deleted)");
        }
        text.push('.');
        text
    }
}

impl Render for ReplayReport {
    fn human(&self, style: &Style) -> String {
        listing(self.grid().unwrap_or_default(), style)
    }

    fn grid(&self) -> Option<Grid> {
        let sourced = self.source_count > 1;
        let mut columns = Vec::new();
        if sourced {
            columns.push(Column::whole("Source"));
        }
        columns.extend([Column::whole("Replayed"), Column::whole("New id")]);
        // Shown only when a pending row already held a replayed row's unique key.
        let existing = self.replayed.iter().any(|r| r.existing);
        if existing {
            columns.push(Column::whole("Note"));
        }
        let mut grid = Grid::new(columns);
        for r in &self.replayed {
            let mut cells = Vec::new();
            if sourced {
                cells.push(r.source.clone());
            }
            cells.extend([r.from.as_str().to_owned(), r.id.as_str().to_owned()]);
            if existing {
                cells.push(if r.existing {
                    "already pending with its unique key (no copy made)".to_owned()
                } else {
                    "-".to_owned()
                });
            }
            grid.push(cells);
        }
        Some(grid)
    }
}

impl Render for icq::admin::QueueChangeReport {
    fn human(&self, _style: &Style) -> String {
        self.changes
            .iter()
            .map(|c| {
                let (now, already) = if c.paused {
                    ("paused", "was already paused")
                } else {
                    ("resumed", "was not paused")
                };
                if c.changed {
                    format!("{}: queue {} {now}", c.source, c.queue)
                } else {
                    format!("{}: queue {} {already}", c.source, c.queue)
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Render for icq::admin::QueueListReport {
    fn human(&self, style: &Style) -> String {
        if self.queues.is_empty() {
            return "No queues: nothing pending and none paused.".to_owned();
        }
        listing(self.grid().unwrap_or_default(), style)
    }

    fn grid(&self) -> Option<Grid> {
        let mut grid = Grid::new(vec![
            Column::whole("Source"),
            Column::whole("Queue"),
            Column::whole("State"),
            Column::whole("Due"),
            Column::whole("Running"),
            Column::whole("Scheduled"),
        ]);
        for q in &self.queues {
            let state = match (q.paused, q.paused_at) {
                (true, Some(at)) => format!("paused since {}", time(at)),
                (true, None) => "paused".to_owned(),
                (false, _) => "running".to_owned(),
            };
            grid.push(vec![
                q.source.clone(),
                q.queue.clone(),
                state,
                q.due.to_string(),
                q.running.to_string(),
                q.scheduled.to_string(),
            ]);
        }
        Some(grid)
    }
}

impl Render for Scheduled {
    fn human(&self, _style: &Style) -> String {
        self.summary()
    }
}

impl Render for ScheduledMany {
    fn human(&self, _style: &Style) -> String {
        self.summary(|n| plural(n, "command", "commands"))
    }
}

impl Render for BenchReport {
    fn human(&self, style: &Style) -> String {
        listing(self.grid().unwrap_or_default(), style)
    }

    fn grid(&self) -> Option<Grid> {
        let figure = |x: f64, places: usize| format!("{x:.places$}");
        let rows: [(&str, String); 8] = [
            ("engine", self.engine.to_string()),
            ("jobs", self.jobs.to_string()),
            ("enqueue_single_per_s", figure(self.enqueue_single_per_s, 0)),
            ("enqueue_bulk_per_s", figure(self.enqueue_bulk_per_s, 0)),
            ("drain_per_s", figure(self.drain_per_s, 0)),
            ("latency_p50_ms", figure(self.latency_p50_ms, 2)),
            ("latency_p99_ms", figure(self.latency_p99_ms, 2)),
            ("rss_mb", figure(self.rss_mb, 1)),
        ];
        let mut grid = Grid::new(vec![
            Column::whole("Measure"),
            Column::whole("Value").right(),
        ]);
        for (name, value) in rows {
            grid.push(vec![name.to_owned(), value]);
        }
        Some(grid)
    }
}

// ---------------------------------------------------------------------------------------
// interaction

/// The `-y/--yes` flag of destructive commands.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct Confirmation {
    /// Do not ask for confirmation (required when not running on a terminal).
    #[arg(short = 'y', long)]
    pub yes: bool,
}

/// Asks "`question` `consequence` [y/N]" on a terminal (`consequence`, which may be empty,
/// says what follows from a yes). With `--yes` the answer is yes without asking; off a
/// terminal without `--yes` it is an [`Error::Refused`] (exit 2) naming the action the
/// question asks about, and nothing happens.
pub fn confirm(question: &str, consequence: &str, confirmation: Confirmation) -> Result<bool> {
    if confirmation.yes {
        return Ok(true);
    }
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return Err(refusal(question));
    }
    let prompt = if consequence.is_empty() {
        question.to_owned()
    } else {
        format!("{question} {consequence}")
    };
    dialoguer::Confirm::new()
        .with_prompt(prompt)
        .default(false)
        .interact()
        .map_err(|dialoguer::Error::IO(err)| Error::io("asking for confirmation")(err))
}

/// The refusal of [`confirm`] off a terminal: the question turned into the action it asks
/// about ("Cancel 2 commands in source a?" → "refusing to cancel 2 commands in source a").
fn refusal(question: &str) -> Error {
    let action = question.trim_end().trim_end_matches('?');
    Error::Refused(format!(
        "refusing to {} without confirmation: stdin is not a terminal, so pass --yes (-y) \
         to confirm; nothing was changed",
        lowercase_first(action)
    ))
}

fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// A progress bar on stderr when it is a terminal; invisible otherwise.
pub fn progress() -> Box<dyn Progress> {
    if std::io::stderr().is_terminal() {
        Box::new(Bar(std::sync::Mutex::new(None)))
    } else {
        Box::new(icq::admin::NoProgress)
    }
}

/// An indicatif bar drawn on stderr, one per phase.
struct Bar(std::sync::Mutex<Option<indicatif::ProgressBar>>);

impl Progress for Bar {
    fn begin(&self, label: &str, total: u64) {
        let mut bar = indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        )
        .with_message(label.to_owned());
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {human_pos}/{human_len} (eta {eta})",
        ) {
            bar = bar.with_style(style.progress_chars("=> "));
        }
        if let Ok(mut slot) = self.0.lock()
            && let Some(old) = slot.replace(bar)
        {
            old.finish_and_clear();
        }
    }

    fn advance(&self, n: u64) {
        if let Ok(slot) = self.0.lock()
            && let Some(bar) = slot.as_ref()
        {
            bar.inc(n);
        }
    }

    fn finish(&self) {
        if let Ok(mut slot) = self.0.lock()
            && let Some(bar) = slot.take()
        {
            bar.finish_and_clear();
        }
    }
}
