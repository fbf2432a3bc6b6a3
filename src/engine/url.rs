//! A database URL made fit for a driver, before the driver sees it: the one place every
//! connection's URL passes through ([`super::connect`] and `icq migrate`).
//!
//! sqlx's PostgreSQL driver logs every query parameter it does not know, value and all
//! (`ignoring unrecognized connect parameter key=PassWord value=<secret>`), and a log
//! line is no place for a password. So [`for_driver`] removes from a PostgreSQL URL every
//! parameter whose name looks secret (see [`crate::redact::is_secret_name`]) but that
//! sqlx does not take: `PassWord` (libpq parameter names are case-sensitive, and sqlx
//! ignores it), `sslpassword` (sqlx cannot decrypt a client key), `api_token`, ... It
//! logs a warning naming the parameter, never its value. The parameters sqlx takes
//! (`password`, `options`, `options[...]`) and every other one (`target_session_attrs`,
//! which icq's own PostgreSQL code reads) are passed on untouched, byte for byte.
//!
//! The URL is edited as text, never re-serialized: a libpq multi-host URL
//! (`postgres://h1:5432,h2:5433/db`) is not a URL the `url` crate accepts, and every byte
//! of the others stays as written.

use std::borrow::Cow;

use crate::ident::Engine;

/// The query parameters sqlx's PostgreSQL driver takes (sqlx-postgres
/// `PgConnectOptions::parse_from_url`), besides `options[NAME]`.
const SQLX_POSTGRES_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// `url` as the engine's driver should see it: for PostgreSQL, without the
/// secret-looking parameters sqlx does not take (each dropped one is named in a warning,
/// without its value); any other URL unchanged.
///
/// E.g. `postgres://app@db/shop?PassWord=s3cret&sslpassword=k3y&sslmode=require` becomes
/// `postgres://app@db/shop?sslmode=require`.
pub(crate) fn for_driver(url: &str) -> Cow<'_, str> {
    if !matches!(Engine::from_url(url), Ok(Engine::Postgres)) {
        return Cow::Borrowed(url);
    }
    let (head, fragment) = match url.find('#') {
        Some(hash) => url.split_at(hash),
        None => (url, ""),
    };
    let Some((base, query)) = head.split_once('?') else {
        return Cow::Borrowed(url);
    };
    let mut kept: Vec<&str> = Vec::new();
    let mut dropped: Vec<String> = Vec::new();
    for pair in query.split('&') {
        let name = decode(pair.split_once('=').map_or(pair, |(name, _)| name));
        if is_unknown_secret(&name) {
            dropped.push(name);
        } else {
            kept.push(pair);
        }
    }
    if dropped.is_empty() {
        return Cow::Borrowed(url);
    }
    for name in &dropped {
        tracing::warn!(
            parameter = %crate::redact::escape_for_log(name),
            "ignoring the connect parameter: sqlx's PostgreSQL driver does not take it \
             (parameter names are case-sensitive: a password goes in `password=` or the \
             URL's user information; `sslpassword` is not supported); its value is not used \
             or shown"
        );
    }
    let mut out = base.to_owned();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    out.push_str(fragment);
    Cow::Owned(out)
}

/// A secret-looking parameter name sqlx's PostgreSQL driver would log with its value.
fn is_unknown_secret(name: &str) -> bool {
    !SQLX_POSTGRES_PARAMETERS.contains(&name)
        && !name.starts_with("options[")
        && crate::redact::is_secret_name(name)
}

/// A query name as a form decoder reads it (`+` is a blank, `%XX` a byte), lossily.
fn decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("{text}=").as_bytes())
        .next()
        .map(|(name, _)| name.into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_looking_parameters_sqlx_would_log_are_removed() {
        for (given, wanted) in [
            (
                "postgres://u@h/d?PassWord=S1&sslpassword=S2&application_name=a",
                "postgres://u@h/d?application_name=a",
            ),
            ("postgresql://u@h/d?PASSWORD=S1", "postgresql://u@h/d"),
            (
                "postgres://u@h/d?pass%57ord=S1&x=1#frag",
                "postgres://u@h/d?x=1#frag",
            ),
            (
                "postgres://u:p@h1:5432,h2:5433/d?target_session_attrs=read-write&api_token=S3",
                "postgres://u:p@h1:5432,h2:5433/d?target_session_attrs=read-write",
            ),
            ("postgres://u@h/d?api+token=S4", "postgres://u@h/d"),
        ] {
            assert_eq!(for_driver(given), wanted, "{given}");
        }
        // Kept as written: what sqlx takes, what is not secret, other engines.
        for kept in [
            "postgres://u@h/d?password=S&options=-c%20password%3DS&options[search_path]=x",
            "postgres://u@h/d?sslmode=disable&application_name=icq&unknown=1",
            "postgres://u@h/d",
            "mysql://u@h/d?PassWord=S",
            "sqlite:q.db?mode=rwc&key=S",
        ] {
            assert!(matches!(for_driver(kept), Cow::Borrowed(_)), "{kept}");
        }
    }
}
