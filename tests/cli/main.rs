//! CLI tests.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod basics;
mod bench;
mod config_check;
mod doctor;
mod durability;
mod edges;
mod errors;
mod fail_on_dead;
mod leftovers;
mod manual;
mod migrate;
mod migrate_database;
mod newcomer;
mod operator;
mod papercuts;
mod production;
mod queue;
mod quickstart;
mod schedules;
mod schema;
mod work;

/// `icq work --until-idle --config CONFIG`, which must succeed; its output.
fn work_until_idle(config: &std::path::Path) -> std::process::Output {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["work", "--until-idle", "--config"])
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "icq work failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
