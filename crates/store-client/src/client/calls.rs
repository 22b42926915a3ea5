//! A metadata request as a deterministic state machine ([`Call`]): which
//! address to send to next, when to resend, and which answer ends it. It
//! does no I/O, so the async client and the simulation drive the same
//! logic.

use strata_store_protocol::addr::{fmt_addr, Addr};
use strata_store_protocol::auth::PAD_SLACK;
use strata_store_protocol::wire::{Body, Code, Msg, MAX_DATAGRAM};
use strata_store_protocol::Error;

/// What a [`Call`] wants next.
#[derive(Debug)]
pub enum Step {
    /// Send this message (to the MN owning `msg.target`) and wait until the
    /// given time (ms) for a reply.
    Send(Msg, u64),
    /// Finished.
    Done(Result<Body, Error>),
}

/// One metadata request with its retry policy: each target is tried
/// `attempts` times with `timeout_ms` between tries; a `NotFound` answer
/// falls through to the next target when `fall_through` is set (a Get whose
/// metadata is not at this address yet). So do answers from a node that
/// does not (or no longer, or not yet) hold the address's group; a
/// "not found" elsewhere is then not final: the call ends with that
/// node's answer, so the caller refreshes its table and asks again.
pub struct Call {
    targets: Vec<Addr>,
    body: Body,
    req: u64,
    idx: usize,
    tries: u32,
    attempts: u32,
    timeout_ms: u64,
    fall_through: bool,
    last_error: Option<Error>,
    /// An address answered WrongAddress or Moving: the error to report if
    /// no other address has the record.
    stale: Option<Error>,
    /// Bytes to pad the request to: a node answers a request it did not
    /// authenticate (a refusal) only when the answer is no longer, and
    /// asks for padding ([`Body::PadTo`]) otherwise.
    pad: usize,
}

impl Call {
    /// A call of `body` to `targets` in order.
    pub fn new(req: u64, targets: Vec<Addr>, body: Body, attempts: u32, timeout_ms: u64) -> Call {
        Call {
            targets,
            body,
            req,
            idx: 0,
            tries: 0,
            attempts: attempts.max(1),
            timeout_ms,
            fall_through: false,
            last_error: None,
            stale: None,
            pad: 0,
        }
    }

    /// The same call afresh, under a new request id (a node may have
    /// cached its answer to the old one).
    pub fn again(&self, req: u64) -> Call {
        Call {
            targets: self.targets.clone(),
            body: self.body.clone(),
            req,
            idx: 0,
            tries: 0,
            attempts: self.attempts,
            timeout_ms: self.timeout_ms,
            fall_through: self.fall_through,
            last_error: None,
            stale: None,
            pad: self.pad,
        }
    }

    /// Lets `NotFound` answers and timeouts move on to the next target.
    pub fn falling_through(mut self) -> Call {
        self.fall_through = true;
        self
    }

    /// The metadata addresses asked, in order.
    pub fn targets(&self) -> &[Addr] {
        &self.targets
    }

    /// Whether the call is a Get (it reads, and writes nothing).
    pub fn is_get(&self) -> bool {
        matches!(self.body, Body::Get { .. })
    }

    /// The request id.
    pub fn req(&self) -> u64 {
        self.req
    }

    /// The least length to pad the request to when sending it
    /// ([`Msg::seal_tenant_padded`]): 0 until a node asked for more.
    pub fn pad(&self) -> usize {
        self.pad
    }

    fn send(&mut self, now: u64) -> Step {
        self.tries += 1;
        let msg = Msg::new(self.req, self.targets[self.idx], self.body.clone());
        Step::Send(msg, now + self.timeout_ms)
    }

    /// The first step.
    pub fn start(&mut self, now: u64) -> Step {
        if self.targets.is_empty() {
            return Step::Done(Err(Error::Table(
                "the prefix table gave no metadata address to ask".into(),
            )));
        }
        self.send(now)
    }

    /// The deadline passed without a reply.
    pub fn on_timeout(&mut self, now: u64) -> Step {
        if self.tries < self.attempts {
            return self.send(now);
        }
        self.last_error = Some(Error::Timeout(format!(
            "metadata address {} did not answer after {} attempts",
            fmt_addr(self.targets[self.idx]),
            self.tries
        )));
        self.next_target(now)
    }

    fn next_target(&mut self, now: u64) -> Step {
        if self.fall_through && self.idx + 1 < self.targets.len() {
            self.idx += 1;
            self.tries = 0;
            return self.send(now);
        }
        // A node that may hold the record could not say: the other
        // answers (not found, no answer) are not final.
        if let Some(stale) = self.stale.take() {
            return Step::Done(Err(stale));
        }
        Step::Done(Err(self.last_error.take().unwrap_or_else(|| {
            Error::Timeout("no metadata node answered".into())
        })))
    }

    /// A reply arrived; `None` if it is not for this call.
    pub fn on_reply(&mut self, now: u64, msg: Msg) -> Option<Step> {
        if msg.req != self.req {
            return None;
        }
        Some(match msg.body {
            // Nothing was done: the same request again, padded so that
            // the node may say why it refused it. Only a growing size is
            // taken, so this ends.
            Body::PadTo { size } => {
                let size = size as usize;
                if size <= self.pad || size > MAX_DATAGRAM {
                    return None;
                }
                self.pad = (size + PAD_SLACK).min(MAX_DATAGRAM);
                self.tries = self.tries.saturating_sub(1);
                self.send(now)
            }
            Body::Error {
                code: code @ (Code::NotFound | Code::Unavailable),
                message,
            } if self.fall_through => {
                // Keep the most telling error: NotFound beats a timeout.
                self.last_error = Some(Error::Remote { code, message });
                self.next_target(now)
            }
            Body::Error {
                code: code @ (Code::WrongAddress | Code::Moving),
                message,
            } if self.fall_through => {
                self.stale = Some(Error::Remote { code, message });
                self.next_target(now)
            }
            Body::Error { code, message } => Step::Done(Err(Error::Remote { code, message })),
            body => Step::Done(Ok(body)),
        })
    }
}

/// The error for an answer a call did not expect (`what` names the
/// request): the metadata node answered out of turn.
pub(super) fn unexpected(what: &str, body: &Body) -> Error {
    Error::Peer(format!("unexpected answer to {what}: {body:?}"))
}
