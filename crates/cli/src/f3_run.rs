//! `strata f3 run WORKFLOW.yaml`: reads and checks the workflow, runs it
//! with the library's runner, and renders the steps' records (a summary,
//! or JSON with `--output json`). See docs/f3.md.

use std::path::Path;

use anyhow::{bail, Context, Result};
use strata_f3::client::ServiceClient;
use strata_f3::runner::schedule::SchedulerKind;
use strata_f3::runner::{Outcome, RunOptions, RunReport, StepRecord};
use strata_f3::workflow::{self, MAX_WORKFLOW_BYTES};

/// Runs the workflow in `file`; exit 0 when every step succeeded, 1 when
/// one failed.
pub fn run(
    meta: &str,
    json: bool,
    file: &Path,
    scheduler: SchedulerKind,
    seed: u64,
) -> Result<i32> {
    let size = std::fs::metadata(file)
        .with_context(|| format!("reading workflow {}", file.display()))?
        .len();
    if size > MAX_WORKFLOW_BYTES as u64 {
        bail!(
            "workflow {} has {size} bytes; at most {MAX_WORKFLOW_BYTES}",
            file.display()
        );
    }
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading workflow {}", file.display()))?;
    let workflow = workflow::parse(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}; nothing was run", file.display()))?;
    let options = RunOptions { scheduler, seed };
    let report = strata_f3::runner::run(&ServiceClient::new(meta), &workflow, &options)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_summary(&report);
    }
    if let Some(failed) = report.steps.iter().find(|s| s.outcome == Outcome::Failed) {
        eprintln!(
            "strata f3 run: step `{}` failed on {}: {}",
            failed.step,
            failed.node.as_deref().unwrap_or("no node"),
            failed.error.as_deref().unwrap_or("(no reason given)")
        );
        if !failed.stderr_tail.is_empty() {
            eprintln!("its stderr ends with:\n{}", failed.stderr_tail.trim_end());
        }
        return Ok(1);
    }
    Ok(0)
}

fn print_summary(report: &RunReport) {
    println!(
        "{:<16} {:<10} {:<10} {:<5} {:>8} {:>10} {:>12}  reason",
        "step", "outcome", "node", "start", "ms", "peak MiB", "remote B"
    );
    for step in &report.steps {
        println!("{}", step_line(step));
    }
    println!(
        "{} steps, {} ms, scheduler {}{}",
        report.steps.len(),
        report.ended_ms.saturating_sub(report.started_ms),
        report.scheduler,
        if report.succeeded {
            ", all succeeded"
        } else {
            ", FAILED"
        }
    );
}

fn step_line(step: &StepRecord) -> String {
    let outcome = match step.outcome {
        Outcome::Succeeded => "ok",
        Outcome::Failed => "failed",
        Outcome::Skipped => "skipped",
    };
    let start = match step.start {
        Some(strata_f3::invoke::Start::Cold) => "cold",
        Some(strata_f3::invoke::Start::Warm) => "warm",
        None => "-",
    };
    let millis = match (step.started_ms, step.ended_ms) {
        (Some(start), Some(end)) => end.saturating_sub(start).to_string(),
        _ => "-".into(),
    };
    let peak = step
        .peak_memory_bytes
        .map_or("-".into(), |b| format!("{:.1}", b as f64 / 1048576.0));
    format!(
        "{:<16} {outcome:<10} {:<10} {start:<5} {millis:>8} {peak:>10} {:>12}  {}",
        step.step,
        step.node.as_deref().unwrap_or("-"),
        step.remote_input_bytes,
        step.reason
    )
}
