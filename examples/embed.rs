//! Embedding icq in a service, as the README's "The Rust API" does it: icq takes the
//! application's own pool (`Queue::from_pool`) and creates its table from Rust
//! (`icq::schema::apply`); a business change and its command commit in one transaction, a
//! rolled-back change schedules nothing, and a typed handler processes what was committed
//! until the queue is idle. Runs on a throw-away SQLite file, so it needs no server:
//!
//! ```sh
//! cargo run --example embed
//! ```
//!
//! The same code runs on PostgreSQL or MySQL/MariaDB with their URL and pool type.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use icq::sqlx::{self, sqlite::SqliteConnectOptions, sqlite::SqliteJournalMode};
use icq::{
    CancellationToken, CommandType, Context, NewCommand, Processor, Queue, Registry, RunOptions,
    Settings, TableName,
};
use serde::{Deserialize, Serialize};

/// The command: send the receipt of a paid order.
#[derive(Serialize, Deserialize)]
struct SendReceipt {
    order_id: i64,
}

impl CommandType for SendReceipt {
    const TYPE: &'static str = "orders.send_receipt";
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let table = TableName::default();

    // The application's own pool (WAL and a busy timeout, as icq's own SQLite connect
    // sets them) and schema.
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("shop.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_secs(30));
    let pool = sqlx::SqlitePool::connect_with(options).await?;
    sqlx::raw_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::raw_sql("INSERT INTO orders (id, status) VALUES (42, 'new'), (43, 'new')")
        .execute(&pool)
        .await?;

    // icq's table, created (or upgraded) from Rust, and a queue on the same pool.
    icq::schema::apply(&pool, &table).await?;
    let queue = Queue::from_pool("shop", &pool, &table).await?;

    // 1. Order 42 is paid: the status change and its command commit together.
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE orders SET status = 'paid' WHERE id = ?")
        .bind(42_i64)
        .execute(&mut *tx)
        .await?;
    let command = NewCommand::typed(&SendReceipt { order_id: 42 })?.context(Context {
        user_id: Some("u-17".into()),
        correlation_id: Some("req-9f2".into()),
        ..Context::default()
    });
    queue.schedule_in(&mut *tx, &command).await?;
    queue.commit(tx).await?; // commits, then wakes the local processor

    // 2. Order 43's payment fails: rolling back schedules nothing.
    let mut tx = pool.begin().await?;
    sqlx::query("UPDATE orders SET status = 'paid' WHERE id = ?")
        .bind(43_i64)
        .execute(&mut *tx)
        .await?;
    queue
        .schedule_in(&mut *tx, &NewCommand::typed(&SendReceipt { order_id: 43 })?)
        .await?;
    tx.rollback().await?;

    // 3. A typed handler, run by the processor until nothing is due.
    let sent = Arc::new(AtomicU64::new(0));
    let mut registry = Registry::new();
    let counter = sent.clone();
    registry.register::<SendReceipt, _, _>(move |receipt, job| {
        let counter = counter.clone();
        async move {
            println!(
                "receipt for order {} (attempt {}, user {:?}, correlation {:?})",
                receipt.order_id, job.attempt, job.context.user_id, job.context.correlation_id
            );
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    })?;
    let mut processor = Processor::new(registry);
    processor.add_source(queue.source_handle(Settings::default()));
    let options = RunOptions::default().with_until_idle(true);
    processor.run(options, CancellationToken::new()).await?;

    let sent = sent.load(Ordering::SeqCst);
    println!("{sent} receipt sent; the rolled-back order scheduled nothing");
    anyhow::ensure!(sent == 1, "expected exactly one receipt, sent {sent}");
    queue.close().await; // icq's own connections; the application's pool stays open
    anyhow::ensure!(!pool.is_closed(), "the application's pool was closed");
    Ok(())
}
