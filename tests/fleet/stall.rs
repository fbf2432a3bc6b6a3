//! Dead sockets: a TCP proxy written here stands between the processor
//! and the real server. On command it stops forwarding the connections it holds (they stay
//! open: half-open, as behind a stalled NAT or proxy) while new connections work, or it
//! refuses every connection (the server is gone) and later accepts again. Processing must
//! resume within a bound over new connections, and no command may run twice at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use icq::handler::FnHandler;
use icq::{ConnectOptions, Job, NewCommand, Processor, Queue, Registry, RunOptions, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::support::TestDb;

/// A TCP proxy to one upstream address.
struct Proxy {
    port: u16,
    upstream: String,
    /// Connections accepted with a generation below this stop forwarding.
    stall_below: Arc<AtomicU64>,
    generation: Arc<AtomicU64>,
    /// The accept loop and every connection's pumps (aborted by [`Proxy::refuse`]).
    tasks: Arc<Mutex<JoinSet<()>>>,
    accepting: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free local port to `upstream` (`host:port`).
    async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut proxy = Proxy {
            port,
            upstream: upstream.to_owned(),
            stall_below: Arc::new(AtomicU64::new(0)),
            generation: Arc::new(AtomicU64::new(0)),
            tasks: Arc::new(Mutex::new(JoinSet::new())),
            accepting: None,
        };
        proxy.accept(listener);
        proxy
    }

    fn accept(&mut self, listener: TcpListener) {
        let (upstream, stall_below, generation, tasks) = (
            self.upstream.clone(),
            self.stall_below.clone(),
            self.generation.clone(),
            self.tasks.clone(),
        );
        self.accepting = Some(tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let mine = generation.fetch_add(1, Ordering::AcqRel);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let mut tasks = tasks.lock().unwrap();
                tasks.spawn(pump(cr, sw, mine, stall_below.clone()));
                tasks.spawn(pump(sr, cw, mine, stall_below.clone()));
            }
        }));
    }

    /// The connections open now stop forwarding (and stay open); new ones work.
    fn stall(&self) {
        self.stall_below
            .store(self.generation.load(Ordering::Acquire), Ordering::Release);
    }

    /// Closes the listener and every connection: connecting is refused until [`Proxy::accept_again`].
    fn refuse(&mut self) {
        if let Some(accepting) = self.accepting.take() {
            accepting.abort();
        }
        self.tasks.lock().unwrap().abort_all();
    }

    /// Closes the listener only: new connections are refused, the open ones go on as
    /// they were (forwarding, or stalled).
    fn stop_accepting(&mut self) {
        if let Some(accepting) = self.accepting.take() {
            accepting.abort();
        }
    }

    /// Listens on the same port again.
    async fn accept_again(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(listener) => break listener,
                Err(err) if Instant::now() < deadline => {
                    eprintln!("rebinding {}: {err}", self.port);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(err) => panic!("cannot listen on {} again: {err}", self.port),
            }
        };
        self.accept(listener);
    }

    /// `url` with its host and port replaced by the proxy's.
    fn url(&self, url: &str) -> String {
        let mut parsed = url::Url::parse(url).unwrap();
        parsed.set_host(Some("127.0.0.1")).unwrap();
        parsed.set_port(Some(self.port)).unwrap();
        parsed.to_string()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.refuse();
    }
}

/// Copies `from` to `to` until either closes; once the connection's generation is stalled,
/// reads and drops what arrives and never writes again (the socket stays open).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    generation: u64,
    stall_below: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if generation < stall_below.load(Ordering::Acquire) {
            // Half-open: hold both sockets, forward nothing.
            let _keep = to;
            loop {
                if from.read(&mut buf).await.unwrap_or(0) == 0 {
                    std::future::pending::<()>().await;
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The upstream `host:port` of a test server URL.
fn upstream(url: &str) -> String {
    let parsed = url::Url::parse(url).unwrap();
    format!(
        "{}:{}",
        parsed.host_str().unwrap(),
        parsed.port_or_known_default().unwrap_or(3306)
    )
}

/// Per command: how many times it ran, and whether two runs ever overlapped.
#[derive(Default)]
struct Runs {
    runs: HashMap<String, u32>,
    running: std::collections::HashSet<String>,
    overlaps: Vec<String>,
}

/// A registry whose `stall.work` handler takes `work` and records its runs.
fn registry(runs: Arc<Mutex<Runs>>, work: Duration) -> Registry {
    let mut registry = Registry::new();
    registry
        .insert(
            "stall.work",
            Arc::new(FnHandler(move |job: Job| {
                let runs = runs.clone();
                async move {
                    let id = job.id.to_string();
                    {
                        let mut runs = runs.lock().unwrap();
                        *runs.runs.entry(id.clone()).or_default() += 1;
                        if !runs.running.insert(id.clone()) {
                            runs.overlaps.push(id.clone());
                        }
                    }
                    tokio::time::sleep(work).await;
                    runs.lock().unwrap().running.remove(&id);
                    Ok(())
                }
            })),
        )
        .unwrap();
    registry
}

async fn completed(db: &TestDb) -> i64 {
    let (t, p) = (db.all_rows(), db.q("ProcessedAt"));
    db.scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {p} IS NOT NULL"))
        .await
}

/// Polls the database (directly, not through the proxy) until more than `than` rows are
/// completed; how long that took, or `None` after `limit`.
async fn completions_after(db: &TestDb, than: i64, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if completed(db).await > than {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

const COMMANDS: usize = 60;

/// The processor drains through the proxy; mid-drain every open connection stalls.
async fn stalled_connections_are_abandoned(engine: &'static str) {
    let db = TestDb::with_table(engine, "stall").await;
    let proxy = Proxy::start(&upstream(&db.url)).await;
    let queue = Queue::connect(
        "stall",
        &proxy.url(&db.url),
        &Default::default(),
        &ConnectOptions::default(),
    )
    .await
    .unwrap();
    let commands: Vec<NewCommand> = (0..COMMANDS)
        .map(|i| NewCommand::new("stall.work", serde_json::json!({ "i": i })))
        .collect();
    queue.schedule_many(&commands).await.unwrap();
    let runs = Arc::new(Mutex::new(Runs::default()));
    let mut processor = Processor::new(registry(runs.clone(), Duration::from_millis(100)));
    // A 3 s lease: database calls are abandoned after 1 s (a tenth, at least 1 s).
    let settings = Settings::default()
        .with_lease_seconds(3)
        .with_polling_interval_seconds(0.2)
        .with_concurrency(4)
        .with_batch_size(4);
    processor.add_source(queue.source_handle(settings));
    let run = tokio::spawn(async move {
        let options = RunOptions::default().with_until_idle(true);
        processor.run(options, CancellationToken::new()).await
    });
    assert!(
        completions_after(&db, 8, Duration::from_secs(30))
            .await
            .is_some(),
        "{engine}: processing started"
    );
    let at_stall = completed(&db).await;
    proxy.stall();
    let resumed = completions_after(&db, at_stall + 4, Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("{engine}: processing did not resume within 20 s of the stall"));
    eprintln!(
        "{engine}: 4 more commands completed {} ms after every open connection stalled",
        resumed.as_millis()
    );
    // Calls are abandoned after 1 s (a tenth of the 3 s lease, at least 1 s); the slack
    // is for a loaded CI machine.
    assert!(
        resumed < Duration::from_secs(8),
        "{engine}: resumed after {resumed:?}"
    );
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("drained within a minute")
        .unwrap()
        .expect("the processor kept running through the stall");
    assert_eq!(
        completed(&db).await,
        COMMANDS as i64,
        "{engine}: every command completed"
    );
    let runs = std::mem::take(&mut *runs.lock().unwrap());
    assert!(
        runs.overlaps.is_empty(),
        "{engine}: ran twice at once: {:?}",
        runs.overlaps
    );
    let (t, a, i) = (db.all_rows(), db.q("Attempts"), db.q("Id"));
    for (id, n) in &runs.runs {
        if *n > 1 {
            // A second run only after a lease lapse: its claim consumed another attempt.
            let attempts = db
                .scalar_i64(&format!("SELECT {a} FROM {t} WHERE {i} = '{id}'"))
                .await;
            assert!(
                attempts >= i64::from(*n),
                "{engine}: {id} ran {n} times in {attempts} attempts"
            );
        }
    }
    let reruns: u32 = runs.runs.values().map(|n| n - 1).sum();
    eprintln!("{engine}: {reruns} re-runs after the stall (each after its lease lapsed)");
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stalled_connections_are_abandoned() {
    stalled_connections_are_abandoned("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_stalled_connections_are_abandoned() {
    stalled_connections_are_abandoned("mysql").await;
}

/// A URL listing the proxy first and the server itself second, in libpq's query form.
fn proxy_then_server(proxy: &Proxy, url: &str) -> String {
    let parsed = url::Url::parse(url).unwrap();
    format!(
        "postgres://{}@/{}?host=127.0.0.1,{}&port={},{}",
        parsed.username(),
        parsed.path().trim_start_matches('/'),
        parsed.host_str().unwrap(),
        proxy.port,
        parsed.port().unwrap_or(5432)
    )
}

/// The first of two hosts stops answering on every open connection and refuses new ones
/// (a server frozen and then cut off): nothing ever fails with an error, since the pool
/// retries a refused connect inside each call until the call's deadline abandons it.
/// Processing moves to the second host within a few deadlines, with no command run twice
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_host_that_goes_silent_is_left_for_the_next() {
    let db = TestDb::with_table("postgres", "silent").await;
    let mut proxy = Proxy::start(&upstream(&db.url)).await;
    let url = proxy_then_server(&proxy, &db.url);
    let queue = Queue::connect(
        "silent",
        &url,
        &Default::default(),
        &ConnectOptions::default(),
    )
    .await
    .unwrap();
    let commands: Vec<NewCommand> = (0..COMMANDS)
        .map(|i| NewCommand::new("stall.work", serde_json::json!({ "i": i })))
        .collect();
    queue.schedule_many(&commands).await.unwrap();
    let runs = Arc::new(Mutex::new(Runs::default()));
    let mut processor = Processor::new(registry(runs.clone(), Duration::from_millis(100)));
    // A 3 s lease: database calls are abandoned after 1 s (a tenth, at least 1 s). Polling
    // every 30 s: the LISTEN connection is silent too, so the poll is no way back.
    let settings = Settings::default()
        .with_lease_seconds(3)
        .with_polling_interval_seconds(30.0)
        .with_concurrency(4)
        .with_batch_size(4);
    processor.add_source(queue.source_handle(settings));
    let run = tokio::spawn(async move {
        let options = RunOptions::default().with_until_idle(true);
        processor.run(options, CancellationToken::new()).await
    });
    assert!(
        completions_after(&db, 8, Duration::from_secs(30))
            .await
            .is_some(),
        "processing started"
    );
    let at_stall = completed(&db).await;
    proxy.stall();
    proxy.stop_accepting();
    let resumed = completions_after(&db, at_stall + 4, Duration::from_secs(30))
        .await
        .expect("processing did not move to the second host within 30 s");
    eprintln!(
        "4 more commands completed {} ms after the first host went silent",
        resumed.as_millis()
    );
    // A deadline of 1 s to notice, the watcher's look (at most 2 s per silent host),
    // then the retry; the slack is for a loaded CI machine.
    assert!(
        resumed < Duration::from_secs(10),
        "resumed after {resumed:?}"
    );
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("drained within a minute")
        .unwrap()
        .expect("the processor kept running through the switch");
    assert_eq!(
        completed(&db).await,
        COMMANDS as i64,
        "every command completed"
    );
    let runs = std::mem::take(&mut *runs.lock().unwrap());
    assert!(
        runs.overlaps.is_empty(),
        "ran twice at once: {:?}",
        runs.overlaps
    );
    drop(proxy);
}

/// A long-running processor through the proxy; the proxy refuses every connection for a
/// while (long enough for retries to back off to their cap), then accepts again:
/// commands scheduled meanwhile complete within 5 s of the return.
async fn resumes_within_5_s_of_the_servers_return(engine: &'static str) {
    let db = TestDb::with_table(engine, "back").await;
    let mut proxy = Proxy::start(&upstream(&db.url)).await;
    let queue = Queue::connect(
        "back",
        &proxy.url(&db.url),
        &Default::default(),
        &ConnectOptions::default(),
    )
    .await
    .unwrap();
    let direct = Queue::connect(
        "direct",
        &db.url,
        &Default::default(),
        &ConnectOptions::default(),
    )
    .await
    .unwrap();
    let runs = Arc::new(Mutex::new(Runs::default()));
    let mut processor = Processor::new(registry(runs.clone(), Duration::from_millis(1)));
    let settings = Settings::default()
        .with_lease_seconds(30)
        .with_polling_interval_seconds(0.5);
    processor.add_source(queue.source_handle(settings));
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { processor.run(RunOptions::default(), stop).await }
    });
    direct
        .schedule(&NewCommand::new("stall.work", serde_json::json!({})))
        .await
        .unwrap();
    assert!(
        completions_after(&db, 0, Duration::from_secs(20))
            .await
            .is_some(),
        "{engine}: processing started"
    );
    proxy.refuse();
    let outage = Duration::from_secs(8);
    let down = Instant::now();
    direct
        .schedule(&NewCommand::new(
            "stall.work",
            serde_json::json!({"during": "outage"}),
        ))
        .await
        .unwrap();
    tokio::time::sleep(outage.saturating_sub(down.elapsed())).await;
    assert_eq!(
        completed(&db).await,
        1,
        "{engine}: nothing ran while the server was gone"
    );
    proxy.accept_again().await;
    let back = completions_after(&db, 1, Duration::from_secs(15)).await;
    stop.cancel();
    run.await
        .unwrap()
        .expect("the processor kept running through the outage");
    let back =
        back.unwrap_or_else(|| panic!("{engine}: nothing completed within 15 s of the return"));
    eprintln!(
        "{engine}: after an {} s outage the first command completed {} ms after the server was back",
        outage.as_secs(),
        back.as_millis()
    );
    assert!(
        back < Duration::from_secs(5),
        "{engine}: resumed after {back:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_resumes_within_5_s_of_the_servers_return() {
    resumes_within_5_s_of_the_servers_return("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_resumes_within_5_s_of_the_servers_return() {
    resumes_within_5_s_of_the_servers_return("mysql").await;
}

/// `icq work` whose database vanishes (every connection closed, new ones refused) while
/// its handlers run, so their outcomes cannot be written; then `signals` (a pause between
/// them): the worker exits within `limit` of the last signal with `code`.
async fn exits_with_its_database_gone(
    engine: &'static str,
    grace: &str,
    signals: &[nix::sys::signal::Signal],
    limit: Duration,
    code: i32,
) {
    let db = TestDb::with_table(engine, "vanished").await;
    super::insert_many(&db, "vanish.work", 8).await;
    let mut proxy = Proxy::start(&upstream(&db.url)).await;
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let config = super::write_config(
        dir.path(),
        &proxy.url(&db.url),
        "      concurrency: 4\n      batch_size: 4\n      polling_interval_seconds: 0.2",
        &super::recording_handler("vanish.work", &started, "sleep 2"),
    );
    let log = dir.path().join("worker.log");
    let mut worker = super::Replica::start(&[], &config, &["--grace-seconds", grace], &[], &log);
    assert!(
        super::wait_until(Duration::from_secs(30), || async {
            super::lines(&started).len() >= 4
        })
        .await,
        "{engine}: the handlers never started: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    proxy.refuse();
    // The handlers end and their outcomes cannot be written.
    assert!(
        super::wait_until(Duration::from_secs(30), || async {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("stamp")
        })
        .await,
        "{engine}: no stamp failed: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let mut last = Instant::now();
    for (i, signal) in signals.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        worker.signal(*signal);
        last = Instant::now();
    }
    let status = worker.wait(limit + Duration::from_secs(20)).await;
    let took = last.elapsed();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("{engine}: still running after {took:?}: {text}"));
    eprintln!("{engine}: exited {status:?} {took:?} after the last signal");
    assert_eq!(status.code(), Some(code), "{engine}: {text}");
    assert!(
        took < limit,
        "{engine}: exited {took:?} after the last signal: {text}"
    );
}

/// A second SIGTERM ends a worker whose database vanished within 10 s, with exit 143.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_database_vanished_exits_within_10_s_of_a_second_signal() {
    use nix::sys::signal::Signal::SIGTERM;
    for engine in ["postgres", "mysql"] {
        exits_with_its_database_gone(
            engine,
            "600",
            &[SIGTERM, SIGTERM],
            Duration::from_secs(10),
            143,
        )
        .await;
    }
}

/// A first signal alone ends a worker whose database vanished within its grace plus the
/// bounded time given to the last writes, with exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_signal_alone_ends_within_the_grace_and_the_write_deadline() {
    use nix::sys::signal::Signal::SIGTERM;
    exits_with_its_database_gone("postgres", "1", &[SIGTERM], Duration::from_secs(20), 0).await;
}

/// `Queue::close()` of an embedded queue whose server stopped answering (every open
/// connection stalled, as during a machine stall) returns within a bound instead of
/// waiting on its connections (the LISTEN connection's `UNLISTEN *` among them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_queue_whose_server_stalled_is_bounded() {
    let db = TestDb::with_table("postgres", "close_stall").await;
    let proxy = Proxy::start(&upstream(&db.url)).await;
    let queue = Queue::connect(
        "close",
        &proxy.url(&db.url),
        &Default::default(),
        &ConnectOptions::default(),
    )
    .await
    .unwrap();
    let runs = Arc::new(Mutex::new(Runs::default()));
    let mut processor = Processor::new(registry(runs.clone(), Duration::from_millis(10)));
    processor
        .add_source(queue.source_handle(Settings::default().with_polling_interval_seconds(0.2)));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { processor.run(RunOptions::default(), shutdown).await }
    });
    queue
        .schedule(&NewCommand::new("stall.work", serde_json::json!({})))
        .await
        .unwrap();
    assert!(
        crate::wait_until(Duration::from_secs(30), || async {
            runs.lock().unwrap().runs.len() == 1
        })
        .await,
        "the command never ran"
    );
    shutdown.cancel();
    run.await.unwrap().unwrap();
    proxy.stall();
    let asked = Instant::now();
    tokio::time::timeout(Duration::from_secs(60), queue.close())
        .await
        .expect("close() returned");
    let took = asked.elapsed();
    eprintln!("close() took {took:?}");
    assert!(took < Duration::from_secs(10), "close() took {took:?}");
}
