//! icq-bench: drains the same no-op backlog on the same local servers, one peer after
//! another, each on a fresh database, and prints the drain rates side by side.
//!
//! Peers: icq (the binary, `icq work --until-idle`, on PostgreSQL / SQLite / MariaDB),
//! optionally an older icq build, graphile_worker 0.14, apalis-postgres 1.0, and a
//! plain-sqlx claim loop. `--sustained` instead runs icq alone under a steady stream of
//! commands for minutes (see `sustained`). See README.md beside this file.

mod apalis;
mod db;
mod graphile;
mod icq;
mod plain;
mod slow;
mod sustained;

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::{Parser, ValueEnum};
use serde::Serialize;

use crate::icq::{Engine, IcqBin};

#[derive(Parser, Debug)]
#[command(
    about = "Side-by-side drain benchmark: icq vs graphile_worker, apalis-postgres and plain sqlx"
)]
pub struct Opts {
    /// Jobs in each peer's backlog.
    #[arg(long, default_value_t = 50_000)]
    pub jobs: usize,
    /// Repeat the whole round this many times; the median is reported too.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// The icq binary under test [default: <this crate>/../target/release/icq].
    #[arg(long)]
    pub icq_bin: Option<PathBuf>,
    /// An older icq build, run exactly like --icq-bin, for a new-vs-old ratio.
    #[arg(long)]
    pub icq_baseline_bin: Option<PathBuf>,
    /// Engines icq (and the baseline build) run on, comma-separated.
    #[arg(long, default_value = "postgres,sqlite,mysql", value_delimiter = ',')]
    pub engines: Vec<String>,
    /// Peers to run, comma-separated (icq-baseline runs with icq when --icq-baseline-bin is given).
    #[arg(
        long,
        value_enum,
        default_value = "plain,graphile,apalis,icq",
        value_delimiter = ','
    )]
    pub peers: Vec<Peer>,
    /// PostgreSQL server (no database part): a fresh database is created on it per run.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432")]
    pub pg_server: String,
    /// MariaDB/MySQL server (no database part) for icq's mysql engine.
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    pub mysql_server: String,
    /// Give up on a drain after this many seconds (the run then fails).
    #[arg(long, default_value_t = 900)]
    pub timeout_secs: u64,
    /// Also drain with this many `icq work` replicas on one table (0 or 1: don't); the
    /// row is labelled `icq x<N>` and counts rows claimed more than once.
    #[arg(long, default_value_t = 4, alias = "replicas")]
    pub icq_replicas: usize,
    /// Run icq with a handler that takes this many milliseconds (an http handler posting
    /// to an endpoint the bench serves, which answers after the delay) instead of no-op;
    /// icq only (`--peers icq`). 0: the no-op handler. With --sustained: how long the
    /// endpoint every command posts to takes to answer (0: at once).
    #[arg(long, default_value_t = 0)]
    pub handler_ms: u64,
    /// The endpoint of `--handler-ms` once it is served.
    #[arg(skip)]
    pub handler_url: Option<String>,
    /// With --icq-replicas above 1: run only the replicas' row, not one `icq work` first.
    #[arg(long)]
    pub replicas_only: bool,
    /// A `settings:` mapping (YAML flow style, e.g. `{ prefetch: 0 }`) for the build under
    /// test (--icq-bin) only; the baseline build runs at its defaults.
    #[arg(long)]
    pub icq_settings: Option<String>,
    /// The same for the baseline build (--icq-baseline-bin).
    #[arg(long)]
    pub icq_baseline_settings: Option<String>,
    /// The build under test drains a table created by this binary's `icq migrate add`
    /// (an older build's, say, to run it on the schema version that build wrote), or by
    /// this `.sql` file (one engine's DDL, the table named `InternalCommands`)
    /// [default: its own].
    #[arg(long, value_name = "BIN|FILE.sql")]
    pub icq_ddl_from: Option<PathBuf>,
    /// The same for the baseline build (--icq-baseline-bin).
    #[arg(long, value_name = "BIN|FILE.sql")]
    pub icq_baseline_ddl_from: Option<PathBuf>,
    /// The table of the build under test at this schema version: 3 leaves the version-4
    /// section (the scheduler's columns and tables) out of the DDL [default: as written].
    /// On MySQL/MariaDB the indexes version 4 drops stay dropped: a version-3 table as
    /// icq created it comes from an older build (--icq-ddl-from).
    #[arg(long, value_name = "VERSION", value_parser = clap::value_parser!(u32).range(3..=4))]
    pub icq_schema_version: Option<u32>,
    /// The same for the baseline build (--icq-baseline-bin), e.g. the same binary as
    /// --icq-bin on a version-3 table, to measure what version 4 costs.
    #[arg(long, value_name = "VERSION", value_parser = clap::value_parser!(u32).range(3..=4))]
    pub icq_baseline_schema_version: Option<u32>,
    /// Keep each run's database instead of dropping it.
    #[arg(long)]
    pub keep_databases: bool,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,

    /// Instead of the drain: a steady stream of commands into `--icq-replicas` (alias
    /// `--replicas`) long-running `icq work` processes, one engine of --engines at a time,
    /// sampling throughput, backlog, table size and pickup latency (see README.md).
    #[arg(long, help_heading = "Sustained load")]
    pub sustained: bool,
    /// Commands scheduled per second.
    #[arg(long, default_value_t = 1000, help_heading = "Sustained load")]
    pub rate: u32,
    /// How long the producer schedules (e.g. 600s, 10m).
    #[arg(long, default_value = "600s", value_parser = parse_duration, help_heading = "Sustained load")]
    pub duration: Duration,
    /// How often to sample.
    #[arg(long, default_value = "5s", value_parser = parse_duration, help_heading = "Sustained load")]
    pub sample_every: Duration,
    /// When to open a transaction that holds back cleanup (PostgreSQL: the xmin horizon;
    /// MariaDB: purge; SQLite: WAL checkpoints).
    #[arg(long, value_parser = parse_duration, help_heading = "Sustained load")]
    pub hold_xmin_at: Option<Duration>,
    /// How long that transaction stays open.
    #[arg(long, default_value = "60s", value_parser = parse_duration, help_heading = "Sustained load")]
    pub hold_xmin_for: Duration,
    /// When to SIGKILL one replica (one that holds claimed rows it has not finished).
    #[arg(long, value_parser = parse_duration, help_heading = "Sustained load")]
    pub kill_replica_at: Option<Duration>,
}

/// `600s`, `10m`, `1h`, `250ms`, or plain seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (e.g. 600s, 10m, 250ms)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("`{text}`: unknown unit `{unit}` (ms, s, m or h)")),
    };
    Ok(Duration::from_secs_f64(seconds))
}

impl Opts {
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    Plain,
    Graphile,
    Apalis,
    Icq,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// What one peer's drain measured.
pub struct Drain {
    /// Wall seconds from the start of draining to all done.
    pub seconds: f64,
    /// Rows not completed afterwards (checked with SQL).
    pub unfinished: u64,
    /// Handler invocations counted in-process (not available for the icq binary).
    pub handled: Option<u64>,
    /// icq only: rows claimed more than once (`Attempts > 1`).
    pub claimed_twice: Option<u64>,
}

#[derive(Serialize, Clone, Debug)]
struct Row {
    queue: String,
    engine: String,
    version: String,
    jobs: usize,
    seconds: f64,
    jobs_per_s: f64,
    vs_plain_sqlx: Option<f64>,
    vs_graphile_worker: Option<f64>,
    unfinished: u64,
    handled: Option<u64>,
    claimed_twice: Option<u64>,
}

const PLAIN: &str = "plain-sqlx";
const GRAPHILE: &str = "graphile_worker";
const APALIS: &str = "apalis-postgres";

/// Polls `check` every 20 ms until it answers true, or fails after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let start = Instant::now();
    loop {
        if check().await? {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("not drained after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut opts = Opts::parse();
    if opts.sustained {
        let engines = opts
            .engines
            .iter()
            .map(|e| Engine::parse(e))
            .collect::<Result<Vec<_>>>()?;
        let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/icq");
        let bin = IcqBin::probe("icq", opts.icq_bin.as_deref().unwrap_or(&default)).await?;
        return sustained::run_all(&opts, &bin, &engines).await;
    }
    if opts.handler_ms > 0 {
        anyhow::ensure!(
            opts.peers == [Peer::Icq],
            "--handler-ms measures icq alone: pass --peers icq"
        );
        opts.handler_url = Some(slow::serve(Duration::from_millis(opts.handler_ms)).await?);
    }
    anyhow::ensure!(opts.jobs > 0, "--jobs must be at least 1");
    anyhow::ensure!(opts.runs > 0, "--runs must be at least 1");
    let engines = opts
        .engines
        .iter()
        .map(|e| Engine::parse(e))
        .collect::<Result<Vec<_>>>()?;

    let mut bins = Vec::new();
    if opts.peers.contains(&Peer::Icq) {
        let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/icq");
        bins.push(IcqBin::probe("icq", opts.icq_bin.as_deref().unwrap_or(&default)).await?);
        if let Some(old) = &opts.icq_baseline_bin {
            bins.push(IcqBin::probe("icq-baseline", old).await?);
        }
    } else if opts.icq_bin.is_some() || opts.icq_baseline_bin.is_some() {
        bail!("--icq-bin/--icq-baseline-bin given but `icq` is not among --peers");
    }

    let mut rounds: Vec<Vec<Row>> = Vec::new();
    for run in 1..=opts.runs {
        eprintln!("== round {run}/{} ({} jobs per peer)", opts.runs, opts.jobs);
        let mut rows = Vec::new();
        for peer in [Peer::Plain, Peer::Graphile, Peer::Apalis] {
            if !opts.peers.contains(&peer) {
                continue;
            }
            let (name, version) = match peer {
                Peer::Plain => (PLAIN, format!("sqlx {}", "0.9")),
                Peer::Graphile => (GRAPHILE, graphile::VERSION.to_owned()),
                Peer::Apalis => (APALIS, apalis::VERSION.to_owned()),
                Peer::Icq => unreachable!(),
            };
            eprintln!("-- {name}");
            let drain = match peer {
                Peer::Plain => plain::run(&opts).await,
                Peer::Graphile => graphile::run(&opts).await,
                Peer::Apalis => apalis::run(&opts).await,
                Peer::Icq => unreachable!(),
            }
            .map_err(|e| e.context(format!("{name} failed")))?;
            rows.push(row(name, "postgres", &version, opts.jobs, &drain));
        }
        for engine in &engines {
            let single = !(opts.replicas_only && opts.icq_replicas > 1);
            for bin in bins.iter().filter(|_| single) {
                eprintln!("-- {} ({})", bin.label, engine.name());
                let drain = icq::run(bin, *engine, &opts, 1)
                    .await
                    .map_err(|e| e.context(format!("{} on {} failed", bin.label, engine.name())))?;
                rows.push(row(
                    bin.label,
                    engine.name(),
                    &bin.version,
                    opts.jobs,
                    &drain,
                ));
            }
            if opts.icq_replicas > 1 && opts.peers.contains(&Peer::Icq) {
                for bin in &bins {
                    let label = format!("{} x{}", bin.label, opts.icq_replicas);
                    eprintln!("-- {label} ({})", engine.name());
                    let drain = icq::run(bin, *engine, &opts, opts.icq_replicas)
                        .await
                        .map_err(|e| e.context(format!("{label} on {} failed", engine.name())))?;
                    rows.push(row(&label, engine.name(), &bin.version, opts.jobs, &drain));
                }
            }
        }
        ratios(&mut rows);
        rounds.push(rows);
    }

    let median = medians(&rounds);
    let problems: Vec<String> = rounds
        .iter()
        .flatten()
        .filter(|r| r.unfinished > 0 || r.handled.is_some_and(|h| h < r.jobs as u64))
        .map(|r| {
            format!(
                "{} ({}): {} unfinished, {:?} handled of {}",
                r.queue, r.engine, r.unfinished, r.handled, r.jobs
            )
        })
        .collect();

    match opts.format {
        Format::Json => {
            let doc = serde_json::json!({
                "jobs": opts.jobs,
                "runs": opts.runs,
                "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
                "peers": {
                    "icq": bins.iter().map(|b| serde_json::json!({
                        "label": b.label, "path": b.path, "version": b.version,
                    })).collect::<Vec<_>>(),
                    GRAPHILE: graphile::VERSION,
                    APALIS: apalis::VERSION,
                    PLAIN: "sqlx 0.9",
                },
                "settings": {
                    "icq": "defaults (no settings: block)",
                    GRAPHILE: format!(
                        "concurrency {}, LocalQueueConfig::default(), complete/fail batch delay {:?}",
                        graphile::CONCURRENCY, graphile::BATCH_DELAY
                    ),
                    APALIS: "PostgresStorage::new + Config::default(), default WorkerBuilder",
                    PLAIN: format!("{} loops x {} rows per claim", plain::LOOPS, plain::BATCH),
                },
                "rounds": rounds,
                "median": median,
                "icq_vs_baseline": new_vs_old(&median),
                "icq_replicas_vs_one": replicas_vs_one(&median),
                "problems": problems,
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Format::Table => {
            for (i, rows) in rounds.iter().enumerate() {
                println!("\nround {} of {}:", i + 1, opts.runs);
                print_table(rows);
            }
            if opts.runs > 1 {
                println!("\nmedian of {} rounds:", opts.runs);
                print_table(&median);
            }
            for (engine, ratio) in new_vs_old(&median) {
                println!("icq vs icq-baseline on {engine}: {ratio:.2}x");
            }
            for (engine, ratio) in replicas_vs_one(&median) {
                println!(
                    "icq x{} vs one icq on {engine}: {ratio:.2}x",
                    opts.icq_replicas
                );
            }
        }
    }
    if !problems.is_empty() {
        bail!(
            "some peers did not finish their backlog:\n  {}",
            problems.join("\n  ")
        );
    }
    Ok(())
}

fn row(queue: &str, engine: &str, version: &str, jobs: usize, d: &Drain) -> Row {
    Row {
        queue: queue.to_owned(),
        engine: engine.to_owned(),
        version: version.to_owned(),
        jobs,
        seconds: d.seconds,
        jobs_per_s: jobs as f64 / d.seconds,
        vs_plain_sqlx: None,
        vs_graphile_worker: None,
        unfinished: d.unfinished,
        handled: d.handled,
        claimed_twice: d.claimed_twice,
    }
}

fn ratios(rows: &mut [Row]) {
    let rate =
        |name: &str, rows: &[Row]| rows.iter().find(|r| r.queue == name).map(|r| r.jobs_per_s);
    let plain = rate(PLAIN, rows);
    let graphile = rate(GRAPHILE, rows);
    for r in rows.iter_mut() {
        r.vs_plain_sqlx = plain.map(|p| r.jobs_per_s / p);
        r.vs_graphile_worker = graphile.map(|g| r.jobs_per_s / g);
    }
}

/// Per queue and engine, the round with the median seconds (the mean of the middle two
/// for an even count); ratios are recomputed from the median rates.
fn medians(rounds: &[Vec<Row>]) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    for template in &rounds[0] {
        let mut secs: Vec<f64> = rounds
            .iter()
            .flatten()
            .filter(|r| r.queue == template.queue && r.engine == template.engine)
            .map(|r| r.seconds)
            .collect();
        secs.sort_by(f64::total_cmp);
        let mid = secs.len() / 2;
        let seconds = if secs.len() % 2 == 1 {
            secs[mid]
        } else {
            (secs[mid - 1] + secs[mid]) / 2.0
        };
        let unfinished = rounds
            .iter()
            .flatten()
            .filter(|r| r.queue == template.queue && r.engine == template.engine)
            .map(|r| r.unfinished)
            .max()
            .unwrap_or(0);
        out.push(Row {
            seconds,
            jobs_per_s: template.jobs as f64 / seconds,
            unfinished,
            handled: None,
            ..template.clone()
        });
    }
    ratios(&mut out);
    out
}

/// Per engine, the rate of `icq xN` over one `icq`.
fn replicas_vs_one(rows: &[Row]) -> Vec<(String, f64)> {
    rows.iter()
        .filter(|r| r.queue.starts_with("icq x"))
        .filter_map(|many| {
            rows.iter()
                .find(|one| one.queue == "icq" && one.engine == many.engine)
                .map(|one| (many.engine.clone(), many.jobs_per_s / one.jobs_per_s))
        })
        .collect()
}

fn new_vs_old(rows: &[Row]) -> Vec<(String, f64)> {
    rows.iter()
        .filter(|r| r.queue == "icq")
        .filter_map(|new| {
            rows.iter()
                .find(|old| old.queue == "icq-baseline" && old.engine == new.engine)
                .map(|old| (new.engine.clone(), new.jobs_per_s / old.jobs_per_s))
        })
        .collect()
}

fn print_table(rows: &[Row]) {
    let header = [
        "queue",
        "engine",
        "version",
        "jobs",
        "seconds",
        "jobs/s",
        "vs plain-sqlx",
        "vs graphile_worker",
        "unfinished",
        "claimed twice",
    ];
    let ratio = |r: Option<f64>| r.map(|x| format!("{x:.2}x")).unwrap_or_else(|| "-".into());
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.queue.clone(),
                r.engine.clone(),
                r.version.clone(),
                r.jobs.to_string(),
                format!("{:.2}", r.seconds),
                format!("{:.0}", r.jobs_per_s),
                ratio(r.vs_plain_sqlx),
                ratio(r.vs_graphile_worker),
                r.unfinished.to_string(),
                r.claimed_twice
                    .map_or_else(|| "-".into(), |n| n.to_string()),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |c: &[String]| {
        let parts: Vec<String> = c
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i < 3 {
                    format!("{s:<w$}", w = widths[i])
                } else {
                    format!("{s:>w$}", w = widths[i])
                }
            })
            .collect();
        println!("| {} |", parts.join(" | "));
    };
    line(&header.map(String::from));
    println!(
        "|{}|",
        widths
            .iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("|")
    );
    for c in &cells {
        line(c);
    }
}
