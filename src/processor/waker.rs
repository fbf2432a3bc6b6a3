//! The waker: what tells an idle producer to claim before its next poll. In-process
//! schedules signal the source's [`tokio::sync::Notify`] directly; on PostgreSQL the
//! table's statement-level trigger NOTIFYs at every commit that inserted rows, from any
//! client, and this subscribes to it. Elsewhere the polling interval is the backstop.
//!
//! The PostgreSQL driver keeps its LISTEN connection alive: when it is lost it reconnects
//! to the server the source uses then (after a failover, the new primary; never a server
//! in recovery) and LISTENs again, waking the producer once so nothing committed
//! meanwhile waits for a poll. Behind a transaction pooler (`pooler: transaction`) it
//! does not LISTEN at all and says so: polling alone finds new commands.

use super::SourceHandle;

/// Subscribes the source's wake-up signal to the engine's insert notifications, and
/// `cancelled` to its cancel notifications (PostgreSQL's `icq_cancel_<table>`, sent when
/// an operator cancels a running command: the lease check then runs at once), where
/// there are any. A failure is logged; polling and the lease check every second cover it.
pub(crate) async fn listen(source: &SourceHandle, cancelled: std::sync::Arc<tokio::sync::Notify>) {
    let pauses = source.pauses.changed.clone();
    match source
        .backend
        .listen(source.wake.clone(), cancelled, pauses)
        .await
    {
        Ok(true) => tracing::debug!(source = %source.name, "listening for inserts"),
        // No LISTEN here (another engine, or a transaction pooler, which the driver
        // reports itself): polling finds new commands.
        Ok(false) => {}
        Err(err) => {
            tracing::warn!(source = %source.name, error = %err, "cannot LISTEN; relying on polling")
        }
    }
}
