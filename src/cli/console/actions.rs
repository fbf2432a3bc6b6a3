//! Requeue, replay, cancel and purge: `GET /actions/{action}?…` shows what would happen
//! (the plan's counts: purge's dry run) and a confirmation form; `POST /actions/{action}`
//! with the same fields and the token does it. Both go through [`icq::admin`]'s plan and
//! apply steps exactly as `icq requeue|replay|cancel|purge` do, so the library's
//! guarantees hold (nothing changes on a bad request; bulk work in short batches).
//!
//! Every POST passes [`guard::check_mutation`] before anything is read or parsed: a
//! read-only console, a cross-origin request or a missing/wrong token is a 403 and
//! changes nothing.

use axum::body::Bytes;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::Console;
use super::guard::{self, Refusal};
use super::html::{Html, query};
use super::pages::{self, Nav, render};
use crate::cli::error::{CliError, Result};
use crate::cli::output::plural;
use icq::Queue;
use icq::admin::FinishedKind;
use icq::admin::{self, CancelTarget, NoProgress, PurgeRequest, RequeueTarget};
use icq::command::CommandId;
use icq::error::Error;

/// The fields of an action, from a query string (confirm) or a form body (perform).
#[derive(Debug, Default, Clone)]
struct Fields {
    source: Option<String>,
    id: Option<String>,
    type_name: Option<String>,
    /// A queue filter (requeue-all-dead, cancel by type/queue, purge); refused by the
    /// admin API on a version-1 table.
    queue: Option<String>,
    all_dead: bool,
    completed: bool,
    dead_letters: bool,
    older_than: Option<String>,
    token: Option<String>,
}

impl Fields {
    fn parse(encoded: &[u8]) -> Fields {
        let mut fields = Fields::default();
        for (name, value) in url::form_urlencoded::parse(encoded) {
            let value = value.trim().to_owned();
            let text = (!value.is_empty()).then(|| value.clone());
            let flag = !value.is_empty() && value != "0" && value != "false";
            match name.as_ref() {
                "source" => fields.source = text,
                "id" => fields.id = text,
                "type" => fields.type_name = text,
                "queue" => fields.queue = text,
                "all_dead" => fields.all_dead = flag,
                "completed" => fields.completed = flag,
                "dead_letters" => fields.dead_letters = flag,
                "older_than" => fields.older_than = text,
                "token" => fields.token = Some(value),
                _ => {}
            }
        }
        fields
    }

    /// The fields again, as hidden inputs of the confirmation form (the token excepted).
    fn hidden(&self) -> Html {
        let mut html = Html::new();
        let flag = |on: bool| if on { "1" } else { "" };
        for (name, value) in [
            ("source", self.source.as_deref().unwrap_or("")),
            ("id", self.id.as_deref().unwrap_or("")),
            ("type", self.type_name.as_deref().unwrap_or("")),
            ("queue", self.queue.as_deref().unwrap_or("")),
            ("all_dead", flag(self.all_dead)),
            ("completed", flag(self.completed)),
            ("dead_letters", flag(self.dead_letters)),
            ("older_than", self.older_than.as_deref().unwrap_or("")),
        ] {
            if !value.is_empty() {
                html.raw("<input type=\"hidden\" name=\"")
                    .text(name)
                    .raw("\" value=\"")
                    .text(value)
                    .raw("\">");
            }
        }
        html
    }
}

/// What an action does, validated.
enum Action {
    Requeue(RequeueTarget),
    Replay(CommandId),
    Cancel(CancelTarget),
    Purge(PurgeRequest),
    /// Pause (`true`) or resume a queue for the whole fleet.
    Pause(String, bool),
}

impl Action {
    fn parse(name: &str, fields: &Fields) -> Result<Action> {
        let id = || -> Result<CommandId> {
            fields
                .id
                .as_deref()
                .ok_or_else(|| CliError::Usage("which command? an `id` is missing".into()))?
                .parse()
                .map_err(CliError::from)
        };
        match name {
            "requeue" if fields.all_dead => Ok(Action::Requeue(RequeueTarget::AllDead {
                type_name: fields.type_name.clone(),
                queue: fields.queue.clone(),
            })),
            "requeue" => Ok(Action::Requeue(RequeueTarget::Ids(vec![id()?]))),
            "replay" => Ok(Action::Replay(id()?)),
            "cancel" => match (&fields.id, &fields.type_name, &fields.queue) {
                (Some(_), _, _) => Ok(Action::Cancel(CancelTarget::Ids(vec![id()?]))),
                (None, None, None) => Err(CliError::Usage(
                    "cancel what? give an `id`, a `type` and/or a `queue`".into(),
                )),
                (None, type_name, queue) => Ok(Action::Cancel(CancelTarget::Matching {
                    type_name: type_name.clone(),
                    queue: queue.clone(),
                })),
            },
            "purge" => {
                if !fields.completed && !fields.dead_letters {
                    return Err(CliError::Usage(
                        "purge what? `completed` and/or `dead_letters`".into(),
                    ));
                }
                let older_than = fields
                    .older_than
                    .as_deref()
                    .map(crate::cli::parse::parse_duration)
                    .transpose()?;
                Ok(Action::Purge(PurgeRequest {
                    completed: fields.completed,
                    dead_letters: fields.dead_letters,
                    older_than,
                    queue: fields.queue.clone(),
                    type_name: fields.type_name.clone(),
                }))
            }
            "pause" | "resume" => {
                let queue = fields.queue.clone().ok_or_else(|| {
                    CliError::Usage(format!("{name} which queue? a `queue` is missing"))
                })?;
                Ok(Action::Pause(queue, name == "pause"))
            }
            other => Err(Error::NotFound(format!(
                "no action `{other}`: requeue, replay, cancel, purge, pause or resume"
            ))
            .into()),
        }
    }
}

/// The sources an action works on: the one named, else every configured one. A source
/// that is down refuses the action (a bulk action must not silently skip a source).
async fn sources_for(console: &Console, fields: &Fields) -> Result<Vec<Queue>> {
    let opened = console.opened().await;
    let wanted = fields.source.as_deref();
    if let Some(error) = opened.errors.first() {
        return Err(Error::Refused(format!("{error}; nothing was planned or changed")).into());
    }
    let sources: Vec<Queue> = opened
        .sources
        .into_iter()
        .filter(|s| wanted.is_none_or(|w| w == s.name()))
        .collect();
    if sources.is_empty() {
        return Err(Error::NotFound(format!("no source named `{}`", wanted.unwrap_or(""))).into());
    }
    Ok(sources)
}

fn forbidden(console: &Console, refusal: Refusal) -> Response {
    render(
        console,
        refusal.status(),
        "Refused",
        Nav::None,
        &[refusal.message().into()],
        &Html::new(),
    )
}

/// `GET /actions/{action}`: the plan (how many rows, in which sources; for purge, the dry
/// run) and the confirmation form.
pub(crate) async fn confirm(
    State(console): State<Console>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    if !console.actions_allowed() {
        return forbidden(&console, Refusal::ReadOnly);
    }
    let fields = Fields::parse(raw.unwrap_or_default().as_bytes());
    let planned = async {
        let action = Action::parse(&name, &fields)?;
        let sources = sources_for(&console, &fields).await?;
        describe_plan(&action, &sources, &|name| console.label(name)).await
    }
    .await;
    let (question, total, details) = match planned {
        Ok(plan) => plan,
        Err(err) => return pages::error_page(&console, "Confirm", err),
    };
    let mut body = Html::new();
    body.raw("<h1>Confirm</h1><p class=\"question\" id=\"question\">")
        .text(&question)
        .raw("</p>")
        .html(&details);
    if total == 0 {
        body.raw("<p class=\"none\" id=\"nothing\">Nothing to do.</p>");
    } else {
        body.raw("<form class=\"confirm\" method=\"post\" action=\"/actions/")
            .text(&name)
            .raw("\">")
            .html(&fields.hidden())
            .raw("<label>Console token <input type=\"password\" name=\"token\" autocomplete=\"off\" required></label> <button type=\"submit\" id=\"confirm\">Confirm</button> <a href=\"/\">Back</a></form>");
    }
    render(&console, StatusCode::OK, "Confirm", Nav::None, &[], &body)
}

/// The confirmation question, the number of rows concerned, and details (purge's dry
/// run per source).
/// `label` names a source as the console shows it (see [`super::Console::label`]).
async fn describe_plan(
    action: &Action,
    sources: &[Queue],
    label: &(dyn Fn(&str) -> String + Sync),
) -> Result<(String, u64, Html)> {
    let in_sources = |names: &[&str]| {
        let labels: Vec<String> = names.iter().map(|name| label(name)).collect();
        in_sources(&labels.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let mut details = Html::new();
    Ok(match action {
        Action::Requeue(target) => {
            let plan = admin::plan_requeue(sources, target).await?;
            let total = plan.total();
            let what = match target {
                RequeueTarget::AllDead { type_name, queue } => format!(
                    "{}{}",
                    plural(total, "dead letter", "dead letters"),
                    filtered(type_name.as_deref(), queue.as_deref())
                ),
                RequeueTarget::Ids(ids) => format!(
                    "{} ({})",
                    plural(total, "command", "commands"),
                    ids.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            let names: Vec<&str> = plan.per_source().into_iter().map(|(s, _)| s).collect();
            (
                format!(
                    "Requeue {what} in {}? They run again now, attempts reset, last error kept.",
                    in_sources(&names)
                ),
                total,
                details,
            )
        }
        Action::Replay(id) => {
            let shown = admin::show(sources, id.clone()).await?;
            if !matches!(shown.state, icq::State::Completed | icq::State::Dead) {
                return Err(Error::Refused(format!(
                    "command {id} is {}: only a completed or dead command can be replayed \
                     (a pending one runs on its own; requeue makes it due now)",
                    shown.state.as_str()
                ))
                .into());
            }
            (
                format!(
                    "Replay command {id} (type {}, {}) in source {}? A new pending copy of its type, payload and context is scheduled.",
                    shown.row.type_name,
                    shown.state.as_str(),
                    label(&shown.source)
                ),
                1,
                details,
            )
        }
        Action::Cancel(target) => {
            let plan = admin::plan_cancel(sources, target).await?;
            let total = plan.total();
            let (what, scope) = match target {
                CancelTarget::Matching { type_name, queue } => (
                    format!(
                        "{}{}",
                        plural(total, "pending command", "pending commands"),
                        filtered(type_name.as_deref(), queue.as_deref())
                    ),
                    " Due and scheduled ones alike; running ones are left to finish.",
                ),
                CancelTarget::Ids(_) => (plural(total, "command", "commands"), ""),
            };
            (
                format!(
                    "Cancel {what} in {}? They will not run (they become dead letters).{scope}",
                    in_sources(&plan.sources())
                ),
                total,
                details,
            )
        }
        Action::Pause(queue, pause) => {
            let names: Vec<&str> = sources.iter().map(|s| s.name()).collect();
            let question = if *pause {
                format!(
                    "Pause queue {queue} in {}? No replica starts its commands until it is resumed; running ones finish and scheduling goes on.",
                    in_sources(&names)
                )
            } else {
                format!(
                    "Resume queue {queue} in {}? Every replica starts its due commands again.",
                    in_sources(&names)
                )
            };
            (question, 1, details)
        }
        Action::Purge(request) => {
            let plan = admin::plan_purge(sources, request).await?;
            let report = plan.dry_run_report();
            details.raw("<table class=\"counts\" id=\"dry-run\"><thead><tr><th>Source</th><th>Kind</th><th>Would delete</th></tr></thead><tbody>");
            for count in &report.counts {
                details
                    .raw("<tr><td>")
                    .text(&count.source)
                    .raw("</td><td>")
                    .raw(match count.kind {
                        FinishedKind::Completed => "completed",
                        FinishedKind::DeadLetters => "dead letters",
                    })
                    .raw("</td><td class=\"n\">")
                    .text(count.count)
                    .raw("</td></tr>");
            }
            details.raw("</tbody></table>");
            let age = request
                .older_than
                .map(|d| format!(", finished more than {} ago", humanize(d)))
                .unwrap_or_default();
            let names: Vec<&str> = sources.iter().map(|s| s.name()).collect();
            (
                format!(
                    "Delete {}{}{age} in {}? This cannot be undone.",
                    crate::cli::output::describe_purge(&report.counts),
                    filtered(request.type_name.as_deref(), request.queue.as_deref()),
                    in_sources(&names)
                ),
                plan.total(),
                details,
            )
        }
    })
}

/// The filters of a bulk action in words: ` of type T in queue Q` (empty when none).
fn filtered(type_name: Option<&str>, queue: Option<&str>) -> String {
    let mut words = String::new();
    if let Some(t) = type_name {
        words.push_str(&format!(" of type {t}"));
    }
    if let Some(q) = queue {
        words.push_str(&format!(" in queue {q}"));
    }
    words
}

fn in_sources(names: &[&str]) -> String {
    match names {
        // Nothing matched: the confirmation page says there is nothing to do.
        [] => "any source".to_owned(),
        [one] => format!("source {one}"),
        many => format!("sources {}", many.join(", ")),
    }
}

fn humanize(duration: std::time::Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        s if s % 86_400 == 0 && s > 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// `POST /actions/{action}`: checks (actions allowed, same origin, token), then plans
/// and applies the action and shows its result.
pub(crate) async fn perform(
    State(console): State<Console>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let fields = Fields::parse(&body);
    if let Err(refusal) =
        guard::check_mutation(&console, Some(peer.ip()), &headers, fields.token.as_deref())
    {
        return forbidden(&console, refusal);
    }
    let done = async {
        let action = Action::parse(&name, &fields)?;
        let sources = sources_for(&console, &fields).await?;
        apply(&action, &sources).await
    }
    .await;
    // Whatever was done (or partly done before an error), the next page counts afresh.
    console.counts_changed();
    match done {
        Ok(result) => {
            let mut body = Html::new();
            body.raw("<h1>Done</h1><p class=\"result\" id=\"result\">")
                .text(&result.message)
                .raw("</p>");
            if let Some((source, id)) = &result.show {
                body.raw("<p><a id=\"open-command\" href=\"/command?")
                    .text(query(&[("source", source), ("id", id.as_str())]))
                    .raw("\">Open command ")
                    .text(id)
                    .raw("</a></p>");
            }
            body.raw(
                "<p><a href=\"/\">Overview</a> · <a href=\"/dead-letters\">Dead letters</a></p>",
            );
            render(&console, StatusCode::OK, "Done", Nav::None, &[], &body)
        }
        Err(err) => pages::error_page(&console, "Not done", err),
    }
}

struct Applied {
    message: String,
    /// The command to open next (the requeued, cancelled or new one).
    show: Option<(String, CommandId)>,
}

async fn apply(action: &Action, sources: &[Queue]) -> Result<Applied> {
    let single = |target_id: Option<&CommandId>| {
        target_id
            .and_then(|id| (sources.len() == 1).then(|| (sources[0].name().to_owned(), id.clone())))
    };
    Ok(match action {
        Action::Requeue(target) => {
            let plan = admin::plan_requeue(sources, target).await?;
            let report = admin::requeue(&plan, &NoProgress).await?;
            let id = match target {
                RequeueTarget::Ids(ids) => ids.first(),
                RequeueTarget::AllDead { .. } => None,
            };
            Applied {
                message: format!(
                    "Requeued {}.",
                    plural(report.requeued, "command", "commands")
                ),
                show: single(id),
            }
        }
        Action::Replay(id) => {
            let report = admin::replay(sources, std::slice::from_ref(id)).await?;
            let new = report.replayed.first();
            Applied {
                message: match new {
                    Some(r) => format!("Replayed {} as new command {}.", r.from, r.id),
                    None => "Nothing was replayed.".into(),
                },
                show: new.map(|r| (r.source.clone(), r.id.clone())),
            }
        }
        Action::Cancel(target) => {
            let plan = admin::plan_cancel(sources, target).await?;
            let report = admin::cancel(&plan, &NoProgress).await?;
            let id = match target {
                CancelTarget::Ids(ids) => ids.first(),
                CancelTarget::Matching { .. } => None,
            };
            Applied {
                message: format!(
                    "Cancelled {}.",
                    plural(report.cancelled, "command", "commands")
                ),
                show: single(id),
            }
        }
        Action::Pause(queue, pause) => {
            let report = admin::set_paused(sources, queue, *pause).await?;
            let changed = report.changes.iter().filter(|c| c.changed).count();
            let verb = if *pause { "Paused" } else { "Resumed" };
            Applied {
                message: if changed == 0 {
                    format!("Queue {queue} already was so; nothing changed.")
                } else {
                    format!("{verb} queue {queue}.")
                },
                show: None,
            }
        }
        Action::Purge(request) => {
            let plan = admin::plan_purge(sources, request).await?;
            let report = admin::purge(&plan, &NoProgress).await?;
            Applied {
                message: format!(
                    "Deleted {}{}.",
                    crate::cli::output::describe_purge(&report.counts),
                    filtered(request.type_name.as_deref(), request.queue.as_deref())
                ),
                show: None,
            }
        }
    })
}

/// `POST /login`: a same-origin form with the right token sets the sign-in cookie.
pub(crate) async fn login(
    State(console): State<Console>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let fields = Fields::parse(&body);
    let Some(token) = console.inner.token.as_deref() else {
        return forbidden(&console, Refusal::Token);
    };
    if !guard::same_origin(&headers) {
        return forbidden(&console, Refusal::CrossOrigin);
    }
    if let Err(refusal) = guard::check_token_throttled(
        &console,
        Some(peer.ip()),
        token,
        &headers,
        fields.token.as_deref(),
    ) {
        return forbidden(&console, refusal);
    }
    let cookie = format!(
        "{}={}; HttpOnly; SameSite=Strict; Path=/",
        guard::COOKIE,
        guard::cookie_value(token)
    );
    let mut response = Redirect::to("/").into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_filter_goes_through_to_every_bulk_action() {
        let fields = Fields::parse(b"all_dead=1&type=email.digest&queue=+emails+&token=t");
        assert_eq!(fields.queue.as_deref(), Some("emails"));
        match Action::parse("requeue", &fields) {
            Ok(Action::Requeue(RequeueTarget::AllDead { type_name, queue })) => {
                assert_eq!(type_name.as_deref(), Some("email.digest"));
                assert_eq!(queue.as_deref(), Some("emails"));
            }
            _ => panic!("requeue all dead"),
        }
        // Cancel by queue alone (no type), and by neither: refused.
        match Action::parse("cancel", &Fields::parse(b"queue=emails")) {
            Ok(Action::Cancel(CancelTarget::Matching { type_name, queue })) => {
                assert_eq!((type_name, queue.as_deref()), (None, Some("emails")));
            }
            _ => panic!("cancel by queue"),
        }
        assert!(matches!(
            Action::parse("cancel", &Fields::parse(b"queue=")),
            Err(err) if err.exit_code() == 2
        ));
        match Action::parse("purge", &Fields::parse(b"dead_letters=1&queue=emails")) {
            Ok(Action::Purge(request)) => {
                assert!(request.dead_letters && !request.completed);
                assert_eq!(request.queue.as_deref(), Some("emails"));
            }
            _ => panic!("purge by queue"),
        }
        // An empty queue field is no filter.
        match Action::parse("purge", &Fields::parse(b"completed=1&queue=")) {
            Ok(Action::Purge(request)) => assert_eq!(request.queue, None),
            _ => panic!("purge"),
        }
        match Action::parse(
            "purge",
            &Fields::parse(b"dead_letters=1&type=webhooks.deliver"),
        ) {
            Ok(Action::Purge(request)) => {
                assert_eq!(request.type_name.as_deref(), Some("webhooks.deliver"));
            }
            _ => panic!("purge by type"),
        }
    }

    #[test]
    fn the_confirmation_form_keeps_the_queue_escaped_and_drops_the_token() {
        let fields = Fields::parse(b"all_dead=1&queue=%22%3E%3Cscript%3E&token=secret");
        let hidden = fields.hidden().into_string();
        assert!(
            hidden.contains("name=\"queue\" value=\"&quot;&gt;&lt;script&gt;\""),
            "{hidden}"
        );
        assert!(!hidden.contains("secret"), "{hidden}");
    }

    #[test]
    fn filters_in_words() {
        assert_eq!(filtered(None, None), "");
        assert_eq!(filtered(Some("t"), None), " of type t");
        assert_eq!(filtered(None, Some("q")), " in queue q");
        assert_eq!(filtered(Some("t"), Some("q")), " of type t in queue q");
        assert_eq!(in_sources(&[]), "any source");
    }
}
