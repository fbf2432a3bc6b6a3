//! `icq console`: the operations console in the browser, served by the binary.
//!
//! Server-rendered HTML over axum (no build step, no client framework): an overview of
//! every source (the counts of `icq pending`, per queue and per type, and throughput and
//! backlog charts), lists by state with type and queue filters and keyset paging, one
//! command in full (queue, priority, unique key, trace parent and snoozes included; a
//! large payload cut, with a download), dead letters, and — only when started with
//! `--allow-actions` and a token — requeue, replay, cancel and purge (each acting on
//! exactly the filter of the page that offers it), each behind a confirmation page. A
//! queue filter on a schema-version-1 table is the admin API's usage error, shown as the
//! page's banner.
//!
//! Counts ([`snapshot`]) are taken once for every page and tab, one statement per
//! source, and only while someone watches: an idle console runs no query.
//!
//! Every figure comes from the library's operator API ([`icq::admin`]), the same calls
//! the CLI's operator subcommands make. The console opens each source on its own and
//! keeps going when one is down: the page shows an error banner and the next request
//! tries again.
//!
//! Security ([`guard`]): loopback by default, a token (of at least [`MIN_TOKEN_BYTES`])
//! required for any other address and for actions, wrong tokens slowed, requests from
//! other sites refused whatever their method, POST + same-origin + token for every
//! change, escaping by construction ([`html`]), strict response headers, and no URL shown
//! anywhere (errors are redacted). Resources are bounded ([`accept`]): connections at
//! once, time to send headers, and the memory a large payload can take.

mod actions;
mod guard;
mod history;
mod html;
mod pages;
mod snapshot;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::Utc;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::cli::config::{Config, SourceConfig};
use crate::cli::error::{CliError, Result};
use icq::Queue;
use icq::error::Error;

use snapshot::{SAMPLE_EVERY, Snapshot, Watch};

/// The shortest token the console accepts, in bytes.
pub const MIN_TOKEN_BYTES: usize = 16;

/// At most this many connections are served at once; more wait in the listen queue.
pub const MAX_CONNECTIONS: usize = 256;

/// A client has this long to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// At most this many commands are read whole at once (for a page, or for a download
/// until its payload is encoded): a big payload is held in memory several times over
/// while it is decoded and encoded.
const LARGE_READS: usize = 1;

/// At most this many payload downloads are in progress at once (a download holds its
/// payload until the client has read it all).
const DOWNLOADS: usize = 1;

/// How long a download waits for its turn before it is refused.
const DOWNLOAD_WAIT: Duration = Duration::from_secs(30);

/// How `icq console` was started.
#[derive(Debug, Clone)]
pub struct ConsoleOptions {
    /// Where to listen (`--addr`).
    pub addr: SocketAddr,
    /// `--allow-actions`: requeue, replay, cancel and purge (needs the token).
    pub allow_actions: bool,
    /// `ICQ_CONSOLE_TOKEN`.
    pub token: Option<String>,
    /// Where the URL of a source made without a configuration file came from
    /// (`--database-url` or `$DATABASE_URL`): the console labels that source with it, so
    /// its name (`default`) is not taken for a queue's.
    pub url_origin: Option<&'static str>,
}

impl ConsoleOptions {
    /// Refuses what would expose the console or allow actions without a token: a
    /// non-loopback `--addr` or `--allow-actions` without `ICQ_CONSOLE_TOKEN` is a usage
    /// error (exit 2).
    pub fn validate(&self) -> Result<()> {
        let token = self.token.as_deref().filter(|t| !t.trim().is_empty());
        if let Some(token) = token
            && token.len() < MIN_TOKEN_BYTES
        {
            return Err(CliError::Usage(format!(
                "ICQ_CONSOLE_TOKEN is {} bytes long; the console needs at least {MIN_TOKEN_BYTES} \
                 (a short token is guessed in seconds): make one with `openssl rand -hex 16` \
                 and put it in ICQ_CONSOLE_TOKEN",
                token.len()
            )));
        }
        if !self.addr.ip().is_loopback() && token.is_none() {
            return Err(Error::Refused(format!(
                "refusing to serve the console on {} (not a loopback address) without a token: \
                 set ICQ_CONSOLE_TOKEN to a long random secret, or bind 127.0.0.1",
                self.addr
            ))
            .into());
        }
        if self.allow_actions && token.is_none() {
            return Err(CliError::Usage(
                "--allow-actions needs a token: set ICQ_CONSOLE_TOKEN to a long random secret \
                 (the console asks for it before every requeue, replay, cancel or purge)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The console's shared state.
#[derive(Clone)]
pub(crate) struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    slots: Vec<Slot>,
    /// The source made from a URL rather than read from a configuration file, and where
    /// its URL came from.
    url_source: Option<(String, &'static str)>,
    allow_actions: bool,
    token: Option<String>,
    sign_in_required: bool,
    /// The `Host` values a loopback console answers to (empty: any, behind the sign-in).
    hosts: Vec<String>,
    history: std::sync::Mutex<history::History>,
    watch: Watch,
    throttle: guard::Throttle,
    large_reads: Arc<tokio::sync::Semaphore>,
    downloads: Arc<tokio::sync::Semaphore>,
}

/// One configured source, opened on first use and again after a failed open.
struct Slot {
    config: SourceConfig,
    open: Mutex<Option<Queue>>,
}

/// The sources that could be opened, and the errors of those that could not.
pub(crate) struct Opened {
    pub sources: Vec<Queue>,
    pub errors: Vec<String>,
}

impl Console {
    /// Opens (or reuses) every source; a source that cannot be opened is an error line.
    pub(crate) async fn opened(&self) -> Opened {
        let results = futures::future::join_all(self.inner.slots.iter().map(|slot| async move {
            let mut open = slot.open.lock().await;
            if let Some(source) = open.as_ref() {
                return Ok(source.clone());
            }
            match crate::cli::sources::open_one(&slot.config)
                .await
                .map(|source| source.queue)
            {
                Ok(source) => {
                    *open = Some(source.clone());
                    Ok(source)
                }
                Err(err) => Err(describe(&err)),
            }
        }))
        .await;
        let mut opened = Opened {
            sources: Vec::new(),
            errors: Vec::new(),
        };
        for result in results {
            match result {
                Ok(source) => opened.sources.push(source),
                Err(message) => opened.errors.push(message),
            }
        }
        opened
    }

    /// Every open source's schedules with their last and next occurrence (the rows of
    /// `icq schedules`), and the errors of sources that could not be read.
    pub(crate) async fn schedules(&self) -> (Vec<icq::admin::ScheduleRow>, Vec<String>) {
        let opened = self.opened().await;
        let mut errors = opened.errors;
        let listed = futures::future::join_all(opened.sources.iter().map(|queue| async move {
            let configured = self
                .inner
                .slots
                .iter()
                .find(|slot| slot.config.name == queue.name())
                .map(|slot| slot.config.settings.schedules.as_slice())
                .unwrap_or_default();
            icq::admin::schedules(queue, configured).await
        }))
        .await;
        let mut rows = Vec::new();
        for result in listed {
            match result {
                Ok(mut listed) => rows.append(&mut listed),
                Err(err) => errors.push(describe(&err.into())),
            }
        }
        (rows, errors)
    }

    /// How the console names a source: a source made from a URL (not from a
    /// configuration file) is labelled with where its URL came from, as
    /// `default (--database-url)`, so it is not taken for the queue of that name.
    pub(crate) fn label(&self, name: &str) -> String {
        match &self.inner.url_source {
            Some((source, origin)) if source == name => format!("{name} ({origin})"),
            _ => name.to_owned(),
        }
    }

    /// The configured source names, in configuration order.
    pub(crate) fn source_names(&self) -> Vec<String> {
        self.inner
            .slots
            .iter()
            .map(|s| s.config.name.clone())
            .collect()
    }

    pub(crate) fn actions_allowed(&self) -> bool {
        self.inner.allow_actions && self.inner.token.is_some()
    }

    /// Takes one sample of every open source (one statement each, by queue and type),
    /// publishes it for the pages and records it for the charts.
    async fn sample(&self) {
        let opened = self.opened().await;
        let mut errors = opened.errors;
        let request = icq::admin::PendingRequest {
            by_queue: true,
            by_type: true,
            ..icq::admin::PendingRequest::default()
        };
        let counted = futures::future::join_all(opened.sources.iter().map(|source| {
            let request = &request;
            async move {
                icq::admin::pending_with(std::slice::from_ref(source), request)
                    .await
                    .map(|report| (source.name().to_owned(), report))
            }
        }))
        .await;
        let mut rows = Vec::new();
        let mut sources = Vec::new();
        for result in counted {
            match result {
                Ok((name, report)) => {
                    sources.push(name);
                    rows.extend(report.rows);
                }
                Err(err) => errors.push(describe(&err.into())),
            }
        }
        let snapshot = Snapshot {
            at: Utc::now(),
            taken: std::time::Instant::now(),
            rows,
            sources,
            errors,
        };
        let figures: BTreeMap<String, history::Figures> = snapshot
            .totals()
            .rows
            .iter()
            .map(|row| {
                (
                    row.source.clone(),
                    history::Figures {
                        completed: row.counts.completed,
                        backlog: row.counts.due + row.counts.scheduled,
                    },
                )
            })
            .collect();
        if let Ok(mut history) = self.inner.history.lock() {
            history.record(snapshot.at, figures);
        }
        self.inner.watch.publish(snapshot);
    }

    /// The counts for a page, no older than `fresh` (see [`Watch::snapshot`]).
    pub(crate) async fn snapshot(&self, fresh: Duration) -> Option<Arc<Snapshot>> {
        self.inner.watch.snapshot(fresh).await
    }

    /// Rows changed: the next page counts again.
    pub(crate) fn counts_changed(&self) {
        self.inner.watch.invalidate();
    }

    /// A permit for one large read (see [`LARGE_READS`]).
    pub(crate) async fn large_read(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.inner.large_reads.clone().acquire_owned().await.ok()
    }

    /// A permit for one payload download (see [`DOWNLOADS`]); `None` after
    /// [`DOWNLOAD_WAIT`].
    pub(crate) async fn download(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        tokio::time::timeout(DOWNLOAD_WAIT, self.inner.downloads.clone().acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// Samples while someone watches, and not at all otherwise. A count that takes long
    /// (a big table) spaces the samples out: the sampler counts at most a tenth of the
    /// time.
    async fn run_sampler(&self, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.inner.watch.until_watched() => {}
            }
            let started = std::time::Instant::now();
            self.sample().await;
            let pause = SAMPLE_EVERY.max(started.elapsed() * 10);
            if let Ok(mut history) = self.inner.history.lock() {
                history.set_spacing(pause);
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
                () = self.inner.watch.until_needed() => {}
            }
        }
    }

    async fn close(&self) {
        for slot in &self.inner.slots {
            if let Some(source) = slot.open.lock().await.take() {
                icq::admin::close(std::slice::from_ref(&source)).await;
            }
        }
    }
}

/// An error for a page: its message with any secret masked.
pub(crate) fn describe(err: &CliError) -> String {
    icq::redact::redact_text(&err.to_string())
}

/// Serves the console for the selected sources of `config` until `shutdown` is
/// cancelled; `ready` is told the bound address (with `--addr …:0`, the port chosen).
///
/// Sources are opened on first use, not here: a database that is down when the console
/// starts shows as an error banner, and the console connects once it is back.
pub async fn serve(
    config: &Config,
    source: Option<&str>,
    options: ConsoleOptions,
    shutdown: CancellationToken,
    ready: impl FnOnce(SocketAddr),
) -> Result<()> {
    options.validate()?;
    let url_source = match (&config.path, config.sources.as_slice()) {
        (None, [one]) if !one.embedded => Some((
            one.name.clone(),
            options.url_origin.unwrap_or("database URL"),
        )),
        _ => None,
    };
    let slots = config
        .select(source)?
        .into_iter()
        .map(|config| Slot {
            config: config.clone(),
            open: Mutex::new(None),
        })
        .collect();
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(Error::io(format!(
            "cannot listen on {} (is another console running? pick another --addr)",
            options.addr
        )))?;
    let local = listener.local_addr().map_err(|cause| Error::Io {
        context: format!("cannot read the address bound for {}", options.addr),
        cause,
    })?;
    let loopback = local.ip().is_loopback();
    let hosts = if loopback {
        let port = local.port();
        let mut hosts = vec![
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ];
        if port == 80 {
            hosts.extend(["127.0.0.1", "localhost", "[::1]"].map(String::from));
        }
        hosts.push(local.to_string());
        hosts
    } else {
        Vec::new()
    };
    let console = Console {
        inner: Arc::new(Inner {
            url_source,
            slots,
            allow_actions: options.allow_actions,
            token: options.token.filter(|t| !t.trim().is_empty()),
            sign_in_required: !loopback,
            hosts,
            history: std::sync::Mutex::new(history::History::default()),
            watch: Watch::default(),
            throttle: guard::Throttle::default(),
            large_reads: Arc::new(tokio::sync::Semaphore::new(LARGE_READS)),
            downloads: Arc::new(tokio::sync::Semaphore::new(DOWNLOADS)),
        }),
    };

    let sampler = {
        let console = console.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move { console.run_sampler(stop).await })
    };

    let app = router(console.clone());
    ready(local);
    let served = accept(listener, app, shutdown.clone()).await;
    shutdown.cancel();
    let _ = sampler.await;
    console.close().await;
    served
}

/// Serves connections until `shutdown`: at most [`MAX_CONNECTIONS`] at once (the rest
/// wait in the kernel's listen queue, costing the console nothing), each with
/// [`HEADER_READ_TIMEOUT`] to send its headers. On shutdown, connections finish the
/// request in flight and close.
async fn accept(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: CancellationToken,
) -> Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            () = shutdown.cancelled() => break,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::debug!(error = %err, "console: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let app = app.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(
                move |mut request: axum::http::Request<hyper::body::Incoming>| {
                    request
                        .extensions_mut()
                        .insert(axum::extract::ConnectInfo(peer));
                    let service = hyper_util::service::TowerToHyperService::new(app.clone());
                    async move {
                        use hyper::service::Service as _;
                        service.call(request).await
                    }
                },
            );
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
                }
            }
        });
    }
    // Wait (briefly) for the connections still open to finish their request.
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        slots.acquire_many(MAX_CONNECTIONS as u32),
    )
    .await;
    Ok(())
}

fn router(console: Console) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/live", get(pages::live))
        .route("/list", get(pages::list))
        .route("/command", get(pages::command))
        .route("/command/payload", get(pages::payload))
        .route("/dead-letters", get(pages::dead_letters))
        .route("/schedules", get(pages::schedules))
        .route(
            "/actions/{action}",
            get(actions::confirm).post(actions::perform),
        )
        .route("/login", get(pages::login).post(actions::login))
        .route("/static/console.js", get(script))
        .route("/static/console.css", get(stylesheet))
        .fallback(pages::not_found)
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            guard::gate,
        ))
        .layer(axum::middleware::from_fn(guard::headers))
        .with_state(console)
}

async fn script() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("static/console.js"),
    )
        .into_response()
}

async fn stylesheet() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("static/console.css"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(addr: &str, allow_actions: bool, token: Option<&str>) -> ConsoleOptions {
        ConsoleOptions {
            addr: addr.parse().expect("an address"),
            allow_actions,
            token: token.map(String::from),
            url_origin: None,
        }
    }

    #[test]
    fn exposure_and_actions_need_a_token() {
        assert!(options("127.0.0.1:8089", false, None).validate().is_ok());
        assert!(options("[::1]:8089", false, None).validate().is_ok());
        assert!(options("0.0.0.0:8089", false, None).validate().is_err());
        assert!(
            options("0.0.0.0:8089", false, Some(" "))
                .validate()
                .is_err()
        );
        let long = "0123456789abcdef";
        assert!(
            options("0.0.0.0:8089", false, Some(long))
                .validate()
                .is_ok()
        );
        assert!(options("127.0.0.1:8089", true, None).validate().is_err());
        assert!(
            options("127.0.0.1:8089", true, Some(long))
                .validate()
                .is_ok()
        );
        // A short token is refused wherever it is given, saying how to make one.
        let short = options("127.0.0.1:8089", false, Some("a"))
            .validate()
            .unwrap_err();
        assert_eq!(short.exit_code(), 2);
        assert!(
            short.to_string().contains("openssl rand -hex 16"),
            "{short}"
        );
        assert!(
            options("127.0.0.1:8089", true, Some(&long[1..]))
                .validate()
                .is_err()
        );
        let err = options("10.0.0.1:80", false, None).validate().unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }
}
