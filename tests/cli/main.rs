//! CLI tests.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod basics;
mod bench;
mod config;
mod migrate;
mod production;
mod quickstart;
mod schema;
mod work;
