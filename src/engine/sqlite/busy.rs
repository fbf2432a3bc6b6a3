//! How icq's own SQLite connections wait for the write lock: naps that grow from 1 ms to
//! at most 5 ms, until the busy timeout's worth of naps has passed.
//!
//! SQLite has no queue for its write lock: a connection that finds it taken calls its
//! busy handler and tries again when the handler returns. The handler `busy_timeout`
//! installs sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50 and then 100 ms between tries,
//! made for locks held for a long time. A processor's statements hold the lock for a
//! millisecond or two, so a waiter that has tried three times sleeps 10 ms and more while
//! the lock is free for most of that time; with several replicas (and each one's claim,
//! stamps and lease renewals) on one file, those sleeps were the drain's idle time. This
//! handler keeps trying about as often as a statement ends, and gives up after the same
//! total wait as the timeout (counted in naps, as SQLite's own handler counts, so it needs
//! no clock and no state of its own).
//!
//! Not shorter: with naps from 50 µs the connections were never all outside a read
//! transaction at once, so the WAL could not start over once checkpointed; it grew past
//! the auto-checkpoint size and every commit then ran a checkpoint and its fsync (a
//! 50,000-command drain: 761–994 fsyncs against 138 with SQLite's handler and 269 with
//! these naps), and the drain ran 9% slower than with SQLite's handler.
//!
//! On Linux a nap also ends the moment another icq connection commits to the same file,
//! in this process or another ([`wake`]): the naps bound the wait, the commits end it, and
//! the busy timeout is then measured on the clock.
//!
//! Only connections icq opens get it; an application's pool keeps its own handler.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::wake;

use sqlx::sqlite::SqliteConnection;

/// The first nap, doubled after each try up to [`NAP_MAX`].
const NAP_FIRST: Duration = Duration::from_millis(1);
const NAP_MAX: Duration = Duration::from_millis(5);

/// The wait before try `count + 1` (SQLite counts the tries of one wait from 0).
fn nap(count: u32) -> Duration {
    NAP_FIRST
        .checked_mul(1u32 << count.min(16))
        .unwrap_or(NAP_MAX)
        .min(NAP_MAX)
}

/// The total of the naps before try `count + 1`.
fn waited(count: u32) -> Duration {
    let growing = (0..count.min(16)).map(nap).sum::<Duration>();
    let capped = count.saturating_sub(16);
    growing + NAP_MAX * capped
}

thread_local! {
    /// The wait for the lock under way on this thread, where naps end early ([`wake`]):
    /// when it started and the wake-up word's value when the last nap ended. sqlx runs
    /// each connection's statements on a thread of its own, so a thread waits for one
    /// statement at a time.
    static WAIT: Cell<(Instant, u32)> = Cell::new((Instant::now(), 0));
}

/// Naps and asks SQLite to try again (non-zero), or gives up (zero: the statement fails
/// with `SQLITE_BUSY`) once the wait reaches [`super::BUSY_TIMEOUT`]. With a wake-up word
/// (`arg`, see [`wake`]) a nap ends early when another icq connection commits to the same
/// file; such a wait is measured on the clock, since its naps are not whole (a file whose
/// word another file's commits bump would otherwise use up the timeout's count of tries
/// in a fraction of it). Never panics: it runs on SQLite's side of the FFI boundary.
extern "C" fn busy_handler(arg: *mut c_void, count: c_int) -> c_int {
    let count = u32::try_from(count).unwrap_or(0);
    if !arg.is_null() {
        // SAFETY: a non-null `arg` is the `&'static AtomicU32` `install` passed.
        let word = unsafe { &*(arg as *const AtomicU32) };
        if let Ok(keep_waiting) = WAIT.try_with(|wait| wait_on(word, wait, count)) {
            return c_int::from(keep_waiting);
        }
    }
    if waited(count) >= super::BUSY_TIMEOUT {
        return 0;
    }
    std::thread::sleep(nap(count));
    1
}

/// One nap of a wait woken by `word`: false once the wait began [`super::BUSY_TIMEOUT`]
/// ago. The value the next nap waits for a change from is read as this one ends, so a
/// commit while SQLite tries the lock again ends that nap at once.
fn wait_on(word: &AtomicU32, wait: &Cell<(Instant, u32)>, count: u32) -> bool {
    let (started, seen) = if count == 0 {
        (Instant::now(), word.load(Ordering::Acquire))
    } else {
        wait.get()
    };
    if started.elapsed() >= super::BUSY_TIMEOUT {
        return false;
    }
    wake::wait(word, seen, nap(count));
    wait.set((started, word.load(Ordering::Acquire)));
    true
}

/// Replaces `conn`'s busy handler with [`busy_handler`], waking on its file's word where
/// it has one ([`wake`]).
pub(super) async fn install(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    let autocheckpoint: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
        .fetch_one(&mut *conn)
        .await?;
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is the open connection `handle` holds locked for this call, so no
    // statement runs on it meanwhile.
    let word = if autocheckpoint == i64::from(wake::AUTOCHECKPOINT_PAGES) {
        unsafe { wake::word_for(db) }
    } else {
        None
    };
    let arg = match word {
        Some(word) => {
            // SAFETY: as above; its `wal_autocheckpoint` is the default, checked above.
            unsafe { wake::install(db, word) };
            word as *const AtomicU32 as *mut c_void
        }
        None => std::ptr::null_mut(),
    };
    // SAFETY: as above; the handler is a plain function that lives for the whole program
    // and its argument is null or a word that does too.
    let rc = unsafe { libsqlite3_sys::sqlite3_busy_handler(db, Some(busy_handler), arg) };
    if rc == libsqlite3_sys::SQLITE_OK {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!(
            "cannot set the SQLite busy handler (code {rc})"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naps_grow_to_their_cap_and_add_up() {
        assert_eq!(nap(0), Duration::from_millis(1));
        assert_eq!(nap(1), Duration::from_millis(2));
        assert_eq!(nap(2), Duration::from_millis(4));
        assert_eq!(nap(3), NAP_MAX);
        assert_eq!(nap(40), NAP_MAX);
        assert_eq!(waited(0), Duration::ZERO);
        assert_eq!(waited(2), Duration::from_millis(3));
        assert_eq!(
            waited(20),
            (0..20).map(nap).sum::<Duration>(),
            "the closed form counts every nap"
        );
        // A 30 s timeout is about 6,000 tries.
        let tries = (0..)
            .find(|n| waited(*n) >= Duration::from_secs(30))
            .unwrap();
        assert!((5_950..6_050).contains(&tries), "{tries}");
    }
}
