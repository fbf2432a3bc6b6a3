//! SQLite health reads: the table's and its indexes' pages from the `dbstat` virtual
//! table (the whole file's `page_count × page_size` where `dbstat` is not compiled in),
//! the file's free pages (`freelist_count`), the size of the `-wal` file, and the oldest
//! due command's wait.
//!
//! SQLite keeps no record of other connections: their transactions cannot be seen, so
//! the report says so rather than listing none. A reader that never ends shows as a
//! `-wal` file that keeps growing (no checkpoint can pass it).

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Row};

use super::{NOW, SqliteDriver};
use crate::engine::Lifecycle;
use crate::engine::health::{
    HealthFacts, HealthOps, HealthReadParams, TableStats, count, from_secs,
};
use crate::error::{Error, Result};
use crate::ident::Engine;

impl SqliteDriver {
    /// The schema the table lives in (`main` unless qualified), quoted.
    fn schema_quoted(&self) -> String {
        Engine::Sqlite.quote_ident(self.table.schema().unwrap_or("main"))
    }

    async fn pragma(&self, name: &str) -> Result<i64> {
        let sql = format!("PRAGMA {}.{name}", self.schema_quoted());
        sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx(&format!("reading PRAGMA {name}"))))
    }

    /// The bytes of table `name` and of its indexes by `dbstat` in its aggregate mode (one
    /// row per b-tree rather than one per page), or `None` where the build has no
    /// `dbstat`.
    async fn dbstat(&self, name: &str) -> Result<Option<(i64, i64)>> {
        let s = self.schema_quoted();
        let schema = self.table.schema().unwrap_or("main");
        let sql = format!(
            "SELECT COALESCE(SUM(CASE WHEN d.name = ?1 THEN d.pgsize END), 0), \
                    COALESCE(SUM(CASE WHEN d.name <> ?1 THEN d.pgsize END), 0), \
                    COUNT(*) \
             FROM dbstat(?2, 1) d JOIN {s}.sqlite_master m ON m.name = d.name \
             WHERE m.tbl_name = ?1 AND m.type IN ('table', 'index')"
        );
        match sqlx::query(AssertSqlSafe(sql))
            .bind(name)
            .bind(schema)
            .fetch_one(&self.pool)
            .await
        {
            Ok(row) => {
                let what = "reading the table's pages (dbstat)";
                let pages: i64 = row.try_get(2).map_err(Error::db(self.ctx(what)))?;
                if pages == 0 {
                    return Ok(None);
                }
                Ok(Some((
                    row.try_get(0).map_err(Error::db(self.ctx(what)))?,
                    row.try_get(1).map_err(Error::db(self.ctx(what)))?,
                )))
            }
            Err(_) => Ok(None),
        }
    }

    async fn table_found(&self, name: &str) -> Result<bool> {
        let sql = format!(
            "SELECT COUNT(*) FROM {}.sqlite_master WHERE type = 'table' AND name = ?",
            self.schema_quoted()
        );
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("looking up the table")))?;
        Ok(n > 0)
    }

    /// The size of the `-wal` file, when the database is a file in WAL mode.
    async fn wal_bytes(&self) -> Result<Option<u64>> {
        let mode: String = sqlx::query_scalar(AssertSqlSafe(format!(
            "PRAGMA {}.journal_mode",
            self.schema_quoted()
        )))
        .fetch_one(&self.pool)
        .await
        .map_err(Error::db(self.ctx("reading the journal mode")))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Ok(None);
        }
        let schema = self.table.schema().unwrap_or("main");
        let rows = sqlx::query("PRAGMA database_list")
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("reading the database's file")))?;
        let file = rows.iter().find_map(|row| {
            let name: String = row.try_get(1).ok()?;
            let file: String = row.try_get(2).ok()?;
            (name == schema && !file.is_empty()).then_some(file)
        });
        let Some(file) = file else {
            return Ok(None);
        };
        let wal = format!("{file}-wal");
        Ok(match tokio::fs::metadata(&wal).await {
            Ok(meta) => Some(meta.len()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Some(0),
            Err(_) => None,
        })
    }

    /// The oldest due command's wait. On a version-2 table: the first unleased due row
    /// of each priority present, by seeks into the partial poll index (`Priority`,
    /// `RunAt`), one priority after the other; a `MIN` over the due rows reads every one
    /// of them for the lease column the index lacks (see docs/doctor.md).
    async fn oldest_due_wait(&self) -> Result<Option<std::time::Duration>> {
        let t = &self.t;
        let what = "reading the oldest due command's wait";
        let pending = r#""ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;
        let due = format!(
            r#"{pending} AND "RunAt" <= {NOW}
               AND ("LockedUntil" IS NULL OR "LockedUntil" <= {NOW})"#
        );
        let wait_of = r#"(julianday('now') - julianday("RunAt")) * 86400.0"#;
        if self.schema_version().await? < 2 {
            let sql = format!(
                r#"SELECT (julianday('now') - julianday(MIN("RunAt"))) * 86400.0 FROM {t} WHERE {due}"#
            );
            let wait: Option<f64> = sqlx::query_scalar(AssertSqlSafe(sql))
                .fetch_one(&self.pool)
                .await
                .map_err(Error::db(self.ctx(what)))?;
            return Ok(wait.map(from_secs));
        }
        let next_priority = format!(
            r#"SELECT "Priority" FROM {t} WHERE {pending} AND "Priority" > ?
               ORDER BY "Priority" LIMIT 1"#
        );
        let head = format!(
            r#"SELECT {wait_of} FROM {t} WHERE {due} AND "Priority" = ?
               ORDER BY "RunAt" LIMIT 1"#
        );
        let mut oldest: Option<f64> = None;
        let mut after = i64::MIN;
        // At most one round per priority value present: each round is two seeks.
        for _ in 0..=u16::MAX {
            let Some(priority): Option<i64> =
                sqlx::query_scalar(AssertSqlSafe(next_priority.clone()))
                    .bind(after)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(Error::db(self.ctx(what)))?
            else {
                break;
            };
            let wait: Option<Option<f64>> = sqlx::query_scalar(AssertSqlSafe(head.clone()))
                .bind(priority)
                .fetch_optional(&self.pool)
                .await
                .map_err(Error::db(self.ctx(what)))?;
            if let Some(Some(wait)) = wait {
                oldest = Some(oldest.map_or(wait, |o| o.max(wait)));
            }
            after = priority;
        }
        Ok(oldest.map(from_secs))
    }

    async fn stats_of(
        &self,
        name: &str,
        shown: String,
        file: (u64, u64),
    ) -> Result<Option<TableStats>> {
        if !self.table_found(name).await? {
            return Ok(None);
        }
        let (table_bytes, index_bytes, total_bytes) = match self.dbstat(name).await? {
            Some((table, index)) => {
                let (table, index) = (
                    count(Some(table)).unwrap_or(0),
                    count(Some(index)).unwrap_or(0),
                );
                (table, index, table + index)
            }
            None => (0, 0, file.0),
        };
        Ok(Some(TableStats {
            table: shown,
            total_bytes,
            table_bytes,
            index_bytes,
            live_rows: None,
            dead_rows: None,
            free_bytes: Some(file.1),
            last_vacuum: None,
            last_autovacuum: None,
            storage_settings: None,
        }))
    }
}

#[async_trait]
impl HealthOps for SqliteDriver {
    async fn health_read(&self, params: &HealthReadParams) -> Result<HealthFacts> {
        let page_size = count(Some(self.pragma("page_size").await?)).unwrap_or(0);
        let file_bytes = count(Some(self.pragma("page_count").await?)).unwrap_or(0) * page_size;
        let free_bytes = count(Some(self.pragma("freelist_count").await?)).unwrap_or(0) * page_size;
        let file = (file_bytes, free_bytes);
        let mut facts = HealthFacts {
            table: self
                .stats_of(self.table.name(), self.table.to_string(), file)
                .await?,
            ..HealthFacts::default()
        };
        if params.history {
            let name = format!("{}History", self.table.name());
            facts.history = self
                .stats_of(&name, format!("{}History", self.table), file)
                .await?;
        }
        // A table has at least one page: none counted means `dbstat` was not there.
        if facts.table.as_ref().is_some_and(|t| t.table_bytes == 0) {
            facts.notes.push(format!(
                "this SQLite build has no dbstat table: sizes are the whole database file's \
                 ({file_bytes} bytes, {free_bytes} of them free pages)"
            ));
        }
        facts.notes.push(
            "SQLite does not show other connections' transactions: a reader that never ends \
             shows as a -wal file that keeps growing"
                .to_owned(),
        );
        facts.wal_bytes = self.wal_bytes().await?;
        if facts.table.is_some() {
            facts.oldest_due_wait = self.oldest_due_wait().await?;
        }
        Ok(facts)
    }
}
