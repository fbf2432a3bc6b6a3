//! The binary's basics: version, help, completions, usage errors.

use assert_cmd::Command;
use predicates::prelude::*;

#[test]
fn version_and_completions() {
    Command::cargo_bin("icq")
        .unwrap()
        .arg("--version")
        .assert()
        .success()
        .stdout(predicate::str::starts_with(concat!(
            "icq ",
            env!("CARGO_PKG_VERSION")
        )));
    for shell in ["bash", "zsh", "fish"] {
        Command::cargo_bin("icq")
            .unwrap()
            .args(["completions", shell])
            .assert()
            .success()
            .stdout(predicate::str::contains("dead-letters"))
            .stdout(predicate::str::contains("doctor"))
            .stdout(predicate::str::contains("max-age"));
    }
}

#[test]
fn unknown_subcommands_and_flags_exit_2() {
    Command::cargo_bin("icq")
        .unwrap()
        .arg("frobnicate")
        .assert()
        .code(2);
    Command::cargo_bin("icq")
        .unwrap()
        .args(["work", "--until-idel"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--until-idle"));
}
