//! Test support shared by the integration test binaries: a fresh, private database per
//! test on each real server, so tests run in parallel without interfering.
//!
//! The servers are the ones `.ci/run` starts: PostgreSQL on 127.0.0.1:5432 (user postgres,
//! trust) and MariaDB on 127.0.0.1:3306 (root, no password). Override with
//! `ICQ_TEST_POSTGRES_URL` / `ICQ_TEST_MYSQL_URL` (a URL to a server's admin database).
//! A server that cannot be reached fails the test: it is never skipped.
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

impl TestDb {
    /// A fresh database on `engine` (`postgres`, `sqlite` or `mysql`); `tag` names the test.
    pub async fn new(engine: &'static str, tag: &str) -> TestDb {
        let name = unique_name(tag);
        match engine {
            "postgres" => {
                let admin = postgres_admin_url();
                let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap_or_else(|e| {
                    panic!("PostgreSQL test server at {admin} is not reachable ({e}); start it (see .ci/run)")
                });
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
                    .execute(&mut conn)
                    .await
                    .expect("create test database");
                TestDb {
                    engine,
                    url: replace_db(&admin, &name),
                    admin_url: Some(admin),
                    name,
                    _dir: None,
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
