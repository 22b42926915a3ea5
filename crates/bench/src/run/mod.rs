//! A run: set up the volumes, start the workloads and drive the control
//! operations at their rates for the spec's duration, record every
//! operation, then delete everything the run made, also when it is
//! stopped early.

mod database;
mod instance;
mod operations;
mod restore;
mod scrape;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread::Scope;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::attach::{self, Attachment};
use crate::cleanup::cleanup_prefix;
use crate::error::{Error, Result};
use crate::inventory::Inventory;
use crate::provider::{Detail, NullProvider, Provider, QemuProvider, Stages, StrataProvider};
use crate::rate::{closed_loop, Arrivals};
use crate::record::{LineWriter, Record, RunInfo, Status, IO_SERIES, RECORDS};
use crate::sink::HttpSink;
use crate::spec::{Action, Attach, ControlOperation, RateLaw, Spec, VolumeGroup};

/// How long workloads may go on after the run's duration (fio's verify
/// pass, a command finishing) before they are stopped.
pub const WORKLOAD_GRACE: Duration = Duration::from_secs(30);
/// How long a stopped workload gets between SIGTERM and SIGKILL.
const KILL_AFTER: Duration = Duration::from_secs(5);
/// How often waiting loops look at the clock and the stop flag.
const POLL: Duration = Duration::from_millis(20);
/// Most records one run writes before it stops starting operations (a
/// null provider's closed loop makes some 100,000 a second): the file
/// stays under about a gigabyte, and `report` reads it whole.
pub const MAX_RECORDS: u64 = 5_000_000;
/// How long a closed loop's operation that found nothing to act on waits
/// before it tries again.
const SKIP_BACKOFF: Duration = Duration::from_millis(100);
/// How often progress ticks are sent while the run measures.
const TICK: Duration = Duration::from_millis(250);

/// Which provider a run uses.
pub enum ProviderChoice {
    /// Start a Strata daemon (this `strata` binary) with its pool in the
    /// run directory, and stop it at the end.
    StartStrata {
        /// The `strata` binary.
        strata: PathBuf,
    },
    /// A running Strata daemon.
    Strata {
        /// Its API address, `HOST:PORT`.
        api: String,
        /// Its API token, if it checks one.
        token: Option<String>,
    },
    /// The null provider.
    Null,
    /// qemu-storage-daemon, started with its files in the run directory.
    Qemu,
}

/// How to run a spec.
pub struct RunOptions {
    /// The run directory (created; must be empty if it exists).
    pub out: PathBuf,
    /// The seed of every random draw.
    pub seed: u64,
    /// The provider.
    pub provider: ProviderChoice,
    /// The spec's text, kept in the run directory as `spec.yaml`.
    pub spec_text: String,
    /// What the run changed of the spec (already applied to it), kept
    /// beside it as `overrides.json` when anything.
    pub overrides: crate::spec::parallelism_override::Overrides,
}

/// What a run tells its caller as it goes (the library never prints).
#[derive(Clone, Debug)]
pub enum Event {
    /// The run has its id and directory.
    Started {
        /// The run id.
        run_id: String,
        /// The provider's name.
        provider: &'static str,
    },
    /// A phase began: setup, running, cleanup.
    Phase(String),
    /// Seconds measured so far, of the spec's duration.
    Tick(f64),
    /// An operation was recorded.
    Operation {
        /// The spec's name for it.
        operation: String,
        /// How it ended.
        status: Status,
    },
    /// Something the person running the benchmark should know.
    Warning(String),
}

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    /// The run id.
    pub run_id: String,
    /// The run directory.
    pub dir: PathBuf,
    /// Records written.
    pub records: u64,
    /// Records whose status is not ok.
    pub failures: u64,
    /// Volumes the cleanup could not delete (none when all went well).
    pub leftovers: Vec<String>,
    /// Whether the run was stopped early.
    pub interrupted: bool,
}

/// A fresh run id: `cns` and eight hex digits, from the clock and the
/// process id (not from the seed: two runs with one seed must not share
/// names).
fn new_run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = (nanos ^ (u64::from(std::process::id()) << 40)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("cns{:08x}", (mixed >> 32) as u32)
}

/// Makes the run directory, refusing one that holds anything: results of
/// two runs must never mix.
fn make_run_directory(dir: &Path) -> Result<()> {
    if let Ok(mut entries) = std::fs::read_dir(dir) {
        if entries.next().is_some() {
            return Err(Error::RunDirectory {
                path: dir.to_path_buf(),
                message: "not empty: give --out a new directory (each run keeps its own results)"
                    .into(),
            });
        }
    }
    std::fs::create_dir_all(dir.join("workloads"))
        .map_err(|e| Error::io("cannot create the run directory", dir, e))
}

/// Writes every trace the spec's rates replay to `DIR/traces/RATE.csv`
/// (a header, then one arrival time in seconds per line), so that the run
/// directory holds what the run replayed even if the spec's file changes.
fn keep_traces(spec: &Spec, dir: &Path) -> Result<()> {
    let mut kept = std::collections::BTreeSet::new();
    for operation in &spec.control_operations {
        let RateLaw::Trace(times) = &operation.rate else {
            continue;
        };
        if !kept.insert(operation.rate_name.clone()) {
            continue;
        }
        let traces = dir.join("traces");
        std::fs::create_dir_all(&traces).map_err(|e| Error::io("cannot create", &traces, e))?;
        let mut text = String::from("seconds\n");
        for time in times {
            text.push_str(&format!("{}\n", time.as_secs_f64()));
        }
        let path = traces.join(format!("{}.csv", operation.rate_name));
        std::fs::write(&path, text).map_err(|e| Error::io("cannot write", &path, e))?;
    }
    Ok(())
}

/// Runs `spec`; `stop` turning true (Ctrl-C) ends it early, and its
/// volumes are deleted either way.
pub fn run(
    spec: &Spec,
    options: RunOptions,
    stop: &AtomicBool,
    events: &(dyn Fn(Event) + Sync),
) -> Result<Outcome> {
    if let Some(op) = spec
        .control_operations
        .iter()
        .find(|op| matches!(op.rate, RateLaw::TraceFile { .. }))
    {
        return Err(Error::Argument(format!(
            "rate `{}`: its trace file was not read: call `Spec::read_trace_files` before the run",
            op.rate_name
        )));
    }
    let dir = options.out.clone();
    make_run_directory(&dir)?;
    // Absolute: workloads run in directories of their own.
    let dir = dir
        .canonicalize()
        .map_err(|e| Error::io("cannot resolve the run directory", &dir, e))?;
    let spec_copy = dir.join("spec.yaml");
    std::fs::write(&spec_copy, &options.spec_text)
        .map_err(|e| Error::io("cannot write", &spec_copy, e))?;
    keep_traces(spec, &dir)?;
    if !options.overrides.is_empty() {
        use crate::spec::parallelism_override::OVERRIDES_FILE;
        let path = dir.join(OVERRIDES_FILE);
        let text = serde_json::to_string(&options.overrides)
            .map_err(|e| Error::io("cannot write", &path, std::io::Error::other(e)))?;
        std::fs::write(&path, text).map_err(|e| Error::io("cannot write", &path, e))?;
    }
    let run_id = new_run_id();
    let started_unix = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let (provider, api, own_daemon): (Box<dyn Provider>, Option<String>, bool) = match &options
        .provider
    {
        ProviderChoice::Null => (Box::new(NullProvider), None, false),
        ProviderChoice::Qemu => {
            events(Event::Phase("starting qemu-storage-daemon".into()));
            let qemu = QemuProvider::start(&dir.join("qemu"), &dir.join("qemu.log"))
                .map_err(Error::Provider)?;
            (Box::new(qemu), None, true)
        }
        ProviderChoice::Strata { api, token } => (
            Box::new(StrataProvider::connect(api, token.clone())),
            Some(api.clone()),
            false,
        ),
        ProviderChoice::StartStrata { strata } => {
            events(Event::Phase("starting the volume daemon".into()));
            let daemon = StrataProvider::start(strata, &dir.join("pool"), &dir.join("daemon.log"))
                .map_err(Error::Provider)?;
            let api = daemon.api().to_string();
            (Box::new(daemon), Some(api), true)
        }
    };
    let mut info = RunInfo {
        run_id: run_id.clone(),
        seed: options.seed,
        provider: provider.name().to_string(),
        api,
        own_daemon,
        started_unix,
        measure_start: 0.0,
        duration: spec.duration.as_secs_f64(),
        interrupted: false,
    };
    info.save(&dir)?;
    events(Event::Started {
        run_id: run_id.clone(),
        provider: provider.name(),
    });
    let mut run = Run {
        sink: spec.http_sink.as_deref().map(HttpSink::start),
        spec,
        dir: dir.clone(),
        run_id: run_id.clone(),
        seed: options.seed,
        provider: provider.as_ref(),
        records: LineWriter::create(dir.join(RECORDS))?,
        io: LineWriter::create(dir.join(IO_SERIES))?,
        clock: Instant::now(),
        inventory: Mutex::new(Inventory::default()),
        rng: Mutex::new(StdRng::seed_from_u64(options.seed)),
        stop,
        ending: AtomicBool::new(false),
        events,
        written: AtomicU64::new(0),
        failures: AtomicU64::new(0),
        attachments: Mutex::new(HashMap::new()),
        numbers: AtomicU64::new(0),
        servers: Mutex::new(HashMap::new()),
    };
    events(Event::Phase("setup".into()));
    run.setup();
    run.prepare_servers();
    info.measure_start = run.seconds(Instant::now());
    if !stop.load(Ordering::SeqCst) {
        events(Event::Phase("running".into()));
        run.measure();
    }
    info.interrupted = stop.load(Ordering::SeqCst);
    events(Event::Phase("cleanup".into()));
    let leftovers = run.cleanup();
    info.save(&dir)?;
    // The JSON files are complete: copy them into the results database.
    // A failure is told, not fatal: the JSON files hold the same results.
    events(Event::Phase("writing results.redb".into()));
    if let Err(e) = crate::results::write(&dir) {
        events(Event::Warning(e.to_string()));
    }
    if let Some(sink) = run.sink.take() {
        post_summary(sink, &dir, events);
    }
    let outcome = Outcome {
        run_id,
        dir,
        records: run.written.load(Ordering::SeqCst),
        failures: run.failures.load(Ordering::SeqCst),
        leftovers,
        interrupted: info.interrupted,
    };
    drop(run);
    if let Err(e) = provider.shutdown() {
        events(Event::Warning(e));
    }
    Ok(outcome)
}

/// POSTs the run's summary to the sink, waits for what is queued, and
/// tells how many bodies could not be posted (the run goes on either way).
fn post_summary(sink: HttpSink, dir: &Path, events: &(dyn Fn(Event) + Sync)) {
    match crate::report::summarize(dir) {
        Ok(summary) => match serde_json::to_string(&serde_json::json!({ "summary": summary })) {
            Ok(body) => sink.offer(body),
            Err(e) => events(Event::Warning(format!("the summary was not posted: {e}"))),
        },
        Err(e) => events(Event::Warning(format!("the summary was not posted: {e}"))),
    }
    let posted = sink.finish();
    if posted.failed > 0 {
        events(Event::Warning(format!(
            "outputs.http: {} of {} bodies could not be posted (the run's files have them all)",
            posted.failed,
            posted.failed + posted.sent
        )));
    }
}

/// The state of a run in progress.
struct Run<'a> {
    /// Where records are POSTed, if the spec says.
    sink: Option<HttpSink>,
    spec: &'a Spec,
    dir: PathBuf,
    run_id: String,
    seed: u64,
    provider: &'a dyn Provider,
    records: LineWriter,
    io: LineWriter,
    clock: Instant,
    inventory: Mutex<Inventory>,
    rng: Mutex<StdRng>,
    stop: &'a AtomicBool,
    /// Set when the duration is over or `stop` was asked: no new
    /// operation starts.
    ending: AtomicBool,
    events: &'a (dyn Fn(Event) + Sync),
    written: AtomicU64,
    failures: AtomicU64,
    /// The file systems of `attach: fs` volumes, by volume name.
    attachments: Mutex<HashMap<String, Attachment>>,
    /// Numbers for attachment directories and restore clones.
    numbers: AtomicU64,
    /// pgbench instances' servers, made at setup, by (workload, instance).
    servers: Mutex<HashMap<(String, u32), std::result::Result<crate::pgbench::Server, String>>>,
}

/// An operation's outcome before it becomes a record.
struct Done {
    target: String,
    stages: Stages,
    result: std::result::Result<Detail, String>,
    /// It found nothing to act on, and did nothing.
    skipped: bool,
}

impl Run<'_> {
    /// Seconds from the run's start to `at`.
    fn seconds(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.clock).as_secs_f64()
    }

    /// Writes a record and tells the caller.
    fn record(&self, operation: &str, action: &str, start: Instant, done: Done) {
        let status = match (&done.result, done.skipped) {
            (_, true) => Status::Skipped,
            (Ok(_), false) => Status::Ok,
            (Err(_), false) => Status::Error,
        };
        let (detail, error) = match done.result {
            Ok(detail) => (detail, None),
            Err(error) => (None, Some(error)),
        };
        let record = Record {
            operation: operation.to_string(),
            action: action.to_string(),
            target: done.target,
            start: self.seconds(start),
            stages: done
                .stages
                .0
                .iter()
                .map(|(name, at)| (name.to_string(), self.seconds(*at)))
                .collect(),
            end: self.seconds(Instant::now()),
            status,
            error,
            detail,
        };
        self.write(record);
    }

    fn write(&self, record: Record) {
        if record.status == Status::Error {
            self.failures.fetch_add(1, Ordering::SeqCst);
        }
        let (operation, status) = (record.operation.clone(), record.status);
        if let Err(e) = self.records.append(&record) {
            (self.events)(Event::Warning(e.to_string()));
        }
        if let Some(sink) = &self.sink {
            if let Ok(body) = serde_json::to_string(&record) {
                sink.offer(body);
            }
        }
        let written = self.written.fetch_add(1, Ordering::SeqCst) + 1;
        (self.events)(Event::Operation { operation, status });
        if written == MAX_RECORDS {
            self.ending.store(true, Ordering::SeqCst);
            (self.events)(Event::Warning(format!(
                "{MAX_RECORDS} records written, the most one run keeps: no new operation starts; \
                 shorten the run or lower its rates"
            )));
        }
    }

    /// A volume name of `group` with `index`: the run id, then the group's
    /// template.
    fn volume_name(&self, group: &str, index: u32) -> String {
        let template = self
            .spec
            .volumes
            .iter()
            .find(|g| g.name == group)
            .map_or("{group}-{index}", |g| g.template.as_str());
        let name = template
            .replace("{group}", group)
            .replace("{index}", &index.to_string());
        format!("{}-{name}", self.run_id)
    }

    /// Makes every group's first volumes, one after another; those a
    /// workload uses are marked held.
    fn setup(&self) {
        for group in &self.spec.volumes {
            let held = self
                .spec
                .workloads
                .iter()
                .map(|w| if w.volumes == group.name { w.count } else { 0 })
                .max()
                .unwrap_or(0);
            for _ in 0..group.count {
                if self.stop.load(Ordering::SeqCst) {
                    return;
                }
                let start = Instant::now();
                let (index, name, stages, result) = self.create_ready(group);
                let made = result.is_ok();
                if made {
                    self.inventory.lock().add_volume(
                        name.clone(),
                        &group.name,
                        index,
                        group.size,
                        index < held,
                    );
                }
                self.record(
                    "setup",
                    "create",
                    start,
                    Done {
                        target: name.clone(),
                        stages,
                        result,
                        skipped: false,
                    },
                );
                if made {
                    self.fill_for_restores(group, index, &name);
                }
            }
        }
    }

    /// A new volume of `group`, made ready as `make_ready` does:
    /// its index in the group, its name, its stages and the provider's
    /// answer. The caller adds it to the inventory if it was made.
    fn create_ready(
        &self,
        group: &VolumeGroup,
    ) -> (u32, String, Stages, std::result::Result<Detail, String>) {
        let index = self.inventory.lock().reserve_index(&group.name);
        let name = self.volume_name(&group.name, index);
        let mut stages = Stages::default();
        let result = self
            .provider
            .create_volume(&name, group.size, group.cluster_size, &mut stages)
            .and_then(|detail| {
                self.make_ready(&name, group, true, &mut stages)?;
                Ok(detail)
            });
        (index, name, stages, result)
    }

    /// Attaches a volume of an `attach: fs` group: its file through
    /// nbdfuse, a loop device, ext4 (if `format`: a new volume; a clone
    /// has its snapshot's) and a mount (stages attached, formatted,
    /// mounted). Nothing for other groups.
    fn make_ready(
        &self,
        name: &str,
        group: &VolumeGroup,
        format: bool,
        stages: &mut Stages,
    ) -> std::result::Result<(), String> {
        if group.attach != Attach::Fs {
            return Ok(());
        }
        let uri = self.provider.uri(name).ok_or_else(|| {
            format!(
                "the {} provider has no NBD export to put a file system on",
                self.provider.name()
            )
        })?;
        let number = self.numbers.fetch_add(1, Ordering::SeqCst);
        let mut attachment = Attachment::serve(&self.run_id, number, name, &uri)?;
        attachment.mount(format, stages)?;
        self.attachments.lock().insert(name.to_string(), attachment);
        Ok(())
    }

    /// Unmounts and detaches a volume's file system, if it has one.
    fn detach(&self, name: &str) -> std::result::Result<(), String> {
        let attachment = self.attachments.lock().remove(name);
        match attachment {
            Some(mut attachment) => attachment.detach(),
            None => Ok(()),
        }
    }

    /// Starts the workloads and the control operations, and waits for the
    /// duration (or `stop`), then for the workloads to end.
    fn measure(&self) {
        let measure_start = Instant::now();
        let deadline = measure_start + self.spec.duration;
        let together: u32 = self
            .spec
            .workloads
            .iter()
            .filter(|w| w.barrier)
            .map(|w| w.count)
            .sum();
        let barrier = Barrier::new(together as usize);
        let in_flight: Vec<AtomicU32> = self
            .spec
            .control_operations
            .iter()
            .map(|_| AtomicU32::new(0))
            .collect();
        std::thread::scope(|scope| {
            for workload in &self.spec.workloads {
                for instance in 0..workload.count {
                    let barrier = workload.barrier.then_some(&barrier);
                    scope.spawn(move || self.run_instance(workload, instance, barrier, deadline));
                }
            }
            scope.spawn(|| self.scrape_metrics());
            for (index, operation) in self.spec.control_operations.iter().enumerate() {
                let in_flight = &in_flight[index];
                scope.spawn(move || self.drive(operation, index as u64, in_flight, scope));
            }
            while Instant::now() < deadline && !self.stop.load(Ordering::SeqCst) {
                std::thread::sleep(TICK.min(deadline.saturating_duration_since(Instant::now())));
                (self.events)(Event::Tick(
                    measure_start
                        .elapsed()
                        .as_secs_f64()
                        .min(self.spec.duration.as_secs_f64()),
                ));
            }
            self.ending.store(true, Ordering::SeqCst);
        });
    }

    /// Sleeps until `at`; false if the run is ending first.
    fn sleep_until(&self, at: Instant) -> bool {
        loop {
            if self.ending.load(Ordering::SeqCst) || self.stop.load(Ordering::SeqCst) {
                return false;
            }
            let now = Instant::now();
            if now >= at {
                return true;
            }
            std::thread::sleep(POLL.min(at - now));
        }
    }

    /// Drives one control operation at its rate until the run ends.
    fn drive<'scope>(
        &'scope self,
        operation: &'scope ControlOperation,
        index: u64,
        in_flight: &'scope AtomicU32,
        scope: &'scope Scope<'scope, '_>,
    ) {
        // Each operation draws its own arrivals, so adding one to a spec
        // leaves the others' sequences as they were.
        let seed = self.seed ^ (index + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let limit = operation.limit.map(u64::from);
        if let RateLaw::ClosedLoop(in_flight) = operation.rate {
            closed_loop(in_flight, limit, &self.ending, |_| {
                if !self.perform(operation) {
                    // Nothing to act on yet (a delete before any create):
                    // wait a little rather than record a skip per spin.
                    std::thread::sleep(SKIP_BACKOFF);
                }
            });
            return;
        }
        let mut arrivals = Arrivals::new(operation.rate.clone(), seed);
        let mut next = Instant::now();
        let mut arrived = 0u64;
        while let Some(gap) = arrivals.next_gap() {
            next += gap;
            if !self.sleep_until(next) || limit.is_some_and(|limit| arrived >= limit) {
                return;
            }
            arrived += 1;
            if in_flight.load(Ordering::SeqCst) >= operation.max_in_flight {
                self.dropped(operation);
                continue;
            }
            in_flight.fetch_add(1, Ordering::SeqCst);
            scope.spawn(move || {
                let _acted = self.perform(operation);
                in_flight.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }

    /// Records an arrival that found `max_in_flight` operations in flight.
    fn dropped(&self, operation: &ControlOperation) {
        let now = self.seconds(Instant::now());
        self.write(Record {
            operation: operation.name.clone(),
            action: action_name(operation.action).into(),
            target: String::new(),
            start: now,
            stages: Default::default(),
            end: now,
            status: Status::Dropped,
            error: Some(format!(
                "{} already in flight (max_in_flight)",
                operation.max_in_flight
            )),
            detail: None,
        });
    }

    /// Deletes every volume whose name carries the run id (what the run
    /// made, found through the provider so that nothing is missed), a few
    /// passes in case one delete waits on another; what is left.
    fn cleanup(&self) -> Vec<String> {
        let mut left = self.detach_all();
        let prefix = format!("{}-", self.run_id);
        left.extend(cleanup_prefix(
            self.provider,
            &prefix,
            &mut |name, start, result| {
                self.record(
                    "cleanup",
                    "delete",
                    start,
                    Done {
                        target: name.to_string(),
                        stages: Stages::default(),
                        result,
                        skipped: false,
                    },
                );
            },
        ));
        left
    }

    /// Detaches every file system (before their volumes are deleted),
    /// recording each; then undoes whatever else of the run's is still
    /// attached. What could not be detached.
    fn detach_all(&self) -> Vec<String> {
        // Servers a stopped run never handed to its workloads hold their
        // file systems: dropping one stops it.
        self.servers.lock().clear();
        let names: Vec<String> = self.attachments.lock().keys().cloned().collect();
        let mut left = Vec::new();
        for name in names {
            let start = Instant::now();
            let result = self.detach(&name).map(|()| None);
            if let Err(e) = &result {
                left.push(format!("the file system of {name}: {e}"));
            }
            self.record(
                "cleanup",
                "detach",
                start,
                Done {
                    target: name,
                    stages: Stages::default(),
                    result,
                    skipped: false,
                },
            );
        }
        left.extend(attach::clean_run(&self.run_id));
        left
    }
}

/// The spec's word for an action.
pub fn action_name(action: Action) -> &'static str {
    match action {
        Action::Create => "create",
        Action::Delete => "delete",
        Action::Attach => "attach",
        Action::Snapshot => "snapshot",
        Action::DeleteSnapshot => "delete_snapshot",
        Action::Clone => "clone",
        Action::Resize => "resize",
        Action::Compact => "compact",
        Action::RestoreAndVerify => "restore_and_verify",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The traces a spec's rates replay are kept in the run directory,
    /// one file per rate, as read.
    #[test]
    fn replayed_traces_are_kept_in_the_run_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("arrivals.csv"), "time\n0.5\n1.25\n3\n").unwrap();
        let text = "\
duration: 2s
volumes:
  - {name: scratch, count: 0, size: 16M}
control_operations:
  - {name: creates, action: create, volumes: scratch, rate: replay}
  - {name: more, action: create, volumes: scratch, rate: replay}
rates:
  - {name: replay, trace_file: arrivals.csv}
";
        let mut spec = crate::spec::parse(text).unwrap();
        spec.read_trace_files(dir.path()).unwrap();
        keep_traces(&spec, dir.path()).unwrap();
        let kept = std::fs::read_to_string(dir.path().join("traces/replay.csv")).unwrap();
        assert_eq!(kept, "seconds\n0.5\n1.25\n3\n");
        assert_eq!(
            std::fs::read_dir(dir.path().join("traces"))
                .unwrap()
                .count(),
            1
        );
    }
}
