//! RS3 on a storage node's sockets: the I/O shell of
//! [`crate::storage::schedule`]. When scheduling is on, every Get's body
//! is handed to one sender task, which cuts batches with the core and
//! sends each slice with one `sendfile` (or one write, for a replica read
//! whole), then gives the connection back.
//!
//! Pacing: a batch goes out only once the bytes still queued in the
//! scheduled sockets (`SIOCOUTQ`: sent but not yet acknowledged) are under
//! one batch budget, and each socket is given room for at most one budget.
//! So at most about two budgets wait in the node's queues, and a small
//! read that arrives waits for about that, not for every byte big streams
//! have pushed into the socket buffers and the link's queue. When the
//! gate is closed the sender sleeps one tick ([`TICK`], 100 µs, on a
//! thread of its own): a budget per tick bounds the node's throughput
//! (64 KiB per 100 µs is about 5 Gbit/s), so the batch budget is sized to
//! the link; scheduling is a setting, off by default.

use crate::storage::schedule::batch::{Progress, RequestId, Scheduler};
use crate::storage::schedule::config::{ConfigError, ScheduleConfig};
use crate::storage::schedule::ClassId;
use crate::storage::sendfile::send_some;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::BufWriter;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// How long the sender waits when its gate is closed or no socket took
/// anything.
pub const TICK: Duration = Duration::from_micros(100);

/// Reads waiting to enter the sender; one more is refused at once.
const QUEUE: usize = 4096;

/// Latency bounds of [`ClassStats::latency_buckets`], in microseconds.
pub const LATENCY_BUCKETS_US: [u64; 10] = [
    500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 500_000, 2_000_000,
];

/// The body of a scheduled read.
pub enum Body {
    /// `length` bytes of a file from `offset`, sent with `sendfile`.
    File {
        /// The replica file.
        file: std::fs::File,
        /// Where its data starts.
        offset: u64,
        /// Data bytes.
        length: u64,
    },
    /// A replica read whole into memory.
    Memory(Vec<u8>),
}

impl Body {
    fn len(&self) -> u64 {
        match self {
            Body::File { length, .. } => *length,
            Body::Memory(data) => data.len() as u64,
        }
    }
}

/// How a scheduled read ended.
#[derive(Debug)]
pub enum Sent {
    /// Every byte went out (fewer if a file was cut short under us).
    Done(u64),
    /// The peer took nothing for the stall limit after this many bytes.
    Stalled(u64),
    /// The socket or the file failed.
    Failed(std::io::Error),
    /// The scheduler refused the read (full, or stopped).
    Refused(String),
}

/// One read handed to the sender, with the connection it goes out on.
struct Job {
    class: ClassId,
    writer: BufWriter<OwnedWriteHalf>,
    body: Body,
    stall: Duration,
    done: oneshot::Sender<(BufWriter<OwnedWriteHalf>, Sent)>,
}

enum Message {
    Read(Job),
    Configure(ScheduleConfig),
}

/// Counters of one class, for `/metrics` and `strata store status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Body bytes sent.
    pub bytes_sent: u64,
    /// Reads completed (sent whole, or ended short).
    pub reads_done: u64,
    /// Reads pending now.
    pub queued: u64,
    /// Sum of the completed reads' times from hand-off to last byte, µs.
    pub latency_sum_us: u64,
    /// Completed reads whose time was at most each bound of
    /// [`LATENCY_BUCKETS_US`] (cumulative, as Prometheus histograms are).
    pub latency_buckets: [u64; LATENCY_BUCKETS_US.len()],
}

/// The scheduler's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScheduleStats {
    /// Whether reads are scheduled now (from the settings in force).
    pub enabled: bool,
    /// The batch budget in force (from the settings).
    pub batch_bytes: u64,
    /// Batches cut.
    pub batches: u64,
    /// Per class, by name.
    pub classes: BTreeMap<String, ClassStats>,
}

/// The handle of a node's sender thread; cheap to clone.
#[derive(Clone)]
pub struct ScheduledSender {
    messages: mpsc::Sender<Message>,
    config: Arc<Mutex<ScheduleConfig>>,
    stats: Arc<Mutex<ScheduleStats>>,
}

impl ScheduledSender {
    /// Starts the sender thread with `config` (checked first); it ends
    /// when every handle is dropped.
    pub fn start(config: ScheduleConfig) -> Result<ScheduledSender, ConfigError> {
        let scheduler = Scheduler::new(config.clone())?;
        let (messages, inbox) = mpsc::channel(QUEUE);
        let stats = Arc::new(Mutex::new(ScheduleStats::default()));
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("strata-rs3".into())
            .spawn(move || run(scheduler, inbox, thread_stats))
            .map_err(|e| ConfigError::Thread(e.to_string()))?;
        Ok(ScheduledSender {
            messages,
            config: Arc::new(Mutex::new(config)),
            stats,
        })
    }

    /// What `look` reads from the settings in force (no copy of them).
    fn with_config<T>(&self, look: impl FnOnce(&ScheduleConfig) -> T) -> T {
        look(&self.config.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The settings in force.
    pub fn config(&self) -> ScheduleConfig {
        self.with_config(ScheduleConfig::clone)
    }

    /// Whether Gets go through the scheduler.
    pub fn enabled(&self) -> bool {
        self.with_config(|config| config.enabled)
    }

    /// Takes new settings (checked first) from the next batch on.
    pub fn configure(&self, config: ScheduleConfig) -> Result<(), ConfigError> {
        config.validate()?;
        *self.config.lock().unwrap_or_else(|e| e.into_inner()) = config.clone();
        // The sender applies it in order with the reads; a full queue only
        // delays it to the next try, so wait for room.
        let messages = self.messages.clone();
        tokio::spawn(async move {
            let _ = messages.send(Message::Configure(config)).await;
        });
        Ok(())
    }

    /// Applies an operator's settings text
    /// ([`ScheduleConfig::with_settings`]; empty changes nothing) and
    /// answers the settings in force and the counters, as text. New
    /// settings are handed to `keep` first (to make them outlive a
    /// restart), and are not applied if it fails.
    pub fn apply_settings(
        &self,
        text: &str,
        keep: impl FnOnce(&ScheduleConfig) -> Result<(), String>,
    ) -> Result<String, String> {
        let config = self.config().with_settings(text)?;
        if !text.trim().is_empty() {
            keep(&config)?;
            self.configure(config.clone()).map_err(|e| e.to_string())?;
        }
        let mut answer = config.to_settings();
        let stats = self.stats();
        answer.push_str(&format!("batches={}\n", stats.batches));
        for (class, c) in &stats.classes {
            answer.push_str(&format!(
                "class-stats={class}:bytes={},queued={},done={},latency_sum_us={}\n",
                c.bytes_sent, c.queued, c.reads_done, c.latency_sum_us
            ));
        }
        Ok(answer)
    }

    /// The counters now, with the settings in force.
    pub fn stats(&self) -> ScheduleStats {
        let mut stats = lock(&self.stats).clone();
        (stats.enabled, stats.batch_bytes) =
            self.with_config(|config| (config.enabled, config.batch_bytes));
        stats
    }

    /// Sends `body` on `writer` (already flushed) in the batches of
    /// `tenant`'s class, and gives the writer back with how it went.
    pub async fn send(
        &self,
        tenant: &str,
        writer: BufWriter<OwnedWriteHalf>,
        body: Body,
        stall: Duration,
    ) -> Option<(BufWriter<OwnedWriteHalf>, Sent)> {
        let class = self.with_config(|config| ClassId::new(config.class_of(tenant)));
        let (done, answer) = oneshot::channel();
        let job = Job {
            class,
            writer,
            body,
            stall,
            done,
        };
        match self.messages.try_send(Message::Read(job)) {
            Ok(()) => answer.await.ok(),
            Err(refused) => {
                let job = match refused.into_inner() {
                    Message::Read(job) => job,
                    Message::Configure(_) => return None,
                };
                let why = format!(
                    "the storage node's RS3 queue holds {QUEUE} reads, its limit: retry the read"
                );
                Some((job.writer, Sent::Refused(why)))
            }
        }
    }
}

/// A read being sent.
struct Active {
    job: Job,
    sent: u64,
    since: Instant,
    progress_at: Instant,
}

impl Active {
    fn socket(&self) -> &TcpStream {
        self.job.writer.get_ref().as_ref()
    }
}

/// The sender: takes reads, cuts batches, sends slices, on a thread of
/// its own so that it can wait a tenth of a millisecond between tries
/// (tokio's timer is no finer than one): at one budget per wake-up, a
/// coarser tick would bound the node's throughput.
fn run(
    mut scheduler: Scheduler,
    mut inbox: mpsc::Receiver<Message>,
    stats: Arc<Mutex<ScheduleStats>>,
) {
    let mut active: HashMap<RequestId, Active> = HashMap::new();
    loop {
        if active.is_empty() {
            match inbox.blocking_recv() {
                Some(message) => take(&mut scheduler, &mut active, &stats, message),
                None => return,
            }
        }
        while let Ok(message) = inbox.try_recv() {
            take(&mut scheduler, &mut active, &stats, message);
        }
        let budget = scheduler.config().batch_bytes;
        let queued = set_rooms(&mut scheduler, &active, budget);
        let mut sent_any = false;
        if queued < budget {
            let mut batch = scheduler.next_batch();
            lock(&stats).batches += 1;
            // Small slices first: a small read does not wait for the
            // other classes' big slices of the same batch.
            batch.slices.sort_by_key(|slice| slice.length_bytes);
            for slice in batch.slices {
                sent_any |= send_slice(&mut scheduler, &mut active, &stats, &slice);
            }
        }
        expire_stalled(&mut scheduler, &mut active, &stats);
        if !sent_any && !active.is_empty() {
            std::thread::sleep(TICK);
        }
    }
}

fn lock(stats: &Mutex<ScheduleStats>) -> std::sync::MutexGuard<'_, ScheduleStats> {
    stats.lock().unwrap_or_else(|e| e.into_inner())
}

/// Admits a read into the core, or applies new settings.
fn take(
    scheduler: &mut Scheduler,
    active: &mut HashMap<RequestId, Active>,
    stats: &Mutex<ScheduleStats>,
    message: Message,
) {
    let job = match message {
        Message::Read(job) => job,
        Message::Configure(config) => {
            // Checked by `configure` before it was sent.
            let _ = scheduler.reconfigure(config);
            return;
        }
    };
    if job.body.len() == 0 {
        let _ = job.done.send((job.writer, Sent::Done(0)));
        return;
    }
    match scheduler.enqueue(&job.class, job.body.len()) {
        Ok(id) => {
            lock(stats)
                .classes
                .entry(job.class.to_string())
                .or_default()
                .queued += 1;
            let now = Instant::now();
            active.insert(
                id,
                Active {
                    job,
                    sent: 0,
                    since: now,
                    progress_at: now,
                },
            );
        }
        Err(e) => {
            let _ = job.done.send((job.writer, Sent::Refused(e.to_string())));
        }
    }
}

/// Gives each read room for what its socket can take under one budget;
/// returns the bytes queued in all the scheduled sockets.
fn set_rooms(scheduler: &mut Scheduler, active: &HashMap<RequestId, Active>, budget: u64) -> u64 {
    let mut queued_total = 0u64;
    for (&id, read) in active {
        let queued = unacknowledged_bytes(read.socket());
        queued_total = queued_total.saturating_add(queued);
        let _ = scheduler.set_send_room(id, Some(budget.saturating_sub(queued)));
    }
    queued_total
}

/// Bytes sent on `socket` but not yet acknowledged (`SIOCOUTQ`): what
/// still waits in the node's queues and on the link.
fn unacknowledged_bytes(socket: &TcpStream) -> u64 {
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one c_int we own, on a socket
    // we hold.
    let status = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
    if status < 0 {
        return 0;
    }
    queued.max(0) as u64
}

/// Sends one slice; returns whether any byte went out.
fn send_slice(
    scheduler: &mut Scheduler,
    active: &mut HashMap<RequestId, Active>,
    stats: &Mutex<ScheduleStats>,
    slice: &crate::storage::schedule::batch::Slice,
) -> bool {
    let Some(read) = active.get_mut(&slice.request) else {
        return false;
    };
    let outcome = send_bytes(read, slice.length_bytes);
    let sent = match outcome {
        Ok(sent) => sent,
        Err(e) => {
            finish(scheduler, active, stats, slice.request, Sent::Failed(e));
            return false;
        }
    };
    if sent == 0 && matches!(read.job.body, Body::File { .. }) && file_ended(read) {
        // The file was cut short under us: end with what went.
        let total = read.sent;
        finish(scheduler, active, stats, slice.request, Sent::Done(total));
        return false;
    }
    if sent > 0 {
        read.sent += sent;
        read.progress_at = Instant::now();
        if let Some(class) = lock(stats).classes.get_mut(slice.class.as_str()) {
            class.bytes_sent += sent;
        }
    }
    if let Ok(Progress::Done) = scheduler.record_sent(slice.request, sent) {
        let total = read.sent;
        finish(scheduler, active, stats, slice.request, Sent::Done(total));
    }
    sent > 0
}

/// Sends up to `length` bytes of the read from where it is; stops early
/// when the socket is full. An error other than a full socket fails it.
fn send_bytes(read: &Active, length: u64) -> std::io::Result<u64> {
    let socket = read.socket();
    let mut sent = 0u64;
    while sent < length {
        let at = read.sent + sent;
        let want = (length - sent).min(usize::MAX as u64) as usize;
        let step = match &read.job.body {
            Body::File { file, offset, .. } => send_some(socket, file, offset + at, want),
            Body::Memory(data) => {
                let start = at as usize;
                let end = start.saturating_add(want).min(data.len());
                socket.try_write(&data[start..end])
            }
        };
        match step {
            Ok(0) => break,
            Ok(n) => sent += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

/// Whether a file read's file holds fewer bytes than its read still wants.
fn file_ended(read: &Active) -> bool {
    match &read.job.body {
        Body::File {
            file,
            offset,
            length,
        } => file
            .metadata()
            .map(|m| m.len() < offset + length)
            .unwrap_or(true),
        Body::Memory(_) => false,
    }
}

/// Ends reads whose peer took nothing for their stall limit.
fn expire_stalled(
    scheduler: &mut Scheduler,
    active: &mut HashMap<RequestId, Active>,
    stats: &Mutex<ScheduleStats>,
) {
    let now = Instant::now();
    let stalled: Vec<RequestId> = active
        .iter()
        .filter(|(_, read)| now.duration_since(read.progress_at) > read.job.stall)
        .map(|(&id, _)| id)
        .collect();
    for id in stalled {
        let sent = active.get(&id).map_or(0, |read| read.sent);
        finish(scheduler, active, stats, id, Sent::Stalled(sent));
    }
}

/// Forgets a read, counts it, and gives its connection back.
fn finish(
    scheduler: &mut Scheduler,
    active: &mut HashMap<RequestId, Active>,
    stats: &Mutex<ScheduleStats>,
    id: RequestId,
    outcome: Sent,
) {
    // Already forgotten by the core when its last byte was recorded.
    let _ = scheduler.cancel(id);
    let Some(read) = active.remove(&id) else {
        return;
    };
    let micros = read.since.elapsed().as_micros().min(u64::MAX as u128) as u64;
    {
        let mut stats = lock(stats);
        let class = stats.classes.entry(read.job.class.to_string()).or_default();
        class.queued = class.queued.saturating_sub(1);
        class.reads_done += 1;
        class.latency_sum_us = class.latency_sum_us.saturating_add(micros);
        for (bucket, &bound) in class.latency_buckets.iter_mut().zip(&LATENCY_BUCKETS_US) {
            if micros <= bound {
                *bucket += 1;
            }
        }
    }
    let _ = read.job.done.send((read.job.writer, outcome));
}
