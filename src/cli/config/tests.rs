//! Unit tests for `parse`: the happy path, then one test per error class with its message
//! asserted (position, key path, wording).

use super::*;

fn env(name: &str) -> Option<String> {
    match name {
        "ORDERS_URL" => Some("postgres://app:hunter2@db:5432/orders".into()),
        "TOKEN" => Some("t0k3n".into()),
        _ => None,
    }
}

fn parse_text(text: &str) -> Result<Config> {
    parse(text, Path::new("icq.yaml"), &env)
}

/// The message of the `CliError::Config` that parsing `text` fails with.
fn error(text: &str) -> String {
    match parse_text(text) {
        Ok(config) => panic!("parsed: {config:?}"),
        Err(CliError::Config { path, message }) => {
            assert_eq!(path, Path::new("icq.yaml"));
            message
        }
        Err(other) => panic!("not a config error: {other:?}"),
    }
}

const ONE_SOURCE: &str = "sources:\n  - name: orders\n    url: ${ORDERS_URL}\n";

#[test]
fn parses_the_contract_example() {
    let text = "\
sources:
  - name: orders
    url: ${ORDERS_URL}
    table: jobs.InternalCommands
    settings:
      batch_size: 20
      retry_backoff_base_seconds: 1.5
  - name: local
    url: sqlite:local.db
handlers:
  orders.send_receipt:
    exec: [\"./bin/send-receipt\", \"--fast\"]
    timeout_seconds: 30
    requires_roles: [orders.write]
  webhooks.deliver:
    http: { url: \"http://127.0.0.1:8080/hooks\", headers: { Authorization: \"Bearer ${TOKEN}\" } }
    timeout_seconds: 0.5
  bench.noop:
    noop: true
";
    let config = parse_text(text).unwrap();
    assert_eq!(config.path.as_deref(), Some(Path::new("icq.yaml")));
    let [orders, local] = config.sources.as_slice() else {
        panic!("{config:?}")
    };
    assert_eq!(orders.name, "orders");
    assert_eq!(orders.url.expose(), "postgres://app:hunter2@db:5432/orders");
    assert_eq!(orders.engine().unwrap(), Engine::Postgres);
    assert_eq!(orders.table.to_string(), "jobs.InternalCommands");
    assert_eq!(orders.settings.batch_size, 20);
    assert_eq!(orders.settings.retry_backoff_base_seconds, 1.5);
    assert_eq!(
        orders.settings.max_attempts,
        Settings::default().max_attempts
    );
    assert!(!orders.embedded);
    assert_eq!(local.engine().unwrap(), Engine::Sqlite);
    assert_eq!(local.table, TableName::default());
    assert_eq!(local.settings, Settings::default());

    let receipt = &config.handlers["orders.send_receipt"];
    assert_eq!(
        receipt.kind,
        HandlerKind::Exec {
            argv: vec!["./bin/send-receipt".into(), "--fast".into()]
        }
    );
    assert_eq!(receipt.timeout, Some(Duration::from_secs(30)));
    assert_eq!(receipt.requires_roles, ["orders.write"]);
    let HandlerKind::Http { url, headers } = &config.handlers["webhooks.deliver"].kind else {
        panic!("{config:?}")
    };
    assert_eq!(url, "http://127.0.0.1:8080/hooks");
    assert_eq!(headers["Authorization"], "Bearer t0k3n");
    assert_eq!(
        config.handlers["webhooks.deliver"].timeout,
        Some(Duration::from_millis(500))
    );
    assert_eq!(config.handlers["bench.noop"].kind, HandlerKind::Noop);
    assert_eq!(config.handlers["bench.noop"].timeout, None);
}

#[test]
fn debug_and_display_never_show_passwords_or_header_values() {
    let text = format!(
        "{ONE_SOURCE}handlers:\n  h:\n    http: {{url: 'https://u:pw@x/h', headers: {{X-Key: ${{TOKEN}}}}}}\n"
    );
    let config = parse_text(&text).unwrap();
    let debug = format!("{config:?}");
    for secret in ["hunter2", "t0k3n", ":pw@"] {
        assert!(!debug.contains(secret), "{secret} in {debug}");
    }
    assert!(
        debug.contains("postgres://app:***@db:5432/orders"),
        "{debug}"
    );
    assert_eq!(
        config.sources[0].url.to_string(),
        "postgres://app:***@db:5432/orders"
    );
    let request = ConfigRequest {
        database_url: Some("mysql://root:hunter2@h/db".into()),
        ..ConfigRequest::default()
    };
    assert!(!format!("{request:?}").contains("hunter2"));
}

#[test]
fn malformed_yaml_names_the_line() {
    let message = error("sources:\n  - name: a\n  url: x\n");
    assert!(
        message.starts_with("3:3: invalid YAML: did not find expected '-' indicator"),
        "{message}"
    );
}

#[test]
fn duplicate_keys_are_refused_where_they_repeat() {
    let message = error(&format!("{ONE_SOURCE}    name: again\n"));
    assert!(
        message.starts_with("4:5: sources[0]: key `name` appears twice in the same mapping"),
        "{message}"
    );
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a.b:\n    noop: true\n  a.b:\n    noop: true\n"
    ));
    assert!(
        message.starts_with("7:3: handlers: key `a.b` appears twice"),
        "{message}"
    );
}

#[test]
fn unknown_top_level_key() {
    let message = error(&format!("{ONE_SOURCE}handler:\n  a: {{noop: true}}\n"));
    assert_eq!(
        message,
        "4:1: unknown field `handler`, expected `sources` or `handlers`"
    );
}

#[test]
fn unknown_source_key() {
    let message = error(&format!("{ONE_SOURCE}    tabel: Jobs\n"));
    assert_eq!(
        message,
        "4:5: sources[0]: unknown field `tabel`, expected one of `name`, `url`, `table`, \
         `settings`, `queues`, `schedules`"
    );
}

#[test]
fn unknown_settings_key() {
    let message = error(&format!("{ONE_SOURCE}    settings:\n      batchsize: 5\n"));
    assert!(
        message.starts_with(
            "5:7: sources[0].settings: unknown field `batchsize`, expected one of `batch_size`"
        ),
        "{message}"
    );
}

#[test]
fn unknown_handler_key() {
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a.b:\n    noop: true\n    timeout: 3\n"
    ));
    assert!(
        message.starts_with("7:5: handlers.a.b: unknown field `timeout`, expected one of"),
        "{message}"
    );
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a.b:\n    http: {{url: 'http://h', header: {{}}}}\n"
    ));
    assert!(
        message.starts_with("6:29: handlers.a.b.http: unknown field `header`"),
        "{message}"
    );
}

#[test]
fn bad_types() {
    let message = error(&format!(
        "{ONE_SOURCE}    settings:\n      batch_size: lots\n"
    ));
    assert!(
        message.starts_with("5:19: sources[0].settings.batch_size: invalid type: string \"lots\""),
        "{message}"
    );
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a:\n    noop: true\n    requires_roles: admin\n"
    ));
    assert!(
        message.starts_with("7:21: handlers.a.requires_roles: invalid type: string \"admin\""),
        "{message}"
    );
    let message = error("- a\n- b\n");
    assert_eq!(
        message,
        "1:1: invalid type: sequence, expected a mapping with `sources` and `handlers`"
    );
    let message = error("sources:\n  - name: a\n");
    assert_eq!(message, "2:5: sources[0]: missing field `url`");
}

#[test]
fn out_of_range_settings_name_the_key() {
    let message = error(&format!(
        "{ONE_SOURCE}    settings:\n      concurrency: 0\n"
    ));
    assert_eq!(
        message,
        "5:20: sources[0].settings.concurrency: `concurrency` must be a whole number from 1 to \
         10000 (got 0)"
    );
    // Too large for the field's type: still out of range for that key, not a type error.
    let message = error(&format!(
        "{ONE_SOURCE}    settings:\n      batch_size: 99999999999999999999\n"
    ));
    assert_eq!(
        message,
        "5:19: sources[0].settings.batch_size: `batch_size` must be a whole number from 1 to \
         10000 (got 99999999999999999999)"
    );
    // Cross-field: positioned at the first key named.
    let message = error(&format!(
        "{ONE_SOURCE}    settings:\n      max_retry_backoff_seconds: 5\n      retry_backoff_base_seconds: 10\n"
    ));
    assert!(
        message.starts_with(
            "6:35: sources[0].settings.retry_backoff_base_seconds: `retry_backoff_base_seconds` \
             (10) must not exceed `max_retry_backoff_seconds` (5)"
        ),
        "{message}"
    );
}

#[test]
fn claim_only_handled_types_is_a_per_source_boolean() {
    let config = parse_text(&format!(
        "{ONE_SOURCE}    settings:\n      claim_only_handled_types: true\n  - name: b\n    url: sqlite:b.db\n"
    ))
    .unwrap();
    assert!(config.sources[0].settings.claim_only_handled_types);
    assert!(
        !config.sources[1].settings.claim_only_handled_types,
        "off by default"
    );
    let message = error(&format!(
        "{ONE_SOURCE}    settings:\n      claim_only_handled_types: yes please\n"
    ));
    assert!(
        message.starts_with(
            "5:33: sources[0].settings.claim_only_handled_types: invalid type: string \"yes please\", expected a boolean"
        ),
        "{message}"
    );
}

#[test]
fn unset_variable_names_variable_and_line() {
    let message = error("sources:\n  - name: a\n    url: ${NOPE}\n");
    assert_eq!(
        message,
        "3:10: environment variable `NOPE` is not set; set it, or give a default with \
         `${NOPE:-value}`"
    );
    // A default makes it fine (taken literally); `$$` is a literal dollar.
    let config = parse_text("sources:\n  - name: a\n    url: ${NOPE:-sqlite:a.db}$$\n").unwrap();
    assert_eq!(config.sources[0].url.expose(), "sqlite:a.db$");
}

#[test]
fn columns_after_expansion_point_into_the_file() {
    // `${TOKEN}` (8 chars) became `t0k3n` (5): the bad value still reports column 22.
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a:\n    exec: [${{TOKEN}}, {{x: 1}}]\n"
    ));
    assert!(
        message.starts_with("6:22: handlers.a.exec[1]: invalid type: map"),
        "{message}"
    );
}

#[test]
fn bad_url_scheme() {
    let message = error("sources:\n  - name: a\n    url: redis://u:hunter2@h/0\n");
    assert_eq!(
        message,
        "3:10: sources[0].url: cannot tell the database engine from URL scheme `redis:`; use \
         postgres://, postgresql://, sqlite:, mysql:// or mariadb://"
    );
    let message = error("sources:\n  - name: a\n    url: db.internal/orders\n");
    assert!(
        message.starts_with("3:10: sources[0].url: the database URL has no scheme"),
        "{message}"
    );
    let message = error("sources:\n  - name: a\n    url: 'postgres://u:hunter2@h:99999/x'\n");
    assert!(
        message
            .starts_with("3:10: sources[0].url: the database URL is not a valid URL: invalid port"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
}

#[test]
fn several_postgres_hosts_are_checked_one_by_one() {
    let config = parse_text(
        "sources:\n  - name: a\n    url: 'postgres://u:hunter2@h1:5432,h2:5433/x?target_session_attrs=read-write'\n",
    )
    .unwrap();
    assert_eq!(config.sources.len(), 1);
    let message =
        error("sources:\n  - name: a\n    url: 'postgres://u:hunter2@h1:5432,h2:99999/x'\n");
    assert!(
        message.starts_with(
            "3:10: sources[0].url: the database URL is not a valid URL (host 2 of 2): invalid port"
        ),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
}

#[test]
fn several_mysql_hosts_are_checked_one_by_one() {
    let config = parse_text(
        "sources:\n  - name: a\n    url: 'mysql://u:hunter2@g1:3306,g2:3307,g3:3308/x'\n",
    )
    .unwrap();
    assert_eq!(config.sources.len(), 1);
    let message =
        error("sources:\n  - name: a\n    url: 'mariadb://u:hunter2@g1:3306,g2:port/x'\n");
    assert!(
        message.contains("the database URL's host list: the port of host 2"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
}

#[test]
fn pooler_is_session_or_transaction() {
    let config = parse_text(&format!(
        "{ONE_SOURCE}    settings:\n      pooler: transaction\n"
    ))
    .unwrap();
    assert_eq!(
        config.sources[0].settings.pooler,
        icq::settings::Pooler::Transaction
    );
    let message = error(&format!(
        "{ONE_SOURCE}    settings:\n      pooler: statement\n"
    ));
    assert!(
        message.contains("sources[0].settings.pooler: unknown variant `statement`, expected `session` or `transaction`"),
        "{message}"
    );
}

#[test]
fn bad_table_name() {
    let message = error(&format!("{ONE_SOURCE}    table: \"Jobs; DROP\"\n"));
    assert!(
        message.starts_with("4:12: sources[0].table: invalid table name `Jobs; DROP`"),
        "{message}"
    );
}

#[test]
fn duplicate_source_names_name_both_lines() {
    let message = error(&format!(
        "{ONE_SOURCE}  - name: orders\n    url: sqlite:x.db\n"
    ));
    assert_eq!(
        message,
        "4:11: sources[1].name: source name `orders` is already used by sources[0] on line 2; \
         source names must be unique"
    );
}

#[test]
fn bad_source_names() {
    let message = error("sources:\n  - name: ''\n    url: sqlite:x.db\n");
    assert!(
        message.starts_with("2:11: sources[0].name: invalid source name \"\""),
        "{message}"
    );
}

#[test]
fn exec_as_a_string_points_to_the_argv_list() {
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a.b:\n    exec: ./bin/send --fast\n"
    ));
    assert_eq!(
        message,
        "6:11: handlers.a.b.exec: `exec` takes an argv list, never a shell string: write \
         exec: [\"./bin/send\", \"--fast\"]"
    );
    let message = error(&format!("{ONE_SOURCE}handlers:\n  a.b:\n    exec: []\n"));
    assert!(message.starts_with("6:11: handlers.a.b.exec: `exec` needs at least the program"));
}

#[test]
fn handler_kinds_exactly_one() {
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a:\n    noop: true\n    exec: [x]\n"
    ));
    assert_eq!(
        message,
        "6:11: handlers.a.noop: handler `a` sets `exec` and `noop`; give exactly one of \
         `exec`, `http` or `noop`"
    );
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a:\n    timeout_seconds: 3\n"
    ));
    assert!(
        message.starts_with("6:5: handlers.a: handler `a` needs one of"),
        "{message}"
    );
    let message = error(&format!("{ONE_SOURCE}handlers:\n  a:\n    noop: false\n"));
    assert!(
        message.starts_with("6:11: handlers.a.noop: `noop` can only be `true`"),
        "{message}"
    );
}

#[test]
fn handler_values_are_checked() {
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a:\n    http: {{url: 'ftp://h/x'}}\n"
    ));
    assert!(
        message.starts_with("6:17: handlers.a.http.url: must be an http:// or https:// URL"),
        "{message}"
    );
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a:\n    noop: true\n    timeout_seconds: 0\n"
    ));
    assert_eq!(
        message,
        "7:22: handlers.a.timeout_seconds: `timeout_seconds` must be greater than 0 (got 0): \
         write a number of seconds, e.g. 10 or 2.5"
    );
    let message = error(&format!(
        "{ONE_SOURCE}handlers:\n  a:\n    http: {{url: 'http://h', headers: {{'a b': x}}}}\n"
    ));
    assert!(message.contains("handlers.a.http.headers: \"a b\" is not a valid header name"));
}

#[test]
fn empty_file_and_no_sources() {
    for text in ["", "# nothing yet\n", "---\n"] {
        let message = error(text);
        assert!(
            message.starts_with("the file is empty; it needs a `sources:` list"),
            "{message}"
        );
    }
    let message = error("sources: []\n");
    assert!(
        message.starts_with("1:10: sources: no sources configured"),
        "{message}"
    );
    let message = error("handlers:\n  a: {noop: true}\n");
    assert!(
        message.starts_with("1:1: sources: no sources configured"),
        "{message}"
    );
}

#[test]
fn passwords_never_reach_messages() {
    // Errors in a source whose URL holds a password, including one where serde echoes it.
    for text in [
        "sources:\n  - name: a\n    url: ${ORDERS_URL}\n    settings: ${ORDERS_URL}\n",
        "sources:\n  - name: a\n    url: ${ORDERS_URL}\n    table: [${ORDERS_URL}]\n",
        "sources:\n  - name: ${ORDERS_URL}\n    url: ${ORDERS_URL}\n",
        "sources:\n  - name: a\n    url: postgresql://app:hunter2@\n",
        "sources:\n  - name: a\n    url: ${ORDERS_URL}\n    settings: {lease_seconds: 0}\n",
        "sources:\n  - name: a\n    url: ${ORDERS_URL}\n    url: ${ORDERS_URL}\n",
        "sources:\n  - name: a\n    url: \"${ORDERS_URL}\n",
    ] {
        let message = error(text);
        assert!(!message.contains("hunter2"), "{message}");
    }
    let message =
        error("sources:\n  - name: a\n    url: ${ORDERS_URL}\n    settings: ${ORDERS_URL}\n");
    assert!(
        message.contains("postgres://app:***@db:5432/orders"),
        "{message}"
    );
}

#[test]
fn select_all_or_one_by_name() {
    let config = parse_text(&format!("{ONE_SOURCE}  - name: b\n    url: sqlite:b.db\n")).unwrap();
    let names = |selected: Vec<&SourceConfig>| -> Vec<String> {
        selected.into_iter().map(|s| s.name.clone()).collect()
    };
    assert_eq!(names(config.select(None).unwrap()), ["orders", "b"]);
    assert_eq!(names(config.select(Some("b")).unwrap()), ["b"]);
    let err = config.select(Some("c")).unwrap_err();
    assert!(matches!(err, CliError::Usage(_)));
    assert_eq!(
        err.to_string(),
        "unknown source `c`; icq.yaml configures: orders, b"
    );
}

#[test]
fn queues_are_read_in_file_order_with_their_concurrency() {
    let config = parse_text(&format!(
        "{ONE_SOURCE}    settings: {{ concurrency: 3, max_snoozes: 5 }}\n    queues:\n      \
         webhooks: {{ concurrency: 2 }}\n      default: {{ concurrency: 8 }}\n      reports:\n"
    ))
    .unwrap();
    let settings = &config.sources[0].settings;
    let queues: Vec<_> = settings
        .queues
        .iter()
        .map(|q| (q.name.as_str(), q.concurrency))
        .collect();
    // `reports:` with nothing after it takes the source's concurrency.
    assert_eq!(queues, [("webhooks", 2), ("default", 8), ("reports", 3)]);
    assert_eq!(settings.max_snoozes, 5);
    assert!(
        parse_text(ONE_SOURCE).unwrap().sources[0]
            .settings
            .queues
            .is_empty()
    );
    assert_eq!(
        parse_text(ONE_SOURCE).unwrap().sources[0]
            .settings
            .max_snoozes,
        1000
    );
}

#[test]
fn bad_queues_are_clear_errors_with_line_and_key() {
    let queues = |body: &str| error(&format!("{ONE_SOURCE}    queues:\n{body}"));
    let message = queues("      webhooks: { concurrency: 0 }\n");
    assert_eq!(
        message,
        "5:32: sources[0].queues.webhooks.concurrency: `concurrency` must be a whole number \
         from 1 to 10000 (got 0)"
    );
    let message =
        queues("      webhooks: { concurrency: 2 }\n      webhooks: { concurrency: 3 }\n");
    assert!(
        message.starts_with("6:7: sources[0].queues: key `webhooks` appears twice"),
        "{message}"
    );
    let message = queues("      webhooks: { concurency: 2 }\n");
    assert!(
        message.starts_with("5:19: sources[0].queues.webhooks: unknown field `concurency`"),
        "{message}"
    );
    let message = queues("      \"a\\nb\": { concurrency: 2 }\n");
    assert!(
        message.starts_with("5:")
            && message.contains("invalid queue name")
            && message.contains("control character"),
        "{message}"
    );
    let message = queues(&format!(
        "      {}: {{ concurrency: 2 }}\n",
        "q".repeat(129)
    ));
    assert!(message.contains("129 bytes; the most is 128"), "{message}");
    let message = error(&format!("{ONE_SOURCE}    queues: {{}}\n"));
    assert!(
        message.starts_with("4:13: sources[0].queues: `queues` is empty"),
        "{message}"
    );
    let message = error(&format!("{ONE_SOURCE}    queues: [default]\n"));
    assert!(
        message.starts_with("4:13: sources[0].queues: invalid type"),
        "{message}"
    );
    // `queues` belongs to the source, not to its settings.
    let message = error(&format!(
        "{ONE_SOURCE}    settings: {{ queues: {{ a: {{}} }} }}\n"
    ));
    assert!(message.contains("unknown field `queues`"), "{message}");
    let message = error(&format!(
        "{ONE_SOURCE}    settings: {{ max_snoozes: -1 }}\n"
    ));
    assert!(
        message.contains("`max_snoozes` must be a whole number from 0 to 1000000"),
        "{message}"
    );
}

#[test]
fn queue_limits_are_read_beside_concurrency() {
    let config = parse_text(&format!(
        "{ONE_SOURCE}    queues:\n      \
         webhooks: {{ concurrency: 4, global_concurrency: 6, key_concurrency: 1, rate: 50/s }}\n      \
         reports: {{ rate: 90/min }}\n      default: {{ concurrency: 8 }}\n"
    ))
    .unwrap();
    let queues = &config.sources[0].settings.queues;
    assert_eq!(queues[0].global_concurrency, Some(6));
    assert_eq!(queues[0].key_concurrency, Some(1));
    assert_eq!(queues[0].rate.map(|r| r.to_string()), Some("50/s".into()));
    assert_eq!(queues[1].rate.map(|r| r.per_second()), Some(1.5));
    assert!(queues[0].is_limited() && queues[1].is_limited() && !queues[2].is_limited());
}

#[test]
fn bad_queue_limits_are_clear_errors_with_line_and_key() {
    let queues = |body: &str| error(&format!("{ONE_SOURCE}    queues:\n{body}"));
    let message = queues("      webhooks: { global_concurrency: 0 }\n");
    assert!(
        message.starts_with(
            "5:39: sources[0].queues.webhooks.global_concurrency: \
             `global_concurrency` must be a whole number from 1 to 1000000 (got 0)"
        ),
        "{message}"
    );
    let message = queues("      webhooks: { key_concurrency: 1.5 }\n");
    assert!(
        message.contains("`key_concurrency` must be a whole number from 1 to 1000000 (got 1.5"),
        "{message}"
    );
    let message = queues("      webhooks: { rate: 50 }\n");
    assert!(
        message.contains("webhooks.rate: `rate` needs a unit: write `50/s`, `50/min` or `50/h`"),
        "{message}"
    );
    let message = queues("      webhooks: { rate: 50 per second }\n");
    assert!(
        message.contains("`rate` must be a whole number of starts per second, minute or hour"),
        "{message}"
    );
    let message = queues("      webhooks: { rate: 0/s }\n");
    assert!(
        message.contains("`rate` must start at least 1"),
        "{message}"
    );
    let message = queues("      webhooks: { rate: 5000000/s }\n");
    assert!(
        message.contains("at most 1000000 commands per unit"),
        "{message}"
    );
    // A limit is a queue's: in the source's settings it is an unknown key.
    let message = error(&format!(
        "{ONE_SOURCE}    settings: {{ global_concurrency: 3 }}\n"
    ));
    assert!(
        message.contains("unknown field `global_concurrency`"),
        "{message}"
    );
}

#[test]
fn schedules_are_read_with_their_defaults() {
    let config = parse_text(&format!(
        "{ONE_SOURCE}    schedules:\n      \
         - name: nightly-report\n        cron: \"0 3 * * *\"\n        time_zone: Europe/Berlin\n        \
           type: reports.nightly\n        payload: {{ kind: full }}\n        queue: reports\n        \
           priority: -2\n        missed: once\n      \
         - name: ping\n        every: 10m\n        type: health.ping\n      \
         - name: tick\n        every: 30\n        type: t\n"
    ))
    .unwrap();
    let schedules = &config.sources[0].settings.schedules;
    let [nightly, ping, tick] = schedules.as_slice() else {
        panic!("{schedules:?}")
    };
    assert_eq!(nightly.name, "nightly-report");
    assert_eq!(nightly.expression(), "0 3 * * *");
    assert_eq!(nightly.time_zone.name(), "Europe/Berlin");
    assert_eq!(nightly.payload, serde_json::json!({ "kind": "full" }));
    assert_eq!((nightly.queue.as_str(), nightly.priority), ("reports", -2));
    assert_eq!(nightly.missed, icq::recurring::Missed::Once);
    assert_eq!(ping.expression(), "every 10m");
    assert_eq!(ping.time_zone.name(), "UTC");
    assert_eq!(ping.payload, serde_json::json!({}));
    assert_eq!((ping.queue.as_str(), ping.priority), ("default", 0));
    assert_eq!(ping.missed, icq::recurring::Missed::Skip);
    // A bare number is seconds.
    assert_eq!(tick.expression(), "every 30s");
}

#[test]
fn bad_schedules_are_clear_errors_with_line_and_key() {
    let schedule = |body: &str| {
        error(&format!(
            "{ONE_SOURCE}    schedules:\n      - name: s\n        type: t\n{body}"
        ))
    };
    let message = schedule("        cron: \"61 * * * *\"\n");
    assert!(
        message.starts_with("7:15: sources[0].schedules[0].cron: schedule `s`: `61 * * * *` is not a cron expression"),
        "{message}"
    );
    let message = schedule("        cron: \"0 3 * * *\"\n        time_zone: Europe/Berlinn\n");
    assert!(
        message.starts_with("8:20: sources[0].schedules[0].time_zone: schedule `s`: `Europe/Berlinn` is not an IANA time zone"),
        "{message}"
    );
    let message = schedule("        cron: \"0 3 * * *\"\n        every: 10m\n");
    assert!(
        message.starts_with("8:16: sources[0].schedules[0].every: schedule `s`: give either `cron` or `every`, not both"),
        "{message}"
    );
    let message = schedule("");
    assert!(
        message.starts_with("5:9: sources[0].schedules[0]: schedule `s`: needs `cron`"),
        "{message}"
    );
    let message = schedule("        every: 500ms\n");
    assert!(
        message.starts_with("7:16: sources[0].schedules[0].every: schedule `s`: `every` is 500ms; it must be at least 1 s"),
        "{message}"
    );
    let message = schedule("        every: often\n");
    assert!(
        message.contains("`often` is not a duration") && message.contains("every: 10m"),
        "{message}"
    );
    let message = schedule("        every: 1s\n        missed: sometimes\n");
    assert!(
        message.starts_with("8:17: sources[0].schedules[0].missed: unknown variant `sometimes`, expected `skip` or `once`"),
        "{message}"
    );
    let message = schedule("        every: 1s\n        evry: 1s\n");
    assert!(message.contains("unknown field `evry`"), "{message}");
    let message = error(&format!(
        "{ONE_SOURCE}    schedules:\n      - {{ name: a, every: 1s, type: t }}\n      - {{ name: a, every: 2s, type: t }}\n"
    ));
    assert!(
        message.starts_with(
            "6:17: sources[0].schedules[1].name: schedule name `a` is already used by schedules[0]"
        ),
        "{message}"
    );
}
