//! Values typed on the command line: durations (`30s`, `1h30m`), RFC 3339 instants, and
//! payload arguments (JSON text, `@file`, `@-` for stdin). Each error says what to write.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};

/// Reads a payload argument: JSON text, `@path` for a file's contents, or `@-` for stdin.
/// Text that is not JSON is an [`Error::Invalid`] carrying the parse error.
pub fn read_payload(argument: &str) -> Result<serde_json::Value> {
    let (text, origin) = match argument.strip_prefix('@') {
        Some("-") => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(Error::io("reading the payload from stdin"))?;
            (text, "the payload on stdin".to_owned())
        }
        Some(path) => (
            std::fs::read_to_string(path)
                .map_err(Error::io(format!("reading the payload file {path}")))?,
            format!("the payload file {path}"),
        ),
        None => (argument.to_owned(), "--payload".to_owned()),
    };
    serde_json::from_str(&text).map_err(|e| {
        Error::invalid_because(
            format!(
                "{origin} is not JSON: {e} (pass a JSON document such as '{{\"order_id\": 42}}', \
                 or @file to read one)"
            ),
            e,
        )
    })
}

/// Parses a duration like `30s`, `5m`, `12h`, `7d`, `2w` or a sum such as `1h30m` (or
/// `1h 30m`), with humantime's units (`ms`, `min`, `hours`, `days`, ...).
pub fn parse_duration(text: &str) -> Result<Duration> {
    let trimmed = text.trim();
    if trimmed.starts_with('-') {
        return Err(Error::invalid(format!(
            "`{text}` must not be negative: write how long, like 30s, 5m or 7d"
        )));
    }
    humantime::parse_duration(trimmed).map_err(|e| {
        Error::invalid_because(
            format!(
                "`{text}` is not a duration ({e}): write a number and a unit, like 30s, 5m, \
                 12h, 7d or 1h30m"
            ),
            e,
        )
    })
}

/// Parses an RFC 3339 instant (`2026-01-31T12:00:00Z`, any offset) as UTC.
pub fn parse_instant(text: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|at| at.with_timezone(&Utc))
        .map_err(|e| {
            Error::invalid_because(
                format!(
                    "`{text}` is not an RFC 3339 instant ({e}): write it like 2026-01-31T12:00:00Z"
                ),
                e,
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_sums() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("12h").unwrap(), Duration::from_secs(43_200));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(604_800));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(
            parse_duration("2w").unwrap(),
            Duration::from_secs(1_209_600)
        );
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        for bad in ["", "7", "d", "7x", "99999999999999999999w"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(
                err.to_string().contains("like 30s, 5m, 12h, 7d"),
                "{bad}: {err}"
            );
            assert_eq!(err.exit_code(), 2);
        }
        let negative = parse_duration("-1d").unwrap_err();
        assert!(
            negative.to_string().contains("must not be negative"),
            "{negative}"
        );
        assert_eq!(negative.exit_code(), 2);
    }

    #[test]
    fn payloads_must_be_json() {
        assert_eq!(
            read_payload("{\"a\":1}").unwrap(),
            serde_json::json!({"a": 1})
        );
        let err = read_payload("not json").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--payload is not JSON: expected"),
            "{err}"
        );
        assert_eq!(err.exit_code(), 2);
    }
}
