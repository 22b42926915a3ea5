//! Admission: metadata and storage nodes registering (again) with the
//! orchestrator, and the slots and prefixes they get.

use super::*;

impl OnCore {
    pub(super) fn register_mn(
        &mut self,
        uuid: u64,
        endpoint: std::net::SocketAddr,
    ) -> Result<u16, Error> {
        if let Some(m) = self.table.mns.iter_mut().find(|m| m.uuid == uuid) {
            m.endpoint = endpoint;
            let was_dead = m.state == State::Dead;
            m.state = State::Up;
            let slot = m.slot;
            // Back before it was declared dead: its groups come home.
            self.hand_back();
            if was_dead {
                self.plan_moves(slot);
            }
            return Ok(slot);
        }
        let slot = self.table.mns.len() as u16;
        if slot >= self.expected_mns {
            // Every slot is taken: a new slot, and groups handed over to it.
            let slot = self
                .table
                .mns
                .iter()
                .map(|m| m.slot)
                .max()
                .map_or(0, |s| s + 1);
            if slot as usize >= self.table.layout.mg_count() {
                return Err(Error::Remote {
                    code: Code::Unavailable,
                    message: format!(
                        "the cluster has as many metadata nodes as metadata groups ({}); another one would own none",
                        self.table.layout.mg_count()
                    ),
                });
            }
            self.table.mns.push(MnEntry {
                uuid,
                slot,
                endpoint,
                state: State::Up,
            });
            self.expected_mns = slot + 1;
            self.plan_moves(slot);
            return Ok(slot);
        }
        self.table.mns.push(MnEntry {
            uuid,
            slot,
            endpoint,
            state: State::Up,
        });
        Ok(slot)
    }

    pub(super) fn register_sn(
        &mut self,
        uuid: u64,
        endpoint: std::net::SocketAddr,
        capacity: u64,
        free: u64,
        device: Device,
    ) -> Result<u16, Error> {
        if let Some(s) = self.table.sns.iter_mut().find(|s| s.uuid == uuid) {
            if s.state == State::Retired {
                return Err(Error::Remote {
                    code: Code::Unavailable,
                    message: format!("storage node {uuid:016x} was retired; give it a fresh directory to join again"),
                });
            }
            s.endpoint = endpoint;
            s.capacity = capacity;
            s.free = free;
            s.device = device;
            s.state = State::Up;
            return Ok(s.index);
        }
        let index = self.table.sns.iter().map(|s| s.index).max().unwrap_or(0) + 1;
        if index == u16::MAX {
            return Err(Error::Remote {
                code: Code::Unavailable,
                message: "no storage-node prefix left".into(),
            });
        }
        self.table.sns.push(SnEntry {
            uuid,
            index,
            endpoint,
            capacity,
            free,
            objects: 0,
            device,
            state: State::Up,
        });
        Ok(index)
    }
}
