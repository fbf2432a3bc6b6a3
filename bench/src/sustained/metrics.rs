//! Claim duration from the replicas' Prometheus endpoints (`icq work --metrics-addr`),
//! when icq exposes one: the first histogram whose name holds `claim` and ends in
//! `_seconds`. Each scrape's buckets minus the previous scrape's give that window's claims;
//! a build without such a histogram leaves every window empty, and the report says the
//! pickup latency stands in for it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Cumulative counts by upper bound (`le`, in nanoseconds; `u64::MAX` for `+Inf`).
pub type Buckets = BTreeMap<u64, f64>;

/// Scrapes every replica and keeps what each answered last.
pub struct Scraper {
    addrs: Vec<SocketAddr>,
    previous: Vec<Option<Buckets>>,
    /// Per replica: `claimed_total` at the last scrape and its increase since the one before.
    claimed: Vec<(f64, f64)>,
    /// The histogram found, once one is.
    pub name: Option<String>,
}

impl Scraper {
    pub fn new(addrs: Vec<SocketAddr>) -> Self {
        let previous = vec![None; addrs.len()];
        let claimed = vec![(0.0, 0.0); addrs.len()];
        Self {
            addrs,
            previous,
            claimed,
            name: None,
        }
    }

    /// Whether replica `i` answers on its metrics endpoint.
    pub async fn answers(&self, i: usize) -> bool {
        fetch(self.addrs[i]).await.is_some()
    }

    /// The claims since the last call, summed over the replicas in `live` (a killed
    /// replica's series end with it).
    pub async fn window(&mut self, live: &[bool]) -> Buckets {
        let mut sum = Buckets::new();
        for (i, addr) in self.addrs.iter().enumerate() {
            if !live[i] {
                continue;
            }
            let Some(text) = fetch(*addr).await else {
                continue;
            };
            let claimed = counter(&text, "icq_internal_commands_claimed_total");
            self.claimed[i] = (claimed, claimed - self.claimed[i].0);
            let Some((name, now)) = claim_buckets(&text) else {
                continue;
            };
            self.name.get_or_insert(name);
            if let Some(before) = &self.previous[i] {
                for (le, count) in &now {
                    let delta = count - before.get(le).copied().unwrap_or(0.0);
                    *sum.entry(*le).or_default() += delta.max(0.0);
                }
            }
            self.previous[i] = Some(now);
        }
        sum
    }
}

impl Scraper {
    /// The live replica that claimed the most rows in the last window (the likeliest to
    /// hold leased rows right now).
    pub fn busiest(&self, live: &[bool]) -> Option<usize> {
        (0..self.addrs.len())
            .filter(|i| live[*i])
            .max_by(|a, b| self.claimed[*a].1.total_cmp(&self.claimed[*b].1))
    }
}

impl Scraper {
    /// The live replica holding the most claimed-but-unfinished rows right now, by its
    /// counters (claimed minus every outcome), with that count.
    pub async fn holding_most(&self, live: &[bool]) -> Option<(usize, f64)> {
        let mut best: Option<(usize, f64)> = None;
        for (i, addr) in self.addrs.iter().enumerate() {
            if !live[i] {
                continue;
            }
            let Some(text) = fetch(*addr).await else {
                continue;
            };
            let outcomes: f64 = [
                "succeeded_total",
                "failed_total",
                "dead_lettered_total",
                "snoozed_total",
                "stale_stamps_total",
            ]
            .iter()
            .map(|series| counter(&text, &format!("icq_internal_commands_{series}")))
            .sum();
            let held = counter(&text, "icq_internal_commands_claimed_total") - outcomes;
            if best.is_none_or(|(_, most)| held > most) {
                best = Some((i, held));
            }
        }
        best
    }
}

/// The sum of a counter's series over its labels.
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum()
}

/// Adds `other` into `into`.
pub fn add(into: &mut Buckets, other: &Buckets) {
    for (le, count) in other {
        *into.entry(*le).or_default() += count;
    }
}

/// The `q` quantile's bucket upper bound in milliseconds (`None` without observations).
pub fn quantile_ms(buckets: &Buckets, q: f64) -> Option<f64> {
    let total = *buckets.get(&u64::MAX)?;
    if total <= 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, count)| **count >= q * total)
        .map(|(le, _)| {
            if *le == u64::MAX {
                f64::INFINITY
            } else {
                *le as f64 / 1e6
            }
        })
}

async fn fetch(addr: SocketAddr) -> Option<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200")
            .then(|| body.to_owned())
            .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_owned()))
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}

/// The first `*claim*_seconds` histogram in a Prometheus text exposition, its buckets
/// summed over every other label.
fn claim_buckets(text: &str) -> Option<(String, Buckets)> {
    let mut name: Option<&str> = None;
    let mut buckets = Buckets::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let metric = series.split('{').next().unwrap_or(series);
        let Some(family) = metric.strip_suffix("_bucket") else {
            continue;
        };
        if !(family.contains("claim") && family.ends_with("_seconds")) {
            continue;
        }
        if *name.get_or_insert(family) != family {
            continue;
        }
        let Some(le) = series
            .split("le=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        let key = if le == "+Inf" {
            u64::MAX
        } else {
            match le.parse::<f64>() {
                Ok(seconds) => (seconds * 1e9).round() as u64,
                Err(_) => continue,
            }
        };
        if let Ok(count) = value.trim().parse::<f64>() {
            *buckets.entry(key).or_default() += count;
        }
    }
    name.map(|n| (n.to_owned(), buckets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_claim_histogram_and_its_quantile() {
        let text = "# TYPE icq_claim_seconds histogram\n\
            icq_claim_seconds_bucket{source=\"a\",le=\"0.001\"} 90\n\
            icq_claim_seconds_bucket{source=\"a\",le=\"0.01\"} 99\n\
            icq_claim_seconds_bucket{source=\"a\",le=\"+Inf\"} 100\n\
            icq_internal_commands_claimed_total{source=\"a\"} 5\n";
        let (name, b) = claim_buckets(text).unwrap();
        assert_eq!(name, "icq_claim_seconds");
        assert_eq!(quantile_ms(&b, 0.5), Some(1.0));
        assert_eq!(quantile_ms(&b, 0.99), Some(10.0));
        assert!(
            claim_buckets("icq_internal_commands_execution_seconds_bucket{le=\"1\"} 3\n").is_none()
        );
        assert_eq!(counter(text, "icq_internal_commands_claimed_total"), 5.0);
    }
}
