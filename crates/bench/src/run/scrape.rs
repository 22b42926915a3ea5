//! The provider's metrics scraped while the run measures: one scrape at
//! the start and then every `outputs.metrics_every`, each series a line of
//! `metrics.jsonl` with its time since the run's start. The daemon the
//! provider started, if any, adds its CPU time and memory to each scrape
//! ([`crate::daemon_usage`]).

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Event, Run, POLL};
use crate::daemon_usage::Usage;
use crate::metrics::{parse_exposition, MAX_METRIC_LINES, METRICS_SERIES};
use crate::record::LineWriter;

impl Run<'_> {
    /// Scrapes until the run ends; a provider without metrics and without
    /// a daemon of its own writes no file. Failed scrapes are counted and
    /// told once, and never stop the run; past [`MAX_METRIC_LINES`]
    /// scraping stops.
    pub(super) fn scrape_metrics(&self) {
        // Made at the first scrape that answers: a provider without
        // metrics leaves no empty file.
        let mut writer: Option<LineWriter> = None;
        let mut written: u64 = 0;
        let mut failures: u64 = 0;
        let mut next = Instant::now();
        while !self.ending.load(Ordering::SeqCst) && !self.stop.load(Ordering::SeqCst) {
            if Instant::now() < next {
                std::thread::sleep(POLL.min(next - Instant::now()));
                continue;
            }
            // A scrape slower than the interval is followed by the next at
            // once, not by a burst of the ones it overran.
            next = (next + self.spec.metrics_every).max(Instant::now());
            let time = self.seconds(Instant::now());
            let daemon = self.provider.daemon_pid();
            let mut text = match self.provider.metrics() {
                Some(Ok(text)) => text,
                Some(Err(e)) => {
                    failures += 1;
                    if failures == 1 {
                        (self.events)(Event::Warning(format!(
                            "cannot scrape the provider's metrics (counted, the run goes on): {e}"
                        )));
                    }
                    continue;
                }
                None if daemon.is_none() => return,
                None => String::new(),
            };
            // The daemon's own CPU time and memory, for every provider
            // that started one (a daemon gone between the two reads
            // leaves this scrape without them).
            if let Some(usage) = daemon.and_then(|pid| Usage::of(pid).ok()) {
                text.push_str(&usage.exposition());
            }
            if writer.is_none() {
                match LineWriter::create(self.dir.join(METRICS_SERIES)) {
                    Ok(created) => writer = Some(created),
                    Err(e) => {
                        return (self.events)(Event::Warning(format!("no metrics kept: {e}")))
                    }
                }
            }
            let Some(writer) = &writer else { return };
            for sample in parse_exposition(&text, time) {
                if written == MAX_METRIC_LINES {
                    (self.events)(Event::Warning(format!(
                        "{METRICS_SERIES} holds {MAX_METRIC_LINES} lines: no more metrics are kept (scrape less often with `outputs: {{metrics_every: 5s}}`)"
                    )));
                    return;
                }
                if let Err(e) = writer.append(&sample) {
                    return (self.events)(Event::Warning(format!("no more metrics kept: {e}")));
                }
                written += 1;
            }
        }
        if failures > 0 {
            (self.events)(Event::Warning(format!(
                "{failures} scrape(s) of the provider's metrics failed"
            )));
        }
    }
}
