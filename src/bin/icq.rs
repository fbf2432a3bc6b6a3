//! The `icq` binary: parse the command line, run it through the library, report errors
//! on stderr with the exit code the error calls for (0 ok, 1 failure, 2 usage, 3 not found).
//!
//! Under `--format json` an error is one JSON document on stderr instead of a line of
//! text: `{"error": {"message": "...", "kind": "usage", "exit_code": 2}}`. That includes
//! clap's own usage errors (an unknown flag, a bad value), for which `--format json` is
//! looked for in the raw arguments since they did not parse. `--help` and `--version` are
//! not errors and print as usual.

// The CLI's module tree: the subcommands, and what only they need (configuration, opening
// sources, `icq work`, migration files, output, console, bench, telemetry). It reaches the
// library only through its public API.
#[path = "../cli/mod.rs"]
mod cli;
#[path = "../commands/mod.rs"]
mod commands;

use std::ffi::OsString;

use clap::error::ErrorKind;
use commands::{Cli, Format};

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_args(&args) {
        Ok(cli) => cli,
        Err(err) => parse_failure(err, json_requested(&args)),
    };
    let format = cli.global.format;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => fail(
            format,
            &format!("cannot start the async runtime: {err}"),
            "io",
            1,
        ),
    };
    if let Err(err) = runtime.block_on(commands::run(cli)) {
        fail(
            format,
            &commands::error_message(&err),
            commands::error_kind(&err),
            commands::exit_code(&err),
        );
    }
}

/// Reports a command line clap refused and exits with clap's code (2). Help and version
/// requests print as clap prints them, with code 0.
fn parse_failure(err: clap::Error, json: bool) -> ! {
    let is_request = matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    );
    if !json || is_request {
        err.exit();
    }
    let missing_subcommand = matches!(
        err.kind(),
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand
    );
    let message = if missing_subcommand {
        "a subcommand is required; see `icq --help` for the list".to_owned()
    } else {
        clap_message(&err.render().to_string())
    };
    fail(Format::Json, &message, "usage", err.exit_code())
}

/// Writes the error to stderr in `format` and exits with `code`. The message is scrubbed
/// of passwords and secret parameters whatever produced it.
fn fail(format: Format, message: &str, kind: &str, code: i32) -> ! {
    let message = commands::redact_text(message);
    match format {
        Format::Json => commands::note(&error_document(&message, kind, code)),
        Format::Table => commands::note(&format!("error: {message}")),
    }
    std::process::exit(code)
}

/// `{"error": {...}}`.
#[derive(serde::Serialize)]
struct ErrorDocument<'a> {
    error: ErrorBody<'a>,
}

/// The fields of the error document, in the documented order.
#[derive(serde::Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
    kind: &'a str,
    exit_code: i32,
}

/// The one-line JSON error document.
fn error_document(message: &str, kind: &str, exit_code: i32) -> String {
    let document = ErrorDocument {
        error: ErrorBody {
            message,
            kind,
            exit_code,
        },
    };
    serde_json::to_string(&document).unwrap_or_else(|_| {
        format!("{{\"error\": {{\"message\": \"unprintable error\", \"kind\": \"{kind}\", \"exit_code\": {exit_code}}}}}")
    })
}

/// True when the raw arguments ask for `--format json` (`--format json` or
/// `--format=json`), looked for only after they failed to parse. Arguments after `--` are
/// positional values, not options.
fn json_requested(args: &[OsString]) -> bool {
    let args: Vec<&str> = args
        .iter()
        .skip(1)
        .map(|arg| arg.to_str().unwrap_or(""))
        .take_while(|arg| *arg != "--")
        .collect();
    args.iter().enumerate().any(|(index, arg)| {
        *arg == "--format=json" || (*arg == "--format" && args.get(index + 1) == Some(&"json"))
    })
}

/// clap's rendered error as one line: without the `error: ` prefix and the usage and
/// `--help` lines that follow it, the remaining lines (tips) joined with `; `.
fn clap_message(rendered: &str) -> String {
    let body = rendered
        .split("\nUsage:")
        .next()
        .unwrap_or(rendered)
        .split("\nFor more information")
        .next()
        .unwrap_or(rendered);
    let lines: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    let joined = lines.join("; ");
    joined
        .strip_prefix("error: ")
        .map_or(joined.clone(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn json_is_found_in_either_spelling_before_a_double_dash() {
        assert!(json_requested(&args(&["icq", "work", "--format", "json"])));
        assert!(json_requested(&args(&["icq", "--format=json", "x"])));
        assert!(!json_requested(&args(&["icq", "--format", "table"])));
        assert!(!json_requested(&args(&["icq", "json", "--format"])));
        assert!(!json_requested(&args(&[
            "icq", "x", "--", "--format", "json"
        ])));
    }

    #[test]
    fn clap_errors_become_one_line() {
        let rendered = "error: unexpected argument '--until-idel' found\n\n  tip: a similar \
                        argument exists: '--until-idle'\n\nUsage: icq work --until-idle\n\nFor \
                        more information, try '--help'.\n";
        assert_eq!(
            clap_message(rendered),
            "unexpected argument '--until-idel' found; tip: a similar argument exists: \
             '--until-idle'"
        );
        assert_eq!(
            clap_message("error: invalid value 'x'\n\nFor more information, try '--help'.\n"),
            "invalid value 'x'"
        );
    }

    #[test]
    fn the_document_has_the_three_fields() {
        let doc: serde_json::Value =
            serde_json::from_str(&error_document("no such id", "not_found", 3)).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({"error": {"message": "no such id", "kind": "not_found", "exit_code": 3}})
        );
    }
}
