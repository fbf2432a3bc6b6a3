//! CLI tests.

#[path = "../support/mod.rs"]
mod support;

mod migrate;
mod schema;
mod work;
mod config;
mod admin;
mod quickstart;
mod production;
