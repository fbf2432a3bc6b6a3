//! `icq schedule`: enqueue one command from the command line, or many from a JSON Lines
//! file.
//!
//! Input is bounded: a `--payload @FILE` (or `@-`) and every `--from-file` line may hold
//! at most `--max-input-bytes` (default 16 MiB; `ICQ_MAX_INPUT_BYTES`), read no further
//! than that, and `--from-file` is streamed line by line. Over the limit is exit 2 with
//! a message naming the flag.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;

use super::GlobalArgs;
use crate::cli::error::CliError;
use crate::cli::output;
use icq::admin;
use icq::command::{Context, NewCommand, RunAt};
use icq::error::Error;

/// Arguments of `icq schedule`.
#[derive(Debug, Clone, Args)]
pub struct ScheduleArgs {
    /// The command type, e.g. orders.send_receipt.
    #[arg(
        long = "type",
        value_name = "TYPE",
        required_unless_present = "from_file",
        value_parser = super::parse_non_empty
    )]
    pub type_name: Option<String>,

    /// The payload: JSON text, @FILE to read it from a file, or @- to read stdin.
    #[arg(
        long,
        value_name = "JSON|@FILE",
        allow_hyphen_values = true,
        required_unless_present = "from_file"
    )]
    pub payload: Option<String>,

    /// Due at this instant (RFC 3339, e.g. 2026-01-31T12:00:00Z) instead of now.
    #[arg(long, value_name = "RFC3339", value_parser = crate::cli::parse::parse_instant, conflicts_with = "delay")]
    pub at: Option<DateTime<Utc>>,

    /// Due after this delay instead of now, e.g. 30s, 5m, 12h, 7d.
    #[arg(long = "in", id = "delay", value_name = "DELAY", value_parser = crate::cli::parse::parse_duration,
          allow_hyphen_values = true)]
    pub delay: Option<Duration>,

    /// The captured scheduling user.
    #[arg(long, value_name = "U")]
    pub user_id: Option<String>,

    /// The captured roles, comma-separated.
    #[arg(long, value_name = "A,B", value_delimiter = ',', value_parser = super::parse_non_empty)]
    pub roles: Vec<String>,

    /// The captured tenant.
    #[arg(long, value_name = "T")]
    pub tenant_id: Option<String>,

    /// The captured correlation id.
    #[arg(long, value_name = "C")]
    pub correlation_id: Option<String>,

    /// The queue to put it in (schema version 2; default: "default"). Workers serve the
    /// queues they list, or every queue.
    #[arg(long, value_name = "Q", value_parser = parse_queue)]
    pub queue: Option<String>,

    /// Its priority among due commands, -32768 to 32767: lower runs first (default 0).
    #[arg(long, value_name = "P", allow_hyphen_values = true,
          value_parser = crate::cli::parse::parse_priority)]
    pub priority: Option<i16>,

    /// At most one pending command per key: while one with this key is pending, nothing
    /// is added and its id is printed (JSON "existing": true). Completed and dead
    /// commands free the key.
    #[arg(long, value_name = "K", value_parser = parse_unique_key)]
    pub unique_key: Option<String>,

    /// Run commands of this key one at a time, in the order they were scheduled (schema
    /// version 4): a pending one holds the younger ones until it completes or is
    /// dead-lettered.
    #[arg(long, value_name = "K", value_parser = parse_order_key)]
    pub order_key: Option<String>,

    /// The key a queue's `key_concurrency` limit counts (schema version 4): at most that
    /// many commands of one key run at a time across the fleet.
    #[arg(long, value_name = "K", value_parser = parse_concurrency_key)]
    pub concurrency_key: Option<String>,

    /// Schedule every line of this JSON Lines file ("-" for stdin); each line is
    /// {"type", "payload", "run_at"?, "user_id"?, "roles"?, "tenant_id"?, "correlation_id"?,
    /// "queue"?, "priority"?, "unique_key"?, "order_key"?, "concurrency_key"?}.
    #[arg(
        long,
        value_name = "JSONL",
        conflicts_with_all = ["type_name", "payload", "at", "delay", "user_id", "roles", "tenant_id", "correlation_id", "queue", "priority", "unique_key", "order_key", "concurrency_key"]
    )]
    pub from_file: Option<PathBuf>,

    /// The most bytes of a --payload (@FILE and @- included) and of each --from-file
    /// line, e.g. 1048576, 512KiB, 64MiB; larger input is refused before it is all read.
    #[arg(
        long,
        env = MAX_INPUT_ENV,
        value_name = "BYTES",
        default_value = "16MiB",
        value_parser = parse_byte_size
    )]
    pub max_input_bytes: u64,
}

/// A `--queue` value ([`icq::command::validate_queue_name`]).
fn parse_queue(raw: &str) -> Result<String, String> {
    icq::command::validate_queue_name(raw)
        .map(|()| raw.to_owned())
        .map_err(|e| e.to_string())
}

/// A `--unique-key` value ([`icq::command::validate_unique_key`]).
fn parse_unique_key(raw: &str) -> Result<String, String> {
    icq::command::validate_unique_key(raw)
        .map(|()| raw.to_owned())
        .map_err(|e| e.to_string())
}

/// An `--order-key` value ([`icq::command::validate_key`]).
fn parse_order_key(raw: &str) -> Result<String, String> {
    icq::command::validate_key("an order key", raw)
        .map(|()| raw.to_owned())
        .map_err(|e| e.to_string())
}

/// A `--concurrency-key` value ([`icq::command::validate_key`]).
fn parse_concurrency_key(raw: &str) -> Result<String, String> {
    icq::command::validate_key("a concurrency key", raw)
        .map(|()| raw.to_owned())
        .map_err(|e| e.to_string())
}

/// The variable that sets `--max-input-bytes`.
pub const MAX_INPUT_ENV: &str = "ICQ_MAX_INPUT_BYTES";

/// How the user raises the input limit, as errors name it.
const RAISE_WITH: &str = "--max-input-bytes or ICQ_MAX_INPUT_BYTES";

/// A size in bytes: a whole number with an optional unit (B, KiB, MiB, GiB, or K, M, G
/// read as binary multiples too), at least 1.
pub fn parse_byte_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "`{text}` is not a size: write bytes, or a number with KiB, MiB or GiB \
                 (e.g. 16MiB)"
            ));
        }
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size: write a whole number, e.g. 16MiB"))?;
    match number.checked_mul(multiplier) {
        Some(0) => Err("must be at least 1 byte".into()),
        Some(bytes) => Ok(bytes),
        None => Err(format!("`{text}` is too large")),
    }
}

/// Runs `icq schedule`.
pub async fn run(args: ScheduleArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    // Validate the input before touching any database.
    let input = Input::read(args)?;
    let sources = super::open_sources(global).await?;
    let result = match admin::one_source(&sources) {
        Err(err) => Err(err),
        Ok(source) => match &input {
            Input::One(command) => admin::schedule(source, command)
                .await
                .and_then(|report| output::emit(global.format, &report)),
            Input::Many(commands) => {
                let progress = output::progress();
                admin::schedule_many(source, commands, progress.as_ref())
                    .await
                    .and_then(|report| output::emit(global.format, &report))
            }
        },
    };
    admin::close(&sources).await;
    Ok(result?)
}

/// What to schedule, validated.
enum Input {
    One(Box<NewCommand>),
    Many(Vec<NewCommand>),
}

impl Input {
    fn read(args: ScheduleArgs) -> Result<Input, CliError> {
        let limit = admin::InputLimit {
            bytes: args.max_input_bytes,
            raise_with: RAISE_WITH,
        };
        if let Some(path) = args.from_file {
            let commands = if path.as_os_str() == "-" {
                admin::read_jobs(std::io::stdin().lock(), "stdin", &limit)?
            } else {
                let origin = path.display().to_string();
                let file =
                    std::fs::File::open(&path).map_err(Error::io(format!("reading {origin}")))?;
                admin::read_jobs(std::io::BufReader::new(file), &origin, &limit)?
            };
            return Ok(Input::Many(commands));
        }
        let (Some(type_name), Some(payload)) = (args.type_name, args.payload) else {
            return Err(CliError::Usage(
                "pass --type and --payload, or --from-file".into(),
            ));
        };
        let run_at = match (args.at, args.delay) {
            (Some(at), _) => RunAt::At(at),
            (None, Some(delay)) => RunAt::After(delay),
            (None, None) => RunAt::Now,
        };
        let mut command = NewCommand::new(type_name, read_payload(&payload, &limit)?);
        if let Some(queue) = args.queue {
            command = command.queue(queue);
        }
        if let Some(priority) = args.priority {
            command = command.priority(priority);
        }
        if let Some(key) = args.unique_key {
            command = command.unique_key(key);
        }
        if let Some(key) = args.order_key {
            command = command.with_order_key(key);
        }
        if let Some(key) = args.concurrency_key {
            command = command.with_concurrency_key(key);
        }
        let command = command.run_at(run_at).context(Context {
            user_id: args.user_id,
            roles: args.roles,
            tenant_id: args.tenant_id,
            correlation_id: args.correlation_id,
        });
        command.validate()?;
        Ok(Input::One(Box::new(command)))
    }
}

/// The `--payload` argument as JSON: the text itself, `@-` for stdin, or `@FILE`, none of
/// them read past `limit`.
pub(crate) fn read_payload(
    argument: &str,
    limit: &admin::InputLimit,
) -> icq::Result<serde_json::Value> {
    let (bytes, origin) = match argument.strip_prefix('@') {
        Some("-") => {
            let origin = "the payload on stdin".to_owned();
            (
                admin::read_limited(std::io::stdin().lock(), limit, &origin)?,
                origin,
            )
        }
        Some(path) => {
            let origin = format!("the payload file {path}");
            let file = std::fs::File::open(path)
                .map_err(Error::io(format!("reading the payload file {path}")))?;
            (admin::read_limited(file, limit, &origin)?, origin)
        }
        None => {
            let origin = "--payload".to_owned();
            (
                admin::read_limited(argument.as_bytes(), limit, &origin)?,
                origin,
            )
        }
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::invalid_because(
            format!(
                "{origin} is not JSON: {e} (pass a JSON document such as '{{\"order_id\": 42}}', \
                 or @file to read one)"
            ),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_take_binary_units() {
        assert_eq!(parse_byte_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_byte_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_byte_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_byte_size("2g"), Ok(2 << 30));
        for bad in [
            "",
            "MiB",
            "1.5MiB",
            "-1",
            "10 parsecs",
            "0",
            "99999999999999999999GiB",
        ] {
            assert!(parse_byte_size(bad).is_err(), "{bad}");
        }
    }
}
