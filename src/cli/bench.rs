//! `icq bench`: measures icq on one database, at icq's default settings, on a scratch
//! table it creates and always drops again.
//!
//! The run, in order:
//!
//! 1. **enqueue, one transaction per command**: `jobs / 10` commands (at least 100), each
//!    through [`Queue::schedule`];
//! 2. **enqueue in bulk**: `jobs` commands in one [`Queue::schedule_many`] (`COPY` on
//!    PostgreSQL, multi-row inserts in one transaction elsewhere);
//! 3. **drain**: every command enqueued so far, run with the `noop` handler by a child
//!    `icq work --until-idle` process, timed from spawn to exit, then counted to check that
//!    every one completed; the child's peak RSS is the worker's memory figure;
//! 4. **idle latency**: an in-process [`Processor`] waits on the empty table while another
//!    connection inserts [`LATENCY_SAMPLES`] commands one at a time, ~20 ms apart; each
//!    sample is the time from the insert's commit to the handler's start (on PostgreSQL
//!    the table's NOTIFY trigger wakes the processor; elsewhere it finds rows by polling,
//!    so the figure is about half the polling interval);
//!
//! It measures through the library's public API only, as a service would see icq. The
//! scratch table (`icq_bench_<8 hex digits>`) is created from [`icq::schema::render`]
//! and dropped at the end, also when a phase fails or the run is interrupted; nothing
//! else in the database is touched.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cli::config::DatabaseUrl;
use crate::cli::error::{CliError, Result};
use icq::ConnectOptions;
use icq::admin::Progress;
use icq::command::NewCommand;
use icq::error::Error;
use icq::handler::{FnHandler, Job, Registry};
use icq::ident::{Engine, TableName};
use icq::queue::Queue;
use icq::settings::Settings;
use icq::{Processor, RunOptions};

/// The command type the drain runs with the `noop` handler.
pub const NOOP_TYPE: &str = "bench.noop";

/// The command type of the latency samples.
pub const LATENCY_TYPE: &str = "bench.latency";

/// How many commands the latency phase inserts.
pub const LATENCY_SAMPLES: usize = 200;

/// The gap between two latency inserts.
const LATENCY_GAP: Duration = Duration::from_millis(20);

/// The most commands one run enqueues in bulk: the batch is built in memory (about 1 KB a
/// command with its payload and parameters), so a larger `--jobs` is refused up front
/// instead of aborting on allocation with the scratch tables in place.
pub const MAX_JOBS: u64 = 10_000_000;

/// Tries at dropping the scratch table before giving up.
const DROP_ATTEMPTS: u32 = 3;

/// The environment variable that hands the database URL to the drain worker, so the
/// password is never written into its configuration file.
const URL_VARIABLE: &str = "ICQ_BENCH_DATABASE_URL";

/// What to benchmark and how much.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The database (engine from the scheme).
    pub url: DatabaseUrl,
    /// Commands enqueued in bulk and drained.
    pub jobs: u64,
    /// The drain worker's `concurrency`; `None` keeps the settings default.
    pub concurrency: Option<u32>,
    /// The `icq` binary the drain runs as `icq work --until-idle`.
    pub worker: PathBuf,
}

impl BenchOptions {
    /// The default run (20,000 jobs, default concurrency) on
    /// `url`, draining with the `icq` binary at `worker`.
    pub fn new(url: DatabaseUrl, worker: PathBuf) -> BenchOptions {
        BenchOptions {
            url,
            jobs: 20_000,
            concurrency: None,
            worker,
        }
    }

    /// Commands the first phase enqueues one transaction each: a tenth of `jobs`, at
    /// least 100.
    pub fn singles(&self) -> u64 {
        (self.jobs / 10).max(100)
    }
}

/// The figures of one run (`icq bench --format json` prints exactly this object).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    /// The engine measured.
    pub engine: Engine,
    /// Commands enqueued in bulk (the drain ran these plus the singles).
    pub jobs: u64,
    /// Commands per second, one transaction per command.
    pub enqueue_single_per_s: f64,
    /// Commands per second through the bulk path.
    pub enqueue_bulk_per_s: f64,
    /// Commands per second drained by `icq work --until-idle` with the `noop` handler,
    /// from process spawn to exit.
    pub drain_per_s: f64,
    /// Median commit → handler start, for commands inserted by another connection while
    /// the processor is idle, in milliseconds.
    pub latency_p50_ms: f64,
    /// 99th percentile of the same.
    pub latency_p99_ms: f64,
    /// Peak resident memory of the drain worker process, in MiB.
    pub rss_mb: f64,
}

/// Runs the benchmark. `progress` shows each phase; cancelling `interrupt` (Ctrl-C)
/// stops the run, and the scratch tables are dropped before this returns, whatever
/// happened.
pub async fn run(
    options: &BenchOptions,
    progress: &dyn Progress,
    interrupt: CancellationToken,
) -> Result<BenchReport> {
    if options.jobs == 0 {
        return Err(Error::invalid("--jobs must be at least 1").into());
    }
    if options.jobs > MAX_JOBS {
        return Err(Error::invalid(format!(
            "--jobs {} is more than one run enqueues ({MAX_JOBS}): the batch is built in \
             memory; run several benchmarks or pass a smaller --jobs",
            options.jobs
        ))
        .into());
    }
    if options.concurrency == Some(0) {
        return Err(Error::invalid("--concurrency must be at least 1").into());
    }
    let engine = options.url.engine()?;
    if engine == Engine::Sqlite {
        sqlite_file_exists(&options.url).await?;
    }
    let table = scratch_table()?;
    // From here on the table may exist (an interrupted create too): it is always dropped.
    let mut queue = None;
    let created = tokio::select! {
        created = create_scratch_table(options, &table, &mut queue) => created,
        () = interrupt.cancelled() => Err(interrupted(queue.is_some())),
    };
    let outcome = match (created, &queue) {
        (Ok(()), Some(queue)) => {
            let bench = Bench {
                options,
                engine,
                table: &table,
                queue: queue.clone(),
                progress,
            };
            tokio::select! {
                report = bench.measure() => report,
                () = interrupt.cancelled() => Err(interrupted(true)),
            }
        }
        (Err(err), _) => Err(err),
        (Ok(()), None) => unreachable!("create_scratch_table connects or fails"),
    };
    progress.finish();
    let dropped = drop_table(queue.as_ref(), &options.url, &table).await;
    if let Some(queue) = queue {
        queue.close().await;
    }
    match dropped {
        Ok(()) => outcome,
        Err(err) => Err(drop_failed(&table, err, outcome.err())),
    }
}

/// Refuses a SQLite URL whose file does not exist and that does not ask for it to be
/// created: sqlx would fail with "unable to open database file", which does not say that
/// `?mode=rwc` is the fix.
async fn sqlite_file_exists(url: &DatabaseUrl) -> Result<()> {
    use sqlx::migrate::MigrateDatabase as _;
    let text = url.expose();
    if text.contains("mode=rwc") || text.contains(":memory:") || text.contains("mode=memory") {
        return Ok(());
    }
    let exists = sqlx::Sqlite::database_exists(text)
        .await
        .map_err(Error::db("checking the SQLite database file"))?;
    if exists {
        return Ok(());
    }
    let separator = if text.contains('?') { '&' } else { '?' };
    Err(CliError::Usage(format!(
        "the SQLite database file {} does not exist; add {separator}mode=rwc to the URL to \
         create it ({}{separator}mode=rwc)",
        icq::redact::redact_url(text),
        icq::redact::redact_url(text)
    )))
}

/// Creates the scratch table, refusing one that exists already, and connects to it.
async fn create_scratch_table(
    options: &BenchOptions,
    table: &TableName,
    queue: &mut Option<Queue>,
) -> Result<()> {
    let url = options.url.expose();
    match Queue::connect("bench", url, table, &ConnectOptions::default()).await {
        Ok(existing) => {
            existing.close().await;
            return Err(CliError::Bench(format!(
                "the scratch table {table} already exists; run icq bench again (it picks a \
                 new name)"
            )));
        }
        Err(Error::TableMissing { .. }) => {}
        Err(err) => return Err(err.into()),
    }
    let create = ConnectOptions::default().creating_table(true);
    *queue = Some(Queue::connect("bench", url, table, &create).await?);
    Ok(())
}

/// Drops the scratch table; on failure tries again twice, a second apart, each time on a
/// fresh connection: a failure mid-run (a restarted server) can leave the pool holding
/// only dead connections.
async fn drop_table(queue: Option<&Queue>, url: &DatabaseUrl, table: &TableName) -> Result<()> {
    let mut outcome = match queue {
        Some(queue) => queue.drop_table().await.map_err(CliError::from),
        None => Err(CliError::Bench("not connected".into())),
    };
    for attempt in 1..DROP_ATTEMPTS {
        if outcome.is_ok() {
            break;
        }
        if queue.is_some() || attempt > 1 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // Connecting with `creating_table` makes sure the table is there to drop, also
        // when an interrupted create left it half made or not made at all.
        let options = ConnectOptions::default()
            .with_max_connections(1)
            .creating_table(true);
        outcome = match Queue::connect("bench", url.expose(), table, &options).await {
            Ok(fresh) => {
                let dropped = fresh.drop_table().await;
                fresh.close().await;
                dropped.map_err(CliError::from)
            }
            Err(err) => Err(err.into()),
        };
    }
    outcome
}

/// A fresh scratch table name: `icq_bench_` and 8 random hex digits.
fn scratch_table() -> icq::Result<TableName> {
    TableName::parse(&format!("icq_bench_{:08x}", rand::random::<u32>()))
}

fn interrupted(wrote: bool) -> CliError {
    CliError::Bench(if wrote {
        "interrupted; the scratch tables were dropped".into()
    } else {
        "interrupted before anything was written".into()
    })
}

/// The error when the scratch table could not be dropped: it names the table so it can
/// be dropped by hand, after the earlier failure, if any.
fn drop_failed(table: &TableName, err: CliError, earlier: Option<CliError>) -> CliError {
    let earlier = earlier.map_or_else(String::new, |e| format!("{e}; then "));
    CliError::Bench(format!(
        "{earlier}dropping the scratch table {table} failed, so it is still there (drop it \
         by hand): {err}"
    ))
}

/// One run's shared state.
struct Bench<'a> {
    options: &'a BenchOptions,
    engine: Engine,
    table: &'a TableName,
    queue: Queue,
    progress: &'a dyn Progress,
}

impl Bench<'_> {
    async fn measure(&self) -> Result<BenchReport> {
        let queue = &self.queue;
        let singles = self.options.singles();
        let jobs = self.options.jobs;

        let commands = noop_commands(singles);
        self.progress
            .begin("enqueue, one transaction each", singles);
        let started = Instant::now();
        for command in &commands {
            queue.schedule(command).await?;
            self.progress.advance(1);
        }
        let enqueue_single_per_s = per_second(singles, started.elapsed());

        let commands = noop_commands(jobs);
        self.progress.begin("enqueue in bulk", jobs);
        let started = Instant::now();
        queue.schedule_many(&commands).await?;
        let enqueue_bulk_per_s = per_second(jobs, started.elapsed());
        self.progress.advance(jobs);
        drop(commands);

        let drained = self.drain(singles + jobs).await?;
        let (latency_p50_ms, latency_p99_ms) = self.latency(queue).await?;

        Ok(BenchReport {
            engine: self.engine,
            jobs,
            enqueue_single_per_s: round(enqueue_single_per_s, 1),
            enqueue_bulk_per_s: round(enqueue_bulk_per_s, 1),
            drain_per_s: round(per_second(singles + jobs, drained.elapsed), 1),
            latency_p50_ms: round(latency_p50_ms, 3),
            latency_p99_ms: round(latency_p99_ms, 3),
            rss_mb: round(drained.peak_rss_mb, 1),
        })
    }

    /// Phase 3: `icq work --until-idle` drains the `total` commands in a child process.
    async fn drain(&self, total: u64) -> Result<Drained> {
        let config = WorkerConfig::write(self.table, self.options.concurrency)?;
        let mut worker = tokio::process::Command::new(&self.options.worker);
        worker
            .arg("work")
            .arg("--until-idle")
            .arg("--config")
            .arg(config.path())
            .env(URL_VARIABLE, self.options.url.expose().replace('\'', "''"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        self.progress
            .begin("drain with `icq work --until-idle`", total);
        let started = Instant::now();
        let child = worker.spawn().map_err(Error::io(format!(
            "starting the drain worker {}",
            self.options.worker.display()
        )))?;
        let pid = child.id();
        let mut peak_kib = 0u64;
        let mut exited = std::pin::pin!(child.wait_with_output());
        let mut memory = tokio::time::interval(Duration::from_millis(20));
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shown = 0;
        let output = loop {
            tokio::select! {
                output = &mut exited => break output,
                _ = memory.tick() => {
                    // The kernel's own high-water mark, read while the worker lives.
                    // (`getrusage` of children would count the parent's pages a
                    // vfork-style spawn shares with the child.)
                    if let Some(kib) = pid.and_then(peak_rss_kib) {
                        peak_kib = peak_kib.max(kib);
                    }
                }
                _ = tick.tick() => {
                    // Progress only: a failed count is simply not shown.
                    if let Ok(left) = self.queue.activity().await {
                        let done = total.saturating_sub(left.due + left.running);
                        if done > shown {
                            self.progress.advance(done - shown);
                            shown = done;
                        }
                    }
                }
            }
        };
        let elapsed = started.elapsed();
        let output = output.map_err(Error::io("waiting for the drain worker"))?;
        if !output.status.success() {
            return Err(CliError::Bench(format!(
                "the drain worker (`icq work --until-idle`) failed ({}){}",
                output.status,
                tail(&output.stderr)
            )));
        }
        self.progress.advance(total.saturating_sub(shown));
        let counts = self.counts().await?;
        let pending = counts.due + counts.scheduled + counts.running;
        if counts.completed != total || pending > 0 || counts.dead > 0 {
            return Err(CliError::Bench(format!(
                "the drain worker exited, but {} of {total} commands completed ({} \
                 dead-lettered, {pending} still pending){}",
                counts.completed,
                counts.dead,
                tail(&output.stderr)
            )));
        }
        Ok(Drained {
            elapsed,
            peak_rss_mb: peak_kib as f64 / 1024.0,
        })
    }

    /// Phase 4: commit → handler start for commands inserted by another connection while
    /// an in-process processor (default settings) is idle. Returns (p50, p99) in ms.
    async fn latency(&self, queue: &Queue) -> Result<(f64, f64)> {
        let settings = Settings::default();
        let (started_tx, mut started) = mpsc::unbounded_channel::<(usize, Instant)>();
        let mut registry = Registry::new();
        registry.insert(
            LATENCY_TYPE,
            Arc::new(FnHandler(move |job: Job| {
                let at = Instant::now();
                if let Some(i) = job.payload.get("i").and_then(serde_json::Value::as_u64) {
                    let _ = started_tx.send((i as usize, at));
                }
                async { Ok(()) }
            })),
        )?;
        let mut processor = Processor::new(registry);
        processor.add_source(queue.source_handle(settings.clone()));
        let stop = CancellationToken::new();
        let _stop_on_drop = stop.clone().drop_guard();
        let running = tokio::spawn({
            let stop = stop.clone();
            async move { processor.run(RunOptions::default(), stop).await }
        });

        // Another pool, so no insert wakes the processor in-process.
        let one = ConnectOptions::default().with_max_connections(1);
        let other = Queue::connect("bench", self.options.url.expose(), self.table, &one).await?;
        let sampled = self.sample_latency(&other, &mut started, &settings).await;
        other.close().await;
        stop.cancel();
        let ran = running
            .await
            .map_err(|err| CliError::Bench(format!("the latency processor crashed: {err}")))?;
        let mut latencies = sampled?;
        ran?;
        latencies.sort_by(f64::total_cmp);
        Ok((percentile(&latencies, 0.50), percentile(&latencies, 0.99)))
    }

    async fn sample_latency(
        &self,
        other: &Queue,
        started: &mut mpsc::UnboundedReceiver<(usize, Instant)>,
        settings: &Settings,
    ) -> Result<Vec<f64>> {
        let patience = settings.polling_interval() * 2 + Duration::from_secs(30);
        // A first command, untimed: the processor is claiming (and listening) once it ran.
        other.schedule(&latency_command(LATENCY_SAMPLES)).await?;
        wait_started(started, 1, patience, "the warm-up command").await?;

        self.progress
            .begin("idle latency, schedule → start", LATENCY_SAMPLES as u64);
        let mut committed = Vec::with_capacity(LATENCY_SAMPLES);
        let mut next = tokio::time::Instant::now();
        for i in 0..LATENCY_SAMPLES {
            tokio::time::sleep_until(next).await;
            other.schedule(&latency_command(i)).await?;
            committed.push(Instant::now());
            self.progress.advance(1);
            next += LATENCY_GAP;
        }
        let starts =
            wait_started(started, LATENCY_SAMPLES, patience, "the latency commands").await?;
        Ok(committed
            .iter()
            .zip(&starts)
            .map(|(commit, start)| millis(start.saturating_duration_since(*commit)))
            .collect())
    }

    async fn counts(&self) -> Result<icq::admin::StateCount> {
        let report = icq::admin::pending(std::slice::from_ref(&self.queue), false).await?;
        Ok(report
            .rows
            .into_iter()
            .next()
            .map(|row| row.counts)
            .unwrap_or_default())
    }
}

/// What the drain phase measured.
struct Drained {
    elapsed: Duration,
    peak_rss_mb: f64,
}

/// `n` no-op commands.
fn noop_commands(n: u64) -> Vec<NewCommand> {
    (0..n)
        .map(|i| NewCommand::new(NOOP_TYPE, serde_json::json!({ "n": i })))
        .collect()
}

/// Latency sample `i` (`LATENCY_SAMPLES` is the untimed warm-up).
fn latency_command(i: usize) -> NewCommand {
    NewCommand::new(LATENCY_TYPE, serde_json::json!({ "i": i }))
}

/// Waits until `count` handlers reported their start (each sample at most `patience`
/// after the previous one); returns the start instants by sample index.
async fn wait_started(
    started: &mut mpsc::UnboundedReceiver<(usize, Instant)>,
    count: usize,
    patience: Duration,
    what: &str,
) -> Result<Vec<Instant>> {
    let mut starts: Vec<Option<Instant>> = vec![None; count];
    let mut seen = 0;
    while seen < count {
        let next = tokio::time::timeout(patience, started.recv()).await;
        let Ok(Some((i, at))) = next else {
            return Err(CliError::Bench(format!(
                "{what}: only {seen} of {count} started within {}s; is the processor \
                 running?",
                patience.as_secs()
            )));
        };
        // The warm-up sample (index `count` or beyond) fills the single slot it waits for.
        let slot = if count == 1 { 0 } else { i };
        if let Some(entry) = starts.get_mut(slot)
            && entry.is_none()
        {
            *entry = Some(at);
            seen += 1;
        }
    }
    Ok(starts.into_iter().flatten().collect())
}

/// The configuration file of the drain worker, removed when dropped.
struct WorkerConfig {
    path: PathBuf,
}

impl WorkerConfig {
    /// Writes a private (0600) icq.yaml with one source on `table` (its URL read from
    /// [`URL_VARIABLE`]) and the `noop` handler for [`NOOP_TYPE`].
    fn write(table: &TableName, concurrency: Option<u32>) -> Result<WorkerConfig> {
        use std::os::unix::fs::OpenOptionsExt;
        let settings = concurrency.map_or_else(String::new, |c| {
            format!("    settings: {{ concurrency: {c} }}\n")
        });
        let text = format!(
            "# Written by `icq bench` for its drain worker; removed when the benchmark ends.\n\
             sources:\n\
             \x20 - name: bench\n\
             \x20   url: '${{{URL_VARIABLE}}}'\n\
             \x20   table: {table}\n\
             {settings}\
             handlers:\n\
             \x20 {NOOP_TYPE}: {{ noop: true }}\n"
        );
        let path = std::env::temp_dir().join(format!("{}.yaml", table.name()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(Error::io(format!("creating {}", path.display())))?;
        let config = WorkerConfig { path };
        file.write_all(text.as_bytes())
            .and_then(|()| file.flush())
            .map_err(Error::io(format!("writing {}", config.path.display())))?;
        Ok(config)
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkerConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A live process's peak resident set (`VmHWM` in `/proc/PID/status`), in KiB; `None`
/// where there is no such file (not Linux, or the process is gone).
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The last lines of a child's stderr, as a suffix for an error message.
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let last = &lines[lines.len().saturating_sub(10)..];
    format!(":\n{}", last.join("\n"))
}

fn per_second(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The nearest-rank percentile `p` (0..=1) of sorted `values`; 0 when empty.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.50), 100.0);
        assert_eq!(percentile(&values, 0.99), 198.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn singles_are_a_tenth_of_the_jobs_and_at_least_100() {
        let mut options =
            BenchOptions::new(DatabaseUrl::new("sqlite::memory:".into()), "icq".into());
        assert_eq!(options.singles(), 2000);
        options.jobs = 200;
        assert_eq!(options.singles(), 100);
    }

    #[test]
    fn scratch_tables_are_valid_and_distinct() {
        let a = scratch_table().unwrap();
        let b = scratch_table().unwrap();
        assert!(a.name().starts_with("icq_bench_") && a.name().len() == 18);
        assert_ne!(a, b);
    }

    #[test]
    fn the_worker_config_parses_and_names_the_table() {
        let table = scratch_table().unwrap();
        let config = WorkerConfig::write(&table, Some(3)).unwrap();
        let text = std::fs::read_to_string(config.path()).unwrap();
        let url = "postgres://u:it''s@h/db".to_owned();
        let env = |name: &str| (name == URL_VARIABLE).then(|| url.clone());
        let parsed = crate::cli::config::parse(&text, config.path(), &env).unwrap();
        assert_eq!(parsed.sources[0].table, table);
        assert_eq!(parsed.sources[0].url.expose(), "postgres://u:it's@h/db");
        assert_eq!(parsed.sources[0].settings.concurrency, 3);
        assert!(parsed.handlers.contains_key(NOOP_TYPE));
        let path = config.path().to_path_buf();
        drop(config);
        assert!(!path.exists());
    }
}
