//! The workflow runner (`strata f3 run`): a client of the metadata
//! service (live nodes, where the inputs' bytes are) and of the agents'
//! invoke endpoints. It starts each step once its producers have ended
//! (or, for a streamed input, started and made the file), on the node its
//! [`schedule`] scheduler chooses, runs independent steps at once, and
//! keeps a [`StepRecord`] per step. A step that fails fails the run, and
//! the steps that depend on it are not started.
//!
//! It is only as large as F3's experiments need, not a FaaS platform:
//! anything that can POST an [`InvokeRequest`] could drive the agents.

pub mod schedule;

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use serde::Serialize;

use crate::client::{AgentClient, ServiceClient};
use crate::error::ErrorKind;
use crate::invoke::{InvokeRequest, InvokeResult, Start};
use crate::protocol::{unix_ms, Entry, NodeInfo};
use crate::workflow::Workflow;
use crate::{F3Error, Result};
use schedule::{Candidate, Choice, Scheduler, SchedulerKind};

/// How often the runner looks again at steps that wait (for a streamed
/// file to appear, or for a free slot).
const POLL: Duration = Duration::from_millis(20);

/// How long an invocation refused for a busy node is retried.
const BUSY_RETRY: Duration = Duration::from_secs(30);

/// How a run chooses nodes.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// The scheduler.
    pub scheduler: SchedulerKind,
    /// The random scheduler's seed.
    pub seed: u64,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It exited 0.
    Succeeded,
    /// It failed (exit, signal, timeout, memory) or could not be run.
    Failed,
    /// A step it depends on failed, so it was not started.
    Skipped,
}

/// What happened to one step.
#[derive(Debug, Clone, Serialize)]
pub struct StepRecord {
    /// The step.
    pub step: String,
    /// How it ended.
    pub outcome: Outcome,
    /// The node it ran on.
    pub node: Option<String>,
    /// Why the scheduler chose that node (or why it did not run).
    pub reason: String,
    /// Unix milliseconds when it started and ended.
    pub started_ms: Option<u64>,
    /// See `started_ms`.
    pub ended_ms: Option<u64>,
    /// Cold or warm sandbox.
    pub start: Option<Start>,
    /// Its exit code.
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// Killed at its timeout.
    pub timed_out: bool,
    /// Killed over its memory limit.
    pub out_of_memory: bool,
    /// Its sandbox's peak memory.
    pub peak_memory_bytes: Option<u64>,
    /// Its memory limit.
    pub memory_limit_bytes: u64,
    /// Bytes of its inputs (their sizes when it ended).
    pub input_bytes: u64,
    /// Bytes of its inputs its node did not hold when it started.
    pub remote_input_bytes: u64,
    /// Why it failed.
    pub error: Option<String>,
    /// The end of its stderr.
    pub stderr_tail: String,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The scheduler.
    pub scheduler: String,
    /// The random scheduler's seed.
    pub seed: u64,
    /// Every step succeeded.
    pub succeeded: bool,
    /// Unix milliseconds at the start and end of the run.
    pub started_ms: u64,
    /// See `started_ms`.
    pub ended_ms: u64,
    /// One record per step, in the workflow's order.
    pub steps: Vec<StepRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Running,
    Done(bool),
    Skipped,
}

#[derive(Debug)]
struct Progress {
    phases: Vec<Phase>,
    records: Vec<Option<StepRecord>>,
    /// Invocations this run has in flight, by node.
    in_flight: HashMap<String, u32>,
}

struct Runner<'a> {
    service: &'a ServiceClient,
    agents: AgentClient,
    workflow: &'a Workflow,
    nodes: Vec<NodeInfo>,
    progress: Mutex<Progress>,
    changed: Condvar,
}

/// Runs `workflow` to its end; the records of every step. It first
/// removes the ephemeral outputs an earlier run left. An error means
/// nothing ran (no live node, an input nobody makes that does not exist,
/// an output still being written).
pub fn run(
    service: &ServiceClient,
    workflow: &Workflow,
    options: &RunOptions,
) -> Result<RunReport> {
    let mut nodes: Vec<NodeInfo> = service.nodes()?.into_iter().filter(|n| n.alive).collect();
    if nodes.is_empty() {
        return Err(F3Error::unavailable(format!(
            "no live node is registered with the F3 service at {}: start `strata node` first",
            service.address()
        )));
    }
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    check_external_inputs(service, workflow)?;
    let agents = AgentClient::new();
    clear_outputs(service, &agents, &nodes, workflow)?;
    let count = workflow.steps.len();
    let runner = Runner {
        service,
        agents,
        workflow,
        nodes,
        progress: Mutex::new(Progress {
            phases: vec![Phase::Waiting; count],
            records: vec![None; count],
            in_flight: HashMap::new(),
        }),
        changed: Condvar::new(),
    };
    let started_ms = unix_ms();
    let mut scheduler = Scheduler::new(options.scheduler, options.seed);
    std::thread::scope(|scope| runner.drive(scope, &mut scheduler));
    let records: Vec<StepRecord> = runner
        .progress
        .into_inner()
        .records
        .into_iter()
        .flatten()
        .collect();
    Ok(RunReport {
        scheduler: options.scheduler.label().to_string(),
        seed: options.seed,
        succeeded: records.iter().all(|r| r.outcome == Outcome::Succeeded),
        started_ms,
        ended_ms: unix_ms(),
        steps: records,
    })
}

/// Refuses a run whose inputs, made by no step, are not in F3.
fn check_external_inputs(service: &ServiceClient, workflow: &Workflow) -> Result<()> {
    for (step, input) in workflow.external_inputs() {
        match service.stat(&input.path) {
            Ok(entry) if !entry.directory => {}
            Ok(_) => {
                return Err(F3Error::invalid(format!(
                    "line {}: step `{}`: input {} is a directory: name a file",
                    input.line, step.name, input.path
                )))
            }
            Err(e) if e.kind == ErrorKind::NotFound => {
                return Err(F3Error::invalid(format!(
                    "line {}: step `{}`: input {} is made by no step and is not in F3: create it \
                     first, or name another step's output; nothing was run",
                    input.line, step.name, input.path
                )))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Removes the ephemeral files the steps write, from the namespace and
/// from the nodes that keep them, so that each step writes its outputs
/// anew on whichever node it runs (an ephemeral file can only be written
/// on its holder). Durable outputs are left to be overwritten.
fn clear_outputs(
    service: &ServiceClient,
    agents: &AgentClient,
    nodes: &[NodeInfo],
    workflow: &Workflow,
) -> Result<()> {
    for step in &workflow.steps {
        for path in step.outputs.values() {
            let entry = match service.stat(path) {
                Ok(entry) => entry,
                Err(e) if e.kind == ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if entry.directory || !entry.ephemeral {
                continue;
            }
            if !entry.writers.is_empty() {
                return Err(F3Error::conflict(format!(
                    "step `{}`: its output {path} is open for writing (on {}): wait for its \
                     writer, or write another path; nothing was run",
                    step.name,
                    entry.writers.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
            let removed = service.remove(path)?;
            let keepers: std::collections::BTreeSet<&String> =
                removed.held.keys().chain(removed.holder.iter()).collect();
            for node in nodes.iter().filter(|n| keepers.contains(&n.name)) {
                // A node that misses this keeps a stale copy it never
                // serves (copies are tied to the content's version).
                let _ = agents.post::<serde_json::Value>(
                    &node.address,
                    "/v1/forget",
                    &crate::protocol::PathRequest { path: path.clone() },
                );
            }
        }
    }
    Ok(())
}

impl<'a> Runner<'a> {
    /// Starts steps as they become ready until every step has ended.
    fn drive<'s>(&'s self, scope: &'s std::thread::Scope<'s, '_>, scheduler: &mut Scheduler) {
        loop {
            let ready = {
                let mut progress = self.progress.lock();
                self.skip_dependents(&mut progress);
                if progress
                    .phases
                    .iter()
                    .all(|p| matches!(p, Phase::Done(_) | Phase::Skipped))
                {
                    return;
                }
                self.ready(&progress)
            };
            for index in ready {
                if !self.streams_exist(index) {
                    continue;
                }
                let (choice, before) = match self.place(index, scheduler) {
                    Ok(Some(placed)) => placed,
                    Ok(None) => continue,
                    Err(error) => {
                        self.unplaceable(index, error);
                        continue;
                    }
                };
                {
                    let mut progress = self.progress.lock();
                    progress.phases[index] = Phase::Running;
                    *progress.in_flight.entry(choice.node.clone()).or_insert(0) += 1;
                }
                scope.spawn(move || self.execute(index, choice, before));
            }
            let mut progress = self.progress.lock();
            self.changed.wait_for(&mut progress, POLL);
        }
    }

    /// Marks skipped the waiting steps a failed or skipped step feeds.
    fn skip_dependents(&self, progress: &mut Progress) {
        for index in 0..self.workflow.steps.len() {
            if progress.phases[index] != Phase::Waiting {
                continue;
            }
            let failed = self
                .workflow
                .dependencies(index)
                .keys()
                .find(|&&d| matches!(progress.phases[d], Phase::Done(false) | Phase::Skipped))
                .copied();
            if let Some(failed) = failed {
                progress.phases[index] = Phase::Skipped;
                let step = &self.workflow.steps[index];
                progress.records[index] = Some(StepRecord {
                    reason: format!(
                        "not started: step `{}`, whose output it reads, did not succeed",
                        self.workflow.steps[failed].name
                    ),
                    ..StepRecord::empty(&step.name, Outcome::Skipped, step.memory_bytes)
                });
            }
        }
    }

    /// Waiting steps whose producers have ended well, or started, for
    /// those they only stream from.
    fn ready(&self, progress: &Progress) -> Vec<usize> {
        (0..self.workflow.steps.len())
            .filter(|&i| progress.phases[i] == Phase::Waiting)
            .filter(|&i| {
                self.workflow
                    .dependencies(i)
                    .iter()
                    .all(|(&d, &streaming)| match progress.phases[d] {
                        Phase::Done(true) => true,
                        Phase::Running => streaming,
                        _ => false,
                    })
            })
            .collect()
    }

    /// Whether every input that `index` streams from a running producer
    /// exists yet.
    fn streams_exist(&self, index: usize) -> bool {
        let step = &self.workflow.steps[index];
        let phases = self.progress.lock().phases.clone();
        step.inputs
            .iter()
            .filter(|i| i.producer.is_some_and(|p| phases[p] == Phase::Running))
            .all(|i| self.service.stat(&i.path).is_ok())
    }

    /// Fails step `index`, which no node could take.
    fn unplaceable(&self, index: usize, error: F3Error) {
        let step = &self.workflow.steps[index];
        let mut progress = self.progress.lock();
        progress.phases[index] = Phase::Done(false);
        progress.records[index] = Some(StepRecord {
            reason: "no node could take it".into(),
            error: Some(error.message),
            ..StepRecord::empty(&step.name, Outcome::Failed, step.memory_bytes)
        });
    }

    /// The scheduler's choice for step `index`, with its inputs' records
    /// now; none while no node has a free slot; an error when no node
    /// answers.
    fn place(
        &self,
        index: usize,
        scheduler: &mut Scheduler,
    ) -> Result<Option<(Choice, Vec<Entry>)>> {
        let step = &self.workflow.steps[index];
        let before: Vec<Entry> = step
            .inputs
            .iter()
            .filter_map(|i| self.service.stat(&i.path).ok())
            .collect();
        let total: u64 = before.iter().map(|e| e.size).sum();
        let paths: Vec<String> = step.inputs.iter().map(|i| i.path.clone()).collect();
        let held: HashMap<String, u64> = if paths.is_empty() {
            HashMap::new()
        } else {
            self.service
                .locality(&paths)
                .map(|a| a.nodes.into_iter().map(|n| (n.node, n.bytes)).collect())
                .unwrap_or_default()
        };
        let (in_flight, phases) = {
            let progress = self.progress.lock();
            (progress.in_flight.clone(), progress.phases.clone())
        };
        // The holders of streamed inputs whose producer still runs: their
        // bytes are still to come, and they come there.
        let producing: Vec<&str> = step
            .inputs
            .iter()
            .filter(|i| i.stream && i.producer.is_some_and(|p| phases[p] == Phase::Running))
            .filter_map(|i| before.iter().find(|e| e.path == i.path))
            .filter_map(|e| e.holder.as_deref())
            .collect();
        let candidates: Vec<Candidate> = self
            .nodes
            .iter()
            .filter_map(|node| {
                let status = self.agents.sandboxes(&node.address).ok()?;
                let busy = status
                    .busy
                    .max(in_flight.get(&node.name).copied().unwrap_or(0));
                Some(Candidate {
                    node: node.name.clone(),
                    free_slots: status.slots.saturating_sub(busy),
                    warm: status.warm.contains_key(&step.name),
                    input_bytes: held.get(&node.name).copied().unwrap_or(0),
                    producing: producing.contains(&node.name.as_str()),
                })
            })
            .collect();
        if candidates.is_empty() {
            return Err(F3Error::unavailable(format!(
                "none of the nodes ({}) answered on its invoke endpoint: are their `strata node` \
                 agents running?",
                self.nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(scheduler
            .choose(&candidates, total)
            .map(|choice| (choice, before)))
    }

    /// Runs step `index` on the chosen node and records how it went.
    fn execute(&self, index: usize, choice: Choice, before: Vec<Entry>) {
        let step = &self.workflow.steps[index];
        let request = InvokeRequest {
            function: step.name.clone(),
            argv: step.argv.clone(),
            env: step.env.clone(),
            memory_bytes: step.memory_bytes,
            timeout_ms: step.timeout_ms,
        };
        let started_ms = unix_ms();
        let result = self.invoke(&choice.node, &request);
        let mut record = StepRecord {
            node: Some(choice.node.clone()),
            reason: choice.reason,
            started_ms: Some(started_ms),
            ended_ms: Some(unix_ms()),
            ..StepRecord::empty(&step.name, Outcome::Failed, step.memory_bytes)
        };
        (record.input_bytes, record.remote_input_bytes) =
            self.input_bytes(index, &choice.node, &before);
        match result {
            Ok(result) => record.fill(result),
            Err(error) => record.error = Some(error.message),
        }
        if record.outcome == Outcome::Succeeded {
            self.name_producer(step);
        }
        let mut progress = self.progress.lock();
        progress.phases[index] = Phase::Done(record.outcome == Outcome::Succeeded);
        if let Some(count) = progress.in_flight.get_mut(&choice.node) {
            *count = count.saturating_sub(1);
        }
        progress.records[index] = Some(record);
        self.changed.notify_all();
    }

    /// Names `step` as the producer of its outputs, so that the event of
    /// an output's loss names the step to run again (docs/f3.md, "Lost
    /// ephemeral data"). A failure is only logged: the outputs are there.
    fn name_producer(&self, step: &crate::workflow::Step) {
        for path in step.outputs.values() {
            let request = crate::protocol::UpdateRequest {
                path: path.clone(),
                producer: Some(step.name.clone()),
                ..Default::default()
            };
            if let Err(e) = self.service.update(&request) {
                tracing::warn!(
                    "step `{}`: naming it the producer of {path}: {e}",
                    step.name
                );
            }
        }
    }

    /// Invokes on `node`, retrying for a while when it is busy (other
    /// clients may hold its slots).
    fn invoke(&self, node: &str, request: &InvokeRequest) -> Result<InvokeResult> {
        let address = self
            .nodes
            .iter()
            .find(|n| n.name == node)
            .map(|n| n.address.clone())
            .ok_or_else(|| F3Error::not_found(format!("node {node} is not registered")))?;
        let deadline = std::time::Instant::now() + BUSY_RETRY;
        loop {
            match self.agents.invoke(&address, request) {
                Err(e)
                    if e.kind == ErrorKind::Unavailable
                        && e.message.contains("is busy")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(POLL * 5);
                }
                other => return other,
            }
        }
    }

    /// The inputs' sizes now, and the bytes of them `node` did not hold
    /// when the step started (all of a file it neither held nor cached).
    fn input_bytes(&self, index: usize, node: &str, before: &[Entry]) -> (u64, u64) {
        let step = &self.workflow.steps[index];
        let mut total = 0;
        let mut remote = 0;
        for input in &step.inputs {
            let Ok(now) = self.service.stat(&input.path) else {
                continue;
            };
            total += now.size;
            let earlier = before.iter().find(|e| e.path == input.path);
            let local = if now.holder.as_deref() == Some(node) {
                now.size
            } else {
                earlier
                    .and_then(|e| e.held.get(node).copied())
                    .unwrap_or(0)
                    .min(now.size)
            };
            remote += now.size - local;
        }
        (total, remote)
    }
}

impl StepRecord {
    fn empty(step: &str, outcome: Outcome, memory_limit_bytes: u64) -> StepRecord {
        StepRecord {
            step: step.to_string(),
            outcome,
            node: None,
            reason: String::new(),
            started_ms: None,
            ended_ms: None,
            start: None,
            exit_code: None,
            signal: None,
            timed_out: false,
            out_of_memory: false,
            peak_memory_bytes: None,
            memory_limit_bytes,
            input_bytes: 0,
            remote_input_bytes: 0,
            error: None,
            stderr_tail: String::new(),
        }
    }

    /// Takes what the agent answered.
    fn fill(&mut self, result: InvokeResult) {
        self.outcome = if result.succeeded() {
            Outcome::Succeeded
        } else {
            Outcome::Failed
        };
        self.error = result.failure();
        self.started_ms = Some(result.started_ms);
        self.ended_ms = Some(result.ended_ms);
        self.start = Some(result.start);
        self.exit_code = result.exit_code;
        self.signal = result.signal;
        self.timed_out = result.timed_out;
        self.out_of_memory = result.out_of_memory;
        self.peak_memory_bytes = result.peak_memory_bytes;
        self.memory_limit_bytes = result.memory_limit_bytes;
        self.stderr_tail = result.stderr_tail;
    }
}
