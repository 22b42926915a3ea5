//! Replication of a committed record to the name's other metadata
//! addresses, resent until W_m of them acknowledge.

use super::*;

impl<P: Clone + Eq + Hash> MnCore<P> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_replicating(
        &mut self,
        now: u64,
        client: P,
        req: u64,
        name: &str,
        op: u64,
        version: u64,
        acked: Vec<bool>,
        free_after: Vec<Addr>,
        answer: Option<Body>,
        out: &mut Vec<Out<P>>,
    ) -> Result<Option<Body>, Error> {
        let needed = self.table.params_for(name).w_m as usize;
        self.pending.insert(
            name.to_string(),
            Pending {
                op,
                version,
                client,
                client_req: req,
                deadline: now + COMMIT_TIMEOUT_MS,
                phase: Phase::Replicating {
                    acked,
                    needed,
                    free_after,
                    answer: answer.map(Box::new),
                },
            },
        );
        self.maybe_finish(name, out);
        Ok(None)
    }

    pub(super) fn send_replication(
        &mut self,
        now: u64,
        name: &str,
        op: u64,
        index: usize,
        mut msg: Msg,
        out: &mut Vec<Out<P>>,
    ) {
        self.next_req = self.next_req.wrapping_add(1) | 1 << 63;
        msg.req = self.next_req;
        out.push(Out::ToMeta(msg.clone()));
        self.inflight.insert(
            msg.req,
            Inflight {
                name: name.to_string(),
                op,
                index,
                msg,
                next_send: now + RESEND_MS,
                delay: RESEND_MS,
                give_up: now + REPLICATE_GIVE_UP_MS,
            },
        );
    }

    /// An acknowledgement (or refusal) of one of our replication messages.
    pub(super) fn on_ack(&mut self, _now: u64, msg: &Msg, out: &mut Vec<Out<P>>) {
        if !self.inflight.contains_key(&msg.req) {
            return;
        }
        if matches!(msg.body, Body::Error { .. }) {
            // A transient failure there, or a group handed over (refused
            // while sealed; a node whose table is older or newer than
            // ours): keep resending, each resend routed by the table then.
            return;
        }
        let Some(inf) = self.inflight.remove(&msg.req) else {
            return;
        };
        if let Some(p) = self.pending.get_mut(&inf.name) {
            if let (true, Phase::Replicating { acked, .. }) = (p.op == inf.op, &mut p.phase) {
                if let Some(a) = acked.get_mut(inf.index) {
                    *a = true;
                }
            }
        }
        self.maybe_finish(&inf.name, out);
    }

    /// Acknowledges the client once W_m addresses hold the update.
    pub(super) fn maybe_finish(&mut self, name: &str, out: &mut Vec<Out<P>>) {
        let done = match self.pending.get(name) {
            Some(Pending {
                phase: Phase::Replicating { acked, needed, .. },
                ..
            }) => acked.iter().filter(|&&a| a).count() >= *needed,
            _ => false,
        };
        if !done {
            return;
        }
        let Some(p) = self.pending.remove(name) else {
            return;
        };
        let mut body = Body::Done { version: p.version };
        if let Phase::Replicating {
            free_after, answer, ..
        } = p.phase
        {
            out.extend(free_after.into_iter().map(Out::Free));
            body = answer.map_or(body, |answer| *answer);
        }
        let reply = Msg::new(p.client_req, 0, body);
        // The reply's target is irrelevant to the client; keep the request id.
        self.reply(p.client, reply, out);
    }

    /// Replica addresses this node has handed out but not committed yet:
    /// Posts waiting for their data and repair copies in flight.
    pub(super) fn pending_replicas(&self) -> impl Iterator<Item = Addr> + '_ {
        let posts = self.pending.values().flat_map(|p| match &p.phase {
            Phase::Data { replicas, .. } => replicas.as_slice(),
            Phase::Replicating { .. } => &[],
        });
        let repairs = self.repairs.values().flat_map(|r| r.targets.iter());
        posts.chain(repairs).copied()
    }
}
