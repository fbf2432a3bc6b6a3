//! Work connections kept between statements, so the claim loop's statements do not each
//! pay sqlx's test on release.
//!
//! sqlx tests every pooled connection as it comes back (a round trip to the server:
//! PostgreSQL's `Sync`, MariaDB's `COM_PING`) before another caller may take it; a claim
//! sent while the last one's connection is still being tested opens a connection of its
//! own. A no-op drain of 50,000 commands on PostgreSQL therefore made a thousand extra
//! round trips and kept eight server connections per replica, each with its own login,
//! `SET`, prepared statements and plans.
//!
//! Guarantees: only a connection whose last statement succeeded is kept (anything else —
//! an error, a future dropped mid-statement — goes back through sqlx's own release, which
//! tests or closes it); a kept connection is used again only within [`KEEP_FOR`] and only
//! while the caller's check passes (PostgreSQL: no failover switch since it was kept);
//! the pool's other callers are never starved of a connection (see
//! [`WarmConnections::keep`]), and [`WarmConnections::clear`] hands them all back (before
//! the pool is closed, which waits for every connection).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// A kept connection older than this goes back to the pool (its idle timeout and lifetime
/// apply there) instead of being used again.
const KEEP_FOR: Duration = Duration::from_secs(10);

/// The most connections kept: the claims in flight, a stamp and a lease renewal.
const MOST: usize = 8;

struct Kept<DB: Database> {
    conn: PoolConnection<DB>,
    at: Instant,
}

/// A pool's connections between statements.
pub(crate) struct WarmConnections<DB: Database> {
    kept: Mutex<Vec<Kept<DB>>>,
}

impl<DB: Database> Default for WarmConnections<DB> {
    fn default() -> Self {
        WarmConnections {
            kept: Mutex::new(Vec::new()),
        }
    }
}

impl<DB: Database> WarmConnections<DB> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Kept<DB>>> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The most recently kept connection, else one from `pool`; `usable` says whether a
    /// connection kept at that instant may still be used.
    pub(crate) async fn take(
        &self,
        pool: &Pool<DB>,
        usable: impl Fn(Instant) -> bool,
    ) -> Result<PoolConnection<DB>, sqlx::Error> {
        loop {
            let Some(kept) = self.lock().pop() else {
                break;
            };
            if kept.at.elapsed() < KEEP_FOR && usable(kept.at) {
                return Ok(kept.conn);
            }
            // Dropped outside the lock: sqlx's release tests it and the pool decides.
            drop(kept);
        }
        pool.acquire().await
    }

    /// Keeps `conn` (its statement succeeded) for the next statement, unless that could
    /// starve the pool's other callers: at most [`MOST`] and two fewer than the pool's
    /// `max_connections` are kept (so a caller of the pool itself can always open one),
    /// and none while the pool is at its size limit with no idle connection (someone may
    /// be waiting for one). Connections kept too long go back to the pool.
    pub(crate) fn keep(&self, conn: PoolConnection<DB>, pool: &Pool<DB>) {
        let now = Instant::now();
        let max = pool.options().get_max_connections() as usize;
        let room = MOST.min(max.saturating_sub(2));
        let pool_full = pool.size() as usize >= max && pool.num_idle() == 0;
        let mut handed_back = Vec::new();
        {
            let mut kept = self.lock();
            let mut i = 0;
            while i < kept.len() {
                if now.duration_since(kept[i].at) < KEEP_FOR {
                    i += 1;
                } else {
                    handed_back.push(kept.swap_remove(i));
                }
            }
            let conn = Kept { conn, at: now };
            if kept.len() < room && !pool_full {
                kept.push(conn);
            } else {
                handed_back.push(conn);
            }
        }
        // Dropped outside the lock: sqlx's release tests each and the pool decides.
        drop(handed_back);
    }

    /// Hands every kept connection back to the pool.
    pub(crate) fn clear(&self) {
        let kept = std::mem::take(&mut *self.lock());
        drop(kept);
    }
}
