//! `icq show` / `icq dead-letters show`: one command in full, in any state.

use serde::Serialize;

use crate::command::{CommandId, CommandRow, State};
use crate::error::Result;
use crate::sources::OpenSource;

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
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
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
/// # let config = icq::config::SourceConfig { name: "shop".into(), url: icq::config::DatabaseUrl::new(url), table: Default::default(), settings: Default::default(), embedded: true };
/// # let source = icq::sources::open_one(&config).await?;
/// # let queue = source.queue.clone();
/// # let sources = vec![source];
/// use icq::{CommandId, Error, NewCommand};
///
/// // `sources`: one source (see [`crate::sources`]), or wrap your queue in an `OpenSource`.
/// let command = NewCommand::new("orders.receipt", serde_json::json!({ "order": 42 }));
/// let id = queue.schedule(&command).await?.id;
/// let shown = icq::admin::show(&sources, id).await?;
/// assert_eq!(shown.row.payload["order"], 42);
/// let missing = icq::admin::show(&sources, CommandId::new()).await;
/// assert!(matches!(missing, Err(Error::NotFound(_))));
/// # Ok(())
/// # }
/// ```
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
