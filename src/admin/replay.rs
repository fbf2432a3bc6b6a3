//! `icq replay`: schedule a new copy of completed or dead commands.

use std::collections::HashMap;

use serde::Serialize;

use crate::command::{CommandId, NewCommand, State};
use crate::error::{Error, Result};
use crate::sources::OpenSource;

use super::{distinct, locate_checked, state_name};

/// One replayed command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Replayed {
    /// The completed or dead row that was copied.
    pub from: CommandId,
    /// The new pending row.
    pub id: CommandId,
    /// The source both live in (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

/// The result of [`replay`]: `{"replayed": [{"from": ID, "id": NEW_ID}, …]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// The new rows, in the order the ids were given.
    pub replayed: Vec<Replayed>,
    /// How many sources were asked.
    #[serde(skip)]
    pub source_count: usize,
}

/// Schedules, for every id, a new pending row copying the type, payload and captured
/// context of a completed or dead row. The old rows are left as they are.
pub async fn replay(sources: &[OpenSource], ids: &[CommandId]) -> Result<ReplayReport> {
    let ids = distinct(ids);
    if ids.is_empty() {
        return Err(Error::Usage("name the commands to replay (ids)".into()));
    }
    let per_source = locate_checked(sources, &ids, "replayed", |row, state| match state {
        State::Completed | State::Dead => Ok(()),
        State::Running => Err(format!(
            "command {} is running (leased until {}); replay it once it has completed or \
             been dead-lettered (see its state with `icq show {}`)",
            row.id,
            row.locked_until
                .map_or_else(|| "now".to_owned(), crate::command::format_timestamp),
            row.id
        )),
        state => Err(format!(
            "command {} is still pending ({}); it will run on its own (`icq requeue {}` \
             makes it due now); only completed or dead commands can be replayed",
            row.id,
            state_name(state),
            row.id
        )),
    })
    .await?;
    let mut replayed = Vec::with_capacity(ids.len());
    for (index, rows) in per_source {
        let source = &sources[index];
        let commands: Vec<NewCommand> = rows
            .iter()
            .map(|row| {
                NewCommand::new(row.type_name.clone(), row.payload.clone()).context(row.context())
            })
            .collect();
        let new_ids = source.queue.schedule_many(&commands).await?;
        replayed.extend(rows.iter().zip(new_ids).map(|(row, id)| Replayed {
            from: row.id.clone(),
            id,
            source: source.name.clone(),
        }));
    }
    let order: HashMap<CommandId, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.clone(), i))
        .collect();
    replayed.sort_by_key(|r| order.get(&r.from).copied().unwrap_or(usize::MAX));
    Ok(ReplayReport {
        replayed,
        source_count: sources.len(),
    })
}
