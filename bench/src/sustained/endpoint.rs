//! The handler every replica calls (icq's `http` handler) and the ledger it keeps: for
//! each command the harness scheduled (numbered `n` in its payload), when its INSERT
//! committed, when a handler first started it, and how many times it ran.
//!
//! One clock: every instant is microseconds since the run's start on the harness's
//! monotonic clock, both the scheduling instant (the producer's INSERT returned) and the
//! handler start (the request reached this endpoint), so pickup latency never mixes the
//! database's clock with the harness's.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// Not yet known (scheduled but not committed, or never started).
pub const UNKNOWN: u64 = u64::MAX;

/// What the endpoint and the producer record, shared by both.
pub struct Ledger {
    pub start: Instant,
    inner: Mutex<Entries>,
}

#[derive(Default)]
pub struct Entries {
    /// Per `n`: microseconds at which the INSERT that wrote it returned.
    pub scheduled_at: Vec<u64>,
    /// Per `n`: microseconds at which its first execution started.
    pub first_start: Vec<u64>,
    /// Per `n`: executions seen.
    pub runs: Vec<u32>,
    /// First executions in arrival order: (start microseconds, n).
    pub firsts: Vec<(u64, u32)>,
    /// Requests whose body carried no `n` (not the harness's commands).
    pub foreign: u64,
}

impl Ledger {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            inner: Mutex::new(Entries::default()),
        })
    }

    /// Microseconds since the run's start.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    pub fn lock(&self) -> MutexGuard<'_, Entries> {
        // A panic while holding the lock leaves plain counters behind: still usable.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The producer's INSERT of `first .. first + count` returned at `at`.
    pub fn scheduled(&self, first: u64, count: u64, at: u64) {
        let mut e = self.lock();
        let end = (first + count) as usize;
        e.grow(end);
        for n in first as usize..end {
            e.scheduled_at[n] = at;
        }
    }

    fn executed(&self, n: u64, at: u64) {
        let mut e = self.lock();
        let i = n as usize;
        e.grow(i + 1);
        e.runs[i] = e.runs[i].saturating_add(1);
        if e.first_start[i] == UNKNOWN {
            e.first_start[i] = at;
            e.firsts.push((at, n as u32));
        }
    }
}

impl Entries {
    fn grow(&mut self, len: usize) {
        if self.runs.len() < len {
            self.scheduled_at.resize(len, UNKNOWN);
            self.first_start.resize(len, UNKNOWN);
            self.runs.resize(len, 0);
        }
    }

    /// Pickup latency of a first execution in milliseconds: its start minus the instant
    /// its INSERT returned (0 when the handler started before the harness saw the commit).
    pub fn pickup_ms(&self, start: u64, n: u32) -> Option<f64> {
        let scheduled = *self.scheduled_at.get(n as usize)?;
        (scheduled != UNKNOWN).then(|| start.saturating_sub(scheduled) as f64 / 1000.0)
    }
}

/// Serves on a free loopback port until the process exits; every request is recorded
/// (its JSON body's `n`) and answered `204 No Content` after `work`.
pub async fn serve(ledger: Arc<Ledger>, work: Duration) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("binding the sustained handler endpoint")?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let ledger = ledger.clone();
                    async move {
                        let at = ledger.now();
                        let body = request
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        match command_number(&body) {
                            Some(n) => ledger.executed(n, at),
                            None => ledger.lock().foreign += 1,
                        }
                        if !work.is_zero() {
                            tokio::time::sleep(work).await;
                        }
                        let mut response = Response::new(Empty::<Bytes>::new());
                        *response.status_mut() = StatusCode::NO_CONTENT;
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(format!("http://{addr}/"))
}

/// The `n` of a payload `{"n": 123}`.
fn command_number(body: &[u8]) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("n")?
        .as_u64()
}
