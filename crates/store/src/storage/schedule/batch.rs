//! RS3's batches: per-class queues of pending reads, and the choice of
//! which bytes of which requests each batch sends.
//!
//! [`Scheduler::next_batch`] runs the thesis's two passes (§4.2.3):
//! 1. the batch budget is shared between the classes with pending bytes by
//!    [`allocate`] (weighted water-filling);
//! 2. each class's grant is shared between its requests by the same
//!    water-filling, every request weighing the same. A request smaller
//!    than its equal share is served whole, and what it leaves goes to the
//!    class's bigger requests: a class's small reads pass its big ones
//!    instead of waiting behind them.
//!
//! Requests are sent in slices (the thesis calls `sendfile` once per
//! request per batch with the request's grant as its size, and unfinished
//! requests join the next batch). A request bigger than the whole budget
//! therefore progresses every batch its class has a share, and completes
//! within `size / share` batches: no starvation, no special case.
//!
//! Where this differs from the thesis, and why:
//! - Only the oldest [`CLASS_WINDOW_REQUESTS`] requests of a class take part
//!   in a batch (arrival order decides who enters the window; the second
//!   pass orders within it). This bounds a batch to that many `sendfile`s
//!   per class however many reads a client queues; the thesis has no bound.
//!   A class whose window wants less than its share leaves the rest to
//!   the other classes for that batch.
//! - The thesis's send-buffer size `T[i]` is per class (one socket per
//!   class in its prototype); here each request has its own connection, so
//!   the room is per request ([`Scheduler::set_send_room`]) and a class's
//!   demand adds up `min(remaining, room)` over its window. A request whose
//!   socket is full takes no budget, which goes to the others.
//! - The thesis mentions that a class may prefer its requests served purely
//!   in sequence; only the hierarchical second pass is built.
//! - The core does not assume a slice was sent: the I/O shell reports what
//!   each `sendfile` sent ([`Scheduler::record_sent`]); bytes not reported
//!   are offered again in the next batch.

use crate::storage::schedule::allocation::{allocate, water_fill, Claim, ClassDemand};
use crate::storage::schedule::config::{ConfigError, ScheduleConfig};
use crate::storage::schedule::ClassId;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;

/// Most requests pending on one node: past this, new reads are refused
/// (the client retries elsewhere or later).
pub const MAX_PENDING_REQUESTS: usize = 65_536;

/// Most classes with pending requests at once.
pub const MAX_ACTIVE_CLASSES: usize = 4_096;

/// Most requests of one class taking part in one batch (its oldest).
pub const CLASS_WINDOW_REQUESTS: usize = 64;

/// A pending request, numbered by arrival on this scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// Bytes of one request to send in a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    /// The request.
    pub request: RequestId,
    /// Its class.
    pub class: ClassId,
    /// Where in the request's bytes the slice begins.
    pub offset_bytes: u64,
    /// How many bytes to send.
    pub length_bytes: u64,
    /// Whether the slice ends the request.
    pub last: bool,
}

/// What one batch sends.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Batch {
    /// The batch's number, from 0.
    pub number: u64,
    /// The slices, by class name, then by arrival within a class.
    pub slices: Vec<Slice>,
}

impl Batch {
    /// Bytes the batch sends.
    pub fn total_bytes(&self) -> u64 {
        self.slices.iter().map(|slice| slice.length_bytes).sum()
    }
}

/// How a report of sent bytes left the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Bytes remain to be sent.
    Pending {
        /// How many.
        remaining_bytes: u64,
    },
    /// The request is complete and forgotten.
    Done,
}

/// A request the scheduler refused or does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScheduleError {
    /// [`MAX_PENDING_REQUESTS`] are already pending.
    Full,
    /// [`MAX_ACTIVE_CLASSES`] classes already have pending requests.
    TooManyClasses(ClassId),
    /// No such request is pending.
    UnknownRequest(RequestId),
    /// More bytes reported sent than the request had left.
    Overrun {
        /// The request.
        request: RequestId,
        /// Bytes reported.
        sent_bytes: u64,
        /// Bytes it had left.
        remaining_bytes: u64,
    },
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::Full => write!(
                formatter,
                "RS3 scheduler already holds {MAX_PENDING_REQUESTS} pending reads, its limit: \
                 retry the read later"
            ),
            ScheduleError::TooManyClasses(class) => write!(
                formatter,
                "RS3 scheduler already has {MAX_ACTIVE_CLASSES} classes with pending reads, its \
                 limit, so class {class} cannot join: retry the read later"
            ),
            ScheduleError::UnknownRequest(request) => {
                write!(
                    formatter,
                    "RS3 scheduler has no pending request {}",
                    request.0
                )
            }
            ScheduleError::Overrun {
                request,
                sent_bytes,
                remaining_bytes,
            } => write!(
                formatter,
                "RS3 request {} reported {sent_bytes} bytes sent but had only {remaining_bytes} \
                 left: the I/O shell sent past its slice",
                request.0
            ),
        }
    }
}

impl std::error::Error for ScheduleError {}

/// One pending request.
#[derive(Clone, Debug)]
struct Pending {
    id: RequestId,
    size_bytes: u64,
    sent_bytes: u64,
    /// Free room in the request's send buffer; `None`: not limited.
    send_room_bytes: Option<u64>,
}

impl Pending {
    fn remaining_bytes(&self) -> u64 {
        self.size_bytes - self.sent_bytes
    }

    /// Bytes it could take in this batch.
    fn demand_bytes(&self) -> u64 {
        self.remaining_bytes()
            .min(self.send_room_bytes.unwrap_or(u64::MAX))
    }
}

/// One class's requests, oldest first.
#[derive(Clone, Debug)]
struct ClassQueue {
    weight: u32,
    requests: VecDeque<Pending>,
}

impl ClassQueue {
    fn window(&self) -> impl Iterator<Item = &Pending> {
        self.requests.iter().take(CLASS_WINDOW_REQUESTS)
    }

    fn demand_bytes(&self) -> u64 {
        self.window().fold(0u64, |sum, request| {
            sum.saturating_add(request.demand_bytes())
        })
    }
}

/// RS3's state on one storage node (see the module documentation).
#[derive(Clone, Debug)]
pub struct Scheduler {
    config: ScheduleConfig,
    classes: BTreeMap<ClassId, ClassQueue>,
    /// Each pending request's class.
    classes_of: HashMap<RequestId, ClassId>,
    next_request: u64,
    next_batch: u64,
}

impl Scheduler {
    /// A scheduler with nothing pending, after checking `config`.
    pub fn new(config: ScheduleConfig) -> Result<Scheduler, ConfigError> {
        config.validate()?;
        Ok(Scheduler {
            config,
            classes: BTreeMap::new(),
            classes_of: HashMap::new(),
            next_request: 0,
            next_batch: 0,
        })
    }

    /// Takes new settings (checked first): the batch budget and the
    /// weights apply from the next batch, pending requests included.
    pub fn reconfigure(&mut self, config: ScheduleConfig) -> Result<(), ConfigError> {
        config.validate()?;
        for (class, queue) in self.classes.iter_mut() {
            queue.weight = config.weight_of(class.as_str());
        }
        self.config = config;
        Ok(())
    }

    /// The settings in force.
    pub fn config(&self) -> &ScheduleConfig {
        &self.config
    }

    /// Requests pending in each class with any.
    pub fn pending_by_class(&self) -> impl Iterator<Item = (&ClassId, usize)> {
        self.classes
            .iter()
            .map(|(class, queue)| (class, queue.requests.len()))
    }

    /// Requests pending.
    pub fn pending_requests(&self) -> usize {
        self.classes_of.len()
    }

    /// Queues a read of `size_bytes` for class `class`, behind that class's
    /// earlier reads.
    pub fn enqueue(
        &mut self,
        class: &ClassId,
        size_bytes: u64,
    ) -> Result<RequestId, ScheduleError> {
        if self.classes_of.len() >= MAX_PENDING_REQUESTS {
            return Err(ScheduleError::Full);
        }
        if !self.classes.contains_key(class) && self.classes.len() >= MAX_ACTIVE_CLASSES {
            return Err(ScheduleError::TooManyClasses(class.clone()));
        }
        let id = RequestId(self.next_request);
        self.next_request += 1;
        let weight = self.config.weight_of(class.as_str());
        let queue = self
            .classes
            .entry(class.clone())
            .or_insert_with(|| ClassQueue {
                weight,
                requests: VecDeque::new(),
            });
        queue.requests.push_back(Pending {
            id,
            size_bytes,
            sent_bytes: 0,
            send_room_bytes: None,
        });
        self.classes_of.insert(id, class.clone());
        Ok(id)
    }

    /// Sets the free room of `request`'s send buffer (`None`: unlimited),
    /// as the I/O shell reads it before a batch; a batch grants the request
    /// no more than that.
    pub fn set_send_room(
        &mut self,
        request: RequestId,
        room_bytes: Option<u64>,
    ) -> Result<(), ScheduleError> {
        self.pending_mut(request)?.send_room_bytes = room_bytes;
        Ok(())
    }

    /// Records that `sent_bytes` of `request` were sent; a request whose
    /// last byte is sent is forgotten. The bytes also fill its send buffer.
    pub fn record_sent(
        &mut self,
        request: RequestId,
        sent_bytes: u64,
    ) -> Result<Progress, ScheduleError> {
        let pending = self.pending_mut(request)?;
        let remaining_bytes = pending.remaining_bytes();
        if sent_bytes > remaining_bytes {
            return Err(ScheduleError::Overrun {
                request,
                sent_bytes,
                remaining_bytes,
            });
        }
        pending.sent_bytes += sent_bytes;
        if let Some(room) = pending.send_room_bytes.as_mut() {
            *room = room.saturating_sub(sent_bytes);
        }
        if sent_bytes < remaining_bytes {
            return Ok(Progress::Pending {
                remaining_bytes: remaining_bytes - sent_bytes,
            });
        }
        self.remove(request)?;
        Ok(Progress::Done)
    }

    /// Forgets `request` (its client went away).
    pub fn cancel(&mut self, request: RequestId) -> Result<(), ScheduleError> {
        self.remove(request)
    }

    /// The next batch: the budget shared between classes, then each class's
    /// grant between its oldest requests (see the module documentation).
    pub fn next_batch(&mut self) -> Batch {
        let number = self.next_batch;
        self.next_batch += 1;
        let demands: Vec<ClassDemand> = self
            .classes
            .iter()
            .map(|(class, queue)| ClassDemand {
                class: class.clone(),
                weight: queue.weight,
                demand_bytes: queue.demand_bytes(),
            })
            .collect();
        let grants = allocate(self.config.batch_bytes, &demands, number);
        let mut slices = Vec::new();
        for ((class, grant), demand) in grants.into_iter().zip(&demands) {
            debug_assert!(grant <= demand.demand_bytes);
            if let Some(queue) = self.classes.get(&class) {
                slice_class(&class, queue, grant, &mut slices);
            }
        }
        let batch = Batch { number, slices };
        debug_assert!(batch.total_bytes() <= self.config.batch_bytes);
        batch
    }

    fn pending_mut(&mut self, request: RequestId) -> Result<&mut Pending, ScheduleError> {
        let class = self
            .classes_of
            .get(&request)
            .ok_or(ScheduleError::UnknownRequest(request))?;
        self.classes
            .get_mut(class)
            .and_then(|queue| {
                queue
                    .requests
                    .iter_mut()
                    .find(|pending| pending.id == request)
            })
            .ok_or(ScheduleError::UnknownRequest(request))
    }

    fn remove(&mut self, request: RequestId) -> Result<(), ScheduleError> {
        let class = self
            .classes_of
            .remove(&request)
            .ok_or(ScheduleError::UnknownRequest(request))?;
        if let Some(queue) = self.classes.get_mut(&class) {
            queue.requests.retain(|pending| pending.id != request);
            if queue.requests.is_empty() {
                self.classes.remove(&class);
            }
        }
        Ok(())
    }
}

/// The second pass: `grant` shared between the class's window of requests,
/// each weighing the same; rounding bytes go to the oldest. A request with
/// nothing left (an empty object) gets an empty last slice; a request
/// granted nothing gets no slice.
fn slice_class(class: &ClassId, queue: &ClassQueue, grant: u64, slices: &mut Vec<Slice>) {
    let window: Vec<&Pending> = queue.window().collect();
    let claims: Vec<Claim> = window
        .iter()
        .map(|pending| Claim {
            weight: 1,
            demand_bytes: pending.demand_bytes(),
        })
        .collect();
    let shares = water_fill(grant, &claims, 0);
    debug_assert_eq!(shares.iter().sum::<u64>(), grant);
    for (pending, share) in window.into_iter().zip(shares) {
        debug_assert!(share <= pending.demand_bytes());
        if share == 0 && pending.remaining_bytes() > 0 {
            continue;
        }
        slices.push(Slice {
            request: pending.id,
            class: class.clone(),
            offset_bytes: pending.sent_bytes,
            length_bytes: share,
            last: share == pending.remaining_bytes(),
        });
    }
}

#[cfg(test)]
mod tests;
