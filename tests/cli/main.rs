//! CLI tests.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod basics;
mod bench;
mod config;
mod config_check;
mod edges;
mod errors;
mod fail_on_dead;
mod leftovers;
mod manual;
mod migrate;
mod operator;
mod production;
mod properties;
mod quickstart;
mod schema;
mod work;
