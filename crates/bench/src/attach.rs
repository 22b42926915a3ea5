//! Volumes with a file system (`attach: fs`): the volume's NBD export
//! becomes a file through nbdfuse, the file a block device through a loop
//! device, which is formatted with ext4 once and mounted.
//!
//! Everything lives under [`BASE`]`/RUNID/aN/` (`fuse/disk` the file,
//! `mnt` the mount point), not in the run directory: PostgreSQL runs as
//! an unprivileged user there, and a run directory may sit under a home
//! that user cannot enter. The run id in every path is how
//! [`clean_run`] finds what a killed run left, and how a test checks that
//! nothing is left.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bounded;
use crate::provider::Stages;

/// Where attachments live: one directory per run inside.
pub const BASE: &str = "/tmp/strata-bench";
/// How long nbdfuse may take to serve its file.
const NBDFUSE_READY_WITHIN: Duration = Duration::from_secs(20);
/// How long nbdfuse may take to exit once its file system is unmounted.
const NBDFUSE_EXIT_WITHIN: Duration = Duration::from_secs(10);
/// How long one helper (losetup, mkfs.ext4, mount, umount) may take: a
/// formatting of a large volume over NBD is the slowest.
const HELPER_WITHIN: Duration = Duration::from_secs(300);
/// How long an unmount is retried while the file system is busy (a
/// process that is still closing its files).
const UNMOUNT_RETRY: Duration = Duration::from_secs(5);

/// The directory of a run's attachments.
pub fn run_base(run_id: &str) -> PathBuf {
    Path::new(BASE).join(run_id)
}

/// Makes `dir` (and its parents) enterable by every user: PostgreSQL's
/// user reaches its data directory through it.
fn make_open_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut at = Some(dir);
    while let Some(path) = at.filter(|p| p.starts_with(BASE)) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("cannot open up {}: {e}", path.display()))?;
        at = path.parent();
    }
    Ok(())
}

/// A volume attached as a file, and maybe as a mounted file system.
pub struct Attachment {
    /// The attachment's directory.
    dir: PathBuf,
    /// The volume's name (kept in `dir/volume` for people).
    volume: String,
    nbdfuse: Option<Child>,
    loop_device: Option<String>,
    mounted: bool,
}

impl Attachment {
    /// Serves the export at `uri` as the file `fuse/disk` of a new
    /// directory `aNUMBER` of the run's attachments, with nbdfuse.
    pub fn serve(run_id: &str, number: u64, volume: &str, uri: &str) -> Result<Attachment, String> {
        let dir = run_base(run_id).join(format!("a{number}"));
        make_open_dir(&dir.join("fuse"))?;
        let note = dir.join("volume");
        std::fs::write(&note, volume)
            .map_err(|e| format!("cannot write {}: {e}", note.display()))?;
        let mut attachment = Attachment {
            dir,
            volume: volume.to_string(),
            nbdfuse: None,
            loop_device: None,
            mounted: false,
        };
        attachment.start_nbdfuse(uri)?;
        Ok(attachment)
    }

    fn start_nbdfuse(&mut self, uri: &str) -> Result<(), String> {
        let pid_file = self.dir.join("nbdfuse.pid");
        let log = self.dir.join("nbdfuse.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let child = Command::new("nbdfuse")
            .arg("-P")
            .arg(&pid_file)
            .arg(self.file())
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            // Its own process group: Ctrl-C reaches the run, which
            // unmounts in order (file system, loop device, then this).
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start nbdfuse (apt-get install nbdfuse): {e}"))?;
        self.nbdfuse = Some(child);
        let deadline = Instant::now() + NBDFUSE_READY_WITHIN;
        loop {
            if std::fs::metadata(&pid_file).is_ok_and(|m| m.len() > 0) {
                return Ok(());
            }
            let exited = self
                .nbdfuse
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited || Instant::now() > deadline {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "nbdfuse did not serve {uri} as a file{}: {}",
                    if exited { "" } else { " in time" },
                    tail.lines().last().unwrap_or("no message")
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The file nbdfuse serves.
    pub fn file(&self) -> PathBuf {
        self.dir.join("fuse").join("disk")
    }

    /// Where the file system is mounted (once [`Attachment::mount`] is done).
    pub fn mount_point(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    /// A directory of the attachment's own for sockets and notes.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Puts the file on a loop device (stage `attached`), formats it with
    /// ext4 if `format` (stage `formatted`), and mounts it (stage
    /// `mounted`).
    pub fn mount(&mut self, format: bool, stages: &mut Stages) -> Result<(), String> {
        let device = bounded::succeed(
            Command::new("losetup")
                .arg("--find")
                .arg("--show")
                .arg(self.file()),
            HELPER_WITHIN,
            "losetup",
        )?;
        let device = device.trim().to_string();
        if !device.starts_with("/dev/loop") {
            return Err(format!("losetup gave {device:?}, not a loop device"));
        }
        self.loop_device = Some(device.clone());
        stages.mark("attached");
        if format {
            bounded::succeed(
                Command::new("mkfs.ext4").args(["-q", "-F", &device]),
                HELPER_WITHIN,
                "mkfs.ext4",
            )?;
            stages.mark("formatted");
        }
        let mount_point = self.mount_point();
        make_open_dir(&mount_point)?;
        bounded::succeed(
            Command::new("mount").arg(&device).arg(&mount_point),
            HELPER_WITHIN,
            "mount",
        )?;
        self.mounted = true;
        std::fs::set_permissions(&mount_point, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("cannot open up {}: {e}", mount_point.display()))?;
        stages.mark("mounted");
        Ok(())
    }

    /// Unmounts the file system, detaches the loop device, stops nbdfuse
    /// and removes the directory; the first error, after trying all.
    pub fn detach(&mut self) -> Result<(), String> {
        let mut errors = Vec::new();
        if std::mem::take(&mut self.mounted) {
            if let Err(e) = unmount(&self.mount_point()) {
                errors.push(e);
            }
        }
        if let Some(device) = self.loop_device.take() {
            if let Err(e) = bounded::succeed(
                Command::new("losetup").args(["-d", &device]),
                HELPER_WITHIN,
                "losetup -d",
            ) {
                errors.push(e);
            }
        }
        if let Some(child) = self.nbdfuse.take() {
            if let Err(e) = stop_nbdfuse(child, &self.dir.join("fuse")) {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            remove_attachment_dir(&self.dir);
            return Ok(());
        }
        Err(format!(
            "detaching volume {} ({}): {}",
            self.volume,
            self.dir.display(),
            errors.join("; ")
        ))
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        // Detached explicitly where the outcome is recorded; this is for
        // an attachment abandoned on an error path.
        let _ = self.detach();
    }
}

/// Unmounts `path`, retrying while it is busy.
fn unmount(path: &Path) -> Result<(), String> {
    let deadline = Instant::now() + UNMOUNT_RETRY;
    loop {
        match bounded::succeed(Command::new("umount").arg(path), HELPER_WITHIN, "umount") {
            Ok(_) => return Ok(()),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(format!("{e} ({})", path.display())),
        }
    }
}

/// Unmounts nbdfuse's file system, which makes it exit; kills it if it
/// does not.
fn stop_nbdfuse(mut child: Child, fuse_dir: &Path) -> Result<(), String> {
    let unmounted = unmount(fuse_dir);
    let deadline = Instant::now() + NBDFUSE_EXIT_WITHIN;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return unmounted;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    unmounted.and(Err(format!(
        "nbdfuse did not exit within {NBDFUSE_EXIT_WITHIN:?} of its unmount: killed it"
    )))
}

/// Removes an attachment's directory once nothing is mounted in it: only
/// the entries the attachment made, never a file system's contents.
fn remove_attachment_dir(dir: &Path) {
    for file in ["volume", "nbdfuse.pid", "nbdfuse.log", "postgres.log"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
    // PostgreSQL's socket directory (a lock file may stay after a kill).
    let _ = std::fs::remove_dir_all(dir.join("sock"));
    for sub in ["mnt", "fuse"] {
        let _ = std::fs::remove_dir(dir.join(sub));
    }
    let _ = std::fs::remove_dir(dir);
    if let Some(run) = dir.parent() {
        let _ = std::fs::remove_dir(run);
    }
}

/// The mount points under `prefix`, from the kernel's mount table.
pub fn mounts_under(prefix: &Path) -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|mount| mount.starts_with(prefix))
        .collect()
}

/// The loop devices whose backing file is under `prefix`.
pub fn loop_devices_under(prefix: &Path) -> Vec<String> {
    let listing = bounded::run(
        Command::new("losetup").args([
            "--list",
            "--noheadings",
            "--raw",
            "--output",
            "NAME,BACK-FILE",
        ]),
        HELPER_WITHIN,
        "losetup --list",
    );
    let Ok(listing) = listing else {
        return Vec::new();
    };
    let prefix = prefix.display().to_string();
    listing
        .stdout
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(_, file)| file.starts_with(&prefix))
        .map(|(device, _)| device.to_string())
        .collect()
}

/// Undoes what a killed run left attached: stops PostgreSQL servers on
/// its file systems, unmounts them, detaches their loop devices, unmounts
/// nbdfuse (which then exits) and removes the directories. What could not
/// be undone.
pub fn clean_run(run_id: &str) -> Vec<String> {
    let base = run_base(run_id);
    let mut errors = Vec::new();
    let Ok(entries) = std::fs::read_dir(&base) else {
        return errors;
    };
    for dir in entries.flatten().map(|e| e.path()) {
        let mount_point = dir.join("mnt");
        if mounts_under(&mount_point).contains(&mount_point) {
            crate::pgbench::stop_abandoned(&mount_point);
            if let Err(e) = unmount(&mount_point) {
                errors.push(e);
            }
        }
        for device in loop_devices_under(&dir) {
            if let Err(e) = bounded::succeed(
                Command::new("losetup").args(["-d", &device]),
                HELPER_WITHIN,
                "losetup -d",
            ) {
                errors.push(e);
            }
        }
        let fuse = dir.join("fuse");
        if mounts_under(&fuse).contains(&fuse) {
            if let Err(e) = unmount(&fuse) {
                errors.push(e);
            }
        }
        if mounts_under(&dir).is_empty() {
            remove_attachment_dir(&dir);
        }
    }
    errors
}
