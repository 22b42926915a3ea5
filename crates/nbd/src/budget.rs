//! The server-wide budget of request buffers.
//!
//! Every connection bounds its own buffers (see
//! [`crate::transmission::MAX_IN_FLIGHT_BYTES`]), but a server has many
//! connections: 64 clients each sending 32 MiB writes once took the daemon
//! to 3 GB of memory. So a connection also takes a share of one budget per
//! server before it reads a write's payload or runs a read, and gives it
//! back when the reply is sent. When the budget is spent, the connection
//! waits and stops reading its socket: the client's data stays in the
//! kernel's socket buffers (and then in the client), not in the server.
//!
//! Waiters are served in arrival order, so a large request is not starved
//! by a stream of small ones. A request larger than the whole budget takes
//! all of it (the server refuses budgets smaller than the largest request,
//! so that only happens if the two constants drift apart).
//!
//! Threads may also keep their I/O buffer between requests, to avoid a
//! fresh mapping per request; those kept buffers have a bound of their own
//! (a quarter of the budget, at most 64 MiB, on top of it) so that idle
//! threads can never hold the budget that running requests need.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// Default budget: 256 MiB, eight maximum-size requests in flight.
pub const DEFAULT_BUFFER_BUDGET: u64 = 256 * 1024 * 1024;

/// Most bytes of buffers kept by idle threads, whatever the budget.
const MAX_KEPT: u64 = 64 * 1024 * 1024;

/// A budget of buffer bytes shared by every connection of a server.
#[derive(Debug)]
pub(crate) struct Budget {
    capacity: u64,
    keep_limit: u64,
    state: Mutex<State>,
    /// Signalled when bytes are given back or a waiter may be cancelled.
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Bytes granted to requests in flight.
    used: u64,
    /// Bytes of buffers kept by idle threads.
    kept: u64,
    /// Next ticket to hand out.
    next_ticket: u64,
    /// Tickets of waiting requests, oldest first.
    queue: VecDeque<u64>,
}

/// Bytes granted to one request, given back on drop.
#[derive(Debug)]
pub(crate) struct Grant {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.state.lock().used -= self.bytes;
            self.budget.changed.notify_all();
        }
    }
}

impl Budget {
    /// A budget of `capacity` bytes (at least 1).
    pub(crate) fn new(capacity: u64) -> Arc<Budget> {
        let capacity = capacity.max(1);
        Arc::new(Budget {
            capacity,
            keep_limit: (capacity / 4).min(MAX_KEPT),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        })
    }

    /// Bytes that idle threads may keep in buffers, over all connections,
    /// on top of the budget: a quarter of it, at most 64 MiB.
    #[cfg(test)]
    fn keep_limit(&self) -> u64 {
        self.keep_limit
    }

    /// Waits, in arrival order, until `bytes` (at most the whole budget)
    /// fit. `None` if `cancelled` turns true first; it is checked under
    /// the budget's lock, and whoever makes it true must then call
    /// [`Budget::wake`].
    pub(crate) fn acquire(
        self: &Arc<Budget>,
        bytes: u64,
        cancelled: impl Fn() -> bool,
    ) -> Option<Grant> {
        let bytes = bytes.min(self.capacity);
        let grant = || Grant {
            budget: self.clone(),
            bytes,
        };
        if bytes == 0 {
            return Some(grant());
        }
        let mut st = self.state.lock();
        if st.queue.is_empty() && st.used + bytes <= self.capacity {
            st.used += bytes;
            return Some(grant());
        }
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.queue.push_back(ticket);
        loop {
            if cancelled() {
                st.queue.retain(|t| *t != ticket);
                drop(st);
                // The next in line may fit now that this one left.
                self.changed.notify_all();
                return None;
            }
            if st.queue.front() == Some(&ticket) && st.used + bytes <= self.capacity {
                st.queue.pop_front();
                st.used += bytes;
                drop(st);
                // The next in line may fit too.
                self.changed.notify_all();
                return Some(grant());
            }
            self.changed.wait(&mut st);
        }
    }

    /// Wakes every waiter to check its `cancelled` condition again.
    pub(crate) fn wake(&self) {
        // Taking the lock orders this after any waiter's check, so the
        // waiter is either past its check (and sees the new condition) or
        // already asleep (and is woken).
        drop(self.state.lock());
        self.changed.notify_all();
    }

    /// Changes a thread's kept buffer from `had` to `want` bytes if the
    /// total kept stays within [`Budget::keep_limit`]. On false nothing
    /// changed, and the thread should drop its buffer and call
    /// `keep(had, 0)`, which always succeeds. The limit is a quarter of
    /// the budget, at most 64 MiB.
    pub(crate) fn keep(&self, had: u64, want: u64) -> bool {
        let mut st = self.state.lock();
        let others = st.kept - had;
        if want > had && others + want > self.keep_limit {
            return false;
        }
        st.kept = others + want;
        true
    }

    /// Bytes granted now (for tests and logs).
    #[cfg(test)]
    fn used(&self) -> u64 {
        self.state.lock().used
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn grants_fit_and_are_given_back() {
        let b = Budget::new(100);
        let g1 = b.acquire(60, || false).unwrap();
        let g2 = b.acquire(40, || false).unwrap();
        assert_eq!(b.used(), 100);
        drop(g1);
        assert_eq!(b.used(), 40);
        drop(g2);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn a_request_over_the_budget_takes_all_of_it() {
        let b = Budget::new(100);
        let g = b.acquire(1000, || false).unwrap();
        assert_eq!(b.used(), 100);
        drop(g);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn a_waiter_proceeds_when_bytes_come_back() {
        let b = Budget::new(100);
        let g = b.acquire(80, || false).unwrap();
        let b2 = b.clone();
        let waiter = std::thread::spawn(move || b2.acquire(50, || false).map(|g| g.bytes));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !waiter.is_finished(),
            "the waiter must wait while 80 of 100 are used"
        );
        drop(g);
        assert_eq!(waiter.join().unwrap(), Some(50));
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn waiters_are_served_in_arrival_order() {
        let b = Budget::new(100);
        let g = b.acquire(100, || false).unwrap();
        // A big request waits first; a small one arriving later must not
        // pass it even though it would fit earlier.
        let big = {
            let b = b.clone();
            std::thread::spawn(move || b.acquire(100, || false))
        };
        std::thread::sleep(Duration::from_millis(50));
        let small = {
            let b = b.clone();
            std::thread::spawn(move || b.acquire(10, || false))
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(g);
        let big = big.join().unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!small.is_finished(), "the small request passed the big one");
        drop(big);
        assert!(small.join().unwrap().is_some());
    }

    #[test]
    fn a_cancelled_waiter_leaves_the_queue() {
        let b = Budget::new(100);
        let g = b.acquire(100, || false).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (b, stop) = (b.clone(), stop.clone());
            std::thread::spawn(move || b.acquire(10, || stop.load(Ordering::SeqCst)).is_none())
        };
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::SeqCst);
        b.wake();
        assert!(waiter.join().unwrap(), "the waiter must give up");
        drop(g);
        // Nobody is left queued: a new request fits at once.
        assert!(b.acquire(100, || false).is_some());
    }

    #[test]
    fn kept_buffers_stay_within_their_limit() {
        let b = Budget::new(400);
        assert_eq!(b.keep_limit(), 100);
        assert!(b.keep(0, 60));
        assert!(!b.keep(0, 60), "60 + 60 is over the limit of 100");
        assert!(b.keep(0, 40));
        assert!(b.keep(60, 0));
        assert!(b.keep(40, 100));
    }
}
