//! Test support shared by the integration test binaries: a fresh, private database per
//! test on each real server, so tests run in parallel without interfering.
//!
//! The servers are the ones `.ci/run` starts: PostgreSQL on 127.0.0.1:5432 (user postgres,
//! trust) and MariaDB on 127.0.0.1:3306 (root, no password). Override with
//! `ICQ_TEST_POSTGRES_URL` / `ICQ_TEST_MYSQL_URL` (a URL to a server's admin database).
//! A server that cannot be reached fails the test: it is never skipped.
//!
//! PostgreSQL databases come from a pool (`icqt_pool_<n>`, kept on the server between
//! runs): a `DROP DATABASE` forces a checkpoint (0.7–3 s with the suite running, and it
//! slows every other test's commits), while emptying a pooled database takes a few tens of
//! milliseconds. A test holds its slot by an exclusive lock on a file under the temporary
//! directory (released when the `TestDb` is dropped or the process ends, so a crashed
//! test frees its slot too); on taking a slot the database is emptied: every session
//! still connected to it is ended and every schema but the system ones is dropped, then
//! `public` is created again as PostgreSQL creates it. To a test it is a fresh database.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::Connection;

/// The engines the runtime supports, for loops in tests.
pub const RUNTIME_ENGINES: [&str; 3] = ["postgres", "sqlite", "mysql"];

/// A private database that is dropped when this value is.
pub struct TestDb {
    /// Engine name: postgres, sqlite or mysql.
    pub engine: &'static str,
    /// The URL of the private database.
    pub url: String,
    admin_url: Option<String>,
    name: String,
    _dir: Option<tempfile::TempDir>,
    /// The lock file that holds a pooled PostgreSQL database for this test.
    _slot: Option<std::fs::File>,
}

fn postgres_admin_url() -> String {
    std::env::var("ICQ_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn mysql_admin_url() -> String {
    std::env::var("ICQ_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

fn unique_name(tag: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let tag: String = tag
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(30)
        .collect();
    format!(
        "icqt_{tag}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn replace_db(url: &str, db: &str) -> String {
    let mut parsed = url::Url::parse(url).expect("test server URL parses");
    parsed.set_path(&format!("/{db}"));
    parsed.to_string()
}

/// Takes a free slot of the PostgreSQL pool: its name and the locked file that holds it.
/// The database is created the first time its slot is used and emptied every time.
async fn postgres_slot(admin: &str) -> (String, std::fs::File) {
    // One pool per server (and per user running tests): the lock files name the server.
    let server = url::Url::parse(admin).expect("test server URL parses");
    let dir = std::env::temp_dir().join(format!(
        "icq-test-postgres-pool-{}-{}",
        server
            .host_str()
            .unwrap_or("local")
            .replace(['/', ':'], "_"),
        server.port().unwrap_or(5432)
    ));
    std::fs::create_dir_all(&dir).expect("create the pool's lock directory");
    let mut n = 0u32;
    let (name, slot) = loop {
        match try_hold(&dir.join(format!("{n}.lock"))) {
            Some(file) => break (format!("icqt_pool_{n}"), file),
            None => n += 1,
        }
    };
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "PostgreSQL test server at {admin} is not reachable ({e}); start it (see .ci/run)"
            )
        });
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(&name)
        .fetch_optional(&mut conn)
        .await
        .expect("look the pooled database up");
    if exists.is_none() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .expect("create test database");
    }
    // Whatever the slot's last holder left connected (a crashed test's worker) goes.
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(&name)
    .execute(&mut conn)
    .await
    .expect("end the sessions left on the pooled database");
    let mut db = sqlx::PgConnection::connect(&replace_db(admin, &name))
        .await
        .expect("connect to the pooled database");
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT nspname::text FROM pg_namespace \
         WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'",
    )
    .fetch_all(&mut db)
    .await
    .expect("list the pooled database's schemas");
    let mut wipe: Vec<String> = schemas
        .iter()
        .map(|s| format!("DROP SCHEMA \"{}\" CASCADE", s.replace('"', "\"\"")))
        .collect();
    // `public` as a new PostgreSQL 15+ database has it.
    wipe.push("CREATE SCHEMA public AUTHORIZATION pg_database_owner".into());
    wipe.push("GRANT USAGE ON SCHEMA public TO PUBLIC".into());
    wipe.push("COMMENT ON SCHEMA public IS 'standard public schema'".into());
    sqlx::raw_sql(sqlx::AssertSqlSafe(wipe.join(";\n")))
        .execute(&mut db)
        .await
        .expect("empty the pooled database");
    (name, slot)
}

/// The lock file `path`, created if missing and locked exclusively while the returned
/// handle lives; `None` when another handle (in any process) holds it.
pub fn try_hold(path: &std::path::Path) -> Option<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    match file.try_lock() {
        Ok(()) => Some(file),
        Err(std::fs::TryLockError::WouldBlock) => None,
        Err(std::fs::TryLockError::Error(e)) => panic!("lock {}: {e}", path.display()),
    }
}

impl TestDb {
    /// A timestamp literal for `at` (`YYYY-MM-DDTHH:MM:SS`, UTC) in the engine's column type.
    pub fn ts(&self, at: &str) -> String {
        match self.engine {
            "postgres" => format!("'{at}Z'::timestamptz"),
            "mysql" => format!("'{}'", at.replace('T', " ")),
            _ => format!("'{at}.000Z'"),
        }
    }

    /// The engine's "now" in the column type.
    pub fn now_sql(&self) -> &'static str {
        match self.engine {
            "postgres" => "now()",
            "mysql" => "UTC_TIMESTAMP(6)",
            _ => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        }
    }

    /// Inserts one row into the default table with plain SQL, as another program would;
    /// `columns` are extra (column, SQL literal) pairs.
    pub async fn insert_row(&self, id: &str, ty: &str, payload: &str, columns: &[(&str, String)]) {
        let mut names = vec![self.q("Id"), self.q("Type"), self.q("Payload")];
        let mut values = vec![format!("'{id}'"), format!("'{ty}'"), format!("'{payload}'")];
        for (column, value) in columns {
            names.push(self.q(column));
            values.push(value.clone());
        }
        self.execute(&format!(
            "INSERT INTO {} ({}) VALUES ({})",
            self.q("InternalCommands"),
            names.join(", "),
            values.join(", ")
        ))
        .await;
    }

    /// A fresh database on `engine` (`postgres`, `sqlite` or `mysql`); `tag` names the test.
    pub async fn new(engine: &'static str, tag: &str) -> TestDb {
        let name = unique_name(tag);
        match engine {
            "postgres" => {
                let admin = postgres_admin_url();
                let (name, slot) = postgres_slot(&admin).await;
                TestDb {
                    engine,
                    url: replace_db(&admin, &name),
                    // No drop: the database goes back to the pool with the slot's lock.
                    admin_url: None,
                    name,
                    _dir: None,
                    _slot: Some(slot),
                }
            }
            "mysql" => {
                let admin = mysql_admin_url();
                let mut conn = sqlx::MySqlConnection::connect(&admin).await.unwrap_or_else(|e| {
                    panic!("MariaDB/MySQL test server at {admin} is not reachable ({e}); start it (see .ci/run)")
                });
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
                    .execute(&mut conn)
                    .await
                    .expect("create test database");
                TestDb {
                    engine,
                    url: replace_db(&admin, &name),
                    admin_url: Some(admin),
                    name,
                    _dir: None,
                    _slot: None,
                }
            }
            "sqlite" => {
                let dir = tempfile::tempdir().expect("temp dir");
                let path = dir.path().join(format!("{name}.db"));
                let url = format!("sqlite://{}?mode=rwc", path.display());
                TestDb {
                    engine,
                    url,
                    admin_url: None,
                    name,
                    _dir: Some(dir),
                    _slot: None,
                }
            }
            other => panic!("unknown test engine {other}"),
        }
    }

    /// A fresh database on `engine` with the default commands table already created.
    pub async fn with_table(engine: &'static str, tag: &str) -> TestDb {
        let db = TestDb::new(engine, tag).await;
        let kind: icq::Engine = engine.parse().expect("a runtime engine name");
        db.execute(&icq::schema::render(kind, &icq::TableName::default()).up)
            .await;
        db
    }

    /// Runs a batch of SQL statements (no parameters) against the private database.
    pub async fn execute(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self.engine {
            "postgres" => {
                let mut c = sqlx::PgConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::raw_sql(sql).execute(&mut c).await.expect("execute");
            }
            "mysql" => {
                let mut c = sqlx::MySqlConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::raw_sql(sql).execute(&mut c).await.expect("execute");
            }
            _ => {
                let mut c = sqlx::SqliteConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::raw_sql(sql).execute(&mut c).await.expect("execute");
            }
        }
    }

    /// Runs a query returning one integer (e.g. a `COUNT(*)`).
    pub async fn scalar_i64(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self.engine {
            "postgres" => {
                let mut c = sqlx::PgConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::query_scalar::<_, i64>(sql)
                    .fetch_one(&mut c)
                    .await
                    .expect("query")
            }
            "mysql" => {
                let mut c = sqlx::MySqlConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::query_scalar::<_, i64>(sql)
                    .fetch_one(&mut c)
                    .await
                    .expect("query")
            }
            _ => {
                let mut c = sqlx::SqliteConnection::connect(&self.url)
                    .await
                    .expect("connect");
                sqlx::query_scalar::<_, i64>(sql)
                    .fetch_one(&mut c)
                    .await
                    .expect("query")
            }
        }
    }

    /// The default table and its history (schema version 3) as one, to select `FROM`:
    /// completed commands live in the history table.
    pub fn all_rows(&self) -> String {
        let columns = [
            "Id",
            "Type",
            "Payload",
            "CreatedAt",
            "RunAt",
            "Attempts",
            "LockToken",
            "LockedUntil",
            "ProcessedAt",
            "DeadLetteredAt",
            "LastError",
            "UserId",
            "Roles",
            "TenantId",
            "CorrelationId",
            "Queue",
            "Priority",
            "UniqueKey",
            "TraceParent",
            "Snoozes",
        ]
        .map(|c| self.q(c))
        .join(", ");
        format!(
            "(SELECT {columns} FROM {} UNION ALL SELECT {columns} FROM {}) AS icq_all",
            self.q("InternalCommands"),
            self.q("InternalCommandsHistory")
        )
    }

    /// [`TestDb::all_rows`] where the history table exists, else the default table alone
    /// (a table of schema version 1 or 2).
    #[allow(
        dead_code,
        reason = "not every test binary reads tables of older versions"
    )]
    pub async fn rows_of_any_version(&self) -> String {
        let sql = match self.engine {
            "postgres" => {
                "SELECT COUNT(*) FROM pg_tables WHERE tablename = 'InternalCommandsHistory'"
            }
            "mysql" => {
                "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() \
                 AND TABLE_NAME = 'InternalCommandsHistory'"
            }
            _ => "SELECT COUNT(*) FROM sqlite_master WHERE name = 'InternalCommandsHistory'",
        };
        if self.scalar_i64(sql).await > 0 {
            self.all_rows()
        } else {
            self.q("InternalCommands")
        }
    }

    /// Quotes an identifier for this engine (test SQL only).
    pub fn q(&self, ident: &str) -> String {
        if self.engine == "mysql" {
            format!("`{ident}`")
        } else {
            format!("\"{ident}\"")
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(admin) = self.admin_url.clone() else {
            return;
        };
        let (engine, name) = (self.engine, self.name.clone());
        // Best effort, on a thread of its own: Drop cannot be async.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if engine == "postgres" {
                    if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                            "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                        )))
                        .execute(&mut c)
                        .await;
                    }
                } else if let Ok(mut c) = sqlx::MySqlConnection::connect(&admin).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS `{name}`"
                    )))
                    .execute(&mut c)
                    .await;
                }
            });
        })
        .join();
    }
}
