//! # icq — a durable job queue inside your application's own database
//!
//! A command is a row in an `InternalCommands` table, written in the same transaction as
//! the business change that justified it: a rollback schedules nothing and a commit cannot
//! lose it. A processor claims due rows under a lease, runs each through its handler,
//! retries failures with capped, jittered exponential backoff and dead-letters what keeps
//! failing.
//!
//! The `icq` binary is a thin layer over this library: every subcommand parses its
//! arguments, calls one function here and renders the result. A service that embeds the
//! queue builds it without the CLI and with the engines it runs on: `cargo add icq-queue
//! --no-default-features --features postgres` (or `sqlite`, `mysql`; see the README's
//! "Cargo features").
//!
//! The public surface: [`Queue`] (made from your pool or a URL; schedule, schedule inside
//! your transaction, bulk scheduling), [`schema::apply`] (create or upgrade the table),
//! [`Processor`] with [`Handler`]s (typed ones through [`Registry::register`]), [`admin`]
//! operations, [`Settings`], and [`Error`].
//!
//! ## Embedding: the application's pool, its transactions, typed handlers
//!
//! [`Queue::from_pool`] takes the application's own sqlx pool ([`sqlx::PgPool`],
//! [`sqlx::SqlitePool`] or [`sqlx::MySqlPool`]; icq re-exports [`sqlx`], so both use one
//! version), [`schema::apply`] creates (or upgrades) the table from Rust, and
//! [`Queue::schedule_in`] writes a command in the application's transaction: it commits
//! or rolls back with the business change. A connection of another engine than the
//! queue's is refused ([`Error::EngineMismatch`]). On SQLite:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use icq::{NewCommand, Queue, TableName};
//! use serde_json::json;
//!
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
//! let pool = sqlx::SqlitePool::connect(&url).await?;
//! sqlx::raw_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT)")
//!     .execute(&pool)
//!     .await?;
//! let table = TableName::default();
//! icq::schema::apply(&pool, &table).await?; // or a migration: `icq migrate add`
//! let queue = Queue::from_pool("shop", &pool, &table).await?;
//!
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id, status) VALUES (42, 'paid')")
//!     .execute(&mut *tx)
//!     .await?;
//! let id = queue
//!     .schedule_in(&mut *tx, &NewCommand::new("orders.receipt", json!({ "order": 42 })))
//!     .await?;
//! queue.commit(tx).await?; // the order and its command, or neither
//! assert!(queue.get(&id).await?.is_some());
//!
//! let mut tx = pool.begin().await?;
//! let lost = queue
//!     .schedule_in(&mut *tx, &NewCommand::new("orders.receipt", json!({ "order": 43 })))
//!     .await?;
//! tx.rollback().await?; // a rollback schedules nothing
//! assert!(queue.get(&lost).await?.is_none());
//! # Ok(())
//! # }
//! ```
//!
//! PostgreSQL (the commit's NOTIFY also wakes processors in other processes):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use icq::{Engine, NewCommand, Queue, TableName};
//!
//! let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/test").await?;
//! let table = TableName::parse("DocTxCommands")?;
//! # let ddl = icq::schema::render(Engine::Postgres, &table);
//! # sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.down.clone())).execute(&pool).await?;
//! icq::schema::apply(&pool, &table).await?;
//! let queue = Queue::from_pool("shop", &pool, &table).await?;
//! let mut tx = pool.begin().await?;
//! let id = queue
//!     .schedule_in(&mut *tx, &NewCommand::new("orders.receipt", serde_json::json!({})))
//!     .await?;
//! queue.commit(tx).await?;
//! assert!(queue.get(&id).await?.is_some());
//! # queue.close().await;
//! # sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.down)).execute(&pool).await?;
//! # Ok(())
//! # }
//! ```
//!
//! MySQL / MariaDB:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use icq::{Engine, NewCommand, Queue, TableName};
//!
//! let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1:3306/test").await?;
//! let table = TableName::parse("DocTxCommands")?;
//! # let ddl = icq::schema::render(Engine::Mysql, &table);
//! # sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.down.clone())).execute(&pool).await?;
//! icq::schema::apply(&pool, &table).await?;
//! let queue = Queue::from_pool("shop", &pool, &table).await?;
//! let mut tx = pool.begin().await?;
//! let id = queue
//!     .schedule_in(&mut *tx, &NewCommand::new("orders.receipt", serde_json::json!({})))
//!     .await?;
//! queue.commit(tx).await?;
//! assert!(queue.get(&id).await?.is_some());
//! # sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.down)).execute(&pool).await?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Processing with a typed handler
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use icq::{CommandType, NewCommand, Processor, Queue, Registry, RunOptions, Settings};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendReceipt {
//!     order_id: i64,
//! }
//! impl CommandType for SendReceipt {
//!     const TYPE: &'static str = "orders.send_receipt";
//! }
//!
//! # let dir = tempfile::tempdir()?;
//! # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
//! # let pool = sqlx::SqlitePool::connect(&url).await?;
//! # let table = icq::TableName::default();
//! # icq::schema::apply(&pool, &table).await?;
//! let queue = Queue::from_pool("shop", &pool, &table).await?;
//! queue.schedule(&NewCommand::typed(&SendReceipt { order_id: 42 })?).await?;
//!
//! let mut registry = Registry::new();
//! registry.register::<SendReceipt, _, _>(|receipt, job| async move {
//!     println!("receipt for order {} (attempt {})", receipt.order_id, job.attempt);
//!     Ok(())
//! })?;
//! let mut processor = Processor::new(registry);
//! processor.add_source(queue.source_handle(Settings::default()));
//! let options = RunOptions::default().with_until_idle(true); // drain, then return
//! processor.run(options, tokio_util::sync::CancellationToken::new()).await?;
//! assert_eq!(queue.stats().snapshot().succeeded, 1);
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]
// A build with no engine feature (`--no-default-features` alone) keeps schema rendering,
// migration files and settings and refuses every database URL (`Error::engine_not_built`):
// the drivers' shared helpers are then unused by design, not forgotten. Each build with at
// least one engine is held to every warning.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code, unused_variables, unused_imports)
)]

pub mod admin;
pub mod attempts;
pub mod command;
pub(crate) mod engine;
pub mod error;
pub mod handler;
pub mod ident;
mod kind;
pub mod migrate;
#[cfg(test)]
mod module_graph;
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(not(feature = "otel"))]
#[path = "otel_off.rs"]
#[allow(missing_docs, dead_code)]
pub mod otel;
mod processor;
pub mod queue;
pub mod recurring;
pub mod redact;
pub mod schema;
pub mod settings;

/// The sqlx icq is built with: use it (`icq::sqlx::PgPool`, ...) or depend on the same
/// version, so the pool you pass to [`Queue::from_pool`] is the type icq takes.
pub use sqlx;

pub use command::{CommandId, CommandRow, CommandType, Context, NewCommand, RunAt, State};
pub use engine::control::QueueState;
pub use engine::url::server_urls;
pub use engine::{Activity, ConnectOptions};
pub use error::{Error, Result};
pub use handler::{Handler, HandlerError, HandlerResult, Job, Registry, current_context};
pub use ident::{Engine, TableName};
pub use processor::{Processor, RunOptions, SourceHandle, Stats, StatsSnapshot};
pub use queue::{Enqueue, Queue, QueueDatabase, schedule_in, schedule_many_in};
pub use settings::Settings;
/// The shutdown token [`Processor::run`] takes (tokio-util's).
pub use tokio_util::sync::CancellationToken;

/// The README's Rust examples, compiled as doctests so the README stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
