//! Errors found while decoding on-disk structures.

use thiserror::Error;

/// What was wrong with a buffer read from an image.
///
/// Messages name the field and value; the engine adds which file and layer.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// The buffer is shorter than the structure it should hold.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// Which structure.
        what: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes available.
        have: u64,
    },
    /// Not a qcow2 image.
    #[error("bad magic 0x{0:08x}: not a qcow2 image")]
    BadMagic(u32),
    /// A qcow2 version other than 2 or 3.
    #[error("unsupported qcow2 version {0} (only 2 and 3 exist)")]
    BadVersion(u32),
    /// A field holds a value that is out of range or inconsistent.
    #[error("invalid {field}: {detail}")]
    Invalid {
        /// The header or table field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The image uses a feature Strata does not implement.
    #[error("unsupported feature: {0}")]
    Unsupported(String),
}

impl FormatError {
    /// Shorthand for [`FormatError::Invalid`].
    pub fn invalid(field: &'static str, detail: impl Into<String>) -> Self {
        FormatError::Invalid {
            field,
            detail: detail.into(),
        }
    }
}

/// Reads big-endian integers from a slice with bounds checks.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }

    pub(crate) fn bytes(&self, at: usize, len: usize) -> Result<&'a [u8], FormatError> {
        at.checked_add(len)
            .and_then(|end| self.buf.get(at..end))
            .ok_or(FormatError::Truncated {
                what: self.what,
                need: at as u64 + len as u64,
                have: self.buf.len() as u64,
            })
    }

    pub(crate) fn u8(&self, at: usize) -> Result<u8, FormatError> {
        Ok(self.bytes(at, 1)?[0])
    }

    pub(crate) fn u16(&self, at: usize) -> Result<u16, FormatError> {
        let b = self.bytes(at, 2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&self, at: usize) -> Result<u32, FormatError> {
        let b = self.bytes(at, 4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&self, at: usize) -> Result<u64, FormatError> {
        let b = self.bytes(at, 8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
}
