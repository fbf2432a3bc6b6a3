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
//! - **Cross-site requests** ([`cross_site`]): any request, GET included, whose
//!   `Sec-Fetch-Site` says another site or whose `Origin` names another origin is refused
//!   before anything is read, so a page elsewhere cannot make an operator's browser run
//!   the console's counts (an `<img src>` pointing at `/live`) or open its confirmation
//!   pages. Typing the address, a bookmark and the console's own links pass
//!   (`Sec-Fetch-Site: none` / `same-origin`, or no such header from a non-browser).
//! - **Wrong tokens** ([`Throttle`]): after a few wrong tokens from one address, every
//!   further try from it is refused unchecked for a wait that doubles with each failure
//!   (bounded), so guessing runs at a few tries a minute however many connections try.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
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
    if cross_site(headers) {
        return (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "Refused: this request came from another site. Open the console by its address \
             (http://127.0.0.1:PORT/) instead of following a link or loading it from another page.",
        )
            .into_response();
    }
    let path = request.uri().path();
    if console.inner.sign_in_required && !path.starts_with("/static/") && path != "/login" {
        let peer = peer_of(&request);
        match signed_in(&console, peer, request.headers()) {
            Ok(true) => {}
            Ok(false) => return Redirect::to("/login").into_response(),
            Err(refusal) => return refusal_response(refusal),
        }
    }
    next.run(request).await
}

/// The client's address (set by the console's accept loop).
pub fn peer_of(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip())
}

/// A bare refusal (for requests refused before any page is rendered).
fn refusal_response(refusal: Refusal) -> Response {
    (
        refusal.status(),
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        refusal.message(),
    )
        .into_response()
}

/// Whether a request comes from another site: `Sec-Fetch-Site` other than `same-origin`
/// or `none`, or an `Origin` other than `http://HOST` (`null` included). A request with
/// neither header (a non-browser client) is not cross-site.
pub fn cross_site(headers: &HeaderMap) -> bool {
    let fetch_site = headers.get("sec-fetch-site").map(HeaderValue::to_str);
    if let Some(site) = fetch_site
        && !matches!(site, Ok("same-origin" | "none"))
    {
        return true;
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    match headers.get(header::ORIGIN).map(HeaderValue::to_str) {
        None => false,
        Some(Ok(origin)) => !host.is_some_and(|host| {
            origin
                .strip_prefix("http://")
                .is_some_and(|rest| rest.eq_ignore_ascii_case(host))
        }),
        Some(Err(_)) => true,
    }
}

/// Whether a request carries the token in the sign-in cookie or the token header; a
/// wrong one counts as a failure for the [`Throttle`].
fn signed_in(
    console: &Console,
    peer: Option<IpAddr>,
    headers: &HeaderMap,
) -> Result<bool, Refusal> {
    let Some(token) = console.inner.token.as_deref() else {
        return Ok(false);
    };
    let throttle = &console.inner.throttle;
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|cookies| cookies.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value);
    let given = header_token(headers);
    if given.is_none() && cookie.is_none() {
        return Ok(false);
    }
    throttle.check(peer)?;
    let right = given.is_some_and(|given| same_secret(given, token))
        || cookie.is_some_and(|value| same_secret(value, &cookie_value(token)));
    if right {
        throttle.succeeded(peer);
    } else {
        throttle.failed(peer);
    }
    Ok(right)
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
    /// Too many wrong tokens from this address lately.
    Throttled,
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
            Refusal::Throttled => {
                "Refused: too many wrong tokens from this address. Wait a little and try again (each wrong token makes the wait longer, up to a minute). Nothing was changed."
            }
        }
    }

    /// The response status.
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::Throttled => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::FORBIDDEN,
        }
    }
}

/// Wrong tokens that may be tried before the waits begin.
const FREE_TRIES: u32 = 3;

/// The longest wait after a wrong token.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// How many addresses the throttle remembers before it forgets the quiet ones.
const REMEMBERED: usize = 10_000;

/// Wrong tokens per client address, and until when its next try is refused unchecked.
#[derive(Debug, Default)]
pub struct Throttle {
    failures: Mutex<HashMap<Option<IpAddr>, Failures>>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    until: Instant,
}

impl Throttle {
    /// Refuses while the address must wait.
    pub fn check(&self, peer: Option<IpAddr>) -> Result<(), Refusal> {
        let Ok(failures) = self.failures.lock() else {
            return Ok(());
        };
        match failures.get(&peer) {
            Some(f) if f.until > Instant::now() => Err(Refusal::Throttled),
            _ => Ok(()),
        }
    }

    /// A wrong token: past [`FREE_TRIES`], the address waits 1 s, 2 s, 4 s … up to
    /// [`MAX_WAIT`] before its next try is checked.
    pub fn failed(&self, peer: Option<IpAddr>) {
        let Ok(mut failures) = self.failures.lock() else {
            return;
        };
        let now = Instant::now();
        if failures.len() >= REMEMBERED {
            failures.retain(|_, f| f.until + MAX_WAIT > now);
            if failures.len() >= REMEMBERED {
                failures.clear();
            }
        }
        let entry = failures.entry(peer).or_insert(Failures {
            count: 0,
            until: now,
        });
        entry.count = entry.count.saturating_add(1);
        if entry.count > FREE_TRIES {
            let doublings = (entry.count - FREE_TRIES - 1).min(16);
            entry.until = now + (Duration::from_secs(1) * (1u32 << doublings)).min(MAX_WAIT);
        }
    }

    /// The right token: the address starts afresh.
    pub fn succeeded(&self, peer: Option<IpAddr>) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(&peer);
        }
    }
}

/// Checks a mutating request: actions allowed, same origin, then the token (from the form
/// field `form_token` or the `X-Icq-Token` header).
pub fn check_mutation(
    console: &Console,
    peer: Option<IpAddr>,
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
    check_token_throttled(console, peer, token, headers, form_token)
}

/// [`check_token`] behind the [`Throttle`]: refused unchecked while the address waits,
/// and a wrong token lengthens its wait.
pub fn check_token_throttled(
    console: &Console,
    peer: Option<IpAddr>,
    token: &str,
    headers: &HeaderMap,
    form_token: Option<&str>,
) -> Result<(), Refusal> {
    let throttle = &console.inner.throttle;
    throttle.check(peer)?;
    let checked = check_token(token, headers, form_token);
    match checked {
        Ok(()) => throttle.succeeded(peer),
        Err(_) => throttle.failed(peer),
    }
    checked
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
    fn cross_site_requests_are_told_apart_from_the_console_s_own() {
        let host = ("host", "127.0.0.1:8089");
        assert!(!cross_site(&headers(&[host])), "curl");
        assert!(!cross_site(&headers(&[host, ("sec-fetch-site", "none")])));
        assert!(!cross_site(&headers(&[
            host,
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(cross_site(&headers(&[
            host,
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(cross_site(&headers(&[
            host,
            ("sec-fetch-site", "same-site")
        ])));
        assert!(cross_site(&headers(&[
            host,
            ("origin", "http://evil.example")
        ])));
        assert!(cross_site(&headers(&[host, ("origin", "null")])));
        assert!(!cross_site(&headers(&[
            host,
            ("origin", "http://127.0.0.1:8089")
        ])));
    }

    #[test]
    fn wrong_tokens_make_the_address_wait_longer_each_time() {
        let throttle = Throttle::default();
        let peer = Some(IpAddr::from([127, 0, 0, 1]));
        let other = Some(IpAddr::from([127, 0, 0, 2]));
        for _ in 0..FREE_TRIES {
            assert_eq!(throttle.check(peer), Ok(()));
            throttle.failed(peer);
        }
        assert_eq!(throttle.check(peer), Ok(()), "the first tries are free");
        throttle.failed(peer);
        assert_eq!(throttle.check(peer), Err(Refusal::Throttled));
        assert_eq!(
            throttle.check(other),
            Ok(()),
            "another address is not held up"
        );
        for _ in 0..40 {
            throttle.failed(peer);
        }
        let until = throttle.failures.lock().unwrap()[&peer].until;
        assert!(until <= Instant::now() + MAX_WAIT, "bounded");
        throttle.succeeded(peer);
        assert_eq!(throttle.check(peer), Ok(()));
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret("s3cret", "s3cret"));
        assert!(!same_secret("s3cret", "s3creT"));
        assert!(!same_secret("s3cre", "s3cret"));
        assert!(!same_secret("", "s3cret"));
    }
}
