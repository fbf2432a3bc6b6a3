//! # icq — a durable job queue inside your application's own database
//!
//! A command is a row in an `InternalCommands` table, written in the same transaction as
//! the business change that justified it: a rollback schedules nothing and a commit cannot
//! lose it. A processor claims due rows under a lease, runs each through its handler,
//! retries failures with capped, jittered exponential backoff and dead-letters what keeps
//! failing.
//!
//! The `icq` binary is a thin layer over this library: every subcommand parses its
//! arguments, calls one function here and renders the result.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod bench;
pub mod command;
#[cfg(feature = "cli")]
pub mod commands;
pub mod config;
pub mod demo;
pub mod engine;
pub mod error;
pub mod handler;
pub mod ident;
pub mod migrate;
#[cfg(feature = "cli")]
pub mod output;
pub mod processor;
pub mod queue;
pub mod redact;
pub mod schema;
pub mod settings;
pub mod sources;
#[cfg(feature = "cli")]
pub mod telemetry;
pub mod worker;

pub use command::{CommandId, CommandRow, CommandType, Context, NewCommand, RunAt, State};
pub use error::{Error, Result};
pub use handler::{Handler, HandlerError, HandlerResult, Job, Registry, current_context};
pub use ident::{Engine, TableName};
pub use processor::{Processor, RunOptions};
pub use queue::{Enqueue, Queue, schedule_in};
pub use settings::Settings;

/// The README's Rust examples, compiled as doctests so the README stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
