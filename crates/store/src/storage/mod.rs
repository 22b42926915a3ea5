//! The storage node: replica files with CRC-32C, fsync before
//! acknowledging, chain forwarding and garbage collection ([`replicas`]),
//! and its runtime on a TCP listener ([`server`]).

pub mod replicas;
pub mod server;
