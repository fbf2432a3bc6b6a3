//! The processor's SQLite connections kept between its statements (claims, stamps, lease
//! renewals), so they do not each pay the pool's hand-over: on every acquire the pool sets
//! `synchronous = FULL` and the processor's write sets it back to `NORMAL`, and on every
//! release the connection is pinged twice, each a hop to SQLite's worker thread and back.
//! Only SQLite keeps them: without it a no-op drain ran at two thirds of the rate, while
//! PostgreSQL and MariaDB were the same within the rounds' spread.
//!
//! Guarantees: only a connection whose last statement succeeded is kept (anything else —
//! an error, a future dropped mid-statement — goes back through sqlx's own release, which
//! tests or closes it); a connection goes back to the pool [`KEEP_FOR`] after it left it,
//! however busy (so the pool's lifetime and checks still apply); the pool's other callers
//! are not starved (see [`WarmConnections::keep`]); and connections are kept only between
//! [`WarmConnections::open`] (a processor starts) and [`WarmConnections::clear`] (it
//! stopped, or the pool is about to close, which waits for every connection): outside a
//! processor's run the pool is the application's alone.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// A connection goes back to the pool this long after it left it (its idle timeout,
/// lifetime and release test apply there) instead of being used again.
const KEEP_FOR: Duration = Duration::from_secs(10);

/// The most connections kept: the claims in flight, a stamp and a lease renewal.
const MOST: usize = 8;

/// A work connection and the instant it left the pool.
pub(crate) struct Warm<DB: Database> {
    conn: PoolConnection<DB>,
    left_pool: Instant,
    /// The driver has set the connection up for work since it left the pool (see
    /// [`Warm::set_up_for_work`]).
    set_up: bool,
}

impl<DB: Database> Warm<DB> {
    /// Within [`KEEP_FOR`] of leaving the pool.
    fn reusable(&self) -> bool {
        self.left_pool.elapsed() < KEEP_FOR
    }

    /// Whether this is the first call since the connection left the pool: a driver that
    /// changes a connection's settings for work (SQLite's `synchronous`) does it once per
    /// stay out of the pool, not before every statement; the pool sets them back.
    pub(crate) fn set_up_for_work(&mut self) -> bool {
        !std::mem::replace(&mut self.set_up, true)
    }

    /// Closes the connection when it is dropped instead of handing it back to the pool
    /// (it may be left inside a transaction).
    pub(crate) fn close_on_drop(&mut self) {
        self.conn.close_on_drop();
    }

    /// A connection from `pool`, timed from before the acquire.
    async fn acquire(pool: &Pool<DB>) -> Result<Warm<DB>, sqlx::Error> {
        let left_pool = Instant::now();
        let conn = pool.acquire().await?;
        Ok(Warm {
            conn,
            left_pool,
            set_up: false,
        })
    }
}

impl<DB: Database> std::ops::Deref for Warm<DB> {
    type Target = DB::Connection;
    fn deref(&self) -> &DB::Connection {
        &self.conn
    }
}

impl<DB: Database> std::ops::DerefMut for Warm<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.conn
    }
}

struct Stash<DB: Database> {
    kept: Vec<Warm<DB>>,
    /// Nothing is kept: no processor runs ([`WarmConnections::open`] has not been
    /// called since the last [`WarmConnections::clear`]).
    closed: bool,
    /// Nothing is ever kept (`WarmConnections::new(true)`: an application's pool).
    never: bool,
}

/// A pool's connections between statements.
pub(crate) struct WarmConnections<DB: Database> {
    stash: Mutex<Stash<DB>>,
}

impl<DB: Database> WarmConnections<DB> {
    /// Keeps connections of a pool the driver owns, while a processor runs (`never`:
    /// the pool is the application's, which may close it while the driver lives, and a
    /// kept connection would hold that close up).
    pub(crate) fn new(never: bool) -> Self {
        WarmConnections {
            stash: Mutex::new(Stash {
                kept: Vec::new(),
                closed: true,
                never,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stash<DB>> {
        self.stash
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The most recently kept connection, else one from `pool`.
    pub(crate) async fn take(&self, pool: &Pool<DB>) -> Result<Warm<DB>, sqlx::Error> {
        loop {
            let Some(warm) = self.lock().kept.pop() else {
                break;
            };
            if warm.reusable() {
                return Ok(warm);
            }
            // Dropped outside the lock: sqlx's release tests it and the pool decides.
            drop(warm);
        }
        Warm::acquire(pool).await
    }

    /// Keeps `warm` (its statement succeeded) for the next statement, unless it is due
    /// back in the pool ([`KEEP_FOR`]), the stash is cleared, or keeping it could
    /// starve the pool's other callers: at most [`MOST`] and two fewer than the pool's
    /// `max_connections` are kept, and none while the pool is at its size limit with no
    /// idle connection (someone may be waiting for one).
    pub(crate) fn keep(&self, warm: Warm<DB>, pool: &Pool<DB>) {
        let max = pool.options().get_max_connections() as usize;
        let room = MOST.min(max.saturating_sub(2));
        let pool_full = pool.size() as usize >= max && pool.num_idle() == 0;
        let fresh = warm.reusable();
        let mut handed_back = Vec::new();
        {
            let mut stash = self.lock();
            handed_back.extend(stash.kept.extract_if(.., |kept| !kept.reusable()));
            if fresh && !stash.closed && stash.kept.len() < room && !pool_full {
                stash.kept.push(warm);
            } else {
                handed_back.push(warm);
            }
        }
        // Dropped outside the lock: sqlx's release tests each and the pool decides.
        drop(handed_back);
    }

    /// Hands every kept connection back to the pool and keeps none until
    /// [`WarmConnections::open`]: the processor stopped (the connections are the
    /// application's again), or the pool is about to close (which waits for every
    /// connection, a statement still in flight included).
    pub(crate) fn clear(&self) {
        let kept = {
            let mut stash = self.lock();
            stash.closed = true;
            std::mem::take(&mut stash.kept)
        };
        drop(kept);
    }

    /// Keeps connections again (a processor starts), unless this stash never keeps any.
    pub(crate) fn open(&self) {
        let mut stash = self.lock();
        stash.closed = stash.never;
    }

    /// [`WarmConnections::open`] (`true`) or [`WarmConnections::clear`] (`false`): what
    /// a driver's `Lifecycle::keep_work_connections` does.
    pub(crate) fn set_keeping(&self, keep: bool) {
        if keep { self.open() } else { self.clear() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::sqlite::{Sqlite, SqlitePool, SqlitePoolOptions};

    async fn pool(max: u32) -> SqlitePool {
        SqlitePoolOptions::new()
            .max_connections(max)
            .connect("sqlite::memory:")
            .await
            .unwrap()
    }

    /// A number only this connection holds (a temporary table of its own).
    async fn mark(conn: &mut Warm<Sqlite>, value: i64) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE TEMP TABLE IF NOT EXISTS m(v); DELETE FROM m; INSERT INTO m VALUES ({value})"
        )))
        .execute(&mut **conn)
        .await
        .unwrap();
    }

    async fn marked(conn: &mut Warm<Sqlite>) -> Option<i64> {
        sqlx::query_scalar("SELECT v FROM temp.m")
            .fetch_optional(&mut **conn)
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn a_kept_connection_is_taken_again_only_while_open() {
        let pool = pool(4).await;
        let warm = WarmConnections::<Sqlite>::new(false);
        // Closed until a processor opens it: nothing is kept.
        let mut conn = warm.take(&pool).await.unwrap();
        mark(&mut conn, 1).await;
        warm.keep(conn, &pool);
        assert!(warm.lock().kept.is_empty());

        warm.open();
        let mut conn = warm.take(&pool).await.unwrap();
        mark(&mut conn, 2).await;
        warm.keep(conn, &pool);
        let mut again = warm.take(&pool).await.unwrap();
        assert_eq!(marked(&mut again).await, Some(2), "the same connection");
    }

    #[tokio::test]
    async fn a_statement_finishing_after_clear_does_not_hold_up_the_pool_close() {
        let pool = pool(4).await;
        let warm = WarmConnections::<Sqlite>::new(false);
        warm.open();
        let kept = warm.take(&pool).await.unwrap();
        warm.keep(kept, &pool);
        let in_flight = warm.take(&pool).await.unwrap();
        warm.clear();
        assert!(warm.lock().kept.is_empty());
        // The statement in flight when the driver closed ends now.
        warm.keep(in_flight, &pool);
        assert!(warm.lock().kept.is_empty());
        tokio::time::timeout(Duration::from_secs(10), pool.close())
            .await
            .expect("the pool closes: no connection is kept");
    }

    #[tokio::test]
    async fn the_pool_keeps_two_connections_for_its_other_callers() {
        let pool = pool(4).await;
        let warm = WarmConnections::<Sqlite>::new(false);
        warm.open();
        let taken = [
            warm.take(&pool).await.unwrap(),
            warm.take(&pool).await.unwrap(),
            warm.take(&pool).await.unwrap(),
        ];
        for conn in taken {
            warm.keep(conn, &pool);
        }
        assert_eq!(
            warm.lock().kept.len(),
            2,
            "max_connections 4 keeps at most 2"
        );
        // The pool's own callers still get connections at once.
        let one = tokio::time::timeout(Duration::from_secs(5), pool.acquire()).await;
        let two = tokio::time::timeout(Duration::from_secs(5), pool.acquire()).await;
        assert!(one.is_ok() && two.is_ok());
    }
}
