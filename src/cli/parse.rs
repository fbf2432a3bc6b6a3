//! Values typed on the command line: durations (`30s`, `1h30m`), RFC 3339 instants, and
//! the whole numbers of `--priority`, `--limit` and `--target-version`. Each error says
//! what to write.

use std::time::Duration;

use chrono::{DateTime, Utc};

use icq::error::{Error, Result};

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

/// A whole number from `min` to `max`, or a message naming the range and how to write
/// one (`1.5`, `high` and `1e300` are no priority); `what` is said first ("a priority").
fn whole_in(text: &str, min: i64, max: i64, what: &str, example: &str) -> Result<i64, String> {
    let range = format!("{what} is a whole number from {min} to {max}, e.g. {example}");
    match text.trim().parse::<i64>() {
        Ok(value) if (min..=max).contains(&value) => Ok(value),
        // clap shows the value itself ("invalid value '1.5' for '--priority <P>'").
        Ok(_) => Err(format!("out of range: {range}")),
        Err(_) => Err(range),
    }
}

/// `--priority`: -32768 to 32767, lower runs first.
pub fn parse_priority(text: &str) -> Result<i16, String> {
    let value = whole_in(
        text,
        i16::MIN.into(),
        i16::MAX.into(),
        "a priority (lower runs first)",
        "--priority -5 or --priority 10",
    )?;
    i16::try_from(value).map_err(|e| e.to_string())
}

/// `--limit` of every listing: 1 to [`icq::admin::MAX_PAGE_LIMIT`].
pub fn parse_page_limit(text: &str) -> Result<u32, String> {
    let value = whole_in(
        text,
        1,
        icq::admin::MAX_PAGE_LIMIT.into(),
        "a page size",
        "--limit 100",
    )?;
    u32::try_from(value).map_err(|e| e.to_string())
}

/// `--target-version` of `icq migrate run|revert`: a migration's version, the number its
/// file name starts with (0 with `revert` undoes every migration).
pub fn parse_target_version(text: &str) -> Result<i64, String> {
    match text.trim().parse::<i64>() {
        Ok(version) if version >= 0 => Ok(version),
        _ => Err(
            "not a migration version: write the number a migration's file name starts \
                  with, e.g. --target-version 20260131120000 (`icq migrate info` lists them; 0 \
                  with revert undoes all)"
                .to_owned(),
        ),
    }
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
            assert_eq!(crate::cli::error::exit_code(&err), 2);
        }
        let negative = parse_duration("-1d").unwrap_err();
        assert!(
            negative.to_string().contains("must not be negative"),
            "{negative}"
        );
        assert_eq!(crate::cli::error::exit_code(&negative), 2);
    }

    #[test]
    fn payloads_must_be_json() {
        assert_eq!(
            crate::commands::schedule::read_payload("{\"a\":1}", &Default::default()).unwrap(),
            serde_json::json!({"a": 1})
        );
        let err =
            crate::commands::schedule::read_payload("not json", &Default::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--payload is not JSON: expected"),
            "{err}"
        );
        assert_eq!(crate::cli::error::exit_code(&err), 2);
    }
}
