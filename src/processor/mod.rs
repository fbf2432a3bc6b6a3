//! The processor: for each source, a set of named roles on River's split.
//!
//! - [`producer`] claims what the free slots will start, plus a look-ahead sized by how
//!   fast the slots take rows, into a local buffer;
//! - [`executor`] slots (up to `concurrency`, started as rows arrive and ended after a
//!   second without one) run buffered rows through their handlers;
//! - [`completer`] stamps every outcome in batches with one set-state statement;
//! - [`lease`] renews the leases of everything held and stops executions whose lease
//!   cannot be kept, and checks the leases of running handlers every second (at once on a
//!   PostgreSQL cancel notification) to stop the ones an operator cancelled;
//! - [`recurring`] ticks the source's schedules every second, scheduling each due
//!   occurrence once across every replica;
//! - [`sweeper`] deletes old completed rows; [`waker`] subscribes to insert and cancel
//!   notifications; [`idle`] claims for every idle queue of a worker that lists queues
//!   with one statement.
//! - [`health`] bounds every call and decides what a failure means; outcomes or leases
//!   that cannot be written (an error that cannot heal) hold the source's claims.
//!
//! Queues: a source whose settings list `queues` gets one *lane* per queue — a
//! producer and its own execution slots (the queue's `concurrency`), claiming only that
//! queue with its own look-ahead, byte budget and fleet pacing — while the completer, the
//! lease renewer and check, and the sweeper stay one per source. A slow queue therefore
//! holds only its own slots. A source that lists none has one lane claiming every queue
//! with `concurrency` slots, exactly as before queues existed. A lane whose claim found
//! nothing leaves polling to the source's one idle poll, so idle queues cost one claim per
//! polling interval in all. With `until_idle` the source stops when every lane is idle,
//! each lane ending only when no queue the source serves has work due or running. Listing queues needs a version-2 table: `run`
//! refuses to start on version 1 and names the upgrade.
//!
//! Guarantees: a row runs only under a live lease, and a live worker keeps its leases, so
//! a command runs twice only when a process dies; every stamp is guarded by the lease
//! token; a failure, a panic and a timeout each consume one attempt, a snooze none; a row
//! that cannot be decoded, has no handler or is past `max_attempts` is dead-lettered on
//! its own without running. On shutdown the producer stops claiming, buffered rows are
//! released at once (their attempt given back), in-flight commands get the grace period,
//! then are asked to stop (their [`Job::cancellation`](crate::Job::cancellation) fires, an
//! exec handler's process group gets SIGTERM) and after
//! [`STOP_GRACE`](crate::handler::STOP_GRACE) are dropped (the group killed) and released;
//! every outcome is stamped before `run` returns — or given up on when the database
//! cannot take it: writing ends [`HARD_STOP_WRITES`] after a hard stop and
//! [`FINAL_WRITES`] after the last execution ended (the leases lapse and the rows run
//! again).

mod completer;
mod executor;
pub(crate) mod health;
mod idle;
mod lease;
mod pauses;
mod producer;
mod recurring;
pub mod retry;
pub mod stats;
mod sweeper;
mod waker;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::engine::{Backend, ClaimedRow, SetState, StateChange};
use crate::error::{Error, Result};
use crate::handler::Registry;
use crate::settings::Settings;
pub use stats::{Stats, StatsSnapshot};

/// One source as the processor sees it: a queue and the settings to process it with
/// ([`Queue::source_handle`](crate::Queue::source_handle)). Opaque: add it to a
/// [`Processor`].
#[derive(Clone)]
pub struct SourceHandle {
    /// The configured name (`ICQ_SOURCE`).
    pub(crate) name: Arc<str>,
    /// The engine driver.
    pub(crate) backend: Arc<dyn Backend>,
    /// How to process it.
    pub(crate) settings: Settings,
    /// Signalled when a command is scheduled (in-process or via LISTEN).
    pub(crate) wake: Arc<Notify>,
    /// Counters.
    pub(crate) stats: Arc<Stats>,
    /// The queues paused fleet-wide, as last read.
    pub(crate) pauses: Arc<pauses::PauseWatch>,
}

impl SourceHandle {
    /// The source's name. See [`Queue::source_handle`](crate::Queue::source_handle)'s
    /// example.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The settings it is processed with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }
}

impl std::fmt::Debug for SourceHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceHandle")
            .field("name", &self.name)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Options for a processor run.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use icq::RunOptions;
///
/// // `icq work --until-idle`: drain what is due, then return (tests, batch jobs, cron).
/// let drain = RunOptions::default().with_until_idle(true);
/// // A service: run until shutdown, then give running commands 10 s to finish.
/// let service = RunOptions::default().with_shutdown_grace(Duration::from_secs(10));
/// assert!(drain.until_idle && !service.until_idle);
/// assert_eq!(RunOptions::default().shutdown_grace, Duration::from_secs(30));
/// ```
///
/// Ending the grace early (what `icq work` does on a second SIGINT/SIGTERM): cancel
/// [`hard_stop`](RunOptions::hard_stop). The commands still running are stopped at once
/// (an exec handler's process group killed and its leader reaped), released with their
/// attempt given back, and `run` returns once every stamp is written:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let options = icq::ConnectOptions::default().creating_table(true);
/// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
/// # let queue = source.clone();
/// use std::time::{Duration, Instant};
/// use icq::{NewCommand, Processor, Registry, RunOptions, Settings};
/// use tokio_util::sync::CancellationToken;
///
/// let mut registry = Registry::new();
/// registry.insert_exec("render", vec!["sleep".into(), "60".into()], None)?;
/// let mut processor = Processor::new(registry);
/// processor.add_source(queue.source_handle(Settings::default()));
/// queue.schedule(&NewCommand::new("render", serde_json::json!({}))).await?;
///
/// let (shutdown, hard_stop) = (CancellationToken::new(), CancellationToken::new());
/// let options = RunOptions::default()
///     .with_shutdown_grace(Duration::from_secs(600))
///     .with_hard_stop(hard_stop.clone());
/// let worker = tokio::spawn({
///     let shutdown = shutdown.clone();
///     async move { processor.run(options, shutdown).await }
/// });
/// while queue.stats().snapshot().claimed == 0 {
///     tokio::time::sleep(Duration::from_millis(10)).await;
/// }
/// let asked = Instant::now();
/// shutdown.cancel(); // the first signal: the handler may run for up to 600 s more
/// hard_stop.cancel(); // the second: stop it now
/// worker.await??;
/// assert!(asked.elapsed() < Duration::from_secs(10));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunOptions {
    /// Return once nothing is due or running (later-scheduled rows do not count).
    pub until_idle: bool,
    /// How long in-flight commands may take to finish after shutdown is requested.
    pub shutdown_grace: Duration,
    /// Ends the shutdown grace early: once cancelled, the processor stops claiming (as
    /// the `shutdown` token does), stops every command still running at once (an exec
    /// handler's process group is killed and reaped), releases them with their attempt
    /// given back and returns after every stamp is written. The teardown waits for
    /// whichever comes first, `shutdown_grace` or this token. Never cancelled by default.
    pub hard_stop: CancellationToken,
}

/// Builders: `RunOptions::default().with_until_idle(true)` (the struct may grow, so it is
/// not built with a struct literal outside icq). See [`RunOptions`]'s example.
impl RunOptions {
    /// These options with [`RunOptions::until_idle`] set.
    pub fn with_until_idle(mut self, until_idle: bool) -> RunOptions {
        self.until_idle = until_idle;
        self
    }

    /// These options with [`RunOptions::shutdown_grace`] set.
    pub fn with_shutdown_grace(mut self, shutdown_grace: Duration) -> RunOptions {
        self.shutdown_grace = shutdown_grace;
        self
    }

    /// These options with [`RunOptions::hard_stop`] set.
    pub fn with_hard_stop(mut self, hard_stop: CancellationToken) -> RunOptions {
        self.hard_stop = hard_stop;
        self
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            until_idle: false,
            shutdown_grace: Duration::from_secs(30),
            hard_stop: CancellationToken::new(),
        }
    }
}

/// Processes commands from one or more sources with one handler registry.
///
/// # Examples
///
/// Register handlers, add sources (one processor can serve several databases), run:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let options = icq::ConnectOptions::default().creating_table(true);
/// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
/// # let queue = source.clone();
/// use icq::{HandlerError, Job, NewCommand, Processor, Registry, RunOptions, Settings};
/// use icq::handler::FnHandler;
///
/// queue.schedule(&NewCommand::new("ping", serde_json::json!({}))).await?;
/// queue.schedule(&NewCommand::new("fail", serde_json::json!({}))).await?;
/// let mut registry = Registry::new();
/// registry.insert("ping", std::sync::Arc::new(icq::handler::Noop))?;
/// registry.insert("fail", std::sync::Arc::new(FnHandler(|_job: Job| async {
///     Err(HandlerError::terminal("cannot be done"))
/// })))?;
///
/// let mut processor = Processor::new(registry);
/// processor.add_source(queue.source_handle(Settings::default().with_concurrency(2)));
/// let options = RunOptions::default().with_until_idle(true);
/// processor.run(options, Default::default()).await?;
/// let stats = queue.stats().snapshot();
/// assert_eq!((stats.succeeded, stats.dead_lettered), (1, 1));
/// # Ok(())
/// # }
/// ```
pub struct Processor {
    sources: Vec<SourceHandle>,
    registry: Arc<Registry>,
}

impl Processor {
    /// A processor running `registry`'s handlers. See [`Processor`]'s example.
    pub fn new(registry: Registry) -> Processor {
        Processor {
            sources: Vec::new(),
            registry: Arc::new(registry),
        }
    }

    /// Adds a source (see [`crate::Queue::source_handle`]). See [`Processor`]'s example.
    pub fn add_source(&mut self, source: SourceHandle) -> &mut Self {
        self.sources.push(source);
        self
    }

    /// The sources added so far. See [`Queue::source_handle`](crate::Queue::source_handle)'s
    /// example.
    pub fn sources(&self) -> &[SourceHandle] {
        &self.sources
    }

    /// Runs every source until `shutdown` is cancelled (or, with `until_idle`, until each
    /// source is idle). Each source runs independently, so a burst on one cannot starve
    /// another. Fails at once when no handler is registered or a source's settings are
    /// out of range.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// # let options = icq::ConnectOptions::default().creating_table(true);
    /// # let source = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// # let queue = source.clone();
    /// use icq::{NewCommand, Processor, Registry, Settings};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// let mut registry = Registry::new();
    /// registry.insert("ping", std::sync::Arc::new(icq::handler::Noop))?;
    /// let mut processor = Processor::new(registry);
    /// processor.add_source(queue.source_handle(Settings::default()));
    ///
    /// let shutdown = CancellationToken::new();
    /// let worker = tokio::spawn({
    ///     let shutdown = shutdown.clone();
    ///     async move { processor.run(Default::default(), shutdown).await }
    /// });
    /// queue.schedule(&NewCommand::new("ping", serde_json::json!({}))).await?;
    /// while queue.stats().snapshot().succeeded == 0 {
    ///     tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    /// }
    /// shutdown.cancel(); // e.g. on SIGTERM
    /// worker.await??;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run(&self, options: RunOptions, shutdown: CancellationToken) -> Result<()> {
        if self.registry.is_empty() {
            return Err(Error::Refused(
                "no handlers are configured: a processor without handlers would dead-letter \
                 every command it claims. Add a `handlers:` section to icq.yaml (or register \
                 typed handlers) before running the processor"
                    .into(),
            ));
        }
        for source in &self.sources {
            source.settings.validate().map_err(|problem| {
                Error::invalid(format!("source `{}`: settings: {problem}", source.name))
            })?;
        }
        for source in &self.sources {
            if !source.settings.schedules.is_empty() {
                let version = source.backend.schema_version().await?;
                if version < crate::recurring::SCHEMA_VERSION {
                    return Err(crate::recurring::needs_schema(
                        source.backend.table(),
                        version,
                        &source.name,
                    ));
                }
            }
            if !source.settings.queues.is_empty() {
                let version = source.backend.schema_version().await?;
                if version < 2 {
                    return Err(Error::needs_schema_v2(
                        source.backend.table(),
                        &format!("`queues:` of source `{}`", source.name),
                    ));
                }
                let limited = source.settings.queues.iter().any(|q| q.is_limited());
                if limited && version < 4 {
                    return Err(crate::engine::limits::needs_schema_v4(
                        source.backend.table(),
                        version,
                    ));
                }
            }
        }
        let mut tasks = JoinSet::new();
        for source in &self.sources {
            let worker = SourceWorker {
                source: source.clone(),
                registry: self.registry.clone(),
                options: options.clone(),
                shutdown: shutdown.clone(),
            };
            tasks.spawn(worker.run());
        }
        let mut first_error = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    shutdown.cancel();
                    first_error.get_or_insert(err);
                }
                Err(join) => {
                    shutdown.cancel();
                    first_error
                        .get_or_insert(crate::Error::runtime("a source worker crashed")(join));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// A claimed row waiting in the buffer for an execution slot.
pub(crate) struct Buffered {
    claimed: ClaimedRow,
    /// Stops it when its lease is lost or about to lapse, or the grace ran out.
    stopper: lease::Stopper,
}

/// One set of execution slots and the producer that fills them: the whole source (every
/// queue, `concurrency` slots) or one of the queues a worker lists (its own slots).
pub(crate) struct Lane {
    /// The queue, for messages; `None` for every queue.
    pub(crate) name: Option<Arc<str>>,
    /// Its execution slots.
    pub(crate) concurrency: usize,
    /// What its claims ask for (`ClaimParams::queues`).
    pub(crate) queues: Option<Arc<[String]>>,
    /// Every queue the source's lanes serve (`None`: every queue): `until_idle` ends a
    /// lane only once none of them has work due or running, since a lane that stopped
    /// could not claim a retry that comes due in its queue while another lane still waits.
    pub(crate) served: Option<Arc<[String]>>,
    /// Its claims in flight at most.
    pub(crate) claims_in_flight: usize,
    /// The queue's fleet-wide limits: its claims go through the limited claim, one at a
    /// time, for free slots only (no look-ahead: a buffered row holds a lease, which
    /// counts against the limit).
    pub(crate) limits: Option<crate::engine::QueueLimits>,
}

/// State the roles of one lane share (the leases, the outbox and the completer belong to
/// the source and are shared by its lanes).
pub(crate) struct Shared {
    lane: Lane,
    source: SourceHandle,
    registry: Arc<Registry>,
    leases: Arc<lease::Leases>,
    /// Types this worker claims, when `claim_only_handled_types` is on.
    types: Option<Arc<[String]>>,
    buffer_tx: mpsc::UnboundedSender<Buffered>,
    buffer_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Buffered>>,
    /// Rows in the buffer (the channel is unbounded; the producer bounds it by this).
    buffered: AtomicUsize,
    /// Payload bytes of the rows in the buffer (the producer's byte budget).
    buffered_bytes: AtomicUsize,
    /// This processor's part of every lease token it writes
    /// ([`crate::command::LeaseToken::owned_by`]).
    owner: uuid::Uuid,
    /// Rows a slot is executing right now.
    active: AtomicUsize,
    /// Rows the slots have finished since the start, for the producer's pace.
    finished: std::sync::atomic::AtomicU64,
    /// Microseconds the slots spent on the rows they finished (taken to finished), so the
    /// producer's pace sees that rows finishing together took their slots that long.
    busy_micros: std::sync::atomic::AtomicU64,
    /// Signalled when a slot finishes a row, so the producer can claim into the room.
    space: Notify,
    outbox: Arc<completer::Outbox>,
    /// Outcomes or leases that cannot be written hold the claims.
    trouble: Arc<health::Trouble>,
    /// Execution slots alive (started as rows arrive, see [`executor::ensure_slots`]).
    slots_live: AtomicUsize,
    /// Every lane's execution slots (the source's).
    slots: Arc<std::sync::Mutex<JoinSet<()>>>,
    /// Tells the slots to stop taking rows (teardown).
    stop_taking: CancellationToken,
}

struct SourceWorker {
    source: SourceHandle,
    registry: Arc<Registry>,
    options: RunOptions,
    shutdown: CancellationToken,
}

impl SourceWorker {
    async fn run(self) -> Result<()> {
        let src = &self.source;
        let settings = &src.settings;
        let _keeping = KeepingConnections::start(src.backend.clone());
        // Subscribing opens a connection of its own; claiming need not wait for it.
        let cancelled = Arc::new(Notify::new());
        let listening = tokio::spawn({
            let src = src.clone();
            let cancelled = cancelled.clone();
            async move { waker::listen(&src, cancelled).await }
        });

        let leases = Arc::new(lease::Leases::default());
        let trouble = Arc::new(health::Trouble::default());
        let lanes = lanes(settings, src.backend.claims_in_flight());
        let capacity: usize = lanes
            .iter()
            .map(|lane| {
                producer::buffer_capacity(
                    settings.batch_size,
                    lane.concurrency as u32,
                    lane.claims_in_flight,
                )
            })
            .sum();
        let outbox = Arc::new(completer::Outbox::new(
            (completer::MAX_BATCH * 2).max(capacity * 2),
        ));
        let writes_end = CancellationToken::new();
        let completer = tokio::spawn(
            completer::Completer {
                source: src.name.clone(),
                backend: src.backend.clone(),
                stats: src.stats.clone(),
                leases: leases.clone(),
                outbox: outbox.clone(),
                lease: settings.lease(),
                trouble: trouble.clone(),
                until_idle: self.options.until_idle,
                writes_end: writes_end.clone(),
                wake: src.wake.clone(),
            }
            .run(),
        );
        let renew_stop = CancellationToken::new();
        let renewer = tokio::spawn(lease::renew_loop(
            src.name.clone(),
            src.backend.clone(),
            leases.clone(),
            settings.lease(),
            renew_stop.clone(),
            trouble.clone(),
            self.options.until_idle,
        ));
        let checker = tokio::spawn(lease::check_loop(
            src.name.clone(),
            src.backend.clone(),
            leases.clone(),
            settings.lease(),
            cancelled,
            renew_stop.clone(),
        ));
        let sweep_stop = CancellationToken::new();
        let sweeper = tokio::spawn(sweeper::run(src.clone(), sweep_stop.clone()));
        pauses::read(src).await;
        let pause_watch = tokio::spawn(pauses::run(src.clone(), sweep_stop.clone()));

        let types: Option<Arc<[String]>> = settings.claim_only_handled_types.then(|| {
            self.registry
                .types()
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
                .into()
        });
        let owner = uuid::Uuid::new_v4();
        let stop_taking = CancellationToken::new();
        let slot_set = Arc::new(std::sync::Mutex::new(JoinSet::new()));
        let mut shareds = Vec::with_capacity(lanes.len());
        for lane in lanes {
            let (buffer_tx, buffer_rx) = mpsc::unbounded_channel();
            let shared = Arc::new(Shared {
                lane,
                source: src.clone(),
                registry: self.registry.clone(),
                leases: leases.clone(),
                types: types.clone(),
                buffer_tx,
                buffer_rx: tokio::sync::Mutex::new(buffer_rx),
                buffered: AtomicUsize::new(0),
                buffered_bytes: AtomicUsize::new(0),
                owner,
                active: AtomicUsize::new(0),
                finished: Default::default(),
                busy_micros: Default::default(),
                space: Notify::new(),
                outbox: outbox.clone(),
                trouble: trouble.clone(),
                slots_live: AtomicUsize::new(0),
                slots: slot_set.clone(),
                stop_taking: stop_taking.clone(),
            });
            shareds.push(shared);
        }

        // Until-idle ends through the same teardown as a shutdown; a hard stop is a
        // shutdown too (the caller's token is left as it is).
        let shutdown = self.shutdown.child_token();
        let hard_stop = self.options.hard_stop.clone();
        // Schedules tick until shutdown; a drain (`until_idle`) ticks once, first, so what
        // is due now is part of what it drains.
        if self.options.until_idle {
            recurring::run(src.clone(), shutdown.clone(), true).await;
        }
        let scheduler = (!self.options.until_idle)
            .then(|| tokio::spawn(recurring::run(src.clone(), shutdown.clone(), false)));
        let hard_stop_watch = tokio::spawn({
            let (hard_stop, shutdown) = (hard_stop.clone(), shutdown.clone());
            async move {
                hard_stop.cancelled().await;
                shutdown.cancel();
            }
        });
        // One producer per lane; the first to fail stops the others. A wake-up (one
        // permit) reaches every lane: the new rows may be in any of their queues.
        let wakes: Vec<Arc<Notify>> = if shareds.len() == 1 {
            vec![src.wake.clone()]
        } else {
            shareds.iter().map(|_| Arc::new(Notify::new())).collect()
        };
        // A long-running worker listing queues: one poll for every idle lane, and
        // wake-ups go to it; `--until-idle` drains lane by lane.
        // A lane with fleet-wide limits never leaves its claims to the idle poll (whose
        // claim knows no limits); it is woken with every wake-up instead.
        let limited: Vec<usize> = shareds
            .iter()
            .enumerate()
            .filter_map(|(index, shared)| shared.lane.limits.is_some().then_some(index))
            .collect();
        let idle_lanes = (wakes.len() > 1 && !self.options.until_idle)
            .then(|| Arc::new(idle::IdleLanes::new(wakes.clone(), limited)));
        let idle_poll = idle_lanes.as_ref().map(|idle_lanes| {
            tokio::spawn(idle::poll(
                shareds.clone(),
                idle_lanes.clone(),
                src.wake.clone(),
                shutdown.clone(),
            ))
        });
        let fan_out = (wakes.len() > 1 && idle_lanes.is_none()).then(|| {
            let (wake, lanes) = (src.wake.clone(), wakes.clone());
            tokio::spawn(async move {
                loop {
                    wake.notified().await;
                    for lane in &lanes {
                        lane.notify_one();
                    }
                }
            })
        });
        let producers = shareds
            .iter()
            .zip(wakes)
            .enumerate()
            .map(|(index, (shared, wake))| {
                let shutdown = shutdown.clone();
                let options = self.options.clone();
                let shared = shared.clone();
                let idle = idle_lanes
                    .clone()
                    .filter(|_| shared.lane.limits.is_none())
                    .map(|idle| (idle, index));
                async move {
                    let stopped =
                        producer::run(shared, options, wake, shutdown.clone(), idle).await;
                    if stopped.is_err() {
                        shutdown.cancel();
                    }
                    stopped
                }
            });
        let stopped = futures::future::join_all(producers)
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>();
        hard_stop_watch.abort();
        if let Some(idle_poll) = idle_poll {
            // Its claim in flight buffers its rows before it returns.
            let _ = idle_poll.await;
        }
        if let Some(fan_out) = fan_out {
            fan_out.abort();
        }
        let stopped = stopped.map(|_| ());

        // No slot starts from here on (only the producers start them).
        let mut slots = std::mem::take(
            &mut *slot_set
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        // Teardown: stop taking rows, give running commands their grace, then stop them.
        // Writing releases and outcomes is bounded (their leases lapse anyway): it ends
        // `HARD_STOP_WRITES` after a hard stop, and `FINAL_WRITES` after the last
        // execution ended, whichever comes first.
        let hard_stop_writes = tokio::spawn({
            let (hard_stop, writes_end) = (hard_stop.clone(), writes_end.clone());
            async move {
                hard_stop.cancelled().await;
                tokio::time::sleep(HARD_STOP_WRITES).await;
                writes_end.cancel();
            }
        });
        stop_taking.cancel();
        let buffered: usize = shareds.iter().map(|shared| buffered_len(shared)).sum();
        let running = leases.len().saturating_sub(buffered);
        if running > 0 && !self.options.until_idle {
            tracing::info!(source = %src.name, running, "waiting for in-flight commands");
        }
        // Rows still buffered never started: give them back at once, not after the grace
        // (the slots let go of the buffer as soon as they are told to stop taking rows).
        let mut released = 0;
        for shared in &shareds {
            let mut buffer = shared.buffer_rx.lock().await;
            buffer.close();
            while let Ok(item) = buffer.try_recv() {
                released += 1;
                shared
                    .buffered
                    .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                shared.leases.finished(&item.claimed.lease);
                shared
                    .outbox
                    .push(SetState {
                        lease: item.claimed.lease,
                        change: StateChange::Release { run_in: None },
                    })
                    .await;
            }
        }
        if released > 0 {
            tracing::info!(source = %src.name, released, "released the leases of claimed commands that had not started");
        }
        // The grace ends when the slots are done, when it runs out, or at a hard stop,
        // whichever comes first.
        let drain = async { while slots.join_next().await.is_some() {} };
        let cut_short = tokio::select! {
            biased;
            () = drain => None,
            () = hard_stop.cancelled() => Some("hard stop requested"),
            () = tokio::time::sleep(self.options.shutdown_grace) => Some("shutdown grace ran out"),
        };
        if let Some(why) = cut_short {
            // Leases still held: running commands and outcomes not yet stamped.
            let held = leases.len();
            tracing::warn!(source = %src.name, held, "{why}; stopping the commands still running");
            // At the end of the grace each handler's cancellation fires (an exec
            // handler's group gets SIGTERM) and it has the stop grace to return; at a hard
            // stop, or when that runs out, its future is dropped: an exec handler's
            // process group is killed and its leader reaped before the slot pushes the
            // release.
            if hard_stop.is_cancelled() {
                leases.kill_all();
            } else {
                leases.stop_all();
            }
            let drain = async { while slots.join_next().await.is_some() {} };
            tokio::pin!(drain);
            tokio::select! {
                () = &mut drain => {}
                () = hard_stop.cancelled() => {
                    leases.kill_all();
                    drain.await;
                }
            }
        }
        drop(shareds);
        let final_writes = tokio::spawn({
            let writes_end = writes_end.clone();
            async move {
                tokio::time::sleep(FINAL_WRITES).await;
                writes_end.cancel();
            }
        });
        outbox.close();
        let _ = completer.await;
        final_writes.abort();
        hard_stop_writes.abort();
        renew_stop.cancel();
        let _ = renewer.await;
        let _ = checker.await;
        sweep_stop.cancel();
        let _ = sweeper.await;
        pause_watch.abort();
        if let Some(scheduler) = scheduler {
            // It stopped with the shutdown.
            let _ = scheduler.await;
        }
        listening.abort();
        stopped
    }
}

/// How long after a hard stop (a second signal) releases and outcomes may still be
/// written: a database that is gone must not keep the process from exiting.
pub(crate) const HARD_STOP_WRITES: Duration = Duration::from_secs(3);

/// How long the last releases and outcomes may take to be written once every execution
/// ended (at the end of a shutdown or a drain); on a reachable database they take
/// milliseconds.
pub(crate) const FINAL_WRITES: Duration = Duration::from_secs(10);

/// The driver keeps this processor's connections between its statements while the
/// processor runs, and hands them back to the pool when it ends (however it ends): the
/// pool is the application's again.
struct KeepingConnections(Arc<dyn Backend>);

impl KeepingConnections {
    fn start(backend: Arc<dyn Backend>) -> KeepingConnections {
        backend.keep_work_connections(true);
        KeepingConnections(backend)
    }
}

impl Drop for KeepingConnections {
    fn drop(&mut self) {
        self.0.keep_work_connections(false);
    }
}

/// The lanes of a source: one per listed queue, each with its own concurrency, or one for
/// every queue with the source's `concurrency`. Each lane gets a share of the engine's
/// claims in flight (at least one).
pub(crate) fn lanes(settings: &Settings, claims_in_flight: usize) -> Vec<Lane> {
    if settings.queues.is_empty() {
        return vec![Lane {
            name: None,
            concurrency: settings.concurrency.max(1) as usize,
            queues: None,
            served: None,
            claims_in_flight: claims_in_flight.max(1),
            limits: None,
        }];
    }
    let n = settings.queues.len();
    let share = claims_in_flight.div_ceil(n).max(1);
    let served: Arc<[String]> = settings.queues.iter().map(|q| q.name.clone()).collect();
    settings
        .queues
        .iter()
        .map(|queue| {
            let limits = crate::engine::QueueLimits::of(queue);
            Lane {
                name: Some(queue.name.as_str().into()),
                concurrency: queue.concurrency.max(1) as usize,
                queues: Some(Arc::from(vec![queue.name.clone()])),
                served: Some(served.clone()),
                // Limited claims of a queue take turns on its row lock anyway.
                claims_in_flight: if limits.is_some() { 1 } else { share },
                limits,
            }
        })
        .collect()
}

fn buffered_len(shared: &Shared) -> usize {
    shared.buffered.load(std::sync::atomic::Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::QueueSettings;

    #[test]
    fn one_lane_per_listed_queue_each_with_its_slots() {
        let all = lanes(&Settings::default(), 4);
        assert_eq!(all.len(), 1);
        assert_eq!(
            (
                all[0].concurrency,
                all[0].queues.is_none(),
                all[0].claims_in_flight
            ),
            (8, true, 4)
        );
        let settings = Settings {
            queues: vec![
                QueueSettings::new("default", 8),
                QueueSettings::new("webhooks", 2),
                QueueSettings::new("reports", 1),
            ],
            ..Settings::default()
        };
        let listed = lanes(&settings, 4);
        let shape: Vec<_> = listed
            .iter()
            .map(|lane| {
                (
                    lane.name.as_deref().unwrap().to_owned(),
                    lane.concurrency,
                    lane.queues.as_deref().unwrap().to_vec(),
                    lane.claims_in_flight,
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                ("default".into(), 8, vec!["default".to_string()], 2),
                ("webhooks".into(), 2, vec!["webhooks".to_string()], 2),
                ("reports".into(), 1, vec!["reports".to_string()], 2),
            ]
        );
        // A queue with fleet-wide limits claims through the limited claim, one at a time.
        let limited = Settings::default().with_queues(vec![
            QueueSettings::new("default", 8),
            QueueSettings::new("webhooks", 4).with_global_concurrency(6),
        ]);
        let limited = lanes(&limited, 4);
        assert!(limited[0].limits.is_none() && limited[0].claims_in_flight == 2);
        let webhooks = limited[1].limits.expect("limits");
        assert_eq!(webhooks.global_concurrency, Some(6));
        assert_eq!(limited[1].claims_in_flight, 1);
        // One claim in flight (SQLite) is one per lane, never none.
        assert!(
            lanes(&settings, 1)
                .iter()
                .all(|lane| lane.claims_in_flight == 1)
        );
    }
}
