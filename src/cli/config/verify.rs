//! `icq config check`: everything about a configuration file that can be known without
//! connecting to a database, for CI.
//!
//! [`check_file`] finds the file the way every command does (but never falls back to a
//! URL or the embedded default), parses it with the same loader, so its errors are the
//! loader's (file, line, column, key), then checks what parsing cannot: that every `exec`
//! program exists, is a file and is executable. All such problems are reported together,
//! as one [`CliError::ConfigCheck`] (exit code 2). What would work but is risky (a handler
//! without a timeout, or with one longer than a source's lease; no handlers at all) is
//! returned as warnings in the [`CheckReport`].

#[cfg(test)]
use std::path::Path;

use serde::Serialize;

use super::lookup::{self, Environment};
#[cfg(test)]
use super::parse;
use super::yaml::{Document, Seg};
use super::{Config, ConfigRequest, HandlerConfig, HandlerKind, expand};
use crate::cli::error::{CliError, Result};
use icq::error::Error;
use icq::handler::program_problem;
use icq::redact::redact_url;

/// What a configuration file that passed the check holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckReport {
    /// The file that was checked, as it was named.
    pub path: String,
    /// Its sources, in file order.
    pub sources: Vec<CheckedSource>,
    /// Its handlers, by command type.
    pub handlers: Vec<CheckedHandler>,
    /// What works but is probably not meant (never a failure).
    pub warnings: Vec<String>,
}

/// One source of a checked file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckedSource {
    /// The source's name.
    pub name: String,
    /// Its engine (`postgres`, `sqlite`, `mysql`).
    pub engine: String,
    /// Its commands table.
    pub table: String,
    /// The queues its workers serve, each with its concurrency, in file order; empty when
    /// it lists none (every queue, sharing the source's `concurrency`). Left out of the
    /// JSON when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<CheckedQueue>,
    /// Its recurring schedules, in file order. Left out of the JSON when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<CheckedSchedule>,
}

/// One schedule of a checked source's `schedules:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckedSchedule {
    /// The schedule's name.
    pub name: String,
    /// Its cron expression, or `every 10m`.
    pub expression: String,
    /// The time zone a cron expression is read in.
    pub time_zone: String,
    /// The command type it schedules.
    #[serde(rename = "type")]
    pub type_name: String,
}

/// One queue of a checked source's `queues:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckedQueue {
    /// The queue's name.
    pub name: String,
    /// Its commands executed at once.
    pub concurrency: u32,
}

/// One handler of a checked file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckedHandler {
    /// The command type it handles.
    #[serde(rename = "type")]
    pub type_name: String,
    /// `exec`, `http` or `noop`.
    pub kind: &'static str,
    /// The program (`exec`) or the URL with any secret masked (`http`); `None` for `noop`.
    pub target: Option<String>,
    /// Its `timeout_seconds`, if it has one.
    pub timeout_seconds: Option<f64>,
}

/// Checks the configuration file `request` points at (`--config`, `$ICQ_CONFIG`,
/// `./icq.yaml`, then the user config dir), without connecting to any database.
///
/// A missing file is a usage error; a file that does not parse fails with the loader's
/// [`CliError::Config`]; exec programs that cannot be started fail together with one
/// [`CliError::ConfigCheck`].
pub fn check_file(request: &ConfigRequest) -> Result<CheckReport> {
    let env = Environment::process();
    let (config, text) = lookup::load_file_in(request, &env)?;
    verify(&config, &text, env.var)
}

/// Parses `text` (see [`parse`](super::parse)) and checks it like [`check_file`]; `env`
/// reads variables for `${VAR}` expansion and `PATH` for bare program names.
#[cfg(test)]
pub fn check_text(
    text: &str,
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<CheckReport> {
    let config = parse(text, path, env)?;
    verify(&config, text, env)
}

/// Checks a configuration [`parse`](super::parse) produced from `text`: the problems
/// parsing cannot see fail it, the risks become warnings.
fn verify(
    config: &Config,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<CheckReport> {
    let path = config
        .path
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("icq.yaml"));
    let problems = program_problems(config, text, env);
    if !problems.is_empty() {
        return Err(CliError::ConfigCheck { path, problems });
    }
    let mut sources = Vec::with_capacity(config.sources.len());
    for source in &config.sources {
        sources.push(CheckedSource {
            name: source.name.clone(),
            engine: source.engine()?.name().to_owned(),
            table: source.table.to_string(),
            queues: source
                .settings
                .queues
                .iter()
                .map(|q| CheckedQueue {
                    name: q.name.clone(),
                    concurrency: q.concurrency,
                })
                .collect(),
            schedules: source
                .settings
                .schedules
                .iter()
                .map(|s| CheckedSchedule {
                    name: s.name.clone(),
                    expression: s.expression(),
                    time_zone: s.time_zone.name().to_owned(),
                    type_name: s.type_name.clone(),
                })
                .collect(),
        });
    }
    Ok(CheckReport {
        path: path.display().to_string(),
        sources,
        handlers: config
            .handlers
            .iter()
            .map(|(name, handler)| describe(name, handler))
            .collect(),
        warnings: warnings(config),
    })
}

/// Fails with the [`CliError::ConfigCheck`] `icq config check` would give when an exec
/// program of `config` cannot be started: every such program, each positioned (file,
/// line, column, key) at its `exec` entry, so `icq work` refuses to start with the same
/// words as the check. The file is read again only for the positions, and only when
/// there is a problem; a configuration made without a file (or a file since removed)
/// gets the key path without a line.
pub(crate) fn startup_program_check(config: &Config) -> Result<()> {
    let env = |name: &str| std::env::var(name).ok();
    let path_var = env("PATH");
    let any = config.handlers.values().any(|handler| match &handler.kind {
        HandlerKind::Exec { argv } => argv
            .first()
            .is_some_and(|program| program_problem(program, path_var.as_deref()).is_some()),
        _ => false,
    });
    if !any {
        return Ok(());
    }
    let text = config
        .path
        .as_deref()
        .and_then(|path| std::fs::read_to_string(path).ok())
        .unwrap_or_default();
    let problems = program_problems(config, &text, &env);
    match &config.path {
        Some(path) => Err(CliError::ConfigCheck {
            path: path.clone(),
            problems,
        }),
        None => Err(Error::invalid(problems.join("\n")).into()),
    }
}

/// Every exec handler whose program cannot be started, positioned at its `exec` entry.
fn program_problems(
    config: &Config,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<String> {
    // `parse` succeeded on this text, so expanding it again succeeds too; positions are
    // only left out if it somehow does not.
    let expanded = expand::expand(text, env).ok();
    let doc = expanded
        .as_ref()
        .map(|(text, columns)| Document::new(text, columns));
    let path_var = env("PATH");
    let mut problems = Vec::new();
    for (name, handler) in &config.handlers {
        let HandlerKind::Exec { argv } = &handler.kind else {
            continue;
        };
        let Some(program) = argv.first() else {
            continue;
        };
        if let Some(problem) = program_problem(program, path_var.as_deref()) {
            let message = format!("handler `{name}`: {problem}");
            let at = [
                Seg::Key("handlers"),
                Seg::Key(name),
                Seg::Key("exec"),
                Seg::Index(0),
            ];
            problems.push(match &doc {
                Some(doc) => doc.error_at(&at, &message),
                None => message,
            });
        }
    }
    problems
}

/// A handler as the report shows it.
fn describe(name: &str, handler: &HandlerConfig) -> CheckedHandler {
    let (kind, target) = match &handler.kind {
        HandlerKind::Exec { argv } => ("exec", argv.first().cloned()),
        HandlerKind::Http { url, .. } => ("http", Some(redact_url(url))),
        HandlerKind::Noop => ("noop", None),
    };
    CheckedHandler {
        type_name: name.to_owned(),
        kind,
        target,
        timeout_seconds: handler.timeout.map(|t| t.as_secs_f64()),
    }
}

/// What works but is probably not meant: no handlers (`icq work` refuses to start), a
/// handler without a timeout. (A timeout longer than the lease is fine: the lease is
/// renewed while the handler runs.)
fn warnings(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if config.handlers.is_empty() {
        out.push(
            "no handlers: `icq work` refuses to start without any (the operator commands work)"
                .to_owned(),
        );
    }
    for (name, handler) in &config.handlers {
        if matches!(handler.kind, HandlerKind::Noop) {
            continue;
        }
        if handler.timeout.is_none() {
            out.push(format!(
                "handler `{name}` has no timeout_seconds: a hung handler holds its command \
                 until the worker stops"
            ));
        }
    }
    if !config.handlers.is_empty() {
        for source in &config.sources {
            for schedule in &source.settings.schedules {
                if !config.handlers.contains_key(&schedule.type_name) {
                    out.push(format!(
                        "schedule `{}` of source `{}` schedules type `{}`, which no handler in \
                         this file runs: its commands are dead-lettered unless a worker with \
                         such a handler claims them first",
                        schedule.name, source.name, schedule.type_name
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "PATH").then(|| "/usr/bin:/bin".to_owned())
    }

    fn check(text: &str) -> Result<CheckReport> {
        check_text(text, Path::new("icq.yaml"), &env)
    }

    const SOURCE: &str = "sources:\n  - name: main\n    url: sqlite:app.db\n";

    #[test]
    fn a_good_file_is_summarised() {
        let report = check(&format!(
            "{SOURCE}handlers:\n  a.run:\n    exec: [sh, -c, 'true']\n    timeout_seconds: 5\n  \
             b.post:\n    http: {{ url: 'http://u:pw@127.0.0.1:1/x' }}\n    timeout_seconds: 5\n  \
             c.nothing:\n    noop: true\n"
        ))
        .unwrap();
        assert_eq!(report.sources[0].engine, "sqlite");
        let kinds: Vec<_> = report.handlers.iter().map(|h| h.kind).collect();
        assert_eq!(kinds, ["exec", "http", "noop"]);
        assert_eq!(
            report.handlers[1].target.as_deref(),
            Some("http://u:***@127.0.0.1:1/x")
        );
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    }

    #[test]
    fn every_missing_program_is_reported_at_its_line() {
        let err = check(&format!(
            "{SOURCE}handlers:\n  a.run:\n    exec: [./no/such/program]\n  \
             b.run:\n    exec: [no-such-program-anywhere]\n"
        ))
        .unwrap_err();
        let CliError::ConfigCheck { problems, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("6:12: "), "{}", problems[0]);
        assert!(problems[0].contains("does not exist"), "{}", problems[0]);
        assert!(problems[1].contains("not found on PATH"), "{}", problems[1]);
        assert_eq!(err.exit_code(), 2);
        assert_eq!(err.kind(), "config");
    }

    #[test]
    fn risky_handlers_are_warnings() {
        let report = check(&format!(
            "{SOURCE}    settings: {{ lease_seconds: 10 }}\nhandlers:\n  a.run:\n    exec: [sh]\n  \
             b.run:\n    exec: [sh]\n    timeout_seconds: 60\n"
        ))
        .unwrap();
        // A timeout longer than the lease is no warning: the lease is renewed.
        assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
        assert!(report.warnings[0].contains("no timeout_seconds"));
        let none = check(SOURCE).unwrap();
        assert!(none.warnings[0].starts_with("no handlers"));
    }

    #[test]
    fn schedules_are_listed_and_an_unhandled_type_is_a_warning() {
        let report = check(
            "sources:\n  - name: a\n    url: sqlite:a.db\n    schedules:\n      \
             - { name: nightly, cron: \"0 3 * * *\", time_zone: Europe/Berlin, type: reports.nightly }\n      \
             - { name: ping, every: 10m, type: health.ping }\n\
             handlers:\n  reports.nightly:\n    noop: true\n",
        )
        .unwrap();
        let listed: Vec<_> = report.sources[0]
            .schedules
            .iter()
            .map(|s| (s.name.as_str(), s.expression.as_str(), s.time_zone.as_str()))
            .collect();
        assert_eq!(
            listed,
            [
                ("nightly", "0 3 * * *", "Europe/Berlin"),
                ("ping", "every 10m", "UTC")
            ]
        );
        assert_eq!(
            report.warnings,
            [
                "schedule `ping` of source `a` schedules type `health.ping`, which no handler in \
              this file runs: its commands are dead-lettered unless a worker with such a \
              handler claims them first"
            ]
        );
    }

    #[test]
    fn queues_are_listed_in_file_order_with_their_concurrency() {
        let report = check(
            "sources:\n  - name: orders\n    url: 'postgres://app@db/shop'\n    \
             queues: { default: { concurrency: 8 }, webhooks: { concurrency: 2 } }\n\
             handlers:\n  ping: { noop: true }\n",
        )
        .unwrap();
        let queues: Vec<_> = report.sources[0]
            .queues
            .iter()
            .map(|q| (q.name.as_str(), q.concurrency))
            .collect();
        assert_eq!(queues, [("default", 8), ("webhooks", 2)]);
    }

    #[test]
    fn handlers_are_listed_by_type_with_their_program_and_timeout() {
        let report = check(
            "sources: [{ name: orders, url: 'postgres://app:s3cret@db/shop' }]\nhandlers:\n  \
             orders.send_receipt: { exec: [sh, -c, 'cat > /dev/null'], timeout_seconds: 30 }\n  \
             hooks.deliver: { http: { url: 'https://hooks.example.com/x' } }\n",
        )
        .unwrap();
        let kinds: Vec<_> = report
            .handlers
            .iter()
            .map(|h| (h.type_name.as_str(), h.kind))
            .collect();
        assert_eq!(
            kinds,
            [("hooks.deliver", "http"), ("orders.send_receipt", "exec")]
        );
        assert_eq!(report.handlers[1].target.as_deref(), Some("sh"));
        assert_eq!(report.handlers[1].timeout_seconds, Some(30.0));
        assert_eq!(report.handlers[0].timeout_seconds, None);
    }
}
