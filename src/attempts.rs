//! Every failed attempt of a command, kept with it: the `Errors` column (schema version
//! 4) holds a JSON array of `{"attempt": N, "at": "<RFC 3339 UTC>", "error": "…"}`, the
//! last [`MAX_ATTEMPT_ERRORS`] failures, oldest first, each error cut to
//! [`MAX_ERROR_BYTES`] like `LastError` (which stays, holding the last one).
//!
//! The processor computes the new array from the value its claim read (the row is leased
//! to it, so nobody else writes it meanwhile) and the failure's stamp writes it, guarded
//! by the lease token like every stamp. The column is shared with other programs, so a
//! stored value is never trusted: entries of another shape are read as far as they go,
//! and a value that is not a JSON array (not JSON at all, an object, 10 MB of text) is
//! replaced by one entry holding the start of its text, so a hostile value can never fail
//! the stamp.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// How many failed attempts `Errors` keeps (the newest).
pub const MAX_ATTEMPT_ERRORS: usize = 20;

/// The most bytes of one attempt's error text, as for `LastError`.
pub const MAX_ERROR_BYTES: usize = 16 * 1024;

/// The most bytes kept of a stored `Errors` value that is not a JSON array.
pub const MAX_UNREADABLE_BYTES: usize = 1024;

/// One failed attempt, as stored in `Errors`.
///
/// # Examples
///
/// ```
/// use icq::attempts::{AttemptError, parse};
///
/// let stored = r#"[{"attempt":1,"at":"2030-01-01T06:00:00.000Z","error":"timeout"}]"#;
/// let errors = parse(Some(stored));
/// assert_eq!(errors, [AttemptError {
///     attempt: Some(1),
///     at: Some("2030-01-01T06:00:00.000Z".into()),
///     error: "timeout".into(),
/// }]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptError {
    /// The attempt's number (1 for the first run); `None` when the stored entry had none.
    pub attempt: Option<u32>,
    /// When it failed, as stored (icq writes RFC 3339 UTC); `None` when the entry had none.
    pub at: Option<String>,
    /// What the handler (or icq) said.
    pub error: String,
}

/// The failed attempts stored in `raw` (the `Errors` column), oldest first; empty for
/// NULL or blank. Never fails: see the module's documentation for foreign values.
///
/// # Examples
///
/// ```
/// use icq::attempts::parse;
///
/// assert!(parse(None).is_empty());
/// let foreign = parse(Some("disk full"));
/// assert_eq!(foreign.len(), 1);
/// assert_eq!(foreign[0].attempt, None);
/// assert!(foreign[0].error.contains("disk full"), "{}", foreign[0].error);
/// ```
pub fn parse(raw: Option<&str>) -> Vec<AttemptError> {
    let Some(text) = raw.map(str::trim).filter(|t| !t.is_empty()) else {
        return Vec::new();
    };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(entries)) => entries.into_iter().map(entry).collect(),
        _ => vec![AttemptError {
            attempt: None,
            at: None,
            error: format!(
                "Errors held a value that is not a JSON array, replaced: {}",
                crate::redact::bounded(text, MAX_UNREADABLE_BYTES)
            ),
        }],
    }
}

/// One stored entry, read as far as it goes: an object's `attempt` (a whole number),
/// `at` and `error` (text, else its JSON), anything else as its JSON text; every text
/// bounded.
fn entry(value: serde_json::Value) -> AttemptError {
    let text = |value: &serde_json::Value, max: usize| match value {
        serde_json::Value::String(s) => crate::redact::bounded(s, max),
        other => crate::redact::bounded(&other.to_string(), max),
    };
    match &value {
        serde_json::Value::Object(fields) => AttemptError {
            attempt: fields
                .get("attempt")
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| u32::try_from(n).ok()),
            at: fields
                .get("at")
                .filter(|v| !v.is_null())
                .map(|v| text(v, 64)),
            error: fields
                .get("error")
                .map(|v| text(v, MAX_ERROR_BYTES))
                .unwrap_or_default(),
        },
        other => AttemptError {
            attempt: None,
            at: None,
            error: text(other, MAX_ERROR_BYTES),
        },
    }
}

/// The `Errors` value after attempt `attempt` failed at `at` with `error`: the stored
/// entries of `raw` ([`parse`]) and the new one, the last [`MAX_ATTEMPT_ERRORS`] kept,
/// the error's NUL bytes removed and its text cut to [`MAX_ERROR_BYTES`].
///
/// # Examples
///
/// ```
/// use icq::attempts::{MAX_ATTEMPT_ERRORS, append, parse};
///
/// let at = "2030-01-01T06:00:00Z".parse()?;
/// let mut stored: Option<String> = None;
/// for attempt in 1..=25 {
///     stored = Some(append(stored.as_deref(), attempt, at, &format!("failure {attempt}")));
/// }
/// let errors = parse(stored.as_deref());
/// assert_eq!(errors.len(), MAX_ATTEMPT_ERRORS);
/// assert_eq!(errors[0].attempt, Some(6));
/// assert_eq!(errors[19].error, "failure 25");
/// assert_eq!(errors[19].at.as_deref(), Some("2030-01-01T06:00:00.000Z"));
///
/// // A hostile value never fails: it is replaced, keeping the start of its text.
/// let replaced = append(Some("{not json"), 3, at, "boom");
/// assert_eq!(parse(Some(&replaced)).len(), 2);
/// # Ok::<(), chrono::ParseError>(())
/// ```
pub fn append(raw: Option<&str>, attempt: u32, at: DateTime<Utc>, error: &str) -> String {
    let mut entries = parse(raw);
    entries.push(AttemptError {
        attempt: Some(attempt),
        at: Some(crate::command::format_timestamp(at)),
        error: crate::redact::bounded(&error.replace('\0', ""), MAX_ERROR_BYTES),
    });
    let skip = entries.len().saturating_sub(MAX_ATTEMPT_ERRORS);
    serde_json::to_string(&entries[skip..]).unwrap_or_else(|_| "[]".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> DateTime<Utc> {
        "2030-01-01T06:00:00Z".parse().unwrap()
    }

    #[test]
    fn hostile_values_are_replaced_and_bounded() {
        let huge = "x".repeat(10 << 20);
        let written = append(Some(&huge), 2, at(), "boom");
        assert!(written.len() < 4 * 1024, "{}", written.len());
        let errors = parse(Some(&written));
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[1].error, "boom");
        for foreign in [
            "{}",
            "42",
            "null",
            "\"text\"",
            "[1, \"two\", {\"attempt\": -1}]",
        ] {
            let written = append(Some(foreign), 1, at(), "e");
            let errors = parse(Some(&written));
            assert_eq!(
                errors.last().map(|e| e.error.as_str()),
                Some("e"),
                "{foreign}"
            );
        }
        let big_entries = serde_json::to_string(&vec![
            serde_json::json!({"attempt": 1, "error": "y".repeat(1 << 20)});
            30
        ])
        .unwrap();
        let written = append(Some(&big_entries), 31, at(), "last");
        assert!(
            written.len() < 21 * (MAX_ERROR_BYTES + 200),
            "{}",
            written.len()
        );
        assert_eq!(parse(Some(&written)).len(), MAX_ATTEMPT_ERRORS);
    }

    #[test]
    fn nul_bytes_are_removed_and_long_errors_cut() {
        let written = append(None, 1, at(), &format!("a\0b{}", "é".repeat(20_000)));
        let errors = parse(Some(&written));
        assert!(errors[0].error.starts_with("ab"));
        assert!(errors[0].error.len() <= MAX_ERROR_BYTES);
    }
}
