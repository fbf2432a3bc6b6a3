//! The waker: what tells an idle producer to claim before its next poll. In-process
//! schedules signal the source's [`tokio::sync::Notify`] directly; on PostgreSQL the
//! table's statement-level trigger NOTIFYs at every commit that inserted rows, from any
//! client, and this subscribes to it. Elsewhere the polling interval is the backstop.

use super::SourceHandle;

/// Subscribes the source's wake-up signal to the engine's insert notifications, where
/// there are any. A failure is logged and polling covers it.
pub(crate) async fn listen(source: &SourceHandle) {
    match source.backend.listen(source.wake.clone()).await {
        Ok(true) => tracing::debug!(source = %source.name, "listening for inserts"),
        Ok(false) => {}
        Err(err) => {
            tracing::warn!(source = %source.name, error = %err, "cannot LISTEN; relying on polling")
        }
    }
}
