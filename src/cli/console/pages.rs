//! The read-only pages: overview (and its live fragment), lists by state, one command,
//! dead letters, sign-in, not found. Each reads through [`icq::admin`] exactly as the
//! matching CLI subcommand does (`pending`, `list`, `show`, `dead-letters list`).

use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::html::{Html, query};
use super::snapshot::SAMPLE_EVERY;
use super::{Console, describe, history};
use crate::cli::error::CliError;
use icq::Queue;
use icq::admin::{self, ListState, PendingReport};
use icq::command::CommandId;
use icq::error::Error;

/// Which navigation entry is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Overview,
    Lists,
    DeadLetters,
    Schedules,
    None,
}

/// A whole page: header, navigation, error banners, body.
pub(crate) fn render(
    console: &Console,
    status: StatusCode,
    title: &str,
    nav: Nav,
    banners: &[String],
    body: &Html,
) -> Response {
    let mut page = Html::new();
    page.raw("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">")
        .raw("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">")
        .raw("<title>")
        .text(title)
        .raw(" · icq console</title><link rel=\"stylesheet\" href=\"/static/console.css\">")
        .raw("<script src=\"/static/console.js\" defer></script></head><body><header><a class=\"brand\" href=\"/\">icq console</a><nav>");
    for (entry, href, label) in [
        (Nav::Overview, "/", "Overview"),
        (Nav::Lists, "/list", "Commands"),
        (Nav::DeadLetters, "/dead-letters", "Dead letters"),
        (Nav::Schedules, "/schedules", "Schedules"),
    ] {
        page.raw("<a href=\"").raw(href).raw("\"");
        if entry == nav {
            page.raw(" aria-current=\"page\"");
        }
        page.raw(">").raw(label).raw("</a>");
    }
    page.raw("</nav>");
    if console.actions_allowed() {
        page.raw("<span class=\"mode actions\" title=\"Actions need the console token and a confirmation\">actions allowed</span>");
    } else {
        page.raw("<span class=\"mode\">read-only</span>");
    }
    page.raw("</header><main>")
        .html(&banner(banners))
        .html(body);
    page.raw("</main></body></html>");
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page.into_string(),
    )
        .into_response()
}

/// Error banners (a source that is down, a failed query).
pub(crate) fn banner(errors: &[String]) -> Html {
    let mut html = Html::new();
    for error in errors {
        html.raw("<div class=\"banner\" role=\"alert\">")
            .text(error)
            .raw("</div>");
    }
    html
}

/// A page that only says something went wrong, with the status that fits the error.
pub(crate) fn error_page(console: &Console, title: &str, err: impl Into<CliError>) -> Response {
    let err = err.into();
    let status = match &err {
        CliError::Library(Error::NotFound(_)) => StatusCode::NOT_FOUND,
        _ if err.exit_code() == 2 => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    render(
        console,
        status,
        title,
        Nav::None,
        &[describe(&err)],
        &Html::new(),
    )
}

/// A page's query, or its 400 page saying what is wrong with the address.
fn parsed<T>(
    console: &Console,
    title: &str,
    query: Result<Query<T>, QueryRejection>,
) -> Result<T, Box<Response>> {
    query.map(|Query(q)| q).map_err(|rejection| {
        let text = rejection.body_text();
        let detail = text
            .strip_prefix("Failed to deserialize query string: ")
            .unwrap_or(&text);
        Box::new(error_page(
            console,
            title,
            CliError::Usage(format!("this page's address is not understood: {detail}")),
        ))
    })
}

/// The source a page names: `None` when it is configured, else the 404 page naming
/// those that are.
fn unknown_source(console: &Console, title: &str, wanted: &str) -> Option<Response> {
    let names = console.source_names();
    if names.iter().any(|n| n == wanted) {
        return None;
    }
    Some(error_page(
        console,
        title,
        Error::NotFound(format!(
            "no source named `{wanted}`: the configured sources are {}",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    ))
}

fn time(html: &mut Html, at: Option<DateTime<Utc>>) {
    match at {
        Some(at) => {
            html.raw("<time datetime=\"")
                .text(at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                .raw("\">")
                .text(at.format("%Y-%m-%d %H:%M:%S"))
                .raw("</time>");
        }
        None => {
            html.raw("<span class=\"none\">-</span>");
        }
    }
}

fn command_link(html: &mut Html, source: &str, id: &CommandId) {
    html.raw("<a class=\"id\" href=\"/command?")
        .text(query(&[("source", source), ("id", id.as_str())]))
        .raw("\">")
        .text(id)
        .raw("</a>");
}

/// The first line of a text, cut to `max` characters.
fn excerpt(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() > max || text.lines().nth(1).is_some() {
        let cut: String = line.chars().take(max).collect();
        format!("{cut}…")
    } else {
        line.to_owned()
    }
}

// ---------------------------------------------------------------------------------------
// overview

/// `GET /`: every source's counts, per queue and per type, and the charts; refreshed
/// live by `/static/console.js` from [`live`].
pub(crate) async fn overview(State(console): State<Console>) -> Response {
    let mut body = Html::new();
    body.raw("<h1>Overview</h1><div id=\"live\" data-refresh=\"/live\" data-every=\"")
        .text(SAMPLE_EVERY.as_millis())
        .raw("\">")
        .html(&live_fragment(&console, FRESH_FOR_A_PAGE).await)
        .raw("</div>");
    render(
        &console,
        StatusCode::OK,
        "Overview",
        Nav::Overview,
        &[],
        &body,
    )
}

/// `GET /schedules`: every source's recurring schedules, as `icq schedules` lists them:
/// expression, zone, queue, type, last occurrence (from the database) and next (from the
/// database's clock).
pub(crate) async fn schedules(State(console): State<Console>) -> Response {
    let (rows, errors) = console.schedules().await;
    let mut body = Html::new();
    body.raw("<h1>Schedules</h1>");
    if rows.is_empty() {
        body.raw("<p class=\"empty\">No schedules configured: add <code>schedules:</code> to a source in icq.yaml.</p>");
    } else {
        body.raw("<table class=\"schedules\" id=\"schedules\"><thead><tr><th>Source</th><th>Name</th><th>Expression</th><th>Zone</th><th>Queue</th><th>Type</th><th>Missed</th><th>Last occurrence</th><th>Next occurrence</th></tr></thead><tbody>");
        let time = |at: Option<chrono::DateTime<Utc>>| {
            at.map_or_else(
                || "-".to_owned(),
                |at| at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            )
        };
        for row in &rows {
            body.raw("<tr><td>")
                .text(console.label(&row.source))
                .raw("</td><td class=\"name\">")
                .text(&row.name)
                .raw("</td><td><code>")
                .text(&row.expression)
                .raw("</code></td><td>")
                .text(&row.time_zone)
                .raw("</td><td class=\"queue\">")
                .text(&row.queue)
                .raw("</td><td class=\"type\">")
                .text(&row.type_name)
                .raw("</td><td>")
                .text(row.missed)
                .raw("</td><td class=\"last\">")
                .text(time(row.last_occurrence))
                .raw("</td><td class=\"next\">")
                .text(time(row.next_occurrence))
                .raw("</td></tr>");
        }
        body.raw("</tbody></table><p class=\"stamp\">Each occurrence is scheduled once however many replicas run; the next one is computed from the database's clock.</p>");
    }
    render(
        &console,
        StatusCode::OK,
        "Schedules",
        Nav::Schedules,
        &errors,
        &body,
    )
}

/// How old the counts of a page someone just opened may be.
const FRESH_FOR_A_PAGE: Duration = Duration::from_secs(1);

/// How old the counts of a live refresh or a list's total may be: whatever the sampler
/// took last while it runs (it spaces its counts out on a big table), so refreshes never
/// count on their own; older means nobody watched, and the page waits for a new count.
const FRESH_FOR_A_REFRESH: Duration = super::snapshot::WATCHED_FOR;

/// `GET /live`: the overview's figures alone, for the live refresh (the latest shared
/// count: any number of tabs cost one count per sample).
pub(crate) async fn live(State(console): State<Console>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        live_fragment(&console, FRESH_FOR_A_REFRESH)
            .await
            .into_string(),
    )
        .into_response()
}

async fn live_fragment(console: &Console, fresh: Duration) -> Html {
    let snapshot = console.snapshot(fresh).await;
    let mut html = Html::new();
    match &snapshot {
        Some(snapshot) => {
            html.html(&banner(&snapshot.errors))
                .raw("<p class=\"stamp\" id=\"stamp\">As of <time datetime=\"")
                .text(snapshot.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                .raw("\">")
                .text(snapshot.at.format("%H:%M:%S UTC"))
                .raw("</time> · the same counts as <code>icq pending</code>, taken in one statement per source so every table agrees</p>")
                .html(&counts_table(
                    &snapshot.totals(),
                    Breakdown::Source,
                    &|name| console.label(name),
                ));
        }
        None => {
            html.html(&banner(&[
                "The counts did not come back in time (a database is slow or unreachable); the page tries again.".into(),
            ]));
        }
    }

    let now = Utc::now();
    let (throughput, backlog) = match console.inner.history.lock() {
        Ok(history) => (history.throughput(), history.backlog()),
        Err(_) => (Vec::new(), Vec::new()),
    };
    html.raw("<section class=\"charts\">")
        .html(&history::chart(
            "Throughput: completed per minute",
            "/min",
            &throughput,
            now,
        ))
        .html(&history::chart(
            "Backlog: due + scheduled",
            "commands",
            &backlog,
            now,
        ))
        .raw("</section>");

    if let Some(snapshot) = &snapshot {
        html.html(&breakdowns(
            Some(&snapshot.breakdown(true)),
            Some(&snapshot.breakdown(false)),
            &|name| console.label(name),
            console.actions_allowed(),
        ));
    }
    html
}

/// The breakdowns under the per-source totals: per source and queue (`icq pending
/// --by-queue`; a version-1 table has the one queue `default`), then per source and type
/// (`icq pending --by-type`). Each figure links to its list, filtered the same way.
fn breakdowns(
    by_queue: Option<&PendingReport>,
    by_type: Option<&PendingReport>,
    label: &dyn Fn(&str) -> String,
    actions: bool,
) -> Html {
    let mut html = Html::new();
    for (report, breakdown, heading) in [
        (by_queue, Breakdown::Queue, "<h2>By queue</h2>"),
        (by_type, Breakdown::Type, "<h2>By type</h2>"),
    ] {
        let Some(report) = report else { continue };
        html.raw(heading);
        if report.rows.is_empty() {
            html.raw("<p class=\"none\">No commands yet.</p>");
        } else {
            html.html(&counts_table(report, breakdown, label));
            if breakdown == Breakdown::Queue {
                html.html(&pause_buttons(report, actions));
            }
        }
    }
    html
}

/// Under the queue breakdown: which queues are paused fleet-wide and, where actions are
/// allowed, a pause or resume button per queue (each asks for confirmation).
fn pause_buttons(report: &PendingReport, actions: bool) -> Html {
    let mut html = Html::new();
    let paused: Vec<&str> = report
        .rows
        .iter()
        .filter(|r| r.paused)
        .filter_map(|r| r.counts.queue.as_deref())
        .collect();
    if !paused.is_empty() {
        html.raw(
            "<p class=\"paused\" id=\"paused-queues\">Paused for the whole fleet (no new starts): ",
        );
        for (i, queue) in paused.iter().enumerate() {
            if i > 0 {
                html.raw(", ");
            }
            html.raw("<code>").text(queue).raw("</code>");
        }
        html.raw("</p>");
    }
    if actions {
        html.raw("<p class=\"actions\" id=\"queue-actions\">");
        for row in &report.rows {
            let Some(queue) = row.counts.queue.as_deref() else {
                continue;
            };
            let (action, verb) = if row.paused {
                ("resume", "Resume")
            } else {
                ("pause", "Pause")
            };
            html.raw("<a class=\"button\" href=\"/actions/")
                .raw(action)
                .raw("?")
                .text(query(&[("source", &row.source), ("queue", queue)]))
                .raw("\">")
                .raw(verb)
                .raw(" ")
                .text(queue)
                .raw("…</a> ");
        }
        html.raw("</p>");
    }
    html
}

/// What one line of a counts table stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breakdown {
    /// One line per source (`id="counts"`).
    Source,
    /// One line per source and queue (`id="queue-counts"`, cells carry `data-queue`).
    Queue,
    /// One line per source and type (`id="type-counts"`, cells carry `data-type`).
    Type,
}

/// One row per source (and queue or type): due, scheduled, running, dead, completed,
/// each linking to its list.
/// `label` names a source as the console shows it (see [`super::Console::label`]).
fn counts_table(
    report: &PendingReport,
    breakdown: Breakdown,
    label: &dyn Fn(&str) -> String,
) -> Html {
    let mut html = Html::new();
    html.raw("<table class=\"counts\" id=\"")
        .raw(match breakdown {
            Breakdown::Source => "counts",
            Breakdown::Queue => "queue-counts",
            Breakdown::Type => "type-counts",
        })
        .raw("\"><thead><tr><th>Source</th>");
    match breakdown {
        Breakdown::Source => {}
        Breakdown::Queue => {
            html.raw("<th>Queue</th>");
        }
        Breakdown::Type => {
            html.raw("<th>Type</th>");
        }
    }
    html.raw("<th>Due</th><th>Scheduled</th><th>Running</th><th>Dead</th><th>Completed</th></tr></thead><tbody>");
    for row in &report.rows {
        let (queue, type_name) = match breakdown {
            Breakdown::Source => ("", ""),
            Breakdown::Queue => (row.counts.queue.as_deref().unwrap_or(""), ""),
            Breakdown::Type => ("", row.counts.type_name.as_deref().unwrap_or("")),
        };
        html.raw("<tr><td>").text(label(&row.source)).raw("</td>");
        match breakdown {
            Breakdown::Source => {}
            Breakdown::Queue => {
                html.raw("<td class=\"queue\">").text(queue).raw("</td>");
            }
            Breakdown::Type => {
                html.raw("<td class=\"type\">").text(type_name).raw("</td>");
            }
        }
        for (state, count) in [
            ("due", row.counts.due),
            ("scheduled", row.counts.scheduled),
            ("running", row.counts.running),
            ("dead", row.counts.dead),
            ("completed", row.counts.completed),
        ] {
            html.raw("<td class=\"n\" data-source=\"")
                .text(&row.source)
                .raw("\" data-state=\"")
                .text(state)
                .raw("\"");
            match breakdown {
                Breakdown::Source => {}
                Breakdown::Queue => {
                    html.raw(" data-queue=\"").text(queue).raw("\"");
                }
                Breakdown::Type => {
                    html.raw(" data-type=\"").text(type_name).raw("\"");
                }
            }
            html.raw("><a href=\"/list?")
                .text(query(&[
                    ("source", &row.source),
                    ("state", state),
                    ("type", type_name),
                    ("queue", queue),
                ]))
                .raw("\">")
                .text(count)
                .raw("</a></td>");
        }
        html.raw("</tr>");
    }
    html.raw("</tbody></table>");
    html
}

// ---------------------------------------------------------------------------------------
// lists

/// The query of `GET /list`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    source: Option<String>,
    state: Option<String>,
    #[serde(rename = "type")]
    type_name: Option<String>,
    queue: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

const STATES: [(&str, ListState); 6] = [
    ("due", ListState::Due),
    ("scheduled", ListState::Scheduled),
    ("running", ListState::Running),
    ("dead", ListState::Dead),
    ("completed", ListState::Completed),
    ("pending", ListState::Pending),
];

/// The default page size of a list.
const PAGE: u32 = 25;

/// The largest page size of a list.
const MAX_PAGE: u32 = 500;

fn non_empty(value: Option<&String>) -> Option<&str> {
    value.map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// `GET /list?source=&state=&type=&queue=&after=&limit=`: one page of one source's
/// commands in a state (`icq list`), newest first for dead and completed, in queue order
/// otherwise. A queue filter on a version-1 table is the admin API's usage error, shown as
/// the page's banner (status 400) under the filter form.
pub(crate) async fn list(
    State(console): State<Console>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let q = match parsed(&console, "Commands", q) {
        Ok(q) => q,
        Err(page) => return *page,
    };
    let names = console.source_names();
    let source_name = non_empty(q.source.as_ref())
        .map(str::to_owned)
        .or_else(|| names.first().cloned())
        .unwrap_or_default();
    if let Some(page) = unknown_source(&console, "Commands", &source_name) {
        return page;
    }
    let state_name = non_empty(q.state.as_ref()).unwrap_or("due");
    let Some((state_name, state)) = STATES.iter().find(|(name, _)| *name == state_name).copied()
    else {
        return error_page(
            &console,
            "Commands",
            Error::invalid(format!(
                "unknown state `{state_name}`: one of due, scheduled, running, dead, completed, pending"
            )),
        );
    };
    let type_name = non_empty(q.type_name.as_ref()).map(str::to_owned);
    let queue = non_empty(q.queue.as_ref()).map(str::to_owned);
    let limit = q.limit.unwrap_or(PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return error_page(
            &console,
            "Commands",
            Error::invalid(format!(
                "limit {limit} is out of range: a page holds 1 to {MAX_PAGE} commands (default {PAGE})"
            )),
        );
    }
    let after = match non_empty(q.after.as_ref()).map(str::parse::<CommandId>) {
        None => None,
        Some(Ok(id)) => Some(id),
        Some(Err(err)) => return error_page(&console, "Commands", err),
    };

    let mut body = Html::new();
    body.raw("<h1>Commands</h1>");
    body.html(&filter_form(
        &names,
        &|name| console.label(name),
        &source_name,
        state_name,
        type_name.as_deref(),
        queue.as_deref(),
    ));

    let opened = console.opened().await;
    let mut errors = opened.errors.clone();
    let mut status = StatusCode::OK;
    let source: Vec<Queue> = opened
        .sources
        .into_iter()
        .filter(|s| s.name() == source_name)
        .collect();
    if source.is_empty() && errors.is_empty() {
        errors.push(format!("no source named `{source_name}` is configured"));
    }
    if !source.is_empty() {
        let request = admin::ListRequest {
            state,
            type_name: type_name.clone(),
            limit,
            after: after.clone(),
            before: None,
            queue: queue.clone(),
        };
        match admin::list_page(&source, &request).await {
            Ok(report) => {
                // The total comes from the console's shared count, not a count of its own.
                let snapshot = console.snapshot(FRESH_FOR_A_REFRESH).await;
                let total = snapshot.as_ref().and_then(|s| {
                    s.count(&source_name, type_name.as_deref(), queue.as_deref(), |c| {
                        c.in_state(state)
                    })
                    .map(|n| (n, s.at))
                });
                body.raw("<p class=\"total\">");
                match total {
                    Some((n, _)) => {
                        body.raw("<span id=\"total\">").text(n).raw("</span> ");
                    }
                    None => {
                        body.raw("<span id=\"total\">?</span> ");
                    }
                }
                body.text(state_name).raw(" commands");
                if let Some(t) = &type_name {
                    body.raw(" of type <code>").text(t).raw("</code>");
                }
                if let Some(q) = &queue {
                    body.raw(" in queue <code>").text(q).raw("</code>");
                }
                body.raw(" in <code>")
                    .text(console.label(&report.source))
                    .raw("</code>");
                if let Some((_, at)) = total {
                    body.raw(" · counted at ").text(at.format("%H:%M:%S UTC"));
                }
                if after.is_some() {
                    body.raw(" · a later page");
                }
                body.raw("</p>");
                if console.actions_allowed() {
                    body.html(&list_actions(
                        &report.source,
                        state,
                        type_name.as_deref(),
                        queue.as_deref(),
                    ));
                }
                body.html(&list_table(&report, state));
                body.raw("<nav class=\"pager\">");
                if after.is_some() {
                    body.raw("<a href=\"/list?")
                        .text(query(&[
                            ("source", &source_name),
                            ("state", state_name),
                            ("type", type_name.as_deref().unwrap_or("")),
                            ("queue", queue.as_deref().unwrap_or("")),
                        ]))
                        .raw("\">First page</a>");
                }
                if let Some(next) = &report.next_after {
                    let limit_text = if limit == PAGE {
                        String::new()
                    } else {
                        limit.to_string()
                    };
                    body.raw("<a rel=\"next\" id=\"next-page\" href=\"/list?")
                        .text(query(&[
                            ("source", &source_name),
                            ("state", state_name),
                            ("type", type_name.as_deref().unwrap_or("")),
                            ("queue", queue.as_deref().unwrap_or("")),
                            ("after", next.as_str()),
                            ("limit", &limit_text),
                        ]))
                        .raw("\">Next page →</a>");
                }
                body.raw("</nav>");
            }
            Err(err) => {
                let err = CliError::from(err);
                if err.exit_code() == 2 {
                    status = StatusCode::BAD_REQUEST;
                }
                errors.push(describe(&err));
            }
        }
    }
    render(&console, status, "Commands", Nav::Lists, &errors, &body)
}

/// The bulk actions a filtered list offers (with `--allow-actions`): requeue every dead
/// letter of the list's type and queue, or cancel every pending command of them.
fn list_actions(
    source: &str,
    state: ListState,
    type_name: Option<&str>,
    queue: Option<&str>,
) -> Html {
    let mut html = Html::new();
    let pairs = [
        ("source", source),
        ("type", type_name.unwrap_or("")),
        ("queue", queue.unwrap_or("")),
    ];
    match state {
        ListState::Dead => {
            html.raw("<p class=\"actions\"><a class=\"button\" id=\"requeue-all\" href=\"/actions/requeue?all_dead=1&amp;")
                .text(query(&pairs))
                .raw("\">Requeue all matching…</a></p>");
        }
        // Cancel by type and/or queue takes due and scheduled rows alike, whichever of
        // those lists offers it: the button and the confirmation say so.
        ListState::Due | ListState::Scheduled | ListState::Pending
            if type_name.is_some() || queue.is_some() =>
        {
            html.raw("<p class=\"actions\"><a class=\"button\" id=\"cancel-matching\" href=\"/actions/cancel?")
                .text(query(&pairs))
                .raw("\">Cancel every due and scheduled command of this type and queue…</a></p>");
        }
        _ => {}
    }
    html
}

fn filter_form(
    names: &[String],
    label: &dyn Fn(&str) -> String,
    source: &str,
    state: &str,
    type_name: Option<&str>,
    queue: Option<&str>,
) -> Html {
    let mut html = Html::new();
    html.raw("<form class=\"filters\" method=\"get\" action=\"/list\"><label>Source <select name=\"source\">");
    for name in names {
        html.raw("<option value=\"").text(name).raw("\"");
        if name == source {
            html.raw(" selected");
        }
        html.raw(">").text(label(name)).raw("</option>");
    }
    html.raw("</select></label><label>State <select name=\"state\">");
    for (name, _) in STATES {
        html.raw("<option value=\"").text(name).raw("\"");
        if name == state {
            html.raw(" selected");
        }
        html.raw(">").text(name).raw("</option>");
    }
    html.raw("</select></label><label>Type <input name=\"type\" placeholder=\"any type\" value=\"")
        .text(type_name.unwrap_or(""))
        .raw("\"></label><label>Queue <input name=\"queue\" placeholder=\"any queue\" value=\"")
        .text(queue.unwrap_or(""))
        .raw("\"></label><button type=\"submit\">Filter</button></form>");
    html
}

fn list_table(report: &admin::ListReport, state: ListState) -> Html {
    let mut html = Html::new();
    if report.commands.is_empty() {
        html.raw("<p class=\"none\">Nothing here.</p>");
        return html;
    }
    let when = match state {
        ListState::Dead => "Dead since",
        ListState::Completed => "Completed at",
        _ => "Run at",
    };
    html.raw("<table class=\"commands\"><thead><tr><th>Id</th><th>Type</th><th>Queue</th><th>State</th><th>Attempts</th><th>")
        .text(when)
        .raw("</th><th>Last error</th></tr></thead><tbody>");
    for command in &report.commands {
        html.raw("<tr><td>");
        command_link(&mut html, &report.source, &command.id);
        html.raw("</td><td class=\"type\">")
            .text(&command.type_name)
            .raw("</td><td class=\"queue\">")
            .text(&command.queue)
            .raw("</td><td>")
            .text(command.state.as_str())
            .raw("</td><td class=\"n\">")
            .text(command.attempts)
            .raw("</td><td>");
        time(&mut html, command.key_time(state));
        html.raw("</td><td class=\"error\">")
            .text(excerpt(command.last_error.as_deref().unwrap_or(""), 120))
            .raw("</td></tr>");
    }
    html.raw("</tbody></table>");
    html
}

// ---------------------------------------------------------------------------------------
// one command

/// The query of `GET /command` and `GET /command/payload`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CommandQuery {
    source: Option<String>,
    id: Option<String>,
}

/// The command a `/command` or `/command/payload` address names, and the source it asks
/// for, or the page that says what is wrong with the address.
fn command_target(
    console: &Console,
    title: &str,
    q: Result<Query<CommandQuery>, QueryRejection>,
) -> Result<(CommandId, Option<String>), Box<Response>> {
    let q = parsed(console, title, q)?;
    let id = non_empty(q.id.as_ref())
        .unwrap_or("")
        .parse::<CommandId>()
        .map_err(|err| Box::new(error_page(console, title, err)))?;
    let wanted = non_empty(q.source.as_ref()).map(str::to_owned);
    if let Some(page) = wanted
        .as_deref()
        .and_then(|w| unknown_source(console, title, w))
    {
        return Err(Box::new(page));
    }
    Ok((id, wanted))
}

/// `GET /command?source=&id=`: one command in full (`icq show`).
pub(crate) async fn command(
    State(console): State<Console>,
    q: Result<Query<CommandQuery>, QueryRejection>,
) -> Response {
    let (id, wanted) = match command_target(&console, "Command", q) {
        Ok(target) => target,
        Err(page) => return *page,
    };
    let wanted = wanted.as_deref();
    let opened = console.opened().await;
    let sources: Vec<Queue> = opened
        .sources
        .into_iter()
        .filter(|s| wanted.is_none_or(|w| w == s.name()))
        .collect();
    // The database cuts the payload: a page never reads more than it shows.
    let shown = match admin::show_head(&sources, id, PAYLOAD_SHOWN as u32).await {
        Ok(shown) => shown,
        Err(err) => {
            let some_down = !opened.errors.is_empty();
            let mut errors = opened.errors;
            let err = CliError::from(err);
            errors.push(describe(&err));
            let status = match err {
                // Not found in the sources that are up: it may be in one that is down.
                CliError::Library(Error::NotFound(_)) if some_down => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                CliError::Library(Error::NotFound(_)) => StatusCode::NOT_FOUND,
                _ if err.exit_code() == 2 => StatusCode::BAD_REQUEST,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            return render(
                &console,
                status,
                "Command",
                Nav::None,
                &errors,
                &Html::new(),
            );
        }
    };
    let row = &shown.row;
    let mut body = Html::new();
    body.raw("<h1>Command <code id=\"command-id\">")
        .text(&row.id)
        .raw("</code></h1><p><span class=\"state state-")
        .text(shown.state.as_str())
        .raw("\" id=\"command-state\">")
        .text(shown.state.as_str())
        .raw("</span> in source <code>")
        .text(console.label(&shown.source))
        .raw("</code></p>");
    if let Some(holder) = &shown.attempts.held_by {
        body.raw("<p class=\"note\" id=\"held-by\">Waits behind <a href=\"/command?")
            .text(query(&[("source", &shown.source), ("id", holder.as_str())]))
            .raw("\"><code>")
            .text(holder)
            .raw("</code></a>, the oldest pending command of its order key: it runs once that one completes or is dead-lettered.</p>");
    }
    if let Some(attempt) = shown.attempts.succeeded_on_attempt {
        body.raw("<p class=\"note\" id=\"succeeded-on\">Attempt ")
            .text(attempt)
            .raw(" succeeded.</p>");
    }

    if console.actions_allowed() {
        body.raw("<p class=\"actions\">");
        let id = row.id.as_str();
        let mut action = |name: &'static str, label: &'static str| {
            body.raw("<a class=\"button\" href=\"/actions/")
                .raw(name)
                .raw("?")
                .text(query(&[("source", &shown.source), ("id", id)]))
                .raw("\">")
                .raw(label)
                .raw("</a> ");
        };
        match shown.state {
            icq::State::Dead => {
                action("requeue", "Requeue…");
                action("replay", "Replay…");
            }
            icq::State::Completed => action("replay", "Replay…"),
            icq::State::Due | icq::State::Scheduled => {
                action("requeue", "Run now…");
                action("cancel", "Cancel…");
            }
            icq::State::Running => {}
        }
        body.raw("</p>");
    }

    body.raw("<dl class=\"fields\">");
    let field = |body: &mut Html, name: &'static str, value: &dyn Fn(&mut Html)| {
        body.raw("<dt>").raw(name).raw("</dt><dd>");
        value(body);
        body.raw("</dd>");
    };
    field(&mut body, "Type", &|h| {
        h.raw("<code>").text(&row.type_name).raw("</code>");
    });
    field(&mut body, "Queue", &|h| {
        h.raw("<code id=\"command-queue\">")
            .text(&row.queue)
            .raw("</code>");
    });
    field(&mut body, "Priority", &|h| {
        h.text(row.priority);
    });
    field(&mut body, "Attempts", &|h| {
        h.text(row.attempts);
    });
    field(&mut body, "Snoozes", &|h| {
        h.text(row.snoozes);
    });
    field(&mut body, "Created at", &|h| time(h, Some(row.created_at)));
    field(&mut body, "Run at", &|h| time(h, Some(row.run_at)));
    field(&mut body, "Locked until", &|h| time(h, row.locked_until));
    field(&mut body, "Processed at", &|h| time(h, row.processed_at));
    field(&mut body, "Dead-lettered at", &|h| {
        time(h, row.dead_lettered_at)
    });
    field(&mut body, "User id", &|h| {
        h.text(row.user_id.as_deref().unwrap_or("-"));
    });
    field(&mut body, "Roles", &|h| {
        h.text(if row.roles.is_empty() {
            "-".to_owned()
        } else {
            row.roles.join(", ")
        });
    });
    field(&mut body, "Tenant id", &|h| {
        h.text(row.tenant_id.as_deref().unwrap_or("-"));
    });
    field(&mut body, "Correlation id", &|h| {
        h.text(row.correlation_id.as_deref().unwrap_or("-"));
    });
    field(&mut body, "Unique key", &|h| match &row.unique_key {
        Some(key) => {
            h.raw("<code id=\"unique-key\">").text(key).raw("</code>");
        }
        None => {
            h.raw("<span class=\"none\">-</span>");
        }
    });
    for (name, id, key) in [
        ("Order key", "order-key", &row.order_key),
        ("Concurrency key", "concurrency-key", &row.concurrency_key),
    ] {
        field(&mut body, name, &|h| match key {
            Some(key) => {
                h.raw("<code id=\"")
                    .raw(id)
                    .raw("\">")
                    .text(key)
                    .raw("</code>");
            }
            None => {
                h.raw("<span class=\"none\">-</span>");
            }
        });
    }
    field(&mut body, "Trace parent", &|h| match &row.trace_parent {
        Some(parent) => {
            h.raw("<code id=\"trace-parent\">")
                .text(parent)
                .raw("</code>");
        }
        None => {
            h.raw("<span class=\"none\">-</span>");
        }
    });
    body.raw("</dl>");
    if !row.defects.is_empty() {
        body.raw("<div class=\"banner\">Columns that could not be read: ")
            .text(row.defects.join("; "))
            .raw("</div>");
    }
    body.raw("<h2>Last error</h2>");
    match &row.last_error {
        Some(error) => {
            // A completed command keeps the error of an attempt before the one that
            // succeeded: say so, or it reads as the reason it failed.
            if let (icq::State::Completed, Some(at)) = (shown.state, row.processed_at) {
                body.raw("<p class=\"note\" id=\"last-error-note\">From an earlier attempt: the command completed at ");
                time(&mut body, Some(at));
                body.raw(".</p>");
            }
            body.raw("<pre id=\"last-error\">")
                .text(error)
                .raw("</pre>");
        }
        None => {
            body.raw("<p class=\"none\">None.</p>");
        }
    }
    let errors = &shown.attempts.attempt_errors;
    if !errors.is_empty() {
        body.raw("<h2>Failed attempts</h2><table id=\"attempt-errors\"><thead><tr><th>Attempt</th><th>At</th><th>Error</th></tr></thead><tbody>");
        for error in errors {
            body.raw("<tr><td>")
                .text(
                    error
                        .attempt
                        .map_or_else(|| "?".to_owned(), |n| n.to_string()),
                )
                .raw("</td><td>")
                .text(error.at.as_deref().unwrap_or("?"))
                .raw("</td><td><pre>")
                .text(&error.error)
                .raw("</pre></td></tr>");
        }
        body.raw("</tbody></table>");
    }
    let (shown_part, whole) = payload_part(&shown.payload_head, shown.whole());
    let download = query(&[("source", &shown.source), ("id", row.id.as_str())]);
    body.raw("<h2>Payload</h2>");
    if whole {
        body.raw("<pre id=\"payload\">")
            .text(&shown_part)
            .raw("</pre><p><a id=\"payload-download\" href=\"/command/payload?")
            .text(&download)
            .raw("\">Download the payload</a> (JSON).</p>");
    } else {
        body.raw("<p class=\"note\" id=\"payload-cut\">The payload is larger than ")
            .text(PAYLOAD_SHOWN / 1024)
            .raw(" KiB: its first part is shown. <a id=\"payload-download\" href=\"/command/payload?")
            .text(&download)
            .raw("\">Download the whole payload</a> (JSON).</p><pre id=\"payload\">")
            .text(&shown_part)
            .raw("…</pre>");
    }
    render(
        &console,
        StatusCode::OK,
        &format!("Command {}", row.id),
        Nav::None,
        &opened.errors,
        &body,
    )
}

/// How much of a payload a command's page shows (as pretty-printed JSON).
const PAYLOAD_SHOWN: usize = 64 * 1024;

/// The payload as the page shows it: a whole payload pretty-printed (cut at
/// [`PAYLOAD_SHOWN`] bytes), the start of a larger one as its database printed it (cut
/// there too), and whether that is all of it.
fn payload_part(head: &str, whole: bool) -> (String, bool) {
    if whole && let Ok(value) = serde_json::from_str::<serde_json::Value>(head) {
        return pretty_prefix(&value, PAYLOAD_SHOWN);
    }
    let mut end = head.len().min(PAYLOAD_SHOWN);
    while !head.is_char_boundary(end) {
        end -= 1;
    }
    (head[..end].to_owned(), whole && end == head.len())
}

/// The first `max` bytes (at most) of `value` pretty-printed, cut at a character
/// boundary, and whether that is all of it. Printing stops once `max` is reached, so a
/// payload of megabytes costs a page no more than `max`.
fn pretty_prefix(value: &serde_json::Value, max: usize) -> (String, bool) {
    struct Capped(Vec<u8>, usize);
    impl std::io::Write for Capped {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let room = self.1.saturating_sub(self.0.len());
            if room == 0 {
                return Err(std::io::Error::other("full"));
            }
            let take = room.min(buf.len());
            self.0.extend_from_slice(&buf[..take]);
            Ok(take)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    // One byte more than shown tells whether there is more.
    let mut capped = Capped(Vec::new(), max + 1);
    let whole = serde_json::to_writer_pretty(&mut capped, value).is_ok() && capped.0.len() <= max;
    let mut bytes = capped.0;
    bytes.truncate(max);
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(err) => {
            let valid = err.utf8_error().valid_up_to();
            let mut bytes = err.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).unwrap_or_default()
        }
    };
    (text, whole)
}

/// `value` as compact JSON, in a buffer of exactly its size (a growing buffer would
/// take up to twice a large payload's size, and copy it on the way).
fn encoded(value: &serde_json::Value) -> Vec<u8> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    if serde_json::to_writer(&mut count, value).is_err() {
        return Vec::new();
    }
    let mut bytes = Vec::with_capacity(count.0);
    if serde_json::to_writer(&mut bytes, value).is_err() {
        return Vec::new();
    }
    bytes
}

/// How much of a payload download is handed to the connection at a time.
const PAYLOAD_CHUNK: usize = 64 * 1024;

/// `GET /command/payload?source=&id=`: the command's payload as a JSON file
/// (`Content-Disposition: attachment`), sent in chunks.
pub(crate) async fn payload(
    State(console): State<Console>,
    q: Result<Query<CommandQuery>, QueryRejection>,
) -> Response {
    let (id, wanted) = match command_target(&console, "Payload", q) {
        Ok(target) => target,
        Err(page) => return *page,
    };
    let wanted = wanted.as_deref();
    // Held until the whole payload is sent: a few downloads at a time; the row is read
    // and encoded under a large-read permit, like a page.
    let Some(permit) = console.download().await else {
        return render(
            &console,
            StatusCode::SERVICE_UNAVAILABLE,
            "Payload",
            Nav::None,
            &["Too many payload downloads are in progress; try again in a minute.".into()],
            &Html::new(),
        );
    };
    let reading = console.large_read().await;
    let opened = console.opened().await;
    let sources: Vec<Queue> = opened
        .sources
        .into_iter()
        .filter(|s| wanted.is_none_or(|w| w == s.name()))
        .collect();
    let shown = match admin::show(&sources, id).await {
        Ok(shown) => shown,
        Err(err) => return error_page(&console, "Payload", err),
    };
    let name = shown.row.id.to_string();
    let bytes = axum::body::Bytes::from(encoded(&shown.row.payload));
    drop(shown);
    drop(reading);
    let chunks = (0..bytes.len().div_ceil(PAYLOAD_CHUNK)).map(move |n| {
        let end = ((n + 1) * PAYLOAD_CHUNK).min(bytes.len());
        Ok::<_, std::convert::Infallible>(bytes.slice(n * PAYLOAD_CHUNK..end))
    });
    let stream = futures::StreamExt::map(futures::stream::iter(chunks), move |chunk| {
        let _held = &permit;
        chunk
    });
    (
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}.json\""),
            ),
        ],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

// ---------------------------------------------------------------------------------------
// dead letters

/// The query of `GET /dead-letters`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeadQuery {
    #[serde(rename = "type")]
    type_name: Option<String>,
    queue: Option<String>,
}

/// How many dead letters the page shows (newest first, across sources); the dead list
/// pages through all of them.
const DEAD_PAGE: u32 = 100;

/// `GET /dead-letters?type=&queue=`: the newest dead letters of every source
/// (`icq dead-letters list`). A queue filter on a version-1 table is the admin API's usage
/// error, shown as the page's banner (status 400).
pub(crate) async fn dead_letters(
    State(console): State<Console>,
    q: Result<Query<DeadQuery>, QueryRejection>,
) -> Response {
    let q = match parsed(&console, "Dead letters", q) {
        Ok(q) => q,
        Err(page) => return *page,
    };
    let type_name = non_empty(q.type_name.as_ref()).map(str::to_owned);
    let queue = non_empty(q.queue.as_ref()).map(str::to_owned);
    let t = type_name.as_deref().unwrap_or("");
    let qn = queue.as_deref().unwrap_or("");
    let opened = console.opened().await;
    let mut errors = opened.errors.clone();
    let mut status = StatusCode::OK;
    let mut body = Html::new();
    body.raw("<h1>Dead letters</h1><form class=\"filters\" method=\"get\" action=\"/dead-letters\"><label>Type <input name=\"type\" placeholder=\"any type\" value=\"")
        .text(t)
        .raw("\"></label><label>Queue <input name=\"queue\" placeholder=\"any queue\" value=\"")
        .text(qn)
        .raw("\"></label><button type=\"submit\">Filter</button></form>");
    if console.actions_allowed() {
        // Every action acts on exactly the page's filter: the type and the queue.
        body.raw(
            "<p class=\"actions\"><a class=\"button\" id=\"requeue-all\" href=\"/actions/requeue?",
        )
        .text(query(&[("all_dead", "1"), ("type", t), ("queue", qn)]))
        .raw("\">Requeue all matching…</a> ");
        body.raw("<a class=\"button\" id=\"purge-dead\" href=\"/actions/purge?")
            .text(query(&[("dead_letters", "1"), ("type", t), ("queue", qn)]))
            .raw("\">Purge dead letters…</a> <a class=\"button\" id=\"purge-completed\" href=\"/actions/purge?")
            .text(query(&[("completed", "1"), ("type", t), ("queue", qn)]))
            .raw("\">Purge completed…</a>");
        body.raw("</p>");
    }
    let query_params = admin::DeadLetterQuery {
        type_name: type_name.clone(),
        limit: DEAD_PAGE,
        queue: queue.clone(),
    };
    match admin::dead_letters(&opened.sources, &query_params).await {
        Ok(report) if report.rows.is_empty() => {
            body.raw("<p class=\"none\">No dead letters.</p>");
        }
        Ok(report) => {
            body.raw("<table class=\"commands\"><thead><tr><th>Source</th><th>Id</th><th>Type</th><th>Queue</th><th>Attempts</th><th>Dead since</th><th>Last error</th></tr></thead><tbody>");
            for row in &report.rows {
                body.raw("<tr><td>")
                    .text(console.label(&row.source))
                    .raw("</td><td>");
                command_link(&mut body, &row.source, &row.summary.id);
                body.raw("</td><td class=\"type\">")
                    .text(&row.summary.type_name)
                    .raw("</td><td class=\"queue\">")
                    .text(&row.summary.queue)
                    .raw("</td><td class=\"n\">")
                    .text(row.summary.attempts)
                    .raw("</td><td>");
                time(&mut body, Some(row.summary.dead_lettered_at));
                body.raw("</td><td class=\"error\">")
                    .text(excerpt(
                        row.summary.last_error.as_deref().unwrap_or(""),
                        120,
                    ))
                    .raw("</td></tr>");
            }
            body.raw("</tbody></table>");
            if report.rows.len() as u32 >= DEAD_PAGE {
                body.raw("<p>The newest ")
                    .text(DEAD_PAGE)
                    .raw("; page through all of them under <a href=\"/list?")
                    .text(query(&[("state", "dead"), ("type", t), ("queue", qn)]))
                    .raw("\">Commands</a>.</p>");
            }
        }
        Err(err) => {
            let err = CliError::from(err);
            if err.exit_code() == 2 {
                status = StatusCode::BAD_REQUEST;
            }
            errors.push(describe(&err));
        }
    }
    render(
        &console,
        status,
        "Dead letters",
        Nav::DeadLetters,
        &errors,
        &body,
    )
}

// ---------------------------------------------------------------------------------------
// sign-in, not found

/// `GET /login`: the token form of a console bound to a non-loopback address.
pub(crate) async fn login(State(console): State<Console>) -> Response {
    let mut body = Html::new();
    body.raw("<h1>Sign in</h1><p>This console listens beyond loopback: give its token (ICQ_CONSOLE_TOKEN).</p><form method=\"post\" action=\"/login\"><label>Token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" required></label> <button type=\"submit\">Sign in</button></form>");
    render(&console, StatusCode::OK, "Sign in", Nav::None, &[], &body)
}

/// Any other path.
pub(crate) async fn not_found(State(console): State<Console>) -> Response {
    render(
        &console,
        StatusCode::NOT_FOUND,
        "Not found",
        Nav::None,
        &["No such page.".into()],
        &Html::new(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use icq::admin::{PendingCount, StateCount};

    #[test]
    fn the_queue_breakdown_links_each_figure_to_its_filtered_list() {
        let report = PendingReport {
            rows: vec![PendingCount {
                source: "shop".into(),
                counts: StateCount {
                    queue: Some("<b>emails</b>".into()),
                    due: 3,
                    dead: 1,
                    ..StateCount::default()
                },
                paused: false,
            }],
            by_type: false,
            by_queue: true,
            source_count: 1,
        };
        let html = breakdowns(Some(&report), None, &|name| name.to_owned(), false).into_string();
        assert!(html.contains("<h2>By queue</h2>"), "{html}");
        assert!(html.contains("id=\"queue-counts\""), "{html}");
        assert!(
            html.contains("data-source=\"shop\" data-state=\"due\" data-queue=\"&lt;b&gt;emails&lt;/b&gt;\"><a href=\"/list?source=shop&amp;state=due&amp;queue=%3Cb%3Eemails%3C%2Fb%3E\">3</a>"),
            "{html}"
        );
        assert!(!html.contains("<b>"), "escaped: {html}");
        assert!(!html.contains("By type"), "{html}");
    }

    #[test]
    fn the_list_form_keeps_the_queue_filter() {
        let html = filter_form(
            &["shop".into()],
            &|name| name.to_owned(),
            "shop",
            "due",
            None,
            Some("a\"b"),
        )
        .into_string();
        assert!(
            html.contains("<input name=\"queue\" placeholder=\"any queue\" value=\"a&quot;b\">"),
            "{html}"
        );
    }

    #[test]
    fn excerpts_keep_the_first_line() {
        assert_eq!(excerpt("boom", 10), "boom");
        assert_eq!(excerpt("boom\nat line 2", 10), "boom…");
        assert_eq!(excerpt("abcdefghijkl", 4), "abcd…");
    }
}
