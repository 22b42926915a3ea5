//! An HTTP POST sink (`outputs: {http: URL}`): each record, and the
//! summary at the end, POSTed as JSON to a URL by a thread of its own, so
//! that a slow or absent receiver never slows the run. The queue is
//! bounded: a record that finds it full is counted as not sent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Most records waiting to be posted.
pub const QUEUE: usize = 10_000;
/// How long one POST may take before it counts as failed.
const POST_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks a sink URL: `http://HOST:PORT/PATH` (no TLS here).
pub fn check_url(url: &str) -> Result<(), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        format!("outputs.http `{url}`: write an http:// URL, such as http://127.0.0.1:8080/records")
    })?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() || url.len() > 2048 || url.chars().any(char::is_whitespace) {
        return Err(format!(
            "outputs.http `{url}`: write http://HOST:PORT/PATH, without spaces, at most 2048 characters"
        ));
    }
    Ok(())
}

/// The sink's counts at the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Posted {
    /// Bodies the receiver answered with a 2xx status.
    pub sent: u64,
    /// Bodies that failed (no answer, an error status) or found the queue
    /// full.
    pub failed: u64,
}

/// A running sink.
pub struct HttpSink {
    queue: Option<SyncSender<String>>,
    sender: Option<JoinHandle<u64>>,
    failed: std::sync::Arc<AtomicU64>,
}

impl HttpSink {
    /// Starts the thread that posts to `url`.
    pub fn start(url: &str) -> HttpSink {
        let (queue, bodies) = sync_channel::<String>(QUEUE);
        let failed = std::sync::Arc::new(AtomicU64::new(0));
        let agent = ureq::AgentBuilder::new().timeout(POST_TIMEOUT).build();
        let (url, failures) = (url.to_string(), failed.clone());
        let sender = std::thread::spawn(move || {
            let mut sent = 0;
            for body in bodies {
                let answer = agent
                    .post(&url)
                    .set("Content-Type", "application/json")
                    .send_string(&body);
                match answer {
                    Ok(_) => sent += 1,
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            sent
        });
        HttpSink {
            queue: Some(queue),
            sender: Some(sender),
            failed,
        }
    }

    /// Queues one JSON body; never waits (a full queue counts a failure).
    pub fn offer(&self, body: String) {
        let Some(queue) = &self.queue else { return };
        match queue.try_send(body) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Posts what is queued, then stops the thread; the counts.
    pub fn finish(mut self) -> Posted {
        drop(self.queue.take());
        let sent = self
            .sender
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or(0);
        Posted {
            sent,
            failed: self.failed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_a_missing_receiver_counts_failures() {
        assert!(check_url("http://127.0.0.1:8080/records").is_ok());
        assert!(check_url("https://example.com/")
            .unwrap_err()
            .contains("http://"));
        assert!(check_url("http:///x").is_err());
        assert!(check_url("http://a b/").is_err());
        // Port 9 on loopback: nothing listens, each POST fails, the run
        // is not held up.
        let sink = HttpSink::start("http://127.0.0.1:9/records");
        for n in 0..3 {
            sink.offer(format!("{{\"n\":{n}}}"));
        }
        assert_eq!(sink.finish(), Posted { sent: 0, failed: 3 });
    }
}
