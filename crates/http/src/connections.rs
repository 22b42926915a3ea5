//! The accept loop's record of open connections: which are busy with an
//! answer, which finished one when, and how to push out the oldest idle
//! one when every slot is taken.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// A connection that finished an answer this recently is not pushed out:
/// its last bytes may still be on their way out.
pub(crate) const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// One open connection, as the accept loop sees it.
#[derive(Debug, Default)]
pub(crate) struct Connection {
    /// Answers in progress, counted until their body is all sent.
    requests: AtomicUsize,
    /// When its last answer finished, in ms since the server started
    /// (0: none yet).
    answered_at: AtomicU64,
    /// Told when the connection is pushed out.
    pub(crate) close: Notify,
}

impl Connection {
    /// Whether an answer is in progress on this connection.
    pub(crate) fn is_busy(&self) -> bool {
        self.requests.load(Ordering::Acquire) > 0
    }
}

/// Every open connection, by age (ids grow).
#[derive(Debug)]
pub(crate) struct Connections {
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    /// Told when a connection closes or an answer ends.
    pub(crate) changed: Notify,
    started: Instant,
    next_id: AtomicU64,
}

impl Connections {
    pub(crate) fn new() -> Self {
        Connections {
            open: Mutex::new(BTreeMap::new()),
            changed: Notify::new(),
            started: Instant::now(),
            next_id: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        // At least 1: 0 means "never".
        (self.started.elapsed().as_millis() as u64).max(1)
    }

    pub(crate) fn count(&self) -> usize {
        self.open.lock().len()
    }

    /// Records a new connection; it stays counted until its [`Slot`] is
    /// dropped.
    pub(crate) fn open(self: &Arc<Self>) -> (Arc<Connection>, Slot) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let connection = Arc::new(Connection::default());
        self.open.lock().insert(id, connection.clone());
        let slot = Slot {
            id,
            connections: self.clone(),
        };
        (connection, slot)
    }

    fn remove(&self, id: u64) {
        self.open.lock().remove(&id);
        self.changed.notify_waiters();
    }

    /// Pushes out the oldest connection with no answer in progress and
    /// none finished in the last [`ANSWER_GRACE`]; false if there is none.
    pub(crate) fn push_out_idle(&self) -> bool {
        let now = self.now_ms();
        let grace = ANSWER_GRACE.as_millis() as u64;
        let mut open = self.open.lock();
        let idle = open.iter().find_map(|(id, c)| {
            let answered = c.answered_at.load(Ordering::Acquire);
            let quiet = answered == 0 || now.saturating_sub(answered) >= grace;
            (!c.is_busy() && quiet).then_some(*id)
        });
        match idle.and_then(|id| open.remove(&id)) {
            Some(connection) => {
                connection.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// A connection's place in [`Connections`], given back when dropped
/// (however its task ends, a panic included).
pub(crate) struct Slot {
    id: u64,
    connections: Arc<Connections>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.remove(self.id);
    }
}

/// Marks an answer in progress on its connection until dropped, which
/// happens when its body has been sent (or the connection died).
pub(crate) struct Busy {
    connection: Arc<Connection>,
    connections: Arc<Connections>,
}

impl Busy {
    pub(crate) fn start(connection: &Arc<Connection>, connections: &Arc<Connections>) -> Busy {
        connection.requests.fetch_add(1, Ordering::AcqRel);
        Busy {
            connection: connection.clone(),
            connections: connections.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.connection
            .answered_at
            .store(self.connections.now_ms(), Ordering::Release);
        self.connection.requests.fetch_sub(1, Ordering::AcqRel);
        self.connections.changed.notify_waiters();
    }
}
