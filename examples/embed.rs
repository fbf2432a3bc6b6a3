//! Embedding icq in a service: a business change and its command commit in one
//! transaction, a rolled-back change schedules nothing, and a typed handler processes
//! what was committed. Runs on a throw-away SQLite file, so it needs no server:
//!
//! ```sh
//! cargo run --example embed
//! ```
//!
//! The same code runs on PostgreSQL or MySQL/MariaDB with their URL and pool type.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use icq::ConnectOptions;
use icq::{
    CommandType, Context, Engine, NewCommand, Processor, Queue, Registry, RunOptions, Settings,
    TableName,
};
use serde::{Deserialize, Serialize};
use sqlx::Connection as _;
use tokio_util::sync::CancellationToken;

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
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    let table = TableName::default();

    // The application's own schema, and icq's table (normally a migration:
    // `icq migrate add` + `icq migrate run`, or sqlx-cli).
    let mut conn = sqlx::SqliteConnection::connect(&url).await?;
    sqlx::raw_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)")
        .execute(&mut conn)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(
        icq::schema::render(Engine::Sqlite, &table).up,
    ))
    .execute(&mut conn)
    .await?;
    sqlx::raw_sql("INSERT INTO orders (id, status) VALUES (42, 'new'), (43, 'new')")
        .execute(&mut conn)
        .await?;
    let queue = Queue::connect("shop", &url, &table, &ConnectOptions::default()).await?;

    // 1. Order 42 is paid: the status change and its command commit together.
    let mut tx = conn.begin().await?;
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
    let mut tx = conn.begin().await?;
    sqlx::query("UPDATE orders SET status = 'paid' WHERE id = ?")
        .bind(43_i64)
        .execute(&mut *tx)
        .await?;
    queue
        .schedule_in(&mut *tx, &NewCommand::typed(&SendReceipt { order_id: 43 })?)
        .await?;
    tx.rollback().await?;
    conn.close().await?;

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
    let options = RunOptions {
        until_idle: true,
        ..RunOptions::default()
    };
    processor.run(options, CancellationToken::new()).await?;

    let sent = sent.load(Ordering::SeqCst);
    println!("{sent} receipt sent; the rolled-back order scheduled nothing");
    anyhow::ensure!(sent == 1, "expected exactly one receipt, sent {sent}");
    Ok(())
}
