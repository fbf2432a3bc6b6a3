//! `icq work` in production shape: http handlers, several sources in one process,
//! metrics, and startup errors a user can act on.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::support::TestDb;

fn icq() -> Command {
    Command::new(env!("CARGO_BIN_EXE_icq"))
}

/// One request as the test server saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A listener on 127.0.0.1 that only counts the connections made to it: where the test
/// server's redirect points. Anything reaching it means a redirect was followed.
async fn redirect_target() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = stream
                .write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
                .await;
        }
    });
    (port, hits)
}

/// A minimal HTTP/1.1 server on 127.0.0.1: `/ok` answers 204, `/fail` 500 with a body,
/// `/away` a 302 to `away` (another origin), `/here` a 307 to `/ok` on this same server.
/// Records every request.
async fn http_server(away: String) -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (log, away) = (log.clone(), away.clone());
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut reader = BufReader::new(read);
                let mut line = String::new();
                if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let mut headers = Vec::new();
                loop {
                    let mut h = String::new();
                    reader.read_line(&mut h).await.unwrap();
                    let h = h.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    if let Some((n, v)) = h.split_once(':') {
                        headers.push((n.trim().to_owned(), v.trim().to_owned()));
                    }
                }
                let len: usize = headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0; len];
                reader.read_exact(&mut body).await.unwrap();
                log.lock().unwrap().push(Seen {
                    path: path.clone(),
                    headers,
                    body: String::from_utf8_lossy(&body).into(),
                });
                let response = match path.as_str() {
                    "/ok" => "HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n".to_owned(),
                    "/away" => format!("HTTP/1.1 302 Found\r\nlocation: {away}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"),
                    "/here" => "HTTP/1.1 307 Temporary Redirect\r\nlocation: /ok?redirected=1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned(),
                    _ => "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 19\r\nconnection: close\r\n\r\noops: database down".to_owned(),
                };
                let _ = write.write_all(response.as_bytes()).await;
                let _ = write.shutdown().await;
            });
        }
    });
    (port, seen)
}

async fn insert(db: &TestDb, ty: &str, payload: &str, extra: &[(&str, &str)]) {
    let t = db.q("InternalCommands");
    let mut cols = vec![db.q("Type"), db.q("Payload")];
    let mut vals = vec![format!("'{ty}'"), format!("'{payload}'")];
    for (c, v) in extra {
        cols.push(db.q(c));
        vals.push(format!("'{v}'"));
    }
    db.execute(&format!(
        "INSERT INTO {t} ({}) VALUES ({})",
        cols.join(", "),
        vals.join(", ")
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http_handler_posts_payload_and_context_headers() {
    let (away_port, away_hits) = redirect_target().await;
    let away = format!("http://127.0.0.1:{away_port}/x");
    let (port, seen) = http_server(away.clone()).await;
    let db = TestDb::with_table("sqlite", "http").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: web\n    url: \"{url}\"\nhandlers:\n  hooks.ok:\n    http: {{ url: \"http://127.0.0.1:{port}/ok\", headers: {{ Authorization: \"Bearer ${{HOOK_TOKEN}}\" }} }}\n    timeout_seconds: 5\n  hooks.fail:\n    http: {{ url: \"http://127.0.0.1:{port}/fail\" }}\n  hooks.away:\n    http: {{ url: \"http://127.0.0.1:{port}/away\" }}\n  hooks.here:\n    http: {{ url: \"http://127.0.0.1:{port}/here\" }}\n",
            url = db.url
        ),
    )
    .unwrap();
    insert(
        &db,
        "hooks.ok",
        r#"{"order": 1}"#,
        &[
            ("UserId", "u-1"),
            ("Roles", r#"["a","b"]"#),
            ("TenantId", "t-1"),
            ("CorrelationId", "c-1"),
        ],
    )
    .await;
    insert(&db, "hooks.fail", "{}", &[]).await;
    insert(&db, "hooks.away", "{}", &[]).await;
    insert(&db, "hooks.here", "{}", &[]).await;
    let out = icq()
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env("HOOK_TOKEN", "tok-123")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let seen = seen.lock().unwrap().clone();
    let ok = seen
        .iter()
        .find(|s| s.path == "/ok")
        .expect("the ok hook was called");
    assert_eq!(ok.body, r#"{"order":1}"#);
    for (name, value) in [
        ("authorization", "Bearer tok-123"),
        ("content-type", "application/json"),
        ("x-icq-command-type", "hooks.ok"),
        ("x-icq-attempt", "1"),
        ("x-icq-source", "web"),
        ("x-icq-user-id", "u-1"),
        ("x-icq-roles", r#"["a","b"]"#),
        ("x-icq-tenant-id", "t-1"),
        ("x-icq-correlation-id", "c-1"),
    ] {
        assert_eq!(ok.header(name), Some(value), "header {name}");
    }
    assert_eq!(ok.header("x-icq-command-id").map(str::len), Some(36));
    assert_eq!(
        away_hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the redirect to another origin was not followed: its target saw no connection"
    );
    assert_eq!(
        seen.iter().filter(|s| s.path == "/ok").count(),
        1,
        "the same-host redirect to /ok was not followed either: /ok saw only its own hook"
    );
    assert!(
        !seen.iter().any(|s| s.path.contains("redirected")),
        "{seen:?}"
    );
    for path in ["/away", "/here"] {
        assert_eq!(
            seen.iter().filter(|s| s.path == path).count(),
            1,
            "{path} was posted to once (the failed attempt retries later)"
        );
    }

    let t = db.q("InternalCommands");
    let (ty, le, p) = (db.q("Type"), db.q("LastError"), db.q("ProcessedAt"));
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE {ty} = 'hooks.ok' AND {p} IS NOT NULL",
            db.all_rows()
        ))
        .await,
        1
    );
    assert_eq!(
        db.scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {ty} = 'hooks.fail' AND {le} = 'HTTP 500 Internal Server Error: oops: database down' AND {p} IS NULL")).await,
        1
    );
    assert_eq!(
        db.scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {ty} = 'hooks.away' AND {le} = 'HTTP 302 redirect to {away} not followed: icq POSTs only to the configured URL' AND {p} IS NULL")).await,
        1
    );
    assert_eq!(
        db.scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {ty} = 'hooks.here' AND {le} LIKE 'HTTP 307 redirect to % not followed: icq POSTs only to the configured URL' AND {p} IS NULL")).await,
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_sources_of_different_engines_in_one_process() {
    let pg = TestDb::with_table("postgres", "multi").await;
    let my = TestDb::with_table("mysql", "multi").await;
    for _ in 0..20 {
        insert(&pg, "noop.a", "{}", &[]).await;
        insert(&my, "noop.a", "{}", &[]).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: pg\n    url: \"{}\"\n    settings: {{ concurrency: 4 }}\n  - name: maria\n    url: \"{}\"\n    settings: {{ batch_size: 5 }}\nhandlers:\n  noop.a:\n    noop: true\n",
            pg.url, my.url
        ),
    )
    .unwrap();
    crate::work_until_idle(&config);
    for db in [&pg, &my] {
        let p = db.q("ProcessedAt");
        assert_eq!(
            db.scalar_i64(&format!(
                "SELECT COUNT(*) FROM {} WHERE {p} IS NOT NULL",
                db.all_rows()
            ))
            .await,
            20,
            "{}",
            db.engine
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_endpoint_serves_prometheus_text() {
    let db = TestDb::with_table("postgres", "metrics").await;
    for _ in 0..3 {
        insert(&db, "noop.m", "{}", &[]).await;
    }
    insert(&db, "nobody.handles", "{}", &[]).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("icq.yaml");
    std::fs::write(&config, format!("sources:\n  - name: m\n    url: \"{}\"\n    settings: {{ polling_interval_seconds: 0.1 }}\nhandlers:\n  noop.m:\n    noop: true\n", db.url)).unwrap();
    let mut worker = icq()
        .args([
            "work",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--config",
        ])
        .arg(&config)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let started = Instant::now();
    let mut body = String::new();
    while started.elapsed() < Duration::from_secs(20) {
        if let Ok(resp) = reqwest::get(&url).await {
            body = resp.text().await.unwrap_or_default();
            if body.contains("icq_internal_commands_succeeded_total{source=\"m\"} 3")
                && body.contains("icq_internal_commands_pending{source=\"m\",state=\"due\"} 0")
            {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(worker.wait().unwrap().success());
    for series in [
        "icq_internal_commands_claimed_total{source=\"m\"} 4",
        "icq_internal_commands_succeeded_total{source=\"m\"} 3",
        "icq_internal_commands_dead_lettered_total{source=\"m\"} 1",
        "icq_internal_commands_execution_seconds_bucket{source=\"m\",type=\"noop.m\",outcome=\"succeeded\"",
        "icq_internal_commands_pending{source=\"m\",state=\"due\"} 0",
    ] {
        assert!(body.contains(series), "missing {series} in:\n{body}");
    }
}

#[test]
fn unreachable_database_names_host_and_port_but_never_the_password() {
    let out = icq()
        .args([
            "pending",
            "--database-url",
            "postgres://app:s3cret-pw@127.0.0.1:9/orders",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("127.0.0.1:9"), "{stderr}");
    assert!(!stderr.contains("s3cret-pw"), "{stderr}");
}
