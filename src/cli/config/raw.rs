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
    expecting = "a source: a mapping with `name`, `url` and optionally `table`, `settings`, `queues` and `schedules`"
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
    /// `schedules:`, in file order.
    #[serde(default)]
    pub schedules: Option<Vec<RawSchedule>>,
}

/// One entry of a source's `schedules:`, checked in `check::schedules`.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a schedule: a mapping with `name`, `cron` or `every`, `type` and optionally \
                 `time_zone`, `payload`, `queue`, `priority` and `missed`"
)]
pub(crate) struct RawSchedule {
    pub name: String,
    #[serde(default)]
    pub cron: Option<String>,
    #[serde(default, deserialize_with = "interval")]
    pub every: Option<String>,
    #[serde(default)]
    pub time_zone: Option<String>,
    #[serde(rename = "type")]
    pub type_name: String,
    #[serde(default)]
    pub payload: Option<serde_json::Value>,
    #[serde(default)]
    pub queue: Option<String>,
    #[serde(default)]
    pub priority: Option<i16>,
    #[serde(default)]
    pub missed: Option<icq::recurring::Missed>,
}

/// `every:` as written: a duration with a unit (`10m`, `30s`, `1h 30m`); a bare number is
/// taken as seconds.
fn interval<'de, D: de::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    deserializer.deserialize_any(Interval).map(Some)
}

struct Interval;

impl Visitor<'_> for Interval {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration such as 10m, 30s or 1h 30m")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(format!("{v}s"))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(format!("{v}s"))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(format!("{v}s"))
    }
}

/// `queues: { name: { concurrency: N }, ... }`, in file order.
#[derive(Debug, Default)]
pub(crate) struct RawQueues(pub Vec<(String, RawQueue)>);

/// One queue of a source's `queues:`.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a queue: a mapping with `concurrency` and optionally `global_concurrency`, \
                 `key_concurrency` and `rate`, e.g. { concurrency: 2, rate: 50/s }"
)]
pub(crate) struct RawQueue {
    #[serde(default, deserialize_with = "queue_concurrency")]
    pub concurrency: Option<u32>,
    #[serde(default, deserialize_with = "global_concurrency")]
    pub global_concurrency: Option<u32>,
    #[serde(default, deserialize_with = "key_concurrency")]
    pub key_concurrency: Option<u32>,
    #[serde(default, deserialize_with = "rate")]
    pub rate: Option<icq::settings::Rate>,
}

fn queue_concurrency<'de, D: de::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Settings::read_queue_concurrency(d).map(Some)
}

fn global_concurrency<'de, D: de::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Settings::read_queue_limit(d, "global_concurrency").map(Some)
}

fn key_concurrency<'de, D: de::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Settings::read_queue_limit(d, "key_concurrency").map(Some)
}

/// `rate: 50/s` (a string; a bare number says which unit is missing). Read by a visitor,
/// so the error is positioned at the value.
fn rate<'de, D: de::Deserializer<'de>>(d: D) -> Result<Option<icq::settings::Rate>, D::Error> {
    struct RateVisitor;

    impl RateVisitor {
        fn no_unit<E: de::Error>(n: impl fmt::Display) -> E {
            E::custom(format!(
                "`rate` needs a unit: write `{n}/s`, `{n}/min` or `{n}/h`"
            ))
        }
    }

    impl Visitor<'_> for RateVisitor {
        type Value = icq::settings::Rate;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("starts per second, minute or hour, such as `50/s`, `100/min` or `1000/h`")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            v.parse().map_err(E::custom)
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Err(Self::no_unit(v))
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Err(Self::no_unit(v))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Err(Self::no_unit(v))
        }
    }

    d.deserialize_any(RateVisitor).map(Some)
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
