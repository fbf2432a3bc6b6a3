//! `icq schedule`: one command, or many from a JSON Lines document, into one source.
//!
//! Input is read with a bound: [`read_limited`] reads at most an [`InputLimit`] of a
//! payload (`@/dev/zero` fails after the limit, not when the kernel kills the process),
//! and [`read_jobs`] streams a JSON Lines document line by line, no line longer than the
//! limit, so memory holds one line and the commands parsed so far, never the whole file.

use std::io::{BufRead, Read};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::command::{CommandId, Context, NewCommand, RunAt};
use crate::error::{Error, Result};
use crate::queue::Queue;

use super::Progress;

/// Commands inserted per bulk-schedule call (one progress step).
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
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use icq::admin::{Progress, SCHEDULE_CHUNK, schedule_many};
/// use icq::NewCommand;
///
/// struct Steps(AtomicU64);
/// impl Progress for Steps {
///     fn begin(&self, _label: &str, _total: u64) {}
///     fn advance(&self, _n: u64) {
///         self.0.fetch_add(1, Ordering::Relaxed);
///     }
///     fn finish(&self) {}
/// }
/// let commands: Vec<NewCommand> =
///     (0..=SCHEDULE_CHUNK).map(|_| NewCommand::new("t", serde_json::json!({}))).collect();
/// let steps = Steps(AtomicU64::new(0));
/// schedule_many(&source, &commands, &steps).await?;
/// assert_eq!(steps.0.load(Ordering::Relaxed), 2); // 1000 commands, then 1
/// # Ok(())
/// # }
/// ```
pub const SCHEDULE_CHUNK: usize = 1000;

/// The default [`InputLimit`]: 16 MiB, what MySQL and MariaDB accept in one packet by
/// default (`max_allowed_packet`), far above any sensible payload.
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 16 * 1024 * 1024;

/// The most bytes one input may hold: one payload, or one line of a JSON Lines document.
///
/// # Examples
///
/// ```
/// use icq::admin::{DEFAULT_MAX_INPUT_BYTES, InputLimit, read_limited};
///
/// let limit = InputLimit { bytes: 8, raise_with: "--max-input-bytes" };
/// assert_eq!(read_limited(&b"{\"a\":1}"[..], &limit, "--payload")?, b"{\"a\":1}");
/// let err = read_limited(std::io::repeat(0), &limit, "the payload file /dev/zero").unwrap_err();
/// assert!(matches!(err, icq::Error::Invalid { .. }));
/// assert!(err.to_string().contains("larger than 8 bytes"), "{err}");
/// assert!(err.to_string().contains("--max-input-bytes"), "{err}");
/// assert_eq!(InputLimit::default().bytes, DEFAULT_MAX_INPUT_BYTES);
/// # Ok::<(), icq::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimit {
    /// The most bytes.
    pub bytes: u64,
    /// How the caller's user raises the limit (a flag, a variable), named in the error.
    pub raise_with: &'static str,
}

impl Default for InputLimit {
    fn default() -> Self {
        InputLimit {
            bytes: DEFAULT_MAX_INPUT_BYTES,
            raise_with: "InputLimit::bytes",
        }
    }
}

impl InputLimit {
    fn exceeded(&self, what: &str) -> Error {
        Error::invalid(format!(
            "{what} is larger than {} bytes, the input limit; nothing was read past it and \
             nothing was scheduled (raise the limit with {})",
            self.bytes, self.raise_with
        ))
    }
}

/// Reads all of `reader` (a payload file, stdin), failing with [`Error::Invalid`] as soon as
/// it holds more than `limit.bytes`: memory never holds more than the limit. `origin`
/// names the input in errors. See [`InputLimit`]'s example.
pub fn read_limited(reader: impl Read, limit: &InputLimit, origin: &str) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader
        .take(limit.bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(Error::io(format!("reading {origin}")))?;
    if bytes.len() as u64 > limit.bytes {
        return Err(limit.exceeded(origin));
    }
    Ok(bytes)
}

/// The one source a command is scheduled into: scheduling needs an unambiguous target.
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
/// # let sources = vec![source];
/// use icq::admin::one_source;
///
/// // `sources`: the queues the command line selected.
/// assert_eq!(one_source(&sources)?.name(), "shop");
/// let two = [sources[0].clone(), sources[0].clone()];
/// assert!(one_source(&two).is_err()); // say which one with --source
/// # Ok(())
/// # }
/// ```
pub fn one_source(sources: &[Queue]) -> Result<&Queue> {
    match sources {
        [one] => Ok(one),
        [] => Err(Error::Ambiguous(
            "no source is configured to schedule into".into(),
        )),
        many => Err(Error::Ambiguous(format!(
            "{} sources are configured ({}); say which one to schedule into with --source NAME",
            many.len(),
            many.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The result of scheduling one command: `{"id": ID}`.
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
/// use icq::NewCommand;
///
/// let command = NewCommand::new("t", serde_json::json!({}));
/// let scheduled = icq::admin::schedule(&source, &command).await?;
/// assert_eq!(scheduled.source, "shop");
/// let json = serde_json::to_value(&scheduled)?; // `icq schedule --format json`
/// assert_eq!(json, serde_json::json!({ "id": scheduled.id, "existing": false }));
/// assert_eq!(scheduled.summary(), format!("Scheduled {} in source shop.", scheduled.id));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scheduled {
    /// The command's id: the new row's, or, with `existing`, the pending row's that
    /// holds the command's unique key.
    pub id: CommandId,
    /// `true` when a pending row with the command's unique key already existed: nothing
    /// was inserted.
    pub existing: bool,
    /// The source it was scheduled into (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

impl Scheduled {
    /// The sentence `icq schedule` prints: what was scheduled, or which pending command
    /// already holds the unique key.
    pub fn summary(&self) -> String {
        if self.existing {
            format!(
                "Already scheduled: pending command {} in source {} holds that unique key; \
                 nothing was added.",
                self.id, self.source
            )
        } else {
            format!("Scheduled {} in source {}.", self.id, self.source)
        }
    }
}

/// The result of scheduling from a file: `{"ids": [...]}`.
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
/// use icq::admin::{NoProgress, parse_jobs, schedule_many};
///
/// let lines = "{\"type\": \"a\", \"payload\": 1}\n{\"type\": \"b\", \"payload\": 2}\n";
/// let commands = parse_jobs(lines, "jobs.jsonl")?;
/// let scheduled = schedule_many(&source, &commands, &NoProgress).await?;
/// assert_eq!(scheduled.ids, [commands[0].id.clone(), commands[1].id.clone()]);
/// let json = serde_json::to_value(&scheduled)?;
/// assert_eq!(json["ids"].as_array().map(Vec::len), Some(2));
/// assert_eq!(json["existing"], serde_json::json!([false, false]));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduledMany {
    /// The commands' ids, in line order (a line whose unique key a pending row holds
    /// has that row's id).
    pub ids: Vec<CommandId>,
    /// For each id, whether its row already existed (the line's unique key was held by a
    /// pending row, or by an earlier line): nothing was inserted for it.
    pub existing: Vec<bool>,
    /// The source they were scheduled into (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

impl ScheduledMany {
    /// The sentence `icq schedule --from-file` prints; `count` words a number of
    /// commands (`1 command`, `2 commands`).
    pub fn summary(&self, count: impl Fn(u64) -> String) -> String {
        let existing = self.existing.iter().filter(|e| **e).count() as u64;
        let added = self.ids.len() as u64 - existing;
        if existing == 0 {
            format!("Scheduled {} in source {}.", count(added), self.source)
        } else {
            format!(
                "Scheduled {} in source {}; {} already scheduled (a pending command holds \
                 its unique key), nothing added for {}.",
                count(added),
                self.source,
                count(existing),
                if existing == 1 { "it" } else { "them" }
            )
        }
    }
}

/// Schedules one command into `source`, after [`NewCommand::validate`].
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
/// # let sources = vec![source];
/// use icq::NewCommand;
/// use icq::admin::{one_source, schedule};
///
/// // `sources`: the queues the command line selected.
/// let command = NewCommand::new("orders.receipt", serde_json::json!({ "order": 42 }));
/// let scheduled = schedule(one_source(&sources)?, &command).await?;
/// assert_eq!(scheduled.id, command.id);
/// assert!(schedule(&sources[0], &NewCommand::new("", serde_json::json!({}))).await.is_err());
/// # Ok(())
/// # }
/// ```
pub async fn schedule(source: &Queue, command: &NewCommand) -> Result<Scheduled> {
    command.validate()?;
    let scheduled = source.schedule(command).await?;
    Ok(Scheduled {
        id: scheduled.id,
        existing: scheduled.existing,
        source: source.name().to_owned(),
    })
}

/// Schedules many commands into `source` through the engine's bulk path, in chunks of
/// [`SCHEDULE_CHUNK`] (one progress step each). Every command is validated before the
/// first insert.
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
/// use icq::NewCommand;
/// use icq::admin::{NoProgress, schedule_many};
///
/// let good = NewCommand::new("t", serde_json::json!({}));
/// let bad = NewCommand::new("", serde_json::json!({}));
/// assert!(schedule_many(&source, &[good.clone(), bad], &NoProgress).await.is_err());
/// assert!(queue.get(&good.id).await?.is_none()); // nothing was scheduled
/// assert_eq!(schedule_many(&source, &[good], &NoProgress).await?.ids.len(), 1);
/// # Ok(())
/// # }
/// ```
pub async fn schedule_many(
    source: &Queue,
    commands: &[NewCommand],
    progress: &dyn Progress,
) -> Result<ScheduledMany> {
    for command in commands {
        command.validate()?;
    }
    let mut ids = Vec::with_capacity(commands.len());
    let mut existing = Vec::with_capacity(commands.len());
    progress.begin(
        &format!("scheduling into {}", source.name()),
        commands.len() as u64,
    );
    for chunk in commands.chunks(SCHEDULE_CHUNK) {
        match source.schedule_many(chunk).await {
            Ok(new) => {
                for scheduled in new {
                    ids.push(scheduled.id);
                    existing.push(scheduled.existing);
                }
            }
            Err(err) => {
                progress.finish();
                return Err(err);
            }
        }
        progress.advance(chunk.len() as u64);
    }
    progress.finish();
    Ok(ScheduledMany {
        ids,
        existing,
        source: source.name().to_owned(),
    })
}

/// One line of a `--from-file` JSON Lines document.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobLine {
    #[serde(rename = "type")]
    type_name: String,
    payload: serde_json::Value,
    #[serde(default)]
    run_at: Option<DateTime<Utc>>,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    tenant_id: Option<String>,
    #[serde(default)]
    correlation_id: Option<String>,
    #[serde(default)]
    queue: Option<String>,
    #[serde(default, deserialize_with = "whole_number")]
    priority: Option<i64>,
    #[serde(default)]
    unique_key: Option<String>,
    #[serde(default)]
    order_key: Option<String>,
    #[serde(default)]
    concurrency_key: Option<String>,
}

/// A JSON Lines `priority`: a type error says what a priority is (`1.5` and `"high"`
/// are none), not serde's "expected i64"; the range is checked with the line.
fn whole_number<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<i64>, D::Error> {
    struct Whole;
    impl serde::de::Visitor<'_> for Whole {
        type Value = Option<i64>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a whole number from -32768 to 32767 (lower runs first)")
        }
        fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<Option<i64>, E> {
            Ok(None)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<Option<i64>, E> {
            Ok(Some(v))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Option<i64>, E> {
            i64::try_from(v)
                .map(Some)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
        }
    }
    deserializer.deserialize_any(Whole)
}

/// Parses a JSON Lines document of commands: one object per line,
/// `{"type": …, "payload": …, "run_at"?: RFC 3339, "user_id"?, "roles"?: [...],
/// "tenant_id"?, "correlation_id"?, "queue"?, "priority"?: -32768…32767,
/// "unique_key"?, "order_key"?, "concurrency_key"?}`; blank lines are skipped. The first bad line is an
/// [`Error::Invalid`] naming `origin`, the line number and the field. A text already in memory has no
/// line limit; to read a file or stdin, stream it through [`read_jobs`].
///
/// # Examples
///
/// ```
/// use icq::RunAt;
/// use icq::admin::parse_jobs;
///
/// let text = r#"{"type": "email.welcome", "payload": {"user": 17}, "user_id": "u-17"}
///
/// {"type": "reports.daily", "payload": {}, "run_at": "2030-01-01T06:00:00Z"}
/// "#;
/// let commands = parse_jobs(text, "jobs.jsonl")?;
/// assert_eq!(commands.len(), 2);
/// assert_eq!(commands[0].context.user_id.as_deref(), Some("u-17"));
/// assert!(matches!(commands[1].run_at, RunAt::At(_)));
///
/// let err = parse_jobs("{\"type\": \"a\"}", "jobs.jsonl").unwrap_err();
/// assert!(err.to_string().starts_with("jobs.jsonl:1: missing field `payload`"), "{err}");
/// # Ok::<(), icq::Error>(())
/// ```
pub fn parse_jobs(text: &str, origin: &str) -> Result<Vec<NewCommand>> {
    let unlimited = InputLimit {
        bytes: u64::MAX,
        ..InputLimit::default()
    };
    read_jobs(text.as_bytes(), origin, &unlimited)
}

/// Reads a JSON Lines document of commands (see [`parse_jobs`] for the format) from
/// `reader` one line at a time: a line longer than `limit.bytes` fails at once with
/// [`Error::Invalid`] naming its number and the limit, after reading no more of it than the
/// limit, so a file without line breaks (`/dev/zero`) costs the limit, not all memory.
///
/// # Examples
///
/// ```
/// use icq::admin::{InputLimit, read_jobs};
///
/// let file = "{\"type\": \"a\", \"payload\": 1}\n{\"type\": \"b\", \"payload\": \"longer than forty bytes\"}\n";
/// let limit = InputLimit { bytes: 40, raise_with: "--max-input-bytes" };
/// let err = read_jobs(file.as_bytes(), "jobs.jsonl", &limit).unwrap_err();
/// assert!(err.to_string().starts_with("jobs.jsonl:2: the line is larger than 40 bytes"), "{err}");
///
/// let roomy = InputLimit { bytes: 1024, ..limit };
/// assert_eq!(read_jobs(file.as_bytes(), "jobs.jsonl", &roomy)?.len(), 2);
/// # Ok::<(), icq::Error>(())
/// ```
pub fn read_jobs(
    mut reader: impl BufRead,
    origin: &str,
    limit: &InputLimit,
) -> Result<Vec<NewCommand>> {
    let mut commands = Vec::new();
    let mut line = Vec::new();
    let mut number = 0usize;
    loop {
        number += 1;
        line.clear();
        // Room for the limit and a `\r\n` after it.
        let cap = limit.bytes.saturating_add(2);
        let read = (&mut reader)
            .take(cap)
            .read_until(b'\n', &mut line)
            .map_err(Error::io(format!("reading {origin}")))?;
        if read == 0 {
            break;
        }
        let ended = line.last() == Some(&b'\n');
        if ended {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        if (!ended && read as u64 == cap) || line.len() as u64 > limit.bytes {
            return Err(limit.exceeded(&format!("{origin}:{number}: the line")));
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        commands.push(parse_job_line(&line, origin, number)?);
    }
    if commands.is_empty() {
        return Err(Error::invalid(format!(
            "{origin} holds no commands (one JSON object per line)"
        )));
    }
    Ok(commands)
}

/// One line of a JSON Lines document as a validated command.
fn parse_job_line(line: &[u8], origin: &str, number: usize) -> Result<NewCommand> {
    let bad = |e: &dyn std::fmt::Display| {
        Error::invalid(format!("{origin}:{number}: {e}; nothing was scheduled"))
    };
    // serde_path_to_error names the field a type error is in (`priority`, `roles[1]`),
    // which serde_json alone does not.
    let malformed = |path: String, e: serde_json::Error| {
        let field = match path.as_str() {
            // The root, or a field serde names itself (`unknown field `when``).
            "" | "." => String::new(),
            path if e.to_string().contains(&format!("`{path}`")) => String::new(),
            path => format!("field `{path}`: "),
        };
        Error::invalid_because(
            format!("{origin}:{number}: {field}{e}; nothing was scheduled"),
            e,
        )
    };
    let mut reader = serde_json::Deserializer::from_slice(line);
    let job: JobLine = serde_path_to_error::deserialize(&mut reader)
        .map_err(|e| malformed(e.path().to_string(), e.into_inner()))?;
    reader.end().map_err(|e| malformed(String::new(), e))?;
    let field = |name: &str, e: Error| bad(&format!("field `{name}`: {e}"));
    let mut command = NewCommand::new(job.type_name, job.payload);
    if let Some(queue) = job.queue {
        crate::command::validate_queue_name(&queue).map_err(|e| field("queue", e))?;
        command = command.queue(queue);
    }
    if let Some(priority) = job.priority {
        let priority = i16::try_from(priority).map_err(|_| {
            field(
                "priority",
                Error::invalid(format!(
                    "{priority} is out of range (a priority is -32768 to 32767)"
                )),
            )
        })?;
        command = command.priority(priority);
    }
    if let Some(key) = job.unique_key {
        crate::command::validate_unique_key(&key).map_err(|e| field("unique_key", e))?;
        command = command.unique_key(key);
    }
    if let Some(key) = job.order_key {
        crate::command::validate_key("an order key", &key).map_err(|e| field("order_key", e))?;
        command = command.with_order_key(key);
    }
    if let Some(key) = job.concurrency_key {
        crate::command::validate_key("a concurrency key", &key)
            .map_err(|e| field("concurrency_key", e))?;
        command = command.with_concurrency_key(key);
    }
    let command = command
        .run_at(job.run_at.map_or(RunAt::Now, RunAt::At))
        .context(Context {
            user_id: job.user_id,
            roles: job.roles,
            tenant_id: job.tenant_id,
            correlation_id: job.correlation_id,
        });
    command.validate().map_err(|e| bad(&e))?;
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A type error in a JSON Lines document names the field it is in (serde
    /// alone says only `invalid type: string "high", expected i64 at line 1 column 45`).
    #[test]
    fn jsonl_type_errors_name_the_field() {
        for (line, expected) in [
            (
                r#"{"type": "a", "payload": 1, "priority": "high"}"#,
                r#"f:1: field `priority`: invalid type: string "high", expected a whole number from -32768 to 32767 (lower runs first) at line 1 column 46; nothing was scheduled"#,
            ),
            (
                r#"{"type": "a", "payload": 1, "roles": ["ops", 5]}"#,
                "f:1: field `roles[1]`: invalid type: integer `5`, expected a string at line 1 column 46",
            ),
            (
                r#"{"type": 7, "payload": 1}"#,
                "f:1: field `type`: invalid type: integer `7`, expected a string at line 1 column 10",
            ),
            (
                r#"{"type": "a", "payload": 1, "run_at": "tomorrow"}"#,
                "f:1: field `run_at`: ",
            ),
            // Not a field's fault: said as before, with the column.
            (
                r#"{"type": "a", "payload": 1} {}"#,
                "f:1: trailing characters at line 1 column 29",
            ),
        ] {
            let err = parse_jobs(line, "f").unwrap_err();
            assert!(err.to_string().starts_with(expected), "{err}");
            assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
            assert!(std::error::Error::source(&err).is_some(), "{err:?}");
        }
    }

    #[test]
    fn job_lines_parse_and_bad_lines_name_their_number() {
        let text = "{\"type\":\"a\",\"payload\":{\"n\":1}}\n\n\
                    {\"type\":\"b\",\"payload\":2,\"run_at\":\"2030-01-01T00:00:00Z\",\"roles\":[\"x\"]}\n";
        let commands = parse_jobs(text, "jobs.jsonl").unwrap();
        assert_eq!(commands.len(), 2);
        assert_eq!(commands[1].context.roles, vec!["x"]);
        assert!(matches!(commands[1].run_at, RunAt::At(_)));

        let err = parse_jobs(
            "{\"type\":\"a\",\"payload\":1}\n{\"type\":\"a\"}\n",
            "jobs.jsonl",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("jobs.jsonl:2: missing field `payload`"),
            "{err}"
        );
        let err = parse_jobs("{\"type\":\"\",\"payload\":1}", "f").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("f:1: a command type must not be empty"),
            "{err}"
        );
        let err = parse_jobs("{\"type\":\"a\",\"payload\":1,\"typo\":1}", "f").unwrap_err();
        assert!(err.to_string().contains("unknown field `typo`"), "{err}");

        let text = "{\"type\":\"a\",\"payload\":1,\"queue\":\"mail\",\"priority\":-3,\"unique_key\":\"k\"}";
        let commands = parse_jobs(text, "f").unwrap();
        assert_eq!(
            (commands[0].queue.as_str(), commands[0].priority),
            ("mail", -3)
        );
        assert_eq!(commands[0].unique_key.as_deref(), Some("k"));
        let text = "{\"type\":\"a\",\"payload\":1,\"order_key\":\"o\",\"concurrency_key\":\"c\"}";
        let commands = parse_jobs(text, "f").unwrap();
        assert_eq!(commands[0].order_key.as_deref(), Some("o"));
        assert_eq!(commands[0].concurrency_key.as_deref(), Some("c"));
        for (line, field) in [
            ("{\"type\":\"a\",\"payload\":1,\"queue\":\"\"}", "queue"),
            (
                "{\"type\":\"a\",\"payload\":1,\"queue\":\"a\\nb\"}",
                "queue",
            ),
            (
                "{\"type\":\"a\",\"payload\":1,\"priority\":40000}",
                "priority",
            ),
            (
                "{\"type\":\"a\",\"payload\":1,\"unique_key\":\"\"}",
                "unique_key",
            ),
            (
                "{\"type\":\"a\",\"payload\":1,\"order_key\":\"\"}",
                "order_key",
            ),
        ] {
            let err = parse_jobs(&format!("{text}\n{line}\n"), "f").unwrap_err();
            assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
            assert!(
                err.to_string()
                    .starts_with(&format!("f:2: field `{field}`")),
                "{err}"
            );
        }
    }

    #[test]
    fn input_limits_stop_reading_at_the_limit() {
        let limit = InputLimit {
            bytes: 1024,
            raise_with: "--max-input-bytes",
        };
        // An endless line: refused after reading the limit (the test would not end
        // otherwise), naming the line and how to raise the limit.
        let endless = std::io::BufReader::new(std::io::repeat(b' '));
        let err = read_jobs(endless, "stdin", &limit).unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "stdin:1: the line is larger than 1024 bytes, the input limit; nothing was read \
             past it and nothing was scheduled (raise the limit with --max-input-bytes)"
        );
        // Exactly at the limit, with or without a final line break or a `\r`: accepted.
        let job = "{\"type\":\"a\",\"payload\":\"";
        let full = format!("{job}{}\"}}", "x".repeat(1024 - job.len() - 2));
        assert_eq!(full.len(), 1024);
        for text in [full.clone(), format!("{full}\n"), format!("{full}\r\n\n")] {
            assert_eq!(read_jobs(text.as_bytes(), "f", &limit).unwrap().len(), 1);
        }
        let over = format!("{full}\n{full} \n");
        let err = read_jobs(over.as_bytes(), "f", &limit).unwrap_err();
        assert!(
            err.to_string().starts_with("f:2: the line is larger"),
            "{err}"
        );

        assert_eq!(
            read_limited(&[b'x'; 1024][..], &limit, "p").unwrap().len(),
            1024
        );
        let err = read_limited(std::io::repeat(0), &limit, "the payload file /dev/zero");
        assert!(
            err.unwrap_err()
                .to_string()
                .starts_with("the payload file /dev/zero is larger than 1024 bytes"),
        );
    }
}
