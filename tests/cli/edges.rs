//! The edges a first review found, through the binary: settings that would panic, wrap or spin
//! are refused at load; `--grace-seconds` is range-checked; no password (userinfo or query
//! form) reaches any output; the metrics listener serves `GET /metrics` only; handler
//! stderr cannot forge log lines.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::TestDb;

fn icq() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_icq"));
    // Keep the tests' own environment out of the way.
    command
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1");
    command
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

/// A config with one SQLite source whose settings are `settings` (a YAML flow mapping).
fn config_with_settings(dir: &Path, settings: &str) -> PathBuf {
    let db = dir.join("q.db");
    write(
        dir,
        "icq.yaml",
        &format!(
            "sources:\n  - name: s\n    url: \"sqlite://{}?mode=rwc\"\n    settings: {settings}\n\
             handlers:\n  t:\n    noop: true\n",
            db.display()
        ),
    )
}

#[test]
fn settings_that_would_panic_wrap_or_spin_exit_2_naming_key_and_range() {
    let dir = tempfile::tempdir().unwrap();
    for (settings, wanted) in [
        (
            "{ polling_interval_seconds: 1e300 }",
            "sources[0].settings.polling_interval_seconds: `polling_interval_seconds` must be a \
             number from 0.01 to 3600 (got 1e300)",
        ),
        (
            "{ polling_interval_seconds: 1e-300 }",
            "`polling_interval_seconds` must be a number from 0.01 to 3600 (got 1e-300)",
        ),
        (
            "{ cleanup_interval_hours: 1e300 }",
            "`cleanup_interval_hours` must be a number from 0.001 to 8760 (got 1e300)",
        ),
        (
            "{ retry_backoff_base_seconds: 1e300 }",
            "`retry_backoff_base_seconds` must be a number from 0 to 31536000 (got 1e300)",
        ),
        (
            "{ max_retry_backoff_seconds: 1e300 }",
            "`max_retry_backoff_seconds` must be a number from 0 to 31536000 (got 1e300)",
        ),
        (
            "{ lease_seconds: 1e12 }",
            "`lease_seconds` must be a whole number from 1 to 604800 (got 1000000000000)",
        ),
        (
            "{ lease_seconds: 1e16 }",
            "`lease_seconds` must be a whole number from 1 to 604800 (got 1e16)",
        ),
        (
            "{ retention_days: 213503982334602 }",
            "`retention_days` must be a whole number from 1 to 36500 (got 213503982334602)",
        ),
        (
            "{ batch_size: 99999999999999999999 }",
            "`batch_size` must be a whole number from 1 to 10000 (got 99999999999999999999)",
        ),
        (
            "{ concurrency: 0 }",
            "`concurrency` must be a whole number from 1 to 10000 (got 0)",
        ),
        (
            "{ max_attempts: 0 }",
            "`max_attempts` must be a whole number from 1 to 1000000 (got 0)",
        ),
        (
            "{ processing_delay_seconds: 1e9 }",
            "`processing_delay_seconds` must be a whole number from 0 to 31536000 (got \
             1000000000)",
        ),
        (
            "{ retry_backoff_base_seconds: 60, max_retry_backoff_seconds: 30 }",
            "`retry_backoff_base_seconds` (60) must not exceed `max_retry_backoff_seconds` (30)",
        ),
    ] {
        let config = config_with_settings(dir.path(), settings);
        for args in [&["pending"][..], &["work", "--until-idle"]] {
            let out = icq()
                .args(args)
                .arg("--config")
                .arg(&config)
                .output()
                .unwrap();
            let (_, stderr) = text(&out);
            assert_eq!(out.status.code(), Some(2), "{settings} {args:?}: {stderr}");
            assert!(
                stderr.contains(&format!("{}:4:", config.display())),
                "file and line: {stderr}"
            );
            assert!(stderr.contains(wanted), "{settings}: {stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
    }
}

#[test]
fn grace_seconds_out_of_range_exit_2() {
    for (value, wanted) in [
        ("inf", "must be a finite number of seconds from 0 to 86400"),
        ("1e20", "must be at most 86400 seconds"),
        ("-1", "must not be negative"),
        ("nan", "must be a finite number of seconds"),
        ("later", "is not a number of seconds"),
    ] {
        let out = icq()
            .args(["work", "--until-idle", "--database-url", "sqlite::memory:"])
            .args(["--grace-seconds", value])
            .output()
            .unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{value}: {stderr}");
        assert!(stderr.contains("--grace-seconds"), "{value}: {stderr}");
        assert!(stderr.contains(wanted), "{value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// The two secrets every secrets test plants: one as the URL's userinfo password, one as
/// its `?password=` query parameter.
const USERINFO_SECRET: &str = "Us3rinfoPassw0rd";
const QUERY_SECRET: &str = "Qu3ryPassw0rd";

/// `url` with both secrets planted (and a harmless parameter, which must survive).
fn with_secrets(url: &str) -> String {
    let mut url = url::Url::parse(url).unwrap();
    url.set_password(Some(USERINFO_SECRET)).unwrap();
    let query = match url.query() {
        Some(query) => format!("{query}&password={QUERY_SECRET}&application_name=icqtest"),
        None => format!("password={QUERY_SECRET}&application_name=icqtest"),
    };
    url.set_query(Some(&query));
    url.to_string()
}

/// Runs `icq args...` and asserts neither secret appears on stdout or stderr; returns the
/// output for further checks.
fn run_without_leaks(args: &[&str], dir: &Path) -> Output {
    let out = icq().current_dir(dir).args(args).output().unwrap();
    let (stdout, stderr) = text(&out);
    for secret in [USERINFO_SECRET, QUERY_SECRET] {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{secret} leaked by `icq {}`:\nstdout: {stdout}\nstderr: {stderr}",
            args.join(" ")
        );
    }
    out
}

/// A config file naming `url` as its only source, with a noop handler for `t`.
fn config_for(dir: &Path, url: &str) -> PathBuf {
    write(
        dir,
        "secrets.yaml",
        &format!(
            "sources:\n  - name: s\n    url: \"{url}\"\n    settings: {{ polling_interval_seconds: 0.1 }}\n\
             handlers:\n  t:\n    noop: true\n"
        ),
    )
}

/// Every command of the secrets suite against `url`, by flag, by `$DATABASE_URL` and
/// through a config file; each in table and JSON format. `parallel` runs them all at once
/// (an unreachable server makes each wait for its connect timeout).
fn every_command_without_leaks(
    url: &str,
    dir: &Path,
    migrations: &Path,
    parallel: bool,
) -> Vec<Output> {
    every_command_without_leaks_logging(url, dir, migrations, parallel, None)
}

/// [`every_command_without_leaks`] with `RUST_LOG` set to `log` (unset for `None`).
fn every_command_without_leaks_logging(
    url: &str,
    dir: &Path,
    migrations: &Path,
    parallel: bool,
    log: Option<&str>,
) -> Vec<Output> {
    let config = config_for(dir, url);
    let config = config.to_str().unwrap();
    let migrations = migrations.to_str().unwrap();
    let mut runs: Vec<(Vec<&str>, Option<&str>)> = Vec::new();
    for format in ["table", "json"] {
        let commands: Vec<Vec<&str>> = vec![
            vec!["migrate", "run", "--dir", migrations, "--database-url", url],
            vec!["pending", "--database-url", url],
            vec!["pending", "--by-type", "--config", config],
            vec![
                "schedule",
                "--type",
                "t",
                "--payload",
                "{}",
                "--database-url",
                url,
            ],
            vec![
                "schedule",
                "--type",
                "t",
                "--payload",
                "{}",
                "--config",
                config,
            ],
            vec!["work", "--until-idle", "--config", config],
            vec![
                "work",
                "--until-idle",
                "--log-format",
                "json",
                "--config",
                config,
            ],
            vec!["dead-letters", "list", "--database-url", url],
            vec!["purge", "--completed", "--yes", "--config", config],
            vec!["migrate", "info", "--dir", migrations, "--config", config],
            vec![
                "migrate",
                "run",
                "--dry-run",
                "--dir",
                migrations,
                "--database-url",
                url,
            ],
        ];
        for mut args in commands {
            args.extend(["--format", format]);
            runs.push((args, None));
        }
        // The ambient variable too.
        runs.push((vec!["pending", "--format", format], Some(url)));
    }
    let run = |(args, database_url): &(Vec<&str>, Option<&str>)| {
        let mut command = icq();
        command.current_dir(dir).args(args);
        if let Some(url) = database_url {
            command.env("DATABASE_URL", url);
        }
        if let Some(log) = log {
            command.env("RUST_LOG", log);
        }
        let out = command.output().unwrap();
        let (stdout, stderr) = text(&out);
        for secret in [USERINFO_SECRET, QUERY_SECRET] {
            assert!(
                !stdout.contains(secret) && !stderr.contains(secret),
                "{secret} leaked by `icq {}`:\nstdout: {stdout}\nstderr: {stderr}",
                args.join(" ")
            );
        }
        out
    };
    if parallel {
        std::thread::scope(|scope| {
            let handles: Vec<_> = runs.iter().map(|r| scope.spawn(move || run(r))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    } else {
        runs.iter().map(run).collect()
    }
}

/// `icq migrate add` into a fresh directory.
fn migrations_dir(dir: &Path, engine: &str) -> PathBuf {
    let migrations = dir.join("migrations");
    let out = icq()
        .args(["migrate", "add", "--engine", engine, "--dir"])
        .arg(&migrations)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out).1);
    migrations
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_never_printed_for_an_unreachable_database() {
    let dir = tempfile::tempdir().unwrap();
    let migrations = migrations_dir(dir.path(), "postgres");
    // Nothing listens on port 1.
    let url = with_secrets("postgres://postgres@127.0.0.1:1/test");
    let outputs = every_command_without_leaks(&url, dir.path(), &migrations, true);
    for out in &outputs {
        assert!(!out.status.success(), "{}", text(out).1);
        let (_, stderr) = text(out);
        assert!(stderr.contains("error"), "{stderr}");
    }
    // The URL is still named, masked.
    let (_, stderr) = text(&outputs[0]);
    assert!(
        stderr.contains(
            "postgres://postgres:***@127.0.0.1:1/test?password=***&application_name=icqtest"
        ),
        "{stderr}"
    );

    // An unparseable URL, a SQLite one that cannot be opened, an unreachable MariaDB.
    let urls = [
        format!("postgres://postgres:{USERINFO_SECRET}@[::1/db?password={QUERY_SECRET}"),
        format!("sqlite:///nonexistent/dir/q.db?mode=ro&password={QUERY_SECRET}"),
        format!("mysql://root:{USERINFO_SECRET}@127.0.0.1:1/test?password={QUERY_SECRET}"),
    ];
    std::thread::scope(|scope| {
        for url in &urls {
            for args in [
                vec!["pending", "--database-url", url.as_str()],
                vec![
                    "schedule",
                    "--type",
                    "t",
                    "--payload",
                    "{}",
                    "--database-url",
                    url,
                ],
                vec!["migrate", "run", "--format", "json", "--database-url", url],
            ] {
                let dir = dir.path();
                scope.spawn(move || {
                    let out = run_without_leaks(&args, dir);
                    assert!(!out.status.success());
                });
            }
        }
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_never_printed_for_a_reachable_database() {
    // PostgreSQL on 127.0.0.1 trusts local connections: any password is accepted.
    let db = TestDb::new("postgres", "secrets").await;
    let dir = tempfile::tempdir().unwrap();
    let url = with_secrets(&db.url);
    // Before the table exists: the "table missing" error.
    let out = run_without_leaks(&["pending", "--database-url", &url], dir.path());
    assert!(!out.status.success());
    assert!(text(&out).1.contains("does not exist"), "{}", text(&out).1);

    let migrations = migrations_dir(dir.path(), "postgres");
    let outputs = every_command_without_leaks(&url, dir.path(), &migrations, false);
    let (stdout, stderr) = text(&outputs[0]);
    assert!(outputs[0].status.success(), "{stderr}");
    assert!(stdout.contains("Applied"), "{stdout}");
    for out in &outputs[1..] {
        assert!(out.status.success(), "{}", text(out).1);
    }
    // `migrate run --format json` names the database, masked.
    let json = &outputs[outputs.len() / 2];
    assert_eq!(json.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let shown = doc["database"].as_str().unwrap();
    assert!(
        shown.contains(":***@")
            && shown.contains("password=***")
            && shown.contains("application_name=icqtest"),
        "{shown}"
    );
    // The scheduled commands ran: the worker connected with the password.
    let (t, p) = (db.q("InternalCommands"), db.q("ProcessedAt"));
    assert_eq!(
        db.scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {p} IS NULL"))
            .await,
        0
    );
    assert!(
        db.scalar_i64(&format!("SELECT COUNT(*) FROM {t}")).await + 4 >= 4,
        "purge may have removed completed rows"
    );
}

/// Secrets in PostgreSQL parameters sqlx does not take (`PassWord`, any case;
/// `sslpassword`), which sqlx logged with their value, and inside `options`
/// (`-c%20password%3D…`, `options[password]=…`), which every error echoed. Every
/// subcommand, at the default log level, at `warn` (sqlx's own warnings) and at `trace`
/// (everything), on a reachable server (the parameters are dropped and the commands
/// succeed) and an unreachable one.
#[tokio::test(flavor = "multi_thread")]
async fn secrets_in_postgres_parameters_never_printed_at_any_log_level() {
    let db = TestDb::new("postgres", "secrets20").await;
    let dir = tempfile::tempdir().unwrap();
    let migrations = migrations_dir(dir.path(), "postgres");
    let plant = |base: &str, query: &str| {
        let mut url = url::Url::parse(base).unwrap();
        url.set_password(Some(USERINFO_SECRET)).unwrap();
        format!("{url}?{query}&application_name=icqtest")
    };
    let unknown = format!(
        "PassWord={QUERY_SECRET}&PASSWORD={QUERY_SECRET}&sslpassword={QUERY_SECRET}&SslPassword={QUERY_SECRET}"
    );
    let options = format!(
        "options=-c%20password%3D{QUERY_SECRET}&options=-c+PWD%3d{QUERY_SECRET}&options[password]={QUERY_SECRET}"
    );
    for log in [None, Some("warn"), Some("trace")] {
        // Reachable: the unknown secret parameters are dropped before sqlx sees them.
        let url = plant(&db.url, &unknown);
        let outputs =
            every_command_without_leaks_logging(&url, dir.path(), &migrations, false, log);
        for out in &outputs {
            assert!(out.status.success(), "{log:?}: {}", text(out).1);
        }
        let more = other_commands_without_leaks(&url, dir.path(), log);
        for out in &more[..more.len() - 1] {
            assert!(
                matches!(out.status.code(), Some(0 | 3)),
                "{log:?}: {}",
                text(out).1
            );
        }
        // Unreachable, and a server that refuses the `options` (password is not a
        // setting): errors, none naming a secret.
        let down = plant(
            "postgres://postgres@127.0.0.1:1/test",
            &format!("{unknown}&{options}"),
        );
        let refused = plant(&db.url, &options);
        for url in [down, refused] {
            let outputs =
                every_command_without_leaks_logging(&url, dir.path(), &migrations, true, log);
            for out in &outputs {
                assert!(!out.status.success(), "{log:?}: {}", text(out).1);
            }
            let (_, stderr) = text(&outputs[1]);
            assert!(
                stderr.contains("password%3D***") || stderr.contains("***"),
                "{stderr}"
            );
            other_commands_without_leaks(&url, dir.path(), log);
        }
    }
    // The warning that replaces sqlx's names the parameter, not its value.
    let url = plant(&db.url, &unknown);
    let config = config_for(dir.path(), &url);
    let out = icq()
        .current_dir(dir.path())
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("ignoring the connect parameter") && stderr.contains("parameter=PassWord"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("ignoring unrecognized connect parameter"),
        "{stderr}"
    );
}

/// The subcommands [`every_command_without_leaks`] leaves out, each asserted not to leak:
/// list, show, cancel, requeue, replay, quickstart, config check, the last with `url` in
/// the configuration file.
fn other_commands_without_leaks(url: &str, dir: &Path, log: Option<&str>) -> Vec<Output> {
    let id = "00000000-0000-4000-8000-000000000000";
    let config = config_for(dir, url);
    let config = config.to_str().unwrap();
    let runs: Vec<Vec<&str>> = vec![
        vec!["list", "--state", "dead", "--database-url", url],
        vec!["show", id, "--format", "json", "--database-url", url],
        vec![
            "cancel",
            "--type",
            "nothing",
            "--yes",
            "--database-url",
            url,
        ],
        vec!["requeue", "--all-dead", "--yes", "--database-url", url],
        vec!["replay", id, "--database-url", url],
        vec!["quickstart", "--format", "json", "--database-url", url],
        vec!["config", "check", "--config", config],
    ];
    runs.iter()
        .map(|args| {
            let mut command = icq();
            command.current_dir(dir).args(args);
            if let Some(log) = log {
                command.env("RUST_LOG", log);
            }
            let out = command.output().unwrap();
            let (stdout, stderr) = text(&out);
            for secret in [USERINFO_SECRET, QUERY_SECRET] {
                assert!(
                    !stdout.contains(secret) && !stderr.contains(secret),
                    "{secret} leaked by `icq {}` (RUST_LOG={log:?}):\nstdout: {stdout}\nstderr: {stderr}",
                    args.join(" ")
                );
            }
            out
        })
        .collect()
}

/// A free TCP port on 127.0.0.1 (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_listener_serves_get_metrics_only_in_icq_work() {
    let db = TestDb::with_table("sqlite", "metrics").await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(dir.path(), &db.url);
    // A free port can be taken by another test's server before icq binds it (which ends
    // icq, or leaves the other server answering): start again on another port then.
    let spawn = |addr: &str| {
        icq()
            .args(["work", "--metrics-addr", addr, "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut addr = format!("127.0.0.1:{}", free_port());
    let mut worker = spawn(&addr);
    let client = reqwest::Client::new();
    let started = Instant::now();
    let body = loop {
        if worker.try_wait().unwrap().is_some() {
            addr = format!("127.0.0.1:{}", free_port());
            worker = spawn(&addr);
        }
        match client.get(format!("http://{addr}/metrics")).send().await {
            Ok(response) if response.status() == 200 => {
                let body = response.text().await.unwrap();
                if body.contains("icq_internal_commands") {
                    break body;
                }
            }
            _ if started.elapsed() < Duration::from_secs(30) => {}
            other => {
                let _ = worker.kill();
                panic!("no metrics: {other:?}")
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no metrics from icq"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let url = |path: &str| format!("http://{addr}{path}");
    assert!(body.contains("icq_internal_commands"), "{body}");
    assert_eq!(client.get(url("/")).send().await.unwrap().status(), 404);
    assert_eq!(
        client.get(url("/anything")).send().await.unwrap().status(),
        404
    );
    assert_eq!(
        client.post(url("/metrics")).send().await.unwrap().status(),
        405
    );
    assert_eq!(
        client
            .delete(url("/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        405
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(worker.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn handler_stderr_cannot_forge_log_lines() {
    let db = TestDb::with_table("sqlite", "forge").await;
    let dir = tempfile::tempdir().unwrap();
    let script = write(
        dir.path(),
        "forge.sh",
        "#!/bin/sh\nprintf 'boom\\n2030-01-01T00:00:00.000000Z ERROR icq: forged line\\n\\033[2K' >&2\nexit 1\n",
    );
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = write(
        dir.path(),
        "icq.yaml",
        &format!(
            "sources:\n  - name: s\n    url: \"{}\"\n    settings: {{ max_attempts: 1, polling_interval_seconds: 0.1 }}\n\
             handlers:\n  forge.test:\n    exec: [\"{}\"]\n",
            db.url,
            script.display()
        ),
    );
    let (t, ty, pl) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
    db.execute(&format!(
        "INSERT INTO {t} ({ty}, {pl}) VALUES ('forge.test', '{{}}')"
    ))
    .await;
    let out = icq()
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env("RUST_LOG", "icq=debug")
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr
            .lines()
            .any(|line| line.contains("forged line") && !line.contains("boom")),
        "a log line was forged:\n{stderr}"
    );
    assert!(!stderr.contains('\x1b'), "raw escape in logs:\n{stderr}");
    assert!(
        stderr.contains("boom\\n2030-01-01T00:00:00.000000Z ERROR icq: forged line"),
        "the failure is logged, escaped:\n{stderr}"
    );
    // LastError stays readable: its line break is kept, the escape sequence is not raw.
    let (le, dl) = (db.q("LastError"), db.q("DeadLetteredAt"));
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {dl} IS NOT NULL AND {le} = 'exit status 1: boom' || char(10) || \
             '2030-01-01T00:00:00.000000Z ERROR icq: forged line' || char(10) || '\\u{{1b}}[2K'"
        ))
        .await,
        1
    );
}

/// `icq … 2>&1 | head -0`: stdout and stderr closed before icq writes. Every command
/// still does its work and exits as it would (no `failed printing to stderr` panic).
#[test]
fn closed_stdout_and_stderr_exit_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("q.db").display());
    let migrations = migrations_dir(dir.path(), "sqlite");
    let config = config_for(dir.path(), &url);
    let (config, migrations) = (config.to_str().unwrap(), migrations.to_str().unwrap());
    let runs: Vec<Vec<&str>> = vec![
        vec![
            "migrate",
            "run",
            "--dir",
            migrations,
            "--database-url",
            &url,
        ],
        vec![
            "migrate",
            "run",
            "--dir",
            migrations,
            "--database-url",
            &url,
        ],
        vec!["migrate", "add", "--engine", "sqlite", "--stdout"],
        vec![
            "schedule",
            "--type",
            "t",
            "--payload",
            "{}",
            "--config",
            config,
        ],
        vec!["pending", "--config", config],
        vec!["work", "--until-idle", "--config", config],
        vec!["dead-letters", "list", "--config", config],
        vec!["purge", "--completed", "--yes", "--config", config],
        // An error goes to the closed stderr too: the exit code still says what happened.
        vec!["show-me-the-money"],
    ];
    for args in &runs {
        let mut child = icq()
            .current_dir(dir.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        drop(child.stderr.take());
        let status = child.wait().unwrap();
        let expected = if args[0] == "show-me-the-money" { 2 } else { 0 };
        assert_eq!(
            status.code(),
            Some(expected),
            "`icq {}` with closed stdout and stderr",
            args.join(" ")
        );
    }
    let out = icq()
        .args(["pending", "--format", "json", "--config", config])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out).1);
    let counts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(counts[0]["completed"], 0, "purged: {counts}");
    assert_eq!(counts[0]["due"], 0, "the scheduled command ran: {counts}");
}

/// Values that would store or ask for nothing are usage errors (exit 2) before any
/// database is opened: an empty type, an empty role name, `--limit 0`.
#[test]
fn empty_types_empty_roles_and_limit_zero_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("q.db").display());
    let runs: Vec<(Vec<&str>, &str)> = vec![
        (vec!["schedule", "--type", "", "--payload", "{}"], "--type"),
        (
            vec!["schedule", "--type", "  ", "--payload", "{}"],
            "--type",
        ),
        (
            vec!["schedule", "--type", "t", "--payload", "{}", "--roles", ""],
            "--roles",
        ),
        (
            vec![
                "schedule",
                "--type",
                "t",
                "--payload",
                "{}",
                "--roles",
                "a,,b",
            ],
            "--roles",
        ),
        (vec!["dead-letters", "list", "--type", ""], "--type"),
        (vec!["dead-letters", "list", "--limit", "0"], "--limit"),
        (
            vec!["requeue", "--all-dead", "--type", "", "--yes"],
            "--type",
        ),
    ];
    for (args, flag) in runs {
        let out = icq()
            .current_dir(dir.path())
            .args(&args)
            .args(["--database-url", &url])
            .output()
            .unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(
            out.status.code(),
            Some(2),
            "`icq {}`: {stderr}",
            args.join(" ")
        );
        assert!(
            stderr.contains(flag),
            "`icq {}` names {flag}: {stderr}",
            args.join(" ")
        );
    }
    assert!(
        !dir.path().join("q.db").exists(),
        "no database was opened for a usage error"
    );
}

/// `icq work` with no handlers refuses to start (it would dead-letter everything due),
/// and with `claim_only_handled_types` a worker leaves other workers' types pending.
#[test]
fn no_handlers_refused_and_unhandled_types_stay_pending() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("q.db").display());
    let migrations = migrations_dir(dir.path(), "sqlite");
    let run = |args: &[&str]| {
        let out = icq().current_dir(dir.path()).args(args).output().unwrap();
        (out.status.code(), text(&out))
    };
    let (code, (_, stderr)) = run(&[
        "migrate",
        "run",
        "--dir",
        migrations.to_str().unwrap(),
        "--database-url",
        &url,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    for ty in ["mine", "theirs"] {
        let (code, (_, stderr)) = run(&[
            "schedule",
            "--type",
            ty,
            "--payload",
            "{}",
            "--database-url",
            &url,
        ]);
        assert_eq!(code, Some(0), "{stderr}");
    }

    let (code, (_, stderr)) = run(&["work", "--until-idle", "--database-url", &url]);
    assert_ne!(
        code,
        Some(0),
        "a worker without handlers must not start: {stderr}"
    );
    assert!(stderr.contains("no handlers"), "{stderr}");

    let config = write(
        dir.path(),
        "mine.yaml",
        &format!(
            "sources:\n  - name: s\n    url: \"{url}\"\n    settings: {{ claim_only_handled_types: true, polling_interval_seconds: 0.1 }}\n\
             handlers:\n  mine:\n    noop: true\n"
        ),
    );
    let (code, (_, stderr)) = run(&["work", "--until-idle", "--config", config.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, (stdout, stderr)) = run(&[
        "pending",
        "--by-type",
        "--format",
        "json",
        "--database-url",
        &url,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let rows: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let of = |ty: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["type"] == ty)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {ty}: {rows}"))
    };
    assert_eq!(of("mine")["completed"], 1, "{rows}");
    assert_eq!(
        of("theirs")["due"],
        1,
        "left for the worker that has it: {rows}"
    );
    assert_eq!(of("theirs")["dead"], 0, "{rows}");
}

/// Defect: `--in -5m` and `--older-than -1d` said `unexpected argument '-5'`; and
/// `schedule --in 999999999w` reached the database. Both are usage errors (exit 2)
/// that say what is wrong, and nothing is written.
#[test]
fn negative_and_oversized_durations_are_refused_before_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("q.db").display());
    let runs: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["schedule", "--type", "t", "--payload", "{}", "--in", "-5m"],
            "must not be negative",
        ),
        (
            vec!["purge", "--completed", "--older-than", "-1d", "--yes"],
            "must not be negative",
        ),
        (
            vec!["work", "--until-idle", "--grace-seconds", "-1"],
            "must not be negative",
        ),
        (
            vec![
                "schedule",
                "--type",
                "t",
                "--payload",
                "{}",
                "--in",
                "999999999w",
            ],
            "at most 100 years ahead",
        ),
    ];
    for (args, says) in runs {
        let out = icq()
            .arg("--database-url")
            .arg(&url)
            .args(&args)
            .output()
            .unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("unexpected argument"),
            "{args:?}: {stderr}"
        );
    }
    assert!(
        !dir.path().join("q.db").exists()
            || std::fs::metadata(dir.path().join("q.db")).unwrap().len() == 0,
        "nothing reached the database"
    );
}

/// Defect: `requeue ID --type X` ignored `--type` and requeued. Flags that do not
/// combine are refused by the parser (exit 2), before any database is opened.
#[test]
fn flags_that_do_not_combine_are_refused() {
    let runs: Vec<Vec<&str>> = vec![
        vec![
            "requeue",
            "10000000-0000-4000-8000-000000000001",
            "--type",
            "x",
        ],
        vec!["requeue", "--type", "x"],
        vec![
            "cancel",
            "10000000-0000-4000-8000-000000000001",
            "--type",
            "x",
        ],
        vec![
            "schedule",
            "--type",
            "t",
            "--payload",
            "{}",
            "--in",
            "5m",
            "--at",
            "2030-01-01T00:00:00Z",
        ],
        vec!["work", "--fail-on-dead"],
    ];
    for args in runs {
        let out = icq()
            .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
            .args(&args)
            .output()
            .unwrap();
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("cannot be used with") || stderr.contains("required"),
            "{args:?}: {stderr}"
        );
    }
}

/// Defect: an unknown-type dead letter logged nothing and a last-attempt failure logged
/// `terminal=false`. Every dead letter is one WARN line with id, type, attempts and the
/// reason, whatever made it dead.
#[test]
fn every_dead_letter_is_logged_at_warn_with_id_type_attempts_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("q.db");
    let config = write(
        dir.path(),
        "icq.yaml",
        &format!(
            "sources:\n  - name: s\n    url: \"sqlite://{}?mode=rwc\"\n    settings: {{ max_attempts: 1 }}\n\
             handlers:\n  fails:\n    exec: [\"/bin/sh\", \"-c\", \"echo broken >&2; exit 1\"]\n",
            db.display()
        ),
    );
    let sql = icq()
        .args(["migrate", "add", "--engine", "sqlite", "--stdout"])
        .output()
        .unwrap();
    let url = format!("sqlite://{}?mode=rwc", db.display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use sqlx::Connection as _;
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(String::from_utf8(sql.stdout).unwrap()))
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::raw_sql(
            r#"INSERT INTO "InternalCommands" ("Id", "Type", "Payload") VALUES
               ('dead-unknown', 'nobody.handles', '{}'),
               ('dead-failing', 'fails', '{}')"#,
        )
        .execute(&mut conn)
        .await
        .unwrap();
    });
    let out = icq()
        .args(["work", "--until-idle", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    for (id, ty, reason) in [
        ("dead-unknown", "nobody.handles", "no handler is registered"),
        ("dead-failing", "fails", "broken"),
    ] {
        let line = stderr
            .lines()
            .find(|l| l.contains("command dead-lettered") && l.contains(id))
            .unwrap_or_else(|| panic!("no dead-letter line for {id}:\n{stderr}"));
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains(ty), "{line}");
        assert!(line.contains("attempts=1"), "{line}");
        assert!(line.contains(reason), "{line}");
        assert!(!line.contains("terminal=false"), "{line}");
    }
}
