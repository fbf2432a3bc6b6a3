//! The plain-sqlx baseline: what a careful hand-written claim loop on a table shaped like
//! icq's does on this machine. 4 loops, each claiming 50 due rows with
//! `FOR UPDATE SKIP LOCKED`, running a no-op, and stamping the batch with one
//! `UPDATE … FROM unnest($1::uuid[])`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::db::{self, FreshDb};
use crate::{Drain, Opts};

pub const LOOPS: usize = 4;
pub const BATCH: i64 = 50;

const DDL: &str = r#"
CREATE TABLE "Jobs" (
    "Id"          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    "Type"        text        NOT NULL,
    "Payload"     jsonb       NOT NULL,
    "RunAt"       timestamptz NOT NULL DEFAULT now(),
    "LockedUntil" timestamptz NULL,
    "LockToken"   uuid        NULL,
    "ProcessedAt" timestamptz NULL,
    "Attempts"    int         NOT NULL DEFAULT 0
);
CREATE INDEX "IX_Jobs_Poll" ON "Jobs" ("RunAt") WHERE "ProcessedAt" IS NULL;
CREATE FUNCTION "Jobs_notify"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobs', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER "Jobs_notify" AFTER INSERT ON "Jobs"
    FOR EACH STATEMENT EXECUTE FUNCTION "Jobs_notify"();
"#;

const CLAIM: &str = r#"
WITH due AS (
    SELECT "Id" FROM "Jobs"
    WHERE "ProcessedAt" IS NULL AND "RunAt" <= now()
      AND ("LockedUntil" IS NULL OR "LockedUntil" < now())
    ORDER BY "RunAt"
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE "Jobs" AS j
SET "LockToken" = $1, "LockedUntil" = now() + interval '5 minutes', "Attempts" = j."Attempts" + 1
FROM due
WHERE j."Id" = due."Id"
RETURNING j."Id", j."Type", j."Payload"
"#;

const STAMP: &str = r#"
UPDATE "Jobs" AS j
SET "ProcessedAt" = now(), "LockedUntil" = NULL
FROM unnest($1::uuid[]) AS done("Id")
WHERE j."Id" = done."Id" AND j."LockToken" = $2
"#;

const LEFT: &str = r#"SELECT count(*) FROM "Jobs" WHERE "ProcessedAt" IS NULL"#;

pub async fn run(opts: &Opts) -> Result<Drain> {
    let db = FreshDb::postgres(&opts.pg_server).await?;
    let result = drain(&db, opts.jobs, opts.timeout()).await;
    db.drop_db(opts.keep_databases).await?;
    result
}

async fn drain(db: &FreshDb, jobs: usize, timeout: Duration) -> Result<Drain> {
    let pool = db.pg_pool(LOOPS as u32 + 1).await?;
    sqlx::raw_sql(DDL)
        .execute(&pool)
        .await
        .context("plain-sqlx DDL")?;
    {
        let mut conn = pool.acquire().await?;
        db::copy_rows(
            &mut conn,
            r#"COPY "Jobs" ("Type", "Payload") FROM STDIN"#,
            "bench.noop\t{}",
            jobs,
        )
        .await?;
    }
    db::settle_postgres(&pool, &[r#""Jobs""#]).await?;

    let handled = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let loops: Vec<_> = (0..LOOPS)
        .map(|_| tokio::spawn(claim_loop(pool.clone(), handled.clone())))
        .collect();
    let all = async {
        for l in loops {
            l.await??;
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(timeout, all)
        .await
        .with_context(|| format!("plain-sqlx did not drain {jobs} jobs within {timeout:?}"))??;
    let seconds = start.elapsed().as_secs_f64();

    let unfinished: i64 = sqlx::query_scalar(LEFT).fetch_one(&pool).await?;
    pool.close().await;
    Ok(Drain {
        seconds,
        unfinished: unfinished as u64,
        handled: Some(handled.load(Ordering::Relaxed)),
        claimed_twice: None,
    })
}

async fn claim_loop(pool: PgPool, handled: Arc<AtomicU64>) -> Result<()> {
    loop {
        let token = Uuid::new_v4();
        let rows = sqlx::query(CLAIM)
            .bind(token)
            .bind(BATCH)
            .fetch_all(&pool)
            .await?;
        if rows.is_empty() {
            let left: i64 = sqlx::query_scalar(LEFT).fetch_one(&pool).await?;
            if left == 0 {
                return Ok(());
            }
            // Rows remain but other loops hold them: they will be stamped shortly.
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: Uuid = row.try_get("Id")?;
            let _type: &str = row.try_get("Type")?;
            let _payload: serde_json::Value = row.try_get("Payload")?;
            // The no-op handler.
            ids.push(id);
        }
        handled.fetch_add(ids.len() as u64, Ordering::Relaxed);
        sqlx::query(STAMP)
            .bind(&ids)
            .bind(token)
            .execute(&pool)
            .await?;
    }
}
