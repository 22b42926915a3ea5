//! The block-device contract: what a protocol front end (the NBD server)
//! needs from whatever it serves, and nothing of how it is stored.
//!
//! - [`device`]: the [`BlockDevice`] trait and its allocation runs,
//!   [`BlockStatus`];
//! - [`error`]: [`BlockError`], whose [`ErrorKind`] is all a front end
//!   needs to answer a client (NBD maps it to an errno);
//! - [`buf`]: page-aligned I/O buffers;
//! - [`fault`] and [`slow`]: wrappers that make any device fail chosen
//!   requests or answer late, for tests of what serves it;
//! - `conformance` (feature `conformance`): one test suite that checks a
//!   device keeps the promises of the trait.
//!
//! The disk engine (`strata-disk`) implements the contract for images,
//! the volume service for live volumes, the mirror for on-demand copies.

pub mod buf;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod device;
pub mod error;
pub mod fault;
pub mod slow;

pub use device::{BlockDevice, BlockStatus, DEFAULT_PARALLEL_REQUESTS};
pub use error::{BlockError, ErrorKind, Result};
pub use fault::{Fault, FaultyDevice, Operation};
pub use slow::SlowDevice;
