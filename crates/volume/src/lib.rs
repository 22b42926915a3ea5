//! Strata's volume service: many volumes in one pool, each served over
//! NBD, with online snapshots, clones and grows while clients write.
//!
//! - [`catalog`]: volumes, snapshots and layers in an embedded
//!   transactional database (redb);
//! - [`volume`]: a live volume, the open disk behind an I/O gate so its top
//!   layer can be switched under I/O;
//! - [`service`]: the operations, ordered for crash safety, and startup
//!   reconciliation of the catalog with the files;
//!   with, in its folder, [`service::compact`] (online chain compaction,
//!   merging runs of layers no snapshot or clone names),
//!   [`service::autocompact`] (compaction started when dead layers pile
//!   up) and [`service::standby`] (big volumes' next snapshot tops,
//!   prepared ahead, and frozen layers synced in time);
//! - [`pool`]: where a pool keeps its files;
//! - [`http`]: the JSON control API; [`metrics`]: Prometheus text;
//!   [`auth`]: its bearer token; [`server`]: its bounded connections.
//!
//! - [`trash`]: layer files of deleted volumes and snapshots are unlinked
//!   in the background.
//!
//! Pool layout: `POOL/catalog.redb`, `POOL/layers/<id>.qcow2`, each layer
//! backed by its parent's file name, and `POOL/trash/` for files on their
//! way out, `POOL/api.token` for the API's token.
//!
//! The library never prints and never exits; it logs with `tracing`.

pub mod auth;
pub mod catalog;
pub mod error;
pub mod failpoint;
pub mod http;
pub mod metrics;
pub mod names;
pub mod pool;
pub mod server;
pub mod service;
pub mod trash;
pub mod volume;

pub use error::{Result, VolumeError};
pub use service::{RecoveryReport, Service, ServiceConfig};
pub use volume::Volume;
