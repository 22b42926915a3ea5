//! Events of the namespace, kept in the catalog's database: an ephemeral
//! file is **lost** when its holder's lease lapses (its only copy is on
//! a node that no longer answers: reads of it get EIO), and **recovered**
//! when that node comes back with it. Each event names the file, its
//! holder, its size and the step that wrote it (the `producer`, given
//! with the `user.strata.producer` attribute), so that a planner (the
//! durability issue's re-execution) can run that step again.
//!
//! The service looks for lapsed leases every quarter of a lease
//! ([`Catalog::sweep`]). Only nodes seen since the service started can
//! lapse: after a restart, a node is silent until its next heartbeat,
//! which is not a loss. At most [`MAX_EVENTS`] events are kept, the
//! oldest dropped first.

use redb::{ReadableTable, TableDefinition};

use crate::catalog::{decode, store_error, Catalog, FILES};
use crate::protocol::{unix_ms, Event, EventKind, EventPage};
use crate::Result;

/// Event number → the JSON of its [`Event`].
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");

/// Most events kept.
pub const MAX_EVENTS: u64 = 10_000;

/// Most events one page answers.
pub const MAX_EVENT_PAGE: usize = 1_000;

impl Catalog {
    /// Announces the loss of the ephemeral files of every node whose
    /// lease lapsed since the last sweep; the events written.
    pub fn sweep(&self) -> Result<Vec<Event>> {
        let lapsed: Vec<String> = {
            let leases = self.leases.lock();
            let mut announced = self.lapsed.lock();
            leases
                .iter()
                .filter(|(_, seen)| seen.elapsed() >= self.lease())
                .filter(|&(node, _)| announced.insert(node.clone()))
                .map(|(node, _)| node.clone())
                .collect()
        };
        let mut written = Vec::new();
        for node in lapsed {
            written.extend(self.announce_holder(&node, EventKind::Lost)?);
        }
        Ok(written)
    }

    /// Writes a `kind` event for every ephemeral file `node` holds.
    pub(crate) fn announce_holder(&self, node: &str, kind: EventKind) -> Result<Vec<Event>> {
        let txn = self
            .database
            .begin_write()
            .map_err(|e| store_error("starting a write", e))?;
        let written = {
            let files = txn
                .open_table(FILES)
                .map_err(|e| store_error("opening the files", e))?;
            let mut events = txn
                .open_table(EVENTS)
                .map_err(|e| store_error("opening the events", e))?;
            let mut next = last_seq(&events)? + 1;
            let mut written = Vec::new();
            for row in files.iter().map_err(|e| store_error("listing files", e))? {
                let (path, value) = row.map_err(|e| store_error("listing files", e))?;
                let entry = decode(path.value(), value.value())?;
                if entry.directory || !entry.ephemeral || entry.holder.as_deref() != Some(node) {
                    continue;
                }
                let event = Event {
                    seq: next,
                    kind,
                    path: entry.path,
                    holder: node.to_string(),
                    producer: entry.producer,
                    size: entry.size,
                    at_ms: unix_ms(),
                };
                let bytes = serde_json::to_vec(&event).map_err(|e| store_error("encoding", e))?;
                events
                    .insert(next, bytes.as_slice())
                    .map_err(|e| store_error("writing an event", e))?;
                written.push(event);
                next += 1;
            }
            trim(&mut events, next - 1)?;
            written
        };
        txn.commit().map_err(|e| store_error("committing", e))?;
        for event in &written {
            tracing::warn!(
                "F3: {} {:?}: {} (holder {}, producer {})",
                event.path,
                event.kind,
                match event.kind {
                    EventKind::Lost => "its holder's lease lapsed; reads get EIO",
                    EventKind::Recovered => "its holder is back",
                },
                event.holder,
                event.producer.as_deref().unwrap_or("not named")
            );
        }
        Ok(written)
    }

    /// The events after number `after`, oldest first, at most `limit`
    /// (at most [`MAX_EVENT_PAGE`]).
    pub fn events(&self, after: u64, limit: usize) -> Result<EventPage> {
        let txn = self
            .database
            .begin_read()
            .map_err(|e| store_error("reading", e))?;
        let table = match txn.open_table(EVENTS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => {
                return Ok(EventPage {
                    events: Vec::new(),
                    last: 0,
                })
            }
            Err(e) => return Err(store_error("opening the events", e)),
        };
        let mut events = Vec::new();
        let from = after.saturating_add(1);
        for row in table
            .range(from..)
            .map_err(|e| store_error("listing events", e))?
            .take(limit.clamp(1, MAX_EVENT_PAGE))
        {
            let (seq, value) = row.map_err(|e| store_error("listing events", e))?;
            let event: Event = serde_json::from_slice(value.value())
                .map_err(|e| store_error(&format!("event {} is unreadable", seq.value()), e))?;
            events.push(event);
        }
        Ok(EventPage {
            events,
            last: last_seq(&table)?,
        })
    }
}

fn last_seq(table: &impl ReadableTable<u64, &'static [u8]>) -> Result<u64> {
    Ok(table
        .last()
        .map_err(|e| store_error("reading the last event", e))?
        .map_or(0, |(seq, _)| seq.value()))
}

/// Drops the oldest events past [`MAX_EVENTS`], `last` being the newest.
fn trim(events: &mut redb::Table<u64, &[u8]>, last: u64) -> Result<()> {
    let keep_from = last.saturating_sub(MAX_EVENTS - 1);
    if keep_from > 1 {
        events
            .retain_in(..keep_from, |_, _| false)
            .map_err(|e| store_error("dropping old events", e))?;
    }
    Ok(())
}
