//! Fleet tests (SPEC §9): several replicas on one table, the database's clock, signals,
//! dead sockets, errors that cannot heal, failover and PgBouncer — each against the real
//! server, started by the test where it needs one of its own.

#[path = "../support/mod.rs"]
mod support;

mod clock;
mod errors;
mod failover;
mod look_ahead;
mod pgbouncer;
mod signals;
mod stall;
