//! The command row and the values that travel with it: ids, the captured context, the
//! state a row is in, and a new command waiting to be scheduled.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{Error, Result};

/// A command's id (the `Id` column), exactly as stored.
///
/// icq writes lowercase hyphenated UUIDs, but the table is shared with other programs: on
/// SQLite and MySQL `Id` is text, and a row may carry `AAAAAAAA-…`, `{…}` or `job-1`. The
/// id is kept verbatim so every statement matches the row exactly as it was written.
///
/// # Examples
///
/// ```
/// use icq::CommandId;
///
/// let fresh = CommandId::new();
/// assert!(fresh.as_uuid().is_some());
///
/// // A foreign writer's id is kept exactly as written (white space around it trimmed).
/// let foreign: CommandId = " job-1 ".parse()?;
/// assert_eq!(foreign.as_str(), "job-1");
/// assert_eq!(foreign.to_string(), "job-1");
/// assert_eq!(foreign.as_uuid(), None);
/// assert!("".parse::<CommandId>().is_err());
/// # Ok::<(), icq::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CommandId(Arc<str>);

impl CommandId {
    /// A fresh time-ordered (v7) id, lowercase and hyphenated.
    ///
    /// Ids made in one process sort (as UUIDs and as text) in the order they were made,
    /// even within one millisecond: rows scheduled in one transaction share `CreatedAt`,
    /// and an order key runs them by `Id` then, so their order is the order the program
    /// made them in.
    ///
    /// # Examples
    ///
    /// ```
    /// let id = icq::CommandId::new();
    /// assert_eq!(id.as_str(), id.as_str().to_lowercase());
    /// let next = icq::CommandId::new();
    /// assert!(next.as_str() > id.as_str());
    /// assert_eq!(id.as_uuid().map(|u| u.get_version_num()), Some(7));
    /// ```
    pub fn new() -> CommandId {
        // `now_v7` shares one context in the process: each id sorts after the last.
        CommandId::from(Uuid::now_v7())
    }

    /// The id as stored. See [`CommandId`]'s example.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as a UUID, when it is one (in any case, with or without braces).
    ///
    /// # Examples
    ///
    /// ```
    /// let upper: icq::CommandId = "AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE".parse()?;
    /// let uuid = upper.as_uuid().expect("a UUID in upper case");
    /// assert_eq!(uuid.to_string(), "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee");
    /// assert_eq!(upper.as_str(), "AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE"); // still verbatim
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn as_uuid(&self) -> Option<Uuid> {
        Uuid::parse_str(&self.0).ok()
    }

    /// An id read back from the database, kept verbatim.
    pub(crate) fn stored(text: impl Into<Arc<str>>) -> CommandId {
        CommandId(text.into())
    }
}

impl Default for CommandId {
    fn default() -> Self {
        CommandId::new()
    }
}

impl From<Uuid> for CommandId {
    fn from(uuid: Uuid) -> CommandId {
        CommandId(Arc::from(uuid.hyphenated().to_string()))
    }
}

impl fmt::Display for CommandId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for CommandId {
    type Err = Error;
    /// Accepts any id a row can carry: surrounding white space is trimmed, the rest is
    /// matched exactly as stored.
    fn from_str(s: &str) -> Result<CommandId> {
        let text = s.trim();
        if text.is_empty() {
            return Err(Error::invalid(
                "a command id must not be empty: ids look like 0b5e3c1e-8f0a-4c1e-9d0e-2f3a4b5c6d7e",
            ));
        }
        if text.chars().count() > 255 || text.chars().any(char::is_control) {
            return Err(Error::invalid(format!(
                "`{}` is not a command id: ids are at most 255 printable characters",
                text.escape_debug()
            )));
        }
        Ok(CommandId(Arc::from(text)))
    }
}

/// The lease token written into `LockToken` when a batch is claimed.
///
/// The processor makes these; an operator sees them in [`CommandRow::lock_token`].
///
/// # Examples
///
/// ```
/// use icq::command::LeaseToken;
///
/// let token = LeaseToken::new();
/// assert_ne!(token, LeaseToken::new());
/// assert_eq!(token.to_string(), token.0.hyphenated().to_string());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseToken(pub Uuid);

impl LeaseToken {
    /// A fresh random token. See [`LeaseToken`]'s example.
    pub fn new() -> LeaseToken {
        LeaseToken(Uuid::new_v4())
    }

    /// A fresh token whose first eight bytes are `owner`'s: every token one processor
    /// writes lies in [`LeaseToken::owner_range`], so a query can tell its leases from
    /// another processor's without a list of tokens. The other eight bytes are random.
    pub(crate) fn owned_by(owner: Uuid) -> LeaseToken {
        let mut bytes = *owner.as_bytes();
        bytes[8..].copy_from_slice(&Uuid::new_v4().as_bytes()[8..]);
        LeaseToken(Uuid::from_bytes(bytes))
    }

    /// The lowest and highest token [`LeaseToken::owned_by`] can make for `owner`.
    pub(crate) fn owner_range(owner: Uuid) -> (LeaseToken, LeaseToken) {
        let mut low = *owner.as_bytes();
        let mut high = low;
        low[8..].fill(0);
        high[8..].fill(0xff);
        (
            LeaseToken(Uuid::from_bytes(low)),
            LeaseToken(Uuid::from_bytes(high)),
        )
    }
}

impl Default for LeaseToken {
    fn default() -> Self {
        LeaseToken::new()
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// Who scheduled a command, captured at scheduling time and restored when it runs.
///
/// # Examples
///
/// ```
/// use icq::{Context, NewCommand};
///
/// let context = Context {
///     user_id: Some("u-17".into()),
///     roles: vec!["orders.write".into()],
///     tenant_id: Some("acme".into()),
///     correlation_id: Some("req-9f2".into()),
/// };
/// let command = NewCommand::new("orders.receipt", serde_json::json!({})).context(context);
/// assert_eq!(command.context.user_id.as_deref(), Some("u-17"));
/// assert_eq!(Context::default().roles.len(), 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    /// The scheduling user (`UserId`).
    pub user_id: Option<String>,
    /// The user's roles (`Roles`, a JSON array).
    #[serde(default)]
    pub roles: Vec<String>,
    /// The tenant (`TenantId`).
    pub tenant_id: Option<String>,
    /// A correlation id tying the command to the request that caused it.
    pub correlation_id: Option<String>,
}

impl Context {
    /// The roles as the JSON array text stored in `Roles`, or `None` when there are none.
    ///
    /// # Examples
    ///
    /// ```
    /// let context = icq::Context { roles: vec!["a".into(), "b".into()], ..Default::default() };
    /// assert_eq!(context.roles_json().as_deref(), Some(r#"["a","b"]"#));
    /// assert_eq!(icq::Context::default().roles_json(), None);
    /// ```
    pub fn roles_json(&self) -> Option<String> {
        if self.roles.is_empty() {
            None
        } else {
            serde_json::to_string(&self.roles).ok()
        }
    }

    /// Parses the stored `Roles` text; anything that is not a JSON array of strings is
    /// treated as a single role name so a foreign writer's value is not silently lost.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::Context;
    ///
    /// assert_eq!(Context::parse_roles(Some(r#"["a","b"]"#)), ["a", "b"]);
    /// assert_eq!(Context::parse_roles(Some("admin")), ["admin"]); // a foreign writer's text
    /// assert!(Context::parse_roles(None).is_empty());
    /// ```
    pub fn parse_roles(raw: Option<&str>) -> Vec<String> {
        match raw.map(str::trim) {
            None | Some("") => Vec::new(),
            Some(text) => {
                serde_json::from_str::<Vec<String>>(text).unwrap_or_else(|_| vec![text.to_owned()])
            }
        }
    }

    /// True when every role in `required` was captured.
    ///
    /// # Examples
    ///
    /// ```
    /// let context = icq::Context { roles: vec!["orders.write".into()], ..Default::default() };
    /// assert!(context.has_roles(&["orders.write".to_string()]));
    /// assert!(!context.has_roles(&["orders.write".into(), "admin".into()]));
    /// assert!(context.has_roles(&[]));
    /// ```
    pub fn has_roles(&self, required: &[String]) -> bool {
        required.iter().all(|r| self.roles.contains(r))
    }
}

/// When a new command becomes due.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use icq::{NewCommand, RunAt};
///
/// let now = NewCommand::new("reports.daily", serde_json::json!({}));
/// assert_eq!(now.run_at, RunAt::Now);
/// let later = now.clone().run_at(RunAt::After(Duration::from_secs(3600)));
/// let at = "2030-01-01T06:00:00Z".parse()?;
/// let fixed = now.run_at(RunAt::At(at));
/// assert_eq!(later.run_at, RunAt::After(Duration::from_secs(3600)));
/// assert_eq!(fixed.run_at, RunAt::At(at));
/// # Ok::<(), chrono::ParseError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunAt {
    /// As soon as possible (the database's `now`).
    #[default]
    Now,
    /// At a fixed instant.
    At(DateTime<Utc>),
    /// After a delay from the database's `now`.
    After(Duration),
}

/// The longest delay a command may be scheduled with (100 years): every engine stores it.
///
/// # Examples
///
/// ```
/// use icq::{NewCommand, command::MAX_DELAY};
///
/// let command = NewCommand::new("t", serde_json::json!({}));
/// assert!(command.clone().delay(MAX_DELAY).validate().is_ok());
/// let too_late = command.delay(MAX_DELAY + std::time::Duration::from_secs(1));
/// assert!(too_late.validate().is_err());
/// ```
pub const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 86_400);

fn earliest_instant() -> DateTime<Utc> {
    DateTime::<Utc>::UNIX_EPOCH
}

fn latest_instant() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("9999-12-31T23:59:59Z")
        .map(|at| at.with_timezone(&Utc))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A command about to be scheduled.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use icq::{Context, NewCommand};
///
/// let command = NewCommand::new("email.welcome", serde_json::json!({ "user": 17 }))
///     .delay(Duration::from_secs(60))
///     .context(Context { user_id: Some("u-17".into()), ..Context::default() });
/// assert_eq!(command.type_name, "email.welcome");
/// assert_eq!(command.payload["user"], 17);
/// assert!(command.validate().is_ok());
/// println!("will be scheduled as {}", command.id); // known before the insert
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NewCommand {
    /// The id to insert; generated up front so the caller knows it before commit.
    pub id: CommandId,
    /// The command type name, e.g. `orders.send_receipt`.
    pub type_name: String,
    /// The JSON document handed to the handler.
    pub payload: serde_json::Value,
    /// When it becomes due.
    pub run_at: RunAt,
    /// The captured scheduling context.
    pub context: Context,
    /// The named queue (`Queue`; schema version 2). `"default"` unless set.
    pub queue: String,
    /// `Priority` (schema version 2): lower runs first among due rows of one queue; 0
    /// unless set.
    pub priority: i16,
    /// `UniqueKey` (schema version 2): at most one pending row per key in a table.
    pub unique_key: Option<String>,
    /// `TraceParent` (schema version 2): the W3C `traceparent` of the scheduler's span.
    pub trace_parent: Option<String>,
    /// `OrderKey` (schema version 4): among pending rows of one key only the oldest
    /// scheduled (by `CreatedAt`, then `Id`) runs; a failing one holds the rest until it
    /// completes or is dead-lettered.
    pub order_key: Option<String>,
    /// `ConcurrencyKey` (schema version 4): a per-queue `key_concurrency` limits how many
    /// rows of one key run at once across the fleet.
    pub concurrency_key: Option<String>,
}

/// The queue a command goes to when none is named.
pub const DEFAULT_QUEUE: &str = "default";

impl NewCommand {
    /// A command of `type_name` with `payload`, due now, with an empty context.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{Context, NewCommand, RunAt};
    ///
    /// let command = NewCommand::new("orders.receipt", serde_json::json!({ "order": 42 }));
    /// assert_eq!(command.run_at, RunAt::Now);
    /// assert_eq!(command.context, Context::default());
    /// ```
    pub fn new(type_name: impl Into<String>, payload: serde_json::Value) -> NewCommand {
        NewCommand {
            id: CommandId::new(),
            type_name: type_name.into(),
            payload,
            run_at: RunAt::Now,
            context: Context::default(),
            queue: DEFAULT_QUEUE.to_owned(),
            priority: 0,
            unique_key: None,
            trace_parent: None,
            order_key: None,
            concurrency_key: None,
        }
    }

    /// A command built from a typed, serializable value.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{CommandType, NewCommand};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct SendReceipt {
    ///     order_id: i64,
    /// }
    /// impl CommandType for SendReceipt {
    ///     const TYPE: &'static str = "orders.send_receipt";
    /// }
    ///
    /// let command = NewCommand::typed(&SendReceipt { order_id: 42 })?;
    /// assert_eq!(command.type_name, "orders.send_receipt");
    /// assert_eq!(command.payload, serde_json::json!({ "order_id": 42 }));
    /// # Ok::<(), icq::Error>(())
    /// ```
    pub fn typed<C: CommandType>(command: &C) -> Result<NewCommand> {
        let payload = serde_json::to_value(command).map_err(|e| {
            Error::invalid_because(format!("command {} cannot be serialized: {e}", C::TYPE), e)
        })?;
        Ok(NewCommand::new(C::TYPE, payload))
    }

    /// Sets when the command becomes due. See [`RunAt`]'s example.
    pub fn run_at(mut self, run_at: RunAt) -> NewCommand {
        self.run_at = run_at;
        self
    }

    /// Delays the command by `delay` from now.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use icq::{NewCommand, RunAt};
    ///
    /// let command = NewCommand::new("t", serde_json::json!({})).delay(Duration::from_secs(90));
    /// assert_eq!(command.run_at, RunAt::After(Duration::from_secs(90)));
    /// ```
    pub fn delay(self, delay: Duration) -> NewCommand {
        self.run_at(RunAt::After(delay))
    }

    /// Sets the captured context. See [`NewCommand`]'s example.
    pub fn context(mut self, context: Context) -> NewCommand {
        self.context = context;
        self
    }

    /// Puts the command in the named queue (schema version 2; [`DEFAULT_QUEUE`] unless
    /// set). Workers serve the queues they list (`queues:`), or every queue.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::NewCommand;
    ///
    /// let command = NewCommand::new("email.send", serde_json::json!({})).queue("mail");
    /// assert_eq!(command.queue, "mail");
    /// assert!(command.validate().is_ok());
    /// assert!(NewCommand::new("t", serde_json::json!({})).queue("").validate().is_err());
    /// ```
    pub fn queue(mut self, queue: impl Into<String>) -> NewCommand {
        self.queue = queue.into();
        self
    }

    /// Sets the priority (schema version 2): among due rows, lower runs first (0 unless
    /// set; negative numbers run before the default).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::NewCommand;
    ///
    /// let urgent = NewCommand::new("alerts.page", serde_json::json!({})).priority(-10);
    /// assert_eq!(urgent.priority, -10);
    /// ```
    pub fn priority(mut self, priority: i16) -> NewCommand {
        self.priority = priority;
        self
    }

    /// Sets the unique key (schema version 2): while a pending row with this key exists
    /// in the table, scheduling another returns that row's id
    /// ([`Scheduled::existing`]) instead of inserting. Completed and dead rows free the key.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::NewCommand;
    ///
    /// let command = NewCommand::new("reports.daily", serde_json::json!({}))
    ///     .unique_key("reports.daily:2030-01-01");
    /// assert_eq!(command.unique_key.as_deref(), Some("reports.daily:2030-01-01"));
    /// assert!(command.validate().is_ok());
    /// ```
    pub fn unique_key(mut self, key: impl Into<String>) -> NewCommand {
        self.unique_key = Some(key.into());
        self
    }

    /// Sets the order key (schema version 4): commands with the same order key run one at
    /// a time, in the order they were scheduled (`CreatedAt`, then `Id`, which icq makes
    /// time-ordered). A pending row of the key holds every younger one while it waits,
    /// runs, or waits for a retry; only completing or being dead-lettered releases the
    /// next. A version-3 or older table refuses it, naming the upgrade.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::NewCommand;
    ///
    /// let command = NewCommand::new("accounts.apply", serde_json::json!({}))
    ///     .with_order_key("account:42");
    /// assert_eq!(command.order_key.as_deref(), Some("account:42"));
    /// assert!(command.validate().is_ok());
    /// let long = NewCommand::new("t", serde_json::json!({})).with_order_key("k".repeat(201));
    /// assert!(long.validate().is_err());
    /// ```
    pub fn with_order_key(mut self, key: impl Into<String>) -> NewCommand {
        self.order_key = Some(key.into());
        self
    }

    /// Sets the concurrency key (schema version 4): with the queue's `key_concurrency: K`,
    /// at most K commands of one key run at a time across the fleet. A version-3 or
    /// older table refuses it, naming the upgrade.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::NewCommand;
    ///
    /// let command = NewCommand::new("sync.tenant", serde_json::json!({}))
    ///     .with_concurrency_key("tenant:acme");
    /// assert_eq!(command.concurrency_key.as_deref(), Some("tenant:acme"));
    /// assert!(command.validate().is_ok());
    /// ```
    pub fn with_concurrency_key(mut self, key: impl Into<String>) -> NewCommand {
        self.concurrency_key = Some(key.into());
        self
    }

    /// What of schema version 4 this command asks for (an order key, a concurrency key),
    /// named for the error an older table gives; `None` when it needs no version-4 column.
    pub(crate) fn needs_v4(&self) -> Option<&'static str> {
        if self.order_key.is_some() {
            Some("an order key")
        } else if self.concurrency_key.is_some() {
            Some("a concurrency key")
        } else {
            None
        }
    }

    /// Sets the W3C `traceparent` stored with the row (schema version 2; dropped on a
    /// version-1 table, which has no column for it).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::NewCommand;
    ///
    /// let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    /// let command = NewCommand::new("t", serde_json::json!({})).trace_parent(parent);
    /// assert_eq!(command.trace_parent.as_deref(), Some(parent));
    /// ```
    pub fn trace_parent(mut self, trace_parent: impl Into<String>) -> NewCommand {
        self.trace_parent = Some(trace_parent.into());
        self
    }

    /// What of schema version 2 this command asks for (a queue other than
    /// [`DEFAULT_QUEUE`], a priority other than 0, a unique key), named for the error a
    /// version-1 table gives; `None` when it schedules on any table. The trace parent is
    /// not in it: a version-1 table stores the command without it.
    pub(crate) fn needs_v2(&self) -> Option<&'static str> {
        if self.unique_key.is_some() {
            Some("a unique key")
        } else if self.queue != DEFAULT_QUEUE {
            Some("a queue other than `default`")
        } else if self.priority != 0 {
            Some("a priority other than 0")
        } else {
            None
        }
    }

    /// Whether the insert must name the version-2 columns (a trace context counts, its own
    /// or the span it is scheduled in).
    pub(crate) fn uses_v2_columns(&self) -> bool {
        self.needs_v2().is_some()
            || self.needs_v4().is_some()
            || self.trace_parent_to_store().is_some()
    }

    /// Checks what every engine would otherwise reject less clearly: an empty or overlong
    /// type, a delay beyond [`MAX_DELAY`], an instant outside 1970–9999. The scheduling
    /// functions of [`crate::admin`] call it for you.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::NewCommand;
    ///
    /// assert!(NewCommand::new("orders.receipt", serde_json::json!({})).validate().is_ok());
    /// let err = NewCommand::new(" ", serde_json::json!({})).validate().unwrap_err();
    /// assert_eq!(err.to_string(), "a command type must not be empty");
    /// ```
    pub fn validate(&self) -> Result<()> {
        if self.type_name.trim().is_empty() {
            return Err(Error::invalid("a command type must not be empty"));
        }
        if let Some(why) = edge_whitespace(&self.type_name) {
            return Err(Error::invalid(format!(
                "`{}` is not a command type: {why}",
                crate::redact::echo(&self.type_name)
            )));
        }
        if self.type_name.len() > 255 {
            return Err(Error::invalid(format!(
                "command type `{}…` is longer than 255 characters",
                self.type_name.chars().take(40).collect::<String>()
            )));
        }
        match self.run_at {
            RunAt::After(delay) if delay > MAX_DELAY => {
                return Err(Error::invalid(format!(
                    "a delay of {}s is too long: commands can be scheduled at most 100 years ahead",
                    delay.as_secs()
                )));
            }
            RunAt::At(at) if !(earliest_instant()..=latest_instant()).contains(&at) => {
                return Err(Error::invalid(format!(
                    "{at} is out of range: RunAt must be between 1970-01-01 and 9999-12-31 (UTC)"
                )));
            }
            _ => {}
        }
        validate_queue_name(&self.queue)?;
        if let Some(key) = &self.unique_key {
            validate_unique_key(key)?;
        }
        if let Some(key) = &self.order_key {
            validate_key("an order key", key)?;
        }
        if let Some(key) = &self.concurrency_key {
            validate_key("a concurrency key", key)?;
        }
        if let Some(parent) = &self.trace_parent
            && (parent.len() > 255 || parent.contains('\0'))
        {
            return Err(Error::invalid(
                "a trace parent must be at most 255 bytes, without NUL",
            ));
        }
        Ok(())
    }
}

/// The longest queue name, in bytes (MariaDB's `VARCHAR(128)`).
pub const MAX_QUEUE_NAME_BYTES: usize = 128;

/// The longest unique key, in bytes (MariaDB's `VARCHAR(255)`).
pub const MAX_UNIQUE_KEY_BYTES: usize = 255;

/// Checks a queue name: 1 to [`MAX_QUEUE_NAME_BYTES`] bytes, no control characters (so no
/// NUL or line break), not only whitespace, no white space at either end. A bad name is
/// [`Error::Invalid`]. A queue named in a filter is checked by
/// [`validate_queue_filter`] instead.
///
/// # Examples
///
/// ```
/// use icq::command::validate_queue_name;
///
/// assert!(validate_queue_name("mail").is_ok());
/// assert!(validate_queue_name("reports (eu)").is_ok());
/// for bad in ["", "  ", "a\nb", "nul\0", "mail ", " mail"] {
///     let err = validate_queue_name(bad).unwrap_err();
///     assert!(matches!(err, icq::Error::Invalid { .. }), "{bad:?}");
/// }
/// assert!(validate_queue_name(&"q".repeat(129)).is_err());
/// ```
pub fn validate_queue_name(name: &str) -> Result<()> {
    validate_queue_filter(name)?;
    match edge_whitespace(name) {
        Some(why) => Err(queue_name_error(name, &why)),
        None => Ok(()),
    }
}

/// Checks a queue named in a filter (`--queue` of the operator commands): what
/// [`validate_queue_name`] checks but white space at an end, which a queue scheduled by
/// another program may have; a filter matches it byte for byte.
/// `icq::admin::check_queue_name` is this same function.
///
/// # Examples
///
/// ```
/// use icq::command::validate_queue_filter;
///
/// assert!(validate_queue_filter("emails ").is_ok());
/// for bad in ["", "  ", "a\nb"] {
///     let err = validate_queue_filter(bad).unwrap_err();
///     assert!(matches!(err, icq::Error::Invalid { .. }), "{bad:?}");
/// }
/// ```
pub fn validate_queue_filter(name: &str) -> Result<()> {
    let problem = if name.is_empty() {
        "it is empty".to_owned()
    } else if name.len() > MAX_QUEUE_NAME_BYTES {
        format!(
            "it is {} bytes long (at most {MAX_QUEUE_NAME_BYTES})",
            name.len()
        )
    } else if name.chars().any(char::is_control) {
        "it holds a control character".to_owned()
    } else if name.trim().is_empty() {
        "it is only whitespace".to_owned()
    } else {
        return Ok(());
    };
    Err(queue_name_error(name, &problem))
}

fn queue_name_error(name: &str, problem: &str) -> Error {
    Error::invalid(format!(
        "`{}` is not a queue name: {problem}; a queue name is 1 to {MAX_QUEUE_NAME_BYTES} \
         bytes of text without control characters",
        crate::redact::echo(name)
    ))
}

/// Why a type or queue name with white space at either end is refused (`None` when it has
/// none): names are compared byte for byte, so `"emails "` would be a queue no worker for
/// `emails` serves, and a type no handler matches, while looking the same in every
/// listing. White space inside a name (`reports (eu)`) is kept as written.
pub fn edge_whitespace(name: &str) -> Option<String> {
    let trimmed = name.trim();
    (trimmed != name && !trimmed.is_empty()).then(|| {
        format!(
            "it begins or ends with white space (names are matched byte for byte); write it \
             without: `{}`",
            crate::redact::echo(trimmed)
        )
    })
}

/// Checks a unique key: 1–255 bytes, no NUL.
///
/// # Examples
///
/// ```
/// use icq::command::validate_unique_key;
///
/// assert!(validate_unique_key("invoice:42").is_ok());
/// assert!(validate_unique_key("").is_err());
/// assert!(validate_unique_key("a\0b").is_err());
/// assert!(validate_unique_key(&"k".repeat(256)).is_err());
/// ```
pub fn validate_unique_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::invalid("a unique key must not be empty"));
    }
    if key.len() > MAX_UNIQUE_KEY_BYTES {
        return Err(Error::invalid(format!(
            "unique key `{}…` is longer than {MAX_UNIQUE_KEY_BYTES} bytes",
            key.chars().take(40).collect::<String>()
        )));
    }
    if key.contains('\0') {
        return Err(Error::invalid("a unique key must not hold NUL"));
    }
    Ok(())
}

/// The longest order or concurrency key, in bytes (MariaDB's `VARCHAR(200)`).
pub const MAX_KEY_BYTES: usize = 200;

/// Checks an order or concurrency key (`what` names it in the error): 1 to
/// [`MAX_KEY_BYTES`] bytes, no NUL.
///
/// # Examples
///
/// ```
/// use icq::command::validate_key;
///
/// assert!(validate_key("an order key", "account:42").is_ok());
/// let err = validate_key("an order key", &"k".repeat(201)).unwrap_err();
/// assert!(err.to_string().contains("1 to 200 bytes"), "{err}");
/// assert!(validate_key("a concurrency key", "").is_err());
/// assert!(validate_key("a concurrency key", "a\0b").is_err());
/// ```
pub fn validate_key(what: &str, key: &str) -> Result<()> {
    let problem = if key.is_empty() {
        "it is empty".to_owned()
    } else if key.len() > MAX_KEY_BYTES {
        format!("it is {} bytes long", key.len())
    } else if key.contains('\0') {
        "it holds NUL".to_owned()
    } else {
        return Ok(());
    };
    Err(Error::invalid(format!(
        "`{}` is not {what}: {problem}; a key is 1 to {MAX_KEY_BYTES} bytes of text without NUL",
        crate::redact::echo(&key.chars().take(40).collect::<String>())
    )))
}

/// What scheduling one command did: the id of its row, and whether that row already
/// existed (a pending row with the same unique key, whose id is returned instead of
/// inserting a second row).
///
/// Compares equal to a [`CommandId`] and dereferences to it, so `queue.get(&scheduled)`
/// works.
///
/// # Examples
///
/// ```
/// use icq::command::{CommandId, Scheduled};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// # icq::schema::apply(&pool, &icq::TableName::default()).await?;
/// # let queue = icq::Queue::from_pool("shop", &pool, &icq::TableName::default()).await?;
/// let command = icq::NewCommand::new("t", serde_json::json!({}));
/// let id: CommandId = command.id.clone();
/// let scheduled: Scheduled = queue.schedule(&command).await?;
/// assert!(!scheduled.existing);
/// assert_eq!(scheduled, id);
/// assert_eq!(scheduled.as_str(), id.as_str());
/// assert_eq!(scheduled.to_string(), id.to_string());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[non_exhaustive]
pub struct Scheduled {
    /// The row's id: the new row's, or the existing pending row's.
    pub id: CommandId,
    /// `true` when a pending row with the command's unique key already existed and
    /// nothing was inserted.
    pub existing: bool,
}

impl Scheduled {
    /// A freshly inserted row.
    pub(crate) fn new(id: CommandId) -> Scheduled {
        Scheduled {
            id,
            existing: false,
        }
    }
}

impl std::ops::Deref for Scheduled {
    type Target = CommandId;

    fn deref(&self) -> &CommandId {
        &self.id
    }
}

impl PartialEq<CommandId> for Scheduled {
    fn eq(&self, other: &CommandId) -> bool {
        self.id == *other
    }
}

impl PartialEq<Scheduled> for CommandId {
    fn eq(&self, other: &Scheduled) -> bool {
        *self == other.id
    }
}

impl fmt::Display for Scheduled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.id.fmt(f)
    }
}

/// A Rust type that is a command: serializable, with a stable type name.
///
/// Schedule one with [`NewCommand::typed`]; handle it with [`crate::Registry::register`].
///
/// # Examples
///
/// ```
/// use icq::CommandType;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct SendReceipt {
///     order_id: i64,
/// }
///
/// impl CommandType for SendReceipt {
///     const TYPE: &'static str = "orders.send_receipt";
/// }
///
/// assert_eq!(SendReceipt::TYPE, "orders.send_receipt");
/// ```
pub trait CommandType: Serialize + serde::de::DeserializeOwned + Send + Sync + 'static {
    /// The type name stored in `Type`, e.g. `orders.send_receipt`. See [`CommandType`]'s
    /// example.
    const TYPE: &'static str;
}

/// The column names of `defects` (each `column <name>: <reason>`), in order, once each.
pub fn unreadable_columns(defects: &[String]) -> Vec<String> {
    let mut columns: Vec<String> = Vec::new();
    for defect in defects {
        if let Some((name, _)) = defect
            .strip_prefix("column ")
            .and_then(|rest| rest.split_once(':'))
            && !columns.iter().any(|c| c == name)
        {
            columns.push(name.to_owned());
        }
    }
    columns
}

/// One row of the commands table, every column decoded.
///
/// # Examples
///
/// Read back with [`Queue::get`](crate::Queue::get) (or [`admin::show`](crate::admin::show)):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
/// # let options = icq::ConnectOptions::default().creating_table(true);
/// # let queue = icq::Queue::connect("shop", &url, &Default::default(), &options).await?;
/// use icq::{Context, NewCommand, State};
///
/// let context = Context { user_id: Some("u-17".into()), ..Context::default() };
/// let command = NewCommand::new("orders.receipt", serde_json::json!({ "order": 42 }));
/// let id = queue.schedule(&command.context(context.clone())).await?;
///
/// let row = queue.get(&id).await?.expect("just scheduled");
/// assert_eq!((row.type_name.as_str(), row.attempts), ("orders.receipt", 0));
/// assert_eq!(row.context(), context);
/// assert_eq!(row.state(chrono::Utc::now()), State::Due);
/// assert_eq!(row.defect_summary(), None); // every column decoded
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct CommandRow {
    /// `Id`.
    pub id: CommandId,
    /// `Type`.
    #[serde(rename = "type")]
    pub type_name: String,
    /// `Payload`.
    pub payload: serde_json::Value,
    /// `CreatedAt`.
    pub created_at: DateTime<Utc>,
    /// `RunAt`.
    pub run_at: DateTime<Utc>,
    /// `Attempts` (consumed, including the one under way once claimed).
    pub attempts: i32,
    /// `LockToken`.
    pub lock_token: Option<LeaseToken>,
    /// `LockedUntil`.
    pub locked_until: Option<DateTime<Utc>>,
    /// `ProcessedAt`.
    pub processed_at: Option<DateTime<Utc>>,
    /// `DeadLetteredAt`.
    pub dead_lettered_at: Option<DateTime<Utc>>,
    /// `LastError`.
    pub last_error: Option<String>,
    /// `UserId`.
    pub user_id: Option<String>,
    /// `Roles`, decoded.
    pub roles: Vec<String>,
    /// `TenantId`.
    pub tenant_id: Option<String>,
    /// `CorrelationId`.
    pub correlation_id: Option<String>,
    /// `Queue` (`"default"` on a version-1 table).
    pub queue: String,
    /// `Priority` (0 on a version-1 table).
    pub priority: i16,
    /// `UniqueKey`.
    pub unique_key: Option<String>,
    /// `TraceParent`.
    pub trace_parent: Option<String>,
    /// `Snoozes`: how many times a handler asked to run later (0 on a version-1 table).
    pub snoozes: i32,
    /// `ConcurrencyKey` (schema version 4): commands sharing one run at most their queue's
    /// `key_concurrency` at a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// `OrderKey` (schema version 4): commands sharing one run one at a time, oldest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_key: Option<String>,
    /// `Errors` (schema version 4) as stored: the last failed attempts, a JSON array.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<String>,
    /// Columns that could not be decoded, each with the reason (empty for a healthy row).
    /// A claimed row with defects is dead-lettered without running; listings show it with
    /// the column's value replaced by a neutral placeholder.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub defects: Vec<String>,
}

impl CommandRow {
    /// A row whose columns are all placeholders, for decoders that fill in what they can.
    pub(crate) fn placeholder(id: CommandId) -> CommandRow {
        CommandRow {
            id,
            type_name: String::new(),
            payload: serde_json::Value::Null,
            created_at: DateTime::<Utc>::UNIX_EPOCH,
            run_at: DateTime::<Utc>::UNIX_EPOCH,
            attempts: 0,
            lock_token: None,
            locked_until: None,
            processed_at: None,
            dead_lettered_at: None,
            last_error: None,
            user_id: None,
            roles: Vec::new(),
            tenant_id: None,
            correlation_id: None,
            queue: DEFAULT_QUEUE.to_owned(),
            priority: 0,
            unique_key: None,
            trace_parent: None,
            snoozes: 0,
            concurrency_key: None,
            order_key: None,
            errors: None,
            defects: Vec::new(),
        }
    }

    /// Why this row cannot be run, when some column could not be decoded.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # let table = icq::TableName::default();
    /// # icq::schema::apply(&pool, &table).await?;
    /// # let queue = icq::Queue::from_pool("shop", &pool, &table).await?;
    /// let id = queue.schedule(&icq::NewCommand::new("t", serde_json::json!({}))).await?;
    /// let mut row = queue.get(&id).await?.expect("just scheduled");
    /// assert_eq!(row.defect_summary(), None);
    /// row.defects.push("Payload: not JSON".into()); // what a decoder notes
    /// let summary = row.defect_summary();
    /// assert_eq!(summary.as_deref(), Some("row cannot be processed: Payload: not JSON"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn defect_summary(&self) -> Option<String> {
        if self.defects.is_empty() {
            None
        } else {
            Some(format!(
                "row cannot be processed: {}",
                self.defects.join("; ")
            ))
        }
    }

    /// The captured context as stored in the row. See [`CommandRow`]'s example.
    pub fn context(&self) -> Context {
        Context {
            user_id: self.user_id.clone(),
            roles: self.roles.clone(),
            tenant_id: self.tenant_id.clone(),
            correlation_id: self.correlation_id.clone(),
        }
    }

    /// The captured context, moved out of the row (which keeps none): the executor's one
    /// copy for the job, where [`CommandRow::context`] would clone every field.
    pub(crate) fn take_context(&mut self) -> Context {
        Context {
            user_id: self.user_id.take(),
            roles: std::mem::take(&mut self.roles),
            tenant_id: self.tenant_id.take(),
            correlation_id: self.correlation_id.take(),
        }
    }

    /// The row's state at instant `now`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use chrono::{Duration, Utc};
    /// use icq::State;
    ///
    /// # let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// # let table = icq::TableName::default();
    /// # icq::schema::apply(&pool, &table).await?;
    /// # let queue = icq::Queue::from_pool("shop", &pool, &table).await?;
    /// # let id = queue.schedule(&icq::NewCommand::new("t", serde_json::json!({}))).await?;
    /// let mut row = queue.get(&id).await?.expect("just scheduled");
    /// let now = Utc::now();
    /// row.run_at = now + Duration::hours(1);
    /// assert_eq!(row.state(now), State::Scheduled);
    /// assert_eq!(row.state(now + Duration::hours(2)), State::Due);
    /// row.locked_until = Some(now + Duration::minutes(5)); // claimed under a live lease
    /// assert_eq!(row.state(now + Duration::hours(2)), State::Due); // the lease has lapsed
    /// row.run_at = now;
    /// assert_eq!(row.state(now), State::Running);
    /// row.processed_at = Some(now);
    /// assert_eq!(row.state(now), State::Completed);
    /// # Ok(())
    /// # }
    /// ```
    pub fn state(&self, now: DateTime<Utc>) -> State {
        if self.processed_at.is_some() {
            State::Completed
        } else if self.dead_lettered_at.is_some() {
            State::Dead
        } else if self.locked_until.is_some_and(|until| until > now) {
            State::Running
        } else if self.run_at <= now {
            State::Due
        } else {
            State::Scheduled
        }
    }
}

/// The state of a command, as defined by the product contract.
///
/// # Examples
///
/// ```
/// use icq::State;
///
/// assert_eq!(State::Dead.as_str(), "dead");
/// assert_eq!(serde_json::to_string(&State::Scheduled)?, r#""scheduled""#);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Pending and `RunAt <= now`.
    Due,
    /// Pending and `RunAt > now`.
    Scheduled,
    /// Pending with a live lease.
    Running,
    /// `ProcessedAt` set.
    Completed,
    /// `DeadLetteredAt` set.
    Dead,
}

impl State {
    /// The state's name, as JSON and `icq list --state` spell it. See [`State`]'s example.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Due => "due",
            State::Scheduled => "scheduled",
            State::Running => "running",
            State::Completed => "completed",
            State::Dead => "dead",
        }
    }
}

/// Formats an instant the way icq stores it in SQLite and prints it: RFC 3339, UTC,
/// millisecond precision, `Z` suffix. Lexical order equals time order.
///
/// # Examples
///
/// ```
/// use icq::command::format_timestamp;
///
/// let at = chrono::DateTime::from_timestamp(1_700_000_000, 500_000_000).unwrap();
/// assert_eq!(format_timestamp(at), "2023-11-14T22:13:20.500Z");
/// ```
pub fn format_timestamp(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// Parses a stored timestamp: RFC 3339, SQLite's `YYYY-MM-DD HH:MM:SS[.fff]` or
/// `YYYY-MM-DDTHH:MM:SS[.fff]` (UTC), or integer/fractional Unix seconds (SQLite's
/// "integer time", as other programs may write it).
///
/// # Examples
///
/// ```
/// use icq::command::parse_timestamp;
///
/// let at = parse_timestamp("2023-11-14T22:13:20.500Z").unwrap();
/// assert_eq!(parse_timestamp("2023-11-14 22:13:20.5"), Some(at));
/// assert_eq!(parse_timestamp("1700000000.5"), Some(at));
/// assert_eq!(parse_timestamp("tomorrow"), None);
/// ```
pub fn parse_timestamp(text: &str) -> Option<DateTime<Utc>> {
    let text = text.trim();
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Some(at.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(naive) = chrono::NaiveDateTime::parse_from_str(text, format) {
            return Some(naive.and_utc());
        }
    }
    let seconds: f64 = text.parse().ok()?;
    if !seconds.is_finite() || text.contains(['e', 'E', 'i', 'I', 'n', 'N']) {
        return None;
    }
    let whole = seconds.floor();
    // chrono's range is about ±262,000 years; anything beyond is not a time icq can use.
    if whole.abs() > 8.0e12 {
        return None;
    }
    let nanos = ((seconds - whole) * 1e9).round().min(999_999_999.0) as u32;
    DateTime::from_timestamp(whole as i64, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids made one after another, on several threads at once, sort in the order each
    /// thread made them, as UUIDs and as the text `Id` holds (`now_v7`'s shared context
    /// orders ids within one millisecond).
    #[test]
    fn new_ids_sort_in_the_order_they_were_made() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| (0..50_000).map(|_| CommandId::new()).collect::<Vec<_>>())
            })
            .collect();
        let mut all = Vec::new();
        for thread in threads {
            let ids = thread.join().unwrap();
            for pair in ids.windows(2) {
                assert!(
                    pair[0].as_str() < pair[1].as_str(),
                    "{} !< {}",
                    pair[0],
                    pair[1]
                );
                assert!(pair[0].as_uuid() < pair[1].as_uuid());
            }
            all.extend(ids);
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 200_000, "no id made twice");
    }

    #[test]
    fn roles_round_trip_and_tolerate_foreign_text() {
        let ctx = Context {
            roles: vec!["a".into(), "b".into()],
            ..Context::default()
        };
        let json = ctx.roles_json().unwrap();
        assert_eq!(Context::parse_roles(Some(&json)), ctx.roles);
        assert_eq!(Context::parse_roles(Some("admin")), vec!["admin"]);
        assert!(Context::parse_roles(None).is_empty());
    }

    #[test]
    fn timestamps_sort_lexically() {
        let a = parse_timestamp("2026-01-01T00:00:00.5Z").unwrap();
        let b = parse_timestamp("2026-01-01 00:00:01").unwrap();
        assert!(format_timestamp(a) < format_timestamp(b));
        assert_eq!(format_timestamp(a), "2026-01-01T00:00:00.500Z");
    }

    #[test]
    fn integer_time_and_garbage() {
        assert_eq!(
            parse_timestamp("1700000000").unwrap(),
            DateTime::from_timestamp(1_700_000_000, 0).unwrap()
        );
        assert!(parse_timestamp("1e10").is_none());
        assert!(parse_timestamp("infinity").is_none());
        assert!(parse_timestamp("99999999999999999999").is_none());
        assert!(parse_timestamp("tomorrow").is_none());
    }

    #[test]
    fn ids_are_kept_verbatim() {
        let upper: CommandId = "AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE".parse().unwrap();
        assert_eq!(upper.as_str(), "AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE");
        assert!(upper.as_uuid().is_some());
        let braced: CommandId = "{aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee}".parse().unwrap();
        assert_eq!(braced.as_str(), "{aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee}");
        let job: CommandId = " job-1 ".parse().unwrap();
        assert_eq!(job.as_str(), "job-1");
        assert!(job.as_uuid().is_none());
        assert!("".parse::<CommandId>().is_err());
        assert!("a\nb".parse::<CommandId>().is_err());
    }
}
