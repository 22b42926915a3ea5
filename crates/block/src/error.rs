//! The contract's error: a kind, which is all a front end needs to answer
//! its client, and the device's own error, which says what went wrong and
//! where.

use std::error::Error;
use std::fmt;

/// Result of a device operation.
pub type Result<T, E = BlockError> = std::result::Result<T, E>;

/// What kind of failure a device reports: the part a protocol front end
/// acts on (NBD turns it into the errno of its reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A write to a device that is not writable (NBD `EPERM`).
    ReadOnly,
    /// A request reaching past the end of the device (NBD `EINVAL`).
    OutOfRange,
    /// A request the device cannot take as asked (NBD `EINVAL`).
    Invalid,
    /// The storage behind the device is full (NBD `ENOSPC`).
    NoSpace,
    /// Memory ran out (NBD `ENOMEM`).
    OutOfMemory,
    /// Anything else: an I/O error, corrupt metadata, an unreachable
    /// peer (NBD `EIO`).
    Io,
}

impl ErrorKind {
    /// The kind of an operating system error: a full file system is
    /// [`NoSpace`](ErrorKind::NoSpace), a read-only one
    /// [`ReadOnly`](ErrorKind::ReadOnly), everything else I/O.
    pub fn of_io(error: &std::io::Error) -> ErrorKind {
        match error.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => ErrorKind::NoSpace,
            Some(libc::ENOMEM) => ErrorKind::OutOfMemory,
            Some(libc::EROFS) => ErrorKind::ReadOnly,
            _ => ErrorKind::Io,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::ReadOnly => "read-only",
            ErrorKind::OutOfRange => "out of range",
            ErrorKind::Invalid => "invalid request",
            ErrorKind::NoSpace => "no space",
            ErrorKind::OutOfMemory => "out of memory",
            ErrorKind::Io => "I/O error",
        })
    }
}

/// An error of a [`BlockDevice`](crate::BlockDevice): its [`ErrorKind`]
/// and the device's own error.
///
/// Displays as the device's error alone (which already says what, where
/// and what to do) and hands out that error's causes as its own, so a
/// chain of causes prints each message once.
#[derive(Debug)]
pub struct BlockError {
    kind: ErrorKind,
    error: Box<dyn Error + Send + Sync + 'static>,
}

impl BlockError {
    /// An error of `kind`; `error` is the device's own error or a message.
    pub fn new(kind: ErrorKind, error: impl Into<Box<dyn Error + Send + Sync + 'static>>) -> Self {
        BlockError {
            kind,
            error: error.into(),
        }
    }

    /// A request of `len` bytes at `offset` on a device of `size` bytes
    /// that reaches past its end (or overflows).
    pub fn out_of_range(offset: u64, len: u64, size: u64) -> Self {
        BlockError::new(
            ErrorKind::OutOfRange,
            format!(
                "request at offset {offset} length {len} is beyond the end of the device \
                 ({size} bytes)"
            ),
        )
    }

    /// Checks that `len` bytes at `offset` lie within `size` bytes.
    pub fn check_range(offset: u64, len: u64, size: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(BlockError::out_of_range(offset, len, size)),
        }
    }

    /// The kind, for a front end to answer its client.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The device's own error (downcast it to reach its details).
    pub fn get_ref(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The device's own error, taken out.
    pub fn into_inner(self) -> Box<dyn Error + Send + Sync + 'static> {
        self.error
    }
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl Error for BlockError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.error.source()
    }
}

impl From<std::io::Error> for BlockError {
    fn from(error: std::io::Error) -> Self {
        BlockError::new(ErrorKind::of_io(&error), error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_system_is_no_space_and_the_message_is_the_devices() {
        let error = BlockError::from(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(error.kind(), ErrorKind::NoSpace);
        assert_eq!(
            error.to_string(),
            std::io::Error::from_raw_os_error(libc::ENOSPC).to_string()
        );
        let other = BlockError::from(std::io::Error::from_raw_os_error(libc::EBADF));
        assert_eq!(other.kind(), ErrorKind::Io);
    }

    #[test]
    fn ranges_past_the_end_or_overflowing_are_out_of_range() {
        assert!(BlockError::check_range(0, 10, 10).is_ok());
        assert!(BlockError::check_range(10, 0, 10).is_ok());
        for (offset, len) in [(1, 10), (11, 0), (u64::MAX, 2)] {
            let error = BlockError::check_range(offset, len, 10).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::OutOfRange);
            assert!(error.to_string().contains("beyond the end"), "{error}");
        }
    }
}
