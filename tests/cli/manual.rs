//! `--help` ends with examples and exit codes for every subcommand, and `icq man` renders
//! the man pages from the same definitions.

use std::process::{Command, Output};

fn icq(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn every_subcommand_help_has_examples_and_exit_codes() {
    for sub in [
        "work",
        "pending",
        "dead-letters",
        "requeue",
        "purge",
        "replay",
        "schedule",
        "bench",
        "doctor",
        "completions",
        "quickstart",
        "config",
        "man",
    ] {
        for flag in ["-h", "--help"] {
            let out = icq(&[sub, flag]);
            assert_eq!(out.status.code(), Some(0), "{sub} {flag}");
            let help = String::from_utf8_lossy(&out.stdout);
            assert!(help.contains("Examples:"), "{sub} {flag}: {help}");
            assert!(help.contains(&format!("icq {sub}")), "{sub} {flag}: {help}");
            assert!(help.contains("Exit codes:"), "{sub} {flag}: {help}");
        }
    }
    let top = icq(&["--help"]);
    let help = String::from_utf8_lossy(&top.stdout);
    assert!(help.contains("Exit codes:"), "{help}");
    assert!(help.contains("3  not found"), "{help}");
    assert!(help.contains("config"), "{help}");
    assert!(help.contains("\n  man "), "man is listed: {help}");
}

#[test]
fn man_prints_the_icq_page() {
    let out = icq(&["man"]);
    assert_eq!(out.status.code(), Some(0));
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        page.starts_with(".ie") || page.contains(".TH icq 1"),
        "{page}"
    );
    assert!(
        page.contains("dead\\-letters"),
        "subcommands listed: {page}"
    );
    assert!(page.contains("Exit codes"), "{page}");
}

#[test]
fn man_dir_writes_one_page_per_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("man1");
    let out = icq(&["man", "--dir", target.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "icq.1",
        "icq-work.1",
        "icq-config.1",
        "icq-config-check.1",
        "icq-dead-letters-list.1",
        "icq-migrate.1",
        "icq-doctor.1",
    ] {
        assert!(target.join(page).is_file(), "{page}");
    }
    let work = std::fs::read_to_string(target.join("icq-work.1")).unwrap();
    assert!(work.contains("fail\\-on\\-dead"), "{work}");
    assert!(work.contains("Examples"), "{work}");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.lines().any(|l| l.ends_with("icq-work.1")),
        "{listed}"
    );
}
