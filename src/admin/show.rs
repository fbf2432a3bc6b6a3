//! `icq show` / `icq dead-letters show`: one command in full, in any state.

use serde::Serialize;

use crate::command::{CommandId, CommandRow, State};
use crate::error::Result;
use crate::sources::OpenSource;

use super::{locate, not_found};

/// One row in full, with its source and its state when it was read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShownCommand {
    /// The source name.
    pub source: String,
    /// Every column.
    #[serde(flatten)]
    pub row: CommandRow,
    /// The row's state at the database's `now`.
    pub state: State,
}

/// Reads one command in full from whichever selected source holds it.
pub async fn show(sources: &[OpenSource], id: CommandId) -> Result<ShownCommand> {
    let located = locate(sources, std::slice::from_ref(&id)).await?;
    if let Some(missing) = located.missing(std::slice::from_ref(&id)) {
        return Err(not_found(&missing, sources, "nothing to show"));
    }
    let found = located.rows.into_iter().next();
    let Some((index, row)) = found else {
        return Err(not_found(&[id], sources, "nothing to show"));
    };
    let source = &sources[index];
    let now = source.queue.backend().clock_now().await?;
    Ok(ShownCommand {
        source: source.name.clone(),
        state: row.state(now),
        row,
    })
}
