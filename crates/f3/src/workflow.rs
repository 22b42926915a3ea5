//! Workflows: a YAML DAG of steps, each a function run on one node with
//! its inputs and outputs in the F3 namespace. Read with serde
//! (`deny_unknown_fields` everywhere), then checked as a whole: a bad
//! workflow is refused with its line and what to write instead before
//! anything runs.
//!
//! ```yaml
//! steps:
//!   - name: numbers
//!     function: [/bin/sh, -c, "seq 1 100000 > ${output.list}"]
//!     outputs: {list: /numbers.eph}
//!   - name: total
//!     function: [/bin/sh, -c, "awk '{s+=$1} END {print s}' ${input.list} > ${output.sum}"]
//!     inputs: {list: {path: /numbers.eph, stream: true}}
//!     outputs: {sum: /total.eph}
//!     memory: 64MiB
//!     timeout: 30s
//! ```
//!
//! A step depends on the step whose output one of its inputs names; it
//! starts when that step has ended well, or, for a `stream: true` input,
//! once that step has started and the file exists (the consumer then
//! reads while the producer writes). A step's name is its function's
//! name: invocations of a name reuse its warm sandbox on a node.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::invoke::{check_function_name, MAX_MEMORY_BYTES, MAX_TIMEOUT_MS, MIN_MEMORY_BYTES};
use crate::path::NamespacePath;

/// Most steps one workflow has.
pub const MAX_STEPS: usize = 256;

/// Most bytes of a workflow file.
pub const MAX_WORKFLOW_BYTES: usize = 1024 * 1024;

/// A step's memory limit unless it says.
pub const DEFAULT_MEMORY_BYTES: u64 = 256 * 1024 * 1024;

/// A step's timeout unless it says.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;

/// A workflow that was refused: where, and what to write instead.
#[derive(Debug, Clone, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct WorkflowError {
    /// 1-based line in the YAML text (0 when there is none for it).
    pub line: u64,
    /// What is wrong and what to write instead.
    pub message: String,
}

/// A checked workflow.
#[derive(Debug, Clone)]
pub struct Workflow {
    /// Its steps, in the file's order.
    pub steps: Vec<Step>,
}

/// One step: a function, its files, its limits.
#[derive(Debug, Clone)]
pub struct Step {
    /// Its name, which is also its function's name.
    pub name: String,
    /// The line of its name.
    pub line: u64,
    /// The command, with `${input.N}` and `${output.N}` replaced by the
    /// files' paths relative to the mount (the working directory).
    pub argv: Vec<String>,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// Its inputs, by name.
    pub inputs: Vec<Input>,
    /// Its outputs' paths, by name.
    pub outputs: BTreeMap<String, String>,
    /// Its memory limit.
    pub memory_bytes: u64,
    /// Its timeout.
    pub timeout_ms: u64,
}

/// One input of a step.
#[derive(Debug, Clone)]
pub struct Input {
    /// Its name in the step.
    pub name: String,
    /// Its path in the namespace.
    pub path: String,
    /// The line that names it.
    pub line: u64,
    /// The consumer may start while the producer still writes it.
    pub stream: bool,
    /// The index of the step that makes it, if one does.
    pub producer: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkflow {
    steps: Vec<RawStep>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    name: Spanned<String>,
    function: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    inputs: BTreeMap<String, RawInput>,
    #[serde(default)]
    outputs: BTreeMap<String, Spanned<String>>,
    memory: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInput {
    path: Spanned<String>,
    #[serde(default)]
    stream: bool,
}

fn refused<T>(line: u64, message: impl Into<String>) -> Result<T, WorkflowError> {
    Err(WorkflowError {
        line,
        message: message.into(),
    })
}

/// Reads and checks a workflow (see the module's doc).
pub fn parse(text: &str) -> Result<Workflow, WorkflowError> {
    if text.len() > MAX_WORKFLOW_BYTES {
        return refused(
            0,
            format!(
                "the workflow has {} bytes; at most {MAX_WORKFLOW_BYTES}",
                text.len()
            ),
        );
    }
    let raw: RawWorkflow = serde_saphyr::from_str(text).map_err(|e| WorkflowError {
        line: e.location().map_or(0, |l| l.line()),
        message: yaml_message(&e.to_string()),
    })?;
    if raw.steps.is_empty() || raw.steps.len() > MAX_STEPS {
        return refused(
            1,
            format!(
                "the workflow has {} steps: give 1 to {MAX_STEPS} under `steps:`",
                raw.steps.len()
            ),
        );
    }
    let mut steps = Vec::new();
    let mut names = HashMap::new();
    let mut made_by: HashMap<String, usize> = HashMap::new();
    for (index, raw_step) in raw.steps.iter().enumerate() {
        let step = check_step(raw_step)?;
        if names.insert(step.name.clone(), index).is_some() {
            return refused(
                step.line,
                format!(
                    "a second step named `{}`: give each step its own name",
                    step.name
                ),
            );
        }
        for (name, path) in &raw_step.outputs {
            let key = step.outputs[name].clone();
            if let Some(other) = made_by.insert(key.clone(), index) {
                return refused(
                    path.referenced.line(),
                    format!(
                        "output {key} of step `{}` is also an output of step `{}`: give each \
                         file one producer",
                        step.name, raw.steps[other].name.value
                    ),
                );
            }
        }
        steps.push(step);
    }
    link(&mut steps, &made_by)?;
    check_acyclic(&steps)?;
    Ok(Workflow { steps })
}

/// serde-saphyr's message without its "line N column M" head.
fn yaml_message(message: &str) -> String {
    let line = message.lines().next().unwrap_or(message);
    let line = line.strip_prefix("error: ").unwrap_or(line);
    let text = match line.split_once(": ") {
        Some((head, rest)) if head.starts_with("line ") => rest.to_string(),
        _ => line.to_string(),
    };
    if text.contains("unknown field") {
        format!(
            "{text} (a workflow has `steps`; a step has name, function, env, inputs, outputs, \
             memory, timeout; an input has path and stream)"
        )
    } else {
        text
    }
}

fn check_step(raw: &RawStep) -> Result<Step, WorkflowError> {
    let line = raw.name.referenced.line();
    let name = raw.name.value.clone();
    check_function_name(&name).or_else(|e| refused(line, format!("step name: {}", e.message)))?;
    let Some(words) = raw.function.as_ref().filter(|w| !w.is_empty()) else {
        return refused(
            line,
            format!(
                "step `{name}` has no function: give `function: [EXECUTABLE, ARG, ...]` (the \
                 executable's path on the nodes, then its arguments)"
            ),
        );
    };
    let mut inputs = Vec::new();
    for (input, spec) in &raw.inputs {
        inputs.push(Input {
            name: input.clone(),
            path: checked_path(&spec.path, &name)?,
            line: spec.path.referenced.line(),
            stream: spec.stream,
            producer: None,
        });
    }
    let mut outputs = BTreeMap::new();
    for (output, path) in &raw.outputs {
        outputs.insert(output.clone(), checked_path(path, &name)?);
    }
    let argv = words
        .iter()
        .map(|word| substitute(word, &inputs, &outputs))
        .collect::<Result<_, _>>()?;
    Ok(Step {
        line,
        argv,
        env: raw.env.clone(),
        inputs,
        outputs,
        memory_bytes: match &raw.memory {
            Some(memory) => parse_memory(memory)?,
            None => DEFAULT_MEMORY_BYTES,
        },
        timeout_ms: match &raw.timeout {
            Some(timeout) => parse_timeout(timeout)?,
            None => DEFAULT_TIMEOUT_MS,
        },
        name,
    })
}

fn checked_path(path: &Spanned<String>, step: &str) -> Result<String, WorkflowError> {
    NamespacePath::parse(&path.value)
        .map(|p| p.to_string())
        .or_else(|e| {
            refused(
                path.referenced.line(),
                format!("step `{step}`: {}", e.message),
            )
        })
}

/// Replaces `${input.NAME}` and `${output.NAME}` with the file's path
/// relative to the mount; any other `$` is left alone.
fn substitute(
    word: &Spanned<String>,
    inputs: &[Input],
    outputs: &BTreeMap<String, String>,
) -> Result<String, WorkflowError> {
    let mut result = String::new();
    let mut rest = word.value.as_str();
    while let Some(at) = rest.find("${") {
        result.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let reference = after.split_once('}').map(|(r, _)| r);
        let found = reference.and_then(|r| match r.split_once('.') {
            Some(("input", name)) => Some(
                inputs
                    .iter()
                    .find(|i| i.name == name)
                    .map(|i| i.path.clone()),
            ),
            Some(("output", name)) => Some(outputs.get(name).cloned()),
            _ => None,
        });
        match (reference, found) {
            (Some(reference), Some(Some(path))) => {
                result.push_str(path.trim_start_matches('/'));
                rest = &after[reference.len() + 1..];
            }
            (Some(reference), Some(None)) => {
                return refused(
                    word.referenced.line(),
                    format!(
                        "`${{{reference}}}` names no {}: give one of its names ({})",
                        reference.split('.').next().unwrap_or(""),
                        names_of(reference, inputs, outputs)
                    ),
                )
            }
            _ => {
                result.push_str("${");
                rest = after;
            }
        }
    }
    result.push_str(rest);
    Ok(result)
}

fn names_of(reference: &str, inputs: &[Input], outputs: &BTreeMap<String, String>) -> String {
    let names: Vec<String> = if reference.starts_with("input.") {
        inputs.iter().map(|i| i.name.clone()).collect()
    } else {
        outputs.keys().cloned().collect()
    };
    if names.is_empty() {
        "the step has none".into()
    } else {
        names.join(", ")
    }
}

/// Sets each input's producer.
fn link(steps: &mut [Step], made_by: &HashMap<String, usize>) -> Result<(), WorkflowError> {
    for (index, step) in steps.iter_mut().enumerate() {
        for input in &mut step.inputs {
            input.producer = made_by.get(&input.path).copied();
            if input.producer == Some(index) {
                return refused(
                    input.line,
                    format!(
                        "step `{}` reads {} which it writes itself: a step cannot depend on \
                         itself",
                        step.name, input.path
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Refuses a cycle, naming its steps.
fn check_acyclic(steps: &[Step]) -> Result<(), WorkflowError> {
    // 0: not seen, 1: on the current path, 2: done.
    let mut mark = vec![0u8; steps.len()];
    for start in 0..steps.len() {
        let mut path = Vec::new();
        if let Some(cycle) = visit(steps, start, &mut mark, &mut path) {
            let names: Vec<&str> = cycle.iter().map(|&i| steps[i].name.as_str()).collect();
            return refused(
                steps[cycle[0]].line,
                format!(
                    "steps {} -> {} form a cycle: each reads what the next writes; break it",
                    names.join(" -> "),
                    names[0]
                ),
            );
        }
    }
    Ok(())
}

fn visit(steps: &[Step], at: usize, mark: &mut [u8], path: &mut Vec<usize>) -> Option<Vec<usize>> {
    match mark[at] {
        2 => return None,
        1 => {
            let from = path.iter().position(|&i| i == at).unwrap_or(0);
            return Some(path[from..].to_vec());
        }
        _ => {}
    }
    mark[at] = 1;
    path.push(at);
    for producer in steps[at].inputs.iter().filter_map(|i| i.producer) {
        if let Some(cycle) = visit(steps, producer, mark, path) {
            return Some(cycle);
        }
    }
    path.pop();
    mark[at] = 2;
    None
}

/// `64MiB`, `1GiB`, `512KiB` or a number of bytes.
fn parse_memory(text: &Spanned<String>) -> Result<u64, WorkflowError> {
    let value = text.value.trim();
    let (digits, unit) = split_unit(value);
    let scale = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => 0,
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|b| (MIN_MEMORY_BYTES..=MAX_MEMORY_BYTES).contains(b));
    bytes.map_or_else(
        || {
            refused(
                text.referenced.line(),
                format!(
                    "memory {value:?}: give a size from 4MiB to 1024GiB, like 64MiB, 1GiB or \
                     512KiB"
                ),
            )
        },
        Ok,
    )
}

/// `30s`, `500ms`, `2m`.
fn parse_timeout(text: &Spanned<String>) -> Result<u64, WorkflowError> {
    let value = text.value.trim();
    let (digits, unit) = split_unit(value);
    let scale = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        _ => 0,
    };
    let ms = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|ms| (1..=MAX_TIMEOUT_MS).contains(ms));
    ms.map_or_else(
        || {
            refused(
                text.referenced.line(),
                format!("timeout {value:?}: give 1ms to 60m, like 500ms, 30s or 2m"),
            )
        },
        Ok,
    )
}

fn split_unit(value: &str) -> (&str, &str) {
    let end = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    (&value[..end], value[end..].trim())
}

impl Workflow {
    /// The steps that `index` waits for, with whether it may start once
    /// they started (every input from it streams) rather than ended.
    pub fn dependencies(&self, index: usize) -> BTreeMap<usize, bool> {
        let mut depends = BTreeMap::new();
        for input in &self.steps[index].inputs {
            if let Some(producer) = input.producer {
                let streaming = depends.entry(producer).or_insert(true);
                *streaming &= input.stream;
            }
        }
        depends
    }

    /// Inputs that no step makes: they must exist before the run.
    pub fn external_inputs(&self) -> Vec<(&Step, &Input)> {
        self.steps
            .iter()
            .flat_map(|s| s.inputs.iter().map(move |i| (s, i)))
            .filter(|(_, i)| i.producer.is_none())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
steps:
  - name: make
    function: [/bin/sh, -c, 'seq 10 > ${output.list}']
    outputs: {list: /d/list.eph}
  - name: sum
    function: [/bin/sh, -c, 'cat ${input.list} > ${output.sum}; echo $HOME ${HOME}']
    inputs:
      list: {path: /d/list.eph, stream: true}
    outputs: {sum: /d/sum.eph}
    memory: 64MiB
    timeout: 500ms
  - name: other
    function: [/bin/true]
    inputs: {x: {path: /given.txt}}
";

    #[test]
    fn a_good_workflow_links_its_steps() {
        let workflow = parse(GOOD).unwrap();
        assert_eq!(workflow.steps.len(), 3);
        let sum = &workflow.steps[1];
        assert_eq!(
            sum.argv[2],
            "cat d/list.eph > d/sum.eph; echo $HOME ${HOME}"
        );
        assert_eq!(sum.memory_bytes, 64 << 20);
        assert_eq!(sum.timeout_ms, 500);
        assert_eq!(sum.inputs[0].producer, Some(0));
        assert_eq!(workflow.dependencies(1), BTreeMap::from([(0, true)]));
        assert!(workflow.dependencies(0).is_empty());
        let external = workflow.external_inputs();
        assert_eq!(external.len(), 1);
        assert_eq!(external[0].1.path, "/given.txt");
        assert_eq!(external[0].1.line, 14);
    }

    #[test]
    fn the_example_workflow_is_valid_and_short() {
        let text = include_str!("../../../examples/f3-wordcount.yaml");
        assert!(text.lines().count() < 30);
        let workflow = parse(text).unwrap();
        assert_eq!(
            workflow.steps[1].argv[2],
            "tr ' ' '\\n' < wordcount-text.eph > wordcount-words.eph"
        );
        assert_eq!(workflow.dependencies(1), BTreeMap::from([(0, true)]));
        assert_eq!(workflow.dependencies(2), BTreeMap::from([(1, false)]));
    }

    fn refusal(text: &str) -> WorkflowError {
        parse(text).expect_err("must be refused")
    }

    #[test]
    fn a_cycle_is_refused_with_its_steps() {
        let error = refusal(
            "steps:\n  - name: a\n    function: [/bin/true]\n    inputs: {x: {path: /b}}\n    \
             outputs: {y: /a}\n  - name: b\n    function: [/bin/true]\n    inputs: {x: {path: \
             /a}}\n    outputs: {y: /b}\n",
        );
        assert!(error.message.contains("cycle"), "{error}");
        assert!(error.message.contains("a -> b -> a"), "{error}");
        assert_eq!(error.line, 2);
    }

    #[test]
    fn bad_steps_are_refused_with_lines() {
        let unknown = refusal("steps:\n  - name: a\n    function: [/bin/true]\n    memroy: 1\n");
        assert_eq!(unknown.line, 4, "{unknown}");
        assert!(unknown.message.contains("memroy"), "{unknown}");
        let none = refusal("steps:\n  - name: a\n    outputs: {x: /x}\n");
        assert_eq!(none.line, 2);
        assert!(none.message.contains("no function"), "{none}");
        let duplicate = refusal(
            "steps:\n  - name: a\n    function: [/bin/true]\n    outputs: {x: /x}\n  - name: \
             b\n    function: [/bin/true]\n    outputs: {y: /x}\n",
        );
        assert_eq!(duplicate.line, 7);
        assert!(duplicate.message.contains("one producer"), "{duplicate}");
        let reference = refusal("steps:\n  - name: a\n    function: [cat, '${input.nope}']\n");
        assert_eq!(reference.line, 3);
        assert!(reference.message.contains("names no input"), "{reference}");
        let memory = refusal("steps:\n  - name: a\n    function: [x]\n    memory: 12 parsecs\n");
        assert_eq!(memory.line, 4);
        let path = refusal("steps:\n  - name: a\n    function: [x]\n    outputs: {x: /a/../b}\n");
        assert_eq!(path.line, 4);
        let own = refusal(
            "steps:\n  - name: a\n    function: [x]\n    inputs: {i: {path: /x}}\n    outputs: \
             {o: /x}\n",
        );
        assert!(own.message.contains("itself"), "{own}");
    }
}
