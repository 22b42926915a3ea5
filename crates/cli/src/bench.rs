//! `strata bench ...`: declarative benchmarks that mix I/O workloads with
//! control operations (strata-bench): parse, call, render.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use strata_bench::parallelism;
use strata_bench::record::Status;
use strata_bench::report::{self, Summary};
use strata_bench::run::{self, Event, ProviderChoice, RunOptions};
use strata_bench::spec::{self, Attach, RateLaw, Spec, WorkloadKind};

use crate::units::human;
use crate::volume::Output;

/// `strata bench` subcommands.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Run a spec: make its volumes, run its workloads and control
    /// operations for its duration, record every operation, then delete
    /// everything the run made (also on Ctrl-C).
    Run(RunArgs),
    /// Summarize a run directory: latency percentiles per operation,
    /// operations per minute, I/O per workload and its zero-operation
    /// seconds. Given several run directories (one spec run with
    /// different `in_flight: N` rates), their rates against parallelism.
    Report {
        /// The run directory, or several.
        #[arg(value_parser = crate::stdio::directory(), required = true, num_args = 1..)]
        dirs: Vec<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        output: Output,
        /// Also write DIR/report.html: the summary, the workloads' I/O
        /// over time with the control operations marked, and each
        /// operation's latency CDF, as inline SVG (no JavaScript). With
        /// several directories: a page of each closed-loop operation's
        /// successes per minute against parallelism (see --html-file).
        #[arg(long)]
        html: bool,
        /// Where the page of several runs goes (default:
        /// rate-parallelism.html in the current directory).
        #[arg(long, value_name = "FILE")]
        html_file: Option<PathBuf>,
        /// Read the run's JSON files (records.jsonl, io.jsonl,
        /// metrics.jsonl), not its results database (results.redb): for
        /// a database that is damaged.
        #[arg(long)]
        from_json: bool,
    },
    /// Compare two run directories metric by metric (ratios B / A), and
    /// apply the spec's thresholds: exits 1 when one fails.
    Compare {
        /// The first run directory.
        #[arg(value_parser = crate::stdio::directory())]
        a: PathBuf,
        /// The second run directory.
        #[arg(value_parser = crate::stdio::directory())]
        b: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "human")]
        output: Output,
        /// The spec whose `thresholds:` apply (default: B/spec.yaml, the
        /// spec B ran).
        #[arg(long, value_parser = crate::stdio::file("the spec is read once"))]
        spec: Option<PathBuf>,
        /// Read the runs' JSON files, not their results databases.
        #[arg(long)]
        from_json: bool,
    },
    /// Delete what a run left (after it was killed): every volume whose
    /// name carries its run id, with their snapshots.
    Clean {
        /// The run directory.
        #[arg(value_parser = crate::stdio::directory())]
        dir: PathBuf,
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Load an S3 gateway (or a plain HTTP server) with GETs or PUTs from
    /// many clients signed with AWS Signature V4; report requests/s, MB/s,
    /// latency percentiles and errors.
    S3(crate::s3_load::S3LoadArgs),
}

/// Where a run's Strata daemon is.
#[derive(Args)]
pub struct DaemonArgs {
    /// API address of a running daemon (default: start one on embedded
    /// defaults, with its pool in the run directory).
    #[arg(long)]
    api: Option<String>,
    /// File holding that daemon's API token (default: POOL/api.token
    /// with --pool; none without either).
    #[arg(long = "token-file")]
    token_file: Option<PathBuf>,
    /// That daemon's pool directory, where its api.token is.
    #[arg(long, value_parser = crate::stdio::directory())]
    pool: Option<PathBuf>,
}

impl DaemonArgs {
    /// The token to send, if any.
    fn token(&self) -> Result<Option<String>> {
        let path = match (&self.token_file, &self.pool) {
            (Some(file), _) => file.clone(),
            (None, Some(pool)) => pool.join("api.token"),
            (None, None) => return Ok(None),
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read the API token {}", path.display()))?;
        Ok(Some(text.trim().to_string()))
    }
}

/// Which provider to run on.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ProviderName {
    /// Strata's volume daemon.
    Strata,
    /// Every control operation succeeds at once; fio's null engine.
    Null,
    /// qemu-storage-daemon exporting qcow2 over NBD, external snapshots
    /// over QMP (started in the run directory).
    Qemu,
}

/// `strata bench run` options.
#[derive(Args)]
pub struct RunArgs {
    /// The spec (YAML; see docs/bench.md).
    #[arg(value_parser = crate::stdio::file("the spec is read twice (checked, then kept in the run directory)"))]
    spec: PathBuf,
    /// The run directory (new or empty; default: the spec's outputs.dir).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Check the spec and show what would run, without starting anything.
    #[arg(long)]
    dry_run: bool,
    /// Seed of every random draw (arrivals, selections); default: from the clock.
    #[arg(long)]
    seed: Option<u64>,
    /// Runs every closed-loop control operation (`in_flight: M`) with N
    /// in flight instead: one spec, a run per N (recorded in the run
    /// directory's overrides.json, which `report` reads).
    #[arg(long, value_name = "N")]
    parallelism: Option<u32>,
    /// The provider.
    #[arg(long, value_enum, default_value = "strata")]
    provider: ProviderName,
    #[command(flatten)]
    daemon: DaemonArgs,
}

/// Runs a `strata bench` command.
pub fn run(command: BenchCommand) -> Result<i32> {
    match command {
        BenchCommand::Run(args) => run_spec(args),
        BenchCommand::Report {
            dirs,
            output,
            html,
            html_file,
            from_json,
        } => {
            if let [dir] = dirs.as_slice() {
                report_run(dir, output, html, from_json)
            } else {
                report_parallelism(&dirs, output, html.then_some(html_file), from_json)
            }
        }
        BenchCommand::Compare {
            a,
            b,
            output,
            spec,
            from_json,
        } => {
            let summarize =
                |dir: &Path| -> Result<Summary> { Ok(report::summary_of(&load(dir, from_json)?)) };
            let rows = report::compare(&summarize(&a)?, &summarize(&b)?);
            let thresholds = thresholds(&spec.unwrap_or_else(|| b.join("spec.yaml")))?;
            let verdicts = report::judge(&rows, &thresholds);
            render_comparison(&rows, &verdicts, output);
            Ok(i32::from(verdicts.iter().any(|v| !v.pass)))
        }
        BenchCommand::Clean { dir, daemon } => clean(&dir, &daemon),
        BenchCommand::S3(args) => crate::s3_load::run(args),
    }
}

/// A run directory's data: from its results database unless `from_json`
/// (or it has none).
fn load(dir: &Path, from_json: bool) -> Result<report::RunData> {
    Ok(if from_json {
        report::load_json(dir)?
    } else {
        report::load(dir)?
    })
}

/// `strata bench report DIR`: the summary, and the page with `html`.
fn report_run(dir: &Path, output: Output, html: bool, from_json: bool) -> Result<i32> {
    let data = load(dir, from_json)?;
    render_summary(&report::summary_of(&data), output);
    if html {
        let path = dir.join("report.html");
        std::fs::write(&path, strata_bench::html::render(&data)?)
            .with_context(|| format!("cannot write the report {}", path.display()))?;
        eprintln!("strata bench: report written to {}", path.display());
    }
    Ok(0)
}

/// `strata bench report DIR1 DIR2 ...`: each closed-loop operation's
/// successes per minute at each run's parallelism; the page when `html`
/// is given (at its file, or the default).
fn report_parallelism(
    dirs: &[PathBuf],
    output: Output,
    html: Option<Option<PathBuf>>,
    from_json: bool,
) -> Result<i32> {
    let runs = dirs
        .iter()
        .map(|dir| parallelism::load_run(dir, from_json))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let curves = parallelism::curves(&runs);
    if output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&curves).unwrap_or_default()
        );
    } else {
        println!(
            "{:<16} {:<16} {:<8} {:>9} {:>10} {:>5}",
            "operation", "action", "provider", "in flight", "per min", "runs"
        );
        for curve in &curves {
            for line in &curve.lines {
                for point in &line.points {
                    println!(
                        "{:<16} {:<16} {:<8} {:>9} {:>10.1} {:>5}",
                        curve.operation,
                        curve.action,
                        line.provider,
                        point.parallelism,
                        point.per_minute,
                        point.runs
                    );
                }
            }
        }
    }
    if let Some(file) = html {
        let path = file.unwrap_or_else(|| PathBuf::from("rate-parallelism.html"));
        std::fs::write(&path, parallelism::render(&runs)?)
            .with_context(|| format!("cannot write the page {}", path.display()))?;
        eprintln!(
            "strata bench: rate against parallelism written to {}",
            path.display()
        );
    }
    Ok(0)
}

/// Set by SIGINT or SIGTERM: the run stops, cleans up and exits.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: all a signal handler may safely do.
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores into an atomic.
        unsafe {
            libc::signal(signal, on_signal as *const () as libc::sighandler_t);
        }
    }
}

fn run_spec(args: RunArgs) -> Result<i32> {
    let text = std::fs::read_to_string(&args.spec)
        .with_context(|| format!("cannot read the spec {}", args.spec.display()))?;
    let spec_error = |problem| strata_bench::error::Error::Spec {
        path: args.spec.clone(),
        problem,
    };
    let mut spec = spec::parse(&text).map_err(spec_error)?;
    let base = args.spec.parent().unwrap_or(Path::new("."));
    spec.read_trace_files(base).map_err(spec_error)?;
    let mut overrides = strata_bench::spec::parallelism_override::Overrides::default();
    if let Some(n) = args.parallelism {
        spec.set_parallelism(n).map_err(spec_error)?;
        overrides.parallelism = Some(n);
    }
    if args.dry_run {
        for line in plan(&spec) {
            println!("{line}");
        }
        return Ok(0);
    }
    let Some(out) = args
        .out
        .clone()
        .or_else(|| spec.output_dir.clone().map(PathBuf::from))
    else {
        bail!("no run directory: give --out DIR (or `outputs: {{dir: DIR}}` in the spec)");
    };
    let provider = match (args.provider, &args.daemon.api) {
        (ProviderName::Null, _) => ProviderChoice::Null,
        (ProviderName::Qemu, _) => ProviderChoice::Qemu,
        (ProviderName::Strata, Some(api)) => ProviderChoice::Strata {
            api: api.clone(),
            token: args.daemon.token()?,
        },
        (ProviderName::Strata, None) => ProviderChoice::StartStrata {
            strata: std::env::current_exe()
                .context("cannot find the strata binary to start its daemon")?,
        },
    };
    let seed = args.seed.unwrap_or_else(clock_seed);
    install_signal_handlers();
    let progress = Progress::new(spec.duration);
    let options = RunOptions {
        out: out.clone(),
        seed,
        provider,
        spec_text: text,
        overrides,
    };
    let outcome = run::run(&spec, options, &STOP, &|event| progress.show(event));
    progress.finish();
    let outcome = outcome?;
    eprintln!(
        "strata bench: run {} ({}): {} records, {} failed{}; results in {} (seed {seed}; `strata bench report {}`)",
        outcome.run_id,
        if outcome.interrupted { "interrupted" } else { "done" },
        outcome.records,
        outcome.failures,
        if outcome.leftovers.is_empty() {
            String::new()
        } else {
            format!(", NOT deleted: {}", outcome.leftovers.join(", "))
        },
        outcome.dir.display(),
        outcome.dir.display(),
    );
    Ok(
        match (
            outcome.interrupted,
            outcome.leftovers.is_empty(),
            outcome.failures,
        ) {
            (_, false, _) => 1,
            (true, true, _) => 130,
            (false, true, 0) => 0,
            (false, true, _) => 1,
        },
    )
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What a spec would do, for `--dry-run`.
fn plan(spec: &Spec) -> Vec<String> {
    let mut lines = vec![format!(
        "spec is valid; a run would last {:?}:",
        spec.duration
    )];
    for group in &spec.volumes {
        lines.push(format!(
            "  volumes {}: {} at the start, {} each, named RUN-{}{}",
            group.name,
            group.count,
            human(group.size),
            group.template,
            if group.attach == Attach::Fs {
                ", with ext4 mounted (nbdfuse, loop device)"
            } else {
                ""
            }
        ));
    }
    for workload in &spec.workloads {
        let what = match &workload.kind {
            WorkloadKind::Fio(options) => format!(
                "fio {}",
                options
                    .iter()
                    .map(|(k, v)| format!("--{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            WorkloadKind::Command(words) => words.join(" "),
            WorkloadKind::Pgbench(options) => format!(
                "PostgreSQL loaded by pgbench -i -s {}, then pgbench -c {}",
                options.scale, options.clients
            ),
        };
        lines.push(format!(
            "  workload {}: {} instance(s) on volumes {}{}: {what}",
            workload.name,
            workload.count,
            workload.volumes,
            if workload.barrier {
                ", started together"
            } else {
                ""
            }
        ));
    }
    for op in &spec.control_operations {
        let rate = match &op.rate {
            RateLaw::Every(every) => format!("every {every:?}"),
            RateLaw::Poisson(mean) => format!("Poisson arrivals, mean gap {mean:?}"),
            RateLaw::ClosedLoop(n) => format!("{n} always in flight"),
            RateLaw::Ramp { from, to, over } => {
                format!("a gap from {from:?} to {to:?} over {over:?}")
            }
            RateLaw::Steps(steps) => format!("{} steps, first every {:?}", steps.len(), steps[0].0),
            RateLaw::Trace(times) => format!("a trace of {} arrivals", times.len()),
            RateLaw::TraceFile { path, .. } => format!("the trace in {path}"),
            RateLaw::IncreaseDecrease {
                low,
                high,
                step,
                every,
            } => format!("{low} to {high} arrivals a second and back, by {step} every {every:?}"),
        };
        let on = op.workload.as_ref().map_or_else(
            || format!("volumes {}", op.group),
            |w| format!("workload {w}'s volumes"),
        );
        lines.push(format!(
            "  operation {}: {} ({:?}) on {on}, {rate} (rate {}){}",
            op.name,
            run::action_name(op.action),
            op.select,
            op.rate_name,
            op.limit.map_or(String::new(), |l| format!(", at most {l}"))
        ));
    }
    lines
}

/// The progress bar of a run: measured seconds, and operations so far.
struct Progress {
    bar: ProgressBar,
    ok: AtomicU64,
    failed: AtomicU64,
}

impl Progress {
    fn new(duration: Duration) -> Progress {
        let bar = ProgressBar::new(duration.as_millis() as u64);
        bar.set_style(
            ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] {elapsed} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress {
            bar,
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    fn show(&self, event: Event) {
        match event {
            Event::Started { run_id, provider } => {
                self.bar.set_prefix(format!("{run_id} on {provider}"))
            }
            Event::Phase(phase) => self.bar.set_message(phase),
            Event::Tick(seconds) => self.bar.set_position((seconds * 1000.0) as u64),
            Event::Operation { status, .. } => {
                let counter = if status == Status::Error {
                    &self.failed
                } else {
                    &self.ok
                };
                counter.fetch_add(1, Ordering::Relaxed);
                self.bar.set_message(format!(
                    "{} operations, {} failed",
                    self.ok.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed),
                    self.failed.load(Ordering::Relaxed)
                ));
            }
            Event::Warning(text) => self.bar.println(format!("strata bench: {text}")),
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

fn clean(dir: &Path, daemon: &DaemonArgs) -> Result<i32> {
    let strata =
        std::env::current_exe().context("cannot find the strata binary to start its daemon")?;
    let cleaned = strata_bench::cleanup::clean(dir, &strata, daemon.api.clone(), daemon.token()?)?;
    for name in &cleaned.deleted {
        println!("deleted {name}");
    }
    for failure in &cleaned.failed {
        eprintln!("strata bench clean: {failure}");
    }
    if !cleaned.leftovers.is_empty() {
        bail!("still there: {} (run `strata bench clean` again, or delete them with `strata volume delete`)", cleaned.leftovers.join(", "));
    }
    println!(
        "nothing of the run is left ({} volume(s) deleted)",
        cleaned.deleted.len()
    );
    Ok(0)
}

fn render_summary(summary: &Summary, output: Output) {
    if output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(summary).unwrap_or_default()
        );
        return;
    }
    println!(
        "run {} on {}, seed {}, {} s{}, {} records",
        summary.run_id,
        summary.provider,
        summary.seed,
        summary.duration,
        if summary.interrupted {
            " (interrupted)"
        } else {
            ""
        },
        summary.records
    );
    println!(
        "{:<16} {:<16} {:>6} {:>6} {:>5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "operation",
        "action",
        "count",
        "ok",
        "err",
        "skip",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "per min"
    );
    for op in &summary.operations {
        println!(
            "{:<16} {:<16} {:>6} {:>6} {:>5} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.1}",
            op.operation,
            op.action,
            op.count,
            op.ok,
            op.errors + op.dropped,
            op.skipped,
            op.p50_ms,
            op.p90_ms,
            op.p99_ms,
            op.p999_ms,
            op.max_ms,
            op.per_minute
        );
    }
    render_metrics(summary);
    if summary.workloads.is_empty() {
        return;
    }
    println!(
        "{:<16} {:>9} {:>11} {:>10} {:>10} {:>12}",
        "workload", "instances", "mean IOPS", "min IOPS", "MiB/s", "zero-op s"
    );
    for w in &summary.workloads {
        println!(
            "{:<16} {:>9} {:>11.0} {:>10.0} {:>10.1} {:>12}",
            w.workload,
            w.instances,
            w.mean_iops,
            w.min_iops,
            w.mean_kib_per_s / 1024.0,
            w.zero_seconds
        );
    }
}

/// The thresholds of the spec at `path`: none when a hand-made run
/// directory has no spec.
fn thresholds(path: &Path) -> Result<Vec<spec::Threshold>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the spec {}", path.display()))?;
    let spec = spec::parse(&text).map_err(|problem| strata_bench::error::Error::Spec {
        path: path.to_path_buf(),
        problem,
    })?;
    Ok(spec.thresholds)
}

/// Most metric series the human report lists (JSON has them all).
const LISTED_SERIES: usize = 40;

/// The provider's metrics that moved during the run: their first, last,
/// lowest and highest values.
fn render_metrics(summary: &Summary) {
    if summary.metrics.is_empty() {
        return;
    }
    let moved: Vec<_> = summary.metrics.iter().filter(|m| m.min != m.max).collect();
    println!(
        "provider metrics: {} series scraped, {} moved{}",
        summary.metrics.len(),
        moved.len(),
        if moved.is_empty() { "" } else { ":" }
    );
    for metric in moved.iter().take(LISTED_SERIES) {
        println!(
            "  {:<72} {:>6} samples, {} -> {} (min {}, max {})",
            metric.series, metric.samples, metric.first, metric.last, metric.min, metric.max
        );
    }
    if moved.len() > LISTED_SERIES {
        println!(
            "  ... and {} more (--output json lists every series)",
            moved.len() - LISTED_SERIES
        );
    }
}

fn render_comparison(rows: &[report::Comparison], verdicts: &[report::Verdict], output: Output) {
    if output == Output::Json {
        let both = serde_json::json!({"metrics": rows, "thresholds": verdicts});
        println!(
            "{}",
            serde_json::to_string_pretty(&both).unwrap_or_default()
        );
        return;
    }
    println!("{:<44} {:>12} {:>12} {:>8}", "metric", "A", "B", "B / A");
    for row in rows {
        let ratio = row
            .ratio
            .map_or_else(|| "-".to_string(), |r| format!("{r:.3}"));
        println!(
            "{:<44} {:>12.2} {:>12.2} {:>8}",
            row.metric, row.a, row.b, ratio
        );
    }
    if verdicts.is_empty() {
        return;
    }
    println!("{:<44} {:<6} {:<24} why", "threshold", "result", "bounds");
    for verdict in verdicts {
        println!(
            "{:<44} {:<6} {:<24} {}",
            verdict.metric.as_deref().unwrap_or(&verdict.threshold),
            if verdict.pass { "pass" } else { "FAIL" },
            verdict.bounds,
            verdict.reason
        );
    }
    let failed = verdicts.iter().filter(|v| !v.pass).count();
    println!(
        "{} of {} threshold checks passed{}",
        verdicts.len() - failed,
        verdicts.len(),
        if failed > 0 { "; FAILED" } else { "" }
    );
}
