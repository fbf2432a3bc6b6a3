//! Property tests (proptest): arbitrary input never panics, and every refusal is a clear
//! error. 256 cases per property (`PROPTEST_CASES` overrides), 11 properties here, so
//! 2,816 cases per run; `${VAR}` expansion has two more in `src/config/expand.rs` and
//! redaction two in `src/redact.rs` (512 cases each), 3,840 in all.
//!
//! - the configuration parser, on arbitrary text and on YAML-shaped text built from the
//!   file's own vocabulary;
//! - settings ranges: any YAML scalar for any numeric key is accepted within the key's
//!   range or refused with a message naming the key;
//! - durations (`--older-than`, `--in`) and instants (`--at`);
//! - command ids: any text is an id kept exactly (trimmed) or a clear usage error; a UUID in
//!   any case, with or without braces, is still recognised as one;
//! - payloads: any `--payload` text is JSON or a usage error, nesting included;

use std::path::Path;

use crate::cli::config::parse;
use crate::cli::error::CliError;
use icq::Error;
use proptest::prelude::*;

fn cases() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        // Failures are reported, not persisted into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The environment `${VAR}` reads in these tests.
fn env(name: &str) -> Option<String> {
    match name {
        "URL" => Some("postgres://app:hunter2@db/orders?password=hunter3".into()),
        "EMPTY" => Some(String::new()),
        "BREAK" => Some("a\nb".into()),
        "YAML" => Some("{ a: [".into()),
        _ => None,
    }
}

/// Parses `text` and checks the contract of the result: a configuration, or an
/// `CliError::Config` (exit 2) for the file, with a non-empty message that never shows the
/// environment's passwords and, when positioned, a line within the file.
fn parse_checked(text: &str) -> Result<crate::cli::config::Config, String> {
    let path = Path::new("icq.yaml");
    match parse(text, path, &env) {
        Ok(config) => {
            assert!(!config.sources.is_empty());
            Ok(config)
        }
        Err(CliError::Config { path: p, message }) => {
            assert_eq!(p, path);
            assert!(!message.trim().is_empty());
            assert!(
                !message.contains("hunter2") && !message.contains("hunter3"),
                "{message}"
            );
            if let Some((line, _)) = message.split_once(':')
                && let Ok(line) = line.parse::<usize>()
            {
                // YAML's line breaks: \n, \r, \r\n, NEL, LS and PS.
                let lines = text
                    .replace("\r\n", "\n")
                    .split(['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}'])
                    .count();
                assert!(
                    (1..=lines + 1).contains(&line),
                    "line {line} of {lines}: {message}"
                );
            }
            Err(message)
        }
        Err(other) => panic!("not a config error: {other:?}"),
    }
}

/// Lines in the configuration's own vocabulary, so that random files reach the checks
/// behind the YAML syntax.
fn config_line() -> impl Strategy<Value = String> {
    let pieces = prop_oneof![
        Just("sources:"),
        Just("- name: a"),
        Just("- name: b"),
        Just("name: a"),
        Just("url: sqlite:a.db"),
        Just("url: ${URL}"),
        Just("url: ${NOPE:-mysql://u@h/d}"),
        Just("url: redis://h"),
        Just("url: ${BREAK}"),
        Just("url: \"${YAML}\""),
        Just("table: jobs.Commands"),
        Just("table: \"a;b\""),
        Just("settings:"),
        Just("settings: { batch_size: 5 }"),
        Just("batch_size: 99999999999999999999"),
        Just("lease_seconds: 1e12"),
        Just("polling_interval_seconds: .nan"),
        Just("claim_only_handled_types: true"),
        Just("handlers:"),
        Just("t:"),
        Just("a.b:"),
        Just("exec: [\"true\"]"),
        Just("exec: \"rm -rf /\""),
        Just("http: { url: \"http://h/x?token=t\" }"),
        Just("noop: true"),
        Just("noop: false"),
        Just("timeout_seconds: -1"),
        Just("timeout_seconds: 1e300"),
        Just("requires_roles: [\"\"]"),
        Just("$$"),
        Just("${"),
        Just("${}"),
        Just("- "),
        Just("? "),
        Just("&anchor"),
        Just("*alias"),
        Just("!!binary"),
        Just("#"),
        Just(""),
    ];
    (0usize..8, pieces).prop_map(|(indent, piece)| format!("{}{piece}", " ".repeat(indent)))
}

/// The settings keys that take numbers, with their documented ranges (README) and
/// whether they are whole numbers.
const NUMERIC_KEYS: &[(&str, f64, f64, bool)] = &[
    ("batch_size", 1.0, 10_000.0, true),
    ("max_attempts", 1.0, 1_000_000.0, true),
    ("lease_seconds", 1.0, 604_800.0, true),
    ("retry_backoff_base_seconds", 0.0, 31_536_000.0, false),
    ("max_retry_backoff_seconds", 0.0, 31_536_000.0, false),
    ("retention_days", 1.0, 36_500.0, true),
    ("cleanup_interval_hours", 0.001, 8_760.0, false),
    ("processing_delay_seconds", 0.0, 31_536_000.0, true),
    ("polling_interval_seconds", 0.01, 3_600.0, false),
    ("concurrency", 1.0, 10_000.0, true),
];

/// A YAML scalar that may or may not be a number, often near a range's edges.
fn yaml_scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u128>().prop_map(|n| n.to_string()),
        any::<i128>().prop_map(|n| n.to_string()),
        (-20_000i64..2_000_000).prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|x| format!("{x:e}")),
        (-1.0e3f64..1.0e8).prop_map(|x| format!("{x}")),
        (0u32..40).prop_map(|e| format!("1e{e}")),
        (1u32..330).prop_map(|e| format!("1e-{e}")),
        prop::sample::select(vec![
            ".inf",
            "-.inf",
            ".nan",
            ".NaN",
            "1e309",
            "-0",
            "+5",
            "0x10",
            "0o17",
            "1_000",
            "true",
            "false",
            "null",
            "~",
            "'5'",
            "\"10\"",
            "[]",
            "{}",
            "five",
            "0.0",
            "10000.0000001",
            "3600.0",
            "2.5",
        ])
        .prop_map(str::to_string),
    ]
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn config_parser_never_panics_on_arbitrary_text(text in any::<String>()) {
        let _ = parse_checked(&text);
    }

    #[test]
    fn config_parser_never_panics_on_yaml_shaped_text(
        lines in prop::collection::vec(config_line(), 0..24)
    ) {
        let _ = parse_checked(&lines.join("\n"));
    }

    #[test]
    fn any_scalar_for_any_setting_is_in_range_or_refused_naming_the_key(
        key in 0..NUMERIC_KEYS.len(),
        value in yaml_scalar(),
        flow in any::<bool>(),
    ) {
        let (name, min, max, whole) = NUMERIC_KEYS[key];
        let settings = if flow {
            format!("    settings: {{ {name}: {value} }}\n")
        } else {
            format!("    settings:\n      {name}: {value}\n")
        };
        let text = format!("sources:\n  - name: s\n    url: sqlite:s.db\n{settings}");
        match parse_checked(&text) {
            Ok(config) => {
                let settings = &config.sources[0].settings;
                prop_assert_eq!(settings.validate(), Ok(()));
                let got = match name {
                    "batch_size" => f64::from(settings.batch_size),
                    "max_attempts" => f64::from(settings.max_attempts),
                    "lease_seconds" => settings.lease_seconds as f64,
                    "retry_backoff_base_seconds" => settings.retry_backoff_base_seconds,
                    "max_retry_backoff_seconds" => settings.max_retry_backoff_seconds,
                    "retention_days" => settings.retention_days as f64,
                    "cleanup_interval_hours" => settings.cleanup_interval_hours,
                    "processing_delay_seconds" => settings.processing_delay_seconds as f64,
                    "polling_interval_seconds" => settings.polling_interval_seconds,
                    _ => f64::from(settings.concurrency),
                };
                prop_assert!((min..=max).contains(&got), "{name} = {got} accepted from {value}");
                prop_assert!(!whole || got.fract() == 0.0);
                // The durations derived from it never panic.
                let _ = (settings.lease(), settings.polling_interval(), settings.cleanup_interval(), settings.retention());
            }
            Err(message) => {
                prop_assert!(message.contains(name), "{value} for {name}: {message}");
                prop_assert!(message.starts_with("4:") || message.starts_with("5:") || message.starts_with("6:"),
                    "positioned: {message}");
            }
        }
    }

    #[test]
    fn durations_parse_or_refuse_clearly(text in any::<String>()) {
        match crate::cli::parse::parse_duration(&text) {
            Ok(_) => {}
            Err(err) => {
                prop_assert_eq!(crate::cli::error::exit_code(&err), 2);
                let message = err.to_string();
                prop_assert!(
                    message.contains("is not a duration") || message.contains("must not be negative"),
                    "{}",
                    message
                );
            }
        }
    }

    #[test]
    fn well_formed_durations_add_up(parts in prop::collection::vec((0u64..1_000_000, 0usize..5), 1..5)) {
        let units = [("s", 1u64), ("m", 60), ("h", 3600), ("d", 86_400), ("w", 604_800)];
        let text: String = parts.iter().map(|(n, u)| format!("{n}{}", units[*u].0)).collect();
        let total: u64 = parts.iter().map(|(n, u)| n * units[*u].1).sum();
        prop_assert_eq!(crate::cli::parse::parse_duration(&text).unwrap().as_secs(), total);
    }

    #[test]
    fn instants_parse_or_refuse_clearly(text in any::<String>()) {
        if let Err(err) = crate::cli::parse::parse_instant(&text) {
            prop_assert_eq!(crate::cli::error::exit_code(&err), 2);
            prop_assert!(err.to_string().contains("is not an RFC 3339 instant"), "{}", err);
        }
    }

    #[test]
    fn rfc3339_instants_round_trip(seconds in -62_000_000_000i64..253_000_000_000, minutes in -1439i32..1440) {
        let at = chrono::DateTime::from_timestamp(seconds, 0).unwrap();
        // RFC 3339 offsets are whole minutes.
        let zone = chrono::FixedOffset::east_opt(minutes * 60).unwrap();
        let text = at.with_timezone(&zone).to_rfc3339();
        prop_assert_eq!(crate::cli::parse::parse_instant(&text).unwrap(), at);
    }

    #[test]
    fn any_text_is_an_id_kept_as_written_or_a_usage_error(text in any::<String>()) {
        match text.parse::<icq::CommandId>() {
            Ok(id) => {
                prop_assert_eq!(id.as_str(), text.trim());
                prop_assert!(!id.as_str().is_empty());
            }
            Err(err) => {
                prop_assert!(matches!(err, Error::Invalid { .. }), "{:?}", err);
                prop_assert!(err.to_string().contains("id"), "{}", err);
            }
        }
    }

    #[test]
    fn uuid_ids_in_any_case_and_braces_are_kept_and_recognised(
        bytes in any::<[u8; 16]>(),
        upper in any::<bool>(),
        braces in any::<bool>(),
    ) {
        let uuid = uuid::Uuid::from_bytes(bytes);
        let mut text = uuid.hyphenated().to_string();
        if upper {
            text = text.to_uppercase();
        }
        if braces {
            text = format!("{{{text}}}");
        }
        let id: icq::CommandId = text.parse().unwrap();
        prop_assert_eq!(id.as_str(), text.as_str());
        prop_assert_eq!(id.as_uuid(), Some(uuid));
    }

    #[test]
    fn any_payload_text_is_json_or_a_usage_error(text in "[^@].*") {
        match crate::commands::schedule::read_payload(&text, &Default::default()) {
            Ok(value) => prop_assert_eq!(value, serde_json::from_str::<serde_json::Value>(&text).unwrap()),
            Err(err) => {
                prop_assert!(matches!(err, Error::Invalid { source: Some(_), .. }), "{:?}", err);
                prop_assert!(err.to_string().contains("not JSON"), "{}", err);
            }
        }
    }

    #[test]
    fn deeply_nested_payloads_are_refused_not_a_stack_overflow(depth in 1usize..20_000) {
        let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let parsed = crate::commands::schedule::read_payload(&text, &Default::default());
        prop_assert_eq!(parsed.is_ok(), depth <= 127, "depth {}: {:?}", depth, parsed.err());
    }
}
