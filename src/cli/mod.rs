//! What only the `icq` binary needs, kept out of the library's modules: the output layer
//! (tables and JSON on stdout, notes on stderr), `icq bench`, the quick start's demo, the
//! process-wide telemetry set-up (tracing, OTLP export, the metrics endpoint) and the web
//! console. The subcommands in [`crate::commands`] call into these; nothing in the library
//! proper depends on them.

pub(crate) mod bench;
pub(crate) mod config;
pub(crate) mod console;
pub(crate) mod demo;
pub(crate) mod error;
pub(crate) mod output;
pub(crate) mod parse;
pub(crate) mod sources;
pub(crate) mod telemetry;
pub(crate) mod worker;

#[cfg(test)]
mod properties;
