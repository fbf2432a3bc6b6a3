//! Signals and `icq work`: nothing of a handler outlives
//! its worker, and shutdown never overlaps two executions of one command.
//!
//! - A second SIGINT during a long exec handler, with a grace far longer than the test, ends
//!   the grace at once: `icq work` exits 130 within seconds, every process of the handlers'
//!   groups (leader and backgrounded grandchild) is gone, and the rows are pending again
//!   with their attempt given back (SQLite and PostgreSQL).
//! - SIGHUP, SIGQUIT and SIGUSR1 are graceful stops like SIGTERM: the running command
//!   finishes and is stamped, and the worker exits 0.
//! - SIGKILL of `icq work`: its exec handlers die with it (Linux parent-death signal)
//!   within a second, and what they started in their process groups within two (the
//!   watchdog, `icq exec-watchdog`), which then exits.
//!
//! Handlers write their pids to a file; liveness is read from /proc (a zombie counts as
//! dead: it runs nothing).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::TestDb;

fn icq() -> Command {
    Command::new(env!("CARGO_BIN_EXE_icq"))
}

fn write_config(dir: &Path, url: &str, concurrency: u32, argv: &[String]) -> PathBuf {
    let path = dir.join("icq.yaml");
    // `$$` is a literal `$` in icq.yaml (`${VAR}` is expanded).
    let argv = serde_json::to_string(argv).unwrap().replace('$', "$$");
    let text = format!(
        "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n      concurrency: {concurrency}\n      \
         polling_interval_seconds: 0.1\nhandlers:\n  sig.test:\n    exec: {argv}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn insert(db: &TestDb, n: usize) {
    let (t, c1, c2) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
    for i in 0..n {
        db.execute(&format!(
            "INSERT INTO {t} ({c1}, {c2}) VALUES ('sig.test', '{{\"n\": {i}}}')"
        ))
        .await;
    }
}

/// A running `icq work` whose stderr is collected as it comes.
struct Worker {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Worker {
    fn start(config: &Path, extra: &[&str]) -> Worker {
        let mut child = icq()
            .arg("work")
            .args(extra)
            .arg("--config")
            .arg(config)
            .arg("--log-format")
            .arg("text")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn({
            let log = log.clone();
            move || {
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            }
        });
        Worker { child, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn signal(&self, signal: Signal) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            signal,
        )
        .unwrap();
    }

    /// Waits until the log contains `text` (the worker acted on a signal).
    async fn logged(&self, text: &str, limit: Duration) {
        let start = Instant::now();
        while !self.log().contains(text) {
            assert!(
                start.elapsed() < limit,
                "the worker never logged `{text}`:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the exit, at most `limit`; SIGKILLs a worker that did not exit and fails.
    async fn exit_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("icq work did not exit within {limit:?}:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// True while `pid` names a live process (a zombie counts as dead).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| !matches!(state, 'Z' | 'X')),
        Err(_) => false,
    }
}

/// The pids of `pids` still alive after `limit`.
async fn survivors(pids: &[i32], limit: Duration) -> Vec<i32> {
    let start = Instant::now();
    loop {
        let alive: Vec<i32> = pids.iter().copied().filter(|&pid| alive(pid)).collect();
        if alive.is_empty() || start.elapsed() > limit {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `file` holds `lines` lines of whitespace-separated pids; returns them all.
async fn pids_in(file: &Path, lines: usize) -> Vec<i32> {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(file) {
            let complete: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            if complete.len() >= lines && text.ends_with('\n') {
                return complete
                    .iter()
                    .flat_map(|l| l.split_whitespace())
                    .map(|pid| pid.parse().unwrap())
                    .collect();
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{} never got {lines} lines of pids",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `sh -c` with `script`.
fn sh(script: String) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script]
}

/// Two commands on a handler that would run 60 s (a leader and a backgrounded grandchild
/// in its group), `--grace-seconds 600`, SIGINT twice: exit 130 within seconds, nothing of
/// either handler left, both rows pending again with attempt 0 and no lease.
async fn second_sigint_stops_handlers_and_gives_attempts_back(engine: &'static str) {
    let db = TestDb::with_table(engine, "second_sigint").await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let script = format!("sleep 60 & echo $$ $! >> '{}'; wait", pidfile.display());
    let config = write_config(dir.path(), &db.url, 2, &sh(script));
    insert(&db, 2).await;

    let mut worker = Worker::start(&config, &["--grace-seconds", "600"]);
    let pids = pids_in(&pidfile, 2).await;
    assert_eq!(pids.len(), 4, "two leaders and two grandchildren: {pids:?}");
    assert!(pids.iter().all(|&pid| alive(pid)), "{pids:?}");

    worker.signal(Signal::SIGINT);
    worker.logged("stopping:", Duration::from_secs(10)).await;
    // The first signal only stops claiming: the handlers run on within the grace.
    assert!(pids.iter().all(|&pid| alive(pid)), "{pids:?}");

    let asked = Instant::now();
    worker.signal(Signal::SIGINT);
    let status = worker.exit_within(Duration::from_secs(15)).await;
    let took = asked.elapsed();
    let log = worker.log();
    assert_eq!(status.code(), Some(130), "{engine}: exit code\n{log}");
    assert!(
        took < Duration::from_secs(5),
        "{engine}: exited {took:?} after the second signal\n{log}"
    );
    // Leaders were reaped before icq exited; the grandchildren were sent SIGKILL with
    // their group and are gone as soon as the kernel has delivered it.
    let left = survivors(&pids, Duration::from_secs(1)).await;
    assert!(
        left.is_empty(),
        "{engine}: handler processes {left:?} outlived icq work\n{log}"
    );

    let t = db.q("InternalCommands");
    let (a, l, u, p, d) = (
        db.q("Attempts"),
        db.q("LockToken"),
        db.q("LockedUntil"),
        db.q("ProcessedAt"),
        db.q("DeadLetteredAt"),
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {a} = 0 AND {l} IS NULL AND {u} IS NULL \
             AND {p} IS NULL AND {d} IS NULL"
        ))
        .await,
        2,
        "{engine}: both rows pending again, attempt given back, lease released\n{log}"
    );
    assert_eq!(
        std::fs::read_to_string(&pidfile).unwrap().lines().count(),
        2,
        "{engine}: each command started once"
    );
}

/// `signal` as the only stop: the running command finishes within the grace and is
/// stamped, and the worker exits 0.
async fn graceful_stop_on(signal: Signal) {
    let db = TestDb::with_table("sqlite", "graceful").await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let script = format!("echo $$ >> '{}'; sleep 1", pidfile.display());
    let config = write_config(dir.path(), &db.url, 1, &sh(script));
    insert(&db, 1).await;

    let mut worker = Worker::start(&config, &["--grace-seconds", "30"]);
    let pids = pids_in(&pidfile, 1).await;
    worker.signal(signal);
    let status = worker.exit_within(Duration::from_secs(15)).await;
    let log = worker.log();
    assert_eq!(status.code(), Some(0), "{signal}: exit code\n{log}");
    assert!(
        log.contains("stopping:"),
        "{signal}: a graceful stop\n{log}"
    );
    let t = db.all_rows();
    let (a, p, l) = (db.q("Attempts"), db.q("ProcessedAt"), db.q("LockToken"));
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {p} IS NOT NULL AND {a} = 1 AND {l} IS NULL"
        ))
        .await,
        1,
        "{signal}: the running command finished and was stamped\n{log}"
    );
    assert!(survivors(&pids, Duration::from_secs(1)).await.is_empty());
}

/// SIGKILL of `icq work` while two exec handlers run: both die within a second.
async fn sigkill_of_the_worker_kills_its_exec_handlers(engine: &'static str) {
    let db = TestDb::with_table(engine, "sigkill_children").await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    // `exec`: the parent-death signal reaches the program icq started, which is `sleep`.
    let script = format!("echo $$ >> '{}'; exec sleep 60", pidfile.display());
    let config = write_config(dir.path(), &db.url, 2, &sh(script));
    insert(&db, 2).await;

    let mut worker = Worker::start(&config, &[]);
    let pids = pids_in(&pidfile, 2).await;
    assert!(pids.iter().all(|&pid| alive(pid)), "{pids:?}");
    worker.signal(Signal::SIGKILL);
    let status = worker.exit_within(Duration::from_secs(5)).await;
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    let left = survivors(&pids, Duration::from_secs(1)).await;
    assert!(
        left.is_empty(),
        "{engine}: exec handlers {left:?} outlived their SIGKILLed worker\n{}",
        worker.log()
    );
}

/// The pids whose process group is `group` (read from /proc), alive.
fn members(group: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // pid (comm) state ppid pgrp ...
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<i32>().ok())
                    == Some(group)
            })
        })
        .filter(|&pid| alive(pid))
        .collect()
}

/// The live children of `parent` whose command line contains `text`.
fn children_running(parent: i32, text: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    stat.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                });
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(parent) && String::from_utf8_lossy(&cmdline).contains(text)
        })
        .filter(|&pid| alive(pid))
        .collect()
}

/// SIGKILL of `icq work` while two exec handlers run, each a shell with a
/// background and a foreground `sleep` in its process group (`sh -c 'sleep 300 & sleep
/// 300'`): the parent-death signal kills the shell only; the watchdog kills the rest of
/// both groups within 2 s, and then exits.
async fn sigkill_of_the_worker_kills_its_handlers_grandchildren(engine: &'static str) {
    let db = TestDb::with_table(engine, "sigkill_grandchildren").await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let script = format!("echo $$ >> '{}'; sleep 300 & sleep 300", pidfile.display());
    let config = write_config(dir.path(), &db.url, 2, &sh(script));
    insert(&db, 2).await;

    let mut worker = Worker::start(&config, &[]);
    let groups = pids_in(&pidfile, 2).await;
    let start = Instant::now();
    let mut all: Vec<i32> = Vec::new();
    // Both groups with their two `sleep`s (and the shell, unless it `exec`s the last one).
    while all.len() < 4 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{engine}: the handlers' groups never filled: {all:?}\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        all = groups.iter().flat_map(|&group| members(group)).collect();
    }
    let worker_pid = i32::try_from(worker.child.id()).unwrap();
    let watchdogs = children_running(worker_pid, "exec-watchdog");
    assert_eq!(watchdogs.len(), 1, "{engine}: one watchdog for the worker");

    worker.signal(Signal::SIGKILL);
    let status = worker.exit_within(Duration::from_secs(5)).await;
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    let left = survivors(&all, Duration::from_secs(2)).await;
    let log = worker.log();
    for &pid in &left {
        // Ours to clean up: a grandchild of a worker this test started.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
    }
    assert!(
        left.is_empty(),
        "{engine}: handler processes {left:?} (of {all:?}) outlived their SIGKILLed worker\n{log}"
    );
    assert!(
        survivors(&watchdogs, Duration::from_secs(2))
            .await
            .is_empty(),
        "{engine}: the watchdog {watchdogs:?} did not exit\n{log}"
    );
    assert!(
        log.contains("killed the process groups of 2 exec handler(s)"),
        "{engine}: the watchdog says what it did\n{log}"
    );
}

mod second_sigint {
    #[tokio::test]
    async fn sqlite() {
        super::second_sigint_stops_handlers_and_gives_attempts_back("sqlite").await
    }
    #[tokio::test]
    async fn postgres() {
        super::second_sigint_stops_handlers_and_gives_attempts_back("postgres").await
    }
}

mod graceful {
    use nix::sys::signal::Signal;

    #[tokio::test]
    async fn sighup() {
        super::graceful_stop_on(Signal::SIGHUP).await
    }
    #[tokio::test]
    async fn sigquit() {
        super::graceful_stop_on(Signal::SIGQUIT).await
    }
    #[tokio::test]
    async fn sigusr1() {
        super::graceful_stop_on(Signal::SIGUSR1).await
    }
}

mod sigkill {
    #[tokio::test]
    async fn sqlite() {
        super::sigkill_of_the_worker_kills_its_exec_handlers("sqlite").await
    }
    #[tokio::test]
    async fn grandchildren_sqlite() {
        super::sigkill_of_the_worker_kills_its_handlers_grandchildren("sqlite").await
    }
}

/// The embedding API: `RunOptions::hard_stop` alone (no `shutdown`) stops a processor whose
/// exec handler would run 60 s, with a 600 s grace: `run` returns within seconds, the
/// program is gone, and the row is pending again with its attempt given back.
async fn hard_stop_alone_stops_the_processor(engine: &'static str) {
    use icq::{Processor, Registry, RunOptions, Settings};
    use tokio_util::sync::CancellationToken;

    let db = TestDb::with_table(engine, "hard_stop_api").await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let options = icq::ConnectOptions::for_settings(&Default::default());
    let source = icq::Queue::connect("main", &db.url, &Default::default(), &options)
        .await
        .unwrap();
    insert(&db, 1).await;
    let mut registry = Registry::new();
    let script = format!("echo $$ >> '{}'; exec sleep 60", pidfile.display());
    registry.insert_exec("sig.test", sh(script), None).unwrap();
    let mut processor = Processor::new(registry);
    processor
        .add_source(source.source_handle(Settings::default().with_polling_interval_seconds(0.1)));
    let hard_stop = CancellationToken::new();
    let options = RunOptions::default()
        .with_shutdown_grace(Duration::from_secs(600))
        .with_hard_stop(hard_stop.clone());
    let run = tokio::spawn(async move { processor.run(options, CancellationToken::new()).await });
    let pids = pids_in(&pidfile, 1).await;
    assert!(alive(pids[0]));

    let asked = Instant::now();
    hard_stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("run returned after the hard stop")
        .unwrap()
        .unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    // Reaped before `run` returned: not even a zombie.
    assert!(
        !Path::new(&format!("/proc/{}", pids[0])).exists(),
        "{engine}: the program outlived run"
    );
    let t = db.q("InternalCommands");
    let (a, l, p) = (db.q("Attempts"), db.q("LockToken"), db.q("ProcessedAt"));
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {a} = 0 AND {l} IS NULL AND {p} IS NULL"
        ))
        .await,
        1,
        "{engine}: released with its attempt given back"
    );
}

mod hard_stop_api {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::hard_stop_alone_stops_the_processor("sqlite").await
    }
}
