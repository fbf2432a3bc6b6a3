//! `icq show` / `icq dead-letters show`: one command in full, in any state.

use serde::Serialize;

use crate::attempts::AttemptError;
use crate::command::{CommandId, CommandRow, State};
use crate::engine::admin::{CommandHeadParams, OrderKeyHolderParams};
use crate::error::Result;
use crate::queue::Queue;

use super::{locate, not_found};

/// One row in full, with its source and its state when it was read.
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
/// # let dead = queue.schedule(&icq::NewCommand::new("boom", serde_json::json!({ "n": 1 }))).await?.id;
/// # let done = queue.schedule(&icq::NewCommand::new("ok", serde_json::json!({}))).await?.id;
/// # let mut registry = icq::Registry::new();
/// # registry.insert("ok", std::sync::Arc::new(icq::handler::Noop))?;
/// # let mut processor = icq::Processor::new(registry);
/// # processor.add_source(queue.source_handle(Default::default()));
/// # processor.run(icq::RunOptions::default().with_until_idle(true), Default::default()).await?;
/// use icq::State;
///
/// // `sources`: one source holding a dead letter `dead`.
/// let shown = icq::admin::show(&sources, dead.clone()).await?;
/// assert_eq!((shown.source.as_str(), shown.state), ("shop", State::Dead));
/// let json = serde_json::to_value(&shown)?; // every column, flattened: `icq show --format json`
/// assert_eq!((json["id"].as_str(), json["state"].as_str()), (Some(dead.as_str()), Some("dead")));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShownCommand {
    /// The source name.
    pub source: String,
    /// Every column.
    #[serde(flatten)]
    pub row: CommandRow,
    /// The row's state at the database's `now`.
    pub state: State,
    /// Its history: the failed attempts, which attempt succeeded, what it waits behind.
    #[serde(flatten)]
    pub attempts: AttemptsView,
}

/// What a command's view says about its attempts and its order key (JSON: the fields
/// `attempt_errors`, `succeeded_on_attempt` and `held_by` beside the columns).
///
/// # Examples
///
/// ```
/// use icq::admin::AttemptsView;
///
/// let view = AttemptsView::default();
/// let json = serde_json::to_value(&view)?;
/// assert_eq!(json["attempt_errors"], serde_json::json!([]));
/// assert!(json["held_by"].is_null());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AttemptsView {
    /// Every failed attempt kept in `Errors` (the last 20), oldest first.
    pub attempt_errors: Vec<AttemptError>,
    /// On a completed command, the attempt that succeeded (its `Attempts` count).
    pub succeeded_on_attempt: Option<i32>,
    /// On a pending command with an order key, the oldest pending command of the key
    /// scheduled before it: it runs only once that one completes or is dead-lettered.
    pub held_by: Option<CommandId>,
}

impl AttemptsView {
    /// The view of `row` (in `state`) from `source`: one look-up more for a pending row
    /// with an order key.
    async fn of(source: &Queue, row: &CommandRow, state: State) -> Result<AttemptsView> {
        let held_by = match state {
            State::Due | State::Scheduled if row.order_key.is_some() => {
                source
                    .backend()
                    .order_key_holder(&OrderKeyHolderParams { id: row.id.clone() })
                    .await?
            }
            _ => None,
        };
        Ok(AttemptsView {
            attempt_errors: crate::attempts::parse(row.errors.as_deref()),
            succeeded_on_attempt: (state == State::Completed).then_some(row.attempts),
            held_by,
        })
    }
}

/// Reads one command in full from whichever selected source holds it.
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
/// use icq::{CommandId, Error, NewCommand};
///
/// // `sources`: the queues the command line selected.
/// let command = NewCommand::new("orders.receipt", serde_json::json!({ "order": 42 }));
/// let id = queue.schedule(&command).await?.id;
/// let shown = icq::admin::show(&sources, id).await?;
/// assert_eq!(shown.row.payload["order"], 42);
/// let missing = icq::admin::show(&sources, CommandId::new()).await;
/// assert!(matches!(missing, Err(Error::NotFound(_))));
/// # Ok(())
/// # }
/// ```
pub async fn show(sources: &[Queue], id: CommandId) -> Result<ShownCommand> {
    let located = locate(sources, std::slice::from_ref(&id)).await?;
    if let Some(missing) = located.missing(std::slice::from_ref(&id)) {
        return Err(not_found(&missing, sources, "nothing to show"));
    }
    let found = located.rows.into_iter().next();
    let Some((index, row)) = found else {
        return Err(not_found(&[id], sources, "nothing to show"));
    };
    let source = &sources[index];
    let now = source.backend().clock_now().await?;
    let state = row.state(now);
    Ok(ShownCommand {
        source: source.name().to_owned(),
        attempts: AttemptsView::of(source, &row, state).await?,
        state,
        row,
    })
}

/// One row with only the start of its payload's JSON text (see [`show_head`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ShownHead {
    /// The source name.
    pub source: String,
    /// Every column; `payload` is left `null` (see `payload_head`).
    pub row: CommandRow,
    /// The row's state at the database's `now`.
    pub state: State,
    /// The first characters of the payload's JSON text, as its database prints it.
    pub payload_head: String,
    /// The length of the payload's whole JSON text, in bytes.
    pub payload_bytes: u64,
    /// Its failed attempts, which attempt succeeded, what it waits behind.
    pub attempts: AttemptsView,
}

impl ShownHead {
    /// Whether `payload_head` is the whole payload.
    pub fn whole(&self) -> bool {
        self.payload_head.len() as u64 >= self.payload_bytes
    }
}

/// Reads one command as [`show`] does, but only the first `max_chars` characters of its
/// payload's text: the database cuts it, so a payload of megabytes costs no more than
/// its start.
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
///
/// let command = NewCommand::new("report", serde_json::json!({ "text": "x".repeat(1000) }));
/// let id = queue.schedule(&command).await?.id;
/// let shown = icq::admin::show_head(&sources, id, 10).await?;
/// assert!(shown.payload_head.starts_with(r#"{"text""#));
/// assert_eq!(shown.payload_head.chars().count(), 10);
/// assert!(!shown.whole() && shown.payload_bytes > 1000);
/// # Ok(())
/// # }
/// ```
pub async fn show_head(sources: &[Queue], id: CommandId, max_chars: u32) -> Result<ShownHead> {
    let params = CommandHeadParams { id: &id, max_chars };
    let found = futures::future::try_join_all(
        sources
            .iter()
            .map(|s| async { s.backend().command_head(&params).await }),
    )
    .await?;
    let Some((source, head)) = sources
        .iter()
        .zip(found)
        .find_map(|(source, head)| head.map(|head| (source, head)))
    else {
        return Err(not_found(
            std::slice::from_ref(&id),
            sources,
            "nothing to show",
        ));
    };
    let now = source.backend().clock_now().await?;
    let state = head.row.state(now);
    Ok(ShownHead {
        source: source.name().to_owned(),
        attempts: AttemptsView::of(source, &head.row, state).await?,
        state,
        row: head.row,
        payload_head: head.payload_head,
        payload_bytes: head.payload_bytes,
    })
}
