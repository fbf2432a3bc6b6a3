//! Fleet tests: several replicas on one table, the database's clock, signals,
//! dead sockets, errors that cannot heal, failover, Patroni and PgBouncer — each against the real
//! server, started by the test where it needs one of its own.

#[path = "../support/mod.rs"]
mod support;

mod clock;
mod drain;
mod errors;
mod failover;
mod galera;
mod hosts;
mod limits;
mod look_ahead;
mod patroni;
mod pause;
mod pgbouncer;
mod recurring;
mod signals;
mod stall;
mod workload;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::TestDb;

/// The `icq` binary under test.
fn icq() -> Command {
    Command::new(env!("CARGO_BIN_EXE_icq"))
}

/// Writes `icq.yaml` with one source `main` on `url` and the given settings and handlers
/// (YAML lines, already indented for their place).
fn write_config(dir: &Path, url: &str, settings: &str, handlers: &str) -> PathBuf {
    let path = dir.join("icq.yaml");
    let text = format!(
        "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n{settings}\nhandlers:\n{handlers}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Inserts `n` commands of type `ty` with plain SQL, in one statement.
async fn insert_many(db: &TestDb, ty: &str, n: usize) {
    let (t, c1, c2) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
    let rows: Vec<String> = (0..n)
        .map(|i| format!("('{ty}', '{{\"n\": {i}}}')"))
        .collect();
    db.execute(&format!(
        "INSERT INTO {t} ({c1}, {c2}) VALUES {}",
        rows.join(", ")
    ))
    .await;
}

/// Polls `check` every 50 ms until it holds or `limit` passes; whether it held.
async fn wait_until<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check().await
}

/// An `icq work` process, killed (SIGKILL) when dropped so a failing test leaves nothing.
/// One started through a prefix (`faketime`, which forks `icq` as its child) runs in a
/// process group of its own, and signals go to the whole group: killing the prefix alone
/// would leave `icq` running.
struct Replica {
    child: Child,
    group: bool,
}

impl Replica {
    /// Starts `icq work --config CONFIG ARGS…` through `prefix` (e.g. `faketime -f -120s`),
    /// with `env` added and stderr appended to `log`.
    fn start(
        prefix: &[&str],
        config: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Replica {
        let mut command = match prefix.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(env!("CARGO_BIN_EXE_icq"));
                command
            }
            None => icq(),
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        command
            .arg("work")
            .arg("--config")
            .arg(config)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log);
        let group = !prefix.is_empty();
        if group {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        Replica {
            child: command.spawn().unwrap(),
            group,
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self.child.id() as i32;
        let target = if self.group { -pid } else { pid };
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(target), signal);
    }

    /// Waits for the process to exit, at most `limit`.
    async fn wait(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        None
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lines of a file that handlers append to (missing file: none).
fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// An exec handler (YAML, indented for `handlers:`) of type `ty` that appends
/// `$ICQ_COMMAND_ID` (and `$REPLICA`, when set) to `log` and then runs `then`.
fn recording_handler(ty: &str, log: &Path, then: &str) -> String {
    format!(
        "  {ty}:\n    exec: [\"sh\", \"-c\", \"echo \\\"$ICQ_COMMAND_ID $REPLICA\\\" >> {}; {then}\"]\n",
        log.display()
    )
}

/// Runs a query returning one nullable text column in one row (e.g. a `string_agg` of
/// ids) and splits it on commas.
async fn support_texts(db: &TestDb, sql: &str) -> Vec<String> {
    use sqlx::Connection;
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    let text: Option<String> = match db.engine {
        "postgres" => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap()
        }
        "mysql" => {
            let mut c = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap()
        }
        _ => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap()
        }
    };
    text.map(|t| t.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}
