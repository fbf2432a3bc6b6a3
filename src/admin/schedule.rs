//! `icq schedule`: one command, or many from a JSON Lines document, into one source.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::command::{CommandId, Context, NewCommand, RunAt};
use crate::error::{Error, Result};
use crate::sources::OpenSource;

use super::Progress;

/// Commands inserted per bulk-schedule call (one progress step).
pub const SCHEDULE_CHUNK: usize = 1000;

/// The one source a command is scheduled into: scheduling needs an unambiguous target.
pub fn one_source(sources: &[OpenSource]) -> Result<&OpenSource> {
    match sources {
        [one] => Ok(one),
        [] => Err(Error::Usage(
            "no source is configured to schedule into".into(),
        )),
        many => Err(Error::Usage(format!(
            "{} sources are configured ({}); say which one to schedule into with --source NAME",
            many.len(),
            many.iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The result of scheduling one command: `{"id": ID}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scheduled {
    /// The new command's id.
    pub id: CommandId,
    /// The source it was scheduled into (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

/// The result of scheduling from a file: `{"ids": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduledMany {
    /// The new commands' ids, in line order.
    pub ids: Vec<CommandId>,
    /// The source they were scheduled into (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

/// Schedules one command into `source`.
pub async fn schedule(source: &OpenSource, command: &NewCommand) -> Result<Scheduled> {
    command.validate()?;
    let id = source.queue.schedule(command).await?;
    Ok(Scheduled {
        id,
        source: source.name.clone(),
    })
}

/// Schedules many commands into `source` through the engine's bulk path, in chunks of
/// [`SCHEDULE_CHUNK`] (one progress step each). Every command is validated before the
/// first insert.
pub async fn schedule_many(
    source: &OpenSource,
    commands: &[NewCommand],
    progress: &dyn Progress,
) -> Result<ScheduledMany> {
    for command in commands {
        command.validate()?;
    }
    let mut ids = Vec::with_capacity(commands.len());
    progress.begin(
        &format!("scheduling into {}", source.name),
        commands.len() as u64,
    );
    for chunk in commands.chunks(SCHEDULE_CHUNK) {
        match source.queue.schedule_many(chunk).await {
            Ok(new) => ids.extend(new),
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
        source: source.name.clone(),
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
}

/// Parses a JSON Lines document of commands: one object per line,
/// `{"type": …, "payload": …, "run_at"?: RFC 3339, "user_id"?, "roles"?: [...],
/// "tenant_id"?, "correlation_id"?}`; blank lines are skipped. The first bad line is an
/// [`Error::Usage`] naming `origin` and the line number.
pub fn parse_jobs(text: &str, origin: &str) -> Result<Vec<NewCommand>> {
    let mut commands = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let number = index + 1;
        let job: JobLine = serde_json::from_str(line)
            .map_err(|e| Error::Usage(format!("{origin}:{number}: {e}; nothing was scheduled")))?;
        let command = NewCommand::new(job.type_name, job.payload)
            .run_at(job.run_at.map_or(RunAt::Now, RunAt::At))
            .context(Context {
                user_id: job.user_id,
                roles: job.roles,
                tenant_id: job.tenant_id,
                correlation_id: job.correlation_id,
            });
        command
            .validate()
            .map_err(|e| Error::Usage(format!("{origin}:{number}: {e}; nothing was scheduled")))?;
        commands.push(command);
    }
    if commands.is_empty() {
        return Err(Error::Usage(format!(
            "{origin} holds no commands (one JSON object per line)"
        )));
    }
    Ok(commands)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
