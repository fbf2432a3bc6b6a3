//! Per-source processing settings (`sources[].settings` in `icq.yaml`), with the defaults
//! from the product contract and the range each one must lie in.
//!
//! Every numeric setting is range-checked twice: while the file is read (so the error is
//! positioned at the value, and a number too large for its type is reported as out of
//! range for that key rather than as a type error), and by [`Settings::validate`], which
//! the library calls for settings built in code. The ranges:
//!
//! | key | range | |
//! |---|---|---|
//! | `batch_size` | 1 ..= 10 000 | whole |
//! | `max_attempts` | 1 ..= 1 000 000 | whole |
//! | `lease_seconds` | 1 ..= 604 800 (7 days) | whole |
//! | `retry_backoff_base_seconds` | 0 ..= 31 536 000 (365 days) | ≤ `max_retry_backoff_seconds` |
//! | `max_retry_backoff_seconds` | 0 ..= 31 536 000 | |
//! | `retention_days` | 1 ..= 36 500 (100 years) | whole |
//! | `cleanup_interval_hours` | 0.001 ..= 8 760 (365 days) | |
//! | `processing_delay_seconds` | 0 ..= 31 536 000 | whole |
//! | `polling_interval_seconds` | 0.01 ..= 3 600 | |
//! | `concurrency` | 1 ..= 10 000 | whole |
//! | `max_snoozes` | 0 ..= 1 000 000 | whole |
//!
//! A source's `queues:` (beside `settings:` in `icq.yaml`) land in
//! [`Settings::queues`]: queue names follow [`validate_queue_name`], each queue's
//! `concurrency` the range of `concurrency` above, and no queue is listed twice. A queue's
//! fleet-wide limits: `global_concurrency` and `key_concurrency` 1 ..= 1 000 000 (whole),
//! `rate` 1 ..= 1 000 000 per `s`, `min` or `h` ([`Rate`]).

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Visitor};

/// How one source is processed. Every field has the contract's default.
///
/// In code, change what you need and keep the rest; in `icq.yaml` they are the keys of a
/// source's `settings:`.
///
/// # Examples
///
/// ```
/// use icq::Settings;
///
/// let settings = Settings::default().with_concurrency(16).with_max_attempts(10);
/// assert!(settings.validate().is_ok());
/// assert_eq!(Settings::default().batch_size, 50);
///
/// let from_yaml: Settings = serde_yaml::from_str("lease_seconds: 60\nconcurrency: 2")?;
/// assert_eq!((from_yaml.lease_seconds, from_yaml.concurrency), (60, 2));
/// assert!(serde_yaml::from_str::<Settings>("batchsize: 5").is_err()); // unknown key
/// # Ok::<(), serde_yaml::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a mapping of settings")]
#[non_exhaustive]
pub struct Settings {
    /// Most rows claimed in one statement.
    #[serde(deserialize_with = "read::batch_size")]
    pub batch_size: u32,
    /// Attempts before a command is dead-lettered.
    #[serde(deserialize_with = "read::max_attempts")]
    pub max_attempts: u32,
    /// How long a claim holds a row before another processor may take it (default 20 s).
    /// A live worker renews its leases every third of this, however long its handlers
    /// run, so the lease bounds only how long a crashed worker's rows (running, or
    /// claimed ahead and buffered) wait before another worker claims them; a graceful
    /// stop releases its unstarted rows at once. A longer lease rides out longer database
    /// outages without stopping running handlers (a lease about to lapse stops its
    /// execution, so no two run at once), at the cost of a slower rescue.
    #[serde(deserialize_with = "read::lease_seconds")]
    pub lease_seconds: u64,
    /// First retry delay; doubled on every further attempt.
    #[serde(deserialize_with = "read::retry_backoff_base_seconds")]
    pub retry_backoff_base_seconds: f64,
    /// Upper bound on any retry delay.
    #[serde(deserialize_with = "read::max_retry_backoff_seconds")]
    pub max_retry_backoff_seconds: f64,
    /// Completed rows older than this are deleted by the retention sweep.
    #[serde(deserialize_with = "read::retention_days")]
    pub retention_days: u64,
    /// How often the retention sweep runs.
    #[serde(deserialize_with = "read::cleanup_interval_hours")]
    pub cleanup_interval_hours: f64,
    /// Rows younger than this are not claimed.
    #[serde(deserialize_with = "read::processing_delay_seconds")]
    pub processing_delay_seconds: u64,
    /// How often to poll when no wake-up arrives.
    #[serde(deserialize_with = "read::polling_interval_seconds")]
    pub polling_interval_seconds: f64,
    /// Rows executed at once.
    #[serde(deserialize_with = "read::concurrency")]
    pub concurrency: u32,
    /// Claim only rows whose type this worker has a handler for; rows of other types stay
    /// pending for a worker that has one. Off (the default): a row of an unknown type is
    /// claimed and dead-lettered on its first attempt, which catches typos and forgotten
    /// handlers. Turn it on when several workers with different handler sets share one
    /// table.
    pub claim_only_handled_types: bool,
    /// What sits between icq and a PostgreSQL server: `session` (the default: a direct
    /// connection, or PgBouncer in session mode, which works as direct) or `transaction`
    /// (PgBouncer in transaction mode: no LISTEN, so wake-ups come from polling, and no
    /// server-side prepared statements: every statement runs in its own transaction on
    /// the unnamed statement). Other engines ignore it.
    pub pooler: Pooler,
    /// How many times one command may snooze (a handler asking to run later without
    /// consuming an attempt: exec exit code 75, http 429/503, Rust
    /// [`HandlerError::snooze`](crate::HandlerError::snooze)). The snooze that would go
    /// past it dead-letters the command instead, saying how often it snoozed. Default
    /// 1000; `0` refuses every snooze.
    #[serde(deserialize_with = "read::max_snoozes")]
    pub max_snoozes: u32,
    /// The queues this worker serves, each with its own execution slots (a source's
    /// `queues:` in `icq.yaml`, not a key of `settings:`). Empty (the default): every
    /// queue, sharing `concurrency` slots. A worker that lists queues claims only those,
    /// and a slow queue never holds another queue's slots. Needs a version-2 table.
    #[serde(skip)]
    pub queues: Vec<QueueSettings>,
    /// The recurring commands a processor of this source schedules (a source's
    /// `schedules:` in `icq.yaml`, not a key of `settings:`). Every replica may list the
    /// same ones: each occurrence is scheduled once. Needs a version-4 table.
    #[serde(skip)]
    pub schedules: Vec<crate::recurring::Schedule>,
}

/// One queue a worker serves and how many of its commands run at once.
///
/// # Examples
///
/// ```
/// use icq::Settings;
/// use icq::settings::QueueSettings;
///
/// let settings = Settings::default()
///     .with_queues(vec![QueueSettings::new("default", 8), QueueSettings::new("webhooks", 2)]);
/// assert!(settings.validate().is_ok());
/// let twice = Settings::default()
///     .with_queues(vec![QueueSettings::new("a", 1), QueueSettings::new("a", 2)]);
/// assert_eq!(twice.validate().unwrap_err(), "queue `a` is listed twice in `queues`; list each queue once");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueSettings {
    /// The queue's name (the `Queue` column).
    pub name: String,
    /// Its commands executed at once by this worker (1 ..= 10 000).
    pub concurrency: u32,
    /// At most this many of the queue's commands run at once across every worker
    /// (`global_concurrency:`, 1 ..= 1 000 000). See [`QueueSettings::with_global_concurrency`].
    pub global_concurrency: Option<u32>,
    /// At most this many of the queue's commands with the same `ConcurrencyKey` run at
    /// once across every worker (`key_concurrency:`, 1 ..= 1 000 000); rows without a key
    /// are not limited by it.
    pub key_concurrency: Option<u32>,
    /// How fast the queue's commands may start across every worker (`rate: 50/s`).
    pub rate: Option<Rate>,
}

impl QueueSettings {
    /// A queue named `name` with `concurrency` slots. See [`QueueSettings`]'s example.
    pub fn new(name: impl Into<String>, concurrency: u32) -> QueueSettings {
        QueueSettings {
            name: name.into(),
            concurrency,
            global_concurrency: None,
            key_concurrency: None,
            rate: None,
        }
    }

    /// This queue with at most `n` of its commands running at once across the fleet: a
    /// live lease of any worker counts (running, or claimed and about to run); a crashed
    /// worker's leases stop counting when they lapse. Enforced by the claim in the
    /// database (a lock on the queue's row of the `<table>Queues` table), so any number
    /// of workers racing never exceed it. Needs a version-4 table, and every worker that
    /// serves the queue must list it with the same limits.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Settings;
    /// use icq::settings::{QueueSettings, Rate};
    ///
    /// let webhooks = QueueSettings::new("webhooks", 4)
    ///     .with_global_concurrency(6)
    ///     .with_key_concurrency(1)
    ///     .with_rate("50/s".parse::<Rate>()?);
    /// assert!(Settings::default().with_queues(vec![webhooks]).validate().is_ok());
    ///
    /// let zero = QueueSettings::new("webhooks", 4).with_global_concurrency(0);
    /// let err = Settings::default().with_queues(vec![zero]).validate().unwrap_err();
    /// assert!(err.contains("`global_concurrency` must be a whole number from 1"), "{err}");
    /// # Ok::<(), String>(())
    /// ```
    pub fn with_global_concurrency(mut self, n: u32) -> QueueSettings {
        self.global_concurrency = Some(n);
        self
    }

    /// This queue with at most `k` commands of one `ConcurrencyKey` running at once across
    /// the fleet. See [`QueueSettings::with_global_concurrency`].
    pub fn with_key_concurrency(mut self, k: u32) -> QueueSettings {
        self.key_concurrency = Some(k);
        self
    }

    /// This queue with its starts across the fleet held to `rate` (a token bucket in the
    /// database, see [`Rate`]). See [`QueueSettings::with_global_concurrency`].
    pub fn with_rate(mut self, rate: Rate) -> QueueSettings {
        self.rate = Some(rate);
        self
    }

    /// Whether any fleet-wide limit is set: such a queue is claimed through the limited
    /// claim.
    pub fn is_limited(&self) -> bool {
        self.global_concurrency.is_some() || self.key_concurrency.is_some() || self.rate.is_some()
    }
}

/// The unit of a [`Rate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RateUnit {
    /// Per second (`/s`).
    Second,
    /// Per minute (`/min`).
    Minute,
    /// Per hour (`/h`).
    Hour,
}

impl RateUnit {
    /// The unit's length in seconds.
    pub fn seconds(self) -> u32 {
        match self {
            RateUnit::Second => 1,
            RateUnit::Minute => 60,
            RateUnit::Hour => 3600,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            RateUnit::Second => "s",
            RateUnit::Minute => "min",
            RateUnit::Hour => "h",
        }
    }
}

/// A queue's fleet-wide start rate, `N/s`, `N/min` or `N/h` (`rate:` of a queue).
///
/// Enforced as a token bucket kept in the queue's row of the `<table>Queues` table and
/// refilled by the database's clock: tokens accrue at `N` per unit, a claim takes one per
/// command it starts and the bucket holds at most [`Rate::burst`] tokens — one second's
/// worth, and at least one. So over any window of `w` seconds at most
/// `burst + N/unit × w` commands start (a full bucket, then the refill), and a steady
/// backlog starts at the rate itself. A new bucket starts full.
///
/// # Examples
///
/// ```
/// use icq::settings::{Rate, RateUnit};
///
/// let rate: Rate = "50/s".parse()?;
/// assert_eq!((rate.count, rate.unit), (50, RateUnit::Second));
/// assert_eq!((rate.per_second(), rate.burst()), (50.0, 50.0));
/// let slow: Rate = "90/min".parse()?;
/// assert_eq!((slow.per_second(), slow.burst()), (1.5, 1.5));
/// assert_eq!("10/h".parse::<Rate>()?.burst(), 1.0);
/// assert_eq!(slow.to_string(), "90/min");
/// assert!("50 per second".parse::<Rate>().is_err());
/// assert!("0/s".parse::<Rate>().is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Rate {
    /// Starts per unit (1 ..= 1 000 000).
    pub count: u32,
    /// The unit.
    pub unit: RateUnit,
}

/// The most starts a rate allows per unit.
const RATE_COUNT_MAX: u32 = 1_000_000;

impl Rate {
    /// `count` starts per `unit`.
    pub fn new(count: u32, unit: RateUnit) -> Rate {
        Rate { count, unit }
    }

    /// Starts per second.
    pub fn per_second(&self) -> f64 {
        f64::from(self.count) / f64::from(self.unit.seconds())
    }

    /// The bucket's capacity: one second's worth of tokens, at least one.
    pub fn burst(&self) -> f64 {
        self.per_second().max(1.0)
    }

    fn check(&self) -> Result<(), String> {
        if (1..=RATE_COUNT_MAX).contains(&self.count) {
            Ok(())
        } else {
            Err(format!(
                "`rate` must start at least 1 and at most {RATE_COUNT_MAX} commands per unit \
                 (got {self})"
            ))
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, self.unit.suffix())
    }
}

impl std::str::FromStr for Rate {
    type Err = String;

    fn from_str(text: &str) -> Result<Rate, String> {
        let syntax = || {
            format!(
                "`rate` must be a whole number of starts per second, minute or hour, such as \
                 `50/s`, `100/min` or `1000/h` (got `{text}`)"
            )
        };
        let (count, unit) = text.trim().split_once('/').ok_or_else(syntax)?;
        let unit = match unit.trim() {
            "s" | "sec" | "second" => RateUnit::Second,
            "min" | "m" | "minute" => RateUnit::Minute,
            "h" | "hour" => RateUnit::Hour,
            _ => return Err(syntax()),
        };
        let count = count.trim();
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        let count = count.parse::<u64>().unwrap_or(u64::MAX);
        let rate = Rate {
            count: u32::try_from(count).unwrap_or(u32::MAX),
            unit,
        };
        if count > u64::from(RATE_COUNT_MAX) {
            return Err(format!(
                "`rate` must start at most {RATE_COUNT_MAX} commands per unit (got `{text}`)"
            ));
        }
        rate.check().map(|()| rate)
    }
}

/// The longest queue name, in bytes.
pub const MAX_QUEUE_NAME_BYTES: usize = 128;

/// Checks a queue name: 1 to 128 bytes, no control characters, not only whitespace, no
/// white space at either end.
///
/// # Examples
///
/// ```
/// use icq::settings::validate_queue_name;
///
/// assert!(validate_queue_name("webhooks").is_ok());
/// assert!(validate_queue_name("").is_err());
/// assert!(validate_queue_name("a\nb").is_err());
/// assert!(validate_queue_name(&"q".repeat(129)).is_err());
/// ```
pub fn validate_queue_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a queue name must not be empty".into());
    }
    if name.len() > MAX_QUEUE_NAME_BYTES {
        return Err(format!(
            "queue name is {} bytes; the most is {MAX_QUEUE_NAME_BYTES}",
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(format!(
            "queue name {:?} holds a control character; use printable text",
            name
        ));
    }
    if name.trim().is_empty() {
        return Err("a queue name must not be only whitespace".into());
    }
    if let Some(why) = crate::command::edge_whitespace(name) {
        return Err(format!("queue name {name:?}: {why}"));
    }
    Ok(())
}

/// The connection pooler in front of a PostgreSQL source (`pooler:` in a source's
/// settings).
///
/// # Examples
///
/// ```
/// use icq::settings::Pooler;
///
/// let settings: icq::Settings = serde_yaml::from_str("pooler: transaction")?;
/// assert_eq!(settings.pooler, Pooler::Transaction);
/// assert_eq!(icq::Settings::default().pooler, Pooler::Session);
/// assert!(serde_yaml::from_str::<icq::Settings>("pooler: statement").is_err());
/// # Ok::<(), serde_yaml::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Pooler {
    /// A direct connection, or a pooler that gives each client one server connection for
    /// its whole session (PgBouncer's `pool_mode = session`): LISTEN and prepared
    /// statements work.
    #[default]
    Session,
    /// A pooler that may hand each transaction to a different server connection
    /// (PgBouncer's `pool_mode = transaction`): icq does not LISTEN (it polls every
    /// `polling_interval_seconds`) and runs each statement in an explicit transaction
    /// on the unnamed statement, never a named prepared one.
    Transaction,
}

impl fmt::Display for Pooler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pooler::Session => "session",
            Pooler::Transaction => "transaction",
        })
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            batch_size: 50,
            max_attempts: 5,
            lease_seconds: 20,
            retry_backoff_base_seconds: 10.0,
            max_retry_backoff_seconds: 600.0,
            retention_days: 7,
            cleanup_interval_hours: 6.0,
            processing_delay_seconds: 0,
            polling_interval_seconds: 2.0,
            concurrency: 8,
            claim_only_handled_types: false,
            pooler: Pooler::Session,
            max_snoozes: 1000,
            queues: Vec::new(),
            schedules: Vec::new(),
        }
    }
}

/// Builders: `Settings::default().with_concurrency(16)` (the struct may grow, so it is
/// not built with a struct literal outside icq). See [`Settings`]'s example.
impl Settings {
    /// These settings with [`Settings::batch_size`] set.
    pub fn with_batch_size(mut self, batch_size: u32) -> Settings {
        self.batch_size = batch_size;
        self
    }

    /// These settings with [`Settings::max_attempts`] set.
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Settings {
        self.max_attempts = max_attempts;
        self
    }

    /// These settings with [`Settings::lease_seconds`] set.
    pub fn with_lease_seconds(mut self, lease_seconds: u64) -> Settings {
        self.lease_seconds = lease_seconds;
        self
    }

    /// These settings with [`Settings::retry_backoff_base_seconds`] set.
    pub fn with_retry_backoff_base_seconds(mut self, retry_backoff_base_seconds: f64) -> Settings {
        self.retry_backoff_base_seconds = retry_backoff_base_seconds;
        self
    }

    /// These settings with [`Settings::max_retry_backoff_seconds`] set.
    pub fn with_max_retry_backoff_seconds(mut self, max_retry_backoff_seconds: f64) -> Settings {
        self.max_retry_backoff_seconds = max_retry_backoff_seconds;
        self
    }

    /// These settings with [`Settings::retention_days`] set.
    pub fn with_retention_days(mut self, retention_days: u64) -> Settings {
        self.retention_days = retention_days;
        self
    }

    /// These settings with [`Settings::cleanup_interval_hours`] set.
    pub fn with_cleanup_interval_hours(mut self, cleanup_interval_hours: f64) -> Settings {
        self.cleanup_interval_hours = cleanup_interval_hours;
        self
    }

    /// These settings with [`Settings::processing_delay_seconds`] set.
    pub fn with_processing_delay_seconds(mut self, processing_delay_seconds: u64) -> Settings {
        self.processing_delay_seconds = processing_delay_seconds;
        self
    }

    /// These settings with [`Settings::polling_interval_seconds`] set.
    pub fn with_polling_interval_seconds(mut self, polling_interval_seconds: f64) -> Settings {
        self.polling_interval_seconds = polling_interval_seconds;
        self
    }

    /// These settings with [`Settings::concurrency`] set.
    pub fn with_concurrency(mut self, concurrency: u32) -> Settings {
        self.concurrency = concurrency;
        self
    }

    /// These settings with [`Settings::claim_only_handled_types`] set.
    pub fn with_claim_only_handled_types(mut self, claim_only_handled_types: bool) -> Settings {
        self.claim_only_handled_types = claim_only_handled_types;
        self
    }

    /// These settings with [`Settings::pooler`] set.
    pub fn with_pooler(mut self, pooler: Pooler) -> Settings {
        self.pooler = pooler;
        self
    }

    /// These settings with [`Settings::max_snoozes`] set.
    pub fn with_max_snoozes(mut self, max_snoozes: u32) -> Settings {
        self.max_snoozes = max_snoozes;
        self
    }

    /// These settings with [`Settings::queues`] set.
    pub fn with_queues(mut self, queues: Vec<QueueSettings>) -> Settings {
        self.queues = queues;
        self
    }

    /// These settings with [`Settings::schedules`] set. See
    /// [`Schedule`](crate::recurring::Schedule)'s example.
    pub fn with_schedules(mut self, schedules: Vec<crate::recurring::Schedule>) -> Settings {
        self.schedules = schedules;
        self
    }
}

/// The allowed range of one numeric setting.
#[derive(Debug, Clone, Copy)]
struct Limit {
    key: &'static str,
    min: f64,
    max: f64,
    /// Only whole numbers (the field is an integer).
    whole: bool,
}

const fn limit(key: &'static str, min: f64, max: f64, whole: bool) -> Limit {
    Limit {
        key,
        min,
        max,
        whole,
    }
}

/// 365 days, in seconds: the longest backoff or delay.
const YEAR_SECONDS: f64 = 31_536_000.0;

/// The largest `batch_size`: the most rows one claim takes.
pub(crate) const BATCH_SIZE_MAX: u32 = 10_000;

const BATCH_SIZE: Limit = limit("batch_size", 1.0, BATCH_SIZE_MAX as f64, true);
const MAX_ATTEMPTS: Limit = limit("max_attempts", 1.0, 1_000_000.0, true);
const LEASE_SECONDS: Limit = limit("lease_seconds", 1.0, 604_800.0, true);
const RETRY_BACKOFF_BASE_SECONDS: Limit =
    limit("retry_backoff_base_seconds", 0.0, YEAR_SECONDS, false);
const MAX_RETRY_BACKOFF_SECONDS: Limit =
    limit("max_retry_backoff_seconds", 0.0, YEAR_SECONDS, false);
const RETENTION_DAYS: Limit = limit("retention_days", 1.0, 36_500.0, true);
const CLEANUP_INTERVAL_HOURS: Limit = limit("cleanup_interval_hours", 0.001, 8_760.0, false);
const PROCESSING_DELAY_SECONDS: Limit = limit("processing_delay_seconds", 0.0, YEAR_SECONDS, true);
const POLLING_INTERVAL_SECONDS: Limit = limit("polling_interval_seconds", 0.01, 3_600.0, false);
const CONCURRENCY: Limit = limit("concurrency", 1.0, 10_000.0, true);
const MAX_SNOOZES: Limit = limit("max_snoozes", 0.0, 1_000_000.0, true);
/// `global_concurrency` and `key_concurrency` of a queue (the key is put in the message).
const QUEUE_LIMIT: Limit = limit("limit", 1.0, 1_000_000.0, true);

/// A number for a message: plain, or in exponent form when plain would be unreadable.
fn shown(value: f64) -> String {
    let magnitude = value.abs();
    if value.is_finite() && magnitude != 0.0 && !(1e-4..1e16).contains(&magnitude) {
        format!("{value:e}")
    } else {
        format!("{value}")
    }
}

impl Limit {
    /// What the setting must be, e.g. "a whole number from 1 to 10000".
    fn describe(&self) -> String {
        let kind = if self.whole {
            "a whole number"
        } else {
            "a number"
        };
        format!("{kind} from {} to {}", shown(self.min), shown(self.max))
    }

    /// `Ok` when `value` (shown as `original`) is allowed; else the message for the key.
    fn check(&self, value: f64, original: &str) -> Result<(), String> {
        let in_range = value >= self.min && value <= self.max;
        if in_range && (!self.whole || value.fract() == 0.0) {
            return Ok(());
        }
        let why = if value.is_nan() {
            " (got NaN)".to_string()
        } else if in_range {
            format!(" (got {original}, which is not a whole number)")
        } else if value < 0.0 && self.min >= 0.0 {
            format!(" (got {original}; it must not be negative)")
        } else {
            format!(" (got {original})")
        };
        Err(format!("`{}` must be {}{why}", self.key, self.describe()))
    }
}

impl Settings {
    /// Checks every setting against its range (see the [module docs](self)) and that the
    /// backoff base does not exceed its cap. The message names the key in backticks first
    /// (`` `lease_seconds` must be a whole number from 1 to 604800 (got 0) ``).
    ///
    /// Settings read from `icq.yaml` have passed it already; the processor calls it for
    /// settings built in code.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Settings;
    ///
    /// let zero_lease = Settings::default().with_lease_seconds(0);
    /// let problem = zero_lease.validate().unwrap_err();
    /// assert_eq!(problem, "`lease_seconds` must be a whole number from 1 to 604800 (got 0)");
    ///
    /// let inverted = Settings::default().with_retry_backoff_base_seconds(60.0).with_max_retry_backoff_seconds(5.0);
    /// assert!(inverted.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        let integers = [
            (BATCH_SIZE, u64::from(self.batch_size)),
            (MAX_ATTEMPTS, u64::from(self.max_attempts)),
            (LEASE_SECONDS, self.lease_seconds),
            (RETENTION_DAYS, self.retention_days),
            (PROCESSING_DELAY_SECONDS, self.processing_delay_seconds),
            (CONCURRENCY, u64::from(self.concurrency)),
            (MAX_SNOOZES, u64::from(self.max_snoozes)),
        ];
        for (limit, value) in integers {
            // Exact for every allowed value; an out-of-range one stays out of range.
            limit.check(value as f64, &value.to_string())?;
        }
        let reals = [
            (RETRY_BACKOFF_BASE_SECONDS, self.retry_backoff_base_seconds),
            (MAX_RETRY_BACKOFF_SECONDS, self.max_retry_backoff_seconds),
            (CLEANUP_INTERVAL_HOURS, self.cleanup_interval_hours),
            (POLLING_INTERVAL_SECONDS, self.polling_interval_seconds),
        ];
        for (limit, value) in reals {
            limit.check(value, &shown(value))?;
        }
        if self.retry_backoff_base_seconds > self.max_retry_backoff_seconds {
            return Err(format!(
                "`retry_backoff_base_seconds` ({}) must not exceed `max_retry_backoff_seconds` \
                 ({}): the first retry delay cannot be longer than the cap on every delay",
                shown(self.retry_backoff_base_seconds),
                shown(self.max_retry_backoff_seconds)
            ));
        }
        for (index, queue) in self.queues.iter().enumerate() {
            validate_queue_name(&queue.name).map_err(|why| format!("`queues`: {why}"))?;
            let value = u64::from(queue.concurrency);
            CONCURRENCY
                .check(value as f64, &value.to_string())
                .map_err(|why| format!("`queues`: queue `{}`: {why}", queue.name))?;
            for (key, value) in [
                ("global_concurrency", queue.global_concurrency),
                ("key_concurrency", queue.key_concurrency),
            ] {
                if let Some(value) = value {
                    QUEUE_LIMIT
                        .check(f64::from(value), &value.to_string())
                        .map_err(|why| {
                            format!(
                                "`queues`: queue `{}`: {}",
                                queue.name,
                                why.replacen("`limit`", &format!("`{key}`"), 1)
                            )
                        })?;
                }
            }
            if let Some(rate) = &queue.rate {
                rate.check()
                    .map_err(|why| format!("`queues`: queue `{}`: {why}", queue.name))?;
            }
            if self.queues[..index].iter().any(|q| q.name == queue.name) {
                return Err(format!(
                    "queue `{}` is listed twice in `queues`; list each queue once",
                    queue.name
                ));
            }
        }
        crate::recurring::validate_all(&self.schedules)
            .map_err(|why| format!("`schedules`: {why}"))?;
        Ok(())
    }

    /// Reads one queue's `concurrency` (range-checked like the source's).
    pub fn read_queue_concurrency<'de, D: de::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        read::concurrency(d)
    }

    /// Reads one queue's `global_concurrency` or `key_concurrency` (named by `key`):
    /// a whole number from 1 to 1 000 000.
    pub fn read_queue_limit<'de, D: de::Deserializer<'de>>(
        d: D,
        key: &'static str,
    ) -> Result<u32, D::Error> {
        let limit = Limit { key, ..QUEUE_LIMIT };
        d.deserialize_any(Number(limit)).map(|value| value as u32)
    }

    /// The lease as a duration.
    ///
    /// # Examples
    ///
    /// ```
    /// let settings = icq::Settings::default().with_lease_seconds(90);
    /// assert_eq!(settings.lease(), std::time::Duration::from_secs(90));
    /// ```
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_seconds)
    }

    /// The polling interval as a duration (clamped to its range, so never zero and never
    /// a panic, even for settings that were not validated).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use icq::Settings;
    ///
    /// assert_eq!(Settings::default().polling_interval(), Duration::from_secs(2));
    /// let unvalidated = Settings::default().with_polling_interval_seconds(0.0);
    /// assert_eq!(unvalidated.polling_interval(), Duration::from_millis(10)); // its minimum
    /// ```
    pub fn polling_interval(&self) -> Duration {
        clamped_seconds(self.polling_interval_seconds, POLLING_INTERVAL_SECONDS)
    }

    /// The retention sweep interval as a duration (clamped to its range).
    ///
    /// # Examples
    ///
    /// ```
    /// let settings = icq::Settings::default().with_cleanup_interval_hours(0.5);
    /// assert_eq!(settings.cleanup_interval(), std::time::Duration::from_secs(1800));
    /// ```
    pub fn cleanup_interval(&self) -> Duration {
        let hours = self.cleanup_interval_hours;
        let limit = CLEANUP_INTERVAL_HOURS;
        let hours = if hours.is_nan() {
            limit.min
        } else {
            hours.clamp(limit.min, limit.max)
        };
        Duration::from_secs_f64(hours * 3600.0)
    }

    /// How old a completed row must be before the sweep deletes it (clamped to its range,
    /// so it never wraps).
    ///
    /// # Examples
    ///
    /// ```
    /// let settings = icq::Settings::default().with_retention_days(2);
    /// assert_eq!(settings.retention(), std::time::Duration::from_secs(2 * 86_400));
    /// ```
    pub fn retention(&self) -> Duration {
        let days = self
            .retention_days
            .clamp(RETENTION_DAYS.min as u64, RETENTION_DAYS.max as u64);
        Duration::from_secs(days * 86_400)
    }
}

/// `seconds` as a duration, clamped to `limit` (NaN reads as the minimum).
fn clamped_seconds(seconds: f64, limit: Limit) -> Duration {
    let seconds = if seconds.is_nan() {
        limit.min
    } else {
        seconds.clamp(limit.min, limit.max)
    };
    Duration::from_secs_f64(seconds)
}

/// Reads one number for a key and checks it against the key's range as it is read, so
/// that serde_yaml positions the error at the value.
struct Number(Limit);

impl Number {
    fn accept<E: de::Error>(&self, value: f64, original: &str) -> Result<f64, E> {
        self.0.check(value, original).map_err(E::custom)?;
        Ok(value)
    }
}

impl<'de> Visitor<'de> for Number {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.describe())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        self.accept(v as f64, &v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        self.accept(v as f64, &v.to_string())
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<f64, E> {
        self.accept(v as f64, &v.to_string())
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<f64, E> {
        self.accept(v as f64, &v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        self.accept(v, &shown(v))
    }
}

/// The `deserialize_with` functions, one per numeric setting.
mod read {
    use super::*;

    fn number<'de, D: de::Deserializer<'de>>(d: D, limit: Limit) -> Result<f64, D::Error> {
        d.deserialize_any(Number(limit))
    }

    macro_rules! readers {
        ($($name:ident: $ty:ty = $limit:ident;)*) => {
            $(pub(super) fn $name<'de, D: de::Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                // In range (and whole, for integers), so the conversion is exact.
                number(d, $limit).map(|value| value as $ty)
            })*
        };
    }

    readers! {
        batch_size: u32 = BATCH_SIZE;
        max_attempts: u32 = MAX_ATTEMPTS;
        lease_seconds: u64 = LEASE_SECONDS;
        retry_backoff_base_seconds: f64 = RETRY_BACKOFF_BASE_SECONDS;
        max_retry_backoff_seconds: f64 = MAX_RETRY_BACKOFF_SECONDS;
        retention_days: u64 = RETENTION_DAYS;
        cleanup_interval_hours: f64 = CLEANUP_INTERVAL_HOURS;
        processing_delay_seconds: u64 = PROCESSING_DELAY_SECONDS;
        polling_interval_seconds: f64 = POLLING_INTERVAL_SECONDS;
        concurrency: u32 = CONCURRENCY;
        max_snoozes: u32 = MAX_SNOOZES;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_yaml(text: &str) -> Result<Settings, String> {
        serde_yaml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(Settings::default().validate(), Ok(()));
        assert_eq!(from_yaml("{}").unwrap(), Settings::default());
        assert!(!Settings::default().claim_only_handled_types);
    }

    #[test]
    fn every_key_is_range_checked_with_its_name_and_range() {
        for (text, expected) in [
            (
                "batch_size: 0",
                "`batch_size` must be a whole number from 1 to 10000 (got 0)",
            ),
            (
                "batch_size: 99999999999999999999",
                "`batch_size` must be a whole number from 1 to 10000 (got 99999999999999999999)",
            ),
            (
                "polling_interval_seconds: 1e300",
                "`polling_interval_seconds` must be a number from 0.01 to 3600 (got 1e300)",
            ),
            (
                "polling_interval_seconds: 1e-300",
                "`polling_interval_seconds` must be a number from 0.01 to 3600 (got 1e-300)",
            ),
            (
                "cleanup_interval_hours: .inf",
                "`cleanup_interval_hours` must be a number from 0.001 to 8760 (got inf)",
            ),
            (
                "retry_backoff_base_seconds: .nan",
                "`retry_backoff_base_seconds` must be a number from 0 to 31536000 (got NaN)",
            ),
            (
                "lease_seconds: 1e12",
                "`lease_seconds` must be a whole number from 1 to 604800 (got 1000000000000)",
            ),
            (
                "retention_days: 213503982334602",
                "`retention_days` must be a whole number from 1 to 36500 (got 213503982334602)",
            ),
            (
                "processing_delay_seconds: -1",
                "`processing_delay_seconds` must be a whole number from 0 to 31536000 (got -1; \
                 it must not be negative)",
            ),
            (
                "concurrency: 2.5",
                "`concurrency` must be a whole number from 1 to 10000 (got 2.5, which is not a \
                 whole number)",
            ),
            (
                "max_attempts: 1000001",
                "`max_attempts` must be a whole number from 1 to 1000000 (got 1000001)",
            ),
        ] {
            let err = from_yaml(text).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn whole_floats_and_bounds_are_accepted() {
        let s = from_yaml(
            "batch_size: 10000\nconcurrency: 1.0\nlease_seconds: 604800\npolling_interval_seconds: 0.01\n\
             retention_days: 36500\ncleanup_interval_hours: 0.001\nmax_retry_backoff_seconds: 0\n\
             retry_backoff_base_seconds: 0\nclaim_only_handled_types: true\n",
        )
        .unwrap();
        assert_eq!((s.batch_size, s.concurrency), (10_000, 1));
        assert!(s.claim_only_handled_types);
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn base_above_cap_is_refused() {
        let s = Settings {
            retry_backoff_base_seconds: 700.0,
            ..Settings::default()
        };
        let err = s.validate().unwrap_err();
        assert!(
            err.starts_with(
                "`retry_backoff_base_seconds` (700) must not exceed `max_retry_backoff_seconds` (600)"
            ),
            "{err}"
        );
    }

    #[test]
    fn validate_catches_settings_built_in_code() {
        let bad = [
            Settings {
                lease_seconds: 0,
                ..Settings::default()
            },
            Settings {
                retention_days: 213_503_982_334_602,
                ..Settings::default()
            },
            Settings {
                polling_interval_seconds: f64::NAN,
                ..Settings::default()
            },
            Settings {
                max_retry_backoff_seconds: 1e300,
                ..Settings::default()
            },
            Settings {
                batch_size: u32::MAX,
                ..Settings::default()
            },
        ];
        for settings in bad {
            assert!(settings.validate().is_err(), "{settings:?}");
        }
    }

    #[test]
    fn durations_never_panic_or_wrap_even_unvalidated() {
        let wild = Settings {
            polling_interval_seconds: 1e300,
            cleanup_interval_hours: f64::NAN,
            retention_days: u64::MAX,
            ..Settings::default()
        };
        assert_eq!(wild.polling_interval(), Duration::from_secs(3600));
        assert_eq!(wild.cleanup_interval(), Duration::from_secs_f64(3.6));
        assert_eq!(wild.retention(), Duration::from_secs(36_500 * 86_400));
        let tiny = Settings {
            polling_interval_seconds: 1e-300,
            ..Settings::default()
        };
        assert_eq!(tiny.polling_interval(), Duration::from_millis(10));
    }

    #[test]
    fn queue_limits_are_range_checked_by_name() {
        let with = |queue: QueueSettings| Settings::default().with_queues(vec![queue]).validate();
        assert_eq!(
            with(QueueSettings::new("q", 1).with_key_concurrency(0)).unwrap_err(),
            "`queues`: queue `q`: `key_concurrency` must be a whole number from 1 to 1000000 (got 0)"
        );
        assert!(with(QueueSettings::new("q", 1).with_global_concurrency(1_000_001)).is_err());
        assert!(with(QueueSettings::new("q", 1).with_rate(Rate::new(0, RateUnit::Hour))).is_err());
        assert!(with(QueueSettings::new("q", 1).with_global_concurrency(1)).is_ok());
    }
}
