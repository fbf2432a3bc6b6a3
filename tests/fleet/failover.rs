//! Failover: a URL naming two hosts, a primary and a
//! **synchronous** streaming standby started by the test (two clusters of its own on free
//! ports), 4 `icq work` replicas draining 20,000 commands; in the middle of the drain the
//! primary is stopped and the standby promoted. Nothing is lost, every command run twice
//! was held by a replica at the failover, the same processes finish the drain (no
//! restart), and the LISTEN connection follows to the new primary.
//!
//! Also the helpers the PgBouncer tests share: scratch directories owned by `postgres`,
//! servers run as `postgres`, processes killed when a test ends, however it ends.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;

/// The commands each drain works off (the issue's number).
pub(crate) const COMMANDS: i64 = 20_000;

/// Replicas draining one table.
pub(crate) const REPLICAS: usize = 4;

/// The uid and gid of the `postgres` user, which the PostgreSQL servers and PgBouncer
/// (both refuse to run as root) run as.
pub(crate) fn postgres_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .expect("run id");
        assert!(out.status.success(), "no `postgres` user on this machine");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    (id("-u"), id("-g"))
}

/// `pg_config --bindir`: where initdb, pg_ctl and pg_basebackup are.
pub(crate) fn bindir() -> PathBuf {
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .expect("pg_config (PostgreSQL's server binaries) must be installed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A TCP port nothing listens on right now, and no other test process holds.
pub(crate) fn free_port() -> u16 {
    // Below the kernel's ephemeral range (32768–60999 by default): a port the kernel hands
    // out for `bind(0)` can go to any test's outgoing connection before the server binds
    // it (a Galera node once failed to start so, with "Address already in use").
    use rand::RngExt;
    let mut rng = rand::rng();
    for _ in 0..1_000 {
        let port = rng.random_range(15_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() && hold_port(port) {
            return port;
        }
    }
    panic!("no free port between 15000 and 32000");
}

/// Holds `port` for this process's life with a lock file, so a test running beside this
/// one (a process of its own) never picks it in the seconds before this test's server
/// binds it (a Galera node's port, picked at the cluster's start, is bound only after the
/// state transfer). `false`: another process holds it.
fn hold_port(port: u16) -> bool {
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("icq-test-ports");
    std::fs::create_dir_all(&dir).expect("create the ports' lock directory");
    match crate::support::try_hold(&dir.join(format!("{port}.lock"))) {
        Some(file) => {
            HELD.lock().unwrap().push(file);
            true
        }
        None => false,
    }
}

/// A command that runs as the `postgres` user, with a clean locale.
pub(crate) fn as_postgres(program: impl AsRef<std::ffi::OsStr>, home: &Path) -> Command {
    let (uid, gid) = postgres_ids();
    let mut cmd = Command::new(program);
    cmd.uid(uid)
        .gid(gid)
        .env("HOME", home)
        .env("LC_ALL", "C")
        .env_remove("PGPORT")
        .env_remove("PGHOST")
        .env_remove("PGDATA")
        .current_dir(home);
    cmd
}

/// Runs `cmd` to completion; panics with its output if it fails.
pub(crate) fn run(mut cmd: Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temporary directory owned by `postgres` (removed when dropped).
pub(crate) struct Scratch {
    pub(crate) dir: tempfile::TempDir,
}

impl Scratch {
    pub(crate) fn new() -> Scratch {
        let dir = tempfile::tempdir().expect("temp dir");
        let (uid, gid) = postgres_ids();
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown the temp dir");
        Scratch { dir }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A PostgreSQL cluster of the test's own; stopped (immediately) when dropped.
pub(crate) struct Cluster {
    pub(crate) data: PathBuf,
    pub(crate) port: u16,
    home: PathBuf,
}

impl Cluster {
    /// `initdb` (trust authentication) and settings for a primary that streams WAL.
    pub(crate) fn init(scratch: &Scratch, name: &str) -> Cluster {
        let data = scratch.path().join(name);
        let mut initdb = as_postgres(bindir().join("initdb"), scratch.path());
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        ]);
        run(initdb, "initdb");
        let cluster = Cluster {
            data,
            port: free_port(),
            home: scratch.path().to_path_buf(),
        };
        cluster.append_conf(&format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
             wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\nfsync = off\n\
             max_connections = 200\nshared_buffers = 32MB\n",
            cluster.port,
            scratch.path().display()
        ));
        cluster
    }

    /// `pg_basebackup -R` of `primary` into a standby on a port of its own.
    pub(crate) fn standby_of(primary: &Cluster, scratch: &Scratch, name: &str) -> Cluster {
        let data = scratch.path().join(name);
        let mut backup = as_postgres(bindir().join("pg_basebackup"), scratch.path());
        backup
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-X",
                "stream",
                "-R",
                "--no-sync",
            ])
            .arg("-p")
            .arg(primary.port.to_string())
            .arg("-D")
            .arg(&data);
        run(backup, "pg_basebackup");
        let cluster = Cluster {
            data,
            port: free_port(),
            home: scratch.path().to_path_buf(),
        };
        cluster.append_conf(&format!("port = {}\n", cluster.port));
        cluster
    }

    fn append_conf(&self, text: &str) {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data.join("postgresql.conf"))
            .expect("open postgresql.conf");
        file.write_all(text.as_bytes())
            .expect("write postgresql.conf");
    }

    fn pg_ctl(&self, args: &[&str]) -> Command {
        let mut cmd = as_postgres(bindir().join("pg_ctl"), &self.home);
        cmd.arg("-D").arg(&self.data).args(args);
        cmd
    }

    pub(crate) fn start(&self) {
        let log = self.data.with_extension("log");
        let mut cmd = self.pg_ctl(&["-w", "-t", "60", "start", "-l"]);
        cmd.arg(&log);
        run(cmd, "pg_ctl start");
    }

    /// A clean, fast shutdown (`pg_ctl stop -m fast`): the WAL is streamed to the standby
    /// before the server exits.
    pub(crate) fn stop(&self) {
        run(self.pg_ctl(&["-w", "-m", "fast", "stop"]), "pg_ctl stop");
    }

    pub(crate) fn promote(&self) {
        run(self.pg_ctl(&["-w", "promote"]), "pg_ctl promote");
    }

    pub(crate) fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            let _ = self
                .pg_ctl(&["-w", "-m", "immediate", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A child process killed (and reaped) when dropped.
pub(crate) struct Guarded {
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

impl Guarded {
    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Whether the process still exists (`/proc/<pid>`, and not reaped as exited).
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
            && Path::new(&format!("/proc/{}", self.pid())).exists()
    }

    /// SIGTERM, then waits up to `limit` for the exit status.
    pub(crate) async fn stop(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        );
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Writes an icq.yaml with one source `fleet` on `url` (extra `settings` lines, indented
/// by 6) and a `fleet.noop` handler.
pub(crate) fn write_config(dir: &Path, name: &str, url: &str, settings: &str) -> PathBuf {
    let path = dir.join(name);
    let text = format!(
        "sources:\n  - name: fleet\n    url: {}\n    settings:\n{settings}\
         handlers:\n  fleet.noop:\n    noop: true\n",
        serde_json::to_string(url).unwrap()
    );
    std::fs::write(&path, text).expect("write icq.yaml");
    path
}

/// The `icq` binary under test: cargo's, or `$ICQ_TEST_BIN` (a copy taken right after
/// the build, where several checkouts share one target directory).
pub(crate) fn icq_bin() -> PathBuf {
    std::env::var_os("ICQ_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_icq")))
}

/// Starts `icq work --config <config> <extra…>` with its stderr in `<dir>/<name>.log`.
pub(crate) fn start_worker(config: &Path, extra: &[&str], dir: &Path, name: &str) -> Guarded {
    let log = dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log).expect("create the worker log");
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
    Guarded { child, log }
}

/// Creates the default commands table through `url` and inserts `n` `fleet.noop`
/// commands in one statement.
pub(crate) async fn table_with_commands(url: &str, n: i64) {
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    let ddl = icq::schema::render(icq::Engine::Postgres, &icq::TableName::default()).up;
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&mut conn)
        .await
        .expect("create the table");
    sqlx::query(
        r#"INSERT INTO "InternalCommands" ("Type", "Payload")
           SELECT 'fleet.noop', jsonb_build_object('n', n) FROM generate_series(1, $1) AS n"#,
    )
    .bind(n)
    .execute(&mut conn)
    .await
    .expect("insert the commands");
}

/// One integer from `sql` on `url`, or `None` when the server cannot answer now.
pub(crate) async fn try_count(url: &str, sql: &str) -> Option<i64> {
    let mut conn = sqlx::PgConnection::connect(url).await.ok()?;
    let n = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&mut conn)
        .await
        .ok();
    let _ = conn.close().await;
    n
}

/// Completed commands: in the history table (schema version 3).
pub(crate) const COMPLETED: &str = r#"SELECT count(*) FROM "InternalCommandsHistory""#;

/// Polls `sql` on `url` every 20 ms until it reaches `at_least`; the moment it did, or
/// `None` after `limit`.
pub(crate) async fn wait_count(
    url: &str,
    sql: &str,
    at_least: i64,
    limit: Duration,
) -> Option<Instant> {
    wait_count_while(url, sql, at_least, limit, &mut []).await
}

/// [`wait_count`], giving up early when one of `workers` has exited.
pub(crate) async fn wait_count_while(
    url: &str,
    sql: &str,
    at_least: i64,
    limit: Duration,
    workers: &mut [Guarded],
) -> Option<Instant> {
    let started = Instant::now();
    let mut conn: Option<sqlx::PgConnection> = None;
    while started.elapsed() < limit {
        if workers.iter_mut().any(|w| !w.alive()) {
            return None;
        }
        if conn.is_none() {
            conn = sqlx::PgConnection::connect(url).await.ok();
        }
        if let Some(c) = conn.as_mut() {
            match sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
                .fetch_one(&mut *c)
                .await
            {
                Ok(n) if n >= at_least => return Some(Instant::now()),
                Ok(_) => {}
                Err(_) => conn = None,
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The logs of every worker, for failure messages.
pub(crate) fn logs(workers: &[Guarded]) -> String {
    workers
        .iter()
        .map(|w| {
            let text = w.log_text();
            let lines: Vec<&str> = text.lines().collect();
            format!(
                "--- {}:\n{}",
                w.log.display(),
                lines[lines.len().saturating_sub(15)..].join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Ids of commands leased and not finished, read from `url`.
async fn held(url: &str) -> std::collections::HashSet<String> {
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar::<_, String>(
        r#"SELECT "Id"::text FROM "InternalCommands"
           WHERE "LockToken" IS NOT NULL AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#,
    )
    .fetch_all(&mut conn)
    .await
    .expect("read the held commands")
    .into_iter()
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_survives_promotion_of_a_synchronous_standby() {
    let scratch = Scratch::new();
    let primary = Cluster::init(&scratch, "primary");
    primary.start();
    let standby = Cluster::standby_of(&primary, &scratch, "standby");
    standby.start();
    // Synchronous on the primary only: the standby's copy of the configuration must not
    // wait for a standby of its own once promoted.
    {
        let mut conn = sqlx::PgConnection::connect(&primary.url("postgres"))
            .await
            .expect("connect to the primary");
        for sql in [
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
            "SELECT pg_reload_conf()",
        ] {
            sqlx::raw_sql(sql)
                .execute(&mut conn)
                .await
                .expect("make the standby synchronous");
        }
    }
    let sync = wait_count(
        &primary.url("postgres"),
        "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync' AND state = 'streaming'",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert!(
        sync.is_some(),
        "the standby never became a synchronous streaming standby"
    );

    table_with_commands(&primary.url("postgres"), COMMANDS - 1).await;
    // The standby listed first is skipped: a write through the library lands on the
    // primary. With `target_session_attrs=any` the standby is taken, and the write fails
    // read-only (SQLSTATE 25006).
    let table = icq::TableName::default();
    let standby_first = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
        standby.port, primary.port
    );
    let queue = icq::Queue::connect("fleet", &standby_first, &table, &Default::default())
        .await
        .expect("connect with the standby listed first");
    queue
        .schedule(&icq::NewCommand::new(
            "fleet.noop",
            serde_json::json!({"first": true}),
        ))
        .await
        .expect("a write with the standby listed first reaches the primary");
    queue.close().await;
    let any = format!("{standby_first}?target_session_attrs=any");
    let queue = icq::Queue::connect("fleet", &any, &table, &Default::default())
        .await
        .expect("connect to the first host that answers");
    let refused = queue
        .schedule(&icq::NewCommand::new("fleet.noop", serde_json::json!({})))
        .await
        .expect_err("a write on the standby");
    assert!(
        format!("{refused:?}").contains("25006"),
        "expected a read-only error: {refused:?}"
    );
    queue.close().await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port, standby.port
    );
    // Polling every 30 s: the wake-up after the failover below can only come from LISTEN.
    let config = write_config(
        scratch.path(),
        "icq.yaml",
        &url,
        "      lease_seconds: 30\n      polling_interval_seconds: 30\n",
    );
    let mut workers: Vec<Guarded> = (0..REPLICAS)
        .map(|i| start_worker(&config, &[], scratch.path(), &format!("w{i}")))
        .collect();
    let pids: Vec<i32> = workers.iter().map(Guarded::pid).collect();

    let started = Instant::now();
    let quarter = wait_count_while(
        &primary.url("postgres"),
        COMPLETED,
        COMMANDS / 4,
        Duration::from_secs(120),
        &mut workers,
    )
    .await;
    assert!(
        quarter.is_some(),
        "the drain did not start:\n{}",
        logs(&workers)
    );

    // The failover: stop the primary (it streams its last WAL to the standby first),
    // read what the replicas held from the standby, then promote it.
    let stopped_at = Instant::now();
    primary.stop();
    let caught_up = wait_count(
        &standby.url("postgres"),
        "SELECT (pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn())::int::bigint",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert!(
        caught_up.is_some(),
        "the standby did not replay what it received"
    );
    let held_at_failover = held(&standby.url("postgres")).await;
    let done_at_failover = try_count(&standby.url("postgres"), COMPLETED)
        .await
        .expect("count on the standby");
    assert!(
        done_at_failover < COMMANDS,
        "the drain finished before the failover; nothing was tested"
    );
    standby.promote();
    let promoted_at = Instant::now();
    let resumed = wait_count_while(
        &standby.url("postgres"),
        COMPLETED,
        done_at_failover + 1,
        Duration::from_secs(120),
        &mut workers,
    )
    .await
    .unwrap_or_else(|| {
        panic!(
            "processing did not resume on the new primary:\n{}",
            logs(&workers)
        )
    });
    let finished = wait_count_while(
        &standby.url("postgres"),
        COMPLETED,
        COMMANDS,
        Duration::from_secs(300),
        &mut workers,
    )
    .await;
    let left = try_count(
        &standby.url("postgres"),
        r#"SELECT count(*) FROM "InternalCommands" WHERE "ProcessedAt" IS NULL"#,
    )
    .await;
    assert!(
        finished.is_some(),
        "{left:?} commands never completed after the failover:\n{}",
        logs(&workers)
    );
    let drained_in = started.elapsed();

    // No restart: the same processes did it all.
    for (worker, pid) in workers.iter_mut().zip(&pids) {
        assert!(
            worker.alive(),
            "worker {pid} exited:\n{}",
            worker.log_text()
        );
    }
    // The LISTEN connection followed: with polling every 30 s, a new command completes at
    // once only if its insert's NOTIFY wakes a replica.
    {
        let mut conn = sqlx::PgConnection::connect(&standby.url("postgres"))
            .await
            .expect("connect to the new primary");
        sqlx::raw_sql(
            r#"INSERT INTO "InternalCommands" ("Type", "Payload") VALUES ('fleet.noop', '{"after": true}')"#,
        )
        .execute(&mut conn)
        .await
        .expect("insert after the failover");
    }
    let woken = wait_count(
        &standby.url("postgres"),
        COMPLETED,
        COMMANDS + 1,
        Duration::from_secs(10),
    )
    .await;
    assert!(
        woken.is_some(),
        "a command inserted on the new primary waited for the poll: LISTEN did not follow the failover\n{}",
        logs(&workers)
    );

    // 0 lost, nothing dead-lettered; every command run more than once was held by a
    // replica when the primary stopped.
    let db = standby.url("postgres");
    let dead = try_count(
        &db,
        r#"SELECT count(*) FROM "InternalCommands" WHERE "DeadLetteredAt" IS NOT NULL"#,
    )
    .await
    .expect("count dead letters");
    assert_eq!(dead, 0, "dead letters after the failover");
    let mut conn = sqlx::PgConnection::connect(&db).await.expect("connect");
    let repeated: Vec<String> =
        sqlx::query_scalar(r#"SELECT "Id"::text FROM "InternalCommands" WHERE "Attempts" > 1"#)
            .fetch_all(&mut conn)
            .await
            .expect("read repeated commands");
    let unexplained: Vec<&String> = repeated
        .iter()
        .filter(|id| !held_at_failover.contains(*id))
        .collect();
    assert!(
        unexplained.is_empty(),
        "{} commands ran more than once without being held at the failover: {:?}",
        unexplained.len(),
        &unexplained[..unexplained.len().min(5)]
    );
    let switched = workers
        .iter()
        .filter(|w| w.log_text().contains("PostgreSQL failover: now using"))
        .count();
    assert_eq!(
        switched,
        REPLICAS,
        "every replica should log its switch to the new primary:\n{}",
        logs(&workers)
    );
    for worker in &mut workers {
        let status = worker.stop(Duration::from_secs(30)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "a worker did not stop cleanly ({status:?}):\n{}",
            worker.log_text()
        );
    }
    // Operator commands read the same URL: with the first host down they find the new
    // primary too.
    let out = Command::new(icq_bin())
        .args(["pending", "--format", "json", "--config"])
        .arg(&config)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run icq pending");
    assert!(
        out.status.success(),
        "icq pending on the multi-host URL after the failover: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pending: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("icq pending --format json");
    assert!(
        pending.to_string().contains("fleet"),
        "icq pending should report the source: {pending}"
    );
    eprintln!(
        "failover: {COMMANDS} commands, {REPLICAS} replicas, drained in {:.1} s; \
         {done_at_failover} done at the failover, {} held; paused {:.2} s from the stop \
         ({:.2} s after the promotion); {} run twice (all held at the failover)",
        drained_in.as_secs_f64(),
        held_at_failover.len(),
        resumed.duration_since(stopped_at).as_secs_f64(),
        resumed.duration_since(promoted_at).as_secs_f64(),
        repeated.len()
    );
}

/// Runs `icq ARGS…` with no configuration or `$DATABASE_URL` from the environment; the
/// exit status, stdout and stderr.
pub(crate) fn icq_output(args: &[&str], cwd: &Path) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(icq_bin())
        .args(args)
        .current_dir(cwd)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run icq");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `icq migrate` takes a URL listing several hosts, in either of libpq's forms,
/// and applies to the writable one (a standby listed first is passed over); a URL naming
/// only the standby with `target_session_attrs=read-write` fails, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_applies_to_the_writable_host_of_a_multi_host_url() {
    let scratch = Scratch::new();
    let primary = Cluster::init(&scratch, "primary");
    primary.start();
    let standby = Cluster::standby_of(&primary, &scratch, "standby");
    standby.start();
    let work = tempfile::tempdir().expect("temp dir");
    let dir = work.path().join("migrations");
    let dir_arg = dir.to_str().expect("a UTF-8 temp path");
    let (s, p) = (standby.port, primary.port);
    let standby_first = format!(
        "postgres://postgres@127.0.0.1:{s},127.0.0.1:{p}/postgres?target_session_attrs=read-write"
    );
    // `add` takes the engine from the URL.
    let (status, _, stderr) = icq_output(
        &[
            "migrate",
            "add",
            "--database-url",
            &standby_first,
            "--dir",
            dir_arg,
        ],
        work.path(),
    );
    assert!(status.success(), "icq migrate add: {stderr}");
    let (status, stdout, stderr) = icq_output(
        &[
            "migrate",
            "run",
            "--database-url",
            &standby_first,
            "--dir",
            dir_arg,
        ],
        work.path(),
    );
    assert!(
        status.success(),
        "icq migrate run with the standby listed first: {stdout}\n{stderr}"
    );
    let table = r#"SELECT count(*) FROM pg_tables WHERE tablename = 'InternalCommands'"#;
    assert_eq!(
        try_count(&primary.url("postgres"), table).await,
        Some(1),
        "the table is on the primary"
    );

    // libpq's query form, no `target_session_attrs` (several hosts: a writable one).
    let query_form = format!("postgres://postgres@/postgres?host=127.0.0.1,127.0.0.1&port={s},{p}");
    let (status, stdout, stderr) = icq_output(
        &[
            "migrate",
            "info",
            "--format",
            "json",
            "--database-url",
            &query_form,
            "--dir",
            dir_arg,
        ],
        work.path(),
    );
    assert!(status.success(), "icq migrate info: {stdout}\n{stderr}");
    let info: serde_json::Value = serde_json::from_str(&stdout).expect("migrate info JSON");
    assert_eq!(
        info["migrations"][0]["state"], "installed",
        "info read the primary: {info}"
    );

    let standby_only =
        format!("postgres://postgres@127.0.0.1:{s}/postgres?target_session_attrs=read-write");
    let (status, stdout, stderr) = icq_output(
        &[
            "migrate",
            "run",
            "--database-url",
            &standby_only,
            "--dir",
            dir_arg,
        ],
        work.path(),
    );
    assert!(
        !status.success(),
        "a run on the standby alone succeeded: {stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("no writable server among the URL's hosts")
            && stderr.contains(&format!("127.0.0.1:{s} (read-only (in recovery))")),
        "the refusal says why: {stderr}"
    );
}
