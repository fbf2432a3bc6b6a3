//! The file's shape exactly as written, before checks that types cannot express.
//!
//! Every struct refuses unknown keys, so a typo is an error rather than a silently
//! ignored setting.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, SeqAccess, Visitor};

use icq::settings::Settings;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with `sources` and `handlers`"
)]
pub(crate) struct RawConfig {
    /// `sources:`; `None` when absent or empty.
    #[serde(default)]
    pub sources: Option<Vec<RawSource>>,
    /// `handlers:`, by command type.
    #[serde(default)]
    pub handlers: Option<BTreeMap<String, RawHandler>>,
}

/// One entry of `sources:`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a source: a mapping with `name`, `url` and optionally `table`, `settings` and `queues`"
)]
pub(crate) struct RawSource {
    pub name: String,
    pub url: String,
    #[serde(default)]
    pub table: Option<String>,
    #[serde(default)]
    pub settings: Option<Settings>,
    /// `queues:`, in file order (a repeated name is refused by the duplicate-key pass).
    #[serde(default)]
    pub queues: Option<RawQueues>,
}

/// `queues: { name: { concurrency: N }, ... }`, in file order.
#[derive(Debug, Default)]
pub(crate) struct RawQueues(pub Vec<(String, RawQueue)>);

/// One queue of a source's `queues:`.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a queue: a mapping with `concurrency`, e.g. { concurrency: 2 }"
)]
pub(crate) struct RawQueue {
    #[serde(default, deserialize_with = "queue_concurrency")]
    pub concurrency: Option<u32>,
}

fn queue_concurrency<'de, D: de::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Settings::read_queue_concurrency(d).map(Some)
}

impl<'de> Deserialize<'de> for RawQueues {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(QueuesVisitor)
    }
}

struct QueuesVisitor;

impl<'de> Visitor<'de> for QueuesVisitor {
    type Value = RawQueues;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping of queue names to their settings, e.g. { default: { concurrency: 8 }, webhooks: { concurrency: 2 } }")
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<RawQueues, A::Error> {
        let mut queues = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            // `webhooks:` with nothing after it takes the defaults.
            let queue = map.next_value::<Option<RawQueue>>()?.unwrap_or_default();
            queues.push((name, queue));
        }
        Ok(RawQueues(queues))
    }
}

/// One entry of `handlers:`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a handler: a mapping with one of `exec`, `http` or `noop`"
)]
pub(crate) struct RawHandler {
    #[serde(default, deserialize_with = "argv")]
    pub exec: Option<Vec<String>>,
    #[serde(default)]
    pub http: Option<RawHttp>,
    #[serde(default)]
    pub noop: Option<bool>,
    #[serde(default, deserialize_with = "seconds")]
    pub timeout_seconds: Option<f64>,
    #[serde(default)]
    pub requires_roles: Option<Vec<String>>,
}

/// `http: { url, headers }`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an http handler: a mapping with `url` and optionally `headers`"
)]
pub(crate) struct RawHttp {
    pub url: String,
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
}

/// `exec:` must be a list of strings; a single string is refused with a pointer to the
/// list form, since icq never runs a shell.
fn argv<'de, D: de::Deserializer<'de>>(deserializer: D) -> Result<Option<Vec<String>>, D::Error> {
    deserializer.deserialize_any(Argv).map(Some)
}

struct Argv;

impl<'de> Visitor<'de> for Argv {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an argv list such as [\"./bin/send-receipt\", \"--fast\"]")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<String>, E> {
        let words: Vec<String> = v.split_whitespace().map(|w| format!("{w:?}")).collect();
        Err(E::custom(format!(
            "`exec` takes an argv list, never a shell string: write exec: [{}]",
            words.join(", ")
        )))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        let mut argv = Vec::new();
        while let Some(arg) = seq.next_element::<String>()? {
            argv.push(arg);
        }
        Ok(argv)
    }
}

/// `timeout_seconds:` is a number of seconds; a duration written with a unit (`10s`,
/// `2m`) is refused with the number to write instead.
fn seconds<'de, D: de::Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    deserializer.deserialize_any(Seconds).map(Some)
}

struct Seconds;

impl Visitor<'_> for Seconds {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number of seconds, e.g. 10 or 2.5")
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        let shown = icq::redact::echo(v);
        let hint = match humantime::parse_duration(v.trim()) {
            Ok(duration) => format!("write `timeout_seconds: {}`", duration.as_secs_f64()),
            Err(_) => "write e.g. `timeout_seconds: 10` or `timeout_seconds: 2.5`".to_owned(),
        };
        Err(E::custom(format!(
            "`timeout_seconds` is a number of seconds, not `{shown}`: {hint}"
        )))
    }
}
