//! `icq console` tests: the real binary on a free port, against SQLite and PostgreSQL
//! databases holding known rows, checked over HTTP (`http`) and in Debian's chromium
//! driven by playwright-core (`browser`).

#[path = "../support/mod.rs"]
mod support;

mod browser;
mod hostile;
mod http;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::TestDb;

/// The console's token in every test that allows actions.
pub const TOKEN: &str = "test-token-5f1c2b";

/// Due commands of type `orders.receipt` (more than one page of 25).
pub const DUE_RECEIPTS: usize = 30;
/// A dead letter whose payload and last error try to inject script.
pub const XSS: &str = "10000000-0000-4000-8000-0000000000a1";
/// A plain dead letter (the one the tests requeue).
pub const DEAD: &str = "10000000-0000-4000-8000-0000000000a2";
/// A scheduled (future) command.
pub const SCHEDULED: &str = "10000000-0000-4000-8000-0000000000b1";
/// A running command (live lease).
pub const RUNNING: &str = "10000000-0000-4000-8000-0000000000c1";

/// The queue of the due `orders.receipt` commands numbered [`DUE_RECEIPTS`] - [`BULK`]
/// and up (priority 5); the rest stay in `default`.
pub const BULK_QUEUE: &str = "bulk";
/// How many due receipts are in [`BULK_QUEUE`].
pub const BULK: usize = 5;
/// The queue of the two scheduled `email.digest` commands.
pub const EMAILS_QUEUE: &str = "emails";
/// The queue of the two dead letters ([`DEAD`] also has a unique key and a trace parent).
pub const WEBHOOKS_QUEUE: &str = "webhooks";
/// [`DEAD`]'s unique key and trace parent.
pub const DEAD_UNIQUE_KEY: &str = "order-42-paid";
pub const DEAD_TRACE_PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// What the XSS row's payload and last error carry.
pub const XSS_PAYLOAD: &str = r#"{"html": "<script>window.__xss = 1</script>", "note": "</pre><img src=x onerror=window.__xss=2>"}"#;
pub const XSS_ERROR: &str = "<script>window.__xss = 3</script> failed & <b>bold</b>";

/// A timestamp literal for `at` (`YYYY-MM-DDTHH:MM:SS`, UTC) in the engine's column type.
fn ts(db: &TestDb, at: &str) -> String {
    match db.engine {
        "postgres" => format!("'{at}Z'::timestamptz"),
        "mysql" => format!("'{}'", at.replace('T', " ")),
        _ => format!("'{at}.000Z'"),
    }
}

/// One row as a `VALUES` tuple over the columns of [`COLUMNS`].
#[allow(clippy::too_many_arguments)]
fn row(
    db: &TestDb,
    id: &str,
    ty: &str,
    payload: &str,
    run_at: &str,
    attempts: i32,
    lock: Option<(&str, &str)>,
    processed_at: Option<&str>,
    dead: Option<(&str, &str)>,
) -> String {
    let null = || "NULL".to_string();
    format!(
        "('{id}', '{ty}', '{}', {}, {}, {attempts}, {}, {}, {}, {}, {})",
        payload.replace('\'', "''"),
        ts(db, "2026-01-01T00:00:00"),
        ts(db, run_at),
        lock.map_or_else(null, |(token, _)| format!("'{token}'")),
        lock.map_or_else(null, |(_, until)| ts(db, until)),
        processed_at.map_or_else(null, |at| ts(db, at)),
        dead.map_or_else(null, |(at, _)| ts(db, at)),
        dead.map_or_else(null, |(_, error)| format!(
            "'{}'",
            error.replace('\'', "''")
        )),
    )
}

const COLUMNS: [&str; 10] = [
    "Id",
    "Type",
    "Payload",
    "CreatedAt",
    "RunAt",
    "Attempts",
    "LockToken",
    "LockedUntil",
    "ProcessedAt",
    "DeadLetteredAt",
];

/// A fresh database with the (schema version 2) commands table and known rows: 30 due
/// `orders.receipt` (the last [`BULK`] in queue [`BULK_QUEUE`], priority 5), 2 scheduled
/// `email.digest` (queue [`EMAILS_QUEUE`]), 1 running, 2 dead (one of them [`XSS`]; both
/// in queue [`WEBHOOKS_QUEUE`]), 3 completed; the rest in queue `default`.
pub async fn seeded(engine: &'static str, tag: &str) -> TestDb {
    let db = TestDb::with_table(engine, tag).await;
    insert_rows(&db).await;
    let table = db.q("InternalCommands");
    let (queue, priority, id, ty) = (db.q("Queue"), db.q("Priority"), db.q("Id"), db.q("Type"));
    let bulk: Vec<String> = (DUE_RECEIPTS - BULK..DUE_RECEIPTS)
        .map(|n| format!("'20000000-0000-4000-8000-{n:012}'"))
        .collect();
    db.execute(&format!(
        "UPDATE {table} SET {queue} = '{BULK_QUEUE}', {priority} = 5 WHERE {id} IN ({});
         UPDATE {table} SET {queue} = '{EMAILS_QUEUE}' WHERE {ty} = 'email.digest';
         UPDATE {table} SET {queue} = '{WEBHOOKS_QUEUE}' WHERE {ty} = 'webhooks.deliver';
         UPDATE {table} SET {priority} = -1, {} = 3, {} = '{DEAD_UNIQUE_KEY}', {} = '{DEAD_TRACE_PARENT}' WHERE {id} = '{DEAD}';",
        bulk.join(", "),
        db.q("Snoozes"),
        db.q("UniqueKey"),
        db.q("TraceParent"),
    ))
    .await;
    db
}

/// The same rows in a schema-version-1 table (no queues: every row in `default`).
pub async fn seeded_v1(engine: &'static str, tag: &str) -> TestDb {
    let db = TestDb::new(engine, tag).await;
    let kind: icq::Engine = engine.parse().expect("a runtime engine name");
    db.execute(&icq::schema::render_v1(kind, &icq::TableName::default()).up)
        .await;
    insert_rows(&db).await;
    db
}

async fn insert_rows(db: &TestDb) {
    let mut rows = Vec::new();
    for n in 0..DUE_RECEIPTS {
        rows.push(row(
            db,
            &format!("20000000-0000-4000-8000-{n:012}"),
            "orders.receipt",
            &format!(r#"{{"order_id": {n}}}"#),
            &format!("2026-01-01T00:{:02}:00", n % 60),
            0,
            None,
            None,
            None,
        ));
    }
    for (n, id) in [SCHEDULED, "10000000-0000-4000-8000-0000000000b2"]
        .iter()
        .enumerate()
    {
        rows.push(row(
            db,
            id,
            "email.digest",
            &format!(r#"{{"week": {n}}}"#),
            "2999-01-01T00:00:00",
            0,
            None,
            None,
            None,
        ));
    }
    rows.push(row(
        db,
        RUNNING,
        "orders.receipt",
        r#"{"order_id": 999}"#,
        "2026-01-01T00:00:00",
        1,
        Some((
            "30000000-0000-4000-8000-000000000001",
            "2999-01-01T00:00:00",
        )),
        None,
        None,
    ));
    rows.push(row(
        db,
        XSS,
        "webhooks.deliver",
        XSS_PAYLOAD,
        "2026-01-01T00:00:00",
        5,
        None,
        None,
        Some(("2026-01-02T00:00:00", XSS_ERROR)),
    ));
    rows.push(row(
        db,
        DEAD,
        "webhooks.deliver",
        r#"{"event": "order.paid"}"#,
        "2026-01-01T00:00:00",
        5,
        None,
        None,
        Some(("2026-01-03T00:00:00", "endpoint answered 503")),
    ));
    for n in 0..3 {
        rows.push(row(
            db,
            &format!("40000000-0000-4000-8000-{n:012}"),
            "orders.receipt",
            &format!(r#"{{"order_id": {}}}"#, 100 + n),
            "2026-01-01T00:00:00",
            1,
            None,
            Some("2026-01-01T00:10:00"),
            None,
        ));
    }
    let columns: Vec<String> = COLUMNS.iter().map(|c| db.q(c)).collect();
    let last_error = db.q("LastError");
    db.execute(&format!(
        "INSERT INTO {} ({}, {last_error}) VALUES {}",
        db.q("InternalCommands"),
        columns.join(", "),
        rows.join(",\n")
    ))
    .await;
}

/// `icq --database-url URL ARGS...`: its output (must succeed).
pub fn icq(url: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["--database-url", url])
        .args(args)
        .env_remove("ICQ_CONFIG")
        .env_remove("DATABASE_URL")
        .output()
        .expect("run icq");
    assert!(
        out.status.success(),
        "icq {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// `icq pending --format json` as a value.
pub fn pending_json(url: &str) -> serde_json::Value {
    serde_json::from_str(&icq(url, &["pending", "--format", "json"])).expect("pending JSON")
}

/// `icq pending --by-queue --format json` as a value.
pub fn pending_by_queue_json(url: &str) -> serde_json::Value {
    serde_json::from_str(&icq(url, &["pending", "--by-queue", "--format", "json"]))
        .expect("pending --by-queue JSON")
}

/// The state of one command, as `icq show --format json` reports it.
pub fn state_of(url: &str, id: &str) -> String {
    let shown: serde_json::Value =
        serde_json::from_str(&icq(url, &["show", id, "--format", "json"])).expect("show JSON");
    shown["state"].as_str().expect("a state").to_owned()
}

/// A running `icq console` on a free loopback port; stopped (Ctrl-C) when dropped.
pub struct Console {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Console {
    /// Starts `icq --database-url URL console EXTRA... [--addr 127.0.0.1:0]` with `token`
    /// in `ICQ_CONSOLE_TOKEN`, and waits for the address it prints.
    pub fn start(url: &str, extra: &[&str], token: Option<&str>) -> Console {
        let mut command = Command::new(env!("CARGO_BIN_EXE_icq"));
        command
            .args(["--database-url", url, "console"])
            .args(extra)
            .env_remove("ICQ_CONFIG")
            .env_remove("DATABASE_URL")
            .env_remove("ICQ_CONSOLE_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(token) = token {
            command.env("ICQ_CONSOLE_TOKEN", token);
        }
        if !extra.contains(&"--addr") {
            command.args(["--addr", "127.0.0.1:0"]);
        }
        let mut child = command.spawn().expect("start icq console");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("http://").nth(1) {
                    let addr: String = rest.chars().take_while(|c| *c != '/').collect();
                    let _ = tx.send(addr);
                } else {
                    eprintln!("console: {line}");
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the console prints the address it listens on");
        Console {
            child,
            base: format!("http://{addr}"),
        }
    }

    /// The full URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The console's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `host:port`, as a browser's `Host` header names it.
    pub fn host(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// Sends SIGINT and waits (at most 10 s) for the exit status.
    pub fn interrupt(&mut self) -> Option<std::process::ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        None
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        if self.interrupt().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
