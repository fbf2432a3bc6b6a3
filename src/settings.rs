//! Per-source processing settings (`sources[].settings` in `icq.yaml`), with the defaults
//! from the product contract.

use std::time::Duration;

use serde::Deserialize;

/// How one source is processed. Every field has the contract's default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a mapping of settings")]
pub struct Settings {
    /// Most rows claimed in one statement.
    pub batch_size: u32,
    /// Attempts before a command is dead-lettered.
    pub max_attempts: u32,
    /// How long a claim holds a row before another processor may take it.
    pub lease_seconds: u64,
    /// First retry delay; doubled on every further attempt.
    pub retry_backoff_base_seconds: f64,
    /// Upper bound on any retry delay.
    pub max_retry_backoff_seconds: f64,
    /// Completed rows older than this are deleted by the retention sweep.
    pub retention_days: u64,
    /// How often the retention sweep runs.
    pub cleanup_interval_hours: f64,
    /// Rows younger than this are not claimed.
    pub processing_delay_seconds: u64,
    /// How often to poll when no wake-up arrives.
    pub polling_interval_seconds: f64,
    /// Rows executed at once.
    pub concurrency: u32,
    /// Claim only the types this worker has handlers for; others stay pending.
    pub claim_only_handled_types: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            batch_size: 50,
            max_attempts: 5,
            lease_seconds: 300,
            retry_backoff_base_seconds: 10.0,
            max_retry_backoff_seconds: 600.0,
            retention_days: 7,
            cleanup_interval_hours: 6.0,
            processing_delay_seconds: 0,
            polling_interval_seconds: 2.0,
            concurrency: 8,
            claim_only_handled_types: false,
        }
    }
}

impl Settings {
    /// Checks ranges that types alone cannot express; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("batch_size", self.batch_size as f64),
            ("max_attempts", self.max_attempts as f64),
            ("lease_seconds", self.lease_seconds as f64),
            ("concurrency", self.concurrency as f64),
            ("polling_interval_seconds", self.polling_interval_seconds),
            ("cleanup_interval_hours", self.cleanup_interval_hours),
        ];
        for (key, value) in positive {
            if value.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) || !value.is_finite() {
                return Err(format!("`{key}` must be greater than 0 (got {value})"));
            }
        }
        for (key, value) in [
            (
                "retry_backoff_base_seconds",
                self.retry_backoff_base_seconds,
            ),
            ("max_retry_backoff_seconds", self.max_retry_backoff_seconds),
        ] {
            if value < 0.0 || !value.is_finite() {
                return Err(format!("`{key}` must be 0 or more (got {value})"));
            }
        }
        if self.batch_size > 10_000 {
            return Err(format!(
                "`batch_size` must be at most 10000 (got {})",
                self.batch_size
            ));
        }
        Ok(())
    }

    /// The lease as a duration.
    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_seconds)
    }

    /// The polling interval as a duration.
    pub fn polling_interval(&self) -> Duration {
        Duration::from_secs_f64(self.polling_interval_seconds)
    }

    /// The retention sweep interval as a duration.
    pub fn cleanup_interval(&self) -> Duration {
        Duration::from_secs_f64(self.cleanup_interval_hours * 3600.0)
    }

    /// How old a completed row must be before the sweep deletes it.
    pub fn retention(&self) -> Duration {
        Duration::from_secs(self.retention_days * 86_400)
    }
}
