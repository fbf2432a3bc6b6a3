//! The generated DDL on real servers: it applies, a two-column INSERT is enough, the poll
//! index serves the claim, the PostgreSQL trigger notifies, and the SQL per engine is pinned
//! by snapshots.

use std::time::Duration;

use icq::ident::{Engine, TableName};
use icq::schema;
use sqlx::Connection;

use crate::support::TestDb;

/// Applies the default table's DDL on `engine` and checks what a foreign writer relies on.
async fn ddl_applies_and_two_column_insert_fills_defaults(engine: &'static str) {
    let db = TestDb::new(engine, "ddl_applies").await;
    let ddl = schema::render(engine.parse().unwrap(), &TableName::default());
    db.execute(&ddl.up).await;

    let (t, q) = (db.q("InternalCommands"), |c: &str| db.q(c));
    db.execute(&format!(
        "INSERT INTO {t} ({}, {}) VALUES ('orders.send_receipt', '{{\"order\": 42}}')",
        q("Type"),
        q("Payload")
    ))
    .await;
    let filled = db
        .scalar_i64(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {id} IS NOT NULL AND {created} IS NOT NULL \
             AND {run_at} IS NOT NULL AND {attempts} = 0 AND {processed} IS NULL \
             AND {dead} IS NULL AND {token} IS NULL",
            id = q("Id"),
            created = q("CreatedAt"),
            run_at = q("RunAt"),
            attempts = q("Attempts"),
            processed = q("ProcessedAt"),
            dead = q("DeadLetteredAt"),
            token = q("LockToken"),
        ))
        .await;
    assert_eq!(
        filled, 1,
        "{engine}: defaults did not fill Id/CreatedAt/RunAt/Attempts"
    );

    // Ids are generated, distinct, and UUID-shaped on every engine.
    db.execute(&format!(
        "INSERT INTO {t} ({}, {}) VALUES ('t', '{{}}')",
        q("Type"),
        q("Payload")
    ))
    .await;
    let distinct = db
        .scalar_i64(&format!(
            "SELECT COUNT(DISTINCT {id}) FROM {t} WHERE LENGTH(CAST({id} AS CHAR(36))) = 36",
            id = q("Id")
        ))
        .await;
    assert_eq!(distinct, 2, "{engine}: ids are not distinct UUIDs");

    // The indexes exist under their contract names: seven, six on SQLite (one poll index,
    // which a worker serving some queues filters by `Queue`), five on MariaDB (the poll
    // index serves the retention sweep and the dead-letter view).
    let indexes = match engine {
        "postgres" => {
            "SELECT COUNT(*) FROM pg_indexes WHERE tablename = 'InternalCommands' \
             AND indexname LIKE 'IX_InternalCommands_%'"
        }
        "sqlite" => {
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' \
             AND tbl_name = 'InternalCommands' AND name LIKE 'IX_InternalCommands_%'"
        }
        _ => {
            "SELECT COUNT(DISTINCT INDEX_NAME) FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'InternalCommands' \
               AND INDEX_NAME LIKE 'IX\\_InternalCommands\\_%'"
        }
    };
    let expected = match engine {
        "postgres" => 7,
        "sqlite" => 6,
        _ => 5,
    };
    assert_eq!(db.scalar_i64(indexes).await, expected, "{engine}: indexes");

    // The down script removes it all again.
    db.execute(&ddl.down).await;
    let tables = match engine {
        "postgres" => "SELECT COUNT(*) FROM pg_tables WHERE tablename = 'InternalCommands'",
        "sqlite" => "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE '%InternalCommands%'",
        _ => {
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'InternalCommands'"
        }
    };
    assert_eq!(
        db.scalar_i64(tables).await,
        0,
        "{engine}: down left the table"
    );
}

#[tokio::test]
async fn ddl_applies_and_insert_fills_defaults_postgres() {
    ddl_applies_and_two_column_insert_fills_defaults("postgres").await;
}

#[tokio::test]
async fn ddl_applies_and_insert_fills_defaults_sqlite() {
    ddl_applies_and_two_column_insert_fills_defaults("sqlite").await;
}

#[tokio::test]
async fn ddl_applies_and_insert_fills_defaults_mysql() {
    ddl_applies_and_two_column_insert_fills_defaults("mysql").await;
}

/// A plain-SQL insert's default id on SQLite is a UUID v7 of the database's clock: ids of a
/// later statement sort after an earlier one's (so the primary key's index and history's
/// grow at their end instead of at random pages).
#[tokio::test]
async fn sqlite_default_ids_are_uuid_v7_in_time_order() {
    let db = TestDb::new("sqlite", "sqlite_v7_ids").await;
    db.execute(&schema::render(Engine::Sqlite, &TableName::default()).up)
        .await;
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    let mut batches = Vec::new();
    for _ in 0..3 {
        let ids: Vec<String> = sqlx::query_scalar(
            r#"INSERT INTO "InternalCommands" ("Type", "Payload")
               VALUES ('t', '{}'), ('t', '{}'), ('t', '{}') RETURNING "Id""#,
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        batches.push(ids);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    for id in batches.iter().flatten() {
        let uuid = uuid::Uuid::parse_str(id).unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(uuid.get_version_num(), 7, "{id}");
        assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122, "{id}");
        assert_eq!(id, &id.to_lowercase());
        let ms = u128::from_str_radix(&id.replace('-', "")[..12], 16).unwrap();
        assert!(
            ms <= now_ms && now_ms - ms < 60_000,
            "{id}: {ms} ms against {now_ms}"
        );
    }
    for pair in batches.windows(2) {
        let (earlier, later) = (pair[0].iter().max(), pair[1].iter().min());
        assert!(earlier < later, "{:?} then {:?}", pair[0], pair[1]);
    }
}

#[tokio::test]
async fn sqlite_rejects_a_payload_that_is_not_json() {
    let db = TestDb::new("sqlite", "sqlite_json_check").await;
    db.execute(&schema::render(Engine::Sqlite, &TableName::default()).up)
        .await;
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    let err =
        sqlx::raw_sql(r#"INSERT INTO "InternalCommands" ("Type", "Payload") VALUES ('t', 'nope')"#)
            .execute(&mut conn)
            .await
            .unwrap_err();
    assert!(err.to_string().contains("CHECK"), "{err}");
}

// The claim statements' plans (poll index, RunAt order, rows by key, never a sequential
// scan) are tested on the driver's own SQL: `engine::postgres::tests` in the library.

#[tokio::test]
async fn postgres_insert_notifies_at_commit() {
    let db = TestDb::new("postgres", "notify").await;
    let table = TableName::default();
    db.execute(&schema::render(Engine::Postgres, &table).up)
        .await;

    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    listener
        .listen(&schema::notify_channel(&table))
        .await
        .unwrap();

    let mut writer = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut tx = writer.begin().await.unwrap();
    sqlx::raw_sql(
        r#"INSERT INTO "InternalCommands" ("Type", "Payload") VALUES ('a', '{}'), ('b', '{}')"#,
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let early = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(early.is_err(), "notified before commit: {early:?}");
    tx.commit().await.unwrap();

    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("no NOTIFY within 5s of the commit")
        .unwrap();
    assert_eq!(note.channel(), "icq_InternalCommands");
    // One statement, one notification (statement-level trigger).
    let again = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(
        again.is_err(),
        "a second notification for one statement: {again:?}"
    );
}

#[tokio::test]
async fn postgres_schema_qualified_table() {
    let db = TestDb::new("postgres", "qualified").await;
    let table = TableName::parse("jobs.Queue").unwrap();
    let ddl = schema::render(Engine::Postgres, &table);
    db.execute("CREATE SCHEMA jobs").await;
    db.execute(&ddl.up).await;

    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    listener
        .listen(&schema::notify_channel(&table))
        .await
        .unwrap();
    db.execute(r#"INSERT INTO "jobs"."Queue" ("Type", "Payload") VALUES ('t', '{}')"#)
        .await;
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("no NOTIFY for the qualified table")
        .unwrap();
    assert_eq!(note.channel(), "icq_Queue");

    let in_schema = |sql: &'static str| db.scalar_i64(sql);
    assert_eq!(
        in_schema("SELECT COUNT(*) FROM pg_indexes WHERE schemaname = 'jobs' AND indexname IN ('IX_Queue_Poll', 'IX_Queue_Retention', 'IX_Queue_DeadLetters')").await,
        3
    );
    assert_eq!(
        in_schema("SELECT COUNT(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'jobs' AND p.proname = 'icq_notify_Queue'").await,
        1
    );
    assert_eq!(
        in_schema(r#"SELECT COUNT(*) FROM "jobs"."Queue" WHERE "Attempts" = 0"#).await,
        1
    );
    assert_eq!(
        in_schema("SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'").await,
        0,
        "nothing may land in public"
    );

    db.execute(&ddl.down).await;
    assert_eq!(
        in_schema("SELECT COUNT(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'jobs'").await,
        0
    );
    assert_eq!(
        in_schema("SELECT COUNT(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'jobs'").await,
        0
    );
}

/// The SQL `icq migrate add -r --stdout` prints for `engine` in an empty directory.
fn generated_sql(engine: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let output = assert_cmd::Command::cargo_bin("icq")
        .unwrap()
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .args([
            "migrate",
            "add",
            "--engine",
            engine,
            "-r",
            "--sequential",
            "--stdout",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    String::from_utf8(output).unwrap()
}

#[test]
fn generated_sql_postgres() {
    insta::assert_snapshot!("postgres", generated_sql("postgres"));
}

#[test]
fn generated_sql_sqlite() {
    insta::assert_snapshot!("sqlite", generated_sql("sqlite"));
}

#[test]
fn generated_sql_mysql() {
    insta::assert_snapshot!("mysql", generated_sql("mysql"));
}

#[test]
fn generated_sql_sqlserver() {
    let sql = generated_sql("sqlserver");
    let code = sql.lines().filter(|l| !l.trim_start().starts_with("--"));
    assert!(
        code.into_iter()
            .all(|l| !l.contains('"') && !l.contains('`')),
        "T-SQL must use [brackets]"
    );
    insta::assert_snapshot!("sqlserver", sql);
}

/// The upgrade on a schema-qualified PostgreSQL table: the indexes it drops and creates
/// are the ones in that schema, and the down file finds them there too.
#[tokio::test]
async fn postgres_upgrade_of_a_schema_qualified_table() {
    let db = TestDb::new("postgres", "qualified_upgrade").await;
    let table = TableName::parse("jobs.Queue").unwrap();
    db.execute("CREATE SCHEMA jobs").await;
    db.execute(&schema::render_v1(Engine::Postgres, &table).up)
        .await;
    db.execute(r#"INSERT INTO "jobs"."Queue" ("Type", "Payload") VALUES ('t', '{}')"#)
        .await;
    let upgrade = schema::render_upgrade(Engine::Postgres, &table);
    db.execute(&upgrade.up).await;
    let indexes =
        "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = 'jobs' AND indexname LIKE 'IX_Queue_%'";
    assert_eq!(db.scalar_i64(indexes).await, 5);
    assert_eq!(
        db.scalar_i64(r#"SELECT COUNT(*) FROM "jobs"."Queue" WHERE "Queue" = 'default'"#)
            .await,
        1
    );
    db.execute(&upgrade.down).await;
    assert_eq!(db.scalar_i64(indexes).await, 3);
    assert_eq!(
        db.scalar_i64(
            "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = 'jobs' \
             AND indexname = 'IX_Queue_Poll' AND indexdef LIKE '%(\"RunAt\", \"Id\")%'"
        )
        .await,
        1,
        "the version-1 poll index is back"
    );
    assert_eq!(
        db.scalar_i64(r#"SELECT COUNT(*) FROM "jobs"."Queue""#)
            .await,
        1
    );
}

/// The upgrade `icq migrate add -r --stdout` prints for `engine` next to an older icq's
/// version-1 migration.
fn generated_upgrade_sql(engine: Engine) -> String {
    let dir = tempfile::tempdir().unwrap();
    let migrations = dir.path().join(icq::migrate::default_dir(engine));
    std::fs::create_dir_all(&migrations).unwrap();
    let table = TableName::default();
    let header = format!(
        "{} engine={engine} table={table}\n",
        icq::migrate::HEADER_PREFIX
    );
    std::fs::write(
        migrations.join("0001_add_internal_commands.sql"),
        format!("{header}{}", schema::render_v1(engine, &table).up),
    )
    .unwrap();
    let output = assert_cmd::Command::cargo_bin("icq")
        .unwrap()
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .args([
            "migrate",
            "add",
            "--engine",
            engine.name(),
            "-r",
            "--stdout",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    String::from_utf8(output).unwrap()
}

#[test]
fn generated_upgrade_sql_per_engine() {
    for engine in Engine::ALL {
        let sql = generated_upgrade_sql(engine);
        assert!(
            sql.starts_with("-- ==> 0002_icq_schema_v4.up.sql\n"),
            "{engine}: {sql}"
        );
        insta::assert_snapshot!(format!("upgrade_{}", engine.name()), sql);
    }
}

/// SQL Server's upgrade is T-SQL for sqlcmd (no server in the tests: its text is pinned by
/// the snapshot): [brackets] only, named defaults the down file can drop, the columns
/// added in a batch before the indexes that name them.
#[test]
fn generated_upgrade_sql_sqlserver_is_t_sql() {
    let sql = generated_upgrade_sql(Engine::SqlServer);
    let code = sql.lines().filter(|l| !l.trim_start().starts_with("--"));
    assert!(
        code.into_iter()
            .all(|l| !l.contains('"') && !l.contains('`')),
        "T-SQL must use [brackets]"
    );
    let add = sql.find("ALTER TABLE [InternalCommands] ADD").unwrap();
    let go = add + sql[add..].find("\nGO\n").unwrap();
    let index = sql
        .find("CREATE INDEX [IX_InternalCommands_QueuePoll]")
        .unwrap();
    assert!(
        go < index,
        "the indexes are compiled after the columns exist"
    );
    assert!(sql.contains("CONSTRAINT [DF_InternalCommands_Queue] DEFAULT N'default'"));
    assert!(sql.contains("DROP CONSTRAINT IF EXISTS [DF_InternalCommands_Queue]"));
}
