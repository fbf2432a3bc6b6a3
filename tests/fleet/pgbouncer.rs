//! PgBouncer: Debian's `pgbouncer` with its default startup
//! parameter handling (no `ignore_startup_parameters`), started by each test on a port of
//! its own in front of a PostgreSQL cluster of the test's own, and 4 `icq work` replicas
//! draining 20,000 commands through it:
//!
//! - session mode works as a direct connection, LISTEN included;
//! - transaction mode with `pooler: transaction` drains by polling alone, with no named
//!   prepared statement and no failed statement, and says so at startup;
//! - transaction mode without the setting fails at once with an error naming it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;

use crate::failover::{
    COMMANDS, COMPLETED, Cluster, Guarded, REPLICAS, Scratch, as_postgres, free_port, icq_bin,
    logs, start_worker, table_with_commands, try_count, wait_count, wait_count_while, write_config,
};

/// A `pgbouncer` process of the test's own, in front of `cluster`; killed when dropped.
struct Bouncer {
    process: Guarded,
    port: u16,
}

impl Bouncer {
    /// Starts PgBouncer in `mode` (`session` or `transaction`) and waits until it accepts
    /// connections. Only what a test machine needs is set: its port, trust
    /// authentication, and pool sizes that fit 4 replicas' pools; startup parameters are
    /// handled as the package ships them (`ignore_startup_parameters` is not set).
    fn start(scratch: &Scratch, cluster: &Cluster, mode: &str) -> Bouncer {
        let dir = scratch.path();
        let port = free_port();
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").expect("write userlist");
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {}\npool_mode = {mode}\n\
                 max_client_conn = 400\ndefault_pool_size = 60\n\
                 logfile = {}\n",
                cluster.port,
                dir.join("userlist.txt").display(),
                dir.join("pgbouncer.log").display()
            ),
        )
        .expect("write pgbouncer.ini");
        let log = dir.join("pgbouncer.out");
        let out = std::fs::File::create(&log).expect("create the pgbouncer output file");
        let err = out.try_clone().expect("clone the output file");
        let child = as_postgres("pgbouncer", dir)
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start pgbouncer (the `pgbouncer` package)");
        let mut process = Guarded { child, log };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                process.alive() && started.elapsed() < Duration::from_secs(20),
                "pgbouncer did not start:\n{}",
                process.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Bouncer { process, port }
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

/// A cluster of the test's own with the commands table holding `n` commands, and a
/// PgBouncer in `mode` in front of it.
async fn setup(mode: &str, n: i64) -> (Scratch, Cluster, Bouncer) {
    let scratch = Scratch::new();
    let cluster = Cluster::init(&scratch, "db");
    cluster.start();
    table_with_commands(&cluster.url("postgres"), n).await;
    let bouncer = Bouncer::start(&scratch, &cluster, mode);
    (scratch, cluster, bouncer)
}

/// Starts 4 replicas on `config`, waits for the whole drain (counted on the server
/// directly) and checks it: every command completed exactly once (one attempt each),
/// none dead-lettered. Returns the replicas (still running) and the drain's wall time.
async fn drain(cluster: &Cluster, config: &Path, dir: &Path) -> (Vec<Guarded>, Duration) {
    let started = Instant::now();
    let mut workers: Vec<Guarded> = (0..REPLICAS)
        .map(|i| start_worker(config, &[], dir, &format!("w{i}")))
        .collect();
    let db = cluster.url("postgres");
    let finished = wait_count_while(
        &db,
        COMPLETED,
        COMMANDS,
        Duration::from_secs(300),
        &mut workers,
    )
    .await;
    let done = try_count(&db, COMPLETED).await;
    assert!(
        finished.is_some(),
        "the drain through PgBouncer stopped at {done:?} of {COMMANDS}:\n{}",
        logs(&workers)
    );
    let took = started.elapsed();
    let repeated = try_count(
        &db,
        r#"SELECT count(*) FROM "InternalCommands" WHERE "Attempts" <> 1 OR "DeadLetteredAt" IS NOT NULL"#,
    )
    .await;
    assert_eq!(
        repeated,
        Some(0),
        "without a crash every command runs once and completes"
    );
    (workers, took)
}

/// Stops every replica with SIGTERM and checks each exits 0.
async fn stop_all(workers: &mut [Guarded]) {
    for worker in workers.iter_mut() {
        let status = worker.stop(Duration::from_secs(30)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "a worker did not stop cleanly ({status:?}):\n{}",
            worker.log_text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_drains_like_a_direct_connection_with_listen() {
    let (scratch, cluster, bouncer) = setup("session", COMMANDS).await;
    // Polling every 30 s: the wake-up at the end can only come from LISTEN.
    let config = write_config(
        scratch.path(),
        "icq.yaml",
        &bouncer.url("postgres"),
        "      polling_interval_seconds: 30\n",
    );
    let (mut workers, took) = drain(&cluster, &config, scratch.path()).await;

    // An insert on the server (not through the pooler) wakes a replica through its
    // LISTEN session behind PgBouncer.
    let mut conn = sqlx::PgConnection::connect(&cluster.url("postgres"))
        .await
        .expect("connect to the server");
    let inserted = Instant::now();
    sqlx::raw_sql(
        r#"INSERT INTO "InternalCommands" ("Type", "Payload") VALUES ('fleet.noop', '{}')"#,
    )
    .execute(&mut conn)
    .await
    .expect("insert one more command");
    let woken = wait_count(
        &cluster.url("postgres"),
        COMPLETED,
        COMMANDS + 1,
        Duration::from_secs(10),
    )
    .await;
    assert!(
        woken.is_some(),
        "a new command waited for the 30 s poll: LISTEN does not work through PgBouncer in session mode\n{}",
        logs(&workers)
    );
    let wake = woken
        .map(|at| at.duration_since(inserted))
        .unwrap_or_default();
    stop_all(&mut workers).await;
    assert!(
        !bouncer
            .process
            .log_text()
            .contains("unsupported startup parameter"),
        "{}",
        bouncer.process.log_text()
    );
    eprintln!(
        "pgbouncer session mode: {COMMANDS} commands, {REPLICAS} replicas, drained in {:.1} s \
         ({:.0}/s); LISTEN wake-up {:.0} ms",
        took.as_secs_f64(),
        COMMANDS as f64 / took.as_secs_f64(),
        wake.as_secs_f64() * 1000.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_drains_by_polling_with_the_pooler_setting() {
    let (scratch, cluster, bouncer) = setup("transaction", COMMANDS).await;
    let config = write_config(
        scratch.path(),
        "icq.yaml",
        &bouncer.url("postgres"),
        "      pooler: transaction\n      polling_interval_seconds: 0.2\n",
    );
    let (mut workers, took) = drain(&cluster, &config, scratch.path()).await;
    stop_all(&mut workers).await;
    for worker in &workers {
        let log = worker.log_text();
        assert!(
            log.contains("pooler: transaction: no LISTEN"),
            "icq should say at startup that it polls:\n{log}"
        );
        // Not one statement failed: no claim or stamp was retried, no statement was
        // missing on the server connection its execution reached.
        for bad in ["does not exist", "WARN", "ERROR"] {
            assert!(!log.contains(bad), "`{bad}` in a worker's log:\n{log}");
        }
    }
    eprintln!(
        "pgbouncer transaction mode (pooler: transaction): {COMMANDS} commands, {REPLICAS} \
         replicas, drained in {:.1} s ({:.0}/s)",
        took.as_secs_f64(),
        COMMANDS as f64 / took.as_secs_f64()
    );
    drop(bouncer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_without_the_setting_fails_naming_it() {
    let (scratch, cluster, bouncer) = setup("transaction", 10).await;
    let config = write_config(scratch.path(), "icq.yaml", &bouncer.url("postgres"), "");
    let out = Command::new(icq_bin())
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run icq work");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "icq work ran through a transaction pooler:\n{stderr}"
    );
    assert!(
        stderr.contains("set `pooler: transaction`"),
        "the error should name the setting:\n{stderr}"
    );
    assert!(!stderr.contains("does not exist"), "{stderr}");
    // Nothing was claimed.
    let untouched = try_count(
        &cluster.url("postgres"),
        r#"SELECT count(*) FROM "InternalCommands" WHERE "Attempts" = 0"#,
    )
    .await;
    assert_eq!(untouched, Some(10));
    eprintln!(
        "pgbouncer transaction mode without the setting: {}",
        stderr.trim()
    );
}

/// `Queue::from_pool` on an application's pool that goes through PgBouncer in
/// transaction mode (its statement cache and `extra_float_digits` startup parameter off, as
/// such a pool needs) finds the pooler by
/// itself, and the in-process processor drains by polling, each statement in its own
/// transaction; the application's pool is left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_pool_through_transaction_mode_finds_the_pooler_and_drains() {
    use icq::{Processor, Queue, Registry, RunOptions, Settings, TableName};
    use std::str::FromStr;

    // What the driver says while it starts and runs: it should find the pooler.
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let sink = log.clone();
    // Global: the driver logs from the runtime's worker threads (nextest gives each test a
    // process of its own).
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(move || Sink(sink.clone()))
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish(),
    )
    .expect("no other subscriber in this test's process");
    let (_scratch, cluster, bouncer) = setup("transaction", 300).await;
    let options = sqlx::postgres::PgConnectOptions::from_str(&bouncer.url("postgres"))
        .expect("the pooler's URL")
        .statement_cache_capacity(0)
        .extra_float_digits(None);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(12)
        .connect_with(options)
        .await
        .expect("the application's pool");
    let queue = Queue::from_pool("shop", &pool, &TableName::default())
        .await
        .expect("from_pool through the pooler");
    let mut registry = Registry::new();
    registry
        .insert("fleet.noop", std::sync::Arc::new(icq::handler::Noop))
        .unwrap();
    let mut processor = Processor::new(registry);
    processor
        .add_source(queue.source_handle(Settings::default().with_polling_interval_seconds(0.1)));
    tokio::time::timeout(
        Duration::from_secs(120),
        processor.run(
            RunOptions::default().with_until_idle(true),
            Default::default(),
        ),
    )
    .await
    .expect("drained within 120 s")
    .expect("the processor ran");
    let once = try_count(
        &cluster.url("postgres"),
        r#"SELECT count(*) FROM "InternalCommandsHistory" WHERE "Attempts" = 1"#,
    )
    .await;
    assert_eq!(
        once,
        Some(300),
        "every command completed on its first attempt"
    );
    assert_eq!(queue.stats().snapshot().succeeded, 300);
    let log = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert!(
        log.contains("pooler: transaction: no LISTEN"),
        "the pooler should have been found:\n{log}"
    );
    for bad in ["does not exist", "WARN", "ERROR"] {
        assert!(!log.contains(bad), "`{bad}` in the log:\n{log}");
    }
    queue.close().await;
    assert!(!pool.is_closed());
    drop(bouncer);
}
