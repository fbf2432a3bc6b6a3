//! The reliability suite: the system attacked as a stranger would, on the real servers.
//!
//! - [`bad_rows`]: rows another program writes with plain SQL (ids that are not UUIDs or
//!   not lowercase, hostile `Attempts`, infinite or integer times, deep payloads, odd
//!   types and roles, megabyte errors): each settles on its own, the good rows around it
//!   are not held up, and the operator commands keep working on it.
//! - [`crash_loop`]: 4 `icq work` processes draining 10,000 commands while a random one is
//!   SIGKILLed and restarted 20 times: nothing lost, every duplicate explained by a kill.
//! - [`faults`]: a SQLite source drained while another writer holds the write lock.
//! - [`hardening`]: the memory and stall items: a gigabyte error body, a stderr
//!   nobody reads, `@/dev/zero` and endless JSON Lines input, a configuration nested
//!   100,000 deep.
//! - [`payload_memory`]: the payload items: large payloads keep `icq work`'s
//!   peak RSS within the bound the README states.
//! - [`lease`]: a handler outliving its lease runs once; SIGTERM kills a handler's whole
//!   process group and hands the command over cleanly.
//! - [`rescue`]: at the default lease, a SIGKILLed replica's rows (running and claimed
//!   ahead) are all completed by the survivor within seconds, none lost.
//!
//! Run with `cargo test --test reliability`; the long soak with
//! `cargo test --test reliability -- --ignored crash_loop_soak --nocapture`.

#[path = "../support/mod.rs"]
mod support;

mod common;

mod bad_rows;
mod crash_loop;
mod faults;
mod hardening;
mod lease;
mod payload_memory;
mod rescue;
