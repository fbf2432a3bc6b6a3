//! Configuration (`icq.yaml`), through the library: the fixture files in
//! `fixtures/config/`, one per error class with its whole message asserted, and the lookup
//! order of `crate::cli::config::load` run in a child process with a controlled environment.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cli::config::{self, Config, ConfigRequest, HandlerKind};
use crate::cli::error::CliError;
use icq::{Engine, Settings};

const FIXTURES: &str = "tests/cli/fixtures/config";

/// The environment the fixtures are parsed with.
fn env(name: &str) -> Option<String> {
    match name {
        "ORDERS_DATABASE_URL" => Some("postgres://app:hunter2@db.internal:5432/orders".into()),
        "HOOK_TOKEN" => Some("s3cr3t-token".into()),
        _ => None,
    }
}

/// The fixture's path as shown in messages (relative to the crate, which is the test's
/// working directory) and its parse result.
fn parse_fixture(name: &str) -> (PathBuf, crate::cli::error::Result<Config>) {
    let path = Path::new(FIXTURES).join(name);
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&path))
        .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
    let parsed = config::parse(&text, &path, &env);
    (path, parsed)
}

/// The full message of the error parsing the fixture fails with, with the fixture path
/// replaced by `FILE`; checks that it is a config error (exit code 2) without the password.
fn fixture_error(name: &str) -> String {
    let (path, parsed) = parse_fixture(name);
    let err = match parsed {
        Ok(config) => panic!("{name} parsed: {config:?}"),
        Err(err) => err,
    };
    assert!(
        matches!(&err, CliError::Config { path: p, .. } if *p == path),
        "{err:?}"
    );
    assert_eq!(err.exit_code(), 2);
    let message = err.to_string();
    assert!(!message.contains("hunter2"), "password in {message}");
    message.replace(&path.display().to_string(), "FILE")
}

#[test]
fn full_example_parses_with_every_key() {
    let (path, parsed) = parse_fixture("full.yaml");
    let config = parsed.unwrap();
    assert_eq!(config.path, Some(path));
    let names: Vec<&str> = config.sources.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["orders", "local"]);

    let orders = &config.sources[0];
    assert_eq!(orders.engine().unwrap(), Engine::Postgres);
    assert_eq!(
        orders.url.expose(),
        "postgres://app:hunter2@db.internal:5432/orders"
    );
    assert_eq!(
        orders.url.to_string(),
        "postgres://app:***@db.internal:5432/orders"
    );
    assert_eq!(orders.table.to_string(), "InternalCommands");
    assert_eq!(orders.settings, Settings::default());
    assert!(!orders.embedded);

    let local = &config.sources[1];
    assert_eq!(
        local.url.expose(),
        "sqlite:local.db",
        "the ${{VAR:-default}} default"
    );
    assert_eq!(local.engine().unwrap(), Engine::Sqlite);
    assert_eq!(local.table.schema(), Some("jobs"));
    assert_eq!(local.settings.concurrency, 2);
    assert_eq!(local.settings.batch_size, 50);

    let receipt = &config.handlers["orders.send_receipt"];
    assert_eq!(
        receipt.kind,
        HandlerKind::Exec {
            argv: vec!["./bin/send-receipt".into(), "--fast".into()]
        }
    );
    assert_eq!(receipt.timeout, Some(Duration::from_secs(30)));
    assert_eq!(receipt.requires_roles, ["orders.write"]);
    let deliver = &config.handlers["webhooks.deliver"];
    match &deliver.kind {
        HandlerKind::Http { url, headers } => {
            assert_eq!(url, "http://127.0.0.1:8080/hooks");
            assert_eq!(headers["Authorization"], "Bearer s3cr3t-token");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(deliver.timeout, Some(Duration::from_secs(10)));
    assert!(deliver.requires_roles.is_empty());
    assert_eq!(config.handlers["bench.noop"].kind, HandlerKind::Noop);

    let debug = format!("{config:?}");
    assert!(
        !debug.contains("hunter2") && !debug.contains("s3cr3t"),
        "{debug}"
    );
}

#[test]
fn malformed_yaml() {
    assert_eq!(
        fixture_error("malformed.yaml"),
        "FILE:4:4: invalid YAML: did not find expected '-' indicator, while parsing a block \
         collection at line 2 column 3"
    );
}

#[test]
fn unknown_top_level_key() {
    assert_eq!(
        fixture_error("unknown_top_key.yaml"),
        "FILE:4:1: unknown field `handler`, expected `sources` or `handlers`"
    );
}

#[test]
fn unknown_source_key() {
    assert_eq!(
        fixture_error("unknown_source_key.yaml"),
        "FILE:4:5: sources[0]: unknown field `tabel`, expected one of `name`, `url`, `table`, \
         `settings`, `queues`, `schedules`"
    );
}

#[test]
fn unknown_settings_key() {
    assert_eq!(
        fixture_error("unknown_settings_key.yaml"),
        "FILE:6:7: sources[0].settings: unknown field `batchsize`, expected one of \
         `batch_size`, `max_attempts`, `lease_seconds`, `retry_backoff_base_seconds`, \
         `max_retry_backoff_seconds`, `retention_days`, `cleanup_interval_hours`, \
         `processing_delay_seconds`, `polling_interval_seconds`, `concurrency`, \
         `claim_only_handled_types`, `pooler`, `max_snoozes`"
    );
}

#[test]
fn unknown_handler_key() {
    assert_eq!(
        fixture_error("unknown_handler_key.yaml"),
        "FILE:7:5: handlers.orders.send_receipt: unknown field `timeout`, expected one of \
         `exec`, `http`, `noop`, `timeout_seconds`, `requires_roles`"
    );
}

#[test]
fn bad_type() {
    assert_eq!(
        fixture_error("bad_type.yaml"),
        "FILE:5:21: sources[0].settings.max_attempts: invalid type: string \"five\", \
         expected a whole number from 1 to 1000000"
    );
}

#[test]
fn unset_variable() {
    assert_eq!(
        fixture_error("unset_variable.yaml"),
        "FILE:5:10: environment variable `BILLING_DATABASE_URL` is not set; set it, or give \
         a default with `${BILLING_DATABASE_URL:-value}`"
    );
}

#[test]
fn bad_url_scheme() {
    assert_eq!(
        fixture_error("bad_scheme.yaml"),
        "FILE:3:10: sources[0].url: cannot tell the database engine from URL scheme \
         `redis:`; use postgres://, postgresql://, sqlite:, mysql:// or mariadb://"
    );
}

#[test]
fn duplicate_source_names() {
    assert_eq!(
        fixture_error("duplicate_sources.yaml"),
        "FILE:6:11: sources[2].name: source name `orders` is already used by sources[0] on \
         line 2; source names must be unique"
    );
}

#[test]
fn exec_given_as_a_string() {
    assert_eq!(
        fixture_error("exec_string.yaml"),
        "FILE:6:11: handlers.orders.send_receipt.exec: `exec` takes an argv list, never a \
         shell string: write exec: [\"./bin/send-receipt\", \"--fast\"]"
    );
}

#[test]
fn no_sources() {
    assert_eq!(
        fixture_error("no_sources.yaml"),
        "FILE:2:10: sources: no sources configured; list at least one, e.g.\nsources:\n  - \
         name: orders\n    url: ${ORDERS_DATABASE_URL}"
    );
    assert_eq!(
        fixture_error("empty.yaml"),
        "FILE: the file is empty; it needs a `sources:` list, e.g.\nsources:\n  - name: \
         orders\n    url: ${ORDERS_DATABASE_URL}"
    );
}

#[test]
fn password_never_appears_in_errors() {
    // serde echoes the string it could not use as settings: the password is masked in it.
    assert_eq!(
        fixture_error("password.yaml"),
        "FILE:4:15: sources[0].settings: invalid type: string \
         \"postgres://app:***@db.internal:5432/orders\", expected a mapping of settings"
    );
    // The scheme error of bad_scheme.yaml (whose URL holds a password) is checked too, by
    // fixture_error itself.
    let message = fixture_error("bad_scheme.yaml");
    assert!(message.contains("sources[0].url"), "{message}");
}

#[test]
fn select_unknown_source_lists_the_names() {
    let (_, parsed) = parse_fixture("full.yaml");
    let config = parsed.unwrap();
    assert_eq!(config.select(None).unwrap().len(), 2);
    assert_eq!(config.select(Some("local")).unwrap()[0].name, "local");
    let err = config.select(Some("billing")).unwrap_err();
    assert!(matches!(err, CliError::Usage(_)), "{err:?}");
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string().ends_with("configures: orders, local"),
        "{err}"
    );
}

// --- The lookup order, with the real environment of a child process -------------------

/// Set in the child: it runs `load` and prints one `ICQ_RESULT` line.
const CHILD: &str = "ICQ_TEST_CONFIG_CHILD";
/// In the child: the value of `--config`, if any.
const CHILD_FLAG: &str = "ICQ_TEST_CONFIG_FLAG";

/// Not a test of its own: the body of the child process [`load_in_child`] starts.
#[test]
fn lookup_child_process() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let request = ConfigRequest {
        config_path: std::env::var_os(CHILD_FLAG).map(PathBuf::from),
        ..ConfigRequest::default()
    };
    match config::load(&request) {
        Ok(config) => {
            let path = config
                .path
                .map_or("-".to_string(), |p| p.display().to_string());
            let source = &config.sources[0];
            println!(
                "ICQ_RESULT path={path} source={} embedded={} url={}",
                source.name, source.embedded, source.url
            );
        }
        Err(err) => println!("ICQ_RESULT error={err}"),
    }
}

/// A scratch world for the child: `cwd/`, `home/` (HOME, XDG dirs) and files.
struct World {
    dir: tempfile::TempDir,
    vars: Vec<(&'static str, String)>,
}

impl World {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("cwd")).unwrap();
        std::fs::create_dir_all(dir.path().join("home/.config/icq")).unwrap();
        World {
            dir,
            vars: Vec::new(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes a configuration with one source called `name`.
    fn write(&self, rel: &str, name: &str) -> PathBuf {
        let path = self.path(rel);
        std::fs::write(
            &path,
            format!("sources:\n  - name: {name}\n    url: sqlite:x.db\n"),
        )
        .unwrap();
        path
    }

    /// Runs `load` in a child copy of this test binary and returns its result line.
    fn load_in_child(&self) -> String {
        let home = self.path("home");
        let output = Command::new(std::env::current_exe().unwrap())
            .args([
                "cli::config::fixture_tests::lookup_child_process",
                "--exact",
                "--nocapture",
            ])
            .current_dir(self.path("cwd"))
            .env_remove("ICQ_CONFIG")
            .env_remove("DATABASE_URL")
            .env_remove("ICQ_DATA_DIR")
            .env_remove(CHILD_FLAG)
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_DATA_HOME", home.join(".local/share"))
            .env(CHILD, "1")
            .envs(self.vars.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout
            .lines()
            .find_map(|line| line.strip_prefix("ICQ_RESULT "))
            .unwrap_or_else(|| {
                panic!(
                    "no result from the child:\n{stdout}\n{}",
                    String::from_utf8_lossy(&output.stderr)
                )
            });
        line.replace(&self.dir.path().display().to_string(), "TMP")
    }
}

#[test]
#[cfg(target_os = "linux")]
fn lookup_order_flag_env_cwd_user_dir_url_embedded() {
    let mut world = World::new();
    assert_eq!(
        world.load_in_child(),
        "path=- source=default embedded=true \
         url=sqlite://TMP/home/.local/share/icq/icq.db?mode=rwc",
        "nothing at all: the embedded default in the user data dir"
    );
    assert!(
        world.path("home/.local/share/icq").is_dir(),
        "data dir created"
    );

    world
        .vars
        .push(("ICQ_DATA_DIR", world.path("data").display().to_string()));
    assert_eq!(
        world.load_in_child(),
        "path=- source=default embedded=true url=sqlite://TMP/data/icq.db?mode=rwc",
        "$ICQ_DATA_DIR moves the embedded database"
    );

    world
        .vars
        .push(("DATABASE_URL", "postgres://app:hunter2@db/orders".into()));
    assert_eq!(
        world.load_in_child(),
        "path=- source=default embedded=false url=postgres://app:***@db/orders",
        "$DATABASE_URL without a file: one source named default"
    );

    world.write("home/.config/icq/icq.yaml", "user");
    assert_eq!(
        world.load_in_child(),
        "path=TMP/home/.config/icq/icq.yaml source=user embedded=false url=sqlite:x.db",
        "a file wins over $DATABASE_URL"
    );

    world.write("cwd/icq.yaml", "local");
    assert_eq!(
        world.load_in_child(),
        "path=icq.yaml source=local embedded=false url=sqlite:x.db",
        "./icq.yaml wins over the user config dir"
    );

    let from_env = world.write("env.yaml", "from_env");
    world
        .vars
        .push(("ICQ_CONFIG", from_env.display().to_string()));
    assert_eq!(
        world.load_in_child(),
        "path=TMP/env.yaml source=from_env embedded=false url=sqlite:x.db",
        "$ICQ_CONFIG wins over ./icq.yaml"
    );

    let flag = world.write("flag.yaml", "flag");
    world.vars.push((CHILD_FLAG, flag.display().to_string()));
    assert_eq!(
        world.load_in_child(),
        "path=TMP/flag.yaml source=flag embedded=false url=sqlite:x.db",
        "--config wins over everything"
    );

    world.vars.pop();
    world
        .vars
        .push((CHILD_FLAG, world.path("missing.yaml").display().to_string()));
    assert_eq!(
        world.load_in_child(),
        "error=TMP/missing.yaml: no such configuration file (named by --config); check the path"
    );
}
