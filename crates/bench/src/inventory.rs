//! What a run has made and not yet deleted: its volumes and snapshots,
//! in the order they were made, so that operations can pick the oldest,
//! the newest or one at random. An item an operation is about to delete
//! is taken out first, so that no other operation picks it meanwhile.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::RngExt;

use crate::spec::Selector;

/// Most volumes one run holds at once: each is a file (or more) and an
/// export on the provider, and every open rate could otherwise make them
/// without end.
pub const MAX_VOLUMES: usize = 4096;
/// Most snapshots one run holds at once.
pub const MAX_SNAPSHOTS: usize = 16_384;

/// A volume the run made.
#[derive(Clone, Debug)]
pub struct Volume {
    /// Its name on the provider.
    pub name: String,
    /// Its group in the spec.
    pub group: String,
    /// Its index in the group (setup makes 0 to count - 1).
    pub index: u32,
    /// Its size in bytes.
    pub size: u64,
    /// When it was made, in the order of all the run's items.
    born: u64,
    /// Whether a workload instance does I/O on it.
    pub held: bool,
}

/// A snapshot the run took.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Its volume's name.
    pub volume: String,
    /// Its name.
    pub name: String,
    /// Its volume's size when it was taken.
    pub size: u64,
    born: u64,
    /// Clones made or being made of it (a snapshot with clones is never
    /// deleted by the run: providers refuse it).
    pub clones: u32,
}

/// The run's volumes and snapshots.
#[derive(Default)]
pub struct Inventory {
    volumes: Vec<Volume>,
    snapshots: Vec<Snapshot>,
    next_index: HashMap<String, u32>,
    born: u64,
    next_snapshot: u64,
}

/// Which volumes an operation may act on.
pub struct Scope<'a> {
    /// The group.
    pub group: &'a str,
    /// Only the volumes a workload holds.
    pub held_only: bool,
    /// Only volumes no workload holds (deletes).
    pub free_only: bool,
}

impl Scope<'_> {
    fn admits(&self, volume: &Volume) -> bool {
        volume.group == self.group
            && (!self.held_only || volume.held)
            && (!self.free_only || !volume.held)
    }
}

/// Index of the item `select` picks among `candidates` (their birth order).
fn pick(candidates: &[(usize, u64)], select: Selector, rng: &mut StdRng) -> Option<usize> {
    match select {
        Selector::Oldest => candidates.iter().min_by_key(|(_, born)| *born),
        Selector::Newest => candidates.iter().max_by_key(|(_, born)| *born),
        Selector::Random if candidates.is_empty() => None,
        Selector::Random => candidates.get(rng.random_range(0..candidates.len())),
    }
    .map(|(index, _)| *index)
}

impl Inventory {
    /// The next free index in `group`, reserved.
    pub fn reserve_index(&mut self, group: &str) -> u32 {
        let next = self.next_index.entry(group.to_string()).or_insert(0);
        let index = *next;
        *next += 1;
        index
    }

    /// The number for the next snapshot's name.
    pub fn next_snapshot_number(&mut self) -> u64 {
        self.next_snapshot += 1;
        self.next_snapshot
    }

    /// Whether another volume fits under [`MAX_VOLUMES`].
    pub fn volume_room(&self) -> bool {
        self.volumes.len() < MAX_VOLUMES
    }

    /// Whether another snapshot fits under [`MAX_SNAPSHOTS`].
    pub fn snapshot_room(&self) -> bool {
        self.snapshots.len() < MAX_SNAPSHOTS
    }

    /// Adds a volume that was made.
    pub fn add_volume(&mut self, name: String, group: &str, index: u32, size: u64, held: bool) {
        self.born += 1;
        self.volumes.push(Volume {
            name,
            group: group.to_string(),
            index,
            size,
            born: self.born,
            held,
        });
    }

    /// Adds a snapshot that was taken.
    pub fn add_snapshot(&mut self, volume: &str, name: String, size: u64) {
        self.born += 1;
        self.snapshots.push(Snapshot {
            volume: volume.to_string(),
            name,
            size,
            born: self.born,
            clones: 0,
        });
    }

    /// The volume of `group` with `index`.
    pub fn volume_at(&self, group: &str, index: u32) -> Option<Volume> {
        self.volumes
            .iter()
            .find(|v| v.group == group && v.index == index)
            .cloned()
    }

    /// The volume named `name`.
    pub fn volume_named(&self, name: &str) -> Option<Volume> {
        self.volumes.iter().find(|v| v.name == name).cloned()
    }

    /// A volume in `scope`, picked by `select`.
    pub fn pick_volume(&self, scope: &Scope, select: Selector, rng: &mut StdRng) -> Option<Volume> {
        let candidates: Vec<(usize, u64)> = self
            .volumes
            .iter()
            .enumerate()
            .filter(|(_, v)| scope.admits(v))
            .map(|(i, v)| (i, v.born))
            .collect();
        pick(&candidates, select, rng).map(|i| self.volumes[i].clone())
    }

    /// Takes a volume in `scope` out (to delete it), with its snapshots.
    pub fn take_volume(
        &mut self,
        scope: &Scope,
        select: Selector,
        rng: &mut StdRng,
    ) -> Option<Volume> {
        let volume = self.pick_volume(scope, select, rng)?;
        self.volumes.retain(|v| v.name != volume.name);
        self.snapshots.retain(|s| s.volume != volume.name);
        Some(volume)
    }

    /// Sets a volume's size after a resize.
    pub fn set_size(&mut self, name: &str, size: u64) {
        if let Some(volume) = self.volumes.iter_mut().find(|v| v.name == name) {
            volume.size = volume.size.max(size);
        }
    }

    fn snapshot_candidates(&self, scope: &Scope, without_clones: bool) -> Vec<(usize, u64)> {
        self.snapshots
            .iter()
            .enumerate()
            .filter(|(_, s)| !without_clones || s.clones == 0)
            .filter(|(_, s)| {
                self.volumes
                    .iter()
                    .any(|v| v.name == s.volume && scope.admits(v))
            })
            .map(|(i, s)| (i, s.born))
            .collect()
    }

    /// Takes a snapshot without clones, of a volume in `scope`, out (to
    /// delete it).
    pub fn take_snapshot(
        &mut self,
        scope: &Scope,
        select: Selector,
        rng: &mut StdRng,
    ) -> Option<Snapshot> {
        let index = pick(&self.snapshot_candidates(scope, true), select, rng)?;
        Some(self.snapshots.remove(index))
    }

    /// A snapshot of a volume in `scope` to clone; counted as cloned until
    /// [`Inventory::clone_failed`] says otherwise.
    pub fn snapshot_to_clone(
        &mut self,
        scope: &Scope,
        select: Selector,
        rng: &mut StdRng,
    ) -> Option<Snapshot> {
        let index = pick(&self.snapshot_candidates(scope, false), select, rng)?;
        self.snapshots[index].clones += 1;
        Some(self.snapshots[index].clone())
    }

    /// A clone of this snapshot failed: it may be deleted again.
    pub fn clone_failed(&mut self, volume: &str, name: &str) {
        if let Some(snapshot) = self
            .snapshots
            .iter_mut()
            .find(|s| s.volume == volume && s.name == name)
        {
            snapshot.clones = snapshot.clones.saturating_sub(1);
        }
    }

    /// How many volumes and snapshots the run holds.
    pub fn counts(&self) -> (usize, usize) {
        (self.volumes.len(), self.snapshots.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn selectors_pick_by_age_and_deletes_skip_cloned_snapshots() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut inventory = Inventory::default();
        for index in 0..3 {
            inventory.add_volume(format!("v{index}"), "data", index, 1 << 20, true);
        }
        let scope = Scope {
            group: "data",
            held_only: true,
            free_only: false,
        };
        assert_eq!(
            inventory
                .pick_volume(&scope, Selector::Oldest, &mut rng)
                .unwrap()
                .name,
            "v0"
        );
        assert_eq!(
            inventory
                .pick_volume(&scope, Selector::Newest, &mut rng)
                .unwrap()
                .name,
            "v2"
        );
        inventory.add_snapshot("v1", "s1".into(), 1 << 20);
        inventory.add_snapshot("v1", "s2".into(), 1 << 20);
        let cloned = inventory
            .snapshot_to_clone(&scope, Selector::Oldest, &mut rng)
            .unwrap();
        assert_eq!(cloned.name, "s1");
        assert_eq!(
            inventory
                .take_snapshot(&scope, Selector::Oldest, &mut rng)
                .unwrap()
                .name,
            "s2"
        );
        assert!(inventory
            .take_snapshot(&scope, Selector::Oldest, &mut rng)
            .is_none());
        inventory.clone_failed("v1", "s1");
        assert_eq!(
            inventory
                .take_snapshot(&scope, Selector::Random, &mut rng)
                .unwrap()
                .name,
            "s1"
        );
        let free = Scope {
            group: "data",
            held_only: false,
            free_only: true,
        };
        assert!(inventory
            .take_volume(&free, Selector::Random, &mut rng)
            .is_none());
    }
}
