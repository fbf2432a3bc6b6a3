//! MariaDB Galera: a three-node multi-primary cluster of the test's own (three `mariadbd`
//! on free ports, run as `mysql`, joined by rsync state transfers), 4 `icq work` replicas
//! on different nodes of one table, 20,000 commands. Every handler run is recorded (an
//! HTTP handler posting to the test, one path per replica), so a command run twice is
//! seen, whatever its `Attempts` say.
//!
//! - Without faults: every command completes, none is run twice, the replicas log no
//!   error and no certification failure above debug level (they lose races: counted in
//!   `icq_internal_commands_lost_races_total`).
//! - Node loss: the node under two replicas is SIGKILLed mid-drain; those two move to
//!   another node of their multi-host URL and go on, no icq process restarts, nothing is
//!   lost and nothing runs twice.
//!
//! The measurement (`#[ignore]`d): throughput and lost races with 1, 2 and 3 nodes
//! written, and both scenarios three times each.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::Connection;

use super::failover::{COMMANDS, Guarded, REPLICAS, free_port, icq_bin, icq_output, logs, run};

/// The Galera provider Debian's `galera-4` installs.
const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// The server program.
const MARIADBD: &str = "/usr/sbin/mariadbd";

/// The database the tests use on the cluster.
const DB: &str = "icq";

/// The user the cluster's servers run as: not `mysql`, which the shared MariaDB the other
/// tests use runs as, so that nothing the cluster runs (its state transfer scripts kill
/// what their pid files name) can signal the shared server.
const CLUSTER_USER: &str = "nobody";

/// The uid and gid of [`CLUSTER_USER`] (rsync's state transfer runs a daemon that must
/// write the joiner's data directory).
fn cluster_ids() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, CLUSTER_USER])
            .output()
            .expect("run id");
        assert!(
            out.status.success(),
            "no `{CLUSTER_USER}` user on this machine"
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    (id("-u"), id("-g"))
}

/// One node: its ports and data directory, and the server while it runs.
struct Node {
    port: u16,
    /// Galera's group communication port.
    gcomm: u16,
    /// Incremental and snapshot state transfer ports.
    ist: u16,
    sst: u16,
    dir: PathBuf,
    server: Option<Child>,
}

/// A Galera cluster of the test's own; every process of it (servers, their state
/// transfer scripts and rsync daemons: a process group per server) is killed when dropped.
pub(crate) struct Galera {
    nodes: Vec<Node>,
    _scratch: tempfile::TempDir,
}

impl Galera {
    /// Starts `n` nodes: the first bootstraps the cluster, the others join it one after
    /// the other (each synced before the next starts).
    pub(crate) async fn start(n: usize) -> Galera {
        for program in [MARIADBD, PROVIDER, "/usr/bin/rsync"] {
            assert!(
                Path::new(program).exists(),
                "{program} is missing: install mariadb-server, galera-4 and rsync"
            );
        }
        let scratch = tempfile::tempdir().expect("temp dir");
        let (uid, gid) = cluster_ids();
        std::os::unix::fs::chown(scratch.path(), Some(uid), Some(gid)).expect("chown scratch");
        let nodes = (0..n)
            .map(|i| {
                let dir = scratch.path().join(format!("n{i}"));
                std::fs::create_dir(&dir).expect("node dir");
                std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown node dir");
                let mut install = Command::new("mariadb-install-db");
                install
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", dir.join("data").display()))
                    .args([
                        &format!("--user={CLUSTER_USER}"),
                        "--auth-root-authentication-method=normal",
                        "--skip-test-db",
                    ])
                    .current_dir(&dir);
                run(install, "mariadb-install-db");
                Node {
                    port: free_port(),
                    gcomm: free_port(),
                    ist: free_port(),
                    sst: free_port(),
                    dir,
                    server: None,
                }
            })
            .collect();
        let mut cluster = Galera {
            nodes,
            _scratch: scratch,
        };
        for i in 0..n {
            cluster.start_node(i, i == 0);
            cluster.wait_synced(i, i + 1).await;
        }
        let mut conn = cluster.connect(0).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {DB}")))
            .execute(&mut conn)
            .await
            .expect("create the database");
        cluster
    }

    fn start_node(&mut self, i: usize, bootstrap: bool) {
        let addresses: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.gcomm))
            .collect();
        let node = &self.nodes[i];
        let dir = &node.dir;
        let mut cmd = Command::new(MARIADBD);
        cmd.arg("--no-defaults")
            .arg(format!("--user={CLUSTER_USER}"))
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--port={}", node.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--log-error={}", dir.join("err.log").display()))
            .arg("--wsrep_on=ON")
            .arg(format!("--wsrep_provider={PROVIDER}"))
            .arg(format!(
                "--wsrep_cluster_address=gcomm://{}",
                addresses.join(",")
            ))
            .arg(format!("--wsrep_node_address=127.0.0.1:{}", node.gcomm))
            .arg(format!("--wsrep_node_name=n{i}"))
            .arg(format!(
                "--wsrep_provider_options=gmcast.listen_addr=tcp://127.0.0.1:{};ist.recv_addr=127.0.0.1:{};gcache.size=32M",
                node.gcomm, node.ist
            ))
            .arg(format!("--wsrep_sst_receive_address=127.0.0.1:{}", node.sst))
            .args([
                "--wsrep_sst_method=rsync",
                "--binlog_format=ROW",
                "--default_storage_engine=InnoDB",
                "--innodb_autoinc_lock_mode=2",
                // The cluster's durability is its replication: commits need not wait for
                // a disk (and three servers share the test machine's).
                "--innodb_flush_log_at_trx_commit=0",
                "--innodb_buffer_pool_size=128M",
                "--innodb_log_file_size=64M",
                "--max_connections=300",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // A group of its own: the whole group is killed, state transfer helpers too.
            .process_group(0);
        if bootstrap {
            cmd.arg("--wsrep-new-cluster");
        }
        self.nodes[i].server = Some(cmd.spawn().expect("start mariadbd"));
    }

    /// Waits until node `i` answers, is synced and sees a cluster of `size`.
    async fn wait_synced(&mut self, i: usize, size: usize) {
        let started = Instant::now();
        let url = self.node_url(i);
        let mut last = String::new();
        while started.elapsed() < Duration::from_secs(120) {
            if let Some(server) = self.nodes[i].server.as_mut()
                && let Ok(Some(status)) = server.try_wait()
            {
                panic!(
                    "node {i} exited ({status}) while starting:\n{}",
                    self.error_log(i)
                );
            }
            if let Ok(mut conn) = sqlx::MySqlConnection::connect(&url).await {
                let rows: Vec<(String, String)> = sqlx::query_as(
                    "SHOW GLOBAL STATUS WHERE Variable_name IN \
                     ('wsrep_ready', 'wsrep_local_state', 'wsrep_cluster_size')",
                )
                .fetch_all(&mut conn)
                .await
                .unwrap_or_default();
                let _ = conn.close().await;
                let get = |name: &str| {
                    rows.iter()
                        .find(|(n, _)| n.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                if get("wsrep_ready") == "ON"
                    && get("wsrep_local_state") == "4"
                    && get("wsrep_cluster_size") == size.to_string()
                {
                    return;
                }
                last = format!("{rows:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "node {i} did not join a synced cluster of {size} (last status {last}):\n{}",
            self.error_log(i)
        );
    }

    fn error_log(&self, i: usize) -> String {
        let text = std::fs::read_to_string(self.nodes[i].dir.join("err.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The URL of node `i` alone, in `db` (none: no database).
    fn node_url(&self, i: usize) -> String {
        format!("mysql://root@127.0.0.1:{}", self.nodes[i].port)
    }

    /// The URL of the test database on node `i` alone.
    pub(crate) fn db_url(&self, i: usize) -> String {
        format!("{}/{DB}", self.node_url(i))
    }

    /// A multi-host URL listing the nodes in `order`.
    pub(crate) fn hosts_url(&self, order: &[usize]) -> String {
        let hosts: Vec<String> = order
            .iter()
            .map(|&i| format!("127.0.0.1:{}", self.nodes[i].port))
            .collect();
        format!("mysql://root@{}/{DB}", hosts.join(","))
    }

    async fn connect(&self, i: usize) -> sqlx::MySqlConnection {
        sqlx::MySqlConnection::connect(&self.node_url(i))
            .await
            .expect("connect to a node")
    }

    /// SIGKILLs node `i` and everything it started.
    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(mut server) = self.nodes[i].server.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(-(server.id() as i32)),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}

impl Drop for Galera {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// Every handler run: when, which replica, which command.
type Runs = Arc<Mutex<Vec<(Instant, usize, String)>>>;

/// An HTTP server that records each request's replica (its path, `/r<N>`) and
/// `X-Icq-Command-Id`, answering `204` on the same connection (keep-alive).
async fn recorder() -> (u16, Runs) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let runs: Runs = Arc::default();
    let shared = runs.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let runs = shared.clone();
            tokio::spawn(async move {
                let mut pending: Vec<u8> = Vec::new();
                let mut buf = vec![0u8; 16384];
                loop {
                    let head_end = loop {
                        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            break end + 4;
                        }
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => pending.extend_from_slice(&buf[..k]),
                        }
                    };
                    let head = String::from_utf8_lossy(&pending[..head_end]).into_owned();
                    let mut length = 0usize;
                    let mut id = String::new();
                    for line in head.lines().skip(1) {
                        if let Some((name, value)) = line.split_once(':') {
                            let value = value.trim();
                            if name.eq_ignore_ascii_case("content-length") {
                                length = value.parse().unwrap_or(0);
                            } else if name.eq_ignore_ascii_case("x-icq-command-id") {
                                id = value.to_owned();
                            }
                        }
                    }
                    let replica = head
                        .split_whitespace()
                        .nth(1)
                        .and_then(|path| path.strip_prefix("/r"))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(usize::MAX);
                    while pending.len() < head_end + length {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => pending.extend_from_slice(&buf[..k]),
                        }
                    }
                    pending.drain(..head_end + length);
                    runs.lock().unwrap().push((Instant::now(), replica, id));
                    if stream
                        .write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (port, runs)
}

/// Creates icq's table through node 0 and inserts `n` `galera.rec` commands.
async fn table_with_commands(cluster: &Galera, n: i64) {
    let mut conn = sqlx::MySqlConnection::connect(&cluster.db_url(0))
        .await
        .expect("connect");
    let ddl = icq::schema::render(icq::Engine::Mysql, &icq::TableName::default()).up;
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&mut conn)
        .await
        .expect("create the table");
    let mut done = 0;
    while done < n {
        let batch = (n - done).min(2000);
        let rows: Vec<String> = (done..done + batch)
            .map(|i| format!("('galera.rec', '{{\"n\": {i}}}')"))
            .collect();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "INSERT INTO `InternalCommands` (`Type`, `Payload`) VALUES {}",
            rows.join(", ")
        )))
        .execute(&mut conn)
        .await
        .expect("insert the commands");
        done += batch;
    }
}

/// One integer from `sql` on `url`, or `None` when the node cannot answer now.
async fn count(url: &str, sql: &str) -> Option<i64> {
    let mut conn = sqlx::MySqlConnection::connect(url).await.ok()?;
    let n = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&mut conn)
        .await
        .ok();
    let _ = conn.close().await;
    n
}

const COMPLETED: &str = "SELECT COUNT(*) FROM `InternalCommandsHistory`";

/// Polls `COMPLETED` on `url` until it reaches `at_least` (`None` after `limit`, or when a
/// worker exited).
async fn wait_completed(
    url: &str,
    at_least: i64,
    limit: Duration,
    workers: &mut [Guarded],
) -> Option<Instant> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if workers.iter_mut().any(|w| !w.alive()) {
            return None;
        }
        if count(url, COMPLETED).await.is_some_and(|n| n >= at_least) {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The sum of a counter's series in a Prometheus text page.
fn counter_sum(page: &str, name: &str) -> u64 {
    page.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// `GET /metrics` from a replica's `--metrics-addr`.
async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return String::new();
    };
    let _ = stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Starts replica `r`: `icq work` on `url` (`source` adds lines to its source, indented
/// by 4), its `galera.*` handlers posting to the recorder on `hook` at `/r<r>`, metrics on
/// `metrics`, its log in `dir/r<r>.log`.
fn start_replica(
    dir: &Path,
    r: usize,
    url: &str,
    source: &str,
    hook: u16,
    metrics: u16,
) -> Guarded {
    let config = dir.join(format!("r{r}.yaml"));
    let http = format!("http: {{ url: \"http://127.0.0.1:{hook}/r{r}\" }}");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: galera\n    url: {}\n{source}handlers:\n  galera.rec:\n    \
             {http}\n  galera.tick:\n    {http}\n",
            serde_json::to_string(url).unwrap()
        ),
    )
    .expect("write icq.yaml");
    let log = dir.join(format!("r{r}.log"));
    let child = Command::new(icq_bin())
        .arg("work")
        .arg("--config")
        .arg(&config)
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env("NO_COLOR", "1")
        .env(
            "RUST_LOG",
            std::env::var("ICQ_GALERA_LOG").unwrap_or_else(|_| "icq=info".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("create the worker log"))
        .spawn()
        .expect("start icq work");
    Guarded { child, log }
}

/// Log lines at `ERROR`, and `WARN` lines naming a lost race. Matched after each line's
/// timestamp, whose digits can spell an error code (`20:21:32.118034Z` holds `1180`).
fn noisy_lines(workers: &[Guarded]) -> Vec<String> {
    workers
        .iter()
        .flat_map(|w| {
            w.log_text()
                .lines()
                .filter(|line| {
                    let text = line.split_once(' ').map_or(*line, |(_, text)| text);
                    text.contains("ERROR")
                        || (text.contains("WARN")
                            && ["1213", "1180", "Deadlock", "deadlock", "certification"]
                                .iter()
                                .any(|word| text.contains(word)))
                })
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// What one drain showed.
#[derive(Debug)]
pub(crate) struct Drained {
    pub(crate) completed: i64,
    /// Commands never run.
    pub(crate) lost: usize,
    /// Commands run more than once.
    pub(crate) twice: usize,
    pub(crate) seconds: f64,
    /// From the first handler run to the last.
    pub(crate) run_seconds: f64,
    /// Races lost (deadlocks and certification failures), summed over the replicas.
    pub(crate) lost_races: u64,
    pub(crate) claimed: u64,
    /// For a drain with a node killed: how long each replica that was on it went without
    /// running a command.
    pub(crate) resumed_after: Vec<f64>,
    /// For a drain with a node killed: how many commands each replica that was on it ran
    /// after the kill.
    pub(crate) runs_after_kill: Vec<usize>,
    /// For a drain with a node killed: whether each replica that was on it logged that
    /// its claims got an answer again (from another node).
    pub(crate) claims_answered_again: Vec<bool>,
    /// Log lines of the replicas at `ERROR`, and `WARN` lines naming a lost race.
    pub(crate) noisy: Vec<String>,
    pub(crate) dead: i64,
}

/// Drains `COMMANDS` commands with one replica per entry of `placement` (the node order of
/// its URL: the first is the node it writes to); with `kill`, SIGKILLs that node once a
/// quarter is done.
pub(crate) async fn drain(
    cluster: &mut Galera,
    placement: &[Vec<usize>],
    kill: Option<usize>,
) -> Drained {
    table_with_commands(cluster, COMMANDS).await;
    let (hook, runs) = recorder().await;
    let scratch = tempfile::tempdir().expect("temp dir");
    let mut metrics_ports = Vec::new();
    let mut workers: Vec<Guarded> = placement
        .iter()
        .enumerate()
        .map(|(r, order)| {
            let port = free_port();
            metrics_ports.push(port);
            start_replica(scratch.path(), r, &cluster.hosts_url(order), "", hook, port)
        })
        .collect();
    // Completions are counted on a node no replica loses.
    let watch = (0..cluster.nodes.len())
        .find(|&i| Some(i) != kill)
        .expect("a node that stays");
    let watch_url = cluster.db_url(watch);
    let started = Instant::now();
    let mut killed_at = None;
    if let Some(node) = kill {
        let quarter = wait_completed(
            &watch_url,
            COMMANDS / 4,
            Duration::from_secs(300),
            &mut workers,
        )
        .await;
        assert!(
            quarter.is_some(),
            "the drain did not start:\n{}",
            logs(&workers)
        );
        cluster.kill(node);
        killed_at = Some(Instant::now());
    }
    let finished =
        wait_completed(&watch_url, COMMANDS, Duration::from_secs(600), &mut workers).await;
    let completed = count(&watch_url, COMPLETED).await.unwrap_or(-1);
    assert!(
        finished.is_some(),
        "{completed} of {COMMANDS} commands completed:\n{}",
        logs(&workers)
    );
    let seconds = started.elapsed().as_secs_f64();
    // Let a run recorded right at the end land before the records are read.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (mut lost_races, mut claimed) = (0, 0);
    for port in &metrics_ports {
        let page = scrape(*port).await;
        lost_races += counter_sum(&page, "icq_internal_commands_lost_races_total");
        claimed += counter_sum(&page, "icq_internal_commands_claimed_total");
    }
    // No restart: the same processes did it all.
    for worker in &mut workers {
        assert!(worker.alive(), "a worker exited:\n{}", worker.log_text());
    }
    for worker in &mut workers {
        let status = worker.stop(Duration::from_secs(30)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "a worker did not stop cleanly ({status:?}):\n{}",
            worker.log_text()
        );
    }
    let runs = runs.lock().unwrap().clone();
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for (_, _, id) in &runs {
        *per_id.entry(id.as_str()).or_default() += 1;
    }
    let twice = per_id.values().filter(|n| **n > 1).count();
    let lost = (COMMANDS as usize).saturating_sub(per_id.len());
    let dead = count(
        &watch_url,
        "SELECT COUNT(*) FROM `InternalCommands` WHERE `DeadLetteredAt` IS NOT NULL",
    )
    .await
    .unwrap_or(-1);
    // The replicas that wrote to the killed node: the end of their first stretch of a
    // second or more without a run after the kill (they run what they had claimed before
    // it first), measured from the kill. A replica that moved within a second has no such
    // stretch: its first run more than a second after the kill counts instead (what it
    // had claimed before the kill runs in milliseconds).
    let (mut resumed_after, mut runs_after_kill) = (Vec::new(), Vec::new());
    let mut claims_answered_again = Vec::new();
    if let (Some(node), Some(at)) = (kill, killed_at) {
        for (r, order) in placement.iter().enumerate() {
            if order[0] != node {
                continue;
            }
            let mut times: Vec<Instant> = runs
                .iter()
                .filter(|(_, replica, _)| *replica == r)
                .map(|(t, _, _)| *t)
                .collect();
            times.sort();
            let resumed = times
                .windows(2)
                .find(|w| w[1] > at && w[1] - w[0] >= Duration::from_secs(1))
                .map(|w| w[1])
                .or_else(|| {
                    let later = at + Duration::from_secs(1);
                    times.iter().copied().find(|t| *t > later)
                });
            resumed_after.push(resumed.map_or(f64::NAN, |t| (t - at).as_secs_f64()));
            runs_after_kill.push(times.iter().filter(|t| **t > at).count());
            claims_answered_again.push(
                workers[r].log_text().lines().any(|l| {
                    l.contains("the database answers again") && l.contains("role=\"claim\"")
                }),
            );
        }
    }
    if std::env::var_os("ICQ_GALERA_KEEP").is_some() {
        let zero = killed_at.unwrap_or(started);
        let text: Vec<String> = runs
            .iter()
            .map(|(t, r, id)| {
                let ms = if *t >= zero {
                    (*t - zero).as_millis() as i64
                } else {
                    -((zero - *t).as_millis() as i64)
                };
                format!("{ms} r{r} {id}")
            })
            .collect();
        std::fs::write(scratch.path().join("runs.txt"), text.join("\n")).expect("write runs");
        let kept = scratch.keep();
        eprintln!("replica logs kept in {}", kept.display());
    }
    let noisy = noisy_lines(&workers);
    if let Some(node) = kill {
        let moved = workers
            .iter()
            .filter(|w| w.log_text().contains("MariaDB/MySQL failover: now using"))
            .count();
        let on_killed = placement.iter().filter(|o| o[0] == node).count();
        assert_eq!(
            moved,
            on_killed,
            "each replica of the killed node should log its move to another node:\n{}",
            logs(&workers)
        );
    }
    let first = runs.iter().map(|(t, _, _)| *t).min();
    let last = runs.iter().map(|(t, _, _)| *t).max();
    let run_seconds = match (first, last) {
        (Some(first), Some(last)) => (last - first).as_secs_f64(),
        _ => f64::NAN,
    };
    Drained {
        completed,
        lost,
        twice,
        seconds,
        run_seconds,
        lost_races,
        claimed,
        resumed_after,
        runs_after_kill,
        claims_answered_again,
        noisy,
        dead,
    }
}

/// Each replica's node order: replica `r` writes to node `first[r]`, the others follow.
fn placement(first: &[usize], nodes: usize) -> Vec<Vec<usize>> {
    first
        .iter()
        .map(|&f| (0..nodes).map(|k| (f + k) % nodes).collect())
        .collect()
}

fn assert_clean(what: &str, drained: &Drained) {
    eprintln!("galera {what}: {drained:?}");
    assert_eq!(drained.completed, COMMANDS, "{what}: completed");
    assert_eq!(drained.lost, 0, "{what}: commands never run");
    assert_eq!(drained.twice, 0, "{what}: commands run twice");
    assert_eq!(drained.dead, 0, "{what}: dead letters");
    assert!(
        drained.noisy.is_empty(),
        "{what}: errors, or lost races above debug level, in the replicas' logs:\n{}",
        drained.noisy.join("\n")
    );
}

/// 4 replicas on 3 nodes (two share the first), no faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_three_nodes_run_each_command_once() {
    let mut cluster = Galera::start(3).await;
    let drained = drain(&mut cluster, &placement(&[0, 1, 2, 0], 3), None).await;
    assert_clean("three nodes", &drained);
    assert_eq!(REPLICAS, 4);
}

/// The node under two replicas is SIGKILLed mid-drain: they move on to another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_loses_nothing_and_runs_nothing_twice() {
    let mut cluster = Galera::start(3).await;
    let drained = drain(&mut cluster, &placement(&[0, 0, 1, 2], 3), Some(0)).await;
    // The kill's own lost connections are warned about; errors are not expected.
    let errors: Vec<&String> = drained
        .noisy
        .iter()
        .filter(|l| l.contains("ERROR"))
        .collect();
    eprintln!("galera node loss: {drained:?}");
    assert_eq!(drained.completed, COMMANDS, "completed");
    assert_eq!(drained.lost, 0, "commands never run");
    assert_eq!(drained.twice, 0, "commands run twice");
    assert_eq!(drained.dead, 0, "dead letters");
    assert!(
        errors.is_empty(),
        "errors in the replicas' logs: {errors:#?}"
    );
    assert_eq!(drained.resumed_after.len(), 2);
    // Each replica of the killed node runs commands again, or, when the others drained
    // the rest before it came back (the survivors accept writes only once Galera has
    // evicted the dead node, 5–8 s after the kill), its claims are answered again.
    let serving = drained
        .resumed_after
        .iter()
        .zip(&drained.claims_answered_again)
        .all(|(resumed, answered)| resumed.is_finite() || *answered);
    assert!(
        serving,
        "a replica of the killed node never served again: resumed after {:?} s, commands \
         run after the kill {:?}, claims answered again {:?}",
        drained.resumed_after, drained.runs_after_kill, drained.claims_answered_again
    );
}

/// A URL naming a node that lost quorum and a healthy one takes the healthy one, and
/// `icq migrate`-style one-off connections do too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_quorum_is_passed_over() {
    let mut cluster = Galera::start(2).await;
    table_with_commands(&cluster, 0).await;
    // Node 1 alone after node 0 dies: no primary component (1 of 2).
    cluster.kill(0);
    let url_1 = cluster.db_url(1);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut conn = sqlx::MySqlConnection::connect(&url_1)
            .await
            .expect("node 1");
        let ready: Vec<(String, String)> = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'wsrep_ready'")
            .fetch_all(&mut conn)
            .await
            .expect("status");
        if ready.first().is_some_and(|(_, v)| v == "OFF") {
            break;
        }
        assert!(Instant::now() < deadline, "node 1 kept quorum alone");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let listed = format!(
        "mysql://root@127.0.0.1:{},127.0.0.1:{}/{DB}",
        cluster.nodes[1].port,
        free_port()
    );
    let err = icq::Queue::connect("galera", &listed, &Default::default(), &Default::default())
        .await
        .err()
        .expect("no node can take writes");
    let text = err.to_string();
    assert!(
        (text.contains("wsrep_ready=OFF") || text.contains("WSREP"))
            && text.contains("no usable server"),
        "the refusal names why each node was passed over: {text}"
    );
}

/// A schedule ticking every second, on 4 replicas over 3 nodes: the replicas race for
/// each occurrence on different nodes (certification decides), and every occurrence is
/// scheduled and run exactly once. The table is made by `icq migrate` through a
/// multi-host URL whose first host is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_ticks_once_per_occurrence_across_nodes() {
    let cluster = Galera::start(3).await;
    // The table comes from `icq migrate` on a multi-host URL whose first host is down.
    let work = tempfile::tempdir().expect("temp dir");
    let dir = work.path().join("migrations");
    let dir_arg = dir.to_str().expect("a UTF-8 temp path");
    let dead_first = cluster.hosts_url(&[0, 1, 2]).replacen(
        "root@",
        &format!("root@127.0.0.1:{},", free_port()),
        1,
    );
    for step in ["add", "run"] {
        let (status, stdout, stderr) = icq_output(
            &[
                "migrate",
                step,
                "--database-url",
                &dead_first,
                "--dir",
                dir_arg,
            ],
            work.path(),
        );
        assert!(status.success(), "icq migrate {step}: {stdout}\n{stderr}");
    }
    let (hook, runs) = recorder().await;
    let scratch = tempfile::tempdir().expect("temp dir");
    let source = "    settings:\n      polling_interval_seconds: 0.5\n    schedules:\n      \
                  - name: every\n        every: 1s\n        type: galera.tick\n";
    let ports: Vec<u16> = (0..REPLICAS).map(|_| free_port()).collect();
    let mut workers: Vec<Guarded> = placement(&[0, 1, 2, 0], 3)
        .iter()
        .enumerate()
        .map(|(r, order)| {
            start_replica(
                scratch.path(),
                r,
                &cluster.hosts_url(order),
                source,
                hook,
                ports[r],
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let mut lost_races = 0;
    for port in &ports {
        lost_races += counter_sum(
            &scrape(*port).await,
            "icq_internal_commands_lost_races_total",
        );
    }
    for worker in &mut workers {
        assert!(worker.alive(), "a worker exited:\n{}", worker.log_text());
        let status = worker.stop(Duration::from_secs(30)).await;
        assert!(status.is_some_and(|s| s.success()), "{}", worker.log_text());
    }
    let mut conn = sqlx::MySqlConnection::connect(&cluster.db_url(1))
        .await
        .expect("connect");
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT `UniqueKey` FROM `InternalCommands` WHERE `UniqueKey` LIKE 'schedule:every:%' \
         UNION ALL \
         SELECT `UniqueKey` FROM `InternalCommandsHistory` WHERE `UniqueKey` LIKE 'schedule:every:%'",
    )
    .fetch_all(&mut conn)
    .await
    .expect("read the occurrences");
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for key in &keys {
        *per_key.entry(key.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "occurrences scheduled twice: {twice:?}");
    assert!(
        per_key.len() >= 10,
        "{} occurrences in 15 s:\n{}",
        per_key.len(),
        logs(&workers)
    );
    let runs = runs.lock().unwrap().clone();
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for (_, _, id) in &runs {
        *per_id.entry(id.as_str()).or_default() += 1;
    }
    assert!(
        per_id.values().all(|n| *n == 1),
        "an occurrence's command ran twice"
    );
    let noisy = noisy_lines(&workers);
    assert!(noisy.is_empty(), "noisy logs:\n{}", noisy.join("\n"));
    eprintln!(
        "galera schedule: {} occurrences, each scheduled once, {} runs, {lost_races} lost races",
        per_key.len(),
        runs.len()
    );
}

/// The measurement: throughput and lost races with 1, 2 and 3 nodes written (4
/// replicas, 20,000 commands, a fresh three-node cluster each), then the two scenarios
/// three times each. Run it alone:
/// `cargo nextest run --features driver-suite --test fleet --run-ignored only galera::measure --no-capture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (several minutes): run it by name"]
async fn measure() {
    let mut lines = Vec::new();
    let line = |what: &str, d: &Drained| {
        format!(
            "{what:<28} completed {:>5}  lost {}  twice {}  dead {}  {:>6.0} commands/s \
             (runs over {:>5.1} s, drain {:>5.1} s)  lost races {:>4} ({:.2} per 100 claims){}",
            d.completed,
            d.lost,
            d.twice,
            d.dead,
            COMMANDS as f64 / d.run_seconds,
            d.run_seconds,
            d.seconds,
            d.lost_races,
            100.0 * d.lost_races as f64 / d.claimed.max(1) as f64,
            if d.resumed_after.is_empty() {
                String::new()
            } else {
                format!("  resumed after {:.2?} s", d.resumed_after)
            }
        )
    };
    for (nodes, first) in [
        (1, vec![0, 0, 0, 0]),
        (2, vec![0, 1, 0, 1]),
        (3, vec![0, 1, 2, 0]),
    ] {
        let mut cluster = Galera::start(3).await;
        let d = drain(&mut cluster, &placement(&first, 3), None).await;
        lines.push(line(&format!("{nodes} node(s) written"), &d));
        eprintln!("{}", lines.last().unwrap());
    }
    for round in 1..=3 {
        let mut cluster = Galera::start(3).await;
        let d = drain(&mut cluster, &placement(&[0, 1, 2, 0], 3), None).await;
        lines.push(line(&format!("(a) no faults, run {round}"), &d));
        eprintln!("{}", lines.last().unwrap());
    }
    for round in 1..=3 {
        let mut cluster = Galera::start(3).await;
        let d = drain(&mut cluster, &placement(&[0, 0, 1, 2], 3), Some(0)).await;
        lines.push(line(&format!("(b) node killed, run {round}"), &d));
        eprintln!("{}", lines.last().unwrap());
    }
    eprintln!("\n{}", lines.join("\n"));
}
