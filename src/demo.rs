//! The quick start's sample workload: a few commands with built-in handlers, one of
//! which always fails so that retries and a dead letter can be seen.

use std::sync::Arc;

use crate::command::{Context, NewCommand};
use crate::handler::{FnHandler, HandlerError, Job, Layer, Registry, TraceLayer};
use crate::settings::Settings;

/// The type the demo's succeeding handler runs.
pub const GREET: &str = "demo.greet";
/// The type the demo's always-failing handler runs.
pub const FLAKY: &str = "demo.charge_card";

/// Handlers for the sample commands.
pub fn registry() -> Registry {
    let mut registry = Registry::new();
    let greet = FnHandler(|job: Job| async move {
        let name = job
            .payload
            .get("name")
            .and_then(|n| n.as_str())
            .unwrap_or("world");
        tracing::info!(name, "hello");
        Ok(())
    });
    let flaky = FnHandler(|job: Job| async move {
        Err(HandlerError::retry(format!(
            "card declined (attempt {}): the demo handler always fails",
            job.attempt
        )))
    });
    // Both names are distinct constants, so registration cannot collide.
    let _ = registry.insert(GREET, TraceLayer.layer(Arc::new(greet)));
    let _ = registry.insert(FLAKY, TraceLayer.layer(Arc::new(flaky)));
    registry
}

/// The sample commands: four greetings and one charge that keeps failing.
pub fn commands() -> Vec<NewCommand> {
    let context = Context {
        user_id: Some("demo-user".into()),
        roles: vec!["demo".into()],
        tenant_id: Some("demo-tenant".into()),
        correlation_id: Some("quickstart".into()),
    };
    let mut commands: Vec<NewCommand> = ["Ada", "Grace", "Edsger", "Barbara"]
        .iter()
        .map(|name| {
            NewCommand::new(GREET, serde_json::json!({ "name": name })).context(context.clone())
        })
        .collect();
    commands.push(
        NewCommand::new(
            FLAKY,
            serde_json::json!({ "order_id": 42, "amount_cents": 1999 }),
        )
        .context(context),
    );
    commands
}

/// Settings that let the failing command exhaust its attempts within a second: three
/// attempts, retried at once.
pub fn settings() -> Settings {
    Settings {
        max_attempts: 3,
        retry_backoff_base_seconds: 0.0,
        max_retry_backoff_seconds: 0.0,
        polling_interval_seconds: 0.2,
        ..Settings::default()
    }
}
