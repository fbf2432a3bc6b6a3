//! `icq list`: one page of commands in a state, with keyset pagination (`--after ID`)
//! so the thousandth page costs what the first does.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{not_found, one_source};
use crate::command::{CommandId, CommandRow, State};
use crate::engine::admin::CommandGetManyParams;
use crate::engine::admin::{CommandListParams, ListState, StateCountParams};
use crate::error::Result;
use crate::queue::Queue;

/// The largest page a listing (`icq list`, `icq dead-letters list`) shows at once.
pub const MAX_PAGE_LIMIT: u32 = 10_000;

/// What `icq list` shows.
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
/// use icq::admin::{ListRequest, ListState, list};
/// use icq::NewCommand;
///
/// for n in 0..3 {
///     queue.schedule(&NewCommand::new("email.send", serde_json::json!({ "n": n }))).await?;
/// }
/// let mut request = ListRequest {
///     state: ListState::Due,
///     type_name: None,
///     queue: None,
///     limit: 2,
///     after: None,
///     before: None,
/// };
/// let first = list(&sources, &request).await?;
/// assert_eq!((first.total, first.commands.len()), (3, 2));
/// assert_eq!(first.commands[0].key_time(ListState::Due), Some(first.commands[0].run_at));
///
/// // The next page starts after the last id of this one.
/// request.after = first.next_after.clone();
/// let second = list(&sources, &request).await?;
/// assert_eq!(second.commands.len(), 1);
/// assert_eq!(second.next_after, None);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListRequest {
    /// The rows and their order.
    pub state: ListState,
    /// Only this command type.
    pub type_name: Option<String>,
    /// Only this queue (refused on a version-1 table, naming the upgrade).
    pub queue: Option<String>,
    /// At most this many rows.
    pub limit: u32,
    /// The page after this command (the last id of the previous page).
    pub after: Option<CommandId>,
    /// Only rows whose ordering time is earlier than this.
    pub before: Option<DateTime<Utc>>,
}

/// One listed command: everything but the payload and the captured context.
///
/// See [`ListRequest`]'s example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListedCommand {
    /// `Id`.
    pub id: CommandId,
    /// `Type`.
    #[serde(rename = "type")]
    pub type_name: String,
    /// `Queue` (`default` on a version-1 table).
    pub queue: String,
    /// `Priority` (0 on a version-1 table).
    pub priority: i16,
    /// The state at the database's clock.
    pub state: State,
    /// `Attempts`.
    pub attempts: i32,
    /// `CreatedAt`.
    pub created_at: DateTime<Utc>,
    /// `RunAt`.
    pub run_at: DateTime<Utc>,
    /// `LockedUntil`.
    pub locked_until: Option<DateTime<Utc>>,
    /// `ProcessedAt`.
    pub processed_at: Option<DateTime<Utc>>,
    /// `DeadLetteredAt`.
    pub dead_lettered_at: Option<DateTime<Utc>>,
    /// `LastError`, with what icq could not read in the row when it has defects.
    pub last_error: Option<String>,
    /// The columns icq could not read (NULL where a value is required, an instant it
    /// cannot represent, ...): their fields above hold placeholders, which listings show
    /// as `unreadable`, not as a time. Empty (and left out of JSON) for a healthy row.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
}

impl ListedCommand {
    fn new(row: CommandRow, now: DateTime<Utc>) -> ListedCommand {
        let state = row.state(now);
        let unreadable = crate::command::unreadable_columns(&row.defects);
        let last_error = match row.defect_summary() {
            None => row.last_error,
            Some(defects) => Some(match row.last_error {
                Some(error) => format!("{error} ({defects})"),
                None => defects,
            }),
        };
        ListedCommand {
            id: row.id,
            type_name: row.type_name,
            queue: row.queue,
            priority: row.priority,
            state,
            attempts: row.attempts,
            created_at: row.created_at,
            run_at: row.run_at,
            locked_until: row.locked_until,
            processed_at: row.processed_at,
            dead_lettered_at: row.dead_lettered_at,
            last_error,
            unreadable,
        }
    }

    /// The time the listing is ordered by. See [`ListRequest`]'s example.
    pub fn key_time(&self, state: ListState) -> Option<DateTime<Utc>> {
        match state {
            ListState::Dead => self.dead_lettered_at,
            ListState::Completed => self.processed_at,
            _ => Some(self.run_at),
        }
    }
}

/// One page of `icq list`.
///
/// See [`ListRequest`]'s example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListReport {
    /// The source listed.
    pub source: String,
    /// The state listed.
    pub state: ListState,
    /// How many rows are in that state (of that type) in all.
    pub total: u64,
    /// The page.
    pub commands: Vec<ListedCommand>,
    /// The id to pass as `--after` for the next page; `null` on the last page.
    pub next_after: Option<CommandId>,
}

/// Reads one page. Lists one source: `--after` names a row of that source.
///
/// See [`ListRequest`]'s example.
pub async fn list(sources: &[Queue], request: &ListRequest) -> Result<ListReport> {
    read(sources, request, true).await
}

/// [`list`] without the total (`total` is 0): one page costs a page's rows, not a count
/// of every row in the state, for a caller that counts elsewhere (the console counts once
/// for all its pages).
pub async fn list_page(sources: &[Queue], request: &ListRequest) -> Result<ListReport> {
    read(sources, request, false).await
}

async fn read(sources: &[Queue], request: &ListRequest, count: bool) -> Result<ListReport> {
    let source = match sources {
        [one] => one,
        _ => one_source(sources).map_err(|_| {
            crate::Error::Ambiguous(format!(
                "{} sources are configured ({}); list one at a time with --source NAME",
                sources.len(),
                sources
                    .iter()
                    .map(|s| s.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?,
    };
    super::check_queue_filter(sources, request.queue.as_deref()).await?;
    let backend = source.backend();
    if let Some(after) = &request.after
        && backend
            .command_get_many(&CommandGetManyParams {
                ids: std::slice::from_ref(after),
            })
            .await?
            .is_empty()
    {
        return Err(not_found(
            std::slice::from_ref(after),
            sources,
            "there is no page after it",
        ));
    }
    // One more row than asked tells whether a next page exists.
    let params = CommandListParams {
        state: request.state,
        type_name: request.type_name.clone(),
        queue: request.queue.clone(),
        limit: request.limit.saturating_add(1),
        after: request.after.clone(),
        before: request.before,
    };
    let mut rows = backend.command_list(&params).await?;
    let more = rows.len() > request.limit as usize;
    rows.truncate(request.limit as usize);
    let now = backend.clock_now().await?;
    let commands: Vec<ListedCommand> = rows
        .into_iter()
        .map(|row| ListedCommand::new(row, now))
        .collect();
    let counts = if count {
        backend
            .state_count(&StateCountParams {
                by_type: request.type_name.is_some(),
                by_queue: false,
                queue: request.queue.clone(),
            })
            .await?
    } else {
        Vec::new()
    };
    let total = counts
        .iter()
        .filter(|c| c.type_name.is_none() || c.type_name == request.type_name)
        .map(|c| c.in_state(request.state))
        .sum();
    Ok(ListReport {
        source: source.name().to_owned(),
        state: request.state,
        total,
        next_after: if more {
            commands.last().map(|c| c.id.clone())
        } else {
            None
        },
        commands,
    })
}
