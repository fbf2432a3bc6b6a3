//! The `http` handler: POSTs the payload to a URL.
//!
//! Protocol: the payload JSON as the body (`Content-Type: application/json`); the context
//! in `X-Icq-Command-Id`, `X-Icq-Command-Type`, `X-Icq-Attempt`, `X-Icq-Source`,
//! `X-Icq-User-Id`, `X-Icq-Roles` (JSON array), `X-Icq-Tenant-Id` and
//! `X-Icq-Correlation-Id`, every one on every request (empty when the command has no such
//! context, or when its text holds a control character a header cannot carry). A 2xx
//! status is success; 429 (Too Many Requests) and 503 (Service Unavailable) snooze the
//! command (it runs again later without consuming an attempt) after the response's
//! `Retry-After` (seconds or an HTTP date in any of its three forms; [`DEFAULT_SNOOZE`]
//! when absent or empty; at least [`MIN_SNOOZE`](super::MIN_SNOOZE) even for `0` or a past
//! date; a negative, unreadable or longer than [`MAX_SNOOZE`] value fails the attempt
//! saying why); any other
//! status, a transport error or the timeout fails the attempt, with the status and a
//! bounded excerpt of the body in `LastError`.
//!
//! Memory is bounded whatever the endpoint answers: a 2xx or 3xx body is never read, and
//! of any other only the first [`BODY_EXCERPT_BYTES`] (plus one, to know it was longer)
//! are read, chunk by chunk; the connection is then dropped with the rest unread.
//!
//! Redirects are never followed: a 3xx fails the attempt (`HTTP 302 redirect to ... not
//! followed: icq POSTs only to the configured URL`). Following one would either turn the
//! POST into a bodiless GET (301/302/303) and report a command delivered that never was,
//! or send the payload and the configured headers (often credentials) to wherever the
//! endpoint points (307/308). Configure the final URL instead.
//!
//! No URL is shown with its secrets: the configured URL, a redirect's `Location` and any
//! transport error message go through `crate::redact` (password and `?token=`-like
//! query values masked).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use super::{DEFAULT_SNOOZE, Handler, HandlerError, HandlerResult, Job, MAX_SNOOZE};

/// Bytes of a failed response's body kept for `LastError`.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use icq::handler::http::{BODY_EXCERPT_BYTES, HttpHandler};
/// use icq::Handler;
///
/// let handler = HttpHandler::new("https://hooks.example.com/orders", &Default::default(), None)?;
/// # let job = icq::Job::new("t", serde_json::json!({})).with_source("shop");
/// if let Err(failed) = handler.handle(job).await {
///     // e.g. `HTTP 500 Internal Server Error: <the first 512 bytes of the body>`
///     assert!(failed.message.len() < BODY_EXCERPT_BYTES + 200);
/// }
/// # Ok(())
/// # }
/// ```
pub const BODY_EXCERPT_BYTES: usize = 512;

/// POSTs each command to one endpoint.
///
/// A `handlers:` entry with `http:` in `icq.yaml` becomes one.
///
/// # Examples
///
/// ```
/// use std::collections::BTreeMap;
/// use std::sync::Arc;
/// use std::time::Duration;
/// use icq::handler::http::HttpHandler;
///
/// let headers = BTreeMap::from([("Authorization".to_string(), "Bearer s3cret".to_string())]);
/// let timeout = Some(Duration::from_secs(10));
/// let handler = HttpHandler::new("https://hooks.example.com/orders", &headers, timeout)?;
/// assert!(!format!("{handler:?}").contains("s3cret")); // `Debug` shows header names only
///
/// let mut registry = icq::Registry::new();
/// registry.insert("orders.notify", Arc::new(handler))?;
/// # Ok::<(), icq::Error>(())
/// ```
#[derive(Clone)]
pub struct HttpHandler {
    client: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
}

/// `Debug` shows the URL redacted and header names only (their values often carry
/// tokens).
impl std::fmt::Debug for HttpHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("HttpHandler")
            .field("url", &redacted(&self.url))
            .field("headers", &names)
            .finish()
    }
}

impl HttpHandler {
    /// A handler posting to `url` with the extra `headers`, failing an attempt after
    /// `timeout` (default 30 s). See [`HttpHandler`]'s example.
    ///
    /// A URL that is not `http://` or `https://`, or a header that is not valid, is an
    /// [`Error::Invalid`](crate::Error::Invalid).
    pub fn new(
        url: &str,
        headers: &BTreeMap<String, String>,
        timeout: Option<Duration>,
    ) -> crate::Result<HttpHandler> {
        let url = reqwest::Url::parse(url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| {
                crate::Error::invalid(format!(
                    "`{}` is not an http(s) URL",
                    crate::redact::redact_url(url)
                ))
            })?;
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                crate::Error::invalid(format!("`{name}` is not a valid header name"))
            })?;
            let value = HeaderValue::from_str(value).map_err(|_| {
                crate::Error::invalid(format!("the value of header `{name}` is not valid"))
            })?;
            map.insert(name, value);
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout.unwrap_or(Duration::from_secs(30)))
            .user_agent(concat!("icq/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(crate::Error::runtime("cannot build the HTTP client"))?;
        Ok(HttpHandler {
            client,
            url,
            headers: map,
        })
    }
}

/// A header value from arbitrary text; text a header cannot carry is left out.
fn value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_bytes(text.as_bytes()).ok()
}

/// The value of an `X-Icq-*` header: every one is sent on every request, empty when the
/// command has no such context (as the exec handler sets its `ICQ_*` variables empty) or
/// when the text cannot be a header value (a control character such as a line break).
fn context_value(text: Option<&str>) -> HeaderValue {
    text.and_then(value)
        .unwrap_or_else(|| HeaderValue::from_static(""))
}

/// Up to [`BODY_EXCERPT_BYTES`] of a body, as text fit for `LastError`: lossy UTF-8,
/// trimmed, line breaks kept and other control characters escaped.
fn excerpt(body: &[u8]) -> String {
    let cut = &body[..body.len().min(BODY_EXCERPT_BYTES)];
    let text = String::from_utf8_lossy(cut);
    let text = crate::redact::clean_stored_text(text.trim());
    if body.len() > BODY_EXCERPT_BYTES {
        format!("{text}…")
    } else {
        text
    }
}

#[async_trait]
impl Handler for HttpHandler {
    async fn handle(&self, job: Job) -> HandlerResult {
        let ctx = &job.context;
        let mut headers = self.headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let roles = serde_json::to_string(&ctx.roles).unwrap_or_else(|_| "[]".into());
        let context = [
            ("x-icq-command-id", Some(job.id.to_string())),
            ("x-icq-command-type", Some(job.type_name.clone())),
            ("x-icq-attempt", Some(job.attempt.to_string())),
            ("x-icq-source", Some(job.source.to_string())),
            ("x-icq-user-id", ctx.user_id.clone()),
            ("x-icq-roles", Some(roles)),
            ("x-icq-tenant-id", ctx.tenant_id.clone()),
            ("x-icq-correlation-id", ctx.correlation_id.clone()),
        ];
        for (name, text) in context {
            headers.insert(
                HeaderName::from_static(name),
                context_value(text.as_deref()),
            );
        }
        // The execution span's context, so the receiving service's spans join the trace.
        if let Some(traceparent) = crate::otel::current_traceparent()
            && let Ok(value) = HeaderValue::from_str(&traceparent)
        {
            headers.insert(HeaderName::from_static("traceparent"), value);
        }
        let response = self
            .client
            .post(self.url.clone())
            .headers(headers)
            .body(job.payload.to_string())
            .send()
            .await
            .map_err(|err| {
                let what = if err.is_timeout() {
                    "timed out"
                } else {
                    "failed"
                };
                // reqwest's message names the URL as given, `?token=` and all: drop it
                // and name the redacted one instead.
                let err = err.without_url();
                let mut message = format!("POST {} {what}: {err}", redacted(&self.url));
                let mut source = std::error::Error::source(&err);
                while let Some(cause) = source {
                    message.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                HandlerError::retry(crate::redact::redact_text(&message))
            })?;
        let status = response.status();
        if status.is_success() {
            // The body is never read: dropping the response closes the connection
            // instead of draining whatever the endpoint sends.
            return Ok(());
        }
        if status.is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned());
            let target = match location {
                Some(location) => match self.url.join(&location) {
                    Ok(absolute) => format!(" to {}", redacted(&absolute)),
                    Err(_) => format!(
                        " to {}",
                        crate::redact::escape_for_log(&crate::redact::redact_text(&location))
                    ),
                },
                None => " (no Location header)".to_string(),
            };
            return Err(HandlerError::retry(format!(
                "HTTP {} redirect{target} not followed: icq POSTs only to the configured URL",
                status.as_u16()
            )));
        }
        if matches!(status.as_u16(), 429 | 503) {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            return Err(
                match retry_after_delay(retry_after.as_deref(), chrono::Utc::now()) {
                    Ok(delay) => {
                        let mut snooze = HandlerError::snooze(delay);
                        snooze.message = format!("HTTP {status}: {}", snooze.message);
                        snooze
                    }
                    Err(why) => HandlerError::retry(format!(
                        "HTTP {status} with an unusable Retry-After: {why}"
                    )),
                },
            );
        }
        let body = read_prefix(response, BODY_EXCERPT_BYTES + 1).await;
        let mut message = format!("HTTP {status}");
        let body = excerpt(&body);
        if !body.is_empty() {
            message.push_str(": ");
            message.push_str(&body);
        }
        Err(HandlerError::retry(message))
    }
}

/// The snooze a 429 or 503 response asks for: its `Retry-After` in seconds (a whole or
/// decimal number) or as an HTTP date in any of the three forms HTTP allows
/// (IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`, the obsolete RFC 850
/// `Sunday, 06-Nov-94 08:49:37 GMT` and asctime `Sun Nov  6 08:49:37 1994`), or
/// [`DEFAULT_SNOOZE`] without one (an empty value is none). A date already past is no
/// delay here; the processor still waits its shortest snooze,
/// [`MIN_SNOOZE`](super::MIN_SNOOZE), so an endpoint answering `Retry-After: 0` is not
/// hammered. A negative, unreadable or too long (beyond [`MAX_SNOOZE`]) value is an
/// error saying why.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use chrono::TimeZone;
/// use icq::handler::http::retry_after_delay;
///
/// let now = chrono::Utc.with_ymd_and_hms(2015, 10, 21, 7, 28, 0).unwrap();
/// assert_eq!(retry_after_delay(Some("120"), now), Ok(Duration::from_secs(120)));
/// let later = Ok(Duration::from_secs(90));
/// assert_eq!(retry_after_delay(Some("Wed, 21 Oct 2015 07:29:30 GMT"), now), later);
/// assert_eq!(retry_after_delay(Some("Wednesday, 21-Oct-15 07:29:30 GMT"), now), later);
/// assert_eq!(retry_after_delay(Some("Wed Oct 21 07:29:30 2015"), now), later);
/// assert_eq!(retry_after_delay(None, now), Ok(icq::handler::DEFAULT_SNOOZE));
/// assert_eq!(retry_after_delay(Some(""), now), Ok(icq::handler::DEFAULT_SNOOZE));
/// assert!(retry_after_delay(Some("-1"), now).is_err());
/// assert!(retry_after_delay(Some("tomorrow"), now).is_err());
/// ```
pub fn retry_after_delay(
    value: Option<&str>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<std::time::Duration, String> {
    let value = value.map(str::trim).unwrap_or_default();
    if value.is_empty() {
        return Ok(DEFAULT_SNOOZE);
    }
    let looks_numeric = value
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.'));
    if looks_numeric {
        return super::checked_snooze_seconds(value);
    }
    let shown = crate::redact::bounded(value, 60);
    // The three HTTP-date forms; then RFC 2822 (what `GMT` forms are a case of), for
    // senders writing a numeric zone such as `+0000`.
    let when = match httpdate::parse_http_date(value) {
        Ok(when) => chrono::DateTime::<chrono::Utc>::from(when),
        Err(_) => chrono::DateTime::parse_from_rfc2822(value)
            .map_err(|_| format!("`{shown}` is neither a number of seconds nor an HTTP date"))?
            .with_timezone(&chrono::Utc),
    };
    let delay = (when - now).to_std().unwrap_or_default();
    if delay > MAX_SNOOZE {
        return Err(format!(
            "`{shown}` is more than {} s (30 days) away",
            MAX_SNOOZE.as_secs()
        ));
    }
    Ok(delay)
}

/// At most `limit` bytes from the start of `response`'s body, read chunk by chunk; the
/// rest is never read (the response is dropped, which closes the connection), so a
/// gigabyte error page costs one network chunk of memory, not a gigabyte. A body that
/// fails midway keeps what arrived.
async fn read_prefix(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut kept = Vec::with_capacity(limit.min(8 * 1024));
    while kept.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - kept.len();
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    kept
}

fn redacted(url: &reqwest::Url) -> String {
    crate::redact::redact_url(url.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{CommandId, Context};
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn job() -> Job {
        Job {
            id: CommandId::new(),
            type_name: "t".into(),
            payload: serde_json::json!({"k": "v"}),
            attempt: 1,
            source: Arc::from("s"),
            context: Context::default(),
            cancellation: Default::default(),
        }
    }

    /// A one-response-fits-all HTTP server on 127.0.0.1: answers every request with
    /// `status` and `headers`, and records each request's head.
    struct Server {
        addr: SocketAddr,
        requests: Arc<Mutex<Vec<String>>>,
    }

    impl Server {
        async fn start(status: &'static str, headers: Vec<String>, body: &'static str) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let seen = requests.clone();
            tokio::spawn(async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    let seen = seen.clone();
                    let headers = headers.clone();
                    tokio::spawn(async move {
                        let mut head = Vec::new();
                        let mut byte = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            match stream.read(&mut byte).await {
                                Ok(1) => head.push(byte[0]),
                                _ => return,
                            }
                        }
                        let head = String::from_utf8_lossy(&head).into_owned();
                        let length = head
                            .lines()
                            .find_map(|l| {
                                let (name, value) = l.split_once(':')?;
                                name.eq_ignore_ascii_case("content-length")
                                    .then(|| value.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        let mut payload = vec![0u8; length];
                        let _ = stream.read_exact(&mut payload).await;
                        seen.lock().unwrap().push(head);
                        let mut response = format!(
                            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n",
                            body.len()
                        );
                        for header in headers {
                            response.push_str(&header);
                            response.push_str("\r\n");
                        }
                        response.push_str("\r\n");
                        response.push_str(body);
                        let _ = stream.write_all(response.as_bytes()).await;
                        let _ = stream.shutdown().await;
                    });
                }
            });
            Server { addr, requests }
        }

        fn url(&self, path: &str) -> String {
            format!("http://{}{path}", self.addr)
        }

        fn count(&self) -> usize {
            self.requests.lock().unwrap().len()
        }
    }

    fn handler(url: &str, headers: &[(&str, &str)]) -> HttpHandler {
        let headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HttpHandler::new(url, &headers, Some(Duration::from_secs(5))).unwrap()
    }

    #[tokio::test]
    async fn http_redirects_are_never_followed_and_fail_the_attempt() {
        // Where a redirect points: must never receive anything.
        let elsewhere = Server::start("200 OK", vec![], "").await;
        for (status, code) in [
            ("301 Moved Permanently", 301),
            ("302 Found", 302),
            ("303 See Other", 303),
            ("307 Temporary Redirect", 307),
            ("308 Permanent Redirect", 308),
        ] {
            let target = elsewhere.url("/stolen?token=t0p-s3cret&n=1");
            let server = Server::start(status, vec![format!("location: {target}")], "moved").await;
            let handler = handler(&server.url("/hooks"), &[("X-Api-Key", "k3y")]);
            let err = handler.handle(job()).await.unwrap_err();
            assert_eq!(
                err.message,
                format!(
                    "HTTP {code} redirect to http://{}/stolen?token=***&n=1 not followed: icq \
                     POSTs only to the configured URL",
                    elsewhere.addr
                )
            );
            assert!(!err.terminal, "retried: the endpoint may be fixed");
            assert_eq!(server.count(), 1, "{code}: one POST, to the configured URL");
        }
        // Same origin, relative location: not followed either.
        let server = Server::start(
            "307 Temporary Redirect",
            vec!["location: /v2/hooks".into()],
            "",
        )
        .await;
        let err = handler(&server.url("/hooks"), &[])
            .handle(job())
            .await
            .unwrap_err();
        assert_eq!(
            err.message,
            format!(
                "HTTP 307 redirect to {} not followed: icq POSTs only to the configured URL",
                server.url("/v2/hooks")
            )
        );
        assert_eq!(server.count(), 1);
        // A redirect without a Location.
        let server = Server::start("302 Found", vec![], "").await;
        let err = handler(&server.url("/"), &[])
            .handle(job())
            .await
            .unwrap_err();
        assert!(
            err.message
                .starts_with("HTTP 302 redirect (no Location header) not followed"),
            "{}",
            err.message
        );

        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            elsewhere.count(),
            0,
            "the redirect target received a request"
        );
    }

    #[tokio::test]
    async fn defect_10_http_sends_every_x_icq_header_empty_when_absent() {
        let server = Server::start("204 No Content", vec![], "").await;
        let mut with_newline = job();
        with_newline.context.tenant_id = Some("a\r\nX-Forged: 1".into());
        for sent in [job(), with_newline] {
            assert_eq!(handler(&server.url("/h"), &[]).handle(sent).await, Ok(()));
        }
        let requests = server.requests.lock().unwrap().clone();
        for head in &requests {
            let head = head.to_ascii_lowercase();
            for empty in ["x-icq-user-id", "x-icq-tenant-id", "x-icq-correlation-id"] {
                let line = format!("\r\n{empty}: \r\n");
                assert!(head.contains(&line), "{empty} sent empty: {head}");
            }
            assert!(head.contains("x-icq-roles: []"), "{head}");
            assert!(head.contains("x-icq-attempt: 1"), "{head}");
            assert!(!head.contains("x-forged"), "{head}");
        }
    }

    #[tokio::test]
    async fn http_success_and_failure_bodies() {
        let ok = Server::start("204 No Content", vec![], "").await;
        assert_eq!(handler(&ok.url("/h"), &[]).handle(job()).await, Ok(()));
        let head = ok.requests.lock().unwrap()[0].clone();
        assert!(head.starts_with("POST /h HTTP/1.1"), "{head}");
        assert!(
            head.to_ascii_lowercase().contains("x-icq-command-type: t"),
            "{head}"
        );

        let down = Server::start(
            "500 Internal Server Error",
            vec![],
            "database down\r\nretry later\x1b[2J",
        )
        .await;
        assert_eq!(
            handler(&down.url("/h"), &[])
                .handle(job())
                .await
                .unwrap_err()
                .message,
            "HTTP 500 Internal Server Error: database down\nretry later\\u{1b}[2J"
        );
    }

    #[tokio::test]
    async fn http_429_and_503_snooze_after_retry_after() {
        let busy = Server::start("429 Too Many Requests", vec!["Retry-After: 1".into()], "").await;
        let err = handler(&busy.url("/h"), &[])
            .handle(job())
            .await
            .unwrap_err();
        assert_eq!(
            err.snooze,
            Some(std::time::Duration::from_secs(1)),
            "{err:?}"
        );
        let down = Server::start("503 Service Unavailable", vec![], "").await;
        let err = handler(&down.url("/h"), &[])
            .handle(job())
            .await
            .unwrap_err();
        assert_eq!(err.snooze, Some(DEFAULT_SNOOZE), "{err:?}");
        let bad = Server::start("429 Too Many Requests", vec!["Retry-After: -3".into()], "").await;
        let err = handler(&bad.url("/h"), &[])
            .handle(job())
            .await
            .unwrap_err();
        assert_eq!(err.snooze, None);
        assert!(
            err.message.contains("unusable Retry-After") && err.message.contains("negative"),
            "{}",
            err.message
        );
        let huge = Server::start(
            "503 Service Unavailable",
            vec!["Retry-After: 99999999999".into()],
            "",
        )
        .await;
        let err = handler(&huge.url("/h"), &[])
            .handle(job())
            .await
            .unwrap_err();
        assert!(
            err.snooze.is_none() && err.message.contains("longer than"),
            "{}",
            err.message
        );
    }

    #[test]
    fn retry_after_reads_every_http_date_form() {
        use chrono::TimeZone;
        let now = chrono::Utc
            .with_ymd_and_hms(1994, 11, 6, 8, 48, 37)
            .unwrap();
        let minute = Ok(Duration::from_secs(60));
        for date in [
            "Sun, 06 Nov 1994 08:49:37 GMT",  // IMF-fixdate
            "Sunday, 06-Nov-94 08:49:37 GMT", // obsolete RFC 850
            "Sun Nov  6 08:49:37 1994",       // asctime
            "  Sun, 06 Nov 1994 08:49:37 GMT ",
            "Sun, 06 Nov 1994 08:49:37 +0000", // RFC 2822 with a numeric zone
        ] {
            assert_eq!(retry_after_delay(Some(date), now), minute, "{date:?}");
        }
        // Past dates are no delay here (the processor's floor applies); every form.
        for past in [
            "Sun, 06 Nov 1994 08:47:37 GMT",
            "Sunday, 06-Nov-94 08:47:37 GMT",
            "Sun Nov  6 08:47:37 1994",
        ] {
            assert_eq!(
                retry_after_delay(Some(past), now),
                Ok(Duration::ZERO),
                "{past:?}"
            );
        }
        // Absent, empty or blank: the default snooze, not a failed attempt.
        for none in [None, Some(""), Some("   ")] {
            assert_eq!(retry_after_delay(none, now), Ok(DEFAULT_SNOOZE), "{none:?}");
        }
        assert_eq!(retry_after_delay(Some("0"), now), Ok(Duration::ZERO));
        assert_eq!(
            retry_after_delay(Some("1.5"), now),
            Ok(Duration::from_millis(1500))
        );
        for bad in ["soon", "Sun, 06 Nov 1994", "Sun, 32 Nov 1994 08:49:37 GMT"] {
            let why = retry_after_delay(Some(bad), now).unwrap_err();
            assert!(
                why.contains("neither a number of seconds nor an HTTP date"),
                "{why}"
            );
        }
        let why = retry_after_delay(Some("-1"), now).unwrap_err();
        assert!(why.contains("negative"), "{why}");
        let why = retry_after_delay(Some("Sat, 06 Nov 2094 08:49:37 GMT"), now).unwrap_err();
        assert!(why.contains("30 days"), "{why}");
    }

    #[tokio::test]
    async fn http_retry_after_dates_and_empty_values_snooze() {
        let soon = chrono::Utc::now() + chrono::Duration::seconds(120);
        for (form, date) in [
            (
                "IMF-fixdate",
                soon.format("%a, %d %b %Y %H:%M:%S GMT").to_string(),
            ),
            (
                "RFC 850",
                soon.format("%A, %d-%b-%y %H:%M:%S GMT").to_string(),
            ),
            ("asctime", soon.format("%a %b %e %H:%M:%S %Y").to_string()),
        ] {
            let busy = Server::start(
                "503 Service Unavailable",
                vec![format!("Retry-After: {date}")],
                "",
            )
            .await;
            let err = handler(&busy.url("/h"), &[])
                .handle(job())
                .await
                .unwrap_err();
            let delay = err.snooze.unwrap_or_else(|| panic!("{form}: {err:?}"));
            assert!(
                (Duration::from_secs(100)..=Duration::from_secs(121)).contains(&delay),
                "{form} {date}: {delay:?}"
            );
        }
        let empty = Server::start("429 Too Many Requests", vec!["Retry-After:".into()], "").await;
        let err = handler(&empty.url("/h"), &[])
            .handle(job())
            .await
            .unwrap_err();
        assert_eq!(err.snooze, Some(DEFAULT_SNOOZE), "{err:?}");
    }

    /// Answers one request with `status` and an endless chunked body; the task ends,
    /// with the number of body bytes written, once the client hangs up.
    async fn endless(status: &'static str) -> (String, tokio::task::JoinHandle<u64>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/h", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = format!("HTTP/1.1 {status}\r\ntransfer-encoding: chunked\r\n\r\n");
            let _ = stream.write_all(head.as_bytes()).await;
            let chunk = [b"10000\r\n".as_slice(), &[b'x'; 0x10000], b"\r\n"].concat();
            let mut sent = 0u64;
            while stream.write_all(&chunk).await.is_ok() {
                sent += 0x10000;
            }
            sent
        });
        (url, task)
    }

    #[tokio::test]
    async fn endless_bodies_are_never_read_past_the_excerpt() {
        for status in ["200 OK", "500 Internal Server Error", "404 Not Found"] {
            let (url, server) = endless(status).await;
            let outcome = handler(&url, &[]).handle(job()).await;
            match status {
                "200 OK" => assert_eq!(outcome, Ok(())),
                _ => {
                    let message = outcome.unwrap_err().message;
                    assert!(
                        message.starts_with(&format!("HTTP {status}: xxx")),
                        "{message}"
                    );
                    assert!(message.ends_with("x…"), "{message}");
                }
            }
            // The handler hung up: the endless body stops within a few MB of socket
            // buffers.
            let sent = tokio::time::timeout(Duration::from_secs(10), server)
                .await
                .expect("the connection was dropped")
                .unwrap();
            assert!(sent < 64 * 1024 * 1024, "{status}: {sent} bytes were read");
        }
    }

    #[tokio::test]
    async fn http_url_secrets_never_reach_last_error_or_debug() {
        // Nothing listens on this port (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url =
            format!("http://user:pa55word@127.0.0.1:{port}/hooks?token=t0p-s3cret&api_key=k3y&n=1");
        let handler = handler(&url, &[("Authorization", "Bearer b3arer")]);
        let err = handler.handle(job()).await.unwrap_err();
        for secret in ["pa55word", "t0p-s3cret", "k3y"] {
            assert!(!err.message.contains(secret), "{secret} in {}", err.message);
        }
        assert!(
            err.message.starts_with(&format!(
                "POST http://user:***@127.0.0.1:{port}/hooks?token=***&api_key=***&n=1 failed: "
            )),
            "{}",
            err.message
        );
        let debug = format!("{handler:?}");
        for secret in ["pa55word", "t0p-s3cret", "k3y", "b3arer"] {
            assert!(!debug.contains(secret), "{secret} in {debug}");
        }
        let err = HttpHandler::new("ftp://u:pw@h/x?token=abc", &BTreeMap::new(), None).unwrap_err();
        assert!(
            !err.to_string().contains("abc") && !err.to_string().contains(":pw@"),
            "{err}"
        );
    }
}
