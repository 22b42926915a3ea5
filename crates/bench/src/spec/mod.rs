//! The benchmark spec: YAML read with serde (`deny_unknown_fields`
//! everywhere), then checked as a whole, so that a bad spec is refused with
//! its line and what to write instead before anything starts.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use crate::units::{Interval, Size, SizeChange};

/// Most volumes, workload instances, operations in flight or operations of
/// one control operation a spec may ask for: every one is a thread, a
/// process or a file on this host.
pub const MAX_COUNT: u32 = 1024;

/// Default cap on one control operation's operations in flight when its
/// rate is open (every, Poisson): a provider that stalls then sees at most
/// this many waiting, and the arrivals past it are recorded as dropped.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 64;

/// A spec that was refused: where, and what to write instead.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct SpecError {
    /// 1-based line in the YAML text (0 when the text has no line for it).
    pub line: u64,
    /// What is wrong and what to write instead.
    pub message: String,
}

/// A checked spec, ready to run.
#[derive(Clone, Debug)]
pub struct Spec {
    /// How long workloads run and control operations arrive.
    pub duration: Duration,
    /// Volume groups made before the workloads start.
    pub volumes: Vec<VolumeGroup>,
    /// I/O workloads.
    pub workloads: Vec<Workload>,
    /// Control operations and the rates that drive them.
    pub control_operations: Vec<ControlOperation>,
    /// Where results go unless `--out` says otherwise.
    pub output_dir: Option<String>,
    /// Pass/fail rules `strata bench compare` applies to two runs.
    pub thresholds: Vec<Threshold>,
    /// How often the provider's metrics are scraped during the run.
    pub metrics_every: Duration,
    /// Where each record and the summary are POSTed as JSON, if anywhere.
    pub http_sink: Option<String>,
}

/// How often the provider's metrics are scraped unless the spec says.
pub const DEFAULT_METRICS_EVERY: Duration = Duration::from_secs(1);

/// Volumes of one kind: `count` made at the start, more by `create` and
/// `clone` operations that name the group.
#[derive(Clone, Debug)]
pub struct VolumeGroup {
    /// The group's name, which workloads and operations refer to.
    pub name: String,
    /// Volumes made before the workloads start.
    pub count: u32,
    /// Size of each volume, in bytes.
    pub size: u64,
    /// Name template; `{group}` and `{index}` are replaced, and the run id
    /// is put in front so that cleanup finds every volume.
    pub template: String,
    /// Cluster size of the volumes' layers (the provider's default if none).
    pub cluster_size: Option<u64>,
    /// How workloads reach the volumes: the NBD export, or a file system.
    pub attach: Attach,
}

/// How a group's volumes are attached for their workloads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Attach {
    /// Workloads reach the NBD export itself (fio's nbd engine).
    #[default]
    Nbd,
    /// The export is a file through nbdfuse, on a loop device, formatted
    /// with ext4 once and mounted; workloads get the mount point.
    Fs,
}

/// A pgbench workload's options.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgbenchOptions {
    /// `pgbench -i -s SCALE`: 100,000 accounts per unit (about 15 MiB).
    #[serde(default = "one")]
    pub scale: u32,
    /// `pgbench -c CLIENTS`: concurrent sessions.
    #[serde(default = "one")]
    pub clients: u32,
}

/// What a workload instance runs.
#[derive(Clone, Debug)]
pub enum WorkloadKind {
    /// fio with these job options (values may hold variables); the runner
    /// adds the engine, the target and the logs.
    Fio(BTreeMap<String, String>),
    /// Any command, its words with variables replaced.
    Command(Vec<String>),
    /// PostgreSQL on the volume's file system, loaded by pgbench.
    Pgbench(PgbenchOptions),
}

/// Instances of one I/O job, each on a volume of a group.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Its name in records and reports.
    pub name: String,
    /// How many instances; instance `i` uses the group's volume `i`.
    pub count: u32,
    /// The volume group it uses.
    pub volumes: String,
    /// Whether all instances start together (after every volume exists).
    pub barrier: bool,
    /// What each instance runs.
    pub kind: WorkloadKind,
    /// How a `command` workload's output gives its one-second series
    /// (`parse:`); without one, a command has none.
    pub parser: Option<crate::output_parser::OutputParser>,
}

/// A control operation's action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Create a volume in the group.
    Create,
    /// Delete a volume of the group.
    Delete,
    /// Attach to a volume of the group: ask the provider where it is
    /// served and finish an NBD handshake with it; nothing is made.
    Attach,
    /// Snapshot a volume of the group.
    Snapshot,
    /// Delete a snapshot taken by this run (one without clones).
    DeleteSnapshot,
    /// Clone a snapshot taken by this run into the `into` group.
    Clone,
    /// Grow a volume of the group.
    Resize,
    /// Compact a volume's chain of layers, waiting until it is done.
    Compact,
    /// Clone a snapshot, check its data, delete the clone: ok if the
    /// check passed.
    RestoreAndVerify,
}

/// Which volume or snapshot an operation acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selector {
    /// The one made first.
    Oldest,
    /// The one made last.
    Newest,
    /// One at random (seeded).
    Random,
}

/// How often an operation arrives.
#[derive(Clone, Debug, PartialEq)]
pub enum RateLaw {
    /// One every interval.
    Every(Duration),
    /// Poisson arrivals: exponential gaps with this mean.
    Poisson(Duration),
    /// This many always in flight: each one that ends starts the next.
    ClosedLoop(u32),
    /// The gap goes linearly from `from` to `to` over `over`, then stays.
    Ramp {
        /// The first gap.
        from: Duration,
        /// The gap after `over`.
        to: Duration,
        /// How long the change takes.
        over: Duration,
    },
    /// One every `.0` for `.1` (the last step lasts to the end), in order.
    Steps(Vec<(Duration, Option<Duration>)>),
    /// Arrivals at exactly these times since the run's start, then none.
    Trace(Vec<Duration>),
    /// A trace still in its file (relative to the spec's directory), as
    /// parsed; [`Spec::read_trace_files`] makes it a `Trace`.
    TraceFile {
        /// The file as the spec names it.
        path: String,
        /// The spec's line that names it.
        line: u64,
    },
    /// Arrivals per second go from `low` up to `high` by `step` each
    /// `every`, then back down to `low` by `step`, and so on.
    IncreaseDecrease {
        /// The lowest rate, in arrivals per second.
        low: f64,
        /// The highest rate, in arrivals per second.
        high: f64,
        /// How much the rate changes each `every`.
        step: f64,
        /// How long each rate holds.
        every: Duration,
    },
}

/// Highest rate of an `increase_decrease` law, in arrivals per second.
pub const MAX_ARRIVALS_PER_SECOND: f64 = 10_000.0;

/// Most arrival times a trace may list.
pub const MAX_TRACE: usize = 1_000_000;

/// A control operation with its rate.
#[derive(Clone, Debug)]
pub struct ControlOperation {
    /// Its name in records and reports.
    pub name: String,
    /// What it does.
    pub action: Action,
    /// The group it acts on (for a `workload` target, that workload's).
    pub group: String,
    /// Only the volumes this workload uses (its first `count` of the group).
    pub workload: Option<String>,
    /// Which volume or snapshot.
    pub select: Selector,
    /// The rate's name, for records.
    pub rate_name: String,
    /// How often.
    pub rate: RateLaw,
    /// At most this many operations (none: until the run ends).
    pub limit: Option<u32>,
    /// At most this many in flight (open rates).
    pub max_in_flight: u32,
    /// `resize`: the new size.
    pub size: Option<SizeChange>,
    /// `clone`: the group the new volumes join.
    pub into: Option<String>,
}

// ---- the YAML as written ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    duration: Interval,
    #[serde(default)]
    volumes: Vec<RawVolumeGroup>,
    #[serde(default)]
    workloads: Vec<RawWorkload>,
    #[serde(default)]
    control_operations: Vec<RawOperation>,
    #[serde(default)]
    rates: Vec<RawRate>,
    #[serde(default)]
    outputs: Option<RawOutputs>,
    #[serde(default)]
    thresholds: Vec<RawThreshold>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVolumeGroup {
    name: Spanned<String>,
    #[serde(default = "one")]
    count: u32,
    size: Size,
    template: Option<Spanned<String>>,
    cluster_size: Option<Size>,
    #[serde(default)]
    attach: Attach,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    name: Spanned<String>,
    #[serde(default = "one")]
    count: u32,
    volumes: Option<Spanned<String>>,
    #[serde(default = "yes")]
    barrier: bool,
    fio: Option<BTreeMap<String, FioValue>>,
    command: Option<Vec<String>>,
    pgbench: Option<PgbenchOptions>,
    parse: Option<RawParse>,
}

/// A command's output parser as the spec writes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParse {
    /// A regular expression over each line of the command's standard
    /// output, with a group `ops` (and `read_kib`, `write_kib` if wanted).
    pattern: String,
    /// The groups are running totals, not each line's own figures.
    #[serde(default)]
    cumulative: bool,
}

/// A fio option's value: YAML may give a number or a boolean for it.
#[derive(Deserialize)]
#[serde(untagged)]
enum FioValue {
    Number(i64),
    Float(f64),
    Flag(bool),
    Text(String),
}

impl FioValue {
    fn text(&self) -> String {
        match self {
            FioValue::Number(n) => n.to_string(),
            FioValue::Float(f) => f.to_string(),
            FioValue::Flag(b) => u8::from(*b).to_string(),
            FioValue::Text(t) => t.clone(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOperation {
    name: Spanned<String>,
    action: Action,
    volumes: Option<Spanned<String>>,
    workload: Option<Spanned<String>>,
    #[serde(default = "newest")]
    select: Selector,
    rate: Spanned<String>,
    limit: Option<u32>,
    max_in_flight: Option<u32>,
    size: Option<SizeChange>,
    into: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRate {
    name: Spanned<String>,
    every: Option<Interval>,
    poisson_mean: Option<Interval>,
    in_flight: Option<u32>,
    ramp: Option<RawRamp>,
    steps: Option<Vec<RawStep>>,
    trace: Option<Vec<f64>>,
    trace_file: Option<Spanned<String>>,
    increase_decrease: Option<RawIncreaseDecrease>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIncreaseDecrease {
    low: f64,
    high: f64,
    step: f64,
    every: Interval,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRamp {
    from: Interval,
    to: Interval,
    over: Interval,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    every: Interval,
    #[serde(rename = "for")]
    lasting: Option<Interval>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutputs {
    dir: Option<String>,
    metrics_every: Option<Interval>,
    http: Option<Spanned<String>>,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

fn newest() -> Selector {
    Selector::Newest
}

/// Reads and checks a spec: YAML errors (unknown fields, bad values) and
/// errors across sections (a rate that names nothing, a workload with no
/// volume) each come with the line to fix.
pub fn parse(text: &str) -> Result<Spec, SpecError> {
    let raw: RawSpec = serde_saphyr::from_str(text).map_err(|e| SpecError {
        line: e.location().map_or(0, |l| l.line()),
        message: first_line(&e.to_string()),
    })?;
    check(raw)
}

/// serde-saphyr's message without its "error: line N column M:" head and
/// the source excerpt under it (the line is reported on its own).
fn first_line(message: &str) -> String {
    let line = message.lines().next().unwrap_or(message);
    let line = line.strip_prefix("error: ").unwrap_or(line);
    match line.split_once(": ") {
        Some((head, rest)) if head.starts_with("line ") => rest.to_string(),
        _ => line.to_string(),
    }
}

fn refused<T>(at: &Spanned<String>, message: String) -> Result<T, SpecError> {
    Err(SpecError {
        line: at.referenced.line(),
        message,
    })
}

/// Names as a list for "write one of ..." hints.
fn one_of(names: &[String]) -> String {
    if names.is_empty() {
        "(none defined)".to_string()
    } else {
        names.join(", ")
    }
}

fn check(raw: RawSpec) -> Result<Spec, SpecError> {
    let groups = check_groups(&raw.volumes)?;
    let workloads = workload::check_workloads(&raw.workloads, &groups)?;
    let rates = check_rates(&raw.rates)?;
    let mut seen = HashSet::new();
    let mut operations = Vec::new();
    for op in &raw.control_operations {
        if !seen.insert(op.name.value.clone()) {
            return refused(
                &op.name,
                format!(
                    "a second control operation named `{}`: give each its own name",
                    op.name.value
                ),
            );
        }
        operations.push(check_operation(op, &groups, &workloads, &rates)?);
    }
    let thresholds = check_thresholds(&raw.thresholds, &operations, &workloads)?;
    let http_sink = match raw.outputs.as_ref().and_then(|o| o.http.as_ref()) {
        Some(url) => {
            crate::sink::check_url(&url.value).or_else(|message| refused(url, message))?;
            Some(url.value.clone())
        }
        None => None,
    };
    Ok(Spec {
        duration: raw.duration.0,
        volumes: groups,
        workloads,
        control_operations: operations,
        metrics_every: raw
            .outputs
            .as_ref()
            .and_then(|o| o.metrics_every)
            .map_or(DEFAULT_METRICS_EVERY, |every| every.0),
        output_dir: raw.outputs.and_then(|o| o.dir),
        thresholds,
        http_sink,
    })
}

fn check_name(at: &Spanned<String>, what: &str) -> Result<(), SpecError> {
    let name = &at.value;
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        return Ok(());
    }
    refused(at, format!("{what} name `{name}`: use 1 to 64 letters, digits, '-' or '_', starting with a letter or digit"))
}

fn check_count(at: &Spanned<String>, what: &str, count: u32, least: u32) -> Result<(), SpecError> {
    if count < least || count > MAX_COUNT {
        return refused(
            at,
            format!(
                "{what} `{}`: count {count}: write a count from {least} to {MAX_COUNT}",
                at.value
            ),
        );
    }
    Ok(())
}

fn check_groups(raw: &[RawVolumeGroup]) -> Result<Vec<VolumeGroup>, SpecError> {
    let mut groups: Vec<VolumeGroup> = Vec::new();
    for group in raw {
        check_name(&group.name, "volume group")?;
        check_count(&group.name, "volume group", group.count, 0)?;
        if groups.iter().any(|g| g.name == group.name.value) {
            return refused(
                &group.name,
                format!(
                    "a second volume group named `{}`: give each its own name",
                    group.name.value
                ),
            );
        }
        let template = group.template.clone().unwrap_or_else(|| Spanned {
            value: "{group}-{index}".to_string(),
            referenced: group.name.referenced,
            defined: group.name.defined,
        });
        check_template(&template, &group.name.value)?;
        let template = template.value;
        groups.push(VolumeGroup {
            name: group.name.value.clone(),
            count: group.count,
            size: group.size.0,
            template,
            cluster_size: group.cluster_size.map(|s| s.0),
            attach: group.attach,
        });
    }
    Ok(groups)
}

/// Longest name a template may make (with a 4-digit index): the run id
/// and a dash go in front, and volume names take at most 64 characters.
const MAX_TEMPLATE_NAME: usize = 64 - RUN_ID_LEN - 1;

/// Length of a run id (`cns` and eight hex digits), which starts every
/// name a run gives.
pub const RUN_ID_LEN: usize = 11;

/// A template must make distinct names (so it holds `{index}`) of the
/// characters volume names take, short enough for the run id in front.
fn check_template(at: &Spanned<String>, group: &str) -> Result<(), SpecError> {
    let sample = at
        .value
        .replace("{group}", group)
        .replace("{index}", "9999");
    // Starting with a letter or digit: names the run gives its own
    // volumes (restore-and-verify clones, `RUNID--rvN`) cannot collide.
    let fits = sample.starts_with(|c: char| c.is_ascii_alphanumeric())
        && sample
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !at.value.contains("{index}") || !fits || sample.len() > MAX_TEMPLATE_NAME {
        return refused(at, format!(
            "volume names `{}`: write a template of letters, digits, '-', '_' or '.', starting with a letter or digit, with {{index}} (and optionally {{group}}), that makes names of at most {MAX_TEMPLATE_NAME} characters, such as \"{{group}}-{{index}}\"",
            at.value
        ));
    }
    Ok(())
}

fn check_rates(raw: &[RawRate]) -> Result<Vec<(String, RateLaw)>, SpecError> {
    let mut rates: Vec<(String, RateLaw)> = Vec::new();
    for rate in raw {
        check_name(&rate.name, "rate")?;
        if rates.iter().any(|(n, _)| *n == rate.name.value) {
            return refused(
                &rate.name,
                format!(
                    "a second rate named `{}`: give each its own name",
                    rate.name.value
                ),
            );
        }
        let law = rate_law(rate)?;
        rates.push((rate.name.value.clone(), law));
    }
    Ok(rates)
}

/// The one law a rate states.
fn rate_law(rate: &RawRate) -> Result<RateLaw, SpecError> {
    let name = &rate.name;
    let stated = [
        rate.every.is_some(),
        rate.poisson_mean.is_some(),
        rate.in_flight.is_some(),
        rate.ramp.is_some(),
        rate.steps.is_some(),
        rate.trace.is_some(),
        rate.trace_file.is_some(),
        rate.increase_decrease.is_some(),
    ];
    if stated.iter().filter(|s| **s).count() != 1 {
        return refused(name, format!(
            "rate `{}`: give exactly one of `every: 1s`, `poisson_mean: 500ms`, `in_flight: 4`, \
             `ramp: {{from: 1s, to: 100ms, over: 30s}}`, `steps: [{{every: 1s, for: 10s}}, {{every: 200ms}}]` \
             `trace: [0.5, 1.25, 3]`, `trace_file: arrivals.csv` \
             or `increase_decrease: {{low: 1, high: 10, step: 1, every: 2s}}`",
            name.value
        ));
    }
    if let Some(path) = &rate.trace_file {
        if path.value.trim().is_empty() {
            return refused(
                path,
                format!(
                    "rate `{}`: trace_file: name a CSV file (relative to the spec's directory)",
                    name.value
                ),
            );
        }
        return Ok(RateLaw::TraceFile {
            path: path.value.clone(),
            line: path.referenced.line(),
        });
    }
    if let Some(law) = &rate.increase_decrease {
        return increase_decrease(name, law);
    }
    if let Some(every) = rate.every {
        return Ok(RateLaw::Every(every.0));
    }
    if let Some(mean) = rate.poisson_mean {
        return Ok(RateLaw::Poisson(mean.0));
    }
    if let Some(ramp) = &rate.ramp {
        return Ok(RateLaw::Ramp {
            from: ramp.from.0,
            to: ramp.to.0,
            over: ramp.over.0,
        });
    }
    if let Some(steps) = &rate.steps {
        let open = steps.iter().position(|s| s.lasting.is_none());
        if steps.is_empty() || steps.len() > 1000 || open.is_some_and(|at| at + 1 != steps.len()) {
            return refused(name, format!(
                "rate `{}`: steps: write 1 to 1000 steps, each `{{every: T, for: T}}`; only the last may leave out `for`",
                name.value
            ));
        }
        return Ok(RateLaw::Steps(
            steps
                .iter()
                .map(|s| (s.every.0, s.lasting.map(|l| l.0)))
                .collect(),
        ));
    }
    if let Some(trace) = &rate.trace {
        let ordered = trace.windows(2).all(|w| w[0] <= w[1]);
        let bounded = trace
            .iter()
            .all(|t| t.is_finite() && *t >= 0.0 && *t <= 7.0 * 86_400.0);
        if trace.is_empty() || trace.len() > MAX_TRACE || !ordered || !bounded {
            return refused(name, format!(
                "rate `{}`: trace: write 1 to {MAX_TRACE} arrival times in seconds since the start, in order, \
                 none negative or past a week (such as [0.5, 1.25, 3])",
                name.value
            ));
        }
        return Ok(RateLaw::Trace(
            trace.iter().map(|t| Duration::from_secs_f64(*t)).collect(),
        ));
    }
    match rate.in_flight {
        Some(n) if (1..=MAX_COUNT).contains(&n) => Ok(RateLaw::ClosedLoop(n)),
        n => refused(
            name,
            format!(
                "rate `{}`: in_flight {}: write 1 to {MAX_COUNT}",
                name.value,
                n.unwrap_or(0)
            ),
        ),
    }
}

/// An `increase_decrease` law with rates from just above 0 to
/// [`MAX_ARRIVALS_PER_SECOND`], `low` at most `high`, and a step that
/// moves.
fn increase_decrease(
    name: &Spanned<String>,
    law: &RawIncreaseDecrease,
) -> Result<RateLaw, SpecError> {
    let rate_ok = |r: f64| r.is_finite() && r > 0.0 && r <= MAX_ARRIVALS_PER_SECOND;
    if !rate_ok(law.low) || !rate_ok(law.high) || law.low > law.high || !rate_ok(law.step) {
        return refused(name, format!(
            "rate `{}`: increase_decrease: write `low`, `high` and `step` in arrivals per second, each above 0 and at most {MAX_ARRIVALS_PER_SECOND}, with low at most high (such as {{low: 1, high: 10, step: 1, every: 2s}})",
            name.value
        ));
    }
    Ok(RateLaw::IncreaseDecrease {
        low: law.low,
        high: law.high,
        step: law.step,
        every: law.every.0,
    })
}

fn check_operation(
    op: &RawOperation,
    volume_groups: &[VolumeGroup],
    workloads: &[Workload],
    rates: &[(String, RateLaw)],
) -> Result<ControlOperation, SpecError> {
    let name = &op.name;
    check_name(name, "control operation")?;
    let group_names: Vec<String> = volume_groups.iter().map(|g| g.name.clone()).collect();
    let groups = group_names.as_slice();
    let rate_names: Vec<String> = rates.iter().map(|(n, _)| n.clone()).collect();
    let Some((_, law)) = rates.iter().find(|(n, _)| *n == op.rate.value) else {
        return refused(&op.rate, format!(
            "control operation `{}`: `rate: {}` names no rate: write one of {} (or add it under `rates:`)",
            name.value,
            op.rate.value,
            one_of(&rate_names)
        ));
    };
    let (group, workload) = operation_target(op, groups, workloads)?;
    if op.action == Action::Delete && workloads.iter().any(|w| w.volumes == group) {
        return refused(name, format!(
            "control operation `{}` deletes volumes of group `{group}`, which workload `{}` writes to: delete from a group no workload uses (such as one that `create` fills)",
            name.value,
            workloads.iter().find(|w| w.volumes == group).map_or("", |w| w.name.as_str())
        ));
    }
    let into = match (&op.into, op.action) {
        (Some(into), Action::Clone) if groups.contains(&into.value) => Some(into.value.clone()),
        (Some(into), Action::Clone) => {
            return refused(into, format!("control operation `{}`: `into: {}` names no volume group: write one of {}", name.value, into.value, one_of(groups)))
        }
        (None, Action::Clone) => {
            return refused(name, format!("control operation `{}` clones: add `into: GROUP`, the volume group its clones join", name.value))
        }
        (Some(into), _) => return refused(into, format!("control operation `{}`: `into` is for `action: clone` only: remove it", name.value)),
        (None, _) => None,
    };
    if (op.action == Action::Resize) != op.size.is_some() {
        return refused(name, format!(
            "control operation `{}`: `size` goes with `action: resize` only (such as `size: +16M` or `size: 1G`)",
            name.value
        ));
    }
    if op.limit == Some(0) || op.limit.is_some_and(|l| l > 1_000_000) {
        return refused(
            name,
            format!(
                "control operation `{}`: limit: write 1 to 1000000, or leave it out",
                name.value
            ),
        );
    }
    if op.action == Action::RestoreAndVerify {
        check_restore(op, &group, workload.as_deref(), volume_groups, workloads)?;
    }
    let max_in_flight = op.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT);
    if !(1..=MAX_COUNT).contains(&max_in_flight) {
        return refused(
            name,
            format!(
                "control operation `{}`: max_in_flight: write 1 to {MAX_COUNT}",
                name.value
            ),
        );
    }
    Ok(ControlOperation {
        name: name.value.clone(),
        action: op.action,
        group,
        workload,
        select: op.select,
        rate_name: op.rate.value.clone(),
        rate: law.clone(),
        limit: op.limit,
        max_in_flight,
        size: op.size,
        into,
    })
}

/// The group (and workload) an operation acts on: exactly one of
/// `volumes` and `workload` names it.
fn operation_target(
    op: &RawOperation,
    groups: &[String],
    workloads: &[Workload],
) -> Result<(String, Option<String>), SpecError> {
    let name = &op.name;
    match (&op.volumes, &op.workload) {
        (Some(volumes), None) if groups.contains(&volumes.value) => Ok((volumes.value.clone(), None)),
        (Some(volumes), None) => refused(volumes, format!(
            "control operation `{}`: `volumes: {}` names no volume group: write one of {}",
            name.value,
            volumes.value,
            one_of(groups)
        )),
        (None, Some(at)) => match workloads.iter().find(|w| w.name == at.value) {
            Some(w) if op.action == Action::Create => refused(at, format!(
                "control operation `{}` creates volumes: name their group with `volumes: {}` instead of `workload:`",
                name.value, w.volumes
            )),
            Some(w) => Ok((w.volumes.clone(), Some(w.name.clone()))),
            None => {
                let names: Vec<String> = workloads.iter().map(|w| w.name.clone()).collect();
                refused(at, format!("control operation `{}`: `workload: {}` names no workload: write one of {}", name.value, at.value, one_of(&names)))
            }
        },
        _ => refused(name, format!(
            "control operation `{}`: give exactly one of `volumes: GROUP` or `workload: NAME` for what it acts on",
            name.value
        )),
    }
}

pub mod parallelism_override;
mod threshold;
mod trace_file;
mod workload;

use threshold::{check_thresholds, RawThreshold};
pub use threshold::{matches, Threshold, OPERATION_METRICS, WORKLOAD_METRICS};
pub use trace_file::{parse_trace, read_trace, MAX_TRACE_FILE_BYTES};

use workload::check_restore;
pub use workload::{restore_check, RestoreCheck};

#[cfg(test)]
mod tests;
