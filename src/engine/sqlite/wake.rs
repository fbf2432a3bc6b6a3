//! Wake-ups across processes for SQLite's write lock (Linux): a commit on one of icq's own
//! connections wakes the icq connections of every process waiting to write the same file,
//! instead of leaving them in their busy handler's naps ([`super::busy`]) while the lock
//! is free.
//!
//! SQLite has no queue for its write lock. With several replicas on one file, each commit
//! was followed by the rest of a nap (up to 5 ms) before a waiting replica tried again,
//! while the lock sat free: four replicas kept the two cores of the test machine about 60%
//! busy and drained slower than one. Here every database file has a word in a page of
//! shared memory; the busy handler waits on its file's word (a futex) for at most the nap
//! it would have slept, and the WAL hook — which SQLite calls after a commit has released
//! the write lock — bumps the word and wakes whoever waits on it. 50,000 no-op commands,
//! four replicas: 1.21–1.35 s against 1.32–1.52 s with naps alone (side by side); one
//! replica, which never waits on another process, is unchanged.
//!
//! The page is `/dev/shm/icq-sqlite-wake-<uid>`: one per user, made on first use (mode
//! 0600, set again if found looser; allocated before it is mapped; never a link, never
//! another user's), 4,096 words; a file's word is picked by its device and inode, so every
//! path to one file shares it, and two files that share a word only wake each other early
//! (a waiter that finds the lock still taken waits again; the busy timeout is measured
//! on the clock, so early wake-ups do not shorten it). Shrinking the file kills the
//! processes that map it (SIGBUS): only its owner can, and icq never does.
//!
//! What it does not reach, each left to the naps: another program's connections (its
//! commits wake no one, its waiters nap as SQLite makes them); icq processes of another
//! user or with another `/dev/shm` (another container, a systemd unit with
//! `PrivateDevices=` or `PrivateIPC=`, a page logind removed while a process kept the old
//! one); a process whose first try to map the page failed (it does not try again); and a
//! lock released without a WAL commit (a rollback, a transaction that wrote nothing) or
//! by a commit SQLite finishes while resetting a statement (its hook runs with a later
//! statement).
//!
//! The WAL hook is also how SQLite checkpoints on its own (`wal_autocheckpoint`): installing
//! one replaces that, so this hook checkpoints exactly as SQLite's does, when the WAL
//! holds [`AUTOCHECKPOINT_PAGES`] frames. A connection whose `wal_autocheckpoint` is not
//! SQLite's default keeps SQLite's hook and the naps.
//!
//! Anything missing — not Linux, no `/dev/shm`, a file there that is not icq's, an
//! in-memory database — leaves the connection with the naps alone; nothing fails.
#![allow(unsafe_code)]

use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use libsqlite3_sys::sqlite3;

/// SQLite's default `wal_autocheckpoint`: the WAL frames after which a commit checkpoints.
pub(super) const AUTOCHECKPOINT_PAGES: c_int = 1000;

/// The words in the shared page (16 KiB of `u32`s).
const WORDS: usize = 4096;

/// The word `db`'s main database file wakes and waits on, or `None` (an in-memory or
/// temporary database, or no shared page on this system).
///
/// # Safety
/// `db` is an open connection that nothing else uses during the call.
pub(super) unsafe fn word_for(db: *mut sqlite3) -> Option<&'static AtomicU32> {
    // SAFETY: per the function's contract; SQLite returns NULL or a string it owns for
    // as long as the connection is open, copied before returning.
    let file = unsafe {
        let name = libsqlite3_sys::sqlite3_db_filename(db, c"main".as_ptr());
        if name.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(name).to_owned()
    };
    if file.is_empty() {
        return None;
    }
    let key = imp::file_key(&file)?;
    imp::page().map(|page| &page[slot(key)])
}

/// The word of the file with this `(device, inode)`.
fn slot((dev, ino): (u64, u64)) -> usize {
    // A fixed mix (not std's hasher, which may change between Rust releases): every icq
    // build must pick the same word for the same file.
    let mixed = (dev.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ino).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (mixed >> 32) as usize % WORDS
}

/// Waits on `word` for at most `nap`, or until a commit on its file bumps it (returns at
/// once if one did since `seen` was read).
pub(super) fn wait(word: &AtomicU32, seen: u32, nap: Duration) {
    imp::wait(word, seen, nap);
}

/// The WAL hook: SQLite calls it on the committing connection after each commit, once
/// the write lock is released. Checkpoints as SQLite's own hook would, then wakes every
/// waiter on the file's word. Never panics: it runs on SQLite's side of the FFI boundary.
extern "C" fn after_commit(
    arg: *mut c_void,
    db: *mut sqlite3,
    name: *const c_char,
    frames: c_int,
) -> c_int {
    // SAFETY: `arg` is the `&'static AtomicU32` passed to `sqlite3_wal_hook` in
    // `install`.
    let word = unsafe { &*(arg as *const AtomicU32) };
    // Checkpoint first, then wake: a waiter that starts its transaction while the WAL is
    // still being copied back reads from the WAL, and while one does the next writer
    // cannot start the WAL over. Woken first, the waiters let four replicas' WAL grow to
    // 40–58 MB in a 50,000 drain (5–9 MB like this, as with naps alone).
    if frames >= AUTOCHECKPOINT_PAGES {
        // SAFETY: SQLite passes its own open connection and the attached database's
        // name, as to its default hook, which makes this same call.
        unsafe { libsqlite3_sys::sqlite3_wal_checkpoint(db, name) };
    }
    word.fetch_add(1, Ordering::Release);
    imp::wake_all(word);
    libsqlite3_sys::SQLITE_OK
}

/// Makes commits on `db` wake waiters on `word`.
///
/// # Safety
/// `db` is an open connection that nothing else uses during the call, whose
/// `wal_autocheckpoint` is [`AUTOCHECKPOINT_PAGES`].
pub(super) unsafe fn install(db: *mut sqlite3, word: &'static AtomicU32) {
    let arg = word as *const AtomicU32 as *mut c_void;
    // SAFETY: per the function's contract; the hook ignores nothing it is given and
    // `arg` lives for the whole program.
    unsafe { libsqlite3_sys::sqlite3_wal_hook(db, Some(after_commit), arg) };
}

#[cfg(target_os = "linux")]
mod imp {
    use std::ffi::CStr;
    use std::path::Path;
    use std::sync::OnceLock;
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    use rustix::fs::{FileType, Mode, OFlags};
    use rustix::thread::futex;

    use super::WORDS;

    pub(super) type Page = [AtomicU32; WORDS];

    /// The user's page, mapped once per process and never unmapped.
    pub(super) fn page() -> Option<&'static Page> {
        static PAGE: OnceLock<Option<&'static Page>> = OnceLock::new();
        *PAGE.get_or_init(|| match open_page(Path::new("/dev/shm")) {
            Ok(page) => Some(page),
            Err(err) => {
                tracing::debug!(error = %err, "no shared page for SQLite lock wake-ups; waiting in naps");
                None
            }
        })
    }

    /// Maps `dir/icq-sqlite-wake-<uid>`, made if missing and kept at mode 0600; refuses a
    /// link, anything but a regular file, and a file another user owns.
    pub(super) fn open_page(dir: &Path) -> std::io::Result<&'static Page> {
        let uid = rustix::process::getuid().as_raw();
        let path = dir.join(format!("icq-sqlite-wake-{uid}"));
        let fd = rustix::fs::open(
            &path,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )?;
        let stat = rustix::fs::fstat(&fd)?;
        if stat.st_uid != uid || FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(std::io::Error::other(format!(
                "{} is not a file of this user's",
                path.display()
            )));
        }
        if stat.st_mode & 0o077 != 0 {
            // Another user who can write it could shrink it under every process mapping it.
            rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR)?;
        }
        let bytes = std::mem::size_of::<Page>() as u64;
        // Allocated, not only sized: a sparse page that a full /dev/shm cannot back would
        // kill the process with SIGBUS at its first write. Only ever grown: a process
        // mapping it meanwhile keeps every word it reads.
        rustix::fs::fallocate(&fd, rustix::fs::FallocateFlags::empty(), 0, bytes)?;
        // SAFETY: a fresh shared mapping of `bytes` of a regular file at least that long,
        // never unmapped, so the reference lives for the program. Every access to it goes
        // through atomics, which is what other processes' writes to it require.
        unsafe {
            let at = rustix::mm::mmap(
                std::ptr::null_mut(),
                bytes as usize,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )?;
            Ok(&*(at as *const Page))
        }
    }

    /// `(device, inode)` of the file at `path`.
    pub(super) fn file_key(path: &CStr) -> Option<(u64, u64)> {
        let stat = rustix::fs::stat(path).ok()?;
        Some((stat.st_dev, stat.st_ino))
    }

    pub(super) fn wait(word: &AtomicU32, seen: u32, nap: Duration) {
        let timeout = rustix::time::Timespec::try_from(nap).unwrap_or(rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 5_000_000,
        });
        // Shared (not PRIVATE): waiters in other processes map the same page. Woken,
        // timed out, interrupted or already bumped: all mean "try the lock again".
        let _ = futex::wait(word, futex::Flags::empty(), seen, Some(&timeout));
    }

    pub(super) fn wake_all(word: &AtomicU32) {
        let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::ffi::CStr;
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    pub(super) fn page() -> Option<&'static [AtomicU32; super::WORDS]> {
        None
    }

    pub(super) fn file_key(_path: &CStr) -> Option<(u64, u64)> {
        None
    }

    pub(super) fn wait(_word: &AtomicU32, _seen: u32, nap: Duration) {
        std::thread::sleep(nap);
    }

    pub(super) fn wake_all(_word: &AtomicU32) {}
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_one_per_user_and_shared_by_every_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let first = imp::open_page(dir.path()).unwrap();
        let second = imp::open_page(dir.path()).unwrap();
        assert_ne!(
            first.as_ptr(),
            second.as_ptr(),
            "two mappings, as in two processes"
        );
        first[7].fetch_add(3, Ordering::SeqCst);
        assert_eq!(second[7].load(Ordering::SeqCst), 3);
        let uid = rustix::process::getuid().as_raw();
        let file = dir.path().join(format!("icq-sqlite-wake-{uid}"));
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(meta.len(), std::mem::size_of::<imp::Page>() as u64);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Found looser (another program, an older build): made private again.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        imp::open_page(dir.path()).unwrap();
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_link_or_a_directory_in_its_place_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let uid = rustix::process::getuid().as_raw();
        let name = dir.path().join(format!("icq-sqlite-wake-{uid}"));
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        std::os::unix::fs::symlink(&victim, &name).unwrap();
        assert!(imp::open_page(dir.path()).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        std::fs::remove_file(&name).unwrap();
        std::fs::create_dir(&name).unwrap();
        assert!(imp::open_page(dir.path()).is_err());
    }

    #[test]
    fn a_waiter_returns_when_its_word_was_bumped_or_its_nap_is_over() {
        let dir = tempfile::tempdir().unwrap();
        let page = imp::open_page(dir.path()).unwrap();
        let word = &page[3];
        // Bumped since it was read: no wait at all, however long the nap.
        let seen = word.load(Ordering::Acquire);
        word.fetch_add(1, Ordering::Release);
        let started = std::time::Instant::now();
        wait(word, seen, Duration::from_secs(60));
        assert!(started.elapsed() < Duration::from_secs(30));
        // Not bumped: back after the nap.
        let seen = word.load(Ordering::Acquire);
        let started = std::time::Instant::now();
        wait(word, seen, Duration::from_millis(1));
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    /// A driver's connections on a fresh file, and the file's word as any process finds it.
    async fn driver_and_word() -> (
        tempfile::TempDir,
        super::super::SqliteDriver,
        &'static AtomicU32,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("wake.db");
        let url = format!("sqlite://{}?mode=rwc", file.display());
        let table = crate::ident::TableName::parse("InternalCommands").unwrap();
        let options = crate::engine::ConnectOptions::default();
        let driver = super::super::SqliteDriver::connect(&url, &table, &options)
            .await
            .unwrap();
        let page = imp::page().expect("a shared page in /dev/shm");
        let path = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        let word = &page[slot(imp::file_key(&path).unwrap())];
        (dir, driver, word)
    }

    /// A commit on one of icq's connections wakes a waiter on the file's word (another
    /// process's mapping waits on it the same way).
    #[tokio::test]
    async fn a_commit_wakes_whoever_waits_to_write_the_same_file() {
        let (_dir, driver, word) = driver_and_word().await;
        let seen = word.load(Ordering::Acquire);
        let waiter = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            wait(word, seen, Duration::from_secs(20));
            started.elapsed()
        });
        sqlx::query("CREATE TABLE woken (x)")
            .execute(&driver.pool)
            .await
            .unwrap();
        assert_ne!(
            word.load(Ordering::Acquire),
            seen,
            "the commit bumped the word"
        );
        let waited = waiter.join().unwrap();
        assert!(
            waited < Duration::from_secs(15),
            "woken by the commit, not by the end of its wait ({waited:?})"
        );
        driver.pool.close().await;
    }

    /// The WAL hook replaces SQLite's own auto-checkpoint, so it checkpoints as SQLite
    /// does: commits far past 1,000 WAL pages leave a WAL that started over, not one that
    /// holds every page written.
    #[tokio::test]
    async fn the_wal_is_checkpointed_and_starts_over_as_with_sqlites_own_hook() {
        let (dir, driver, _word) = driver_and_word().await;
        sqlx::query("CREATE TABLE filler (x BLOB)")
            .execute(&driver.pool)
            .await
            .unwrap();
        // 16 commits of 1 MiB: about 4,100 pages of 4 KiB.
        for _ in 0..16 {
            sqlx::query("INSERT INTO filler VALUES (zeroblob(1048576))")
                .execute(&driver.pool)
                .await
                .unwrap();
        }
        let wal = std::fs::metadata(dir.path().join("wake.db-wal"))
            .unwrap()
            .len();
        assert!(
            wal < 8 << 20,
            "the WAL holds {wal} bytes: it was never checkpointed and started over"
        );
        driver.pool.close().await;
    }

    /// A wait for the lock that commits to other files keep waking (files sharing the
    /// word) lasts until the lock is free, not the timeout's count of tries: counted in
    /// tries, it failed with "database is locked" within half a second.
    #[tokio::test]
    async fn wake_ups_for_other_files_do_not_shorten_the_wait_for_the_lock() {
        let (dir, driver, word) = driver_and_word().await;
        sqlx::query("CREATE TABLE waits (x)")
            .execute(&driver.pool)
            .await
            .unwrap();
        let url = format!("sqlite://{}", dir.path().join("wake.db").display());
        let mut holder = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
            .await
            .unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE; INSERT INTO waits VALUES (1)")
            .execute(&mut holder)
            .await
            .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let bumped = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let waker = std::thread::spawn({
            let (stop, bumped) = (stop.clone(), bumped.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    word.fetch_add(1, Ordering::Release);
                    imp::wake_all(word);
                    bumped.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        });
        let pool = driver.pool.clone();
        let write = tokio::spawn(async move {
            sqlx::query("INSERT INTO waits VALUES (2)")
                .execute(&pool)
                .await
        });
        // The lock is held for 1.5 s and at least 6,000 wake-ups (a loaded machine's
        // sleeps are longer than asked: the count, not the clock, is what proves the
        // point), at most 20 s (within the 30 s busy timeout).
        let held = std::time::Instant::now();
        while (held.elapsed() < Duration::from_millis(1500)
            || bumped.load(Ordering::Relaxed) < 6_000)
            && held.elapsed() < Duration::from_secs(20)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !write.is_finished(),
            "the write ended while the lock was held"
        );
        sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
        let written = write.await.unwrap();
        stop.store(true, Ordering::Relaxed);
        waker.join().unwrap();
        let bumps = bumped.load(Ordering::Relaxed);
        assert!(
            bumps > 6_000,
            "only {bumps} wake-ups in 20 s: the test proved nothing"
        );
        written.expect("the write waited for the lock");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM waits")
            .fetch_one(&driver.pool)
            .await
            .unwrap();
        assert_eq!(rows, 2);
        driver.pool.close().await;
    }

    #[test]
    fn every_device_and_inode_has_a_word_and_neighbours_spread() {
        let words: std::collections::HashSet<usize> =
            (0..256u64).map(|ino| slot((2049, 1_000 + ino))).collect();
        assert!(words.iter().all(|w| *w < WORDS));
        assert!(words.len() > 200, "{} words for 256 files", words.len());
    }
}
