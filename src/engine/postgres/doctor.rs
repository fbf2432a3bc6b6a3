//! PostgreSQL health reads: sizes from `pg_total_relation_size` and friends, dead tuples
//! and vacuum times from `pg_stat_user_tables`, the xmin horizon's holders from
//! `pg_stat_activity` (client backends and WAL senders of this database),
//! `pg_prepared_xacts` and `pg_replication_slots`, and the oldest due command's wait by
//! a seek per priority into the poll index.
//!
//! Only backends in the queue's database (and WAL senders, whose standby's feedback
//! counts everywhere) hold back the removal of this table's dead rows, so sessions in
//! other databases are not reported. The reading backend leaves itself out.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Row};

use super::{BEGIN, PgDriver};
use crate::engine::Lifecycle;
use crate::engine::health::{
    HealthFacts, HealthOps, HealthReadParams, Session, SessionKind, TableStats, count, from_secs,
    query_head,
};
use crate::error::Result;
use crate::ident::Engine;

/// Sizes and statistics of the relation named `$1` (no row when it does not exist).
const TABLE_STATS: &str = r#"
SELECT pg_total_relation_size(c.oid)::int8 AS total,
       pg_relation_size(c.oid)::int8 AS heap,
       pg_indexes_size(c.oid)::int8 AS indexes,
       s.n_live_tup::int8 AS live, s.n_dead_tup::int8 AS dead,
       s.last_vacuum, s.last_autovacuum,
       array_to_string(c.reloptions, ', ') AS reloptions
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = to_regclass($1)"#;

/// Open transactions of this database's client backends (and WAL senders), oldest
/// snapshot first; `$1` is the long-transaction threshold in seconds. Each row is a
/// holder of the horizon (it has an xmin or an xid), a long transaction, or both.
const SESSIONS: &str = r#"
SELECT pid::int8 AS pid, state, application_name,
       host(client_addr) || ':' || client_port AS client, usename::text AS usr, datname::text AS db,
       EXTRACT(EPOCH FROM now() - xact_start)::float8 AS xact_age,
       EXTRACT(EPOCH FROM now() - state_change)::float8 AS state_age,
       greatest(age(backend_xmin), age(backend_xid))::int8 AS xmin_age,
       left(query, 1000) AS query,
       (xact_start IS NOT NULL AND now() - xact_start >= make_interval(secs => $1)) AS long
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND (backend_type = 'client backend' AND datname = current_database()
       OR backend_type = 'walsender')
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL OR xact_start IS NOT NULL)
ORDER BY greatest(age(backend_xmin), age(backend_xid)) DESC NULLS LAST, xact_start"#;

/// Prepared transactions of this database, oldest first.
const PREPARED: &str = r#"
SELECT gid, owner::text AS usr, database::text AS db,
       EXTRACT(EPOCH FROM now() - prepared)::float8 AS age,
       age(transaction)::int8 AS xmin_age
FROM pg_prepared_xacts WHERE database = current_database()
ORDER BY prepared"#;

/// Replication slots holding the xmin horizon (a physical slot with
/// `hot_standby_feedback`; a logical slot's `catalog_xmin` holds only the catalogues).
const SLOTS: &str = r#"
SELECT slot_name::text AS name, active, active_pid::int8 AS pid, age(xmin)::int8 AS xmin_age
FROM pg_replication_slots WHERE xmin IS NOT NULL
ORDER BY age(xmin) DESC"#;

/// The oldest due command's wait on a version-2 table: the first unleased due row of
/// each priority in the poll index (one seek per priority present, found by a loose
/// index scan), never a pass over the backlog.
fn due_wait_v2(t: &str) -> String {
    format!(
        r#"WITH RECURSIVE prios AS (
             (SELECT "Priority" AS p FROM {t}
              WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL AND "Priority" IS NOT NULL
              ORDER BY "Priority" LIMIT 1)
             UNION ALL
             SELECT (SELECT "Priority" FROM {t}
                     WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
                       AND "Priority" > prios.p
                     ORDER BY "Priority" LIMIT 1)
             FROM prios WHERE prios.p IS NOT NULL)
           SELECT EXTRACT(EPOCH FROM now() - min(head."RunAt"))::float8
           FROM prios CROSS JOIN LATERAL (
             SELECT "RunAt" FROM {t}
             WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
               AND "Priority" = prios.p AND "RunAt" <= now()
               AND ("LockedUntil" IS NULL OR "LockedUntil" <= now())
             ORDER BY "RunAt", "Id" LIMIT 1) head
           WHERE prios.p IS NOT NULL"#
    )
}

/// The oldest due command's wait on a version-1 table: the head of the poll index.
fn due_wait_v1(t: &str) -> String {
    format!(
        r#"SELECT EXTRACT(EPOCH FROM now() - "RunAt")::float8 FROM {t}
           WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL AND "RunAt" <= now()
             AND ("LockedUntil" IS NULL OR "LockedUntil" <= now())
           ORDER BY "RunAt", "Id" LIMIT 1"#
    )
}

fn secs_opt(v: Option<f64>) -> Option<std::time::Duration> {
    v.map(from_secs)
}

impl PgDriver {
    async fn table_stats(&self, quoted: &str, shown: String) -> Result<Option<TableStats>> {
        let query = sqlx::query(TABLE_STATS).bind(quoted);
        let row = on_pool!(self, self.pool, BEGIN, |e| query.fetch_optional(e))
            .await
            .map_err(self.db("reading the table's size and statistics"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let get = |name: &str| -> Result<Option<i64>> {
            row.try_get(name)
                .map_err(self.db("reading the table's size and statistics"))
        };
        Ok(Some(TableStats {
            table: shown,
            total_bytes: count(get("total")?).unwrap_or(0),
            table_bytes: count(get("heap")?).unwrap_or(0),
            index_bytes: count(get("indexes")?).unwrap_or(0),
            live_rows: count(get("live")?),
            dead_rows: count(get("dead")?),
            free_bytes: None,
            last_vacuum: row
                .try_get::<Option<DateTime<Utc>>, _>("last_vacuum")
                .map_err(self.db("reading the table's vacuum times"))?,
            last_autovacuum: row
                .try_get::<Option<DateTime<Utc>>, _>("last_autovacuum")
                .map_err(self.db("reading the table's vacuum times"))?,
            storage_settings: row
                .try_get::<Option<String>, _>("reloptions")
                .map_err(self.db("reading the table's storage settings"))?
                .filter(|s| !s.is_empty()),
        }))
    }

    async fn sessions(&self, params: &HealthReadParams) -> Result<Vec<(Session, bool)>> {
        let what = "reading the open transactions (pg_stat_activity)";
        let query = sqlx::query(SESSIONS).bind(params.long_after.as_secs_f64());
        let rows = on_pool!(self, self.pool, BEGIN, |e| query.fetch_all(e))
            .await
            .map_err(self.db(what))?;
        rows.iter()
            .map(|row| {
                let session = Session {
                    kind: SessionKind::Connection,
                    pid: row.try_get("pid").map_err(self.db(what))?,
                    name: None,
                    state: row.try_get("state").map_err(self.db(what))?,
                    transaction_age: secs_opt(row.try_get("xact_age").map_err(self.db(what))?),
                    state_age: secs_opt(row.try_get("state_age").map_err(self.db(what))?),
                    xmin_age_transactions: count(row.try_get("xmin_age").map_err(self.db(what))?),
                    query_head: row
                        .try_get::<Option<String>, _>("query")
                        .map_err(self.db(what))?
                        .filter(|q| !q.trim().is_empty())
                        .map(|q| query_head(&q)),
                    application_name: row
                        .try_get::<Option<String>, _>("application_name")
                        .map_err(self.db(what))?
                        .filter(|a| !a.is_empty()),
                    client: row.try_get("client").map_err(self.db(what))?,
                    user: row.try_get("usr").map_err(self.db(what))?,
                    database: row.try_get("db").map_err(self.db(what))?,
                };
                let long: Option<bool> = row.try_get("long").map_err(self.db(what))?;
                Ok((session, long.unwrap_or(false)))
            })
            .collect()
    }

    async fn prepared(&self) -> Result<Vec<Session>> {
        let what = "reading the prepared transactions (pg_prepared_xacts)";
        let query = sqlx::query(PREPARED);
        let rows = on_pool!(self, self.pool, BEGIN, |e| query.fetch_all(e))
            .await
            .map_err(self.db(what))?;
        rows.iter()
            .map(|row| {
                let age = secs_opt(row.try_get("age").map_err(self.db(what))?);
                Ok(Session {
                    kind: SessionKind::PreparedTransaction,
                    pid: None,
                    name: row.try_get("gid").map_err(self.db(what))?,
                    state: Some("prepared".to_owned()),
                    transaction_age: age,
                    state_age: age,
                    xmin_age_transactions: count(row.try_get("xmin_age").map_err(self.db(what))?),
                    query_head: None,
                    application_name: None,
                    client: None,
                    user: row.try_get("usr").map_err(self.db(what))?,
                    database: row.try_get("db").map_err(self.db(what))?,
                })
            })
            .collect()
    }

    async fn slots(&self) -> Result<Vec<Session>> {
        let what = "reading the replication slots (pg_replication_slots)";
        let query = sqlx::query(SLOTS);
        let rows = on_pool!(self, self.pool, BEGIN, |e| query.fetch_all(e))
            .await
            .map_err(self.db(what))?;
        rows.iter()
            .map(|row| {
                let active: Option<bool> = row.try_get("active").map_err(self.db(what))?;
                Ok(Session {
                    kind: SessionKind::ReplicationSlot,
                    pid: row.try_get("pid").map_err(self.db(what))?,
                    name: row.try_get("name").map_err(self.db(what))?,
                    state: Some(
                        if active.unwrap_or(false) {
                            "active"
                        } else {
                            "inactive"
                        }
                        .to_owned(),
                    ),
                    transaction_age: None,
                    state_age: None,
                    xmin_age_transactions: count(row.try_get("xmin_age").map_err(self.db(what))?),
                    query_head: None,
                    application_name: None,
                    client: None,
                    user: None,
                    database: None,
                })
            })
            .collect()
    }

    async fn oldest_due_wait(&self) -> Result<Option<std::time::Duration>> {
        let sql = if self.schema_version().await? >= 2 {
            due_wait_v2(&self.t)
        } else {
            due_wait_v1(&self.t)
        };
        let query = sqlx::query_scalar::<_, Option<f64>>(AssertSqlSafe(sql));
        let wait = on_pool!(self, self.pool, BEGIN, |e| query.fetch_optional(e))
            .await
            .map_err(self.db("reading the oldest due command's wait"))?;
        Ok(wait.flatten().map(from_secs))
    }
}

#[async_trait]
impl HealthOps for PgDriver {
    async fn health_read(&self, params: &HealthReadParams) -> Result<HealthFacts> {
        let mut facts = HealthFacts {
            table: self.table_stats(&self.t, self.table.to_string()).await?,
            ..HealthFacts::default()
        };
        if params.history {
            let quoted = self
                .table
                .derived_qualified(Engine::Postgres, "", "History");
            let shown = format!("{}History", self.table);
            facts.history = self.table_stats(&quoted, shown).await?;
        }
        let autovacuum: Option<String> = sqlx::query_scalar("SELECT current_setting('autovacuum')")
            .fetch_optional(&self.pool)
            .await
            .ok()
            .flatten();
        if autovacuum.as_deref() == Some("off") {
            facts.notes.push(
                "autovacuum is off on this server: icq vacuums its commands table itself when \
                 dead rows pile up, but nothing vacuums the history table or your other tables; \
                 turn it on (autovacuum = on)"
                    .to_owned(),
            );
        }
        let sessions = self.sessions(params).await?;
        let prepared = self.prepared().await?;
        // Slots are cluster-wide and readable by any role; a failure here (a server
        // without the view's columns) is a note, not the end of the report.
        let slots = match self.slots().await {
            Ok(slots) => slots,
            Err(err) => {
                facts
                    .notes
                    .push(format!("replication slots could not be read: {err}"));
                Vec::new()
            }
        };
        if sessions
            .iter()
            .any(|(s, _)| s.state.is_none() && s.query_head.is_none())
        {
            facts.notes.push(
                "some sessions belong to other roles and show neither state nor query: \
                 connect as a member of pg_read_all_stats to see them"
                    .to_owned(),
            );
        }
        facts.xmin_holder = sessions
            .iter()
            .map(|(s, _)| s)
            .chain(prepared.iter())
            .chain(slots.iter())
            .filter(|s| s.xmin_age_transactions.is_some())
            .max_by_key(|s| s.xmin_age_transactions)
            .cloned();
        let mut long: Vec<Session> = sessions
            .into_iter()
            .filter_map(|(s, long)| long.then_some(s))
            .chain(
                prepared
                    .into_iter()
                    .filter(|p| p.transaction_age >= Some(params.long_after)),
            )
            .collect();
        long.sort_by_key(|s| std::cmp::Reverse(s.transaction_age));
        facts.long_transactions = long;
        if facts.table.is_some() {
            facts.oldest_due_wait = self.oldest_due_wait().await?;
        }
        Ok(facts)
    }
}
