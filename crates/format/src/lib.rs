//! On-disk structures of qcow2 images and of Strata's chain index.
//!
//! This crate only parses, validates and encodes byte buffers; it never does
//! I/O. The I/O engine (`strata-disk`) reads the bytes and hands them here, so
//! every value that comes from a file passes through one validating layer
//! that can be fuzzed on its own.

pub mod entry;
pub mod error;
pub mod header;
pub mod index;
pub mod refcount;
pub mod snapshot;

pub use entry::{ExtendedL2, L1Entry, L2Mapping};
pub use error::FormatError;
pub use header::{CompressionType, Header, HeaderExtension};
pub use index::{ChainIndexExt, LayerIdentity};

/// The qcow2 magic, "QFI\xfb".
pub const QCOW2_MAGIC: u32 = 0x5146_49fb;
/// Smallest cluster size qcow2 allows (512 B).
pub const MIN_CLUSTER_BITS: u32 = 9;
/// Largest cluster size we (and QEMU) accept (2 MiB).
pub const MAX_CLUSTER_BITS: u32 = 21;
/// QEMU's limit on the L1 table: 32 MiB, i.e. 4 Mi entries.
pub const MAX_L1_ENTRIES: u64 = 32 * 1024 * 1024 / 8;
/// QEMU's limit on the refcount table: 8 MiB.
pub const MAX_REFTABLE_BYTES: u64 = 8 * 1024 * 1024;
/// QEMU's limit on the number of internal snapshots.
pub const MAX_SNAPSHOTS: u32 = 65536;
/// Longest backing file name the format allows.
pub const MAX_BACKING_NAME: u32 = 1023;
/// Highest host offset an L2 entry can address (bits 9-55).
pub const MAX_HOST_OFFSET: u64 = 1 << 56;
