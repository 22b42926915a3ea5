//! The FUSE file system of a node (fuser): the shared namespace, where
//! each file is ephemeral (its content on its holder's disk: [`LocalFile`]
//! here, a [`RemoteCopy`] pulled from the holder elsewhere) or durable (an
//! object in the store, read whole at open, written back at close).
//!
//! Every open is `direct_io`: reads reach the agent whatever size the
//! kernel last saw, which is what lets a read at the end of a file being
//! written wait for more bytes. A read that must wait is handed to a
//! thread of its own (at most [`MAX_WAITING_READS`]), so the file
//! system's threads keep serving the writer meanwhile.
//!
//! What is refused, with its errno: writing an ephemeral file another node
//! holds (EPERM), a durable file without a durable tier (EROFS), setting
//! the tier of a file through its xattr (EPERM: use `strata f3 persist`),
//! and renames (ENOSYS, not in this version).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, OpenAccMode, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, ReplyXattr, Request, WriteFlags,
};
use parking_lot::Mutex;

use super::copies::CopyRead;
use super::handles::Handle;
use super::Shared;
use crate::error::ErrorKind;
use crate::path::NamespacePath;
use crate::protocol::*;
use crate::{F3Error, Result};

/// Most reads waiting at the end of a file at once (each on a thread).
pub const MAX_WAITING_READS: usize = 1024;

/// How long one waiting read waits before it looks again (a writer may
/// be gone without its close, when its node died).
const WAIT_SLICE: Duration = Duration::from_millis(500);

/// Attributes and entries are not cached: other nodes change them.
const TTL: Duration = Duration::ZERO;

/// FUSE threads serving requests.
const FUSE_THREADS: usize = 4;

/// Mounts `shared`'s namespace at `mountpoint`.
pub fn mount(
    shared: Arc<Shared>,
    mountpoint: &std::path::Path,
) -> Result<fuser::BackgroundSession> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("f3:{}", shared.name)),
        fuser::MountOption::Subtype("strata-f3".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(FUSE_THREADS);
    let filesystem = F3Filesystem {
        shared,
        inodes: Mutex::new(Inodes::default()),
        handles: Mutex::new(HashMap::new()),
        next_handle: AtomicU64::new(1),
        waiting: Arc::new(AtomicUsize::new(0)),
    };
    fuser::spawn_mount(filesystem, mountpoint, &config).map_err(|e| {
        F3Error::io(
            format!(
                "mounting F3 at {} (it must be an empty directory, /dev/fuse must exist, \
                 and the agent must run as root)",
                mountpoint.display()
            ),
            e,
        )
    })
}

/// Inode numbers given to paths, both ways.
#[derive(Default)]
struct Inodes {
    by_path: HashMap<String, u64>,
    by_number: HashMap<u64, String>,
    next: u64,
}

impl Inodes {
    fn number(&mut self, path: &str) -> u64 {
        if path == "/" {
            return INodeNo::ROOT.0;
        }
        if let Some(n) = self.by_path.get(path) {
            return *n;
        }
        self.next = self.next.max(INodeNo::ROOT.0) + 1;
        self.by_path.insert(path.to_string(), self.next);
        self.by_number.insert(self.next, path.to_string());
        self.next
    }

    fn path(&self, number: u64) -> Option<String> {
        if number == INodeNo::ROOT.0 {
            return Some("/".into());
        }
        self.by_number.get(&number).cloned()
    }
}

struct F3Filesystem {
    shared: Arc<Shared>,
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_handle: AtomicU64,
    waiting: Arc<AtomicUsize>,
}

fn errno(error: &F3Error) -> Errno {
    Errno::from_i32(error.errno())
}

fn io_errno(error: &std::io::Error) -> Errno {
    Errno::from_i32(error.raw_os_error().unwrap_or(libc::EIO))
}

impl F3Filesystem {
    fn path_of(&self, ino: INodeNo) -> std::result::Result<NamespacePath, Errno> {
        let text = self.inodes.lock().path(ino.0).ok_or(Errno::ENOENT)?;
        NamespacePath::parse(&text).map_err(|_| Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> std::result::Result<NamespacePath, Errno> {
        let parent = self.path_of(parent)?;
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        parent.join(name).map_err(|e| errno(&e))
    }

    fn attr(&self, entry: &Entry) -> FileAttr {
        let ino = self.inodes.lock().number(&entry.path);
        let mut size = entry.size;
        if entry.ephemeral && entry.holder.as_deref() == Some(self.shared.name.as_str()) {
            if let Some(local) = self.shared.local.get(&entry.path) {
                size = local.snapshot().0;
            }
        }
        let time = UNIX_EPOCH + Duration::from_millis(entry.modified_ms);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind: if entry.directory {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: if entry.directory { 0o777 } else { 0o666 },
            nlink: if entry.directory { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn add_handle(&self, handle: Handle) -> FileHandle {
        let number = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(number, Arc::new(handle));
        FileHandle(number)
    }

    fn handle(&self, fh: FileHandle) -> std::result::Result<Arc<Handle>, Errno> {
        self.handles.lock().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    /// Whether a new file at `path` is ephemeral: by its suffix, its
    /// directory's marking, or the mount's option.
    fn new_file_is_ephemeral(&self, path: &NamespacePath, parent: &Entry) -> bool {
        self.shared.all_ephemeral || parent.ephemeral || path.name().ends_with(EPHEMERAL_SUFFIX)
    }

    /// Replies to a read that has to wait, from a thread of its own.
    /// A flush (`sync` false) or fsync (`sync` true) of `handle`: a
    /// durable file's content goes to the store (so that close or fsync
    /// reports a failed upload); an fsync of an ephemeral file held here
    /// puts its bytes on the holder's disk (its only copy: there is no
    /// other durability to give it).
    fn write_back(&self, handle: &Handle, sync: bool) -> std::result::Result<(), Errno> {
        match handle {
            Handle::Durable {
                path,
                staging: Some(staging),
                dirty,
                ..
            } if dirty.swap(false, Ordering::Relaxed) => {
                super::handles::upload(&self.shared, path, staging).map_err(|e| {
                    tracing::error!("{path}: {e}");
                    dirty.store(true, Ordering::Relaxed);
                    Errno::EIO
                })?;
            }
            Handle::Local {
                file,
                writable: true,
            } if sync => file.sync().map_err(|e| io_errno(&e))?,
            _ => {}
        }
        Ok(())
    }

    /// Names the step that wrote file `path` (the producer xattr).
    fn set_producer(&self, path: &NamespacePath, value: &[u8], reply: ReplyEmpty) {
        let Ok(producer) = std::str::from_utf8(value) else {
            return reply.error(Errno::EINVAL);
        };
        let result = self.shared.service.update(&UpdateRequest {
            path: path.to_string(),
            producer: Some(producer.to_string()),
            ..Default::default()
        });
        match result {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn wait_and_reply(&self, handle: Arc<Handle>, offset: u64, size: u32, reply: ReplyData) {
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= MAX_WAITING_READS {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            reply.error(Errno::EAGAIN);
            return;
        }
        let waiting = self.waiting.clone();
        let spawned = std::thread::Builder::new()
            .name("f3-read-wait".into())
            .spawn(move || {
                let result = loop {
                    let step = match &*handle {
                        Handle::Local { file, .. } => file
                            .read_waiting(offset, size, WAIT_SLICE)
                            .map(|r| r.map(Ok)),
                        Handle::Remote { copy } => {
                            copy.read_waiting(offset, size, WAIT_SLICE)
                                .map(|r| match r {
                                    CopyRead::Bytes(b) => Some(Ok(b)),
                                    CopyRead::Wait => None,
                                    CopyRead::Failed(_) => Some(Err(Errno::EIO)),
                                })
                        }
                        Handle::Durable { .. } => Ok(Some(Err(Errno::EIO))),
                    };
                    match step {
                        Ok(Some(done)) => break done,
                        Ok(None) => continue,
                        Err(e) => break Err(io_errno(&e)),
                    }
                };
                match result {
                    Ok(bytes) => reply.data(&bytes),
                    Err(e) => reply.error(e),
                }
                waiting.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            tracing::error!("starting a waiting read's thread: {e}");
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Filesystem for F3Filesystem {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Opens see O_TRUNC, so a truncating open of a durable file does
        // not fetch the content it is about to drop.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ATOMIC_O_TRUNC);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.shared.service.stat(path.as_str()) {
            Ok(entry) => reply.entry(&TTL, &self.attr(&entry), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.shared.service.stat(path.as_str()) {
            Ok(entry) => reply.attr(&TTL, &self.attr(&entry)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let result = (|| -> std::result::Result<Entry, Errno> {
            let entry = self
                .shared
                .service
                .stat(path.as_str())
                .map_err(|e| errno(&e))?;
            let Some(size) = size else { return Ok(entry) };
            if entry.directory {
                return Err(Errno::EISDIR);
            }
            if let Some(fh) = fh {
                if let Handle::Durable {
                    file,
                    staging: Some(_),
                    dirty,
                    ..
                } = &*self.handle(fh)?
                {
                    file.set_len(size).map_err(|e| io_errno(&e))?;
                    dirty.store(true, Ordering::Relaxed);
                    return Ok(Entry { size, ..entry });
                }
            }
            if entry.ephemeral && entry.holder.as_deref() == Some(self.shared.name.as_str()) {
                let local = self
                    .shared
                    .local
                    .open(path.as_str(), false)
                    .map_err(|e| errno(&e))?;
                local.set_size(size).map_err(|e| io_errno(&e))?;
                return self
                    .shared
                    .service
                    .update(&UpdateRequest {
                        path: path.to_string(),
                        size: Some(size),
                        ..Default::default()
                    })
                    .map_err(|e| errno(&e));
            }
            // Truncating a durable file or another node's ephemeral file
            // without an open writable handle is not supported here.
            Err(Errno::EPERM)
        })();
        match result {
            Ok(entry) => reply.attr(&TTL, &self.attr(&entry)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let result = self
            .shared
            .service
            .stat(path.parent().as_str())
            .and_then(|parent| {
                self.shared.service.create(&CreateRequest {
                    path: path.to_string(),
                    directory: true,
                    ephemeral: parent.ephemeral,
                    node: self.shared.name.clone(),
                    replace: false,
                })
            });
        match result {
            Ok(entry) => reply.entry(&TTL, &self.attr(&entry), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let result = (|| -> Result<()> {
            let entry = self.shared.service.stat(path.as_str())?;
            if entry.directory {
                return Err(F3Error::new(
                    ErrorKind::Invalid,
                    format!("{path} is a directory"),
                ));
            }
            let removed = self.shared.service.remove(path.as_str())?;
            if !removed.ephemeral {
                self.shared.durable()?.delete(path.as_str())?;
            }
            super::transfer::forget_file(&self.shared, path.as_str())?;
            // The holder and the nodes with copies drop theirs too.
            let others = removed
                .held
                .keys()
                .chain(removed.holder.iter())
                .filter(|node| **node != self.shared.name)
                .cloned()
                .collect::<std::collections::BTreeSet<String>>();
            for node in others {
                let asked = self.shared.service.node(&node).and_then(|info| {
                    self.shared.agents.post::<serde_json::Value>(
                        &info.address,
                        "/v1/forget",
                        &PathRequest {
                            path: path.to_string(),
                        },
                    )
                });
                if let Err(e) = asked {
                    tracing::warn!("{path}: asking node {node} to drop its content: {e}");
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) if e.kind == ErrorKind::Invalid => reply.error(Errno::EISDIR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let result = self.shared.service.stat(path.as_str()).and_then(|entry| {
            if !entry.directory {
                return Err(F3Error::new(
                    ErrorKind::Invalid,
                    format!("{path} is a file"),
                ));
            }
            self.shared.service.remove(path.as_str())
        });
        match result {
            Ok(_) => reply.ok(),
            Err(e) if e.kind == ErrorKind::Invalid => reply.error(Errno::ENOTDIR),
            Err(e) if e.kind == ErrorKind::Conflict => reply.error(Errno::ENOTEMPTY),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let result = (|| -> std::result::Result<(Entry, Handle), Errno> {
            let parent = self
                .shared
                .service
                .stat(path.parent().as_str())
                .map_err(|e| errno(&e))?;
            let ephemeral = self.new_file_is_ephemeral(&path, &parent);
            self.shared.budget.touch(path.as_str());
            if !ephemeral && self.shared.durable.is_none() {
                tracing::warn!(
                    "{path}: {}",
                    self.shared
                        .durable()
                        .err()
                        .map(|e| e.message)
                        .unwrap_or_default()
                );
                return Err(Errno::EROFS);
            }
            let entry = self
                .shared
                .service
                .create(&CreateRequest {
                    path: path.to_string(),
                    directory: false,
                    ephemeral,
                    node: self.shared.name.clone(),
                    replace: false,
                })
                .map_err(|e| errno(&e))?;
            let handle = if ephemeral {
                let file = self
                    .shared
                    .local
                    .open(path.as_str(), true)
                    .map_err(|e| errno(&e))?;
                file.open_writer(true).map_err(|e| io_errno(&e))?;
                Handle::Local {
                    file,
                    writable: true,
                }
            } else {
                let staging = self.shared.staging_dir.join(format!(
                    "{}.{}",
                    super::local::content_name(path.as_str()),
                    self.next_handle.load(Ordering::Relaxed)
                ));
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&staging)
                    .map_err(|e| io_errno(&e))?;
                Handle::Durable {
                    path: path.to_string(),
                    file,
                    staging: Some(staging),
                    dirty: std::sync::atomic::AtomicBool::new(true),
                }
            };
            let _ = flags;
            Ok((entry, handle))
        })();
        match result {
            Ok((entry, handle)) => {
                let attr = self.attr(&entry);
                let fh = self.add_handle(handle);
                reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::FOPEN_DIRECT_IO);
            }
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let writable = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let truncate = flags.0 & libc::O_TRUNC != 0;
        let result = self.shared.service.stat(path.as_str()).and_then(|entry| {
            if entry.directory {
                return Err(F3Error::new(
                    ErrorKind::Invalid,
                    format!("{path} is a directory"),
                ));
            }
            super::handles::open_entry(
                &self.shared,
                &entry,
                writable,
                truncate,
                self.next_handle.load(Ordering::Relaxed),
            )
        });
        match result {
            Ok(handle) => {
                let fh = self.add_handle(handle);
                reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO);
            }
            Err(e) if e.kind == ErrorKind::Conflict => {
                tracing::warn!("open {path}: {e}");
                reply.error(Errno::EPERM)
            }
            Err(e) if e.kind == ErrorKind::Invalid => {
                tracing::warn!("open {path}: {e}");
                reply.error(if e.message.contains("durable tier") {
                    Errno::EROFS
                } else {
                    Errno::EISDIR
                })
            }
            Err(e) => {
                tracing::warn!("open {path}: {e}");
                reply.error(errno(&e))
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let handle = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        let now = match &*handle {
            Handle::Local { file, .. } => file.try_read(offset, size).map(|r| r.map(Ok)),
            Handle::Remote { copy } => copy.try_read(offset, size).map(|r| match r {
                CopyRead::Bytes(b) => Some(Ok(b)),
                CopyRead::Wait => None,
                CopyRead::Failed(_) => Some(Err(Errno::EIO)),
            }),
            Handle::Durable { file, .. } => {
                let mut buffer = vec![0; size as usize];
                file.read_at(&mut buffer, offset).map(|n| {
                    buffer.truncate(n);
                    Some(Ok(buffer))
                })
            }
        };
        match now {
            Ok(Some(Ok(bytes))) => reply.data(&bytes),
            Ok(Some(Err(e))) => reply.error(e),
            Ok(None) => self.wait_and_reply(handle, offset, size, reply),
            Err(e) => reply.error(io_errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let handle = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        if let Err(e) = super::budget::admit_write(&self.shared, &handle, offset, data.len()) {
            return reply.error(e);
        }
        let mut result = write_handle(&handle, offset, data);
        // A full disk: make room as a quota would, and try once more.
        if matches!(&result, Err(e) if e.raw_os_error() == Some(libc::ENOSPC))
            && self
                .shared
                .budget
                .disk_full(&self.shared, data.len() as u64)
        {
            result = write_handle(&handle, offset, data);
        }
        match result {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(io_errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        match self
            .handle(fh)
            .and_then(|handle| self.write_back(&handle, false))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self
            .handle(fh)
            .and_then(|handle| self.write_back(&handle, true))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let Some(handle) = self.handles.lock().remove(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let closed = match &*handle {
            Handle::Local {
                file,
                writable: true,
            } => {
                // The size as it stands, reported before the readers
                // waiting at the end of the file are woken (below): a
                // reader that saw the end finds the final size in any
                // node's stat, since the service had it first.
                let (size, _) = file.snapshot();
                Some((file.path.clone(), size))
            }
            Handle::Durable {
                path,
                file,
                staging: Some(staging),
                dirty,
            } => {
                if dirty.load(Ordering::Relaxed) {
                    if let Err(e) = super::handles::upload(&self.shared, path, staging) {
                        tracing::error!("{path}: {e}");
                    }
                }
                let size = file.metadata().map(|m| m.len()).unwrap_or(0);
                let _ = std::fs::remove_file(staging);
                Some((path.clone(), size))
            }
            _ => None,
        };
        if let Some((path, size)) = closed {
            let request = WriterRequest {
                path: path.clone(),
                node: self.shared.name.clone(),
                opened: false,
                size: Some(size),
            };
            if let Err(e) = self.shared.service.writer(&request) {
                tracing::warn!("{path}: reporting the close to the F3 service: {e}");
            }
        }
        if let Handle::Local {
            file,
            writable: true,
        } = &*handle
        {
            file.close_writer();
        }
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let entries = match self.shared.service.list(path.as_str()) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(&e)),
        };
        let parent_ino = self.inodes.lock().number(path.parent().as_str());
        let mut all: Vec<(u64, FileType, String)> = vec![
            (ino.0, FileType::Directory, ".".into()),
            (parent_ino, FileType::Directory, "..".into()),
        ];
        for entry in entries {
            let number = self.inodes.lock().number(&entry.path);
            let kind = if entry.directory {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            let name = entry
                .path
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string();
            all.push((number, kind, name));
        }
        for (index, (number, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(number), index as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if name == PRODUCER_XATTR {
            return self.set_producer(&path, value, reply);
        }
        if name != EPHEMERAL_XATTR {
            return reply.error(Errno::from_i32(libc::ENOTSUP));
        }
        let ephemeral = match value {
            b"1" => true,
            b"0" => false,
            _ => return reply.error(Errno::EINVAL),
        };
        let result = self.shared.service.stat(path.as_str()).and_then(|entry| {
            if !entry.directory {
                return Err(F3Error::new(
                    ErrorKind::Conflict,
                    "a file's tier changes with `strata f3 persist`",
                ));
            }
            self.shared.service.update(&UpdateRequest {
                path: path.to_string(),
                ephemeral: Some(ephemeral),
                ..Default::default()
            })
        });
        match result {
            Ok(_) => reply.ok(),
            Err(e) if e.kind == ErrorKind::Conflict => reply.error(Errno::EPERM),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let entry = match self.shared.service.stat(path.as_str()) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(&e)),
        };
        let value = if name == EPHEMERAL_XATTR {
            if entry.ephemeral { "1" } else { "0" }.to_string()
        } else if name == PRODUCER_XATTR && entry.producer.is_some() {
            entry.producer.clone().unwrap_or_default()
        } else if name == HOLDER_XATTR {
            match entry.holder {
                Some(holder) => holder,
                None => return reply.error(Errno::from_i32(libc::ENODATA)),
            }
        } else {
            return reply.error(Errno::from_i32(libc::ENODATA));
        };
        xattr_reply(value.as_bytes(), size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let path = match self.path_of(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let entry = match self.shared.service.stat(path.as_str()) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(&e)),
        };
        let mut names = format!("{EPHEMERAL_XATTR}\0");
        if entry.holder.is_some() {
            names.push_str(HOLDER_XATTR);
            names.push('\0');
        }
        if entry.producer.is_some() {
            names.push_str(PRODUCER_XATTR);
            names.push('\0');
        }
        xattr_reply(names.as_bytes(), size, reply);
    }
}

/// Writes `data` at `offset` through a writable handle.
fn write_handle(handle: &Handle, offset: u64, data: &[u8]) -> std::io::Result<()> {
    match handle {
        Handle::Local {
            file,
            writable: true,
        } => file.write_at(offset, data),
        Handle::Durable {
            file,
            staging: Some(_),
            dirty,
            ..
        } => {
            dirty.store(true, Ordering::Relaxed);
            file.write_all_at(data, offset)
        }
        _ => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
    }
}

/// An xattr answer: its size when asked (`size` 0), the bytes if they fit.
fn xattr_reply(value: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if (size as usize) < value.len() {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(value);
    }
}
