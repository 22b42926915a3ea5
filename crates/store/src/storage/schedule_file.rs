//! RS3 settings changed at run time (`strata store schedule`) kept in the
//! storage node's directory, so that a restart does not silently undo
//! what the operator set: a node restarted after a crash would otherwise
//! go back to its start flags while the others kept the new settings.
//!
//! The file holds the whole configuration as
//! [`ScheduleConfig::to_settings`] writes it. At start it replaces what
//! the flags set, except the default weight, which only a flag sets.
//! Removing the file goes back to the flags.

use crate::storage::schedule::config::ScheduleConfig;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The settings file's name inside the storage node's directory.
pub const SCHEDULE_FILE: &str = "rs3.settings";

/// Largest settings file read: the weight and class tables at their
/// limits ([`crate::storage::schedule::config::MAX_WEIGHTED_CLASSES`]
/// lines each, at most ~140 bytes a line) fit well under it.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The path of the settings file of the node stored in `dir`.
pub fn schedule_path(dir: &Path) -> PathBuf {
    dir.join(SCHEDULE_FILE)
}

/// The settings a node stored in `dir` starts with: those kept in its
/// settings file if it has one, otherwise `flags` (the start flags). A
/// file that cannot be read or holds a bad setting is an error naming
/// it, so that a node never starts on settings its operator did not
/// choose.
pub fn load(dir: &Path, flags: &ScheduleConfig) -> Result<ScheduleConfig, String> {
    let path = schedule_path(dir);
    let bad = |why: String| {
        format!(
            "{}: {why}; fix it with `strata store schedule` once the node is up, \
             or remove the file to start from the flags",
            path.display()
        )
    };
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(flags.clone()),
        Err(e) => return Err(bad(e.to_string())),
    };
    let mut text = String::new();
    let read = std::io::Read::read_to_string(
        &mut std::io::Read::take(file, MAX_FILE_BYTES + 1),
        &mut text,
    );
    read.map_err(|e| bad(e.to_string()))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(bad(format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    let base = ScheduleConfig {
        default_weight: flags.default_weight,
        ..ScheduleConfig::default()
    };
    base.with_settings(&text).map_err(bad)
}

/// Writes `config` to the settings file of the node stored in `dir`,
/// durably: a temporary file, synced, renamed over the old one, and the
/// directory synced, so a crash leaves the old settings or the new ones.
pub fn save(dir: &Path, config: &ScheduleConfig) -> std::io::Result<()> {
    let path = schedule_path(dir);
    let temporary = dir.join(format!("{SCHEDULE_FILE}.tmp"));
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(config.to_settings().as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, &path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "strata-rs3-file-{}-{}",
            std::process::id(),
            crate::runtime::nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn saved_settings_replace_the_flags_at_the_next_start() {
        let dir = tmp();
        let flags = ScheduleConfig {
            default_weight: 2,
            ..ScheduleConfig::default()
        }
        .with_settings("weight=old:5\nclass=t:old\n")
        .unwrap();
        assert_eq!(load(&dir, &flags).unwrap(), flags, "no file: the flags");

        let changed = flags
            .with_settings("rs3=on\nbatch=131072\nunweight=old\nweight=acme:3\nunclass=t\n")
            .unwrap();
        save(&dir, &changed).unwrap();
        let loaded = load(&dir, &flags).unwrap();
        assert_eq!(
            loaded, changed,
            "a weight removed at run time stays removed"
        );
        assert_eq!(loaded.default_weight, 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_or_huge_file_is_an_error_naming_it() {
        let dir = tmp();
        std::fs::write(schedule_path(&dir), "rs3=maybe\n").unwrap();
        let why = load(&dir, &ScheduleConfig::default()).unwrap_err();
        assert!(
            why.contains(SCHEDULE_FILE) && why.contains("rs3=maybe"),
            "{why}"
        );
        std::fs::write(schedule_path(&dir), "batch=1\n").unwrap();
        let why = load(&dir, &ScheduleConfig::default()).unwrap_err();
        assert!(why.contains("out of bounds"), "{why}");
        let huge = "rs3=on\n".repeat((MAX_FILE_BYTES / 7 + 1) as usize);
        std::fs::write(schedule_path(&dir), huge).unwrap();
        let why = load(&dir, &ScheduleConfig::default()).unwrap_err();
        assert!(why.contains("larger than"), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
