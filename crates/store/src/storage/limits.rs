//! The limits of a storage node's data port, and the memory of its
//! whole-object cache.

use crate::storage::object_cache::DEFAULT_OBJECT_CACHE;

/// Limits of a storage node's data port, so that peers that connect and
/// send little or nothing cannot hold its connections forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataLimits {
    /// How long a connection may take to send a whole request header,
    /// counted from when the node starts waiting for it (so an idle
    /// connection between requests is closed after it too), and how long
    /// one read of a Put's data may wait. Past it the connection is
    /// closed.
    pub read_timeout: std::time::Duration,
    /// Most data connections open at once; one more is closed as soon as
    /// it is accepted.
    pub max_connections: usize,
    /// Bytes of memory for the whole-object cache
    /// ([`crate::storage::object_cache`]; 0: none).
    pub object_cache: u64,
}

/// Default of [`DataLimits::read_timeout`]: 10 s.
pub const DATA_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Default of [`DataLimits::max_connections`].
pub const DATA_MAX_CONNECTIONS: usize = 1024;

impl Default for DataLimits {
    fn default() -> Self {
        DataLimits {
            read_timeout: DATA_READ_TIMEOUT,
            max_connections: DATA_MAX_CONNECTIONS,
            object_cache: DEFAULT_OBJECT_CACHE,
        }
    }
}
