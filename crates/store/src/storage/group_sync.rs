//! Group sync: concurrent Puts share one sync of the replica directory.
//!
//! A Put is installed by renaming its synced temporary file into
//! `replicas/`, and the rename is durable only once that directory is
//! synced. One directory sync makes every rename done before it durable,
//! so the Puts that finish while a sync runs wait for the next one
//! together: [`GroupSync::sync`] joins the batch being collected, a single
//! runner syncs the batches one after the other, and each waiter is
//! answered by the first sync that began after it joined, with that
//! sync's result (an error reaches every waiter of its batch). A batch
//! holds at most [`GroupSync::new`]'s `max_batch` waiters; more start the
//! next one.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// What a sync answers its waiters: `Err` holds the reason.
pub type SyncResult = Result<(), String>;

/// The sync a [`GroupSync`] runs, told how many waiters its batch has.
pub type SyncFn = Box<dyn Fn(usize) -> std::io::Result<()> + Send + Sync>;

/// Waiters of one directory sync at most, by default: a bound on the
/// memory a batch holds and on how many Puts one failed sync fails.
pub const MAX_BATCH: usize = 1024;

/// Concurrent callers sharing syncs (see the module documentation).
#[derive(Clone)]
pub struct GroupSync {
    inner: Arc<Inner>,
}

struct Inner {
    sync: SyncFn,
    max_batch: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Batches collecting waiters, oldest first; only the last takes new
    /// ones (the others are full).
    queue: VecDeque<Batch>,
    /// A runner is syncing batches.
    running: bool,
}

struct Batch {
    waiters: usize,
    done: watch::Sender<Option<SyncResult>>,
}

impl GroupSync {
    /// A group running `sync` (blocking; run on tokio's blocking pool)
    /// for batches of at most `max_batch` waiters (at least 1).
    pub fn new(sync: SyncFn, max_batch: usize) -> GroupSync {
        GroupSync {
            inner: Arc::new(Inner {
                sync,
                max_batch: max_batch.max(1),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The group syncing directory `dir` (`fsync` of the directory).
    pub fn directory(dir: std::path::PathBuf) -> GroupSync {
        let sync = move |_waiters: usize| std::fs::File::open(&dir)?.sync_all();
        GroupSync::new(Box::new(sync), MAX_BATCH)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a sync that begins after this call, and returns its
    /// result. Must run on a tokio runtime (the runner is a task of it).
    pub async fn sync(&self) -> SyncResult {
        let mut done = {
            let mut state = self.state();
            let max = self.inner.max_batch;
            if state.queue.back().is_none_or(|b| b.waiters >= max) {
                state.queue.push_back(Batch {
                    waiters: 0,
                    done: watch::channel(None).0,
                });
            }
            let Some(batch) = state.queue.back_mut() else {
                unreachable!("a batch was just pushed");
            };
            batch.waiters += 1;
            let done = batch.done.subscribe();
            if !state.running {
                state.running = true;
                tokio::spawn(run(self.clone()));
            }
            done
        };
        let result = match done.wait_for(Option::is_some).await {
            Ok(result) => result.clone().unwrap_or(Ok(())),
            Err(_) => Err("the sync runner ended before this batch was synced".into()),
        };
        result
    }
}

/// The runner: syncs the batches one after the other until none is left.
/// A batch is taken out of the queue before its sync begins, so nobody
/// joins a batch whose sync has already begun.
async fn run(group: GroupSync) {
    loop {
        let batch = {
            let mut state = group.state();
            match state.queue.pop_front() {
                Some(b) => b,
                None => {
                    state.running = false;
                    return;
                }
            }
        };
        let inner = group.inner.clone();
        let waiters = batch.waiters;
        let result = tokio::task::spawn_blocking(move || (inner.sync)(waiters))
            .await
            .map_err(|e| format!("the sync task failed: {e}"))
            .and_then(|r| r.map_err(|e| e.to_string()));
        if let Err(why) = &result {
            tracing::warn!("a group sync for {waiters} waiters failed: {why}");
        }
        batch.done.send_replace(Some(result));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Syncs of a real directory, each taking a little while, counting
    /// the syncs begun and ended and each batch's size.
    struct Counted {
        begun: Arc<AtomicUsize>,
        ended: Arc<AtomicUsize>,
        sizes: Arc<Mutex<Vec<usize>>>,
    }

    fn counted(dir: std::path::PathBuf, max_batch: usize) -> (GroupSync, Counted) {
        let c = Counted {
            begun: Arc::default(),
            ended: Arc::default(),
            sizes: Arc::default(),
        };
        let (begun, ended, sizes) = (c.begun.clone(), c.ended.clone(), c.sizes.clone());
        let sync = move |waiters: usize| {
            begun.fetch_add(1, Ordering::SeqCst);
            sizes.lock().unwrap().push(waiters);
            std::thread::sleep(std::time::Duration::from_millis(5));
            let r = std::fs::File::open(&dir)?.sync_all();
            ended.fetch_add(1, Ordering::SeqCst);
            r
        };
        (GroupSync::new(Box::new(sync), max_batch), c)
    }

    #[test]
    fn concurrent_waiters_share_syncs_and_each_waits_for_one_begun_after_it_joined() {
        let dir = tempfile::tempdir().unwrap();
        let (group, c) = counted(dir.path().to_path_buf(), MAX_BATCH);
        let begun = c.begun.clone();
        let ended = c.ended.clone();
        runtime().block_on(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..200u64 {
                let (group, begun, ended) = (group.clone(), begun.clone(), ended.clone());
                tasks.spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_micros(i * 97 % 20_000)).await;
                    // Syncs run one at a time, numbered in order: the
                    // first to begin after this point is number
                    // `before + 1`, and it must have ended.
                    let before = begun.load(Ordering::SeqCst);
                    group.sync().await.unwrap();
                    assert!(
                        ended.load(Ordering::SeqCst) > before,
                        "answered before a sync begun after it joined had ended"
                    );
                });
            }
            while let Some(r) = tasks.join_next().await {
                r.unwrap();
            }
        });
        let syncs = c.ended.load(Ordering::SeqCst);
        let sizes = c.sizes.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 200, "{sizes:?}");
        assert!((1..200).contains(&syncs), "{syncs} syncs for 200 waiters");
    }

    #[test]
    fn a_failed_sync_fails_every_waiter_of_its_batch_and_the_next_batch_is_synced_again() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("replicas");
        let (group, c) = counted(target.clone(), MAX_BATCH);
        runtime().block_on(async move {
            // The directory does not exist yet: the first sync fails
            // with a real I/O error.
            let first: Vec<_> = (0..20)
                .map(|_| {
                    tokio::spawn({
                        let g = group.clone();
                        async move { g.sync().await }
                    })
                })
                .collect();
            let mut failed = 0;
            for t in first {
                let r = t.await.unwrap();
                if let Err(why) = &r {
                    assert!(why.contains("No such file"), "{why}");
                    failed += 1;
                }
            }
            // However they were batched, every batch failed.
            assert_eq!(failed, 20);
            std::fs::create_dir(&target).unwrap();
            group.sync().await.unwrap();
        });
        assert!(c.begun.load(Ordering::SeqCst) >= 2);
    }

    #[test]
    fn a_batch_never_holds_more_waiters_than_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (group, c) = counted(dir.path().to_path_buf(), 4);
        runtime().block_on(async move {
            let tasks: Vec<_> = (0..50)
                .map(|_| {
                    let g = group.clone();
                    tokio::spawn(async move { g.sync().await })
                })
                .collect();
            for t in tasks {
                t.await.unwrap().unwrap();
            }
        });
        let sizes = c.sizes.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 50, "{sizes:?}");
        assert!(sizes.iter().all(|&n| (1..=4).contains(&n)), "{sizes:?}");
        assert!(sizes.len() >= 50 / 4, "{sizes:?}");
    }
}
