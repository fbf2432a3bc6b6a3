//! Checks that types cannot express, turning the raw file into sources and handlers.
//!
//! Each failure is positioned at the offending node through [`Document::error_at`].

use std::collections::BTreeMap;
use std::time::Duration;

use super::raw::{RawHandler, RawHttp, RawQueues, RawSchedule, RawSource};
use super::yaml::{Document, Seg};
use super::{DatabaseUrl, EXAMPLE, HandlerConfig, HandlerKind, SourceConfig};
use icq::ident::{Engine, TableName};
use icq::settings::QueueSettings;

/// The sources, in order: named uniquely, with a supported URL, table and settings.
pub(crate) fn sources(
    raw: Vec<RawSource>,
    doc: &Document<'_>,
) -> Result<Vec<SourceConfig>, String> {
    if raw.is_empty() {
        return Err(doc.error_at(
            &[Seg::Key("sources")],
            &format!("no sources configured; list at least one, e.g.\n{EXAMPLE}"),
        ));
    }
    let mut out: Vec<SourceConfig> = Vec::with_capacity(raw.len());
    for (index, source) in raw.into_iter().enumerate() {
        let at = |key| [Seg::Key("sources"), Seg::Index(index), Seg::Key(key)];
        check_source_name(&source.name).map_err(|message| doc.error_at(&at("name"), &message))?;
        if let Some(first) = out.iter().position(|s| s.name == source.name) {
            let first_line = doc
                .position(&[Seg::Key("sources"), Seg::Index(first), Seg::Key("name")])
                .map_or_else(String::new, |(line, _)| format!(" on line {line}"));
            return Err(doc.error_at(
                &at("name"),
                &format!(
                    "source name `{}` is already used by sources[{first}]{first_line}; \
                     source names must be unique",
                    source.name
                ),
            ));
        }
        check_database_url(&source.url).map_err(|message| doc.error_at(&at("url"), &message))?;
        let table = match &source.table {
            Some(table) => TableName::parse(table)
                .map_err(|err| doc.error_at(&at("table"), &err.to_string()))?,
            None => TableName::default(),
        };
        let mut settings = source.settings.unwrap_or_default();
        settings.queues = queues(index, source.queues, &settings, doc)?;
        settings.schedules = schedules(index, source.schedules, doc)?;
        settings.validate().map_err(|message| {
            let key = backticked(&message).unwrap_or_default();
            if key == "queues" {
                let path = [Seg::Key("sources"), Seg::Index(index), Seg::Key("queues")];
                return doc.error_at(&path, &message);
            }
            let path = [
                Seg::Key("sources"),
                Seg::Index(index),
                Seg::Key("settings"),
                Seg::Key(key),
            ];
            let path = if key.is_empty() {
                &path[..3]
            } else {
                &path[..]
            };
            doc.error_at(path, &message)
        })?;
        out.push(SourceConfig {
            name: source.name,
            url: DatabaseUrl::new(source.url),
            table,
            settings,
            embedded: false,
        });
    }
    Ok(out)
}

/// A source's `queues:`: names checked, each `concurrency` defaulting to the source's.
fn queues(
    index: usize,
    raw: Option<RawQueues>,
    settings: &icq::Settings,
    doc: &Document<'_>,
) -> Result<Vec<QueueSettings>, String> {
    let Some(RawQueues(raw)) = raw else {
        return Ok(Vec::new());
    };
    let at = [Seg::Key("sources"), Seg::Index(index), Seg::Key("queues")];
    if raw.is_empty() {
        return Err(doc.error_at(
            &at,
            "`queues` is empty: list the queues this worker serves, e.g. \
             queues: { default: { concurrency: 8 } }, or remove it to serve every queue",
        ));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (name, queue) in raw {
        if let Err(why) = icq::settings::validate_queue_name(&name) {
            let path = [at[0], at[1], at[2], Seg::Key(&name)];
            return Err(doc.error_at(&path, &format!("invalid queue name: {why}")));
        }
        let concurrency = queue.concurrency.unwrap_or(settings.concurrency);
        let mut listed = QueueSettings::new(name, concurrency);
        if let Some(n) = queue.global_concurrency {
            listed = listed.with_global_concurrency(n);
        }
        if let Some(k) = queue.key_concurrency {
            listed = listed.with_key_concurrency(k);
        }
        if let Some(rate) = queue.rate {
            listed = listed.with_rate(rate);
        }
        out.push(listed);
    }
    Ok(out)
}

/// A source's `schedules:`: each with `cron` or `every` (not both), a known time zone, a
/// valid queue and a name of its own; every error positioned at its key.
fn schedules(
    index: usize,
    raw: Option<Vec<RawSchedule>>,
    doc: &Document<'_>,
) -> Result<Vec<icq::recurring::Schedule>, String> {
    use icq::recurring::Schedule;
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    let mut out: Vec<Schedule> = Vec::with_capacity(raw.len());
    for (at, entry) in raw.into_iter().enumerate() {
        let path = |key| {
            [
                Seg::Key("sources"),
                Seg::Index(index),
                Seg::Key("schedules"),
                Seg::Index(at),
                Seg::Key(key),
            ]
        };
        let fail = |key, message: &str| Err(doc.error_at(&path(key), message));
        if let Err(why) = icq::recurring::validate_name(&entry.name) {
            return fail("name", &why);
        }
        if let Some(first) = out.iter().position(|s| s.name == entry.name) {
            return fail(
                "name",
                &format!(
                    "schedule name `{}` is already used by schedules[{first}]; give each \
                     schedule its own name (it keys the schedule's bookkeeping row)",
                    entry.name
                ),
            );
        }
        let named = |why: &str| format!("schedule `{}`: {why}", entry.name);
        let schedule = match (&entry.cron, &entry.every) {
            (Some(_), Some(_)) => {
                return fail("every", &named("give either `cron` or `every`, not both"));
            }
            (None, None) => {
                let at = [
                    path("name")[0],
                    path("name")[1],
                    path("name")[2],
                    path("name")[3],
                ];
                return Err(doc.error_at(
                    &at,
                    &named("needs `cron` (e.g. cron: \"0 3 * * *\") or `every` (e.g. every: 10m)"),
                ));
            }
            (Some(cron), None) => match Schedule::cron(&entry.name, cron, &entry.type_name) {
                Ok(schedule) => schedule,
                Err(why) => return fail("cron", &named(&why)),
            },
            (None, Some(every)) => {
                let interval = match humantime::parse_duration(every.trim()) {
                    Ok(interval) => interval,
                    Err(err) => {
                        return fail(
                            "every",
                            &named(&format!(
                                "`{}` is not a duration ({err}); write e.g. every: 10m, 30s or 1h 30m",
                                icq::redact::echo(every)
                            )),
                        );
                    }
                };
                Schedule::every(&entry.name, interval, &entry.type_name)
            }
        };
        let mut schedule = match &entry.time_zone {
            Some(zone) => match schedule.with_time_zone(zone) {
                Ok(schedule) => schedule,
                Err(why) => return fail("time_zone", &named(&why)),
            },
            None => schedule,
        };
        if let Some(payload) = entry.payload {
            schedule = schedule.with_payload(payload);
        }
        if let Some(queue) = entry.queue {
            schedule = schedule.with_queue(queue);
        }
        if let Some(priority) = entry.priority {
            schedule = schedule.with_priority(priority);
        }
        if let Some(missed) = entry.missed {
            schedule = schedule.with_missed(missed);
        }
        if let Err(why) = schedule.validate() {
            let key = if why.contains("`every`") {
                "every"
            } else if why.contains("`time_zone`") {
                "time_zone"
            } else if why.contains("`type`") {
                "type"
            } else if why.contains("queue") {
                "queue"
            } else {
                "name"
            };
            return fail(key, &why);
        }
        out.push(schedule);
    }
    Ok(out)
}

/// Source names appear in `--source`, output and `ICQ_SOURCE`: keep them plain.
fn check_source_name(name: &str) -> Result<(), String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || !name.chars().all(plain) {
        return Err(format!(
            "invalid source name {name:?}: use letters, digits, `_`, `-` and `.` (e.g. `orders`)"
        ));
    }
    Ok(())
}

/// Checks that a database URL names a supported engine and, for servers, parses as a
/// URL with a host. Messages never echo the URL (it may hold a password).
pub(crate) fn check_database_url(url: &str) -> Result<Engine, String> {
    if url.trim().is_empty() {
        return Err(
            "the database URL is empty; give one such as postgres://user@host/db or \
             sqlite:app.db"
                .to_string(),
        );
    }
    let has_scheme = url.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    if !has_scheme {
        return Err(
            "the database URL has no scheme; start it with postgres://, postgresql://, \
             sqlite:, mysql:// or mariadb://"
                .to_string(),
        );
    }
    let engine = Engine::from_url(url).map_err(|err| err.to_string())?;
    if engine != Engine::Sqlite {
        // A PostgreSQL or MariaDB/MySQL URL may list several hosts (`h1:5432,h2:5433`):
        // each is checked as a URL of its own.
        let hosts = match engine {
            Engine::Postgres | Engine::Mysql => icq::server_urls(url)
                .map_err(|why| format!("the database URL's host list: {why}"))?,
            _ => vec![url.to_string()],
        };
        let n = hosts.len();
        for (i, one) in hosts.iter().enumerate() {
            let which = if n > 1 {
                format!(" (host {} of {n})", i + 1)
            } else {
                String::new()
            };
            let parsed = url::Url::parse(one)
                .map_err(|err| format!("the database URL is not a valid URL{which}: {err}"))?;
            if !parsed.has_host() {
                return Err(format!(
                    "the database URL has no host{which}; write {}://user@host/database",
                    parsed.scheme()
                ));
            }
        }
    }
    Ok(engine)
}

/// The first `` `word` `` in a message (the key [`icq::Settings::validate`] names).
fn backticked(message: &str) -> Option<&str> {
    let (_, rest) = message.split_once('`')?;
    rest.split_once('`').map(|(word, _)| word)
}

/// The handlers: each exactly one kind, with a positive timeout and plain role names.
pub(crate) fn handlers(
    raw: BTreeMap<String, RawHandler>,
    doc: &Document<'_>,
) -> Result<BTreeMap<String, HandlerConfig>, String> {
    let mut out = BTreeMap::new();
    for (name, handler) in raw {
        let config = handler_config(&name, handler, doc)?;
        out.insert(name, config);
    }
    Ok(out)
}

fn handler_config(
    name: &str,
    raw: RawHandler,
    doc: &Document<'_>,
) -> Result<HandlerConfig, String> {
    let at = |key: &'static str| [Seg::Key("handlers"), Seg::Key(name), Seg::Key(key)];
    let fail = |key, message: &str| doc.error_at(&at(key), message);
    if name.trim().is_empty() {
        return Err(doc.error_at(&[Seg::Key("handlers")], "a handler's command type is empty"));
    }
    if let Some(why) = icq::command::edge_whitespace(name) {
        return Err(doc.error_at(
            &[Seg::Key("handlers"), Seg::Key(name)],
            &format!(
                "handler `{}` is not a command type: {why}",
                icq::redact::escape_for_log(name)
            ),
        ));
    }
    let given: Vec<&str> = [
        ("exec", raw.exec.is_some()),
        ("http", raw.http.is_some()),
        ("noop", raw.noop.is_some()),
    ]
    .into_iter()
    .filter_map(|(key, set)| set.then_some(key))
    .collect();
    let kind = match (raw.exec, raw.http, raw.noop) {
        _ if given.len() > 1 => {
            return Err(fail(
                given[1],
                &format!(
                    "handler `{name}` sets {}; give exactly one of `exec`, `http` or `noop`",
                    given
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            ));
        }
        (Some(argv), _, _) => {
            if argv.first().is_none_or(|program| program.trim().is_empty()) {
                return Err(fail(
                    "exec",
                    "`exec` needs at least the program to run, e.g. exec: [\"./bin/handler\"]",
                ));
            }
            HandlerKind::Exec { argv }
        }
        (_, Some(http), _) => http_kind(http).map_err(|(key, message)| {
            doc.error_at(
                &[
                    Seg::Key("handlers"),
                    Seg::Key(name),
                    Seg::Key("http"),
                    Seg::Key(key),
                ],
                &message,
            )
        })?,
        (_, _, Some(true)) => HandlerKind::Noop,
        (_, _, Some(false)) => {
            return Err(fail(
                "noop",
                "`noop` can only be `true`; to stop handling a type, remove its handler",
            ));
        }
        (None, None, None) => {
            return Err(doc.error_at(
                &[Seg::Key("handlers"), Seg::Key(name)],
                &format!(
                    "handler `{name}` needs one of `exec: [program, args...]`, \
                     `http: {{ url: ... }}` or `noop: true`"
                ),
            ));
        }
    };
    let timeout = match raw.timeout_seconds {
        None => None,
        Some(seconds) if seconds > 0.0 => {
            Some(Duration::try_from_secs_f64(seconds).map_err(|_| {
                fail(
                    "timeout_seconds",
                    &format!(
                        "`timeout_seconds` is too large ({}): write a number of seconds, \
                         e.g. 10 or 2.5",
                        icq::redact::number_text(seconds)
                    ),
                )
            })?)
        }
        Some(seconds) => {
            return Err(fail(
                "timeout_seconds",
                &format!(
                    "`timeout_seconds` must be greater than 0 (got {}): write a number of \
                     seconds, e.g. 10 or 2.5",
                    icq::redact::number_text(seconds)
                ),
            ));
        }
    };
    let requires_roles = raw.requires_roles.unwrap_or_default();
    if let Some(index) = requires_roles.iter().position(|r| r.trim().is_empty()) {
        return Err(doc.error_at(
            &[
                Seg::Key("handlers"),
                Seg::Key(name),
                Seg::Key("requires_roles"),
                Seg::Index(index),
            ],
            "a role name is empty",
        ));
    }
    Ok(HandlerConfig {
        kind,
        timeout,
        requires_roles,
    })
}

/// An `http:` handler; errors come with the key they concern.
fn http_kind(raw: RawHttp) -> Result<HandlerKind, (&'static str, String)> {
    let url =
        url::Url::parse(&raw.url).map_err(|err| ("url", format!("not a valid URL: {err}")))?;
    if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
        return Err((
            "url",
            "must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080/hooks"
                .to_string(),
        ));
    }
    let headers = raw.headers.unwrap_or_default();
    for (name, value) in &headers {
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if name.is_empty() || !name.chars().all(token) {
            return Err(("headers", format!("{name:?} is not a valid header name")));
        }
        if value.chars().any(|c| c.is_control() && c != '\t') {
            return Err((
                "headers",
                format!("the value of header `{name}` holds control characters"),
            ));
        }
    }
    Ok(HandlerKind::Http {
        url: raw.url,
        headers,
    })
}
