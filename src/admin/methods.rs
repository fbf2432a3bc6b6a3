//! The operator operations on one queue, as methods of [`Queue`]: what a service calls
//! from its own admin endpoints. Each is the module-level function of the same name on a
//! one-queue slice (the functions take several queues, as `icq` does across sources), so
//! they share its guarantees: nothing changes on a bad request, and bulk work runs in
//! short batches.

use super::{
    CancelReport, CancelTarget, DeadLetterQuery, DeadLetterReport, ListReport, ListRequest,
    NoProgress, PendingReport, PendingRequest, PurgeReport, PurgeRequest, ReplayReport,
    RequeueReport, RequeueTarget, ShownCommand,
};
use crate::command::CommandId;
use crate::error::Result;
use crate::queue::Queue;

impl Queue {
    /// How many commands are in each state — due, scheduled, running, dead, completed —
    /// as `icq pending` counts them: one aggregate query. `request` breaks the counts down
    /// by queue and/or type ([`PendingRequest::per_queue`], [`PendingRequest::per_type`])
    /// or counts one queue ([`PendingRequest::in_queue`]); [`PendingRequest::default`]
    /// counts the whole table. A service reads its backlog from the report's lines, or
    /// with [`PendingReport::counts`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// use std::time::Duration;
    /// use icq::admin::PendingRequest;
    /// use icq::{ConnectOptions, NewCommand, Queue};
    /// use serde_json::json;
    ///
    /// let options = ConnectOptions::default().creating_table(true);
    /// let queue = Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// queue.schedule(&NewCommand::new("mail.send", json!({})).queue("emails")).await?;
    /// queue.schedule(&NewCommand::new("mail.send", json!({})).queue("emails")).await?;
    /// let later = NewCommand::new("mail.digest", json!({})).queue("emails").delay(Duration::from_secs(600));
    /// queue.schedule(&later).await?;
    /// queue.schedule(&NewCommand::new("report.build", json!({}))).await?;
    ///
    /// // The whole table: one line.
    /// let all = queue.pending(&PendingRequest::default()).await?;
    /// let totals = all.counts("shop", None, None).unwrap();
    /// assert_eq!((totals.due, totals.scheduled, totals.running), (3, 1, 0));
    ///
    /// // Per queue and type: one line each.
    /// let split = queue.pending(&PendingRequest::default().per_queue().per_type()).await?;
    /// let sends = split.counts("shop", Some("emails"), Some("mail.send")).unwrap();
    /// assert_eq!((sends.due, sends.scheduled), (2, 0));
    /// let digests = split.counts("shop", Some("emails"), Some("mail.digest")).unwrap();
    /// assert_eq!((digests.due, digests.scheduled), (0, 1));
    /// assert_eq!(split.counts("shop", Some("default"), Some("report.build")).unwrap().due, 1);
    ///
    /// // One queue, per type.
    /// let emails = queue.pending(&PendingRequest::default().in_queue("emails").per_type()).await?;
    /// assert_eq!(emails.rows.len(), 2);
    /// assert_eq!(emails.rows.iter().map(|r| r.counts.due + r.counts.scheduled).sum::<u64>(), 3);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// The other operator methods, on the same queue:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let url = format!("sqlite://{}?mode=rwc", dir.path().join("shop.db").display());
    /// use icq::admin::{CancelTarget, ListRequest, ListState, PurgeRequest, RequeueTarget};
    /// use icq::{ConnectOptions, NewCommand, Queue};
    ///
    /// let options = ConnectOptions::default().creating_table(true);
    /// let queue = Queue::connect("shop", &url, &Default::default(), &options).await?;
    /// let id = queue.schedule(&NewCommand::new("mail", serde_json::json!({}))).await?.id;
    /// assert_eq!(queue.pending(&Default::default()).await?.rows[0].counts.due, 1);
    /// let due = ListRequest { state: ListState::Due, type_name: None, queue: None, limit: 10, after: None, before: None };
    /// assert_eq!(queue.list(&due).await?.commands.len(), 1);
    /// assert_eq!(queue.show(id.clone()).await?.row.type_name, "mail");
    ///
    /// // Cancel it (it becomes a dead letter), put it back, and purge nothing yet.
    /// queue.cancel(&CancelTarget::Ids(vec![id.clone()])).await?;
    /// assert_eq!(queue.dead_letters(&Default::default()).await?.rows.len(), 1);
    /// queue.requeue(&RequeueTarget::Ids(vec![id])).await?;
    /// assert_eq!(queue.pending(&Default::default()).await?.rows[0].counts.dead, 0);
    /// let purge = PurgeRequest { completed: true, ..Default::default() };
    /// let purged = queue.purge(&purge).await?;
    /// assert_eq!(purged.counts.iter().map(|c| c.count).sum::<u64>(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn pending(&self, request: &PendingRequest) -> Result<PendingReport> {
        super::pending_with(std::slice::from_ref(self), request).await
    }

    /// A page of this queue's commands (`icq list`). See [`Queue::pending`]'s example.
    pub async fn list(&self, request: &ListRequest) -> Result<ListReport> {
        super::list(std::slice::from_ref(self), request).await
    }

    /// One command, whatever its state (`icq show`); [`crate::Error::NotFound`] for an
    /// unknown id. See [`Queue::pending`]'s example.
    pub async fn show(&self, id: CommandId) -> Result<ShownCommand> {
        super::show(std::slice::from_ref(self), id).await
    }

    /// Cancels pending commands (`icq cancel`): they become dead letters with
    /// `cancelled by operator`, and a running one's handler is told to stop. See
    /// [`Queue::pending`]'s example.
    pub async fn cancel(&self, target: &CancelTarget) -> Result<CancelReport> {
        let plan = super::plan_cancel(std::slice::from_ref(self), target).await?;
        super::cancel(&plan, &NoProgress).await
    }

    /// Dead letters, newest first (`icq dead-letters list`). See [`Queue::pending`]'s
    /// example.
    pub async fn dead_letters(&self, query: &DeadLetterQuery) -> Result<DeadLetterReport> {
        super::dead_letters(std::slice::from_ref(self), query).await
    }

    /// Puts dead letters (or pending commands) back to run now with their attempts reset
    /// (`icq requeue`). See [`Queue::pending`]'s example.
    pub async fn requeue(&self, target: &RequeueTarget) -> Result<RequeueReport> {
        let plan = super::plan_requeue(std::slice::from_ref(self), target).await?;
        super::requeue(&plan, &NoProgress).await
    }

    /// Schedules a copy of each completed or dead command (`icq replay`).
    pub async fn replay(&self, ids: &[CommandId]) -> Result<ReplayReport> {
        super::replay(std::slice::from_ref(self), ids).await
    }

    /// Deletes finished commands older than the request's cutoff, in batches (`icq
    /// purge`). See [`Queue::pending`]'s example.
    pub async fn purge(&self, request: &PurgeRequest) -> Result<PurgeReport> {
        let plan = super::plan_purge(std::slice::from_ref(self), request).await?;
        super::purge(&plan, &NoProgress).await
    }
}
