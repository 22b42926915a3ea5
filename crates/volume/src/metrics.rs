//! Per-volume I/O counters and latency histograms, rendered in the
//! Prometheus text exposition format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use strata_disk::WriteTimes;

/// Upper bounds of the latency buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// A latency histogram with fixed buckets (lock-free).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Appends the histogram's lines for `name{labels}`.
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cumulative}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// Kinds of I/O counted per volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Reads.
    Read,
    /// Writes (data and zeroes).
    Write,
    /// Flushes.
    Flush,
    /// Discards.
    Discard,
}

impl Op {
    const ALL: [Op; 4] = [Op::Read, Op::Write, Op::Flush, Op::Discard];

    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
        }
    }
}

/// I/O statistics of one volume.
#[derive(Debug, Default)]
pub struct VolumeStats {
    latency: [Histogram; 4],
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
    snapshots: AtomicU64,
    last_pause_ns: AtomicU64,
    /// Time I/O was held back by snapshots and resizes.
    pub pauses: Histogram,
    /// Compaction of this volume.
    pub compaction: CompactionStats,
}

/// Compaction counters of one volume.
#[derive(Debug, Default)]
pub struct CompactionStats {
    running: AtomicU64,
    /// Fraction done of the current run, as `f64` bits.
    progress_bits: AtomicU64,
    bytes: AtomicU64,
    run_bytes: AtomicU64,
    layers_removed: AtomicU64,
    /// Time I/O was held back while merged layers were spliced in.
    pub pauses: Histogram,
}

impl CompactionStats {
    /// A compaction started.
    pub fn start(&self) {
        self.running.store(1, Ordering::Relaxed);
        self.set_progress(0.0);
        self.run_bytes.store(0, Ordering::Relaxed);
    }

    /// Progress of the run being merged: `fraction` of the disk looked at,
    /// `copied` bytes written into the merged layer so far.
    pub fn progress(&self, fraction: f64, copied: u64) {
        self.set_progress(fraction);
        self.run_bytes.store(copied, Ordering::Relaxed);
    }

    /// A run finished copying `bytes`.
    pub fn add_bytes(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.run_bytes.store(0, Ordering::Relaxed);
    }

    /// Records the I/O pause of one splice.
    pub fn record_pause(&self, pause: Duration) {
        self.pauses.observe(pause);
    }

    /// Counts layers removed from the chain.
    pub fn add_layers_removed(&self, layers: u64) {
        self.layers_removed.fetch_add(layers, Ordering::Relaxed);
    }

    /// The compaction ended, `progress` done.
    pub fn finish(&self, progress: f64) {
        self.running.store(0, Ordering::Relaxed);
        self.set_progress(progress);
    }

    fn set_progress(&self, fraction: f64) {
        self.progress_bits
            .store(fraction.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
    }

    fn progress_value(&self) -> f64 {
        f64::from_bits(self.progress_bits.load(Ordering::Relaxed))
    }

    fn bytes_total(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed) + self.run_bytes.load(Ordering::Relaxed)
    }
}

impl VolumeStats {
    /// Records one request.
    pub fn record(&self, op: Op, bytes: u64, took: Duration, ok: bool) {
        self.latency[op as usize].observe(took);
        match op {
            Op::Read => self.bytes_read.fetch_add(bytes, Ordering::Relaxed),
            Op::Write => self.bytes_written.fetch_add(bytes, Ordering::Relaxed),
            _ => 0,
        };
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records the I/O pause of a snapshot (or other top switch).
    pub fn record_pause(&self, pause: Duration, snapshot: bool) {
        self.pauses.observe(pause);
        self.last_pause_ns
            .store(pause.as_nanos() as u64, Ordering::Relaxed);
        if snapshot {
            self.snapshots.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The last pause, if any.
    pub fn last_pause(&self) -> Option<Duration> {
        match self.last_pause_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }
}

/// What `/metrics` shows of one volume besides its I/O statistics.
#[derive(Debug, Clone)]
pub struct VolumeGauges {
    /// Volume name.
    pub name: String,
    /// Layers in its chain.
    pub chain_length: u32,
    /// Size in bytes.
    pub size: u64,
    /// Metadata cache hits and misses.
    pub cache_hits: u64,
    /// Metadata cache misses.
    pub cache_misses: u64,
    /// Layers snapshots froze whose writes are not durable yet.
    pub frozen_layers: usize,
    /// Guest writes that overwrote in place or allocated, and their times.
    pub writes: WriteTimes,
}

/// Appends the catalog's durable commits (each one sync of its database,
/// shared by the changes committed meanwhile) to `out`.
pub fn render_catalog(out: &mut String, syncs: u64) {
    let name = "strata_catalog_syncs_total";
    let _ = writeln!(
        out,
        "# HELP {name} Durable commits of the pool's catalog (changes made at once share one).\n\
         # TYPE {name} counter\n{name} {syncs}"
    );
}

/// Renders every volume's metrics in the Prometheus text format.
pub fn render(volumes: &[(VolumeGauges, &VolumeStats)]) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, body: &dyn Fn(&mut String)| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        body(&mut out);
    };
    family("strata_volumes", "gauge", "Volumes in the pool.", &|o| {
        let _ = writeln!(o, "strata_volumes {}", volumes.len());
    });
    let counter = |o: &mut String, name: &str, v: &dyn Fn(&VolumeGauges, &VolumeStats) -> f64| {
        for (g, s) in volumes {
            let _ = writeln!(o, "{name}{{volume=\"{}\"}} {}", g.name, v(g, s));
        }
    };
    family(
        "strata_volume_ops_total",
        "counter",
        "Requests served, by operation.",
        &|o| {
            for (g, s) in volumes {
                for op in Op::ALL {
                    let n = s.latency[op as usize].count();
                    let _ = writeln!(
                        o,
                        "strata_volume_ops_total{{volume=\"{}\",op=\"{}\"}} {n}",
                        g.name,
                        op.name()
                    );
                }
            }
        },
    );
    family(
        "strata_volume_read_bytes_total",
        "counter",
        "Bytes read.",
        &|o| {
            counter(o, "strata_volume_read_bytes_total", &|_, s| {
                s.bytes_read.load(Ordering::Relaxed) as f64
            })
        },
    );
    family(
        "strata_volume_written_bytes_total",
        "counter",
        "Bytes written.",
        &|o| {
            counter(o, "strata_volume_written_bytes_total", &|_, s| {
                s.bytes_written.load(Ordering::Relaxed) as f64
            })
        },
    );
    family(
        "strata_volume_cluster_writes_total",
        "counter",
        "Guest writes into the top layer, by kind: in_place overwrote clusters it owned, \
         allocating allocated (after a snapshot, the first write to each cluster does).",
        &|o| write_kinds(o, volumes, "strata_volume_cluster_writes_total", false),
    );
    family(
        "strata_volume_cluster_write_seconds_total",
        "counter",
        "Time spent in guest writes into the top layer, by kind.",
        &|o| {
            write_kinds(
                o,
                volumes,
                "strata_volume_cluster_write_seconds_total",
                true,
            )
        },
    );
    family(
        "strata_volume_errors_total",
        "counter",
        "Requests that failed.",
        &|o| {
            counter(o, "strata_volume_errors_total", &|_, s| {
                s.errors.load(Ordering::Relaxed) as f64
            })
        },
    );
    family(
        "strata_volume_op_latency_seconds",
        "histogram",
        "Request latency, by operation.",
        &|o| {
            for (g, s) in volumes {
                for op in Op::ALL {
                    let labels = format!("volume=\"{}\",op=\"{}\"", g.name, op.name());
                    s.latency[op as usize].render(o, "strata_volume_op_latency_seconds", &labels);
                }
            }
        },
    );
    family(
        "strata_volume_snapshot_pause_seconds",
        "histogram",
        "Time I/O was held back while the top layer was switched (snapshot, resize).",
        &|o| {
            for (g, s) in volumes {
                let labels = format!("volume=\"{}\"", g.name);
                s.pauses
                    .render(o, "strata_volume_snapshot_pause_seconds", &labels);
            }
        },
    );
    family(
        "strata_volume_snapshots_total",
        "counter",
        "Snapshots taken since the daemon started.",
        &|o| {
            counter(o, "strata_volume_snapshots_total", &|_, s| {
                s.snapshots.load(Ordering::Relaxed) as f64
            })
        },
    );
    family(
        "strata_volume_compaction_running",
        "gauge",
        "1 while the volume's chain is being compacted.",
        &|o| {
            counter(o, "strata_volume_compaction_running", &|_, s| {
                s.compaction.running.load(Ordering::Relaxed) as f64
            })
        },
    );
    family(
        "strata_volume_compaction_progress_ratio",
        "gauge",
        "Fraction done of the current (or last) compaction, 0 to 1.",
        &|o| {
            counter(o, "strata_volume_compaction_progress_ratio", &|_, s| {
                s.compaction.progress_value()
            })
        },
    );
    family(
        "strata_volume_compaction_bytes_total",
        "counter",
        "Bytes copied into merged layers by compaction.",
        &|o| {
            counter(o, "strata_volume_compaction_bytes_total", &|_, s| {
                s.compaction.bytes_total() as f64
            })
        },
    );
    family(
        "strata_volume_compaction_layers_removed_total",
        "counter",
        "Layers removed from the chain by compaction.",
        &|o| {
            counter(
                o,
                "strata_volume_compaction_layers_removed_total",
                &|_, s| s.compaction.layers_removed.load(Ordering::Relaxed) as f64,
            )
        },
    );
    family(
        "strata_volume_compaction_pause_seconds",
        "histogram",
        "Time I/O was held back while a merged layer was spliced into the chain.",
        &|o| {
            for (g, s) in volumes {
                let labels = format!("volume=\"{}\"", g.name);
                s.compaction
                    .pauses
                    .render(o, "strata_volume_compaction_pause_seconds", &labels);
            }
        },
    );
    family(
        "strata_volume_cache_hit_ratio",
        "gauge",
        "Hit ratio of the volume's metadata cache (0 before any lookup).",
        &|o| {
            counter(o, "strata_volume_cache_hit_ratio", &|g, _| {
                let total = g.cache_hits + g.cache_misses;
                if total == 0 {
                    0.0
                } else {
                    g.cache_hits as f64 / total as f64
                }
            })
        },
    );
    family(
        "strata_volume_chain_length",
        "gauge",
        "Layers in the volume's chain.",
        &|o| {
            counter(o, "strata_volume_chain_length", &|g, _| {
                f64::from(g.chain_length)
            })
        },
    );
    family(
        "strata_volume_frozen_layers",
        "gauge",
        "Layers snapshots froze that wait for a flush to be durable.",
        &|o| {
            counter(o, "strata_volume_frozen_layers", &|g, _| {
                g.frozen_layers as f64
            })
        },
    );
    family(
        "strata_volume_size_bytes",
        "gauge",
        "Virtual size of the volume.",
        &|o| counter(o, "strata_volume_size_bytes", &|g, _| g.size as f64),
    );
    out
}

/// One line per volume and kind of write: the count, or (`seconds`) the
/// time summed.
fn write_kinds(
    out: &mut String,
    volumes: &[(VolumeGauges, &VolumeStats)],
    name: &str,
    seconds: bool,
) {
    for (g, _) in volumes {
        let w = &g.writes;
        for (kind, count, time) in [
            ("in_place", w.in_place, w.in_place_time),
            ("allocating", w.allocating, w.allocating_time),
        ] {
            let value = if seconds {
                time.as_secs_f64()
            } else {
                count as f64
            };
            let _ = writeln!(
                out,
                "{name}{{volume=\"{}\",kind=\"{kind}\"}} {value}",
                g.name
            );
        }
    }
}
