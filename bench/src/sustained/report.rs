//! The sustained run's verdict: what was lost or ran twice, how the table grew after the
//! first minute, pickup (and claim, when icq exposes it) latency by phase, and the rescue
//! time; printed as tables or serialized whole for `--format json`.

use std::time::Duration;

use serde::Serialize;

use super::db::Final;
use super::endpoint::Entries;
use super::{AFTER_KILL, AFTER_RELEASE, Kill, Plan, Sample, WARMUP, metrics};
use crate::Opts;
use crate::icq::{Engine, IcqBin};

/// The table is compared with its size at this point of the run.
const GROWTH_FROM: f64 = 60.0;
/// A window's pickup p99 within this factor of the clean phase's counts as recovered.
const RECOVERED_WITHIN: f64 = 1.5;

pub struct Inputs<'a> {
    pub engine: Engine,
    pub bin: &'a IcqBin,
    pub opts: &'a Opts,
    pub plan: Plan,
    pub t0: u64,
    pub samples: Vec<Sample>,
    pub entries: &'a Entries,
    pub scheduled: u64,
    pub kill: Option<Kill>,
    pub drained_after_s: Option<f64>,
    pub counts: Final,
    pub claim_metric: Option<String>,
    pub stop_problems: Vec<String>,
}

#[derive(Serialize, Clone, Debug)]
pub struct Phase {
    pub phase: &'static str,
    pub from_s: f64,
    pub to_s: f64,
    /// First executions that started in the phase.
    pub executions: usize,
    pub pickup_p50_ms: Option<f64>,
    pub pickup_p99_ms: Option<f64>,
    /// The phase's pickup p99 over the clean phase's.
    pub pickup_p99_vs_clean: Option<f64>,
    pub claim_p99_ms: Option<f64>,
}

#[derive(Serialize, Clone, Debug, Default)]
pub struct Growth {
    /// Bytes of the commands table with its indexes at the first sample at or after 60 s.
    pub at_60s: Option<i64>,
    /// At the last sample of the clean phase (when that is after 60 s).
    pub end_of_clean: Option<i64>,
    /// At the last sample before the producer stopped.
    pub end_of_run: Option<i64>,
    pub max: i64,
    pub max_at_s: f64,
    /// (end of run - at 60 s) / commands completed in between.
    pub bytes_per_command_after_60s: Option<f64>,
    pub history_end_of_run: Option<i64>,
    pub dead_max: Option<i64>,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub engine: &'static str,
    pub icq: String,
    pub replicas: usize,
    pub rate: u32,
    pub duration_s: f64,
    pub handler_ms: u64,
    pub settings: String,
    pub hold_at_s: Option<f64>,
    pub hold_for_s: Option<f64>,
    pub scheduled: u64,
    /// Scheduled commands whose handler ran at least once.
    pub executed: u64,
    pub lost: u64,
    pub ran_more_than_once: u64,
    /// Of those, leased when the replica was killed.
    pub ran_more_than_once_leased_at_kill: u64,
    pub requests_without_n: u64,
    /// Seconds from the producer's stop until the backlog was empty.
    pub drained_after_s: Option<f64>,
    pub table: Growth,
    pub phases: Vec<Phase>,
    /// Seconds from the release until a window's pickup p99 was within 1.5x of the clean
    /// phase's.
    pub recovered_after_release_s: Option<f64>,
    pub kill: Option<Kill>,
    /// The claim-duration histogram scraped, or none (pickup latency stands in).
    pub claim_metric: Option<String>,
    pub load1_mean: Option<f64>,
    pub load1_max: Option<f64>,
    #[serde(rename = "final")]
    pub final_counts: Final,
    pub stop_problems: Vec<String>,
    pub samples: Vec<Sample>,
}

/// The `q` quantile of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.1}"))
}

fn mb(v: Option<i64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{:.1}", x as f64 / 1e6))
}

/// The progress line for one sample (stderr).
pub fn sample_line(s: &Sample) -> String {
    format!(
        "{:>6.1}s {:<8} sched {:>5.0}/s done {:>5.0}/s backlog {:>6} table {:>7} MB dead {:>8} hist {:>6} MB pickup p50 {:>6} p99 {:>7} ms claim p99 {:>6} load {}",
        s.t,
        s.phase,
        s.scheduled_per_s,
        s.completed_per_s,
        s.backlog,
        mb(Some(s.table_bytes)),
        s.dead.map_or_else(|| "-".into(), |d| d.to_string()),
        mb(s.history_bytes),
        ms(s.pickup_p50_ms),
        ms(s.pickup_p99_ms),
        ms(s.claim_p99_ms),
        s.load1.map_or_else(|| "-".into(), |l| format!("{l:.2}")),
    )
}

impl Report {
    pub fn build(i: Inputs<'_>) -> Self {
        let e = i.entries;
        let scheduled = i.scheduled as usize;
        let runs = &e.runs[..scheduled.min(e.runs.len())];
        let executed = runs.iter().filter(|r| **r > 0).count() as u64;
        let lost = i.scheduled - executed;
        let leased_at_kill: std::collections::HashSet<u64> = i
            .kill
            .as_ref()
            .map(|k| k.leased_n.iter().copied().collect())
            .unwrap_or_default();
        let twice: Vec<u64> = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| **r > 1)
            .map(|(n, _)| n as u64)
            .collect();
        let twice_leased = twice.iter().filter(|n| leased_at_kill.contains(n)).count() as u64;

        // Pickup latencies of first executions, by start offset (seconds since the start).
        let pickups: Vec<(f64, f64)> = e
            .firsts
            .iter()
            .filter(|(_, n)| (*n as usize) < scheduled)
            .filter_map(|(at, n)| {
                let latency = e.pickup_ms(*at, *n)?;
                Some((at.saturating_sub(i.t0) as f64 / 1e6, latency))
            })
            .collect();
        let plan = i.plan;
        let secs = |d: Duration| d.as_secs_f64();
        let mut spans: Vec<(&'static str, f64, f64)> =
            vec![("clean", secs(WARMUP), secs(plan.first_fault()))];
        if let Some((at, hold)) = plan.hold {
            spans.push(("hold", secs(at), secs(at + hold)));
            spans.push(("released", secs(at + hold), secs(at + hold + AFTER_RELEASE)));
        }
        if let Some(at) = plan.kill_at {
            spans.push(("killed", secs(at), secs(at + AFTER_KILL)));
        }
        spans.push(("whole run", 0.0, secs(plan.duration)));
        let mut phases: Vec<Phase> = spans
            .into_iter()
            .map(|(phase, from, to)| {
                let mut window: Vec<f64> = pickups
                    .iter()
                    .filter(|(t, _)| *t >= from && *t < to)
                    .map(|(_, l)| *l)
                    .collect();
                window.sort_by(f64::total_cmp);
                let mut claims = metrics::Buckets::new();
                for s in i.samples.iter().filter(|s| s.t > from && s.t <= to + 0.5) {
                    metrics::add(&mut claims, &s.claims);
                }
                Phase {
                    phase,
                    from_s: from,
                    to_s: to,
                    executions: window.len(),
                    pickup_p50_ms: percentile(&window, 0.50),
                    pickup_p99_ms: percentile(&window, 0.99),
                    pickup_p99_vs_clean: None,
                    claim_p99_ms: metrics::quantile_ms(&claims, 0.99),
                }
            })
            .collect();
        let clean_p99 = phases[0].pickup_p99_ms;
        for p in &mut phases {
            p.pickup_p99_vs_clean = match (p.pickup_p99_ms, clean_p99) {
                (Some(x), Some(c)) if c > 0.0 => Some(x / c),
                _ => None,
            };
        }
        let recovered_after_release_s = plan.hold.and_then(|(at, hold)| {
            let release = secs(at + hold);
            let clean = clean_p99?;
            i.samples
                .iter()
                // Windows that began after the release.
                .filter(|s| s.t - secs(i.opts.sample_every) >= release - 0.5)
                .filter(|s| s.t <= secs(plan.duration) + 0.5)
                .find(|s| {
                    s.pickup_p99_ms
                        .is_some_and(|p| p <= RECOVERED_WITHIN * clean)
                })
                .map(|s| s.t - release)
        });

        let running: Vec<&Sample> = i
            .samples
            .iter()
            .filter(|s| s.t <= secs(plan.duration) + 0.5)
            .collect();
        let at_60 = running.iter().find(|s| s.t >= GROWTH_FROM);
        let clean_end = secs(plan.first_fault()) + 0.5;
        let end_of_clean = running
            .iter()
            .rfind(|s| s.t <= clean_end)
            .filter(|s| s.t >= GROWTH_FROM);
        let end_of_run = running.last();
        let max = i
            .samples
            .iter()
            .max_by_key(|s| s.table_bytes)
            .map(|s| (s.table_bytes, s.t))
            .unwrap_or((0, 0.0));
        let bytes_per_command_after_60s = match (at_60, end_of_run) {
            (Some(a), Some(b)) if b.completed_total > a.completed_total => Some(
                (b.table_bytes - a.table_bytes) as f64
                    / (b.completed_total - a.completed_total) as f64,
            ),
            _ => None,
        };
        let loads: Vec<f64> = i.samples.iter().filter_map(|s| s.load1).collect();
        let table = Growth {
            at_60s: at_60.map(|s| s.table_bytes),
            end_of_clean: end_of_clean.map(|s| s.table_bytes),
            end_of_run: end_of_run.map(|s| s.table_bytes),
            max: max.0,
            max_at_s: max.1,
            bytes_per_command_after_60s,
            history_end_of_run: end_of_run.and_then(|s| s.history_bytes),
            dead_max: i.samples.iter().filter_map(|s| s.dead).max(),
        };
        Report {
            engine: i.engine.name(),
            icq: i.bin.version.clone(),
            replicas: i.opts.icq_replicas,
            rate: i.opts.rate,
            duration_s: secs(plan.duration),
            handler_ms: i.opts.handler_ms,
            settings: i
                .opts
                .icq_settings
                .clone()
                .unwrap_or_else(|| "defaults (no settings: block)".into()),
            hold_at_s: plan.hold.map(|(at, _)| secs(at)),
            hold_for_s: plan.hold.map(|(_, hold)| secs(hold)),
            scheduled: i.scheduled,
            executed,
            lost,
            ran_more_than_once: twice.len() as u64,
            ran_more_than_once_leased_at_kill: twice_leased,
            requests_without_n: e.foreign,
            drained_after_s: i.drained_after_s,
            table,
            phases,
            recovered_after_release_s,
            kill: i.kill,
            claim_metric: i.claim_metric,
            load1_mean: (!loads.is_empty()).then(|| loads.iter().sum::<f64>() / loads.len() as f64),
            load1_max: loads.iter().copied().reduce(f64::max),
            final_counts: i.counts,
            stop_problems: i.stop_problems,
            samples: i.samples,
        }
    }

    /// What makes the run fail: anything lost or left undone, a command run twice that
    /// no crash explains, a replica that did not stop cleanly.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let name = self.engine;
        if self.lost > 0 {
            out.push(format!(
                "{name}: {} scheduled commands never ran",
                self.lost
            ));
        }
        if self.drained_after_s.is_none() {
            out.push(format!("{name}: the backlog did not drain"));
        }
        if self.final_counts.pending > 0 || self.final_counts.dead_lettered > 0 {
            out.push(format!(
                "{name}: {} rows pending and {} dead-lettered at the end",
                self.final_counts.pending, self.final_counts.dead_lettered
            ));
        }
        let unexplained = self.ran_more_than_once - self.ran_more_than_once_leased_at_kill;
        if unexplained > 0 {
            out.push(format!(
                "{name}: {unexplained} commands ran more than once without being leased at a kill"
            ));
        }
        out.extend(self.stop_problems.iter().map(|p| format!("{name}: {p}")));
        out
    }

    pub fn print(&self) {
        println!(
            "\nsustained: {} on {}, {} replicas, {}/s for {:.0} s, handler {} ms, settings: {}",
            self.icq,
            self.engine,
            self.replicas,
            self.rate,
            self.duration_s,
            self.handler_ms,
            self.settings
        );
        let rows: Vec<Vec<String>> = self
            .samples
            .iter()
            .map(|s| {
                vec![
                    format!("{:.0}", s.t),
                    s.phase.to_owned(),
                    format!("{:.0}", s.scheduled_per_s),
                    format!("{:.0}", s.completed_per_s),
                    s.backlog.to_string(),
                    mb(Some(s.table_bytes)),
                    s.dead.map_or_else(|| "-".into(), |d| d.to_string()),
                    mb(s.history_bytes),
                    ms(s.pickup_p50_ms),
                    ms(s.pickup_p99_ms),
                    ms(s.claim_p99_ms),
                    s.load1.map_or_else(|| "-".into(), |l| format!("{l:.1}")),
                ]
            })
            .collect();
        table(
            &[
                "t s",
                "phase",
                "sched/s",
                "done/s",
                "backlog",
                "table MB",
                "dead",
                "hist MB",
                "p50 ms",
                "p99 ms",
                "claim p99",
                "load",
            ],
            &rows,
        );

        println!();
        let phases: Vec<Vec<String>> = self
            .phases
            .iter()
            .map(|p| {
                vec![
                    p.phase.to_owned(),
                    format!("{:.0}-{:.0}", p.from_s, p.to_s),
                    p.executions.to_string(),
                    ms(p.pickup_p50_ms),
                    ms(p.pickup_p99_ms),
                    p.pickup_p99_vs_clean
                        .map_or_else(|| "-".into(), |r| format!("{r:.1}x")),
                    ms(p.claim_p99_ms),
                ]
            })
            .collect();
        table(
            &[
                "phase",
                "s",
                "executions",
                "pickup p50 ms",
                "pickup p99 ms",
                "p99 vs clean",
                "claim p99 ms",
            ],
            &phases,
        );

        let t = &self.table;
        let mut lines = vec![
            ("scheduled", self.scheduled.to_string()),
            ("ran at least once", self.executed.to_string()),
            ("lost", self.lost.to_string()),
            (
                "ran more than once",
                format!(
                    "{} ({} of them leased at the kill)",
                    self.ran_more_than_once, self.ran_more_than_once_leased_at_kill
                ),
            ),
            (
                "drained after stop",
                self.drained_after_s
                    .map_or_else(|| "no".into(), |s| format!("{s:.0} s")),
            ),
            ("table at 60 s", format!("{} MB", mb(t.at_60s))),
            (
                "table at end of clean phase",
                format!("{} MB", mb(t.end_of_clean)),
            ),
            ("table at end of run", format!("{} MB", mb(t.end_of_run))),
            (
                "table max",
                format!("{} MB at {:.0} s", mb(Some(t.max)), t.max_at_s),
            ),
            (
                "growth after 60 s",
                t.bytes_per_command_after_60s.map_or_else(
                    || "-".into(),
                    |b| format!("{b:.0} bytes per completed command"),
                ),
            ),
            (
                "history at end of run",
                format!("{} MB", mb(t.history_end_of_run)),
            ),
            (
                "dead tuples max",
                t.dead_max.map_or_else(|| "-".into(), |d| d.to_string()),
            ),
        ];
        if self.hold_at_s.is_some() {
            lines.push((
                "pickup p99 back within 1.5x of clean",
                self.recovered_after_release_s.map_or_else(
                    || "not before the end".into(),
                    |s| format!("{s:.0} s after the release (window end)"),
                ),
            ));
        }
        if let Some(k) = &self.kill {
            lines.push((
                "kill",
                format!(
                    "replica {} at {:.0} s: {} rows leased, {} still pending 5 s later, all completed after {}",
                    k.replica,
                    k.at_s,
                    k.leased,
                    k.pending_after_5s.map_or_else(|| "-".into(), |n| n.to_string()),
                    k.rescued_after_s
                        .map_or_else(|| "never (in the run)".into(), |s| format!("{s:.1} s")),
                ),
            ));
        }
        lines.push((
            "claim p99",
            match &self.claim_metric {
                Some(name) => format!("from {name} (bucket upper bounds)"),
                None => "icq exposes no claim duration: pickup latency stands in".into(),
            },
        ));
        lines.push((
            "load (1 min)",
            format!(
                "mean {}, max {}",
                self.load1_mean
                    .map_or_else(|| "-".into(), |l| format!("{l:.1}")),
                self.load1_max
                    .map_or_else(|| "-".into(), |l| format!("{l:.1}"))
            ),
        ));
        lines.push((
            "final rows",
            format!(
                "{} in the table ({} completed, {} pending, {} dead), {} in history",
                self.final_counts.rows,
                self.final_counts.completed,
                self.final_counts.pending,
                self.final_counts.dead_lettered,
                self.final_counts
                    .history_rows
                    .map_or_else(|| "no table".into(), |n| n.to_string()),
            ),
        ));
        println!();
        let rows: Vec<Vec<String>> = lines
            .into_iter()
            .map(|(k, v)| vec![k.to_owned(), v])
            .collect();
        table(&["", "value"], &rows);
    }
}

fn table(header: &[&str], rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{s:<w$}", w = widths[i]))
            .collect();
        println!("| {} |", parts.join(" | "));
    };
    line(header.iter().map(|h| (*h).to_owned()).collect());
    println!(
        "|{}|",
        widths
            .iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in rows {
        line(r.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
