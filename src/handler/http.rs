//! The `http` handler: POSTs the payload to a URL.
//!
//! Protocol: the payload JSON as the body (`Content-Type: application/json`); the context
//! in `X-Icq-Command-Id`, `X-Icq-Command-Type`, `X-Icq-Attempt`, `X-Icq-Source`,
//! `X-Icq-User-Id`, `X-Icq-Roles` (JSON array), `X-Icq-Tenant-Id` and
//! `X-Icq-Correlation-Id`. A 2xx status is success; any other status, a transport error
//! or the timeout fails the attempt, with the status and a bounded excerpt of the body in
//! `LastError`. Redirects are followed only within the same host.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use super::{Handler, HandlerError, HandlerResult, Job};

/// Bytes of a failed response's body kept for `LastError`.
pub const BODY_EXCERPT_BYTES: usize = 512;

/// POSTs each command to one endpoint.
#[derive(Debug, Clone)]
pub struct HttpHandler {
    client: reqwest::Client,
    url: reqwest::Url,
    headers: HeaderMap,
}

impl HttpHandler {
    /// A handler posting to `url` with the extra `headers`, failing an attempt after
    /// `timeout` (default 30 s).
    pub fn new(
        url: &str,
        headers: &BTreeMap<String, String>,
        timeout: Option<Duration>,
    ) -> crate::Result<HttpHandler> {
        let url = reqwest::Url::parse(url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| crate::Error::Usage(format!("`{url}` is not an http(s) URL")))?;
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| crate::Error::Usage(format!("`{name}` is not a valid header name")))?;
            let value = HeaderValue::from_str(value).map_err(|_| {
                crate::Error::Usage(format!("the value of header `{name}` is not valid"))
            })?;
            map.insert(name, value);
        }
        let same_host = reqwest::redirect::Policy::custom(|attempt| {
            let first = attempt
                .previous()
                .first()
                .and_then(|u| u.host_str().map(str::to_owned));
            if attempt.previous().len() > 5 || attempt.url().host_str() != first.as_deref() {
                attempt.stop()
            } else {
                attempt.follow()
            }
        });
        let client = reqwest::Client::builder()
            .redirect(same_host)
            .timeout(timeout.unwrap_or(Duration::from_secs(30)))
            .user_agent(concat!("icq/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| crate::Error::Usage(format!("cannot build the HTTP client: {e}")))?;
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

fn excerpt(body: &[u8]) -> String {
    let cut = &body[..body.len().min(BODY_EXCERPT_BYTES)];
    let text = String::from_utf8_lossy(cut);
    let text = text.trim();
    if body.len() > BODY_EXCERPT_BYTES {
        format!("{text}…")
    } else {
        text.to_owned()
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
            if let Some(v) = text.as_deref().and_then(value) {
                headers.insert(HeaderName::from_static(name), v);
            }
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
                let mut message = format!("POST {} {what}: {err}", redacted(&self.url));
                let mut source = std::error::Error::source(&err);
                while let Some(cause) = source {
                    message.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                HandlerError::retry(message)
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(str::to_owned);
        let body = response.bytes().await.unwrap_or_default();
        let mut message = format!("HTTP {status}");
        if let Some(location) = location.filter(|_| status.is_redirection()) {
            message.push_str(&format!(
                " (redirect to {location} not followed: another host)"
            ));
        }
        let body = excerpt(&body);
        if !body.is_empty() {
            message.push_str(": ");
            message.push_str(&body);
        }
        Err(HandlerError::retry(message))
    }
}

fn redacted(url: &reqwest::Url) -> String {
    crate::redact::redact_url(url.as_str())
}
