//! `--sustained`: icq under a steady stream of commands for minutes, one engine at a time.
//!
//! A fresh database gets icq's table from the binary under test; N replicas of
//! `icq work --config icq.yaml` (not `--until-idle`) run an `http` handler that posts to
//! an endpoint in this process ([`endpoint`]), which records every execution. A producer
//! schedules `--rate` commands a second with plain multi-row INSERTs every 10–50 ms. Every
//! `--sample-every` the sampler records throughput, backlog, the table's footprint and the
//! window's pickup latency; optional faults hold a snapshot open and SIGKILL a replica.
//! At the end the producer stops, the backlog drains, the replicas get SIGTERM, and the
//! run is checked: every scheduled command ran at least once, and which ran twice.

mod db;
mod endpoint;
mod metrics;
mod report;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sqlx::{AssertSqlSafe, Connection};
use tokio::process::Child;
use tokio::time::Instant;

use crate::Opts;
use crate::db::FreshDb;
use crate::icq::{self, Engine, IcqBin};
use db::Db;
use endpoint::Ledger;
pub use report::Report;

/// Start-up windows left out of the clean phase's latency.
pub const WARMUP: Duration = Duration::from_secs(10);
/// After a snapshot is released, how long counts as its aftermath.
pub const AFTER_RELEASE: Duration = Duration::from_secs(30);
/// After a replica is killed, how long counts as its aftermath.
pub const AFTER_KILL: Duration = Duration::from_secs(35);

/// One window of the run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sample {
    /// Seconds since the producer started, at the window's end.
    pub t: f64,
    pub phase: &'static str,
    pub scheduled_per_s: f64,
    /// Rows that left the pending state (scheduled minus backlog), per second.
    pub completed_per_s: f64,
    /// First executions seen by the endpoint, per second.
    pub executed_per_s: f64,
    pub backlog: i64,
    /// Rows scheduled so far minus the backlog.
    pub completed_total: i64,
    pub table_bytes: i64,
    pub dead: Option<i64>,
    pub history_bytes: Option<i64>,
    pub pickup_p50_ms: Option<f64>,
    pub pickup_p99_ms: Option<f64>,
    pub claim_p99_ms: Option<f64>,
    /// The machine's 1-minute load average.
    pub load1: Option<f64>,
    #[serde(skip)]
    pub claims: metrics::Buckets,
}

/// When the faults happen, relative to the producer's start.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub duration: Duration,
    pub hold: Option<(Duration, Duration)>,
    pub kill_at: Option<Duration>,
}

impl Plan {
    pub fn from_opts(opts: &Opts) -> Self {
        Self {
            duration: opts.duration,
            hold: opts.hold_xmin_at.map(|at| (at, opts.hold_xmin_for)),
            kill_at: opts.kill_replica_at,
        }
    }

    /// The clean phase ends at the first fault (or at the end of producing).
    pub fn first_fault(&self) -> Duration {
        [self.hold.map(|(at, _)| at), self.kill_at]
            .into_iter()
            .flatten()
            .chain([self.duration])
            .min()
            .unwrap_or(self.duration)
    }

    /// The phase of the instant `t`.
    pub fn phase(&self, t: Duration) -> &'static str {
        if t > self.duration {
            return "drain";
        }
        if let Some((at, hold)) = self.hold {
            if t > at && t <= at + hold {
                return "hold";
            }
            if t > at + hold && t <= at + hold + AFTER_RELEASE {
                return "released";
            }
        }
        if let Some(at) = self.kill_at
            && t > at
            && t <= at + AFTER_KILL
        {
            return "killed";
        }
        if t <= WARMUP {
            "warmup"
        } else if t <= self.first_fault() {
            "clean"
        } else {
            "run"
        }
    }
}

/// What the kill fault saw.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Kill {
    pub at_s: f64,
    pub replica: usize,
    /// Rows leased (`LockedUntil` in the future) on any replica just before the kill, or
    /// still leased just after it.
    pub leased: usize,
    /// Of those, still pending 5 s later: the killed replica's, in practice.
    pub pending_after_5s: Option<i64>,
    /// Seconds from the kill until every row leased at that instant was completed.
    pub rescued_after_s: Option<f64>,
    #[serde(skip)]
    pub leased_n: Vec<u64>,
}

/// Runs the sustained mode on each engine in turn and prints the reports.
pub async fn run_all(opts: &Opts, bin: &IcqBin, engines: &[Engine]) -> Result<()> {
    let mut reports = Vec::new();
    for engine in engines {
        eprintln!("== sustained: {} on {}", bin.version, engine.name());
        let report = run(opts, bin, *engine)
            .await
            .map_err(|e| e.context(format!("sustained run on {} failed", engine.name())))?;
        if opts.format == crate::Format::Table {
            report.print();
        }
        reports.push(report);
    }
    if opts.format == crate::Format::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "sustained": reports }))?
        );
    }
    let problems: Vec<String> = reports.iter().flat_map(Report::problems).collect();
    if !problems.is_empty() {
        bail!("the sustained run found:\n  {}", problems.join("\n  "));
    }
    Ok(())
}

async fn run(opts: &Opts, bin: &IcqBin, engine: Engine) -> Result<Report> {
    anyhow::ensure!(opts.rate > 0, "--rate must be at least 1");
    anyhow::ensure!(
        opts.icq_replicas >= 1,
        "--replicas must be at least 1 for --sustained"
    );
    for (flag, at) in [
        ("--hold-xmin-at", opts.hold_xmin_at),
        ("--kill-replica-at", opts.kill_replica_at),
    ] {
        if let Some(at) = at {
            anyhow::ensure!(
                at < opts.duration,
                "{flag} {at:?} is not before the end of --duration {:?}",
                opts.duration
            );
        }
    }
    if opts.kill_replica_at.is_some() {
        anyhow::ensure!(
            opts.icq_replicas >= 2,
            "--kill-replica-at needs at least 2 replicas, so that another rescues the rows"
        );
    }
    let tmp = tempfile::Builder::new()
        .prefix("icq-sustained-")
        .tempdir()?;
    let ddl = icq::migration(&bin.path, engine, tmp.path()).await?;
    match engine {
        Engine::Postgres => {
            let fresh = FreshDb::postgres(&opts.pg_server).await?;
            let url = fresh.url();
            let result = async {
                let mut conn = sqlx::PgConnection::connect(&url).await?;
                sqlx::raw_sql(AssertSqlSafe(ddl))
                    .execute(&mut conn)
                    .await
                    .context("applying icq's DDL")?;
                conn.close().await?;
                let db = Db::connect(engine, &url, None).await?;
                let report = measure(opts, bin, engine, &db, &url, tmp.path()).await;
                db.close().await;
                report
            }
            .await;
            fresh.drop_db(opts.keep_databases).await?;
            result
        }
        Engine::Mysql => {
            let fresh = FreshDb::mysql(&opts.mysql_server).await?;
            let url = fresh.url();
            let result = async {
                let mut conn = sqlx::MySqlConnection::connect(&url).await?;
                sqlx::raw_sql(AssertSqlSafe(ddl))
                    .execute(&mut conn)
                    .await
                    .context("applying icq's DDL")?;
                conn.close().await?;
                let db = Db::connect(engine, &url, None).await?;
                let report = measure(opts, bin, engine, &db, &url, tmp.path()).await;
                db.close().await;
                report
            }
            .await;
            fresh.drop_db(opts.keep_databases).await?;
            result
        }
        Engine::Sqlite => {
            let file = tmp.path().join("sustained.db");
            let url = format!("sqlite://{}?mode=rwc", file.display());
            let mut conn = sqlx::SqliteConnection::connect(&url).await?;
            sqlx::raw_sql(AssertSqlSafe(ddl))
                .execute(&mut conn)
                .await
                .context("applying icq's DDL")?;
            conn.close().await?;
            let db = Db::connect(engine, &url, Some(file)).await?;
            let report = measure(opts, bin, engine, &db, &url, tmp.path()).await;
            db.close().await;
            if opts.keep_databases {
                eprintln!("  (kept {})", tmp.keep().display());
            }
            report
        }
    }
}

/// The replicas, by index; `None` once killed or stopped.
struct Replicas {
    children: Vec<Option<Child>>,
    stderr: Vec<std::path::PathBuf>,
}

impl Replicas {
    fn live(&self) -> Vec<bool> {
        self.children.iter().map(Option::is_some).collect()
    }

    /// Fails if a replica exited on its own.
    fn check(&mut self) -> Result<()> {
        for (i, slot) in self.children.iter_mut().enumerate() {
            if let Some(child) = slot
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "replica {i} exited on its own ({status}){}",
                    icq::tail(&self.stderr[i])
                );
            }
        }
        Ok(())
    }

    /// SIGTERM to every live replica, then waits for each (SIGKILL past `grace`).
    async fn stop(&mut self, grace: Duration) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        for child in self.children.iter().flatten() {
            if let Some(pid) = child.id() {
                let _ = tokio::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
        }
        for (i, slot) in self.children.iter_mut().enumerate() {
            let Some(mut child) = slot.take() else {
                continue;
            };
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(Ok(status)) => problems.push(format!(
                    "replica {i} exited with {status} after SIGTERM{}",
                    icq::tail(&self.stderr[i])
                )),
                Ok(Err(e)) => problems.push(format!("replica {i}: {e}")),
                Err(_) => {
                    child.kill().await.ok();
                    problems.push(format!(
                        "replica {i} did not stop within {grace:?} of SIGTERM"
                    ));
                }
            }
        }
        Ok(problems)
    }
}

async fn spawn_replicas(
    bin: &IcqBin,
    opts: &Opts,
    url: &str,
    endpoint: &str,
    dir: &Path,
) -> Result<(Replicas, Vec<SocketAddr>)> {
    let config = dir.join("icq.yaml");
    let settings = opts
        .icq_settings
        .as_ref()
        .map_or_else(String::new, |s| format!("    settings: {s}\n"));
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: bench\n    url: {url}\n{settings}handlers:\n  {}:\n    http: {{ url: \"{endpoint}\" }}\n",
            db::TYPE
        ),
    )?;
    let mut replicas = Replicas {
        children: Vec::new(),
        stderr: Vec::new(),
    };
    let mut addrs = Vec::new();
    for n in 0..opts.icq_replicas {
        // A free port for the replica's metrics endpoint (released just before it binds).
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let stderr_path = dir.join(format!("replica{n}.stderr"));
        let stdout = std::fs::File::create(dir.join(format!("replica{n}.stdout")))?;
        let stderr = std::fs::File::create(&stderr_path)?;
        let child = tokio::process::Command::new(&bin.path)
            .arg("work")
            .arg("--config")
            .arg(&config)
            .arg("--metrics-addr")
            .arg(addr.to_string())
            .current_dir(dir)
            .env("NO_COLOR", "1")
            .env_remove("DATABASE_URL")
            .env_remove("ICQ_CONFIG")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} work", bin.path.display()))?;
        replicas.children.push(Some(child));
        replicas.stderr.push(stderr_path);
        addrs.push(addr);
    }
    Ok((replicas, addrs))
}

async fn measure(
    opts: &Opts,
    bin: &IcqBin,
    engine: Engine,
    db: &Db,
    url: &str,
    dir: &Path,
) -> Result<Report> {
    let plan = Plan::from_opts(opts);
    let ledger = Ledger::new();
    let endpoint = endpoint::serve(ledger.clone(), Duration::from_millis(opts.handler_ms)).await?;
    let (mut replicas, addrs) = spawn_replicas(bin, opts, url, &endpoint, dir).await?;
    let mut scraper = metrics::Scraper::new(addrs);

    // Every replica up (its metrics endpoint answers) before the clock starts.
    let up_by = Instant::now() + Duration::from_secs(30);
    for i in 0..opts.icq_replicas {
        while !scraper.answers(i).await {
            replicas.check()?;
            if Instant::now() > up_by {
                bail!(
                    "replica {i} did not come up within 30 s{}",
                    icq::tail(&replicas.stderr[i])
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    scraper.window(&replicas.live()).await;

    let start = Instant::now();
    let t0 = ledger.now();
    let scheduled = Arc::new(AtomicU64::new(0));
    let mut producer = Some(tokio::spawn(produce(
        db.clone(),
        ledger.clone(),
        scheduled.clone(),
        opts.rate,
        start,
        plan.duration,
    )));

    let mut samples: Vec<Sample> = Vec::new();
    let mut hold_task = None;
    let mut kill: Option<Kill> = None;
    let mut rescue_task = None;
    let mut last = (0.0_f64, 0_u64, 0_i64, 0_usize);
    let mut next_sample = start + opts.sample_every;
    let drain_deadline_after = opts.timeout();
    let mut drained_at: Option<f64> = None;
    let mut producer_result = None;
    loop {
        let mut wake = next_sample;
        if let Some((at, _)) = plan.hold
            && hold_task.is_none()
        {
            wake = wake.min(start + at);
        }
        if let Some(at) = plan.kill_at
            && kill.is_none()
        {
            wake = wake.min(start + at);
        }
        tokio::time::sleep_until(wake).await;
        let elapsed = start.elapsed();

        if let Some((at, hold)) = plan.hold
            && hold_task.is_none()
            && elapsed >= at
        {
            eprintln!(
                "  {:>6.1}s  holding a snapshot for {hold:?}",
                elapsed.as_secs_f64()
            );
            let db = db.clone();
            let url = url.to_owned();
            hold_task = Some(tokio::spawn(
                async move { db.hold_snapshot(&url, hold).await },
            ));
        }
        if let Some(at) = plan.kill_at
            && kill.is_none()
            && elapsed >= at
        {
            // The victim: a replica that holds claimed rows it has not finished (a kill
            // that strands nothing measures nothing), retried for up to 5 s; else the one
            // that claimed the most in the last window.
            let live = replicas.live();
            let mut victim = None;
            let give_up = Instant::now() + Duration::from_secs(5);
            while victim.is_none() && Instant::now() < give_up {
                match scraper.holding_most(&live).await {
                    Some((i, held)) if held >= 1.0 => victim = Some(i),
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
            let victim = victim
                .or_else(|| scraper.busiest(&live))
                .unwrap_or(opts.icq_replicas - 1);
            let mut leased = db.leased().await?;
            if let Some(child) = replicas.children[victim].as_mut() {
                child.start_kill()?;
                child.wait().await?;
            }
            replicas.children[victim] = None;
            let killed_at = start.elapsed();
            // What the victim claimed while the first read ran is still leased now (the
            // read can take a while on a big table); the live replicas' rows in this
            // second read finish within milliseconds like the first read's.
            for row in db.leased().await? {
                if !leased.iter().any(|(id, _)| *id == row.0) {
                    leased.push(row);
                }
            }
            eprintln!(
                "  {:>6.1}s  SIGKILLed replica {victim}; {} rows leased at that instant",
                killed_at.as_secs_f64(),
                leased.len()
            );
            let (ids, ns): (Vec<String>, Vec<u64>) = leased.into_iter().unzip();
            kill = Some(Kill {
                at_s: killed_at.as_secs_f64(),
                replica: victim,
                leased: ids.len(),
                leased_n: ns,
                ..Kill::default()
            });
            let db = db.clone();
            rescue_task = Some(tokio::spawn(rescue(db, ids)));
        }

        if Instant::now() >= next_sample {
            let t = start.elapsed();
            // Whether the producer had ended before this sample's backlog was read: its
            // last INSERTs may commit after a read taken while it was still running, and a
            // backlog of 0 read then is not the end of the drain.
            let produced_all = producer_result.is_some();
            let sched_total = scheduled.load(Ordering::Relaxed);
            let fp = db.footprint().await?;
            let claims = scraper.window(&replicas.live()).await;
            let (p50, p99, firsts) = {
                let e = ledger.lock();
                let mut window: Vec<f64> = e.firsts[last.3..]
                    .iter()
                    .filter_map(|(at, n)| e.pickup_ms(*at, *n))
                    .collect();
                window.sort_by(f64::total_cmp);
                (
                    report::percentile(&window, 0.50),
                    report::percentile(&window, 0.99),
                    e.firsts.len(),
                )
            };
            let secs = t.as_secs_f64();
            let dt = secs - last.0;
            let completed = sched_total as i64 - fp.backlog;
            let sample = Sample {
                t: secs,
                // A window belongs to the phase of its middle.
                phase: plan.phase(t.saturating_sub(opts.sample_every / 2)),
                scheduled_per_s: (sched_total - last.1) as f64 / dt,
                completed_per_s: (completed - last.2) as f64 / dt,
                executed_per_s: (firsts - last.3) as f64 / dt,
                backlog: fp.backlog,
                completed_total: completed,
                table_bytes: fp.table_bytes,
                dead: fp.dead,
                history_bytes: fp.history_bytes,
                pickup_p50_ms: p50,
                pickup_p99_ms: p99,
                claim_p99_ms: metrics::quantile_ms(&claims, 0.99),
                load1: load1(),
                claims,
            };
            eprintln!("  {}", report::sample_line(&sample));
            samples.push(sample);
            last = (secs, sched_total, completed, firsts);
            next_sample += opts.sample_every;
            replicas.check()?;

            if t >= plan.duration
                && let Some(handle) = producer.take()
            {
                producer_result = Some(handle.await?);
            }
            if produced_all && fp.backlog == 0 {
                drained_at = Some(secs - plan.duration.as_secs_f64());
                break;
            }
            if t >= plan.duration + drain_deadline_after {
                eprintln!("  the backlog did not drain within {drain_deadline_after:?}");
                break;
            }
        }
        if producer.as_ref().is_some_and(|h| h.is_finished())
            && let Some(handle) = producer.take()
        {
            producer_result = Some(handle.await?);
        }
        if let Some(Err(e)) = &producer_result {
            bail!("the producer stopped: {e:#}");
        }
    }
    let scheduled_total = match producer_result {
        Some(Ok(n)) => n,
        Some(Err(e)) => bail!("the producer stopped: {e:#}"),
        None => bail!("the producer did not finish"),
    };

    if let Some(task) = hold_task {
        task.await??;
    }
    if let (Some(task), Some(k)) = (rescue_task, kill.as_mut()) {
        let waited = tokio::time::timeout(Duration::from_secs(60), task).await;
        if let Ok(Ok(Ok((after5, rescued)))) = waited {
            k.pending_after_5s = after5;
            k.rescued_after_s = rescued;
        }
    }
    let stop_problems = replicas.stop(Duration::from_secs(60)).await?;
    let counts = db.final_counts().await?;
    let claim_metric = scraper.name.clone();
    let entries = ledger.lock();
    Ok(Report::build(report::Inputs {
        engine,
        bin,
        opts,
        plan,
        t0,
        samples,
        entries: &entries,
        scheduled: scheduled_total,
        kill,
        drained_after_s: drained_at,
        counts,
        claim_metric,
        stop_problems,
    }))
}

/// Schedules `rate` commands a second until `duration` has passed: every 10–50 ms, one
/// multi-row INSERT of what the elapsed time calls for. Returns how many it scheduled.
async fn produce(
    db: Db,
    ledger: Arc<Ledger>,
    scheduled: Arc<AtomicU64>,
    rate: u32,
    start: Instant,
    duration: Duration,
) -> Result<u64> {
    let mut next: u64 = 0;
    let total = (f64::from(rate) * duration.as_secs_f64()) as u64;
    while next < total {
        let pause = 10 + (uuid::Uuid::new_v4().as_u128() % 41) as u64;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let due = ((f64::from(rate) * start.elapsed().as_secs_f64()) as u64).min(total);
        while next < due {
            let count = (due - next).min(2_000);
            db.insert(next, count).await?;
            ledger.scheduled(next, count, ledger.now());
            next += count;
            scheduled.store(next, Ordering::Relaxed);
        }
    }
    Ok(next)
}

/// Watches the rows leased at the kill: how many are still pending 5 s later, and the
/// seconds until none is.
async fn rescue(db: Db, ids: Vec<String>) -> Result<(Option<i64>, Option<f64>)> {
    let start = Instant::now();
    let mut after5 = None;
    loop {
        let left = db.still_pending(&ids).await?;
        let elapsed = start.elapsed();
        if after5.is_none() && elapsed >= Duration::from_secs(5) {
            after5 = Some(left);
        }
        if left == 0 {
            return Ok((after5.or(Some(0)), Some(elapsed.as_secs_f64())));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn load1() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
