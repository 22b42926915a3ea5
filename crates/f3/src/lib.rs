//! F3, Strata's serverless file tier: one FUSE namespace, shared by every
//! node, that merges durable files (objects in Strata's object store) with
//! ephemeral files whose content stays on the local disk of the node that
//! wrote them.
//!
//! The pieces, in the order they depend on each other:
//!
//! - [`path`]: namespace paths, validated once (no `..`, no empty or
//!   oversized component), so nothing read from a socket escapes a mount;
//! - [`protocol`]: the JSON messages of the metadata service and of the
//!   agents' transfer services, with their bounds;
//! - [`catalog`]: the namespace's metadata (path, tier, holder node, size,
//!   open writers, bytes held per node) in redb, and the nodes' leases;
//! - [`locality`]: nodes ranked by the bytes they hold of some files, and
//!   the Kubernetes scheduler extender's `filter` and `prioritize` verbs;
//! - [`service`]: `strata f3 serve`, the metadata and locality service
//!   over HTTP;
//! - [`client`]: blocking HTTP clients of the service and of the agents;
//! - [`node`]: `strata node`, the agent: its local files, the transfer
//!   service other nodes pull ephemeral files from, copies pulled from
//!   other nodes while their writer still writes, the durable tier, and
//!   the FUSE file system; and its function sandboxes (memory cgroups,
//!   warm sandboxes, slots) behind `POST /v1/invoke`;
//! - [`invoke`]: the invoke endpoint's JSON messages and their bounds;
//! - [`workflow`]: workflows, a YAML DAG of steps, checked with lines;
//! - [`runner`]: `strata f3 run`, which runs a workflow's steps on the
//!   nodes its schedulers (locality, random, round-robin) choose.
//!
//! Never prints, never exits: the `strata` binary reports.

pub mod catalog;
pub mod client;
pub mod error;
pub mod events;
pub mod invoke;
pub mod locality;
pub mod node;
pub mod path;
pub mod protocol;
pub mod runner;
pub mod service;
pub mod service_metrics;
pub mod workflow;

pub use error::{F3Error, Result};
