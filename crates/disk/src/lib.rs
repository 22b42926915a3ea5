//! Strata's disk engine.
//!
//! Opens qcow2 (v2/v3) and raw images and backing chains of any length, and
//! reads and writes them through one bounded metadata cache shared by the
//! whole chain. A lookup costs the same at chain length 1 and 1,000:
//!
//! - the top layer may carry a *chain index* (see [`strata_format::index`])
//!   naming, for every guest cluster, the layer that holds its newest
//!   version; without one, the engine walks the chain;
//! - either way, what a lookup finds is kept in a *resolved page*: for 256
//!   consecutive index units, the owning layer and its L2 entry. Reads that
//!   hit the cache cost one `pread` of data, whatever the chain length.
//!
//! On-disk parsing lives in `strata-format`; this crate does the I/O.

mod allocator;
pub mod amend;
pub mod bench;
/// Page-aligned I/O buffers (from the block-device contract).
pub use strata_block::buf;
pub mod cache;
mod chain;
mod chain_index;
pub mod check;
pub mod commit;
pub mod compact;
pub mod compare;
pub mod convert;
mod cow;
pub mod create;
pub mod device;
pub mod disk;
pub mod error;
mod file;
mod fill;
mod header;
pub mod info;
pub mod layer;
mod lazy_index;
mod live;
pub mod lock;
pub mod map;
pub mod measure;
mod overlap;
pub mod rebase;
mod refcounts;
pub mod resize;
pub mod write_times;
mod writer;

pub use compact::{merge_layers, set_backing_file, MergeProgress, MergeReport};
pub use create::{create, CreateOptions};
pub use device::{BlockDevice, DEFAULT_PARALLEL_REQUESTS};
pub use disk::{BlockStatus, Disk, OpenOptions};
pub use error::{DiskError, Result};
pub use live::{PreparedTop, PushReport};
pub use lock::{ImageLock, LockMode};
pub use write_times::WriteTimes;

/// Default bound of the chain's metadata cache.
pub const DEFAULT_CACHE_BYTES: u64 = 32 * 1024 * 1024;
