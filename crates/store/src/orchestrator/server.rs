//! The orchestrator on its UDP socket: every datagram through the gate,
//! then the core ([`crate::orchestrator::state::OnCore`]).

use crate::orchestrator::state::OnCore;
use std::time::{Duration, Instant};
use strata_store_protocol::auth::{within, ClusterKey, Gate, Receiver, Verdict};
use strata_store_protocol::wire::MAX_DATAGRAM;
use tokio::net::UdpSocket;

/// Serves the orchestrator on `sock` until the task is dropped; `key` is
/// the cluster's.
pub async fn run_on(sock: UdpSocket, mut core: OnCore, key: ClusterKey) {
    let start = Instant::now();
    let mut gate = Gate::new(key, Receiver::On);
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    core.set_own_keys(gate.key().fingerprints());
    loop {
        tokio::select! {
            r = sock.recv_from(&mut buf) => {
                let Ok((n, from)) = r else { continue };
                let now = start.elapsed().as_millis() as u64;
                let wall = strata_store_protocol::auth::unix_ms();
                if let Some(bytes) = on_receive(&mut core, &mut gate, wall, now, &buf[..n]) {
                    let _ = sock.send_to(&bytes, from).await;
                }
            }
            _ = tick.tick() => {
                // As reloaded on SIGHUP, for `strata store status`.
                core.set_own_keys(gate.key().fingerprints());
                if let Err(e) = core.tick(start.elapsed().as_millis() as u64) {
                    tracing::warn!("orchestrator: {}", e.report());
                }
                debug_check(&core, "a tick");
            }
        }
    }
}

/// Handles one datagram at the orchestrator, received at wall-clock time
/// `wall` (ms since the Unix epoch) and core time `now`: the gate first,
/// then the core. Returns the answer to send, sealed if the request was;
/// to an unsealed one, no answer longer than it ([`within`]).
pub fn on_receive(
    core: &mut OnCore,
    gate: &mut Gate,
    wall: u64,
    now: u64,
    bytes: &[u8],
) -> Option<Vec<u8>> {
    let answer = match gate.admit(bytes, wall) {
        Verdict::Accept { msg, sealed, .. } => {
            let answer = core.handle(now, &msg);
            debug_check(core, "a request");
            if sealed {
                return strata_store_protocol::auth::encode(&answer, Some(gate.key()), wall).ok();
            }
            // The table request, taken unsealed: no answer larger than it.
            answer
        }
        Verdict::Refuse(reply) => reply,
        Verdict::Deny(reply) => return reply.encode().ok(),
        Verdict::Drop => return None,
    };
    within(answer, bytes.len())?.encode().ok()
}

/// In builds with debug assertions (the tests' build, `scripts/cargo-checked`), stops
/// the orchestrator at the first broken invariant of its core, naming it.
fn debug_check(core: &OnCore, after: &str) {
    if cfg!(debug_assertions) {
        if let Err(e) = core.check_invariants() {
            panic!("orchestrator after {after}: {e}");
        }
    }
}
