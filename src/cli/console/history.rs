//! What the overview's charts draw: the counts of every source, sampled every
//! [`SAMPLE_EVERY`] while someone watches and kept for [`WINDOW`] (the console keeps no
//! state in the database: a console started a minute ago shows a minute of history).
//! Throughput is the growth of the completed count between two samples, per minute;
//! backlog is due + scheduled at each sample. Where samples are missing (nobody watched,
//! or the database did not answer) the line breaks instead of drawing a slope across the
//! gap. Charts are inline SVG drawn here: no script, no chart library.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::html::Html;
use super::snapshot::SAMPLE_EVERY;

/// A point that is no value: the line breaks there.
const BREAK: f64 = f64::NAN;

/// How much history the charts show.
pub const WINDOW: Duration = Duration::from_secs(3600);

/// One source's figures at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    /// Completed rows (a running total; a purge can lower it).
    pub completed: u64,
    /// Due + scheduled.
    pub backlog: u64,
}

/// The samples of the last [`WINDOW`].
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<(DateTime<Utc>, BTreeMap<String, Figures>)>,
    /// How far apart the sampler means to take samples (it spaces out slow counts).
    spacing: Option<Duration>,
}

/// A chart's series: a name and its (time, value) points.
pub type Series = (String, Vec<(DateTime<Utc>, f64)>);

impl History {
    /// Records a sample taken at `at`, dropping what fell out of the window.
    pub fn record(&mut self, at: DateTime<Utc>, figures: BTreeMap<String, Figures>) {
        self.samples.push_back((at, figures));
        let window = chrono::Duration::from_std(WINDOW).unwrap_or(chrono::Duration::hours(1));
        while self
            .samples
            .front()
            .is_some_and(|(first, _)| at - *first > window)
        {
            self.samples.pop_front();
        }
    }

    /// Sets how far apart the next samples are meant to be.
    pub fn set_spacing(&mut self, spacing: Duration) {
        self.spacing = Some(spacing);
    }

    /// Two samples further apart than this have a gap between them: the line breaks.
    fn gap(&self) -> chrono::Duration {
        let every = self.spacing.unwrap_or(SAMPLE_EVERY).max(SAMPLE_EVERY);
        chrono::Duration::from_std(every * 3).unwrap_or(chrono::Duration::seconds(15))
    }

    /// Completed commands per minute for each source, between consecutive samples; a
    /// [`BREAK`] where samples are missing.
    pub fn throughput(&self) -> Vec<Series> {
        let mut series: BTreeMap<String, Vec<(DateTime<Utc>, f64)>> = BTreeMap::new();
        for pair in self.samples.iter().collect::<Vec<_>>().windows(2) {
            let [(before, old), (at, new)] = pair else {
                continue;
            };
            let seconds = (*at - *before).num_milliseconds() as f64 / 1000.0;
            if seconds <= 0.0 {
                continue;
            }
            if *at - *before > self.gap() {
                for source in new.keys() {
                    series.entry(source.clone()).or_default().push((*at, BREAK));
                }
                continue;
            }
            for (source, figures) in new {
                let Some(previous) = old.get(source) else {
                    continue;
                };
                let done = figures.completed.saturating_sub(previous.completed) as f64;
                series
                    .entry(source.clone())
                    .or_default()
                    .push((*at, done * 60.0 / seconds));
            }
        }
        series.into_iter().collect()
    }

    /// Due + scheduled for each source at each sample; a [`BREAK`] where samples are
    /// missing.
    pub fn backlog(&self) -> Vec<Series> {
        let mut series: BTreeMap<String, Vec<(DateTime<Utc>, f64)>> = BTreeMap::new();
        let mut previous: Option<DateTime<Utc>> = None;
        for (at, figures) in &self.samples {
            let gap = previous.is_some_and(|p| *at - p > self.gap());
            previous = Some(*at);
            for (source, f) in figures {
                let points = series.entry(source.clone()).or_default();
                if gap {
                    points.push((*at, BREAK));
                }
                points.push((*at, f.backlog as f64));
            }
        }
        series.into_iter().collect()
    }
}

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 180.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 26.0;
const COLORS: [&str; 6] = [
    "#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2",
];

/// A line chart of `series` up to `now`, as inline SVG (with a `<title>` for screen
/// readers and each series' last value in a legend). The time axis covers what was
/// sampled: from the first sample (at least two minutes back) to the whole [`WINDOW`].
pub fn chart(
    title: &'static str,
    unit: &'static str,
    series: &[Series],
    now: DateTime<Utc>,
) -> Html {
    let window = chrono::Duration::from_std(WINDOW).unwrap_or(chrono::Duration::hours(1));
    let first = series
        .iter()
        .filter_map(|(_, points)| points.first().map(|(at, _)| *at))
        .min()
        .unwrap_or(now);
    let start = (now - window).max(first.min(now - chrono::Duration::minutes(2)));
    let span = (now - start).num_milliseconds().max(1) as f64;
    let peak = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|(_, v)| *v))
        .fold(0.0_f64, f64::max);
    let top = nice_ceiling(peak);
    let x = |at: DateTime<Utc>| {
        let offset = (at - start).num_milliseconds().clamp(0, span as i64) as f64;
        LEFT + offset / span * (WIDTH - LEFT - RIGHT)
    };
    let y = |v: f64| TOP + (1.0 - v / top) * (HEIGHT - TOP - BOTTOM);

    let mut svg = Html::new();
    svg.raw("<figure class=\"chart\"><figcaption>")
        .text(title)
        .raw("</figcaption><svg viewBox=\"0 0 640 180\" role=\"img\" xmlns=\"http://www.w3.org/2000/svg\"><title>")
        .text(title)
        .raw("</title>");
    // Grid: zero, half and top lines with their values.
    for fraction in [0.0, 0.5, 1.0] {
        let value = top * fraction;
        svg.raw("<line class=\"grid\" x1=\"")
            .text(LEFT)
            .raw("\" x2=\"")
            .text(WIDTH - RIGHT)
            .raw("\" y1=\"")
            .text(format!("{:.1}", y(value)))
            .raw("\" y2=\"")
            .text(format!("{:.1}", y(value)))
            .raw("\"/><text class=\"tick\" x=\"")
            .text(LEFT - 6.0)
            .raw("\" y=\"")
            .text(format!("{:.1}", y(value) + 4.0))
            .raw("\" text-anchor=\"end\">")
            .text(short_number(value))
            .raw("</text>");
    }
    let half = (now - start) / 2;
    for (label, at) in [
        (ago(now - start), start),
        (ago(half), now - half),
        ("now".to_owned(), now),
    ] {
        svg.raw("<text class=\"tick\" x=\"")
            .text(format!("{:.1}", x(at)))
            .raw("\" y=\"")
            .text(HEIGHT - 6.0)
            .raw("\" text-anchor=\"middle\">")
            .text(label)
            .raw("</text>");
    }
    for (index, (_, points)) in series.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        for run in runs(points.iter().filter(|(at, _)| *at >= start)) {
            let coordinates: Vec<String> = run
                .iter()
                .map(|(at, v)| format!("{:.1},{:.1}", x(*at), y(*v)))
                .collect();
            if let [only] = coordinates.as_slice() {
                let (cx, cy) = only.split_once(',').unwrap_or(("0", "0"));
                svg.raw("<circle r=\"3\" cx=\"")
                    .text(cx)
                    .raw("\" cy=\"")
                    .text(cy)
                    .raw("\" fill=\"")
                    .text(color)
                    .raw("\"/>");
            } else {
                svg.raw("<polyline fill=\"none\" stroke-width=\"2\" stroke=\"")
                    .text(color)
                    .raw("\" points=\"")
                    .text(coordinates.join(" "))
                    .raw("\"/>");
            }
        }
    }
    svg.raw("</svg><ul class=\"legend\">");
    if series.is_empty() {
        svg.raw("<li>no samples yet (one every few seconds while the console is watched)</li>");
    }
    for (index, (name, points)) in series.iter().enumerate() {
        svg.raw("<li><svg class=\"swatch\" viewBox=\"0 0 10 10\"><rect width=\"10\" height=\"10\" fill=\"")
            .text(COLORS[index % COLORS.len()])
            .raw("\"/></svg> ")
            .text(name)
            .raw(": ")
            .text(
                points
                    .iter()
                    .rev()
                    .find(|(_, v)| !v.is_nan())
                    .map_or_else(|| "-".into(), |(_, v)| short_number(*v)),
            )
            .raw(" ")
            .text(unit)
            .raw("</li>");
    }
    svg.raw("</ul></figure>");
    svg
}

/// The points split at each [`BREAK`].
fn runs<'a>(
    points: impl Iterator<Item = &'a (DateTime<Utc>, f64)>,
) -> Vec<Vec<(DateTime<Utc>, f64)>> {
    let mut runs: Vec<Vec<(DateTime<Utc>, f64)>> = vec![Vec::new()];
    for &(at, value) in points {
        if value.is_nan() {
            runs.push(Vec::new());
        } else if let Some(run) = runs.last_mut() {
            run.push((at, value));
        }
    }
    runs.retain(|run| !run.is_empty());
    runs
}

/// An axis label for a time before now: `-90 s`, `-12 min`.
fn ago(span: chrono::Duration) -> String {
    let seconds = span.num_seconds();
    if seconds < 120 {
        format!("-{seconds} s")
    } else {
        format!("-{} min", (seconds + 30) / 60)
    }
}

/// The smallest of 1, 2, 5 × 10ⁿ at or above `value` (at least 1).
fn nice_ceiling(value: f64) -> f64 {
    if value <= 1.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|candidate| *candidate >= value)
        .unwrap_or(10.0 * magnitude)
}

/// A chart label: `12`, `3.5`, `12k`, `1.2M`.
fn short_number(value: f64) -> String {
    if value >= 1_000_000.0 {
        format!("{:.1}M", value / 1_000_000.0)
    } else if value >= 10_000.0 {
        format!("{:.0}k", value / 1000.0)
    } else if value.fract() == 0.0 || value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(completed: u64, backlog: u64) -> BTreeMap<String, Figures> {
        BTreeMap::from([("shop".to_string(), Figures { completed, backlog })])
    }

    #[test]
    fn throughput_is_completed_growth_per_minute_and_never_negative() {
        let t0 = Utc::now();
        let mut history = History::default();
        history.record(t0, figures(10, 5));
        history.record(t0 + chrono::Duration::seconds(5), figures(20, 3));
        history.record(t0 + chrono::Duration::seconds(10), figures(0, 0)); // purged
        let throughput = history.throughput();
        let values: Vec<f64> = throughput[0].1.iter().map(|(_, v)| *v).collect();
        assert_eq!(values, [120.0, 0.0]);
        let backlog: Vec<f64> = history.backlog()[0].1.iter().map(|(_, v)| *v).collect();
        assert_eq!(backlog, [5.0, 3.0, 0.0]);
    }

    #[test]
    fn old_samples_leave_the_window() {
        let t0 = Utc::now();
        let mut history = History::default();
        history.record(t0, figures(1, 1));
        history.record(t0 + chrono::Duration::minutes(61), figures(2, 2));
        assert_eq!(history.backlog()[0].1.len(), 1);
    }

    #[test]
    fn a_gap_in_the_samples_breaks_the_line() {
        let t0 = Utc::now() - chrono::Duration::minutes(20);
        let mut history = History::default();
        for (second, backlog) in [(0, 5), (5, 6), (600, 100), (605, 101)] {
            history.record(
                t0 + chrono::Duration::seconds(second),
                figures(backlog, backlog),
            );
        }
        let now = t0 + chrono::Duration::minutes(11);
        let svg = chart("Backlog", "commands", &history.backlog(), now).into_string();
        assert_eq!(
            svg.matches("<polyline").count(),
            2,
            "two runs, no slope across the stall: {svg}"
        );
        let throughput = history.throughput();
        let rates: Vec<f64> = throughput[0].1.iter().map(|(_, v)| *v).collect();
        assert!(
            rates.len() == 3 && rates[1].is_nan(),
            "no rate across the gap: {rates:?}"
        );
        // A sampler that spaces its counts out draws them as one line.
        history.set_spacing(Duration::from_secs(600));
        let svg = chart("Backlog", "commands", &history.backlog(), now).into_string();
        assert_eq!(svg.matches("<polyline").count(), 1, "{svg}");
    }

    #[test]
    fn charts_escape_source_names_and_scale() {
        let now = Utc::now();
        let series = vec![("<b>".to_string(), vec![(now, 7.0)])];
        let svg = chart("Backlog", "commands", &series, now).into_string();
        assert!(svg.contains("&lt;b&gt;: 7 commands"), "{svg}");
        assert!(!svg.contains("<b>"));
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(120.0), 200.0);
    }
}
