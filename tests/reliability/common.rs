//! Helpers shared by the reliability tests: plain SQL against the private databases, the
//! `icq` binary driven as a process, and a counting HTTP endpoint for `http` handlers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngExt;
use sqlx::Connection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::TestDb;

/// Tests that start several worker processes take this lock, so two of them never share
/// the two CPUs of a CI machine (their timing would become each other's noise).
pub static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The `icq` binary cargo built for this test run.
pub fn icq_bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("icq")
}

/// The quoted commands table.
pub fn table(db: &TestDb) -> String {
    db.q("InternalCommands")
}

/// A string literal for `db`'s SQL dialect (MySQL also treats backslashes as escapes).
pub fn lit(db: &TestDb, text: &str) -> String {
    let mut escaped = text.replace('\'', "''");
    if db.engine == "mysql" {
        escaped = escaped.replace('\\', "\\\\");
    }
    format!("'{escaped}'")
}

/// The engine's "now" in the column type of the commands table.
pub fn now_sql(db: &TestDb) -> &'static str {
    match db.engine {
        "postgres" => "now()",
        "mysql" => "UTC_TIMESTAMP(6)",
        _ => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    }
}

/// The `Id` column as text (PostgreSQL stores a uuid).
pub fn id_text(db: &TestDb) -> String {
    if db.engine == "postgres" {
        format!("{}::text", db.q("Id"))
    } else {
        db.q("Id")
    }
}

/// `INSERT INTO <table> (<cols>) VALUES (<exprs>)` with quoted column names.
pub fn insert_sql(db: &TestDb, columns: &[(&str, String)]) -> String {
    let names: Vec<String> = columns.iter().map(|(c, _)| db.q(c)).collect();
    let values: Vec<&str> = columns.iter().map(|(_, v)| v.as_str()).collect();
    format!(
        "INSERT INTO {} ({}) VALUES ({})",
        table(db),
        names.join(", "),
        values.join(", ")
    )
}

/// Runs `sql`, returning the server's error instead of panicking.
pub async fn try_execute(db: &TestDb, sql: &str) -> Result<(), String> {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    let result = match db.engine {
        "postgres" => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.expect("connect");
            sqlx::raw_sql(sql).execute(&mut c).await.map(|_| ())
        }
        "mysql" => {
            let mut c = sqlx::MySqlConnection::connect(&db.url)
                .await
                .expect("connect");
            sqlx::raw_sql(sql).execute(&mut c).await.map(|_| ())
        }
        _ => {
            let mut c = sqlx::SqliteConnection::connect(&db.url)
                .await
                .expect("connect");
            sqlx::raw_sql(sql).execute(&mut c).await.map(|_| ())
        }
    };
    result.map_err(|e| e.to_string())
}

/// The first column of every row `sql` returns, as optional text.
pub async fn texts(db: &TestDb, sql: &str) -> Vec<Option<String>> {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    match db.engine {
        "postgres" => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.expect("connect");
            sqlx::query_scalar::<_, Option<String>>(sql)
                .fetch_all(&mut c)
                .await
                .expect("query")
        }
        "mysql" => {
            let mut c = sqlx::MySqlConnection::connect(&db.url)
                .await
                .expect("connect");
            sqlx::query_scalar::<_, Option<String>>(sql)
                .fetch_all(&mut c)
                .await
                .expect("query")
        }
        _ => {
            let mut c = sqlx::SqliteConnection::connect(&db.url)
                .await
                .expect("connect");
            sqlx::query_scalar::<_, Option<String>>(sql)
                .fetch_all(&mut c)
                .await
                .expect("query")
        }
    }
}

/// Every id in the table, as stored (text).
pub async fn all_ids(db: &TestDb) -> Vec<String> {
    texts(db, &format!("SELECT {} FROM {}", id_text(db), table(db)))
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// How many rows have `ProcessedAt` set (in the table's history, where completed rows go).
pub async fn completed(db: &TestDb) -> i64 {
    db.scalar_i64(&format!(
        "SELECT COUNT(*) FROM {} WHERE {} IS NOT NULL",
        db.all_rows(),
        db.q("ProcessedAt")
    ))
    .await
}

/// Polls `check` every 50 ms until it is true or `limit` passes.
pub async fn wait_until<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------
// the binary

/// One finished `icq` invocation.
#[derive(Debug)]
pub struct CliRun {
    /// The arguments, for messages.
    pub args: Vec<String>,
    /// The exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CliRun {
    /// Fails the test when the process panicked (exit 101, a Rust panic message) or was
    /// killed by a signal, or when it failed without saying why on stderr.
    pub fn assert_no_panic(&self) -> &Self {
        assert!(
            self.code.is_some(),
            "`icq {}` was killed by a signal\nstderr: {}",
            self.args.join(" "),
            self.stderr
        );
        assert_ne!(
            self.code,
            Some(101),
            "`icq {}` panicked (exit 101)\nstderr: {}",
            self.args.join(" "),
            self.stderr
        );
        assert!(
            !self.stderr.contains("panicked at"),
            "`icq {}` printed a panic\nstderr: {}",
            self.args.join(" "),
            self.stderr
        );
        if self.code != Some(0) {
            assert!(
                matches!(self.code, Some(1..=3)),
                "`icq {}` exited {:?}: not one of the documented codes\nstderr: {}",
                self.args.join(" "),
                self.code,
                self.stderr
            );
            assert!(
                !self.stderr.trim().is_empty(),
                "`icq {}` failed ({:?}) without a message on stderr",
                self.args.join(" "),
                self.code
            );
        }
        self
    }

    /// Fails unless the invocation exited 0.
    pub fn assert_success(&self) -> &Self {
        self.assert_no_panic();
        assert_eq!(
            self.code,
            Some(0),
            "`icq {}` failed\nstdout: {}\nstderr: {}",
            self.args.join(" "),
            self.stdout,
            self.stderr
        );
        self
    }

    /// The stdout parsed as one JSON document.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "`icq {}` did not print one JSON document ({e}):\n{}",
                self.args.join(" "),
                self.stdout
            )
        })
    }
}

/// Runs `icq <args> --database-url <url>` to completion, off a terminal.
pub fn icq_cli(url: &str, args: &[&str]) -> CliRun {
    icq_cli_env(url, args, &[])
}

/// [`icq_cli`] with extra environment variables.
pub fn icq_cli_env(url: &str, args: &[&str], env: &[(&str, &str)]) -> CliRun {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.push("--database-url".into());
    all.push(url.into());
    let output: Output = Command::new(icq_bin())
        .args(&all)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env_remove("COLUMNS")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run icq");
    CliRun {
        args: all[..args.len()].to_vec(),
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Writes `dir/icq.yaml` with one source and the given handler block (YAML, indented by
/// two spaces under `handlers:`) and settings (a flow mapping).
pub fn write_config(
    dir: &Path,
    source: &str,
    url: &str,
    settings: &str,
    handlers: &str,
) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("icq.yaml");
    let text = format!(
        "sources:\n  - name: {source}\n    url: \"{url}\"\n    settings: {settings}\nhandlers:\n{handlers}"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A YAML double-quoted scalar.
pub fn yaml_str(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

/// An `icq work` process with its log file.
pub struct Worker {
    pub child: Child,
    pub log: PathBuf,
}

impl Worker {
    /// Starts `icq work --config <config> <extra…>`, logging to `log` (appending).
    pub fn start(config: &Path, extra: &[&str], log: &Path) -> Worker {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(icq_bin())
            .arg("work")
            .arg("--config")
            .arg(config)
            .args(extra)
            .env_remove("DATABASE_URL")
            .env_remove("ICQ_CONFIG")
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "icq=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start icq work");
        Worker {
            child,
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(self.pid(), signal);
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// The exit status if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `limit` for the process to exit.
    pub async fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if start.elapsed() >= limit {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, then waits up to `limit`; SIGKILLs a process that did not stop.
    pub async fn stop(&mut self, limit: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.exited() {
            return Some(status);
        }
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = self.wait_for_exit(limit).await;
        if status.is_none() {
            self.kill();
        }
        status
    }

    /// The last `lines` lines of the log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.exited().is_none() {
            self.kill();
        }
    }
}

/// The last `lines` lines of a file.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Pids of processes whose command line contains `marker` (`pgrep -f`).
pub fn pgrep(marker: &str) -> Vec<i32> {
    let out = Command::new("pgrep")
        .arg("-f")
        .arg(marker)
        .output()
        .expect("run pgrep");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|&p| p != std::process::id() as i32)
        .collect()
}

// ---------------------------------------------------------------------------------------
// the counting HTTP endpoint

/// One request the endpoint received.
#[derive(Debug, Clone)]
pub struct Hit {
    /// `X-Icq-Command-Id`.
    pub id: String,
    /// `X-Icq-Source`.
    pub source: String,
    /// When its head arrived.
    pub at: Instant,
}

/// A minimal HTTP/1.1 endpoint on 127.0.0.1 that records every request's command id and
/// source and answers 200 after a short random delay. Keep-alive, Content-Length bodies.
pub struct CountingServer {
    pub addr: SocketAddr,
    pub hits: Arc<Mutex<Vec<Hit>>>,
    /// The answers' delay range in ms, changeable while the server runs.
    delay_ms: Arc<(AtomicU64, AtomicU64)>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingServer {
    /// Starts the endpoint; each answer waits between `delay_ms.0` and `delay_ms.1` ms.
    pub async fn start(delay_ms: (u64, u64)) -> CountingServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
        let sink = hits.clone();
        let delay_ms = Arc::new((AtomicU64::new(delay_ms.0), AtomicU64::new(delay_ms.1)));
        let delay = delay_ms.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve(stream, sink.clone(), delay.clone()));
            }
        });
        CountingServer {
            addr,
            hits,
            delay_ms,
            task,
        }
    }

    /// From now on each answer waits between `delay_ms.0` and `delay_ms.1` ms.
    pub fn set_delay(&self, delay_ms: (u64, u64)) {
        self.delay_ms.0.store(delay_ms.0, Ordering::Relaxed);
        self.delay_ms.1.store(delay_ms.1, Ordering::Relaxed);
    }

    /// The URL icq should POST to.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// A copy of every hit so far.
    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// Requests per command id.
    pub fn counts(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for hit in self.hits.lock().unwrap().iter() {
            *counts.entry(hit.id.clone()).or_default() += 1;
        }
        counts
    }
}

impl Drop for CountingServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn serve(
    mut stream: TcpStream,
    hits: Arc<Mutex<Vec<Hit>>>,
    delay_ms: Arc<(AtomicU64, AtomicU64)>,
) {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        let head_end = loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                break end;
            }
            match stream.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        };
        let at = Instant::now();
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut length = 0usize;
        let (mut id, mut source, mut close) = (String::new(), String::new(), false);
        for line in head.lines().skip(1) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().unwrap_or(0),
                "x-icq-command-id" => id = value.to_owned(),
                "x-icq-source" => source = value.to_owned(),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        let total = head_end + 4 + length;
        while buf.len() < total {
            match stream.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        buf.drain(..total);
        hits.lock().unwrap().push(Hit { id, source, at });
        let (low, high) = (
            delay_ms.0.load(Ordering::Relaxed),
            delay_ms.1.load(Ordering::Relaxed),
        );
        let delay = rand::rng().random_range(low..=high.max(low));
        tokio::time::sleep(Duration::from_millis(delay)).await;
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await
            .is_err()
            || close
        {
            return;
        }
    }
}
