//! Payload memory: large payloads through `icq work --until-idle` (the binary,
//! under GNU time) keep the worker's peak RSS within the bound the README states:
//!
//! `peak RSS ≤ base + concurrency × 3P + BUFFERED_PAYLOAD_BYTES (16 MB) + c × P`
//!
//! where `P` is the largest payload: each running row holds its payload at most twice
//! (the decoded value and, for an exec handler, the serialized text on its way to the
//! program's stdin; the value is dropped before the program starts) and glibc's malloc
//! may keep one more freed payload-sized buffer per slot for reuse (its dynamic mmap
//! threshold); the buffer of claimed-but-unstarted rows holds at most the budget; and a
//! claim makes `c` transient copies of its row (4 on PostgreSQL, 6 on SQLite, whose
//! UPDATEs rewrite the whole record). The cases are the
//! issue's: one 50 MB payload, ten 20 MB payloads (SQLite and PostgreSQL), and a 20 MB
//! payload to an exec handler that never reads its stdin. MariaDB is left out: its
//! default `max_allowed_packet` (16 MB) refuses such rows before icq sees them.

use std::path::Path;
use std::process::Command;

use crate::common::{HEAVY, completed, icq_bin, table, write_config};
use crate::support::TestDb;

const MB: u64 = 1024 * 1024;

/// What the binary holds with no payload at all (runtime, pools, logging): generous.
const BASE: u64 = 64 * MB;

/// The README's bound for `concurrency` slots and payloads of at most `largest` bytes:
/// three payloads per slot (two live copies, one kept by the allocator), the buffer's
/// budget, and the copies one claim makes of its row on the way in (the engine's result
/// row, the driver's copy, the decoded value; on SQLite also the record the claim's and
/// the stamp's UPDATE rewrite).
fn bound(engine: &str, concurrency: u64, largest: u64) -> u64 {
    let claim_copies = if engine == "sqlite" { 6 } else { 4 };
    BASE + concurrency * 3 * largest + 16 * MB + claim_copies * largest
}

/// Inserts `count` rows of type `big` whose payload is a JSON string of `bytes` bytes.
async fn insert_big(db: &TestDb, count: usize, bytes: u64) {
    let t = table(db);
    let payload = match db.engine {
        "postgres" => format!("to_jsonb(repeat('x', {bytes}))"),
        _ => format!(
            "'\"' || replace(hex(zeroblob({})), '0', 'x') || '\"'",
            bytes / 2
        ),
    };
    for _ in 0..count {
        db.execute(&format!(
            "INSERT INTO {t} (\"Type\", \"Payload\") VALUES ('big', {payload})"
        ))
        .await;
    }
}

/// Runs `icq work --until-idle` under GNU time; returns (success, peak RSS in bytes, log).
fn work_measured(config: &Path, dir: &Path) -> (bool, u64, String) {
    let time = Path::new("/usr/bin/time");
    assert!(
        time.exists(),
        "GNU time (/usr/bin/time) measures the peak RSS"
    );
    let report = dir.join("rss.txt");
    let out = Command::new(time)
        .args(["-f", "%M", "-o"])
        .arg(&report)
        .arg(icq_bin())
        .args(["work", "--until-idle", "--config"])
        .arg(config)
        .env_remove("DATABASE_URL")
        .env_remove("ICQ_CONFIG")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "icq=warn")
        .output()
        .expect("run icq work under time");
    let kib: u64 = std::fs::read_to_string(&report)
        .expect("time's report")
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .expect("time's report is a number");
    (
        out.status.success(),
        kib * 1024,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `count` payloads of `bytes` each through an exec handler running `program` with
/// `concurrency` slots: every row completes and the peak stays within [`bound`].
async fn drain(engine: &'static str, tag: &str, count: usize, bytes: u64, program: &str) {
    let _heavy = HEAVY.lock().await;
    let db = TestDb::with_table(engine, tag).await;
    insert_big(&db, count, bytes).await;
    let concurrency = 8;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "big",
        &db.url,
        &format!("{{ polling_interval_seconds: 0.2, concurrency: {concurrency} }}"),
        &format!("  big:\n    exec: [\"sh\", \"-c\", \"{program}\"]\n    timeout_seconds: 60\n"),
    );
    let (ok, peak, log) = work_measured(&config, dir.path());
    assert!(ok, "{engine}/{tag}: icq work --until-idle failed:\n{log}");
    assert_eq!(
        completed(&db).await,
        count as i64,
        "{engine}/{tag}: every row completed\n{log}"
    );
    let limit = bound(engine, concurrency.min(count as u64), bytes);
    eprintln!(
        "{engine}/{tag}: {count} × {} MB payloads, peak RSS {} MB (bound {} MB)",
        bytes / MB,
        peak / MB,
        limit / MB
    );
    assert!(
        peak <= limit,
        "{engine}/{tag}: peak RSS {} MB is above the bound {} MB",
        peak / MB,
        limit / MB
    );
}

macro_rules! memory_tests {
    ($($name:ident: [$($engine:ident),+] => ($count:expr, $mb:expr, $program:expr);)*) => {
        $(
            mod $name {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $engine() {
                        super::drain(stringify!($engine), stringify!($name), $count, $mb * super::MB, $program).await
                    }
                )+
            }
        )*
    };
}

memory_tests! {
    one_50_mb_payload_within_the_bound: [sqlite, postgres] => (1, 50, "cat > /dev/null");
    ten_20_mb_payloads_within_the_bound: [sqlite, postgres] => (10, 20, "cat > /dev/null");
    a_20_mb_payload_to_a_program_that_never_reads_stdin: [sqlite] => (1, 20, "exit 0");
}
