//! Hardening (memory, stalls and secrets), through the binary:
//!
//! - an http handler whose endpoint answers 500 with a gigabyte body keeps the worker's
//!   peak RSS small, and the row's `LastError` has the excerpt;
//! - `icq work` with stderr a pipe nobody reads (and verbose logging) still drains every
//!   command and exits on SIGTERM: log lines are dropped and counted, never waited for;
//! - `icq schedule --payload @/dev/zero` and a `--from-file` line without end are refused
//!   with exit 2 naming the limit's flag, in bounded memory;
//! - a configuration nested 100,000 deep is refused in well under a second.
//!
//! (The secrets items are in the CLI suite's secrets tests, `tests/cli/edges.rs`.)

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::common::{
    HEAVY, Worker, completed, icq_bin, table, texts, wait_until, write_config, yaml_str,
};
use crate::support::TestDb;

/// The peak resident set size (`VmHWM`) of a live process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kib * 1024
}

const MB: u64 = 1024 * 1024;

/// An endpoint that answers every request with 500 and a chunked body of `total` bytes,
/// generated as it is sent (`EXCERPT-START` then `x`s); counts the bytes it managed to
/// send before the client hung up.
async fn huge_error_endpoint(total: u64) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                // The request: its head, then its Content-Length body.
                let mut request = Vec::new();
                let head_end = loop {
                    if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                        break end;
                    }
                    let mut buf = [0u8; 4096];
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&request[..head_end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let mut have = request.len() - head_end - 4;
                while have < length {
                    let mut buf = [0u8; 4096];
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => have += n,
                    }
                }
                let head = "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n\
                            transfer-encoding: chunked\r\n\r\n";
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let mut chunk = vec![b'x'; 64 * 1024];
                chunk[..13].copy_from_slice(b"EXCERPT-START");
                let mut left = total;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    let framed = [format!("{n:x}\r\n").as_bytes(), &chunk[..n], b"\r\n"].concat();
                    if stream.write_all(&framed).await.is_err() {
                        return;
                    }
                    counter.fetch_add(n as u64, Ordering::Relaxed);
                    left -= n as u64;
                    chunk[..13].copy_from_slice(b"xxxxxxxxxxxxx");
                }
                let _ = stream.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    (url, sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_error_body_is_read_only_to_the_excerpt() {
    let _heavy = HEAVY.lock().await;
    let db = TestDb::with_table("sqlite", "bigbody").await;
    let t = table(&db);
    db.execute(&format!(
        "INSERT INTO {t} (\"Type\", \"Payload\") VALUES ('big.http', '{{}}')"
    ))
    .await;
    let gigabyte = 1024 * MB;
    let (url, sent) = huge_error_endpoint(gigabyte).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "lite",
        &db.url,
        "{ max_attempts: 1, polling_interval_seconds: 0.2, concurrency: 8 }",
        &format!(
            "  big.http:\n    http: {{ url: {} }}\n    timeout_seconds: 120\n",
            yaml_str(&url)
        ),
    );
    let log = dir.path().join("worker.log");
    let mut worker = Worker::start(&config, &[], &log);
    let last_error = format!("SELECT \"LastError\" FROM {t}");
    let settled = wait_until(Duration::from_secs(60), || async {
        texts(&db, &last_error)
            .await
            .first()
            .cloned()
            .flatten()
            .is_some()
    })
    .await;
    assert!(settled, "the row never failed\n{}", worker.log_tail(20));
    let peak = peak_rss(worker.child.id());
    let status = worker.stop(Duration::from_secs(10)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");

    let stored = texts(&db, &last_error).await[0].clone().unwrap();
    assert!(
        stored.starts_with("HTTP 500 Internal Server Error: EXCERPT-STARTxxx"),
        "{stored}"
    );
    assert!(stored.ends_with("x…"), "cut, and said so: {stored}");
    assert!(stored.len() < 600, "{} bytes stored", stored.len());
    assert!(
        peak < 100 * MB,
        "icq work peaked at {} MB reading a 1 GB error body",
        peak / MB
    );
    // The worker hung up long before the end of the body.
    let delivered = sent.load(Ordering::Relaxed);
    assert!(delivered < gigabyte / 2, "{} MB were sent", delivered / MB);
    eprintln!(
        "peak RSS {:.1} MB; the endpoint got {:.1} MB out before the worker hung up",
        peak as f64 / MB as f64,
        delivered as f64 / MB as f64
    );
}

/// Reads `icq_log_lines_dropped_total` from the metrics endpoint (0 when absent).
async fn dropped_lines(addr: &str) -> Option<u64> {
    let body = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    body.lines()
        .find_map(|line| line.strip_prefix("icq_log_lines_dropped_total "))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .map(|n| n as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_stderr_never_stops_the_worker() {
    const COMMANDS: usize = 3000;
    let _heavy = HEAVY.lock().await;
    let db = TestDb::with_table("sqlite", "stderr").await;
    let t = table(&db);
    let rows: Vec<String> = (0..COMMANDS)
        .map(|k| format!("('t', '{{\"n\": {k}}}')"))
        .collect();
    db.execute(&format!(
        "INSERT INTO {t} (\"Type\", \"Payload\") VALUES {}",
        rows.join(", ")
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "lite",
        &db.url,
        "{ polling_interval_seconds: 0.2 }",
        "  t:\n    noop: true\n",
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    // stderr: a pipe this test holds open and never reads.
    let mut child = Command::new(icq_bin())
        .args(["work", "--metrics-addr", &addr, "--config"])
        .arg(&config)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "trace")
        // ~3,200 lines are logged; a queue shorter than that must drop some.
        .env("ICQ_LOG_QUEUE_LINES", "256")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start icq work");
    let _unread = child.stderr.take();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);

    let drained = wait_until(Duration::from_secs(90), || async {
        completed(&db).await == COMMANDS as i64
    })
    .await;
    let done = completed(&db).await;
    // The counter is refreshed every second.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut dropped = dropped_lines(&addr).await;
    while dropped.is_none_or(|n| n == 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        dropped = dropped_lines(&addr).await;
    }
    if !drained {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = child.wait();
        panic!("only {done} of {COMMANDS} commands ran with stderr blocked");
    }
    // Lines were dropped, so stderr really was full: the test proves something.
    assert!(
        dropped.is_some_and(|n| n > 0),
        "no log line was dropped ({dropped:?}): stderr never filled"
    );

    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(15) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let Some(status) = status else {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = child.wait();
        panic!("icq work did not exit within 15 s of SIGTERM with stderr blocked");
    };
    assert!(status.success(), "{status:?}");
    assert!(
        !Path::new(&format!("/proc/{}", child.id())).exists(),
        "the process is gone"
    );
    // Every command ran exactly once: completed, one attempt each.
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {} WHERE \"ProcessedAt\" IS NOT NULL AND \"Attempts\" = 1",
            db.all_rows()
        ))
        .await,
        COMMANDS as i64
    );
    eprintln!(
        "{COMMANDS} commands with stderr blocked; {} log lines dropped; exited {:.2} s after SIGTERM",
        dropped.unwrap_or(0),
        started.elapsed().as_secs_f64()
    );
}

/// Runs `icq args…` under GNU time; returns (exit code, stderr, peak RSS in bytes).
fn icq_measured(args: &[&str], dir: &Path, stdin: Stdio) -> (Option<i32>, String, u64) {
    let time = Path::new("/usr/bin/time");
    assert!(
        time.exists(),
        "GNU time (/usr/bin/time) is needed to measure peak RSS"
    );
    let report = dir.join("rss.txt");
    let out = Command::new(time)
        .args(["-f", "%M", "-o"])
        .arg(&report)
        .arg(icq_bin())
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env_remove("ICQ_MAX_INPUT_BYTES")
        .env("NO_COLOR", "1")
        .current_dir(dir)
        .stdin(stdin)
        .output()
        .expect("run icq under time");
    let kib: u64 = std::fs::read_to_string(&report)
        .unwrap()
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .expect("time's report");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        kib * 1024,
    )
}

#[test]
fn schedule_payload_from_dev_zero_is_refused_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("q.db").display());
    let base = ["schedule", "--database-url", url.as_str(), "--type", "t"];
    for (extra, limit) in [
        (vec![], "16777216"),
        (vec!["--max-input-bytes", "1MiB"], "1048576"),
    ] {
        let mut args = base.to_vec();
        args.extend(["--payload", "@/dev/zero"]);
        args.extend(extra);
        let started = Instant::now();
        let (code, stderr, peak) = icq_measured(&args, dir.path(), Stdio::null());
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "the payload file /dev/zero is larger than {limit} bytes, the input limit"
            )) && stderr.contains("--max-input-bytes or ICQ_MAX_INPUT_BYTES"),
            "{stderr}"
        );
        assert!(peak < 100 * MB, "peaked at {} MB", peak / MB);
        assert!(started.elapsed() < Duration::from_secs(10));
        eprintln!(
            "@/dev/zero, limit {limit}: peak RSS {:.1} MB",
            peak as f64 / MB as f64
        );
    }
    // Stdin too (`@-`), and the variable sets the limit.
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let mut args = base.to_vec();
    args.extend(["--payload", "@-"]);
    let time = Path::new("/usr/bin/time");
    assert!(time.exists());
    let out = Command::new(icq_bin())
        .args(&args)
        .env("ICQ_MAX_INPUT_BYTES", "64KiB")
        .stdin(zero)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the payload on stdin is larger than 65536 bytes"),
        "{stderr}"
    );
    // Nothing was scheduled: the database was never even opened.
    assert!(!dir.path().join("q.db").exists());
}

#[tokio::test]
async fn schedule_huge_jsonl_line_is_refused_in_bounded_memory() {
    let db = TestDb::with_table("sqlite", "jsonl").await;
    let url = db.url.clone();
    let dir = tempfile::tempdir().unwrap();
    // A good first line, then a 200 MB line with no end in sight (a sparse file: it costs
    // no disk).
    let path = dir.path().join("jobs.jsonl");
    let file = std::fs::File::create(&path).unwrap();
    std::io::Write::write_all(&mut &file, b"{\"type\": \"t\", \"payload\": {}}\n").unwrap();
    file.set_len(200 * MB).unwrap();
    drop(file);
    let from_file = path.to_str().unwrap();
    for (extra, limit) in [
        (vec![], "16777216"),
        (vec!["--max-input-bytes", "256KiB"], "262144"),
    ] {
        let mut args = vec![
            "schedule",
            "--database-url",
            url.as_str(),
            "--from-file",
            from_file,
        ];
        args.extend(extra);
        let (code, stderr, peak) = icq_measured(&args, dir.path(), Stdio::null());
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "{from_file}:2: the line is larger than {limit} bytes, the input limit"
            )) && stderr.contains("--max-input-bytes or ICQ_MAX_INPUT_BYTES"),
            "{stderr}"
        );
        assert!(peak < 100 * MB, "peaked at {} MB", peak / MB);
        eprintln!(
            "200 MB JSONL line, limit {limit}: peak RSS {:.1} MB",
            peak as f64 / MB as f64
        );
    }
    // From stdin, the same.
    let out = Command::new(icq_bin())
        .args(["schedule", "--database-url", &url, "--from-file", "-"])
        .env_remove("ICQ_MAX_INPUT_BYTES")
        .stdin(std::fs::File::open("/dev/zero").unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("stdin:1: the line is larger than 16777216 bytes"),
        "{stderr}"
    );
    let count = format!("SELECT COUNT(*) FROM {}", table(&db));
    assert_eq!(db.scalar_i64(&count).await, 0, "nothing was scheduled");

    // Under the limit, the same file's first line alone schedules normally.
    let small = dir.path().join("small.jsonl");
    std::fs::write(&small, "{\"type\": \"t\", \"payload\": {}}\n\n").unwrap();
    let out = Command::new(icq_bin())
        .args([
            "schedule",
            "--database-url",
            &url,
            "--format",
            "json",
            "--from-file",
        ])
        .arg(&small)
        .args(["--max-input-bytes", "64"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(db.scalar_i64(&count).await, 1);
}

#[test]
fn deep_yaml_is_refused_in_well_under_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let n = 100_000;
    for (name, text) in [
        (
            "flow.yaml",
            format!("sources: {}{}\n", "[".repeat(n), "]".repeat(n)),
        ),
        (
            "map.yaml",
            format!("sources: {}1{}\n", "{a: ".repeat(n), "}".repeat(n)),
        ),
        ("seq.yaml", format!("sources:\n{}x\n", "- ".repeat(n))),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &text).unwrap();
        for args in [
            vec!["config", "check", "--config"],
            vec!["pending", "--config"],
        ] {
            let started = Instant::now();
            let out = Command::new(icq_bin())
                .args(&args)
                .arg(&path)
                .env_remove("DATABASE_URL")
                .output()
                .unwrap();
            let took = started.elapsed();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
            assert!(
                stderr.contains("nested more than 64 levels deep"),
                "{name}: {stderr}"
            );
            assert!(
                took < Duration::from_secs(2),
                "{name}: refused after {took:?} (the old code: 34-37 s of CPU)"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_log_lines_are_flushed_at_exit() {
    const COMMANDS: usize = 500;
    let db = TestDb::with_table("sqlite", "flush").await;
    let t = table(&db);
    let rows: Vec<String> = (0..COMMANDS)
        .map(|k| format!("('t', '{{\"n\": {k}}}')"))
        .collect();
    db.execute(&format!(
        "INSERT INTO {t} (\"Type\", \"Payload\") VALUES {}",
        rows.join(", ")
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "lite",
        &db.url,
        "{ polling_interval_seconds: 0.2 }",
        "  t:\n    noop: true\n",
    );
    // A healthy sink (a file) and a burst of trace lines: none is dropped, and the last
    // one, written just before exit, is there.
    let log = dir.path().join("worker.log");
    let status = Command::new(icq_bin())
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env_remove("ICQ_LOG_QUEUE_LINES")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "trace")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(completed(&db).await, COMMANDS as i64);
    let text = std::fs::read_to_string(&log).unwrap();
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.contains("stopped") && last.contains(&format!("succeeded={COMMANDS}")),
        "the last line logged is missing; the log ends with: {last}"
    );
    assert!(!text.contains("log lines were dropped"), "{last}");
    assert!(text.lines().count() > COMMANDS, "a burst of trace lines");
}
