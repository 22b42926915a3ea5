//! The pool's layer files on disk: removing one a failed change made,
//! syncing the directory, and the reconciliation with the catalog at
//! startup (frozen layers repaired, orphans removed, tops rebased).

use super::*;

/// Removes a layer file a failed change made and the catalog does not
/// name (if it was made at all); startup removes it if this fails.
pub(super) fn remove_unused_layer(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("could not remove unused layer file {}: {e}", path.display()),
    }
}

pub(super) fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Repairs layers a crash left marked dirty: snapshots' layers frozen but
/// not yet durable when the daemon died. Volume tops are left to their
/// writer, which repairs its own file when it opens it.
pub(super) fn repair_frozen_layers(dir: &Path, state: &State, report: &mut RecoveryReport) {
    let tops: std::collections::HashSet<&str> =
        state.volumes.values().map(|v| v.top.as_str()).collect();
    for id in state.layers.keys() {
        if tops.contains(id.as_str()) {
            continue;
        }
        let path = dir.join(layer_file(id));
        if !path.exists() {
            continue; // reported when its volume is opened
        }
        match strata_disk::check::repair_dirty(&path) {
            Ok(true) => report.repaired.push(layer_file(id)),
            Ok(false) => {}
            Err(e) => report.problems.push(format!(
                "layer {} was left dirty and not repaired: {e}",
                path.display()
            )),
        }
    }
}

/// Whether `name` is a file name this pool gives layers (32 hex digits and
/// `.qcow2`): only those are ever removed as orphans.
pub(super) fn is_layer_file(name: &str) -> Option<&str> {
    let id = name.strip_suffix(".qcow2")?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// Removes layer files the catalog does not name; returns their names.
pub(super) fn remove_orphans(dir: &Path, state: &State, trash: &Trash) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| VolumeError::Io(format!("cannot list {}: {e}", dir.display())))?;
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = is_layer_file(&name) else {
            continue;
        };
        if !state.layers.contains_key(id) {
            trash.discard(&entry.path()).map_err(|e| {
                VolumeError::Io(format!(
                    "cannot remove orphan layer {}: {e}",
                    entry.path().display()
                ))
            })?;
            removed.push(name);
        }
    }
    if !removed.is_empty() {
        sync_dir(dir);
    }
    removed.sort();
    Ok(removed)
}

/// Makes every layer file name the parent the catalog records. A
/// compaction commits the new parent before it rewrites the file, so after
/// a crash between the two the file still names a layer that the merged
/// one replaced (and holds the same bytes as). Returns the files changed.
pub(super) fn rebase_to_catalog(dir: &Path, state: &State) -> Result<Vec<String>> {
    let mut rebased = Vec::new();
    for layer in state.layers.values() {
        let Some(parent) = &layer.parent else {
            continue;
        };
        let path = dir.join(layer_file(&layer.id));
        let want = layer_file(parent);
        match strata_disk::compact::backing_file(&path) {
            Ok(Some(name)) if name == want => {}
            Ok(Some(_)) if dir.join(&want).exists() => {
                strata_disk::set_backing_file(&path, &want)?;
                rebased.push(layer_file(&layer.id));
            }
            // Missing files and other mismatches are reported when the
            // volume is opened.
            _ => {}
        }
    }
    if !rebased.is_empty() {
        sync_dir(dir);
    }
    Ok(rebased)
}
