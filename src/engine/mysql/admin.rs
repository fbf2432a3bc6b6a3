//! MySQL/MariaDB operator queries.
//!
//! MySQL cannot `DELETE … WHERE Id IN (SELECT … FROM the same table … LIMIT n)`, so a
//! purge batch reads up to `n` ids through the retention or dead-letter index and then
//! deletes exactly those rows by primary key, re-checking the condition; both statements
//! are short and autocommitted, so InnoDB never holds a range lock across the whole purge.
//! Times are `DATETIME(6)` UTC, bound as naive UTC values.

use async_trait::async_trait;
use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::{AssertSqlSafe, Row};

use super::{MySqlDriver, NOW, columns_of, decode_row, exact, exact_marks};
use crate::command::{CommandId, CommandRow};
use crate::engine::admin::{
    CANCELLED, CancelledRow, CommandCancelManyParams, CommandListParams, ListState,
};
use crate::engine::admin::{
    CommandGetManyParams, CommandRequeueDeadManyParams, CommandRequeueManyParams, DeadLetterFilter,
    DeadLetterKey, DeadLetterListParams, DeadLetterPageParams, DeadLetterSummary,
    FinishedDeleteBatchParams, FinishedFilter, FinishedKind, KeyConflict, StateCount,
    StateCountParams, UniqueKeyHolder, UniqueKeyHoldersParams,
};
use crate::engine::admin::{CommandHead, CommandHeadParams};
use crate::engine::admin::{
    count_grouping, decode_state_count, is_unique_violation, requeue_dead_around_taken_keys,
};
use crate::engine::{AdminOps, Lifecycle, marks};
use crate::error::{Error, Result};

/// Ids per `IN (…)` list.
const IDS_PER_STATEMENT: usize = 1000;

/// Pending: neither completed nor dead.
const PENDING: &str = "`ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL";
/// Dead: dead-lettered and not completed.
const DEAD: &str = "`DeadLetteredAt` IS NOT NULL AND `ProcessedAt` IS NULL";
/// `column = ?`, byte for byte (bind the value twice): the plain comparison uses an index,
/// the [`exact`] one refuses what only PAD SPACE finds equal.
fn equals(column: &str) -> String {
    format!("({column} = ? AND {} = {})", exact(column), exact_marks(1))
}

/// Dead letters of `c` at or before `?`, of type `?` when it is not NULL (bind the type
/// three times), of queue `?` when the filter names one (bind it twice).
fn dead_filter(filter: &DeadLetterFilter) -> String {
    let mut sql = format!(
        "c.`DeadLetteredAt` IS NOT NULL AND c.`ProcessedAt` IS NULL \
         AND c.`DeadLetteredAt` <= ? AND (? IS NULL OR {})",
        equals("c.`Type`")
    );
    if filter.queue.is_some() {
        sql.push_str(&format!(" AND {}", equals("c.`Queue`")));
    }
    sql
}

/// Binds a dead-letter filter's values in the order [`dead_filter`] uses them.
fn bind_dead_filter<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::MySql, O, sqlx::mysql::MySqlArguments>,
    filter: &'q DeadLetterFilter,
) -> sqlx::query::QueryAs<'q, sqlx::MySql, O, sqlx::mysql::MySqlArguments> {
    let query = query
        .bind(filter.dead_before.naive_utc())
        .bind(&filter.type_name)
        .bind(&filter.type_name)
        .bind(&filter.type_name);
    match &filter.queue {
        Some(queue) => query.bind(queue).bind(queue),
        None => query,
    }
}

/// No live lease.
fn unleased() -> String {
    format!("(`LockedUntil` IS NULL OR `LockedUntil` <= {NOW})")
}

/// The assignments that put a row back to pending now (`LastError` is kept; on a
/// version-2 table the snooze count starts again too).
fn requeue_set(version: u32) -> String {
    let snoozes = if version >= 2 { ", `Snoozes` = 0" } else { "" };
    format!(
        "`RunAt` = {NOW}, `Attempts` = 0, `DeadLetteredAt` = NULL, \
         `LockToken` = NULL, `LockedUntil` = NULL{snoozes}"
    )
}

/// The `WHERE` condition and ordering column of finished rows at or before `?` (then
/// of queue `?` and of type `?` when the filter names them, in that order: bind each
/// twice).
fn finished(filter: &FinishedFilter) -> (String, &'static str) {
    let mut queue = String::new();
    if filter.queue.is_some() {
        queue.push_str(&format!(" AND {}", equals("`Queue`")));
    }
    if filter.type_name.is_some() {
        queue.push_str(&format!(" AND {}", equals("`Type`")));
    }
    match filter.kind {
        FinishedKind::Completed => (
            format!("`ProcessedAt` IS NOT NULL AND `ProcessedAt` <= ?{queue}"),
            "`ProcessedAt`",
        ),
        FinishedKind::DeadLetters => (
            format!(
                "`DeadLetteredAt` IS NOT NULL AND `ProcessedAt` IS NULL AND `DeadLetteredAt` <= ?{queue}"
            ),
            "`DeadLetteredAt`",
        ),
    }
}

/// The condition that selects a listing's rows.
fn list_condition(state: ListState) -> String {
    let unleased = unleased();
    match state {
        ListState::Pending => PENDING.to_owned(),
        ListState::Due => {
            format!("{PENDING} AND {unleased} AND (`RunAt` <= {NOW} OR `RunAt` IS NULL)")
        }
        ListState::Scheduled => format!("{PENDING} AND {unleased} AND `RunAt` > {NOW}"),
        ListState::Running => format!("{PENDING} AND `LockedUntil` > {NOW}"),
        ListState::Dead => DEAD.to_owned(),
        ListState::Completed => "`ProcessedAt` IS NOT NULL".to_owned(),
    }
}

/// Where a claim-ordered page continues: the `Priority` and `RunAt` of its `after` row,
/// read first and bound as values, so MariaDB's range optimizer walks the poll index from
/// there (the same condition with subqueries reads every row before it). `RunAt` is bound
/// as a `DATETIME`: a `DateTime<Utc>` goes as a `TIMESTAMP`, and MariaDB compares the
/// column as one, which ends in 2038.
struct Cursor {
    priority: i16,
    run_at: NaiveDateTime,
}

/// A listing page (see the PostgreSQL driver). Placeholders are positional: type twice,
/// queue twice, before, then the keyset (the `after` id three times; in claim order the cursor's
/// values, see [`bind_keyset`]), then the limit.
fn list_sql(t: &str, params: &CommandListParams, version: u32, cursor: Option<&Cursor>) -> String {
    let key = format!("`{}`", params.state.key_column());
    let (dir, cmp) = if params.state.newest_first() {
        ("DESC", "<")
    } else {
        ("ASC", ">")
    };
    let mut conditions = vec![list_condition(params.state)];
    if params.type_name.is_some() {
        conditions.push(equals("`Type`"));
    }
    if params.queue.is_some() {
        conditions.push(equals("`Queue`"));
    }
    if params.before.is_some() {
        conditions.push(format!("{key} < ?"));
    }
    // Claim order (see `ListState::claim_order`) needs the version-2 `Priority`.
    let by_priority = params.state.claim_order() && version >= 2;
    if params.after.is_some() {
        conditions.push(match cursor {
            Some(_) if by_priority => "(`Priority` > ? OR (`Priority` = ? AND `RunAt` > ?) \
                 OR (`Priority` = ? AND `RunAt` = ? AND `Id` > ?))"
                .to_owned(),
            _ => {
                let k = format!("(SELECT {key} FROM {t} WHERE `Id` = ?)");
                format!("{key} {cmp}= {k} AND ({key} {cmp} {k} OR `Id` {cmp} ?)")
            }
        });
    }
    let priority = if by_priority {
        format!("`Priority` {dir}, ")
    } else {
        String::new()
    };
    format!(
        "SELECT {} FROM {t} WHERE {} ORDER BY {priority}{key} {dir}, `Id` {dir} LIMIT ?",
        columns_of(version),
        conditions.join(" AND ")
    )
}

/// Binds the keyset of [`list_sql`] for the `after` row `id`.
fn bind_keyset<'q>(
    mut query: sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    id: &str,
    cursor: Option<&Cursor>,
) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    match cursor {
        Some(Cursor { priority, run_at }) => query
            .bind(*priority)
            .bind(*priority)
            .bind(*run_at)
            .bind(*priority)
            .bind(*run_at)
            .bind(id.to_owned()),
        None => {
            for _ in 0..3 {
                query = query.bind(id.to_owned());
            }
            query
        }
    }
}

impl MySqlDriver {
    /// Puts back the listed rows that are still dead, in one statement.
    async fn requeue_dead(
        &self,
        set: &str,
        ids: &[crate::command::CommandId],
    ) -> std::result::Result<u64, sqlx::Error> {
        let t = &self.t;
        let sql = format!(
            "UPDATE {t} SET {set} WHERE `Id` IN ({}) AND {DEAD}",
            marks(ids.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for id in ids {
            query = query.bind(id.to_string());
        }
        Ok(query.execute(&self.pool).await?.rows_affected())
    }
}

#[async_trait]
impl AdminOps for MySqlDriver {
    fn id_problem(&self, id: &crate::command::CommandId) -> Option<String> {
        (id.as_str().chars().count() > 36).then(|| {
            "ids in a MariaDB/MySQL table are at most 36 characters, like \
             0b5e3c1e-8f0a-4c1e-9d0e-2f3a4b5c6d7e"
                .to_owned()
        })
    }

    async fn command_list(&self, params: &CommandListParams) -> Result<Vec<CommandRow>> {
        let version = self.schema_version().await?;
        let cursor = match &params.after {
            Some(after) if params.state.claim_order() && version >= 2 => {
                let t = &self.t;
                let sql = format!("SELECT `Priority`, `RunAt` FROM {t} WHERE `Id` = ?");
                let found: Option<(i16, NaiveDateTime)> = sqlx::query_as(AssertSqlSafe(sql))
                    .bind(after.to_string())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(Error::db(self.ctx("listing commands")))?;
                match found {
                    // No such row: nothing follows it.
                    None => return Ok(Vec::new()),
                    Some((priority, run_at)) => Some(Cursor { priority, run_at }),
                }
            }
            _ => None,
        };
        let rows = if params.state == ListState::Completed {
            self.all_rows().await?
        } else {
            self.t.clone()
        };
        let sql = list_sql(&rows, params, version, cursor.as_ref());
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(type_name) = &params.type_name {
            query = query.bind(type_name).bind(type_name);
        }
        if let Some(queue) = &params.queue {
            query = query.bind(queue).bind(queue);
        }
        if let Some(before) = params.before {
            query = query.bind(before.naive_utc());
        }
        if let Some(after) = &params.after {
            query = bind_keyset(query, after.as_str(), cursor.as_ref());
        }
        let rows = query
            .bind(i64::from(params.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("listing commands")))?;
        rows.iter()
            .map(|row| decode_row(row).map_err(Error::db(self.ctx("decoding a command"))))
            .collect()
    }

    async fn command_cancel_many(
        &self,
        params: &CommandCancelManyParams,
    ) -> Result<Vec<CancelledRow>> {
        let t = &self.t;
        let ctx = || self.ctx("cancelling commands");
        let unleased = if params.running {
            String::new()
        } else {
            format!("AND {}", unleased())
        };
        let mut cancelled = Vec::new();
        for chunk in params.ids.chunks(IDS_PER_STATEMENT) {
            let in_chunk = marks(chunk.len());
            // No `UPDATE … RETURNING`: lock the rows first, reading whether each is
            // running, then cancel exactly those.
            let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
            let select = format!(
                "SELECT `Id`, CAST(COALESCE(`LockedUntil` > {NOW}, 0) AS SIGNED) FROM {t} \
                 WHERE `Id` IN ({in_chunk}) AND {PENDING} {unleased} FOR UPDATE"
            );
            let mut query = sqlx::query_as::<_, (String, i64)>(AssertSqlSafe(select));
            for id in chunk {
                query = query.bind(id.to_string());
            }
            let rows = query.fetch_all(&mut *tx).await.map_err(Error::db(ctx()))?;
            if !rows.is_empty() {
                let update = format!(
                    "UPDATE {t} SET `DeadLetteredAt` = {NOW}, `LastError` = ?, \
                     `LockToken` = NULL, `LockedUntil` = NULL WHERE `Id` IN ({})",
                    marks(rows.len())
                );
                let mut query = sqlx::query(AssertSqlSafe(update)).bind(CANCELLED);
                for (id, _) in &rows {
                    query = query.bind(id);
                }
                query.execute(&mut *tx).await.map_err(Error::db(ctx()))?;
            }
            tx.commit().await.map_err(Error::db(ctx()))?;
            cancelled.extend(rows.into_iter().map(|(id, running)| CancelledRow {
                id: CommandId::stored(id),
                was_running: running != 0,
            }));
        }
        Ok(cancelled)
    }

    async fn order_key_holder(
        &self,
        params: &crate::engine::admin::OrderKeyHolderParams,
    ) -> Result<Option<CommandId>> {
        if self.schema_version().await? < 4 {
            return Ok(None);
        }
        let t = &self.t;
        let sql = format!(
            "SELECT o.`Id` FROM {t} AS c JOIN {t} AS o ON o.`OrderKey` = c.`OrderKey` \
             WHERE c.`Id` = ? AND {} = {} \
               AND o.`ProcessedAt` IS NULL AND o.`DeadLetteredAt` IS NULL \
               AND (o.`CreatedAt` < c.`CreatedAt` \
                    OR (o.`CreatedAt` = c.`CreatedAt` AND o.`Id` < c.`Id`)) \
             ORDER BY o.`CreatedAt`, o.`Id` LIMIT 1",
            exact("c.`Id`"),
            exact_marks(1)
        );
        let holder: Option<String> = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(params.id.as_str())
            .bind(params.id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(
                self.ctx("looking up the row an order key waits behind"),
            ))?;
        Ok(holder.map(CommandId::stored))
    }

    async fn unique_key_holders(
        &self,
        params: &UniqueKeyHoldersParams,
    ) -> Result<Vec<UniqueKeyHolder>> {
        if params.keys.is_empty() || self.schema_version().await? < 2 {
            return Ok(Vec::new());
        }
        let t = &self.t;
        let mut found = Vec::new();
        for chunk in params.keys.chunks(IDS_PER_STATEMENT) {
            // `PendingUniqueKey` is the key while the row is pending: its unique index.
            let sql = format!(
                "SELECT `UniqueKey`, `Id` FROM {t} WHERE `PendingUniqueKey` IN ({}) \
                 AND {} IN ({})",
                marks(chunk.len()),
                exact("`PendingUniqueKey`"),
                exact_marks(chunk.len())
            );
            let mut query = sqlx::query_as::<_, (String, String)>(AssertSqlSafe(sql));
            for key in chunk.iter().chain(chunk) {
                query = query.bind(key);
            }
            let rows = query
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(self.ctx("looking up unique keys")))?;
            found.extend(rows.into_iter().map(|(unique_key, id)| UniqueKeyHolder {
                unique_key,
                id: CommandId::stored(id),
            }));
        }
        Ok(found)
    }

    async fn clock_now(&self) -> Result<DateTime<Utc>> {
        let now: chrono::NaiveDateTime = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NOW}")))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("reading the database clock")))?;
        Ok(now.and_utc())
    }

    async fn state_count(&self, params: &StateCountParams) -> Result<Vec<StateCount>> {
        let t = &self.all_rows().await?;
        let unleased = unleased();
        let version = self.schema_version().await?;
        // Grouped by bytes: `utf8mb4_bin` would count `emails ` as `emails`.
        let (select, group) = count_grouping(params, version, |c| exact(&format!("`{c}`")));
        let filter = if params.queue.is_some() {
            format!("WHERE {}", equals("`Queue`"))
        } else {
            String::new()
        };
        let sum = |condition: &str| format!("CAST(COALESCE(SUM({condition}), 0) AS SIGNED)");
        let sql = format!(
            "SELECT {select} \
               {} AS due, {} AS scheduled, {} AS running, {} AS dead, {} AS completed \
             FROM {t} {filter} {group}",
            sum(&format!(
                "{PENDING} AND {unleased} AND (`RunAt` <= {NOW} OR `RunAt` IS NULL)"
            )),
            sum(&format!("{PENDING} AND {unleased} AND `RunAt` > {NOW}")),
            sum(&format!("{PENDING} AND COALESCE(`LockedUntil` > {NOW}, 0)")),
            sum(DEAD),
            sum("`ProcessedAt` IS NOT NULL"),
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(queue) = &params.queue {
            query = query.bind(queue).bind(queue);
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting commands by state")))?;
        rows.iter()
            .map(|row| decode_state_count(row, params))
            .collect()
    }

    async fn dead_letter_list(
        &self,
        params: &DeadLetterListParams,
    ) -> Result<Vec<DeadLetterSummary>> {
        let t = &self.t;
        let queue = if params.queue.is_some() {
            format!("AND {}", equals("`Queue`"))
        } else {
            String::new()
        };
        let sql = format!(
            "SELECT {} FROM {t} \
             WHERE {DEAD} AND (? IS NULL OR {}) {queue} \
             ORDER BY `DeadLetteredAt` DESC, `Id` \
             LIMIT ?",
            columns_of(self.schema_version().await?),
            equals("`Type`")
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(&params.type_name)
            .bind(&params.type_name)
            .bind(&params.type_name);
        if let Some(queue) = &params.queue {
            query = query.bind(queue).bind(queue);
        }
        let rows = query
            .bind(i64::from(params.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("listing dead letters")))?;
        rows.iter()
            .map(|row| decode_row(row).map(DeadLetterSummary::from))
            .collect::<std::result::Result<_, _>>()
            .map_err(Error::db(self.ctx("decoding a dead letter")))
    }

    async fn command_head(&self, params: &CommandHeadParams<'_>) -> Result<Option<CommandHead>> {
        let t = &self.all_rows().await?;
        // `LEFT` counts characters; `LENGTH` is the stored text's bytes.
        let columns = columns_of(self.schema_version().await?).replace(
            "CAST(`Payload` AS CHAR) AS `Payload`",
            "'null' AS `Payload`, LEFT(CAST(`Payload` AS CHAR), ?) AS `PayloadHead`, \
             CAST(LENGTH(`Payload`) AS SIGNED) AS `PayloadBytes`",
        );
        let sql = format!("SELECT {columns} FROM {t} WHERE `Id` = ?");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(i64::from(params.max_chars))
            .bind(params.id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(self.ctx("reading a command")))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let ctx = || self.ctx("decoding a command");
        let decoded = decode_row(&row).map_err(Error::db(ctx()))?;
        let head: Option<String> = row.try_get("PayloadHead").map_err(Error::db(ctx()))?;
        let bytes: Option<i64> = row.try_get("PayloadBytes").map_err(Error::db(ctx()))?;
        Ok(Some(CommandHead {
            row: decoded,
            payload_head: head.unwrap_or_default(),
            payload_bytes: bytes.unwrap_or(0).max(0) as u64,
        }))
    }

    async fn command_get_many(&self, params: &CommandGetManyParams<'_>) -> Result<Vec<CommandRow>> {
        let ids = params.ids;
        let t = &self.all_rows().await?;
        let mut found = Vec::with_capacity(ids.len());
        let columns = columns_of(self.schema_version().await?);
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            let sql = format!(
                "SELECT {columns} FROM {t} WHERE `Id` IN ({}) ORDER BY `CreatedAt`, `Id`",
                marks(chunk.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in chunk {
                query = query.bind(id.to_string());
            }
            let rows = query
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(self.ctx("reading commands")))?;
            for row in &rows {
                found.push(decode_row(row).map_err(Error::db(self.ctx("decoding a command")))?);
            }
        }
        Ok(found)
    }

    async fn command_requeue_many(&self, params: &CommandRequeueManyParams) -> Result<u64> {
        let t = &self.t;
        let ctx = || self.ctx("requeueing commands");
        let (set, unleased) = (requeue_set(self.schema_version().await?), unleased());
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let mut done = 0;
        for chunk in params.ids.chunks(IDS_PER_STATEMENT) {
            let sql = format!(
                "UPDATE {t} SET {set} \
                 WHERE `Id` IN ({}) AND `ProcessedAt` IS NULL AND {unleased}",
                marks(chunk.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in chunk {
                query = query.bind(id.to_string());
            }
            // The connection reports matched (not merely changed) rows: CLIENT_FOUND_ROWS.
            done += match query.execute(&mut *tx).await {
                Ok(done) => done.rows_affected(),
                // A row made pending meanwhile holds a key being put back: nothing
                // changes, as for any row that changed state.
                Err(err) if is_unique_violation(&err) => return Ok(0),
                Err(err) => return Err(Error::db(ctx())(err)),
            };
        }
        if done != params.ids.len() as u64 {
            tx.rollback().await.map_err(Error::db(ctx()))?;
            return Ok(0);
        }
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(done)
    }

    async fn dead_letter_count(&self, filter: &DeadLetterFilter) -> Result<u64> {
        let t = &self.t;
        let sql = format!(
            "SELECT COUNT(*) FROM {t} AS c WHERE {}",
            dead_filter(filter)
        );
        let (n,): (i64,) = bind_dead_filter(sqlx::query_as(AssertSqlSafe(sql)), filter)
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting dead letters")))?;
        Ok(n.max(0) as u64)
    }

    async fn dead_letter_page(&self, params: &DeadLetterPageParams) -> Result<Vec<DeadLetterKey>> {
        let t = &self.t;
        let version = self.schema_version().await?;
        let (key, free) = if version >= 2 {
            (
                "c.`UniqueKey`",
                format!(
                    " AND (c.`UniqueKey` IS NULL OR NOT EXISTS ( \
                       SELECT 1 FROM {t} p WHERE p.`PendingUniqueKey` = c.`UniqueKey` \
                       AND {} = {}))",
                    exact("p.`PendingUniqueKey`"),
                    exact("c.`UniqueKey`")
                ),
            )
        } else {
            ("CAST(NULL AS CHAR)", String::new())
        };
        let sql = format!(
            "SELECT c.`Id`, {key} FROM {t} AS c WHERE {} {free} \
             ORDER BY c.`DeadLetteredAt` LIMIT ?",
            dead_filter(&params.filter)
        );
        let rows: Vec<(String, Option<String>)> =
            bind_dead_filter(sqlx::query_as(AssertSqlSafe(sql)), &params.filter)
                .bind(i64::from(params.limit))
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(self.ctx("reading dead letters to requeue")))?;
        Ok(rows.into_iter().map(DeadLetterKey::from).collect())
    }

    async fn command_requeue_dead_many(
        &self,
        params: &CommandRequeueDeadManyParams,
    ) -> Result<u64> {
        let ctx = || self.ctx("requeueing dead letters");
        let set = requeue_set(self.schema_version().await?);
        let mut done = 0;
        for chunk in params.ids.chunks(IDS_PER_STATEMENT) {
            let requeue = |ids| self.requeue_dead(&set, ids);
            done += requeue_dead_around_taken_keys(chunk, requeue, ctx).await?;
        }
        Ok(done)
    }

    async fn dead_letter_key_conflicts(
        &self,
        params: &DeadLetterPageParams,
    ) -> Result<Vec<KeyConflict>> {
        if self.schema_version().await? < 2 {
            return Ok(Vec::new());
        }
        let t = &self.t;
        let sql = format!(
            "SELECT c.`Id`, c.`UniqueKey`, p.`Id` FROM {t} AS c \
             JOIN {t} AS p ON p.`PendingUniqueKey` = c.`UniqueKey` \
               AND {} = {} \
             WHERE {} ORDER BY c.`DeadLetteredAt`, c.`Id` LIMIT ?",
            exact("p.`PendingUniqueKey`"),
            exact("c.`UniqueKey`"),
            dead_filter(&params.filter)
        );
        let rows: Vec<(String, String, String)> =
            bind_dead_filter(sqlx::query_as(AssertSqlSafe(sql)), &params.filter)
                .bind(i64::from(params.limit))
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(
                    self.ctx("reading dead letters whose unique key is taken"),
                ))?;
        Ok(rows.into_iter().map(KeyConflict::from).collect())
    }

    async fn finished_count(&self, filter: &FinishedFilter) -> Result<u64> {
        let t = &match filter.kind {
            FinishedKind::Completed => self.all_rows().await?,
            FinishedKind::DeadLetters => self.t.clone(),
        };
        let (condition, _) = finished(filter);
        let sql = format!("SELECT COUNT(*) FROM {t} WHERE {condition}");
        let mut query = sqlx::query_scalar(AssertSqlSafe(sql)).bind(filter.before.naive_utc());
        if let Some(queue) = &filter.queue {
            query = query.bind(queue).bind(queue);
        }
        if let Some(type_name) = &filter.type_name {
            query = query.bind(type_name).bind(type_name);
        }
        let n: i64 = query
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting finished commands")))?;
        Ok(n.max(0) as u64)
    }

    async fn finished_delete_batch(&self, params: &FinishedDeleteBatchParams) -> Result<u64> {
        let from_history =
            params.filter.kind == FinishedKind::Completed && self.schema_version().await? >= 3;
        let mut done = 0;
        if from_history {
            done = self
                .finished_delete_from(&self.h, params, params.limit)
                .await?;
        }
        let left = params.limit.saturating_sub(done as u32);
        if left > 0 {
            done += self.finished_delete_from(&self.t, params, left).await?;
        }
        Ok(done)
    }
}

impl MySqlDriver {
    /// What reads that may meet completed rows select `FROM`: the table, or on version 3
    /// the table and its history as one (`UNION ALL`).
    pub(super) async fn all_rows(&self) -> Result<String> {
        let version = self.schema_version().await?;
        if version < 3 {
            return Ok(self.t.clone());
        }
        Ok(crate::engine::with_history(
            crate::ident::Engine::Mysql,
            &self.t,
            &self.h,
            version,
        ))
    }

    /// Deletes up to `limit` finished rows of `params`' filter from `t` (the table or its
    /// history), oldest first, by primary key.
    async fn finished_delete_from(
        &self,
        t: &str,
        params: &FinishedDeleteBatchParams,
        limit: u32,
    ) -> Result<u64> {
        let ctx = || self.ctx("purging finished commands");
        let (condition, order) = finished(&params.filter);
        let before = params.filter.before.naive_utc();
        let queue = &params.filter.queue;
        let type_name = &params.filter.type_name;
        let select = format!("SELECT `Id` FROM {t} WHERE {condition} ORDER BY {order} LIMIT ?");
        let mut query = sqlx::query_scalar(AssertSqlSafe(select)).bind(before);
        if let Some(queue) = queue {
            query = query.bind(queue).bind(queue);
        }
        if let Some(type_name) = type_name {
            query = query.bind(type_name).bind(type_name);
        }
        let ids: Vec<String> = query
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(ctx()))?;
        let mut done = 0;
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            let delete = format!(
                "DELETE FROM {t} WHERE `Id` IN ({}) AND {condition}",
                marks(chunk.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(delete));
            for id in chunk {
                query = query.bind(id);
            }
            query = query.bind(before);
            if let Some(queue) = queue {
                query = query.bind(queue).bind(queue);
            }
            if let Some(type_name) = type_name {
                query = query.bind(type_name).bind(type_name);
            }
            done += query
                .execute(&self.pool)
                .await
                .map_err(Error::db(ctx()))?
                .rows_affected();
        }
        Ok(done)
    }
}
