//! The console's security model, in one place:
//!
//! - **Headers on every response**: a Content-Security-Policy that allows scripts and
//!   styles from the console itself only (`/static/console.js`, no inline script), no
//!   framing (`frame-ancestors 'none'` and `X-Frame-Options: DENY`), `nosniff`, a
//!   referrer for the console's own pages only (`same-origin`: with `no-referrer`,
//!   Chromium sends `Origin: null` on a form post and the origin check could not pass),
//!   and no caching.
//! - **Host check** (loopback binds): a request must name the console by a loopback host
//!   (`127.0.0.1`, `localhost`, `[::1]`) and its port, so a DNS-rebinding page cannot
//!   read the console through a name of its own.
//! - **Sign-in** (non-loopback binds, which need a token): every page needs the token,
//!   from the sign-in form (an `HttpOnly`, `SameSite=Strict` cookie) or an `X-Icq-Token`
//!   header.
//! - **Mutations** ([`check_mutation`]): POST only, actions allowed, a same-origin request
//!   (`Origin`, else `Sec-Fetch-Site`, must match the `Host`) and the token in the form's
//!   `token` field or an `X-Icq-Token` header, compared in constant time. Anything else is
//!   403 and changes nothing.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::Console;

/// The cookie the sign-in form sets on a non-loopback console.
pub const COOKIE: &str = "icq_console_token";

/// The header a script can send the token in.
pub const TOKEN_HEADER: &str = "x-icq-token";

/// The Content-Security-Policy of every response.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
base-uri 'none'";

/// Adds the security headers to every response.
pub async fn headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// The host check and, on a non-loopback console, the sign-in.
pub async fn gate(State(console): State<Console>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    if !console.inner.hosts.is_empty() {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !console
            .inner
            .hosts
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(host))
        {
            return (
                StatusCode::MISDIRECTED_REQUEST,
                "this console answers to a loopback address only (open it as http://127.0.0.1:PORT)",
            )
                .into_response();
        }
    }
    let path = request.uri().path();
    if console.inner.sign_in_required
        && !path.starts_with("/static/")
        && path != "/login"
        && !signed_in(&console, headers)
    {
        return Redirect::to("/login").into_response();
    }
    next.run(request).await
}

/// Whether a request carries the token in the sign-in cookie or the token header.
fn signed_in(console: &Console, headers: &HeaderMap) -> bool {
    let Some(token) = console.inner.token.as_deref() else {
        return false;
    };
    if header_token(headers).is_some_and(|given| same_secret(given, token)) {
        return true;
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|cookies| cookies.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .any(|(name, value)| name == COOKIE && same_secret(value, &cookie_value(token)))
}

/// The sign-in cookie's value for `token`: its bytes in hex (any token fits a cookie).
pub fn cookie_value(token: &str) -> String {
    token.bytes().map(|b| format!("{b:02x}")).collect()
}

fn header_token(headers: &HeaderMap) -> Option<&str> {
    headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok())
}

/// Why a mutating request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The console was started without `--allow-actions`.
    ReadOnly,
    /// `Origin`/`Sec-Fetch-Site` missing or naming another site.
    CrossOrigin,
    /// No token, or the wrong one.
    Token,
}

impl Refusal {
    /// The message shown on the 403 page.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::ReadOnly => {
                "This console is read-only: start it with --allow-actions and ICQ_CONSOLE_TOKEN to requeue, replay, cancel or purge."
            }
            Refusal::CrossOrigin => {
                "Refused: the request did not come from this console's own pages (Origin / Sec-Fetch-Site do not match the Host). Nothing was changed."
            }
            Refusal::Token => {
                "Refused: the console token is missing or wrong. Nothing was changed."
            }
        }
    }
}

/// Checks a mutating request: actions allowed, same origin, then the token (from the form
/// field `form_token` or the `X-Icq-Token` header).
pub fn check_mutation(
    console: &Console,
    headers: &HeaderMap,
    form_token: Option<&str>,
) -> Result<(), Refusal> {
    let Some(token) = console
        .inner
        .token
        .as_deref()
        .filter(|_| console.inner.allow_actions)
    else {
        return Err(Refusal::ReadOnly);
    };
    if !same_origin(headers) {
        return Err(Refusal::CrossOrigin);
    }
    check_token(token, headers, form_token)
}

/// The token from the form field or the header, compared in constant time.
pub fn check_token(
    token: &str,
    headers: &HeaderMap,
    form_token: Option<&str>,
) -> Result<(), Refusal> {
    let given = form_token
        .filter(|t| !t.is_empty())
        .or_else(|| header_token(headers));
    match given {
        Some(given) if same_secret(given, token) => Ok(()),
        _ => Err(Refusal::Token),
    }
}

/// Whether the request comes from a page of this console: its `Origin` is
/// `http://HOST` for the request's own `Host`; without an `Origin`, `Sec-Fetch-Site` says
/// `same-origin`. A request carrying neither is refused.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let fetch_site = headers.get("sec-fetch-site").and_then(|h| h.to_str().ok());
    if fetch_site.is_some_and(|site| site != "same-origin") {
        return false;
    }
    match (headers.get(header::ORIGIN).map(HeaderValue::to_str), host) {
        (Some(Ok(origin)), Some(host)) => origin
            .strip_prefix("http://")
            .is_some_and(|rest| rest.eq_ignore_ascii_case(host)),
        (Some(_), _) => false,
        (None, _) => fetch_site == Some("same-origin"),
    }
}

/// Compares two secrets in time that depends on their lengths only.
pub fn same_secret(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn same_origin_needs_a_matching_origin_or_fetch_site() {
        let host = ("host", "127.0.0.1:8089");
        assert!(same_origin(&headers(&[
            host,
            ("origin", "http://127.0.0.1:8089")
        ])));
        assert!(!same_origin(&headers(&[
            host,
            ("origin", "http://evil.example")
        ])));
        assert!(!same_origin(&headers(&[host, ("origin", "null")])));
        assert!(same_origin(&headers(&[
            host,
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(!same_origin(&headers(&[
            host,
            ("origin", "http://127.0.0.1:8089"),
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(!same_origin(&headers(&[host])));
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret("s3cret", "s3cret"));
        assert!(!same_secret("s3cret", "s3creT"));
        assert!(!same_secret("s3cre", "s3cret"));
        assert!(!same_secret("", "s3cret"));
    }
}
