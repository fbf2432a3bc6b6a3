//! Operator queries (counts, dead letters, requeue, purge, replay) as a trait each engine
//! driver implements next to its queue operations.

use async_trait::async_trait;

/// Operator queries over one source's table.
#[async_trait]
pub trait AdminOps: Send + Sync + 'static {}
