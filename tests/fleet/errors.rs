//! Errors that cannot heal: `icq work --until-idle` retries what heals
//! and fails with exit 1 and `kind: database`, the server's own message and a hint, within
//! a few seconds, on what does not — a role that may only read the table, a missing
//! column, a read-only database, a failed login — and PostgreSQL's `too many connections`
//! is reported at once instead of `pool timed out`.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::Connection;

use crate::support::TestDb;

/// `icq --format json work --until-idle` on a configuration with one source at `url`; the
/// output, the error document (`None` on success) and how long it took.
fn drain(url: &str) -> (Output, Option<Value>, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("icq.yaml");
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: main\n    url: \"{url}\"\n    settings:\n      polling_interval_seconds: 0.2\nhandlers:\n  errors.test:\n    exec: [\"true\"]\n"
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_icq"))
        .args(["--format", "json", "work", "--until-idle", "--config"])
        .arg(&config)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let document = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find_map(|doc| doc.get("error").cloned());
    (out, document, took)
}

/// Asserts `icq work --until-idle` failed with exit 1 and `kind` within `limit`, its
/// message holding every one of `needles`; returns the message.
fn assert_fails(url: &str, kind: &str, needles: &[&str], limit: Duration) -> String {
    let (out, error, took) = drain(url);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let error = error.unwrap_or_else(|| panic!("no error document ({:?}): {stderr}", out.status));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(error["kind"], kind, "{error}");
    assert_eq!(error["exit_code"], 1, "{error}");
    let message = error["message"].as_str().unwrap().to_owned();
    for needle in needles {
        assert!(message.contains(needle), "`{needle}` in {message}");
    }
    assert!(
        took < limit,
        "failed after {took:?} (at most {limit:?}): {message}"
    );
    eprintln!("failed after {} ms: {message}", took.as_millis());
    message
}

async fn insert_one(db: &TestDb) {
    let (t, ty, p) = (db.q("InternalCommands"), db.q("Type"), db.q("Payload"));
    db.execute(&format!(
        "INSERT INTO {t} ({ty}, {p}) VALUES ('errors.test', '{{}}')"
    ))
    .await;
}

fn with_user(url: &str, user: &str, password: Option<&str>) -> String {
    let mut parsed = url::Url::parse(url).unwrap();
    parsed.set_username(user).unwrap();
    parsed.set_password(password).unwrap();
    parsed.to_string()
}

fn postgres_admin_url() -> String {
    std::env::var("ICQ_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn mysql_admin_url() -> String {
    std::env::var("ICQ_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// Runs `sql` on the server as its administrator.
async fn as_admin(engine: &str, sql: &str) {
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    if engine == "postgres" {
        let mut c = sqlx::PgConnection::connect(&postgres_admin_url())
            .await
            .unwrap();
        sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
    } else {
        let mut c = sqlx::MySqlConnection::connect(&mysql_admin_url())
            .await
            .unwrap();
        sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
    }
}

/// A login of its own on the server (roles and users are server-wide): its name.
fn role_name(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "icqt_{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The database name at the end of a URL.
fn database_of(url: &str) -> String {
    url::Url::parse(url)
        .unwrap()
        .path()
        .trim_start_matches('/')
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_role_that_may_only_read_fails_the_drain() {
    let db = TestDb::with_table("postgres", "readonly_role").await;
    insert_one(&db).await;
    let role = role_name("ro");
    as_admin("postgres", &format!("CREATE ROLE \"{role}\" LOGIN")).await;
    db.execute(&format!(
        "GRANT SELECT ON \"InternalCommands\" TO \"{role}\""
    ))
    .await;
    let (out, error, took) = drain(&with_user(&db.url, &role, None));
    db.execute(&format!("DROP OWNED BY \"{role}\"")).await;
    as_admin("postgres", &format!("DROP ROLE \"{role}\"")).await;
    let error = error.unwrap_or_else(|| panic!("{out:?}"));
    assert_eq!(out.status.code(), Some(1), "{error}");
    assert_eq!(error["kind"], "database", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("permission denied for table InternalCommands"),
        "{message}"
    );
    assert!(message.contains("retrying cannot fix this"), "{message}");
    assert!(
        message.contains("GRANT SELECT, INSERT, UPDATE, DELETE"),
        "{message}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    eprintln!("postgres: failed after {} ms: {message}", took.as_millis());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_user_who_may_only_read_fails_the_drain() {
    let db = TestDb::with_table("mysql", "readonly_user").await;
    insert_one(&db).await;
    let user = role_name("ro");
    let database = database_of(&db.url);
    as_admin(
        "mysql",
        &format!(
            "CREATE USER '{user}'@'%'; CREATE USER '{user}'@'localhost'; \
             GRANT SELECT ON `{database}`.`InternalCommands` TO '{user}'@'%'; \
             GRANT SELECT ON `{database}`.`InternalCommands` TO '{user}'@'localhost'"
        ),
    )
    .await;
    let (out, error, took) = drain(&with_user(&db.url, &user, None));
    as_admin(
        "mysql",
        &format!("DROP USER '{user}'@'%'; DROP USER '{user}'@'localhost'"),
    )
    .await;
    let error = error.unwrap_or_else(|| panic!("{out:?}"));
    eprintln!("mariadb: failed after {} ms: {error}", took.as_millis());
    assert_eq!(out.status.code(), Some(1), "{error}");
    assert_eq!(error["kind"], "database", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("command denied to user"), "{message}");
    assert!(message.contains("retrying cannot fix this"), "{message}");
    assert!(message.contains("GRANT"), "{message}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    eprintln!("mariadb: failed after {} ms: {message}", took.as_millis());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_column_fails_the_drain() {
    for (engine, drop) in [
        (
            "postgres",
            "ALTER TABLE \"InternalCommands\" DROP COLUMN \"LockedUntil\"",
        ),
        (
            "mysql",
            "ALTER TABLE `InternalCommands` DROP COLUMN `LockedUntil`",
        ),
    ] {
        let db = TestDb::with_table(engine, "missing_column").await;
        insert_one(&db).await;
        db.execute(drop).await;
        let message = assert_fails(
            &db.url,
            "database",
            &["LockedUntil", "retrying cannot fix this", "icq migrate run"],
            Duration::from_secs(10),
        );
        eprintln!("{engine}: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_login_fails_at_once_with_the_servers_message() {
    let db = TestDb::with_table("postgres", "login").await;
    let nobody = role_name("nobody");
    assert_fails(
        &with_user(&db.url, &nobody, None),
        "database",
        &[&format!("role \"{nobody}\" does not exist")],
        Duration::from_secs(5),
    );
    let db = TestDb::with_table("mysql", "login").await;
    assert_fails(
        &with_user(&db.url, "root", Some("not-the-password")),
        "database",
        &["Access denied for user 'root'"],
        Duration::from_secs(5),
    );
}

/// A role whose `CONNECTION LIMIT` is 0 gets the server's own refusal (SQLSTATE 53300)
/// without exhausting the shared server: the pool would retry it until its acquire timeout
/// (10 s) and then say only `pool timed out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_too_many_connections_is_shown_at_once() {
    let db = TestDb::with_table("postgres", "too_many").await;
    let role = role_name("limit");
    as_admin(
        "postgres",
        &format!("CREATE ROLE \"{role}\" LOGIN CONNECTION LIMIT 0"),
    )
    .await;
    let (out, error, took) = drain(&with_user(&db.url, &role, None));
    as_admin("postgres", &format!("DROP ROLE \"{role}\"")).await;
    let error = error.unwrap_or_else(|| panic!("{out:?}"));
    assert_eq!(out.status.code(), Some(1), "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("too many connections for role \"{role}\"")),
        "{message}"
    );
    assert!(!message.contains("pool timed out"), "{message}");
    assert!(took < Duration::from_secs(5), "{took:?}: {message}");
    eprintln!("postgres: refused after {} ms: {message}", took.as_millis());
}

/// SQLite opened read-only (`mode=ro`): the first write (switching to WAL) fails with
/// SQLITE_READONLY, which no retry fixes, before the processor starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_read_only_database_fails_the_drain() {
    let db = TestDb::with_table("sqlite", "read_only").await;
    insert_one(&db).await;
    let url = db.url.replace("mode=rwc", "mode=ro");
    assert_fails(
        &url,
        "database",
        &["attempt to write a readonly database"],
        Duration::from_secs(10),
    );
}

/// A long-running processor with two sources: the table of one is dropped under it (a
/// missing table does not heal), the other keeps processing; `--until-idle` on the broken
/// source alone fails with `kind: database` and the server's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_table_stops_only_its_own_source() {
    use icq::{ConnectOptions, NewCommand, Processor, Queue, Registry, RunOptions, Settings};
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;

    let broken = TestDb::with_table("postgres", "dropped_table").await;
    let fine = TestDb::with_table("sqlite", "fine").await;
    let connect = |name: &'static str, url: String| async move {
        Queue::connect(name, &url, &Default::default(), &ConnectOptions::default())
            .await
            .unwrap()
    };
    let gone = connect("gone", broken.url.clone()).await;
    let alive = connect("alive", fine.url.clone()).await;
    broken.execute("DROP TABLE \"InternalCommands\"").await;
    let commands: Vec<NewCommand> = (0..20)
        .map(|i| NewCommand::new("errors.test", serde_json::json!({ "i": i })))
        .collect();
    alive.schedule_many(&commands).await.unwrap();
    let processor = |queues: &[&Queue]| {
        let mut registry = Registry::new();
        registry
            .insert("errors.test", Arc::new(icq::handler::Noop))
            .unwrap();
        let mut processor = Processor::new(registry);
        let settings = Settings::default().with_polling_interval_seconds(0.1);
        for queue in queues {
            processor.add_source(queue.source_handle(settings.clone()));
        }
        processor
    };

    let both = processor(&[&gone, &alive]);
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { both.run(RunOptions::default(), stop).await }
    });
    let started = Instant::now();
    while alive.stats().snapshot().succeeded < 20 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the other source kept processing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Well past the until-idle grace: a long-running worker does not give up.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!run.is_finished(), "the processor keeps running");
    stop.cancel();
    run.await.unwrap().expect("a clean shutdown");
    let (t, p) = (fine.all_rows(), fine.q("ProcessedAt"));
    assert_eq!(
        fine.scalar_i64(&format!("SELECT COUNT(*) FROM {t} WHERE {p} IS NOT NULL"))
            .await,
        20
    );

    let drain = processor(&[&gone]);
    let started = Instant::now();
    let options = RunOptions::default().with_until_idle(true);
    let err = drain
        .run(options, CancellationToken::new())
        .await
        .expect_err("a drain of a missing table fails");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, icq::Error::CannotHeal { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("relation \"InternalCommands\" does not exist"),
        "{message}"
    );
    assert!(message.contains("applying icq's migrations"), "{message}");
    assert_eq!(
        err.database_kind(),
        Some(icq::error::DatabaseErrorKind::UndefinedTable),
        "{err:?}"
    );
}
