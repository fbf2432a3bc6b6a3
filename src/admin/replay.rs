//! `icq replay`: schedule a new copy of completed or dead commands.

use std::collections::HashMap;

use serde::Serialize;

use crate::command::{CommandId, NewCommand, State};
use crate::engine::admin::UniqueKeyHoldersParams;
use crate::error::{Error, Result};
use crate::queue::Queue;

use super::{distinct, locate_checked, state_name};

/// One replayed command.
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
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let report = icq::admin::replay(&sources, &[done.clone()]).await?;
/// let replayed = &report.replayed[0];
/// assert_eq!((&replayed.from, replayed.source.as_str()), (&done, "shop"));
/// assert_ne!(replayed.id, done); // a new row
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Replayed {
    /// The completed or dead row that was copied.
    pub from: CommandId,
    /// The new pending row; with `existing`, the pending row that already held the
    /// unique key (no copy was made).
    pub id: CommandId,
    /// A pending row already held the copied row's unique key, so it stands for the
    /// replay instead of a duplicate: `id` is that row.
    pub existing: bool,
    /// The source both live in (shown in tables; not part of the JSON).
    #[serde(skip)]
    pub source: String,
}

/// The result of [`replay`]: `{"replayed": [{"from": ID, "id": NEW_ID, "existing":
/// false}, …]}` (`existing: true` when a pending row already held the unique key and
/// `id` is that row).
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
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let report = icq::admin::replay(&sources, &[dead.clone()]).await?;
/// let new = report.replayed[0].id.clone();
/// assert_eq!(
///     serde_json::to_value(&report)?,
///     serde_json::json!({ "replayed": [{ "from": dead, "id": new, "existing": false }] })
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// The new rows, in the order the ids were given.
    pub replayed: Vec<Replayed>,
    /// How many sources were asked.
    #[serde(skip)]
    pub source_count: usize,
}

/// Schedules, for every id, a new pending row copying the type, payload, captured
/// context, queue, priority and unique key of a completed or dead row (not its trace
/// parent: the replay is new work an operator started). The old rows are left as they
/// are. When a pending row already holds the unique key (or an earlier id of the same
/// request took it), no copy is made: that row is reported with `existing: true`.
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
/// use icq::{Error, NewCommand, State};
///
/// // `sources`: one source holding a dead letter `dead` and a completed command `done`.
/// let report = icq::admin::replay(&sources, &[dead.clone(), done]).await?;
/// let copy = queue.get(&report.replayed[0].id).await?.unwrap();
/// assert_eq!((copy.type_name.as_str(), copy.payload["n"].as_i64()), ("boom", Some(1)));
/// assert_eq!(copy.state(chrono::Utc::now()), State::Due);
///
/// let pending = queue.schedule(&NewCommand::new("ok", serde_json::json!({}))).await?.id;
/// let refused = icq::admin::replay(&sources, &[pending]).await;
/// assert!(matches!(refused, Err(Error::Refused(_)))); // it will run on its own
/// # Ok(())
/// # }
/// ```
pub async fn replay(sources: &[Queue], ids: &[CommandId]) -> Result<ReplayReport> {
    let ids = distinct(ids);
    if ids.is_empty() {
        return Err(Error::invalid("name the commands to replay (ids)"));
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
        let keys: Vec<String> = {
            let mut keys: Vec<String> = rows.iter().filter_map(|r| r.unique_key.clone()).collect();
            keys.sort();
            keys.dedup();
            keys
        };
        let holders: HashMap<String, CommandId> = source
            .backend()
            .unique_key_holders(&UniqueKeyHoldersParams { keys })
            .await?
            .into_iter()
            .map(|h| (h.unique_key, h.id))
            .collect();
        // Each row: copied (its place among the new commands), or standing for by a
        // pending holder of its key, or by the copy an earlier row of this request makes.
        enum Plan {
            Copy(usize),
            Held(CommandId),
            SameAs(usize),
        }
        let mut commands: Vec<NewCommand> = Vec::new();
        let mut taken: HashMap<String, usize> = HashMap::new();
        let plans: Vec<Plan> = rows
            .iter()
            .map(|row| {
                if let Some(key) = &row.unique_key {
                    if let Some(holder) = holders.get(key) {
                        return Plan::Held(holder.clone());
                    }
                    if let Some(first) = taken.get(key) {
                        return Plan::SameAs(*first);
                    }
                    taken.insert(key.clone(), commands.len());
                }
                let mut command = NewCommand::new(row.type_name.clone(), row.payload.clone())
                    .context(row.context());
                command.queue = row.queue.clone();
                command.priority = row.priority;
                command.unique_key = row.unique_key.clone();
                // A replay keeps its keys: it runs after the pending rows of its order
                // key, and counts against its concurrency key's limit.
                command.order_key = row.order_key.clone();
                command.concurrency_key = row.concurrency_key.clone();
                commands.push(command);
                Plan::Copy(commands.len() - 1)
            })
            .collect();
        let new_ids = if commands.is_empty() {
            Vec::new()
        } else {
            source.schedule_many(&commands).await?
        };
        for (row, plan) in rows.iter().zip(plans) {
            let (id, existing) = match plan {
                Plan::Copy(n) => (new_ids[n].id.clone(), new_ids[n].existing),
                Plan::Held(holder) => (holder, true),
                Plan::SameAs(n) => (new_ids[n].id.clone(), true),
            };
            replayed.push(Replayed {
                from: row.id.clone(),
                id,
                existing,
                source: source.name().to_owned(),
            });
        }
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
