//! A live progress line for processor runs, on a terminal only (stderr): how many
//! commands have succeeded, failed and been dead-lettered so far.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use icq::Stats;

/// A progress display that updates itself until [`RunProgress::finish`].
pub struct RunProgress {
    bar: Option<ProgressBar>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RunProgress {
    /// Starts showing the counters of `stats` (summed); `total` gives a bar, `None` a
    /// spinner. Shows nothing when stderr is not a terminal.
    pub fn start(stats: Vec<Arc<Stats>>, total: Option<u64>) -> RunProgress {
        if !std::io::stderr().is_terminal() {
            return RunProgress {
                bar: None,
                task: None,
            };
        }
        let bar = match total {
            Some(total) => ProgressBar::new(total).with_style(
                ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            ),
            None => ProgressBar::new_spinner().with_style(
                ProgressStyle::with_template("{spinner} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            ),
        };
        bar.enable_steady_tick(Duration::from_millis(120));
        let shown = bar.clone();
        let task = tokio::spawn(async move {
            loop {
                let (mut ok, mut failed, mut dead) = (0, 0, 0);
                for s in &stats {
                    let snap = s.snapshot();
                    ok += snap.succeeded;
                    failed += snap.failed;
                    dead += snap.dead_lettered;
                }
                shown.set_position(ok + dead);
                shown.set_message(format!(
                    "{ok} succeeded, {failed} retried, {dead} dead-lettered"
                ));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        RunProgress {
            bar: Some(bar),
            task: Some(task),
        }
    }

    /// Stops updating and clears the line.
    pub fn finish(self) {
        if let Some(task) = self.task {
            task.abort();
        }
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
